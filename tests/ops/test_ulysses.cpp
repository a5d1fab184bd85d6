// flashinfer.comm.ulysses's UlyssesCommunicator with ranks as threads (comm::ThreadGroup):
// scatter_heads and gather_heads against upstream's index formulas bit for bit (every dtype, 2-8
// ranks and the unsupported sizes), the round trip, one rank's pass-through, the backend
// decision, upstream's refusals and messages, recording and replay of every rank's calls, and
// CUDA against the CPU when a GPU is visible (all ranks on one device).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/ops/ulysses.h"
#include "ops/comm_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr DType kBf = DType::kBFloat16;
constexpr DType kF16 = DType::kFloat16;
constexpr DType kF32 = DType::kFloat32;

// Every element distinct: the bits of rank r's tensor are a function of (r, index), so a
// misplaced element shows. 16-bit dtypes take raw patterns (NaNs included: the exchange moves
// bits, never values).
Tensor pattern(const Shape& shape, DType dt, int64_t rank) {
  Tensor t = Tensor::empty(shape, dt);
  const int64_t n = t.numel();
  if (dt == kF32) {
    auto* p = static_cast<uint32_t*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i)
      p[i] = static_cast<uint32_t>(rank * 0x01000193u + i * 2654435761u);
  } else {
    auto* p = static_cast<uint16_t*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint16_t>(rank * 7919 + i * 40503);
  }
  return t;
}

// The bits of element i of a contiguous tensor.
uint32_t bits_at(const Tensor& t, int64_t i) {
  if (t.dtype() == kF32) return static_cast<const uint32_t*>(t.data_ptr())[i];
  return static_cast<const uint16_t*>(t.data_ptr())[i];
}

// Upstream's formulas, with W ranks' inputs xs:
//   scatter: y_r[b, j * S + s, hl, d] = x_j[b, s, r * Hl + hl, d]
//   gather:  o_r[b, s, p * Hl + hl, d] = y_p[b, r * S + s, hl, d]
void expect_scatter(const std::vector<Tensor>& xs, const std::vector<Tensor>& ys) {
  const int64_t W = static_cast<int64_t>(xs.size());
  const int64_t B = xs[0].size(0), S = xs[0].size(1), H = xs[0].size(2), D = xs[0].size(3);
  const int64_t Hl = H / W;
  for (int64_t r = 0; r < W; ++r) {
    ASSERT_EQ(ys[r].shape(), (Shape{B, S * W, Hl, D}));
    int64_t bad = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < W; ++j)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t hl = 0; hl < Hl; ++hl)
            for (int64_t d = 0; d < D; ++d) {
              const int64_t yi = ((b * S * W + j * S + s) * Hl + hl) * D + d;
              const int64_t xi = ((b * S + s) * H + r * Hl + hl) * D + d;
              bad += bits_at(ys[r], yi) != bits_at(xs[j], xi);
            }
    EXPECT_EQ(bad, 0) << "rank " << r << " of " << W;
  }
}

void expect_gather(const std::vector<Tensor>& ys, const std::vector<Tensor>& os) {
  const int64_t W = static_cast<int64_t>(ys.size());
  const int64_t B = ys[0].size(0), SG = ys[0].size(1), Hl = ys[0].size(2), D = ys[0].size(3);
  const int64_t S = SG / W;
  for (int64_t r = 0; r < W; ++r) {
    ASSERT_EQ(os[r].shape(), (Shape{B, S, Hl * W, D}));
    int64_t bad = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t p = 0; p < W; ++p)
          for (int64_t hl = 0; hl < Hl; ++hl)
            for (int64_t d = 0; d < D; ++d) {
              const int64_t oi = ((b * S + s) * Hl * W + p * Hl + hl) * D + d;
              const int64_t yi = ((b * SG + r * S + s) * Hl + hl) * D + d;
              bad += bits_at(os[r], oi) != bits_at(ys[p], yi);
            }
    EXPECT_EQ(bad, 0) << "rank " << r << " of " << W;
  }
}

// Each rank: scatter its pattern [B, S, H, D], then gather a second pattern [B, S * W, H / W, D];
// returns (inputs, scatters, gather inputs, gathers), all on the CPU.
struct RunResult {
  std::vector<Tensor> xs, ys, gs, os;
};
RunResult run_group(int64_t W, const Shape& x_shape, DType dt, Device dev,
                    const std::string& backend = "auto") {
  comm::ThreadGroup g(W, dev);
  RunResult res;
  res.xs.resize(W);
  res.ys.resize(W);
  res.gs.resize(W);
  res.os.resize(W);
  const Shape g_shape{x_shape[0], x_shape[1] * W, x_shape[2] / W, x_shape[3]};
  g.run([&](int64_t r) {
    const int64_t numel = x_shape[0] * x_shape[1] * x_shape[2] * x_shape[3];
    UlyssesCommunicator c(g.backend(r), numel, dt, backend);
    res.xs[r] = pattern(x_shape, dt, r);
    res.gs[r] = pattern(g_shape, dt, 100 + r);
    // Twice, so the second call reuses the staging buffers and signals of the first.
    for (int i = 0; i < 2; ++i) {
      res.ys[r] = c.scatter_heads(res.xs[r].to(dev)).to(Device::cpu());
      res.os[r] = c.gather_heads(res.gs[r].to(dev)).to(Device::cpu());
    }
    c.close();
  });
  return res;
}

TEST(Ulysses, ScatterAndGatherFollowUpstreamsFormulas) {
  for (int64_t W : {2, 3, 4, 8}) {
    for (DType dt : {kBf, kF16, kF32}) {
      // D 3: rows of 3 * Hl elements (no 16-byte vectors on CUDA); D 8: vector rows.
      for (int64_t D : {3, 8}) {
        const Shape x_shape{2, 3, 2 * W, D};
        const RunResult res = run_group(W, x_shape, dt, Device::cpu());
        expect_scatter(res.xs, res.ys);
        expect_gather(res.gs, res.os);
      }
    }
  }
}

TEST(Ulysses, GatherUndoesScatterBitForBit) {
  comm::ThreadGroup g(4);
  g.run([&](int64_t r) {
    UlyssesCommunicator c(g.backend(r), 5 * 7 * 8 * 16, kBf);
    const Tensor x = pattern({5, 7, 8, 16}, kBf, r);
    const Tensor back = c.gather_heads(c.scatter_heads(x));
    ASSERT_EQ(back.shape(), x.shape());
    EXPECT_EQ(std::memcmp(back.data_ptr(), x.data_ptr(), static_cast<std::size_t>(x.nbytes())), 0)
        << "rank " << r;
    c.close();
  });
}

TEST(Ulysses, OneRankReturnsItsInput) {
  comm::ThreadGroup g(1);
  g.run([&](int64_t r) {
    UlyssesCommunicator c(g.backend(r), 64, kF16);
    EXPECT_EQ(c.backend(), "nccl");
    ASSERT_TRUE(c.fallback_reason().has_value());
    EXPECT_EQ(*c.fallback_reason(),
              "world size 1 not in fused-kernel supported sizes (2, 4, 6, 8)");
    const Tensor x = pattern({1, 2, 4, 8}, kF16, 0);
    EXPECT_EQ(c.scatter_heads(x).data_ptr(), x.data_ptr());
    EXPECT_EQ(c.gather_heads(x).data_ptr(), x.data_ptr());
    // The checks still run first.
    expect_error([&] { c.scatter_heads(pattern({1, 2, 4}, kF16, 0)); }, "4-D");
    c.close();
    c.close();  // idempotent
    expect_error([&] { c.scatter_heads(x); }, "use-after-close");
  });
}

TEST(Ulysses, BackendFollowsUpstreamsDecision) {
  auto decide = [](int64_t W, const std::string& requested) {
    comm::ThreadGroup g(W);
    std::vector<std::string> got(W), reason(W);
    g.run([&](int64_t r) {
      UlyssesCommunicator c(g.backend(r), 64, kBf, requested);
      got[r] = c.backend();
      reason[r] = c.fallback_reason().value_or("-");
      c.close();
    });
    EXPECT_EQ(got[0], got[W - 1]);
    return std::make_pair(got[0], reason[0]);
  };
  for (int64_t W : {2, 4, 6, 8})
    EXPECT_EQ(decide(W, "auto"), std::make_pair(std::string("nvlink"), std::string("-")));
  EXPECT_EQ(
      decide(3, "auto"),
      std::make_pair(std::string("nccl"),
                     std::string("world size 3 not in fused-kernel supported sizes (2, 4, 6, 8)")));
  EXPECT_EQ(decide(2, "nccl"), std::make_pair(std::string("nccl"), std::string("-")));
  EXPECT_EQ(decide(3, "nccl"), std::make_pair(std::string("nccl"), std::string("-")));
  comm::ThreadGroup three(3);
  three.run([&](int64_t r) {
    expect_error([&] { UlyssesCommunicator(three.backend(r), 64, kBf, "nvlink"); },
                 "backend='nvlink' requested but world size 3 not in fused-kernel supported sizes");
  });
}

TEST(Ulysses, RefusesBadConfigsOnEveryRank) {
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) {
    auto b = g.backend(r);
    expect_error([&] { UlyssesCommunicator(b, 0, kBf); },
                 "invalid UlyssesCommunicator config by rank: {0: 'max_elems must be a positive "
                 "int, got 0', 1: 'max_elems must be a positive int, got 0'}");
    expect_error([&] { UlyssesCommunicator(b, int64_t{1} << 31, kBf); },
                 "max_elems must be at most 2147483647 (int32 kernel index range), got 2147483648");
    expect_error([&] { UlyssesCommunicator(b, 64, DType::kInt32); },
                 "dtype must be one of ('torch.float16', 'torch.bfloat16', 'torch.float32'), got "
                 "torch.int32");
    // One rank's problem fails every rank, naming the rank.
    expect_error([&] { UlyssesCommunicator(b, r == 1 ? -4 : 64, kBf); },
                 "by rank: {1: 'max_elems must be a positive int, got -4'}");
    expect_error([&] { UlyssesCommunicator(b, r == 0 ? 64 : 128, kBf); },
                 "inconsistent UlyssesCommunicator configs across ranks: (max_elems, dtype) = "
                 "[(64, torch.bfloat16), (128, torch.bfloat16)]; all ranks must agree");
    expect_error([&] { UlyssesCommunicator(b, 64, kBf, "magic"); },
                 "backend must be one of ('auto', 'nvlink', 'nccl'); invalid request(s) by rank: "
                 "{0: 'magic', 1: 'magic'}");
    expect_error([&] { UlyssesCommunicator(b, 64, kBf, r == 0 ? "auto" : "nccl"); },
                 "inconsistent backend requests across ranks: ['auto', 'nccl']");
    // A device problem on one rank fails every rank (no rank is left in the allgather).
    expect_error(
        [&] { UlyssesCommunicator(b, 64, kBf, "auto", r == 1 ? Value("cuda:3") : Value()); },
        "by rank: {1: 'device cuda:3 is not the group's device cpu");
    expect_error([&] { UlyssesCommunicator(b, 64, kBf, "auto", r == 0 ? Value("tpu") : Value()); },
                 "by rank: {0: 'invalid device 'tpu': ");
    expect_error([&] { UlyssesCommunicator(nullptr, 64, kBf); }, "a CommBackend is required");
  });
  // One signal block holds 8 ranks: a larger group is refused on every rank, before any
  // collective.
  comm::ThreadGroup nine(9);
  nine.run([&](int64_t r) {
    expect_error([&] { UlyssesCommunicator(nine.backend(r), 64, kBf, "nccl"); },
                 "world size 9: flashinfer-cpp's Ulysses exchange takes at most 8 ranks");
  });
}

TEST(Ulysses, RefusesBadOperandsInUpstreamsOrder) {
  comm::ThreadGroup g(2);
  g.run([&](int64_t r) {
    UlyssesCommunicator c(g.backend(r), 256, kBf);
    const char* s = "scatter_heads";
    expect_error(
        [&] {
          c.scatter_heads(pattern({2, 4, 8}, kBf, r));
        },
        std::string(s) + " expects a 4-D [B, S, H, D] tensor, got 3-D shape (2, 4, 8)");
    expect_error(
        [&] {
          c.scatter_heads(pattern({1, 2, 4, 8}, kF16, r));
        },
        "scatter_heads tensor dtype torch.float16 does not match the communicator dtype "
        "torch.bfloat16");
    expect_error(
        [&] {
          c.gather_heads(pattern({1, 4, 2, 8}, kBf, r).transpose(1, 2));
        },
        "gather_heads tensor must be contiguous");
    expect_error(
        [&] {
          c.scatter_heads(Tensor::empty({1, 0, 4, 8}, kBf));
        },
        "scatter_heads tensor dims must all be positive, got shape (1, 0, 4, 8)");
    expect_error(
        [&] {
          c.scatter_heads(pattern({2, 4, 8, 8}, kBf, r));
        },
        "scatter_heads tensor has 512 elements, exceeding the communicator capacity "
        "max_elems=256");
    expect_error(
        [&] {
          c.scatter_heads(pattern({1, 2, 3, 8}, kBf, r));
        },
        "scatter_heads requires the global head count (dim 2) to be divisible by world "
        "size 2, got shape (1, 2, 3, 8)");
    expect_error(
        [&] {
          c.gather_heads(pattern({1, 3, 2, 8}, kBf, r));
        },
        "gather_heads requires the global sequence length (dim 1) to be divisible by "
        "world size 2, got shape (1, 3, 2, 8)");
    // A refused call leaves the communicator usable: no rank entered the exchange.
    const Tensor y = c.scatter_heads(pattern({1, 2, 4, 8}, kBf, r));
    EXPECT_EQ(y.shape(), (Shape{1, 4, 2, 8}));
    c.close();
    expect_error([&] { c.gather_heads(y); },
                 "gather_heads called on a closed UlyssesCommunicator (use-after-close)");
  });
}

TEST(Ulysses, DeclaredAsUpstream) {
  const OpDecl* d = OpRegistry::global().find("UlyssesCommunicator.__init__");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->module, "flashinfer.comm.ulysses");
  EXPECT_EQ(d->signature(), "(self, group=None, *, max_elems, dtype, backend='auto', device=None)");
  ASSERT_NE(OpRegistry::global().find("UlyssesCommunicator.scatter_heads"), nullptr);
  EXPECT_EQ(OpRegistry::global().find("UlyssesCommunicator.gather_heads")->signature(),
            "(self, x)");
}

TEST(Ulysses, RecordedRanksReplayTogether) {
  namespace fs = std::filesystem;
  comm::ThreadGroup g(2);
  const fs::path dir = record_dump("ulysses", [&] {
    g.run([&](int64_t r) {
      UlyssesCommunicator c(g.backend(r), 2 * 3 * 4 * 8, kBf);
      const Tensor y = c.scatter_heads(rand_tensor({2, 3, 4, 8}, kBf, 10 + r));
      c.gather_heads(y);
      g.backend(r)->barrier();
      c.close();
    });
  });
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  ASSERT_EQ(rs.size(), 6u);  // two constructions, four calls
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    EXPECT_NE(r.note.find("a collective"), std::string::npos) << r.note;
  }
  fs::remove_all(dir);
}

TEST(UlyssesCuda, MatchesCpuOnOneGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  for (int64_t W : {2, 3, 4, 6, 8}) {
    for (DType dt : {kBf, kF32}) {
      for (int64_t D : {3, 64}) {  // scalar rows, 16-byte vector rows
        const Shape x_shape{2, 5, 2 * W, D};
        const RunResult gpu = run_group(W, x_shape, dt, Device::cuda(0));
        expect_scatter(gpu.xs, gpu.ys);
        expect_gather(gpu.gs, gpu.os);
      }
    }
  }
}

}  // namespace
}  // namespace flashinfer::testing
