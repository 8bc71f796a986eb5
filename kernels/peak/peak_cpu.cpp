// CPU ceilings: STREAM copy and triad with OpenMP (first touch by the same static schedule that the
// plain loop uses, so each thread streams its own NUMA-local pages), each the fastest of the ways it
// searched; the memory ceiling, the best of the access mixes the stages use; and SGEMM from the CPU BLAS.
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
#include "runtime/cpu_clones.h"
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

// One way to do a row's work, by name; `check` runs it once from a known state and checks the result.
struct Candidate {
  std::string name;
  std::function<void()> run;
  std::function<Verdict()> check;
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

// A ceiling is the best this machine shows, so a ceiling row searches its ways to do the work (the
// plain OpenMP loop a user would write with -O3 -fopenmp, kernels that store around the cache, each at
// every team size) before it is timed, and times the fastest. Each candidate is timed search_calls
// times after one untimed call; the fastest call of all is reported (search_best_ns), a figure of the
// same work measured beside the row's own samples.
class CandidateSearch {
 public:
  void add(Candidate c) { candidates_.push_back(std::move(c)); }
  void choose() {
    using clock = std::chrono::steady_clock;
    for (std::size_t c = 0; c < candidates_.size(); ++c) {
      candidates_[c].run();  // its threads started, its pages written
      for (int k = 0; k < search_calls; ++k) {
        const auto start = clock::now();
        candidates_[c].run();
        const double s = std::chrono::duration<double>(clock::now() - start).count();
        if (best_s_ == 0 || s < best_s_) {
          best_s_ = s;
          chosen_ = c;
        }
      }
    }
  }
  void run_chosen() const { candidates_[chosen_].run(); }
  // Every candidate's result against the reference, not only the chosen one's: any of them may set the peak.
  Verdict check_all() const {
    for (const auto& candidate : candidates_) {
      Verdict v = candidate.check();
      if (!v.passed) {
        v.detail = candidate.name + ": " + v.detail;
        return v;
      }
    }
    return Verdict{true, 0, ""};
  }
  std::vector<std::pair<std::string, double>> observed() const {
    return {{"candidates_searched", static_cast<double>(candidates_.size())},
            {"chosen_candidate", static_cast<double>(chosen_)},
            {"search_best_ns", best_s_ * 1e9}};
  }
  const std::string& chosen_name() const { return candidates_[chosen_].name; }

 private:
  static constexpr int search_calls = 3;
  std::vector<Candidate> candidates_;
  std::size_t chosen_ = 0;
  double best_s_ = 0;
};

// STREAM's three arrays of n doubles, first touched by the static schedule of the plain loops.
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

// The STREAM rows: copy (a = b) and triad (a = b + s c), each searched.
class SearchedStream : public StreamArrays {
 public:
  using StreamArrays::StreamArrays;
  void run() override { search_.run_chosen(); }
  Verdict check() override { return search_.check_all(); }
  std::vector<std::pair<std::string, double>> observed() const override { return search_.observed(); }
  std::string configuration() const override { return search_.chosen_name(); }

 protected:
  // A candidate of this row: a cleared, run once, checked.
  void add(std::string name, std::function<void()> run) {
    search_.add(Candidate{std::move(name), run, [this, run] {
                            std::fill(a_.data(), a_.data() + n_, 0.0);
                            run();
                            return check_output();
                          }});
  }
  virtual Verdict check_output() = 0;
  CandidateSearch search_;
};

class Copy final : public SearchedStream {
 public:
  explicit Copy(int64_t n) : SearchedStream(n) {
    double* __restrict a = a_.data();
    const double* __restrict b = b_.data();
    for (const int threads : team_sizes()) {
      add("OpenMP loop, " + threads_text(threads), [=] {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t i = 0; i < n; ++i) a[i] = b[i];
      });
      // glibc's memcpy switches to non-temporal stores on large copies: what a framework's copy does.
      add("memcpy per thread, " + threads_text(threads), [=] {
        on_team(threads, n, [&](int64_t begin, int64_t end) {
          if (end > begin) std::memcpy(a + begin, b + begin, (end - begin) * sizeof(double));
        });
      });
#if defined(__SSE2__)
      // Stores that bypass the cache: no read of the destination's lines before they are written.
      add("non-temporal stores, " + threads_text(threads), [=] {
        on_team(threads, n, [&](int64_t begin, int64_t end) {
          int64_t i = begin;
          for (; i + 2 <= end; i += 2) _mm_stream_pd(a + i, _mm_load_pd(b + i));
          for (; i < end; ++i) a[i] = b[i];
        });
        _mm_sfence();
      });
#endif
    }
    search_.choose();
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
      add("OpenMP loop, " + threads_text(threads), [=] {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t i = 0; i < n; ++i) a[i] = b[i] + triad_scalar * c[i];
      });
#if defined(__SSE2__)
      add("non-temporal stores, " + threads_text(threads), [=] {
        on_team(threads, n, [&](int64_t begin, int64_t end) {
          const __m128d s = _mm_set1_pd(triad_scalar);
          int64_t i = begin;
          for (; i + 2 <= end; i += 2)
            _mm_stream_pd(a + i, _mm_add_pd(_mm_load_pd(b + i), _mm_mul_pd(s, _mm_load_pd(c + i))));
          for (; i < end; ++i) a[i] = b[i] + triad_scalar * c[i];
        });
        _mm_sfence();
      });
#endif
    }
    search_.choose();
  }

 private:
  Verdict check_output() override { return check_triad(a_.data(), b_.data(), c_.data(), n_); }
};

// The memory ceiling's kernels, one thread's range each, cloned for the widest vectors the CPU has
// (runtime/cpu_clones.h): a ceiling must not be set by a narrower loop than the rows it bounds.
TB_CPU_CLONES double sum_of_squares_range(const double* __restrict x, int64_t begin, int64_t end) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = begin; i < end; ++i) sum += x[i] * x[i];
  return sum;
}
TB_CPU_CLONES void copy_range(double* __restrict dst, const double* __restrict src, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) dst[i] = src[i];
}
TB_CPU_CLONES void triad_range(double* __restrict a, const double* __restrict b, const double* __restrict c, int64_t begin,
                               int64_t end) {
  for (int64_t i = begin; i < end; ++i) a[i] = b[i] + triad_scalar * c[i];
}
// The read-modify-write mix over parameters p and gradients g of element type P (double, or bf16 bits
// as AdamW's bf16 parameters are kept) and state m, v of type S (double, or float beside bf16), with
// or without asking for each stream's lines 1 KiB ahead (as AdamW's fused loop does: its divisions
// hold the out-of-order window, and the prefetches keep loads in flight).
inline float widen(uint16_t bf16_bits) { return bf16_bits_to_float(bf16_bits); }
inline uint16_t narrow(float x) {  // truncated: the mix measures traffic, the check knows the rounding
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}
inline double widen(double x) { return x; }
inline double narrow(double x) { return x; }

template <class P, class S>
inline __attribute__((always_inline)) void rmw_body(P* __restrict p, const P* __restrict g, S* __restrict m, S* __restrict v,
                                                    int64_t begin, int64_t end, bool prefetch) {
  constexpr int64_t tile = 64, ahead_bytes = 1024;
  for (int64_t t0 = begin; t0 < end; t0 += tile) {
    if (prefetch) {
      for (int64_t k = 0; k < tile * static_cast<int64_t>(sizeof(S)); k += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(m + t0) + ahead_bytes + k, 1);
        __builtin_prefetch(reinterpret_cast<const char*>(v + t0) + ahead_bytes + k, 1);
      }
      for (int64_t k = 0; k < tile * static_cast<int64_t>(sizeof(P)); k += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(p + t0) + ahead_bytes + k, 1);
        __builtin_prefetch(reinterpret_cast<const char*>(g + t0) + ahead_bytes + k, 0);
      }
    }
    const int64_t stop = std::min(end, t0 + tile);
#pragma omp simd
    for (int64_t i = t0; i < stop; ++i) {
      const S gi = widen(g[i]);
      const S mi = static_cast<S>(rmw_decay) * m[i] + gi;
      m[i] = mi;
      v[i] = static_cast<S>(rmw_decay) * v[i] + gi * gi;
      p[i] = narrow(widen(p[i]) - static_cast<S>(rmw_rate) * mi);
    }
  }
}
TB_CPU_CLONES void rmw_range(double* p, const double* g, double* m, double* v, int64_t begin, int64_t end, bool prefetch) {
  rmw_body(p, g, m, v, begin, end, prefetch);
}
TB_CPU_CLONES void rmw_range(uint16_t* p, const uint16_t* g, float* m, float* v, int64_t begin, int64_t end, bool prefetch) {
  rmw_body(p, g, m, v, begin, end, prefetch);
}

// The memory ceiling of every memory-bound CPU row: the best of the access mixes the stages use, each
// moving the triad's traffic per call (24 n bytes) through one arena of 3n doubles:
//   read: 3 n doubles, 1 stream in, summed as squares (the gradient norm's reads);
//   copy: 1.5 n doubles, 1 stream in and 1 out (collate, a framework's copy);
//   triad: n doubles, 2 in and 1 out (STREAM's fused elementwise update);
//   read-modify-write: 3n/7 doubles, 4 in and 3 out, 3 of them updated in place (AdamW: p, g, m, v read,
//   p, m, v written), in doubles and in AdamW's bf16 widths (p and g 2 bytes, m and v 4: 24n/22
//   elements). In-place lines are read anyway, so no store pays for a read of its line (a triad's
//   plain stores do, which is why a triad's ceiling sat below AdamW's measured rate).
// Each mix at every team size; the copy also by memcpy, the triad with non-temporal stores, the
// read-modify-write with software prefetches. The read-modify-write's streams are rounded down to
// whole 64-byte lines: its traffic is short of 24 n bytes by under 7 lines (for n = 2^25, one part in
// a million), so its rate is understated by that much, never overstated.
class MemoryMixes final : public Instance {
 public:
  explicit MemoryMixes(int64_t n) : n_(n), arena_(3 * n) {
    double* arena = arena_.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < 3 * n; ++i) arena[i] = uniform_at(seed_a, i);
    for (const int threads : team_sizes()) {
      add_read(threads);
      add_copy(threads);
      add_triad(threads);
      add_rmw(threads);
      add_rmw_bf16(threads);
    }
    search_.choose();
  }
  void run() override { search_.run_chosen(); }
  Verdict check() override { return search_.check_all(); }
  std::vector<std::pair<std::string, double>> observed() const override { return search_.observed(); }
  std::string configuration() const override { return search_.chosen_name(); }

 private:
  // Fills [begin, begin + count) of the arena from `seed` (the state a candidate's check starts from).
  void fill(int64_t begin, int64_t count, uint64_t seed) {
    double* x = arena_.data() + begin;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) x[i] = uniform_at(seed, i);
  }
  // A candidate that runs range(begin, end) over `count` elements split among `threads`.
  using RangeKernel = std::function<void(int64_t begin, int64_t end)>;
  void add(const std::string& name, int threads, int64_t count, RangeKernel range, std::function<void()> prepare,
           std::function<Verdict()> verify, std::function<void()> after = {}) {
    auto run = [threads, count, range, after] {
      on_team(threads, count, range);
      if (after) after();
    };
    search_.add(Candidate{name + ", " + threads_text(threads), run, [run, prepare, verify] {
                            prepare();
                            run();
                            return verify();
                          }});
  }

  void add_read(int threads) {
    const int64_t m = 3 * n_;
    const double* x = arena_.data();
    double* sums = read_sums_;
    auto sum_range = [x, sums](int64_t begin, int64_t end) {
      sums[omp_get_thread_num()] = sum_of_squares_range(x, begin, end);
    };
    auto total = [sums, threads] {  // kept, so that the reads are not optimised away
      sums[max_threads] = 0;
      for (int t = 0; t < threads; ++t) sums[max_threads] += sums[t];
    };
    auto prepare = [this, m] { fill(0, m, seed_a); };
    auto verify = [sums, m] { return check_sum_of_squares(sums[max_threads], m); };
    add("read (1 in)", threads, m, sum_range, prepare, verify, total);
  }

  void add_copy(int threads) {
    const int64_t m = 3 * n_ / 2;
    double* dst = arena_.data();
    const double* src = arena_.data() + m;
    auto prepare = [this, m] { fill(m, m, seed_b); };
    auto verify = [dst, src, m] { return check_copy(dst, src, m); };
    auto loop = [dst, src](int64_t begin, int64_t end) { copy_range(dst, src, begin, end); };
    auto memcpy_range = [dst, src](int64_t begin, int64_t end) {
      if (end > begin) std::memcpy(dst + begin, src + begin, (end - begin) * sizeof(double));
    };
    add("copy (1 in, 1 out)", threads, m, loop, prepare, verify);
    add("copy (1 in, 1 out) by memcpy", threads, m, memcpy_range, prepare, verify);
  }

  void add_triad(int threads) {
    const int64_t n = n_;
    double* a = arena_.data();
    const double* b = arena_.data() + n;
    const double* c = arena_.data() + 2 * n;
    auto prepare = [this, n] {
      fill(n, n, seed_b);
      fill(2 * n, n, seed_c);
    };
    auto verify = [a, b, c, n] { return check_triad(a, b, c, n); };
    auto loop = [a, b, c](int64_t begin, int64_t end) { triad_range(a, b, c, begin, end); };
    add("triad (2 in, 1 out)", threads, n, loop, prepare, verify);
#if defined(__SSE2__)
    auto streaming = [a, b, c](int64_t begin, int64_t end) {  // a's part starts on a line; b and c need not
      const __m128d s = _mm_set1_pd(triad_scalar);
      int64_t i = begin;
      for (; i + 2 <= end; i += 2) _mm_stream_pd(a + i, _mm_add_pd(_mm_loadu_pd(b + i), _mm_mul_pd(s, _mm_loadu_pd(c + i))));
      for (; i < end; ++i) a[i] = b[i] + triad_scalar * c[i];
    };
    add("triad (2 in, 1 out), non-temporal stores", threads, n, streaming, prepare, verify, [] { _mm_sfence(); });
#endif
  }

  void add_rmw(int threads) {
    const int64_t m = 3 * n_ / 7 / 8 * 8;
    double* p = arena_.data();
    const double* g = p + m;
    double* mom = p + 2 * m;
    double* sq = p + 3 * m;
    auto prepare = [this, m] {
      fill(0, m, seed_a);
      fill(m, m, seed_b);
      fill(2 * m, m, seed_c);
      fill(3 * m, m, seed_c + 1);
    };
    auto verify = [p, g, mom, sq, m] { return check_rmw(p, g, mom, sq, m); };
    for (const bool prefetch : {false, true}) {
      auto loop = [=](int64_t begin, int64_t end) { rmw_range(p, g, mom, sq, begin, end, prefetch); };
      add(std::string("read-modify-write (4 in, 3 out)") + (prefetch ? ", prefetched" : ""), threads, m, loop, prepare,
          verify);
    }
  }

  // The same mix with AdamW's bf16 widths: p and g of 2 bytes, m and v of 4 (22 bytes an element).
  void add_rmw_bf16(int threads) {
    const int64_t m = 24 * n_ / 22 / 32 * 32;
    auto* p = reinterpret_cast<uint16_t*>(arena_.data());
    uint16_t* g = p + m;
    auto* mom = reinterpret_cast<float*>(g + m);
    float* sq = mom + m;
    auto prepare = [=] {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < m; ++i) {
        p[i] = narrow(uniform_at(seed_a, i));
        g[i] = narrow(uniform_at(seed_b, i));
        mom[i] = uniform_at(seed_c, i);
        sq[i] = uniform_at(seed_c + 1, i);
      }
    };
    auto verify = [=] { return check_rmw_bf16(p, g, mom, sq, m); };
    for (const bool prefetch : {false, true}) {
      auto loop = [=](int64_t begin, int64_t end) { rmw_range(p, g, mom, sq, begin, end, prefetch); };
      const std::string name = std::string("read-modify-write (4 in, 3 out; p, g bf16)") + (prefetch ? ", prefetched" : "");
      add(name, threads, m, loop, prepare, verify);
    }
  }

  static constexpr int max_threads = 1024;
  int64_t n_;
  HostBuffer<double> arena_;
  double read_sums_[max_threads + 1] = {};  // the read mix's per-thread sums, then their total
  CandidateSearch search_;
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
std::unique_ptr<Instance> make_cpu_memory(const Problem& p, const RunContext&) {
  return std::make_unique<MemoryMixes>(p.get_int("n"));
}
std::unique_ptr<Instance> make_cpu_triad_1thread(const Problem& p, const RunContext&) {
  return std::make_unique<TriadOneThread>(p.get_int("n"));
}
std::unique_ptr<Instance> make_cpu_gemm_fp32(const Problem& p, const RunContext&) {
  return std::make_unique<GemmFp32>(p.get_int("cpu_gemm_n"));
}

}  // namespace tb::peak
