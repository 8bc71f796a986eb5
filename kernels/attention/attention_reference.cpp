// The oracle for `attention`: plain loops in double over regenerated inputs.
#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <sstream>

#include "attention.h"
#include "runtime/defaults.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "runtime/tolerance.h"
#include "runtime/gelu.h"

namespace tb::attention {

std::string shape_invalid_reason(const std::string& text) {
  int64_t v[4];
  std::size_t at = 0;
  for (int i = 0; i < 4; ++i) {
    const std::size_t end = i < 3 ? text.find('x', at) : text.size();
    if (end == std::string::npos) return "expected BATCHxHEADSxSEQxHEAD_DIM, e.g. 4x16x4096x128";
    const std::string part = text.substr(at, end - at);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 9)
      return "expected BATCHxHEADSxSEQxHEAD_DIM with positive integers, e.g. 4x16x4096x128";
    v[i] = std::stoll(part);
    if (v[i] < 1) return "every dimension must be at least 1";
    at = end + 1;
  }
  return "";
}

Shape parse_shape(const std::string& text) {
  if (const std::string why = shape_invalid_reason(text); !why.empty()) throw UsageError("shape '" + text + "': " + why);
  Shape s;
  int64_t* dims[4] = {&s.batch, &s.heads, &s.seq, &s.head_dim};
  std::size_t at = 0;
  for (auto* d : dims) {
    const std::size_t end = text.find('x', at);
    *d = std::stoll(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
    at = end + 1;
  }
  return s;
}

static float maybe_bf16(float x, DType t) { return t == DType::bf16 ? round_to_bf16(x) : x; }
float input_q(int64_t i, DType t) { return maybe_bf16(uniform_at(seed_q, static_cast<uint64_t>(i)), t); }
float input_k(int64_t i, DType t) { return maybe_bf16(uniform_at(seed_k, static_cast<uint64_t>(i)), t); }
float input_v(int64_t i, DType t) { return maybe_bf16(uniform_at(seed_v, static_cast<uint64_t>(i)), t); }
float input_dout(int64_t i) { return uniform_at(seed_dout, static_cast<uint64_t>(i)); }

static Verdict compare_row(const char* what, int64_t a, int64_t b, const std::vector<double>& want, const float* got,
                           const Tolerance& tol, double& worst);

namespace {
int64_t head_at(const Shape& s, const Strides& st, int64_t bh) { return bh / s.heads * st.batch + bh % s.heads * st.head; }

// Row i of P = softmax(scale q_i K^T) of head bh into p (S values, zero past the causal limit).
template <class T>
void probabilities(const Shape& s, bool causal, const Operands<T>& x, int64_t bh, int64_t i, std::vector<double>& p,
                   double* lse) {
  const int64_t S = s.seq, D = s.head_dim, in = head_at(s, x.in, bh);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int64_t n = causal ? i + 1 : S;
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(x.q[in + i * x.in.row + d]) * x.k[in + j * x.in.row + d];
    p[j] = dot * scale;
    mx = std::max(mx, p[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - mx));
  for (int64_t j = 0; j < n; ++j) p[j] /= sum;
  for (int64_t j = n; j < S; ++j) p[j] = 0;
  if (lse) *lse = mx + std::log(sum);
}
}  // namespace

template <class T>
void reference_forward(const Shape& s, bool causal, const Operands<T>& x, T* lse) {
  const int64_t S = s.seq, D = s.head_dim;
  std::vector<double> p(static_cast<std::size_t>(S));
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    const int64_t in = head_at(s, x.in, bh), out = head_at(s, x.out, bh);
    for (int64_t i = 0; i < S; ++i) {
      double row_lse = 0;
      probabilities(s, causal, x, bh, i, p, &row_lse);
      if (lse) lse[bh * S + i] = static_cast<T>(row_lse);
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t j = 0; j < S; ++j) acc += p[j] * x.v[in + j * x.in.row + d];
        x.o[out + i * x.out.row + d] = static_cast<T>(acc);
      }
    }
  }
}

// dV = P^T dO; dP = dO V^T; dS = P (dP - rowsum(dP P)); dQ = scale dS K; dK = scale dS^T Q.
template <class T>
void reference_backward(const Shape& s, bool causal, const Operands<T>& x, const Gradients<T>& g) {
  const int64_t S = s.seq, D = s.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> p(static_cast<std::size_t>(S)), dp(static_cast<std::size_t>(S));
  std::vector<double> dq(static_cast<std::size_t>(S * D)), dk(dq.size()), dv(dq.size());
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    const int64_t in = head_at(s, x.in, bh), out = head_at(s, x.out, bh);
    std::fill(dq.begin(), dq.end(), 0.0);
    std::fill(dk.begin(), dk.end(), 0.0);
    std::fill(dv.begin(), dv.end(), 0.0);
    for (int64_t i = 0; i < S; ++i) {
      probabilities(s, causal, x, bh, i, p, nullptr);
      const T* dout = g.dout + out + i * x.out.row;
      double dot = 0;
      for (int64_t j = 0; j < S; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(dout[d]) * x.v[in + j * x.in.row + d];
        dp[j] = acc;
        dot += acc * p[j];
      }
      for (int64_t j = 0; j < S; ++j) {
        if (p[j] == 0) continue;
        const double ds = p[j] * (dp[j] - dot) * scale;
        for (int64_t d = 0; d < D; ++d) {
          dv[j * D + d] += p[j] * dout[d];
          dq[i * D + d] += ds * x.k[in + j * x.in.row + d];
          dk[j * D + d] += ds * x.q[in + i * x.in.row + d];
        }
      }
    }
    for (int64_t i = 0; i < S; ++i)
      for (int64_t d = 0; d < D; ++d) {
        g.dq[in + i * x.in.row + d] = static_cast<T>(dq[i * D + d]);
        g.dk[in + i * x.in.row + d] = static_cast<T>(dk[i * D + d]);
        g.dv[in + i * x.in.row + d] = static_cast<T>(dv[i * D + d]);
      }
  }
}

template void reference_forward<double>(const Shape&, bool, const Operands<double>&, double*);
template void reference_backward<double>(const Shape&, bool, const Operands<double>&, const Gradients<double>&);

// The gradients of the heads checked_rows touches, each whole head from the regenerated inputs. A
// head costs O(S^2 D) in double (tens of GFLOP at 4096 x 128): the heads are checked in parallel,
// and the first failing one (in the listed order) is reported.
Verdict check_gradients(const Shape& s, bool causal, DType t, const std::vector<float>& dq, const std::vector<float>& dk,
                        const std::vector<float>& dv) {
  const Tolerance tol = t == DType::bf16 ? tolerance::attention_bf16_backward : tolerance::attention_fp32;
  for (const auto* got : {&dq, &dk, &dv})
    if (got->size() != static_cast<std::size_t>(s.elements()))
      return Verdict{false, INFINITY,
                     std::string(got == &dq   ? "dq"
                                 : got == &dk ? "dk"
                                              : "dv") +
                         " has the wrong number of elements"};
  std::vector<int64_t> heads;
  for (const auto& [bh, i] : checked_rows(s))
    if (std::find(heads.begin(), heads.end(), bh) == heads.end()) heads.push_back(bh);
  if (heads.size() > 4) heads.resize(4);
  const int64_t per_head = s.seq * s.head_dim;
  const Shape one{1, 1, s.seq, s.head_dim};
  std::vector<Verdict> verdicts(heads.size(), Verdict{true, 0, ""});
#pragma omp parallel for schedule(dynamic, 1) if (s.seq * s.seq * s.head_dim >= (int64_t{1} << 24))
  for (std::size_t h = 0; h < heads.size(); ++h) {
    const int64_t bh = heads[h], base = bh * per_head;
    std::vector<double> q(per_head), k(per_head), v(per_head), o(per_head), dout(per_head), rq(per_head), rk(per_head),
        rv(per_head);
    for (int64_t e = 0; e < per_head; ++e) {
      q[e] = input_q(base + e, t);
      k[e] = input_k(base + e, t);
      v[e] = input_v(base + e, t);
      dout[e] = maybe_bf16(input_dout(base + e), t);
    }
    const Operands<double> x{q.data(), k.data(), v.data(), o.data(), bhsd(one), bhsd(one)};
    reference_backward(one, causal, x, Gradients<double>{rq.data(), rk.data(), rv.data(), dout.data()});
    const std::pair<const char*, std::pair<const std::vector<double>*, const std::vector<float>*>> fields[] = {
        {"dq", {&rq, &dq}}, {"dk", {&rk, &dk}}, {"dv", {&rv, &dv}}};
    double worst = 0;
    for (const auto& [name, pair] : fields) {
      const auto& [want, got] = pair;
      for (int64_t i = 0; i < s.seq && verdicts[h].passed; ++i)
        verdicts[h] = compare_row(name, bh, i,
                                  std::vector<double>(want->begin() + i * s.head_dim, want->begin() + (i + 1) * s.head_dim),
                                  got->data() + base + i * s.head_dim, tol, worst);
    }
    verdicts[h].max_error = worst;
  }
  double worst = 0;
  for (const Verdict& v : verdicts) {
    if (!v.passed) return v;
    worst = std::max(worst, v.max_error);
  }
  return Verdict{true, worst, ""};
}

// Host-side, so that a build without CUDA lists the same reasons.
bool cuda_bf16_supports_head_dim(int64_t head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

std::string cuda_bf16_reason(const Shape& s) {
  if (!cuda_bf16_supports_head_dim(s.head_dim))
    return "the bf16 tensor-core kernels are built for head_dim 32, 64 and 128, not " + std::to_string(s.head_dim);
  // One block per (batch x head, tile) in grid.x, whose limit is 2^31 - 1; S fits an int.
  const int64_t blocks = (s.seq + cuda_bf16_key_tile - 1) / cuda_bf16_key_tile * s.batch * s.heads;
  if (blocks > INT_MAX || s.seq > INT_MAX / 2)
    return "batch x heads x tiles = " + std::to_string(blocks) + " blocks, above the grid's 2^31 - 1";
  return "";
}

double attention_flops(const Shape& s, bool causal) {
  const double full = 4.0 * static_cast<double>(s.batch * s.heads) * static_cast<double>(s.seq) *
                      static_cast<double>(s.seq) * static_cast<double>(s.head_dim);
  return causal ? full / 2 : full;
}

// softmax(q K^T / sqrt(D)) V for one query against keys [0, n), in double.
static std::vector<double> attend(const std::vector<double>& q, const std::vector<std::vector<double>>& k,
                                  const std::vector<std::vector<double>>& v, std::size_t n) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size()));
  std::vector<double> score(n);
  double max_score = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < n; ++j) {
    double dot = 0;
    for (std::size_t d = 0; d < q.size(); ++d) dot += q[d] * k[j][d];
    score[j] = dot * scale;
    max_score = std::max(max_score, score[j]);
  }
  double sum = 0;
  for (auto& x : score) sum += (x = std::exp(x - max_score));
  std::vector<double> out(q.size(), 0.0);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t d = 0; d < q.size(); ++d) out[d] += score[j] / sum * v[j][d];
  return out;
}

std::vector<double> reference_row(const Shape& s, bool causal, DType t, int64_t bh, int64_t i) {
  const int64_t D = s.head_dim, base = bh * s.seq * D;
  const int64_t n = causal ? i + 1 : s.seq;
  std::vector<double> q(D);
  std::vector<std::vector<double>> k(n, std::vector<double>(D)), v(n, std::vector<double>(D));
  for (int64_t d = 0; d < D; ++d) q[d] = input_q(base + i * D + d, t);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < D; ++d) {
      k[j][d] = input_k(base + j * D + d, t);
      v[j][d] = input_v(base + j * D + d, t);
    }
  return attend(q, k, v, static_cast<std::size_t>(n));
}

std::vector<std::pair<int64_t, int64_t>> checked_rows(const Shape& s) {
  const int64_t bhs = s.batch * s.heads;
  std::vector<std::pair<int64_t, int64_t>> rows{{0, 0}, {0, s.seq - 1}, {bhs - 1, 0}, {bhs - 1, s.seq - 1}};
  for (int r = 0; r < defaults::attention_checked_rows; ++r)
    rows.emplace_back(static_cast<int64_t>(splitmix64(3 * r) % static_cast<uint64_t>(bhs)),
                      static_cast<int64_t>(splitmix64(3 * r + 1) % static_cast<uint64_t>(s.seq)));
  return rows;
}

static Verdict compare_row(const char* what, int64_t a, int64_t b, const std::vector<double>& want, const float* got,
                           const Tolerance& tol, double& worst) {
  for (std::size_t d = 0; d < want.size(); ++d) {
    worst = std::max(worst, std::abs(got[d] - want[d]));
    if (!tol.accepts(got[d], want[d])) {
      std::ostringstream msg;
      msg.precision(8);
      msg << what << "[" << a << "][" << b << "][" << d << "] = " << got[d] << ", reference " << want[d];
      return Verdict{false, worst, msg.str()};
    }
  }
  return Verdict{true, worst, ""};
}

Verdict check_output(const Shape& s, bool causal, DType t, const std::vector<float>& out) {
  const Tolerance tol = t == DType::bf16 ? tolerance::attention_bf16 : tolerance::attention_fp32;
  double worst = 0;
  for (const auto& [bh, i] : checked_rows(s)) {
    const auto want = reference_row(s, causal, t, bh, i);
    const Verdict v = compare_row("out", bh, i, want, out.data() + (bh * s.seq + i) * s.head_dim, tol, worst);
    if (!v.passed) return v;
  }
  return Verdict{true, worst, ""};
}

// ---- the block -----------------------------------------------------------------------------------

float block_input(int64_t index) { return uniform_at(seed_x, static_cast<uint64_t>(index)); }

BlockWeights make_block_weights(int64_t d) {
  BlockWeights w;
  w.d = d;
  w.hidden = defaults::block_mlp_ratio * d;
  uint64_t stream = 0;
  // Uniform in +-1/sqrt(fan_in), as nn.Linear initialises; norms near 1 and biases small.
  auto fill = [&](std::vector<float>& v, int64_t n, int64_t fan_in, float center, float spread) {
    const float bound = fan_in > 0 ? 1.0f / std::sqrt(static_cast<float>(fan_in)) : spread;
    v.resize(static_cast<std::size_t>(n));
    const uint64_t seed = seed_w * 1000 + stream++;
    for (int64_t i = 0; i < n; ++i) v[i] = center + uniform_at(seed, static_cast<uint64_t>(i), -bound, bound);
  };
  fill(w.ln1_g, d, 0, 1.0f, 0.1f);
  fill(w.ln1_b, d, 0, 0.0f, 0.1f);
  fill(w.w_qkv, d * 3 * d, d, 0, 0);
  fill(w.b_qkv, 3 * d, 0, 0.0f, 0.02f);
  fill(w.w_out, d * d, d, 0, 0);
  fill(w.b_out, d, 0, 0.0f, 0.02f);
  fill(w.ln2_g, d, 0, 1.0f, 0.1f);
  fill(w.ln2_b, d, 0, 0.0f, 0.1f);
  fill(w.w_fc1, d * w.hidden, d, 0, 0);
  fill(w.b_fc1, w.hidden, 0, 0.0f, 0.02f);
  fill(w.w_fc2, w.hidden * d, w.hidden, 0, 0);
  fill(w.b_fc2, d, 0, 0.0f, 0.02f);
  return w;
}

static std::vector<double> layernorm(const std::vector<double>& x, const std::vector<float>& g,
                                     const std::vector<float>& b) {
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= static_cast<double>(x.size());
  for (double v : x) var += (v - mean) * (v - mean);
  var /= static_cast<double>(x.size());
  const double inv = 1.0 / std::sqrt(var + defaults::layernorm_eps);
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mean) * inv * g[i] + b[i];
  return y;
}

// y = x W + b with W stored [in][out] row-major.
static std::vector<double> linear(const std::vector<double>& x, const std::vector<float>& w, const std::vector<float>& b) {
  std::vector<double> y(b.begin(), b.end());
  for (std::size_t k = 0; k < x.size(); ++k)
    for (std::size_t c = 0; c < y.size(); ++c) y[c] += x[k] * w[k * y.size() + c];
  return y;
}

static double gelu(double x) {  // the tanh approximation GPT-2 uses
  return 0.5 * x * (1.0 + std::tanh(gelu::scale * (x + gelu::cubic * x * x * x)));
}

Verdict check_block_output(const Shape& s, const BlockWeights& w, const std::vector<float>& y) {
  const int64_t d = w.d, D = s.head_dim;
  double worst = 0;
  const std::vector<int64_t> batches = s.batch > 1 ? std::vector<int64_t>{0, s.batch - 1} : std::vector<int64_t>{0};
  for (int64_t b : batches) {
    const std::vector<int64_t> rows{0, s.seq / 2, s.seq - 1};
    const int64_t last = s.seq - 1;
    // q, k, v of every token up to the last checked one (causal: later tokens do not matter).
    std::vector<std::vector<double>> qkv(static_cast<std::size_t>(last + 1));
    for (int64_t t = 0; t <= last; ++t) {
      std::vector<double> x(static_cast<std::size_t>(d));
      for (int64_t c = 0; c < d; ++c) x[c] = block_input((b * s.seq + t) * d + c);
      qkv[t] = linear(layernorm(x, w.ln1_g, w.ln1_b), w.w_qkv, w.b_qkv);
    }
    for (int64_t i : rows) {
      std::vector<double> attn(static_cast<std::size_t>(d));
      for (int64_t h = 0; h < s.heads; ++h) {
        std::vector<double> q(qkv[i].begin() + h * D, qkv[i].begin() + (h + 1) * D);
        std::vector<std::vector<double>> k, v;
        for (int64_t j = 0; j <= i; ++j) {
          k.emplace_back(qkv[j].begin() + d + h * D, qkv[j].begin() + d + (h + 1) * D);
          v.emplace_back(qkv[j].begin() + 2 * d + h * D, qkv[j].begin() + 2 * d + (h + 1) * D);
        }
        const auto o = attend(q, k, v, static_cast<std::size_t>(i + 1));
        std::copy(o.begin(), o.end(), attn.begin() + h * D);
      }
      std::vector<double> r1 = linear(attn, w.w_out, w.b_out);
      for (int64_t c = 0; c < d; ++c) r1[c] += block_input((b * s.seq + i) * d + c);
      std::vector<double> f = linear(layernorm(r1, w.ln2_g, w.ln2_b), w.w_fc1, w.b_fc1);
      for (auto& v : f) v = gelu(v);
      std::vector<double> out = linear(f, w.w_fc2, w.b_fc2);
      for (int64_t c = 0; c < d; ++c) out[c] += r1[c];
      const Verdict v = compare_row("y", b, i, out, y.data() + (b * s.seq + i) * d, tolerance::block_fp32, worst);
      if (!v.passed) return v;
    }
  }
  return Verdict{true, worst, ""};
}

}  // namespace tb::attention
