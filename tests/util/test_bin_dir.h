// FLASHINFER_TEST_BIN_DIR: the directory holding the test executables and, beside them, the
// `flashinfer` tool, repro_recorder and the examples (CMAKE_RUNTIME_OUTPUT_DIRECTORY).
//
// tests/CMakeLists.txt force-includes this header (-include) into every test instead of passing
// the build directory's absolute path with -D: a -D value is part of ccache's key and base_dir
// does not rewrite it, so every test missed the cache in each fresh clone. The directory is the
// running executable's own, read from /proc/self/exe, hence correct from any working directory.
#pragma once

#include <unistd.h>

#include <stdexcept>
#include <string>

namespace flashinfer::testing {

inline std::string test_bin_dir() {
  std::string exe(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", exe.data(), exe.size());
  if (n <= 0 || static_cast<size_t>(n) >= exe.size()) {
    throw std::runtime_error("test_bin_dir: cannot read /proc/self/exe");
  }
  exe.resize(static_cast<size_t>(n));
  return exe.substr(0, exe.rfind('/'));  // readlink gives an absolute path: a '/' is there
}

}  // namespace flashinfer::testing

#define FLASHINFER_TEST_BIN_DIR (::flashinfer::testing::test_bin_dir())
