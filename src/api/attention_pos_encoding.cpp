// pos_encoding_mode inside attention. Facts (upstream FlashInfer, see docs/ATTENTION.md):
// RoPE rotates q and k on the fly (llama style, non-interleaved halves) at their positions;
// ALiBi adds slope[h] * (kv_idx - qo_idx) to the scaled logit, before the soft cap's tanh when
// there is one (variants.cuh DefaultAttention's LogitsTransform).
#include "api/attention_pos_encoding.h"

#include <cmath>

#include "api/checks.h"
#include "flashinfer/error.h"
#include "kernels/cpu/attention_cpu.h"

namespace flashinfer::api {

std::vector<float> alibi_slopes(int64_t num_heads) {
  std::vector<float> m;
  if (num_heads <= 0) return m;
  int64_t n = 1;
  while (n * 2 <= num_heads) n *= 2;
  for (int64_t k = 1; k <= n; ++k) m.push_back(static_cast<float>(std::exp2(-8.0 * k / n)));
  for (int64_t k = 1; k < 2 * (num_heads - n); k += 2) {
    m.push_back(static_cast<float>(std::exp2(-4.0 * k / n)));
  }
  return m;
}

void plan_pos_encoding(detail::WrapperState& s, std::string_view mode,
                       std::optional<double> rope_scale, std::optional<double> rope_theta,
                       const char* op) {
  s.pos_encoding = 0;
  s.rope_scale = 1.0;
  s.rope_theta = 1e4;
  s.alibi_slopes.clear();
  if (mode == "NONE") return;
  FLASHINFER_CHECK(mode == "ROPE_LLAMA" || mode == "ALIBI", op, "pos_encoding_mode",
                   "must be \"NONE\", \"ROPE_LLAMA\" or \"ALIBI\", got \"", mode, "\"");
  // The tensor-core path (prefill, decode with use_tensor_cores) is upstream's prefill kernel.
  const bool prefill_kernel = !s.decode || s.use_tensor_cores;
  // CUDA: ALiBi in the decode kernel's variant and, on the tensor-core path, in the FA2 prefill
  // kernel's ALiBi instance (the CUDA-core kernel where that does not fit) without a soft cap
  // (with one, upstream's order of the two is the CPU reference's only); RoPE inside attention
  // runs on the CPU only.
  FLASHINFER_CHECK_CODE(
      s.device.is_cpu() || (mode == "ALIBI" && (!prefill_kernel || !(s.logits_soft_cap > 0.0))),
      ErrorCode::kUnsupported, op, "pos_encoding_mode", "\"", mode,
      "\" inside attention runs on the CPU only on this path (CUDA has ALiBi in the decode "
      "kernel, and without a soft cap in the prefill kernel; apply RoPE with the rope ops before "
      "attention)");
  if (mode == "ROPE_LLAMA") {
    const double scale = rope_scale.value_or(1.0), theta = rope_theta.value_or(1e4);
    FLASHINFER_CHECK(std::isfinite(scale) && scale > 0.0, op, "rope_scale",
                     "must be finite and positive, got ", scale);
    FLASHINFER_CHECK(std::isfinite(theta) && theta > 0.0, op, "rope_theta",
                     "must be finite and positive, got ", theta);
    // Upstream's prefill kernel rotates K in shared memory in its own dtype and only builds for
    // 16-bit K (static_assert(sizeof(DTypeKV) == 2)).
    FLASHINFER_CHECK_CODE(!(prefill_kernel && dtype_is_fp8(s.kv_dtype)), ErrorCode::kUnsupported,
                          op, "pos_encoding_mode",
                          "ROPE_LLAMA with an fp8 KV cache is only available to the decode kernel "
                          "(use_tensor_cores=False), as upstream");
    s.pos_encoding = 1;
    s.rope_scale = scale;
    s.rope_theta = theta;
    return;
  }
  // With a soft cap the CPU kernel follows upstream's order (sm_scale applied twice, see
  // docs/ATTENTION.md).
  s.pos_encoding = 2;
  s.alibi_slopes = alibi_slopes(s.num_qo_heads);
}

bool run_with_pos_encoding(const detail::WrapperState& s, const kernels::AttentionParams& p,
                           const char* op) {
  // ALiBi on CUDA: the decode kernel's variant (p.alibi_slopes, set by the run path).
  if (s.pos_encoding == 0 || (s.pos_encoding == 2 && s.device.is_cuda())) return false;
  FLASHINFER_CHECK_CODE(s.device.is_cpu(), ErrorCode::kUnsupported, op, "pos_encoding_mode",
                        "ROPE_LLAMA / ALIBI inside attention run on the CPU only");
  kernels::cpu::PosEncoding pe;
  pe.mode = s.pos_encoding;
  pe.rope_rcp_scale =
      static_cast<float>(s.rope_rcp_scale > 0 ? s.rope_rcp_scale : 1.0 / s.rope_scale);
  pe.rope_rcp_theta =
      static_cast<float>(s.rope_rcp_theta > 0 ? s.rope_rcp_theta : 1.0 / s.rope_theta);
  pe.alibi_slopes = s.alibi_slopes.empty() ? nullptr : s.alibi_slopes.data();
  kernels::cpu::batch_attention(p, pe);
  return true;
}

}  // namespace flashinfer::api
