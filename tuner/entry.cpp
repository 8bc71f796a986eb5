#include "tuner/entry.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"
#include "torch_rows.h"

namespace tb::tune {

using json = nlohmann::json;

namespace {

// The last non-empty line of a child's standard error: a bad entry's message (warnings come before it).
std::string last_line(const std::string& text) {
  std::stringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

}  // namespace

EntryProbe probe_entry(const std::string& spec, bool cuda, int device, int64_t global_batch, const std::atomic<bool>* stop) {
  EntryProbe p;
  p.spec = spec;
  if (spec.rfind("hf:", 0) != 0) {
    const auto colon = spec.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
      throw UsageError("--entry " + spec + ": expected FILE.py:NAME (a function NAME(micro_batch, device) in FILE.py) or hf:MODEL");
    p.file = std::filesystem::absolute(spec.substr(0, colon)).lexically_normal().string();
    p.spec = p.file + spec.substr(colon);
  }
  p.torch.python = torch_python();
  p.torch.script = torch_step_script();
  if (const std::string found = find_on_path(p.torch.python); !found.empty()) p.torch.python = found;
  const json request{{"entry", p.spec}, {"backend", cuda ? "cuda" : "cpu"}, {"device", device},
                     {"micro_batch", std::min<int64_t>(global_batch, 8)}};
  const auto started = std::chrono::steady_clock::now();
  const ChildOutcome o = run_child({p.torch.python, p.torch.script, "--entry-probe", request.dump()}, 600, stop);
  p.probe_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (o.exit_code == 2) throw UsageError(last_line(o.err_tail));
  if (o.exit_code != 0) require_torch("--executor torch --entry", p.torch.script);  // PyTorch missing: how to install it
  try {
    if (o.exit_code != 0) throw std::runtime_error("exit " + std::to_string(o.exit_code) + ": " + last_line(o.err_tail));
    const json j = json::parse(last_line(o.out));
    p.label = j.at("label").get<std::string>();
    p.parameters = j.at("parameters").get<int64_t>();
    p.max_grad_norm = j.at("max_grad_norm").get<double>();
    p.micro_batch = j.at("micro_batch").get<int64_t>();
    p.step_seconds = j.at("step_seconds").get<double>();
    p.switches = j.at("switches").get<std::map<std::string, std::vector<std::string>>>();
    p.torch.torch_version = j.at("torch").get<std::string>();
    p.torch.python_version = j.value("python", "");
    p.torch.cuda = cuda;
  } catch (const std::exception& e) {
    throw UsageError("--entry " + spec + ": " + p.torch.script + " --entry-probe failed under " + p.torch.python + " (" +
                     e.what() + ")");
  }
  return p;
}

step::Workload entry_workload(const EntryProbe& p, int64_t global_batch) {
  step::Workload w;
  w.name = p.label;
  w.path = p.file.empty() ? p.spec : p.file;
  w.source = "autotune --entry " + p.spec;
  w.batch.global = global_batch;
  w.batch.micro = global_batch;
  w.optimizer.grad_clip = p.max_grad_norm;
  return w;
}

std::string entry_digest_text(const EntryProbe& p) {
  std::string text = p.spec + "\n";
  if (!p.file.empty()) {
    std::ifstream file(p.file);
    std::stringstream s;
    s << file.rdbuf();
    text += s.str();
  }
  return text;
}

TrialEstimate entry_shortest_trial(const EntryProbe& p, const Candidate& c, int64_t min_steps) {
  TrialEstimate e;
  // The probe's step at its micro-batch, scaled to the candidate's global batch.
  e.step_seconds = p.step_seconds * static_cast<double>(c.global_batch) / static_cast<double>(std::max<int64_t>(p.micro_batch, 1));
  e.rate_source = "one step of the entry as the probe measured it";
  // Start-up, the checked first step (the reference and the candidate), two untimed steps, min_steps.
  e.seconds = p.probe_seconds + static_cast<double>(4 + std::max<int64_t>(min_steps, 1)) * e.step_seconds;
  return e;
}

LargestBatch find_largest_batch(const EntryProbe& p, bool cuda, int device, int64_t global_batch,
                                int64_t memory_limit_bytes, double timeout_s, const std::atomic<bool>* stop) {
  const json request{{"entry", p.spec}, {"backend", cuda ? "cuda" : "cpu"}, {"device", device},
                     {"global_batch", global_batch}, {"memory_limit_bytes", memory_limit_bytes}};
  const ChildOutcome o =
      run_child({p.torch.python, p.torch.script, "--entry-largest-batch", request.dump()}, timeout_s, stop);
  if (o.interrupted) throw std::runtime_error("interrupted during the largest-batch search");
  if (o.timed_out)
    throw std::runtime_error("the largest-batch search did not finish within " + std::to_string(std::lround(timeout_s)) +
                             " s of the budget (give a larger --budget)");
  if (o.exit_code == 2) throw UsageError(last_line(o.err_tail));
  LargestBatch found;
  try {
    if (o.exit_code != 0)
      throw std::runtime_error(o.signal ? "killed by signal " + std::to_string(o.signal)
                                        : "exit " + std::to_string(o.exit_code) + ": " + last_line(o.err_tail));
    const json j = json::parse(last_line(o.out));
    found.micro_batch = j.at("micro_batch").get<int64_t>();
    found.steps_per_size = j.at("steps_per_size").get<int64_t>();
    found.seconds = j.at("seconds").get<double>();
    found.tried = j.at("tried");
  } catch (const std::exception& e) {
    throw std::runtime_error("--entry " + p.label + ": the largest-batch search (" + p.torch.script +
                             " --entry-largest-batch) failed: " + e.what());
  }
  return found;
}

EntryExecutor::EntryExecutor(EntryProbe probe, bool cuda, int device, const std::atomic<bool>* stop)
    : probe_(std::move(probe)), cuda_(cuda), device_(device), stop_(stop), capacity_(trial_memory_capacity(cuda, device)) {}

TrialResult EntryExecutor::run(const Candidate& candidate, const MeasurePolicy& policy) {
  json request{{"entry", probe_.spec},
               {"backend", cuda_ ? "cuda" : "cpu"},
               {"device", device_},
               {"candidate", to_json(candidate)},
               {"policy", to_json(policy)}};
  if (!cuda_) request["memory_limit_bytes"] = capacity_;
  return run_watched({probe_.torch.python, probe_.torch.script, "--entry-trial", request.dump()}, policy, stop_);
}

}  // namespace tb::tune
