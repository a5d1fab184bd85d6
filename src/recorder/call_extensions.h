// Private: this library's per-op extensions of a call's recorded inputs (docs/LOGGING.md,
// "Extension tensors"). An op whose arguments only name memory (the MoE LoRA ops' int64 w_ptr
// tables of weight addresses) registers a recorder half that adds the memory they name as extra
// tensors under keys starting with kExtensionPrefix, and a replay half that rebuilds the
// arguments from them. Upstream's tools read arg_<i> / kwarg_<name> keys only; recordings made
// without the extension (upstream's) replay as before.
#pragma once

#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer::detail {

inline constexpr std::string_view kExtensionPrefix = "fi_ext__";

/// Adds (key, tensor) pairs for a call about to run with `args` (the declaration's order).
using RecordExtensionFn = std::function<void(std::span<const Value> args,
                                             std::vector<std::pair<std::string, Tensor>>& extra)>;
/// Rewrites the bound arguments of a replayed call from its loaded input tensors (all keys).
/// The tensors stay alive until the call returns.
using ReplayExtensionFn =
    std::function<void(const std::map<std::string, Tensor>& tensors, std::vector<Value>& args)>;

/// Whether a call about to run with `args` would get any key from the recorder half (optional:
/// without it every call is taken to). The ring recorder's fast path, which reuses a recent
/// call's record and so never runs the recorder half, stays on for the calls that would not.
using ExtensionAppliesFn = std::function<bool(std::span<const Value> args)>;

void register_call_extension(const std::string& op, RecordExtensionFn record,
                             ReplayExtensionFn replay, ExtensionAppliesFn applies = nullptr);
/// The registered parts of `op`, or null (applies: also when the op registered none).
const RecordExtensionFn* record_extension(std::string_view op);
const ReplayExtensionFn* replay_extension(std::string_view op);
const ExtensionAppliesFn* extension_applies(std::string_view op);

}  // namespace flashinfer::detail
