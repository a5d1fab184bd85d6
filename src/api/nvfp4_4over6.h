// Private: upstream 0.7.4's nvfp4_4over6 argument of the NVFP4 quantizers (its NVFP44Over6Config;
// docs/GEMM_AND_QUANTIZATION.md, "Batch-invariant quantizers, 4over6 and out_scale"), resolved as
// its resolve_nvfp4_4over6 does: omitted (_UNSET, flashinfer::nvfp4_4over6_unset) reads
// FLASHINFER_NVFP4_4OVER6 (on when "1"), None is off, a config is on. The recipe (a per-block
// search between the 6- and 4-based scales, kernels/nvfp4_rules.h nvfp4_4over6_block) runs on the
// CPU reference of the per-tensor quantizers (nvfp4_4over6_recipe); elsewhere an op refuses the
// call when it is on.
#pragma once

#include <cctype>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/env_switch.h"
#include "flashinfer/device.h"
#include "flashinfer/dtype.h"
#include "flashinfer/error.h"
#include "flashinfer/ops/quantization.h"
#include "flashinfer/value.h"
#include "kernels/quantization_params.h"

namespace flashinfer::api {

/// Whether 4over6 is on for an NVFP4 quantizer; an explicit config with fp8 input is upstream's
/// error (its FP8-to-FP4 kernels hard-code the standard recipe).
inline bool nvfp4_4over6_on(const Value& v, DType in_dtype, const char* op) {
  const bool is_explicit = !is_nvfp4_4over6_unset(v);
  bool on = false;
  if (is_explicit) {
    on = !v.is_none();
  } else {
    const char* env = std::getenv("FLASHINFER_NVFP4_4OVER6");
    on = env != nullptr && std::string_view(env) == "1";
  }
  FLASHINFER_CHECK(!(is_explicit && on && in_dtype == DType::kFloat8E4M3FN), op, "nvfp4_4over6",
                   "NVFP4 4over6 (from the nvfp4_4over6= argument or the "
                   "FLASHINFER_NVFP4_4OVER6* environment) requires fp16 or bf16 input, got ",
                   dtype_torch_name(in_dtype), ".");
  return on;
}

/// Refuses a call whose 4over6 is on (kUnsupported naming nvfp4_4over6), except fp8 input with
/// the environment only, which upstream's CUDA path ignores too.
inline void refuse_nvfp4_4over6(bool on, const Value& v, DType in_dtype, const char* op) {
  if (!on || (is_nvfp4_4over6_unset(v) && in_dtype == DType::kFloat8E4M3FN)) return;
  FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "nvfp4_4over6",
                  "NVFP4 4over6 (the per-block 4-or-6 scale search, from the nvfp4_4over6= "
                  "argument or FLASHINFER_NVFP4_4OVER6=1) is not implemented here; pass "
                  "nvfp4_4over6=None for the standard recipe");
}

inline void refuse_nvfp4_4over6(const Value& v, DType in_dtype, const char* op) {
  refuse_nvfp4_4over6(nvfp4_4over6_on(v, in_dtype, op), v, in_dtype, op);
}

/// The recipe of a quantizer call whose 4over6 is `on` (nvfp4_4over6_on): an explicit config's
/// fields (upstream's NVFP44Over6Config as its recorder keeps it, an object or a string whose repr
/// lists the fields that differ from the defaults; true: the defaults), or from the
/// FLASHINFER_NVFP4_4OVER6_ERR_MODE ("MAE" or "MSE", any case; another value is upstream's
/// error) and FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH ("1") environment; and upstream's
/// FLASHINFER_ / TRTLLM_DISABLE_FP4_QUANT_FAST_MATH ("1"), read at each launch. e4m3_max only sets
/// upstream's global scale, which the caller passes: not read. fp8 input with the environment
/// only: off (upstream's CUDA path ignores it). On CUDA the recipe is refused (kUnsupported): it
/// runs on the CPU reference here (upstream: SM100+ only).
inline kernels::Nvfp4FourOverSix nvfp4_4over6_recipe(bool on, const Value& v, DType in_dtype,
                                                     Device dev, const char* op) {
  kernels::Nvfp4FourOverSix r;
  const bool from_env = is_nvfp4_4over6_unset(v);
  if (!on) return r;
  if (from_env) {
    // Upstream reads (and checks) the whole environment recipe before it looks at the input.
    if (const char* m = std::getenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE")) {
      std::string mode(m);
      for (char& ch : mode) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      FLASHINFER_CHECK(mode == "MAE" || mode == "MSE", op, "nvfp4_4over6",
                       "NVFP4 4over6 error mode must be MAE or MSE.");
      r.mse = mode == "MSE";
    }
    r.fast_err = detail::env_switch_is("FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1");
    if (in_dtype == DType::kFloat8E4M3FN) return {};
  } else {
    std::string_view text;
    if (v.kind() == Value::Kind::kObject) text = v.as_object().repr;
    if (v.kind() == Value::Kind::kString) text = v.as_string();
    // Upstream's TypeError names the value's python type.
    const char* type = v.kind() == Value::Kind::kBool     ? "bool"
                       : v.kind() == Value::Kind::kInt    ? "int"
                       : v.kind() == Value::Kind::kFloat  ? "float"
                       : v.kind() == Value::Kind::kString ? "str"
                                                          : "object";
    FLASHINFER_CHECK(text.find("NVFP44Over6Config") != std::string_view::npos, op, "nvfp4_4over6",
                     "nvfp4_4over6 must be an NVFP44Over6Config or None (or omitted); got ",
                     v.kind() == Value::Kind::kObject ? v.as_object().type : std::string(type),
                     ".");
    r.mse = text.find("MSE") != std::string_view::npos;
    r.fast_err = text.find("err_use_fast_math=True") != std::string_view::npos;
  }
  r.on = true;
  r.exact_math = detail::env_switch_is("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "1") ||
                 detail::env_switch_is("TRTLLM_DISABLE_FP4_QUANT_FAST_MATH", "1");
  FLASHINFER_CHECK_CODE(!dev.is_cuda(), ErrorCode::kUnsupported, op, "nvfp4_4over6",
                        "NVFP4 4over6 runs on the CPU reference here (upstream runs it on SM100+ "
                        "only); pass nvfp4_4over6=None for the standard recipe on this GPU");
  return r;
}

inline kernels::Nvfp4FourOverSix nvfp4_4over6_recipe(const Value& v, DType in_dtype, Device dev,
                                                     const char* op) {
  return nvfp4_4over6_recipe(nvfp4_4over6_on(v, in_dtype, op), v, in_dtype, dev, op);
}

/// The MoE ops' nvfp4_4over6 (the trtllm FP4 ops, cutlass_fused_moe; upstream 0.7.4 checks it
/// first): an explicit config that is on, on a call with no NVFP4 requantization
/// (`nvfp4_path` false), is upstream's ValueError with the op's text `why`; on an NVFP4 path,
/// explicit or from FLASHINFER_NVFP4_4OVER6=1 (which upstream's kernels read at launch), it is
/// refused as not implemented.
inline void check_moe_nvfp4_4over6(const Value& v, bool nvfp4_path, const char* op,
                                   const char* why) {
  const bool is_explicit = !is_nvfp4_4over6_unset(v);
  if (is_explicit) {
    if (v.is_none()) return;
    FLASHINFER_CHECK(nvfp4_path, op, "nvfp4_4over6", why);
  } else {
    const char* env = std::getenv("FLASHINFER_NVFP4_4OVER6");
    if (!nvfp4_path || env == nullptr || std::string_view(env) != "1") return;
  }
  refuse_nvfp4_4over6(true, v, DType::kBFloat16, op);
}

}  // namespace flashinfer::api
