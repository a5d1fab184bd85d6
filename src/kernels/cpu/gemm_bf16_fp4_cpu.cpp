// CPU reference of the BF16 x NVFP4 GEMM: the prepared layouts are read back to the exact fp32
// weight (e2m1 * scale has at most 6 significant bits: exact), then fp32 dot products (eight
// partial sums in a fixed order).
#include "kernels/cpu/gemm_bf16_fp4_cpu.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cpu {

void cute_dsl_tile_source(int64_t word, int64_t j, int64_t* kh, int64_t* nn) {
  // The tile is 8 packed k-rows x 64 n; each int32 holds the 4 bytes one MMA lane loads.
  static constexpr int64_t kKhOffset[4] = {0, 4, 0, 4};
  static constexpr int64_t kNOffset[2][4] = {{0, 0, 16, 16}, {32, 32, 48, 48}};
  const int64_t lane = (word / 2) % 32, warp_n = word / 64;
  *kh = lane % 4 + kKhOffset[j];
  *nn = warp_n * 8 + lane / 4 + kNOffset[word % 2][j];
}

uint8_t e4m3_to_s0e5m3(uint8_t e4m3) {
  const float v = e4m3fn_bits_to_float(e4m3);
  // fp16's NaN is 0x7E00 (torch's conversion), whose bits 7..14 are 0xFC.
  if (std::isnan(v)) return 0xFC;
  return static_cast<uint8_t>((float_to_half_bits(v) >> 7) & 0xFF);
}

namespace {

constexpr int64_t kTileK = 16, kTileN = 64, kWordsPerTile = 128;

// The exact fp32 weight [n, k] of either prepared layout.
std::vector<float> dequantize(const Bf16Fp4GemmParams& p) {
  const int64_t n = p.n, k = p.k, ksf = k / 16;
  std::vector<float> w(static_cast<size_t>(n * k));
  if (p.layout == Bf16Fp4Layout::kCudnn) {
#pragma omp parallel for schedule(static) if (n * k >= (1 << 16))
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t byte = p.b[r * p.b_stride_n + c / 2];
        const float code = e2m1_bits_to_float(c % 2 ? e2m1x2_high(byte) : e2m1x2_low(byte));
        w[static_cast<size_t>(r * k + c)] = code * e4m3fn_bits_to_float(p.sf[r * ksf + c / 16]);
      }
    }
    return w;
  }
  const int64_t n_tiles = n / kTileN, k_tiles = k / kTileK;
#pragma omp parallel for schedule(static) if (n * k >= (1 << 16))
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    for (int64_t nt = 0; nt < n_tiles; ++nt) {
      for (int64_t word = 0; word < kWordsPerTile; ++word) {
        for (int64_t j = 0; j < 4; ++j) {
          int64_t kh = 0, nn = 0;
          cute_dsl_tile_source(word, j, &kh, &nn);
          // Little-endian int32: byte j of the word is the j-th byte in memory.
          const uint8_t byte = p.b[((kt * n_tiles + nt) * kWordsPerTile + word) * 4 + j];
          const int64_t r = nt * kTileN + nn, c = (kt * 8 + kh) * 2;
          // S0E5M3 -> fp16 bits << 7: a non-negative scale.
          const float s = half_bits_to_float(static_cast<uint16_t>(p.sf[(c / 16) * n + r] << 7));
          w[static_cast<size_t>(r * k + c)] = e2m1_bits_to_float(e2m1x2_low(byte)) * s;
          w[static_cast<size_t>(r * k + c + 1)] = e2m1_bits_to_float(e2m1x2_high(byte)) * s;
        }
      }
    }
  }
  return w;
}

}  // namespace

void bf16_fp4_prepare(const Bf16Fp4PrepareParams& p) {
  const int64_t n = p.n, k = p.k, ksf = k / 16;
  if (p.layout == Bf16Fp4Layout::kCudnn) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < ksf; ++c) {
        p.out_sf[r * ksf + c] = p.sf[bf16_fp4_cudnn_sf_source(r, c, ksf)];
      }
    }
    return;
  }
  for (int64_t c = 0; c < ksf; ++c) {
    for (int64_t r = 0; r < n; ++r) {
      p.out_sf[c * n + r] = e4m3_to_s0e5m3(p.sf[sf_offset(SfLayoutCode::k128x4, r, c, ksf)]);
    }
  }
  const int64_t n_tiles = n / kTileN, k_tiles = k / kTileK;
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    for (int64_t nt = 0; nt < n_tiles; ++nt) {
      for (int64_t word = 0; word < kWordsPerTile; ++word) {
        for (int64_t j = 0; j < 4; ++j) {
          int64_t kh = 0, nn = 0;
          cute_dsl_tile_source(word, j, &kh, &nn);
          p.out_b[((kt * n_tiles + nt) * kWordsPerTile + word) * 4 + j] =
              p.b[(nt * kTileN + nn) * p.b_stride_n + kt * 8 + kh];
        }
      }
    }
  }
}

void mm_bf16_fp4(const Bf16Fp4GemmParams& p) {
  const std::vector<float> w = dequantize(p);
  const int64_t k = p.k;
  const auto* a = static_cast<const BFloat16*>(p.a);
#pragma omp parallel for schedule(static) if (p.m * p.n * k >= (1 << 18))
  for (int64_t i = 0; i < p.m; ++i) {
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t c = 0; c < k; ++c) row[static_cast<size_t>(c)] = to_float(a[i * p.a_stride_m + c]);
    for (int64_t j = 0; j < p.n; ++j) {
      const float* wr = w.data() + j * k;
      // Eight fp32 partial sums (k % 16 == 0), lane c % 8, combined pairwise: a fixed order,
      // so every backend's layout gives the same bits, and independent adds that vectorize.
      float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t c = 0; c < k; c += 8) {
        for (int l = 0; l < 8; ++l) lanes[l] += row[static_cast<size_t>(c + l)] * wr[c + l];
      }
      const float acc = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                        ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
      const float v = acc * p.alpha;
      const int64_t o = i * p.out_stride_m + j * p.out_stride_n;
      if (p.out_dtype == DType::kFloat16) {
        static_cast<Half*>(p.out)[o] = from_float<Half>(v);
      } else {
        static_cast<BFloat16*>(p.out)[o] = from_float<BFloat16>(v);
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
