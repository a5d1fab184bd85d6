// flashinfer.comm.trtllm_moe_alltoall (MoeAlltoAll and the moe_a2a_* functions beneath it) with
// ranks as threads (comm::ThreadGroup):
// the expert split and the combine's sum order by hand; the workspace sizes by hand; dispatch
// delivering each token once to each rank that owns one of its experts, in token order, with
// the counts, sanitized ids and EPLB statistics; combine summing each token's ranks' results
// against the formula (exact on integers), through the workspace and in low precision; the rank
// mask; checkpointing; upstream's refusals; the recorded ranks replayed together; CUDA against
// the CPU when a GPU is visible (all ranks on one device).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/tensor_io.h"
#include "kernels/moe_a2a_params.h"
#include "ops/comm_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;

// ---- rules by hand ---------------------------------------------------------------------------

TEST(MoeA2aRules, ExpertsSplitInContiguousBlocks) {
  using kernels::moe_a2a_target_rank;
  // 10 experts on 4 ranks: 3, 3, 2, 2.
  const int want[10] = {0, 0, 0, 1, 1, 1, 2, 2, 3, 3};
  for (int e = 0; e < 10; ++e) EXPECT_EQ(moe_a2a_target_rank(e, 10, 4), want[e]) << e;
  // 8 on 4: 2 each.
  for (int e = 0; e < 8; ++e) EXPECT_EQ(moe_a2a_target_rank(e, 8, 4), e / 2);
  EXPECT_EQ(moe_a2a_target_rank(6, 7, 3), 2);  // 3, 2, 2
  EXPECT_EQ(moe_a2a_target_rank(2, 7, 3), 0);
  EXPECT_EQ(moe_a2a_target_rank(3, 7, 3), 1);
}

TEST(MoeA2aRules, CombineSumsInUpstreamsFixedOrder) {
  using kernels::moe_a2a_tree_sum;
  auto of = [](std::vector<float> v) {
    return [v](int k) { return v[static_cast<std::size_t>(k)]; };
  };
  // top_k 4 pairwise: (1e8 + 1) + (-1e8 + 1) = 1e8 - 1e8 = 0; left to right would give 1.
  EXPECT_EQ(moe_a2a_tree_sum(4, of({1e8f, 1.0f, -1e8f, 1.0f})), 0.0f);
  // top_k 12 left to right: ((1e8 + 1) - 1e8) + 1 + 0... = 1.
  std::vector<float> v12(12, 0.0f);
  v12[0] = 1e8f;
  v12[1] = 1.0f;
  v12[2] = -1e8f;
  v12[3] = 1.0f;
  EXPECT_EQ(moe_a2a_tree_sum(12, of(v12)), 1.0f);
  // Random values against the trees written out (10 and 22 are not plain balanced trees).
  std::vector<float> a(22);
  uint32_t x = 12345;
  for (float& f : a) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<int32_t>(x >> 8)) * 1.37e-3f;
  }
  auto P = [&](int i) { return a[i] + a[i + 1]; };
  const float t10 = ((P(0) + P(2)) + (P(4) + P(6))) + P(8);
  EXPECT_EQ(moe_a2a_tree_sum(10, of(a)), t10);
  const float t6 = (P(0) + P(2)) + P(4);
  EXPECT_EQ(moe_a2a_tree_sum(6, of(a)), t6);
  auto Q = [&](int i) { return P(i) + P(i + 2); };
  const float t22 = ((Q(0) + Q(4)) + (Q(8) + Q(12))) + (Q(16) + P(20));
  EXPECT_EQ(moe_a2a_tree_sum(22, of(a)), t22);
  const float t16 = ((Q(0) + Q(4)) + (Q(8) + Q(12)));
  EXPECT_EQ(moe_a2a_tree_sum(16, of(a)), t16);
  float l18 = a[0];
  for (int k = 1; k < 18; ++k) l18 = l18 + a[k];
  EXPECT_EQ(moe_a2a_tree_sum(18, of(a)), l18);
  // -0 survives alone; a skipped slot (+0) turns it into +0.
  EXPECT_TRUE(std::signbit(moe_a2a_tree_sum(1, of({-0.0f}))));
  EXPECT_FALSE(std::signbit(moe_a2a_tree_sum(2, of({-0.0f, 0.0f}))));
  for (int k : {1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 22})
    EXPECT_TRUE(kernels::moe_a2a_top_k_supported(k));
  for (int k : {3, 5, 7, 20}) EXPECT_FALSE(kernels::moe_a2a_top_k_supported(k));
}

TEST(MoeA2aWorkspaceSize, UpstreamsLayoutByHand) {
  // ep 8, 10 tokens, hidden 128, top_k 2, 16-bit: aux = 8 + 64 -> 128, + 32 -> 256, + 32 -> 384,
  // + 880 -> 1280, + 880 -> 2176 (no EPLB); dispatch 80 * (256 + 8 + 8) = 21760; combine
  // 80 * 256 = 20480.
  EXPECT_EQ(moe_a2a_get_workspace_size_per_rank(8, 10, 272, 256), 2176 + 21760 + 20480);
  EXPECT_EQ(moe_alltoall_get_moe_workspace_size_per_rank(8, 2, 10, 128), 44416);
  // EPLB statistics add ep * experts * 4 bytes to aux (2176 + 8 * 64 * 4 = 4224).
  EXPECT_EQ(moe_a2a_get_workspace_size_per_rank(8, 10, 272, 256, 64), 4224 + 21760 + 20480);
  // 1 rank, 1 token: aux 16 -> 128, + 4 -> 256, + 4 -> 384, + 88 -> 512, + 88 -> 640; payloads
  // padded to 128 bytes (3 and 1 byte).
  EXPECT_EQ(moe_a2a_get_workspace_size_per_rank(1, 1, 3, 1), 640 + 128 + 128);
  EXPECT_EQ(moe_alltoall_get_moe_workspace_size_per_rank(4, 8, 256, 7168, 16),
            moe_a2a_get_workspace_size_per_rank(4, 256, 7168 * 2 + 64 + 16, 7168 * 2));
  EXPECT_THROW(moe_a2a_get_workspace_size_per_rank(0, 10, 272, 256), Error);
  EXPECT_THROW(moe_a2a_get_workspace_size_per_rank(8, -1, 272, 256), Error);
  // The metainfo's offsets (upstream's order) for ep 8, 10 tokens: 0, 4, 8, 40, 128, 256, 384,
  // 1280, 2176, 2176.
  const auto l = kernels::MoeA2aLayout::make(8, 10, 0);
  const int64_t want[10] = {0, 4, 8, 40, 128, 256, 384, 1280, 2176, 2176};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(l.field(i), want[i]) << i;
}

TEST(MoeA2aMapping, MoeSizesDeriveFromTheTpGroup) {
  Mapping m(8, 5, 8, 1, 8, 1, -1, -1, 8);  // SGLang's: tp_size = moe_ep_size = ep
  EXPECT_EQ(m.moe_tp_size, 1);
  EXPECT_EQ(m.moe_ep_rank(), 5);
  Mapping d(4, 3, 8, 1, 4);  // neither given: moe_tp = tp, moe_ep = 1
  EXPECT_EQ(d.moe_tp_size, 4);
  EXPECT_EQ(d.moe_ep_size, 1);
  EXPECT_EQ(d.moe_ep_rank(), 0);
  Mapping e(8, 6, 8, 1, 8, 1, -1, 2, -1);  // moe_tp 2: moe_ep 4
  EXPECT_EQ(e.moe_ep_size, 4);
  EXPECT_EQ(e.moe_ep_rank(), 2);
  EXPECT_EQ(e.moe_tp_rank(), 1);
  expect_error([] { Mapping(8, 0, 8, 1, 8, 1, -1, 3, 2); }, "tp_size must equal to moe_tp_size");
  EXPECT_NE(m.repr().find("rank=5, "), std::string::npos) << m.repr();
}

// ---- end to end, ranks as threads ------------------------------------------------------------

// t * f (on the CPU, back on t's device, t's dtype).
Tensor scaled(const Tensor& t, double f) {
  std::vector<double> v = t.to(Device::cpu()).to_double_vector();
  for (double& x : v) x *= f;
  return Tensor::from_vector(v, t.shape(), t.dtype()).to(t.device());
}

std::shared_ptr<MoeAlltoAll> make_a2a(const std::shared_ptr<comm::CommBackend>& b,
                                      int64_t max_tokens, int64_t top_k, int64_t experts,
                                      int64_t hidden, int64_t eplb = 0, bool mask = false,
                                      int64_t extra_bytes = 0) {
  const int64_t w = b->Get_size();
  // extra_bytes: a workspace_size_per_rank past upstream's size (8: rows off 16-byte alignment).
  const std::optional<int64_t> size =
      extra_bytes == 0 ? std::nullopt
                       : std::optional<int64_t>(moe_alltoall_get_moe_workspace_size_per_rank(
                                                    w, top_k, max_tokens, hidden, 0, eplb) +
                                                extra_bytes);
  return std::make_shared<MoeAlltoAll>(
      std::make_shared<Mapping>(w, b->Get_rank(), 8, 1, w, 1, -1, -1, w), max_tokens, top_k,
      experts, size, hidden, std::make_shared<MnnvlConfig>(b), eplb, mask);
}

// Rank r's tokens: T_r = 3 + 2r (rank 1 of 4 has none), hidden values small integers (exact in
// bf16 and in every sum), experts from a fixed pattern with duplicate ranks.
struct RankInput {
  Tensor experts, hidden, scales;
};
RankInput rank_input(int64_t r, int64_t T, int64_t K, int64_t E, int64_t H, Device dev,
                     DType dt = kBf) {
  std::vector<double> ex, hv, sc;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) ex.push_back(static_cast<double>((t * 7 + k * 3 + r * 5) % E));
    for (int64_t h = 0; h < H; ++h)
      hv.push_back(static_cast<double>((r * 13 + t * 5 + h) % 17 - 8));
    for (int64_t k = 0; k < K; ++k) sc.push_back(0.25 * static_cast<double>(k + 1));
  }
  return {Tensor::from_vector(ex, {T, K}, DType::kInt32).to(dev),
          Tensor::from_vector(hv, {T, H}, dt).to(dev),
          Tensor::from_vector(sc, {T, K}, DType::kFloat32).to(dev)};
}

// The ranks token t of rank r goes to (distinct, in slot order), on `ep` ranks.
std::vector<int64_t> targets_of(const RankInput& in, int64_t t, int64_t E, int64_t ep) {
  const std::vector<double> ex = in.experts.to(Device::cpu()).to_double_vector();
  const int64_t K = in.experts.size(1);
  std::vector<int64_t> out;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t rank = kernels::moe_a2a_target_rank(static_cast<int>(ex[t * K + k]),
                                                      static_cast<int>(E), static_cast<int>(ep));
    if (std::find(out.begin(), out.end(), rank) == out.end()) out.push_back(rank);
  }
  return out;
}

int64_t tokens_of(int64_t ep, int64_t r) { return ep == 4 && r == 1 ? 0 : 3 + 2 * r; }

// One rank's exchange: MoeAlltoAll's methods, or the module functions on one workspace every
// rank passes (moe_a2a_initialize, then a barrier), the ids sanitized by their own call.
struct RankA2a {
  std::shared_ptr<MoeAlltoAll> cls;
  Tensor ws, meta;
  int64_t r = 0, ep = 0, K = 0, E = 0, tokens = 0, offset = 0;

  RankA2a(const std::shared_ptr<comm::CommBackend>& b, const Tensor& shared, int64_t max_tokens,
          int64_t top_k, int64_t experts, int64_t hidden, int64_t extra_bytes)
      : ws(shared), r(b->Get_rank()), ep(b->Get_size()), K(top_k), E(experts) {
    if (!shared.defined()) {
      cls = make_a2a(b, max_tokens, top_k, experts, hidden, 0, false, extra_bytes);
      return;
    }
    meta = moe_a2a_initialize(ws, r, ep, max_tokens);
    b->barrier();
  }
  std::vector<Tensor> dispatch(const Tensor& ex, const std::vector<Tensor>& payloads, int64_t rmax,
                               int64_t ids_index) {
    if (cls) return cls->dispatch(ex, payloads, rmax, int64_t{-1}, ids_index);
    auto [recv, off, eplb] = moe_a2a_dispatch(ex, payloads, ws, meta, rmax, r, ep, K, E);
    EXPECT_FALSE(eplb.has_value());
    moe_a2a_sanitize_expert_ids(recv[static_cast<std::size_t>(ids_index)], ws, meta, r, -1);
    tokens = ex.size(0);
    offset = off;
    return recv;
  }
  Tensor payload_in_workspace(int64_t rmax, int64_t H, DType dt) {
    if (cls) return cls->get_combine_payload_tensor_in_workspace(rmax, H, dt);
    const int64_t start = r * ws.size(1) + offset;
    return moe_a2a_wrap_payload_tensor_in_workspace(
        ws, {ep, rmax}, start, start + ep * rmax * H * static_cast<int64_t>(dtype_size(dt)), dt);
  }
  Tensor combine(const Tensor& payload, int64_t rmax, bool in_workspace) {
    if (cls) return cls->combine(payload, rmax, in_workspace);
    return moe_a2a_combine(payload, tokens, ws, meta, rmax, r, ep, K, offset, in_workspace);
  }
};

// module: the module functions on one shared workspace instead of MoeAlltoAll.
void round_trip(int64_t ep, int64_t K, int64_t E, int64_t H, Device dev, bool in_workspace,
                int rounds, int64_t extra_bytes = 0, DType dt = kBf, bool module = false) {
  // fp32 hidden states need twice upstream's 16-bit rows, dispatch and combine.
  if (dtype_size(dt) > 2) extra_bytes += ep * 16 * H * 4;
  comm::ThreadGroup g(ep, dev);
  // Zeroed on the CPU and copied (a copy that returns when it is done): Tensor::zeros on the
  // device would zero it on this thread's stream (the legacy default stream here), which the
  // ranks' non-blocking streams do not wait for, so the zeroing could land after a rank's first
  // flags.
  const Tensor shared =
      module ? Tensor::zeros(
                   {ep, moe_alltoall_get_moe_workspace_size_per_rank(ep, K, 16, H) + extra_bytes},
                   DType::kUInt8)
                   .to(dev)
             : Tensor();
  // The rows a source has change from call to call (SGLang's runtime_max follows the batch):
  // the regions move, and a fast rank's next dispatch must not overwrite rows a slow rank still
  // sums.
  auto rmax_of = [](int k) -> int64_t { return k % 2 == 0 ? 10 : 16; };
  std::vector<std::vector<RankInput>> in(rounds, std::vector<RankInput>(ep));
  std::vector<std::vector<std::vector<Tensor>>> recv(rounds, std::vector<std::vector<Tensor>>(ep));
  std::vector<std::vector<Tensor>> out(rounds, std::vector<Tensor>(ep));
  g.run([&](int64_t r) {
    RankA2a a2a(g.backend(r), shared, 16, K, E, H, extra_bytes);
    for (int k = 0; k < rounds; ++k) {
      const int64_t rmax = rmax_of(k);
      const int64_t T = tokens_of(ep, r) + (k % 2 == 1 ? -1 : 0) * (tokens_of(ep, r) > 0 ? 1 : 0);
      in[k][r] = rank_input(r + 10 * k, T, K, E, H, dev, dt);
      const std::vector<Tensor> got = a2a.dispatch(
          in[k][r].experts, {in[k][r].hidden, in[k][r].experts, in[k][r].scales}, rmax, 1);
      ASSERT_EQ(got.size(), 3u);
      for (const Tensor& x : got) recv[k][r].push_back(x.to(Device::cpu()).clone());
      // "Experts": this rank's result for each received token is its hidden row times (r + 1).
      Tensor payload = in_workspace ? a2a.payload_in_workspace(rmax, H, dt)
                                    : Tensor::zeros({ep, rmax, H}, dt, dev);
      Tensor h = got[0].to(Device::cpu()).to(DType::kFloat32);
      std::vector<double> hv = h.to_double_vector();
      for (double& v : hv) v *= static_cast<double>(r + 1);
      payload.copy_(Tensor::from_vector(hv, {ep, rmax, H}, dt).to(dev));
      out[k][r] = a2a.combine(payload, rmax, in_workspace).to(Device::cpu());
    }
  });
  for (int k = 0; k < rounds; ++k) {
    const int64_t rmax = rmax_of(k);
    for (int64_t R = 0; R < ep; ++R) {
      for (int64_t S = 0; S < ep; ++S) {
        // Rank S's tokens that go to R, in token order, are R's rows [S, 0..n).
        const RankInput& src = in[k][S];
        const int64_t T = src.experts.size(0);
        const std::vector<double> hs = src.hidden.to(Device::cpu()).to_double_vector();
        const std::vector<double> es = src.experts.to(Device::cpu()).to_double_vector();
        const std::vector<double> rh = recv[k][R][0].to_double_vector();
        const std::vector<double> ri = recv[k][R][1].to_double_vector();
        int64_t n = 0;
        for (int64_t t = 0; t < T; ++t) {
          const auto tg = targets_of(src, t, E, ep);
          if (std::find(tg.begin(), tg.end(), R) == tg.end()) continue;
          for (int64_t h = 0; h < H; ++h) {
            ASSERT_EQ(rh[(S * rmax + n) * H + h], hs[t * H + h])
                << "round " << k << " R " << R << " S " << S;
          }
          for (int64_t j = 0; j < K; ++j) EXPECT_EQ(ri[(S * rmax + n) * K + j], es[t * K + j]);
          ++n;
        }
        // Rows past the count: the ids sanitized to -1.
        for (int64_t i = n; i < rmax; ++i) {
          for (int64_t j = 0; j < K; ++j) ASSERT_EQ(ri[(S * rmax + i) * K + j], -1.0);
        }
      }
      // Combine: token t of R gets sum over its distinct ranks q of (q + 1) * x_t.
      const RankInput& mine = in[k][R];
      const int64_t T = mine.experts.size(0);
      ASSERT_EQ(out[k][R].shape(), (Shape{T, H}));
      const std::vector<double> hs = mine.hidden.to(Device::cpu()).to_double_vector();
      const std::vector<double> o = out[k][R].to_double_vector();
      for (int64_t t = 0; t < T; ++t) {
        double f = 0;
        for (int64_t q : targets_of(mine, t, E, ep)) f += static_cast<double>(q + 1);
        for (int64_t h = 0; h < H; ++h) ASSERT_EQ(o[t * H + h], f * hs[t * H + h]) << t << "," << h;
      }
    }
  }
}

TEST(MoeAlltoAll, DispatchAndCombineFollowTheRouting) {
  round_trip(4, 2, 8, 16, Device::cpu(), false, 3);
  round_trip(2, 4, 6, 24, Device::cpu(), false, 2);
  round_trip(3, 8, 7, 8, Device::cpu(), false, 1);
  round_trip(1, 1, 1, 8, Device::cpu(), false, 1);
}

TEST(MoeAlltoAll, EveryPayloadDtypeSumsExactly) {
  round_trip(4, 2, 8, 16, Device::cpu(), false, 2, 0, DType::kFloat16);
  round_trip(3, 4, 6, 8, Device::cpu(), true, 2, 0, DType::kFloat32);
}

TEST(MoeAlltoAll, ExpertIdsMapToRanksAsUpstreamsDivisionDoes) {
  // 4 experts on 2 ranks (2 each): -1 / 2 is 0 in C (rank 0, as upstream's kernel sends it);
  // 4 / 2 = 2 and -3 / 2 = -1 are no rank (upstream would write out of bounds): dropped.
  comm::ThreadGroup g(2);
  std::vector<Tensor> recv(2);
  g.run([&](int64_t r) {
    auto a2a = make_a2a(g.backend(r), 4, 1, 4, 4);
    const Tensor ex = Tensor::from_vector({-1.0, 4.0, -3.0, 3.0}, {4, 1}, DType::kInt32);
    const Tensor x =
        Tensor::from_vector({1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4}, {4, 4}, kBf);
    auto got = a2a->dispatch(ex, {x}, 4);
    recv[r] = got[0].clone();
    a2a->combine(got[0].clone(), 4);
  });
  for (int r = 0; r < 2; ++r) {
    const std::vector<double> v = recv[r].to_double_vector();  // [2, 4, 4]
    // Rank 0 gets token 0 (id -1) of each source, rank 1 token 3 (id 3); nothing else arrives.
    EXPECT_EQ(v[(0 * 4 + 0) * 4], r == 0 ? 1.0 : 4.0);
    EXPECT_EQ(v[(1 * 4 + 0) * 4], r == 0 ? 1.0 : 4.0);
  }
}

TEST(MoeAlltoAll, CombinesFromThePayloadInTheWorkspace) {
  round_trip(4, 2, 8, 16, Device::cpu(), true, 2);
  round_trip(2, 2, 4, 8, Device::cpu(), true, 2, 8);  // rank rows off 16-byte alignment
}

TEST(MoeAlltoAll, LowPrecisionCastsRowsToE4m3AndWritesBf16) {
  comm::ThreadGroup g(2);
  std::vector<Tensor> out(2);
  g.run([&](int64_t r) {
    auto a2a = make_a2a(g.backend(r), 4, 2, 2, 4);
    // Token 0 of each rank goes to both ranks (experts 0 and 1).
    Tensor ex = Tensor::from_vector({0, 1}, {1, 2}, DType::kInt32);
    Tensor x = Tensor::from_vector({1, 2, 3, 4}, {1, 4}, kBf);
    a2a->dispatch(ex, {x}, 4);
    // Rank r's rows: 0.3 (bf16 0.30078125, e4m3 0.3125), 500 (saturates to 448), 17 (a tie
    // between 16 and 18: even, 16), -1 - r.
    std::vector<double> pv(2 * 4 * 4, 0.0);
    for (int s = 0; s < 2; ++s) {
      const double row[4] = {0.3, 500.0, 17.0, -1.0 - r};
      for (int h = 0; h < 4; ++h) pv[(s * 4 + 0) * 4 + h] = row[h];
    }
    out[r] = a2a->combine(Tensor::from_vector(pv, {2, 4, 4}, kBf), 4, false, std::nullopt,
                          std::nullopt, 1.0, SfLayout::layout_linear, std::nullopt, true);
  });
  auto e4 = [](double v) {
    return static_cast<double>(e4m3fn_bits_to_float(float_to_e4m3fn_bits(
        bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(v))), true)));
  };
  // The payload as a view of this rank's combine region, passed as a payload of its own: the
  // fp8 rows would overwrite the bf16 rows before they are read (a race on CUDA). Refused.
  g.run([&](int64_t r) {
    auto a2a = make_a2a(g.backend(r), 4, 2, 2, 4);
    Tensor ex = Tensor::from_vector({0, 1}, {1, 2}, DType::kInt32);
    a2a->dispatch(ex, {Tensor::from_vector({1, 2, 3, 4}, {1, 4}, kBf)}, 4);
    Tensor in_ws = a2a->get_combine_payload_tensor_in_workspace(4, 4, kBf);
    EXPECT_FI_ERROR(a2a->combine(in_ws, 4, false, std::nullopt, std::nullopt, 1.0,
                                 SfLayout::layout_linear, std::nullopt, true),
                    "MoeAlltoAll.combine", "payload");
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(out[r].dtype(), kBf);
    const std::vector<double> o = out[r].to_double_vector();
    EXPECT_EQ(e4(0.3), 0.3125);
    EXPECT_EQ(e4(17.0), 16.0);
    EXPECT_EQ(o[0], 0.625);
    EXPECT_EQ(o[1], 896.0);
    EXPECT_EQ(o[2], 32.0);
    EXPECT_EQ(o[3], e4(-1.0) + e4(-2.0));
  }
}

TEST(MoeAlltoAll, EplbStatisticsReachEveryRank) {
  comm::ThreadGroup g(3);
  std::vector<Tensor> stats(3);
  g.run([&](int64_t r) {
    // 5 statistics a rank: num_experts at least that many (upstream's dispatch requires it).
    auto a2a = make_a2a(g.backend(r), 4, 1, 6, 8, 5);
    Tensor local = Tensor::from_vector({r * 10.0, r * 10.0 + 1, 2, 3, r + 0.0}, {5}, DType::kInt32);
    a2a->dispatch(Tensor::from_vector({static_cast<double>(r)}, {1, 1}, DType::kInt32),
                  {Tensor::zeros({1, 8}, kBf)}, 4, std::nullopt, std::nullopt, local);
    ASSERT_TRUE(a2a->eplb_gathered_stats().has_value());
    stats[r] = a2a->eplb_gathered_stats()->clone();
    a2a->combine(Tensor::zeros({3, 4, 8}, kBf), 4);
    EXPECT_FALSE(a2a->eplb_gathered_stats().has_value());
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(stats[r].shape(), (Shape{3, 5}));
    const std::vector<double> v = stats[r].to_double_vector();
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(v[s * 5 + 0], s * 10.0);
      EXPECT_EQ(v[s * 5 + 4], s + 0.0);
    }
  }
}

TEST(MoeAlltoAll, RankMaskDropsTokensToInactiveRanks) {
  // Rank 2 of 3 is down: ranks 0 and 1 exchange with mask 0b011; tokens for rank 2 go nowhere.
  comm::ThreadGroup g(3);
  std::vector<Tensor> out(2);
  std::vector<std::vector<Tensor>> recv(2);
  std::vector<Tensor> dead_ids(2);
  g.run([&](int64_t r) {
    auto a2a = make_a2a(g.backend(r), 4, 2, 3, 4, 0, true);
    // A round with every rank first: rank 2 sends rows (and counts) to the others.
    const Tensor all = Tensor::from_vector({7.0}, {1}, DType::kInt64);
    const Tensor ex0 = Tensor::from_vector({0, 1}, {1, 2}, DType::kInt32);
    auto first = a2a->dispatch(ex0, {Tensor::zeros({1, 4}, kBf), ex0}, 4, std::nullopt,
                               std::nullopt, std::nullopt, all);
    a2a->combine(first[0].clone(), 4, false, std::nullopt, std::nullopt, 1.0,
                 SfLayout::layout_linear, std::nullopt, false, all);
    if (r == 2) return;
    Tensor mask = Tensor::from_vector({3.0}, {1}, DType::kInt64);
    // Token 0 to ranks {0, 2}, token 1 to {1, 2}.
    Tensor ex = Tensor::from_vector({0, 2, 1, 2}, {2, 2}, DType::kInt32);
    Tensor x = Tensor::from_vector({1, 1, 1, 1, 2, 2, 2, 2}, {2, 4}, kBf);
    auto got = a2a->dispatch(ex, {x, ex}, 4, int64_t{-1}, int64_t{1}, std::nullopt, mask);
    recv[r] = {got[0].clone()};
    dead_ids[r] = got[1].clone();
    Tensor p = got[0].clone();
    out[r] = a2a->combine(p, 4, false, std::nullopt, std::nullopt, 1.0, SfLayout::layout_linear,
                          std::nullopt, false, mask);
  });
  for (int r = 0; r < 2; ++r) {
    // Each rank gets one token of each live source: token r.
    const std::vector<double> v = recv[r][0].to_double_vector();
    EXPECT_EQ(v[(0 * 4 + 0) * 4], r + 1.0);
    EXPECT_EQ(v[(1 * 4 + 0) * 4], r + 1.0);
    // Combine: token t went to rank t only (rank 2 dropped): its own row back.
    const std::vector<double> o = out[r].to_double_vector();
    EXPECT_EQ(o[0], 1.0);
    EXPECT_EQ(o[4], 2.0);
    // The dead rank's rows from the first round count no more: its ids are all padding now.
    const std::vector<double> ids = dead_ids[r].to_double_vector();
    for (int i = 0; i < 4 * 2; ++i) EXPECT_EQ(ids[2 * 4 * 2 + i], -1.0) << i;
  }
}

TEST(MoeAlltoAll, InstancesOfEqualSizesShareAWorkspace) {
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) {
    auto a = make_a2a(g.backend(r), 8, 2, 4, 16);
    auto b = make_a2a(g.backend(r), 8, 2, 4, 16);
    auto c = make_a2a(g.backend(r), 8, 2, 4, 32);
    EXPECT_EQ(a->workspace().data_ptr(), b->workspace().data_ptr());
    EXPECT_NE(a->workspace().data_ptr(), c->workspace().data_ptr());
    EXPECT_EQ(a->workspace().size(0), 2);
    EXPECT_EQ(a->workspace().size(1), moe_alltoall_get_moe_workspace_size_per_rank(2, 2, 8, 16));
    const std::vector<double> meta = a->metainfo().to_double_vector();
    ASSERT_EQ(meta.size(), 10u);
    EXPECT_EQ(meta[9], static_cast<double>(kernels::MoeA2aLayout::make(2, 8, 0).payload_data));
  });
}

TEST(MoeAlltoAll, ACacheMissOnOneRankMakesEveryRankAllocate) {
  // Rank 1 drops its only instance (its cache entry dies), rank 0 keeps one: the next
  // construction must still allocate on both (together), not hang rank 1 alone.
  comm::ThreadGroup g(2, Device::cpu(), std::chrono::milliseconds(20000));
  std::vector<void*> old_ws(2), new_ws(2);
  std::vector<Tensor> out(2);
  g.run([&](int64_t r) {
    auto a = make_a2a(g.backend(r), 4, 1, 2, 4);
    old_ws[r] = a->workspace().data_ptr();
    if (r == 1) a.reset();
    auto b = make_a2a(g.backend(r), 4, 1, 2, 4);
    new_ws[r] = b->workspace().data_ptr();
    auto got = b->dispatch(Tensor::from_vector({static_cast<double>(1 - r)}, {1, 1}, DType::kInt32),
                           {Tensor::full({1, 4}, r + 1.0, kBf)}, 4);
    out[r] = b->combine(got[0].clone(), 4);
  });
  EXPECT_NE(new_ws[0], old_ws[0]);
  EXPECT_EQ(new_ws[0], new_ws[1]);  // one allocation the group views
  for (int r = 0; r < 2; ++r) EXPECT_EQ(out[r].to_double_vector(), std::vector<double>(4, r + 1.0));
}

TEST(MoeAlltoAll, InstancesSharingAWorkspaceTakeTurns) {
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) {
    auto a = make_a2a(g.backend(r), 4, 1, 2, 4);
    auto b = make_a2a(g.backend(r), 4, 1, 2, 4);
    ASSERT_EQ(a->workspace().data_ptr(), b->workspace().data_ptr());
    const Tensor ex = Tensor::from_vector({static_cast<double>(r)}, {1, 1}, DType::kInt32);
    const Tensor x = Tensor::full({1, 4}, r + 1.0, kBf);
    auto got = a->dispatch(ex, {x}, 4);
    // b's dispatch would wait for a combine of a's that has not come: refused, nothing moved.
    expect_error([&] { b->dispatch(ex, {x}, 4); }, "between its dispatch and its combine");
    a->combine(got[0].clone(), 4);
    got = b->dispatch(ex, {x}, 4);
    EXPECT_EQ(b->combine(got[0].clone(), 4).to_double_vector(), std::vector<double>(4, r + 1.0));
  });
}

TEST(MoeAlltoAll, AFailedRankEndsItsPeersWaitAtOnce) {
  comm::ThreadGroup g(2, Device::cpu(), std::chrono::milliseconds(60000));
  std::vector<std::shared_ptr<MoeAlltoAll>> a2a(2);
  g.run([&](int64_t r) { a2a[r] = make_a2a(g.backend(r), 4, 1, 2, 4); });
  const auto start = std::chrono::steady_clock::now();
  try {
    g.run([&](int64_t r) {
      if (r == 0) throw Error(ErrorCode::kInvalidArgument, "test", "", "rank 0 fails first");
      // Rank 1 waits for rank 0's call, which never comes: the group's abort ends the wait.
      a2a[r]->dispatch(Tensor::from_vector({0.0}, {1, 1}, DType::kInt32),
                       {Tensor::zeros({1, 4}, kBf)}, 4);
    });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 fails first"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(MoeAlltoAll, CheckpointUnmapsUntilRestored) {
  comm::ThreadGroup g(2);
  comm::ThreadGroup other(3);
  std::vector<Tensor> out(2);
  g.run([&](int64_t r) {
    auto a2a = make_a2a(g.backend(r), 4, 1, 2, 4);
    Tensor ex = Tensor::from_vector({static_cast<double>(1 - r)}, {1, 1}, DType::kInt32);
    Tensor x = Tensor::full({1, 4}, r + 1.0, kBf);
    a2a->dispatch(ex, {x}, 4);
    expect_error([&] { a2a->checkpoint_prepare(); }, "during an active all-to-all phase");
    a2a->combine(Tensor::zeros({2, 4, 4}, kBf), 4);
    a2a->checkpoint_prepare();
    a2a->checkpoint_prepare();  // idempotent
    expect_error([&] { a2a->dispatch(ex, {x}, 4); }, "MNNVL handles are unmapped");
    expect_error([&] { a2a->checkpoint_restore(other.backend(r)); }, "rank/size");
    a2a->checkpoint_restore(g.backend(r));
    auto got = a2a->dispatch(ex, {x}, 4);
    out[r] = a2a->combine(scaled(got[0], 2.0), 4);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(out[r].to_double_vector(), std::vector<double>(4, 2.0 * (r + 1)));
}

TEST(MoeAlltoAll, RefusesWhatUpstreamRefuses) {
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) {
    auto b = g.backend(r);
    auto mapping = std::make_shared<Mapping>(2, r, 8, 1, 2, 1, -1, -1, 2);
    auto cfg = std::make_shared<MnnvlConfig>(b);
    expect_error([&] { MoeAlltoAll(mapping, 4, 0, 4, std::nullopt, 8, cfg); },
                 "top_k must be a positive int");
    expect_error([&] { MoeAlltoAll(mapping, 4, 2, 0, std::nullopt, 8, cfg); },
                 "num_experts must be a positive int");
    expect_error([&] { MoeAlltoAll(mapping, 4, 2, 4, std::nullopt, std::nullopt, cfg); },
                 "hidden_size must be provided");
    expect_error([&] { MoeAlltoAll(mapping, 4, 2, 4, std::nullopt, 8, cfg, 0, false, "cake"); },
                 "cake");
    expect_error([&] { MoeAlltoAll(mapping, 4, 2, 4, std::nullopt, 8, cfg, 0, false, "nccl"); },
                 "Unknown MoE all-to-all backend");
    expect_error([&] { MoeAlltoAll(mapping, 4, 2, 4, std::nullopt, 8, nullptr); }, "comm_backend");
    auto a2a = make_a2a(b, 4, 2, 4, 8);
    Tensor ex = Tensor::from_vector({0, 3}, {1, 2}, DType::kInt32);
    Tensor x = Tensor::zeros({1, 8}, kBf);
    expect_error(
        [&] {
          a2a->combine(Tensor::zeros({2, 4, 8}, kBf), 4);
        },
        "combine called before successful dispatch");
    expect_error([&] { a2a->get_combine_payload_tensor_in_workspace(4, 8, kBf); },
                 "called before successful dispatch");
    expect_error([&] { a2a->dispatch(ex, {x}, 5); }, "exceeds max_num_tokens");
    expect_error([&] { a2a->dispatch(ex, {}, 4); }, "At least one payload is required");
    expect_error([&] { a2a->dispatch(ex, {x, x, x, x, x, x, x}, 4); }, "Too many payloads: 7 > 6");
    expect_error([&] { a2a->dispatch(ex.to(DType::kInt64), {x}, 4); }, "must be int32");
    expect_error(
        [&] {
          a2a->dispatch(Tensor::zeros({1, 3}, DType::kInt32), {x}, 4);
        },
        "token_selected_experts shape mismatch");
    expect_error(
        [&] {
          a2a->dispatch(ex, {Tensor::zeros({2, 8}, kBf)}, 4);
        },
        "first dim must equal local_num_tokens");
    expect_error([&] { a2a->dispatch(ex, {Tensor::zeros({1, 2, 4}, kBf)}, 4); }, "must be 2D");
    expect_error(
        [&] {
          a2a->dispatch(ex, {Tensor::zeros({1, 999}, kBf)}, 4);
        },
        "workspace size per rank insufficient");
    // 2 ranks x 3 rows of 1 byte put the next payload at an offset of 6: not fp32-aligned.
    expect_error(
        [&] {
          a2a->dispatch(
              ex, {Tensor::zeros({1, 1}, DType::kUInt8), Tensor::zeros({1, 2}, DType::kFloat32)},
              3);
        },
        "Misaligned payload buffer 1");
    expect_error([&] { a2a->dispatch(ex, {x}, 4, int64_t{-1}); },
                 "expert_id_payload_index required");
    expect_error(
        [&] {
          a2a->dispatch(ex, {x}, 4, std::nullopt, std::nullopt, Tensor::zeros({4}, DType::kInt32));
        },
        "eplb_stats_num_experts=0");
    expect_error(
        [&] {
          a2a->dispatch(ex, {x}, 4, std::nullopt, std::nullopt, std::nullopt,
                        Tensor::from_vector({3.0}, {1}, DType::kInt64));
        },
        "enable_rank_mask=True");
    a2a->dispatch(ex, {x}, 4);
    expect_error([&] { a2a->dispatch(ex, {x}, 4); }, "dispatch called twice without combine");
    expect_error(
        [&] {
          a2a->combine(Tensor::zeros({2, 4, 8}, DType::kInt32), 4);
        },
        "Unsupported dtype for MoE combine");
    expect_error(
        [&] {
          a2a->combine(Tensor::zeros({2, 3, 8}, kBf), 4);
        },
        "payload must be [ep_size, runtime_max_tokens_per_rank, hidden]");
    expect_error(
        [&] {
          a2a->combine(Tensor::zeros({2, 3, 8}, kBf), 3);
        },
        "differs from the dispatch's 4");
    expect_error([&] { a2a->get_combine_payload_tensor_in_workspace(2, 8, kBf); },
                 "differs from the dispatch's 4");
    expect_error(
        [&] {
          a2a->combine(Tensor::zeros({2, 4, 8}, kBf), 4, true);
        },
        "tensor pointer mismatch");
    expect_error(
        [&] {
          a2a->combine(Tensor::zeros({2, 4, 8}, kBf), 4, false, DType::kFloat16);
        },
        "output_dtype without output_scales must match payload dtype");
    expect_error(
        [&] {
          a2a->combine(Tensor::zeros({2, 4, 8}, kBf), 4, false, std::nullopt,
                       Tensor::zeros({8}, DType::kUInt8));
        },
        "not implemented");
    expect_error(
        [&] {
          a2a->combine(Tensor::zeros({2, 4, 8}, kBf), 4, false, std::nullopt, std::nullopt, 1.0,
                       SfLayout::layout_linear, Tensor::zeros({2, 8}, kBf));
        },
        "output must be [1, 8]");
    // The refused calls changed nothing: this combine still pairs with the dispatch above.
    a2a->combine(Tensor::zeros({2, 4, 8}, kBf), 4);
  });
  // top_k 3: upstream's kernels have no fixed order for it; dispatch refuses it already.
  comm::ThreadGroup one(1);
  one.run([&](int64_t) {
    auto a2a = make_a2a(one.backend(0), 4, 3, 4, 8);
    expect_error(
        [&] {
          a2a->dispatch(Tensor::zeros({1, 3}, DType::kInt32), {Tensor::zeros({1, 8}, kBf)}, 4);
        },
        "Unsupported top_k: 3");
  });
}

TEST(MoeAlltoAll, DeclaredAsUpstream) {
  for (const char* name :
       {"MoeAlltoAll.dispatch", "MoeAlltoAll.combine",
        "MoeAlltoAll.get_combine_payload_tensor_in_workspace", "MoeAlltoAll.checkpoint_prepare",
        "MoeAlltoAll.checkpoint_restore", "MoeAlltoAll.__init__", "moe_a2a_initialize",
        "moe_a2a_wrap_payload_tensor_in_workspace", "moe_a2a_dispatch", "moe_a2a_combine",
        "moe_a2a_sanitize_expert_ids"}) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, "flashinfer.comm.trtllm_moe_alltoall") << name;
  }
}

// ---- the module functions (moe_a2a_*) on a workspace the caller holds ---------------------

TEST(MoeA2aModule, RoundTripsAsMoeAlltoAllDoes) {
  round_trip(4, 2, 8, 16, Device::cpu(), false, 3, 0, kBf, true);
  round_trip(3, 4, 6, 8, Device::cpu(), true, 2, 0, DType::kFloat32, true);
  round_trip(2, 2, 4, 8, Device::cpu(), true, 2, 8, kBf, true);  // rows off 16-byte alignment
  round_trip(1, 1, 1, 8, Device::cpu(), false, 1, 0, kBf, true);
}

TEST(MoeA2aModule, InitializeZeroesItsRowAndReturnsUpstreamsOffsets) {
  // ep 8, 10 tokens (the worked example of MoeA2aWorkspaceSize): counters at 8 and 40, the flag
  // arrays and the 22-slot tables 128-byte aligned, no EPLB region, payloads at 2176.
  Tensor ws = Tensor::full({8, 44416}, 7.0, DType::kUInt8);
  const Tensor meta = moe_a2a_initialize(ws, 3, 8, 10);
  EXPECT_TRUE(meta.device().is_cpu());
  EXPECT_EQ(meta.dtype(), DType::kInt64);
  EXPECT_EQ(meta.to_double_vector(),
            (std::vector<double>{0, 4, 8, 40, 128, 256, 384, 1280, 2176, 2176}));
  for (int64_t r : {2, 3, 4}) {
    const std::vector<double> row = ws.select(0, r).to_double_vector();
    EXPECT_EQ(std::count(row.begin(), row.end(), r == 3 ? 0.0 : 7.0), 44416) << r;
  }
  // 5 EPLB statistics a rank: 8 * 5 * 4 = 160 bytes, the payloads at align128(2176 + 160).
  EXPECT_EQ(moe_a2a_initialize(ws, 0, 8, 10, 5).to_double_vector()[9], 2432.0);
}

TEST(MoeA2aModule, DispatchReturnsTheCombineOffsetAndTheGatheredStatistics) {
  comm::ThreadGroup g(2);
  const int64_t ep = 2, K = 2, E = 4, H = 8, max_tokens = 4, eplb = 3;
  // Dispatch rows: H bf16 + K int32; combine rows H bf16.
  const int64_t size =
      moe_a2a_get_workspace_size_per_rank(ep, max_tokens, H * 2 + K * 4, H * 2, eplb);
  const Tensor ws = Tensor::zeros({ep, size}, DType::kUInt8);
  std::vector<int64_t> offsets(2);
  std::vector<Tensor> stats(2), stats_short(2);
  g.run([&](int64_t r) {
    const Tensor meta = moe_a2a_initialize(ws, r, ep, max_tokens, eplb);
    g.backend(r)->barrier();
    const int64_t payload_data = static_cast<int64_t>(meta.to_double_vector()[9]);
    for (int round = 0; round < 2; ++round) {
      const RankInput in = rank_input(r, 3, K, E, H, Device::cpu());
      // The reserved 3 statistics, then 2: the gathered rows follow the count passed.
      const int64_t n = round == 0 ? 3 : 2;
      std::vector<double> sv;
      for (int64_t i = 0; i < n; ++i) sv.push_back(static_cast<double>(r * 10 + i + round));
      auto [recv, off, gathered] =
          moe_a2a_dispatch(in.experts, {in.hidden, in.experts}, ws, meta, 4, r, ep, K, E,
                           std::nullopt, Tensor::from_vector(sv, {n}, DType::kInt32));
      // align128(PAYLOAD_DATA + ep * runtime_max * (H * 2 + K * 4)).
      EXPECT_EQ(off, (payload_data + ep * 4 * (H * 2 + K * 4) + 127) / 128 * 128);
      offsets[r] = off;
      ASSERT_TRUE(gathered.has_value());
      (round == 0 ? stats : stats_short)[r] = gathered->clone();
      moe_a2a_combine(Tensor::zeros({ep, 4, H}, kBf), 3, ws, meta, 4, r, ep, K, off);
    }
  });
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_EQ(stats[r].shape(), (Shape{2, 3}));
    EXPECT_EQ(stats[r].to_double_vector(), (std::vector<double>{0, 1, 2, 10, 11, 12}));
    EXPECT_EQ(stats_short[r].shape(), (Shape{2, 2}));
    EXPECT_EQ(stats_short[r].to_double_vector(), (std::vector<double>{1, 2, 11, 12}));
  }
}

// flag_val counts calls in 32 bits: past 0xFFFFFFFF the count goes on at 2, never 0 or 1 (a
// dispatch numbered 1 is the first one and waits for no combine). The rows seeded as after the
// combine numbered 0xFFFFFFFD; three rounds run through the wrap with every combine right, and
// each rank's count ends at 5 (a plain + 1 would give 3).
TEST(MoeA2aModule, CallCountGoesOnPastTheWrapWithoutReachingOne) {
  EXPECT_EQ(kernels::moe_a2a_next_flag(0), 1u);
  EXPECT_EQ(kernels::moe_a2a_next_flag(41), 42u);
  EXPECT_EQ(kernels::moe_a2a_next_flag(0xFFFFFFFEu), 0xFFFFFFFFu);
  EXPECT_EQ(kernels::moe_a2a_next_flag(0xFFFFFFFFu), 2u);
  comm::ThreadGroup g(2);
  const int64_t ep = 2, K = 2, E = 4, H = 8, max_tokens = 4;
  const int64_t size = moe_a2a_get_workspace_size_per_rank(ep, max_tokens, H * 2 + K * 4, H * 2);
  const Tensor ws = Tensor::zeros({ep, size}, DType::kUInt8);
  std::vector<std::vector<Tensor>> out(3, std::vector<Tensor>(ep));
  std::vector<RankInput> in(ep);
  g.run([&](int64_t r) {
    const Tensor meta = moe_a2a_initialize(ws, r, ep, max_tokens);
    const std::vector<double> m = meta.to_double_vector();
    auto* row = static_cast<uint8_t*>(ws.select(0, r).data_ptr());
    auto word = [&](double at, int64_t j) {
      return reinterpret_cast<uint32_t*>(row + static_cast<int64_t>(at) + 4 * j);
    };
    const uint32_t c = 0xFFFFFFFDu;  // the last combine's number
    *word(m[0], 0) = c;
    for (int64_t j = 0; j < ep; ++j) {
      *word(m[4], j) = c - 1;                          // the dispatch before it
      *word(m[5], j) = kernels::moe_a2a_next_flag(c);  // its done value
    }
    g.backend(r)->barrier();
    in[r] = rank_input(r, 3, K, E, H, Device::cpu());
    for (int round = 0; round < 3; ++round) {
      auto [recv, off, gathered] =
          moe_a2a_dispatch(in[r].experts, {in[r].hidden, in[r].experts}, ws, meta, 4, r, ep, K, E);
      std::vector<double> hv = recv[0].to(DType::kFloat32).to_double_vector();
      for (double& v : hv) v *= static_cast<double>(r + 1);
      out[round][r] =
          moe_a2a_combine(Tensor::from_vector(hv, {ep, 4, H}, kBf), 3, ws, meta, 4, r, ep, K, off);
    }
    EXPECT_EQ(*word(m[0], 0), 5u) << r;
  });
  for (int round = 0; round < 3; ++round) {
    for (int64_t r = 0; r < ep; ++r) {
      const std::vector<double> hs = in[r].hidden.to_double_vector();
      const std::vector<double> o = out[round][r].to_double_vector();
      for (int64_t t = 0; t < 3; ++t) {
        double f = 0;
        for (int64_t q : targets_of(in[r], t, E, ep)) f += static_cast<double>(q + 1);
        for (int64_t h = 0; h < H; ++h) {
          ASSERT_EQ(o[t * H + h], f * hs[t * H + h]) << round << " " << r << " " << t;
        }
      }
    }
  }
}

TEST(MoeA2aModule, WrapViewsOneRanksBytes) {
  std::vector<double> bytes(128);
  for (int i = 0; i < 128; ++i) bytes[i] = i;
  const Tensor ws = Tensor::from_vector(bytes, {2, 64}, DType::kUInt8);
  // Bytes 72..87: rank 1's bytes 8..23, as int32 [2, 2] (little-endian).
  Tensor v = moe_a2a_wrap_payload_tensor_in_workspace(ws, {2}, 72, 88, DType::kInt32);
  EXPECT_EQ(v.shape(), (Shape{2, 2}));
  EXPECT_EQ(v.data_ptr(), static_cast<const char*>(ws.data_ptr()) + 72);
  EXPECT_EQ(v.to_double_vector()[0], 72.0 + 73.0 * 256 + 74.0 * 65536 + 75.0 * 16777216);
  // A view: writes reach the workspace.
  v.fill_(0.0);
  EXPECT_EQ(ws.select(0, 1).to_double_vector()[8], 0.0);
  // A 1-D workspace is one row.
  const Tensor flat = Tensor::from_vector(bytes, {128}, DType::kUInt8);
  EXPECT_EQ(moe_a2a_wrap_payload_tensor_in_workspace(flat, {}, 0, 128, DType::kInt64).shape(),
            (Shape{16}));
  // Upstream's two checks: the length, then the end within the start's row.
  expect_error([&] { moe_a2a_wrap_payload_tensor_in_workspace(ws, {}, 0, 70, kBf); },
               "slice_end - slice_start must belong to a single rank");
  expect_error([&] { moe_a2a_wrap_payload_tensor_in_workspace(ws, {}, 60, 70, kBf); },
               "slice must fall within the workspace size per rank");
  expect_error([&] { moe_a2a_wrap_payload_tensor_in_workspace(ws, {}, 72, 75, DType::kInt32); },
               "not a whole number of torch.int32 elements");
  expect_error([&] { moe_a2a_wrap_payload_tensor_in_workspace(ws, {2}, 72, 84, DType::kInt32); },
               "is invalid for input of size 3");
  expect_error([&] { moe_a2a_wrap_payload_tensor_in_workspace(ws, {}, 73, 77, DType::kInt32); },
               "not a multiple of");
  expect_error([&] { moe_a2a_wrap_payload_tensor_in_workspace(ws, {}, 128, 130, kBf); },
               "outside the workspace");
  expect_error(
      [&] {
        moe_a2a_wrap_payload_tensor_in_workspace(Tensor::zeros({2, 2, 2}, DType::kUInt8), {}, 0, 2,
                                                 kBf);
      },
      "workspace must be shape [ep_size, size_per_rank]");
}

TEST(MoeA2aModule, RefusesWhatWouldLeaveTheWorkspace) {
  const int64_t ep = 2, K = 2, E = 4, H = 8;
  const int64_t size = moe_alltoall_get_moe_workspace_size_per_rank(ep, K, 4, H);
  const Tensor ws = Tensor::zeros({ep, size}, DType::kUInt8);
  // Rank 0 alone: every refusal comes before the exchange.
  const Tensor meta = moe_a2a_initialize(ws, 0, ep, 4);
  const RankInput in = rank_input(0, 3, K, E, H, Device::cpu());
  auto dispatch = [&](const Tensor& w, const Tensor& m, int64_t rank, const Tensor& ex) {
    moe_a2a_dispatch(ex, {in.hidden}, w, m, 8, rank, ep, K, E);
  };
  expect_error([&] { dispatch(ws, meta, 2, in.experts); }, "epRank out of range");
  expect_error(
      [&] {
        dispatch(Tensor::zeros({ep, size / 4}, DType::kInt32), meta, 0, in.experts);
      },
      "Inconsistency of Tensor type: workspace");
  expect_error([&] { moe_a2a_dispatch(in.experts, {in.hidden}, ws, meta, 8, 0, 3, K, E); },
               "workspace first dim must equal ep_size");
  expect_error([&] { moe_a2a_dispatch(in.experts, {in.hidden}, ws, meta, 8, 0, 65, K, E); },
               "epSize must be in the range (0, 64]");
  Tensor bad = meta.clone();
  static_cast<int64_t*>(bad.data_ptr())[7] += 8;  // the second table moved
  expect_error([&] { dispatch(ws, bad, 0, in.experts); }, "metainfo is not moe_a2a_initialize's");
  expect_error([&] { dispatch(ws, meta.to(DType::kFloat64), 0, in.experts); },
               "metainfo must be int64 [10]");
  // Initialized for 4 tokens: 5 would write past the top_k tables.
  const RankInput five = rank_input(0, 5, K, E, H, Device::cpu());
  expect_error([&] { moe_a2a_dispatch(five.experts, {five.hidden}, ws, meta, 8, 0, ep, K, E); },
               "exceeds the max_num_tokens the workspace was initialized for (4)");
  // The layout of 64 tokens does not fit this workspace.
  const Tensor big = moe_a2a_initialize(Tensor::zeros({ep, 8}, DType::kUInt8), 0, ep, 64);
  expect_error([&] { dispatch(ws, big, 0, in.experts); }, "workspace size per rank insufficient");
  const int64_t pd = static_cast<int64_t>(meta.to_double_vector()[9]);
  const Tensor payload = Tensor::zeros({ep, 4, H}, kBf);
  expect_error([&] { moe_a2a_combine(payload, 5, ws, meta, 4, 0, ep, K, pd); },
               "local_num_tokens 5 must be in [0, 4]");
  expect_error([&] { moe_a2a_combine(payload, 3, ws, meta, 4, 0, ep, K, pd - 128); },
               "combine_payload_offset");
  expect_error([&] { moe_a2a_combine(payload, 3, ws, meta, 4, 0, ep, K, pd + 1); },
               "not a multiple of the payload's element size 2");
  expect_error([&] { moe_a2a_combine(payload, 3, ws, meta, 4, 0, ep, 3, pd); },
               "Unsupported top_k: 3");
  expect_error([&] { moe_a2a_combine(payload, 3, ws, meta, 4, 0, ep, K, size); },
               "workspace insufficient for combine payload region");
  expect_error(
      [&] {
        moe_a2a_sanitize_expert_ids(Tensor::zeros({ep, 4}, DType::kInt32), ws, meta, 0, -1);
      },
      "expert_ids must be [ep_size, runtime_max_tokens_per_rank, top_k]");
  expect_error(
      [&] {
        moe_a2a_sanitize_expert_ids(Tensor::zeros({3, 4, K}, DType::kInt32), ws, meta, 0, -1);
      },
      "expert_ids must be [ep_size");
  expect_error([&] { moe_a2a_initialize(ws, -1, ep, 4); }, "epRank out of range");
  expect_error([&] { moe_a2a_initialize(ws, 0, ep, 4, -1); },
               "eplb_stats_num_experts must be non-negative");
  // The statistics a rank's slot holds: 128 bytes over 2 ranks (3 reserved, padded) are 16.
  const Tensor ws3 = Tensor::zeros(
      {ep, moe_a2a_get_workspace_size_per_rank(ep, 4, H * 2, H * 2, 3)}, DType::kUInt8);
  const Tensor meta3 = moe_a2a_initialize(ws3, 0, ep, 4, 3);
  expect_error(
      [&] {
        moe_a2a_dispatch(in.experts, {in.hidden}, ws3, meta3, 8, 0, ep, K, 32, std::nullopt,
                         Tensor::zeros({17}, DType::kInt32));
      },
      "eplb_local_stats size (17) exceeds the eplb_stats_num_experts reserved");
  expect_error(
      [&] {
        moe_a2a_dispatch(in.experts, {in.hidden}, ws3, meta3, 8, 0, ep, K, E, std::nullopt,
                         Tensor::zeros({5}, DType::kInt32));
      },
      "eplb_local_stats size must be <= num_experts");
  // Sizes whose offsets would overflow, a metainfo out of order, ids over the counters.
  expect_error(
      [&] { moe_a2a_dispatch(in.experts, {in.hidden}, ws, meta, int64_t{1} << 62, 0, ep, K, E); },
      "runtime_max_tokens_per_rank 4611686018427387904 is too large");
  expect_error(
      [&] {
        moe_a2a_dispatch(in.experts, {in.hidden}, ws, meta, 8, 0, ep, K, (int64_t{1} << 32) + 1);
      },
      "num_experts must fit in int32");
  Tensor unordered = meta.clone();
  static_cast<int64_t*>(unordered.data_ptr())[7] = -(int64_t{1} << 62);
  expect_error([&] { dispatch(ws, unordered, 0, in.experts); }, "its offsets are not in order");
  expect_error(
      [&] {
        const Tensor over_counters =
            moe_a2a_wrap_payload_tensor_in_workspace(ws, {ep, 4}, 0, ep * 4 * K * 4, DType::kInt32);
        moe_a2a_sanitize_expert_ids(over_counters, ws, meta, 0, -1);
      },
      "must lie in this rank's payload area");
  expect_error([&] { moe_a2a_initialize(ws, 0, ep, (int64_t{1} << 40) + 1); },
               "is too large (at most 1099511627776)");
  // Errors name the module function.
  try {
    dispatch(ws, meta, 2, in.experts);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe_a2a_dispatch"), std::string::npos) << e.what();
  }
}

TEST(MoeA2aModuleReplay, RecordedRanksReplayTogether) {
  namespace fs = std::filesystem;
  comm::ThreadGroup g(2);
  const int64_t ep = 2, K = 2, E = 4, H = 8;
  const Tensor ws =
      Tensor::zeros({ep, moe_alltoall_get_moe_workspace_size_per_rank(ep, K, 8, H)}, DType::kUInt8);
  const fs::path dir = record_dump("a2a_module", [&] {
    g.run([&](int64_t r) {
      const Tensor meta = moe_a2a_initialize(ws, r, ep, 8);
      g.backend(r)->barrier();
      for (int k = 0; k < 2; ++k) {
        const RankInput in = rank_input(r + k, 3 + r - k, K, E, H, Device::cpu());
        auto [recv, off, eplb] =
            moe_a2a_dispatch(in.experts, {in.hidden, in.experts}, ws, meta, 8, r, ep, K, E);
        moe_a2a_sanitize_expert_ids(recv[1], ws, meta, r, 4);
        // Rank 1 combines from the workspace in the second round only.
        const bool view = r == 0 || k == 1;
        const int64_t start = r * ws.size(1) + off;
        Tensor payload = view ? moe_a2a_wrap_payload_tensor_in_workspace(
                                    ws, {ep, 8}, start, start + ep * 8 * H * 2, kBf)
                              : Tensor::zeros({ep, 8, H}, kBf);
        payload.copy_(scaled(recv[0], static_cast<double>(r + 2)));
        moe_a2a_combine(payload, in.experts.size(0), ws, meta, 8, r, ep, K, off, view);
      }
    });
  });
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  // Rank 0: initialize, 2 x (dispatch, sanitize, wrap, combine); rank 1 one wrap less.
  ASSERT_EQ(rs.size(), 17u);
  int dispatches = 0, combines = 0;
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed)
        << r.function_name << ": " << r.error << " " << r.note;
    if (r.function_name == "moe_a2a_dispatch") {
      ++dispatches;
      EXPECT_NE(r.note.find("as a set"), std::string::npos) << r.note;
    }
    if (r.function_name == "moe_a2a_combine") {
      ++combines;
      EXPECT_NE(r.note.find("after its moe_a2a_dispatch"), std::string::npos) << r.note;
    }
  }
  EXPECT_EQ(dispatches, 4);
  EXPECT_EQ(combines, 4);
  fs::remove_all(dir);
}

// ---- replay ----------------------------------------------------------------------------------

TEST(MoeAlltoAllReplay, RecordedRanksReplayTogether) {
  namespace fs = std::filesystem;
  comm::ThreadGroup g(2);
  const fs::path dir = record_dump("a2a", [&] {
    g.run([&](int64_t r) {
      auto a2a = make_a2a(g.backend(r), 8, 2, 4, 8);
      for (int k = 0; k < 2; ++k) {
        const RankInput in = rank_input(r + k, 3 + r - k, 2, 4, 8, Device::cpu());
        auto got = a2a->dispatch(in.experts, {in.hidden, in.experts}, 8, int64_t{4}, int64_t{1});
        // The payload view is a local call: rank 1 uses it in the second round only.
        const bool view = r == 0 || k == 1;
        Tensor payload = view ? a2a->get_combine_payload_tensor_in_workspace(8, 8, kBf)
                              : Tensor::zeros({2, 8, 8}, kBf);
        payload.copy_(scaled(got[0], static_cast<double>(r + 2)));
        a2a->combine(payload, 8, view);
      }
      a2a->checkpoint_prepare();
      a2a->checkpoint_restore(g.backend(r));
    });
  });
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  // Rank 0: __init__, 2 x (dispatch, get_combine_payload..., combine), the checkpoint's two
  // calls; rank 1 one view less.
  ASSERT_EQ(rs.size(), 17u);
  int dispatches = 0;
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed)
        << r.function_name << ": " << r.error << " " << r.note;
    if (r.function_name == "MoeAlltoAll.dispatch") {
      ++dispatches;
      EXPECT_NE(r.note.find("as a set"), std::string::npos) << r.note;
    }
    if (r.function_name == "MoeAlltoAll.combine") {
      EXPECT_NE(r.note.find("after its MoeAlltoAll.dispatch"), std::string::npos) << r.note;
    }
    if (r.function_name == "MoeAlltoAll.checkpoint_restore") {
      EXPECT_NE(r.note.find("after its MoeAlltoAll.checkpoint_prepare"), std::string::npos)
          << r.note;
    }
  }
  EXPECT_EQ(dispatches, 4);
  fs::remove_all(dir);
}

// Upstream numbers a source's rows in its atomics' order: a recording of it has the rows of a
// dispatch (and the combine payload that follows) in another order than token order. Made here by
// swapping two rows of one source in a recorded dispatch's outputs and in the payload of the
// combine after it; the replay compares the dispatch as a set and moves the payload's rows back.
TEST(MoeAlltoAllReplay, RowsInAnotherOrderReplayAsUpstreamsWould) {
  namespace fs = std::filesystem;
  comm::ThreadGroup g(2);
  const fs::path dir = record_dump("a2a_perm", [&] {
    g.run([&](int64_t r) {
      auto a2a = make_a2a(g.backend(r), 8, 2, 4, 8);
      // Every token to both ranks (experts 0 and 3); distinct rows.
      std::vector<double> ex, hv;
      for (int t = 0; t < 4; ++t) {
        ex.insert(ex.end(), {0.0, 3.0});
        for (int h = 0; h < 8; ++h) hv.push_back(r * 40 + t * 8 + h);
      }
      auto got = a2a->dispatch(Tensor::from_vector(ex, {4, 2}, DType::kInt32),
                               {Tensor::from_vector(hv, {4, 8}, kBf)}, 8);
      // Each rank's result depends on the row: (r + 2) * x + row index within the source.
      std::vector<double> pv = got[0].to(Device::cpu()).to_double_vector();
      for (std::size_t i = 0; i < pv.size(); ++i)
        pv[i] = pv[i] * (r + 2) + static_cast<double>(i / 8 % 8);
      a2a->combine(Tensor::from_vector(pv, {2, 8, 8}, kBf), 8);
    });
  });
  // Per object: its dispatch's and its combine's directories.
  std::map<uint64_t, std::pair<std::string, std::string>> calls;
  for (const std::string& d : replay::list_calls(dir.string())) {
    const auto meta = nlohmann::json::parse(
        replay::read_metadata((fs::path(d) / "metadata.jsonl").string()).json);
    const std::string fn = meta.value("function_name", std::string());
    if (!meta.contains("self_id")) continue;
    const uint64_t self = meta["self_id"].get<uint64_t>();
    if (fn == "MoeAlltoAll.dispatch") calls[self].first = d;
    if (fn == "MoeAlltoAll.combine") calls[self].second = d;
  }
  ASSERT_EQ(calls.size(), 2u);
  auto swap_rows = [](Tensor t, int64_t a, int64_t b) {  // rows a, b of source 1, [ep, rmax, n]
    Tensor c = t.contiguous().clone();
    const auto rb = static_cast<std::size_t>(c.size(2)) * c.element_size();
    char* base = static_cast<char*>(c.data_ptr()) + static_cast<std::size_t>(c.size(1)) * rb;
    std::vector<char> tmp(rb);
    std::memcpy(tmp.data(), base + a * rb, rb);
    std::memcpy(base + a * rb, base + b * rb, rb);
    std::memcpy(base + b * rb, tmp.data(), rb);
    return c;
  };
  for (const auto& [self, dc] : calls) {
    ASSERT_FALSE(dc.first.empty());
    ASSERT_FALSE(dc.second.empty());
    NamedTensors out = load_torch((fs::path(dc.first) / "outputs.pt").string());
    for (auto& [k, t] : out) t = swap_rows(t, 0, 2);
    save_torch((fs::path(dc.first) / "outputs.pt").string(), out);
    NamedTensors in = load_torch((fs::path(dc.second) / "inputs.pt").string());
    ASSERT_FALSE(in.empty());
    for (auto& [k, t] : in) {
      if (t.dim() == 3) t = swap_rows(t, 0, 2);
    }
    save_torch((fs::path(dc.second) / "inputs.pt").string(), in);
  }
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  ASSERT_EQ(rs.size(), 6u);
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed)
        << r.function_name << ": " << r.error << " " << r.note;
  }
  fs::remove_all(dir);
}

// ---- CUDA ------------------------------------------------------------------------------------

TEST(MoeAlltoAllCuda, MatchesTheFormulaOnOneGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  round_trip(4, 2, 8, 16, Device::cuda(0), false, 3);
  round_trip(2, 8, 6, 264, Device::cuda(0), true, 2);
  round_trip(3, 4, 7, 8, Device::cuda(0), false, 1);
  round_trip(2, 2, 4, 12, Device::cuda(0), false, 2);  // 24-byte rows: the element-wise sum
  round_trip(3, 4, 7, 8, Device::cuda(0), true, 2, 0, kBf, true);  // the module functions
  // Rank rows 8 bytes off 16-byte alignment: the element-wise sum again (16-byte loads would
  // fault).
  round_trip(2, 2, 4, 8, Device::cuda(0), false, 2, 8);
}

}  // namespace
}  // namespace flashinfer::testing
