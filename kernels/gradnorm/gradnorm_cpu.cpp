// Gradient norm and clipping on the CPU: tensor by tensor (a norm, then a scale, per tensor, each
// parallel above PyTorch's grain), one reduction and one scale over every tensor's chunks, or both
// in one parallel region (reduce, barrier, scale).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "gradnorm.h"
#include "runtime/defaults.h"
#include "runtime/host_buffer.h"

namespace tb::gradnorm {

namespace {

using adamw::load_float;
using adamw::store_float;

template <class G>
double sum_of_squares(const G* __restrict g, int64_t n) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    const double x = load_float(g, i);
    acc += x * x;
  }
  return acc;
}

template <class G>
void scale(G* __restrict g, int64_t n, float coef) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) store_float(g, i, load_float(g, i) * coef);
}

// A tensor's norm the way `p.grad.norm()` runs on the CPU: one thread below the grain.
template <class G>
double tensor_sum_of_squares(const G* g, int64_t n) {
  if (n <= cpu_grain) return sum_of_squares(g, n);
  double acc = 0;
#pragma omp parallel reduction(+ : acc)
  {
    const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t begin = n * me / team, end = n * (me + 1) / team;
    acc += sum_of_squares(g + begin, end - begin);
  }
  return acc;
}

template <class G>
void tensor_scale(G* g, int64_t n, float coef) {
  if (n <= cpu_grain) return scale(g, n, coef);
#pragma omp parallel
  {
    const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t begin = n * me / team, end = n * (me + 1) / team;
    scale(g + begin, end - begin, coef);
  }
}

template <class G>
double clip_per_tensor(const ParamSet& set, G* grad, double max_norm) {
  double total_sq = 0;
  for (int64_t t = 0; t < set.count(); ++t) {
    if (set.sizes[t] == 0) continue;
    const double tensor_norm = std::sqrt(tensor_sum_of_squares(grad + set.offsets[t], set.sizes[t]));
    total_sq += tensor_norm * tensor_norm;
  }
  const double norm = std::sqrt(total_sq);
  if (max_norm <= 0) return norm;
  const auto coef = static_cast<float>(clip_coefficient(norm, max_norm));
  for (int64_t t = 0; t < set.count(); ++t)
    if (set.sizes[t] > 0) tensor_scale(grad + set.offsets[t], set.sizes[t], coef);
  return norm;
}

template <class G>
double clip_multi_tensor(const ParamSet& set, const std::vector<adamw::Chunk>& chunks, G* grad, double max_norm) {
  const auto count = static_cast<int64_t>(chunks.size());
  double total_sq = 0;
#pragma omp parallel for schedule(static) reduction(+ : total_sq) if (set.total > cpu_grain)
  for (int64_t c = 0; c < count; ++c)
    total_sq += sum_of_squares(grad + set.offsets[chunks[c].tensor] + chunks[c].begin, chunks[c].len);
  const double norm = std::sqrt(total_sq);
  if (max_norm <= 0) return norm;
  const auto coef = static_cast<float>(clip_coefficient(norm, max_norm));
#pragma omp parallel for schedule(static) if (set.total > cpu_grain)
  for (int64_t c = 0; c < count; ++c) scale(grad + set.offsets[chunks[c].tensor] + chunks[c].begin, chunks[c].len, coef);
  return norm;
}

// One team for both sweeps: partial sums per thread, a barrier, every thread sums the partials in
// the same order (so all agree on the factor), then scales the chunks it reduced.
template <class G>
double clip_fused(const ParamSet& set, const std::vector<adamw::Chunk>& chunks, G* grad, double max_norm, double* partial) {
  const auto count = static_cast<int64_t>(chunks.size());
  double norm = 0;
#pragma omp parallel if (set.total > cpu_grain)
  {
    const int team = omp_get_num_threads(), me = omp_get_thread_num();
    double acc = 0;
#pragma omp for schedule(static) nowait
    for (int64_t c = 0; c < count; ++c)
      acc += sum_of_squares(grad + set.offsets[chunks[c].tensor] + chunks[c].begin, chunks[c].len);
    partial[me] = acc;
#pragma omp barrier
    double total_sq = 0;
    for (int k = 0; k < team; ++k) total_sq += partial[k];
    if (me == 0) norm = std::sqrt(total_sq);
    if (max_norm > 0) {
      const auto coef = static_cast<float>(clip_coefficient(std::sqrt(total_sq), max_norm));
#pragma omp for schedule(static)
      for (int64_t c = 0; c < count; ++c) scale(grad + set.offsets[chunks[c].tensor] + chunks[c].begin, chunks[c].len, coef);
    }
  }
  return norm;
}

template <class G>
class CpuGradNorm final : public Instance, public GradSource {
 public:
  CpuGradNorm(const ParamSet& set, Dtype dtype, Kind kind)
      : set_(set),
        dtype_(dtype),
        kind_(kind),
        chunks_(adamw::make_chunks(set, chunk)),
        grad_(static_cast<std::size_t>(set.arena)),
        partial_(static_cast<std::size_t>(omp_get_max_threads())) {
    if constexpr (std::is_same_v<G, float>) adamw::fill_arena(set, chunks_, adamw::seed_grad, grad_.data());
    else adamw::fill_arena_bf16(set, chunks_, adamw::seed_grad, grad_.data());
  }

  void run() override {
    ++calls_;
    norm_ = cpu_clip(kind_, set_, chunks_, grad_.data(), defaults::clip_max_norm, partial_.data());
  }

  Verdict check() override { return check_grads(set_, dtype_, calls_, grads()); }

  HostGrads grads() override {
    HostGrads out;
    if constexpr (std::is_same_v<G, float>) out.grad = adamw::gather(set_, grad_.data());
    else out.grad = adamw::gather_bf16(set_, grad_.data());
    out.norm = norm_;
    return out;
  }
  int64_t calls() const override { return calls_; }

 private:
  ParamSet set_;
  Dtype dtype_;
  Kind kind_;
  std::vector<adamw::Chunk> chunks_;
  HostBuffer<G> grad_;
  std::vector<double> partial_;
  double norm_ = 0;
  int64_t calls_ = 0;
};

}  // namespace

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(max_norm / (norm + defaults::clip_norm_eps), 1.0);
}

template <class G>
double cpu_clip(Kind kind, const ParamSet& set, const std::vector<adamw::Chunk>& chunks, G* grad, double max_norm,
                double* partial) {
  switch (kind) {
    case Kind::per_tensor:
      return clip_per_tensor(set, grad, max_norm);
    case Kind::multi_tensor:
      return clip_multi_tensor(set, chunks, grad, max_norm);
    case Kind::fused:
      return clip_fused(set, chunks, grad, max_norm, partial);
  }
  return 0;
}
template double cpu_clip<float>(Kind, const ParamSet&, const std::vector<adamw::Chunk>&, float*, double, double*);
template double cpu_clip<uint16_t>(Kind, const ParamSet&, const std::vector<adamw::Chunk>&, uint16_t*, double, double*);

std::unique_ptr<Instance> make_cpu(const Problem& problem, const RunContext&, Kind kind) {
  const ParamSet set = adamw::make_param_set(problem.get_int("params"), problem.get_int("tensors"));
  const Dtype dtype = adamw::dtype_from_string(problem.get("dtype"));
  if (dtype == Dtype::bf16) return std::make_unique<CpuGradNorm<uint16_t>>(set, dtype, kind);
  return std::make_unique<CpuGradNorm<float>>(set, dtype, kind);
}

}  // namespace tb::gradnorm
