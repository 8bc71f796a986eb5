// autotune's journal as --resume opens it: the bytes written to a file, opened for the context "fuzz" (the corpus's
// lines are of that context) with resume on, then loaded. Opening returns or throws UsageError (a line that is not a
// journal's, another context's lines); loading never throws (a line it cannot read back is measured again).
#include <unistd.h>

#include <fstream>

#include "fuzz_contract.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "tuner/journal.h"

namespace {

const std::string& journal_path() {
  static const tb::PrivateTempDir dir("trainbench-fuzz-journal");
  static const std::string path = dir.path() + "/fuzz.autotune.jsonl";
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = journal_path();
  {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!file.flush()) tb::fuzz::finding("fuzz_journal", "cannot write " + path);
  }
  tb::fuzz::check_reader("Journal (--resume)", tb::fuzz::Errors<tb::UsageError>{}, [&] {
    const tb::tune::Journal journal(path, "fuzz", /*resume=*/true);
    tb::fuzz::check_reader("Journal::load", tb::fuzz::Errors<>{}, [&] { (void)journal.load(); });
  });
  return 0;
}
