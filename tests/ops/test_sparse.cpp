// BlockSparseAttentionWrapper and VariableBlockSparseAttentionWrapper (flashinfer.sparse) against
// an fp64 formula over a grid (dtypes, fp8 KV, block shapes, M not a multiple of R, empty block
// rows, repeated and unordered block columns, per-block masks, packed masks, causal, soft cap),
// upstream's docstring example against single_prefill_with_kv_cache with the dense mask, bad input,
// record and replay.
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
#include "util/upstream_dump_py.h"

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
  // Modes are upstream's strings (ROPE_LLAMA / ALIBI: tests/ops/test_attention_pos_encoding.cpp).
  EXPECT_FI_ERROR(w.plan(ip, ix, 4, 6, 2, 2, 2, 1, 64, std::nullopt, std::nullopt, false, "alibi"),
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
  testing::replay_expecting_every_call_to_pass(dir, 3u);
  fs::remove_all(dir);
}

// ---- VariableBlockSparseAttentionWrapper --------------------------------------------------------

struct VarCase {
  DType q, kv;
  int64_t hq, hkv, d;
  bool causal;
  double soft_cap;
};

void run_var_case(const VarCase& c, uint64_t seed, bool with_out) {
  // 3 block rows, 4 block columns per kv head, sizes differing per head (each head's sums equal).
  const int64_t mb = 3, nb = 4, qo_len = 9, kv_len = 12, g = c.hq / c.hkv;
  std::vector<int32_t> rows, cols;
  std::vector<uint8_t> keep;
  for (int64_t h = 0; h < c.hkv; ++h) {
    const std::vector<int32_t> r =
        h % 2 ? std::vector<int32_t>{2, 3, 4} : std::vector<int32_t>{4, 0, 5};
    const std::vector<int32_t> k =
        h % 2 ? std::vector<int32_t>{3, 3, 3, 3} : std::vector<int32_t>{5, 1, 4, 2};
    rows.insert(rows.end(), r.begin(), r.end());
    cols.insert(cols.end(), k.begin(), k.end());
    for (int64_t i = 0; i < mb; ++i) {
      for (int64_t j = 0; j < nb; ++j) keep.push_back((i * 3 + j + h) % 4 != 1 || i == j);
    }
  }
  Tensor mask = Tensor::empty({c.hkv, mb, nb}, DType::kBool);
  for (std::size_t i = 0; i < keep.size(); ++i) mask.data<bool>()[i] = keep[i] != 0;
  Tensor rt = Tensor::empty({c.hkv, mb}, DType::kInt32),
         ct = Tensor::empty({c.hkv, nb}, DType::kInt32);
  std::copy(rows.begin(), rows.end(), rt.data<int32_t>());
  std::copy(cols.begin(), cols.end(), ct.data<int32_t>());
  VariableBlockSparseAttentionWrapper w(workspace());
  w.plan(mask, rt, ct, c.hq, c.hkv, c.d, c.causal, "NONE", false,
         c.soft_cap > 0 ? std::optional<double>(c.soft_cap) : std::nullopt, std::nullopt,
         std::nullopt, std::nullopt, true, c.q, c.kv);
  Tensor q = testing::rand_tensor({c.hq, qo_len, c.d}, c.q, seed);
  Tensor k = testing::rand_tensor({c.hkv, kv_len, c.d}, c.kv, seed + 1);
  Tensor v = testing::rand_tensor({c.hkv, kv_len, c.d}, c.kv, seed + 2);
  std::optional<Tensor> out, lse;
  if (with_out) {
    out = Tensor::zeros({c.hq, qo_len, c.d}, c.q);
    lse = Tensor::zeros({c.hq, qo_len}, DType::kFloat32);
  }
  AttentionOutput r = w.run(q, k, v, out, lse, true);
  if (with_out) {
    EXPECT_EQ(r.out.data_ptr(), out->data_ptr());
  }
  ASSERT_EQ(r.out.shape(), (Shape{c.hq, qo_len, c.d}));
  ASSERT_EQ(r.lse.shape(), (Shape{c.hq, qo_len}));
  const auto qd = q.to_double_vector(), kd = k.to_double_vector(), vd = v.to_double_vector();
  std::vector<double> eo(static_cast<std::size_t>(c.hq * qo_len * c.d)),
      el(static_cast<std::size_t>(c.hq * qo_len));
  for (int64_t h = 0; h < c.hkv; ++h) {
    int64_t r0 = 0;
    for (int64_t i = 0; i < mb; ++i) {
      const int64_t n = rows[h * mb + i];
      std::vector<double> kg, vg;
      int64_t start = 0;
      for (int64_t j = 0; j < nb; ++j) {
        if (keep[(h * mb + i) * nb + j]) {
          for (int64_t t = start; t < start + cols[h * nb + j]; ++t) {
            kg.insert(kg.end(), kd.begin() + (h * kv_len + t) * c.d,
                      kd.begin() + (h * kv_len + t + 1) * c.d);
            vg.insert(vg.end(), vd.begin() + (h * kv_len + t) * c.d,
                      vd.begin() + (h * kv_len + t + 1) * c.d);
          }
        }
        start += cols[h * nb + j];
      }
      // q rows [n, g, d] of this kv head's group.
      std::vector<double> qg;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t gi = 0; gi < g; ++gi) {
          const auto off = ((h * g + gi) * qo_len + r0 + t) * c.d;
          qg.insert(qg.end(), qd.begin() + off, qd.begin() + off + c.d);
        }
      }
      testing::RefOptions opt;
      opt.soft_cap = c.soft_cap;
      opt.causal = c.causal;
      std::vector<double> o, l;
      testing::ref_attention(qg, kg, vg, n, static_cast<int64_t>(kg.size()) / c.d, g, 1, c.d, c.d,
                             opt, o, l);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t gi = 0; gi < g; ++gi) {
          const int64_t hq = h * g + gi;
          for (int64_t x = 0; x < c.d; ++x) {
            eo[((hq * qo_len) + r0 + t) * c.d + x] = o[(t * g + gi) * c.d + x];
          }
          el[hq * qo_len + r0 + t] = l[t * g + gi];
        }
      }
      r0 += n;
    }
  }
  EXPECT_TRUE(testing::all_close(r.out, eo, testing::attention_tolerance(c.q)));
  EXPECT_TRUE(testing::all_close(r.lse, el, {1e-4, 1e-4}));
}

TEST(VariableBlockSparseAttention, MatchesFp64FormulaOverGrid) {
  const VarCase cases[] = {
      {DType::kFloat32, DType::kFloat32, 4, 2, 64, false, 0.0},
      {DType::kFloat32, DType::kFloat32, 2, 2, 64, true, 0.0},
      {DType::kFloat16, DType::kFloat16, 8, 2, 128, false, 2.0},
      {DType::kBFloat16, DType::kBFloat16, 3, 1, 64, true, 0.0},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 4, 4, 64, false, 0.0},
  };
  uint64_t seed = 90;
  for (const VarCase& c : cases) {
    for (bool with_out : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_torch_name(c.q) << "/" << dtype_torch_name(c.kv) << " hq " << c.hq
                   << " hkv " << c.hkv << " d " << c.d << (c.causal ? " causal" : "") << " cap "
                   << c.soft_cap << (with_out ? " out=" : ""));
      run_var_case(c, seed += 10, with_out);
    }
  }
}

// Upstream's run checks a given out / lse against the kernel layout ([Hkv * L, G, D] /
// [Hkv * L, G]: "(num_kv_heads qo_len) gqa_group_size"), fills them in that layout and returns
// head-major copies ("(num_kv_heads gqa_group_size) qo_len"), flashinfer/sparse.py.
TEST(VariableBlockSparseAttention, KernelLayoutBuffersAsUpstream) {
  VariableBlockSparseAttentionWrapper w(workspace());
  Tensor mask = Tensor::zeros({2, 2, 2}, DType::kBool);
  mask.fill_(1);
  w.plan(mask, int_tensor({2, 2, 1, 3}).view({2, 2}), int_tensor({3, 1, 2, 2}).view({2, 2}), 4, 2,
         64);
  const Tensor q = testing::rand_tensor({4, 4, 64}, DType::kFloat16, 70);
  const Tensor k = testing::rand_tensor({2, 4, 64}, DType::kFloat16, 71);
  const Tensor v = testing::rand_tensor({2, 4, 64}, DType::kFloat16, 72);
  const AttentionOutput want = w.run(q, k, v, std::nullopt, std::nullopt, true);
  Tensor out = Tensor::zeros({2 * 4, 2, 64}, DType::kFloat16);
  Tensor lse = Tensor::zeros({2 * 4, 2}, DType::kFloat32);
  const AttentionOutput got = w.run(q, k, v, out, lse, true);
  EXPECT_TRUE(testing::all_close(got.out, want.out, {0, 0}));
  EXPECT_TRUE(testing::all_close(got.lse, want.lse, {0, 0}));
  // The buffers hold the kernel layout: row (g_kv * L + i), column j is head g_kv * G + j.
  EXPECT_TRUE(testing::all_close(out.view({2, 4, 2, 64}).permute({0, 2, 1, 3}).contiguous(),
                                 want.out.view({2, 2, 4, 64}), {0, 0}));
  EXPECT_TRUE(testing::all_close(lse.view({2, 4, 2}).permute({0, 2, 1}).contiguous(),
                                 want.lse.view({2, 2, 4}), {0, 0}));
}

TEST(VariableBlockSparseAttention, BadInput) {
  const char* plan = "VariableBlockSparseAttentionWrapper.plan";
  const char* run = "VariableBlockSparseAttentionWrapper.run";
  VariableBlockSparseAttentionWrapper w(workspace());
  Tensor mask = Tensor::zeros({2, 2, 2}, DType::kBool);
  mask.fill_(1);
  Tensor rows = int_tensor({2, 2, 1, 3}).view({2, 2}), cols = int_tensor({3, 1, 2, 2}).view({2, 2});
  Tensor q = Tensor::zeros({4, 4, 64}, DType::kFloat16),
         k = Tensor::zeros({2, 4, 64}, DType::kFloat16);
  EXPECT_FI_ERROR(w.run(q, k, k), run, "self");
  w.plan(mask, rows, cols, 4, 2, 64);  // valid
  EXPECT_FI_ERROR(w.plan(mask.to(DType::kInt32), rows, cols, 4, 2, 64), plan, "block_mask_map");
  EXPECT_FI_ERROR(w.plan(Tensor::zeros({3, 2, 2}, DType::kBool), rows, cols, 4, 2, 64), plan,
                  "block_mask_map");
  EXPECT_FI_ERROR(w.plan(mask, int_tensor({2, 2, 1, 2}).view({2, 2}), cols, 4, 2, 64), plan,
                  "block_row_sz");
  EXPECT_FI_ERROR(w.plan(mask, rows, int_tensor({3, 1, 2, 1}).view({2, 2}), 4, 2, 64), plan,
                  "block_col_sz");
  EXPECT_FI_ERROR(w.plan(mask, rows, int_tensor({3, 1, 2}).view({1, 3}), 4, 2, 64), plan,
                  "block_col_sz");
  EXPECT_FI_ERROR(w.plan(mask, rows, cols, 4, 3, 64), plan, "num_kv_heads");
  // Upstream's run passes no ALiBi slopes to its kernel.
  EXPECT_FI_ERROR(w.plan(mask, rows, cols, 4, 2, 64, false, "ALIBI"), plan, "pos_encoding_mode");
  // Head 1, block row 1: 3 rows against 4 keys; head 0 row 0: 2 rows against 4: causal fits.
  w.plan(mask, rows, cols, 4, 2, 64, true);
  Tensor first_col = Tensor::zeros({2, 2, 2}, DType::kBool);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t r = 0; r < 2; ++r) first_col.data<bool>()[(h * 2 + r) * 2] = true;
  }
  w.plan(first_col, rows, cols, 4, 2, 64);  // not causal: fine
  EXPECT_FI_ERROR(w.plan(first_col, rows, cols, 4, 2, 64, true), plan, "causal");
  w.plan(mask, rows, cols, 4, 2, 64);
  w.run(q, k, k);  // valid
  EXPECT_FI_ERROR(w.run(Tensor::zeros({4, 5, 64}, DType::kFloat16), k, k), run, "q");
  EXPECT_FI_ERROR(w.run(q, Tensor::zeros({2, 5, 64}, DType::kFloat16), k), run, "k");
  EXPECT_FI_ERROR(w.run(q, k, k.to(DType::kBFloat16)), run, "v");
  EXPECT_FI_ERROR(w.run(q.to(DType::kBFloat16), k, k), run, "q");
  EXPECT_FI_ERROR(w.run(q, k, k, Tensor::zeros({4, 4, 64}, DType::kBFloat16)), run, "out");
  EXPECT_FI_ERROR(w.run(q, k, k, std::nullopt, Tensor::zeros({4, 5}, DType::kFloat32)), run, "lse");
}

TEST(VariableBlockSparseAttention, RecordAndReplayThroughADump) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_var_block_sparse_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::vector<testing::RecordingObserver::Call> calls;
  std::unique_ptr<VariableBlockSparseAttentionWrapper> live;
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg, [](const std::string&) {});
  {
    testing::RecordingScope scope;
    Tensor mask = Tensor::zeros({2, 2, 2}, DType::kBool);
    mask.data<bool>()[1] = mask.data<bool>()[2] = mask.data<bool>()[5] = mask.data<bool>()[7] =
        true;
    live = std::make_unique<VariableBlockSparseAttentionWrapper>(workspace());
    live->plan(mask, int_tensor({2, 2, 1, 3}).view({2, 2}), int_tensor({3, 1, 2, 2}).view({2, 2}),
               4, 2, 64, false, "NONE", false, std::nullopt, 0.2);
    live->run(testing::rand_tensor({4, 4, 64}, DType::kFloat16, 1),
              testing::rand_tensor({2, 4, 64}, DType::kFloat16, 2),
              testing::rand_tensor({2, 4, 64}, DType::kFloat16, 3), std::nullopt, std::nullopt,
              true);
    calls = scope.observer().calls;
  }
  recorder::stop();
  ASSERT_EQ(calls.size(), 3u);
  for (std::size_t i = 1; i < calls.size(); ++i) {
    SCOPED_TRACE(calls[i].name);
    EXPECT_TRUE(testing::replays_identically(calls[i]));
  }
  testing::replay_expecting_every_call_to_pass(dir, 3u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer
