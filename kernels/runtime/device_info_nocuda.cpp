// The CPU-only build: CUDA variants are listed, with this reason, but never run.
#include "device_info.h"
#include "error.h"

namespace tb {

const CudaStatus& cuda_status() {
  static const CudaStatus status{false, {}, "built without CUDA (configure with TRAINBENCH_CUDA=ON and nvcc available)"};
  return status;
}

void select_cuda_device(int index) {
  throw UsageError("--device " + std::to_string(index) + ": " + cuda_status().unavailable_reason);
}

}  // namespace tb
