// Reading GGUF model files (the format of llama.cpp / ggml): header, metadata, tensor infos,
// dequantization to float32/bfloat16 and raw access to quantized blocks. docs/MODEL.md describes
// the format facts this relies on (block layouts, dimension order).
//
// A GGUF file is untrusted input: every count, length, offset and size is checked (with
// overflow-safe arithmetic) against the file size and the limits below, and a bad file gives a
// flashinfer::Error(kFormat) naming the file and the problem (kIo when it cannot be read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/dtype.h"
#include "flashinfer/tensor.h"

namespace flashinfer::gguf {

// ---- limits (a file beyond any of them is rejected) ----
/// Largest file opened (it is memory-mapped, not read).
inline constexpr uint64_t kMaxFileBytes = uint64_t{256} << 30;  // 256 GiB
/// Most metadata entries and most tensors in one file.
inline constexpr uint64_t kMaxMetadataEntries = uint64_t{1} << 20;
inline constexpr uint64_t kMaxTensors = uint64_t{1} << 20;
/// Longest metadata key and tensor name (the format says 65535 and 64; names are allowed more
/// room since writers do not all enforce 64).
inline constexpr uint64_t kMaxKeyBytes = 65535;
inline constexpr uint64_t kMaxTensorNameBytes = 4096;
/// Longest string value (a chat template is a few KiB).
inline constexpr uint64_t kMaxStringBytes = uint64_t{64} << 20;  // 64 MiB
/// Deepest nesting of arrays inside arrays.
inline constexpr int kMaxArrayDepth = 8;
/// Most dimensions of a tensor (ggml's GGML_MAX_DIMS).
inline constexpr uint32_t kMaxDims = 4;
/// Largest general.alignment accepted (it must also be a power of two).
inline constexpr uint32_t kMaxAlignment = uint32_t{1} << 20;
/// Alignment when general.alignment is absent.
inline constexpr uint32_t kDefaultAlignment = 32;

/// ggml tensor types, with ggml's numbering (the value stored in the file).
enum class GGMLType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

/// "Q4_1", "F32", ...; "type<N>" for a number ggml does not define.
std::string ggml_type_name(GGMLType type);
/// Whether `type` is one of the values above (its block geometry is known).
bool ggml_type_known(GGMLType type);
/// Elements per block (1 for plain types, 32 for Q4_0/Q4_1/Q8_0, 256 for K-quants) and bytes
/// per block. Throw Error(kUnsupported) for an unknown type.
int64_t ggml_block_size(GGMLType type);
int64_t ggml_type_size(GGMLType type);
/// Whether dequantize() handles `type`: F32, F16, BF16, Q8_0, Q4_0, Q4_1.
bool can_dequantize(GGMLType type);

// Block layouts of the quantized types read directly (little-endian, no padding).
/// Q4_0: 32 values x = d * (q - 8); qs[j] holds element j in its low nibble, j + 16 in its high.
struct BlockQ4_0 {
  uint16_t d;  // fp16 bits
  uint8_t qs[16];
};
/// Q4_1: 32 values x = d * q + m; nibbles as in Q4_0.
struct BlockQ4_1 {
  uint16_t d;  // fp16 bits
  uint16_t m;  // fp16 bits
  uint8_t qs[16];
};
/// Q8_0: 32 values x = d * q.
struct BlockQ8_0 {
  uint16_t d;  // fp16 bits
  int8_t qs[32];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34);
inline constexpr int64_t kQK = 32;  // elements per Q4_0 / Q4_1 / Q8_0 block

/// Metadata value types, with the format's numbering.
enum class ValueType : uint32_t {
  kUInt8 = 0,
  kInt8 = 1,
  kUInt16 = 2,
  kInt16 = 3,
  kUInt32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUInt64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
/// "uint8", "string", "array", ...
std::string_view value_type_name(ValueType type);

/// One metadata value: a scalar, a string, or an array (of scalars, of strings or of arrays).
struct Value {
  ValueType type = ValueType::kUInt8;
  // Scalars: unsigned types and bool in `u`, signed types in `i`, float32/float64 in `f`
  // (exact: a float32 widens to double without rounding).
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string str;  // kString
  // kArray: the element type and count, then the elements in the member for that kind.
  ValueType elem_type = ValueType::kUInt8;
  uint64_t count = 0;
  std::vector<uint8_t> raw;          // scalar elements, as stored (little-endian)
  std::vector<std::string> strings;  // string elements
  std::vector<Value> arrays;         // array elements

  bool is_integer() const;  // any of the eight integer types (not bool)
  bool is_float() const;    // float32 or float64
  /// Element `idx` of an array of scalars: as int64 (integer or bool elements; a uint64 above
  /// INT64_MAX is an Error), or as double (float, integer or bool elements).
  int64_t int_at(uint64_t idx) const;
  double float_at(uint64_t idx) const;
  /// "uint32 30", "string \"llama\"", "array<string>[49152]": for listings and error messages.
  std::string summary() const;
};

/// One tensor's entry in the file.
struct TensorInfo {
  std::string name;
  GGMLType type = GGMLType::F32;
  std::vector<int64_t> ne;  // ggml order: ne[0] varies fastest (the row length)
  uint64_t offset = 0;      // from the start of the data section (a multiple of the alignment)
  uint64_t nbytes = 0;      // bytes of data
  /// torch's row-major order: ne reversed (ggml [576, 49152] is torch [49152, 576]).
  Shape shape() const;
  int64_t numel() const;
  /// Elements in one row (ne[0]) and rows (the product of the other dims).
  int64_t row_length() const { return ne.empty() ? 1 : ne[0]; }
  int64_t rows() const;
  /// Bytes of one row: ne[0] / block size * bytes per block.
  uint64_t row_bytes() const;
};

/// An open GGUF file (v2 or v3, little-endian): parsed header, metadata and tensor infos, and
/// the file's bytes, memory-mapped (read-only) or held in memory. Copies share the bytes.
class File {
 public:
  /// Opens and validates `path` (a regular file; a symlink to one is fine).
  static File open(const std::string& path);
  /// The same over bytes in memory; `name` is used in error messages.
  static File from_bytes(std::string bytes, const std::string& name = "<memory>");

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  /// Offset of the data section in the file.
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return bytes_.size(); }

  // ---- metadata ----
  /// Keys in file order.
  const std::vector<std::string>& keys() const { return keys_; }
  bool has(const std::string& key) const { return metadata_.count(key) != 0; }
  /// The value of `key`; Error(kFormat) naming the file and key when absent.
  const Value& get(const std::string& key) const;
  /// Typed accessors: Error(kFormat) when the key is absent or has another type.
  std::string get_string(const std::string& key) const;
  uint8_t get_u8(const std::string& key) const;
  int8_t get_i8(const std::string& key) const;
  uint16_t get_u16(const std::string& key) const;
  int16_t get_i16(const std::string& key) const;
  uint32_t get_u32(const std::string& key) const;
  int32_t get_i32(const std::string& key) const;
  uint64_t get_u64(const std::string& key) const;
  int64_t get_i64(const std::string& key) const;
  float get_f32(const std::string& key) const;
  double get_f64(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  /// Any integer type, as int64 (a uint64 above INT64_MAX is an Error).
  int64_t get_int(const std::string& key) const;
  /// Any integer or float type, as double.
  double get_float(const std::string& key) const;
  /// Arrays: of strings; of any integer type (or bool) as int64; of float or integer as double.
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;

  // ---- tensors ----
  /// Tensor infos in file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool has_tensor(const std::string& name) const { return tensor_index_.count(name) != 0; }
  /// Error(kFormat) naming the file when there is no tensor `name`.
  const TensorInfo& tensor(const std::string& name) const;
  /// The tensor's bytes as stored (blocks for quantized types), inside the mapping.
  std::span<const uint8_t> raw_data(const TensorInfo& info) const;
  /// The same bytes as a uint8 Tensor of shape [rows, row_bytes] that shares the file's bytes
  /// (no copy; keeps them alive): what a kernel reading quantized blocks takes.
  Tensor raw_tensor(const TensorInfo& info) const;
  /// The tensor dequantized to `dtype` (float32: the exact value of each element as ggml defines
  /// it; bfloat16: that float32 rounded to nearest even), contiguous, shape info.shape().
  /// Error(kUnsupported) for a type can_dequantize() rejects or another dtype.
  Tensor dequantize(const TensorInfo& info, DType dtype = DType::kFloat32) const;
  Tensor dequantize(const std::string& name, DType dtype = DType::kFloat32) const {
    return dequantize(tensor(name), dtype);
  }

 private:
  struct Bytes;
  File() = default;
  void parse();

  std::string path_;
  std::shared_ptr<const Bytes> owner_;
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::string> keys_;
  std::map<std::string, Value, std::less<>> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

/// Dequantizes `n` elements (a multiple of the block size) of `type` from `src` (n / block size
/// blocks) into `dst`. The kernel dequantize() uses; exposed for tests and model code.
void dequantize_row(GGMLType type, const uint8_t* src, float* dst, int64_t n);

/// Where the real model lives (issue 22): $FLASHINFER_MODEL_PATH when set, otherwise
/// ${XDG_CACHE_HOME:-$HOME/.cache}/flashinfer-cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf
/// (where scripts/bootstrap puts it). Returned whether or not the file exists.
std::string default_model_path();

}  // namespace flashinfer::gguf
