#include "workload.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "runtime/error.h"
#include "runtime/json_fields.h"
#include "runtime/registry.h"

namespace tb::step {

namespace fs = std::filesystem;

namespace {

class Parser {
 public:
  explicit Parser(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const YAML::Node& at, const std::string& what) const {
    const YAML::Mark m = at.Mark();
    std::ostringstream msg;
    msg << path_;
    if (!m.is_null()) msg << ":" << m.line + 1 << ":" << m.column + 1;
    msg << ": " << what;
    throw UsageError(msg.str());
  }

  // yaml-cpp keeps every entry of a mapping that repeats a key and iterates them all, so a repeated key
  // would silently merge into or override the first: refused here, anywhere in the document. Nodes an
  // alias reaches again (shared, or cyclic: `&a [*a]`) are walked once.
  void no_duplicate_keys(const YAML::Node& node, std::vector<YAML::Node>& seen) const {
    if (!node.IsMap() && !node.IsSequence()) return;
    for (const auto& s : seen)
      if (s.is(node)) return;
    seen.push_back(node);
    if (node.IsSequence()) {
      for (const auto& item : node) no_duplicate_keys(item, seen);
      return;
    }
    std::map<std::string, YAML::Mark> first;
    for (const auto& kv : node) {
      if (kv.first.IsScalar()) {
        const auto [it, inserted] = first.emplace(kv.first.Scalar(), kv.first.Mark());
        if (!inserted)
          fail(kv.first,
               "duplicate key '" + kv.first.Scalar() + "' (first at line " + std::to_string(it->second.line + 1) + ")");
      }
      no_duplicate_keys(kv.second, seen);
    }
  }

  // A mapping whose keys must all be in `known`; calls `on(key, value)` for each.
  void mapping(const YAML::Node& node, const std::string& where, const std::vector<std::string>& known,
               const std::function<void(const std::string&, const YAML::Node&)>& on) const {
    if (!node.IsMap()) fail(node, where + " must be a mapping");
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) fail(kv.first, "a key in " + where + " must be a name");
      const std::string key = kv.first.Scalar();
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        fail(kv.first, "unknown key '" + key + "' in " + where + " (known: " + list + ")");
      }
      on(key, kv.second);
    }
  }

  std::string text(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) fail(n, key + " must be a single value");
    // What yaml-cpp decoded, checked again: it decodes the escapes "\_" and "\N" to single bytes (0xA0, 0x85), not
    // UTF-8, and the resolved workload is written as JSON.
    if (!json_field::is_utf8(n.Scalar())) fail(n, key + " is not UTF-8 text");
    return n.Scalar();
  }
  int64_t integer(const YAML::Node& n, const std::string& key, int64_t min) const {
    double v = 0;
    const std::string s = text(n, key);
    if (!parse_number(s, v) || v != std::floor(v) || std::abs(v) > 9e15)
      fail(n, key + " must be an integer, got '" + s + "'");
    if (v < static_cast<double>(min)) fail(n, key + " must be at least " + std::to_string(min) + ", got " + s);
    return static_cast<int64_t>(v);
  }
  double number(const YAML::Node& n, const std::string& key, double min, double max) const {
    double v = 0;
    const std::string s = text(n, key);
    if (!parse_number(s, v)) fail(n, key + " must be a number, got '" + s + "'");
    if (v < min || v > max) {
      std::ostringstream msg;
      msg << key << " must be in [" << min << ", " << max << "], got " << s;
      fail(n, msg.str());
    }
    return v;
  }
  bool boolean(const YAML::Node& n, const std::string& key) const {
    const std::string s = text(n, key);
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
    fail(n, key + " must be true or false, got '" + s + "'");
  }
  std::string choice(const YAML::Node& n, const std::string& key, const std::vector<std::string>& options) const {
    const std::string s = text(n, key);
    if (std::find(options.begin(), options.end(), s) != options.end()) return s;
    std::string list;
    for (const auto& o : options) list += (list.empty() ? "" : ", ") + o;
    fail(n, key + " must be one of " + list + ", got '" + s + "'");
  }

 private:
  std::string path_;
};

}  // namespace

// The step counts in int64 what it derives from the sizes (the parameters, a step's tokens, one micro-batch's
// attention scores per position): sizes whose products pass 9e15 (2^53, where the sizes themselves stop) are typos,
// not models, and would overflow there. Counted here in long double, before anything multiplies them.
static void refuse_counts_past_int64(const Parser& p, const Workload& w, const YAML::Node& model_node,
                                     const YAML::Node& batch_node) {
  constexpr long double most = 9e15L;
  const long double C = w.model.d_model, h = static_cast<long double>(w.model.mlp_ratio) * C, T = w.model.seq_len;
  const long double per_layer = 2 * C + C * 3 * C + 3 * C + C * C + C + 2 * C + C * h + h + h * C + C;
  const long double parameters = w.model.vocab * C + T * C + w.model.layers * per_layer + 2 * C;
  if (parameters > most) {
    std::ostringstream msg;
    msg << "the model would have " << static_cast<double>(parameters) << " parameters (at most 9e15 are counted)";
    p.fail(model_node, msg.str());
  }
  const long double tokens = static_cast<long double>(w.batch.global) * T;
  const long double scores = static_cast<long double>(w.batch.micro) * static_cast<long double>(w.model.heads) * T;
  if (tokens > most || scores > most) {
    std::ostringstream msg;
    msg << "the global batch x seq_len (" << static_cast<double>(tokens) << ") or the micro-batch x heads x seq_len ("
        << static_cast<double>(scores) << ") is past 9e15";
    p.fail(batch_node, msg.str());
  }
}

int64_t Workload::parameter_count() const {
  const int64_t C = model.d_model, h = model.mlp_ratio * C;
  const int64_t per_layer = 2 * C + C * 3 * C + 3 * C + C * C + C + 2 * C + C * h + h + h * C + C;
  return model.vocab * C + model.seq_len * C + model.layers * per_layer + 2 * C;
}

Workload parse_workload(const std::string& yaml_text, const std::string& path) {
  Parser p(path);
  // A workload's texts go into JSON (the resolved workload the PyTorch twin is built from), which takes UTF-8 only;
  // yaml-cpp checks nothing.
  if (const std::size_t bad = json_field::first_invalid_utf8(yaml_text); bad != std::string::npos) {
    const std::size_t line_start = yaml_text.rfind('\n', bad == 0 ? 0 : bad - 1);
    const std::size_t column = line_start == std::string::npos || bad == 0 ? bad : bad - line_start - 1;
    const auto line = std::count(yaml_text.begin(), yaml_text.begin() + static_cast<std::ptrdiff_t>(bad), '\n');
    throw UsageError(path + ":" + std::to_string(line + 1) + ":" + std::to_string(column + 1) +
                     ": not UTF-8 text (a YAML file is UTF-8)");
  }
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw UsageError(path + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  std::vector<YAML::Node> seen;
  p.no_duplicate_keys(root, seen);
  Workload w;
  w.path = path;
  YAML::Node model_node, batch_node, heads_node, micro_node, sync_node;
  bool has_model = false, has_batch = false;
  p.mapping(root, "the workload",
            {"name", "source", "model", "propagator", "optimizer", "data", "batch", "logging", "switches"},
            [&](const std::string& key, const YAML::Node& v) {
              if (key == "name") w.name = p.text(v, key);
              else if (key == "source") w.source = p.text(v, key);
              else if (key == "model") {
                has_model = true;
                model_node = v;
                p.mapping(v, "model", {"layers", "d_model", "heads", "seq_len", "vocab", "mlp_ratio"},
                          [&](const std::string& k, const YAML::Node& x) {
                            if (k == "layers") w.model.layers = p.integer(x, k, 1);
                            else if (k == "d_model") w.model.d_model = p.integer(x, k, 1);
                            else if (k == "heads") {
                              w.model.heads = p.integer(x, k, 1);
                              heads_node = x;
                            } else if (k == "seq_len") w.model.seq_len = p.integer(x, k, 1);
                            else if (k == "vocab") w.model.vocab = p.integer(x, k, 2);
                            else if (k == "mlp_ratio") w.model.mlp_ratio = p.integer(x, k, 1);
                          });
              } else if (key == "propagator") {
                w.propagator.enabled = true;
                p.mapping(v, "propagator", {"sparsity", "alpha", "cg_tol", "lazy_tol", "max_iters"},
                          [&](const std::string& k, const YAML::Node& x) {
                            if (k == "sparsity") {
                              w.propagator.sparsity = p.integer(x, k, 2);
                              if (w.propagator.sparsity % 2)
                                p.fail(x, "sparsity must be even (neighbours on both sides of the ring)");
                            } else if (k == "alpha") w.propagator.alpha = p.number(x, k, 0.0, 1e6);
                            else if (k == "cg_tol") w.propagator.cg_tol = p.number(x, k, 1e-14, 0.5);
                            else if (k == "lazy_tol") w.propagator.lazy_tol = p.number(x, k, 0.0, 0.5);
                            else if (k == "max_iters") w.propagator.max_iters = p.integer(x, k, 1);
                          });
              } else if (key == "optimizer") {
                p.mapping(v, "optimizer", {"variant", "lr", "weight_decay", "betas", "eps", "grad_clip"},
                          [&](const std::string& k, const YAML::Node& x) {
                            if (k == "variant") w.optimizer.variant = p.choice(x, k, {"per_tensor", "foreach", "fused"});
                            else if (k == "lr") w.optimizer.lr = p.number(x, k, 0.0, 10.0);
                            else if (k == "weight_decay") w.optimizer.weight_decay = p.number(x, k, 0.0, 10.0);
                            else if (k == "eps") w.optimizer.eps = p.number(x, k, 0.0, 1.0);
                            else if (k == "grad_clip") w.optimizer.grad_clip = p.number(x, k, 0.0, 1e9);
                            else if (k == "betas") {
                              if (!x.IsSequence() || x.size() != 2)
                                p.fail(x, "betas must be a list of two numbers, e.g. [0.9, 0.95]");
                              w.optimizer.beta1 = p.number(x[0], "betas[0]", 0.0, 0.999999);
                              w.optimizer.beta2 = p.number(x[1], "betas[1]", 0.0, 0.999999);
                            }
                          });
              } else if (key == "data") {
                p.mapping(v, "data", {"samples", "location", "per_sample_copy"},
                          [&](const std::string& k, const YAML::Node& x) {
                            if (k == "samples") w.data.samples = p.integer(x, k, 1);
                            else if (k == "location")
                              w.data.location = p.choice(x, k, {"host_pageable", "host_pinned", "device"});
                            else if (k == "per_sample_copy") w.data.per_sample_copy = p.boolean(x, k);
                          });
              } else if (key == "batch") {
                has_batch = true;
                batch_node = v;
                p.mapping(v, "batch", {"global", "micro", "global_range"}, [&](const std::string& k, const YAML::Node& x) {
                  if (k == "global") w.batch.global = p.integer(x, k, 1);
                  else if (k == "micro") {
                    w.batch.micro = p.integer(x, k, 1);
                    micro_node = x;
                  } else if (k == "global_range") {
                    if (!x.IsSequence() || x.size() != 2) p.fail(x, "global_range must be [min, max]");
                    w.batch.global_min = p.integer(x[0], "global_range[0]", 1);
                    w.batch.global_max = p.integer(x[1], "global_range[1]", 1);
                    if (w.batch.global_max < w.batch.global_min)
                      p.fail(x, "global_range must be [min, max] with min <= max");
                  }
                });
              } else if (key == "logging") {
                p.mapping(v, "logging", {"sync", "interval"}, [&](const std::string& k, const YAML::Node& x) {
                  if (k == "sync") {
                    w.logging.sync = p.choice(x, k, {"every_step", "every_n", "async"});
                    sync_node = x;
                  } else if (k == "interval") w.logging.interval = p.integer(x, k, 1);
                });
              } else if (key == "switches") {
                p.mapping(v, "switches", {"attention", "cuda_graphs", "activation_checkpointing", "bf16_matmuls", "lazy_cg"},
                          [&](const std::string& k, const YAML::Node& x) {
                            if (k == "attention") w.switches.fused_attention = p.choice(x, k, {"fused", "naive"}) == "fused";
                            else if (k == "cuda_graphs") w.switches.cuda_graphs = p.boolean(x, k);
                            else if (k == "activation_checkpointing") w.switches.activation_checkpointing = p.boolean(x, k);
                            else if (k == "bf16_matmuls") w.switches.bf16_matmuls = p.boolean(x, k);
                            else if (k == "lazy_cg") w.switches.lazy_cg = p.boolean(x, k);
                          });
              }
            });
  if (w.name.empty()) p.fail(root, "the workload needs a name");
  if (!has_model) p.fail(root, "the workload needs a model section");
  for (const auto& [key, value] : std::map<std::string, int64_t>{{"layers", w.model.layers},
                                                                 {"d_model", w.model.d_model},
                                                                 {"heads", w.model.heads},
                                                                 {"seq_len", w.model.seq_len},
                                                                 {"vocab", w.model.vocab}})
    if (value == 0) p.fail(model_node, "model." + key + " is missing");
  if (w.model.d_model % w.model.heads)
    p.fail(heads_node,
           "heads (" + std::to_string(w.model.heads) + ") must divide d_model (" + std::to_string(w.model.d_model) + ")");
  if (!has_batch || w.batch.global == 0) p.fail(has_batch ? batch_node : root, "batch.global is missing");
  if (w.batch.micro == 0) w.batch.micro = w.batch.global;
  if (w.batch.global % w.batch.micro)
    p.fail(micro_node.IsDefined() ? micro_node : batch_node, "the global batch (" + std::to_string(w.batch.global) +
                                                                 ") is not divisible by the micro-batch (" +
                                                                 std::to_string(w.batch.micro) + ")");
  if (w.propagator.enabled && w.propagator.sparsity >= w.model.d_model)
    p.fail(root["propagator"], "propagator.sparsity must be below d_model");
  if (w.logging.sync == "every_step" && w.logging.interval != 1 && sync_node.IsDefined())
    p.fail(sync_node, "sync every_step reads the loss every step; use every_n with an interval");
  refuse_counts_past_int64(p, w, model_node, batch_node);
  return w;
}

std::string workloads_dir() {
  if (const char* env = std::getenv("TRAINBENCH_WORKLOADS")) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path() / ".." / "share" / "trainbench" / "workloads";
    if (fs::is_directory(installed)) return installed.lexically_normal().string();
  }
  return TRAINBENCH_SOURCE_WORKLOADS;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(workloads_dir(), ec))
    if (entry.path().extension() == ".yaml") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Why a file cannot be read as a workload ("not found", "is a directory", "is a device", "not readable: Permission
// denied"), or "" when it can.
static std::string unreadable_reason(const fs::path& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found) return "not found";
  if (st.type() == fs::file_type::directory) return "is a directory (give a .yaml file)";
  // Read whole: /dev/zero would never end.
  if (st.type() == fs::file_type::character || st.type() == fs::file_type::block || st.type() == fs::file_type::socket)
    return "is a device, not a file (give a .yaml file)";
  if (ec) return ec.message();
  if (::access(path.c_str(), R_OK) != 0) return std::string("not readable: ") + std::strerror(errno);
  return "";
}

Workload load_workload(const std::string& name_or_path) {
  fs::path path = name_or_path;
  const bool looks_like_path = name_or_path.find('/') != std::string::npos || path.extension() == ".yaml";
  if (!looks_like_path) path = fs::path(workloads_dir()) / (name_or_path + ".yaml");
  if (looks_like_path)
    if (const std::string why = unreadable_reason(path); !why.empty())
      throw UsageError("cannot read workload file " + path.string() + ": " + why);
  std::ifstream in(path);
  if (!in) {
    if (looks_like_path) throw UsageError("cannot read workload file " + path.string() + ": " + std::strerror(errno));
    std::string all;
    for (const auto& n : preset_names()) all += (all.empty() ? "" : ", ") + n;
    throw UsageError("no workload preset '" + name_or_path + "' (presets: " + all + "; or give a .yaml file)");
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_workload(text.str(), path.string());
}

}  // namespace tb::step
