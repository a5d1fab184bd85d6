// Private: <immintrin.h> for the CPU kernels' runtime-dispatched vector paths (x86-64 with
// GCC or clang only; FLASHINFER_CPU_X86_INTRINSICS says whether it was included).
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// g++ 12's AVX-512 intrinsics start from a self-initialized "undefined" vector, which
// -Wmaybe-uninitialized reports once they are inlined (GCC bug 105593, fixed in GCC 13). The
// diagnostic state is looked up at the header's lines, so it is silenced for the header only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#define FLASHINFER_CPU_X86_INTRINSICS 1
#else
#define FLASHINFER_CPU_X86_INTRINSICS 0
#endif
