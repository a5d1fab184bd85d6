// CUDA launchers for the GEMM ops (cuBLASLt, opened with dlopen on the first GEMM). Plain C++
// header. Launchers throw flashinfer::Error(kCuda) when a CUDA or cuBLASLt call fails and
// kUnsupported when cuBLASLt has no algorithm for the problem.
#pragma once

#include "kernels/gemm_fp8_params.h"
#include "kernels/gemm_params.h"

#include <cstdint>
#include <string>

namespace flashinfer::kernels::cuda {

/// The cuBLASLt path's counters since the process started (kernels/cuda/gemm_cuda.cu): plans
/// built (descriptors plus one heuristic query each), calls that found their plan cached, and
/// device allocations made (per-device constants, per-stream workspaces and scratch growth);
/// problems cuBLASLt refused (its heuristic found no algorithm, or a setup call or the first
/// cublasLtMatmul of block_scaled_gemm_lt answered NOT_SUPPORTED or INVALID_VALUE), and calls of
/// block_scaled_gemm_lt that cuBLASLt declined so that the caller ran the tiled kernel.
/// A steady state of one shape on one stream adds only plan_hits (and declined_calls where
/// cuBLASLt refused that shape).
struct CublasLtStats {
  uint64_t plan_builds = 0, plan_hits = 0, device_allocs = 0, device_bytes = 0;
  uint64_t lt_refusals = 0, declined_calls = 0;
};
CublasLtStats cublaslt_stats();

/// Opens cuBLASLt if no GEMM has yet (no GPU needed) and says why it cannot be used: empty when
/// the library opened and every function the GEMMs call resolved.
std::string cublaslt_load_error();

/// bf16 x bf16 or fp8 x fp8 (with device scale pointers) -> bf16/fp16 through cuBLASLt, with
/// the plan (descriptors, algorithm) cached per shape and a persistent workspace per stream.
/// Needs out_stride_n == 1, a_stride_k == 1, b_stride_k == 1 and a contiguous bias; fp8 also
/// what kernels/cublaslt_plan.h's fp8_refusal() accepts.
void gemm(const GemmParams& p, void* stream, const char* op, bool pdl);

/// Dequantizes both FP4 operands to bf16 (exact) on the device, then a cuBLASLt bf16 GEMM with
/// alpha read from device memory (no host synchronization).
void mm_fp4(const Fp4GemmParams& p, void* stream, bool enable_pdl);

/// gemm_fp8's block-scaled FP8 GEMMs through cuBLASLt where kernels/cublaslt_plan.h's
/// fp8_route() picks a cuBLASLt path for the current device (mm_fp8 from sm89; 1x128 x 1x128 or
/// 128x128 block scales on Hopper), with the plan cache, the stream's workspace and its scratch
/// (no allocation once warm, so a warm call can be captured into a CUDA graph). False, with
/// nothing the caller must wait for, where the route is the tiled kernel or cuBLASLt refuses the
/// problem (no algorithm, or NOT_SUPPORTED / INVALID_VALUE at setup or from its first
/// cublasLtMatmul; remembered per plan key, so later calls neither ask again nor lease scratch):
/// the caller runs kernels/cuda/gemm_fp8_cuda.h's block_scaled_gemm then (CublasLtStats counts
/// those calls as declined_calls).
bool block_scaled_gemm_lt(const BlockScaledGemmParams& p, void* stream, const char* op);

}  // namespace flashinfer::kernels::cuda
