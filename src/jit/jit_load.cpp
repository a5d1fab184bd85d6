// Loading a JIT module on the current device with the CUDA runtime's library API
// (cudaLibraryLoadData / cudaLibraryGetKernel, CUDA 12+), so the library needs no libcuda link.
// A cudaKernel_t is accepted by cudaLaunchKernelExC and cudaFuncSetAttribute in place of a
// kernel function pointer (cuda_runtime_api.h). Libraries stay loaded for the process.
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "flashinfer/error.h"
#include "jit/jit.h"
#include "kernels/cuda/smem_limits.h"

#if FLASHINFER_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashinfer::jit {

#if FLASHINFER_WITH_CUDA

void* load_kernel(const CompiledModule& m, std::string_view expr) {
  static std::mutex mu;
  static auto* libraries = new std::map<std::pair<std::string, int>, cudaLibrary_t>();
  static auto* kernels = new std::map<std::tuple<std::string, int, std::string>, cudaKernel_t>();
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    FLASHINFER_FAIL(ErrorCode::kCuda, "jit", "", "cudaGetDevice failed: ", cudaGetErrorString(err));
  }
  const std::string& sym = m.symbol(expr);
  std::lock_guard<std::mutex> g(mu);
  const auto kkey = std::make_tuple(m.uri, device, sym);
  if (auto it = kernels->find(kkey); it != kernels->end()) return it->second;
  cudaLibrary_t lib = nullptr;
  const auto lkey = std::make_pair(m.uri, device);
  if (auto it = libraries->find(lkey); it != libraries->end()) {
    lib = it->second;
  } else {
    err = cudaLibraryLoadData(&lib, m.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (err != cudaSuccess) {
      FLASHINFER_FAIL(ErrorCode::kCuda, "jit", "", "cudaLibraryLoadData(", m.uri, ", ",
                      m.arch.name(), ") failed: ", cudaGetErrorName(err), ": ",
                      cudaGetErrorString(err));
    }
    libraries->emplace(lkey, lib);
  }
  cudaKernel_t k = nullptr;
  err = cudaLibraryGetKernel(&k, lib, sym.c_str());
  if (err != cudaSuccess) {
    FLASHINFER_FAIL(ErrorCode::kCuda, "jit", "", "cudaLibraryGetKernel(", sym,
                    ") failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  }
  kernels->emplace(kkey, k);
  return k;
}

Arch current_device_arch(const JitConfig& config) {
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (err != cudaSuccess) {
    FLASHINFER_FAIL(ErrorCode::kCuda, "jit", "",
                    "cannot query the current device: ", cudaGetErrorName(err), ": ",
                    cudaGetErrorString(err));
  }
  return arch_for_device(major * 10 + minor, config.arch_list);
}

void launch(const char* op, void* kernel, unsigned grid_x, unsigned grid_y, unsigned grid_z,
            unsigned block, std::size_t smem, void* stream, bool enable_pdl, void** args) {
  cudaError_t err = cudaSuccess;
  if (smem > 48 * 1024) {
    // Raised only, under one lock, as the library's own launches do (kernels/cuda/smem_limits.h):
    // set per launch, two threads launching one kernel at two sizes could run the larger under
    // the smaller limit.
    int device = 0;
    err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
      err = kernels::cuda::SmemLimits::instance().ensure(kernel, device, smem, [&](std::size_t b) {
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(b));
      });
    }
  }
  if (err == cudaSuccess) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid_x, grid_y, grid_z);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = static_cast<cudaStream_t>(stream);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = enable_pdl ? 1 : 0;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    err = cudaLaunchKernelExC(&cfg, kernel, args);
  }
  if (err != cudaSuccess) {
    FLASHINFER_FAIL(ErrorCode::kCuda, op, "", "JIT kernel launch failed: ", cudaGetErrorName(err),
                    ": ", cudaGetErrorString(err));
  }
}

#else

Arch current_device_arch(const JitConfig&) {
  FLASHINFER_FAIL(ErrorCode::kUnsupported, "jit", "", "flashinfer-cpp was built without CUDA");
}

void launch(const char* op, void*, unsigned, unsigned, unsigned, unsigned, std::size_t, void*, bool,
            void**) {
  FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "", "flashinfer-cpp was built without CUDA");
}

void* load_kernel(const CompiledModule& m, std::string_view) {
  FLASHINFER_FAIL(ErrorCode::kUnsupported, "jit", "", "cannot load ", m.uri,
                  ": flashinfer-cpp was built without CUDA");
}

#endif

}  // namespace flashinfer::jit
