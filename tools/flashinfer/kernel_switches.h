// The kernels' switches: environment variables, each read by the code it steers, that change which
// kernel or route a call takes (never its contract). `flashinfer info` lists them with their values
// in this process; `flashinfer bench` puts the ones set into each row's repro_command, so that the
// command reruns the kernels that made the row. A switch added in src/ belongs here: the CLI tests
// check the list against the names the sources read.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

namespace flashinfer::cli {

struct KernelSwitch {
  const char* name;
  const char* value;   // the value that changes the default
  const char* effect;  // what it does then
  bool cuda;           // steers CUDA kernels (listed only by builds with CUDA)
};

inline constexpr KernelSwitch kKernelSwitches[] = {
    {"FLASHINFER_PREFILL_SM90", "0", "prefill on the FA2 kernel, not the Hopper kernel (sm_90)",
     true},
    {"FLASHINFER_PREFILL_SM90_PINGPONG", "1",
     "the Hopper prefill kernel's ping-pong schedule (tall blocks)", true},
    {"FLASHINFER_PREFILL_SM90_WS", "1",
     "the Hopper prefill kernel's warp-specialized form (tall blocks, head dims 128, 192/128)",
     true},
    {"FLASHINFER_PREFILL_SM90_OVERLAP", "1",
     "the Hopper prefill kernel's overlapped form (softmax under the next S and the previous P V; "
     "warp-specialized, head dims 128, 192/128, no soft cap)",
     true},
    {"FLASHINFER_DECODE_TENSOR_CORES", "0",
     "decode without use_tensor_cores on the CUDA-core kernel at every GQA group", true},
    {"FLASHINFER_DECODE_ROWS_PER_THREAD", "1", "one packed row a thread in the CUDA-core decode",
     true},
    {"FLASHINFER_MLA_TENSOR_CORES", "0", "MLA decode on the CUDA-core kernels", true},
    {"FLASHINFER_PAGE_IDS_AT_RUN", "1",
     "eager paged decode / prefill wrappers read their page ids at run (the page guard's kernels)",
     true},
    {"FLASHINFER_MLA_SM90", "1",
     "MLA decode's tensor-core calls on the Hopper kernel (wgmma, sm_90)", true},
    {"FLASHINFER_GDN_CHUNKED", "0",
     "chunk_gated_delta_rule on the recurrent kernel, not the chunked tensor-core one", true},
    {"FLASHINFER_GDN_CHUNK_STAGES", "1",
     "the chunked GDN kernel with one copy stage (2: two) whatever the grid", true},
    {"FLASHINFER_GROUPED_MM_CUTLASS", "0",
     "grouped GEMMs on the mma.sync kernel, not CUTLASS's (sm_90)", true},
    {"FLASHINFER_MOE_FP8_BLOCK_CUTLASS", "1",
     "DeepSeek FP8 block-scale MoE GEMMs on CUTLASS's block-scaled grouped GEMM (sm_90)", true},
    {"FLASHINFER_MOE_GROUPED", "0",
     "fused MoE (cutlass_fused_moe, trtllm_bf16_moe) on the GEMV route at every batch size", true},
    {"FLASHINFER_CUDA_CACHING_ALLOCATOR", "0",
     "every device tensor the library allocates a cudaMalloc / cudaFree (no cache)", true},
    {"FLASHINFER_CPU_ONEDNN", "0", "the CPU's large GEMMs without oneDNN (OpenBLAS sgemm)", false},
    {"FLASHINFER_CPU_BF16_DPBF16", "0",
     "mm_bf16's large CPU GEMM without the AVX-512 BF16 FMA kernel (oneDNN's matmul)", false},
    {"FLASHINFER_CPU_FP8_DPBF16", "0",
     "mm_fp8's large CPU GEMM without the AVX-512 BF16 FMA kernel (oneDNN's matmul)", false},
};

/// `s` as one shell word: as it is when it holds only letters, digits and `._-`, else
/// single-quoted (a quote inside as '\'').
inline std::string shell_quote(std::string_view s) {
  bool plain = !s.empty();
  for (const char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    plain = plain && ok;
  }
  if (plain) return std::string(s);
  std::string quoted = "'";
  for (const char c : s) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

/// The switches this environment sets (to any value), as a shell prefix: `NAME=value ` each, the
/// value quoted by shell_quote; empty when none.
inline std::string kernel_switch_env_prefix() {
  std::string out;
  for (const KernelSwitch& k : kKernelSwitches) {
    const char* v = std::getenv(k.name);
    if (v == nullptr) continue;
    out += std::string(k.name) + "=" + shell_quote(v) + " ";
  }
  return out;
}

}  // namespace flashinfer::cli
