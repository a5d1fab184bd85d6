// The process-wide index of op backends and the launch scope shared by every op's dispatch.
#include "api/kernel_table.h"

#include <map>
#include <mutex>
#include <vector>

#include "api/backends.h"
#include "api/device_props.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/ops/backends.h"
#include "flashinfer/stream.h"

namespace flashinfer {
namespace {

using api::BackendSummary;

struct BackendIndex {
  std::mutex mu;
  std::map<std::string, std::vector<BackendSummary>, std::less<>> ops;
};
BackendIndex& backend_index() {
  static auto* index = new BackendIndex();  // never destroyed: queried until exit
  return *index;
}

const char* device_type_name(DeviceType t) { return t == DeviceType::kCUDA ? "cuda" : "cpu"; }

}  // namespace

namespace api {

void register_backends(std::string_view op, std::span<const BackendSummary> backends) {
  BackendIndex& index = backend_index();
  std::lock_guard<std::mutex> lock(index.mu);
  auto [it, inserted] = index.ops.try_emplace(std::string(op));
  FLASHINFER_CHECK(inserted, "register_backends", "op", "'", op, "' already has a backend table");
  it->second.assign(backends.begin(), backends.end());
}

namespace launch_detail {

LaunchScope::LaunchScope(Device device, std::optional<bool> enable_pdl) {
  ctx_.device = device;
  if (!device.is_cuda()) return;
  device_scope_.emplace(device);
  ctx_.stream = current_cuda_stream();
  const bool* req = enable_pdl ? &*enable_pdl : nullptr;
  ctx_.enable_pdl = resolve_enable_pdl(req, device);
}

void no_backend(const char* op, const char* arg, Device device) {
  if (device.is_cuda() && !cuda_compiled()) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, arg,
                    "CUDA tensor given to a build without the CUDA backend");
  }
  // An op upstream does not run on this GPU is refused as upstream refuses it, not as a gap of
  // this build.
  check_upstream_arch(op, arg, device);
  FLASHINFER_FAIL(
      ErrorCode::kUnsupported, op, arg, "this build has no ", device_type_name(device.type),
      " kernel for this op (backends: ",
      [&] {
        std::string s;
        for (const std::string& b : op_backends(op)) s += (s.empty() ? "" : ", ") + b;
        return s.empty() ? std::string("none") : s;
      }(),
      ")");
}

void unsupported_params(const char* op, const char* arg, Device device, const char* implementation,
                        const char* reason) {
  FLASHINFER_FAIL(ErrorCode::kUnsupported, op, arg, reason, " (the ", device_type_name(device.type),
                  " backend: ", implementation, "; the CPU reference has no such limit)");
}

}  // namespace launch_detail
}  // namespace api

std::vector<std::pair<std::string, std::string>> op_backend_implementations(std::string_view op) {
  OpRegistry::global();
  BackendIndex& index = backend_index();
  std::lock_guard<std::mutex> lock(index.mu);
  std::vector<std::pair<std::string, std::string>> out;
  auto it = index.ops.find(op);
  if (it == index.ops.end()) return out;
  for (const BackendSummary& b : it->second) {
    out.emplace_back(device_type_name(b.device), b.implementation);
  }
  return out;
}

std::vector<std::string> op_backends(std::string_view op) {
  std::vector<std::string> out;
  for (auto& [backend, impl] : op_backend_implementations(op)) out.push_back(std::move(backend));
  return out;
}

bool op_has_backend(std::string_view op, DeviceType device) {
  for (const std::string& b : op_backends(op)) {
    if (b == device_type_name(device)) return true;
  }
  return false;
}

}  // namespace flashinfer
