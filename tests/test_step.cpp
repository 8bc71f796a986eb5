// Stage `step`: workload files (presets load; bad files say where), real gradients (finite
// differences in double, with and without the propagator), checkpointing and optimizer variants
// change nothing but speed, the loss falls on the synthetic task, and each backend's step passes its
// check against the double-precision forward.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>

#include "runtime/error.h"
#include "stage_testing.h"
#include "step/cpu_ops.h"
#include "step/step.h"
#include "step/trainer.h"

namespace tb {
namespace {

using namespace step;

std::string error_of(const std::string& yaml) {
  try {
    parse_workload(yaml, "w.yaml");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "accepted";
}

const char* valid = R"(name: t
model: {layers: 2, d_model: 16, heads: 2, seq_len: 8, vocab: 11}
batch: {global: 8, micro: 4}
)";

TEST(Workload, EveryPresetLoads) {
  const auto names = preset_names();
  for (const char* expected : {"sem_v55", "t4_transformer", "small_gpt", "trainer2_window", "energy_flow_bridge", "tiny"})
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  for (const auto& n : names) {
    const Workload w = load_workload(n);
    EXPECT_EQ(w.name, n);
    EXPECT_FALSE(w.source.empty()) << n;
    EXPECT_EQ(w.batch.global % w.batch.micro, 0) << n;
  }
  // seeds/000: 29.9M parameters, batch 4096 = 128 x 32.
  const Workload sem = load_workload("sem_v55");
  EXPECT_NEAR(static_cast<double>(sem.parameter_count()), 29.9e6, 0.015 * 29.9e6);
  EXPECT_EQ(sem.batch.accumulation(), 32);
  EXPECT_TRUE(sem.propagator.enabled);
  EXPECT_EQ(sem.propagator.sparsity, 8);
  EXPECT_DOUBLE_EQ(sem.propagator.lazy_tol, 1e-6);
  EXPECT_EQ(sem.logging.interval, 5);
}

TEST(Workload, BadFilesSayWhereAndWhat) {
  EXPECT_EQ(error_of(valid), "accepted");
  EXPECT_EQ(error_of(std::string(valid) + "switchs: {cuda_graphs: true}\n"),
            "w.yaml:4:1: unknown key 'switchs' in the workload (known: name, source, model, propagator, optimizer, "
            "data, batch, logging, switches)");
  EXPECT_NE(error_of("name: t\nmodel: {layers: two, d_model: 16, heads: 2, seq_len: 8, vocab: 11}\nbatch: {global: 8}\n")
                .find("w.yaml:2:17: layers must be an integer, got 'two'"),
            std::string::npos);
  EXPECT_NE(error_of("name: t\nmodel: {layers: 2, d_model: 16, heads: 3, seq_len: 8, vocab: 11}\nbatch: {global: 8}\n")
                .find("w.yaml:2:40: heads (3) must divide d_model (16)"),
            std::string::npos);
  EXPECT_NE(error_of("name: t\nmodel: {layers: 2, d_model: 16, heads: 2, seq_len: 8, vocab: 11}\nbatch: {global: 10, micro: 4}\n")
                .find("w.yaml:3:28: the global batch (10) is not divisible by the micro-batch (4)"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(valid) + "optimizer: {variant: fastest}\n").find("variant must be one of per_tensor, foreach, fused"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(valid) + "switches: {lazy_cg: maybe}\n").find("lazy_cg must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(valid) + "propagator: {sparsity: 5}\n").find("sparsity must be even"), std::string::npos);
  EXPECT_NE(error_of("name: t\nbatch: {global: 8}\n").find("needs a model section"), std::string::npos);
  EXPECT_NE(error_of("name: [unclosed\n").find("w.yaml:"), std::string::npos);
  EXPECT_THROW(load_workload("no_such_preset"), UsageError);
  try {
    load_workload("no_such_preset");
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("small_gpt"), std::string::npos) << "the message lists the presets";
  }
}

Workload tiny_workload(bool propagator) {
  Workload w = parse_workload(R"(name: grad
model: {layers: 2, d_model: 8, heads: 2, seq_len: 5, vocab: 7, mlp_ratio: 2}
batch: {global: 2, micro: 2}
data: {samples: 16}
)", "grad.yaml");
  w.propagator.enabled = propagator;
  w.propagator.sparsity = 4;
  w.propagator.alpha = 0.3;
  w.propagator.cg_tol = 1e-13;
  w.switches.lazy_cg = false;
  return w;
}

// d(sum of losses)/d(param) by backward against central differences, in double.
void expect_gradients_match(const Workload& w) {
  CpuOps<double> ops;
  Model<CpuOps<double>> model(ops, w.model, w.propagator, w.switches, w.batch.micro);
  const auto data = make_dataset(w.data.samples, w.model.seq_len, w.model.vocab);
  const int64_t Tn = w.model.seq_len, N = model.tokens();
  std::vector<int32_t> tokens(static_cast<std::size_t>(2 * N));
  for (int64_t b = 0; b < w.batch.micro; ++b)
    for (int64_t t = 0; t < Tn; ++t) {
      tokens[b * Tn + t] = data[b * (Tn + 1) + t];
      tokens[N + b * Tn + t] = data[b * (Tn + 1) + t + 1];
    }
  auto loss = [&] {
    model.forward(tokens.data(), tokens.data() + N);
    double s = 0;
    for (int64_t i = 0; i < N; ++i) s += model.losses()[i];
    return s;
  };
  loss();
  model.backward(1.0);
  const std::vector<double> analytic(model.grads.data(), model.grads.data() + model.parameter_count());
  int checked = 0;
  for (const auto& t : model.tensors())
    for (int64_t k : {int64_t{0}, t.size / 2, t.size - 1}) {
      const int64_t i = t.offset + k;
      const double saved = model.params.data()[i], h = 1e-5;
      model.params.data()[i] = saved + h;
      const double up = loss();
      model.params.data()[i] = saved - h;
      const double down = loss();
      model.params.data()[i] = saved;
      const double numeric = (up - down) / (2 * h);
      const double scale = std::max({std::abs(numeric), std::abs(analytic[i]), 1e-6});
      EXPECT_LT(std::abs(numeric - analytic[i]) / scale, 1e-5)
          << "parameter " << i << " (tensor at " << t.offset << "): backward " << analytic[i] << ", finite difference " << numeric;
      ++checked;
    }
  EXPECT_GT(checked, 80);
}

TEST(StepGradients, MatchFiniteDifferences) { expect_gradients_match(tiny_workload(false)); }
TEST(StepGradients, MatchFiniteDifferencesThroughThePropagator) { expect_gradients_match(tiny_workload(true)); }

TEST(StepGradients, CheckpointingChangesOnlyMemory) {
  Workload w = tiny_workload(true);
  std::vector<std::vector<double>> grads;
  std::vector<int64_t> peaks;
  for (bool checkpoint : {false, true}) {
    w.switches.activation_checkpointing = checkpoint;
    CpuOps<double> ops;
    Trainer<CpuOps<double>> trainer(ops, w);
    Model<CpuOps<double>>& m = trainer.model();
    const auto data = make_dataset(w.data.samples, w.model.seq_len, w.model.vocab);
    std::vector<int32_t> tokens(static_cast<std::size_t>(2 * m.tokens()));
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = data[i % data.size()] % static_cast<int32_t>(w.model.vocab);
    m.forward(tokens.data(), tokens.data() + m.tokens());
    m.backward(1.0);
    grads.emplace_back(m.grads.data(), m.grads.data() + m.parameter_count());
    peaks.push_back(ops.memory().peak);
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (std::size_t i = 0; i < grads[0].size(); ++i) ASSERT_NEAR(grads[0][i], grads[1][i], 1e-10) << i;
  EXPECT_LT(peaks[1], peaks[0]) << "checkpointing keeps fewer activations";
}

TEST(StepOptimizer, VariantsComputeTheSameUpdate) {
  std::vector<std::vector<float>> params;
  for (const char* variant : {"per_tensor", "foreach", "fused"}) {
    Workload w = load_workload("tiny");
    w.optimizer.variant = variant;
    w.optimizer.grad_clip = 0.05;  // small enough to clip
    CpuOps<float> ops;
    Trainer<CpuOps<float>> trainer(ops, w);
    for (int i = 0; i < 3; ++i) trainer.step(false);
    params.emplace_back(trainer.model().params.data(), trainer.model().params.data() + trainer.model().parameter_count());
  }
  for (std::size_t v = 1; v < params.size(); ++v)
    for (std::size_t i = 0; i < params[0].size(); ++i) ASSERT_NEAR(params[0][i], params[v][i], 2e-6) << "variant " << v << " at " << i;
}

TEST(StepTraining, LossFallsOnTheSyntheticTask) {
  Workload w = load_workload("tiny");
  w.logging.sync = "every_step";
  w.logging.interval = 1;
  CpuOps<float> ops;
  Trainer<CpuOps<float>> trainer(ops, w);
  double first = 0, last = 0;
  for (int i = 0; i < 300; ++i) {
    const StepReport r = trainer.step(false);
    ASSERT_TRUE(r.loss_read);
    ASSERT_TRUE(std::isfinite(r.loss));
    if (i == 0) first = r.loss;
    last = r.loss;
  }
  EXPECT_NEAR(first, std::log(17.0), 0.3) << "a fresh model guesses uniformly";
  EXPECT_LT(last, 0.6 * first) << "first " << first << ", last " << last;
}

TEST(StepPropagator, LazyGateSkipsAnUnchangedInputAndSolvesAChangedOne) {
  Workload w = tiny_workload(true);
  w.switches.lazy_cg = true;
  w.propagator.cg_tol = 1e-8;
  w.propagator.lazy_tol = 1e-6;
  CpuOps<double> ops;
  Model<CpuOps<double>> model(ops, w.model, w.propagator, w.switches, w.batch.micro);
  std::vector<int32_t> tokens(static_cast<std::size_t>(2 * model.tokens()), 1);
  model.forward(tokens.data(), tokens.data() + model.tokens());
  const SolveStats first = model.solve_stats();
  EXPECT_EQ(first.skipped, 0);
  EXPECT_GT(first.iterations, 0);
  model.forward(tokens.data(), tokens.data() + model.tokens());  // the same input: every solve skipped
  EXPECT_EQ(model.solve_stats().skipped - first.skipped, w.model.layers);
  tokens[0] = 3;  // a changed input: solved again
  model.forward(tokens.data(), tokens.data() + model.tokens());
  EXPECT_EQ(model.solve_stats().skipped, w.model.layers);
  EXPECT_LT(model.solve_stats().worst_residual, 1e-6);
}

Problem one_axis(const std::string& axis, const std::string& value) {
  Problem p;
  p.set(axis, value);
  return p;
}

// The registered variants, as benchsuite runs them: one step, then the check against the double
// forward. The CUDA step also matches the CPU step this way (both against the same reference).
TEST(StepVariant, CpuFirstForwardMatchesTheDoubleReference) {
  const Variant& v = *builtin_registry().find("step")->find_variant("train", Backend::cpu);
  TB_EXPECT_MATCHES_REFERENCE(v, one_axis("cpu_workload", "tiny"));
}

TEST(StepVariant, CudaFirstForwardMatchesTheDoubleReference) {
  const Variant& v = *builtin_registry().find("step")->find_variant("train", Backend::cuda);
  for (const char* workload : {"tiny", "trainer2_window"}) TB_EXPECT_MATCHES_REFERENCE(v, one_axis("workload", workload));
}

TEST(StepVariant, CudaSwitchesMatchTheDoubleReference) {
  const Variant& v = *builtin_registry().find("step")->find_variant("train", Backend::cuda);
  if (const std::string why = testing::cannot_run_here(v); !why.empty()) GTEST_SKIP() << why;
  // Graphs (a workload without the propagator), checkpointing, bf16 matmuls, every optimizer.
  for (const char* extra : {"switches: {cuda_graphs: true}\n", "switches: {activation_checkpointing: true}\n",
                            "switches: {bf16_matmuls: true}\n", "optimizer: {variant: per_tensor}\n",
                            "optimizer: {variant: foreach}\n", "data: {location: host_pageable, per_sample_copy: true}\n",
                            "logging: {sync: async}\n"}) {
    const std::string path = ::testing::TempDir() + "/switch.yaml";
    std::ofstream(path) << "name: switch\nmodel: {layers: 2, d_model: 64, heads: 4, seq_len: 32, vocab: 50}\n"
                        << "batch: {global: 8, micro: 4}\n" << extra;
    auto session = make_session(Backend::cuda, 0);
    auto instance = v.make(one_axis("workload", path), session->context());
    for (int i = 0; i < 3; ++i) instance->run();  // graphs are captured on the second step
    const Verdict verdict = instance->check();
    EXPECT_TRUE(verdict.passed) << extra << verdict.detail;
  }
}

TEST(StepReference, CatchesAWrongLoss) {
  const Workload w = load_workload("tiny");
  std::vector<double> losses = reference_losses(w, 5);
  EXPECT_TRUE(check_first_losses(w, 5, losses, false).passed);
  losses[3] += 1e-3;
  const Verdict v = check_first_losses(w, 5, losses, false);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("token 3"), std::string::npos);
}

TEST(StepRegistry, SwitchesTheCpuCannotRunAreUnsupportedWithAReason) {
  Workload w = load_workload("tiny");
  w.switches.bf16_matmuls = true;
  EXPECT_EQ(unsupported_reason(w, false), "bf16 matmuls are a CUDA switch");
  w.switches.bf16_matmuls = false;
  w.switches.cuda_graphs = true;
  EXPECT_NE(unsupported_reason(w, true).find("fixed length"), std::string::npos);  // tiny has a propagator
}

}  // namespace
}  // namespace tb
