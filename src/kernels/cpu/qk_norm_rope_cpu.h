// Private: CPU reference of fused_qk_rmsnorm_rope.
#pragma once

#include <cstdint>

namespace flashinfer::kernels {

struct QkNormRopeParams {
  const uint16_t* qkv = nullptr;  // bf16 bits [tokens, (hq + hk + hv) * d], contiguous
  const uint16_t* q_weight = nullptr;
  const uint16_t* k_weight = nullptr;
  void* q_out = nullptr;  // bf16 or e4m3 bytes, [tokens, h * d] contiguous
  void* k_out = nullptr;
  void* v_out = nullptr;
  int64_t tokens = 0, seq_len = 0, pph = 0, ppw = 0;
  int64_t frame_ch = 0, height_ch = 0, width_ch = 0;
  int64_t hq = 0, hk = 0, hv = 0, d = 0;
  float eps = 1e-6f, base = 10000.0f, factor = 1.0f, low = 0.0f, high = 0.0f;
  float attention_factor = 1.0f, out_scale = 1.0f, v_scale = 1.0f;
  bool interleave = true, norm = true, fp8 = false;
};

namespace cpu {
void fused_qk_rmsnorm_rope(const QkNormRopeParams& p);
/// The frequency of rotation pair `i` (0 <= i < d/2) and its section (0 frame, 1 height,
/// 2 width), as the kernel's host table builds it.
float qk_rope_freq(const QkNormRopeParams& p, int64_t i, int* section);
}  // namespace cpu

}  // namespace flashinfer::kernels
