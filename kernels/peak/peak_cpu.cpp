// CPU ceilings: STREAM copy and triad with OpenMP (first touch by the same static schedule that the
// timed loop uses, so each thread streams its own NUMA-local pages), and SGEMM from the CPU BLAS.
#include <cblas.h>

#include "peak.h"
#include "runtime/host_buffer.h"
#include "runtime/random.h"

namespace tb::peak {

namespace {

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

class Copy final : public StreamArrays {
 public:
  using StreamArrays::StreamArrays;
  void run() override {
    double* __restrict a = a_.data();
    const double* __restrict b = b_.data();
    const int64_t n = n_;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i];
  }
  Verdict check() override { return check_copy(a_.data(), b_.data(), n_); }
};

class Triad final : public StreamArrays {
 public:
  using StreamArrays::StreamArrays;
  void run() override {
    double* __restrict a = a_.data();
    const double* __restrict b = b_.data();
    const double* __restrict c = c_.data();
    const int64_t n = n_;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + triad_scalar * c[i];
  }
  Verdict check() override { return check_triad(a_.data(), b_.data(), c_.data(), n_); }
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
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a_.data(), n, b_.data(), n, 0.0f,
                c_.data(), n);
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
