// Private: what the MoE kernels of every backend receive. Strides are in elements; weights and
// activations are contiguous in their last dimension (the API layer checks it).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "flashinfer/float_formats.h"
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels {

/// Activation codes: upstream's ActivationType values (flashinfer/ops/moe.h).
enum class MoeAct : int {
  kGelu = 0,
  kRelu = 1,
  kSilu = 2,
  kSwiglu = 3,
  kGeglu = 4,
  kSwigluBias = 5,
  kRelu2 = 6,
  kSwigluStep = 7,
  kGegluTanh = 8,
  kIdentity = 9,
  kSitu = 10,
  // 11 is upstream's InvalidType.
  kClampedRelu2 = 12,  // (L * tanh(relu(x) * (1 / L)))^2, L = clamped_relu2_limit[0]
};

// constexpr: also called from device code (--expt-relaxed-constexpr).
constexpr bool moe_act_is_gated(MoeAct a) {
  return a == MoeAct::kSwiglu || a == MoeAct::kGeglu || a == MoeAct::kSwigluBias ||
         a == MoeAct::kSwigluStep || a == MoeAct::kGegluTanh || a == MoeAct::kSitu;
}

/// SwigluStep of the trtllm-gen ops whose GEMM1 has output scales (FP8 per-tensor, FP4), as
/// upstream 0.7.4's StepFun epilogue computes it (trace/templates/moe.py): on GEMM1's raw
/// accumulators (per-token scale, bias and LoRA delta already in), with sc the up half's output
/// scale (it carries the activation's quantization scale) and sg the gate's,
///   up = clamp(raw_up, -L, L) * sc,  gate = min(silu(raw_gate * sg), L * sg),  h = up * gate,
/// L = gemm1_clamp_limit[e] in raw accumulator units, or 7 / sg (a physical 7 on both halves).
/// With sc = sg = 1 this is the unscaled rule min(silu(g), 7) * clamp(u, -7, 7). NaN stays NaN
/// (torch.clamp's rule). silu_of_scaled_gate is silu(raw_gate * sg), each backend's own silu.
FLASHINFER_HD float trtllm_step_limit(const float* clamp_limit, int64_t e, float sg) {
  return clamp_limit ? clamp_limit[e] : 7.0f / sg;
}
FLASHINFER_HD float trtllm_swiglu_step(float raw_up, float silu_of_scaled_gate, float limit,
                                       float sc, float sg) {
  const float up = (raw_up < -limit ? -limit : (raw_up > limit ? limit : raw_up)) * sc;
  const float cap = limit * sg;
  const float gate = silu_of_scaled_gate > cap ? cap : silu_of_scaled_gate;
  return up * gate;
}

/// cutlass_fused_moe, unquantized: for each token t and each k with a local expert e,
///   g1 = round(x[t] @ w1[e].T);  h = round(act(g1 + b1[e]));  y = round_out(h @ w2[e].T)
///   out[t] = round_out(sum_k scale[t, k] * (y + b2[e]))
/// (biases added in fp32 to the rounded GEMM outputs, as upstream; b2 is null on tp ranks != 0)
/// where round() is to `dtype` and round_out() to `out_dtype`; a local expert is a global id in
/// [expert_offset, expert_offset + num_local_experts).
struct CutlassMoeParams {
  const void* input = nullptr;  // [num_tokens, hidden] of dtype, row stride in_stride
  int64_t in_stride = 0;
  const void* experts = nullptr;  // [num_tokens, top_k] int32 or int64
  DType experts_dtype = DType::kInt32;
  int64_t experts_stride = 0;
  const void* scales = nullptr;  // [num_tokens, top_k] fp32/fp16/bf16
  DType scales_dtype = DType::kFloat32;
  int64_t scales_stride = 0;
  const void* w1 = nullptr;  // [num_local_experts, gemm1_n, hidden], contiguous
  const void* w2 = nullptr;  // [num_local_experts, hidden, inter], contiguous
  const void* b1 = nullptr;  // [num_local_experts, gemm1_n] or null
  const void* b2 = nullptr;  // [num_local_experts, hidden] or null
  // SwigluBias / SwigluStep per-expert fp32 [num_local_experts] (null: default)
  const float* swiglu_alpha = nullptr;
  const float* swiglu_beta = nullptr;
  const float* swiglu_limit = nullptr;
  // Situ per-expert fp32 [num_local_experts] (null: upstream's defaults 4 and 25)
  const float* situ_beta = nullptr;
  const float* situ_linear_beta = nullptr;
  // Situ: false leaves up unclamped (CuTe-DSL w4a4 SiTU without situ_linear_beta).
  bool situ_clamp_up = true;
  // ClampedRelu2: fp32 [1], the model-wide L (on the launch's device).
  const float* clamped_relu2_limit = nullptr;
  void* out = nullptr;  // [num_tokens, hidden] of out_dtype, row stride out_stride
  int64_t out_stride = 0;
  DType dtype = DType::kBFloat16;
  DType out_dtype = DType::kBFloat16;
  int64_t num_tokens = 0, top_k = 0, hidden = 0, inter = 0;
  int64_t num_local_experts = 0, expert_offset = 0;
  // Expert-parallel ranks: about 1 / ep_size of the pairs are local (the CUDA route choice).
  int64_t ep_size = 1;
  MoeAct act = MoeAct::kSwiglu;
  // false: GEMM1's fp32 result goes straight into the activation (trtllm-gen fuses them).
  bool round_gemm1 = true;
  // CUDA only: fp32 scratch on the device, [num_tokens * top_k, gemm1_n], [.., inter], [.., hidden]
  // (values already rounded to dtype / out_dtype), allocated by the API layer.
  float* ws_g1 = nullptr;
  float* ws_h = nullptr;
  float* ws_y = nullptr;
  // do_finalize=False (the trtllm ops): instead of `out`, each local pair's GEMM2 row (bf16, not
  // weighted) goes to row expanded_to_permuted[t * top_k + k] of `permuted_out` (bf16
  // [num_tokens * top_k, hidden], contiguous; rows past the local pairs are zeroed); -1 marks a
  // pair with no local expert. Row order: local experts ascending, then t * top_k + k ascending.
  void* permuted_out = nullptr;
  int32_t* expanded_to_permuted = nullptr;
  // The trtllm routed ops' gemm1_lora_delta (CPU only): bf16 [num_tokens, top_k, gemm1_n], pair
  // (t, k) at t * delta_stride_t + k * delta_stride_k, columns contiguous, in the logical GEMM1
  // column order (up, then gate); added in fp32 to GEMM1's output after its bias, before the
  // activation. With it the op also returns the activation: each local pair's post-activation
  // row (dtype, [num_tokens * top_k, inter], contiguous, rows past the local pairs zeroed) at
  // row expanded_to_permuted[t * top_k + k] of `act_out`, finalized or not.
  const uint16_t* fc1_delta = nullptr;
  int64_t delta_stride_t = 0, delta_stride_k = 0;
  void* act_out = nullptr;
};

/// fused_topk_deepseek: DeepSeek-V3 grouped top-k over [num_tokens, num_experts] scores.
struct DeepSeekRoutingParams {
  const void* scores = nullptr;
  DType scores_dtype = DType::kFloat32;
  int64_t scores_stride = 0;
  const void* bias = nullptr;  // [num_experts]
  DType bias_dtype = DType::kFloat32;
  int64_t bias_stride = 1;
  void* topk_values = nullptr;  // [num_tokens, topk] of values_dtype
  DType values_dtype = DType::kFloat32;
  int64_t values_stride = 0;
  int32_t* topk_indices = nullptr;  // [num_tokens, topk]
  int64_t indices_stride = 0;
  int16_t* replay_out = nullptr;  // [>= num_tokens, topk] or null
  int64_t replay_stride = 0;
  int64_t num_tokens = 0, num_experts = 0, n_group = 1, topk_group = 1, topk = 1;
  float routed_scaling_factor = 1.0f;
};

/// The trtllm-gen routing methods (upstream's RoutingMethodType values).
enum class MoeRouting : int {
  kDefault = 0,           // softmax over all experts, top-k
  kRenormalize = 1,       // top-k logits, softmax over the k
  kDeepSeekV3 = 2,        // sigmoid + bias, grouped top-k, normalized unbiased sigmoid * scale
  kLlama4 = 3,            // top-1, sigmoid(logit)
  kRenormalizeNaive = 4,  // softmax, top-k, divided by the sum of the k
  kTopK = 5,              // top-k of the logits, the logits as weights
  kSigmoidRenorm = 6,     // sigmoid, top-k, divided by the sum of the k (norm_topk_prob)
  kMiniMax2 = 7,          // sigmoid + bias selects, sigmoid * scale / (sum + 1e-20)
  kSigmoid = 8,           // sigmoid, top-k
  kTopKSigmoid = 9,       // top-k of the logits, each weight its sigmoid (Llama4's for any k)
};

/// The routing bias as upstream adds it to the selection scores: its grouped DeepSeekV3 kernel
/// (n_group > 1, routingDeepSeek) first casts the bias to the bf16 of its output weights; the
/// other paths (DeepSeekV3 without groups, MiniMax2) add it as given.
FLASHINFER_HD float moe_routing_bias(MoeRouting method, int64_t n_group, float b) {
  return method == MoeRouting::kDeepSeekV3 && n_group > 1
             ? bfloat16_bits_to_float(float_to_bfloat16_bits(b))
             : b;
}

/// Routing from logits: ids [num_tokens, top_k] global expert ids, weights fp32.
struct MoeRoutingParams {
  const void* logits = nullptr;  // [num_tokens, num_experts] fp32 or bf16
  DType logits_dtype = DType::kFloat32;
  int64_t logits_stride = 0;
  const void* bias = nullptr;  // [num_experts] or null
  DType bias_dtype = DType::kFloat32;
  int64_t num_tokens = 0, num_experts = 0, top_k = 1, n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;
  bool norm_topk_prob = true;
  MoeRouting method = MoeRouting::kDefault;
};

/// trtllm_bf16_moe: routing, then the fused MoE (round_gemm1 = false) over the local experts.
/// moe.experts / moe.scales are filled by the kernel from the routing (ignored on input).
struct TrtllmMoeParams {
  MoeRoutingParams routing;  // unused when `precomputed` is set
  // Precomputed routing (the _routed_ ops): `packed` [num_tokens, top_k] int32 holding
  // (expert_id << 16) | bf16 weight bits, or `ids` int32 with `weights` (bf16 or fp32).
  bool precomputed = false;
  const int32_t* packed = nullptr;
  const int32_t* ids = nullptr;
  const void* weights = nullptr;
  DType weights_dtype = DType::kFloat32;
  int64_t routed_stride = 0;  // row stride of packed / ids / weights
  CutlassMoeParams moe;
  int16_t* replay_out = nullptr;  // [>= num_tokens, top_k] or null
  int64_t replay_stride = 0;
  // do_finalize=False: the routing weights as the launcher returns them, bf16 [num_tokens *
  // top_k] contiguous (null: not asked for).
  uint16_t* expert_weights_out = nullptr;
  // num_fused_shared_experts S (DeepSeekV3 routing from logits, no expert parallelism): the
  // routing appends S slots per token, ids num_experts + s at weight 1.0, so the routing output
  // is [num_tokens, top_k + S] (moe.top_k counts them, moe.num_local_experts holds the S weight
  // rows after the routed ones). docs/MOE.md, "Fused shared experts".
  int64_t num_shared = 0;
};

/// Whether the combine sees the routing weights rounded to bf16: upstream's routing kernels
/// write them as bf16, and its launchers keep bf16 expert weights, except for the _routed_ ops'
/// (ids, weights) pair form with fp32 weights, whose dtype the launchers take (then only Llama4's
/// scales on the input are cast to bf16).
FLASHINFER_HD bool trtllm_weights_in_bf16(const TrtllmMoeParams& p) {
  return !(p.precomputed && p.packed == nullptr && p.weights_dtype == DType::kFloat32);
}

/// hash_topk: experts from a token-to-expert table, weights sqrt(softplus(logit)) normalized
/// over the routed experts; an optional shared-expert slot (id num_experts, weight
/// 1 / routed_scaling_factor).
struct HashTopkParams {
  const float* logits = nullptr;  // [num_tokens, num_experts]
  int64_t logits_stride = 0;
  const int64_t* input_ids = nullptr;  // [num_tokens]
  int64_t ids_stride = 1;
  const int32_t* tid2eid = nullptr;  // [vocab, topk]
  int64_t table_stride = 0;
  float* weights = nullptr;  // [num_tokens, topk + shared], contiguous
  int32_t* topk_ids = nullptr;
  int64_t num_tokens = 0, num_experts = 0, vocab = 0, topk = 0, num_shared = 0;
  float routed_scaling_factor = 1.0f;
};

/// cutlass_fused_moe(enable_alltoall=True): upstream's finalize then skips the rows of tokens
/// that route to no local expert (no id of experts[t, :] in [lo, hi)), which keep what `output`
/// held; the other finalize wrote them zero. Row t of `out` with no local expert gets `before`'s
/// row t back (`before`: `output` as it was before the call). Rows are row_bytes long; strides in
/// bytes (rows) and elements (experts).
struct MoeKeepRowsParams {
  void* out = nullptr;
  int64_t out_stride = 0;
  const void* before = nullptr;
  int64_t before_stride = 0;
  int64_t row_bytes = 0;
  const void* experts = nullptr;  // [num_tokens, top_k] int32 or int64
  DType experts_dtype = DType::kInt32;
  int64_t experts_stride = 0;
  int64_t num_tokens = 0, top_k = 0, lo = 0, hi = 0;
};

/// Whether token t routes to an expert of this rank (the CPU and CUDA kernels' one rule).
FLASHINFER_HD bool moe_token_has_local_expert(const MoeKeepRowsParams& p, int64_t t) {
  for (int64_t k = 0; k < p.top_k; ++k) {
    const int64_t i = t * p.experts_stride + k;
    const int64_t e = p.experts_dtype == DType::kInt64 ? static_cast<const int64_t*>(p.experts)[i]
                                                       : static_cast<const int32_t*>(p.experts)[i];
    if (e >= p.lo && e < p.hi) return true;
  }
  return false;
}

}  // namespace flashinfer::kernels
