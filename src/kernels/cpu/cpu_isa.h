// Private: which x86 vector tier the CPU kernels may use. The library is built for baseline
// x86-64; the fast paths are compiled with target attributes and chosen here at run time.
// Tests lower the cap to run the AVX2 and scalar paths on a machine that has AVX-512, so every
// tier is checked against the same fp64 formulas.
#pragma once

namespace flashinfer::kernels::cpu {

enum class CpuIsa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

/// The highest tier the kernels may use (kAvx512 unless lowered).
CpuIsa cpu_isa_cap();
/// Lowers (or restores) the cap for the whole process; for tests and benchmarks only.
void set_cpu_isa_cap(CpuIsa cap);

/// The widest tier this CPU and OS support, whatever the cap: kAvx512 (AVX-512 F/BW/VL/DQ with
/// AVX2, FMA, F16C), kAvx2 (AVX2 with FMA and F16C) or kScalar. The one CPUID probe the CPU
/// kernels share (norms, activations, small-m GEMM, quantizers).
CpuIsa detected_cpu_isa();

/// detected_cpu_isa() lowered to the cap: the tier the kernels use.
CpuIsa cpu_isa();

/// What CPUID and the OS (XCR0) report about the features the tiers need; detected_cpu_isa()
/// is decided from these, and `flashinfer info` explains its choice with them.
struct CpuFeatures {
  bool x86 = false;  // built for x86-64 with CPUID available
  bool fma = false, f16c = false, avx2 = false;
  bool os_avx = false;  // OSXSAVE and XCR0 enables the SSE and AVX state
  bool avx512f = false, avx512dq = false, avx512bw = false, avx512vl = false;
  bool os_avx512 = false;    // XCR0 also enables the opmask and ZMM state
  bool avx512_bf16 = false;  // vdpbf16ps (leaf 7 subleaf 1, EAX bit 5): the BF16 kernels
};
CpuFeatures cpu_features();

/// True when the CPU and OS support AVX-512 F/BW/VL/DQ (with AVX2, FMA, F16C) and the cap
/// allows it.
bool use_avx512();

}  // namespace flashinfer::kernels::cpu
