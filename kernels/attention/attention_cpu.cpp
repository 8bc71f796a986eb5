// CPU attention. naive: the PyTorch eager path, scores [B, H, S, S] materialised by BLAS, then mask,
// softmax, and a second BLAS GEMM; its backward reads the saved probabilities. fused: the blocked online
// softmax of attention_cpu_blocked.inc in AVX-512 or AVX2 micro-kernels where the CPU has them, else
// tiles of 64 queries against their keys by BLAS products (here): either way the scores of a block in a
// thread's cache and never [S, S], causal keys past a block never computed; the backward
// (FlashAttention-2) recomputes P from each row's log-sum-exp.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

#include "attention.h"
#include "attention_cpu_blocked.h"
#include "layers/layers.h"
#include "runtime/cpu_blas.h"
#include "runtime/cpu_clones.h"
#include "runtime/defaults.h"
#include "runtime/host_buffer.h"
#include "runtime/simd_math.h"
#include "runtime/stats.h"

namespace tb::attention {

namespace {

constexpr int64_t tile_rows = 64;  // queries per tile
constexpr int64_t tile_cols = 64;  // keys per tile
constexpr float neg_inf = -std::numeric_limits<float>::infinity();

void fill_inputs(const Shape& s, HostBuffer<float>& q, HostBuffer<float>& k, HostBuffer<float>& v) {
  float *pq = q.data(), *pk = k.data(), *pv = v.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < s.elements(); ++i) {
    pq[i] = input_q(i, DType::fp32);
    pk[i] = input_k(i, DType::fp32);
    pv[i] = input_v(i, DType::fp32);
  }
}

std::vector<float> to_vector(const HostBuffer<float>& b) { return std::vector<float>(b.data(), b.data() + b.size()); }

// x[j] = exp(x[j] - shift) for j < n, returning the sum: the softmax's exponentials, 8 at a time, as
// vectorised softmaxes do. Arguments below -87.3 (masked scores) give exactly 0.
TB_CPU_CLONES float exp_shifted_sum(float* x, int64_t n, float shift) {
  simd::vf8 total = {};
  int64_t j = 0;
  for (; j + simd::lanes <= n; j += simd::lanes) {
    const simd::vf8 y = simd::exp8(simd::load8(x + j) - shift);
    simd::store8(x + j, y);
    total += y;
  }
  float sum = 0;
  for (int c = 0; c < simd::lanes; ++c) sum += total[c];
  for (; j < n; ++j) sum += (x[j] = std::exp(x[j] - shift));
  return sum;
}

// ---- naive -----------------------------------------------------------------------------------------

using blas::gemm;

// Below about 2M multiply-adds (a few heads of a short sequence) a parallel region costs more than it
// saves: its fork and barriers take tens of microseconds, milliseconds when ranks share the cores.
bool worth_threads(const Shape& s) { return s.batch * s.heads * s.seq * s.seq * s.head_dim >= (int64_t{1} << 21); }

// (b, h) of flat head index bh, and the offsets of its rows in an operand.
int64_t head_offset(const Shape& s, const Strides& st, int64_t bh) {
  return bh / s.heads * st.batch + bh % s.heads * st.head;
}

}  // namespace

// Scores, mask, softmax and P V as PyTorch eager runs them: each a pass over all heads. The products
// go head by head over the team (one small GEMM per thread, as a batched matmul splits them).
void cpu_naive_forward(const Shape& s, Mask mask, const Operands<float>& x, float* probs, const uint8_t* cached_mask,
                       int64_t mask_ld) {
  const int64_t S = s.seq, D = s.head_dim, bhs = s.batch * s.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel for schedule(static) if (worth_threads(s))
  for (int64_t bh = 0; bh < bhs; ++bh) {
    const int64_t in = head_offset(s, x.in, bh);
    gemm(false, true, S, S, D, scale, x.q + in, x.in.row, x.k + in, x.in.row, 0.0f, probs + bh * S * S, S);
  }

  if (mask == Mask::rebuilt) {
    // torch.triu(torch.ones(S, S), diagonal=1).bool() on every forward: a fresh allocation and fill.
    std::vector<uint8_t> fresh(static_cast<std::size_t>(S * S));
#pragma omp parallel for schedule(static) if (worth_threads(s))
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < S; ++j) fresh[i * S + j] = j > i;
    cached_mask = fresh.data();
    mask_ld = S;
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(s))
    for (int64_t bh = 0; bh < bhs; ++bh)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j)
          if (cached_mask[i * mask_ld + j]) probs[(bh * S + i) * S + j] = neg_inf;
  } else if (mask == Mask::cached) {  // masked_fill with a slice of the registered buffer
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(s))
    for (int64_t bh = 0; bh < bhs; ++bh)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j)
          if (cached_mask[i * mask_ld + j]) probs[(bh * S + i) * S + j] = neg_inf;
  }

#pragma omp parallel for schedule(static) if (worth_threads(s))
  for (int64_t r = 0; r < bhs * S; ++r) {
    float* row = probs + r * S;
    // implicit causal: keys after the query are skipped (and zeroed for the P V product).
    const int64_t n = mask == Mask::implicit ? r % S + 1 : S;
    float mx = neg_inf;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
    const float sum = exp_shifted_sum(row, n, mx);
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    for (int64_t j = n; j < S; ++j) row[j] = 0.0f;
  }

#pragma omp parallel for schedule(static) if (worth_threads(s))
  for (int64_t bh = 0; bh < bhs; ++bh)
    gemm(false, false, S, D, S, 1.0f, probs + bh * S * S, S, x.v + head_offset(s, x.in, bh), x.in.row, 0.0f,
         x.o + head_offset(s, x.out, bh), x.out.row);
}

// Autograd's backward of softmax(scale Q K^T) V from the saved probabilities: dV = P^T dO,
// dP = dO V^T, dS = P (dP - rowsum(dP P)), dQ = scale dS K, dK = scale dS^T Q. dprobs [B, H, S, S].
void cpu_naive_backward(const Shape& s, const Operands<float>& x, const float* probs, const Gradients<float>& g,
                        float* dprobs) {
  const int64_t S = s.seq, D = s.head_dim, bhs = s.batch * s.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel for schedule(static) if (worth_threads(s))
  for (int64_t bh = 0; bh < bhs; ++bh) {
    const int64_t in = head_offset(s, x.in, bh), out = head_offset(s, x.out, bh);
    const float* p = probs + bh * S * S;
    float* dp = dprobs + bh * S * S;
    gemm(false, true, S, S, D, 1.0f, g.dout + out, x.out.row, x.v + in, x.in.row, 0.0f, dp, S);
    gemm(true, false, S, D, S, 1.0f, p, S, g.dout + out, x.out.row, 0.0f, g.dv + in, x.in.row);
    for (int64_t i = 0; i < S; ++i) {
      float* drow = dp + i * S;
      const float* prow = p + i * S;
      float dot = 0;
      for (int64_t j = 0; j < S; ++j) dot += drow[j] * prow[j];
      for (int64_t j = 0; j < S; ++j) drow[j] = prow[j] * (drow[j] - dot);
    }
    gemm(false, false, S, D, S, scale, dp, S, x.k + in, x.in.row, 0.0f, g.dq + in, x.in.row);
    gemm(true, false, S, D, S, scale, dp, S, x.q + in, x.in.row, 0.0f, g.dk + in, x.in.row);
  }
}

namespace {

// ---- fused -----------------------------------------------------------------------------------------

// One thread's scratch: the scores of a tile of 64 queries against every key they see (forward), or
// P and dP of a tile of 64 keys against every query that sees them and each row's delta (backward).
int64_t forward_scratch(int64_t S) { return tile_rows * S; }
int64_t backward_scratch(int64_t S) { return 2 * S * tile_cols + S; }

// x[j] = exp(x[j] - shift) for j < n: P of one row of a key tile from its scores and the row's lse.
void exp_shifted(float* x, int64_t n, float shift) { exp_shifted_sum(x, n, shift); }

}  // namespace

// Each thread's part starts on its own 64-byte line (16 floats): the blocked kernels' vectors load it.
FusedWorkspace::FusedWorkspace(int64_t head_dim, int64_t seq)
    : head_dim_(head_dim),
      seq_(seq),
      per_thread_((std::max({forward_scratch(seq), backward_scratch(seq), blocked::scratch_floats(head_dim),
                             blocked::backward_scratch_floats(head_dim, seq)}) +
                   15) /
                  16 * 16),
      threads_(omp_get_max_threads()) {
  buffer_ = new (std::align_val_t{64}) float[static_cast<std::size_t>(per_thread_ * threads_)];
}
FusedWorkspace::FusedWorkspace(FusedWorkspace&& o) noexcept
    : head_dim_(o.head_dim_), seq_(o.seq_), per_thread_(o.per_thread_), buffer_(o.buffer_), threads_(o.threads_) {
  o.buffer_ = nullptr;
}
FusedWorkspace& FusedWorkspace::operator=(FusedWorkspace&& o) noexcept {
  std::swap(head_dim_, o.head_dim_);
  std::swap(seq_, o.seq_);
  std::swap(per_thread_, o.per_thread_);
  std::swap(buffer_, o.buffer_);
  std::swap(threads_, o.threads_);
  return *this;
}
FusedWorkspace::~FusedWorkspace() { ::operator delete[](buffer_, std::align_val_t{64}); }
float* FusedWorkspace::for_thread(int thread) { return buffer_ + per_thread_ * thread; }
int64_t FusedWorkspace::bytes() const { return static_cast<int64_t>(sizeof(float)) * per_thread_ * threads_; }

// Tiles of 64 queries against every key they may see: the scores by one BLAS product into the
// thread's scratch, an exact softmax per row (its log-sum-exp kept for backward), P V by a second
// product straight into O. The scores of a head never exist beyond one tile (64 x S, in the cache),
// and causal tiles skip the keys after their last query. Dynamic scheduling: with a causal mask the
// last tiles of a head have many times the work of the first.
static void blas_tiles_forward(const Shape& s, bool causal, const Operands<float>& x, float* lse, FusedWorkspace& ws) {
  const int64_t S = s.seq, D = s.head_dim, bhs = s.batch * s.heads, tiles = (S + tile_rows - 1) / tile_rows;
  const int64_t ld = x.in.row, ldo = x.out.row;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel for collapse(2) schedule(dynamic) if (worth_threads(s))
  for (int64_t bh = 0; bh < bhs; ++bh)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t in = head_offset(s, x.in, bh), i0 = t * tile_rows, rows = std::min(tile_rows, S - i0);
      const int64_t keys = causal ? i0 + rows : S;
      float* scores = ws.for_thread(omp_get_thread_num());
      gemm(false, true, rows, keys, D, scale, x.q + in + i0 * ld, ld, x.k + in, ld, 0.0f, scores, keys);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = scores + r * keys;
        const int64_t n = causal ? i0 + r + 1 : keys;  // keys query i0 + r sees
        float mx = neg_inf;
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
        const float sum = exp_shifted_sum(row, n, mx);
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; ++j) row[j] *= inv;
        std::fill(row + n, row + keys, 0.0f);
        if (lse) lse[bh * S + i0 + r] = mx + std::log(sum);
      }
      gemm(false, false, rows, D, keys, 1.0f, scores, keys, x.v + in, ld, 0.0f, x.o + head_offset(s, x.out, bh) + i0 * ldo,
           ldo);
    }
}

std::string to_string(CpuKernel kernel) {
  switch (kernel) {
    case CpuKernel::avx512:
      return "blocked online softmax, AVX-512 micro-kernels";
    case CpuKernel::avx2:
      return "blocked online softmax, AVX2 micro-kernels";
    case CpuKernel::blas_tiles:
      return "64-query tiles of BLAS products";
  }
  return "";
}

std::vector<CpuKernel> cpu_fused_kernels(int64_t head_dim) {
  std::vector<CpuKernel> kernels;
#if defined(__x86_64__) && defined(__clang__)
  // clang (14) names no x86-64-v3/v4 level here: the features of each level it can name (F16C, LZCNT and MOVBE,
  // which it cannot, came with AVX2 and BMI2 on every CPU that has those).
  static const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
                         __builtin_cpu_supports("fma");
  static const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512vl");
  static const bool avx512 = blocked::avx512::built() && v4;
  static const bool avx2 = blocked::avx2::built() && v3;
  if (avx512 && head_dim % 16 == 0) kernels.push_back(CpuKernel::avx512);
  if (avx2 && head_dim % 8 == 0) kernels.push_back(CpuKernel::avx2);
#elif defined(__x86_64__) && defined(__GNUC__)
  static const bool avx512 = blocked::avx512::built() && __builtin_cpu_supports("x86-64-v4");
  static const bool avx2 = blocked::avx2::built() && __builtin_cpu_supports("x86-64-v3");
  if (avx512 && head_dim % 16 == 0) kernels.push_back(CpuKernel::avx512);
  if (avx2 && head_dim % 8 == 0) kernels.push_back(CpuKernel::avx2);
#endif
  kernels.push_back(CpuKernel::blas_tiles);
  return kernels;
}

static blocked::ForwardArgs blocked_args(const Shape& s, bool causal, const Operands<float>& x, float* lse,
                                         FusedWorkspace& ws) {
  return blocked::ForwardArgs{s.batch,
                              s.heads,
                              s.seq,
                              s.head_dim,
                              causal,
                              worth_threads(s),
                              x.q,
                              x.k,
                              x.v,
                              x.o,
                              lse,
                              x.in.batch,
                              x.in.head,
                              x.in.row,
                              x.out.batch,
                              x.out.head,
                              x.out.row,
                              ws.for_thread(0),
                              ws.per_thread()};
}

void cpu_fused_forward(const Shape& s, bool causal, const Operands<float>& x, float* lse, FusedWorkspace& ws,
                       CpuKernel kernel) {
  if (kernel == CpuKernel::blas_tiles) return blas_tiles_forward(s, causal, x, lse, ws);
  const blocked::ForwardArgs args = blocked_args(s, causal, x, lse, ws);
  if (kernel == CpuKernel::avx512) blocked::avx512::forward(args);
  else blocked::avx2::forward(args);
}

void cpu_fused_forward(const Shape& s, bool causal, const Operands<float>& x, float* lse, FusedWorkspace& ws) {
  cpu_fused_forward(s, causal, x, lse, ws, cpu_fused_kernels(s.head_dim).front());
}

// FlashAttention-2's backward, one head per thread (so dQ, dK and dV of a head have one writer).
// For each tile of 64 keys, against every query that sees it: P = exp(scale Q K^T - lse) recomputed
// from the saved row statistics, dV = P^T dO, dP = dO V^T, dS = P (dP - delta), dK = scale dS^T Q,
// dQ += scale dS K. The products are BLAS calls on the thread (tall: S x 64 x D).
static void blas_tiles_backward(const Shape& s, bool causal, const Operands<float>& x, const float* lse,
                                const Gradients<float>& g, FusedWorkspace& ws) {
  const int64_t S = s.seq, D = s.head_dim, bhs = s.batch * s.heads, ld = x.in.row, ldo = x.out.row;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel for schedule(dynamic) if (worth_threads(s))
  for (int64_t bh = 0; bh < bhs; ++bh) {
    const int64_t in = head_offset(s, x.in, bh), out = head_offset(s, x.out, bh);
    const float *q = x.q + in, *k = x.k + in, *v = x.v + in, *o = x.o + out, *dout = g.dout + out;
    const float* row_lse = lse + bh * S;
    float *dq = g.dq + in, *dk = g.dk + in, *dv = g.dv + in;
    float* p = ws.for_thread(omp_get_thread_num());
    float* dp = p + S * tile_cols;
    float* delta = dp + S * tile_cols;
    for (int64_t i = 0; i < S; ++i) {
      float sum = 0;
      for (int64_t d = 0; d < D; ++d) sum += dout[i * ldo + d] * o[i * ldo + d];
      delta[i] = sum;
      std::fill(dq + i * ld, dq + i * ld + D, 0.0f);
    }
    for (int64_t j0 = 0; j0 < S; j0 += tile_cols) {
      const int64_t cols = std::min(tile_cols, S - j0), first = causal ? j0 : 0, m = S - first;
      gemm(false, true, m, cols, D, scale, q + first * ld, ld, k + j0 * ld, ld, 0.0f, p, cols);
      for (int64_t r = 0; r < m; ++r) {
        const int64_t i = first + r;
        const int64_t n = causal ? std::min(cols, i - j0 + 1) : cols;  // keys of this tile query i sees
        float* prow = p + r * cols;
        exp_shifted(prow, n, row_lse[i]);
        std::fill(prow + n, prow + cols, 0.0f);
      }
      gemm(true, false, cols, D, m, 1.0f, p, cols, dout + first * ldo, ldo, 0.0f, dv + j0 * ld, ld);
      gemm(false, true, m, cols, D, 1.0f, dout + first * ldo, ldo, v + j0 * ld, ld, 0.0f, dp, cols);
      for (int64_t r = 0; r < m; ++r) {
        const float dl = delta[first + r];
        float* dprow = dp + r * cols;
        const float* prow = p + r * cols;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) dprow[c] = prow[c] * (dprow[c] - dl);
      }
      gemm(true, false, cols, D, m, scale, dp, cols, q + first * ld, ld, 0.0f, dk + j0 * ld, ld);
      gemm(false, false, m, D, cols, scale, dp, cols, k + j0 * ld, ld, 1.0f, dq + first * ld, ld);
    }
  }
}

void cpu_fused_backward(const Shape& s, bool causal, const Operands<float>& x, const float* lse, const Gradients<float>& g,
                        FusedWorkspace& ws, CpuKernel kernel) {
  if (kernel == CpuKernel::blas_tiles) return blas_tiles_backward(s, causal, x, lse, g, ws);
  const blocked::BackwardArgs args{blocked_args(s, causal, x, nullptr, ws), lse, g.dout, g.dq, g.dk, g.dv};
  if (kernel == CpuKernel::avx512) blocked::avx512::backward(args);
  else blocked::avx2::backward(args);
}

void cpu_fused_backward(const Shape& s, bool causal, const Operands<float>& x, const float* lse, const Gradients<float>& g,
                        FusedWorkspace& ws) {
  cpu_fused_backward(s, causal, x, lse, g, ws, cpu_fused_kernels(s.head_dim).front());
}

namespace {

class Naive final : public Instance {
 public:
  Naive(const Shape& s, bool causal, Mask mask)
      : s_(s),
        causal_(causal),
        mask_(mask),
        q_(s.elements()),
        k_(s.elements()),
        v_(s.elements()),
        out_(s.elements()),
        scores_(s.batch * s.heads * s.seq * s.seq) {
    fill_inputs(s, q_, k_, v_);
    if (mask == Mask::cached) {  // register_buffer: built once, at the maximum length
      mask_ld_ = std::max(s.seq, defaults::attention_mask_max_seq);
      cached_.assign(static_cast<std::size_t>(mask_ld_ * mask_ld_), 0);
      for (int64_t i = 0; i < mask_ld_; ++i)
        for (int64_t j = i + 1; j < mask_ld_; ++j) cached_[i * mask_ld_ + j] = 1;
    }
  }
  void run() override {
    cpu_naive_forward(s_, mask_, Operands<float>{q_.data(), k_.data(), v_.data(), out_.data(), bhsd(s_), bhsd(s_)},
                      scores_.data(), cached_.data(), mask_ld_);
  }
  Verdict check() override { return check_output(s_, causal_, DType::fp32, to_vector(out_)); }

 private:
  Shape s_;
  bool causal_;
  Mask mask_;
  HostBuffer<float> q_, k_, v_, out_, scores_;
  std::vector<uint8_t> cached_;
  int64_t mask_ld_ = 0;
};

class Fused final : public Instance {
 public:
  Fused(const Shape& s, bool causal)
      : s_(s),
        causal_(causal),
        q_(s.elements()),
        k_(s.elements()),
        v_(s.elements()),
        out_(s.elements()),
        ws_(s.head_dim, s.seq) {
    fill_inputs(s, q_, k_, v_);
  }
  void run() override {
    cpu_fused_forward(s_, causal_, Operands<float>{q_.data(), k_.data(), v_.data(), out_.data(), bhsd(s_), bhsd(s_)},
                      nullptr, ws_);
  }
  Verdict check() override { return check_output(s_, causal_, DType::fp32, to_vector(out_)); }
  std::string configuration() const override { return to_string(cpu_fused_kernels(s_.head_dim).front()); }

 private:
  Shape s_;
  bool causal_;
  HostBuffer<float> q_, k_, v_, out_;
  FusedWorkspace ws_;
};

// Backward alone: the forward ran once at construction (naive keeps P, fused keeps O and the lse),
// run() computes dQ, dK, dV from the fixed dO.
class Backward final : public Instance {
 public:
  Backward(const Shape& s, bool causal, bool fused)
      : s_(s),
        causal_(causal),
        fused_(fused),
        q_(s.elements()),
        k_(s.elements()),
        v_(s.elements()),
        o_(s.elements()),
        dout_(s.elements()),
        dq_(s.elements()),
        dk_(s.elements()),
        dv_(s.elements()),
        saved_(fused ? s.rows() : s.batch * s.heads * s.seq * s.seq),
        dprobs_(fused ? 0 : s.batch * s.heads * s.seq * s.seq),
        ws_(s.head_dim, fused ? s.seq : 0) {
    fill_inputs(s, q_, k_, v_);
    for (int64_t i = 0; i < s.elements(); ++i) dout_[i] = input_dout(i);
    if (fused) cpu_fused_forward(s_, causal_, operands(), saved_.data(), ws_);
    else cpu_naive_forward(s_, causal ? Mask::implicit : Mask::none, operands(), saved_.data());
  }
  void run() override {
    const Gradients<float> g{dq_.data(), dk_.data(), dv_.data(), dout_.data()};
    if (fused_) cpu_fused_backward(s_, causal_, operands(), saved_.data(), g, ws_);
    else cpu_naive_backward(s_, operands(), saved_.data(), g, dprobs_.data());
  }
  Verdict check() override {
    return check_gradients(s_, causal_, DType::fp32, to_vector(dq_), to_vector(dk_), to_vector(dv_));
  }

 private:
  Operands<float> operands() { return Operands<float>{q_.data(), k_.data(), v_.data(), o_.data(), bhsd(s_), bhsd(s_)}; }

  Shape s_;
  bool causal_, fused_;
  HostBuffer<float> q_, k_, v_, o_, dout_, dq_, dk_, dv_, saved_, dprobs_;
  FusedWorkspace ws_;
};

// ---- the block -----------------------------------------------------------------------------------

// The block's layernorms and GELU are the ones the training step runs (layers/layers.h): one of each on the CPU.
void layernorm_rows(const float* x, const std::vector<float>& g, const std::vector<float>& b, float* y, int64_t rows,
                    int64_t d) {
  layers::cpu_layernorm_forward<float>(y, nullptr, nullptr, x, g.data(), b.data(), rows, d);
}

// y = x W + bias (+ residual), W [in][out] row-major; the bias is broadcast into y first.
void linear(const float* x, const std::vector<float>& w, const std::vector<float>& bias, float* y, int64_t rows, int64_t in,
            int64_t outn, const float* residual) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < outn; ++c) y[r * outn + c] = bias[c] + (residual ? residual[r * outn + c] : 0.0f);
  gemm(false, false, rows, outn, in, 1.0f, x, in, w.data(), outn, 1.0f, y, outn);
}

class Block final : public Instance {
 public:
  Block(const Shape& s, bool fused)
      : s_(s),
        fused_(fused),
        w_(make_block_weights(s.d_model())),
        tokens_(s.batch * s.seq),
        d_(s.d_model()),
        x_(tokens_ * d_),
        h_(tokens_ * d_),
        qkv_(tokens_ * 3 * d_),
        q_(s.elements()),
        k_(s.elements()),
        v_(s.elements()),
        o_(s.elements()),
        a_(tokens_ * d_),
        r1_(tokens_ * d_),
        f_(tokens_ * w_.hidden),
        y_(tokens_ * d_),
        scores_(fused ? 0 : s.batch * s.heads * s.seq * s.seq),
        ws_(s.head_dim, s.seq) {
    for (int64_t i = 0; i < tokens_ * d_; ++i) x_[i] = block_input(i);
  }
  void run() override {
    for (int p = 0; p < block_part_count; ++p) run_part(p);
  }
  Verdict check() override { return check_block_output(s_, w_, to_vector(y_)); }
  // Each part timed alone (median of 5) after the measurement: attention's share of the block.
  std::vector<std::pair<std::string, double>> observed() const override {
    auto* self = const_cast<Block*>(this);
    std::vector<std::pair<std::string, double>> parts;
    double total = 0, attention = 0;
    for (int p = 0; p < block_part_count; ++p) {
      std::vector<double> ns;
      for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        self->run_part(p);
        ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
      }
      const double median = median_of(ns);
      parts.emplace_back(std::string(block_parts[p]) + "_ns", median);
      total += median;
      if (p == 2) attention = median;
    }
    parts.emplace_back("attention_share", attention / total);
    return parts;
  }

 private:
  void run_part(int part) {
    const int64_t S = s_.seq, D = s_.head_dim, H = s_.heads;
    switch (part) {
      case 0:
        layernorm_rows(x_.data(), w_.ln1_g, w_.ln1_b, h_.data(), tokens_, d_);
        break;
      case 1:
        linear(h_.data(), w_.w_qkv, w_.b_qkv, qkv_.data(), tokens_, d_, 3 * d_, nullptr);
        // [B, S, 3, H, D] -> three [B, H, S, D]: what .view().transpose().contiguous() does.
#pragma omp parallel for collapse(2) schedule(static)
        for (int64_t b = 0; b < s_.batch; ++b)
          for (int64_t t = 0; t < S; ++t)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t d = 0; d < D; ++d) {
                const float* row = qkv_.data() + (b * S + t) * 3 * d_;
                const int64_t at = ((b * H + h) * S + t) * D + d;
                q_[at] = row[h * D + d];
                k_[at] = row[d_ + h * D + d];
                v_[at] = row[2 * d_ + h * D + d];
              }
        break;
      case 2:
        if (fused_) cpu_fused_forward(s_, true, heads(), nullptr, ws_);
        else cpu_naive_forward(s_, Mask::implicit, heads(), scores_.data());
        break;
      case 3:
#pragma omp parallel for collapse(2) schedule(static)
        for (int64_t b = 0; b < s_.batch; ++b)
          for (int64_t t = 0; t < S; ++t)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t d = 0; d < D; ++d) a_[(b * S + t) * d_ + h * D + d] = o_[((b * H + h) * S + t) * D + d];
        linear(a_.data(), w_.w_out, w_.b_out, r1_.data(), tokens_, d_, d_, x_.data());
        break;
      case 4:
        layernorm_rows(r1_.data(), w_.ln2_g, w_.ln2_b, h_.data(), tokens_, d_);
        break;
      case 5:
        linear(h_.data(), w_.w_fc1, w_.b_fc1, f_.data(), tokens_, d_, w_.hidden, nullptr);
        layers::cpu_gelu_forward(f_.data(), f_.data(), tokens_ * w_.hidden);
        linear(f_.data(), w_.w_fc2, w_.b_fc2, y_.data(), tokens_, w_.hidden, d_, r1_.data());
        break;
    }
  }

  Operands<float> heads() { return Operands<float>{q_.data(), k_.data(), v_.data(), o_.data(), bhsd(s_), bhsd(s_)}; }

  Shape s_;
  bool fused_;
  BlockWeights w_;
  int64_t tokens_, d_;
  HostBuffer<float> x_, h_, qkv_, q_, k_, v_, o_, a_, r1_, f_, y_, scores_;
  FusedWorkspace ws_;
};

}  // namespace

std::unique_ptr<Instance> make_cpu_naive(const Shape& s, bool causal, Mask mask) {
  return std::make_unique<Naive>(s, causal, causal ? mask : Mask::none);
}
std::unique_ptr<Instance> make_cpu_fused(const Shape& s, bool causal) { return std::make_unique<Fused>(s, causal); }
std::unique_ptr<Instance> make_cpu_block(const Shape& s, bool fused_attention) {
  return std::make_unique<Block>(s, fused_attention);
}
std::unique_ptr<Instance> make_cpu_backward(const Shape& s, bool causal, bool fused) {
  return std::make_unique<Backward>(s, causal, fused);
}

}  // namespace tb::attention
