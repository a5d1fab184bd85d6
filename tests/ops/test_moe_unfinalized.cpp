// do_finalize=False for the trtllm MoE ops: upstream's returned list [gemm2_output,
// expert_weights, expanded_idx_to_permuted_idx], the permutation's invariants, the rows against
// fp64 formulas, finalizing the list by hand against the op's own finalized output (every
// format), bad input, record/replay, and replay of recordings whose row order differs from ours
// (passes) or whose values differ (fails). Semantics: docs/MOE.md, "do_finalize=False".
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "flashinfer/tensor_io.h"
#include "ops/moe_fp4_test_util.h"
#include "ops/op_test_util.h"
#include "util/moe_weight_prep.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

constexpr int64_t kE = 8, kK = 2, kT = 6;

using moe_prep::bf16;
using moe_prep::silu;

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel() * static_cast<int64_t>(c.element_size()));
}

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> v;
  for (double d : t.to_double_vector()) v.push_back(static_cast<int64_t>(d));
  return v;
}

// Packed routing (expert << 16 | bf16 weight bits) with every token's experts distinct; some
// experts fall outside the local range [2, 6) used below.
Tensor packed_routing(std::vector<int64_t>* ids, std::vector<float>* weights) {
  Tensor p = Tensor::empty({kT, kK}, DType::kInt32);
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t k = 0; k < kK; ++k) {
      const int64_t e = (3 * t + 5 * k + t * k) % kE;
      const float w = static_cast<float>(bf16(0.25 + 0.125 * static_cast<double>((t + k) % 5)));
      ids->push_back(e);
      weights->push_back(w);
      p.data<int32_t>()[t * kK + k] =
          static_cast<int32_t>((static_cast<uint32_t>(e) << 16) | float_to_bfloat16_bits(w));
    }
  }
  return p;
}

// The permutation's invariants (our order: local experts ascending, then t * top_k + k), rows
// past the local pairs zero, and finalizing by hand (fp32, k ascending, one bf16 rounding, as
// upstream's finalize kernel) equal to the op's finalized output bit for bit.
void check_unfinalized(const std::vector<Tensor>& u, const Tensor& finalized,
                       const std::vector<int64_t>& ids, int64_t offset, int64_t local, int64_t H) {
  ASSERT_EQ(u.size(), 3u);
  const Tensor &g2 = u[0], &w = u[1], &idx_t = u[2];
  EXPECT_EQ(g2.shape(), Shape({kT * kK, H}));
  EXPECT_EQ(g2.dtype(), DType::kBFloat16);
  EXPECT_EQ(w.shape(), Shape({kT, kK}));
  EXPECT_EQ(idx_t.shape(), Shape({kT * kK}));
  EXPECT_EQ(idx_t.dtype(), DType::kInt32);
  const std::vector<int64_t> idx = ints(idx_t);
  int64_t next = 0;
  for (int64_t e = offset; e < offset + local; ++e) {
    for (int64_t i = 0; i < kT * kK; ++i) {
      if (ids[static_cast<size_t>(i)] == e) {
        EXPECT_EQ(idx[static_cast<size_t>(i)], next++) << i;
      }
    }
  }
  for (int64_t i = 0; i < kT * kK; ++i) {
    const int64_t e = ids[static_cast<size_t>(i)];
    if (e < offset || e >= offset + local) {
      EXPECT_EQ(idx[static_cast<size_t>(i)], -1) << i;
    }
  }
  ASSERT_GT(next, 0);
  ASSERT_LT(next, kT * kK);  // some pairs are not local: the tail rows are padding
  const std::vector<double> rows = g2.to_double_vector(), wv = w.to_double_vector();
  for (int64_t r = next * H; r < kT * kK * H; ++r) EXPECT_EQ(rows[static_cast<size_t>(r)], 0.0);
  Tensor by_hand = Tensor::empty({kT, H}, DType::kBFloat16);
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t c = 0; c < H; ++c) {
      float acc = 0.0f;
      for (int64_t k = 0; k < kK; ++k) {
        const int64_t r = idx[static_cast<size_t>(t * kK + k)];
        if (r < 0) continue;
        acc += static_cast<float>(wv[static_cast<size_t>(t * kK + k)]) *
               static_cast<float>(rows[static_cast<size_t>(r * H + c)]);
      }
      by_hand.data<uint16_t>()[t * H + c] = float_to_bfloat16_bits(acc);
    }
  }
  EXPECT_TRUE(all_close(by_hand, finalized, {0, 0}));
}

// ---- BF16 ------------------------------------------------------------------------------------

struct Bf16Case {
  int64_t H = 64, I = 32, offset = 2, local = 4;
  Tensor x, w1, w2;
  Bf16Case() {
    x = rand_tensor({kT, H}, DType::kBFloat16, 11, -1.0, 1.0);
    w1 = rand_tensor({local, 2 * I, H}, DType::kBFloat16, 12, -0.3, 0.3);
    w2 = rand_tensor({local, H, I}, DType::kBFloat16, 13, -0.3, 0.3);
  }
  TrtllmMoeResult run(const MoeTopkIds& r, bool fin) const {
    return trtllm_bf16_routed_moe(r, x, w1, w2, kE, kK, std::nullopt, std::nullopt, I, offset,
                                  local, std::nullopt, 1, false, WeightLayout::MajorK, fin);
  }
};

TEST(TrtllmMoeUnfinalized, Bf16RowsMatchFormula) {
  const Bf16Case c;
  std::vector<int64_t> ids;
  std::vector<float> wts;
  const Tensor packed = packed_routing(&ids, &wts);
  const TrtllmMoeResult u = c.run(packed, false);
  EXPECT_FALSE(u.finalized);
  check_unfinalized(u.tensors, c.run(packed, true), ids, c.offset, c.local, c.H);
  // expert_weights: the packed weights, bf16, in (token, k) order.
  const std::vector<double> w = u.tensors[1].to_double_vector();
  EXPECT_EQ(u.tensors[1].dtype(), DType::kBFloat16);
  for (size_t i = 0; i < wts.size(); ++i) EXPECT_EQ(w[i], wts[i]) << i;
  // Each local pair's row: bf16(w2[e] @ bf16(silu(gate) * up)), GEMM1 unrounded (fp64 here).
  const std::vector<double> x = c.x.to_double_vector(), w1 = c.w1.to_double_vector(),
                            w2 = c.w2.to_double_vector(), g2 = u.tensors[0].to_double_vector();
  const std::vector<int64_t> idx = ints(u.tensors[2]);
  const int64_t H = c.H, I = c.I;
  for (int64_t i = 0; i < kT * kK; ++i) {
    const int64_t r = idx[static_cast<size_t>(i)];
    if (r < 0) continue;
    const int64_t t = i / kK, e = ids[static_cast<size_t>(i)] - c.offset;
    std::vector<double> h(static_cast<size_t>(I));
    for (int64_t j = 0; j < I; ++j) {
      const auto [up, gate] = moe_prep::gemm1_halves(x, w1, t, e, j, H, I);
      h[static_cast<size_t>(j)] = bf16(silu(gate) * up);
    }
    for (int64_t col = 0; col < H; ++col) {
      const double y = moe_prep::gemm2_col(h, w2, e, col, H, I);
      // bf16's half ulp, plus the activation's one-ulp flips between fp32 and fp64.
      EXPECT_NEAR(g2[static_cast<size_t>(r * H + col)], y, 1e-2 * std::fabs(y) + 2e-3)
          << "pair " << i << " column " << col;
    }
  }
}

TEST(TrtllmMoeUnfinalized, Bf16PairFormReturnsTheCallersWeights) {
  const Bf16Case c;
  std::vector<int64_t> ids;
  std::vector<float> wts;
  (void)packed_routing(&ids, &wts);
  Tensor id_t = Tensor::empty({kT, kK}, DType::kInt32);
  Tensor w_t = Tensor::empty({kT, kK}, DType::kFloat32);
  for (size_t i = 0; i < ids.size(); ++i) {
    id_t.data<int32_t>()[i] = static_cast<int32_t>(ids[i]);
    w_t.data<float>()[i] = wts[i];
  }
  const TrtllmMoeResult u = c.run(MoeTopkIds(id_t, w_t), false);
  check_unfinalized(u.tensors, c.run(MoeTopkIds(id_t, w_t), true), ids, c.offset, c.local, c.H);
  // Upstream returns the borrowed routing-weights buffer itself (fp32 here).
  EXPECT_EQ(u.tensors[1].data_ptr(), w_t.data_ptr());
  EXPECT_EQ(u.tensors[1].dtype(), DType::kFloat32);
}

TEST(TrtllmMoeUnfinalized, Bf16FromLogits) {
  const Bf16Case c;
  Tensor logits = rand_tensor({kT, kE}, DType::kFloat32, 21, -3.0, 3.0);
  Tensor replay_ids = Tensor::zeros({kT, kK}, DType::kInt16);
  auto run = [&](bool fin) {
    return trtllm_bf16_moe(logits, std::nullopt, c.x, c.w1, c.w2, kE, kK, std::nullopt,
                           std::nullopt, c.I, c.offset, c.local, std::nullopt, 1, false,
                           WeightLayout::MajorK, fin, true, 8192, 3, true, replay_ids);
  };
  const Tensor fin = run(true);
  const TrtllmMoeResult u = run(false);
  const std::vector<int64_t> ids = ints(replay_ids);
  check_unfinalized(u.tensors, fin, ids, c.offset, c.local, c.H);
  // Renormalize: softmax over the top-k logits, rounded to bf16 (the routing kernels' output).
  const std::vector<double> l = logits.to_double_vector(), w = u.tensors[1].to_double_vector();
  for (int64_t t = 0; t < kT; ++t) {
    double z = 0.0;
    for (int64_t k = 0; k < kK; ++k)
      z += std::exp(l[static_cast<size_t>(t * kE + ids[t * kK + k])]);
    for (int64_t k = 0; k < kK; ++k) {
      const double p = std::exp(l[static_cast<size_t>(t * kE + ids[t * kK + k])]) / z;
      EXPECT_NEAR(w[static_cast<size_t>(t * kK + k)], p, 4e-3) << t << "," << k;
    }
  }
  EXPECT_FI_ERROR((void)static_cast<Tensor>(u), "TrtllmMoeResult", "do_finalize");
}

// ---- every other format: finalizing the list by hand equals the op's finalized output -------

Tensor fp8_tensor(const Shape& s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return rand_tensor(s, DType::kFloat32, seed, lo, hi).to(DType::kFloat8E4M3FN);
}
Tensor ue8m0_codes(const Shape& s, uint64_t seed) {  // scale codes 2^-4 .. 2^0
  Tensor t = Tensor::empty(s, DType::kUInt8);
  moe_fp4::Rng r{seed};
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<uint8_t>()[i] = static_cast<uint8_t>(123 + static_cast<int>(r.uniform(0.0, 4.99)));
  }
  return t;
}
Tensor bytes(const Shape& s, uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return moe_fp4::bytes_tensor(moe_fp4::random_bytes(static_cast<size_t>(n), seed), s);
}

struct Routed {
  std::vector<int64_t> ids;
  std::vector<float> wts;
  Tensor packed;
  Routed() { packed = packed_routing(&ids, &wts); }
};
constexpr int64_t kOff = 2, kLocal = 4, kH = 128, kI = 128;

TEST(TrtllmMoeUnfinalized, Fp8BlockScaleDeepSeek) {
  const Routed r;
  Tensor x = fp8_tensor({kT, kH}, 31), xs = rand_tensor({1, kT}, DType::kFloat32, 32, 0.5, 1.0);
  Tensor w1 = fp8_tensor({kLocal, 2 * kI, kH}, 33), w2 = fp8_tensor({kLocal, kH, kI}, 34);
  Tensor s1 = rand_tensor({kLocal, 2, 1}, DType::kFloat32, 35, 0.02, 0.04);
  Tensor s2 = rand_tensor({kLocal, 1, 1}, DType::kFloat32, 36, 0.02, 0.04);
  auto run = [&](bool fin) {
    return trtllm_fp8_block_scale_routed_moe(r.packed, std::nullopt, x, xs, w1, s1, w2, s2, kE, kK,
                                             std::nullopt, std::nullopt, kI, kOff, kLocal,
                                             std::nullopt, 1, false, WeightLayout::MajorK, fin);
  };
  check_unfinalized(run(false).tensors, run(true), r.ids, kOff, kLocal, kH);
}

TEST(TrtllmMoeUnfinalized, Fp8BlockScaleMxFp8) {
  const Routed r;
  Tensor x = fp8_tensor({kT, kH}, 41), xs = ue8m0_codes({kT, kH / 32}, 42);
  Tensor w1 = fp8_tensor({kLocal, 2 * kI, kH}, 43), w2 = fp8_tensor({kLocal, kH, kI}, 44);
  Tensor s1 = ue8m0_codes({kLocal, 2 * kI, kH / 32}, 45),
         s2 = ue8m0_codes({kLocal, kH, kI / 32}, 46);
  auto run = [&](bool fin) {
    return trtllm_fp8_block_scale_routed_moe(
        r.packed, std::nullopt, x, xs, w1, s1, w2, s2, kE, kK, std::nullopt, std::nullopt, kI, kOff,
        kLocal, std::nullopt, 1, false, WeightLayout::MajorK, fin, std::nullopt, std::nullopt,
        std::nullopt, 8192, Fp8QuantizationType::MxFp8);
  };
  check_unfinalized(run(false).tensors, run(true), r.ids, kOff, kLocal, kH);
}

TEST(TrtllmMoeUnfinalized, Fp8PerTensor) {
  const Routed r;
  Tensor x = fp8_tensor({kT, kH}, 51);
  Tensor w1 = fp8_tensor({kLocal, 2 * kI, kH}, 52), w2 = fp8_tensor({kLocal, kH, kI}, 53);
  Tensor s = rand_tensor({kLocal}, DType::kFloat32, 54, 0.01, 0.02);
  auto run = [&](bool fin) {
    return trtllm_fp8_per_tensor_scale_routed_moe(r.packed, std::nullopt, x, w1, s, s, w2, s, kE,
                                                  kK, std::nullopt, std::nullopt, kI, kOff, kLocal,
                                                  std::nullopt, false, 1, fin);
  };
  check_unfinalized(run(false).tensors, run(true), r.ids, kOff, kLocal, kH);
}

TEST(TrtllmMoeUnfinalized, Fp4Mxfp4Bf16) {
  const Routed r;
  Tensor x = rand_tensor({kT, kH}, DType::kBFloat16, 61, -1.0, 1.0);
  Tensor w1 = bytes({kLocal, 2 * kI, kH / 2}, 62), w2 = bytes({kLocal, kH, kI / 2}, 63);
  Tensor s1 = ue8m0_codes({kLocal, 2 * kI, kH / 32}, 64),
         s2 = ue8m0_codes({kLocal, kH, kI / 32}, 65);
  auto run = [&](bool fin) {
    return trtllm_fp4_block_scale_routed_moe(
        r.packed, std::nullopt, x, std::nullopt, w1, s1, std::nullopt, std::nullopt, std::nullopt,
        std::nullopt, w2, s2, std::nullopt, std::nullopt, std::nullopt, std::nullopt, kE, kK,
        std::nullopt, std::nullopt, kI, kOff, kLocal, std::nullopt, 1, fin);
  };
  const std::vector<Tensor> fin = run(true);
  ASSERT_EQ(fin.size(), 1u);
  check_unfinalized(run(false), fin[0], r.ids, kOff, kLocal, kH);
}

// An MxInt4 MoE of random packed weights and bf16 scales (the routed op, packed routing).
struct MxInt4Case {
  Tensor x = rand_tensor({kT, kH}, DType::kBFloat16, 71, -1.0, 1.0);
  Tensor w1 = bytes({kLocal, 2 * kI, kH / 2}, 72), w2 = bytes({kLocal, kH, kI / 2}, 73);
  Tensor s1 = rand_tensor({kLocal, 2 * kI*(kH / 32)}, DType::kBFloat16, 74, 0.01, 0.02);
  Tensor s2 = rand_tensor({kLocal, kH*(kI / 32)}, DType::kBFloat16, 75, 0.01, 0.02);
  std::vector<Tensor> run(const Routed& r, bool fin,
                          std::optional<Tensor> lora = std::nullopt) const {
    return trtllm_mxint4_block_scale_routed_moe(
        r.packed, x, w1, s1, std::nullopt, std::nullopt, std::nullopt, w2, s2, kE, kK, std::nullopt,
        std::nullopt, kI, kOff, kLocal, std::nullopt, 1, fin, std::nullopt, std::move(lora));
  }
};

TEST(TrtllmMoeUnfinalized, MxInt4) {
  const Routed r;
  const MxInt4Case c;
  const std::vector<Tensor> fin = c.run(r, true);
  ASSERT_EQ(fin.size(), 1u);
  check_unfinalized(c.run(r, false), fin[0], r.ids, kOff, kLocal, kH);
}

// ---- record / replay ---------------------------------------------------------------------------

TEST(TrtllmMoeUnfinalized, RecordReplayInMemory) {
  const Bf16Case c;
  const Routed r;
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    (void)c.run(r.packed, false);
    const Tensor xs = rand_tensor({1, kT}, DType::kFloat32, 32, 0.5, 1.0);
    (void)trtllm_fp8_block_scale_routed_moe(
        r.packed, std::nullopt, fp8_tensor({kT, kH}, 31), xs, fp8_tensor({kLocal, 2 * kI, kH}, 33),
        rand_tensor({kLocal, 2, 1}, DType::kFloat32, 35, 0.02, 0.04),
        fp8_tensor({kLocal, kH, kI}, 34),
        rand_tensor({kLocal, 1, 1}, DType::kFloat32, 36, 0.02, 0.04), kE, kK, std::nullopt,
        std::nullopt, kI, kOff, kLocal, std::nullopt, 1, false, WeightLayout::MajorK, false);
    calls = scope.observer().calls;  // replayed below, outside the scope (replay calls the op)
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& call : calls) {
    SCOPED_TRACE(call.name);
    ASSERT_TRUE(call.result.is_sequence());
    EXPECT_EQ(call.result.items().size(), 3u);
    EXPECT_TRUE(replays_identically(call));
  }
}

// Records one unfinalized call into a dump directory; returns the call's directory.
std::filesystem::path record_unfinalized(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg);
  const Bf16Case c;
  const Routed r;
  (void)c.run(r.packed, false);
  recorder::stop();
  std::vector<fs::path> calls;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) calls.push_back(e.path());
  }
  EXPECT_EQ(calls.size(), 1u);
  return calls.empty() ? fs::path() : calls[0];
}

// Rewrites the recorded outputs as a GPU could have written them: the local rows in another
// order (reversed) behind a padded block, expanded_idx_to_permuted_idx following them;
// `tamper` also changes one value of a local row.
void repermute_outputs(const std::filesystem::path& call, bool tamper,
                       const std::string& rows_key = "result__0",
                       const std::string& idx_key = "result__2") {
  const std::string path = (call / "outputs.pt").string();
  NamedTensors out = load_torch(path);
  Tensor *g2 = nullptr, *idx = nullptr;
  for (auto& [k, t] : out) {
    if (k == rows_key) g2 = &t;
    if (k == idx_key) idx = &t;
  }
  ASSERT_TRUE(g2 && idx);
  const int64_t rows = g2->size(0), H = g2->size(1), pad = 3;
  Tensor g = Tensor::empty({rows + pad, H}, DType::kBFloat16);
  Tensor ix = idx->clone();
  const std::vector<int64_t> old = ints(*idx);
  int64_t local = 0;
  for (int64_t v : old) local += v >= 0;
  auto* src = g2->contiguous().data<uint16_t>();
  auto* dst = g.data<uint16_t>();
  for (int64_t i = 0; i < (rows + pad) * H; ++i) dst[i] = 0x4120;  // junk padding (10.0)
  for (size_t i = 0; i < old.size(); ++i) {
    if (old[i] < 0) continue;
    const int64_t to = pad + (local - 1 - old[i]);  // reversed, after `pad` padding rows
    ix.data<int32_t>()[i] = static_cast<int32_t>(to);
    std::copy(src + old[i] * H, src + (old[i] + 1) * H, dst + to * H);
  }
  if (tamper)
    dst[pad * H + 1] = float_to_bfloat16_bits(bfloat16_bits_to_float(dst[pad * H + 1]) + 1.0f);
  *g2 = g;
  *idx = ix;
  save_torch(path, out);
}

TEST(TrtllmMoeUnfinalized, ReplayComparesRowsThroughEachSidesPermutation) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_moe_unfin_" + std::to_string(::getpid()));
  // As recorded: passes.
  fs::path call = record_unfinalized(dir);
  replay::Result r = replay::replay_from_dump(call.string());
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error << r.note;
  // Another valid row order with padding rows: passes, and says which rows it skipped.
  repermute_outputs(call, false);
  r = replay::replay_from_dump(call.string());
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error << r.note;
  EXPECT_EQ(r.skipped_outputs, std::vector<std::string>{"result__0 padding rows"});
  // 12 pairs, 5 of them local (experts 2..5 of the fixed routing): 12 + 3 rows, 10 unused.
  EXPECT_NE(r.note.find("not compared: 10 of 15 rows of result__0 (padding"), std::string::npos)
      << r.note;
  EXPECT_NE(r.note.find("through each side's result__2"), std::string::npos) << r.note;
  // A changed value: mismatch, reported on the gathered rows.
  call = record_unfinalized(dir);
  repermute_outputs(call, true);
  r = replay::replay_from_dump(call.string());
  EXPECT_EQ(r.status, replay::Status::kMismatch) << r.error;
  bool found = false;
  for (const auto& c : r.comparisons) {
    if (c.key.starts_with("result__0")) {
      found = true;
      EXPECT_FALSE(c.match);
      EXPECT_EQ(c.mismatches, 1);
    }
  }
  EXPECT_TRUE(found);
  fs::remove_all(dir);
}

// A recording whose set of local pairs differs (a pair marked non-local) fails on result__2.
TEST(TrtllmMoeUnfinalized, ReplayFailsWhenTheLocalPairsDiffer) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_moe_unfin2_" + std::to_string(::getpid()));
  const fs::path call = record_unfinalized(dir);
  const std::string path = (call / "outputs.pt").string();
  NamedTensors out = load_torch(path);
  for (auto& [k, t] : out) {
    if (k != "result__2") continue;
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.data<int32_t>()[i] >= 0) {
        t.data<int32_t>()[i] = -1;
        break;
      }
    }
  }
  save_torch(path, out);
  const replay::Result r = replay::replay_from_dump(call.string());
  EXPECT_EQ(r.status, replay::Status::kMismatch);
  ASSERT_FALSE(r.comparisons.empty());
  EXPECT_EQ(r.comparisons[0].key, "result__2");
  EXPECT_EQ(r.comparisons[0].mismatches, 1);
  fs::remove_all(dir);
}

// ---- gemm1_lora_delta (trtllm_bf16_routed_moe) ------------------------------------------------

// Small integers throughout, so every GEMM1 value is exact: a LoRA delta x . dW1[e] per pair
// then gives, bit for bit, the op over the weights w1 + dW1 (upstream's reference adds the delta
// to GEMM1's fp32 output before the activation). Non-local pairs' delta rows hold junk, unread.
// Integers in [lo, hi] (a fixed LCG), exact in every dtype used here.
Tensor int_valued(Shape shape, int64_t lo, int64_t hi, uint32_t seed, DType dt) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<std::size_t>(n));
  uint32_t st = seed;
  for (double& e : v) {
    st = st * 1664525u + 1013904223u;
    e = static_cast<double>(lo +
                            static_cast<int64_t>((st >> 8) % static_cast<uint32_t>(hi - lo + 1)));
  }
  return Tensor::from_vector(v, shape, dt);
}

// The LoRA side of the integer trick: dW1 [local, 2I, H], w1 + dW1, and each local pair's delta
// row x[t] . dW1[e] (junk on the non-local pairs' rows, which are never read).
struct LoraDelta {
  Tensor dw1, w1_sum, delta;
  LoraDelta(const Routed& r, const Tensor& x, const Tensor& w1, int64_t H, int64_t I, DType dt) {
    dw1 = int_valued({kLocal, 2 * I, H}, -1, 1, 3, dt);
    const std::vector<double> a = w1.to_double_vector(), b = dw1.to_double_vector();
    std::vector<double> sum(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
    w1_sum = Tensor::from_vector(sum, w1.shape(), dt);
    std::vector<double> d(static_cast<std::size_t>(kT * kK * 2 * I), 77.0);
    const std::vector<double> xv = x.to_double_vector();
    for (int64_t t = 0; t < kT; ++t) {
      for (int64_t k = 0; k < kK; ++k) {
        const int64_t e = r.ids[static_cast<std::size_t>(t * kK + k)] - kOff;
        if (e < 0 || e >= kLocal) continue;
        for (int64_t j = 0; j < 2 * I; ++j) {
          double acc = 0.0;
          for (int64_t h = 0; h < H; ++h) {
            acc += xv[static_cast<std::size_t>(t * H + h)] *
                   b[static_cast<std::size_t>((e * 2 * I + j) * H + h)];
          }
          d[static_cast<std::size_t>((t * kK + k) * 2 * I + j)] = acc;
        }
      }
    }
    delta = Tensor::from_vector(d, {kT, kK, 2 * I}, DType::kBFloat16);
  }
};

struct LoraCase {
  int64_t H = 64, I = 32;
  Tensor x, w1, dw1, w1_sum, w2, delta;
  explicit LoraCase(const Routed& r) {
    x = int_valued({kT, H}, -2, 2, 1, DType::kBFloat16);
    w1 = int_valued({kLocal, 2 * I, H}, -1, 1, 2, DType::kBFloat16);
    w2 = int_valued({kLocal, H, I}, -1, 1, 4, DType::kBFloat16);
    const LoraDelta l(r, x, w1, H, I, DType::kBFloat16);
    dw1 = l.dw1;
    w1_sum = l.w1_sum;
    delta = l.delta;
  }
  TrtllmMoeResult run(const Routed& r, const Tensor& weights1, bool fin,
                      std::optional<Tensor> lora) const {
    return trtllm_bf16_routed_moe(r.packed, x, weights1, w2, kE, kK, std::nullopt, std::nullopt, I,
                                  kOff, kLocal, std::nullopt, 1, false, WeightLayout::MajorK, fin,
                                  true, std::move(lora));
  }
};

TEST(TrtllmMoeLoraDelta, DeltaActsAsGemm1WeightsPlusTheLoraOnBothFinalizePaths) {
  const Routed r;
  const LoraCase c(r);
  const Tensor zero = Tensor::zeros({kT, kK, 2 * c.I}, DType::kBFloat16);
  // The reference: the summed weights, a zero delta (which adds nothing) for the activation.
  const TrtllmMoeResult ref_fin = c.run(r, c.w1_sum, true, zero);
  const TrtllmMoeResult ref_unfin = c.run(r, c.w1_sum, false, zero);
  const Tensor plain = c.run(r, c.w1_sum, true, std::nullopt);
  ASSERT_EQ(ref_fin.tensors.size(), 3u);
  EXPECT_EQ(bytes(ref_fin.tensors[0]), bytes(plain));
  // Finalized: [output, expanded_idx_to_permuted_idx, activation].
  const TrtllmMoeResult fin = c.run(r, c.w1, true, c.delta);
  ASSERT_EQ(fin.tensors.size(), 3u);
  EXPECT_TRUE(fin.finalized);
  EXPECT_EQ(fin.tensors[1].dtype(), DType::kInt32);
  EXPECT_EQ(fin.tensors[2].shape(), Shape({kT * kK, c.I}));
  EXPECT_EQ(fin.tensors[2].dtype(), DType::kBFloat16);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_EQ(bytes(fin.tensors[i]), bytes(ref_fin.tensors[i])) << i;
  EXPECT_EQ(bytes(fin.tensors[1]), bytes(ref_unfin.tensors[2]));  // the same permutation
  // The delta matters: without it, the weights w1 give other numbers.
  EXPECT_NE(bytes(fin.tensors[0]), bytes(c.run(r, c.w1, true, std::nullopt)));
  // Unfinalized: [gemm2_output, expert_weights, expanded_idx_to_permuted_idx, activation].
  const TrtllmMoeResult unfin = c.run(r, c.w1, false, c.delta);
  ASSERT_EQ(unfin.tensors.size(), 4u);
  EXPECT_FALSE(unfin.finalized);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(bytes(unfin.tensors[i]), bytes(ref_unfin.tensors[i])) << i;
  }
  EXPECT_EQ(bytes(unfin.tensors[3]), bytes(fin.tensors[2]));
  // The activation row of each local pair: silu(gate) * up of its GEMM1 row (exact integers).
  const std::vector<int64_t> idx = ints(fin.tensors[1]);
  const std::vector<double> act = fin.tensors[2].to_double_vector(), x = c.x.to_double_vector(),
                            w = c.w1_sum.to_double_vector();
  for (int64_t i = 0; i < kT * kK; ++i) {
    const int64_t row = idx[static_cast<std::size_t>(i)];
    if (row < 0) continue;
    const int64_t t = i / kK, e = r.ids[static_cast<std::size_t>(i)] - kOff;
    for (int64_t j = 0; j < c.I; ++j) {
      const auto [up, gate] = moe_prep::gemm1_halves(x, w, t, e, j, c.H, c.I);
      EXPECT_NEAR(act[static_cast<std::size_t>(row * c.I + j)], silu(gate) * up,
                  8e-3 * std::fabs(silu(gate) * up) + 1e-6)
          << "pair " << i << " column " << j;
    }
  }
  // Rows past the local pairs are zero; a C++ caller cannot take the list as one tensor.
  const auto local = static_cast<std::size_t>(
      std::count_if(idx.begin(), idx.end(), [](int64_t v) { return v >= 0; }));
  ASSERT_GT(local, 0u);
  for (std::size_t v = local * static_cast<std::size_t>(c.I); v < act.size(); ++v)
    ASSERT_EQ(act[v], 0.0);
  EXPECT_FI_ERROR((void)static_cast<Tensor>(fin), "TrtllmMoeResult", "do_finalize");
}

// Recorded as upstream returns it (the three-item list), replayed; a recording whose activation
// rows sit in another order (a GPU's tile padding) replays through its own permutation.
TEST(TrtllmMoeLoraDelta, ReplayComparesTheActivationThroughEachSidesPermutation) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_moe_lora_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const Routed r;
  const LoraCase c(r);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg);
  (void)c.run(r, c.w1, true, c.delta);
  recorder::stop();
  fs::path call;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) call = e.path();
  }
  ASSERT_FALSE(call.empty());
  replay::Result res = replay::replay_from_dump(call.string());
  EXPECT_EQ(res.status, replay::Status::kPassed) << res.error << res.note;
  repermute_outputs(call, false, "result__2", "result__1");
  res = replay::replay_from_dump(call.string());
  EXPECT_EQ(res.status, replay::Status::kPassed) << res.error << res.note;
  EXPECT_NE(res.note.find("through each side's result__1"), std::string::npos) << res.note;
  repermute_outputs(call, true, "result__2", "result__1");
  res = replay::replay_from_dump(call.string());
  EXPECT_EQ(res.status, replay::Status::kMismatch) << res.error;
  fs::remove_all(dir);
}

// MxInt4: a delta of zeros on the local pairs (junk on the others, unread) changes nothing, and
// the lists grow as upstream's; a delta c on the up half enters before the Swiglu: the activation
// is silu(gate) * (up + c), which two constants pin down against the zero delta's silu(gate) * up.
TEST(TrtllmMoeLoraDelta, MxInt4AddsTheDeltaBeforeTheSwiglu) {
  const Routed r;
  const MxInt4Case c;
  auto run = [&](bool fin, std::optional<Tensor> d) { return c.run(r, fin, std::move(d)); };
  // up_c on the up half of the local pairs' rows, gate_c on the gate half, 77 on non-local pairs.
  auto delta = [&](double up_c, double gate_c = 0.0) {
    std::vector<double> d(static_cast<std::size_t>(kT * kK * 2 * kI), 77.0);
    for (int64_t i = 0; i < kT * kK; ++i) {
      const int64_t e = r.ids[static_cast<std::size_t>(i)] - kOff;
      if (e < 0 || e >= kLocal) continue;
      for (int64_t j = 0; j < 2 * kI; ++j) {
        d[static_cast<std::size_t>(i * 2 * kI + j)] = j < kI ? up_c : gate_c;
      }
    }
    return Tensor::from_vector(d, {kT, kK, 2 * kI}, DType::kBFloat16);
  };
  const std::vector<Tensor> plain = run(true, std::nullopt), plain_u = run(false, std::nullopt);
  const std::vector<Tensor> z = run(true, delta(0.0)), zu = run(false, delta(0.0));
  ASSERT_EQ(z.size(), 3u);
  ASSERT_EQ(zu.size(), 4u);
  EXPECT_EQ(bytes(z[0]), bytes(plain[0]));
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(bytes(zu[i]), bytes(plain_u[i])) << i;
  EXPECT_EQ(bytes(z[1]), bytes(plain_u[2]));
  EXPECT_EQ(bytes(z[2]), bytes(zu[3]));
  EXPECT_EQ(z[2].shape(), Shape({kT * kK, kI}));
  const std::vector<double> a0 = z[2].to_double_vector(),
                            a1 = run(true, delta(1.0))[2].to_double_vector(),
                            a2 = run(true, delta(2.0))[2].to_double_vector();
  int64_t checked = 0;
  for (std::size_t v = 0; v < a0.size(); ++v) {
    const double sg = a2[v] - a1[v];  // silu(gate), the step from up + 1 to up + 2
    if (std::fabs(sg) < 0.05) continue;
    // silu(gate) * up, from the two shifted rows, against the zero delta's row (bf16 steps).
    EXPECT_NEAR(a1[v] - sg, a0[v], 2e-2 * (std::fabs(a1[v]) + std::fabs(sg)) + 1e-3) << v;
    ++checked;
  }
  EXPECT_GT(checked, 50);
  // A gate shifted by -40 closes the Swiglu: silu(gate - 40) * up is 0 to bf16's range (after
  // the activation the shift would remain), and the output moves with the delta.
  const std::vector<Tensor> shut = run(true, delta(0.0, -40.0));
  const std::vector<int64_t> idx = ints(shut[1]);
  const std::vector<double> as = shut[2].to_double_vector();
  for (int64_t i = 0; i < kT * kK; ++i) {
    const int64_t row = idx[static_cast<std::size_t>(i)];
    for (int64_t j = 0; j < kI && row >= 0; ++j) {
      ASSERT_LT(std::fabs(as[static_cast<std::size_t>(row * kI + j)]), 1e-12) << i << " " << j;
    }
  }
  EXPECT_NE(bytes(shut[0]), bytes(plain[0]));
}

// The returned fp8 activation codes: the local pairs' rows mostly nonzero, the rest zero.
void expect_codes_in_local_rows(const TrtllmMoeResult& r) {
  const std::vector<int64_t> idx = ints(r.tensors[1]);
  const auto local = static_cast<std::size_t>(
      std::count_if(idx.begin(), idx.end(), [](int64_t v) { return v >= 0; }));
  const std::vector<uint8_t> c = bytes(r.tensors[2]);
  const std::size_t I = c.size() / idx.size();
  ASSERT_GT(local, 0u);
  const auto nonzero = static_cast<std::size_t>(
      std::count_if(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(local * I),
                    [](uint8_t v) { return v != 0; }));
  EXPECT_GT(nonzero, local * I / 2);
  EXPECT_TRUE(std::all_of(c.begin() + static_cast<std::ptrdiff_t>(local * I), c.end(),
                          [](uint8_t v) { return v == 0; }));
}

// The FP8 forms' delta against the op over the summed weights: the finalized list bit for bit
// (codes included), the output moved by the delta, the unfinalized list's activation and map.
template <class Run>
void check_fp8_lora_delta(const Run& run, const Tensor& w1, const LoraDelta& l) {
  const Tensor zero = Tensor::zeros({kT, kK, 2 * kI}, DType::kBFloat16);
  const TrtllmMoeResult ref = run(l.w1_sum, true, zero), got = run(w1, true, l.delta);
  ASSERT_EQ(got.tensors.size(), 3u);
  EXPECT_EQ(got.tensors[2].dtype(), DType::kUInt8);
  EXPECT_EQ(got.tensors[2].shape(), Shape({kT * kK, kI}));
  expect_codes_in_local_rows(got);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(bytes(got.tensors[i]), bytes(ref.tensors[i])) << i;
  EXPECT_EQ(bytes(ref.tensors[0]), bytes(run(l.w1_sum, true, std::nullopt).tensors[0]));
  EXPECT_NE(bytes(got.tensors[0]), bytes(run(w1, true, std::nullopt).tensors[0]));
  const TrtllmMoeResult unfin = run(w1, false, l.delta);
  ASSERT_EQ(unfin.tensors.size(), 4u);
  EXPECT_EQ(bytes(unfin.tensors[3]), bytes(got.tensors[2]));
  EXPECT_EQ(bytes(unfin.tensors[2]), bytes(got.tensors[1]));
}

// DeepSeek FP8 (block scales 1, integer-valued e4m3 operands, so GEMM1 is exact): the delta is
// bit for bit the op over w1 + dW1; the returned activation is GEMM2's e4m3 input codes (uint8,
// as upstream's; their per-128 scales are not returned).
TEST(TrtllmMoeLoraDelta, DeepSeekFp8IsTheOpOverTheSummedWeights) {
  const Routed r;
  const Tensor x = int_valued({kT, kH}, -2, 2, 11, DType::kFloat8E4M3FN);
  const Tensor w1 = int_valued({kLocal, 2 * kI, kH}, -1, 1, 12, DType::kFloat8E4M3FN);
  const Tensor w2 = int_valued({kLocal, kH, kI}, -1, 1, 14, DType::kFloat8E4M3FN);
  const LoraDelta l(r, x, w1, kH, kI, DType::kFloat8E4M3FN);
  const Tensor xs = Tensor::full({kH / 128, kT}, 1.0, DType::kFloat32);
  const Tensor s1 = Tensor::full({kLocal, 2 * kI / 128, kH / 128}, 1.0, DType::kFloat32);
  const Tensor s2 = Tensor::full({kLocal, kH / 128, kI / 128}, 1.0, DType::kFloat32);
  auto run = [&](const Tensor& weights1, bool fin, std::optional<Tensor> d,
                 Fp8QuantizationType q = Fp8QuantizationType::DeepSeekFp8) {
    return trtllm_fp8_block_scale_routed_moe(r.packed, std::nullopt, x, xs, weights1, s1, w2, s2,
                                             kE, kK, std::nullopt, std::nullopt, kI, kOff, kLocal,
                                             std::nullopt, 1, false, WeightLayout::MajorK, fin,
                                             std::nullopt, std::move(d), std::nullopt, 8192, q);
  };
  check_fp8_lora_delta(run, w1, l);
}

// MxFp8 (ue8m0 scales of 1, integer-valued e4m3 operands): the same, the activation returned as
// its MXFP8 e4m3 codes.
TEST(TrtllmMoeLoraDelta, MxFp8IsTheOpOverTheSummedWeights) {
  const Routed r;
  const Tensor x = int_valued({kT, kH}, -2, 2, 21, DType::kFloat8E4M3FN);
  const Tensor w1 = int_valued({kLocal, 2 * kI, kH}, -1, 1, 22, DType::kFloat8E4M3FN);
  const Tensor w2 = int_valued({kLocal, kH, kI}, -1, 1, 24, DType::kFloat8E4M3FN);
  const LoraDelta l(r, x, w1, kH, kI, DType::kFloat8E4M3FN);
  const Tensor xs = Tensor::full({kT, kH / 32}, 127, DType::kUInt8);
  const Tensor s1 = Tensor::full({kLocal, 2 * kI, kH / 32}, 127, DType::kUInt8);
  const Tensor s2 = Tensor::full({kLocal, kH, kI / 32}, 127, DType::kUInt8);
  auto run = [&](const Tensor& weights1, bool fin, std::optional<Tensor> d) {
    return trtllm_fp8_block_scale_routed_moe(
        r.packed, std::nullopt, x, xs, weights1, s1, w2, s2, kE, kK, std::nullopt, std::nullopt, kI,
        kOff, kLocal, std::nullopt, 1, false, WeightLayout::MajorK, fin, std::nullopt, std::move(d),
        std::nullopt, 8192, Fp8QuantizationType::MxFp8);
  };
  check_fp8_lora_delta(run, w1, l);
}

TEST(TrtllmMoeLoraDelta, BadInputNamesTheArgument) {
  const Routed r;
  const LoraCase c(r);
  const char* op = "trtllm_bf16_routed_moe";
  EXPECT_FI_ERROR(c.run(r, c.w1, true, c.delta.to(DType::kFloat32)), op, "gemm1_lora_delta");
  EXPECT_FI_ERROR(c.run(r, c.w1, true, c.delta.slice(0, 0, kT - 1)), op, "gemm1_lora_delta");
  EXPECT_FI_ERROR(c.run(r, c.w1, true, c.delta.slice(2, 0, c.I)), op, "gemm1_lora_delta");
  // A non-gated activation (Relu2) has no gate half for the delta's columns.
  const Tensor w1_relu = c.w1.slice(1, 0, c.I).contiguous();
  EXPECT_FI_ERROR(
      trtllm_bf16_routed_moe(r.packed, c.x, w1_relu, c.w2, kE, kK, std::nullopt, std::nullopt, c.I,
                             kOff, kLocal, std::nullopt, 1, false, WeightLayout::MajorK, true, true,
                             c.delta, 8192, static_cast<int64_t>(ActivationType::Relu2)),
      op, "activation_type");
}

// ---- bad input -----------------------------------------------------------------------------

TEST(TrtllmMoeUnfinalized, BadInputNamesTheArgument) {
  const Bf16Case c;
  const Routed r;
  // The unfinalized list is not one tensor.
  EXPECT_FI_ERROR((void)static_cast<Tensor>(c.run(r.packed, false)), "TrtllmMoeResult",
                  "do_finalize");
  // The other arguments are still checked.
  EXPECT_FI_ERROR((void)trtllm_bf16_routed_moe(r.packed, c.x.slice(1, 0, 32), c.w1, c.w2, kE, kK,
                                               std::nullopt, std::nullopt, c.I, c.offset, c.local,
                                               std::nullopt, 1, false, WeightLayout::MajorK, false),
                  "trtllm_bf16_routed_moe", "gemm1_weights");
}

// Upstream writes `output` only when it finalizes (and passes a [T, 0] placeholder otherwise):
// an unfinalized call neither checks nor writes it.
TEST(TrtllmMoeUnfinalized, OutputIsLeftAlone) {
  const Bf16Case c;
  const Routed r;
  const Tensor placeholder = Tensor::empty({kT, 0}, DType::kBFloat16);
  Tensor full = Tensor::full({kT, c.H}, 3.0, DType::kBFloat16);
  for (const Tensor& out : {placeholder, full}) {
    const TrtllmMoeResult u = trtllm_bf16_routed_moe(
        r.packed, c.x, c.w1, c.w2, kE, kK, std::nullopt, std::nullopt, c.I, c.offset, c.local,
        std::nullopt, 1, false, WeightLayout::MajorK, false, true, std::nullopt, 8192, 3,
        std::nullopt, std::nullopt, std::nullopt, std::nullopt, out);
    EXPECT_EQ(u.tensors.size(), 3u);
  }
  EXPECT_TRUE(all_close(full, Tensor::full({kT, c.H}, 3.0, DType::kBFloat16), {0, 0}));
  Tensor x = fp8_tensor({kT, kH}, 31), xs = rand_tensor({1, kT}, DType::kFloat32, 32, 0.5, 1.0);
  const TrtllmMoeResult f = trtllm_fp8_block_scale_routed_moe(
      r.packed, std::nullopt, x, xs, fp8_tensor({kLocal, 2 * kI, kH}, 33),
      rand_tensor({kLocal, 2, 1}, DType::kFloat32, 35, 0.02, 0.04),
      fp8_tensor({kLocal, kH, kI}, 34),
      rand_tensor({kLocal, 1, 1}, DType::kFloat32, 36, 0.02, 0.04), kE, kK, std::nullopt,
      std::nullopt, kI, kOff, kLocal, std::nullopt, 1, false, WeightLayout::MajorK, false,
      std::nullopt, std::nullopt, Tensor::empty({kT, 0}, DType::kBFloat16));
  EXPECT_EQ(f.tensors.size(), 3u);
}

TEST(TrtllmMoeUnfinalized, CudaRefusedSoReplayFallsBack) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Routed r;
  const Device d = Device::cuda(0);
  Tensor x = fp8_tensor({kT, kH}, 31), xs = rand_tensor({1, kT}, DType::kFloat32, 32, 0.5, 1.0);
  EXPECT_FI_ERROR(
      (void)trtllm_fp8_block_scale_routed_moe(
          r.packed.to(d), std::nullopt, x.to(d), xs.to(d),
          fp8_tensor({kLocal, 2 * kI, kH}, 33).to(d),
          rand_tensor({kLocal, 2, 1}, DType::kFloat32, 35, 0.02, 0.04).to(d),
          fp8_tensor({kLocal, kH, kI}, 34).to(d),
          rand_tensor({kLocal, 1, 1}, DType::kFloat32, 36, 0.02, 0.04).to(d), kE, kK, std::nullopt,
          std::nullopt, kI, kOff, kLocal, std::nullopt, 1, false, WeightLayout::MajorK, false),
      "trtllm_fp8_block_scale_routed_moe", "do_finalize");
}

// FP8 per tensor with use_routing_scales_on_input (Llama4, top-1): upstream applies the routing
// weight to GEMM1's output through the per-token scales (token_scales = expert_weights) and its
// finalize reads no weights (expertWeightsPtr = nullptr), so gemm2_output's rows already carry
// the weight while expert_weights still holds the routing weights. Finalizing by hand with
// weight 1 gives the op's finalized output bit for bit.
TEST(TrtllmMoeUnfinalized, Fp8PerTensorRoutingScalesOnInput) {
  const int64_t T = kT;
  Tensor logits = rand_tensor({T, kE}, DType::kFloat32, 91, -2.0, 2.0);
  Tensor x = fp8_tensor({T, kH}, 92);
  Tensor w1 = fp8_tensor({kLocal, 2 * kI, kH}, 93), w2 = fp8_tensor({kLocal, kH, kI}, 94);
  // Scales near 1 keep the outputs well above the bf16 tolerance (the comparison of the rows
  // with and without the on-input weights below must not pass on tiny values).
  Tensor s = rand_tensor({kLocal}, DType::kFloat32, 95, 0.3, 0.6);
  auto run = [&](bool on_input, bool fin) {
    return trtllm_fp8_per_tensor_scale_moe(logits, std::nullopt, x, w1, s, s, w2, s, kE, 1,
                                           std::nullopt, std::nullopt, kI, kOff, kLocal, 1.0,
                                           on_input, 3, fin);
  };
  const std::vector<Tensor> u = run(true, false).tensors;
  const Tensor fin = run(true, true).tensors[0];
  ASSERT_EQ(u.size(), 3u);
  const std::vector<double> lg = logits.to_double_vector(), w = u[1].to_double_vector();
  const std::vector<int64_t> idx = ints(u[2]);
  ASSERT_EQ(u[1].shape(), Shape({T, 1}));
  ASSERT_EQ(u[1].dtype(), DType::kBFloat16);
  int64_t local_tokens = 0;
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    const auto row = lg.begin() + t * kE;
    const int64_t e = std::max_element(row, row + kE) - row;
    ids.push_back(e);
    // Llama4: the weight is sigmoid of the top logit, in bf16.
    EXPECT_EQ(w[static_cast<size_t>(t)], bf16(1.0 / (1.0 + std::exp(-row[e])))) << t;
    const bool local = e >= kOff && e < kOff + kLocal;
    EXPECT_EQ(idx[static_cast<size_t>(t)] >= 0, local) << t;
    local_tokens += local ? 1 : 0;
  }
  ASSERT_GT(local_tokens, 0);
  ASSERT_LT(local_tokens, T);
  // Finalized = the token's row with weight 1 (zero for a token with no local expert).
  const std::vector<double> rows = u[0].to_double_vector(), out = fin.to_double_vector();
  double big = 0.0;
  for (double v : rows) big = std::max(big, std::abs(v));
  EXPECT_GT(big, 0.5);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = idx[static_cast<size_t>(t)];
    for (int64_t c = 0; c < kH; ++c) {
      EXPECT_EQ(out[static_cast<size_t>(t * kH + c)],
                r < 0 ? 0.0 : rows[static_cast<size_t>(r * kH + c)])
          << t << "," << c;
    }
  }
  // The rows carry the routing weight: without use_routing_scales_on_input they differ.
  const std::vector<Tensor> plain = run(false, false).tensors;
  EXPECT_FALSE(all_close(plain[0], u[0], default_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(all_close(plain[1], u[1], {0, 0}));
  EXPECT_TRUE(all_close(plain[2], u[2], {0, 0}));
}

}  // namespace
}  // namespace flashinfer::testing
