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

CpuIsa detect() {
  const CpuFeatures f = cpu_features();
  if (!f.os_avx || !f.fma || !f.f16c || !f.avx2) return CpuIsa::kScalar;
  return f.avx512f && f.avx512dq && f.avx512bw && f.avx512vl && f.os_avx512 ? CpuIsa::kAvx512
                                                                            : CpuIsa::kAvx2;
}

}  // namespace

// CPUID plus the OS check: XCR0 must enable SSE/AVX state (bits 1, 2) for AVX2, and also the
// AVX-512 opmask and upper-ZMM state (bits 5, 6, 7) for AVX-512, or the instructions fault
// even on a capable CPU.
CpuFeatures cpu_features() {
  CpuFeatures f;
#if FLASHINFER_CPU_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.x86 = true;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  const bool osxsave = (c >> 27) & 1;
  unsigned lo = 0, hi = 0;
  if (osxsave) __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  (void)hi;
  f.os_avx = osxsave && (lo & 0x6) == 0x6;
  f.os_avx512 = osxsave && (lo & 0xE6) == 0xE6;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = (b >> 5) & 1;
  f.avx512f = (b >> 16) & 1;
  f.avx512dq = (b >> 17) & 1;
  f.avx512bw = (b >> 30) & 1;
  f.avx512vl = (b >> 31) & 1;
  f.avx512_bf16 = f.avx512f && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
#endif
  return f;
}

CpuIsa cpu_isa_cap() { return static_cast<CpuIsa>(g_cap.load(std::memory_order_relaxed)); }

void set_cpu_isa_cap(CpuIsa cap) { g_cap.store(static_cast<int>(cap), std::memory_order_relaxed); }

CpuIsa detected_cpu_isa() {
  static const CpuIsa isa = detect();
  return isa;
}

CpuIsa cpu_isa() { return std::min(detected_cpu_isa(), cpu_isa_cap()); }

bool use_avx512() { return cpu_isa() >= CpuIsa::kAvx512; }

}  // namespace flashinfer::kernels::cpu
