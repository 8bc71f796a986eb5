// Tolerances per dtype: a value passes when |got - ref| <= atol + rtol * |ref|.
#pragma once

#include <cmath>
#include <string>

namespace tb {

struct Tolerance {
  double atol;
  double rtol;
  bool accepts(double got, double ref) const {
    return std::isfinite(got) && std::abs(got - ref) <= atol + rtol * std::abs(ref);
  }
};

namespace tolerance {
inline constexpr Tolerance exact{0.0, 0.0};  // copies: bit for bit
inline constexpr Tolerance fp64{1e-12, 1e-12};
inline constexpr Tolerance fp32{1e-6, 1e-5};
inline constexpr Tolerance tf32{1e-3, 2e-3};    // 10-bit mantissa: unit roundoff 4.9e-4
inline constexpr Tolerance bf16{1e-2, 1.6e-2};  // 7-bit mantissa: unit roundoff 3.9e-3

// Dot products (GEMM entries) are compared relative to sum_k |a_ik * b_kj|, the scale of the
// rounding error, so that cancellation does not make a correct result look wrong.
inline constexpr double gemm_fp32 = 1e-5;
inline constexpr double gemm_tf32 = 4e-3;
inline constexpr double gemm_bf16 = 1.6e-2;
// Attention outputs are convex combinations of V rows (|v| <= 1): errors are absolute in scale.
inline constexpr Tolerance attention_fp32{2e-5, 2e-4};
inline constexpr Tolerance attention_bf16{2e-2, 2e-2};  // bf16 inputs, P and output
// Gradients from bf16 operands, with P and dS rounded to bf16 before their products (FlashAttention's
// backward), against the double backward of the same bf16-rounded inputs.
inline constexpr Tolerance attention_bf16_backward{3e-2, 3e-2};
inline constexpr Tolerance block_fp32{2e-4, 2e-3};  // five GEMMs, two layernorms, GELU
// Per-token losses of a training step's forward (about ln(vocab)) against a double forward.
inline constexpr Tolerance step_fp32{2e-4, 1e-4};
inline constexpr Tolerance step_bf16{5e-2, 2e-2};  // bf16 matmuls

// Sparse matvec entries (<= 9 terms here) are compared relative to sum_j |a_ij x_j|, like GEMM.
inline constexpr double spmv_fp64 = 1e-13;
// A solve's true relative residual ||b - A x|| / ||b|| may exceed the solver's own estimate by the
// rounding of a double residual at the scale of ||b||.
inline constexpr double cg_residual_atol = 1e-12;
// A float solve stops on its recursively updated residual, in float; the true residual of the float x
// (computed in double) may exceed it by float rounding of A x and of x itself, about
// eps_fp32 x ||A|| <= 6e-8 x (1 + 2 k alpha) per row, and by the drift of the recursion over the
// iterations. The cg stage's rows_* check allows this much above tol (or lazy_tol).
inline constexpr double cg_rows_residual_fp32_atol = 5e-7;
}  // namespace tolerance

}  // namespace tb
