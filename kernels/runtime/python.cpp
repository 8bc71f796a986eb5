#include "runtime/python.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "runtime/error.h"

extern char** environ;

namespace tb {

namespace fs = std::filesystem;

namespace {

// Runs argv and waits for it, its stdout and stderr as `quiet` says (/dev/null, or its stdout to this process's
// stderr): its exit code, 127 when it could not be started at all.
int run_and_wait(const std::vector<std::string>& argv, bool quiet) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (quiet) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  } else {
    posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  }
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return 127;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int run_quietly(const std::vector<std::string>& argv) { return run_and_wait(argv, true); }

}  // namespace

int run_to_stderr(const std::vector<std::string>& argv) { return run_and_wait(argv, false); }

std::string torch_python() {
  if (const char* env = std::getenv("TRAINBENCH_PYTHON"); env && *env) return env;
  // Where scripts/install-deps --torch puts it.
  fs::path venv;
  if (const char* env = std::getenv("TRAINBENCH_TORCH_VENV"); env && *env) venv = env;
  else if (const char* home = std::getenv("HOME"); home && *home)
    venv = fs::path(home) / ".local/share/trainbench/torch-venv";
  std::error_code ec;
  if (!venv.empty() && fs::exists(venv / "bin" / "python", ec)) return (venv / "bin" / "python").string();
  return "python3";
}

namespace {

// A script of scripts/: $<env> when set, else installed beside the binary, else the source tree's.
std::string script_path(const char* env_name, const std::string& name) {
  if (const char* env = std::getenv(env_name); env && *env) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path() / ".." / "share" / "trainbench" / "scripts" / name;
    if (fs::is_regular_file(installed)) return installed.lexically_normal().string();
  }
  return TRAINBENCH_SOURCE_SCRIPTS "/" + name;
}

}  // namespace

std::string torch_peers_script() { return script_path("TRAINBENCH_TORCH_PEERS", "torch-peers"); }
std::string torch_step_script() { return script_path("TRAINBENCH_TORCH_STEP", "torch-step"); }
std::string tune_page_script() { return script_path("TRAINBENCH_TUNE_PAGE", "tune-page"); }

void require_torch(const std::string& who, const std::string& script) {
  const std::string python = torch_python();
  if (run_quietly({python, "-c", "import torch, numpy"}) != 0)
    throw UsageError(who + " needs PyTorch and numpy in " + python +
                     ": install them with scripts/install-deps --torch (or " + python +
                     " -m pip install torch numpy), or name another interpreter in TRAINBENCH_PYTHON");
  if (!fs::is_regular_file(script))
    throw UsageError(
        who + ": no " + script +
        " (trainbench's scripts folder is missing: set TRAINBENCH_TORCH_PEERS or TRAINBENCH_TORCH_STEP to the script)");
}

}  // namespace tb
