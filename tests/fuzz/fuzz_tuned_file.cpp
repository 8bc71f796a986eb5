// A tuned file (autotune's own document, YAML or JSON) as autotune --compare and --from read it: each reader
// returns or throws UsageError "PATH: ...". --from then writes the choice in the frameworks' formats: those must be
// written for every file the reader lets through.
#include <iostream>

#include "fuzz_contract.h"
#include "runtime/error.h"
#include "tuner/autotune.h"
#include "tuner/emit.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::cerr.setstate(std::ios::failbit);  // --from's notes (no gradient clipping said) on every input
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = tb::fuzz::as_text(data, size);
  using tb::UsageError;
  tb::fuzz::check_reader("parse_tuned_file (--compare)", tb::fuzz::Errors<UsageError>{},
                         [&] { (void)tb::tune::parse_tuned_file(text, "fuzz.yaml"); });
  tb::fuzz::check_reader("tuned_output_from_text (--from)", tb::fuzz::Errors<UsageError>{}, [&] {
    const tb::tune::TuneOutput out = tb::tune::tuned_output_from_text(text, "fuzz.yaml");
    for (const auto format : {tb::tune::OutFormat::deepspeed, tb::tune::OutFormat::lightning, tb::tune::OutFormat::hf,
                              tb::tune::OutFormat::accelerate})
      (void)tb::tune::emit(out, format);
  });
  return 0;
}
