// autotune --ranks and --predict (distributed.h).
#include "tuner/distributed.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "allreduce/allreduce.h"
#include "runtime/comm.h"
#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/json_fields.h"
#include "runtime/stats.h"
#include "tuner/trial.h"

namespace tb::tune {

namespace {

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

}  // namespace

std::vector<std::string> launcher_argv(const std::string& text) {
  std::vector<std::string> argv = words(text);
  if (argv.empty()) throw UsageError("--mpirun is empty: name the launcher, e.g. mpirun");
  const std::string found = find_on_path(argv.front());
  if (found.empty())
    throw UsageError("--ranks: the launcher '" + argv.front() +
                     "' is not on PATH (install Open MPI, e.g. openmpi-bin, or name one with --mpirun)");
  argv.front() = found;
  return argv;
}

std::string ranks_unavailable_reason(int64_t ranks, bool cuda, bool predict, const std::string& launcher) {
  if (comm::launched_ranks() > 1)
    return "run autotune --ranks as one process, not under mpirun: it starts every trial's " + std::to_string(ranks) +
           " ranks itself";
  if (const std::string why = comm::world_unavailable_reason(); !why.empty()) return "--ranks needs MPI: " + why;
  if (cuda) {
    if (const std::string why = allreduce::nccl_unavailable_reason(); !why.empty())
      return "--ranks on a GPU needs NCCL: " + why;
    const auto gpus = static_cast<int64_t>(cuda_status().devices.size());
    if (!predict && ranks > gpus)
      return "--ranks " + std::to_string(ranks) + " needs a GPU per rank and this machine has " + std::to_string(gpus) +
             " (--predict models more ranks than there are)";
  }
  try {
    launcher_argv(launcher);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

void allow_mpirun_as_root() {
  if (geteuid() != 0) return;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
}

int run_allreduce_probe_here(const nlohmann::json& request) {
  comm::Group& world = comm::world();
  const auto elements = request.at("elements").get<int64_t>();
  const auto bucket = std::max<int64_t>(1,
                                        static_cast<int64_t>(request.at("bucket_mb").get<double>() * double(1 << 20) / 4));
  const int repeats = request.value("repeats", 7);
  std::vector<float> grads(static_cast<std::size_t>(elements), 0.0f);
  auto all_reduce = [&] {
    comm::for_each_bucket_from_end(elements, bucket, [&](int64_t begin, int64_t length) {
      world.allreduce(grads.data() + begin, grads.data() + begin, length, comm::Elem::f32, comm::Reduce::sum);
    });
  };
  all_reduce();
  all_reduce();
  std::vector<double> times;
  for (int k = 0; k < repeats; ++k) {
    world.barrier();
    const auto start = std::chrono::steady_clock::now();
    all_reduce();
    times.push_back(comm::agree_max(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
  }
  if (world.rank() == 0)
    std::cout << nlohmann::json{{"seconds", median_of(times)}, {"ranks", world.size()}, {"library", world.library()}}.dump()
              << std::endl;
  return 0;
}

namespace {

// Rank 0's answer, the probe's last line: {"seconds", "ranks", "library"[, "torch"]}.
AllreduceProbe probe_answer(const ChildOutcome& child, const std::string& what) {
  if (child.timed_out || child.exit_code != 0 || child.out.find('{') == std::string::npos)
    throw CallError(__FILE__, __LINE__, what,
                    child.timed_out     ? "timed out"
                    : child.interrupted ? "interrupted"
                                        : ending_text(child));
  return read_allreduce_probe_answer(child.out, what);
}

}  // namespace

AllreduceProbe read_allreduce_probe_answer(const std::string& out, const std::string& what) {
  const auto last = out.find_last_of('{');
  if (last == std::string::npos) throw CallError(__FILE__, __LINE__, what, "it gave no answer");
  // The answer is one flat object: from its only '{' to the end of its line.
  const auto end = out.find('\n', last);
  const std::string line = out.substr(last, end == std::string::npos ? std::string::npos : end - last);
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  try {
    if (j.is_discarded())
      throw json_field::FieldError("it is not JSON: " + json_field::utf8_or_replaced(line.substr(0, 200)));
    AllreduceProbe p;
    const auto ranks = json_field::integer(j, "ranks");
    const auto seconds = json_field::number(j, "seconds");
    if (!ranks || *ranks < 1 || *ranks > INT_MAX) throw json_field::FieldError("'ranks' is missing or not a count of ranks");
    if (!seconds || *seconds < 0) throw json_field::FieldError("'seconds' is missing or negative");
    p.ranks = *ranks;
    p.seconds = *seconds;
    p.library = json_field::text(j, "library").value_or("");
    p.torch = json_field::text(j, "torch").value_or("");
    return p;
  } catch (const json_field::FieldError& e) {
    throw CallError(__FILE__, __LINE__, what, std::string("its answer is not what autotune expects: ") + e.what());
  }
}

AllreduceProbe probe_allreduce(const std::vector<std::string>& launcher, const std::string& self_exe, int64_t ranks,
                               int64_t elements, double bucket_mb, const std::atomic<bool>* stop) {
  const nlohmann::json request{{"elements", elements}, {"bucket_mb", bucket_mb}, {"repeats", 7}};
  const ChildOutcome child = run_child(under_launcher(launcher, ranks, {self_exe, "--allreduce-probe", request.dump()}), 300,
                                       stop);
  return probe_answer(child, "the all-reduce probe on " + std::to_string(ranks) + " ranks");
}

AllreduceProbe probe_torch_allreduce(const std::string& python, const std::string& script, int64_t ranks,
                                     int64_t elements, double bucket_mb, bool cuda, double timeout_s,
                                     const std::atomic<bool>* stop) {
  const nlohmann::json request{
      {"elements", elements}, {"bucket_mb", bucket_mb}, {"repeats", 7}, {"backend", cuda ? "cuda" : "cpu"}};
  const ChildOutcome child = run_child({python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                        std::to_string(ranks), script, "--allreduce-probe", request.dump()},
                                       timeout_s, stop);
  return probe_answer(child, "torch.distributed's all-reduce probe on " + std::to_string(ranks) + " ranks (torchrun)");
}

RanksPrediction predict_ranks(int64_t ranks, int64_t global_batch, double share_samples_per_s, const AllreduceProbe& probe) {
  RanksPrediction p;
  p.ranks = ranks;
  p.global_batch = global_batch;
  p.probe = probe;
  p.step_compute_s = static_cast<double>(global_batch / ranks) / share_samples_per_s;
  const double at_probe = comm::ring_bus_factor(static_cast<int>(probe.ranks));
  p.allreduce_s = at_probe > 0 ? probe.seconds * comm::ring_bus_factor(static_cast<int>(ranks)) / at_probe : 0;
  p.samples_per_s = static_cast<double>(global_batch) / (p.step_compute_s + p.allreduce_s);
  return p;
}

nlohmann::json to_json(const RanksPrediction& p) {
  nlohmann::json j{{"ranks", p.ranks},
                   {"global_batch", p.global_batch},
                   {"samples_per_s", p.samples_per_s},
                   {"step_seconds", p.step_compute_s + p.allreduce_s},
                   {"compute_seconds", p.step_compute_s},
                   {"allreduce_seconds", p.allreduce_s},
                   {"allreduce_measured",
                    {{"ranks", p.probe.ranks}, {"seconds", p.probe.seconds}, {"library", p.probe.library}}},
                   {"note", "a prediction, not a measurement: one rank's share of the batch measured " +
                                (p.share_in_one_process ? std::string("in one process (DDP's switches not searched)")
                                                        : "on " + std::to_string(p.probe.ranks) + " independent ranks") +
                                ", plus the gradients' all-reduce measured on " + std::to_string(p.probe.ranks) +
                                " ranks and scaled by the ring's 2(n-1)/n"}};
  if (!p.probe.torch.empty()) j["allreduce_measured"]["torch"] = p.probe.torch;
  if (p.share_in_one_process) j["compute_measured_in"] = "one process";
  if (p.measured_samples_per_s > 0)
    j["validation"] = {{"measured_samples_per_s", p.measured_samples_per_s}, {"error", p.error()}};
  return j;
}

}  // namespace tb::tune
