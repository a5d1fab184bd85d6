// Trace templates of the MoE entry points beyond trtllm_fp8/fp4_block_scale_moe (those are in
// templates.cpp): the other trtllm-gen ops (bf16, fp8 per tensor, the routed forms, mxint4),
// cutlass_fused_moe, hash_topk and the Blackwell CuTe-DSL ops (b12x, cute_dsl_fused_moe_nvfp4 and
// their wrappers). Upstream commits no fi_trace output for any of them, so the facts are the
// template source, flashinfer/trace/templates/moe.py (docs/TRACE.md names the stored versions):
// names, op_type, axes (var/const, abbreviations, order), inputs and outputs as written there,
// including its quirks (the routed forms' num_experts / intermediate_size are variable axes; the
// fp4 routed form has no output scale scalars; the wrappers' init-time settings are optional
// scalars). The `reference`s are ours (docs/TRACE.md says which are checked against the library).
#include "trace/template_builders.h"

namespace flashinfer::trace::detail {
namespace {

// Precomputed routing (docs/MOE.md, trtllm_bf16_routed_moe): packed int32 (expert_id << 16) |
// bf16 weight bits, or an (ids, weights) pair; and the gated expert FFN with per-expert output
// scales (None = 1) and the rounding points given as functions. Gate in the second half of
// GEMM1's rows (silu(g[I:]) * g[:I]), as every op here.
const char* const kFfn = R"PY(def _same(t):
    return t


def _bf16(t):
    return t.to(torch.bfloat16).float()


def _fp8(t):
    # e4m3 rounding, saturating at 448; left unrounded on a torch without float8.
    if not hasattr(torch, "float8_e4m3fn"):
        return t
    return t.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()


def _unpack_topk(topk_ids):
    if isinstance(topk_ids, (tuple, list)):
        return topk_ids[0].long(), topk_ids[1].float()
    v = topk_ids.long() & 0xFFFFFFFF
    lo = v & 0xFFFF
    bits = (lo - ((lo & 0x8000) << 1)).to(torch.int16)
    return v >> 16, bits.view(torch.bfloat16).float()


def _moe_ffn(x, w1, w2, topk_ids, topk_w, offset, r1, rh, ry, s1=None, sg=None, s2=None):
    T, H = x.shape
    E, G1, _ = w1.shape
    I = G1 // 2
    one = torch.ones(E)
    s1, sg, s2 = (one if s is None else s.float().reshape(E) for s in (s1, sg, s2))
    out = torch.zeros((T, H), dtype=torch.float32)
    for e in range(E):
        hit = topk_ids == (int(offset) + e)
        rows = hit.any(dim=1).nonzero().flatten()
        if rows.numel() == 0:
            continue
        g = r1(x[rows] @ w1[e].t())
        h = rh(torch.nn.functional.silu(g[:, I:] * sg[e]) * (g[:, :I] * s1[e]))
        y = ry((h @ w2[e].t()) * s2[e])
        w = (topk_w[rows] * hit[rows].float()).sum(dim=1, keepdim=True)
        out[rows] += w * y
    return out


)PY";

// NVFP4 quantize-dequantize of the b12x / CuTe-DSL activations (docs/MOE.md): per block of 16,
// sf = e4m3(min(amax * gs / 6, 448)), q = e2m1(v / max(sf / gs, 1e-30)), value q * sf (the global
// scale stays in the values). Uses kFp4Quant's _e4m3_rn / _e2m1_rn and kMxHelpers' _e2m1.
const char* const kQdq = R"PY(def _qdq(v, gs):
    T, K = v.shape
    b = v.float().reshape(T, K // 16, 16)
    gs = float(gs)
    sf, _ = _e4m3_rn((b.abs().amax(dim=-1) * gs / 6.0).clamp(max=448.0))
    q = _e2m1(_e2m1_rn(b / (sf / gs).clamp(min=1e-30).unsqueeze(-1)))
    return (q * sf.unsqueeze(-1)).reshape(T, K)


def _dq4(p, s):
    # Packed e2m1 pairs (low nibble first) times e4m3 scales per 16 along the last dim (linear).
    p = p.long()
    v = torch.stack([_e2m1(p & 15), _e2m1(p >> 4)], dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)
    return v * s.float().repeat_interleave(16, dim=-1)[..., : v.shape[-1]]


def _per_expert(t, E):
    t = t.float().reshape(-1)
    return t.expand(E) if t.numel() == 1 else t


)PY";

std::string packed(const std::vector<std::string>& dims) {
  std::string shape;
  for (const auto& d : dims) shape += d + ", ";
  return "torch.randint(0, 256, (" + shape + "), dtype=torch.uint8, device=device)";
}
// Positive scales in [k, 2k).
std::string scales(const std::vector<std::string>& dims, const std::string& key, const char* k) {
  std::string shape;
  for (const auto& d : dims) shape += d + ", ";
  return "(torch.rand((" + shape + "), device=device) * " + k + " + " + k + ").to({dtype:" + key +
         "})";
}
// e4m3 scales exact in e4m3 (2^-1 * (1 + j/8)), so a torch without float8 builds the same values
// in float32 as the library reads from the e4m3 bytes.
std::string e4m3_scales(const std::vector<std::string>& dims, const std::string& key) {
  std::string shape;
  for (const auto& d : dims) shape += d + ", ";
  return "(torch.randint(8, 16, (" + shape + "), device=device) / 16.0).to({dtype:" + key + "})";
}
// fp8 values exact in e4m3 (multiples of 1/4 in [-2, 2)), for the library check on a torch
// without float8.
std::string e4m3_values(const std::vector<std::string>& dims, const std::string& key) {
  std::string shape;
  for (const auto& d : dims) shape += d + ", ";
  return "(torch.randint(-8, 8, (" + shape + "), device=device) / 4.0).to({dtype:" + key + "})";
}
// Packed precomputed routing: top_k distinct experts of num_experts per token, bf16 weights in
// [0.25, 0.75) (positive, so the low half never carries a sign bit).
const char* const kPackedTopk =
    "((torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(seq_len)]).to(torch.int32)"
    " << 16) | ((torch.rand((seq_len, top_k)) * 0.5 + 0.25).to(torch.bfloat16).view(torch.int16)"
    ".to(torch.int32) & 65535))";
const char* const kSelected =
    "torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(num_tokens)])"
    ".to(torch.int32)";

const std::vector<std::string> kEl = {"num_local_experts"};
const std::vector<std::string> kW1 = {"num_local_experts", "gemm1_out_size", "hidden_size"};
const std::vector<std::string> kW2 = {"num_local_experts", "hidden_size", "intermediate_size"};

Io opt_f32(const std::string& key) { return T(key, kEl).dt("float32").opt(); }

// upstream's _MOE_COMMON_AXES + gemm1_out_size (_TRTLLM_MOE_COMMON_AXES); the routed forms make
// num_experts and intermediate_size variable in place (a dict update keeps the key order).
std::vector<Axis> trtllm_axes(bool routed) {
  return {var("seq_len", "", 3),
          routed ? var("num_experts", "", 8) : cst("num_experts", ""),
          cst("top_k", "topk"),
          cst("num_local_experts", "e"),
          cst("hidden_size", "h"),
          routed ? var("intermediate_size", "", 16) : cst("intermediate_size", "i"),
          cst("gemm1_out_size", "")};
}

// Packed expert weights [experts, rows, packed] (two values a byte) and their block scales, the
// block count named by the format ("fp4": NVFP4's 16, "mxint4": MxInt4's 32).
struct PackedExpertDims {
  std::vector<std::string> w1, w1s, w2, w2s;
};
PackedExpertDims packed_expert_dims(const std::string& format) {
  return {.w1 = {"num_local_experts", "gemm1_out_size", "num_packed_hidden"},
          .w1s = {"num_local_experts", "gemm1_out_size", "num_" + format + "_hidden_blocks"},
          .w2 = {"num_local_experts", "hidden_size", "num_packed_intermediate"},
          .w2s = {"num_local_experts", "hidden_size", "num_" + format + "_intermediate_blocks"}};
}

// _TRTLLM_MOE_COMMON_INPUTS: routing from the logits, `tensors` (hidden states, weights and
// their scales), then the routing settings as scalars.
std::vector<Io> logit_routed_inputs(std::vector<Io> tensors) {
  std::vector<Io> in = {T("routing_logits", {"seq_len", "num_experts"}),
                        T("routing_bias", {"num_experts"}).opt()};
  for (Io& io : tensors) in.push_back(std::move(io));
  for (Io io :
       {S("top_k", "int32").init("top_k"), S("n_group", "int32").opt(),
        S("topk_group", "int32").opt(), S("local_expert_offset", "int32").init("0"),
        S("routed_scaling_factor", "float32").opt(), S("routing_method_type", "int32").opt()}) {
    in.push_back(std::move(io));
  }
  return in;
}

// The routed forms: packed topk_ids, routing_bias where upstream lists it, `tensors`, then
// num_experts, top_k, local_expert_offset and routed_scaling_factor.
std::vector<Io> precomputed_routed_inputs(bool routing_bias, std::vector<Io> tensors) {
  std::vector<Io> in = {T("topk_ids", {"seq_len", "top_k"}).dt("int32").init(kPackedTopk)};
  if (routing_bias) in.push_back(T("routing_bias", {"num_experts"}).opt());
  for (Io& io : tensors) in.push_back(std::move(io));
  for (Io io :
       {S("num_experts", "int32").init("num_experts"), S("top_k", "int32").init("top_k"),
        S("local_expert_offset", "int32").init("0"), S("routed_scaling_factor", "float32").opt()}) {
    in.push_back(std::move(io));
  }
  return in;
}

const char* const kNoSwigluParams =
    "    if gemm1_alpha is not None or gemm1_beta is not None or gemm1_clamp_limit is not None:\n"
    "        raise NotImplementedError(\"gemm1_alpha / beta / clamp_limit\")\n";

void add_trtllm(std::vector<Template>& v) {
  const std::vector<Io> swiglu_oa = {opt_f32("gemm1_alpha"), opt_f32("gemm1_beta"),
                                     opt_f32("gemm1_clamp_limit")};
  const Io out = T("output", {"seq_len", "hidden_size"}).dt("bfloat16");

  {  // trtllm_bf16_moe
    std::vector<Io> in = logit_routed_inputs({T("hidden_states", {"seq_len", "hidden_size"}),
                                              T("gemm1_weights", kW1), T("gemm2_weights", kW2)});
    in.insert(in.end(), swiglu_oa.begin(), swiglu_oa.end());
    v.push_back(
        {.op = "trtllm_bf16_moe",
         .op_type = "moe",
         .name_prefix = "trtllm_bf16_moe",
         .description = "trtllm-gen BF16 MoE: routing from the logits by routing_method_type "
                        "0-5 (None = Default) as our CPU op (only DeepSeek-V3 reads routing_bias "
                        "and routed_scaling_factor; TopK weighs by the raw logits), then the gated "
                        "expert FFN (SwiGLU, gate in the second "
                        "half of GEMM1's rows) over the local experts; the routing weights, the "
                        "activation and GEMM2's output rounded to bf16. Weights as written "
                        "(MajorK rows, not shuffled).",
         .axes = trtllm_axes(false),
         .inputs = in,
         .outputs = {out},
         .tags = {"status:verified", "backend:trtllm"},
         .reference = std::string(kRoute) + kFfn +
                      "def run(routing_logits, routing_bias=None, hidden_states=None, "
                      "gemm1_weights=None,\n"
                      "        gemm2_weights=None, top_k=None, n_group=None, topk_group=None,\n"
                      "        local_expert_offset=0, routed_scaling_factor=None, "
                      "routing_method_type=None,\n"
                      "        gemm1_alpha=None, gemm1_beta=None, gemm1_clamp_limit=None):\n" +
                      kNoSwigluParams +
                      "    ids, w = _route(routing_logits, routing_bias, routing_method_type, "
                      "top_k, n_group,\n"
                      "                    topk_group, routed_scaling_factor)\n"
                      "    out = _moe_ffn(hidden_states.float(), gemm1_weights.float(), "
                      "gemm2_weights.float(), ids,\n"
                      "                   _bf16(w), local_expert_offset, _same, _bf16, _bf16)\n"
                      "    return out.to(torch.bfloat16)\n"});
  }
  {  // trtllm_bf16_routed_moe
    std::vector<Io> in =
        precomputed_routed_inputs(false, {T("hidden_states", {"seq_len", "hidden_size"}),
                                          T("gemm1_weights", kW1), T("gemm2_weights", kW2)});
    in.insert(in.end(), swiglu_oa.begin(), swiglu_oa.end());
    v.push_back(
        {.op = "trtllm_bf16_routed_moe",
         .op_type = "moe",
         .name_prefix = "trtllm_bf16_routed_moe",
         .description = "trtllm-gen BF16 MoE with precomputed routing: topk_ids packed as "
                        "(expert_id << 16) | bf16 weight bits (or an (ids, weights) pair), the "
                        "weights used as given (routed_scaling_factor has no effect); the expert "
                        "FFN of trtllm_bf16_moe.",
         .axes = trtllm_axes(true),
         .inputs = in,
         .outputs = {out},
         .tags = {"status:verified", "backend:trtllm"},
         .reference = std::string(kFfn) +
                      "def run(topk_ids, hidden_states=None, gemm1_weights=None, "
                      "gemm2_weights=None,\n"
                      "        num_experts=None, top_k=None, local_expert_offset=0,\n"
                      "        routed_scaling_factor=None, gemm1_alpha=None, gemm1_beta=None,\n"
                      "        gemm1_clamp_limit=None):\n" +
                      kNoSwigluParams +
                      "    ids, w = _unpack_topk(topk_ids)\n"
                      "    out = _moe_ffn(hidden_states.float(), gemm1_weights.float(), "
                      "gemm2_weights.float(), ids,\n"
                      "                   _bf16(w), local_expert_offset, _same, _bf16, _bf16)\n"
                      "    return out.to(torch.bfloat16)\n"});
  }
  // FP8 per tensor (docs/MOE.md "FP8 per tensor"): acc on the raw e4m3 codes, the gate half times
  // output1_scales_gate_scalar[e], the up half times output1_scales_scalar[e], the activation
  // rounded to e4m3, GEMM2 times output2_scales_scalar[e] rounded to bf16.
  const char* fp8_scales_desc =
      " Weights read as written (plain rows; our op takes upstream's shuffled per-tensor layout); "
      "use_routing_scales_on_input is not in the definition (False).";
  const std::vector<Io> out_scales = {T("output1_scales_scalar", kEl).dt("float32"),
                                      T("output1_scales_gate_scalar", kEl).dt("float32"),
                                      T("output2_scales_scalar", kEl).dt("float32")};
  const std::string fp8_ffn =
      "    out = _moe_ffn(hidden_states.float(), gemm1_weights.float(), gemm2_weights.float(), "
      "ids,\n"
      "                   _bf16(w), local_expert_offset, _same, _fp8, _bf16,\n"
      "                   s1=output1_scales_scalar, sg=output1_scales_gate_scalar,\n"
      "                   s2=output2_scales_scalar)\n"
      "    return out.to(torch.bfloat16)\n";
  {  // trtllm_fp8_per_tensor_scale_moe
    std::vector<Io> in =
        logit_routed_inputs({T("hidden_states", {"seq_len", "hidden_size"}).synth("float8_e4m3fn"),
                             T("gemm1_weights", kW1).synth("float8_e4m3fn"),
                             T("gemm2_weights", kW2).synth("float8_e4m3fn")});
    for (Io s : out_scales)
      in.push_back(s.init("(torch.rand((num_local_experts,)) * 0.02 + 0.01)"));
    v.push_back({.op = "trtllm_fp8_per_tensor_scale_moe",
                 .op_type = "moe",
                 .name_prefix = "trtllm_fp8_per_tensor_scale_moe",
                 .description = std::string("trtllm-gen FP8 MoE with per-tensor scales: routing "
                                            "as trtllm_bf16_moe, then acc = x @ w1[e].T on the "
                                            "e4m3 codes, h = e4m3(silu(acc[I:] * gate_scale[e]) "
                                            "* acc[:I] * out1_scale[e]), y = bf16((h @ w2[e].T) "
                                            "* out2_scale[e]).") +
                                fp8_scales_desc,
                 .axes = trtllm_axes(false),
                 .inputs = in,
                 .outputs = {out},
                 .tags = {"status:verified", "backend:trtllm", "quantization:float8_e4m3fn"},
                 .reference = std::string(kRoute) + kFfn +
                              "def run(routing_logits, routing_bias=None, hidden_states=None, "
                              "gemm1_weights=None,\n"
                              "        gemm2_weights=None, top_k=None, n_group=None, "
                              "topk_group=None,\n"
                              "        local_expert_offset=0, routed_scaling_factor=None, "
                              "routing_method_type=None,\n"
                              "        output1_scales_scalar=None, "
                              "output1_scales_gate_scalar=None,\n"
                              "        output2_scales_scalar=None):\n"
                              "    ids, w = _route(routing_logits, routing_bias, "
                              "routing_method_type, top_k, n_group,\n"
                              "                    topk_group, routed_scaling_factor)\n" +
                              fp8_ffn});
  }
  {  // trtllm_fp8_per_tensor_scale_routed_moe
    std::vector<Io> in = precomputed_routed_inputs(
        true, {T("hidden_states", {"seq_len", "hidden_size"}).synth("float8_e4m3fn"),
               T("gemm1_weights", kW1).synth("float8_e4m3fn"), out_scales[0], out_scales[1],
               T("gemm2_weights", kW2).synth("float8_e4m3fn"), out_scales[2]});
    for (Io& io : in) {
      if (io.key.rfind("output", 0) == 0)
        io.init("(torch.rand((num_local_experts,)) * 0.02 + 0.01)");
    }
    v.push_back({.op = "trtllm_fp8_per_tensor_scale_routed_moe",
                 .op_type = "moe",
                 .name_prefix = "trtllm_fp8_per_tensor_scale_routed_moe",
                 .description = std::string("trtllm-gen FP8 per-tensor MoE with precomputed "
                                            "routing (packed topk_ids as trtllm_bf16_routed_moe; "
                                            "routing_bias and routed_scaling_factor have no "
                                            "effect); the FFN of "
                                            "trtllm_fp8_per_tensor_scale_moe.") +
                                fp8_scales_desc,
                 .axes = trtllm_axes(true),
                 .inputs = in,
                 .outputs = {out},
                 .tags = {"status:verified", "backend:trtllm", "quantization:float8_e4m3fn"},
                 .reference = std::string(kFfn) +
                              "def run(topk_ids, routing_bias=None, hidden_states=None, "
                              "gemm1_weights=None,\n"
                              "        output1_scales_scalar=None, "
                              "output1_scales_gate_scalar=None,\n"
                              "        gemm2_weights=None, output2_scales_scalar=None, "
                              "num_experts=None,\n"
                              "        top_k=None, local_expert_offset=0, "
                              "routed_scaling_factor=None):\n"
                              "    ids, w = _unpack_topk(topk_ids)\n" +
                              fp8_ffn});
  }
  {  // trtllm_fp8_block_scale_routed_moe: DeepSeek FP8 block scales, our op's rounding points.
    std::vector<Axis> axes = trtllm_axes(true);
    axes[5].init_value = 128;  // whole 128-wide blocks
    for (const char* b : {"num_hidden_blocks", "num_intermediate_blocks", "num_gemm1_out_blocks"}) {
      axes.push_back(cst(b, ""));
    }
    std::vector<Io> in = precomputed_routed_inputs(
        true,
        {T("hidden_states", {"seq_len", "hidden_size"})
             .synth("float8_e4m3fn")
             .init(e4m3_values({"seq_len", "hidden_size"}, "hidden_states")),
         T("hidden_states_scale", {"num_hidden_blocks", "seq_len"})
             .synth("float32")
             .init("(torch.rand((num_hidden_blocks, seq_len), device=device) + 0.5)"
                   ".to({dtype:hidden_states_scale})"),
         T("gemm1_weights", kW1).synth("float8_e4m3fn").init(e4m3_values(kW1, "gemm1_weights")),
         T("gemm1_weights_scale",
           {"num_local_experts", "num_gemm1_out_blocks", "num_hidden_blocks"})
             .synth("float32")
             .init("(torch.rand((num_local_experts, num_gemm1_out_blocks, num_hidden_blocks), "
                   "device=device) + 0.5).to({dtype:gemm1_weights_scale})"),
         swiglu_oa[0], swiglu_oa[1], swiglu_oa[2],
         T("gemm2_weights", kW2).synth("float8_e4m3fn").init(e4m3_values(kW2, "gemm2_weights")),
         T("gemm2_weights_scale",
           {"num_local_experts", "num_hidden_blocks", "num_intermediate_blocks"})
             .synth("float32")
             .init("(torch.rand((num_local_experts, num_hidden_blocks, num_intermediate_blocks), "
                   "device=device) + 0.5).to({dtype:gemm2_weights_scale})")});
    v.push_back(
        {.op = "trtllm_fp8_block_scale_routed_moe",
         .op_type = "moe",
         .name_prefix = "trtllm_fp8_block_scale_routed_moe",
         .description = "trtllm-gen FP8 block-scale MoE with precomputed routing (packed "
                        "topk_ids as trtllm_bf16_routed_moe); DeepSeek 128x128 weight "
                        "blocks and 128-wide activation blocks stored [H/128, T]; the "
                        "activation and GEMM2's output rounded to bf16 (our op's rounding "
                        "points).",
         .axes = axes,
         .inputs = in,
         .outputs = {out},
         .tags = {"status:verified", "backend:trtllm", "quantization:float8_e4m3fn"},
         .reference =
             std::string(kFfn) +
             "def _ds_blocks(w, s):\n"
             "    # DeepSeek 128 x 128 weight blocks: w[.., n, k] * s[.., n / 128, k / 128].\n"
             "    s = s.float().repeat_interleave(128, dim=-2).repeat_interleave(128, "
             "dim=-1)\n"
             "    return w.float() * s[..., : w.shape[-2], : w.shape[-1]]\n\n\n"
             "def run(topk_ids, routing_bias=None, hidden_states=None, "
             "hidden_states_scale=None,\n"
             "        gemm1_weights=None, gemm1_weights_scale=None, gemm1_alpha=None, "
             "gemm1_beta=None,\n"
             "        gemm1_clamp_limit=None, gemm2_weights=None, "
             "gemm2_weights_scale=None,\n"
             "        num_experts=None, top_k=None, local_expert_offset=0,\n"
             "        routed_scaling_factor=None):\n" +
             kNoSwigluParams +
             "    ids, w = _unpack_topk(topk_ids)\n"
             "    H = hidden_states.shape[1]\n"
             "    # Activations: 128-wide blocks per token, scales stored [H / 128, T].\n"
             "    x = hidden_states.float() * "
             "hidden_states_scale.float().t().repeat_interleave(128, dim=1)[:, :H]\n"
             "    out = _moe_ffn(x, _ds_blocks(gemm1_weights, gemm1_weights_scale),\n"
             "                   _ds_blocks(gemm2_weights, gemm2_weights_scale), ids, "
             "_bf16(w),\n"
             "                   local_expert_offset, _same, _bf16, _bf16)\n"
             "    return out.to(torch.bfloat16)\n"});
  }
  {  // trtllm_fp4_block_scale_routed_moe: NVFP4 shapes; no gemm biases nor output scale scalars
     // among upstream's inputs (so 1 in the reference).
    const std::vector<std::string> hs = {"seq_len", "num_packed_hidden"},
                                   hss = {"seq_len", "num_fp4_hidden_blocks"};
    const PackedExpertDims d = packed_expert_dims("fp4");
    std::vector<Axis> axes = trtllm_axes(true);
    axes[5].init_value = 32;
    axes.push_back(cst("num_packed_hidden", ""));
    // Variable upstream: hidden_states_scale is optional.
    axes.push_back(var("num_fp4_hidden_blocks", "", 4));
    axes.push_back(cst("num_packed_intermediate", ""));
    axes.push_back(cst("num_fp4_intermediate_blocks", ""));
    axes.push_back(cst("activation_type", "act", "Fused activation type; 10 selects SiTU."));
    std::vector<Io> in = precomputed_routed_inputs(
        true, {T("hidden_states", hs).synth("uint8").init(packed(hs)),
               T("hidden_states_scale", hss).opt().init(scales(hss, "hidden_states_scale", "0.5")),
               T("gemm1_weights", d.w1).synth("uint8").init(packed(d.w1)),
               T("gemm1_weights_scale", d.w1s)
                   .synth("float8_e4m3fn")
                   .init(scales(d.w1s, "gemm1_weights_scale", "0.05")),
               swiglu_oa[0], swiglu_oa[1], swiglu_oa[2],
               T("gemm2_weights", d.w2).synth("uint8").init(packed(d.w2)),
               T("gemm2_weights_scale", d.w2s)
                   .synth("float8_e4m3fn")
                   .init(scales(d.w2s, "gemm2_weights_scale", "0.05"))});
    in.push_back(S("activation_type", "int32").init("activation_type"));
    v.push_back(
        {.op = "trtllm_fp4_block_scale_routed_moe",
         .op_type = "moe",
         .name_prefix = "trtllm_fp4_block_scale_routed_moe",
         .description = "trtllm-gen NVFP4 block-scale MoE with precomputed routing (packed "
                        "topk_ids as trtllm_bf16_routed_moe): packed e2m1 pairs (low nibble "
                        "first), e4m3 scales per 16 values along the last dim (linear, as the "
                        "shapes say), SwiGLU (activation_type 3 only); the definition has no "
                        "gemm biases nor output scale scalars, so none apply; the activation's "
                        "NVFP4 rounding is left out (fp32).",
         .axes = axes,
         .inputs = in,
         .outputs = {out},
         .tags = {"status:experimental", "backend:trtllm", "quantization:nvfp4"},
         .reference = std::string(kFfn) + kMoeFp4Experts +
                      "def run(topk_ids, routing_bias=None, hidden_states=None, "
                      "hidden_states_scale=None,\n"
                      "        gemm1_weights=None, gemm1_weights_scale=None, gemm1_alpha=None,\n"
                      "        gemm1_beta=None, gemm1_clamp_limit=None, gemm2_weights=None,\n"
                      "        gemm2_weights_scale=None, num_experts=None, top_k=None,\n"
                      "        local_expert_offset=0, routed_scaling_factor=None, "
                      "activation_type=3):\n" +
                      kNoSwigluParams +
                      "    if int(activation_type) != 3:\n"
                      "        raise NotImplementedError(\"activation_type %d\" % "
                      "int(activation_type))\n"
                      "    ids, w = _unpack_topk(topk_ids)\n"
                      "    return _experts(hidden_states, hidden_states_scale, gemm1_weights, "
                      "gemm1_weights_scale,\n"
                      "                    None, gemm2_weights, gemm2_weights_scale, None, None, "
                      "None, None,\n"
                      "                    ids, w, local_expert_offset)\n"});
  }
  {  // trtllm_mxint4_block_scale_moe: intermediate_size variable in place; the packed and block
     // counts constants without abbreviation.
    std::vector<Axis> axes = trtllm_axes(false);
    axes[5] = var("intermediate_size", "", 32);
    for (const char* b : {"num_packed_hidden", "num_mxint4_hidden_blocks",
                          "num_packed_intermediate", "num_mxint4_intermediate_blocks"}) {
      axes.push_back(cst(b, ""));
    }
    const PackedExpertDims d = packed_expert_dims("mxint4");
    std::vector<Io> in = logit_routed_inputs(
        {T("hidden_states", {"seq_len", "hidden_size"}),
         T("gemm1_weights", d.w1).synth("uint8").init(packed(d.w1)),
         T("gemm1_weights_scale", d.w1s).init(scales(d.w1s, "gemm1_weights_scale", "0.01")),
         T("gemm2_weights", d.w2).synth("uint8").init(packed(d.w2)),
         T("gemm2_weights_scale", d.w2s).init(scales(d.w2s, "gemm2_weights_scale", "0.01"))});
    v.push_back(
        {.op = "trtllm_mxint4_block_scale_moe",
         .op_type = "moe",
         .name_prefix = "trtllm_mxint4_block_scale_moe",
         .description = "trtllm-gen MxInt4 MoE: routing as trtllm_bf16_moe; weights signed int4 "
                        "nibbles (two's complement, low nibble first) times bf16 scales per 32 "
                        "along K (MajorK rows as written); bf16 hidden states; the activation and "
                        "GEMM2's output rounded to bf16.",
         .axes = axes,
         .inputs = in,
         .outputs = {out},
         .tags = {"status:experimental", "backend:trtllm", "quantization:mxint4"},
         .reference = std::string(kRoute) + kFfn +
                      "def _int4(p, s):\n"
                      "    p = p.long()\n"
                      "    v = torch.stack([p & 15, (p >> 4) & 15], dim=-1)\n"
                      "    v = v.reshape(*p.shape[:-1], p.shape[-1] * 2)\n"
                      "    v = torch.where(v >= 8, v - 16, v).float()\n"
                      "    return v * s.float().repeat_interleave(32, dim=-1)[..., : "
                      "v.shape[-1]]\n\n\n"
                      "def run(routing_logits, routing_bias=None, hidden_states=None, "
                      "gemm1_weights=None,\n"
                      "        gemm1_weights_scale=None, gemm2_weights=None, "
                      "gemm2_weights_scale=None, top_k=None,\n"
                      "        n_group=None, topk_group=None, local_expert_offset=0,\n"
                      "        routed_scaling_factor=None, routing_method_type=None):\n"
                      "    ids, w = _route(routing_logits, routing_bias, routing_method_type, "
                      "top_k, n_group,\n"
                      "                    topk_group, routed_scaling_factor)\n"
                      "    out = _moe_ffn(hidden_states.float(), _int4(gemm1_weights, "
                      "gemm1_weights_scale),\n"
                      "                   _int4(gemm2_weights, gemm2_weights_scale), ids, "
                      "_bf16(w),\n"
                      "                   local_expert_offset, _same, _bf16, _bf16)\n"
                      "    return out.to(torch.bfloat16)\n"});
  }
}

void add_cutlass_and_hash(std::vector<Template>& v) {
  // cutlass_fused_moe: gemm1_out_size appended after the template (an attribute set later).
  v.push_back(
      {.op = "cutlass_fused_moe",
       .op_type = "moe",
       .name_prefix = "cutlass_fused_moe",
       .description = "CUTLASS fused MoE with precomputed routing (unquantized): per (token, k) "
                      "g1 = x @ w1[e].T rounded to the input's dtype, h = silu(g1[I:]) * g1[:I] "
                      "rounded likewise, y = bf16(h @ w2[e].T), out = bf16(sum_k scale * y).",
       .axes = {var("seq_len", "", 3), cst("num_local_experts", "e"), cst("hidden_size", "h"),
                cst("intermediate_size", "i"), cst("top_k", "topk"), cst("gemm1_out_size", "")},
       .inputs = {T("input", {"seq_len", "hidden_size"}),
                  T("token_selected_experts", {"seq_len", "top_k"})
                      .dt("int32")
                      .init("torch.stack([torch.randperm(num_local_experts)[:top_k] for _ in "
                            "range(seq_len)]).to(torch.int32)"),
                  T("token_final_scales", {"seq_len", "top_k"})
                      .dt("float32")
                      .init("torch.rand((seq_len, top_k), device=device)"),
                  T("fc1_expert_weights", {"num_local_experts", "gemm1_out_size", "hidden_size"}),
                  T("fc2_expert_weights",
                    {"num_local_experts", "hidden_size", "intermediate_size"})},
       .outputs = {T("output", {"seq_len", "hidden_size"}).dt("bfloat16")},
       .tags = {"status:verified", "backend:cutlass"},
       .reference = std::string(kFfn) +
                    "def run(input, token_selected_experts, token_final_scales, "
                    "fc1_expert_weights,\n"
                    "        fc2_expert_weights):\n"
                    "    def rd(t):\n"
                    "        return t.to(input.dtype).float()\n\n"
                    "    out = _moe_ffn(input.float(), fc1_expert_weights.float(), "
                    "fc2_expert_weights.float(),\n"
                    "                   token_selected_experts.long(), "
                    "token_final_scales.float(), 0, rd, rd, _bf16)\n"
                    "    return out.to(torch.bfloat16)\n"});
  // hash_topk (DeepSeek-V4 hash routing).
  v.push_back(
      {.op = "hash_topk",
       .op_type = "moe_routing",
       .name_prefix = "hash_topk",
       .description = "Hash MoE routing: experts tid2eid[input_ids[t]], weights "
                      "sqrt(softplus(logit)) normalized over them (fp32); with one fused shared "
                      "expert a last slot of id num_routed_experts and weight "
                      "1 / routed_scaling_factor. Returns (topk_weights, topk_ids).",
       .axes = {var("num_tokens", "", 5), cst("num_routed_experts", "e"), cst("topk", "k"),
                cst("vocab", "v")},
       .inputs = {T("router_logits", {"num_tokens", "num_routed_experts"}).synth("float32"),
                  T("input_ids", {"num_tokens"})
                      .dt("int64")
                      .init("torch.randint(0, vocab, (num_tokens,), dtype=torch.int64, "
                            "device=device)"),
                  T("tid2eid", {"vocab", "topk"})
                      .dt("int32")
                      .init("torch.stack([torch.randperm(num_routed_experts)[:topk] for _ in "
                            "range(vocab)]).to(torch.int32)"),
                  S("num_fused_shared_experts", "int32").init("0"),
                  S("routed_scaling_factor", "float32").init("1.0")},
       .outputs = {T("topk_weights", {"num_tokens", "topk"}).dt("float32"),
                   T("topk_ids", {"num_tokens", "topk"}).dt("int32")},
       .tags = {"status:verified", "moe"},
       .reference = "def run(router_logits, input_ids, tid2eid, num_fused_shared_experts=0,\n"
                    "        routed_scaling_factor=1.0):\n"
                    "    E = router_logits.shape[1]\n"
                    "    ids = tid2eid[input_ids.long()].long()\n"
                    "    s = torch.sqrt(torch.nn.functional.softplus(router_logits.float()))\n"
                    "    g = s.gather(1, ids)\n"
                    "    w = g / g.sum(dim=1, keepdim=True)\n"
                    "    S = int(num_fused_shared_experts or 0)\n"
                    "    if S:\n"
                    "        T = ids.shape[0]\n"
                    "        ids = torch.cat([ids, torch.full((T, S), E, dtype=torch.long)], "
                    "dim=1)\n"
                    "        w = torch.cat([w, torch.full((T, S), 1.0 / "
                    "float(routed_scaling_factor))], dim=1)\n"
                    "    return w, ids.to(torch.int32)\n"});
}

// The Blackwell CuTe-DSL MoE ops (b12x, cute_dsl_fused_moe_nvfp4), each also as a wrapper's
// run(): the same axes but for the intermediate sizes' defaults, num_experts and top_k variable
// in the wrapper's.
std::vector<Axis> cute_dsl_axes(bool wrapper, int64_t intermediate, int64_t packed_intermediate,
                                int64_t intermediate_blocks) {
  return {var("num_tokens", "", 3),
          wrapper ? var("num_experts", "", 8) : cst("num_experts", ""),
          wrapper ? var("top_k", "", 2) : cst("top_k", "topk"),
          cst("num_local_experts", "e"),
          cst("hidden_size", "h"),
          var("intermediate_size", "", intermediate),
          var("num_packed_hidden", "", 32),
          var("num_packed_intermediate", "", packed_intermediate),
          var("num_fp4_hidden_blocks", "", 4),
          var("num_fp4_intermediate_blocks", "", intermediate_blocks),
          cst("gemm1_out_size", ""),
          var("one", "", 1)};
}

// Their common inputs: NVFP4 expert weights, precomputed routing, per-expert alphas; the
// wrapper's num_experts / top_k are init-time settings (given before run(), as plan() inputs).
struct CuteDslIo {
  Io w1, w1_sf, w2, w2_sf, selected, final_scales, w1_alpha, w2_alpha, fc2_input_scale, num_experts,
      top_k;
};
CuteDslIo cute_dsl_io(bool wrapper) {
  const PackedExpertDims d = packed_expert_dims("fp4");
  CuteDslIo io{
      .w1 = T("w1_weight", d.w1).synth("uint8").init(packed(d.w1)),
      .w1_sf =
          T("w1_weight_sf", d.w1s).synth("float8_e4m3fn").init(e4m3_scales(d.w1s, "w1_weight_sf")),
      .w2 = T("w2_weight", d.w2).synth("uint8").init(packed(d.w2)),
      .w2_sf =
          T("w2_weight_sf", d.w2s).synth("float8_e4m3fn").init(e4m3_scales(d.w2s, "w2_weight_sf")),
      .selected = T("token_selected_experts", {"num_tokens", "top_k"}).dt("int32").init(kSelected),
      .final_scales = T("token_final_scales", {"num_tokens", "top_k"})
                          .dt("float32")
                          .init("torch.rand((num_tokens, top_k), device=device)"),
      .w1_alpha = T("w1_alpha", kEl).dt("float32").init("(torch.rand((num_local_experts,)) + 0.5)"),
      .w2_alpha = T("w2_alpha", kEl).dt("float32").init("(torch.rand((num_local_experts,)) + 0.5)"),
      .fc2_input_scale =
          T("fc2_input_scale", {"one"}).dt("float32").init("torch.full((one,), 0.5)"),
      .num_experts = S("num_experts", "int32"),
      .top_k = S("top_k", "int32")};
  if (wrapper) {
    io.num_experts.plan();
    io.top_k.plan();
  } else {
    io.num_experts.init("num_experts");
    io.top_k.init("top_k");
  }
  return io;
}

// Adds the op `op` (also its name prefix) with axes(false) and inputs(false), then its wrapper's
// run() (`wrapper_op`, named `wrapper_prefix`, the description prefixed with the wrapper's name)
// with axes(true) and inputs(true): op_type moe, one bf16 output, experimental.
template <class Axes, class Inputs>
void push_with_wrapper(std::vector<Template>& v, const char* op, const char* wrapper_op,
                       const char* wrapper_prefix, const char* quant_tag, const char* desc,
                       const std::string& ref, const Axes& axes, const Inputs& inputs) {
  Template t{.op = op,
             .op_type = "moe",
             .name_prefix = op,
             .description = desc,
             .axes = axes(false),
             .inputs = inputs(false),
             .outputs = {T("output", {"num_tokens", "hidden_size"}).dt("bfloat16")},
             .tags = {"status:experimental", "backend:cute-dsl", quant_tag},
             .reference = ref};
  Template w = t;
  w.op = wrapper_op;
  w.name_prefix = wrapper_prefix;
  w.description = std::string(wrapper_op) + ": " + desc;
  w.axes = axes(true);
  w.inputs = inputs(true);
  v.push_back(std::move(t));
  v.push_back(std::move(w));
}

// The Blackwell CuTe-DSL ops. b12x_fused_moe and B12xMoEWrapper.run: moe.py at 0107a67 (its
// inputs match our signature: input_global_scale, quant_mode, source_format). The wrapper's
// init-time settings (num_experts, top_k, quant_mode, source_format) are optional scalars, not
// run() parameters; its num_experts and top_k axes are variable.
void add_b12x(std::vector<Template>& v) {
  auto axes = [](bool wrapper) {
    std::vector<Axis> a = cute_dsl_axes(wrapper, 32, 16, 2);
    a.insert(a.end() - 1, var("input_global_scale_size", "", 1));
    return a;
  };
  auto inputs = [](bool wrapper) {
    const CuteDslIo io = cute_dsl_io(wrapper);
    std::vector<Io> in = {T("x", {"num_tokens", "hidden_size"}),
                          io.w1,
                          io.w1_sf,
                          io.w2,
                          io.w2_sf,
                          io.selected,
                          io.final_scales,
                          io.num_experts,
                          io.top_k,
                          io.w1_alpha,
                          io.w2_alpha,
                          Io(io.fc2_input_scale).opt(),
                          T("input_global_scale", {"input_global_scale_size"}).dt("float32").opt()};
    if (!wrapper) in.push_back(S("activation_precision", "string").opt());
    in.push_back(wrapper ? S("quant_mode", "string").plan() : S("quant_mode", "string").opt());
    in.push_back(wrapper ? S("source_format", "string").plan()
                         : S("source_format", "string").opt());
    return in;
  };
  const std::string ref =
      std::string(kMxHelpers) + kFp4Quant + kQdq + kFfn +
      "def run(x, w1_weight=None, w1_weight_sf=None, w2_weight=None, w2_weight_sf=None,\n"
      "        token_selected_experts=None, token_final_scales=None, num_experts=None, "
      "top_k=None,\n"
      "        w1_alpha=None, w2_alpha=None, fc2_input_scale=None, input_global_scale=None,\n"
      "        activation_precision=None, quant_mode=None, source_format=None):\n"
      "    mode = str(quant_mode if quant_mode is not None else activation_precision or "
      "\"fp4\").lower()\n"
      "    if mode not in (\"fp4\", \"nvfp4\", \"w4a4\"):\n"
      "        raise NotImplementedError(\"quant_mode \" + mode)\n"
      "    if fc2_input_scale is None:\n"
      "        raise ValueError(\"fc2_input_scale is required for nvfp4\")\n"
      "    W1 = _dq4(w1_weight, w1_weight_sf)\n"
      "    W2 = _dq4(w2_weight, w2_weight_sf)\n"
      "    E, G1, _ = W1.shape\n"
      "    I = G1 // 2\n"
      "    a1 = _per_expert(w1_alpha, E)\n"
      "    gs1 = a1 if input_global_scale is None else _per_expert(input_global_scale, E)\n"
      "    alpha1 = a1 if input_global_scale is None else a1 * gs1\n"
      "    gs2, a2 = _per_expert(fc2_input_scale, E), _per_expert(w2_alpha, E)\n"
      "    ids, tw = token_selected_experts.long(), token_final_scales.float()\n"
      "    out = torch.zeros((x.shape[0], W2.shape[1]), dtype=torch.float32)\n"
      "    for e in range(E):\n"
      "        hit = ids == e\n"
      "        rows = hit.any(dim=1).nonzero().flatten()\n"
      "        if rows.numel() == 0:\n"
      "            continue\n"
      "        g = alpha1[e] * (_qdq(x[rows].float(), gs1[e]) @ W1[e].t())\n"
      "        h = _bf16(torch.nn.functional.silu(g[:, I:]) * g[:, :I])\n"
      "        y = a2[e] * (_qdq(h, gs2[e]) @ W2[e].t())\n"
      "        out[rows] += (tw[rows] * hit[rows].float()).sum(dim=1, keepdim=True) * y\n"
      "    return out.to(torch.bfloat16)\n";
  const char* desc =
      "b12x NVFP4 fused MoE (SM12x), quant_mode nvfp4 only, silu: per (token, k) with expert e, "
      "g = alpha1[e] * (qdq(x, gs1[e]) @ W1[e].T) (gs1 = input_global_scale and alpha1 = w1_alpha "
      "* gs1, or both w1_alpha when absent), h = bf16(silu(g[I:]) * g[:I]), y = w2_alpha[e] * "
      "(qdq(h, fc2_input_scale) @ W2[e].T), out = bf16(sum_k scale * y); qdq per 16 values with an "
      "e4m3 scale; weights e2m1 pairs times e4m3 scales per 16, linear as the shapes say.";
  push_with_wrapper(v, "b12x_fused_moe", "B12xMoEWrapper.run", "b12x_moe_wrapper",
                    "quantization:fp4", desc, ref, axes, inputs);
}

// cute_dsl_fused_moe_nvfp4 and CuteDslMoEWrapper.run: upstream's newest moe.py (0107a67) traces
// them with the generic cute_dsl_fused_moe template, whose inputs (activation_format,
// weight_format, weight_interleave, w1_bias, w2_bias) are not parameters of these ops; the
// stored version whose cute_dsl_fused_moe_nvfp4_trace reads only their parameters is followed
// (docs/TRACE.md names it): x_sf and fc2_input_scale required, a trailing variable axis "one".
void add_cute_dsl(std::vector<Template>& v) {
  auto inputs = [](bool wrapper) {
    const CuteDslIo io = cute_dsl_io(wrapper);
    const std::vector<std::string> xs = {"num_tokens", "num_packed_hidden"},
                                   xss = {"num_tokens", "num_fp4_hidden_blocks"};
    Io off = S("local_expert_offset", "int32").opt();
    if (wrapper) off.plan();
    return std::vector<Io>{T("x", xs).synth("uint8").init(packed(xs)),
                           T("x_sf", xss).synth("float8_e4m3fn").init(e4m3_scales(xss, "x_sf")),
                           io.selected,
                           io.final_scales,
                           io.w1,
                           io.w1_sf,
                           io.w1_alpha,
                           io.fc2_input_scale,
                           io.w2,
                           io.w2_sf,
                           io.w2_alpha,
                           io.num_experts,
                           io.top_k,
                           off};
  };
  const std::string ref =
      std::string(kMxHelpers) + kFp4Quant + kQdq +
      "def run(x, x_sf=None, token_selected_experts=None, token_final_scales=None, "
      "w1_weight=None,\n"
      "        w1_weight_sf=None, w1_alpha=None, fc2_input_scale=None, w2_weight=None,\n"
      "        w2_weight_sf=None, w2_alpha=None, num_experts=None, top_k=None,\n"
      "        local_expert_offset=None):\n"
      "    xd = _dq4(x, x_sf)\n"
      "    stored = _dq4(w1_weight, w1_weight_sf)\n"
      "    W2 = _dq4(w2_weight, w2_weight_sf)\n"
      "    E, G1, _ = stored.shape\n"
      "    I = G1 // 2\n"
      "    # [linear; gate] rows interleaved in groups of 64: stored row s is plain row p.\n"
      "    s = torch.arange(G1)\n"
      "    p = ((s % 128) // 64) * I + (s // 128) * 64 + s % 64\n"
      "    W1 = torch.empty_like(stored)\n"
      "    W1[:, p] = stored\n"
      "    a1, a2 = _per_expert(w1_alpha, E), _per_expert(w2_alpha, E)\n"
      "    gs2 = _per_expert(fc2_input_scale, E)\n"
      "    off = int(local_expert_offset or 0)\n"
      "    ids, tw = token_selected_experts.long(), token_final_scales.float()\n"
      "    out = torch.zeros((xd.shape[0], W2.shape[1]), dtype=torch.float32)\n"
      "    for e in range(E):\n"
      "        hit = ids == off + e\n"
      "        rows = hit.any(dim=1).nonzero().flatten()\n"
      "        if rows.numel() == 0:\n"
      "            continue\n"
      "        g = a1[e] * (xd[rows] @ W1[e].t())\n"
      "        act = torch.nn.functional.silu(g[:, I:]) * g[:, :I]\n"
      "        y = a2[e] * (_qdq(act, gs2[e]) @ W2[e].t())\n"
      "        out[rows] += (tw[rows] * hit[rows].float()).sum(dim=1, keepdim=True) * y\n"
      "    return out.to(torch.bfloat16)\n";
  const char* desc =
      "CuTe-DSL NVFP4 fused MoE (w4a4, SwiGLU at its defaults alpha 1, beta 0, no limit): x and "
      "the weights e2m1 pairs times e4m3 scales per 16 (linear, as the shapes say), w1's [linear; "
      "gate] rows interleaved in groups of 64; per (token, k) with local expert e, g = "
      "w1_alpha[e] * (x @ W1[e].T), act = silu(g[I:]) * g[:I] in fp32, NVFP4 with global scale "
      "fc2_input_scale, y = w2_alpha[e] * (act_q @ W2[e].T), out = bf16(sum_k scale * y).";
  push_with_wrapper(
      v, "cute_dsl_fused_moe_nvfp4", "CuteDslMoEWrapper.run", "cute_dsl_moe_wrapper",
      "quantization:nvfp4", desc, ref,
      [](bool wrapper) { return cute_dsl_axes(wrapper, 64, 32, 4); }, inputs);
}

// The SM90 mixed-input weight preparation (flashinfer.fused_moe.prepare): moe.py at 0107a67,
// op_type "moe_preprocess", every axis variable, no status tag (upstream's). Humming has two
// templates by `interleave` (upstream's dispatch: True, the default, the folded layouts; False
// the logical ones). Our references follow docs/MOE.md "SM90 mixed-input weight layouts".
const char* const kSm90Prep = R"PY(import struct

_FP4_MOVES = [(0, 6), (1, 7), (2, 8), (3, 15), (4, 22), (5, 23), (6, 24), (7, 31), (8, 3), (9, 4),
              (10, 5), (11, 12), (12, 19), (13, 20), (14, 21), (15, 28), (16, 0), (17, 1), (18, 2),
              (19, 9), (20, 16), (21, 17), (22, 18), (23, 25), (24, 13), (25, 10), (26, 11),
              (27, 14), (28, 29), (29, 26), (30, 27), (31, 30)]


def _fold_scales(scales, group_size):
    # out[e, rb, kb, f, m * G + g] = in[e, rb * 64 + m * folded_m + f, kb * G + g]
    E, rows, kg = scales.shape
    G = 128 // int(group_size)
    cols = 128 // (scales.element_size() * 8)
    ms = cols // G
    fm = 64 // ms
    t = scales.contiguous().reshape(E, rows // 64, ms, fm, kg // G, G)
    return t.permute(0, 1, 4, 3, 2, 5).contiguous().reshape(E, rows // 64, kg // G, fm, cols)


def _interleave_weights(weight, quant_type):
    # Rows in pairs (r, r + 8), K in partitions of 64 values, 16 lanes per (pair, partition).
    E, n, nb = weight.shape
    src = weight.contiguous().tolist()
    out = [[[0] * nb for _ in range(n)] for _ in range(E)]
    for e in range(E):
        W, O = src[e], out[e]
        for b in range(n // 2):
            r = b // 8 * 16 + b % 8
            for q in range(nb // 32):
                for l in range(16):
                    if quant_type == "fp4":
                        c = 32 * q + 8 * (l // 4) + l % 4
                        word = W[r][c] | W[r + 8][c] << 8 | W[r][c + 4] << 16 | W[r + 8][c + 4] << 24
                        v = 0
                        for sb, db in _FP4_MOVES:
                            v |= ((word >> sb) & 1) << db
                        row, base = r + 8 * ((l // 4) % 2), 32 * q + 16 * (l // 8) + 4 * (l % 4)
                    else:
                        u = 16 * q + l
                        v = (W[r][2 * u] | W[r][2 * u + 1] << 8
                             | (W[r + 8][2 * u] | W[r + 8][2 * u + 1] << 8) << 16)
                        if quant_type == "fp4_fp8":
                            # Magnitudes stay; the sign of nibble j moves to nibble 2j+1 (j < 4)
                            # or 2(j - 4).
                            sign = 0
                            for j in range(8):
                                if (v >> (4 * j + 3)) & 1:
                                    sign |= 1 << (4 * (2 * j + 1 if j < 4 else 2 * (j - 4)) + 3)
                            v = (v & 0x77777777) | sign
                        elif quant_type != "int4":
                            raise ValueError("quant_type " + str(quant_type))
                        row, base = r + 8 * ((l % 8) // 4), 2 * (16 * q + 8 * (l // 8) + 2 * (l % 4))
                    for i in range(4):
                        O[row][base + i] = (v >> (8 * i)) & 255
    return torch.tensor(out, dtype=torch.uint8).reshape(E, n, nb)


def _f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _humming_table(deltas):
    # Code c of a block with scale delta d: -0 becomes 0; for d > 0 the code read as the fp32
    # pattern sign << 31 | (e, m) << 22 times the pattern 0x3F800000 - (d << 23) (Python floats),
    # rounded back to the (e, m) field: truncation or +0x00200000, the nearer (ties up). Only
    # the rows of the deltas used are filled.
    t = torch.zeros((256, 16), dtype=torch.uint8)
    mask = 0x81C00000
    for d in deltas:
        f = _f32(0x3F800000 - (d << 23))
        for c in range(16):
            code = 0 if c == 8 else c
            if d:
                v = _f32(((code & 8) << 28) | ((code & 7) << 22)) * f
                vb = _bits(v)
                lo, hi = vb & mask, (vb + 0x00200000) & mask
                pick = hi if abs(v - _f32(lo)) >= abs(v - _f32(hi)) else lo
                code = ((pick >> 28) & 8) | ((pick >> 22) & 7)
            t[d, c] = code
    return t


def _humming(weight, raw_scale, max_range):
    E, rows, nb = weight.shape
    s = raw_scale.long().reshape(E, -1)
    hi = s.max(dim=1, keepdim=True).values
    low = hi - torch.clamp(hi - s.min(dim=1, keepdim=True).values, max=int(max_range))
    clamped = torch.maximum(s, low)
    offset = ((clamped - low + 1) & 15).to(torch.uint8).reshape(raw_scale.shape)
    residual = torch.exp2(low.reshape(E).float() - 127.0) * 0.5
    delta = (clamped - s).reshape(E, rows, -1).repeat_interleave(32, dim=2)
    w = weight.long()
    codes = torch.stack([w & 15, w >> 4], dim=-1).reshape(E, rows, nb * 2)
    new = _humming_table(sorted(set(delta.flatten().tolist()))).long()[delta, codes]
    packed = (new[..., 0::2] | (new[..., 1::2] << 4)).to(torch.uint8)
    return packed, offset, residual


)PY";

void add_sm90_prep(std::vector<Template>& v) {
  const std::vector<std::string> w = {"num_experts", "rows", "packed_k"},
                                 sc = {"num_experts", "rows", "scale_groups"},
                                 folded = {"num_experts", "m64_blocks", "k128_blocks", "folded_m",
                                           "physical_cols"};
  // Defaults: 2 experts of 64 rows, K = 128 (one K128 block); uint8 scales of group 32 fold
  // into 16 rows of 16 columns.
  auto prep_axes = [] {
    return std::vector<Axis>{var("num_experts", "", 2), var("rows", "", 64),
                             var("packed_k", "", 64), var("scale_groups", "", 4)};
  };
  auto folded_axes = [] {
    return std::vector<Axis>{var("m64_blocks", "", 1), var("k128_blocks", "", 1),
                             var("folded_m", "", 16), var("physical_cols", "", 16)};
  };
  for (const bool interleave : {true, false}) {
    std::vector<Axis> axes = prep_axes();
    if (interleave) {
      for (Axis a : folded_axes()) axes.push_back(std::move(a));
    }
    v.push_back(
        {.op = "preprocess_moe_weights_for_sm90_mixed_gemm_humming",
         .op_type = "moe_preprocess",
         .name_prefix = interleave ? "sm90_mixed_gemm_humming_weight_preprocess"
                                   : "sm90_mixed_gemm_humming_weight_preprocess_logical",
         .description = std::string("Humming MXFP4 preparation for the SM90 FP8-activation path: "
                                    "per expert the E8M0 scales clamped to max_range below their "
                                    "max (offset (clamped - low + 1) & 15, residual 2^(low - "
                                    "127) / 2), each FP4 code rewritten for its block's clamp "
                                    "delta") +
                        (interleave ? "; then the fp4_fp8 weight interleave and the group-32 "
                                      "scale fold."
                                    : " (logical layouts)."),
         .axes = axes,
         .inputs = {T("weight", w).synth("uint8").init(packed(w)),
                    T("raw_scale", sc)
                        .synth("uint8")
                        .init("torch.randint(112, 140, (num_experts, rows, scale_groups), "
                              "dtype=torch.uint8)"),
                    S("max_range", "int32").init("4"),
                    S("interleave", "bool").init(interleave ? "True" : "False")},
         .outputs = {T("processed_weight", w).like("weight"),
                     T("processed_scale", interleave ? folded : sc).like("raw_scale"),
                     T("residual", {"num_experts"}).dt("float32")},
         .constraints = {"packed_k == scale_groups * 16"},
         .tags = {"moe:sm90", "quantization:mxfp4"},
         .reference = std::string(kSm90Prep) +
                      "def run(weight, raw_scale, max_range=11, interleave=True):\n"
                      "    w, offset, residual = _humming(weight, raw_scale, max_range)\n"
                      "    if not interleave:\n"
                      "        return w, offset, residual\n"
                      "    return _interleave_weights(w, \"fp4_fp8\"), _fold_scales(offset, 32), "
                      "residual\n",
         .select_param = "interleave",
         .select_values = {interleave ? 1 : 0},
         .select_default = 1});
  }
  std::vector<Axis> axes = {var("num_experts", "", 2), var("rows", "", 64),
                            var("scale_groups", "", 4)};
  for (Axis a : folded_axes()) axes.push_back(std::move(a));
  v.push_back({.op = "interleave_moe_scales_for_sm90_mixed_gemm",
               .op_type = "moe_preprocess",
               .name_prefix = "sm90_mixed_gemm_scale_interleave",
               .description = "Weight scales folded for the SM90 mixed-input MoE GEMM: G = 128 / "
                              "group_size groups per K128 block, cols = 16 bytes of elements, "
                              "ms = cols / G, folded_m = 64 / ms; out[e, rb, kb, f, m * G + g] = "
                              "in[e, rb * 64 + m * folded_m + f, kb * G + g].",
               .axes = axes,
               .inputs = {T("scales", sc)
                              .synth("uint8")
                              .init("torch.randint(0, 256, (num_experts, rows, scale_groups), "
                                    "dtype=torch.uint8)"),
                          S("group_size", "int32").init("32")},
               .outputs = {T("interleaved_scales", folded).like("scales")},
               .tags = {"moe:sm90", "layout:folded_scale"},
               .reference = std::string(kSm90Prep) +
                            "def run(scales, group_size=32):\n"
                            "    return _fold_scales(scales, group_size)\n"});
  v.push_back({.op = "interleave_moe_weights_for_sm90_mixed_gemm",
               .op_type = "moe_preprocess",
               .name_prefix = "sm90_mixed_gemm_weight_interleave",
               .description = "Packed 4-bit MoE weights interleaved for the SM90 mixed-input GEMM "
                              "(quant_type fp4, fp4_fp8 or int4): rows in pairs (r, r + 8), K in "
                              "partitions of 64 values, 16 lanes each; fp4 moves the bits of "
                              "4-byte groups, int4 moves 16-bit units, fp4_fp8 as int4 with the "
                              "sign of nibble j moved to nibble 2j + 1 (j < 4) or 2 (j - 4).",
               .axes = {var("num_experts", "", 2), var("rows", "", 32), var("packed_k", "", 32)},
               .inputs = {T("weight", w).synth("uint8").init(packed(w)),
                          S("quant_type", "str").init("\"fp4\"")},
               .outputs = {T("interleaved_weight", w).like("weight")},
               .tags = {"moe:sm90", "layout:mixed_input"},
               .reference = std::string(kSm90Prep) +
                            "def run(weight, quant_type=\"fp4\"):\n"
                            "    return _interleave_weights(weight, quant_type)\n"});
}

}  // namespace

void add_moe_entry_points(std::vector<Template>& v) {
  add_trtllm(v);
  add_cutlass_and_hash(v);
  add_b12x(v);
  add_cute_dsl(v);
  add_sm90_prep(v);
}

}  // namespace flashinfer::trace::detail
