#include "tuner/journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

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

namespace {

std::string read_all(int fd, const std::string& path) {
  std::string text;
  char chunk[65536];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, chunk, sizeof chunk, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw UsageError("cannot read the journal " + path + ": " + std::strerror(errno));
    if (n == 0) return text;
    text.append(chunk, static_cast<std::size_t>(n));
    at += n;
  }
}

// The context of a journal line; empty when the line is not one of a journal's.
std::string context_of(const std::string& line) {
  try {
    const auto j = nlohmann::json::parse(line);
    if (!j.is_object() || !j.contains("candidate") || !j.contains("result") || !j.contains("key")) return "";
    return j.at("context").get<std::string>();
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace

Journal::Journal(std::string path, std::string context, bool resume) : path_(std::move(path)), context_(std::move(context)) {
  // O_NOFOLLOW: a symlink planted at a predictable journal path cannot send the appends elsewhere.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd_ < 0)
    throw UsageError(
        "cannot open the journal " + path_ + ": " +
        (errno == ELOOP ? std::string("it is a symlink (give --journal the file itself)") : std::strerror(errno)));
  const auto refuse = [&](const std::string& why) {
    ::close(fd_);
    fd_ = -1;
    throw UsageError(why);
  };
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))
    refuse("the journal " + path_ + " is not a regular file (give --journal FILE)");
  // One tune a journal: a second would interleave its trials with the first's, or drop them.
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0)
    refuse("the journal " + path_ +
           " is in use by another autotune (the same workload on the same device, or the same "
           "--journal): wait for it to end, or give this tune its own --journal FILE");
  const std::string text = read_all(fd_, path_);
  const std::size_t finished = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  std::size_t line_number = 0;
  for (std::size_t at = 0; at < finished;) {
    const std::size_t end = text.find('\n', at);
    std::string line = text.substr(at, end - at);
    at = end + 1;
    ++line_number;
    if (line.empty()) continue;
    const std::string of = context_of(line);
    if (of.empty())
      refuse(path_ + " is not an autotune journal (line " + std::to_string(line_number) +
             " is not a trial's line): it was left as it is; give --journal another file");
    if (of != context_)
      refuse("the journal " + path_ +
             " holds the trials of another tune (another workload file, device or executor: "
             "context " +
             of + ", this tune's " + context_ + "): it was left as it is; give --journal another file");
    lines_.push_back(std::move(line));
  }
  // A last line without its newline was cut by a crash mid-write: it holds no trial, and the next append would
  // be glued to it (and lost with it). Cut it off now.
  torn_ = text.size() - finished;
  if (!resume) {
    dropped_ = lines_.size();
    lines_.clear();
  }
  const off_t keep = resume ? static_cast<off_t>(finished) : 0;
  if ((torn_ > 0 || !resume) && static_cast<off_t>(text.size()) != keep && ::ftruncate(fd_, keep) != 0)
    refuse("cannot repair the journal " + path_ + ": " + std::strerror(errno));
}

Journal::~Journal() {
  if (fd_ >= 0) ::close(fd_);  // the lock goes with it
}

void Journal::append(const Candidate& c, const TrialResult& r) const {
  const std::string line =
      nlohmann::json{{"context", context_}, {"key", c.key()}, {"candidate", to_json(c)}, {"result", to_json(r)}}.dump() +
      "\n";
  // A full disk (ENOSPC) or a file-size limit (EFBIG) can take part of the line: the write goes on until one call
  // fails with the reason, and the part written is cut off again, so the journal keeps only whole trials.
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  std::size_t done = 0;
  int err = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  if (err == 0 && ::fsync(fd_) != 0) err = errno;
  if (err == 0) return;
  const bool cut_off = before >= 0 && ::ftruncate(fd_, before) == 0;
  throw JournalWriteError("cannot write the journal " + path_ + ": " + std::strerror(err) +
                          (cut_off ? "" : " (a part of the line stays: the next open cuts it off)"));
}

std::map<std::string, std::vector<TrialResult>> Journal::load() const {
  std::map<std::string, std::vector<TrialResult>> known;
  for (const auto& line : lines_) {
    try {
      const auto j = nlohmann::json::parse(line);
      known[candidate_from_json(j.at("candidate")).key()].push_back(trial_result_from_json(j.at("result")));
    } catch (const std::exception&) {
      // a trial's line this version cannot read back (written by another): measured again
    }
  }
  return known;
}

}  // namespace tb::tune
