// The fused CPU forward at GEMM speed: FlashAttention's blocked online softmax with register-blocked
// micro-kernels, built once per instruction set (attention_cpu_blocked.inc, included by
// attention_cpu_avx512.cpp and attention_cpu_avx2.cpp, each compiled for its own -march). This header
// is what the rest of the stage sees: plain data and declarations. Its two constexpr sizes are called
// from attention_cpu.cpp only, so that no copy of them is built for AVX-512 (the linker could keep that
// copy for the generic build's callers).
#pragma once

#include <cstdint>

namespace tb::attention::blocked {

inline constexpr int64_t query_block = 64;  // queries per task: the width of the transposed scores
inline constexpr int64_t key_block = 64;    // keys per step of the online softmax

// One forward: the shape, the operands with their strides (as attention.h's Strides), the scratch of
// each thread (scratch_floats apart) and whether the work is worth a parallel region.
struct ForwardArgs {
  int64_t batch, heads, seq, head_dim;
  bool causal, parallel;
  const float *q, *k, *v;
  float* o;
  float* lse;  // [B, H, S] or null
  int64_t in_batch, in_head, in_row, out_batch, out_head, out_row;
  float* scratch;
  int64_t scratch_per_thread;
};

// Floats of scratch one thread needs: the transposed queries [D][64], the transposed scores of a key
// block [64][64], O's accumulator [64][D], and the running max, sum, rescale and new max of 64 queries.
constexpr int64_t scratch_floats(int64_t head_dim) {
  return 2 * query_block * head_dim + key_block * query_block + 4 * query_block;
}

// One backward (FlashAttention-2's, a head per thread): the forward's operands and its row
// log-sum-exps, dO laid out as O, and dQ, dK, dV (laid out as Q, overwritten).
struct BackwardArgs {
  ForwardArgs forward;  // its o is the forward's output (its lse is not used)
  const float* lse;     // the forward's row log-sum-exps [B, H, S]
  const float* dout;
  float *dq, *dk, *dv;
};

// Floats of scratch one thread needs for a head's backward: its queries and dO, packed as the
// forward's transposed blocks ([D][64] each, S rounded up to 64), each row's log-sum-exp (base 2) and
// delta = rowsum(dO O), P and dS of a key block against a query block, and dK and dV of a key block.
constexpr int64_t backward_scratch_floats(int64_t head_dim, int64_t seq) {
  const int64_t padded = (seq + query_block - 1) / query_block * query_block;
  return 2 * padded * head_dim + 2 * padded + 2 * key_block * query_block + 2 * key_block * head_dim;
}

namespace avx512 {
bool built();  // false where the compiler could not target AVX-512: forward() must not be called
void forward(const ForwardArgs& args);
void backward(const BackwardArgs& args);
}  // namespace avx512
namespace avx2 {
bool built();
void forward(const ForwardArgs& args);
void backward(const BackwardArgs& args);
}  // namespace avx2

}  // namespace tb::attention::blocked
