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
      uint32_t cp = 0;
      int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      if (len == 1 || i + len > s.size()) {
        cp = 0xFFFD;
        len = 1;
      } else {
        cp = c & (0x7F >> len);
        for (int k = 1; k < len; ++k)
          cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      }
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof(b), "\\u%04x", cp);
      }
      out += b;
      i += static_cast<std::size_t>(len);
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
