// run_mixed_comm and MixedCommHandler (flashinfer.comm.mixed_comm): ParallelInfo's formulas,
// upstream's valid lists and checks, every op's layout on integers at 2, 4 and 8 ranks in every
// split and mode, the sums' orders and the -0 pair rule worked out by hand, buffers that grow,
// checkpoints, replay of every rank's calls, and the CUDA kernels against the CPU bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "ops/comm_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

using testing::expect_error;
using testing::record_dump;
using Op = MixedCommOp;
using Mode = MixedCommMode;
constexpr DType kBf = DType::kBFloat16;
constexpr DType kF16 = DType::kFloat16;
constexpr DType kF32 = DType::kFloat32;

// A handler a rank on one node of L ranks, split ltp x (L / ltp).
std::shared_ptr<MixedCommHandler> handler(comm::ThreadGroup& g, int64_t r, int64_t ltp,
                                          DType dt = kBf, bool use_autotune = true) {
  const int64_t L = g.backend(r)->Get_size();
  return std::make_shared<MixedCommHandler>(
      r, L, r, L, 0, 1, ltp, std::nullopt, std::nullopt, std::nullopt, dt, g.backend(r)->device(),
      std::nullopt, std::nullopt, 256, 4, true, true, use_autotune, g.backend(r));
}

// Every rank's run_mixed_comm(op, ..., mode) of ins[r]; outputs by rank.
std::vector<Tensor> run_all(int64_t L, int64_t ltp, Op op, std::optional<Mode> mode,
                            const std::vector<Tensor>& ins, DType dt = kBf,
                            Device dev = Device::cpu()) {
  comm::ThreadGroup g(L, dev);
  std::vector<Tensor> outs(static_cast<std::size_t>(L));
  g.run([&](int64_t r) {
    auto h = handler(g, r, ltp, dt);
    outs[r] = run_mixed_comm(op, h, ins[r].to(dev), std::nullopt, mode).to(Device::cpu());
  });
  return outs;
}

Tensor filled(int64_t rows, int64_t cols, const std::function<double(int64_t)>& f, DType dt = kBf) {
  std::vector<double> v(static_cast<std::size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) v[i] = f(i);
  return Tensor::from_vector(v, {rows, cols}, dt);
}

TEST(ParallelInfo, UpstreamsFormulas) {
  // Node 1 of 2, local rank 3 of 4, local 2 x 2, inter all TP.
  ParallelInfo p(7, 8, 3, 4, 1, 2, 2, std::nullopt, std::nullopt, std::nullopt);
  EXPECT_EQ(p.local_tp_size, 2);
  EXPECT_EQ(p.local_dp_size, 2);
  EXPECT_EQ(p.inter_tp_size, 2);
  EXPECT_EQ(p.inter_dp_size, 1);
  EXPECT_EQ(p.local_tp_rank(), 1);
  EXPECT_EQ(p.local_dp_rank(), 1);
  EXPECT_EQ(p.inter_tp_rank(), 1);
  EXPECT_EQ(p.tp_rank(), 1 + 1 * 2);
  EXPECT_EQ(p.tp_size(), 4);
  EXPECT_EQ(p.dp_rank(), 1);
  EXPECT_EQ(p.dp_size(), 2);
  EXPECT_TRUE(p.use_mixed());
  // Neither split: all TP; dp given: tp derived.
  ParallelInfo q(1, 4, 1, 4, 0, 1, std::nullopt, 4, std::nullopt, std::nullopt);
  EXPECT_EQ(q.local_tp_size, 1);
  EXPECT_FALSE(q.use_tp());
  EXPECT_TRUE(q.use_dp());
  expect_error([] { ParallelInfo(2, 8, 3, 4, 1, 2, 2, 2, 2, 1); }, "world_rank 2 must be");
  expect_error([] { ParallelInfo(0, 4, 0, 4, 0, 1, 3, std::nullopt, std::nullopt, std::nullopt); },
               "local_tp_size 3 must divide 4");
  expect_error([] { ParallelInfo(0, 4, 0, 4, 0, 1, 2, 4, std::nullopt, std::nullopt); },
               "local_tp_size x local_dp_size (2 x 4) must be 4");
}

TEST(MixedComm, ValidListsFollowTheSplitAsUpstreams) {
  comm::ThreadGroup g(4);
  g.run([&](int64_t r) {
    auto mixed = handler(g, r, 2);
    EXPECT_EQ(mixed->get_valid_op_list(),
              (std::vector<Op>{Op::ALLREDUCE_ALLGATHER, Op::REDUCESCATTER_ALLREDUCE}));
    EXPECT_EQ(mixed->get_valid_mode_list(),
              (std::vector<Mode>{Mode::FUSED_OPT_WAITS_MC, Mode::FUSED_OPT_WAITS_UC,
                                 Mode::FUSED_OPT_BYTES1_MC, Mode::FUSED_OPT_BYTES1_UC,
                                 Mode::NCCL_ONE, Mode::NCCL_TP_DP, Mode::AUTOTUNE}));
    auto tp = handler(g, r, 4);
    EXPECT_EQ(tp->get_valid_op_list(), (std::vector<Op>{Op::ALLREDUCE}));
    EXPECT_EQ(tp->get_valid_mode_list(),
              (std::vector<Mode>{Mode::FUSED_OPT_WAITS_MC, Mode::FUSED_OPT_WAITS_UC,
                                 Mode::FUSED_OPT_BYTES1_MC, Mode::FUSED_OPT_BYTES1_UC,
                                 Mode::NCCL_ONE, Mode::AUTOTUNE}));
    auto dp = handler(g, r, 1, kBf, false);
    EXPECT_EQ(dp->get_valid_op_list(), (std::vector<Op>{Op::ALLGATHER, Op::REDUCESCATTER}));
    EXPECT_EQ(
        dp->get_valid_mode_list(),
        (std::vector<Mode>{Mode::FUSED_OPT_WAITS_MC, Mode::FUSED_OPT_WAITS_UC, Mode::NCCL_ONE}));
    EXPECT_NE(mixed->repr().find("rank=" + std::to_string(r) + ", size=4, group="),
              std::string::npos);
    EXPECT_NE(mixed->repr().find("local_tp_size=2, local_dp_size=2, dtype=torch.bfloat16"),
              std::string::npos);
  });
  // Refused at construction (before any collective), as upstream's asserts and C++ refuse.
  comm::ThreadGroup one(1);
  auto b = one.backend(0);
  auto make = [&](int64_t L, std::optional<int64_t> ltp, DType dt, int64_t inter_size = 1,
                  int64_t min_block = 256, std::optional<int64_t> max_block = std::nullopt) {
    MixedCommHandler(0, L * inter_size, 0, L, 0, inter_size, ltp, std::nullopt, std::nullopt,
                     std::nullopt, dt, Device::cpu(), std::nullopt, max_block, min_block, 4, true,
                     true, true, b);
  };
  expect_error([&] { make(1, std::nullopt, kBf); }, "local_size must be > 1");
  expect_error([&] { make(2, std::nullopt, DType::kFloat32); },
               "only torch.float16 and torch.bfloat16");
  expect_error([&] { make(6, 3, kBf); },
               "invalid combination of local_tp_size=3 and "
               "local_dp_size=2");
  expect_error([&] { make(2, std::nullopt, kBf, 2); }, "nvshmem");
  expect_error([&] { make(2, std::nullopt, kBf, 1, 100); }, "min_block_size must be a multiple");
  expect_error([&] { make(2, std::nullopt, kBf, 1, 256, 128); }, "is below min_block_size");
  expect_error([&] { make(2, std::nullopt, kBf); }, "is not world_rank/world_size 0/2");
}

// Every op on integers (exact in any order) at 2, 4 and 8 ranks in every split and valid mode:
// which rank's block lands where.
TEST(MixedComm, EveryOpsLayoutOnIntegers) {
  for (int64_t L : {2, 4, 8}) {
    for (int64_t ltp = 1; ltp <= L; ltp *= 2) {
      const int64_t ldp = L / ltp;
      const int64_t rows = 2 * ldp, cols = 8;
      std::vector<Tensor> in;
      for (int64_t r = 0; r < L; ++r) {
        in.push_back(filled(rows, cols, [&](int64_t i) { return (i * 3 + r * 5) % 17 - 8.0; }));
      }
      auto v = [&](int64_t r, int64_t e) { return (e * 3 + r * 5) % 17 - 8.0; };
      std::vector<Op> ops;
      if (ltp > 1 && ldp > 1) ops = {Op::ALLREDUCE_ALLGATHER, Op::REDUCESCATTER_ALLREDUCE};
      if (ldp == 1) ops = {Op::ALLREDUCE};
      if (ltp == 1) ops = {Op::ALLGATHER, Op::REDUCESCATTER};
      std::vector<Mode> modes = {Mode::FUSED_OPT_WAITS_MC, Mode::FUSED_OPT_WAITS_UC, Mode::NCCL_ONE,
                                 Mode::AUTOTUNE};
      if (ltp > 1)
        modes.insert(modes.end(), {Mode::FUSED_OPT_BYTES1_MC, Mode::FUSED_OPT_BYTES1_UC});
      if (ltp > 1 && ldp > 1) modes.push_back(Mode::NCCL_TP_DP);
      for (Op op : ops) {
        for (Mode mode : modes) {
          const std::vector<Tensor> out = run_all(L, ltp, op, mode, in);
          const int64_t n = rows * cols;
          for (int64_t r = 0; r < L; ++r) {
            const int64_t d = r / ltp;
            const auto got = out[r].to_double_vector();
            std::vector<double> want;
            if (op == Op::ALLREDUCE) {
              for (int64_t e = 0; e < n; ++e) {
                double s = 0;
                for (int64_t q = 0; q < L; ++q) s += v(q, e);
                want.push_back(s);
              }
            } else if (op == Op::ALLGATHER || op == Op::ALLREDUCE_ALLGATHER) {
              for (int64_t k = 0; k < ldp; ++k) {
                for (int64_t e = 0; e < n; ++e) {
                  double s = 0;
                  for (int64_t t = 0; t < ltp; ++t) s += v(t + k * ltp, e);
                  want.push_back(s);
                }
              }
            } else {  // the reduce-scatters: block d of every rank
              const int64_t m = n / ldp;
              for (int64_t e = d * m; e < (d + 1) * m; ++e) {
                double s = 0;
                for (int64_t q = 0; q < L; ++q) s += v(q, e);
                want.push_back(s);
              }
            }
            ASSERT_EQ(got, want) << L << " ranks, ltp " << ltp << ", " << mixed_comm_op_name(op)
                                 << ", " << mixed_comm_mode_name(mode) << ", rank " << r;
            EXPECT_EQ(out[r].size(0), static_cast<int64_t>(want.size()) / cols);
          }
        }
      }
    }
  }
}

// Every rank's input holds v[r] everywhere: 2^24, 1, -2^24, 1. Sums in fp32 lose a 1 next to
// 2^24 (a tie, to even) but not next to -2^24 + 1, so the order shows in the result.
std::vector<Tensor> order_inputs(int64_t rows, int64_t cols) {
  const double v[4] = {16777216.0, 1.0, -16777216.0, 1.0};
  std::vector<Tensor> in;
  for (int r = 0; r < 4; ++r) in.push_back(Tensor::full({rows, cols}, v[r], kBf));
  return in;
}

double first(const Tensor& t) { return t.to_double_vector().at(0); }

// A 16-bit tensor's bit patterns (-0 and +0 differ).
std::vector<uint16_t> bits16(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  std::vector<uint16_t> b(static_cast<std::size_t>(c.numel()));
  if (!b.empty()) std::memcpy(b.data(), c.data_ptr(), b.size() * 2);
  return b;
}

TEST(MixedComm, SumOrdersWorkedOutByHand) {
  const std::vector<Tensor> in = order_inputs(4, 8);
  // Reduce-scatter over 4 DP ranks. In rank order: ((2^24 + 1) - 2^24) + 1 = 1 everywhere.
  // WAITS_UC: the own block first, then the others descending: rank 0: 2^24, +1 (r3) lost,
  // -2^24, +1 (r1) = 1; rank 1: 1 + 2^24 = 2^24, +1 (r3) lost, -2^24 = 0; rank 2: -2^24 + 1
  // (r1), +2^24 (r0) = 1, +1 (r3) = 2; rank 3: 1 - 2^24 (r2), +1 (r1), +2^24 (r0) = 2.
  for (Mode m : {Mode::FUSED_OPT_WAITS_MC, Mode::NCCL_ONE}) {
    const auto out = run_all(4, 1, Op::REDUCESCATTER, m, in);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(first(out[r]), 1.0) << mixed_comm_mode_name(m) << r;
  }
  const double uc[4] = {1.0, 0.0, 2.0, 2.0};
  const auto out_uc = run_all(4, 1, Op::REDUCESCATTER, Mode::FUSED_OPT_WAITS_UC, in);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(first(out_uc[r]), uc[r]) << r;
  // Reduce-scatter + all-reduce, 2 TP x 2 DP (rank = t + 2 d). WAITS: DP groups descending from
  // d - 1, ending with its own, TP ascending: d = 0 sums r2, r3, r0, r1: -2^24 + 1 + 2^24 + 1 =
  // 2; d = 1 sums r0..r3 in order: 1. NCCL_ONE: rank order, 1. NCCL_TP_DP: each TP rank's DP
  // pair rounded first (r0 + r2 = 0, r1 + r3 = 2), then 0 + 2 = 2.
  const auto waits = run_all(4, 2, Op::REDUCESCATTER_ALLREDUCE, Mode::FUSED_OPT_WAITS_MC, in);
  const auto nccl = run_all(4, 2, Op::REDUCESCATTER_ALLREDUCE, Mode::NCCL_ONE, in);
  const auto tpdp = run_all(4, 2, Op::REDUCESCATTER_ALLREDUCE, Mode::NCCL_TP_DP, in);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(first(waits[r]), r / 2 == 0 ? 2.0 : 1.0) << r;
    EXPECT_EQ(first(nccl[r]), 1.0) << r;
    EXPECT_EQ(first(tpdp[r]), 2.0) << r;
  }
  // All-reduce over 4 TP ranks: rank order whatever the mode, 1; every rank the same bits.
  for (Mode m : {Mode::FUSED_OPT_WAITS_UC, Mode::FUSED_OPT_BYTES1_MC, Mode::NCCL_ONE}) {
    const auto ar = run_all(4, 4, Op::ALLREDUCE, m, in);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(first(ar[r]), 1.0);
  }
  // One rounding to the dtype at the end: 1 + 3 * 2^-9 in fp32 rounds to the bf16 1 + 2^-7
  // (partial sums rounded to bf16 would stay 1: 1 + 2^-9 is below half of bf16's 2^-7 step).
  std::vector<Tensor> small;
  for (int r = 0; r < 4; ++r) {
    small.push_back(Tensor::full({2, 8}, r == 0 ? 1.0 : std::ldexp(1.0, -9), kBf));
  }
  for (Mode m : {Mode::FUSED_OPT_WAITS_MC, Mode::FUSED_OPT_BYTES1_UC, Mode::NCCL_ONE}) {
    const auto ar = run_all(4, 4, Op::ALLREDUCE, m, small);
    EXPECT_EQ(first(ar[3]), 1.0 + std::ldexp(1.0, -7)) << mixed_comm_mode_name(m);
  }
}

// Aligned pairs of -0 (upstream's "not yet written" word) arrive as +0 through the fused
// modes' buffers; a -0 beside a non-zero stays; the NCCL modes keep both.
TEST(MixedComm, MinusZeroPairsAsUpstreamsBuffersPassThem) {
  auto make = [](int64_t r) {
    // Elements 0, 1: -0, -0 (a pair); 2: -0 beside 3: 1; 4, 5: -0 only on rank 0.
    return filled(1, 8, [r](int64_t i) {
      if (i <= 2) return -0.0;
      if (i == 3) return 1.0;
      if (i == 4 || i == 5) return r == 0 ? -0.0 : 0.0;
      return 2.0;
    });
  };
  const std::vector<Tensor> in = {make(0), make(1)};
  auto sign = [](const Tensor& t, int64_t i) { return std::signbit(t.to_double_vector()[i]); };
  // All-gather (DP only): fused modes turn the pair into +0, keep element 2's -0.
  const auto ag = run_all(2, 1, Op::ALLGATHER, Mode::FUSED_OPT_WAITS_UC, in);
  EXPECT_FALSE(sign(ag[0], 0));
  EXPECT_FALSE(sign(ag[0], 1));
  EXPECT_TRUE(sign(ag[0], 2));
  EXPECT_FALSE(sign(ag[1], 4));  // rank 0's (-0, -0) at 4, 5 gathered as +0
  EXPECT_FALSE(sign(ag[1], 5));
  const auto ag_nccl = run_all(2, 1, Op::ALLGATHER, Mode::NCCL_ONE, in);
  EXPECT_TRUE(sign(ag_nccl[1], 0));
  EXPECT_TRUE(sign(ag_nccl[1], 1));
  // All-reduce (TP only): WAITS reads every term through the buffers: (+0) + (+0) = +0 for the
  // pair, -0 + -0 = -0 for element 2. BYTES1_MC sums the raw inputs (-0 + -0 = -0 for the pair)
  // and its result passes a buffer once more: the -0 pair becomes +0 there. NCCL keeps -0.
  const auto waits = run_all(2, 2, Op::ALLREDUCE, Mode::FUSED_OPT_WAITS_MC, in);
  EXPECT_FALSE(sign(waits[0], 0));
  EXPECT_TRUE(sign(waits[0], 2));
  const auto bytes = run_all(2, 2, Op::ALLREDUCE, Mode::FUSED_OPT_BYTES1_MC, in);
  EXPECT_FALSE(sign(bytes[1], 0));
  EXPECT_FALSE(sign(bytes[1], 1));
  EXPECT_TRUE(sign(bytes[1], 2));
  const auto nccl = run_all(2, 2, Op::ALLREDUCE, Mode::NCCL_ONE, in);
  EXPECT_TRUE(sign(nccl[0], 0));
  EXPECT_TRUE(sign(nccl[0], 1));
  // Reduce-scatter over 2 DP ranks, rank 0's block (elements 0-7). WAITS_UC takes its own term
  // as given and the peer's through the buffer: element 0 (own (-0, -0) pair, the peer's -0
  // beside 1) stays -0 + -0 = -0; element 2 (own -0 beside 1, the peer's (-0, -0) pair) is
  // -0 + (+0) = +0. WAITS_MC sums both as given: -0 at both.
  auto rs_in = [](int64_t r) {
    return filled(2, 8, [r](int64_t i) {
      if (i == 0) return -0.0;
      if (i == 1) return r == 0 ? -0.0 : 1.0;
      if (i == 2) return -0.0;
      if (i == 3) return r == 0 ? 1.0 : -0.0;
      return 3.0;
    });
  };
  const std::vector<Tensor> rs = {rs_in(0), rs_in(1)};
  const auto uc = run_all(2, 1, Op::REDUCESCATTER, Mode::FUSED_OPT_WAITS_UC, rs);
  EXPECT_TRUE(sign(uc[0], 0));
  EXPECT_FALSE(sign(uc[0], 2));
  const auto mc = run_all(2, 1, Op::REDUCESCATTER, Mode::FUSED_OPT_WAITS_MC, rs);
  EXPECT_TRUE(sign(mc[0], 0));
  EXPECT_TRUE(sign(mc[0], 2));
  // BYTES1_UC all-reduce reads every term through the buffers (the chunk owner's own term, as
  // given upstream, depends on the GPU's partition), then passes the result once more: rank 0's
  // lone -0 at 2 with rank 1's -0 at 2 sums to -0, kept (its partner is 1 + 1 = 2).
  const auto b1 = run_all(2, 2, Op::ALLREDUCE, Mode::FUSED_OPT_BYTES1_UC, in);
  EXPECT_FALSE(sign(b1[0], 0));
  EXPECT_TRUE(sign(b1[0], 2));
}

// A sum that is NaN (inf + -inf, or a negative NaN among the terms) is the positive canonical
// NaN, as upstream's device adds give it: bf16 0x7FC0 here, whatever the host's add gave
// (x86's inf + -inf is -NaN). Terms that are not summed keep their bits (the all-gather).
TEST(MixedComm, NanSumsAreThePositiveCanonicalNan) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Element 0: +inf and -inf; element 1: -NaN and 1; the rest finite.
  std::vector<Tensor> in = {filled(2, 8, [&](int64_t i) { return i == 0 ? inf : 1.0; }),
                            filled(2, 8, [&](int64_t i) {
                              return i == 0 ? -inf : i == 1 ? -nan : 2.0;
                            })};
  auto bits = [](const Tensor& t, int64_t i) {
    return static_cast<const uint16_t*>(t.contiguous().data_ptr())[i];
  };
  for (Mode m : {Mode::FUSED_OPT_WAITS_UC, Mode::NCCL_ONE}) {
    const auto out = run_all(2, 2, Op::ALLREDUCE, m, in);
    for (const Tensor& o : out) {
      EXPECT_EQ(bits(o, 0), 0x7FC0) << static_cast<int>(m);
      EXPECT_EQ(bits(o, 1), 0x7FC0) << static_cast<int>(m);
      EXPECT_EQ(o.to_double_vector()[2], 3.0);
    }
  }
}

TEST(MixedComm, RefusesWhatUpstreamRefusesInItsOrder) {
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) {
    auto h = handler(g, r, 1, kBf, false);  // DP only
    const Tensor x = Tensor::zeros({4, 8}, kBf);
    expect_error([&] { run_mixed_comm(Op::ALLREDUCE, h, x); }, "Invalid op: ALLREDUCE");
    // Two faults at once: upstream's first check names the call's.
    expect_error(
        [&] {
          run_mixed_comm(Op::ALLREDUCE, h, Tensor::zeros({8}, kF16), std::nullopt, Mode::AUTOTUNE);
        },
        "Invalid op: ALLREDUCE");
    expect_error(
        [&] {
          run_mixed_comm(Op::REDUCESCATTER, h, Tensor::zeros({3, 8}, kF16));
        },
        "x_in.dtype should be torch.bfloat16");
    expect_error(
        [&] {
          run_mixed_comm(Op::ALLGATHER, h, x, Tensor::zeros({8, 4}, kF16));
        },
        "x_out.dtype should be equal to x_in.dtype");
    expect_error([&] { run_mixed_comm(Op::ALLGATHER, h, x, std::nullopt, Mode::AUTOTUNE); },
                 "Invalid mode: AUTOTUNE");
    expect_error(
        [&] { run_mixed_comm(Op::ALLGATHER, h, x, std::nullopt, Mode::FUSED_OPT_BYTES1_MC); },
        "Invalid mode: FUSED_OPT_BYTES1_MC");
    expect_error([&] { run_mixed_comm(Op::ALLGATHER, h, Tensor::zeros({8}, kBf)); },
                 "x_in.ndim should be at least 2");
    expect_error(
        [&] {
          run_mixed_comm(Op::ALLGATHER, h, Tensor::zeros({4, 8}, kF16));
        },
        "x_in.dtype should be torch.bfloat16");
    expect_error(
        [&] {
          run_mixed_comm(Op::REDUCESCATTER, h, Tensor::zeros({3, 8}, kBf));
        },
        "x_in.shape[0] should be divisible by dp_size");
    expect_error([&] { run_mixed_comm(Op::ALLGATHER, h, x, Tensor::zeros({8 * 8}, kBf)); },
                 "x_out.ndim should be equal to x_in.ndim");
    expect_error(
        [&] {
          run_mixed_comm(Op::ALLGATHER, h, x, Tensor::zeros({8, 8}, kF16));
        },
        "x_out.dtype should be equal to x_in.dtype");
    expect_error(
        [&] {
          run_mixed_comm(Op::ALLGATHER, h, x, Tensor::zeros({8, 4}, kBf));
        },
        "x_out.shape[1:] should be equal to x_in.shape[1:]");
    expect_error(
        [&] {
          run_mixed_comm(Op::ALLGATHER, h, x, Tensor::zeros({4, 8}, kBf));
        },
        "x_out.shape[0] should be equal to x_in.shape[0] * dp_size");
    expect_error(
        [&] {
          run_mixed_comm(Op::REDUCESCATTER, h, x, Tensor::zeros({4, 8}, kBf));
        },
        "x_out.shape[0] * dp_size should be equal to x_in.shape[0]");
    // The fused kernels' own checks; the NCCL mode takes what they refuse.
    const Tensor strided = Tensor::zeros({8, 4}, kBf).transpose(0, 1);
    expect_error(
        [&] { run_mixed_comm(Op::ALLGATHER, h, strided, std::nullopt, Mode::FUSED_OPT_WAITS_UC); },
        "x_in must be contiguous");
    expect_error(
        [&] {
          run_mixed_comm(Op::ALLGATHER, h, Tensor::zeros({3, 2}, kBf), std::nullopt,
                         Mode::FUSED_OPT_WAITS_UC);
        },
        "num_elems_all must be divisible by 8");
    expect_error(
        [&] {
          run_mixed_comm(Op::ALLGATHER, h, Tensor::zeros({0, 8}, kBf), std::nullopt,
                         Mode::FUSED_OPT_WAITS_UC);
        },
        "empty tensors are refused");
    const Tensor odd = filled(3, 2, [r](int64_t i) { return static_cast<double>(i + 10 * r); });
    const auto got =
        run_mixed_comm(Op::ALLGATHER, h, odd.transpose(0, 1).contiguous().transpose(0, 1),
                       std::nullopt, Mode::NCCL_ONE)
            .to_double_vector();
    ASSERT_EQ(got.size(), 12u);
    EXPECT_EQ(got[6], 10.0);  // rank 1's block after rank 0's
    // Ranks that disagree are refused on every rank alike (no hang).
    expect_error(
        [&] {
          run_mixed_comm(Op::ALLGATHER, h, Tensor::zeros({r == 0 ? 2 : 4, 8}, kBf), std::nullopt,
                         Mode::NCCL_ONE);
        },
        "every rank must call run_mixed_comm with the same op, mode and sizes");
  });
}

TEST(MixedComm, ModeNoneResolvesAsUpstreams) {
  // With use_autotune: AUTOTUNE, here WAITS_UC (the reduce-scatter's own-block-first order, hand
  // values of SumOrdersWorkedOutByHand); without: NCCL_TP_DP where valid, else NCCL_ONE.
  const std::vector<Tensor> in = order_inputs(4, 8);
  auto run_none = [&](int64_t ltp, Op op, bool use_autotune) {
    comm::ThreadGroup g(4);
    std::vector<double> got(4);
    g.run([&](int64_t r) {
      auto h = handler(g, r, ltp, kBf, use_autotune);
      got[r] = first(run_mixed_comm(op, h, in[r]));
    });
    return got;
  };
  EXPECT_EQ(run_none(1, Op::REDUCESCATTER, true), (std::vector<double>{1, 0, 2, 2}));
  EXPECT_EQ(run_none(1, Op::REDUCESCATTER, false), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(run_none(2, Op::REDUCESCATTER_ALLREDUCE, false), (std::vector<double>{2, 2, 2, 2}));
  EXPECT_EQ(run_none(2, Op::REDUCESCATTER_ALLREDUCE, true), (std::vector<double>{2, 2, 1, 1}));
}

// A refusal on one rank only is every rank's refusal (no rank is left waiting for it).
TEST(MixedComm, OneRanksRefusalReachesEveryRank) {
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) {
    auto h = handler(g, r, 2);
    const Tensor x = r == 0 ? Tensor::zeros({2, 8}, kBf) : Tensor::zeros({2, 3}, kBf);
    expect_error(
        [&] { run_mixed_comm(Op::ALLREDUCE, h, x, std::nullopt, Mode::FUSED_OPT_WAITS_UC); },
        r == 0 ? "rank 1 refused the call: " : "num_elems_all must be divisible by 8");
    // The handler still works after it.
    EXPECT_EQ(run_mixed_comm(Op::ALLREDUCE, h, Tensor::full({2, 8}, 1.0, kBf)).to_double_vector(),
              std::vector<double>(16, 2.0));
  });
}

TEST(MixedComm, BuffersGrowForALargerCall) {
  // 64 KiB slots at first; a 1 MiB input comes after a small one, then a small one again.
  for (int64_t rows : {4, 512, 4}) {
    std::vector<Tensor> in;
    for (int64_t r = 0; r < 2; ++r) {
      in.push_back(filled(rows, 1024, [r](int64_t i) { return static_cast<double>(i % 13 + r); }));
    }
    comm::ThreadGroup g(2);
    std::vector<Tensor> out(2);
    g.run([&](int64_t r) {
      auto h = handler(g, r, 2);
      out[r] = run_mixed_comm(Op::ALLREDUCE, h, in[r], std::nullopt, Mode::FUSED_OPT_WAITS_UC);
      out[r] = run_mixed_comm(Op::ALLREDUCE, h, filled(2048, 1024, [](int64_t) { return 1.0; }),
                              std::nullopt, Mode::FUSED_OPT_WAITS_UC);
      out[r] = run_mixed_comm(Op::ALLREDUCE, h, in[r], std::nullopt, Mode::FUSED_OPT_WAITS_UC);
    });
    const auto got = out[1].to_double_vector();
    for (int64_t i = 0; i < rows * 1024; ++i) ASSERT_EQ(got[i], 2.0 * (i % 13) + 1.0) << i;
  }
}

TEST(MixedComm, CheckpointsAndReplayOfEveryRanksCalls) {
  namespace fs = std::filesystem;
  const std::vector<Tensor> in = order_inputs(4, 8);
  comm::ThreadGroup g(4);
  std::vector<Tensor> first_out(4), after(4);
  const fs::path dir = record_dump("mixed_comm", [&] {
    g.run([&](int64_t r) {
      auto h = handler(g, r, 2);
      first_out[r] = run_mixed_comm(Op::REDUCESCATTER_ALLREDUCE, h, in[r]);  // AUTOTUNE
      run_mixed_comm(Op::ALLREDUCE_ALLGATHER, h, in[r], std::nullopt, Mode::NCCL_TP_DP);
      h->checkpoint_prepare();
      h->checkpoint_prepare();  // a no-op
      // Detached, the NCCL modes still run (upstream's process groups outlive the buffers).
      run_mixed_comm(Op::REDUCESCATTER_ALLREDUCE, h, in[r], std::nullopt, Mode::NCCL_ONE);
      h->checkpoint_restore(g.backend(r));
      h->checkpoint_restore(g.backend(r));  // a no-op
      after[r] = run_mixed_comm(Op::REDUCESCATTER_ALLREDUCE, h, in[r], std::nullopt,
                                Mode::FUSED_OPT_WAITS_UC);
      h->shutdown();
      expect_error([&] { h->shutdown(); }, "Should not call shutdown() more than once.");
    });
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(first(first_out[r]), r / 2 == 0 ? 2.0 : 1.0);  // AUTOTUNE: the WAITS order
    EXPECT_EQ(first(after[r]), first(first_out[r]));
  }
  // Detached, the fused modes are refused (upstream's would fault); a backend of another size
  // cannot restore a handler.
  comm::ThreadGroup two(2), four(4);
  four.run([&](int64_t r) {
    auto h = handler(four, r, 2);
    h->checkpoint_prepare();
    expect_error(
        [&] {
          run_mixed_comm(Op::REDUCESCATTER_ALLREDUCE, h, in[r], std::nullopt,
                         Mode::FUSED_OPT_WAITS_MC);
        },
        "the handler is detached");
    if (r < 2) {
      expect_error([&] { h->checkpoint_restore(two.backend(r)); },
                   "MixedComm checkpoint backend size does not match local size");
    }
    h->checkpoint_restore(four.backend(r));
  });
  // Replayed: every rank's calls with every other rank's (restore after its prepare).
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  // Per rank: two calls, prepare twice, a call, restore twice, a call.
  ASSERT_EQ(rs.size(), 32u);
  int restores = 0;
  for (const replay::Result& res : rs) {
    EXPECT_EQ(res.status, replay::Status::kPassed) << res.function_name << ": " << res.error;
    if (res.function_name == "MixedCommHandler.checkpoint_restore") ++restores;
  }
  EXPECT_EQ(restores, 8);
  fs::remove_all(dir);
}

TEST(MixedCommCuda, MatchesCpuBitForBit) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int cc = api::compute_capability(Device::cuda(0));
  if (cc != 90 && cc != 100) {
    comm::ThreadGroup g(2, Device::cuda(0));
    g.run([&](int64_t r) {
      auto h = handler(g, r, 2);
      expect_error(
          [&] {
            run_mixed_comm(Op::ALLREDUCE, h, Tensor::zeros({2, 8}, kBf, Device::cuda(0)));
          },
          "run_mixed_comm does not support compute capability");
    });
    GTEST_SKIP() << "compute capability " << cc;
  }
  // Random values of wide exponent spread (the orders show), every op, split and mode, 2, 4
  // and 8 ranks as threads on one GPU, both dtypes.
  for (DType dt : {kBf, kF16}) {
    for (int64_t L : {2, 4, 8}) {
      for (int64_t ltp = 1; ltp <= L; ltp *= 2) {
        const int64_t ldp = L / ltp, rows = 3 * ldp, cols = 40;
        std::vector<Tensor> in;
        for (int64_t r = 0; r < L; ++r) {
          Tensor t = testing::rand_tensor({rows, cols}, kF32, 100 + r + L * 10, -1, 1);
          std::vector<double> v = t.to_double_vector();
          for (std::size_t i = 0; i < v.size(); ++i) {
            v[i] = std::ldexp(v[i], static_cast<int>(i % 9));
            // (-0, -0) pairs and lone -0s, on some ranks: the pair rule's cases.
            if (i % 14 < 2 && (r + static_cast<int64_t>(i)) % 3 == 0) v[i] = -0.0;
          }
          in.push_back(Tensor::from_vector(v, {rows, cols}, dt));
        }
        comm::ThreadGroup probe(L);
        std::vector<Op> ops;
        std::vector<Mode> modes;
        probe.run([&](int64_t r) {
          auto h = handler(probe, r, ltp, dt);
          if (r == 0) {
            ops = h->get_valid_op_list();
            modes = h->get_valid_mode_list();
          }
        });
        for (Op op : ops) {
          for (Mode m : modes) {
            const auto cpu = run_all(L, ltp, op, m, in, dt);
            const auto gpu = run_all(L, ltp, op, m, in, dt, Device::cuda(0));
            for (int64_t r = 0; r < L; ++r) {
              // Bit patterns: -0 and +0 differ.
              EXPECT_EQ(bits16(cpu[r]), bits16(gpu[r]))
                  << dtype_name(dt) << ", " << L << " ranks, ltp " << ltp << ", "
                  << mixed_comm_op_name(op) << ", " << mixed_comm_mode_name(m) << ", rank " << r;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace flashinfer
