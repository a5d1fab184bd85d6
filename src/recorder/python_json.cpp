#include "recorder/python_json.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "flashinfer/value.h"
#include "recorder/record_tape.h"

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

// The allocating writers are thin wrappers over record_tape.h's allocation-free ones (the
// crash handler's): one escaping and one float layout, text flushed into `out`.
namespace {

void append_to_string(void* ctx, const char* p, std::size_t n) {
  static_cast<std::string*>(ctx)->append(p, n);
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  char buf[256];
  internal::TextOut t(buf, sizeof(buf), append_to_string, &out);
  t.put_json_string(s);
  t.flush();
}

void append_json_float(std::string& out, double d) {
  char buf[64];
  internal::TextOut t(buf, sizeof(buf), append_to_string, &out);
  t.put_json_float(d);
  t.flush();
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
