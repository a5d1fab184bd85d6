// Upstream-style `backend=` tables of the GEMM and quantization ops and the queries over them.
// Which names run on CUDA is this file's knowledge (cuBLASLt serves "cublas", "cudnn" and
// "auto"); whether the op runs on CUDA at all is its kernel table's (src/api/kernel_table.h):
// an op offers its CUDA backend names only when its table has a CUDA entry in this build, and a
// name without its own description is described by that entry.
#include "flashinfer/ops/backends.h"

#include <algorithm>
#include <map>

#include "api/backends.h"
#include "api/device_props.h"
#include "flashinfer/error.h"

namespace flashinfer {
namespace {

BackendRequirement make(std::string op, std::string def, std::vector<std::string> upstream,
                        std::vector<BackendInfo> available) {
  BackendRequirement r;
  r.op = std::move(op);
  r.default_backend = std::move(def);
  r.upstream_backends = std::move(upstream);
  if (!op_has_backend(r.op, DeviceType::kCUDA)) return r;
  r.available = std::move(available);
  for (BackendInfo& b : r.available) {
    if (!b.implementation.empty()) continue;
    for (const auto& [device, impl] : op_backend_implementations(r.op)) {
      if (device == "cuda") b.implementation = impl;
    }
  }
  return r;
}

const std::map<std::string, BackendRequirement, std::less<>>& table() {
  static const auto* t = [] {
    auto* m = new std::map<std::string, BackendRequirement, std::less<>>();
    // This build has no cuDNN, CUTLASS, TGV or trtllm-gen kernels. The default backend of the
    // bf16 GEMMs ("cudnn") is served by cuBLASLt so that default calls run; the others are
    // honestly absent.
    const std::string lt = "cuBLASLt";
    const std::string lt_default = "cuBLASLt (no cuDNN in this build; serves the default)";
    for (const char* op : {"mm_bf16", "bmm_bf16"}) {
      std::vector<std::string> up = {"cudnn", "cutlass", "auto"};
      if (std::string_view(op) == "mm_bf16") up = {"cudnn", "cutlass", "tgv", "auto"};
      m->emplace(op, make(op, "cudnn", up, {{"cudnn", 80, lt_default}, {"auto", 80, lt}}));
    }
    // FP8 matmuls need sm89+ in cuBLASLt.
    m->emplace("bmm_fp8", make("bmm_fp8", "cublas", {"cudnn", "cublas", "cutlass", "auto"},
                               {{"cublas", 89, lt}, {"auto", 89, lt}}));
    // No FP4 tensor cores below sm100: tiles are dequantized to bf16 and multiplied by cuBLASLt.
    // (An empty description: the op's CUDA kernel-table entry describes it.)
    m->emplace("mm_fp4", make("mm_fp4", "auto", {"cudnn", "trtllm", "cutlass", "cute-dsl", "auto"},
                              {{"auto", 80, ""}}));
    for (const char* op : {"fp4_quantize", "nvfp4_quantize", "mxfp4_quantize", "mxfp8_quantize"}) {
      m->emplace(op, make(op, "cuda", {"cuda", "cute-dsl"}, {{"cuda", 80, ""}}));
    }
    // The block-scaled, MX and low-latency FP8 GEMMs: this build's tiled CUDA kernel (fp32 math,
    // no fp8 tensor cores, so sm80+) serves each op's default backend name only.
    const std::string tiled = "tiled CUDA kernel of this build (serves the default)";
    m->emplace("gemm_fp8_nt_groupwise", make("gemm_fp8_nt_groupwise", "cutlass",
                                             {"cutlass", "trtllm"}, {{"cutlass", 80, tiled}}));
    m->emplace("mm_fp8", make("mm_fp8", "trtllm_low_latency", {"trtllm_low_latency"},
                              {{"trtllm_low_latency", 80, tiled}}));
    m->emplace("mm_mxfp8",
               make("mm_mxfp8", "auto", {"cutlass", "cute-dsl", "trtllm", "cudnn", "auto"},
                    {{"auto", 80, tiled}}));
    m->emplace("bmm_mxfp8",
               make("bmm_mxfp8", "auto", {"cudnn", "cutlass", "auto"}, {{"auto", 80, tiled}}));
    // bf16 x fp4: CPU reference only (no CUDA kernel table entry), `backend` has no default.
    for (const char* op : {"prepare_bf16_fp4_weights", "mm_bf16_fp4"}) {
      m->emplace(op, make(op, "", {"cudnn", "cute-dsl"}, {}));
    }
    // SVDQuant: CPU reference only; upstream's one backend name.
    for (const char* op : {"mm_nvfp4_svdquant", "nvfp4_quantize_smooth"}) {
      m->emplace(op, make(op, "cutlass", {"cutlass"}, {}));
    }
    // The grouped GEMMs (cuDNN's MoE grouped matmul upstream): grouped_mm_bf16 runs this build's
    // grouped kernel under the name "cudnn"; the fp8/mxfp8/fp4 variants have no CUDA kernel here
    // (make() then offers no backend: is_backend_supported says false).
    m->emplace("grouped_mm_bf16",
               make("grouped_mm_bf16", "cudnn", {"cudnn"},
                    {{"cudnn", 80, "grouped CUDA kernel of this build (serves the default)"}}));
    m->emplace("grouped_mm_fp8", make("grouped_mm_fp8", "cudnn", {"cudnn"}, {{"cudnn", 89, ""}}));
    m->emplace("grouped_mm_mxfp8",
               make("grouped_mm_mxfp8", "cudnn", {"cudnn"}, {{"cudnn", 100, ""}}));
    m->emplace("grouped_mm_fp4", make("grouped_mm_fp4", "cudnn", {"cudnn"}, {{"cudnn", 100, ""}}));
    return m;
  }();
  return *t;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + ("'" + x + "'");
  return s.empty() ? "none" : s;
}

}  // namespace

const BackendInfo* BackendRequirement::find(std::string_view backend) const {
  for (const auto& b : available) {
    if (b.name == backend) return &b;
  }
  return nullptr;
}

bool BackendRequirement::is_known_backend(std::string_view backend) const {
  return std::find(upstream_backends.begin(), upstream_backends.end(), backend) !=
         upstream_backends.end();
}

bool BackendRequirement::is_backend_supported(std::string_view backend,
                                              std::optional<int> cc) const {
  const BackendInfo* b = find(backend);
  if (!b) return false;
  return !cc || *cc >= b->min_cc;
}

bool BackendRequirement::is_compute_capability_supported(int cc) const {
  return std::any_of(available.begin(), available.end(),
                     [&](const BackendInfo& b) { return cc >= b.min_cc; });
}

std::vector<std::string> BackendRequirement::supported_backends(std::optional<int> cc) const {
  std::vector<std::string> out;
  for (const auto& name : upstream_backends) {
    if (is_backend_supported(name, cc)) out.push_back(name);
  }
  return out;
}

const BackendRequirement& backend_requirement(std::string_view op) {
  const auto& t = table();
  auto it = t.find(op);
  FLASHINFER_CHECK(it != t.end(), "backend_requirement", "op", "'", op,
                   "' has no backend table (ops with one: ", join(ops_with_backend_requirement()),
                   ")");
  return it->second;
}

std::vector<std::string> ops_with_backend_requirement() {
  std::vector<std::string> out;
  for (const auto& [name, req] : table()) out.push_back(name);
  return out;
}

namespace api {

void check_backend(const char* op, std::string_view backend, Device device) {
  const BackendRequirement& req = backend_requirement(op);
  FLASHINFER_CHECK(req.is_known_backend(backend), op, "backend", "unknown backend '", backend,
                   "' (upstream's backends: ", join(req.upstream_backends),
                   "; supported in this build: ", join(req.supported_backends()), ")");
  if (!device.is_cuda()) return;  // the CPU reference stands in for every backend
  const int cc = compute_capability(device);
  if (!req.is_backend_supported(backend, cc)) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "backend", "backend '", backend,
                    "' is not available on ", device.str(), " (compute capability ", cc,
                    ") in this build; supported there: ", join(req.supported_backends(cc)));
  }
}

}  // namespace api
}  // namespace flashinfer
