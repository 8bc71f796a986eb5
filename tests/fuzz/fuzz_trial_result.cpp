// A trial child's outcome as the parent reads it (autotune's native executor): its standard output's last line is
// its result (trial_result_from_json), else how it ended, with the end of its standard error. classify() never
// throws; the result it makes goes into the journal as JSON, which must be writable for whatever the child said.
#include "fuzz_contract.h"
#include "tuner/trial.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = tb::fuzz::as_text(data, size);
  // The same bytes as a child's answer (exit 0) and as the standard error of a child that failed.
  tb::tune::ChildOutcome answered;
  answered.exit_code = 0;
  answered.out = text;
  tb::tune::ChildOutcome failed;
  failed.exit_code = 3;
  failed.err_tail = text;
  for (const tb::tune::ChildOutcome* outcome : {&answered, &failed})
    tb::fuzz::check_reader("classify", tb::fuzz::Errors<>{}, [&] {
      const tb::tune::TrialResult r = tb::tune::classify(*outcome);
      (void)tb::tune::to_json(r).dump();  // as the journal writes it
    });
  return 0;
}
