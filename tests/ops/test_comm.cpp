// flashinfer.comm's all-reduce fusion with ranks as threads (comm::ThreadGroup): the shared
// arithmetic rules by hand; the thread group's collectives and failure; peer memory; the sum in
// rank order (both accumulation modes, hand-checked bf16 cases where the order shows), every
// implemented pattern against its formula, the aliasing vLLM uses, the return rule, upstream's
// refusals; CUDA against the CPU when a GPU is visible (all ranks on one device).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "api/device_props.h"
#include "core/device_location.h"
#include "core/peer_memory.h"
#include "core/process_identity.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "kernels/comm_rules.h"
#include "ops/comm_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime.h>

#include <functional>
#include <stdexcept>
#endif

namespace flashinfer::testing {
namespace {

using namespace std::chrono_literals;
namespace P = AllReduceFusionPattern;

constexpr DType kBf = DType::kBFloat16;
constexpr DType kF16 = DType::kFloat16;
constexpr DType kF32 = DType::kFloat32;

float bf16r(double v) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(v)));
}
float round_dt(DType dt, double v) {
  if (dt == kBf) return bf16r(v);
  if (dt == kF16) return half_bits_to_float(float_to_half_bits(static_cast<float>(v)));
  return static_cast<float>(v);
}

// ---- the shared rules ----------------------------------------------------------------------

TEST(CommRules, GroupScaleRoundsUpToAPowerOfTwo) {
  uint8_t code = 0;
  EXPECT_EQ(kernels::ar_group_scale(448.0f, &code), 1.0f);  // exactly 1: no rounding
  EXPECT_EQ(code, 127);
  EXPECT_EQ(kernels::ar_group_scale(500.0f, &code), 2.0f);  // 1.116 up to 2
  EXPECT_EQ(code, 128);
  EXPECT_EQ(kernels::ar_group_scale(0.0f, &code), std::ldexp(1.0f, -33));  // 1e-10 up to 2^-33
  EXPECT_EQ(code, 127 - 33);
}

TEST(CommRules, TokenScaleHasUpstreamsFloor) {
  EXPECT_EQ(kernels::ar_token_scale(0.0f), 0.001953125f / 448.0f);
  EXPECT_EQ(kernels::ar_token_scale(896.0f), 2.0f);
  EXPECT_EQ(kernels::ar_fp8_scaled(900.0f, 1.0f), 0x7E);  // clamped to 448
  EXPECT_EQ(kernels::ar_fp8_scaled(-3.0f, 2.0f), float_to_e4m3fn_bits(-1.5f));
  EXPECT_EQ(kernels::ar_fp8_static(3.0f, 0.5f), float_to_e4m3fn_bits(6.0f));  // divides the scale
}

TEST(CommRules, OneShotReadsMinusZeroAsPlusZero) {
  EXPECT_EQ(std::signbit(kernels::ar_input(-0.0f, true)), false);
  EXPECT_EQ(std::signbit(kernels::ar_input(-0.0f, false)), true);
  EXPECT_EQ(kernels::ar_input(-1.5f, true), -1.5f);
}

TEST(CommRules, Nvfp4BlockByHand) {
  // amax 6, global scale 1: sf = e4m3(6 / 6) = 1.0; values divide by 1 and round to e2m1.
  float v[16] = {6, -6, 3, 1.5, 0.5, 0, 1, 2, 4, -4, 0.25, 0.75, 5, -2, 1, 0};
  const kernels::Nvfp4Block b = kernels::ar_nvfp4_block(v, 1.0f);
  EXPECT_EQ(e4m3fn_bits_to_float(b.sf), 1.0f);
  EXPECT_EQ(b.packed & 0xFF, pack_e2m1x2(float_to_e2m1_bits(6.0f), float_to_e2m1_bits(-6.0f)));
  // global scale 2: sf = e4m3(2 * 1) = 2, the values scale by 1 / (2 * (1 / 2)) = 1.
  const kernels::Nvfp4Block c = kernels::ar_nvfp4_block(v, 2.0f);
  EXPECT_EQ(e4m3fn_bits_to_float(c.sf), 2.0f);
  EXPECT_EQ(c.packed, b.packed);
  float z[16] = {};
  EXPECT_EQ(kernels::ar_nvfp4_block(z, 1.0f).packed, 0u);
}

// ---- the thread group and peer memory ---------------------------------------------------------

// Pattern 7's gather reads no row outside input: an index that is neither -1 nor a row gives
// NaN (reached only on CUDA while a graph is captured; the API refuses it by name otherwise).
TEST(CommRules, FinalizeGivesNanForAnIndexOutsideInput) {
  const float rows_v[3] = {1.0f, 2.0f, 4.0f};
  auto value = [&](std::vector<int64_t> idx) {
    return kernels::ar_moe_finalize_value(
        static_cast<int64_t>(idx.size()), 3, false, false, [&](int64_t k) { return idx[k]; },
        [&](int64_t j) { return rows_v[j]; }, [](int64_t) { return 1.0f; }, [] { return 0.0f; },
        [](float v) { return v; });
  };
  EXPECT_EQ(value({0, -1, 2}), 5.0f);
  EXPECT_EQ(value({2, 2}), 8.0f);  // a duplicate adds twice
  for (int64_t out : {int64_t{3}, int64_t{-2}, int64_t{1} << 40})
    EXPECT_TRUE(std::isnan(value({0, out}))) << out;
}

TEST(ThreadGroup, AllgatherIsInRankOrderAndBarriersHold) {
  comm::ThreadGroup g(4);
  std::atomic<int> before{0};
  std::vector<std::vector<std::string>> got(4);
  g.run([&](int64_t r) {
    auto b = g.backend(r);
    EXPECT_EQ(b->Get_rank(), r);
    EXPECT_EQ(b->Get_size(), 4);
    before.fetch_add(1);
    b->barrier();
    EXPECT_EQ(before.load(), 4);  // nobody passes the barrier early
    got[r] = b->allgather("rank" + std::to_string(r));
    got[r] = b->allgather("again" + std::to_string(r) + got[r][3]);
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(got[r].size(), 4u);
    EXPECT_EQ(got[r][2], "again2rank3");
  }
}

TEST(ThreadGroup, RefusesMoreRanksOnAGpuThanItHasQueues) {
  // Needs no GPU: the devices are only counted. CUDA_DEVICE_MAX_CONNECTIONS unset: 8 queues.
  if (std::getenv("CUDA_DEVICE_MAX_CONNECTIONS") != nullptr) GTEST_SKIP() << "queues set";
  EXPECT_NO_THROW(comm::ThreadGroup(8, Device::cuda(0)));
  expect_error([] { comm::ThreadGroup(9, Device::cuda(0)); }, "9 ranks share cuda:0");
  std::vector<Device> spread;
  for (int i = 0; i < 12; ++i) spread.push_back(Device::cuda(i % 2));
  EXPECT_NO_THROW(comm::ThreadGroup{spread});
}

TEST(ThreadGroup, AFailedRankAbortsTheOthersInsteadOfHanging) {
  comm::ThreadGroup g(3, Device::cpu(), 60000ms);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    g.run([&](int64_t r) {
      if (r == 1) throw Error(ErrorCode::kInvalidArgument, "probe", "x", "rank 1 failed");
      g.backend(r)->barrier();
    });
    FAIL() << "expected the rank's error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 failed"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
}

TEST(ThreadGroup, TimesOutWhenARankNeverComes) {
  comm::ThreadGroup g(2, Device::cpu(), 200ms);
  auto b0 = g.backend(0);
  EXPECT_THROW(b0->barrier(), Error);  // rank 1 never calls it
}

TEST(PeerMemory, EveryRankSeesTheOthersWrites) {
  comm::ThreadGroup g(3);
  g.run([&](int64_t r) {
    auto b = g.backend(r);
    detail::PeerMemory m(*b, 64, "test");
    EXPECT_EQ(static_cast<const int*>(m.local())[0], 0);  // zero-filled
    static_cast<int*>(m.local())[0] = 100 + static_cast<int>(r);
    b->barrier();
    for (int64_t p = 0; p < 3; ++p) EXPECT_EQ(static_cast<const int*>(m.peer(p))[0], 100 + p);
    b->barrier();
  });
}

TEST(ProcessIdentity, StableHereAndNewInAForkedChild) {
  const detail::ProcessIdentity me = detail::this_process();
  EXPECT_EQ(me.pid, static_cast<int64_t>(::getpid()));
  EXPECT_NE(me.nonce, 0u);
  EXPECT_EQ(detail::this_process(), me);
  // A forked child is another process even where its pid repeats one elsewhere (containers).
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const detail::ProcessIdentity c = detail::this_process();
    const auto ignored = ::write(fds[1], &c, sizeof(c));
    (void)ignored;
    ::_exit(0);
  }
  detail::ProcessIdentity got;
  ASSERT_EQ(::read(fds[0], &got, sizeof(got)), static_cast<ssize_t>(sizeof(got)));
  ::waitpid(child, nullptr, 0);
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_EQ(got.pid, static_cast<int64_t>(child));
  EXPECT_NE(got.nonce, me.nonce);
  const std::string tag = detail::process_tag();
  EXPECT_EQ(tag.substr(0, tag.find('_')), std::to_string(::getpid()));
  EXPECT_EQ(tag.size() - tag.find('_') - 1, 16u);  // the nonce in 16 hex digits
}

TEST(GridCap, EveryRankGetsTheSmallestShareOfItsGpu) {
  // "<SMs> <host>/<PCI bus>" per rank, as detail::grid_record writes them.
  EXPECT_EQ(detail::group_grid_cap({"132 h/0000:1A:00.0", "132 h/0000:1B:00.0"}, 256), 132);
  EXPECT_EQ(detail::group_grid_cap({"132 h/0000:1A:00.0", "132 h/0000:1A:00.0"}, 256), 66);
  // Two ranks share one GPU, a third has its own, smaller one: the smallest share for all.
  EXPECT_EQ(detail::group_grid_cap({"132 h/A", "132 h/A", "78 h/B"}, 256), 66);
  EXPECT_EQ(detail::group_grid_cap({"132 h/A", "132 h/A", "60 h/B"}, 256), 60);
  // The same bus on two hosts is two GPUs.
  EXPECT_EQ(detail::group_grid_cap({"132 h1/A", "132 h2/A"}, 256), 132);
  EXPECT_EQ(detail::group_grid_cap({"300 h/A"}, 256), 256);
  EXPECT_EQ(detail::group_grid_cap({"4 h/A", "4 h/A", "4 h/A", "4 h/A", "4 h/A", "4 h/A"}, 256), 1);
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) { EXPECT_EQ(detail::agreed_grid_cap(*g.backend(r), 256), 0); });  // CPU
}

// ---- allreduce_fusion on the CPU -------------------------------------------------------------

struct Rank {
  Tensor input, residual_in, gamma;
};

// Runs `body(rank, workspace)` on W threads with a workspace each (CPU or `dev`).
void with_group(int64_t W, int64_t max_tokens, int64_t H, DType dt,
                const std::function<void(int64_t, std::shared_ptr<AllReduceFusionWorkspace>)>& body,
                Device dev = Device::cpu()) {
  comm::ThreadGroup g(W, dev);
  g.run([&](int64_t r) {
    auto ws = create_allreduce_fusion_workspace("trtllm", W, r, max_tokens, H, dt, std::nullopt,
                                                g.backend(r));
    body(r, ws);
  });
}

TEST(AllreduceFusion, SumIsInRankOrderWithBothAccumulations) {
  // Ranks hold 1, 2^-8, 2^-8, 0. bf16 keeps 8 significant bits: 1 + 2^-8 rounds back to 1 (a
  // tie, to even) at every partial sum, so the rounded sums stay 1; one fp32 accumulator gives
  // 1 + 2^-7, which bf16 holds.
  const float tiny = std::ldexp(1.0f, -8);
  for (bool fp32_acc : {false, true}) {
    std::vector<Tensor> out(4);
    with_group(4, 4, 8, kBf, [&](int64_t r, auto ws) {
      Tensor x = Tensor::full({2, 8}, r == 0 ? 1.0 : r == 3 ? 0.0 : tiny, kBf);
      out[r] = allreduce_fusion(x, ws, P::kAllReduce, false, true, std::nullopt, std::nullopt,
                                std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                std::nullopt, 1e-6, std::nullopt, std::nullopt, true, fp32_acc);
    });
    for (int r = 0; r < 4; ++r) {
      for (double v : out[r].to_double_vector()) EXPECT_EQ(v, fp32_acc ? 1.0 + 2 * tiny : 1.0);
    }
  }
}

TEST(AllreduceFusion, AllReduceIsExactOnIntegersForEveryGroupSize) {
  for (int64_t W : {2, 4, 8}) {
    for (DType dt : {kF32, kBf, kF16}) {
      const int64_t T = 5, H = 16;
      std::vector<Tensor> in(W), out(W);
      for (int64_t r = 0; r < W; ++r) {
        in[r] = Tensor::empty({T, H}, dt);
        std::vector<double> v(T * H);
        for (int64_t i = 0; i < T * H; ++i) v[i] = static_cast<double>((i * 7 + r * 3) % 11) - 5;
        in[r] = Tensor::from_vector(v, {T, H}, dt);
      }
      with_group(W, T, H, dt,
                 [&](int64_t r, auto ws) { out[r] = allreduce_fusion(in[r], ws, P::kAllReduce); });
      for (int64_t i = 0; i < T * H; ++i) {
        double want = 0;
        for (int64_t r = 0; r < W; ++r) want += in[r].to_double_vector()[i];
        for (int64_t r = 0; r < W; ++r) {
          ASSERT_EQ(out[r].to_double_vector()[i], want) << W << " ranks, " << dtype_name(dt);
        }
      }
    }
  }
}

// Per token: residual_out = dt(s + residual_in), y = dt(r * rsqrt(mean(r^2) + eps) * (wb + g)),
// with fp64 for the norm's sum (within the dtype's rounding of y).
struct NormRef {
  std::vector<double> residual, y;
};
NormRef norm_reference(const std::vector<double>& s, const Tensor& res_in, const Tensor& gamma,
                       int64_t T, int64_t H, DType dt, double eps, double wb) {
  NormRef o;
  const auto ri = res_in.to_double_vector(), g = gamma.to_double_vector();
  o.residual.resize(T * H);
  o.y.resize(T * H);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t j = 0; j < H; ++j) {
      o.residual[t * H + j] = round_dt(dt, s[t * H + j] + ri[t * H + j]);
      ss += o.residual[t * H + j] * o.residual[t * H + j];
    }
    const double inv = 1.0 / std::sqrt(ss / H + eps);
    for (int64_t j = 0; j < H; ++j) o.y[t * H + j] = o.residual[t * H + j] * inv * (wb + g[j]);
  }
  return o;
}

struct Fixture {
  int64_t W, T, H;
  DType dt;
  std::vector<Tensor> in, res;
  Tensor gamma;
  std::vector<double> sum;  // the rank-order sum (fp32_acc), rounded to dt
};
Fixture fixture(int64_t W, int64_t T, int64_t H, DType dt, uint64_t seed) {
  Fixture f{W, T, H, dt, {}, {}, {}, {}};
  for (int64_t r = 0; r < W; ++r) {
    f.in.push_back(rand_tensor({T, H}, dt, seed + r, -1, 1));
    f.res.push_back(rand_tensor({T, H}, dt, seed + 100 + r, -1, 1));
  }
  f.gamma = rand_tensor({H}, dt, seed + 999, 0.5, 1.5);
  f.sum.assign(T * H, 0.0);
  std::vector<std::vector<double>> in(static_cast<size_t>(W));
  for (int64_t r = 0; r < W; ++r) in[r] = f.in[r].to_double_vector();
  for (int64_t i = 0; i < T * H; ++i) {
    float acc = 0.0f;
    for (int64_t r = 0; r < W; ++r) acc += static_cast<float>(in[r][i]);
    f.sum[i] = round_dt(dt, acc);
  }
  return f;
}

TEST(AllreduceFusion, ResidualRmsNormMatchesTheFormula) {
  for (DType dt : {kBf, kF32}) {
    for (double wb : {0.0, 1.0}) {
      const Fixture f = fixture(4, 6, 64, dt, 7);
      std::vector<Tensor> res_out(4), norm(4), ret(4);
      with_group(4, 8, 64, dt, [&](int64_t r, auto ws) {
        res_out[r] = Tensor::empty({6, 64}, dt);
        norm[r] = Tensor::empty({6, 64}, dt);
        ret[r] = allreduce_fusion(f.in[r], ws, P::kARResidualRMSNorm, false, true, std::nullopt,
                                  res_out[r], norm[r], std::nullopt, std::nullopt, f.res[r],
                                  f.gamma, 1e-5, std::nullopt, std::nullopt, true, true,
                                  std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                  std::nullopt, std::nullopt, std::nullopt, std::nullopt, wb);
      });
      for (int64_t r = 0; r < 4; ++r) {
        const NormRef ref = norm_reference(f.sum, f.res[r], f.gamma, 6, 64, dt, 1e-5, wb);
        EXPECT_EQ(ret[r].data_ptr(), norm[r].data_ptr());  // norm_out is returned
        const auto ro = res_out[r].to_double_vector(), y = norm[r].to_double_vector();
        for (int64_t i = 0; i < 6 * 64; ++i) {
          ASSERT_EQ(ro[i], ref.residual[i]) << i;
          ASSERT_NEAR(y[i], ref.y[i], (dt == kBf ? 8e-3 : 1e-5) * std::max(1.0, std::abs(ref.y[i])))
              << i;
        }
      }
    }
  }
}

// Every quant pattern against the norm output of pattern 1 (the same y), quantized here.
TEST(AllreduceFusion, QuantPatternsQuantizeTheNormOutput) {
  const int64_t W = 2, T = 5, H = 256;
  Fixture f = fixture(W, T, H, kBf, 21);
  f.res[1] = f.res[0];  // the same residual on both ranks: the same y everywhere
  auto run = [&](int64_t pattern, std::vector<Tensor>& norm, std::vector<Tensor>& q,
                 std::vector<Tensor>& sc, std::optional<Value> scale, std::optional<int64_t> layout,
                 std::optional<int64_t> group) {
    with_group(W, T, H, kBf, [&](int64_t r, auto ws) {
      Tensor res_out = Tensor::empty({T, H}, kBf);
      allreduce_fusion(f.in[r], ws, pattern, false, true, std::nullopt, res_out,
                       norm.empty() ? std::nullopt : std::optional<Tensor>(norm[r]),
                       q.empty() ? std::nullopt : std::optional<Tensor>(q[r]),
                       sc.empty() ? std::nullopt : std::optional<Tensor>(sc[r]), f.res[r], f.gamma,
                       1e-6, scale, layout, std::nullopt, false, std::nullopt, std::nullopt,
                       std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, group);
    });
  };
  std::vector<Tensor> y(W), none;
  for (auto& t : y) t = Tensor::empty({T, H}, kBf);
  run(P::kARResidualRMSNorm, y, none, none, std::nullopt, std::nullopt, std::nullopt);
  const auto yv = y[0].to_double_vector();
  EXPECT_EQ(yv, y[1].to_double_vector());  // every rank computes the same bits

  {  // 4: norm_out and FP8 with the static dequant scale 0.5 (values divided by it)
    std::vector<Tensor> n(W), q(W);
    for (int64_t r = 0; r < W; ++r) {
      n[r] = Tensor::empty({T, H}, kBf);
      q[r] = Tensor::empty({T, H}, DType::kFloat8E4M3FN);
    }
    run(P::kARResidualRMSNormOutFP8Quant, n, q, none, Value(0.5), std::nullopt, std::nullopt);
    EXPECT_EQ(n[1].to_double_vector(), yv);
    const auto* qb = static_cast<const uint8_t*>(q[1].data_ptr());
    for (int64_t i = 0; i < T * H; ++i) {
      ASSERT_EQ(qb[i], float_to_e4m3fn_bits(static_cast<float>(yv[i]) * 2.0f, true)) << i;
    }
  }
  {  // 10: per-token scale max(amax / 448, 2^-9 / 448) in scale_out [T, 1]
    std::vector<Tensor> q(W), sc(W), nn;
    for (int64_t r = 0; r < W; ++r) {
      q[r] = Tensor::empty({T, H}, DType::kFloat8E4M3FN);
      sc[r] = Tensor::empty({T, 1}, kF32);
    }
    run(P::kARResidualRMSNormDynamicFP8Quant, nn, q, sc, std::nullopt, std::nullopt, std::nullopt);
    const auto* qb = static_cast<const uint8_t*>(q[0].data_ptr());
    for (int64_t t = 0; t < T; ++t) {
      float amax = 0;
      for (int64_t j = 0; j < H; ++j)
        amax = std::max(amax, std::abs(static_cast<float>(yv[t * H + j])));
      const float s = std::max(amax / 448.0f, 0.001953125f / 448.0f);
      ASSERT_EQ(static_cast<const float*>(sc[0].data_ptr())[t], s);
      for (int64_t j = 0; j < H; ++j) {
        ASSERT_EQ(qb[t * H + j], float_to_e4m3fn_bits(static_cast<float>(yv[t * H + j]) / s, true));
      }
    }
  }
  {  // 8: groups of 64 (4 groups: one int32 of exponents a token), column-major [T, 1]
    std::vector<Tensor> q(W), sc(W), nn;
    for (int64_t r = 0; r < W; ++r) {
      q[r] = Tensor::empty({T, H}, DType::kFloat8E4M3FN);
      sc[r] = Tensor::empty({T, 1}, DType::kInt32);
    }
    run(P::kARResidualRMSNormPerTokenGroupFP8PackedQuant, nn, q, sc, std::nullopt, std::nullopt,
        int64_t{64});
    const auto* qb = static_cast<const uint8_t*>(q[0].data_ptr());
    for (int64_t t = 0; t < T; ++t) {
      const auto word = static_cast<uint32_t>(static_cast<const int32_t*>(sc[0].data_ptr())[t]);
      for (int64_t g = 0; g < 4; ++g) {
        float amax = 0;
        for (int64_t j = g * 64; j < g * 64 + 64; ++j) {
          amax = std::max(amax, std::abs(static_cast<float>(yv[t * H + j])));
        }
        const float s = std::exp2(std::ceil(std::log2(std::max(amax / 448.0f, 1e-10f))));
        ASSERT_EQ((word >> (8 * g)) & 0xFF, static_cast<uint32_t>(std::ilogb(s) + 127)) << t;
        for (int64_t j = g * 64; j < g * 64 + 64; ++j) {
          ASSERT_EQ(qb[t * H + j],
                    float_to_e4m3fn_bits(static_cast<float>(yv[t * H + j]) / s, true));
        }
      }
    }
  }
  {  // 3: NVFP4 with a linear scale layout and the global scale 4
    std::vector<Tensor> q(W), sc(W), nn;
    for (int64_t r = 0; r < W; ++r) {
      q[r] = Tensor::empty({T, H / 2}, DType::kUInt8);
      sc[r] = Tensor::empty({T * H / 16}, DType::kUInt8);
    }
    run(P::kARResidualRMSNormFP4Quant, nn, q, sc, Value(4.0), QuantizationSFLayout::LINEAR,
        std::nullopt);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t b = 0; b < H / 16; ++b) {
        float v[16];
        for (int e = 0; e < 16; ++e) v[e] = static_cast<float>(yv[t * H + b * 16 + e]);
        const kernels::Nvfp4Block blk = kernels::ar_nvfp4_block(v, 4.0f);
        ASSERT_EQ(static_cast<const uint8_t*>(sc[1].data_ptr())[t * (H / 16) + b], blk.sf);
        uint64_t packed = 0;
        std::memcpy(&packed, static_cast<const uint8_t*>(q[1].data_ptr()) + t * (H / 2) + b * 8, 8);
        ASSERT_EQ(packed, blk.packed);
      }
    }
  }
}

TEST(AllreduceFusion, OutputsMayBeTheInputsAsVllmPassesThem) {
  const Fixture f = fixture(2, 4, 32, kBf, 3);
  std::vector<Tensor> want_res(2), want_y(2), got_res(2), got_y(2);
  with_group(2, 4, 32, kBf, [&](int64_t r, auto ws) {
    want_res[r] = Tensor::empty({4, 32}, kBf);
    want_y[r] = Tensor::empty({4, 32}, kBf);
    allreduce_fusion(f.in[r], ws, P::kARResidualRMSNorm, false, true, std::nullopt, want_res[r],
                     want_y[r], std::nullopt, std::nullopt, f.res[r], f.gamma);
    // norm_out = input, residual_out = residual_in (vLLM's in-place form).
    got_y[r] = f.in[r].clone();
    got_res[r] = f.res[r].clone();
    allreduce_fusion(got_y[r], ws, P::kARResidualRMSNorm, false, true, std::nullopt, got_res[r],
                     got_y[r], std::nullopt, std::nullopt, got_res[r], f.gamma);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got_res[r].to_double_vector(), want_res[r].to_double_vector());
    EXPECT_EQ(got_y[r].to_double_vector(), want_y[r].to_double_vector());
  }
}

TEST(AllreduceFusion, RefusesWhatUpstreamRefuses) {
  const Fixture f = fixture(2, 4, 32, kBf, 5);
  std::vector<std::string> errors(2);
  with_group(2, 4, 32, kBf, [&](int64_t r, auto ws) {
    const Tensor& x = f.in[r];
    expect_error([&] { allreduce_fusion(x, ws, 6); },
                 "moe_reduction_device_num_experts is required for "
                 "kMoEReductionARResidualRMSNorm pattern");
    expect_error([&] { allreduce_fusion(x, ws, 12); }, "unknown fusion pattern");
    expect_error([&] { allreduce_fusion(x, ws, P::kARResidualRMSNorm); },
                 "residual_in is required");
    expect_error(
        [&] {
          allreduce_fusion(Tensor::zeros({8, 32}, kBf), ws, 0);
        },
        "exceeds workspace max_token_num");
    expect_error([&] { allreduce_fusion(x.to(kF32), ws, 0); }, "use_fp32_lamport");
    expect_error(
        [&] {
          allreduce_fusion(Tensor::zeros({2, 32}, kBf), ws, 0, false, true, std::nullopt,
                           std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                           std::nullopt, 1e-6, std::nullopt, std::nullopt, false);
        },
        "sequence length should be larger than tp_size");
    expect_error(
        [&] {
          allreduce_fusion(x.reshape({32, 4}).slice(1, 0, 2), ws, 0);
        },
        "must be contiguous");
    expect_error([&] { allreduce_fusion(Tensor::zeros({2, 12}, kBf), ws, 0); }, "VEC_SIZE");
    expect_error([&] { allreduce_fusion(x, nullptr, 0); }, "workspace");
    errors[r] = "checked";
  });
  EXPECT_EQ(errors[0], "checked");
  comm::ThreadGroup g(2);
  auto b = g.backend(0);
  expect_error(
      [&] { create_allreduce_fusion_workspace("nccl", 2, 0, 4, 32, kBf, std::nullopt, b); },
      "Unknown backend: nccl");
  expect_error([&] { create_allreduce_fusion_workspace("auto", 2, 0, 4, 32, kBf); },
               "CommBackend is required");
  expect_error(
      [&] { create_allreduce_fusion_workspace("auto", 4, 0, 4, 32, kBf, std::nullopt, b); },
      "world_size 4 does not match");
  expect_error(
      [&] { create_allreduce_fusion_workspace("auto", 2, 1, 4, 32, kBf, std::nullopt, b); },
      "rank 1 does not match");
  // A one-rank group: creation works, the call is refused as upstream's kernel refuses it.
  comm::ThreadGroup one(1);
  auto ws = create_allreduce_fusion_workspace("auto", std::nullopt, std::nullopt, 4, 32, kBf,
                                              std::nullopt, one.backend(0));
  EXPECT_EQ(ws->world_size(), 1);
  EXPECT_TRUE(ws->is_buffer_size_sufficient(1, 2, 64, kBf));
  EXPECT_FALSE(ws->is_buffer_size_sufficient(1, 8, 32, kBf));
  expect_error(
      [&] {
        allreduce_fusion(Tensor::zeros({2, 32}, kBf), ws, 0);
      },
      "unsupported ranks number");
  ws->destroy();
  expect_error([&] { allreduce_fusion(Tensor::zeros({2, 32}, kBf), ws, 0); }, "destroyed");
}

TEST(AllreduceFusion, RefusesAliasedWrites) {
  const Fixture f = fixture(2, 4, 32, kBf, 9);
  std::vector<std::string> what(2);
  with_group(2, 4, 32, kBf, [&](int64_t r, auto ws) {
    Tensor res = f.res[r].clone();
    Tensor both = Tensor::empty({8, 32}, kBf);
    try {
      // norm_out overlapping residual_in without being it: refused before anything runs.
      allreduce_fusion(f.in[r], ws, P::kARResidualRMSNorm, false, true, std::nullopt,
                       both.slice(0, 0, 4), both.slice(0, 2, 6), std::nullopt, std::nullopt, res,
                       f.gamma);
    } catch (const Error& e) {
      what[r] = e.what();
    }
  });
  for (const auto& w : what) EXPECT_NE(w.find("overlap"), std::string::npos) << w;
}

// Upstream 0.7.4's keyword-only "mnnvl-cutedsl" options of create_allreduce_fusion_workspace:
// refused with its text with any other backend (before anything is created), and that backend
// itself refused here (its CuTe-DSL kernels are not implemented).
TEST(AllreduceFusion, CuteDslWorkspaceOptionsAsUpstream) {
  AllReduceCuteDslOptions o;
  o.top_k = Value(int64_t{8});
  o.rms_eps = Value(1e-6);
  expect_error(
      [&] {
        (void)create_allreduce_fusion_workspace("trtllm", 2, 0, 16, 64, DType::kBFloat16,
                                                std::nullopt, nullptr, false, std::nullopt, o);
      },
      "Only backend='mnnvl-cutedsl' accepts: top_k, rms_eps");
  try {
    (void)create_allreduce_fusion_workspace("mnnvl-cutedsl", 2, 0, 16, 64, DType::kBFloat16);
    ADD_FAILURE() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_EQ(e.arg(), "backend");
  }
  expect_error(
      [&] {
        (void)create_allreduce_fusion_workspace("mnnvl-cutedsl", 2, 0, 16, 64, DType::kBFloat16, 4);
      },
      "backend='mnnvl-cutedsl' does not use: gpus_per_node");
}

TEST(AllreduceFusion, DeclaredAsUpstream) {
  const OpDecl* d = OpRegistry::global().find("allreduce_fusion");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->module, "flashinfer.comm.allreduce");
  EXPECT_EQ(d->params.size(), 27u);
  EXPECT_EQ(d->params.back().name, "moe_finalize_backend");  // 0.7.4's, keyword-only
  EXPECT_TRUE(d->params.back().keyword_only);
  const OpDecl* c = OpRegistry::global().find("create_allreduce_fusion_workspace");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->params.size(), 22u);  // 0.7.4's twelve keyword-only "mnnvl-cutedsl" options
  EXPECT_EQ(c->params.back().name, "config");
  EXPECT_TRUE(c->params.back().keyword_only);
}

// ---- recording every rank, replaying each call with its peers --------------------------------

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(AllreduceFusionReplay, EveryRanksCallsReplayTogether) {
  namespace fs = std::filesystem;
  const Fixture f = fixture(2, 4, 64, kBf, 11);
  std::string rank1_workspace;
  const fs::path dir = record_dump("comm", [&] {
    with_group(2, 8, 64, kBf, [&](int64_t r, auto ws) {
      if (r == 1) rank1_workspace = ws->repr();
      allreduce_fusion(f.in[r], ws, P::kAllReduce);
      Tensor res = f.res[r].clone(), y = Tensor::empty({4, 64}, kBf);
      allreduce_fusion(f.in[r], ws, P::kARResidualRMSNorm, false, true, std::nullopt, res, y,
                       std::nullopt, std::nullopt, res, f.gamma, 1e-6, std::nullopt, std::nullopt,
                       true, true);
    });
  });
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  ASSERT_EQ(rs.size(), 6u);  // two creations and four calls
  int collectives = 0;
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    EXPECT_NE(r.note.find("a collective"), std::string::npos) << r.note;
    if (r.function_name == "allreduce_fusion") ++collectives;
  }
  EXPECT_EQ(collectives, 4);
  // A recording missing a rank says so instead of replaying one rank alone: rank 1's creation
  // and calls (every record naming its workspace) taken out.
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string text = read_text_file((e.path() / "metadata.jsonl").string());
    if (text.find(rank1_workspace) != std::string::npos) fs::remove_all(e.path());
  }
  int refused = 0;
  for (const replay::Result& r : replay::replay_sequence(dir.string())) {
    EXPECT_NE(r.status, replay::Status::kPassed) << r.function_name;
    EXPECT_NE(r.error.find("needs the same call of every rank"), std::string::npos) << r.error;
    ++refused;
  }
  EXPECT_EQ(refused, 3);  // rank 0's creation and its two calls
  fs::remove_all(dir);
}

TEST(AllreduceFusion, CheckpointDetachesTheWorkspaceUntilRestored) {
  namespace fs = std::filesystem;
  comm::ThreadGroup g(2);
  const Fixture f = fixture(2, 4, 64, kBf, 13);
  std::vector<Tensor> before(2), after(2);
  std::vector<std::shared_ptr<TRTLLMAllReduceFusionWorkspace>> ws(2);
  const fs::path dir = record_dump("comm_ckpt", [&] {
    g.run([&](int64_t r) {
      ws[r] = std::dynamic_pointer_cast<TRTLLMAllReduceFusionWorkspace>(
          create_allreduce_fusion_workspace("trtllm", 2, r, 8, 64, kBf, std::nullopt,
                                            g.backend(r)));
      before[r] = allreduce_fusion(f.in[r], ws[r], P::kAllReduce);
      ws[r]->checkpoint_prepare();
      ws[r]->checkpoint_prepare();  // idempotent
      ws[r]->checkpoint_restore(g.backend(r));
      after[r] = allreduce_fusion(f.in[r], ws[r], P::kAllReduce);
    });
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(after[r].to_double_vector(), before[r].to_double_vector());
  // Detached, the workspace refuses calls; a communicator of another size cannot restore it.
  comm::ThreadGroup other(3);
  g.run([&](int64_t r) {
    ws[r]->checkpoint_prepare();
    expect_error([&] { allreduce_fusion(f.in[r], ws[r], P::kAllReduce); },
                 "TRT-LLM symmetric-memory handles are not attached");
    expect_error([&] { ws[r]->checkpoint_restore(other.backend(r)); }, "/3 != ");
    ws[r]->checkpoint_restore(g.backend(r));
    EXPECT_EQ(allreduce_fusion(f.in[r], ws[r], P::kAllReduce).to_double_vector(),
              before[r].to_double_vector());
  });
  // Replayed: each rank's checkpoint calls with every rank's (restore after its prepare).
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  ASSERT_EQ(rs.size(), 12u);  // per rank: creation, call, prepare twice, restore, call
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    if (r.function_name == "TRTLLMAllReduceFusionWorkspace.checkpoint_restore") {
      EXPECT_NE(r.note.find("after its TRTLLMAllReduceFusionWorkspace.checkpoint_prepare"),
                std::string::npos)
          << r.note;
    }
  }
  fs::remove_all(dir);
}

// ---- allreduce_fusion's MoE patterns (6, 7) on the TRT-LLM workspace -------------------------

// Pattern 6 by hand: every step rounded to bf16. Rank 0's three experts give 1, 2^-8, 2^-8 (scale
// 1): a = 1, then 1 + 2^-8 rounds back to 1 (a tie, to even) twice, where one fp32 sum would keep
// 1 + 2^-7 (a bf16 value); rank 1 gives 0. token_input 0: the ranks' sum 1.
TEST(AllreduceMoe, ReductionRoundsEveryStepByHand) {
  const int64_t E = 3, Tk = 2, H = 16;
  std::vector<Tensor> out(2), norm(2), res_out(2);
  Tensor gamma = Tensor::full({H}, 1.0, kBf);
  with_group(2, 4, H, kBf, [&](int64_t r, auto ws) {
    std::vector<double> act(E * Tk * H);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t i = 0; i < Tk * H; ++i) {
        act[e * Tk * H + i] = r == 1 ? 0.0 : e == 0 ? 1.0 : std::ldexp(1.0, -8);
      }
    }
    Tensor active = Tensor::from_vector(act, {E, Tk, H}, kBf);
    Tensor scale = Tensor::full({E, Tk}, 1.0, kF32);
    Tensor token = Tensor::full({Tk, H}, 0.0, kBf);
    out[r] = Tensor::empty({Tk, H}, kBf);
    norm[r] = Tensor::empty({Tk, H}, kBf);
    res_out[r] = Tensor::empty({Tk, H}, kBf);
    Tensor ret = allreduce_fusion(
        token, ws, P::kMoEReductionARResidualRMSNorm, false, true, out[r], res_out[r], norm[r],
        std::nullopt, std::nullopt, Tensor::full({Tk, H}, 1.0, kBf), gamma, 1e-6, std::nullopt,
        std::nullopt, std::nullopt, false, Value(E), scale, active, token);
    EXPECT_EQ(ret.data_ptr(), norm[r].data_ptr());
  });
  for (int r = 0; r < 2; ++r) {
    for (double v : out[r].to_double_vector()) ASSERT_EQ(v, 1.0);
    for (double v : res_out[r].to_double_vector()) ASSERT_EQ(v, 2.0);  // 1 + residual 1
    for (double v : norm[r].to_double_vector()) ASSERT_EQ(v, 1.0);     // r / rms(r) = 1
  }
}

// Pattern 6 on random data against the formula: the local value with every step rounded, the
// rank sum with every partial sum rounded, residual exact, the norm within a bf16 ulp of fp64.
TEST(AllreduceMoe, ReductionMatchesTheFormula) {
  const int64_t W = 4, E = 3, Tk = 5, H = 64;
  std::vector<Tensor> act(W), sc(W), tok(W), res(W), out(W), norm(W), res_out(W);
  for (int64_t r = 0; r < W; ++r) {
    act[r] = rand_tensor({E, Tk, H}, kBf, 300 + r, -2, 2);
    sc[r] = rand_tensor({E, Tk}, kF32, 400 + r, 0, 1);
    tok[r] = rand_tensor({Tk, H}, kBf, 500 + r, -1, 1);
    res[r] = rand_tensor({Tk, H}, kBf, 600 + r, -1, 1);
  }
  const Tensor gamma = rand_tensor({H}, kBf, 700, 0.5, 1.5);
  with_group(W, 8, H, kBf, [&](int64_t r, auto ws) {
    out[r] = Tensor::empty({Tk, H}, kBf);
    norm[r] = Tensor::empty({Tk, H}, kBf);
    res_out[r] = Tensor::empty({Tk, H}, kBf);
    allreduce_fusion(tok[r], ws, P::kMoEReductionARResidualRMSNorm, false, true, out[r], res_out[r],
                     norm[r], std::nullopt, std::nullopt, res[r], gamma, 1e-6, std::nullopt,
                     std::nullopt, std::nullopt, true, Value(E), sc[r], act[r], tok[r]);
  });
  std::vector<std::vector<double>> local(W);
  for (int64_t r = 0; r < W; ++r) {
    const auto a = act[r].to_double_vector(), s = sc[r].to_double_vector(),
               t = tok[r].to_double_vector();
    for (int64_t i = 0; i < Tk * H; ++i) {
      const int64_t ti = i / H;
      float acc = 0.0f;
      for (int64_t e = 0; e < E; ++e) {
        acc = bf16r(acc + bf16r(static_cast<float>(a[e * Tk * H + i]) *
                                static_cast<float>(s[e * Tk + ti])));
      }
      local[r].push_back(bf16r(acc + static_cast<float>(t[i])));
    }
  }
  std::vector<double> sum(Tk * H);
  for (int64_t i = 0; i < Tk * H; ++i) {
    float s = static_cast<float>(local[0][i]);
    for (int64_t r = 1; r < W; ++r) s = bf16r(s + static_cast<float>(local[r][i]));
    sum[i] = s;
  }
  for (int64_t r = 0; r < W; ++r) {
    ASSERT_EQ(out[r].to_double_vector(), sum) << r;
    const NormRef ref = norm_reference(sum, res[r], gamma, Tk, H, kBf, 1e-6, 0.0);
    const auto ro = res_out[r].to_double_vector(), y = norm[r].to_double_vector();
    for (int64_t i = 0; i < Tk * H; ++i) {
      ASSERT_EQ(ro[i], ref.residual[i]) << i;
      ASSERT_NEAR(y[i], ref.y[i], 8e-3 * std::max(1.0, std::abs(ref.y[i]))) << i;
    }
  }
}

// Pattern 7 against the formula: rows gathered by index (-1 skipped, a duplicate added twice),
// each times its scale and rounded, every add rounded, the shared expert output last; then the
// rank sum. norm_out and residual_out allocated when None; norm_out returned.
TEST(AllreduceMoe, FinalizeMatchesTheFormula) {
  const int64_t W = 2, Tk = 3, K = 3, H = 32, rows = 7;
  const std::vector<double> idx_v = {0, 3, -1, 6, 6, 2, -1, -1, -1};
  std::vector<Tensor> in(W), sc(W), sh(W), res(W), ret(W), res_out(W);
  for (int64_t r = 0; r < W; ++r) {
    in[r] = rand_tensor({rows, H}, kBf, 800 + r, -2, 2);
    sc[r] = rand_tensor({Tk, K}, kBf, 810 + r, 0, 1);
    sh[r] = rand_tensor({Tk, H}, kBf, 820 + r, -1, 1);
    res[r] = rand_tensor({Tk, H}, kBf, 830 + r, -1, 1);
  }
  const Tensor idx = Tensor::from_vector(idx_v, {Tk, K}, DType::kInt32);
  const Tensor gamma = rand_tensor({H}, kBf, 840, 0.5, 1.5);
  with_group(W, 8, H, kBf, [&](int64_t r, auto ws) {
    res_out[r] = Tensor::empty({Tk, H}, kBf);
    ret[r] =
        allreduce_fusion(in[r], ws, P::kMoEFinalizeARResidualRMSNorm, false, true, std::nullopt,
                         res_out[r], std::nullopt, std::nullopt, std::nullopt, res[r], gamma, 1e-6,
                         std::nullopt, std::nullopt, std::nullopt, false, std::nullopt,
                         std::nullopt, std::nullopt, std::nullopt, idx, sc[r], sh[r]);
  });
  std::vector<std::vector<double>> local(W);
  for (int64_t r = 0; r < W; ++r) {
    const auto x = in[r].to_double_vector(), s = sc[r].to_double_vector(),
               h = sh[r].to_double_vector();
    for (int64_t t = 0; t < Tk; ++t) {
      for (int64_t j = 0; j < H; ++j) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
          const auto row = static_cast<int64_t>(idx_v[t * K + k]);
          if (row == -1) continue;
          acc = bf16r(acc +
                      bf16r(static_cast<float>(x[row * H + j]) * static_cast<float>(s[t * K + k])));
        }
        local[r].push_back(bf16r(acc + static_cast<float>(h[t * H + j])));
      }
    }
  }
  std::vector<double> sum(Tk * H);
  for (int64_t i = 0; i < Tk * H; ++i) sum[i] = bf16r(local[0][i] + local[1][i]);
  for (int64_t r = 0; r < W; ++r) {
    const NormRef ref = norm_reference(sum, res[r], gamma, Tk, H, kBf, 1e-6, 0.0);
    const auto y = ret[r].to_double_vector(), ro = res_out[r].to_double_vector();
    ASSERT_EQ(ret[r].shape(), Shape({Tk, H}));
    for (int64_t i = 0; i < Tk * H; ++i) {
      ASSERT_EQ(ro[i], ref.residual[i]) << i;  // the local values and the sum, every bit
      ASSERT_NEAR(y[i], ref.y[i], 8e-3 * std::max(1.0, std::abs(ref.y[i]))) << i;
    }
  }
}

TEST(AllreduceMoe, RefusesWhatUpstreamRefusesInItsOrder) {
  const int64_t Tk = 2, H = 16;
  with_group(2, 4, H, kBf, [&](int64_t r, auto ws) {
    (void)r;
    const Tensor x = Tensor::zeros({Tk, H}, kBf), g = Tensor::full({H}, 1.0, kBf);
    const Tensor act = Tensor::zeros({1, Tk, H}, kBf), sc = Tensor::full({1, Tk}, 1.0, kF32);
    const std::optional<Tensor> none;
    expect_error(
        [&] {
          allreduce_fusion(x, ws, 6, false, true, none, none, x, none, none, none, none, 1e-6,
                           std::nullopt, std::nullopt, std::nullopt, false, Value(1), sc, act);
        },
        "moe_reduction_token_input is required for kMoEReductionARResidualRMSNorm pattern");
    expect_error(
        [&] {
          allreduce_fusion(x, ws, 6, false, true, none, none, none, none, none, x, g, 1e-6,
                           std::nullopt, std::nullopt, std::nullopt, false, Value(1), sc, act, x);
        },
        "at least one of moe_allreduce_out, residual_out, norm_out, quant_out must be set");
    expect_error(
        [&] {
          allreduce_fusion(x, ws, 6, false, true, Tensor::zeros({Tk, H}, kBf), none, none, none,
                           none, x, g, 1e-6, std::nullopt, std::nullopt, std::nullopt, false,
                           Value(1), sc, act, x);
        },
        "norm_out is required: upstream's kernel always writes it");
    expect_error(
        [&] { allreduce_fusion(x, ws, 7, false, true, none, none, none, none, none, x, g); },
        "expanded_idx_to_permuted_idx is required for kMoEFinalizeARResidualRMSNorm pattern");
    const Tensor idx64 = Tensor::zeros({Tk, 1}, DType::kInt64);
    expect_error(
        [&] {
          allreduce_fusion(x, ws, 7, false, true, none, none, none, none, none, x, g, 1e-6,
                           std::nullopt, std::nullopt, std::nullopt, false, std::nullopt, none,
                           none, none, idx64);
        },
        "expanded_idx_to_permuted_idx must be int32");
    // Two faults at once: the binding's int32 check comes before the dtype's.
    expect_error(
        [&] {
          allreduce_fusion(x, ws, 7, false, true, none, none, none, none, none,
                           x.to(DType::kFloat32), g, 1e-6, std::nullopt, std::nullopt, std::nullopt,
                           false, std::nullopt, none, none, none, idx64);
        },
        "expanded_idx_to_permuted_idx must be int32");
    // Past the launch's 1024-thread block: H = 8448 is 33 warps, no cluster divides them.
    expect_error(
        [&] {
          const Tensor big = Tensor::zeros({1, 8448}, kBf);
          allreduce_fusion(big, ws, 7, false, true, none, none, none, none, none, big,
                           Tensor::full({8448}, 1.0, kBf), 1e-6, std::nullopt, std::nullopt,
                           std::nullopt, false, std::nullopt, none, none, none,
                           Tensor::from_vector({0}, {1, 1}, DType::kInt32));
        },
        "block_size <= 1024 && cluster_size > 0");
    const Tensor bad = Tensor::from_vector({0, 9}, {Tk, 1}, DType::kInt32);
    expect_error(
        [&] {
          allreduce_fusion(x, ws, 7, false, true, none, none, none, none, none, x, g, 1e-6,
                           std::nullopt, std::nullopt, std::nullopt, false, std::nullopt, none,
                           none, none, bad);
        },
        "index 9 is neither -1 nor a row of input (2 rows)");
    const Tensor ok_idx = Tensor::from_vector({0, 1}, {Tk, 1}, DType::kInt32);
    expect_error(
        [&] {
          allreduce_fusion(
              x, ws, 7, false, true, none, none, none, Tensor::zeros({Tk, H / 2}, DType::kUInt8),
              Tensor::zeros({512}, DType::kUInt8), x, g, 1e-6, std::nullopt, std::nullopt,
              std::nullopt, false, std::nullopt, none, none, none, ok_idx);
        },
        "NVFP4 output of kMoEFinalizeARResidualRMSNorm");
    expect_error(
        [&] {
          allreduce_fusion(x.to(kF16), ws, 7, false, true, none, none, none, none, none,
                           x.to(DType::kFloat32), g, 1e-6, std::nullopt, std::nullopt, std::nullopt,
                           false, std::nullopt, none, none, none, ok_idx);
        },
        "Unsupported dtype in DISPATCH_FLOATING_TYPES_FOR_ALLREDUCE.");
    // moe_finalize_backend (0.7.4, keyword-only): "trtllm" or "cake" for pattern 7 (any other
    // pattern ignores it); "cake", upstream's SM100 kernels with their own summation order, is
    // refused here.
    auto finalize_with = [&](const char* backend) {
      allreduce_fusion(x, ws, 7, false, true, none, none, none, none, none, x, g, 1e-6,
                       std::nullopt, std::nullopt, std::nullopt, false, std::nullopt, none, none,
                       none, ok_idx, none, none, std::nullopt, 0.0, backend);
    };
    expect_error([&] { finalize_with("bogus"); },
                 "backend must be 'trtllm' or 'cake', got 'bogus'");
    expect_error([&] { finalize_with("cake"); }, "the 'cake' MoE finalize kernels");
  });
  // Three ranks: upstream's kernels have 2, 4, 8 and 16.
  with_group(3, 4, H, kBf, [&](int64_t, auto ws) {
    const Tensor x = Tensor::zeros({Tk, H}, kBf), g = Tensor::full({H}, 1.0, kBf);
    const Tensor idx = Tensor::from_vector({0, 1}, {Tk, 1}, DType::kInt32);
    expect_error(
        [&] {
          allreduce_fusion(x, ws, 7, false, true, std::nullopt, std::nullopt, std::nullopt,
                           std::nullopt, std::nullopt, x, g, 1e-6, std::nullopt, std::nullopt,
                           std::nullopt, false, std::nullopt, std::nullopt, std::nullopt,
                           std::nullopt, idx);
        },
        "Unsupported n_ranks");
  });
}

TEST(CommRules, SquareSumAddsInTheCudaBlocksTreeOrder) {
  // Terms 1 and two 2^-24 (e): in order from 0 each e is lost (1 + e is a tie, to even: 1); the
  // block tree adds the two e first where they meet first (1 + 2^-23, exact).
  const float e = std::ldexp(1.0f, -24);
  auto sum_of = [](std::vector<std::pair<int64_t, float>> terms, int64_t n) {
    return kernels::ar_square_sum(n, [&](float acc, int64_t j) {
      for (const auto& [k, v] : terms) {
        if (k == j) return acc + v;
      }
      return acc;
    });
  };
  const float up = 1.0f + std::ldexp(1.0f, -23);
  ASSERT_EQ((1.0f + e) + e, 1.0f);
  // Lanes 0, 1, 3 of warp 0: lane 1 + lane 3 at o = 2, then lane 0 at o = 1.
  EXPECT_EQ(sum_of({{0, 1.0f}, {1, e}, {3, e}}, 4), up);
  // Warps 0, 1, 3 (their lane 0): the same butterfly over the warps' sums.
  EXPECT_EQ(sum_of({{0, 1.0f}, {32, e}, {96, e}}, 97), up);
  // Terms 0, 512, 1024 are thread 0's: added in order, so both e are lost.
  EXPECT_EQ(sum_of({{0, 1.0f}, {512, e}, {1024, e}}, 1025), 1.0f);
  // Every term once.
  std::vector<int> seen(1500, 0);
  kernels::ar_square_sum(1500, [&](float acc, int64_t j) {
    ++seen[static_cast<std::size_t>(j)];
    return acc;
  });
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 1500);
  EXPECT_EQ(kernels::kArThreads, 512);
}

// ---- MNNVL all-reduce (MNNVLAllReduceFusionWorkspace)
// --------------------------------------------

TEST(CommRules, MnnvlSumChunksByEightInOneShotAboveEightRanks) {
  // 16 fp32 ranks: 2^24 then fifteen 1s. One sequential sum loses every 1 (2^24 + 1 rounds back
  // to 2^24, a tie to even); one-shot's two chunks of 8 keep the second chunk's 8.
  auto load = [](int k) { return k == 0 ? 16777216.0f : 1.0f; };
  auto same = [](float v) { return v; };
  EXPECT_EQ(kernels::mnnvl_rank_sum(16, true, load, same), 16777224.0f);
  EXPECT_EQ(kernels::mnnvl_rank_sum(16, false, load, same), 16777216.0f);
  // 8 ranks: one chunk either way.
  EXPECT_EQ(kernels::mnnvl_rank_sum(8, true, load, same), 16777216.0f);
}

TEST(CommRules, MnnvlSumReadsMinusZeroAsPlusZeroAndFlushesSubnormals) {
  auto same = [](float v) { return v; };
  // -1.5 * 2^-126 + 2^-126 flushes to -0; adding rank 2's -0 read as +0 gives +0 (as -0 it
  // would stay -0).
  const float m = std::ldexp(1.0f, -126);
  auto with_neg_zero = [&](int k) { return k == 0 ? -1.5f * m : k == 1 ? m : -0.0f; };
  EXPECT_FALSE(std::signbit(kernels::mnnvl_rank_sum(4, true, with_neg_zero, same)));
  EXPECT_TRUE(std::signbit(-0.0f + -0.0f));  // what the unsanitized sum would keep
  // A subnormal input counts as zero (FTZ): 1 + 2^-130 is 1, and 2^-130 alone is 0.
  const float sub = std::ldexp(1.0f, -130);
  EXPECT_EQ(kernels::mnnvl_rank_sum(
                2, true, [&](int k) { return k ? sub : 0.0f; }, same),
            0.0f);
  EXPECT_EQ(kernels::mnnvl_ftz(-sub), 0.0f);
  EXPECT_TRUE(std::signbit(kernels::mnnvl_ftz(-sub)));
  // -1.5 * 2^-126 + 2^-126 is a negative subnormal, flushed to -0: one-shot keeps it, two-shot
  // turns the -0 result into +0.
  auto tiny_sum = [&](int k) { return k ? m : -1.5f * m; };
  EXPECT_TRUE(std::signbit(kernels::mnnvl_rank_sum(2, true, tiny_sum, same)));
  EXPECT_EQ(kernels::mnnvl_rank_sum(2, true, tiny_sum, same), 0.0f);
  EXPECT_FALSE(std::signbit(kernels::mnnvl_rank_sum(2, false, tiny_sum, same)));
}

TEST(CommRules, MnnvlNormAssociatesAsEachStrategy) {
  // One-shot rounds the square to the dtype first; two-shot squares in fp32.
  auto bf = [](float v) { return bf16r(v); };
  const float r = 1.0f + std::ldexp(1.0f, -7);  // 1 + 2^-7: its square needs 15 bits
  EXPECT_EQ(kernels::mnnvl_square(r, false, bf), r * r);
  EXPECT_EQ(kernels::mnnvl_square(r, true, bf), bf16r(r * r));
  EXPECT_NE(r * r, bf16r(r * r));
  // (r * inv) * w against ((w) * r) * inv, each product rounded to fp32.
  const float rr = 1.1f, inv = 0.3f, g = 0.23f;  // values whose two orders differ in fp32
  ASSERT_NE((rr * inv) * g, (g * rr) * inv);
  EXPECT_EQ(kernels::mnnvl_norm(rr, inv, g, 0.0f, true), (rr * inv) * g);
  EXPECT_EQ(kernels::mnnvl_norm(rr, inv, g, 0.0f, false), (g * rr) * inv);
  EXPECT_EQ(kernels::mnnvl_norm(rr, inv, g, 1.0f, true), (rr * inv) * (1.0f + g));
}

// Runs `body(rank, workspace)` on W threads with an "mnnvl" workspace each.
void with_mnnvl_group(
    int64_t W, int64_t max_tokens, int64_t H, DType dt,
    const std::function<void(int64_t, std::shared_ptr<AllReduceFusionWorkspace>)>& body,
    Device dev = Device::cpu()) {
  comm::ThreadGroup g(W, dev);
  g.run([&](int64_t r) {
    auto ws = create_allreduce_fusion_workspace("mnnvl", W, r, max_tokens, H, dt, std::nullopt,
                                                g.backend(r));
    EXPECT_EQ(ws->backend(), "mnnvl");
    body(r, ws);
  });
}

TEST(MnnvlAllreduce, WorkspaceSizesAreUpstreams) {
  comm::ThreadGroup g(4);
  g.run([&](int64_t r) {
    // W 4, T 64, H 4096, bf16. Default: one-shot at min(2^20 / (4 * 2 * 4096), 64) = 32 tokens,
    // 32 * 4096 * 4 * 2 = 1 MiB, against two-shot 2 * 16 * 4 * 4096 * 2 = 1 MiB: 1 MiB; three
    // buffers and the 2 KiB pad round up to 4 MiB: (4194304 - 2048) / 3 down to 32 = 1397408.
    auto ws =
        std::dynamic_pointer_cast<MNNVLAllReduceFusionWorkspace>(create_allreduce_fusion_workspace(
            "mnnvl", 4, r, 64, 4096, kBf, std::nullopt, g.backend(r)));
    ASSERT_NE(ws, nullptr);
    EXPECT_EQ(ws->class_name(), "MNNVLAllReduceFusionWorkspace");
    EXPECT_EQ(ws->rank(), r);
    EXPECT_EQ(ws->world_size(), 4);
    EXPECT_EQ(ws->buffer_size_bytes(), 1397408);
    EXPECT_EQ(ws->workspace_size_bytes(), 3 * 1397408);
    // force_oneshot_support: one-shot at all 64 tokens, 2 MiB: 6 MiB + 2 KiB round up to 8 MiB,
    // (8388608 - 2048) / 3 = 2795520.
    auto big =
        std::dynamic_pointer_cast<MNNVLAllReduceFusionWorkspace>(create_allreduce_fusion_workspace(
            "mnnvl", 4, r, 64, 4096, kBf, std::nullopt, g.backend(r), true));
    EXPECT_EQ(big->buffer_size_bytes(), 2795520);
    // A call's need: 33 tokens one-shot is 33 * 4096 * 4 * 2 = 1081344 bytes (AUTO: two-shot,
    // 2 * 9 * 4 * 4096 * 2 = 589824); one-shot fits up to 42 tokens (1376256 bytes).
    EXPECT_TRUE(ws->is_buffer_size_sufficient(4, 33, 4096, kBf));
    EXPECT_TRUE(
        ws->is_buffer_size_sufficient(4, 42, 4096, kBf, MNNVLAllreduceFusionStrategy::ONESHOT));
    EXPECT_FALSE(ws->is_buffer_size_sufficient(4, 43, 4096, kBf, std::optional<bool>(true)));
    EXPECT_TRUE(big->is_buffer_size_sufficient(4, 85, 4096, kBf, std::optional<bool>(true)));
    EXPECT_FALSE(big->is_buffer_size_sufficient(4, 86, 4096, kBf, std::optional<bool>(true)));
    big->destroy();
    ws->destroy();
    ws->destroy();  // idempotent
  });
  using M = MNNVLAllReduceFusionWorkspace;
  // Upstream's required sizes: one-shot T * H * tp * e, two-shot 2 * ceil(T / tp) * tp * H * e
  // (any value but ONESHOT and AUTO), AUTO one-shot up to 2^20 bytes of T * H * tp * e.
  EXPECT_EQ(M::get_required_buffer_size_bytes(2, 5, 32, kBf, MNNVLAllreduceFusionStrategy::ONESHOT),
            640);
  EXPECT_EQ(M::get_required_buffer_size_bytes(2, 5, 32, kBf, MNNVLAllreduceFusionStrategy::TWOSHOT),
            768);
  EXPECT_EQ(M::get_required_buffer_size_bytes(2, 5, 32, kBf, 7), 768);
  EXPECT_EQ(M::get_required_buffer_size_bytes(8, 16, 4096, kBf), 16 * 4096 * 8 * 2);
  EXPECT_EQ(M::get_required_buffer_size_bytes(8, 17, 4096, kBf), 2 * 3 * 8 * 4096 * 2);
  // Refused before any rank meets: no sizes, a buffer past UINT32_MAX (the request is rounded
  // up to 32 first: 2^32 - 31 becomes 2^32), another group's size.
  comm::ThreadGroup one(1);
  auto m = std::make_shared<Mapping>(1, 0, 8, 1, 1);
  expect_error(
      [&] { MNNVLAllReduceFusionWorkspace(m, 4, 32, std::nullopt, std::nullopt, one.backend(0)); },
      "max_num_tokens, hidden_dim, and dtype must be provided if buffer_size_in_bytes is not "
      "provided.");
  expect_error(
      [&] {
        MNNVLAllReduceFusionWorkspace(m, std::nullopt, std::nullopt, std::nullopt,
                                      (int64_t{1} << 32) - 31, one.backend(0));
      },
      "The buffer size in bytes 4294967296 is greater than the maximum supported size "
      "(UINT32_MAX).");
  // A default size past the limit says so too (no overflow on the way).
  expect_error(
      [&] {
        MNNVLAllReduceFusionWorkspace(m, int64_t{1} << 40, 1 << 20, kBf, std::nullopt,
                                      one.backend(0));
      },
      "is greater than the maximum supported size (UINT32_MAX).");
  auto m2 = std::make_shared<Mapping>(2, 0, 8, 1, 2);
  expect_error([&] { MNNVLAllReduceFusionWorkspace(m2, 4, 32, kBf, std::nullopt, one.backend(0)); },
               "is not the mapping's TP rank/size 0/2");
  // "auto" on CPU ranks: no multicast anywhere, so trtllm (upstream's vote).
  auto ws = create_allreduce_fusion_workspace("auto", std::nullopt, std::nullopt, 4, 32, kBf,
                                              std::nullopt, one.backend(0));
  EXPECT_EQ(ws->backend(), "trtllm");
}

// The MNNVL sum of every rank's input in fp32 from 0 (-0 as +0), rounded once.
std::vector<double> mnnvl_sum(const std::vector<Tensor>& in, DType dt) {
  std::vector<std::vector<double>> v;
  for (const Tensor& t : in) v.push_back(t.to_double_vector());
  std::vector<double> s(v[0].size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    float acc = 0.0f;
    for (const auto& r : v) acc += static_cast<float>(r[i]);
    s[i] = round_dt(dt, acc);
  }
  return s;
}

TEST(MnnvlAllreduce, SumsInFp32OnceWhateverTheStrategy) {
  // Ranks hold 1, 2^-8, 2^-8, 0: MNNVL's fp32 sum keeps 1 + 2^-7, which bf16 holds (the
  // trtllm backend without fp32_acc rounds every partial sum back to 1). -0 everywhere sums to
  // +0 (trtllm's two-shot keeps -0).
  const float tiny = std::ldexp(1.0f, -8);
  for (bool oneshot : {true, false}) {
    std::vector<Tensor> out(4), zero(4);
    with_mnnvl_group(4, 8, 8, kBf, [&](int64_t r, auto ws) {
      Tensor x = Tensor::full({8, 8}, r == 0 ? 1.0 : r == 3 ? 0.0 : tiny, kBf);
      out[r] = allreduce_fusion(x, ws, P::kAllReduce, false, true, std::nullopt, std::nullopt,
                                std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                std::nullopt, 1e-6, std::nullopt, std::nullopt, oneshot);
      // -1.5 * 2^-126, 2^-126, -0, -0: the first two flush to -0, and +0 (the -0s read as +0)
      // makes +0; as -0s they would keep it -0. Two-shot turns a -0 result into +0 anyway.
      const double m = std::ldexp(1.0, -126);
      const double z = r == 0 ? -1.5 * m : r == 1 ? m : -0.0;
      zero[r] =
          allreduce_fusion(Tensor::full({8, 8}, z, kBf), ws, P::kAllReduce, false, true,
                           std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                           std::nullopt, std::nullopt, 1e-6, std::nullopt, std::nullopt, oneshot);
    });
    for (int r = 0; r < 4; ++r) {
      for (double v : out[r].to_double_vector()) EXPECT_EQ(v, 1.0 + 2 * tiny) << oneshot;
      for (double v : zero[r].to_double_vector()) EXPECT_FALSE(std::signbit(v)) << oneshot;
    }
  }
  // Random inputs in every dtype at 2 and 4 ranks, odd token counts (two-shot pads them).
  for (int64_t W : {2, 4}) {
    for (DType dt : {kBf, kF16, kF32}) {
      for (bool oneshot : {true, false}) {
        const Fixture f = fixture(W, 7, 64, dt, 31 + W);
        std::vector<Tensor> out(W);
        with_mnnvl_group(W, 7, 64, dt, [&](int64_t r, auto ws) {
          out[r] =
              allreduce_fusion(f.in[r], ws, P::kAllReduce, false, true, std::nullopt, std::nullopt,
                               std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                               1e-6, std::nullopt, std::nullopt, oneshot);
        });
        const std::vector<double> want = mnnvl_sum(f.in, dt);
        for (int64_t r = 0; r < W; ++r) {
          ASSERT_EQ(out[r].to_double_vector(), want) << W << " ranks, " << dtype_name(dt);
        }
      }
    }
  }
}

// The MNNVL kernels' formula per token, in plain fp32: s = dt(sum of the inputs from 0),
// r = dt(s + residual), the sum of squares of dt(r * r) (one-shot) or r * r (two-shot) in the
// CUDA kernel's block order (ar_square_sum, as the CPU reference), inv = 1 / sqrt(ss / H + eps),
// the norm (r * inv) * (wb + g) or ((wb + g) * r) * inv; y its rounding to dt.
struct MnnvlRef {
  std::vector<float> residual, yf, y;
};
MnnvlRef mnnvl_reference(const Fixture& f, int64_t rank, bool oneshot, float eps, float wb) {
  const int64_t T = f.T, H = f.H;
  MnnvlRef o;
  const auto res = f.res[rank].to_double_vector(), g = f.gamma.to_double_vector();
  std::vector<std::vector<double>> in;
  for (const Tensor& t : f.in) in.push_back(t.to_double_vector());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < H; ++j) {
      float acc = 0.0f;
      for (const auto& v : in) acc += static_cast<float>(v[t * H + j]);
      const float s = round_dt(f.dt, acc);
      o.residual.push_back(round_dt(f.dt, s + static_cast<float>(res[t * H + j])));
    }
    const float ss = kernels::ar_square_sum(H, [&](float a, int64_t j) {
      const float r = o.residual[t * H + j];
      return a + (oneshot ? round_dt(f.dt, r * r) : r * r);
    });
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
    for (int64_t j = 0; j < H; ++j) {
      const float r = o.residual[t * H + j], w = wb + static_cast<float>(g[j]);
      const float yf = oneshot ? (r * inv) * w : (w * r) * inv;
      o.yf.push_back(yf);
      o.y.push_back(round_dt(f.dt, yf));
    }
  }
  return o;
}

TEST(MnnvlAllreduce, ResidualRmsNormIsEachStrategysFormulaBitForBit) {
  for (DType dt : {kBf, kF16, kF32}) {
    for (bool oneshot : {true, false}) {
      for (float wb : {0.0f, 1.0f}) {
        const Fixture f = fixture(2, 6, 128, dt, 77);
        std::vector<Tensor> res_out(2), norm(2), ret(2), alloc(2);
        with_mnnvl_group(2, 8, 128, dt, [&](int64_t r, auto ws) {
          res_out[r] = Tensor::empty({6, 128}, dt);
          norm[r] = Tensor::empty({6, 128}, dt);
          ret[r] = allreduce_fusion(f.in[r], ws, P::kARResidualRMSNorm, false, true, std::nullopt,
                                    res_out[r], norm[r], std::nullopt, std::nullopt, f.res[r],
                                    f.gamma, 1e-5, std::nullopt, std::nullopt, oneshot, false,
                                    std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                    std::nullopt, std::nullopt, std::nullopt, std::nullopt, wb);
          // None outputs: upstream allocates residual_out and norm_out, returns norm_out; a
          // gamma of shape [H, 1] passes its checks.
          alloc[r] = allreduce_fusion(
              f.in[r], ws, P::kARResidualRMSNorm, false, true, std::nullopt, std::nullopt,
              std::nullopt, std::nullopt, std::nullopt, f.res[r], f.gamma.reshape({128, 1}), 1e-5,
              std::nullopt, std::nullopt, oneshot, false, std::nullopt, std::nullopt, std::nullopt,
              std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, wb);
        });
        const std::vector<double> s = mnnvl_sum(f.in, dt);
        for (int64_t r = 0; r < 2; ++r) {
          const MnnvlRef ref = mnnvl_reference(f, r, oneshot, 1e-5f, wb);
          EXPECT_EQ(ret[r].data_ptr(), norm[r].data_ptr());
          EXPECT_EQ(alloc[r].to_double_vector(), norm[r].to_double_vector());
          const auto ro = res_out[r].to_double_vector(), y = norm[r].to_double_vector();
          // And against fp64 RMSNorm, within the dtype's rounding of y.
          const NormRef n64 = norm_reference(s, f.res[r], f.gamma, 6, 128, dt, 1e-5, wb);
          const double tol = dt == kF32 ? 1e-5 : dt == kF16 ? 2e-3 : 8e-3;
          for (int64_t i = 0; i < 6 * 128; ++i) {
            ASSERT_EQ(ro[i], ref.residual[i]) << i;
            ASSERT_EQ(y[i], ref.y[i])
                << dtype_name(dt) << (oneshot ? " one-shot " : " two-shot ") << i;
            ASSERT_NEAR(y[i], n64.y[i], tol * std::max(1.0, std::abs(n64.y[i]))) << i;
          }
        }
      }
    }
  }
}

TEST(MnnvlAllreduce, QuantPatternsQuantizeTheNormAsEachStrategyDoes) {
  const int64_t W = 2, T = 5, H = 256, nb = H / 16;
  const Fixture f = fixture(W, T, H, kBf, 91);
  for (bool oneshot : {true, false}) {
    std::vector<Tensor> q_static(W), q_default(W), q_dyn(W), sc(W), q_fp4(W), sf_fp4(W), q10(W),
        sc10(W);
    with_mnnvl_group(W, 8, H, kBf, [&](int64_t r, auto ws) {
      // Pattern 4: static FP8 with scale 0.5.
      q_static[r] = allreduce_fusion(f.in[r], ws, P::kARResidualRMSNormOutFP8Quant, false, true,
                                     std::nullopt, Tensor::empty({T, H}, kBf),
                                     Tensor::empty({T, H}, kBf), std::nullopt, std::nullopt,
                                     f.res[r], f.gamma, 1e-6, Value(0.5), std::nullopt, oneshot);
      // Pattern 2, scale_factor None: upstream's 1.0; quant_out allocated and returned.
      q_default[r] =
          allreduce_fusion(f.in[r], ws, P::kARResidualRMSNormFP8Quant, false, true, std::nullopt,
                           std::nullopt, std::nullopt, std::nullopt, std::nullopt, f.res[r],
                           f.gamma, 1e-6, std::nullopt, std::nullopt, oneshot);
      // Patterns 10 and 11: per-token FP8 (every output required); 11 returns quant_out.
      q_dyn[r] = Tensor::empty({T, H}, DType::kFloat8E4M3FN);
      sc[r] = Tensor::empty({T, 1}, kF32);
      Tensor ret = allreduce_fusion(f.in[r], ws, P::kARResidualRMSNormOutDynamicFP8Quant, false,
                                    true, std::nullopt, Tensor::empty({T, H}, kBf),
                                    Tensor::empty({T, H}, kBf), q_dyn[r], sc[r], f.res[r], f.gamma,
                                    1e-6, std::nullopt, std::nullopt, oneshot);
      EXPECT_EQ(ret.data_ptr(), q_dyn[r].data_ptr());
      q10[r] = Tensor::empty({T, H}, DType::kFloat8E4M3FN);
      sc10[r] = Tensor::empty({T}, kF32);
      allreduce_fusion(f.in[r], ws, P::kARResidualRMSNormDynamicFP8Quant, false, true, std::nullopt,
                       Tensor::empty({T, H}, kBf), std::nullopt, q10[r], sc10[r], f.res[r], f.gamma,
                       1e-6, std::nullopt, std::nullopt, oneshot);
      // Pattern 3: NVFP4 with global scale 2, linear scales (allocated: the helper's).
      sf_fp4[r] = Tensor::zeros({T * nb}, DType::kUInt8);
      q_fp4[r] =
          allreduce_fusion(f.in[r], ws, P::kARResidualRMSNormFP4Quant, false, true, std::nullopt,
                           std::nullopt, std::nullopt, std::nullopt, sf_fp4[r], f.res[r], f.gamma,
                           1e-6, Value(2.0), QuantizationSFLayout::LINEAR, oneshot);
    });
    for (int64_t r = 0; r < W; ++r) {
      const MnnvlRef ref = mnnvl_reference(f, r, oneshot, 1e-6f, 0.0f);
      const auto qs = q_static[r].to(kF32).to_double_vector();
      const auto qd = q_default[r].to(kF32).to_double_vector();
      const auto qy = q_dyn[r].to(kF32).to_double_vector(), s = sc[r].to_double_vector();
      const auto qy10 = q10[r].to(kF32).to_double_vector(), s10 = sc10[r].to_double_vector();
      const auto q4 = q_fp4[r].to_double_vector(), sf4 = sf_fp4[r].to_double_vector();
      for (int64_t t = 0; t < T; ++t) {
        // Per-token FP8 scales the rounded norm in one-shot, the fp32 norm in two-shot.
        const std::vector<float>& yq = oneshot ? ref.y : ref.yf;
        float amax = 0.0f;
        for (int64_t j = 0; j < H; ++j) amax = std::max(amax, std::abs(yq[t * H + j]));
        const float st = kernels::ar_token_scale(amax);
        EXPECT_EQ(s[t], st) << t;
        EXPECT_EQ(s10[t], st) << t;
        for (int64_t j = 0; j < H; ++j) {
          const int64_t i = t * H + j;
          EXPECT_EQ(qs[i], kernels::e4m3_code_to_float(kernels::ar_fp8_static(ref.y[i], 0.5f)));
          EXPECT_EQ(qd[i], kernels::e4m3_code_to_float(kernels::ar_fp8_static(ref.y[i], 1.0f)));
          const float want = kernels::e4m3_code_to_float(kernels::ar_fp8_scaled(yq[i], st));
          EXPECT_EQ(qy[i], want) << i;
          EXPECT_EQ(qy10[i], want) << i;
        }
        for (int64_t b = 0; b < nb; ++b) {
          const kernels::Nvfp4Block blk = kernels::ar_nvfp4_block(&ref.y[t * H + b * 16], 2.0f);
          EXPECT_EQ(sf4[t * nb + b], blk.sf) << t << ", " << b;
          for (int k = 0; k < 8; ++k) {
            EXPECT_EQ(q4[t * (H / 2) + b * 8 + k], static_cast<uint8_t>(blk.packed >> (8 * k)));
          }
        }
      }
    }
  }
}

TEST(MnnvlAllreduce, RefusesWhatUpstreamRefusesInItsOrder) {
  const Fixture f = fixture(2, 4, 32, kBf, 5);
  std::vector<std::string> checked(2);
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) {
    auto ws =
        create_allreduce_fusion_workspace("mnnvl", 2, r, 4, 32, kBf, std::nullopt, g.backend(r));
    const Tensor& x = f.in[r];
    const std::optional<Tensor> none;
    expect_error([&] { allreduce_fusion(x, ws, 8); },
                 "MNNVL AllReduce+RMS fusion does not support pattern 8. Please try the TRTLLM "
                 "backend instead.");
    expect_error(
        [&] {
          allreduce_fusion(x, ws, P::kARResidualRMSNormFP4Quant, false, true, none, none, none,
                           none, none, f.res[r], f.gamma, 1e-6, std::nullopt,
                           QuantizationSFLayout::SWIZZLED_8x4);
        },
        "MNNVL quantization fusion supports SWIZZLED_128x4 or LINEAR scale layouts, not "
        "SWIZZLED_8x4");
    // The unified API's required arguments come before the helpers' shape checks.
    expect_error(
        [&] {
          allreduce_fusion(x.reshape({1, 4, 32}), ws, P::kARResidualRMSNorm);
        },
        "MNNVL AllReduce+RMS fusion requires residual_in");
    expect_error(
        [&] {
          allreduce_fusion(x, ws, P::kARResidualRMSNormFP8Quant, false, true, none, none, none,
                           none, none, f.res[r]);
        },
        "MNNVL quantized AllReduce+RMS fusion requires rms_gamma");
    expect_error(
        [&] {
          allreduce_fusion(x, ws, P::kARResidualRMSNormDynamicFP8Quant, false, true, none, none,
                           none, none, none, f.res[r], f.gamma);
        },
        "requires residual_out");
    expect_error(
        [&] {
          allreduce_fusion(x.reshape({1, 4, 32}), ws, P::kAllReduce);
        },
        "The input tensor must be 2D, got 3D. The shape is torch.Size([1, 4, 32]).");
    expect_error(
        [&] {
          allreduce_fusion(x, ws, P::kARResidualRMSNorm, false, true, none, none, none, none, none,
                           f.res[r], f.gamma.slice(0, 0, 16));
        },
        "The gamma tensor must have the same number of elements as the hidden dimension, got 16 "
        "elements but expected 32 elements.");
    expect_error(
        [&] {
          allreduce_fusion(Tensor::zeros({8192, 32}, kBf), ws, P::kAllReduce);
        },
        "The buffer size in the given workspace is insufficient for the given problem "
        "size. Buffer: 698368 bytes, Required: 1048576 bytes.");
    expect_error(
        [&] {
          allreduce_fusion(Tensor::zeros({4, 12}, kBf), ws, P::kAllReduce);
        },
        "token_dim must be divisible by 8");
    expect_error(
        [&] {
          allreduce_fusion(Tensor::zeros({4, 32}, DType::kInt32), ws, 0);
        },
        "Unsupported dtype in DISPATCH_FLOATING_TYPES_FOR_MNNVL_ALLREDUCE.");
    expect_error(
        [&] {
          allreduce_fusion(x.to(kF32), ws, P::kARResidualRMSNormFP4Quant, false, true, none, none,
                           none, none, none, f.res[r].to(kF32), f.gamma.to(kF32));
        },
        "MNNVL NVFP4 quantization requires fp16 or bf16 input.");
    expect_error(
        [&] {
          allreduce_fusion(x, ws, P::kAllReduce, false, true, Tensor::empty({4, 16}, kBf));
        },
        "output shape mismatch: expected (4, 32) but got (4, 16)");
    expect_error(
        [&] {
          allreduce_fusion(x.reshape({32, 4}).transpose(0, 1), ws, 0);
        },
        "must be contiguous");
    // Detached, a call is refused after the argument checks and before the size check.
    auto* m = dynamic_cast<MNNVLAllReduceFusionWorkspace*>(ws.get());
    m->checkpoint_prepare();
    expect_error(
        [&] {
          allreduce_fusion(Tensor::zeros({8192, 32}, kBf), ws, 0);
        },
        "MNNVL handles are not attached");
    expect_error([&] { allreduce_fusion(x.reshape({1, 4, 32}), ws, 0); }, "must be 2D");
    m->checkpoint_restore(g.backend(r));
    EXPECT_EQ(allreduce_fusion(x, ws, P::kAllReduce).dim(), 2);
    checked[r] = "checked";
  });
  EXPECT_EQ(checked[0], "checked");
  // Group sizes the kernels lack: one rank, six ranks.
  comm::ThreadGroup one(1);
  auto ws1 =
      create_allreduce_fusion_workspace("mnnvl", 1, 0, 4, 32, kBf, std::nullopt, one.backend(0));
  expect_error(
      [&] {
        allreduce_fusion(Tensor::zeros({4, 32}, kBf), ws1, 0);
      },
      "nranks must be between 2 and 64, got 1");
  comm::ThreadGroup six(6);
  six.run([&](int64_t r) {
    auto ws =
        create_allreduce_fusion_workspace("mnnvl", 6, r, 4, 32, kBf, std::nullopt, six.backend(r));
    expect_error(
        [&] {
          allreduce_fusion(Tensor::zeros({4, 32}, kBf), ws, 0);
        },
        "MNNVL AllReduce: unsupported world_size 6. Supported sizes: {2, 4, 8, 16, 32, 64}");
    expect_error(
        [&] {
          allreduce_fusion(Tensor::zeros({4, 32}, kBf), ws, 0, false, true, std::nullopt,
                           std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                           std::nullopt, 1e-6, std::nullopt, std::nullopt, false);
        },
        "[MNNVL AllReduceTwoShot] Unsupported world_size6.");
  });
}

TEST(MnnvlAllreduce, CheckpointsAndCallsReplayAsTheRecordedBackend) {
  namespace fs = std::filesystem;
  // Inputs whose trtllm sum (partial sums rounded) differs from MNNVL's (one fp32 sum): a replay
  // on the wrong backend would diverge.
  const float tiny = std::ldexp(1.0f, -8);
  std::vector<Tensor> in(4);
  for (int r = 0; r < 4; ++r)
    in[r] = Tensor::full({4, 32}, r == 0 ? 1.0 : r == 3 ? 0.0 : tiny, kBf);
  comm::ThreadGroup g(4);
  std::vector<std::shared_ptr<AllReduceFusionWorkspace>> made_before(4);
  // Workspaces made before the recording began: replay knows them by their class alone.
  g.run([&](int64_t r) {
    made_before[r] =
        create_allreduce_fusion_workspace("mnnvl", 4, r, 8, 32, kBf, std::nullopt, g.backend(r));
  });
  std::vector<Tensor> sums(4);
  const fs::path dir = record_dump("mnnvl_ckpt", [&] {
    g.run([&](int64_t r) {
      auto ws = std::dynamic_pointer_cast<MNNVLAllReduceFusionWorkspace>(
          create_allreduce_fusion_workspace("mnnvl", 4, r, 8, 32, kBf, std::nullopt, g.backend(r)));
      sums[r] = allreduce_fusion(in[r], ws, P::kAllReduce);
      ws->checkpoint_prepare();
      ws->checkpoint_prepare();  // a no-op, no collective
      ws->checkpoint_restore(g.backend(r));
      ws->checkpoint_restore(g.backend(r));  // a no-op
      EXPECT_EQ(allreduce_fusion(in[r], ws, P::kAllReduce).to_double_vector(),
                sums[r].to_double_vector());
      allreduce_fusion(in[r], made_before[r], P::kAllReduce, false, true, std::nullopt,
                       std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                       std::nullopt, 1e-6, std::nullopt, std::nullopt, false);
    });
  });
  for (double v : sums[0].to_double_vector()) ASSERT_EQ(v, 1.0 + 2 * tiny);
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  // Per rank: creation, call, prepare twice, restore twice, two calls.
  ASSERT_EQ(rs.size(), 32u);
  int restores = 0;
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    if (r.function_name == "MNNVLAllReduceFusionWorkspace.checkpoint_restore") {
      ++restores;
      EXPECT_NE(r.note.find("after its MNNVLAllReduceFusionWorkspace.checkpoint_prepare"),
                std::string::npos)
          << r.note;
    }
  }
  EXPECT_EQ(restores, 8);
  fs::remove_all(dir);
}

// ---- PcieIpcAllReduceWorkspace ------------------------------------------------------------------

// Every rank's all_reduce of `vals[r]` (a [2, 16] tensor filled with it) with `config`.
std::vector<double> pcie_sums(int64_t W, const std::vector<double>& vals,
                              std::optional<Value> config, DType dt = kBf) {
  comm::ThreadGroup g(W);
  std::vector<double> got(static_cast<std::size_t>(W));
  g.run([&](int64_t r) {
    PcieIpcAllReduceWorkspace ws(g.backend(r), 64, dt);
    EXPECT_EQ(ws.rank(), r);
    Tensor out = ws.all_reduce(Tensor::full({4, 16}, vals[r], dt), std::nullopt, config);
    const auto v = out.to_double_vector();
    for (double x : v) EXPECT_EQ(x, v[0]);
    got[r] = v[0];
  });
  return got;
}

TEST(PcieIpcAllReduce, SumsInRankOrderOrByIslandsAsTheVariantDoes) {
  const double t = std::ldexp(1.0, -8);
  // 4 ranks, sequential, each partial sum rounded to bf16: 1 + t is a tie and stays 1.
  for (double v : pcie_sums(4, {1, t, t, 0}, std::nullopt)) EXPECT_EQ(v, 1.0);
  // 8 ranks: ((1 + 0) + (t + t)) keeps 2t = 2^-7, the sequential sum loses each t.
  const std::vector<double> eight = {1, 0, t, t, 0, 0, 0, 0};
  for (double v : pcie_sums(8, eight, Value::tuple({Value(16), Value(256), Value(3)}))) {
    EXPECT_EQ(v, 1.0);  // FLAT_STAGED: sequential
  }
  for (double v : pcie_sums(8, eight, Value::tuple({Value(16), Value(256), Value(0)}))) {
    EXPECT_EQ(v, 1.0 + 2 * t);  // UNSTAGED: islands
  }
  for (double v : pcie_sums(8, eight, std::nullopt)) EXPECT_EQ(v, 1.0 + 2 * t);  // the seed
  for (double v : pcie_sums(8, eight, Value::tuple({Value(4), Value(256), Value(1)}))) {
    EXPECT_EQ(v, 1.0 + 2 * t);  // STAGED: islands
  }
  // Upstream's recorded config (its repr) says the same.
  ObjectRef ring;
  ring.type = "IpcLaunchConfig";
  ring.repr = "IpcLaunchConfig(blocks=2, threads=256, variant=<IpcVariant.STAGED_RING: 2>)";
  for (double v : pcie_sums(8, eight, Value(ring))) EXPECT_EQ(v, 1.0 + 2 * t);
  for (double v : pcie_sums(2, {3, -5}, std::nullopt, kF16)) EXPECT_EQ(v, -2.0);
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) {  // out may be inp
    PcieIpcAllReduceWorkspace ws(g.backend(r), 64);
    Tensor x = Tensor::full({32}, 1.0 + static_cast<double>(r), kBf);
    EXPECT_EQ(ws.all_reduce(x, x).data_ptr(), x.data_ptr());
    for (double v : x.to_double_vector()) EXPECT_EQ(v, 3.0);
    ws.destroy();
  });
}

TEST(PcieIpcAllReduce, RefusesWhatUpstreamRefuses) {
  comm::ThreadGroup three(3);
  expect_error([&] { PcieIpcAllReduceWorkspace(three.backend(0), 64); }, "world size 3");
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) {
    auto b = g.backend(r);
    if (r == 0) {
      expect_error([&] { PcieIpcAllReduceWorkspace(b, 60); }, "multiple of 8");
      expect_error([&] { PcieIpcAllReduceWorkspace(b, 64, kF32); }, "unsupported");
    }
    b->barrier();
    PcieIpcAllReduceWorkspace ws(b, 64);
    const Tensor x = Tensor::zeros({4, 8}, kBf);
    EXPECT_TRUE(ws.supports(x));
    EXPECT_FALSE(ws.supports(Tensor::zeros({8}, kBf)));  // fewer than 8 elements a rank
    expect_error([&] { ws.all_reduce(x, std::nullopt, std::nullopt, true); }, "enable_pdl");
    expect_error([&] { ws.all_reduce(Tensor::zeros({8}, kBf)); }, "check supports() first");
    expect_error(
        [&] {
          ws.all_reduce(Tensor::zeros({16, 8}, kBf), std::nullopt,
                        Value::tuple({Value(1), Value(128), Value(0)}));
        },
        "payload exceeds the workspace capacity");
    expect_error(
        [&] {
          ws.all_reduce(x, std::nullopt, Value::tuple({Value(1), Value(128), Value(2)}));
        },
        "only the UNSTAGED and STAGED");
    expect_error(
        [&] {
          ws.all_reduce(x, std::nullopt, Value::tuple({Value(1), Value(128), Value(4)}));
        },
        "not implemented");
    expect_error(
        [&] {
          ws.all_reduce(x, std::nullopt, Value::tuple({Value(0), Value(128), Value(0)}));
        },
        "blocks must be in");
    expect_error([&] { ws.all_reduce(x, Tensor::zeros({4, 8}, kF16)); }, "does not match");
    b->barrier();
    ws.destroy();
    expect_error([&] { ws.all_reduce(x); }, "destroyed");
  });
}

TEST(PcieIpcAllReduce, RecordedRanksReplayTogether) {
  namespace fs = std::filesystem;
  comm::ThreadGroup g(4);
  const fs::path dir = record_dump("pcie", [&] {
    g.run([&](int64_t r) {
      // The higher ranks make their workspaces first: the recording's order of creation is not
      // the ranks' order, and the replay must place each rank by its backend's rank.
      std::this_thread::sleep_for(std::chrono::milliseconds(15 * (3 - r)));
      PcieIpcAllReduceWorkspace ws(g.backend(r), 256);
      ws.all_reduce(rand_tensor({4, 32}, kBf, 50 + r));
      Tensor out = Tensor::empty({128}, kBf);
      ws.all_reduce(rand_tensor({128}, kBf, 60 + r), out);
      g.backend(r)->barrier();
    });
  });
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  ASSERT_EQ(rs.size(), 12u);  // four constructions, eight calls
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    // The recorded group says "ThreadCommBackend(rank=N, ..."; the replay names its rank.
    const std::string key = "ThreadCommBackend(rank=";
    const auto at = r.metadata_json.find(key);
    if (r.function_name == "PcieIpcAllReduceWorkspace.__init__") {
      ASSERT_NE(at, std::string::npos) << r.metadata_json;
      const char rank = r.metadata_json[at + key.size()];
      EXPECT_NE(r.note.find(std::string("this is rank ") + rank + ","), std::string::npos)
          << r.note;
    }
    EXPECT_NE(r.note.find("a collective"), std::string::npos) << r.note;
  }
  fs::remove_all(dir);
}

// Two groups of one size recorded in one process, their workspaces made in the order A0, B0, B1,
// A1: the replay keeps each group's ranks together (by the backends' group in their repr), so
// every call replays with its own group's inputs.
TEST(PcieIpcAllReduce, TwoGroupsOfOneSizeReplayApart) {
  namespace fs = std::filesystem;
  comm::ThreadGroup a(2), b(2);
  const fs::path dir = record_dump("pcie2", [&] {
    auto run_group = [](comm::ThreadGroup& g, int64_t first_ms, int64_t second_ms, uint64_t seed) {
      g.run([&](int64_t r) {
        std::this_thread::sleep_for(std::chrono::milliseconds(r == 0 ? first_ms : second_ms));
        PcieIpcAllReduceWorkspace ws(g.backend(r), 64);
        ws.all_reduce(rand_tensor({64}, kBf, seed + static_cast<uint64_t>(r)));
        g.backend(r)->barrier();
      });
    };
    std::thread ta([&] { run_group(a, 0, 60, 70); });
    std::thread tb([&] { run_group(b, 20, 40, 80); });
    ta.join();
    tb.join();
  });
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  ASSERT_EQ(rs.size(), 8u);
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
  }
  fs::remove_all(dir);
}

// ---- MoE all-to-all sizes
// ------------------------------------------------------------------------

// ---- decode context-parallel all-to-all --------------------------------------------------------

TEST(DecodeCpA2a, WorkspaceSizeIsUpstreamsFormula) {
  // channels = max(1, SMs / (2 * ceil(cp / 8))); each holds cp FIFOs of 512 KiB and two 256-byte
  // records a peer.
  const int64_t sms = cuda_available() ? 0 : 1;  // without a GPU: one channel
  if (sms == 1) {
    EXPECT_EQ(decode_cp_a2a_workspace_size(4), 4 * (524288 + 512));
    EXPECT_EQ(decode_cp_a2a_workspace_size(16), 16 * (524288 + 512));
  }
  EXPECT_THROW(decode_cp_a2a_workspace_size(0), Error);
}

// Every rank's (partial_o, stats) of shape [3, 2, cp, D] / [3, 2, cp, S], filled from `seed`.
struct DcpIn {
  Tensor o, stats;
};
DcpIn dcp_input(int64_t cp, int64_t D, int64_t S, int64_t r, uint64_t seed, Device dev) {
  return {rand_tensor({3, 2, cp, D}, kBf, seed + r).to(dev),
          rand_tensor({3, 2, cp, S}, kF32, seed + 100 + r).to(dev)};
}

void dcp_exchange(int64_t cp, int64_t D, int64_t S, Device dev, int rounds) {
  comm::ThreadGroup g(cp, dev);
  std::vector<std::vector<DcpIn>> in(rounds, std::vector<DcpIn>(cp)),
      out(rounds, std::vector<DcpIn>(cp));
  g.run([&](int64_t r) {
    auto b = g.backend(r);
    auto mapping = std::make_shared<Mapping>(cp, r, 8, cp);
    Tensor ws = decode_cp_a2a_allocate_mnnvl_workspace(mapping, std::make_shared<MnnvlConfig>(b));
    EXPECT_EQ(ws.size(0), cp);
    decode_cp_a2a_init_workspace(ws, r, cp);
    b->barrier();
    for (int k = 0; k < rounds; ++k) {  // the workspace serves call after call
      in[k][r] = dcp_input(cp, D, S, r, 1000 * k, dev);
      if (k % 2 == 1) {
        // Upstream 0.7.4's out=: the preallocated pair is written and returned.
        const std::vector<Tensor> given{Tensor::full(in[k][r].o.shape(), 7.0, kBf, dev),
                                        Tensor::full(in[k][r].stats.shape(), 7.0, kF32, dev)};
        auto [o, st] = decode_cp_a2a_alltoall(in[k][r].o, in[k][r].stats, ws, r, cp, {}, given);
        EXPECT_EQ(o.data_ptr(), given[0].data_ptr());
        EXPECT_EQ(st.data_ptr(), given[1].data_ptr());
        out[k][r] = {o.to(Device::cpu()), st.to(Device::cpu())};
        continue;
      }
      auto [o, st] = decode_cp_a2a_alltoall(in[k][r].o, in[k][r].stats, ws, r, cp);
      out[k][r] = {o.to(Device::cpu()), st.to(Device::cpu())};
    }
    b->barrier();
  });
  for (int k = 0; k < rounds; ++k) {
    for (int64_t r = 0; r < cp; ++r) {
      for (int64_t p = 0; p < cp; ++p) {
        // out_r[.., p, :] == in_p[.., r, :], bit for bit.
        EXPECT_EQ(out[k][r].o.select(2, p).contiguous().to_double_vector(),
                  in[k][p].o.to(Device::cpu()).select(2, r).contiguous().to_double_vector());
        EXPECT_EQ(out[k][r].stats.select(2, p).contiguous().to_double_vector(),
                  in[k][p].stats.to(Device::cpu()).select(2, r).contiguous().to_double_vector());
      }
    }
  }
}

TEST(DecodeCpA2a, TransposesOverTheRanksBitForBit) {
  dcp_exchange(4, 16, 2, Device::cpu(), 3);
  dcp_exchange(2, 64, 4, Device::cpu(), 2);
  dcp_exchange(1, 8, 2, Device::cpu(), 1);
}

TEST(DecodeCpA2a, RefusesWhatUpstreamRefuses) {
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) {
    auto b = g.backend(r);
    Tensor ws = decode_cp_a2a_allocate_mnnvl_workspace(std::make_shared<Mapping>(2, r, 8, 2),
                                                       std::make_shared<MnnvlConfig>(b));
    decode_cp_a2a_init_workspace(ws, r, 2);
    b->barrier();
    const Tensor o = Tensor::zeros({3, 2, 16}, kBf), st = Tensor::zeros({3, 2, 2}, kF32);
    expect_error([&] { decode_cp_a2a_alltoall(o.to(kF32), st, ws, r, 2); }, "half or bfloat16");
    expect_error(
        [&] {
          decode_cp_a2a_alltoall(o, Tensor::zeros({3, 2, 3}, kF32), ws, r, 2);
        },
        "even and >= 2");
    expect_error(
        [&] {
          decode_cp_a2a_alltoall(o, Tensor::zeros({4, 2, 2}, kF32), ws, r, 2);
        },
        "batch dimensions must match");
    expect_error(
        [&] {
          decode_cp_a2a_alltoall(Tensor::zeros({3, 2, 4}, kBf), st, ws, r, 2);
        },
        "16-byte aligned");
    expect_error([&] { decode_cp_a2a_alltoall(o, st, ws, r, 3); }, "second-to-last dim");
    expect_error([&] { decode_cp_a2a_alltoall(o, st, ws, 2, 2); }, "cp_rank must be in");
    expect_error([&] { decode_cp_a2a_alltoall(o, st, ws.to(DType::kInt32), r, 2); }, "int64");
    // out= (upstream 0.7.4): each buffer must match its input, or upstream's text.
    const auto with_out = [&](std::vector<Tensor> given) {
      decode_cp_a2a_alltoall(o, st, ws, r, 2, {}, given);
    };
    expect_error(
        [&] {
          with_out({Tensor::zeros({3, 2, 16}, kBf)});
        },
        "expected (partial_o_out, softmax_stats_out), got 1 tensors");
    expect_error(
        [&] {
          with_out({Tensor::zeros({3, 2, 16}, kF16), st.clone()});
        },
        "partial_o_out dtype must match its input");
    expect_error(
        [&] {
          with_out({o.clone(), Tensor::zeros({3, 2}, kF32)});
        },
        "softmax_stats_out rank must match its input");
    expect_error(
        [&] {
          with_out({o.clone(), Tensor::zeros({3, 2, 4}, kF32)});
        },
        "softmax_stats_out shape must match its input");
    expect_error(
        [&] {
          with_out({Tensor::zeros({3, 16, 2}, kBf).transpose(1, 2), st.clone()});
        },
        "output must be contiguous");
    // Written in place of an input: the call gate refuses the overlap before anything moves.
    expect_error([&] { with_out({o, st.clone()}); }, "out");
    expect_error([&] { decode_cp_a2a_init_workspace(ws, 5, 2); }, "cp_rank must be in");
    expect_error(
        [&] {
          decode_cp_a2a_allocate_mnnvl_workspace(std::make_shared<Mapping>(2, r, 8, 2), nullptr);
        },
        "MnnvlConfig");
  });
  EXPECT_THROW(Mapping(4, 0, 8, 2, 1, 1), Error);  // 4 != 2 * 1 * 1
  const Mapping m(8, 5, 8, 2, 2, 2);               // tp 2, cp 2, pp 2: rank 5 = pp 1, cp 0, tp 1
  EXPECT_EQ(m.tp_rank(), 1);
  EXPECT_EQ(m.cp_rank(), 0);
  EXPECT_EQ(m.pp_rank(), 1);
}

TEST(DecodeCpA2a, RecordedRanksReplayTogether) {
  namespace fs = std::filesystem;
  comm::ThreadGroup g(2);
  std::vector<Tensor> workspaces(2);
  g.run([&](int64_t r) {
    workspaces[r] = decode_cp_a2a_allocate_mnnvl_workspace(
        std::make_shared<Mapping>(2, r, 8, 2), std::make_shared<MnnvlConfig>(g.backend(r)));
    decode_cp_a2a_init_workspace(workspaces[r], r, 2);
    g.backend(r)->barrier();
  });
  const fs::path dir = record_dump("dcp", [&] {
    g.run([&](int64_t r) {
      for (int k = 0; k < 2; ++k) {
        const DcpIn in = dcp_input(2, 16, 2, r, 77 + k, Device::cpu());
        if (k == 1) {  // the second call writes preallocated buffers (out=)
          decode_cp_a2a_alltoall(in.o, in.stats, workspaces[r], r, 2, {},
                                 std::vector<Tensor>{Tensor::zeros(in.o.shape(), kBf),
                                                     Tensor::zeros(in.stats.shape(), kF32)});
          continue;
        }
        decode_cp_a2a_alltoall(in.o, in.stats, workspaces[r], r, 2);
      }
    });
  });
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  ASSERT_EQ(rs.size(), 4u);
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    EXPECT_NE(r.note.find("a collective"), std::string::npos) << r.note;
  }
  fs::remove_all(dir);
}

// ---- ranks in processes of their own ----------------------------------------------------------

// A CommBackend over files in a shared directory (test-only): allgather round n writes
// "<n>_<rank>" atomically and waits for every rank's.
class FileBackend final : public comm::CommBackend {
 public:
  FileBackend(std::string dir, int64_t rank, int64_t size)
      : dir_(std::move(dir)), rank_(rank), size_(size) {}
  int64_t Get_rank() const override { return rank_; }
  int64_t Get_size() const override { return size_; }
  std::vector<std::string> allgather(std::string_view bytes) override {
    namespace fs = std::filesystem;
    const std::string base = dir_ + "/" + std::to_string(round_++) + "_";
    {
      std::ofstream out(base + std::to_string(rank_) + ".tmp", std::ios::binary);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    fs::rename(base + std::to_string(rank_) + ".tmp", base + std::to_string(rank_));
    std::vector<std::string> all(static_cast<std::size_t>(size_));
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (int64_t r = 0; r < size_; ++r) {
      const std::string f = base + std::to_string(r);
      while (!fs::exists(f)) {
        if (std::chrono::steady_clock::now() > deadline) {
          throw Error(ErrorCode::kInternal, "FileBackend", "",
                      "rank " + std::to_string(r) + " never came");
        }
        std::this_thread::sleep_for(1ms);
      }
      all[static_cast<std::size_t>(r)] = read_text_file(f);
    }
    return all;
  }
  void barrier() override { (void)allgather({}); }
  std::string_view class_name() const override { return "FileBackend"; }

 private:
  std::string dir_;
  int64_t rank_, size_, round_ = 0;
};

// One rank's part: a workspace and two calls, recorded into `dump`.
void multi_process_rank(int64_t rank, const std::string& rendezvous, const std::string& dump) {
  const Fixture f = fixture(2, 4, 64, kBf, 17);
  recorder::Config cfg;
  cfg.dump_dir = dump;
  recorder::start(cfg, [](const std::string&) {});
  auto backend = std::make_shared<FileBackend>(rendezvous, rank, 2);
  auto ws = create_allreduce_fusion_workspace("trtllm", 2, rank, 8, 64, kBf, std::nullopt, backend);
  allreduce_fusion(f.in[rank], ws, P::kAllReduce);
  Tensor res = f.res[rank].clone(), y = Tensor::empty({4, 64}, kBf);
  allreduce_fusion(f.in[rank], ws, P::kARResidualRMSNorm, false, true, std::nullopt, res, y,
                   std::nullopt, std::nullopt, res, f.gamma);
  backend->barrier();  // neither rank unmaps the other's buffer while it is still in a call
  recorder::stop();
}

// The second process's entry: runs only when the test below starts this binary for it.
TEST(AllreduceFusionMultiProcess, SecondRank) {
  const char* rv = std::getenv("FI_COMM_TEST_RENDEZVOUS");
  const char* dump = std::getenv("FI_COMM_TEST_DUMP");
  if (!rv || !dump) GTEST_SKIP() << "started by AllreduceFusionMultiProcess.RecordAndReplay";
  multi_process_rank(1, rv, dump);
}

TEST(AllreduceFusionMultiProcess, RecordAndReplay) {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::temp_directory_path() / ("fi_comm_mp_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp / "rv");
  const std::string rv = (tmp / "rv").string(), dump = (tmp / "dump").string();
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string cmd = "FI_COMM_TEST_RENDEZVOUS='" + rv + "' FI_COMM_TEST_DUMP='" + dump +
                          "' '" + self +
                          "' --gtest_filter=AllreduceFusionMultiProcess.SecondRank > '" +
                          (tmp / "rank1.log").string() + "' 2>&1 &";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  multi_process_rank(0, rv, dump);
  // The other process's records are complete once its four call directories are.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  auto complete = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dump)) {
      n += read_text_file((e.path() / "metadata.jsonl").string()).find("completed") !=
                   std::string::npos
               ? 1
               : 0;
    }
    return n;
  };
  while (complete() < 6 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  ASSERT_EQ(complete(), 6) << read_text_file((tmp / "rank1.log").string());
  const std::vector<replay::Result> rs = replay::replay_sequence(dump);
  ASSERT_EQ(rs.size(), 6u);
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    EXPECT_NE(r.note.find("a collective"), std::string::npos) << r.note;
  }
  fs::remove_all(tmp);
}

// ---- CUDA: every rank a thread on one GPU, against the CPU -----------------------------------

// Calls of several shapes and patterns on one workspace of `backend` a rank, W ranks as threads
// on `dev`: outs[rank][call] = {the sum (pattern 0) or norm_out, residual_out, quant_out,
// scale_out} as doubles. Per-token-group scales (8 / 9) only where they fit one int32 word.
using ArOuts = std::vector<std::vector<std::vector<std::vector<double>>>>;
ArOuts run_patterns(const std::string& backend, bool oneshot, const std::vector<int64_t>& patterns,
                    const std::vector<std::pair<int64_t, int64_t>>& shapes, uint64_t seed,
                    Device dev, int64_t W = 2, bool fp32_acc = true) {
  ArOuts outs(W);
  comm::ThreadGroup grp(W, dev);
  grp.run([&](int64_t r) {
    auto ws = create_allreduce_fusion_workspace(backend, W, r, 64, 1024, kBf, std::nullopt,
                                                grp.backend(r));
    int call = 0;
    for (int64_t pattern : patterns) {
      for (const auto& [T, H] : shapes) {
        if (backend == "trtllm" && !oneshot && T <= W) continue;  // trtllm's two-shot: T > W
        const int64_t words = (H / 128 + 3) / 4;
        if ((pattern == 8 || pattern == 9) && words > 1) continue;  // simple scale strides
        const Fixture f = fixture(W, T, H, kBf, seed + pattern * 7 + call++);
        Tensor x = f.in[r].to(dev), res = f.res[r].to(dev), g = f.gamma.to(dev);
        Tensor res_out = Tensor::zeros({T, H}, kBf, dev);
        Tensor norm = Tensor::zeros({T, H}, kBf, dev);
        Tensor q = Tensor::zeros({T, H}, DType::kFloat8E4M3FN, dev);
        Tensor sc = pattern == 10 || pattern == 11 ? Tensor::zeros({T, 1}, kF32, dev)
                                                   : Tensor::zeros({T, words}, DType::kInt32, dev);
        const bool n = pattern == 1 || pattern == 4 || pattern == 9 || pattern == 11;
        const bool qz = pattern >= 2, s = pattern >= 8;
        Tensor ret = allreduce_fusion(
            x, ws, pattern, false, true, std::nullopt,
            pattern ? std::optional(res_out) : std::nullopt, n ? std::optional(norm) : std::nullopt,
            qz ? std::optional(q) : std::nullopt, s ? std::optional(sc) : std::nullopt,
            pattern ? std::optional(res) : std::nullopt, pattern ? std::optional(g) : std::nullopt,
            1e-6, pattern == 2 || pattern == 4 ? std::optional<Value>(Value(0.25)) : std::nullopt,
            std::nullopt, oneshot, fp32_acc, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
            std::nullopt, std::nullopt, std::nullopt,
            pattern == 8 || pattern == 9 ? std::optional<int64_t>(128) : std::nullopt);
        std::vector<std::vector<double>> o;
        for (const Tensor& t : {pattern == 0 ? ret : norm, res_out, q, sc}) {
          o.push_back(t.to(Device::cpu()).to(kF32).to_double_vector());
        }
        outs[r].push_back(std::move(o));
      }
    }
  });
  return outs;
}

// Every output bit for bit: the CPU reference sums the norm's squares in the kernel's block order
// (kernels::ar_square_sum), so inv, y, the codes and the scales agree too. (With a sequential
// CPU sum, inv differed in the last place for most tokens: a rare flip of a dtype-rounded y or
// code, but nearly every fp32 per-token scale of MNNVL two-shot, which scales the fp32 norm.)
// A difference names the first element, both values and the count, for the next GPU run.
void expect_gpu_matches_cpu(const std::string& backend, const std::vector<int64_t>& patterns,
                            uint64_t seed) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {37, 512}, {5, 1024}, {64, 256}, {3, 512}, {40, 768}};
  for (bool oneshot : {true, false}) {
    const ArOuts cpu = run_patterns(backend, oneshot, patterns, shapes, seed, Device::cpu());
    const ArOuts gpu = run_patterns(backend, oneshot, patterns, shapes, seed, Device::cuda(0));
    for (std::size_t r = 0; r < cpu.size(); ++r) {
      ASSERT_EQ(cpu[r].size(), gpu[r].size());
      for (std::size_t c = 0; c < cpu[r].size(); ++c) {
        for (int k : {0, 1, 2, 3}) {
          const std::vector<double>&want = cpu[r][c][k], &got = gpu[r][c][k];
          ASSERT_EQ(want.size(), got.size());
          int64_t diff = 0, first = -1;
          double worst = 0.0;
          for (std::size_t i = 0; i < want.size(); ++i) {
            if (want[i] == got[i] || (std::isnan(want[i]) && std::isnan(got[i]))) continue;
            if (diff++ == 0) first = static_cast<int64_t>(i);
            worst =
                std::max(worst, std::abs(got[i] - want[i]) / std::max(std::abs(want[i]), 1e-30));
          }
          EXPECT_EQ(diff, 0) << backend << (oneshot ? " one-shot" : " two-shot") << ", output " << k
                             << " (0 sum / norm_out, 1 residual_out, 2 quant_out, 3 "
                             << "scale_out), rank " << r << ", call " << c << ": " << diff << " of "
                             << want.size() << " differ, first at " << first << ": got "
                             << std::setprecision(9) << (first >= 0 ? got[first] : 0.0) << ", want "
                             << (first >= 0 ? want[first] : 0.0) << ", worst relative " << worst;
        }
      }
    }
  }
}

TEST(AllreduceFusionCuda, MatchesCpuOnOneGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  // Every implemented pattern but NVFP4 (sm100+), one-shot and two-shot, on one workspace a rank
  // (the kernel's per-block call counters and its two slots).
  expect_gpu_matches_cpu("trtllm",
                         {P::kAllReduce, P::kARResidualRMSNorm, P::kARResidualRMSNormFP8Quant,
                          P::kARResidualRMSNormOutFP8Quant, P::kARResidualRMSNormDynamicFP8Quant,
                          P::kARResidualRMSNormPerTokenGroupFP8PackedQuant,
                          P::kARResidualRMSNormOutPerTokenGroupFP8PackedQuant,
                          P::kARResidualRMSNormOutDynamicFP8Quant},
                         40);
}

// Beyond two ranks the rank sum has an order and, without fp32_acc, rounding points: the sums
// and residual_out at 4 and 8 ranks, with and without fp32 accumulation, bit for bit.
TEST(AllreduceFusionCuda, FourAndEightRanksSumInTheCpusOrder) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{37, 512}, {9, 1024}};
  for (int64_t W : {4, 8}) {
    for (bool fp32_acc : {true, false}) {
      for (bool oneshot : {true, false}) {
        const std::vector<int64_t> patterns = {P::kAllReduce, P::kARResidualRMSNorm};
        const ArOuts cpu =
            run_patterns("trtllm", oneshot, patterns, shapes, 70, Device::cpu(), W, fp32_acc);
        const ArOuts gpu =
            run_patterns("trtllm", oneshot, patterns, shapes, 70, Device::cuda(0), W, fp32_acc);
        for (std::size_t r = 0; r < cpu.size(); ++r) {
          ASSERT_EQ(cpu[r].size(), gpu[r].size());
          for (std::size_t c = 0; c < cpu[r].size(); ++c) {
            const std::size_t k = c < shapes.size() ? 0 : 1;  // the sum, then residual_out
            EXPECT_EQ(cpu[r][c][k], gpu[r][c][k])
                << "W " << W << ", fp32_acc " << fp32_acc << ", oneshot " << oneshot << ", rank "
                << r << ", call " << c;
          }
        }
      }
    }
  }
}

TEST(MnnvlAllreduceCuda, MatchesCpuOnOneGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int cc = api::compute_capability(Device::cuda(0));
  if (cc / 10 != 9 && cc / 10 != 10) {
    // Upstream's MNNVL module is built for SM 9.x / 10.x only: refused by name elsewhere.
    comm::ThreadGroup grp(2, Device::cuda(0));
    grp.run([&](int64_t r) {
      auto ws = create_allreduce_fusion_workspace("mnnvl", 2, r, 8, 64, kBf, std::nullopt,
                                                  grp.backend(r));
      expect_error(
          [&] {
            allreduce_fusion(Tensor::zeros({4, 64}, kBf, Device::cuda(0)), ws, 0);
          },
          "built for SM 9.x and 10.x only");
    });
    GTEST_SKIP() << "compute capability " << cc;
  }
  // The MNNVL arithmetic on the same kernel: its patterns but NVFP4, both strategies.
  expect_gpu_matches_cpu("mnnvl",
                         {P::kAllReduce, P::kARResidualRMSNorm, P::kARResidualRMSNormFP8Quant,
                          P::kARResidualRMSNormOutFP8Quant, P::kARResidualRMSNormDynamicFP8Quant,
                          P::kARResidualRMSNormOutDynamicFP8Quant},
                         50);
}

TEST(PcieIpcAllReduceCuda, MatchesCpuOnOneGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t W : {2, 4, 8}) {
    for (int64_t variant : {0, 1}) {
      if (W == 8 && variant == 1) continue;  // STAGED at 8 ranks needs blocks % 4
      auto run_on = [&](Device dev) {
        comm::ThreadGroup g(W, dev);
        std::vector<std::vector<double>> got(W);
        g.run([&](int64_t r) {
          PcieIpcAllReduceWorkspace ws(g.backend(r), 1 << 16);
          Tensor x = rand_tensor({3, 4096}, kBf, 70 + r).to(dev);
          Tensor out =
              ws.all_reduce(x, std::nullopt, Value::tuple({Value(4), Value(256), Value(variant)}));
          got[r] = out.to(Device::cpu()).to_double_vector();
          g.backend(r)->barrier();
        });
        return got;
      };
      const auto cpu = run_on(Device::cpu()), gpu = run_on(Device::cuda(0));
      for (int64_t r = 0; r < W; ++r) EXPECT_EQ(cpu[r], gpu[r]) << W << " ranks";
    }
  }
}

#if FLASHINFER_TEST_HAVE_CUDART
// The MoE patterns' inputs of one rank and the calls (6 then 7) writing the given outputs:
// {pattern 6's sum, residual_out, norm_out, pattern 7's residual_out, norm_out}.
struct MoeRankIn {
  Tensor act, sc, tok, in, esc, sh, res, gamma, idx;
};
constexpr int64_t kMoeE = 3, kMoeTk = 5, kMoeH = 256, kMoeRows = 9, kMoeK = 3;
const std::vector<double> kMoeIdx = {0, 3, -1, 6, 6, 2, -1, -1, -1, 8, 1, 4, 5, 7, 0};

MoeRankIn moe_rank_in(int64_t r, Device dev) {
  MoeRankIn x;
  x.act = rand_tensor({kMoeE, kMoeTk, kMoeH}, kBf, 900 + r, -2, 2).to(dev);
  x.sc = rand_tensor({kMoeE, kMoeTk}, kF32, 910 + r, 0, 1).to(dev);
  x.tok = rand_tensor({kMoeTk, kMoeH}, kBf, 920 + r, -1, 1).to(dev);
  x.in = rand_tensor({kMoeRows, kMoeH}, kBf, 930 + r, -2, 2).to(dev);
  x.esc = rand_tensor({kMoeTk, kMoeK}, kBf, 940 + r, 0, 1).to(dev);
  x.sh = rand_tensor({kMoeTk, kMoeH}, kBf, 950 + r, -1, 1).to(dev);
  x.res = rand_tensor({kMoeTk, kMoeH}, kBf, 960 + r, -1, 1).to(dev);
  x.gamma = rand_tensor({kMoeH}, kBf, 970, 0.5, 1.5).to(dev);
  x.idx = Tensor::from_vector(kMoeIdx, {kMoeTk, kMoeK}, DType::kInt32).to(dev);
  return x;
}

std::vector<Tensor> moe_outputs(Device dev) {
  std::vector<Tensor> o;
  for (int k = 0; k < 5; ++k) o.push_back(Tensor::zeros({kMoeTk, kMoeH}, kBf, dev));
  return o;
}

// (p6_residual_out false: pattern 6 without residual_out, its epilogue's scratch then the
// stream's; o[1] is left alone.)
void moe_calls(const MoeRankIn& x, const Tensor& idx,
               const std::shared_ptr<AllReduceFusionWorkspace>& ws, std::vector<Tensor>& o,
               bool p6_residual_out = true) {
  allreduce_fusion(x.tok, ws, P::kMoEReductionARResidualRMSNorm, false, true, o[0],
                   p6_residual_out ? std::optional<Tensor>(o[1]) : std::nullopt, o[2], std::nullopt,
                   std::nullopt, x.res, x.gamma, 1e-6, std::nullopt, std::nullopt, std::nullopt,
                   false, Value(kMoeE), x.sc, x.act, x.tok);
  allreduce_fusion(x.in, ws, P::kMoEFinalizeARResidualRMSNorm, false, true, std::nullopt, o[3],
                   o[4], std::nullopt, std::nullopt, x.res, x.gamma, 1e-6, std::nullopt,
                   std::nullopt, std::nullopt, false, std::nullopt, std::nullopt, std::nullopt,
                   std::nullopt, idx, x.esc, x.sh);
}

// Captures call() on `stream` (thread-local mode), launches the graph once and waits for it,
// throwing on a CUDA failure and ending the capture on every path: an ASSERT in a rank thread
// would return without aborting the group, and the peer's kernel would wait for this rank.
// `barrier` (the group's) runs before and after the launch: the graph's kernels wait for the
// peers' graphs, and a rank still instantiating its graph (which may allocate and synchronize
// the context the ranks share) while a peer's graph spins would deadlock; the library's eager
// calls meet the same way (core/comm_abort.h, gated_collective_launch), a graph launch is the
// caller's.
void capture_launch_or_throw(cudaStream_t stream, const std::function<void()>& call,
                             const std::function<void()>& barrier) {
  auto ok = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  };
  ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  cudaGraph_t graph = nullptr;
  try {
    call();
  } catch (...) {
    (void)cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  ok(made, "cudaGraphInstantiate");
  try {
    barrier();
  } catch (...) {
    cudaGraphExecDestroy(exec);
    throw;
  }
  cudaError_t ran = cudaGraphLaunch(exec, stream);
  if (ran != cudaSuccess) {
    cudaGraphExecDestroy(exec);
    ok(ran, "cudaGraphLaunch");
  }
  barrier();  // no rank's graph waits for a peer's that is not enqueued yet
  ran = cudaStreamSynchronize(stream);
  cudaGraphExecDestroy(exec);
  ok(ran, "cudaGraphLaunch");
}

std::vector<std::vector<double>> moe_host(const std::vector<Tensor>& o) {
  std::vector<std::vector<double>> h;
  for (const Tensor& t : o) h.push_back(t.to(Device::cpu()).to_double_vector());
  return h;
}

// Patterns 6 and 7 on CUDA, every rank a thread on one GPU: eager against the CPU (the sum and
// residual_out bit for bit, the norm up to its sum-of-squares order), then the same calls
// captured into a CUDA graph on each rank's stream give the eager bits (the local values live in
// the stream's scratch, and pattern 7's indices are not read back while capturing). A captured
// index outside input gives its token NaN on every rank and leaves the other tokens' bits (that
// capture runs pattern 6 without residual_out: its epilogue's scratch from the stream's too).
TEST(AllreduceMoeCuda, MatchesCpuAndCapturesIntoAGraph) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t W = 2;
  const Device gpu = Device::cuda(0);
  std::vector<std::vector<std::vector<double>>> cpu(W), eager(W), graphed(W), bad(W);
  with_group(W, 8, kMoeH, kBf, [&](int64_t r, auto ws) {
    const MoeRankIn x = moe_rank_in(r, Device::cpu());
    std::vector<Tensor> o = moe_outputs(Device::cpu());
    moe_calls(x, x.idx, ws, o);
    cpu[r] = moe_host(o);
  });
  comm::ThreadGroup grp(W, gpu);
  grp.run([&](int64_t r) {
    auto ws = create_allreduce_fusion_workspace("trtllm", W, r, 8, kMoeH, kBf, std::nullopt,
                                                grp.backend(r));
    auto barrier = [&] { grp.backend(r)->barrier(); };
    {
      const MoeRankIn x = moe_rank_in(r, gpu);
      std::vector<double> bad_v = kMoeIdx;
      bad_v[1 * kMoeK] = kMoeRows;  // token 1, first slot: one row past input
      const Tensor bad_idx = Tensor::from_vector(bad_v, {kMoeTk, kMoeK}, DType::kInt32).to(gpu);
      auto stream = static_cast<cudaStream_t>(current_cuda_stream());
      std::vector<Tensor> e = moe_outputs(gpu), g = moe_outputs(gpu), b = moe_outputs(gpu);
      moe_calls(x, x.idx, ws, e);  // also grows the stream's scratch before the captures
      if (cudaStreamSynchronize(stream) != cudaSuccess) throw std::runtime_error("eager calls");
      capture_launch_or_throw(
          stream, [&] { moe_calls(x, x.idx, ws, g); }, barrier);
      capture_launch_or_throw(
          stream, [&] { moe_calls(x, bad_idx, ws, b, false); }, barrier);
      eager[r] = moe_host(e);
      graphed[r] = moe_host(g);
      bad[r] = moe_host(b);
    }
  });
  for (int64_t r = 0; r < W; ++r) {
    for (int k : {0, 1, 3}) EXPECT_EQ(cpu[r][k], eager[r][k]) << "output " << k << ", rank " << r;
    for (int k : {2, 4}) {
      for (std::size_t i = 0; i < cpu[r][k].size(); ++i) {
        ASSERT_NEAR(cpu[r][k][i], eager[r][k][i], 8e-3 * std::max(1.0, std::abs(cpu[r][k][i])))
            << "norm_out " << k << ", rank " << r << ", element " << i;
      }
    }
    for (int k = 0; k < 5; ++k) EXPECT_EQ(eager[r][k], graphed[r][k]) << "output " << k;
    for (int k : {0, 2}) EXPECT_EQ(eager[r][k], bad[r][k]) << "pattern 6, output " << k;
    for (double v : bad[r][1]) ASSERT_EQ(v, 0.0);  // no residual_out given: not written
    for (int k : {3, 4}) {
      for (int64_t i = 0; i < kMoeTk * kMoeH; ++i) {
        if (i / kMoeH == 1) {
          ASSERT_TRUE(std::isnan(bad[r][k][i])) << "output " << k << ", element " << i;
        } else {
          ASSERT_EQ(bad[r][k][i], eager[r][k][i]) << "output " << k << ", element " << i;
        }
      }
    }
  }
}
#endif

TEST(DecodeCpA2aCuda, TransposesOnOneGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  dcp_exchange(4, 16, 2, Device::cuda(0), 3);
  dcp_exchange(2, 512, 2, Device::cuda(0), 2);
}

}  // namespace
}  // namespace flashinfer::testing
