// Temporary directories a test process removes when it exits, also after a failed ASSERT_* has
// returned from the test body past its own remove_all. ctest runs each test case in its own
// process, so a directory named after the pid is gone when its case ends.
#pragma once

#include <filesystem>
#include <system_error>
#include <vector>

namespace flashinfer::testing {

/// Removes `dir` (recursively) at normal process exit. Not thread-safe: call it from the test's
/// main thread.
inline void remove_at_exit(const std::filesystem::path& dir) {
  struct Dirs {
    std::vector<std::filesystem::path> paths;
    ~Dirs() {
      std::error_code ec;  // best effort: exit must not throw
      for (const auto& p : paths) std::filesystem::remove_all(p, ec);
    }
  };
  static Dirs dirs;
  dirs.paths.push_back(dir);
}

}  // namespace flashinfer::testing
