#include "harness.h"

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <ctime>
#include <iomanip>
#include <map>
#include <optional>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>

#include "groups.h"
#include "progress.h"
#include "runner.h"
#include "runtime/comm.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"
#include "runtime/error.h"
#include "trainbench/build_info.h"

namespace tb {

static volatile std::sig_atomic_t stop_flag = 0;  // the signal that asked, 0: none
void request_stop(int signal) {
  if (!stop_flag) stop_flag = signal > 0 ? signal : SIGINT;  // the first one says how it ended
}
bool stop_requested() { return stop_flag != 0; }
int stop_signal() { return stop_flag; }
void clear_stop_request() { stop_flag = 0; }

// ---- selection ---------------------------------------------------------------------------------

static bool wants(const Settings& s, Backend b) {
  return std::find(s.backends.begin(), s.backends.end(), b) != s.backends.end();
}

static std::string unavailable_reason(const Variant& v) {
  if (v.backend == Backend::cuda) {
    if (!v.make || !cuda_status().built)
      return cuda_status().unavailable_reason.empty() ? "built without CUDA" : cuda_status().unavailable_reason;
    if (!cuda_status().available()) return cuda_status().unavailable_reason;
  }
  if (!v.make) return "not built";
  return "";
}

static Entry make_entry(const Stage& stage, const Variant& variant, const Problem& problem) {
  Entry e{&stage, &variant, problem, benchmark_name(stage, variant, problem), unavailable_reason(variant)};
  // Under mpirun the ranks share the machine: a row of one rank would be timed while the others wait
  // in their next collective, on the same cores. Only the collective stages run there.
  if (e.unsupported.empty() && !variant.collective && comm::launched_ranks() > 1)
    e.unsupported = "runs on one rank (this run has " + std::to_string(comm::launched_ranks()) +
                    " ranks): run it without mpirun";
  if (e.unsupported.empty() && variant.unsupported) e.unsupported = variant.unsupported(problem);
  return e;
}

// Stages in registry order, but `peak` first: its rows are what the others are measured against.
static std::vector<const Stage*> ordered_stages(const Registry& registry) {
  std::vector<const Stage*> order;
  if (const Stage* peak = registry.find("peak")) order.push_back(peak);
  for (const auto& s : registry.stages())
    if (s.name != "peak") order.push_back(&s);
  return order;
}

std::vector<Entry> select_entries(const Registry& registry, const Settings& settings) {
  std::regex filter;
  try {
    filter = std::regex(settings.filter.empty() ? "." : settings.filter, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw UsageError("--filter '" + settings.filter + "' is not a valid regular expression: " + e.what());
  }
  std::vector<Entry> selected;
  for (const Stage* stage : ordered_stages(registry))
    for (const auto& variant : stage->variants) {
      if (!wants(settings, variant.backend)) continue;
      for (const auto& problem : expand_problems(*stage, variant, settings.overrides, settings.quick)) {
        Entry e = make_entry(*stage, variant, problem);
        if (std::regex_search(e.name, filter)) selected.push_back(std::move(e));
      }
    }
  if (selected.empty()) {
    // A filter that names only variants of a backend that cannot run here (a GPU-only stage on a
    // CPU-only machine) is not bad usage: those become unsupported rows that say why.
    for (const Stage* stage : ordered_stages(registry))
      for (const auto& variant : stage->variants) {
        if (wants(settings, variant.backend) || unavailable_reason(variant).empty()) continue;
        for (const auto& problem : expand_problems(*stage, variant, settings.overrides, settings.quick)) {
          Entry e = make_entry(*stage, variant, problem);
          if (std::regex_search(e.name, filter)) selected.push_back(std::move(e));
        }
      }
    if (!selected.empty()) return selected;
    std::ostringstream msg;
    msg << "no benchmark matches --filter '" << settings.filter << "' with --backend";
    for (Backend b : settings.backends) msg << " " << to_string(b);
    msg << ". Benchmarks are named stage/backend/variant/problem; stages and variants:";
    for (const Stage* stage : ordered_stages(registry)) {
      msg << "\n  " << stage->name << ":";
      for (const auto& v : stage->variants) msg << " " << to_string(v.backend) << "/" << v.id;
    }
    throw UsageError(msg.str());
  }
  if (!settings.peak_prepass) return selected;

  // Peaks the selected rows are compared with but that the filter left out: measure them first.
  std::set<std::string> provided, needed;
  for (const auto& e : selected) {
    if (!e.unsupported.empty()) continue;
    if (!e.variant->provides_peak.empty()) provided.insert(e.variant->provides_peak);
    const std::string key = e.variant->work(e.problem).peak_key;
    if (!key.empty()) needed.insert(key);
  }
  // (The peak stage's ceilings, and a stage's own: the all-reduce's link.)
  std::vector<Entry> prepass;
  for (const Stage* stage : ordered_stages(registry))
    for (const auto& variant : stage->variants) {
      if (variant.provides_peak.empty() || !needed.count(variant.provides_peak) || provided.count(variant.provides_peak))
        continue;
      for (const auto& problem : expand_problems(*stage, variant, settings.overrides, settings.quick)) {
        Entry e = make_entry(*stage, variant, problem);
        if (e.unsupported.empty()) prepass.push_back(std::move(e));
      }
    }
  selected.insert(selected.begin(), prepass.begin(), prepass.end());
  return selected;
}

namespace {

std::string iso_date_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", &tm);
  std::string s = buf;
  if (s.size() > 5) s.insert(s.size() - 2, ":");  // +0000 -> +00:00 as Google Benchmark writes it
  return s;
}

}  // namespace

Results run_entries(const Registry& registry, const std::vector<Entry>& entries, const Settings& settings,
                    std::ostream& progress) {
  Results results;
  results.context = run_context(settings);
  results.rows = measure_entries(entries, settings, progress);
  if (stop_requested()) results.context["interrupted"] = signal_name(stop_signal());
  finish_results(registry, settings, results);
  return results;
}

nlohmann::json run_context(const Settings& settings) {
  using nlohmann::json;
  const auto& cpu = benchmark::CPUInfo::Get();
  json caches = json::array();
  for (const auto& c : cpu.caches)
    caches.push_back({{"type", c.type}, {"level", c.level}, {"size", c.size}, {"num_sharing", c.num_sharing}});
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  json context = {{"date", iso_date_now()},
                  {"host_name", host},
                  {"executable", "benchsuite"},
                  {"num_cpus", cpu.num_cpus},
                  {"mhz_per_cpu", static_cast<int64_t>(cpu.cycles_per_second / 1e6)},
                  {"cpu_scaling_enabled", cpu.scaling == benchmark::CPUInfo::ENABLED},
                  {"caches", caches},
                  {"load_avg", cpu.load_avg},
                  {"library_build_type", std::string(build::build_type) == "Debug" ? "debug" : "release"}};
  context["trainbench"] = {{"version", build::version},
                           {"git_commit", build::git_commit},
                           {"build_type", build::build_type},
                           {"cuda_built", cuda_status().built},
                           {"cuda_architectures", cuda_status().built ? build::cuda_architectures : ""}};
  const HostInfo h = host_info();
  context["host"] = {{"cpu_model", h.cpu_model}, {"cores", h.cores}, {"threads", h.threads},  {"omp_threads", h.omp_threads},
                     {"compiler", h.compiler},   {"blas", h.blas},   {"l3_bytes", h.l3_bytes}};
  json devices = json::array();
  for (const auto& g : cuda_status().devices)
    devices.push_back({{"index", g.index},
                       {"name", g.name},
                       {"uuid", g.uuid},
                       {"compute_capability", g.compute_capability},
                       {"sms", g.sms},
                       {"memory_bytes", g.memory_bytes},
                       {"l2_bytes", g.l2_bytes},
                       {"sm_clock_mhz", g.sm_clock_mhz},
                       {"memory_clock_mhz", g.memory_clock_mhz},
                       {"memory_bus_bits", g.memory_bus_bits},
                       {"driver_version", g.driver_version},
                       {"runtime_version", g.runtime_version},
                       {"cublas_version", g.cublas_version},
                       {"cusparse_version", g.cusparse_version}});
  context["devices"] = devices;
  context["cuda_unavailable_reason"] = cuda_status().unavailable_reason;
  context["cache_thresholds"] = cache_thresholds_json(settings);
  json backends = json::array();
  for (Backend b : settings.backends) backends.push_back(to_string(b));
  context["settings"] = {{"mode", settings.cold ? "cold" : "hot"}, {"repetitions", settings.repetitions},
                         {"min_time_s", settings.min_time_s},      {"quick", settings.quick},
                         {"noise_target", settings.noise_target},  {"backends", backends},
                         {"cuda_device", settings.cuda_device},    {"filter", settings.filter},
                         {"ranks", comm::launched_ranks()}};
  return context;
}

static std::string mib_text(double bytes) {
  std::ostringstream out;
  out << std::setprecision(3) << bytes / (1 << 20) << " MiB";
  return out.str();
}

// The working set below which a hot memory-bound row's back-to-back calls may run from a cache, and in
// words how it was found: on a CPU where the copy's bandwidth fell to DRAM's in this machine's size
// sweep (Settings::cpu_cache_bytes), else twice the reported last-level cache (what cold mode's flush
// writes); on a GPU twice its L2. 0 when unknown.
struct CacheLimit {
  double bytes = 0;
  std::string how;
};
static CacheLimit cache_limit(const std::string& backend, const Settings& settings) {
  if (backend == "cuda" || backend == "torch_cuda") {  // PyTorch's rows on the GPU too
    for (const auto& g : cuda_status().devices)
      if (g.index == settings.cuda_device)
        return {2.0 * static_cast<double>(g.l2_bytes),
                "twice the GPU's " + mib_text(static_cast<double>(g.l2_bytes)) + " L2"};
    return {};
  }
  if (settings.cpu_cache_bytes > 0) return {settings.cpu_cache_bytes, settings.cpu_cache_how};
  const double l3 = static_cast<double>(host_info().l3_bytes);
  if (l3 <= 0) return {};
  return {2 * l3, "twice the " + mib_text(l3) + " last-level cache the CPU reports"};
}

nlohmann::json cache_thresholds_json(const Settings& settings) {
  nlohmann::json out = nlohmann::json::object();
  for (Backend b : settings.backends) {
    const CacheLimit limit = cache_limit(to_string(b), settings);
    if (limit.bytes > 0) out[to_string(b)] = {{"bytes", limit.bytes}, {"how", limit.how}};
  }
  return out;
}

// A peak row's own samples agree with the best figure of its work measured beside it in the run when
// they reach this share of it; below, the peak says what they reached.
constexpr double kPeakAgreement = 0.98;

// The measured DRAM bandwidths (STREAM copy and triad, the CPU's memory mixes) and the CPU all-reduce's
// link, measured on 1 GiB: MPI reduces in host memory (over shared memory between the ranks of a host),
// and gradient buffers that fit in the cache were measured above it on one host (57 MiB of bf16 at
// 1.6-1.7x the link's figure). Transfers over PCIe and NCCL's links are not cache-bound.
static bool is_dram_peak(const std::string& key) {
  auto ends_with = [&](const std::string& tail) {
    return key.size() > tail.size() && key.compare(key.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends_with(".copy") || ends_with(".triad") || ends_with(".memory") || key == "cpu.allreduce";
}

// A hot memory-bound row whose working set is below twice the last-level cache (what cold mode's
// flush writes) may be served from that cache, so a DRAM peak is no ceiling for it.
static bool may_run_from_cache(const Row& r, const Settings& settings) {
  if (r.mode != "hot" || r.bound != "memory") return false;
  const double limit = cache_limit(r.backend, settings).bytes;
  return limit > 0 && r.footprint < limit;
}

// "95%", or "75-98%" when the rows' levels differ (their sample counts do).
static std::string level_range_text(std::vector<double> levels) {
  if (levels.empty()) return "";
  std::sort(levels.begin(), levels.end());
  auto pct = [](double v) {
    std::ostringstream out;
    out << std::setprecision(3) << 100 * v;
    return out.str();
  };
  const std::string lo = pct(levels.front()), hi = pct(levels.back());
  return (lo == hi ? lo : lo + "-" + hi) + "%";
}

std::string table_key(const Results& results, const Settings& settings) {
  std::vector<double> row_levels, pair_levels;
  bool noisy = false, disturbed = false, cache = false, above = false, dash = false;
  std::map<std::string, double> cache_threshold;  // "CPU rows, <how>": bytes, of the rows shown
  for (const auto& r : results.rows) {
    if (!r.timed()) continue;
    row_levels.push_back(r.summary.ci_level);
    noisy |= r.summary.noisy;
    disturbed |= r.disturbed;
    cache |= r.pct_note == "cache";
    above |= r.pct_note == "above peak";
    dash |= !r.pct_of_peak && r.pct_note.empty();
    const bool gpu = r.backend == "cuda" || r.backend == "torch_cuda";
    const CacheLimit limit = cache_limit(r.backend, settings);
    if (limit.bytes > 0) cache_threshold[(gpu ? "GPU rows, " : "CPU rows, ") + limit.how] = limit.bytes;
  }
  for (const auto& p : results.pairs) pair_levels.push_back(p.ratio.ci_level);
  std::ostringstream out;
  out << "\nKey:\n";
  if (!results.pairs.empty() || !results.withheld_pairs.empty())
    out << "  Pairs (above): read them first. Each is baseline time / improved time with its confidence interval"
        << (pair_levels.empty() ? "" : " (level " + level_range_text(pair_levels) + ")")
        << ": what the faster variant buys on this machine.\n";
  out << "  median: of the " << (settings.max_time_s > 0 ? "up to " : "") << settings.repetitions
      << " samples per row (each sample " << settings.min_time_s << " s or more; fast calls batched).\n";
  if (!row_levels.empty())
    out << "  +-CI: half-width of the median's distribution-free confidence interval, in % of the median; its level in "
           "this run: "
        << level_range_text(row_levels)
        << " (set by the samples per row: --quick's 3 give 75% for a row and 90% for a pair, "
        << "10 give 98% and 95%).\n";
  out << "  (noisy): +-CI above the noise target (" << 100 * settings.noise_target
      << "%, --noise-target): run it with more --repetitions before trusting it" << (noisy ? "" : " (none in this run)")
      << ".\n";
  if (disturbed)
    out << "  (disturbed): other processes held the CPUs (or the GPU throttled) while it ran, and taking its samples "
           "again did not help; its pairs are withheld.\n";
  out << "  rate: GB/s (memory-bound rows) or GFLOP/s, TFLOP/s (compute-bound), from the stage's work model; "
         "% peak: of the peak this run measured (listed under the table).\n";
  out << "  cache: a hot memory-bound row whose working set is below where the cache ends (CPU: where a copy's "
         "bandwidth falls to DRAM's in a size sweep of this machine; GPU: twice its L2), so it may run from the "
         "cache and a DRAM peak is no ceiling for it";
  if (!cache_threshold.empty()) {
    out << " (here:";
    bool first = true;
    for (const auto& [what, bytes] : cache_threshold) {
      out << (first ? " " : "; ") << "below " << mib_text(bytes) << " for " << what;
      first = false;
    }
    out << ")";
  }
  out << "; --cold measures any size from DRAM" << (cache ? "" : " (none in this run)") << ".\n";
  out << "  above peak: faster than the peak it is compared with (that peak is low, or the data is cached)"
      << (above ? "" : " (none in this run)") << ".\n";
  out << "  -: no % peak applies (a peak row itself, or a row with no peak of its kind measured)"
      << (dash ? "" : " (none in this run)") << ".\n";
  if (settings.max_time_s > 0)
    out << "  (cut short): --max-time " << settings.max_time_s
        << " s ended its measurement with fewer samples than --repetitions; its interval is wider.\n";
  return out.str();
}

std::string table_key_help() {
  return "Reading the table (a key is printed under it):\n"
         "  Pairs: baseline time / improved time with its confidence interval: the answer to read first.\n"
         "  +-CI: half-width of the median's distribution-free confidence interval, in % of the median. Its level\n"
         "        depends on the samples per row: 98% with the default 10 (pairs 95%), 75% with --quick's 3 (pairs 90%).\n"
         "  (noisy): +-CI above --noise-target (5%): run with more --repetitions.\n"
         "  cache: a hot memory-bound row whose working set is below where the cache ends (CPU: where a copy's\n"
         "        bandwidth falls to DRAM's in a size sweep, kept per machine; GPU: twice its L2): it may run from\n"
         "        the cache, so a DRAM peak is no ceiling for it (--cold measures from DRAM).\n"
         "  above peak: faster than the measured peak it is compared with.\n"
         "  -: no % peak applies (a peak row itself, or no peak of its kind measured).\n";
}

static const double* find_counter(const Row& r, const std::string& key) {
  for (const auto& [k, v] : r.counters)
    if (k == key) return &v;
  return nullptr;
}

// A time in ms as the pair's reasons show it.
static std::string ms_text(double ms) {
  std::ostringstream out;
  out << std::setprecision(3) << ms << " ms";
  return out.str();
}

// The pair's row: the ratio of the timed regions, or, when the improved variant moved a cost out of
// its timed region, the amortised ratio baseline / (improved + that cost per call), its interval
// from the samples with the cost added to each (the cost is one measurement: its own spread is not
// in the interval). Null, with `why`, when no ratio would be an answer: a side that moves nothing
// in its timed region compared by that time alone, or an amortised cost the row does not report.
std::optional<PairRow> compare_pair(const Pair& pair, const Row& baseline, const Row& improved, std::string& why) {
  PairRow out{improved.stage, pair.label, baseline.name, improved.name};
  // Sides measured in the same rounds: the ratio of each round's two samples, so that a drift of the
  // machine that slowed both within a round cancels; sides measured apart: of the two sample sets.
  const bool paired = std::find(baseline.interleaved_with.begin(), baseline.interleaved_with.end(), improved.name) !=
                      baseline.interleaved_with.end();
  auto ratio_of = [&](const std::vector<double>& b, const std::vector<double>& i, int& rounds) {
    if (!paired) return ratio_estimate(b, i);
    rounds = static_cast<int>(std::min(b.size(), i.size()));
    return paired_ratio_estimate(b, i);
  };
  out.baseline_ns = baseline.summary.median;
  out.improved_ns = improved.summary.median;
  const std::string nothing = " moves nothing in its timed region (no bytes, no FLOPs)";
  if (baseline.moves_nothing()) {
    why = baseline.name + nothing + ": it is no baseline to divide by";
    return std::nullopt;
  }
  if (pair.moved_out.declared()) {
    const MovedOutCost& declared = pair.moved_out;
    const double* per_call_ms = find_counter(improved, declared.ms_per_call);
    if (!per_call_ms || !std::isfinite(*per_call_ms) || *per_call_ms < 0) {
      why = improved.name + " does not report its " + declared.what + " (counter " + declared.ms_per_call +
            "): its timed region alone is not its cost";
      return std::nullopt;
    }
    if (*per_call_ms == 0 && improved.moves_nothing()) {
      why = improved.name + nothing + " and pays nothing per " + (declared.call.empty() ? "call" : declared.call) +
            " outside it (" + declared.ms_per_call + " = 0): it saves the baseline's " +
            ms_text(baseline.summary.median * 1e-6) + " whole, which is no ratio";
      return std::nullopt;
    }
    const double moved_ns = *per_call_ms * 1e6;
    const double* each_ms = declared.ms_each.empty() ? nullptr : find_counter(improved, declared.ms_each);
    std::vector<double> amortised = improved.samples_ns;
    for (double& t : amortised) t += moved_ns;
    out.kind = "amortised";
    out.ratio = ratio_of(baseline.samples_ns, amortised, out.rounds);
    out.moved_out = MovedOut{declared.what,     declared.ms_per_call, moved_ns, each_ms ? *each_ms * 1e6 : 0.0,
                             declared.paid_per, declared.call};
  } else if (improved.moves_nothing()) {
    why = improved.name + nothing +
          " and the pair names no cost moved out of it: a ratio of its time would "
          "divide the baseline's work by no work";
    return std::nullopt;
  } else {
    out.ratio = ratio_of(baseline.samples_ns, improved.samples_ns, out.rounds);
  }
  if (!pair.predicted_ns.empty())
    if (const double* predicted = find_counter(improved, pair.predicted_ns); predicted && *predicted > 0)
      out.predicted = Prediction{pair.predicted_ns, *predicted, baseline.summary.median / *predicted};
  return out;
}

void judge_pair(const Pair& pair, const Row& baseline, const Row& improved, Results& results) {
  if (baseline.disturbed || improved.disturbed) {
    const Row& d = improved.disturbed ? improved : baseline;
    results.withheld_pairs.push_back(
        WithheldPair{improved.stage, pair.label, baseline.name, improved.name,
                     d.name + " was disturbed: " + disturbance_text(d) + " during its samples"});
    return;
  }
  std::string why;
  if (auto row = compare_pair(pair, baseline, improved, why)) results.pairs.push_back(std::move(*row));
  else results.withheld_pairs.push_back(WithheldPair{improved.stage, pair.label, baseline.name, improved.name, why});
}

// % of peak only where the peak is a ceiling, so that no row can claim more than 100%.
void attach_pct_of_peak(const Settings& settings, Results& results) {
  for (auto& r : results.rows) {
    if (!r.timed() || r.peak_key.empty()) continue;
    if (is_dram_peak(r.peak_key) && may_run_from_cache(r, settings)) {
      r.pct_note = "cache";
      continue;
    }
    const auto it = results.peaks.find(r.peak_key);
    if (it == results.peaks.end() || it->second.value <= 0) continue;
    const double pct = 100.0 * r.rate() / it->second.value;
    if (pct > 100.0) r.pct_note = "above peak";
    else r.pct_of_peak = pct;
  }
}

// A counter "X_per_call" (samples per call) gets its rate "X_per_s" from the row's median time,
// unless the timed region does no work: samples "delivered" by a pointer bump are no rate.
static void add_counter_rates(Results& results) {
  for (auto& r : results.rows) {
    if (!r.timed() || r.summary.median <= 0 || r.moves_nothing()) continue;
    std::vector<std::pair<std::string, double>> rates;
    for (const auto& [key, value] : r.counters) {
      const std::string suffix = "_per_call";
      if (key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0)
        rates.emplace_back(key.substr(0, key.size() - suffix.size()) + "_per_s", value / (r.summary.median * 1e-9));
    }
    for (auto& rate : rates) {
      const auto same = std::find_if(r.counters.begin(), r.counters.end(),
                                     [&](const auto& c) { return c.first == rate.first; });
      if (same == r.counters.end()) r.counters.push_back(std::move(rate));
    }
  }
}

// Rows of other backends (PyTorch's: torch_rows.h) set no peak and join none of the registry's pairs.
static bool registry_row(const Row& r) { return r.backend == "cpu" || r.backend == "cuda"; }

// Peaks: the fastest sample each peak variant reached in this run. A ceiling is what the machine
// can do; interference only ever slows a sample down, so the median would understate it.
// A DRAM peak measured on data that fits in the cache is the cache's bandwidth: not a ceiling.
// Figures of the same work measured beside the peak row in this run count too: the fastest call of
// the row's own search (its counter search_best_ns) and the fastest sample of a row of the same stage
// doing the same work another way (the triad on one thread). The peak is the best of them; when that
// is not the row's own samples by more than kPeakAgreement, the peak says what its samples reached.
static void set_peaks(const Registry& registry, const Settings& settings, Results& results) {
  std::map<std::string, double> own_samples;                 // by peak key: its rows' fastest sample
  std::map<std::string, std::vector<const Row*>> peak_rows;  // by peak key: the rows that provide it
  auto rate_at = [](const Row& r, double ns) { return (r.bound == "compute" ? r.flops : r.bytes) / (ns * 1e-9); };
  auto offer = [&](const std::string& key, double rate, const Row& r, const std::string& configuration) {
    PeakValue& peak = results.peaks[key];
    if (rate > peak.value) peak = PeakValue{rate, r.bound == "compute" ? "FLOP/s" : "B/s", r.name, configuration};
  };
  for (auto& r : results.rows) {
    if (!r.timed() || !registry_row(r)) continue;
    const Stage* stage = registry.find(r.stage);
    const Variant* v = stage ? stage->find_variant(r.variant, backend_from_string(r.backend)) : nullptr;
    if (!v || v->provides_peak.empty()) continue;
    if (is_dram_peak(v->provides_peak) && may_run_from_cache(r, settings)) {
      r.pct_note = "cache";
      continue;
    }
    const double rate = rate_at(r, *std::min_element(r.samples_ns.begin(), r.samples_ns.end()));
    own_samples[v->provides_peak] = std::max(own_samples[v->provides_peak], rate);
    offer(v->provides_peak, rate, r, r.configuration);
    if (const double* search_ns = find_counter(r, "search_best_ns"); search_ns && *search_ns > 0)
      offer(v->provides_peak, rate_at(r, *search_ns), r,
            (r.configuration.empty() ? std::string("its search") : r.configuration) + ", the fastest call of its search");
    peak_rows[v->provides_peak].push_back(&r);
  }
  for (const auto& r : results.rows) {
    const auto providers = peak_rows.find(r.peak_key);
    if (!r.timed() || !registry_row(r) || providers == peak_rows.end() || may_run_from_cache(r, settings)) continue;
    const bool same_work = std::any_of(providers->second.begin(), providers->second.end(), [&](const Row* p) {
      return p->stage == r.stage && p->bytes == r.bytes && p->flops == r.flops;
    });
    if (same_work) offer(r.peak_key, rate_at(r, *std::min_element(r.samples_ns.begin(), r.samples_ns.end())), r, r.variant);
  }
  for (auto& [key, peak] : results.peaks) {
    const double own = own_samples[key];
    peak.own_samples_value = own > 0 && own < kPeakAgreement * peak.value ? own : 0;
  }
}

// Pairs: at every problem both variants ran at on the same backend.
static void judge_pairs(const Registry& registry, Results& results) {
  std::map<std::string, const Row*> by_name;
  for (const auto& r : results.rows) by_name[r.name] = &r;
  for (const auto& r : results.rows) {
    if (!r.timed() || !registry_row(r)) continue;
    const Stage* stage = registry.find(r.stage);
    if (!stage) continue;
    for (const auto& pair : stage->pairs) {
      if (pair.improved != r.variant) continue;
      const std::string baseline_name = pair_baseline_name(*stage, pair, r,
                                                           [&](const std::string& name) { return by_name.count(name) > 0; });
      const auto it = by_name.find(baseline_name);
      if (it == by_name.end() || !it->second->timed()) continue;
      judge_pair(pair, *it->second, r, results);
    }
  }
}

void finish_results(const Registry& registry, const Settings& settings, Results& results) {
  for (auto& r : results.rows)
    if (r.timed()) r.summary = summarize(r.samples_ns, settings.noise_target);
  add_counter_rates(results);
  set_peaks(registry, settings, results);
  attach_pct_of_peak(settings, results);
  judge_pairs(registry, results);
}

int exit_code_for(const Results& results) {
  for (const auto& r : results.rows)
    if (r.disposition == Disposition::incorrect || r.disposition == Disposition::failed) return 1;
  return 0;
}

}  // namespace tb
