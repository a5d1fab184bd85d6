#include "recorder/python_json.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "flashinfer/value.h"

namespace flashinfer::recorder {
namespace {

void dump(std::string& out, const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      out += "null";
      return;
    case Json::value_t::boolean:
      out += j.get<bool>() ? "true" : "false";
      return;
    case Json::value_t::number_integer:
      out += std::to_string(j.get<int64_t>());
      return;
    case Json::value_t::number_unsigned:
      out += std::to_string(j.get<uint64_t>());
      return;
    case Json::value_t::number_float:
      append_json_float(out, j.get<double>());
      return;
    case Json::value_t::string:
      append_json_string(out, j.get_ref<const std::string&>());
      return;
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& x : j) {
        if (!first) out += ", ";
        first = false;
        dump(out, x);
      }
      out += ']';
      return;
    }
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, it.key());
        out += ": ";
        dump(out, it.value());
      }
      out += '}';
      return;
    }
    default:
      out += "null";
  }
}

// The length of the well-formed UTF-8 sequence starting at s[i] (a byte >= 0x80), or 0 when it
// does not start one (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
int utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = at(i);
  int len = 0;
  unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + static_cast<std::size_t>(len) > s.size()) return 0;
  if (at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (int k = 2; k < len; ++k)
    if (at(i + k) < 0x80 || at(i + k) > 0xBF) return 0;
  return len;
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    // Printable ASCII other than '"' and '\\' goes through as a run.
    std::size_t j = i;
    while (j < s.size() && s[j] >= 0x20 && s[j] < 0x7f && s[j] != '"' && s[j] != '\\') ++j;
    if (j > i) {
      out.append(s.data() + i, j - i);
      i = j;
      continue;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\b') {
      out += "\\b";
    } else if (c == '\f') {
      out += "\\f";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\u%04x", c);
      out += b;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      // Decode UTF-8 and escape as \uXXXX (surrogate pairs above the BMP), like ensure_ascii.
      // A byte that does not start a well-formed sequence is escaped as Python's surrogateescape
      // decodes it (U+DC00 + byte): what json.dumps writes for an os.fsdecode'd path such as a
      // dump directory whose name is not UTF-8.
      const int len = utf8_sequence_length(s, i);
      char b[16];
      uint32_t cp = 0;
      if (len == 0) {
        cp = 0xDC00 + c;
      } else {
        cp = c & (0x7F >> len);
        for (int k = 1; k < len; ++k)
          cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      }
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof(b), "\\u%04x", cp);
      }
      out += b;
      i += static_cast<std::size_t>(len == 0 ? 1 : len);
      continue;
    }
    ++i;
  }
  out += '"';
}

void append_json_float(std::string& out, double d) {
  if (std::isnan(d)) {
    out += "NaN";
  } else if (std::isinf(d)) {
    out += d > 0 ? "Infinity" : "-Infinity";
  } else {
    out += python_float_repr(d);
  }
}

PyJsonWriter& PyJsonWriter::key(std::string_view k) {
  before_value();
  append_json_string(out_, k);
  out_ += ": ";
  after_key_ = true;
  return *this;
}

void PyJsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (depth_ == 0) return;
  const uint64_t bit = uint64_t{1} << (depth_ - 1);
  if (empty_ & bit) {
    empty_ &= ~bit;
  } else {
    out_ += ", ";
  }
}

PyJsonWriter& PyJsonWriter::open(char c) {
  before_value();
  if (depth_ >= 64) throw std::length_error("PyJsonWriter: nesting deeper than 64");
  out_ += c;
  empty_ |= uint64_t{1} << depth_;
  ++depth_;
  return *this;
}

PyJsonWriter& PyJsonWriter::close(char c) {
  --depth_;
  out_ += c;
  return *this;
}

PyJsonWriter& PyJsonWriter::integer(int64_t v) { return raw(std::to_string(v)); }
PyJsonWriter& PyJsonWriter::uinteger(uint64_t v) { return raw(std::to_string(v)); }

PyJsonWriter& PyJsonWriter::number(double v) {
  before_value();
  append_json_float(out_, v);
  return *this;
}

PyJsonWriter& PyJsonWriter::string(std::string_view s) {
  before_value();
  append_json_string(out_, s);
  return *this;
}

PyJsonWriter& PyJsonWriter::raw(std::string_view json) {
  before_value();
  out_.append(json);
  return *this;
}

std::string python_json_dumps(const Json& j) {
  std::string out;
  dump(out, j);
  return out;
}

}  // namespace flashinfer::recorder
