// flashinfer.cute_dsl.sparse.bsa_attn_sm120.bsa_attn_sm120_blk64_fwd: a hand-checked row, an fp64
// dense softmax over each row's listed blocks (with multiplicity, GQA, the three block_sizes
// modes, the automatic tail mask, keys past Sk declared valid), empty rows, the returns, bad
// input, the declaration, record / replay, and on CUDA upstream's SM120-only rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
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

Tensor i32(std::vector<double> v, Shape shape) { return Tensor::from_vector(v, shape, kI32); }

// fp64: out and lse of row (b, r, h) over the listed keys (with multiplicity); keys past Sk
// declared valid score 0 against a zero value.
struct RowRef {
  std::vector<double> out;
  double lse;
};
RowRef ref_row(const Tensor& q, const Tensor& k, const Tensor& v, int64_t b, int64_t r, int64_t h,
               const std::vector<int64_t>& keys, double scale) {
  const int64_t Sq = q.size(1), Hq = q.size(2), Sk = k.size(1), Hkv = k.size(2);
  const int64_t hk = h / (Hq / Hkv);
  const auto qv = q.to_double_vector(), kv = k.to_double_vector(), vv = v.to_double_vector();
  std::vector<double> s;
  for (int64_t c : keys) {
    double acc = 0;
    if (c < Sk) {
      for (int64_t d = 0; d < 128; ++d) {
        acc += qv[((b * Sq + r) * Hq + h) * 128 + d] * kv[((b * Sk + c) * Hkv + hk) * 128 + d];
      }
    }
    s.push_back(acc * scale);
  }
  RowRef out{std::vector<double>(128, 0.0), -std::numeric_limits<double>::infinity()};
  if (keys.empty()) return out;
  double m = -1e300, l = 0;
  for (double x : s) m = std::max(m, x);
  for (size_t i = 0; i < keys.size(); ++i) {
    const double e = std::exp(s[i] - m);
    l += e;
    if (keys[i] >= Sk) continue;
    for (int64_t d = 0; d < 128; ++d) {
      out.out[d] += e * vv[((b * Sk + keys[i]) * Hkv + hk) * 128 + d];
    }
  }
  for (double& x : out.out) x /= l;
  out.lse = m + std::log(l);
  return out;
}

std::vector<int64_t> block_keys(const std::vector<int64_t>& blocks,
                                const std::vector<int64_t>& valid) {
  std::vector<int64_t> keys;
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (int64_t t = 0; t < valid[i]; ++t) keys.push_back(blocks[i] * 64 + t);
  }
  return keys;
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
    const auto out = r.out.to_double_vector(), lse = r.lse.to_double_vector();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hq; ++h) {
        for (int64_t row : {0, 37, 64, 69}) {
          const int64_t qt = row / 64, m = (b * Hq + h) * NQ + qt;
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
          const RowRef want = ref_row(q, k, v, b, row, h, block_keys(blocks, valid), 0.07);
          std::vector<double> got(out.begin() + ((b * Sq + row) * Hq + h) * 128,
                                  out.begin() + ((b * Sq + row) * Hq + h + 1) * 128);
          EXPECT_TRUE(all_close(got, want.out, default_tolerance(kBf)))
              << mode << " " << b << " " << h << " " << row;
          const double got_lse = lse[(b * Hq + h) * Sq + row];
          if (std::isinf(want.lse)) {
            EXPECT_TRUE(std::isinf(got_lse) && got_lse < 0);
            EXPECT_EQ(got, std::vector<double>(128, 0.0));
          } else {
            EXPECT_NEAR(got_lse, want.lse, 1e-4 * std::max(1.0, std::fabs(want.lse)));
          }
        }
      }
    }
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

TEST(BsaAttnDecl, SignatureModule) {
  const OpDecl* decl = OpRegistry::global().find(kOp);
  ASSERT_NE(decl, nullptr);
  EXPECT_EQ(decl->module, "flashinfer.cute_dsl.sparse.bsa_attn_sm120");
  EXPECT_EQ(decl->signature(),
            "(q, k, v, q2k_block_index, block_sparse_num, block_sizes=None, q2k_block_nums=None, "
            "softmax_scale=None, return_lse=False, out=None, lse=None)");
}

void run_bsa_calls() {
  Tensor q = rand_tensor({1, 80, 2, 128}, kBf, 30), k = rand_tensor({1, 100, 2, 128}, kBf, 31);
  Tensor v = rand_tensor({1, 100, 2, 128}, kBf, 32);
  (void)bsa_attn_sm120_blk64_fwd(q, k, v, i32({1, 0, 0, 1, 1, 1, 0, 0}, {1, 2, 2, 2}), 2,
                                 i32({64, 30}, {2}), std::nullopt, 0.1, true);
}

TEST(BsaAttnReplay, RecordAndReplay) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    run_bsa_calls();
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(replays_identically(calls[0]));
  EXPECT_EQ(dump_replay_all("bsa", run_bsa_calls), 1);
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

#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
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
    Tensor dq = cuda(q), dk = cuda(k), dv = cuda(v), di = cuda(index), dn = cuda(counts);
    Tensor ds = sizes ? cuda(*sizes) : Tensor();
    Tensor dout = Tensor::zeros({B, Sq, Hq, 128}, kBf, Device::cuda(0));
    Tensor dlse = Tensor::zeros({B, Hq, Sq}, DType::kFloat32, Device::cuda(0));
    kernels::BsaParams p;
    p.B = B, p.Sq = Sq, p.Sk = Sk, p.Hq = Hq, p.Hkv = Hkv, p.NQ = NQ, p.NK = NK, p.W = W;
    p.dtype = kBf;
    p.q = dq.data_ptr(), p.k = dk.data_ptr(), p.v = dv.data_ptr();
    for (int i = 0; i < 3; ++i) {
      p.q_s[i] = dq.stride(i), p.k_s[i] = dk.stride(i), p.v_s[i] = dv.stride(i);
      p.out_s[i] = dout.stride(i), p.lse_s[i] = dlse.stride(i);
    }
    p.index = di.data<int32_t>();
    p.nums = dn.data<int32_t>();
    if (sizes) p.block_sizes = ds.data<int32_t>(), p.block_sizes_mode = mode;
    p.scale = 0.07f;
    p.out = dout.data_ptr();
    p.lse = dlse.data<float>();
    kernels::cuda::bsa_attn_blk64_fwd(p, nullptr, false);
    EXPECT_TRUE(all_close(dout.to(Device::cpu()), c.out, {1e-2, 1e-2})) << mode;
    EXPECT_TRUE(all_close(dlse.to(Device::cpu()), c.lse, {1e-4, 1e-4})) << mode;
  }
}
#endif

}  // namespace
}  // namespace flashinfer::testing
