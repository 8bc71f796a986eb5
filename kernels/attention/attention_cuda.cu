// The attention stage's fused and backward rows on CUDA: the forward (fp32 through the step's fused
// kernel, bf16 on tensor cores) and the backward alone, naive or fused, in fp32 or bf16, each checked
// against the double reference. The kernels are in attention_naive.cu, attention_fused_fp32.cu and
// attention_bf16.cu; the block benchmark in attention_block.cu.
#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "attention_cuda.cuh"
#include "runtime/defaults.h"

namespace tb::attention {

namespace {

// The stage's fused forward: fp32 through the kernel the step also runs, bf16 on tensor cores
// (attention_bf16.cu).
void fused_attention(const Shape& s, bool causal, const Tensors& x, cudaStream_t stream) {
  if (x.type == DType::fp32) {
    if (causal) cuda_fused_forward(s, x.operands(s), nullptr, stream);
    else fused_fp32(s, false, x.operands(s), nullptr, stream);
    return;
  }
  cuda_bf16_forward(s, causal, x.bits(x.q16), x.bits(x.k16), x.bits(x.v16), x.bits(x.o16), nullptr, stream);
}

class Fused final : public Instance {
 public:
  Fused(const Shape& s, bool causal, DType t, const RunContext& ctx)
      : s_(s), causal_(causal), stream_(cuda::as_stream(ctx.cuda_stream)), x_(s, t, stream_, ctx.cuda_device) {
    if (t == DType::bf16) {  // the registry checks the first device; this one may be another (--device)
      int major = 0;
      CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx.cuda_device));
      TB_REQUIRE(major >= 8, "the bf16 tensor-core kernel (mma.sync) needs compute capability 8.0 or newer");
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override { fused_attention(s_, causal_, x_, stream_); }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return check_output(s_, causal_, x_.type, x_.output(s_.elements(), stream_));
  }

 private:
  Shape s_;
  bool causal_;
  cudaStream_t stream_;
  Tensors x_;
};

// ---- backward alone ------------------------------------------------------------------------------

// Q, K, V and dO in [B, H, S, D] from the reference's inputs; the forward runs once here (naive keeps
// P, fused keeps O and each row's log-sum-exp), and run() is the backward only, which overwrites the
// gradients: every run computes the same dQ, dK, dV. bf16: fused is the tensor-core backward on bf16
// operands; naive is autograd's backward with its products in bf16 on tensor cores (cuBLAS's
// fp32-storage bf16 mode, the step's bf16 matmuls), the softmax backward in fp32.
class Backward final : public Instance {
 public:
  Backward(const Shape& s, bool fused, DType t, const RunContext& ctx)
      : s_(s),
        fused_(fused),
        type_(t),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        x_(s, fused ? t : DType::fp32, stream_, ctx.cuda_device),
        dq_(static_cast<std::size_t>(s.elements())),
        dk_(dq_.size()),
        dv_(dq_.size()),
        probs_(fused ? 0 : static_cast<std::size_t>(s.batch * s.heads * s.seq * s.seq)),
        dprobs_(probs_.size()),
        lse_(fused ? static_cast<std::size_t>(s.rows()) : 0) {
    const bool tensor_core_fused = fused && t == DType::bf16;
    if (tensor_core_fused) {
      dout16_ = cuda::DeviceBuffer<bf16>(dq_.size());
      cuda::fill_uniform(dout16_.data(), s.elements(), seed_dout, stream_, ctx.cuda_device);
      scratch_ = cuda::DeviceBuffer<float>(static_cast<std::size_t>(cuda_bf16_backward_scratch(s)));
    } else {
      dout_ = cuda::DeviceBuffer<float>(dq_.size());
      cuda::fill_uniform(dout_.data(), s.elements(), seed_dout, stream_, ctx.cuda_device);
      if (fused) scratch_ = cuda::DeviceBuffer<float>(lse_.size());  // delta
    }
    CUBLAS_CHECK(cublasSetStream(handle_, stream_));
    if (tensor_core_fused)
      cuda_bf16_forward(s_, true, x_.bits(x_.q16), x_.bits(x_.k16), x_.bits(x_.v16), x_.bits(x_.o16), lse_.data(), stream_);
    else if (fused) cuda_fused_forward(s_, x_.operands(s_), lse_.data(), stream_);
    else cuda_naive_forward(s_, x_.operands(s_), probs_.data(), handle_, stream_, t == DType::bf16);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override {
    if (fused_ && type_ == DType::bf16) {
      const Bf16Operands x{x_.bits(x_.q16), x_.bits(x_.k16), x_.bits(x_.v16), x_.bits(x_.o16), x_.bits(dout16_)};
      cuda_bf16_backward(s_, true, x, lse_.data(), Gradients<float>{dq_.data(), dk_.data(), dv_.data(), nullptr}, bhsd(s_),
                         scratch_.data(), stream_);
      return;
    }
    const Gradients<float> g{dq_.data(), dk_.data(), dv_.data(), dout_.data()};
    if (fused_) cuda_fused_backward(s_, x_.operands(s_), lse_.data(), g, scratch_.data(), stream_);
    else cuda_naive_backward(s_, x_.operands(s_), probs_.data(), g, dprobs_.data(), handle_, stream_, type_ == DType::bf16);
  }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const int64_t n = s_.elements();
    return check_gradients(s_, true, type_, download_as_float(dq_.data(), n, stream_),
                           download_as_float(dk_.data(), n, stream_), download_as_float(dv_.data(), n, stream_));
  }

 private:
  Shape s_;
  bool fused_;
  DType type_;
  cudaStream_t stream_;
  cuda::CublasHandle handle_;
  Tensors x_;
  cuda::DeviceBuffer<float> dq_, dk_, dv_;
  cuda::DeviceBuffer<float> dout_;            // fp32 inputs (and the naive bf16 path, rounded by cuBLAS)
  cuda::DeviceBuffer<bf16> dout16_;           // the tensor-core backward's dO
  cuda::DeviceBuffer<float> probs_, dprobs_;  // naive: P [B, H, S, S] and dP's scratch
  cuda::DeviceBuffer<float> lse_, scratch_;   // fused: lse [B, H, S]; delta (and bf16: the dQ accumulator)
};

}  // namespace

std::unique_ptr<Instance> make_cuda_fused(const Shape& s, bool causal, DType t, const RunContext& ctx) {
  return std::make_unique<Fused>(s, causal, t, ctx);
}
std::unique_ptr<Instance> make_cuda_backward(const Shape& s, bool fused, DType t, const RunContext& ctx) {
  return std::make_unique<Backward>(s, fused, t, ctx);
}

}  // namespace tb::attention
