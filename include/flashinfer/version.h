// Library version, upstream's major.minor.patch scheme.
#pragma once

#include <string>
#include <string_view>

namespace flashinfer {

/// "0.1.0"
std::string_view version();
/// Build facts shown by `flashinfer info` and recorded in dumps.
struct BuildInfo {
  std::string_view version;
  std::string_view compiler;            // "GNU 12.2.0"
  std::string_view build_type;          // "Release"
  std::string_view cuda_version;        // toolkit the CUDA backend was built with; "" without it
  std::string_view cuda_architectures;  // "80;90"
  bool cuda = false;
  bool sanitizers = false;
  bool openmp = false;
  // The cuDNN backend of the GEMM ops (backend="cudnn"): whether it is compiled in, and the
  // cuDNN headers and cuDNN frontend it was built with ("" without it). libcudnn itself is opened
  // on the first cuDNN GEMM.
  bool cudnn = false;
  std::string_view cudnn_version;           // "9.19.0"
  std::string_view cudnn_frontend_version;  // "1.32.0"
};
const BuildInfo& build_info();

/// The libcudnn this process loads for the cuDNN backends, opened on first use (no GPU needed):
/// its version ("9.14.0"), or why it cannot be used ("cannot open libcudnn.so.9: ..."); "" in a
/// build without cuDNN. The build's headers may be newer: the MoE grouped matmul node of
/// grouped_mm_bf16's "cudnn" backend needs libcudnn 9.15.0 at run time.
std::string cudnn_runtime_version();

}  // namespace flashinfer
