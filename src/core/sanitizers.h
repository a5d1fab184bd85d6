// Private: FLASHINFER_ASAN is defined when the build runs under AddressSanitizer (gcc defines
// __SANITIZE_ADDRESS__, clang answers __has_feature). Allocators that would hide a use after
// free from it (the host cache, the ring's heap) step aside there, and their tests skip what
// only holds without it.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define FLASHINFER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FLASHINFER_ASAN 1
#endif
#endif
