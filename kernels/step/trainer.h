// One optimizer step of a workload: for each micro-batch, load it (the workload's data path),
// forward, backward into the accumulated gradients; then the global gradient norm and clipping
// factor (kept on the backend), AdamW, and the host reads the logging policy asks for.
//
// The dataset is synthetic and learnable: token sequences from a fixed sparse Markov chain (each
// token has two likely successors), so the loss falls from ln(vocab) towards the chain's entropy.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "adamw/adamw.h"
#include "collate/collate.h"
#include "runtime/comm.h"
#include "runtime/random.h"
#include "runtime/stats.h"
#include "step/model.h"
#include "step/step.h"
#include "step/workload.h"

namespace tb::step {

inline constexpr uint64_t seed_data = 41;

// The dataset as the host holds it: samples x (seq_len + 1) tokens, the collate stage's token rows
// (inputs and next-token targets; collate/collate.h).
inline std::vector<int32_t> make_dataset(int64_t samples, int64_t seq_len, int64_t vocab) {
  std::vector<int32_t> data(static_cast<std::size_t>(samples * (seq_len + 1)));
  for (int64_t s = 0; s < samples; ++s) {
    auto token = static_cast<int64_t>(splitmix64(seed_data * 7919 + s) % static_cast<uint64_t>(vocab));
    for (int64_t t = 0; t <= seq_len; ++t) {
      data[s * (seq_len + 1) + t] = static_cast<int32_t>(token);
      const double u = uniform_at(seed_data, static_cast<uint64_t>(s * (seq_len + 1) + t), 0.0f, 1.0f);
      token = u < 0.75 ? (token * 7 + 1) % vocab : (token * 3 + 2) % vocab;
    }
  }
  return data;
}

// The epoch's shuffle, applied to the previous epoch's order: Fisher-Yates with a counter-based
// generator, so that every backend (and a twin of the step in another framework) sees the same order.
inline void shuffle_order(std::vector<int32_t>& order, uint64_t epoch) {
  for (std::size_t i = order.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(splitmix64(seed_data * 104729 + epoch * 1000003 + i) % i);
    std::swap(order[i - 1], order[j]);
  }
}

// The sample the first micro-batch starts with: the one whose first forward check() compares.
inline int32_t first_sample_of(int64_t samples) {
  std::vector<int32_t> order(static_cast<std::size_t>(samples));
  std::iota(order.begin(), order.end(), 0);
  shuffle_order(order, 0);
  return order.front();
}

// What one step measured. Part times are filled only by a profiled step.
struct StepReport {
  bool loss_read = false;
  double loss = 0;       // mean per-token loss since the last read
  double grad_norm = 0;  // before clipping; read with the loss
  double data_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0, sync_s = 0, solver_s = 0;
  double allreduce_s = 0;  // data parallelism: the gradients' all-reduce
};

template <class Ops>
class Trainer {
 public:
  using T = typename Ops::value_type;

  Trainer(Ops& ops, const Workload& w)
      : ops_(ops),
        w_(w),
        accumulation_(w.batch.accumulation()),
        ranks_(w.distributed.ranks),
        rank_(ranks_ > 1 ? comm::world().rank() : 0),
        model_(ops, w.model, w.propagator, w.switches, w.batch.micro),
        kind_(optimizer_kind(w.optimizer.variant)),
        dataset_(make_dataset(w.data.samples, w.model.seq_len, w.model.vocab)) {
    const int64_t P = model_.parameter_count(), N = model_.tokens();
    m_ = ops.template alloc<T>(P);
    v_ = ops.template alloc<T>(P);
    ops.zero(m_.data(), P);
    ops.zero(v_.data(), P);
    scalars_ = ops.template alloc<T>(2);  // the accumulated loss and the gradient norm
    ops.zero(scalars_.data(), 2);
    tokens_ = ops.template alloc<int32_t>(2 * N);
    const bool pinned = w.data.location == "host_pinned";
    if (w.data.location == "device") {
      resident_ = ops.template alloc<int32_t>(static_cast<int64_t>(dataset_.size()));
      ops.upload_tokens(resident_.data(), dataset_.data(), static_cast<int64_t>(dataset_.size()), false);
      indices_ = ops.template alloc<int32_t>(w.batch.micro);
      for (auto& slot : index_staging_) slot = ops.template alloc_host<int32_t>(w.batch.micro, true);
    } else {
      for (auto& slot : staging_) slot = ops.template alloc_host<int32_t>(2 * N, pinned);
      if (w.data.per_sample_copy) row_samples_ = collate::TokenRowSamples(w.batch.micro, w.model.seq_len);
    }
    order_.resize(static_cast<std::size_t>(w.data.samples));
    std::iota(order_.begin(), order_.end(), 0);
    shuffle();
  }

  Model<Ops>& model() { return model_; }
  int64_t steps() const { return step_; }
  const Workload& workload() const { return w_; }
  // The first forward's per-token losses of its first sequence, and which dataset sample that was:
  // what check() compares with the double-precision reference.
  const std::vector<double>& first_losses() const { return first_losses_; }
  int32_t first_sample() const { return first_sample_; }
  const typename Ops::template Buffer<T>& exp_avg() const { return m_; }
  std::vector<double> exp_avg_values() const {
    std::vector<T> host(static_cast<std::size_t>(model_.parameter_count()));
    ops_.download(host.data(), m_.data(), model_.parameter_count());
    return std::vector<double>(host.begin(), host.end());
  }

  // Keeps the next `count` micro-batches' per-token losses in backend memory (counted in the peak:
  // a test's, not a measurement's), copied there in stream order, so recording adds no wait.
  void record_micro_batches(int64_t count) {
    record_ = ops_.template alloc<T>(count * model_.tokens());
    record_capacity_ = count;
    recorded_samples_.clear();
  }
  std::vector<MicroBatchLosses> recorded_micro_batches() {
    const int64_t N = model_.tokens(), count = static_cast<int64_t>(recorded_samples_.size());
    std::vector<T> host(static_cast<std::size_t>(count * N));
    if (count > 0) ops_.download(host.data(), record_.data(), count * N);
    std::vector<MicroBatchLosses> out(static_cast<std::size_t>(count));
    for (int64_t k = 0; k < count; ++k) {
      out[k].samples = recorded_samples_[k];
      out[k].losses.assign(host.begin() + k * N, host.begin() + (k + 1) * N);
    }
    return out;
  }

  StepReport step(bool profile) {
    using Mark = typename Ops::Mark;
    StepReport report;
    model_.set_profiling(profile);
    model_.reset_solver_seconds();
    const int64_t N = model_.tokens();
    // The mean over the global batch: every rank's share, summed by the all-reduce.
    const T scale = static_cast<T>(1.0 / static_cast<double>(N * accumulation_ * ranks_));
    std::vector<Mark> marks;
    std::vector<double> solver_after;  // solver seconds after each forward and backward
    for (int64_t micro = 0; micro < accumulation_; ++micro) {
      if (profile) marks.push_back(ops_.mark());
      load_batch();
      if (profile) marks.push_back(ops_.mark());
      if constexpr (Ops::supports_graphs) {
        // cuda_graphs: from graph_capture_step on, forward and backward are one graph launch; the
        // batch buffer they read has a fixed address, refilled before each replay.
        if (w_.switches.cuda_graphs && !profile && step_ >= graph_capture_step) {
          if (!ops_.captured()) ops_.capture([&] { micro_step(scale); });
          ops_.replay();
          record_micro_batch();
          continue;
        }
      }
      model_.forward(tokens_.data(), tokens_.data() + N);
      if (step_ == 0 && micro == 0) capture_first_losses();
      if (profile) marks.push_back(ops_.mark()), solver_after.push_back(model_.solver_seconds());
      record_micro_batch();
      ops_.sum_losses(scalars_.data(), model_.losses(), N, scale);
      model_.backward(scale);
      if (profile) marks.push_back(ops_.mark()), solver_after.push_back(model_.solver_seconds());
    }
    ++step_;
    ++since_read_;
    if (ranks_ > 1) {
      const auto bucket = std::max<int64_t>(1, static_cast<int64_t>(w_.distributed.bucket_mb * double(1 << 20) / sizeof(T)));
      ops_.allreduce_sum(model_.grads.data(), model_.parameter_count(), bucket);
      if (profile) marks.push_back(ops_.mark());
    }
    ops_.clip_gradients(scalars_.data() + 1, model_.grads.data(), model_.parameter_set(), kind_, w_.optimizer.grad_clip);
    const adamw::Hyper hyper{w_.optimizer.lr, w_.optimizer.beta1, w_.optimizer.beta2, w_.optimizer.eps,
                             w_.optimizer.weight_decay};
    ops_.adamw(kind_, model_.parameter_set(), model_.params.data(), model_.grads.data(), m_.data(), v_.data(), hyper, step_);
    ops_.zero(model_.grads.data(), model_.parameter_count());
    if (profile) marks.push_back(ops_.mark());
    read_per_policy(report);
    if (profile) {
      marks.push_back(ops_.mark());
      ops_.synchronize();
      double solver_before = 0;
      for (int64_t micro = 0; micro < accumulation_; ++micro) {
        const Mark* m = &marks[static_cast<std::size_t>(4 * micro)];
        const double fwd_solver = solver_after[2 * micro] - solver_before;
        const double bwd_solver = solver_after[2 * micro + 1] - solver_after[2 * micro];
        solver_before = solver_after[2 * micro + 1];
        report.data_s += ops_.seconds_between(m[0], m[1]);
        report.forward_s += ops_.seconds_between(m[1], m[2]) - fwd_solver;
        report.backward_s += ops_.seconds_between(m[2], m[3]) - bwd_solver;
      }
      const std::size_t last = marks.size() - 1;
      report.optimizer_s = ops_.seconds_between(marks[last - 2], marks[last - 1]);
      if (ranks_ > 1) report.allreduce_s = ops_.seconds_between(marks[last - 3], marks[last - 2]);
      report.sync_s = ops_.seconds_between(marks[last - 1], marks[last]);
      report.solver_s = model_.solver_seconds();
    }
    return report;
  }

 private:
  void micro_step(T scale) {
    const int64_t N = model_.tokens();
    model_.forward(tokens_.data(), tokens_.data() + N);
    ops_.sum_losses(scalars_.data(), model_.losses(), N, scale);
    model_.backward(scale);
  }

  void capture_first_losses() {
    std::vector<T> host(static_cast<std::size_t>(w_.model.seq_len));
    ops_.download(host.data(), model_.losses(), w_.model.seq_len);
    first_losses_.assign(host.begin(), host.end());
    first_sample_ = picked_.front();
  }

  void record_micro_batch() {
    const auto k = static_cast<int64_t>(recorded_samples_.size());
    if (k == record_capacity_) return;
    const int64_t N = model_.tokens();
    ops_.copy(record_.data() + k * N, model_.losses(), N);
    recorded_samples_.push_back(picked_);
  }

  void shuffle() {
    shuffle_order(order_, epoch_);
    ++epoch_;
    cursor_ = 0;
  }

  // The workload's data path, the collate stage's token-rows functions (what its layout=token_rows
  // measures): per-sample copies and a stack (what __getitem__ + collate do), or one gather; then
  // the copy to the backend from pageable or pinned memory, or a gather on the backend from a
  // resident dataset. Two staging slots: the host fills one while the copy queued from the
  // other may not have run yet (accumulation, an async read, graph replays let the host run ahead),
  // and waits only when the slot it is about to refill still has a copy pending.
  void load_batch() {
    const int64_t B = w_.batch.micro, Tn = w_.model.seq_len, N = B * Tn;
    picked_.resize(static_cast<std::size_t>(B));
    // Every rank walks the same shuffled order; rank r's micro-batch is the r-th slice of B.
    for (int64_t k = 0; k < B * ranks_; ++k) {
      if (cursor_ >= order_.size()) shuffle();
      const int32_t sample = order_[cursor_++];
      if (k / B == rank_) picked_[static_cast<std::size_t>(k % B)] = sample;
    }
    const std::size_t slot = loads_++ % 2;
    if (w_.data.location == "device") {
      auto& staging = index_staging_[slot];
      ops_.wait_until_free(staging);
      std::copy(picked_.begin(), picked_.end(), staging.data());
      ops_.upload_staged(indices_.data(), staging, B, true);
      ops_.gather_tokens(tokens_.data(), resident_.data(), indices_.data(), B, Tn);
      return;
    }
    auto& staging = staging_[slot];
    ops_.wait_until_free(staging);
    if (w_.data.per_sample_copy)
      collate::stack_token_rows_per_sample(dataset_.data(), Tn, picked_.data(), B, row_samples_, staging.data());
    else collate::stack_token_rows(dataset_.data(), Tn, picked_.data(), B, staging.data());
    ops_.upload_staged(tokens_.data(), staging, 2 * N, w_.data.location == "host_pinned");
  }

  // every_step: loss.item() on every step; every_n: a read every `interval` steps; async: the read
  // of the previous step's copy, which never waits for the current step.
  void read_per_policy(StepReport& report) {
    const std::string& sync = w_.logging.sync;
    const bool read = sync == "every_step" || sync == "async" || step_ % w_.logging.interval == 0;
    if (!read) return;
    T values[2];
    int64_t steps_in_value = since_read_;
    if (sync == "async") {
      // The values that arrive are the previous read's: the copy queued now is read next step.
      const bool arrived = ops_.read_scalars_async(values, scalars_.data(), 2);
      steps_in_value = pending_steps_;
      pending_steps_ = since_read_;
      if (!arrived) {
        since_read_ = 0;
        ops_.zero(scalars_.data(), 1);
        return;
      }
    } else {
      ops_.read_scalars(values, scalars_.data(), 2);
    }
    if (ranks_ > 1) {  // each rank summed its share of the losses
      double loss = static_cast<double>(values[0]);
      comm::world().allreduce(&loss, &loss, 1, comm::Elem::f64, comm::Reduce::sum);
      values[0] = static_cast<T>(loss);
    }
    report.loss_read = true;
    report.loss = static_cast<double>(values[0]) / static_cast<double>(std::max<int64_t>(steps_in_value, 1));
    report.grad_norm = static_cast<double>(values[1]);
    since_read_ = 0;
    ops_.zero(scalars_.data(), 1);
  }

  Ops& ops_;
  Workload w_;
  int64_t accumulation_;
  int64_t ranks_, rank_;
  Model<Ops> model_;
  OptimizerKind kind_;
  std::vector<int32_t> dataset_;
  collate::TokenRowSamples row_samples_;  // what __getitem__ returns, with per_sample_copy on the host
  std::vector<int32_t> order_;
  std::size_t cursor_ = 0;
  uint64_t epoch_ = 0;
  typename Ops::template Buffer<T> m_, v_, scalars_;
  typename Ops::template Buffer<int32_t> tokens_, resident_, indices_;
  std::array<typename Ops::template Staging<int32_t>, 2> staging_, index_staging_;
  std::size_t loads_ = 0;
  int64_t step_ = 0, since_read_ = 0, pending_steps_ = 0;
  std::vector<int32_t> picked_;  // the samples of the batch loaded last
  int32_t first_sample_ = 0;
  std::vector<double> first_losses_;
  typename Ops::template Buffer<T> record_;
  int64_t record_capacity_ = 0;
  std::vector<std::vector<int32_t>> recorded_samples_;
};

// What a row reports beside the step time: the split by part (median of profiled steps), the
// allocator's high-water mark, the solver's behaviour and the loss.
template <class Trainer, class Ops>
std::vector<std::pair<std::string, double>> observe(Trainer& trainer, const Ops& ops, int profiled_steps) {
  std::vector<StepReport> reports;
  trainer.model().reset_solve_stats();
  for (int i = 0; i < profiled_steps; ++i) reports.push_back(trainer.step(true));
  auto median_part = [&](double StepReport::*part) {
    std::vector<double> v;
    for (const auto& r : reports) v.push_back(r.*part);
    return median_of(v) * 1e9;
  };
  std::vector<std::pair<std::string, double>> out{{"data_ns", median_part(&StepReport::data_s)},
                                                  {"forward_ns", median_part(&StepReport::forward_s)},
                                                  {"backward_ns", median_part(&StepReport::backward_s)},
                                                  {"optimizer_ns", median_part(&StepReport::optimizer_s)},
                                                  {"sync_ns", median_part(&StepReport::sync_s)},
                                                  {"solver_ns", median_part(&StepReport::solver_s)},
                                                  {"peak_memory_mib", static_cast<double>(ops.memory().peak) / (1 << 20)}};
  if (trainer.workload().distributed.ranks > 1) out.emplace_back("allreduce_ns", median_part(&StepReport::allreduce_s));
  const SolveStats& s = trainer.model().solve_stats();
  if (s.solves > 0) {
    out.emplace_back("cg_skip_rate", static_cast<double>(s.skipped) / static_cast<double>(s.solves));
    out.emplace_back("cg_iterations_per_solve", static_cast<double>(s.iterations) / static_cast<double>(s.solves));
    out.emplace_back("cg_worst_residual", s.worst_residual);
  }
  for (auto it = reports.rbegin(); it != reports.rend(); ++it)
    if (it->loss_read) {
      out.emplace_back("loss", it->loss);
      out.emplace_back("grad_norm", it->grad_norm);
      break;
    }
  return out;
}

}  // namespace tb::step
