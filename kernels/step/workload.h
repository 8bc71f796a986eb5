// A training workload in the stages' terms: the model, an optional propagator, the optimizer, the
// data path, the batch and the logging policy, plus the switches the tuner may flip. Presets in
// tuner/workloads/*.yaml come from the source reports; users write their own files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tb::step {

struct ModelSpec {
  int64_t layers = 0, d_model = 0, heads = 0, seq_len = 0, vocab = 0, mlp_ratio = 4;
};

// A Cayley-style diffusion after every block (docs/sources.md#000-sem-v55): y = (I + alpha L)^-1 x for each token's
// hidden vector, L the Laplacian of a ring lattice over the d_model features with `sparsity`
// neighbours, solved by CG; backward by a second solve.
struct PropagatorSpec {
  bool enabled = false;
  int64_t sparsity = 8;
  double alpha = 0.1;
  double cg_tol = 1e-6;    // relative residual a solve stops at
  double lazy_tol = 1e-6;  // the lazy gate skips a solve when the cached solution's residual is below
  int64_t max_iters = 50;
};

struct OptimizerSpec {
  std::string variant = "fused";  // per_tensor | foreach | fused
  double lr = 3e-4, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;  // 0: no clipping
};

struct DataSpec {
  int64_t samples = 4096;                // sequences in the synthetic dataset
  std::string location = "host_pinned";  // host_pageable | host_pinned | device
  bool per_sample_copy = false;          // __getitem__ copies + stack, or one gather
};

struct BatchSpec {
  int64_t global = 0;                      // sequences per optimizer step
  int64_t micro = 0;                       // sequences per forward/backward; accumulation = global / micro
  int64_t global_min = 0, global_max = 0;  // the range a report says to try (0: only `global`)
  int64_t accumulation() const { return micro ? global / micro : 0; }
};

struct LoggingSpec {
  std::string sync = "every_n";  // every_step (loss.item() per step) | every_n | async
  int64_t interval = 1;
};

// Data-parallel training (autotune --ranks): the step runs on every rank with its share of the
// batch (batch.global is the rank's share: the global batch is global x ranks), and the summed
// gradients are all-reduced in buckets of bucket_mb (DDP's bucket_cap_mb) before the optimizer.
struct DistributedSpec {
  int64_t ranks = 1;
  double bucket_mb = 25;
};

struct Switches {
  bool fused_attention = true;  // `attention: fused | naive`: scaled_dot_product_attention, PyTorch's default
  bool cuda_graphs = false;
  bool activation_checkpointing = false;
  bool bf16_matmuls = false;
  bool lazy_cg = true;
};

struct Workload {
  std::string name;    // "small_gpt"
  std::string source;  // "docs/sources.md#004-small-gpt: ..."
  std::string path;    // the file it came from
  ModelSpec model;
  PropagatorSpec propagator;
  OptimizerSpec optimizer;
  DataSpec data;
  BatchSpec batch;
  LoggingSpec logging;
  Switches switches;
  DistributedSpec distributed;
  int64_t parameter_count() const;
};

// A preset name ("small_gpt") or a path to a YAML file. Throws UsageError "FILE:LINE:COL: what"
// for an unknown key, a wrong type or an impossible value; nothing runs on a bad file.
Workload load_workload(const std::string& name_or_path);
Workload parse_workload(const std::string& yaml_text, const std::string& path);
// Names of the presets found in the workloads folder.
std::vector<std::string> preset_names();
// The folder presets are read from: $TRAINBENCH_WORKLOADS, else ../share/trainbench/workloads beside
// the executable, else the source tree's tuner/workloads.
std::string workloads_dir();

}  // namespace tb::step
