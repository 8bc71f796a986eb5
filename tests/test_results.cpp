#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "harness.h"
#include "results.h"
#include "torch_rows.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/registry.h"

namespace tb {
namespace {

Results sample_results() {
  Results r;
  r.context = {{"host", {{"cpu_model", "Test CPU"}, {"cores", 2}}}, {"trainbench", {{"version", "0.1.0"}}}};
  Row a;
  a.name = "peak/cpu/triad/n=7";
  a.stage = "peak";
  a.variant = "triad";
  a.backend = "cpu";
  a.problem = {{"n", "7"}};
  a.disposition = Disposition::passed;
  a.batch = 4;
  a.iterations = 12;
  a.samples_ns = {100, 110, 90, 105, 95, 101};
  a.summary = summarize(a.samples_ns, 0.05);
  a.bytes = 168;
  a.flops = 14;
  a.peak_key = "cpu.triad";
  a.pct_of_peak = 42.5;
  a.counters = {{"launches", 3}, {"tensors", 200}};
  Row b;
  b.name = "peak/cuda/copy/n=7";
  b.stage = "peak";
  b.variant = "copy";
  b.backend = "cuda";
  b.problem = {{"n", "7"}};
  b.disposition = Disposition::unsupported;
  b.reason = "no CUDA device, \"really\" | none";
  Row c = a;
  c.name = "peak/cpu/copy/n=7";
  c.variant = "copy";
  c.disposition = Disposition::incorrect;
  c.reason = "copy[3] = 1, reference 2";
  c.samples_ns.clear();
  c.pct_of_peak.reset();
  c.max_error = 1;
  r.rows = {a, b, c};
  r.pairs = {PairRow{"peak", "triad: OpenMP team vs one thread", "peak/cpu/triad_1thread/n=7", "peak/cpu/triad/n=7",
                     RatioEstimate{1.9, 1.8, 2.0, 0.95}}};
  r.peaks["cpu.triad"] = PeakValue{3.2e10, "B/s", "peak/cpu/triad/n=7"};
  r.peaks["cuda.copy"] = PeakValue{2.9e12, "B/s", "peak/cuda/copy/n=7", "cudaMemcpyAsync"};
  r.rows[0].configuration = "triad kernel x4 grid 16";
  return r;
}

TEST(Results, JsonRoundTripKeepsEverything) {
  const Results original = sample_results();
  const nlohmann::json doc = to_json(original);
  EXPECT_EQ(doc["schema"], "trainbench-results/1");
  EXPECT_EQ(doc["benchmarks"][0]["real_time"], original.rows[0].summary.median);
  EXPECT_EQ(doc["benchmarks"][0]["time_unit"], "ns");
  EXPECT_FALSE(doc["benchmarks"][2].contains("real_time")) << "an incorrect row carries no timing";
  const Results back = results_from_json(nlohmann::json::parse(doc.dump()));
  EXPECT_EQ(to_json(back), doc);
  ASSERT_EQ(back.rows.size(), 3u);
  EXPECT_EQ(back.rows[0].samples_ns, original.rows[0].samples_ns);
  EXPECT_EQ(back.rows[0].counters, original.rows[0].counters);
  EXPECT_EQ(back.rows[1].reason, original.rows[1].reason);
  EXPECT_DOUBLE_EQ(back.pairs[0].ratio.ci_high, 2.0);
  EXPECT_DOUBLE_EQ(back.peaks.at("cpu.triad").value, 3.2e10);
  // What a searching peak row ran, on the row and on the peak it set; absent where there was no search.
  EXPECT_EQ(back.rows[0].configuration, "triad kernel x4 grid 16");
  EXPECT_FALSE(doc["benchmarks"][1].contains("configuration"));
  EXPECT_EQ(back.peaks.at("cuda.copy").configuration, "cudaMemcpyAsync");
  EXPECT_FALSE(doc["context"]["peaks"]["cpu.triad"].contains("configuration"));
  EXPECT_NE(render(original, Format::console).find("by cudaMemcpyAsync"), std::string::npos);
}

TEST(Results, RejectsDocumentsThatAreNotTheSchema) {
  auto doc = to_json(sample_results());
  auto message = [](const nlohmann::json& d) {
    try {
      results_from_json(d);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto wrong_schema = doc;
  wrong_schema["schema"] = "trainbench-results/0";
  EXPECT_NE(message(wrong_schema).find("expected 'trainbench-results/1'"), std::string::npos);
  auto no_samples = doc;
  no_samples["benchmarks"][0].erase("samples_ns");
  EXPECT_NE(message(no_samples).find("samples_ns"), std::string::npos);
  auto bad_type = doc;
  bad_type["benchmarks"][0]["median_ns"] = "fast";
  EXPECT_NE(message(bad_type).find("wrong type"), std::string::npos);
  EXPECT_NE(message(nlohmann::json::array()).find("not a JSON object"), std::string::npos);
  auto unknown_disposition = doc;
  unknown_disposition["benchmarks"][1]["disposition"] = "ok";
  EXPECT_EQ(message(unknown_disposition),
            "benchmark peak/cuda/copy/n=7: unknown disposition \"ok\" "
            "(expected one of pending, passed, incorrect, unsupported, failed)");
}

TEST(Disposition, EveryValueRoundTripsThroughItsName) {
  for (Disposition d :
       {Disposition::pending, Disposition::passed, Disposition::incorrect, Disposition::unsupported, Disposition::failed})
    EXPECT_EQ(disposition_from_string(to_string(d)), d) << to_string(d);
  // The words results/README.md documents, spelled as the files hold them.
  EXPECT_STREQ(to_string(Disposition::passed), "passed");
  EXPECT_STREQ(to_string(Disposition::incorrect), "incorrect");
  EXPECT_STREQ(to_string(Disposition::unsupported), "unsupported");
  EXPECT_STREQ(to_string(Disposition::failed), "failed");
  std::ostringstream shown;
  shown << Disposition::unsupported;
  EXPECT_EQ(shown.str(), "unsupported");
}

TEST(Disposition, AnUnknownNameIsRejected) {
  EXPECT_THROW(disposition_from_string("ok"), std::runtime_error);
  EXPECT_THROW(disposition_from_string("Passed"), std::runtime_error);
  EXPECT_THROW(disposition_from_string(""), std::runtime_error);
}

// The files under results/ were written by earlier builds: every one reads, and writes back with the
// disposition each row had, so the enum changed nothing a stored file holds.
TEST(Disposition, StoredResultFilesReadAndRewriteWithTheirDispositions) {
  namespace fs = std::filesystem;
  const fs::path stored = TRAINBENCH_RESULTS_DIR;
  if (!fs::is_directory(stored)) GTEST_SKIP() << stored << " is not here (an installed copy of the tests)";
  int files = 0;
  std::set<std::string> seen;
  for (const auto& entry : fs::recursive_directory_iterator(stored)) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    std::ifstream in(entry.path());
    const nlohmann::json original = nlohmann::json::parse(in);
    const nlohmann::json rewritten = to_json(results_from_json(original));
    ASSERT_EQ(rewritten["benchmarks"].size(), original["benchmarks"].size()) << entry.path();
    for (std::size_t i = 0; i < original["benchmarks"].size(); ++i) {
      const auto& row = original["benchmarks"][i];
      EXPECT_EQ(rewritten["benchmarks"][i]["name"], row["name"]) << entry.path();
      EXPECT_EQ(rewritten["benchmarks"][i]["disposition"], row["disposition"]) << entry.path() << " " << row["name"];
      seen.insert(row["disposition"].get<std::string>());
    }
  }
  EXPECT_GT(files, 0) << "no stored results under " << stored;
  EXPECT_TRUE(seen.count("passed")) << "the stored files hold no passed row";
}

TEST(Results, RendersEveryFormat) {
  const Results r = sample_results();
  const std::string console = render(r, Format::console);
  EXPECT_NE(console.find("peak/cpu/triad/n=7"), std::string::npos);
  EXPECT_NE(console.find("1.90x (95% CI 1.80-2.00)"), std::string::npos);
  EXPECT_NE(console.find("incorrect"), std::string::npos);
  EXPECT_NE(console.find("launches=3"), std::string::npos);
  const std::string csv = render(r, Format::csv);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4);
  EXPECT_NE(csv.find("\"no CUDA device, \"\"really\"\" | none\""), std::string::npos);
  const std::string md = render(r, Format::md);
  EXPECT_NE(md.find("\\| none"), std::string::npos);
  EXPECT_NE(md.find("| peak triad: OpenMP team vs one thread |"), std::string::npos);  // named as the console names it
  EXPECT_THROW(format_from_string("xml"), UsageError);
}

TEST(Results, WritesAtomically) {
  const auto dir = std::filesystem::temp_directory_path() / ("tb_results_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "r.json").string();
  write_file_atomically(path, "first");
  write_file_atomically(path, "second");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "second");
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1u) << "no temporary file is left behind";
  EXPECT_THROW(write_file_atomically((dir / "missing" / "r.json").string(), "x"), UsageError);
  std::filesystem::remove_all(dir);
}

// The atomic write never writes through a symlink someone planted at a name they could predict (the
// old `<out>.tmp.<pid>`, and the like) and gives the file a plain create's mode (0644 under umask 022).
TEST(Results, AnAtomicWriteFollowsNoPlantedSymlinkAndHasAPlainCreatesMode) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tb_symlinks_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path victim = dir / "victim", out = dir / "r.json";
  std::ofstream(victim) << "the victim's own bytes";
  const std::string name = out.filename().string(), pid = std::to_string(::getpid());
  for (const std::string& planted :
       {name + ".tmp." + pid, name + ".tmp", name + ".partial", "." + name + ".tmp", "." + name})
    fs::create_symlink(victim, dir / planted);
  const mode_t old_mask = ::umask(022);
  write_file_atomically(out.string(), "results");
  ::umask(old_mask);
  std::stringstream victim_text, out_text;
  victim_text << std::ifstream(victim).rdbuf();
  out_text << std::ifstream(out).rdbuf();
  EXPECT_EQ(victim_text.str(), "the victim's own bytes");
  EXPECT_EQ(out_text.str(), "results");
  EXPECT_FALSE(fs::is_symlink(out));
  EXPECT_EQ(fs::status(out).permissions(),
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
  fs::remove_all(dir);
}

// A private folder: under $TMPDIR with the prefix asked for, mode 0700, a new name each time, and
// gone with what is in it when its owner goes.
TEST(Results, APrivateTempDirIsOwnUniqueAndRemoved) {
  namespace fs = std::filesystem;
  const fs::path tmpdir = fs::temp_directory_path() / ("tb_private_" + std::to_string(::getpid()));
  fs::create_directories(tmpdir);
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::string saved = old_tmpdir ? old_tmpdir : "";
  ::setenv("TMPDIR", tmpdir.c_str(), 1);
  fs::path first, second;
  {
    const PrivateTempDir a("trainbench-test-"), b("trainbench-test-");
    first = a.path();
    second = b.path();
    EXPECT_NE(first, second);
    EXPECT_EQ(first.parent_path(), tmpdir);
    EXPECT_EQ(first.filename().string().rfind("trainbench-test-", 0), 0u) << first;
    EXPECT_TRUE(fs::is_directory(first));
    EXPECT_EQ(fs::status(first).permissions(), fs::perms::owner_all);
    fs::create_directories(first / "inputs");
    std::ofstream(first / "inputs" / "x.bin") << "x";
  }
  EXPECT_FALSE(fs::exists(first));
  EXPECT_FALSE(fs::exists(second));
  if (old_tmpdir) ::setenv("TMPDIR", saved.c_str(), 1);
  else ::unsetenv("TMPDIR");
  fs::remove_all(tmpdir);
}

// A pre-batched view against per-sample copies, and the lazy gate against the warm start alone with
// the model's prediction: what the pairs of issue "rows that cannot lie" carry.
Results results_with_kinds_of_pairs() {
  Results r = sample_results();
  PairRow amortised{"collate", "pre-batched slab, rebuilt per epoch, vs per-sample copies + stack",
                    "collate/cpu/per_sample/b=64", "collate/cpu/prebatched/b=64"};
  amortised.kind = "amortised";
  amortised.ratio = RatioEstimate{0.487, 0.48, 0.49, 0.95};
  amortised.baseline_ns = 0.106e6;
  amortised.improved_ns = 11.9;
  amortised.moved_out = MovedOut{"slab build", "slab_build_ms_per_batch", 0.218e6, 27.9e6, "epoch", "batch"};
  PairRow gate{"cg", "gate vs warm start alone (host-checked)", "cg/cpu/host_checked_warm/d=1e-6",
               "cg/cpu/host_checked_lazy/d=1e-6"};
  gate.ratio = RatioEstimate{1.31, 1.2, 1.4, 0.95};
  gate.baseline_ns = 60e6;
  gate.improved_ns = 45.8e6;
  gate.predicted = Prediction{"predicted_ns", 40e6, 1.5};
  r.pairs.push_back(amortised);
  r.pairs.push_back(gate);
  return r;
}

TEST(Results, PairKindsSurviveJsonAndOldFilesStillLoad) {
  const Results original = results_with_kinds_of_pairs();
  const nlohmann::json doc = to_json(original);
  EXPECT_EQ(doc["pairs"][0]["kind"], "timed");
  EXPECT_EQ(doc["pairs"][1]["kind"], "amortised");
  EXPECT_EQ(doc["pairs"][1]["moved_out"]["counter"], "slab_build_ms_per_batch");
  EXPECT_EQ(doc["pairs"][2]["predicted"]["ratio"], 1.5);
  const Results back = results_from_json(nlohmann::json::parse(doc.dump()));
  EXPECT_EQ(to_json(back), doc);
  ASSERT_EQ(back.pairs.size(), 3u);
  ASSERT_TRUE(back.pairs[1].moved_out);
  EXPECT_DOUBLE_EQ(back.pairs[1].moved_out->ns_each, 27.9e6);
  EXPECT_DOUBLE_EQ(back.pairs[1].improved_ns, 11.9);
  ASSERT_TRUE(back.pairs[2].predicted);
  EXPECT_EQ(back.pairs[2].predicted->counter, "predicted_ns");

  // A file written before pairs had kinds: a timed ratio, no medians, nothing else.
  auto old = doc;
  for (auto& p : old["pairs"])
    for (const char* key : {"kind", "baseline_median_ns", "improved_median_ns", "moved_out", "predicted"}) p.erase(key);
  const Results from_old = results_from_json(old);
  ASSERT_EQ(from_old.pairs.size(), 3u);
  for (const auto& p : from_old.pairs) {
    EXPECT_EQ(p.kind, "timed");
    EXPECT_FALSE(p.moved_out);
    EXPECT_EQ(p.baseline_ns, 0.0);
  }

  // An amortised ratio that does not say what it amortises is not trusted; nor an unknown kind.
  auto unexplained = doc;
  unexplained["pairs"][1].erase("moved_out");
  EXPECT_THROW(results_from_json(unexplained), std::runtime_error);
  auto unknown = doc;
  unknown["pairs"][0]["kind"] = "guessed";
  EXPECT_THROW(results_from_json(unknown), std::runtime_error);
}

TEST(Results, AnAmortisedPairSaysWhatWasMovedOutOfTheLoop) {
  const Results r = results_with_kinds_of_pairs();
  for (Format format : {Format::console, Format::md}) {
    const std::string text = render(r, format);
    EXPECT_NE(text.find("slab build 27.9 ms per epoch (218.0 us per batch amortised) + 11.9 ns per batch timed vs "
                        "per_sample 106.0 us per batch: 0.49x (95% CI 0.48-0.49) amortised"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("1.31x (95% CI 1.20-1.40); the model (predicted_ns 40.0 ms) predicts 1.50x"), std::string::npos)
        << text;
    EXPECT_NE(text.find("1.90x (95% CI 1.80-2.00)"), std::string::npos) << text;  // a timed pair as before
  }
}

// The PyTorch rows of a run, measured beside the rows they mirror (the harness's rows, backend torch),
// finished: time per unit from what the case said, the PyTorch pairs (withheld where a side was
// disturbed), the cross pairs from the rounds the two sides shared, PyTorch's versions in the context.
TEST(Results, ThePyTorchRowsGetTheirUnitsPairsAndCrossPairs) {
  Results results;
  const std::string label = "graph=ring8,rows=4096,alpha=0.5,drift=1e-6";
  const auto measured = [&](const std::string& backend, const std::string& variant, std::vector<double> samples) {
    Row r;
    r.name = "cg/" + backend + "/" + variant + "/" + label;
    r.stage = "cg";
    r.variant = variant;
    r.backend = backend;
    r.problem = {{"graph", "ring8"}, {"rows", "4096"}, {"alpha", "0.5"}, {"drift", "1e-6"}};
    r.disposition = Disposition::passed;
    r.samples_ns = std::move(samples);
    r.summary = summarize(r.samples_ns, 0.05);
    r.bytes = 2250;  // the mirrored row's work (the harness credits a PyTorch row with it)
    r.flops = 64;
    return r;
  };
  results.rows = {measured("cpu", "host_checked", {100, 101, 99, 100, 102}),
                  measured("cpu", "host_checked_warm", {100, 101, 99, 100, 102}),
                  measured("torch", "host_checked", {150, 151.5, 148.5, 150, 153}),
                  measured("torch", "host_checked_warm", {150, 151, 149, 150, 152}),
                  measured("torch", "host_checked_lazy", {75, 76, 74, 75, 76})};
  results.rows[0].interleaved_with = {results.rows[2].name};  // measured in the same rounds
  results.rows[2].interleaved_with = {results.rows[0].name};
  results.rows[3].disturbed = true;  // others held 40% of the CPUs through every retake
  results.rows[3].others_share = 0.4;
  std::vector<TorchBench> benches;
  for (const char* variant : {"host_checked", "host_checked_warm", "host_checked_lazy"})
    benches.push_back({std::string("cg/torch/") + variant + "/" + label,
                       "cg",
                       variant,
                       label,
                       std::string("cpu/") + (std::string(variant) == "host_checked_lazy" ? "graph_lazy" : variant),
                       "",
                       {}});
  const std::map<std::string, std::map<std::string, double>> per_unit{{results.rows[2].name, {{"us_per_solve", 16}}}};
  finish_torch_rows(results, benches, per_unit, {{"version", "2.15.0"}});
  const auto counter = [&](const Row& r, const std::string& key) {
    for (const auto& [k, v] : r.counters)
      if (k == key) return v;
    return -1.0;
  };
  EXPECT_NEAR(counter(results.rows[2], "us_per_solve"), 150e-3 / 16, 1e-12);
  EXPECT_EQ(counter(results.rows[3], "us_per_solve"), -1);
  // The cross pair of the cold rows has its ratio from their 5 shared rounds; the warm one is withheld
  // (its PyTorch side disturbed), the lazy one has no native row; the PyTorch pairs with the warm row
  // are withheld too.
  ASSERT_EQ(results.pairs.size(), 1u);
  EXPECT_EQ(results.pairs[0].label, "PyTorch host_checked -> trainbench cpu/host_checked");
  EXPECT_EQ(results.pairs[0].baseline, "cg/torch/host_checked/" + label);
  EXPECT_EQ(results.pairs[0].improved, "cg/cpu/host_checked/" + label);
  EXPECT_NEAR(results.pairs[0].ratio.ratio, 1.5, 1e-9);  // every round's ratio is 1.5
  EXPECT_EQ(results.pairs[0].rounds, 5);
  ASSERT_EQ(results.withheld_pairs.size(), 3u);
  EXPECT_EQ(results.withheld_pairs[0].label, "torch CG: warm start vs cold start (.item() per iteration)");
  EXPECT_EQ(results.withheld_pairs[1].label, "torch CG: gate vs warm start alone (.item() per iteration)");
  EXPECT_EQ(results.withheld_pairs[2].improved, "cg/cpu/host_checked_warm/" + label);
  EXPECT_EQ(results.withheld_pairs[2].why.rfind("cg/torch/host_checked_warm/" + label +
                                                    " was disturbed: other processes used 40%",
                                                0),
            0u)
      << results.withheld_pairs[2].why;
  EXPECT_EQ(results.context.at("torch").at("version"), "2.15.0");
}

// The PyTorch rows beside a selection: each PyTorch variant beside the rows of the variant it mirrors on
// the run's backend, at their problems and labels, where it runs them. These are the rows scripts/torch-peers
// listed itself before the table moved here (the same 25 on the CPU's quick problems, 74 on the GPU's).
TEST(TorchRows, ThePyTorchRowsStandBesideTheSelectedRows) {
  Settings settings;
  settings.quick = true;
  settings.peak_prepass = false;
  settings.backends = {Backend::cpu};
  const auto cpu = torch_benches(select_entries(builtin_registry(), settings), "cpu");
  std::vector<std::string> names;
  for (const auto& b : cpu) names.push_back(b.name);
  std::vector<std::string> want{"adamw/torch/fused/params=10000000,tensors=200,dtype=fp32",
                                "adamw/torch/foreach/params=10000000,tensors=200,dtype=fp32",
                                "adamw/torch/per_tensor/params=10000000,tensors=200,dtype=fp32",
                                "gradnorm/torch/per_tensor/params=29900000,tensors=200,dtype=fp32",
                                "gradnorm/torch/foreach/params=29900000,tensors=200,dtype=fp32",
                                "gradnorm/torch/foreach_item/params=29900000,tensors=200,dtype=fp32",
                                "attention/torch/sdpa/cpu_shape=4x6x256x64,causal=causal",
                                "attention/torch/sdpa/cpu_shape=1x8x1024x64,causal=causal",
                                "attention/torch/naive/cpu_shape=4x6x256x64",
                                "attention/torch/naive/cpu_shape=1x8x1024x64",
                                "spmv/torch/csr/graph=ring8,rows=1048576",
                                "spmv/torch/spmm_csr/graph=ring8,rows=1048576,rhs=8"};
  for (const char* v : {"host_checked", "host_checked_warm", "host_checked_lazy"})
    for (const char* d : {"2e-6", "1e-6", "5e-7"})
      want.push_back(std::string("cg/torch/") + v + "/graph=ring8,rows=65536,alpha=0.5,drift=" + d);
  for (const char* v : {"per_sample", "index_select"})
    for (const char* batch : {"64", "4096"})
      want.push_back(std::string("collate/torch/") + v + "/layout=text_pair,order=shuffled,samples=8192,batch=" + batch +
                     ",embed_dim=768,seq_len=128");
  want.push_back("step/torch/twin/cpu_workload=tiny");
  EXPECT_EQ(names, want);
  for (const auto& b : cpu) {
    EXPECT_EQ(b.mirrors.rfind("cpu/", 0), 0u) << b.name;
    EXPECT_NE(b.variant, "sdpa_flash");  // the GPU patterns mirror no CPU variant
  }
  const auto naive = std::find_if(cpu.begin(), cpu.end(), [](const TorchBench& b) {
    return b.name == "attention/torch/naive/cpu_shape=1x8x1024x64";
  });
  ASSERT_NE(naive, cpu.end());
  EXPECT_EQ(naive->mirrors, "cpu/naive_mask_cached");
  const std::vector<std::pair<std::string, std::string>> implied{{"cpu_shape", "1x8x1024x64"},
                                                                 {"dtype", "fp32"},
                                                                 {"causal", "causal"}};
  EXPECT_EQ(naive->problem, implied);  // what naive_mask_cached runs without an axis for it
  EXPECT_EQ(cpu[13].mirrors, "cpu/host_checked");
  EXPECT_EQ(cpu[24].mirrors, "cpu/gather");  // index_select: the PyTorch fix on the CPU
  EXPECT_EQ(cpu[25].mirrors, "cpu/train");   // the twin of the whole step

  settings.backends = {Backend::cuda};  // listed here too, unavailable or not
  const auto cuda = torch_benches(select_entries(builtin_registry(), settings), "cuda");
  EXPECT_EQ(cuda.size(), 76u);
  settings.quick = false;
  const auto all = torch_benches(select_entries(builtin_registry(), settings), "cuda");
  EXPECT_EQ(all.size(), 139u);
  std::set<std::string> cuda_names;
  for (const auto& b : all) cuda_names.insert(b.name);
  EXPECT_EQ(cuda_names.size(), all.size());
  EXPECT_TRUE(cuda_names.count("attention/torch_cuda/sdpa_flash/shape=4x16x4096x128,causal=causal,dtype=bf16"));
  EXPECT_FALSE(cuda_names.count("attention/torch_cuda/sdpa_flash/shape=4x16x4096x128,causal=causal,dtype=fp32"));
  EXPECT_TRUE(cuda_names.count("cg/torch_cuda/device_loop_lazy/graph=ring8,rows=262144,alpha=0.5,drift=5e-7"));
  EXPECT_TRUE(cuda_names.count("step/torch_cuda/twin/workload=sem_v55"));  // every preset the CUDA step runs
  for (const auto& name : cuda_names) {
    if (name.rfind("adamw/", 0) == 0 || name.rfind("gradnorm/", 0) == 0) {  // fp32 only
      EXPECT_EQ(name.find("dtype=bf16"), std::string::npos) << name;
    }
    if (name.rfind("collate/", 0) == 0) {
      EXPECT_NE(name.find("compute_us=0"), std::string::npos) << name;
    }
  }
}

// A PyTorch variant runs only the axis values it can: collate's field-major layouts, not the step's rows.
TEST(TorchRows, APyTorchVariantLeavesOutTheProblemsItCannotRun) {
  Settings settings;
  settings.quick = true;
  settings.peak_prepass = false;
  settings.backends = {Backend::cpu};
  settings.filter = "collate/cpu/per_sample/";
  settings.overrides.push_back(parse_axis_override(builtin_registry(), "collate.layout=token_rows,text_pair"));
  std::vector<std::string> layouts;
  for (const auto& b : torch_benches(select_entries(builtin_registry(), settings), "cpu"))
    for (const auto& [key, value] : b.problem)
      if (key == "layout") layouts.push_back(value);
  EXPECT_EQ(layouts, std::vector<std::string>({"text_pair", "text_pair"}));
}

}  // namespace
}  // namespace tb
