#include "torch_rows.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "adamw/param_set.h"
#include "attention/attention.h"
#include "cg/cg.h"
#include "collate/collate.h"
#include "harness.h"
#include "hostsync/hostsync.h"
#include "launch/launch.h"
#include "runtime/defaults.h"
#include "runtime/error.h"
#include "runtime/json_fields.h"
#include "runtime/registry.h"
#include "runtime/tolerance.h"
#include "spmv/laplacian.h"
#include "spmv/spmv.h"

extern char** environ;

namespace tb {

namespace fs = std::filesystem;

namespace {

// posix_spawn's argument vector for `argv` (pointers into it, null-terminated).
std::vector<char*> spawn_arguments(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  return args;
}

}  // namespace

nlohmann::json generator_constants() {
  namespace d = defaults;
  const auto tolerance = [](const Tolerance& t) { return nlohmann::json{{"atol", t.atol}, {"rtol", t.rtol}}; };
  return {
      {"adamw.seed_param", adamw::seed_param},
      {"adamw.seed_grad", adamw::seed_grad},
      {"adamw.lr", d::adamw_lr},
      {"adamw.beta1", d::adamw_beta1},
      {"adamw.beta2", d::adamw_beta2},
      {"adamw.eps", d::adamw_eps},
      {"adamw.weight_decay", d::adamw_weight_decay},
      {"gradnorm.clip_max_norm", d::clip_max_norm},
      {"gradnorm.clip_norm_eps", d::clip_norm_eps},
      {"attention.seed_q", attention::seed_q},
      {"attention.seed_k", attention::seed_k},
      {"attention.seed_v", attention::seed_v},
      {"attention.checked_rows", d::attention_checked_rows},
      {"attention.tolerance_fp32", tolerance(tolerance::attention_fp32)},
      {"attention.tolerance_bf16", tolerance(tolerance::attention_bf16)},
      {"spmv.seed_x", spmv::seed_x},
      {"laplacian.graph_seed", laplacian::graph_seed},
      {"laplacian.alpha", d::laplacian_alpha},
      {"cg.seed_rhs", cg::seed_rhs},
      {"cg.window", d::cg_window},
      {"cg.tol", d::cg_tol},
      {"cg.lazy_tol", d::lazy_cg_tol},
      {"cg.max_iterations", d::cg_max_iterations},
      {"cg.check_every", d::cg_check_every},
      {"cg.residual_atol", tolerance::cg_residual_atol},
      {"hostsync.seed_prediction", hostsync::seed_prediction},
      {"hostsync.seed_target", hostsync::seed_target},
      {"hostsync.async_slots", d::hostsync_async_slots},
      {"launch.seed_state", launch::seed_state},
      {"launch.seed_coefficients", launch::seed_coefficients},
      {"launch.state_buffers", launch::state_buffers},
      {"collate.seed_input", collate::seed_input},
      {"collate.seed_target", collate::seed_target},
      {"collate.seed_tokens", collate::seed_tokens},
      {"collate.vocab", collate::vocab},
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
// The kernel stages' peers: the optimizer, clipping, attention, sparse products and CG.
// A table, a peer a line or two, laid out by hand:
// clang-format off
static std::vector<TorchPeer> kernel_stage_peers() {
  return {
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
  };
}
// clang-format on

// The training loop's peers: host reads, launches, allocation, collation and the whole step.
// A table, a peer a line or two, laid out by hand:
// clang-format off
static std::vector<TorchPeer> loop_stage_peers() {
  return {
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
}
// clang-format on

const std::vector<TorchPeer>& torch_peers() {
  static const std::vector<TorchPeer> peers = [] {
    std::vector<TorchPeer> all = kernel_stage_peers();
    for (auto& peer : loop_stage_peers()) all.push_back(std::move(peer));
    return all;
  }();
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
      {"cg",
       {"host_checked_lazy", "device_loop_lazy", "torch CG: one read per 8 iterations vs .item() per iteration, lazy"}},
      {"hostsync", {"item_every_step", "sync_every_n", "torch hostsync: loss.item() every N vs every step"}},
      {"hostsync", {"item_every_step", "async_pinned", "torch hostsync: async pinned copy vs loss.item() every step"}},
      {"hostsync", {"metrics_separate", "metrics_batched", "torch hostsync: metrics in one .tolist() vs three .item()"}},
      {"hostsync", {"item_every_step", "no_reads", "torch hostsync: no reads vs loss.item() every step"}},
      {"launch", {"eager", "graph", "torch launch: CUDA graph replay vs eager"}},
      {"alloc", {"caching_allocator", "reuse", "torch alloc: reuse vs caching allocator"}},
      {"alloc", {"empty_cache", "caching_allocator", "torch alloc: cache kept vs emptied every step"}},
      {"collate", {"per_sample", "pinned", "torch collate: pinned gather + async copy vs per-sample + stack"}},
      {"collate", {"per_sample", "pin_memory", "torch collate: pin_memory vs per-sample + stack"}},
      {"collate", {"per_sample", "index_select", "torch collate: index_select into a reused batch vs per-sample + stack"}},
  };
  return pairs;
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
    rows.push_back({{"name", b.name},
                    {"stage", b.stage},
                    {"variant", b.variant},
                    {"label", b.label},
                    {"mirrors", b.mirrors},
                    {"rationale", b.rationale},
                    {"problem", problem}});
  }
  return {{"device", device}, {"rows", rows}};
}

// ---- the script's answers ------------------------------------------------------------------------------

namespace {

// A field of the script's answer to `op`, read strictly (runtime/json_fields.h): one of another type is an answer
// this benchsuite cannot read.
template <class Read>
auto answer_field(const std::string& op, Read&& read) {
  try {
    return read();
  } catch (const json_field::FieldError& e) {
    throw std::runtime_error("scripts/torch-peers' " + op + " answer is not what benchsuite expects: " + e.what());
  }
}

}  // namespace

nlohmann::ordered_json parse_torch_peers_line(const std::string& line) {
  nlohmann::ordered_json said;
  try {
    said = nlohmann::ordered_json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann quotes what it last read, any bytes: the row's reason is written as JSON.
    throw std::runtime_error("scripts/torch-peers answered something that is not JSON (" +
                             json_field::utf8_or_replaced(e.what()) + ")");
  }
  if (!said.is_object())
    throw std::runtime_error("scripts/torch-peers answered " + std::string(said.type_name()) + ", not an object");
  return said;
}

void throw_torch_peers_error(const nlohmann::ordered_json& said) {
  if (!said.contains("error")) return;
  const std::string why = answer_field("error", [&] { return json_field::text(said, "error").value_or(""); });
  throw std::runtime_error("scripts/torch-peers: " + (why.empty() ? std::string("an error it gave no words for") : why));
}

TorchPeersHello read_torch_peers_hello(const nlohmann::ordered_json& said) {
  return answer_field("hello", [&] {
    TorchPeersHello h;
    h.protocol = json_field::text(said, "protocol").value_or("");
    if (const auto* torch = json_field::present(said, "torch")) {
      if (!torch->is_object()) throw json_field::FieldError("'torch' is not an object");
      h.torch = nlohmann::json::parse(torch->dump());
    }
    return h;
  });
}

Verdict read_torch_peers_open(const nlohmann::ordered_json& said, const std::string& row) {
  Verdict verdict;
  const auto [disposition, reason] = answer_field("open", [&] {
    verdict.max_error = json_field::number(said, "max_error").value_or(0.0);
    return std::pair{json_field::text(said, "disposition").value_or(""), json_field::text(said, "reason").value_or("")};
  });
  if (disposition == "unsupported") throw CannotRun(reason.empty() ? "scripts/torch-peers gave no reason" : reason);
  if (disposition == "failed")
    throw std::runtime_error(reason.empty() ? "scripts/torch-peers failed and gave no reason" : reason);
  if (disposition != "passed" && disposition != "incorrect")
    throw std::runtime_error("scripts/torch-peers opened " + row + " as '" + disposition + "'");
  verdict.passed = disposition == "passed";
  verdict.detail = reason;
  return verdict;
}

std::vector<std::pair<std::string, double>> read_torch_peers_counters(const nlohmann::ordered_json& said,
                                                                      std::map<std::string, double>& per_unit) {
  return answer_field("counters", [&] {
    std::vector<std::pair<std::string, double>> counters;
    for (const char* field : {"counters", "per_unit"}) {
      const auto* listed = json_field::present(said, field);
      if (!listed) continue;
      if (!listed->is_object()) throw json_field::FieldError(std::string("'") + field + "' is not an object");
      for (const auto& [key, value] : listed->items()) {
        if (!value.is_number()) continue;  // a count it keeps for itself (a name, a list)
        const double v = json_field::number(*listed, key).value_or(0.0);
        if (std::string(field) == "counters") counters.emplace_back(key, v);
        else per_unit[key] = v;
      }
    }
    return counters;
  });
}

double read_torch_peers_time(const nlohmann::ordered_json& said) {
  return answer_field("time", [&] {
    const auto seconds = json_field::number(said, "seconds");
    if (!seconds || *seconds < 0) throw json_field::FieldError("it gives no 'seconds' the calls took");
    return *seconds;
  });
}

// ---- the script, serving ------------------------------------------------------------------------------

namespace {

// One end of a socket, closed with it.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

}  // namespace

// scripts/torch-peers --serve, started on a listing: one JSON request a line on its stdin, one answer a
// line on its stdout (both one socket), its stderr ours. It runs in a process group of its own, so that
// a Ctrl-C at the terminal reaches benchsuite alone, which ends the conversation after the sample in hand.
class TorchServer {
 public:
  TorchServer(const std::string& device, const std::string& listing_path) {
    int ends[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
      throw std::runtime_error(std::string("cannot make a socket for scripts/torch-peers: ") + std::strerror(errno));
    ours_ = std::make_unique<Socket>(ends[0]);
    Socket theirs(ends[1]);
    const std::vector<std::string> argv{torch_python(), torch_peers_script(), "--device", device,
                                        "--listing",    listing_path,         "--serve"};
    std::vector<char*> args = spawn_arguments(argv);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, theirs.get(), STDIN_FILENO);  // dup2 clears close-on-exec
    posix_spawn_file_actions_adddup2(&actions, theirs.get(), STDOUT_FILENO);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
    const int spawned = posix_spawnp(&pid_, args[0], &actions, &attributes, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    if (spawned != 0) throw std::runtime_error("cannot start " + argv[0] + " " + argv[1] + ": " + std::strerror(spawned));
    theirs.reset();
    const std::optional<nlohmann::ordered_json> hello = read_answer();
    if (!hello) {
      const int code = wait_for_exit();
      if (code == 2) throw UsageError("scripts/torch-peers rejected the run (its message is above)");
      throw std::runtime_error("scripts/torch-peers exited " + std::to_string(code) + " before it answered");
    }
    const TorchPeersHello said = read_torch_peers_hello(*hello);
    if (said.protocol != torch_serve_protocol)
      throw std::runtime_error(std::string("scripts/torch-peers does not speak ") + torch_serve_protocol +
                               " (it is not the script this benchsuite was built with)");
    torch_context_ = said.torch;
  }

  // The end of the conversation: the script closes its rows and exits; one that does not within a few
  // seconds (a call that hangs) is killed.
  ~TorchServer() {
    ours_.reset();
    if (pid_ <= 0) return;
    for (int waited_ms = 0; waited_ms < 10000; waited_ms += 20) {
      int status = 0;
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_ || (done < 0 && errno != EINTR)) return;
      usleep(20000);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

  TorchServer(const TorchServer&) = delete;
  TorchServer& operator=(const TorchServer&) = delete;

  // The script's answer to `message`, its keys in the script's order (a case's counters in the order it
  // gives them); throws std::runtime_error with its words when it says "error", and when it has ended
  // (every later request then fails at once, with the same words).
  nlohmann::ordered_json request(const nlohmann::json& message) {
    if (!ended_.empty()) throw std::runtime_error(ended_);
    const std::string line = message.dump() + "\n";
    for (std::size_t sent = 0; sent < line.size();) {
      const ssize_t n = ::send(ours_->get(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_ended();
      sent += static_cast<std::size_t>(n);
    }
    const std::optional<nlohmann::ordered_json> answer = read_answer();
    if (!answer) fail_ended();
    throw_torch_peers_error(*answer);
    return *answer;
  }

  int pid() const { return static_cast<int>(pid_); }
  const nlohmann::json& torch_context() const { return torch_context_; }

 private:
  // The next line as JSON; nullopt at the end of the conversation (the script ended).
  std::optional<nlohmann::ordered_json> read_answer() {
    for (;;) {
      if (const auto end = buffer_.find('\n'); end != std::string::npos) {
        const std::string line = buffer_.substr(0, end);
        buffer_.erase(0, end + 1);
        return parse_torch_peers_line(line);
      }
      char chunk[4096];
      const ssize_t n = ::recv(ours_->get(), chunk, sizeof chunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  int wait_for_exit() {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0)
      if (errno != EINTR) return 127;
    pid_ = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }

  [[noreturn]] void fail_ended() {
    ended_ = "scripts/torch-peers ended (exit " + std::to_string(wait_for_exit()) + "; its message is above)";
    throw std::runtime_error(ended_);
  }

  std::unique_ptr<Socket> ours_;
  pid_t pid_ = 0;
  std::string buffer_;  // what was read past the last answer
  std::string ended_;
  nlohmann::json torch_context_;
};

namespace {

// One PyTorch row, opened (built and checked) by the script. run() queues a call; its timer's stop() has
// the script make the queued calls between two reads of its clock and returns their seconds, so that a
// sample is the PyTorch calls alone, not the requests around them.
class TorchRowInstance final : public Instance {
 public:
  using UnitsSink = std::map<std::string, std::map<std::string, double>>;

  TorchRowInstance(TorchServer& server, std::string name, std::shared_ptr<UnitsSink> units)
      : server_(server), name_(std::move(name)), units_(std::move(units)), timer_(*this) {
    verdict_ = read_torch_peers_open(server_.request({{"op", "open"}, {"row", name_}}), name_);
    open_ = verdict_.passed;  // the script keeps only a case that passed: an incorrect one is never timed
  }

  ~TorchRowInstance() override {
    if (!open_) return;
    try {
      server_.request({{"op", "close"}, {"row", name_}});
    } catch (const std::exception&) {  // the script has ended: nothing left to close
    }
  }

  void run() override { ++queued_; }
  Verdict check() override { return verdict_; }

  // What the case counted (cg: iterations per solve), and its units per call, kept for finish().
  std::vector<std::pair<std::string, double>> observed() const override {
    if (!open_) return {};
    return read_torch_peers_counters(server_.request({{"op", "counters"}, {"row", name_}}), (*units_)[name_]);
  }

  SampleTimer* own_timer() override { return &timer_; }
  int process_id() const override { return server_.pid(); }

 private:
  class QueuedCallsTimer final : public SampleTimer {
   public:
    explicit QueuedCallsTimer(TorchRowInstance& row) : row_(row) {}
    void start() override { row_.queued_ = 0; }
    double stop() override {
      const int64_t calls = std::exchange(row_.queued_, 0);
      if (!row_.open_ || calls == 0) return 0;
      return read_torch_peers_time(row_.server_.request({{"op", "time"}, {"row", row_.name_}, {"calls", calls}}));
    }

   private:
    TorchRowInstance& row_;
  };

  TorchServer& server_;
  std::string name_;
  std::shared_ptr<UnitsSink> units_;
  QueuedCallsTimer timer_;
  Verdict verdict_;
  bool open_ = false;
  int64_t queued_ = 0;
};

// The row a PyTorch row stands beside: "cpu/fused" at its label -> adamw/cpu/fused/<label>.
std::string mirrored_name(const TorchBench& b) { return b.stage + "/" + b.mirrors + (b.label.empty() ? "" : "/" + b.label); }

}  // namespace

TorchRows::TorchRows(const TorchRun& run, const nlohmann::json& listing, const std::vector<Entry>& native)
    : per_unit_(std::make_shared<std::map<std::string, std::map<std::string, double>>>()) {
  benches_ = torch_benches(native, run.device);
  if (benches_.empty()) return;  // no PyTorch row stands beside this selection: nothing to start
  write_file_atomically(run.listing_path, listing.dump() + "\n");
  server_ = std::make_unique<TorchServer>(run.device, run.listing_path);
  std::map<std::string, const Entry*> by_name;
  for (const Entry& e : native) by_name[e.name] = &e;
  const Backend device = run.device == "cuda" ? Backend::cuda : Backend::cpu;
  for (const TorchBench& b : benches_) {
    const auto mirrored = by_name.find(mirrored_name(b));
    Work work;  // the mirrored row's, at its problem (no model: no rates rather than wrong ones)
    std::string provides_peak;
    if (mirrored != by_name.end()) {
      try {
        work = mirrored->second->variant->work(mirrored->second->problem);
      } catch (const std::exception&) {
      }
      provides_peak = mirrored->second->variant->provides_peak;
    }
    Stage stage;
    stage.name = b.stage;
    Variant variant;
    variant.id = b.variant;
    variant.backend = device;
    variant.rationale = b.rationale;
    for (const auto& [axis, value] : b.problem) variant.axes.push_back(axis);
    variant.work = [work](const Problem&) { return work; };
    variant.provides_peak = provides_peak;
    variant.make = [server = server_.get(), name = b.name, units = per_unit_](const Problem&, const RunContext&) {
      return std::make_unique<TorchRowInstance>(*server, name, units);
    };
    stage.variants.push_back(std::move(variant));
    stages_.push_back(std::move(stage));
    Entry e;
    e.stage = &stages_.back();
    e.variant = &stages_.back().variants.front();
    e.problem = Problem(b.problem);
    e.name = b.name;
    e.backend_name = run.device == "cuda" ? "torch_cuda" : "torch";
    if (mirrored != by_name.end()) e.measured_with.push_back(mirrored->first);
    // The other sides of its PyTorch pairs, at the same problem.
    for (const auto& [stage_name, pair] : torch_pairs()) {
      if (stage_name != b.stage || (pair.baseline != b.variant && pair.improved != b.variant)) continue;
      const std::string other = pair.baseline == b.variant ? pair.improved : pair.baseline;
      for (const TorchBench& o : benches_)
        if (o.stage == b.stage && o.variant == other && o.problem == b.problem) e.measured_with.push_back(o.name);
    }
    entries_.push_back(std::move(e));
  }
}

TorchRows::~TorchRows() = default;

void TorchRows::finish(Results& results) const {
  finish_torch_rows(results, benches_, *per_unit_, server_ ? server_->torch_context() : nlohmann::json::object());
}

void finish_torch_rows(Results& results, const std::vector<TorchBench>& benches,
                       const std::map<std::string, std::map<std::string, double>>& per_unit,
                       const nlohmann::json& torch_context) {
  const auto is_torch = [](const Row& r) { return r.backend == "torch" || r.backend == "torch_cuda"; };
  // "us_per_step": 64 steps a call -> the median call's time per step, in microseconds
  for (Row& r : results.rows) {
    const auto units = per_unit.find(r.name);
    if (!is_torch(r) || !r.timed() || units == per_unit.end()) continue;
    for (const auto& [key, per_call] : units->second)
      if (per_call > 0) r.counters.emplace_back(key, r.summary.median * 1e-3 / per_call);
  }
  std::map<std::string, const Row*> by_name;
  for (const Row& r : results.rows) by_name[r.name] = &r;
  // The PyTorch pairs, then each PyTorch row against the trainbench row it mirrors: the same judgement
  // (ratio, or withheld and why; from their rounds) as every declared pair.
  std::vector<const Row*> torch;
  for (const Row& r : results.rows)
    if (is_torch(r) && r.timed()) torch.push_back(&r);
  for (const auto& [stage, pair] : torch_pairs()) {
    for (const Row* improved : torch) {
      if (improved->stage != stage || improved->variant != pair.improved) continue;
      for (const Row* baseline : torch)
        if (baseline->stage == stage && baseline->variant == pair.baseline && baseline->problem == improved->problem) {
          judge_pair(pair, *baseline, *improved, results);
          break;
        }
    }
  }
  for (const TorchBench& b : benches) {
    const auto theirs = by_name.find(b.name), ours = by_name.find(mirrored_name(b));
    if (theirs == by_name.end() || ours == by_name.end() || !theirs->second->timed() || !ours->second->timed()) continue;
    const Row& t = *theirs->second;
    const Row& mine = *ours->second;
    judge_pair(Pair{t.name, mine.name, "PyTorch " + t.variant + " -> trainbench " + mine.backend + "/" + mine.variant}, t,
               mine, results);
  }
  if (!torch_context.empty()) results.context["torch"] = torch_context;
}

}  // namespace tb
