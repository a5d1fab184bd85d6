// Private: the arithmetic chain_speculative_sampling's CPU reference
// (src/kernels/cpu/spec_sampling_cpu.cpp) and CUDA kernel (src/kernels/cuda/spec_sampling_cuda.cu)
// share, so both pick the same token from the same Philox draws, bit for bit (unit-tested on the
// CPU: tests/ops/test_spec_sampling_rules.cpp).
//
// The residual distribution relu(target - draft) is summed and searched in chunks of
// kSpecThreads columns, in the order a block of kSpecThreads threads adds them: within each warp
// of 32 an inclusive Kogge-Stone scan (offsets 1, 2, 4, 8, 16), then the same scan over the
// kSpecWarps warp totals, then each element's prefix is its warp's exclusive prefix plus its
// lane's inclusive one. A running total carries from chunk to chunk. The CPU follows that order
// literally (spec_chunk_scan); the device computes it with warp shuffles.
#pragma once

#include <cstdint>

#include "kernels/philox.h"

namespace flashinfer::kernels {

inline constexpr int kSpecThreads = 256;
inline constexpr int kSpecWarps = kSpecThreads / 32;

/// relu(target - draft), 0 for NaN (the device's comparison does the same).
FLASHINFER_HD float spec_residual_mass(float target, float draft) {
  const float d = target - draft;
  return d > 0.0f ? d : 0.0f;
}

/// Whether draft token i is accepted: u * p_draft < p_target (u the stream's next uniform).
FLASHINFER_HD bool spec_accept(float u, float p_draft, float p_target) {
  return u * p_draft < p_target;
}

/// The column a draft id reads its probabilities from. The host refuses ids outside [0, vocab)
/// where it can see them (CPU tensors); a CUDA tensor's ids are only seen by the kernel, which
/// reads at the id clamped into the row (never out of bounds) and emits the id as given.
FLASHINFER_HD int64_t spec_draft_column(int64_t id, int64_t vocab) {
  return id < 0 ? 0 : id >= vocab ? vocab - 1 : id;
}

/// A draft token's probability under the draft and the target model.
struct SpecProbs {
  float draft, target;
};

/// One request's acceptance chain: draft i is accepted while spec_accept(u, draft, target) holds
/// (one draw each, `probs(i)` giving draft i's probabilities); from the first rejected position
/// `pos` to the end each position is tested again with a fresh draw, to count the accepted ones
/// (pos itself drawn but not counted, as upstream 0.7.4).
/// Writes the accepted drafts to out[0, pos) and -1 to out(pos, n], adds the accepted count to
/// *acc and pos to *emi, and returns pos (out[pos], the residual's token, is the caller's). ids
/// and out are the request's rows.
template <class Id, class Probs, class Uniform>
FLASHINFER_HD int64_t spec_accept_chain(int64_t n, const Id* ids, Probs probs, Uniform next_uniform,
                                        Id* out, Id* acc, Id* emi) {
  auto accept = [&](int64_t i) {
    const SpecProbs pr = probs(i);
    return spec_accept(next_uniform(), pr.draft, pr.target);
  };
  int64_t pos = n;
  for (int64_t i = 0; i < n; ++i) {
    if (accept(i)) {
      out[i] = ids[i];
    } else {
      pos = i;
      break;
    }
  }
  // Upstream 0.7.4: the first rejected position's draw is made again (the stream advances as
  // before) but not counted; 0.6.18 counted it.
  int64_t accepted = pos;
  for (int64_t i = pos; i < n; ++i) {
    const bool ok = accept(i);
    if (i != pos && ok) ++accepted;
  }
  *acc = static_cast<Id>(*acc + accepted);
  *emi = static_cast<Id>(*emi + pos);
  for (int64_t i = pos + 1; i <= n; ++i) out[i] = static_cast<Id>(-1);
  return pos;
}

/// One Kogge-Stone inclusive scan step of n values, as lanes l >= off of a warp do it:
/// x[l] = x[l - off] + x[l] with every lane reading the values from before the step.
FLASHINFER_HD void spec_scan_step(float* x, int n, int off) {
  for (int l = n - 1; l >= off; --l) x[l] = x[l - off] + x[l];
}

/// The inclusive prefix sums of one chunk of kSpecThreads masses, in the device's order (above),
/// in place; returns the chunk's total (the last prefix).
FLASHINFER_HD float spec_chunk_scan(float* m) {
  float warp_total[kSpecWarps];
  for (int w = 0; w < kSpecWarps; ++w) {
    for (int off = 1; off < 32; off *= 2) spec_scan_step(m + w * 32, 32, off);
    warp_total[w] = m[w * 32 + 31];
  }
  for (int off = 1; off < kSpecWarps; off *= 2) spec_scan_step(warp_total, kSpecWarps, off);
  for (int w = 1; w < kSpecWarps; ++w) {
    for (int l = 0; l < 32; ++l) m[w * 32 + l] = warp_total[w - 1] + m[w * 32 + l];
  }
  return warp_total[kSpecWarps - 1];
}

}  // namespace flashinfer::kernels
