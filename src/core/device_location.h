// Private: where a device is, as one string every process on a machine spells alike (the host
// name, then "cpu" or the GPU's PCI bus id), so that ranks of a group can tell which of them
// share a GPU, in one process or several (quantized_all_reduce's grid limit).
#pragma once

#include <string>

#include "flashinfer/device.h"

namespace flashinfer::detail {

std::string device_location(Device device);

}  // namespace flashinfer::detail
