#include "runtime/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "runtime/error.h"

namespace tb {
namespace fs = std::filesystem;

namespace {

// A name no one can guess before it exists: 12 random letters and digits.
std::string random_suffix() {
  static const char letters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::random_device device;
  std::string s;
  for (int i = 0; i < 12; ++i) s += letters[device() % (sizeof letters - 1)];
  return s;
}

// A new file beside `path` that did not exist before (O_EXCL) and is not a symlink (O_NOFOLLOW); its
// name in `*tmp`. -1 with errno on failure.
int create_beside(const std::string& path, std::string* tmp) {
  const fs::path p(path);
  const fs::path folder = p.has_parent_path() ? p.parent_path() : fs::path(".");
  for (int attempt = 0; attempt < 16; ++attempt) {
    *tmp = (folder / ("." + p.filename().string() + "." + random_suffix() + ".tmp")).string();
    const int fd = ::open(tmp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& text) {
  std::string tmp;
  const int fd = create_beside(path, &tmp);
  if (fd < 0) throw UsageError("cannot write " + path + ": " + std::strerror(errno));
  const auto fail = [&](int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw UsageError("cannot write " + path + ": " + std::strerror(err));
  };
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(errno);
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail(errno);
  // A file system that reports a full disk only when the file is closed (NFS) says it here.
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw UsageError("cannot write " + path + ": " + std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw UsageError("cannot write " + path + ": " + std::strerror(err));
  }
}

void file_size_limit_fails_the_write() { std::signal(SIGXFSZ, SIG_IGN); }

void check_output_path(const std::string& path, const std::string& flag) {
  const fs::path p(path);
  std::error_code ec;
  if (path.empty()) throw UsageError(flag + ": an empty path");
  if (fs::is_directory(p, ec)) throw UsageError(flag + " " + path + ": is a folder (give a file's path)");
  const fs::path folder = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(folder, ec))
    throw UsageError(flag + " " + path + ": the folder " + folder.string() + " does not exist");
  // Writable where it counts: a file can be created beside it (what the atomic write will do).
  std::string tmp;
  const int fd = create_beside(path, &tmp);
  if (fd < 0)
    throw UsageError(flag + " " + path + ": no file can be created in " + folder.string() + " (" + std::strerror(errno) +
                     ")");
  ::close(fd);
  ::unlink(tmp.c_str());
}

std::string safe_file_name(const std::string& text) {
  std::string name;
  for (const char c : text) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
                      (c == '.' && !name.empty());
    name += keep ? c : '_';
  }
  return name.empty() ? "_" : name;
}

PrivateTempDir::PrivateTempDir(const std::string& prefix) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string pattern = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/" + prefix + "XXXXXX";
  if (!::mkdtemp(pattern.data())) throw CallError(__FILE__, __LINE__, "mkdtemp(" + pattern + ")", std::strerror(errno));
  path_ = pattern;
}

PrivateTempDir::~PrivateTempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string cache_dir() {
  namespace fs = std::filesystem;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return (fs::path(xdg) / "trainbench").string();
  if (const char* home = std::getenv("HOME"); home && *home) return (fs::path(home) / ".cache" / "trainbench").string();
  return "";
}

}  // namespace tb
