// flashinfer.cute_dsl.sparse.bsa_attn_sm120.bsa_attn_sm120_blk64_fwd: a hand-checked row, an fp64
// dense softmax over each row's listed blocks (with multiplicity, GQA, the three block_sizes
// modes, the automatic tail mask, keys past Sk declared valid), empty rows, the returns, bad
// input, the declaration, record / replay, and on CUDA upstream's SM120-only rule. Then its SM100
// siblings bsa_attn_sm100_blk128_fwd (128-token blocks, head dims 64 / 96, packed GQA metadata,
// no tail mask: keys past Sk count as zero keys, even counts, empty rows) and
// bsa_attn_sm100_blk64_fwd (bf16 MHA, one KV head or batch broadcast, W == block_sparse_num, lse
// only with return_lse), the same way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "api/device_props.h"
#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
#include "kernels/cuda/bsa_cuda.h"
#endif
#include "flashinfer/flashinfer.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;
constexpr DType kI32 = DType::kInt32;
constexpr const char* kOp = "bsa_attn_sm120_blk64_fwd";
constexpr const char* kOp128 = "bsa_attn_sm100_blk128_fwd";
constexpr const char* kOp64 = "bsa_attn_sm100_blk64_fwd";

Tensor i32(std::vector<double> v, Shape shape) { return Tensor::from_vector(v, shape, kI32); }

// fp64: out and lse of row (b, r, h) over the listed keys (with multiplicity); keys past Sk
// declared valid score 0 against a zero value.
struct RowRef {
  std::vector<double> out;
  double lse;
};
// q, k, v as doubles, converted once for many rows.
struct RefData {
  Tensor q, k, v;
  std::vector<double> qv, kv, vv;
  RefData(const Tensor& q_, const Tensor& k_, const Tensor& v_)
      : q(q_),
        k(k_),
        v(v_),
        qv(q_.to_double_vector()),
        kv(k_.to_double_vector()),
        vv(v_.to_double_vector()) {}
};

// Head dim from q; k and v may hold one batch for all (k.size(0) == 1).
RowRef ref_row(const RefData& in, int64_t b, int64_t r, int64_t h, const std::vector<int64_t>& keys,
               double scale) {
  const Tensor &q = in.q, &k = in.k;
  const int64_t Sq = q.size(1), Hq = q.size(2), D = q.size(3), Sk = k.size(1), Hkv = k.size(2);
  const int64_t hk = h / (Hq / Hkv), kb = k.size(0) == 1 ? 0 : b;
  const auto &qv = in.qv, &kv = in.kv, &vv = in.vv;
  std::vector<double> s;
  for (int64_t c : keys) {
    double acc = 0;
    if (c < Sk) {
      for (int64_t d = 0; d < D; ++d) {
        acc += qv[((b * Sq + r) * Hq + h) * D + d] * kv[((kb * Sk + c) * Hkv + hk) * D + d];
      }
    }
    s.push_back(acc * scale);
  }
  RowRef out{std::vector<double>(D, 0.0), -std::numeric_limits<double>::infinity()};
  if (keys.empty()) return out;
  double m = -1e300, l = 0;
  for (double x : s) m = std::max(m, x);
  for (size_t i = 0; i < keys.size(); ++i) {
    const double e = std::exp(s[i] - m);
    l += e;
    if (keys[i] >= Sk) continue;
    for (int64_t d = 0; d < D; ++d) {
      out.out[d] += e * vv[((kb * Sk + keys[i]) * Hkv + hk) * D + d];
    }
  }
  for (double& x : out.out) x /= l;
  out.lse = m + std::log(l);
  return out;
}

RowRef ref_row(const Tensor& q, const Tensor& k, const Tensor& v, int64_t b, int64_t r, int64_t h,
               const std::vector<int64_t>& keys, double scale) {
  return ref_row(RefData(q, k, v), b, r, h, keys, scale);
}

std::vector<int64_t> block_keys(const std::vector<int64_t>& blocks,
                                const std::vector<int64_t>& valid, int64_t block = 64) {
  std::vector<int64_t> keys;
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (int64_t t = 0; t < valid[i]; ++t) keys.push_back(blocks[i] * block + t);
  }
  return keys;
}

// Rows r (every batch and head) of out [B, Sq, Hq, D] and lse [B, Hq, Sq] (when given) against
// ref_row over keys_of(b, r, h); an empty row: zeros and -inf. (Some rows only: the fp64
// reference is slow under the sanitizers.)
template <class KeysOf>
void expect_rows(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                 const Tensor* lse, double scale, const std::vector<int64_t>& rows, KeysOf keys_of,
                 const std::string& what) {
  const int64_t B = q.size(0), Sq = q.size(1), Hq = q.size(2), D = q.size(3);
  const RefData in(q, k, v);
  const auto ov = out.to_double_vector();
  const auto lv = lse ? lse->to_double_vector() : std::vector<double>{};
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t r : rows) {
        const RowRef want = ref_row(in, b, r, h, keys_of(b, r, h), scale);
        const auto at = ov.begin() + ((b * Sq + r) * Hq + h) * D;
        const std::vector<double> got(at, at + D);
        ASSERT_TRUE(all_close(got, want.out, default_tolerance(q.dtype())))
            << what << " b " << b << " h " << h << " r " << r;
        if (!lse) continue;
        const double got_lse = lv[(b * Hq + h) * Sq + r];
        if (std::isinf(want.lse)) {
          ASSERT_TRUE(std::isinf(got_lse) && got_lse < 0) << what;
          ASSERT_EQ(got, std::vector<double>(D, 0.0)) << what;
        } else {
          ASSERT_NEAR(got_lse, want.lse, 1e-4 * std::max(1.0, std::fabs(want.lse))) << what;
        }
      }
    }
  }
}

TEST(BsaAttn, HandCheckedRow) {
  // One query, two keys: q = k0 = e0, k1 = 0, v0 = ones, v1 = zeros, scale 1: p0 = e / (e + 1).
  std::vector<double> qv(128, 0.0), kv(2 * 128, 0.0), vv(2 * 128, 0.0);
  qv[0] = 1.0, kv[0] = 1.0;
  for (int d = 0; d < 128; ++d) vv[d] = 1.0;
  Tensor q = Tensor::from_vector(qv, {1, 1, 1, 128}, kBf);
  Tensor k = Tensor::from_vector(kv, {1, 2, 1, 128}, kBf);
  Tensor v = Tensor::from_vector(vv, {1, 2, 1, 128}, kBf);
  auto r = bsa_attn_sm120_blk64_fwd(q, k, v, i32({0}, {1, 1, 1, 1}), 1, std::nullopt, std::nullopt,
                                    1.0, true);
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.out.to_double_vector()[5], e / (e + 1.0), 4e-3);
  EXPECT_NEAR(r.lse.to_double_vector()[0], std::log(e + 1.0), 1e-6);
  const Value rv = to_value(r);  // what a Python caller gets: (out, lse)
  ASSERT_EQ(rv.items().size(), 2u);
  EXPECT_TRUE(rv.items()[1].is_tensor());
}

TEST(BsaAttn, MatchesFp64WithDuplicatesGqaAndBlockSizeModes) {
  const int64_t B = 2, Sq = 70, Sk = 150, Hq = 4, Hkv = 2, NQ = 2, NK = 3, W = 3;
  Tensor q = rand_tensor({B, Sq, Hq, 128}, kBf, 1), k = rand_tensor({B, Sk, Hkv, 128}, kBf, 2);
  Tensor v = rand_tensor({B, Sk, Hkv, 128}, kBf, 3);
  // Rows list (2, 0, 0), (1), (2, 1), ...: counts from q2k_block_nums.
  std::vector<double> idx, nums;
  for (int64_t i = 0; i < B * Hq * NQ; ++i) {
    idx.insert(idx.end(), {static_cast<double>(i % 3), 0.0, static_cast<double>((i + 1) % 3)});
    nums.push_back(static_cast<double>(i % 4));  // 0 .. 3 (0: an empty row)
  }
  Tensor index = i32(idx, {B, Hq, NQ, W}), counts = i32(nums, {B, Hq, NQ});
  for (int mode = 0; mode <= 3; ++mode) {
    std::optional<Tensor> sizes;
    std::vector<double> sz;
    if (mode == 1) sz = {64, 40, 64}, sizes = i32(sz, {NK});  // block 2 past Sk: 42 zero keys
    if (mode == 2) sz = {64, 64, 22, 10, 64, 22}, sizes = i32(sz, {B, NK});
    if (mode == 3) {
      for (int64_t i = 0; i < B * Hq * NK; ++i)
        sz.push_back(static_cast<double>(5 + (i * 13) % 60));
      sizes = i32(sz, {B, Hq, NK});
    }
    auto r = bsa_attn_sm120_blk64_fwd(q, k, v, index, 1, sizes, counts, 0.07, true);
    auto keys_of = [&](int64_t b, int64_t row, int64_t h) {
      const int64_t m = (b * Hq + h) * NQ + row / 64;
      std::vector<int64_t> blocks, valid;
      for (int64_t j = static_cast<int64_t>(nums[m]) - 1; j >= 0; --j) {
        const int64_t blk = static_cast<int64_t>(idx[m * W + j]);
        blocks.push_back(blk);
        int64_t vb = blk == NK - 1 ? Sk - (NK - 1) * 64 : 64;
        if (mode == 1) vb = static_cast<int64_t>(sz[blk]);
        if (mode == 2) vb = static_cast<int64_t>(sz[b * NK + blk]);
        if (mode == 3) vb = static_cast<int64_t>(sz[(b * Hq + h) * NK + blk]);
        valid.push_back(vb);
      }
      return block_keys(blocks, valid);
    };
    expect_rows(q, k, v, r.out, &r.lse, 0.07, {0, 37, 63, 64, 69}, keys_of,
                "mode " + std::to_string(mode));
  }
}

TEST(BsaAttn, ReturnsCallerBuffersAndBlockSparseNum) {
  const int64_t B = 1, Sq = 64, Sk = 128, H = 2;
  Tensor q = rand_tensor({B, Sq, H, 128}, kBf, 10), k = rand_tensor({B, Sk, H, 128}, kBf, 11);
  Tensor v = rand_tensor({B, Sk, H, 128}, kBf, 12);
  Tensor out = Tensor::zeros({B, Sq, H, 128}, kBf),
         lse = Tensor::zeros({B, H, Sq}, DType::kFloat32);
  // block_sparse_num 1 of W = 2 listed: only the first entry counts.
  auto r = bsa_attn_sm120_blk64_fwd(q, k, v, i32({1, 0, 1, 0}, {1, 2, 1, 2}), 1, std::nullopt,
                                    std::nullopt, std::nullopt, false, out, lse);
  EXPECT_EQ(r.out.data_ptr(), out.data_ptr());
  EXPECT_EQ(r.lse.data_ptr(), lse.data_ptr());
  EXPECT_TRUE(to_value(r).items()[1].is_none());  // (out, None) without return_lse
  EXPECT_NE(lse.to_double_vector()[0], 0.0);      // written although not returned
  const RowRef want = ref_row(q, k, v, 0, 5, 1, block_keys({1}, {64}), 1.0 / std::sqrt(128.0));
  const auto ov = out.to_double_vector();
  std::vector<double> got(ov.begin() + (5 * H + 1) * 128, ov.begin() + (5 * H + 2) * 128);
  EXPECT_TRUE(all_close(got, want.out, default_tolerance(kBf)));
}

TEST(BsaAttnBadInput, ErrorsNameOpAndArgument) {
  Tensor q = rand_tensor({1, 64, 2, 128}, kBf, 20), k = rand_tensor({1, 64, 1, 128}, kBf, 21);
  Tensor v = rand_tensor({1, 64, 1, 128}, kBf, 22);
  Tensor idx = i32({0, 0}, {1, 2, 1, 1});
  EXPECT_FI_ERROR(bsa_attn_sm120_blk64_fwd(q.to(DType::kFloat32), k, v, idx, 1), kOp, "q");
  EXPECT_FI_ERROR(bsa_attn_sm120_blk64_fwd(q, k.to(DType::kFloat16), v, idx, 1), kOp, "k");
  EXPECT_FI_ERROR(bsa_attn_sm120_blk64_fwd(q.slice(3, 0, 64), k.slice(3, 0, 64), v, idx, 1), kOp,
                  "q");
  EXPECT_FI_ERROR(bsa_attn_sm120_blk64_fwd(q, k, v, idx, 2), kOp, "block_sparse_num");
  EXPECT_FI_ERROR(bsa_attn_sm120_blk64_fwd(q, k, v, i32({0, 1}, {1, 2, 1, 1}), 1), kOp,
                  "q2k_block_index");  // block 1 of 1
  EXPECT_FI_ERROR(bsa_attn_sm120_blk64_fwd(q, k, v, idx, 1, std::nullopt, i32({2, 0}, {1, 2, 1})),
                  kOp, "q2k_block_nums");  // 2 > W
  EXPECT_FI_ERROR(bsa_attn_sm120_blk64_fwd(q, k, v, i32({0}, {1, 1, 1, 1}), 1), kOp,
                  "q2k_block_index");  // per query head
  EXPECT_FI_ERROR(bsa_attn_sm120_blk64_fwd(q, k, v, idx, 1, i32({64, 64}, {2})), kOp,
                  "block_sizes");
}

TEST(BsaAttnDecl, SignaturesModules) {
  const char* sig64 =
      "(q, k, v, q2k_block_index, block_sparse_num, block_sizes=None, q2k_block_nums=None, "
      "softmax_scale=None, return_lse=False, out=None, lse=None)";
  for (const auto& [op, module, sig] :
       {std::tuple<const char*, const char*, const char*>{
            kOp, "flashinfer.cute_dsl.sparse.bsa_attn_sm120", sig64},
        {kOp64, "flashinfer.cute_dsl.sparse.bsa_attn_sm100_blk64", sig64},
        {kOp128, "flashinfer.cute_dsl.sparse.bsa_attn_sm100_blk128",
         "(q, k, v, q2k_block_index, block_sparse_num, block_sizes=None, q2k_block_nums=None, "
         "allow_empty_block_nums=True, softmax_scale=None, pack_gqa=None, return_lse=False, "
         "out=None, lse=None)"}}) {
    const OpDecl* decl = OpRegistry::global().find(op);
    ASSERT_NE(decl, nullptr) << op;
    EXPECT_EQ(decl->module, module);
    EXPECT_EQ(decl->signature(), sig);
  }
}

// One call of each of the three forwards.
void run_bsa_calls() {
  Tensor q = rand_tensor({1, 80, 2, 128}, kBf, 30), k = rand_tensor({1, 100, 2, 128}, kBf, 31);
  Tensor v = rand_tensor({1, 100, 2, 128}, kBf, 32);
  Tensor index = i32({1, 0, 0, 1, 1, 1, 0, 0}, {1, 2, 2, 2});
  (void)bsa_attn_sm120_blk64_fwd(q, k, v, index, 2, i32({64, 30}, {2}), std::nullopt, 0.1, true);
  (void)bsa_attn_sm100_blk64_fwd(q, k, v, index, 2, std::nullopt, std::nullopt, 0.1, true);
  // Packed GQA 2: [1, 2, ceil(160 / 128) = 2, 2].
  Tensor q4 = rand_tensor({1, 80, 4, 64}, kBf, 33), k2 = rand_tensor({1, 200, 2, 64}, kBf, 34);
  Tensor v2 = rand_tensor({1, 200, 2, 64}, kBf, 35);
  (void)bsa_attn_sm100_blk128_fwd(q4, k2, v2, index, 2, i32({128, 72}, {2}),
                                  i32({1, 2, 0, 2}, {1, 2, 2}), true, 0.1, std::nullopt, true);
}

TEST(BsaAttnReplay, RecordAndReplay) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_bsa_calls();
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);
  for (const auto& call : calls) EXPECT_TRUE(replays_identically(call)) << call.name;
  EXPECT_EQ(dump_replay_all("bsa", run_bsa_calls), 3);
}

// ---- bsa_attn_sm100_blk128_fwd ----

TEST(BsaAttnSm100Blk128, HandCheckedZeroKeysAndDuplicates) {
  // One query and one key (q = k0 = e0, v0 = ones, scale 1): block 0 listed twice (uniform mode
  // takes an even count) holds the real key and 127 zero keys past Sk, each counted twice:
  // out = 2e / (2e + 254), lse = ln(2e + 254).
  std::vector<double> qv(64, 0.0), kv(64, 0.0), vv(64, 1.0);
  qv[0] = 1.0, kv[0] = 1.0;
  Tensor q = Tensor::from_vector(qv, {1, 1, 1, 64}, kBf);
  Tensor k = Tensor::from_vector(kv, {1, 1, 1, 64}, kBf);
  Tensor v = Tensor::from_vector(vv, {1, 1, 1, 64}, kBf);
  auto r = bsa_attn_sm100_blk128_fwd(q, k, v, i32({0, 0}, {1, 1, 1, 2}), 2, std::nullopt,
                                     std::nullopt, true, 1.0, std::nullopt, true);
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.out.to_double_vector()[7], 2 * e / (2 * e + 254.0), 2e-3);
  EXPECT_NEAR(r.lse.to_double_vector()[0], std::log(2 * e + 254.0), 1e-5);
  // block_sizes saying 1 key: p = 1 exactly.
  r = bsa_attn_sm100_blk128_fwd(q, k, v, i32({0, 0}, {1, 1, 1, 2}), 2, i32({1}, {1}), std::nullopt,
                                true, 1.0, std::nullopt, true);
  EXPECT_EQ(r.out.to_double_vector()[7], 1.0);
  EXPECT_NEAR(r.lse.to_double_vector()[0], 1.0 + std::log(2.0), 1e-6);
}

// GQA 2 packs (blk128's default): metadata per KV head over packed rows r * 2 + h % 2, in
// 128-row blocks: [B, Hkv, ceil(2 * 150 / 128) = 3, W]. Counts 0 (empty: zeros, -inf), 1, 2, 3
// (odd counts are exact), duplicates; Sk 300: the last block's 84 keys past Sk are zero keys.
struct PackedCase {
  static constexpr int64_t B = 2, Sq = 150, Sk = 300, Hq = 4, Hkv = 2, NM = 3, W = 3, NK = 3;
  Tensor q, k, v, index, counts;
  std::vector<double> idx, nums;
};
PackedCase packed_case(int64_t D, uint64_t seed) {
  using P = PackedCase;
  PackedCase c;
  c.q = rand_tensor({P::B, P::Sq, P::Hq, D}, DType::kFloat16, seed);
  c.k = rand_tensor({P::B, P::Sk, P::Hkv, D}, DType::kFloat16, seed + 1);
  c.v = rand_tensor({P::B, P::Sk, P::Hkv, D}, DType::kFloat16, seed + 2);
  for (int64_t i = 0; i < P::B * P::Hkv * P::NM; ++i) {
    c.idx.insert(c.idx.end(),
                 {static_cast<double>(i % P::NK), 2.0, static_cast<double>(i % P::NK)});
    c.nums.push_back(static_cast<double>(i % 4));
  }
  c.index = i32(c.idx, {P::B, P::Hkv, P::NM, P::W});
  c.counts = i32(c.nums, {P::B, P::Hkv, P::NM});
  return c;
}

TEST(BsaAttnSm100Blk128, PackedGqaMetadataMatchesFp64) {
  constexpr int64_t B = PackedCase::B, Hq = PackedCase::Hq, Hkv = PackedCase::Hkv;
  constexpr int64_t NM = PackedCase::NM, W = PackedCase::W, NK = PackedCase::NK;
  const PackedCase pc = packed_case(64, 60);
  const Tensor &q = pc.q, &k = pc.k, &v = pc.v, &index = pc.index, &counts = pc.counts;
  const std::vector<double>&idx = pc.idx, &nums = pc.nums;
  auto r = bsa_attn_sm100_blk128_fwd(q, k, v, index, 2, std::nullopt, counts, true, 0.09,
                                     std::nullopt, true);
  auto keys_of = [&](int64_t b, int64_t t, int64_t h) {
    const int64_t row = (b * Hkv + h / 2) * NM + (t * 2 + h % 2) / 128;
    std::vector<int64_t> blocks;
    for (int64_t j = static_cast<int64_t>(nums[row]) - 1; j >= 0; --j) {
      blocks.push_back(static_cast<int64_t>(idx[row * W + j]));
    }
    return block_keys(blocks, std::vector<int64_t>(blocks.size(), 128), 128);
  };
  // Packed blocks of 64 tokens x 2 heads: rows on both sides of each boundary.
  expect_rows(q, k, v, r.out, &r.lse, 0.09, {0, 1, 63, 64, 65, 127, 128, 149}, keys_of, "packed");
  // Upstream's wrapper builds packed metadata by repeating each 128-token block's list g times
  // along the packed blocks: lists L[b][hk][qb] given packed (row (b, hk, mb) = L[b][hk][mb / 2])
  // and per query head (row (b, h, qb) = L[b][h / 2][qb], pack_gqa=False) attend alike.
  {
    const int64_t NQ = 2;
    std::vector<double> packed, per_head, packed_n, per_head_n;
    auto list = [&](int64_t b, int64_t hk, int64_t qb) {
      const int64_t i = (b * Hkv + hk) * NQ + qb;
      return std::vector<double>{static_cast<double>(i % NK), static_cast<double>((i + 1) % NK),
                                 2.0};
    };
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t hk = 0; hk < Hkv; ++hk) {
        for (int64_t mb = 0; mb < NM; ++mb) {
          const auto l = list(b, hk, mb / 2);
          packed.insert(packed.end(), l.begin(), l.end());
          packed_n.push_back(static_cast<double>(1 + (b + hk + mb / 2) % 3));
        }
      }
      for (int64_t h = 0; h < Hq; ++h) {
        for (int64_t qb = 0; qb < NQ; ++qb) {
          const auto l = list(b, h / 2, qb);
          per_head.insert(per_head.end(), l.begin(), l.end());
          per_head_n.push_back(static_cast<double>(1 + (b + h / 2 + qb) % 3));
        }
      }
    }
    auto a = bsa_attn_sm100_blk128_fwd(q, k, v, i32(packed, {B, Hkv, NM, W}), 2, std::nullopt,
                                       i32(packed_n, {B, Hkv, NM}), true, 0.09, std::nullopt, true);
    auto c = bsa_attn_sm100_blk128_fwd(q, k, v, i32(per_head, {B, Hq, NQ, W}), 2, std::nullopt,
                                       i32(per_head_n, {B, Hq, NQ}), true, 0.09, false, true);
    EXPECT_EQ(a.out.to_double_vector(), c.out.to_double_vector());
    EXPECT_EQ(a.lse.to_double_vector(), c.lse.to_double_vector());
  }
  // The same call with per-query-head metadata is refused: its shape is not the packed one.
  EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(
                      q, k, v, i32(std::vector<double>(B * Hq * 2 * W, 0), {B, Hq, 2, W}), 2),
                  kOp128, "q2k_block_index");
}

TEST(BsaAttnSm100Blk128, PerQueryHeadMetadataBlockSizesAndHeadDim96) {
  // pack_gqa=False (and GQA 3, which 128 does not divide, even when asked): metadata per query
  // head [B, Hq, NQ, W], row r / 128; block_sizes [NK] mask each block's tail; D 96, scale
  // 96^-0.5 by default; uniform block_sparse_num 2 of W 3.
  const int64_t B = 1, Sq = 130, Sk = 260, D = 96, NQ = 2, NK = 3, W = 3;
  for (const auto& [hq, hkv, pack] :
       {std::tuple<int64_t, int64_t, std::optional<bool>>{4, 2, false}, {3, 1, true}}) {
    const int64_t Hq = hq, Hkv = hkv;
    Tensor q = rand_tensor({B, Sq, Hq, D}, kBf, 70), k = rand_tensor({B, Sk, Hkv, D}, kBf, 71);
    Tensor v = rand_tensor({B, Sk, Hkv, D}, kBf, 72);
    std::vector<double> idx;
    for (int64_t i = 0; i < B * Hq * NQ; ++i) {
      idx.insert(idx.end(), {static_cast<double>((i + 1) % NK), static_cast<double>(i % NK), 0.0});
    }
    const std::vector<double> sz = {128, 100, 4};
    auto r = bsa_attn_sm100_blk128_fwd(q, k, v, i32(idx, {B, Hq, NQ, W}), 2, i32(sz, {NK}),
                                       std::nullopt, true, std::nullopt, pack, true);
    auto keys_of = [&](int64_t b, int64_t t, int64_t h) {
      const int64_t row = (b * Hq + h) * NQ + t / 128;
      std::vector<int64_t> blocks, valid;
      for (int64_t j = 1; j >= 0; --j) {
        blocks.push_back(static_cast<int64_t>(idx[row * W + j]));
        valid.push_back(static_cast<int64_t>(sz[blocks.back()]));
      }
      return block_keys(blocks, valid, 128);
    };
    expect_rows(q, k, v, r.out, &r.lse, 1.0 / std::sqrt(96.0), {0, 99, 127, 128, 129}, keys_of,
                "Hq " + std::to_string(Hq));
  }
}

TEST(BsaAttnSm100Blk128, ReturnsAndEmptyRows) {
  const int64_t B = 1, Sq = 64, Sk = 128, H = 2, D = 64;
  Tensor q = rand_tensor({B, Sq, H, D}, kBf, 80), k = rand_tensor({B, Sk, H, D}, kBf, 81);
  Tensor v = rand_tensor({B, Sk, H, D}, kBf, 82);
  Tensor index = i32({0, 0, 0, 0}, {1, 2, 1, 2});
  // Neither lse nor return_lse: (out, None).
  auto r = bsa_attn_sm100_blk128_fwd(q, k, v, index, 2);
  EXPECT_FALSE(r.lse.defined());
  EXPECT_TRUE(to_value(r).items()[1].is_none());
  // A caller's lse is written and returned without return_lse; out in place.
  Tensor out = Tensor::zeros({B, Sq, H, D}, kBf), lse = Tensor::zeros({B, H, Sq}, DType::kFloat32);
  r = bsa_attn_sm100_blk128_fwd(q, k, v, index, 2, std::nullopt, std::nullopt, true, std::nullopt,
                                std::nullopt, false, out, lse);
  EXPECT_EQ(r.out.data_ptr(), out.data_ptr());
  EXPECT_EQ(r.lse.data_ptr(), lse.data_ptr());
  EXPECT_TRUE(to_value(r).items()[1].is_tensor());
  const auto fresh = bsa_attn_sm100_blk128_fwd(q, k, v, index, 2, std::nullopt, std::nullopt, true,
                                               std::nullopt, std::nullopt, true);
  EXPECT_EQ(lse.to_double_vector(), fresh.lse.to_double_vector());
  EXPECT_EQ(out.to_double_vector(), fresh.out.to_double_vector());
  // Strided head dims (upstream's maybe_contiguous copy): the same result.
  Tensor qt = rand_tensor({B, Sq, D, H}, kBf, 80).transpose(2, 3);
  EXPECT_NE(qt.stride(-1), 1);
  EXPECT_EQ(bsa_attn_sm100_blk128_fwd(qt, k, v, index, 2).out.to_double_vector(),
            bsa_attn_sm100_blk128_fwd(qt.contiguous(), k, v, index, 2).out.to_double_vector());
  // Counts 0 and -1 are empty rows where allowed, refused otherwise.
  Tensor counts = i32({0, -1}, {1, 2, 1});
  r = bsa_attn_sm100_blk128_fwd(q, k, v, index, 2, std::nullopt, counts, true, std::nullopt,
                                std::nullopt, true);
  EXPECT_EQ(r.out.to_double_vector(), std::vector<double>(B * Sq * H * D, 0.0));
  for (double x : r.lse.to_double_vector()) EXPECT_TRUE(std::isinf(x) && x < 0);
  EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(q, k, v, index, 2, std::nullopt, counts, false), kOp128,
                  "q2k_block_nums");
}

TEST(BsaAttnSm100Blk128BadInput, ErrorsNameOpAndArgument) {
  Tensor q = rand_tensor({1, 64, 2, 64}, kBf, 90), k = rand_tensor({1, 64, 2, 64}, kBf, 91);
  Tensor v = rand_tensor({1, 64, 2, 64}, kBf, 92);
  Tensor idx = i32({0, 0, 0, 0}, {1, 2, 1, 2});
  EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(q.to(DType::kFloat32), k, v, idx, 2), kOp128, "q");
  EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(q, k.to(DType::kFloat16), v, idx, 2), kOp128, "k");
  EXPECT_FI_ERROR(
      bsa_attn_sm100_blk128_fwd(q.slice(3, 0, 32), k.slice(3, 0, 32), v.slice(3, 0, 32), idx, 2),
      kOp128, "q");  // head dim 32
  EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(q, k, v.slice(3, 0, 32), idx, 2), kOp128, "v");
  EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(q, k, v, idx, 1), kOp128, "block_sparse_num");  // odd
  EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(q, k, v, idx, 4), kOp128, "block_sparse_num");  // > W
  EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(q, k, v, i32({0, 1, 0, 0}, {1, 2, 1, 2}), 2), kOp128,
                  "q2k_block_index");  // block 1 of 1
  EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(q, k, v, idx, 2, i32({64, 64}, {1, 2})), kOp128,
                  "block_sizes");  // 1-D only
  EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(q, k, v, idx, 2, std::nullopt, i32({1}, {1, 1, 1})),
                  kOp128, "q2k_block_nums");
  EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(q, k, v, idx, 2, std::nullopt, std::nullopt, true,
                                            std::nullopt, std::nullopt, false,
                                            Tensor::zeros({1, 64, 2, 64}, DType::kFloat16)),
                  kOp128, "out");
}

// ---- bsa_attn_sm100_blk64_fwd ----

TEST(BsaAttnSm100Blk64, MatchesFp64MhaMqaAndBroadcastBatch) {
  // Uniform W == block_sparse_num == 2 with duplicates and no block_sizes (the last block's 42
  // keys past Sk 150 are zero keys); then counts with block_sizes [NK]; k and v with one head
  // (MQA by broadcast) and one batch for both.
  const int64_t B = 2, Sq = 70, Sk = 150, H = 2, NQ = 2, NK = 3;
  Tensor q = rand_tensor({B, Sq, H, 128}, kBf, 100);
  for (const auto& [kb, kh] : {std::pair<int64_t, int64_t>{B, H}, {B, 1}, {1, H}}) {
    Tensor k = rand_tensor({kb, Sk, kh, 128}, kBf, 101),
           v = rand_tensor({kb, Sk, kh, 128}, kBf, 102);
    std::vector<double> idx, nums;
    for (int64_t i = 0; i < B * H * NQ; ++i) {
      idx.insert(idx.end(), {static_cast<double>(i % NK), static_cast<double>((i + 2) % NK)});
      nums.push_back(static_cast<double>(1 + i % 2));
    }
    Tensor index = i32(idx, {B, H, NQ, 2});
    auto r = bsa_attn_sm100_blk64_fwd(q, k, v, index, 2, std::nullopt, std::nullopt, 0.08, true);
    expect_rows(
        q, k, v, r.out, &r.lse, 0.08, {0, 33, 63, 64, 69},
        [&](int64_t b, int64_t t, int64_t h) {
          const int64_t row = (b * H + h) * NQ + t / 64;
          return block_keys(
              {static_cast<int64_t>(idx[row * 2 + 1]), static_cast<int64_t>(idx[row * 2])},
              {64, 64});
        },
        "uniform " + std::to_string(kb) + "x" + std::to_string(kh));
    const std::vector<double> sz = {64, 30, 22};
    r = bsa_attn_sm100_blk64_fwd(q, k, v, index, 1, i32(sz, {NK}), i32(nums, {B, H, NQ}), 0.08,
                                 true);
    expect_rows(
        q, k, v, r.out, &r.lse, 0.08, {0, 33, 63, 64, 69},
        [&](int64_t b, int64_t t, int64_t h) {
          const int64_t row = (b * H + h) * NQ + t / 64;
          std::vector<int64_t> blocks, valid;
          for (int64_t j = static_cast<int64_t>(nums[row]) - 1; j >= 0; --j) {
            blocks.push_back(static_cast<int64_t>(idx[row * 2 + j]));
            valid.push_back(static_cast<int64_t>(sz[blocks.back()]));
          }
          return block_keys(blocks, valid);
        },
        "counts " + std::to_string(kb) + "x" + std::to_string(kh));
  }
}

TEST(BsaAttnSm100Blk64, OutIsCopiedLseOnlyWithReturnLse) {
  const int64_t B = 1, Sq = 64, Sk = 64, H = 2;
  Tensor q = rand_tensor({B, Sq, H, 128}, kBf, 110), k = rand_tensor({B, Sk, H, 128}, kBf, 111);
  Tensor v = rand_tensor({B, Sk, H, 128}, kBf, 112);
  Tensor index = i32({0, 0}, {1, 2, 1, 1});
  Tensor out = Tensor::zeros({B, Sq, H, 128}, kBf),
         lse = Tensor::zeros({B, H, Sq}, DType::kFloat32);
  auto r = bsa_attn_sm100_blk64_fwd(q, k, v, index, 1, std::nullopt, std::nullopt, std::nullopt,
                                    false, out, lse);
  EXPECT_EQ(r.out.data_ptr(), out.data_ptr());
  EXPECT_TRUE(to_value(r).items()[1].is_none());
  EXPECT_EQ(lse.to_double_vector(), std::vector<double>(B * H * Sq, 0.0));  // left as it was
  const auto fresh =
      bsa_attn_sm100_blk64_fwd(q, k, v, index, 1, std::nullopt, std::nullopt, std::nullopt, true);
  EXPECT_EQ(out.to_double_vector(), fresh.out.to_double_vector());
  r = bsa_attn_sm100_blk64_fwd(q, k, v, index, 1, std::nullopt, std::nullopt, std::nullopt, true,
                               out, lse);
  EXPECT_EQ(r.lse.data_ptr(), lse.data_ptr());
  EXPECT_EQ(lse.to_double_vector(), fresh.lse.to_double_vector());
  // Strided inputs are copied contiguous first, as upstream does: the same result.
  Tensor kt = rand_tensor({B, Sk, 128, H}, kBf, 111).transpose(2, 3);
  EXPECT_EQ(bsa_attn_sm100_blk64_fwd(q, kt, v, index, 1).out.to_double_vector(),
            bsa_attn_sm100_blk64_fwd(q, kt.contiguous(), v, index, 1).out.to_double_vector());
}

TEST(BsaAttnSm100Blk64BadInput, ErrorsNameOpAndArgument) {
  Tensor q = rand_tensor({1, 64, 4, 128}, kBf, 120), k = rand_tensor({1, 64, 4, 128}, kBf, 121);
  Tensor v = rand_tensor({1, 64, 4, 128}, kBf, 122);
  Tensor idx = i32({0, 0, 0, 0}, {1, 4, 1, 1});
  EXPECT_FI_ERROR(bsa_attn_sm100_blk64_fwd(q.to(DType::kFloat16), k, v, idx, 1), kOp64, "q");
  EXPECT_FI_ERROR(bsa_attn_sm100_blk64_fwd(q, k, v.to(DType::kFloat16), idx, 1), kOp64, "v");
  EXPECT_FI_ERROR(bsa_attn_sm100_blk64_fwd(q.slice(3, 0, 64), k, v, idx, 1), kOp64, "q");
  EXPECT_FI_ERROR(bsa_attn_sm100_blk64_fwd(q, k.slice(2, 0, 2), v.slice(2, 0, 2), idx, 1), kOp64,
                  "k");  // 2 KV heads for 4: no KV-head mapping
  EXPECT_FI_ERROR(
      bsa_attn_sm100_blk64_fwd(q, k, v, i32(std::vector<double>(8, 0), {1, 4, 1, 2}), 1), kOp64,
      "q2k_block_index");  // W 2 != block_sparse_num 1
  EXPECT_FI_ERROR(bsa_attn_sm100_blk64_fwd(q, k, v, idx, 0), kOp64, "block_sparse_num");
  EXPECT_FI_ERROR(
      bsa_attn_sm100_blk64_fwd(q, k, v, idx, 1, std::nullopt, i32({1, 0, 1, 1}, {1, 4, 1})), kOp64,
      "q2k_block_nums");  // an empty row
  EXPECT_FI_ERROR(
      bsa_attn_sm100_blk64_fwd(q, k, v, idx, 1, std::nullopt, std::nullopt, std::nullopt, false,
                               Tensor::zeros({1, 64, 4, 128}, DType::kFloat32)),
      kOp64, "out");
}

Tensor cuda(const Tensor& t) { return to_keep_layout(t, Device::cuda(0)); }

TEST(BsaAttnCuda, Sm120MatchesCpuElsewhereRefusedByName) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Tensor q = rand_tensor({2, 70, 4, 128}, kBf, 40), k = rand_tensor({2, 150, 2, 128}, kBf, 41);
  Tensor v = rand_tensor({2, 150, 2, 128}, kBf, 42);
  std::vector<double> idx;
  for (int i = 0; i < 2 * 4 * 2; ++i) idx.insert(idx.end(), {static_cast<double>(i % 3), 2, 0});
  Tensor index = i32(idx, {2, 4, 2, 3});
  if (api::compute_capability(Device::cuda(0)) / 10 != 12) {
    EXPECT_FI_ERROR(bsa_attn_sm120_blk64_fwd(cuda(q), cuda(k), cuda(v), cuda(index), 3), kOp, "q");
    return;
  }
  auto c = bsa_attn_sm120_blk64_fwd(q, k, v, index, 3, std::nullopt, std::nullopt, 0.05, true);
  auto g = bsa_attn_sm120_blk64_fwd(cuda(q), cuda(k), cuda(v), cuda(index), 3, std::nullopt,
                                    std::nullopt, 0.05, true);
  EXPECT_TRUE(all_close(g.out.to(Device::cpu()), c.out, {1e-2, 1e-2}));
  EXPECT_TRUE(all_close(g.lse.to(Device::cpu()), c.lse, {1e-4, 1e-4}));
}

TEST(BsaAttnSm100Cuda, RefusedByNameBelowSm100) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int cc = api::compute_capability(Device::cuda(0));
  Tensor q = cuda(rand_tensor({1, 64, 2, 128}, kBf, 140));
  Tensor k = cuda(rand_tensor({1, 64, 2, 128}, kBf, 141));
  Tensor v = cuda(rand_tensor({1, 64, 2, 128}, kBf, 142));
  if (cc / 10 != 10 && cc / 10 != 11) {
    EXPECT_FI_ERROR(bsa_attn_sm100_blk128_fwd(q, k, v, cuda(i32({0, 0, 0, 0}, {1, 2, 1, 2})), 2),
                    kOp128, "q");
  }
  if (cc != 100 && cc != 103) {
    EXPECT_FI_ERROR(bsa_attn_sm100_blk64_fwd(q, k, v, cuda(i32({0, 0}, {1, 2, 1, 1})), 1), kOp64,
                    "q");
  }
}

#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
// Runs the CUDA kernel itself on device copies of the call's tensors (`p` holds the geometry:
// block, dim, tail_mask, pack_g, op) and compares with the CPU call's result `c` (its lse only
// when it has one: the kernel's null-lse path otherwise). k and v of one batch are broadcast.
void expect_kernel_matches(kernels::BsaParams p, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& index, const Tensor& counts,
                           const std::optional<Tensor>& sizes, int mode, float scale,
                           const BsaOutput& c, const std::string& what) {
  Tensor dq = cuda(q), dk = cuda(k), dv = cuda(v), di = cuda(index);
  Tensor dn = counts.defined() ? cuda(counts) : Tensor();
  Tensor ds = sizes ? cuda(*sizes) : Tensor();
  Tensor dout = Tensor::zeros(c.out.shape(), q.dtype(), Device::cuda(0));
  Tensor dlse =
      c.lse.defined() ? Tensor::zeros(c.lse.shape(), DType::kFloat32, Device::cuda(0)) : Tensor();
  p.B = q.size(0), p.Sq = q.size(1), p.Hq = q.size(2), p.Sk = k.size(1), p.Hkv = k.size(2);
  p.NQ = (p.Sq + p.block - 1) / p.block, p.NK = (p.Sk + p.block - 1) / p.block;
  p.W = index.size(3);
  p.dtype = q.dtype();
  p.q = dq.data_ptr(), p.k = dk.data_ptr(), p.v = dv.data_ptr();
  for (int i = 0; i < 3; ++i) {
    p.q_s[i] = dq.stride(i), p.k_s[i] = dk.stride(i), p.v_s[i] = dv.stride(i);
    p.out_s[i] = dout.stride(i);
    if (dlse.defined()) p.lse_s[i] = dlse.stride(i);
  }
  if (k.size(0) == 1) p.k_s[0] = 0, p.v_s[0] = 0;
  p.index = di.data<int32_t>();
  p.nums = counts.defined() ? dn.data<int32_t>() : nullptr;
  if (sizes) p.block_sizes = ds.data<int32_t>(), p.block_sizes_mode = mode;
  p.scale = scale;
  p.out = dout.data_ptr();
  p.lse = dlse.defined() ? dlse.data<float>() : nullptr;
  kernels::cuda::bsa_attn_fwd(p, nullptr, false);
  EXPECT_TRUE(all_close(dout.to(Device::cpu()), c.out, {1e-2, 1e-2})) << what;
  if (dlse.defined()) {
    EXPECT_TRUE(all_close(dlse.to(Device::cpu()), c.lse, {1e-4, 1e-4})) << what;
  }
}

// The SM100 blk64 call's parameters on the kernel itself, on any GPU: one batch and one head of
// keys broadcast (MQA), uniform W == block_sparse_num, no tail mask, no lse written.
TEST(BsaAttnCuda, KernelMatchesCpuForSm100Blk64OnAnyGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t B = 2, Sq = 70, Sk = 150, H = 4, NQ = 2, NK = 3;
  Tensor q = rand_tensor({B, Sq, H, 128}, kBf, 160), k = rand_tensor({1, Sk, 1, 128}, kBf, 161);
  Tensor v = rand_tensor({1, Sk, 1, 128}, kBf, 162);
  std::vector<double> idx;
  for (int64_t i = 0; i < B * H * NQ; ++i) {
    idx.insert(idx.end(), {static_cast<double>(i % NK), static_cast<double>((i + 2) % NK)});
  }
  Tensor index = i32(idx, {B, H, NQ, 2});
  const BsaOutput c = bsa_attn_sm100_blk64_fwd(q, k, v, index, 2, std::nullopt, std::nullopt, 0.08);
  ASSERT_FALSE(c.lse.defined());
  kernels::BsaParams p;
  p.op = kOp64, p.block = 64, p.dim = 128, p.tail_mask = false, p.block_sparse_num = 2;
  expect_kernel_matches(p, q, k, v, index, Tensor(), std::nullopt, 0, 0.08f, c, "blk64");
}

// The SM100 blk128 call's parameters on the kernel itself, on any GPU: head dim 96, 128-token
// blocks, packed GQA metadata, no tail mask (keys past Sk as zero keys), block_sizes [NK].
TEST(BsaAttnCuda, KernelMatchesCpuForSm100Blk128OnAnyGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (const int64_t D : {64, 96}) {
    const PackedCase pc = packed_case(D, 150);
    const Tensor &q = pc.q, &k = pc.k, &v = pc.v, &index = pc.index, &counts = pc.counts;
    for (bool sizes : {false, true}) {
      std::optional<Tensor> bs;
      if (sizes) bs = i32({128, 70, 128}, {PackedCase::NK});
      const BsaOutput c =
          bsa_attn_sm100_blk128_fwd(q, k, v, index, 2, bs, counts, true, 0.09, std::nullopt, true);
      kernels::BsaParams p;
      p.op = kOp128, p.block = 128, p.dim = D, p.tail_mask = false;
      p.pack_g = PackedCase::Hq / PackedCase::Hkv;
      expect_kernel_matches(p, q, k, v, index, counts, bs, 1, 0.09f, c,
                            "D " + std::to_string(D) + (sizes ? " sizes" : " none"));
    }
  }
}

// The kernel itself, below the API's SM120 rule: it uses no SM120-only instruction, so any GPU
// runs it (the lent H100s / H200s included) against the CPU reference, counts, duplicates and
// all three block_sizes modes.
TEST(BsaAttnCuda, KernelMatchesCpuOnAnyGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t B = 2, Sq = 70, Sk = 150, Hq = 4, Hkv = 2, NQ = 2, NK = 3, W = 3;
  Tensor q = rand_tensor({B, Sq, Hq, 128}, kBf, 50), k = rand_tensor({B, Sk, Hkv, 128}, kBf, 51);
  Tensor v = rand_tensor({B, Sk, Hkv, 128}, kBf, 52);
  std::vector<double> idx, nums;
  for (int64_t i = 0; i < B * Hq * NQ; ++i) {
    idx.insert(idx.end(), {static_cast<double>(i % 3), 0.0, static_cast<double>((i + 1) % 3)});
    nums.push_back(static_cast<double>(i % 4));
  }
  Tensor index = i32(idx, {B, Hq, NQ, W}), counts = i32(nums, {B, Hq, NQ});
  for (int mode = 0; mode <= 3; ++mode) {
    std::optional<Tensor> sizes;
    if (mode == 1) sizes = i32({64, 40, 64}, {NK});
    if (mode == 2) sizes = i32({64, 64, 22, 10, 64, 22}, {B, NK});
    if (mode == 3) {
      std::vector<double> sz;
      for (int64_t i = 0; i < B * Hq * NK; ++i)
        sz.push_back(static_cast<double>(5 + (i * 13) % 60));
      sizes = i32(sz, {B, Hq, NK});
    }
    const BsaOutput c = bsa_attn_sm120_blk64_fwd(q, k, v, index, 1, sizes, counts, 0.07, true);
    expect_kernel_matches(kernels::BsaParams{}, q, k, v, index, counts, sizes, mode, 0.07f, c,
                          "mode " + std::to_string(mode));
  }
}
#endif

}  // namespace
}  // namespace flashinfer::testing
