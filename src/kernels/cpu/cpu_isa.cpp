#include "kernels/cpu/cpu_isa.h"

#include <atomic>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define FLASHINFER_CPU_X86 1
#else
#define FLASHINFER_CPU_X86 0
#endif

namespace flashinfer::kernels::cpu {
namespace {

std::atomic<int> g_cap{static_cast<int>(CpuIsa::kAvx512)};

// CPUID plus the OS check: XCR0 must enable SSE/AVX state (bits 1, 2) and the AVX-512 opmask
// and upper-ZMM state (bits 5, 6, 7), or the instructions fault even on a capable CPU.
bool detect_avx512() {
#if FLASHINFER_CPU_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
  if (!osxsave || !fma || !f16c) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0xE6) != 0xE6) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx2 = (b >> 5) & 1, f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1,
             vl = (b >> 31) & 1;
  return avx2 && f && dq && bw && vl;
#else
  return false;
#endif
}

}  // namespace

CpuIsa cpu_isa_cap() { return static_cast<CpuIsa>(g_cap.load(std::memory_order_relaxed)); }

void set_cpu_isa_cap(CpuIsa cap) { g_cap.store(static_cast<int>(cap), std::memory_order_relaxed); }

bool use_avx512() {
  static const bool has = detect_avx512();
  return has && cpu_isa_cap() >= CpuIsa::kAvx512;
}

}  // namespace flashinfer::kernels::cpu
