// A workload file (autotune --workload FILE, benchsuite's step rows) into a validated workload: parse_workload
// returns one or throws UsageError "FILE:LINE:COL: what". What every user of a workload then derives from it (its
// parameter count, a step's FLOPs and bytes, the resolved workload the PyTorch twin is built from) must hold for
// every workload the parser lets through: an overflow there is undefined behaviour, which UBSan reports.
#include "fuzz_contract.h"
#include "runtime/error.h"
#include "step/resolved.h"
#include "step/step.h"
#include "step/workload.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = tb::fuzz::as_text(data, size);
  tb::fuzz::check_reader("parse_workload", tb::fuzz::Errors<tb::UsageError>{}, [&] {
    const tb::step::Workload w = tb::step::parse_workload(text, "fuzz.yaml");
    volatile double derived = static_cast<double>(w.parameter_count()) + tb::step::step_flops(w) +
                              tb::step::estimate_bytes(w) + static_cast<double>(w.batch.accumulation());
    (void)derived;
    (void)tb::step::resolved_workload(w).dump();
  });
  return 0;
}
