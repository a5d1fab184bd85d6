// Private: a minimal ZIP writer for torch.save's archive layout: every entry STORED
// (uncompressed), its data 64-byte aligned through an 'FB' padding extra field, CRC32 per entry,
// ZIP64 records when a size or offset does not fit 32 bits.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flashinfer::formats {

class ZipWriter {
 public:
  /// Creates (truncates) `path`; throws flashinfer::Error(kIo) if it cannot.
  explicit ZipWriter(const std::string& path);
  ~ZipWriter();
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;

  /// Appends one entry whose data is `size` bytes at `data`.
  void add(std::string_view name, const void* data, std::size_t size);
  /// Writes the central directory and closes the file. Must be called for a valid archive.
  void finish();

 private:
  struct Entry {
    std::string name;
    uint32_t crc;
    uint64_t size;
    uint64_t offset;
  };
  void write(const void* p, std::size_t n);
  void flush();
  void write_fd(const void* p, std::size_t n);
  std::string path_;
  int fd_ = -1;
  // Headers and small entries gather here so that a small archive costs one write(2).
  std::vector<uint8_t> pending_;
  uint64_t pos_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace flashinfer::formats
