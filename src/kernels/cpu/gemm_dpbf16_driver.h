// Private: the driver shared by the CPU GEMM kernels that reproduce oneDNN's avx512_core_bf16
// matmul sums (gemm_bf16_dpbf16_cpu.cpp, gemm_fp8_dpbf16_cpu.cpp): column chunks handed to one
// OpenMP team, per-thread buffers, the activation packed once into tiles shared by every chunk,
// and oneDNN's k chunks over the tiles of gemm_dpbf16_tile.h. The kernels differ only in how
// their operands become those tiles (a Packing, below).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_intrinsics.h"
#include "kernels/cpu/gemm_bf16_cpu.h"
#include "kernels/cpu/gemm_dpbf16_tile.h"

#if FLASHINFER_CPU_X86_INTRINSICS && defined(__GNUC__)

#include <omp.h>

namespace flashinfer::kernels::cpu::dpbf16 {

/// c = a[m, k] * B^T over the tiles of gemm_dpbf16_tile.h, with a Packing pk that provides:
///   bool a_special() const: the activation holds a value the fp32-FMA tiles would sum otherwise
///     than vdpbf16ps (every chunk then takes the vdpbf16ps tiles);
///   void pack_a(int64_t i0, int64_t kb, float* dst) const: activation rows [i0, i0 + kMr), k
///     block kb, as fp32 [kMr][kKc] with swapped pairs (zeros past m and k);
///   bool pack_b_f32(int64_t kb, int64_t j0, int64_t wp, float* dst) const: weight columns
///     [j0, j0 + wp) (wp % 32 == 0), k block kb, as wp / 32 fp32 panels [kKc][32] with swapped
///     pairs (zeros past n and k); true when a value like a_special's was seen;
///   void pack_b_pairs(int64_t kb, int64_t j0, int64_t wp, uint32_t* dst) const: the same
///     columns as vdpbf16ps's [kKc / 2][32] bf16 pairs.
/// Each column chunk's fp32 sums [m, w] (row stride ldc = w rounded up to 32) go to
/// epilogue(j0, w, c, ldc) while in cache. Sums: oneDNN's k chunks of min(k, 512), or 1024 for
/// k > 1024, each from +0, added in order.
template <class Packing, class Epilogue>
void gemm(int64_t m, int64_t n, int64_t k, const Packing& pk, const Epilogue& epilogue) {
  const int nthr = omp_get_max_threads();
  // Column chunks of 128 (narrower when that leaves under four per thread, eight with several
  // threads: handed out one at a time, so a thread that lost its core to another process leaves
  // its chunks to the others), a multiple of the 32-column tile.
  const int64_t np = (n + 31) / 32 * 32;
  int64_t nc = 128;
  while (nc > 32 && (np + nc - 1) / nc < (nthr > 1 ? 8 : 4) * nthr) nc -= 32;
  nc = std::min(nc, np);
  const int64_t chunks = (n + nc - 1) / nc, kblocks = (k + kKc - 1) / kKc,
                mtiles = (m + kMr - 1) / kMr;
  // oneDNN's k chunks (min(k, 512), or 1024 for k > 1024), in 128-wide blocks.
  const int64_t kch = k <= 512 ? kblocks : k <= 1024 ? 512 / kKc : 1024 / kKc;
  const std::size_t a_tile = static_cast<std::size_t>(kMr * kKc);
  const std::size_t bsz = static_cast<std::size_t>(nc * kKc),
                    csz = static_cast<std::size_t>(m * nc);
  // Allocated before the team starts (nothing inside it may throw out).
  HostBuffer<float> ap(a_tile * static_cast<std::size_t>(mtiles * kblocks));
  HostBuffer<float> bp(bsz * static_cast<std::size_t>(nthr));
  HostBuffer<uint32_t> bp16(bsz / 2 * static_cast<std::size_t>(nthr));
  HostBuffer<uint16_t> at16(a_tile * static_cast<std::size_t>(nthr));
  HostBuffer<float> own_tile(a_tile * static_cast<std::size_t>(nthr));
  HostBuffer<float> cb(csz * static_cast<std::size_t>(nthr));
  HostBuffer<float> pb(kblocks > kch ? csz * static_cast<std::size_t>(nthr) : 0);
  // The activation, widened into [tile][k block][kMr][kKc] (shared by every chunk) by the first
  // thread that needs a tile: state 0 unpacked, 1 being packed, 2 ready. A thread that finds a
  // tile being packed packs its own copy rather than wait (a wait costs a time slice when the
  // machine is oversubscribed), so no barrier is needed.
  std::vector<std::atomic<uint8_t>> state(static_cast<std::size_t>(mtiles * kblocks));
  for (auto& x : state) x.store(0, std::memory_order_relaxed);
  const bool a_special = pk.a_special();
#pragma omp parallel num_threads(nthr) if (chunks > 1)
  {
    const int t = omp_get_thread_num();
    float* bt = bp.get() + bsz * t;
    uint32_t* bt16 = bp16.get() + bsz / 2 * t;
    uint16_t* a16 = at16.get() + a_tile * t;
    float* own = own_tile.get() + a_tile * t;
    float* ct = cb.get() + csz * t;
    float* pt = pb.get() + csz * t;
#pragma omp for schedule(dynamic, 1)
    for (int64_t ci = 0; ci < chunks; ++ci) {
      const int64_t j0 = ci * nc, w = std::min(nc, n - j0), wp = (w + 31) / 32 * 32;
      bool hw = a_special;
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        if (!hw && pk.pack_b_f32(kb, j0, wp, bt)) {
          hw = true;  // a special value: this chunk again, on the vdpbf16ps path
          kb = -1;
          continue;
        }
        if (hw) pk.pack_b_pairs(kb, j0, wp, bt16);
        // oneDNN's order: chunk 0 accumulates into c; a later chunk from +0 into the partial
        // buffer, added to c by its last block (c + acc, one fp32 add).
        const int64_t ch = kb / kch, first = ch * kch, last = std::min(kblocks, first + kch) - 1;
        const bool from_zero = kb == first, add = ch > 0 && kb == last;
        float* src = ch == 0 ? ct : pt;
        float* dst = ch == 0 || add ? ct : pt;
        // Row tiles outer: an activation tile stays in L1 over the chunk's panels (which come
        // from L2).
        for (int64_t mt = 0; mt < mtiles; ++mt) {
          const int rows = static_cast<int>(std::min<int64_t>(kMr, m - mt * kMr));
          const int64_t x = mt * kblocks + kb;
          auto& st = state[static_cast<std::size_t>(x)];
          const float* at = ap.get() + a_tile * x;
          if (st.load(std::memory_order_acquire) < 2) {
            uint8_t expect = 0;
            if (st.compare_exchange_strong(expect, 1, std::memory_order_acquire)) {
              pk.pack_a(mt * kMr, kb, ap.get() + a_tile * x);
              st.store(2, std::memory_order_release);
            } else if (expect == 1) {
              pk.pack_a(mt * kMr, kb, own);
              at = own;
            }
          }
          if (hw) f32_tile_to_bf16(at, a16);
          for (int64_t g = 0; g < wp; g += 32) {
            const int64_t off = mt * kMr * wp + g;
            if (hw) {
              kMicro[static_cast<std::size_t>(rows - 1)](
                  a16, bt16 + g * kKc / 2, from_zero ? nullptr : src + off, dst + off, wp, add);
            } else {
              kMicroF32[static_cast<std::size_t>(rows - 1)](
                  at, bt + g * kKc, from_zero ? nullptr : src + off, dst + off, wp, add);
            }
          }
        }
      }
      epilogue(j0, w, static_cast<const float*>(ct), wp);
    }
  }
}

}  // namespace flashinfer::kernels::cpu::dpbf16

#endif
