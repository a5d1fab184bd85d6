#include "flashinfer/version.h"

#include "core/cuda_runtime.h"
#if FLASHINFER_WITH_CUDNN
#include "kernels/cuda/gemm_cudnn.h"
#endif

#ifndef FLASHINFER_VERSION_STRING
#error "FLASHINFER_VERSION_STRING must be defined by the build"
#endif

namespace flashinfer {

std::string_view version() { return FLASHINFER_VERSION_STRING; }

const BuildInfo& build_info() {
  static const std::string cuda_version = detail::cuda_runtime_version();
  static const BuildInfo info = {
      FLASHINFER_VERSION_STRING,
      FLASHINFER_COMPILER_STRING,
      FLASHINFER_BUILD_TYPE_STRING,
      cuda_version,
      FLASHINFER_CUDA_ARCHS_STRING,
      FLASHINFER_WITH_CUDA != 0,
      FLASHINFER_SANITIZE_BUILD != 0,
      true,
      FLASHINFER_WITH_CUDNN != 0,
      FLASHINFER_CUDNN_VERSION_STRING,
      FLASHINFER_CUDNN_FRONTEND_VERSION_STRING,
  };
  return info;
}

std::string cudnn_runtime_version() {
#if FLASHINFER_WITH_CUDNN
  const std::string error = kernels::cuda::cudnn_load_error();
  return error.empty() ? kernels::cuda::cudnn_library_version() : error;
#else
  return "";
#endif
}

}  // namespace flashinfer
