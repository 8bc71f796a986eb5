// Stage `attention`. Shapes and their sources in runtime/defaults.h.
#include "attention.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"

namespace tb {

namespace {

using namespace attention;

Shape shape_of(const Problem& p, const char* axis) { return parse_shape(p.get(axis)); }
bool causal_of(const Problem& p) { return !p.has("causal") || p.get("causal") == "causal"; }
DType dtype_of(const Problem& p) { return p.has("dtype") && p.get("dtype") == "bf16" ? DType::bf16 : DType::fp32; }
double element_bytes(DType t) { return t == DType::bf16 ? 2.0 : 4.0; }

double scores_bytes(const Shape& s) {
  return 4.0 * static_cast<double>(s.batch * s.heads) * static_cast<double>(s.seq) * static_cast<double>(s.seq);
}

// FLOPs of the two attention products (halved when causal: the masked half is not useful work, as
// FlashAttention counts it) and the minimal traffic: Q, K, V read once, O written once.
Work attention_work(const Problem& p, const char* axis, Backend backend, bool naive) {
  const Shape s = shape_of(p, axis);
  const DType t = dtype_of(p);
  Work w;
  w.flops = attention_flops(s, causal_of(p));
  w.bytes = 4.0 * static_cast<double>(s.elements()) * element_bytes(t);
  w.bound = Work::Bound::compute;
  w.peak_key = backend == Backend::cpu ? "cpu.gemm_fp32" : (t == DType::bf16 ? "cuda.gemm_bf16" : "cuda.gemm_fp32");
  w.counters = {{"scores_mib", naive ? scores_bytes(s) / (1 << 20) : 0.0}};
  return w;
}

Work block_work(const Problem& p, Backend backend) {
  const Shape s = shape_of(p, "block_shape");
  const double tokens = static_cast<double>(s.batch * s.seq), d = static_cast<double>(s.d_model());
  const double linear_flops = 2.0 * tokens * (d * 3 * d + d * d + 2 * d * defaults::block_mlp_ratio * d);
  Work w;
  w.flops = linear_flops + attention_flops(s, true);
  w.bytes = 4.0 * (12 * d * d + 2 * tokens * d);  // weights and the block's input and output
  w.bound = Work::Bound::compute;
  w.peak_key = backend == Backend::cpu ? "cpu.gemm_fp32" : "cuda.gemm_fp32";
  return w;
}

double tensors_bytes(const Shape& s, DType t) { return 4.0 * static_cast<double>(s.elements()) * element_bytes(t); }

// The backward's four products (dV, dP, dQ, dK), twice the forward's; fused recomputes the scores on
// top, which is overhead, not work. Traffic: Q, K, V, O, dO read, dQ, dK, dV written.
// bf16 (CUDA): the operands in bf16, the gradients written in fp32.
Work backward_work(const Problem& p, const char* axis, Backend backend, bool naive) {
  const Shape s = shape_of(p, axis);
  const DType t = dtype_of(p);
  Work w;
  w.flops = 2 * attention_flops(s, causal_of(p));
  w.bytes = (5.0 * element_bytes(t) + 3.0 * 4.0) * static_cast<double>(s.elements());
  w.bound = Work::Bound::compute;
  w.peak_key = backend == Backend::cpu ? "cpu.gemm_fp32" : (t == DType::bf16 ? "cuda.gemm_bf16" : "cuda.gemm_fp32");
  w.counters = {{"scores_mib", naive ? 2 * scores_bytes(s) / (1 << 20) : 0.0}};
  return w;
}

std::string backward_reason(const Problem& p, const char* axis, Backend b, bool naive) {
  const Shape s = shape_of(p, axis);
  if (b == Backend::cuda && !naive && dtype_of(p) == DType::bf16) {
    if (std::string why = cuda_bf16_reason(s); !why.empty()) return why;
    if (std::string why = device_capability_reason(8, 0, "the bf16 tensor-core backward (mma.sync)"); !why.empty())
      return why;
  } else if (b == Backend::cuda && !naive && s.head_dim > 128) {
    return "the fused backward keeps head_dim <= 128 per row";
  }
  const double bytes = 9.0 * 4.0 * static_cast<double>(s.elements()) + (naive ? 2 * scores_bytes(s) : 0.0);
  return b == Backend::cpu ? host_memory_reason(bytes) : device_memory_reason(bytes);
}

std::string naive_reason(const Problem& p, const char* axis, Backend b) {
  const Shape s = shape_of(p, axis);
  const DType t = dtype_of(p);
  const double bytes = tensors_bytes(s, t) + scores_bytes(s) * (t == DType::bf16 ? 1.5 : 1.0);
  return b == Backend::cpu ? host_memory_reason(bytes) : device_memory_reason(bytes);
}

std::string fused_reason(const Problem& p, const char* axis, Backend b) {
  const Shape s = shape_of(p, axis);
  const DType t = dtype_of(p);
  if (b == Backend::cuda && t == DType::bf16)
    if (std::string why = cuda_bf16_reason(s); !why.empty()) return why;
  if (b == Backend::cuda && s.head_dim > 256) return "the fp32 kernel keeps head_dim/32 <= 8 columns per lane";
  if (b == Backend::cuda) {
    // One block per (batch x head, query tile) in grid.x, whose limit is 2^31 - 1.
    const int64_t rows_per_block = t == DType::bf16 ? fused_bf16_query_rows : fused_fp32_query_rows;
    const int64_t blocks = (s.seq + rows_per_block - 1) / rows_per_block * s.batch * s.heads;
    if (blocks > int64_t{0x7fffffff})
      return "batch x heads x query tiles = " + std::to_string(blocks) + " blocks, above the grid's 2^31 - 1";
    if (t == DType::bf16)
      if (std::string why = device_capability_reason(8, 0, "the bf16 tensor-core kernel (mma.sync)"); !why.empty())
        return why;
  }
  return b == Backend::cpu ? host_memory_reason(tensors_bytes(s, t)) : device_memory_reason(tensors_bytes(s, t));
}

std::string block_reason(const Problem& p, Backend b, bool naive) {
  const Shape s = shape_of(p, "block_shape");
  const double tokens = static_cast<double>(s.batch * s.seq), d = static_cast<double>(s.d_model());
  const double bytes = 4.0 * (12 * d * d + tokens * d * 16) + (naive ? scores_bytes(s) : 0.0);
  if (b == Backend::cuda && !naive && s.head_dim > 256) return "the fp32 kernel keeps head_dim/32 <= 8 columns per lane";
  return b == Backend::cpu ? host_memory_reason(bytes) : device_memory_reason(bytes);
}

Axis shape_axis(const char* name, std::vector<std::string> values, std::vector<std::string> quick, const char* help) {
  return Axis{name, AxisKind::text, std::move(values), std::move(quick), help, {}, shape_invalid_reason};
}

}  // namespace

void register_stage_attention(Registry& registry) {
  Stage s;
  s.name = "attention";
  s.question = "attention's share of the block, and what fusing and caching the mask buy";
  s.source =
      "docs/sources.md#004-small-gpt (attention 85% of the block), docs/sources.md#003-t4-transformer (causal mask rebuilt "
      "every forward)";
  s.axes = {
      shape_axis("cpu_shape", {defaults::attention_small_gpt, defaults::attention_t4, defaults::attention_seq1024},
                 {defaults::attention_small_gpt, defaults::attention_seq1024}, "BATCHxHEADSxSEQxHEAD_DIM for CPU variants"),
      shape_axis("shape", {defaults::attention_small_gpt, defaults::attention_t4, defaults::attention_llm},
                 {defaults::attention_small_gpt, defaults::attention_llm}, "BATCHxHEADSxSEQxHEAD_DIM for CUDA variants"),
      shape_axis("block_shape", {defaults::attention_small_gpt, defaults::attention_t4}, {defaults::attention_small_gpt},
                 "BATCHxHEADSxSEQxHEAD_DIM of the transformer block (d_model = HEADS x HEAD_DIM)"),
      Axis{"causal", AxisKind::choice, {"causal", "full"}, {"causal"}, "causal mask or full attention", {"causal", "full"}},
      Axis{"dtype", AxisKind::choice, {"fp32", "bf16"}, {}, "CUDA element type (fp32 accumulation)", {"fp32", "bf16"}},
  };

  auto cpu_naive = [](Mask mask) {
    return
        [mask](const Problem& p, const RunContext&) { return make_cpu_naive(shape_of(p, "cpu_shape"), causal_of(p), mask); };
  };
  auto cuda_naive = []([[maybe_unused]] Mask mask) {  // unused without CUDA: cuda_factory drops its argument
    return cuda_factory([mask](const Problem& p, const RunContext& c) {
      return make_cuda_naive(shape_of(p, "shape"), causal_of(p), mask, dtype_of(p), c);
    });
  };
  auto work = [](const char* axis, Backend b, bool naive) {
    return [axis, b, naive](const Problem& p) { return attention_work(p, axis, b, naive); };
  };
  auto naive_unsupported = [](const char* axis, Backend b) {
    return [axis, b](const Problem& p) { return naive_reason(p, axis, b); };
  };
  auto fused_unsupported = [](const char* axis, Backend b) {
    return [axis, b](const Problem& p) { return fused_reason(p, axis, b); };
  };
  const Backend cpu = Backend::cpu, gpu = Backend::cuda;

  s.variants = {
      Variant{"naive",
              cpu,
              "PyTorch eager: scores [B,H,S,S] by BLAS, causal applied in the softmax, BLAS P V",
              {"cpu_shape", "causal"},
              work("cpu_shape", cpu, true),
              naive_unsupported("cpu_shape", cpu),
              cpu_naive(Mask::implicit)},
      Variant{"naive_mask_cached",
              cpu,
              "causal mask built once at max length and sliced (register_buffer)",
              {"cpu_shape"},
              work("cpu_shape", cpu, true),
              naive_unsupported("cpu_shape", cpu),
              cpu_naive(Mask::cached)},
      Variant{"naive_mask_rebuilt",
              cpu,
              "causal mask allocated and filled on every forward (docs/sources.md#003-t4-transformer)",
              {"cpu_shape"},
              work("cpu_shape", cpu, true),
              naive_unsupported("cpu_shape", cpu),
              cpu_naive(Mask::rebuilt)},
      Variant{"fused",
              cpu,
              "blocked online softmax, 64 queries x 64 keys, AVX-512/AVX2 micro-kernels (BLAS tiles elsewhere): scores "
              "never [S,S], causal key blocks past the queries skipped",
              {"cpu_shape", "causal"},
              work("cpu_shape", cpu, false),
              fused_unsupported("cpu_shape", cpu),
              [](const Problem& p, const RunContext&) { return make_cpu_fused(shape_of(p, "cpu_shape"), causal_of(p)); }},
      Variant{"block_naive",
              cpu,
              "the whole block (ln, QKV, attention, out-proj, ln, GELU MLP) with naive attention",
              {"block_shape"},
              [](const Problem& p) { return block_work(p, Backend::cpu); },
              [](const Problem& p) { return block_reason(p, Backend::cpu, true); },
              [](const Problem& p, const RunContext&) { return make_cpu_block(shape_of(p, "block_shape"), false); }},
      Variant{"block_fused",
              cpu,
              "the same block with fused attention",
              {"block_shape"},
              [](const Problem& p) { return block_work(p, Backend::cpu); },
              [](const Problem& p) { return block_reason(p, Backend::cpu, false); },
              [](const Problem& p, const RunContext&) { return make_cpu_block(shape_of(p, "block_shape"), true); }},

      Variant{"naive",
              gpu,
              "cuBLAS strided-batched QK^T, softmax kernel with implicit causal, cuBLAS P V",
              {"shape", "causal", "dtype"},
              work("shape", gpu, true),
              naive_unsupported("shape", gpu),
              cuda_naive(Mask::implicit)},
      Variant{"naive_mask_cached",
              gpu,
              "cached causal mask, sliced: one masked_fill pass per forward",
              {"shape", "dtype"},
              work("shape", gpu, true),
              naive_unsupported("shape", gpu),
              cuda_naive(Mask::cached)},
      Variant{"naive_mask_rebuilt",
              gpu,
              "mask allocated, filled and applied on every forward (docs/sources.md#003-t4-transformer)",
              {"shape", "dtype"},
              work("shape", gpu, true),
              naive_unsupported("shape", gpu),
              cuda_naive(Mask::rebuilt)},
      Variant{"fused",
              gpu,
              "fp32: warp per row on CUDA cores; bf16: FlashAttention-2 tiles on tensor cores",
              {"shape", "causal", "dtype"},
              work("shape", gpu, false),
              fused_unsupported("shape", gpu),
              cuda_factory([](const Problem& p, const RunContext& c) {
                return make_cuda_fused(shape_of(p, "shape"), causal_of(p), dtype_of(p), c);
              })},
      Variant{"block_naive",
              gpu,
              "the whole block on the GPU (cuBLAS fp32 GEMMs) with naive attention",
              {"block_shape"},
              [](const Problem& p) { return block_work(p, Backend::cuda); },
              [](const Problem& p) { return block_reason(p, Backend::cuda, true); },
              cuda_factory([](const Problem& p, const RunContext& c) {
                return make_cuda_block(shape_of(p, "block_shape"), false, c);
              })},
      Variant{"block_fused",
              gpu,
              "the same block with fused fp32 attention",
              {"block_shape"},
              [](const Problem& p) { return block_work(p, Backend::cuda); },
              [](const Problem& p) { return block_reason(p, Backend::cuda, false); },
              cuda_factory([](const Problem& p, const RunContext& c) {
                return make_cuda_block(shape_of(p, "block_shape"), true, c);
              })},
  };
  auto cpu_backward = [](bool fused) {
    return Variant{fused ? "backward_fused" : "backward_naive",
                   Backend::cpu,
                   fused ? "FlashAttention-2 backward: P recomputed per 64 x 64 block from the saved log-sum-exp, the "
                           "forward's micro-kernels, a head per thread"
                         : "autograd's backward from the saved probabilities [B,H,S,S], dP materialised",
                   {"cpu_shape", "causal"},
                   [fused](const Problem& p) { return backward_work(p, "cpu_shape", Backend::cpu, !fused); },
                   [fused](const Problem& p) { return backward_reason(p, "cpu_shape", Backend::cpu, !fused); },
                   [fused](const Problem& p, const RunContext&) {
                     return make_cpu_backward(shape_of(p, "cpu_shape"), causal_of(p), fused);
                   }};
  };
  auto cuda_backward = [](bool fused) {
    return Variant{fused ? "backward_fused" : "backward_naive",
                   Backend::cuda,
                   fused ? "FlashAttention-2 backward from the saved log-sum-exp: fp32 on CUDA cores; bf16 on tensor "
                           "cores (dK, dV per key tile, dQ by atomics)"
                         : "autograd's backward from the saved probabilities: cuBLAS products (bf16: on tensor cores), "
                           "softmax backward kernel",
                   {"shape", "dtype"},
                   [fused](const Problem& p) { return backward_work(p, "shape", Backend::cuda, !fused); },
                   [fused](const Problem& p) { return backward_reason(p, "shape", Backend::cuda, !fused); },
                   cuda_factory([fused](const Problem& p, const RunContext& c) {
                     return make_cuda_backward(shape_of(p, "shape"), fused, dtype_of(p), c);
                   })};
  };
  for (bool fused : {false, true}) {
    s.variants.push_back(cpu_backward(fused));
    s.variants.push_back(cuda_backward(fused));
  }
  s.pairs = {
      Pair{"naive", "fused", "fused vs naive"},
      Pair{"backward_naive", "backward_fused", "backward: fused vs naive"},
      Pair{"naive_mask_rebuilt", "naive_mask_cached", "mask: cached vs rebuilt every forward"},
      Pair{"block_naive", "block_fused", "block: fused vs naive attention"},
  };
  registry.add(std::move(s));
}

}  // namespace tb
