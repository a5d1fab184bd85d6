// Rebuilding a recorded call's arguments from the extension tensors this library's recorder
// adds (docs/LOGGING.md, "Extension tensors"): e.g. the MoE LoRA ops' w_ptr tables of weight
// addresses, rewritten to point into the recorded weight banks. `flashinfer replay` does this
// for every call; a standalone reproducer (`flashinfer repro`) calls it itself.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer::replay {

/// Rewrites the bound arguments `args` (the declaration's order) of a call to `function_name`
/// from its loaded input tensors `tensors` (every recorded key). Does nothing for an op without
/// an extension or a recording without extension tensors. The tensors must stay alive until
/// the call returns.
void apply_call_extensions(const std::string& function_name,
                           const std::map<std::string, Tensor>& tensors, std::vector<Value>& args);

}  // namespace flashinfer::replay
