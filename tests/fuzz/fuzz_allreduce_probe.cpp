// The all-reduce probe's standard output (autotune --predict: `autotune --allreduce-probe` under mpirun, or
// torch.distributed's under torchrun) as the parent reads it: the probe's figures, or CallError saying the answer is
// missing or not what autotune expects.
#include "fuzz_contract.h"
#include "runtime/error.h"
#include "tuner/distributed.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = tb::fuzz::as_text(data, size);
  tb::fuzz::check_reader("read_allreduce_probe_answer", tb::fuzz::Errors<tb::CallError>{}, [&] {
    const tb::tune::AllreduceProbe probe = tb::tune::read_allreduce_probe_answer(text, "the all-reduce probe");
    // What --predict makes of it.
    (void)tb::tune::to_json(tb::tune::predict_ranks(8, 64, 100.0, probe)).dump();
  });
  return 0;
}
