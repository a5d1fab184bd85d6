// The list of built-in op areas, and the global registry that holds them. Registration is
// explicit (no static initializers, which a static link can drop): each area's register
// function adds its declarations when the registry is first used. Core declares the OpRegistry
// class only; the registry of built-in ops lives here, so core never calls into api.
#include <utility>

#include "flashinfer/op_decl.h"

namespace flashinfer::detail {

void register_norm_ops(OpRegistry& registry);
void register_sampling_ops(OpRegistry& registry);
void register_quantization_ops(OpRegistry& registry);
void register_gemm_ops(OpRegistry& registry);
void register_page_ops(OpRegistry& registry);
void register_cascade_ops(OpRegistry& registry);
void register_decode_ops(OpRegistry& registry);
void register_prefill_ops(OpRegistry& registry);
void register_activation_ops(OpRegistry& registry);
void register_rope_ops(OpRegistry& registry);
void register_trtllm_attention_ops(OpRegistry& registry);
void register_topk_ops(OpRegistry& registry);
void register_gguf_mm_ops(OpRegistry& registry);
void register_moe_ops(OpRegistry& registry);
void register_norm_quant_ops(OpRegistry& registry);
void register_quant8_ops(OpRegistry& registry);
void register_mla_ops(OpRegistry& registry);
void register_gemm_fp8_ops(OpRegistry& registry);
void register_moe_quant_ops(OpRegistry& registry);
void register_moe_routing_ops(OpRegistry& registry);
void register_ragged_deepseek_ops(OpRegistry& registry);
void register_fmha_v2_ops(OpRegistry& registry);
void register_rope_quantize_ops(OpRegistry& registry);
void register_nvfp4_ops(OpRegistry& registry);
void register_nvfp4_paged_ops(OpRegistry& registry);
void register_dit_norm_ops(OpRegistry& registry);
void register_cascade_wrapper_ops(OpRegistry& registry);
void register_batch_attention_ops(OpRegistry& registry);
void register_pod_ops(OpRegistry& registry);
void register_sparse_ops(OpRegistry& registry);
void register_gemm_bf16_fp4_ops(OpRegistry& registry);
void register_qk_norm_rope_ops(OpRegistry& registry);
void register_svdquant_ops(OpRegistry& registry);
void register_moe_weight_prep_ops(OpRegistry& registry);
void register_moe_lora_ops(OpRegistry& registry);
void register_moe_fp4_ops(OpRegistry& registry);
void register_grouped_gemm_ops(OpRegistry& registry);
void register_fmha_v2_prefill_ops(OpRegistry& registry);
void register_attention_sink_ops(OpRegistry& registry);
void register_xqa_ops(OpRegistry& registry);
void register_gdn_ops(OpRegistry& registry);
void register_mamba_ops(OpRegistry& registry);
void register_mhc_ops(OpRegistry& registry);
void register_norm_fp4quant_ops(OpRegistry& registry);
void register_kda_ops(OpRegistry& registry);
void register_bsa_ops(OpRegistry& registry);
void register_moe_cute_mxfp8_mxfp4_ops(OpRegistry& registry);
void register_nvfp4_attention_sm120_ops(OpRegistry& registry);
void register_monomoe_ops(OpRegistry& registry);
void register_rope_quantize_append_ops(OpRegistry& registry);
void register_moe_b12x_ops(OpRegistry& registry);
void register_comm_ops(OpRegistry& registry);
void register_quantized_allreduce_ops(OpRegistry& registry);
void register_mixed_comm_ops(OpRegistry& registry);
void register_ulysses_ops(OpRegistry& registry);
void register_moe_alltoall_ops(OpRegistry& registry);
void register_msa_ops(OpRegistry& registry);
void register_prims_ts_ops(OpRegistry& registry);
void register_cute_dsl_attention_ops(OpRegistry& registry);

void register_builtin_ops(OpRegistry& registry) {
  register_norm_ops(registry);
  register_sampling_ops(registry);
  register_quantization_ops(registry);
  register_gemm_ops(registry);
  register_page_ops(registry);
  register_cascade_ops(registry);
  register_decode_ops(registry);
  register_prefill_ops(registry);
  register_activation_ops(registry);
  register_rope_ops(registry);
  register_trtllm_attention_ops(registry);
  register_topk_ops(registry);
  register_gguf_mm_ops(registry);
  register_moe_ops(registry);
  register_norm_quant_ops(registry);
  register_quant8_ops(registry);
  register_mla_ops(registry);
  register_gemm_fp8_ops(registry);
  register_moe_quant_ops(registry);
  register_moe_routing_ops(registry);
  register_ragged_deepseek_ops(registry);
  register_fmha_v2_ops(registry);
  register_rope_quantize_ops(registry);
  register_nvfp4_ops(registry);
  register_nvfp4_paged_ops(registry);
  register_dit_norm_ops(registry);
  register_cascade_wrapper_ops(registry);
  register_batch_attention_ops(registry);
  register_pod_ops(registry);
  register_sparse_ops(registry);
  register_gemm_bf16_fp4_ops(registry);
  register_qk_norm_rope_ops(registry);
  register_svdquant_ops(registry);
  register_moe_weight_prep_ops(registry);
  register_moe_lora_ops(registry);
  register_moe_fp4_ops(registry);
  register_grouped_gemm_ops(registry);
  register_fmha_v2_prefill_ops(registry);
  register_attention_sink_ops(registry);
  register_xqa_ops(registry);
  register_gdn_ops(registry);
  register_mamba_ops(registry);
  register_mhc_ops(registry);
  register_norm_fp4quant_ops(registry);
  register_kda_ops(registry);
  register_bsa_ops(registry);
  register_moe_cute_mxfp8_mxfp4_ops(registry);
  register_nvfp4_attention_sm120_ops(registry);
  register_monomoe_ops(registry);
  register_rope_quantize_append_ops(registry);
  register_moe_b12x_ops(registry);
  register_comm_ops(registry);
  register_quantized_allreduce_ops(registry);
  register_mixed_comm_ops(registry);
  register_ulysses_ops(registry);
  register_moe_alltoall_ops(registry);
  register_msa_ops(registry);
  register_prims_ts_ops(registry);
  register_cute_dsl_attention_ops(registry);
}

}  // namespace flashinfer::detail

namespace flashinfer {

OpRegistry& OpRegistry::global() {
  static OpRegistry* registry = [] {
    auto* r = new OpRegistry();  // never destroyed: declarations outlive static destructors
    detail::register_builtin_ops(*r);
    return r;
  }();
  return *registry;
}

const OpDecl& register_op(OpDecl decl) { return OpRegistry::global().add(std::move(decl)); }

}  // namespace flashinfer
