// BlockSparseAttentionWrapper (flashinfer.sparse) against an fp64 formula over a grid (dtypes,
// fp8 KV, block shapes, M not a multiple of R, empty block rows, repeated and unordered block
// columns, per-block masks, packed masks, causal, soft cap), upstream's docstring example against
// single_prefill_with_kv_cache with the dense mask, bad input, record and replay.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "flashinfer/ops/sparse.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

using testing::int_tensor;

Tensor workspace() { return Tensor::zeros({1 << 16}, DType::kUInt8); }

struct Case {
  DType q, kv;
  int64_t M, N, R, C, hq, hkv, d;
  bool causal, with_mask, packed;
  double soft_cap;
};

// Block row i keeps block columns cols[i] (in that order).
const std::vector<std::vector<int32_t>>& layout_for(int64_t mb) {
  static std::vector<std::vector<int32_t>> l;
  l.clear();
  for (int64_t i = 0; i < mb; ++i) {
    if (i % 4 == 2) {
      l.push_back({});  // an empty block row
    } else if (i % 4 == 1) {
      l.push_back({3, 0, 3});  // unordered, repeated
    } else {
      l.push_back({0, 1, 2, 3});
    }
  }
  return l;
}

void run_case(const Case& c, uint64_t seed) {
  const int64_t mb = (c.M + c.R - 1) / c.R;
  ASSERT_EQ(c.N / c.C, 4);
  const auto& cols = layout_for(mb);
  std::vector<int32_t> ip{0}, ix;
  for (const auto& row : cols) {
    ix.insert(ix.end(), row.begin(), row.end());
    ip.push_back(static_cast<int32_t>(ix.size()));
  }
  const auto nnz = static_cast<int64_t>(ix.size());
  Tensor mask = Tensor::empty({nnz, c.R, c.C}, DType::kBool);
  auto keep = [&](int64_t blk, int64_t r, int64_t col) { return (blk + 2 * r + 3 * col) % 4 != 0; };
  for (int64_t b = 0; b < nnz; ++b) {
    for (int64_t r = 0; r < c.R; ++r) {
      for (int64_t col = 0; col < c.C; ++col) {
        mask.data<bool>()[(b * c.R + r) * c.C + col] = keep(b, r, col);
      }
    }
  }
  std::optional<Tensor> packed;
  if (c.with_mask && c.packed) {  // each block row's bits from a byte boundary, little-endian
    std::vector<uint8_t> bytes;
    for (int64_t i = 0; i < mb; ++i) {
      const int64_t rows = std::min<int64_t>((i + 1) * c.R, c.M) - i * c.R;
      std::vector<bool> bits;
      for (int64_t r = 0; r < rows; ++r) {
        for (int32_t b = ip[i]; b < ip[i + 1]; ++b) {
          for (int64_t col = 0; col < c.C; ++col) bits.push_back(keep(b, r, col));
        }
      }
      std::vector<uint8_t> row((bits.size() + 7) / 8, 0);
      for (std::size_t k = 0; k < bits.size(); ++k) {
        if (bits[k]) row[k / 8] |= static_cast<uint8_t>(1u << (k % 8));
      }
      bytes.insert(bytes.end(), row.begin(), row.end());
    }
    Tensor t = Tensor::empty({static_cast<int64_t>(bytes.size())}, DType::kUInt8);
    std::copy(bytes.begin(), bytes.end(), t.data<uint8_t>());
    packed = t;
  }
  BlockSparseAttentionWrapper w(workspace());
  const double sm = 0.6 / std::sqrt(static_cast<double>(c.d));
  w.plan(int_tensor(ip), int_tensor(ix), c.M, c.N, c.R, c.C, c.hq, c.hkv, c.d,
         c.with_mask && !c.packed ? std::optional<Tensor>(mask) : std::nullopt, packed, c.causal,
         "NONE", false, c.soft_cap > 0 ? std::optional<double>(c.soft_cap) : std::nullopt, sm,
         std::nullopt, std::nullopt, c.q, c.kv, c.q);
  Tensor q = testing::rand_tensor({c.M, c.hq, c.d}, c.q, seed);
  Tensor k = testing::rand_tensor({c.N, c.hkv, c.d}, c.kv, seed + 1);
  Tensor v = testing::rand_tensor({c.N, c.hkv, c.d}, c.kv, seed + 2);
  AttentionOutput r =
      w.run(q, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true);
  ASSERT_EQ(r.out.shape(), (Shape{c.M, c.hq, c.d}));
  const auto qd = q.to_double_vector(), kd = k.to_double_vector(), vd = v.to_double_vector();
  const int64_t row = c.hkv * c.d;
  std::vector<double> eo, el;
  for (int64_t i = 0; i < mb; ++i) {
    const int64_t r0 = i * c.R, rows = std::min<int64_t>(r0 + c.R, c.M) - r0;
    std::vector<double> kg, vg;
    for (int32_t b = ip[i]; b < ip[i + 1]; ++b) {
      const int64_t k0 = static_cast<int64_t>(ix[b]) * c.C;
      kg.insert(kg.end(), kd.begin() + k0 * row, kd.begin() + (k0 + c.C) * row);
      vg.insert(vg.end(), vd.begin() + k0 * row, vd.begin() + (k0 + c.C) * row);
    }
    const int64_t kv = (ip[i + 1] - ip[i]) * c.C;
    testing::RefOptions opt;
    opt.sm_scale = sm;
    opt.soft_cap = c.soft_cap;
    opt.causal = c.causal;
    if (c.with_mask) {
      opt.mask = [&, i](int64_t qi, int64_t j) { return keep(ip[i] + j / c.C, qi, j % c.C); };
    }
    std::vector<double> o, l;
    testing::ref_attention(testing::rows_of(qd, r0, r0 + rows, c.hq * c.d), kg, vg, rows, kv, c.hq,
                           c.hkv, c.d, c.d, opt, o, l);
    eo.insert(eo.end(), o.begin(), o.end());
    el.insert(el.end(), l.begin(), l.end());
  }
  EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(c.q)));
  EXPECT_TRUE(testing::all_close(r.lse, el, {1e-4, 1e-4}));
}

TEST(BlockSparseAttention, MatchesFp64FormulaOverGrid) {
  const Case cases[] = {
      {DType::kFloat32, DType::kFloat32, 12, 16, 3, 4, 4, 2, 64, false, false, false, 0.0},
      {DType::kFloat32, DType::kFloat32, 11, 8, 4, 2, 2, 2, 64, false, true, false, 0.0},
      {DType::kFloat32, DType::kFloat32, 10, 20, 3, 5, 2, 1, 64, false, true, true, 0.0},
      {DType::kFloat16, DType::kFloat16, 16, 32, 4, 8, 8, 2, 128, true, false, false, 3.0},
      {DType::kBFloat16, DType::kBFloat16, 7, 4, 1, 1, 4, 4, 64, false, false, false, 0.0},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 9, 12, 2, 3, 4, 2, 64, true, false, false, 0.0},
  };
  uint64_t seed = 70;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << dtype_torch_name(c.q) << "/" << dtype_torch_name(c.kv) << " M " << c.M << " N "
                 << c.N << " R " << c.R << " C " << c.C << (c.causal ? " causal" : "")
                 << (c.with_mask ? (c.packed ? " packed mask" : " mask") : "") << " cap "
                 << c.soft_cap);
    run_case(c, seed += 10);
  }
}

// Upstream's docstring example: 1 x 1 blocks, mask [[0, 0, 1], [1, 0, 1], [0, 1, 1]], equal to
// single_prefill_with_kv_cache with that dense custom mask.
TEST(BlockSparseAttention, DocstringExampleEqualsDenseMask) {
  BlockSparseAttentionWrapper w(workspace());
  w.plan(int_tensor({0, 1, 3, 5}), int_tensor({2, 0, 2, 1, 2}), 3, 3, 1, 1, 4, 2, 64);
  Tensor q = testing::rand_tensor({3, 4, 64}, DType::kFloat16, 1);
  Tensor k = testing::rand_tensor({3, 2, 64}, DType::kFloat16, 2);
  Tensor v = testing::rand_tensor({3, 2, 64}, DType::kFloat16, 3);
  Tensor o = w.run(q, k, v);
  Tensor mask = Tensor::empty({3, 3}, DType::kBool);
  const bool m[9] = {false, false, true, true, false, true, false, true, true};
  for (int i = 0; i < 9; ++i) mask.data<bool>()[i] = m[i];
  Tensor o_ref = single_prefill_with_kv_cache(q, k, v, std::nullopt, std::nullopt, std::nullopt,
                                              std::nullopt, mask);
  EXPECT_TRUE(testing::all_close(o, o_ref, {2e-3, 2e-3}));
}

TEST(BlockSparseAttention, BadInput) {
  const char* plan = "BlockSparseAttentionWrapper.plan";
  const char* run = "BlockSparseAttentionWrapper.run";
  EXPECT_FI_ERROR(BlockSparseAttentionWrapper(workspace(), "fa3"),
                  "BlockSparseAttentionWrapper.__init__", "backend");
  BlockSparseAttentionWrapper w(workspace());
  Tensor q = Tensor::zeros({4, 2, 64}, DType::kFloat16);
  Tensor k = Tensor::zeros({6, 1, 64}, DType::kFloat16), v = k.clone();
  EXPECT_FI_ERROR(w.run(q, k, v), run, "self");
  Tensor ip = int_tensor({0, 2, 3}), ix = int_tensor({0, 2, 1});
  auto call = [&](const Tensor& a, const Tensor& b, int64_t M, int64_t N, int64_t R, int64_t C) {
    w.plan(a, b, M, N, R, C, 2, 1, 64);
  };
  call(ip, ix, 4, 6, 2, 2);  // valid
  EXPECT_FI_ERROR(call(ip, ix, 4, 5, 2, 2), plan, "N");
  EXPECT_FI_ERROR(call(ip, ix, 4, 6, 0, 2), plan, "R");
  EXPECT_FI_ERROR(call(ip, ix, 4, 6, 2, 0), plan, "C");
  EXPECT_FI_ERROR(call(ip, ix, 6, 6, 2, 2), plan, "indptr");  // 3 block rows need 4 entries
  EXPECT_FI_ERROR(call(int_tensor({0, 3, 2}), ix, 4, 6, 2, 2), plan, "indptr");
  EXPECT_FI_ERROR(call(ip, int_tensor({0, 3, 1}), 4, 6, 2, 2), plan, "indices");
  EXPECT_FI_ERROR(call(ip, int_tensor({0, 1}), 4, 6, 2, 2), plan, "indices");
  EXPECT_FI_ERROR(w.plan(ip, ix, 4, 6, 2, 2, 2, 1, 64, Tensor::zeros({3, 2, 3}, DType::kBool)),
                  plan, "mask");
  EXPECT_FI_ERROR(
      w.plan(ip, ix, 4, 6, 2, 2, 2, 1, 64, std::nullopt, Tensor::zeros({9}, DType::kUInt8)), plan,
      "packed_mask");
  EXPECT_FI_ERROR(w.plan(ip, ix, 4, 6, 2, 2, 2, 1, 64, std::nullopt, std::nullopt, false, "ALIBI"),
                  plan, "pos_encoding_mode");
  EXPECT_FI_ERROR(
      w.plan(ip, ix, 4, 6, 2, 2, 2, 1, 64, std::nullopt, std::nullopt, false, "NONE", false,
             std::nullopt, std::nullopt, std::nullopt, std::nullopt, DType::kFloat16, std::nullopt,
             DType::kFloat16, true, Tensor::zeros({1, 2, 3}, DType::kBool)),
      plan, "block_mask");
  // Block row 1 has 2 rows but one block of 2 keys: causal fits; with R = 3 and M = 4 row 0
  // has 3 rows against 4 keys, row 1 one row against 2: fine; R = 4: 4 rows vs 4 keys.
  w.plan(ip, ix, 4, 6, 2, 2, 2, 1, 64, std::nullopt, std::nullopt, true);
  EXPECT_FI_ERROR(
      w.plan(int_tensor({0, 1, 3}), ix, 4, 6, 3, 2, 2, 1, 64, std::nullopt, std::nullopt, true),
      plan, "causal");
  call(ip, ix, 4, 6, 2, 2);
  w.run(q, k, v);  // valid
  EXPECT_FI_ERROR(w.run(Tensor::zeros({5, 2, 64}, DType::kFloat16), k, v), run, "q");
  EXPECT_FI_ERROR(w.run(q, Tensor::zeros({4, 1, 64}, DType::kFloat16), v), run, "k");
  EXPECT_FI_ERROR(w.run(q, k, v.to(DType::kBFloat16)), run, "v");
  EXPECT_FI_ERROR(w.run(q.to(DType::kBFloat16), k, v), run, "q");
  EXPECT_FI_ERROR(w.run(q, k, v, Tensor::zeros({2}, DType::kFloat32)), run, "scale_q");
  EXPECT_FI_ERROR(w.run(q, k, v, std::nullopt, std::nullopt, std::nullopt,
                        Tensor::zeros({4, 2, 32}, DType::kFloat16)),
                  run, "out");
}

TEST(BlockSparseAttention, RecordAndReplay) {
  std::vector<testing::RecordingObserver::Call> calls;
  std::unique_ptr<BlockSparseAttentionWrapper> w;
  {
    testing::RecordingScope scope;
    w = std::make_unique<BlockSparseAttentionWrapper>(workspace());
    Tensor mask = testing::rand_tensor({3, 2, 2}, DType::kFloat32, 9).to(DType::kBool);
    w->plan(int_tensor({0, 2, 3}), int_tensor({0, 2, 1}), 4, 6, 2, 2, 2, 1, 64, mask);
    w->run(testing::rand_tensor({4, 2, 64}, DType::kFloat16, 1),
           testing::rand_tensor({6, 1, 64}, DType::kFloat16, 2),
           testing::rand_tensor({6, 1, 64}, DType::kFloat16, 3), std::nullopt, std::nullopt,
           std::nullopt, Tensor::zeros({4, 2, 64}, DType::kFloat16), std::nullopt, true);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);
  for (std::size_t i = 1; i < calls.size(); ++i) {
    SCOPED_TRACE(calls[i].name);
    EXPECT_TRUE(testing::replays_identically(calls[i]));
  }
}

TEST(BlockSparseAttention, DumpReplaysWithEveryCallPassing) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_block_sparse_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  {
    BlockSparseAttentionWrapper w(workspace());
    w.plan(int_tensor({0, 1, 3, 5}), int_tensor({2, 0, 2, 1, 2}), 3, 3, 1, 1, 4, 2, 64);
    w.run(testing::rand_tensor({3, 4, 64}, DType::kFloat16, 1),
          testing::rand_tensor({3, 2, 64}, DType::kFloat16, 2),
          testing::rand_tensor({3, 2, 64}, DType::kFloat16, 3));
  }
  recorder::stop();
  const auto results = replay::replay_sequence(dir.string());
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer
