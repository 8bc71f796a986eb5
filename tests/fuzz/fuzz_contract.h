// What every fuzz target checks of its reader: it returned, or it threw one of the errors it is documented to throw,
// with a message. Anything else escaping it (nlohmann's type_error, a YAML::Exception, std::out_of_range, an error
// without words) is a finding: its type and message go to stderr and the process aborts, which libFuzzer reports as
// a crash and saves the input. Crashes, sanitizer reports and hangs are libFuzzer's own findings.
#pragma once

#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeinfo>

#include "runtime/json_fields.h"

namespace tb::fuzz {

// The errors a reader may throw. Project types match with what derives from them; PlainRuntimeError stands for
// std::runtime_error itself (what a reader throws with its own words), never a library's type derived from it.
struct PlainRuntimeError {};
template <class... Allowed>
struct Errors {};

inline std::string type_name(const std::type_info& type) {
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(type.name(), nullptr, nullptr, &status),
                                                         std::free);
  return status == 0 && demangled ? demangled.get() : type.name();
}

[[noreturn]] inline void finding(const char* reader, const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s: %s\n", reader, what.c_str());
  std::fflush(stderr);
  std::abort();
}

template <class Allowed>
bool is_allowed(const std::exception& e) {
  if constexpr (std::is_same_v<Allowed, PlainRuntimeError>) return typeid(e) == typeid(std::runtime_error);
  else return dynamic_cast<const Allowed*>(&e) != nullptr;
}

// Where a reader's error message goes: printed only, or also into JSON (a trial's message in the journal, a row's
// reason in the results), which takes UTF-8 only.
enum class Message { printed, written_as_json };

// Runs `read` on the input and holds it to the contract above.
template <class... Allowed, class Read>
void check_reader(const char* reader, Errors<Allowed...>, Read&& read, Message message = Message::printed) {
  try {
    read();
  } catch (const std::exception& e) {
    if (!(is_allowed<Allowed>(e) || ...))
      finding(reader, type_name(typeid(e)) + " escaped (not an error this reader throws): " + e.what());
    if (std::string(e.what()).empty()) finding(reader, type_name(typeid(e)) + " without a message");
    if (message == Message::written_as_json && !json_field::is_utf8(e.what()))
      finding(reader, type_name(typeid(e)) + "'s message is not UTF-8 and is written as JSON: " + e.what());
  } catch (...) {
    finding(reader, "an exception of no standard type escaped");
  }
}

inline std::string as_text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace tb::fuzz
