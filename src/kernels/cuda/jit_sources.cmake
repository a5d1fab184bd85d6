# The kernel headers NVRTC compiles at run time (paths relative to src/), embedded into the
# library as strings by cmake/EmbedJitSources.cmake; src/jit/embedded_sources.h reads them. They
# must stay NVRTC-compilable: device code only, and under __CUDACC_RTC__ no host headers.
set(FLASHINFER_JIT_SOURCES
  kernels/attention_params.h
  kernels/cuda/device_utils.cuh
  kernels/cuda/attention_cuda_common.cuh
  kernels/cuda/decode_shape.h
  kernels/cuda/device/host_device.h
  kernels/cuda/device/fastdiv.cuh
  kernels/cuda/device/softmax_state.cuh
  kernels/cuda/device/permuted_smem.cuh
  kernels/cuda/device/vec.cuh
  kernels/cuda/device/cp_async.cuh
  kernels/cuda/device/paged_kv.cuh
  kernels/cuda/device/mma.cuh
  kernels/cuda/attention_decode_kernel.cuh
  kernels/cuda/attention_prefill_kernel.cuh)
