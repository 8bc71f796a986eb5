// autotune's own parts: trials in child processes (a crash, a hang and an out-of-memory kill each
// cost one trial), their classification, the journal, the switches, the trial's warm-up, the
// emitters, and the CLI as a user runs it: bad input exits 2; a real CPU tune writes a config;
// --resume repeats no trial.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "runtime/error.h"
#include "step/step.h"
#include "step/workload.h"
#include "tuner/emit.h"
#include "tuner/journal.h"
#include "tuner/trial.h"
#include "tool_path.h"

namespace tb::tune {
namespace {

TEST(Child, CapturesOutputAndExit) {
  const ChildOutcome o = run_child({"/bin/sh", "-c", "echo first; echo '{\"class\":\"ok\",\"samples_per_s\":12.5}'"}, 10, nullptr);
  EXPECT_EQ(o.exit_code, 0);
  const TrialResult r = classify(o);
  EXPECT_EQ(r.cls, TrialClass::ok);
  EXPECT_DOUBLE_EQ(r.samples_per_s, 12.5);
}

TEST(Child, AHangIsKilledByTheWatchdog) {
  const auto t0 = std::chrono::steady_clock::now();
  const ChildOutcome o = run_child({"/bin/sh", "-c", "sleep 30"}, 0.5, nullptr);
  EXPECT_TRUE(o.timed_out);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_EQ(classify(o).cls, TrialClass::timeout);
}

TEST(Child, ACrashIsAnErrorThatNamesTheSignal) {
  const TrialResult r = classify(run_child({"/bin/sh", "-c", "echo dying >&2; kill -SEGV $$"}, 10, nullptr));
  EXPECT_EQ(r.cls, TrialClass::error);
  EXPECT_NE(r.message.find("signal 11"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("dying"), std::string::npos) << r.message;
}

TEST(Child, AKilledChildIsCountedAsOutOfMemory) {
  const TrialResult r = classify(run_child({"/bin/sh", "-c", "kill -KILL $$"}, 10, nullptr));
  EXPECT_EQ(r.cls, TrialClass::oom);
  EXPECT_NE(r.message.find("out-of-memory killer"), std::string::npos);
}

TEST(Child, ExitWithoutAResultIsAnError) {
  const TrialResult r = classify(run_child({"/bin/sh", "-c", "echo bad news >&2; exit 3"}, 10, nullptr));
  EXPECT_EQ(r.cls, TrialClass::error);
  EXPECT_EQ(r.message, "exited with code 3 and no result: bad news");
}

TEST(Child, StopsWhenInterrupted) {
  std::atomic<bool> stop{true};
  const ChildOutcome o = run_child({"/bin/sh", "-c", "sleep 30"}, 60, &stop);
  EXPECT_TRUE(o.interrupted);
  EXPECT_EQ(classify(o).message, "interrupted");
}

TEST(Journal, AppendsAndLoadsItsOwnContextOnly) {
  const auto path = (std::filesystem::temp_directory_path() / ("tb_journal_" + std::to_string(getpid()))).string();
  std::filesystem::remove(path);
  Candidate c{64, 8, {{"optimizer", "fused"}}};
  TrialResult r;
  r.samples_per_s = 100;
  r.peak_bytes = 1234;
  Journal(path, "ctx").append(c, r);
  Journal(path, "other").append(Candidate{64, 16, {}}, r);
  std::ofstream(path, std::ios::app) << "{\"context\": \"ctx\", \"key\": \"cut sh";  // a crash mid-write
  int skipped = 0;
  const auto known = Journal(path, "ctx").load(&skipped);
  ASSERT_EQ(known.size(), 1u);
  EXPECT_EQ(known.begin()->first, c.key());
  ASSERT_EQ(known.begin()->second.size(), 1u);
  EXPECT_EQ(known.begin()->second.front().peak_bytes, 1234);
  EXPECT_EQ(skipped, 2);
  std::filesystem::remove(path);
  EXPECT_NE(digest("a"), digest("b"));
  EXPECT_EQ(digest("same"), digest("same"));
}

TEST(Switches, OnlyThoseTheWorkloadAndBackendHaveWithItsOwnFirst) {
  const step::Workload sem = step::load_workload("sem_v55");  // propagator, checkpointing, per_tensor
  const auto cpu = available_switches(sem, false);
  EXPECT_EQ(cpu.at("optimizer").front(), "per_tensor");
  EXPECT_EQ(cpu.at("activation_checkpointing").front(), "on");
  EXPECT_EQ(cpu.at("sync").front(), "every_n:5");
  EXPECT_TRUE(cpu.count("lazy_cg"));
  EXPECT_FALSE(cpu.count("bf16_matmuls"));
  const auto gpu = available_switches(sem, true);
  EXPECT_TRUE(gpu.count("bf16_matmuls"));
  EXPECT_FALSE(gpu.count("cuda_graphs")) << "graphs need a step without the host-checked CG";
  const auto t4 = available_switches(step::load_workload("t4_transformer"), true);
  EXPECT_TRUE(t4.count("cuda_graphs"));
  EXPECT_FALSE(t4.count("lazy_cg"));

  const Candidate c{4096, 256, {{"optimizer", "fused"}, {"sync", "async"}, {"activation_checkpointing", "off"}}};
  const step::Workload w = apply(sem, c);
  EXPECT_EQ(w.batch.micro, 256);
  EXPECT_EQ(w.batch.accumulation(), 16);
  EXPECT_EQ(w.optimizer.variant, "fused");
  EXPECT_EQ(w.logging.sync, "async");
  EXPECT_FALSE(w.switches.activation_checkpointing);
  EXPECT_THROW(apply(sem, Candidate{8, 8, {{"warp_drive", "on"}}}), UsageError);
}

TEST(Trial, WarmUpRunsPastTheGraphCapture) {
  step::Workload w = step::load_workload("t4_transformer");
  w.switches.cuda_graphs = false;
  EXPECT_EQ(warmup_steps(w), 1) << "one untimed step after the check, as benchsuite warms up";
  w.switches.cuda_graphs = true;
  // Step 0 is the checked one and steps 1..warmup_steps are untimed: the capturing step is among
  // them, and the last one, whose time sizes the samples, is replays only.
  EXPECT_GT(warmup_steps(w), step::graph_capture_step);
}

TuneOutput sample_output() {
  TuneOutput o;
  o.device = {{"backend", "cuda"}, {"name", "Test GPU"}};
  o.workload_name = "t";
  o.strategy = "auto";
  o.grad_clip = 1.0;
  o.report.found = true;
  o.report.best.candidate = Candidate{256, 64, {{"bf16_matmuls", "on"}, {"optimizer", "fused"}}};
  o.report.best.result.samples_per_s = 5000;
  o.report.best.result.peak_bytes = 1 << 30;
  o.report.trials = {o.report.best, Ranked{Candidate{256, 256, {}}, TrialResult{TrialClass::oom, 0, 0, 0, 0, 0, 1, "out of memory"}}};
  o.report.trials_run = 2;
  o.baseline = Ranked{Candidate{256, 32, {}}, TrialResult{}};
  o.baseline->result.samples_per_s = 2000;
  return o;
}

TEST(Emit, EveryFormatCarriesTheChoice) {
  const TuneOutput o = sample_output();
  const YAML::Node y = YAML::Load(emit(o, OutFormat::yaml))["trainbench_autotune"];
  EXPECT_EQ(y["chosen"]["micro_batch"].as<int>(), 64);
  EXPECT_EQ(y["chosen"]["accumulation"].as<int>(), 4);
  EXPECT_DOUBLE_EQ(y["speedup_over_workload_config"].as<double>(), 2.5);
  EXPECT_EQ(y["failed_trials"][0]["class"].as<std::string>(), "oom");
  EXPECT_EQ(y["device"]["name"].as<std::string>(), "Test GPU");
  const auto ds = nlohmann::json::parse(emit(o, OutFormat::deepspeed));
  EXPECT_EQ(ds["train_batch_size"], 256);
  EXPECT_EQ(ds["train_micro_batch_size_per_gpu"], 64);
  EXPECT_EQ(ds["gradient_accumulation_steps"], 4);
  EXPECT_EQ(ds["bf16"]["enabled"], true);
  const YAML::Node pl = YAML::Load(emit(o, OutFormat::lightning));
  EXPECT_EQ(pl["trainer"]["accumulate_grad_batches"].as<int>(), 4);
  EXPECT_EQ(pl["data"]["batch_size"].as<int>(), 64);
  EXPECT_EQ(pl["trainer"]["precision"].as<std::string>(), "bf16-mixed");
  EXPECT_EQ(nlohmann::json::parse(emit(o, OutFormat::json))["trainbench_autotune"]["chosen"]["micro_batch"], 64);
  TuneOutput none = o;
  none.report.found = false;
  EXPECT_THROW(emit(none, OutFormat::deepspeed), UsageError);
  EXPECT_NE(emit(none, OutFormat::yaml).find("no configuration ran successfully"), std::string::npos);
}

struct Outcome {
  int code = -1;
  std::string out, err;
};

Outcome autotune(const std::string& args) {
  const auto err_path = std::filesystem::temp_directory_path() / ("tb_autotune_err_" + std::to_string(getpid()));
  const std::string command = tb::testing::tool_path("autotune", AUTOTUNE_PATH) + " " + args + " 2>" + err_path.string();
  Outcome o;
  FILE* pipe = popen(command.c_str(), "r");
  std::array<char, 4096> buf{};
  while (pipe && std::fgets(buf.data(), buf.size(), pipe)) o.out += buf.data();
  const int status = pipe ? pclose(pipe) : -1;
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  o.err.assign(std::istreambuf_iterator<char>(err), {});
  return o;
}

TEST(AutotuneCli, BadInputExitsTwoAndRunsNothing) {
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--no-such-flag", "--no-such-flag"},
           {"--workload no_such_preset", "presets:"},
           {"--workload tiny --gpu 7", "--device 7"},
           {"--workload tiny --gpu fast", "--gpu 'fast'"},
           {"--workload tiny --batch-range 9:3", "--batch-range '9:3'"},
           {"--workload tiny --batch 8 --batch-range 8:16", "excludes"},
           {"--workload tiny --switches warp_drive", "available:"},
           {"--workload tiny --format xml", "--format"},
           {"--workload tiny --budget -1", "--budget"}}) {
    const Outcome o = autotune(args);
    EXPECT_EQ(o.code, 2) << args << "\n" << o.err;
    EXPECT_NE(o.err.find(says), std::string::npos) << args << ": expected '" << says << "' in:\n" << o.err;
    EXPECT_TRUE(o.out.empty()) << args;
  }
  const auto bad = std::filesystem::temp_directory_path() / "tb_bad_workload.yaml";
  std::ofstream(bad) << "name: bad\nmodel: {layers: 2, d_model: 16, heads: 3, seq_len: 8, vocab: 11}\nbatch: {global: 8}\n";
  const Outcome o = autotune("--workload " + bad.string());
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("tb_bad_workload.yaml:2:40: heads (3) must divide d_model (16)"), std::string::npos) << o.err;
}

TEST(AutotuneCli, TunesTinyOnTheCpuAndResumesWithoutRepeatingATrial) {
  const auto dir = std::filesystem::temp_directory_path() / ("tb_tune_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string journal = (dir / "j.jsonl").string(), out = (dir / "tuned.yaml").string();
  const std::string args = "--workload tiny --gpu cpu --switches optimizer --budget 60 --trial-seconds 0.5 --journal " + journal;
  const Outcome first = autotune(args + " --out " + out);
  ASSERT_EQ(first.code, 0) << first.err;
  const YAML::Node y = YAML::LoadFile(out)["trainbench_autotune"];
  const int64_t micro = y["chosen"]["micro_batch"].as<int64_t>();
  EXPECT_EQ(16 % micro, 0);
  EXPECT_GT(y["measured"]["samples_per_s"].as<double>(), 0);
  EXPECT_GT(y["speedup_over_workload_config"].as<double>(), 0.0);  // its value is a timing: not asserted
  EXPECT_EQ(y["device"]["backend"].as<std::string>(), "cpu");
  auto lines = [&] {
    std::ifstream in(journal);
    return std::count(std::istreambuf_iterator<char>(in), {}, '\n');
  };
  const auto journaled = lines();
  EXPECT_GE(journaled, 2);
  const Outcome again = autotune(args + " --resume");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(lines(), journaled) << "a resumed tune ran trials again:\n" << again.err;
  EXPECT_NE(again.err.find("resuming with"), std::string::npos);
  EXPECT_NE(again.out.find("micro_batch: " + std::to_string(micro)), std::string::npos) << again.out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tb::tune
