// quantized_all_reduce (flashinfer.comm.quantized_allreduce): the arithmetic's rules by hand, a
// two-rank call worked out by hand, every rank's output against the formula over stripes and
// groups, upstream's checks, replay of every rank's recorded calls, and the CUDA kernel against
// the CPU reference bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "kernels/quantized_allreduce_rules.h"
#include "ops/comm_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

using testing::expect_error;
using testing::rand_tensor;
using testing::record_dump;
namespace k = kernels;
constexpr DType kBf = DType::kBFloat16;

Tensor bf16_of(const std::vector<double>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, kBf);
  auto* p = static_cast<uint16_t*>(t.data_ptr());
  for (std::size_t i = 0; i < v.size(); ++i)
    p[i] = float_to_bfloat16_bits(static_cast<float>(v[i]));
  return t;
}

TEST(QuantizedAllReduceRules, ScalesQuantizeAndAccumulateByHand) {
  // Triton's fp32 `/` is div.full.f32: amax * RN(1/448) and 448 * rcp(amax) on sm_90.
  const float rcp448 = k::f32_from_bits(0x3B124925u);
  EXPECT_EQ(rcp448, 1.0f / 448.0f);
  const k::QarScales one = k::qar_scales(448.0f);
  EXPECT_EQ(one.inv, 1.0f);
  EXPECT_EQ(one.quant, 1.0f);
  const k::QarScales floor = k::qar_scales(0.0f);  // all zeros: the 1e-12 floor
  EXPECT_EQ(floor.inv, 1e-12f * rcp448);
  EXPECT_EQ(floor.quant, (1.0f / 1e-12f) * 448.0f);
  // 672 * RN(1/448) is 1.50000007, one place above 1.5 (IEEE 672 / 448 is 1.5 exactly).
  EXPECT_EQ(k::qar_scales(672.0f).inv, k::f32_from_bits(0x3FC00001u));
  EXPECT_EQ(k::qar_scales(3.0f).inv, 3.0f * rcp448);
  EXPECT_EQ(k::qar_scales(672.0f).quant, (1.0f / 672.0f) * 448.0f);
  // Above 2^126 both sides are scaled by 1/4: 112 * RN(1 / (amax / 4)); infinity gives 0.
  const float big = 3.0e38f;
  EXPECT_EQ(k::qar_scales(big).quant, (1.0f / (big * 0.25f)) * 112.0f);
  EXPECT_EQ(k::qar_scales(std::numeric_limits<float>::infinity()).quant, 0.0f);
  EXPECT_EQ(k::qar_quantize(1.0f, 1.0f), 0x38);
  EXPECT_EQ(k::qar_quantize(8.5f, 1.0f), 0x50);      // a tie: to 8, the even code
  EXPECT_EQ(k::qar_quantize(500.0f, 1.0f), 0x7E);    // clamped to 448
  EXPECT_EQ(k::qar_quantize(-1000.0f, 1.0f), 0xFE);  // clamped to -448
  // Triton's symmetric clamp on sm_90 is min.xorsign.abs: a (positive canonical) NaN is +448.
  EXPECT_EQ(k::qar_quantize(std::numeric_limits<float>::quiet_NaN(), 1.0f), 0x7E);
  EXPECT_EQ(k::qar_quantize(std::numeric_limits<float>::infinity(), 0.0f), 0x7E);  // inf * 0
  // A NaN sum is bf16 0x7FFF, as cvt.rn.bf16.f32 writes it.
  EXPECT_EQ(k::qar_to_bf16(std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(k::qar_to_bf16(-std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(k::qar_to_bf16(1.00390625f), 0x3F80);  // a tie, to even
  // One rounding: (-(1.125 + 2^-23)) + 1.125 * (1 + 2^-23) is 2^-26 exactly; rounding the
  // product first would give 0.
  const float inv = 1.0f + std::ldexp(1.0f, -23);
  EXPECT_EQ(k::qar_accumulate(-(1.125f + std::ldexp(1.0f, -23)), 0x39, inv), std::ldexp(1.0f, -26));
  EXPECT_EQ(k::qar_dequantize(0x39, 1.5f), float_to_bfloat16_bits(1.6875f));
  for (int64_t i : {0, 7}) EXPECT_EQ(k::qar_owner(i, 8, 2), 0);
  for (int64_t i : {8, 15}) EXPECT_EQ(k::qar_owner(i, 8, 2), 1);
  EXPECT_EQ(k::qar_owner(16, 8, 2), 0);
  EXPECT_EQ(k::qar_owner(40, 8, 4), 1);
}

std::vector<std::vector<double>> run_ranks(const std::vector<Tensor>& in, Device dev,
                                           int64_t scale_group, std::optional<int64_t> block,
                                           bool in_place = false,
                                           std::optional<int64_t> max_blocks = std::nullopt) {
  const auto W = static_cast<int64_t>(in.size());
  comm::ThreadGroup g(W, dev);
  std::vector<std::vector<double>> got(in.size());
  g.run([&](int64_t r) {
    Tensor x = in_place ? in[r].to(dev).clone() : in[r].to(dev);
    Tensor out =
        quantized_all_reduce(x, g.backend(r), scale_group, block, std::nullopt, max_blocks,
                             std::nullopt, in_place ? std::optional<Tensor>(x) : std::nullopt);
    if (in_place) {
      EXPECT_EQ(out.data_ptr(), x.data_ptr());
    }
    got[r] = out.to(Device::cpu()).to_double_vector();
  });
  return got;
}

// Two ranks, groups of 8, stripes of 8: rank 0 owns elements 0-7, rank 1 elements 8-15.
TEST(QuantizedAllReduce, TwoRanksByHand) {
  const std::vector<Tensor> in = {
      bf16_of({448, 16, 2, 0.5, -3, 6, 0, 10, 224, 3.3, 0, 0, 0, 0, 0, 0}),
      bf16_of({448, 1, 1, 1, 1, 1, 1, 1, 448, 0.1, 0, 0, 0, 0, 0, 0})};
  const auto got = run_ranks(in, Device::cpu(), 8, 8);
  // Group 0 (scale 1 on both ranks: exact) sums to 896, 17, 3, 1.5, -2, 7, 1, 11; rank 0 keeps
  // it, rank 1 gets it requantized at scale 896 * RN(1/448) = 2, where 17 / 2 = 8.5 ties to 8.
  // Group 1: rank 0's scale is 224 / 448 (3.3 -> bf16 3.296875 -> 6.59375 -> e4m3 6.5 -> 3.25),
  // rank 1's is 1 (0.1 -> bf16 0.10009765625 -> e4m3 0.1015625); the sum 3.3515625 is 3.34375 in
  // bf16 for its owner, rank 1; rank 0 gets it at scale 672 * RN(1/448) = 1.5 + 2^-23:
  // 2.234375 -> 2.25 -> 3.37500027 -> bf16 3.375.
  const std::vector<double> r0 = {896, 17, 3, 1.5, -2, 7, 1, 11, 672, 3.375, 0, 0, 0, 0, 0, 0};
  const std::vector<double> r1 = {896, 16, 3, 1.5, -2, 7, 1, 11, 672, 3.34375, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(got[0], r0);
  EXPECT_EQ(got[1], r1);
  // In place (output is inp), as the custom op allows.
  EXPECT_EQ(run_ranks(in, Device::cpu(), 8, 8, true), got);
}

// An infinity makes its group's quant scale 448 * rcp(inf) = 0 and its dequant scale infinite:
// the infinity's code is the clamp's +448 for NaN (inf * 0), the others' 0, and 0 * inf is NaN.
TEST(QuantizedAllReduce, AnInfinityPoisonsItsGroupAsUpstreamsKernelDoes) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Tensor> in = {bf16_of({inf, 1, 2, 3, 4, 5, 6, 7}),
                                  bf16_of({1, 1, 1, 1, 1, 1, 1, 1})};
  comm::ThreadGroup g(2);
  std::vector<std::vector<uint16_t>> bits(2);
  g.run([&](int64_t r) {
    const Tensor out = quantized_all_reduce(in[r], g.backend(r), 8, 8);
    const auto* p = static_cast<const uint16_t*>(out.data_ptr());
    bits[r].assign(p, p + 8);
  });
  // Rank 0 owns the group: inf, then NaN (bf16 0x7FFF) where 0 * inf was added.
  EXPECT_EQ(bits[0][0], 0x7F80);
  for (int j = 1; j < 8; ++j) EXPECT_EQ(bits[0][j], 0x7FFF) << j;
  // Rank 1 gets the requantized group: amax inf (the max skips NaN), every product NaN or
  // inf * 0, so every code +448, and 448 * inf.
  for (int j = 0; j < 8; ++j) EXPECT_EQ(bits[1][j], 0x7F80) << j;
}

// What rank `rank` receives, from the formula: per group, every rank's input quantized, summed
// in rank order; kept by the stripe's owner, requantized for the rest.
std::vector<double> expected(const std::vector<Tensor>& in, int64_t rank, int64_t sg, int64_t bs) {
  const int64_t n = in[0].numel(), W = static_cast<int64_t>(in.size());
  std::vector<double> out(static_cast<std::size_t>(n));
  for (int64_t g0 = 0; g0 < n; g0 += sg) {
    const int64_t len = std::min(sg, n - g0);
    std::vector<float> acc(static_cast<std::size_t>(len), 0.0f);
    for (int64_t r = 0; r < W; ++r) {
      const auto x = in[r].to_double_vector();
      float m = 0.0f;
      for (int64_t j = 0; j < len; ++j) m = std::max(m, std::fabs(static_cast<float>(x[g0 + j])));
      const k::QarScales s = k::qar_scales(m);
      for (int64_t j = 0; j < len; ++j) {
        acc[j] = k::qar_accumulate(acc[j], k::qar_quantize(static_cast<float>(x[g0 + j]), s.quant),
                                   s.inv);
      }
    }
    const bool own = (g0 / bs) % W == rank;
    float m = 0.0f;
    for (float a : acc) m = std::max(m, std::fabs(a));
    const k::QarScales s = k::qar_scales(m);
    for (int64_t j = 0; j < len; ++j) {
      const uint16_t b = own ? float_to_bfloat16_bits(acc[j])
                             : k::qar_dequantize(k::qar_quantize(acc[j], s.quant), s.inv);
      out[g0 + j] = bfloat16_bits_to_float(b);
    }
  }
  return out;
}

std::vector<Tensor> rand_inputs(int64_t W, int64_t n, uint64_t seed) {
  std::vector<Tensor> in;
  for (int64_t r = 0; r < W; ++r) in.push_back(rand_tensor({n / 8, 8}, kBf, seed + r, -3.0, 3.0));
  return in;
}

// One rank, groups of 4 (below a 16-byte vector), stripes raised to the group size.
TEST(QuantizedAllReduce, OneRankAndSmallGroups) {
  const auto in = rand_inputs(1, 64, 450);
  EXPECT_EQ(run_ranks(in, Device::cpu(), 4, 2)[0], expected(in, 0, 4, 4));
  const auto two = rand_inputs(2, 64, 460);
  const auto got = run_ranks(two, Device::cpu(), 4, 8);
  for (int64_t r = 0; r < 2; ++r) EXPECT_EQ(got[r], expected(two, r, 4, 8));
}

TEST(QuantizedAllReduce, EveryRankGetsTheFormulaWithUpstreamsDefaults) {
  // 4 ranks, 3.5 strides of 4 x 4096 elements (the default block), groups of 256: the last
  // stride's stripes are partly or wholly past the end.
  const int64_t n = 4 * 4096 * 3 + 2 * 4096 + 512;
  const auto in = rand_inputs(4, n, 300);
  const auto got = run_ranks(in, Device::cpu(), 256, std::nullopt);
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(got[r], expected(in, r, 256, 4096)) << "rank " << r;
  // The owner's stripes are the precise ones: rank 0 and rank 1 differ in both ranks' stripes.
  int64_t differ0 = 0, differ1 = 0;
  for (int64_t i = 0; i < 4096; ++i) differ0 += got[0][i] != got[1][i];
  for (int64_t i = 4096; i < 8192; ++i) differ1 += got[0][i] != got[1][i];
  EXPECT_GT(differ0, 100);
  EXPECT_GT(differ1, 100);
  // Close to the exact sum: two FP8 roundings of at most 1/16 of a group's scale each.
  std::vector<double> exact(static_cast<std::size_t>(n), 0.0);
  for (const Tensor& t : in) {
    const auto x = t.to_double_vector();
    for (int64_t i = 0; i < n; ++i) exact[i] += x[i];
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got[2][i], exact[i], 4 * 3.0 / 16 + 12.0 / 16) << i;
  // Small tensors clamp both to numel: 64 elements are one group and one stripe (rank 0's).
  const auto small = rand_inputs(2, 64, 400);
  const auto s = run_ranks(small, Device::cpu(), 256, std::nullopt);
  EXPECT_EQ(s[0], expected(small, 0, 64, 64));
  EXPECT_EQ(s[1], expected(small, 1, 64, 64));
  EXPECT_NE(s[0], s[1]);
}

TEST(QuantizedAllReduce, BuffersGrowAndFollowTheGroup) {
  comm::ThreadGroup g(2);
  const auto a = rand_inputs(2, 512, 500), b = rand_inputs(2, 16384, 510);
  g.run([&](int64_t r) {
    // Small, larger (a new buffer every rank makes together), small again (the larger kept),
    // and another scale group.
    for (int pass = 0; pass < 2; ++pass) {
      EXPECT_EQ(quantized_all_reduce(a[r], g.backend(r)).to_double_vector(),
                expected(a, r, 256, 512));
      EXPECT_EQ(quantized_all_reduce(b[r], g.backend(r), 64, 1024).to_double_vector(),
                expected(b, r, 64, 1024));
    }
  });
  // A second group of the same size, alive at the same time, keeps its own buffers.
  comm::ThreadGroup h(2);
  h.run([&](int64_t r) {
    EXPECT_EQ(quantized_all_reduce(a[r], h.backend(r)).to_double_vector(),
              expected(a, r, 256, 512));
  });
}

TEST(QuantizedAllReduce, RefusesWhatUpstreamRefuses) {
  comm::ThreadGroup g(2);
  auto b = g.backend(0);
  const Tensor x = Tensor::zeros({64}, kBf);
  expect_error([&] { quantized_all_reduce(Tensor::zeros({64}, DType::kFloat16), b); },
               "Expected bfloat16, got torch.float16");
  expect_error(
      [&] {
        quantized_all_reduce(Tensor::zeros({8, 16}, kBf).slice(1, 0, 8), b);
      },
      "Input tensor must be contiguous");
  expect_error([&] { quantized_all_reduce(Tensor::zeros({12}, kBf), b); },
               "numel must be divisible by 8, got 12");
  // numel 0: output (or a new empty tensor) without meeting the group, which may be absent.
  EXPECT_EQ(quantized_all_reduce(Tensor::zeros({0, 4}, kBf), nullptr).numel(), 0);
  const Tensor none = Tensor::zeros({0}, kBf);
  EXPECT_EQ(quantized_all_reduce(none, nullptr, 256, std::nullopt, std::nullopt, std::nullopt,
                                 std::nullopt, none)
                .data_ptr(),
            none.data_ptr());
  expect_error([&] { quantized_all_reduce(x, nullptr); }, "a CommBackend is required");
  // 1000 elements: block 1000 does not divide into groups of 256.
  expect_error([&] { quantized_all_reduce(Tensor::zeros({1000}, kBf), b); },
               "block_size (1000) must be divisible by scale_group (256)");
  comm::ThreadGroup three(3);
  expect_error([&] { quantized_all_reduce(x, three.backend(0)); },
               "block_size (64) must be divisible by world_size (3)");
  // 200 elements: one group and stripe of 200, which upstream's Triton kernel cannot compile.
  expect_error([&] { quantized_all_reduce(Tensor::zeros({200}, kBf), b); },
               "scale_group (200) and block_size (200) must be powers of two");
  expect_error([&] { quantized_all_reduce(x, b, 0); }, "scale_group must be positive");
  expect_error([&] { quantized_all_reduce(x, b, 256, std::nullopt, 12); },
               "num_warps must be a power of two");
  expect_error([&] { quantized_all_reduce(x, b, 256, std::nullopt, std::nullopt, 0); },
               "max_num_blocks must be positive");
  auto out_err = [&](const Tensor& o, const std::string& what) {
    expect_error(
        [&] {
          quantized_all_reduce(x, b, 256, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                               o);
        },
        what);
  };
  out_err(Tensor::zeros({8, 8}, kBf),
          "output shape torch.Size([8, 8]) must match input shape torch.Size([64])");
  out_err(Tensor::zeros({64}, DType::kFloat32),
          "output dtype torch.float32 must match input dtype torch.bfloat16");
  out_err(Tensor::zeros({128}, kBf).slice(0, 0, 128, 2), "Output tensor must be contiguous");
  comm::ThreadGroup many(32);
  expect_error([&] { quantized_all_reduce(x, many.backend(0)); }, "at most 16 ranks, got 32");
}

TEST(QuantizedAllReduce, RecordedRanksReplayTogether) {
  namespace fs = std::filesystem;
  comm::ThreadGroup g(4);
  const auto a = rand_inputs(4, 4096, 600), c = rand_inputs(4, 1024, 610);
  const fs::path dir = record_dump("qar", [&] {
    g.run([&](int64_t r) {
      quantized_all_reduce(a[r], g.backend(r), 128, 512);
      Tensor out = Tensor::empty({1024}, kBf);
      quantized_all_reduce(c[r].reshape({1024}), g.backend(r), 256, std::nullopt, std::nullopt,
                           std::nullopt, std::nullopt, out);
    });
  });
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  ASSERT_EQ(rs.size(), 8u);
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    EXPECT_NE(r.note.find("a collective"), std::string::npos) << r.note;
    // Each record's group says its rank; the replay placed the call there.
    const std::string key = "ThreadCommBackend(rank=";
    const auto at = r.metadata_json.find(key);
    ASSERT_NE(at, std::string::npos) << r.metadata_json;
    const char rank = r.metadata_json[at + key.size()];
    EXPECT_NE(r.note.find(std::string("this is rank ") + rank + ","), std::string::npos) << r.note;
  }
  fs::remove_all(dir);
}

TEST(QuantizedAllReduceCuda, MatchesCpuBitForBit) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t W, n, sg;
    std::optional<int64_t> bs;
  };
  for (const Case& c :
       {Case{2, 16, 8, 8}, Case{2, 4 * 4096 * 5 + 776, 256, std::nullopt}, Case{4, 65536, 16, 1024},
        Case{8, 8 * 4096 * 3, 256, std::nullopt}, Case{4, 4096, 4096, std::nullopt}}) {
    const auto in = rand_inputs(c.W, c.n, 700 + c.W);
    const auto cpu = run_ranks(in, Device::cpu(), c.sg, c.bs);
    const auto gpu = run_ranks(in, Device::cuda(0), c.sg, c.bs);
    for (int64_t r = 0; r < c.W; ++r) EXPECT_EQ(cpu[r], gpu[r]) << c.W << " ranks, n " << c.n;
    // Again in place (a new group: fresh buffers; reuse and growth are
    // CallsOfChangingSizesOnOneGroup's).
    EXPECT_EQ(run_ranks(in, Device::cuda(0), c.sg, c.bs, true), cpu);
    // One block for every stride.
    EXPECT_EQ(run_ranks(in, Device::cuda(0), c.sg, c.bs, false, 1), cpu);
  }
}

// Groups below 8 elements and tensors off a 16-byte boundary take the element-wise kernel.
TEST(QuantizedAllReduceCuda, ElementWiseKernelMatchesTheFormula) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const auto small = rand_inputs(2, 64, 880);
  const auto got = run_ranks(small, Device::cuda(0), 4, 8);
  for (int64_t r = 0; r < 2; ++r) EXPECT_EQ(got[r], expected(small, r, 4, 8));
  comm::ThreadGroup g(2, Device::cuda(0));
  const auto in = rand_inputs(2, 4096, 890);
  std::vector<std::vector<double>> off(2);
  g.run([&](int64_t r) {
    const Tensor big = Tensor::zeros({4096 + 8}, kBf).to(Device::cuda(0));
    Tensor x = big.slice(0, 1, 4097);  // 2 bytes past the allocation's alignment
    x.copy_(in[r].reshape({4096}).to(Device::cuda(0)));
    off[r] = quantized_all_reduce(x, g.backend(r), 256, 1024).to(Device::cpu()).to_double_vector();
  });
  for (int64_t r = 0; r < 2; ++r) EXPECT_EQ(off[r], expected(in, r, 256, 1024));
}

// One group on the GPU through calls of changing sizes (grids of 1 to 6 blocks, buffers grown
// while the group lives) and block limits, each against the formula.
TEST(QuantizedAllReduceCuda, CallsOfChangingSizesOnOneGroup) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  comm::ThreadGroup g(4, Device::cuda(0));
  struct Call {
    int64_t n, sg, bs;
    std::optional<int64_t> max_blocks;
  };
  const std::vector<Call> calls = {{4096, 256, 1024, std::nullopt},
                                   {24576, 256, 1024, std::nullopt},
                                   {8192, 64, 512, 2},
                                   {4096, 256, 1024, 1},
                                   {65536, 128, 4096, std::nullopt},
                                   {24576, 256, 1024, 3}};
  std::vector<std::vector<Tensor>> ins;
  for (std::size_t i = 0; i < calls.size(); ++i)
    ins.push_back(rand_inputs(4, calls[i].n, 800 + 10 * i));
  std::vector<std::vector<std::vector<double>>> got(calls.size(),
                                                    std::vector<std::vector<double>>(4));
  g.run([&](int64_t r) {
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const Call& c = calls[i];
      got[i][r] = quantized_all_reduce(ins[i][r].to(Device::cuda(0)), g.backend(r), c.sg, c.bs,
                                       std::nullopt, c.max_blocks)
                      .to(Device::cpu())
                      .to_double_vector();
    }
  });
  for (std::size_t i = 0; i < calls.size(); ++i) {
    for (int64_t r = 0; r < 4; ++r) {
      EXPECT_EQ(got[i][r], expected(ins[i], r, calls[i].sg, calls[i].bs)) << "call " << i;
    }
  }
}

}  // namespace
}  // namespace flashinfer
