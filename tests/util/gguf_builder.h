// Writes small GGUF files byte by byte for the reader's tests and the fuzzer's seeds. Written
// from the format description (docs/MODEL.md), independently of the reader, and able to write
// malformed files: every field is whatever the caller puts there.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace flashinfer::testing {

class GgufBuilder {
 public:
  // Value type numbers of the format.
  enum : uint32_t {
    kU8 = 0,
    kI8 = 1,
    kU16 = 2,
    kI16 = 3,
    kU32 = 4,
    kI32 = 5,
    kF32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kU64 = 10,
    kI64 = 11,
    kF64 = 12,
  };

  // Little-endian encoders, for building values.
  static std::string le(uint64_t v, int n) {
    std::string s(static_cast<std::size_t>(n), '\0');
    for (int k = 0; k < n; ++k) s[static_cast<std::size_t>(k)] = static_cast<char>(v >> (8 * k));
    return s;
  }
  static std::string u32(uint32_t v) { return le(v, 4); }
  static std::string u64(uint64_t v) { return le(v, 8); }
  static std::string f32(float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    return le(b, 4);
  }
  static std::string f64(double v) {
    uint64_t b;
    std::memcpy(&b, &v, 8);
    return le(b, 8);
  }
  static std::string str(const std::string& s) { return u64(s.size()) + s; }
  /// An array value's payload: element type, count, then the encoded elements.
  static std::string array(uint32_t elem_type, uint64_t count, const std::string& elems) {
    return u32(elem_type) + u64(count) + elems;
  }

  uint32_t version = 3;
  uint32_t alignment = 32;  // the padding build() uses (set general.alignment to match)
  // Written in the header instead of the real counts when set.
  int64_t tensor_count_override = -1;
  int64_t kv_count_override = -1;

  /// A metadata entry with an already-encoded payload.
  GgufBuilder& kv(const std::string& key, uint32_t type, const std::string& payload) {
    kvs_ += str(key) + u32(type) + payload;
    ++n_kv_;
    return *this;
  }
  /// A tensor whose data goes at the next aligned offset of the data section.
  GgufBuilder& tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
                      const std::string& bytes) {
    while (data_.size() % alignment != 0) data_.push_back('\0');
    tensor_at(name, ne, type, data_.size());
    data_ += bytes;
    return *this;
  }
  /// A tensor info with an explicit offset (and no data added).
  GgufBuilder& tensor_at(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
                         uint64_t offset) {
    infos_ += str(name) + u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) infos_ += u64(d);
    infos_ += u32(type) + u64(offset);
    ++n_tensors_;
    return *this;
  }
  /// Bytes appended to the data section as they are.
  GgufBuilder& data(const std::string& bytes) {
    data_ += bytes;
    return *this;
  }

  std::string build() const {
    std::string s = "GGUF" + u32(version);
    s +=
        u64(tensor_count_override >= 0 ? static_cast<uint64_t>(tensor_count_override) : n_tensors_);
    s += u64(kv_count_override >= 0 ? static_cast<uint64_t>(kv_count_override) : n_kv_);
    s += kvs_ + infos_;
    while (s.size() % alignment != 0) s.push_back('\0');
    return s + data_;
  }

 private:
  std::string kvs_, infos_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
};

}  // namespace flashinfer::testing
