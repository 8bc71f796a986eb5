// AdamW on the CPU, three ways. per_tensor and foreach run PyTorch's eight elementwise ops as
// separate passes (per tensor, parallel above PyTorch's grain; or each op once over all tensors'
// chunks); fused reads param, grad, exp_avg, exp_avg_sq once and writes param, exp_avg, exp_avg_sq
// once, in one OpenMP loop over all tensors' chunks.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#if defined(__SSE__)
#include <immintrin.h>
#endif

#include "adamw.h"
#include "runtime/cpu_clones.h"
#include "runtime/host_buffer.h"

namespace tb::adamw {

namespace {

// out = sqrt(in), correctly rounded, four at a time: the compiler does not vectorise std::sqrt
// without -fno-math-errno, and sqrt is the one op of the update it would otherwise leave scalar.
inline void sqrt_to(float* __restrict out, const float* __restrict in, int64_t n) {
  int64_t i = 0;
#if defined(__SSE__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(out + i, _mm_sqrt_ps(_mm_loadu_ps(in + i)));
#endif
  for (; i < n; ++i) out[i] = std::sqrt(in[i]);
}

// ---- the eight ops of the for-loop path, each one pass over a range ----------------------------
template <class P>
void op_mul(P* __restrict x, int64_t n, float a) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) store_float(x, i, load_float(x, i) * a);
}
template <class P>
void op_lerp(float* __restrict self, const P* __restrict end, int64_t n, float weight) {  // weight < 0.5
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) self[i] = self[i] + weight * (load_float(end, i) - self[i]);
}
template <class P>
void op_addcmul(float* __restrict self, const P* __restrict t1, const P* __restrict t2, int64_t n, float value) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) self[i] = self[i] + value * load_float(t1, i) * load_float(t2, i);
}
void op_div(float* __restrict x, int64_t n, float a) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / a;
}
void op_div_to(float* __restrict out, const float* __restrict in, int64_t n, float a) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] / a;
}
void op_add(float* __restrict x, int64_t n, float a) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] + a;
}
template <class P>
void op_addcdiv(P* __restrict self, const float* __restrict t1, const float* __restrict t2, int64_t n, float value) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) store_float(self, i, load_float(self, i) + value * t1[i] / t2[i]);
}

// Pointers to one range (a tensor, or a chunk of one) of every buffer. `root` and `denom` are the
// temporaries (the same buffer where the division is in place).
template <class P>
struct Range {
  P* param;
  const P* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float* root;
  float* denom;
  int64_t n;
};

template <class P>
void run_op(int op, const Range<P>& r, const StepScalars& s) {
  switch (op) {
    case 0:
      op_mul(r.param, r.n, s.decay);
      break;
    case 1:
      op_lerp(r.exp_avg, r.grad, r.n, s.one_minus_beta1);
      break;
    case 2:
      op_mul(r.exp_avg_sq, r.n, s.beta2);
      break;
    case 3:
      op_addcmul(r.exp_avg_sq, r.grad, r.grad, r.n, s.one_minus_beta2);
      break;
    case 4:
      sqrt_to(r.root, r.exp_avg_sq, r.n);
      break;
    case 5:
      if (r.denom == r.root) op_div(r.denom, r.n, s.bias_correction2_sqrt);
      else op_div_to(r.denom, r.root, r.n, s.bias_correction2_sqrt);
      break;
    case 6:
      op_add(r.denom, r.n, s.eps);
      break;
    case 7:
      op_addcdiv(r.param, r.exp_avg, r.denom, r.n, -s.step_size);
      break;
  }
}

template <class P>
Range<P> sub_range(const Range<P>& r, int64_t begin, int64_t end) {
  return Range<P>{r.param + begin, r.grad + begin,  r.exp_avg + begin, r.exp_avg_sq + begin,
                  r.root + begin,  r.denom + begin, end - begin};
}

// Asks for the lines of `bytes` bytes at `from` ahead of their use.
inline __attribute__((always_inline)) void prefetch_lines(const void* from, int64_t bytes, bool for_write) {
  const char* at = static_cast<const char*>(from);
  for (int64_t k = 0; k < bytes; k += 64) {
    if (for_write) __builtin_prefetch(at + k, 1);
    else __builtin_prefetch(at + k, 0);
  }
}

// The fused update of one range: PyTorch's _fused_adamw arithmetic, one pass that reads p, g, m, v and
// writes p, m, v once, except that sqrt(v) is multiplied by the step's 1 / sqrt(bias_correction2) where
// torch divides by it (one rounding apart, within the stage's tolerance; the division and the sqrt
// are the loop's slowest instructions). Vectorised: the file is built with -fno-math-errno so that sqrt
// vectorises with the rest, and the loop is cloned for AVX-512 and AVX2 (as a baseline-x86-64 loop,
// four lanes of SSE, it ran at 0.73x torch's fused). In tiles of 64 elements, each asking for its
// streams' lines 1 KiB of floats ahead: the sqrt and division hold the out-of-order window, and
// without the prefetches fewer loads were in flight (measured on 2 Xeon cores: 50-52 GB/s without,
// 56-57 with).
template <class P>
inline __attribute__((always_inline)) void fused_body(const Range<P>& r, const StepScalars& s) {
  constexpr int64_t tile = 64, ahead = 256;
  const P* __restrict grad = r.grad;
  float* __restrict exp_avg = r.exp_avg;
  float* __restrict exp_avg_sq = r.exp_avg_sq;
  P* __restrict param = r.param;
  const float inverse_bias_correction2_sqrt = 1.0f / s.bias_correction2_sqrt;
  for (int64_t t0 = 0; t0 < r.n; t0 += tile) {
    prefetch_lines(grad + t0 + ahead, tile * sizeof(P), false);
    prefetch_lines(param + t0 + ahead, tile * sizeof(P), true);
    prefetch_lines(exp_avg + t0 + ahead, tile * sizeof(float), true);
    prefetch_lines(exp_avg_sq + t0 + ahead, tile * sizeof(float), true);
    const int64_t end = std::min(r.n, t0 + tile);
#pragma omp simd
    for (int64_t i = t0; i < end; ++i) {
      const float g = load_float(grad, i);
      const float m = s.beta1 * exp_avg[i] + s.one_minus_beta1 * g;
      const float v = s.beta2 * exp_avg_sq[i] + s.one_minus_beta2 * g * g;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      float p = load_float(param, i);
      p -= s.lr_weight_decay * p;
      const float denom = std::sqrt(v) * inverse_bias_correction2_sqrt + s.eps;
      p -= s.step_size * m / denom;
      store_float(param, i, p);
    }
  }
}
TB_CPU_CLONES void fused_range(const Range<float>& r, const StepScalars& s) { fused_body(r, s); }
TB_CPU_CLONES void fused_range(const Range<uint16_t>& r, const StepScalars& s) { fused_body(r, s); }

template <class P>
Range<P> tensor_range(const ParamSet& set, const State<P>& x, int64_t t, float* root, float* denom) {
  const int64_t o = set.offsets[t];
  return Range<P>{x.param + o, x.grad + o, x.exp_avg + o, x.exp_avg_sq + o, root, denom, set.sizes[t]};
}

// PyTorch's for-loop path: tensor by tensor, op by op; an op splits its tensor over the team only
// above the grain (as at::parallel_for does), else runs on the calling thread.
template <class P>
void run_per_tensor(CpuPlan& plan, const State<P>& x, const StepScalars& s) {
  const ParamSet& set = plan.set();
  for (int64_t t = 0; t < set.count(); ++t) {
    if (set.sizes[t] == 0) continue;
    const Range<P> r = tensor_range(set, x, t, plan.root(), plan.denom());
    for (int op = 0; op < op_count; ++op) {
      if (r.n <= cpu_grain) {
        run_op(op, r, s);
        continue;
      }
#pragma omp parallel
      {
        const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
        run_op(op, sub_range(r, r.n * me / team, r.n * (me + 1) / team), s);
      }
    }
  }
}

// The foreach path: each op once, over every tensor's chunks in one parallel loop.
template <class P>
void run_foreach(CpuPlan& plan, const State<P>& x, const StepScalars& s) {
  const ParamSet& set = plan.set();
  const std::vector<Chunk>& chunks = plan.chunks();
  const auto count = static_cast<int64_t>(chunks.size());
  for (int op = 0; op < op_count; ++op) {
#pragma omp parallel for schedule(static) if (set.total > cpu_grain)
    for (int64_t c = 0; c < count; ++c) {
      const Chunk ch = chunks[c];
      float* root = plan.root() + set.offsets[ch.tensor];  // divided in place: denom is root
      const Range<P> r = tensor_range(set, x, ch.tensor, root, root);
      run_op(op, sub_range(r, ch.begin, ch.begin + ch.len), s);
    }
  }
}

template <class P>
void run_fused(CpuPlan& plan, const State<P>& x, const StepScalars& s) {
  const ParamSet& set = plan.set();
  const std::vector<Chunk>& chunks = plan.chunks();
  const auto count = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(static) if (set.total > cpu_grain)
  for (int64_t c = 0; c < count; ++c) {
    const Chunk ch = chunks[c];
    const int64_t o = set.offsets[ch.tensor] + ch.begin;  // the fused pass has no temporary
    fused_range(Range<P>{x.param + o, x.grad + o, x.exp_avg + o, x.exp_avg_sq + o, nullptr, nullptr, ch.len}, s);
  }
}

template <class P>
void step_any(CpuPlan& plan, const State<P>& x, const StepScalars& s) {
  switch (plan.kind()) {
    case Kind::per_tensor:
      return run_per_tensor(plan, x, s);
    case Kind::foreach:
      return run_foreach(plan, x, s);
    case Kind::fused:
      return run_fused(plan, x, s);
  }
}

template <class P>
class CpuAdamw final : public Instance, public StateSource {
 public:
  CpuAdamw(const ParamSet& set, Dtype dtype, Kind kind)
      : set_(set),
        dtype_(dtype),
        plan_(set, kind),
        param_(static_cast<std::size_t>(set.arena)),
        grad_(static_cast<std::size_t>(set.arena)),
        exp_avg_(static_cast<std::size_t>(set.arena)),
        exp_avg_sq_(static_cast<std::size_t>(set.arena)) {
    const std::vector<Chunk>& chunks = plan_.chunks();
    if constexpr (std::is_same_v<P, float>) {
      fill_arena(set, chunks, seed_param, param_.data());
      fill_arena(set, chunks, seed_grad, grad_.data());
    } else {
      fill_arena_bf16(set, chunks, seed_param, param_.data());
      fill_arena_bf16(set, chunks, seed_grad, grad_.data());
    }
    zero_arena(set, chunks, exp_avg_.data());
    zero_arena(set, chunks, exp_avg_sq_.data());
  }

  void run() override {
    cpu_step(plan_, State<P>{param_.data(), grad_.data(), exp_avg_.data(), exp_avg_sq_.data()}, step_scalars(++steps_));
  }

  Verdict check() override { return check_state(set_, dtype_, steps_, state()); }

  HostState state() override {
    HostState out;
    if constexpr (std::is_same_v<P, float>) out.param = gather(set_, param_.data());
    else out.param = gather_bf16(set_, param_.data());
    out.exp_avg = gather(set_, exp_avg_.data());
    out.exp_avg_sq = gather(set_, exp_avg_sq_.data());
    return out;
  }
  int64_t steps() const override { return steps_; }

 private:
  ParamSet set_;
  Dtype dtype_;
  CpuPlan plan_;
  HostBuffer<P> param_, grad_;
  HostBuffer<float> exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

}  // namespace

// The temporaries: the for-loop path's per tensor (the largest), the foreach path's per arena (zeroed
// here; a packed set, the training step's, has no padding to round up to).
CpuPlan::CpuPlan(const ParamSet& set, Kind kind)
    : set_(set),
      kind_(kind),
      chunks_(make_chunks(set, cpu_chunk)),
      root_(static_cast<std::size_t>(kind == Kind::per_tensor ? std::max<int64_t>(set.largest(), 1)
                                     : kind == Kind::foreach  ? set.arena
                                                              : 1)),
      denom_(static_cast<std::size_t>(kind == Kind::per_tensor ? std::max<int64_t>(set.largest(), 1) : 1)) {}

void cpu_step(CpuPlan& plan, const State<float>& x, const StepScalars& s) { step_any(plan, x, s); }
void cpu_step(CpuPlan& plan, const State<uint16_t>& x, const StepScalars& s) { step_any(plan, x, s); }

std::unique_ptr<Instance> make_cpu(const Problem& problem, const RunContext&, Kind kind) {
  const ParamSet set = make_param_set(problem.get_int("params"), problem.get_int("tensors"));
  const Dtype dtype = dtype_from_string(problem.get("dtype"));
  if (dtype == Dtype::bf16) return std::make_unique<CpuAdamw<uint16_t>>(set, dtype, kind);
  return std::make_unique<CpuAdamw<float>>(set, dtype, kind);
}

}  // namespace tb::adamw
