// SM90 mixed-input MoE weight preparation (flashinfer.fused_moe.prepare):
// interleave_moe_scales_for_sm90_mixed_gemm, interleave_moe_weights_for_sm90_mixed_gemm and
// preprocess_moe_weights_for_sm90_mixed_gemm_humming. Hand-checked positions and bits, the
// transforms as bit permutations (every input bit lands on exactly one output bit), the scale
// fold against its reshape/permute formula, the Humming clamp by hand and its shared steps
// (kernels/moe_weight_prep_rules.h) against their formulas, bad input naming the argument,
// record/replay, a dump written by torch in upstream's format, and the CUDA kernels bit-exact
// with the CPU (skipped without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/replay.h"
#include "kernels/cpu/moe_weight_prep_cpu.h"
#include "kernels/moe_weight_prep_rules.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer::testing {
namespace {

Tensor bytes(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kUInt8);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t.data<uint8_t>()[i] = static_cast<uint8_t>(s >> 56);
  }
  return t;
}

uint8_t at(const Tensor& t, int64_t i) { return t.data<uint8_t>()[i]; }

// ---- scales ----------------------------------------------------------------------------------

// uint8, group 32: 4 groups per K128 block, 16 bytes a row, so 4 M slices of 16 rows.
// out[e, rb, kb, fm, c] = in[e, rb * 64 + (c / 4) * 16 + fm, kb * 4 + c % 4].
TEST(InterleaveMoeScales, HandCheckedUint8Group32) {
  Tensor s = Tensor::empty({1, 64, 4}, DType::kUInt8);
  for (int64_t r = 0; r < 64; ++r) {
    for (int64_t g = 0; g < 4; ++g) s.data<uint8_t>()[r * 4 + g] = static_cast<uint8_t>(r * 4 + g);
  }
  Tensor o = interleave_moe_scales_for_sm90_mixed_gemm(s);
  ASSERT_EQ(o.shape(), Shape({1, 1, 1, 16, 16}));
  const std::vector<int> row0 = {0,   1,   2,   3,   64,  65,  66,  67,
                                 128, 129, 130, 131, 192, 193, 194, 195};
  for (int64_t c = 0; c < 16; ++c) EXPECT_EQ(at(o, c), row0[static_cast<size_t>(c)]) << c;
  EXPECT_EQ(at(o, 1 * 16 + 4), 68);     // fm 1, slice 1 group 0: row 17
  EXPECT_EQ(at(o, 15 * 16 + 15), 255);  // fm 15, slice 3 group 3: row 63
}

// bf16 scales, group 128 (W4A8): one group per K128 block, 8 per 16 bytes, 8 slices of 8 rows:
// out[.., fm, c] = in[c * 8 + fm, kb].
TEST(InterleaveMoeScales, HandCheckedBf16Group128) {
  Tensor s = Tensor::empty({1, 64, 2}, DType::kBFloat16);
  for (int64_t r = 0; r < 64; ++r) {
    for (int64_t k = 0; k < 2; ++k)
      s.data<uint16_t>()[r * 2 + k] = static_cast<uint16_t>(r * 2 + k);
  }
  Tensor o = interleave_moe_scales_for_sm90_mixed_gemm(s, 128);
  ASSERT_EQ(o.shape(), Shape({1, 1, 2, 8, 8}));
  EXPECT_EQ(o.dtype(), DType::kBFloat16);
  const auto* d = o.data<uint16_t>();
  EXPECT_EQ(d[0 * 8 + 1], 8 * 2);                          // kb 0, fm 0, c 1: row 8
  EXPECT_EQ(d[(1 * 8 + 3) * 8 + 5], (5 * 8 + 3) * 2 + 1);  // kb 1, fm 3, c 5: row 43
}

// Every dtype size and group the fold allows, against upstream's reshape(e, rows/64, ms, fm,
// kb, G).permute(0, 1, 4, 3, 2, 5) written as an index formula, over 2 experts and 2 row blocks.
TEST(InterleaveMoeScales, MatchesReshapePermuteFormula) {
  struct Case {
    DType dt;
    int64_t group;
  };
  for (Case c : {Case{DType::kUInt8, 32}, Case{DType::kUInt8, 128}, Case{DType::kUInt8, 64},
                 Case{DType::kBFloat16, 128}, Case{DType::kBFloat16, 64}, Case{DType::kFloat32, 32},
                 Case{DType::kFloat32, 128}, Case{DType::kInt64, 128}}) {
    SCOPED_TRACE(std::string(dtype_name(c.dt)) + " group " + std::to_string(c.group));
    const int64_t es = static_cast<int64_t>(dtype_size(c.dt));
    const int64_t G = 128 / c.group, cols = 16 / es, ms = cols / G, fm_n = 64 / ms;
    const int64_t E = 2, rows = 128, kb_n = 3, kg = kb_n * G;
    Tensor raw = bytes({E, rows, kg * es}, 3);
    Tensor s = Tensor::from_storage(raw.storage(), {E, rows, kg}, {rows * kg, kg, 1}, 0, c.dt);
    Tensor o = interleave_moe_scales_for_sm90_mixed_gemm(s, c.group);
    ASSERT_EQ(o.shape(), Shape({E, rows / 64, kb_n, fm_n, cols}));
    int64_t idx = 0, bad = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t rb = 0; rb < rows / 64; ++rb)
        for (int64_t kb = 0; kb < kb_n; ++kb)
          for (int64_t fm = 0; fm < fm_n; ++fm)
            for (int64_t m = 0; m < ms; ++m)
              for (int64_t g = 0; g < G; ++g, ++idx) {
                const int64_t src = (e * rows + rb * 64 + m * fm_n + fm) * kg + kb * G + g;
                for (int64_t b = 0; b < es; ++b) {
                  bad += at(o, idx * es + b) != at(raw, src * es + b);
                }
              }
    EXPECT_EQ(bad, 0);
  }
}

// ---- weights ---------------------------------------------------------------------------------

Tensor one_bit(int64_t n, int64_t kbytes, int64_t byte, int bit) {
  Tensor t = Tensor::zeros({1, n, kbytes}, DType::kUInt8);
  t.data<uint8_t>()[byte] = static_cast<uint8_t>(1u << bit);
  return t;
}

// Where input bit (byte, bit) goes: the single set bit of the output (-1 if not exactly one).
int64_t image(std::string_view q, int64_t n, int64_t kbytes, int64_t byte, int bit) {
  Tensor o = interleave_moe_weights_for_sm90_mixed_gemm(one_bit(n, kbytes, byte, bit), q);
  int64_t found = -1;
  for (int64_t i = 0; i < o.numel(); ++i) {
    const uint8_t v = at(o, i);
    if (v == 0) continue;
    if (found >= 0 || (v & (v - 1)) != 0) return -1;
    found = i * 8 + __builtin_ctz(v);
  }
  return found;
}

// fp4: the 32-bit group of bytes (row r, col c), (r + 8, c), (r, c + 4), (r + 8, c + 4) goes,
// bit-permuted, to 4 consecutive bytes. Bits checked by hand from upstream's mask/shift list.
TEST(InterleaveMoeWeights, HandCheckedFp4) {
  const int64_t n = 16, kb = 32;  // k = 64
  // (0,0) bit 0 -> group bit 6: out row 0 byte 0 bit 6.
  EXPECT_EQ(image("fp4", n, kb, 0, 0), 0 * 8 + 6);
  // (8,0) bit 0 is group bit 8 -> bit 3.
  EXPECT_EQ(image("fp4", n, kb, 8 * kb, 0), 3);
  // (0,4) bit 0 is group bit 16 -> bit 0; (8,4) bit 7 is group bit 31 -> bit 30 (byte 3 bit 6).
  EXPECT_EQ(image("fp4", n, kb, 4, 0), 0);
  EXPECT_EQ(image("fp4", n, kb, 8 * kb + 4, 7), 3 * 8 + 6);
  // (0,0) bit 7 (the sign of the high nibble) is group bit 7 -> bit 31.
  EXPECT_EQ(image("fp4", n, kb, 0, 7), 3 * 8 + 7);
  // (0,1): lane 1 writes bytes 4..7 of row 0.
  EXPECT_EQ(image("fp4", n, kb, 1, 0), 4 * 8 + 6);
  // (0,8): lane 4 (mma 1) writes row 8, bytes 0..3.
  EXPECT_EQ(image("fp4", n, kb, 8, 0), (8 * kb) * 8 + 6);
  // (0,16): lane 8 (mma 2) writes row 0, bytes 16..19.
  EXPECT_EQ(image("fp4", n, kb, 16, 0), 16 * 8 + 6);
}

// int4 / fp4_fp8 move 16-bit units: (r, u) -> (r + 8 * ((u % 8) / 4), 8 * (u / 8) + 2 * (u % 4)),
// (r + 8, u) -> the unit after it.
TEST(InterleaveMoeWeights, HandCheckedInt4AndFp4Fp8) {
  const int64_t n = 16, kb = 32;  // 16 units a row
  EXPECT_EQ(image("int4", n, kb, 0, 0), 0);
  EXPECT_EQ(image("int4", n, kb, 8 * kb, 0), 2 * 8);         // unit 1 of row 0
  EXPECT_EQ(image("int4", n, kb, 2 * 1 + 1, 7), 5 * 8 + 7);  // unit 1 -> unit 2, high byte
  EXPECT_EQ(image("int4", n, kb, 2 * 4, 0), (8 * kb) * 8);   // unit 4 -> row 8 unit 0
  EXPECT_EQ(image("int4", n, kb, 2 * 8, 0), 16 * 8);         // unit 8 -> row 0 unit 8
  // fp4_fp8: magnitudes stay; a sign (bit 3 of nibble j of the 8-nibble pair a | b << 16) goes
  // to nibble 2j + 1 (j < 4) or 2(j - 4).
  EXPECT_EQ(image("fp4_fp8", n, kb, 0, 3), 7);                    // a nibble 0 -> nibble 1
  EXPECT_EQ(image("fp4_fp8", n, kb, 8 * kb, 3), 3);               // b nibble 0 (4) -> nibble 0
  EXPECT_EQ(image("fp4_fp8", n, kb, 8 * kb + 1, 7), 2 * 8 + 11);  // nibble 7 -> 6 (unit 1)
  EXPECT_EQ(image("fp4_fp8", n, kb, 1, 7), 2 * 8 + 15);           // nibble 3 -> 7 (unit 1)
  EXPECT_EQ(image("fp4_fp8", n, kb, 0, 1), 1);                    // magnitude bit stays
}

// Each transform is a bit permutation of a 16 x 64 tile: every one of its 4096 bits lands on
// exactly one output bit and no two on the same (so it has an inverse; no bit is lost). The
// 12288 single-bit runs call the CPU kernel the op dispatches to directly, on one buffer pair.
TEST(InterleaveMoeWeights, EveryBitLandsOnceInvertible) {
  using kernels::Sm90QuantType;
  for (Sm90QuantType q : {Sm90QuantType::kFp4, Sm90QuantType::kInt4, Sm90QuantType::kFp4Fp8}) {
    SCOPED_TRACE(static_cast<int>(q));
    std::vector<uint8_t> in(16 * 32, 0), out(16 * 32, 0);
    kernels::Sm90WeightInterleaveParams p;
    p.in = in.data();
    p.out = out.data();
    p.experts = 1;
    p.n = 16;
    p.k = 64;
    p.quant_type = q;
    std::set<int64_t> seen;
    int64_t bad = 0;
    for (size_t byte = 0; byte < in.size(); ++byte) {
      for (int bit = 0; bit < 8; ++bit) {
        std::fill(in.begin(), in.end(), 0);
        in[byte] = static_cast<uint8_t>(1u << bit);
        kernels::cpu::sm90_interleave_weights(p);
        int64_t to = -1, ones = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          if (out[i] == 0) continue;
          ones += __builtin_popcount(out[i]);
          to = static_cast<int64_t>(i) * 8 + __builtin_ctz(out[i]);
        }
        if (ones != 1 || !seen.insert(to).second) ++bad;
      }
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(seen.size(), 4096u);
  }
}

// Several experts, 32 rows and k = 128: each expert's 16-row, 64-element tiles are transformed
// alone (the result equals the transform of each tile cut out and put back).
TEST(InterleaveMoeWeights, TilesAreIndependent) {
  for (const char* q : {"fp4", "int4", "fp4_fp8"}) {
    SCOPED_TRACE(q);
    const int64_t E = 3, n = 32, kb = 64;
    Tensor w = bytes({E, n, kb}, 11);
    Tensor o = interleave_moe_weights_for_sm90_mixed_gemm(w, q);
    int64_t bad = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t rt = 0; rt < n / 16; ++rt)
        for (int64_t ct = 0; ct < kb / 32; ++ct) {
          Tensor tile = Tensor::empty({1, 16, 32}, DType::kUInt8);
          for (int64_t r = 0; r < 16; ++r)
            for (int64_t c = 0; c < 32; ++c)
              tile.data<uint8_t>()[r * 32 + c] = at(w, (e * n + rt * 16 + r) * kb + ct * 32 + c);
          Tensor to = interleave_moe_weights_for_sm90_mixed_gemm(tile, q);
          for (int64_t r = 0; r < 16; ++r)
            for (int64_t c = 0; c < 32; ++c)
              bad += at(to, r * 32 + c) != at(o, (e * n + rt * 16 + r) * kb + ct * 32 + c);
        }
    EXPECT_EQ(bad, 0);
  }
}

// ---- Humming -----------------------------------------------------------------------------------

// The payload rewrite: FP4 e2m1 code scaled by 2^-delta, rounded to the nearest code with ties
// away from zero; -0 becomes +0 at every delta.
TEST(HummingPreprocess, RewriteTableHandChecked) {
  using kernels::cpu::humming_rewrite_code;
  for (int c = 0; c < 16; ++c) EXPECT_EQ(humming_rewrite_code(0, c), c == 8 ? 0 : c) << c;
  EXPECT_EQ(humming_rewrite_code(1, 2), 1);   // 1.0 -> 0.5
  EXPECT_EQ(humming_rewrite_code(1, 3), 2);   // 1.5 -> 0.75, a tie -> 1.0
  EXPECT_EQ(humming_rewrite_code(1, 1), 1);   // 0.5 -> 0.25, a tie -> 0.5
  EXPECT_EQ(humming_rewrite_code(1, 9), 9);   // -0.5 -> -0.25 -> -0.5
  EXPECT_EQ(humming_rewrite_code(1, 7), 5);   // 6 -> 3
  EXPECT_EQ(humming_rewrite_code(2, 7), 3);   // 6 -> 1.5
  EXPECT_EQ(humming_rewrite_code(2, 1), 0);   // 0.5 -> 0.125 -> 0
  EXPECT_EQ(humming_rewrite_code(9, 15), 8);  // -6 -> -0.0117 -> -0
  EXPECT_EQ(humming_rewrite_code(3, 6), 1);   // 4 -> 0.5
  // Delta 128: the scale pattern 0x3F800000 - (128 << 23) wraps to -inf. Code 0 times it is
  // NaN, taken as the x86 default NaN 0xFFC00000 on every host: its kept bits are sign and
  // (e, m) = 7, code 15. A positive code gives -inf (0xFF800000: code 8 | 6), a negative one
  // +inf (code 6). Delta 127 makes the scale +0: code 0.
  EXPECT_EQ(humming_rewrite_code(128, 0), 15);
  EXPECT_EQ(humming_rewrite_code(128, 8), 15);
  EXPECT_EQ(humming_rewrite_code(128, 2), 14);
  EXPECT_EQ(humming_rewrite_code(128, 10), 6);
  EXPECT_EQ(humming_rewrite_code(127, 7), 0);
}

// The shared steps (kernels/moe_weight_prep_rules.h, used by the CPU reference and the CUDA
// kernels) against the formulas they implement, over every input they can get.
TEST(HummingPreprocess, SharedStepsMatchTheirFormulas) {
  using namespace kernels;
  int64_t bad = 0;
  for (int hi = 0; hi < 256; ++hi) {
    for (int lo = 0; lo <= hi; ++lo) {
      for (int mr = 0; mr <= 11; ++mr) bad += humming_low(hi, lo, mr) != hi - std::min(hi - lo, mr);
    }
  }
  for (int s = 0; s < 256; ++s) {
    for (int lo_new = 0; lo_new < 256; ++lo_new) {
      const int clamped = std::max(s, lo_new);
      bad += humming_delta(s, lo_new) != clamped - s;
      bad += humming_offset(s, lo_new) != ((clamped - lo_new + 1) & 0x0F);
    }
  }
  EXPECT_EQ(bad, 0);
  // The residual built on the bits is exp2f(lo_new - 127) * 0.5f, bit for bit (subnormal at 0
  // and 1, +inf at 255).
  for (int lo_new = 0; lo_new < 256; ++lo_new) {
    const float want = std::exp2(static_cast<float>(lo_new) - 127.0f) * 0.5f;
    const float got = humming_residual(lo_new);
    EXPECT_EQ(std::memcmp(&want, &got, 4), 0) << lo_new << ": " << want << " vs " << got;
  }
  EXPECT_TRUE(std::isinf(humming_residual(255)));
  EXPECT_EQ(humming_residual(0), std::ldexp(1.0f, -128));
  // The table is humming_rewrite_code; a byte's two nibbles go through the same row.
  const uint8_t* table = cpu::humming_rewrite_table();
  for (int d = 0; d < kHummingTableRows; ++d) {
    for (int c = 0; c < 16; ++c) bad += table[d * 16 + c] != cpu::humming_rewrite_code(d, c);
    for (int b = 0; b < 256; ++b) {
      bad += humming_rewrite_byte(table + d * 16, static_cast<uint8_t>(b)) !=
             (cpu::humming_rewrite_code(d, b & 15) | (cpu::humming_rewrite_code(d, b >> 4) << 4));
    }
  }
  EXPECT_EQ(bad, 0);
}

// One expert, 64 rows, K = 128 (4 scale blocks a row): every E8M0 scale 120 but [0, 0] = 100.
// Range 20 clamps to 11: the new low end is 109, block [0, 0] is raised by delta 9 and its
// payload divided by 2^9; offsets are (clamped - 109 + 1) & 15; residual 2^(109 - 127) / 2.
TEST(HummingPreprocess, ClampHandChecked) {
  Tensor s = Tensor::full({1, 64, 4}, 120.0, DType::kFloat32).to(DType::kUInt8);
  s.data<uint8_t>()[0] = 100;
  Tensor w = Tensor::full({1, 64, 64}, 0x72, DType::kFloat32).to(DType::kUInt8);  // 1.0, 6.0
  w.data<uint8_t>()[15] = 0x7F;  // element 30 (block 0): -6; element 31: 6
  auto [pw, off, res] = preprocess_moe_weights_for_sm90_mixed_gemm_humming(w, s, 11, false);
  ASSERT_EQ(pw.shape(), Shape({1, 64, 64}));
  ASSERT_EQ(off.shape(), Shape({1, 64, 4}));
  EXPECT_EQ(at(off, 0), 1);
  EXPECT_EQ(at(off, 1), 12);
  EXPECT_EQ(at(off, 4 * 63 + 3), 12);
  EXPECT_EQ(res.data<float>()[0], std::ldexp(1.0f, 109 - 127 - 1));
  // Block [0, 0] (bytes 0..15 of row 0): 1.0 * 2^-9 and 6 * 2^-9 round to +0, -6 * 2^-9 to -0
  // (code 8, the low nibble of byte 15).
  EXPECT_EQ(at(pw, 0), 0x00);
  EXPECT_EQ(at(pw, 15), 0x08);
  EXPECT_EQ(at(pw, 16), 0x72);  // block 1 untouched
  EXPECT_EQ(at(pw, 64), 0x72);  // row 1 untouched
  // max_range 0: every scale is raised to the maximum 120.
  auto [pw3, off3, res3] = preprocess_moe_weights_for_sm90_mixed_gemm_humming(w, s, 0, false);
  EXPECT_EQ(at(off3, 0), 1);  // offsets 1, residual 2^(120 - 127) / 2
  EXPECT_EQ(at(off3, 5), 1);
  EXPECT_EQ(res3.data<float>()[0], std::ldexp(1.0f, 120 - 127 - 1));
  EXPECT_EQ(at(pw3, 16), 0x72);
}

// interleave=True is the logical result put through the "fp4_fp8" weight interleave and the
// uint8 group-32 scale fold; residual is the same.
TEST(HummingPreprocess, InterleavedIsLogicalThenInterleaved) {
  Tensor w = bytes({2, 64, 64}, 5);
  Tensor s = bytes({2, 64, 4}, 6);
  auto [lw, lo, lr] = preprocess_moe_weights_for_sm90_mixed_gemm_humming(w, s, 11, false);
  auto [iw, io, ir] = preprocess_moe_weights_for_sm90_mixed_gemm_humming(w, s);
  EXPECT_TRUE(all_close(iw, interleave_moe_weights_for_sm90_mixed_gemm(lw, "fp4_fp8"), {0, 0}));
  EXPECT_TRUE(all_close(io, interleave_moe_scales_for_sm90_mixed_gemm(lo, 32), {0, 0}));
  EXPECT_TRUE(all_close(ir, lr, {0, 0}));
  // Per expert: each expert's clamp uses its own range.
  for (int64_t e = 0; e < 2; ++e) {
    int hi = 0, lo_s = 255;
    for (int64_t i = 0; i < 256; ++i) {
      hi = std::max<int>(hi, at(s, e * 256 + i));
      lo_s = std::min<int>(lo_s, at(s, e * 256 + i));
    }
    const int lo_new = hi - std::min(hi - lo_s, 11);
    EXPECT_EQ(lr.data<float>()[e], std::exp2(static_cast<float>(lo_new) - 127.0f) * 0.5f);
  }
}

TEST(MoeWeightPrep, BadInput) {
  const char* si = "interleave_moe_scales_for_sm90_mixed_gemm";
  EXPECT_FI_ERROR(interleave_moe_scales_for_sm90_mixed_gemm(bytes({64, 4}, 1)), si, "scales");
  EXPECT_FI_ERROR(interleave_moe_scales_for_sm90_mixed_gemm(bytes({1, 32, 4}, 1)), si, "scales");
  EXPECT_FI_ERROR(interleave_moe_scales_for_sm90_mixed_gemm(bytes({1, 64, 3}, 1)), si, "scales");
  EXPECT_FI_ERROR(interleave_moe_scales_for_sm90_mixed_gemm(bytes({1, 64, 4}, 1), 48), si,
                  "group_size");
  EXPECT_FI_ERROR(
      interleave_moe_scales_for_sm90_mixed_gemm(Tensor::zeros({1, 64, 8}, DType::kFloat32), 16), si,
      "group_size");
  const char* wi = "interleave_moe_weights_for_sm90_mixed_gemm";
  EXPECT_FI_ERROR(interleave_moe_weights_for_sm90_mixed_gemm(bytes({16, 32}, 1)), wi, "weight");
  EXPECT_FI_ERROR(interleave_moe_weights_for_sm90_mixed_gemm(bytes({1, 8, 32}, 1)), wi, "weight");
  EXPECT_FI_ERROR(interleave_moe_weights_for_sm90_mixed_gemm(bytes({1, 16, 16}, 1)), wi, "weight");
  EXPECT_FI_ERROR(
      interleave_moe_weights_for_sm90_mixed_gemm(Tensor::zeros({1, 16, 32}, DType::kInt8)), wi,
      "weight");
  EXPECT_FI_ERROR(interleave_moe_weights_for_sm90_mixed_gemm(bytes({1, 16, 32}, 1), "nvfp4"), wi,
                  "quant_type");
  const char* hu = "preprocess_moe_weights_for_sm90_mixed_gemm_humming";
  EXPECT_FI_ERROR(
      preprocess_moe_weights_for_sm90_mixed_gemm_humming(bytes({64, 64}, 1), bytes({1, 64, 4}, 2)),
      hu, "weight");
  EXPECT_FI_ERROR(preprocess_moe_weights_for_sm90_mixed_gemm_humming(bytes({1, 64, 8}, 1),
                                                                     bytes({1, 64, 1}, 2)),
                  hu, "weight");  // K = 16
  EXPECT_FI_ERROR(preprocess_moe_weights_for_sm90_mixed_gemm_humming(bytes({1, 64, 64}, 1),
                                                                     bytes({1, 64, 2}, 2)),
                  hu, "raw_scale");
  EXPECT_FI_ERROR(preprocess_moe_weights_for_sm90_mixed_gemm_humming(
                      bytes({1, 64, 64}, 1), Tensor::zeros({1, 64, 4}, DType::kInt32)),
                  hu, "raw_scale");
  EXPECT_FI_ERROR(preprocess_moe_weights_for_sm90_mixed_gemm_humming(bytes({1, 64, 64}, 1),
                                                                     bytes({1, 64, 4}, 2), 12),
                  hu, "max_range");
  // An expert without scales has no range to clamp.
  EXPECT_FI_ERROR(preprocess_moe_weights_for_sm90_mixed_gemm_humming(
                      bytes({1, 0, 64}, 1), bytes({1, 0, 4}, 2), 11, false),
                  hu, "weight");
  EXPECT_FI_ERROR(preprocess_moe_weights_for_sm90_mixed_gemm_humming(
                      bytes({1, 64, 0}, 1), bytes({1, 64, 0}, 2), 11, false),
                  hu, "weight");
  // interleave=True needs the layouts' multiples: 32 rows cannot fold into M64 scale blocks.
  EXPECT_FI_ERROR(preprocess_moe_weights_for_sm90_mixed_gemm_humming(bytes({1, 32, 64}, 1),
                                                                     bytes({1, 32, 4}, 2)),
                  hu, "raw_scale");
}

TEST(MoeWeightPrep, DeclsBackendsAndRecordReplay) {
  for (const char* name :
       {"interleave_moe_scales_for_sm90_mixed_gemm", "interleave_moe_weights_for_sm90_mixed_gemm",
        "preprocess_moe_weights_for_sm90_mixed_gemm_humming"}) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, "flashinfer.fused_moe.prepare");
    EXPECT_TRUE(op_has_backend(name, DeviceType::kCPU)) << name;
    // All three have CUDA kernels in a CUDA build.
    EXPECT_EQ(op_has_backend(name, DeviceType::kCUDA), cuda_compiled()) << name;
  }
  EXPECT_EQ(
      OpRegistry::global().find("preprocess_moe_weights_for_sm90_mixed_gemm_humming")->signature(),
      "(weight, raw_scale, max_range=11, *, interleave=True)");
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)interleave_moe_scales_for_sm90_mixed_gemm(bytes({2, 64, 8}, 1));
    (void)interleave_moe_weights_for_sm90_mixed_gemm(bytes({2, 16, 64}, 2), "int4");
    (void)preprocess_moe_weights_for_sm90_mixed_gemm_humming(bytes({2, 64, 64}, 3),
                                                             bytes({2, 64, 4}, 4), 7);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);
  for (const auto& c : calls) EXPECT_TRUE(replays_identically(c)) << c.name;
}

// ---- CUDA ------------------------------------------------------------------------------------

// Same shape, dtype and bytes (a float compared by its bits, so inf and -0 count).
::testing::AssertionResult same_bytes(const Tensor& got, const Tensor& want) {
  const Tensor g = got.to(Device::cpu()).contiguous(), w = want.contiguous();
  if (g.shape() != w.shape() || g.dtype() != w.dtype()) {
    return ::testing::AssertionFailure()
           << "shape/dtype " << shape_to_string(g.shape()) << " vs " << shape_to_string(w.shape());
  }
  const auto* a = static_cast<const uint8_t*>(g.data_ptr());
  const auto* b = static_cast<const uint8_t*>(w.data_ptr());
  const auto n = static_cast<int64_t>(g.numel() * static_cast<int64_t>(g.element_size()));
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (a[i] != b[i] && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " bytes differ, first at " << first;
}

// The two interleaves' CUDA kernels, bit-exact with the CPU (skipped without a GPU).
TEST(MoeWeightPrepCuda, InterleavesBitExactWithCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  for (const char* q : {"fp4", "int4", "fp4_fp8"}) {
    SCOPED_TRACE(q);
    const Tensor w = bytes({3, 48, 128}, 21);
    EXPECT_TRUE(same_bytes(interleave_moe_weights_for_sm90_mixed_gemm(w.to(d), q),
                           interleave_moe_weights_for_sm90_mixed_gemm(w, q)));
  }
  for (int64_t group : {32, 64, 128}) {
    SCOPED_TRACE(group);
    const Tensor s = bytes({2, 128, 2 * 128 / group}, 22);
    EXPECT_TRUE(same_bytes(interleave_moe_scales_for_sm90_mixed_gemm(s.to(d), group),
                           interleave_moe_scales_for_sm90_mixed_gemm(s, group)));
  }
}

// The Humming preparation's CUDA kernels, bit-exact with the CPU (skipped without a GPU):
// experts whose scales span everything (deltas up to 255, the wrapped table rows included), all
// 255 (residual +inf), all 0 and 1 (subnormal residual) and a serving-like 100..140; every
// max_range; both layouts; a payload at an odd address (the kernel's byte path).
TEST(HummingPreprocessCuda, BitExactWithCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  const int64_t E = 4, rows = 64, k = 256, kg = k / 32;
  const Tensor w = bytes({E, rows, k / 2}, 31);
  Tensor s = bytes({E, rows, kg}, 32);
  auto* sp = s.data<uint8_t>();
  for (int64_t i = 0; i < rows * kg; ++i) {
    sp[1 * rows * kg + i] = 255;
    sp[2 * rows * kg + i] = static_cast<uint8_t>(sp[2 * rows * kg + i] & 1);
    sp[3 * rows * kg + i] = static_cast<uint8_t>(100 + sp[3 * rows * kg + i] % 41);
  }
  sp[0] = 0;  // expert 0 spans 0..255
  sp[1] = 255;
  const Tensor wd = w.to(d), sd = s.to(d);
  for (int64_t max_range = 0; max_range <= 11; ++max_range) {
    for (bool interleave : {false, true}) {
      SCOPED_TRACE("max_range " + std::to_string(max_range) + (interleave ? " interleaved" : ""));
      auto [cw, co, cr] =
          preprocess_moe_weights_for_sm90_mixed_gemm_humming(w, s, max_range, interleave);
      auto [gw, go, gr] =
          preprocess_moe_weights_for_sm90_mixed_gemm_humming(wd, sd, max_range, interleave);
      EXPECT_TRUE(same_bytes(gw, cw));
      EXPECT_TRUE(same_bytes(go, co));
      EXPECT_TRUE(same_bytes(gr, cr));
    }
  }
  // The payload one byte into its buffer: not 16-byte aligned.
  const Tensor flat = bytes({E * rows * (k / 2) + 1}, 33).to(d);
  const Tensor odd = flat.slice(0, 1, E * rows * (k / 2) + 1).reshape({E, rows, k / 2});
  ASSERT_NE(reinterpret_cast<uintptr_t>(odd.data_ptr()) % 16, 0u);
  auto [cw, co, cr] =
      preprocess_moe_weights_for_sm90_mixed_gemm_humming(odd.to(Device::cpu()), s, 11, false);
  auto [gw, go, gr] = preprocess_moe_weights_for_sm90_mixed_gemm_humming(odd, sd, 11, false);
  EXPECT_TRUE(same_bytes(gw, cw));
  EXPECT_TRUE(same_bytes(go, co));
  EXPECT_TRUE(same_bytes(gr, cr));
}

// Calls as vLLM / SGLang make them (positional weight and quant_type, scales alone; SGLang's
// Humming helper with interleave by keyword), recorded in upstream's dump format by a Python
// script with torch, which computes the expected outputs on its own: the scale fold with
// upstream's reshape/permute, the weight interleave from upstream's mask/shift list, the Humming
// clamp and table with Python floats. All replay here and pass.
TEST(MoeWeightPrepUpstreamDumps, EngineStyleDumpsReplay) {
  // save() and record(): the shared writer (tests/util/upstream_dump_py.h).
  const std::string body = R"PY(
torch.manual_seed(0)
PREP = "flashinfer.fused_moe.prepare"

def fold_scales(s, group=32):
    e, rows, kgs = s.shape
    g = 128 // group
    cols = 128 // (s.element_size() * 8)
    ms = cols // g
    fm = 64 // ms
    return (s.reshape(e, rows // 64, ms, fm, kgs // g, g).permute(0, 1, 4, 3, 2, 5)
            .contiguous().reshape(e, rows // 64, kgs // g, fm, cols))

# upstream's fp4 bit moves as (mask, shift) pairs; shift > 0 is a left shift
FP4_MOVES = [(0x80, 24), (0x70, 18), (0x08, 12), (0x07, 6), (0x8000, 13), (0x7000, 7),
             (0x0800, 1), (0x0700, -5), (0x800000, 2), (0x700000, -4), (0x080000, -10),
             (0x070000, -16), (0x80000000, -1), (0x10000000, 1), (0x60000000, -3),
             (0x08000000, -13), (0x01000000, -11), (0x06000000, -15)]
def sign_moves(v):
    out = v & 0x77777777
    for j in range(8):
        to = 2 * j + 1 if j < 4 else 2 * (j - 4)
        out |= ((v >> (4 * j + 3)) & 1) << (4 * to + 3)
    return out

def interleave(w, qt):
    e_n, n, kb = w.shape
    k = kb * 2
    src = w.tolist()
    out = [[[0] * kb for _ in range(n)] for _ in range(e_n)]
    for e in range(e_n):
        S, D = src[e], out[e]
        for b in range(n // 2):
            r = b // 8 * 16 + b % 8
            for q in range(k // 64):
                for lane in range(16):
                    if qt == "fp4":
                        mma = lane // 4
                        dr = r + (mma % 2) * 8
                        c = q * 32 + mma * 8 + lane % 4
                        dc = q * 32 + lane // 8 * 16 + lane % 4 * 4
                        raw = S[r][c] | S[r + 8][c] << 8 | S[r][c + 4] << 16 | S[r + 8][c + 4] << 24
                        v = 0
                        for m, sh in FP4_MOVES:
                            v |= ((raw & m) << sh) if sh >= 0 else ((raw & m) >> -sh)
                        for i in range(4):
                            D[dr][dc + i] = (v >> (8 * i)) & 0xFF
                    else:
                        dr = r + (lane % 8) // 4 * 8
                        c = q * 16 + lane
                        dc = q * 16 + lane // 8 * 8 + lane % 4 * 2
                        a = S[r][2 * c] | S[r][2 * c + 1] << 8
                        bb = S[r + 8][2 * c] | S[r + 8][2 * c + 1] << 8
                        if qt == "fp4_fp8":
                            v = sign_moves(a | bb << 16)
                            a, bb = v & 0xFFFF, v >> 16
                        D[dr][2 * dc], D[dr][2 * dc + 1] = a & 0xFF, a >> 8
                        D[dr][2 * dc + 2], D[dr][2 * dc + 3] = bb & 0xFF, bb >> 8
    return torch.tensor(out, dtype=torch.uint8)

def fbits(b): return struct.unpack("f", struct.pack("I", b & 0xFFFFFFFF))[0]
def bitsf(v): return struct.unpack("I", struct.pack("f", v))[0]
def rewrite(delta, code):
    code = 0 if code == 8 else code
    if delta == 0: return code
    v = fbits(((code & 8) << 28) | ((code & 7) << 22)) * fbits(0x3F800000 - (delta << 23))
    vb = bitsf(v)
    rz, ru = vb & 0x81C00000, (vb + 0x00200000) & 0x81C00000
    r = ru if abs(v - fbits(rz)) >= abs(v - fbits(ru)) else rz
    return ((r & 0x80000000) >> 28) | ((r & 0x01C00000) >> 22)

def humming(w, s, max_range):
    e_n = s.shape[0]
    sv = s.reshape(e_n, -1).long()
    hi = sv.max(1, keepdim=True).values
    lo = sv.min(1, keepdim=True).values
    lo_new = hi - torch.clamp(hi - lo, max=max_range)
    cl = torch.maximum(sv, lo_new)
    delta = (cl - sv).reshape(s.shape)
    off = ((cl - lo_new + 1) & 0xF).to(torch.uint8).reshape(s.shape)
    res = torch.exp2(lo_new.squeeze(1).to(torch.float32) - 127.0) * 0.5
    lut = [[rewrite(dl, c) for c in range(16)] for dl in range(256)]
    wl = w.tolist()
    dl = delta.tolist()
    out = [[[lut[dl[e][r][i * 2 // 32]][b & 0xF] | lut[dl[e][r][i * 2 // 32]][b >> 4] << 4
             for i, b in enumerate(row)] for r, row in enumerate(wl[e])] for e in range(e_n)]
    return torch.tensor(out, dtype=torch.uint8), off, res

E = 8
# 1. interleave_moe_scales_for_sm90_mixed_gemm(w1_scale): uint8 E8M0, [E, 2I, H / 32]
s1 = torch.randint(0, 256, (E, 128, 8), dtype=torch.uint8)
record("interleave_moe_scales_for_sm90_mixed_gemm", PREP, {"arg_0": s1}, {},
       fold_scales(s1), function_signature="(scales, group_size=32)")
# 2. W4A8 bf16 scales with group_size=128 by keyword
s2 = torch.randn(E, 64, 2).to(torch.bfloat16)
record("interleave_moe_scales_for_sm90_mixed_gemm", PREP, {"arg_0": s2}, {"kwarg_group_size": 128},
       fold_scales(s2, 128), function_signature="(scales, group_size=32)")
# 3-5. interleave_moe_weights_for_sm90_mixed_gemm(w.view(torch.uint8), "fp4" / "int4" / "fp4_fp8")
for qt in ["fp4", "int4", "fp4_fp8"]:
    w = torch.randint(0, 256, (E, 32, 64), dtype=torch.uint8)
    record("interleave_moe_weights_for_sm90_mixed_gemm", PREP, {"arg_0": w}, {"arg_1": qt},
           interleave(w, qt), function_signature="(weight, quant_type='fp4')")
# 6. preprocess_moe_weights_for_sm90_mixed_gemm_humming(w, raw_scale, interleave=True): a tuple
w = torch.randint(0, 256, (E, 64, 64), dtype=torch.uint8)
s = torch.randint(100, 140, (E, 64, 4), dtype=torch.uint8)
pw, off, res = humming(w, s, 11)
record("preprocess_moe_weights_for_sm90_mixed_gemm_humming", PREP, {"arg_0": w, "arg_1": s},
       {"kwarg_interleave": True},
       [interleave(pw, "fp4_fp8"), fold_scales(off), res],  # the tuple: result_0..2
       function_signature="(weight, raw_scale, max_range=11, *, interleave=True)")
# 7. the logical form with a narrower range, by keyword
pw, off, res = humming(w, s, 4)
record("preprocess_moe_weights_for_sm90_mixed_gemm_humming", PREP, {"kwarg_weight": w, "kwarg_raw_scale": s},
       {"kwarg_max_range": 4, "kwarg_interleave": False},
       [pw, off, res], function_signature="(weight, raw_scale, max_range=11, *, interleave=True)")
)PY";
  if (!run_upstream_dump_script("fi_moe_prep", body, 7)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

}  // namespace
}  // namespace flashinfer::testing
