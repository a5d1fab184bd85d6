// Usage mistakes named with the closest valid spelling: `flashinfer shw` answers "unknown command
// 'shw'; did you mean 'show'?", `flashinfer show --dri D` "unknown option '--dri'; did you mean
// '--dir'?". CLI11's own messages ("A subcommand is required", "The following argument was not
// expected") name neither the mistake nor the fix.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashinfer::cli {

/// Edit distance with adjacent transpositions (optimal string alignment): "shw" -> "show" is 1,
/// "shwo" -> "show" is 1.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

/// The candidate closest to `word`, when it is close enough to be a likely typo: at most 2 edits
/// and fewer edits than `word` has characters (so "x" suggests nothing); the first of equally
/// close candidates. A candidate that starts with `word` (3 characters or more: "rep" is
/// ambiguous, "repl" is not) counts as close when it is the only one.
inline std::optional<std::string> closest(std::string_view word,
                                          const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  std::size_t best_d = 3;
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best_d && d < word.size()) {
      best = c;
      best_d = d;
    }
  }
  if (best) return best;
  if (word.size() >= 3) {
    std::vector<std::string> prefixed;
    for (const std::string& c : candidates) {
      if (c.size() > word.size() && c.compare(0, word.size(), word) == 0) prefixed.push_back(c);
    }
    if (prefixed.size() == 1) return prefixed[0];
  }
  return std::nullopt;
}

}  // namespace flashinfer::cli
