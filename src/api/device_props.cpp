#include "api/device_props.h"

#include <array>
#include <atomic>

#include "core/cuda_runtime.h"

namespace flashinfer::api {

int compute_capability(Device device) {
  if (!device.is_cuda()) return 0;
  static std::array<std::atomic<int>, 64> cache{};  // 0 = unknown
  if (device.index < 0 || device.index >= static_cast<int>(cache.size())) {
    return detail::cuda_compute_capability(device.index);
  }
  int cc = cache[device.index].load(std::memory_order_relaxed);
  if (cc == 0) {
    cc = detail::cuda_compute_capability(device.index);
    cache[device.index].store(cc, std::memory_order_relaxed);
  }
  return cc;
}

bool resolve_enable_pdl(const bool* requested, Device device) {
  if (!device.is_cuda()) return false;
  const bool supported = compute_capability(device) >= 90;
  return requested ? (*requested && supported) : supported;
}

}  // namespace flashinfer::api
