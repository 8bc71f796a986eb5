// scripts/torch-peers --serve's answers (benchsuite --backend cpu,torch) as benchsuite reads them: each line of the
// input is one answer, read as every answer of the protocol (hello, an error, open, counters, time). Each throws
// std::runtime_error saying what is wrong (or with the script's words), an open answer also CannotRun (the row is
// unsupported, saying why); the message is the row's reason in the results, written as JSON.
#include <sstream>

#include "fuzz_contract.h"
#include "runtime/registry.h"
#include "torch_rows.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tb::fuzz::Errors;
  using tb::fuzz::PlainRuntimeError;
  const auto json_message = tb::fuzz::Message::written_as_json;
  std::stringstream lines(tb::fuzz::as_text(data, size));
  for (std::string line; std::getline(lines, line);) {
    nlohmann::ordered_json said;
    bool is_object = false;
    tb::fuzz::check_reader(
        "parse_torch_peers_line", Errors<PlainRuntimeError>{},
        [&] {
          said = tb::parse_torch_peers_line(line);
          is_object = said.is_object();
        },
        json_message);
    if (!is_object) continue;
    tb::fuzz::check_reader(
        "throw_torch_peers_error", Errors<PlainRuntimeError>{}, [&] { tb::throw_torch_peers_error(said); }, json_message);
    tb::fuzz::check_reader(
        "read_torch_peers_hello", Errors<PlainRuntimeError>{}, [&] { (void)tb::read_torch_peers_hello(said).torch.dump(); },
        json_message);
    tb::fuzz::check_reader(
        "read_torch_peers_open", Errors<PlainRuntimeError, tb::CannotRun>{},
        [&] { (void)tb::read_torch_peers_open(said, "adamw/torch/fused/params=1000"); }, json_message);
    tb::fuzz::check_reader(
        "read_torch_peers_counters", Errors<PlainRuntimeError>{},
        [&] {
          std::map<std::string, double> per_unit;
          (void)tb::read_torch_peers_counters(said, per_unit);
        },
        json_message);
    tb::fuzz::check_reader(
        "read_torch_peers_time", Errors<PlainRuntimeError>{}, [&] { (void)tb::read_torch_peers_time(said); }, json_message);
  }
  return 0;
}
