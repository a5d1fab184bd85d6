// Blocks of a kernel resident per SM, computed on the host from the device's documented limits:
// the split-KV planner sizes its grid as occupancy x SMs, and computing it here (rather than with
// cudaOccupancyMaxActiveBlocksPerMultiprocessor) lets the planner be tested without a GPU.
#pragma once

namespace flashinfer::kernels {

/// Per-SM resources of one compute capability (CUDA C++ Programming Guide, "Compute
/// Capabilities"), and the allocation granularities of the occupancy calculator.
struct DeviceLimits {
  int max_threads_per_sm;
  int max_blocks_per_sm;
  int regs_per_sm;
  int max_regs_per_thread;
  int reg_alloc_unit;  // registers, per warp
  int max_warps_per_sm;
  long smem_per_sm;         // bytes usable by blocks (the largest carveout)
  long max_smem_per_block;  // bytes, with the cudaFuncAttributeMaxDynamicSharedMemorySize opt-in
  long reserved_smem_per_block;  // bytes the driver reserves for each block (sm_80 and later)
  long smem_alloc_unit;          // bytes
};

/// The limits of compute capability cc_major.cc_minor. Capabilities not listed get the smallest
/// of the listed values (those of 8.6), so that occupancy is never overestimated on sm_80+.
constexpr DeviceLimits device_limits(int cc_major, int cc_minor) {
  constexpr long kKiB = 1024;
  if (cc_major == 8 && cc_minor == 0) {  // A100
    return {2048, 32, 65536, 255, 256, 64, 164 * kKiB, 163 * kKiB, 1 * kKiB, 128};
  }
  if (cc_major == 8 && cc_minor == 6) {  // GA10x
    return {1536, 16, 65536, 255, 256, 48, 100 * kKiB, 99 * kKiB, 1 * kKiB, 128};
  }
  if (cc_major == 8 && cc_minor == 9) {  // Ada
    return {1536, 24, 65536, 255, 256, 48, 100 * kKiB, 99 * kKiB, 1 * kKiB, 128};
  }
  if ((cc_major == 9 && cc_minor == 0) || (cc_major == 10 && cc_minor == 0)) {  // H100, B200
    return {2048, 32, 65536, 255, 256, 64, 228 * kKiB, 227 * kKiB, 1 * kKiB, 128};
  }
  return {1536, 16, 65536, 255, 256, 48, 100 * kKiB, 99 * kKiB, 1 * kKiB, 128};
}

/// What cudaOccupancyMaxActiveBlocksPerMultiprocessor returns for a kernel using regs_per_thread
/// registers and static_smem_per_block bytes of static shared memory, launched with
/// threads_per_block threads and dyn_smem_per_block bytes of dynamic shared memory (with the
/// default carveout, and the dynamic-size opt-in set high enough). The minimum of four limits;
/// 0 when the block cannot run at all.
inline int occupancy_blocks_per_sm(const DeviceLimits& l, int threads_per_block,
                                   int regs_per_thread, long dyn_smem_per_block,
                                   long static_smem_per_block = 0) {
  constexpr int kWarpSize = 32;
  constexpr int kMaxThreadsPerBlock = 1024;  // every capability since 2.0
  // The register file is split among 4 SM sub-partitions (every capability since 7.0), each
  // holding whole warps: a warp's registers cannot straddle two of them.
  constexpr int kSubPartitions = 4;
  auto round_up = [](long x, long unit) { return (x + unit - 1) / unit * unit; };
  if (threads_per_block <= 0 || threads_per_block > kMaxThreadsPerBlock) return 0;
  if (regs_per_thread < 0 || dyn_smem_per_block < 0 || static_smem_per_block < 0) return 0;

  const int warps_per_block = (threads_per_block + kWarpSize - 1) / kWarpSize;
  int blocks = l.max_blocks_per_sm;

  // Threads, in whole warps.
  const int warps_per_sm = l.max_warps_per_sm < l.max_threads_per_sm / kWarpSize
                               ? l.max_warps_per_sm
                               : l.max_threads_per_sm / kWarpSize;
  if (warps_per_sm / warps_per_block < blocks) blocks = warps_per_sm / warps_per_block;

  // Registers: allocated per warp in units of reg_alloc_unit.
  if (regs_per_thread > l.max_regs_per_thread) return 0;
  if (regs_per_thread > 0) {
    const long regs_per_warp = round_up(long(regs_per_thread) * kWarpSize, l.reg_alloc_unit);
    const long reg_warps = (l.regs_per_sm / kSubPartitions) / regs_per_warp * kSubPartitions;
    if (reg_warps / warps_per_block < blocks) blocks = int(reg_warps / warps_per_block);
  }

  // Shared memory: allocated per block in units of smem_alloc_unit, plus the driver's reserve.
  const long smem = dyn_smem_per_block + static_smem_per_block;
  if (smem > l.max_smem_per_block) return 0;
  const long smem_per_block = round_up(smem, l.smem_alloc_unit) + l.reserved_smem_per_block;
  if (smem_per_block > 0 && l.smem_per_sm / smem_per_block < blocks) {
    blocks = int(l.smem_per_sm / smem_per_block);
  }
  return blocks;
}

}  // namespace flashinfer::kernels
