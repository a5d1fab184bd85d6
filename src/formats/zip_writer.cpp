#include "formats/zip_writer.h"

#include <zlib.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>

#include "flashinfer/error.h"

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

ZipWriter::ZipWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, "zip", "path", "cannot create '", path,
                    "': ", std::strerror(errno));
  }
  pending_.reserve(8192);
}

ZipWriter::~ZipWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void ZipWriter::write_fd(const void* p, std::size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd_, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      FLASHINFER_FAIL(ErrorCode::kIo, "zip", "path", "writing '", path_,
                      "' failed: ", w < 0 ? std::strerror(errno) : "no progress");
    }
    b += w;
    n -= static_cast<std::size_t>(w);
  }
}

void ZipWriter::flush() {
  if (pending_.empty()) return;
  write_fd(pending_.data(), pending_.size());
  pending_.clear();
}

void ZipWriter::write(const void* p, std::size_t n) {
  constexpr std::size_t kCoalesce = 256u << 10;  // larger pieces go straight to the file
  if (n >= kCoalesce) {
    flush();
    write_fd(p, n);
  } else if (n > 0) {
    const auto* b = static_cast<const uint8_t*>(p);
    pending_.insert(pending_.end(), b, b + n);
  }
  pos_ += n;
}

void ZipWriter::add(std::string_view name, const void* data, std::size_t size) {
  // Large entries: the CRC is computed on another thread while the data is written, and patched
  // into the local header afterwards, so a dump costs about one pass over the bytes, not two.
  constexpr std::size_t kOverlapBytes = 4u << 20;
  std::future<uint32_t> crc_later;
  uint32_t crc = 0;
  if (size >= kOverlapBytes) {
    crc_later = std::async(std::launch::async, [data, size] { return zip_crc32(data, size); });
  } else {
    crc = zip_crc32(data, size);
  }
  const uint64_t header_pos = pos_;
  const std::vector<uint8_t> h = zip_local_header(name, crc, size, pos_);
  write(h.data(), h.size());
  write(data, size);
  if (crc_later.valid()) {
    crc = crc_later.get();
    uint8_t le[4];
    for (int i = 0; i < 4; ++i) le[i] = static_cast<uint8_t>(crc >> (8 * i));
    // The header was flushed before the (large) data went straight to the file.
    if (::pwrite(fd_, le, 4, static_cast<off_t>(header_pos + 14)) != 4) {
      FLASHINFER_FAIL(ErrorCode::kIo, "zip", "path", "writing '", path_,
                      "' failed: ", std::strerror(errno));
    }
  }
  entries_.push_back({std::string(name), crc, size, header_pos});
}

void ZipWriter::finish() {
  const std::vector<uint8_t> cd = zip_central_directory(entries_, pos_);
  write(cd.data(), cd.size());
  flush();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, "zip", "path", "closing '", path_,
                    "' failed: ", std::strerror(errno));
  }
}

}  // namespace flashinfer::formats
