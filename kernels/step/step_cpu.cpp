// The training step on the CPU backend.
#include <algorithm>
#include <cmath>

#include "step/cpu_ops.h"
#include "step/step.h"
#include "step/trainer.h"

namespace tb::step {

namespace {

class CpuStep final : public StepInstance {
 public:
  explicit CpuStep(const Workload& w) : w_(w), trainer_(ops_, w) {}
  void run() override { trainer_.step(false); }
  Verdict check() override {
    if (trainer_.steps() == 0) return Verdict{false, 0, "no step has run"};
    return check_first_losses(w_, trainer_.first_sample(), trainer_.first_losses(), false);
  }
  int64_t peak_bytes() const override { return ops_.memory().peak; }
  void record_micro_batches(int64_t count) override { trainer_.record_micro_batches(count); }
  std::vector<MicroBatchLosses> recorded_micro_batches() override { return trainer_.recorded_micro_batches(); }
  std::vector<double> exp_avg() override { return trainer_.exp_avg_values(); }
  MarkCount marks() const override { return MarkCount{ops_.marks_taken(), 0}; }
  bool capturing() const override { return false; }
  std::vector<std::pair<std::string, double>> observed() const override {
    auto* self = const_cast<CpuStep*>(this);  // profiling runs more steps of this trainer
    return observe(self->trainer_, ops_, 3);
  }

 private:
  Workload w_;
  CpuOps<float> ops_;
  Trainer<CpuOps<float>> trainer_;
};

}  // namespace

std::unique_ptr<StepInstance> make_cpu_step(const Workload& w) { return std::make_unique<CpuStep>(w); }

}  // namespace tb::step
