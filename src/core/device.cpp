#include "flashinfer/device.h"

#include <charconv>

#include "flashinfer/error.h"

namespace flashinfer {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view num = text.substr(5);
    int32_t index = -1;
    auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (ec == std::errc() && ptr == num.data() + num.size() && index >= 0) return cuda(index);
  }
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "Device", "device",
                  "expected 'cpu', 'cuda' or 'cuda:N', got '", text, "'");
}

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  return "cuda:" + std::to_string(index);
}

}  // namespace flashinfer
