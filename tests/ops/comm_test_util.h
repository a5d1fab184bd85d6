// Shared by the collectives' tests (test_comm, test_moe_alltoall, test_ulysses): a refusal
// checked by the text of its message, which names upstream's wording.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "flashinfer/error.h"

namespace flashinfer::testing {

/// `fn` throws a flashinfer::Error whose message holds `what`.
inline void expect_error(const std::function<void()>& fn, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "no error, expected " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace flashinfer::testing
