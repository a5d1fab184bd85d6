// Shorthands for writing trace templates (src/trace/templates*.cpp), and the Python helper text
// that several templates' references share (defined in template_snippets.cpp).
#pragma once

#include "trace/trace_template.h"

namespace flashinfer::trace::detail {

/// A variable axis; `init_value` sizes it in `flashinfer trace` and the init snippet.
inline Axis var(std::string name, std::string desc = "", int64_t init_value = 4) {
  return {.name = std::move(name),
          .is_const = false,
          .description = std::move(desc),
          .init_value = init_value};
}
/// A constant axis; `abbrev` is its letter in the definition name ("" = none).
inline Axis cst(std::string name, std::string abbrev, std::string desc = "") {
  return {.name = std::move(name),
          .is_const = true,
          .abbrev = std::move(abbrev),
          .description = std::move(desc)};
}
/// A tensor input or output, shaped by axis names.
inline Io T(std::string key, std::vector<std::string> dims) {
  Io io;
  io.key = std::move(key);
  io.dims = std::move(dims);
  return io;
}
/// A scalar input of the given dtype.
inline Io S(std::string key, std::string dtype) {
  Io io;
  io.key = std::move(key);
  io.scalar = true;
  io.dtype = std::move(dtype);
  return io;
}

inline const std::vector<std::string> kBH = {"batch_size", "hidden_size"};

// Python helpers pasted in front of a reference's `run` (each reference runs alone).
extern const char* const kRopeHelpers;     // _freqs, _rotate, _ragged_positions
extern const char* const kRopeFp8Helpers;  // _rotate (cos/sin given), _fp8 (e4m3 rounding)
extern const char* const kMxHelpers;       // UE8M0 / e2m1 decoding, the 128x4 scale layout
extern const char* const kFp4Quant;        // NVFP4 quantization as ops/quantization.h
extern const char* const kMoeFp8Experts;   // DeepSeek FP8 block-scale experts
extern const char* const kMoeFp4Experts;   // NVFP4 experts
extern const char* const kAttend;          // dense attention with base-2 LSE
extern const char* const kRoute;           // MoE routing from logits as our CPU op (methods 0-5)

// Template groups kept in their own files (each appends its templates to the table).
void add_moe_entry_points(std::vector<Template>& v);  // templates_moe_entry.cpp

// The templates of src/trace/templates_attention_extra.cpp (attention entry points, MLA page
// append, RoPE + FP8 + append, the small GEMMs, top_k_varlen).
void add_attention_extra(std::vector<Template>& v);

}  // namespace flashinfer::trace::detail
