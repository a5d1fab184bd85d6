#include "recorder/ring_dedup_dump.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack: hashing a patched piece allocates
                                 // nothing
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "flashinfer/dtype.h"
#include "formats/dedup_store.h"

namespace flashinfer::recorder::internal {

namespace {

// Text appended to a fixed buffer and written to `fd` whenever it fills: no allocation.
struct Out {
  int fd = -1;
  char buf[4096];
  std::size_t n = 0;
  bool ok = true;
  void flush() {
    const char* p = buf;
    std::size_t left = n;
    while (ok && left > 0) {
      const ssize_t w = ::write(fd, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        ok = false;
        break;
      }
      p += w;
      left -= static_cast<std::size_t>(w);
    }
    n = 0;
  }
  void put(const char* s, std::size_t len) {
    while (len > 0) {
      if (n == sizeof(buf)) flush();
      const std::size_t k = len < sizeof(buf) - n ? len : sizeof(buf) - n;
      std::memcpy(buf + n, s, k);
      n += k;
      s += k;
      len -= k;
    }
  }
  void put(std::string_view s) { put(s.data(), s.size()); }
  void put_i64(int64_t v) {
    char d[24];
    int k = 0;
    uint64_t u = v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
    do {
      d[k++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u > 0);
    if (v < 0) put("-", 1);
    while (k > 0) put(&d[--k], 1);
  }
  // A JSON string as record-everything mode's refs writes it (python_json's escapes for ASCII;
  // keys are parameter names, result_<i> and the like: a non-ASCII byte goes through as is).
  void put_json_string(std::string_view s) {
    put("\"", 1);
    for (const char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"':
          put("\\\"", 2);
          break;
        case '\\':
          put("\\\\", 2);
          break;
        case '\n':
          put("\\n", 2);
          break;
        case '\r':
          put("\\r", 2);
          break;
        case '\t':
          put("\\t", 2);
          break;
        case '\b':
          put("\\b", 2);
          break;
        case '\f':
          put("\\f", 2);
          break;
        default:
          if (c < 0x20 || c == 0x7f) {
            static const char kHex[] = "0123456789abcdef";
            const char u[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
            put(u, 6);
          } else {
            put(&ch, 1);
          }
      }
    }
    put("\"", 1);
  }
  void put_ints(const Shape& v) {
    put("[", 1);
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) put(", ", 2);
      put_i64(v[i]);
    }
    put("]", 1);
  }
};

// A path assembled in a fixed buffer.
struct Path {
  char p[8192];
  std::size_t n = 0;
  bool overflow = false;
  void put(std::string_view s) {
    if (n + s.size() + 1 > sizeof(p)) {
      overflow = true;
      return;
    }
    std::memcpy(p + n, s.data(), s.size());
    n += s.size();
    p[n] = '\0';
  }
};

int open_flags(int extra) { return O_WRONLY | O_CREAT | O_CLOEXEC | extra; }

bool write_all(int fd, const void* data, uint64_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t w = ::write(fd, p, size);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    size -= static_cast<uint64_t>(w);
  }
  return true;
}

// XXH3-128 of each blob, by address, for the dump being written: a weight held by every kept
// call is hashed once, not once per call. Allocated with the program (a crash handler cannot
// allocate); a new dump (another root) starts a new generation. One writer at a time: a dump
// that finds it taken (the crash handler interrupting a dump) hashes without it.
struct HashEntry {
  const void* data = nullptr;
  uint64_t size = 0;
  uint64_t generation = 0;
  XXH128_hash_t hash{};
};
constexpr std::size_t kHashSlots = 8192;  // 256 KiB
HashEntry g_hashes[kHashSlots];
uint64_t g_generation = 0;
char g_root[8192];
std::atomic_flag g_hashes_busy = ATOMIC_FLAG_INIT;

// The hash of a piece's bytes: its base with its patches laid over (a KV-cache delta), the
// same value as XXH3_128bits over the bytes laid out whole.
XXH128_hash_t piece_hash(const formats::ArchivePlan::Piece& p) {
  if (!p.n_patches) return XXH3_128bits(p.data, p.size);
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  formats::for_each_run(p, [&](const uint8_t* b, uint64_t n) {
    XXH3_128bits_update(&st, b, n);
    return true;
  });
  return XXH3_128bits_digest(&st);
}

XXH128_hash_t blob_hash(const formats::ArchivePlan::Piece& p, bool cached) {
  // A delta is known by its patch table (its base is shared with other contents).
  const void* data = p.n_patches ? static_cast<const void*>(p.patches) : p.data;
  const uint64_t size = p.size;
  if (!cached || !data) return piece_hash(p);
  std::size_t at = static_cast<std::size_t>(
                       (reinterpret_cast<uintptr_t>(data) >> 4) * 0x9E3779B97F4A7C15ull >> 51) %
                   kHashSlots;
  for (std::size_t probe = 0; probe < 16; ++probe, at = (at + 1) % kHashSlots) {
    HashEntry& e = g_hashes[at];
    if (e.generation == g_generation && e.data == data && e.size == size) return e.hash;
    if (e.generation != g_generation) {
      e = {data, size, g_generation, piece_hash(p)};
      return e.hash;
    }
  }
  return piece_hash(p);  // a crowded neighbourhood: not remembered
}

// "<32 lowercase hex digits>.bin": formats::dedup_blob_name's spelling (high half first).
void blob_name(const XXH128_hash_t& h, char out[40]) {
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    out[i] = kHex[(h.high64 >> (60 - 4 * i)) & 15];
    out[16 + i] = kHex[(h.low64 >> (60 - 4 * i)) & 15];
  }
  std::memcpy(out + 32, formats::kDedupBlobSuffix.data(), formats::kDedupBlobSuffix.size());
  out[32 + formats::kDedupBlobSuffix.size()] = '\0';
}

// <root>/tensors/<name>, written unless this dump already holds it.
bool store_blob(const char* root, const char* name, const formats::ArchivePlan::Piece& piece) {
  Path path;
  path.put(root);
  path.put("/");
  path.put(formats::kDedupDir);
  const std::size_t dir_len = path.n;
  path.put("/");
  path.put(name);
  if (path.overflow) return false;
  int fd = ::open(path.p, open_flags(O_EXCL), 0644);
  if (fd < 0 && errno == ENOENT) {
    path.p[dir_len] = '\0';  // the store's first blob in this dump: make the store
    const bool made = ::mkdir(path.p, 0777) == 0 || errno == EEXIST;
    path.p[dir_len] = '/';
    if (made) fd = ::open(path.p, open_flags(O_EXCL), 0644);
  }
  if (fd < 0) return errno == EEXIST;  // written already in this dump: nothing to do
  const bool ok = formats::for_each_run(
      piece, [&](const uint8_t* b, uint64_t n) { return write_all(fd, b, n); });
  ::close(fd);
  if (!ok) ::unlink(path.p);  // no half blob under a name that says it is whole
  return ok;
}

}  // namespace

bool write_ring_dedup_side(const char* root, std::string_view call_dir, std::string_view stem,
                           const std::vector<formats::TorchItem>& items,
                           const formats::ArchivePlan::Piece* data) noexcept {
  const bool cached = !g_hashes_busy.test_and_set(std::memory_order_acquire);
  if (cached && std::strcmp(g_root, root) != 0) {
    const std::size_t n = std::strlen(root);
    if (n < sizeof(g_root)) {
      std::memcpy(g_root, root, n + 1);
    } else {
      g_root[0] = '\0';
    }
    ++g_generation;  // another dump: no remembered hash holds any more
  }
  Path refs;
  refs.put(root);
  refs.put("/");
  refs.put(call_dir);
  refs.put("/");
  refs.put(stem);
  refs.put(formats::kDedupRefsSuffix);
  bool ok = !refs.overflow;
  Out out;
  if (ok) {
    do {
      out.fd = ::open(refs.p, open_flags(O_TRUNC), 0644);
    } while (out.fd < 0 && errno == EINTR);
    ok = out.fd >= 0;
  }
  if (ok) {
    out.put("{\"format\": ");
    out.put_json_string(formats::kDedupFormat);
    out.put(", \"tensors\": [");
    for (std::size_t i = 0; i < items.size(); ++i) {
      const formats::TorchItem& it = items[i];
      const formats::ArchivePlan::Piece& piece = data[i];
      char name[40];
      blob_name(blob_hash(piece, cached), name);
      ok = store_blob(root, name, piece) && ok;
      if (i) out.put(", ");
      out.put("{\"key\": ");
      out.put_json_string(it.name);
      out.put(", \"blob\": ");
      out.put_json_string(name);
      out.put(", \"dtype\": ");
      out.put_json_string(dtype_torch_name(it.dtype));
      out.put(", \"shape\": ");
      out.put_ints(it.shape);
      out.put(", \"stride\": ");
      out.put_ints(it.strides);
      out.put(", \"storage_offset\": ");
      out.put_i64(it.offset);
      out.put(", \"nbytes\": ");
      out.put_i64(static_cast<int64_t>(piece.size));
      out.put("}");
    }
    out.put("]}\n");
    out.flush();
    ok = ok && out.ok;
    ::close(out.fd);
  }
  if (cached) g_hashes_busy.clear(std::memory_order_release);
  return ok;
}

}  // namespace flashinfer::recorder::internal
