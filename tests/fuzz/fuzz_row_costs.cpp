// benchsuite's kept rows' times (~/.cache/trainbench/row-costs.json, benches/time_estimate.h) as it reads them for
// each machine the file holds: a bad file costs only the estimate, so reading never throws. What the estimate then
// asks of them (each row's cost, each stage's mean), a row recorded and the file merged for writing back, follow.
#include "fuzz_contract.h"
#include "time_estimate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = tb::fuzz::as_text(data, size);
  // The machines and rows the text names, whatever its shape, to read it as each machine would.
  std::vector<std::string> machines{"fuzz-machine"}, names{"peak/cpu/triad/n=1000"}, stages{"peak"};
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_object() && doc.contains("machines") && doc["machines"].is_object())
    for (const auto& [machine, rows] : doc["machines"].items()) {
      machines.push_back(machine);
      if (!rows.is_object()) continue;
      for (const auto& [name, row] : rows.items()) {
        names.push_back(name);
        if (row.is_object() && row.contains("stage") && row["stage"].is_string())
          stages.push_back(row["stage"].get<std::string>());
      }
    }
  for (const std::string& machine : machines)
    tb::fuzz::check_reader("RowCosts::from_text", tb::fuzz::Errors<>{}, [&] {
      tb::RowCosts costs = tb::RowCosts::from_text(text, machine);
      for (const std::string& name : names) (void)costs.row(name);
      for (const std::string& stage : stages) {
        double setup = 0, ratio = 0;
        (void)costs.stage_mean(stage, setup, ratio);
      }
      costs.record(names.back(), stages.back(), tb::RowCost{1.0, 2.0, 2.0});
      (void)costs.merged_into(doc.is_discarded() ? nlohmann::json() : doc).dump();
    });
  return 0;
}
