// benchsuite's kept cache sweep (~/.cache/trainbench/cache-sweep.json, benches/cache_threshold.h) as it reads it for
// each machine key the file holds: a file that is not such a document is measured again and rewritten, so reading
// never throws; a kept entry's threshold follows.
#include "cache_threshold.h"
#include "fuzz_contract.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = tb::fuzz::as_text(data, size);
  tb::fuzz::check_reader("cache_sweep_document", tb::fuzz::Errors<>{}, [&] {
    const nlohmann::json file = tb::cache_sweep_document(text);
    std::vector<std::string> keys{"fuzz-machine"};
    if (file.contains("machines") && file["machines"].is_object())
      for (const auto& [key, entry] : file["machines"].items()) keys.push_back(key);
    for (const std::string& key : keys)
      if (const nlohmann::json* entry = tb::kept_sweep(file, key)) (void)tb::threshold_of(*entry, "cache-sweep.json");
  });
  return 0;
}
