// Text read from a dump (function names, directory names, error messages quoting them) is
// whatever the recording process, or someone crafting a dump, put there. Printed to a terminal
// its control characters are escaped (no escape sequences reach the terminal); put into JSON its
// bytes that are not UTF-8 are escaped (the report is always valid JSON). Both write such a byte
// as the four characters \xHH, as Python's repr does.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace flashinfer::cli {

/// The length of the valid UTF-8 sequence starting at s[i] (1 to 4), or 0 when the byte there
/// does not start one (a stray continuation byte, an overlong form, a surrogate, a truncation).
inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const auto cont = [&](std::size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return i + k < s.size() && b(k) >= lo && b(k) <= hi;
  };
  const unsigned c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return cont(1, lo, hi) && cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

inline void append_hex_byte(std::string& out, unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\x%02x", c);
  out += buf;
}

/// `s` for a terminal: C0 controls, DEL, C1 controls (U+0080..U+009F) and bytes that are not
/// UTF-8 as \xHH; everything else as is.
inline std::string terminal_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = utf8_sequence_length(s, i);
    const bool c1 = n == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0;
    if (n == 0 || c < 0x20 || c == 0x7F || c1) {
      for (std::size_t k = 0; k < (c1 ? 2 : 1); ++k) {
        append_hex_byte(out, static_cast<unsigned char>(s[i + k]));
      }
      i += c1 ? 2 : 1;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

/// `s` for a JSON string value: unchanged when it is UTF-8, else each byte that is not part of
/// a valid sequence as \xHH (JSON's own escaping of controls is the serializer's).
inline std::string json_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence_length(s, i);
    if (n == 0) {
      append_hex_byte(out, static_cast<unsigned char>(s[i]));
      ++i;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace flashinfer::cli
