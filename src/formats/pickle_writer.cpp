#include "formats/pickle_writer.h"

namespace flashinfer::formats {

PickleWriter::PickleWriter() {
  op(0x80);  // PROTO
  op(2);
}

void PickleWriter::global(std::string_view module, std::string_view name) {
  op('c');
  out_ += module;
  out_ += '\n';
  out_ += name;
  out_ += '\n';
}

void PickleWriter::unicode(std::string_view s) {
  op('X');
  const auto n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(n >> (8 * i)));
  out_ += s;
}

void PickleWriter::integer(int64_t v) {
  if (v >= 0 && v < 256) {
    op('K');
    op(static_cast<int>(v));
  } else if (v >= 0 && v < 65536) {
    op('M');
    op(static_cast<int>(v & 0xFF));
    op(static_cast<int>(v >> 8));
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    op('J');
    const auto u = static_cast<uint32_t>(static_cast<int32_t>(v));
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(u >> (8 * i)));
  } else {
    // LONG1: little-endian two's complement, 8 bytes is always enough for int64.
    op(0x8a);
    op(8);
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(u >> (8 * i)));
  }
}

void PickleWriter::int_tuple(const std::vector<int64_t>& v) {
  if (v.empty()) {
    empty_tuple();
    return;
  }
  mark();
  for (int64_t x : v) integer(x);
  tuple();
}

const std::string& PickleWriter::finish() {
  op('.');
  return out_;
}

}  // namespace flashinfer::formats
