// Stage `allreduce`: the gradient all-reduce of data-parallel training (docs/sources.md#000-sem-v55's batch of 4096 and
// docs/sources.md#003-t4-transformer's 256 are trained on several GPUs as soon as they can be). The gradients of the adamw
// stage's parameter set, summed across ranks: one call per tensor (a hand-written loop of
// dist.all_reduce), DDP's buckets (bucket_cap_mb, 25 by default) or one flat buffer; a large flat
// all-reduce as the link's measured peak; and DDP's overlap, each bucket all-reduced as the backward
// produces it, against one all-reduce after the backward.
//
// Rates follow nccl-tests: the algorithm bandwidth (bytes / time) times 2(n-1)/n is the bus bandwidth,
// comparable with the link's own across rank counts. A single rank has no link: its all-reduce is a
// local copy (send -> receive buffer) and its rows are rated as that copy (read + write).
//
// Backends: the CPU through MPI (MPI_Allreduce, one process per rank under mpirun), CUDA through
// NCCL (one process per GPU under mpirun, NCCL's communicator bootstrapped over MPI; one GPU alone
// without it). Every rank runs the same calls in step: the harness agrees the timings (comm.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "adamw/param_set.h"
#include "runtime/comm.h"
#include "runtime/registry.h"
#include "runtime/tolerance.h"

namespace tb::allreduce {

using adamw::Dtype;
using adamw::ParamSet;

enum class Kind {
  per_tensor,  // one all-reduce per gradient tensor, in the order the backward produces them
  bucketed,    // DDP: buckets of bucket_mb in reverse model order, one all-reduce each
  flat,        // every gradient in one buffer, one all-reduce
  link,        // a large flat fp32 buffer: the link's peak
  serial,      // the synthetic backward, then the buckets' all-reduces
  overlap,     // each bucket all-reduced (another thread / stream) as soon as the backward produced it
};

// A bucket: a run of tensors adjacent in model order, so one contiguous range of the gradient
// arena (DDP's gradient_as_bucket_view: the all-reduce works on the gradients where they are).
struct Bucket {
  int64_t first_tensor = 0, last_tensor = 0;  // in model order, inclusive
  int64_t begin = 0, length = 0;              // arena elements
};

// One tensor of `elements`: the link variant's buffer.
ParamSet single_tensor(int64_t elements);

// DDP's assignment: tensors taken in reverse model order (the order the backward produces their
// gradients), a bucket closed once it holds at least cap_bytes. Zero-size tensors join their
// neighbours. The buckets come in the order they are all-reduced (the last layers' first).
std::vector<Bucket> make_buckets(const ParamSet& set, double element_bytes, double cap_bytes);
// The all-reduce calls one step makes, and the elements they carry (padding between tensors included).
std::vector<Bucket> calls_for(Kind kind, const ParamSet& set, double element_bytes, double cap_bytes);

// Rank r's gradient element i (of the concatenation): the adamw stage's deterministic contents with
// the seed moved by the rank, rounded to the dtype; the reference sum is their sum in double.
float rank_value(int rank, int64_t index, Dtype dtype);
double expected_sum(int ranks, int64_t index, Dtype dtype);
// fp32: the sum of n values in [-1, 1] rounded n-1 times; bf16: rounded to bf16 after each addition.
Tolerance sum_tolerance(Dtype dtype, int ranks);

// Compare the reduced gradients (the concatenation, widened to float) with the reference sum; every
// rank checks its own copy and all agree on the verdict.
Verdict check_sum(const std::vector<float>& got, int ranks, Dtype dtype);

// The synthetic backward: per gradient element 2 * tokens multiply-adds (4 FLOPs per parameter per
// token: a transformer's dX and dW GEMMs), with coefficients (1, 0) that only the run time knows, so
// the compiler keeps every FLOP and the gradient keeps its exact value.
inline int64_t backward_fmas(int64_t tokens) { return 2 * tokens; }

// Sustained time of the parts of serial / overlap, measured after the check (every rank in step):
// how much of the all-reduce the overlap hid, (backward + all-reduce - together) / all-reduce.
struct OverlapParts {
  bool overlapped = false;  // the variant overlaps: hidden_share is its counter
  double backward_s = 0, allreduce_s = 0, together_s = 0;
  double hidden_share() const { return allreduce_s > 0 ? (backward_s + allreduce_s - together_s) / allreduce_s : 0; }
  std::vector<std::pair<std::string, double>> counters() const;
};
// The medians of `rounds` interleaved rounds of the three parts (so that drift hits each alike);
// `seconds(part)` times one call of part 0 (the backward), 1 (the all-reduce) or 2 (both, as run()).
OverlapParts measure_overlap_parts(const std::function<double(int part)>& seconds, int rounds = 5);

// Bytes behind the GB/s of one call of `elements` elements: nccl-tests' bus bytes (2(n-1)/n of the
// buffer) with several ranks; the copy's read and write with one.
double rated_bytes(double buffer_bytes, int ranks);

// A problem as a variant reads it: the link's flat fp32 buffer, or the parameter set in its dtype;
// the bucket cap (the variants with buckets) and the backward's tokens (serial, overlap).
struct Setup {
  Dtype dtype = Dtype::fp32;
  ParamSet set;
  double cap_bytes = 0;
  int64_t tokens = 0;
};
Setup setup_for(const Problem& p, Kind kind);

// ---- variants ---------------------------------------------------------------------------------
std::unique_ptr<Instance> make_cpu(const Problem& problem, const RunContext& ctx, Kind kind);
std::unique_ptr<Instance> make_cuda(const Problem& problem, const RunContext& ctx, Kind kind);
// The training step's data parallelism: `count` floats summed in place across the ranks on `stream`,
// with the device's communicator (created on first use, bootstrapped over MPI under mpirun).
void cuda_allreduce_sum(float* data, int64_t count, void* stream, int device);
// Why the CUDA variants cannot run here ("" when NCCL loads), without starting anything.
std::string nccl_unavailable_reason();

}  // namespace tb::allreduce
