// benchsuite as a user runs it: bad input exits 2 with one clear message, a run writes a valid file.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cache_threshold.h"
#include "results.h"
#include "runtime/defaults.h"
#include "tool_path.h"

namespace {

// Every benchsuite these tests start finds this machine's cache threshold kept (64 MiB) in a cache
// directory of their own: the rows' "cache" verdicts do not hang on a sweep of a machine that other
// tests load, and the user's own kept figure is left alone.
constexpr double kKeptThresholdBytes = 64.0 * (1 << 20);

class KeptCacheSweep : public ::testing::Environment {
 public:
  void SetUp() override {
    const auto dir = std::filesystem::temp_directory_path() / ("tb_cli_cache_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir / "trainbench");
    nlohmann::json file = {{"schema", "trainbench-cache-sweep/1"}};
    file["machines"][tb::cache_sweep_key()] = {{"threshold_bytes", kKeptThresholdBytes}, {"measured", "2026-11-26"}};
    std::ofstream(dir / "trainbench" / "cache-sweep.json") << file.dump();
    ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

 private:
  std::filesystem::path dir_;
};
const auto* const kept_cache_sweep = ::testing::AddGlobalTestEnvironment(new KeptCacheSweep);

struct Outcome {
  int code = -1;
  std::string output;  // stdout and stderr together
};

Outcome benchsuite_command(const std::string& line) {
  const std::string command = line + " 2>&1";
  Outcome o;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return o;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe)) o.output += buf.data();
  const int status = pclose(pipe);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

Outcome benchsuite(const std::string& args) {
  return benchsuite_command(tb::testing::tool_path("benchsuite", BENCHSUITE_PATH) + " " + args);
}

// The same with environment assignments ("A=1 B=2") before it.
Outcome benchsuite_with(const std::string& env, const std::string& args) {
  return benchsuite_command(env + " " + tb::testing::tool_path("benchsuite", BENCHSUITE_PATH) + " " + args);
}

void expect_usage_error(const std::string& args, const std::string& says) {
  const Outcome o = benchsuite(args);
  EXPECT_EQ(o.code, 2) << args << "\n" << o.output;
  EXPECT_NE(o.output.find(says), std::string::npos) << args << ": expected '" << says << "' in:\n" << o.output;
  EXPECT_EQ(o.output.find("terminate called"), std::string::npos) << o.output;
}

TEST(Cli, BadInputExitsTwoWithAMessage) {
  expect_usage_error("--no-such-flag", "--no-such-flag");
  expect_usage_error("--filter 'nothing-matches-this'", "no benchmark matches --filter 'nothing-matches-this'");
  expect_usage_error("--filter 'nothing-matches-this'", "peak: cpu/copy");
  expect_usage_error("--filter '('", "not a valid regular expression");
  expect_usage_error("--backend tpu", "--backend");
  expect_usage_error("--repetitions 0", "--repetitions");
  expect_usage_error("--repetitions many", "--repetitions");
  expect_usage_error("--format xml", "--format");
  expect_usage_error("--axis peak.nope=1", "axes: n, cpu_gemm_n");
  expect_usage_error("--axis peak.n=-5", "must be at least 1");
  expect_usage_error("--axis peak.n=abc", "is not a number");
  expect_usage_error("--axis n=5", "expected STAGE.AXIS=");
  expect_usage_error("--benchmark_no_such_flag=1", "benchmark_no_such_flag");
}

// --out is checked before anything is measured (before the cache sweep, before the PyTorch script
// starts): a path no file can be written at is one line naming it and exit 2 at once, not an error
// after the run that loses every measurement.
TEST(Cli, AnOutputPathThatCannotBeWrittenIsRefusedBeforeAnythingIsMeasured) {
  const auto folder = std::filesystem::temp_directory_path() / ("tb_out_folder_" + std::to_string(::getpid()));
  std::filesystem::create_directories(folder);
  for (const std::string& path : {std::string("/nonexistent-dir/r.json"), std::string("/proc/r.json"), folder.string()}) {
    for (const std::string& args :
         {"--backend cpu --filter peak --quick --out " + path, "--list --format json --out " + path}) {
      const auto start = std::chrono::steady_clock::now();
      const Outcome o = benchsuite(args);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_EQ(o.code, 2) << args << "\n" << o.output;
      EXPECT_NE(o.output.find("benchsuite: --out " + path + ": "), std::string::npos) << args << "\n" << o.output;
      EXPECT_EQ(o.output.find("[  1/"), std::string::npos) << "measured before saying so:\n" << o.output;
      EXPECT_LT(seconds, 2.0) << args << "\n" << o.output;
    }
  }
  // Before PyTorch is looked for: the path is what is wrong, and said first.
  const Outcome torch = benchsuite_with("TRAINBENCH_PYTHON=/bin/false",
                                        "--backend cpu,torch --quick --filter peak/cpu/triad --out /nonexistent-dir/r.json");
  EXPECT_EQ(torch.code, 2) << torch.output;
  EXPECT_NE(torch.output.find("--out /nonexistent-dir/r.json: "), std::string::npos) << torch.output;
  EXPECT_EQ(torch.output.find("needs PyTorch"), std::string::npos) << torch.output;
  std::filesystem::remove_all(folder);
}

// A number option says what is wrong with the value typed, not CLI11's "Value abc not in range".
TEST(Cli, ANumberOptionSaysWhatIsWrongWithTheValueTyped) {
  for (const char* value : {"abc", "0", "-3", "2.5"})
    expect_usage_error(std::string("--repetitions ") + value,
                       std::string("--repetitions: '") + value + "' is not a whole number of samples (1 to 100000)");
  expect_usage_error("--min-time abc", "--min-time: 'abc' is not a number of seconds");
  expect_usage_error("--device x", "--device: 'x' is not a CUDA device index (0 or more)");
  expect_usage_error("--noise-target 2", "--noise-target: '2' is not a fraction of the median (0 to 1)");
  const Outcome spelled = benchsuite("--list --format json --repetitions 1e1 --filter peak/cpu/copy");
  EXPECT_EQ(spelled.code, 0) << "a whole number written as 1e1 is one:\n" << spelled.output;
}

// The console --list checks --axis as a run does: what a run refuses, it refuses, in the same line.
TEST(Cli, AConsoleListRefusesTheAxesARunRefuses) {
  for (const char* axis : {"peak.nope=3", "nostage.n=3", "peak.n=abc", "peak.n=0"}) {
    const Outcome list = benchsuite(std::string("--list --axis ") + axis);
    const Outcome run = benchsuite(std::string("--backend cpu --quick --filter peak/cpu/copy --axis ") + axis);
    EXPECT_EQ(list.code, 2) << axis << "\n" << list.output;
    EXPECT_EQ(run.code, 2) << axis << "\n" << run.output;
    // (A listing printed instead is long: its start is enough to see.)
    EXPECT_TRUE(list.output == run.output) << axis << ": --list said\n"
                                           << list.output.substr(0, 300) << "\na run said\n"
                                           << run.output;
    EXPECT_EQ(std::count(list.output.begin(), list.output.end(), '\n'), 1) << "one line:\n" << list.output.substr(0, 300);
  }
}

// A value given twice in one --axis (5,5, or 1000 and 1e3) is one problem: its rows run once, with a
// note on stderr of what was dropped.
TEST(Cli, AValueRepeatedInOneAxisRunsOnce) {
  const auto path = std::filesystem::temp_directory_path() / ("tb_axis_once_" + std::to_string(::getpid()) + ".json");
  const Outcome o = benchsuite(
      "--backend cpu --filter '^peak/cpu/copy/' --no-peak-prepass --repetitions 3 "
      "--min-time 0.001 --axis peak.n=1000,1000,1e3,2000 --out " +
      path.string());
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_NE(o.output.find("benchsuite: --axis 'peak.n=1000,1000,1e3,2000': a value given more than once runs once "
                          "(dropped: 1000, 1e3)"),
            std::string::npos)
      << o.output;
  const tb::Results r = tb::results_from_json(nlohmann::json::parse(std::ifstream(path)));
  std::filesystem::remove(path);
  std::vector<std::string> names;
  for (const auto& row : r.rows) names.push_back(row.name);
  EXPECT_EQ(names, std::vector<std::string>({"peak/cpu/copy/n=1000", "peak/cpu/copy/n=2000"})) << o.output;
}

TEST(Cli, HelpAndListSucceed) {
  const Outcome help = benchsuite("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.output.find("Examples:"), std::string::npos);
  EXPECT_NE(help.output.find("--filter"), std::string::npos);
  const Outcome list = benchsuite("--list");
  EXPECT_EQ(list.code, 0);
  for (const char* v : {"cpu/triad", "cpu/gemm_fp32", "cuda/copy", "cuda/h2d_pinned", "cuda/gemm_bf16", "pair: "})
    EXPECT_NE(list.output.find(v), std::string::npos) << v;
}

// The table explains itself: a key under it, with this run's interval level, the noise target and the
// cache threshold it used; the pairs named as the answer to read first; the same key in --help.
TEST(Cli, TheTableHasAKeyWithTheLevelsAndThresholdsOfTheRun) {
  const Outcome quick = benchsuite("--backend cpu --filter 'peak/cpu/(copy|triad)' --quick --axis peak.n=100003");
  ASSERT_EQ(quick.code, 0) << quick.output;
  const std::size_t key = quick.output.find("\nKey:\n");
  ASSERT_NE(key, std::string::npos) << quick.output;
  EXPECT_GT(key, quick.output.find("Pairs:")) << "the key comes under the table and the pairs";
  const std::string text = quick.output.substr(key);
  EXPECT_NE(text.find("Pairs (above): read them first"), std::string::npos) << text;
  EXPECT_NE(text.find("+-CI: half-width of the median's distribution-free confidence interval, in % of the median; "
                      "its level in this run: 75%"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("(noisy): +-CI above the noise target (5%"), std::string::npos) << text;
  EXPECT_NE(text.find("cache: a hot memory-bound row"), std::string::npos) << text;
  EXPECT_NE(text.find("below 64 MiB for CPU rows, where a copy's bandwidth fell to DRAM's"), std::string::npos)
      << "the threshold used, and how it was found:\n"
      << text;
  EXPECT_NE(text.find("above peak: "), std::string::npos) << text;
  EXPECT_NE(text.find("-: no % peak applies"), std::string::npos) << text;
  // Ten samples a row: the level moves with them, and the key says the one used.
  const Outcome ten = benchsuite(
      "--backend cpu --filter 'peak/cpu/copy' --repetitions 10 --min-time 0.001 --axis peak.n=100003");
  ASSERT_EQ(ten.code, 0) << ten.output;
  EXPECT_NE(ten.output.find("its level in this run: 97.9%"), std::string::npos) << ten.output;
  // Not in a machine format: JSON on stdout stays JSON.
  const Outcome json = benchsuite(
      "--backend cpu --filter 'peak/cpu/copy' --quick --axis peak.n=100003 --format json 2>/dev/null");
  EXPECT_EQ(json.output.find("Key:"), std::string::npos);
  const Outcome help = benchsuite("--help");
  EXPECT_NE(help.output.find("Reading the table"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("+-CI: half-width of the median's distribution-free confidence interval"), std::string::npos);
  EXPECT_NE(help.output.find("--max-time"), std::string::npos);
}

// A run says what it will take before it starts, and each progress line its ETA.
TEST(Cli, ARunSaysItsExpectedTimeAndAnEta) {
  const Outcome o = benchsuite("--backend cpu --filter 'peak/cpu/(copy|triad)' --quick --axis peak.n=100003");
  ASSERT_EQ(o.code, 0) << o.output;
  const std::size_t expected = o.output.find(
      "benchsuite: 3 rows to time, 3 samples of at least 0.05 s each: expect at least");
  ASSERT_NE(expected, std::string::npos) << o.output;  // copy, triad and triad on one thread
  EXPECT_LT(expected, o.output.find("[  1/3]")) << "said before the first row";
  EXPECT_NE(o.output.find("elapsed, ETA "), std::string::npos) << "the first row's line gives the time left:\n" << o.output;
  EXPECT_NE(o.output.find("(announced about "), std::string::npos) << "the end says what it took beside it:\n" << o.output;
  // What each row took is kept with the machine's cache: the same run again announces from it.
  const Outcome again = benchsuite("--backend cpu --filter 'peak/cpu/(copy|triad)' --quick --axis peak.n=100003");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("with each row's set-up, check and measuring as this machine took them last"),
            std::string::npos)
      << again.output;
}

// --max-time S (nvbench's --timeout): a row past S stops with the samples it has, and says so.
TEST(Cli, MaxTimeCutsARowShortAndSaysWhich) {
  const auto path = std::filesystem::temp_directory_path() / ("tb_maxtime_" + std::to_string(::getpid()) + ".json");
  // Samples of 0.05 s or more: after the first, 0.001 s is long past, whatever the machine's speed.
  const Outcome o = benchsuite(
      "--backend cpu --filter 'peak/cpu/copy' --repetitions 6 --min-time 0.05 --max-time 0.001 "
      "--axis peak.n=100003 --no-peak-prepass --out " +
      path.string() + " --format console");
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_NE(o.output.find("(cut short: --max-time 0.001 s: "), std::string::npos) << "on its progress line:\n" << o.output;
  EXPECT_NE(o.output.find("Cut short by --max-time"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("peak/cpu/copy/n=100003: --max-time 0.001 s: "), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("at most about"), std::string::npos) << "the expected time has its upper bound:\n" << o.output;
  std::filesystem::remove(path);
  const Outcome j = benchsuite(
      "--backend cpu --filter 'peak/cpu/copy' --repetitions 6 --min-time 0.05 --max-time 0.001 "
      "--axis peak.n=100003 --no-peak-prepass --out " +
      path.string());
  ASSERT_EQ(j.code, 0) << j.output;
  const tb::Results r = tb::results_from_json(nlohmann::json::parse(std::ifstream(path)));
  std::filesystem::remove(path);
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0].disposition, tb::Disposition::passed);
  EXPECT_GE(r.rows[0].samples_ns.size(), 1u);
  EXPECT_LT(r.rows[0].samples_ns.size(), 6u) << "fewer samples than --repetitions";
  EXPECT_NE(r.rows[0].cut_short.find("of 6 samples"), std::string::npos) << r.rows[0].cut_short;
  expect_usage_error("--max-time 0", "--max-time");
}

// The OpenBLAS notice belongs to a run that measures: never on --help, a usage error or --list.
TEST(Cli, TheBlasNoticeIsNotPrintedOnHelpUsageErrorsOrList) {
  const std::string restarted =
      "TRAINBENCH_BLAS_KERNEL_NOTICE='benchsuite: OpenBLAS chose its Prescott kernels' "
      "OPENBLAS_CORETYPE=Haswell";  // as the restart leaves them
  for (const char* args : {"--help", "--no-such-flag", "--list"}) {
    const Outcome o = benchsuite_with(restarted, args);
    EXPECT_EQ(o.output.find("OpenBLAS chose"), std::string::npos) << args << ":\n" << o.output;
    EXPECT_EQ(benchsuite(args).output.find("OpenBLAS chose"), std::string::npos) << args;
  }
  const Outcome run = benchsuite_with(restarted, "--backend cpu --filter 'peak/cpu/copy' --quick --axis peak.n=100003");
  ASSERT_EQ(run.code, 0) << run.output;
  const std::size_t first = run.output.find("OpenBLAS chose its Prescott kernels");
  ASSERT_NE(first, std::string::npos) << "a run that measures says it:\n" << run.output;
  EXPECT_EQ(run.output.find("OpenBLAS chose", first + 1), std::string::npos) << "once";
}

// A pair whose label starts with its stage's name is not named twice ("adamw AdamW: ...").
TEST(Cli, PairsNameTheirStageOnce) {
  EXPECT_EQ(tb::pair_title("adamw", "AdamW: fused vs per-tensor"), "AdamW: fused vs per-tensor");
  EXPECT_EQ(tb::pair_title("allreduce", "allreduce: bucketed vs per-tensor"), "allreduce: bucketed vs per-tensor");
  EXPECT_EQ(tb::pair_title("attention", "fused vs naive"), "attention fused vs naive");
  EXPECT_EQ(tb::pair_title("peak", "triad: OpenMP team vs one thread"), "peak triad: OpenMP team vs one thread");
}

// --list as JSON is what programs read (the torch rows): every stage, and the benchmarks the other
// flags select, each named as a run names it, with its problem's values and the work one call does.
TEST(Cli, ListAsJsonGivesTheSelectedBenchmarksWithTheirProblems) {
  const auto path = std::filesystem::temp_directory_path() / ("tb_list_" + std::to_string(::getpid()) + ".json");
  const Outcome o = benchsuite("--list --backend cpu --quick --filter 'adamw/cpu/fused' --axis adamw.tensors=200,20 --out " +
                               path.string());
  ASSERT_EQ(o.code, 0) << o.output;
  const auto doc = nlohmann::json::parse(std::ifstream(path));
  std::filesystem::remove(path);
  EXPECT_EQ(doc.at("schema"), "trainbench-list/1");
  EXPECT_TRUE(doc.at("quick").get<bool>());
  bool adamw_listed = false;
  for (const auto& stage : doc.at("stages")) {
    if (stage.at("name") != "adamw") continue;
    adamw_listed = true;
    EXPECT_FALSE(stage.at("pairs").empty());
    for (const auto& axis : stage.at("axes"))
      if (axis.at("name") == "params") {
        EXPECT_EQ(axis.at("quick_values"), nlohmann::json::array({"10000000"}));
      }
  }
  EXPECT_TRUE(adamw_listed);
  std::set<std::string> names;
  for (const auto& b : doc.at("benchmarks")) {
    names.insert(b.at("name").get<std::string>());
    EXPECT_EQ(b.at("stage"), "adamw");
    EXPECT_EQ(b.at("backend"), "cpu");
    EXPECT_EQ(b.at("variant"), "fused");
    EXPECT_EQ(b.at("problem").at("params"), "10000000");
    EXPECT_GT(b.at("work").at("bytes").get<double>(), 0);
  }
  EXPECT_EQ(names.count("adamw/cpu/fused/params=10000000,tensors=20,dtype=fp32"), 1u) << doc.at("benchmarks").dump(1);
  EXPECT_EQ(names.count("adamw/cpu/fused/params=10000000,tensors=200,dtype=bf16"), 1u);
  EXPECT_EQ(names.size(), 4u) << "2 tensor counts x 2 dtypes, and no peak rows";
  expect_usage_error("--list --format csv", "--list is written as text on stdout, or as JSON");
}

TEST(Cli, QuickRunWritesAValidResultsFile) {
  const auto path = std::filesystem::temp_directory_path() / ("tb_cli_" + std::to_string(::getpid()) + ".json");
  const Outcome o = benchsuite(
      "--backend cpu --filter 'peak/cpu/(copy|triad)' --quick --repetitions 3 "
      "--axis peak.n=100003 --out " +
      path.string());
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_NE(o.output.find("Pairs:"), std::string::npos) << o.output;
  std::ifstream in(path);
  const tb::Results r = tb::results_from_json(nlohmann::json::parse(in));
  ASSERT_EQ(r.rows.size(), 3u);
  for (const auto& row : r.rows) {
    EXPECT_EQ(row.disposition, tb::Disposition::passed) << row.name;
    EXPECT_EQ(row.samples_ns.size(), 3u) << row.name;
  }
  // 100003 doubles (1.6 and 2.4 MB) are below the machine's kept threshold: the cache's bandwidth is
  // no DRAM ceiling, so the row says so and no peak is kept; the threshold is printed beside the peaks.
  EXPECT_NE(o.output.find("below 64 MiB for CPU rows, where a copy's bandwidth fell to DRAM's in this machine's size "
                          "sweep (2026-11-26, kept in "),
            std::string::npos)
      << o.output;
  EXPECT_EQ(r.peaks.count("cpu.triad"), 0u);
  for (const auto& row : r.rows) EXPECT_EQ(row.pct_note, "cache") << row.name;
  // The pair has its ratio, or says why not (a row disturbed by other processes on a busy machine).
  EXPECT_EQ(r.pairs.size() + r.withheld_pairs.size(), 1u);
  std::filesystem::remove(path);
}

// benchsuite (with `args`, and `env` as NAME=VALUE pairs) sent `signal` once its output says `when`;
// it is expected to stop of itself.
Outcome stop_benchsuite(const std::vector<std::string>& arguments, const std::vector<std::string>& env,
                        const std::string& when, int signal) {
  std::vector<std::string> args{tb::testing::tool_path("benchsuite", BENCHSUITE_PATH)};
  args.insert(args.end(), arguments.begin(), arguments.end());
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    for (const auto& assignment : env) putenv(const_cast<char*>(assignment.c_str()));
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  Outcome o;
  bool sent = false;
  std::array<char, 4096> buf{};
  // Only a guard against a run that never stops (it would run 100000 repetitions), not a time limit:
  // 300 s for the first sample, as long again after the stop request.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fds[0], POLLIN, 0};
    const int ready = left.count() > 0 ? poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      o.output += sent ? "\n[test: still running 300 s after the stop request; killed]"
                       : "\n[test: no sample in 300 s; killed]";
      kill(pid, SIGKILL);
      break;
    }
    const ssize_t n = read(fds[0], buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    o.output.append(buf.data(), static_cast<std::size_t>(n));
    if (!sent && o.output.find(when) != std::string::npos) {
      kill(pid, signal);
      sent = true;
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    }
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

// Asked to stop (`timeout`'s SIGTERM, Ctrl-C's SIGINT) while a row measures, benchsuite ends that row,
// writes what it measured and exits 128 + the signal. The row cannot end by itself first: it has
// 100000 repetitions. The stop is sent once the progress line shows the row's samples coming in.
TEST(Cli, AStopRequestEndsTheRowInHandWritesWhatWasMeasuredAndExits128PlusTheSignal) {
  for (const auto& [signal, name] : {std::pair<int, std::string>{SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"}}) {
    const auto path = std::filesystem::temp_directory_path() / ("tb_cli_stop_" + std::to_string(::getpid()) + ".json");
    const Outcome o = stop_benchsuite({"--backend", "cpu", "--quick", "--filter", "^peak/cpu/copy/", "--no-peak-prepass",
                                       "--repetitions", "100000", "--min-time", "0.01", "--out", path.string()},
                                      {}, "  sample ", signal);  // a sample taken: "NAME  sample 3/100000"
    EXPECT_EQ(o.code, 128 + signal) << o.output;
    EXPECT_NE(o.output.find("benchsuite: interrupted"), std::string::npos) << o.output;
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << "no results file: " << o.output;
    const nlohmann::json doc = nlohmann::json::parse(in);
    EXPECT_EQ(doc["context"].value("interrupted", ""), name);
    const tb::Results r = tb::results_from_json(doc);
    ASSERT_EQ(r.rows.size(), 1u) << o.output;
    const tb::Row& row = r.rows[0];
    EXPECT_EQ(row.disposition, tb::Disposition::passed) << o.output;
    EXPECT_FALSE(row.samples_ns.empty());
    EXPECT_LT(row.samples_ns.size(), 100000u);
    EXPECT_EQ(row.interrupted, name + " after " + std::to_string(row.samples_ns.size()) + " of 100000 samples");
    EXPECT_NE(o.output.find("passed (interrupted)"), std::string::npos) << o.output;
    std::filesystem::remove(path);
  }
}

// A stand-in for scripts/torch-peers in a folder of its own, beside an interpreter that "has torch" (the
// import check passes) and runs the stand-in with python3; env() points benchsuite at both.
struct TorchPeersStandIn {
  std::filesystem::path dir, python, peers;
  TorchPeersStandIn(const std::string& name, const std::string& script)
      : dir(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))),
        python(dir / "python"),
        peers(dir / "torch-peers") {
    std::filesystem::create_directories(dir);
    std::ofstream(python) << "#!/bin/sh\n[ \"$1\" = -c ] && exit 0\nexec python3 \"$@\"\n";
    std::filesystem::permissions(python, std::filesystem::perms::owner_all);
    std::ofstream(peers) << script;
  }
  ~TorchPeersStandIn() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string env() const { return "TRAINBENCH_PYTHON=" + python.string() + " TRAINBENCH_TORCH_PEERS=" + peers.string(); }
};

// A stand-in for scripts/torch-peers --serve that speaks its protocol without torch: it opens every row
// as passed, answers a time request with NS_<variant> nanoseconds a call (1 ms by default), logs every
// request to $REQUESTS, says "stand-in: timing" at its first request for a batch of calls (a sample's),
// SEEN: where its listing and inputs were (and the folder's mode) to that file, and on request: SLOW_TIME seconds of sleep
// per batch, DIE_AFTER time requests before it exits 3, REJECT: exit 2 before it answers.
constexpr const char* kServeStandIn = R"PY(import json, os, sys, time
args = sys.argv[1:]
opt = lambda k: args[args.index(k) + 1]
if os.environ.get("SEEN"):
    with open(os.environ["SEEN"], "w") as seen, open(opt("--listing")) as given:
        json.dump({"listing": opt("--listing"), "mode": os.stat(os.path.dirname(opt("--listing"))).st_mode & 0o777,
                   "inputs_dir": json.load(given)["torch"]["inputs_dir"]}, seen)
if os.environ.get("REJECT"):
    print("torch-peers: error: the stand-in rejects this run", file=sys.stderr)
    sys.exit(2)
assert opt("--device") == "cpu" and "--serve" in args and "--quick" not in args and "--filter" not in args, args
listing = json.load(open(opt("--listing")))
rows = {r["name"]: r for r in listing["torch"]["rows"]}
log = open(os.environ["REQUESTS"], "a") if os.environ.get("REQUESTS") else None
print(json.dumps({"protocol": "trainbench-torch-serve/1", "torch": {"version": "stand-in"}}), flush=True)
timed = 0
for line in sys.stdin:
    request = json.loads(line)
    if log:
        log.write(line)
        log.flush()
    op, name = request["op"], request["row"]
    if op == "open":
        answer = {"disposition": "passed", "reason": "", "max_error": 0.0}
    elif op == "time":
        timed += 1
        if timed == int(os.environ.get("DIE_AFTER", "0")):
            sys.exit(3)
        if request["calls"] > 1 and not os.environ.get("SAID"):   # a sample's batch, past the warm-up's single calls
            os.environ["SAID"] = "1"
            print("stand-in: timing", file=sys.stderr, flush=True)
        if request["calls"] > 1:
            time.sleep(float(os.environ.get("SLOW_TIME", "0")))
        ns = float(os.environ.get("NS_" + rows[name]["variant"], "1e6"))
        answer = {"seconds": request["calls"] * ns * 1e-9}
    elif op == "counters":
        answer = {"counters": {"checked": 1}, "per_unit": {"us_per_step": 4}}
    else:
        answer = {}
    print(json.dumps(answer), flush=True)
)PY";

// The selection a run with its PyTorch rows makes, small: adamw fused and per-tensor at 1000 parameters.
const std::string kTorchSelection =
    "--backend cpu,torch --quick --filter 'adamw/cpu/(fused|per_tensor)/' "
    "--axis adamw.params=1000 --axis adamw.dtype=fp32 --no-peak-prepass "
    "--repetitions 3 --min-time 0.001";

// A stop request while a PyTorch row measures ends the run within the sample in hand: every row keeps
// what it took, the results are written, benchsuite exits 128 + the signal, and the script (in a
// process group of its own, so the signal is benchsuite's alone) ends with the conversation.
TEST(Cli, AStopDuringAPyTorchRowEndsTheRunWithinASampleAndKeepsItsRows) {
  const TorchPeersStandIn stand_in("tb_torch_stop", kServeStandIn);
  const std::filesystem::path out = stand_in.dir / "stopped.json";
  const Outcome o = stop_benchsuite({"--backend", "cpu,torch", "--quick", "--filter", "adamw/cpu/fused/", "--axis",
                                     "adamw.params=1000", "--axis", "adamw.dtype=fp32", "--no-peak-prepass", "--repetitions",
                                     "100000", "--min-time", "0.001", "--out", out.string()},
                                    {"TRAINBENCH_PYTHON=" + stand_in.python.string(),
                                     "TRAINBENCH_TORCH_PEERS=" + stand_in.peers.string(), "SLOW_TIME=0.05", "NS_fused=1e4"},
                                    "stand-in: timing", SIGTERM);
  EXPECT_EQ(o.code, 143) << o.output;
  EXPECT_EQ(o.output.find("[test: "), std::string::npos) << o.output;  // it ended, the script with it
  std::ifstream in(out);
  ASSERT_TRUE(in.good()) << "no results file: " << o.output;
  const tb::Results r = tb::results_from_json(nlohmann::json::parse(in));
  std::map<std::string, const tb::Row*> rows;
  for (const auto& row : r.rows) rows[row.name] = &row;
  const tb::Row* theirs = rows["adamw/torch/fused/params=1000,tensors=200,dtype=fp32"];
  ASSERT_TRUE(theirs) << o.output;
  EXPECT_EQ(theirs->disposition, tb::Disposition::passed) << theirs->reason;
  EXPECT_FALSE(theirs->samples_ns.empty());
  EXPECT_EQ(theirs->interrupted.rfind("SIGTERM after ", 0), 0u) << theirs->interrupted;
}

// A script that ends in the middle of a run: its rows from then on fail, saying so; the rows measured
// are kept and written, and benchsuite exits 1. One that rejects the run before it answers costs no
// measurement: one message, exit 2.
TEST(Cli, APyTorchScriptThatEndsOrRejectsTheRunIsSaidOnce) {
  const TorchPeersStandIn stand_in("tb_torch_dies", kServeStandIn);
  const std::filesystem::path out = stand_in.dir / "died.json";
  const Outcome died = benchsuite_with("DIE_AFTER=3 " + stand_in.env(), kTorchSelection + " --out " + out.string());
  EXPECT_EQ(died.code, 1) << died.output;
  const tb::Results r = tb::results_from_json(nlohmann::json::parse(std::ifstream(out)));
  int native_passed = 0, torch_failed = 0;
  for (const auto& row : r.rows) {
    if (row.backend == "cpu" && row.disposition == tb::Disposition::passed) ++native_passed;
    if (row.backend == "torch" && row.disposition == tb::Disposition::failed) {
      ++torch_failed;
      EXPECT_NE(row.reason.find("scripts/torch-peers ended (exit 3"), std::string::npos) << row.reason;
    }
  }
  EXPECT_EQ(native_passed, 2) << died.output;
  EXPECT_EQ(torch_failed, 2) << died.output;

  const Outcome rejected = benchsuite_with("REJECT=1 " + stand_in.env(), kTorchSelection);
  EXPECT_EQ(rejected.code, 2) << rejected.output;
  EXPECT_NE(rejected.output.find("the stand-in rejects this run"), std::string::npos) << rejected.output;
  EXPECT_NE(rejected.output.find("benchsuite: scripts/torch-peers rejected the run (its message is above)"),
            std::string::npos)
      << rejected.output;
  EXPECT_EQ(rejected.output.find("[  1/"), std::string::npos) << "measured before saying so:\n" << rejected.output;
}

// The PyTorch rows' listing and inputs are in one folder of the run's own under $TMPDIR (mode 0700, a
// name nobody could have planted a symlink at), and nothing named trainbench-torch-* is left there
// after a run that ends, one the script rejects, or one a stop request ends.
TEST(Cli, ThePyTorchRowsFilesAreInAPrivateFolderThatGoesWithTheRun) {
  const TorchPeersStandIn stand_in("tb_torch_files", kServeStandIn);
  const std::filesystem::path tmpdir = stand_in.dir / "tmp", seen = stand_in.dir / "seen.json";
  std::filesystem::create_directories(tmpdir);
  const auto left_behind = [&] {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(tmpdir)) names.push_back(entry.path().filename());
    return names;
  };
  const std::string env = "TMPDIR=" + tmpdir.string() + " SEEN=" + seen.string() + " " + stand_in.env();
  const Outcome ran = benchsuite_with(env, kTorchSelection);
  ASSERT_EQ(ran.code, 0) << ran.output;
  const auto where = nlohmann::json::parse(std::ifstream(seen));
  const std::filesystem::path listing = where.at("listing").get<std::string>();
  EXPECT_EQ(listing.parent_path().parent_path(), tmpdir) << listing;
  EXPECT_EQ(listing.parent_path().filename().string().rfind("trainbench-torch-", 0), 0u) << listing;
  EXPECT_EQ(where.at("mode").get<int>(), 0700) << listing;
  EXPECT_EQ(std::filesystem::path(where.at("inputs_dir").get<std::string>()), listing.parent_path() / "inputs");
  EXPECT_EQ(left_behind(), std::vector<std::string>()) << "after a run";

  const Outcome rejected = benchsuite_with("REJECT=1 " + env, kTorchSelection);
  EXPECT_EQ(rejected.code, 2) << rejected.output;
  EXPECT_EQ(left_behind(), std::vector<std::string>()) << "after a run the script rejected";

  const Outcome stopped = stop_benchsuite({"--backend", "cpu,torch", "--quick", "--filter", "adamw/cpu/fused/", "--axis",
                                           "adamw.params=1000", "--axis", "adamw.dtype=fp32", "--no-peak-prepass",
                                           "--repetitions", "100000", "--min-time", "0.001"},
                                          {"TMPDIR=" + tmpdir.string(), "TRAINBENCH_PYTHON=" + stand_in.python.string(),
                                           "TRAINBENCH_TORCH_PEERS=" + stand_in.peers.string(), "SLOW_TIME=0.05",
                                           "NS_fused=1e4"},
                                          "stand-in: timing", SIGTERM);
  EXPECT_EQ(stopped.code, 143) << stopped.output;
  EXPECT_EQ(left_behind(), std::vector<std::string>()) << "after a stop request";
}

// --torch-inputs reads a listing with PyTorch rows on stdin; anything else is one message and exit 2.
TEST(Cli, TorchInputsWithoutAListingOfPyTorchRowsIsAUsageError) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("tb_inputs_" + std::to_string(::getpid()))).string();
  expect_usage_error("--torch-inputs " + dir + " < /dev/null", "--torch-inputs: stdin is not a JSON listing");
  const Outcome o = benchsuite_command("echo '{\"benchmarks\": []}' | " +
                                       tb::testing::tool_path("benchsuite", BENCHSUITE_PATH) + " --torch-inputs " + dir +
                                       " 2>&1");
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("the listing has no PyTorch rows"), std::string::npos) << o.output;
  std::filesystem::remove_all(dir);
}

// Other processes holding the cores while a CPU row is measured: its samples are taken again and,
// when the load does not go away, the row says "disturbed" and its pair gives no ratio.
TEST(Cli, ARunUnderACompetingLoadIsReportedDisturbedNotAsARatio) {
  std::vector<pid_t> spinners;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  for (long c = 0; c < std::max(2L, cores); ++c) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(120);  // never outlives a test that died
      for (volatile uint64_t x = 0;; x = x + 1) {
      }
    }
    spinners.push_back(pid);
  }
  const auto path = std::filesystem::temp_directory_path() / ("tb_cli_load_" + std::to_string(::getpid()) + ".json");
  const Outcome o = benchsuite(
      "--backend cpu --filter 'peak/cpu/triad' --repetitions 3 --min-time 0.1 "
      "--axis peak.n=4000000 --out " +
      path.string());
  for (const pid_t pid : spinners) kill(pid, SIGKILL);
  for (const pid_t pid : spinners) waitpid(pid, nullptr, 0);
  ASSERT_EQ(o.code, 0) << o.output;
  std::ifstream in(path);
  const tb::Results r = tb::results_from_json(nlohmann::json::parse(in));
  bool any_disturbed = false;
  for (const auto& row : r.rows) {
    EXPECT_GT(row.others_share, tb::defaults::disturbed_share) << row.name;
    EXPECT_GT(row.retaken, 0) << row.name;
    any_disturbed = any_disturbed || row.disturbed;
  }
  EXPECT_TRUE(any_disturbed) << o.output;
  EXPECT_TRUE(r.pairs.empty()) << o.output;
  ASSERT_EQ(r.withheld_pairs.size(), 1u) << o.output;
  EXPECT_NE(o.output.find("passed (disturbed)"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("no ratio: "), std::string::npos) << o.output;
  std::filesystem::remove(path);
}

TEST(Cli, CudaBackendWithoutADeviceSaysWhyInsteadOfFailing) {
  const Outcome list = benchsuite("--list");
  if (list.output.find("unavailable here") == std::string::npos) GTEST_SKIP() << "a CUDA device is present";
  const Outcome o = benchsuite("--backend cuda --filter 'peak/cuda/copy' --quick");
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_NE(o.output.find("unsupported"), std::string::npos) << o.output;
  expect_usage_error("--device 3", "--device 3");
}

// --backend cpu,torch without PyTorch: one message that says how to get it, before anything is
// measured (no progress line).
TEST(Cli, TorchBackendWithoutPyTorchSaysHowToGetItAndMeasuresNothing) {
  const Outcome without = benchsuite_with("TRAINBENCH_PYTHON=/bin/false",
                                          "--backend cpu,torch --quick --filter peak/cpu/triad");
  EXPECT_EQ(without.code, 2) << without.output;
  EXPECT_NE(without.output.find("--backend torch needs PyTorch and numpy in /bin/false: install them with "
                                "scripts/install-deps --torch"),
            std::string::npos)
      << without.output;
  EXPECT_EQ(without.output.find("[  1/"), std::string::npos) << "measured before saying so:\n" << without.output;
}

// The torch rows from a stand-in for scripts/torch-peers (TRAINBENCH_TORCH_PEERS): it must be started on
// exactly the rows this run selected (--axis, --filter and --quick applied), and each PyTorch row is
// measured in the rounds of the row it mirrors and of its PyTorch pair's other side, timed by the
// script's clock. benchsuite makes the rows (summaries, the mirrored rows' work, the case's counters and
// units), the PyTorch pair and the cross pairs (PyTorch -> trainbench) from the rounds.
TEST(Cli, ATorchPeersStandInServesExactlyTheSelectionInTheRoundsOfTheRowsItMirrors) {
  const TorchPeersStandIn stand_in("tb_torch", kServeStandIn);
  const std::filesystem::path out = stand_in.dir / "merged.json", requests = stand_in.dir / "requests";
  const Outcome o = benchsuite_with("NS_per_tensor=3e6 NS_fused=1e6 REQUESTS=" + requests.string() + " " + stand_in.env(),
                                    kTorchSelection + " --out " + out.string());
  ASSERT_EQ(o.code, 0) << o.output;
  std::ifstream in(out);
  const auto doc = nlohmann::json::parse(in);
  const tb::Results r = tb::results_from_json(doc);
  EXPECT_EQ(doc.at("context").at("torch").at("version"), "stand-in");
  const std::string label = "/params=1000,tensors=200,dtype=fp32";
  std::map<std::string, const tb::Row*> rows;
  for (const auto& row : r.rows) rows[row.name] = &row;
  ASSERT_EQ(rows.size(), 4u) << o.output;
  const tb::Row* fused = rows["adamw/torch/fused" + label];
  const tb::Row* ours = rows["adamw/cpu/fused" + label];
  ASSERT_TRUE(fused && ours && rows["adamw/torch/per_tensor" + label]) << o.output;
  EXPECT_EQ(fused->backend, "torch");
  EXPECT_EQ(fused->disposition, tb::Disposition::passed);
  EXPECT_DOUBLE_EQ(fused->summary.median, 1e6);  // the stand-in's clock: 1 ms a call
  EXPECT_EQ(fused->bytes, ours->bytes);          // the mirrored row's work
  EXPECT_GT(fused->bytes, 0);
  EXPECT_EQ(fused->peak_key, ours->peak_key);
  bool checked = false, per_step = false;
  for (const auto& [key, value] : fused->counters) {
    checked = checked || (key == "checked" && value == 1);
    per_step = per_step || (key == "us_per_step" && std::abs(value - 250) < 1e-9);  // 1 ms a call, 4 steps a call
  }
  EXPECT_TRUE(checked && per_step) << o.output;
  // One group: both native rows, both PyTorch rows, in shared rounds.
  EXPECT_EQ(std::set<std::string>(fused->interleaved_with.begin(), fused->interleaved_with.end()),
            std::set<std::string>(
                {"adamw/cpu/fused" + label, "adamw/cpu/per_tensor" + label, "adamw/torch/per_tensor" + label}));
  const tb::PairRow* torch_pair = nullptr;
  for (const auto& p : r.pairs)
    if (p.label == "torch AdamW: fused vs per-tensor") torch_pair = &p;
  ASSERT_TRUE(torch_pair) << o.output;
  EXPECT_EQ(torch_pair->baseline, "adamw/torch/per_tensor" + label);
  EXPECT_NEAR(torch_pair->ratio.ratio, 3.0, 1e-9);
  EXPECT_EQ(torch_pair->rounds, 3);
  // A cross pair per variant from the rounds: a ratio, or, where other processes disturbed the native
  // row, withheld as every pair with a disturbed row is.
  for (const std::string variant : {"fused", "per_tensor"}) {
    const std::string name = "PyTorch " + variant + " -> trainbench cpu/" + variant;
    bool found = false;
    for (const auto& p : r.pairs)
      found = found || (p.label == name && p.improved == "adamw/cpu/" + variant + label && p.rounds == 3);
    for (const auto& p : r.withheld_pairs)
      found = found || (p.label == name && p.why.find("was disturbed") != std::string::npos);
    EXPECT_TRUE(found) << name << "\n" << o.output;
  }
  EXPECT_NE(o.output.find("PyTorch fused -> trainbench cpu/fused"), std::string::npos) << o.output;
  // The conversation: each row opened, timed, read and closed, by name.
  std::map<std::string, std::set<std::string>> ops;
  std::ifstream said(requests);
  for (std::string line; std::getline(said, line);) {
    const auto request = nlohmann::json::parse(line);
    ops[request.at("row").get<std::string>()].insert(request.at("op").get<std::string>());
  }
  const std::set<std::string> all{"open", "time", "counters", "close"};
  EXPECT_EQ(ops.size(), 2u);
  for (const auto& [row, seen] : ops) EXPECT_EQ(seen, all) << row;
}

}  // namespace
