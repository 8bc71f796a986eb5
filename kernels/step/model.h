// The model of the training step: a GPT-style stack (token + position embedding, pre-norm blocks of
// causal attention and a GELU MLP, final layernorm, LM head tied to the token embedding,
// cross-entropy), optionally with a propagator after every block: y = (I + alpha L)^-1 x per token,
// L the Laplacian of a ring lattice over the features, solved by CG with the lazy gate of docs/sources.md#000-sem-v55,
// and differentiated implicitly (the backward is a second solve; A is symmetric).
//
// Written once over a backend `Ops` (CPU in float or double, CUDA in float) in the layout of llm.c:
// weights [out][in], activations [B, T, C]. Attention is the attention stage's: naive keeps the
// probabilities [B, NH, T, T] for backward (PyTorch eager), fused keeps each row's log-sum-exp
// [B, NH, T] and recomputes them (scaled_dot_product_attention, FlashAttention-2).
// Every buffer comes from ops.alloc, which counts bytes: peak_bytes() is the allocator's high-water
// mark, so memory grows with the micro-batch exactly as the activations do.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "adamw/param_set.h"
#include "cg/rows.h"
#include "runtime/random.h"
#include "step/optimizer.h"
#include "step/workload.h"

namespace tb::step {

inline constexpr uint64_t seed_params = 31;

// A parameter tensor as the model lays it out: llm.c's name ("h0.qkvw") and shape (weights [out][in]).
struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
  int64_t size() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// The parameter tensors in the order they sit in Model::params: the one list the layout follows and
// that tools naming a tensor (tests/dump_step) read.
inline std::vector<ParameterShape> parameter_shapes(const ModelSpec& m) {
  const int64_t C = m.d_model, H = m.mlp_ratio * m.d_model;
  std::vector<ParameterShape> out{{"wte", {m.vocab, C}}, {"wpe", {m.seq_len, C}}};  // wte is also the LM head
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string h = "h" + std::to_string(l) + ".";
    for (ParameterShape p : std::vector<ParameterShape>{{"ln1w", {C}},
                                                        {"ln1b", {C}},
                                                        {"qkvw", {3 * C, C}},
                                                        {"qkvb", {3 * C}},
                                                        {"attprojw", {C, C}},
                                                        {"attprojb", {C}},
                                                        {"ln2w", {C}},
                                                        {"ln2b", {C}},
                                                        {"fcw", {H, C}},
                                                        {"fcb", {H}},
                                                        {"fcprojw", {C, H}},
                                                        {"fcprojb", {C}}}) {
      p.name = h + p.name;
      out.push_back(std::move(p));
    }
  }
  out.push_back({"lnfw", {C}});
  out.push_back({"lnfb", {C}});
  return out;
}

// What the propagator's solves did: the cg stage's statistics (solves, skipped, iterations, matvecs,
// the worst relative residual handed on).
using SolveStats = cg::RowStats;

template <class Ops>
class Model {
 public:
  using T = typename Ops::value_type;
  using Buffer = typename Ops::template Buffer<T>;

  using Tensor = TensorSpan;

  Model(Ops& ops, const ModelSpec& m, const PropagatorSpec& prop, const Switches& sw, int64_t micro)
      : ops_(ops),
        m_(m),
        prop_(prop),
        sw_(sw),
        B_(micro),
        T_(m.seq_len),
        C_(m.d_model),
        NH_(m.heads),
        V_(m.vocab),
        H_(m.mlp_ratio * m.d_model),
        N_(micro * m.seq_len) {
    layout_parameters();
    params = ops.template alloc<T>(param_count_);
    grads = ops.template alloc<T>(param_count_);
    initialise_parameters();
    ops.zero(grads.data(), param_count_);
    const int64_t stored = sw.activation_checkpointing ? 1 : m.layers;
    for (int64_t l = 0; l < stored; ++l) acts_.push_back(allocate_layer());
    layer_inputs_ = ops.template alloc<T>((m.layers + 1) * N_ * C_);
    if (prop.enabled) {
      residual3_ = std::vector<Buffer>();
      for (int64_t l = 0; l < m.layers; ++l) {
        if (!sw.activation_checkpointing) residual3_.push_back(ops.template alloc<T>(N_ * C_));
        cache_.push_back(ops.template alloc<T>(N_ * C_));
        ops.zero(cache_.back().data(), N_ * C_);
      }
      if (sw.activation_checkpointing) residual3_.push_back(ops.template alloc<T>(N_ * C_));
      solver_ = ops.template alloc<T>(cg::rows_workspace(N_, C_));
    }
    lnf_ = ops.template alloc<T>(N_ * C_);
    lnf_mean_ = ops.template alloc<T>(N_);
    lnf_rstd_ = ops.template alloc<T>(N_);
    logits_ = ops.template alloc<T>(N_ * V_);
    probs_ = ops.template alloc<T>(N_ * V_);
    losses_ = ops.template alloc<T>(N_);
    dlogits_ = ops.template alloc<T>(N_ * V_);
    dres_ = ops.template alloc<T>(N_ * C_);
    dtmp_ = ops.template alloc<T>(N_ * C_);
    grad_layer_ = allocate_layer_grads();
  }

  int64_t parameter_count() const { return param_count_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  // The tensors as the optimizer stages see them: packed one after another (offsets == starts).
  const adamw::ParamSet& parameter_set() const { return set_; }
  int64_t tokens() const { return N_; }
  T* losses() { return losses_.data(); }
  const SolveStats& solve_stats() const { return stats_; }
  void reset_solve_stats() { stats_ = SolveStats{}; }
  double solver_seconds() const { return solver_s_; }
  // Solver time is taken only while profiling: on a GPU it costs a synchronisation per solve.
  void set_profiling(bool on) { profiling_ = on; }
  void reset_solver_seconds() { solver_s_ = 0; }

  Buffer params, grads;

  // Per-token losses into losses(); tokens and targets are [B, T] on the backend.
  void forward(const int32_t* tokens, const int32_t* targets) {
    tokens_ = tokens;
    targets_ = targets;
    ops_.encoder_forward(input(0), tokens, param(0), param(1), B_, T_, C_);
    for (int64_t l = 0; l < m_.layers; ++l) layer_forward(l, acts_for(l));
    const int64_t f = tensors_.size() - 2;
    ops_.layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), input(m_.layers), param(f), param(f + 1), N_, C_,
                           sw_.bf16_matmuls);
    ops_.matmul_forward(logits_.data(), lnf_.data(), param(0), nullptr, N_, C_, V_, sw_.bf16_matmuls);
    ops_.softmax_crossentropy(probs_.data(), losses_.data(), logits_.data(), targets, N_, V_);
  }

  // Accumulates d(sum of losses * loss_scale)/d(params) into grads.
  void backward(T loss_scale) {
    ops_.crossentropy_backward(dlogits_.data(), probs_.data(), targets_, loss_scale, N_, V_);
    const int64_t f = tensors_.size() - 2;
    ops_.matmul_backward(dtmp_.data(), grad(0), nullptr, dlogits_.data(), lnf_.data(), param(0), N_, C_, V_,
                         sw_.bf16_matmuls);
    ops_.zero(dres_.data(), N_ * C_);
    ops_.layernorm_backward(dres_.data(), grad(f), grad(f + 1), dtmp_.data(), input(m_.layers), param(f), lnf_mean_.data(),
                            lnf_rstd_.data(), N_, C_);
    for (int64_t l = m_.layers - 1; l >= 0; --l) {
      Acts& a = acts_for(l);
      if (sw_.activation_checkpointing) layer_forward(l, a);  // recompute this layer's activations
      layer_backward(l, a);
    }
    ops_.encoder_backward(grad(0), grad(1), dres_.data(), tokens_, B_, T_, C_);
  }

 private:
  struct Acts {
    Buffer ln1, ln1_mean, ln1_rstd, qkv, atty, att, attproj, residual2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj;
  };

  // A layer's tensors in parameter_shapes' order.
  enum Param { ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, per_layer };

  void layout_parameters() {
    for (const ParameterShape& p : parameter_shapes(m_)) {
      tensors_.push_back(Tensor{param_count_, p.size()});
      set_.sizes.push_back(p.size());
      set_.starts.push_back(param_count_);
      set_.offsets.push_back(param_count_);
      param_count_ += p.size();
    }
    set_.total = set_.arena = param_count_;
    set_.width = C_;
  }

  // GPT-2's initialisation: N(0, 0.02) (here uniform of the same spread), residual projections scaled
  // by 1/sqrt(2 L), layernorm weights 1, biases 0. Deterministic, so every backend starts equal.
  void initialise_parameters() {
    std::vector<T> host(static_cast<std::size_t>(param_count_));
    const double spread = 0.02 * std::sqrt(3.0);
    auto fill = [&](std::size_t t, double scale) {
      for (int64_t i = 0; i < tensors_[t].size; ++i)
        host[tensors_[t].offset + i] = static_cast<T>(
            scale * uniform_at(seed_params * 1000 + t, static_cast<uint64_t>(i), -1.0f, 1.0f));
    };
    auto constant = [&](std::size_t t, T value) {
      for (int64_t i = 0; i < tensors_[t].size; ++i) host[tensors_[t].offset + i] = value;
    };
    fill(0, spread);
    fill(1, spread);
    for (int64_t l = 0; l < m_.layers; ++l) {
      const std::size_t base = 2 + l * per_layer;
      constant(base + ln1w, 1);
      constant(base + ln2w, 1);
      for (int p : {ln1b, qkvb, attprojb, ln2b, fcb, fcprojb}) constant(base + p, 0);
      fill(base + qkvw, spread);
      fill(base + fcw, spread);
      fill(base + attprojw, spread / std::sqrt(2.0 * m_.layers));
      fill(base + fcprojw, spread / std::sqrt(2.0 * m_.layers));
    }
    constant(tensors_.size() - 2, 1);
    constant(tensors_.size() - 1, 0);
    ops_.upload(params.data(), host.data(), param_count_);
  }

  Acts allocate_layer() {
    Acts a;
    for (Buffer* b : {&a.ln1, &a.atty, &a.attproj, &a.residual2, &a.ln2, &a.fcproj}) *b = ops_.template alloc<T>(N_ * C_);
    for (Buffer* b : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) *b = ops_.template alloc<T>(N_);
    a.qkv = ops_.template alloc<T>(N_ * 3 * C_);
    a.att = ops_.template alloc<T>(attention_saved());
    a.fch = ops_.template alloc<T>(N_ * H_);
    a.fch_gelu = ops_.template alloc<T>(N_ * H_);
    return a;
  }

  // One layer's gradient scratch, reused by every layer on the way down.
  Acts allocate_layer_grads() {
    Acts g;
    for (Buffer* b : {&g.ln1, &g.atty, &g.residual2, &g.ln2}) *b = ops_.template alloc<T>(N_ * C_);
    g.qkv = ops_.template alloc<T>(N_ * 3 * C_);
    g.att = ops_.template alloc<T>(attention_saved());  // dP (naive), or the rows' delta (fused, CUDA)
    g.fch = ops_.template alloc<T>(N_ * H_);
    g.fch_gelu = ops_.template alloc<T>(N_ * H_);
    return g;
  }

  // What attention keeps per layer for backward: P (naive) or each row's log-sum-exp (fused).
  int64_t attention_saved() const { return B_ * NH_ * T_ * (sw_.fused_attention ? 1 : T_); }

  Acts& acts_for(int64_t l) { return sw_.activation_checkpointing ? acts_[0] : acts_[l]; }
  T* input(int64_t l) { return layer_inputs_.data() + l * N_ * C_; }
  T* param(std::size_t t) { return params.data() + tensors_[t].offset; }
  T* grad(std::size_t t) { return grads.data() + tensors_[t].offset; }
  T* lparam(int64_t l, int p) { return param(2 + l * per_layer + p); }
  T* lgrad(int64_t l, int p) { return grad(2 + l * per_layer + p); }
  T* residual3(int64_t l) { return residual3_[sw_.activation_checkpointing ? 0 : l].data(); }

  void layer_forward(int64_t l, Acts& a) {
    const bool bf16 = sw_.bf16_matmuls;
    T* x = input(l);
    ops_.layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, lparam(l, ln1w), lparam(l, ln1b), N_, C_,
                           bf16);
    ops_.matmul_forward(a.qkv.data(), a.ln1.data(), lparam(l, qkvw), lparam(l, qkvb), N_, C_, 3 * C_, bf16);
    ops_.attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B_, T_, C_, NH_, sw_.fused_attention, bf16);
    ops_.matmul_forward(a.attproj.data(), a.atty.data(), lparam(l, attprojw), lparam(l, attprojb), N_, C_, C_, bf16);
    ops_.add(a.residual2.data(), x, a.attproj.data(), N_ * C_);
    ops_.layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.residual2.data(), lparam(l, ln2w),
                           lparam(l, ln2b), N_, C_, bf16);
    ops_.matmul_forward(a.fch.data(), a.ln2.data(), lparam(l, fcw), lparam(l, fcb), N_, C_, H_, bf16);
    ops_.gelu_forward(a.fch_gelu.data(), a.fch.data(), N_ * H_, bf16);
    ops_.matmul_forward(a.fcproj.data(), a.fch_gelu.data(), lparam(l, fcprojw), lparam(l, fcprojb), N_, H_, C_, bf16);
    T* out = input(l + 1);
    if (!prop_.enabled) {
      ops_.add(out, a.residual2.data(), a.fcproj.data(), N_ * C_);
      return;
    }
    T* r3 = residual3(l);
    ops_.add(r3, a.residual2.data(), a.fcproj.data(), N_ * C_);
    propagate(out, r3, cache_[l].data(), sw_.lazy_cg);
  }

  void layer_backward(int64_t l, Acts& a) {
    const bool bf16 = sw_.bf16_matmuls;
    Acts& g = grad_layer_;
    // dres_ holds dL/d(layer output). Through the propagator: dL/d(residual3) = A^-1 dL/dy.
    T* dr3 = dres_.data();
    if (prop_.enabled) {
      propagate(dtmp_.data(), dres_.data(), nullptr, false);
      dr3 = dtmp_.data();
    }
    // residual3 = residual2 + fcproj: both branches receive dr3.
    ops_.matmul_backward(g.fch_gelu.data(), lgrad(l, fcprojw), lgrad(l, fcprojb), dr3, a.fch_gelu.data(), lparam(l, fcprojw),
                         N_, H_, C_, bf16);
    ops_.gelu_backward(g.fch.data(), a.fch.data(), g.fch_gelu.data(), N_ * H_, bf16);
    ops_.matmul_backward(g.ln2.data(), lgrad(l, fcw), lgrad(l, fcb), g.fch.data(), a.ln2.data(), lparam(l, fcw), N_, C_, H_,
                         bf16);
    ops_.copy(g.residual2.data(), dr3, N_ * C_);
    ops_.layernorm_backward(g.residual2.data(), lgrad(l, ln2w), lgrad(l, ln2b), g.ln2.data(), a.residual2.data(),
                            lparam(l, ln2w), a.ln2_mean.data(), a.ln2_rstd.data(), N_, C_);
    // residual2 = x + attproj.
    ops_.matmul_backward(g.atty.data(), lgrad(l, attprojw), lgrad(l, attprojb), g.residual2.data(), a.atty.data(),
                         lparam(l, attprojw), N_, C_, C_, bf16);
    ops_.attention_backward(g.qkv.data(), g.att.data(), g.atty.data(), a.qkv.data(), a.atty.data(), a.att.data(), B_, T_, C_,
                            NH_, sw_.fused_attention, bf16);
    ops_.matmul_backward(g.ln1.data(), lgrad(l, qkvw), lgrad(l, qkvb), g.qkv.data(), a.ln1.data(), lparam(l, qkvw), N_, C_,
                         3 * C_, bf16);
    // dL/dx = d(residual2) (the skip) + layernorm_backward(d ln1).
    ops_.copy(dres_.data(), g.residual2.data(), N_ * C_);
    ops_.layernorm_backward(dres_.data(), lgrad(l, ln1w), lgrad(l, ln1b), g.ln1.data(), input(l), lparam(l, ln1w),
                            a.ln1_mean.data(), a.ln1_rstd.data(), N_, C_);
  }

  // y = A^-1 b for every token vector, A = I + alpha L: the cg stage's solve (cg/rows.h) on the
  // backend's primitives. With `cache`: the lazy gate (docs/sources.md#000-sem-v55) tries the cached solution with one
  // matvec and keeps it when its relative residual is below lazy_tol, else CG starts from it; the
  // solution is cached for the next call.
  void propagate(T* y, const T* b, T* cache, bool lazy) {
    // Marks only when profiling: a timed step solves thousands of times (sem_v55: 1536 solves) and
    // each mark is an event the CUDA backend keeps until it next synchronises.
    struct Clock {  // adds the solve's time when profiling, on every return path
      Model& m;
      bool timed;
      typename Ops::Mark from;
      ~Clock() {
        if (timed) m.solver_s_ += m.ops_.seconds_since(from);
      }
    } clock{*this, profiling_, profiling_ ? ops_.mark() : typename Ops::Mark{}};
    const cg::RowSystems system{N_, C_, prop_.sparsity, prop_.alpha, prop_.cg_tol, prop_.lazy_tol, prop_.max_iters};
    stats_ += cg::solve_rows(ops_.rows(), system, y, b, cache, lazy, solver_.data());
  }

  Ops& ops_;
  ModelSpec m_;
  PropagatorSpec prop_;
  Switches sw_;
  int64_t B_, T_, C_, NH_, V_, H_, N_;
  int64_t param_count_ = 0;
  std::vector<Tensor> tensors_;
  adamw::ParamSet set_;
  std::vector<Acts> acts_;
  Acts grad_layer_;
  Buffer layer_inputs_, lnf_, lnf_mean_, lnf_rstd_, logits_, probs_, losses_, dlogits_, dres_, dtmp_, solver_;
  std::vector<Buffer> residual3_, cache_;
  const int32_t* tokens_ = nullptr;
  const int32_t* targets_ = nullptr;
  SolveStats stats_;
  double solver_s_ = 0;
  bool profiling_ = false;
};

}  // namespace tb::step
