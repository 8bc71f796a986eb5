// Fields of a JSON document another program wrote (a worker's answer, a trial's result line, a file kept from an
// earlier run), read strictly. nlohmann's value() throws its own type_error for a field of another type, and its
// get<int64_t>() of a float out of range is undefined behaviour: what comes from outside is read through these, and
// each caller turns a FieldError into its own error, naming what it was reading.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace tb::json_field {

// A field present with the wrong kind of value; the message names the key and what it should hold.
struct FieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Each: nullopt when `object` is not an object, or has no such field, or holds null there (what Python's None
// writes); the value when it has the kind asked; FieldError otherwise.
template <class Json>
const Json* present(const Json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

template <class Json>
std::optional<std::string> text(const Json& object, const std::string& key) {
  const Json* v = present(object, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw FieldError("'" + key + "' is not a string");
  return v->template get<std::string>();
}

// A finite number.
template <class Json>
std::optional<double> number(const Json& object, const std::string& key) {
  const Json* v = present(object, key);
  if (!v) return std::nullopt;
  if (!v->is_number() || !std::isfinite(v->template get<double>())) throw FieldError("'" + key + "' is not a number");
  return v->template get<double>();
}

// A whole number within int64's range (written as 3 or 3.0).
template <class Json>
std::optional<int64_t> integer(const Json& object, const std::string& key) {
  const Json* v = present(object, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned() && v->template get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw FieldError("'" + key + "' is too large");
  if (v->is_number_integer()) return v->template get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->template get<double>();
    // 2^63 is the first double past int64's range; -2^63 is within it.
    if (std::isfinite(d) && d == std::floor(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0)
      return static_cast<int64_t>(d);
  }
  throw FieldError("'" + key + "' is not a whole number");
}

template <class Json>
std::optional<bool> flag(const Json& object, const std::string& key) {
  const Json* v = present(object, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw FieldError("'" + key + "' is not true or false");
  return v->template get<bool>();
}

// Where `text` stops being well-formed UTF-8 (Unicode's table 3-7: no overlong form, no surrogate, nothing past
// U+10FFFF), or npos: nlohmann's dump() throws on any string that is not, and yaml-cpp and a child's standard error
// check nothing.
inline std::size_t first_invalid_utf8(const std::string& text, std::size_t from = 0) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  for (std::size_t i = from; i < text.size();) {
    const unsigned char b = byte(i);
    std::size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;  // the second byte's range
    if (b < 0x80) length = 1;
    else if (b >= 0xC2 && b <= 0xDF) length = 2;
    else if (b == 0xE0) length = 3, low = 0xA0;
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) length = 3;
    else if (b == 0xED) length = 3, high = 0x9F;
    else if (b == 0xF0) length = 4, low = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) length = 4;
    else if (b == 0xF4) length = 4, high = 0x8F;
    else return i;
    if (i + length > text.size()) return i;
    for (std::size_t k = 1; k < length; ++k) {
      const unsigned char c = byte(i + k);
      if (k == 1 ? (c < low || c > high) : (c < 0x80 || c > 0xBF)) return i;
    }
    i += length;
  }
  return std::string::npos;
}

inline bool is_utf8(const std::string& text) { return first_invalid_utf8(text) == std::string::npos; }

// `text` with every byte that is not part of well-formed UTF-8 replaced by '?': what another process said (its
// standard error, a line that is not JSON), made fit for a message that is written as JSON.
inline std::string utf8_or_replaced(std::string text) {
  for (std::size_t at = first_invalid_utf8(text); at != std::string::npos; at = first_invalid_utf8(text, at + 1))
    text[at] = '?';
  return text;
}

}  // namespace tb::json_field
