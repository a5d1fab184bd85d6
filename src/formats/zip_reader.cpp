#include "formats/zip_reader.h"

#include <zlib.h>

#include "flashinfer/error.h"

namespace flashinfer::formats {
namespace {

uint64_t rd(std::string_view b, uint64_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

}  // namespace

void ZipReader::fail(const std::string& what) const {
  FLASHINFER_FAIL(ErrorCode::kFormat, "zip", "", "'", name_, "' is not a valid archive: ", what);
}

ZipReader::ZipReader(std::string_view bytes, std::string name)
    : bytes_(bytes), name_(std::move(name)) {
  const uint64_t n = bytes_.size();
  if (n < 22) fail("too short");
  // The end-of-central-directory record is within the last 22 + 65535 bytes.
  uint64_t eocd = UINT64_MAX;
  const uint64_t lowest = n > 22 + 65535 ? n - 22 - 65535 : 0;
  for (uint64_t p = n - 22 + 1; p-- > lowest;) {
    if (rd(bytes_, p, 4) == 0x06054b50) {
      eocd = p;
      break;
    }
  }
  if (eocd == UINT64_MAX) fail("no end-of-central-directory record");
  uint64_t count = rd(bytes_, eocd + 10, 2);
  uint64_t cd_size = rd(bytes_, eocd + 12, 4);
  uint64_t cd_off = rd(bytes_, eocd + 16, 4);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {
    // ZIP64: the locator sits just before the EOCD and points at the ZIP64 EOCD record.
    if (eocd < 20 || rd(bytes_, eocd - 20, 4) != 0x07064b50) fail("missing ZIP64 locator");
    const uint64_t z = rd(bytes_, eocd - 20 + 8, 8);
    if (z > n - 56 || rd(bytes_, z, 4) != 0x06064b50) fail("bad ZIP64 end record");
    count = rd(bytes_, z + 32, 8);
    cd_size = rd(bytes_, z + 40, 8);
    cd_off = rd(bytes_, z + 48, 8);
  }
  if (cd_off > n || cd_size > n - cd_off) fail("central directory out of bounds");
  if (count > cd_size / 46) fail("entry count exceeds the central directory");
  uint64_t p = cd_off;
  const uint64_t cd_end = cd_off + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (p + 46 > cd_end || rd(bytes_, p, 4) != 0x02014b50) fail("bad central directory entry");
    const uint64_t method = rd(bytes_, p + 10, 2);
    const uint32_t crc = static_cast<uint32_t>(rd(bytes_, p + 16, 4));
    uint64_t csize = rd(bytes_, p + 20, 4);
    uint64_t usize = rd(bytes_, p + 24, 4);
    const uint64_t nlen = rd(bytes_, p + 28, 2), xlen = rd(bytes_, p + 30, 2),
                   clen = rd(bytes_, p + 32, 2);
    uint64_t local = rd(bytes_, p + 42, 4);
    if (p + 46 + nlen + xlen + clen > cd_end) fail("central directory entry overruns");
    std::string ename(bytes_.substr(p + 46, nlen));
    // ZIP64 extra field: the 0xFFFFFFFF fields, in order usize, csize, offset.
    uint64_t x = p + 46 + nlen;
    const uint64_t xend = x + xlen;
    while (x + 4 <= xend) {
      const uint64_t id = rd(bytes_, x, 2), len = rd(bytes_, x + 2, 2);
      if (x + 4 + len > xend) fail("extra field overruns");
      if (id == 0x0001) {
        uint64_t q = x + 4;
        auto take = [&](uint64_t& field) {
          if (field == 0xFFFFFFFF) {
            if (q + 8 > x + 4 + len) fail("short ZIP64 extra field");
            field = rd(bytes_, q, 8);
            q += 8;
          }
        };
        take(usize);
        take(csize);
        take(local);
      }
      x += 4 + len;
    }
    if (method != 0) fail("entry '" + ename + "' is compressed (only STORED is supported)");
    if (csize != usize) fail("entry '" + ename + "' has inconsistent sizes");
    if (local > n || n - local < 30 || rd(bytes_, local, 4) != 0x04034b50) {
      fail("entry '" + ename + "' has a bad local header");
    }
    const uint64_t lnlen = rd(bytes_, local + 26, 2), lxlen = rd(bytes_, local + 28, 2);
    const uint64_t data = local + 30 + lnlen + lxlen;
    if (data > n || usize > n - data) fail("entry '" + ename + "' data out of bounds");
    entries_.push_back({std::move(ename), data, usize, crc});
    p += 46 + nlen + xlen + clen;
  }
}

const ZipReader::Entry* ZipReader::find(std::string_view name) const {
  for (const Entry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string_view ZipReader::data(const Entry& e) const {
  std::string_view d = bytes_.substr(e.data_offset, e.size);
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(d.data());
  std::size_t left = d.size();
  while (left > 0) {
    const auto k = static_cast<uInt>(left > (1u << 30) ? (1u << 30) : left);
    crc = crc32(crc, p, k);
    p += k;
    left -= k;
  }
  if (static_cast<uint32_t>(crc) != e.crc) fail("CRC mismatch in entry '" + e.name + "'");
  return d;
}

}  // namespace flashinfer::formats
