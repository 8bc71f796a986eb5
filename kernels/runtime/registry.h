// The stage registry: every stage declares its axes (problem sizes), its variants and the pairs of
// variants whose ratio answers a report's claim. Benchmarks, tests and `benchsuite --list` are all
// generated from it, so a new variant is one launcher plus one registry entry.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tb {

class SampleTimer;  // runtime/timing.h

enum class Backend { cpu, cuda };
const char* to_string(Backend backend);
Backend backend_from_string(const std::string& name);  // throws UsageError

// One problem: a value for each axis the variant is swept over, e.g. {n=33554432}.
class Problem {
 public:
  Problem() = default;
  explicit Problem(std::vector<std::pair<std::string, std::string>> params) : params_(std::move(params)) {}

  void set(const std::string& key, const std::string& value);
  bool has(const std::string& key) const;
  const std::string& get(const std::string& key) const;  // throws std::out_of_range naming the key
  int64_t get_int(const std::string& key) const;         // accepts 1000, 1e6, 29.9e6 when integral
  double get_double(const std::string& key) const;
  const std::vector<std::pair<std::string, std::string>>& params() const { return params_; }
  std::string label() const;  // "n=33554432,dtype=fp32"; empty for a problem with no axes

 private:
  std::vector<std::pair<std::string, std::string>> params_;
};

// Parses a number the way axis values are written ("1e6", "29.9e6", "4096"); nullopt-like false
// return when the text is not a finite number.
bool parse_number(const std::string& text, double& value);

// text: any value `validate` accepts (e.g. an attention shape "4x16x4096x128").
enum class AxisKind { positive_int, number, choice, text };

struct Axis {
  std::string name;
  AxisKind kind = AxisKind::positive_int;
  std::vector<std::string> values;        // the defaults, from the reports
  std::vector<std::string> quick_values;  // for --quick; empty: same as values
  std::string help;
  std::vector<std::string> choices;                         // for AxisKind::choice
  std::function<std::string(const std::string&)> validate;  // for AxisKind::text: "" or why not

  // Empty when `value` is acceptable for this axis, else why not.
  std::string invalid_reason(const std::string& value) const;
};

// What one call moves and computes, for GB/s, TFLOP/s and % of the measured peak. Zero bytes and
// zero FLOPs say that the timed region moves and computes nothing (a view into data prepared
// outside it): its row then has no rate at all, not even one derived from a "_per_call" counter,
// and a pair divides by its time only with the cost it moved out of the loop (Pair::moved_out).
struct Work {
  enum class Bound { memory, compute };
  double bytes = 0;
  double flops = 0;
  Bound bound = Bound::memory;
  std::string peak_key;  // the `peak` row this work is compared with, e.g. "cuda.copy"
  // Per-call facts a row should show beside its rates, e.g. {"launches", 1200}.
  std::vector<std::pair<std::string, double>> counters;
  // The data one call touches (its working set), which decides whether back-to-back calls run from
  // a cache; 0: the same as `bytes`.
  double footprint_bytes = 0;

  bool moves_nothing() const { return bytes == 0 && flops == 0; }
};

// The outcome of checking one variant's output against the stage's reference.
struct Verdict {
  bool passed = false;
  double max_error = 0;  // worst |got - ref| (or the normalised error the stage defines)
  std::string detail;    // where and by how much, when it failed
};

// Handed to a variant when it is instantiated. The stream is a cudaStream_t, kept opaque so that
// CPU code never includes a CUDA header; CPU variants ignore it.
struct RunContext {
  int cuda_device = 0;
  void* cuda_stream = nullptr;
};

// One variant bound to one problem: owns its inputs, outputs and workspace (allocated in the
// constructor, never inside run()).
class Instance {
 public:
  virtual ~Instance() = default;
  // The measured work and nothing else. CUDA variants enqueue on the context's stream and return
  // without synchronising; the timer records events around the call.
  virtual void run() = 0;
  // After at least one run(): compare the output with the stage's reference. Synchronises.
  virtual Verdict check() = 0;
  // What the variant observed while it was timed (a skip rate, iterations per solve, the share of a
  // copy hidden behind compute). Read once after the last sample; added to the row's counters,
  // replacing a work-model counter of the same name. A row whose pair shows a model's prediction
  // (Pair::predicted_ns), measured in rounds with its pair's other side, is read after each sample
  // instead, so that the parts the model times are timed in the same rounds; it keeps the medians.
  virtual std::vector<std::pair<std::string, double>> observed() const { return {}; }
  // Which of the ways it searched the variant runs (a peak row's fastest kernel or cuBLASLt
  // algorithm), for the row and the peaks it sets; "" when it runs one way.
  virtual std::string configuration() const { return ""; }
  // A variant whose calls another process makes (a PyTorch row: benches/torch_rows.h) times them by
  // that process's clock: the timer its samples are taken with (its stop() has that process make the
  // calls run() queued since start(), and returns their seconds), and that process, whose CPU time is
  // the measurement and not a disturbance. Null and 0: the harness's own timer, this process alone.
  virtual SampleTimer* own_timer() { return nullptr; }
  virtual int process_id() const { return 0; }
};

// Thrown by a variant's factory that finds, once it has looked, that it cannot run this problem here
// (a PyTorch row whose backend refuses the shape): its row is unsupported, saying why, not failed.
class CannotRun : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using InstanceFactory = std::function<std::unique_ptr<Instance>(const Problem&, const RunContext&)>;

struct Variant {
  std::string id;  // "triad", "gemm_bf16", "fused"
  Backend backend = Backend::cpu;
  std::string rationale;          // one line: why this variant exists
  std::vector<std::string> axes;  // the stage axes this variant is swept over
  std::function<Work(const Problem&)> work;
  // Empty when the variant can run this problem on this machine, else why not (too large for the
  // memory, a dtype it does not have). Device availability is checked by the harness.
  std::function<std::string(const Problem&)> unsupported;
  InstanceFactory make;       // null when the backend was not built
  std::string provides_peak;  // for `peak` variants: the key other stages compare with
  // Its instances call a collective (an all-reduce across ranks) in run(), check() and observed():
  // under mpirun every rank runs it in step, with the timings that steer the harness agreed across
  // the ranks. Under mpirun, only such variants run.
  bool collective = false;
};

// A CUDA variant's factory: the launcher when the CUDA backend is built, else null, so that a
// CPU-only build still lists the variant (as "built without CUDA").
#ifdef TRAINBENCH_HAVE_CUDA
template <class F>
InstanceFactory cuda_factory(F&& make) {
  return InstanceFactory(std::forward<F>(make));
}
#else
// Without CUDA the launchers are not built, so the argument must not even be evaluated: a function
// taking `make_cuda_triad` keeps a reference to that undefined symbol unless inlined away, which -O0
// and UBSan's null check of the reference do not do (the CPU build failed to link).
#define cuda_factory(...) ::tb::InstanceFactory(nullptr)
#endif

// A cost the improved variant of a pair pays outside its timed region (a slab rebuilt once per
// epoch, then viewed batch by batch), named by the counters its row carries. The timed regions alone
// would compare one copy with no copy at all.
struct MovedOutCost {
  std::string what;         // "slab build"
  std::string ms_per_call;  // counter: the cost spread over the calls, in ms per call ("slab_build_ms_per_batch")
  std::string ms_each;      // counter: the cost each time it is paid, in ms ("slab_build_ms"); may be empty
  std::string paid_per;     // how often it is paid: "epoch"
  std::string call;         // what one call delivers: "batch"

  bool declared() const { return !ms_per_call.empty(); }
};

// baseline vs improved, both of one backend, compared at each problem they share.
struct Pair {
  std::string baseline;
  std::string improved;
  std::string label;  // "fused vs per_tensor"
  // Declared: the pair is reported amortised, baseline time per call / (improved time per call +
  // moved-out cost per call), and never as the ratio of the timed regions.
  MovedOutCost moved_out;
  // The improved row's counter with a model's prediction of its time per call, in ns (the lazy
  // gate's "predicted_ns"): the pair shows baseline time / prediction beside the measured ratio.
  std::string predicted_ns;
};

struct Stage {
  std::string name;      // "peak"
  std::string question;  // what it answers
  std::string source;    // which report(s), e.g. "all", "docs/sources.md#004-small-gpt"
  std::vector<Axis> axes;
  std::vector<Variant> variants;
  std::vector<Pair> pairs;

  const Axis* find_axis(const std::string& name) const;
  const Variant* find_variant(const std::string& id, Backend backend) const;
};

class Registry {
 public:
  void add(Stage stage);  // throws std::logic_error on a duplicate or an inconsistent declaration
  const std::vector<Stage>& stages() const { return stages_; }
  const Stage* find(const std::string& name) const;

 private:
  std::vector<Stage> stages_;
};

// All built-in stages (each kernels/<stage>/<stage>_registry.cpp contributes one).
const Registry& builtin_registry();

// Values given on the command line for "stage.axis", replacing the axis defaults.
struct AxisOverride {
  std::string stage;
  std::string axis;
  std::vector<std::string> values;    // each once, in the order typed
  std::vector<std::string> repeated;  // values typed again (the same text, or number: 5 and 5e0), dropped
};

// Parses "stage.axis=v1,v2" and checks it against the registry; throws UsageError with what exists.
// A value given twice is kept once (a row runs once per problem); the repeats are in `repeated`.
AxisOverride parse_axis_override(const Registry& registry, const std::string& text);

// The problems one variant is run at: the product of its axes' values (overridden, or quick).
std::vector<Problem> expand_problems(const Stage& stage, const Variant& variant, const std::vector<AxisOverride>& overrides,
                                     bool quick);

// "stage/backend/variant/label" (label omitted when the variant has no axes).
std::string benchmark_name(const Stage& stage, const Variant& variant, const Problem& problem);

}  // namespace tb
