// Device library: shared-memory barriers (mbarrier, sm_90 code here) for a producer / consumer
// pipeline inside a block, and the phase arithmetic of such a pipeline, which the CPU tests run
// (tests/api/test_prefill_sm90_shape.cpp, PrefillSm90Shape.WarpSpecialized*).
//
// An mbarrier counts arrivals towards the count it was initialized with; the last one completes
// its current phase and opens the next. A waiter names the phase it waits for by its parity, and
// a wait for the parity of the phase before the current one returns at once: so a pipeline of S
// stages, tile t in stage t % S, waits for round r = t / S of a stage's "full" barrier with parity
// r & 1, and its producer for the consumers' release of round r - 1 of the stage's "empty"
// barrier with parity (r & 1) ^ 1, which for r = 0 is the phase before the first: no wait.
// cp.async copies arrive on a barrier when they land (cp.async.mbarrier.arrive.noinc: one
// arrival, counted in the barrier's initial count, once every cp.async the thread issued before
// it has completed), so a producer thread never waits for its own copies.
#pragma once

#include <cstdint>

#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels::cuda::dev {

/// Stage of tile `tile` in a pipeline of `stages` stages.
FLASHINFER_HD constexpr int pipeline_stage(int tile, int stages) { return tile % stages; }
/// Parity a consumer waits for on tile `tile`'s "full" barrier (its stage's round tile / stages).
FLASHINFER_HD constexpr uint32_t pipeline_full_parity(int tile, int stages) {
  return static_cast<uint32_t>(tile / stages) & 1u;
}
/// Parity the producer waits for on tile `tile`'s "empty" barrier before refilling its stage: the
/// consumers' release of the stage's previous round (tile - stages); for the first round, the
/// phase before the barrier's first, which is complete.
FLASHINFER_HD constexpr uint32_t pipeline_empty_parity(int tile, int stages) {
  return pipeline_full_parity(tile, stages) ^ 1u;
}

#if defined(__CUDACC__)
namespace mbarrier {

/// Initializes the barrier at shared address `bar` (8 bytes, 8-aligned) for `count` arrivals a
/// phase. One thread; the block synchronizes before any other thread uses the barrier.
__device__ __forceinline__ void init(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#else
  (void)bar;
  (void)count;
  __trap();
#endif
}

/// One arrival of this thread (release semantics: its earlier shared-memory accesses, reads
/// included, happen before the phase completes for a waiter).
__device__ __forceinline__ void arrive(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
               : "memory");
#else
  (void)bar;
  __trap();
#endif
}

/// One arrival, made when every cp.async this thread issued before it has completed (the
/// barrier's count includes it: .noinc).
__device__ __forceinline__ void arrive_on_copies(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#else
  (void)bar;
  __trap();
#endif
}

/// Waits until the phase of parity `parity` has completed (acquire: what the arrivals released
/// is visible after it).
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      " .reg .pred done;\n"
      "retry:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra retry;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#else
  (void)bar;
  (void)parity;
  __trap();
#endif
}

}  // namespace mbarrier
#endif

}  // namespace flashinfer::kernels::cuda::dev
