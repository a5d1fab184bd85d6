#include "api/device_props.h"

#include <array>
#include <atomic>
#include <string>

#include "core/cuda_runtime.h"
#include "flashinfer/error.h"

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

// torch.device(...) as a recorded value, a "cuda[:N]" / "cpu" string or a CUDA index.
Device device_arg(const std::optional<Value>& v, const char* op) {
  FLASHINFER_CHECK(v && !v->is_none(), op, "device", "device is required");
  if (v->kind() == Value::Kind::kInt) {
    FLASHINFER_CHECK(v->as_int() >= 0, op, "device", "device index ", v->as_int(), " is negative");
    return Device::cuda(static_cast<int>(v->as_int()));
  }
  std::string text;
  if (v->kind() == Value::Kind::kString) text = v->as_string();
  if (v->kind() == Value::Kind::kObject) {
    const std::string& r = v->as_object().repr;
    if (r.find("type='cpu'") != std::string::npos) {
      text = "cpu";
    } else if (r.find("type='cuda'") != std::string::npos) {
      const auto at = r.find("index=");
      text = at == std::string::npos
                 ? "cuda"
                 : "cuda:" + r.substr(at + 6, r.find_first_of(",)", at) - at - 6);
    }
  }
  FLASHINFER_CHECK(!text.empty(), op, "device",
                   "expected a device ('cpu', 'cuda', 'cuda:N', an "
                   "index or a torch.device)");
  return Device::parse(text);
}

}  // namespace flashinfer::api
