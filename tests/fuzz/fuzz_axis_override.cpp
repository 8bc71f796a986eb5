// benchsuite --axis STAGE.AXIS=V1[,V2...] against the real registry: parse_axis_override returns the override or
// throws UsageError saying what exists; the problems benchsuite then expands for each of the stage's variants, and
// their names, follow from an accepted override. A workload axis's values name presets or files (read as a workload
// each): the presets are the source tree's.
#include <cstdlib>

#include "fuzz_contract.h"
#include "runtime/error.h"
#include "runtime/registry.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("TRAINBENCH_WORKLOADS", TRAINBENCH_FUZZ_WORKLOADS, 1);
  (void)tb::builtin_registry();  // built once, before the first input
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = tb::fuzz::as_text(data, size);
  const tb::Registry& registry = tb::builtin_registry();
  tb::fuzz::check_reader("parse_axis_override", tb::fuzz::Errors<tb::UsageError>{}, [&] {
    const tb::AxisOverride o = tb::parse_axis_override(registry, text);
    const tb::Stage* stage = registry.find(o.stage);
    if (!stage) tb::fuzz::finding("parse_axis_override", "accepted an override of no stage: " + o.stage);
    for (const tb::Variant& v : stage->variants)
      for (const tb::Problem& p : tb::expand_problems(*stage, v, {o}, false)) (void)tb::benchmark_name(*stage, v, p);
  });
  return 0;
}
