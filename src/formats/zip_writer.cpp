#include "formats/zip_writer.h"

#include <zlib.h>

#include <cstring>

namespace flashinfer::formats {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint64_t kMax32 = 0xFFFFFFFFull;
constexpr uint64_t kAlign = 64;  // torch's storage alignment

struct Buf {
  Buf() { b.reserve(160); }  // a header and its padding: one allocation, not one per byte
  std::vector<uint8_t> b;
  void u16(uint16_t v) {
    b.push_back(static_cast<uint8_t>(v));
    b.push_back(static_cast<uint8_t>(v >> 8));
  }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(std::string_view s) { b.insert(b.end(), s.begin(), s.end()); }
};

}  // namespace

uint32_t zip_crc32(const void* data, std::size_t size) { return zip_crc32_update(0, data, size); }

uint32_t zip_crc32_update(uint32_t start, const void* data, std::size_t size) {
  uLong crc = start;
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {  // zlib takes 32-bit lengths
    const auto n = static_cast<uInt>(size > (1u << 30) ? (1u << 30) : size);
    crc = crc32(crc, p, n);
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(crc);
}

std::vector<uint8_t> zip_local_header(std::string_view name, uint32_t crc, uint64_t size,
                                      uint64_t pos) {
  const bool zip64 = size >= kMax32 || pos >= kMax32;
  Buf h;
  h.u32(kLocalSig);
  h.u16(zip64 ? 45 : 20);  // version needed
  h.u16(0);                // flags
  h.u16(0);                // method: stored
  h.u16(0);                // time
  h.u16(0x21);             // date: 1980-01-01
  h.u32(crc);
  h.u32(zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(size));
  h.u32(zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(size));
  h.u16(static_cast<uint16_t>(name.size()));
  const std::size_t len_pos = h.b.size();
  h.u16(0);  // extra length, patched below
  h.str(name);
  std::size_t extra = 0;
  if (zip64) {
    h.u16(0x0001);
    h.u16(16);
    h.u64(size);
    h.u64(size);
    extra += 20;
  }
  // 'FB' padding so that the data starts on a 64-byte boundary.
  uint64_t data_start = pos + h.b.size() + 4;
  const uint64_t pad = (kAlign - data_start % kAlign) % kAlign;
  h.u16(0x4246);  // "FB"
  h.u16(static_cast<uint16_t>(pad));
  h.b.insert(h.b.end(), pad, 'Z');
  extra += 4 + pad;
  h.b[len_pos] = static_cast<uint8_t>(extra);
  h.b[len_pos + 1] = static_cast<uint8_t>(extra >> 8);
  return std::move(h.b);
}

std::vector<uint8_t> zip_central_directory(const std::vector<ZipEntryInfo>& entries,
                                           uint64_t cd_start,
                                           std::vector<std::size_t>* record_starts) {
  Buf c;
  for (const ZipEntryInfo& e : entries) {
    if (record_starts) record_starts->push_back(c.b.size());
    const bool zip64 = e.size >= kMax32 || e.offset >= kMax32;
    c.u32(kCentralSig);
    c.u16(zip64 ? 45 : 20);  // made by
    c.u16(zip64 ? 45 : 20);  // needed
    c.u16(0);
    c.u16(0);
    c.u16(0);
    c.u16(0x21);
    c.u32(e.crc);
    c.u32(zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(e.size));
    c.u32(zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(e.size));
    c.u16(static_cast<uint16_t>(e.name.size()));
    c.u16(zip64 ? 28 : 0);  // extra
    c.u16(0);               // comment
    c.u16(0);               // disk
    c.u16(0);               // internal attributes
    c.u32(0);               // external attributes
    c.u32(zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(e.offset));
    c.str(e.name);
    if (zip64) {
      c.u16(0x0001);
      c.u16(24);
      c.u64(e.size);
      c.u64(e.size);
      c.u64(e.offset);
    }
  }
  const uint64_t cd_size = c.b.size();
  const uint64_t n = entries.size();
  const bool zip64 = cd_start >= kMax32 || n >= 0xFFFF;
  if (zip64) {
    const uint64_t z64_pos = cd_start + cd_size;
    c.u32(kZip64EndSig);
    c.u64(44);  // size of the rest of this record
    c.u16(45);
    c.u16(45);
    c.u32(0);
    c.u32(0);
    c.u64(n);
    c.u64(n);
    c.u64(cd_size);
    c.u64(cd_start);
    c.u32(kZip64LocatorSig);
    c.u32(0);
    c.u64(z64_pos);
    c.u32(1);
  }
  c.u32(kEndSig);
  c.u16(0);
  c.u16(0);
  c.u16(zip64 ? 0xFFFF : static_cast<uint16_t>(n));
  c.u16(zip64 ? 0xFFFF : static_cast<uint16_t>(n));
  c.u32(zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(cd_size));
  c.u32(zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(cd_start));
  c.u16(0);
  return std::move(c.b);
}

}  // namespace flashinfer::formats
