// The CPU backend of the training step: OpenMP loops and the CPU BLAS, in float (what is measured)
// or double (what the gradient check runs in). Every buffer is counted, for the peak-memory figure.
// Attention, clipping and AdamW are the stages' kernels (attention, gradnorm, adamw) in float, and
// their references in double: the double backend is the oracle the float step is checked against.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "adamw/adamw.h"
#include "attention/attention.h"
#include "cg/rows.h"
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
  void upload_staged(int32_t* dst, Staging<int32_t>& src, int64_t n, bool async) {
    upload_tokens(dst, src.data(), n, async);
  }
  // The batch (inputs [B, T], then targets [B, T]) of the token rows at `picked` from a resident
  // dataset, which on the CPU is host memory: the host path's straight copy, collate's stack_token_rows.
  void gather_tokens(int32_t* batch, const int32_t* rows, const int32_t* picked, int64_t B, int64_t Tn);
  void read_scalars(T* host, const T* src, int64_t n) { std::copy(src, src + n, host); }
  bool read_scalars_async(T* host, const T* src, int64_t n) {
    read_scalars(host, src, n);
    return true;
  }
  void download(T* host, const T* src, int64_t n) const { std::copy(src, src + n, host); }
  void zero(T* p, int64_t n);
  void copy(T* dst, const T* src, int64_t n);
  void add(T* out, const T* a, const T* b, int64_t n);

  void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B, int64_t Tn, int64_t C);
  void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t Tn, int64_t C);
  // bf16_only: the output feeds only bf16 products, so the CUDA backend writes only their bf16 copy.
  // The CPU's products read fp32 (the double reference of a bf16 workload runs here): written as always.
  void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C,
                         bool bf16_only = false);
  void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean, const T* rstd,
                          int64_t N, int64_t C);
  // out[N, OC] = inp[N, C] W^T + bias, W [OC, C]. The bf16 switch has no CPU form (rejected earlier).
  void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int64_t N, int64_t C, int64_t OC, bool bf16);
  // dinp = dout W (overwritten); dw += dout^T inp; dbias += column sums of dout (accumulated over
  // micro-batches).
  void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int64_t N, int64_t C, int64_t OC,
                       bool bf16);
  // Causal attention of qkv [B, T, 3C] into out [B, T, C]; `saved` keeps P [B, NH, T, T] (naive) or
  // the rows' log-sum-exp [B, NH, T] (fused) for backward, which overwrites dqkv. `scratch` is dP
  // [B, NH, T, T] for the naive backward (unused by the fused one on the CPU). bf16 is a CUDA switch
  // (the registry refuses it here): the CPU computes in T.
  void attention_forward(T* out, T* saved, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH, bool fused,
                         bool bf16);
  void attention_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* out, const T* saved, int64_t B,
                          int64_t Tn, int64_t C, int64_t NH, bool fused, bool bf16);
  void gelu_forward(T* out, const T* inp, int64_t n, bool bf16_only = false);
  void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, bool bf16_only = false);  // dinp = gelu'(inp) dout
  void softmax_crossentropy(T* probs, T* losses, const T* logits, const int32_t* targets, int64_t N, int64_t V);
  void crossentropy_backward(T* dlogits, const T* probs, const int32_t* targets, T dloss, int64_t N, int64_t V);

  // The propagator's solve runs on the cg stage's primitives (cg/rows.h).
  cg::CpuRows<T>& rows() { return rows_; }

  // clip_grad_norm_(max_norm) the gradnorm stage's way that matches the optimizer's (per tensor, multi
  // tensor, fused): the norm before clipping into *norm (a backend scalar); max_norm <= 0: norm only.
  void clip_gradients(T* norm, T* grads, const adamw::ParamSet& set, OptimizerKind kind, double max_norm);
  // AdamW step `step` (1 for the first) over the set's tensors, the adamw stage's `kind`.
  void adamw(OptimizerKind kind, const adamw::ParamSet& set, T* params, const T* grads, T* m, T* v, const adamw::Hyper& h,
             int64_t step);
  void sum_losses(T* acc, const T* losses, int64_t n, T scale);  // *acc += scale * sum(losses)
  // Data parallelism: `n` values summed in place across the ranks (MPI), `bucket` elements per call
  // from the end of the buffer (the order the backward finishes gradients, as DDP's buckets go).
  void allreduce_sum(T* data, int64_t n, int64_t bucket);

 private:
  // The fused attention's scratch, made on first use for the one model a backend serves, and counted
  // in the meter (attention_ws_bytes_) like the buffers alloc hands out.
  attention::FusedWorkspace& fused_workspace(int64_t head_dim, int64_t seq);
  // Per-thread partial sums of the reductions over rows (matmul_backward's dbias, layernorm_backward's
  // dw and db): at least n elements, grown on demand and kept, so a timed step allocates none.
  T* partials(int64_t n);

  std::shared_ptr<MemoryMeter> meter_;
  int64_t marks_taken_ = 0;
  cg::CpuRows<T> rows_;
  std::unique_ptr<attention::FusedWorkspace> attention_ws_;
  MeteredBytes attention_ws_bytes_;
  Buffer<T> partials_;
  int64_t partials_size_ = 0;
  // Made on first use, for the one model and optimizer a backend serves.
  std::unique_ptr<adamw::CpuPlan> adamw_plan_;
  MeteredBytes adamw_plan_bytes_;
  std::vector<adamw::Chunk> clip_chunks_;
  std::vector<double> clip_partial_;
};

extern template class CpuOps<float>;
extern template class CpuOps<double>;

}  // namespace tb::step
