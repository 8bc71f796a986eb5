#pragma once
// cuBLASLt's handle and descriptors as owned objects, for the code that calls cuBLASLt (the peak
// stage's GEMM search, the step's bf16 products with a fused bias).
#include <cublasLt.h>

#include <utility>

#include "runtime/cuda_check.h"
#include "runtime/cuda_raii.h"

namespace tb::cuda {

struct LtTraits {
  static void create(cublasLtHandle_t* h) { CUBLAS_CHECK(cublasLtCreate(h)); }
  static void destroy(cublasLtHandle_t h) { cublasLtDestroy(h); }
};
using LtHandle = Handle<cublasLtHandle_t, LtTraits>;

// A cuBLASLt descriptor: owned, destroyed by `Destroy`.
template <class D, cublasStatus_t (*Destroy)(D)>
class LtDescriptor {
 public:
  LtDescriptor() = default;
  explicit LtDescriptor(D d) : d_(d) {}
  ~LtDescriptor() {
    if (d_) Destroy(d_);
  }
  LtDescriptor(LtDescriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  LtDescriptor& operator=(LtDescriptor&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  LtDescriptor(const LtDescriptor&) = delete;
  LtDescriptor& operator=(const LtDescriptor&) = delete;
  D get() const { return d_; }

 private:
  D d_ = nullptr;
};
using MatmulDesc = LtDescriptor<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using MatrixLayout = LtDescriptor<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using MatmulPreference = LtDescriptor<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

}  // namespace tb::cuda
