// CPU reference kernels for the MoE ops: fp32 accumulation; the fused MoE runs each local
// expert's rows as two GEMMs (never a dense pass over all experts).
#pragma once

#include "kernels/moe_params.h"

namespace flashinfer::kernels::cpu {

void cutlass_moe(const CutlassMoeParams& p);
void moe_keep_rows(const MoeKeepRowsParams& p);
void deepseek_routing(const DeepSeekRoutingParams& p);
/// Throws flashinfer::Error naming input_ids / tid2eid for an id outside its table.
void hash_topk(const HashTopkParams& p);
/// Routing from logits into ids [num_tokens, top_k] (int32) and weights (fp32).
void moe_routing(const MoeRoutingParams& p, int32_t* ids, float* weights);
void trtllm_moe(const TrtllmMoeParams& p);
/// The routing step of trtllm_moe: ids / weights [num_tokens, top_k] from the logits or the
/// precomputed routing, and routing_replay_out when set. The weights are rounded to bf16 where
/// upstream's launchers keep them so (trtllm_weights_in_bf16), as the CUDA route does, unless
/// `round_weights` is false (the b12x / CuTe-DSL paths, which keep fp32 weights).
void trtllm_route(const TrtllmMoeParams& p, int32_t* ids, float* weights,
                  bool round_weights = true);

/// do_finalize=False for the trtllm kernels that keep a per-pair GEMM2 row `y_pair` (fp32
/// [num_tokens * top_k, hidden], already at the kernel's rounding) and `local` [num_tokens *
/// top_k] (pair has a local expert): writes m.permuted_out / m.expanded_to_permuted in the
/// order CutlassMoeParams states. `ids` are the global expert ids of the pairs.
void moe_store_permuted(const CutlassMoeParams& m, const int32_t* ids, const float* y_pair);
/// The same for any per-pair rows (fp32 [num_tokens * top_k, cols]) into `out` (bf16, contiguous
/// [num_tokens * top_k, cols]): the LoRA delta's activation output (CutlassMoeParams::act_out).
void moe_store_permuted_rows(const CutlassMoeParams& m, const int32_t* ids, const float* rows,
                             int64_t cols, void* out);
/// The same for rows of bytes kept as they are (fp8 codes: the FP8 ops' activation).
void moe_store_permuted_bytes(const CutlassMoeParams& m, const int32_t* ids, const uint8_t* rows,
                              int64_t row_bytes, void* out);

/// The activation of one GEMM1 output row (exposed for tests): `g1` holds [gemm1_n] fp32 values
/// (up half first, then gate, for gated activations), `h` receives [inter] values. `e` is the
/// local expert (for the per-expert SwigluBias / SwigluStep parameters).
void moe_activation_row(const CutlassMoeParams& p, int64_t e, const float* g1, float* h);

/// The trtllm-gen SwigluStep with GEMM1 output scales (kernels/moe_params.h,
/// trtllm_swiglu_step) over one row: `raw` holds [2 * inter] raw accumulators (up half first),
/// `h` receives [inter] values; the limit is p.swiglu_limit[e] (raw units) or 7 / sg.
void moe_trtllm_step_row(const CutlassMoeParams& p, int64_t e, const float* raw, float sc, float sg,
                         float* h);

}  // namespace flashinfer::kernels::cpu
