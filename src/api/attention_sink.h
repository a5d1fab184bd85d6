// Private: upstream's AttentionSink JIT variant on the plain prefill wrappers. Upstream's sink
// tests build BatchPrefillWith{Paged,Ragged}KVCacheWrapper with the variant's jit_args and pass
// the sink tensor and sm_scale positionally: run(q, kv, sink, sm_scale) (its run(*args)).
#pragma once

#include <optional>

#include "api/attention_common.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/value.h"

namespace flashinfer::api {

/// True when `jit_args` is upstream's AttentionSink variant list (jit_args[11] ==
/// "AttentionSink"), false when it is absent or None. Any other variant is kUnsupported naming
/// jit_args; a jit_kwargs pos_encoding_mode other than 0 is kUnsupported naming jit_kwargs.
bool attention_sink_variant(const std::optional<Value>& jit_args,
                            const std::optional<Value>& jit_kwargs, const char* op);

/// `o` with the variant's run(*args) (o.args = (sink, sm_scale)) applied: sinks = sink, and
/// sm_scale replacing plan's score scale (folded into q_scale, as
/// BatchAttentionWithAttentionSinkWrapper.run does). Errors name `args` when the wrapper has no
/// variant but args are given, or the variant's arguments are missing or malformed.
AttentionRunOptions apply_variant_args(const detail::WrapperState& s, const AttentionRunOptions& o,
                                       const char* op);

}  // namespace flashinfer::api
