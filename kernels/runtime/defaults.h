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

// ---- hostsync, launch, alloc: the runtime overheads of a training loop -------------------------
// hostsync: one call is N steps, and N is swept. seeds/003 reads `loss.item()` every step before its
// fix and every 500 steps after it; seeds/000 logs every 5; 50 lies between.
inline constexpr int64_t hostsync_intervals[] = {1, 5, 50, 500};
// The loss of a step is over one prediction per sample of seeds/000's 4096-sample batch: a few small
// kernels, each launch-bound, which is what makes a per-step sync visible.
inline constexpr int64_t hostsync_elements = 4096;
// async_pinned keeps this many steps' copies in flight; the host waits only when all are (a stall,
// counted). A loop of small kernels is rarely more than a step or two behind the host.
inline constexpr int hostsync_async_slots = 8;
// launch: the Trainer2 window of seeds/002: 64 steps x ~12 kernels per step ("10-15").
inline constexpr int64_t launch_window_steps = 64;
inline constexpr int64_t launch_kernels_per_step = 12;
// Elements each window kernel updates. seeds/002 gives no tensor sizes; 4096 floats is one wave of
// 16 blocks, so each kernel is launch-bound, as the report's per-step kernels are.
inline constexpr int64_t launch_elements = 4096;
// Repetitions of the self-timed eager / replay / capture comparison the `graph` variant reports.
inline constexpr int launch_breakeven_windows = 20;
inline constexpr int launch_breakeven_captures = 5;
// alloc: one buffer per kernel of a step (seeds/002: ~12 kernels per step), each activation-sized:
// a micro-batch of 128 (seeds/000) x 768-d embeddings (seeds/001) in fp32, and the 4096-sample
// global batch (seeds/000) of the same, which is past the allocator's small-block sizes.
inline constexpr int64_t alloc_buffers = 12;
inline constexpr int64_t alloc_buffer_bytes_small = int64_t{128} * 768 * 4;
inline constexpr int64_t alloc_buffer_bytes_large = int64_t{4096} * 768 * 4;
inline constexpr int64_t alloc_max_buffers = 64;  // buffers one consume kernel takes by value

}  // namespace tb::defaults
