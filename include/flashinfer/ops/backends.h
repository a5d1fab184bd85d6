// Backend queries for ops that take a `backend` argument, as upstream's @backend_requirement
// attaches them to a function (`bmm_fp8.is_backend_supported("cublas", 90)`). In C++ they are
// reached through the op's name: backend_requirement("bmm_fp8").is_backend_supported("cublas", 90).
//
// The answers describe this build honestly: a backend is supported when this library runs it on
// a CUDA device of that compute capability (major * 10 + minor). A build without the CUDA backend
// supports none. CPU tensors always run the CPU reference, which accepts every backend name
// upstream defines for the op (so recorded calls replay on the CPU); unknown names are errors.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flashinfer/device.h"

namespace flashinfer {

/// One backend this build runs on CUDA.
struct BackendInfo {
  std::string name;            // upstream's backend string ("cublas", "cudnn", "auto", ...)
  int min_cc = 0;              // lowest compute capability (e.g. 89 for fp8 cuBLASLt)
  std::string implementation;  // what actually runs here, e.g. "cuBLASLt"
};

class BackendRequirement {
 public:
  std::string op;
  std::string default_backend;
  std::vector<std::string> upstream_backends;  // every name upstream's op accepts
  std::vector<BackendInfo> available;          // what this build runs on CUDA (empty w/o CUDA)

  /// Without cc: whether this build runs `backend` on some CUDA device. With cc: on that one.
  bool is_backend_supported(std::string_view backend, std::optional<int> cc = std::nullopt) const;
  /// Whether some backend of the op runs on a CUDA device of compute capability `cc`.
  bool is_compute_capability_supported(int cc) const;
  /// The backends this build runs (on `cc` when given), in upstream's order.
  std::vector<std::string> supported_backends(std::optional<int> cc = std::nullopt) const;
  /// The entry for `backend`, or null when this build does not run it.
  const BackendInfo* find(std::string_view backend) const;
  /// Whether upstream's op knows `backend`.
  bool is_known_backend(std::string_view backend) const;
};

/// The requirement table of `op` ("bmm_fp8", "mm_bf16", "fp4_quantize", ...). Throws
/// flashinfer::Error (kInvalidArgument) for an op without a `backend` parameter here.
const BackendRequirement& backend_requirement(std::string_view op);

/// Names of the ops that have a backend table.
std::vector<std::string> ops_with_backend_requirement();

// ---- Device backends of every op ------------------------------------------------------------
// Every declared op has a CPU reference; ops with a CUDA kernel compiled into this build also
// list "cuda". Replay with --device cuda runs an op without a CUDA backend on the CPU and says so.

/// The device backends this build runs `op` on, in order ("cpu", "cuda"); empty for an op with
/// no kernels (a name that is not a declared op, or an op of code outside the library).
std::vector<std::string> op_backends(std::string_view op);
/// (backend, what runs there) for each backend of `op`, for list-ops.
std::vector<std::pair<std::string, std::string>> op_backend_implementations(std::string_view op);
/// Whether this build runs `op` on devices of this type.
bool op_has_backend(std::string_view op, DeviceType device);

}  // namespace flashinfer
