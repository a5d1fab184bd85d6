// Test helper: a plain ZIP writer for torch.save's archive layout, from the library's own zip
// records (formats/zip_writer.h: local headers with the 64-byte 'FB' padding, the central
// directory with its ZIP64 records). The tests build archives entry by entry with it (hostile
// dumps, a reference for save_torch's bytes); the library writes its archives through
// formats/torch_archive.h, which copies each entry before taking its CRC.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/error.h"
#include "formats/zip_writer.h"

namespace flashinfer::testing {

class ZipWriter {
 public:
  /// Creates (truncates) `path`; throws flashinfer::Error(kIo) if it cannot.
  explicit ZipWriter(const std::string& path)
      : path_(path), out_(path, std::ios::binary | std::ios::trunc) {
    if (!out_) FLASHINFER_FAIL(ErrorCode::kIo, "zip", "path", "cannot create '", path, "'");
  }

  /// Appends one entry whose data is `size` bytes at `data`.
  void add(std::string_view name, const void* data, std::size_t size) {
    const uint32_t crc = formats::zip_crc32(data, size);
    const std::vector<uint8_t> h = formats::zip_local_header(name, crc, size, pos_);
    entries_.push_back({std::string(name), crc, size, pos_});
    write(h.data(), h.size());
    write(data, size);
  }

  /// Writes the central directory and closes the file. Must be called for a valid archive.
  void finish() {
    const std::vector<uint8_t> cd = formats::zip_central_directory(entries_, pos_);
    write(cd.data(), cd.size());
    out_.close();
    if (!out_) FLASHINFER_FAIL(ErrorCode::kIo, "zip", "path", "writing '", path_, "' failed");
  }

 private:
  void write(const void* p, std::size_t n) {
    out_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    if (!out_) FLASHINFER_FAIL(ErrorCode::kIo, "zip", "path", "writing '", path_, "' failed");
    pos_ += n;
  }
  std::string path_;
  std::ofstream out_;
  uint64_t pos_ = 0;
  std::vector<formats::ZipEntryInfo> entries_;
};

}  // namespace flashinfer::testing
