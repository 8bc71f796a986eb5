// CUDA attention. naive: cuBLAS strided-batched GEMMs around a materialised [B, H, S, S] score
// tensor, as PyTorch eager does, and autograd's backward from it. fused fp32: one warp per query row
// on CUDA cores, K/V tiles shared in shared memory, online softmax, each row's log-sum-exp kept; its
// backward is FlashAttention-2's, P recomputed tile by tile from the log-sum-exp. fused bf16: the
// FlashAttention-2 structure on tensor cores (mma.sync m16n8k16), scores kept in registers and reused
// as the A operand of P V, causal tiles above the diagonal never loaded. The fp32 kernels address
// Q, K, V, O through Strides, so the training step runs them on its packed qkv rows: cuda_naive_*,
// cuda_fused_* are what the stage's instances and the step call.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>
#include <vector>

#include "attention.h"
#include "runtime/cuda_fill.cuh"
#include "runtime/cuda_raii.h"
#include "runtime/defaults.h"

namespace tb::attention {

namespace {

using bf16 = __nv_bfloat16;

// Shared memory a block may use without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize).
constexpr std::size_t default_shared_bytes = 48 * 1024;

// Raises `kernel`'s dynamic shared memory limit to `bytes` where the default is too small, or says
// why the device cannot. Cheap and legal during stream capture (FlashAttention sets it at every
// launch), so launchers call it each time.
template <class Kernel>
void allow_shared_bytes(Kernel kernel, std::size_t bytes, const char* what) {
  if (bytes <= default_shared_bytes) return;
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  TB_REQUIRE(bytes <= static_cast<std::size_t>(optin), std::string(what) + " needs " + std::to_string(bytes) +
                                                           " bytes of shared memory per block, the device " +
                                                           std::to_string(optin));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Where row `s` of head (b, h) starts in an operand laid out as `st`.
__host__ __device__ inline int64_t row_offset(const Strides& st, int64_t b, int64_t h, int64_t s) {
  return b * st.batch + h * st.head + s * st.row;
}

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

__device__ inline float block_reduce(float v, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? scratch[threadIdx.x] : (is_max ? -INFINITY : 0.0f);
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, v, o);
      v = is_max ? fmaxf(v, other) : v + other;
    }
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  return scratch[0];
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

// After the stream's work: a copy to pageable memory returns when it has landed.
template <class T>
std::vector<float> download_as_float(const T* device, int64_t n, cudaStream_t stream) {
  std::vector<T> host(static_cast<std::size_t>(n));
  CUDA_CHECK(cudaMemcpyAsync(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> out(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>) out[i] = __bfloat162float(host[i]);
    else out[i] = host[i];
  }
  return out;
}

// Q, K, V, O on the device in fp32 or bf16, filled with the reference's inputs.
struct Tensors {
  Tensors(const Shape& s, DType t, cudaStream_t stream, int device) : type(t) {
    const auto n = static_cast<std::size_t>(s.elements());
    if (t == DType::bf16) {
      q16 = cuda::DeviceBuffer<bf16>(n), k16 = cuda::DeviceBuffer<bf16>(n), v16 = cuda::DeviceBuffer<bf16>(n);
      o16 = cuda::DeviceBuffer<bf16>(n);
      cuda::fill_uniform(q16.data(), s.elements(), seed_q, stream, device);
      cuda::fill_uniform(k16.data(), s.elements(), seed_k, stream, device);
      cuda::fill_uniform(v16.data(), s.elements(), seed_v, stream, device);
    } else {
      q32 = cuda::DeviceBuffer<float>(n), k32 = cuda::DeviceBuffer<float>(n), v32 = cuda::DeviceBuffer<float>(n);
      o32 = cuda::DeviceBuffer<float>(n);
      cuda::fill_uniform(q32.data(), s.elements(), seed_q, stream, device);
      cuda::fill_uniform(k32.data(), s.elements(), seed_k, stream, device);
      cuda::fill_uniform(v32.data(), s.elements(), seed_v, stream, device);
    }
  }
  // The fp32 tensors as the kernels over buffers take them, [B, H, S, D].
  Operands<float> operands(const Shape& s) const {
    return Operands<float>{q32.data(), k32.data(), v32.data(), o32.data(), bhsd(s), bhsd(s)};
  }
  std::vector<float> output(int64_t n, cudaStream_t stream) const {
    return type == DType::bf16 ? download_as_float(o16.data(), n, stream) : download_as_float(o32.data(), n, stream);
  }
  // A bf16 buffer as the tensor-core functions take it.
  static bf16_bits* bits(const cuda::DeviceBuffer<bf16>& b) { return reinterpret_cast<bf16_bits*>(b.data()); }
  DType type;
  cuda::DeviceBuffer<float> q32, k32, v32, o32;
  cuda::DeviceBuffer<bf16> q16, k16, v16, o16;
};

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
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, S, S, D, &scale, k, in_type, D,
                                          int64_t{S} * D, q, in_type, D, int64_t{S} * D, &zero, scores, CUDA_R_32F, S,
                                          int64_t{S} * S, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  const int64_t rows = int64_t{batch} * S;
  const int grid = cuda::grid_for(rows * S, 256, device);
  if (mask == Mask::rebuilt) {
    // torch.triu(torch.ones(S, S), 1).bool() every forward: allocate, fill, apply, free. From a pool
    // that keeps its memory, as the caching allocator does, so the row measures the rebuild and
    // not a driver mapping PyTorch never pays.
    uint8_t* fresh = nullptr;
    CUDA_CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&fresh), static_cast<std::size_t>(S) * S, mask_pool, stream));
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
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, D, S, S, &one, v, in_type, D,
                                          int64_t{S} * D, p, in_type, S, int64_t{S} * S, &zero, o, in_type, D,
                                          int64_t{S} * D, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
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
void gemm_per_head(cublasHandle_t handle, const Shape& s, cublasOperation_t ta, cublasOperation_t tb, int64_t m,
                   int64_t n, int64_t k, float alpha, const HeadMatrix& a, const HeadMatrix& b, float beta,
                   const HeadMatrix& c, cublasComputeType_t compute) {
  auto call = [&](int64_t offset_a, int64_t offset_b, int64_t offset_c, int64_t count) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, a.base + offset_a,
        CUDA_R_32F, static_cast<int>(a.ld), a.head, b.base + offset_b, CUDA_R_32F, static_cast<int>(b.ld), b.head, &beta,
        const_cast<float*>(c.base) + offset_c, CUDA_R_32F, static_cast<int>(c.ld), c.head, static_cast<int>(count),
        compute, CUBLAS_GEMM_DEFAULT));
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

// ---- fused fp32: a warp per query row ------------------------------------------------------------

constexpr int f32_rows = fused_fp32_query_rows;  // query rows (warps) per block
constexpr int f32_keys = 32;  // keys per tile: one per lane
constexpr int f32_max_cols = cuda_fused_forward_max_head_dim / 32;  // output columns per lane
constexpr int f32_max_head_dim = 32 * f32_max_cols;

// Each lane scores one key of the tile and owns head_dim/32 output columns; the key tile is shared by
// the block's 8 rows. K rows are padded by one float so lanes reading different keys hit different
// banks. Row i's log-sum-exp of the scaled scores goes to lse[bh * S + i] when lse is set.
__global__ void fused_fp32_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                  float* __restrict__ o, float* __restrict__ lse, Strides in, Strides out, int H, int S,
                                  int D, bool causal, float scale) {
  extern __shared__ float smem[];
  float* ks = smem;                      // [f32_keys][D + 1]
  float* vs = ks + f32_keys * (D + 1);   // [f32_keys][D]
  float* qs = vs + f32_keys * D;         // [f32_rows][D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // One block per (batch x head, query tile), folded into grid.x: grid.y would cap batch x heads at 65535.
  const int tiles = (S + f32_rows - 1) / f32_rows;
  const int64_t bh = blockIdx.x / tiles, b = bh / H, h = bh % H;
  const int row0 = static_cast<int>(blockIdx.x % tiles) * f32_rows, row = row0 + warp;
  const float* qb = q + row_offset(in, b, h, 0);
  const float* kb = k + row_offset(in, b, h, 0);
  const float* vb = v + row_offset(in, b, h, 0);
  for (int e = threadIdx.x; e < f32_rows * D; e += blockDim.x) {
    const int r = row0 + e / D;
    qs[e] = r < S ? qb[r * in.row + e % D] * scale : 0.0f;
  }
  float acc[f32_max_cols];
  for (int c = 0; c < f32_max_cols; ++c) acc[c] = 0.0f;
  float row_max = -INFINITY, row_sum = 0.0f;
  const int key_end = causal ? min(S, row0 + f32_rows) : S;
  for (int j0 = 0; j0 < key_end; j0 += f32_keys) {
    __syncthreads();
    for (int e = threadIdx.x; e < f32_keys * D; e += blockDim.x) {
      const int j = j0 + e / D, d = e % D;
      ks[(e / D) * (D + 1) + d] = j < S ? kb[j * in.row + d] : 0.0f;
      vs[e] = j < S ? vb[j * in.row + d] : 0.0f;
    }
    __syncthreads();
    const int key = j0 + lane;
    float score = -INFINITY;
    if (row < S && key < S && (!causal || key <= row)) {
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot += qs[warp * D + d] * ks[lane * (D + 1) + d];
      score = dot;
    }
    float tile_max = score;
    for (int off = 16; off > 0; off >>= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
    const float new_max = fmaxf(row_max, tile_max);
    if (new_max == -INFINITY) continue;  // nothing visible yet (a padding row)
    const float p = score == -INFINITY ? 0.0f : __expf(score - new_max);
    const float alpha = __expf(row_max - new_max);
    float tile_sum = p;
    for (int off = 16; off > 0; off >>= 1) tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, off);
    row_sum = row_sum * alpha + tile_sum;
    row_max = new_max;
    for (int c = 0; c < f32_max_cols; ++c) acc[c] *= alpha;
    for (int j = 0; j < f32_keys; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      for (int c = 0; c < f32_max_cols; ++c) {
        const int d = lane + 32 * c;
        if (d < D) acc[c] += pj * vs[j * D + d];
      }
    }
  }
  if (row >= S) return;
  const float inv = 1.0f / row_sum;
  float* ob = o + row_offset(out, b, h, row);
  for (int c = 0; c < f32_max_cols; ++c) {
    const int d = lane + 32 * c;
    if (d < D) ob[d] = acc[c] * inv;
  }
  if (lse && lane == 0) lse[bh * S + row] = row_max + logf(row_sum);
}

std::size_t fp32_smem_bytes(int D) { return sizeof(float) * (f32_keys * (D + 1) + f32_keys * D + f32_rows * D); }

// The fp32 forward, causal or full (the stage's `full` rows run the same kernel with nothing masked).
void fused_fp32(const Shape& s, bool causal, const Operands<float>& x, float* lse, cudaStream_t stream) {
  TB_REQUIRE(s.head_dim <= f32_max_head_dim, "the fp32 fused kernel keeps head_dim/32 <= 8 columns per lane");
  const int S = static_cast<int>(s.seq), D = static_cast<int>(s.head_dim);
  const int64_t blocks = (S + f32_rows - 1) / f32_rows * s.batch * s.heads;
  TB_REQUIRE(blocks <= INT_MAX, "batch x heads x query tiles above the grid's 2^31 - 1 blocks");
  if (blocks == 0) return;
  const std::size_t smem = fp32_smem_bytes(D);
  allow_shared_bytes(fused_fp32_kernel, smem, "the fp32 fused forward");
  fused_fp32_kernel<<<static_cast<unsigned>(blocks), 32 * f32_rows, smem, stream>>>(
      x.q, x.k, x.v, x.o, lse, x.in, x.out, static_cast<int>(s.heads), S, D, causal,
      1.0f / std::sqrt(static_cast<float>(D)));
  CUDA_CHECK(cudaGetLastError());
}

// ---- fused fp32 backward: FlashAttention-2 ---------------------------------------------------------
// Three kernels, none of which holds more than a tile of the [S, S] matrices: delta = rowsum(dO O)
// per query row; then per (b, h, 32-key tile) a block that walks the query tiles at or after its keys
// (causal) and keeps that tile's dK and dV in registers; then per (b, h, 16-query tile) a block that
// walks the key tiles up to its queries and keeps dQ in registers. Each recomputes the tile's
// P = exp(scale Q K^T - lse) and dS = P (dO V^T - delta); dQ in its own pass instead of atomics
// into a zeroed dQ: deterministic, and every gradient is written once (overwritten), strided or not.

constexpr int bwd_keys = 32;   // keys per tile: one per lane
constexpr int bwd_rows = 16;   // query rows per tile: two per warp
constexpr int bwd_warps = 8;
constexpr int bwd_threads = 32 * bwd_warps;
constexpr int bwd_max_cols = cuda_fused_backward_max_head_dim / 32;  // gradient columns per lane
constexpr int bwd_max_head_dim = 32 * bwd_max_cols;
constexpr int bwd_rows_per_warp = bwd_rows / bwd_warps;  // of the dQ pass, and of the P and dS tile
constexpr int bwd_keys_per_warp = bwd_keys / bwd_warps;  // of the dK and dV pass
static_assert(bwd_rows % bwd_warps == 0 && bwd_keys % bwd_warps == 0, "warps share the tiles evenly");
static_assert(bwd_keys % bwd_rows == 0, "a key tile starts on a query tile");

// One warp per row: delta[bh * S + i] = sum_d dO[i][d] O[i][d].
__global__ void row_delta_kernel(const float* __restrict__ o, const float* __restrict__ dout, float* __restrict__ delta,
                                 Strides out, int H, int S, int D, int64_t rows) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp: blockDim.x is a multiple of 32
  const int64_t bh = row / S;
  const int64_t at = row_offset(out, bh / H, bh % H, row % S);
  float sum = 0.0f;
  for (int d = lane; d < D; d += 32) sum += o[at + d] * dout[at + d];
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) delta[row] = sum;
}

// A block's shared memory: K and V tiles padded by one float per row (lanes read different keys in
// the same column), Q and dO tiles, P and dS of the tile pair, and the query rows' lse and delta.
struct BackwardTiles {
  float *ks, *vs, *qs, *dos, *ps, *dss, *lse, *delta;
  __device__ BackwardTiles(float* smem, int D)
      : ks(smem), vs(ks + bwd_keys * (D + 1)), qs(vs + bwd_keys * (D + 1)), dos(qs + bwd_rows * D),
        ps(dos + bwd_rows * D), dss(ps + bwd_rows * bwd_keys), lse(dss + bwd_rows * bwd_keys), delta(lse + bwd_rows) {}
};
std::size_t backward_smem_bytes(int D) {
  return sizeof(float) * (2 * bwd_keys * (D + 1) + 2 * bwd_rows * D + 2 * bwd_rows * bwd_keys + 2 * bwd_rows);
}

// Keys [j0, j0 + 32) of head (b, h) into the K and V tiles; keys past S are zero.
__device__ inline void load_key_tile(BackwardTiles& t, const float* kb, const float* vb, int64_t row_stride, int j0,
                                     int S, int D) {
  for (int e = threadIdx.x; e < bwd_keys * D; e += blockDim.x) {
    const int jl = e / D, d = e % D, j = j0 + jl;
    t.ks[jl * (D + 1) + d] = j < S ? kb[j * row_stride + d] : 0.0f;
    t.vs[jl * (D + 1) + d] = j < S ? vb[j * row_stride + d] : 0.0f;
  }
}

// Queries [i0, i0 + 16) into the Q and dO tiles with their lse and delta; rows past S are zero.
__device__ inline void load_query_tile(BackwardTiles& t, const float* qb, const float* dob, const float* lse,
                                       const float* delta, const Strides& in, const Strides& out, int i0, int S, int D) {
  for (int e = threadIdx.x; e < bwd_rows * D; e += blockDim.x) {
    const int il = e / D, d = e % D, i = i0 + il;
    t.qs[e] = i < S ? qb[i * in.row + d] : 0.0f;
    t.dos[e] = i < S ? dob[i * out.row + d] : 0.0f;
  }
  if (threadIdx.x < bwd_rows) {
    const int i = i0 + threadIdx.x;
    t.lse[threadIdx.x] = i < S ? lse[i] : 0.0f;
    t.delta[threadIdx.x] = i < S ? delta[i] : 0.0f;
  }
}

// P and dS of the loaded (query tile, key tile) pair: warp w takes rows w + 8r, lane l key l.
// Masked pairs (a key after its query, a query past S) are zero in both.
__device__ inline void tile_probabilities(BackwardTiles& t, int i0, int j0, int S, int D, float scale) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, j = j0 + lane;
  for (int r = 0; r < bwd_rows_per_warp; ++r) {
    const int il = warp + bwd_warps * r, i = i0 + il;
    float p = 0.0f, ds = 0.0f;
    if (i < S && j <= i) {
      float qk = 0.0f, dov = 0.0f;
      for (int d = 0; d < D; ++d) {
        qk += t.qs[il * D + d] * t.ks[lane * (D + 1) + d];
        dov += t.dos[il * D + d] * t.vs[lane * (D + 1) + d];
      }
      p = expf(qk * scale - t.lse[il]);
      ds = p * (dov - t.delta[il]);
    }
    t.ps[il * bwd_keys + lane] = p;
    t.dss[il * bwd_keys + lane] = ds;
  }
}

// dK and dV of one key tile: thread (warp w, lane l) owns keys w + 8r and columns l + 32c. The
// P and dS reads are warp-uniform (broadcasts), the Q and dO reads consecutive across lanes.
__global__ void __launch_bounds__(bwd_threads)
    fused_backward_dkdv_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                               const float* __restrict__ dout, const float* __restrict__ lse,
                               const float* __restrict__ delta, float* __restrict__ dk, float* __restrict__ dv,
                               Strides in, Strides out, int H, int S, int D, float scale) {
  extern __shared__ float smem[];
  BackwardTiles t(smem, D);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tiles = (S + bwd_keys - 1) / bwd_keys;
  const int64_t bh = blockIdx.x / tiles, b = bh / H, h = bh % H;
  const int j0 = static_cast<int>(blockIdx.x % tiles) * bwd_keys;
  const int64_t head_in = row_offset(in, b, h, 0), head_out = row_offset(out, b, h, 0);
  load_key_tile(t, k + head_in, v + head_in, in.row, j0, S, D);
  float dk_acc[bwd_keys_per_warp][bwd_max_cols] = {}, dv_acc[bwd_keys_per_warp][bwd_max_cols] = {};
  for (int i0 = j0; i0 < S; i0 += bwd_rows) {  // causal: queries before j0 see none of these keys
    __syncthreads();  // the previous pair's tiles are no longer read
    load_query_tile(t, q + head_in, dout + head_out, lse + bh * S, delta + bh * S, in, out, i0, S, D);
    __syncthreads();
    tile_probabilities(t, i0, j0, S, D, scale);
    __syncthreads();
    for (int il = 0; il < bwd_rows; ++il)
#pragma unroll
      for (int r = 0; r < bwd_keys_per_warp; ++r) {
        const int jl = warp + bwd_warps * r;
        const float p = t.ps[il * bwd_keys + jl], ds = t.dss[il * bwd_keys + jl];
#pragma unroll
        for (int c = 0; c < bwd_max_cols; ++c) {
          const int d = lane + 32 * c;
          if (d < D) {
            dv_acc[r][c] += p * t.dos[il * D + d];
            dk_acc[r][c] += ds * t.qs[il * D + d];
          }
        }
      }
  }
#pragma unroll
  for (int r = 0; r < bwd_keys_per_warp; ++r) {
    const int j = j0 + warp + bwd_warps * r;
    if (j >= S) continue;
#pragma unroll
    for (int c = 0; c < bwd_max_cols; ++c) {
      const int d = lane + 32 * c;
      if (d < D) {
        dk[head_in + j * in.row + d] = scale * dk_acc[r][c];
        dv[head_in + j * in.row + d] = dv_acc[r][c];
      }
    }
  }
}

// dQ of one query tile: thread (warp w, lane l) owns rows w + 8r and columns l + 32c.
__global__ void __launch_bounds__(bwd_threads)
    fused_backward_dq_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                             const float* __restrict__ dout, const float* __restrict__ lse,
                             const float* __restrict__ delta, float* __restrict__ dq, Strides in, Strides out, int H,
                             int S, int D, float scale) {
  extern __shared__ float smem[];
  BackwardTiles t(smem, D);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tiles = (S + bwd_rows - 1) / bwd_rows;
  const int64_t bh = blockIdx.x / tiles, b = bh / H, h = bh % H;
  const int i0 = static_cast<int>(blockIdx.x % tiles) * bwd_rows;
  const int64_t head_in = row_offset(in, b, h, 0), head_out = row_offset(out, b, h, 0);
  load_query_tile(t, q + head_in, dout + head_out, lse + bh * S, delta + bh * S, in, out, i0, S, D);
  float dq_acc[bwd_rows_per_warp][bwd_max_cols] = {};
  const int key_end = min(S, i0 + bwd_rows);  // causal: no query of the tile sees a later key
  for (int j0 = 0; j0 < key_end; j0 += bwd_keys) {
    __syncthreads();  // the previous key tile is no longer read
    load_key_tile(t, k + head_in, v + head_in, in.row, j0, S, D);
    __syncthreads();
    tile_probabilities(t, i0, j0, S, D, scale);
    __syncthreads();
    for (int jl = 0; jl < bwd_keys; ++jl)
#pragma unroll
      for (int r = 0; r < bwd_rows_per_warp; ++r) {
        const float ds = t.dss[(warp + bwd_warps * r) * bwd_keys + jl];
#pragma unroll
        for (int c = 0; c < bwd_max_cols; ++c) {
          const int d = lane + 32 * c;
          if (d < D) dq_acc[r][c] += ds * t.ks[jl * (D + 1) + d];
        }
      }
  }
#pragma unroll
  for (int r = 0; r < bwd_rows_per_warp; ++r) {
    const int i = i0 + warp + bwd_warps * r;
    if (i >= S) continue;
#pragma unroll
    for (int c = 0; c < bwd_max_cols; ++c) {
      const int d = lane + 32 * c;
      if (d < D) dq[head_in + i * in.row + d] = scale * dq_acc[r][c];
    }
  }
}

// The stage's fused forward: fp32 through the kernel the step also runs, bf16 on tensor cores
// (attention_bf16.cu).
void fused_attention(const Shape& s, bool causal, const Tensors& x, cudaStream_t stream) {
  if (x.type == DType::fp32) {
    if (causal) cuda_fused_forward(s, x.operands(s), nullptr, stream);
    else fused_fp32(s, false, x.operands(s), nullptr, stream);
    return;
  }
  cuda_bf16_forward(s, causal, x.bits(x.q16), x.bits(x.k16), x.bits(x.v16), x.bits(x.o16), nullptr, stream);
}

class Naive final : public Instance {
 public:
  Naive(const Shape& s, bool causal, Mask mask, DType t, const RunContext& ctx)
      : s_(s), causal_(causal), mask_(mask), stream_(cuda::as_stream(ctx.cuda_stream)), device_(ctx.cuda_device),
        x_(s, t, stream_, device_), scores_(static_cast<std::size_t>(s.batch * s.heads * s.seq * s.seq)) {
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

class Fused final : public Instance {
 public:
  Fused(const Shape& s, bool causal, DType t, const RunContext& ctx)
      : s_(s), causal_(causal), stream_(cuda::as_stream(ctx.cuda_stream)), x_(s, t, stream_, ctx.cuda_device) {
    if (t == DType::bf16) {  // the registry checks the first device; this one may be another (--device)
      int major = 0;
      CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx.cuda_device));
      TB_REQUIRE(major >= 8, "the bf16 tensor-core kernel (mma.sync) needs compute capability 8.0 or newer");
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override { fused_attention(s_, causal_, x_, stream_); }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return check_output(s_, causal_, x_.type, x_.output(s_.elements(), stream_));
  }

 private:
  Shape s_;
  bool causal_;
  cudaStream_t stream_;
  Tensors x_;
};

// ---- the block -----------------------------------------------------------------------------------

__global__ void layernorm_kernel(const float* x, const float* g, const float* b, float* y, int64_t d, float eps) {
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * d;
  float sum = 0;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) sum += xr[c];
  const float mean = block_reduce(sum, false, scratch) / static_cast<float>(d);
  float var = 0;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) var += (xr[c] - mean) * (xr[c] - mean);
  const float inv = rsqrtf(block_reduce(var, false, scratch) / static_cast<float>(d) + eps);
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) y[blockIdx.x * d + c] = (xr[c] - mean) * inv * g[c] + b[c];
}

__global__ void bias_residual_kernel(float* y, const float* bias, const float* residual, int64_t rows, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < rows * n; e += int64_t{gridDim.x} * blockDim.x)
    y[e] = bias[e % n] + (residual ? residual[e] : 0.0f);
}

__global__ void gelu_kernel(float* f, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const float x = f[e];
    f[e] = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
  }
}

// [B, S, 3, H, D] <-> three [B, H, S, D] (to_heads) and [B, H, S, D] -> [B, S, H, D] (back).
__global__ void split_heads_kernel(const float* qkv, float* q, float* k, float* v, int64_t B, int64_t S, int64_t H,
                                   int64_t D) {
  const int64_t dm = H * D, n = B * S * dm;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = e % D, h = (e / D) % H, t = (e / dm) % S, b = e / (dm * S);
    const float* row = qkv + (b * S + t) * 3 * dm;
    const int64_t at = ((b * H + h) * S + t) * D + d;
    q[at] = row[h * D + d];
    k[at] = row[dm + h * D + d];
    v[at] = row[2 * dm + h * D + d];
  }
}

__global__ void merge_heads_kernel(const float* o, float* a, int64_t B, int64_t S, int64_t H, int64_t D) {
  const int64_t dm = H * D, n = B * S * dm;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = e % D, h = (e / D) % H, t = (e / dm) % S, b = e / (dm * S);
    a[e] = o[((b * H + h) * S + t) * D + d];
  }
}

// On the benchmark's stream, not the legacy one, which a non-blocking stream does not wait for; from
// pageable memory the call returns once the source is staged.
template <class T>
cuda::DeviceBuffer<T> upload(const std::vector<T>& host, cudaStream_t stream) {
  cuda::DeviceBuffer<T> d(host.size());
  CUDA_CHECK(cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return d;
}

class Block final : public Instance {
 public:
  Block(const Shape& s, bool fused, const RunContext& ctx)
      : s_(s), fused_(fused), stream_(cuda::as_stream(ctx.cuda_stream)), device_(ctx.cuda_device),
        w_(make_block_weights(s.d_model())), tokens_(s.batch * s.seq), d_(s.d_model()),
        x_(s, DType::fp32, stream_, device_), ln1_g_(upload(w_.ln1_g, stream_)), ln1_b_(upload(w_.ln1_b, stream_)),
        w_qkv_(upload(w_.w_qkv, stream_)), b_qkv_(upload(w_.b_qkv, stream_)), w_out_(upload(w_.w_out, stream_)),
        b_out_(upload(w_.b_out, stream_)), ln2_g_(upload(w_.ln2_g, stream_)), ln2_b_(upload(w_.ln2_b, stream_)),
        w_fc1_(upload(w_.w_fc1, stream_)), b_fc1_(upload(w_.b_fc1, stream_)), w_fc2_(upload(w_.w_fc2, stream_)),
        b_fc2_(upload(w_.b_fc2, stream_)), in_(tokens_ * d_), h_(tokens_ * d_),
        qkv_(tokens_ * 3 * d_), a_(tokens_ * d_), r1_(tokens_ * d_), f_(tokens_ * w_.hidden), y_(tokens_ * d_),
        scores_(fused ? 0 : static_cast<std::size_t>(s.batch * s.heads * s.seq * s.seq)) {
    std::vector<float> x(static_cast<std::size_t>(tokens_ * d_));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = block_input(static_cast<int64_t>(i));
    CUDA_CHECK(cudaMemcpyAsync(in_.data(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
    CUBLAS_CHECK(cublasSetStream(handle_, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override {
    for (int p = 0; p < block_part_count; ++p) run_part(p);
  }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return check_block_output(s_, w_, download_as_float(y_.data(), tokens_ * d_, stream_));
  }
  // Each part timed alone with events (median of 5) after the measurement.
  std::vector<std::pair<std::string, double>> observed() const override {
    auto* self = const_cast<Block*>(this);  // timing a part re-runs it into this instance's buffers
    std::vector<std::pair<std::string, double>> parts;
    cuda::Event begin, end;
    double total = 0, attention = 0;
    for (int p = 0; p < block_part_count; ++p) {
      std::vector<float> ms(5);
      for (auto& m : ms) {
        CUDA_CHECK(cudaEventRecord(begin, stream_));
        self->run_part(p);
        CUDA_CHECK(cudaEventRecord(end, stream_));
        CUDA_CHECK(cudaEventSynchronize(end));
        CUDA_CHECK(cudaEventElapsedTime(&m, begin, end));
      }
      std::sort(ms.begin(), ms.end());
      const double ns = ms[2] * 1e6;
      parts.emplace_back(std::string(block_parts[p]) + "_ns", ns);
      total += ns;
      if (p == 2) attention = ns;
    }
    parts.emplace_back("attention_share", attention / total);
    return parts;
  }

 private:
  // y = x W + bias (+ residual), W [in][out] row-major: column-major y^T = W^T x^T.
  void linear(const float* x, const float* w, const float* bias, float* y, int64_t in, int64_t out,
              const float* residual) {
    bias_residual_kernel<<<cuda::grid_for(tokens_ * out, 256, device_), 256, 0, stream_>>>(y, bias, residual, tokens_, out);
    const float one = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(tokens_),
                              static_cast<int>(in), &one, w, CUDA_R_32F, static_cast<int>(out), x, CUDA_R_32F,
                              static_cast<int>(in), &one, y, CUDA_R_32F, static_cast<int>(out), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  }
  void run_part(int part) {
    const float eps = static_cast<float>(defaults::layernorm_eps);
    const int grid = cuda::grid_for(tokens_ * d_, 256, device_);
    switch (part) {
      case 0: layernorm_kernel<<<static_cast<unsigned>(tokens_), 256, 0, stream_>>>(in_.data(), ln1_g_.data(), ln1_b_.data(), h_.data(), d_, eps); break;
      case 1:
        linear(h_.data(), w_qkv_.data(), b_qkv_.data(), qkv_.data(), d_, 3 * d_, nullptr);
        split_heads_kernel<<<grid, 256, 0, stream_>>>(qkv_.data(), x_.q32.data(), x_.k32.data(), x_.v32.data(),
                                                      s_.batch, s_.seq, s_.heads, s_.head_dim);
        break;
      case 2:
        if (fused_) cuda_fused_forward(s_, x_.operands(s_), nullptr, stream_);
        else cuda_naive_forward(s_, x_.operands(s_), scores_.data(), handle_, stream_);
        break;
      case 3:
        merge_heads_kernel<<<grid, 256, 0, stream_>>>(x_.o32.data(), a_.data(), s_.batch, s_.seq, s_.heads, s_.head_dim);
        linear(a_.data(), w_out_.data(), b_out_.data(), r1_.data(), d_, d_, in_.data());
        break;
      case 4: layernorm_kernel<<<static_cast<unsigned>(tokens_), 256, 0, stream_>>>(r1_.data(), ln2_g_.data(), ln2_b_.data(), h_.data(), d_, eps); break;
      case 5:
        linear(h_.data(), w_fc1_.data(), b_fc1_.data(), f_.data(), d_, w_.hidden, nullptr);
        gelu_kernel<<<cuda::grid_for(tokens_ * w_.hidden, 256, device_), 256, 0, stream_>>>(f_.data(), tokens_ * w_.hidden);
        linear(f_.data(), w_fc2_.data(), b_fc2_.data(), y_.data(), w_.hidden, d_, r1_.data());
        break;
    }
    CUDA_CHECK(cudaGetLastError());
  }

  Shape s_;
  bool fused_;
  cudaStream_t stream_;
  int device_;
  cuda::CublasHandle handle_;
  BlockWeights w_;
  int64_t tokens_, d_;
  Tensors x_;  // q, k, v, o of the attention inside the block
  cuda::DeviceBuffer<float> ln1_g_, ln1_b_, w_qkv_, b_qkv_, w_out_, b_out_, ln2_g_, ln2_b_, w_fc1_, b_fc1_, w_fc2_, b_fc2_;
  cuda::DeviceBuffer<float> in_, h_, qkv_, a_, r1_, f_, y_, scores_;
};

// ---- backward alone ------------------------------------------------------------------------------

// Q, K, V and dO in [B, H, S, D] from the reference's inputs; the forward runs once here (naive keeps
// P, fused keeps O and each row's log-sum-exp), and run() is the backward only, which overwrites the
// gradients: every run computes the same dQ, dK, dV. bf16: fused is the tensor-core backward on bf16
// operands; naive is autograd's backward with its products in bf16 on tensor cores (cuBLAS's
// fp32-storage bf16 mode, the step's bf16 matmuls), the softmax backward in fp32.
class Backward final : public Instance {
 public:
  Backward(const Shape& s, bool fused, DType t, const RunContext& ctx)
      : s_(s), fused_(fused), type_(t), stream_(cuda::as_stream(ctx.cuda_stream)),
        x_(s, fused ? t : DType::fp32, stream_, ctx.cuda_device), dq_(static_cast<std::size_t>(s.elements())),
        dk_(dq_.size()), dv_(dq_.size()),
        probs_(fused ? 0 : static_cast<std::size_t>(s.batch * s.heads * s.seq * s.seq)), dprobs_(probs_.size()),
        lse_(fused ? static_cast<std::size_t>(s.rows()) : 0) {
    const bool tensor_core_fused = fused && t == DType::bf16;
    if (tensor_core_fused) {
      dout16_ = cuda::DeviceBuffer<bf16>(dq_.size());
      cuda::fill_uniform(dout16_.data(), s.elements(), seed_dout, stream_, ctx.cuda_device);
      scratch_ = cuda::DeviceBuffer<float>(static_cast<std::size_t>(cuda_bf16_backward_scratch(s)));
    } else {
      dout_ = cuda::DeviceBuffer<float>(dq_.size());
      cuda::fill_uniform(dout_.data(), s.elements(), seed_dout, stream_, ctx.cuda_device);
      if (fused) scratch_ = cuda::DeviceBuffer<float>(lse_.size());  // delta
    }
    CUBLAS_CHECK(cublasSetStream(handle_, stream_));
    if (tensor_core_fused)
      cuda_bf16_forward(s_, true, x_.bits(x_.q16), x_.bits(x_.k16), x_.bits(x_.v16), x_.bits(x_.o16), lse_.data(), stream_);
    else if (fused) cuda_fused_forward(s_, x_.operands(s_), lse_.data(), stream_);
    else cuda_naive_forward(s_, x_.operands(s_), probs_.data(), handle_, stream_, t == DType::bf16);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override {
    if (fused_ && type_ == DType::bf16) {
      const Bf16Operands x{x_.bits(x_.q16), x_.bits(x_.k16), x_.bits(x_.v16), x_.bits(x_.o16), x_.bits(dout16_)};
      cuda_bf16_backward(s_, true, x, lse_.data(), Gradients<float>{dq_.data(), dk_.data(), dv_.data(), nullptr},
                         bhsd(s_), scratch_.data(), stream_);
      return;
    }
    const Gradients<float> g{dq_.data(), dk_.data(), dv_.data(), dout_.data()};
    if (fused_) cuda_fused_backward(s_, x_.operands(s_), lse_.data(), g, scratch_.data(), stream_);
    else cuda_naive_backward(s_, x_.operands(s_), probs_.data(), g, dprobs_.data(), handle_, stream_, type_ == DType::bf16);
  }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const int64_t n = s_.elements();
    return check_gradients(s_, true, type_, download_as_float(dq_.data(), n, stream_),
                           download_as_float(dk_.data(), n, stream_), download_as_float(dv_.data(), n, stream_));
  }

 private:
  Shape s_;
  bool fused_;
  DType type_;
  cudaStream_t stream_;
  cuda::CublasHandle handle_;
  Tensors x_;
  cuda::DeviceBuffer<float> dq_, dk_, dv_;
  cuda::DeviceBuffer<float> dout_;            // fp32 inputs (and the naive bf16 path, rounded by cuBLAS)
  cuda::DeviceBuffer<bf16> dout16_;           // the tensor-core backward's dO
  cuda::DeviceBuffer<float> probs_, dprobs_;  // naive: P [B, H, S, S] and dP's scratch
  cuda::DeviceBuffer<float> lse_, scratch_;   // fused: lse [B, H, S]; delta (and bf16: the dQ accumulator)
};

}  // namespace

// ---- the kernels as functions over buffers ------------------------------------------------------

void cuda_naive_forward(const Shape& s, const Operands<float>& x, float* probs, cublasContext* handle,
                        CUstream_st* stream, bool bf16_products) {
  if (s.rows() == 0) return;
  const int64_t S = s.seq, D = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const cublasComputeType_t compute = bf16_products ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  const HeadMatrix p = probs_matrix(probs, s);
  // Column-major view of row-major operands: scores^T (S x S) = K Q^T, C[j + i S] = scale sum_d K[j][d] Q[i][d].
  gemm_per_head(handle, s, CUBLAS_OP_T, CUBLAS_OP_N, S, S, D, scale, head_matrix(x.k, x.in), head_matrix(x.q, x.in),
                0.0f, p, compute);
  causal_softmax(s, probs, stream);
  // O^T (D x S) = V^T P^T: C[d + i ld] = sum_j V[j][d] P[i][j].
  gemm_per_head(handle, s, CUBLAS_OP_N, CUBLAS_OP_N, D, S, S, 1.0f, head_matrix(x.v, x.in), p, 0.0f,
                head_matrix(x.o, x.out), compute);
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

void cuda_fused_forward(const Shape& s, const Operands<float>& x, float* lse, CUstream_st* stream) {
  fused_fp32(s, true, x, lse, stream);
}

void cuda_fused_backward(const Shape& s, const Operands<float>& x, const float* lse, const Gradients<float>& g,
                         float* delta, CUstream_st* stream) {
  TB_REQUIRE(s.head_dim <= bwd_max_head_dim, "the fused backward keeps head_dim <= 128 (4 columns per lane)");
  if (s.rows() == 0) return;
  const int H = static_cast<int>(s.heads), S = static_cast<int>(s.seq), D = static_cast<int>(s.head_dim);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  constexpr int delta_rows_per_block = 8;  // a warp per row
  const int64_t delta_blocks = (s.rows() + delta_rows_per_block - 1) / delta_rows_per_block;
  const int64_t key_blocks = (s.seq + bwd_keys - 1) / bwd_keys * s.batch * s.heads;
  const int64_t query_blocks = (s.seq + bwd_rows - 1) / bwd_rows * s.batch * s.heads;
  TB_REQUIRE(delta_blocks <= INT_MAX && key_blocks <= INT_MAX && query_blocks <= INT_MAX,
             "batch x heads x seq too large for the backward's grids (2^31 - 1 blocks)");
  const std::size_t smem = backward_smem_bytes(D);
  allow_shared_bytes(fused_backward_dkdv_kernel, smem, "the fused backward");
  allow_shared_bytes(fused_backward_dq_kernel, smem, "the fused backward");

  row_delta_kernel<<<static_cast<unsigned>(delta_blocks), 32 * delta_rows_per_block, 0, stream>>>(
      x.o, g.dout, delta, x.out, H, S, D, s.rows());
  CUDA_CHECK(cudaGetLastError());
  fused_backward_dkdv_kernel<<<static_cast<unsigned>(key_blocks), bwd_threads, smem, stream>>>(
      x.q, x.k, x.v, g.dout, lse, delta, g.dk, g.dv, x.in, x.out, H, S, D, scale);
  CUDA_CHECK(cudaGetLastError());
  fused_backward_dq_kernel<<<static_cast<unsigned>(query_blocks), bwd_threads, smem, stream>>>(
      x.q, x.k, x.v, g.dout, lse, delta, g.dq, x.in, x.out, H, S, D, scale);
  CUDA_CHECK(cudaGetLastError());
}

// ---- variants ------------------------------------------------------------------------------------

std::unique_ptr<Instance> make_cuda_naive(const Shape& s, bool causal, Mask mask, DType t, const RunContext& ctx) {
  return std::make_unique<Naive>(s, causal, causal ? mask : Mask::none, t, ctx);
}
std::unique_ptr<Instance> make_cuda_fused(const Shape& s, bool causal, DType t, const RunContext& ctx) {
  return std::make_unique<Fused>(s, causal, t, ctx);
}
std::unique_ptr<Instance> make_cuda_block(const Shape& s, bool fused_attention, const RunContext& ctx) {
  return std::make_unique<Block>(s, fused_attention, ctx);
}
std::unique_ptr<Instance> make_cuda_backward(const Shape& s, bool fused, DType t, const RunContext& ctx) {
  return std::make_unique<Backward>(s, fused, t, ctx);
}

}  // namespace tb::attention
