// dump_step WORKLOAD [--micro N] [--steps K] [--out FILE]: the CPU training step of a workload in
// double, written as JSON for a twin of the step in another framework (scripts/trainbench/pytorch/
// step.py) to be checked against: the workload as the C++ resolved it, the constants the step
// is built from, every parameter tensor's name, shape and initial values, the first micro-batch
// (samples, tokens, targets, per-token losses) with the gradients one forward and backward of it
// leaves, and with --steps K the K optimizer steps' losses, gradient norms, solver counts and the
// parameters after them. Tensors are flat, row-major in their shapes (weights [out][in]).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "step/cpu_ops.h"
#include "step/resolved.h"
#include "step/step.h"
#include "step/trainer.h"

namespace {

using namespace tb::step;
using json = nlohmann::ordered_json;

// name -> the tensor's values, from one flat buffer in the model's layout.
json per_tensor(const std::vector<ParameterShape>& shapes, const std::vector<TensorSpan>& spans, const double* values) {
  json out = json::object();
  for (std::size_t t = 0; t < shapes.size(); ++t)
    out[shapes[t].name] = std::vector<double>(values + spans[t].offset, values + spans[t].offset + spans[t].size);
  return out;
}

json solve_stats_json(const SolveStats& s) {
  return json{{"solves", s.solves},
              {"skipped", s.skipped},
              {"iterations", s.iterations},
              {"matvecs", s.matvecs},
              {"worst_residual", s.worst_residual}};
}

json dump(const Workload& w, int64_t steps) {
  const int64_t B = w.batch.micro, Tn = w.model.seq_len, N = B * Tn, accumulation = w.batch.accumulation();
  const double loss_scale = 1.0 / static_cast<double>(N * accumulation);  // Trainer::step's
  const std::vector<ParameterShape> shapes = parameter_shapes(w.model);

  // The samples of the step's micro-batches, as the trainer's data path picks them. With no step
  // asked for, one is run anyway (its results are not written): it says which samples come first.
  Workload read_every_step = w;  // the reads change no number, and put the loss in every report
  read_every_step.logging.sync = "every_step";
  read_every_step.logging.interval = 1;
  CpuOps<double> trainer_ops;
  Trainer<CpuOps<double>> trainer(trainer_ops, read_every_step);
  trainer.record_micro_batches(std::max<int64_t>(steps, 1) * accumulation);
  json step_reports = json::array();
  for (int64_t s = 0; s < std::max<int64_t>(steps, 1); ++s) {
    const StepReport r = trainer.step(false);
    step_reports.push_back({{"loss", r.loss}, {"grad_norm", r.grad_norm}});
  }
  const std::vector<MicroBatchLosses> recorded = trainer.recorded_micro_batches();

  // The first micro-batch on a fresh model: the state the trainer's model was in when it ran it.
  CpuOps<double> ops;
  Model<CpuOps<double>> model(ops, w.model, w.propagator, w.switches, B);
  const std::vector<double> initial(model.params.data(), model.params.data() + model.parameter_count());
  const std::vector<int32_t> dataset = make_dataset(w.data.samples, Tn, w.model.vocab);
  const std::vector<int32_t>& samples = recorded.front().samples;
  std::vector<int32_t> batch(static_cast<std::size_t>(2 * N));  // tokens [B, T], then targets [B, T]
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t) {
      const int64_t row = static_cast<int64_t>(samples[b]) * (Tn + 1);
      batch[b * Tn + t] = dataset[row + t];
      batch[N + b * Tn + t] = dataset[row + t + 1];
    }
  model.forward(batch.data(), batch.data() + N);
  const std::vector<double> losses(model.losses(), model.losses() + N);
  if (losses != recorded.front().losses)
    throw std::runtime_error("the fresh model's first micro-batch losses differ from the trainer's");
  model.backward(loss_scale);
  double loss = 0;
  for (double l : losses) loss += l;
  loss *= loss_scale;

  json parameters = json::array();
  for (std::size_t t = 0; t < shapes.size(); ++t)
    parameters.push_back({{"name", shapes[t].name}, {"shape", shapes[t].shape}, {"offset", model.tensors()[t].offset}});

  json doc = resolved_workload(w);  // schema, workload, constants
  doc.update(json{
      {"precision", "double"},
      {"parameters", parameters},
      {"initial", per_tensor(shapes, model.tensors(), initial.data())},
      {"micro_batch",
       {{"samples", samples},
        {"tokens", std::vector<int32_t>(batch.begin(), batch.begin() + N)},
        {"targets", std::vector<int32_t>(batch.begin() + N, batch.end())},
        {"losses", losses},
        {"loss_scale", loss_scale},
        {"loss", loss},
        {"solve_stats", solve_stats_json(model.solve_stats())},
        {"gradients", per_tensor(shapes, model.tensors(), model.grads.data())}}},
  });
  if (steps > 0) {
    json micro_batches = json::array();
    for (const auto& r : recorded) micro_batches.push_back(r.samples);
    Model<CpuOps<double>>& trained = trainer.model();
    doc["steps"] = {{"count", steps},
                    {"micro_batches", micro_batches},
                    {"reports", step_reports},
                    {"solve_stats", solve_stats_json(trained.solve_stats())},
                    {"parameters", per_tensor(shapes, trained.tensors(), trained.params.data())}};
  }
  return doc;
}

}  // namespace

int main(int argc, char** argv) {
  std::string workload_name, out_path;
  int64_t micro = 0, steps = 0;
  CLI::App app{"dump_step: the CPU training step of a workload in double, as JSON, for a twin to be checked against"};
  app.add_option("workload", workload_name, "a preset name or a workload .yaml file")->required();
  app.add_option("--micro", micro, "the micro-batch (default: the workload's); it must divide the global batch")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "also run this many optimizer steps and write their results (default 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{1000}));
  app.add_option("--out", out_path, "write here instead of stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "dump_step: " << e.what() << "\nRun 'dump_step --help' for the options." << std::endl;
    return 2;
  }
  try {
    Workload w = load_workload(workload_name);
    if (micro > 0) {
      if (w.batch.global % micro)
        throw tb::UsageError("--micro " + std::to_string(micro) + " does not divide the global batch (" +
                             std::to_string(w.batch.global) + ")");
      w.batch.micro = micro;
    }
    if (const std::string why = unsupported_reason(w, false); !why.empty())
      throw tb::UsageError("the CPU step cannot run " + w.name + ": " + why);
    const std::string text = dump(w, steps).dump() + "\n";
    if (out_path.empty()) {
      std::cout << text;
    } else {
      std::ofstream out(out_path);
      if (!(out << text)) throw std::runtime_error("cannot write " + out_path);
    }
    return 0;
  } catch (const tb::UsageError& e) {
    std::cerr << "dump_step: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dump_step: " << e.what() << std::endl;
    return 1;
  }
}
