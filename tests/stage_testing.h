// Shared by the per-stage tests: run one registered variant at one problem and check it against the
// stage's reference, skipping (with the reason) where the variant cannot run on this machine.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "runtime/device_info.h"
#include "runtime/registry.h"
#include "runtime/session.h"

namespace tb::testing {

// Why `variant` cannot run here at all, or "" when it can.
inline std::string cannot_run_here(const Variant& variant) {
  if (variant.backend == Backend::cuda && !cuda_status().available())
    return "no CUDA device: " + cuda_status().unavailable_reason;
  if (!variant.make) return "variant not built";
  return "";
}

inline Verdict run_and_check(const Variant& variant, const Problem& problem, int runs = 1) {
  auto session = make_session(variant.backend, 0);
  auto instance = variant.make(problem, session->context());
  for (int i = 0; i < runs; ++i) instance->run();
  return instance->check();
}

// Checks `variant` at `problem`: a variant that cannot run here is skipped with the reason; one that
// can must pass its reference check.
#define TB_EXPECT_MATCHES_REFERENCE(variant, problem)                                               \
  do {                                                                                              \
    if (const std::string why = ::tb::testing::cannot_run_here(variant); !why.empty())              \
      GTEST_SKIP() << (variant).id << " (" << ::tb::to_string((variant).backend) << "): " << why;   \
    if ((variant).unsupported) {                                                                    \
      const std::string reason = (variant).unsupported(problem);                                    \
      ASSERT_TRUE(reason.empty()) << (problem).label() << ": " << reason;                           \
    }                                                                                               \
    const ::tb::Verdict verdict = ::tb::testing::run_and_check(variant, problem);                   \
    EXPECT_TRUE(verdict.passed) << ::tb::to_string((variant).backend) << "/" << (variant).id << " at " \
                                << (problem).label() << ": " << verdict.detail;                      \
  } while (0)

}  // namespace tb::testing
