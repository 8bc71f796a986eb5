// The CPU backend's ops, in the formulas of llm.c's train_gpt2.c (layernorm, GELU, attention and
// cross-entropy backward), with the matrix products on the CPU BLAS.
#include "step/cpu_ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "collate/collate.h"
#include "gradnorm/gradnorm.h"
#include "layers/layers.h"
#include "runtime/comm.h"
#include "runtime/cpu_blas.h"
#include "runtime/cpu_clones.h"
#include "runtime/error.h"
#include "runtime/cpu_elementwise.h"
#include "runtime/defaults.h"
#include "runtime/simd_math.h"
#include "runtime/gelu.h"

namespace tb::step {

namespace {

using blas::gemm;

using cpu::parallel_worth;

}  // namespace

template <class T>
void CpuOps<T>::zero(T* p, int64_t n) {
  cpu::zero(p, n);
}

template <class T>
void CpuOps<T>::copy(T* dst, const T* src, int64_t n) {
  cpu::copy(dst, src, n);
}

template <class T>
void CpuOps<T>::add(T* out, const T* a, const T* b, int64_t n) {
  cpu::add(out, a, b, n);
}

template <class T>
void CpuOps<T>::gather_tokens(int32_t* batch, const int32_t* rows, const int32_t* picked, int64_t B, int64_t Tn) {
  collate::stack_token_rows(rows, Tn, picked, B, batch);
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
void CpuOps<T>::encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t Tn, int64_t C) {
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
void CpuOps<T>::layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C,
                                  bool bf16_only) {
  (void)bf16_only;  // the CPU's products read fp32: the output is written as always
  layers::cpu_layernorm_forward(out, mean, rstd, inp, w, b, N, C);
}

template <class T>
T* CpuOps<T>::partials(int64_t n) {
  if (n > partials_size_) {
    partials_ = Buffer<T>();  // freed before the larger one is allocated
    partials_ = alloc<T>(n);
    partials_size_ = n;
  }
  return partials_.data();
}

template <class T>
attention::FusedWorkspace& CpuOps<T>::fused_workspace(int64_t head_dim, int64_t seq) {
  if (!attention_ws_) {
    attention_ws_ = std::make_unique<attention::FusedWorkspace>(head_dim, seq);
    attention_ws_bytes_ = MeteredBytes(attention_ws_->bytes(), meter_);
  }
  return *attention_ws_;
}

template <class T>
void CpuOps<T>::layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean,
                                   const T* rstd, int64_t N, int64_t C) {
  T* partial = partials(static_cast<int64_t>(omp_get_max_threads()) * 2 * C);  // per-thread dw, db
  int team = 1;
#pragma omp parallel
  {
    const int me = omp_get_thread_num();
    if (me == 0) team = omp_get_num_threads();
    T* pdw = partial + static_cast<int64_t>(me) * 2 * C;
    T* pdb = pdw + C;
    std::fill(pdw, pdw + 2 * C, T(0));
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
  for (int t = 0; t < team; ++t)
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
  gemm(false, false, N, C, OC, T(1), dout, OC, w, C, T(0), dinp, C);
  gemm(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dw, C);
  if (!dbias) return;
  // Column sums row by row (contiguous, vectorised), each thread over its rows into its own partial.
  const int threads = parallel_worth(N * OC) ? omp_get_max_threads() : 1;
  T* partial = partials(static_cast<int64_t>(threads) * OC);
  int64_t used = 1;
#pragma omp parallel num_threads(threads)
  {
    const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
    if (me == 0) used = team;
    T* sum = partial + me * OC;
    std::fill(sum, sum + OC, T(0));
    for (int64_t n = N * me / team; n < N * (me + 1) / team; ++n) {
      const T* row = dout + n * OC;
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) sum[o] += row[o];
    }
  }
  for (int64_t t = 0; t < used; ++t)
    for (int64_t o = 0; o < OC; ++o) dbias[o] += partial[t * OC + o];
}

// The attention stage's kernels on the packed rows: Q, K, V are columns [0, C), [C, 2C), [2C, 3C) of
// qkv's rows, each head hs = C / NH of them; O is [B, T, C].
template <class T>
void CpuOps<T>::attention_forward(T* out, T* saved, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH, bool fused,
                                  bool /*bf16*/) {
  const attention::Shape shape{B, NH, Tn, C / NH};
  const attention::Operands<T> x{qkv, qkv + C, qkv + 2 * C, out, attention::bshd(shape, 3 * C), attention::bshd(shape, C)};
  if constexpr (std::is_same_v<T, double>) {
    attention::reference_forward(shape, true, x, saved);  // the oracle: the same function both ways
    (void)fused;
  } else if (fused) {
    attention::cpu_fused_forward(shape, true, x, saved, fused_workspace(shape.head_dim, Tn));
  } else {
    attention::cpu_naive_forward(shape, attention::Mask::implicit, x, saved);
  }
}

template <class T>
void CpuOps<T>::attention_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* out, const T* saved, int64_t B,
                                   int64_t Tn, int64_t C, int64_t NH, bool fused, bool /*bf16*/) {
  const attention::Shape shape{B, NH, Tn, C / NH};
  const attention::Operands<T> x{
      qkv, qkv + C, qkv + 2 * C, const_cast<T*>(out), attention::bshd(shape, 3 * C), attention::bshd(shape, C)};
  const attention::Gradients<T> g{dqkv, dqkv + C, dqkv + 2 * C, dout};
  if constexpr (std::is_same_v<T, double>) {
    attention::reference_backward(shape, true, x, g);
    (void)fused, (void)scratch, (void)saved;
  } else if (fused) {
    attention::cpu_fused_backward(shape, true, x, saved, g, fused_workspace(shape.head_dim, Tn));
  } else {
    attention::cpu_naive_backward(shape, x, saved, g, scratch);
  }
}

// GELU with the tanh approximation (GPT-2's), and its derivative. In float, 16 lanes at a time with a
// GELU backward; the forward is layers::cpu_gelu_forward. float: a vector tanh, as PyTorch's CPU kernel
// does; the double backend (the oracle) calls std::tanh.
template <class T>
void gelu_backward_scalar(T* dinp, const T* inp, const T* dout, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const T x = inp[i], th = std::tanh(gelu::inner(x));
    const T local = T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * static_cast<T>(gelu::scale) *
                                               (T(1) + T(3) * static_cast<T>(gelu::cubic) * x * x);
    dinp[i] = local * dout[i];
  }
}

TB_CPU_CLONES void gelu_backward_range(float* dinp, const float* inp, const float* dout, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + simd::lanes <= end; i += simd::lanes) {
    const simd::vf8 x = simd::load8(inp + i);
    const simd::vf8 th = simd::tanh8(static_cast<float>(gelu::scale) * (x + static_cast<float>(gelu::cubic) * x * x * x));
    const simd::vf8 local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * static_cast<float>(gelu::scale) *
                                                     (1.0f + 3.0f * static_cast<float>(gelu::cubic) * x * x);
    simd::store8(dinp + i, local * simd::load8(dout + i));
  }
  gelu_backward_scalar(dinp, inp, dout, i, end);
}

template <class T>
void CpuOps<T>::gelu_forward(T* out, const T* inp, int64_t n, bool bf16_only) {
  (void)bf16_only;  // the CPU's products read fp32: the output is written as always
  layers::cpu_gelu_forward(out, inp, n);
}

template <class T>
void CpuOps<T>::gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, bool bf16_only) {
  (void)bf16_only;  // the CPU's products read fp32: the output is written as always
  if constexpr (std::is_same_v<T, float>)
    cpu::over_pieces(n, [&](int64_t begin, int64_t end) { gelu_backward_range(dinp, inp, dout, begin, end); });
  else cpu::over_pieces(n, [&](int64_t begin, int64_t end) { gelu_backward_scalar(dinp, inp, dout, begin, end); });
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
    for (int64_t v = 0; v < V; ++v) dlogits[n * V + v] = (probs[n * V + v] - (v == targets[n] ? T(1) : T(0))) * dloss;
}

template <class T>
void CpuOps<T>::clip_gradients(T* norm, T* grads, const adamw::ParamSet& set, OptimizerKind kind, double max_norm) {
  if constexpr (std::is_same_v<T, double>) {
    *norm = gradnorm::reference_clip(grads, set.total, max_norm);
    (void)kind;
  } else {
    if (clip_chunks_.empty()) {
      clip_chunks_ = adamw::make_chunks(set, gradnorm::chunk);
      clip_partial_.resize(static_cast<std::size_t>(omp_get_max_threads()));
    }
    // clip_grad_norm_ as the optimizer's path runs it: per tensor beside the for-loop AdamW (PyTorch's
    // CPU has no foreach kernels), one multi-tensor pass beside foreach, fused beside fused.
    const gradnorm::Kind way = kind == OptimizerKind::per_tensor ? gradnorm::Kind::per_tensor
                               : kind == OptimizerKind::foreach  ? gradnorm::Kind::multi_tensor
                                                                 : gradnorm::Kind::fused;
    *norm = static_cast<T>(gradnorm::cpu_clip(way, set, clip_chunks_, grads, max_norm, clip_partial_.data()));
  }
}

template <class T>
void CpuOps<T>::adamw(OptimizerKind kind, const adamw::ParamSet& set, T* params, const T* grads, T* m, T* v,
                      const adamw::Hyper& h, int64_t step) {
  if constexpr (std::is_same_v<T, double>) {
    adamw::reference_step(set.total, params, grads, m, v, h, step);
    (void)kind;
  } else {
    if (!adamw_plan_) {
      const adamw::Kind way = kind == OptimizerKind::per_tensor ? adamw::Kind::per_tensor
                              : kind == OptimizerKind::foreach  ? adamw::Kind::foreach
                                                                : adamw::Kind::fused;
      adamw_plan_ = std::make_unique<adamw::CpuPlan>(set, way);
      adamw_plan_bytes_ = MeteredBytes(adamw_plan_->host_bytes(), meter_);  // as CudaOps meters its plan
    }
    adamw::cpu_step(*adamw_plan_, adamw::State<float>{params, grads, m, v}, adamw::step_scalars(h, step));
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
