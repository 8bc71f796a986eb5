// Shared by the per-stage tests: run one registered variant at one problem and check it against the
// stage's reference, skipping (with the reason) where the variant cannot run on this machine.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

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

// Checks `variant` at `problem` after `runs` calls (stateful stages compare after several): a variant
// that cannot run here is skipped with the reason; one that can must pass its reference check.
#define TB_EXPECT_MATCHES_REFERENCE(variant, problem) TB_EXPECT_MATCHES_REFERENCE_AFTER(variant, problem, 1)
#define TB_EXPECT_MATCHES_REFERENCE_AFTER(variant, problem, runs)                                                           \
  do {                                                                                                                      \
    if (const std::string why = ::tb::testing::cannot_run_here(variant); !why.empty())                                      \
      GTEST_SKIP() << (variant).id << " (" << ::tb::to_string((variant).backend) << "): " << why;                           \
    if ((variant).unsupported) {                                                                                            \
      const std::string reason = (variant).unsupported(problem);                                                            \
      ASSERT_TRUE(reason.empty()) << (problem).label() << ": " << reason;                                                   \
    }                                                                                                                       \
    const ::tb::Verdict verdict = ::tb::testing::run_and_check(variant, problem, runs);                                     \
    EXPECT_TRUE(verdict.passed) << ::tb::to_string((variant).backend) << "/" << (variant).id << " at " << (problem).label() \
                                << ": " << verdict.detail;                                                                  \
  } while (0)

// The parameter set of the adamw stage (gradnorm uses it too) at odd sizes: 1 and 7 parameters in
// 200 tensors (all but a few of them empty), 7 in one tensor, a large prime over 200 tensors (every
// tensor ends off the vector width) and over 3; fp32 and bf16.
inline std::vector<Problem> odd_param_set_problems() {
  std::vector<Problem> out;
  for (const auto& [params, tensors] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 200}, {7, 200}, {7, 1}, {1000003, 200}, {1000003, 3}})
    for (const char* dtype : {"fp32", "bf16"})
      out.push_back(Problem({{"params", std::to_string(params)}, {"tensors", std::to_string(tensors)}, {"dtype", dtype}}));
  return out;
}

}  // namespace tb::testing
