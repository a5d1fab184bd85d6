#include "kernels/cpu/cpu_isa.h"

#include <algorithm>
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

// CPUID plus the OS check: XCR0 must enable SSE/AVX state (bits 1, 2) for AVX2, and also the
// AVX-512 opmask and upper-ZMM state (bits 5, 6, 7) for AVX-512, or the instructions fault
// even on a capable CPU.
CpuIsa detect() {
#if FLASHINFER_CPU_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return CpuIsa::kScalar;
  const bool osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
  if (!osxsave || !fma || !f16c) return CpuIsa::kScalar;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0x6) != 0x6) return CpuIsa::kScalar;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return CpuIsa::kScalar;
  const bool avx2 = (b >> 5) & 1, f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1,
             vl = (b >> 31) & 1;
  if (!avx2) return CpuIsa::kScalar;
  return f && dq && bw && vl && (lo & 0xE6) == 0xE6 ? CpuIsa::kAvx512 : CpuIsa::kAvx2;
#else
  return CpuIsa::kScalar;
#endif
}

}  // namespace

CpuIsa cpu_isa_cap() { return static_cast<CpuIsa>(g_cap.load(std::memory_order_relaxed)); }

void set_cpu_isa_cap(CpuIsa cap) { g_cap.store(static_cast<int>(cap), std::memory_order_relaxed); }

CpuIsa detected_cpu_isa() {
  static const CpuIsa isa = detect();
  return isa;
}

CpuIsa cpu_isa() { return std::min(detected_cpu_isa(), cpu_isa_cap()); }

bool use_avx512() { return cpu_isa() >= CpuIsa::kAvx512; }

}  // namespace flashinfer::kernels::cpu
