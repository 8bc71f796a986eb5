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

// ---- collate ---------------------------------------------------------------------------------
// seeds/001: a text-pair sample is two 768-d fp32 embeddings (input_embeddings, target_embeddings)
// plus its text, here a token sequence; the batch goes from 16 to 64. seeds/000: micro-batch 128,
// global batch 4096, 6 -> 12 loader workers and a shuffle buffer.
inline constexpr int64_t collate_embed_dim = 768;       // seeds/001
// Not in the reports: a sentence-length text of 128 int64 (torch.long) token ids, 1 KiB a sample.
inline constexpr int64_t collate_seq_len = 128;
inline constexpr int64_t collate_batch_before = 16;     // seeds/001, batch_size=16
inline constexpr int64_t collate_batch_after = 64;      // seeds/001, batch_size=64
// seeds/000's global batch: 28 MiB of text pairs, 4 MiB of token sequences, the ">= 4 MB" range
// in which a copy should reach the link's bandwidth.
inline constexpr int64_t collate_batch_large = 4096;
// Eight batches of 4096: 224 MiB of text pairs, more than an H100's 50 MiB L2 (seeds/001's whole
// 31 MB dataset would sit in it), so a resident gather reads HBM and a shuffled host gather DRAM.
// seeds/001's own 31 MB is about --axis collate.samples=4400.
inline constexpr int64_t collate_samples = 32768;
inline constexpr int64_t quick_collate_samples = 8192;
// The training step's compute per batch for the overlap case: longer than the 28 MiB copy at PCIe 5
// rates (about 0.6 ms), so a prefetch can hide all of it. 0: no compute, the data path alone.
inline constexpr int64_t collate_compute_us = 1000;
// Host-side collates of at least this many bytes are spread over the OpenMP team (the loader's
// workers, seeds/000); smaller ones stay on one thread, where a fork/join would cost more.
inline constexpr int64_t collate_parallel_min_bytes = int64_t{1} << 20;
inline constexpr uint64_t collate_shuffle_seed = 5;     // the epoch permutation's seed

}  // namespace tb::defaults
