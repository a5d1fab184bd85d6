// FLASHINFER_TEST_SOURCE_DIR: the checkout the tests were built from (for the Python reference
// scripts and data files under tests/).
//
// Not a -D of the absolute path, for the reason test_bin_dir.h gives (every fresh clone would
// miss ccache on these sources): tests/CMakeLists.txt writes the path at configure time into a
// file beside the test executables, and this header, force-included into the sources naming the
// macro, reads it once.
#pragma once

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "util/test_bin_dir.h"

namespace flashinfer::testing {

inline const std::string& test_source_dir() {
  static const std::string dir = [] {
    const std::string file = test_bin_dir() + "/flashinfer_test_source_dir.txt";
    std::ifstream in(file);
    std::string path;
    if (!in || !std::getline(in, path) || path.empty()) {
      throw std::runtime_error("test_source_dir: cannot read " + file +
                               " (written by tests/CMakeLists.txt at configure time)");
    }
    return path;
  }();
  return dir;
}

}  // namespace flashinfer::testing

#define FLASHINFER_TEST_SOURCE_DIR (::flashinfer::testing::test_source_dir())
