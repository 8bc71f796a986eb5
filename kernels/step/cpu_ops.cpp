// The CPU backend's ops, in the formulas of llm.c's train_gpt2.c (layernorm, GELU, attention and
// cross-entropy backward), with the matrix products on the CPU BLAS.
#include "step/cpu_ops.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/comm.h"
#include "runtime/defaults.h"

namespace tb::step {

namespace {

// C[M, N] = alpha op(A) op(B) + beta C, row-major, in T.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
              static_cast<blasint>(N), static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda), B,
              static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda, const double* B,
          int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
              static_cast<blasint>(N), static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda), B,
              static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

constexpr double gelu_scale = 0.7978845608028654;  // sqrt(2 / pi)

// Below this much work a parallel region costs more than it saves (fork, join and a barrier: tens
// of microseconds on a loaded machine), and small models are all small loops.
inline bool parallel_worth(int64_t work) { return work >= 32768; }

}  // namespace

template <class T>
void CpuOps<T>::zero(T* p, int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) p[i] = T(0);
}

template <class T>
void CpuOps<T>::copy(T* dst, const T* src, int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

template <class T>
void CpuOps<T>::add(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void CpuOps<T>::subtract(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] - b[i];
}

template <class T>
void CpuOps<T>::gather_tokens(int32_t* tokens, int32_t* targets, const int32_t* dataset, const int32_t* indices,
                              int64_t B, int64_t Tn) {
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = dataset + static_cast<int64_t>(indices[b]) * (Tn + 1);
    std::copy(row, row + Tn, tokens + b * Tn);
    std::copy(row + 1, row + Tn + 1, targets + b * Tn);
  }
}

template <class T>
void CpuOps<T>::encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B, int64_t Tn,
                                int64_t C) {
#pragma omp parallel for collapse(2) schedule(static) if (parallel_worth(B * Tn * C))
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t) {
      const T* e = wte + static_cast<int64_t>(tokens[b * Tn + t]) * C;
      const T* p = wpe + t * C;
      T* o = out + (b * Tn + t) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
}

template <class T>
void CpuOps<T>::encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t Tn,
                                 int64_t C) {
  // Rows of dwte repeat across tokens: parallel over channels keeps the scatter free of races.
#pragma omp parallel for schedule(static) if (parallel_worth(B * Tn * C))
  for (int64_t c = 0; c < C; ++c)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tn; ++t) {
        const T d = dout[(b * Tn + t) * C + c];
        dwte[static_cast<int64_t>(tokens[b * Tn + t]) * C + c] += d;
        dwpe[t * C + c] += d;
      }
}

template <class T>
void CpuOps<T>::layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C) {
  const T eps = static_cast<T>(defaults::layernorm_eps);
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T m = 0;
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= static_cast<T>(C);
    T v = 0;
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= static_cast<T>(C);
    const T s = T(1) / std::sqrt(v + eps);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <class T>
void CpuOps<T>::layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean,
                                   const T* rstd, int64_t N, int64_t C) {
  const int threads = omp_get_max_threads();
  std::vector<T> partial(static_cast<std::size_t>(threads) * 2 * C, T(0));  // per-thread dw, db
#pragma omp parallel
  {
    T* pdw = partial.data() + static_cast<int64_t>(omp_get_thread_num()) * 2 * C;
    T* pdb = pdw + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      const T* d = dout + n * C;
      T dnorm_mean = 0, dnorm_norm_mean = 0;
      for (int64_t c = 0; c < C; ++c) {
        const T norm = (x[c] - mean[n]) * rstd[n];
        const T dnorm = w[c] * d[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<T>(C);
      dnorm_norm_mean /= static_cast<T>(C);
      for (int64_t c = 0; c < C; ++c) {
        const T norm = (x[c] - mean[n]) * rstd[n];
        const T dnorm = w[c] * d[c];
        pdb[c] += d[c];
        pdw[c] += norm * d[c];
        dinp[n * C + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
      }
    }
  }
  for (int t = 0; t < threads; ++t)
    for (int64_t c = 0; c < C; ++c) {
      dw[c] += partial[static_cast<int64_t>(t) * 2 * C + c];
      db[c] += partial[static_cast<int64_t>(t) * 2 * C + C + c];
    }
}

template <class T>
void CpuOps<T>::matmul_forward(T* out, const T* inp, const T* w, const T* bias, int64_t N, int64_t C, int64_t OC, bool) {
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) out[n * OC + o] = bias ? bias[o] : T(0);
  gemm(false, true, N, OC, C, T(1), inp, C, w, C, T(1), out, OC);
}

template <class T>
void CpuOps<T>::matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int64_t N, int64_t C,
                                int64_t OC, bool) {
  gemm(false, false, N, C, OC, T(1), dout, OC, w, C, T(1), dinp, C);
  gemm(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dw, C);
  if (dbias) {
#pragma omp parallel for schedule(static) if (parallel_worth(N * OC))
    for (int64_t o = 0; o < OC; ++o) {
      T sum = 0;
      for (int64_t n = 0; n < N; ++n) sum += dout[n * OC + o];
      dbias[o] += sum;
    }
  }
}

// Scores by BLAS per (batch, head) straight from the packed qkv rows (leading dimension 3C), the
// causal softmax row by row, then att V into the head's columns of out.
template <class T>
void CpuOps<T>::attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const T* q = qkv + b * Tn * 3 * C + h * hs;
      T* a = att + (b * NH + h) * Tn * Tn;
      gemm(false, true, Tn, Tn, hs, scale, q, 3 * C, q + C, 3 * C, T(0), a, Tn);
#pragma omp parallel for schedule(static) if (parallel_worth(Tn * Tn))
      for (int64_t i = 0; i < Tn; ++i) {
        T* row = a + i * Tn;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
        T sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += (row[j] = std::exp(row[j] - mx));
        for (int64_t j = 0; j <= i; ++j) row[j] /= sum;
        for (int64_t j = i + 1; j < Tn; ++j) row[j] = T(0);
      }
      gemm(false, false, Tn, hs, Tn, T(1), a, Tn, q + 2 * C, 3 * C, T(0), out + b * Tn * C + h * hs, C);
    }
}

template <class T>
void CpuOps<T>::attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att, int64_t B, int64_t Tn,
                                   int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const T* q = qkv + b * Tn * 3 * C + h * hs;
      T* dq = dqkv + b * Tn * 3 * C + h * hs;
      const T* a = att + (b * NH + h) * Tn * Tn;
      T* da = datt + (b * NH + h) * Tn * Tn;
      const T* d = dout + b * Tn * C + h * hs;
      gemm(false, true, Tn, Tn, hs, T(1), d, C, q + 2 * C, 3 * C, T(0), da, Tn);       // dA = dO V^T
      gemm(true, false, Tn, hs, Tn, T(1), a, Tn, d, C, T(1), dq + 2 * C, 3 * C);       // dV += A^T dO
#pragma omp parallel for schedule(static) if (parallel_worth(Tn * Tn))
      for (int64_t i = 0; i < Tn; ++i) {  // softmax backward: dS = A * (dA - sum(dA * A))
        T* drow = da + i * Tn;
        const T* arow = a + i * Tn;
        T dot = 0;
        for (int64_t j = 0; j <= i; ++j) dot += drow[j] * arow[j];
        for (int64_t j = 0; j <= i; ++j) drow[j] = arow[j] * (drow[j] - dot);
        for (int64_t j = i + 1; j < Tn; ++j) drow[j] = T(0);
      }
      gemm(false, false, Tn, hs, Tn, scale, da, Tn, q + C, 3 * C, T(1), dq, 3 * C);     // dQ += s dS K
      gemm(true, false, Tn, hs, Tn, scale, da, Tn, q, 3 * C, T(1), dq + C, 3 * C);       // dK += s dS^T Q
    }
}

template <class T>
void CpuOps<T>::gelu_forward(T* out, const T* inp, int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + std::tanh(static_cast<T>(gelu_scale) * (x + T(0.044715) * x * x * x)));
  }
}

template <class T>
void CpuOps<T>::gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T u = static_cast<T>(gelu_scale) * (x + T(0.044715) * x * x * x);
    const T th = std::tanh(u);
    const T sech2 = T(1) - th * th;
    const T local = T(0.5) * (T(1) + th) +
                    T(0.5) * x * sech2 * static_cast<T>(gelu_scale) * (T(1) + T(3) * T(0.044715) * x * x);
    dinp[i] += local * dout[i];
  }
}

template <class T>
void CpuOps<T>::softmax_crossentropy(T* probs, T* losses, const T* logits, const int32_t* targets, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static) if (parallel_worth(N * V))
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * V;
    T* p = probs + n * V;
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, l[v]);
    T sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += (p[v] = std::exp(l[v] - mx));
    for (int64_t v = 0; v < V; ++v) p[v] /= sum;
    // log-sum-exp form: exact even where the probability underflows.
    losses[n] = std::log(sum) + mx - l[targets[n]];
  }
}

template <class T>
void CpuOps<T>::crossentropy_backward(T* dlogits, const T* probs, const int32_t* targets, T dloss, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static) if (parallel_worth(N * V))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v)
      dlogits[n * V + v] = (probs[n * V + v] - (v == targets[n] ? T(1) : T(0))) * dloss;
}

template <class T>
void CpuOps<T>::laplacian_apply(T* y, const T* x, int64_t N, int64_t C, int64_t k, T alpha) {
#pragma omp parallel for schedule(static) if (parallel_worth(N * C * k))
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    for (int64_t i = 0; i < C; ++i) {
      T neighbours = 0;
      for (int64_t d = 1; d <= k / 2; ++d) neighbours += xr[(i - d + C) % C] + xr[(i + d) % C];
      y[n * C + i] = xr[i] + alpha * (static_cast<T>(k) * xr[i] - neighbours);
    }
  }
}

template <class T>
void CpuOps<T>::row_dots(T* out, const T* a, const T* b, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (int64_t n = 0; n < N; ++n) {
    T s = 0;
    for (int64_t c = 0; c < C; ++c) s += a[n * C + c] * b[n * C + c];
    out[n] = s;
  }
}

template <class T>
void CpuOps<T>::cg_step(T* x, T* r, T* p, const T* ap, T* rs, T* rs_new, const T* pap, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T a = pap[n] > T(0) ? rs[n] / pap[n] : T(0);  // a converged row (r = 0) stays put
    T s = 0;
    for (int64_t c = 0; c < C; ++c) {
      x[n * C + c] += a * p[n * C + c];
      r[n * C + c] -= a * ap[n * C + c];
      s += r[n * C + c] * r[n * C + c];
    }
    const T beta = rs[n] > T(0) ? s / rs[n] : T(0);
    for (int64_t c = 0; c < C; ++c) p[n * C + c] = r[n * C + c] + beta * p[n * C + c];
    rs_new[n] = s;
    rs[n] = s;
  }
}

template <class T>
double CpuOps<T>::max_relative(const T* rs, const T* bb, int64_t N) {
  double worst = 0;
  for (int64_t n = 0; n < N; ++n)
    if (bb[n] > T(0)) worst = std::max(worst, std::sqrt(static_cast<double>(rs[n]) / static_cast<double>(bb[n])));
  return worst;
}

template <class T>
double CpuOps<T>::total_relative(const T* rs, const T* bb, int64_t N) {
  double r = 0, b = 0;
  for (int64_t n = 0; n < N; ++n) {
    r += static_cast<double>(rs[n]);
    b += static_cast<double>(bb[n]);
  }
  return b > 0 ? std::sqrt(r / b) : 0.0;
}

template <class T>
void CpuOps<T>::grad_norm(T* norm, const T* grads, int64_t n) {
  double sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum) if (parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(grads[i]) * static_cast<double>(grads[i]);
  *norm = static_cast<T>(std::sqrt(sum));
}

// AdamW as torch.optim.AdamW: per_tensor follows _single_tensor_adamw op by op for each tensor,
// foreach runs each op over all tensors, fused does everything in one pass. Clipping multiplies the
// gradients by the clip factor first (clip_grad_norm_'s foreach mul_), or inside the fused pass.
template <class T>
void CpuOps<T>::adamw(OptimizerKind kind, T* params, const T* grads_in, T* m, T* v,
                      const std::vector<TensorSpan>& tensors, const AdamwScalars& s, const T* norm, double clip) {
  const T factor = clip_factor(*norm, clip);
  T* grads = const_cast<T*>(grads_in);  // clipping scales the gradients in place, as PyTorch does
  const T lr = static_cast<T>(s.lr), b1 = static_cast<T>(s.beta1), b2 = static_cast<T>(s.beta2);
  const T eps = static_cast<T>(s.eps), decay = static_cast<T>(1.0 - s.lr * s.weight_decay);
  const T step_size = static_cast<T>(s.step_size), bc2 = static_cast<T>(s.bias_correction2_sqrt);
  if (kind == OptimizerKind::fused) {
    int64_t total = 0;
    for (const auto& t : tensors) total = std::max(total, t.offset + t.size);
#pragma omp parallel for schedule(static) if (parallel_worth(total))
    for (int64_t i = 0; i < total; ++i) {
      const T g = grads[i] * factor;
      const T mi = b1 * m[i] + (T(1) - b1) * g;
      const T vi = b2 * v[i] + (T(1) - b2) * g * g;
      m[i] = mi;
      v[i] = vi;
      params[i] = params[i] * decay - step_size * mi / (std::sqrt(vi) / bc2 + eps);
      grads[i] = g;
    }
    return;
  }
  (void)lr;
  int64_t largest = 0;
  for (const auto& t : tensors) largest = std::max(largest, t.size);
  if (static_cast<int64_t>(denom_.size()) < largest) denom_.resize(static_cast<std::size_t>(largest));
  T* denom = denom_.data();
  // One elementwise pass of op `op` over tensor t (PyTorch parallelises each op over its elements).
  auto pass = [&](int op, const TensorSpan& t) {
    T* p = params + t.offset;
    T* g = grads + t.offset;
    T* mt = m + t.offset;
    T* vt = v + t.offset;
    const int64_t n = t.size;
#pragma omp parallel for schedule(static) if (parallel_worth(n))
    for (int64_t i = 0; i < n; ++i) {
      switch (op) {
        case 0: g[i] *= factor; break;                           // clip_grad_norm_: grads.mul_(clip_coef)
        case 1: p[i] *= decay; break;                            // param.mul_(1 - lr * wd)
        case 2: mt[i] += (T(1) - b1) * (g[i] - mt[i]); break;    // exp_avg.lerp_(grad, 1 - beta1)
        case 3: vt[i] *= b2; break;                              // exp_avg_sq.mul_(beta2)
        case 4: vt[i] += (T(1) - b2) * g[i] * g[i]; break;       // .addcmul_(grad, grad, 1 - beta2)
        case 5: denom[i] = std::sqrt(vt[i]); break;              // denom = exp_avg_sq.sqrt()
        case 6: denom[i] = denom[i] / bc2 + eps; break;          // .div_(bc2_sqrt).add_(eps)
        case 7: p[i] -= step_size * mt[i] / denom[i]; break;     // param.addcdiv_(exp_avg, denom, -step_size)
      }
    }
  };
  if (kind == OptimizerKind::per_tensor) {
    for (const auto& t : tensors) pass(0, t);
    for (const auto& t : tensors)
      for (int op = 1; op < 8; ++op) pass(op, t);
  } else {
    // foreach: each op over every tensor before the next op; the denominator needs its own pass per
    // tensor since the scratch holds one tensor (torch._foreach_sqrt allocates a list instead).
    for (int op = 0; op < 5; ++op)
      for (const auto& t : tensors) pass(op, t);
    for (const auto& t : tensors)
      for (int op = 5; op < 8; ++op) pass(op, t);
  }
}

template <class T>
void CpuOps<T>::sum_losses(T* acc, const T* losses, int64_t n, T scale) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(losses[i]);
  *acc += static_cast<T>(sum) * scale;
}

template <class T>
void CpuOps<T>::allreduce_sum(T* data, int64_t n, int64_t bucket) {
  comm::Group& world = comm::world();
  const comm::Elem elem = std::is_same_v<T, float> ? comm::Elem::f32 : comm::Elem::f64;
  comm::for_each_bucket_from_end(n, bucket, [&](int64_t begin, int64_t length) {
    world.allreduce(data + begin, data + begin, length, elem, comm::Reduce::sum);
  });
}

template class CpuOps<float>;
template class CpuOps<double>;

}  // namespace tb::step
