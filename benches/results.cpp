#include "results.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include "runtime/error.h"
#include "runtime/gpu_monitor.h"

namespace tb {

using nlohmann::json;

// ---- Disposition -------------------------------------------------------------------------------

static constexpr Disposition all_dispositions[] = {Disposition::pending, Disposition::passed, Disposition::incorrect,
                                                   Disposition::unsupported, Disposition::failed};

const char* to_string(Disposition disposition) {
  switch (disposition) {
    case Disposition::pending:
      return "pending";
    case Disposition::passed:
      return "passed";
    case Disposition::incorrect:
      return "incorrect";
    case Disposition::unsupported:
      return "unsupported";
    case Disposition::failed:
      return "failed";
  }
  throw std::logic_error("a Disposition with no name");
}

Disposition disposition_from_string(const std::string& name) {
  std::string known;
  for (Disposition d : all_dispositions) {
    if (name == to_string(d)) return d;
    known += std::string(known.empty() ? "" : ", ") + to_string(d);
  }
  throw std::runtime_error("unknown disposition \"" + name + "\" (expected one of " + known + ")");
}

std::ostream& operator<<(std::ostream& out, Disposition disposition) { return out << to_string(disposition); }

// ---- JSON --------------------------------------------------------------------------------------

static json row_to_json(const Row& r) {
  json problem = json::object();
  for (const auto& [k, v] : r.problem) problem[k] = v;
  json j = {{"name", r.name},
            {"run_name", r.name},
            {"run_type", "aggregate"},
            {"aggregate_name", "median"},
            {"threads", 1},
            {"stage", r.stage},
            {"variant", r.variant},
            {"backend", r.backend},
            {"problem", problem},
            {"disposition", to_string(r.disposition)},
            {"reason", r.reason},
            {"max_error", std::isfinite(r.max_error) ? json(r.max_error) : json(nullptr)},
            {"mode", r.mode},
            {"batch", r.batch},
            {"bytes", r.bytes},
            {"flops", r.flops},
            {"bound", r.bound},
            {"peak_key", r.peak_key},
            {"footprint_bytes", r.footprint}};
  json counters = json::object();
  for (const auto& [k, v] : r.counters) counters[k] = v;
  j["counters"] = counters;
  if (r.timed()) {
    j["iterations"] = r.iterations;
    j["repetitions"] = r.samples_ns.size();
    j["real_time"] = r.summary.median;
    j["cpu_time"] = r.summary.median;
    j["time_unit"] = "ns";
    j["samples_ns"] = r.samples_ns;
    j["median_ns"] = r.summary.median;
    j["ci_low_ns"] = r.summary.ci_low;
    j["ci_high_ns"] = r.summary.ci_high;
    j["ci_level"] = r.summary.ci_level;
    j["noisy"] = r.summary.noisy;
    if (!r.interrupted.empty()) j["interrupted"] = r.interrupted;
    j["gb_per_s"] = r.gb_per_s();
    j["tflop_per_s"] = r.tflop_per_s();
    if (r.pct_of_peak) j["pct_of_peak"] = *r.pct_of_peak;
    if (!r.pct_note.empty()) j["pct_of_peak_note"] = r.pct_note;
    if (!r.configuration.empty()) j["configuration"] = r.configuration;
    if (!r.interleaved_with.empty()) j["interleaved_with"] = r.interleaved_with;
    if (r.others_share >= 0) j["others_cpu_share"] = r.others_share;
    j["disturbed"] = r.disturbed;
    j["retaken_samples"] = r.retaken;
    if (!r.cut_short.empty()) j["cut_short"] = r.cut_short;
    if (r.throttled_share >= 0) {
      j["throttled_share"] = r.throttled_share;
      j["sm_clock_min_mhz"] = r.sm_clock_min_mhz;
      j["sm_clock_max_mhz"] = r.sm_clock_max_mhz;
      j["throttle_reasons"] = clock_reason_names(r.clock_reasons);
    }
  }
  return j;
}

std::string disturbance_text(const Row& r) {
  std::ostringstream out;
  if (r.throttled_share >= 0) {
    out << "the GPU was throttled " << static_cast<int>(100 * r.throttled_share + 0.5) << "% of the time";
    const auto names = clock_reason_names(r.clock_reasons & kDisturbingClockReasons);
    for (std::size_t k = 0; k < names.size(); ++k)
      out << (k ? ", " : " (") << names[k] << (k + 1 == names.size() ? ")" : "");
    if (r.sm_clock_min_mhz != r.sm_clock_max_mhz)
      out << ", SM clock " << r.sm_clock_min_mhz << "-" << r.sm_clock_max_mhz << " MHz";
    return out.str();
  }
  out << "other processes used " << static_cast<int>(100 * std::max(r.others_share, 0.0) + 0.5) << "% of the CPUs";
  return out.str();
}

json to_json(const Results& results) {
  json rows = json::array();
  for (const auto& r : results.rows) rows.push_back(row_to_json(r));
  json pairs = json::array();
  for (const auto& p : results.pairs) {
    json pair = {{"stage", p.stage},
                 {"label", p.label},
                 {"baseline", p.baseline},
                 {"improved", p.improved},
                 {"kind", p.kind},
                 {"ratio", p.ratio.ratio},
                 {"ci_low", p.ratio.ci_low},
                 {"ci_high", p.ratio.ci_high},
                 {"ci_level", p.ratio.ci_level},
                 {"baseline_median_ns", p.baseline_ns},
                 {"improved_median_ns", p.improved_ns}};
    if (p.moved_out)
      pair["moved_out"] = {
          {"what", p.moved_out->what},       {"counter", p.moved_out->counter},   {"ns_per_call", p.moved_out->ns_per_call},
          {"ns_each", p.moved_out->ns_each}, {"paid_per", p.moved_out->paid_per}, {"call", p.moved_out->call}};
    if (p.predicted)
      pair["predicted"] = {{"counter", p.predicted->counter},
                           {"improved_ns", p.predicted->improved_ns},
                           {"ratio", p.predicted->ratio}};
    if (p.rounds > 0) pair["rounds"] = p.rounds;
    pairs.push_back(std::move(pair));
  }
  json withheld = json::array();
  for (const auto& w : results.withheld_pairs)
    withheld.push_back(
        {{"stage", w.stage}, {"label", w.label}, {"baseline", w.baseline}, {"improved", w.improved}, {"why", w.why}});
  json context = results.context;
  json peaks = json::object();
  for (const auto& [key, peak] : results.peaks) {
    peaks[key] = {{"value", peak.value}, {"unit", peak.unit}, {"benchmark", peak.benchmark}};
    if (!peak.configuration.empty()) peaks[key]["configuration"] = peak.configuration;
    if (peak.own_samples_value > 0) peaks[key]["own_samples_value"] = peak.own_samples_value;
  }
  context["peaks"] = peaks;
  return json{{"schema", results_schema},
              {"context", context},
              {"benchmarks", rows},
              {"pairs", pairs},
              {"pairs_withheld", withheld}};
}

template <class T>
static T field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) throw std::runtime_error(where + ": missing \"" + key + "\"");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw std::runtime_error(where + ": \"" + key + "\" has the wrong type");
  }
}

// A passed row's samples, summary and what was noted while it was measured.
static void read_timed_row(const json& j, const std::string& where, Row& r) {
  r.iterations = field<int64_t>(j, "iterations", where);
  r.samples_ns = field<std::vector<double>>(j, "samples_ns", where);
  if (r.samples_ns.empty()) throw std::runtime_error(where + ": passed but has no samples");
  r.summary.n = r.samples_ns.size();
  r.summary.median = field<double>(j, "median_ns", where);
  r.summary.ci_low = field<double>(j, "ci_low_ns", where);
  r.summary.ci_high = field<double>(j, "ci_high_ns", where);
  r.summary.ci_level = field<double>(j, "ci_level", where);
  r.summary.noisy = field<bool>(j, "noisy", where);
  r.interrupted = j.value("interrupted", std::string());
  r.summary.rel_half_width = r.summary.median > 0 ? (r.summary.ci_high - r.summary.ci_low) / (2 * r.summary.median) : 0;
  if (j.contains("pct_of_peak")) r.pct_of_peak = j["pct_of_peak"].get<double>();
  r.pct_note = j.value("pct_of_peak_note", std::string());
  r.configuration = j.value("configuration", std::string());
  r.interleaved_with = j.value("interleaved_with", std::vector<std::string>{});
  r.others_share = j.value("others_cpu_share", -1.0);
  r.disturbed = j.value("disturbed", false);
  r.retaken = j.value("retaken_samples", 0);
  r.cut_short = j.value("cut_short", std::string());
  r.throttled_share = j.value("throttled_share", -1.0);
  r.sm_clock_min_mhz = j.value("sm_clock_min_mhz", 0);
  r.sm_clock_max_mhz = j.value("sm_clock_max_mhz", 0);
  r.clock_reasons = clock_reasons_from_names(j.value("throttle_reasons", std::vector<std::string>{}));
}

static Row row_from_json(const json& j) {
  Row r;
  r.name = field<std::string>(j, "name", "benchmark");
  const std::string where = "benchmark " + r.name;
  r.stage = field<std::string>(j, "stage", where);
  r.variant = field<std::string>(j, "variant", where);
  r.backend = field<std::string>(j, "backend", where);
  const json problem = field<json>(j, "problem", where);
  if (!problem.is_object()) throw std::runtime_error(where + ": \"problem\" is not an object");
  for (const auto& [k, v] : problem.items()) {
    if (!v.is_string()) throw std::runtime_error(where + ": problem." + k + " is not a string");
    r.problem.emplace_back(k, v.get<std::string>());
  }
  const std::string disposition = field<std::string>(j, "disposition", where);
  try {
    r.disposition = disposition_from_string(disposition);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(where + ": " + e.what());
  }
  r.reason = j.value("reason", std::string());
  r.max_error = j.contains("max_error") && j["max_error"].is_number() ? j["max_error"].get<double>() : INFINITY;
  r.mode = j.value("mode", std::string("hot"));
  r.batch = j.value("batch", int64_t{1});
  r.bytes = j.value("bytes", 0.0);
  r.flops = j.value("flops", 0.0);
  r.bound = j.value("bound", std::string("memory"));
  r.peak_key = j.value("peak_key", std::string());
  r.footprint = j.value("footprint_bytes", r.bytes);
  if (j.contains("counters")) {
    if (!j["counters"].is_object()) throw std::runtime_error(where + ": \"counters\" is not an object");
    for (const auto& [k, v] : j["counters"].items()) {
      if (!v.is_number()) throw std::runtime_error(where + ": counters." + k + " is not a number");
      r.counters.emplace_back(k, v.get<double>());
    }
  }
  if (r.disposition == Disposition::passed) read_timed_row(j, where, r);
  return r;
}

static PairRow pair_from_json(const json& j) {
  PairRow p;
  p.stage = field<std::string>(j, "stage", "pair");
  p.label = field<std::string>(j, "label", "pair");
  p.baseline = field<std::string>(j, "baseline", "pair " + p.label);
  p.improved = field<std::string>(j, "improved", "pair " + p.label);
  const std::string where = "pair " + p.label;
  p.ratio = RatioEstimate{field<double>(j, "ratio", where), field<double>(j, "ci_low", where),
                          field<double>(j, "ci_high", where), field<double>(j, "ci_level", where)};
  // Files written before pairs had kinds hold timed ratios only, and no medians.
  p.kind = j.value("kind", std::string("timed"));
  if (p.kind != "timed" && p.kind != "amortised")
    throw std::runtime_error(where + ": kind '" + p.kind + "' (timed, amortised)");
  p.baseline_ns = j.value("baseline_median_ns", 0.0);
  p.improved_ns = j.value("improved_median_ns", 0.0);
  p.rounds = j.value("rounds", 0);
  if (j.contains("moved_out")) {
    const json& m = j["moved_out"];
    const std::string in = where + " moved_out";
    p.moved_out = MovedOut{field<std::string>(m, "what", in),   field<std::string>(m, "counter", in),
                           field<double>(m, "ns_per_call", in), m.value("ns_each", 0.0),
                           m.value("paid_per", std::string()),  m.value("call", std::string())};
  }
  if (p.kind == "amortised" && !p.moved_out)
    throw std::runtime_error(where + ": an amortised ratio without the cost it amortises (\"moved_out\")");
  if (j.contains("predicted")) {
    const json& m = j["predicted"];
    const std::string in = where + " predicted";
    p.predicted = Prediction{field<std::string>(m, "counter", in), field<double>(m, "improved_ns", in),
                             field<double>(m, "ratio", in)};
  }
  return p;
}

Results results_from_json(const json& doc) {
  if (!doc.is_object()) throw std::runtime_error("not a JSON object");
  const auto schema = doc.value("schema", std::string());
  if (schema != results_schema) throw std::runtime_error("schema is '" + schema + "', expected '" + results_schema + "'");
  Results results;
  results.context = field<json>(doc, "context", "document");
  if (results.context.contains("peaks")) {
    for (const auto& [key, p] : results.context["peaks"].items())
      results.peaks[key] = PeakValue{field<double>(p, "value", "peak " + key), field<std::string>(p, "unit", "peak " + key),
                                     field<std::string>(p, "benchmark", "peak " + key),
                                     p.value("configuration", std::string()), p.value("own_samples_value", 0.0)};
    results.context.erase("peaks");
  }
  const json rows = field<json>(doc, "benchmarks", "document");
  if (!rows.is_array()) throw std::runtime_error("\"benchmarks\" is not an array");
  for (const auto& j : rows) results.rows.push_back(row_from_json(j));
  for (const auto& j : doc.value("pairs", json::array())) results.pairs.push_back(pair_from_json(j));
  for (const auto& j : doc.value("pairs_withheld", json::array()))
    results.withheld_pairs.push_back(WithheldPair{j.value("stage", std::string()), j.value("label", std::string()),
                                                  j.value("baseline", std::string()), j.value("improved", std::string()),
                                                  j.value("why", std::string())});
  return results;
}

// ---- text forms --------------------------------------------------------------------------------

Format format_from_string(const std::string& name) {
  if (name == "console") return Format::console;
  if (name == "json") return Format::json;
  if (name == "csv") return Format::csv;
  if (name == "md") return Format::md;
  throw UsageError("unknown format '" + name + "' (console, json, csv, md)");
}

static std::string human_time(double ns) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(ns < 10 ? 2 : 1);
  if (ns < 1e3) out << ns << " ns";
  else if (ns < 1e6) out << ns / 1e3 << " us";
  else if (ns < 1e9) out << ns / 1e6 << " ms";
  else out << ns / 1e9 << " s";
  return out.str();
}

static std::string human_rate(const Row& r) {
  if (!r.timed()) return "";
  std::ostringstream out;
  out << std::fixed << std::setprecision(2);
  if (r.bound == "compute") {
    const double tflops = r.tflop_per_s();
    if (tflops >= 1) out << tflops << " TFLOP/s";
    else out << tflops * 1e3 << " GFLOP/s";
  } else if (r.bytes > 0) {
    out << r.gb_per_s() << " GB/s";
  }
  return out.str();
}

static std::string fixed(double v, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

// Whole numbers as they are, the rest with 4 significant digits (a residual of 1e-7 stays visible).
std::string counter_text(double v) {
  if ((v == std::floor(v) || std::abs(v) >= 1000) && std::abs(v) < 1e15) return fixed(v, 0);
  std::ostringstream out;
  out << std::setprecision(4) << v;
  return out.str();
}

static std::string result_word(const Row& r) {
  if (r.disposition != Disposition::passed) return to_string(r.disposition);
  if (!r.interrupted.empty()) return "passed (interrupted)";
  if (r.disturbed) return "passed (disturbed)";
  if (!r.cut_short.empty()) return "passed (cut short)";
  return r.summary.noisy ? "passed (noisy)" : "passed";
}

static std::string ratio_text(const RatioEstimate& r) {
  return fixed(r.ratio, 2) + "x (" + fixed(100 * r.ci_level, 0) + "% CI " + fixed(r.ci_low, 2) + "-" + fixed(r.ci_high, 2) +
         ")";
}

// The variant id in a benchmark name "stage/backend/variant/problem".
static std::string variant_of(const std::string& name) {
  const std::size_t a = name.find('/'), b = a == std::string::npos ? a : name.find('/', a + 1);
  if (b == std::string::npos) return name;
  const std::size_t c = name.find('/', b + 1);
  return name.substr(b + 1, c == std::string::npos ? std::string::npos : c - b - 1);
}

// A timed pair: its ratio. An amortised one says what was moved out of the loop and what it costs
// per call, so that the ratio is read as what it is:
//   "slab build 27.9 ms per epoch (218.0 us per batch amortised) + 11.9 ns per batch timed vs
//    per_sample 106.0 us per batch: 0.49x (95% CI 0.48-0.49) amortised".
// A model's prediction follows the measured ratio.
static std::string pair_text(const PairRow& p) {
  std::string text;
  if (p.kind == "amortised" && p.moved_out) {
    const MovedOut& m = *p.moved_out;
    const std::string per_call = m.call.empty() ? std::string(" per call") : " per " + m.call;
    text = m.what + " ";
    if (m.ns_each > 0) text += human_time(m.ns_each) + (m.paid_per.empty() ? "" : " per " + m.paid_per) + " (";
    text += human_time(m.ns_per_call) + per_call + " amortised" + (m.ns_each > 0 ? ")" : "");
    if (p.improved_ns > 0) text += " + " + human_time(p.improved_ns) + per_call + " timed";
    if (p.baseline_ns > 0) text += " vs " + variant_of(p.baseline) + " " + human_time(p.baseline_ns) + per_call;
    text += ": " + ratio_text(p.ratio) + " amortised";
  } else {
    text = ratio_text(p.ratio);
  }
  if (p.predicted)
    text += "; the model (" + p.predicted->counter + " " + human_time(p.predicted->improved_ns) + ") predicts " +
            fixed(p.predicted->ratio, 2) + "x";
  return text;
}

// The problem part of a pair's benchmark name: the pairs table names each problem once.
static std::string problem_of(const std::string& name) {
  std::size_t slash = 0;
  for (int i = 0; i < 3 && slash != std::string::npos; ++i) slash = name.find('/', slash + (i ? 1 : 0));
  return slash == std::string::npos ? "" : name.substr(slash + 1);
}

std::string pair_title(const std::string& stage, const std::string& label) {
  // The label's first word, up to a space or a colon: "AdamW" of "AdamW: fused vs per-tensor".
  const std::string first = label.substr(0, label.find_first_of(" :"));
  auto lower = [](std::string t) {
    for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return t;
  };
  return lower(first) == lower(stage) ? label : stage + " " + label;
}

// A row's % of peak, or why it has none ("cache", "above peak"), or "-".
static std::string pct_text(const Row& r, int digits) {
  if (r.pct_of_peak) return fixed(*r.pct_of_peak, digits);
  return r.pct_note.empty() ? std::string("-") : r.pct_note;
}

static std::string render_console(const Results& results) {
  std::size_t width = 9;
  for (const auto& r : results.rows) width = std::max(width, r.name.size());
  std::ostringstream out;
  out << std::left << std::setw(static_cast<int>(width)) << "benchmark"
      << "  " << std::setw(15) << "result" << std::right << std::setw(11) << "median" << std::setw(9) << "+-CI"
      << std::setw(16) << "rate" << std::setw(12) << "% peak"
      << "\n";
  for (const auto& r : results.rows) {
    out << std::left << std::setw(static_cast<int>(width)) << r.name << "  " << std::setw(15) << result_word(r);
    if (r.timed()) {
      out << std::right << std::setw(11) << human_time(r.summary.median) << std::setw(8)
          << fixed(100 * r.summary.rel_half_width, 1) << "%" << std::setw(16) << human_rate(r) << std::setw(12)
          << pct_text(r, 1);
      for (const auto& [k, v] : r.counters) out << "  " << k << "=" << counter_text(v);
    } else {
      out << r.reason;
    }
    out << "\n";
  }
  if (!results.pairs.empty() || !results.withheld_pairs.empty()) {
    out << "\nPairs: baseline time / improved time (> 1: the improved variant is faster)\n";
    for (const auto& p : results.pairs)
      out << "  " << pair_title(p.stage, p.label) << " [" << problem_of(p.improved) << "]: " << pair_text(p) << "\n";
    for (const auto& w : results.withheld_pairs)
      out << "  " << pair_title(w.stage, w.label) << " [" << problem_of(w.improved) << "]: no ratio: " << w.why << "\n";
  }
  std::vector<const Row*> cut;
  for (const auto& r : results.rows)
    if (!r.cut_short.empty()) cut.push_back(&r);
  if (!cut.empty()) {
    out << "\nCut short by --max-time (fewer samples, wider intervals):\n";
    for (const Row* r : cut) out << "  " << r->name << ": " << r->cut_short << "\n";
  }
  if (!results.peaks.empty()) {
    out << "\nMeasured peaks (every % peak above is of these):\n";
    for (const auto& [key, peak] : results.peaks)
      out << "  " << std::left << std::setw(20) << key
          << (peak.unit == "FLOP/s" ? fixed(peak.value * 1e-12, 2) + " TFLOP/s" : fixed(peak.value * 1e-9, 2) + " GB/s")
          << (peak.configuration.empty() ? "" : "  by " + peak.configuration) << "\n"
          << (peak.own_samples_value > 0 ? "      (set by " + peak.benchmark + "; the peak row's own samples reached only " +
                                               fixed(peak.own_samples_value / peak.value, 3) +
                                               "x of it: slowed while they were timed, or a slower way than its best)\n"
                                         : "");
    if (results.context.contains("cache_thresholds"))
      for (const auto& [backend, threshold] : results.context["cache_thresholds"].items())
        out << "  " << std::left << std::setw(20) << ("cache, " + backend + " rows") << "below "
            << fixed(threshold.value("bytes", 0.0) / (1 << 20), 1)
            << " MiB of working set: " << threshold.value("how", std::string()) << "\n";
  }
  return out.str();
}

static std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

static std::string render_csv(const Results& results) {
  std::ostringstream out;
  out << "name,stage,backend,variant,problem,disposition,reason,median_ns,ci_low_ns,ci_high_ns,ci_level,noisy,"
         "batch,bytes,flops,gb_per_s,tflop_per_s,pct_of_peak,peak_key\n";
  out << std::setprecision(10);
  for (const auto& r : results.rows) {
    std::string problem;
    for (const auto& [k, v] : r.problem) problem += (problem.empty() ? "" : ";") + k + "=" + v;
    out << csv_field(r.name) << "," << r.stage << "," << r.backend << "," << r.variant << "," << csv_field(problem) << ","
        << r.disposition << "," << csv_field(r.reason) << ",";
    if (r.timed())
      out << r.summary.median << "," << r.summary.ci_low << "," << r.summary.ci_high << "," << r.summary.ci_level << ","
          << (r.summary.noisy ? "true" : "false");
    else out << ",,,,";
    out << "," << r.batch << "," << r.bytes << "," << r.flops << ",";
    if (r.timed()) out << r.gb_per_s() << "," << r.tflop_per_s();
    else out << ",";
    out << "," << (r.pct_of_peak ? fixed(*r.pct_of_peak, 2) : "") << "," << r.peak_key << "\n";
  }
  return out.str();
}

static std::string md_cell(std::string s) {
  for (std::size_t at = s.find('|'); at != std::string::npos; at = s.find('|', at + 2)) s.replace(at, 1, "\\|");
  return s;
}

static std::string render_md(const Results& results) {
  std::ostringstream out;
  out << "| benchmark | result | median | ±CI | rate | % peak |\n|---|---|---:|---:|---:|---:|\n";
  for (const auto& r : results.rows) {
    out << "| `" << r.name << "` | "
        << md_cell(r.disposition == Disposition::passed ? result_word(r) : to_string(r.disposition) + (": " + r.reason))
        << " | ";
    if (r.timed())
      out << human_time(r.summary.median) << " | " << fixed(100 * r.summary.rel_half_width, 1) << "% | " << human_rate(r)
          << " | " << pct_text(r, 1) << " |\n";
    else out << " | | | |\n";
  }
  if (!results.pairs.empty()) {
    out << "\n| pair | problem | baseline / improved |\n|---|---|---:|\n";
    for (const auto& p : results.pairs)
      out << "| " << md_cell(pair_title(p.stage, p.label)) << " | `" << problem_of(p.improved) << "` | " << pair_text(p)
          << " |\n";
  }
  return out.str();
}

std::string render(const Results& results, Format format) {
  switch (format) {
    case Format::json:
      return to_json(results).dump(2) + "\n";
    case Format::csv:
      return render_csv(results);
    case Format::md:
      return render_md(results);
    case Format::console:
      return render_console(results);
  }
  return "";
}

}  // namespace tb
