// `flashinfer version` and `flashinfer info`.
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "commands.h"
#include "core/cuda_runtime.h"
#include "flashinfer/device.h"
#include "flashinfer/tensor.h"
#include "flashinfer/version.h"
#include "kernel_switches.h"
#include "kernels/cpu/cpu_isa.h"

namespace flashinfer::cli {

Command version_command() {
  return {"version", "Print the library version (major.minor.patch)", [](Args&) {
            return std::function<int()>([] {
              std::printf("%s\n", std::string(version()).c_str());
              return 0;
            });
          }};
}

namespace {

// The CPU kernels' tier (kernels/cpu/cpu_isa.cpp decides it once from CPUID and XCR0) and why:
// what the CPU or OS lacks for the next tier up.
std::string cpu_tier_line() {
  namespace k = kernels::cpu;
  const k::CpuFeatures f = k::cpu_features();
  const k::CpuIsa isa = k::cpu_isa();
  auto missing = [](std::initializer_list<std::pair<bool, const char*>> need) {
    std::string m;
    for (const auto& [have, name] : need) {
      if (!have) m += (m.empty() ? "" : ", ") + std::string(name);
    }
    return m;
  };
  const std::string no512 = missing({{f.avx512f, "AVX512F"},
                                     {f.avx512dq, "AVX512DQ"},
                                     {f.avx512bw, "AVX512BW"},
                                     {f.avx512vl, "AVX512VL"},
                                     {f.os_avx512, "OS support for the ZMM state (XCR0)"}});
  std::string line = "CPU tier: ";
  if (!f.x86) return line + "scalar (not an x86-64 CPU with CPUID: no vector kernels)";
  if (isa == k::CpuIsa::kAvx512 && f.avx512_bf16) {
    return line +
           "AVX-512 BF16 (AVX-512 F/DQ/BW/VL with OS support, and AVX512_BF16: the vdpbf16ps "
           "kernels run where they apply)";
  }
  if (isa == k::CpuIsa::kAvx512) {
    return line + "AVX-512 (AVX-512 F/DQ/BW/VL with OS support; no AVX512_BF16, so not the BF16 " +
           "tier)";
  }
  if (isa == k::CpuIsa::kAvx2) {
    return line + "AVX2 (AVX2, FMA, F16C with OS support; not AVX-512: " +
           (no512.empty() ? std::string("lowered by set_cpu_isa_cap") : "no " + no512) + ")";
  }
  const std::string no2 = missing({{f.avx2, "AVX2"},
                                   {f.fma, "FMA"},
                                   {f.f16c, "F16C"},
                                   {f.os_avx, "OS support for the AVX state (XCR0)"}});
  return line + "scalar (not AVX2: " +
         (no2.empty() ? std::string("lowered by set_cpu_isa_cap") : "no " + no2) + ")";
}

// The GEMM libraries behind the `backend=` names (api/backends.cpp): cuBLASLt with CUDA, cuDNN
// where the build found it, with the libcudnn this process loads (opened here: older than the
// headers is possible, and decides whether grouped_mm_bf16's cuDNN graph can run).
std::string gemm_libraries_line(const BuildInfo& b) {
  if (!b.cuda)
    return "GEMM libraries: none (no CUDA backend; the CPU reference runs every backend)";
  std::string line = "GEMM libraries: cuBLASLt (backends 'cublas', 'auto')";
  if (b.cudnn) {
    line += ", cuDNN (backend 'cudnn'; headers " + std::string(b.cudnn_version) + ", frontend " +
            std::string(b.cudnn_frontend_version) +
            "; libcudnn loaded: " + cudnn_runtime_version() +
            "; grouped_mm_bf16's MoE grouped matmul graph needs libcudnn 9.15.0 or newer at run "
            "time, else CUTLASS's or the mma.sync grouped kernel runs)";
  } else {
    line +=
        "; no cuDNN in this build (backend 'cudnn' of mm_bf16/bmm_bf16 runs cuBLASLt, "
        "bmm_fp8's is refused)";
  }
  // CMake sets the macro for this source from what it found (kernels/cuda/grouped_gemm_cutlass.cu).
#if FLASHINFER_WITH_CUTLASS
  line +=
      "; CUTLASS (grouped_mm_bf16 on sm_90: its TMA + wgmma grouped GEMM; "
      "FLASHINFER_GROUPED_MM_CUTLASS=0 runs the mma.sync grouped kernel instead; with its "
      "headers the sm_90a kernels are built too: the Hopper prefill, the Hopper MLA decode and "
      "the block-scaled MoE GEMMs, the last two opt-in: FLASHINFER_MLA_SM90=1, "
      "FLASHINFER_MOE_FP8_BLOCK_CUTLASS=1)";
#else
  line +=
      "; no CUTLASS in this build (grouped_mm_bf16 runs the mma.sync grouped kernel, and no "
      "sm_90a kernel is built: prefill, MLA decode and the block-scaled MoE GEMMs run their "
      "mma.sync kernels)";
#endif
  return line;
}

// What runs the cudnn_* attention ops on CUDA (api/trtllm_attention.cpp): cuDNN's SDPA graph
// where the build has cuDNN and a call fits it, this library's kernels otherwise. Like the GEMM
// line, it says what the build has (libcudnn is opened on the first cuDNN call).
std::string cudnn_attention_line(const BuildInfo& b) {
  if (!b.cuda)
    return "cuDNN attention: no (no CUDA backend; the CPU reference runs the cudnn_* ops)";
  if (!b.cudnn) {
    return "cuDNN attention: no (no cuDNN in this build; cudnn_batch_prefill_with_kv_cache and "
           "cudnn_batch_decode_with_kv_cache run this library's kernels)";
  }
  return "cuDNN attention: yes (SDPA graph for cudnn_batch_prefill_with_kv_cache and "
         "cudnn_batch_decode_with_kv_cache with a paged K/V cache: bf16/fp16, sm80+; this "
         "library's kernels for the rest and where libcudnn cannot be opened)";
}

// The kernels' switches (kernel_switches.h) this build has, and their values in this process: for
// A/B timings on one machine and for bug reports.
std::string kernel_switch_lines(bool cuda) {
  std::string out = "kernel switches (environment; any other value keeps the default):\n";
  for (const KernelSwitch& k : kKernelSwitches) {
    if (k.cuda && !cuda) continue;
    const char* v = std::getenv(k.name);
    const std::string now = v == nullptr ? "unset" : std::string("set to \"") + v + "\"";
    const bool on = v != nullptr && std::string_view(v) == k.value;
    out += std::string("  ") + k.name + "=" + k.value + ": " + k.effect + " [" + now +
           (on ? ": in effect" : "") + "]\n";
  }
  return out;
}

}  // namespace

Command info_command() {
  return {"info", "Show build options, backends and the devices visible now", [](Args&) {
            return std::function<int()>([] {
              const BuildInfo& b = build_info();
              std::printf("flashinfer-cpp %s\n", std::string(b.version).c_str());
              std::printf("compiler: %s\n", std::string(b.compiler).c_str());
              std::printf("build type: %s\n", std::string(b.build_type).c_str());
              std::printf("sanitizers: %s\n", b.sanitizers ? "address,undefined" : "off");
              std::printf("backends: cpu%s\n", b.cuda ? ", cuda" : "");
              if (b.cuda) {
                std::printf("CUDA compiled in: yes (toolkit %s, architectures %s)\n",
                            std::string(b.cuda_version).c_str(),
                            std::string(b.cuda_architectures).c_str());
              } else {
                std::printf("CUDA compiled in: no\n");
              }
              std::printf("%s\n", gemm_libraries_line(b).c_str());
              std::printf("%s\n", cudnn_attention_line(b).c_str());
              std::printf("%s", kernel_switch_lines(b.cuda).c_str());
              std::printf("%s\n", cpu_tier_line().c_str());
              std::printf("host cache: limit %zu MiB (FLASHINFER_HOST_CACHE_MB)\n",
                          host_cache_stats().limit_bytes >> 20);
              const int n = cuda_device_count();
              if (n == 0) {
                std::printf("CUDA devices: none visible (CPU-only mode)\n");
              } else {
                std::printf("CUDA devices: %d\n", n);
                for (int i = 0; i < n; ++i) {
                  const int cc = detail::cuda_compute_capability(i);
                  std::printf(
                      "  GPU %d: %s (compute capability %d.%d, SM%d; peak memory bandwidth %.2f "
                      "TB/s)\n",
                      i, detail::cuda_device_name(i).c_str(), cc / 10, cc % 10, cc,
                      detail::cuda_peak_memory_bandwidth(i) / 1e12);
                }
              }
              return 0;
            });
          }};
}

}  // namespace flashinfer::cli
