#include "tuner/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "runtime/error.h"
#include "tuner/trial.h"

namespace tb::tune {

std::string digest(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

void Journal::append(const Candidate& c, const TrialResult& r) const {
  const std::string line =
      nlohmann::json{{"context", context_}, {"key", c.key()}, {"candidate", to_json(c)}, {"result", to_json(r)}}.dump() + "\n";
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) throw UsageError("cannot write the journal " + path_ + ": " + std::strerror(errno));
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) throw UsageError("cannot write the journal " + path_ + ": " + std::strerror(errno));
}

std::map<std::string, std::vector<TrialResult>> Journal::load(int* skipped) const {
  std::map<std::string, std::vector<TrialResult>> known;
  std::ifstream in(path_);
  std::string line;
  int bad = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      if (j.at("context").get<std::string>() != context_) {
        ++bad;
        continue;
      }
      const Candidate c = candidate_from_json(j.at("candidate"));
      known[c.key()].push_back(trial_result_from_json(j.at("result")));
    } catch (const std::exception&) {
      ++bad;  // a line cut short by a crash mid-write
    }
  }
  if (skipped) *skipped = bad;
  return known;
}

}  // namespace tb::tune
