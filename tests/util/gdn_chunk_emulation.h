// The chunked (WY) form of chunk_gated_delta_rule on the CPU, step for step as the CUDA chunked
// kernel computes it (src/kernels/cuda/gdn_chunk_cuda.cu): the same gate sums, masks, inverse
// (kernels/gdn_chunk_rules.h's helpers in the kernel's order) and the same points where operands
// are rounded to the io dtype. In double with no rounding it must equal the token recurrence to
// fp64 rounding (the algebra); in float with the kernel's rounding, the CPU reference to
// upstream's tolerances. The products are summed in double and rounded to Real (an MMA's fp32
// accumulation, in no particular order).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "flashinfer/dtype.h"
#include "flashinfer/float_formats.h"
#include "kernels/gdn_chunk_rules.h"

namespace flashinfer::testing::gdn_chunk_emu {

namespace gc = kernels::gdn_chunk;

/// x rounded to the io dtype (bf16 or fp16, to nearest even), as the kernel rounds its MMA
/// operands: the `round_io` of run<float>.
inline float round_to_io(DType io, float x) {
  return io == DType::kBFloat16 ? bfloat16_bits_to_float(float_to_bfloat16_bits(x))
                                : half_bits_to_float(float_to_half_bits(x));
}

struct Problem {
  int64_t Hq = 1, Hk = 1, Hv = 1, D = 64;  // K = V = D
  std::vector<int64_t> cu;                 // cu_seqlens
  std::vector<double> q, k, v;             // [T, H_x, D]
  std::vector<double> g, beta;             // [T, H]; empty: 1
  std::vector<double> state0;              // [N, H, V, K]; empty: zeros
  double scale = 1.0;
  int64_t every = 0;  // checkpoints after every `every` tokens (a multiple of 64)
  int64_t heads() const { return std::max(Hq, Hv); }
};

struct Result {
  std::vector<double> out;    // [T, H, D]
  std::vector<double> state;  // [N, H, V, K] (zero-length sequences: 0)
  std::vector<double> ckpt;   // [rows, H, V, K], sequence n's from the sum of the earlier counts
};

/// Inputs for the tests: random q / v rows, L2-normalized k rows, gates g in (0, 1) and beta in
/// [0, 1), initial states; with `upstream_inputs` as upstream's tests draw them (rows
/// U(mu - 0.25, mu + 0.25), mu ~ N(0, 0.05); g U(0, 1); states 0.01 U(-1, 1)), else q, v U(-1, 1),
/// g U(0.3, 1), states 0.3 U(-1, 1). Scale D^-0.5.
inline Problem make_problem(std::vector<int64_t> cu, int64_t Hq, int64_t Hk, int64_t Hv, int64_t D,
                            uint64_t seed, bool upstream_inputs) {
  Problem pb;
  pb.cu = cu, pb.Hq = Hq, pb.Hk = Hk, pb.Hv = Hv, pb.D = D;
  const int64_t T = cu.back(), H = pb.heads(), N = static_cast<int64_t>(cu.size()) - 1;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0), u01(0.0, 1.0);
  std::normal_distribution<double> mu(0.0, 0.05);
  // upstream's conftest: each row U(mu - 0.25, mu + 0.25) with mu ~ N(0, 0.05); k normalized.
  auto rows = [&](int64_t n_rows, bool normalize) {
    std::vector<double> x(static_cast<size_t>(n_rows * D));
    for (int64_t r = 0; r < n_rows; ++r) {
      const double m = mu(rng);
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) {
        x[r * D + i] = upstream_inputs ? m + 0.25 * u(rng) : u(rng);
        ss += x[r * D + i] * x[r * D + i];
      }
      if (normalize) {
        for (int64_t i = 0; i < D; ++i) x[r * D + i] /= std::sqrt(ss);
      }
    }
    return x;
  };
  pb.q = rows(T * Hq, false), pb.k = rows(T * Hk, true), pb.v = rows(T * Hv, false);
  pb.g.resize(static_cast<size_t>(T * H)), pb.beta.resize(static_cast<size_t>(T * H));
  for (auto& x : pb.g) x = upstream_inputs ? u01(rng) : 0.3 + 0.7 * u01(rng);
  for (auto& x : pb.beta) x = u01(rng);
  pb.state0.resize(static_cast<size_t>(N * H * D * D));
  for (auto& x : pb.state0) x = upstream_inputs ? 0.01 * u(rng) : 0.3 * u(rng);
  pb.scale = 1.0 / std::sqrt(static_cast<double>(D));
  return pb;
}

/// The cases GdnCuda.ChunkedPrefillMatchesCpuAtUpstreamTolerances runs on a GPU, and
/// GdnChunk.CudaTestCasesEmulatedWithinUpstreamTolerances on the CPU with the kernel's rounding:
/// lengths of one token, partial, whole and several chunks and an empty sequence, GVA and GQA
/// heads, head dims 128 and 64, bf16 and fp16, an initial state, checkpoints every 64; upstream's
/// inputs, and (`upstream` false) inputs whose initial state lasts (0.3 U(-1, 1), gates >= 0.3:
/// a state read wrongly shows in the outputs) with a zero and a negative gate.
struct CudaCase {
  std::vector<int64_t> cu;
  int64_t Hq, Hk, Hv, D;
  bool bf16;
  uint64_t seed;
  bool upstream = true;
};
inline std::vector<CudaCase> cuda_cases() {
  return {{{0, 70, 70, 200, 333}, 2, 2, 4, 128, true, 300},
          {{0, 70, 70, 200, 333}, 2, 2, 4, 128, false, 301},
          {{0, 1, 64, 129, 193}, 4, 2, 2, 64, true, 302},
          {{0, 1, 64, 129, 193}, 1, 1, 1, 64, false, 303},
          {{0, 1, 150, 333}, 2, 2, 4, 128, true, 304, false},
          {{0, 1, 150, 333}, 1, 1, 2, 128, false, 305, false}};
}
inline Problem cuda_problem(const CudaCase& c) {
  Problem pb = make_problem(c.cu, c.Hq, c.Hk, c.Hv, c.D, c.seed, c.upstream);
  pb.every = 64;
  if (!c.upstream) {
    const int64_t H = pb.heads(), T = pb.cu.back();
    pb.g[5 * H + 0] = 0.0;             // the state before token 5 lost (head 0)
    pb.g[(T / 2) * H + H - 1] = -0.5;  // a negative gate (the last head)
  }
  return pb;
}

/// Runs the chunked form with scalar Real, `round_io` applied where the kernel rounds an MMA
/// operand or output to the io dtype.
template <class Real, class Round>
Result run(const Problem& pb, Round round_io) {
  constexpr int B = gc::kChunk;
  const int64_t H = pb.heads(), D = pb.D, N = static_cast<int64_t>(pb.cu.size()) - 1;
  const int64_t T = pb.cu.back();
  Result res;
  res.out.assign(static_cast<size_t>(T * H * D), 0.0);
  res.state.assign(static_cast<size_t>(N * H * D * D), 0.0);
  int64_t rows = 0;
  std::vector<int64_t> first_row(static_cast<size_t>(N), 0);
  for (int64_t n = 0; n < N; ++n) {
    first_row[n] = rows;
    if (pb.every > 0) rows += (pb.cu[n + 1] - pb.cu[n]) / pb.every;
  }
  res.ckpt.assign(static_cast<size_t>(rows * H * D * D), 0.0);
  auto rd = [&](double x) { return static_cast<Real>(round_io(static_cast<Real>(x))); };
  const int ld = B;  // the emulation's own fp32 tiles: dense
  for (int64_t n = 0; n < N; ++n) {
    const int64_t begin = pb.cu[n], len = pb.cu[n + 1] - begin;
    if (len <= 0) continue;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t qh = h * pb.Hq / H, kh = h * pb.Hk / H, vh = h * pb.Hv / H;
      std::vector<Real> S(static_cast<size_t>(D * D), Real(0));  // [v][k]
      if (!pb.state0.empty()) {
        for (int64_t i = 0; i < D * D; ++i)
          S[i] = static_cast<Real>(pb.state0[(n * H + h) * D * D + i]);
      }
      for (int64_t c0 = 0; c0 < len; c0 += B) {
        const int C = static_cast<int>(std::min<int64_t>(B, len - c0));
        auto Q = [&](int t, int64_t i) {
          return t < C ? pb.q[((begin + c0 + t) * pb.Hq + qh) * D + i] : 0.0;
        };
        auto K = [&](int t, int64_t i) {
          return t < C ? pb.k[((begin + c0 + t) * pb.Hk + kh) * D + i] : 0.0;
        };
        auto V = [&](int t, int64_t i) {
          return t < C ? pb.v[((begin + c0 + t) * pb.Hv + vh) * D + i] : 0.0;
        };
        // Gates: inclusive sums in token order; past C alpha 1, beta 0.
        Real G[B], be[B], gam[B], tail[B];
        int cnt[B];
        Real run_g = 0;
        int run_c = 0;
        for (int t = 0; t < B; ++t) {
          Real alpha = 1, beta = 0;
          if (t < C) {
            const int64_t tok = begin + c0 + t;
            alpha = pb.g.empty() ? Real(1) : static_cast<Real>(pb.g[tok * H + h]);
            beta = pb.beta.empty() ? Real(1) : static_cast<Real>(pb.beta[tok * H + h]);
          }
          const gc::GateTerm<Real> term = gc::gate_term(alpha);
          run_g += term.log_abs;
          run_c += term.counts;
          G[t] = run_g, cnt[t] = run_c, be[t] = beta;
          gam[t] = gc::decay_ratio(run_g, run_c, Real(0), 0);
        }
        for (int t = 0; t < B; ++t) {
          tail[t] = t < C ? gc::decay_ratio(G[C - 1], cnt[C - 1], G[t], cnt[t]) : Real(0);
        }
        // L (fp32) and M' (io).
        std::vector<Real> L(B * B), M(B * B), X(B * B, Real(0)), Tm(B * B);
        for (int s = 0; s < B; ++s) {
          for (int t = 0; t < B; ++t) {
            double kk = 0, qk = 0;
            for (int64_t i = 0; i < D; ++i) kk += K(s, i) * K(t, i), qk += Q(s, i) * K(t, i);
            const Real ratio = s >= t ? gc::decay_ratio(G[s], cnt[s], G[t], cnt[t]) : Real(0);
            L[s * ld + t] = gc::kkt_entry(s, t, C, be[s], ratio, static_cast<Real>(kk));
            M[s * ld + t] = rd(
                gc::qkt_entry(s, t, C, static_cast<Real>(pb.scale), ratio, static_cast<Real>(qk)));
          }
        }
        // X = (I + L)^-1 in the kernel's order: diagonal blocks, then the merges by distance.
        for (int b = 0; b < gc::kSubs; ++b) {
          for (int c = 0; c < gc::kSub; ++c) {
            Real x[gc::kSub];
            gc::inverse_block_column(L.data(), ld, b, c, x);
            for (int i = 0; i < gc::kSub; ++i) X[(gc::kSub * b + i) * ld + gc::kSub * b + c] = x[i];
          }
        }
        for (int d = 1; d < gc::kSubs; ++d) {
          std::vector<Real> W(static_cast<size_t>(gc::merge_blocks(d) * 256));
          for (int e = 0; e < gc::merge_blocks(d) * 64; ++e) {
            const int j = e / 64, r = (e / 4) % 16, c0 = 4 * (e % 4);
            Real w4[4];
            gc::merge_sum4(L.data(), X.data(), ld, j + d, j, r, c0, w4);
            for (int q = 0; q < 4; ++q) W[j * 256 + r * 16 + c0 + q] = w4[q];
          }
          for (int e = 0; e < gc::merge_blocks(d) * 64; ++e) {
            const int j = e / 64, r = (e / 4) % 16, c0 = 4 * (e % 4);
            Real x4[4];
            gc::merge_block4(X.data(), ld, W.data() + j * 256, j + d, r, c0, x4);
            for (int q = 0; q < 4; ++q)
              X[(gc::kSub * (j + d) + r) * ld + gc::kSub * j + c0 + q] = x4[q];
          }
        }
        for (int s = 0; s < B; ++s) {
          for (int t = 0; t < B; ++t) Tm[s * ld + t] = rd(s >= t ? X[s * ld + t] * be[t] : Real(0));
        }
        // R = V^T - (S K^T) diag(gamma), U^T = R T^T (both [v][t]).
        std::vector<Real> Sr(S.size());
        for (size_t i = 0; i < S.size(); ++i) Sr[i] = rd(S[i]);
        std::vector<Real> R(static_cast<size_t>(D * B)), U(static_cast<size_t>(D * B));
        for (int64_t v = 0; v < D; ++v) {
          for (int t = 0; t < B; ++t) {
            double pk = 0;
            for (int64_t i = 0; i < D; ++i) pk += static_cast<double>(Sr[v * D + i]) * K(t, i);
            R[v * B + t] = rd(static_cast<Real>(V(t, v)) - gam[t] * static_cast<Real>(pk));
          }
          for (int s = 0; s < B; ++s) {
            double u = 0;
            for (int t = 0; t < B; ++t) u += static_cast<double>(R[v * B + t]) * Tm[s * ld + t];
            U[v * B + s] = static_cast<Real>(u);
          }
        }
        // O^T = scale (S Q^T) diag(gamma) + U^T M'^T, from the entry state.
        for (int64_t v = 0; v < D; ++v) {
          for (int s = 0; s < C; ++s) {
            double o1 = 0;
            for (int64_t i = 0; i < D; ++i) o1 += static_cast<double>(Sr[v * D + i]) * Q(s, i);
            double o2 = 0;
            for (int t = 0; t < B; ++t) o2 += static_cast<double>(rd(U[v * B + t])) * M[s * ld + t];
            const Real o = static_cast<Real>(o1) * (static_cast<Real>(pb.scale) * gam[s]);
            res.out[((begin + c0 + s) * H + h) * D + v] = rd(static_cast<double>(o) + o2);
          }
        }
        // S = gamma_C S + (U^T diag(Gamma_{C, .})) K.
        for (int64_t v = 0; v < D; ++v) {
          Real us[B];
          for (int t = 0; t < B; ++t) us[t] = rd(t < C ? U[v * B + t] * tail[t] : Real(0));
          for (int64_t i = 0; i < D; ++i) {
            double acc = static_cast<double>(S[v * D + i] * gam[C - 1]);
            for (int t = 0; t < B; ++t) acc += static_cast<double>(us[t]) * K(t, i);
            S[v * D + i] = static_cast<Real>(acc);
          }
        }
        if (pb.every > 0 && (c0 + C) % pb.every == 0) {
          const int64_t row = first_row[n] + (c0 + C) / pb.every - 1;
          for (int64_t i = 0; i < D * D; ++i) res.ckpt[(row * H + h) * D * D + i] = S[i];
        }
      }
      for (int64_t i = 0; i < D * D; ++i) res.state[(n * H + h) * D * D + i] = S[i];
    }
  }
  return res;
}

}  // namespace flashinfer::testing::gdn_chunk_emu
