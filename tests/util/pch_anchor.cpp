// The executable that builds the test executables' precompiled header (tests/CMakeLists.txt,
// flashinfer_test_pch): the tests reuse it; it holds no test and ctest does not run it.
#include <gtest/gtest.h>
