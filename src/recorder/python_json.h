// Private: JSON text exactly as Python's json.dumps(obj) writes it (separators ", " and ": ",
// ensure_ascii, floats as repr(), NaN/Infinity bare), so our records read like upstream's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

// Declarations only: the recorder's sources that include this stream text through PyJsonWriter;
// python_json.cpp and the callers of python_json_dumps include json.hpp (about 1 CPU-s of
// parsing for each source that does not need it).
#include <nlohmann/json_fwd.hpp>

namespace flashinfer::recorder {

using Json = nlohmann::ordered_json;

std::string python_json_dumps(const Json& j);

/// Appends `s` as a JSON string literal escaped as json.dumps does (ensure_ascii).
void append_json_string(std::string& out, std::string_view s);
/// Appends a float as json.dumps writes it: repr(), or NaN / Infinity / -Infinity.
void append_json_float(std::string& out, double d);

/// Streams json.dumps text into a string without building a document first (the recorder's
/// per-call records). Commas and ": " follow from the nesting; raw() splices finished text.
class PyJsonWriter {
 public:
  explicit PyJsonWriter(std::string& out) : out_(out) {}
  PyJsonWriter& begin_object() { return open('{'); }
  PyJsonWriter& end_object() { return close('}'); }
  PyJsonWriter& begin_array() { return open('['); }
  PyJsonWriter& end_array() { return close(']'); }
  PyJsonWriter& key(std::string_view k);
  PyJsonWriter& null() { return raw("null"); }
  PyJsonWriter& boolean(bool b) { return raw(b ? "true" : "false"); }
  PyJsonWriter& integer(int64_t v);
  PyJsonWriter& uinteger(uint64_t v);
  PyJsonWriter& number(double v);
  PyJsonWriter& string(std::string_view s);
  /// Already formatted JSON text, written as one value.
  PyJsonWriter& raw(std::string_view json);

 private:
  PyJsonWriter& open(char c);
  PyJsonWriter& close(char c);
  void before_value();
  std::string& out_;
  uint64_t empty_ = 0;  // bit d set: the container at depth d has no member yet
  int depth_ = 0;
  bool after_key_ = false;
};

}  // namespace flashinfer::recorder
