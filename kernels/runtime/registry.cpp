#include "registry.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <stdexcept>

#include "error.h"

namespace tb {

const char* to_string(Backend backend) { return backend == Backend::cuda ? "cuda" : "cpu"; }

Backend backend_from_string(const std::string& name) {
  if (name == "cpu") return Backend::cpu;
  if (name == "cuda") return Backend::cuda;
  throw UsageError("unknown backend '" + name + "' (cpu, cuda)");
}

bool parse_number(const std::string& text, double& value) {
  if (text.empty()) return false;
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(value);
}

void Problem::set(const std::string& key, const std::string& value) {
  for (auto& [k, v] : params_) {
    if (k == key) {
      v = value;
      return;
    }
  }
  params_.emplace_back(key, value);
}

bool Problem::has(const std::string& key) const {
  for (const auto& kv : params_)
    if (kv.first == key) return true;
  return false;
}

const std::string& Problem::get(const std::string& key) const {
  for (const auto& kv : params_)
    if (kv.first == key) return kv.second;
  throw std::out_of_range("problem has no parameter '" + key + "' (" + label() + ")");
}

double Problem::get_double(const std::string& key) const {
  double value = 0;
  if (!parse_number(get(key), value)) throw UsageError("parameter " + key + "=" + get(key) + " is not a number");
  return value;
}

int64_t Problem::get_int(const std::string& key) const {
  const double value = get_double(key);
  if (value != std::floor(value) || std::abs(value) > 9.0e15)
    throw UsageError("parameter " + key + "=" + get(key) + " is not an integer");
  return static_cast<int64_t>(value);
}

std::string Problem::label() const {
  std::string out;
  for (const auto& [k, v] : params_) {
    if (!out.empty()) out += ',';
    out += k + '=' + v;
  }
  return out;
}

std::string Axis::invalid_reason(const std::string& value) const {
  double number = 0;
  switch (kind) {
    case AxisKind::choice:
      for (const auto& c : choices)
        if (c == value) return "";
      {
        std::string all;
        for (const auto& c : choices) all += (all.empty() ? "" : ", ") + c;
        return "must be one of: " + all;
      }
    case AxisKind::number:
      return parse_number(value, number) ? "" : "is not a number";
    case AxisKind::text:
      return validate ? validate(value) : "";
    case AxisKind::positive_int:
      if (!parse_number(value, number)) return "is not a number";
      if (number != std::floor(number)) return "is not an integer";
      if (number < 1) return "must be at least 1";
      if (number > 9.0e15) return "is too large";
      return "";
  }
  return "";
}

const Axis* Stage::find_axis(const std::string& axis_name) const {
  for (const auto& axis : axes)
    if (axis.name == axis_name) return &axis;
  return nullptr;
}

const Variant* Stage::find_variant(const std::string& id, Backend backend) const {
  for (const auto& v : variants)
    if (v.id == id && v.backend == backend) return &v;
  return nullptr;
}

void Registry::add(Stage stage) {
  if (find(stage.name)) throw std::logic_error("stage '" + stage.name + "' registered twice");
  std::set<std::string> seen;
  for (const auto& v : stage.variants) {
    const std::string key = v.id + "/" + to_string(v.backend);
    if (!seen.insert(key).second) throw std::logic_error("stage " + stage.name + ": variant " + key + " registered twice");
    if (!v.work) throw std::logic_error("stage " + stage.name + ": variant " + key + " has no work model");
    for (const auto& a : v.axes)
      if (!stage.find_axis(a))
        throw std::logic_error("stage " + stage.name + ": variant " + key + " uses unknown axis " + a);
  }
  for (const auto& axis : stage.axes)
    for (const auto* list : {&axis.values, &axis.quick_values})
      for (const auto& value : *list)
        if (const auto why = axis.invalid_reason(value); !why.empty())
          throw std::logic_error("stage " + stage.name + ": default " + axis.name + "=" + value + " " + why);
  for (const auto& p : stage.pairs) {
    bool found = false;
    for (Backend b : {Backend::cpu, Backend::cuda})
      found = found || (stage.find_variant(p.baseline, b) && stage.find_variant(p.improved, b));
    if (!found)
      throw std::logic_error("stage " + stage.name + ": pair " + p.label + " names variants that share no backend");
  }
  stages_.push_back(std::move(stage));
}

const Stage* Registry::find(const std::string& stage_name) const {
  for (const auto& s : stages_)
    if (s.name == stage_name) return &s;
  return nullptr;
}

static std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!text.empty() && text.back() == sep) parts.emplace_back();
  return parts;
}

// Two spellings of one problem: the same text, or for a numeric axis the same number ("5", "5e0").
static bool same_value(const Axis& axis, const std::string& a, const std::string& b) {
  if (a == b) return true;
  if (axis.kind != AxisKind::number && axis.kind != AxisKind::positive_int) return false;
  double x = 0, y = 0;
  return parse_number(a, x) && parse_number(b, y) && x == y;
}

AxisOverride parse_axis_override(const Registry& registry, const std::string& text) {
  const auto eq = text.find('=');
  const auto dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw UsageError("--axis '" + text + "': expected STAGE.AXIS=V1[,V2...], e.g. peak.n=1000000");
  AxisOverride o{text.substr(0, dot), text.substr(dot + 1, eq - dot - 1), split(text.substr(eq + 1), ',')};
  const Stage* stage = registry.find(o.stage);
  if (!stage) {
    std::string all;
    for (const auto& s : registry.stages()) all += (all.empty() ? "" : ", ") + s.name;
    throw UsageError("--axis '" + text + "': no stage '" + o.stage + "' (stages: " + all + ")");
  }
  const Axis* axis = stage->find_axis(o.axis);
  if (!axis) {
    std::string all;
    for (const auto& a : stage->axes) all += (all.empty() ? "" : ", ") + a.name;
    throw UsageError("--axis '" + text + "': stage " + o.stage + " has no axis '" + o.axis +
                     "' (axes: " + (all.empty() ? "none" : all) + ")");
  }
  if (o.values.empty()) throw UsageError("--axis '" + text + "': no values");
  for (const auto& v : o.values)
    if (const auto why = axis->invalid_reason(v); !why.empty())
      throw UsageError("--axis '" + text + "': " + o.axis + "=" + v + " " + why);
  std::vector<std::string> once;
  for (const auto& v : o.values) {
    const bool seen = std::any_of(once.begin(), once.end(),
                                  [&](const std::string& kept) { return same_value(*axis, kept, v); });
    (seen ? o.repeated : once).push_back(v);
  }
  o.values = std::move(once);
  return o;
}

std::vector<Problem> expand_problems(const Stage& stage, const Variant& variant, const std::vector<AxisOverride>& overrides,
                                     bool quick) {
  std::vector<Problem> problems{Problem{}};
  for (const auto& axis_name : variant.axes) {
    const Axis& axis = *stage.find_axis(axis_name);
    const std::vector<std::string>* values = quick && !axis.quick_values.empty() ? &axis.quick_values : &axis.values;
    for (const auto& o : overrides)
      if (o.stage == stage.name && o.axis == axis_name) values = &o.values;
    std::vector<Problem> next;
    for (const auto& p : problems)
      for (const auto& v : *values) {
        Problem q = p;
        q.set(axis_name, v);
        next.push_back(std::move(q));
      }
    problems = std::move(next);
  }
  return problems;
}

std::string benchmark_name(const Stage& stage, const Variant& variant, const Problem& problem) {
  std::string name = stage.name + "/" + to_string(variant.backend) + "/" + variant.id;
  const std::string label = problem.label();
  return label.empty() ? name : name + "/" + label;
}

}  // namespace tb
