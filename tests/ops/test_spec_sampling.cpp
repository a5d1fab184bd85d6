// chain_speculative_sampling: upstream's docstring example, the algorithm replayed with the same
// Philox draws (kernels/philox.h) on hand-built probabilities, the in-place counters, the
// default stream's determinism, every bad input, record/replay.
#include <gtest/gtest.h>

#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/philox.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

std::vector<int64_t> ints(const Tensor& t) {
  Tensor c = t.to(DType::kInt64).contiguous();
  return std::vector<int64_t>(c.data<int64_t>(), c.data<int64_t>() + c.numel());
}

TEST(ChainSpeculativeSampling, UpstreamDocstringExample) {
  Tensor draft =
      Tensor::from_vector({0.1, 0.2, 0.3, 0.4, 0.2, 0.3, 0.4, 0.1}, {1, 2, 4}, DType::kFloat32);
  Tensor ids = Tensor::from_vector({2, 1}, {1, 2}, DType::kInt32);
  Tensor target = Tensor::from_vector({0.0, 0.1, 0.6, 0.3, 1.0, 0.0, 0.0, 0.0, 0.7, 0.1, 0.1, 0.1},
                                      {1, 3, 4}, DType::kFloat32);
  // Token 2 is always accepted (u * 0.3 < 0.6), token 1 never (target 0): the residual
  // relu([1, 0, 0, 0] - draft) puts all mass on token 0, whatever the draws.
  for (int64_t seed : {0, 1, 12345}) {
    auto [out, acc, emi] =
        chain_speculative_sampling(draft, ids, target, std::nullopt, std::nullopt, true, seed, 7);
    EXPECT_EQ(ints(out), (std::vector<int64_t>{2, 0, -1}));
    EXPECT_EQ(ints(acc), (std::vector<int64_t>{1}));
    EXPECT_EQ(ints(emi), (std::vector<int64_t>{1}));
    EXPECT_EQ(out.dtype(), DType::kInt32);
  }
}

// Replays the documented algorithm with the same Philox stream for every request.
TEST(ChainSpeculativeSampling, MatchesAlgorithmWithSameDraws) {
  const int64_t b = 6, n = 3, v = 5;
  Tensor draft = rand_tensor({b, n, v}, DType::kFloat32, 1, 0.0, 1.0);
  Tensor target = rand_tensor({b, n + 1, v}, DType::kFloat32, 2, 0.0, 1.0);
  std::vector<double> idv;
  for (int64_t i = 0; i < b * n; ++i) idv.push_back(static_cast<double>((i * 3) % v));
  Tensor ids = Tensor::from_vector(idv, {b, n}, DType::kInt64);
  Tensor acc0 = Tensor::from_vector({5, 5, 5, 5, 5, 5}, {b}, DType::kInt32);
  Tensor emi0 = Tensor::zeros({b}, DType::kInt32);
  auto [out, acc, emi] = chain_speculative_sampling(draft, ids, target, acc0, emi0, true, 99, 12);
  EXPECT_EQ(acc.data_ptr(), acc0.data_ptr());
  EXPECT_EQ(emi.data_ptr(), emi0.data_ptr());
  // int64 ids give int32 tokens, as upstream's `.int()` casts; int64 counters are what `.int()`
  // makes of them, copies: the same tokens, and the caller's counters come back unchanged.
  EXPECT_EQ(out.dtype(), DType::kInt32);
  const Tensor acc64 = Tensor::from_vector({5, 5, 5, 5, 5, 5}, {b}, DType::kInt64);
  auto [out64, acc64_back, emi64_back] = chain_speculative_sampling(
      draft, ids, target, acc64, Tensor::zeros({b}, DType::kInt64), true, 99, 12);
  EXPECT_EQ(ints(out64), ints(out));
  EXPECT_EQ(ints(acc64_back), std::vector<int64_t>(b, 5));
  EXPECT_EQ(ints(emi64_back), std::vector<int64_t>(b, 0));
  const float* dp = draft.data<float>();
  const float* tp = target.data<float>();
  const auto idx = ints(ids), o = ints(out), a = ints(acc), e = ints(emi);
  for (int64_t r = 0; r < b; ++r) {
    kernels::PhiloxStream rng(99, static_cast<uint64_t>(r), 12);
    auto ok = [&](int64_t i) {
      const int64_t d = idx[r * n + i];
      return rng.next_uniform() * dp[(r * n + i) * v + d] < tp[(r * (n + 1) + i) * v + d];
    };
    int64_t pos = n;
    for (int64_t i = 0; i < n; ++i) {
      if (!ok(i)) {
        pos = i;
        break;
      }
      EXPECT_EQ(o[r * (n + 1) + i], idx[r * n + i]);
    }
    // From pos on each position is drawn again; pos itself is not counted (upstream 0.7.4).
    int64_t accepted = pos;
    for (int64_t i = pos; i < n; ++i) {
      const bool k = ok(i);
      if (i != pos && k) ++accepted;
    }
    EXPECT_EQ(a[r], 5 + accepted);
    EXPECT_EQ(e[r], pos);
    // The residual relu(target - draft) sampled by inverse CDF, here in fp64 (the kernels add
    // in fp32 in a fixed chunked order: test_spec_sampling_rules.cpp); a draw within 1e-5 of a
    // CDF step would be decided by that rounding and is not compared.
    std::vector<double> m(v);
    double sum = 0;
    for (int64_t j = 0; j < v; ++j) {
      m[j] = std::max(tp[(r * (n + 1) + pos) * v + j] - (pos < n ? dp[(r * n + pos) * v + j] : 0.f),
                      0.f);
      sum += m[j];
    }
    const double u = rng.next_uniform() * sum;
    double c = 0, nearest = 1.0;
    int64_t tok = -1, last = -1;
    for (int64_t j = 0; j < v; ++j) {
      if (!(m[j] > 0)) continue;
      c += m[j];
      last = j;
      nearest = std::min(nearest, std::abs(c - u) / sum);
      if (c > u && tok < 0) tok = j;
    }
    if (nearest > 1e-5) {
      EXPECT_EQ(o[r * (n + 1) + pos], tok >= 0 ? tok : last) << r;
    }
    for (int64_t i = pos + 1; i <= n; ++i) EXPECT_EQ(o[r * (n + 1) + i], -1);
  }
}

// A vocabulary of several 256-column chunks: all residual mass on one far column, so the token
// is that column whatever the draw; with no residual mass at all, the last column that had some
// is taken (here none: column 0).
TEST(ChainSpeculativeSampling, ResidualAcrossChunks) {
  const int64_t v = 1000, far = 777;
  std::vector<double> dv(2 * v, 0.0), tv(3 * v, 0.0);
  dv[5] = 1.0;       // draft token 5 at step 0, rejected: target gives it nothing
  tv[far] = 0.5;     // target at step 0: residual relu(target - draft) is all at `far`
  tv[v + 3] = 0.25;  // (steps 1 and 2 are never reached)
  Tensor draft = Tensor::from_vector(dv, {1, 2, v}, DType::kFloat32);
  Tensor target = Tensor::from_vector(tv, {1, 3, v}, DType::kFloat32);
  Tensor ids = Tensor::from_vector({5, 3}, {1, 2}, DType::kInt64);
  for (int64_t seed : {1, 2, 3}) {
    auto [out, acc, emi] =
        chain_speculative_sampling(draft, ids, target, std::nullopt, std::nullopt, true, seed, 0);
    EXPECT_EQ(ints(out), (std::vector<int64_t>{far, -1, -1}));
    EXPECT_EQ(ints(emi), (std::vector<int64_t>{0}));
  }
  Tensor flat = Tensor::zeros({1, 3, v}, DType::kFloat32);
  auto [out, acc, emi] = chain_speculative_sampling(draft, ids, flat, std::nullopt, std::nullopt,
                                                    true, int64_t{1}, int64_t{0});
  EXPECT_EQ(ints(out), (std::vector<int64_t>{0, -1, -1}));
}

// The CUDA kernel takes the CPU's draws and adds in its order: the same tokens and counters,
// exactly, on vocabularies of several chunks, every dtype, both id dtypes.
TEST(ChainSpeculativeSamplingCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t b = 8, n = 3;
  for (int64_t v : {7, 256, 32000}) {
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (DType id : {DType::kInt32, DType::kInt64}) {
        Tensor draft = rand_tensor({b, n, v}, dt, 11, 0.0, 1.0);
        Tensor target = rand_tensor({b, n + 1, v}, dt, 12, 0.0, 1.0);
        std::vector<double> idv;
        for (int64_t i = 0; i < b * n; ++i) idv.push_back(static_cast<double>((i * 7919) % v));
        Tensor ids = Tensor::from_vector(idv, {b, n}, id);
        Tensor acc = Tensor::full({b}, 2.0, id);
        auto [o_cpu, a_cpu, e_cpu] =
            chain_speculative_sampling(draft, ids, target, acc.clone(), std::nullopt, true, 42, 8);
        const Device cuda = Device::cuda(0);
        auto [o_gpu, a_gpu, e_gpu] = chain_speculative_sampling(
            draft.to(cuda), ids.to(cuda), target.to(cuda), acc.to(cuda), std::nullopt, true, 42, 8);
        EXPECT_EQ(ints(o_gpu.to(Device::cpu())), ints(o_cpu)) << v << " " << dtype_name(dt);
        EXPECT_EQ(ints(a_gpu.to(Device::cpu())), ints(a_cpu));
        EXPECT_EQ(ints(e_gpu.to(Device::cpu())), ints(e_cpu));
      }
    }
  }
  // Ids on the device are not copied to the host: a bad one is read at the clamped column (3 for
  // 9 in a vocabulary of 4) and emitted as given, never an out-of-bounds read.
  const Device cuda = Device::cuda(0);
  Tensor d = rand_tensor({1, 1, 4}, DType::kFloat32, 1, 0, 1);
  Tensor t = rand_tensor({1, 2, 4}, DType::kFloat32, 2, 0, 1);
  Tensor bad = Tensor::from_vector({9}, {1, 1}, DType::kInt32).to(cuda);
  Tensor three = Tensor::from_vector({3}, {1, 1}, DType::kInt32);
  for (int64_t seed : {1, 2, 3, 4}) {
    auto [o9, a9, e9] = chain_speculative_sampling(d.to(cuda), bad, t.to(cuda), std::nullopt,
                                                   std::nullopt, true, seed, 0);
    auto [o3, a3, e3] =
        chain_speculative_sampling(d, three, t, std::nullopt, std::nullopt, true, seed, 0);
    EXPECT_EQ(ints(a9.to(Device::cpu())), ints(a3));
    EXPECT_EQ(ints(e9.to(Device::cpu())), ints(e3));
    std::vector<int64_t> want = ints(o3);
    if (ints(e3)[0] == 1) want[0] = 9;
    EXPECT_EQ(ints(o9.to(Device::cpu())), want) << seed;
  }
  // Seed and offset as one-element device tensors, read by the kernel: the scalars' draws.
  Tensor draft = rand_tensor({b, n, 256}, DType::kFloat32, 11, 0.0, 1.0).to(cuda);
  Tensor target = rand_tensor({b, n + 1, 256}, DType::kFloat32, 12, 0.0, 1.0).to(cuda);
  Tensor ids = Tensor::from_vector({1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12,
                                    13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24},
                                   {b, n}, DType::kInt64)
                   .to(cuda);
  auto [os, as, es] =
      chain_speculative_sampling(draft, ids, target, std::nullopt, std::nullopt, true, 77, 12);
  auto [ot, at, et] =
      chain_speculative_sampling(draft, ids, target, std::nullopt, std::nullopt, true,
                                 Tensor::from_vector({77}, {1}, DType::kInt64).to(cuda),
                                 Tensor::from_vector({12}, {1}, DType::kInt32).to(cuda));
  EXPECT_EQ(ints(ot.to(Device::cpu())), ints(os.to(Device::cpu())));
  EXPECT_EQ(ints(at.to(Device::cpu())), ints(as.to(Device::cpu())));
}

// Seed and offset as one-element tensors (int64 or int32, any shape) draw what the integers do.
TEST(ChainSpeculativeSampling, SeedTensorsEqualIntegers) {
  Tensor draft = rand_tensor({4, 2, 8}, DType::kFloat32, 3, 0.0, 1.0);
  Tensor target = rand_tensor({4, 3, 8}, DType::kFloat32, 4, 0.0, 1.0);
  Tensor ids = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 0}, {4, 2}, DType::kInt32);
  auto [o1, a1, e1] = chain_speculative_sampling(draft, ids, target, std::nullopt, std::nullopt,
                                                 true, int64_t{21}, int64_t{6});
  auto [o2, a2, e2] =
      chain_speculative_sampling(draft, ids, target, std::nullopt, std::nullopt, true,
                                 Tensor::from_vector({21}, {1, 1}, DType::kInt64),
                                 Tensor::from_vector({6}, {1}, DType::kInt32));
  EXPECT_EQ(ints(o1), ints(o2));
  EXPECT_EQ(ints(a1), ints(a2));
  EXPECT_EQ(ints(e1), ints(e2));
  // One entry per request: request r draws with seed[r] and offset[r] (upstream 0.7.4; 0.6.18
  // read element 0), so request r's row equals that row of a call with its integers.
  const int64_t b = draft.size(0);
  std::vector<double> seeds(static_cast<std::size_t>(b), 99.0),
      offsets(static_cast<std::size_t>(b), 3.0);
  seeds[0] = 21;
  offsets[0] = 6;
  auto [o3, a3, e3] =
      chain_speculative_sampling(draft, ids, target, std::nullopt, std::nullopt, true,
                                 Tensor::from_vector(seeds, {b}, DType::kInt64),
                                 Tensor::from_vector(offsets, {b}, DType::kInt64));
  auto [o9, a9, e9] = chain_speculative_sampling(draft, ids, target, std::nullopt, std::nullopt,
                                                 true, int64_t{99}, int64_t{3});
  const auto r1 = ints(o1), r3 = ints(o3), r9 = ints(o9);
  const int64_t w = ids.size(1) + 1;
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t j = 0; j < w; ++j) EXPECT_EQ(r3[r * w + j], (r == 0 ? r1 : r9)[r * w + j]) << r;
  }
}

TEST(ChainSpeculativeSampling, DefaultStreamIsReproducible) {
  Tensor draft = rand_tensor({4, 2, 8}, DType::kBFloat16, 3, 0.0, 1.0);
  Tensor target = rand_tensor({4, 3, 8}, DType::kBFloat16, 4, 0.0, 1.0);
  Tensor ids = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 0}, {4, 2}, DType::kInt32);
  sampling_manual_seed(5);
  auto [o1, a1, e1] = chain_speculative_sampling(draft, ids, target);
  auto [o2, a2, e2] = chain_speculative_sampling(draft, ids, target);
  sampling_manual_seed(5);
  auto [o3, a3, e3] = chain_speculative_sampling(draft, ids, target);
  EXPECT_EQ(ints(o1), ints(o3));
  EXPECT_EQ(ints(a1), ints(a3));
  // The stream advances by batch * (n + 2) = 16 words a call, upstream 0.7.4's increment, and a
  // call draws at the offset before it advances: the first call used offset 0, the second 16,
  // as explicit calls do.
  auto [o4, a4, e4] = chain_speculative_sampling(draft, ids, target, std::nullopt, std::nullopt,
                                                 true, int64_t{5}, int64_t{16});
  EXPECT_EQ(ints(o2), ints(o4));
  EXPECT_EQ(ints(e2), ints(e4));
  auto [o5, a5, e5] = chain_speculative_sampling(draft, ids, target, std::nullopt, std::nullopt,
                                                 true, int64_t{5}, int64_t{0});
  EXPECT_EQ(ints(o1), ints(o5));
  EXPECT_EQ(ints(e1), ints(e5));
}

TEST(ChainSpeculativeSampling, BadInput) {
  Tensor d = rand_tensor({2, 2, 4}, DType::kFloat32, 1, 0, 1);
  Tensor t = rand_tensor({2, 3, 4}, DType::kFloat32, 2, 0, 1);
  Tensor ids = Tensor::zeros({2, 2}, DType::kInt32);
  const char* op = "chain_speculative_sampling";
  EXPECT_FI_ERROR(chain_speculative_sampling(rand_tensor({2, 4}, DType::kFloat32, 1), ids, t), op,
                  "draft_probs");
  EXPECT_FI_ERROR(chain_speculative_sampling(d, ids, rand_tensor({2, 2, 4}, DType::kFloat32, 1)),
                  op, "target_probs");
  EXPECT_FI_ERROR(chain_speculative_sampling(d, ids, t.to(DType::kFloat16)), op, "target_probs");
  EXPECT_FI_ERROR(chain_speculative_sampling(d, Tensor::zeros({2, 3}, DType::kInt32), t), op,
                  "draft_token_ids");
  EXPECT_FI_ERROR(chain_speculative_sampling(d, Tensor::zeros({2, 2}, DType::kFloat32), t), op,
                  "draft_token_ids");
  EXPECT_FI_ERROR(
      chain_speculative_sampling(d, Tensor::from_vector({0, 4, 1, 1}, {2, 2}, DType::kInt32), t),
      op, "draft_token_ids");
  EXPECT_FI_ERROR(chain_speculative_sampling(d, ids, t, Tensor::zeros({2}, DType::kFloat32)), op,
                  "maybe_output_accepted_token_num");
  EXPECT_FI_ERROR(
      chain_speculative_sampling(d, ids, t, std::nullopt, Tensor::zeros({3}, DType::kInt32)), op,
      "maybe_output_emitted_draft_token_num");
  EXPECT_FI_ERROR(
      chain_speculative_sampling(d, ids, t, std::nullopt, std::nullopt, true, int64_t{1}), op,
      "offset");
}

TEST(ChainSpeculativeSampling, RecordAndReplay) {
  Tensor d = rand_tensor({3, 2, 16}, DType::kFloat16, 1, 0, 1);
  Tensor t = rand_tensor({3, 3, 16}, DType::kFloat16, 2, 0, 1);
  Tensor ids = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, DType::kInt32);
  Tensor acc = Tensor::zeros({3}, DType::kInt32);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    chain_speculative_sampling(d, ids, t, acc, std::nullopt, true, int64_t{3}, int64_t{4});
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(replays_identically(calls[0]));
}

}  // namespace
}  // namespace flashinfer::testing
