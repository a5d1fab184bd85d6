#include "calls/name_filter.h"

#include <cstddef>

namespace flashinfer::detail {

namespace {

// Tries to match a bracket expression starting at pattern[i] == '['. Returns false with
// `closed` = false when the bracket never closes (then '[' is a literal, as in Python).
bool match_set(std::string_view p, std::size_t i, char c, std::size_t& next, bool& closed) {
  std::size_t j = i + 1;
  bool negate = false;
  if (j < p.size() && p[j] == '!') {
    negate = true;
    ++j;
  }
  const std::size_t first = j;
  // A ']' right after '[' or '[!' is a member, not the end.
  if (j < p.size() && p[j] == ']') ++j;
  while (j < p.size() && p[j] != ']') ++j;
  if (j >= p.size()) {
    closed = false;
    return false;
  }
  closed = true;
  next = j + 1;
  bool hit = false;
  for (std::size_t k = first; k < j; ++k) {
    if (k + 2 < j && p[k + 1] == '-') {
      // Range lo-hi; an empty (reversed) range matches nothing, as in Python.
      if (p[k] <= c && c <= p[k + 2]) hit = true;
      k += 2;
    } else if (p[k] == c) {
      hit = true;
    }
  }
  return hit != negate;
}

// Matches one non-star pattern element at p[pi] against c; sets `len` to its pattern length.
bool match_one(std::string_view p, std::size_t pi, char c, std::size_t& len) {
  if (p[pi] == '?') {
    len = 1;
    return true;
  }
  if (p[pi] == '[') {
    std::size_t next = 0;
    bool closed = false;
    const bool hit = match_set(p, pi, c, next, closed);
    if (closed) {
      len = next - pi;
      return hit;
    }
  }
  len = 1;
  return p[pi] == c;
}

}  // namespace

bool fnmatch_case(std::string_view p, std::string_view s) {
  // Classic single-star backtracking: every element but '*' consumes exactly one character.
  std::size_t pi = 0, si = 0;
  std::size_t star_p = std::string_view::npos, star_s = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star_p = ++pi;
      star_s = si;
      continue;
    }
    std::size_t len = 0;
    if (pi < p.size() && match_one(p, pi, s[si], len)) {
      pi += len;
      ++si;
      continue;
    }
    if (star_p == std::string_view::npos) return false;
    pi = star_p;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

std::vector<std::string> split_pattern_list(std::string_view text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(start, end - start);
    // Python's str.strip(): ASCII whitespace.
    const char* ws = " \t\n\r\f\v";
    const auto b = item.find_first_not_of(ws);
    if (b != std::string_view::npos) {
      const auto e = item.find_last_not_of(ws);
      out.emplace_back(item.substr(b, e - b + 1));
    }
    start = end + 1;
  }
  return out;
}

bool NameFilter::passes(std::string_view name) const {
  if (!include.empty()) {
    bool any = false;
    for (const auto& pat : include) {
      if (fnmatch_case(pat, name)) {
        any = true;
        break;
      }
    }
    if (!any) return false;
  }
  for (const auto& pat : exclude) {
    if (fnmatch_case(pat, name)) return false;
  }
  return true;
}

}  // namespace flashinfer::detail
