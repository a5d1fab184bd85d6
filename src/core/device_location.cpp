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
  if (!device.is_cuda()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
    return std::string(host) + "/cpu";
  }
#if FLASHINFER_WITH_CUDA
  // The GPU's UUID: one physical GPU (or MIG instance) has one, seen alike from every process
  // and container on its host (a host name differs between containers sharing a GPU through
  // MPS; a PCI bus id repeats on other hosts).
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, device.index);
  FLASHINFER_CHECK_CODE(e == cudaSuccess, ErrorCode::kCuda, "device_location", "device",
                        "cudaGetDeviceProperties failed for ", device.str(), ": ",
                        cudaGetErrorString(e));
  std::string where = "GPU-";
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    const auto b = static_cast<unsigned char>(prop.uuid.bytes[i]);
    where += hex[b >> 4];
    where += hex[b & 15];
  }
  return where;
#else
  return device.str();
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
  // Every rank's device is of one kind (the peer buffers made before refuse a mix): a CPU group
  // skips the allgather on every rank alike.
  const Device dev = comm.device();
  if (!dev.is_cuda()) return 0;
  const std::string mine = grid_record(dev);
  return group_grid_cap(comm.Get_size() > 1 ? comm.allgather(mine) : std::vector<std::string>{mine},
                        cap);
}

}  // namespace flashinfer::detail
