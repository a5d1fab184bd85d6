// CPU BGMV over MoE pairs: fp32 dot products of fp16/bf16 operands, the shrink result rounded
// into y's dtype after adding to it (y +=), the expand accumulated in fp32 in pair order.
#include "kernels/cpu/moe_lora_cpu.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "flashinfer/float_formats.h"

namespace flashinfer::kernels::cpu {

namespace {

// The element type is a template parameter so the inner dot products carry no dtype branch.
template <bool kBf16>
float load16(const void* base, int64_t i) {
  const uint16_t b = static_cast<const uint16_t*>(base)[i];
  return kBf16 ? bfloat16_bits_to_float(b) : half_bits_to_float(b);
}
template <bool kBf16>
void store16(void* base, int64_t i, float v) {
  static_cast<uint16_t*>(base)[i] = kBf16 ? float_to_bfloat16_bits(v) : float_to_half_bits(v);
}
template <bool kBf16>
float round16(float v) {
  return kBf16 ? bfloat16_bits_to_float(float_to_bfloat16_bits(v))
               : half_bits_to_float(float_to_half_bits(v));
}
template <bool kBf16>
void to_float(const void* base, int64_t offset, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = load16<kBf16>(base, offset + i);
}

template <bool kBf16>
void shrink(const BgmvMoeParams& p) {
  const int64_t P = p.num_pairs, R = p.rank, F = p.feat;
  // Each (slice, pair) owns its output row, so pairs run in parallel.
#pragma omp parallel if (p.num_slices * P * R * F > (1 << 16))
  {
    std::vector<float> xf(static_cast<std::size_t>(F)), wf(static_cast<std::size_t>(F));
#pragma omp for collapse(2) schedule(static)
    for (int64_t s = 0; s < p.num_slices; ++s) {
      for (int64_t q = 0; q < P; ++q) {
        const void* w = p.weight[static_cast<std::size_t>(s * P + q)];
        if (p.lora[static_cast<std::size_t>(q)] < 0 || w == nullptr) continue;
        const int64_t row = p.per_pair_input ? q : p.token[static_cast<std::size_t>(q)];
        to_float<kBf16>(p.x, row * F, F, xf.data());
        for (int64_t r = 0; r < R; ++r) {
          to_float<kBf16>(w, r * F, F, wf.data());
          float acc = 0.0f;
          for (int64_t c = 0; c < F; ++c) {
            acc += xf[static_cast<std::size_t>(c)] * wf[static_cast<std::size_t>(c)];
          }
          const int64_t o = (s * P + q) * R + r;
          // Upstream: Y[o] += static_cast<out_T>(acc), i.e. the fp32 dot rounded to y's dtype
          // first, then a half-precision add (moe_bgmv_impl.cuh).
          store16<kBf16>(p.y, o, load16<kBf16>(p.y, o) + round16<kBf16>(acc));
        }
      }
    }
  }
}

template <bool kBf16>
void expand(const BgmvMoeParams& p) {
  const int64_t P = p.num_pairs, R = p.rank, F = p.feat;
  constexpr int64_t kCols = 16;
  const int64_t blocks = (F + kCols - 1) / kCols;
  auto* y = static_cast<float*>(p.y);
  // finalize: several pairs add into one token row, so each output column sees the pairs in
  // order; threads split the (slice, column block) grid, whose outputs are disjoint.
#pragma omp parallel if (p.num_slices * P * R * F > (1 << 16))
  {
    std::vector<float> xf(static_cast<std::size_t>(R)), wf(static_cast<std::size_t>(R));
#pragma omp for collapse(2) schedule(static)
    for (int64_t s = 0; s < p.num_slices; ++s) {
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t j0 = blk * kCols, j1 = std::min(F, j0 + kCols);
        for (int64_t q = 0; q < P; ++q) {
          const void* w = p.weight[static_cast<std::size_t>(s * P + q)];
          if (p.lora[static_cast<std::size_t>(q)] < 0 || w == nullptr) continue;
          to_float<kBf16>(p.x, (s * P + q) * R, R, xf.data());
          float* yrow =
              p.finalize ? y + p.token[static_cast<std::size_t>(q)] * p.y_cols : y + q * p.y_cols;
          yrow += p.slice_start[static_cast<std::size_t>(s)];
          for (int64_t j = j0; j < j1; ++j) {
            to_float<kBf16>(w, j * R, R, wf.data());
            float acc = 0.0f;
            for (int64_t r = 0; r < R; ++r) {
              acc += xf[static_cast<std::size_t>(r)] * wf[static_cast<std::size_t>(r)];
            }
            if (p.finalize) {
              yrow[j] += p.topk_weights[q] * acc;
            } else {
              yrow[j] = acc;
            }
          }
        }
      }
    }
  }
}

}  // namespace

void bgmv_moe_shrink(const BgmvMoeParams& p) {
  if (p.dtype == DType::kBFloat16) {
    shrink<true>(p);
  } else {
    shrink<false>(p);
  }
}

void bgmv_moe_expand(const BgmvMoeParams& p) {
  if (p.dtype == DType::kBFloat16) {
    expand<true>(p);
  } else {
    expand<false>(p);
  }
}

}  // namespace flashinfer::kernels::cpu
