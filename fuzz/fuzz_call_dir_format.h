// The input format of fuzz_call_dir, shared with fuzz_make_seeds: a call directory's files, each
// as its name, a newline and its bytes, joined by kFileSeparator. Only the names a call
// directory has are written (anything else is skipped, so no input writes outside the
// directory); a later section of the same name replaces an earlier one.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashinfer::fuzz {

inline constexpr std::string_view kFileSeparator = "\n%%fi-call-file%%\n";
inline constexpr std::array<std::string_view, 7> kCallFileNames = {
    "metadata.jsonl",      "inputs.pt",  "inputs.safetensors", "outputs.pt",
    "outputs.safetensors", "mutated.pt", "mutated.safetensors"};

/// (name, content) of each section with an allowed name.
inline std::vector<std::pair<std::string_view, std::string_view>> split_call_files(
    std::string_view in) {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  while (true) {
    const std::size_t at = in.find(kFileSeparator);
    const std::string_view section = in.substr(0, at);
    const std::size_t nl = section.find('\n');
    if (nl != std::string_view::npos) {
      const std::string_view name = section.substr(0, nl);
      for (std::string_view allowed : kCallFileNames) {
        if (name == allowed) out.emplace_back(name, section.substr(nl + 1));
      }
    }
    if (at == std::string_view::npos) break;
    in.remove_prefix(at + kFileSeparator.size());
  }
  return out;
}

inline std::string join_call_files(const std::vector<std::pair<std::string, std::string>>& files) {
  std::string s;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (i) s += kFileSeparator;
    s += files[i].first + "\n" + files[i].second;
  }
  return s;
}

}  // namespace flashinfer::fuzz
