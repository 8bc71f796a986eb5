// bf16 attention on tensor cores (mma.sync m16n8k16, sm_80 and newer): FlashAttention-2's forward and
// backward, what the stage's `fused` and `backward_fused` rows run at dtype=bf16 and what the training
// step runs when its matmuls are bf16. Operands are bf16 [B, H, S, D]; every product accumulates in
// fp32; P and dS are rounded to bf16 before they become an operand, as FlashAttention does.
//
// The forward: a block owns 128 query rows and walks the key tiles of 64, so each K/V tile fetched
// from L2 serves 128 rows (a 64-row block streams all of K and V for half as many: twice the L2
// traffic per row); at head_dim 128 four warps take 32 rows each, so that each K and V fragment read
// from shared memory feeds two products. The scores stay in registers and become the A operand of P V;
// cp.async copies V(j) during S = Q K(j)^T and K(j+1) during O += P V(j); tiles above the diagonal are
// never loaded, and the query tiles go out heaviest first.
//
// The backward (FlashAttention-2's algorithm 2): delta = rowsum(dO * O) per row; then a block of 8
// warps per (key tile of 128, b, h) keeps K, V of its keys in shared memory and dK, dV in registers
// (16 keys a warp) while it walks the query tiles that see those keys. Each warp computes its slice of
// S^T = K Q^T and dP^T = V dO^T directly, so P^T and dS^T are already the A operands of dV += P^T dO
// and dK += dS^T Q; dS goes through shared memory once for dQ += dS K, which is added into an fp32
// accumulator with atomics (one pass, no recomputation), then scaled and written out.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "attention.h"
#include "runtime/cuda_raii.h"

namespace tb::attention {

namespace {

using bf16 = __nv_bfloat16;

constexpr int tile_keys = cuda_bf16_key_tile;  // keys per tile, forward and backward
constexpr int smem_pad = 8;  // bf16 per shared row: rows 16 B apart mod 128, so ldmatrix's 8 rows hit 8 bank groups
constexpr float log2e = 1.4426950408889634f;

template <int D>
constexpr int smem_stride = D + smem_pad;  // bf16 between shared rows

// sm_80 and newer; below, never write zeros that look like a result (the registry refuses such
// devices; this catches a build or a --device that slipped past it).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define TB_TENSOR_CORES 1
#endif

__device__ inline void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef TB_TENSOR_CORES
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// Four 8x8 bf16 matrices from shared memory: lane l gives the address of row l % 8 of matrix l / 8,
// and receives of each matrix row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (Trans: column l / 4,
// rows 2 (l % 4) and 2 (l % 4) + 1).
template <bool Trans>
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) {
#ifdef TB_TENSOR_CORES
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
  __trap();
#endif
}
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) { ldmatrix_x4<false>(r, row); }
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* row) { ldmatrix_x4<true>(r, row); }

// 16 bytes global -> shared without passing through registers; `valid` false writes zeros (a row
// past S) and reads nothing.
__device__ inline void cp_async_16(bf16* dst, const bf16* src, bool valid) {
#ifdef TB_TENSOR_CORES
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
#else
  __trap();
#endif
}
__device__ inline void cp_async_commit() {
#ifdef TB_TENSOR_CORES
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most `Pending` of this thread's committed groups are still in flight.
template <int Pending>
__device__ inline void cp_async_wait() {
#ifdef TB_TENSOR_CORES
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#endif
}

// 2^x on the special-function unit; 2^-inf = 0, which the masked scores rely on.
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Starts copying rows [r0, r0 + Rows) of a [S, D] bf16 matrix into shared memory (row stride
// smem_stride<D>) with a block of Threads; rows past S become zeros.
template <int D, int Rows, int Threads>
__device__ inline void copy_tile_async(bf16* dst, const bf16* src, int r0, int S) {
  constexpr int chunks = D / 8;  // 16 B each
  static_assert(Rows * chunks % Threads == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < Rows * chunks / Threads; ++i) {
    const int e = static_cast<int>(threadIdx.x) + i * Threads;
    const int r = e / chunks, c = (e % chunks) * 8;
    const bool valid = r0 + r < S;
    cp_async_16(dst + r * smem_stride<D> + c, src + int64_t{valid ? r0 + r : 0} * D + c, valid);
  }
}

// Where lane l points ldmatrix, for the three ways the kernels read an operand (rows of 16 from
// `row0`, 16 columns from `col0`):
//  - a_operand: A (m x k) stored [m][k]: matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15),
//    (m 8-15, k 8-15) are a0..a3.
//  - b_operand: B (k x n) stored [n][k] (K for Q K^T): two n-blocks of 8, b0 b1 of the first then of
//    the second.
//  - b_operand_trans: B (k x n) stored [k][n] (V for P V), with .trans: the same registers.
// a_operand_trans (A stored [k][m], with .trans) is b_operand's addressing: the k index walks rows.
struct LanePoint {
  int row, col;
};
__device__ inline LanePoint a_operand(int lane) { return {(lane % 8) + 8 * ((lane / 8) % 2), 8 * (lane / 16)}; }
__device__ inline LanePoint b_operand(int lane) { return {(lane % 8) + 8 * (lane / 16), 8 * ((lane / 8) % 2)}; }
__device__ inline LanePoint b_operand_trans(int lane) { return {(lane % 8) + 8 * ((lane / 8) % 2), 8 * (lane / 16)}; }
__device__ inline LanePoint a_operand_trans(int lane) { return b_operand(lane); }

// Fragment layouts (PTX m16n8k16, g = lane / 4, t = lane % 4): A a0 (g, 2t..2t+1), a1 (g+8, 2t..),
// a2 (g, 2t+8..), a3 (g+8, 2t+8..); B b0 (k 2t..2t+1, n g), b1 (k 2t+8..2t+9, n g); C c0,c1 (g,
// 2t..2t+1), c2,c3 (g+8, 2t..2t+1). The C fragments of two adjacent n-blocks are exactly the A
// fragments of a k-chunk of 16: a score tile feeds the next product from registers.
__device__ inline void c_to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// acc[16 x N] += A[16 x K] B[K x N]: A from shared rows [m][k] (the warp's 16 rows at `a`), B from
// shared rows [n][k] at `b` (K for Q K^T, Q for K Q^T), K = D.
template <int K, int N>
__device__ inline void mma_a_rows_b_rows(float (&acc)[N / 8][4], const bf16* a, int a_stride, const bf16* b, int b_stride,
                                         int lane) {
  const LanePoint pa = a_operand(lane), pb = b_operand(lane);
#pragma unroll
  for (int kc = 0; kc < K / 16; ++kc) {
    uint32_t af[4];
    ldmatrix_x4(af, a + pa.row * a_stride + kc * 16 + pa.col);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t bf[4];
      ldmatrix_x4(bf, b + (np * 16 + pb.row) * b_stride + kc * 16 + pb.col);
      mma_bf16_16816(acc[2 * np], af, bf[0], bf[1]);
      mma_bf16_16816(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

// acc[16 x N] += A[16 x K] B[K x N]: A from registers (C fragments of a [16 x K] tile), B from shared
// rows [k][n] at `b` (V, dO, Q, K read along their rows), through ldmatrix.trans.
template <int K, int N>
__device__ inline void mma_a_regs_b_trans(float (&acc)[N / 8][4], const float (&a)[K / 8][4], const bf16* b, int b_stride,
                                          int lane) {
  const LanePoint pb = b_operand_trans(lane);
#pragma unroll
  for (int kc = 0; kc < K / 16; ++kc) {
    uint32_t af[4];
    c_to_a(af, a[2 * kc], a[2 * kc + 1]);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, b + (kc * 16 + pb.row) * b_stride + np * 16 + pb.col);
      mma_bf16_16816(acc[2 * np], af, bf[0], bf[1]);
      mma_bf16_16816(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

// Every m-tile's n-blocks n0 and n0 + 1 += its A fragments times one ldmatrix's two B fragment pairs.
template <int MT, int N>
__device__ inline void mma_two_blocks(float (&acc)[MT][N][4], int n0, const uint32_t (&a)[MT][4], const uint32_t (&b)[4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    mma_bf16_16816(acc[mt][n0], a[mt], b[0], b[1]);
    mma_bf16_16816(acc[mt][n0 + 1], a[mt], b[2], b[3]);
  }
}

template <int N>
__device__ inline void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// ---- forward -------------------------------------------------------------------------------------

// A forward block: Warps warps, each owning MT m-tiles of 16 query rows. With MT = 2 every K and V
// fragment read from shared memory feeds two products (FlashAttention-2's 4 warps x 32 rows): a
// 16-row warp reads 32 KiB of K and V per tile for 0.5 MFLOP, which shared memory's bandwidth, not
// the tensor cores, bounds. Q is read back from shared memory at each tile where two m-tiles would
// keep too many registers; one m-tile keeps it in registers.
template <int Warps, int MT>
struct ForwardTiles {
  static constexpr int m_tiles = MT, threads = 32 * Warps, rows = 16 * MT * Warps;
  static constexpr bool q_in_registers = MT == 1;
  static_assert(rows % tile_keys == 0, "a query tile ends on a key tile");
};
using ForwardWide = ForwardTiles<4, 2>;    // head_dim 128: 1.43x the 8 x 16 block's speed on an H100
using ForwardNarrow = ForwardTiles<8, 1>;  // head_dim 64 and 32: 1.04x the 4 x 32 block's (tests/attention_tiles)
static_assert(ForwardWide::rows == fused_bf16_query_rows && ForwardNarrow::rows == fused_bf16_query_rows,
              "attention.h states the block's rows");

// One block per (query tile, batch x head), folded into grid.x heaviest tile first: grid.y would cap
// batch x heads at 65535.
template <int D, class Tiles>
__global__ void __launch_bounds__(Tiles::threads)
    forward_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v, bf16* __restrict__ o,
                   float* __restrict__ lse, int S, int64_t heads_total, bool causal, float scale_log2) {
  constexpr int stride = smem_stride<D>, MT = Tiles::m_tiles, rows = Tiles::rows, threads = Tiles::threads;
  extern __shared__ __align__(16) unsigned char raw[];
  bf16* qs = reinterpret_cast<bf16*>(raw);
  bf16* ks = qs + rows * stride;
  bf16* vs = ks + tile_keys * stride;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int tiles = (S + rows - 1) / rows;
  const int64_t bh = blockIdx.x % heads_total;
  const int q0 = (tiles - 1 - static_cast<int>(blockIdx.x / heads_total)) * rows;
  const int64_t base = bh * S * D;
  const bf16 *qb = q + base, *kb = k + base, *vb = v + base;
  const int key_end = causal ? min(S, q0 + rows) : S;
  const int key_tiles = (key_end + tile_keys - 1) / tile_keys;
  const int warp_row0 = warp * 16 * MT;  // the warp's first row in the block's tile
  const int warp_q0 = q0 + warp_row0, warp_q_last = warp_q0 + 16 * MT - 1;

  copy_tile_async<D, rows, threads>(qs, qb, q0, S);
  copy_tile_async<D, tile_keys, threads>(ks, kb, 0, S);
  cp_async_commit();

  const LanePoint pa = a_operand(lane), pk = b_operand(lane), pv = b_operand_trans(lane);
  uint32_t qa[Tiles::q_in_registers ? D / 16 : 1][4];
  float oacc[MT][D / 8][4];
  float m_row[MT][2], l_row[MT][2];  // [m-tile][row g, row g + 8]: this lane's share of the row sums
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    zero(oacc[mt]);
    m_row[mt][0] = m_row[mt][1] = -INFINITY;
    l_row[mt][0] = l_row[mt][1] = 0.0f;
  }

  for (int j = 0; j < key_tiles; ++j) {
    const int k0 = j * tile_keys;
    cp_async_wait<0>();
    __syncthreads();  // K(j) (and Q) landed for every thread; no warp still reads V(j-1)
    copy_tile_async<D, tile_keys, threads>(vs, vb, k0, S);
    cp_async_commit();
    if constexpr (Tiles::q_in_registers) {
      if (j == 0) {
#pragma unroll
        for (int kc = 0; kc < D / 16; ++kc) ldmatrix_x4(qa[kc], qs + (warp_row0 + pa.row) * stride + kc * 16 + pa.col);
      }
    }
    // Causal: a warp whose queries all precede the tile has nothing to add from it (a block's rows
    // span several key tiles on the diagonal); it still takes part in every barrier.
    const bool visible = !causal || k0 <= warp_q_last;

    float sacc[MT][tile_keys / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) zero(sacc[mt]);
    if (visible) {
      // S = Q K^T: per 16 keys, one ldmatrix gives the B fragments of two n-blocks, used by every m-tile.
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) {
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (Tiles::q_in_registers) {
#pragma unroll
            for (int r = 0; r < 4; ++r) af[mt][r] = qa[kc][r];
          } else {
            ldmatrix_x4(af[mt], qs + (warp_row0 + mt * 16 + pa.row) * stride + kc * 16 + pa.col);
          }
        }
#pragma unroll
        for (int np = 0; np < tile_keys / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, ks + (np * 16 + pk.row) * stride + kc * 16 + pk.col);
          mma_two_blocks(sacc, 2 * np, af, b);
        }
      }
    }

    // Scale into log2 units; mask where a key can be past S or past the warp's first query.
    const bool masked = !visible || k0 + tile_keys > S || (causal && k0 + tile_keys - 1 > warp_q0);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int query_lo = warp_q0 + mt * 16 + g;
      float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < tile_keys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = sacc[mt][n][e] * scale_log2;
          if (masked) {
            const int key = k0 + n * 8 + 2 * t + (e & 1);
            const int query = query_lo + (e < 2 ? 0 : 8);
            if (key >= S || (causal && key > query)) x = -INFINITY;
          }
          sacc[mt][n][e] = x;
          tmax[e / 2] = fmaxf(tmax[e / 2], x);
        }
      float alpha[2], ref[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int off = 1; off < 4; off <<= 1)  // the four lanes of a quad share a row
          tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], off));
        const float next = fmaxf(m_row[mt][h], tmax[h]);
        ref[h] = next == -INFINITY ? 0.0f : next;  // a row with nothing visible yet keeps 2^-inf = 0
        alpha[h] = fast_exp2(m_row[mt][h] - ref[h]);
        m_row[mt][h] = next;
      }
      float sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int n = 0; n < tile_keys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sacc[mt][n][e] = fast_exp2(sacc[mt][n][e] - ref[e / 2]);
          sum[e / 2] += sacc[mt][n][e];
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) l_row[mt][h] = l_row[mt][h] * alpha[h] + sum[h];
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) oacc[mt][n][e] *= alpha[e / 2];
    }

    cp_async_wait<0>();
    __syncthreads();  // V(j) landed for every thread; no warp still reads K(j)
    if (j + 1 < key_tiles) {
      copy_tile_async<D, tile_keys, threads>(ks, kb, k0 + tile_keys, S);
      cp_async_commit();
    }

    // O += P V, P straight from the score registers; per 16 keys, one ldmatrix.trans gives the B
    // fragments of two 8-column blocks of V, used by every m-tile.
    if (visible) {
#pragma unroll
      for (int kc = 0; kc < tile_keys / 16; ++kc) {
        uint32_t pa4[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) c_to_a(pa4[mt], sacc[mt][2 * kc], sacc[mt][2 * kc + 1]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, vs + (kc * 16 + pv.row) * stride + dp * 16 + pv.col);
          mma_two_blocks(oacc, 2 * dp, pa4, b);
        }
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int query_lo = warp_q0 + mt * 16 + g;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) l_row[mt][h] += __shfl_xor_sync(0xffffffffu, l_row[mt][h], off);
      const int query = query_lo + 8 * h;
      if (query >= S) continue;
      const float inv = 1.0f / l_row[mt][h];
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<uint32_t*>(o + base + int64_t{query} * D + n * 8 +
                                     2 * t) = pack_bf16(oacc[mt][n][2 * h] * inv, oacc[mt][n][2 * h + 1] * inv);
      // The row's log-sum-exp of the scaled scores in natural units: m and l are in base 2.
      if (lse != nullptr && t == 0) lse[bh * S + query] = (m_row[mt][h] + __log2f(l_row[mt][h])) * 0.6931471805599453f;
    }
  }
}

template <int D, class Tiles>
constexpr std::size_t forward_smem_bytes() {
  return static_cast<std::size_t>(Tiles::rows + 2 * tile_keys) * smem_stride<D> * sizeof(bf16);
}

// ---- backward ------------------------------------------------------------------------------------

constexpr int bwd_rows = 64;                    // queries per tile
constexpr int ds_stride = bwd_rows + smem_pad;  // dS^T rows [key][query]

// A backward block: Warps warps, 16 keys each (a key tile of 16 x Warps), and for dQ the tile's 64
// queries in 4 groups of 16 by Warps / 4 column parts. A wider key tile fetches each query tile's Q
// and dO once for more keys and adds dQ into the accumulator once for more keys (half the atomics
// at 128 keys), at the cost of one block an SM.
template <int Warps>
struct BackwardTiles {
  static constexpr int threads = 32 * Warps, keys = 16 * Warps, dq_parts = Warps / 4;
  static_assert(Warps % 4 == 0 && keys % bwd_rows == 0, "4 query groups for dQ; a key tile starts on a query tile");
};
using BackwardDefault = BackwardTiles<8>;

// delta[row] = sum_d dO[row][d] O[row][d] in fp32 (FlashAttention-2's D), a warp per row; the dQ
// accumulator's rows are cleared on the way.
__global__ void backward_delta_kernel(const bf16* __restrict__ o, const bf16* __restrict__ dout, float* __restrict__ delta,
                                      float* __restrict__ dq_accum, int D, int64_t rows) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= rows) return;
  float sum = 0.0f;
  for (int d = lane; d < D; d += 32) {
    sum += __bfloat162float(o[row * D + d]) * __bfloat162float(dout[row * D + d]);
    dq_accum[row * D + d] = 0.0f;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) delta[row] = sum;
}

// 16 x N fp32 C fragments added into rows [row0, row0 + 16) of an fp32 [S, D] accumulator at column
// col0; rows past S are skipped.
template <int N, int D>
__device__ inline void atomic_add_rows(float* accum, const float (&acc)[N / 8][4], int row0, int col0, int S, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + g + 8 * half;
      if (row >= S) continue;
      float* at = accum + int64_t{row} * D + col0 + n * 8 + 2 * t;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float2*>(at), make_float2(acc[n][2 * half], acc[n][2 * half + 1]));
#else
      atomicAdd(at, acc[n][2 * half]);
      atomicAdd(at + 1, acc[n][2 * half + 1]);
#endif
    }
}

// One block per (key tile, batch x head), heaviest first (causal: key tile 0 is seen by every query
// tile). Warp w: keys w*16.. of the tile for S^T, dP^T, dK, dV; for dQ, queries 16 (w % 4).. of the
// query tile and its column part w / 4. lse and delta arrive per query tile; a query row past S gets
// lse = +inf, so its P (and with it every contribution) is 0.
template <int D, class Tiles>
__global__ void __launch_bounds__(Tiles::threads)
    backward_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                    const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                    float* __restrict__ dq_accum, float* __restrict__ dk, float* __restrict__ dv, Strides grads, int H,
                    int S, int64_t heads_total, bool causal, float scale) {
  constexpr int stride = smem_stride<D>, keys = Tiles::keys, threads = Tiles::threads;
  extern __shared__ __align__(16) unsigned char raw[];
  bf16* ks = reinterpret_cast<bf16*>(raw);
  bf16* vs = ks + keys * stride;
  bf16* qs = vs + keys * stride;
  bf16* dos = qs + bwd_rows * stride;
  bf16* dst = dos + bwd_rows * stride;  // dS^T [key][query]
  float* lse_s = reinterpret_cast<float*>(dst + keys * ds_stride);
  float* delta_s = lse_s + bwd_rows;

  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t bh = blockIdx.x % heads_total;
  const int k0 = static_cast<int>(blockIdx.x / heads_total) * keys;
  const int64_t base = bh * S * D;
  const float scale_log2 = scale * log2e;

  copy_tile_async<D, keys, threads>(ks, k + base, k0, S);
  copy_tile_async<D, keys, threads>(vs, v + base, k0, S);
  cp_async_commit();

  float dk_acc[D / 8][4], dv_acc[D / 8][4];
  zero(dk_acc);
  zero(dv_acc);
  const bf16* my_keys = ks + warp * 16 * stride;
  const bf16* my_values = vs + warp * 16 * stride;
  const int key_lo = k0 + warp * 16 + g, key_hi = key_lo + 8;
  const int tiles = (S + bwd_rows - 1) / bwd_rows;

  for (int i = causal ? k0 / bwd_rows : 0; i < tiles; ++i) {
    const int q0 = i * bwd_rows;
    __syncthreads();  // every warp is done with the previous tile's Q, dO and dS^T
    copy_tile_async<D, bwd_rows, threads>(qs, q + base, q0, S);
    cp_async_commit();
    copy_tile_async<D, bwd_rows, threads>(dos, dout + base, q0, S);
    cp_async_commit();
    if (tid < bwd_rows) {
      const bool valid = q0 + tid < S;
      lse_s[tid] = valid ? lse[bh * S + q0 + tid] * log2e : INFINITY;
      delta_s[tid] = valid ? delta[bh * S + q0 + tid] : 0.0f;
    }
    cp_async_wait<1>();  // this thread's Q (and, on the first tile, K and V) copies landed
    __syncthreads();

    // Causal: a warp whose 16 keys all follow the tile's last query gets P = dS = 0 and skips its
    // products; it still writes its (zero) rows of dS^T and takes part in every barrier.
    const bool visible = !causal || k0 + warp * 16 <= q0 + bwd_rows - 1;
    const bool diagonal = causal && q0 < k0 + keys - 1;  // some key of the tile follows some query

    // P^T = exp2(scale_log2 K Q^T - lse): the warp's 16 keys x the tile's 64 queries.
    float p[bwd_rows / 8][4];
    zero(p);
    if (visible) {
      mma_a_rows_b_rows<D, bwd_rows>(p, my_keys, stride, qs, stride, lane);
#pragma unroll
      for (int n = 0; n < bwd_rows / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n * 8 + 2 * t + (e & 1);
          const int key = e < 2 ? key_lo : key_hi;
          const float x = p[n][e] * scale_log2 - lse_s[col];
          p[n][e] = diagonal && key > q0 + col ? 0.0f : fast_exp2(x);
        }
    }

    cp_async_wait<0>();
    __syncthreads();  // dO landed for every thread

    // dP^T = V dO^T, then dV += P^T dO.
    float ds[bwd_rows / 8][4];
    zero(ds);
    if (visible) {
      mma_a_rows_b_rows<D, bwd_rows>(ds, my_values, stride, dos, stride, lane);
      mma_a_regs_b_trans<bwd_rows, D>(dv_acc, p, dos, stride, lane);
    }
    // dS^T = P^T (dP^T - delta), kept in bf16 for dK here and for dQ through shared memory.
#pragma unroll
    for (int n = 0; n < bwd_rows / 8; ++n) {
      const int col = n * 8 + 2 * t;
      ds[n][0] = p[n][0] * (ds[n][0] - delta_s[col]);
      ds[n][1] = p[n][1] * (ds[n][1] - delta_s[col + 1]);
      ds[n][2] = p[n][2] * (ds[n][2] - delta_s[col]);
      ds[n][3] = p[n][3] * (ds[n][3] - delta_s[col + 1]);
      *reinterpret_cast<uint32_t*>(dst + (warp * 16 + g) * ds_stride + col) = pack_bf16(ds[n][0], ds[n][1]);
      *reinterpret_cast<uint32_t*>(dst + (warp * 16 + g + 8) * ds_stride + col) = pack_bf16(ds[n][2], ds[n][3]);
    }
    if (visible) mma_a_regs_b_trans<bwd_rows, D>(dk_acc, ds, qs, stride, lane);
    __syncthreads();  // dS^T complete

    // dQ (16 queries, one column part) += dS K over the tile's keys, in column chunks of at most 64 to
    // bound the live registers; A is dS stored transposed, read with ldmatrix.trans. Causal: keys past
    // the tile's last query contribute nothing (their dS is 0), so the loop stops before them.
    constexpr int part_cols = D / Tiles::dq_parts, dq_cols = part_cols < 64 ? part_cols : 64;
    const int dq_row0 = (warp % 4) * 16, dq_col0 = (warp / 4) * part_cols;
    const int key_chunks = causal ? min(keys / 16, (q0 + bwd_rows - k0 + 15) / 16) : keys / 16;
    const LanePoint pa = a_operand_trans(lane), pb = b_operand_trans(lane);
#pragma unroll
    for (int c0 = dq_col0; c0 < dq_col0 + part_cols; c0 += dq_cols) {
      float dq[dq_cols / 8][4];
      zero(dq);
#pragma unroll
      for (int kc = 0; kc < keys / 16; ++kc) {
        if (kc >= key_chunks) break;
        uint32_t af[4];
        ldmatrix_x4_trans(af, dst + (kc * 16 + pa.row) * ds_stride + dq_row0 + pa.col);
#pragma unroll
        for (int np = 0; np < dq_cols / 16; ++np) {
          uint32_t bf[4];
          ldmatrix_x4_trans(bf, ks + (kc * 16 + pb.row) * stride + c0 + np * 16 + pb.col);
          mma_bf16_16816(dq[2 * np], af, bf[0], bf[1]);
          mma_bf16_16816(dq[2 * np + 1], af, bf[2], bf[3]);
        }
      }
      atomic_add_rows<dq_cols, D>(dq_accum + base, dq, q0 + dq_row0, c0, S, lane);
    }
  }

  // dK (scaled) and dV of the warp's keys, in fp32, laid out as `grads`.
  const int64_t b = bh / H, h = bh % H;
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = half ? key_hi : key_lo;
      if (key >= S) continue;
      const int64_t at = b * grads.batch + h * grads.head + int64_t{key} * grads.row + n * 8 + 2 * t;
      *reinterpret_cast<float2*>(dk + at) = make_float2(dk_acc[n][2 * half] * scale, dk_acc[n][2 * half + 1] * scale);
      *reinterpret_cast<float2*>(dv + at) = make_float2(dv_acc[n][2 * half], dv_acc[n][2 * half + 1]);
    }
}

template <int D, class Tiles>
constexpr std::size_t backward_smem_bytes() {
  return static_cast<std::size_t>(2 * Tiles::keys + 2 * bwd_rows) * smem_stride<D> * sizeof(bf16) +
         static_cast<std::size_t>(Tiles::keys) * ds_stride * sizeof(bf16) + 2 * bwd_rows * sizeof(float);
}

// The layout changes below move four elements a thread (head dims are multiples of 8 here, the row
// and head strides multiples of 4) with 32-bit index arithmetic: per-element 64-bit divisions held
// the first versions to a quarter of the copy bandwidth. Callers check `vectorizable` first.
struct Quad {  // the bf16 [B, H, S, D] element 4q, and where it lives in a strided layout
  uint32_t row, d;
  __device__ Quad(uint32_t q, uint32_t quads_per_row) : row(q / quads_per_row), d(q % quads_per_row * 4) {}
  __device__ int64_t strided(const Strides& st, uint32_t H, uint32_t S) const {
    const uint32_t bh = row / S, s = row % S;
    return int64_t{bh / H} * st.batch + int64_t{bh % H} * st.head + int64_t{s} * st.row + d;
  }
};

// dQ = scale * the accumulator, into its layout.
__global__ void backward_dq_kernel(const float* __restrict__ dq_accum, float* __restrict__ dq, Strides grads, uint32_t H,
                                   uint32_t S, uint32_t D, float scale, uint32_t quads) {
  for (uint32_t q = blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += gridDim.x * blockDim.x) {
    float4 x = reinterpret_cast<const float4*>(dq_accum)[q];
    x.x *= scale, x.y *= scale, x.z *= scale, x.w *= scale;
    *reinterpret_cast<float4*>(dq + Quad(q, D / 4).strided(grads, H, S)) = x;
  }
}

// fp32 rows laid out as `st` <-> bf16 [B, H, S, D].
__global__ void pack_kernel(const float* __restrict__ src, Strides st, bf16* __restrict__ dst, uint32_t H, uint32_t S,
                            uint32_t D, uint32_t quads) {
  for (uint32_t q = blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += gridDim.x * blockDim.x) {
    const float4 x = *reinterpret_cast<const float4*>(src + Quad(q, D / 4).strided(st, H, S));
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(dst + int64_t{q} * 4);
    out[0] = __floats2bfloat162_rn(x.x, x.y);
    out[1] = __floats2bfloat162_rn(x.z, x.w);
  }
}
__global__ void unpack_kernel(const bf16* __restrict__ src, float* __restrict__ dst, Strides st, uint32_t H, uint32_t S,
                              uint32_t D, uint32_t quads) {
  for (uint32_t q = blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += gridDim.x * blockDim.x) {
    const __nv_bfloat162* in = reinterpret_cast<const __nv_bfloat162*>(src + int64_t{q} * 4);
    const float2 lo = __bfloat1622float2(in[0]), hi = __bfloat1622float2(in[1]);
    *reinterpret_cast<float4*>(dst + Quad(q, D / 4).strided(st, H, S)) = make_float4(lo.x, lo.y, hi.x, hi.y);
  }
}

// Whether the four-at-a-time kernels above take this shape and fp32 layout.
bool vectorizable(const Shape& s, const Strides& st, const void* fp32) {
  const bool aligned = reinterpret_cast<std::uintptr_t>(fp32) % 16 == 0;
  return aligned && s.head_dim % 4 == 0 && st.batch % 4 == 0 && st.head % 4 == 0 && st.row % 4 == 0 &&
         s.elements() / 4 < (int64_t{1} << 31) && s.rows() < (int64_t{1} << 31);
}

unsigned elementwise_grid(int64_t n) {
  constexpr int64_t most = 132 * 16;  // enough blocks to fill any current GPU; the loops stride
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, most)));
}

const bf16* as_bf16(const bf16_bits* p) { return reinterpret_cast<const bf16*>(p); }
bf16* as_bf16(bf16_bits* p) { return reinterpret_cast<bf16*>(p); }

// Every launch raises its kernel's shared memory limit: cheap, and legal during stream capture.
template <class Kernel>
void allow_shared(Kernel kernel, std::size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int D, class Tiles>
void launch_forward(const Shape& s, bool causal, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o,
                    float* lse, cudaStream_t stream) {
  const int S = static_cast<int>(s.seq);
  const int64_t bhs = s.batch * s.heads;
  const auto grid = static_cast<unsigned>((S + Tiles::rows - 1) / Tiles::rows * bhs);
  const float scale_log2 = log2e / std::sqrt(static_cast<float>(D));
  constexpr std::size_t smem = forward_smem_bytes<D, Tiles>();
  allow_shared(forward_kernel<D, Tiles>, smem);
  forward_kernel<D, Tiles><<<grid, Tiles::threads, smem, stream>>>(as_bf16(q), as_bf16(k), as_bf16(v), as_bf16(o), lse, S,
                                                                   bhs, causal, scale_log2);
  CUDA_CHECK(cudaGetLastError());
}

template <class Tiles>
void forward_with(const Shape& s, bool causal, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o,
                  float* lse, cudaStream_t stream) {
  switch (s.head_dim) {
    case 32:
      return launch_forward<32, Tiles>(s, causal, q, k, v, o, lse, stream);
    case 64:
      return launch_forward<64, Tiles>(s, causal, q, k, v, o, lse, stream);
    default:
      return launch_forward<128, Tiles>(s, causal, q, k, v, o, lse, stream);
  }
}

template <int D, class Tiles>
void launch_backward(const Shape& s, bool causal, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                     const bf16_bits* dout, const float* lse, const float* delta, float* dq_accum, float* dk, float* dv,
                     const Strides& grads, cudaStream_t stream) {
  const int S = static_cast<int>(s.seq);
  const int64_t bhs = s.batch * s.heads;
  const auto grid = static_cast<unsigned>((S + Tiles::keys - 1) / Tiles::keys * bhs);
  constexpr std::size_t smem = backward_smem_bytes<D, Tiles>();
  allow_shared(backward_kernel<D, Tiles>, smem);
  backward_kernel<D, Tiles><<<grid, Tiles::threads, smem, stream>>>(as_bf16(q), as_bf16(k), as_bf16(v), as_bf16(dout), lse,
                                                                    delta, dq_accum, dk, dv, grads,
                                                                    static_cast<int>(s.heads), S, bhs, causal,
                                                                    1.0f / std::sqrt(static_cast<float>(D)));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

namespace {
// The default by head size: the wide block's second m-tile pays where a K/V row is 256 B; at 128 B
// the 8-warp block's occupancy won (interleaved on an H100, 2026-11-26).
void forward_default(const Shape& s, bool causal, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o,
                     float* lse, cudaStream_t stream) {
  if (s.head_dim == 128) forward_with<ForwardWide>(s, causal, q, k, v, o, lse, stream);
  else forward_with<ForwardNarrow>(s, causal, q, k, v, o, lse, stream);
}
// The forward's tilings: the default, each block it chooses from, and the 64-row block before them.
using ForwardLauncher = void (*)(const Shape&, bool, const bf16_bits*, const bf16_bits*, const bf16_bits*, bf16_bits*,
                                 float*, cudaStream_t);
const std::pair<const char*, ForwardLauncher> forward_tilings[] = {
    {"default", forward_default},
    {"128 rows: 4 warps x 32", forward_with<ForwardWide>},
    {"128 rows: 8 warps x 16", forward_with<ForwardNarrow>},
    {"64 rows: 4 warps x 16", forward_with<ForwardTiles<4, 1>>},
};
}  // namespace

std::vector<std::string> cuda_bf16_forward_tilings() {
  std::vector<std::string> names;
  for (const auto& [name, launch] : forward_tilings) names.emplace_back(name);
  return names;
}

void cuda_bf16_forward_tiled(std::size_t tiling, const Shape& s, bool causal, const bf16_bits* q, const bf16_bits* k,
                             const bf16_bits* v, bf16_bits* o, float* lse, CUstream_st* stream) {
  const std::string why = cuda_bf16_reason(s);
  TB_REQUIRE(why.empty(), why);
  TB_REQUIRE(tiling < std::size(forward_tilings), "no forward tiling " + std::to_string(tiling));
  if (s.rows() == 0) return;
  forward_tilings[tiling].second(s, causal, q, k, v, o, lse, stream);
}

void cuda_bf16_forward(const Shape& s, bool causal, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o,
                       float* lse, CUstream_st* stream) {
  cuda_bf16_forward_tiled(0, s, causal, q, k, v, o, lse, stream);
}

// The accumulator starts 16 B aligned after delta: its rows take float2 atomics.
static int64_t delta_floats(const Shape& s) { return (s.rows() + 3) / 4 * 4; }
int64_t cuda_bf16_backward_scratch(const Shape& s) { return delta_floats(s) + s.elements(); }

namespace {
template <class Tiles>
void backward_with(const Shape& s, bool causal, const Bf16Operands& x, const float* lse, const float* delta, float* dq_accum,
                   const Gradients<float>& g, const Strides& grads, cudaStream_t stream) {
  switch (s.head_dim) {
    case 32:
      return launch_backward<32, Tiles>(s, causal, x.q, x.k, x.v, x.dout, lse, delta, dq_accum, g.dk, g.dv, grads, stream);
    case 64:
      return launch_backward<64, Tiles>(s, causal, x.q, x.k, x.v, x.dout, lse, delta, dq_accum, g.dk, g.dv, grads, stream);
    default:
      return launch_backward<128, Tiles>(s, causal, x.q, x.k, x.v, x.dout, lse, delta, dq_accum, g.dk, g.dv, grads, stream);
  }
}
// The backward's tilings: the default (128 keys a block), and the 64-key block it replaced.
using BackwardLauncher = void (*)(const Shape&, bool, const Bf16Operands&, const float*, const float*, float*,
                                  const Gradients<float>&, const Strides&, cudaStream_t);
const std::pair<const char*, BackwardLauncher> backward_tilings[] = {
    {"default: 128 keys, 8 warps x 16", backward_with<BackwardDefault>},
    {"64 keys: 4 warps x 16", backward_with<BackwardTiles<4>>},
};
}  // namespace

std::vector<std::string> cuda_bf16_backward_tilings() {
  std::vector<std::string> names;
  for (const auto& [name, launch] : backward_tilings) names.emplace_back(name);
  return names;
}

void cuda_bf16_backward(const Shape& s, bool causal, const Bf16Operands& x, const float* lse, const Gradients<float>& g,
                        const Strides& grads, float* scratch, CUstream_st* stream) {
  cuda_bf16_backward_tiled(0, s, causal, x, lse, g, grads, scratch, stream);
}

void cuda_bf16_backward_tiled(std::size_t tiling, const Shape& s, bool causal, const Bf16Operands& x, const float* lse,
                              const Gradients<float>& g, const Strides& grads, float* scratch, CUstream_st* stream) {
  const std::string why = cuda_bf16_reason(s);
  TB_REQUIRE(why.empty(), why);
  TB_REQUIRE(tiling < std::size(backward_tilings), "no backward tiling " + std::to_string(tiling));
  if (s.rows() == 0) return;
  TB_REQUIRE(vectorizable(s, grads, g.dq), "the bf16 backward's dQ layout must be 16-byte aligned, strides of 4");
  float* delta = scratch;
  float* dq_accum = scratch + delta_floats(s);
  constexpr int delta_rows_per_block = 8;  // a warp per row
  backward_delta_kernel<<<static_cast<unsigned>((s.rows() + delta_rows_per_block - 1) / delta_rows_per_block),
                          32 * delta_rows_per_block, 0, stream>>>(as_bf16(x.o), as_bf16(x.dout), delta, dq_accum,
                                                                  static_cast<int>(s.head_dim), s.rows());
  CUDA_CHECK(cudaGetLastError());
  backward_tilings[tiling].second(s, causal, x, lse, delta, dq_accum, g, grads, stream);
  backward_dq_kernel<<<elementwise_grid(s.elements() / 4), 256, 0, stream>>>(
      dq_accum, g.dq, grads, static_cast<uint32_t>(s.heads), static_cast<uint32_t>(s.seq), static_cast<uint32_t>(s.head_dim),
      1.0f / std::sqrt(static_cast<float>(s.head_dim)), static_cast<uint32_t>(s.elements() / 4));
  CUDA_CHECK(cudaGetLastError());
}

void cuda_pack_bf16(const Shape& s, const float* src, const Strides& from, bf16_bits* dst, CUstream_st* stream) {
  if (s.elements() == 0) return;
  TB_REQUIRE(vectorizable(s, from, src), "bf16 packing needs 16-byte aligned fp32 rows with strides of 4");
  pack_kernel<<<elementwise_grid(s.elements() / 4), 256, 0, stream>>>(src, from, as_bf16(dst),
                                                                      static_cast<uint32_t>(s.heads),
                                                                      static_cast<uint32_t>(s.seq),
                                                                      static_cast<uint32_t>(s.head_dim),
                                                                      static_cast<uint32_t>(s.elements() / 4));
  CUDA_CHECK(cudaGetLastError());
}

void cuda_unpack_bf16(const Shape& s, const bf16_bits* src, float* dst, const Strides& to, CUstream_st* stream) {
  if (s.elements() == 0) return;
  TB_REQUIRE(vectorizable(s, to, dst), "bf16 unpacking needs 16-byte aligned fp32 rows with strides of 4");
  unpack_kernel<<<elementwise_grid(s.elements() / 4), 256, 0, stream>>>(as_bf16(src), dst, to,
                                                                        static_cast<uint32_t>(s.heads),
                                                                        static_cast<uint32_t>(s.seq),
                                                                        static_cast<uint32_t>(s.head_dim),
                                                                        static_cast<uint32_t>(s.elements() / 4));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tb::attention
