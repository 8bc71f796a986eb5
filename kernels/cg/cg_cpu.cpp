// CPU `cg`: host-checked CG with OpenMP, started cold, warm or lazily (cg.h). Each pass over the vectors
// fuses what it can (the matvec with its dot product, both axpys with the new residual norm), and
// every reduction is summed per thread over a fixed range, then across threads in order, so a window
// takes the same decisions every time it is replayed.
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>

#include "cg/cg.h"
#include "runtime/host_buffer.h"
#include "spmv/spmv.h"

namespace tb::cg {

namespace {

// This thread's contiguous share of [0, n): the split OpenMP's static schedule makes.
std::pair<int64_t, int64_t> thread_range(int64_t n) {
  const int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
  const int64_t q = n / threads, r = n % threads;
  const int64_t lo = t * q + std::min(t, r);
  return {lo, lo + q + (t < r ? 1 : 0)};
}

class CpuCg final : public WindowSolver {
 public:
  CpuCg(const Problem& p, Start start)
      : WindowSolver(p, start),
        a_(laplacian::build_shifted_laplacian(graph_, settings_.alpha)),
        n_(settings_.rows),
        x_(static_cast<std::size_t>(n_)),
        cache_(static_cast<std::size_t>(n_)),
        r_(static_cast<std::size_t>(n_)),
        p_(static_cast<std::size_t>(n_)),
        q_(static_cast<std::size_t>(n_)),
        partials_(static_cast<std::size_t>(2 * omp_get_max_threads())) {
    double *x = x_.data(), *c = cache_.data(), *r = r_.data(), *pv = p_.data(), *q = q_.data();
#pragma omp parallel
    {
      const auto [lo, hi] = thread_range(n_);
      for (int64_t i = lo; i < hi; ++i) x[i] = c[i] = r[i] = pv[i] = q[i] = 0.0;
    }
    if (starts_from_cache()) {  // the cache a window starts from: b_0 solved from zero
      if (!start_cold(rhs_.b(0))) iterate();
      std::copy(x_.data(), x_.data() + n_, cache_.data());
      tally_ = Tally{};
    }
  }

  std::vector<double> solution() override { return std::vector<double>(x_.data(), x_.data() + n_); }
  Tally tally() override { return tally_; }

 protected:
  void begin_window() override {
    if (!starts_from_cache()) return;
    const double* c = cache_.data();
    double* x = x_.data();
#pragma omp parallel
    {
      const auto [lo, hi] = thread_range(n_);
      std::copy(c + lo, c + hi, x + lo);
    }
  }
  void start(int t) override {
    switch (start_) {
      case Start::cold:
        done_ = start_cold(rhs_.b(t));
        return;
      case Start::warm:  // never skipped: iterate() takes it to tol (no iteration when already there)
        start_warm(rhs_.b(t));
        done_ = false;
        return;
      case Start::lazy:
        done_ = gate(rhs_.b(t));
        return;
    }
  }
  bool started_done() override { return done_; }
  void finish(int) override { iterate(); }
  double time_part(const std::function<void()>& part) override {
    const auto begin = std::chrono::steady_clock::now();
    part();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  }

 private:
  // Runs body(lo, hi, sums) on every thread's range and returns the K sums, added in thread order.
  template <int K, class Body>
  std::array<double, K> reduce(Body&& body) {
    double* partial = partials_.data();
    int threads = 1;
#pragma omp parallel
    {
      const auto [lo, hi] = thread_range(n_);
      double sums[K] = {};
      body(lo, hi, sums);
      for (int k = 0; k < K; ++k) partial[K * omp_get_thread_num() + k] = sums[k];
#pragma omp single
      threads = omp_get_num_threads();
    }
    std::array<double, K> total{};
    for (int t = 0; t < threads; ++t)
      for (int k = 0; k < K; ++k) total[k] += partial[K * t + k];
    return total;
  }

  double row(const double* v, int64_t i) const {
    return spmv::csr_row_dot(a_.row_ptr[i], a_.row_ptr[i + 1], a_.col.data(), a_.val.data(), v);
  }

  // The warm start: r = b - A x from the current x (the cache, or the previous step's solution),
  // p = r; one matvec.
  void start_warm(const double* b) {
    const double* x = x_.data();
    double *r = r_.data(), *p = p_.data();
    const auto [rr, bb] = reduce<2>([&](int64_t lo, int64_t hi, double* s) {
      for (int64_t i = lo; i < hi; ++i) {
        const double ri = b[i] - row(x, i);
        r[i] = p[i] = ri;
        s[0] += ri * ri;
        s[1] += b[i] * b[i];
      }
    });
    rr_ = rr;
    bb_ = bb;
    ++tally_.matvecs;
  }

  // The gate: the warm start, and a skip when ||r|| < lazy_tol ||b||.
  bool gate(const double* b) {
    start_warm(b);
    if (rr_ > settings_.lazy_tol * settings_.lazy_tol * bb_) return false;
    ++tally_.solves;
    ++tally_.skips;
    tally_.worst_residual = std::max(tally_.worst_residual, relative(rr_));
    return true;
  }

  // The cold start: x = 0, r = p = b; no matvec.
  bool start_cold(const double* b) {
    double *x = x_.data(), *r = r_.data(), *p = p_.data();
    const auto [bb] = reduce<1>([&](int64_t lo, int64_t hi, double* s) {
      double sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = lo; i < hi; ++i) {
        x[i] = 0.0;
        r[i] = p[i] = b[i];
        sum += b[i] * b[i];
      }
      s[0] = sum;
    });
    rr_ = bb_ = bb;
    if (bb > 0) return false;
    ++tally_.solves;  // b = 0: x = 0 is the solution
    return true;
  }

  // CG from the current x, r, p until ||r|| <= tol ||b||: the host reads the norm every iteration.
  void iterate() {
    double *x = x_.data(), *r = r_.data(), *p = p_.data(), *q = q_.data();
    const double limit = settings_.tol * settings_.tol * bb_;
    int it = 0;
    while (rr_ > limit && it < settings_.max_iterations) {
      const auto [pq] = reduce<1>([&](int64_t lo, int64_t hi, double* s) {
        for (int64_t i = lo; i < hi; ++i) {
          q[i] = row(p, i);
          s[0] += p[i] * q[i];
        }
      });
      const double alpha = rr_ / pq;
      const auto [rr] = reduce<1>([&](int64_t lo, int64_t hi, double* s) {
        double sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = lo; i < hi; ++i) {
          x[i] += alpha * p[i];
          r[i] -= alpha * q[i];
          sum += r[i] * r[i];
        }
        s[0] = sum;
      });
      const double beta = rr / rr_;
      rr_ = rr;
      ++it;
      if (rr_ <= limit) break;
#pragma omp parallel
      {
        // Named, not bound: clang's `omp simd` cannot capture a structured binding (C++17).
        const std::pair<int64_t, int64_t> range = thread_range(n_);
        const int64_t lo = range.first, hi = range.second;
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) p[i] = r[i] + beta * p[i];
      }
    }
    ++tally_.solves;
    tally_.iterations += it;
    tally_.matvecs += it;
    tally_.worst_residual = std::max(tally_.worst_residual, relative(rr_));
  }

  double relative(double rr) const { return bb_ > 0 ? std::sqrt(rr / bb_) : std::sqrt(rr); }

  laplacian::Csr a_;
  int64_t n_;
  HostBuffer<double> x_, cache_, r_, p_, q_;
  std::vector<double> partials_;
  double rr_ = 0, bb_ = 0;
  bool done_ = false;
  Tally tally_;
};

}  // namespace

std::unique_ptr<Instance> make_cpu_host_checked(const Problem& p, const RunContext&, Start start) {
  return std::make_unique<CpuCg>(p, start);
}

}  // namespace tb::cg
