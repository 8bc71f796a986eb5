// The journal: one JSON line per finished trial, appended and flushed as it finishes, so that an
// interrupted or crashed tune loses nothing and `--resume` repeats no trial. Lines carry the
// context they were measured in (workload file, backend, device, executor): a tune writes only to a
// journal of its own context, and only one tune at a time does.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "tuner/search.h"

namespace tb::tune {

// A trial's line the journal could not take (a full disk, a file-size limit): the journal holds what it held before.
struct JournalWriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Journal {
 public:
  // Opens (or creates) the journal at `path` for a tune of `context`, locked for this process (flock) until it
  // goes. Refuses (UsageError, the file left as it was) a path that is not a regular file, a file that is not a
  // journal (a line that is not one of a journal's), a journal of another context, and a journal another tune
  // holds. A last line cut short by a crash mid-write is cut off before the first append. Without `resume`, the
  // trials of an earlier tune of this context are dropped: a fresh tune starts a fresh journal.
  Journal(std::string path, std::string context, bool resume);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // The whole line, then fsync. JournalWriteError (the file and the reason) when it cannot: the part written is cut
  // off again.
  void append(const Candidate& c, const TrialResult& r) const;
  // The trials of this context, every measurement of a candidate in the order they were appended.
  std::map<std::string, std::vector<TrialResult>> load() const;
  const std::string& path() const { return path_; }
  // What opening it found: lines of an earlier tune dropped (no --resume), bytes of a torn last line cut off.
  std::size_t dropped_lines() const { return dropped_; }
  std::size_t torn_bytes() const { return torn_; }

 private:
  std::string path_, context_;
  int fd_ = -1;
  std::vector<std::string> lines_;  // the journal's finished lines when it was opened
  std::size_t dropped_ = 0, torn_ = 0;
};

// A short stable digest (FNV-1a, hex) of a text: the workload file's content in the context.
std::string digest(const std::string& text);

}  // namespace tb::tune
