// Problem sizes and harness settings, in one place. Sizes come from the source reports
// (../shared/seeds, cited per constant); every one of them can be changed with --axis.
#pragma once

#include <cstdint>

namespace tb::defaults {

// ---- measuring -------------------------------------------------------------------------------
inline constexpr int repetitions = 10;         // samples per benchmark (one per repetition)
inline constexpr int quick_repetitions = 3;
inline constexpr double min_time_s = 0.2;      // per repetition
inline constexpr double quick_min_time_s = 0.05;
inline constexpr double noise_target = 0.05;   // CI half-width / median above this: "noisy"
inline constexpr double warmup_s = 0.02;       // warm-up before the first sample
inline constexpr int warmup_calls = 2;
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
inline constexpr int64_t cuda_gemm_n = 8192;   // large enough for tensor cores to reach their ceiling
inline constexpr int64_t quick_cuda_gemm_n = 4096;
inline constexpr int64_t cpu_gemm_n = 2048;
inline constexpr int64_t quick_cpu_gemm_n = 1024;
inline constexpr int gemm_checked_entries = 256;  // output entries checked against the double reference

// ---- spmv and cg (seeds/000: the SEM Cayley propagator) ------------------------------------------
// "Sparse Hamiltonian: 5-8 neighbors per dimension (laplacian_sparsity=8)": a k = 8 graph by default.
inline constexpr int laplacian_sparsity = 8;
// A = I + alpha L. Chosen so that a warm-started solve takes the report's "CG iterations: 3-5" (a cold
// one about 20); every alpha >= 0 keeps A symmetric positive definite.
inline constexpr double laplacian_alpha = 0.5;
// Rows: the report's operator is applied per hidden dimension; 1M rows is a matvec well past every
// L2, and 4M rows (about 0.5 GB of CSR) is past this machine's 300 MiB L3 and the bandwidth target's
// size. --quick keeps the CPU run to seconds.
inline constexpr int64_t spmv_rows = int64_t{1} << 20;
inline constexpr int64_t spmv_rows_large = int64_t{1} << 22;
inline constexpr int64_t quick_spmv_rows = int64_t{1} << 16;
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

}  // namespace tb::defaults
