// The kernel switches' test (tools/flashinfer/kernel_switches.h lists the switches): environment
// variables read by the code they steer, most at each call, so that one process can run two
// kernels or routes on the same inputs. Plain C++, no dependencies: the CUDA launchers' headers,
// the CPU kernels and the allocator include it.
#pragma once

#include <cstdlib>
#include <string_view>

namespace flashinfer::detail {

/// Whether environment variable `name` is set to exactly `value`.
inline bool env_switch_is(const char* name, std::string_view value) {
  const char* e = std::getenv(name);
  return e != nullptr && std::string_view(e) == value;
}

}  // namespace flashinfer::detail
