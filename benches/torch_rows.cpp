#include "torch_rows.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "runtime/error.h"

extern char** environ;

namespace tb {

namespace fs = std::filesystem;

namespace {

// Runs argv with its stdout sent to our stderr (stdout is benchsuite's table), and waits for it.
// Returns its exit code; 127 when it could not be started at all. With quiet, its stderr goes to
// /dev/null too. With `stop`, asked while it runs: once it says true, the child gets SIGINT (once), so
// that a stop request sent to this process alone ends the child's run too, what it measured written.
int run_child(const std::vector<std::string>& argv, bool quiet, bool (*stop)() = nullptr) {
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
  bool passed_on = false;
  for (;;) {
    const pid_t done = waitpid(pid, &status, stop ? WNOHANG : 0);
    if (done == pid) break;
    if (done < 0) {
      if (errno != EINTR) return 127;  // Ctrl-C reaches the child too: wait for it to write what it measured
      continue;
    }
    if (!passed_on && stop()) {
      kill(pid, SIGINT);
      passed_on = true;
    }
    usleep(20000);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string label_of(const std::string& name) {  // "adamw/torch/fused/params=..." -> "params=..."
  std::size_t at = 0;
  for (int slash = 0; slash < 3; ++slash) {
    at = name.find('/', at);
    if (at == std::string::npos) return "";
    ++at;
  }
  return name.substr(at);
}

}  // namespace

std::string torch_python() {
  if (const char* env = std::getenv("TRAINBENCH_PYTHON"); env && *env) return env;
  // Where scripts/install-deps --torch puts it.
  fs::path venv;
  if (const char* env = std::getenv("TRAINBENCH_TORCH_VENV"); env && *env) venv = env;
  else if (const char* home = std::getenv("HOME"); home && *home) venv = fs::path(home) / ".local/share/trainbench/torch-venv";
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

void require_torch(const std::string& who, const std::string& script) {
  const std::string python = torch_python();
  if (run_child({python, "-c", "import torch, numpy"}, true) != 0)
    throw UsageError(who + " needs PyTorch and numpy in " + python +
                     ": install them with scripts/install-deps --torch (or " + python +
                     " -m pip install torch numpy), or name another interpreter in TRAINBENCH_PYTHON");
  if (!fs::is_regular_file(script))
    throw UsageError(who + ": no " + script +
                     " (trainbench's scripts folder is missing: set TRAINBENCH_TORCH_PEERS or TRAINBENCH_TORCH_STEP to the script)");
}

nlohmann::json run_torch_peers(const TorchRun& run) {
  std::vector<std::string> argv{torch_python(), torch_peers_script(), "--device", run.device, "--out", run.out_path,
                                "--empty-ok"};
  if (!run.listing_path.empty()) argv.insert(argv.end(), {"--listing", run.listing_path});
  else argv.insert(argv.end(), {"--benchsuite", run.benchsuite});
  if (run.quick) argv.push_back("--quick");
  if (!run.filter.empty()) argv.insert(argv.end(), {"--filter", run.filter});
  if (run.repetitions > 0) argv.insert(argv.end(), {"--repetitions", std::to_string(run.repetitions)});
  if (run.min_time_s > 0) {
    std::ostringstream s;
    s << run.min_time_s;
    argv.insert(argv.end(), {"--min-time", s.str()});
  }
  std::error_code ec;
  fs::remove(run.out_path, ec);
  const int code = run_child(argv, false, run.stop);
  // 0: done; 1: a row incorrect or failed (written); 130, 143: interrupted (what it measured is written).
  if (code == 2) throw UsageError("scripts/torch-peers rejected the run (its message is above)");
  std::ifstream in(run.out_path);
  if (!in) {
    throw std::runtime_error("scripts/torch-peers " +
                             std::string(code == 127 ? "could not be started" : "exited " + std::to_string(code)) +
                             " and wrote no results");
  }
  nlohmann::json doc;
  try {
    in >> doc;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("scripts/torch-peers wrote " + run.out_path + ", which is not JSON: " + e.what());
  }
  return doc;
}

void merge_torch_rows(Results& into, const nlohmann::json& torch_document) {
  const Results torch = results_from_json(torch_document);
  std::map<std::string, const Row*> native;
  for (const auto& r : into.rows) native[r.name] = &r;
  std::vector<PairRow> cross;
  const auto& rows = torch_document.at("benchmarks");
  for (std::size_t i = 0; i < torch.rows.size() && i < rows.size(); ++i) {
    const Row& t = torch.rows[i];
    const std::string mirrors = rows[i].value("mirrors", std::string());
    if (!t.timed() || mirrors.empty()) continue;
    const std::string label = label_of(t.name);
    const auto it = native.find(t.stage + "/" + mirrors + (label.empty() ? "" : "/" + label));
    if (it == native.end() || !it->second->timed()) continue;
    const Row& ours = *it->second;
    if (ours.disturbed || t.disturbed) {  // as every pair: a disturbed row, ours or PyTorch's, gets no ratio
      const Row& disturbed = ours.disturbed ? ours : t;
      into.withheld_pairs.push_back({t.stage, "PyTorch " + t.variant + " -> trainbench " + mirrors, t.name, ours.name,
                                     disturbed.name + " was disturbed: " + disturbance_text(disturbed)});
      continue;
    }
    PairRow p;
    p.stage = t.stage;
    p.label = "PyTorch " + t.variant + " -> trainbench " + mirrors;
    p.baseline = t.name;
    p.improved = ours.name;
    p.ratio = ratio_estimate(t.samples_ns, ours.samples_ns);
    p.baseline_ns = t.summary.median;
    p.improved_ns = ours.summary.median;
    cross.push_back(p);
  }
  into.rows.insert(into.rows.end(), torch.rows.begin(), torch.rows.end());
  into.pairs.insert(into.pairs.end(), torch.pairs.begin(), torch.pairs.end());
  into.pairs.insert(into.pairs.end(), cross.begin(), cross.end());
  into.withheld_pairs.insert(into.withheld_pairs.end(), torch.withheld_pairs.begin(), torch.withheld_pairs.end());
  const auto& ctx = torch_document.value("context", nlohmann::json::object());
  if (ctx.contains("torch")) into.context["torch"] = ctx["torch"];
}

}  // namespace tb
