#include "tuner/trial.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

#include "runtime/comm.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/json_fields.h"
#include "runtime/registry.h"
#include "runtime/session.h"
#include "runtime/stats.h"
#include "runtime/tolerance.h"
#include "step/optimizer.h"
#include "step/resolved.h"
#include "step/step.h"
#include "step/trainer.h"
#include "runtime/python.h"

namespace tb::tune {

using nlohmann::json;

namespace {

const char* on_off(bool b) { return b ? "on" : "off"; }

std::string sync_text(const step::LoggingSpec& l) {
  if (l.sync == "every_n") return "every_n:" + std::to_string(l.interval);
  return l.sync;
}

// The values to try: the workload's own first, then the alternatives.
std::vector<std::string> own_first(const std::string& own, std::vector<std::string> all) {
  all.erase(std::remove(all.begin(), all.end(), own), all.end());
  all.insert(all.begin(), own);
  return all;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool looks_like_oom(const std::string& what) {
  for (const char* sign : {"cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED", "out of memory",
                           "MiB of device memory", "MiB of host memory"})
    if (what.find(sign) != std::string::npos) return true;
  return false;
}

std::string bucket_text(double mb) {
  std::ostringstream s;
  s << mb;
  return s.str();
}

}  // namespace

std::map<std::string, std::vector<std::string>> available_switches(const step::Workload& w, bool cuda) {
  std::map<std::string, std::vector<std::string>> s;
  s["optimizer"] = own_first(w.optimizer.variant, {"per_tensor", "foreach", "fused"});
  // Fused attention frees the [B, NH, T, T] probabilities: a larger micro-batch fits.
  s["attention"] = own_first(w.switches.fused_attention ? "fused" : "naive", {"fused", "naive"});
  s["activation_checkpointing"] = own_first(on_off(w.switches.activation_checkpointing), {"off", "on"});
  // The sync policy: what the workload does, or a read that never stalls the step.
  s["sync"] = own_first(sync_text(w.logging), {"async"});
  if (w.propagator.enabled) s["lazy_cg"] = own_first(on_off(w.switches.lazy_cg), {"on", "off"});
  // Data parallelism: DDP's bucket size, its default and a smaller and a larger one.
  if (w.distributed.ranks > 1) s["bucket_mb"] = own_first(bucket_text(w.distributed.bucket_mb), {"25", "5", "100"});
  if (cuda) {
    s["bf16_matmuls"] = own_first(on_off(w.switches.bf16_matmuls), {"off", "on"});
    // Graphs need a step of fixed length: not with the host-checked CG of the propagator.
    if (!w.propagator.enabled) s["cuda_graphs"] = own_first(on_off(w.switches.cuda_graphs), {"off", "on"});
  }
  return s;
}

step::Workload apply(const step::Workload& base, const Candidate& c) {
  step::Workload w = base;
  w.batch.global = c.global_batch;
  w.batch.micro = c.micro_batch;
  for (const auto& [key, value] : c.switches) {
    const bool on = value == "on";
    if (key == "optimizer") w.optimizer.variant = value;
    else if (key == "attention") w.switches.fused_attention = value == "fused";
    else if (key == "activation_checkpointing") w.switches.activation_checkpointing = on;
    else if (key == "lazy_cg") w.switches.lazy_cg = on;
    else if (key == "bf16_matmuls") w.switches.bf16_matmuls = on;
    else if (key == "cuda_graphs") w.switches.cuda_graphs = on;
    else if (key == "bucket_mb") w.distributed.bucket_mb = std::stod(value);
    else if (key == "sync") {
      if (value.rfind("every_n:", 0) == 0) {
        w.logging.sync = "every_n";
        w.logging.interval = std::stoll(value.substr(8));
      } else {
        w.logging.sync = value;
        w.logging.interval = 1;
      }
    } else {
      throw UsageError("unknown switch '" + key + "'");
    }
  }
  return w;
}

Candidate own_candidate(const step::Workload& w, const SearchSpace& space) {
  Candidate c;
  c.global_batch = w.batch.global;
  c.micro_batch = w.batch.micro;
  for (const auto& [key, values] : space.switches) c.switches[key] = values.front();
  return c;
}

int64_t warmup_steps(const step::Workload& w) {
  // One, as benchsuite warms up (lazy library initialisation). With graphs, through the capturing
  // step (capture and instantiation, not a training step's cost) to a step of replays only, whose
  // time sizes the samples.
  return w.switches.cuda_graphs ? step::graph_capture_step + 1 : 1;
}

TrialEstimate shortest_trial(const step::Workload& w, int64_t min_steps, bool cuda, int device) {
  TrialEstimate e;
  e.step_flops = step::step_flops(w);
  double startup = 0;
  if (cuda) {
    // The GPU's arithmetic ceiling from its SMs and clock: FP32 FMA lanes (2 x 128 per SM and clock),
    // or dense bf16 tensor cores (4096 per SM and clock on Hopper) when the step's matmuls are bf16.
    const GpuInfo& g = cuda_status().devices.at(static_cast<std::size_t>(device));
    const double per_sm_clock = w.switches.bf16_matmuls ? 4096.0 : 256.0;
    e.flop_rate = static_cast<double>(g.sms) * g.sm_clock_mhz * 1e6 * per_sm_clock;
    e.rate_source = g.name + ", " + (w.switches.bf16_matmuls ? "bf16 tensor-core" : "fp32") + " ceiling";
    startup = 0.5;  // a CUDA context and the libraries' initialisation
  } else {
    // The CPU's: the best of three 512^3 SGEMMs from the peak stage (a few milliseconds).
    const Variant* gemm = builtin_registry().find("peak")->find_variant("gemm_fp32", Backend::cpu);
    auto session = make_session(Backend::cpu, 0);
    auto instance = gemm->make(Problem(std::vector<std::pair<std::string, std::string>>{{"cpu_gemm_n", "512"}}),
                               session->context());
    double best = 1e30;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      instance->run();
      best = std::min(best, seconds_since(t0));
    }
    e.flop_rate = 2.0 * 512 * 512 * 512 / best;
    e.rate_source = "this CPU's SGEMM";
    startup = 0.05;
  }
  e.step_seconds = e.step_flops / e.flop_rate;
  e.seconds = startup + static_cast<double>(1 + warmup_steps(w) + std::max<int64_t>(min_steps, 1)) * e.step_seconds;
  return e;
}

json to_json(const Candidate& c) {
  return json{{"global_batch", c.global_batch},
              {"micro_batch", c.micro_batch},
              {"accumulation", c.accumulation()},
              {"switches", c.switches}};
}

namespace {

// `read` over a candidate's or a result's fields, a wrong one said as UsageError naming `what`.
template <class Read>
auto read_fields(const char* what, Read&& read) {
  try {
    return read();
  } catch (const json_field::FieldError& e) {
    throw UsageError(std::string("not ") + what + ": " + e.what());
  }
}

}  // namespace

Candidate candidate_from_json(const json& j) {
  return read_fields("a candidate", [&] {
    Candidate c;
    c.global_batch = json_field::integer(j, "global_batch").value_or(0);
    c.micro_batch = json_field::integer(j, "micro_batch").value_or(0);
    if (c.global_batch < 1 || c.micro_batch < 1)
      throw json_field::FieldError("'global_batch' and 'micro_batch' must be counts of at least 1");
    const json* switches = json_field::present(j, "switches");
    if (!switches || !switches->is_object()) throw json_field::FieldError("'switches' is not an object");
    for (const auto& [name, value] : switches->items()) {
      if (!value.is_string()) throw json_field::FieldError("switch '" + name + "' is not a string");
      c.switches[name] = value.get<std::string>();
    }
    return c;
  });
}

json to_json(const TrialResult& r) {
  json j{{"class", to_string(r.cls)}, {"samples_per_s", r.samples_per_s}, {"ci_low", r.ci_low},
         {"ci_high", r.ci_high},      {"peak_bytes", r.peak_bytes},       {"steps", r.steps},
         {"seconds", r.seconds},      {"setup_seconds", r.setup_seconds}, {"message", r.message}};
  if (r.pipelined) j["pipelined"] = true;  // written only where it holds: most trials' lines stay as they were
  return j;
}

TrialResult trial_result_from_json(const json& j) {
  return read_fields("a trial's result", [&] {
    TrialResult r;
    const auto cls = json_field::text(j, "class");
    if (!cls) throw json_field::FieldError("it has no 'class'");
    try {
      r.cls = trial_class_from_string(*cls);
    } catch (const std::invalid_argument& e) {
      throw json_field::FieldError(e.what());
    }
    r.samples_per_s = json_field::number(j, "samples_per_s").value_or(0.0);
    r.ci_low = json_field::number(j, "ci_low").value_or(0.0);
    r.ci_high = json_field::number(j, "ci_high").value_or(0.0);
    r.peak_bytes = json_field::integer(j, "peak_bytes").value_or(0);
    r.steps = json_field::integer(j, "steps").value_or(0);
    r.seconds = json_field::number(j, "seconds").value_or(0.0);
    r.setup_seconds = json_field::number(j, "setup_seconds").value_or(0.0);
    r.message = json_field::text(j, "message").value_or("");
    r.pipelined = json_field::flag(j, "pipelined").value_or(false);
    return r;
  });
}

namespace {

// A step time from a trial's samples (seconds per step, every sample of the same steps): the median with its
// distribution-free interval, or for a pipelined sampler the mean with Student's t interval.
Summary step_summary(const std::vector<double>& step_seconds, double noise_target, bool pipelined) {
  if (!pipelined || step_seconds.size() < 2) return summarize(step_seconds, noise_target);
  const double n = static_cast<double>(step_seconds.size());
  double sum = 0, squares = 0;
  for (const double x : step_seconds) sum += x;
  const double mean = sum / n;
  for (const double x : step_seconds) squares += (x - mean) * (x - mean);
  const double half = student_t_quantile(0.975, n - 1) * std::sqrt(squares / (n - 1) / n);
  Summary s;
  s.n = step_seconds.size();
  s.median = mean;  // the centre the rate is taken from
  s.ci_low = std::max(mean - half, *std::min_element(step_seconds.begin(), step_seconds.end()));
  s.ci_high = mean + half;
  s.ci_level = 0.95;
  s.rel_half_width = half / mean;
  s.noisy = s.rel_half_width > noise_target;
  return s;
}

}  // namespace

void measure_steps(const StepSampler& sampler, double sizing_step_seconds, const MeasurePolicy& policy,
                   double samples_per_step, TrialResult& r) {
  // Samples of whole steps, each at least ~20 ms so that timer noise does not dominate.
  const int64_t batch = batch_for(sizing_step_seconds, 0.02, 1 << 12);
  std::vector<double> step_seconds;
  int64_t steps = 0;
  const double measuring = sampler.elapsed();
  if (r.setup_seconds <= 0) r.setup_seconds = measuring;
  while (true) {
    step_seconds.push_back(sampler.time_steps(batch) / static_cast<double>(batch));
    steps += batch;
    // The budget's end: no sample that would finish after it (the parent stops the trial there),
    // however few there are; the interval says how little they tell. The slowest sample so far is
    // the forecast: on a busy machine the next one can take longer than the last.
    const double sample_s = *std::max_element(step_seconds.begin(), step_seconds.end()) * static_cast<double>(batch);
    if (policy.wall_seconds > 0 && sampler.agree_max(sampler.elapsed()) + 1.5 * sample_s > policy.wall_seconds) {
      r.message = "stopped at the budget's end";
      break;
    }
    if (step_seconds.size() < 3 || steps < policy.min_steps) continue;
    const Summary s = step_summary(step_seconds, policy.target_rel_ci, sampler.pipelined);
    if (!s.noisy || sampler.agree_max(sampler.elapsed() - measuring) >= policy.max_seconds) break;
    // Clearly behind the best so far: even the fast end of the interval is slower.
    if (policy.stop_below > 0 && samples_per_step / s.ci_low < policy.stop_below) {
      r.message = "stopped early: clearly behind the best so far";
      break;
    }
  }
  const Summary s = step_summary(step_seconds, policy.target_rel_ci, sampler.pipelined);
  r.samples_per_s = samples_per_step / s.median;
  r.ci_low = samples_per_step / s.ci_high;
  r.ci_high = samples_per_step / s.ci_low;
  r.steps = steps;
}

// ---- the child ---------------------------------------------------------------------------------

TrialResult run_trial_here(const json& request) {
  const auto started = std::chrono::steady_clock::now();
  TrialResult r;
  auto fail = [&](TrialClass cls, const std::string& why) {
    r.cls = cls;
    r.message = why;
    r.seconds = seconds_since(started);
    return r;
  };
  try {
    const bool cuda = request.at("backend").get<std::string>() == "cuda";
    const Candidate c = candidate_from_json(request.at("candidate"));
    step::Workload base = step::load_workload(request.at("workload").get<std::string>());
    // Data parallelism: every rank runs this trial (mpirun -n ranks) with its share of the batch.
    // Independent ranks (autotune --predict) each run a whole step of their own, no all-reduce: one
    // rank's compute while the others load the machine as they would.
    const int64_t ranks = request.value("ranks", int64_t{1});
    const bool independent = request.value("independent", false);
    base.distributed.ranks = independent ? 1 : ranks;
    if (ranks > 1 && comm::launched_ranks() != ranks)
      return fail(TrialClass::error, "a trial of " + std::to_string(ranks) + " ranks started with " +
                                         std::to_string(comm::launched_ranks()) + " (run it under mpirun -n " +
                                         std::to_string(ranks) + ")");
    const step::Workload w = apply(base, c);
    const MeasurePolicy policy = policy_from_json(request.at("policy"));
    if (const std::string why = step::unsupported_reason(w, cuda); !why.empty())
      return fail(looks_like_oom(why) ? TrialClass::oom : TrialClass::error, why);

    // Under mpirun each rank drives the GPU its local rank names.
    int device = request.value("device", 0);
    if (cuda && ranks > 1 && !cuda_status().devices.empty())
      device = comm::world().local_rank() % static_cast<int>(cuda_status().devices.size());
    auto session = make_session(cuda ? Backend::cuda : Backend::cpu, device);
    std::unique_ptr<step::StepInstance> instance = cuda ? step::make_cuda_step(w, session->context())
                                                        : step::make_cpu_step(w);
    // Every rank decides alike: the slowest rank's sample times, the latest rank's clock.
    comm::AgreedTimer agreed(session->timer());
    SampleTimer& timer = ranks > 1 ? static_cast<SampleTimer&>(agreed) : session->timer();
    // The first step: the forward every configuration is checked with (on every rank, its own sample).
    instance->run();
    const Verdict verdict = instance->check();
    if (comm::agree_min(verdict.passed ? 1.0 : 0.0) == 0.0)
      return fail(TrialClass::incorrect,
                  verdict.passed ? "another rank's first forward differs from the reference" : verdict.detail);
    double last_warmup = 0;
    for (int64_t k = 0; k < warmup_steps(w); ++k)
      last_warmup = time_sample(
          timer, [&] { instance->run(); }, 1);
    r.setup_seconds = seconds_since(started);
    StepSampler sampler;
    sampler.time_steps = [&](int64_t steps) {
      return time_sample(
          timer, [&] { instance->run(); }, steps);
    };
    sampler.elapsed = [&] { return seconds_since(started); };
    sampler.agree_max = [](double x) { return comm::agree_max(x); };
    measure_steps(sampler, last_warmup, policy, static_cast<double>(w.batch.global * w.distributed.ranks),
                  r);  // every rank's share
    r.peak_bytes = instance->peak_bytes();
    r.seconds = seconds_since(started);
    return r;
  } catch (const std::bad_alloc&) {
    return fail(TrialClass::oom, "out of memory (std::bad_alloc)");
  } catch (const UsageError& e) {
    return fail(TrialClass::error, e.what());
  } catch (const std::exception& e) {
    return fail(looks_like_oom(e.what()) ? TrialClass::oom : TrialClass::error, e.what());
  }
}

// ---- the parent --------------------------------------------------------------------------------

ChildOutcome run_child(const std::vector<std::string>& argv, double timeout_s, const std::atomic<bool>* stop) {
  ChildOutcome outcome;
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) throw CallError(__FILE__, __LINE__, "pipe", std::strerror(errno));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw CallError(__FILE__, __LINE__, "fork", std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);  // its own group: the watchdog kills everything it started
    // Ends with autotune however autotune ends (kill -9 included): SIGTERM, which a launcher (mpirun) takes as
    // the word to stop its ranks; a trial sets SIGKILL for itself (die_with_parent).
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // autotune ended before the line above
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(out_pipe[1]);
  close(err_pipe[1]);
  const auto started = std::chrono::steady_clock::now();
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_pipes = 2;
  std::string err;
  bool killed = false;
  char buf[4096];
  while (open_pipes > 0) {
    const int ready = poll(fds, 2, 100);
    if (ready > 0) {
      for (auto& f : fds) {
        if (f.fd < 0 || !(f.revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = read(f.fd, buf, sizeof buf);
        if (n <= 0) {
          close(f.fd);
          f.fd = -1;
          --open_pipes;
        } else if (f.fd == out_pipe[0]) {
          outcome.out.append(buf, static_cast<std::size_t>(n));
        } else {
          err.append(buf, static_cast<std::size_t>(n));
          if (err.size() > 8192) err.erase(0, err.size() - 4096);
        }
      }
    }
    if (!killed && (seconds_since(started) > timeout_s || (stop && stop->load()))) {
      outcome.timed_out = seconds_since(started) > timeout_s;
      outcome.interrupted = !outcome.timed_out;
      kill(-pid, SIGKILL);
      killed = true;
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  outcome.err_tail = err.size() > 2000 ? err.substr(err.size() - 2000) : err;
  return outcome;
}

TrialResult classify(const ChildOutcome& o) {
  TrialResult r;
  if (o.interrupted) {
    r.cls = TrialClass::error;
    r.message = "interrupted";
    return r;
  }
  if (o.timed_out) {
    r.cls = TrialClass::timeout;
    r.message = "no result before the watchdog's limit: the trial hung or is far too slow (killed)";
    return r;
  }
  // The child's last line of standard output is its result.
  std::string last;
  std::size_t end = o.out.find_last_not_of("\n ");
  if (end != std::string::npos) {
    const std::size_t start = o.out.rfind('\n', end);
    last = o.out.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
  }
  if (o.exit_code == 0 && !last.empty()) {
    try {
      return trial_result_from_json(json::parse(last));
    } catch (const std::exception& e) {
      r.cls = TrialClass::error;
      r.message = "unreadable trial result: " + json_field::utf8_or_replaced(e.what());  // quotes the child's bytes
      return r;
    }
  }
  r.cls = o.signal == SIGKILL ? TrialClass::oom : TrialClass::error;  // nothing else here sends SIGKILL: the kernel's
  r.message = ending_text(o);                                         // out-of-memory killer
  return r;
}

std::string ending_text(int signal, int exit_code, const std::string& said, const std::string& after_exit) {
  if (signal == SIGKILL) return "killed by SIGKILL (the kernel's out-of-memory killer, most likely)";
  std::string text;
  if (signal) text = std::string("crashed: killed by signal ") + std::to_string(signal) + " (" + strsignal(signal) + ")";
  else if (exit_code >= 0) text = "exited with code " + std::to_string(exit_code) + after_exit;
  else text = "ended";
  // What it said is any bytes (a tail cut mid-character, a locale's): the message is journaled as JSON.
  return said.empty() ? text : text + ": " + json_field::utf8_or_replaced(said);
}

std::string ending_text(const ChildOutcome& o) {
  std::string said = o.err_tail;
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  return ending_text(o.signal, o.exit_code, said, " and no result");
}

int64_t trial_memory_capacity(bool cuda, int device) {
  if (cuda) {
    // The context, cuBLAS's workspace and the allocator's slack are not in the step's own count.
    const auto& g = cuda_status().devices.at(static_cast<std::size_t>(device));
    return g.memory_bytes - (int64_t{1} << 30);
  }
  return static_cast<int64_t>(0.9 * static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) *
                              static_cast<double>(sysconf(_SC_PAGESIZE)));
}

json to_json(const MeasurePolicy& policy) {
  return json{{"target_rel_ci", policy.target_rel_ci},
              {"max_seconds", policy.max_seconds},
              {"min_steps", policy.min_steps},
              {"stop_below", policy.stop_below},
              {"wall_seconds", policy.wall_seconds}};
}

MeasurePolicy policy_from_json(const json& j) {
  MeasurePolicy policy;
  policy.target_rel_ci = j.at("target_rel_ci").get<double>();
  policy.max_seconds = j.at("max_seconds").get<double>();
  policy.min_steps = j.at("min_steps").get<int64_t>();
  policy.stop_below = j.value("stop_below", 0.0);
  policy.wall_seconds = j.value("wall_seconds", 0.0);
  return policy;
}

TrialResult run_watched(const std::vector<std::string>& argv, const MeasurePolicy& policy, const std::atomic<bool>* stop) {
  const auto started = std::chrono::steady_clock::now();
  // Setup, the reference check and the first step come on top of the measuring time.
  const double hang_limit = 3 * policy.max_seconds + 120;
  // With a budget, the trial ends by its end: a trial still running then is stopped, not hung.
  const bool budget_bound = policy.wall_seconds > 0 && policy.wall_seconds + kill_grace_seconds < hang_limit;
  const double watchdog = budget_bound ? policy.wall_seconds + kill_grace_seconds : hang_limit;
  const ChildOutcome outcome = run_child(argv, watchdog, stop);
  if (outcome.timed_out && budget_bound)
    throw OutOfBudget("the budget ended before the trial had a result (stopped after " +
                      std::to_string(static_cast<int>(watchdog)) + " s)");
  TrialResult r = classify(outcome);
  if (r.seconds == 0) r.seconds = seconds_since(started);
  return r;
}

ProcessExecutor::ProcessExecutor(std::string self_exe, std::string workload_path, bool cuda, int device,
                                 const std::atomic<bool>* stop, int64_t ranks, std::vector<std::string> launcher,
                                 bool independent)
    : exe_(std::move(self_exe)),
      workload_path_(std::move(workload_path)),
      cuda_(cuda),
      device_(device),
      stop_(stop),
      ranks_(ranks),
      launcher_(std::move(launcher)),
      independent_(independent),
      // The ranks of a CPU trial share this host's memory; a GPU rank has its own device.
      capacity_(trial_memory_capacity(cuda, device) / (cuda ? 1 : ranks)) {}

TrialResult ProcessExecutor::run(const Candidate& candidate, const MeasurePolicy& policy) {
  const json request{{"workload", workload_path_},      {"backend", cuda_ ? "cuda" : "cpu"}, {"device", device_},
                     {"candidate", to_json(candidate)}, {"policy", to_json(policy)},         {"ranks", ranks_},
                     {"independent", independent_}};
  if (ranks_ == 1) return run_watched({exe_, "--trial", request.dump()}, policy, stop_);
  // Every rank under the launcher. Rank 0 writes the result; a rank on a GPU drives the one its local
  // rank names.
  return run_watched(under_launcher(launcher_, ranks_, {exe_, "--trial", request.dump()}), policy, stop_);
}

std::vector<std::string> under_launcher(const std::vector<std::string>& launcher, int64_t ranks,
                                        const std::vector<std::string>& command) {
  std::vector<std::string> argv = launcher;
  argv.push_back("-n");
  argv.push_back(std::to_string(ranks));
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

std::string find_on_path(const std::string& program) {
  if (program.find('/') != std::string::npos) return access(program.c_str(), X_OK) == 0 ? program : "";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0) return dir + "/" + program;
  return "";
}

// ---- the PyTorch executor ---------------------------------------------------------------------------

TorchProbe torch_interpreter() {
  TorchProbe p;
  p.python = torch_python();
  p.script = torch_step_script();
  // The interpreter found by its name on PATH, as posix_spawn wants a path.
  if (const std::string found = find_on_path(p.python); !found.empty()) p.python = found;
  return p;
}

void start_torch_worker(WorkerExecutor& worker, TorchProbe& probe, const std::string& who, double timeout_s) {
  json hello;
  try {
    hello = worker.start(timeout_s);
  } catch (const WorkerLost& e) {
    if (e.why == WorkerLost::Why::interrupted) throw;  // a stop while it started: nothing to explain
    require_torch(who, probe.script);
    throw UsageError(who + ": " + probe.script + " --serve failed under " + probe.python + " (" + e.what() + ")");
  } catch (const UsageError& e) {
    // The worker's own words (a GPU it cannot see), unless PyTorch or the script is missing: how to install it.
    require_torch(who, probe.script);
    throw;
  } catch (const std::exception& e) {
    require_torch(who, probe.script);
    throw UsageError(who + ": " + probe.script + " --serve failed under " + probe.python + " (" + e.what() + ")");
  }
  const WorkerHello said = read_hello(hello);  // read once already, when the worker started
  probe.torch_version = said.torch_version;
  probe.python_version = said.python_version;
  probe.cuda = said.cuda;
  probe.import_seconds = said.start_seconds;
}

TorchExecutor::TorchExecutor(const step::Workload& workload, bool cuda, int device, const std::atomic<bool>* stop,
                             int64_t memory_limit)
    : workload_(workload), cuda_(cuda), capacity_(trial_memory_capacity(cuda, device)), probe_(torch_interpreter()) {
  const int64_t host_limit = memory_limit > 0 ? std::min(memory_limit, capacity_) : capacity_;
  const json start{{"kind", "twin"},
                   {"backend", cuda ? "cuda" : "cpu"},
                   {"device", device},
                   {"memory_limit_bytes", cuda ? int64_t{0} : host_limit}};
  worker_ = std::make_unique<WorkerExecutor>(
      std::vector<std::string>{probe_.python, probe_.script, "--serve", start.dump()},
      [this](const Candidate& candidate) {
        const step::Workload w = apply(workload_, candidate);
        const Tolerance tol = w.switches.bf16_matmuls ? tolerance::step_bf16 : tolerance::step_fp32;
        return json{{"candidate", to_json(candidate)},
                    {"resolved", step::resolved_workload(w)},
                    {"warmup_steps", warmup_steps(w)},
                    {"reference",
                     {{"sample", first_sample_}, {"losses", reference_}, {"rtol", tol.rtol}, {"atol", tol.atol}}}};
      },
      capacity_, stop);
  first_sample_ = step::first_sample_of(workload.data.samples);
  reference_ = step::reference_losses(workload, first_sample_);
  start_torch_worker(*worker_, probe_, "--executor torch");
}

}  // namespace tb::tune
