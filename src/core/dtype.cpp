#include "flashinfer/dtype.h"

#include <array>
#include <string>

#include "flashinfer/error.h"

namespace flashinfer {
namespace {

struct DTypeInfo {
  DType dtype;
  std::size_t size;
  std::string_view torch_name;
  std::string_view name;
  std::string_view safetensors_name;
};

// One row per dtype, in enum order.
constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {DType::kFloat32, 4, "torch.float32", "float32", "F32"},
    {DType::kFloat16, 2, "torch.float16", "float16", "F16"},
    {DType::kBFloat16, 2, "torch.bfloat16", "bfloat16", "BF16"},
    {DType::kFloat64, 8, "torch.float64", "float64", "F64"},
    {DType::kFloat8E4M3FN, 1, "torch.float8_e4m3fn", "float8_e4m3fn", "F8_E4M3"},
    {DType::kFloat8E5M2, 1, "torch.float8_e5m2", "float8_e5m2", "F8_E5M2"},
    {DType::kInt8, 1, "torch.int8", "int8", "I8"},
    {DType::kUInt8, 1, "torch.uint8", "uint8", "U8"},
    {DType::kInt16, 2, "torch.int16", "int16", "I16"},
    {DType::kInt32, 4, "torch.int32", "int32", "I32"},
    {DType::kInt64, 8, "torch.int64", "int64", "I64"},
    {DType::kBool, 1, "torch.bool", "bool", "BOOL"},
    {DType::kFloat4E2M1FNx2, 1, "torch.float4_e2m1fn_x2", "float4_e2m1fn_x2", "U8"},
}};

const DTypeInfo& info(DType d) {
  auto i = static_cast<std::size_t>(d);
  if (i >= kInfo.size()) {
    FLASHINFER_FAIL(ErrorCode::kInternal, "dtype", "", "unknown dtype code ", i);
  }
  return kInfo[i];
}

struct Alias {
  std::string_view text;
  DType dtype;
};
constexpr Alias kAliases[] = {
    {"float", DType::kFloat32},
    {"fp32", DType::kFloat32},
    {"f32", DType::kFloat32},
    {"half", DType::kFloat16},
    {"fp16", DType::kFloat16},
    {"f16", DType::kFloat16},
    {"bf16", DType::kBFloat16},
    {"double", DType::kFloat64},
    {"fp64", DType::kFloat64},
    {"fp8_e4m3", DType::kFloat8E4M3FN},
    {"fp8_e4m3fn", DType::kFloat8E4M3FN},
    {"e4m3", DType::kFloat8E4M3FN},
    {"fp8_e5m2", DType::kFloat8E5M2},
    {"e5m2", DType::kFloat8E5M2},
    {"short", DType::kInt16},
    {"int", DType::kInt32},
    {"long", DType::kInt64},
    {"fp4", DType::kFloat4E2M1FNx2},
    {"fp4_e2m1", DType::kFloat4E2M1FNx2},
    {"nvfp4", DType::kFloat4E2M1FNx2},
};

}  // namespace

std::size_t dtype_size(DType d) { return info(d).size; }
std::string_view dtype_torch_name(DType d) { return info(d).torch_name; }
std::string_view dtype_name(DType d) { return info(d).name; }
std::string_view dtype_safetensors_name(DType d) { return info(d).safetensors_name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string_view bare = name;
  if (bare.starts_with("torch.")) bare.remove_prefix(6);
  for (const auto& i : kInfo) {
    if (i.name == bare) return i.dtype;
  }
  for (const auto& a : kAliases) {
    if (a.text == bare) return a.dtype;
  }
  return std::nullopt;
}

bool dtype_is_floating(DType d) {
  switch (d) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat64:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      return true;
    default:
      return false;
  }
}

bool dtype_is_integral(DType d) {
  switch (d) {
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
      return true;
    default:
      return false;
  }
}

bool dtype_is_fp8(DType d) { return d == DType::kFloat8E4M3FN || d == DType::kFloat8E5M2; }

}  // namespace flashinfer
