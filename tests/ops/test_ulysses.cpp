// flashinfer.comm.ulysses's UlyssesCommunicator and its raw entry points (init_ulysses_a2a,
// ulysses_a2a, dispose_ulysses_a2a) with ranks as threads (comm::ThreadGroup):
// scatter_heads and gather_heads against upstream's index formulas bit for bit (every dtype, 2-8
// ranks and the unsupported sizes), the round trip, one rank's pass-through, the backend
// decision, upstream's refusals and messages, recording and replay of every rank's calls, and
// CUDA against the CPU when a GPU is visible (all ranks on one device).
#include <gtest/gtest.h>

#include <cstdio>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/ops/ulysses.h"
#include "kernels/ulysses_params.h"
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
    // Twice, so the second call reuses the staging buffers and signals of the first; the first
    // moves other values, so a copy-out that read the staging buffer before the peers' pushes
    // landed would show the first call's rows.
    for (int i = 0; i < 2; ++i) {
      res.xs[r] = pattern(x_shape, dt, i == 0 ? 500 + r : r);
      res.gs[r] = pattern(g_shape, dt, i == 0 ? 600 + r : 100 + r);
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
        // Progress on stderr: a hang (the kernels' 100 s trap) then names its group.
        std::fprintf(stderr, "UlyssesCuda: W %lld, %.*s, D %lld\n", static_cast<long long>(W),
                     static_cast<int>(dtype_torch_name(dt).size()), dtype_torch_name(dt).data(),
                     static_cast<long long>(D));
        const RunResult gpu = run_group(W, x_shape, dt, Device::cuda(0));
        expect_scatter(gpu.xs, gpu.ys);
        expect_gather(gpu.gs, gpu.os);
      }
    }
  }
}

// ---- The raw entry points: init_ulysses_a2a / ulysses_a2a / dispose_ulysses_a2a ----

int64_t addr(const Tensor& t) {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(t.data_ptr()));
}

// Each rank's buffers as a caller of the raw API makes them: a staging buffer of `staging_bytes`
// and a signal block filled with garbage (init must zero this rank's), on `dev`; every rank's
// addresses gathered before any init.
struct RawBuffers {
  std::vector<Tensor> staging, signal;
  std::vector<int64_t> out_ptrs, signal_ptrs;
  RawBuffers(int64_t W, int64_t staging_bytes, Device dev) {
    for (int64_t r = 0; r < W; ++r) {
      staging.push_back(Tensor::zeros({staging_bytes}, DType::kUInt8, dev));
      Tensor sig = Tensor::empty({kernels::UlyssesSignal::kBytes}, DType::kUInt8);
      std::memset(sig.data_ptr(), 0xA5, static_cast<std::size_t>(sig.nbytes()));
      signal.push_back(sig.to(dev));
      out_ptrs.push_back(addr(staging.back()));
      signal_ptrs.push_back(addr(signal.back()));
    }
  }
};

// Every rank: init, a group barrier (upstream's rule), mode 0 on a pattern, mode 1 on a second
// pattern, twice (the second pass reuses the signals), dispose.
RunResult run_raw(int64_t W, const Shape& x_shape, DType dt, Device dev) {
  comm::ThreadGroup g(W, dev);
  const int64_t numel = x_shape[0] * x_shape[1] * x_shape[2] * x_shape[3];
  RawBuffers bufs(W, numel * static_cast<int64_t>(dtype_size(dt)), dev);
  RunResult res;
  res.xs.resize(W);
  res.ys.resize(W);
  res.gs.resize(W);
  res.os.resize(W);
  const int64_t B = x_shape[0], S = x_shape[1], H = x_shape[2], D = x_shape[3];
  const Shape g_shape{B, S * W, H / W, D};
  g.run([&](int64_t r) {
    const int64_t fa = init_ulysses_a2a(bufs.out_ptrs, bufs.signal_ptrs, r, W, true);
    EXPECT_NE(fa, 0);
    g.backend(r)->barrier();
    for (int i = 0; i < 2; ++i) {  // the first call moves other values (run_group says why)
      res.xs[r] = pattern(x_shape, dt, i == 0 ? 500 + r : r);
      res.gs[r] = pattern(g_shape, dt, i == 0 ? 600 + r : 100 + r);
      Tensor y = Tensor::empty(g_shape, dt, dev), o = Tensor::empty(x_shape, dt, dev);
      ulysses_a2a(fa, res.xs[r].to(dev), y, B, S, H, D, 0);
      ulysses_a2a(fa, res.gs[r].to(dev), o, B, S, H, D, 1);
      res.ys[r] = y.to(Device::cpu());
      res.os[r] = o.to(Device::cpu());
    }
    g.backend(r)->barrier();  // no peer pushes into this rank's buffers any more
    dispose_ulysses_a2a(fa);
  });
  return res;
}

TEST(UlyssesRaw, MovesRowsByUpstreamsFormulas) {
  for (int64_t W : {2, 4, 6, 8}) {
    for (DType dt : {kBf, kF16, kF32}) {
      for (int64_t D : {3, 8}) {  // upstream's scalar path (1, 5, 8, 3) and a vector one
        const RunResult res = run_raw(W, {2, 5, 2 * W, D}, dt, Device::cpu());
        expect_scatter(res.xs, res.ys);
        expect_gather(res.gs, res.os);
      }
    }
  }
}

TEST(UlyssesRaw, ScatterThenGatherGivesBackTheInput) {
  const int64_t W = 2, B = 1, S = 8, H = 8, D = 128;  // upstream's (1, 8, 8, 128)
  comm::ThreadGroup g(W);
  RawBuffers bufs(W, B * S * H * D * 2, Device::cpu());
  g.run([&](int64_t r) {
    const int64_t fa = init_ulysses_a2a(bufs.out_ptrs, bufs.signal_ptrs, r, W, true);
    g.backend(r)->barrier();
    const Tensor x = rand_tensor({B, S, H, D}, kBf, 1234 + static_cast<uint64_t>(r));
    Tensor y = Tensor::empty({B, S * W, H / W, D}, kBf), back = Tensor::empty({B, S, H, D}, kBf);
    ulysses_a2a(fa, x, y, B, S, H, D, 0);
    ulysses_a2a(fa, y, back, B, S, H, D, 1);
    EXPECT_EQ(std::memcmp(back.data_ptr(), x.data_ptr(), static_cast<std::size_t>(x.nbytes())), 0);
    g.backend(r)->barrier();
    dispose_ulysses_a2a(fa);
  });
}

TEST(UlyssesRaw, InitZeroesOnlyThisRanksSignalAndRefusesLikeUpstream) {
  RawBuffers bufs(2, 64, Device::cpu());
  const int64_t fa = init_ulysses_a2a(bufs.out_ptrs, bufs.signal_ptrs, 1, 2, true);
  auto bytes_are = [](const Tensor& t, int v) {
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    return std::all_of(p, p + t.nbytes(), [v](uint8_t b) { return b == v; });
  };
  EXPECT_TRUE(bytes_are(bufs.signal[1], 0));
  EXPECT_TRUE(bytes_are(bufs.signal[0], 0xA5));  // a peer's block is its owner's to zero
  dispose_ulysses_a2a(fa);
  const auto& o = bufs.out_ptrs;
  const auto& s = bufs.signal_ptrs;
  expect_error([&] { init_ulysses_a2a(o, s, 0, 3, true); },
               "ulysses a2a only supports world size in (2, 4, 6, 8), got 3");
  expect_error([&] { init_ulysses_a2a(o, s, 0, 16, true); }, "got 16");
  expect_error([&] { init_ulysses_a2a(o, s, 0, 2, false); },
               "full_nvlink=False is not supported: the fused kernel pushes over all-pairs NVLink "
               "P2P and has no non-P2P path.");
  expect_error([&] { init_ulysses_a2a(o, s, 2, 2, true); }, "invalid rank passed in");
  expect_error([&] { init_ulysses_a2a(o, s, -1, 2, true); }, "invalid rank passed in");
  expect_error([&] { init_ulysses_a2a({o[0]}, s, 0, 2, true); },
               "out_ipc_ptrs size must equal world_size");
  expect_error(
      [&] {
        init_ulysses_a2a(o, {s[0], s[1], s[1], s[0]}, 0, 2, true);
      },
      "signal_ipc_ptrs size must equal world_size");
  expect_error(
      [&] {
        init_ulysses_a2a({o[0], 0}, s, 0, 2, true);
      },
      "out_ipc_ptrs[1] is 0 (no buffer)");
  expect_error(
      [&] {
        init_ulysses_a2a(o, {0, s[1]}, 1, 2, true);
      },
      "signal_ipc_ptrs[0] is 0 (no buffer)");
  expect_error(
      [&] {
        init_ulysses_a2a(o, {s[0], s[1] + 2}, 0, 2, true);
      },
      "signal_ipc_ptrs[1] is not 4-byte aligned");
  // The block init writes must be memory of this process: an unmapped address is refused, not
  // written (upstream's cudaMemset refuses it too).
  expect_error(
      [&] {
        init_ulysses_a2a(o, {s[0], 0x10}, 1, 2, true);
      },
      "signal_ipc_ptrs[1] is not mapped memory of this process");
}

TEST(UlyssesRaw, CallRefusesLikeUpstreamBeforeAnyExchange) {
  // Every refusal comes before the barrier: one thread holds a 2-rank handle.
  RawBuffers bufs(2, 4096, Device::cpu());
  const int64_t fa = init_ulysses_a2a(bufs.out_ptrs, bufs.signal_ptrs, 0, 2, true);
  const Tensor x = pattern({1, 2, 4, 8}, kBf, 0);
  Tensor y = Tensor::empty({1, 4, 2, 8}, kBf);
  expect_error([&] { ulysses_a2a(0, x, y, 1, 2, 4, 8, 0); },
               "fa must be a nonzero handle returned by init_ulysses_a2a, got 0");
  expect_error(
      [&] {
        ulysses_a2a(fa, pattern({1, 4, 2, 8}, kBf, 0).transpose(1, 2), y, 1, 2, 4, 8, 0);
      },
      "inp must be contiguous");
  expect_error(
      [&] {
        ulysses_a2a(fa, x, Tensor::empty({4, 2, 8}, kBf), 1, 2, 4, 8, 0);
      },
      "out must be 4-D, got shape (4, 2, 8)");
  expect_error(
      [&] {
        ulysses_a2a(fa, x, Tensor::empty({1, 4, 2, 8}, kF16), 1, 2, 4, 8, 0);
      },
      "inp dtype torch.bfloat16 != out dtype torch.float16");
  expect_error(
      [&] {
        ulysses_a2a(fa, Tensor::zeros({1, 2, 4, 8}, DType::kInt32),
                    Tensor::zeros({1, 4, 2, 8}, DType::kInt32), 1, 2, 4, 8, 0);
      },
      "dtype must be float16/bfloat16/float32, got torch.int32");
  expect_error([&] { ulysses_a2a(fa, x, y, 1, 2, 4, 8, 2); }, "mode must be 0 or 1, got 2");
  expect_error([&] { ulysses_a2a(fa, x, y, 1, 0, 4, 8, 0); },
               "B/S_local/H/D must be positive, got (1, 0, 4, 8)");
  expect_error(
      [&] { ulysses_a2a(fa, x, y, 1, 1, 8, 8, 0); },
      "inp shape (1, 2, 4, 8) does not match [B, S_local, H, D] = (1, 1, 8, 8) for mode 0");
  expect_error(
      [&] { ulysses_a2a(fa, y, x, 1, 1, 8, 8, 1); },
      "out shape (1, 2, 4, 8) does not match [B, S_local, H, D] = (1, 1, 8, 8) for mode 1");
  expect_error(
      [&] {
        ulysses_a2a(fa, x, Tensor::empty({1, 4, 2, 4}, kBf), 1, 2, 4, 8, 0);
      },
      "out shape (1, 4, 2, 4) is inconsistent with [B, S_local, H, D] = (1, 2, 4, 8) "
      "(batch/D dims and total size must match)");
  // Past upstream's Python checks: the handle's world size decides.
  expect_error([&] { ulysses_a2a(fa + 8, x, y, 1, 2, 4, 8, 0); },
               "is not a live handle of init_ulysses_a2a");
  expect_error(
      [&] {
        ulysses_a2a(fa, pattern({1, 2, 3, 8}, kBf, 0), Tensor::empty({1, 2, 3, 8}, kBf), 1, 2, 3, 8,
                    0);
      },
      "global head count must be divisible by world size");
  expect_error(
      [&] {
        ulysses_a2a(fa, x, Tensor::empty({1, 2, 4, 8}, kBf), 1, 2, 4, 8, 0);
      },
      "the [B, S_global, H_local, D] operand of mode 0 has shape (1, 2, 4, 8), expected "
      "(1, 4, 2, 8)");
  // Two faults at once: upstream's first check names its own.
  expect_error(
      [&] {
        ulysses_a2a(fa, pattern({1, 4, 2, 8}, kBf, 0).transpose(1, 2), Tensor::empty({8}, kF16), 1,
                    2, 4, 8, 5);
      },
      "inp must be contiguous");
  expect_error(
      [&] {
        ulysses_a2a(fa, x, Tensor::empty({1, 4, 2, 8}, kF16), 1, 0, 4, 8, 5);
      },
      "inp dtype torch.bfloat16 != out dtype torch.float16");
  expect_error([&] { ulysses_a2a(fa, x, y, 1, 0, 4, 8, 5); }, "mode must be 0 or 1, got 5");
  expect_error([&] { ulysses_a2a(fa, x, y, 1, 0, 3, 8, 0); }, "must be positive, got (1, 0, 3, 8)");
  expect_error([&] { init_ulysses_a2a({}, {}, 7, 3, false); }, "world size in (2, 4, 6, 8), got 3");
  expect_error([&] { init_ulysses_a2a({}, {}, 7, 2, false); }, "full_nvlink=False");
  expect_error([&] { init_ulysses_a2a({}, {}, 7, 2, true); }, "invalid rank passed in");
  expect_error([&] { init_ulysses_a2a({}, {0}, 0, 2, true); }, "out_ipc_ptrs size must equal");
  dispose_ulysses_a2a(0);  // upstream deletes a null pointer: nothing
  dispose_ulysses_a2a(fa);
  expect_error([&] { dispose_ulysses_a2a(fa); }, "is not a live handle of init_ulysses_a2a");
  expect_error([&] { ulysses_a2a(fa, x, y, 1, 2, 4, 8, 0); },
               "is not a live handle of init_ulysses_a2a (disposed, or never returned by it)");
  // A later handle over the same buffers is a new value: the stale one stays refused.
  const int64_t again = init_ulysses_a2a(bufs.out_ptrs, bufs.signal_ptrs, 0, 2, true);
  EXPECT_NE(again, fa);
  expect_error([&] { ulysses_a2a(fa, x, y, 1, 2, 4, 8, 0); }, "is not a live handle");
  dispose_ulysses_a2a(again);
}

TEST(UlyssesRaw, DeclaredAsUpstream) {
  const OpRegistry& reg = OpRegistry::global();
  ASSERT_NE(reg.find("init_ulysses_a2a"), nullptr);
  EXPECT_EQ(reg.find("init_ulysses_a2a")->module, "flashinfer.comm.ulysses");
  EXPECT_EQ(reg.find("init_ulysses_a2a")->signature(),
            "(out_ipc_ptrs, signal_ipc_ptrs, rank, world_size, full_nvlink)");
  EXPECT_EQ(reg.find("dispose_ulysses_a2a")->signature(), "(fa)");
  const OpDecl* a2a = reg.find("ulysses_a2a");
  ASSERT_NE(a2a, nullptr);
  EXPECT_EQ(a2a->signature(), "(fa, inp, out, B, S_local, H, D, mode)");
  EXPECT_TRUE(a2a->params.at(2).mutated);
}

TEST(UlyssesRaw, RecordedRanksReplayTogetherOnFreshBuffers) {
  namespace fs = std::filesystem;
  const int64_t W = 2;
  comm::ThreadGroup g(W);
  RawBuffers bufs(W, 2 * 3 * 4 * 8 * 2, Device::cpu());
  const fs::path dir = record_dump("ulysses_raw", [&] {
    g.run([&](int64_t r) {
      const int64_t fa = init_ulysses_a2a(bufs.out_ptrs, bufs.signal_ptrs, r, W, true);
      g.backend(r)->barrier();
      Tensor y = Tensor::empty({2, 6, 2, 8}, kBf), back = Tensor::empty({2, 3, 4, 8}, kBf);
      ulysses_a2a(fa, rand_tensor({2, 3, 4, 8}, kBf, 10 + static_cast<uint64_t>(r)), y, 2, 3, 4, 8,
                  0);
      ulysses_a2a(fa, y, back, 2, 3, 4, 8, 1);
      g.backend(r)->barrier();
      dispose_ulysses_a2a(fa);
      if (r == 0) dispose_ulysses_a2a(0);  // no handle, no peer: replays alone
    });
  });
  // The recorded buffers are gone before the replay: it must not need them.
  bufs = RawBuffers(1, 16, Device::cpu());
  const std::vector<replay::Result> rs = replay::replay_sequence(dir.string());
  ASSERT_EQ(rs.size(), 9u);  // per rank: init, two calls, dispose; and the null dispose
  int compared = 0, alone = 0;
  for (const replay::Result& r : rs) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    alone += r.note.find("a collective") == std::string::npos ? 1 : 0;
    compared += static_cast<int>(r.comparisons.size());
  }
  EXPECT_EQ(alone, 1);
  EXPECT_EQ(compared, 4);  // every call's out, against what it wrote when recorded
  fs::remove_all(dir);
}

TEST(UlyssesRawCuda, MatchesFormulasOnOneGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  {
    // init zeroes this rank's device signal block and only it.
    RawBuffers b(2, 64, Device::cuda(0));
    const int64_t fa = init_ulysses_a2a(b.out_ptrs, b.signal_ptrs, 1, 2, true);
    const Tensor mine = b.signal[1].to(Device::cpu()), peer = b.signal[0].to(Device::cpu());
    const auto* m = static_cast<const uint8_t*>(mine.data_ptr());
    const auto* p = static_cast<const uint8_t*>(peer.data_ptr());
    EXPECT_TRUE(std::all_of(m, m + mine.nbytes(), [](uint8_t v) { return v == 0; }));
    EXPECT_TRUE(std::all_of(p, p + peer.nbytes(), [](uint8_t v) { return v == 0xA5; }));
    dispose_ulysses_a2a(fa);
  }
  for (int64_t W : {2, 4, 8}) {
    for (DType dt : {kBf, kF32}) {
      for (int64_t D : {3, 64}) {  // scalar rows, 16-byte vector rows
        const RunResult gpu = run_raw(W, {2, 5, 2 * W, D}, dt, Device::cuda(0));
        expect_scatter(gpu.xs, gpu.ys);
        expect_gather(gpu.gs, gpu.os);
      }
    }
  }
  // Host buffers are not for the kernel: refused by name, before any exchange.
  RawBuffers host(2, 4096, Device::cpu());
  const int64_t fa = init_ulysses_a2a(host.out_ptrs, host.signal_ptrs, 0, 2, true);
  const Tensor x = pattern({1, 2, 4, 8}, kBf, 0).to(Device::cuda(0));
  Tensor y = Tensor::empty({1, 4, 2, 8}, kBf, Device::cuda(0));
  expect_error([&] { ulysses_a2a(fa, x, y, 1, 2, 4, 8, 0); },
               "inp is on cuda:0, but the handle's buffers are host memory");
  dispose_ulysses_a2a(fa);
  // Nor device memory mixed with host memory in one handle.
  RawBuffers dev(2, 4096, Device::cuda(0));
  expect_error(
      [&] {
        init_ulysses_a2a({host.out_ptrs[0], dev.out_ptrs[1]}, host.signal_ptrs, 0, 2, true);
      },
      "out_ipc_ptrs[1] is device memory (cuda:0), but this rank's staging buffer "
      "out_ipc_ptrs[0] is host memory");
}

}  // namespace
}  // namespace flashinfer::testing
