// The fatal-signal stack printer linked into every test binary (tests/util/crash_handler.cpp).
#pragma once

namespace flashinfer::test {

// Whether the handler owns `sig` (false where a sanitizer had installed its own first).
bool crash_handler_installed(int sig);

// Whether a crash's frames are named through addr2line (found, and not turned off by
// FLASHINFER_TEST_CRASH_SYMBOLIZE=0).
bool crash_handler_symbolizes();

// Turns symbolization off or on (what FLASHINFER_TEST_CRASH_SYMBOLIZE=0 does at start-up).
void crash_handler_set_symbolize(bool on);

}  // namespace flashinfer::test
