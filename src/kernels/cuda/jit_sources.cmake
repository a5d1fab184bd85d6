# The kernel headers NVRTC compiles at run time (paths relative to src/), embedded into the
# library as strings by cmake/EmbedJitSources.cmake; src/jit/embedded_sources.h reads them. They
# must stay NVRTC-compilable: device code only, and under __CUDACC_RTC__ no host headers.
set(FLASHINFER_JIT_SOURCES
  kernels/attention_params.h
  kernels/cuda/device_utils.cuh
  kernels/cuda/attention_cuda_common.cuh
  kernels/cuda/attention_decode_kernel.cuh
  kernels/cuda/attention_prefill_kernel.cuh)
