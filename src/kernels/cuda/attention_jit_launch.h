// CUDA launcher of the JIT-compiled attention kernels (plain C++ header): the head dims the AOT
// build lacks (src/jit/attention_jit.h). The module is built (AOT set, cache or NVRTC) and loaded
// once per process and device, then launched like the AOT kernels.
#pragma once

#include <functional>
#include <string>

#include "jit/jit.h"
#include "kernels/attention_params.h"

namespace flashinfer::kernels::cuda {

/// Launches kernel 0 of the module `make_spec()` returns, memoized under `key` (the spec's name,
/// which spells every parameter) and the device, with `p` as its one argument.
void launch_attention_jit(const std::string& key, const std::function<jit::ModuleSpec()>& make_spec,
                          const AttentionParams& p, unsigned grid_x, unsigned grid_y,
                          unsigned grid_z, unsigned block, std::size_t smem, void* stream,
                          bool enable_pdl);

}  // namespace flashinfer::kernels::cuda
