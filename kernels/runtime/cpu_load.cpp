#include "cpu_load.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace tb {

namespace {

// utime + stime of a /proc/<pid>/stat; `read`: whether it could be read.
uint64_t own_cpu_ticks(const std::string& path, bool& read) {
  read = false;
  // The command (field 2) may hold spaces; utime and stime are fields 14 and 15.
  std::ifstream stat(path);
  std::string line;
  if (!std::getline(stat, line)) return 0;
  const auto close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int f = 3; f <= 15 && rest >> field; ++f) {
    if (f == 14) utime = std::stoull(field);
    if (f == 15) stime = std::stoull(field);
  }
  read = true;
  return utime + stime;
}

}  // namespace

CpuTicks read_cpu_ticks() {
  CpuTicks t;
  std::ifstream stat("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) || cpu != "cpu") return t;
  t.busy = user + nice + system + irq + softirq + steal;  // guest time is counted in user already
  t.total = t.busy + idle + iowait;
  t.self = own_cpu_ticks("/proc/self/stat", t.valid);
  return t;
}

uint64_t process_cpu_ticks(int pid) {
  bool read = false;
  const uint64_t ticks = own_cpu_ticks("/proc/" + std::to_string(pid) + "/stat", read);
  return read ? ticks : 0;
}

double others_share(const CpuTicks& before, const CpuTicks& after, uint64_t min_ticks) {
  if (!before.valid || !after.valid || after.total < before.total + min_ticks) return -1;
  const double total = static_cast<double>(after.total - before.total);
  const double busy = static_cast<double>(after.busy - before.busy);
  const double self = static_cast<double>(after.self - before.self);
  const double others = busy - self;  // ticks are sampled: a little noise either way
  return others <= 0 ? 0.0 : std::min(1.0, others / total);
}

}  // namespace tb
