// autotune --ranks N: data-parallel tuning. Each trial is the step on N ranks (mpirun -n N autotune
// --trial), the global batch split as micro-batch x accumulation x N, DDP's bucket size a switch.
// The search works on one rank's share of the global batch; the output speaks of the whole.
//
// --predict: N past the ranks at hand. A model of the data-parallel step,
//   step(N) = compute(share of G / N on one rank) + allreduce(N),
//   allreduce(N) = allreduce(R) x [2(N-1)/N] / [2(R-1)/R]   (a ring's bus traffic at the same bus bandwidth),
// from trials of the share on R independent ranks here (each rank a step of its own without the
// all-reduce, so that the compute is measured with the machine as loaded as R ranks load it; the
// slowest rank's time), the search's best micro-batch and accumulation being the prediction's (the
// all-reduce runs once per step whatever the accumulation), and the gradients' all-reduce measured on
// R ranks (mpirun -n R autotune --allreduce-probe). Where N <= R, the predicted configuration also
// runs as a real N-rank step and the prediction's error is measured.
//
// An entry (--entry ... --ranks N --predict) is predicted by the same model: its share is tuned in one process
// (one PyTorch worker, so DDP's switches are not searched), and the all-reduce is torch.distributed's own (gloo
// on the CPU, NCCL on GPUs) on R ranks under torchrun (torch-step --allreduce-probe); the check run where
// N <= R is the entry's worker on N ranks, DDP with no_sync on where the prediction accumulates.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "step/workload.h"

namespace tb::tune {

// The launcher's words ("mpirun --hostfile h" -> {"/usr/bin/mpirun", "--hostfile", "h"}), the program
// found on PATH. Throws UsageError when it is not there.
std::vector<std::string> launcher_argv(const std::string& text);

// Why `--ranks ranks` cannot run here (exit 2), or "": MPI (and NCCL on a GPU) must load, the
// launcher must exist, autotune must not itself run under mpirun, GPUs must be at hand unless
// predicting.
std::string ranks_unavailable_reason(int64_t ranks, bool cuda, bool predict, const std::string& launcher);

// Open MPI refuses to start ranks as root unless told: a container's usual user. Sets its two
// variables for the trials when autotune runs as root.
void allow_mpirun_as_root();

// The child: all-reduces `elements` floats in buckets of `bucket_mb` (from the end, as the step does)
// on every rank of the world, `repeats` times after two warm-up calls; rank 0 prints
// {"seconds": the median (the slowest rank's), "ranks": n, "library": MPI's}.
int run_allreduce_probe_here(const nlohmann::json& request);

struct AllreduceProbe {
  int64_t ranks = 0;
  double seconds = 0;
  std::string library;
  std::string torch;  // the version that measured it, for torch.distributed's ("" for MPI's)
};
// A probe's answer as the parent reads it: the last JSON object the probe's standard output holds (rank 0's
// {"seconds", "ranks", "library"[, "torch"]}). CallError naming `what` when there is none or it is not such an answer.
AllreduceProbe read_allreduce_probe_answer(const std::string& out, const std::string& what);
// The parent: the probe under the launcher on `ranks` ranks. Throws CallError when it fails.
AllreduceProbe probe_allreduce(const std::vector<std::string>& launcher, const std::string& self_exe, int64_t ranks,
                               int64_t elements, double bucket_mb, const std::atomic<bool>* stop);

// An entry's all-reduce (`--entry --ranks N --predict`): `elements` fp32 gradients in DDP's buckets of
// `bucket_mb` all-reduced by torch.distributed on `ranks` ranks of `python -m torch.distributed.run --standalone`
// running `script --allreduce-probe` (scripts/trainbench/pytorch/allreduce_probe.py), NCCL where `cuda`, else
// gloo; stopped after `timeout_s` or at `stop`. Throws CallError when it fails.
AllreduceProbe probe_torch_allreduce(const std::string& python, const std::string& script, int64_t ranks,
                                     int64_t elements, double bucket_mb, bool cuda, double timeout_s,
                                     const std::atomic<bool>* stop);

struct RanksPrediction {
  int64_t ranks = 0;                  // N
  int64_t global_batch = 0;           // G, every rank's share together
  double step_compute_s = 0;          // one rank's share, measured on R independent ranks
  AllreduceProbe probe;               // the all-reduce measured at R ranks
  double allreduce_s = 0;             // predicted at N ranks
  double samples_per_s = 0;           // predicted
  double measured_samples_per_s = 0;  // where N <= R: the same configuration run on N ranks (0: not run)
  bool share_in_one_process = false;  // an entry's share: tuned in one process, not on R independent ranks
  double error() const { return measured_samples_per_s > 0 ? samples_per_s / measured_samples_per_s - 1 : 0; }
};
// The model above: `share_samples_per_s` is the trial of G / N samples per step on independent ranks.
RanksPrediction predict_ranks(int64_t ranks, int64_t global_batch, double share_samples_per_s, const AllreduceProbe& probe);
nlohmann::json to_json(const RanksPrediction& p);

}  // namespace tb::tune
