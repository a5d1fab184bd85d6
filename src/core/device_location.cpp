#include "core/device_location.h"

#include <unistd.h>

#include "flashinfer/error.h"

#if FLASHINFER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace flashinfer::detail {

std::string device_location(Device device) {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::string where = std::string(host) + "/";
  if (!device.is_cuda()) return where + "cpu";
#if FLASHINFER_WITH_CUDA
  char bus[64] = {};
  const cudaError_t e = cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, device.index);
  FLASHINFER_CHECK_CODE(e == cudaSuccess, ErrorCode::kCuda, "device_location", "device",
                        "cudaDeviceGetPCIBusId failed for ", device.str(), ": ",
                        cudaGetErrorString(e));
  return where + bus;
#else
  return where + device.str();
#endif
}

}  // namespace flashinfer::detail
