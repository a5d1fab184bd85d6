// trtllm_fp8_block_scale_moe / _routed_ with Fp8QuantizationType.MxFp8 (MXFP8 x MXFP8):
// argument checks, upstream's weight preparation undone on the host, dispatch to the CPU
// reference shared with the FP4 trtllm ops. Semantics and sources: docs/MOE.md.
#include "api/moe_fp8_mx.h"

#include <cstring>
#include <tuple>
#include <vector>

#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/moe_layout.h"
#include "api/moe_traits.h"
#include "kernels/cpu/moe_fp4_cpu.h"
#include "kernels/quantization_params.h"

namespace flashinfer::api {
namespace {

constexpr KernelEntry<kernels::TrtllmFp4MoeParams> kMxFp8MoeKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: routing, exact MXFP8 dequantization, per-expert fp32 GEMMs of the routed "
     "rows only, the activation re-quantized to MXFP8 as upstream's reference does",
     nullptr,
     [](const kernels::TrtllmFp4MoeParams& p, const LaunchContext&) {
       kernels::cpu::trtllm_fp4_moe(p);
     }},
};

// One weight's ue8m0 block scales as plain linear rows [E, m, cols] (a host tensor). Unshuffled
// weights carry linear scales; shuffled ones carry shuffle_matrix_sf_a's output: rows permuted
// like the weight rows (GEMM1 interleaved first when gated), then the 128x4 interleave. Any
// shape with the right element count is accepted (upstream reshapes freely).
Tensor mx_plain_scales(const Tensor& s, int64_t E, int64_t m, int64_t cols, bool shuffled,
                       bool gated_interleave, const Tensor& like, const char* op, const char* arg) {
  check_defined(s, op, arg);
  check_dtype_in(s, {DType::kUInt8}, op, arg);
  check_same_device(s, like, op, arg, "hidden_states");
  FLASHINFER_CHECK(s.is_contiguous(), op, arg, "must be contiguous");
  const auto layout = kernels::SfLayoutCode::k128x4;
  const int64_t per = shuffled ? kernels::sf_buffer_size(layout, m, cols) : m * cols;
  FLASHINFER_CHECK(s.numel() == E * per, op, arg, "expected ", E, " experts of ", m, " x ", cols,
                   " ue8m0 scales (", E * per, " elements", shuffled ? ", 128x4 layout" : "",
                   "), got ", shape_to_string(s.shape()));
  Tensor out = Tensor::empty({E, m, cols}, DType::kUInt8, Device::cpu());
  const auto* in = static_cast<const uint8_t*>(s.data_ptr());
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  if (!shuffled) {
    std::memcpy(o, in, static_cast<size_t>(E * m * cols));
    return out;
  }
  const std::vector<int64_t> src = moe_shuffled_row_source(m, 128, gated_interleave);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < m; ++r) {
      const int64_t row = src[static_cast<size_t>(r)];
      for (int64_t c = 0; c < cols; ++c) {
        o[(e * m + row) * cols + c] = in[e * per + kernels::sf_offset(layout, r, c, cols)];
      }
    }
  }
  return out;
}

}  // namespace

TrtllmMoeResult trtllm_mxfp8_block_moe(const MoeRoutingArgs& rc, const MoeMxFp8Args& a,
                                       int64_t num_shared) {
  const char* op = rc.op;
  const Tensor& hidden = *a.hidden;
  check_defined(hidden, op, "hidden_states");
  FLASHINFER_CHECK_CODE(hidden.device().is_cpu(), ErrorCode::kUnsupported, op, "hidden_states",
                        "Fp8QuantizationType.MxFp8 has a CPU reference only (no CUDA kernel here)");
  check_dim(hidden, {2}, op, "hidden_states");
  check_dtype_in(hidden, {DType::kFloat8E4M3FN}, op, "hidden_states");
  check_last_stride_one(hidden, op, "hidden_states");
  const int64_t T = hidden.size(0), H = hidden.size(1), I = a.inter, El = rc.local_num + num_shared;
  FLASHINFER_CHECK(a.activation_type >= 0 && a.activation_type <= 10, op, "activation_type",
                   "must be an ActivationType value, got ", a.activation_type);
  refuse_if(a.activation_type == static_cast<int64_t>(ActivationType::GegluTanh), op,
            "activation_type", "GegluTanh has no trtllm-gen kernel (upstream's launcher raises)");
  refuse_if(a.activation_type == static_cast<int64_t>(ActivationType::Situ), op, "activation_type",
            "Situ runs in trtllm-gen's SiTuGlu cubin epilogue, whose math is not in readable "
            "source");
  const auto act = static_cast<kernels::MoeAct>(a.activation_type);
  const bool gated = kernels::moe_act_is_gated(act);
  FLASHINFER_CHECK(I >= 1, op, "intermediate_size", "must be positive, got ", I);
  const int64_t N1 = gated ? 2 * I : I;
  // Shuffled rows come in blocks of 32 and the 128x4 scale layout tiles 128 rows by 4 scale
  // columns; upstream's launcher also takes hidden_size and intermediate_size in blocks of 128.
  FLASHINFER_CHECK(H % 128 == 0, op, "hidden_states", "hidden size must be a multiple of 128, got ",
                   H);
  FLASHINFER_CHECK(I % 128 == 0, op, "intermediate_size", "must be a multiple of 128, got ", I);
  const Tensor& hs = *a.hs_scale;
  check_defined(hs, op, "hidden_states_scale");
  check_dtype_in(hs, {DType::kUInt8}, op, "hidden_states_scale");
  check_same_device(hs, hidden, op, "hidden_states_scale", "hidden_states");
  FLASHINFER_CHECK(hs.is_contiguous() && hs.numel() == T * (H / 32), op, "hidden_states_scale",
                   "expected contiguous uint8 [", T, ", ", H / 32,
                   "] (ue8m0, one per 32 values, linear), got ", shape_to_string(hs.shape()));
  const Tensor &w1 = *a.w1, &w2 = *a.w2;
  check_defined(w1, op, "gemm1_weights");
  check_dtype_in(w1, {DType::kFloat8E4M3FN}, op, "gemm1_weights");
  check_same_device(w1, hidden, op, "gemm1_weights", "hidden_states");
  check_defined(w2, op, "gemm2_weights");
  check_dtype_in(w2, {DType::kFloat8E4M3FN}, op, "gemm2_weights");
  check_same_device(w2, hidden, op, "gemm2_weights", "hidden_states");
  // Upstream's MxFp8 preparation (FP8BlockScaleMoe): epilogue_tile_m 128, GEMM1 rows (and
  // their scales) interleaved for a gated activation before the shuffle.
  MoeWeightFormat fmt;
  fmt.shuffled = a.use_shuffled_weight;
  fmt.layout = a.layout;
  fmt.epilogue_tile_m = 128;
  fmt.gated_interleave = gated && a.use_shuffled_weight;
  // Upstream 0.7.4's padded dimensions (docs/MOE.md, "Padded dimensions"): GEMM2 has N2 rows;
  // the valid sub-problem is cut from the plain weights.
  const int64_t N2 = a.valid.hidden_out, Iv = a.valid.inter, W = a.valid.out_cols;
  refuse_if(a.lora_delta->has_value() && Iv < I, op, "valid_intermediate_size",
            "a valid intermediate size below intermediate_size with gemm1_lora_delta is not "
            "implemented");
  const bool interleave = fmt.gated_interleave;
  Tensor w1p = moe_plain_weights(w1, El, N1, H, fmt, op, "gemm1_weights");
  Tensor s1p = mx_plain_scales(*a.w1s, El, N1, H / 32, a.use_shuffled_weight, interleave, hidden,
                               op, "gemm1_weights_scale");
  fmt.gated_interleave = false;
  Tensor w2p = moe_plain_weights(w2, El, N2, I, fmt, op, "gemm2_weights");
  Tensor s2p = mx_plain_scales(*a.w2s, El, N2, I / 32, a.use_shuffled_weight, false, hidden, op,
                               "gemm2_weights_scale");
  // gemm1_bias / gemm2_bias (upstream's launcher's checks and texts).
  Tensor b1p, b2p;
  for (const auto& [b, m, name, text, inter, dst] :
       {std::tuple{a.gemm1_bias, N1, "gemm1_bias",
                   "gemm1_bias must have shape [local_num_experts, GEMM1_M].", interleave, &b1p},
        std::tuple{a.gemm2_bias, H, "gemm2_bias",
                   "gemm2_bias must have shape [local_num_experts, hidden_size].", false, &b2p}}) {
    if (!b->has_value()) continue;
    const Tensor& t = **b;
    check_defined(t, op, name);
    FLASHINFER_CHECK(t.dtype() == DType::kFloat32, op, name, name, " must be float32.");
    FLASHINFER_CHECK(t.dim() == 2 && t.size(0) == El && t.size(1) == m, op, name, text);
    check_same_device(t, hidden, op, name, "hidden_states");
    *dst = moe_plain_bias(t, El, m, a.use_shuffled_weight, 128, inter);
  }
  refuse_if(b2p.defined() && N2 < H, op, "gemm2_bias",
            "gemm2_bias with roundUp(valid_hidden_size, 128) below the hidden size is not "
            "implemented");
  if (N2 < H || Iv < I) {
    const std::vector<int64_t> rows = moe_valid_rows(I, Iv, gated);
    w1p = moe_keep_rows_cols(w1p, rows, N2);
    s1p = moe_keep_rows_cols(s1p, rows, N2 / 32);
    if (b1p.defined()) b1p = moe_keep_rows_cols(b1p, rows, 0);
    w2p = moe_keep_rows_cols(w2p, {}, Iv);
    s2p = moe_keep_rows_cols(s2p, {}, Iv / 32);
  }
  Tensor out, full;
  if (*a.output) {
    const Tensor& o = **a.output;
    check_dtype_in(o, {DType::kBFloat16}, op, "output");
    check_shape_eq(o, {T, W}, op, "output");
    check_same_device(o, hidden, op, "output", "hidden_states");
    check_last_stride_one(o, op, "output");
    check_writable(o, op, "output");
    out = o;
  } else {
    out = Tensor::empty({T, W}, DType::kBFloat16, hidden.device());
  }
  if (W != N2) full = Tensor::empty({T, N2}, DType::kBFloat16, hidden.device());
  const Tensor& written = full.defined() ? full : out;
  kernels::TrtllmFp4MoeParams p;
  // The DeepSeek-FP8 form's routing checks (n_group / topk_group also checked when routed).
  fill_moe_routing(rc, hidden, /*groups_when_routed=*/true, p.base);
  check_moe_workspace_buffer(*a.workspace, a.do_finalize, *a.lora_delta, op, &hidden);
  p.base.num_shared = num_shared;
  p.weights = kernels::Moe4Weights::kMxfp8;
  p.input = kernels::Moe4Input::kMxfp8;
  p.act_quant = kernels::Moe4ActQuant::kMxfp8;
  p.hs_scale = static_cast<const uint8_t*>(hs.data_ptr());
  p.hs_scale_stride = H / 32;
  kernels::CutlassMoeParams& m = p.base.moe;
  m.input = hidden.data_ptr();
  m.in_stride = hidden.stride(0);
  m.out = written.data_ptr();
  m.out_stride = written.stride(0);
  m.dtype = DType::kBFloat16;
  m.out_dtype = DType::kBFloat16;
  m.num_tokens = T;
  m.top_k = rc.top_k + num_shared;
  m.hidden = N2;
  m.inter = Iv;
  m.num_local_experts = El;
  m.expert_offset = rc.offset;
  m.act = act;
  m.w1 = w1p.data_ptr();
  m.w2 = w2p.data_ptr();
  m.b1 = b1p.defined() ? b1p.data_ptr() : nullptr;
  m.b2 = b2p.defined() ? b2p.data_ptr() : nullptr;
  m.swiglu_alpha = per_expert_floats(*a.alpha, El, hidden, op, "gemm1_alpha");
  m.swiglu_beta = per_expert_floats(*a.beta, El, hidden, op, "gemm1_beta");
  m.swiglu_limit = per_expert_floats(*a.limit, El, hidden, op, "gemm1_clamp_limit");
  p.w1_scale = s1p.data_ptr();
  p.w2_scale = s2p.data_ptr();
  TrtllmMoeResult res{{out}, a.do_finalize};
  if (!a.do_finalize) res.tensors = bind_unfinalized(p.base, rc.routed, hidden, op);
  if (*a.lora_delta) {
    // gemm1_lora_delta: the activation returned as GEMM2 reads it, MXFP8 e4m3 codes (their
    // ue8m0 scales are not returned, as upstream's).
    bind_lora_delta(p.base.moe, **a.lora_delta, hidden, gated, a.do_finalize, DType::kUInt8, op,
                    res.tensors);
  }
  launch(kMxFp8MoeKernels, p, hidden.device(), op, "hidden_states", false);
  if (full.defined()) out.copy_(full.slice(1, 0, W));
  return res;
}

}  // namespace flashinfer::api
