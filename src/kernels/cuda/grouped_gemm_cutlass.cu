// grouped_mm_bf16, grouped_mm_fp8 and SegmentGEMMWrapper.run on Hopper through CUTLASS's sm90
// grouped GEMM (the template and its design: grouped_gemm_cutlass.cuh). The mma.sync grouped
// kernel (grouped_gemm_cuda.cu) reaches about half the bandwidth a loop of cuBLAS GEMMs does at
// 128 rows a group (docs/STATUS.md, issue 46): this is the Hopper path cuBLAS itself takes. Built
// only when CUTLASS's headers are found (PyPI's nvidia-cutlass, scripts/bootstrap) and only for
// sm_90a (its own CMake target): wgmma and the TMA descriptor updates are sm_90a instructions.
// This file holds the entry points and the bf16 instance; grouped_gemm_cutlass_fp8.cu the e4m3 one,
// grouped_gemm_cutlass_fp8_block.cu the e4m3 one with DeepSeek's block scales.
#include "kernels/cuda/grouped_gemm_cutlass.cuh"

#include <cstdlib>
#include <string_view>

#include "core/env_switch.h"
#include "kernels/cuda/grouped_gemm_cutlass.h"
#include "kernels/grouped_gemm_cutlass_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

// Read at every call (a getenv), so a process can compare both paths on the same inputs.
bool enabled() { return !detail::env_switch_is("FLASHINFER_GROUPED_MM_CUTLASS", "0"); }

// FLASHINFER_MOE_FP8_BLOCK_CUTLASS=1: the block-scaled instance (opt-in; read at every call).
bool block_enabled() { return detail::env_switch_is("FLASHINFER_MOE_FP8_BLOCK_CUTLASS", "1"); }

}  // namespace

bool cutlass_grouped_mm_fp8_block_scaled(const GroupedMmCudaParams& p, void* stream,
                                         const char* op) {
  if (!enabled() || !block_enabled()) return false;
  int device = 0;
  FLASHINFER_CUDA_CALL(op, cudaGetDevice(&device));
  if (cutlass_grouped_block_misfit(p, detail::cuda_compute_capability(device)) != nullptr) {
    return false;
  }
  static StreamScratchPool pool("block-scaled grouped GEMM scratch");
  return cutlass_grouped::run_fp8_block(p, static_cast<cudaStream_t>(stream), device, pool, op);
}

bool cutlass_grouped_mm(const GroupedMmCudaParams& p, void* stream, const char* op) {
  if (!enabled()) return false;
  int device = 0;
  FLASHINFER_CUDA_CALL(op, cudaGetDevice(&device));
  if (cutlass_grouped_misfit(p, detail::cuda_compute_capability(device)) != nullptr) return false;
  // One scratch per (device, stream) for both instances: a stream runs one call at a time.
  static StreamScratchPool pool("grouped GEMM scratch");
  const auto s = static_cast<cudaStream_t>(stream);
  return p.in_dtype == DType::kBFloat16
             ? cutlass_grouped::run_instance<cutlass_grouped::Bf16>(p, s, device, pool, op)
             : cutlass_grouped::run_e4m3(p, s, device, pool, op);
}

}  // namespace flashinfer::kernels::cuda
