#include "core/device_location.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_runtime.h"
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

std::string grid_record(Device device) {
  const int sms = device.is_cuda() ? cuda_sm_count(device.index) : 0;
  return std::to_string(sms) + " " + device_location(device);
}

int group_grid_cap(const std::vector<std::string>& records, int cap) {
  auto location = [](const std::string& r) {
    const auto at = r.find(' ');
    return at == std::string::npos ? std::string() : r.substr(at + 1);
  };
  int out = cap;
  for (const std::string& r : records) {
    const auto shared = std::count_if(records.begin(), records.end(), [&](const std::string& u) {
      return location(u) == location(r);
    });
    const int sms = std::atoi(r.c_str());
    out = std::min<int>(out, static_cast<int>(std::max<int64_t>(1, sms / shared)));
  }
  return std::max(out, 1);
}

int agreed_grid_cap(comm::CommBackend& comm, int cap) {
  const Device dev = comm.device();
  std::vector<std::string> all = comm.Get_size() > 1 ? comm.allgather(grid_record(dev))
                                                     : std::vector<std::string>{grid_record(dev)};
  return dev.is_cuda() ? group_grid_cap(all, cap) : 0;
}

}  // namespace flashinfer::detail
