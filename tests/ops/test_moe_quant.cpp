// trtllm MoE weight layouts (shuffled rows, BlockMajorK) and the FP8 trtllm MoE ops
// (trtllm_fp8_block_scale_moe / _routed_, trtllm_fp8_per_tensor_scale_moe / _routed_):
// hand-checked row permutations, layouts against plain weights (bit-exact), fp64 formulas,
// bad input naming the argument, and record/replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "api/moe_layout.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/moe_fp8_test_util.h"
#include "ops/op_test_util.h"
#include "util/moe_weight_prep.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
#include "kernels/cuda/moe_cuda.h"
#endif

namespace flashinfer::testing {
namespace {

// ---- upstream's weight preparation, written out independently for the tests ---------------
// shuffle_matrix_a's row maps (srcToDstBlk16RowMap / srcToDstBlk32RowMap): row r of a block
// lands at map[r].
const std::vector<int64_t> kMap16 = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};
const std::vector<int64_t> kMap32 = {0, 8,  16, 24, 1, 9,  17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
                                     4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31};

// The plain row that stored (prepared) row i holds, following the upstream procedure:
// permute0 = reorder_rows_for_gated_act_gemm indices (or identity), permute1 = shuffle indices,
// prepared = plain[permute0[permute1]].
std::vector<int64_t> prepared_rows(int64_t m, int64_t tile, bool interleave) {
  const std::vector<int64_t>& map = tile % 128 == 0 ? kMap32 : kMap16;
  const int64_t b = static_cast<int64_t>(map.size());
  std::vector<int64_t> permute0(static_cast<size_t>(m)), permute1(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    permute0[static_cast<size_t>(i)] = !interleave ? i : (i % 2 == 0 ? i / 2 : (m + 1) / 2 + i / 2);
  }
  for (int64_t old_row = 0; old_row < m; ++old_row) {
    const int64_t new_row = old_row / b * b + map[static_cast<size_t>(old_row % b)];
    permute1[static_cast<size_t>(new_row)] = old_row;
  }
  std::vector<int64_t> out(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    out[static_cast<size_t>(i)] = permute0[static_cast<size_t>(permute1[static_cast<size_t>(i)])];
  }
  return out;
}

// Prepares [E, m, k] plain weights: rows as above, then (block_bytes > 0) convert_to_block_layout
// over the bytes: [E, k / bk, m, bk] with bk = block_bytes / element size.
Tensor prepare(const Tensor& plain, int64_t tile, bool shuffle, bool interleave,
               int64_t block_bytes) {
  const int64_t E = plain.size(0), m = plain.size(1), k = plain.size(2);
  const size_t es = plain.element_size();
  std::vector<int64_t> rows(static_cast<size_t>(m));
  if (shuffle) {
    rows = prepared_rows(m, tile, interleave);
  } else {
    for (int64_t i = 0; i < m; ++i) rows[static_cast<size_t>(i)] = i;
  }
  const int64_t bk = block_bytes > 0 ? block_bytes / static_cast<int64_t>(es) : k;
  Shape shape = block_bytes > 0 ? Shape({E, k / bk, m, bk}) : Shape({E, m, k});
  Tensor out = Tensor::empty(shape, plain.dtype());
  const auto* src = static_cast<const uint8_t*>(plain.data_ptr());
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < k; ++c) {
        const int64_t from = (e * m + rows[static_cast<size_t>(i)]) * k + c;
        const int64_t to =
            block_bytes > 0 ? ((e * (k / bk) + c / bk) * m + i) * bk + c % bk : (e * m + i) * k + c;
        std::memcpy(dst + static_cast<size_t>(to) * es, src + static_cast<size_t>(from) * es, es);
      }
    }
  }
  return out;
}

TEST(MoeWeightLayout, ShuffledRowSourceHandChecked) {
  // epilogue_tile_m 64: blocks of 16 rows; plain row r goes to (r % 2) * 8 + r / 2.
  const auto s16 = api::moe_shuffled_row_source(32, 64, false);
  EXPECT_EQ(s16[0], 0);
  EXPECT_EQ(s16[8], 1);
  EXPECT_EQ(s16[1], 2);
  EXPECT_EQ(s16[9], 3);
  EXPECT_EQ(s16[15], 15);
  EXPECT_EQ(s16[16 + 8], 17);
  // epilogue_tile_m 128: blocks of 32 rows; (r % 4) * 8 + r / 4; with the gated interleave the
  // interleaved row j is up row j / 2 (even j) or gate row 16 + j / 2 (odd j) of 32 rows.
  const auto s32 = api::moe_shuffled_row_source(32, 128, true);
  EXPECT_EQ(s32[0], 0);   // interleaved row 0: up 0
  EXPECT_EQ(s32[8], 16);  // interleaved row 1: gate 0
  EXPECT_EQ(s32[16], 1);  // interleaved row 2: up 1
  EXPECT_EQ(s32[1], 2);   // interleaved row 4: up 2
  EXPECT_EQ(s32[31], 31);
  for (int64_t tile : {int64_t{64}, int64_t{128}}) {
    for (bool inter : {false, true}) {
      EXPECT_EQ(api::moe_shuffled_row_source(64, tile, inter), prepared_rows(64, tile, inter));
    }
  }
}

// The index the CPU reference turns stored weights back with and the CUDA kernels read them
// through (kernels/moe_layout_rules.h) against upstream's preparation written out above: for
// every element of a plain [E, mn, k] matrix whose values are their own flat indices,
// moe_weight_offset(moe_stored_row(j)) is where prepare() put it, every stored offset is hit
// exactly once (a bijection), and the stored row inverts moe_shuffled_row_source.
TEST(MoeWeightLayout, StoredIndexIsUpstreamsPermutation) {
  const int64_t E = 2, k = 64;
  for (int64_t mn : {int64_t{32}, int64_t{64}, int64_t{96}}) {
    for (int64_t tile : {int64_t{64}, int64_t{128}}) {
      for (int shuffle = 0; shuffle < 3; ++shuffle) {  // plain, shuffled, shuffled + interleave
        for (int64_t bk : {int64_t{0}, int64_t{8}, int64_t{32}, int64_t{64}}) {
          SCOPED_TRACE("mn " + std::to_string(mn) + " tile " + std::to_string(tile) + " shuffle " +
                       std::to_string(shuffle) + " bk " + std::to_string(bk));
          std::vector<double> idx(static_cast<size_t>(E * mn * k));
          for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<double>(i);
          const Tensor plain = Tensor::from_vector(idx, {E, mn, k}, DType::kInt32);
          const Tensor stored = prepare(plain, tile, shuffle > 0, shuffle == 2, bk * 4);
          api::MoeWeightFormat f;
          f.shuffled = shuffle > 0;
          f.gated_interleave = shuffle == 2;
          f.epilogue_tile_m = tile;
          f.layout = bk == 0 ? WeightLayout::MajorK : WeightLayout::BlockMajorK;
          const kernels::MoeWeightIndex ix =
              api::moe_stored_weight_index(stored, E, mn, k, f, "test", "w");
          const auto* sv = static_cast<const int32_t*>(stored.data_ptr());
          std::vector<int> hits(idx.size(), 0);
          int64_t wrong = 0;
          for (int64_t e = 0; e < E; ++e) {
            for (int64_t j = 0; j < mn; ++j) {
              const int64_t row = kernels::moe_stored_row(ix, mn, j);
              ASSERT_GE(row, 0);
              ASSERT_LT(row, mn);
              for (int64_t c = 0; c < k; ++c) {
                const int64_t o = kernels::moe_weight_offset(ix, mn, k, e, row, c);
                ASSERT_GE(o, 0);
                ASSERT_LT(o, E * mn * k);
                ++hits[static_cast<size_t>(o)];
                wrong += sv[o] != (e * mn + j) * k + c;
              }
            }
          }
          EXPECT_EQ(wrong, 0);
          EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), static_cast<long>(hits.size()));
          if (shuffle > 0) {
            const auto src = api::moe_shuffled_row_source(mn, tile, shuffle == 2);
            for (int64_t j = 0; j < mn; ++j) {
              EXPECT_EQ(src[static_cast<size_t>(kernels::moe_stored_row(ix, mn, j))], j);
            }
          }
          // The CPU path through that index gives the plain matrix back, bit for bit.
          const Tensor back = api::moe_plain_weights(stored, E, mn, k, f, "test", "w");
          EXPECT_TRUE(all_close(back, plain, {0, 0}));
        }
      }
    }
  }
}

// trtllm_bf16_moe on upstream's default layouts (shuffled, BlockMajorK with 128-byte blocks)
// gives bit-for-bit the result of the plain weights.
TEST(MoeWeightLayout, Bf16ShuffledLayoutsMatchPlain) {
  const int64_t T = 9, E = 8, H = 128, I = 64, K = 2;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 1, -3.0, 3.0);
  Tensor x = rand_tensor({T, H}, DType::kBFloat16, 2, -1.0, 1.0);
  for (int64_t act : {int64_t{3}, int64_t{6}}) {
    SCOPED_TRACE("activation " + std::to_string(act));
    const int64_t N1 = act == 3 ? 2 * I : I;
    Tensor w1 = rand_tensor({E, N1, H}, DType::kBFloat16, 3, -0.3, 0.3);
    Tensor w2 = rand_tensor({E, H, I}, DType::kBFloat16, 4, -0.3, 0.3);
    auto run = [&](const Tensor& a, const Tensor& b, bool shuffled, WeightLayout layout) {
      return trtllm_bf16_moe(logits, std::nullopt, x, a, b, E, K, std::nullopt, std::nullopt, I, 0,
                             E, std::nullopt, 1, shuffled, layout, true, true, 8192, act);
    };
    const Tensor ref = run(w1, w2, false, WeightLayout::MajorK);
    const bool gated = act == 3;
    const Tensor a = run(prepare(w1, 128, true, gated, 128), prepare(w2, 128, true, false, 128),
                         true, WeightLayout::BlockMajorK);
    EXPECT_TRUE(all_close(a, ref, {0, 0}));
    const Tensor b = run(prepare(w1, 128, true, gated, 0), prepare(w2, 128, true, false, 0), true,
                         WeightLayout::MajorK);
    EXPECT_TRUE(all_close(b, ref, {0, 0}));
    const Tensor c = run(prepare(w1, 128, false, false, 128), prepare(w2, 128, false, false, 128),
                         false, WeightLayout::BlockMajorK);
    EXPECT_TRUE(all_close(c, ref, {0, 0}));
  }
  // Rows not a multiple of the 32-row shuffle block, and a wrong block shape, are named.
  Tensor w1 = rand_tensor({E, 16, H}, DType::kBFloat16, 5);
  Tensor w2 = rand_tensor({E, H, 8}, DType::kBFloat16, 6);
  EXPECT_FI_ERROR(
      (void)trtllm_bf16_moe(logits, std::nullopt, x, w1, w2, E, K, std::nullopt, std::nullopt, 8, 0,
                            E, std::nullopt, 1, true, WeightLayout::MajorK),
      "trtllm_bf16_moe", "gemm1_weights");
  EXPECT_FI_ERROR((void)trtllm_bf16_moe(logits, std::nullopt, x, w1.view({E, 2, 16, 64}),
                                        Tensor::zeros({E, 2, H, 8}, DType::kBFloat16), E, K,
                                        std::nullopt, std::nullopt, 8, 0, E, std::nullopt, 1, false,
                                        WeightLayout::BlockMajorK),
                  "trtllm_bf16_moe", "gemm2_weights");
}

// ---- FP8 ------------------------------------------------------------------------------------

Tensor fp8(const Shape& shape, uint64_t seed, double lo = -3.0, double hi = 3.0) {
  return rand_tensor(shape, DType::kFloat32, seed, lo, hi).to(DType::kFloat8E4M3FN);
}

using moe_fp8::bf16;
using moe_fp8::silu;

// The largest |value|: the formula tests check their outputs are well above the bf16 atol, so
// a wrong result cannot hide under it.
double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

struct Fp8Case {
  int64_t T = 6, E = 8, K = 2, H = 256, I = 128, local = 8, offset = 0;
};

// (ids, weights) for every token: distinct experts (t + 3k) mod E, weights 0.7 / 0.3.
MoeTopkIds pair_routing(const Fp8Case& c) {
  std::vector<double> ids, w;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t k = 0; k < c.K; ++k) {
      ids.push_back(static_cast<double>((t + 3 * k) % c.E));
      w.push_back(k == 0 ? 0.7 : 0.3);
    }
  }
  return MoeTopkIds(Tensor::from_vector(ids, {c.T, c.K}, DType::kInt32),
                    Tensor::from_vector(w, {c.T, c.K}, DType::kFloat32));
}

TEST(TrtllmFp8BlockScaleMoe, MatchesFormula) {
  Fp8Case c;
  for (int64_t offset : {int64_t{0}, int64_t{4}}) {
    c.offset = offset;
    c.local = offset == 0 ? 8 : 4;
    SCOPED_TRACE("offset " + std::to_string(offset));
    const int64_t T = c.T, H = c.H, I = c.I, El = c.local, K = c.K;
    Tensor x = fp8({T, H}, 1);
    Tensor xs = rand_tensor({H / 128, T}, DType::kFloat32, 2, 0.2, 0.4);
    Tensor w1 = fp8({El, 2 * I, H}, 3);
    Tensor s1 = rand_tensor({El, 2 * I / 128, H / 128}, DType::kFloat32, 4, 0.02, 0.04);
    Tensor w2 = fp8({El, H, I}, 5);
    Tensor s2 = rand_tensor({El, H / 128, I / 128}, DType::kFloat32, 6, 0.1, 0.2);
    const MoeTopkIds routing = pair_routing(c);
    const Tensor out = trtllm_fp8_block_scale_routed_moe(routing, std::nullopt, x, xs, w1, s1, w2,
                                                         s2, c.E, K, std::nullopt, std::nullopt, I,
                                                         c.offset, El, std::nullopt);
    const std::vector<double> expect =
        moe_fp8::fp8_block_moe_reference(x, xs, w1, s1, w2, s2, routing, c.offset, El);
    EXPECT_GT(max_abs(expect), 0.1);
    EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
    // Upstream's shuffled layouts (epilogue_tile_m 64, no interleave) give the same bits.
    const Tensor shuffled = trtllm_fp8_block_scale_routed_moe(
        routing, std::nullopt, x, xs, prepare(w1, 64, true, false, 128), s1,
        prepare(w2, 64, true, false, 128), s2, c.E, K, std::nullopt, std::nullopt, I, c.offset, El,
        std::nullopt, 0, true, WeightLayout::BlockMajorK);
    EXPECT_TRUE(all_close(shuffled, out, {0, 0}));
  }
}

// Routing from logits equals the routed op fed the same routing (DeepSeekV3 from
// fused_topk_deepseek, whose own tests check the formula).
TEST(TrtllmFp8BlockScaleMoe, RoutingFromLogitsMatchesRouted) {
  const int64_t T = 5, E = 8, H = 128, I = 128, K = 2;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 11, -3.0, 3.0);
  Tensor bias = rand_tensor({E}, DType::kFloat32, 12, -0.3, 0.3);
  Tensor x = fp8({T, H}, 13);
  Tensor xs = rand_tensor({H / 128, T}, DType::kFloat32, 14, 0.2, 0.4);
  Tensor w1 = fp8({E, 2 * I, H}, 15);
  Tensor s1 = rand_tensor({E, 2, 1}, DType::kFloat32, 16, 0.02, 0.04);
  Tensor w2 = fp8({E, H, I}, 17);
  Tensor s2 = rand_tensor({E, 1, 1}, DType::kFloat32, 18, 0.1, 0.2);
  Tensor replay = Tensor::zeros({T, K}, DType::kInt16);
  const Tensor out = trtllm_fp8_block_scale_moe(
      logits, bias, x, xs, w1, s1, w2, s2, E, K, 4, 2, I, 0, E, 2.5, 2, false, WeightLayout::MajorK,
      true, std::nullopt, 8192, Fp8QuantizationType::DeepSeekFp8, std::nullopt, 3, true, replay);
  Tensor vals = Tensor::zeros({T, K}, DType::kFloat32), idx = Tensor::zeros({T, K}, DType::kInt32);
  fused_topk_deepseek(logits, bias, 4, 2, K, 2.5, vals, idx);
  EXPECT_TRUE(all_close(replay.to(DType::kInt32), idx, {0, 0}));
  const Tensor routed = trtllm_fp8_block_scale_routed_moe(
      MoeTopkIds(idx, vals.to(DType::kBFloat16)), std::nullopt, x, xs, w1, s1, w2, s2, E, K, 4, 2,
      I, 0, E, 2.5, 2);  // bf16 weights, as routing from logits keeps them
  EXPECT_TRUE(all_close(out, routed, {0, 0}));
}

// Upstream 0.7.4's valid_hidden_size on DeepSeek FP8 (docs/MOE.md, "Padded dimensions"): the
// layer padded to H 256 (random values in the hidden states', GEMM1's and their scales' extra
// columns; GEMM2 with roundUp(valid_hidden_size, 128) = 128 rows) computes the unpadded layer's
// output bit for bit, plain or in upstream's shuffled BlockMajorK layouts, valid_hidden_size
// wide; a valid intermediate size below intermediate_size is refused (upstream's separate
// activation kernel reads the padded width).
TEST(TrtllmFp8BlockScaleMoe, ValidHiddenSizeComputesTheUnpaddedLayer) {
  const int64_t T = 6, E = 8, K = 2, H = 128, Hp = 256, I = 128;
  Fp8Case c;
  c.T = T;
  const MoeTopkIds routing = pair_routing(c);
  Tensor x = fp8({T, H}, 101), xs = rand_tensor({H / 128, T}, DType::kFloat32, 102, 0.2, 0.4);
  Tensor w1 = fp8({E, 2 * I, H}, 103), w2 = fp8({E, H, I}, 105);
  Tensor s1 = rand_tensor({E, 2, 1}, DType::kFloat32, 104, 0.02, 0.04);
  Tensor s2 = rand_tensor({E, 1, 1}, DType::kFloat32, 106, 0.1, 0.2);
  const Tensor small =
      trtllm_fp8_block_scale_routed_moe(routing, std::nullopt, x, xs, w1, s1, w2, s2, E, K,
                                        std::nullopt, std::nullopt, I, 0, E, std::nullopt);
  auto pad = [](const Tensor& t, int64_t dim, int64_t n, Tensor fill) {
    fill.slice(dim, 0, n).copy_(t);
    return fill;
  };
  const Tensor xp = pad(x, 1, H, fp8({T, Hp}, 107));
  const Tensor xsp = pad(xs, 0, 1, rand_tensor({2, T}, DType::kFloat32, 108, 0.2, 0.4));
  const Tensor w1p = pad(w1, 2, H, fp8({E, 2 * I, Hp}, 109));
  const Tensor s1p = pad(s1, 2, 1, rand_tensor({E, 2, 2}, DType::kFloat32, 110, 0.02, 0.04));
  auto run = [&](const Tensor& a, const Tensor& b, bool shuffled, int64_t vh, int64_t inter = 128,
                 std::optional<int64_t> vi = std::nullopt) {
    return trtllm_fp8_block_scale_routed_moe(
        routing, std::nullopt, xp, xsp, a, s1p, b, s2, E, K, std::nullopt, std::nullopt, inter, 0,
        E, std::nullopt, 0, shuffled, shuffled ? WeightLayout::BlockMajorK : WeightLayout::MajorK,
        true, std::nullopt, std::nullopt, std::nullopt, 8192, Fp8QuantizationType::DeepSeekFp8, 3,
        std::nullopt, std::nullopt, std::nullopt, vh, vi);
  };
  const Tensor got = run(w1p, w2, false, 128);
  ASSERT_EQ(got.shape(), Shape({T, H}));
  EXPECT_EQ(testing::bytes_of(got), testing::bytes_of(small));
  EXPECT_EQ(testing::bytes_of(run(prepare(w1p, 64, true, false, 128),
                                  prepare(w2, 64, true, false, 128), true, 128)),
            testing::bytes_of(small));
  EXPECT_EQ(testing::bytes_of(run(w1p, w2, false, 120)), testing::bytes_of(small.slice(1, 0, 120)));
  EXPECT_FI_ERROR_CODE((void)run(w1p, w2, false, 128, 256, 128),
                       "trtllm_fp8_block_scale_routed_moe", "valid_intermediate_size",
                       ErrorCode::kUnsupported);
  // gemm2 must have roundUp(valid_hidden_size, 128) rows.
  EXPECT_FI_ERROR((void)run(w1p, fp8({E, Hp, I}, 111), false, 128),
                  "trtllm_fp8_block_scale_routed_moe", "gemm2_weights");
}

// gemm1_bias / gemm2_bias (upstream 0.7.4, keyword-only, fp32 [E_l, 2I] / [E_l, H] with the
// weights' rows): added to GEMM1's dequantized output before the activation and to GEMM2's before
// the routing weights, against the fp64 formula (Renormalize routing from logits: the top-2
// logits' softmax); upstream's shuffled layouts with the biases' rows shuffled as the weights'
// give the same bits; wrong dtypes or shapes are refused with upstream's texts; on CUDA the
// kernel (which indexes the stored rows) matches the CPU.
TEST(TrtllmFp8BlockScaleMoe, BiasesAsUpstream) {
  const int64_t T = 6, E = 8, K = 2, H = 256, I = 128;
  const Tensor logits = rand_tensor({T, E}, DType::kFloat32, 120, -3.0, 3.0);
  const Tensor x = fp8({T, H}, 121), xs = rand_tensor({H / 128, T}, DType::kFloat32, 122, 0.2, 0.4);
  const Tensor w1 = fp8({E, 2 * I, H}, 123), w2 = fp8({E, H, I}, 125);
  const Tensor s1 = rand_tensor({E, 2, 2}, DType::kFloat32, 124, 0.02, 0.04);
  const Tensor s2 = rand_tensor({E, 2, 1}, DType::kFloat32, 126, 0.1, 0.2);
  const Tensor b1 = rand_tensor({E, 2 * I}, DType::kFloat32, 127, -2.0, 2.0);
  const Tensor b2 = rand_tensor({E, H}, DType::kFloat32, 128, -1.0, 1.0);
  Tensor replay = Tensor::zeros({T, K}, DType::kInt16);
  auto run = [&](const Tensor& a, const Tensor& b, std::optional<Tensor> bias1,
                 std::optional<Tensor> bias2, bool shuffled, Device dev = Device::cpu()) {
    auto on = [&](const std::optional<Tensor>& t) -> std::optional<Tensor> {
      if (!t) return std::nullopt;
      return t->to(dev);
    };
    return trtllm_fp8_block_scale_moe(
               logits.to(dev), std::nullopt, x.to(dev), xs.to(dev), a.to(dev), s1.to(dev),
               b.to(dev), s2.to(dev), E, K, std::nullopt, std::nullopt, I, 0, E, std::nullopt, 1,
               shuffled, shuffled ? WeightLayout::BlockMajorK : WeightLayout::MajorK, true,
               std::nullopt, 8192, Fp8QuantizationType::DeepSeekFp8, std::nullopt, 3, true,
               dev.is_cpu() ? std::optional<Tensor>(replay) : std::nullopt, std::nullopt,
               std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, on(bias1),
               on(bias2))
        .tensors[0]
        .to(Device::cpu());
  };
  const Tensor out = run(w1, w2, b1, b2, false);
  // The routing the call made: ids from routing_replay_out, weights the softmax of their logits.
  const auto ids = replay.to(DType::kInt32).to_double_vector(), lv = logits.to_double_vector();
  std::vector<double> wts;
  for (int64_t t = 0; t < T; ++t) {
    const double l0 = lv[static_cast<size_t>(t * E + static_cast<int64_t>(ids[t * K]))];
    const double l1 = lv[static_cast<size_t>(t * E + static_cast<int64_t>(ids[t * K + 1]))];
    const double m = std::max(l0, l1), z = std::exp(l0 - m) + std::exp(l1 - m);
    wts.push_back(std::exp(l0 - m) / z);
    wts.push_back(std::exp(l1 - m) / z);
  }
  const MoeTopkIds routing(replay.to(DType::kInt32),
                           Tensor::from_vector(wts, {T, K}, DType::kFloat32));
  const std::vector<double> expect = moe_fp8::fp8_block_moe_reference(
      x, xs, w1, s1, w2, s2, routing, 0, E, b1.to_double_vector(), b2.to_double_vector());
  const std::vector<double> unbiased =
      moe_fp8::fp8_block_moe_reference(x, xs, w1, s1, w2, s2, routing, 0, E);
  EXPECT_GT(max_abs(expect), 0.5);
  EXPECT_FALSE(all_close(Tensor::from_vector(expect, {T, H}, DType::kFloat32), unbiased,
                         default_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
  // Stored rows: shuffled with epilogue_tile_m 64 (no interleave), the biases' rows alike.
  auto permute = [](const Tensor& b, const std::vector<int64_t>& rows) {
    const int64_t n = b.size(0), m = b.size(1);
    const auto v = b.to_double_vector();
    std::vector<double> o(v.size());
    for (int64_t e = 0; e < n; ++e) {
      for (int64_t i = 0; i < m; ++i) o[e * m + i] = v[e * m + rows[static_cast<size_t>(i)]];
    }
    return Tensor::from_vector(o, {n, m}, DType::kFloat32);
  };
  const Tensor w1s = prepare(w1, 64, true, false, 128), w2s = prepare(w2, 64, true, false, 128);
  const Tensor b1s = permute(b1, prepared_rows(2 * I, 64, false));
  const Tensor b2s = permute(b2, prepared_rows(H, 64, false));
  EXPECT_EQ(testing::bytes_of(run(w1s, w2s, b1s, b2s, true)), testing::bytes_of(out));
  const char* op = "trtllm_fp8_block_scale_moe";
  EXPECT_FI_ERROR((void)run(w1, w2, b1.to(DType::kBFloat16), std::nullopt, false), op,
                  "gemm1_bias");
  EXPECT_FI_ERROR((void)run(w1, w2, Tensor::zeros({E, I}, DType::kFloat32), std::nullopt, false),
                  op, "gemm1_bias");
  EXPECT_FI_ERROR(
      (void)run(w1, w2, std::nullopt, Tensor::zeros({E, H + 1}, DType::kFloat32), false), op,
      "gemm2_bias");
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  EXPECT_TRUE(all_close(run(w1, w2, b1, b2, false, d), out, default_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(
      all_close(run(w1s, w2s, b1s, b2s, true, d), out, default_tolerance(DType::kBFloat16)));
}

TEST(TrtllmFp8BlockScaleMoe, BadInput) {
  const char* op = "trtllm_fp8_block_scale_moe";
  const int64_t T = 3, E = 8, H = 128, I = 128, K = 2;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 1);
  Tensor x = fp8({T, H}, 2), xs = Tensor::full({H / 128, T}, 0.1, DType::kFloat32);
  Tensor w1 = fp8({E, 2 * I, H}, 3), s1 = Tensor::full({E, 2, 1}, 0.01, DType::kFloat32);
  Tensor w2 = fp8({E, H, I}, 4), s2 = Tensor::full({E, 1, 1}, 0.01, DType::kFloat32);
  auto call = [&](const Tensor& h, const Tensor& hs, const Tensor& a, const Tensor& as,
                  const Tensor& b, const Tensor& bs, int64_t inter = 128,
                  Fp8QuantizationType q = Fp8QuantizationType::DeepSeekFp8, bool fin = true) {
    (void)trtllm_fp8_block_scale_moe(logits, std::nullopt, h, hs, a, as, b, bs, E, K, std::nullopt,
                                     std::nullopt, inter, 0, E, std::nullopt, 1, false,
                                     WeightLayout::MajorK, fin, std::nullopt, 8192, q);
  };
  EXPECT_FI_ERROR(call(x.to(DType::kBFloat16), xs, w1, s1, w2, s2), op, "hidden_states");
  EXPECT_FI_ERROR(call(x, xs.slice(1, 0, 2), w1, s1, w2, s2), op, "hidden_states_scale");
  EXPECT_FI_ERROR(call(x, xs, w1.to(DType::kBFloat16), s1, w2, s2), op, "gemm1_weights");
  EXPECT_FI_ERROR(call(x, xs, w1, s1.slice(1, 0, 1), w2, s2), op, "gemm1_weights_scale");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2, s2.to(DType::kBFloat16)), op, "gemm2_weights_scale");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2.slice(2, 0, 64), s2), op, "gemm2_weights");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2, s2, 64), op, "intermediate_size");
  // MxFp8 runs since session 12 (tests/ops/test_moe_fp8_mx.cpp): DeepSeek's fp32 scales are
  // not its ue8m0 ones.
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2, s2, I, Fp8QuantizationType::MxFp8), op,
                  "hidden_states_scale");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2, s2, I, Fp8QuantizationType::NoneFp8), op,
                  "fp8_quantization_type");
  EXPECT_FI_ERROR(call(x, xs, w1, s1, w2, s2, I, Fp8QuantizationType::NoneFp8, false), op,
                  "fp8_quantization_type");
  EXPECT_FI_ERROR((void)trtllm_fp8_block_scale_moe(
                      logits, std::nullopt, x, xs, w1, s1, w2, s2, E, K, std::nullopt, std::nullopt,
                      I, 0, E, std::nullopt, 1, false, WeightLayout::MajorK, true, std::nullopt,
                      8192, Fp8QuantizationType::DeepSeekFp8, 1),
                  op, "routing_method_type");  // shared experts need DeepSeekV3 routing
  // Upstream's block-scale launcher rejects groups outside DeepSeekV3 (Renormalize here).
  EXPECT_FI_ERROR((void)trtllm_fp8_block_scale_moe(logits, std::nullopt, x, xs, w1, s1, w2, s2, E,
                                                   K, 2, std::nullopt, I, 0, E, std::nullopt, 1,
                                                   false, WeightLayout::MajorK, true, std::nullopt,
                                                   8192, Fp8QuantizationType::DeepSeekFp8),
                  op, "n_group");
  EXPECT_FI_ERROR(
      (void)trtllm_fp8_block_scale_moe(logits, std::nullopt, x, xs, w1, s1, w2, s2, E, K, 1, 2, I,
                                       0, E, std::nullopt, 1, false, WeightLayout::MajorK, true,
                                       std::nullopt, 8192, Fp8QuantizationType::MxFp8),
      op, "topk_group");
  EXPECT_FI_ERROR(
      (void)trtllm_fp8_block_scale_routed_moe(
          MoeTopkIds(Tensor::zeros({T, K}, DType::kInt32)), std::nullopt, x, xs, w1, s1, w2, s2, E,
          K, std::nullopt, std::nullopt, I, 0, E, std::nullopt, 0, false, WeightLayout::MajorK,
          true, std::nullopt, Tensor::zeros({T, I}, DType::kBFloat16)),
      "trtllm_fp8_block_scale_routed_moe", "gemm1_lora_delta");
  // Upstream 0.7.4's launcher: SwigluStep only in the fused MxFp8 epilogue, and without alpha /
  // beta.
  EXPECT_FI_ERROR((void)trtllm_fp8_block_scale_moe(
                      logits, std::nullopt, x, xs, w1, s1, w2, s2, E, K, std::nullopt, std::nullopt,
                      I, 0, E, std::nullopt, 1, false, WeightLayout::MajorK, true, std::nullopt,
                      8192, Fp8QuantizationType::DeepSeekFp8, std::nullopt, 7),
                  op, "activation_type");
  EXPECT_FI_ERROR((void)trtllm_fp8_block_scale_moe(
                      logits, std::nullopt, x, xs, w1, s1, w2, s2, E, K, std::nullopt, std::nullopt,
                      I, 0, E, std::nullopt, 1, false, WeightLayout::MajorK, true, std::nullopt,
                      8192, Fp8QuantizationType::MxFp8, std::nullopt, 7, true, std::nullopt,
                      Tensor::full({E}, 1.0, DType::kFloat32)),
                  op, "gemm1_alpha");
}

// Per-tensor FP8: gated (Swiglu) and non-gated (Relu2) against the fp64 formula, weights in
// upstream's always-shuffled layout.
TEST(TrtllmFp8PerTensorScaleMoe, MatchesFormula) {
  const int64_t T = 7, E = 8, H = 64, I = 32, K = 2;
  Fp8Case c;
  c.T = T;
  const MoeTopkIds routing = pair_routing(c);
  Tensor x = fp8({T, H}, 21);
  Tensor s1 = rand_tensor({E}, DType::kFloat32, 22, 0.5, 1.0);
  Tensor sg = rand_tensor({E}, DType::kFloat32, 23, 0.02, 0.04);
  Tensor s2 = rand_tensor({E}, DType::kFloat32, 24, 0.05, 0.1);
  for (int64_t act : {int64_t{3}, int64_t{6}}) {
    SCOPED_TRACE("activation " + std::to_string(act));
    const bool gated = act == 3;
    const int64_t N1 = gated ? 2 * I : I;
    Tensor w1 = fp8({E, N1, H}, 25);
    Tensor w2 = fp8({E, H, I}, 26);
    const Tensor out = trtllm_fp8_per_tensor_scale_routed_moe(
        routing, std::nullopt, x, prepare(w1, 128, true, gated, 0), s1, sg,
        prepare(w2, 128, true, false, 0), s2, E, K, std::nullopt, std::nullopt, I, 0, E,
        std::nullopt, false, 0, true, std::nullopt, 8192, act);
    const auto xv = x.to_double_vector(), w1v = w1.to_double_vector(), w2v = w2.to_double_vector(),
               s1v = s1.to_double_vector(), sgv = sg.to_double_vector(),
               s2v = s2.to_double_vector(), idv = routing.ids.to_double_vector(),
               wv = routing.weights->to_double_vector();
    // The combine takes the weights as given: bf16 ones are the routing's, fp32 pairs are not
    // rounded (upstream's launchers take their dtype; session 82).
    std::vector<double> expect(static_cast<size_t>(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = static_cast<int64_t>(idv[static_cast<size_t>(t * K + k)]);
        std::vector<double> h(static_cast<size_t>(I));
        for (int64_t i = 0; i < I; ++i) {
          double a = 0.0, g = 0.0;
          for (int64_t d = 0; d < H; ++d) {
            a +=
                xv[static_cast<size_t>(t * H + d)] * w1v[static_cast<size_t>((e * N1 + i) * H + d)];
            if (gated) {
              g += xv[static_cast<size_t>(t * H + d)] *
                   w1v[static_cast<size_t>((e * N1 + I + i) * H + d)];
            }
          }
          const double v =
              gated ? silu(g * sgv[static_cast<size_t>(e)]) * a * s1v[static_cast<size_t>(e)]
                    : std::pow(std::max(a * sgv[static_cast<size_t>(e)], 0.0), 2) *
                          s1v[static_cast<size_t>(e)];
          h[static_cast<size_t>(i)] =
              e4m3fn_bits_to_float(float_to_e4m3fn_bits(static_cast<float>(v), true));
        }
        for (int64_t d = 0; d < H; ++d) {
          double y = 0.0;
          for (int64_t i = 0; i < I; ++i) {
            y += h[static_cast<size_t>(i)] * w2v[static_cast<size_t>((e * H + d) * I + i)];
          }
          expect[static_cast<size_t>(t * H + d)] +=
              wv[static_cast<size_t>(t * K + k)] * bf16(y * s2v[static_cast<size_t>(e)]);
        }
      }
    }
    // fp8 rounding of the activation may flip one code between fp32 and fp64 sums: a little
    // more than bf16's tolerance.
    EXPECT_GT(max_abs(expect), 0.1);
    EXPECT_TRUE(all_close(out, expect, {2e-2, 2e-2}));
  }
}

// Llama4: top-1 sigmoid routing from bf16 logits, the routing weight applied to GEMM1's output
// (use_routing_scales_on_input) instead of the combine; equals the routed op with that weight
// folded into output1 scales for a linear (Identity) activation.
TEST(TrtllmFp8PerTensorScaleMoe, Llama4RoutingScalesOnInput) {
  const int64_t T = 5, E = 8, H = 64, I = 32;
  Tensor logits = rand_tensor({T, E}, DType::kBFloat16, 31, -3.0, 3.0);
  Tensor x = fp8({T, H}, 32);
  Tensor w1 = fp8({E, 2 * I, H}, 33), w2 = fp8({E, H, I}, 34);
  Tensor s1 = Tensor::full({E}, 0.5, DType::kFloat32),
         sg = Tensor::full({E}, 0.01, DType::kFloat32);
  Tensor s2 = Tensor::full({E}, 0.1, DType::kFloat32);
  Tensor replay = Tensor::zeros({T, 1}, DType::kInt16);
  const Tensor out = trtllm_fp8_per_tensor_scale_moe(
      logits, std::nullopt, x, prepare(w1, 128, true, true, 0), s1, sg,
      prepare(w2, 128, true, false, 0), s2, E, 1, std::nullopt, std::nullopt, I, 0, E, std::nullopt,
      true, 3, true, std::nullopt, 8192, 3, true, replay);
  // Expected with the fp64 formula: expert argmax(logit), weight bf16(sigmoid(logit)) applied to
  // both halves of GEMM1's output, combine weight 1.
  const auto lv = logits.to_double_vector(), xv = x.to_double_vector(), w1v = w1.to_double_vector(),
             w2v = w2.to_double_vector();
  const auto rv = replay.to_double_vector();
  std::vector<double> expect(static_cast<size_t>(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    int64_t e = 0;
    for (int64_t j = 1; j < E; ++j) {
      if (lv[static_cast<size_t>(t * E + j)] > lv[static_cast<size_t>(t * E + e)]) e = j;
    }
    EXPECT_EQ(rv[static_cast<size_t>(t)], e);
    const double w = bf16(1.0 / (1.0 + std::exp(-lv[static_cast<size_t>(t * E + e)])));
    std::vector<double> h(static_cast<size_t>(I));
    for (int64_t i = 0; i < I; ++i) {
      const auto [a, g] = moe_prep::gemm1_halves(xv, w1v, t, e, i, H, I);
      h[static_cast<size_t>(i)] = e4m3fn_bits_to_float(
          float_to_e4m3fn_bits(static_cast<float>(silu(g * 0.01 * w) * a * 0.5 * w), true));
    }
    for (int64_t d = 0; d < H; ++d) {
      const double y = moe_prep::gemm2_col(h, w2v, e, d, H, I);
      expect[static_cast<size_t>(t * H + d)] = bf16(y * 0.1);
    }
  }
  EXPECT_GT(max_abs(expect), 0.1);
  EXPECT_TRUE(all_close(out, expect, {2e-2, 2e-2}));
}

// fp32 weights given as the routed op's (ids, weights) pair: with Llama4's scales on the input
// they are rounded to bf16 (the per-token scales upstream hands GEMM1 are bf16), so the output
// equals the bf16 weights' bit for bit; combined (Renormalize, scales not on the input) they are
// taken unrounded (the launchers take the pair's dtype; session 82), so the output differs.
TEST(TrtllmFp8PerTensorScaleMoe, RoutedFp32PairWeightsOnInputAreBf16CombinedAreNot) {
  const int64_t T = 5, E = 8, H = 64, I = 32;
  Tensor x = fp8({T, H}, 41);
  Tensor w1 = prepare(fp8({E, 2 * I, H}, 42), 128, true, true, 0);
  Tensor w2 = prepare(fp8({E, H, I}, 43), 128, true, false, 0);
  Tensor s1 = Tensor::full({E}, 0.5, DType::kFloat32),
         sg = Tensor::full({E}, 0.02, DType::kFloat32),
         s2 = Tensor::full({E}, 0.1, DType::kFloat32);
  std::vector<double> ids, w;
  for (int64_t t = 0; t < T; ++t) {
    ids.push_back(static_cast<double>((3 * t + 1) % E));
    w.push_back(0.3 + 0.01 * static_cast<double>(t) + 1e-4);  // not exact in bf16
  }
  const Tensor id = Tensor::from_vector(ids, {T, 1}, DType::kInt32);
  const Tensor w32 = Tensor::from_vector(w, {T, 1}, DType::kFloat32);
  const Tensor w16 = w32.to(DType::kBFloat16);
  ASSERT_FALSE(all_close(w16.to(DType::kFloat32), w32, {0, 0}));
  auto run = [&](const Tensor& weights, bool on_input, int64_t method) {
    return trtllm_fp8_per_tensor_scale_routed_moe(
        MoeTopkIds(id, weights), std::nullopt, x, w1, s1, sg, w2, s2, E, 1, std::nullopt,
        std::nullopt, I, 0, E, std::nullopt, on_input, method, true, std::nullopt, 8192, 3);
  };
  const Tensor on32 = run(w32, true, 3), on16 = run(w16, true, 3);
  EXPECT_GT(max_abs(on16.to_double_vector()), 0.05);
  EXPECT_TRUE(all_close(on32, on16, {0, 0}));
  const Tensor c32 = run(w32, false, 1), c16 = run(w16, false, 1);
  EXPECT_GT(max_abs(c16.to_double_vector()), 0.05);
  EXPECT_FALSE(all_close(c32, c16, {0, 0}));
}

// SwigluStep with per-tensor scales, as upstream 0.7.4's StepFun epilogue (trace/templates/
// moe.py): the clamps act on GEMM1's raw accumulators, up = clamp(raw_up, +-L) * sc and gate =
// min(silu(raw_gate * sg), L * sg), L = gemm1_clamp_limit (raw units) or 7 / sg. One token,
// x = e_0, so GEMM1's row j is w1[e, j, 0]; GEMM2 maps intermediate column i to output i.
// Hand-checked (sc = 0.5, sg = 0.25, so L = 28): up 20, gate 40: clamp(20) * 0.5 = 10, min(silu
// (10), 7) = 7, 70 -> e4m3 72 (before session 86: the scaled up 10 clamped at 7, 49 -> 48);
// up -32, gate 8: -14 * silu(2) = -24.66 -> -24; with gemm1_clamp_limit 16: 8 * min(9.9995, 4)
// = 32.
TEST(TrtllmFp8PerTensorScaleMoe, SwigluStepClampsRawAccumulatorsAsUpstream) {
  const int64_t E = 2, H = 64, I = 32;
  std::vector<double> xv(H, 0.0);
  xv[0] = 1.0;
  const Tensor x = Tensor::from_vector(xv, {1, H}, DType::kFloat8E4M3FN);
  std::vector<double> w1v(static_cast<size_t>(E * 2 * I * H), 0.0);
  std::vector<double> w2v(static_cast<size_t>(E * H * I), 0.0);
  const double ups[] = {20.0, -32.0, 6.0}, gates[] = {40.0, 8.0, -4.0};
  for (int64_t j = 0; j < 3; ++j) {
    w1v[static_cast<size_t>(j * H)] = ups[j];
    w1v[static_cast<size_t>((I + j) * H)] = gates[j];
    w2v[static_cast<size_t>(j * I + j)] = 1.0;
  }
  const Tensor w1 = Tensor::from_vector(w1v, {E, 2 * I, H}, DType::kFloat8E4M3FN);
  const Tensor w2 = Tensor::from_vector(w2v, {E, H, I}, DType::kFloat8E4M3FN);
  const Tensor sc = Tensor::full({E}, 0.5, DType::kFloat32);
  const Tensor sg = Tensor::full({E}, 0.25, DType::kFloat32);
  const Tensor s2 = Tensor::full({E}, 1.0, DType::kFloat32);
  const MoeTopkIds routing(Tensor::from_vector({0.0}, {1, 1}, DType::kInt32),
                           Tensor::from_vector({1.0}, {1, 1}, DType::kFloat32));
  auto run = [&](std::optional<Tensor> limit) {
    return trtllm_fp8_per_tensor_scale_routed_moe(
               routing, std::nullopt, x, prepare(w1, 128, true, true, 0), sc, sg,
               prepare(w2, 128, true, false, 0), s2, E, 1, std::nullopt, std::nullopt, I, 0, E,
               std::nullopt, false, 0, true, std::nullopt, 8192, 7, std::nullopt, std::nullopt,
               limit)
        .tensors.at(0)
        .to_double_vector();
  };
  auto e4m3 = [](double v) {
    return static_cast<double>(
        e4m3fn_bits_to_float(float_to_e4m3fn_bits(static_cast<float>(v), true)));
  };
  const auto out = run(std::nullopt);
  EXPECT_EQ(out[0], 72.0);
  EXPECT_EQ(out[1], -24.0);
  const float L = 7.0f / 0.25f;
  const float up2 = std::clamp(6.0f, -L, L) * 0.5f;
  const float g2 = std::min(static_cast<float>(silu(-4.0 * 0.25)), L * 0.25f);
  EXPECT_EQ(out[2], bf16(e4m3(up2 * g2)));
  for (int64_t d = 3; d < H; ++d) EXPECT_EQ(out[static_cast<size_t>(d)], 0.0) << d;
  const auto lim = run(Tensor::full({E}, 16.0, DType::kFloat32));
  EXPECT_EQ(lim[0], 32.0);   // clamp(20, 16) * 0.5 = 8, times min(silu(10), 16 * 0.25) = 4
  EXPECT_EQ(lim[1], -14.0);  // clamp(-32, 16) * 0.5 = -8, times silu(2) = 1.7616: -14.09
  EXPECT_EQ(lim[2], out[2]);
  // Upstream 0.7.4's checks: the limit with SwigluStep only, fp32 [local_num_experts]; the
  // workspace a 1-D byte tensor with do_finalize.
  const char* op = "trtllm_fp8_per_tensor_scale_routed_moe";
  auto call = [&](int64_t act, std::optional<Tensor> limit, std::optional<Tensor> ws,
                  bool finalize = true) {
    (void)trtllm_fp8_per_tensor_scale_routed_moe(
        routing, std::nullopt, x, prepare(w1, 128, true, true, 0), sc, sg,
        prepare(w2, 128, true, false, 0), s2, E, 1, std::nullopt, std::nullopt, I, 0, E,
        std::nullopt, false, 0, finalize, std::nullopt, 8192, act, std::nullopt, std::nullopt,
        limit, ws);
  };
  EXPECT_FI_ERROR(call(3, Tensor::full({E}, 16.0, DType::kFloat32), std::nullopt), op,
                  "gemm1_clamp_limit");
  EXPECT_FI_ERROR(call(7, Tensor::full({E + 1}, 16.0, DType::kFloat32), std::nullopt), op,
                  "gemm1_clamp_limit");
  EXPECT_FI_ERROR(call(7, Tensor::full({E}, 16.0, DType::kBFloat16), std::nullopt), op,
                  "gemm1_clamp_limit");
  EXPECT_NO_THROW(call(7, std::nullopt, Tensor::zeros({1024}, DType::kUInt8)));
  EXPECT_FI_ERROR(call(7, std::nullopt, Tensor::zeros({1024}, DType::kFloat32)), op,
                  "workspace_buffer");
  EXPECT_FI_ERROR(call(7, std::nullopt, Tensor::zeros({1024}, DType::kUInt8), false), op,
                  "workspace_buffer");
}

TEST(TrtllmFp8PerTensorScaleMoe, BadInput) {
  const char* op = "trtllm_fp8_per_tensor_scale_moe";
  const int64_t T = 3, E = 8, H = 64, I = 32, K = 2;
  Tensor logits = rand_tensor({T, E}, DType::kBFloat16, 1);
  Tensor x = fp8({T, H}, 2), w1 = fp8({E, 2 * I, H}, 3), w2 = fp8({E, H, I}, 4);
  Tensor s = Tensor::full({E}, 0.01, DType::kFloat32);
  auto call = [&](const Tensor& h, const Tensor& a, const Tensor& sa, const Tensor& b,
                  int64_t k = 2, bool on_input = false, int64_t inter = 32) {
    (void)trtllm_fp8_per_tensor_scale_moe(logits, std::nullopt, h, a, sa, s, b, s, E, k,
                                          std::nullopt, std::nullopt, inter, 0, E, std::nullopt,
                                          on_input, 1);
  };
  EXPECT_FI_ERROR(call(x.to(DType::kBFloat16), w1, s, w2), op, "hidden_states");
  EXPECT_FI_ERROR(call(x, w1.to(DType::kBFloat16), s, w2), op, "gemm1_weights");
  EXPECT_FI_ERROR(call(x, fp8({E, 16, H}, 5), s, w2, K, false, 8), op, "gemm1_weights");
  EXPECT_FI_ERROR(call(x, w1, s.slice(0, 0, 4), w2), op, "output1_scales_scalar");
  EXPECT_FI_ERROR(call(x, w1, s.to(DType::kBFloat16), w2), op, "output1_scales_scalar");
  EXPECT_FI_ERROR(call(x, w1, s, w2.slice(1, 0, 32)), op, "gemm2_weights");
  EXPECT_FI_ERROR(call(x, w1, s, w2, K, true), op, "use_routing_scales_on_input");
  // Top-1 Renormalize routing with use_routing_scales_on_input: upstream hands GEMM1 the routing
  // weights as per-token scales for Llama4 only (docs/MOE.md): an error here.
  EXPECT_FI_ERROR(call(x, w1, s, w2, 1, true), op, "use_routing_scales_on_input");
  EXPECT_FI_ERROR(call(x, w1, s, w2, 9), op, "top_k");
}

TEST(MoeQuantDecls, SignaturesAndRecordReplay) {
  const OpDecl* d = OpRegistry::global().find("trtllm_fp8_block_scale_moe");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->module, "flashinfer.fused_moe.core");
  for (const char* name : {"trtllm_fp8_block_scale_routed_moe", "trtllm_fp8_per_tensor_scale_moe",
                           "trtllm_fp8_per_tensor_scale_routed_moe"}) {
    ASSERT_NE(OpRegistry::global().find(name), nullptr) << name;
  }
  const int64_t T = 3, E = 8, H = 128, I = 128;
  Fp8Case c;
  c.T = T;
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)trtllm_fp8_block_scale_moe(
        rand_tensor({T, E}, DType::kFloat32, 1), std::nullopt, fp8({T, H}, 2),
        Tensor::full({1, T}, 0.1, DType::kFloat32), fp8({E, 2 * I, H}, 3),
        Tensor::full({E, 2, 1}, 0.01, DType::kFloat32), fp8({E, H, I}, 4),
        Tensor::full({E, 1, 1}, 0.01, DType::kFloat32), E, 2, std::nullopt, std::nullopt, I, 0, E,
        std::nullopt, 1);
    (void)trtllm_fp8_block_scale_routed_moe(
        pair_routing(c), std::nullopt, fp8({T, H}, 5), Tensor::full({1, T}, 0.1, DType::kFloat32),
        fp8({E, 2 * I, H}, 6), Tensor::full({E, 2, 1}, 0.01, DType::kFloat32), fp8({E, H, I}, 7),
        Tensor::full({E, 1, 1}, 0.01, DType::kFloat32), E, 2, std::nullopt, std::nullopt, I, 0, E,
        std::nullopt);
    Tensor s = Tensor::full({E}, 0.01, DType::kFloat32);
    (void)trtllm_fp8_per_tensor_scale_moe(rand_tensor({T, E}, DType::kBFloat16, 8), std::nullopt,
                                          fp8({T, 64}, 9), fp8({E, 64, 64}, 10), s, s,
                                          fp8({E, 64, 32}, 11), s, E, 2, std::nullopt, std::nullopt,
                                          32, 0, E, std::nullopt, false, 1);
    (void)trtllm_fp8_per_tensor_scale_routed_moe(
        pair_routing(c), std::nullopt, fp8({T, 64}, 12), fp8({E, 64, 64}, 13), s, s,
        fp8({E, 64, 32}, 14), s, E, 2, std::nullopt, std::nullopt, 32, 0, E, std::nullopt, false);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 4u);
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    EXPECT_TRUE(replays_identically(call));
  }
}

// The CUDA kernel against the CPU reference: every routing method from logits with an expert
// offset, and the precomputed pair form. Groups (n_group 4, topk_group 2) go to DeepSeekV3 only:
// upstream's FP8 block-scale launcher refuses n_group / topk_group > 1 for every other method
// (the test once passed them to all nine, issue 47). The CPU runs come first and need no GPU, so
// the arguments of every method are checked everywhere; the comparison is skipped without one.
TEST(TrtllmFp8BlockScaleMoeCuda, MatchesCpu) {
  const int64_t T = 13, E = 8, H = 256, I = 128, El = 4, off = 2;
  Tensor x = fp8({T, H}, 41), xs = rand_tensor({H / 128, T}, DType::kFloat32, 42, 0.2, 0.4);
  Tensor w1 = fp8({El, 2 * I, H}, 43), w2 = fp8({El, H, I}, 44);
  Tensor s1 = rand_tensor({El, 2, 2}, DType::kFloat32, 45, 0.02, 0.04);
  Tensor s2 = rand_tensor({El, 2, 1}, DType::kFloat32, 46, 0.1, 0.2);
  Tensor bias = rand_tensor({E}, DType::kFloat32, 47, -0.3, 0.3);
  constexpr int64_t kMethods = 9;  // RoutingMethodType 0 (Default) .. 8 (Sigmoid)
  auto run = [&](int64_t method, Device dev) {
    const bool grouped = method == static_cast<int64_t>(RoutingMethodType::DeepSeekV3);
    const std::optional<int64_t> n_group = grouped ? std::optional<int64_t>(4) : std::nullopt;
    const std::optional<int64_t> topk_group = grouped ? std::optional<int64_t>(2) : std::nullopt;
    const int64_t k = method == static_cast<int64_t>(RoutingMethodType::Llama4) ? 1 : 2;
    const Tensor logits = rand_tensor({T, E}, DType::kFloat32, 48 + method, -3.0, 3.0);
    return Tensor(trtllm_fp8_block_scale_moe(logits.to(dev), bias.to(dev), x.to(dev), xs.to(dev),
                                             w1.to(dev), s1.to(dev), w2.to(dev), s2.to(dev), E, k,
                                             n_group, topk_group, I, off, El, 2.5, method))
        .to(Device::cpu());
  };
  std::vector<Tensor> refs;
  for (int64_t method = 0; method < kMethods; ++method) {
    SCOPED_TRACE("method " + std::to_string(method));
    refs.push_back(run(method, Device::cpu()));
  }
  // Groups outside DeepSeekV3 stay refused, naming n_group (upstream's launcher).
  EXPECT_FI_ERROR(trtllm_fp8_block_scale_moe(rand_tensor({T, E}, DType::kFloat32, 48), bias, x, xs,
                                             w1, s1, w2, s2, E, 2, 4, 2, I, off, El, 2.5, 0),
                  "trtllm_fp8_block_scale_moe", "n_group");
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  for (int64_t method = 0; method < kMethods; ++method) {
    SCOPED_TRACE("method " + std::to_string(method));
    EXPECT_TRUE(all_close(run(method, d), refs[static_cast<size_t>(method)],
                          default_tolerance(DType::kBFloat16)));
  }
  Fp8Case c;
  c.T = T;
  const MoeTopkIds r = pair_routing(c);
  const Tensor ref =
      trtllm_fp8_block_scale_routed_moe(r, std::nullopt, x, xs, w1, s1, w2, s2, E, 2, std::nullopt,
                                        std::nullopt, I, off, El, std::nullopt);
  const Tensor got = trtllm_fp8_block_scale_routed_moe(
      MoeTopkIds(r.ids.to(d), r.weights->to(d)), std::nullopt, x.to(d), xs.to(d), w1.to(d),
      s1.to(d), w2.to(d), s2.to(d), E, 2, std::nullopt, std::nullopt, I, off, El, std::nullopt);
  EXPECT_TRUE(all_close(got.to(Device::cpu()), ref, default_tolerance(DType::kBFloat16)));
}

// DeepSeek FP8 on CUDA with upstream's stored layouts (shuffled with epilogue_tile_m 64,
// BlockMajorK with 128- and 64-byte blocks, both) read in place by the kernel: the same bits as
// the plain weights on CUDA (the same kernel reads the same values through the layout index),
// and the CPU reference's result (which turns the layouts back on the host) at bf16's tolerance:
// the kernel dequantizes as (x * x_scale) * w * w_scale, the CPU as (x * x_scale) * (w *
// w_scale), not the same roundings. Routed pairs with an expert offset, and DeepSeekV3 routing
// from logits.
TEST(TrtllmFp8BlockScaleMoeCuda, StoredLayoutsMatchPlain) {
  struct Dims {
    int64_t T, H, I;
  };
  const int64_t E = 8, El = 4, off = 2;
  struct Layout {
    bool shuffled;
    int64_t block_bytes;
  };
  const Layout layouts[] = {{true, 0}, {false, 128}, {true, 128}, {true, 64}};
  for (const Dims& d : {Dims{13, 256, 128}, Dims{4, 128, 256}}) {
    SCOPED_TRACE("T " + std::to_string(d.T) + " H " + std::to_string(d.H) + " I " +
                 std::to_string(d.I));
    const int64_t H = d.H, I = d.I;
    Tensor x = fp8({d.T, H}, 61), xs = rand_tensor({H / 128, d.T}, DType::kFloat32, 62, 0.2, 0.4);
    Tensor w1 = fp8({El, 2 * I, H}, 63), w2 = fp8({El, H, I}, 64);
    Tensor s1 = rand_tensor({El, 2 * I / 128, H / 128}, DType::kFloat32, 65, 0.02, 0.04);
    Tensor s2 = rand_tensor({El, H / 128, I / 128}, DType::kFloat32, 66, 0.1, 0.2);
    Tensor logits = rand_tensor({d.T, E}, DType::kFloat32, 67, -3.0, 3.0);
    Tensor bias = rand_tensor({E}, DType::kFloat32, 68, -0.3, 0.3);
    Fp8Case c;
    c.T = d.T;
    const MoeTopkIds r = pair_routing(c);
    auto routed = [&](const Tensor& a, const Tensor& b, bool shuffled, WeightLayout layout,
                      Device dev) {
      const MoeTopkIds rd(r.ids.to(dev), r.weights->to(dev));
      return Tensor(trtllm_fp8_block_scale_routed_moe(rd, std::nullopt, x.to(dev), xs.to(dev),
                                                      a.to(dev), s1.to(dev), b.to(dev), s2.to(dev),
                                                      E, 2, std::nullopt, std::nullopt, I, off, El,
                                                      std::nullopt, 0, shuffled, layout))
          .to(Device::cpu());
    };
    auto from_logits = [&](const Tensor& a, const Tensor& b, bool shuffled, WeightLayout layout,
                           Device dev) {
      return Tensor(trtllm_fp8_block_scale_moe(logits.to(dev), bias.to(dev), x.to(dev), xs.to(dev),
                                               a.to(dev), s1.to(dev), b.to(dev), s2.to(dev), E, 2,
                                               4, 2, I, off, El, 2.5, 2, shuffled, layout))
          .to(Device::cpu());
    };
    const Tensor cpu_routed = routed(w1, w2, false, WeightLayout::MajorK, Device::cpu());
    const Tensor cpu_logits = from_logits(w1, w2, false, WeightLayout::MajorK, Device::cpu());
    if (!cuda_available()) continue;
    const Device dev = Device::cuda(0);
    const Tensor gpu_routed = routed(w1, w2, false, WeightLayout::MajorK, dev);
    const Tensor gpu_logits = from_logits(w1, w2, false, WeightLayout::MajorK, dev);
    EXPECT_TRUE(all_close(gpu_routed, cpu_routed, default_tolerance(DType::kBFloat16)));
    EXPECT_TRUE(all_close(gpu_logits, cpu_logits, default_tolerance(DType::kBFloat16)));
    for (const Layout& l : layouts) {
      SCOPED_TRACE("shuffled " + std::to_string(l.shuffled) + " block bytes " +
                   std::to_string(l.block_bytes));
      const Tensor a = prepare(w1, 64, l.shuffled, false, l.block_bytes);
      const Tensor b = prepare(w2, 64, l.shuffled, false, l.block_bytes);
      const WeightLayout wl = l.block_bytes > 0 ? WeightLayout::BlockMajorK : WeightLayout::MajorK;
      EXPECT_TRUE(all_close(routed(a, b, l.shuffled, wl, dev), gpu_routed, {0, 0}));
      EXPECT_TRUE(all_close(from_logits(a, b, l.shuffled, wl, dev), gpu_logits, {0, 0}));
    }
  }
  FLASHINFER_SKIP_WITHOUT_CUDA();
}

// fp8 weights of -1, 0 or 1.
Tensor fp8_ternary(const Shape& shape, uint64_t seed) {
  std::vector<double> v = rand_tensor(shape, DType::kFloat32, seed, -1.5, 1.5).to_double_vector();
  for (double& x : v) x = std::round(x);
  return Tensor::from_vector(v, shape, DType::kFloat8E4M3FN);
}

// Per-tensor FP8 on CUDA against the CPU reference, the weights in upstream's always-shuffled
// layout (GEMM1's up / gate rows interleaved for a gated activation) read in place by the kernel.
// The weights are -1, 0 or 1 and every other GEMM input e4m3 (steps of 2^-9 at the finest, at
// most 448), so both GEMMs' sums are exact in fp32 in any order here (|partial sums| < 2^15);
// with the CPU's scale, activation and rounding steps the kernel gives the same bits for Relu2
// and Identity on routed pairs. Swiglu's silu (expf on the device, std::exp on the host) and the
// routing from logits may differ in a last bit, which can move one e4m3 code or a bf16 routing
// weight: compared at the per-tensor tolerance there. A warm call allocates no device scratch.
TEST(TrtllmFp8PerTensorScaleMoeCuda, MatchesCpu) {
  struct Dims {
    int64_t T, H, I, El, off;
  };
  const int64_t E = 8;
  for (const Dims& d : {Dims{7, 64, 32, 8, 0}, Dims{13, 128, 64, 4, 2}, Dims{3, 256, 32, 8, 0}}) {
    const int64_t T = d.T, H = d.H, I = d.I, El = d.El;
    Tensor x = fp8({T, H}, 71);
    Tensor s1 = rand_tensor({El}, DType::kFloat32, 72, 0.5, 1.0);
    Tensor sg = rand_tensor({El}, DType::kFloat32, 73, 0.05, 0.1);
    Tensor s2 = rand_tensor({El}, DType::kFloat32, 74, 0.05, 0.1);
    Tensor logits = rand_tensor({T, E}, DType::kBFloat16, 75, -3.0, 3.0);
    Fp8Case c;
    c.T = T;
    const MoeTopkIds r = pair_routing(c);
    // 7: SwigluStep on the raw accumulators (session 86).
    for (int64_t act : {int64_t{6}, int64_t{9}, int64_t{3}, int64_t{7}}) {
      SCOPED_TRACE("T " + std::to_string(T) + " H " + std::to_string(H) + " I " +
                   std::to_string(I) + " activation " + std::to_string(act));
      const bool gated = act == 3 || act == 7;
      const int64_t N1 = gated ? 2 * I : I;
      const Tensor w1 = prepare(fp8_ternary({El, N1, H}, 76), 128, true, gated, 0);
      const Tensor w2 = prepare(fp8_ternary({El, H, I}, 77), 128, true, false, 0);
      auto routed = [&](Device dev) {
        const MoeTopkIds rd(r.ids.to(dev), r.weights->to(dev));
        return Tensor(trtllm_fp8_per_tensor_scale_routed_moe(
                          rd, std::nullopt, x.to(dev), w1.to(dev), s1.to(dev), sg.to(dev),
                          w2.to(dev), s2.to(dev), E, 2, std::nullopt, std::nullopt, I, d.off, El,
                          std::nullopt, false, 0, true, std::nullopt, 8192, act))
            .to(Device::cpu());
      };
      auto from_logits = [&](Device dev) {
        return Tensor(trtllm_fp8_per_tensor_scale_moe(
                          logits.to(dev), std::nullopt, x.to(dev), w1.to(dev), s1.to(dev),
                          sg.to(dev), w2.to(dev), s2.to(dev), E, 2, std::nullopt, std::nullopt, I,
                          d.off, El, std::nullopt, false, 1, true, std::nullopt, 8192, act))
            .to(Device::cpu());
      };
      // Llama4: top-1 sigmoid routing, the routing weight applied to GEMM1's output.
      auto llama4 = [&](Device dev) {
        return Tensor(trtllm_fp8_per_tensor_scale_moe(
                          logits.to(dev), std::nullopt, x.to(dev), w1.to(dev), s1.to(dev),
                          sg.to(dev), w2.to(dev), s2.to(dev), E, 1, std::nullopt, std::nullopt, I,
                          d.off, El, std::nullopt, true, 3, true, std::nullopt, 8192, act))
            .to(Device::cpu());
      };
      const Tensor cpu_routed = routed(Device::cpu()), cpu_logits = from_logits(Device::cpu());
      const Tensor cpu_llama4 = llama4(Device::cpu());
      EXPECT_GT(max_abs(cpu_routed.to_double_vector()), 0.1);
      if (!cuda_available()) continue;
      const Device dev = Device::cuda(0);
      const Tolerance exact{0, 0}, tol{2e-2, 2e-2};
      EXPECT_TRUE(all_close(routed(dev), cpu_routed, gated ? tol : exact));
      EXPECT_TRUE(all_close(from_logits(dev), cpu_logits, tol));
      EXPECT_TRUE(all_close(llama4(dev), cpu_llama4, tol));
#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
      const uint64_t allocs = kernels::cuda::cutlass_moe_cuda_stats().scratch_allocs;
      EXPECT_TRUE(all_close(routed(dev), cpu_routed, gated ? tol : exact));
      EXPECT_EQ(kernels::cuda::cutlass_moe_cuda_stats().scratch_allocs, allocs);
#endif
    }
  }
  FLASHINFER_SKIP_WITHOUT_CUDA();
}

// Dumps written by Python as upstream's recorder writes them (torch format; fp8 tensors as
// torch >= 2.1 pickles them: _rebuild_tensor_v3 over an UntypedStorage with
// torch.float8_e4m3fn, written by hand since the machine's torch 1.13 has no float8), for the
// calls engines make: every argument by keyword, weights prepared by upstream's procedure
// (trtllm_bf16_moe with its default shuffled BlockMajorK layout; trtllm_fp8_block_scale_moe
// with DeepSeekV3 routing and shuffled BlockMajorK weights; trtllm_fp8_per_tensor_scale_moe as
// for Llama4; trtllm_gen_routing, whose undefined output tails hold junk and are skipped, and
// trtllm_gen_routing and trtllm_fp8_block_scale_moe with a fused shared expert, the routing's
// pairs in another order within each expert), expected outputs computed by torch in fp32 as
// upstream's test reference does (but DeepSeek FP8's activation quantized to e4m3 per 128
// columns, as upstream's kernel does: docs/MOE.md). All six replay here and pass.
TEST(MoeUpstreamDumps, EngineStyleTrtllmDumpsReplay) {
  // save() and record(): the shared writer (tests/util/upstream_dump_py.h).
  const std::string body = R"PY(
import torch.nn.functional as F


# e4m3fn codes of float values: the nearest finite code, a tie to the lower code number (the
# smaller magnitude; zero is code 0, -0 left out), by binary search over the sorted values of the
# shared table (E4M3, FIN8): a [numel, 254] distance table took over a second here.
NZ8 = FIN8[FIN8 != 128]
SORTED8, ORDER8 = E4M3[NZ8].sort()
CODES8 = NZ8[ORDER8]
def to_fp8(x):
    f = x.reshape(-1)
    hi = torch.searchsorted(SORTED8, f).clamp(1, len(SORTED8) - 1)
    lo = hi - 1
    dlo, dhi = (f - SORTED8[lo]).abs(), (f - SORTED8[hi]).abs()
    clo, chi = CODES8[lo], CODES8[hi]
    codes = torch.where((dhi < dlo) | ((dhi == dlo) & (chi < clo)), chi, clo)
    codes = codes.to(torch.uint8).reshape(x.shape)
    return codes, E4M3[codes.long()]

torch.manual_seed(0)
CORE = "flashinfer.fused_moe.core"

MAP32 = [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
         4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31]
MAP16 = [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15]
def shuffle_idx(m, tile):  # get_shuffle_matrix_a_row_indices
    mp = MAP32 if tile % 128 == 0 else MAP16
    b = len(mp)
    idx = torch.empty(m, dtype=torch.long)
    for old in range(m):
        idx[old // b * b + mp[old % b]] = old
    return idx
def interleave_idx(m):  # get_reorder_rows_for_gated_act_gemm_row_indices
    r = torch.arange(m)
    p = torch.empty_like(r)
    p[0::2] = r[: (m + 1) // 2]
    p[1::2] = r[(m + 1) // 2:]
    return p
def block_layout(u8):  # convert_to_block_layout(x.view(uint8), 128)
    m, k = u8.shape
    return u8.view(m, k // 128, 128).permute(1, 0, 2).contiguous()

# 1. trtllm_bf16_moe as the engines call it (keywords; upstream's default layouts: shuffled,
# BlockMajorK), Renormalize routing of bf16 logits.
T, E, H, I, K = 5, 8, 128, 64, 2
logits = torch.randn(T, E).to(torch.bfloat16)
x = torch.randn(T, H).to(torch.bfloat16)
w1 = (torch.randn(E, 2 * I, H) * 0.1).to(torch.bfloat16)
w2 = (torch.randn(E, H, I) * 0.1).to(torch.bfloat16)
p1 = interleave_idx(2 * I)[shuffle_idx(2 * I, 128)]
w1k = torch.stack([block_layout(w1[e][p1].view(torch.uint8)) for e in range(E)]).view(torch.bfloat16)
w2k = torch.stack([block_layout(w2[e][shuffle_idx(H, 128)].view(torch.uint8)) for e in range(E)]).view(torch.bfloat16)
tv, ti = torch.topk(logits, K, dim=-1)
wts = torch.softmax(tv.float(), -1)
out = torch.zeros(T, H)
for t in range(T):
    for k in range(K):
        e = int(ti[t, k])
        g = x[t].float() @ w1[e].float().T
        h = (F.silu(g[I:]) * g[:I]).bfloat16().float()
        out[t] += wts[t, k] * (h @ w2[e].float().T)
record("trtllm_bf16_moe", CORE,
       {"kwarg_routing_logits": logits, "kwarg_hidden_states": x, "kwarg_gemm1_weights": w1k,
        "kwarg_gemm2_weights": w2k},
       {"kwarg_routing_bias": None, "kwarg_num_experts": E, "kwarg_top_k": K,
        "kwarg_n_group": None, "kwarg_topk_group": None, "kwarg_intermediate_size": I,
        "kwarg_local_expert_offset": 0, "kwarg_local_num_experts": E,
        "kwarg_routed_scaling_factor": None, "kwarg_routing_method_type": 1,
        "kwarg_use_shuffled_weight": True,
        "kwarg_weight_layout": {"type": "enum", "name": "WeightLayout.BlockMajorK", "value": 2},
        "kwarg_do_finalize": True, "kwarg_tune_max_num_tokens": 8192},
       out.bfloat16())

# 2. trtllm_fp8_block_scale_moe (DeepSeek FP8, DeepSeekV3 grouped routing), keywords, weights
# prepared as upstream's FP8BlockScaleMoe does (shuffle with epilogue_tile_m 64, BlockMajorK);
# with S fused shared experts (section 6) their weights are rows E .. E + S - 1 and their slots
# run for every token at weight 1 after the routed ones.
def ds_fp8_block(T, E, H, I, K, S, shuffled):
    logits = torch.randn(T, E)
    bias = (torch.randn(E) * 0.1).to(torch.bfloat16)
    xc, xv = to_fp8(torch.randn(T, H) * 2)
    hs = torch.rand(H // 128, T) * 0.2 + 0.2
    w1c, w1v = to_fp8(torch.randn(E + S, 2 * I, H) * 2)
    w2c, w2v = to_fp8(torch.randn(E + S, H, I) * 2)
    s1 = torch.rand(E + S, 2 * I // 128, H // 128) * 0.02 + 0.02
    s2 = torch.rand(E + S, H // 128, I // 128) * 0.1 + 0.1
    if shuffled:
        w1k = torch.stack([block_layout(w1c[e][shuffle_idx(2 * I, 64)]) for e in range(E + S)])
        w2k = torch.stack([block_layout(w2c[e][shuffle_idx(H, 64)]) for e in range(E + S)])
    else:
        w1k, w2k = w1c, w2c
    # noaux_tc_ref: sigmoid + bias, groups of 2 scored by their top-2 sum, 2 groups kept
    s = torch.sigmoid(logits)
    sb = s + bias.float()
    gs = sb.view(T, 4, 2).topk(2, dim=-1)[0].sum(-1)
    gmask = torch.zeros(T, 4).scatter_(1, gs.topk(2, dim=-1)[1], 1)
    sb = sb * gmask.repeat_interleave(2, dim=1)
    ti = sb.topk(K, dim=-1)[1]
    sel = s.gather(1, ti)
    wts = sel / (sel.sum(-1, keepdim=True) + 1e-20) * 2.5
    ti = torch.cat([ti, torch.arange(E, E + S).expand(T, S)], 1)
    wts = torch.cat([wts, torch.ones(T, S)], 1)
    xd = xv * hs.t().repeat_interleave(128, dim=1)
    w1d = w1v * s1.repeat_interleave(128, 1).repeat_interleave(128, 2)
    w2d = w2v * s2.repeat_interleave(128, 1).repeat_interleave(128, 2)
    out = torch.zeros(T, H)
    for t in range(T):
        for k in range(K + S):
            e = int(ti[t, k])
            g = xd[t] @ w1d[e].T
            # the kernel's activation: e4m3 with an fp32 scale per 128 columns
            h = F.silu(g[I:]) * g[:I]
            sc = (h.view(-1, 128).abs().amax(-1) / 448).clamp(min=1.1754944e-38)
            sc = sc.repeat_interleave(128)
            h = to_fp8(h / sc)[1] * sc
            out[t] += wts[t, k] * (h @ w2d[e].T)
    scalars = {"kwarg_num_experts": E, "kwarg_top_k": K, "kwarg_n_group": 4,
               "kwarg_topk_group": 2, "kwarg_intermediate_size": I,
               "kwarg_local_expert_offset": 0, "kwarg_local_num_experts": E,
               "kwarg_routed_scaling_factor": 2.5, "kwarg_routing_method_type": 2,
               "kwarg_use_shuffled_weight": shuffled, "kwarg_weight_layout": 2 if shuffled else 0,
               "kwarg_enable_pdl": None}
    if S:
        scalars["kwarg_num_fused_shared_experts"] = S
    record("trtllm_fp8_block_scale_moe", CORE,
           {"kwarg_routing_logits": logits, "kwarg_routing_bias": bias,
            "kwarg_hidden_states": ("fp8", xc), "kwarg_hidden_states_scale": hs,
            "kwarg_gemm1_weights": ("fp8", w1k), "kwarg_gemm1_weights_scale": s1,
            "kwarg_gemm2_weights": ("fp8", w2k), "kwarg_gemm2_weights_scale": s2},
           scalars, out.bfloat16())

ds_fp8_block(4, 8, 128, 128, 2, 0, True)

# 3. trtllm_fp8_per_tensor_scale_moe as SGLang calls it for Llama4 (keywords; top-1 sigmoid
# routing of bf16 logits applied on GEMM1's output), weights prepared as upstream's
# FP8PerTensorMoe does (gated interleave, shuffle with epilogue_tile_m 128, MajorK).
T, E, H, I = 5, 8, 64, 32
logits = torch.randn(T, E).to(torch.bfloat16)
xc, xv = to_fp8(torch.randn(T, H) * 2)
w1c, w1v = to_fp8(torch.randn(E, 2 * I, H) * 2)
w2c, w2v = to_fp8(torch.randn(E, H, I) * 2)
o1 = torch.rand(E) * 0.5 + 0.5
og = torch.rand(E) * 0.02 + 0.02
o2 = torch.rand(E) * 0.05 + 0.05
p1 = interleave_idx(2 * I)[shuffle_idx(2 * I, 128)]
w1k = torch.stack([w1c[e][p1] for e in range(E)])
w2k = torch.stack([w2c[e][shuffle_idx(H, 128)] for e in range(E)])
ti = logits.float().argmax(-1)
wt = torch.sigmoid(logits.float().gather(1, ti[:, None]))[:, 0].bfloat16().float()
out = torch.zeros(T, H)
for t in range(T):
    e = int(ti[t])
    g = xv[t] @ w1v[e].T
    h = F.silu(g[I:] * og[e] * wt[t]) * (g[:I] * o1[e] * wt[t])
    h = to_fp8(h.clamp(-448, 448))[1]
    out[t] = (h @ w2v[e].T * o2[e]).bfloat16().float()
record("trtllm_fp8_per_tensor_scale_moe", CORE,
       {"kwarg_routing_logits": logits, "kwarg_hidden_states": ("fp8", xc),
        "kwarg_gemm1_weights": ("fp8", w1k), "kwarg_output1_scales_scalar": o1,
        "kwarg_output1_scales_gate_scalar": og, "kwarg_gemm2_weights": ("fp8", w2k),
        "kwarg_output2_scales_scalar": o2},
       {"kwarg_routing_bias": None, "kwarg_num_experts": E, "kwarg_top_k": 1,
        "kwarg_n_group": None, "kwarg_topk_group": None, "kwarg_intermediate_size": I,
        "kwarg_local_expert_offset": 0, "kwarg_local_num_experts": E,
        "kwarg_routed_scaling_factor": None, "kwarg_use_routing_scales_on_input": True,
        "kwarg_routing_method_type": 3},
       out.bfloat16())

# 4. trtllm_gen_routing (keywords; RoutingMethodType member), Renormalize of bf16 logits,
# local experts [2, 6), tile 4. The entries upstream leaves undefined (torch.empty) hold junk.
# gen_routing_outputs: the result tuple for expert ids `sel` [T, slots] (the local range
# [off, off + num_local)), weights `wts`; each expert's pairs in token order, or reversed.
junk = lambda n: torch.full((n,), 12345, dtype=torch.int32)
def gen_routing_outputs(sel, wts, num_experts, off, num_local, tile, reverse):
    T, KS = sel.shape
    filled = min(num_experts, T * KS)
    max_ctas = filled + (T * KS - filled) // tile
    e2p = torch.full((T, KS), -1, dtype=torch.int32)
    ids = torch.full((T, KS), -1, dtype=torch.int32)
    p2t, batch, limit = junk(max_ctas * tile), junk(max_ctas), junk(max_ctas)
    slot, cta = 0, 0
    for e in range(off, off + num_local):
        pairs = [(t, k) for t in range(T) for k in range(KS) if int(sel[t, k]) == e]
        for r, (t, k) in enumerate(reversed(pairs) if reverse else pairs):
            e2p[t, k] = slot + r
            p2t[slot + r] = t
            ids[t, k] = e
        for j in range((len(pairs) + tile - 1) // tile):
            batch[cta] = e - off
            limit[cta] = slot + min((j + 1) * tile, len(pairs))
            cta += 1
        slot += (len(pairs) + tile - 1) // tile * tile
    return [ids, wts, torch.tensor([slot], dtype=torch.int32), e2p, p2t, batch, limit,
            torch.tensor([cta], dtype=torch.int32)]

T, E, K, OFF, L, TILE = 6, 8, 2, 2, 4, 4
logits = torch.randn(T, E).to(torch.bfloat16)
tv, ti = torch.topk(logits, K, dim=-1)
wts = torch.softmax(tv.float(), -1).bfloat16()
record("trtllm_gen_routing", "flashinfer.fused_moe.trtllm_gen_routing",
       {"kwarg_routing_logits": logits},
       {"kwarg_routing_bias": None,
        "kwarg_routing_method": {"type": "enum", "name": "RoutingMethodType.Renormalize",
                                 "value": 1},
        "kwarg_top_k": K, "kwarg_local_expert_offset": OFF, "kwarg_local_num_experts": L,
        "kwarg_tile_tokens_dim": TILE},
       gen_routing_outputs(ti, wts, E, OFF, L, TILE, False))  # the tuple: result_0..7

# 5. trtllm_gen_routing with one fused shared expert: DeepSeekV3 of fp32 logits with a bias, 2
# groups of 4 (one kept), top-2, routed_scaling_factor 2.5, tile 4; the shared slot (expert 8,
# weight 1) appended per token. Each expert's pairs are written in reversed token order, as the
# GPU's shared-memory atomics may leave them (replay compares up to that order).
T, E, K, S, TILE, G, TG = 5, 8, 2, 1, 4, 2, 1
logits = torch.randn(T, E)
bias = (torch.rand(E) - 0.5) * 0.4
sg = torch.sigmoid(logits)
sb = sg + bias
gsc = sb.view(T, G, E // G).topk(2, dim=-1)[0].sum(-1)
keep = torch.zeros(T, G).scatter_(1, gsc.topk(TG, dim=-1)[1], 1.0)
keep = keep.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
ti = sb.masked_fill(keep == 0, float("-inf")).topk(K, dim=-1)[1]
tw = sg.gather(1, ti)
tw = tw / (tw.sum(-1, keepdim=True) + 1e-20) * 2.5
sel = torch.cat([ti, torch.full((T, S), E, dtype=torch.long)], 1)
wts = torch.cat([tw, torch.ones(T, S)], 1).bfloat16()
record("trtllm_gen_routing", "flashinfer.fused_moe.trtllm_gen_routing",
       {"kwarg_routing_logits": logits, "kwarg_routing_bias": bias},
       {"kwarg_routing_method": {"type": "enum", "name": "RoutingMethodType.DeepSeekV3",
                                 "value": 2},
        "kwarg_top_k": K, "kwarg_num_fused_shared_experts": S, "kwarg_n_group": G,
        "kwarg_topk_group": TG, "kwarg_routed_scaling_factor": 2.5, "kwarg_tile_tokens_dim": TILE},
       gen_routing_outputs(sel, wts, E + S, 0, E + S, TILE, True))

# 6. trtllm_fp8_block_scale_moe with one fused shared expert (upstream's DSv3_fused_shared
# configs, smaller), plain MajorK weights.
ds_fp8_block(4, 8, 128, 128, 2, 1, False)
)PY";
  if (!flashinfer::testing::run_upstream_dump_script("fi_moe_quant", body, 6)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

// trtllm_gen_routing, hand-checked: 3 tokens, 4 experts, top-2 Renormalize, local experts
// [1, 3), tile 4. Pairs (t, k) in token-major order: (0,0)->e0 (not local), (0,1)->e1,
// (1,0)->e1, (1,1)->e2, (2,0)->e3 (not local), (2,1)->e2. Expert 1 holds slots 0, 1 (padded to
// 4), expert 2 slots 4, 5; max_ctas = min(4, 6) + (6 - 4) / 4 = 4.
TEST(TrtllmGenRouting, HandChecked) {
  Tensor logits =
      Tensor::from_vector({4, 3, 0, 0, 0, 5, 4, 0, 0, 0, 1, 2}, {3, 4}, DType::kFloat32);
  const auto r = trtllm_gen_routing(logits, std::nullopt, RoutingMethodType::Renormalize, 2, 0, 0,
                                    0, 1, 2, 1.0, 4);
  auto v = [](const Tensor& t) { return t.to_double_vector(); };
  using V = std::vector<double>;
  EXPECT_EQ(v(std::get<0>(r)), (V{-1, 1, 1, 2, -1, 2}));
  const double hi = 1.0 / (1.0 + std::exp(-1.0)), lo = 1.0 - hi;  // softmax of (a, a - 1)
  EXPECT_TRUE(
      all_close(std::get<1>(r), V{hi, lo, hi, lo, hi, lo}, default_tolerance(DType::kBFloat16)));
  EXPECT_EQ(v(std::get<2>(r)), (V{8}));
  EXPECT_EQ(v(std::get<3>(r)), (V{-1, 0, 1, 4, -1, 5}));
  const V p2t = v(std::get<4>(r));
  ASSERT_EQ(p2t.size(), 16u);
  EXPECT_EQ(V(p2t.begin(), p2t.begin() + 6), (V{0, 1, -1, -1, 1, 2}));
  const V batch = v(std::get<5>(r)), limit = v(std::get<6>(r));
  ASSERT_EQ(batch.size(), 4u);
  EXPECT_EQ(V(batch.begin(), batch.begin() + 2), (V{0, 1}));
  EXPECT_EQ(V(limit.begin(), limit.begin() + 2), (V{2, 6}));
  EXPECT_EQ(v(std::get<7>(r)), (V{2}));
}

// DeepSeekV3 through trtllm_gen_routing selects what fused_topk_deepseek selects, with its
// weights in bf16; every local pair has a slot whose CTA belongs to its expert.
TEST(TrtllmGenRouting, DeepSeekV3MatchesFusedTopk) {
  const int64_t T = 33, E = 16, K = 4;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 61, -3.0, 3.0);
  Tensor bias = rand_tensor({E}, DType::kFloat32, 62, -0.3, 0.3);
  const auto r = trtllm_gen_routing(logits, bias, RoutingMethodType::DeepSeekV3, K, 0, 4, 2, 0,
                                    std::nullopt, 2.5, 8);
  Tensor vals = Tensor::zeros({T, K}, DType::kFloat32), idx = Tensor::zeros({T, K}, DType::kInt32);
  fused_topk_deepseek(logits, bias, 4, 2, K, 2.5, vals, idx);
  EXPECT_TRUE(all_close(std::get<0>(r), idx, {0, 0}));
  EXPECT_TRUE(all_close(std::get<1>(r), vals.to(DType::kBFloat16), {0, 0}));
  const auto ids = std::get<0>(r).to_double_vector(), e2p = std::get<3>(r).to_double_vector(),
             p2t = std::get<4>(r).to_double_vector(), batch = std::get<5>(r).to_double_vector();
  for (int64_t i = 0; i < T * K; ++i) {
    const auto slot = static_cast<size_t>(e2p[static_cast<size_t>(i)]);
    EXPECT_EQ(p2t[slot], static_cast<double>(i / K));
    EXPECT_EQ(batch[slot / 8], ids[static_cast<size_t>(i)]);
  }
}

// Upstream's grouped DeepSeekV3 routing kernel (n_group > 1) casts the bias to bf16 (its output
// weights' type) before adding it to the sigmoid scores; fused_topk_deepseek adds it in fp32.
// Biases 2^-12 apart collapse in bf16 and tie there (the lower index wins), so the selection is
// fused_topk_deepseek's with the bias rounded to bf16, not with the fp32 bias.
TEST(TrtllmGenRouting, GroupedDeepSeekV3AddsTheBiasAsBf16) {
  const int64_t T = 2, E = 64, K = 4;
  Tensor logits = Tensor::zeros({T, E}, DType::kFloat32);
  std::vector<double> b(static_cast<std::size_t>(E));
  for (int64_t e = 0; e < E; ++e) b[static_cast<std::size_t>(e)] = 1.0 + std::ldexp(e, -12);
  const Tensor bias = Tensor::from_vector(b, {E}, DType::kFloat32);
  const auto r = trtllm_gen_routing(logits, bias, RoutingMethodType::DeepSeekV3, K, 0, 4, 2, 0,
                                    std::nullopt, 1.0, 8);
  auto fused_ids = [&](const Tensor& bb) {
    Tensor vals = Tensor::zeros({T, K}, DType::kFloat32);
    Tensor idx = Tensor::zeros({T, K}, DType::kInt32);
    fused_topk_deepseek(logits, bb, 4, 2, K, 1.0, vals, idx);
    return idx.to_double_vector();
  };
  const auto got = std::get<0>(r).to_double_vector();
  EXPECT_EQ(got, fused_ids(bias.to(DType::kBFloat16).to(DType::kFloat32)));
  EXPECT_NE(got, fused_ids(bias));
  // Without groups upstream adds the fp32 bias (its custom routing kernel).
  const auto r1 = trtllm_gen_routing(logits, bias, RoutingMethodType::DeepSeekV3, K, 0, 1, 1, 0,
                                     std::nullopt, 1.0, 8);
  EXPECT_EQ(std::get<0>(r1).to_double_vector(), fused_ids(bias));
}

TEST(TrtllmGenRouting, BadInputAndRecordReplay) {
  const char* op = "trtllm_gen_routing";
  Tensor logits = rand_tensor({4, 8}, DType::kFloat32, 1);
  auto call = [&](const Tensor& l, int64_t k, int64_t nfse, int64_t tile) {
    (void)trtllm_gen_routing(l, std::nullopt, RoutingMethodType::Renormalize, k, nfse, 0, 0, 0,
                             std::nullopt, 1.0, tile);
  };
  EXPECT_FI_ERROR(call(logits.to(DType::kFloat16), 2, 0, 8), op, "routing_logits");
  EXPECT_FI_ERROR(call(logits, 9, 0, 8), op, "top_k");
  EXPECT_FI_ERROR(call(logits, 2, 1, 8), op, "routing_method_type");  // DeepSeekV3 only
  EXPECT_FI_ERROR(call(logits, 2, 0, 6), op, "tile_tokens_dim");
  EXPECT_FI_ERROR((void)trtllm_gen_routing(logits, Tensor::zeros({7}, DType::kFloat32),
                                           RoutingMethodType::DeepSeekV3, 2),
                  op, "routing_bias");
  EXPECT_FI_ERROR((void)trtllm_gen_routing(logits, std::nullopt, RoutingMethodType::Llama4, 2), op,
                  "top_k");
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)trtllm_gen_routing(logits, std::nullopt, RoutingMethodType::RenormalizeNaive, 2, 0, 0, 0,
                             2, 4);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  ASSERT_TRUE(calls[0].error.empty()) << calls[0].error;
  const OpDecl* d = OpRegistry::global().find("trtllm_gen_routing");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->module, "flashinfer.fused_moe.trtllm_gen_routing");
  std::vector<Value> args;
  for (const auto& a : calls[0].inputs) args.push_back(snapshot(a));
  CallArgs bound(*d, std::move(args));
  EXPECT_TRUE(same_values(d->invoke(bound), calls[0].result));
}

}  // namespace
}  // namespace flashinfer::testing
