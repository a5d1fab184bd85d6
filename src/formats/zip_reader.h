// Private: reads STORED entries of a ZIP archive held in memory, bounds-checking everything
// (the archive is untrusted). ZIP64 sizes and offsets are understood.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flashinfer::formats {

class ZipReader {
 public:
  /// Parses the central directory of `bytes` (which must outlive the reader). Throws
  /// flashinfer::Error(kFormat) mentioning `name` on any inconsistency.
  ZipReader(std::string_view bytes, std::string name);

  struct Entry {
    std::string name;
    uint64_t data_offset;
    uint64_t size;
    uint32_t crc;
  };
  const std::vector<Entry>& entries() const { return entries_; }
  /// The entry called `name`, or nullptr.
  const Entry* find(std::string_view name) const;
  /// The entry's bytes, CRC-checked.
  std::string_view data(const Entry& e) const;

 private:
  [[noreturn]] void fail(const std::string& what) const;
  std::string_view bytes_;
  std::string name_;
  std::vector<Entry> entries_;
};

}  // namespace flashinfer::formats
