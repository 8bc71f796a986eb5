// The CUDA runtime's rules the stages rely on: a session's stream lives on the session's device, and
// a variant's set-up copies are ordered on the benchmark's (non-blocking) stream, not the legacy
// default stream, which that stream does not wait for. Skips with the reason where there is no GPU.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_testing.h"
#include "runtime/device_info.h"
#include "runtime/registry.h"
#include "runtime/session.h"
#include "stage_testing.h"

namespace tb {
namespace {

using Params = std::vector<std::pair<std::string, std::string>>;

#define TB_SKIP_WITHOUT_CUDA()                                                                              \
  do {                                                                                                      \
    if (!cuda_status().available()) GTEST_SKIP() << "no CUDA device: " << cuda_status().unavailable_reason; \
  } while (0)

// No NVIDIA driver at all (no libcuda.so.1): the runtime says cudaErrorInsufficientDriver, which
// reads as "update your driver"; the reason says that no driver or GPU was found instead.
TEST(CudaStatus, NoDriverIsNotAnOldDriver) {
  const std::string none = describe_cuda_init_failure("cudaErrorInsufficientDriver",
                                                      "CUDA driver version is insufficient for CUDA runtime version", false);
  EXPECT_NE(none.find("no NVIDIA driver or GPU found"), std::string::npos) << none;
  EXPECT_EQ(none.find("insufficient"), std::string::npos) << none;
  EXPECT_NE(describe_cuda_init_failure("cudaErrorNoDevice", "no CUDA-capable device is detected", false)
                .find("no NVIDIA driver or GPU found"),
            std::string::npos);
  EXPECT_NE(describe_cuda_init_failure("cudaErrorNoDevice", "no CUDA-capable device is detected", true)
                .find("no NVIDIA GPU found"),
            std::string::npos);
  const std::string old = describe_cuda_init_failure("cudaErrorInsufficientDriver", "...", true);
  EXPECT_NE(old.find("older than this build's CUDA runtime needs"), std::string::npos) << old;
  // This machine, as the binary sees it: built with CUDA and no driver here, the probe says so.
  const auto& status = cuda_status();
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver) dlclose(driver);
  if (status.built && !status.available() && !driver) {
    EXPECT_NE(status.unavailable_reason.find("no NVIDIA driver or GPU found"), std::string::npos)
        << status.unavailable_reason;
  }
}

TEST(CudaSession, StreamIsOnTheSessionsDevice) {
  TB_SKIP_WITHOUT_CUDA();
  const int count = testing::cuda_device_count();
  if (count < 2) GTEST_SKIP() << "needs two CUDA devices to tell the session's from the current one; found " << count;
  select_cuda_device(0);
  auto session = make_session(Backend::cuda, count - 1);
  EXPECT_EQ(testing::stream_device(session->context().cuda_stream), count - 1);
  select_cuda_device(0);
  auto first = make_session(Backend::cuda, 0);
  EXPECT_EQ(testing::stream_device(first->context().cuda_stream), 0);
}

// The variants whose set-up once copied with cudaMemcpy on the legacy stream: the optimizer's chunk
// tables and arenas (adamw, gradnorm), the attention block's weights and input (and attention's
// output read-back), and the device-to-host peak's source. Pinned variants are left out: a page-locked allocation may itself
// wait.
std::vector<std::pair<const Variant*, Problem>> setup_copy_cases() {
  std::vector<std::pair<const Variant*, Problem>> out;
  const Registry& r = builtin_registry();
  auto add = [&](const char* stage, const char* id, Problem p) {
    const Variant* v = r.find(stage)->find_variant(id, Backend::cuda);
    if (v) out.emplace_back(v, std::move(p));
  };
  for (const char* id : {"per_tensor", "foreach", "fused"})
    add("adamw", id, Problem({{"params", "1000003"}, {"tensors", "200"}, {"dtype", "fp32"}}));
  for (const Variant& v : r.find("gradnorm")->variants)
    if (v.backend == Backend::cuda)
      add("gradnorm", v.id.c_str(), Problem({{"params", "1000003"}, {"tensors", "200"}, {"dtype", "fp32"}}));
  add("attention", "fused", Problem({{"shape", "1x2x257x64"}, {"causal", "causal"}, {"dtype", "bf16"}}));
  add("attention", "block_fused", Problem(Params{{"block_shape", "2x2x33x16"}}));
  add("peak", "d2h_pageable", Problem(Params{{"transfer_bytes", "4194304"}}));
  return out;
}

// With the legacy stream busy for seconds, setting a variant up must not wait for it: had a set-up
// copy gone through the legacy stream, the call would have returned only after the stall, and the
// legacy stream would be idle when it did. The variant must then still pass its check.
TEST(CudaSetup, CopiesAreOrderedOnTheBenchmarkStream) {
  TB_SKIP_WITHOUT_CUDA();
  constexpr double stall_s = 3.0;
  auto session = make_session(Backend::cuda, 0);
  {
    // Calibrate with a set-up that copies nothing (naive attention: device buffers, fill kernels on
    // the stream, a cuBLAS handle): if that alone waits for the legacy stream on this driver, the
    // test cannot tell a legacy copy from the platform.
    testing::stall_legacy_stream(stall_s);
    const Variant* probe = builtin_registry().find("attention")->find_variant("naive", Backend::cuda);
    ASSERT_NE(probe, nullptr);
    auto instance = probe->make(Problem({{"shape", "1x2x257x64"}, {"causal", "causal"}, {"dtype", "fp32"}}),
                                session->context());
    const bool waited = testing::legacy_stream_idle();
    testing::wait_legacy_stream();
    if (waited)
      GTEST_SKIP() << "allocation or cuBLAS set-up waits for the legacy stream on this driver: the test cannot tell";
  }
  const auto cases = setup_copy_cases();
  ASSERT_FALSE(cases.empty());
  for (const auto& [variant, problem] : cases) {
    const std::string name = variant->id + " at " + problem.label();
    if (variant->unsupported && !variant->unsupported(problem).empty()) continue;  // e.g. a key the stage renamed
    testing::stall_legacy_stream(stall_s);
    auto instance = variant->make(problem, session->context());
    EXPECT_FALSE(testing::legacy_stream_idle()) << name << ": setting up waited for the legacy stream";
    testing::wait_legacy_stream();
    instance->run();
    const Verdict verdict = instance->check();
    EXPECT_TRUE(verdict.passed) << name << ": " << verdict.detail;
  }
}

}  // namespace
}  // namespace tb
