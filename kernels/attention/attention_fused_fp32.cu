// CUDA attention, fused in fp32 on CUDA cores: the forward a warp per query row (K and V tiles in
// shared memory, online softmax, each row's log-sum-exp kept), and FlashAttention-2's backward, P
// recomputed tile by tile from the log-sum-exp. The training step runs them on its packed qkv rows;
// the stage's fp32 `fused` and `backward_fused` rows measure them.
#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "attention_cuda.cuh"
#include "runtime/defaults.h"

namespace tb::attention {

namespace {

// ---- fused fp32: a warp per query row ------------------------------------------------------------

constexpr int f32_rows = fused_fp32_query_rows;                     // query rows (warps) per block
constexpr int f32_keys = 32;                                        // keys per tile: one per lane
constexpr int f32_max_cols = cuda_fused_forward_max_head_dim / 32;  // output columns per lane
constexpr int f32_max_head_dim = 32 * f32_max_cols;

// Each lane scores one key of the tile and owns head_dim/32 output columns; the key tile is shared by
// the block's 8 rows. K rows are padded by one float so lanes reading different keys hit different
// banks. Row i's log-sum-exp of the scaled scores goes to lse[bh * S + i] when lse is set.
__global__ void fused_fp32_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                  float* __restrict__ o, float* __restrict__ lse, Strides in, Strides out, int H, int S,
                                  int D, bool causal, float scale) {
  extern __shared__ float smem[];
  float* ks = smem;                     // [f32_keys][D + 1]
  float* vs = ks + f32_keys * (D + 1);  // [f32_keys][D]
  float* qs = vs + f32_keys * D;        // [f32_rows][D]
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

// ---- fused fp32 backward: FlashAttention-2 ---------------------------------------------------------
// Three kernels, none of which holds more than a tile of the [S, S] matrices: delta = rowsum(dO O)
// per query row; then per (b, h, 32-key tile) a block that walks the query tiles at or after its keys
// (causal) and keeps that tile's dK and dV in registers; then per (b, h, 16-query tile) a block that
// walks the key tiles up to its queries and keeps dQ in registers. Each recomputes the tile's
// P = exp(scale Q K^T - lse) and dS = P (dO V^T - delta); dQ in its own pass instead of atomics
// into a zeroed dQ: deterministic, and every gradient is written once (overwritten), strided or not.

constexpr int bwd_keys = 32;  // keys per tile: one per lane
constexpr int bwd_rows = 16;  // query rows per tile: two per warp
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
      : ks(smem),
        vs(ks + bwd_keys * (D + 1)),
        qs(vs + bwd_keys * (D + 1)),
        dos(qs + bwd_rows * D),
        ps(dos + bwd_rows * D),
        dss(ps + bwd_rows * bwd_keys),
        lse(dss + bwd_rows * bwd_keys),
        delta(lse + bwd_rows) {}
};
std::size_t backward_smem_bytes(int D) {
  return sizeof(float) * (2 * bwd_keys * (D + 1) + 2 * bwd_rows * D + 2 * bwd_rows * bwd_keys + 2 * bwd_rows);
}

// Keys [j0, j0 + 32) of head (b, h) into the K and V tiles; keys past S are zero.
__device__ inline void load_key_tile(BackwardTiles& t, const float* kb, const float* vb, int64_t row_stride, int j0, int S,
                                     int D) {
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
                               const float* __restrict__ delta, float* __restrict__ dk, float* __restrict__ dv, Strides in,
                               Strides out, int H, int S, int D, float scale) {
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
    __syncthreads();                           // the previous pair's tiles are no longer read
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
                             const float* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                             float* __restrict__ dq, Strides in, Strides out, int H, int S, int D, float scale) {
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

}  // namespace

// The fp32 forward, causal or full (the stage's `full` rows run the same kernel with nothing masked).
void fused_fp32(const Shape& s, bool causal, const Operands<float>& x, float* lse, cudaStream_t stream) {
  TB_REQUIRE(s.head_dim <= f32_max_head_dim, "the fp32 fused kernel keeps head_dim/32 <= 8 columns per lane");
  const int S = static_cast<int>(s.seq), D = static_cast<int>(s.head_dim);
  const int64_t blocks = (S + f32_rows - 1) / f32_rows * s.batch * s.heads;
  TB_REQUIRE(blocks <= INT_MAX, "batch x heads x query tiles above the grid's 2^31 - 1 blocks");
  if (blocks == 0) return;
  const std::size_t smem = fp32_smem_bytes(D);
  allow_shared_bytes(fused_fp32_kernel, smem, "the fp32 fused forward");
  fused_fp32_kernel<<<static_cast<unsigned>(blocks), 32 * f32_rows, smem, stream>>>(x.q, x.k, x.v, x.o, lse, x.in, x.out,
                                                                                    static_cast<int>(s.heads), S, D, causal,
                                                                                    1.0f / std::sqrt(static_cast<float>(D)));
  CUDA_CHECK(cudaGetLastError());
}

void cuda_fused_forward(const Shape& s, const Operands<float>& x, float* lse, CUstream_st* stream) {
  fused_fp32(s, true, x, lse, stream);
}

void cuda_fused_backward(const Shape& s, const Operands<float>& x, const float* lse, const Gradients<float>& g, float* delta,
                         CUstream_st* stream) {
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

  row_delta_kernel<<<static_cast<unsigned>(delta_blocks), 32 * delta_rows_per_block, 0, stream>>>(x.o, g.dout, delta, x.out,
                                                                                                  H, S, D, s.rows());
  CUDA_CHECK(cudaGetLastError());
  fused_backward_dkdv_kernel<<<static_cast<unsigned>(key_blocks), bwd_threads, smem, stream>>>(x.q, x.k, x.v, g.dout, lse,
                                                                                               delta, g.dk, g.dv, x.in,
                                                                                               x.out, H, S, D, scale);
  CUDA_CHECK(cudaGetLastError());
  fused_backward_dq_kernel<<<static_cast<unsigned>(query_blocks), bwd_threads, smem, stream>>>(x.q, x.k, x.v, g.dout, lse,
                                                                                               delta, g.dq, x.in, x.out, H,
                                                                                               S, D, scale);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tb::attention
