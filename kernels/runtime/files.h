// Files a tool writes: whole or not at all, through names nobody else chose, checked before the work.
// A results file, a tuned configuration, a listing for a child process: each is written to a fresh
// temporary file beside its final path (created exclusively, never through a symlink someone planted)
// and renamed over it, so a reader never sees half a file and an interrupted run never destroys the
// previous one. Folders for a child's inputs are private (mkdtemp) and removed with their owner.
#pragma once

#include <string>

namespace tb {

// Writes `text` to `path` atomically: a temporary file beside it (O_CREAT|O_EXCL|O_NOFOLLOW, random
// name), fsync, rename. The file gets the permissions a plain create would (0666 less the umask).
// UsageError naming `path` when the folder is missing or not writable.
void write_file_atomically(const std::string& path, const std::string& text);

// A file-size limit (`ulimit -f`, a batch job's) fails the write that would pass it with EFBIG ("File too large"),
// said and handled as a full disk is, instead of killing the process unsaid (SIGXFSZ's default action); Python's
// scripts do the same. Children inherit it. Called first thing in a tool's main.
void file_size_limit_fails_the_write();

// Refuses, before any work, an output path that cannot be written when the work is done: a folder, a
// path whose folder is missing, or a folder where no file can be created (read-only, /proc). `flag`
// names the option in the message ("--out"). Creates nothing that stays.
void check_output_path(const std::string& path, const std::string& flag);

// `text` as one safe file name: letters, digits, '.', '-' and '_' kept, anything else (a '/', a space)
// '_', no leading '.', never empty: a workload's name that becomes part of a path stays one name.
std::string safe_file_name(const std::string& text);

// trainbench's folder in the user's cache: $XDG_CACHE_HOME/trainbench, else ~/.cache/trainbench; "" when
// neither variable is set. What a tool keeps per machine lives there (the cache sweep, the rows' times,
// autotune's journals). Creates nothing.
std::string cache_dir();

// A private folder (mode 0700, a random name under $TMPDIR or /tmp), removed with what is in it when
// this object goes.
class PrivateTempDir {
 public:
  explicit PrivateTempDir(const std::string& prefix);  // CallError when it cannot be made
  ~PrivateTempDir();
  PrivateTempDir(const PrivateTempDir&) = delete;
  PrivateTempDir& operator=(const PrivateTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tb
