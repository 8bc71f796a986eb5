// The torch rows of `benchsuite --backend cpu,torch` (or cuda,torch): each stage done the PyTorch way,
// run and timed by scripts/torch-peers on the problems this benchsuite lists and measured by the harness
// as its own rows are (in the rounds of the rows they are compared with), in the same results, with two
// kinds of pair: the PyTorch pair ("PyTorch for-loop AdamW -> PyTorch fused": what a user
// gains by changing their code) and the cross pair ("PyTorch fused -> trainbench fused": what is left
// on the table), so that one table says which ratio applies to whose code.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "results.h"
#include "runtime/python.h"  // torch_python, the scripts, require_torch

namespace tb {

// The constants of the stages' input generators and checks that a runner outside this binary needs to
// build the same inputs and hold them to the same tolerances (seeds, CG's window and tolerances, the
// AdamW hyper-parameters, ...), by name ("cg.seed_rhs"): `--list --format json` carries them, so that
// scripts/torch-peers takes them from the C++ headers that define them instead of keeping copies.
nlohmann::json generator_constants();

// One PyTorch row to measure: a PyTorch variant beside one selected row, at that row's problem.
struct TorchBench {
  std::string name;  // "adamw/torch/fused/params=10000000,tensors=200,dtype=fp32"
  std::string stage, variant, label;
  std::string mirrors;    // the backend/variant of the row it stands beside: "cpu/fused"
  std::string rationale;  // what the PyTorch code does
  // The row's problem, and on a CPU variant's problem what that variant implies without an axis for it
  // (attention's CPU variants run fp32; naive_mask_cached is causal).
  std::vector<std::pair<std::string, std::string>> problem;
};

// The PyTorch rows that stand beside `entries` (a run's selection) on `device` (cpu: rows `torch`,
// cuda: rows `torch_cuda`): each PyTorch variant that mirrors an entry's variant on that backend, at the
// entry's problem where the PyTorch variant runs it; in the order of the PyTorch variants, then of the
// entries. The GPU patterns (flash attention, CUDA graphs, the caching allocator, pinned copies) mirror
// no CPU variant.
std::vector<TorchBench> torch_benches(const std::vector<Entry>& entries, const std::string& device);
// The same as `--list --format json`'s "torch" section, what scripts/torch-peers measures.
nlohmann::json torch_benches_json(const std::vector<TorchBench>& benches, const std::string& device);

// Writes under `dir` what each PyTorch row of `listing` (a `--list --format json` document with its
// "torch" section) reads, drawn by the stages' own generators (the Laplacian in CSR, CG's right-hand
// sides, the parameter set's sizes, the epoch's order, hostsync's predictions and reference sums, the
// launch window), and adds to each row its "inputs" ({name: {file, dtype, shape}}, raw native-endian
// arrays) and to the section "inputs_dir". Rows at one problem share their files.
void attach_torch_inputs(nlohmann::json& listing, const std::string& dir);

// What benchsuite and scripts/torch-peers --serve say to each other: a JSON object a line each way.
inline constexpr const char* torch_serve_protocol = "trainbench-torch-serve/1";

// Its answers, as benchsuite reads them. Each throws std::runtime_error saying what is wrong for a line that is not a
// JSON object or an answer that is not what the protocol says there.
// One line: a JSON object, its keys in the script's order.
nlohmann::ordered_json parse_torch_peers_line(const std::string& line);
// An answer to a request: throws std::runtime_error with the script's words when it says "error".
void throw_torch_peers_error(const nlohmann::ordered_json& said);
// The hello: the protocol it speaks, and PyTorch's versions for the results' context (an object).
struct TorchPeersHello {
  std::string protocol;
  nlohmann::json torch = nlohmann::json::object();
};
TorchPeersHello read_torch_peers_hello(const nlohmann::ordered_json& said);
// "open" of `row`: its check's verdict (passed or incorrect); CannotRun (unsupported, with the reason) or
// std::runtime_error (failed, with the reason) when it was not opened.
Verdict read_torch_peers_open(const nlohmann::ordered_json& said, const std::string& row);
// "counters": what the case counted (numbers only, in the script's order) and its units per call into `per_unit`.
std::vector<std::pair<std::string, double>> read_torch_peers_counters(const nlohmann::ordered_json& said,
                                                                      std::map<std::string, double>& per_unit);
// "time": the seconds the queued calls took.
double read_torch_peers_time(const nlohmann::ordered_json& said);

struct TorchRun {
  std::string device = "cpu";  // cpu (rows `torch`) or cuda (rows `torch_cuda`)
  std::string listing_path;    // this run's `--list --format json` document, with its rows' inputs
};

class TorchServer;

// The PyTorch rows of one run, measured as benchsuite's own: each is an entry of the run whose calls one
// scripts/torch-peers --serve process makes and times (by its clock: CUDA events on a GPU), measured in
// rounds with the row it mirrors and with the other sides of its PyTorch pairs (Entry::measured_with),
// its samples watched and taken again as the harness takes its own. The script runs as long as this
// object lives; its stderr (each row's check) goes to ours.
class TorchRows {
 public:
  // Writes `listing` (this run's `--list --format json` document with its "torch" rows and their inputs)
  // to run.listing_path and starts the script on it; throws UsageError when the script rejects it (its
  // message is above) and std::runtime_error when it cannot be started. `native`: the run's entries,
  // which the PyTorch rows stand beside.
  TorchRows(const TorchRun& run, const nlohmann::json& listing, const std::vector<Entry>& native);
  ~TorchRows();
  TorchRows(const TorchRows&) = delete;
  TorchRows& operator=(const TorchRows&) = delete;

  // The PyTorch rows as entries, to run after (and with) `native`: each credited with the work of the
  // row it mirrors (its bytes, FLOPs, peak and the work model's counters, at the same problem).
  const std::vector<Entry>& entries() const { return entries_; }
  // After the run: see finish_torch_rows.
  void finish(Results& results) const;

 private:
  std::unique_ptr<TorchServer> server_;
  std::deque<Stage> stages_;  // each PyTorch row's stage and variant (entries_ point into them)
  std::vector<Entry> entries_;
  std::vector<TorchBench> benches_;
  // Filled by the rows' instances as they are read: units per call ("us_per_solve": 16 solves a call).
  std::shared_ptr<std::map<std::string, std::map<std::string, double>>> per_unit_;
};

// The PyTorch rows of `results` (backend torch or torch_cuda; summaries filled) finished: each row's time
// per unit (`per_unit`: row -> {"us_per_solve": solves per call}), the PyTorch pairs at each problem, and
// the cross pairs (each PyTorch row of `benches` against the row it mirrors), judged as every declared
// pair is (judge_pair: from the rounds where the two sides were measured together); and PyTorch's versions
// to the context (context.torch).
void finish_torch_rows(Results& results, const std::vector<TorchBench>& benches,
                       const std::map<std::string, std::map<std::string, double>>& per_unit,
                       const nlohmann::json& torch_context);

}  // namespace tb
