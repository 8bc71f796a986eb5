#include "tuner/entry.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/json_fields.h"
#include "runtime/python.h"

namespace tb::tune {

using json = nlohmann::json;

std::string entry_spec(const std::string& spec) {
  if (spec.rfind("hf:", 0) == 0) return spec;
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
    throw UsageError("--entry " + spec +
                     ": expected FILE.py:NAME (a function NAME(micro_batch, device) in FILE.py) or hf:MODEL");
  return std::filesystem::absolute(spec.substr(0, colon)).lexically_normal().string() + spec.substr(colon);
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
  e.step_seconds = p.step_seconds * static_cast<double>(c.global_batch) /
                   static_cast<double>(std::max<int64_t>(p.micro_batch, 1));
  e.rate_source = "one step of the entry as the probe measured it";
  // Opening a candidate in the worker (building it as the probe did), the checked first step (the reference and
  // the candidate), two untimed steps, min_steps.
  e.seconds = p.probe_seconds + static_cast<double>(4 + std::max<int64_t>(min_steps, 1)) * e.step_seconds;
  return e;
}

std::string entry_ranks_unavailable_reason(int64_t ranks, bool cuda) {
  if (!cuda) return "";
  const auto gpus = static_cast<int64_t>(cuda_status().devices.size());
  if (ranks > gpus)
    return "--ranks " + std::to_string(ranks) + " needs a GPU per rank and this machine has " + std::to_string(gpus);
  return "";
}

namespace {

// The value of `--name V` or `--name=V` in `args` (torchrun also spells its options with underscores), or "".
std::string option_value(const std::vector<std::string>& args, const std::string& name) {
  std::string underscored = name;
  std::replace(underscored.begin() + 2, underscored.end(), '-', '_');
  for (std::size_t i = 0; i < args.size(); ++i)
    for (const std::string& spelled : {name, underscored}) {
      if (args[i] == spelled && i + 1 < args.size()) return args[i + 1];
      if (args[i].rfind(spelled + "=", 0) == 0) return args[i].substr(spelled.size() + 1);
    }
  return "";
}

int64_t whole_number(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || n < 1)
    throw UsageError("--launcher: " + what + " " + text + " is not a count (autotune needs a fixed number)");
  return n;
}

}  // namespace

int64_t torchrun_nodes(const std::vector<std::string>& args) {
  const std::string nodes = option_value(args, "--nnodes");
  return nodes.empty() ? 1 : whole_number(nodes, "--nnodes");
}

int torchrun_rank_threads() {
  const char* set = std::getenv("OMP_NUM_THREADS");
  if (!set) return 1;
  char* end = nullptr;
  const long threads = std::strtol(set, &end, 10);
  return end != set && *end == '\0' && threads > 0 && threads < 1 << 16 ? static_cast<int>(threads) : 1;
}

std::vector<std::string> torchrun_arguments(const std::string& launcher, int64_t ranks) {
  if (launcher.empty()) return {"--standalone", "--nproc-per-node", std::to_string(ranks)};
  std::istringstream in(launcher);
  std::vector<std::string> words{std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
  std::size_t skip = 0;
  if (!words.empty() && std::filesystem::path(words[0]).filename() == "torchrun") skip = 1;
  else if (words.size() >= 3 && words[1] == "-m" && words[2] == "torch.distributed.run") skip = 3;
  if (skip == 0)
    throw UsageError("--launcher '" + launcher + "': an entry's ranks start under torchrun ('torchrun ARGS', run as " +
                     "the tune's python -m torch.distributed.run ARGS)");
  std::vector<std::string> args(words.begin() + static_cast<std::ptrdiff_t>(skip), words.end());
  const int64_t nodes = torchrun_nodes(args);
  if (ranks % nodes != 0)
    throw UsageError("--launcher: --ranks " + std::to_string(ranks) + " is not the same number of ranks on each of " +
                     std::to_string(nodes) + " nodes");
  const std::string per_node = option_value(args, "--nproc-per-node");
  if (per_node.empty()) {
    args.insert(args.end(), {"--nproc-per-node", std::to_string(ranks / nodes)});
  } else if (whole_number(per_node, "--nproc-per-node") * nodes != ranks) {
    throw UsageError("--launcher: --nproc-per-node " + per_node + " on " + std::to_string(nodes) + " node" +
                     (nodes == 1 ? "" : "s") + " is not --ranks " + std::to_string(ranks));
  }
  return args;
}

std::string EntryExecutor::launcher() const {
  if (!distributed_) return "";
  std::string text = "torchrun";
  for (const std::string& word : torchrun_args_) text += " " + word;
  return text;
}

EntryExecutor::EntryExecutor(const std::string& spec, bool cuda, int device, int64_t global_batch,
                             const std::atomic<bool>* stop, int64_t memory_limit, double timeout_s, int64_t ranks,
                             std::vector<std::string> torchrun_args, int cpu_threads)
    : cuda_(cuda),
      ranks_(std::max<int64_t>(ranks, 1)),
      distributed_(ranks_ > 1 || !torchrun_args.empty()),
      torchrun_args_(torchrun_args.empty() ? torchrun_arguments("", ranks_) : std::move(torchrun_args)),
      capacity_(trial_memory_capacity(cuda, device)) {
  probe_.spec = entry_spec(spec);
  if (probe_.spec.rfind("hf:", 0) != 0) probe_.file = probe_.spec.substr(0, probe_.spec.rfind(':'));
  probe_.torch = torch_interpreter();
  // A CPU's ranks share its memory: each is held to its part of it.
  const int64_t host_limit = (memory_limit > 0 ? std::min(memory_limit, capacity_) : capacity_) / ranks_;
  const json start{{"kind", "entry"},
                   {"entry", probe_.spec},
                   {"backend", cuda ? "cuda" : "cpu"},
                   {"device", device},
                   {"memory_limit_bytes", cuda ? int64_t{0} : host_limit},
                   {"threads", cuda ? 0 : cpu_threads},
                   {"distributed", distributed_}};
  // Several ranks: the worker under torchrun (its elastic agent, one node), rank 0 speaking for the group; each
  // candidate's global batch is then every rank's together.
  std::vector<std::string> command{probe_.torch.python};
  if (distributed_) {
    command.insert(command.end(), {"-m", "torch.distributed.run"});
    command.insert(command.end(), torchrun_args_.begin(), torchrun_args_.end());
  }
  command.insert(command.end(), {probe_.torch.script, "--serve", start.dump()});
  if (distributed_ && torchrun_nodes(torchrun_args_) > 1) {  // the other nodes' agents join the same rendezvous
    std::cerr << "autotune: on each other node, start its ranks with the same command (its own --node-rank where "
                 "the rendezvous is static) and the same paths:\n ";
    for (const std::string& word : command) std::cerr << " '" << word << "'";
    std::cerr << std::endl;
  }
  worker_ = std::make_unique<WorkerExecutor>(
      command,
      [ranks = ranks_](const Candidate& candidate) {
        json c = to_json(candidate);
        c["global_batch"] = candidate.global_batch * ranks;
        return json{{"candidate", c}};
      },
      capacity_, stop, ranks_);
  // The worker's start and the probe share `timeout_s` (what is left of the budget): a probe that hangs is stopped
  // at the budget's end, as a trial would be.
  const auto started = std::chrono::steady_clock::now();
  const auto left = [&] {
    return std::max(timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 1.0);
  };
  start_torch_worker(*worker_, probe_.torch, "--executor torch --entry", std::min(left(), kTorchWorkerStartSeconds));
  probe_.torch.cuda = cuda;
  const auto probe_started = std::chrono::steady_clock::now();
  json j;
  try {
    j = worker_->request({{"op", "probe"}, {"micro_batch", std::clamp<int64_t>(global_batch / ranks_, 1, 8)}}, left());
  } catch (const WorkerLost& e) {
    if (e.why == WorkerLost::Why::interrupted) throw;  // a stop, not the entry's fault
    if (e.why == WorkerLost::Why::hung)
      throw UsageError("--entry " + spec + ": validating it did not finish within the budget (" +
                       std::to_string(std::lround(timeout_s)) +
                       " s left; its build or first step hung, or give a larger "
                       "--budget): the worker was stopped");
    throw UsageError("--entry " + spec + ": the worker failed validating it: " + e.what());
  }
  probe_.probe_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - probe_started).count();
  read_probe_answer(j, spec, probe_);
}

namespace {

// The error an answer reports ({"error": WHY, "usage": true when it is the user's to fix}): UsageError with its words,
// or std::runtime_error `context` + its words. Nothing when it reports none.
void throw_reported_error(const json& said, const std::string& context) {
  const auto error = json_field::text(said, "error");
  if (!error) return;
  const std::string why = error->empty() ? "the worker gave no reason" : *error;
  if (json_field::flag(said, "usage").value_or(false)) throw UsageError(why);
  throw std::runtime_error(context + why);
}

// A list of texts (a switch's values).
std::vector<std::string> texts(const json& list, const std::string& name) {
  if (!list.is_array()) throw json_field::FieldError("'" + name + "' is not a list");
  std::vector<std::string> out;
  for (const auto& v : list) {
    if (!v.is_string()) throw json_field::FieldError("'" + name + "' holds a value that is not a string");
    out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace

void read_probe_answer(const json& said, const std::string& spec, EntryProbe& probe) {
  const std::string context = "--entry " + spec + ": ";
  try {
    throw_reported_error(said, context);
    const auto required = [](auto value, const char* key) {
      if (!value) throw json_field::FieldError(std::string("it has no '") + key + "'");
      return *value;
    };
    probe.label = required(json_field::text(said, "label"), "label");
    probe.parameters = required(json_field::integer(said, "parameters"), "parameters");
    probe.max_grad_norm = required(json_field::number(said, "max_grad_norm"), "max_grad_norm");
    probe.micro_batch = required(json_field::integer(said, "micro_batch"), "micro_batch");
    probe.step_seconds = required(json_field::number(said, "step_seconds"), "step_seconds");
    if (probe.parameters < 0 || probe.micro_batch < 1 || probe.step_seconds < 0)
      throw json_field::FieldError("its parameters, micro-batch or step time is out of range");
    const json* switches = json_field::present(said, "switches");
    if (!switches || !switches->is_object()) throw json_field::FieldError("'switches' is not an object");
    probe.switches.clear();
    for (const auto& [name, values] : switches->items()) {
      probe.switches[name] = texts(values, name);
      if (probe.switches[name].empty()) throw json_field::FieldError("switch '" + name + "' has no values");
    }
    probe.applies_when.clear();
    if (const json* when = json_field::present(said, "applies_when")) {
      if (!when->is_object()) throw json_field::FieldError("'applies_when' is not an object");
      for (const auto& [name, condition] : when->items())
        probe.applies_when[name] = required(json_field::text(*when, name), name.c_str());
    }
  } catch (const json_field::FieldError& e) {
    throw UsageError(context + "the worker's probe is not what autotune expects (" + e.what() + ")");
  }
}

LargestBatch read_largest_batch_answer(const json& said, const std::string& label, int64_t global_batch) {
  const std::string context = "--entry " + label + ": the largest-batch search failed: ";
  try {
    throw_reported_error(said, context);
    LargestBatch found;
    found.micro_batch = json_field::integer(said, "micro_batch").value_or(-1);
    found.steps_per_size = json_field::integer(said, "steps_per_size").value_or(-1);
    found.seconds = json_field::number(said, "seconds").value_or(-1);
    if (found.micro_batch < 0 || found.micro_batch > global_batch ||
        (found.micro_batch > 0 && global_batch % found.micro_batch) || found.steps_per_size < 0 || found.seconds < 0)
      throw json_field::FieldError("its micro_batch, steps_per_size or seconds is missing or out of range (a micro-batch "
                                   "from 0 to the global batch " + std::to_string(global_batch) + ", dividing it)");
    const json* tried = json_field::present(said, "tried");
    if (!tried || !tried->is_array()) throw json_field::FieldError("'tried' is not a list");
    found.tried = *tried;
    return found;
  } catch (const json_field::FieldError& e) {
    throw std::runtime_error(context + "its answer is not what autotune expects (" + e.what() + ")");
  }
}

LargestBatch EntryExecutor::largest_batch(int64_t global_batch, int64_t memory_limit_bytes, double timeout_s) {
  json j;
  try {
    j = worker_->request(
        {{"op", "largest_batch"}, {"global_batch", global_batch}, {"memory_limit_bytes", memory_limit_bytes}}, timeout_s);
  } catch (const WorkerLost& e) {
    if (e.why == WorkerLost::Why::interrupted) throw std::runtime_error("interrupted during the largest-batch search");
    if (e.why == WorkerLost::Why::hung)
      throw std::runtime_error("the largest-batch search did not finish within " + std::to_string(std::lround(timeout_s)) +
                               " s of the budget (give a larger --budget)");
    throw std::runtime_error("--entry " + probe_.label + ": the largest-batch search failed: " + e.what());
  }
  return read_largest_batch_answer(j, probe_.label, global_batch);
}

}  // namespace tb::tune
