// Private: what run_mixed_comm's kernels receive, the layout of a handler's peer buffer, and the
// value of every output element (the CPU reference, src/kernels/cpu/mixed_comm_cpu.cpp, and the
// CUDA kernels, src/kernels/cuda/mixed_comm_cuda.cu, compute it with the same function).
// docs/COMM.md, "Mixed TP / DP collectives"; the order of each sum from
// docs/upstream-facts/mixed_comm.md, section 4.
#pragma once

#include <cstdint>

#include "kernels/fp32_rules.h"

namespace flashinfer::kernels {

/// One rank's call on one node. A rank's peer buffer: its call counter and the last call it
/// published, then two slots of slot_bytes holding its x_in as given (calls alternate between
/// them: a rank may start call k + 1 while a slower peer still reads call k).
struct MixedCommParams {
  static constexpr int kMaxRanks = 8;
  static constexpr int64_t kSeqOffset = 0;     // uint32: this rank's calls
  static constexpr int64_t kFlagOffset = 128;  // uint32: the last call whose data is in place
  static constexpr int64_t kSlotsOffset = 256;
  // upstream's MixedCommOp and the resolved MixedCommMode (never AUTOTUNE).
  enum Op : int { kAllReduce = 0, kAllGather, kReduceScatter, kAllReduceAllGather, kRsAllReduce };
  enum Mode : int {
    kWaitsMc = 0,
    kWaitsUc,
    kBytes1Mc,
    kBytes1Uc,
    kBytes2Mc,
    kBytes2Uc,
    kNcclOne,
    kNcclTpDp
  };
  int op = 0, mode = 0;
  int rank = 0, size = 0;  // the node's ranks; rank = tp + dp * ltp
  int ltp = 1, ldp = 1;
  bool bf16 = true;   // else fp16
  int64_t n_in = 0;   // elements of x_in
  int64_t n_out = 0;  // elements of x_out
  const void* x_in = nullptr;
  void* x_out = nullptr;           // contiguous
  char* peer_buf[kMaxRanks] = {};  // rank r's buffer as this rank addresses it
  int64_t slot_bytes = 0;
  const uint32_t* abort = nullptr;  // CUDA: the group's abort word (core/comm_abort.h)
};

/// Upstream's buffers mark a slot not yet written with an aligned pair of -0 16-bit values (the
/// word 0x80008000): such a pair passing through a peer buffer arrives as two +0.
FLASHINFER_HD uint16_t mixed_comm_pair(uint16_t bits, uint16_t partner_bits) {
  return bits == 0x8000u && partner_bits == 0x8000u ? uint16_t{0} : bits;
}

/// Whether the mode's result passes through a buffer once more (upstream's BYTES1 kernels
/// broadcast the owner's rounded sum).
FLASHINFER_HD bool mixed_comm_final_pair(const MixedCommParams& p) {
  return (p.mode == MixedCommParams::kBytes1Mc || p.mode == MixedCommParams::kBytes1Uc) &&
         p.op != MixedCommParams::kAllGather && p.op != MixedCommParams::kReduceScatter;
}

/// One step of a sum: fp32_add, with a NaN result the positive canonical NaN on both backends
/// (the device's add gives it; the host's keeps an operand's sign, and x86's inf + -inf is -NaN),
/// so the rounded output's bits agree.
FLASHINFER_HD float mixed_comm_add(float a, float b) {
  const float s = fp32_add(a, b);
#if !defined(__CUDA_ARCH__)
  if (s != s) return f32_from_bits(0x7FFFFFFFu);
#endif
  return s;
}

/// Output element i before any final pair rule: bits(r, e) reads rank r's x_in element e (16-bit
/// pattern), to_f widens a pattern to fp32, round rounds fp32 to the dtype (nearest even). Sums
/// start at their first term and add in fp32.
template <class Bits, class ToF, class Round>
FLASHINFER_HD uint16_t mixed_comm_value(const MixedCommParams& p, int64_t i, const Bits& bits,
                                        const ToF& to_f, const Round& round) {
  using P = MixedCommParams;
  // A term read through a peer buffer (pair rule) or as given.
  auto term = [&](int r, int64_t e, bool through_buffer) {
    const uint16_t b = bits(r, e);
    return to_f(through_buffer ? mixed_comm_pair(b, bits(r, e ^ 1)) : b);
  };
  const bool waits = p.mode == P::kWaitsMc || p.mode == P::kWaitsUc;
  const bool fused = p.mode <= P::kBytes2Uc;
  switch (p.op) {
    case P::kAllReduce: {
      // WAITS and (in rank order here) BYTES1_UC read the peers' buffers; BYTES1_MC sums the
      // inputs in the switch, NCCL as given.
      const bool buf = waits || p.mode == P::kBytes1Uc;
      float acc = term(0, i, buf);
      for (int r = 1; r < p.size; ++r) acc = mixed_comm_add(acc, term(r, i, buf));
      return round(acc);
    }
    case P::kAllGather: {
      const int k = static_cast<int>(i / p.n_in);
      const uint16_t b = bits(k, i % p.n_in);
      return fused ? mixed_comm_pair(b, bits(k, (i % p.n_in) ^ 1)) : b;
    }
    case P::kReduceScatter: {
      const int64_t e = static_cast<int64_t>(p.rank) * p.n_out + i;
      if (p.mode == P::kWaitsUc) {
        // This rank's own block first, as given, then the peers' descending from rank - 1.
        float acc = term(p.rank, e, false);
        for (int k = 1; k < p.size; ++k)
          acc = mixed_comm_add(acc, term((p.rank - k + p.size) % p.size, e, true));
        return round(acc);
      }
      float acc = term(0, e, false);
      for (int r = 1; r < p.size; ++r) acc = mixed_comm_add(acc, term(r, e, false));
      return round(acc);
    }
    case P::kAllReduceAllGather: {
      const int d = static_cast<int>(i / p.n_in);
      const int64_t e = i % p.n_in;
      const bool buf = waits || p.mode == P::kBytes1Uc;
      float acc = term(d * p.ltp, e, buf);
      for (int t = 1; t < p.ltp; ++t) acc = mixed_comm_add(acc, term(t + d * p.ltp, e, buf));
      return round(acc);
    }
    default: {  // kRsAllReduce: block dp_rank of every rank
      const int d = p.rank / p.ltp;
      const int64_t e = static_cast<int64_t>(d) * p.n_out + i;
      if (p.mode == P::kNcclTpDp) {
        // A reduce-scatter over each DP group, rounded, then an all-reduce over TP, rounded.
        float outer = 0.0f;
        for (int t = 0; t < p.ltp; ++t) {
          float inner = term(t, e, false);
          for (int dd = 1; dd < p.ldp; ++dd)
            inner = mixed_comm_add(inner, term(t + dd * p.ltp, e, false));
          const float s = to_f(round(inner));
          outer = t == 0 ? s : mixed_comm_add(outer, s);
        }
        return round(outer);
      }
      if (waits || p.mode == P::kBytes1Uc) {
        // DP groups descending from d - 1, ending with this rank's own; TP ranks ascending.
        float acc = 0.0f;
        bool first = true;
        for (int k = 1; k <= p.ldp; ++k) {
          const int dd = (d - k + p.ldp) % p.ldp;
          for (int t = 0; t < p.ltp; ++t) {
            const float v = term(t + dd * p.ltp, e, true);
            acc = first ? v : mixed_comm_add(acc, v);
            first = false;
          }
        }
        return round(acc);
      }
      float acc = term(0, e, false);
      for (int r = 1; r < p.size; ++r) acc = mixed_comm_add(acc, term(r, e, false));
      return round(acc);
    }
  }
}

/// Output element i: its value, then the final pair rule where the mode has one (element i ^ 1
/// computed too: the pair is the output's).
template <class Bits, class ToF, class Round>
FLASHINFER_HD uint16_t mixed_comm_output(const MixedCommParams& p, int64_t i, const Bits& bits,
                                         const ToF& to_f, const Round& round) {
  const uint16_t v = mixed_comm_value(p, i, bits, to_f, round);
  if (!mixed_comm_final_pair(p)) return v;
  return mixed_comm_pair(v, mixed_comm_value(p, i ^ 1, bits, to_f, round));
}

}  // namespace flashinfer::kernels
