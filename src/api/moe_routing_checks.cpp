#include "api/moe_routing_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "api/checks.h"
#include "flashinfer/error.h"
#include "kernels/moe_params.h"

namespace flashinfer::api {

void refuse_if(bool flag, const char* op, const char* arg, const char* why) {
  if (flag) FLASHINFER_FAIL(ErrorCode::kUnsupported, op, arg, why);
}

// Upstream 0.7.4's workspace_buffer of the trtllm MoE ops: scratch its kernels carve their
// intermediates from (garbage after the call; nothing here needs it), with its launcher's checks
// (bind_workspace_buffer) in their order.
void check_moe_workspace_buffer(const std::optional<Tensor>& ws, bool do_finalize,
                                const std::optional<Tensor>& gemm1_lora_delta, const char* op,
                                const Tensor* hidden) {
  if (!ws) return;
  FLASHINFER_CHECK(do_finalize && !gemm1_lora_delta, op, "workspace_buffer",
                   "workspace_buffer requires do_finalize=True and is incompatible with "
                   "gemm1_lora_delta, because returned intermediates cannot live in a shared "
                   "workspace.");
  api::check_defined(*ws, op, "workspace_buffer");
  FLASHINFER_CHECK(ws->dtype() == DType::kUInt8 || ws->dtype() == DType::kInt8, op,
                   "workspace_buffer", "workspace_buffer dtype must be uint8 or int8, got ",
                   dtype_torch_name(ws->dtype()));
  FLASHINFER_CHECK(ws->dim() == 1, op, "workspace_buffer",
                   "workspace_buffer must be 1-D, got ndim=", ws->dim());
  FLASHINFER_CHECK(ws->is_contiguous(), op, "workspace_buffer",
                   "workspace_buffer must be contiguous.");
  if (hidden == nullptr) return;
  FLASHINFER_CHECK(ws->device() == hidden->device(), op, "workspace_buffer",
                   "workspace_buffer must be on the same CUDA device as hidden_states.");
  // A device buffer's rule (torch's CUDA allocator meets it); a host copy (a replay on the CPU)
  // is not held to it.
  FLASHINFER_CHECK(
      !ws->device().is_cuda() || reinterpret_cast<std::uintptr_t>(ws->data_ptr()) % 256 == 0, op,
      "workspace_buffer",
      "workspace_buffer must be 256-byte aligned (torch.empty on CUDA satisfies "
      "this).");
}

MoeValidDims check_moe_valid_dims(const char* op, std::optional<int64_t> valid_hidden_size,
                                  std::optional<int64_t> valid_intermediate_size, int64_t H,
                                  int64_t I, bool do_finalize) {
  MoeValidDims d{H, I, H, valid_hidden_size.has_value()};
  if (valid_hidden_size) {
    const int64_t vh = *valid_hidden_size;
    FLASHINFER_CHECK(vh > 0, op, "valid_hidden_size", "valid_hidden_size must be positive, got ",
                     vh);
    const int64_t n = (vh + 127) / 128 * 128;
    FLASHINFER_CHECK(n <= H, op, "valid_hidden_size",
                     "roundUp(valid_hidden_size, 128) must be <= padded hidden_size, got ", n,
                     " > ", H);
    FLASHINFER_CHECK(do_finalize || n == H, op, "valid_hidden_size",
                     "valid_hidden_size is not supported with do_finalize=False unless "
                     "roundUp(valid_hidden_size, 128) == hidden_size: the unfinalized expert "
                     "output keeps the padded hidden size, so the valid (unpadded) hidden "
                     "dimension cannot be applied. Got roundUp(",
                     vh, ", 128)=", n, " vs hidden_size=", H,
                     ". Pass do_finalize=True or drop valid_hidden_size.");
    // Upstream's finalize stores 16-byte vectors of the bf16 output row.
    FLASHINFER_CHECK(!do_finalize || vh % 8 == 0, op, "valid_hidden_size", "MoE output row width ",
                     vh,
                     " is not 16B-aligned for a 16-bit output dtype; it must be a multiple of 8.");
    d.hidden_out = n;
    d.out_cols = vh;
  }
  if (valid_intermediate_size) {
    const int64_t vi = *valid_intermediate_size;
    FLASHINFER_CHECK(vi > 0, op, "valid_intermediate_size",
                     "valid_intermediate_size must be positive, got ", vi);
    FLASHINFER_CHECK(vi <= 0x7FFFFFFF, op, "valid_intermediate_size",
                     "valid_intermediate_size is too large for int32: ", vi);
    FLASHINFER_CHECK(vi <= I, op, "valid_intermediate_size", "valid_intermediate_size=", vi,
                     " must be <= padded dimension ", I);
    d.inter = std::min((vi + 127) / 128 * 128, I);
  }
  return d;
}

void check_moe_output_width(const char* op, const std::optional<Tensor>& output,
                            std::optional<int64_t> valid_hidden_size, bool do_finalize) {
  if (!valid_hidden_size || !output || !do_finalize) return;
  FLASHINFER_CHECK(output->dim() < 2 || output->size(1) == *valid_hidden_size, op, "output",
                   "output.shape[1] must equal valid_hidden_size=", *valid_hidden_size,
                   " when valid_hidden_size is provided, got ", output->size(1));
}

void check_clamped_relu2_limit(const char* op, bool clamped, const std::optional<Tensor>& limit,
                               std::optional<Device> device) {
  if (!clamped) {
    FLASHINFER_CHECK(!limit, op, "clamped_relu2_limit",
                     "clamped_relu2_limit is supported only with ActivationType.ClampedRelu2");
    return;
  }
  FLASHINFER_CHECK(limit.has_value(), op, "clamped_relu2_limit",
                   "ActivationType.ClampedRelu2 requires a one-element clamped_relu2_limit tensor");
  FLASHINFER_CHECK(limit->dim() == 1 && limit->numel() == 1, op, "clamped_relu2_limit",
                   "ActivationType.ClampedRelu2 requires model-wide clamped_relu2_limit with shape "
                   "(1,), got ",
                   shape_to_string(limit->shape()));
  FLASHINFER_CHECK(limit->dtype() == DType::kFloat32, op, "clamped_relu2_limit",
                   "Invalid dtype of ClampedRelu2 clamped_relu2_limit: expected torch.float32, "
                   "got ",
                   dtype_torch_name(limit->dtype()));
  FLASHINFER_CHECK(!device || limit->device() == *device, op, "clamped_relu2_limit",
                   "Invalid device of ClampedRelu2 clamped_relu2_limit: expected ",
                   device ? device->str() : std::string(), ", got ", limit->device().str());
}

void check_moe_sf_layout(const char* op, const Value& layout, bool has_scale) {
  // Validation only, as upstream's resolve_moe_act_sf_layout: None means linear (upstream warns).
  if (!has_scale || layout.is_none()) return;
  int64_t code = -1;
  std::string shown;
  if (layout.kind() == Value::Kind::kEnum) {
    const EnumValue& e = layout.as_enum();
    code = e.name == "layout_linear" ? 2 : -1;
    shown = "<" + e.type + "." + e.name + ": " + e.value + ">";
  } else if (layout.kind() == Value::Kind::kInt) {
    code = layout.as_int();
    const char* names[] = {"layout_128x4", "layout_8x4", "layout_linear"};
    shown = code >= 0 && code <= 2
                ? "<SfLayout." + std::string(names[code]) + ": " + std::to_string(code) + ">"
                : std::to_string(code);
  } else {
    shown = layout.repr();
  }
  FLASHINFER_CHECK_CODE(code == 2, ErrorCode::kUnsupported, op, "hidden_states_scale_layout",
                        "hidden_states_scale_layout=", shown,
                        " is not supported by the trtllm-gen MoE path: the routed batched GEMM "
                        "requires the activation scale factors in <SfLayout.layout_linear: 2> "
                        "(\"Tokens need use SF linear layout when being routed\"). Quantize the "
                        "activations with is_sf_swizzled_layout=False (equivalently "
                        "sf_swizzle_layout=SfLayout.layout_linear).");
}

void check_step_gemm1_params(int64_t activation_type, const std::optional<Tensor>& alpha,
                             const std::optional<Tensor>& beta, const char* op) {
  if (activation_type != static_cast<int64_t>(kernels::MoeAct::kSwigluStep)) return;
  FLASHINFER_CHECK(!alpha && !beta, op, alpha ? "gemm1_alpha" : "gemm1_beta",
                   "SwigluStep accepts gemm1_clamp_limit only; gemm1_alpha and gemm1_beta must be "
                   "absent.");
}

const float* per_expert_floats(const std::optional<Tensor>& t, int64_t experts, const Tensor& like,
                               const char* op, const char* arg) {
  if (!t) return nullptr;
  check_defined(*t, op, arg);
  check_dtype_in(*t, {DType::kFloat32}, op, arg);
  check_shape_eq(*t, {experts}, op, arg);
  check_same_device(*t, like, op, arg, "hidden_states");
  FLASHINFER_CHECK(t->stride(0) == 1 || experts <= 1, op, arg, "must be contiguous");
  return t->data<float>();
}

void check_last_stride_one(const Tensor& t, const char* op, const char* arg) {
  FLASHINFER_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, arg,
                   "the last dimension must be contiguous (stride 1), got stride ", t.stride(-1));
}

void check_moe_routing(const MoeRoutingArgs& c, const Tensor& hidden, bool groups_when_routed) {
  const char* op = c.op;
  const int64_t T = hidden.size(0), E = c.num_experts;
  if (c.routed) {
    const Tensor& ids = c.routed->ids;
    check_defined(ids, op, "topk_ids");
    check_dim(ids, {2}, op, "topk_ids");
    check_dtype_in(ids, {DType::kInt32}, op, "topk_ids");
    FLASHINFER_CHECK(ids.size(0) == T && ids.size(1) == c.top_k, op, "topk_ids", "expected [", T,
                     ", ", c.top_k, "], got ", shape_to_string(ids.shape()));
    check_last_stride_one(ids, op, "topk_ids");
    check_same_device(ids, hidden, op, "topk_ids", "hidden_states");
    if (c.routed->weights) {
      const Tensor& w = *c.routed->weights;
      check_dtype_in(w, {DType::kBFloat16, DType::kFloat32}, op, "topk_ids");
      FLASHINFER_CHECK(w.shape() == ids.shape() && w.stride(0) == ids.stride(0), op, "topk_ids",
                       "the weights must have the ids' shape and row stride, got ",
                       shape_to_string(w.shape()));
      check_last_stride_one(w, op, "topk_ids");
      check_same_device(w, hidden, op, "topk_ids", "hidden_states");
    }
  } else {
    const Tensor& logits = *c.logits;
    check_defined(logits, op, "routing_logits");
    check_dim(logits, {2}, op, "routing_logits");
    check_dtype_in(logits, {DType::kFloat32, DType::kBFloat16}, op, "routing_logits");
    check_last_stride_one(logits, op, "routing_logits");
    FLASHINFER_CHECK(logits.shape() == Shape({T, E}), op, "routing_logits", "expected [", T, ", ",
                     E, "] (tokens, num_experts), got ", shape_to_string(logits.shape()));
    check_same_device(logits, hidden, op, "routing_logits", "hidden_states");
  }
  FLASHINFER_CHECK(c.top_k >= 1 && c.top_k <= E, op, "top_k", "must be in [1, num_experts=", E,
                   "], got ", c.top_k);
  FLASHINFER_CHECK(c.method >= 0 && c.method <= 9, op, "routing_method_type",
                   "must be a RoutingMethodType value in [0, 9], got ", c.method);
  const auto rm = static_cast<kernels::MoeRouting>(c.method);
  if (rm == kernels::MoeRouting::kLlama4) {
    FLASHINFER_CHECK(c.top_k == 1, op, "top_k", "Llama4 routing selects one expert, got ", c.top_k);
  }
  if (c.bias && *c.bias) {
    const Tensor& b = **c.bias;
    check_dtype_in(b, {DType::kFloat32, DType::kBFloat16}, op, "routing_bias");
    check_shape_eq(b, {E}, op, "routing_bias");
    check_same_device(b, hidden, op, "routing_bias", "hidden_states");
    FLASHINFER_CHECK(b.stride(0) == 1 || E == 1, op, "routing_bias", "must be contiguous");
  }
  const int64_t G = c.n_group.value_or(0) > 0 ? *c.n_group : 1;
  const int64_t TG = c.topk_group.value_or(0) > 0 ? *c.topk_group : G;
  if (rm == kernels::MoeRouting::kDeepSeekV3 && G > 1 && (!c.routed || groups_when_routed)) {
    FLASHINFER_CHECK(E % G == 0, op, "n_group", "num_experts (", E,
                     ") must be divisible by n_group (", G, ")");
    FLASHINFER_CHECK(TG >= 1 && TG <= G, op, "topk_group", "must be in [1, n_group=", G, "], got ",
                     TG);
    FLASHINFER_CHECK(TG * (E / G) >= c.top_k, op, "topk_group",
                     "the kept groups hold fewer than top_k experts");
  }
  FLASHINFER_CHECK(c.local_num >= 1 && c.offset >= 0 && c.offset + c.local_num <= E, op,
                   "local_num_experts", "local experts [", c.offset, ", ", c.offset + c.local_num,
                   ") must lie in [0, num_experts=", E, ")");
  FLASHINFER_CHECK(!c.scale || std::isfinite(*c.scale), op, "routed_scaling_factor",
                   "must be finite");
  if (c.replay_out && *c.replay_out) {
    const Tensor& r = **c.replay_out;
    check_dtype_in(r, {DType::kInt16}, op, "routing_replay_out");
    check_dim(r, {2}, op, "routing_replay_out");
    FLASHINFER_CHECK(r.size(0) >= T && r.size(1) == c.top_k, op, "routing_replay_out",
                     "shape[0] must be >= ", T, " and shape[1] must be top_k (", c.top_k, "), got ",
                     shape_to_string(r.shape()));
    check_last_stride_one(r, op, "routing_replay_out");
    check_same_device(r, hidden, op, "routing_replay_out", "hidden_states");
    check_writable(r, op, "routing_replay_out");
  }
}

void fill_moe_routing(const MoeRoutingArgs& c, const Tensor& hidden, bool groups_when_routed,
                      kernels::TrtllmMoeParams& b) {
  check_moe_routing(c, hidden, groups_when_routed);
  const int64_t T = hidden.size(0), E = c.num_experts;
  const auto rm = static_cast<kernels::MoeRouting>(c.method);
  const int64_t G = c.n_group.value_or(0) > 0 ? *c.n_group : 1;
  const int64_t TG = c.topk_group.value_or(0) > 0 ? *c.topk_group : G;
  if (c.replay_out && *c.replay_out) {
    b.replay_out = (*c.replay_out)->data<int16_t>();
    b.replay_stride = (*c.replay_out)->stride(0);
  }
  if (c.routed) {
    b.precomputed = true;
    b.routed_stride = c.routed->ids.stride(0);
    if (c.routed->weights) {
      b.ids = c.routed->ids.data<int32_t>();
      b.weights = c.routed->weights->data_ptr();
      b.weights_dtype = c.routed->weights->dtype();
    } else {
      b.packed = c.routed->ids.data<int32_t>();
    }
  } else {
    b.routing.logits = c.logits->data_ptr();
    b.routing.logits_dtype = c.logits->dtype();
    b.routing.logits_stride = c.logits->stride(0);
  }
  const bool has_bias = c.bias && *c.bias;
  b.routing.bias = has_bias ? (*c.bias)->data_ptr() : nullptr;
  b.routing.bias_dtype = has_bias ? (*c.bias)->dtype() : DType::kFloat32;
  b.routing.num_tokens = T;
  b.routing.num_experts = E;
  b.routing.top_k = c.top_k;
  b.routing.n_group = G;
  b.routing.topk_group = TG;
  b.routing.routed_scaling_factor = static_cast<float>(c.scale.value_or(1.0));
  b.routing.norm_topk_prob = c.norm_topk_prob;
  b.routing.method = rm;
}

std::vector<Tensor> bind_unfinalized(kernels::TrtllmMoeParams& b, const MoeTopkIds* routed,
                                     const Tensor& hidden, const char* op, bool cuda_kernel) {
  refuse_if(!cuda_kernel && hidden.device().is_cuda(), op, "do_finalize",
            "do_finalize=False has no CUDA kernel here (CPU reference only)");
  const int64_t T = b.moe.num_tokens, K = b.moe.top_k, H = b.moe.hidden;
  // Upstream sizes gemm2_output by the padded maximum of its tile (not fixed by the arguments);
  // T * top_k rows hold every local pair here, the rows past them zeroed.
  Tensor gemm2 = Tensor::empty({T * K, H}, DType::kBFloat16, hidden.device());
  Tensor idx = Tensor::empty({T * K}, DType::kInt32, hidden.device());
  Tensor weights;
  if (routed && routed->weights) {
    weights = *routed->weights;
  } else {
    weights = Tensor::empty({T, K}, DType::kBFloat16, hidden.device());
    b.expert_weights_out = static_cast<uint16_t*>(weights.data_ptr());
  }
  b.moe.permuted_out = gemm2.data_ptr();
  b.moe.expanded_to_permuted = idx.data<int32_t>();
  return {gemm2, weights, idx};
}

void bind_lora_delta(kernels::CutlassMoeParams& m, const Tensor& delta, const Tensor& hidden,
                     bool gated, bool do_finalize, DType act_dtype, const char* op,
                     std::vector<Tensor>& tensors) {
  const int64_t T = m.num_tokens, K = m.top_k, I = m.inter;
  check_defined(delta, op, "gemm1_lora_delta");
  FLASHINFER_CHECK_CODE(hidden.device().is_cpu(), ErrorCode::kUnsupported, op, "gemm1_lora_delta",
                        "the LoRA delta of GEMM1 runs on the CPU reference only here");
  FLASHINFER_CHECK(gated, op, "activation_type", "gemm1_lora_delta needs a gated activation");
  check_dtype_in(delta, {DType::kBFloat16}, op, "gemm1_lora_delta");
  check_shape_eq(delta, {T, K, 2 * I}, op, "gemm1_lora_delta");
  check_same_device(delta, hidden, op, "gemm1_lora_delta", "hidden_states");
  check_last_stride_one(delta, op, "gemm1_lora_delta");
  m.fc1_delta = static_cast<const uint16_t*>(delta.data_ptr());
  m.delta_stride_t = delta.stride(0);
  m.delta_stride_k = delta.stride(1);
  Tensor act = Tensor::empty({T * K, I}, act_dtype, hidden.device());
  m.act_out = act.data_ptr();
  if (do_finalize) {
    Tensor idx = Tensor::empty({T * K}, DType::kInt32, hidden.device());
    m.expanded_to_permuted = idx.data<int32_t>();
    tensors.push_back(idx);
  }
  tensors.push_back(act);
}

int64_t check_fused_shared(const char* op, std::optional<int64_t> num_fused_shared_experts,
                           int64_t method, std::optional<int64_t> n_group, int64_t offset,
                           int64_t local_num, int64_t num_experts, ErrorCode ep_code) {
  const int64_t S = num_fused_shared_experts.value_or(0);
  FLASHINFER_CHECK(S >= 0, op, "num_fused_shared_experts", "must be >= 0, got ", S);
  if (S == 0) return 0;
  const auto rm = static_cast<kernels::MoeRouting>(method);
  // Only the grouped DeepSeekV3 kernel writes the shared slots; upstream's Routing::Runner
  // raises for every other method, single-group DeepSeekV3 included (docs/MOE.md, "Fused
  // shared experts").
  FLASHINFER_CHECK(rm == kernels::MoeRouting::kDeepSeekV3, op, "routing_method_type",
                   "fused shared experts need DeepSeekV3 routing (upstream raises for this "
                   "method), got ",
                   method);
  FLASHINFER_CHECK(n_group.value_or(0) > 1, op, "n_group",
                   "fused shared experts need grouped DeepSeekV3 routing (n_group > 1; upstream "
                   "raises for the no-groups path), got ",
                   n_group.value_or(0));
  // The DeepSeek routing kernel's limits: one lane per shared slot, at most 512 experts in all.
  FLASHINFER_CHECK(S <= 32, op, "num_fused_shared_experts", "must be <= 32, got ", S);
  FLASHINFER_CHECK(num_experts + S <= 512, op, "num_fused_shared_experts",
                   "num_experts + num_fused_shared_experts must be <= 512, got ", num_experts + S);
  FLASHINFER_CHECK_CODE(offset == 0 && local_num == num_experts, ep_code, op, "local_expert_offset",
                        "fused shared experts need no expert parallelism (local_expert_offset 0, "
                        "local_num_experts == num_experts), got offset ",
                        offset, ", ", local_num, " of ", num_experts);
  return S;
}

int64_t check_moe_fused_shared(const MoeRoutingArgs& c, std::optional<int64_t> nfse,
                               const Tensor& hidden) {
  const int64_t S = check_fused_shared(c.op, nfse, c.method, c.n_group, c.offset, c.local_num,
                                       c.num_experts, ErrorCode::kInvalidArgument);
  if (S == 0) return 0;
  refuse_if(hidden.device().is_cuda(), c.op, "num_fused_shared_experts",
            "fused shared experts have a CPU reference only (no CUDA kernel here)");
  return S;
}

}  // namespace flashinfer::api
