// Private: cached per-device facts the API layer needs for dispatch decisions.
#pragma once

#include <optional>

#include "flashinfer/device.h"
#include "flashinfer/value.h"

namespace flashinfer::api {

/// Compute capability (major*10+minor) of a CUDA device, cached; 0 for the CPU.
int compute_capability(Device device);

/// Upstream's default for enable_pdl: on when the device is sm90 or newer.
bool resolve_enable_pdl(const bool* requested, Device device);

/// A device argument: a torch.device(...) as recorded, a "cpu" / "cuda[:N]" string or a CUDA
/// index. None (or nullopt) is refused: "device is required", naming `op`.
Device device_arg(const std::optional<Value>& v, const char* op);

}  // namespace flashinfer::api
