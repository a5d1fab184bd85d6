// Upstream's architecture rules: ops upstream runs only on some CUDA architectures (its
// @supported_compute_capability lists and the architecture gates of its kernel modules; the
// facts are in docs/CONFORMANCE.md, "Ops upstream runs only on some GPUs"). On another CUDA
// device this library refuses them the way upstream does (flashinfer::Error, kUnsupported,
// naming the op, upstream's text); replay on such a device runs them on the CPU reference and
// says so. An op without a rule runs on every CUDA device upstream supports (sm80+). CPU tensors
// always run the CPU reference. The per-backend lists of the ops with a `backend` argument are
// applied by BackendRequirement::is_backend_supported (flashinfer/ops/backends.h).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flashinfer {

struct UpstreamArchRule {
  std::string op;
  std::vector<int> ccs;  // the compute capabilities (major * 10 + minor) upstream runs it on
  std::string fact;      // where upstream says so (file, decorator or gate)
};

/// The rule of `op`, or null when upstream runs it on every CUDA device it supports.
const UpstreamArchRule* upstream_arch_rule(std::string_view op);
/// Every rule, in op-name order.
std::vector<UpstreamArchRule> upstream_arch_rules();
/// Whether upstream runs `op` on a CUDA device of compute capability `cc`.
bool upstream_runs_on(std::string_view op, int cc);
/// Upstream's error text for `op` on a CUDA device of capability `cc` ("" where upstream runs
/// it), e.g. "b12x_fused_moe does not support compute capability 90".
std::string upstream_refusal(std::string_view op, int cc);
/// Upstream's error text for `backend` of an op with a backend table on a CUDA device of
/// capability `cc` ("" where upstream's list for that backend has the device, or has no list),
/// e.g. "No suitable auto backends found for mm_fp4".
std::string upstream_backend_refusal(std::string_view op, std::string_view backend, int cc);

}  // namespace flashinfer
