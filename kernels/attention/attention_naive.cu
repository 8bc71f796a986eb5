// CUDA attention, naive: cuBLAS strided-batched GEMMs around a materialised [B, H, S, S] score tensor,
// as PyTorch eager does (mask cached, rebuilt, or implicit in the softmax), and autograd's backward
// from the saved probabilities. cuda_naive_* address Q, K, V, O through Strides, so the training step
// runs them on its packed qkv rows; the stage's `naive*` rows run them (fp32, implicit mask) or the
// stage's own path (bf16, full attention, a mask buffer).
#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "attention_cuda.cuh"
#include "runtime/defaults.h"

namespace tb::attention {

namespace {

// ---- naive: mask, softmax ------------------------------------------------------------------------

__global__ void triu_mask_kernel(uint8_t* mask, int64_t n, int64_t ld) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n * n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / n, j = e % n;
    mask[i * ld + j] = j > i;
  }
}

__global__ void masked_fill_kernel(float* scores, const uint8_t* mask, int64_t ld, int64_t S, int64_t rows) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < rows * S; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = (e / S) % S, j = e % S;
    if (mask[i * ld + j]) scores[e] = -INFINITY;
  }
}

// One block per score row; `implicit` limits row i to keys 0..i and zeroes the rest. Writes P as
// fp32 in place, or as bf16 into p16 for the bf16 path.
__global__ void softmax_kernel(float* scores, bf16* p16, int64_t S, bool implicit) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float* s = scores + row * S;
  const int64_t n = implicit ? row % S + 1 : S;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, s[j]);
  mx = block_reduce(mx, true, scratch);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += __expf(s[j] - mx);
  sum = block_reduce(sum, false, scratch);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
    const float p = j < n ? __expf(s[j] - mx) * inv : 0.0f;
    if (p16) p16[row * S + j] = __float2bfloat16_rn(p);
    else s[j] = p;
  }
}

// autograd's softmax backward over one row per block, causal: dS = P (dP - rowsum(dP P)) in place
// over dP; the keys after the query get zero (P is zero there).
__global__ void causal_softmax_backward_kernel(float* dprobs, const float* probs, int64_t S) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x, query = row % S;
  float* d = dprobs + row * S;
  const float* p = probs + row * S;
  float dot = 0;
  for (int64_t j = threadIdx.x; j <= query; j += blockDim.x) dot += d[j] * p[j];
  dot = block_reduce(dot, false, scratch);
  for (int64_t j = threadIdx.x; j < S; j += blockDim.x) d[j] = j <= query ? p[j] * (d[j] - dot) : 0.0f;
}

// The stage's own naive path, for what the step never runs (bf16, full attention, a mask buffer):
// scores[bh] = scale * Q[bh] K[bh]^T, then mask and softmax, then O[bh] = P[bh] V[bh].
void naive_attention(const Shape& s, Mask mask, const Tensors& x, float* scores, bf16* p16, cublasHandle_t handle,
                     cudaStream_t stream, int device, const uint8_t* cached_mask, int64_t mask_ld, cudaMemPool_t mask_pool) {
  const int S = static_cast<int>(s.seq), D = static_cast<int>(s.head_dim);
  const int batch = static_cast<int>(s.batch * s.heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D)), one = 1.0f, zero = 0.0f;
  const bool half = x.type == DType::bf16;
  const cudaDataType in_type = half ? CUDA_R_16BF : CUDA_R_32F;
  const void* q = half ? static_cast<const void*>(x.q16.data()) : x.q32.data();
  const void* k = half ? static_cast<const void*>(x.k16.data()) : x.k32.data();
  const void* v = half ? static_cast<const void*>(x.v16.data()) : x.v32.data();
  // Column-major view: scores^T (S x S) = K Q^T, i.e. C[j + i S] = sum_d K[j][d] Q[i][d].
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, S, S, D, &scale, k, in_type, D, int64_t{S} * D,
                                          q, in_type, D, int64_t{S} * D, &zero, scores, CUDA_R_32F, S, int64_t{S} * S, batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  const int64_t rows = int64_t{batch} * S;
  const int grid = cuda::grid_for(rows * S, 256, device);
  if (mask == Mask::rebuilt) {
    // torch.triu(torch.ones(S, S), 1).bool() every forward: allocate, fill, apply, free. From a pool
    // that keeps its memory, as the caching allocator does, so the row measures the rebuild and
    // not a driver mapping PyTorch never pays.
    uint8_t* fresh = nullptr;
    CUDA_CHECK(
        cudaMallocFromPoolAsync(reinterpret_cast<void**>(&fresh), static_cast<std::size_t>(S) * S, mask_pool, stream));
    triu_mask_kernel<<<cuda::grid_for(int64_t{S} * S, 256, device), 256, 0, stream>>>(fresh, S, S);
    masked_fill_kernel<<<grid, 256, 0, stream>>>(scores, fresh, S, S, rows);
    CUDA_CHECK(cudaFreeAsync(fresh, stream));
  } else if (mask == Mask::cached) {
    masked_fill_kernel<<<grid, 256, 0, stream>>>(scores, cached_mask, mask_ld, S, rows);
  }
  softmax_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(scores, half ? p16 : nullptr, S, mask == Mask::implicit);
  CUDA_CHECK(cudaGetLastError());
  // O^T (D x S, column-major) = V^T P^T: C[d + i D] = sum_j V[j][d] P[i][j].
  const void* p = half ? static_cast<const void*>(p16) : scores;
  void* o = half ? static_cast<void*>(x.o16.data()) : static_cast<void*>(x.o32.data());
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, D, S, S, &one, v, in_type, D, int64_t{S} * D, p,
                                          in_type, S, int64_t{S} * S, &zero, o, in_type, D, int64_t{S} * D, batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---- naive fp32 over strided operands ------------------------------------------------------------

// A per-(b, h) matrix of a GEMM: at base + b * batch + h * head, `ld` apart (column-major view).
struct HeadMatrix {
  const float* base;
  int64_t ld, batch, head;
};
HeadMatrix head_matrix(const float* base, const Strides& st) { return HeadMatrix{base, st.row, st.batch, st.head}; }
HeadMatrix probs_matrix(const float* base, const Shape& s) {  // [B, H, S, S]
  return HeadMatrix{base, s.seq, s.heads * s.seq * s.seq, s.seq * s.seq};
}

// C(b, h) = alpha op(A(b, h)) op(B(b, h)) + beta C(b, h) for every (b, h). cuBLAS's strided batch has
// one stride between items: one call over all B x H items where every operand's batch stride is
// heads x its head stride ([B, H, ...] layouts), else a call per b over the heads (the step's
// [B, S, 3C] rows, where b and h step by unrelated amounts).
void gemm_per_head(cublasHandle_t handle, const Shape& s, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                   int64_t k, float alpha, const HeadMatrix& a, const HeadMatrix& b, float beta, const HeadMatrix& c,
                   cublasComputeType_t compute) {
  auto call = [&](int64_t offset_a, int64_t offset_b, int64_t offset_c, int64_t count) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                            &alpha, a.base + offset_a, CUDA_R_32F, static_cast<int>(a.ld), a.head,
                                            b.base + offset_b, CUDA_R_32F, static_cast<int>(b.ld), b.head, &beta,
                                            const_cast<float*>(c.base) + offset_c, CUDA_R_32F, static_cast<int>(c.ld),
                                            c.head, static_cast<int>(count), compute, CUBLAS_GEMM_DEFAULT));
  };
  const auto flat = [&](const HeadMatrix& x) { return x.batch == s.heads * x.head; };
  if (flat(a) && flat(b) && flat(c)) return call(0, 0, 0, s.batch * s.heads);
  for (int64_t i = 0; i < s.batch; ++i) call(i * a.batch, i * b.batch, i * c.batch, s.heads);
}

// The causal softmax of the [B, H, S, S] scores in place (the scale is already in them).
void causal_softmax(const Shape& s, float* scores, cudaStream_t stream) {
  softmax_kernel<<<static_cast<unsigned>(s.rows()), 256, 0, stream>>>(scores, nullptr, s.seq, true);
  CUDA_CHECK(cudaGetLastError());
}

class Naive final : public Instance {
 public:
  Naive(const Shape& s, bool causal, Mask mask, DType t, const RunContext& ctx)
      : s_(s),
        causal_(causal),
        mask_(mask),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        device_(ctx.cuda_device),
        x_(s, t, stream_, device_),
        scores_(static_cast<std::size_t>(s.batch * s.heads * s.seq * s.seq)) {
    if (t == DType::bf16) p16_ = cuda::DeviceBuffer<bf16>(scores_.size());
    if (mask == Mask::rebuilt) mask_pool_ = cuda::MemPool(device_);
    if (mask == Mask::cached) {  // register_buffer: built once at the maximum length, sliced per call
      mask_ld_ = std::max(s.seq, defaults::attention_mask_max_seq);
      cached_ = cuda::DeviceBuffer<uint8_t>(static_cast<std::size_t>(mask_ld_ * mask_ld_));
      triu_mask_kernel<<<cuda::grid_for(mask_ld_ * mask_ld_, 256, device_), 256, 0, stream_>>>(cached_.data(), mask_ld_,
                                                                                               mask_ld_);
      CUDA_CHECK(cudaGetLastError());
    }
    CUBLAS_CHECK(cublasSetStream(handle_, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // fp32 with the implicit causal mask: the kernels the training step runs; the rest (bf16, full,
  // mask buffers) the stage's own path.
  void run() override {
    if (x_.type == DType::fp32 && mask_ == Mask::implicit)
      cuda_naive_forward(s_, x_.operands(s_), scores_.data(), handle_, stream_);
    else
      naive_attention(s_, mask_, x_, scores_.data(), p16_.data(), handle_, stream_, device_, cached_.data(), mask_ld_,
                      mask_pool_.get());
  }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return check_output(s_, causal_, x_.type, x_.output(s_.elements(), stream_));
  }
  // Rebuilt: what the mask pool holds mapped, which stays put from the first forward on.
  std::vector<std::pair<std::string, double>> observed() const override {
    if (mask_ != Mask::rebuilt) return {};
    return {{"mask_pool_reserved_bytes", static_cast<double>(mask_pool_.reserved_bytes())}};
  }

 private:
  Shape s_;
  bool causal_;
  Mask mask_;
  cudaStream_t stream_;
  int device_;
  cuda::CublasHandle handle_;
  Tensors x_;
  cuda::DeviceBuffer<float> scores_;
  cuda::DeviceBuffer<bf16> p16_;
  cuda::DeviceBuffer<uint8_t> cached_;
  int64_t mask_ld_ = 0;
  cuda::MemPool mask_pool_;  // rebuilt: where each forward's mask comes from
};

}  // namespace

// ---- the kernels as functions over buffers ------------------------------------------------------

void cuda_naive_forward(const Shape& s, const Operands<float>& x, float* probs, cublasContext* handle, CUstream_st* stream,
                        bool bf16_products) {
  if (s.rows() == 0) return;
  const int64_t S = s.seq, D = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const cublasComputeType_t compute = bf16_products ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  const HeadMatrix p = probs_matrix(probs, s);
  // Column-major view of row-major operands: scores^T (S x S) = K Q^T, C[j + i S] = scale sum_d K[j][d] Q[i][d].
  gemm_per_head(handle, s, CUBLAS_OP_T, CUBLAS_OP_N, S, S, D, scale, head_matrix(x.k, x.in), head_matrix(x.q, x.in), 0.0f, p,
                compute);
  causal_softmax(s, probs, stream);
  // O^T (D x S) = V^T P^T: C[d + i ld] = sum_j V[j][d] P[i][j].
  gemm_per_head(handle, s, CUBLAS_OP_N, CUBLAS_OP_N, D, S, S, 1.0f, head_matrix(x.v, x.in), p, 0.0f, head_matrix(x.o, x.out),
                compute);
}

void cuda_naive_backward(const Shape& s, const Operands<float>& x, const float* probs, const Gradients<float>& g,
                         float* dprobs, cublasContext* handle, CUstream_st* stream, bool bf16_products) {
  if (s.rows() == 0) return;
  const int64_t S = s.seq, D = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const cublasComputeType_t compute = bf16_products ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  const HeadMatrix p = probs_matrix(probs, s), dp = probs_matrix(dprobs, s), dout = head_matrix(g.dout, x.out);
  // dV = P^T dO: dV^T (D x S) = dO^T P, C[d + j ld] = sum_i dO[i][d] P[i][j].
  gemm_per_head(handle, s, CUBLAS_OP_N, CUBLAS_OP_T, D, S, S, 1.0f, dout, p, 0.0f, head_matrix(g.dv, x.in), compute);
  // dP = dO V^T: C[j + i S] = sum_d V[j][d] dO[i][d].
  gemm_per_head(handle, s, CUBLAS_OP_T, CUBLAS_OP_N, S, S, D, 1.0f, head_matrix(x.v, x.in), dout, 0.0f, dp, compute);
  causal_softmax_backward_kernel<<<static_cast<unsigned>(s.rows()), 256, 0, stream>>>(dprobs, probs, S);
  CUDA_CHECK(cudaGetLastError());
  // dQ = scale dS K: C[d + i ld] = sum_j K[j][d] dS[i][j].
  gemm_per_head(handle, s, CUBLAS_OP_N, CUBLAS_OP_N, D, S, S, scale, head_matrix(x.k, x.in), dp, 0.0f,
                head_matrix(g.dq, x.in), compute);
  // dK = scale dS^T Q: C[d + j ld] = sum_i Q[i][d] dS[i][j].
  gemm_per_head(handle, s, CUBLAS_OP_N, CUBLAS_OP_T, D, S, S, scale, head_matrix(x.q, x.in), dp, 0.0f,
                head_matrix(g.dk, x.in), compute);
}

std::unique_ptr<Instance> make_cuda_naive(const Shape& s, bool causal, Mask mask, DType t, const RunContext& ctx) {
  return std::make_unique<Naive>(s, causal, causal ? mask : Mask::none, t, ctx);
}

}  // namespace tb::attention
