// Private: the limits every dump and tensor-file reader enforces, and the bounded file read
// they share. A dump directory is untrusted input (issue 16): a hostile one must produce an
// Error, never a hang, a stack overflow or an unbounded allocation. docs/STATUS.md ("Reader
// limits") and docs/LOGGING.md (replay) list these values.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/error.h"

namespace flashinfer::formats {

/// Deepest nesting of arrays/objects accepted in a metadata.jsonl line or a safetensors header
/// (real records nest fewer than 10 levels). Checked before parsing.
inline constexpr int kMaxJsonDepth = 512;
/// Deepest nesting of tuples/lists/dicts accepted in a pickle (inputs.pt and friends).
inline constexpr int kMaxPickleDepth = 1000;
/// Largest metadata.jsonl line, and largest metadata.jsonl file.
inline constexpr std::size_t kMaxMetadataLineBytes = std::size_t{16} << 20;  // 16 MiB
inline constexpr std::size_t kMaxMetadataFileBytes = std::size_t{64} << 20;  // 64 MiB
/// Largest tensor file (inputs/outputs/mutated .pt or .safetensors) read whole.
inline constexpr std::size_t kMaxTensorFileBytes = std::size_t{64} << 30;  // 64 GiB
/// Most logical elements of a recorded tensor whose elements repeat (a stride-0 view holds more
/// logical elements than its storage): an op replayed on a 2^42-element broadcast input would
/// run for hours. Views within their storage are not limited (their file already paid for them).
inline constexpr int64_t kMaxBroadcastElements = int64_t{1} << 32;

/// Throws when `numel` logical elements over `stored` elements of storage exceed
/// kMaxBroadcastElements, naming `op` and the tensor `name`.
inline void check_broadcast_elements(int64_t numel, int64_t stored, const char* op,
                                     const std::string& name) {
  if (numel > stored && numel > kMaxBroadcastElements) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, name, "is a view of ", numel,
                    " logical elements over ", stored, " stored ones: more than the limit of ",
                    kMaxBroadcastElements, " repeated elements (kMaxBroadcastElements)");
  }
}

/// `text` (JSON) with every lone UTF-16 surrogate escape (`\udcff` alone, a high surrogate not
/// followed by a low one) replaced by `\ufffd`. Python's json.dumps writes lone surrogates for
/// strings that hold undecodable bytes (a dump directory whose name is not UTF-8, decoded with
/// surrogateescape); our JSON parser refuses them, so they are shown as U+FFFD instead.
inline std::string json_without_lone_surrogates(std::string_view text) {
  if (text.find("\\u") == std::string_view::npos) return std::string(text);
  auto hex4 = [&](std::size_t at, unsigned* v) {
    if (at + 4 > text.size()) return false;
    unsigned x = 0;
    for (std::size_t k = at; k < at + 4; ++k) {
      const char c = text[k];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return false;
      x = x * 16 + static_cast<unsigned>(d);
    }
    *v = x;
    return true;
  };
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    if (text[i] != '\\' || i + 1 >= text.size()) {
      out += text[i++];
      continue;
    }
    unsigned cp = 0, lo = 0;
    if (text[i + 1] != 'u' || !hex4(i + 2, &cp) || cp < 0xD800 || cp > 0xDFFF) {
      out.append(text.substr(i, 2));  // another escape, or a non-surrogate \uXXXX (copied on)
      i += 2;
      continue;
    }
    if (cp <= 0xDBFF && i + 12 <= text.size() && text[i + 6] == '\\' && text[i + 7] == 'u' &&
        hex4(i + 8, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
      out.append(text.substr(i, 12));  // a well-formed pair
      i += 12;
      continue;
    }
    out += "\\ufffd";
    i += 6;
  }
  return out;
}

/// The whole content of `path`, which must be a regular file (a symlink to one is fine) of at
/// most `max_bytes`: a FIFO, a device (/dev/zero), a socket or a directory is an Error
/// (ErrorCode::kIo, naming `op`), and so is a larger file. The open does not block on a FIFO.
inline std::string read_regular_file(const std::string& path, std::size_t max_bytes,
                                     const char* op) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, op, "path", "cannot open '", path, "': ", std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, op, "path", "cannot stat '", path, "': ", std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    FLASHINFER_FAIL(ErrorCode::kIo, op, "path", "'", path,
                    "' is not a regular file (a FIFO, device, socket or directory)");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    FLASHINFER_FAIL(ErrorCode::kIo, op, "path", "'", path, "' is ", st.st_size,
                    " bytes, more than the limit of ", max_bytes);
  }
  // Read what the size said, and at most one byte more to notice a file still growing.
  std::string s(static_cast<std::size_t>(st.st_size) + 1, '\0');
  std::size_t got = 0;
  while (got < s.size()) {
    const ssize_t n = ::read(fd, s.data() + got, s.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      FLASHINFER_FAIL(ErrorCode::kIo, op, "path", "reading '", path,
                      "' failed: ", std::strerror(errno));
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > max_bytes) {
    FLASHINFER_FAIL(ErrorCode::kIo, op, "path", "'", path, "' grew past the limit of ", max_bytes,
                    " bytes while being read");
  }
  s.resize(got);
  return s;
}

/// Whether a JSON text nests arrays/objects deeper than `max_depth` (strings are skipped, with
/// their escapes). O(n), no recursion: run it before a parser that might recurse.
inline bool json_too_deep(std::string_view text, int max_depth = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

/// Whether `p` (canonical) lies inside the directory `root` (canonical).
inline bool path_within(const std::filesystem::path& p, const std::filesystem::path& root) {
  auto [r, q] = std::mismatch(root.begin(), root.end(), p.begin(), p.end());
  return r == root.end();
}

/// The call directories of a dump root: its subdirectories that hold `metadata_file`. A
/// subdirectory that is a symlink is followed only when its target lies inside `root` (a dump
/// must not make `show` or `replay` read elsewhere); entries that cannot be examined are left
/// out. Unsorted.
inline std::vector<std::filesystem::path> call_directories(const std::filesystem::path& root,
                                                           std::string_view metadata_file) {
  namespace fs = std::filesystem;
  std::vector<fs::path> out;
  std::error_code ec;
  const fs::path croot = fs::canonical(root, ec);
  if (ec) return out;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& e = *it;
    std::error_code ec2;
    if (!e.is_directory(ec2) || ec2) continue;
    if (e.is_symlink(ec2)) {
      const fs::path target = fs::canonical(e.path(), ec2);
      if (ec2 || !path_within(target, croot) || target == croot) continue;
    }
    if (fs::exists(e.path() / metadata_file, ec2) && !ec2) out.push_back(e.path());
  }
  return out;
}

}  // namespace flashinfer::formats
