// The standard attention modules (flashinfer/ops/attention_jit_module.h): upstream's uri, the
// module argument of a replayed call, and the raw *args of a module's run.
#include "api/attention_jit_module.h"

#include <cmath>
#include <string>

#include "api/checks.h"
#include "flashinfer/error.h"

namespace flashinfer {

namespace api {

const char* filename_safe_dtype(DType d) {
  switch (d) {
    case DType::kFloat16:
      return "f16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat8E4M3FN:
      return "e4m3";
    case DType::kFloat8E5M2:
      return "e5m2";
    case DType::kInt8:
      return "i8";
    case DType::kUInt8:
      return "u8";
    case DType::kInt32:
      return "i32";
    case DType::kInt64:
      return "i64";
    default:
      return nullptr;
  }
}

}  // namespace api

namespace {

using JmKind = AttentionJitModule::Kind;

const char* jm_gen_name(JmKind k) {
  return k == JmKind::kSingleDecode ? "gen_single_decode_module" : "gen_single_prefill_module";
}

std::optional<DType> jm_dtype_from_uri(std::string_view s) {
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3FN, DType::kFloat8E5M2,
                  DType::kInt8, DType::kUInt8, DType::kInt32, DType::kInt64}) {
    if (s == api::filename_safe_dtype(d)) return d;
  }
  return std::nullopt;
}

const char* jm_py_bool(bool b) { return b ? "True" : "False"; }

void jm_check_params(const AttentionJitModule::Params& p) {
  const char* op = jm_gen_name(p.kind);
  if (p.kind == JmKind::kSinglePrefill) {
    FLASHINFER_CHECK_CODE(p.backend != "fa3", ErrorCode::kUnsupported, op, "backend",
                          "\"fa3\" (upstream's SM90 module) is not built by this library; its "
                          "\"fa2\" module has the same DefaultAttention math");
    FLASHINFER_CHECK(p.backend == "fa2", op, "backend", "Invalid backend: ", p.backend,
                     " (\"fa2\"; \"auto\" is resolved before a module is generated)");
  }
  const std::pair<const char*, DType> dtypes[] = {
      {"dtype_q", p.dtype_q}, {"dtype_kv", p.dtype_kv}, {"dtype_o", p.dtype_o}};
  for (const auto& [name, d] : dtypes) {
    FLASHINFER_CHECK(api::filename_safe_dtype(d) != nullptr, op, name, dtype_torch_name(d),
                     " has no name in upstream's module uri (filename_safe_dtype_map)");
  }
  FLASHINFER_CHECK_CODE(p.dtype_q == DType::kFloat16 || p.dtype_q == DType::kBFloat16,
                        ErrorCode::kUnsupported, op, "dtype_q", dtype_torch_name(p.dtype_q),
                        " is not supported (torch.float16, torch.bfloat16)");
  FLASHINFER_CHECK_CODE(p.dtype_kv == p.dtype_q || dtype_is_fp8(p.dtype_kv),
                        ErrorCode::kUnsupported, op, "dtype_kv", dtype_torch_name(p.dtype_kv),
                        " must be dtype_q or an fp8 dtype");
  FLASHINFER_CHECK_CODE(p.dtype_o == DType::kFloat16 || p.dtype_o == DType::kBFloat16,
                        ErrorCode::kUnsupported, op, "dtype_o", dtype_torch_name(p.dtype_o),
                        " is not supported (torch.float16, torch.bfloat16)");
  api::check_head_dim(p.head_dim_qk, op, "head_dim_qk");
  api::check_head_dim(p.head_dim_vo, op, "head_dim_vo");
  FLASHINFER_CHECK(p.pos_encoding_mode >= 0 && p.pos_encoding_mode <= 2, op, "pos_encoding_mode",
                   "must be 0 (NONE), 1 (ROPE_LLAMA) or 2 (ALIBI), got ", p.pos_encoding_mode);
}

std::string jm_make_uri(const AttentionJitModule::Params& p) {
  const bool decode = p.kind == JmKind::kSingleDecode;
  std::string u = decode ? "single_decode_with_kv_cache" : "single_prefill_with_kv_cache";
  u += std::string("_dtype_q_") + api::filename_safe_dtype(p.dtype_q) + "_dtype_kv_" +
       api::filename_safe_dtype(p.dtype_kv) + "_dtype_o_" + api::filename_safe_dtype(p.dtype_o) +
       "_head_dim_qk_" + std::to_string(p.head_dim_qk) + "_head_dim_vo_" +
       std::to_string(p.head_dim_vo) + "_posenc_" + std::to_string(p.pos_encoding_mode) +
       "_use_swa_" + jm_py_bool(p.use_sliding_window) + "_use_logits_cap_" +
       jm_py_bool(p.use_logits_soft_cap);
  if (!decode) {
    u += std::string("_f16qk_") + jm_py_bool(p.use_fp16_qk_reduction);
    if (p.backend == "fa3") u += "_sm90";
  }
  return u;
}

// Reads upstream's uri back into parameters (no checks beyond the spelling).
std::optional<AttentionJitModule::Params> jm_parse_uri(std::string_view uri) {
  AttentionJitModule::Params p;
  std::string_view rest = uri;
  const auto eat = [&](std::string_view lit) {
    if (!rest.starts_with(lit)) return false;
    rest.remove_prefix(lit.size());
    return true;
  };
  const auto token = [&] {
    const auto end = rest.find('_');
    const std::string_view t = rest.substr(0, end);
    rest.remove_prefix(t.size());
    return t;
  };
  const auto dtype = [&](std::string_view key, DType* out) {
    if (!eat(key)) return false;
    const auto d = jm_dtype_from_uri(token());
    if (d) *out = *d;
    return d.has_value();
  };
  const auto integer = [&](std::string_view key, int64_t* out) {
    if (!eat(key)) return false;
    const std::string_view t = token();
    if (t.empty() || t.size() > 6 || t.find_first_not_of("0123456789") != std::string_view::npos) {
      return false;
    }
    *out = std::stoll(std::string(t));
    return true;
  };
  const auto boolean = [&](std::string_view key, bool* out) {
    if (!eat(key)) return false;
    const std::string_view t = token();
    *out = t == "True";
    return t == "True" || t == "False";
  };
  if (eat("single_decode_with_kv_cache")) {
    p.kind = JmKind::kSingleDecode;
  } else if (eat("single_prefill_with_kv_cache")) {
    p.kind = JmKind::kSinglePrefill;
  } else {
    return std::nullopt;
  }
  if (!dtype("_dtype_q_", &p.dtype_q) || !dtype("_dtype_kv_", &p.dtype_kv) ||
      !dtype("_dtype_o_", &p.dtype_o) || !integer("_head_dim_qk_", &p.head_dim_qk) ||
      !integer("_head_dim_vo_", &p.head_dim_vo) || !integer("_posenc_", &p.pos_encoding_mode) ||
      !boolean("_use_swa_", &p.use_sliding_window) ||
      !boolean("_use_logits_cap_", &p.use_logits_soft_cap)) {
    return std::nullopt;
  }
  if (p.kind == JmKind::kSinglePrefill) {
    if (!boolean("_f16qk_", &p.use_fp16_qk_reduction)) return std::nullopt;
    if (eat("_sm90")) p.backend = "fa3";
  }
  if (!rest.empty()) return std::nullopt;
  return p;
}

}  // namespace

AttentionJitModule::AttentionJitModule(Params p) : p_(std::move(p)) {
  if (p_.kind == JmKind::kSingleDecode) p_.backend = "fa2";  // a decode uri names no backend
  jm_check_params(p_);
  uri_ = jm_make_uri(p_);
}

std::shared_ptr<AttentionJitModule> AttentionJitModule::from_uri(std::string_view uri) {
  const auto p = jm_parse_uri(uri);
  if (!p) return nullptr;
  // A spelling that parses but is not upstream's (leading zeros, say) names no module.
  if (jm_make_uri(*p) != uri) return nullptr;
  return std::make_shared<AttentionJitModule>(*p);  // checks: fa3 and the dtypes refused by name
}

std::shared_ptr<AttentionJitModule> JitSpec::build_and_load() const {
  auto m = std::make_shared<AttentionJitModule>(params);
  FLASHINFER_CHECK(m->uri() == name, "JitSpec.build_and_load", "name", "\"", name,
                   "\" is not the uri of its parameters (\"", m->uri(), "\")");
  return m;
}

namespace {
// Both gen functions: the parameters checked, the uri built.
JitSpec jm_spec(JmKind kind, std::string_view backend, DType dtype_q, DType dtype_kv, DType dtype_o,
                int64_t head_dim_qk, int64_t head_dim_vo, int64_t pos_encoding_mode,
                bool use_sliding_window, bool use_logits_soft_cap, bool use_fp16_qk_reduction) {
  const AttentionJitModule::Params p{.kind = kind,
                                     .backend = std::string(backend),
                                     .dtype_q = dtype_q,
                                     .dtype_kv = dtype_kv,
                                     .dtype_o = dtype_o,
                                     .head_dim_qk = head_dim_qk,
                                     .head_dim_vo = head_dim_vo,
                                     .pos_encoding_mode = pos_encoding_mode,
                                     .use_sliding_window = use_sliding_window,
                                     .use_logits_soft_cap = use_logits_soft_cap,
                                     .use_fp16_qk_reduction = use_fp16_qk_reduction};
  jm_check_params(p);
  return JitSpec{jm_make_uri(p), p};
}
}  // namespace

JitSpec gen_single_decode_module(DType dtype_q, DType dtype_kv, DType dtype_o, int64_t head_dim_qk,
                                 int64_t head_dim_vo, int64_t pos_encoding_mode,
                                 bool use_sliding_window, bool use_logits_soft_cap) {
  return jm_spec(JmKind::kSingleDecode, "fa2", dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo,
                 pos_encoding_mode, use_sliding_window, use_logits_soft_cap, false);
}

JitSpec gen_single_prefill_module(std::string_view backend, DType dtype_q, DType dtype_kv,
                                  DType dtype_o, int64_t head_dim_qk, int64_t head_dim_vo,
                                  int64_t pos_encoding_mode, bool use_sliding_window,
                                  bool use_logits_soft_cap, bool use_fp16_qk_reduction) {
  return jm_spec(JmKind::kSinglePrefill, backend, dtype_q, dtype_kv, dtype_o, head_dim_qk,
                 head_dim_vo, pos_encoding_mode, use_sliding_window, use_logits_soft_cap,
                 use_fp16_qk_reduction);
}

std::shared_ptr<AttentionJitModule> ArgTraits<std::shared_ptr<AttentionJitModule>>::get(
    const CallArgs& a, std::size_t i) {
  const Value& v = a[i];
  const std::string& op = a.decl().name;
  FLASHINFER_CHECK(v.kind() == Value::Kind::kObject, op, "jit_module",
                   "expected a module (gen_single_*_module(...).build_and_load()), got ", v.repr());
  const ObjectRef& ref = v.as_object();
  if (ref.get() != nullptr) {
    auto* p = &a.object_as<AttentionJitModule>(i);
    return ref.object
               ? std::shared_ptr<AttentionJitModule>(ref.object, p)
               : std::shared_ptr<AttentionJitModule>(std::shared_ptr<AttentionJitModule>{}, p);
  }
  // A recorded module: this library's repr carries the uri.
  const auto at = ref.repr.find("uri=");
  if (at != std::string::npos) {
    const auto start = at + 4;
    const auto end = ref.repr.find_first_of("), '\"", start);
    const std::string uri =
        ref.repr.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::shared_ptr<AttentionJitModule> m;
    try {
      m = AttentionJitModule::from_uri(uri);
    } catch (const Error& e) {  // a uri of upstream's that names a module not built here
      FLASHINFER_FAIL(e.code(), op, "jit_module", "the recorded module ", uri, ": ", e.detail());
    }
    if (m) return m;
  }
  FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "jit_module", "the module is recorded only as ",
                  ref.type, " '", ref.repr.substr(0, 200),
                  "', which names no module this library builds (its own records carry the "
                  "uri of a standard module); upstream's replay cannot rerun this call either");
}

namespace api {

namespace {

double jm_number(const Value& x, std::size_t i, const char* what, const char* op) {
  FLASHINFER_CHECK(x.kind() == Value::Kind::kFloat || x.kind() == Value::Kind::kInt, op, "args",
                   "args[", i, "] (", what, ") must be a number, got ", x.repr());
  return x.as_float();
}

std::optional<Tensor> jm_tensor(const Value& x, std::size_t i, const char* what, const char* op) {
  if (x.is_none()) return std::nullopt;
  FLASHINFER_CHECK(x.is_tensor(), op, "args", "args[", i, "] (", what,
                   ") must be a tensor or None, got ", x.repr());
  return x.as_tensor();
}

}  // namespace

ModuleArgs read_module_args(const std::shared_ptr<AttentionJitModule>& m,
                            AttentionJitModule::Kind kind, const Value& args, const Tensor& q,
                            const Tensor& k, const Tensor& v, int64_t window_left,
                            int64_t mask_mode, const char* op) {
  FLASHINFER_CHECK(m != nullptr, op, "jit_module", "must be a module, got None");
  const bool decode = kind == JmKind::kSingleDecode;
  check_single_qkv(q, k, v, decode ? 2 : 3, op);
  const int64_t num_qo_heads = q.size(decode ? 0 : 1);  // decode q [H, D], prefill [qo, H, D]
  const AttentionJitModule::Params& p = m->params();
  FLASHINFER_CHECK(p.kind == kind, op, "jit_module", m->uri(), " is a ",
                   decode ? "prefill" : "decode", " module");
  // Upstream's run reads the memory as the module's types and sizes whatever the tensors are.
  FLASHINFER_CHECK(q.dtype() == p.dtype_q, op, "q", "dtype ", dtype_torch_name(q.dtype()),
                   " is not the module's dtype_q ", dtype_torch_name(p.dtype_q));
  FLASHINFER_CHECK(k.dtype() == p.dtype_kv, op, "k", "dtype ", dtype_torch_name(k.dtype()),
                   " is not the module's dtype_kv ", dtype_torch_name(p.dtype_kv));
  FLASHINFER_CHECK(p.dtype_o == q.dtype(), op, "jit_module", "dtype_o ",
                   dtype_torch_name(p.dtype_o), " differs from q's dtype, in which o is allocated");
  FLASHINFER_CHECK(q.size(-1) == p.head_dim_qk, op, "q", "head_dim ", q.size(-1),
                   " is not the module's head_dim_qk ", p.head_dim_qk);
  FLASHINFER_CHECK(v.size(-1) == p.head_dim_vo, op, "v", "head_dim ", v.size(-1),
                   " is not the module's head_dim_vo ", p.head_dim_vo);
  FLASHINFER_CHECK(!decode || p.head_dim_qk == p.head_dim_vo, op, "v",
                   "CUDA cores template only supports equal head dim for QK and VO, got ",
                   p.head_dim_qk, " and ", p.head_dim_vo);
  FLASHINFER_CHECK(args.is_sequence(), op, "args", "expected the module's extra arguments, got ",
                   args.repr());
  const auto& a = args.items();
  const std::size_t n = decode ? 5 : 8;
  FLASHINFER_CHECK(a.size() == n, op, "args", "the module takes ", n, " extra arguments (",
                   decode ? "alibi_slopes, logits_soft_cap, sm_scale, rope_rcp_scale, "
                            "rope_rcp_theta"
                          : "custom_mask, alibi_slopes, k_sf, v_sf, logits_soft_cap, sm_scale, "
                            "rope_rcp_scale, rope_rcp_theta",
                   "), got ", a.size());
  ModuleArgs r;
  r.call.op = op;
  std::size_t i = 0;
  std::optional<Tensor> mask;
  if (!decode) {
    mask = jm_tensor(a[i], i, "custom_mask", op);
    ++i;
  }
  const std::optional<Tensor> alibi = jm_tensor(a[i], i, "alibi_slopes", op);
  ++i;
  if (!decode) {
    for (const char* sf : {"k_sf", "v_sf"}) {
      FLASHINFER_CHECK_CODE(!jm_tensor(a[i], i, sf, op), ErrorCode::kUnsupported, op, "args",
                            "args[", i, "] (", sf,
                            "): NVFP4 scale factors through a module are not supported (use "
                            "single_prefill_with_kv_cache's kv_cache_sf)");
      ++i;
    }
  }
  const double cap = jm_number(a[i], i, "logits_soft_cap", op);
  ++i;
  r.sm_scale = jm_number(a[i], i, "sm_scale", op);
  FLASHINFER_CHECK(std::isfinite(r.sm_scale), op, "args", "args[", i,
                   "] (sm_scale) must be finite, got ", r.sm_scale);
  ++i;
  const double rcp_scale = jm_number(a[i], i, "rope_rcp_scale", op);
  const double rcp_theta = jm_number(a[i + 1], i + 1, "rope_rcp_theta", op);

  // What the module's flags read; the rest is ignored, as by upstream's kernels.
  if (p.use_logits_soft_cap) {
    FLASHINFER_CHECK(std::isfinite(cap) && cap > 0.0, op, "args",
                     "logits_soft_cap must be > 0 for a module built with use_logits_soft_cap, "
                     "got ",
                     cap);
    r.logits_soft_cap = cap;
  }
  // Upstream's variant reads any negative window_left as "no window" (kv_len).
  if (p.use_sliding_window && window_left >= 0) r.window_left = window_left;
  if (p.pos_encoding_mode == 1) {
    FLASHINFER_CHECK(
        std::isfinite(rcp_scale) && rcp_scale > 0.0 && std::isfinite(rcp_theta) && rcp_theta > 0.0,
        op, "args",
        "rope_rcp_scale and rope_rcp_theta must be finite and positive, "
        "got ",
        rcp_scale, " and ", rcp_theta);
    r.pos_encoding_mode = "ROPE_LLAMA";
    r.call.rope_rcp_scale = rcp_scale;
    r.call.rope_rcp_theta = rcp_theta;
  } else if (p.pos_encoding_mode == 2) {
    FLASHINFER_CHECK(alibi.has_value(), op, "args",
                     "alibi_slopes are required by a module built with pos_encoding_mode 2 "
                     "(ALIBI)");
    FLASHINFER_CHECK(
        alibi->dtype() == DType::kFloat32 && alibi->dim() == 1 && alibi->size(0) == num_qo_heads,
        op, "args", "alibi_slopes must be float32 [", num_qo_heads, "], got ",
        dtype_torch_name(alibi->dtype()), " ", shape_to_string(alibi->shape()));
    check_same_device(*alibi, q, op, "args", "q");
    const Tensor host = alibi->to(Device::cpu()).contiguous();
    const float* s = host.data<const float>();
    r.call.alibi_slopes.assign(s, s + num_qo_heads);
    r.pos_encoding_mode = "ALIBI";
  }
  if (!decode) {
    FLASHINFER_CHECK(mask_mode >= 0 && mask_mode <= 3, op, "mask_mode",
                     "must be a MaskMode value (0 NON_CAUSAL, 1 CAUSAL, 2 CUSTOM, 3 "
                     "MULTIITEMSCORING), got ",
                     mask_mode);
    FLASHINFER_CHECK_CODE(mask_mode != 3, ErrorCode::kUnsupported, op, "mask_mode",
                          "3 (MULTIITEMSCORING) takes the batch prefill wrappers' prefix "
                          "lengths, which a single-request module has no argument for");
    if (mask_mode == 2) {
      FLASHINFER_CHECK(mask.has_value(), op, "args",
                       "mask_mode 2 (CUSTOM) needs the packed custom mask as args[0]");
      r.packed_custom_mask = mask;
    }
  }
  return r;
}

Error module_arg_error(const Error& e) {
  const std::string& a = e.arg();
  std::string arg = a;
  if (a == "causal") {
    arg = "mask_mode";
  } else if (a == "pos_encoding_mode") {
    arg = "jit_module";
  } else if (a == "packed_custom_mask" || a == "sm_scale" || a == "logits_soft_cap" ||
             a == "rope_scale" || a == "rope_theta") {
    arg = "args";
  }
  return Error(e.code(), e.op(), arg, e.detail(), e.file(), e.line());
}

void apply_jit_module_call(detail::WrapperState& s, const JitModuleCall& c) {
  if (s.pos_encoding == 2) s.alibi_slopes = c.alibi_slopes;
  s.rope_rcp_scale = c.rope_rcp_scale;
  s.rope_rcp_theta = c.rope_rcp_theta;
}

}  // namespace api

}  // namespace flashinfer
