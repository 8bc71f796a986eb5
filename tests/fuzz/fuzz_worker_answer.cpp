// The PyTorch worker's answers (scripts/torch-step --serve, tuner/worker.h) as autotune reads them: each line of the
// input is one answer, read as every answer the protocol has (hello, open, time, counters, close, an entry's probe
// and its largest-batch search, the time split and the communication profile). A line that is not such an answer
// throws WorkerLost (the worker is taken for lost and the candidate with it); an entry's answers throw UsageError or
// std::runtime_error with the worker's words or saying what is wrong; the split and the profile, read for the output
// after the race, throw nothing: what is wrong is their `error`, which the output and stderr carry.
#include <sstream>

#include "fuzz_contract.h"
#include "runtime/error.h"
#include "tuner/entry.h"
#include "tuner/worker.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tb::fuzz::Errors;
  using tb::tune::WorkerLost;
  std::stringstream lines(tb::fuzz::as_text(data, size));
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json said;
    bool is_object = false;
    // A lost worker's words become the candidate's trial message, which the journal writes as JSON.
    const auto json_message = tb::fuzz::Message::written_as_json;
    tb::fuzz::check_reader(
        "parse_worker_line", Errors<WorkerLost>{},
        [&] {
          said = tb::tune::parse_worker_line(line);
          is_object = said.is_object();
          if (!is_object) tb::fuzz::finding("parse_worker_line", "returned " + std::string(said.type_name()));
        },
        json_message);
    if (!is_object) continue;
    tb::fuzz::check_reader(
        "read_hello", Errors<WorkerLost>{}, [&] { (void)tb::tune::read_hello(said); }, json_message);
    tb::fuzz::check_reader(
        "read_open_answer", Errors<WorkerLost>{}, [&] { (void)tb::tune::read_open_answer(said); }, json_message);
    tb::fuzz::check_reader(
        "read_time_answer", Errors<WorkerLost>{}, [&] { (void)tb::tune::read_time_answer(said); }, json_message);
    tb::fuzz::check_reader(
        "read_counters_answer", Errors<WorkerLost>{}, [&] { (void)tb::tune::read_counters_answer(said); }, json_message);
    tb::fuzz::check_reader(
        "read_close_answer", Errors<WorkerLost>{}, [&] { (void)tb::tune::read_close_answer(said); }, json_message);
    tb::fuzz::check_reader("read_probe_answer", Errors<tb::UsageError, tb::fuzz::PlainRuntimeError>{}, [&] {
      tb::tune::EntryProbe probe;
      tb::tune::read_probe_answer(said, "fuzz.py:build", probe);
    });
    tb::fuzz::check_reader("read_largest_batch_answer", Errors<tb::UsageError, tb::fuzz::PlainRuntimeError>{},
                           [&] { (void)tb::tune::read_largest_batch_answer(said, "fuzz.py:build", 64); });
    tb::fuzz::check_reader("read_split_answer", Errors<>{}, [&] {
      const tb::tune::SplitAnswer split = tb::tune::read_split_answer(said);
      (void)split.dataloader.dump();  // written in the output: it must be writable
      if (split.error.empty() && split.parts.size() != 5) tb::fuzz::finding("read_split_answer", "a part is missing");
      if (!tb::json_field::is_utf8(split.error)) tb::fuzz::finding("read_split_answer", "its error is not UTF-8");
    });
    tb::fuzz::check_reader("read_profile_answer", Errors<>{}, [&] {
      const tb::tune::ProfileAnswer profile = tb::tune::read_profile_answer(said);
      if (profile.error.empty() && (profile.share < 0 || profile.share > 1))
        tb::fuzz::finding("read_profile_answer", "a share outside 0-1");
      if (!tb::json_field::is_utf8(profile.error)) tb::fuzz::finding("read_profile_answer", "its error is not UTF-8");
    });
  }
  return 0;
}
