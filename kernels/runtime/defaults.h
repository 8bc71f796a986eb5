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

}  // namespace tb::defaults
