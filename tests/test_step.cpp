// Stage `step`: workload files (presets load; bad files say where), real gradients (finite
// differences in double, with and without the propagator), checkpointing and optimizer variants
// change nothing but speed, the loss falls on the synthetic task, and each backend's step passes its
// check against the double-precision forward, as does every micro-batch of several steps. Timed steps
// take no timing marks, the profiled steps' parts make up a step, a failed graph capture leaves the
// stream usable, and each backend's gradients match the CPU's in double.
#include <gtest/gtest.h>
#include <filesystem>

#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <unistd.h>

#include "attention/attention.h"
#include "runtime/error.h"
#include "runtime/tolerance.h"
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
  // docs/sources.md#000-sem-v55: 29.9M parameters, batch 4096 = 128 x 32.
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
  EXPECT_NE(error_of(
                "name: t\nmodel: {layers: 2, d_model: 16, heads: 2, seq_len: 8, vocab: 11}\nbatch: {global: 10, micro: 4}\n")
                .find("w.yaml:3:28: the global batch (10) is not divisible by the micro-batch (4)"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(valid) + "optimizer: {variant: fastest}\n")
                .find("variant must be one of per_tensor, foreach, fused"),
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

// A workload file that cannot be read says why: not found, a folder, or not readable.
TEST(Workload, AnUnreadableFileSaysWhy) {
  auto message = [](const std::string& path) -> std::string {
    try {
      load_workload(path);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "accepted";
  };
  const auto dir = std::filesystem::temp_directory_path() / ("tb_workload_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "folder.yaml");
  EXPECT_EQ(message((dir / "missing.yaml").string()),
            "cannot read workload file " + (dir / "missing.yaml").string() + ": not found");
  EXPECT_NE(message((dir / "folder.yaml").string()).find(": is a directory"), std::string::npos)
      << message((dir / "folder.yaml").string());
  const auto locked = dir / "locked.yaml";
  std::ofstream(locked) << valid;
  std::filesystem::permissions(locked, std::filesystem::perms::none);
  if (::access(locked.c_str(), R_OK) == 0) {  // root reads it anyway
    EXPECT_EQ(message(locked.string()), "accepted");
  } else {
    EXPECT_NE(message(locked.string()).find(": not readable: Permission denied"), std::string::npos)
        << message(locked.string());
  }
  std::filesystem::remove_all(dir);
}

TEST(Workload, RepeatedKeysAreRefusedWithBothLines) {
  // yaml-cpp accepts a repeated key and the parser would see both entries, one silently winning.
  EXPECT_EQ(error_of(std::string(valid) + "model: {layers: 4, d_model: 16, heads: 2, seq_len: 8, vocab: 11}\n"),
            "w.yaml:4:1: duplicate key 'model' (first at line 2)");
  EXPECT_EQ(error_of("name: t\nmodel:\n  layers: 2\n  d_model: 16\n  heads: 2\n  layers: 3\n  seq_len: 8\n  vocab: 11\n"
                     "batch: {global: 8}\n"),
            "w.yaml:6:3: duplicate key 'layers' (first at line 3)");
  EXPECT_EQ(
      error_of(
          "name: t\nmodel: {layers: 2, d_model: 16, heads: 2, seq_len: 8, vocab: 11}\nbatch: {global: 8, global: 16}\n"),
      "w.yaml:3:20: duplicate key 'global' (first at line 3)");
  // The same key in different mappings, and a mapping an alias reaches twice, are not repeats.
  EXPECT_EQ(error_of(std::string(valid) + "data: {samples: 8}\nlogging: {sync: every_n, interval: 8}\n"), "accepted");
  EXPECT_EQ(error_of("name: t\nmodel: &m {layers: 2, d_model: 16, heads: 2, seq_len: 8, vocab: 11}\n"
                     "batch: {global: 8}\nsource: &s [*m, *m]\n"),
            "w.yaml:4:9: source must be a single value");
  EXPECT_NE(error_of("name: t\nsource: &a [*a]\n").find("source must be a single value"), std::string::npos)
      << "an alias inside its own anchor is walked once";
  EXPECT_NE(error_of("name: t\n? [a, b]\n: 1\n").find("w.yaml:2:3: a key in the workload must be a name"),
            std::string::npos);
  for (const char* preset : {"small_gpt", "sem_v55", "tiny"}) EXPECT_NO_THROW(load_workload(preset)) << preset;
}

Workload tiny_workload(bool propagator) {
  Workload w = parse_workload(R"(name: grad
model: {layers: 2, d_model: 8, heads: 2, seq_len: 5, vocab: 7, mlp_ratio: 2}
batch: {global: 2, micro: 2}
data: {samples: 16}
)",
                              "grad.yaml");
  w.propagator.enabled = propagator;
  w.propagator.sparsity = 4;
  w.propagator.alpha = 0.3;
  w.propagator.cg_tol = 1e-13;
  w.switches.lazy_cg = false;
  return w;
}

// The dataset's first micro-batch: inputs [B, T] of samples 0..B-1, then their targets.
std::vector<int32_t> first_micro_batch(const Workload& w) {
  const auto data = make_dataset(w.data.samples, w.model.seq_len, w.model.vocab);
  const int64_t Tn = w.model.seq_len, N = w.batch.micro * Tn;
  std::vector<int32_t> tokens(static_cast<std::size_t>(2 * N));
  for (int64_t b = 0; b < w.batch.micro; ++b)
    for (int64_t t = 0; t < Tn; ++t) {
      tokens[b * Tn + t] = data[b * (Tn + 1) + t];
      tokens[N + b * Tn + t] = data[b * (Tn + 1) + t + 1];
    }
  return tokens;
}

// d(sum of losses)/d(param) by backward against central differences, in double.
void expect_gradients_match(const Workload& w) {
  CpuOps<double> ops;
  Model<CpuOps<double>> model(ops, w.model, w.propagator, w.switches, w.batch.micro);
  const int64_t N = model.tokens();
  std::vector<int32_t> tokens = first_micro_batch(w);
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
          << "parameter " << i << " (tensor at " << t.offset << "): backward " << analytic[i] << ", finite difference "
          << numeric;
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
    for (std::size_t i = 0; i < params[0].size(); ++i)
      ASSERT_NEAR(params[0][i], params[v][i], 2e-6) << "variant " << v << " at " << i;
}

// The float step against the double oracle (whose attention is the stage's reference): the gradients
// of one micro-batch, with attention naive and fused, at a length past one 64-key tile.
TEST(StepGradients, FloatStepMatchesTheDoubleOracleWithEitherAttention) {
  Workload w = tiny_workload(false);
  w.model.seq_len = 70;
  w.model.d_model = 16;
  const std::vector<int32_t> tokens = first_micro_batch(w);
  auto gradients = [&](auto& ops) {
    using Ops = std::decay_t<decltype(ops)>;
    Model<Ops> model(ops, w.model, w.propagator, w.switches, w.batch.micro);
    const int64_t N = model.tokens();
    model.forward(tokens.data(), tokens.data() + N);
    model.backward(1.0);
    return std::vector<double>(model.grads.data(), model.grads.data() + model.parameter_count());
  };
  CpuOps<double> oracle;
  const std::vector<double> want = gradients(oracle);
  double largest = 0;
  for (double g : want) largest = std::max(largest, std::abs(g));
  for (bool fused : {false, true}) {
    w.switches.fused_attention = fused;
    CpuOps<float> ops;
    const std::vector<double> got = gradients(ops);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-4 * largest + 1e-3 * std::abs(want[i]))
          << (fused ? "fused" : "naive") << " attention, gradient " << i;
  }
}

// Fused attention keeps one log-sum-exp per row instead of P [B, NH, T, T]: at T = 256 the peak falls
// by about L x B x NH x T^2 floats, and the estimate the tuner plans with falls with it.
TEST(StepMemory, FusedAttentionFreesTheQuadraticActivations) {
  Workload w = tiny_workload(false);
  w.model.seq_len = 256;
  std::vector<int64_t> peaks;
  std::vector<double> estimates;
  for (bool fused : {false, true}) {
    w.switches.fused_attention = fused;
    CpuOps<float> ops;
    Model<CpuOps<float>> model(ops, w.model, w.propagator, w.switches, w.batch.micro);
    peaks.push_back(ops.memory().peak);
    estimates.push_back(estimate_bytes(w));
  }
  const double quadratic = 4.0 * static_cast<double>(w.batch.micro * w.model.heads * w.model.seq_len * w.model.seq_len);
  // Each layer's P, and the one dP of the layer in backward.
  EXPECT_NEAR(static_cast<double>(peaks[0] - peaks[1]), (w.model.layers + 1) * quadratic, 0.02 * quadratic);
  EXPECT_NEAR(estimates[0] - estimates[1], (w.model.layers + 1) * quadratic, 0.02 * quadratic);
}

// The CPU's fused attention workspace (made by the first forward) is the step's memory too: the meter
// counts it, so the peak includes it. The backward's per-thread partial sums are kept and reused: a
// second step allocates nothing.
TEST(StepMemory, PeakCountsTheFusedAttentionWorkspaceAndLaterStepsAllocateNothing) {
  Workload w = tiny_workload(false);
  w.model.seq_len = 70;  // past one 64-key tile
  w.switches.fused_attention = true;
  const std::vector<int32_t> tokens = first_micro_batch(w);
  CpuOps<float> ops;
  Model<CpuOps<float>> model(ops, w.model, w.propagator, w.switches, w.batch.micro);
  const int64_t before = ops.memory().current;
  model.forward(tokens.data(), tokens.data() + model.tokens());
  const int64_t workspace = attention::FusedWorkspace(w.model.d_model / w.model.heads, w.model.seq_len).bytes();
  ASSERT_GT(workspace, 0);
  EXPECT_EQ(ops.memory().current - before, workspace);
  EXPECT_GE(ops.memory().peak, before + workspace);
  model.backward(1.0f);
  const MemoryMeter first = ops.memory();
  model.forward(tokens.data(), tokens.data() + model.tokens());
  model.backward(1.0f);
  EXPECT_EQ(ops.memory().current, first.current);
  EXPECT_EQ(ops.memory().peak, first.peak);
}

// The optimizer's temporaries are the step's memory too (foreach keeps one the size of every
// parameter), counted once, when its plan is made, as the CUDA backend counts its plan.
TEST(StepMemory, TheForeachOptimizersTemporaryIsMetered) {
  const adamw::ParamSet set = adamw::make_param_set(1000, 4);
  CpuOps<float> ops;
  std::vector<float> params(static_cast<std::size_t>(set.arena), 0.5f), grads(params.size(), 0.1f), m(params.size(), 0.0f),
      v(params.size(), 0.0f);
  const int64_t before = ops.memory().current;
  ops.adamw(OptimizerKind::foreach, set, params.data(), grads.data(), m.data(), v.data(), adamw::stage_hyper(), 1);
  const int64_t after = ops.memory().current;
  EXPECT_GE(after - before, set.arena * static_cast<int64_t>(sizeof(float)));
  ops.adamw(OptimizerKind::foreach, set, params.data(), grads.data(), m.data(), v.data(), adamw::stage_hyper(), 2);
  EXPECT_EQ(ops.memory().current, after);
}

TEST(StepWorkload, AttentionSwitchIsFusedUnlessSaid) {
  const std::string base = "name: t\nmodel: {layers: 1, d_model: 8, heads: 2, seq_len: 4, vocab: 5}\nbatch: {global: 2}\n";
  EXPECT_TRUE(parse_workload(base, "w.yaml").switches.fused_attention) << "PyTorch's default: SDPA";
  EXPECT_FALSE(parse_workload(base + "switches: {attention: naive}\n", "w.yaml").switches.fused_attention);
  try {
    parse_workload(base + "switches: {attention: flash}\n", "w.yaml");
    ADD_FAILURE() << "an unknown attention was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("w.yaml:4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("naive"), std::string::npos) << e.what();
  }
}

class StepTraining : public ::testing::TestWithParam<bool> {};

TEST_P(StepTraining, LossFallsOnTheSyntheticTask) {
  Workload w = load_workload("tiny");
  w.switches.fused_attention = GetParam();
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

INSTANTIATE_TEST_SUITE_P(Attention, StepTraining, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "fused" : "naive"; });

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
  for (const char* extra :
       {"switches: {cuda_graphs: true}\n", "switches: {activation_checkpointing: true}\n",
        "switches: {bf16_matmuls: true}\n", "optimizer: {variant: per_tensor}\n", "optimizer: {variant: foreach}\n",
        "data: {location: host_pageable, per_sample_copy: true}\n", "logging: {sync: async}\n"}) {
    const std::string path = ::testing::TempDir() + "/tb_" + std::to_string(::getpid()) + "_switch.yaml";
    std::ofstream(path) << "name: switch\nmodel: {layers: 2, d_model: 64, heads: 4, seq_len: 32, vocab: 50}\n"
                        << "batch: {global: 8, micro: 4}\n"
                        << extra;
    auto session = make_session(Backend::cuda, 0);
    auto instance = v.make(one_axis("workload", path), session->context());
    for (int i = 0; i < 3; ++i) instance->run();  // graphs are captured on the second step
    const Verdict verdict = instance->check();
    EXPECT_TRUE(verdict.passed) << extra << verdict.detail;
  }
}

// ---- the step's CUDA path, with the CPU backend beside it where a test can run there too ----------

// The registered `train` variant of `backend`, made from a workload file as benchsuite makes it.
const Variant& train_variant(Backend backend) { return *builtin_registry().find("step")->find_variant("train", backend); }

struct MadeStep {
  std::unique_ptr<BackendSession> session;
  std::unique_ptr<StepInstance> step;
};

MadeStep make_step(Backend backend, const std::string& path) {
  MadeStep m;
  m.session = make_session(backend, 0);
  std::unique_ptr<Instance> made = train_variant(backend).make(
      one_axis(backend == Backend::cpu ? "cpu_workload" : "workload", path), m.session->context());
  auto* step = dynamic_cast<StepInstance*>(made.get());
  if (!step) throw std::logic_error("the step variant made something other than a StepInstance");
  made.release();
  m.step.reset(step);
  return m;
}

// Named by the process too: ctest -j runs this binary's cases side by side, each writing its files.
std::string write_workload(const std::string& file, const std::string& yaml) {
  const std::string path = ::testing::TempDir() + "/tb_" + std::to_string(::getpid()) + "_" + file;
  std::ofstream(path) << yaml;
  return path;
}

// Every micro-batch of several steps, not only the first one check() sees, against the double
// forward. lr 0 keeps the parameters at their initialisation, so the fresh model's reference holds
// for every micro-batch of every step. Accumulation 4 and the async read let the host run ahead of
// the device; graph replays (from the capturing step on) let it run furthest. A batch refilled
// while its copy is still queued trains on the wrong tokens: its losses match no reference. Each of
// the data paths (collate's token rows: one gather, per-sample copies and a stack, the resident
// gather) loads the batches.
void expect_every_micro_batch_matches(Backend backend) {
  if (const std::string why = testing::cannot_run_here(train_variant(backend)); !why.empty()) GTEST_SKIP() << why;
  // On the GPU a model whose kernels outlast their launches, so that copies queue up behind them;
  // the CPU has no queue to race, and a small model keeps it quick.
  const std::string model = backend == Backend::cuda
                                ? "model: {layers: 2, d_model: 128, heads: 4, seq_len: 64, vocab: 512, mlp_ratio: 4}\n"
                                  "batch: {global: 32, micro: 8}\n"
                                : "model: {layers: 2, d_model: 32, heads: 2, seq_len: 16, vocab: 23, mlp_ratio: 2}\n"
                                  "batch: {global: 16, micro: 4}\n";
  constexpr int64_t steps = graph_capture_step + 2;  // eager, capturing, replays only
  std::vector<bool> graphs{false};
  if (backend == Backend::cuda) graphs.push_back(true);
  for (const char* data : {"location: host_pinned", "location: device", "location: host_pageable, per_sample_copy: true"})
    for (const bool graph : graphs) {
      const std::string label = std::string(data) + (graph ? ", cuda_graphs" : "");
      const std::string path = write_workload("every_micro.yaml", "name: every_micro\n" + model +
                                                                      "optimizer: {lr: 0.0, weight_decay: 0.0}\n"
                                                                      "data: {samples: 64, " +
                                                                      data +
                                                                      "}\n"
                                                                      "logging: {sync: async}\n"
                                                                      "switches: {cuda_graphs: " +
                                                                      (graph ? "true" : "false") + "}\n");
      const Workload w = load_workload(path);
      ASSERT_EQ(w.batch.accumulation(), 4);
      MadeStep made = make_step(backend, path);
      made.step->record_micro_batches(steps * w.batch.accumulation());
      for (int64_t s = 0; s < steps; ++s) made.step->run();
      const std::vector<MicroBatchLosses> got = made.step->recorded_micro_batches();
      ASSERT_EQ(static_cast<int64_t>(got.size()), steps * w.batch.accumulation()) << label;
      std::map<int32_t, std::vector<double>> reference;
      const int64_t Tn = w.model.seq_len;
      const Tolerance tol = tolerance::step_fp32;
      for (std::size_t k = 0; k < got.size(); ++k) {
        ASSERT_EQ(static_cast<int64_t>(got[k].samples.size()), w.batch.micro);
        for (int64_t b = 0; b < w.batch.micro; ++b) {
          const int32_t sample = got[k].samples[b];
          auto it = reference.find(sample);
          if (it == reference.end()) it = reference.emplace(sample, reference_losses(w, sample)).first;
          for (int64_t t = 0; t < Tn; ++t) {
            const double loss = got[k].losses[b * Tn + t];
            ASSERT_TRUE(tol.accepts(loss, it->second[t]))
                << label << ": step " << k / w.batch.accumulation() << ", micro-batch " << k % w.batch.accumulation()
                << ", sequence " << b << " (sample " << sample << "), token " << t << ": loss " << loss
                << ", double reference " << it->second[t];
          }
        }
      }
    }
}

TEST(StepData, EveryMicroBatchOfEveryStepMatchesTheReferenceOnTheCpu) { expect_every_micro_batch_matches(Backend::cpu); }

TEST(StepData, EveryMicroBatchOfEveryStepMatchesTheReferenceOnCuda) { expect_every_micro_batch_matches(Backend::cuda); }

// The step's batch is the collate stage's token rows: the first micro-batch as this file writes it out
// is collate's oracle over the step's dataset, and the CPU backend's resident gather equals the oracle.
TEST(StepData, TheBatchIsTheCollateStagesTokenRows) {
  const Workload w = tiny_workload(false);
  const auto data = make_dataset(w.data.samples, w.model.seq_len, w.model.vocab);
  const int64_t Tn = w.model.seq_len;
  auto oracle = [&](const std::vector<int32_t>& picked) {
    std::vector<int32_t> batch(2 * picked.size() * static_cast<std::size_t>(Tn));
    collate::reference_token_rows(data.data(), Tn, picked.data(), static_cast<int64_t>(picked.size()), batch.data());
    return batch;
  };
  std::vector<int32_t> first(static_cast<std::size_t>(w.batch.micro));
  std::iota(first.begin(), first.end(), 0);
  EXPECT_EQ(first_micro_batch(w), oracle(first));

  const std::vector<int32_t> picked{static_cast<int32_t>(w.data.samples - 1), 2, 2, 0};
  std::vector<int32_t> gathered(2 * picked.size() * static_cast<std::size_t>(Tn), -1);
  CpuOps<float> ops;
  ops.gather_tokens(gathered.data(), data.data(), picked.data(), static_cast<int64_t>(picked.size()), Tn);
  EXPECT_EQ(gathered, oracle(picked));
}

// Timing marks belong to profiled steps only: a timed step with the propagator solves many times
// per step, and CUDA's event pool is reset only at a synchronisation, which a timed step never has.
void expect_unprofiled_steps_take_no_marks(Backend backend, int steps) {
  if (const std::string why = testing::cannot_run_here(train_variant(backend)); !why.empty()) GTEST_SKIP() << why;
  MadeStep made = make_step(backend, "tiny");  // the propagator, the lazy gate, accumulation
  const MarkCount before = made.step->marks();
  for (int i = 0; i < steps; ++i) made.step->run();
  const MarkCount after = made.step->marks();
  EXPECT_EQ(after.taken, before.taken) << "marks taken by " << steps << " unprofiled steps";
  EXPECT_EQ(after.pool, before.pool) << "the event pool grew";
  ASSERT_TRUE(made.step->check().passed);
  made.step->observed();  // profiled steps: they do take marks, and counting them works
  EXPECT_GT(made.step->marks().taken, after.taken);
}

TEST(StepTiming, UnprofiledStepsTakeNoMarksOnTheCpu) { expect_unprofiled_steps_take_no_marks(Backend::cpu, 5); }
TEST(StepTiming, CudaEventPoolDoesNotGrowOverUnprofiledSteps) { expect_unprofiled_steps_take_no_marks(Backend::cuda, 200); }

// The row's time by part (observed(): profiled steps after the timed ones), named as the PyTorch twin's
// row names its own (trainbench/pytorch/cases/step.py): every part of the step is there, and the parts that always
// run took time. Their sum is a median step's, at most what the profiled steps took together (each
// part's median is at most its sum over those steps): a bound the machine's load cannot break. (That
// the marks leave none of the step out is test_torch_step.py's, on the marks themselves.)
void expect_parts_make_up_a_step(Backend backend) {
  if (const std::string why = testing::cannot_run_here(train_variant(backend)); !why.empty()) GTEST_SKIP() << why;
  MadeStep made = make_step(backend, "tiny");  // data, forward, backward, the propagator's solves, the optimizer
  for (int i = 0; i < 5; ++i) made.step->run();
  ASSERT_TRUE(made.step->check().passed);
  const auto begin = std::chrono::steady_clock::now();
  std::map<std::string, double> seen;
  for (const auto& [key, value] : made.step->observed()) seen[key] = value;
  const double profiling_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - begin).count();
  double parts_ns = 0;
  for (const char* part : {"data_ns", "forward_ns", "backward_ns", "optimizer_ns", "sync_ns", "solver_ns"}) {
    ASSERT_TRUE(seen.count(part)) << part;
    EXPECT_GE(seen[part], 0) << part;
    parts_ns += seen[part];
  }
  for (const char* part : {"data_ns", "forward_ns", "backward_ns", "optimizer_ns", "solver_ns"})
    EXPECT_GT(seen[part], 0) << part;
  EXPECT_LE(parts_ns, profiling_ns);
}

TEST(StepTiming, PartsMakeUpTheStepOnTheCpu) { expect_parts_make_up_a_step(Backend::cpu); }
TEST(StepTiming, PartsMakeUpTheStepOnCuda) { expect_parts_make_up_a_step(Backend::cuda); }

// An error inside the captured micro-step: the host-checked CG synchronises, which a capture does
// not allow (the registry refuses graphs with a propagator; made directly here, the step reaches
// the capture). The capture must be ended on the way out, so that the stream works afterwards.
TEST(StepGraphs, AFailedCaptureLeavesTheStreamUsable) {
  if (const std::string why = testing::cannot_run_here(train_variant(Backend::cuda)); !why.empty()) GTEST_SKIP() << why;
  const std::string path = write_workload("capture_fails.yaml",
                                          "name: capture_fails\n"
                                          "model: {layers: 2, d_model: 32, heads: 2, seq_len: 16, vocab: 17}\n"
                                          "propagator: {sparsity: 4}\n"
                                          "batch: {global: 8, micro: 4}\n"
                                          "switches: {cuda_graphs: true}\n");
  ASSERT_FALSE(unsupported_reason(load_workload(path), true).empty()) << "the registry refuses this workload";
  MadeStep made = make_step(Backend::cuda, path);
  for (int64_t s = 0; s < graph_capture_step; ++s) made.step->run();  // eager
  EXPECT_THROW(made.step->run(), std::exception) << "a synchronisation under capture";
  EXPECT_FALSE(made.step->capturing());
  // The same stream: eager profiled steps of this instance, then a fresh instance's steps.
  EXPECT_NO_THROW(made.step->observed());
  const Verdict same = made.step->check();
  EXPECT_TRUE(same.passed) << same.detail;
  const std::string plain = write_workload("capture_after.yaml",
                                           "name: capture_after\n"
                                           "model: {layers: 2, d_model: 32, heads: 2, seq_len: 16, vocab: 17}\n"
                                           "batch: {global: 8, micro: 4}\n"
                                           "switches: {cuda_graphs: true}\n");
  std::unique_ptr<Instance> fresh = train_variant(Backend::cuda).make(one_axis("workload", plain), made.session->context());
  for (int64_t s = 0; s <= graph_capture_step + 1; ++s) fresh->run();
  const Verdict verdict = fresh->check();
  EXPECT_TRUE(verdict.passed) << verdict.detail;
}

// The backend's gradients against the CPU's in double, through AdamW's first moment after one
// unclipped step (m = (1 - beta1) g): layernorm's and the biases' column reductions included, at an
// odd width (48: lanes past the last channel, a partial column block), over several row blocks, and
// at a width whose per-warp slices leave fewer than 8 warps a block (1040).
// Of the tensor's largest gradient: float sums over a few hundred tokens stay far below it; one row
// of 128 lost or counted twice is near 1e-2 of it.
constexpr double fp32_gradient_tolerance = 1e-3;
const std::vector<std::string> fp32_gradient_models = {
    "model: {layers: 2, d_model: 48, heads: 2, seq_len: 32, vocab: 50, mlp_ratio: 4}\nbatch: {global: 8, micro: 4}\n",
    "model: {layers: 1, d_model: 1040, heads: 2, seq_len: 8, vocab: 17, mlp_ratio: 1}\n"
    "batch: {global: 4, micro: 2}\nswitches: {attention: naive}\n"};

void expect_gradients_match_double(Backend backend, const std::vector<std::string>& models = fp32_gradient_models,
                                   double relative_tolerance = fp32_gradient_tolerance) {
  if (const std::string why = testing::cannot_run_here(train_variant(backend)); !why.empty()) GTEST_SKIP() << why;
  for (const std::string& model : models) {
    const std::string path = write_workload("grad_match.yaml", std::string("name: grad_match\n") + model +
                                                                   "optimizer: {grad_clip: 0.0}\n"
                                                                   "data: {samples: 64}\n");
    const Workload w = load_workload(path);
    CpuOps<double> ops;
    Trainer<CpuOps<double>> reference(ops, w);
    reference.step(false);
    const std::vector<double> want = reference.exp_avg_values();
    MadeStep made = make_step(backend, path);
    made.step->run();
    const std::vector<double> got = made.step->exp_avg();
    ASSERT_EQ(got.size(), want.size());
    for (const auto& t : reference.model().tensors()) {
      double scale = 0;
      for (int64_t i = t.offset; i < t.offset + t.size; ++i) scale = std::max(scale, std::abs(want[i]));
      for (int64_t i = t.offset; i < t.offset + t.size; ++i)
        ASSERT_LE(std::abs(got[i] - want[i]), relative_tolerance * scale + 1e-12)
            << "d_model " << w.model.d_model << ", tensor at " << t.offset << ", element " << i - t.offset << ": " << got[i]
            << ", double " << want[i];
    }
  }
}

TEST(StepGradients, CpuFloatMatchesDouble) { expect_gradients_match_double(Backend::cpu); }
TEST(StepGradients, CudaMatchesTheCpuInDouble) { expect_gradients_match_double(Backend::cuda); }
// bf16 matmuls: the tensor-core attention (head sizes 64 and 32, a sequence with a partial tile of
// keys and queries) and bf16 products everywhere else, and the naive attention's bf16 products.
// A few percent of the tensor's largest gradient: bf16's unit roundoff is 0.4%, and the gradients
// go through five bf16 products a layer; a lost tile or a wrong row is of the order of the gradient.
TEST(StepGradients, CudaBf16MatchesTheCpuInDoubleWithinBf16Rounding) {
  expect_gradients_match_double(Backend::cuda,
                                {"model: {layers: 2, d_model: 128, heads: 2, seq_len: 80, vocab: 50, mlp_ratio: 2}\n"
                                 "batch: {global: 4, micro: 2}\nswitches: {bf16_matmuls: true}\n",
                                 "model: {layers: 1, d_model: 64, heads: 2, seq_len: 70, vocab: 50, mlp_ratio: 2}\n"
                                 "batch: {global: 4, micro: 2}\nswitches: {bf16_matmuls: true}\n",
                                 "model: {layers: 1, d_model: 64, heads: 2, seq_len: 33, vocab: 50, mlp_ratio: 2}\n"
                                 "batch: {global: 4, micro: 2}\nswitches: {bf16_matmuls: true, attention: naive}\n"},
                                5e-2);
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

// Heads wider than the fused CUDA backward takes: refused with the switch that runs them, not a
// throw from inside the first step.
TEST(StepRegistry, HeadsTooWideForFusedCudaAttentionNameTheNaiveSwitch) {
  Workload w = load_workload("tiny");
  w.model.heads = 2;
  w.model.d_model = 2 * (attention::cuda_fused_backward_max_head_dim + 8);
  ASSERT_TRUE(w.switches.fused_attention);
  EXPECT_NE(unsupported_reason(w, true).find("switches: {attention: naive}"), std::string::npos);
  EXPECT_EQ(unsupported_reason(w, false).find("attention"), std::string::npos);  // the CPU kernels take any width
  w.switches.fused_attention = false;
  EXPECT_EQ(unsupported_reason(w, true).find("attention"), std::string::npos);
}

}  // namespace
}  // namespace tb
