// Private: what a raw attention module's run takes beyond single decode / prefill's own
// parameters (flashinfer/ops/attention_jit_module.h), read from upstream's *args.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/attention_common.h"
#include "flashinfer/ops/attention_jit_module.h"

namespace flashinfer::api {

/// Upstream's filename_safe_dtype_map (flashinfer.jit.utils), the dtype names of its modules'
/// uris, for the dtypes this library has; nullptr where the map has no entry (float32 among
/// them: upstream's uris cannot name it).
const char* filename_safe_dtype(DType d);

/// A module call as the decode / prefill code runs it: the op it runs for (named in every
/// error), the module's ALiBi slopes and RoPE reciprocals as the caller passed them.
struct JitModuleCall {
  const char* op = nullptr;
  std::vector<float> alibi_slopes;                // pos_encoding_mode 2: [Hq]
  double rope_rcp_scale = 0, rope_rcp_theta = 0;  // pos_encoding_mode 1
};

/// The module's *args, read and checked against its flags, and what single decode / prefill
/// take for them.
struct ModuleArgs {
  JitModuleCall call;
  std::string pos_encoding_mode = "NONE";  // the module's, by upstream's name
  std::optional<double> logits_soft_cap;   // only with use_logits_soft_cap
  double sm_scale = 0;
  int64_t window_left = -1;                  // -1 unless use_sliding_window
  std::optional<Tensor> packed_custom_mask;  // prefill, mask_mode 2
};

/// Checks that `m` is a module (not None) of `kind` and that q / k / v are the op's tensors
/// (check_single_qkv) built for it (dtypes, head dims: upstream would reinterpret the memory
/// instead), then reads `args` by its flags.
ModuleArgs read_module_args(const std::shared_ptr<AttentionJitModule>& m,
                            AttentionJitModule::Kind kind, const Value& args, const Tensor& q,
                            const Tensor& k, const Tensor& v, int64_t window_left,
                            int64_t mask_mode, const char* op);

/// After plan_pos_encoding: the caller's slopes and reciprocals in place of the defaults.
void apply_jit_module_call(detail::WrapperState& s, const JitModuleCall& c);

/// `e`, thrown by single decode / prefill's code for a module call, naming the module op's
/// argument instead of theirs: what came from `args` (the mask, sm_scale, the soft cap, the RoPE
/// pair) names `args`, `causal` names `mask_mode`, `pos_encoding_mode` (a module flag) names
/// `jit_module`.
Error module_arg_error(const Error& e);

/// Runs `run` and rethrows its errors through module_arg_error.
template <class F>
auto with_module_arg_names(F&& run) {
  try {
    return run();
  } catch (const Error& e) {
    throw module_arg_error(e);
  }
}

}  // namespace flashinfer::api
