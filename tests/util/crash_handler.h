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

// For a child fork()ed by a test that ends with exit(): LeakSanitizer's check at its exit is
// skipped. A fork of a process whose earlier tests started threads (an OpenMP team) inherits
// those threads' allocations without the threads, which LSan reports as leaks (seen when one
// process runs a whole executable's tests: FLASHINFER_TEST_PER_EXECUTABLE). No-op otherwise.
void skip_leak_check_at_exit();

}  // namespace flashinfer::test
