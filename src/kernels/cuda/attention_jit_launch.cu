// See attention_jit_launch.h.
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/attention_jit_launch.h"
#include "kernels/cuda/cuda_utils.cuh"

namespace flashinfer::kernels::cuda {

void launch_attention_jit(const std::string& key, const std::function<jit::ModuleSpec()>& make_spec,
                          const AttentionParams& p, unsigned grid_x, unsigned grid_y,
                          unsigned grid_z, unsigned block, std::size_t smem, void* stream,
                          bool enable_pdl) {
  int device = 0;
  FLASHINFER_CUDA_CALL("attention", cudaGetDevice(&device));
  static std::mutex mu;
  static auto* loaded = new std::map<std::pair<std::string, int>, void*>();
  void* kernel = nullptr;
  {
    std::lock_guard<std::mutex> g(mu);
    const auto k = std::make_pair(key, device);
    if (auto it = loaded->find(k); it != loaded->end()) {
      kernel = it->second;
    } else {
      const jit::JitConfig& cfg = jit::default_config();
      const jit::ModuleSpec spec = make_spec();
      const jit::CompiledModule m = jit::build(spec, jit::current_device_arch(cfg), cfg);
      kernel = jit::load_kernel(m, spec.kernels.at(0));
      loaded->emplace(k, kernel);
    }
  }
  AttentionParams arg = p;
  void* args[] = {&arg};
  jit::launch("attention", kernel, grid_x, grid_y, grid_z, block, smem, stream, enable_pdl, args);
}

}  // namespace flashinfer::kernels::cuda
