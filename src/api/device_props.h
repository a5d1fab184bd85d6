// Private: cached per-device facts the API layer needs for dispatch decisions.
#pragma once

#include "flashinfer/device.h"

namespace flashinfer::api {

/// Compute capability (major*10+minor) of a CUDA device, cached; 0 for the CPU.
int compute_capability(Device device);

/// Upstream's default for enable_pdl: on when the device is sm90 or newer.
bool resolve_enable_pdl(const bool* requested, Device device);

}  // namespace flashinfer::api
