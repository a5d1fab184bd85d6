// Private: FLASHINFER_DUMP_INCLUDE / FLASHINFER_DUMP_EXCLUDE semantics (Python's fnmatch on the
// op name, include first, then exclude). Shared by text logging (levels >= 3) and the recorder.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flashinfer::detail {

/// Python's fnmatch.fnmatchcase: `*` any run of characters, `?` one character, `[seq]` one of
/// seq (ranges `a-z`), `[!seq]` none of seq, an unclosed `[` is literal; no escape character.
bool fnmatch_case(std::string_view pattern, std::string_view name);

/// Splits a comma-separated list, strips whitespace around each entry and drops empty ones
/// ("*decode*, *prefill*" -> {"*decode*", "*prefill*"}).
std::vector<std::string> split_pattern_list(std::string_view text);

struct NameFilter {
  std::vector<std::string> include;
  std::vector<std::string> exclude;

  /// True when `name` matches an include pattern (or the include list is empty) and no exclude
  /// pattern.
  bool passes(std::string_view name) const;
  bool empty() const { return include.empty() && exclude.empty(); }
};

}  // namespace flashinfer::detail
