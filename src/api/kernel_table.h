// Private: per-op backend tables, in the spirit of ggml's backend interface. Each op lists the
// backends compiled into this build (the CPU reference always; CUDA when nvcc was found), each
// with a `supports(params)` predicate and one launch function over the kernel parameters. The
// ops dispatch through their table; `is_backend_supported`, `flashinfer list-ops`, `flashinfer
// bench` and replay's CPU fallback read the same tables (flashinfer/ops/backends.h), so what the
// tools say and what a call does cannot disagree.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/cuda_runtime.h"
#include "flashinfer/device.h"
#include "flashinfer/error.h"

namespace flashinfer::api {

/// Where a launch runs: the device, its current stream (cudaStream_t for CUDA) and whether
/// programmatic dependent launch is on (resolved from the op's enable_pdl and the device).
struct LaunchContext {
  Device device;
  void* stream = nullptr;
  bool enable_pdl = false;
};

/// Why a backend refuses a call: the argument to name (nullptr: the one that decides the device)
/// and the reason. A default-constructed Refusal accepts the call.
struct Refusal {
  const char* arg = nullptr;
  const char* reason = nullptr;
  bool refused() const { return reason != nullptr; }
};

/// One backend of one op.
template <class P>
struct KernelEntry {
  DeviceType device;              // DeviceType::kCPU or DeviceType::kCUDA
  const char* implementation;     // what runs, for list-ops ("CPU reference", "CUDA kernel")
  Refusal (*supports)(const P&);  // nullptr: every call the op's checks accept
  void (*run)(const P&, const LaunchContext&);
};

/// Records an op's backends in the process-wide index the queries read (done by the areas'
/// register functions, so the index is complete once the op registry is built).
struct BackendSummary {
  DeviceType device;
  const char* implementation;
};
void register_backends(std::string_view op, std::span<const BackendSummary> backends);

template <class P, std::size_t N>
void register_backends(std::string_view op, const KernelEntry<P> (&table)[N]) {
  BackendSummary s[N];
  for (std::size_t i = 0; i < N; ++i) s[i] = {table[i].device, table[i].implementation};
  register_backends(op, std::span<const BackendSummary>(s, N));
}

namespace launch_detail {
/// Opens the device, fetches its current stream and resolves enable_pdl (CUDA); CPU: trivial.
/// The returned scope restores the previous CUDA device when destroyed.
class LaunchScope {
 public:
  LaunchScope(Device device, std::optional<bool> enable_pdl);
  const LaunchContext& context() const { return ctx_; }

 private:
  std::optional<flashinfer::detail::CudaDeviceScope> device_scope_;
  LaunchContext ctx_;
};
[[noreturn]] void no_backend(const char* op, const char* arg, Device device);
[[noreturn]] void unsupported_params(const char* op, const char* arg, Device device,
                                     const char* implementation, const char* reason);
}  // namespace launch_detail

/// Runs `p` on the backend of `table` for `device`. Throws flashinfer::Error(kUnsupported) naming
/// `op` and `arg` (the tensor that decides the device) when this build has no such backend, or
/// when its supports() refuses the parameters.
template <class P, std::size_t N>
void launch(const KernelEntry<P> (&table)[N], const P& p, Device device, const char* op,
            const char* arg, std::optional<bool> enable_pdl = std::nullopt) {
  for (const KernelEntry<P>& e : table) {
    if (e.device != device.type) continue;
    if (e.supports) {
      if (const Refusal r = e.supports(p); r.refused()) {
        launch_detail::unsupported_params(op, r.arg ? r.arg : arg, device, e.implementation,
                                          r.reason);
      }
    }
    launch_detail::LaunchScope scope(device, enable_pdl);
    e.run(p, scope.context());
    return;
  }
  launch_detail::no_backend(op, arg, device);
}

}  // namespace flashinfer::api
