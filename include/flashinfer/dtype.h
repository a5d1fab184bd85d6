// Element types, named as torch names them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace flashinfer {

/// Element type of a Tensor. kFloat4E2M1FNx2 packs two fp4 e2m1 values per byte (element 2t in
/// the low nibble), like torch.float4_e2m1fn_x2: one element of that dtype is one byte.
enum class DType : uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat64,
  kFloat8E4M3FN,
  kFloat8E5M2,
  kInt8,
  kUInt8,
  kInt16,
  kInt32,
  kInt64,
  kBool,
  kFloat4E2M1FNx2,
};

inline constexpr int kNumDTypes = 13;

/// Bytes per element (1 for the packed fp4 pair).
std::size_t dtype_size(DType dtype);
/// torch's spelling: "torch.float16", "torch.float8_e4m3fn", "torch.float4_e2m1fn_x2", ...
std::string_view dtype_torch_name(DType dtype);
/// The short name: "float16", "bfloat16", ...
std::string_view dtype_name(DType dtype);
/// The safetensors spelling: "F16", "BF16", "F8_E4M3", ... (fp4 pairs are stored as "U8").
std::string_view dtype_safetensors_name(DType dtype);
/// Parses "torch.float16", "float16", and the usual aliases ("half", "fp16", "bf16", "fp8_e4m3",
/// "int", "long", ...). Returns nullopt for anything else.
std::optional<DType> dtype_from_name(std::string_view name);

bool dtype_is_floating(DType dtype);  // fp64/32/16, bf16, fp8 (not the fp4 pair)
bool dtype_is_integral(DType dtype);  // signed and unsigned ints, not bool
bool dtype_is_fp8(DType dtype);

}  // namespace flashinfer
