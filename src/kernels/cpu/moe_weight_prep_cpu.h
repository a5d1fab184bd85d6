// CPU layout transforms of the SM90 mixed-input MoE weight preparation (docs/MOE.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashinfer::kernels {

enum class Sm90QuantType : int { kInt4 = 0, kFp4 = 1, kFp4Fp8 = 2 };  // upstream's qtype_map

struct Sm90WeightInterleaveParams {
  const uint8_t* in = nullptr;
  uint8_t* out = nullptr;
  int64_t experts = 0, n = 0, k = 0;  // k counts 4-bit elements; a row holds k / 2 bytes
  Sm90QuantType quant_type = Sm90QuantType::kFp4;
};

struct Sm90ScaleInterleaveParams {
  const uint8_t* in = nullptr;
  uint8_t* out = nullptr;
  int64_t experts = 0, rows = 0, k_groups = 0;  // [E, rows, k_groups] elements
  int64_t groups_per_k128 = 0, m_slices = 0, folded_m = 0;
  std::size_t element_size = 1;
};

struct HummingPrepParams {
  const uint8_t* weight = nullptr;     // [E, rows, k / 2] packed FP4
  const uint8_t* raw_scale = nullptr;  // [E, rows, k / 32] E8M0
  int64_t experts = 0, rows = 0, k = 0, max_range = 11;
  uint8_t* weight_out = nullptr;  // [E, rows, k / 2] processed payload
  uint8_t* offset_out = nullptr;  // [E, rows, k / 32]
  float* residual = nullptr;      // [E]
  // The CUDA kernels' device buffers: the rewrite table (humming_rewrite_table()'s bytes) and
  // one int32 per expert for its new low end. Unused by the CPU.
  const uint8_t* rewrite_table = nullptr;
  int32_t* low = nullptr;
};

namespace cpu {
void sm90_interleave_weights(const Sm90WeightInterleaveParams& p);
void sm90_interleave_scales(const Sm90ScaleInterleaveParams& p);
void humming_prepare(const HummingPrepParams& p);
/// The payload rewrite table: code of FP4 `code` after scaling by 2^-delta (delta 0 maps -0 to
/// +0 only).
uint8_t humming_rewrite_code(int delta, int code);
/// humming_rewrite_code for every delta (0..255) and code, row-major [256][16] (built once; the
/// table both backends rewrite the payload with).
const uint8_t* humming_rewrite_table();
}  // namespace cpu

}  // namespace flashinfer::kernels
