// num_fused_shared_experts (docs/MOE.md, "Fused shared experts") in trtllm_gen_routing and
// trtllm_fp8_block_scale_moe: a hand-checked routing golden, the routing against
// fused_topk_deepseek plus the appended shared slots, the FFN against an fp64 formula and
// against the routed op fed the appended routing, bad input naming the argument, and
// record/replay. The FP4 op's shared experts are tested in test_moe_fp4.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "ops/moe_fp8_test_util.h"
#include "ops/moe_shared_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

using V = std::vector<double>;

V vec(const Tensor& t) { return t.to_double_vector(); }

// Three tokens, four experts in two groups of two, one kept group, top-1, one shared expert,
// tile 2. Token 0 and 2 pick expert 0 (group {0, 1} scores sigmoid(3) + sigmoid(-3) = 1 against
// 2 sigmoid(-3)), token 1 picks expert 2. Expanded slots (K + S = 2 per token): [0, 4], [2, 4],
// [0, 4]; routed weights sigmoid / sigmoid * 2.5 = 2.5, shared 1.0. Local experts 0..4 (the
// shared one is local expert 4): expert 0 holds pairs 0 and 4 (slots 0, 1), expert 2 pair 2
// (slot 2, then one padding slot), expert 4 pairs 1, 3, 5 (slots 4, 5, 6, then one padding).
TEST(TrtllmGenRoutingFusedShared, HandChecked) {
  Tensor logits =
      Tensor::from_vector({3, -3, -3, -3, -3, -3, 3, -3, 3, -3, -3, -3}, {3, 4}, DType::kFloat32);
  const auto r = trtllm_gen_routing(logits, std::nullopt, RoutingMethodType::DeepSeekV3, 1, 1, 2, 1,
                                    0, std::nullopt, 2.5, 2);
  EXPECT_EQ(vec(std::get<0>(r)), (V{0, 4, 2, 4, 0, 4}));
  EXPECT_EQ(vec(std::get<1>(r)), (V{2.5, 1, 2.5, 1, 2.5, 1}));
  EXPECT_EQ(vec(std::get<2>(r)), (V{8}));
  EXPECT_EQ(vec(std::get<3>(r)), (V{0, 4, 2, 5, 1, 6}));
  EXPECT_EQ(std::get<0>(r).shape(), Shape({3, 2}));
  EXPECT_EQ(std::get<3>(r).shape(), Shape({3, 2}));
  // max_ctas = min(E + S = 5, T * (K + S) = 6) + (6 - 5) / 2 = 5, max_padded = 10.
  const V p2t = vec(std::get<4>(r)), batch = vec(std::get<5>(r)), limit = vec(std::get<6>(r));
  ASSERT_EQ(p2t.size(), 10u);
  ASSERT_EQ(batch.size(), 5u);
  EXPECT_EQ(V(p2t.begin(), p2t.begin() + 3), (V{0, 2, 1}));
  EXPECT_EQ(V(p2t.begin() + 4, p2t.begin() + 7), (V{0, 1, 2}));
  EXPECT_EQ(V(batch.begin(), batch.begin() + 4), (V{0, 2, 4, 4}));
  EXPECT_EQ(V(limit.begin(), limit.begin() + 4), (V{2, 3, 6, 7}));
  EXPECT_EQ(vec(std::get<7>(r)), (V{4}));
}

// Larger: the routed slots are fused_topk_deepseek's, the S shared slots follow at weight 1,
// and every pair's slot lies in a CTA of its (local) expert.
TEST(TrtllmGenRoutingFusedShared, RoutedSlotsMatchFusedTopk) {
  const int64_t T = 19, E = 16, K = 4, S = 2;
  Tensor logits = rand_tensor({T, E}, DType::kFloat32, 71, -3.0, 3.0);
  Tensor bias = rand_tensor({E}, DType::kFloat32, 72, -0.3, 0.3);
  const auto r = trtllm_gen_routing(logits, bias, RoutingMethodType::DeepSeekV3, K, S, 4, 2, 0,
                                    std::nullopt, 2.5, 8);
  Tensor vals = Tensor::zeros({T, K}, DType::kFloat32), idx = Tensor::zeros({T, K}, DType::kInt32);
  fused_topk_deepseek(logits, bias, 4, 2, K, 2.5, vals, idx);
  const V ids = vec(std::get<0>(r)), w = vec(std::get<1>(r)), e2p = vec(std::get<3>(r)),
          p2t = vec(std::get<4>(r)), batch = vec(std::get<5>(r));
  const V want_ids = vec(idx), want_w = vec(vals.to(DType::kBFloat16));
  ASSERT_EQ(ids.size(), static_cast<size_t>(T * (K + S)));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K + S; ++k) {
      const size_t i = static_cast<size_t>(t * (K + S) + k);
      const size_t j = static_cast<size_t>(t * K + k);
      EXPECT_EQ(ids[i], k < K ? want_ids[j] : static_cast<double>(E + k - K)) << t << "," << k;
      EXPECT_EQ(w[i], k < K ? want_w[j] : 1.0) << t << "," << k;
      const auto slot = static_cast<size_t>(e2p[i]);
      EXPECT_EQ(p2t[slot], static_cast<double>(t));
      EXPECT_EQ(batch[slot / 8], ids[i]);
    }
  }
  // Each shared expert holds all T tokens: ceil(19 / 8) = 3 CTAs each, the last 2 * 3 CTAs.
  const auto ctas = static_cast<int64_t>(vec(std::get<7>(r))[0]);
  ASSERT_GE(ctas, 6);
  EXPECT_EQ(V(batch.begin() + ctas - 6, batch.begin() + ctas), (V{16, 16, 16, 17, 17, 17}));
}

TEST(TrtllmGenRoutingFusedShared, BadInputAndRecordReplay) {
  const char* op = "trtllm_gen_routing";
  Tensor logits = rand_tensor({4, 8}, DType::kFloat32, 1);
  auto call = [&](RoutingMethodType m, int64_t nfse, int64_t n_group, int64_t offset,
                  std::optional<int64_t> local) {
    (void)trtllm_gen_routing(logits, std::nullopt, m, 2, nfse, n_group, n_group > 0 ? 1 : 0, offset,
                             local, 1.0, 8);
  };
  const auto ds = RoutingMethodType::DeepSeekV3;
  EXPECT_FI_ERROR(call(ds, -1, 2, 0, std::nullopt), op, "num_fused_shared_experts");
  EXPECT_FI_ERROR(call(RoutingMethodType::Renormalize, 1, 0, 0, std::nullopt), op,
                  "routing_method_type");
  // Upstream raises for MiniMax2 and for DeepSeekV3 without groups (docs/MOE.md).
  EXPECT_FI_ERROR_CODE(call(RoutingMethodType::MiniMax2, 1, 0, 0, std::nullopt), op,
                       "routing_method_type", ErrorCode::kInvalidArgument);
  EXPECT_FI_ERROR_CODE(call(ds, 1, 0, 0, std::nullopt), op, "n_group", ErrorCode::kInvalidArgument);
  EXPECT_FI_ERROR_CODE(call(ds, 1, 1, 0, std::nullopt), op, "n_group", ErrorCode::kInvalidArgument);
  EXPECT_FI_ERROR_CODE(call(ds, 33, 2, 0, std::nullopt), op, "num_fused_shared_experts",
                       ErrorCode::kInvalidArgument);
  EXPECT_FI_ERROR_CODE(
      (void)trtllm_gen_routing(rand_tensor({1, 512}, DType::kFloat32, 2), std::nullopt, ds, 2, 1, 8,
                               1, 0, std::nullopt, 1.0, 8),
      op, "num_fused_shared_experts", ErrorCode::kInvalidArgument);
  EXPECT_FI_ERROR_CODE(call(ds, 1, 2, 4, 4), op, "local_expert_offset", ErrorCode::kUnsupported);
  EXPECT_FI_ERROR_CODE(call(ds, 1, 2, 0, 4), op, "local_expert_offset", ErrorCode::kUnsupported);
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    call(ds, 2, 2, 0, std::nullopt);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  ASSERT_TRUE(calls[0].error.empty()) << calls[0].error;
  EXPECT_TRUE(replays_identically(calls[0]));
}

// ---- trtllm_fp8_block_scale_moe ---------------------------------------------------------------

Tensor fp8(const Shape& shape, uint64_t seed) {
  return rand_tensor(shape, DType::kFloat32, seed, -3.0, 3.0).to(DType::kFloat8E4M3FN);
}

// Eight routed experts in four groups (two kept), top-2, S shared experts whose weights are
// rows 8 .. 8 + S - 1, DeepSeek FP8 block scales, Swiglu.
struct SharedCase {
  int64_t T = 5, E = 8, K = 2, S = 1, H = 128, I = 128;
  Tensor logits, bias, x, xs, w1, s1, w2, s2;
  explicit SharedCase(int64_t shared) : S(shared) {
    const int64_t R = E + S;
    logits = rand_tensor({T, E}, DType::kFloat32, 81, -3.0, 3.0);
    bias = rand_tensor({E}, DType::kFloat32, 82, -0.3, 0.3);
    x = fp8({T, H}, 83);
    xs = rand_tensor({H / 128, T}, DType::kFloat32, 84, 0.2, 0.4);
    w1 = fp8({R, 2 * I, H}, 85);
    s1 = rand_tensor({R, 2 * I / 128, H / 128}, DType::kFloat32, 86, 0.02, 0.04);
    w2 = fp8({R, H, I}, 87);
    s2 = rand_tensor({R, H / 128, I / 128}, DType::kFloat32, 88, 0.1, 0.2);
  }
  TrtllmMoeResult run(std::optional<int64_t> nfse, std::optional<Tensor> replay = std::nullopt,
                      bool do_finalize = true, int64_t method = 2, int64_t offset = 0,
                      int64_t local = 8,
                      Fp8QuantizationType q = Fp8QuantizationType::DeepSeekFp8) const {
    return trtllm_fp8_block_scale_moe(logits, bias, x, xs, w1, s1, w2, s2, E, K, 4, 2, I, offset,
                                      local, 2.5, method, false, WeightLayout::MajorK, do_finalize,
                                      std::nullopt, 8192, q, nfse, 3, true, replay);
  }
  // The routing of fused_topk_deepseek with the shared slots appended (ids E + s, weight 1).
  MoeTopkIds appended() const {
    Tensor vals = Tensor::zeros({T, K}, DType::kFloat32),
           idx = Tensor::zeros({T, K}, DType::kInt32);
    fused_topk_deepseek(logits, bias, 4, 2, K, 2.5, vals, idx);
    return append_shared_slots(idx, vals, E, S);
  }
  // fp64: every slot's expert FFN over the E + S weight rows (the shared test helper).
  V expected(const MoeTopkIds& routing) const {
    return moe_fp8::fp8_block_moe_reference(x, xs, w1, s1, w2, s2, routing, 0, E + S);
  }
};

TEST(TrtllmFp8BlockScaleMoeFusedShared, MatchesFormulaAndRoutedForm) {
  for (int64_t S : {int64_t{1}, int64_t{2}}) {
    SCOPED_TRACE("S " + std::to_string(S));
    const SharedCase c(S);
    Tensor replay = Tensor::full({c.T, c.K}, -7, DType::kInt16);
    const Tensor out = c.run(S, replay).tensors[0];
    const MoeTopkIds routing = c.appended();
    const V expect = c.expected(routing);
    EXPECT_TRUE(all_close(out, expect, default_tolerance(DType::kBFloat16)));
    // The shared experts contribute: without them the result moves well past the tolerance.
    const Tensor plain = trtllm_fp8_block_scale_moe(
        c.logits, c.bias, c.x, c.xs, c.w1.slice(0, 0, c.E), c.s1.slice(0, 0, c.E),
        c.w2.slice(0, 0, c.E), c.s2.slice(0, 0, c.E), c.E, c.K, 4, 2, c.I, 0, c.E, 2.5, 2);
    EXPECT_FALSE(all_close(plain, expect, default_tolerance(DType::kBFloat16)));
    // The routed op fed the appended routing over E + S experts gives the same bits.
    // (bf16 weights, as routing from logits keeps them; fp32 pairs would be taken as given.)
    const Tensor routed = trtllm_fp8_block_scale_routed_moe(
        MoeTopkIds(routing.ids, routing.weights->to(DType::kBFloat16)), std::nullopt, c.x, c.xs,
        c.w1, c.s1, c.w2, c.s2, c.E + S, c.K + S, std::nullopt, std::nullopt, c.I, 0, c.E + S,
        std::nullopt, 1);
    EXPECT_TRUE(all_close(out, routed, {0, 0}));
    // routing_replay_out holds the routed slots only ([T, top_k]).
    Tensor idx = routing.ids.slice(1, 0, c.K);
    EXPECT_TRUE(all_close(replay.to(DType::kInt32), idx, {0, 0}));
  }
}

TEST(TrtllmFp8BlockScaleMoeFusedShared, BadInputAndRecordReplay) {
  const char* op = "trtllm_fp8_block_scale_moe";
  const SharedCase c(1);
  EXPECT_FI_ERROR((void)c.run(-1), op, "num_fused_shared_experts");
  EXPECT_FI_ERROR((void)c.run(1, std::nullopt, true, 1), op, "routing_method_type");
  EXPECT_FI_ERROR((void)c.run(1, std::nullopt, true, 3), op, "routing_method_type");
  EXPECT_FI_ERROR_CODE((void)c.run(1, std::nullopt, true, 7), op, "routing_method_type",
                       ErrorCode::kInvalidArgument);
  // Upstream's launcher rejects fused shared experts under expert parallelism.
  EXPECT_FI_ERROR_CODE((void)c.run(1, std::nullopt, true, 2, 4, 4), op, "local_expert_offset",
                       ErrorCode::kInvalidArgument);
  // The weights must hold local_num_experts + S rows.
  EXPECT_FI_ERROR((void)c.run(2), op, "gemm1_weights");
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)c.run(1);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  ASSERT_TRUE(calls[0].error.empty()) << calls[0].error;
  EXPECT_TRUE(replays_identically(calls[0]));
}

// do_finalize=False with a shared expert: upstream's block-scale launcher allocates
// expert_weights [T, top_k + S] bf16 and the map [T * (top_k + S)] (docs/MOE.md, "Fused shared
// experts"): the shared slots' weights are 1, every pair is local (no expert parallelism), and
// finalizing the list by hand gives the finalized output bit for bit.
TEST(TrtllmFp8BlockScaleMoeFusedShared, UnfinalizedList) {
  const SharedCase c(1);
  const int64_t T = c.T, KS = c.K + c.S, H = c.H;
  const std::vector<Tensor> u = c.run(1, std::nullopt, false).tensors;
  const Tensor fin = c.run(1).tensors[0];
  expect_unfinalized_list(u, c.appended(), fin, T, KS, H);
}

// No CUDA kernel fuses shared experts here: a call on CUDA tensors is refused before any kernel
// runs, so replay on a GPU falls back to the CPU (skipped without a GPU).
TEST(TrtllmFp8BlockScaleMoeFusedShared, CudaCallRefused) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const SharedCase c(1);
  const Device d = Device::cuda(0);
  EXPECT_FI_ERROR_CODE(
      (void)trtllm_fp8_block_scale_moe(c.logits.to(d), c.bias.to(d), c.x.to(d), c.xs.to(d),
                                       c.w1.to(d), c.s1.to(d), c.w2.to(d), c.s2.to(d), c.E, c.K, 4,
                                       2, c.I, 0, c.E, 2.5, 2, false, WeightLayout::MajorK, true,
                                       std::nullopt, 8192, Fp8QuantizationType::DeepSeekFp8, 1),
      "trtllm_fp8_block_scale_moe", "num_fused_shared_experts", ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace flashinfer::testing
