#pragma once
// Argument checks shared by the trtllm MoE entry points (fp8, fp4, mxint4 and their routed
// forms): the routing inputs (logits or precomputed top-k ids, bias, groups, the local expert
// range, the scaling factor, routing_replay_out) and the per-expert parameter tensors.

#include <cstdint>
#include <optional>
#include <vector>

#include "flashinfer/ops/moe.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"
#include "kernels/moe_params.h"

namespace flashinfer::api {

struct MoeRoutingArgs {
  const char* op;
  const MoeTopkIds* routed;  // precomputed routing, or null: from `logits`
  const Tensor* logits;
  const std::optional<Tensor>* bias;  // null: the op has no routing_bias
  int64_t num_experts, top_k;
  std::optional<int64_t> n_group, topk_group;
  int64_t offset, local_num;
  std::optional<double> scale;
  int64_t method;
  bool norm_topk_prob;
  const std::optional<Tensor>* replay_out;  // null: the op has no routing_replay_out
};

/// kUnsupported naming op and arg when `flag` (an upstream option this build does not model).
void refuse_if(bool flag, const char* op, const char* arg, const char* why);

/// An optional fp32 [experts] contiguous tensor (per-expert scales, SwiGLU parameters) on
/// `like`'s device: its data, or null when absent.
const float* per_expert_floats(const std::optional<Tensor>& t, int64_t experts, const Tensor& like,
                               const char* op, const char* arg);

/// Upstream 0.7.4's workspace_buffer of the trtllm MoE ops: scratch its kernels carve their
/// intermediates from (nothing here needs it), checked as upstream's launcher checks it (the
/// device and the 256-byte alignment against `hidden` when given).
void check_moe_workspace_buffer(const std::optional<Tensor>& ws, bool do_finalize,
                                const std::optional<Tensor>& gemm1_lora_delta, const char* op,
                                const Tensor* hidden = nullptr);

/// Upstream 0.7.4's padded dimensions of the trtllm MoE ops (docs/MOE.md, "Padded dimensions"):
/// hidden_out = roundUp(valid_hidden_size, 128) (GEMM2's N, and the hidden columns GEMM1
/// contracts) or H; inter = min(roundUp(valid_intermediate_size, 128), I), the FC1 rows of each
/// half and GEMM2's K; out_cols = valid_hidden_size or H, the returned width.
struct MoeValidDims {
  int64_t hidden_out, inter, out_cols;
  bool hidden_given;
};
/// Upstream's checks and texts (its Python layer, then its launcher's checked_valid_dim and the
/// finalize's 16-byte row rule).
MoeValidDims check_moe_valid_dims(const char* op, std::optional<int64_t> valid_hidden_size,
                                  std::optional<int64_t> valid_intermediate_size, int64_t H,
                                  int64_t I, bool do_finalize);
/// A finalized `output` must be exactly valid_hidden_size wide when it is given.
void check_moe_output_width(const char* op, const std::optional<Tensor>& output,
                            std::optional<int64_t> valid_hidden_size, bool do_finalize);
/// ClampedRelu2's model-wide limit (upstream 0.7.4's checks and texts, cutlass and CuTe-DSL
/// alike): when `clamped`, a one-element fp32 tensor (on `device` when given); otherwise none.
void check_clamped_relu2_limit(const char* op, bool clamped, const std::optional<Tensor>& limit,
                               std::optional<Device> device);

/// hidden_states_scale_layout (the FP4 ops): validation only; anything but
/// SfLayout.layout_linear (or None) is refused with upstream's NotImplementedError text
/// (kUnsupported) when there is a scale tensor.
void check_moe_sf_layout(const char* op, const Value& layout, bool has_scale);

/// SwigluStep's gemm1 parameters as upstream 0.7.4's launchers check them
/// (validateStepGemm1ActivationParams): gemm1_alpha / gemm1_beta refused with SwigluStep.
void check_step_gemm1_params(int64_t activation_type, const std::optional<Tensor>& alpha,
                             const std::optional<Tensor>& beta, const char* op);

/// A tensor's last dimension has stride 1 (or a single element).
void check_last_stride_one(const Tensor& t, const char* op, const char* arg);

/// Checks the routing arguments against hidden_states [T, H] (already checked 2-D). DeepSeekV3's
/// group rule (num_experts % n_group, topk_group) applies to routing computed here, and to
/// precomputed routing too when `groups_when_routed`.
void check_moe_routing(const MoeRoutingArgs& c, const Tensor& hidden, bool groups_when_routed);

/// check_moe_routing, then the routing half of the kernels' parameters: the logits or the
/// precomputed ids/weights, bias, groups, scaling and routing_replay_out.
void fill_moe_routing(const MoeRoutingArgs& c, const Tensor& hidden, bool groups_when_routed,
                      kernels::TrtllmMoeParams& b);

/// do_finalize=False (docs/MOE.md, "do_finalize=False"): allocates upstream's returned list
/// [gemm2_output bf16 [T * top_k, H], expert_weights bf16 [T, top_k], expanded_idx_to_permuted_idx
/// int32 [T * top_k]] and points `b` at it (`b.moe`'s sizes must be set). For the (ids, weights)
/// form expert_weights is the caller's weights tensor, as upstream returns it. Unless
/// `cuda_kernel` (the op's CUDA kernel writes these outputs), a CUDA call raises kUnsupported
/// naming do_finalize (replay falls back to the CPU).
std::vector<Tensor> bind_unfinalized(kernels::TrtllmMoeParams& b, const MoeTopkIds* routed,
                                     const Tensor& hidden, const char* op,
                                     bool cuda_kernel = false);

/// gemm1_lora_delta of the trtllm routed ops (docs/MOE.md, "gemm1_lora_delta"): checks `delta`
/// (bf16 [T, top_k, 2I], last stride 1, on the CPU: on a GPU kUnsupported naming it; a gated
/// activation required), points `m` at it and appends to `tensors` upstream's extra results:
/// expanded_idx_to_permuted_idx when finalized (int32 [T * top_k]) and the permuted activation
/// ([T * top_k, I] of `act_dtype`: bf16, or uint8 fp8 codes). `m`'s sizes must be set.
void bind_lora_delta(kernels::CutlassMoeParams& m, const Tensor& delta, const Tensor& hidden,
                     bool gated, bool do_finalize, DType act_dtype, const char* op,
                     std::vector<Tensor>& tensors);

/// num_fused_shared_experts (docs/MOE.md, "Fused shared experts"): raises unless S == 0 or
/// the routing is DeepSeekV3 from logits with n_group > 1 and no expert parallelism (offset 0,
/// local_num == num_experts; `ep_code` is the error code of that rule: upstream's MoE launchers
/// reject it, the routing op has no such check). Returns S.
int64_t check_fused_shared(const char* op, std::optional<int64_t> num_fused_shared_experts,
                           int64_t method, std::optional<int64_t> n_group, int64_t offset,
                           int64_t local_num, int64_t num_experts, ErrorCode ep_code);

/// check_fused_shared for a trtllm MoE op; then S > 0 on the CPU only (no CUDA kernel here:
/// kUnsupported naming num_fused_shared_experts). With do_finalize=False the list spans all
/// top_k + S slots (expert_weights bf16 [T, top_k + S]) in the FP8 and FP4 ops alike.
int64_t check_moe_fused_shared(const MoeRoutingArgs& c, std::optional<int64_t> nfse,
                               const Tensor& hidden);

}  // namespace flashinfer::api
