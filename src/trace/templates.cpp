// The trace annotations: one template per traced op, found by the op's declared name. Each says
// which dimensions are variable axes and which constants (with the abbreviation the definition
// name uses), where each input comes from among the op's declared parameters, and our own
// PyTorch `reference` (a `run` function over the definition's inputs, fp32 math). Names, axes,
// inputs and outputs follow upstream FlashInfer's templates (flashinfer/trace/templates/*.py)
// so that a definition equals upstream's for the same call; tests/trace/data holds upstream's
// own outputs we compare with. To trace another op, add its entry here or in a sibling
// templates_<group>.cpp registered in templates() below (docs/TRACE.md).
#include "trace/template_builders.h"
#include "trace/template_io.h"

namespace flashinfer::trace::detail {

namespace {

// ---------------------------------------------------------------------------------------------
// norm (flashinfer.norm). Epsilon is not an input of upstream's definitions: 1e-6 throughout.

void add_norm(std::vector<Template>& v) {
  // RMSNorm and Gemma's variant (times 1 + weight), alone and after the residual add: the same
  // axes and inputs, the weight term the only difference in the math.
  const auto rms = [&](const char* op, const char* desc, const char* w,
                       std::vector<std::string> tags) {
    v.push_back({.op = op,
                 .op_type = "rmsnorm",
                 .name_prefix = op,
                 .description = desc,
                 .axes = {var("batch_size"), cst("hidden_size", "h")},
                 .inputs = {T("hidden_states", kBH).from("input"), T("weight", {"hidden_size"})},
                 .outputs = {T("output", kBH).like("input")},
                 .tags = std::move(tags),
                 .reference = std::string(R"PY(def run(hidden_states, weight):
    x = hidden_states.float()
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
    return (x * inv * )PY") + w +
                              ").to(hidden_states.dtype)\n"});
  };
  // (Only fused_add_rmsnorm's outputs name the parameters written in place; Gemma's do not.)
  const auto rms_add = [&](const char* op, const char* desc, const char* w, std::vector<Io> outputs,
                           std::vector<std::string> tags) {
    v.push_back({.op = op,
                 .op_type = "rmsnorm",
                 .name_prefix = op,
                 .description = desc,
                 .axes = {var("batch_size"), cst("hidden_size", "h")},
                 .inputs = {T("hidden_states", kBH).from("input"), T("residual", kBH),
                            T("weight", {"hidden_size"})},
                 .outputs = std::move(outputs),
                 .tags = std::move(tags),
                 .reference = std::string(R"PY(def run(hidden_states, residual, weight):
    x = hidden_states.float() + residual.float()
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
    y = x * inv * )PY") + w + R"PY(
    return y.to(hidden_states.dtype), x.to(residual.dtype)
)PY"});
  };
  rms("rmsnorm", "RMSNorm of each row times weight; eps 1e-6.", "weight.float()",
      {"status:verified"});
  rms_add("fused_add_rmsnorm",
          "residual += input, then RMSNorm of residual times weight; eps 1e-6.", "weight.float()",
          {T("output", kBH).writes("input").like("input"),
           T("residual", kBH)
               .writes("residual")
               .like("input")
               .desc("The residual after the add (written in place).")},
          {"status:verified", "fused"});
  rms("gemma_rmsnorm", "Gemma RMSNorm: RMSNorm(x) * (1 + weight); eps 1e-6.",
      "(1.0 + weight.float())", {"status:verified", "model:gemma"});
  rms_add("gemma_fused_add_rmsnorm", "residual += input, then Gemma RMSNorm of residual; eps 1e-6.",
          "(1.0 + weight.float())",
          {T("output", kBH).like("input"), T("residual", kBH).like("input")},
          {"status:verified", "fused", "model:gemma"});
  // The fp8 output's dtype: upstream declares none, so it resolves to the input's (as here).
  const std::string quant_ref_head = R"PY(def _to_fp8(y, scale):
    s = scale.float().reshape(()) if isinstance(scale, torch.Tensor) else float(scale)
    y = (y / s).clamp(-448.0, 448.0)
    fp8 = getattr(torch, "float8_e4m3fn", None)
    return y.to(fp8) if fp8 is not None else y

)PY";
  v.push_back(
      {.op = "rmsnorm_quant",
       .op_type = "rmsnorm",
       .name_prefix = "rmsnorm_quant",
       .description = "RMSNorm times weight, divided by scale and cast to fp8 e4m3; eps 1e-6.",
       .axes = {var("batch_size"), cst("hidden_size", "h")},
       .inputs = {T("hidden_states", kBH).from("input"), T("weight", {"hidden_size"}),
                  S("scale", "float32").desc("Per-tensor scale.")},
       .outputs = {T("out", kBH).desc("Quantized output (the preallocated out tensor).")},
       .tags = {"status:verified", "quantization:fp8"},
       .reference = quant_ref_head + R"PY(def run(hidden_states, weight, scale):
    x = hidden_states.float()
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
    return _to_fp8(x * inv * weight.float(), scale)
)PY"});
  v.push_back({.op = "fused_add_rmsnorm_quant",
               .op_type = "rmsnorm",
               .name_prefix = "fused_add_rmsnorm_quant",
               .description = "residual += input; out = fp8(RMSNorm(residual) * weight / scale).",
               .axes = {var("batch_size"), cst("hidden_size", "h")},
               .inputs = {T("hidden_states", kBH).from("input"), T("residual", kBH),
                          T("weight", {"hidden_size"}), S("scale", "float32")},
               .outputs = {T("out", kBH), T("residual", kBH).like("input")},
               .tags = {"status:verified", "fused", "quantization:fp8"},
               .reference = quant_ref_head + R"PY(def run(hidden_states, residual, weight, scale):
    x = hidden_states.float() + residual.float()
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
    return _to_fp8(x * inv * weight.float(), scale), x.to(residual.dtype)
)PY"});
  v.push_back({.op = "layernorm",
               .op_type = "layernorm",
               .name_prefix = "layernorm",
               .description = "LayerNorm with fp32 gamma and beta; eps 1e-6.",
               .axes = {var("batch_size"), cst("hidden_size", "h")},
               .inputs = {T("hidden_states", kBH).from("input"),
                          T("weight", {"hidden_size"}).from("gemma").synth("float32"),
                          T("bias", {"hidden_size"}).from("beta").synth("float32")},
               .outputs = {T("output", kBH).like("input")},
               .tags = {"status:verified"},
               .reference = R"PY(def run(hidden_states, weight, bias):
    x = hidden_states.float()
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + 1e-6) * weight.float() + bias.float()
    return y.to(hidden_states.dtype)
)PY"});
  v.push_back({.op = "layernorm_quant",
               .op_type = "layernorm",
               .name_prefix = "layernorm_quant",
               .description = "LayerNorm with fp32 gamma and beta, divided by scale and cast to "
                              "fp8 e4m3; eps 1e-6.",
               .axes = {var("batch_size"), cst("hidden_size", "h")},
               .inputs = {T("hidden_states", kBH).from("input"),
                          T("weight", {"hidden_size"}).from("gemma").synth("float32"),
                          T("bias", {"hidden_size"}).from("beta").synth("float32"),
                          S("scale", "float32").desc("Per-tensor quantization scale.")},
               .outputs = {T("out", kBH)
                               .like("out")
                               .dt("float8_e4m3fn")
                               .desc("Quantized output (the preallocated out tensor).")},
               .tags = {"status:verified", "quantization:fp8"},
               .reference = quant_ref_head + R"PY(def run(hidden_states, weight, bias, scale):
    x = hidden_states.float()
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    return _to_fp8((x - mean) * torch.rsqrt(var + 1e-6) * weight.float() + bias.float(), scale)
)PY"});
  v.push_back({.op = "fused_rmsnorm_silu",
               .op_type = "rmsnorm",
               .name_prefix = "fused_rmsnorm_silu",
               .description = "SiLU(RMSNorm(input) * weight).",
               .axes = {var("num_tokens"), cst("hidden_size", "h")},
               .inputs = {T("input", {"num_tokens", "hidden_size"}), T("weight", {"hidden_size"}),
                          S("eps", "float32").opt()},
               .outputs = {T("output", {"num_tokens", "hidden_size"}).like("input")},
               .tags = {"status:verified", "fused"},
               .reference = R"PY(def run(input, weight, eps=1e-6):
    x = input.float()
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + float(eps)) * weight.float()
    return (y * torch.sigmoid(y)).to(input.dtype)
)PY"});
}

// ---------------------------------------------------------------------------------------------
// activation (flashinfer.activation). hidden_size is the input's last dim (2 * the output's),
// as upstream reads it.

void add_activation(std::vector<Template>& v) {
  auto gated = [&](const char* op, const char* what, const char* act) {
    v.push_back({.op = op,
                 .op_type = "activation",
                 .name_prefix = op,
                 .description = std::string(what) + "(x[..., :H]) * x[..., H:], H = hidden_size/2.",
                 .axes = {var("num_tokens"), cst("hidden_size", "h", "Last dim of the input.")},
                 .inputs = {T("input", {"num_tokens", "hidden_size"})},
                 .outputs = {T("output", {"num_tokens", "hidden_size"}).like("input")},
                 .tags = {"status:verified", "fused"},
                 .reference = std::string(R"PY(def run(input):
    h = input.shape[-1] // 2
    x = input[..., :h].float()
    g = )PY") + act + R"PY(
    return (g * input[..., h:].float()).to(input.dtype)
)PY"});
  };
  gated("silu_and_mul", "silu", "x * torch.sigmoid(x)");
  gated("gelu_tanh_and_mul", "gelu_tanh",
        "0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))");
  gated("gelu_and_mul", "gelu", "0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))");
}

// ---------------------------------------------------------------------------------------------
// cascade (flashinfer.cascade): lse in base 2.

const char* kMergeTwo = R"PY(def _merge(v_a, s_a, v_b, s_b):
    sa, sb = s_a.float(), s_b.float()
    m = torch.maximum(sa, sb)
    wa, wb = torch.exp2(sa - m), torch.exp2(sb - m)
    v = (v_a.float() * wa.unsqueeze(-1) + v_b.float() * wb.unsqueeze(-1)) / (wa + wb).unsqueeze(-1)
    return v, m + torch.log2(wa + wb)

)PY";

void add_cascade(std::vector<Template>& v) {
  const std::vector<std::string> shd = {"seq_len", "num_heads", "head_dim"};
  const std::vector<std::string> sh = {"seq_len", "num_heads"};
  v.push_back({.op = "merge_state",
               .op_type = "cascade_merge",
               .name_prefix = "merge_state",
               .description = "Merges two attention states (v, base-2 lse).",
               .axes = {var("seq_len"), cst("num_heads", "h"), cst("head_dim", "d")},
               .inputs = {T("v_a", shd), T("s_a", sh).dt("float32"), T("v_b", shd),
                          T("s_b", sh).dt("float32")},
               .outputs = {T("v_merged", shd).like("v_a"), T("s_merged", sh).dt("float32")},
               .tags = {"status:verified"},
               .reference = std::string(kMergeTwo) + R"PY(def run(v_a, s_a, v_b, s_b):
    v, s = _merge(v_a, s_a, v_b, s_b)
    return v.to(v_a.dtype), s
)PY"});
  v.push_back(
      {.op = "merge_state_in_place",
       .op_type = "cascade_merge",
       .name_prefix = "merge_state_in_place",
       .description = "Merges (v_other, s_other) into (v, s), rows where mask is set.",
       .axes = {var("seq_len"), cst("num_heads", "h"), cst("head_dim", "d")},
       .inputs = {T("v", shd), T("s", sh).dt("float32"), T("v_other", shd),
                  T("s_other", sh).dt("float32"), T("mask", {"seq_len"}).opt()},
       .outputs = {T("v", shd).like("v"), T("s", sh).dt("float32")},
       .tags = {"status:verified"},
       .reference = std::string(kMergeTwo) + R"PY(def run(v, s, v_other, s_other, mask=None):
    vm, sm = _merge(v, s, v_other, s_other)
    if mask is not None:
        keep = mask.bool()
        vm = torch.where(keep[:, None, None], vm, v.float())
        sm = torch.where(keep[:, None], sm, s.float())
    return vm.to(v.dtype), sm
)PY"});
  v.push_back(
      {.op = "merge_states",
       .op_type = "cascade_merge",
       .name_prefix = "merge_states",
       .description = "Merges num_states attention states (v, base-2 lse) per token.",
       .axes = {var("seq_len"), var("num_states"), cst("num_heads", "h"), cst("head_dim", "d")},
       .inputs = {T("v", {"seq_len", "num_states", "num_heads", "head_dim"}),
                  T("s", {"seq_len", "num_states", "num_heads"}).dt("float32")},
       .outputs = {T("v_merged", shd).like("v"), T("s_merged", sh).dt("float32")},
       .tags = {"status:verified"},
       .reference = R"PY(def run(v, s):
    sf = s.float()
    m = sf.max(dim=1, keepdim=True).values
    w = torch.exp2(sf - m)
    total = w.sum(dim=1)
    vm = (v.float() * w.unsqueeze(-1)).sum(dim=1) / total.unsqueeze(-1)
    return vm.to(v.dtype), m.squeeze(1) + torch.log2(total)
)PY"});
}

// ---------------------------------------------------------------------------------------------
// sampling (flashinfer.sampling) and the top-k transforms. Random draws cannot be compared
// exactly: the references of the sampling ops are deterministic (argmax of the filtered
// distribution), as upstream's own references for the fused samplers are.

const char* kFilters = R"PY(def _per_row(x, n, dtype):
    if isinstance(x, torch.Tensor):
        return x.to(dtype).reshape(-1, 1) if x.numel() > 1 else x.to(dtype).reshape(1, 1).expand(n, 1)
    return torch.full((n, 1), x, dtype=dtype)

def _top_k(p, k):
    k = _per_row(k, p.shape[0], torch.int64).clamp(min=1, max=p.shape[-1])
    kth = torch.sort(p, dim=-1, descending=True).values.gather(-1, k - 1)
    return torch.where(p >= kth, p, torch.zeros_like(p))

def _top_p(p, top_p):
    tp = _per_row(top_p, p.shape[0], torch.float32)
    vals, idx = torch.sort(p, dim=-1, descending=True)
    before = vals.cumsum(dim=-1) - vals
    keep = torch.zeros_like(p, dtype=torch.bool).scatter(-1, idx, before < tp * p.sum(-1, keepdim=True))
    return torch.where(keep, p, torch.zeros_like(p))

def _normalize(p):
    return p / p.sum(dim=-1, keepdim=True).clamp(min=1e-20)

)PY";

void add_sampling(std::vector<Template>& v) {
  const std::vector<std::string> bv = {"batch_size", "vocab_size"};
  const char* kProbs = "torch.softmax(torch.randn(batch_size, vocab_size, device=device), -1)";
  auto probs = [&] { return T("probs", bv).init(kProbs); };
  auto common_axes = [] {
    return std::vector<Axis>{var("batch_size"), cst("vocab_size", "v"),
                             var("num_indices", "Length of the optional indices tensor.")};
  };
  auto indices = [] { return T("indices", {"num_indices"}).dt("int32").opt(); };
  auto sampler = [&](const char* op, const char* prefix, std::vector<Io> inputs, const char* out,
                     const std::string& ref, std::vector<Axis> axes) {
    v.push_back({.op = op,
                 .op_type = "sampling",
                 .name_prefix = prefix,
                 .description = std::string("Sampling: ") + prefix +
                                " (reference: argmax of the filtered distribution).",
                 .axes = std::move(axes),
                 .inputs = std::move(inputs),
                 .outputs = {T("samples", {"batch_size"}).dt(out)},
                 .tags = {"status:verified"},
                 .reference = std::string(kFilters) + ref});
  };
  const std::vector<Axis> bv_axes = {var("batch_size"), cst("vocab_size", "v")};
  sampler("top_k_sampling_from_probs", "top_k_sampling",
          {probs(), T("top_k", {"batch_size"})
                        .synth("int32")
                        .init("torch.full((batch_size,), 20, dtype={dtype:top_k}, device=device)")},
          "int64", R"PY(def run(probs, top_k):
    return _normalize(_top_k(probs.float(), top_k)).argmax(dim=-1)
)PY",
          bv_axes);
  sampler(
      "top_p_sampling_from_probs", "top_p_sampling",
      {probs(), T("top_p", {"batch_size"})
                    .synth("float32")
                    .init("torch.full((batch_size,), 0.9, dtype={dtype:top_p}, device=device)")},
      "int64", R"PY(def run(probs, top_p):
    return _normalize(_top_p(probs.float(), top_p)).argmax(dim=-1)
)PY",
      bv_axes);
  sampler("top_k_top_p_sampling_from_probs", "top_k_top_p_sampling",
          {probs(),
           T("top_k", {"batch_size"})
               .synth("int32")
               .init("torch.full((batch_size,), 20, dtype={dtype:top_k}, device=device)"),
           T("top_p", {"batch_size"})
               .synth("float32")
               .init("torch.full((batch_size,), 0.9, dtype={dtype:top_p}, device=device)")},
          "int64", R"PY(def run(probs, top_k, top_p):
    p = _normalize(_top_k(probs.float(), top_k))
    return _normalize(_top_p(p, top_p)).argmax(dim=-1)
)PY",
          bv_axes);
  sampler("sampling_from_probs", "sampling_from_probs", {probs(), indices()}, "int32",
          R"PY(def run(probs, indices=None):
    p = probs.float() if indices is None else probs.float()[indices.long()]
    return p.argmax(dim=-1).to(torch.int32)
)PY",
          common_axes());
  sampler("sampling_from_logits", "sampling_from_logits", {T("logits", bv), indices()}, "int32",
          R"PY(def run(logits, indices=None):
    p = torch.softmax(logits.float(), dim=-1)
    if indices is not None:
        p = p[indices.long()]
    return p.argmax(dim=-1).to(torch.int32)
)PY",
          common_axes());
  sampler("min_p_sampling_from_probs", "min_p_sampling",
          {probs(), S("min_p", "float32").init("0.1"), indices()}, "int32",
          R"PY(def run(probs, min_p, indices=None):
    p = probs.float() if indices is None else probs.float()[indices.long()]
    mp = _per_row(min_p, p.shape[0], torch.float32)
    p = torch.where(p >= p.max(dim=-1, keepdim=True).values * mp, p, torch.zeros_like(p))
    return _normalize(p).argmax(dim=-1).to(torch.int32)
)PY",
          common_axes());
  sampler("top_k_top_p_sampling_from_logits", "top_k_top_p_sampling_from_logits",
          {T("logits", bv), S("top_k", "int32").init("20"), S("top_p", "float32").init("0.9"),
           indices()},
          "int32", R"PY(def run(logits, top_k, top_p, indices=None):
    p = torch.softmax(logits.float(), dim=-1)
    p = _normalize(_top_p(_normalize(_top_k(p, top_k)), top_p))
    if indices is not None:
        p = p[indices.long()]
    return p.argmax(dim=-1).to(torch.int32)
)PY",
          common_axes());
  auto elementwise = [&](const char* op, std::vector<Io> inputs, const char* out, const char* like,
                         const char* desc, const std::string& ref) {
    v.push_back({.op = op,
                 .op_type = "sampling",
                 .name_prefix = op,
                 .description = desc,
                 .axes = {var("batch_size"), cst("vocab_size", "v")},
                 .inputs = std::move(inputs),
                 .outputs = {T(out, bv).like(like)},
                 .tags = {"status:verified"},
                 .reference = std::string(kFilters) + ref});
  };
  elementwise("softmax", {T("logits", bv), S("temperature", "float32").opt()}, "output", "logits",
              "Softmax of logits / temperature.", R"PY(def run(logits, temperature=None):
    x = logits.float()
    if temperature is not None:
        x = x / _per_row(temperature, x.shape[0], torch.float32)
    return torch.softmax(x, dim=-1).to(logits.dtype)
)PY");
  elementwise("top_p_renorm_probs", {probs(), S("top_p", "float32").init("0.9")}, "renormalized",
              "probs", "Probabilities outside the top-p set zeroed, then renormalized.",
              R"PY(def run(probs, top_p):
    return _normalize(_top_p(probs.float(), top_p)).to(probs.dtype)
)PY");
  elementwise("top_k_renorm_probs", {probs(), S("top_k", "int32").init("20")}, "renormalized",
              "probs", "Probabilities outside the top-k set zeroed, then renormalized.",
              R"PY(def run(probs, top_k):
    return _normalize(_top_k(probs.float(), top_k)).to(probs.dtype)
)PY");
  elementwise("top_k_mask_logits", {T("logits", bv), S("top_k", "int32").init("20")},
              "masked_logits", "logits", "Logits outside the top-k set to -inf.",
              R"PY(def run(logits, top_k):
    x = logits.float()
    kept = _top_k(x - x.min() + 1.0, top_k) > 0
    return torch.where(kept, x, torch.full_like(x, -float("inf"))).to(logits.dtype)
)PY");
  const std::vector<std::string> bsv = {"batch_size", "num_speculative_plus_1", "vocab_size"};
  v.push_back(
      {.op = "chain_speculative_sampling",
       .op_type = "sampling",
       .name_prefix = "chain_speculative_sampling",
       .description = "Chain speculative sampling: accepts draft tokens against the target "
                      "distribution, then emits one more token (reference: deterministic).",
       .axes = {var("batch_size"), var("num_speculative", "", 3),
                var("num_speculative_plus_1", "num_speculative + 1.", 4), cst("vocab_size", "v")},
       .inputs =
           {T("draft_probs", bsv)
                .init("torch.softmax(torch.randn(batch_size, num_speculative_plus_1, vocab_size, "
                      "device=device), -1)"),
            T("draft_token_ids", {"batch_size", "num_speculative"})
                .dt("int32")
                .init("torch.randint(0, vocab_size, (batch_size, num_speculative), "
                      "dtype=torch.int32, device=device)"),
            T("target_probs", bsv)
                .init("torch.softmax(torch.randn(batch_size, num_speculative_plus_1, vocab_size, "
                      "device=device), -1)")},
       .outputs = {T("accepted_token_ids", {"batch_size", "num_speculative_plus_1"}).dt("int32")},
       .tags = {"status:verified", "speculative"},
       .reference = R"PY(def run(draft_probs, draft_token_ids, target_probs):
    b, n = draft_token_ids.shape
    dp, tp = draft_probs.float(), target_probs.float()
    out = torch.full((b, n + 1), -1, dtype=torch.int32)
    for i in range(b):
        j = 0
        while j < n:
            t = int(draft_token_ids[i, j])
            if tp[i, j, t] < dp[i, j, t]:
                break
            out[i, j] = t
            j += 1
        out[i, j] = int(tp[i, j].argmax())
    return out
)PY"});
  const char* kTopkRows = R"PY(def _topk_rows(input, lengths, k):
    rows = input.shape[0]
    out = torch.full((rows, int(k)), -1, dtype=torch.int64)
    for i in range(rows):
        n = min(int(lengths[i]), input.shape[1])
        if n > 0:
            kk = min(int(k), n)
            out[i, :kk] = torch.topk(input[i, :n].float(), kk).indices
    return out

)PY";
  v.push_back(
      {.op = "top_k_ragged_transform",
       .op_type = "sampling",
       .name_prefix = "top_k_ragged_transform",
       .description = "Top-k of each row's first lengths[i] entries, plus offsets[i].",
       .axes = {var("num_rows"), var("max_len"), cst("k", "k")},
       .inputs = {T("input", {"num_rows", "max_len"}).synth("float32"),
                  T("offsets", {"num_rows"})
                      .dt("int32")
                      .init("torch.zeros((num_rows,), dtype=torch.int32, device=device)"),
                  T("lengths", {"num_rows"})
                      .dt("int32")
                      .init("torch.full((num_rows,), max_len, dtype=torch.int32, device=device)"),
                  S("k", "int32").init("k"), S("deterministic", "int32").opt(),
                  S("tie_break", "int32").opt(), S("dsa_graph_safe", "int32").opt()},
       .outputs = {T("indices", {"num_rows", "k"}).dt("int32")},
       .tags = {"status:verified", "sparse"},
       .reference =
           std::string(kTopkRows) +
           R"PY(def run(input, offsets, lengths, k, deterministic=None, tie_break=None, dsa_graph_safe=None):
    idx = _topk_rows(input, lengths, k)
    return torch.where(idx >= 0, idx + offsets.long()[:, None], idx).to(torch.int32)
)PY"});
  v.push_back(
      {.op = "top_k",
       .op_type = "sampling",
       .name_prefix = "top_k",
       .description = "The k largest entries of each row (values and int64 indices); sorted: "
                      "descending values, else ascending index order.",
       .axes = {var("batch_size"), cst("vocab_size", "v"), cst("k", "k")},
       .inputs = {T("input", {"batch_size", "vocab_size"}), S("k", "int32").init("k"),
                  S("sorted", "int32").opt(), S("deterministic", "int32").opt(),
                  S("tie_break", "int32").opt(), S("dsa_graph_safe", "int32").opt()},
       .outputs = {T("values", {"batch_size", "k"}).like("input"),
                   T("indices", {"batch_size", "k"}).dt("int64")},
       .tags = {"status:verified"},
       .reference =
           R"PY(def run(input, k, sorted=None, deterministic=None, tie_break=None, dsa_graph_safe=None):
    top = torch.topk(input.float(), int(k), dim=-1)
    idx = top.indices if sorted else torch.sort(top.indices, dim=-1).values
    return torch.gather(input, -1, idx), idx
)PY"});
  v.push_back(
      {.op = "top_k_page_table_transform",
       .op_type = "sampling",
       .name_prefix = "top_k_page_table_transform",
       .description = "Top-k of each row's first lengths[i] entries, mapped through the row's "
                      "page table.",
       .axes = {var("num_rows"), var("max_len"), var("batch_size"), var("max_pages_per_seq"),
                cst("k", "k")},
       .inputs = {T("input", {"num_rows", "max_len"}).synth("float32"),
                  T("src_page_table", {"batch_size", "max_pages_per_seq"})
                      .dt("int32")
                      .init("torch.arange(batch_size * max_pages_per_seq, dtype=torch.int32, "
                            "device=device).reshape(batch_size, max_pages_per_seq)"),
                  T("lengths", {"num_rows"})
                      .dt("int32")
                      .init("torch.full((num_rows,), min(max_len, max_pages_per_seq), "
                            "dtype=torch.int32, device=device)"),
                  S("k", "int32").init("k"), T("row_to_batch", {"num_rows"}).dt("int32").opt()},
       .outputs = {T("indices", {"num_rows", "k"}).dt("int32")},
       .tags = {"status:verified", "sparse"},
       .reference = std::string(kTopkRows) +
                    R"PY(def run(input, src_page_table, lengths, k, row_to_batch=None):
    idx = _topk_rows(input, lengths, k)
    out = torch.full_like(idx, -1)
    for i in range(idx.shape[0]):
        b = int(row_to_batch[i]) if row_to_batch is not None else min(i, src_page_table.shape[0] - 1)
        sel = idx[i] >= 0
        out[i, sel] = src_page_table[b, idx[i, sel]].long()
    return out.to(torch.int32)
)PY"});
  v.push_back(
      {.op = "fused_topk_deepseek",
       .op_type = "moe_routing",
       .name_prefix = "fused_topk_deepseek",
       .description = "DeepSeek-V3 routing: sigmoid + bias, best groups (sum of each group's top "
                      "2), top-k experts in them, weights normalized and scaled.",
       .axes = {var("num_tokens"), cst("num_experts", "e"), cst("topk", "k")},
       .inputs = {T("scores", {"num_tokens", "num_experts"}).synth("float32"),
                  T("bias", {"num_experts"}).synth("float32"), S("n_group", "int32").init("1"),
                  S("topk_group", "int32").init("1"), S("topk", "int32").init("topk"),
                  S("routed_scaling_factor", "float32"),
                  T("topk_values", {"num_tokens", "topk"}).synth("float32"),
                  T("topk_indices", {"num_tokens", "topk"}).dt("int32")},
       .outputs = {T("topk_values", {"num_tokens", "topk"}).like("scores"),
                   T("topk_indices", {"num_tokens", "topk"}).dt("int32")},
       .tags = {"status:verified", "moe"},
       .reference =
           R"PY(def run(scores, bias, n_group, topk_group, topk, routed_scaling_factor, topk_values=None, topk_indices=None):
    t, e = scores.shape
    sig = torch.sigmoid(scores.float())
    biased = sig + bias.float()[None, :]
    groups = biased.reshape(t, int(n_group), e // int(n_group))
    group_score = groups.topk(min(2, groups.shape[-1]), dim=-1).values.sum(-1)
    best = group_score.topk(int(topk_group), dim=-1).indices
    allowed = torch.zeros(t, int(n_group), dtype=torch.bool).scatter(1, best, True)
    allowed = allowed[:, :, None].expand_as(groups).reshape(t, e)
    idx = torch.where(allowed, biased, torch.full_like(biased, -float("inf"))).topk(int(topk), dim=-1).indices
    w = sig.gather(1, idx)
    w = w / w.sum(dim=-1, keepdim=True) * float(routed_scaling_factor)
    return w.to(scores.dtype), idx.to(torch.int32)
)PY"});
}

// ---------------------------------------------------------------------------------------------
// attention: the decode wrapper's run (flashinfer.decode). kv_indptr / kv_indices / sm_scale are
// given to plan(), not run(): optional inputs whose dtype a run() call cannot tell.

void add_attention(std::vector<Template>& v) {
  const std::vector<std::string> qhd = {"batch_size", "num_qo_heads", "head_dim"};
  const std::vector<std::string> cache = {"num_pages", "page_size", "num_kv_heads", "head_dim"};
  v.push_back(
      {.op = "BatchDecodeWithPagedKVCacheWrapper.run",
       .op_type = "gqa_paged",
       .name_prefix = "gqa_paged_decode",
       .description = "Batched GQA decode (one query per request) over a paged KV cache given as "
                      "(k_cache, v_cache); the page table comes from plan().",
       .axes = {var("batch_size", "", 2), cst("num_qo_heads", "h"), cst("num_kv_heads", "kv"),
                cst("head_dim", "d"), var("num_pages", "", 6), cst("page_size", "ps"),
                var("len_indptr", "Length of kv_indptr."),
                var("num_kv_indices", "Number of page indices.")},
       .inputs = {T("q", qhd), T("k_cache", cache).from("paged_kv_cache").item(0),
                  T("v_cache", cache).from("paged_kv_cache").item(1),
                  T("kv_indptr", {"len_indptr"})
                      .plan()
                      .synth("int32")
                      .init("torch.arange(batch_size + 1, dtype=torch.int32, device=device) * "
                            "max(num_pages // batch_size, 1)")
                      .desc("Page offsets of each request (given to plan())."),
                  T("kv_indices", {"num_kv_indices"})
                      .plan()
                      .synth("int32")
                      .init("torch.arange(int(kv_indptr[-1]), dtype=torch.int32, device=device) "
                            "% num_pages")
                      .desc("Page ids (given to plan())."),
                  S("sm_scale", "float32")
                      .plan()
                      .init("1.0 / math.sqrt(head_dim)")
                      .desc("Softmax scale, 1/sqrt(head_dim) unless plan() says otherwise."),
                  // run()'s return_lse (upstream's template: an optional int32 scalar), which
                  // decides whether lse is returned: hence lse is an optional output.
                  S("return_lse", "int32").opt().desc("Bool: also return the LSE.")},
       .outputs = {T("output", qhd).like("q"), T("lse", {"batch_size", "num_qo_heads"})
                                                   .opt()
                                                   .dt("float32")
                                                   .desc("Base-2 log-sum-exp of the scores.")},
       .constraints = {"len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"},
       .tags = {"stage:decode", "status:verified"},
       .reference = R"PY(def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None,
        return_lse=None):
    b, h, d = q.shape
    kvh = k_cache.shape[2]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    out = torch.zeros((b, h, d), dtype=torch.float32)
    lse = torch.full((b, h), -float("inf"), dtype=torch.float32)
    for i in range(b):
        pages = kv_indices[int(kv_indptr[i]):int(kv_indptr[i + 1])].long()
        if pages.numel() == 0:
            continue
        k = k_cache[pages].reshape(-1, kvh, d).float()
        v = v_cache[pages].reshape(-1, kvh, d).float()
        for j in range(h):
            g = j // (h // kvh)
            s = (k[:, g] @ q[i, j].float()) * scale
            lse[i, j] = torch.logsumexp(s, 0) / math.log(2.0)
            out[i, j] = torch.softmax(s, 0) @ v[:, g]
    return out.to(q.dtype), lse
)PY"});
}

// ---------------------------------------------------------------------------------------------
// rope (flashinfer.rope): ragged (indptr + offsets) or per-token pos_ids, plain or Llama 3.1
// frequencies, out of place (q_rope, k_rope) or in place (q, k).

void add_rope(std::vector<Template>& v) {
  for (bool llama : {false, true}) {
    for (bool ragged : {true, false}) {
      for (bool inplace : {false, true}) {
        std::string suffix = std::string(ragged ? "" : "_pos_ids") + (inplace ? "_inplace" : "");
        const std::string op = std::string(llama ? "apply_llama31_rope" : "apply_rope") + suffix;
        const std::string prefix = std::string(llama ? "llama31_rope" : "rope") + suffix;
        const std::vector<std::string> q = {"nnz", "num_q_heads", "head_dim"};
        const std::vector<std::string> k = {"nnz", "num_k_heads", "head_dim"};
        std::vector<Axis> axes = {var("nnz", "Tokens in the batch.")};
        if (ragged) axes.push_back(var("batch_size", "", 2));
        axes.push_back(cst("num_q_heads", "h"));
        axes.push_back(cst("num_k_heads", "kv"));
        axes.push_back(cst("head_dim", "d"));
        if (ragged) axes.push_back(var("batch_size_plus_1", "batch_size + 1.", 3));
        std::vector<Io> in = {T("q", q), T("k", k)};
        if (ragged) {
          in.push_back(T("indptr", {"batch_size_plus_1"})
                           .dt("int32")
                           .init("torch.arange(batch_size_plus_1, dtype=torch.int32, "
                                 "device=device) * (nnz // batch_size)"));
          in.push_back(T("offsets", {"batch_size"})
                           .dt("int32")
                           .init("torch.arange(batch_size, dtype=torch.int32, device=device) * 7"));
        } else {
          in.push_back(T("pos_ids", {"nnz"})
                           .dt("int32")
                           .init("torch.arange(nnz, dtype=torch.int32, device=device) * 5"));
        }
        in.push_back(S("rotary_dim", "int32").opt());
        in.push_back(S("interleave", "int32").opt());
        in.push_back(S("rope_scale", "float32").opt());
        in.push_back(S("rope_theta", "float32").opt());
        if (llama) {
          in.push_back(S("low_freq_factor", "float32").opt());
          in.push_back(S("high_freq_factor", "float32").opt());
          in.push_back(S("old_context_len", "int32").opt());
        }
        std::vector<Io> out = {T(inplace ? "q" : "q_rope", q).like("q"),
                               T(inplace ? "k" : "k_rope", k).like("k")};
        if (inplace) {
          out[0].writes("q");
          out[1].writes("k");
        }
        std::string sig = ragged ? "q, k, indptr, offsets" : "q, k, pos_ids";
        sig += llama ? ", rotary_dim=None, interleave=None, rope_scale=8, rope_theta=500000.0, "
                       "low_freq_factor=1, high_freq_factor=4, old_context_len=8192"
                     : ", rotary_dim=None, interleave=None, rope_scale=1, rope_theta=10000.0";
        std::string ref = std::string(kRopeHelpers) + "def run(" + sig + "):\n" +
                          "    dim = q.shape[-1] if rotary_dim is None else int(rotary_dim)\n" +
                          (llama ? "    f = _freqs(dim, rope_theta, rope_scale, (low_freq_factor, "
                                   "high_freq_factor, old_context_len))\n"
                                 : "    f = _freqs(dim, rope_theta, rope_scale)\n") +
                          (ragged ? "    pos = _ragged_positions(indptr, offsets, q.shape[0])\n"
                                  : "    pos = pos_ids.long()\n") +
                          "    il = bool(interleave)\n" +
                          "    return _rotate(q, pos, f, il), _rotate(k, pos, f, il)\n";
        Template t{.op = op,
                   .op_type = "rope",
                   .name_prefix = prefix,
                   .description = std::string(llama ? "Llama 3.1 RoPE" : "RoPE") +
                                  (ragged ? " at positions offsets[b] + i of each request"
                                          : " at per-token positions pos_ids") +
                                  (inplace ? ", q and k rotated in place." : "."),
                   .axes = std::move(axes),
                   .inputs = std::move(in),
                   .outputs = std::move(out),
                   .tags = {"status:verified"},
                   .reference = std::move(ref)};
        if (ragged) t.constraints = {"batch_size_plus_1 == batch_size + 1"};
        if (llama) t.tags.push_back("model:llama");
        v.push_back(std::move(t));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// page (flashinfer.page): the cache parameter is a (k, v) tuple or one tensor; its dims are read
// from the parameter itself, so a tuple leaves page_size without a value, as upstream's does.

void add_page(std::vector<Template>& v) {
  const std::vector<std::string> kv = {"nnz_kv", "num_kv_heads", "head_dim"};
  const std::vector<std::string> cache = {"num_pages", "page_size", "num_kv_heads", "head_dim"};
  v.push_back(
      {.op = "append_paged_kv_cache",
       .op_type = "page_append",
       .name_prefix = "append_paged_kv_cache",
       .description = "Writes each appended (key, value) row into its request's page at its "
                      "position.",
       .axes = {var("nnz_kv", "Rows appended."), cst("num_kv_heads", "kv"), cst("head_dim", "d"),
                var("num_pages"), cst("page_size", "ps"), var("batch_size", "", 2),
                var("batch_size_plus_1", "batch_size + 1.", 3),
                var("num_kv_indices", "Length of kv_indices.")},
       .inputs =
           [&] {
             std::vector<Io> in = {T("append_key", kv), T("append_value", kv)};
             for (Io& io : append_row_slots(Int32As::kDtype)) in.push_back(std::move(io));
             in.push_back(T("paged_kv_cache", cache)
                              .init("torch.zeros((num_pages, page_size, num_kv_heads, head_dim), "
                                    "device=device).to(append_key.dtype)"));
             for (Io& io : append_page_table(Int32As::kDtype)) in.push_back(std::move(io));
             return in;
           }(),
       .outputs = {T("paged_kv_cache", cache).like("append_key").writes("paged_kv_cache")},
       .constraints = {"batch_size_plus_1 == batch_size + 1"},
       .tags = {"status:verified"},
       // The definition describes the cache as one [num_pages, page_size, heads, dim] tensor:
       // given that, the keys are appended to it; a (k, v) pair or the 5-D combined layout
       // receives both.
       .reference =
           R"PY(def run(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr, kv_last_page_len):
    if isinstance(paged_kv_cache, (tuple, list)):
        caches = [(paged_kv_cache[0], append_key), (paged_kv_cache[1], append_value)]
    elif paged_kv_cache.dim() == 5:
        caches = [(paged_kv_cache[:, 0], append_key), (paged_kv_cache[:, 1], append_value)]
    else:
        caches = [(paged_kv_cache, append_key)]
    for cache, rows in caches:
        ps = cache.shape[1]
        for i in range(batch_indices.shape[0]):
            b, p = int(batch_indices[i]), int(positions[i])
            page = int(kv_indices[int(kv_indptr[b]) + p // ps])
            cache[page, p % ps] = rows[i].to(cache.dtype)
    return paged_kv_cache
)PY"});
}

// ---------------------------------------------------------------------------------------------
// gemm (flashinfer.gemm): mm_bf16 takes b as [K, N], column-major (a transposed [N, K] tensor),
// which is how init builds it.

void add_gemm(std::vector<Template>& v) {
  v.push_back({.op = "mm_bf16",
               .op_type = "gemm_bf16",
               .name_prefix = "gemm_bf16",
               .description = "C = A @ B with B given as [K, N].",
               .axes = {var("M"), cst("N", "N"), cst("K", "K")},
               .inputs = {T("A", {"M", "K"}).from("a"),
                          T("B", {"K", "N"})
                              .from("b")
                              .init("torch.randn((N, K), device=device).to({dtype:B}).t()")},
               .outputs = {T("C", {"M", "N"})},
               .tags = {"status:verified"},
               .reference = R"PY(def run(A, B):
    return (A.float() @ B.float()).to(A.dtype)
)PY"});
  // gemm_fp8_nt_groupwise: upstream's template describes one scale layout (a_scale [M, K/bk],
  // b_scale [K/bk, N/bk]); calls in the other layouts name the same axes, only the variable
  // block counts read differently.
  v.push_back({.op = "gemm_fp8_nt_groupwise",
               .op_type = "gemm_fp8",
               .name_prefix = "gemm_fp8_nt_groupwise",
               .description =
                   "FP8 GEMM C = A @ B.T with per-block dequantization scales (1x128 for A, "
                   "128x128 for B by default).",
               .axes = {var("M"), cst("N", "n"), cst("K", "k"),
                        var("K_div_block", "K // scale_block_size_k.", 1),
                        var("N_div_block", "N // scale_block_size_n.", 1)},
               .inputs = {T("a", {"M", "K"}).synth("float8_e4m3fn"),
                          T("b", {"N", "K"}).synth("float8_e4m3fn"),
                          T("a_scale", {"M", "K_div_block"})
                              .synth("float32")
                              .init("torch.rand((M, K_div_block), device=device) + 0.5"),
                          T("b_scale", {"K_div_block", "N_div_block"})
                              .synth("float32")
                              .init("torch.rand((K_div_block, N_div_block), device=device) + 0.5")},
               .outputs = {T("out", {"M", "N"}).like("out").dt("bfloat16")},
               .tags = {"status:verified", "quantization:float8_e4m3fn"},
               .reference = R"PY(def run(a, b, a_scale, b_scale):
    af, bf = a.float(), b.float()
    m, k = af.shape
    n = bf.shape[0]
    bk = k // a_scale.shape[1]
    bn = -(-n // b_scale.shape[1])
    sa = a_scale.float().repeat_interleave(bk, dim=1)[:, :k]
    sb = b_scale.float().repeat_interleave(bk, dim=0).repeat_interleave(bn, dim=1)[:k, :n]
    return ((af * sa) @ (bf.t() * sb)).to(torch.bfloat16)
)PY"});
}

// The prefill wrapper's run (flashinfer.prefill): causal, the last query row of a request
// seeing all its KV rows.
void add_prefill(std::vector<Template>& v) {
  const std::vector<std::string> cache = {"num_pages", "page_size", "num_kv_heads", "head_dim"};
  v.push_back(
      {.op = "BatchPrefillWithPagedKVCacheWrapper.run",
       .op_type = "gqa_paged",
       .name_prefix = "gqa_paged_prefill",
       .description = "Batched causal GQA prefill over a paged KV cache given as (k_cache, "
                      "v_cache); the ragged layout comes from plan().",
       .axes = {cst("num_qo_heads", "h"), cst("num_kv_heads", "kv"), cst("head_dim", "d"),
                cst("page_size", "ps"), var("len_indptr", "batch_size + 1.", 3),
                var("total_q", "Query rows in the batch."),
                var("num_kv_indices", "Number of page indices."), var("num_pages")},
       .inputs = {T("q", {"total_q", "num_qo_heads", "head_dim"}),
                  T("k_cache", cache).from("paged_kv_cache").item(0),
                  T("v_cache", cache).from("paged_kv_cache").item(1),
                  T("qo_indptr", {"len_indptr"})
                      .plan()
                      .synth("int32")
                      .init("torch.arange(len_indptr, dtype=torch.int32, device=device) * "
                            "(total_q // (len_indptr - 1))")
                      .desc("Query offsets of each request (given to plan())."),
                  T("kv_indptr", {"len_indptr"})
                      .plan()
                      .synth("int32")
                      .init("torch.arange(len_indptr, dtype=torch.int32, device=device) * "
                            "max(num_pages // (len_indptr - 1), 1)")
                      .desc("Page offsets of each request (given to plan())."),
                  T("kv_indices", {"num_kv_indices"})
                      .plan()
                      .synth("int32")
                      .init("torch.arange(int(kv_indptr[-1]), dtype=torch.int32, device=device) "
                            "% num_pages")
                      .desc("Page ids (given to plan())."),
                  S("sm_scale", "float32").plan().init("1.0 / math.sqrt(head_dim)"),
                  // run()'s return_lse, as upstream's newer template has it (the committed file
                  // predates it): whether lse is returned, hence an optional lse.
                  S("return_lse", "int32").opt().desc("Bool: also return the LSE.")},
       .outputs = {T("output", {"total_q", "num_qo_heads", "head_dim"}).like("q"),
                   T("lse", {"total_q", "num_qo_heads"})
                       .opt()
                       .dt("float32")
                       .desc("Base-2 log-sum-exp of the scores.")},
       .constraints = {"total_q == qo_indptr[-1].item()", "num_kv_indices == kv_indptr[-1].item()"},
       .tags = {"stage:prefill", "status:verified"},
       .reference =
           R"PY(def run(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale=None,
        return_lse=None):
    n, h, d = q.shape
    kvh = k_cache.shape[2]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    out = torch.zeros((n, h, d), dtype=torch.float32)
    lse = torch.full((n, h), -float("inf"), dtype=torch.float32)
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()
        if qe <= qs or pages.numel() == 0:
            continue
        k = k_cache[pages].reshape(-1, kvh, d).float()
        v = v_cache[pages].reshape(-1, kvh, d).float()
        for i in range(qs, qe):
            visible = k.shape[0] - (qe - 1 - i)
            if visible <= 0:
                continue
            for j in range(h):
                g = j // (h // kvh)
                s = (k[:visible, g] @ q[i, j].float()) * scale
                lse[i, j] = torch.logsumexp(s, 0) / math.log(2.0)
                out[i, j] = torch.softmax(s, 0) @ v[:visible, g]
    return out.to(q.dtype), lse
)PY"});
}

// The ragged prefill wrapper's run (flashinfer.prefill) and the MLA wrapper's run
// (flashinfer.mla): causal prefill over ragged k/v, and MLA decode over the compressed cache.
void add_ragged_and_mla(std::vector<Template>& v) {
  const std::vector<std::string> qhd = {"total_q", "num_qo_heads", "head_dim"};
  const std::vector<std::string> kv = {"total_kv", "num_kv_heads", "head_dim"};
  v.push_back(
      {.op = "BatchPrefillWithRaggedKVCacheWrapper.run",
       .op_type = "gqa_ragged",
       .name_prefix = "gqa_ragged",
       .description = "Batched causal GQA prefill over ragged q, k, v; the layout comes from "
                      "plan().",
       .axes = {cst("num_qo_heads", "h"), cst("num_kv_heads", "kv"), cst("head_dim", "d"),
                var("len_indptr", "batch_size + 1.", 3), var("total_q", "Query rows."),
                var("total_kv", "Key/value rows.", 6)},
       .inputs = {T("q", qhd), T("k", kv), T("v", kv),
                  T("qo_indptr", {"len_indptr"})
                      .plan()
                      .synth("int32")
                      .init("torch.arange(len_indptr, dtype=torch.int32, device=device) * "
                            "(total_q // (len_indptr - 1))"),
                  T("kv_indptr", {"len_indptr"})
                      .plan()
                      .synth("int32")
                      .init("torch.arange(len_indptr, dtype=torch.int32, device=device) * "
                            "(total_kv // (len_indptr - 1))"),
                  S("sm_scale", "float32").plan().init("1.0 / math.sqrt(head_dim)"),
                  S("return_lse", "int32").opt().desc("Bool: also return the LSE.")},
       .outputs = {T("output", qhd).like("q"),
                   T("lse", {"total_q", "num_qo_heads"}).opt().dt("float32")},
       .constraints = {"total_q == qo_indptr[-1].item()", "total_kv == kv_indptr[-1].item()"},
       .tags = {"stage:prefill", "status:verified"},
       .reference = R"PY(def run(q, k, v, qo_indptr, kv_indptr, sm_scale=None, return_lse=None):
    n, h, d = q.shape
    kvh = k.shape[1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    out = torch.zeros((n, h, d), dtype=torch.float32)
    lse = torch.full((n, h), -float("inf"), dtype=torch.float32)
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        ks, ke = int(kv_indptr[b]), int(kv_indptr[b + 1])
        kb, vb = k[ks:ke].float(), v[ks:ke].float()
        for i in range(qs, qe):
            visible = (ke - ks) - (qe - 1 - i)
            if visible <= 0:
                continue
            for j in range(h):
                g = j // (h // kvh)
                s = (kb[:visible, g] @ q[i, j].float()) * scale
                lse[i, j] = torch.logsumexp(s, 0) / math.log(2.0)
                out[i, j] = torch.softmax(s, 0) @ vb[:visible, g]
    return out.to(q.dtype), lse
)PY"});
  v.push_back(
      {.op = "BatchMLAPagedAttentionWrapper.run",
       .op_type = "mla_paged",
       .name_prefix = "mla_paged_decode",
       .description = "Batched MLA decode over a paged compressed cache (ckv, kpe); scores from "
                      "both parts, output in the ckv space.",
       .axes = {var("batch_size", "", 2), cst("num_qo_heads", "h"), cst("head_dim_ckv", "ckv"),
                cst("head_dim_kpe", "kpe"), cst("page_size", "ps"),
                var("ckv_scale_groups", "Number of 128-channel CKV scale groups."),
                var("num_pages", "", 6), var("len_indptr", "batch_size + 1.", 3),
                var("num_kv_indices", "Number of page indices.")},
       .inputs =
           {T("q_nope", {"batch_size", "num_qo_heads", "head_dim_ckv"}),
            T("q_pe", {"batch_size", "num_qo_heads", "head_dim_kpe"}),
            T("ckv_cache", {"num_pages", "page_size", "head_dim_ckv"}),
            T("kpe_cache", {"num_pages", "page_size", "head_dim_kpe"}),
            T("kv_indptr", {"len_indptr"})
                .plan()
                .synth("int32")
                .init("torch.arange(batch_size + 1, dtype=torch.int32, device=device) * "
                      "max(num_pages // batch_size, 1)"),
            T("kv_indices", {"num_kv_indices"})
                .plan()
                .synth("int32")
                .init("torch.arange(int(kv_indptr[-1]), dtype=torch.int32, device=device) "
                      "% num_pages"),
            S("sm_scale", "float32").plan().init("1.0 / math.sqrt(head_dim_ckv + head_dim_kpe)"),
            // run()'s fp8-cache scales and return_lse, as upstream's newer template has them.
            S("ckv_scale", "float32").opt().desc("Dequantization scale of the CKV cache."),
            T("ckv_scale_arr", {"num_pages", "page_size", "ckv_scale_groups"})
                .opt()
                .dt("float32")
                .desc("Per-token scales of each 128-channel CKV group."),
            S("kpe_scale", "float32").opt().desc("Dequantization scale of the KPE cache."),
            S("return_lse", "int32").opt().desc("Bool: also return the LSE.")},
       .outputs = {T("output", {"batch_size", "num_qo_heads", "head_dim_ckv"}).like("q_nope"),
                   T("lse", {"batch_size", "num_qo_heads"}).opt().dt("float32")},
       .constraints = {"len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"},
       .tags = {"stage:decode", "status:verified"},
       .reference =
           R"PY(def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale,
        ckv_scale=None, ckv_scale_arr=None, kpe_scale=None, return_lse=None):
    # ckv_scale_arr: one scale per token and 128 channels; each value dequantized and rounded
    # to q's dtype, which replaces ckv_scale.
    cs = 1.0 if ckv_scale is None or ckv_scale_arr is not None else float(ckv_scale)
    ks = 1.0 if kpe_scale is None else float(kpe_scale)
    b, h, dc = q_nope.shape
    out = torch.zeros((b, h, dc), dtype=torch.float32)
    lse = torch.full((b, h), -float("inf"), dtype=torch.float32)
    for i in range(b):
        pages = kv_indices[int(kv_indptr[i]):int(kv_indptr[i + 1])].long()
        if pages.numel() == 0:
            continue
        ckv = ckv_cache[pages].float()
        if ckv_scale_arr is not None:
            scale = ckv_scale_arr[pages].float().repeat_interleave(128, -1)
            ckv = (ckv * scale).to(q_nope.dtype).float()
        ckv = ckv.reshape(-1, dc)
        kpe = kpe_cache[pages].reshape(-1, kpe_cache.shape[-1]).float()
        s = (cs * (q_nope[i].float() @ ckv.T) + ks * (q_pe[i].float() @ kpe.T)) * float(sm_scale)
        lse[i] = torch.logsumexp(s, -1) / math.log(2.0)
        out[i] = cs * (torch.softmax(s, -1) @ ckv)
    return out.to(q_nope.dtype), lse
)PY"});
  // concat_mla_k (flashinfer.concat_ops): the rope part, one per token, is shared by the heads.
  const std::vector<std::string> k_dims = {"num_tokens", "num_heads", "total_dim"};
  Axis broadcast = cst("num_heads_broadcast", "", "Always 1 (k_rope is shared across heads).");
  broadcast.value = 1;
  v.push_back(
      {.op = "concat_mla_k",
       .op_type = "mla_paged",
       .name_prefix = "concat_mla_k",
       .description = "DeepSeek MLA key concatenation: k = [k_nope | k_rope] with k_rope "
                      "broadcast over the heads; writes k in place.",
       .axes = {var("num_tokens"), cst("num_heads", "h"), cst("nope_dim", "nope"),
                cst("rope_dim", "rope"), cst("total_dim", "d", "nope_dim + rope_dim."), broadcast},
       .inputs = {T("k", k_dims).desc("Output buffer (written in place)."),
                  T("k_nope", {"num_tokens", "num_heads", "nope_dim"}),
                  T("k_rope", {"num_tokens", "num_heads_broadcast", "rope_dim"})},
       .outputs = {T("k", k_dims).like("k")},
       .tags = {"status:verified", "mla"},
       .reference = R"PY(def run(k, k_nope, k_rope):
    out = k.clone()
    out[..., : k_nope.shape[-1]] = k_nope
    out[..., k_nope.shape[-1] :] = k_rope.expand(-1, k.shape[1], -1)
    return out
)PY"});
}

// ---------------------------------------------------------------------------------------------
// Quantized GEMMs and the fp4 quantizer (flashinfer.gemm.gemm_base, flashinfer.quantization).
// Upstream's shapes name dimensions that are not axes (K_div_block_size, K_div_32, ...): they are
// `derived` here, sized from the axes only for `flashinfer trace` and the init snippet.

void add_quant_gemm(std::vector<Template>& v) {
  // mm_fp8: the weight in trtllm's low-latency layout [K/128, N, 128] (prepare_low_latency_gemm_
  // weights: rows shuffled in blocks of 32, then 128-wide K blocks outermost).
  v.push_back(
      {.op = "mm_fp8",
       .op_type = "gemm_fp8",
       .name_prefix = "gemm_fp8",
       .description = "FP8 GEMM C = A @ W.T with W in the trtllm low-latency block layout "
                      "[K // 128, N, 128] (rows shuffled in blocks of 32); bf16 output.",
       .axes = {var("M"), cst("N", "N"), cst("K", "K")},
       .inputs = {T("A", {"M", "K"}).from("a").synth("float8_e4m3fn"),
                  T("B", {"K_div_block_size", "N", "block_size"})
                      .from("b")
                      .synth("float8_e4m3fn")
                      .desc("FP8 weight in the block layout [K // block_size, N, block_size].")},
       .outputs = {T("C", {"M", "N"}).dt("bfloat16")},
       .derived = {{.name = "K_div_block_size", .of = "K", .by = 128},
                   {.name = "block_size", .by = 128}},
       .tags = {"status:verified", "quantization:float8_e4m3fn"},
       .reference = R"PY(def run(A, B):
    kb, n, bs = B.shape
    w = B.float().permute(1, 0, 2).reshape(n, kb * bs)
    # Undo the row shuffle: row j of the weight sits at (j % 32 % 4) * 8 + (j % 32) // 4 of its
    # block of 32 (a partial last block is left in order).
    rows = [j // 32 * 32 + (j % 32 % 4) * 8 + (j % 32) // 4 if j // 32 * 32 + 32 <= n else j
            for j in range(n)]
    w = w[torch.tensor(rows, dtype=torch.long)]
    return (A.float() @ w.t()).to(torch.bfloat16)
)PY"});
  v.push_back(
      {.op = "mm_mxfp8",
       .op_type = "gemm_mxfp8",
       .name_prefix = "gemm_mxfp8",
       .description = "MXFP8 GEMM C = A @ B: e4m3 operands, one UE8M0 scale per 32 values of K "
                      "(linear layout here; calls may pass swizzled 1-D scales).",
       .axes = {var("M"), cst("N", "N"), cst("K", "K")},
       .inputs = {T("A", {"M", "K"}).from("a").synth("float8_e4m3fn"),
                  T("B", {"K", "N"}).from("b").synth("float8_e4m3fn").desc("Column-major weight."),
                  T("a_descale", {"M", "K_div_32"})
                      .synth("uint8")
                      .init("torch.randint(124, 131, (M, K_div_32), dtype=torch.uint8, "
                            "device=device)"),
                  T("b_descale", {"K_div_32", "N"})
                      .synth("uint8")
                      .init("torch.randint(124, 131, (K_div_32, N), dtype=torch.uint8, "
                            "device=device)")},
       .outputs = {T("C", {"M", "N"}).dt("bfloat16")},
       .derived = {{.name = "K_div_32", .of = "K", .by = 32}},
       .tags = {"status:verified", "quantization:mxfp8"},
       .reference = std::string(kMxHelpers) + R"PY(def run(A, B, a_descale, b_descale):
    sa = _ue8m0(a_descale).repeat_interleave(32, dim=1)
    sb = _ue8m0(b_descale).repeat_interleave(32, dim=0)
    return ((A.float() * sa) @ (B.float() * sb)).to(torch.bfloat16)
)PY"});
  v.push_back(
      {.op = "bmm_mxfp8",
       .op_type = "bmm_mxfp8",
       .name_prefix = "bmm_mxfp8",
       .description = "Batched MXFP8 matmul: e4m3 A [b, M, K] and B [b, K, N] (column-major), "
                      "1-D 128x4-swizzled UE8M0 scales per batch item, back to back.",
       .axes = {var("batch_size", "", 2), var("M"), cst("N", "N"), cst("K", "K"),
                var("A_scale_size", "Batched padded 128x4 scale-buffer length for A."),
                var("B_scale_size", "Batched padded 128x4 scale-buffer length for B.")},
       .inputs = {T("A", {"batch_size", "M", "K"}).synth("float8_e4m3fn"),
                  T("B", {"batch_size", "K", "N"}).synth("float8_e4m3fn"),
                  T("A_scale", {"A_scale_size"})
                      .synth("uint8")
                      .init("torch.randint(124, 131, (batch_size * ((M + 127) // 128 * 128) * "
                            "((K // 32 + 3) // 4 * 4),), dtype=torch.uint8, device=device)"),
                  T("B_scale", {"B_scale_size"})
                      .synth("uint8")
                      .init("torch.randint(124, 131, (batch_size * ((N + 127) // 128 * 128) * "
                            "((K // 32 + 3) // 4 * 4),), dtype=torch.uint8, device=device)"),
                  S("dtype", "int32").desc("Output dtype.")},
       .outputs = {T("C", {"batch_size", "M", "N"}).dt("bfloat16")},
       .tags = {"status:verified", "quantization:mxfp8"},
       .reference = std::string(kMxHelpers) + R"PY(def run(A, B, A_scale, B_scale, dtype=None):
    b, m, k = A.shape
    n = B.shape[-1]
    sa_all = A_scale.reshape(b, -1)
    sb_all = B_scale.reshape(b, -1)
    out = []
    for i in range(b):
        sa = _ue8m0(_unswizzle_128x4(sa_all[i], m, k // 32)).repeat_interleave(32, dim=1)
        sb = _ue8m0(_unswizzle_128x4(sb_all[i], n, k // 32)).repeat_interleave(32, dim=1)
        out.append((A[i].float() * sa) @ (B[i].float() * sb.t()))
    return torch.stack(out).to(torch.bfloat16)
)PY"});
  // mm_fp4: upstream's template (and its example call) count K and N in values, one per byte of
  // A [M, K] and B [K, N], with block scales [M, K // bs] and [K, N // bs]; our reference reads
  // those shapes as written (one e2m1 code per byte, in its low nibble).
  Axis block_size = cst("block_size", "block_size", "16 for NVFP4, 32 for MXFP4.");
  v.push_back(
      {.op = "mm_fp4",
       .op_type = "gemm_fp4",
       .name_prefix = "gemm_fp4",
       .description = "FP4 GEMM C = A @ B with e2m1 operands and e4m3 block scales (block_size "
                      "values per scale); bf16 output.",
       .axes = {var("M"), cst("N", "N"), cst("K", "K"), block_size},
       .inputs = {T("A", {"M", "K"})
                      .from("a")
                      .synth("uint8")
                      .init("torch.randint(0, 256, (M, K), dtype=torch.uint8, device=device)"),
                  T("B", {"K", "N"})
                      .from("b")
                      .synth("uint8")
                      .init("torch.randint(0, 256, (K, N), dtype=torch.uint8, device=device)"),
                  T("a_descale", {"M", "K_div_block_size"})
                      .synth("float8_e4m3fn")
                      .init("(torch.rand((M, K_div_block_size), device=device) + 0.5)"
                            ".to({dtype:a_descale})"),
                  T("b_descale", {"K", "N_div_block_size"})
                      .synth("float8_e4m3fn")
                      .init("(torch.rand((K, N_div_block_size), device=device) + 0.5)"
                            ".to({dtype:b_descale})"),
                  S("block_size", "int32").init("block_size")},
       .outputs = {T("C", {"M", "N"}).dt("bfloat16")},
       .derived = {{.name = "K_div_block_size", .of = "K", .by_axis = "block_size"},
                   {.name = "N_div_block_size", .of = "N", .by_axis = "block_size"}},
       .tags = {"status:verified", "quantization:fp4"},
       .reference =
           std::string(kMxHelpers) + R"PY(def run(A, B, a_descale, b_descale, block_size=16):
    bs = int(block_size)
    a = _e2m1(A) * a_descale.float().repeat_interleave(bs, dim=1)
    b = _e2m1(B) * b_descale.float().repeat_interleave(bs, dim=1)
    return (a @ b).to(torch.bfloat16)
)PY"});
  // fp4_quantize and nvfp4_quantize: the same axes (but one description) and outputs.
  const auto fp4_axes = [](const char* scales_desc) {
    return std::vector<Axis>{var("M", "Number of rows."), cst("K", "k", "Number of input columns."),
                             var("K_packed", "K // 2."), var("num_scale_elems", scales_desc),
                             var("one", "1: shape of the global scale.", 1)};
  };
  const std::vector<Io> fp4_outs = {T("quantized", {"M", "K_packed"}).dt("uint8"),
                                    T("scales", {"num_scale_elems"}).dt("uint8")};
  // fp4_quantize: NVFP4 (sf_vec_size 16, e4m3 scales, global scale) as ops/quantization.h:
  // sf = e4m3_satfinite(gs * amax / 6), q = e2m1_rn((x * gs) / sf). The reference returns the
  // scales in the linear layout (calls default to the 128x4 swizzle: same bytes, reordered).
  v.push_back(
      {.op = "fp4_quantize",
       .op_type = "quantization",
       .name_prefix = "fp4_quantize",
       .description = "FP4 quantization: bf16/fp16 input to packed e2m1 (two values per byte, "
                      "the first in the low nibble) and e4m3 block scales (NVFP4).",
       .axes = fp4_axes("Number of scale bytes."),
       .inputs = {T("input", {"M", "K"}),
                  T("global_scale", {"one"})
                      .opt()
                      .dt("float32")
                      .init("torch.full((one,), 3.0, dtype=torch.float32, device=device)"),
                  S("sf_vec_size", "int32").opt()},
       .outputs = fp4_outs,
       .constraints = {"K_packed == K // 2"},
       .tags = {"status:verified", "quantization:fp4"},
       .reference = std::string(kFp4Quant) + R"PY(def run(input, global_scale=None, sf_vec_size=16):
    vec = 16 if sf_vec_size is None else int(sf_vec_size)
    gs = 1.0 if global_scale is None else float(global_scale.float().reshape(-1)[0])
    return _nvfp4(input, gs, vec)
)PY"});
  v.push_back({.op = "nvfp4_quantize",
               .op_type = "quantization",
               .name_prefix = "nvfp4_quantize",
               .description = "NVFP4 quantization: packed e2m1 and e4m3 scales of 16 values, with "
                              "the global scale a_global_sf.",
               .axes = fp4_axes("Scale bytes."),
               .inputs = {T("a", {"M", "K"}),
                          T("a_global_sf", {"one"})
                              .synth("float32")
                              .init("torch.full((one,), 3.0, dtype=torch.float32, device=device)"),
                          S("sf_vec_size", "int32").opt()},
               .outputs = fp4_outs,
               .constraints = {"K_packed == K // 2"},
               .tags = {"status:verified", "quantization:nvfp4"},
               .reference = std::string(kFp4Quant) + R"PY(def run(a, a_global_sf, sf_vec_size=16):
    vec = 16 if sf_vec_size is None else int(sf_vec_size)
    return _nvfp4(a, float(a_global_sf.float().reshape(-1)[0]), vec)
)PY"});
  v.push_back({.op = "silu_and_mul_nvfp4_quantize",
               .op_type = "quantization",
               .name_prefix = "silu_and_mul_nvfp4_quantize",
               .description = "silu(gate) * up of input [M, 2K] (gate first), rounded to the "
                              "input dtype, then NVFP4 (fp4_quantize's formulas).",
               .axes = {var("M", "Number of rows."),
                        cst("K_doubled", "k", "Gated input width (2 * the output's K)."),
                        var("K_packed", "K_doubled // 4."), var("num_scale_elems", "Scale bytes."),
                        var("one", "1: shape of the global scale.", 1)},
               .inputs = {T("input", {"M", "K_doubled"}),
                          T("global_scale", {"one"})
                              .synth("float32")
                              .init("torch.full((one,), 3.0, dtype=torch.float32, device=device)"),
                          S("sf_vec_size", "int32").opt()},
               .outputs = {T("x_q", {"M", "K_packed"}).dt("uint8"),
                           T("sf", {"num_scale_elems"}).dt("uint8")},
               .constraints = {"K_packed == K_doubled // 4"},
               .tags = {"status:verified", "fused", "quantization:nvfp4"},
               .reference = std::string(kFp4Quant) +
                            R"PY(def run(input, global_scale, sf_vec_size=16):
    vec = 16 if sf_vec_size is None else int(sf_vec_size)
    h = input.shape[-1] // 2
    gate, up = input[:, :h].float(), input[:, h:].float()
    y = (gate * torch.sigmoid(gate) * up).to(input.dtype)
    return _nvfp4(y, float(global_scale.float().reshape(-1)[0]), vec)
)PY"});
  // nvfp4_quantize_smooth (flashinfer.gemm.gemm_svdquant): upstream's template has no status tag
  // and names the global scale's dim "1".
  v.push_back({.op = "nvfp4_quantize_smooth",
               .op_type = "quantize_nvfp4_smooth",
               .name_prefix = "quantize_nvfp4_smooth",
               .description =
                   "Smooth + NVFP4 quantize: NVFP4 of bf16(x * pre_quant_scale) with the "
                   "global scale; 128x4-swizzled e4m3 scales, returned 1-D.",
               .axes = {var("M"), cst("N", "N"), var("N_half", "N / 2 (two e2m1 values per byte)."),
                        var("SF", "128x4-swizzled scale buffer size.")},
               .inputs = {T("x", {"M", "N"}),
                          T("pre_quant_scale", {"N"})
                              .init("(torch.rand((N,), device=device) + 0.5).to({dtype:x})"),
                          T("global_scale", {"1"})
                              .synth("float32")
                              .init("torch.full((1,), 3.0, dtype=torch.float32, device=device)")},
               .outputs = {T("xq", {"M", "N_half"}).dt("uint8"), T("sf", {"SF"}).dt("uint8")},
               .constraints = {"N_half == N // 2",
                               "SF == ((M + 127) // 128) * 128 * ((N // 16 + 3) // 4) * 4"},
               .derived = {{.name = "1", .by = 1}},
               .tags = {"quantization:fp4"},
               .reference = std::string(kFp4Quant) + R"PY(def _swizzle_128x4(sf, rows, cols):
    rp, cp = (rows + 127) // 128 * 128, (cols + 3) // 4 * 4
    r = torch.arange(rows).reshape(-1, 1)
    c = torch.arange(cols).reshape(1, -1)
    off = (r // 128) * (cp // 4) * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    out = torch.zeros(rp * cp, dtype=torch.uint8)
    out[off.reshape(-1)] = sf.reshape(-1)
    return out

def run(x, pre_quant_scale, global_scale):
    xs = (x.float() * pre_quant_scale.float()).to(torch.bfloat16)
    q, sf = _nvfp4(xs, float(global_scale.float().reshape(-1)[0]), 16)
    return q, _swizzle_128x4(sf, x.shape[0], x.shape[1] // 16)
)PY"});
  // mxfp8_grouped_quantize (fp8_quantization): K zero-padded to a multiple of 128, scales in
  // the 128x4 tile order per group, both returned as upstream's permuted views; rows >= mask[b]
  // are zero (docs/GEMM_AND_QUANTIZATION.md). Upstream's file carries no reference; ours rounds
  // the values to e4m3 itself so they compare exactly on a torch without float8.
  v.push_back(
      {.op = "mxfp8_grouped_quantize",
       .op_type = "quantization",
       .name_prefix = "mxfp8_grouped_quantize",
       .description = "Grouped MXFP8 quantization of a [B, M, K] (rows < mask[b] of each group): "
                      "e4m3 values [M, padded_K, B] and UE8M0 scales [32, 4, rm, 4, rk, B].",
       .axes = {var("B", "Number of groups.", 2), var("M", "Rows per group."),
                cst("K", "k", "Input columns (divisible by 32)."),
                var("padded_K", "K rounded up to a multiple of 128."),
                var("rm", "padded_M // 128."), var("rk", "padded_K // 128."), var("m32", "32."),
                var("m4", "4."), var("k4", "4.")},
       .inputs = {T("a", {"B", "M", "K"}),
                  T("mask", {"B"})
                      .synth("int32")
                      .init("torch.full((B,), max(M - 1, 0), dtype=torch.int32, device=device)")},
       .outputs = {T("x_q", {"M", "padded_K", "B"}).dt("float8_e4m3fn"),
                   T("sf", {"m32", "m4", "rm", "k4", "rk", "B"}).dt("uint8")},
       .constraints = {"padded_K == ((K + 127) // 128) * 128", "rm == (M + 127) // 128",
                       "rk == padded_K // 128", "m32 == 32", "m4 == 4", "k4 == 4"},
       .tags = {"status:verified", "quantization:mxfp8"},
       .reference = std::string(kFp4Quant) + R"PY(def run(a, mask):
    b, m, k = a.shape
    pk = (k + 127) // 128 * 128
    rm, sk = (m + 127) // 128, pk // 32
    x = torch.zeros(b, m, pk)
    x[:, :, :k] = a.float()
    live = torch.arange(m).reshape(1, -1, 1) < mask.long().reshape(-1, 1, 1)
    blocks = x.reshape(b, m, sk, 32)
    scale, bits = _ue8m0_up(blocks.abs().amax(dim=-1) / 448.0)
    y = (blocks / scale.unsqueeze(-1)).reshape(b, m, pk)
    mag, _ = _e4m3_rn(y.abs())
    y = torch.where(live, torch.where(y < 0, -mag, mag), torch.zeros_like(y))
    fp8 = getattr(torch, "float8_e4m3fn", None)
    xq = (y.to(fp8) if fp8 is not None else y).permute(1, 2, 0)
    sf = torch.zeros(b, rm * 128, sk, dtype=torch.uint8)
    sf[:, :m] = torch.where(live, bits, torch.zeros_like(bits))
    # Rows r = (t, j, i) = 128 t + 32 j + i, columns c = 4 u + l: stored as (b, t, u, i, j, l).
    sf = sf.reshape(b, rm, 4, 32, sk // 4, 4).permute(0, 1, 4, 3, 2, 5)
    return xq, sf.permute(3, 4, 1, 5, 2, 0)
)PY"});
  v.push_back({.op = "mxfp4_quantize",
               .op_type = "quantization",
               .name_prefix = "mxfp4_quantize",
               .description = "MXFP4 quantization: packed e2m1 and UE8M0 scales of 32 values (the "
                              "power of two at or above amax / 6); no global scale.",
               .axes = fp4_axes("Scale bytes."),
               .inputs = {T("a", {"M", "K"})},
               .outputs = fp4_outs,
               .constraints = {"K_packed == K // 2"},
               .tags = {"status:verified", "quantization:mxfp4"},
               .reference = std::string(kFp4Quant) + R"PY(def run(a):
    x = a.float()
    m, k = x.shape
    blocks = x.reshape(m, k // 32, 32)
    scale, sf_bits = _ue8m0_up(blocks.abs().amax(dim=-1) / 6.0)
    codes = _e2m1_rn(blocks / scale.unsqueeze(-1)).reshape(m, k)
    return _pack(codes), sf_bits.reshape(-1)
)PY"});
  v.push_back({.op = "mxfp8_quantize",
               .op_type = "quantization",
               .name_prefix = "mxfp8_quantize",
               .description = "MXFP8 quantization: e4m3 values and UE8M0 scales of 32 values (the "
                              "power of two at or above amax / 448).",
               .axes = {var("M", "Number of rows."), cst("K", "k", "Number of input columns."),
                        var("num_scale_elems", "Scale bytes.")},
               .inputs = {T("input", {"M", "K"})},
               .outputs = {T("quantized", {"M", "K"}).dt("float8_e4m3fn"),
                           T("scales", {"num_scale_elems"}).dt("uint8")},
               .tags = {"status:verified", "quantization:mxfp8"},
               .reference = std::string(kFp4Quant) + R"PY(def run(input):
    x = input.float()
    m, k = x.shape
    blocks = x.reshape(m, k // 32, 32)
    scale, sf_bits = _ue8m0_up(blocks.abs().amax(dim=-1) / 448.0)
    y = (blocks / scale.unsqueeze(-1)).clamp(-448.0, 448.0).reshape(m, k)
    fp8 = getattr(torch, "float8_e4m3fn", None)
    return (y.to(fp8) if fp8 is not None else y), sf_bits.reshape(-1)
)PY"});
}

// mla_rope_quantize_fp8 (flashinfer.rope): upstream's current template, rank-compressed 2-D keys
// (an earlier one read k_rope [nnz, rope_dim] as [nnz, num_k_heads, ...]: the file
// mla_rope_quantize_fp8_h128_kv64_rope64 it wrote is not what this gives). RoPE in fp32 on the
// rope parts, then every part times its scale, rounded to fp8 e4m3 (float on torch < 2.1).
// fmha_v2_prefill_sm120 (flashinfer.prefill): dense causal self-attention, fp8 in, bf16 out.
void add_rope_quant_and_fmha(std::vector<Template>& v) {
  Axis rotary = cst("rotary_dim", "", "cos_sin_cache's width (the rotary dimension).");
  // rope_quantize_fp8's parts with a 2-D latent k (one head).
  std::vector<Io> mla_parts = rope_fp8_parts();
  mla_parts[1] = T("k_rope", {"nnz", "rope_dim"});
  mla_parts[3] = T("k_nope", {"nnz", "no_rope_dim"})
                     .opt()
                     .init("torch.randn((nnz, no_rope_dim), device=device).to({dtype:q_rope})");
  v.push_back(
      {.op = "mla_rope_quantize_fp8",
       .op_type = "rope",
       .name_prefix = "mla_rope_quantize_fp8",
       .description = "MLA RoPE + FP8 quantization: RoPE (cos/sin cache, NeoX halves or "
                      "interleaved pairs) on q_rope and the 2-D latent k_rope, then every part "
                      "times quant_scale_q / quant_scale_kv, rounded to fp8 e4m3.",
       .axes = {var("nnz", "Total number of tokens."), cst("num_q_heads", "h"),
                cst("rope_dim", "rope"), var("no_rope_dim", "Non-rotary width.", 8),
                var("max_seq_len", "cos_sin_cache length.", 16), rotary},
       .inputs = rope_fp8_inputs(mla_parts, "False"),
       .outputs = rope_fp8_outputs(mla_parts),
       .tags = {"status:verified", "fused", "quantize:fp8", "mla"},
       .reference =
           std::string(kRopeFp8Helpers) +
           R"PY(def run(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True, quant_scale_q=1.0,
        quant_scale_kv=1.0):
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache.float()[pos_ids.long()]
    cos, sin = cs[:, :half], cs[:, half:]
    q = _rotate(q_rope.float(), cos[:, None, :], sin[:, None, :], bool(is_neox))
    k = _rotate(k_rope.float(), cos, sin, bool(is_neox))
    return (_fp8(q, quant_scale_q), _fp8(k, quant_scale_kv), _fp8(q_nope, quant_scale_q),
            _fp8(k_nope, quant_scale_kv))
)PY"});
  // fp8 query, key, value; a bf16 out.
  std::vector<Io> sm120_in = fmha_v2_bshd_inputs("Output buffer (written in place).");
  for (size_t i = 0; i < 3; ++i) sm120_in[i].synth("float8_e4m3fn");
  sm120_in[3].synth("bfloat16");
  sm120_in.back().init("1.0");  // scale_bmm2
  sm120_in.push_back(T("scale_bmm1_d", {"scale_size"}).opt().dt("float32"));
  sm120_in.push_back(T("scale_bmm2_d", {"scale_size"}).opt().dt("float32"));
  sm120_in.push_back(S("causal", "bool").init("True"));
  v.push_back({.op = "fmha_v2_prefill_sm120",
               .op_type = "trtllm_paged",
               .name_prefix = "fmha_v2_prefill_sm120",
               .description =
                   "FMHA v2 prefill (SM120 names): dense self-attention of query/key/value "
                   "[batch, seq_len, heads, head_dim], s = scale_bmm1 * q.k (causal mask), "
                   "out = scale_bmm2 * softmax(s) v, written into out.",
               .axes = {var("batch_size", "", 2), var("seq_len"), cst("num_heads", "h"),
                        cst("head_dim", "d"), var("scale_size", "1: device scale tensors.", 1)},
               .inputs = std::move(sm120_in),
               .outputs = {T("out", kBshd).like("out")},
               .tags = {"status:verified", "stage:prefill", "backend:trtllm"},
               .reference =
                   R"PY(def run(query, key, value, out, num_heads, head_dim, seq_len, scale_softmax,
        scale_bmm1=None, scale_bmm2=None, scale_bmm1_d=None, scale_bmm2_d=None, causal=True):
    s1 = 1.0 if scale_bmm1 is None else float(scale_bmm1)
    s2 = 1.0 if scale_bmm2 is None else float(scale_bmm2)
    q, k, v = query.float(), key.float(), value.float()
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * s1
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v) * s2
    return o.to(out.dtype)
)PY"});
}

// ---------------------------------------------------------------------------------------------
// trtllm MoE (flashinfer.fused_moe.core). Upstream traces trtllm_fp8_block_scale_moe with one
// template per routing_method_type (its moe.py dispatch): Default 0, Renormalize 1, DeepSeekV3 2,
// Llama4 3, RenormalizeNaive 4, TopK 5; Unspecified (6) writes nothing. Names, axes and inputs
// follow upstream's newest committed file of each (tests/trace/data/upstream): `top_k` (and for
// DeepSeekV3 `n_group`, `topk_group`) are scalar inputs as well as constant axes.

void add_moe(std::vector<Template>& v) {
  // FP8 (DeepSeek block scales): DeepSeek-V3's group axes after top_k, group scalars as inputs.
  auto fp8_axes = [](bool ds) {
    std::vector<Axis> a = {var("seq_len", "", 3), cst("num_experts", ""), cst("top_k", "topk")};
    if (ds) {
      a.push_back(cst("n_group", "ng"));
      a.push_back(cst("topk_group", "kg"));
    }
    for (Axis x :
         {cst("num_local_experts", "e"), cst("hidden_size", "h"), cst("intermediate_size", "i"),
          cst("gemm1_out_size", ""), cst("num_hidden_blocks", ""),
          cst("num_intermediate_blocks", ""), cst("num_gemm1_out_blocks", "")}) {
      a.push_back(std::move(x));
    }
    return a;
  };
  const std::string bias_init =
      "(torch.randn((num_experts,), device=device) * 0.1).to({dtype:routing_bias})";
  auto fp8_inputs = [&](bool ds) {
    Io bias = T("routing_bias", {"num_experts"});
    // Optional except for DeepSeek-V3 (upstream's files); init passes one either way.
    if (!ds) bias.opt();
    bias.init(bias_init);
    std::vector<Io> in = {
        T("routing_logits", {"seq_len", "num_experts"}),
        bias,
        T("hidden_states", {"seq_len", "hidden_size"}),
        T("hidden_states_scale", {"num_hidden_blocks", "seq_len"})
            .init("(torch.rand((num_hidden_blocks, seq_len), device=device) + 0.5)"
                  ".to({dtype:hidden_states_scale})"),
        T("gemm1_weights", {"num_local_experts", "gemm1_out_size", "hidden_size"}),
        T("gemm1_weights_scale", {"num_local_experts", "num_gemm1_out_blocks", "num_hidden_blocks"})
            .init("(torch.rand((num_local_experts, num_gemm1_out_blocks, num_hidden_blocks), "
                  "device=device) * 0.01).to({dtype:gemm1_weights_scale})"),
        T("gemm2_weights", {"num_local_experts", "hidden_size", "intermediate_size"}),
        T("gemm2_weights_scale",
          {"num_local_experts", "num_hidden_blocks", "num_intermediate_blocks"})
            .init("(torch.rand((num_local_experts, num_hidden_blocks, num_intermediate_blocks), "
                  "device=device) * 0.01).to({dtype:gemm2_weights_scale})")};
    in.push_back(S("top_k", "int32").init("top_k"));
    if (ds) {
      in.push_back(S("n_group", "int32").init("n_group"));
      in.push_back(S("topk_group", "int32").init("topk_group"));
    }
    in.push_back(S("local_expert_offset", "int32").init("0"));
    in.push_back(S("routed_scaling_factor", "float32").init("1.0"));
    return in;
  };
  // NVFP4: DeepSeek-V3's group axes last (upstream's ..._i2048_ng8_kg4 names); top_k and the
  // groups are not inputs; routed_scaling_factor is an optional scalar.
  auto fp4_axes = [](bool ds) {
    std::vector<Axis> a = {var("seq_len", "", 3),
                           cst("num_experts", ""),
                           cst("top_k", "topk"),
                           cst("num_local_experts", "e"),
                           cst("hidden_size", "h"),
                           cst("intermediate_size", "i"),
                           cst("gemm1_out_size", ""),
                           cst("num_packed_hidden", ""),
                           cst("num_fp4_hidden_blocks", ""),
                           cst("num_packed_intermediate", ""),
                           cst("num_fp4_intermediate_blocks", "")};
    if (ds) {
      a.push_back(cst("n_group", "ng"));
      a.push_back(cst("topk_group", "kg"));
    }
    return a;
  };
  auto packed = [](std::vector<std::string> dims) {
    std::string shape;
    for (const auto& d : dims) shape += d + ", ";
    return "torch.randint(0, 256, (" + shape + "), dtype=torch.uint8, device=device)";
  };
  auto scales = [](std::vector<std::string> dims, const std::string& key, const char* k) {
    std::string shape;
    for (const auto& d : dims) shape += d + ", ";
    return "(torch.rand((" + shape + "), device=device) * " + k + " + " + k + ").to({dtype:" + key +
           "})";
  };
  const std::vector<std::string> hs = {"seq_len", "num_packed_hidden"},
                                 hss = {"seq_len", "num_fp4_hidden_blocks"},
                                 w1 = {"num_local_experts", "gemm1_out_size", "num_packed_hidden"},
                                 w1s = {"num_local_experts", "gemm1_out_size",
                                        "num_fp4_hidden_blocks"},
                                 w2 = {"num_local_experts", "hidden_size",
                                       "num_packed_intermediate"},
                                 w2s = {"num_local_experts", "hidden_size",
                                        "num_fp4_intermediate_blocks"},
                                 el = {"num_local_experts"};
  const std::vector<Io> fp4_inputs = {
      T("routing_logits", {"seq_len", "num_experts"}), T("routing_bias", {"num_experts"}).opt(),
      T("hidden_states", hs).synth("uint8").init(packed(hs)),
      // Upstream's optional inputs name no dtype: a call's own, or "unknown" when absent.
      T("hidden_states_scale", hss)
          .opt()
          .synth("float8_e4m3fn")
          .init(scales(hss, "hidden_states_scale", "0.5")),
      T("gemm1_weights", w1).synth("uint8").init(packed(w1)),
      T("gemm1_weights_scale", w1s)
          .synth("float8_e4m3fn")
          .init(scales(w1s, "gemm1_weights_scale", "0.05")),
      T("gemm1_bias", {"num_local_experts", "gemm1_out_size"}).opt(), T("gemm1_alpha", el).opt(),
      T("gemm1_beta", el).opt(), T("gemm1_clamp_limit", el).opt(),
      T("gemm2_weights", w2).synth("uint8").init(packed(w2)),
      T("gemm2_weights_scale", w2s)
          .synth("float8_e4m3fn")
          .init(scales(w2s, "gemm2_weights_scale", "0.05")),
      T("gemm2_bias", {"num_local_experts", "hidden_size"}).opt(),
      T("output1_scale_scalar", el).opt().synth("float32"),
      T("output1_scale_gate_scalar", el).opt().synth("float32"),
      T("output2_scale_scalar", el).opt().synth("float32"),
      S("local_expert_offset", "int32").init("0"),
      S("routed_scaling_factor", "float32").opt().init("1.0")};

  // The weights of each routing method are our CPU op's (kRoute, docs/MOE.md "Routing
  // methods"): only DeepSeek-V3 reads routing_bias and routed_scaling_factor.
  struct Variant {
    int64_t type;
    const char* prefix;  // after "moe_fp8_block_scale_" / "moe_fp4_block_scale_"
    const char* desc;
  };
  const Variant variants[] = {
      {0, "default_routing", "Default routing: softmax, then top-k."},
      {1, "renormalize_routing", "Renormalize routing: top-k, then softmax over the selected."},
      {2, "ds_routing",
       "DeepSeek-V3 routing: sigmoid scores plus bias, the best topk_group of n_group groups (sum "
       "of each group's two best), top-k among them, weights the selected scores (without bias) "
       "normalized and times routed_scaling_factor."},
      {3, "llama4_routing", "Llama4 routing: the top-1 expert, weight sigmoid of its logit."},
      {4, "renormalize_naive_routing", "RenormalizeNaive routing: softmax, top-k, renormalized."},
      {5, "topk_routing", "TopK routing: top-k of the logits, the raw logits as weights."},
  };
  const auto route = [](const Variant& x) {
    return "    topk_ids, topk_w = _route(routing_logits, routing_bias, " + std::to_string(x.type) +
           ", TOP_K, " + (x.type == 2 ? "N_GROUP, TOPK_GROUP" : "None, None") +
           ", routed_scaling_factor)\n";
  };
  // DeepSeek-V3 with fused shared experts (num_fused_shared_experts = S > 0): upstream's sibling
  // template. The weights hold E + S expert-major rows (`num_weight_rows`); the routing appends
  // the ids [E, E + S) at weight 1.0 to every token (E = num_experts), as upstream's docstring.
  auto fp8_shared = [&] {
    std::vector<Axis> axes = {cst("num_fused_shared_experts", "s"),
                              cst("num_weight_rows", "e"),
                              var("seq_len", "", 3),
                              cst("num_experts", ""),
                              cst("top_k", "topk"),
                              cst("n_group", "ng"),
                              cst("topk_group", "kg"),
                              cst("hidden_size", "h"),
                              cst("intermediate_size", "i"),
                              cst("gemm1_out_size", ""),
                              cst("num_hidden_blocks", ""),
                              cst("num_intermediate_blocks", ""),
                              cst("num_gemm1_out_blocks", "")};
    std::vector<Io> in = fp8_inputs(true);
    for (Io& io : in) {
      for (auto& d : io.dims) {
        if (d == "num_local_experts") d = "num_weight_rows";
      }
      if (!io.init_expr.empty()) {
        for (std::size_t p = io.init_expr.find("num_local_experts"); p != std::string::npos;
             p = io.init_expr.find("num_local_experts", p)) {
          io.init_expr.replace(p, 17, "num_weight_rows");
        }
      }
    }
    in.insert(in.begin(), S("num_fused_shared_experts", "int32").init("num_fused_shared_experts"));
    const std::vector<std::string> rows = {"num_weight_rows"};
    in.insert(in.begin() + 7, {T("gemm1_alpha", rows).opt().dt("float32"),
                               T("gemm1_beta", rows).opt().dt("float32"),
                               T("gemm1_clamp_limit", rows).opt().dt("float32")});
    const std::string ref =
        std::string(kMoeFp8Experts) + kRoute +
        "def run(num_fused_shared_experts, routing_logits, routing_bias, hidden_states,\n"
        "        hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm1_alpha=None,\n"
        "        gemm1_beta=None, gemm1_clamp_limit=None, gemm2_weights=None,\n"
        "        gemm2_weights_scale=None, top_k=None, n_group=None, topk_group=None,\n"
        "        local_expert_offset=0, routed_scaling_factor=1.0):\n"
        "    if gemm1_alpha is not None or gemm1_beta is not None or gemm1_clamp_limit is not "
        "None:\n"
        "        raise NotImplementedError(\"gemm1_alpha / beta / clamp_limit\")\n"
        "    TOP_K = int(top_k)\n"
        "    N_GROUP, TOPK_GROUP = int(n_group), int(topk_group)\n" +
        route(variants[2]) +
        "    S = int(num_fused_shared_experts)\n"
        "    E = routing_logits.shape[1]\n"
        "    shared = torch.arange(E, E + S).expand(topk_ids.shape[0], S)\n"
        "    topk_ids = torch.cat((topk_ids, shared), dim=1)\n"
        "    topk_w = torch.cat((topk_w, torch.ones(topk_w.shape[0], S)), dim=1)\n"
        "    return _experts(hidden_states, hidden_states_scale, gemm1_weights, "
        "gemm1_weights_scale,\n"
        "                    gemm2_weights, gemm2_weights_scale, topk_ids, topk_w, "
        "local_expert_offset)\n";
    v.push_back({.op = "trtllm_fp8_block_scale_moe",
                 .op_type = "moe",
                 .name_prefix = "moe_fp8_block_scale_ds_shared_experts",
                 .description = std::string("FP8 block-scale MoE, ") + variants[2].desc +
                                " The fused shared experts run for every token at weight 1.",
                 .axes = axes,
                 .inputs = in,
                 .outputs = {T("output", {"seq_len", "hidden_size"}).dt("bfloat16")},
                 .tags = {"status:verified", "quantization:float8_e4m3fn"},
                 .reference = ref,
                 .select_param = "routing_method_type",
                 .select_values = {2},
                 .positive_param = "num_fused_shared_experts"});
  };
  for (const Variant& x : variants) {
    const bool ds = x.type == 2;
    if (ds) fp8_shared();  // before its plain sibling: the first match wins
    // FP8: top_k (and the groups) arrive as inputs.
    std::string ref8 = std::string(kMoeFp8Experts) + kRoute +
                       "def run(routing_logits, routing_bias, hidden_states, "
                       "hidden_states_scale,\n"
                       "        gemm1_weights, gemm1_weights_scale, gemm2_weights, "
                       "gemm2_weights_scale,\n        " +
                       (ds ? "top_k, n_group, topk_group, " : "top_k, ") +
                       "local_expert_offset, routed_scaling_factor):\n"
                       "    TOP_K = int(top_k)\n" +
                       (ds ? "    N_GROUP, TOPK_GROUP = int(n_group), int(topk_group)\n" : "") +
                       route(x) +
                       "    return _experts(hidden_states, hidden_states_scale, gemm1_weights, "
                       "gemm1_weights_scale,\n"
                       "                    gemm2_weights, gemm2_weights_scale, topk_ids, topk_w, "
                       "local_expert_offset)\n";
    v.push_back({.op = "trtllm_fp8_block_scale_moe",
                 .op_type = "moe",
                 .name_prefix = std::string("moe_fp8_block_scale_") + x.prefix,
                 .description = std::string("FP8 block-scale MoE, ") + x.desc,
                 .axes = fp8_axes(ds),
                 .inputs = fp8_inputs(ds),
                 .outputs = {T("output", {"seq_len", "hidden_size"}).dt("bfloat16")},
                 .tags = {"status:verified", "quantization:float8_e4m3fn"},
                 .reference = ref8,
                 .select_param = "routing_method_type",
                 .select_values = {x.type}});
    // NVFP4: top_k and the groups are constants of the definition, baked into the reference
    // by the {axis:...} placeholders.
    std::string ref4 =
        std::string(kMoeFp4Experts) + kRoute +
        "def run(routing_logits, routing_bias=None, hidden_states=None, "
        "hidden_states_scale=None,\n"
        "        gemm1_weights=None, gemm1_weights_scale=None, gemm1_bias=None, "
        "gemm1_alpha=None,\n"
        "        gemm1_beta=None, gemm1_clamp_limit=None, gemm2_weights=None,\n"
        "        gemm2_weights_scale=None, gemm2_bias=None, output1_scale_scalar=None,\n"
        "        output1_scale_gate_scalar=None, output2_scale_scalar=None, "
        "local_expert_offset=0,\n"
        "        routed_scaling_factor=None):\n"
        "    if gemm1_alpha is not None or gemm1_beta is not None or gemm1_clamp_limit is not "
        "None:\n"
        "        raise NotImplementedError(\"gemm1_alpha / beta / clamp_limit\")\n" +
        "    TOP_K = {axis:top_k}\n" +
        (ds ? "    N_GROUP, TOPK_GROUP = {axis:n_group}, {axis:topk_group}\n" : "") + route(x) +
        "    return _experts(hidden_states, hidden_states_scale, gemm1_weights, "
        "gemm1_weights_scale,\n"
        "                    gemm1_bias, gemm2_weights, gemm2_weights_scale, gemm2_bias,\n"
        "                    output1_scale_scalar, output1_scale_gate_scalar, "
        "output2_scale_scalar,\n"
        "                    topk_ids, topk_w, local_expert_offset)\n";
    v.push_back({.op = "trtllm_fp4_block_scale_moe",
                 .op_type = "moe",
                 .name_prefix = std::string("moe_fp4_block_scale_") + x.prefix,
                 .description = std::string("NVFP4 block-scale MoE, ") + x.desc,
                 .axes = fp4_axes(ds),
                 .inputs = fp4_inputs,
                 .outputs = {T("output", {"seq_len", "hidden_size"}).dt("bfloat16")},
                 .tags = {"status:experimental", "quantization:nvfp4"},
                 .reference = ref4,
                 .select_param = "routing_method_type",
                 .select_values = {x.type},
                 // Upstream's definition has no shared-expert rows and no activation axis
                 // (its reference is SwiGLU): other calls are not written.
                 .only_when = {{"num_fused_shared_experts", {0}},
                               {"activation_type", {3}}}});  // ActivationType::Swiglu
  }
}

// ---------------------------------------------------------------------------------------------
// Templates chosen by a string argument: mm_bf16_fp4 by `backend` (each backend's prepared weight
// has its own layout: upstream's gemm.py has one template per backend), nvfp4_kv_dequantize_paged
// by `kv_layout` (upstream's _hnd sibling).

// The cute-dsl weight: int32 [K/16, 2N], (16 k x 64 n) tiles of 128 words, tiles k-major; byte j
// of word w holds packed k-row kh and column nn of its tile (our src/kernels/cpu/
// gemm_bf16_fp4_cpu.cpp, cute_dsl_tile_source). Scales: S0E5M3 bytes [K/bs, N], the top 8 bits
// of an fp16 (byte << 7).
const char* kBf16Fp4CuteDsl = R"PY(def _cute_dsl_weight(B, b_descale, bs):
    ksf, n = b_descale.shape
    k = ksf * bs
    kt, nt = k // 16, n // 64
    by = B.contiguous().view(torch.uint8).reshape(kt, nt, 128, 4).long()
    w = torch.zeros(n, k)
    t_k = torch.arange(kt).reshape(-1, 1)
    t_n = torch.arange(nt).reshape(1, -1)
    koff, noff = [0, 4, 0, 4], [[0, 0, 16, 16], [32, 32, 48, 48]]
    for word in range(128):
        lane = (word // 2) % 32
        for j in range(4):
            kh = lane % 4 + koff[j]
            nn = (word // 64) * 8 + lane // 4 + noff[word % 2][j]
            byte = by[:, :, word, j]
            rows = (t_n * 64 + nn).expand(kt, nt)
            cols = ((t_k * 8 + kh) * 2).expand(kt, nt)
            w[rows, cols] = _e2m1(byte & 15)
            w[rows, cols + 1] = _e2m1(byte >> 4)
    half = (b_descale.to(torch.int32) << 7).to(torch.int16).view(torch.float16).float()
    return w * half.t().repeat_interleave(bs, dim=1)

)PY";

void add_string_selected(std::vector<Template>& v) {
  // mm_bf16_fp4: C = (A @ dequant(B).T) * alpha, bf16 out. Upstream's three committed files come
  // from two generations of its gemm.py: cudnn / cute_dsl (alpha float32, no out/out_dtype
  // inputs) and cute_dsl_native_sf1d (the later one: alpha, out_dtype and out listed).
  const auto bf16_fp4 = [&](std::string backend, std::string prefix, std::string desc,
                            std::vector<Io> weight, std::vector<Derived> derived,
                            std::string reference) {
    std::vector<Io> in = {T("A", {"M", "K"}).from("a").desc("Activation, bfloat16.")};
    for (auto& w : weight) in.push_back(std::move(w));
    in.push_back(T("alpha", {"1"})
                     .dt("float32")
                     .opt()
                     .init("torch.tensor([0.5], device=device)")
                     .desc("Optional global scale, float32, shape (1,)."));
    in.push_back(S("block_size", "int32").init("block_size").desc("FP4 block size (always 16)."));
    derived.push_back({.name = "1", .by = 1});
    v.push_back(
        {.op = "mm_bf16_fp4",
         .op_type = "gemm_bf16_fp4",
         .name_prefix = std::move(prefix),
         .description = std::move(desc),
         .axes = {var("M"), cst("N", "N"), cst("K", "K"),
                  cst("block_size", "block_size", "FP4 quantization block size (16 for nvfp4).")},
         .inputs = std::move(in),
         .outputs = {T("C", {"M", "N"}).dt("bfloat16")},
         .derived = std::move(derived),
         .tags = {"status:verified", "quantization:fp4"},
         .reference = std::move(reference),
         .select_param = "backend",
         .select_strings = {std::move(backend)}});
  };
  bf16_fp4("cudnn", "mm_bf16_fp4_cudnn",
           "bf16 x fp4 GEMM C = (A @ dequant(B).T) * alpha, cuDNN-prepared weights: B is e2m1 "
           "packed two per byte (low nibble first) [N, K // 2], e4m3 block scales linear "
           "[N, K // block_size].",
           {T("B", {"N", "K_div_2"})
                .from("b")
                .synth("uint8")
                .init("torch.randint(0, 256, (N, K_div_2), dtype=torch.uint8, device=device)")
                .desc("Weight, fp4 e2m1fn_x2 packed as uint8, [N, K//2]."),
            T("b_descale", {"N", "K_div_block_size"})
                .synth("float8_e4m3fn")
                .init("(torch.randint(4, 12, (N, K_div_block_size), device=device) / 8.0)"
                      ".to({dtype:b_descale})")
                .desc("Per-block scales, float8_e4m3fn, [N, K//block_size].")},
           {{.name = "K_div_2", .of = "K", .by = 2},
            {.name = "K_div_block_size", .of = "K", .by_axis = "block_size"}},
           std::string(kMxHelpers) + R"PY(def run(A, B, b_descale, alpha=None, block_size=16):
    bs = int(block_size)
    n = B.shape[0]
    codes = torch.stack([B.long() & 15, B.long() >> 4], dim=-1).reshape(n, -1)
    w = _e2m1(codes) * b_descale.float().repeat_interleave(bs, dim=1)
    c = A.float() @ w.t()
    if alpha is not None:
        c = c * alpha.float().reshape(())
    return c.to(torch.bfloat16)
)PY");
  bf16_fp4("cute-dsl", "mm_bf16_fp4_cute_dsl",
           "bf16 x fp4 GEMM C = (A @ dequant(B).T) * alpha, cute-DSL-prepared weights: B is fp4 "
           "repacked into (16 K x 64 N) MMA tiles as int32 [K // 16, N * 2], S0E5M3 block "
           "scales [K // block_size, N].",
           {T("B", {"K_div_16", "N_mul_2"})
                .from("b")
                .synth("int32")
                .init("torch.randint(-2 ** 31, 2 ** 31 - 1, (K_div_16, N_mul_2), "
                      "dtype=torch.int32, device=device)")
                .desc("Weight, fp4 tile-packed as int32, [K//16, N*2]."),
            T("b_descale", {"K_div_block_size", "N"})
                .synth("uint8")
                .init("torch.randint(100, 130, (K_div_block_size, N), dtype=torch.uint8, "
                      "device=device)")
                .desc("Per-block scales, S0E5M3 as uint8, [K//block_size, N].")},
           {{.name = "K_div_16", .of = "K", .by = 16},
            {.name = "N_mul_2", .of = "N", .times = 2},
            {.name = "K_div_block_size", .of = "K", .by_axis = "block_size"}},
           std::string(kMxHelpers) + kBf16Fp4CuteDsl +
               R"PY(def run(A, B, b_descale, alpha=None, block_size=16):
    c = A.float() @ _cute_dsl_weight(B, b_descale, int(block_size)).t()
    if alpha is not None:
        c = c * alpha.float().reshape(())
    return c.to(torch.bfloat16)
)PY");
  // The native backend (SM120/121): canonical uint8 weights and the 1-D padded 128x4-swizzled
  // e4m3 scale buffer. Our op has no such backend (it refuses the call); the definition is
  // still written for it, as upstream's.
  v.push_back(
      {.op = "mm_bf16_fp4",
       .op_type = "gemm_bf16_fp4",
       .name_prefix = "mm_bf16_fp4_cute_dsl_native_sf1d",
       .description = "BF16 x NVFP4 GEMM with canonical uint8 weights and padded 128x4-swizzled "
                      "E4M3 block scales (SM120/121).",
       .axes = {var("M"), cst("N", "N"), cst("K", "K"), cst("K_packed", "K_packed"),
                cst("block_size", "block_size"), cst("SF_dim_0", "SF_dim_0")},
       .inputs = {T("A", {"M", "K"}).from("a"),
                  T("B", {"N", "K_packed"})
                      .from("b")
                      .synth("uint8")
                      .init("torch.randint(0, 256, (N, K_packed), dtype=torch.uint8, "
                            "device=device)"),
                  T("b_descale", {"SF_dim_0"})
                      .synth("float8_e4m3fn")
                      .init("(torch.rand((SF_dim_0,), device=device) + 0.5).to({dtype:b_descale})")
                      .desc("Contiguous 128x4-swizzled E4M3 buffer, including N/K padding."),
                  T("alpha", {"1"}).opt(), S("block_size", "int32").init("block_size"),
                  S("out_dtype", "dtype").opt(), T("out", {"M", "N"}).opt()},
       .outputs = {T("C", {"M", "N"}).dt("bfloat16")},
       .constraints = {"K == K_packed * 2", "block_size == 16", "M >= 1"},
       .derived = {{.name = "1", .by = 1}},
       .tags = {"status:verified", "quantization:fp4"},
       .reference =
           std::string(kMxHelpers) +
           R"PY(def run(A, B, b_descale, alpha=None, block_size=16, out_dtype=None, out=None):
    bs = int(block_size)
    n, kp = B.shape
    k = kp * 2
    sf = _unswizzle_128x4(b_descale.float(), n, k // bs).repeat_interleave(bs, dim=1)
    codes = torch.stack([B.long() & 15, B.long() >> 4], dim=-1).reshape(n, k)
    w = _e2m1(codes) * sf
    if alpha is not None:
        w = w * alpha.float().reshape(())
    c = (A.float() @ w.t()).to(out_dtype or A.dtype)
    if out is not None:
        out.copy_(c)
        return out
    return c
)PY",
       .select_param = "backend",
       .select_strings = {"cute-dsl-native"}});

  // nvfp4_kv_dequantize_paged: the (k, v) cache and scale tuples, gathered through the block
  // table into [batch, max_seq_len, heads, dim] (rows past a request's length left as they were;
  // our src/kernels/cpu/nvfp4_cpu.cpp). One template per kv_layout, "NHD" by default.
  for (const bool hnd : {false, true}) {
    const std::vector<std::string> pre =
        hnd ? std::vector<std::string>{"num_pages", "num_heads", "page_size"}
            : std::vector<std::string>{"num_pages", "page_size", "num_heads"};
    const auto cache = [&](const char* last) {
      auto d = pre;
      d.push_back(last);
      return d;
    };
    const std::string bytes = "torch.randint(0, 256, (" + pre[0] + ", " + pre[1] + ", " + pre[2];
    // e4m3 scales k / 8 (k in 4..11): exact in e4m3, also as the float32 stand-in of a torch
    // without float8.
    const std::string sfs = "(torch.randint(4, 12, (" + pre[0] + ", " + pre[1] + ", " + pre[2];
    const std::vector<std::string> kout = {"batch_size", "max_seq_len", "num_heads", "k_head_dim"};
    const std::vector<std::string> vout = {"batch_size", "max_seq_len", "num_heads", "v_head_dim"};
    std::string ref = std::string(kMxHelpers) + "HND = " + (hnd ? "True" : "False") + "\n\n\n" +
                      R"PY(def _gather(cache, sf, block_tables, seq_lens, scale, out):
    out = out.clone()
    page_size = cache.shape[2] if HND else cache.shape[1]
    for b in range(block_tables.shape[0]):
        for t in range(int(seq_lens[b])):
            page = int(block_tables[b, t // page_size])
            slot = t % page_size
            q = cache[page, :, slot] if HND else cache[page, slot]
            s = sf[page, :, slot] if HND else sf[page, slot]
            codes = torch.stack([q.long() & 15, q.long() >> 4], dim=-1).reshape(q.shape[0], -1)
            val = _e2m1(codes) * s.float().repeat_interleave(16, dim=1) * scale.float().reshape(())
            out[b, t] = val.to(out.dtype)
    return out

def run(paged_k_cache, paged_v_cache, k_scales, v_scales, block_tables, seq_lens, k_scale,
        v_scale, output_k, output_v):
    return (_gather(paged_k_cache, k_scales, block_tables, seq_lens, k_scale, output_k),
            _gather(paged_v_cache, v_scales, block_tables, seq_lens, v_scale, output_v))
)PY";
    v.push_back(
        {.op = "nvfp4_kv_dequantize_paged",
         .op_type = "dequantize_fp4",
         .name_prefix = hnd ? "nvfp4_kv_dequantize_paged_hnd" : "nvfp4_kv_dequantize_paged",
         .description = "Gather and dequantize a paged NVFP4 KV cache through block tables into "
                        "caller-owned contiguous K/V output buffers.",
         .axes = {var("batch_size", "", 2), var("max_seq_len", "", 6), cst("num_heads", "h"),
                  cst("k_head_dim", "dk"), cst("v_head_dim", "dv"),
                  var("k_packed_dim", "k_head_dim // 2."), var("v_packed_dim", "v_head_dim // 2."),
                  var("k_scale_dim", "k_head_dim // 16."), var("v_scale_dim", "v_head_dim // 16."),
                  var("num_pages", "", 5), cst("page_size", "ps"), var("block_table_stride", "", 2),
                  var("scalar", "Global scale tensor length, normally 1.", 1)},
         .inputs = {T("paged_k_cache", cache("k_packed_dim"))
                        .from("paged_kv_cache")
                        .item(0)
                        .synth("uint8")
                        .init(bytes + ", k_head_dim // 2), dtype=torch.uint8, device=device)"),
                    T("paged_v_cache", cache("v_packed_dim"))
                        .from("paged_kv_cache")
                        .item(1)
                        .synth("uint8")
                        .init(bytes + ", v_head_dim // 2), dtype=torch.uint8, device=device)"),
                    T("k_scales", cache("k_scale_dim"))
                        .from("kv_cache_sf")
                        .item(0)
                        .synth("float8_e4m3fn")
                        .init(sfs + ", k_head_dim // 16), device=device) / 8.0)"
                                    ".to({dtype:k_scales})"),
                    T("v_scales", cache("v_scale_dim"))
                        .from("kv_cache_sf")
                        .item(1)
                        .synth("float8_e4m3fn")
                        .init(sfs + ", v_head_dim // 16), device=device) / 8.0)"
                                    ".to({dtype:v_scales})"),
                    T("block_tables", {"batch_size", "block_table_stride"})
                        .synth("int32")
                        .init("torch.arange(batch_size * block_table_stride, dtype=torch.int32, "
                              "device=device).reshape(batch_size, block_table_stride) % "
                              "num_pages"),
                    T("seq_lens", {"batch_size"})
                        .synth("int32")
                        .init("torch.full((batch_size,), min(max_seq_len, block_table_stride * "
                              "page_size), dtype=torch.int32, device=device)"),
                    T("k_scale", {"scalar"})
                        .synth("float32")
                        .init("torch.ones((scalar,), device=device)"),
                    T("v_scale", {"scalar"})
                        .synth("float32")
                        .init("torch.full((scalar,), 0.5, device=device)"),
                    T("output_k", kout)
                        .init("torch.zeros((batch_size, max_seq_len, num_heads, "
                              "k_head_dim), device=device).to({dtype:output_k})"),
                    T("output_v", vout)
                        .init("torch.zeros((batch_size, max_seq_len, num_heads, "
                              "v_head_dim), device=device).to({dtype:output_v})")},
         // Written in place, but upstream's outputs name no parameter ("param").
         .outputs = {T("output_k", kout).like("output_k"), T("output_v", vout).like("output_v")},
         .constraints = {"k_head_dim == k_packed_dim * 2", "v_head_dim == v_packed_dim * 2",
                         "k_head_dim == k_scale_dim * 16", "v_head_dim == v_scale_dim * 16",
                         "block_table_stride * page_size >= max_seq_len", "scalar == 1"},
         .tags = {"status:verified", "quantization:fp4"},
         .reference = ref,
         .select_param = "kv_layout",
         .select_strings = {hnd ? "HND" : "NHD"},
         .select_string_default = "NHD"});
  }
}

// ---------------------------------------------------------------------------------------------
// SVDQuant (flashinfer.gemm.gemm_svdquant): out = alpha * (a @ b^T + d @ l1^T), NVFP4 a and b with
// 128x4-swizzled e4m3 scale bytes, the LoRA-up weight l1 pre-divided by alpha (upstream's
// docstrings; our src/api/svdquant.cpp). Upstream's templates carry no status tag; its
// committed files come in two generations (the weight scale buffer SF_B variable or constant):
// these follow the constant one.
const char* kSvdHelpers = R"PY(def _e4m3_bits(b):
    b = b.long()
    e, m = (b >> 3) & 15, (b & 7).float()
    v = torch.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * torch.pow(2.0, e.float() - 7.0))
    return torch.where(b >= 128, -v, v)

def _fp4_rows(q, sf):
    # Packed e2m1 rows [r, k // 2] (low nibble first) times their e4m3 scales [r, k // 16].
    codes = torch.stack([q.long() & 15, q.long() >> 4], dim=-1).reshape(q.shape[0], -1)
    return _e2m1(codes) * sf.repeat_interleave(16, dim=1)

)PY";

void add_svdquant(std::vector<Template>& v) {
  const Axis k_packed = cst("K_packed", "K_packed", "K / 2 (two e2m1 values per byte).");
  const Axis sf_b = cst("SF_B", "SF_B", "128x4-swizzled weight scale buffer size.");
  const Axis rank = cst("rank", "rank", "LoRA rank, a positive multiple of 32.");
  const auto bytes = [](const char* key, std::vector<std::string> dims, std::string shape,
                        const char* desc) {
    return T(key, std::move(dims))
        .synth("uint8")
        .init("torch.randint(0, 256, (" + shape + "), dtype=torch.uint8, device=device)")
        .desc(desc);
  };
  // e4m3 scale bytes 48..63: 0.5 to under 1 (exponent field 6).
  const auto scales = [](const char* key, std::string dim, std::string size, const char* desc) {
    return T(key, {std::move(dim)})
        .synth("uint8")
        .init("torch.randint(48, 64, (" + size + ",), dtype=torch.uint8, device=device)")
        .desc(desc);
  };
  const Io alpha = T("alpha", {"1"})
                       .synth("float32")
                       .init("torch.full((1,), 0.5, dtype=torch.float32, device=device)")
                       .desc("Per-tensor residual dequant scale, float32 device scalar.");
  const std::string sf_a_size = "((M + 127) // 128) * 128 * (((K_packed * 2 // 16) + 3) // 4) * 4";
  v.push_back(
      {.op = "mm_nvfp4_svdquant",
       .op_type = "gemm_nvfp4_svdquant",
       .name_prefix = "gemm_nvfp4_svdquant",
       .description = "SVDQuant NVFP4 GEMM: out = alpha * (a @ b^T + d @ l1^T), 1/alpha "
                      "pre-folded into l1.",
       .axes = {var("M"), cst("N", "N"), k_packed,
                var("SF_A", "128x4-swizzled activation scale buffer size derived from M and K."),
                sf_b, rank},
       .inputs = {bytes("a", {"M", "K_packed"}, "M, K_packed",
                        "Smooth-quantized activation, packed e2m1 as uint8."),
                  bytes("b", {"N", "K_packed"}, "N, K_packed",
                        "NVFP4 residual weight, packed e2m1 as uint8, row-major."),
                  scales("a_sf", "SF_A", sf_a_size,
                         "Activation block scales, ue4m3 as uint8, 128x4 swizzled."),
                  scales("b_sf", "SF_B", "SF_B",
                         "Weight block scales, ue4m3 as uint8, 128x4 swizzled."),
                  alpha, T("d", {"M", "rank"}).desc("LoRA-down output x_hat @ L2^T, bf16."),
                  T("l1", {"N", "rank"}).desc("LoRA-up weight pre-divided by alpha, bf16.")},
       .outputs = {T("out", {"M", "N"}).dt("bfloat16")},
       .constraints = {"SF_A == " + sf_a_size},
       .derived = {{.name = "1", .by = 1}},
       .tags = {"quantization:fp4"},
       .reference =
           std::string(kMxHelpers) + kSvdHelpers + R"PY(def run(a, b, a_sf, b_sf, alpha, d, l1):
    m, n, k = a.shape[0], b.shape[0], a.shape[1] * 2
    x = _fp4_rows(a, _e4m3_bits(_unswizzle_128x4(a_sf, m, k // 16)))
    w = _fp4_rows(b, _e4m3_bits(_unswizzle_128x4(b_sf, n, k // 16)))
    out = alpha.float().reshape(()) * (x @ w.t() + d.float() @ l1.float().t())
    return out.to(torch.bfloat16)
)PY"});
  // svdquant_linear: nvfp4_quantize_smooth(x), d = bf16(x @ l2t_smoothed), then the GEMM above.
  v.push_back(
      {.op = "svdquant_linear",
       .op_type = "linear_nvfp4_svdquant",
       .name_prefix = "linear_nvfp4_svdquant",
       .description = "Full SVDQuant linear: y = (x * pre_quant_scale) @ (R + L1 @ L2)^T with R "
                      "the NVFP4 residual weight: smooth-quantize, bf16 rank-r down-projection, "
                      "then the NVFP4 residual + LoRA-up GEMM.",
       .axes = {var("M"), cst("N", "N"), cst("K", "K"), k_packed, sf_b, rank},
       .inputs = {T("x", {"M", "K"}).desc("Input activation, bf16."),
                  bytes("weight_fp4", {"N", "K_packed"}, "N, K_packed",
                        "NVFP4 residual weight, packed e2m1 as uint8."),
                  scales("weight_sf", "SF_B", "SF_B",
                         "Weight block scales, ue4m3 as uint8, 128x4 swizzled."),
                  alpha,
                  T("pre_quant_scale", {"K"})
                      .init("(torch.rand((K,), device=device) + 0.5).to({dtype:x})")
                      .desc("Per-input-channel smoothing scale, bf16."),
                  T("l2t_smoothed", {"K", "rank"})
                      .init("(torch.randn((K, rank), device=device) * 0.1).to({dtype:x})")
                      .desc("pre_quant_scale[:, None] * L2^T, bf16."),
                  T("l1_scaled", {"N", "rank"}).desc("L1 / alpha, bf16."),
                  T("global_scale", {"1"})
                      .synth("float32")
                      .init("torch.full((1,), 100.0, dtype=torch.float32, device=device)")
                      .desc("Activation global scale, float32 device scalar.")},
       .outputs = {T("out", {"M", "N"}).dt("bfloat16")},
       .derived = {{.name = "1", .by = 1}},
       .tags = {"quantization:fp4"},
       .reference =
           std::string(kMxHelpers) + kFp4Quant + kSvdHelpers +
           R"PY(def run(x, weight_fp4, weight_sf, alpha, pre_quant_scale, l2t_smoothed, l1_scaled,
        global_scale):
    m, k = x.shape
    n = weight_fp4.shape[0]
    xs = (x.float() * pre_quant_scale.float()).to(torch.bfloat16)
    q, bits = _nvfp4(xs, float(global_scale.float().reshape(-1)[0]), 16)
    a = _fp4_rows(q, _e4m3_bits(bits.reshape(m, k // 16)))
    w = _fp4_rows(weight_fp4, _e4m3_bits(_unswizzle_128x4(weight_sf, n, k // 16)))
    d = (x.float() @ l2t_smoothed.float()).to(torch.bfloat16)
    out = alpha.float().reshape(()) * (a @ w.t() + d.float() @ l1_scaled.float().t())
    return out.to(torch.bfloat16)
)PY"});
}

// ---------------------------------------------------------------------------------------------
// trtllm_batch_decode_with_kv_cache with enable_block_sparse_attention=True (upstream's only
// template for this op that we follow; a dense call writes nothing): per-KV-head page tables
// [num_kv_heads, batch, pages] and lengths [num_kv_heads, batch], the selected pages packed at the
// front of each row in ascending order (upstream's template description). Our op refuses block
// sparsity; the definition is written for the call as upstream's. The reference: HND cache with
// K and V halves (kv_cache_dim 2), q_len_per_req = num_tokens // batch_size queries per request,
// causal over the compacted per-head sequence when there are several.
void add_block_sparse_decode(std::vector<Template>& v) {
  v.push_back(
      {.op = "trtllm_batch_decode_with_kv_cache",
       .op_type = "trtllm_paged",
       .name_prefix = "trtllm_batch_decode_block_sparse",
       .description = "TRT-LLM paged decode with block-sparse attention: each KV head attends to "
                      "its own subset of KV cache pages (per-head block_tables and seq_lens).",
       .axes = trtllm_paged_axes(2, 6, "Maximum number of pages per sequence."),
       .inputs = {T("query", kPagedTok), trtllm_kv_cache(),
                  T("block_tables", {"num_kv_heads", "batch_size", "max_pages_per_seq"})
                      .synth("int32")
                      .init("torch.stack([torch.randperm(num_pages)[:batch_size * "
                            "max_pages_per_seq].sort().values.reshape(batch_size, "
                            "max_pages_per_seq) for _ in range(num_kv_heads)]).to(torch.int32)"),
                  T("seq_lens", {"num_kv_heads", "batch_size"})
                      .synth("int32")
                      .init("torch.randint(1, max_pages_per_seq * page_size + 1, (num_kv_heads, "
                            "batch_size), dtype=torch.int32)"),
                  S("max_seq_len", "int32").init("int(seq_lens.max())"),
                  S("bmm1_scale", "float32").opt(), S("bmm2_scale", "float32").opt(),
                  S("enable_block_sparse_attention", "bool").init("True")},
       .outputs = {T("output", kPagedTok)},
       .tags = {"status:verified", "stage:decode", "backend:trtllm"},
       .reference =
           R"PY(def run(query, kv_cache, block_tables, seq_lens, max_seq_len, bmm1_scale=None,
        bmm2_scale=None, enable_block_sparse_attention=True):
    num_tokens, num_heads, head_dim = query.shape
    _, kv_dim, num_kv_heads, page_size, _ = kv_cache.shape
    if kv_dim != 2:
        raise NotImplementedError("kv_cache_dim 1 (interleaved K/V)")
    s1 = 1.0 / math.sqrt(head_dim) if bmm1_scale is None else float(bmm1_scale)
    s2 = 1.0 if bmm2_scale is None else float(bmm2_scale)
    batch = block_tables.shape[1]
    q_len = num_tokens // batch
    group = num_heads // num_kv_heads
    out = torch.zeros(num_tokens, num_heads, head_dim)
    for b in range(batch):
        q = query[b * q_len:(b + 1) * q_len].float()
        for kh in range(num_kv_heads):
            n = int(seq_lens[kh, b])
            pages = block_tables[kh, b, :(n + page_size - 1) // page_size].long()
            k = kv_cache[pages, 0, kh].reshape(-1, head_dim)[:n].float()
            v = kv_cache[pages, 1, kh].reshape(-1, head_dim)[:n].float()
            # Query i of the request sees compacted positions j <= n - q_len + i.
            j = torch.arange(n).reshape(1, -1)
            i = torch.arange(q_len).reshape(-1, 1)
            masked = j > n - q_len + i
            for h in range(kh * group, (kh + 1) * group):
                logits = (q[:, h] @ k.t()) * s1
                p = torch.softmax(logits.masked_fill(masked, float("-inf")), dim=-1)
                out[b * q_len:(b + 1) * q_len, h] = (p @ v) * s2
    return out.to(query.dtype)
)PY",
       .select_param = "enable_block_sparse_attention",
       .select_values = {1}});
}

// ---------------------------------------------------------------------------------------------
// trtllm_gen_routing (flashinfer.fused_moe.trtllm_gen_routing): upstream's moe.py template,
// checked against its committed trtllm_gen_routing_e256_k8_t8.json. Upstream attaches no
// reference (the order of the pairs within an expert's block is not part of its contract); ours
// reproduces our CPU op's order, tokens in order within each expert (docs/MOE.md), for all ten
// routing methods, and returns the eight outputs with -1 beyond the defined parts (as our op).
const char* const kGenRoutingRef = R"PY(def _order(score, k):
    # Descending, ties to the lower index: the CPU op's first-maximum scan.
    return torch.sort(score, dim=1, descending=True, stable=True).indices[:, :k]

def run(routing_logits, routing_bias, routing_method, top_k, num_fused_shared_experts, n_group,
        topk_group, local_expert_offset, local_num_experts, routed_scaling_factor,
        tile_tokens_dim, norm_topk_prob):
    if int(num_fused_shared_experts) != 0:
        raise NotImplementedError("num_fused_shared_experts > 0")
    m, K, tile = int(routing_method), int(top_k), int(tile_tokens_dim)
    x = routing_logits.float()
    T, E = x.shape
    # The score the weights come from (Default/RenormalizeNaive: softmax; DeepSeekV3,
    # SigmoidRenorm, MiniMax2, Sigmoid: sigmoid; else the logits) and the one selecting (+ bias
    # for DeepSeekV3 and MiniMax2).
    if m in (0, 4):
        x = torch.softmax(x, dim=-1)
    elif m in (2, 6, 7, 8):
        x = torch.sigmoid(x)
    sel = x
    G = int(n_group) if int(n_group) > 0 else 1
    if routing_bias is not None and m in (2, 7):
        b = routing_bias.float().reshape(-1)
        if m == 2 and G > 1:
            b = b.to(torch.bfloat16).float()  # the grouped kernel adds the bias as bf16
        sel = x + b
    if m == 2 and G > 1:
        TG = int(topk_group) if int(topk_group) > 0 else G
        g = sel.reshape(T, G, E // G)
        gs = torch.topk(g, k=min(2, E // G), dim=2).values.sum(dim=2)
        keep = torch.zeros(T, G, dtype=torch.bool).scatter_(1, _order(gs, TG), True)
        sel = sel.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
    ids = _order(sel, K)
    w = x.gather(1, ids)
    s = w.sum(dim=1, keepdim=True)
    if m == 1:
        w = torch.softmax(w, dim=-1)
    elif m in (3, 9):
        w = torch.sigmoid(w)
    elif m == 4:
        w = w / s
    elif m == 6 and bool(norm_topk_prob):
        w = w / s.clamp(min=1e-20)
    elif m in (2, 7):
        w = w * float(routed_scaling_factor) / (s + 1e-20)
    # The permutation: each local expert's pairs in token-major, k-minor order, its block padded
    # to a multiple of the tile, blocks in expert order; one CTA per tile.
    L = E if local_num_experts is None else int(local_num_experts)
    local = ids.flatten() - int(local_expert_offset)
    here = (local >= 0) & (local < L)
    onehot = torch.nn.functional.one_hot(local.clamp(0, L - 1), L) * here.long().unsqueeze(1)
    rank = (onehot.cumsum(dim=0) - 1).gather(1, local.clamp(0, L - 1).unsqueeze(1)).squeeze(1)
    count = onehot.sum(dim=0)
    padded = (count + tile - 1) // tile * tile
    offset = torch.cat((torch.zeros(1, dtype=torch.long), padded.cumsum(dim=0)))
    slot = torch.where(here, offset[local.clamp(0, L - 1)] + rank, torch.full_like(rank, -1))
    filled = min(E, T * K)
    max_ctas = filled + (T * K - filled) // tile
    p2t = torch.full((max_ctas * tile,), -1, dtype=torch.int32)
    p2t[slot[here]] = (torch.arange(T * K) // K)[here].int()
    ctas = (count + tile - 1) // tile
    n = int(ctas.sum())
    batch = torch.repeat_interleave(torch.arange(L), ctas)
    first = torch.repeat_interleave(ctas.cumsum(dim=0) - ctas, ctas)
    j = torch.arange(n) - first
    limit = offset[batch] + torch.minimum((j + 1) * tile, count[batch])
    cta_batch = torch.full((max_ctas,), -1, dtype=torch.int32)
    cta_limit = torch.full((max_ctas,), -1, dtype=torch.int32)
    cta_batch[:n] = batch.int()
    cta_limit[:n] = limit.int()
    topk_ids = torch.where(here, ids.flatten(), torch.full_like(local, -1)).reshape(T, K)
    return (topk_ids.int(), w.to(torch.bfloat16), offset[L:].int(), slot.reshape(T, K).int(),
            p2t, cta_batch, cta_limit, torch.tensor([n], dtype=torch.int32))
)PY";

void add_gen_routing(std::vector<Template>& v) {
  auto i32 = [](const char* key, const char* init) { return S(key, "int32").init(init); };
  v.push_back(
      {.op = "trtllm_gen_routing",
       .op_type = "moe_routing",
       .name_prefix = "trtllm_gen_routing",
       .description = "Standalone trtllm-gen MoE routing: expert selection plus the padded "
                      "per-expert permutation the fused MoE kernels consume; topk_ids is -1 for a "
                      "non-local expert, entries beyond total_num_padded_tokens / the CTA count "
                      "are undefined upstream (-1 here). The reference fixes one valid order: "
                      "tokens in order within each expert's block.",
       .axes = {var("num_tokens", "", 6), cst("num_experts", "e"), cst("top_k", "k"),
                cst("tile_tokens_dim", "t"),
                var("max_num_ctas", "Routing::getMaxNumCtasInBatchDim bound."),
                var("max_num_padded_tokens", "Routing::getMaxPermutedPaddedCount bound."),
                var("one", "Placeholder for shape [1] output tensors.", 1)},
       .inputs = {T("routing_logits", {"num_tokens", "num_experts"}).desc("Router logits."),
                  // Upstream's example passes none; ours passes one (used by DeepSeekV3 and
                  // MiniMax2 only), so a test can switch the method on the same inputs.
                  T("routing_bias", {"num_experts"})
                      .opt()
                      .desc("Per-expert bias (DeepSeekV3/MiniMax2-style methods).")
                      .init("torch.randn((num_experts,), device=device) * 0.1"),
                  i32("routing_method", "1").desc("RoutingMethodType value."),
                  i32("top_k", "top_k"), i32("num_fused_shared_experts", "0"),
                  i32("n_group", "0").desc("Expert groups; 0 disables grouping."),
                  i32("topk_group", "0"),
                  i32("local_expert_offset", "0").desc("Expert-parallel shard."),
                  i32("local_num_experts", "num_experts").opt().desc("Defaults to num_experts."),
                  S("routed_scaling_factor", "float32").init("1.0"),
                  i32("tile_tokens_dim", "tile_tokens_dim"),
                  S("norm_topk_prob", "bool").init("True")},
       .outputs = {T("topk_ids", {"num_tokens", "top_k"}).dt("int32"),
                   T("topk_weights", {"num_tokens", "top_k"}).dt("bfloat16"),
                   T("total_num_padded_tokens", {"one"}).dt("int32"),
                   T("expanded_idx_to_permuted_idx", {"num_tokens", "top_k"}).dt("int32"),
                   T("permuted_idx_to_token_idx", {"max_num_padded_tokens"}).dt("int32"),
                   T("cta_idx_xy_to_batch_idx", {"max_num_ctas"}).dt("int32"),
                   T("cta_idx_xy_to_mn_limit", {"max_num_ctas"}).dt("int32"),
                   T("num_non_exiting_ctas", {"one"}).dt("int32")},
       .constraints = {"num_fused_shared_experts == 0"},
       .tags = {"status:verified", "moe", "moe:routing"},
       .reference = kGenRoutingRef});
}

// ---------------------------------------------------------------------------------------------

void add_more_attention(std::vector<Template>& v) {
  const std::string attend = kAttend;
  v.push_back(
      {.op = "single_decode_with_kv_cache",
       .op_type = "single_decode",
       .name_prefix = "single_decode",
       .description = "Single-request decode: q [num_qo_heads, head_dim] against "
                      "contiguous k, v [kv_len, num_kv_heads, head_dim]; no paging, no "
                      "plan().",
       .axes = {cst("num_qo_heads", "h"), cst("num_kv_heads", "kv"), cst("head_dim", "d"),
                var("kv_len", "Length of the K/V context.", 5)},
       .inputs =
           {T("q", {"num_qo_heads", "head_dim"}),
            T("k", {"kv_len", "num_kv_heads", "head_dim"}).desc("Keys (the NHD layout's dims)."),
            T("v", {"kv_len", "num_kv_heads", "head_dim"}).desc("Values (the NHD layout's dims).")},
       .outputs = {T("output", {"num_qo_heads", "head_dim"}).like("q")},
       .tags = {"status:verified", "stage:decode"},
       .reference = attend + R"PY(

def run(q, k, v):
    # sm_scale is not an input of the definition: 1/sqrt(head_dim), the op's default.
    out, _ = _attend(q.unsqueeze(0), k, v, 1.0 / math.sqrt(q.shape[-1]), False)
    return out[0].to(q.dtype)
)PY"});
  const std::string dense = attend + R"PY(

def run(q, k, v):
    # Neither causal nor sm_scale is an input of the definition: not causal, 1/sqrt(head_dim)
    # (the op's defaults).
    out, _ = _attend(q, k, v, 1.0 / math.sqrt(q.shape[-1]), False)
    return out.to(q.dtype)
)PY";
  v.push_back({.op = "single_prefill_with_kv_cache",
               .op_type = "single_prefill",
               .name_prefix = "single_prefill",
               .description = "Single-request prefill: q [qo_len, num_qo_heads, head_dim] against "
                              "contiguous k, v [kv_len, num_kv_heads, head_dim]; no paging, no "
                              "plan().",
               .axes = {cst("num_qo_heads", "h"), cst("num_kv_heads", "kv"), cst("head_dim", "d"),
                        var("qo_len", "Length of the query sequence.", 3),
                        var("kv_len", "Length of the K/V sequence.", 5)},
               .inputs = dense_qkv_inputs(),
               .outputs = {dense_output()},
               .tags = {"status:verified", "stage:prefill"},
               .reference = dense});
  v.push_back({.op = "BlockSparseAttentionWrapper.run",
               .op_type = "block_sparse",
               .name_prefix = "block_sparse_run",
               .description = "Block-sparse attention over q, k, v; the block mask is given to "
                              "plan() (the reference attends to every block).",
               .axes = {cst("num_qo_heads", "h"), cst("num_kv_heads", "kv"), cst("head_dim", "d"),
                        var("qo_len", "Query sequence length.", 3),
                        var("kv_len", "Key/value sequence length.", 5)},
               .inputs = dense_qkv_inputs(),
               .outputs = {dense_output()},
               .tags = {"status:verified", "sparse:block"},
               .reference = dense});

  // xqa_batch_decode_with_kv_cache (flashinfer.decode): trtllm_batch_decode's axes.
  v.push_back(
      {.op = "xqa_batch_decode_with_kv_cache",
       .op_type = "xqa",
       .name_prefix = "xqa_batch_decode",
       .description = "XQA paged decode: kv_cache [num_pages, kv_cache_dim, num_kv_heads, "
                      "page_size, head_dim] (HND, K and V halves), rectangular block_tables.",
       .axes = trtllm_paged_axes(2, 8, "Maximum number of pages per sequence."),
       .inputs = {T("query", kPagedTok), trtllm_kv_cache(), paged_block_tables("block_tables"),
                  T("seq_lens", {"batch_size"})
                      .synth("int32")
                      .init("torch.randint(1, max_pages_per_seq * page_size + 1, (batch_size,), "
                            "dtype=torch.int32)"),
                  S("max_seq_len", "int32").init("int(seq_lens.max())"),
                  S("bmm1_scale", "float32").opt(), S("bmm2_scale", "float32").opt()},
       .outputs = {T("output", kPagedTok).like("query")},
       .tags = {"status:verified", "stage:decode", "backend:xqa"},
       .reference = attend + R"PY(

def run(query, kv_cache, block_tables, seq_lens, max_seq_len, bmm1_scale=None, bmm2_scale=None):
    num_tokens, num_heads, head_dim = query.shape
    _, kv_dim, num_kv_heads, page_size, _ = kv_cache.shape
    if kv_dim != 2:
        raise NotImplementedError("kv_cache_dim 1 (interleaved K/V)")
    s1 = 1.0 / math.sqrt(head_dim) if bmm1_scale is None else float(bmm1_scale)
    s2 = 1.0 if bmm2_scale is None else float(bmm2_scale)
    batch = block_tables.shape[0]
    q_len = num_tokens // batch
    out = torch.zeros((num_tokens, num_heads, head_dim), dtype=torch.float32)
    for b in range(batch):
        n = int(seq_lens[b])
        pages = block_tables[b, :(n + page_size - 1) // page_size].long()
        # [pages, heads, page_size, dim] -> [tokens, heads, dim]
        k = kv_cache[pages, 0].permute(0, 2, 1, 3).reshape(-1, num_kv_heads, head_dim)[:n]
        v = kv_cache[pages, 1].permute(0, 2, 1, 3).reshape(-1, num_kv_heads, head_dim)[:n]
        rows = slice(b * q_len, (b + 1) * q_len)
        o, _ = _attend(query[rows], k, v, s1, True)
        out[rows] = o * s2
    return out.to(query.dtype)
)PY"});

  // trtllm_batch_decode_with_kv_cache without block sparsity (upstream's trtllm_batch_decode
  // template; the block-sparse one is add_block_sparse_decode's): xqa's axes, inputs and math.
  {
    Template dense = v.back();
    dense.op = "trtllm_batch_decode_with_kv_cache";
    dense.op_type = "trtllm_paged";
    dense.name_prefix = "trtllm_batch_decode";
    dense.description =
        "TRT-LLM paged decode: kv_cache [num_pages, kv_cache_dim, num_kv_heads, "
        "page_size, head_dim] (HND, K and V halves), rectangular block_tables.";
    dense.tags = {"status:verified", "stage:decode", "backend:trtllm"};
    dense.select_param = "enable_block_sparse_attention";
    dense.select_values = {0};
    v.push_back(std::move(dense));
  }

  // cudnn_batch_{decode,prefill}_with_kv_cache (flashinfer.cudnn): HND k/v caches.
  const std::vector<std::string> hnd = {"total_num_pages", "num_heads_kv", "page_size", "head_dim"};
  const auto cudnn_axes = [] {
    return std::vector<Axis>{
        var("batch_size", "", 2),
        var("total_num_pages", "", 8),
        var("num_pages_per_seq", "block_tables.shape[-1]; max pages used by any seq.", 3),
        cst("num_heads_qo", "h"),
        cst("num_heads_kv", "kv"),
        cst("head_dim", "d"),
        cst("page_size", "ps")};
  };
  const std::string tables_init =
      "torch.randperm(total_num_pages)[:batch_size * num_pages_per_seq]"
      ".reshape(batch_size, num_pages_per_seq).to(torch.int32)";
  v.push_back(
      {.op = "cudnn_batch_decode_with_kv_cache",
       .op_type = "cudnn_paged",
       .name_prefix = "cudnn_batch_decode",
       .description = "cuDNN paged decode: k_cache, v_cache [total_num_pages, "
                      "num_heads_kv, page_size, head_dim], rectangular block_tables; "
                      "every request max_sequence_kv tokens long (the definition has no "
                      "actual_seq_lens_kv).",
       .axes = cudnn_axes(),
       .inputs = {T("q", {"batch_size", "num_heads_qo", "head_dim"}), T("k_cache", hnd),
                  T("v_cache", hnd), S("scale", "float32").init("1.0 / math.sqrt(head_dim)"),
                  S("max_sequence_kv", "int32").init("num_pages_per_seq * page_size - 1"),
                  T("block_tables", {"batch_size", "num_pages_per_seq"})
                      .dt("int32")
                      .opt()
                      .init(tables_init)},
       .outputs = {T("output", {"batch_size", "num_heads_qo", "head_dim"}).like("q")},
       .tags = {"status:verified", "stage:decode", "backend:cudnn"},
       .reference = attend + R"PY(

def run(q, k_cache, v_cache, scale, max_sequence_kv, block_tables=None):
    if block_tables is None:
        raise NotImplementedError("contiguous K/V (block_tables None)")
    n = int(max_sequence_kv)
    page_size = k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32)
    for b in range(q.shape[0]):
        pages = block_tables[b, :(n + page_size - 1) // page_size].long()
        k = k_cache[pages].permute(0, 2, 1, 3).reshape(-1, k_cache.shape[1], q.shape[-1])[:n]
        v = v_cache[pages].permute(0, 2, 1, 3).reshape(-1, v_cache.shape[1], q.shape[-1])[:n]
        o, _ = _attend(q[b:b + 1], k, v, float(scale), False)
        out[b] = o[0]
    return out.to(q.dtype)
)PY"});
  auto prefill_axes = cudnn_axes();
  prefill_axes.push_back(var("num_tokens", "Total query tokens across the batch.", 4));
  const std::vector<std::string> qp = {"num_tokens", "num_heads_qo", "head_dim"};
  v.push_back(
      {.op = "cudnn_batch_prefill_with_kv_cache",
       .op_type = "cudnn_paged",
       .name_prefix = "cudnn_batch_prefill",
       .description = "cuDNN paged prefill with variable lengths (actual_seq_lens_q/kv); "
                      "k_cache, v_cache [total_num_pages, num_heads_kv, page_size, head_dim].",
       .axes = prefill_axes,
       .inputs = {T("q", qp), T("k_cache", hnd), T("v_cache", hnd),
                  S("scale", "float32").init("1.0 / math.sqrt(head_dim)"),
                  S("max_token_per_sequence", "int32").init("num_tokens // batch_size"),
                  S("max_sequence_kv", "int32").init("num_pages_per_seq * page_size"),
                  T("actual_seq_lens_q", {"batch_size"})
                      .synth("int32")
                      .init("torch.full((batch_size,), num_tokens // batch_size, "
                            "dtype=torch.int32)"),
                  T("actual_seq_lens_kv", {"batch_size"})
                      .synth("int32")
                      .init("torch.randint(num_tokens // batch_size, num_pages_per_seq * "
                            "page_size + 1, (batch_size,), dtype=torch.int32)"),
                  T("block_tables", {"batch_size", "num_pages_per_seq"})
                      .dt("int32")
                      .opt()
                      .init(tables_init),
                  S("causal", "int32").init("1"), S("return_lse", "int32").init("1")},
       .outputs = {T("output", qp).like("q"), T("lse", {"num_tokens", "num_heads_qo"})
                                                  .dt("float32")
                                                  .opt()
                                                  .desc("Only produced when return_lse=True.")},
       .tags = {"status:verified", "stage:prefill", "backend:cudnn"},
       .reference = attend + R"PY(

def run(q, k_cache, v_cache, scale, max_token_per_sequence, max_sequence_kv, actual_seq_lens_q,
        actual_seq_lens_kv, block_tables=None, causal=0, return_lse=0):
    if block_tables is None:
        raise NotImplementedError("contiguous K/V (block_tables None)")
    page_size = k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full(q.shape[:2], -float("inf"), dtype=torch.float32)
    lens_q, lens_kv = actual_seq_lens_q.reshape(-1), actual_seq_lens_kv.reshape(-1)
    start = 0
    for b in range(lens_q.shape[0]):
        m, n = int(lens_q[b]), int(lens_kv[b])
        pages = block_tables[b, :(n + page_size - 1) // page_size].long()
        k = k_cache[pages].permute(0, 2, 1, 3).reshape(-1, k_cache.shape[1], q.shape[-1])[:n]
        v = v_cache[pages].permute(0, 2, 1, 3).reshape(-1, v_cache.shape[1], q.shape[-1])[:n]
        o, s = _attend(q[start:start + m], k, v, float(scale), bool(causal))
        out[start:start + m], lse[start:start + m] = o, s
        start += m
    return out.to(q.dtype), (lse if return_lse else None)
)PY"});

  // BatchAttention.run (flashinfer.attention): upstream's template shapes kv_cache like q.
  const std::vector<std::string> qo = {"num_qo_tokens", "num_qo_heads", "head_dim"};
  v.push_back(
      {.op = "BatchAttention.run",
       .op_type = "gqa_paged",
       .name_prefix = "batch_attention_run",
       .description = "BatchAttention.run(): unified decode and prefill over a paged KV "
                      "cache; the layout comes from plan(). The definition shapes "
                      "kv_cache like q (upstream's template), read here as one request's "
                      "keys and values.",
       .axes = {var("num_qo_tokens", "Total query tokens.", 3), cst("num_qo_heads", "h"),
                var("num_kv_heads", "Set during plan(); not a dim of the run() signature."),
                cst("head_dim", "d")},
       .inputs = {T("q", qo), T("kv_cache", qo).desc("Paged KV cache (layout varies).")},
       .outputs = {T("output", qo).like("q"), T("lse", {"num_qo_tokens", "num_qo_heads"})
                                                  .dt("float32")
                                                  .desc("Base-2 log-sum-exp of the scores.")},
       .tags = {"status:verified"},
       .reference = attend + R"PY(

def run(q, kv_cache):
    k, v = kv_cache if isinstance(kv_cache, (tuple, list)) else (kv_cache, kv_cache)
    out, lse = _attend(q, k, v, 1.0 / math.sqrt(q.shape[-1]), False)
    return out.to(q.dtype), lse
)PY"});

  // PODWithPagedKVCacheWrapper.run / BatchPODWithPagedKVCacheWrapper.run (flashinfer.pod).
  const auto pod_axes = [] {
    return std::vector<Axis>{cst("num_qo_heads", "h"),
                             cst("num_kv_heads", "kv"),
                             cst("head_dim", "d"),
                             var("prefill_len", "Total prefill query tokens.", 3),
                             var("decode_batch_size", "Number of decode queries.", 2),
                             var("num_pages", "", 3),
                             cst("page_size", "ps")};
  };
  const std::vector<std::string> pre = {"prefill_len", "num_qo_heads", "head_dim"};
  const std::vector<std::string> dec = {"decode_batch_size", "num_qo_heads", "head_dim"};
  const std::vector<std::string> paged = {"num_pages", "page_size", "num_kv_heads", "head_dim"};
  const auto pod_outputs = [&] {
    return std::vector<Io>{T("output_p", pre).like("q_p"), T("output_d", dec).like("q_d")};
  };
  v.push_back(
      {.op = "PODWithPagedKVCacheWrapper.run",
       .op_type = "pod",
       .name_prefix = "pod_run",
       .description = "PODWithPagedKVCacheWrapper.run(): a prefill (q_p, k_p, v_p) and a decode "
                      "(q_d over paged_kv_cache_d) in one call; the reference's prefill is "
                      "causal, its decode attends to the whole cache as one request.",
       .axes = pod_axes(),
       .inputs = {T("q_p", pre), T("k_p", {"prefill_len", "num_kv_heads", "head_dim"}),
                  T("v_p", {"prefill_len", "num_kv_heads", "head_dim"}), T("q_d", dec),
                  T("paged_kv_cache_d", paged).desc("Paged KV cache for the decode branch.")},
       .outputs = pod_outputs(),
       .tags = {"status:verified", "stage:pod"},
       .reference = attend + R"PY(

def run(q_p, k_p, v_p, q_d, paged_kv_cache_d):
    scale = 1.0 / math.sqrt(q_p.shape[-1])
    out_p, _ = _attend(q_p, k_p, v_p, scale, True)
    out_d, _ = _attend(q_d, *_kv(paged_kv_cache_d), scale, False)
    return out_p.to(q_p.dtype), out_d.to(q_d.dtype)
)PY"});
  v.push_back(
      {.op = "BatchPODWithPagedKVCacheWrapper.run",
       .op_type = "pod",
       .name_prefix = "batch_pod_run",
       .description = "BatchPODWithPagedKVCacheWrapper.run(): batched prefill and decode, both "
                      "over paged caches; the reference's prefill is causal against its whole "
                      "cache, its decode attends to the whole decode cache.",
       .axes = pod_axes(),
       .inputs = {T("q_p", pre),
                  T("paged_kv_cache_p", paged).desc("Paged KV cache for the prefill branch."),
                  T("q_d", dec),
                  T("paged_kv_cache_d", paged).desc("Paged KV cache for the decode branch.")},
       .outputs = pod_outputs(),
       .tags = {"status:verified", "stage:pod"},
       .reference = attend + R"PY(

def run(q_p, paged_kv_cache_p, q_d, paged_kv_cache_d):
    scale = 1.0 / math.sqrt(q_p.shape[-1])
    out_p, _ = _attend(q_p, *_kv(paged_kv_cache_p), scale, True)
    out_d, _ = _attend(q_d, *_kv(paged_kv_cache_d), scale, False)
    return out_p.to(q_p.dtype), out_d.to(q_d.dtype)
)PY"});

  // MultiLevelCascadeAttentionWrapper.run (flashinfer.cascade): the levels come from plan().
  v.push_back(
      {.op = "MultiLevelCascadeAttentionWrapper.run",
       .op_type = "cascade_attention",
       .name_prefix = "multi_level_cascade_run",
       .description = "MultiLevelCascadeAttentionWrapper.run(): attention over several "
                      "shared-prefix levels merged by log-sum-exp; the levels come from "
                      "plan(), so the reference attends to the whole cache as one level.",
       .axes = {var("batch_size", "", 2), cst("num_qo_heads", "h"), cst("num_kv_heads", "kv"),
                cst("head_dim", "d"), var("num_pages", "", 3), cst("page_size", "ps")},
       .inputs = {T("q", {"batch_size", "num_qo_heads", "head_dim"}),
                  T("paged_kv_cache", paged).desc("Paged KV cache (tuple or single tensor).")},
       .outputs = {T("output", {"batch_size", "num_qo_heads", "head_dim"}).like("q")},
       .tags = {"status:verified", "cascade"},
       .reference = attend + R"PY(

def run(q, paged_kv_cache):
    out, _ = _attend(q, *_kv(paged_kv_cache), 1.0 / math.sqrt(q.shape[-1]), False)
    return out.to(q.dtype)
)PY"});

  // SegmentGEMMWrapper.run (flashinfer.gemm): x [total_rows, K] times per-segment weights.
  v.push_back({.op = "SegmentGEMMWrapper.run",
               .op_type = "segment_gemm",
               .name_prefix = "segment_gemm_run",
               .description = "SegmentGEMMWrapper.run(): batched GEMM over concatenated row "
                              "segments; the reference takes batch_size equal segments (the "
                              "definition has no seg_lens / seg_indptr).",
               .axes = {var("total_rows", "Total rows across all segments.", 6), cst("K", "k"),
                        cst("N", "n"), var("batch_size", "Number of segments.", 2)},
               .inputs = {T("x", {"total_rows", "K"}), T("weights", {"batch_size", "K", "N"})},
               .outputs = {T("output", {"total_rows", "N"}).like("x")},
               .tags = {"status:verified"},
               .reference = R"PY(def run(x, weights):
    segments = weights.shape[0]
    if x.shape[0] % segments:
        raise NotImplementedError("segments of unequal length (seg_indptr is not an input)")
    rows = x.shape[0] // segments
    out = [x[i * rows:(i + 1) * rows].float() @ weights[i].float() for i in range(segments)]
    return torch.cat(out).to(x.dtype)
)PY"});
}

// bmm_bf16 / bmm_fp8 (flashinfer.gemm.gemm_base): upstream's gemm.py templates (read at
// 04c6e9a3; upstream gives no name_prefix, so its op_type names the file, as our prefix).
void add_bmm(std::vector<Template>& v) {
  v.push_back({.op = "bmm_bf16",
               .op_type = "bmm_bf16",
               .name_prefix = "bmm_bf16",
               .description = "Batched matrix multiply C[b] = A[b] @ B[b] (bf16/fp16).",
               .axes = {var("batch_size", "", 2), var("M"), cst("N", "N"), cst("K", "K")},
               .inputs = {T("A", {"batch_size", "M", "K"}), T("B", {"batch_size", "K", "N"})},
               .outputs = {T("C", {"batch_size", "M", "N"}).like("A")},
               .tags = {"status:verified"},
               .reference = R"PY(def run(A, B):
    return (A.float() @ B.float()).to(A.dtype)
)PY"});
  v.push_back({.op = "bmm_fp8",
               .op_type = "bmm_fp8",
               .name_prefix = "bmm_fp8",
               .description = "Per-tensor FP8 batched matmul: e4m3 A [b, M, K] and B [b, K, N], "
                              "A_scale / B_scale one-element dequantization scales.",
               .axes = {var("batch_size", "", 2), var("M"), cst("N", "N"), cst("K", "K"),
                        var("scalar", "A/B scale tensor length (typically 1).", 1)},
               .inputs = {T("A", {"batch_size", "M", "K"}).synth("float8_e4m3fn"),
                          T("B", {"batch_size", "K", "N"}).synth("float8_e4m3fn"),
                          T("A_scale", {"scalar"})
                              .synth("float32")
                              .init("torch.rand((scalar,), device=device) + 0.5")
                              .desc("Per-tensor dequant scale for A."),
                          T("B_scale", {"scalar"})
                              .synth("float32")
                              .init("torch.rand((scalar,), device=device) + 0.5")
                              .desc("Per-tensor dequant scale for B."),
                          S("dtype", "int32").desc("Output dtype.")},
               .outputs = {T("C", {"batch_size", "M", "N"}).dt("bfloat16")},
               .tags = {"status:verified", "quantization:float8_e4m3fn"},
               .reference = R"PY(def run(A, B, A_scale, B_scale, dtype=None):
    out_dtype = dtype if isinstance(dtype, torch.dtype) else torch.bfloat16
    a = A.float() * A_scale.float().reshape(-1)[0]
    b = B.float() * B_scale.float().reshape(-1)[0]
    return (a @ b).to(out_dtype)
)PY"});
}

// rope_quantize_fp8 (flashinfer.rope): upstream's rope.py template (read at 010a611e), whose
// axes and inputs it shares with that file's mla_rope_quantize_fp8 (a num_k_heads axis, 3-D
// k_rope / k_nope). Our mla_rope_quantize_fp8 follows upstream's committed
// mla_rope_quantize_fp8_h128_rope64.json instead (no num_k_heads): the two generations differ.
void add_rope_quantize(std::vector<Template>& v) {
  const std::vector<Io> parts = rope_fp8_parts();
  v.push_back(
      {.op = "rope_quantize_fp8",
       .op_type = "rope",
       .name_prefix = "rope_quantize_fp8",
       .description = "RoPE + FP8 quantization: RoPE (cos/sin cache, NeoX halves or interleaved "
                      "pairs) on q_rope and k_rope, then every part times quant_scale_q / "
                      "quant_scale_kv, rounded to fp8 e4m3.",
       .axes = {var("nnz", "Total number of tokens across the batch."), cst("num_q_heads", "h"),
                cst("num_k_heads", "kv"), cst("rope_dim", "rope"),
                var("no_rope_dim", "Non-rotary dimension.", 8),
                var("max_seq_len", "cos_sin_cache length.", 16),
                cst("rotary_dim", "", "cos_sin_cache's width (the rotary dimension).")},
       .inputs = rope_fp8_inputs(parts, "True"),
       .outputs = rope_fp8_outputs(parts),
       .tags = {"status:verified", "fused", "quantize:fp8"},
       .reference =
           std::string(kRopeFp8Helpers) +
           R"PY(def run(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True, quant_scale_q=1.0,
        quant_scale_kv=1.0):
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache.float()[pos_ids.long()]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    q = _rotate(q_rope.float(), cos, sin, bool(is_neox))
    # k_rope [nnz, num_k_heads, rope_dim], or 2-D (MLA, one latent head).
    k = _rotate(k_rope.float(), cos if k_rope.dim() == 3 else cos[:, 0],
                sin if k_rope.dim() == 3 else sin[:, 0], bool(is_neox))
    return (_fp8(q, quant_scale_q), _fp8(k, quant_scale_kv), _fp8(q_nope, quant_scale_q),
            _fp8(k_nope, quant_scale_kv))
)PY"});
}

// apply_rope_with_cos_sin_cache(_inplace) (flashinfer.rope): upstream's rope.py templates (read
// at 010a611e): flattened query / key, head_size a scalar (its axis value), cos_sin_cache
// [max_seq_len, rotary_dim] with cos in the first half, sin in the second.
void add_rope_cos_sin(std::vector<Template>& v) {
  const std::vector<std::string> qd = {"nnz", "num_q_heads_x_head_size"};
  const std::vector<std::string> kd = {"nnz", "num_k_heads_x_head_size"};
  for (bool inplace : {false, true}) {
    std::vector<Io> out = {T(inplace ? "query" : "query_out", qd).like("query"),
                           T(inplace ? "key" : "key_out", kd).like("key")};
    if (inplace) {
      out[0].writes("query");
      out[1].writes("key");
    }
    const std::string op =
        std::string("apply_rope_with_cos_sin_cache") + (inplace ? "_inplace" : "");
    v.push_back(
        {.op = op,
         .op_type = "rope",
         .name_prefix = std::string("rope_cos_sin_cache") + (inplace ? "_inplace" : ""),
         .description = std::string("RoPE with a precomputed cos/sin cache (SGLang/vLLM "
                                    "layout): the first rotary_dim channels of each head of "
                                    "the flattened query and key, NeoX halves or interleaved "
                                    "pairs") +
                        (inplace ? ", written in place." : "."),
         .axes = {var("nnz", "Total number of tokens across the batch."),
                  cst("num_q_heads_x_head_size", "",
                      "num_q_heads * head_size (flattened query dimension)."),
                  cst("num_k_heads_x_head_size", "",
                      "num_k_heads * head_size (flattened key dimension)."),
                  cst("head_size", "d"),
                  var("max_seq_len", "cos_sin_cache length (max supported position).", 16),
                  cst("rotary_dim", "", "Rotary dimension (cos+sin concatenated).")},
         .inputs = {rope_positions("positions"), T("query", qd), T("key", kd),
                    S("head_size", "int32").init("head_size"), rope_cos_sin_cache(),
                    S("is_neox", "int32").opt().init("True")},
         .outputs = out,
         .tags = {"status:verified"},
         .reference = R"PY(def _rotate(x, cos, sin, neox):
    r = cos.shape[-1] * 2
    x_rot, x_pass = x[..., :r], x[..., r:]
    if neox:
        x1, x2 = x_rot[..., : r // 2], x_rot[..., r // 2 :]
        y = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        y = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    return torch.cat([y, x_pass], dim=-1)

def run(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache.float()[positions.long()]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    n = query.shape[0]
    q = _rotate(query.float().reshape(n, -1, int(head_size)), cos, sin, bool(is_neox))
    k = _rotate(key.float().reshape(n, -1, int(head_size)), cos, sin, bool(is_neox))
    return q.reshape(query.shape).to(query.dtype), k.reshape(key.shape).to(key.dtype)
)PY"});
  }
}

}  // namespace

const std::vector<Template>& templates() {
  static const auto* all = [] {
    auto* v = new std::vector<Template>();
    add_norm(*v);
    add_activation(*v);
    add_cascade(*v);
    add_sampling(*v);
    add_attention(*v);
    add_rope(*v);
    add_page(*v);
    add_gemm(*v);
    add_prefill(*v);
    add_ragged_and_mla(*v);
    add_quant_gemm(*v);
    add_rope_quant_and_fmha(*v);
    add_moe(*v);
    add_string_selected(*v);
    add_svdquant(*v);
    add_block_sparse_decode(*v);
    add_gen_routing(*v);
    add_more_attention(*v);
    add_bmm(*v);
    add_rope_quantize(*v);
    add_rope_cos_sin(*v);
    add_moe_entry_points(*v);
    add_attention_extra(*v);
    return v;
  }();
  return *all;
}

}  // namespace flashinfer::trace::detail
