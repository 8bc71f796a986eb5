// The all-reduce stage's plan (buckets) and reference (the sum in double of every rank's contents).
#include <algorithm>
#include <cmath>
#include <sstream>

#include "allreduce.h"
#include "runtime/comm.h"

namespace tb::allreduce {

ParamSet single_tensor(int64_t elements) {
  ParamSet set;
  set.sizes = {elements};
  set.starts = {0};
  set.offsets = {0};
  set.total = set.arena = elements;
  return set;
}

Setup setup_for(const Problem& p, Kind kind) {
  Setup s;
  if (kind == Kind::link) {
    s.set = single_tensor(p.get_int("link_mb") * (int64_t{1} << 20) / 4);
  } else {
    s.dtype = adamw::dtype_from_string(p.get("dtype"));
    s.set = adamw::make_param_set(p.get_int("params"), p.get_int("tensors"));
  }
  if (p.has("bucket_mb")) s.cap_bytes = p.get_double("bucket_mb") * double(1 << 20);
  if (p.has("tokens")) s.tokens = p.get_int("tokens");
  return s;
}

std::vector<std::pair<std::string, double>> OverlapParts::counters() const {
  std::vector<std::pair<std::string, double>> out{{"backward_ms", backward_s * 1e3}, {"allreduce_ms", allreduce_s * 1e3}};
  if (overlapped) out.emplace_back("hidden_share", hidden_share());
  return out;
}

OverlapParts measure_overlap_parts(const std::function<double(int part)>& seconds, int rounds) {
  std::vector<double> times[3];
  for (int r = 0; r < rounds; ++r)
    for (int part = 0; part < 3; ++part) times[part].push_back(seconds(part));
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  OverlapParts parts;
  parts.backward_s = median(times[0]);
  parts.allreduce_s = median(times[1]);
  parts.together_s = median(times[2]);
  return parts;
}

std::vector<Bucket> make_buckets(const ParamSet& set, double element_bytes, double cap_bytes) {
  std::vector<Bucket> buckets;
  const int64_t n = set.count();
  int64_t last = n - 1;  // the open bucket's last tensor (model order)
  double filled = 0;
  for (int64_t t = n - 1; t >= 0; --t) {
    filled += element_bytes * static_cast<double>(set.sizes[t]);
    if (filled >= cap_bytes || t == 0) {
      const int64_t end = set.offsets[last] + set.sizes[last];
      buckets.push_back(Bucket{t, last, set.offsets[t], end - set.offsets[t]});
      last = t - 1;
      filled = 0;
    }
  }
  return buckets;
}

std::vector<Bucket> calls_for(Kind kind, const ParamSet& set, double element_bytes, double cap_bytes) {
  switch (kind) {
    case Kind::per_tensor: {
      std::vector<Bucket> calls;
      for (int64_t t = set.count() - 1; t >= 0; --t)
        if (set.sizes[t] > 0) calls.push_back(Bucket{t, t, set.offsets[t], set.sizes[t]});
      return calls;
    }
    case Kind::flat:
    case Kind::link:
      return {Bucket{0, set.count() - 1, 0, set.arena}};
    case Kind::bucketed:
    case Kind::serial:
    case Kind::overlap:
      return make_buckets(set, element_bytes, cap_bytes);
  }
  return {};
}

float rank_value(int rank, int64_t index, Dtype dtype) {
  return adamw::initial_value(adamw::seed_grad + static_cast<uint64_t>(rank), index, dtype);
}

double expected_sum(int ranks, int64_t index, Dtype dtype) {
  double sum = 0;
  for (int r = 0; r < ranks; ++r) sum += rank_value(r, index, dtype);
  return sum;
}

Tolerance sum_tolerance(Dtype dtype, int ranks) {
  const double n = std::max(ranks, 1);
  if (dtype == Dtype::bf16) return Tolerance{n * tolerance::bf16.atol, tolerance::bf16.rtol};
  return Tolerance{n * tolerance::fp32.atol, tolerance::fp32.rtol};
}

Verdict check_sum(const std::vector<float>& got, int ranks, Dtype dtype) {
  const Tolerance tol = sum_tolerance(dtype, ranks);
  Verdict v;
  int64_t worst = 0, bad = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
    const double ref = expected_sum(ranks, i, dtype);
    const double err = std::isfinite(got[i]) ? std::abs(got[i] - ref) : INFINITY;
    if (err > v.max_error) {
      v.max_error = err;
      worst = i;
    }
    if (!tol.accepts(got[i], ref)) ++bad;
  }
  // Every rank checked its own copy: one that differs fails all of them, so that no rank goes on
  // timing a collective the others have left.
  const double local_bad = static_cast<double>(bad);
  const double any_bad = comm::agree_max(local_bad);
  v.max_error = comm::agree_max(v.max_error);
  v.passed = any_bad == 0;
  if (!v.passed) {
    std::ostringstream detail;
    if (bad > 0)
      detail << bad << " of " << got.size() << " reduced gradients differ from the sum over " << ranks << " ranks; worst at "
             << worst << ": " << got[static_cast<std::size_t>(worst)] << " vs " << expected_sum(ranks, worst, dtype);
    else detail << "another rank's reduced gradients differ from the sum over " << ranks << " ranks";
    v.detail = detail.str();
  }
  return v;
}

double rated_bytes(double buffer_bytes, int ranks) {
  return ranks > 1 ? buffer_bytes * comm::ring_bus_factor(ranks) : 2.0 * buffer_bytes;
}

#ifndef TRAINBENCH_HAVE_CUDA
std::string nccl_unavailable_reason() { return "built without CUDA"; }
#endif

}  // namespace tb::allreduce
