// Private: the records of a ZIP archive in torch.save's layout (the writers are
// formats/torch_archive.h's): every entry STORED (uncompressed), its data 64-byte aligned
// through an 'FB' padding extra field, CRC32 per entry, ZIP64 records when a size or offset does
// not fit 32 bits.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flashinfer::formats {

/// CRC-32 (zlib's; a pure function, safe in a signal handler).
uint32_t zip_crc32(const void* data, std::size_t size);
/// The CRC-32 of earlier bytes (`crc`, 0 for none) continued over `data`.
uint32_t zip_crc32_update(uint32_t crc, const void* data, std::size_t size);

/// One archive member as the central directory lists it.
struct ZipEntryInfo {
  std::string name;
  uint32_t crc;
  uint64_t size;
  uint64_t offset;  // of its local header
};

/// The local header (with the 'FB' padding that aligns the data to 64 bytes) of a STORED entry
/// starting at `pos`. The CRC sits at byte 14 of it.
std::vector<uint8_t> zip_local_header(std::string_view name, uint32_t crc, uint64_t size,
                                      uint64_t pos);
/// Byte offset of the CRC field in a central directory record.
inline constexpr std::size_t kZipCentralCrcOffset = 16;
inline constexpr std::size_t kZipLocalCrcOffset = 14;
/// The central directory records of `entries` followed by the end records, for a directory
/// starting at `cd_start`. `record_starts`, when given, receives each record's offset in the
/// returned bytes.
std::vector<uint8_t> zip_central_directory(const std::vector<ZipEntryInfo>& entries,
                                           uint64_t cd_start,
                                           std::vector<std::size_t>* record_starts = nullptr);

}  // namespace flashinfer::formats
