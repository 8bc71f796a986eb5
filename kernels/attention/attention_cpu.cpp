// CPU attention. naive: the PyTorch eager path, scores [B, H, S, S] materialised by BLAS, then mask,
// softmax, and a second BLAS GEMM. fused: tiles of 64 queries x 64 keys with an online softmax, the
// scores never leave a thread's cache, causal tiles above the diagonal never computed.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "attention.h"
#include "runtime/defaults.h"
#include "runtime/host_buffer.h"
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

// 16 floats: one AVX-512 register (two AVX2 or four SSE registers in the other clones). Declared
// unaligned and may_alias so that it can be loaded from and stored to any float address.
typedef float vf16 __attribute__((vector_size(64), aligned(4), may_alias));
#define TB_LOAD16(p) (*reinterpret_cast<const vf16*>(p))
#define TB_STORE16(p, value) (*reinterpret_cast<vf16*>(p) = (value))
// x[j] = exp(x[j] - shift) for j < n, returning the sum: the softmax's exponentials, 16 at a time
// (the Cephes expf polynomial after range reduction, relative error about 2e-7), as vectorised
// softmaxes do. Arguments below -87.3 (masked scores) give exactly 0.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
float exp_shifted_sum(float* x, int64_t n, float shift) {
  typedef int32_t vi16 __attribute__((vector_size(64)));
  const vf16 lo = vf16{} - 87.3f;
  vf16 total = {};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    vf16 v = TB_LOAD16(x + j) - shift;
    const auto masked = v < lo;
    v = masked ? lo : v;
    vf16 fx = v * 1.44269504088896341f + 0.5f;
    vf16 n2 = __builtin_convertvector(__builtin_convertvector(fx, vi16), vf16);
    n2 = n2 > fx ? n2 - 1.0f : n2;  // floor
    const vf16 r = v - n2 * 0.693359375f + n2 * 2.12194440e-4f;
    vf16 y = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r +
              1.6666665459e-1f) * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    const vi16 bits = (__builtin_convertvector(n2, vi16) + 127) << 23;
    vf16 pow2;
    std::memcpy(&pow2, &bits, sizeof pow2);
    y = masked ? vf16{} : y * pow2;
    TB_STORE16(x + j, y);
    total += y;
  }
  float sum = 0;
  for (int c = 0; c < 16; ++c) sum += total[c];
  for (; j < n; ++j) sum += (x[j] = std::exp(x[j] - shift));
  return sum;
}

// ---- naive -----------------------------------------------------------------------------------------

// Scores, mask, softmax and P V over [B*H, S, D] buffers. `cached_mask` is a max_seq x max_seq
// causal mask (1 = masked) sliced to S x S, used by Mask::cached.
void naive_attention(const Shape& s, Mask mask, const float* q, const float* k, const float* v, float* scores,
                     float* out, const uint8_t* cached_mask, int64_t mask_ld) {
  const int64_t S = s.seq, D = s.head_dim, bhs = s.batch * s.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t bh = 0; bh < bhs; ++bh)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(S), static_cast<blasint>(S),
                static_cast<blasint>(D), scale, q + bh * S * D, static_cast<blasint>(D), k + bh * S * D,
                static_cast<blasint>(D), 0.0f, scores + bh * S * S, static_cast<blasint>(S));

  if (mask == Mask::rebuilt) {
    // torch.triu(torch.ones(S, S), diagonal=1).bool() on every forward: a fresh allocation and fill.
    std::vector<uint8_t> fresh(static_cast<std::size_t>(S * S));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < S; ++j) fresh[i * S + j] = j > i;
    cached_mask = fresh.data();
    mask_ld = S;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t bh = 0; bh < bhs; ++bh)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j)
          if (cached_mask[i * mask_ld + j]) scores[(bh * S + i) * S + j] = neg_inf;
  } else if (mask == Mask::cached) {  // masked_fill with a slice of the registered buffer
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t bh = 0; bh < bhs; ++bh)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j)
          if (cached_mask[i * mask_ld + j]) scores[(bh * S + i) * S + j] = neg_inf;
  }

#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < bhs * S; ++r) {
    float* row = scores + r * S;
    // implicit causal: keys after the query are skipped (and zeroed for the P V product).
    const int64_t n = mask == Mask::implicit ? r % S + 1 : S;
    float mx = neg_inf;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
    const float sum = exp_shifted_sum(row, n, mx);
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    for (int64_t j = n; j < S; ++j) row[j] = 0.0f;
  }

  for (int64_t bh = 0; bh < bhs; ++bh)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(S), static_cast<blasint>(D),
                static_cast<blasint>(S), 1.0f, scores + bh * S * S, static_cast<blasint>(S), v + bh * S * D,
                static_cast<blasint>(D), 0.0f, out + bh * S * D, static_cast<blasint>(D));
}

// ---- fused -----------------------------------------------------------------------------------------

struct TileWork {  // one thread's scratch: K tile transposed, score tile, accumulators, row state
  float* k_t;
  float* score;
  float* acc;
  float* row_max;
  float* row_sum;
};

constexpr int64_t block_rows = 4;  // query rows per micro-kernel: 4 x 64 accumulators in 16 registers

// One tile of queries [i0, i0 + rows) against all its keys. Both products are register-blocked:
// 4 query rows x 64 keys (scores) and 4 rows x 64 output columns (P V) stay in vector registers
// while the other operand streams past, instead of a load and store per multiply-add. Cloned for
// AVX-512 / AVX2+FMA / baseline x86-64 so the binary stays portable.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void fused_tile(const float* q, const float* k, const float* v, float* out, int64_t S, int64_t D, int64_t i0,
                int64_t rows, bool causal, float scale, const TileWork& w) {
  for (int64_t i = 0; i < rows; ++i) {
    w.row_max[i] = neg_inf;
    w.row_sum[i] = 0;
    std::fill(w.acc + i * D, w.acc + (i + 1) * D, 0.0f);
  }
  const int64_t key_end = causal ? i0 + rows : S;
  const int64_t blocked_rows = rows / block_rows * block_rows;
  const int64_t blocked_cols = D / 64 * 64;  // output columns the P V micro-kernel covers
  for (int64_t j0 = 0; j0 < key_end; j0 += tile_cols) {
    const int64_t cols = std::min(tile_cols, key_end - j0);
    // K tile transposed and zero-padded to 64 keys: the score micro-kernel has no tail.
    for (int64_t j = 0; j < tile_cols; ++j)
      for (int64_t d = 0; d < D; ++d) w.k_t[d * tile_cols + j] = j < cols ? k[(j0 + j) * D + d] : 0.0f;
    for (int64_t i = 0; i < blocked_rows; i += block_rows) {
      vf16 acc[block_rows][4] = {};
      for (int64_t d = 0; d < D; ++d) {
        const float* kd = w.k_t + d * tile_cols;
        const vf16 k0 = TB_LOAD16(kd), k1 = TB_LOAD16(kd + 16), k2 = TB_LOAD16(kd + 32), k3 = TB_LOAD16(kd + 48);
        for (int64_t r = 0; r < block_rows; ++r) {
          const float qd = q[(i0 + i + r) * D + d] * scale;
          acc[r][0] += k0 * qd;
          acc[r][1] += k1 * qd;
          acc[r][2] += k2 * qd;
          acc[r][3] += k3 * qd;
        }
      }
      for (int64_t r = 0; r < block_rows; ++r)
        for (int c = 0; c < 4; ++c) TB_STORE16(w.score + (i + r) * tile_cols + 16 * c, acc[r][c]);
    }
    for (int64_t i = blocked_rows; i < rows; ++i) {
      float* srow = w.score + i * tile_cols;
      std::fill(srow, srow + tile_cols, 0.0f);
      for (int64_t d = 0; d < D; ++d) {
        const float qd = q[(i0 + i) * D + d] * scale;
        const float* kd = w.k_t + d * tile_cols;
        for (int64_t j = 0; j < tile_cols; ++j) srow[j] += qd * kd[j];
      }
    }
    // Online softmax per row; the probabilities of keys a query may not see are zero.
    for (int64_t i = 0; i < rows; ++i) {
      float* srow = w.score + i * tile_cols;
      const int64_t n = causal ? std::min(cols, i0 + i - j0 + 1) : cols;  // keys this query may see
      if (n <= 0) {
        std::fill(srow, srow + tile_cols, 0.0f);
        continue;
      }
      float mx = w.row_max[i];
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, srow[j]);
      const float alpha = std::exp(w.row_max[i] - mx);  // 0 on the first tile (max was -inf)
      const float sum = exp_shifted_sum(srow, n, mx);
      std::fill(srow + n, srow + tile_cols, 0.0f);
      w.row_sum[i] = w.row_sum[i] * alpha + sum;
      w.row_max[i] = mx;
      float* arow = w.acc + i * D;
      for (int64_t d = 0; d < D; ++d) arow[d] *= alpha;
    }
    // O += P V.
    for (int64_t i = 0; i < blocked_rows; i += block_rows)
      for (int64_t c0 = 0; c0 < blocked_cols; c0 += 64) {
        vf16 acc[block_rows][4];
        for (int64_t r = 0; r < block_rows; ++r)
          for (int c = 0; c < 4; ++c) acc[r][c] = TB_LOAD16(w.acc + (i + r) * D + c0 + 16 * c);
        for (int64_t j = 0; j < cols; ++j) {
          const float* vr = v + (j0 + j) * D + c0;
          const vf16 v0 = TB_LOAD16(vr), v1 = TB_LOAD16(vr + 16), v2 = TB_LOAD16(vr + 32), v3 = TB_LOAD16(vr + 48);
          for (int64_t r = 0; r < block_rows; ++r) {
            const float p = w.score[(i + r) * tile_cols + j];
            acc[r][0] += v0 * p;
            acc[r][1] += v1 * p;
            acc[r][2] += v2 * p;
            acc[r][3] += v3 * p;
          }
        }
        for (int64_t r = 0; r < block_rows; ++r)
          for (int c = 0; c < 4; ++c) TB_STORE16(w.acc + (i + r) * D + c0 + 16 * c, acc[r][c]);
      }
    for (int64_t i = 0; i < rows; ++i) {  // what the micro-kernel leaves: tail rows and columns
      const int64_t from = i < blocked_rows ? blocked_cols : 0;
      float* arow = w.acc + i * D;
      for (int64_t j = 0; j < cols; ++j) {
        const float p = w.score[i * tile_cols + j];
        const float* vrow = v + (j0 + j) * D;
        for (int64_t d = from; d < D; ++d) arow[d] += p * vrow[d];
      }
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    const float inv = 1.0f / w.row_sum[i];
    for (int64_t d = 0; d < D; ++d) out[(i0 + i) * D + d] = w.acc[i * D + d] * inv;
  }
}

class FusedWorkspace {
 public:
  explicit FusedWorkspace(int64_t D)
      : D_(D), per_thread_(D * tile_cols + tile_rows * tile_cols + tile_rows * D + 2 * tile_rows),
        buffer_(static_cast<std::size_t>(per_thread_ * omp_get_max_threads())) {}
  TileWork for_thread(int t) {
    float* base = buffer_.data() + per_thread_ * t;
    return TileWork{base, base + D_ * tile_cols, base + D_ * tile_cols + tile_rows * tile_cols,
                    base + D_ * tile_cols + tile_rows * tile_cols + tile_rows * D_,
                    base + D_ * tile_cols + tile_rows * tile_cols + tile_rows * D_ + tile_rows};
  }

 private:
  int64_t D_, per_thread_;
  HostBuffer<float> buffer_;
};

void fused_attention(const Shape& s, bool causal, const float* q, const float* k, const float* v, float* out,
                     FusedWorkspace& ws) {
  const int64_t S = s.seq, D = s.head_dim, bhs = s.batch * s.heads, tiles = (S + tile_rows - 1) / tile_rows;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Dynamic: with a causal mask the last query tiles have many times the work of the first.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t bh = 0; bh < bhs; ++bh)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t off = bh * S * D;
      fused_tile(q + off, k + off, v + off, out + off, S, D, t * tile_rows, std::min(tile_rows, S - t * tile_rows),
                 causal, scale, ws.for_thread(omp_get_thread_num()));
    }
}

class Naive final : public Instance {
 public:
  Naive(const Shape& s, bool causal, Mask mask)
      : s_(s), causal_(causal), mask_(mask), q_(s.elements()), k_(s.elements()), v_(s.elements()),
        out_(s.elements()), scores_(s.batch * s.heads * s.seq * s.seq) {
    fill_inputs(s, q_, k_, v_);
    if (mask == Mask::cached) {  // register_buffer: built once, at the maximum length
      mask_ld_ = std::max(s.seq, defaults::attention_mask_max_seq);
      cached_.assign(static_cast<std::size_t>(mask_ld_ * mask_ld_), 0);
      for (int64_t i = 0; i < mask_ld_; ++i)
        for (int64_t j = i + 1; j < mask_ld_; ++j) cached_[i * mask_ld_ + j] = 1;
    }
  }
  void run() override {
    naive_attention(s_, mask_, q_.data(), k_.data(), v_.data(), scores_.data(), out_.data(), cached_.data(), mask_ld_);
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
      : s_(s), causal_(causal), q_(s.elements()), k_(s.elements()), v_(s.elements()), out_(s.elements()),
        ws_(s.head_dim) {
    fill_inputs(s, q_, k_, v_);
  }
  void run() override { fused_attention(s_, causal_, q_.data(), k_.data(), v_.data(), out_.data(), ws_); }
  Verdict check() override { return check_output(s_, causal_, DType::fp32, to_vector(out_)); }

 private:
  Shape s_;
  bool causal_;
  HostBuffer<float> q_, k_, v_, out_;
  FusedWorkspace ws_;
};

// ---- the block -----------------------------------------------------------------------------------

void layernorm_rows(const float* x, const float* g, const float* b, float* y, int64_t rows, int64_t d) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float mean = 0, var = 0;
    for (int64_t c = 0; c < d; ++c) mean += xr[c];
    mean /= static_cast<float>(d);
    for (int64_t c = 0; c < d; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    const float inv = 1.0f / std::sqrt(var / static_cast<float>(d) + static_cast<float>(defaults::layernorm_eps));
    for (int64_t c = 0; c < d; ++c) y[r * d + c] = (xr[c] - mean) * inv * g[c] + b[c];
  }
}

// y = x W + bias (+ residual), W [in][out] row-major; the bias is broadcast into y first.
void linear(const float* x, const std::vector<float>& w, const std::vector<float>& bias, float* y, int64_t rows,
            int64_t in, int64_t outn, const float* residual) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < outn; ++c) y[r * outn + c] = bias[c] + (residual ? residual[r * outn + c] : 0.0f);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(rows), static_cast<blasint>(outn),
              static_cast<blasint>(in), 1.0f, x, static_cast<blasint>(in), w.data(), static_cast<blasint>(outn), 1.0f,
              y, static_cast<blasint>(outn));
}

class Block final : public Instance {
 public:
  Block(const Shape& s, bool fused)
      : s_(s), fused_(fused), w_(make_block_weights(s.d_model())), tokens_(s.batch * s.seq), d_(s.d_model()),
        x_(tokens_ * d_), h_(tokens_ * d_), qkv_(tokens_ * 3 * d_), q_(s.elements()), k_(s.elements()),
        v_(s.elements()), o_(s.elements()), a_(tokens_ * d_), r1_(tokens_ * d_), f_(tokens_ * w_.hidden),
        y_(tokens_ * d_), scores_(fused ? 0 : s.batch * s.heads * s.seq * s.seq), ws_(s.head_dim) {
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
      case 0: layernorm_rows(x_.data(), w_.ln1_g.data(), w_.ln1_b.data(), h_.data(), tokens_, d_); break;
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
        if (fused_) fused_attention(s_, true, q_.data(), k_.data(), v_.data(), o_.data(), ws_);
        else naive_attention(s_, Mask::implicit, q_.data(), k_.data(), v_.data(), scores_.data(), o_.data(), nullptr, 0);
        break;
      case 3:
#pragma omp parallel for collapse(2) schedule(static)
        for (int64_t b = 0; b < s_.batch; ++b)
          for (int64_t t = 0; t < S; ++t)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t d = 0; d < D; ++d) a_[(b * S + t) * d_ + h * D + d] = o_[((b * H + h) * S + t) * D + d];
        linear(a_.data(), w_.w_out, w_.b_out, r1_.data(), tokens_, d_, d_, x_.data());
        break;
      case 4: layernorm_rows(r1_.data(), w_.ln2_g.data(), w_.ln2_b.data(), h_.data(), tokens_, d_); break;
      case 5: {
        linear(h_.data(), w_.w_fc1, w_.b_fc1, f_.data(), tokens_, d_, w_.hidden, nullptr);
        float* f = f_.data();
        const int64_t n = tokens_ * w_.hidden;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
          const float x = f[i];
          f[i] = 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
        }
        linear(f_.data(), w_.w_fc2, w_.b_fc2, y_.data(), tokens_, w_.hidden, d_, r1_.data());
        break;
      }
    }
  }

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

}  // namespace tb::attention
