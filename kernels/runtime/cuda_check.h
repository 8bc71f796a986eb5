// CUDA_CHECK, CUBLAS_CHECK, CUSPARSE_CHECK: throw tb::CallError with file:line, the call and the
// library's own error name. Only CUDA translation units include this header.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusparse.h>

#include <string>

#include "error.h"

namespace tb {
std::string cublas_status_name(cublasStatus_t status);
}

#define CUDA_CHECK(call)                                                                                        \
  do {                                                                                                          \
    const cudaError_t tb_err_ = (call);                                                                         \
    if (tb_err_ != cudaSuccess)                                                                                 \
      throw ::tb::CallError(__FILE__, __LINE__, #call,                                                          \
                            std::string(cudaGetErrorName(tb_err_)) + " (" + cudaGetErrorString(tb_err_) + ")"); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                \
  do {                                                                                    \
    const cublasStatus_t tb_st_ = (call);                                                 \
    if (tb_st_ != CUBLAS_STATUS_SUCCESS)                                                  \
      throw ::tb::CallError(__FILE__, __LINE__, #call, ::tb::cublas_status_name(tb_st_)); \
  } while (0)

#define CUSPARSE_CHECK(call)                                                            \
  do {                                                                                  \
    const cusparseStatus_t tb_st_ = (call);                                             \
    if (tb_st_ != CUSPARSE_STATUS_SUCCESS)                                              \
      throw ::tb::CallError(__FILE__, __LINE__, #call, cusparseGetErrorString(tb_st_)); \
  } while (0)
