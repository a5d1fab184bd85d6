// Private: pos_encoding_mode inside attention (ROPE_LLAMA, ALIBI) for the decode and prefill ops
// that take it. The CPU backend computes both; the CUDA kernels have no such term and refuse.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "api/attention_common.h"
#include "kernels/attention_params.h"

namespace flashinfer::api {

/// Upstream's ALiBi slopes for `num_heads` heads (flashinfer.utils.get_alibi_slopes): with n the
/// largest power of two <= num_heads, 2^(-8 k / n) for k = 1..n, then 2^(-4 k / n) for the odd
/// k = 1, 3, ..., 2 (num_heads - n) - 1.
std::vector<float> alibi_slopes(int64_t num_heads);

/// Parses and checks `mode` ("NONE", "ROPE_LLAMA", "ALIBI") with rope_scale / rope_theta
/// (defaults 1 and 1e4) into `s`. Call after plan_settings (given "NONE") and after s.decode /
/// s.use_tensor_cores are set: the checks read the planned dtypes, soft cap and kernel path.
void plan_pos_encoding(detail::WrapperState& s, std::string_view mode,
                       std::optional<double> rope_scale, std::optional<double> rope_theta,
                       const char* op);

/// run_planned: with a planned mode, runs `p` on the CPU reference with it and returns true
/// (kUnsupported naming pos_encoding_mode on any other device); without one, returns false.
bool run_with_pos_encoding(const detail::WrapperState& s, const kernels::AttentionParams& p,
                           const char* op);

}  // namespace flashinfer::api
