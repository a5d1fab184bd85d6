// Attention through a compiled module
// (flashinfer.decode.single_decode_with_kv_cache_with_jit_module,
// flashinfer.prefill.single_prefill_with_kv_cache_with_jit_module).
//
// Upstream compiles a module from a JitSpec (flashinfer.jit.attention.gen_single_decode_module /
// gen_single_prefill_module, then build_and_load()) and hands it to these two functions, which
// pass their *args straight to the module's raw `run`. Here the standard modules (upstream's
// DefaultAttention variant) are AttentionJitModule objects named by upstream's uri; running one
// is single_decode / single_prefill_with_kv_cache's own computation, on the CPU reference and the
// CUDA kernels. Modules compiled from a caller's own variant source (gen_customize_*) have no
// reference here and are not built. docs/ATTENTION.md, "Attention through a JIT module".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// A loaded single-request attention module of the standard variant. It is recorded as upstream
/// records a module argument, {"type": "Module", "repr": ...}, with the uri in the repr
/// ("Module(uri=single_decode_with_kv_cache_dtype_q_f16_...)"), so a replay rebuilds it.
class AttentionJitModule : public ApiObject {
 public:
  enum class Kind { kSingleDecode, kSinglePrefill };
  /// What upstream's gen_single_{decode,prefill}_module take (and its uri spells).
  struct Params {
    Kind kind = Kind::kSingleDecode;
    std::string backend = "fa2";  // prefill only; upstream's "fa3" (sm90) module is not built
    DType dtype_q = DType::kFloat16, dtype_kv = DType::kFloat16, dtype_o = DType::kFloat16;
    int64_t head_dim_qk = 128, head_dim_vo = 128;
    int64_t pos_encoding_mode = 0;  // 0 NONE, 1 ROPE_LLAMA, 2 ALIBI
    bool use_sliding_window = false;
    bool use_logits_soft_cap = false;
    bool use_fp16_qk_reduction = false;  // prefill; no effect here (scores in fp32)
  };

  /// Checks `p` (Error naming gen_single_{decode,prefill}_module and the parameter).
  explicit AttentionJitModule(Params p);
  const Params& params() const { return p_; }
  /// Upstream's uri: "single_decode_with_kv_cache_dtype_q_f16_dtype_kv_f16_dtype_o_f16_
  /// head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False"; prefill adds
  /// "_f16qk_False".
  const std::string& uri() const { return uri_; }

  std::string_view class_name() const override { return "Module"; }
  std::string_view module_name() const override { return "tvm_ffi"; }
  std::string repr() const override { return "Module(uri=" + uri_ + ")"; }

  /// The module a uri names; nullptr when it names none that this library builds.
  static std::shared_ptr<AttentionJitModule> from_uri(std::string_view uri);

 private:
  Params p_;
  std::string uri_;
};

/// Upstream's JitSpec for these modules: `name` is the uri; build_and_load() gives the module
/// (nothing is compiled: the kernels are the library's own).
struct JitSpec {
  std::string name;
  AttentionJitModule::Params params;
  std::shared_ptr<AttentionJitModule> build_and_load() const;
};

/// flashinfer.jit.attention.gen_single_decode_module: the standard decode module. dtypes are
/// those upstream's uri can name; the module runs fp16 / bf16 q and o with K/V of q's dtype or
/// fp8 (e4m3 / e5m2).
JitSpec gen_single_decode_module(DType dtype_q, DType dtype_kv, DType dtype_o, int64_t head_dim_qk,
                                 int64_t head_dim_vo, int64_t pos_encoding_mode,
                                 bool use_sliding_window, bool use_logits_soft_cap);
/// flashinfer.jit.attention.gen_single_prefill_module: the standard prefill module, backend
/// "fa2" ("fa3" refused as not built; anything else invalid, as upstream).
JitSpec gen_single_prefill_module(std::string_view backend, DType dtype_q, DType dtype_kv,
                                  DType dtype_o, int64_t head_dim_qk, int64_t head_dim_vo,
                                  int64_t pos_encoding_mode, bool use_sliding_window,
                                  bool use_logits_soft_cap, bool use_fp16_qk_reduction);

/// Runs a decode module: q [Hq, D], k / v [kv_len, Hkv, D] ("NHD") or [Hkv, kv_len, D] ("HND").
/// `args` are the module's raw extra arguments, upstream's *args, as a tuple:
/// (alibi_slopes or None, logits_soft_cap, sm_scale, rope_rcp_scale, rope_rcp_theta), the last
/// two the reciprocals of rope_scale and rope_theta. The module's flags decide which are read:
/// the slopes ([Hq] fp32, required) only with pos_encoding_mode 2, the soft cap (> 0) only with
/// use_logits_soft_cap, the RoPE pair only with pos_encoding_mode 1, window_left only with
/// use_sliding_window. Returns o [Hq, D] in q's dtype; never an LSE (return_lse computes it and
/// drops it, as upstream does).
Tensor single_decode_with_kv_cache_with_jit_module(
    const std::shared_ptr<AttentionJitModule>& jit_module, const Tensor& q, const Tensor& k,
    const Tensor& v, Value args = Value::tuple({}), std::string_view kv_layout = "NHD",
    int64_t window_left = -1, bool return_lse = false);

/// Runs a prefill module: q [qo_len, Hq, Dqk], k [kv_len, Hkv, Dqk], v [kv_len, Hkv, Dvo].
/// `args`: (packed_custom_mask or None, alibi_slopes or None, k_sf or None, v_sf or None,
/// logits_soft_cap, sm_scale, rope_rcp_scale, rope_rcp_theta). mask_mode is upstream's MaskMode
/// code: 0 NON_CAUSAL, 1 CAUSAL, 2 CUSTOM (the packed mask, little-endian bits of the flattened
/// [qo_len, kv_len] mask, required); 3 MULTIITEMSCORING is refused, as are NVFP4 scale factors.
/// Returns o [qo_len, Hq, Dvo] in q's dtype, and lse [qo_len, Hq] with return_lse.
AttentionOutput single_prefill_with_kv_cache_with_jit_module(
    const std::shared_ptr<AttentionJitModule>& jit_module, const Tensor& q, const Tensor& k,
    const Tensor& v, Value args = Value::tuple({}), std::string_view kv_layout = "NHD",
    int64_t mask_mode = 0, int64_t window_left = -1, bool return_lse = false);

/// A module argument: the live object, or (replay) the module its recorded repr names. A module
/// upstream recorded is known only by a repr without its uri and is refused by name (upstream's
/// own replay cannot rerun such a call either).
template <>
struct ArgTraits<std::shared_ptr<AttentionJitModule>> {
  static constexpr ParamKind kind = ParamKind::kObject;
  static constexpr bool optional = false;
  static std::shared_ptr<AttentionJitModule> get(const CallArgs& a, std::size_t i);
};

}  // namespace flashinfer
