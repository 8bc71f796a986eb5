// The CPU backend of the training step: OpenMP loops and the CPU BLAS, in float (what is measured)
// or double (what the gradient check runs in). Every buffer is counted, for the peak-memory figure.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/host_buffer.h"
#include "step/optimizer.h"
#include "step/tracked_buffer.h"

namespace tb::step {

template <class T>
class CpuOps {
 public:
  using value_type = T;
  using Mark = std::chrono::steady_clock::time_point;
  static constexpr bool supports_graphs = false;

  template <class U>
  using Buffer = TrackedBuffer<HostBuffer<U>>;

  // Host memory a batch is staged in; on the CPU backend pinned or not is the same memory.
  template <class U>
  using Staging = Buffer<U>;

  CpuOps() : meter_(std::make_shared<MemoryMeter>()) {}
  template <class U>
  Buffer<U> alloc(int64_t n) {
    return Buffer<U>(n, meter_);
  }
  template <class U>
  Staging<U> alloc_host(int64_t n, bool /*pinned*/) {
    return Buffer<U>(n, meter_);
  }
  const MemoryMeter& memory() const { return *meter_; }

  Mark mark() {
    ++marks_taken_;
    return std::chrono::steady_clock::now();
  }
  int64_t marks_taken() const { return marks_taken_; }
  double seconds_since(Mark m) { return std::chrono::duration<double>(mark() - m).count(); }
  double seconds_between(Mark a, Mark b) const { return std::chrono::duration<double>(b - a).count(); }
  void synchronize() const {}

  void upload(T* dst, const T* host, int64_t n) { copy(dst, host, n); }
  void upload_tokens(int32_t* dst, const int32_t* src, int64_t n, bool /*async*/) { std::copy(src, src + n, dst); }
  // A staging buffer's copy is done when upload_staged returns: refilling it never waits.
  template <class U>
  void wait_until_free(Staging<U>& /*staging*/) {}
  void upload_staged(int32_t* dst, Staging<int32_t>& src, int64_t n, bool async) { upload_tokens(dst, src.data(), n, async); }
  // tokens[b] = dataset row indices[b] (inputs), targets[b] = the same row shifted by one.
  void gather_tokens(int32_t* tokens, int32_t* targets, const int32_t* dataset, const int32_t* indices, int64_t B,
                     int64_t Tn);
  void read_scalars(T* host, const T* src, int64_t n) { std::copy(src, src + n, host); }
  bool read_scalars_async(T* host, const T* src, int64_t n) {
    read_scalars(host, src, n);
    return true;
  }
  void download(T* host, const T* src, int64_t n) const { std::copy(src, src + n, host); }
  void zero(T* p, int64_t n);
  void copy(T* dst, const T* src, int64_t n);
  void add(T* out, const T* a, const T* b, int64_t n);
  void subtract(T* out, const T* a, const T* b, int64_t n);

  void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B, int64_t Tn, int64_t C);
  void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t Tn, int64_t C);
  void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C);
  void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean,
                          const T* rstd, int64_t N, int64_t C);
  // out[N, OC] = inp[N, C] W^T + bias, W [OC, C]. The bf16 switch has no CPU form (rejected earlier).
  void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int64_t N, int64_t C, int64_t OC, bool bf16);
  // dinp += dout W; dw += dout^T inp; dbias += column sums of dout.
  void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int64_t N, int64_t C,
                       int64_t OC, bool bf16);
  void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH);
  void attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att, int64_t B, int64_t Tn,
                          int64_t C, int64_t NH);
  void gelu_forward(T* out, const T* inp, int64_t n);
  void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);
  void softmax_crossentropy(T* probs, T* losses, const T* logits, const int32_t* targets, int64_t N, int64_t V);
  void crossentropy_backward(T* dlogits, const T* probs, const int32_t* targets, T dloss, int64_t N, int64_t V);

  // The propagator's pieces: A x = x + alpha (k x_i - sum of the k ring neighbours), per token row.
  void laplacian_apply(T* y, const T* x, int64_t N, int64_t C, int64_t k, T alpha);
  void row_dots(T* out, const T* a, const T* b, int64_t N, int64_t C);
  // One CG iteration per row, given p.Ap: x += a p, r -= a Ap, rs' = r.r, p = r + (rs'/rs) p.
  void cg_step(T* x, T* r, T* p, const T* ap, T* rs, T* rs_new, const T* pap, int64_t N, int64_t C);
  double max_relative(const T* rs, const T* bb, int64_t N);    // max_n sqrt(rs_n / bb_n)
  double total_relative(const T* rs, const T* bb, int64_t N);  // sqrt(sum rs / sum bb)

  // Optimizer: the global gradient norm into *norm (a backend scalar), AdamW over the tensors.
  void grad_norm(T* norm, const T* grads, int64_t n);
  void adamw(OptimizerKind kind, T* params, const T* grads, T* m, T* v, const std::vector<TensorSpan>& tensors,
             const AdamwScalars& s, const T* norm, double clip);
  void sum_losses(T* acc, const T* losses, int64_t n, T scale);  // *acc += scale * sum(losses)
  // Data parallelism: `n` values summed in place across the ranks (MPI), `bucket` elements per call
  // from the end of the buffer (the order the backward finishes gradients, as DDP's buckets go).
  void allreduce_sum(T* data, int64_t n, int64_t bucket);

 private:
  std::shared_ptr<MemoryMeter> meter_;
  int64_t marks_taken_ = 0;
  std::vector<T> denom_;  // the temporary exp_avg_sq.sqrt() allocates in PyTorch's loop paths
};

extern template class CpuOps<float>;
extern template class CpuOps<double>;

}  // namespace tb::step
