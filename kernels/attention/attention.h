// Stage `attention`: scaled dot-product attention, naive (scores materialised) vs fused (tiled,
// online softmax), the causal mask rebuilt vs cached vs implicit, and the whole transformer block
// with the time of each part. seeds/004 finds attention at 85% of a block's time; seeds/003 rebuilds
// the causal mask on every forward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/registry.h"

namespace tb::attention {

struct Shape {
  int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;
  int64_t rows() const { return batch * heads * seq; }      // query rows over all (b, h)
  int64_t elements() const { return rows() * head_dim; }    // of each of Q, K, V, O
  int64_t d_model() const { return heads * head_dim; }
};

// "4x16x4096x128" -> Shape; throws UsageError naming the problem.
Shape parse_shape(const std::string& text);
std::string shape_invalid_reason(const std::string& text);  // "" when valid

enum class Mask { none, implicit, cached, rebuilt };  // none: not causal
enum class DType { fp32, bf16 };

inline constexpr uint64_t seed_q = 21, seed_k = 22, seed_v = 23, seed_x = 24, seed_w = 25;
// Query rows per block of the fused CUDA kernels (a warp per row in fp32; 4 warps x 16 in bf16).
inline constexpr int fused_fp32_query_rows = 8, fused_bf16_query_rows = 64;

// Inputs of (b, h, s, d) in [B, H, S, D] order, regenerated on demand; bf16 rounds them.
float input_q(int64_t index, DType t);
float input_k(int64_t index, DType t);
float input_v(int64_t index, DType t);

// FLOPs of the two matrix products, 4 B H S^2 D, halved when causal (the masked half is not work).
double attention_flops(const Shape& s, bool causal);

// ---- reference ---------------------------------------------------------------------------------
// One output row o[b, h, i, :] in double, from the regenerated inputs.
std::vector<double> reference_row(const Shape& s, bool causal, DType t, int64_t bh, int64_t i);
// Rows checked: the first and last query of the first and last (b, h), and a fixed random sample.
std::vector<std::pair<int64_t, int64_t>> checked_rows(const Shape& s);
// Compares out (fp32 values of [B, H, S, D]) at the checked rows.
Verdict check_output(const Shape& s, bool causal, DType t, const std::vector<float>& out);

// ---- the transformer block: x -> x + attn(ln1(x)) -> + mlp(ln2(.)) ---------------------------------
struct BlockWeights {
  int64_t d = 0, hidden = 0;
  std::vector<float> ln1_g, ln1_b, w_qkv, b_qkv, w_out, b_out, ln2_g, ln2_b, w_fc1, b_fc1, w_fc2, b_fc2;
};
BlockWeights make_block_weights(int64_t d_model);
float block_input(int64_t index);  // x of [B, S, d]
// Output rows y[b, i, :] in double for the listed (b, i).
Verdict check_block_output(const Shape& s, const BlockWeights& w, const std::vector<float>& y);
inline constexpr const char* block_parts[] = {"ln1", "qkv", "attention", "out_proj", "ln2", "mlp"};
inline constexpr int block_part_count = 6;

// ---- variants ------------------------------------------------------------------------------------
std::unique_ptr<Instance> make_cpu_naive(const Shape&, bool causal, Mask mask);
std::unique_ptr<Instance> make_cpu_fused(const Shape&, bool causal);
std::unique_ptr<Instance> make_cpu_block(const Shape&, bool fused_attention);
std::unique_ptr<Instance> make_cuda_naive(const Shape&, bool causal, Mask mask, DType t, const RunContext&);
std::unique_ptr<Instance> make_cuda_fused(const Shape&, bool causal, DType t, const RunContext&);
std::unique_ptr<Instance> make_cuda_block(const Shape&, bool fused_attention, const RunContext&);

}  // namespace tb::attention
