// CPU ceilings: STREAM copy and triad with OpenMP (first touch by the same static schedule that the
// plain loop uses, so each thread streams its own NUMA-local pages), each the fastest of the ways it
// searched, and SGEMM from the CPU BLAS.
#include <cblas.h>
#include <omp.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "peak.h"
#include "runtime/host_buffer.h"
#include "runtime/random.h"

namespace tb::peak {

namespace {

// [begin, end) of thread `t` of `threads` in a static split of n elements, its boundaries on whole
// 64-byte lines (8 doubles), so that a thread's non-temporal stores start aligned and no two threads
// write one line.
std::pair<int64_t, int64_t> chunk_of(int64_t n, int t, int threads) {
  const int64_t lines = (n + 7) / 8;
  const int64_t begin = std::min(n, lines * t / threads * 8);
  const int64_t end = std::min(n, lines * (t + 1) / threads * 8);
  return {begin, end};
}

// Runs body(begin, end) on a team of `threads`, each thread on its chunk_of the n elements.
template <class Body>
void on_team(int threads, int64_t n, const Body& body) {
#pragma omp parallel num_threads(threads)
  {
    const auto [begin, end] = chunk_of(n, omp_get_thread_num(), omp_get_num_threads());
    body(begin, end);
  }
}

// One way to do a row's work, by name.
struct Candidate {
  std::string name;
  std::function<void()> run;
};

// The team sizes searched: every thread OpenMP has, and half of them (on a VM whose vCPUs share a
// memory path, fewer streams can be faster).
std::vector<int> team_sizes() {
  const int all = std::max(1, omp_get_max_threads());
  std::vector<int> sizes{all};
  if (all > 1) sizes.push_back(all / 2);
  return sizes;
}

std::string threads_text(int threads) { return std::to_string(threads) + (threads == 1 ? " thread" : " threads"); }

// The STREAM rows: a ceiling is the best this machine shows, so the row searches its ways to do the
// work (the plain OpenMP loop a user would write with -O3 -fopenmp, and kernels that store around the
// cache, each at every team size) before it is timed, and times the fastest. Each candidate is timed
// search_calls times after one untimed call; the fastest call of all is reported (search_best_ns), a
// figure of the same work measured beside the row's own samples.
class StreamArrays : public Instance {
 public:
  explicit StreamArrays(int64_t n) : n_(n), a_(n), b_(n), c_(n) {
    double *a = a_.data(), *b = b_.data(), *c = c_.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      a[i] = 0.0;
      b[i] = uniform_at(seed_b, i);
      c[i] = uniform_at(seed_c, i);
    }
  }

 protected:
  int64_t n_;
  HostBuffer<double> a_, b_, c_;
};

class SearchedStream : public StreamArrays {
 public:
  using StreamArrays::StreamArrays;
  void run() override { candidates_[chosen_].run(); }
  // Every candidate's output against the reference, not only the chosen one's: any of them may set the peak.
  Verdict check() override {
    for (const auto& candidate : candidates_) {
      std::fill(a_.data(), a_.data() + n_, 0.0);
      candidate.run();
      Verdict v = check_output();
      if (!v.passed) {
        v.detail = candidate.name + ": " + v.detail;
        return v;
      }
    }
    return Verdict{true, 0, ""};
  }
  std::vector<std::pair<std::string, double>> observed() const override {
    return {{"candidates_searched", static_cast<double>(candidates_.size())},
            {"chosen_candidate", static_cast<double>(chosen_)},
            {"search_best_ns", search_best_s_ * 1e9}};
  }
  std::string configuration() const override { return candidates_[chosen_].name; }

 protected:
  virtual Verdict check_output() = 0;
  void choose() {
    using clock = std::chrono::steady_clock;
    for (std::size_t c = 0; c < candidates_.size(); ++c) {
      candidates_[c].run();  // its threads started, its pages written
      for (int k = 0; k < search_calls; ++k) {
        const auto start = clock::now();
        candidates_[c].run();
        const double s = std::chrono::duration<double>(clock::now() - start).count();
        if (search_best_s_ == 0 || s < search_best_s_) {
          search_best_s_ = s;
          chosen_ = c;
        }
      }
    }
  }

  static constexpr int search_calls = 3;
  std::vector<Candidate> candidates_;
  std::size_t chosen_ = 0;
  double search_best_s_ = 0;
};

class Copy final : public SearchedStream {
 public:
  explicit Copy(int64_t n) : SearchedStream(n) {
    double* __restrict a = a_.data();
    const double* __restrict b = b_.data();
    for (const int threads : team_sizes()) {
      candidates_.push_back(Candidate{"OpenMP loop, " + threads_text(threads), [=] {
#pragma omp parallel for schedule(static) num_threads(threads)
                                        for (int64_t i = 0; i < n; ++i) a[i] = b[i];
                                      }});
      // glibc's memcpy switches to non-temporal stores on large copies: what a framework's copy does.
      candidates_.push_back(Candidate{"memcpy per thread, " + threads_text(threads), [=] {
                                        on_team(threads, n, [&](int64_t begin, int64_t end) {
                                          if (end > begin) std::memcpy(a + begin, b + begin, (end - begin) * sizeof(double));
                                        });
                                      }});
#if defined(__SSE2__)
      // Stores that bypass the cache: no read of the destination's lines before they are written.
      candidates_.push_back(Candidate{"non-temporal stores, " + threads_text(threads), [=] {
                                        on_team(threads, n, [&](int64_t begin, int64_t end) {
                                          int64_t i = begin;
                                          for (; i + 2 <= end; i += 2) _mm_stream_pd(a + i, _mm_load_pd(b + i));
                                          for (; i < end; ++i) a[i] = b[i];
                                        });
                                        _mm_sfence();
                                      }});
#endif
    }
    choose();
  }

 private:
  Verdict check_output() override { return check_copy(a_.data(), b_.data(), n_); }
};

class Triad final : public SearchedStream {
 public:
  explicit Triad(int64_t n) : SearchedStream(n) {
    double* __restrict a = a_.data();
    const double* __restrict b = b_.data();
    const double* __restrict c = c_.data();
    for (const int threads : team_sizes()) {
      candidates_.push_back(Candidate{"OpenMP loop, " + threads_text(threads), [=] {
#pragma omp parallel for schedule(static) num_threads(threads)
                                        for (int64_t i = 0; i < n; ++i) a[i] = b[i] + triad_scalar * c[i];
                                      }});
#if defined(__SSE2__)
      candidates_.push_back(Candidate{"non-temporal stores, " + threads_text(threads), [=] {
                                        on_team(threads, n, [&](int64_t begin, int64_t end) {
                                          const __m128d s = _mm_set1_pd(triad_scalar);
                                          int64_t i = begin;
                                          for (; i + 2 <= end; i += 2)
                                            _mm_stream_pd(a + i,
                                                          _mm_add_pd(_mm_load_pd(b + i), _mm_mul_pd(s, _mm_load_pd(c + i))));
                                          for (; i < end; ++i) a[i] = b[i] + triad_scalar * c[i];
                                        });
                                        _mm_sfence();
                                      }});
#endif
    }
    choose();
  }

 private:
  Verdict check_output() override { return check_triad(a_.data(), b_.data(), c_.data(), n_); }
};

// The same triad on one core: what the OpenMP team buys on this machine.
class TriadOneThread final : public StreamArrays {
 public:
  using StreamArrays::StreamArrays;
  void run() override {
    double* __restrict a = a_.data();
    const double* __restrict b = b_.data();
    const double* __restrict c = c_.data();
    for (int64_t i = 0; i < n_; ++i) a[i] = b[i] + triad_scalar * c[i];
  }
  Verdict check() override { return check_triad(a_.data(), b_.data(), c_.data(), n_); }
};

class GemmFp32 final : public Instance {
 public:
  explicit GemmFp32(int64_t n) : n_(n), a_(n * n), b_(n * n), c_(n * n) {
    for (int64_t i = 0; i < n * n; ++i) {
      a_[i] = uniform_at(seed_a, i);
      b_[i] = uniform_at(seed_b, i);
      c_[i] = 0.0f;
    }
  }
  void run() override {
    const auto n = static_cast<blasint>(n_);
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a_.data(), n, b_.data(), n, 0.0f, c_.data(), n);
  }
  Verdict check() override {
    const auto where = gemm_check_positions(n_);
    std::vector<double> got;
    for (const auto& [i, j] : where) got.push_back(c_[i + j * n_]);
    return check_gemm_entries(n_, GemmType::fp32, where, got);
  }

 private:
  int64_t n_;
  HostBuffer<float> a_, b_, c_;
};

}  // namespace

std::unique_ptr<Instance> make_cpu_copy(const Problem& p, const RunContext&) {
  return std::make_unique<Copy>(p.get_int("n"));
}
std::unique_ptr<Instance> make_cpu_triad(const Problem& p, const RunContext&) {
  return std::make_unique<Triad>(p.get_int("n"));
}
std::unique_ptr<Instance> make_cpu_triad_1thread(const Problem& p, const RunContext&) {
  return std::make_unique<TriadOneThread>(p.get_int("n"));
}
std::unique_ptr<Instance> make_cpu_gemm_fp32(const Problem& p, const RunContext&) {
  return std::make_unique<GemmFp32>(p.get_int("cpu_gemm_n"));
}

}  // namespace tb::peak
