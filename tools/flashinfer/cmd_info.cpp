// `flashinfer version` and `flashinfer info`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "commands.h"
#include "core/cuda_runtime.h"
#include "flashinfer/device.h"
#include "flashinfer/tensor.h"
#include "flashinfer/version.h"

namespace flashinfer::cli {

Command version_command() {
  return {"version", "Print the library version (major.minor.patch)", [](CLI::App&) {
            return std::function<int()>([] {
              std::printf("%s\n", std::string(version()).c_str());
              return 0;
            });
          }};
}

Command info_command() {
  return {"info", "Show build options, backends and the devices visible now", [](CLI::App&) {
            return std::function<int()>([] {
              const BuildInfo& b = build_info();
              std::printf("flashinfer-cpp %s\n", std::string(b.version).c_str());
              std::printf("compiler: %s\n", std::string(b.compiler).c_str());
              std::printf("build type: %s\n", std::string(b.build_type).c_str());
              std::printf("sanitizers: %s\n", b.sanitizers ? "address,undefined" : "off");
              std::printf("backends: cpu%s\n", b.cuda ? ", cuda" : "");
              if (b.cuda) {
                std::printf("CUDA compiled in: yes (toolkit %s, architectures %s)\n",
                            std::string(b.cuda_version).c_str(),
                            std::string(b.cuda_architectures).c_str());
              } else {
                std::printf("CUDA compiled in: no\n");
              }
              std::printf("host cache: limit %zu MiB (FLASHINFER_HOST_CACHE_MB)\n",
                          host_cache_stats().limit_bytes >> 20);
              const int n = cuda_device_count();
              if (n == 0) {
                std::printf("CUDA devices: none visible (CPU-only mode)\n");
              } else {
                std::printf("CUDA devices: %d\n", n);
                for (int i = 0; i < n; ++i) {
                  const int cc = detail::cuda_compute_capability(i);
                  std::printf(
                      "  GPU %d: %s (compute capability %d.%d, SM%d; peak memory bandwidth %.2f "
                      "TB/s)\n",
                      i, detail::cuda_device_name(i).c_str(), cc / 10, cc % 10, cc,
                      detail::cuda_peak_memory_bandwidth(i) / 1e12);
                }
              }
              return 0;
            });
          }};
}

}  // namespace flashinfer::cli
