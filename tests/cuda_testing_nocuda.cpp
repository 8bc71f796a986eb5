// Built without CUDA: the tests that would call these skip before they do.
#include "cuda_testing.h"

#include <stdexcept>

namespace tb::testing {

namespace {
[[noreturn]] void no_cuda() { throw std::logic_error("CUDA test probe called in a build without CUDA"); }
}  // namespace

int cuda_device_count() { return 0; }
void stall_legacy_stream(double) { no_cuda(); }
bool legacy_stream_idle() { no_cuda(); }
void wait_legacy_stream() { no_cuda(); }
int stream_device(void*) { no_cuda(); }
bool stream_capturing(void*) { no_cuda(); }
std::vector<int32_t> gather_token_rows_on_device(const std::vector<int32_t>&, int64_t, const std::vector<int32_t>&) {
  no_cuda();
}

}  // namespace tb::testing
