// FP4 / MxInt4 trtllm-gen MoE ops (flashinfer.fused_moe.core): declarations, argument checks,
// upstream's weight preparation undone on the host, dispatch to the CPU reference. Semantics
// and sources: docs/MOE.md.
#include "flashinfer/ops/moe_fp4.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/moe_cute_dsl.h"
#include "api/moe_cute_w4a8.h"
#include "api/moe_layout.h"
#include "api/moe_routing_checks.h"
#include "api/moe_traits.h"
#include "api/nvfp4_4over6.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/moe_fp4_cpu.h"
#include "kernels/quantization_params.h"

namespace flashinfer {
namespace {

constexpr const char* kMoeFp4CoreModule = "flashinfer.fused_moe.core";

constexpr api::KernelEntry<kernels::TrtllmFp4MoeParams> kTrtllmFp4MoeKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: routing, exact block dequantization, per-expert fp32 GEMMs of the routed "
     "rows only, the activation quantized as upstream's reference does",
     nullptr,
     [](const kernels::TrtllmFp4MoeParams& p, const api::LaunchContext&) {
       kernels::cpu::trtllm_fp4_moe(p);
     }},
};

// The routing arguments every variant shares.
using RoutingArgs = api::MoeRoutingArgs;

// The tensor the kernels write ([T, H]) and the one returned. Upstream accepts an `output` of the
// hidden size or narrower, and its finalize writes only output.size(1) columns (unpadding a
// padded hidden size: core.py asserts output.shape[1] <= hidden_size); a narrower one here gets
// the first columns of a full-width result.
struct Fp4MoeOutput {
  Tensor full, returned;
  void finish() const {
    if (full.data_ptr() != returned.data_ptr()) {
      Tensor r = returned;  // a handle: copy_ writes the caller's storage
      r.copy_(full.slice(1, 0, returned.size(1)));
    }
  }
};

// The kernel writes H columns; the op returns W of them (W = H, or upstream 0.7.4's
// valid_hidden_size, whose `output` must be exactly that wide).
Fp4MoeOutput make_output(const std::optional<Tensor>& output, int64_t T, int64_t H, int64_t W,
                         const Tensor& like, const char* op, bool allow_narrow) {
  if (!output) {
    const Tensor t = Tensor::empty({T, H}, DType::kBFloat16, like.device());
    if (W == H) return {t, t};
    return {t, Tensor::empty({T, W}, DType::kBFloat16, like.device())};
  }
  const Tensor& o = *output;
  api::check_dtype_in(o, {DType::kBFloat16}, op, "output");
  api::check_dim(o, {2}, op, "output");
  FLASHINFER_CHECK(o.size(0) == T && (allow_narrow ? o.size(1) <= H : o.size(1) == W), op, "output",
                   "expected [", T, allow_narrow ? ", <= " : ", ", allow_narrow ? H : W,
                   allow_narrow ? "] (the hidden size or narrower)" : "]", ", got ",
                   shape_to_string(o.shape()));
  api::check_same_device(o, like, op, "output", "hidden_states");
  api::check_last_stride_one(o, op, "output");
  api::check_writable(o, op, "output");
  if (o.size(1) == H) return {o, o};
  return {Tensor::empty({T, H}, DType::kBFloat16, like.device()), o};
}

// Upstream's prepared block scales of one weight matrix per expert: rows shuffled like the
// weight rows (get_shuffle_matrix_sf_a_row_indices is the weight's row map), then
// block_scale_interleave (128x4, padded). Returns the linear plain-row scales [E, m, cols] as a
// host tensor of the same element size. Any shape with E * padded elements is accepted.
Tensor plain_scales(const Tensor& s, int64_t E, int64_t m, int64_t cols, bool gated_interleave,
                    const char* op, const char* arg) {
  FLASHINFER_CHECK(s.is_contiguous(), op, arg, "must be contiguous");
  const auto layout = kernels::SfLayoutCode::k128x4;
  const int64_t per = kernels::sf_buffer_size(layout, m, cols);
  FLASHINFER_CHECK(s.numel() == E * per, op, arg, "expected ", E, " experts of ", m, " x ", cols,
                   " block scales in the 128x4 layout (", E * per, " elements), got ",
                   shape_to_string(s.shape()));
  const std::vector<int64_t> src = api::moe_shuffled_row_source(m, 128, gated_interleave);
  Tensor out = Tensor::empty({E, m, cols}, s.dtype(), Device::cpu());
  const size_t es = s.element_size();
  const auto* in = static_cast<const uint8_t*>(s.data_ptr());
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < m; ++r) {
      const int64_t row = src[static_cast<size_t>(r)];
      for (int64_t c = 0; c < cols; ++c) {
        std::memcpy(o + static_cast<size_t>((e * m + row) * cols + c) * es,
                    in + static_cast<size_t>(e * per + kernels::sf_offset(layout, r, c, cols)) * es,
                    es);
      }
    }
  }
  return out;
}

// A bias [E, m] (fp32 or bf16) whose rows are stored in the weights' prepared order, as fp32
// in plain order (host tensor), or an undefined tensor when absent.
Tensor plain_bias(const std::optional<Tensor>& b, int64_t E, int64_t m, bool gated_interleave,
                  const Tensor& like, const char* op, const char* arg) {
  if (!b) return Tensor();
  api::check_defined(*b, op, arg);
  api::check_dtype_in(*b, {DType::kFloat32, DType::kBFloat16}, op, arg);
  api::check_shape_eq(*b, {E, m}, op, arg);
  api::check_same_device(*b, like, op, arg, "hidden_states");
  const std::vector<int64_t> src = api::moe_shuffled_row_source(m, 128, gated_interleave);
  const std::vector<double> v = b->to_double_vector();
  std::vector<float> plain(static_cast<size_t>(E * m));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < m; ++r) {
      plain[static_cast<size_t>(e * m + src[static_cast<size_t>(r)])] =
          static_cast<float>(v[static_cast<size_t>(e * m + r)]);
    }
  }
  Tensor out = Tensor::empty({E, m}, DType::kFloat32, Device::cpu());
  std::memcpy(out.data_ptr(), plain.data(), plain.size() * sizeof(float));
  return out;
}

void check_cpu(const Tensor& hidden, const char* op) {
  api::check_upstream_arch(op, "hidden_states", hidden.device());  // upstream's refusal first
  FLASHINFER_CHECK_CODE(hidden.device().is_cpu(), ErrorCode::kUnsupported, op, "hidden_states",
                        "this op has a CPU reference only (no CUDA kernel here)");
}

int64_t check_activation(int64_t activation_type, const char* op) {
  FLASHINFER_CHECK(activation_type >= 0 && activation_type <= 10, op, "activation_type",
                   "must be an ActivationType value, got ", activation_type);
  api::refuse_if(activation_type == static_cast<int64_t>(ActivationType::GegluTanh), op,
                 "activation_type",
                 "GegluTanh has no trtllm-gen kernel (upstream's launcher raises for it)");
  api::refuse_if(
      activation_type == static_cast<int64_t>(ActivationType::Situ), op, "activation_type",
      "Situ runs in trtllm-gen's SiTuGlu cubin epilogue, whose math is not in readable source");
  return activation_type;
}

struct Fp4Args {
  const Tensor* hidden;
  const std::optional<Tensor>* hs_scale;
  const Tensor *w1, *w1s, *w2, *w2s;
  const std::optional<Tensor>*b1, *b2, *alpha, *beta, *limit, *o1, *o1g, *o2;
  int64_t inter, activation_type;
  bool do_finalize;
  const std::optional<Tensor>* per_token_scale;
  const std::optional<Tensor>* output;
  // Upstream 0.7.4's additions (docs/MOE.md, "Padded dimensions").
  std::optional<int64_t> valid_hidden_size, valid_intermediate_size;
  const Value* sf_layout;
  const std::optional<Tensor>* workspace;
  const Value* nvfp4_4over6;
  const Value* routing_metadata = nullptr;  // the routed op's
};

// nvfp4_4over6 of the trtllm FP4 ops: their first check upstream; only the per-token NVFP4
// requantization (per_token_scale, refused here) has a 4over6 recipe.
void check_fp4_moe_4over6(const Fp4Args& a, const char* op) {
  api::check_moe_nvfp4_4over6(
      *a.nvfp4_4over6, a.per_token_scale->has_value() && a.hidden->dtype() == DType::kUInt8, op,
      "nvfp4_4over6 requires per_token_scale with NVFP4 (uint8) hidden_states; no other path has "
      "a 4over6 requantization. Pass None to turn 4over6 off, or omit it to read the "
      "environment.");
}

std::vector<Tensor> fp4_impl(const RoutingArgs& rc, const Fp4Args& a,
                             std::optional<int64_t> num_fused_shared_experts = std::nullopt) {
  const char* op = rc.op;
  const Tensor& hidden = *a.hidden;
  api::check_defined(hidden, op, "hidden_states");
  check_fp4_moe_4over6(a, op);
  check_cpu(hidden, op);
  api::check_dim(hidden, {2}, op, "hidden_states");
  api::refuse_if(a.per_token_scale->has_value(), op, "per_token_scale",
                 "per-token activation scales are not implemented");
  const int64_t S = api::check_moe_fused_shared(rc, num_fused_shared_experts, hidden);
  // routing_metadata: maps the caller populated from the same topk_ids (upstream then skips its
  // routing kernel, same values); the routing is computed here from topk_ids.
  FLASHINFER_CHECK(a.routing_metadata == nullptr || a.routing_metadata->is_none() ||
                       (S == 0 && !a.workspace->has_value()),
                   op, "routing_metadata",
                   "routing_metadata supports neither gemm1_lora_delta, fused shared experts nor "
                   "workspace_buffer");
  // 0.7.4's routed op takes topk_ids [T, top_k + S]; how its precomputed-routing kernel reads
  // the shared columns is not in its readable source (docs/MOE.md, "Fused shared experts").
  api::refuse_if(rc.routed != nullptr && S > 0, op, "num_fused_shared_experts",
                 "fused shared experts with precomputed routing are not implemented");
  // Upstream 0.7.4's padded dimensions, against the hidden size the hidden states carry.
  const int64_t Hx = hidden.size(1) * (hidden.dtype() == DType::kUInt8 ? 2 : 1);
  const api::MoeValidDims vd = api::check_moe_valid_dims(
      op, a.valid_hidden_size, a.valid_intermediate_size, Hx, a.inter, a.do_finalize);
  if (a.do_finalize) api::check_moe_output_width(op, *a.output, a.valid_hidden_size, true);
  const int64_t act = check_activation(a.activation_type, op);
  const bool gated = kernels::moe_act_is_gated(static_cast<kernels::MoeAct>(act));
  // Fused shared experts: their rows of every per-expert tensor follow the routed local
  // experts' (upstream's launcher checks local_num_experts + num_fused_shared_experts).
  const int64_t T = hidden.size(0), I = a.inter, El = rc.local_num + S;
  FLASHINFER_CHECK(I >= 1, op, "intermediate_size", "must be positive, got ", I);
  const int64_t N1 = gated ? 2 * I : I;
  const Tensor &w1 = *a.w1, &w2 = *a.w2;
  api::check_defined(w1, op, "gemm1_weights");
  api::check_dtype_in(w1, {DType::kUInt8}, op, "gemm1_weights");
  api::check_dim(w1, {3}, op, "gemm1_weights");
  api::check_same_device(w1, hidden, op, "gemm1_weights", "hidden_states");
  const int64_t H = 2 * w1.size(2);
  FLASHINFER_CHECK(w1.size(0) == El && w1.size(1) == N1, op, "gemm1_weights", "expected [", El,
                   ", ", N1, ", hidden_size / 2] (local experts, ", gated ? "2 * " : "",
                   "intermediate_size, packed fp4), got ", shape_to_string(w1.shape()));
  api::check_defined(w2, op, "gemm2_weights");
  api::check_dtype_in(w2, {DType::kUInt8}, op, "gemm2_weights");
  api::check_same_device(w2, hidden, op, "gemm2_weights", "hidden_states");
  // GEMM2's rows: roundUp(valid_hidden_size, 128) with a valid hidden size, else H.
  const int64_t N2 = vd.hidden_given ? vd.hidden_out : H;
  FLASHINFER_CHECK(I % 2 == 0 && w2.shape() == Shape({El, N2, I / 2}), op, "gemm2_weights",
                   "expected [", El, ", ", N2, ", ", I / 2, "] (packed fp4), got ",
                   shape_to_string(w2.shape()));
  // NVFP4 or MXFP4 from the scales' last dimension (hidden_size / 16 or / 32), as upstream's
  // docstring gives the shape.
  const Tensor &w1s = *a.w1s, &w2s = *a.w2s;
  api::check_defined(w1s, op, "gemm1_weights_scale");
  api::check_dtype_in(w1s, {DType::kFloat8E4M3FN, DType::kUInt8}, op, "gemm1_weights_scale");
  api::check_dim(w1s, {3}, op, "gemm1_weights_scale");
  api::check_same_device(w1s, hidden, op, "gemm1_weights_scale", "hidden_states");
  const int64_t c1 = w1s.size(2);
  FLASHINFER_CHECK(
      c1 > 0 && (c1 * 16 == H || c1 * 32 == H) && w1s.size(0) == El && w1s.size(1) == N1, op,
      "gemm1_weights_scale", "expected [", El, ", ", N1, ", ", H / 16, " (NVFP4) or ", H / 32,
      " (MXFP4)], got ", shape_to_string(w1s.shape()));
  const bool nv = c1 * 16 == H;
  const int64_t vec = nv ? 16 : 32;
  FLASHINFER_CHECK(N1 % 128 == 0 && H % 128 == 0, op, "intermediate_size",
                   "the prepared block scales need GEMM rows that are multiples of 128 (",
                   gated ? "2 * " : "", "intermediate_size = ", N1, ", hidden_size = ", H, ")");
  FLASHINFER_CHECK((H / vec) % 4 == 0 && I % (4 * vec) == 0, op, "intermediate_size",
                   "the 128x4 scale layout needs hidden_size and intermediate_size multiples of ",
                   4 * vec, ", got ", H, " and ", I);
  api::check_defined(w2s, op, "gemm2_weights_scale");
  api::check_dtype_in(w2s, {DType::kFloat8E4M3FN, DType::kUInt8}, op, "gemm2_weights_scale");
  api::check_same_device(w2s, hidden, op, "gemm2_weights_scale", "hidden_states");
  FLASHINFER_CHECK(w2s.shape() == Shape({El, N2, I / vec}), op, "gemm2_weights_scale", "expected [",
                   El, ", ", N2, ", ", I / vec, "] (", nv ? "NVFP4" : "MXFP4", "), got ",
                   shape_to_string(w2s.shape()));
  // Upstream 0.7.4's launcher: SwigluStep takes no alpha / beta and needs NVFP4 activations and
  // weights (its StepFun epilogue; limits in raw accumulator units, kernels/moe_params.h).
  api::check_step_gemm1_params(act, *a.alpha, *a.beta, op);
  FLASHINFER_CHECK(act != static_cast<int64_t>(kernels::MoeAct::kSwigluStep) ||
                       (nv && hidden.dtype() == DType::kUInt8),
                   op, "activation_type", "FP4 SwigluStep requires NVFP4 activations and weights.");
  kernels::TrtllmFp4MoeParams p;
  p.weights = nv ? kernels::Moe4Weights::kNvfp4 : kernels::Moe4Weights::kMxfp4;
  // The hidden states: NVFP4 with NVFP4 weights; MXFP8 or bf16 with MXFP4 weights (upstream's
  // is_trtllm_moe_supported pairs).
  const std::optional<Tensor>& hs = *a.hs_scale;
  if (hidden.dtype() == DType::kUInt8) {
    FLASHINFER_CHECK_CODE(nv, ErrorCode::kUnsupported, op, "hidden_states",
                          "packed fp4 hidden states run with NVFP4 weights only here (MXFP4 "
                          "activations with MXFP4 weights are not implemented)");
    FLASHINFER_CHECK(hidden.size(1) * 2 == H, op, "hidden_states", "expected [", T, ", ", H / 2,
                     "] (packed NVFP4), got ", shape_to_string(hidden.shape()));
    p.input = kernels::Moe4Input::kNvfp4;
    p.act_quant = kernels::Moe4ActQuant::kNvfp4;
  } else if (hidden.dtype() == DType::kFloat8E4M3FN) {
    FLASHINFER_CHECK(!nv, op, "hidden_states",
                     "MXFP8 hidden states need MXFP4 weights (scales of 32), got NVFP4 weights");
    FLASHINFER_CHECK(hidden.size(1) == H, op, "hidden_states", "expected [", T, ", ", H,
                     "] (MXFP8), got ", shape_to_string(hidden.shape()));
    p.input = kernels::Moe4Input::kMxfp8;
    p.act_quant = kernels::Moe4ActQuant::kMxfp8;
  } else {
    api::check_dtype_in(hidden, {DType::kBFloat16, DType::kUInt8, DType::kFloat8E4M3FN}, op,
                        "hidden_states");
    FLASHINFER_CHECK(!nv, op, "hidden_states",
                     "bf16 hidden states need MXFP4 weights (scales of 32), got NVFP4 weights");
    FLASHINFER_CHECK(hidden.size(1) == H, op, "hidden_states", "expected [", T, ", ", H,
                     "] (bf16), got ", shape_to_string(hidden.shape()));
    FLASHINFER_CHECK(!hs, op, "hidden_states_scale", "must be None for bf16 hidden states");
    p.input = kernels::Moe4Input::kBf16;
    p.act_quant = kernels::Moe4ActQuant::kBf16;
  }
  api::check_last_stride_one(hidden, op, "hidden_states");
  if (p.input != kernels::Moe4Input::kBf16) {
    const int64_t hv = p.input == kernels::Moe4Input::kNvfp4 ? 16 : 32;
    FLASHINFER_CHECK(hs.has_value(), op, "hidden_states_scale",
                     "required for quantized hidden states");
    api::check_dtype_in(*hs, {DType::kFloat8E4M3FN, DType::kUInt8}, op, "hidden_states_scale");
    api::check_same_device(*hs, hidden, op, "hidden_states_scale", "hidden_states");
    FLASHINFER_CHECK(hs->is_contiguous() && hs->numel() == T * (H / hv), op, "hidden_states_scale",
                     "expected contiguous [", T, ", ", H / hv, "] (linear block scales), got ",
                     shape_to_string(hs->shape()));
    p.hs_scale = static_cast<const uint8_t*>(hs->data_ptr());
    p.hs_scale_stride = H / hv;
  }
  // Validation only: the scales must be linear (checked above).
  api::check_moe_sf_layout(op, *a.sf_layout, hs.has_value());
  // Upstream writes `output` only when it finalizes (docs/MOE.md, "do_finalize=False"). With a
  // valid hidden size the kernel computes N2 columns and `output` is the first vh of them.
  const Fp4MoeOutput out = make_output(a.do_finalize ? *a.output : std::nullopt, T, N2, vd.out_cols,
                                       hidden, op, !vd.hidden_given);
  api::fill_moe_routing(rc, hidden, /*groups_when_routed=*/false, p.base);
  api::check_moe_workspace_buffer(*a.workspace, a.do_finalize, std::nullopt, op, &hidden);
  p.base.num_shared = S;
  // Upstream's preparation: GEMM1 rows interleaved (gated) then shuffled, GEMM2 rows shuffled,
  // epilogue_tile_m 128, MajorK; scales and biases follow their rows.
  api::MoeWeightFormat fmt;
  fmt.shuffled = true;
  fmt.layout = WeightLayout::MajorK;
  fmt.epilogue_tile_m = 128;
  fmt.gated_interleave = gated;
  Tensor w1p = api::moe_plain_weights(w1, El, N1, H / 2, fmt, op, "gemm1_weights");
  Tensor s1p = plain_scales(w1s, El, N1, H / vec, gated, op, "gemm1_weights_scale");
  Tensor b1p = plain_bias(*a.b1, El, N1, gated, hidden, op, "gemm1_bias");
  fmt.gated_interleave = false;
  Tensor w2p = api::moe_plain_weights(w2, El, N2, I / 2, fmt, op, "gemm2_weights");
  Tensor s2p = plain_scales(w2s, El, N2, I / vec, false, op, "gemm2_weights_scale");
  // gemm2_bias has GEMM2's rows: roundUp(valid_hidden_size, 128) with a valid hidden size.
  Tensor b2p = plain_bias(*a.b2, El, N2, false, hidden, op, "gemm2_bias");
  // The valid sub-problem (docs/MOE.md, "Padded dimensions"): GEMM1 over the first N2 hidden
  // columns and the kept rows of each half, GEMM2 over the kept intermediate columns.
  const int64_t Iv = vd.inter;
  if (N2 < H || Iv < I) {
    const std::vector<int64_t> rows = api::moe_valid_rows(I, Iv, gated);
    w1p = api::moe_keep_rows_cols(w1p, rows, N2 / 2);
    s1p = api::moe_keep_rows_cols(s1p, rows, N2 / vec);
    if (b1p.defined()) b1p = api::moe_keep_rows_cols(b1p, rows, 0);
    w2p = api::moe_keep_rows_cols(w2p, {}, Iv / 2);
    s2p = api::moe_keep_rows_cols(s2p, {}, Iv / vec);
  }
  kernels::CutlassMoeParams& m = p.base.moe;
  m.input = hidden.data_ptr();
  m.in_stride = hidden.stride(0);
  m.out = out.full.data_ptr();
  m.out_stride = out.full.stride(0);
  m.num_tokens = T;
  m.top_k = rc.top_k + S;
  m.hidden = N2;
  m.inter = Iv;
  m.num_local_experts = El;
  m.expert_offset = rc.offset;
  m.act = static_cast<kernels::MoeAct>(act);
  m.w1 = w1p.data_ptr();
  m.w2 = w2p.data_ptr();
  m.b1 = b1p.defined() ? b1p.data_ptr() : nullptr;
  m.b2 = b2p.defined() ? b2p.data_ptr() : nullptr;
  m.swiglu_alpha = api::per_expert_floats(*a.alpha, El, hidden, op, "gemm1_alpha");
  m.swiglu_beta = api::per_expert_floats(*a.beta, El, hidden, op, "gemm1_beta");
  m.swiglu_limit = api::per_expert_floats(*a.limit, El, hidden, op, "gemm1_clamp_limit");
  p.w1_scale = s1p.data_ptr();
  p.w2_scale = s2p.data_ptr();
  p.out1_scale = api::per_expert_floats(*a.o1, El, hidden, op, "output1_scale_scalar");
  p.out1_gate_scale = api::per_expert_floats(*a.o1g, El, hidden, op, "output1_scale_gate_scalar");
  p.out2_scale = api::per_expert_floats(*a.o2, El, hidden, op, "output2_scale_scalar");
  std::vector<Tensor> res{out.returned};
  if (!a.do_finalize) res = api::bind_unfinalized(p.base, rc.routed, hidden, op);
  api::launch(kTrtllmFp4MoeKernels, p, hidden.device(), op, "hidden_states", false);
  out.finish();
  return res;
}

struct MxInt4Args {
  const Tensor* hidden;
  const Tensor *w1, *w1s, *w2, *w2s;
  const std::optional<Tensor>*alpha, *beta, *limit;
  int64_t inter;
  bool do_finalize;
  const std::optional<Tensor>* output;
  const std::optional<Tensor>* lora_delta;  // the routed op's gemm1_lora_delta (else None)
  std::optional<int64_t> valid_hidden_size, valid_intermediate_size;
  const std::optional<Tensor>* workspace;
};

const std::optional<Tensor> kNoLoraDelta;

// MajorK [E, mn, k/2] or BlockMajorK [E, k/2/bk, mn, bk] packed int4, shuffled as upstream
// prepares MxInt4 weights (epilogue_tile_m 128).
Tensor mxint4_plain_weights(const Tensor& w, int64_t E, int64_t mn, int64_t k, bool interleave,
                            const char* op, const char* arg) {
  api::check_dtype_in(w, {DType::kUInt8}, op, arg);
  api::check_dim(w, {3, 4}, op, arg);
  api::MoeWeightFormat fmt;
  fmt.shuffled = true;
  fmt.layout = w.dim() == 4 ? WeightLayout::BlockMajorK : WeightLayout::MajorK;
  fmt.epilogue_tile_m = 128;
  fmt.gated_interleave = interleave;
  return api::moe_plain_weights(w, E, mn, k / 2, fmt, op, arg);
}

std::vector<Tensor> mxint4_impl(const RoutingArgs& rc, const MxInt4Args& a) {
  const char* op = rc.op;
  const Tensor& hidden = *a.hidden;
  api::check_defined(hidden, op, "hidden_states");
  check_cpu(hidden, op);
  api::check_dim(hidden, {2}, op, "hidden_states");
  api::check_dtype_in(hidden, {DType::kBFloat16}, op, "hidden_states");
  api::check_last_stride_one(hidden, op, "hidden_states");
  const int64_t T = hidden.size(0), H = hidden.size(1), I = a.inter, El = rc.local_num;
  const api::MoeValidDims vd = api::check_moe_valid_dims(
      op, a.valid_hidden_size, a.valid_intermediate_size, H, I, a.do_finalize);
  if (a.do_finalize) api::check_moe_output_width(op, *a.output, a.valid_hidden_size, true);
  const int64_t N2 = vd.hidden_out, Iv = vd.inter;
  FLASHINFER_CHECK(I >= 1 && I % 32 == 0, op, "intermediate_size",
                   "must be a positive multiple of 32 (the scale block), got ", I);
  FLASHINFER_CHECK(H % 32 == 0, op, "hidden_states", "hidden size must be a multiple of 32, got ",
                   H);
  // The returned activation of a LoRA delta is intermediate_size wide: not with a smaller one.
  api::refuse_if(a.lora_delta->has_value() && Iv < I, op, "valid_intermediate_size",
                 "a valid intermediate size below intermediate_size with gemm1_lora_delta is not "
                 "implemented");
  const Tensor &w1 = *a.w1, &w2 = *a.w2, &w1s = *a.w1s, &w2s = *a.w2s;
  for (const auto& [t, name] : {std::pair{&w1, "gemm1_weights"},
                                {&w2, "gemm2_weights"},
                                {&w1s, "gemm1_weights_scale"},
                                {&w2s, "gemm2_weights_scale"}}) {
    api::check_defined(*t, op, name);
    api::check_same_device(*t, hidden, op, name, "hidden_states");
  }
  api::check_dtype_in(w1s, {DType::kBFloat16}, op, "gemm1_weights_scale");
  api::check_dtype_in(w2s, {DType::kBFloat16}, op, "gemm2_weights_scale");
  kernels::TrtllmFp4MoeParams p;
  p.weights = kernels::Moe4Weights::kMxint4;
  p.input = kernels::Moe4Input::kBf16;
  p.act_quant = kernels::Moe4ActQuant::kBf16;
  // Upstream writes `output` only when it finalizes (docs/MOE.md, "do_finalize=False"); its
  // MxInt4 launcher writes the full hidden width (no narrower output, unlike FP4's).
  const Fp4MoeOutput out =
      make_output(a.do_finalize ? *a.output : std::nullopt, T, N2, vd.out_cols, hidden, op, false);
  api::fill_moe_routing(rc, hidden, /*groups_when_routed=*/false, p.base);
  api::check_moe_workspace_buffer(*a.workspace, a.do_finalize, *a.lora_delta, op, &hidden);
  // GEMM2's rows: roundUp(valid_hidden_size, 128) with a valid hidden size (docs/MOE.md,
  // "Padded dimensions"), and the valid sub-problem cut from the plain weights.
  Tensor w1p = mxint4_plain_weights(w1, El, 2 * I, H, true, op, "gemm1_weights");
  Tensor w2p = mxint4_plain_weights(w2, El, N2, I, false, op, "gemm2_weights");
  Tensor s1p = plain_scales(w1s, El, 2 * I, H / 32, true, op, "gemm1_weights_scale");
  Tensor s2p = plain_scales(w2s, El, N2, I / 32, false, op, "gemm2_weights_scale");
  if (N2 < H || Iv < I) {
    const std::vector<int64_t> rows = api::moe_valid_rows(I, Iv, true);
    w1p = api::moe_keep_rows_cols(w1p, rows, N2 / 2);
    s1p = api::moe_keep_rows_cols(s1p, rows, N2 / 32);
    w2p = api::moe_keep_rows_cols(w2p, {}, Iv / 2);
    s2p = api::moe_keep_rows_cols(s2p, {}, Iv / 32);
  }
  kernels::CutlassMoeParams& m = p.base.moe;
  m.input = hidden.data_ptr();
  m.in_stride = hidden.stride(0);
  m.out = out.full.data_ptr();
  m.out_stride = out.full.stride(0);
  m.num_tokens = T;
  m.top_k = rc.top_k;
  m.hidden = N2;
  m.inter = Iv;
  m.num_local_experts = El;
  m.expert_offset = rc.offset;
  m.act = kernels::MoeAct::kSwiglu;
  m.w1 = w1p.data_ptr();
  m.w2 = w2p.data_ptr();
  m.swiglu_alpha = api::per_expert_floats(*a.alpha, El, hidden, op, "gemm1_alpha");
  m.swiglu_beta = api::per_expert_floats(*a.beta, El, hidden, op, "gemm1_beta");
  m.swiglu_limit = api::per_expert_floats(*a.limit, El, hidden, op, "gemm1_clamp_limit");
  p.w1_scale = s1p.data_ptr();
  p.w2_scale = s2p.data_ptr();
  std::vector<Tensor> res{out.returned};
  if (!a.do_finalize) res = api::bind_unfinalized(p.base, rc.routed, hidden, op);
  if (*a.lora_delta) {
    // gemm1_lora_delta (vLLM's LoRA MoE): added to GEMM1's output before the Swiglu; the list
    // grows by the map (finalized) and the bf16 activation, permuted.
    api::bind_lora_delta(m, **a.lora_delta, hidden, true, a.do_finalize, DType::kBFloat16, op, res);
  }
  api::launch(kTrtllmFp4MoeKernels, p, hidden.device(), op, "hidden_states", false);
  out.finish();
  return res;
}

}  // namespace

std::vector<Tensor> trtllm_fp4_block_scale_moe(
    const Tensor& routing_logits, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    std::optional<Tensor> hidden_states_scale, const Tensor& gemm1_weights,
    const Tensor& gemm1_weights_scale, std::optional<Tensor> gemm1_bias,
    std::optional<Tensor> gemm1_alpha, std::optional<Tensor> gemm1_beta,
    std::optional<Tensor> gemm1_clamp_limit, const Tensor& gemm2_weights,
    const Tensor& gemm2_weights_scale, std::optional<Tensor> gemm2_bias,
    std::optional<Tensor> output1_scale_scalar, std::optional<Tensor> output1_scale_gate_scalar,
    std::optional<Tensor> output2_scale_scalar, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type, bool do_finalize,
    std::optional<bool> enable_pdl, int64_t activation_type, std::optional<Tensor> per_token_scale,
    std::optional<Tensor> output, int64_t tune_max_num_tokens, bool norm_topk_prob,
    std::optional<Tensor> routing_replay_out, std::optional<int64_t> num_fused_shared_experts,
    std::optional<int64_t> valid_hidden_size, std::optional<int64_t> valid_intermediate_size,
    const Value& hidden_states_scale_layout, std::optional<Tensor> workspace_buffer,
    const Value& nvfp4_4over6) {
  return call_op<&trtllm_fp4_block_scale_moe>(
      [&] {
        const char* op = "trtllm_fp4_block_scale_moe";
        const RoutingArgs rc{op,
                             nullptr,
                             &routing_logits,
                             &routing_bias,
                             num_experts,
                             top_k,
                             n_group,
                             topk_group,
                             local_expert_offset,
                             local_num_experts,
                             routed_scaling_factor,
                             routing_method_type,
                             norm_topk_prob,
                             &routing_replay_out};
        const Fp4Args a{&hidden_states,
                        &hidden_states_scale,
                        &gemm1_weights,
                        &gemm1_weights_scale,
                        &gemm2_weights,
                        &gemm2_weights_scale,
                        &gemm1_bias,
                        &gemm2_bias,
                        &gemm1_alpha,
                        &gemm1_beta,
                        &gemm1_clamp_limit,
                        &output1_scale_scalar,
                        &output1_scale_gate_scalar,
                        &output2_scale_scalar,
                        intermediate_size,
                        activation_type,
                        do_finalize,
                        &per_token_scale,
                        &output,
                        valid_hidden_size,
                        valid_intermediate_size,
                        &hidden_states_scale_layout,
                        &workspace_buffer,
                        &nvfp4_4over6};
        return fp4_impl(rc, a, num_fused_shared_experts);
      },
      routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
      gemm1_weights_scale, gemm1_bias, gemm1_alpha, gemm1_beta, gemm1_clamp_limit, gemm2_weights,
      gemm2_weights_scale, gemm2_bias, output1_scale_scalar, output1_scale_gate_scalar,
      output2_scale_scalar, num_experts, top_k, n_group, topk_group, intermediate_size,
      local_expert_offset, local_num_experts, routed_scaling_factor, routing_method_type,
      do_finalize, enable_pdl, activation_type, per_token_scale, output, tune_max_num_tokens,
      norm_topk_prob, routing_replay_out, num_fused_shared_experts, valid_hidden_size,
      valid_intermediate_size, hidden_states_scale_layout, workspace_buffer, nvfp4_4over6);
}

std::vector<Tensor> trtllm_fp4_block_scale_routed_moe(
    const MoeTopkIds& topk_ids, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    std::optional<Tensor> hidden_states_scale, const Tensor& gemm1_weights,
    const Tensor& gemm1_weights_scale, std::optional<Tensor> gemm1_bias,
    std::optional<Tensor> gemm1_alpha, std::optional<Tensor> gemm1_beta,
    std::optional<Tensor> gemm1_clamp_limit, const Tensor& gemm2_weights,
    const Tensor& gemm2_weights_scale, std::optional<Tensor> gemm2_bias,
    std::optional<Tensor> output1_scale_scalar, std::optional<Tensor> output1_scale_gate_scalar,
    std::optional<Tensor> output2_scale_scalar, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type, bool do_finalize,
    std::optional<bool> enable_pdl, int64_t activation_type, std::optional<Tensor> per_token_scale,
    std::optional<Tensor> output, int64_t tune_max_num_tokens,
    std::optional<Tensor> gemm1_lora_delta, std::optional<int64_t> valid_hidden_size,
    std::optional<int64_t> valid_intermediate_size, std::optional<int64_t> num_fused_shared_experts,
    const Value& hidden_states_scale_layout, std::optional<Tensor> workspace_buffer,
    const Value& nvfp4_4over6, const Value& routing_metadata) {
  return call_op<&trtllm_fp4_block_scale_routed_moe>(
      [&] {
        const char* op = "trtllm_fp4_block_scale_routed_moe";
        api::refuse_if(gemm1_lora_delta.has_value(), op, "gemm1_lora_delta",
                       "the LoRA delta of GEMM1 is not implemented");
        const RoutingArgs rc{op,
                             &topk_ids,
                             nullptr,
                             &routing_bias,
                             num_experts,
                             top_k,
                             n_group,
                             topk_group,
                             local_expert_offset,
                             local_num_experts,
                             routed_scaling_factor,
                             routing_method_type,
                             true,
                             nullptr};
        const Fp4Args a{&hidden_states,
                        &hidden_states_scale,
                        &gemm1_weights,
                        &gemm1_weights_scale,
                        &gemm2_weights,
                        &gemm2_weights_scale,
                        &gemm1_bias,
                        &gemm2_bias,
                        &gemm1_alpha,
                        &gemm1_beta,
                        &gemm1_clamp_limit,
                        &output1_scale_scalar,
                        &output1_scale_gate_scalar,
                        &output2_scale_scalar,
                        intermediate_size,
                        activation_type,
                        do_finalize,
                        &per_token_scale,
                        &output,
                        valid_hidden_size,
                        valid_intermediate_size,
                        &hidden_states_scale_layout,
                        &workspace_buffer,
                        &nvfp4_4over6,
                        &routing_metadata};
        return fp4_impl(rc, a, num_fused_shared_experts);
      },
      topk_ids, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
      gemm1_weights_scale, gemm1_bias, gemm1_alpha, gemm1_beta, gemm1_clamp_limit, gemm2_weights,
      gemm2_weights_scale, gemm2_bias, output1_scale_scalar, output1_scale_gate_scalar,
      output2_scale_scalar, num_experts, top_k, n_group, topk_group, intermediate_size,
      local_expert_offset, local_num_experts, routed_scaling_factor, routing_method_type,
      do_finalize, enable_pdl, activation_type, per_token_scale, output, tune_max_num_tokens,
      gemm1_lora_delta, valid_hidden_size, valid_intermediate_size, num_fused_shared_experts,
      hidden_states_scale_layout, workspace_buffer, nvfp4_4over6, routing_metadata);
}

std::vector<Tensor> trtllm_mxint4_block_scale_moe(
    const Tensor& routing_logits, std::optional<Tensor> routing_bias, const Tensor& hidden_states,
    const Tensor& gemm1_weights, const Tensor& gemm1_weights_scale,
    std::optional<Tensor> gemm1_alpha, std::optional<Tensor> gemm1_beta,
    std::optional<Tensor> gemm1_clamp_limit, const Tensor& gemm2_weights,
    const Tensor& gemm2_weights_scale, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> n_group, std::optional<int64_t> topk_group, int64_t intermediate_size,
    int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type, bool do_finalize,
    std::optional<bool> enable_pdl, std::optional<Tensor> output, int64_t tune_max_num_tokens,
    bool norm_topk_prob, std::optional<Tensor> routing_replay_out,
    std::optional<int64_t> valid_hidden_size, std::optional<int64_t> valid_intermediate_size,
    std::optional<Tensor> workspace_buffer) {
  return call_op<&trtllm_mxint4_block_scale_moe>(
      [&] {
        const RoutingArgs rc{"trtllm_mxint4_block_scale_moe",
                             nullptr,
                             &routing_logits,
                             &routing_bias,
                             num_experts,
                             top_k,
                             n_group,
                             topk_group,
                             local_expert_offset,
                             local_num_experts,
                             routed_scaling_factor,
                             routing_method_type,
                             norm_topk_prob,
                             &routing_replay_out};
        const MxInt4Args a{&hidden_states,
                           &gemm1_weights,
                           &gemm1_weights_scale,
                           &gemm2_weights,
                           &gemm2_weights_scale,
                           &gemm1_alpha,
                           &gemm1_beta,
                           &gemm1_clamp_limit,
                           intermediate_size,
                           do_finalize,
                           &output,
                           &kNoLoraDelta,
                           valid_hidden_size,
                           valid_intermediate_size,
                           &workspace_buffer};
        return mxint4_impl(rc, a);
      },
      routing_logits, routing_bias, hidden_states, gemm1_weights, gemm1_weights_scale, gemm1_alpha,
      gemm1_beta, gemm1_clamp_limit, gemm2_weights, gemm2_weights_scale, num_experts, top_k,
      n_group, topk_group, intermediate_size, local_expert_offset, local_num_experts,
      routed_scaling_factor, routing_method_type, do_finalize, enable_pdl, output,
      tune_max_num_tokens, norm_topk_prob, routing_replay_out, valid_hidden_size,
      valid_intermediate_size, workspace_buffer);
}

std::vector<Tensor> trtllm_mxint4_block_scale_routed_moe(
    const MoeTopkIds& topk_ids, const Tensor& hidden_states, const Tensor& gemm1_weights,
    const Tensor& gemm1_weights_scale, std::optional<Tensor> gemm1_alpha,
    std::optional<Tensor> gemm1_beta, std::optional<Tensor> gemm1_clamp_limit,
    const Tensor& gemm2_weights, const Tensor& gemm2_weights_scale, int64_t num_experts,
    int64_t top_k, std::optional<int64_t> n_group, std::optional<int64_t> topk_group,
    int64_t intermediate_size, int64_t local_expert_offset, int64_t local_num_experts,
    std::optional<double> routed_scaling_factor, int64_t routing_method_type, bool do_finalize,
    std::optional<bool> enable_pdl, std::optional<Tensor> gemm1_lora_delta,
    std::optional<Tensor> output, int64_t tune_max_num_tokens,
    std::optional<int64_t> valid_hidden_size, std::optional<int64_t> valid_intermediate_size,
    std::optional<Tensor> workspace_buffer) {
  return call_op<&trtllm_mxint4_block_scale_routed_moe>(
      [&] {
        const char* op = "trtllm_mxint4_block_scale_routed_moe";
        const RoutingArgs rc{op,
                             &topk_ids,
                             nullptr,
                             nullptr,
                             num_experts,
                             top_k,
                             n_group,
                             topk_group,
                             local_expert_offset,
                             local_num_experts,
                             routed_scaling_factor,
                             routing_method_type,
                             true,
                             nullptr};
        const MxInt4Args a{&hidden_states,
                           &gemm1_weights,
                           &gemm1_weights_scale,
                           &gemm2_weights,
                           &gemm2_weights_scale,
                           &gemm1_alpha,
                           &gemm1_beta,
                           &gemm1_clamp_limit,
                           intermediate_size,
                           do_finalize,
                           &output,
                           &gemm1_lora_delta,
                           valid_hidden_size,
                           valid_intermediate_size,
                           &workspace_buffer};
        return mxint4_impl(rc, a);
      },
      topk_ids, hidden_states, gemm1_weights, gemm1_weights_scale, gemm1_alpha, gemm1_beta,
      gemm1_clamp_limit, gemm2_weights, gemm2_weights_scale, num_experts, top_k, n_group,
      topk_group, intermediate_size, local_expert_offset, local_num_experts, routed_scaling_factor,
      routing_method_type, do_finalize, enable_pdl, gemm1_lora_delta, output, tune_max_num_tokens,
      valid_hidden_size, valid_intermediate_size, workspace_buffer);
}

namespace moe_cute {

// Upstream's CuTe-DSL preparation interleaves the gated GEMM1 rows in groups of 64
// (interleave_linear_and_gate(w1, 64)): stored row s holds plain row
// ((s % 128) / 64) * I + (s / 128) * 64 + s % 64 (linear half first, then gate).
void check_cute_pairs(const char* op, const Tensor& x, const Tensor& ids, const Tensor& scales,
                      int64_t T, int64_t K, std::initializer_list<DType> scale_dtypes) {
  api::check_defined(ids, op, "token_selected_experts");
  api::check_dtype_in(ids, {DType::kInt32}, op, "token_selected_experts");
  api::check_shape_eq(ids, {T, K}, op, "token_selected_experts");
  api::check_same_device(ids, x, op, "token_selected_experts", "x");
  api::check_last_stride_one(ids, op, "token_selected_experts");
  api::check_defined(scales, op, "token_final_scales");
  api::check_dtype_in(scales, scale_dtypes, op, "token_final_scales");
  api::check_shape_eq(scales, {T, K}, op, "token_final_scales");
  api::check_same_device(scales, x, op, "token_final_scales", "x");
  FLASHINFER_CHECK(scales.stride(0) == ids.stride(0) && (K <= 1 || scales.stride(1) == 1), op,
                   "token_final_scales", "must have the row stride of token_selected_experts");
}

std::vector<int64_t> cute_gated_row_source(int64_t rows) {
  const int64_t I = rows / 2;
  std::vector<int64_t> src(static_cast<size_t>(rows));
  for (int64_t s = 0; s < rows; ++s) {
    src[static_cast<size_t>(s)] = ((s % 128) / 64) * I + (s / 128) * 64 + s % 64;
  }
  return src;
}

std::vector<int64_t> cute_row_source(int64_t rows, bool interleaved) {
  if (interleaved) return cute_gated_row_source(rows);
  std::vector<int64_t> src(static_cast<size_t>(rows));
  std::iota(src.begin(), src.end(), int64_t{0});
  return src;
}

// Rows of [E, m, row_bytes] bytes moved to their plain positions (src[stored] = plain).
Tensor plain_rows(const Tensor& w, int64_t E, int64_t m, int64_t row_bytes,
                  const std::vector<int64_t>& src) {
  Tensor out = Tensor::empty({E, m, row_bytes}, w.dtype(), Device::cpu());
  const auto* in = static_cast<const uint8_t*>(w.data_ptr());
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < m; ++r) {
      std::memcpy(o + (e * m + src[static_cast<size_t>(r)]) * row_bytes,
                  in + (e * m + r) * row_bytes, static_cast<size_t>(row_bytes));
    }
  }
  return out;
}

// The e4m3 scale codes of E matrices [m, cols] as upstream's CuTe-DSL tests pass them: the
// 128x4-swizzled bytes of fp4_quantize per expert, either contiguous (any shape with the padded
// element count) or through convert_sf_to_mma_layout's 6-D view (32, 4, m_tiles, 4, k_tiles, E).
// Returns linear codes [E, m, cols] with stored row r moved to src[r].
Tensor cute_plain_scales(const Tensor& s, int64_t E, int64_t m, int64_t cols,
                         const std::vector<int64_t>& src, const char* op, const char* arg) {
  api::check_defined(s, op, arg);
  api::check_dtype_in(s, {DType::kUInt8, DType::kFloat8E4M3FN}, op, arg);
  const auto layout = kernels::SfLayoutCode::k128x4;
  const int64_t per = kernels::sf_buffer_size(layout, m, cols);
  const int64_t mt = (m + 127) / 128, kt = (cols + 3) / 4;
  const bool six = s.dim() == 6;
  FLASHINFER_CHECK(
      six ? s.shape() == Shape({32, 4, mt, 4, kt, E}) : (s.is_contiguous() && s.numel() == E * per),
      op, arg, "expected the 128x4-swizzled scales of ", E, " experts of ", m, " x ", cols, " (",
      E * per, " contiguous elements, or the 6-D view [32, 4, ", mt, ", 4, ", kt, ", ", E,
      "]), got ", shape_to_string(s.shape()));
  Tensor out = Tensor::empty({E, m, cols}, DType::kUInt8, Device::cpu());
  const auto* in = static_cast<const uint8_t*>(s.data_ptr());
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        int64_t at;
        if (six) {
          at = (r % 32) * s.stride(0) + ((r % 128) / 32) * s.stride(1) + (r / 128) * s.stride(2) +
               (c % 4) * s.stride(3) + (c / 4) * s.stride(4) + e * s.stride(5);
        } else {
          at = e * per + kernels::sf_offset(layout, r, c, cols);
        }
        o[(e * m + src[static_cast<size_t>(r)]) * cols + c] = in[at];
      }
    }
  }
  return out;
}

std::pair<Tensor, Tensor> cute_plain_weight_scales(const Tensor& w1_sf, const Tensor& w2_sf,
                                                   int64_t E, int64_t N1, int64_t H, int64_t I,
                                                   int64_t block,
                                                   const std::vector<int64_t>& w1_rows,
                                                   const char* op) {
  return {cute_plain_scales(w1_sf, E, N1, H / block, w1_rows, op, "w1_weight_sf"),
          cute_plain_scales(w2_sf, E, H, I / block, cute_row_source(H, false), op, "w2_weight_sf")};
}

Tensor cute_output(const char* op, const char* arg, const std::optional<Tensor>& given, int64_t T,
                   int64_t H, DType dtype, const Tensor& x) {
  if (!given) return Tensor::empty({T, H}, dtype, x.device());
  const Tensor& o = *given;
  api::check_dtype_in(o, {dtype}, op, arg);
  api::check_shape_eq(o, {T, H}, op, arg);
  api::check_same_device(o, x, op, arg, "x");
  api::check_last_stride_one(o, op, arg);
  api::check_writable(o, op, arg);
  return o;
}

void set_moe_problem(kernels::TrtllmFp4MoeParams& p, const Tensor& x, const Tensor& ids,
                     int64_t routed_stride, const Tensor& scales, const Tensor& out,
                     int64_t num_experts, int64_t top_k, int64_t inter, int64_t num_local_experts,
                     int64_t offset, const void* w1, const void* w2) {
  kernels::TrtllmMoeParams& b = p.base;
  b.precomputed = true;
  b.ids = ids.data<int32_t>();
  b.weights = scales.data_ptr();
  b.weights_dtype = scales.dtype();
  b.routed_stride = routed_stride;
  b.routing.num_tokens = out.size(0);
  b.routing.num_experts = num_experts;
  b.routing.top_k = top_k;
  kernels::CutlassMoeParams& m = b.moe;
  m.input = x.data_ptr();
  m.in_stride = x.stride(0);
  m.out = out.data_ptr();
  m.out_stride = out.stride(0);
  m.out_dtype = out.dtype();
  m.num_tokens = out.size(0);
  m.top_k = top_k;
  m.hidden = out.size(1);
  m.inter = inter;
  m.num_local_experts = num_local_experts;
  m.expert_offset = offset;
  m.w1 = w1;
  m.w2 = w2;
}

void set_cute_scales(kernels::TrtllmFp4MoeParams& p, const Tensor& x_sf, int64_t x_sf_cols,
                     const Tensor& w1_sf_plain, const Tensor& w2_sf_plain, const float* w1_alpha,
                     const float* w2_alpha, bool gated) {
  p.round_routing_weights = false;
  p.round_expert_out = false;
  p.hs_scale = static_cast<const uint8_t*>(x_sf.data_ptr());
  p.hs_scale_stride = x_sf_cols;
  p.w1_scale = w1_sf_plain.data_ptr();
  p.w2_scale = w2_sf_plain.data_ptr();
  p.out1_scale = gated ? w1_alpha : nullptr;
  p.out1_gate_scale = w1_alpha;
  p.out2_scale = w2_alpha;
}

Tensor cute_dsl_impl(const char* op, const Tensor& x, const std::optional<Tensor>& x_sf,
                     const Tensor& ids, const Tensor& scales, const Tensor& w1, const Tensor& w1_sf,
                     const Tensor& w1_alpha, const std::optional<Tensor>& fc2_input_scale,
                     const Tensor& w2, const Tensor& w2_sf, const Tensor& w2_alpha,
                     int64_t num_experts, int64_t top_k, std::optional<int64_t> num_local_experts,
                     int64_t offset, DType output_dtype, const std::optional<Tensor>& moe_output,
                     int64_t activation_type, double swiglu_alpha, double swiglu_beta,
                     double swiglu_limit, const std::optional<double>& situ_beta,
                     const std::optional<double>& situ_linear_beta, std::string_view quant_mode,
                     const std::optional<Tensor>& per_token_scale) {
  api::check_defined(x, op, "x");
  check_cpu(x, op);
  FLASHINFER_CHECK_CODE(quant_mode == "w4a4", ErrorCode::kUnsupported, op, "quant_mode",
                        "only \"w4a4\" (NVFP4 activations and weights) is implemented, got \"",
                        quant_mode, "\"");
  // SiTU (situ_beta with Swiglu): gate' = beta * tanh(gate / beta) * sigmoid(gate), times up'
  // = linear_beta * tanh(up / linear_beta) when situ_linear_beta is set, else up (unclamped:
  // MoeAct::kSitu with situ_clamp_up false, not the CUTLASS default of 25).
  check_situ_config(op, activation_type, situ_beta, situ_linear_beta);
  // The GEMM1 epilogue's three (blockscaled_contiguous_gather_grouped_gemm_act_fusion): GegluTanh
  // is (alpha * up) * gelu_tanh(alpha * gate), the SwiGLU parameters unused.
  FLASHINFER_CHECK_CODE(activation_type == 3 || activation_type == 6 || activation_type == 8,
                        ErrorCode::kUnsupported, op, "activation_type",
                        "Swiglu (3), Relu2 (6) and GegluTanh (8) are implemented, got ",
                        activation_type);
  const bool gated = activation_type != 6;
  api::check_dtype_in(x, {DType::kUInt8}, op, "x");
  api::check_dim(x, {2}, op, "x");
  api::check_last_stride_one(x, op, "x");
  const int64_t T = x.size(0), H = 2 * x.size(1), K = top_k, E = num_experts;
  const int64_t El = num_local_experts.value_or(E);
  FLASHINFER_CHECK(H % 64 == 0, op, "x", "hidden_size must be a multiple of 64, got ", H);
  FLASHINFER_CHECK(K >= 1 && K <= E, op, "top_k", "must be in [1, num_experts=", E, "], got ", K);
  FLASHINFER_CHECK(El >= 1 && offset >= 0 && offset + El <= E, op, "num_local_experts",
                   "local experts [", offset, ", ", offset + El,
                   ") must lie in [0, num_experts=", E, ")");
  FLASHINFER_CHECK(x_sf.has_value(), op, "x_sf", "required for NVFP4 x");
  api::check_dtype_in(*x_sf, {DType::kUInt8, DType::kFloat8E4M3FN}, op, "x_sf");
  api::check_same_device(*x_sf, x, op, "x_sf", "x");
  FLASHINFER_CHECK(x_sf->is_contiguous() && x_sf->numel() == T * (H / 16), op, "x_sf",
                   "expected contiguous [", T, ", ", H / 16, "] linear scales, got ",
                   shape_to_string(x_sf->shape()));
  check_cute_pairs(op, x, ids, scales, T, K, {DType::kFloat32, DType::kBFloat16});
  api::check_defined(w1, op, "w1_weight");
  api::check_dtype_in(w1, {DType::kUInt8}, op, "w1_weight");
  api::check_dim(w1, {3}, op, "w1_weight");
  api::check_same_device(w1, x, op, "w1_weight", "x");
  FLASHINFER_CHECK(w1.is_contiguous() && w1.size(0) == El && w1.size(2) == H / 2, op, "w1_weight",
                   "expected contiguous [", El, ", ", gated ? "2 * " : "", "intermediate_size, ",
                   H / 2, "], got ", shape_to_string(w1.shape()));
  const int64_t N1 = w1.size(1), I = gated ? N1 / 2 : N1;
  FLASHINFER_CHECK(I >= 16 && I % (gated ? 64 : 16) == 0 && (!gated || N1 % 2 == 0), op,
                   "w1_weight", "intermediate_size must be a multiple of ", gated ? 64 : 16,
                   " (gated rows interleave in groups of 64), got ", gated ? N1 / 2 : N1);
  api::check_defined(w2, op, "w2_weight");
  api::check_dtype_in(w2, {DType::kUInt8}, op, "w2_weight");
  api::check_same_device(w2, x, op, "w2_weight", "x");
  FLASHINFER_CHECK(w2.is_contiguous() && w2.shape() == Shape({El, H, I / 2}), op, "w2_weight",
                   "expected contiguous [", El, ", ", H, ", ", I / 2, "], got ",
                   shape_to_string(w2.shape()));
  const float* a1 = api::per_expert_floats(w1_alpha, El, x, op, "w1_alpha");
  FLASHINFER_CHECK(a1 != nullptr, op, "w1_alpha", "required");
  const float* a2 = api::per_expert_floats(w2_alpha, El, x, op, "w2_alpha");
  const float* gs = nullptr;
  int64_t gs_count = 0;
  // GEMM1 always writes NVFP4 for w4a4, and its wrapper requires the global scale.
  FLASHINFER_CHECK(fc2_input_scale.has_value(), op, "fc2_input_scale",
                   "is required for quant_mode \"w4a4\" (GEMM1 quantizes its output to NVFP4)");
  {
    const Tensor& f = *fc2_input_scale;
    api::check_dtype_in(f, {DType::kFloat32}, op, "fc2_input_scale");
    api::check_same_device(f, x, op, "fc2_input_scale", "x");
    FLASHINFER_CHECK(f.is_contiguous() && (f.numel() == 1 || f.numel() == El), op,
                     "fc2_input_scale", "expected one value or [", El, "], got ",
                     shape_to_string(f.shape()));
    gs = f.data<float>();
    gs_count = f.numel();
    // The per-token quantizer takes it as one inverse global scale (global_scale_inv.reshape(1)).
    FLASHINFER_CHECK(!per_token_scale || gs_count == 1, op, "fc2_input_scale",
                     "must hold one value with per_token_scale, got ", shape_to_string(f.shape()));
  }
  api::check_dtype_in(Tensor::empty({0}, output_dtype),
                      {DType::kBFloat16, DType::kFloat16, DType::kFloat32}, op, "output_dtype");
  const Tensor out = cute_output(op, "moe_output", moe_output, T, H, output_dtype, x);
  const std::vector<int64_t> src1 = cute_row_source(N1, gated);
  const Tensor w1p = plain_rows(w1, El, N1, H / 2, src1);
  const auto [s1p, s2p] = cute_plain_weight_scales(w1_sf, w2_sf, El, N1, H, I, 16, src1, op);
  std::vector<float> sa(static_cast<size_t>(El), static_cast<float>(swiglu_alpha)),
      sb(static_cast<size_t>(El), static_cast<float>(swiglu_beta)),
      sl(static_cast<size_t>(El), static_cast<float>(swiglu_limit));
  kernels::TrtllmFp4MoeParams p;
  p.weights = kernels::Moe4Weights::kNvfp4;
  p.input = kernels::Moe4Input::kNvfp4;
  // The GEMM1 epilogue quantizes the fp32 activation with the global scale; GEMM2 reads e2m1 * sf
  // (the global scale stays in the values) and applies w2_alpha as given.
  p.act_quant = kernels::Moe4ActQuant::kNvfp4KeepScale;
  if (per_token_scale) {
    // The per-token path: GEMM1's alpha times per_token_scale[token], the activation written in
    // output_dtype (bf16 or fp16 only, _intermediate_c_dtype), then requantized per row by
    // nvfp4_quantize_per_token_cute_dsl with fc2_input_scale; GEMM2 applies each row's scale.
    const Tensor& pt = *per_token_scale;
    api::check_dtype_in(pt, {DType::kFloat32}, op, "per_token_scale");
    api::check_same_device(pt, x, op, "per_token_scale", "x");
    FLASHINFER_CHECK(pt.is_contiguous() && pt.shape() == Shape({T}), op, "per_token_scale",
                     "expected contiguous fp32 [", T, "], got ", shape_to_string(pt.shape()));
    FLASHINFER_CHECK(output_dtype == DType::kBFloat16 || output_dtype == DType::kFloat16, op,
                     "output_dtype",
                     "the per-token FC2 input quantization supports only float16 and bfloat16 "
                     "intermediate dtypes, got ",
                     dtype_torch_name(output_dtype));
    p.act_quant = output_dtype == DType::kFloat16 ? kernels::Moe4ActQuant::kNvfp4PerTokenFp16
                                                  : kernels::Moe4ActQuant::kNvfp4PerTokenBf16;
    p.in_row_scale = pt.data<float>();
  }
  p.act_global_scale = gs;
  p.act_gs_count = gs_count;
  // GEMM1's per-expert alpha scales both halves (and the single projection of Relu2).
  set_cute_scales(p, *x_sf, H / 16, s1p, s2p, a1, a2, gated);
  set_moe_problem(p, x, ids, ids.stride(0), scales, out, E, K, I, El, offset, w1p.data_ptr(),
                  w2.data_ptr());
  kernels::CutlassMoeParams& m = p.base.moe;
  m.act = situ_beta ? kernels::MoeAct::kSitu : static_cast<kernels::MoeAct>(activation_type);
  const float situ_b = static_cast<float>(situ_beta.value_or(0.0)),
              situ_lb = static_cast<float>(situ_linear_beta.value_or(0.0));
  std::vector<float> situ_bv(static_cast<size_t>(El), situ_b),
      situ_lbv(static_cast<size_t>(El), situ_lb);
  if (situ_beta) {
    m.situ_beta = situ_bv.data();
    m.situ_linear_beta = situ_lbv.data();
    m.situ_clamp_up = situ_linear_beta.has_value();
  }
  if (gated) {
    // The reference's SwiGLU with alpha / beta / limit (the SwigluBias formula).
    m.swiglu_alpha = sa.data();
    m.swiglu_beta = sb.data();
    m.swiglu_limit = sl.data();
  }
  api::launch(kTrtllmFp4MoeKernels, p, x.device(), op, "x", false);
  return out;
}

}  // namespace moe_cute

Tensor cute_dsl_fused_moe_nvfp4(
    const Tensor& x, std::optional<Tensor> x_sf, const Tensor& token_selected_experts,
    const Tensor& token_final_scales, const Tensor& w1_weight, const Tensor& w1_weight_sf,
    const Tensor& w1_alpha, std::optional<Tensor> fc2_input_scale, const Tensor& w2_weight,
    const Tensor& w2_weight_sf, const Tensor& w2_alpha, int64_t num_experts, int64_t top_k,
    std::optional<int64_t> num_local_experts, int64_t local_expert_offset, DType output_dtype,
    bool use_fused_finalize, std::optional<Tensor> moe_output, std::optional<Value> aux_stream,
    bool enable_pdl, int64_t activation_type, double swiglu_alpha, double swiglu_beta,
    double swiglu_limit, std::optional<double> situ_beta, std::optional<double> situ_linear_beta,
    std::string_view quant_mode, std::optional<Tensor> per_token_scale,
    std::optional<Value> localized_weights, std::optional<Value> localized_streams,
    std::optional<int64_t> localized_sm_count, std::optional<Value> localized_memset_stream,
    bool localized_allow_nonlocalized, bool autotune_use_cuda_graph, const Value& nvfp4_4over6,
    std::optional<Tensor> clamped_relu2_limit) {
  return call_op<&cute_dsl_fused_moe_nvfp4>(
      [&] {
        const char* op = "cute_dsl_fused_moe_nvfp4";
        // Upstream 0.7.4's additions. autotune_use_cuda_graph only steers its autotuner; the
        // stream / SM-count arguments only serve its Rubin locality-domain path.
        (void)autotune_use_cuda_graph;
        (void)localized_streams;
        (void)localized_sm_count;
        (void)localized_memset_stream;
        (void)localized_allow_nonlocalized;
        const bool has_pts = per_token_scale && per_token_scale->defined();
        if (!is_nvfp4_4over6_unset(nvfp4_4over6) && !nvfp4_4over6.is_none()) {
          FLASHINFER_CHECK(quant_mode == "w4a4" && has_pts, op, "nvfp4_4over6",
                           "nvfp4_4over6 requires quant_mode='w4a4' with per_token_scale; no other "
                           "CuTe-DSL path has a 4over6 requantization. Pass None to turn 4over6 "
                           "off, or omit it to read the environment.");
          api::refuse_nvfp4_4over6(nvfp4_4over6, DType::kBFloat16, op);
        }
        if (localized_weights && !localized_weights->is_none()) {
          FLASHINFER_CHECK_CODE(quant_mode == "w4a4", ErrorCode::kUnsupported, op,
                                "localized_weights",
                                "locality-domain localization is implemented for the W4A4 path "
                                "only, got quant_mode='",
                                quant_mode, "'.");
          FLASHINFER_CHECK_CODE(!has_pts, ErrorCode::kUnsupported, op, "localized_weights",
                                "locality-domain localization does not support per-token "
                                "activation scales");
          FLASHINFER_CHECK_CODE(use_fused_finalize, ErrorCode::kUnsupported, op,
                                "localized_weights",
                                "locality-domain localization requires use_fused_finalize=True");
          FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "localized_weights",
                          "locality-domain localization is Rubin (SM107) only; pass "
                          "gemm1_mma_tiler / gemm1_mma_inst_shape.");
        }
        moe_cute::check_clamped_relu2(op, activation_type, clamped_relu2_limit, x.device(),
                                      quant_mode);
        if (quant_mode == "w4a8") {  // MXFP8 x, MXFP4 weights: src/api/moe_cute_w4a8.cpp
          return moe_cute::cute_w4a8_impl(
              "cute_dsl_fused_moe_nvfp4", x, x_sf, token_selected_experts, token_final_scales,
              w1_weight, w1_weight_sf, w1_alpha, fc2_input_scale, w2_weight, w2_weight_sf, w2_alpha,
              num_experts, top_k, num_local_experts, local_expert_offset, output_dtype, moe_output,
              use_fused_finalize, activation_type, swiglu_alpha, swiglu_beta, swiglu_limit,
              situ_beta, situ_linear_beta, per_token_scale);
        }
        return moe_cute::cute_dsl_impl(
            "cute_dsl_fused_moe_nvfp4", x, x_sf, token_selected_experts, token_final_scales,
            w1_weight, w1_weight_sf, w1_alpha, fc2_input_scale, w2_weight, w2_weight_sf, w2_alpha,
            num_experts, top_k, num_local_experts, local_expert_offset, output_dtype, moe_output,
            activation_type, swiglu_alpha, swiglu_beta, swiglu_limit, situ_beta, situ_linear_beta,
            quant_mode, per_token_scale);
      },
      x, x_sf, token_selected_experts, token_final_scales, w1_weight, w1_weight_sf, w1_alpha,
      fc2_input_scale, w2_weight, w2_weight_sf, w2_alpha, num_experts, top_k, num_local_experts,
      local_expert_offset, output_dtype, use_fused_finalize, moe_output, aux_stream, enable_pdl,
      activation_type, swiglu_alpha, swiglu_beta, swiglu_limit, situ_beta, situ_linear_beta,
      quant_mode, per_token_scale, localized_weights, localized_streams, localized_sm_count,
      localized_memset_stream, localized_allow_nonlocalized, autotune_use_cuda_graph, nvfp4_4over6,
      clamped_relu2_limit);
}

Tensor moe_cute::rand_bytes(const Shape& shape, Device dev, uint64_t seed) {
  return api::bench::random_tensor(shape, DType::kFloat32, Device::cpu(), seed, 0.0, 256.0)
      .to(DType::kUInt8)
      .to(dev);
}

Tensor moe_cute::e4m3_scales(const Shape& shape, Device dev, uint64_t seed, double low,
                             double high) {
  return api::bench::random_tensor(shape, DType::kFloat32, Device::cpu(), seed, low, high)
      .to(DType::kFloat8E4M3FN)
      .to(dev);
}

namespace {

using moe_cute::e4m3_scales;
using moe_cute::rand_bytes;

// Two distinct experts per token, bf16 weights 0.75 / 0.25, packed (id << 16) | weight bits.
Value packed_ids(int64_t T, int64_t E, Device dev) {
  std::vector<int64_t> packed;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t e0 = (t * 5) % E, e1 = (e0 + 1 + t % (E - 1)) % E;
    packed.push_back((e0 << 16) | float_to_bfloat16_bits(0.75f));
    packed.push_back((e1 << 16) | float_to_bfloat16_bits(0.25f));
  }
  return Value(api::bench::int32_tensor(packed, dev).view({T, 2}));
}

// The NVFP4 FFN inputs (from hidden_states to output2_scale_scalar) of m tokens, hidden_size
// and inter = n rounded up to 128, 8 experts; random bytes are a valid prepared layout of other
// random weights.
std::vector<Value> nvfp4_ffn(const BenchShape& s, Device dev, int64_t H, int64_t I) {
  const int64_t T = s.m, E = 8;
  const uint64_t sd = s.random_seed;
  auto scalars = [&](uint64_t seed) {
    return Value(api::bench::random_tensor({E}, DType::kFloat32, dev, seed, 0.5, 1.0));
  };
  return {Value(rand_bytes({T, H / 2}, dev, sd + 2)),
          Value(e4m3_scales({T, H / 16}, dev, sd + 3, 0.25, 0.5)),
          Value(rand_bytes({E, 2 * I, H / 2}, dev, sd + 4)),
          Value(e4m3_scales({E, 2 * I, H / 16}, dev, sd + 5, 0.01, 0.02)),
          Value(),
          Value(),
          Value(),
          Value(),
          Value(rand_bytes({E, H, I / 2}, dev, sd + 6)),
          Value(e4m3_scales({E, H, I / 16}, dev, sd + 7, 0.01, 0.02)),
          Value(),
          scalars(sd + 8),
          scalars(sd + 9),
          scalars(sd + 10)};
}

BenchCase moe_fp4_finish(BenchCase c, const BenchShape& s, int64_t H, int64_t I) {
  const double rows = static_cast<double>(s.m * 2);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = static_cast<double>(s.m * H) * 2.5 + static_cast<double>(8 * 3 * I * H) / 2;
  return c;
}

// trtllm_fp4_block_scale_moe: NVFP4 hidden states and weights, 8 experts, top-2, Renormalize
// routing from bf16 logits.
BenchCase bench_trtllm_fp4_block_scale_moe(const BenchShape& s, Device dev) {
  const int64_t H = (s.hidden_size + 127) / 128 * 128, I = (s.n + 127) / 128 * 128, E = 8;
  std::vector<Value> args = {
      Value(api::bench::random_tensor({s.m, E}, DType::kBFloat16, dev, s.random_seed, -3, 3)),
      Value()};
  for (Value& v : nvfp4_ffn(s, dev, H, I)) args.push_back(std::move(v));
  for (Value v : {Value(E), Value(int64_t{2}), Value(), Value(), Value(I), Value(int64_t{0}),
                  Value(E), Value(), Value(int64_t{1})}) {
    args.push_back(std::move(v));
  }
  return moe_fp4_finish(api::bench::invoke_case("trtllm_fp4_block_scale_moe", std::move(args)), s,
                        H, I);
}

BenchCase bench_trtllm_fp4_block_scale_routed_moe(const BenchShape& s, Device dev) {
  const int64_t H = (s.hidden_size + 127) / 128 * 128, I = (s.n + 127) / 128 * 128, E = 8;
  std::vector<Value> args = {packed_ids(s.m, E, dev), Value()};
  for (Value& v : nvfp4_ffn(s, dev, H, I)) args.push_back(std::move(v));
  for (Value v : {Value(E), Value(int64_t{2}), Value(), Value(), Value(I), Value(int64_t{0}),
                  Value(E), Value()}) {
    args.push_back(std::move(v));
  }
  return moe_fp4_finish(
      api::bench::invoke_case("trtllm_fp4_block_scale_routed_moe", std::move(args)), s, H, I);
}

// The MxInt4 FFN inputs (gemm1_weights .. gemm2_weights_scale, alpha/beta/limit None).
std::vector<Value> mxint4_ffn(const BenchShape& s, Device dev, int64_t H, int64_t I) {
  const int64_t E = 8;
  const uint64_t sd = s.random_seed;
  auto scales = [&](int64_t rows, int64_t cols, uint64_t seed) {
    const int64_t per = kernels::sf_buffer_size(kernels::SfLayoutCode::k128x4, rows, cols);
    return Value(api::bench::random_tensor({E, per}, DType::kBFloat16, dev, seed, 0.01, 0.02));
  };
  return {Value(rand_bytes({E, 2 * I, H / 2}, dev, sd + 4)),
          scales(2 * I, H / 32, sd + 5),
          Value(),
          Value(),
          Value(),
          Value(rand_bytes({E, H, I / 2}, dev, sd + 6)),
          scales(H, I / 32, sd + 7)};
}

// trtllm_mxint4_block_scale_moe: bf16 hidden states, MajorK MxInt4 weights, 8 experts, top-2,
// Renormalize routing.
BenchCase bench_trtllm_mxint4_block_scale_moe(const BenchShape& s, Device dev) {
  const int64_t H = (s.hidden_size + 127) / 128 * 128, I = (s.n + 127) / 128 * 128, E = 8;
  std::vector<Value> args = {
      Value(api::bench::random_tensor({s.m, E}, DType::kBFloat16, dev, s.random_seed, -3, 3)),
      Value(),
      Value(api::bench::random_tensor({s.m, H}, DType::kBFloat16, dev, s.random_seed + 1))};
  for (Value& v : mxint4_ffn(s, dev, H, I)) args.push_back(std::move(v));
  for (Value v : {Value(E), Value(int64_t{2}), Value(), Value(), Value(I), Value(int64_t{0}),
                  Value(E), Value(), Value(int64_t{1})}) {
    args.push_back(std::move(v));
  }
  return moe_fp4_finish(api::bench::invoke_case("trtllm_mxint4_block_scale_moe", std::move(args)),
                        s, H, I);
}

BenchCase bench_trtllm_mxint4_block_scale_routed_moe(const BenchShape& s, Device dev) {
  const int64_t H = (s.hidden_size + 127) / 128 * 128, I = (s.n + 127) / 128 * 128, E = 8;
  std::vector<Value> args = {
      packed_ids(s.m, E, dev),
      Value(api::bench::random_tensor({s.m, H}, DType::kBFloat16, dev, s.random_seed + 1))};
  for (Value& v : mxint4_ffn(s, dev, H, I)) args.push_back(std::move(v));
  for (Value v : {Value(E), Value(int64_t{2}), Value(), Value(), Value(I), Value(int64_t{0}),
                  Value(E), Value()}) {
    args.push_back(std::move(v));
  }
  return moe_fp4_finish(
      api::bench::invoke_case("trtllm_mxint4_block_scale_routed_moe", std::move(args)), s, H, I);
}

// cute_dsl_fused_moe_nvfp4: NVFP4 x and weights (random bytes are a valid prepared layout),
// 8 experts, top-2 with weights 0.75 / 0.25, alphas and fc2_input_scale 1, into moe_output.
BenchCase bench_cute_dsl_fused_moe_nvfp4(const BenchShape& s, Device dev) {
  const int64_t H = (s.hidden_size + 127) / 128 * 128, I = (s.n + 127) / 128 * 128, E = 8;
  const int64_t T = s.m;
  const uint64_t sd = s.random_seed;
  std::vector<double> ids, w;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t e0 = (t * 5) % E, e1 = (e0 + 1 + t % (E - 1)) % E;
    ids.insert(ids.end(), {static_cast<double>(e0), static_cast<double>(e1)});
    w.insert(w.end(), {0.75, 0.25});
  }
  auto ones = [&] { return Value(Tensor::full({E}, 1.0, DType::kFloat32).to(dev)); };
  auto sf = [&](int64_t rows, int64_t cols, uint64_t seed) {
    const int64_t per = kernels::sf_buffer_size(kernels::SfLayoutCode::k128x4, rows, cols);
    return Value(e4m3_scales({E * per}, dev, seed, 0.01, 0.02));
  };
  BenchCase c = api::bench::invoke_case(
      "cute_dsl_fused_moe_nvfp4",
      {Value(rand_bytes({T, H / 2}, dev, sd + 1)),
       Value(e4m3_scales({T, H / 16}, dev, sd + 2, 0.25, 0.5)),
       Value(Tensor::from_vector(ids, {T, 2}, DType::kInt32).to(dev)),
       Value(Tensor::from_vector(w, {T, 2}, DType::kFloat32).to(dev)),
       Value(rand_bytes({E, 2 * I, H / 2}, dev, sd + 3)), sf(2 * I, H / 16, sd + 4), ones(),
       Value(Tensor::full({1}, 1.0, DType::kFloat32).to(dev)),
       Value(rand_bytes({E, H, I / 2}, dev, sd + 5)), sf(H, I / 16, sd + 6), ones(), Value(E),
       Value(int64_t{2})},
      {{"moe_output", Value(Tensor::empty({T, H}, DType::kBFloat16, dev))}});
  return moe_fp4_finish(std::move(c), s, H, I);
}
}  // namespace

namespace detail {
void register_moe_fp4_ops(OpRegistry& r) {
  declare<&trtllm_fp4_block_scale_moe>(
      r,
      {.name = "trtllm_fp4_block_scale_moe",
       .module = kMoeFp4CoreModule,
       .summary = "trtllm-gen FP4 MoE (NVFP4 or MXFP4 weights; NVFP4, MXFP8 or bf16 hidden "
                  "states): routing from logits, then the fused expert FFNs"},
      "routing_logits", arg("routing_bias").required(), "hidden_states",
      arg("hidden_states_scale").required(), "gemm1_weights", "gemm1_weights_scale",
      arg("gemm1_bias").required(), arg("gemm1_alpha").required(), arg("gemm1_beta").required(),
      arg("gemm1_clamp_limit").required(), "gemm2_weights", "gemm2_weights_scale",
      arg("gemm2_bias").required(), arg("output1_scale_scalar").required(),
      arg("output1_scale_gate_scalar").required(), arg("output2_scale_scalar").required(),
      "num_experts", "top_k", arg("n_group").required(), arg("topk_group").required(),
      "intermediate_size", "local_expert_offset", "local_num_experts",
      arg("routed_scaling_factor").required(), arg("routing_method_type", int64_t{0}),
      arg("do_finalize", true), "enable_pdl", arg("activation_type", int64_t{3}), "per_token_scale",
      arg("output").mut(), arg("tune_max_num_tokens", int64_t{8192}), arg("norm_topk_prob", true),
      arg("routing_replay_out").mut(), "num_fused_shared_experts", "valid_hidden_size",
      "valid_intermediate_size", arg("hidden_states_scale_layout", Value()), "workspace_buffer",
      arg("nvfp4_4over6", nvfp4_4over6_unset()).type("NVFP44Over6Config"));
  declare<&trtllm_fp4_block_scale_routed_moe>(
      r,
      {.name = "trtllm_fp4_block_scale_routed_moe",
       .module = kMoeFp4CoreModule,
       .summary = "trtllm-gen FP4 block-scale MoE with precomputed routing (packed ids or (ids, "
                  "weights))"},
      "topk_ids", arg("routing_bias").required(), "hidden_states",
      arg("hidden_states_scale").required(), "gemm1_weights", "gemm1_weights_scale",
      arg("gemm1_bias").required(), arg("gemm1_alpha").required(), arg("gemm1_beta").required(),
      arg("gemm1_clamp_limit").required(), "gemm2_weights", "gemm2_weights_scale",
      arg("gemm2_bias").required(), arg("output1_scale_scalar").required(),
      arg("output1_scale_gate_scalar").required(), arg("output2_scale_scalar").required(),
      "num_experts", "top_k", arg("n_group").required(), arg("topk_group").required(),
      "intermediate_size", "local_expert_offset", "local_num_experts",
      arg("routed_scaling_factor").required(), arg("routing_method_type", int64_t{0}),
      arg("do_finalize", true), "enable_pdl", arg("activation_type", int64_t{3}), "per_token_scale",
      arg("output").mut(), arg("tune_max_num_tokens", int64_t{8192}), "gemm1_lora_delta",
      "valid_hidden_size", "valid_intermediate_size", "num_fused_shared_experts",
      arg("hidden_states_scale_layout", Value()), "workspace_buffer",
      arg("nvfp4_4over6", nvfp4_4over6_unset()).type("NVFP44Over6Config"),
      arg("routing_metadata", Value()));
  declare<&trtllm_mxint4_block_scale_moe>(
      r,
      {.name = "trtllm_mxint4_block_scale_moe",
       .module = kMoeFp4CoreModule,
       .summary = "trtllm-gen MxInt4 MoE (int4 weights, bf16 block scales of 32, bf16 hidden "
                  "states): routing from logits, then the fused expert FFNs"},
      "routing_logits", arg("routing_bias").required(), "hidden_states", "gemm1_weights",
      "gemm1_weights_scale", arg("gemm1_alpha").required(), arg("gemm1_beta").required(),
      arg("gemm1_clamp_limit").required(), "gemm2_weights", "gemm2_weights_scale", "num_experts",
      "top_k", arg("n_group").required(), arg("topk_group").required(), "intermediate_size",
      "local_expert_offset", "local_num_experts", arg("routed_scaling_factor").required(),
      arg("routing_method_type", int64_t{0}), arg("do_finalize", true), "enable_pdl",
      arg("output").mut(), arg("tune_max_num_tokens", int64_t{8192}), arg("norm_topk_prob", true),
      arg("routing_replay_out").mut(), "valid_hidden_size", "valid_intermediate_size",
      "workspace_buffer");
  declare<&trtllm_mxint4_block_scale_routed_moe>(
      r,
      {.name = "trtllm_mxint4_block_scale_routed_moe",
       .module = kMoeFp4CoreModule,
       .summary = "trtllm-gen MxInt4 block-scale MoE with precomputed routing"},
      "topk_ids", "hidden_states", "gemm1_weights", "gemm1_weights_scale",
      arg("gemm1_alpha").required(), arg("gemm1_beta").required(),
      arg("gemm1_clamp_limit").required(), "gemm2_weights", "gemm2_weights_scale", "num_experts",
      "top_k", arg("n_group").required(), arg("topk_group").required(), "intermediate_size",
      "local_expert_offset", "local_num_experts", arg("routed_scaling_factor").required(),
      arg("routing_method_type", int64_t{0}), arg("do_finalize", true), "enable_pdl",
      "gemm1_lora_delta", arg("output").mut(), arg("tune_max_num_tokens", int64_t{8192}),
      "valid_hidden_size", "valid_intermediate_size", "workspace_buffer");
  declare<&cute_dsl_fused_moe_nvfp4>(
      r,
      {.name = "cute_dsl_fused_moe_nvfp4",
       .module = "flashinfer.fused_moe.cute_dsl.fused_moe",
       .summary = "CuTe-DSL NVFP4 fused MoE with precomputed routing (w4a4): GEMM1, SwiGLU or "
                  "Relu2, NVFP4 activation, GEMM2, weighted combine"},
      "x", arg("x_sf").required(), "token_selected_experts", "token_final_scales", "w1_weight",
      "w1_weight_sf", "w1_alpha", arg("fc2_input_scale").required(), "w2_weight", "w2_weight_sf",
      "w2_alpha", "num_experts", "top_k", "num_local_experts", arg("local_expert_offset", 0),
      arg("output_dtype", DType::kBFloat16), arg("use_fused_finalize", true),
      arg("moe_output").mut(), "aux_stream", arg("enable_pdl", true),
      arg("activation_type", int64_t{3}), arg("swiglu_alpha", 1.0), arg("swiglu_beta", 0.0),
      arg("swiglu_limit", 3.4028234663852886e38), "situ_beta", "situ_linear_beta",
      arg("quant_mode", std::string_view("w4a4")).kw(), arg("per_token_scale").kw(),
      arg("localized_weights").kw(), arg("localized_streams").kw(), arg("localized_sm_count").kw(),
      arg("localized_memset_stream").kw(), arg("localized_allow_nonlocalized", false).kw(),
      arg("autotune_use_cuda_graph", false).kw(),
      arg("nvfp4_4over6", nvfp4_4over6_unset()).type("NVFP44Over6Config").kw(),
      arg("clamped_relu2_limit").kw());
  api::register_backends("cute_dsl_fused_moe_nvfp4", kTrtllmFp4MoeKernels);
  register_bench_hook("cute_dsl_fused_moe_nvfp4", bench_cute_dsl_fused_moe_nvfp4);
  for (const char* name :
       {"trtllm_fp4_block_scale_moe", "trtllm_fp4_block_scale_routed_moe",
        "trtllm_mxint4_block_scale_moe", "trtllm_mxint4_block_scale_routed_moe"}) {
    api::register_backends(name, kTrtllmFp4MoeKernels);
  }
  register_bench_hook("trtllm_fp4_block_scale_moe", bench_trtllm_fp4_block_scale_moe);
  register_bench_hook("trtllm_fp4_block_scale_routed_moe", bench_trtllm_fp4_block_scale_routed_moe);
  register_bench_hook("trtllm_mxint4_block_scale_moe", bench_trtllm_mxint4_block_scale_moe);
  register_bench_hook("trtllm_mxint4_block_scale_routed_moe",
                      bench_trtllm_mxint4_block_scale_routed_moe);
}
}  // namespace detail

}  // namespace flashinfer
