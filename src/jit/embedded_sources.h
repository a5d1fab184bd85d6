// Private: the kernel headers embedded at build time for NVRTC (src/kernels/cuda/jit_sources.cmake
// lists them; cmake/EmbedJitSources.cmake generates the definition).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace flashinfer::jit {

/// (include path relative to src/, text) of every embedded kernel header, in list order.
const std::vector<std::pair<std::string, std::string>>& embedded_sources();

}  // namespace flashinfer::jit
