// The autotune command: tb::tune::run (autotune.h) with its exit codes for bad usage (2) and errors (1).
#include <iostream>
#include <string>

#include "runtime/device_info.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "tuner/autotune.h"

int main(int argc, char** argv) {
  tb::file_size_limit_fails_the_write();
  // Before anything is measured: trials inherit the environment, and so the kernels.
  if (!(argc == 3 && std::string(argv[1]) == "--trial")) tb::use_matching_blas_kernels(argv, "autotune");
  try {
    return tb::tune::run(argc, argv);
  } catch (const tb::UsageError& e) {
    std::cerr << "autotune: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "autotune: error: " << e.what() << std::endl;
    return 1;
  }
}
