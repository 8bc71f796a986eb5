// Stage `attention`: scaled dot-product attention, naive (scores materialised) vs fused (tiled,
// online softmax), the causal mask rebuilt vs cached vs implicit, and the whole transformer block
// with the time of each part. docs/sources.md#004-small-gpt finds attention at 85% of a block's time;
// docs/sources.md#003-t4-transformer rebuilds the causal mask on every forward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/registry.h"

struct CUstream_st;    // cudaStream_t is CUstream_st*: the CUDA functions below take one without
struct cublasContext;  // this header needing the toolkit's (cublasHandle_t is cublasContext*)

namespace tb::attention {

struct Shape {
  int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;
  int64_t rows() const { return batch * heads * seq; }    // query rows over all (b, h)
  int64_t elements() const { return rows() * head_dim; }  // of each of Q, K, V, O
  int64_t d_model() const { return heads * head_dim; }
};

// "4x16x4096x128" -> Shape; throws UsageError naming the problem.
Shape parse_shape(const std::string& text);
std::string shape_invalid_reason(const std::string& text);  // "" when valid

enum class Mask { none, implicit, cached, rebuilt };  // none: not causal
enum class DType { fp32, bf16 };

inline constexpr uint64_t seed_q = 21, seed_k = 22, seed_v = 23, seed_x = 24, seed_w = 25;
// Query rows per block of the fused CUDA forward kernels (a warp per row in fp32; 8 warps x 16 in bf16).
inline constexpr int fused_fp32_query_rows = 8, fused_bf16_query_rows = 128;
// The widest head the fp32 fused CUDA kernels take: the forward keeps head_dim/32 <= 8 columns per
// lane, the backward 4. Training needs both.
inline constexpr int64_t cuda_fused_forward_max_head_dim = 256, cuda_fused_backward_max_head_dim = 128;

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

// ---- the kernels as functions over buffers: what the stage's variants and the training step call -----
// Where element (b, h, s, d) of an operand lives: b * batch + h * head + s * row + d. The stage keeps
// [B, H, S, D] (bhsd); the training step reads Q, K and V out of its packed qkv rows [B, S, 3C] and
// keeps O as [B, S, C] (bshd with rows of 3C and C).
struct Strides {
  int64_t batch = 0, head = 0, row = 0;
};
inline Strides bhsd(const Shape& s) { return Strides{s.heads * s.seq * s.head_dim, s.seq * s.head_dim, s.head_dim}; }
inline Strides bshd(const Shape& s, int64_t row) { return Strides{s.seq * row, s.head_dim, row}; }

// Q, K and V share `in`; O (and dO in backward) has `out`.
template <class T>
struct Operands {
  const T* q;
  const T* k;
  const T* v;
  T* o;
  Strides in, out;
};
// The gradients of Q, K, V (laid out as `in`, overwritten) from dO (laid out as `out`).
template <class T>
struct Gradients {
  T* dq;
  T* dk;
  T* dv;
  const T* dout;
};

// The reference, in plain loops in double (the training step's oracle runs on it): O and each row's
// log-sum-exp of the scaled scores, lse [B, H, S] (may be null); the backward from the definition,
// P recomputed row by row. dQ, dK, dV are overwritten.
template <class T>
void reference_forward(const Shape& s, bool causal, const Operands<T>& x, T* lse);
template <class T>
void reference_backward(const Shape& s, bool causal, const Operands<T>& x, const Gradients<T>& g);

// The CPU kernels (float). Naive is PyTorch eager's path: the probabilities [B, H, S, S] are kept,
// and backward reads them (autograd's saved softmax output). `mask` is Mask::implicit (causal) or
// none; cached/rebuilt take the stage's mask buffer (`mask` x `mask_ld`, 1 = masked).
void cpu_naive_forward(const Shape& s, Mask mask, const Operands<float>& x, float* probs,
                       const uint8_t* cached_mask = nullptr, int64_t mask_ld = 0);
// dprobs: [B, H, S, S] of scratch, the gradient of the probabilities autograd materialises.
void cpu_naive_backward(const Shape& s, const Operands<float>& x, const float* probs, const Gradients<float>& g,
                        float* dprobs);

// Fused attention on the CPU: the forward in tiles of 64 queries (their scores in the thread's
// scratch, never [S, S]), keeping only each row's log-sum-exp; the backward (FlashAttention-2's)
// recomputes the probabilities tile by tile from it. O(S) of scratch per row, per thread.
class FusedWorkspace {
 public:
  FusedWorkspace(int64_t head_dim, int64_t seq);
  FusedWorkspace(FusedWorkspace&&) noexcept;
  FusedWorkspace& operator=(FusedWorkspace&&) noexcept;
  ~FusedWorkspace();
  float* for_thread(int thread);  // this thread's scratch
  int64_t head_dim() const { return head_dim_; }
  int64_t seq() const { return seq_; }
  int64_t per_thread() const { return per_thread_; }  // floats of each thread's part
  int64_t bytes() const;

 private:
  int64_t head_dim_ = 0, seq_ = 0, per_thread_ = 0;
  float* buffer_ = nullptr;
  int threads_ = 0;
};
// The fused forward's kernels: the blocked online softmax in AVX-512 or AVX2 vectors
// (attention_cpu_blocked.h) where the CPU has them and the head dimension is a whole number of their
// vectors, else tiles of library (BLAS) products. cpu_fused_forward runs the first this CPU can.
enum class CpuKernel { avx512, avx2, blas_tiles };
std::string to_string(CpuKernel kernel);
std::vector<CpuKernel> cpu_fused_kernels(int64_t head_dim);  // those this CPU runs at this head size, fastest first
void cpu_fused_forward(const Shape& s, bool causal, const Operands<float>& x, float* lse, FusedWorkspace& ws);
void cpu_fused_forward(const Shape& s, bool causal, const Operands<float>& x, float* lse, FusedWorkspace& ws,
                       CpuKernel kernel);
void cpu_fused_backward(const Shape& s, bool causal, const Operands<float>& x, const float* lse, const Gradients<float>& g,
                        FusedWorkspace& ws);
void cpu_fused_backward(const Shape& s, bool causal, const Operands<float>& x, const float* lse, const Gradients<float>& g,
                        FusedWorkspace& ws, CpuKernel kernel);

// The CUDA kernels (fp32, causal), on `stream`, with the cuBLAS `handle` (bound to that stream) for
// the naive path's products. The naive backward's dprobs is [B, H, S, S].
// bf16_products: the products in bf16 on tensor cores with fp32 accumulation (cuBLAS's fp32-storage
// bf16 mode, the step's bf16 matmuls); the softmax and its backward stay fp32.
void cuda_naive_forward(const Shape& s, const Operands<float>& x, float* probs, cublasContext* handle, CUstream_st* stream,
                        bool bf16_products = false);
void cuda_naive_backward(const Shape& s, const Operands<float>& x, const float* probs, const Gradients<float>& g,
                         float* dprobs, cublasContext* handle, CUstream_st* stream, bool bf16_products = false);
void cuda_fused_forward(const Shape& s, const Operands<float>& x, float* lse, CUstream_st* stream);
// delta: [B, H, S] of scratch (rowsum(dO * O), FlashAttention-2's D).
void cuda_fused_backward(const Shape& s, const Operands<float>& x, const float* lse, const Gradients<float>& g, float* delta,
                         CUstream_st* stream);

// bf16 on tensor cores (mma.sync, compute capability 8.0 and newer), FlashAttention-2's forward and
// backward: what the stage's bf16 fused rows and the step with bf16 matmuls run. Operands are bf16
// [B, H, S, D] (raw bits here: this header stays free of CUDA types), accumulation is fp32.
using bf16_bits = uint16_t;
inline constexpr int64_t cuda_bf16_key_tile = 64;  // keys per tile (and query rows per backward tile)
struct Bf16Operands {
  const bf16_bits* q;
  const bf16_bits* k;
  const bf16_bits* v;
  const bf16_bits* o;     // the forward's output, read by the backward (delta = rowsum(dO O))
  const bf16_bits* dout;  // backward only
};
bool cuda_bf16_supports_head_dim(int64_t head_dim);
std::string cuda_bf16_reason(const Shape& s);  // "" when the kernels take the shape
// O, and each row's log-sum-exp of the scaled scores (natural units, as the fp32 kernels keep it;
// lse may be null).
void cuda_bf16_forward(const Shape& s, bool causal, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o,
                       float* lse, CUstream_st* stream);
// Floats of scratch the backward takes: delta per row and the dQ accumulator.
int64_t cuda_bf16_backward_scratch(const Shape& s);
// dQ, dK, dV in fp32 laid out as `grads` (overwritten; g.dout is unused: dO comes in x.dout).
void cuda_bf16_backward(const Shape& s, bool causal, const Bf16Operands& x, const float* lse, const Gradients<float>& g,
                        const Strides& grads, float* scratch, CUstream_st* stream);
// The kernels' tile configurations by index, the default (what the functions above run) first:
// what tests/attention_tiles checks and times against each other, interleaved.
std::vector<std::string> cuda_bf16_forward_tilings();
std::vector<std::string> cuda_bf16_backward_tilings();
void cuda_bf16_forward_tiled(std::size_t tiling, const Shape& s, bool causal, const bf16_bits* q, const bf16_bits* k,
                             const bf16_bits* v, bf16_bits* o, float* lse, CUstream_st* stream);
void cuda_bf16_backward_tiled(std::size_t tiling, const Shape& s, bool causal, const Bf16Operands& x, const float* lse,
                              const Gradients<float>& g, const Strides& grads, float* scratch, CUstream_st* stream);
// fp32 rows laid out as `from` -> bf16 [B, H, S, D] (the step's packed rows into the kernels' operands), and back.
void cuda_pack_bf16(const Shape& s, const float* src, const Strides& from, bf16_bits* dst, CUstream_st* stream);
void cuda_unpack_bf16(const Shape& s, const bf16_bits* src, float* dst, const Strides& to, CUstream_st* stream);

// ---- variants ------------------------------------------------------------------------------------
std::unique_ptr<Instance> make_cpu_naive(const Shape&, bool causal, Mask mask);
std::unique_ptr<Instance> make_cpu_fused(const Shape&, bool causal);
std::unique_ptr<Instance> make_cpu_block(const Shape&, bool fused_attention);
std::unique_ptr<Instance> make_cuda_naive(const Shape&, bool causal, Mask mask, DType t, const RunContext&);
std::unique_ptr<Instance> make_cuda_fused(const Shape&, bool causal, DType t, const RunContext&);
std::unique_ptr<Instance> make_cuda_block(const Shape&, bool fused_attention, const RunContext&);
// Backward alone (the forward ran at construction): dQ, dK, dV from dO, naive or fused.
std::unique_ptr<Instance> make_cpu_backward(const Shape&, bool causal, bool fused);
std::unique_ptr<Instance> make_cuda_backward(const Shape&, bool fused, DType t, const RunContext&);
// The gradients' check: dQ, dK, dV (fp32, [B, H, S, D]) against reference_backward in double at the
// heads of checked_rows, from the regenerated inputs and dO (rounded to bf16 for t = bf16).
Verdict check_gradients(const Shape& s, bool causal, DType t, const std::vector<float>& dq, const std::vector<float>& dk,
                        const std::vector<float>& dv);
inline constexpr uint64_t seed_dout = 26;
float input_dout(int64_t index);

}  // namespace tb::attention
