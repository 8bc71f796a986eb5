// The journal: one JSON line per finished trial, appended and flushed as it finishes, so that an
// interrupted or crashed tune loses nothing and `--resume` repeats no trial. Lines carry the
// context they were measured in (workload file, backend, device): a journal of another context is
// not reused.
#pragma once

#include <map>
#include <string>

#include "tuner/search.h"

namespace tb::tune {

class Journal {
 public:
  Journal(std::string path, std::string context) : path_(std::move(path)), context_(std::move(context)) {}
  void append(const Candidate& c, const TrialResult& r) const;  // throws UsageError when it cannot write
  // The trials of this context; lines of another context, or cut short, are skipped.
  // Every measurement of a candidate, in the order they were appended.
  std::map<std::string, std::vector<TrialResult>> load(int* skipped = nullptr) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_, context_;
};

// A short stable digest (FNV-1a, hex) of a text: the workload file's content in the context.
std::string digest(const std::string& text);

}  // namespace tb::tune
