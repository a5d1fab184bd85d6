// FLASHINFER_HD marks the small arithmetic helpers of the CUDA device library (fast division,
// online-softmax state, shared-memory layout) callable from both sides: kernels use them on the
// device, and plain C++ unit tests check them on the host without a GPU. nvcc and NVRTC both
// define __CUDACC__; this header includes nothing, so NVRTC compiles it as is.
#pragma once

#ifdef __CUDACC__
#define FLASHINFER_HD __host__ __device__ __forceinline__
#else
#define FLASHINFER_HD inline
#endif

// Full unrolling of the loops over register arrays (which must be unrolled to stay in registers).
// Device passes only: nvcc forwards a macro-generated _Pragma to the host compiler, which warns
// about the unknown pragma.
#ifdef __CUDA_ARCH__
#define FLASHINFER_UNROLL _Pragma("unroll")
#else
#define FLASHINFER_UNROLL
#endif
