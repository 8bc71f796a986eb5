// The transformer block on the GPU (layernorm, QKV, attention, out-projection, layernorm, GELU MLP,
// cuBLAS fp32 GEMMs) with the time of each part: attention's share of a block, naive or fused. Its
// layernorm and GELU are the kernels the training step runs too (layers/layers_cuda.cuh).
#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "attention_cuda.cuh"
#include "layers/layers_cuda.cuh"

namespace tb::attention {

namespace {

// ---- the block -----------------------------------------------------------------------------------

__global__ void bias_residual_kernel(float* y, const float* bias, const float* residual, int64_t rows, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < rows * n; e += int64_t{gridDim.x} * blockDim.x)
    y[e] = bias[e % n] + (residual ? residual[e] : 0.0f);
}

// [B, S, 3, H, D] <-> three [B, H, S, D] (to_heads) and [B, H, S, D] -> [B, S, H, D] (back).
__global__ void split_heads_kernel(const float* qkv, float* q, float* k, float* v, int64_t B, int64_t S, int64_t H,
                                   int64_t D) {
  const int64_t dm = H * D, n = B * S * dm;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = e % D, h = (e / D) % H, t = (e / dm) % S, b = e / (dm * S);
    const float* row = qkv + (b * S + t) * 3 * dm;
    const int64_t at = ((b * H + h) * S + t) * D + d;
    q[at] = row[h * D + d];
    k[at] = row[dm + h * D + d];
    v[at] = row[2 * dm + h * D + d];
  }
}

__global__ void merge_heads_kernel(const float* o, float* a, int64_t B, int64_t S, int64_t H, int64_t D) {
  const int64_t dm = H * D, n = B * S * dm;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = e % D, h = (e / D) % H, t = (e / dm) % S, b = e / (dm * S);
    a[e] = o[((b * H + h) * S + t) * D + d];
  }
}

// On the benchmark's stream, not the legacy one, which a non-blocking stream does not wait for; from
// pageable memory the call returns once the source is staged.
template <class T>
cuda::DeviceBuffer<T> upload(const std::vector<T>& host, cudaStream_t stream) {
  cuda::DeviceBuffer<T> d(host.size());
  CUDA_CHECK(cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return d;
}

class Block final : public Instance {
 public:
  Block(const Shape& s, bool fused, const RunContext& ctx)
      : s_(s),
        fused_(fused),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        device_(ctx.cuda_device),
        w_(make_block_weights(s.d_model())),
        tokens_(s.batch * s.seq),
        d_(s.d_model()),
        x_(s, DType::fp32, stream_, device_),
        ln1_g_(upload(w_.ln1_g, stream_)),
        ln1_b_(upload(w_.ln1_b, stream_)),
        w_qkv_(upload(w_.w_qkv, stream_)),
        b_qkv_(upload(w_.b_qkv, stream_)),
        w_out_(upload(w_.w_out, stream_)),
        b_out_(upload(w_.b_out, stream_)),
        ln2_g_(upload(w_.ln2_g, stream_)),
        ln2_b_(upload(w_.ln2_b, stream_)),
        w_fc1_(upload(w_.w_fc1, stream_)),
        b_fc1_(upload(w_.b_fc1, stream_)),
        w_fc2_(upload(w_.w_fc2, stream_)),
        b_fc2_(upload(w_.b_fc2, stream_)),
        in_(tokens_ * d_),
        h_(tokens_ * d_),
        qkv_(tokens_ * 3 * d_),
        a_(tokens_ * d_),
        r1_(tokens_ * d_),
        f_(tokens_ * w_.hidden),
        y_(tokens_ * d_),
        scores_(fused ? 0 : static_cast<std::size_t>(s.batch * s.heads * s.seq * s.seq)) {
    std::vector<float> x(static_cast<std::size_t>(tokens_ * d_));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = block_input(static_cast<int64_t>(i));
    CUDA_CHECK(cudaMemcpyAsync(in_.data(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
    CUBLAS_CHECK(cublasSetStream(handle_, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override {
    for (int p = 0; p < block_part_count; ++p) run_part(p);
  }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return check_block_output(s_, w_, download_as_float(y_.data(), tokens_ * d_, stream_));
  }
  // Each part timed alone with events (median of 5) after the measurement.
  std::vector<std::pair<std::string, double>> observed() const override {
    auto* self = const_cast<Block*>(this);  // timing a part re-runs it into this instance's buffers
    std::vector<std::pair<std::string, double>> parts;
    cuda::Event begin, end;
    double total = 0, attention = 0;
    for (int p = 0; p < block_part_count; ++p) {
      std::vector<float> ms(5);
      for (auto& m : ms) {
        CUDA_CHECK(cudaEventRecord(begin, stream_));
        self->run_part(p);
        CUDA_CHECK(cudaEventRecord(end, stream_));
        CUDA_CHECK(cudaEventSynchronize(end));
        CUDA_CHECK(cudaEventElapsedTime(&m, begin, end));
      }
      std::sort(ms.begin(), ms.end());
      const double ns = ms[2] * 1e6;
      parts.emplace_back(std::string(block_parts[p]) + "_ns", ns);
      total += ns;
      if (p == 2) attention = ns;
    }
    parts.emplace_back("attention_share", attention / total);
    return parts;
  }

 private:
  // y = x W + bias (+ residual), W [in][out] row-major: column-major y^T = W^T x^T.
  void linear(const float* x, const float* w, const float* bias, float* y, int64_t in, int64_t out, const float* residual) {
    bias_residual_kernel<<<cuda::grid_for(tokens_ * out, 256, device_), 256, 0, stream_>>>(y, bias, residual, tokens_, out);
    const float one = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(tokens_),
                              static_cast<int>(in), &one, w, CUDA_R_32F, static_cast<int>(out), x, CUDA_R_32F,
                              static_cast<int>(in), &one, y, CUDA_R_32F, static_cast<int>(out), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  }
  // h = layernorm(x) with gain g and bias b: the kernel the training step runs too (layers/layers_cuda.cuh).
  void layernorm(const float* x, const float* g, const float* b) {
    layers::cuda_layernorm_forward(h_.data(), nullptr, nullptr, x, g, b, tokens_, d_, stream_);
  }
  void run_part(int part) {
    const int grid = cuda::grid_for(tokens_ * d_, 256, device_);
    switch (part) {
      case 0:
        layernorm(in_.data(), ln1_g_.data(), ln1_b_.data());
        break;
      case 1:
        linear(h_.data(), w_qkv_.data(), b_qkv_.data(), qkv_.data(), d_, 3 * d_, nullptr);
        split_heads_kernel<<<grid, 256, 0, stream_>>>(qkv_.data(), x_.q32.data(), x_.k32.data(), x_.v32.data(), s_.batch,
                                                      s_.seq, s_.heads, s_.head_dim);
        break;
      case 2:
        if (fused_) cuda_fused_forward(s_, x_.operands(s_), nullptr, stream_);
        else cuda_naive_forward(s_, x_.operands(s_), scores_.data(), handle_, stream_);
        break;
      case 3:
        merge_heads_kernel<<<grid, 256, 0, stream_>>>(x_.o32.data(), a_.data(), s_.batch, s_.seq, s_.heads, s_.head_dim);
        linear(a_.data(), w_out_.data(), b_out_.data(), r1_.data(), d_, d_, in_.data());
        break;
      case 4:
        layernorm(r1_.data(), ln2_g_.data(), ln2_b_.data());
        break;
      case 5:
        linear(h_.data(), w_fc1_.data(), b_fc1_.data(), f_.data(), d_, w_.hidden, nullptr);
        layers::cuda_gelu_forward(f_.data(), f_.data(), tokens_ * w_.hidden, stream_, device_);
        linear(f_.data(), w_fc2_.data(), b_fc2_.data(), y_.data(), w_.hidden, d_, r1_.data());
        break;
    }
    CUDA_CHECK(cudaGetLastError());
  }

  Shape s_;
  bool fused_;
  cudaStream_t stream_;
  int device_;
  cuda::CublasHandle handle_;
  BlockWeights w_;
  int64_t tokens_, d_;
  Tensors x_;  // q, k, v, o of the attention inside the block
  cuda::DeviceBuffer<float> ln1_g_, ln1_b_, w_qkv_, b_qkv_, w_out_, b_out_, ln2_g_, ln2_b_, w_fc1_, b_fc1_, w_fc2_, b_fc2_;
  cuda::DeviceBuffer<float> in_, h_, qkv_, a_, r1_, f_, y_, scores_;
};

}  // namespace

std::unique_ptr<Instance> make_cuda_block(const Shape& s, bool fused_attention, const RunContext& ctx) {
  return std::make_unique<Block>(s, fused_attention, ctx);
}

}  // namespace tb::attention
