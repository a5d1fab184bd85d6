// Where a tensor's memory lives: the host or one CUDA device.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace flashinfer {

/// Values are DLPack's DLDeviceType codes.
enum class DeviceType : int32_t { kCPU = 1, kCUDA = 2 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int32_t index = 0;

  static constexpr Device cpu() { return {DeviceType::kCPU, 0}; }
  static constexpr Device cuda(int32_t index = 0) { return {DeviceType::kCUDA, index}; }
  /// Parses "cpu", "cuda", "cuda:N"; throws flashinfer::Error on anything else.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  /// torch's spelling: "cpu" or "cuda:N".
  std::string str() const;

  friend bool operator==(const Device&, const Device&) = default;
};

/// True when the library was built with its CUDA backend.
bool cuda_compiled();
/// Number of CUDA devices visible now (0 without a driver, a GPU, or the CUDA backend).
int cuda_device_count();

}  // namespace flashinfer
