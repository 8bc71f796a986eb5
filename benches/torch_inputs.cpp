// The inputs of the torch rows, drawn by the stages' own generators: scripts/torch-peers reads them
// instead of keeping a Python copy of each generator (and tests to keep the copies equal).
#include <filesystem>
#include <map>

#include "adamw/param_set.h"
#include "cg/cg.h"
#include "collate/collate.h"
#include "hostsync/hostsync.h"
#include "launch/launch.h"
#include "runtime/defaults.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/registry.h"
#include "runtime/tolerance.h"
#include "spmv/laplacian.h"
#include "step/resolved.h"
#include "step/step.h"
#include "step/trainer.h"
#include "torch_rows.h"

namespace tb {

namespace fs = std::filesystem;

namespace {

template <class T>
const char* dtype_name();
template <>
const char* dtype_name<int32_t>() {
  return "int32";
}
template <>
const char* dtype_name<int64_t>() {
  return "int64";
}
template <>
const char* dtype_name<float>() {
  return "float32";
}
template <>
const char* dtype_name<double>() {
  return "float64";
}

// Writes each array once (rows at the same problem share their inputs) as raw native-endian values,
// the layout numpy.fromfile reads, and describes it for the listing: {"file", "dtype", "shape"}.
class InputWriter {
 public:
  explicit InputWriter(fs::path dir) : dir_(std::move(dir)) { fs::create_directories(dir_); }

  template <class T>
  nlohmann::json add(const std::string& key, std::vector<int64_t> shape, const T* values) {
    if (const auto it = written_.find(key); it != written_.end()) return it->second;
    std::size_t count = 1;
    for (const int64_t n : shape) count *= static_cast<std::size_t>(n);
    const std::string file = write(key, ".bin", values, sizeof(T) * count);
    return written_[key] = {{"file", file}, {"dtype", dtype_name<T>()}, {"shape", shape}};
  }

  // A JSON document (torch_inputs.read_document), described as {"file", "format": "json"}.
  template <class Json>
  nlohmann::json add_document(const std::string& key, const Json& doc) {
    if (const auto it = written_.find(key); it != written_.end()) return it->second;
    const std::string text = doc.dump() + "\n";
    return written_[key] = {{"file", write(key, ".json", text.data(), text.size())}, {"format", "json"}};
  }

 private:
  // `bytes` into the file named after `key`, whole or not at all, never through a symlink planted in
  // the folder (a --torch-inputs DIR anyone could write in); its name.
  std::string write(const std::string& key, const char* extension, const void* bytes, std::size_t size) {
    const std::string file = safe_file_name(key) + extension;
    write_file_atomically((dir_ / file).string(), std::string(static_cast<const char*>(bytes), size));
    return file;
  }

  fs::path dir_;
  std::map<std::string, nlohmann::json> written_;
};

// The stage's A = I + alpha L in CSR (spmv at the default alpha, cg at its axis).
void add_laplacian(InputWriter& w, const Problem& p, nlohmann::json& inputs) {
  const double alpha = p.has("alpha") ? p.get_double("alpha") : defaults::laplacian_alpha;
  const std::string key = "laplacian-" + p.get("graph") + "-" + p.get("rows") + "-" + std::to_string(alpha);
  const laplacian::Csr a = laplacian::build_shifted_laplacian(laplacian::Graph(laplacian::parse_graph(p.get("graph")),
                                                                               p.get_int("rows")),
                                                              alpha);
  inputs["row_ptr"] = w.add(key + "-row_ptr", {a.n + 1}, a.row_ptr.data());
  inputs["col"] = w.add(key + "-col", {a.nnz}, a.col.data());
  inputs["val"] = w.add(key + "-val", {a.nnz}, a.val.data());
}

// What the PyTorch case of `stage` reads, at `p`.
nlohmann::json stage_inputs(InputWriter& w, const std::string& stage, const Problem& p) {
  nlohmann::json inputs = nlohmann::json::object();
  if (stage == "adamw" || stage == "gradnorm") {
    const adamw::ParamSet set = adamw::make_param_set(p.get_int("params"), p.get_int("tensors"));
    inputs["tensor_sizes"] = w.add("param_set-" + p.get("params") + "-" + p.get("tensors"), {set.count()}, set.sizes.data());
  } else if (stage == "spmv") {
    add_laplacian(w, p, inputs);
  } else if (stage == "cg") {
    add_laplacian(w, p, inputs);
    const cg::Settings s = cg::settings_of(p);
    const cg::RhsSequence rhs(s.rows, s.drift, s.window);
    inputs["rhs"] = w.add("cg_rhs-" + p.get("rows") + "-" + p.get("drift") + "-" + std::to_string(s.window),
                          {s.window + 1, s.rows}, rhs.b(0));
  } else if (stage == "collate") {
    const collate::Shape shape = collate::shape_of(p);
    const std::vector<int64_t> order = collate::epoch_order(shape);
    inputs["order"] = w.add("collate_order-" + p.get("samples") + "-" + p.get("order"), {shape.samples}, order.data());
  } else if (stage == "hostsync") {
    const int64_t steps = p.get_int("steps"), elements = p.get_int("elements");
    std::vector<float> predictions(static_cast<std::size_t>(steps * elements)), targets(static_cast<std::size_t>(elements));
    for (int64_t s = 0; s < steps; ++s)
      for (int64_t i = 0; i < elements; ++i)
        predictions[static_cast<std::size_t>(s * elements + i)] = hostsync::prediction(s, i, elements);
    for (int64_t i = 0; i < elements; ++i) targets[static_cast<std::size_t>(i)] = hostsync::target(i);
    const hostsync::Sums sums = hostsync::metric_sums(steps, elements);
    const std::string key = "hostsync-" + p.get("steps") + "-" + p.get("elements");
    inputs["predictions"] = w.add(key + "-predictions", {steps, elements}, predictions.data());
    inputs["targets"] = w.add(key + "-targets", {elements}, targets.data());
    inputs["metric_sums"] = w.add(key + "-metric_sums", {hostsync::metric_count}, sums.v);
  } else if (stage == "launch") {
    // Per kernel (dst, src, a): the PyTorch case's lerp_ weight is 1 - a, a convex combination as the
    // stage's a dst + b src + c keeps its state bounded.
    std::vector<double> window;
    for (const launch::WindowKernel& k : launch::build_window(p.get_int("steps"), p.get_int("kernels_per_step")))
      window.insert(window.end(), {double(k.dst), double(k.src), double(k.a)});
    inputs["window"] = w.add("launch_window-" + p.get("steps") + "-" + p.get("kernels_per_step"),
                             {static_cast<int64_t>(window.size() / 3), 3}, window.data());
  } else if (stage == "step") {
    // The twin is built from the workload as the step resolves it, and its first step is checked as the
    // step's own (check_first_losses): the first sequence's per-token losses against the double forward.
    const std::string name = p.has("cpu_workload") ? p.get("cpu_workload") : p.get("workload");
    const step::Workload workload = step::load_workload(name);
    const int32_t first = step::first_sample_of(workload.data.samples);
    const Tolerance tol = workload.switches.bf16_matmuls ? tolerance::step_bf16 : tolerance::step_fp32;
    nlohmann::ordered_json doc{
        {"resolved", step::resolved_workload(workload)},
        {"reference",
         {{"sample", first}, {"losses", step::reference_losses(workload, first)}, {"rtol", tol.rtol}, {"atol", tol.atol}}}};
    inputs["step"] = w.add_document("step-" + name, doc);
  }
  return inputs;
}

}  // namespace

void attach_torch_inputs(nlohmann::json& listing, const std::string& dir) {
  if (!listing.is_object() || !listing.contains("torch") || !listing["torch"].contains("rows"))
    throw UsageError(
        "--torch-inputs: the listing has no PyTorch rows (make it with --backend cpu,torch --list --format json)");
  InputWriter writer(dir);
  for (auto& row : listing["torch"]["rows"]) {
    std::vector<std::pair<std::string, std::string>> params;
    for (const auto& [key, value] : row.at("problem").items()) params.emplace_back(key, value.get<std::string>());
    row["inputs"] = stage_inputs(writer, row.at("stage").get<std::string>(), Problem(params));
  }
  listing["torch"]["inputs_dir"] = fs::absolute(dir).string();
}

}  // namespace tb
