// Problem sizes and harness settings, in one place. Sizes come from the source reports
// (docs/sources.md, cited per constant); every one of them can be changed with --axis.
#pragma once

#include <cstdint>

namespace tb::defaults {

// ---- measuring -------------------------------------------------------------------------------
inline constexpr int repetitions = 10;  // samples per benchmark (one per repetition)
// A CPU sample during which other processes (or the hypervisor's steal) used more than this share of
// all CPUs measured the contention: it is taken again, up to disturbed_retakes times, and a row that
// cannot get clean samples says "disturbed" and gets no ratio.
inline constexpr double disturbed_share = 0.25;
inline constexpr int disturbed_retakes = 3;
// A GPU sample during which the GPU spent more than this share of the time thermally throttled (NVML's
// violation counter), or with a hardware slowdown active, measured the cooling: taken again the same way.
inline constexpr double throttled_share = 0.02;
inline constexpr int quick_repetitions = 3;
inline constexpr double min_time_s = 0.2;  // per repetition
inline constexpr double quick_min_time_s = 0.05;
inline constexpr double noise_target = 0.05;  // CI half-width / median above this: "noisy"
inline constexpr double warmup_s = 0.02;      // warm-up before the first sample
inline constexpr int warmup_calls = 2;
inline constexpr double progress_every_s = 2.0;  // a row measuring longer says how far it is
// Below this a single call is launch-bound: time it in batches so one sample is at least this long
// (CUDA events resolve about 0.5 us; a batch of calls amortises that and the launch jitter).
inline constexpr double cuda_min_sample_s = 100e-6;
inline constexpr double cpu_min_sample_s = 20e-6;
inline constexpr int64_t max_batch = 1 << 16;

// ---- peak ------------------------------------------------------------------------------------
// STREAM rule: each array at least 4x the last-level cache (an H100's L2 is 50 MiB, a server L3 up
// to a few hundred MiB), so 256 MiB of doubles per array.
inline constexpr int64_t stream_elements = int64_t{1} << 25;
inline constexpr int64_t quick_stream_elements = int64_t{1} << 25;
inline constexpr int64_t transfer_bytes = int64_t{256} << 20;
inline constexpr int64_t quick_transfer_bytes = int64_t{64} << 20;
inline constexpr int64_t cuda_gemm_n = 8192;  // large enough for tensor cores to reach their ceiling
inline constexpr int64_t quick_cuda_gemm_n = 4096;
inline constexpr int64_t cpu_gemm_n = 2048;
inline constexpr int64_t quick_cpu_gemm_n = 1024;
inline constexpr int gemm_checked_entries = 256;  // output entries checked against the double reference

// ---- adamw, gradnorm -------------------------------------------------------------------------
// A parameter set shaped like a real model: 29.9M parameters, the SEM V5.5 model's count
// (docs/sources.md#000-sem-v55: "P = 29.9M parameters"; the small GPT of docs/sources.md#004-small-gpt spends 27.5% of its
// step in AdamW), in ~200 tensors (embeddings, per-layer attention and MLP weights, biases, norm scales).
inline constexpr int64_t adamw_params = 29'900'000;
// --quick: 10M parameters touch 160 MB (fp32) or 120 MB (bf16) per step, above twice the 50 MiB L2
// of an H100 or H200, so a quick row still measures DRAM. A CPU whose last-level cache holds a quick
// problem gets its rows marked "cache", with no % of the DRAM peak.
inline constexpr int64_t quick_adamw_params = 10'000'000;
// The norm reads only the gradients (4 B or 2 B each): quick runs the full 29.9M (120 MB in fp32).
inline constexpr int64_t quick_gradnorm_params = adamw_params;
inline constexpr int64_t adamw_tensors = 200;
inline constexpr int64_t quick_adamw_tensors = 200;

// ---- allreduce -------------------------------------------------------------------------------
// DDP's default bucket_cap_mb (torch.nn.parallel.DistributedDataParallel).
inline constexpr int64_t ddp_bucket_mb = 25;
// The synthetic backward the overlap hides the all-reduce behind: 4 FLOPs per parameter per token, 256
// tokens per rank (0.03 TFLOP at 29.9M parameters: about a millisecond on an H100's fp32 units, a
// second on two CPU cores), 16 with --quick.
inline constexpr int64_t allreduce_backward_tokens = 256;
inline constexpr int64_t quick_allreduce_backward_tokens = 16;
// The link's peak: a flat fp32 all-reduce large enough to saturate it (nccl-tests sweeps to GiBs).
inline constexpr int64_t allreduce_link_mb = 1024;
inline constexpr int64_t quick_allreduce_link_mb = 256;
// torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2.
inline constexpr double adamw_lr = 1e-3;
inline constexpr double adamw_beta1 = 0.9;
inline constexpr double adamw_beta2 = 0.999;
inline constexpr double adamw_eps = 1e-8;
inline constexpr double adamw_weight_decay = 1e-2;
// clip_grad_norm_(model.parameters(), max_norm=1.0) (docs/sources.md#003-t4-transformer, "Missing Gradient Clipping"); the
// clip factor is max_norm / (total_norm + 1e-6), clamped to 1, as torch.nn.utils computes it.
inline constexpr double clip_max_norm = 1.0;
inline constexpr double clip_norm_eps = 1e-6;

// ---- attention --------------------------------------------------------------------------------
// Shapes are batch x heads x seq x head_dim. The reports give batch sizes but not the model
// dimensions, so these are plausible choices, said as such:
//  - small GPT of docs/sources.md#004-small-gpt: batch 4 (its figure), 6 heads x 64 = 384-d, 256 tokens (assumed: the
//    usual configuration of a 4-block character-level GPT);
//  - T4 baseline transformer of docs/sources.md#003-t4-transformer: batch 32 (its figure), 8 heads x 64 = 512-d, 128 tokens
//    (assumed);
//  - the CPU comparison at seq 1024 of the attention issue: 1 x 8 x 1024 x 64;
//  - an LLM-size case: 4 x 16 x 4096 x 128 (2048-d, the FlashAttention-2 benchmark setting).
inline constexpr const char* attention_small_gpt = "4x6x256x64";
inline constexpr const char* attention_t4 = "32x8x128x64";
inline constexpr const char* attention_seq1024 = "1x8x1024x64";
inline constexpr const char* attention_llm = "4x16x4096x128";
// The cached causal mask is built once for this many positions and sliced (docs/sources.md#003-t4-transformer's
// register_buffer of max_seq_len x max_seq_len).
inline constexpr int64_t attention_mask_max_seq = 4096;
inline constexpr int attention_checked_rows = 48;  // rows checked against the double reference
inline constexpr int block_mlp_ratio = 4;
inline constexpr double layernorm_eps = 1e-5;

// ---- collate ---------------------------------------------------------------------------------
// docs/sources.md#001-energy-flow-bridge: a text-pair sample is two 768-d fp32 embeddings (input_embeddings,
// target_embeddings) plus its text, here a token sequence; the batch goes from 16 to 64. docs/sources.md#000-sem-v55:
// micro-batch 128, global batch 4096, 6 -> 12 loader workers and a shuffle buffer.
inline constexpr int64_t collate_embed_dim = 768;  // docs/sources.md#001-energy-flow-bridge
// Not in the reports: a sentence-length text of 128 int64 (torch.long) token ids, 1 KiB a sample.
inline constexpr int64_t collate_seq_len = 128;
inline constexpr int64_t collate_batch_before = 16;  // docs/sources.md#001-energy-flow-bridge, batch_size=16
inline constexpr int64_t collate_batch_after = 64;   // docs/sources.md#001-energy-flow-bridge, batch_size=64
// docs/sources.md#000-sem-v55's global batch: 28 MiB of text pairs, 4 MiB of token sequences, the ">= 4 MB" range
// in which a copy should reach the link's bandwidth.
inline constexpr int64_t collate_batch_large = 4096;
// Eight batches of 4096: 224 MiB of text pairs, more than an H100's 50 MiB L2 (docs/sources.md#001-energy-flow-bridge's
// whole 31 MB dataset would sit in it), so a resident gather reads HBM and a shuffled host gather DRAM.
// docs/sources.md#001-energy-flow-bridge's own 31 MB is about --axis collate.samples=4400.
inline constexpr int64_t collate_samples = 32768;
inline constexpr int64_t quick_collate_samples = 8192;
// The training step's compute per batch for the overlap case: longer than the 28 MiB copy at PCIe 5
// rates (about 0.6 ms), so a prefetch can hide all of it. 0: no compute, the data path alone.
inline constexpr int64_t collate_compute_us = 1000;
// Host-side collates of at least this many bytes are spread over the OpenMP team (the loader's
// workers, docs/sources.md#000-sem-v55); smaller ones stay on one thread, where a fork/join would cost more.
inline constexpr int64_t collate_parallel_min_bytes = int64_t{1} << 20;
inline constexpr uint64_t collate_shuffle_seed = 5;  // the epoch permutation's seed

// ---- hostsync, launch, alloc: the runtime overheads of a training loop -------------------------
// hostsync: one call is N steps, and N is swept. docs/sources.md#003-t4-transformer reads `loss.item()` every step before
// its fix and every 500 steps after it; docs/sources.md#000-sem-v55 logs every 5; 50 lies between.
inline constexpr int64_t hostsync_intervals[] = {1, 5, 50, 500};
// The loss of a step is over one prediction per sample of docs/sources.md#000-sem-v55's 4096-sample batch: a few small
// kernels, each launch-bound, which is what makes a per-step sync visible.
inline constexpr int64_t hostsync_elements = 4096;
// async_pinned keeps this many steps' copies in flight; the host waits only when all are (a stall,
// counted). A loop of small kernels is rarely more than a step or two behind the host.
inline constexpr int hostsync_async_slots = 8;
// launch: the Trainer2 window of docs/sources.md#002-trainer2: 64 steps x ~12 kernels per step ("10-15").
inline constexpr int64_t launch_window_steps = 64;
inline constexpr int64_t launch_kernels_per_step = 12;
// Elements each window kernel updates. docs/sources.md#002-trainer2 gives no tensor sizes; 4096 floats is one wave of
// 16 blocks, so each kernel is launch-bound, as the report's per-step kernels are.
inline constexpr int64_t launch_elements = 4096;
// Repetitions of the self-timed eager / replay / capture comparison the `graph` variant reports.
inline constexpr int launch_breakeven_windows = 20;
inline constexpr int launch_breakeven_captures = 5;
// alloc: one buffer per kernel of a step (docs/sources.md#002-trainer2: ~12 kernels per step), each activation-sized:
// a micro-batch of 128 (docs/sources.md#000-sem-v55) x 768-d embeddings (docs/sources.md#001-energy-flow-bridge) in fp32,
// and the 4096-sample global batch (docs/sources.md#000-sem-v55) of the same, which is past the allocator's small-block
// sizes.
inline constexpr int64_t alloc_buffers = 12;
inline constexpr int64_t alloc_buffer_bytes_small = int64_t{128} * 768 * 4;
inline constexpr int64_t alloc_buffer_bytes_large = int64_t{4096} * 768 * 4;
inline constexpr int64_t alloc_max_buffers = 64;  // buffers one consume kernel takes by value

// ---- spmv and cg (docs/sources.md#000-sem-v55: the SEM Cayley propagator) ------------------------------------------
// "Sparse Hamiltonian: 5-8 neighbors per dimension (laplacian_sparsity=8)": a k = 8 graph by default.
inline constexpr int laplacian_sparsity = 8;
// A = I + alpha L. Chosen so that a warm-started solve takes the report's "CG iterations: 3-5" (a cold
// one about 20); every alpha >= 0 keeps A symmetric positive definite.
inline constexpr double laplacian_alpha = 0.5;
// Rows: the report's operator is applied per hidden dimension; 1M rows is a matvec well past every
// L2, and 4M rows (about 0.5 GB of CSR) is past the largest server L3s and the bandwidth target's
// size.
inline constexpr int64_t spmv_rows = int64_t{1} << 20;
inline constexpr int64_t spmv_rows_large = int64_t{1} << 22;
// --quick: 1M rows (121 MB of CSR and vectors) is still above twice a 50 MiB GPU L2.
inline constexpr int64_t quick_spmv_rows = int64_t{1} << 20;
// Right-hand sides of the SpMM variants (the propagator applies the operator to every token's
// hidden vector): with 32 the dense blocks outweigh the matrix, as a token batch does, and 4M rows
// still fit in memory (1 GiB per block).
inline constexpr int64_t spmm_rhs = 32;
inline constexpr int64_t quick_spmm_rhs = 8;
// "lazy_cg_tol: 1e-6 (config.py, line 44)": the gate skips the solve below this relative residual.
inline constexpr double lazy_cg_tol = 1e-6;
// The solve itself stops at a tenth of the gate's tolerance, so a freshly solved cache passes the gate
// with margin and what decides a skip is the drift, not where CG happened to stop. (The report gives
// no CG tolerance of its own.)
inline constexpr double cg_tol = 1e-7;
inline constexpr int cg_max_iterations = 1000;
// Solves per timed call: one window of a drifting right-hand side, replayed from the same cache each
// call so every call does the same work.
inline constexpr int cg_window = 16;
// The gate's prediction times its parts over this many replayed windows (the median of each).
inline constexpr int cg_prediction_replays = 3;
// Device-resident CG (CUDA graph) reads the convergence flag after every this many iterations.
inline constexpr int cg_check_every = 8;
// 64k rows: where the device-resident vs host-checked target is set; 256k keeps a CPU window under
// about a second.
inline constexpr int64_t cg_rows = int64_t{1} << 16;
inline constexpr int64_t cg_rows_large = int64_t{1} << 18;
inline constexpr int64_t quick_cg_rows = int64_t{1} << 16;
// Drift of the right-hand side per solve, relative to its norm (each step draws 0.5x..1.5x of it).
// With the gate at 1e-6 these give about 0%, 40% and 75% skips (the rows measure it).
inline constexpr const char* cg_drifts[] = {"2e-6", "1e-6", "5e-7"};

// The cg stage's rows_* variants: the propagator as the step runs it, at sem_v55's size
// (tuner/workloads/sem_v55.yaml): micro-batch 128 x seq_len 256 tokens of d_model 384; --quick: 16
// sequences of 256 tokens of the same width.
inline constexpr const char* cg_rows_shape = "32768x384";
inline constexpr const char* quick_cg_rows_shape = "4096x384";
// sem_v55's propagator section: sparsity 8, alpha 0.1, cg_tol 1e-6, lazy_tol 1e-6, max_iters 50.
inline constexpr int64_t cg_rows_neighbours = 8;
inline constexpr double cg_rows_alpha = 0.1;
inline constexpr double cg_rows_tol = 1e-6;
inline constexpr double cg_rows_lazy_tol = 1e-6;
inline constexpr int64_t cg_rows_max_iterations = 50;
inline constexpr uint64_t cg_rows_seed_rhs = 43;

}  // namespace tb::defaults
