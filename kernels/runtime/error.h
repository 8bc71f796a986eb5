// One error path: every failure is an exception that carries where it happened and what was called.
#pragma once

#include <stdexcept>
#include <string>

namespace tb {

// Bad input from the user (a flag, a size, a file): reported as one line, exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failed library or system call (CUDA, cuBLAS, cuSPARSE, allocation): the benchmark becomes a
// failed row with this message.
class CallError : public std::runtime_error {
 public:
  CallError(const char* file, int line, const std::string& call, const std::string& what)
      : std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " + what) {}
};

}  // namespace tb

#define TB_REQUIRE(cond, msg)                                             \
  do {                                                                    \
    if (!(cond)) throw ::tb::CallError(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
