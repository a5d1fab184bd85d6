// Host side of the Hopper prefill kernel (prefill_sm90_kernel.cuh): the dispatch (rule in
// prefill_sm90.h) and the tall blocks' instances (prefill_sm90_launch.cuh). Compiled for sm_90a
// only, with CUTLASS's headers (src/CMakeLists.txt, the flashinfer_cutlass target).
#include <atomic>

#include "kernels/cuda/prefill_cuda.h"
#include "kernels/cuda/prefill_sm90.h"
#include "kernels/cuda/prefill_sm90_launch.cuh"

namespace flashinfer::kernels::cuda {

// The one-warpgroup instances (prefill_sm90_small.cu).
void prefill_sm90_small(const AttentionParams& p, cudaStream_t s, bool enable_pdl);

namespace {

std::atomic<uint64_t> g_launches{0}, g_small_launches{0}, g_ping_pong_launches{0}, g_ws_launches{0},
    g_overlap_launches{0}, g_multi_item_launches{0};

}  // namespace

bool prefill_sm90(const AttentionParams& p, void* stream, bool enable_pdl) {
  if (p.prefill_fa2_only || prefill_sm90_off_by_env()) return false;
  const int wg = prefill_sm90_block_warpgroups(
      p, current_device_attribute(cudaDevAttrComputeCapabilityMajor),
      current_device_attribute(cudaDevAttrComputeCapabilityMinor),
      current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  if (wg == 0) return false;
  auto s = static_cast<cudaStream_t>(stream);
  if (p.multi_item_rows != nullptr) {
    // Multi-item scoring (the rule let it through only where its instances are built): the plain
    // schedule, whatever the ping-pong / warp-specialized / overlapped switches ask.
    launch_sm90_multi_item(p, s, enable_pdl, wg);
    g_multi_item_launches.fetch_add(1, std::memory_order_relaxed);
    if (wg == 1) g_small_launches.fetch_add(1, std::memory_order_relaxed);
  } else if (wg == 2) {
    const bool ping_pong = prefill_sm90_ping_pong_by_env() &&
                           prefill::prefill_sm90_ping_pong_built(p.head_dim_qk, p.head_dim_vo, 2);
    const long long smem_optin = current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    // The overlapped form where asked for and built (it is warp-specialized), else the
    // warp-specialized form where asked for, else the plain one.
    const bool ran_overlap = prefill_sm90_overlap_takes(p, smem_optin) &&
                             launch_sm90_overlap(p, s, enable_pdl, ping_pong);
    const bool ran_ws = ran_overlap || launch_sm90_block<2>(p, s, enable_pdl, ping_pong,
                                                            prefill_sm90_ws_takes(p, smem_optin));
    if (ping_pong) g_ping_pong_launches.fetch_add(1, std::memory_order_relaxed);
    if (ran_ws) g_ws_launches.fetch_add(1, std::memory_order_relaxed);
    if (ran_overlap) g_overlap_launches.fetch_add(1, std::memory_order_relaxed);
  } else {
    prefill_sm90_small(p, s, enable_pdl);
    g_small_launches.fetch_add(1, std::memory_order_relaxed);
  }
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

uint64_t prefill_sm90_launches() { return g_launches.load(std::memory_order_relaxed); }
uint64_t prefill_sm90_small_launches() { return g_small_launches.load(std::memory_order_relaxed); }
uint64_t prefill_sm90_ping_pong_launches() {
  return g_ping_pong_launches.load(std::memory_order_relaxed);
}
uint64_t prefill_sm90_ws_launches() { return g_ws_launches.load(std::memory_order_relaxed); }
uint64_t prefill_sm90_overlap_launches() {
  return g_overlap_launches.load(std::memory_order_relaxed);
}
uint64_t prefill_sm90_multi_item_launches() {
  return g_multi_item_launches.load(std::memory_order_relaxed);
}

}  // namespace flashinfer::kernels::cuda
