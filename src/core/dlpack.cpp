#include "flashinfer/dlpack.h"

#include <dlpack/dlpack.h>

#include <memory>
#include <vector>

#include "flashinfer/error.h"

namespace flashinfer {
namespace {

// Type codes DLPack 1.1 added after the 0.6 header Debian ships (values from the spec).
constexpr uint8_t kDLBoolCode = 6;
constexpr uint8_t kDLFloat8E4M3FNCode = 10;
constexpr uint8_t kDLFloat8E5M2Code = 12;
constexpr uint8_t kDLFloat4E2M1FNCode = 17;

DLDataType to_dl(DType d) {
  switch (d) {
    case DType::kFloat32:
      return {kDLFloat, 32, 1};
    case DType::kFloat16:
      return {kDLFloat, 16, 1};
    case DType::kBFloat16:
      return {kDLBfloat, 16, 1};
    case DType::kFloat64:
      return {kDLFloat, 64, 1};
    case DType::kFloat8E4M3FN:
      return {kDLFloat8E4M3FNCode, 8, 1};
    case DType::kFloat8E5M2:
      return {kDLFloat8E5M2Code, 8, 1};
    case DType::kInt8:
      return {kDLInt, 8, 1};
    case DType::kUInt8:
      return {kDLUInt, 8, 1};
    case DType::kInt16:
      return {kDLInt, 16, 1};
    case DType::kInt32:
      return {kDLInt, 32, 1};
    case DType::kInt64:
      return {kDLInt, 64, 1};
    case DType::kBool:
      return {kDLBoolCode, 8, 1};
    case DType::kFloat4E2M1FNx2:
      // Two 4-bit lanes per byte-sized element, as torch exports float4_e2m1fn_x2.
      return {kDLFloat4E2M1FNCode, 4, 2};
  }
  return {kDLUInt, 8, 1};
}

DType from_dl(DLDataType t) {
  const char* op = "from_dlpack";
  if (t.code == kDLFloat4E2M1FNCode && t.bits == 4 && t.lanes == 2) return DType::kFloat4E2M1FNx2;
  FLASHINFER_CHECK_CODE(t.lanes == 1, ErrorCode::kUnsupported, op, "dtype",
                        "vector lanes are not supported (lanes=", t.lanes, ")");
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) return DType::kFloat32;
      if (t.bits == 16) return DType::kFloat16;
      if (t.bits == 64) return DType::kFloat64;
      break;
    case kDLBfloat:
      if (t.bits == 16) return DType::kBFloat16;
      break;
    case kDLInt:
      if (t.bits == 8) return DType::kInt8;
      if (t.bits == 16) return DType::kInt16;
      if (t.bits == 32) return DType::kInt32;
      if (t.bits == 64) return DType::kInt64;
      break;
    case kDLUInt:
      if (t.bits == 8) return DType::kUInt8;
      break;
    case kDLBoolCode:
      if (t.bits == 8) return DType::kBool;
      break;
    case kDLFloat8E4M3FNCode:
      if (t.bits == 8) return DType::kFloat8E4M3FN;
      break;
    case kDLFloat8E5M2Code:
      if (t.bits == 8) return DType::kFloat8E5M2;
      break;
    default:
      break;
  }
  FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "dtype", "DLPack dtype code ",
                  static_cast<int>(t.code), " with ", static_cast<int>(t.bits),
                  " bits is not supported");
}

// Owns what an exported DLManagedTensor points into.
struct ExportContext {
  Tensor tensor;  // keeps the storage alive
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor managed;
};

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& tensor) {
  FLASHINFER_CHECK(tensor.defined(), "to_dlpack", "tensor", "undefined tensor");
  auto ctx = std::make_unique<ExportContext>();
  ctx->tensor = tensor;
  ctx->shape = tensor.shape();
  ctx->strides = tensor.strides();
  DLTensor& dl = ctx->managed.dl_tensor;
  // data points at the storage base and byte_offset carries the view's offset, so consumers
  // that require aligned data pointers (DLPack recommends 256 bytes for CUDA) are served.
  dl.data = tensor.storage()->data();
  dl.byte_offset = static_cast<uint64_t>(tensor.storage_offset()) * tensor.element_size();
  const Device d = tensor.device();
  dl.device = {d.is_cpu() ? kDLCPU : kDLCUDA, d.index};
  dl.ndim = static_cast<int32_t>(tensor.dim());
  dl.dtype = to_dl(tensor.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
  };
  return &ctx.release()->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  const char* op = "from_dlpack";
  FLASHINFER_CHECK(managed != nullptr, op, "managed", "null DLManagedTensor");
  // From here on the deleter must run exactly once, whatever happens.
  std::shared_ptr<DLManagedTensor> owner(managed, [](DLManagedTensor* m) {
    if (m->deleter) m->deleter(m);
  });
  const DLTensor& dl = managed->dl_tensor;
  FLASHINFER_CHECK_CODE(dl.device.device_type == kDLCPU || dl.device.device_type == kDLCUDA,
                        ErrorCode::kUnsupported, op, "device", "DLPack device type ",
                        static_cast<int>(dl.device.device_type), " is not supported");
  FLASHINFER_CHECK(dl.ndim >= 0, op, "ndim", "negative ndim");
  const DType dtype = from_dl(dl.dtype);
  const std::size_t es = dtype_size(dtype);
  FLASHINFER_CHECK(dl.byte_offset % es == 0, op, "byte_offset", "byte_offset ", dl.byte_offset,
                   " is not a multiple of the element size ", es);
  Shape shape(dl.shape, dl.shape + dl.ndim);
  Shape strides = dl.strides ? Shape(dl.strides, dl.strides + dl.ndim) : contiguous_strides(shape);
  const Device device =
      dl.device.device_type == kDLCPU ? Device::cpu() : Device::cuda(dl.device.device_id);
  return Tensor::from_blob(
      dl.data, std::move(shape), std::move(strides), dtype, device,
      [owner](void*) mutable { owner.reset(); }, static_cast<int64_t>(dl.byte_offset / es));
}

}  // namespace flashinfer
