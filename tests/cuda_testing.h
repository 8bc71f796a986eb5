// Probes for the CUDA tests that no stage needs: a stalled legacy stream, the device a stream belongs
// to, whether a stream is capturing, a stage's device function run on host vectors. Built with CUDA
// only; the tests that call them skip first where there is no device.
#pragma once

#include <cstdint>
#include <vector>

namespace tb::testing {

int cuda_device_count();
// Occupies the legacy default stream for `seconds` (a kernel that waits on the global timer).
void stall_legacy_stream(double seconds);
bool legacy_stream_idle();  // the legacy stream has nothing queued or running
void wait_legacy_stream();
int stream_device(void* stream);  // the device a cudaStream_t was created on
bool stream_capturing(void* stream);
// collate::cuda_gather_token_rows on copies of `rows` and `picked` in device memory: the batch it wrote.
std::vector<int32_t> gather_token_rows_on_device(const std::vector<int32_t>& rows, int64_t T,
                                                 const std::vector<int32_t>& picked);

}  // namespace tb::testing
