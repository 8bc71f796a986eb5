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
#include <iostream>
#include <algorithm>
#include <map>
#include <sstream>

#include "adamw/param_set.h"
#include "attention/attention.h"
#include "cg/cg.h"
#include "collate/collate.h"
#include "harness.h"
#include "hostsync/hostsync.h"
#include "launch/launch.h"
#include "runtime/cpu_load.h"
#include "runtime/defaults.h"
#include "runtime/error.h"
#include "runtime/gpu_monitor.h"
#include "runtime/registry.h"
#include "runtime/tolerance.h"
#include "spmv/laplacian.h"
#include "spmv/spmv.h"

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
                                "--listing", run.listing_path};
  if (run.quick) argv.push_back("--quick");
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

nlohmann::json generator_constants() {
  namespace d = defaults;
  const auto tolerance = [](const Tolerance& t) { return nlohmann::json{{"atol", t.atol}, {"rtol", t.rtol}}; };
  return {
      {"adamw.seed_param", adamw::seed_param}, {"adamw.seed_grad", adamw::seed_grad},
      {"adamw.lr", d::adamw_lr}, {"adamw.beta1", d::adamw_beta1}, {"adamw.beta2", d::adamw_beta2},
      {"adamw.eps", d::adamw_eps}, {"adamw.weight_decay", d::adamw_weight_decay},
      {"gradnorm.clip_max_norm", d::clip_max_norm}, {"gradnorm.clip_norm_eps", d::clip_norm_eps},
      {"attention.seed_q", attention::seed_q}, {"attention.seed_k", attention::seed_k},
      {"attention.seed_v", attention::seed_v}, {"attention.checked_rows", d::attention_checked_rows},
      {"attention.tolerance_fp32", tolerance(tolerance::attention_fp32)},
      {"attention.tolerance_bf16", tolerance(tolerance::attention_bf16)},
      {"spmv.seed_x", spmv::seed_x}, {"laplacian.graph_seed", laplacian::graph_seed}, {"laplacian.alpha", d::laplacian_alpha},
      {"cg.seed_rhs", cg::seed_rhs}, {"cg.window", d::cg_window}, {"cg.tol", d::cg_tol},
      {"cg.lazy_tol", d::lazy_cg_tol}, {"cg.max_iterations", d::cg_max_iterations},
      {"cg.check_every", d::cg_check_every}, {"cg.residual_atol", tolerance::cg_residual_atol},
      {"hostsync.seed_prediction", hostsync::seed_prediction}, {"hostsync.seed_target", hostsync::seed_target},
      {"hostsync.async_slots", d::hostsync_async_slots},
      {"launch.seed_state", launch::seed_state}, {"launch.seed_coefficients", launch::seed_coefficients},
      {"launch.state_buffers", launch::state_buffers},
      {"collate.seed_input", collate::seed_input}, {"collate.seed_target", collate::seed_target},
      {"collate.seed_tokens", collate::seed_tokens}, {"collate.vocab", collate::vocab},
      {"collate.shuffle_seed", d::collate_shuffle_seed},
      {"tolerance.fp32", tolerance(tolerance::fp32)},
  };
}

namespace {

// A PyTorch variant and the native variants it stands beside. `only`: the axis values it runs (an axis
// the problem does not have restricts nothing); `cpu_implied`: what its CPU variant runs without an
// axis for it.
struct TorchPeer {
  const char* stage;
  const char* variant;
  const char* mirrors_cuda;  // "": none
  const char* mirrors_cpu;   // "": none (a GPU pattern)
  const char* rationale;
  std::vector<std::pair<std::string, std::vector<std::string>>> only;
  std::vector<std::pair<std::string, std::string>> cpu_implied;

  bool runs(const std::vector<std::pair<std::string, std::string>>& problem) const {
    for (const auto& [axis, values] : only)
      for (const auto& [key, value] : problem)
        if (key == axis && std::find(values.begin(), values.end(), value) == values.end()) return false;
    return true;
  }
};

// AdamW: torch keeps the moments in the parameters' dtype, the stage in fp32: fp32 problems only.
// Gradient clipping over adamw's parameter set, in place as the stage's calls are (every call scales:
// torch multiplies by the clamped factor even where it is 1); fp32 only: torch keeps the gradients in the
// parameters' dtype and returns the norm of bf16 gradients as bf16, the stage's bf16 rows take an fp32
// norm. FlashAttention takes fp16 and bf16 only. The CPU stage's `naive` applies causality inside its
// softmax; its cached-mask variant is nanoGPT's path (always causal: it has no causal axis). CG over the
// stage's window of drifting right-hand sides, fp64: the host-checked loop is the one a PyTorch
// propagator writes (`while rr.item() > limit`); the device loop queues cg_check_every iterations with
// no read, as the stage's graph variant replays its captured block. hostsync: the loss of a training
// loop read on the host (GPU-only, as the stage). collate: the data path alone (compute_us=0) and the
// field-major layouts only (layout=token_rows, the training step's rows, has no PyTorch peer); on the
// CPU the .to(device) is a no-op, and index_select is the PyTorch fix, with no CUDA row to stand beside.
// step: the twin at every workload the step runs, checked as the step checks itself (the first sequence's
// losses against the C++ double forward), with the same part counters (data_ns ... sync_ns).
const std::vector<TorchPeer>& torch_peers() {
  static const std::vector<TorchPeer> peers{
      {"adamw", "fused", "fused", "fused",
       "torch.optim.AdamW(fused=True): one fused multi-tensor kernel per step",
       {{"dtype", {"fp32"}}}, {}},
      {"adamw", "foreach", "foreach", "foreach",
       "torch.optim.AdamW(foreach=True): _foreach_ ops over the tensor lists",
       {{"dtype", {"fp32"}}}, {}},
      {"adamw", "per_tensor", "per_tensor", "per_tensor",
       "torch.optim.AdamW(foreach=False): the for-loop path, several kernels per tensor",
       {{"dtype", {"fp32"}}}, {}},
      {"gradnorm", "per_tensor", "per_tensor", "per_tensor",
       "clip_grad_norm_(max_norm=1.0, foreach=False): a vector_norm per tensor, stack, norm, then mul_ per tensor; no host read (the stage's CUDA per_tensor reads each norm with .item())",
       {{"dtype", {"fp32"}}}, {}},
      {"gradnorm", "foreach", "multi_tensor", "multi_tensor",
       "clip_grad_norm_(max_norm=1.0, foreach=True): _foreach_norm, stack, norm, _foreach_mul_; no host read",
       {{"dtype", {"fp32"}}}, {}},
      {"gradnorm", "foreach_item", "multi_tensor", "multi_tensor",
       "the same + .item() of the returned total norm (the logging pattern): one multi-tensor norm, one host read, one multi-tensor scale, as the stage's multi_tensor (whose read comes before the scale)",
       {{"dtype", {"fp32"}}}, {}},
      {"attention", "sdpa_flash", "fused", "",
       "F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.FLASH_ATTENTION)",
       {{"dtype", {"bf16"}}}, {}},
      {"attention", "sdpa", "fused", "fused",
       "F.scaled_dot_product_attention, the backend PyTorch picks",
       {}, {{"dtype", "fp32"}}},
      {"attention", "naive", "naive", "naive_mask_cached",
       "nanoGPT's slow path: q @ k^T * scale, masked_fill with a cached causal mask, softmax, @ v",
       {}, {{"dtype", "fp32"}, {"causal", "causal"}}},
      {"spmv", "csr", "cusparse_csr", "csr",
       "torch.sparse_csr_tensor (int32 indices, fp64) times a vector: torch.mv",
       {}, {}},
      {"spmv", "spmm_csr", "cusparse_spmm", "spmm_csr",
       "torch.sparse_csr_tensor times a row-major block: torch.mm",
       {}, {}},
      {"cg", "host_checked", "host_checked", "host_checked",
       "torch CG from x = 0, the residual norm read with .item() every iteration",
       {}, {}},
      {"cg", "host_checked_warm", "host_checked_warm", "host_checked_warm",
       "the same warm-started from the cached solution (one torch.mv for its residual), never skipped",
       {}, {}},
      {"cg", "host_checked_lazy", "host_checked_lazy", "host_checked_lazy",
       "the lazy gate: warm start, the solve skipped when (rr <= tol^2 bb).item() says the cache is within 1e-6",
       {}, {}},
      {"cg", "device_loop", "graph", "",
       "8 CG iterations queued with no read (converged updates masked by torch.where), one .item() per 8",
       {}, {}},
      {"cg", "device_loop_warm", "graph_warm", "",
       "the device loop warm-started from the cache, never skipped",
       {}, {}},
      {"cg", "device_loop_lazy", "graph_lazy", "",
       "the device loop with the lazy gate (its verdict read with .item())",
       {}, {}},
      {"hostsync", "no_reads", "no_reads", "",
       "the same steps with no host read: the floor",
       {}, {}},
      {"hostsync", "item_every_step", "item_every_step", "",
       "total += loss.item() every step",
       {}, {}},
      {"hostsync", "sync_every_n", "sync_every_n", "",
       "running_loss += loss.detach() on the device, running_loss.item() once per N steps",
       {}, {}},
      {"hostsync", "metrics_separate", "metrics_separate", "",
       "three running metrics read with three .item() per N steps",
       {}, {}},
      {"hostsync", "metrics_batched", "metrics_batched", "",
       "the three running metrics in one .tolist() per N steps",
       {}, {}},
      {"hostsync", "async_pinned", "async_pinned", "",
       "each step's loss copied non_blocking into a pinned slot behind a torch.cuda.Event, read once query() says done (8 slots)",
       {}, {}},
      {"launch", "eager", "eager", "",
       "the window's 768 in-place lerp_ kernels launched one by one",
       {}, {}},
      {"launch", "graph", "graph", "",
       "the same window captured once in a torch.cuda.CUDAGraph, then replay()",
       {}, {}},
      {"alloc", "caching_allocator", "pool", "",
       "torch.empty per buffer per step and del after: PyTorch's caching allocator",
       {}, {}},
      {"alloc", "empty_cache", "empty_cache", "",
       "the same, with torch.cuda.empty_cache() after every step",
       {}, {}},
      {"alloc", "reuse", "reuse", "",
       "the same kernels on buffers allocated once: the floor",
       {}, {}},
      {"collate", "per_sample", "per_sample", "per_sample",
       "__getitem__ clones, torch.stack per field, .to('cuda') from pageable memory (on the CPU: no copy)",
       {{"compute_us", {"0"}}, {"layout", {"text_pair", "tokens"}}}, {}},
      {"collate", "index_select", "", "gather",
       "torch.index_select(field, 0, batch_indices, out=batch) per field into reused batch tensors: the dataset pre-stacked, no __getitem__, no stack",
       {{"compute_us", {"0"}}, {"layout", {"text_pair", "tokens"}}}, {}},
      {"collate", "pin_memory", "per_sample", "",
       "the same + .pin_memory() + .to('cuda', non_blocking=True): DataLoader(pin_memory=True)",
       {{"compute_us", {"0"}}, {"layout", {"text_pair", "tokens"}}}, {}},
      {"collate", "pinned", "pinned", "",
       "index_select straight into a pinned batch (double-buffered), one non_blocking copy",
       {{"compute_us", {"0"}}, {"layout", {"text_pair", "tokens"}}}, {}},
      {"step", "twin", "train", "train",
       "the PyTorch twin of the step (scripts/torch-step): the same resolved workload and switches, eager (graph "
       "replays where the workload captures CUDA graphs), bf16 autocast and SDPA where the C++ step uses bf16 / "
       "fused attention",
       {}, {}},
  };
  return peers;
}

// The PyTorch pairs: what a user gains by changing their PyTorch code, judged at every problem both
// variants ran at (the same values of every axis, whatever the labels: the CPU's naive attention row is
// labelled by its shape alone, as naive_mask_cached has no causal axis, and is the causal SDPA row's
// problem).
struct TorchPair {
  const char* stage;
  Pair pair;
};

const std::vector<TorchPair>& torch_pairs() {
  static const std::vector<TorchPair> pairs{
      {"adamw", {"per_tensor", "fused", "torch AdamW: fused vs per-tensor"}},
      {"adamw", {"foreach", "fused", "torch AdamW: fused vs foreach"}},
      {"adamw", {"per_tensor", "foreach", "torch AdamW: foreach vs per-tensor"}},
      {"gradnorm", {"per_tensor", "foreach", "torch clip_grad_norm_: foreach vs for-loop"}},
      {"gradnorm", {"foreach_item", "foreach", "torch clip_grad_norm_: no host read vs .item() of the norm"}},
      {"gradnorm", {"per_tensor", "foreach_item", "torch clip_grad_norm_: foreach + .item() vs for-loop"}},
      {"attention", {"naive", "sdpa_flash", "torch attention: SDPA flash vs naive"}},
      {"attention", {"naive", "sdpa", "torch attention: SDPA vs naive"}},
      {"cg", {"host_checked", "host_checked_warm", "torch CG: warm start vs cold start (.item() per iteration)"}},
      {"cg", {"host_checked_warm", "host_checked_lazy", "torch CG: gate vs warm start alone (.item() per iteration)"}},
      {"cg", {"device_loop_warm", "device_loop_lazy", "torch CG: gate vs warm start alone (device loop)"}},
      {"cg", {"host_checked", "device_loop", "torch CG: one read per 8 iterations vs .item() per iteration"}},
      {"cg", {"host_checked_lazy", "device_loop_lazy",
              "torch CG: one read per 8 iterations vs .item() per iteration, lazy"}},
      {"hostsync", {"item_every_step", "sync_every_n", "torch hostsync: loss.item() every N vs every step"}},
      {"hostsync", {"item_every_step", "async_pinned", "torch hostsync: async pinned copy vs loss.item() every step"}},
      {"hostsync", {"metrics_separate", "metrics_batched", "torch hostsync: metrics in one .tolist() vs three .item()"}},
      {"hostsync", {"item_every_step", "no_reads", "torch hostsync: no reads vs loss.item() every step"}},
      {"launch", {"eager", "graph", "torch launch: CUDA graph replay vs eager"}},
      {"alloc", {"caching_allocator", "reuse", "torch alloc: reuse vs caching allocator"}},
      {"alloc", {"empty_cache", "caching_allocator", "torch alloc: cache kept vs emptied every step"}},
      {"collate", {"per_sample", "pinned", "torch collate: pinned gather + async copy vs per-sample + stack"}},
      {"collate", {"per_sample", "pin_memory", "torch collate: pin_memory vs per-sample + stack"}},
      {"collate", {"per_sample", "index_select",
                   "torch collate: index_select into a reused batch vs per-sample + stack"}},
  };
  return pairs;
}

// What the script read at the ends of a row's measuring window ("watch": all CPUs' busy and total ticks
// with its own, or the GPU's NVML clock event reasons), judged as this harness judges its own rows: the
// disturbed share of the window, and the limit it is held to. -1: unwatched (no reading), as clean.
struct Watched {
  double share = -1;
  bool gpu = false;
  double limit(const Settings& s) const { return gpu ? s.throttled_share : s.disturbed_share; }
};

// A row of the listing or of the samples document, by stage, variant and problem label.
std::string row_key(const nlohmann::json& row) {
  return row.value("stage", std::string()) + "/" + row.value("variant", std::string()) + "/" + row.value("label", std::string());
}

Watched watched(const nlohmann::json& record) {
  Watched w;
  const nlohmann::json watch = record.value("watch", nlohmann::json());
  if (!watch.is_object()) return w;
  if (const auto reasons = watch.find("clock_reasons"); reasons != watch.end()) {
    w.gpu = true;
    if (reasons->size() == 2 && (*reasons)[0].is_number_unsigned() && (*reasons)[1].is_number_unsigned())
      w.share = (((*reasons)[0].get<uint64_t>() | (*reasons)[1].get<uint64_t>()) & kDisturbingClockReasons) ? 1 : 0;
  } else if (const auto ticks = watch.find("cpu_ticks"); ticks != watch.end() && ticks->size() == 2) {
    CpuTicks ends[2];
    for (int i = 0; i < 2; ++i) {
      const auto& t = (*ticks)[static_cast<std::size_t>(i)];
      if (!t.is_array() || t.size() != 3) return w;
      ends[i].busy = t[0].get<uint64_t>();  // the script's order: busy, total, its own
      ends[i].total = t[1].get<uint64_t>();
      ends[i].self = t[2].get<uint64_t>();
      ends[i].valid = true;
    }
    w.share = others_share(ends[0], ends[1]);
  }
  return w;
}

// The work model's counters at a row's problem ("solves" per call), without what the row measured: those
// are its own run's, not the PyTorch row's. None where the registry has no such variant or problem.
std::vector<std::pair<std::string, double>> model_counters(const Row& row) {
  try {
    const Stage* stage = builtin_registry().find(row.stage);
    const Variant* variant = stage ? stage->find_variant(row.variant, backend_from_string(row.backend)) : nullptr;
    if (variant && variant->work) return variant->work(Problem(row.problem)).counters;
  } catch (const std::exception&) {  // a problem the model cannot size: no counters rather than wrong ones
  }
  return {};
}

// One measured record of the script: its samples and what it saw, credited with the work of the row it
// mirrors (its bytes, FLOPs, peak and counters: the stage's own work model, at the same problem).
Row torch_row(const nlohmann::json& m, const std::string& backend, const std::map<std::string, const Row*>& native,
              const Settings& settings) {
  const std::string where = "scripts/torch-peers' row " + m.value("stage", std::string("?")) + "/" +
                            m.value("variant", std::string("?"));
  Row r;
  try {
    r.stage = m.at("stage").get<std::string>();
    r.variant = m.at("variant").get<std::string>();
    const std::string label = m.at("label").get<std::string>();
    r.backend = backend;
    r.name = r.stage + "/" + backend + "/" + r.variant + (label.empty() ? "" : "/" + label);
    for (const auto& [key, value] : m.at("problem").items()) r.problem.emplace_back(key, value.get<std::string>());
    r.disposition = disposition_from_string(m.at("disposition").get<std::string>());
    r.reason = m.value("reason", std::string());
    if (m.contains("max_error") && m["max_error"].is_number()) r.max_error = m["max_error"].get<double>();
    r.batch = m.value("batch", int64_t{1});
    r.iterations = r.batch;
    r.samples_ns = m.value("samples_ns", std::vector<double>());
    const Watched w = watched(m);
    (w.gpu ? r.throttled_share : r.others_share) = w.share;
    r.disturbed = w.share > w.limit(settings);
    r.retaken = m.value("retaken", 0);
    const std::string mirrors = m.value("mirrors", std::string());
    const auto it = native.find(r.stage + "/" + mirrors + (label.empty() ? "" : "/" + label));
    if (it != native.end()) {
      const Row& ours = *it->second;
      r.bytes = ours.bytes;
      r.flops = ours.flops;
      r.bound = ours.bound;
      r.peak_key = ours.peak_key;
      r.footprint = ours.footprint;
      r.counters = model_counters(ours);
    }
    const nlohmann::json measured = m.value("counters", nlohmann::json::object());
    for (const auto& [key, value] : measured.items()) {
      const auto same = std::find_if(r.counters.begin(), r.counters.end(), [&](const auto& c) { return c.first == key; });
      if (same != r.counters.end()) same->second = value.get<double>();
      else r.counters.emplace_back(key, value.get<double>());
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(where + " is malformed: " + e.what());
  }
  if (r.disposition == Disposition::passed && r.samples_ns.empty()) throw std::runtime_error(where + " passed with no samples");
  if (r.timed()) {
    r.summary = summarize(r.samples_ns, settings.noise_target);
    // "us_per_step": 64 steps a call -> the median call's time per step, in microseconds
    const nlohmann::json per_unit = m.value("per_unit", nlohmann::json::object());
    for (const auto& [key, units] : per_unit.items())
      if (units.is_number() && units.get<double>() > 0)
        r.counters.emplace_back(key, r.summary.median * 1e-3 / units.get<double>());
    add_per_call_rates(r);  // the mirrored row's samples_per_call: samples_per_s at this row's median
  }
  return r;
}

}  // namespace

std::vector<TorchBench> torch_benches(const std::vector<Entry>& entries, const std::string& device) {
  const std::string backend = device == "cuda" ? "torch_cuda" : "torch";
  std::vector<TorchBench> out;
  for (const TorchPeer& peer : torch_peers()) {
    const std::string mirrored = device == "cuda" ? peer.mirrors_cuda : peer.mirrors_cpu;
    if (mirrored.empty()) continue;
    for (const Entry& e : entries) {
      if (e.stage->name != peer.stage || e.variant->id != mirrored || to_string(e.variant->backend) != device) continue;
      auto problem = e.problem.params();
      if (device == "cpu")
        for (const auto& [axis, value] : peer.cpu_implied)
          if (!e.problem.has(axis)) problem.emplace_back(axis, value);
      if (!peer.runs(problem)) continue;
      const std::string label = e.problem.label();  // the entry's own (benchmark_name)
      out.push_back({std::string(peer.stage) + "/" + backend + "/" + peer.variant + (label.empty() ? "" : "/" + label),
                     peer.stage, peer.variant, label, device + "/" + mirrored, peer.rationale, problem});
    }
  }
  return out;
}

nlohmann::json torch_benches_json(const std::vector<TorchBench>& benches, const std::string& device) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& b : benches) {
    nlohmann::json problem = nlohmann::json::object();
    for (const auto& [key, value] : b.problem) problem[key] = value;
    rows.push_back({{"name", b.name}, {"stage", b.stage}, {"variant", b.variant}, {"label", b.label},
                    {"mirrors", b.mirrors}, {"rationale", b.rationale}, {"problem", problem}});
  }
  return {{"device", device}, {"rows", rows}};
}

void merge_torch_rows(Results& into, const nlohmann::json& samples, const Settings& settings) {
  if (!samples.is_object() || samples.value("schema", std::string()) != torch_samples_schema)
    throw std::runtime_error(std::string("scripts/torch-peers wrote no ") + torch_samples_schema + " document");
  const std::string backend = samples.value("device", std::string("cpu")) == "cuda" ? "torch_cuda" : "torch";
  std::map<std::string, const Row*> native;
  for (const auto& r : into.rows) native[r.name] = &r;
  std::vector<Row> torch;
  std::vector<std::string> mirrored;  // each torch row's mirrored row's name
  for (const auto& m : samples.value("rows", nlohmann::json::array())) {
    torch.push_back(torch_row(m, backend, native, settings));
    const std::string label = m.value("label", std::string());
    mirrored.push_back(torch.back().stage + "/" + m.value("mirrors", std::string()) + (label.empty() ? "" : "/" + label));
  }
  // The PyTorch pairs, then each PyTorch row against the trainbench row it mirrors: the same judgement
  // (ratio, or withheld and why) as every declared pair.
  for (const auto& [stage, pair] : torch_pairs()) {
    for (const Row& improved : torch) {
      if (improved.stage != stage || improved.variant != pair.improved || !improved.timed()) continue;
      for (const Row& baseline : torch)
        if (baseline.stage == stage && baseline.variant == pair.baseline && baseline.timed() &&
            baseline.problem == improved.problem) {
          judge_pair(pair, baseline, improved, into);
          break;
        }
    }
  }
  for (std::size_t i = 0; i < torch.size(); ++i) {
    const Row& t = torch[i];
    const auto it = native.find(mirrored[i]);
    if (!t.timed() || it == native.end() || !it->second->timed()) continue;
    const Row& ours = *it->second;
    judge_pair(Pair{t.name, ours.name, "PyTorch " + t.variant + " -> trainbench " + ours.backend + "/" + ours.variant},
               t, ours, into);
  }
  into.rows.insert(into.rows.end(), torch.begin(), torch.end());
  if (samples.contains("torch")) into.context["torch"] = samples["torch"];
}

nlohmann::json measure_torch_rows(const TorchRun& run, const nlohmann::json& listing, const Settings& settings) {
  write_file_atomically(run.listing_path, listing.dump() + "\n");
  nlohmann::json samples = run_torch_peers(run);
  // A row measured while the machine was busy with something else is taken again, as this harness takes
  // its own rows' samples again: the disturbed rows alone, in a run of their own, up to
  // disturbed_retakes times; the first clean attempt is kept, else the last (which says "disturbed").
  for (int attempt = 0; attempt < defaults::disturbed_retakes && !(run.stop && run.stop()); ++attempt) {
    if (!samples.contains("rows")) break;
    std::map<std::string, std::size_t> disturbed;  // name -> index in samples["rows"]
    for (std::size_t i = 0; i < samples["rows"].size(); ++i) {
      const nlohmann::json& m = samples["rows"][i];
      const Watched w = watched(m);
      if (m.value("disposition", std::string()) == "passed" && w.share > w.limit(settings))
        disturbed[row_key(m)] = i;
    }
    if (disturbed.empty()) break;
    nlohmann::json again = listing;
    nlohmann::json& rows = again["torch"]["rows"];
    rows = nlohmann::json::array();
    for (const auto& row : listing["torch"]["rows"])
      if (disturbed.count(row_key(row))) rows.push_back(row);
    std::cerr << "benchsuite: " << rows.size() << " PyTorch row(s) measured while the machine was busy with "
              << "something else: taken again (" << attempt + 1 << " of " << defaults::disturbed_retakes << ")" << std::endl;
    write_file_atomically(run.listing_path, again.dump() + "\n");
    const nlohmann::json retaken = run_torch_peers(run);
    for (const auto& m : retaken.value("rows", nlohmann::json::array())) {
      const auto it = disturbed.find(row_key(m));
      if (it == disturbed.end() || m.value("disposition", std::string()) != "passed") continue;
      nlohmann::json& kept = samples["rows"][it->second];
      const int before = kept.value("retaken", 0);
      kept = m;
      kept["retaken"] = before + static_cast<int>(m.value("samples_ns", std::vector<double>()).size());
    }
  }
  return samples;
}

}  // namespace tb
