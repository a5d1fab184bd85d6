// trtllm_bf16_moe / trtllm_bf16_routed_moe on CUDA against the CPU reference (skipped without a
// GPU), and the device weight index checked on the host against the CPU's layout transform.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "api/moe_layout.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/ops/backends.h"
#include "kernels/moe_bf16_params.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

const Tolerance kBf16Tol = default_tolerance(DType::kBFloat16);

// The index the CUDA kernel reads stored weights with (moe_stored_row / moe_weight_offset, built
// by moe_stored_weight_index) is the inverse of the host transform the CPU reference uses
// (moe_plain_weights, itself checked against upstream's preparation in test_moe_quant.cpp): every
// plain element, read through the index from the stored tensor, has the same bits.
TEST(TrtllmBf16MoeLayout, DeviceIndexInvertsTheHostLayout) {
  const int64_t E = 2, mn = 64, k = 128;
  uint64_t seed = 1;
  for (bool shuffled : {false, true}) {
    for (bool interleave : {false, true}) {
      if (interleave && !shuffled) continue;
      for (int64_t tile : {int64_t{64}, int64_t{128}}) {
        for (int64_t bk : {int64_t{0}, int64_t{16}, int64_t{64}}) {
          SCOPED_TRACE("shuffled " + std::to_string(shuffled) + " interleave " +
                       std::to_string(interleave) + " tile " + std::to_string(tile) + " bk " +
                       std::to_string(bk));
          const Shape shape = bk == 0 ? Shape({E, mn, k}) : Shape({E, k / bk, mn, bk});
          const Tensor stored = rand_tensor(shape, DType::kBFloat16, ++seed);
          api::MoeWeightFormat f;
          f.shuffled = shuffled;
          f.layout = bk == 0 ? WeightLayout::MajorK : WeightLayout::BlockMajorK;
          f.epilogue_tile_m = tile;
          f.gated_interleave = interleave;
          const Tensor plain = api::moe_plain_weights(stored, E, mn, k, f, "test", "w");
          const kernels::MoeWeightIndex ix =
              api::moe_stored_weight_index(stored, E, mn, k, f, "test", "w");
          EXPECT_EQ(ix.block_k, bk);
          EXPECT_EQ(ix.shuffle_block, tile == 128 ? 32 : 16);
          const auto* sv = static_cast<const uint16_t*>(stored.data_ptr());
          const auto* pv = static_cast<const uint16_t*>(plain.data_ptr());
          int64_t bad = 0;
          for (int64_t e = 0; e < E; ++e) {
            for (int64_t j = 0; j < mn; ++j) {
              const int64_t row = kernels::moe_stored_row(ix, mn, j);
              for (int64_t c = 0; c < k; ++c) {
                bad += sv[kernels::moe_weight_offset(ix, mn, k, e, row, c)] !=
                       pv[(e * mn + j) * k + c];
              }
            }
          }
          EXPECT_EQ(bad, 0);
        }
      }
    }
  }
  // Hand-checked: 32-row blocks put plain row 1 at stored row 8 (r % 4 * 8 + r / 4); with the
  // gated interleave plain row 1 (up 1) is interleaved row 2, stored at 16, and plain row 32
  // (gate 0) is interleaved row 1, stored at 8.
  kernels::MoeWeightIndex ix;
  ix.shuffled = true;
  EXPECT_EQ(kernels::moe_stored_row(ix, 64, 1), 8);
  EXPECT_EQ(kernels::moe_stored_row(ix, 64, 33), 32 + 8);
  ix.gated_interleave = true;
  EXPECT_EQ(kernels::moe_stored_row(ix, 64, 1), 16);
  EXPECT_EQ(kernels::moe_stored_row(ix, 64, 32), 8);
  // BlockMajorK [E, k / bk, mn, bk]: element (e 1, row 3, column 20) with bk 16 and k 32 is at
  // ((1 * 2 + 1) * 64 + 3) * 16 + 4.
  ix.block_k = 16;
  EXPECT_EQ(kernels::moe_weight_offset(ix, 64, 32, 1, 3, 20), (3 * 64 + 3) * 16 + 4);
}

TEST(TrtllmBf16MoeLayout, BackendTableListsCuda) {
  for (const char* op : {"trtllm_bf16_moe", "trtllm_bf16_routed_moe"}) {
    EXPECT_TRUE(op_has_backend(op, DeviceType::kCPU)) << op;
    EXPECT_EQ(op_has_backend(op, DeviceType::kCUDA), cuda_compiled()) << op;
  }
}

// ---- CUDA vs the CPU reference --------------------------------------------------------------

constexpr int64_t kT = 13, kE = 8, kH = 128, kI = 64, kOff = 2, kLocal = 4;

std::optional<Tensor> to_dev(const std::optional<Tensor>& t, Device d) {
  if (!t) return std::nullopt;
  return t->to(d);
}

struct Bf16Call {
  int64_t method = 1, top_k = 2, act = 3;
  std::optional<int64_t> n_group, topk_group;
  bool shuffled = false;
  WeightLayout layout = WeightLayout::MajorK;
  bool finalize = true;
  std::optional<double> scale;
  Tensor logits, bias, x, w1, w2;
  std::optional<Tensor> alpha, beta, limit;
};

// w1 / w2 random in the stored shape of `layout` (any tensor of that shape is a valid stored
// layout: the CPU turns it back on the host, CUDA reads it in place).
Bf16Call make_call(int64_t method, int64_t act, bool shuffled, WeightLayout layout, uint64_t seed) {
  Bf16Call c;
  c.method = method;
  c.act = act;
  c.top_k = method == 3 ? 1 : 2;
  c.shuffled = shuffled;
  c.layout = layout;
  const int64_t N1 = (act == 3 || act == 4 || act == 5 || act == 7) ? 2 * kI : kI;
  c.logits = rand_tensor({kT, kE}, DType::kFloat32, seed, -3.0, 3.0);
  c.bias = rand_tensor({kE}, DType::kFloat32, seed + 1, -0.3, 0.3);
  c.x = rand_tensor({kT, kH}, DType::kBFloat16, seed + 2, -1.0, 1.0);
  const bool block = layout == WeightLayout::BlockMajorK;
  c.w1 = rand_tensor(block ? Shape({kLocal, kH / 64, N1, 64}) : Shape({kLocal, N1, kH}),
                     DType::kBFloat16, seed + 3, -0.2, 0.2);
  c.w2 = rand_tensor(block ? Shape({kLocal, kI / 64, kH, 64}) : Shape({kLocal, kH, kI}),
                     DType::kBFloat16, seed + 4, -0.2, 0.2);
  return c;
}

TrtllmMoeResult run_logits(const Bf16Call& c, Device d, const std::optional<Tensor>& replay) {
  return trtllm_bf16_moe(c.logits.to(d), c.bias.to(d), c.x.to(d), c.w1.to(d), c.w2.to(d), kE,
                         c.top_k, c.n_group, c.topk_group, kI, kOff, kLocal, c.scale, c.method,
                         c.shuffled, c.layout, c.finalize, true, 8192, c.act, true,
                         to_dev(replay, d), to_dev(c.alpha, d), to_dev(c.beta, d),
                         to_dev(c.limit, d));
}

std::vector<Tensor> on_host(const TrtllmMoeResult& r) {
  std::vector<Tensor> out;
  for (const Tensor& t : r.tensors) out.push_back(t.to(Device::cpu()));
  return out;
}

// Every routing method from logits, local experts [2, 6) of 8; DeepSeekV3 with 4 groups of 2
// (2 kept) and the bias; routing_replay_out must hold the same expert ids.
TEST(TrtllmBf16MoeCuda, EveryRoutingMethodMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  for (int64_t method = 0; method <= 9; ++method) {
    SCOPED_TRACE("method " + std::to_string(method));
    Bf16Call c = make_call(method, 3, false, WeightLayout::MajorK, 100 + 10 * method);
    if (method == 2) {
      c.n_group = 4;
      c.topk_group = 2;
      c.scale = 2.5;
    }
    Tensor rep_cpu = Tensor::zeros({kT, c.top_k}, DType::kInt16);
    Tensor rep_dev = Tensor::zeros({kT, c.top_k}, DType::kInt16, d);
    const Tensor ref = run_logits(c, Device::cpu(), rep_cpu).tensors[0];
    const Tensor got = run_logits(c, d, rep_dev).tensors[0].to(Device::cpu());
    EXPECT_TRUE(all_close(got, ref, kBf16Tol));
    EXPECT_TRUE(all_close(rep_dev.to(Device::cpu()), rep_cpu, {0, 0}));
  }
}

// Upstream's default layout (shuffled BlockMajorK, 128-byte blocks, GEMM1 rows interleaved for
// a gated activation) and the other stored layouts, for gated and plain activations, and
// SwigluBias with per-expert alpha / beta / clamp limit.
TEST(TrtllmBf16MoeCuda, StoredLayoutsAndActivationsMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  struct Layout {
    bool shuffled;
    WeightLayout layout;
  };
  for (const Layout l :
       {Layout{true, WeightLayout::BlockMajorK}, Layout{true, WeightLayout::MajorK},
        Layout{false, WeightLayout::BlockMajorK}}) {
    for (int64_t act : {int64_t{3}, int64_t{5}, int64_t{6}, int64_t{4}}) {
      SCOPED_TRACE("shuffled " + std::to_string(l.shuffled) + " layout " +
                   std::string(weight_layout_name(l.layout)) + " activation " +
                   std::to_string(act));
      Bf16Call c = make_call(2, act, l.shuffled, l.layout, 300 + static_cast<uint64_t>(act));
      c.n_group = 4;
      c.topk_group = 2;
      c.scale = 2.5;
      if (act == 5) {
        c.alpha = rand_tensor({kLocal}, DType::kFloat32, 7, 1.0, 2.0);
        c.beta = rand_tensor({kLocal}, DType::kFloat32, 8, -0.5, 0.5);
        c.limit = rand_tensor({kLocal}, DType::kFloat32, 9, 0.1, 0.3);
      }
      const Tensor ref = run_logits(c, Device::cpu(), std::nullopt).tensors[0];
      const Tensor got = run_logits(c, d, std::nullopt).tensors[0].to(Device::cpu());
      EXPECT_TRUE(all_close(got, ref, kBf16Tol));
    }
  }
}

// Precomputed routing: the packed form and the (ids, weights) form with bf16 and fp32 weights,
// some pairs on experts outside the local range [2, 6) (skipped on both backends).
TEST(TrtllmBf16RoutedMoeCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  const int64_t K = 3;
  std::vector<double> ids, wts, packed;
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = (t * 3 + k * 5) % kE;
      const double w = 0.125 + 0.25 * static_cast<double>((t + k) % 3);
      ids.push_back(static_cast<double>(e));
      wts.push_back(w);
      packed.push_back(static_cast<double>(static_cast<int32_t>(
          (static_cast<uint32_t>(e) << 16) | float_to_bfloat16_bits(static_cast<float>(w)))));
    }
  }
  const Bf16Call c = make_call(1, 3, true, WeightLayout::BlockMajorK, 500);
  const Tensor id_t = Tensor::from_vector(ids, {kT, K}, DType::kInt32);
  for (int form = 0; form < 3; ++form) {
    SCOPED_TRACE("form " + std::to_string(form));
    auto run = [&](Device dev) {
      const MoeTopkIds r =
          form == 0 ? MoeTopkIds(Tensor::from_vector(packed, {kT, K}, DType::kInt32).to(dev))
                    : MoeTopkIds(id_t.to(dev),
                                 Tensor::from_vector(wts, {kT, K},
                                                     form == 1 ? DType::kBFloat16 : DType::kFloat32)
                                     .to(dev));
      Tensor rep = Tensor::zeros({kT, K}, DType::kInt16, dev);
      Tensor out =
          trtllm_bf16_routed_moe(r, c.x.to(dev), c.w1.to(dev), c.w2.to(dev), kE, K, std::nullopt,
                                 std::nullopt, kI, kOff, kLocal, std::nullopt, 1, true,
                                 WeightLayout::BlockMajorK, true, true, std::nullopt, 8192, 3, rep);
      return std::vector<Tensor>{out.to(Device::cpu()), rep.to(Device::cpu())};
    };
    const std::vector<Tensor> ref = run(Device::cpu()), got = run(d);
    EXPECT_TRUE(all_close(got[0], ref[0], kBf16Tol));
    EXPECT_TRUE(all_close(got[1], ref[1], {0, 0}));
  }
}

// do_finalize=False: [gemm2_output, expert_weights, expanded_idx_to_permuted_idx] as the CPU's
// (same permuted order, -1 for pairs with no local expert, zero rows past the local pairs).
TEST(TrtllmBf16MoeCuda, UnfinalizedMatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  for (int64_t method : {int64_t{1}, int64_t{2}}) {
    SCOPED_TRACE("method " + std::to_string(method));
    Bf16Call c = make_call(method, 3, true, WeightLayout::BlockMajorK, 700 + method);
    if (method == 2) {
      c.n_group = 4;
      c.topk_group = 2;
      c.scale = 2.5;
    }
    c.finalize = false;
    const std::vector<Tensor> ref = on_host(run_logits(c, Device::cpu(), std::nullopt));
    const std::vector<Tensor> got = on_host(run_logits(c, d, std::nullopt));
    ASSERT_EQ(ref.size(), 3u);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_TRUE(all_close(got[2], ref[2], {0, 0}));
    EXPECT_TRUE(all_close(got[1], ref[1], kBf16Tol));
    EXPECT_TRUE(all_close(got[0], ref[0], kBf16Tol));
  }
  // The packed routed form.
  std::vector<double> packed;
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t k = 0; k < 2; ++k) {
      const uint32_t e = static_cast<uint32_t>((t + 4 * k) % kE);
      packed.push_back(static_cast<double>(
          static_cast<int32_t>((e << 16) | float_to_bfloat16_bits(k == 0 ? 0.75f : 0.25f))));
    }
  }
  const Bf16Call c = make_call(1, 3, false, WeightLayout::MajorK, 800);
  auto run = [&](Device dev) {
    return on_host(trtllm_bf16_routed_moe(
        MoeTopkIds(Tensor::from_vector(packed, {kT, 2}, DType::kInt32).to(dev)), c.x.to(dev),
        c.w1.to(dev), c.w2.to(dev), kE, 2, std::nullopt, std::nullopt, kI, kOff, kLocal,
        std::nullopt, 1, false, WeightLayout::MajorK, false));
  };
  const std::vector<Tensor> ref = run(Device::cpu()), got = run(d);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(all_close(got[2], ref[2], {0, 0}));
  EXPECT_TRUE(all_close(got[1], ref[1], {0, 0}));
  EXPECT_TRUE(all_close(got[0], ref[0], kBf16Tol));
}

// What the CUDA routing cannot hold is refused by name (replay then runs the call on the CPU):
// grouped DeepSeekV3 over more than 32 groups, more than 512 experts from logits.
TEST(TrtllmBf16MoeCuda, RoutingLimitsAreRefusedByName) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  const int64_t E = 128;
  Tensor x = rand_tensor({2, kH}, DType::kBFloat16, 1).to(d);
  Tensor w1 = rand_tensor({1, 2 * kI, kH}, DType::kBFloat16, 2).to(d);
  Tensor w2 = rand_tensor({1, kH, kI}, DType::kBFloat16, 3).to(d);
  Tensor logits = rand_tensor({2, E}, DType::kFloat32, 4).to(d);
  EXPECT_FI_ERROR((void)trtllm_bf16_moe(logits, std::nullopt, x, w1, w2, E, 2, 64, 2, kI, 0, 1, 1.0,
                                        2, false, WeightLayout::MajorK),
                  "trtllm_bf16_moe", "n_group");
  const int64_t big = 520;
  Tensor lb = rand_tensor({2, big}, DType::kFloat32, 5).to(d);
  EXPECT_FI_ERROR(
      (void)trtllm_bf16_moe(lb, std::nullopt, x, w1, w2, big, 2, std::nullopt, std::nullopt, kI, 0,
                            1, std::nullopt, 1, false, WeightLayout::MajorK),
      "trtllm_bf16_moe", "num_experts");
}

}  // namespace
}  // namespace flashinfer::testing
