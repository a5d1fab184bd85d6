#include "formats/torch_archive.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <future>
#include <new>
#include <system_error>
#include <vector>

#include "core/strided.h"
#include "formats/pickle_writer.h"
#include "formats/zip_writer.h"

namespace flashinfer::formats {

namespace {

// torch's legacy typed-storage class for dtypes that predate fp8; nullptr for the new dtypes,
// which torch saves with _rebuild_tensor_v3 and an UntypedStorage.
const char* legacy_storage_class(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "FloatStorage";
    case DType::kFloat64:
      return "DoubleStorage";
    case DType::kFloat16:
      return "HalfStorage";
    case DType::kBFloat16:
      return "BFloat16Storage";
    case DType::kInt64:
      return "LongStorage";
    case DType::kInt32:
      return "IntStorage";
    case DType::kInt16:
      return "ShortStorage";
    case DType::kInt8:
      return "CharStorage";
    case DType::kUInt8:
      return "ByteStorage";
    case DType::kBool:
      return "BoolStorage";
    default:
      return nullptr;
  }
}

void put_u32(std::vector<uint8_t>& b, std::size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

bool write_all(int fd, const void* p, uint64_t n) noexcept {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const std::size_t chunk = n > (1u << 30) ? (1u << 30) : static_cast<std::size_t>(n);
    const ssize_t w = ::write(fd, b, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<uint64_t>(w);
  }
  return true;
}

}  // namespace

std::string torch_data_pkl(const std::vector<TorchItem>& items) {
  PickleWriter pk;
  pk.empty_dict();
  pk.mark();
  for (std::size_t i = 0; i < items.size(); ++i) {
    const TorchItem& t = items[i];
    const char* legacy = legacy_storage_class(t.dtype);
    pk.unicode(t.name);
    pk.global("torch._utils", legacy ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
    pk.mark();
    {
      // Persistent id: ('storage', <class>, key, location, numel of the storage).
      pk.mark();
      pk.unicode("storage");
      pk.global("torch", legacy ? legacy : "UntypedStorage");
      pk.unicode(std::to_string(i));
      pk.unicode("cpu");
      pk.integer(legacy ? t.span : t.span * static_cast<int64_t>(dtype_size(t.dtype)));
      pk.tuple();
      pk.binpersid();
      pk.integer(t.offset);
      pk.int_tuple(t.shape);
      pk.int_tuple(t.strides);
      pk.boolean(false);  // requires_grad
      pk.global("collections", "OrderedDict");
      pk.empty_tuple();
      pk.reduce();  // backward hooks
      if (!legacy) pk.global("torch", std::string(dtype_torch_name(t.dtype)).substr(6));
    }
    pk.tuple();
    pk.reduce();
  }
  pk.setitems();
  return pk.finish();
}

TorchItem torch_item(const std::string& name, const Tensor& t, const void** data) {
  const auto [begin, end] = detail::covered_span(t.shape(), t.strides(), t.storage_offset());
  if (data) {
    *data = end > begin
                ? static_cast<const char*>(t.data_ptr()) -
                      (t.storage_offset() - begin) * static_cast<int64_t>(dtype_size(t.dtype()))
                : nullptr;
  }
  return {name, t.dtype(), t.shape(), t.strides(), t.storage_offset() - begin, end - begin};
}

ArchivePlan plan_torch_archive(std::string_view stem, const std::vector<TorchItem>& items,
                               const std::vector<const void*>& data) {
  ArchivePlan plan;
  std::vector<ZipEntryInfo> entries;
  std::vector<std::size_t> crc_entry;  // entry index of each CRC slot
  uint64_t pos = 0;
  auto own = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    plan.pieces.push_back({nullptr, plan.header.size(), n});
    plan.header.insert(plan.header.end(), b, b + n);
    pos += n;
  };
  // A small member: its bytes are copied into the header and its CRC computed now.
  auto add_owned = [&](const std::string& name, const void* p, std::size_t n) {
    const uint32_t crc = zip_crc32(p, n);
    entries.push_back({name, crc, n, pos});
    const std::vector<uint8_t> h = zip_local_header(name, crc, n, pos);
    own(h.data(), h.size());
    own(p, n);
  };
  const std::string s(stem);
  const std::string pkl = torch_data_pkl(items);
  add_owned(s + "/data.pkl", pkl.data(), pkl.size());
  static const char kLittle[] = "little";
  add_owned(s + "/byteorder", kLittle, sizeof(kLittle) - 1);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const uint64_t n = static_cast<uint64_t>(items[i].span) * dtype_size(items[i].dtype);
    const std::string name = s + "/data/" + std::to_string(i);
    entries.push_back({name, 0, n, pos});
    const std::vector<uint8_t> h = zip_local_header(name, 0, n, pos);
    ArchivePlan::CrcSlot slot;
    slot.local_at = plan.header.size() + kZipLocalCrcOffset;
    own(h.data(), h.size());
    slot.piece = plan.pieces.size();
    plan.pieces.push_back({data[i], 0, n});
    pos += n;
    plan.crc_slots.push_back(slot);
    crc_entry.push_back(entries.size() - 1);
  }
  static const char kVersion[] = "3\n";
  add_owned(s + "/version", kVersion, sizeof(kVersion) - 1);
  std::vector<std::size_t> starts;
  const std::vector<uint8_t> cd = zip_central_directory(entries, pos, &starts);
  const std::size_t cd_at = plan.header.size();
  own(cd.data(), cd.size());
  for (std::size_t k = 0; k < plan.crc_slots.size(); ++k) {
    plan.crc_slots[k].central_at = cd_at + starts[crc_entry[k]] + kZipCentralCrcOffset;
  }
  plan.size = pos;
  plan.items = std::make_shared<const std::vector<TorchItem>>(items);
  return plan;
}

namespace {

uint32_t piece_crc(const ArchivePlan::Piece& p) noexcept {
  uint32_t crc = 0;
  for_each_run(p, [&](const uint8_t* b, uint64_t n) {
    crc = zip_crc32_update(crc, b, static_cast<std::size_t>(n));
    return true;
  });
  return crc;
}

}  // namespace

bool write_archive_plan(int fd, ArchivePlan& plan) noexcept {
  for (const ArchivePlan::CrcSlot& slot : plan.crc_slots) {
    const uint32_t crc = piece_crc(plan.pieces[slot.piece]);
    put_u32(plan.header, slot.local_at, crc);
    put_u32(plan.header, slot.central_at, crc);
  }
  // Consecutive header pieces are adjacent in `header`: coalesce them into one write.
  std::size_t i = 0;
  while (i < plan.pieces.size()) {
    const ArchivePlan::Piece& p = plan.pieces[i];
    if (p.data) {
      if (!for_each_run(p, [&](const uint8_t* b, uint64_t n) { return write_all(fd, b, n); })) {
        return false;
      }
      ++i;
      continue;
    }
    uint64_t at = p.at, n = p.size;
    std::size_t j = i + 1;
    while (j < plan.pieces.size() && !plan.pieces[j].data && plan.pieces[j].at == at + n) {
      n += plan.pieces[j].size;
      ++j;
    }
    if (n && !write_all(fd, plan.header.data() + at, n)) return false;
    i = j;
  }
  return true;
}

bool write_archive_layout(int fd, const ArchivePlan& layout,
                          const ArchivePlan::Piece* data) noexcept {
  const std::size_t items = layout.crc_slots.size();
  // The CRCs, computed once (an archive of more items recomputes the rest where needed).
  constexpr std::size_t kKept = 256;
  uint32_t crcs[kKept];
  for (std::size_t k = 0; k < items && k < kKept; ++k) crcs[k] = piece_crc(data[k]);
  const auto crc_of = [&](std::size_t k) { return k < kKept ? crcs[k] : piece_crc(data[k]); };
  // Header bytes [at, at + n), with every CRC field inside it (4 bytes at local_at or
  // central_at; local headers come before the central directory, both in item order) written
  // from the table instead of the layout.
  const auto write_header = [&](uint64_t at, uint64_t n) noexcept {
    uint64_t pos = at;
    const uint64_t end = at + n;
    for (int central = 0; central < 2; ++central) {
      for (std::size_t k = 0; k < items; ++k) {
        const ArchivePlan::CrcSlot& slot = layout.crc_slots[k];
        const uint64_t f = central ? slot.central_at : slot.local_at;
        if (f < pos || f + 4 > end) continue;
        if (f > pos && !write_all(fd, layout.header.data() + pos, f - pos)) return false;
        const uint32_t c = crc_of(k);
        const uint8_t le[4] = {static_cast<uint8_t>(c), static_cast<uint8_t>(c >> 8),
                               static_cast<uint8_t>(c >> 16), static_cast<uint8_t>(c >> 24)};
        if (!write_all(fd, le, 4)) return false;
        pos = f + 4;
      }
    }
    return pos >= end || write_all(fd, layout.header.data() + pos, end - pos);
  };
  std::size_t i = 0, k = 0;
  while (i < layout.pieces.size()) {
    if (k < items && layout.crc_slots[k].piece == i) {
      if (!for_each_run(data[k],
                        [&](const uint8_t* b, uint64_t n) { return write_all(fd, b, n); })) {
        return false;
      }
      ++k;
      ++i;
      continue;
    }
    // Consecutive header pieces are adjacent in `header`: coalesced into one range.
    const ArchivePlan::Piece& p = layout.pieces[i];
    uint64_t at = p.at, n = p.size;
    std::size_t j = i + 1;
    while (j < layout.pieces.size() && !(k < items && layout.crc_slots[k].piece == j) &&
           layout.pieces[j].at == at + n) {
      n += layout.pieces[j].size;
      ++j;
    }
    if (n && !write_header(at, n)) return false;
    i = j;
  }
  return true;
}

namespace {

// An archive of at most this many bytes is copied whole and written with one write(2).
constexpr uint64_t kCopiedArchive = uint64_t{4} << 20;
// A larger one goes through a buffer of this size.
constexpr std::size_t kStreamChunk = std::size_t{4} << 20;

// Each piece's offset from the archive's start, in `off`; false on a size that does not add up.
bool piece_offsets(const ArchivePlan& plan, std::vector<uint64_t>& off) {
  off.resize(plan.pieces.size());
  uint64_t at = 0;
  for (std::size_t i = 0; i < plan.pieces.size(); ++i) {
    off[i] = at;
    at += plan.pieces[i].size;
  }
  return at == plan.size;
}

bool pwrite_all(int fd, const uint8_t* p, uint64_t n, off_t at) noexcept {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, static_cast<std::size_t>(n), at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<uint64_t>(w);
    at += static_cast<off_t>(w);
  }
  return true;
}

// The copy buffer is kept per thread between archives, but an archive written from an exit
// handler (the recorder's last graph dumps) runs after the thread's thread_local objects were
// destroyed: it then gets a buffer of its own.
thread_local bool t_copy_buffer_gone = false;  // trivially destructible: readable at exit
struct CopyBuffer {
  std::vector<uint8_t> bytes;
  ~CopyBuffer() { t_copy_buffer_gone = true; }
};
thread_local CopyBuffer t_copy_buffer;

// The whole archive copied into one buffer: the data first, each entry's CRC then taken from
// the copy, the headers last.
bool write_copied_archive(int fd, ArchivePlan& plan, const std::vector<uint64_t>& off) {
  std::vector<uint8_t> own;
  std::vector<uint8_t>& buf = t_copy_buffer_gone ? own : t_copy_buffer.bytes;
  buf.resize(static_cast<std::size_t>(plan.size));
  for (const ArchivePlan::CrcSlot& slot : plan.crc_slots) {
    uint8_t* dst = buf.data() + off[slot.piece];
    const uint8_t* begin = dst;
    for_each_run(plan.pieces[slot.piece], [&](const uint8_t* b, uint64_t n) {
      std::copy(b, b + n, dst);
      dst += n;
      return true;
    });
    const uint32_t crc = zip_crc32(begin, static_cast<std::size_t>(dst - begin));
    put_u32(plan.header, slot.local_at, crc);
    put_u32(plan.header, slot.central_at, crc);
  }
  for (std::size_t i = 0; i < plan.pieces.size(); ++i) {
    const ArchivePlan::Piece& p = plan.pieces[i];
    if (!p.data) {
      std::copy(plan.header.data() + p.at, plan.header.data() + p.at + p.size, buf.data() + off[i]);
    }
  }
  const bool ok = write_all(fd, buf.data(), plan.size);
  if (buf.capacity() > kCopiedArchive) std::vector<uint8_t>().swap(buf);  // an O_APPEND giant
  return ok;
}

// A large archive at the file's offset: each entry's bytes through a buffer (CRC and write both
// from it) with pwrite(2), then the headers with the CRCs filled in; the file offset is left at
// the archive's end.
bool write_streamed_archive(int fd, ArchivePlan& plan, const std::vector<uint64_t>& off) {
  const off_t base = ::lseek(fd, 0, SEEK_CUR);
  if (base < 0) return false;
  // Two buffers: this thread copies the bytes into one and takes their CRC while a second
  // thread writes the other (serially, copy and zlib's CRC, about 2.4 GB/s here, added a third
  // to a write to ext4: the 64 MiB save_torch bench at 0.7x a raw write instead of 0.9x).
  std::vector<uint8_t> bufs[2] = {std::vector<uint8_t>(kStreamChunk),
                                  std::vector<uint8_t>(kStreamChunk)};
  int cur = 0;
  std::size_t fill = 0;
  off_t at = base;
  uint32_t crc = 0;
  std::future<bool> writing;  // the write of bufs[cur ^ 1]
  const auto wait_write = [&writing] { return !writing.valid() || writing.get(); };
  const auto hand_off = [&]() -> bool {
    if (fill == 0) return true;
    crc = zip_crc32_update(crc, bufs[cur].data(), fill);
    if (!wait_write()) return false;
    const auto job = [fd, p = bufs[cur].data(), n = fill, w = at] {
      return pwrite_all(fd, p, n, w);
    };
    try {
      writing = std::async(std::launch::async, job);
    } catch (const std::system_error&) {  // no thread to be had: written at the next wait
      writing = std::async(std::launch::deferred, job);
    }
    at += static_cast<off_t>(fill);
    cur ^= 1;
    fill = 0;
    return true;
  };
  bool ok = true;
  for (const ArchivePlan::CrcSlot& slot : plan.crc_slots) {
    crc = 0;
    at = base + static_cast<off_t>(off[slot.piece]);
    ok = for_each_run(plan.pieces[slot.piece], [&](const uint8_t* b, uint64_t n) {
      while (n > 0) {
        const uint64_t room = kStreamChunk - fill;
        const std::size_t k = static_cast<std::size_t>(n < room ? n : room);
        std::copy(b, b + k, bufs[cur].data() + fill);
        fill += k;
        b += k;
        n -= k;
        if (fill == kStreamChunk && !hand_off()) return false;
      }
      return true;
    });
    if (ok) ok = hand_off();
    if (!ok) break;
    put_u32(plan.header, slot.local_at, crc);
    put_u32(plan.header, slot.central_at, crc);
  }
  // Every write finished before the buffers go, whatever happened.
  if (!wait_write() || !ok) return false;
  for (std::size_t i = 0; i < plan.pieces.size(); ++i) {
    const ArchivePlan::Piece& p = plan.pieces[i];
    if (!p.data && p.size &&
        !pwrite_all(fd, plan.header.data() + p.at, p.size, base + static_cast<off_t>(off[i]))) {
      return false;
    }
  }
  return ::lseek(fd, base + static_cast<off_t>(plan.size), SEEK_SET) >= 0;
}

}  // namespace

bool write_archive_copied(int fd, ArchivePlan& plan) noexcept {
  // A tensor's bytes may change while it is written (a peer rank writing into a workspace both
  // share, session 53): the CRC in the file must be that of the bytes in the file, so both are
  // taken from one copy. CRC then write(2) from the tensor itself left a mismatch, and
  // load_torch refuses the archive.
  try {
    std::vector<uint64_t> off;
    if (!piece_offsets(plan, off)) return write_archive_plan(fd, plan);
    if (plan.size <= kCopiedArchive) return write_copied_archive(fd, plan, off);
    // pwrite(2) ignores its offset on an O_APPEND file (Linux): a large archive is copied whole.
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0 && (flags & O_APPEND)) return write_copied_archive(fd, plan, off);
    return write_streamed_archive(fd, plan, off);
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
    return false;
  }
}

}  // namespace flashinfer::formats
