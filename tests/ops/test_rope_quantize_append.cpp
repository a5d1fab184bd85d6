// rope_quantize_fp8_append_paged_kv_cache: GQA (NHD/HND, e4m3/e5m2, partial rope) and MLA; the
// queries bit-exact with rope_quantize_fp8, every appended cache slot bit-exact with its keys and
// with the saturating conversion of the scaled values, the rotated keys within half an fp8 step of
// the fp64 rotation, untouched slots unchanged; bad input; record and replay; a Python-written
// upstream-format dump (upstream's test call style) replays with every call passing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "flashinfer/float_formats.h"
#include "flashinfer/ops/backends.h"
#include "flashinfer/ops/rope_quantize.h"
#include "flashinfer/ops/rope_quantize_append.h"
#include "flashinfer/replay.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer {
namespace {

constexpr const char* kOp = "rope_quantize_fp8_append_paged_kv_cache";

Tensor i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kInt32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

uint8_t byte_at(const Tensor& t, std::initializer_list<int64_t> idx) {
  int64_t off = 0, d = 0;
  for (int64_t i : idx) off += i * t.stride(d++);
  return static_cast<const uint8_t*>(t.data_ptr())[off];
}

// Two requests: request 0 owns pages {3, 0}, request 1 page {2}; tokens (batch, position).
struct Layout {
  std::vector<int32_t> indices = {3, 0, 2}, indptr = {0, 2, 3}, bi = {0, 0, 1, 1, 0},
                       pos = {2, 5, 0, 3, 6};
  int64_t pages = 5, ps = 4;
  std::pair<int64_t, int64_t> slot(int64_t i) const {
    return {indices[indptr[bi[i]] + pos[i] / ps], pos[i] % ps};
  }
};

// MLA inputs (2-D latent k) of nnz 5 tokens, 4 query heads, rope 8, nope 32, random from `seed`,
// with zeroed e4m3 ckv / kpe caches for L's pages.
struct MlaCase {
  static constexpr int64_t kNnz = 5, kHeads = 4, kRope = 8, kNope = 32;
  Tensor qr, kr, qn, kn, cs, pids, ckv, kpe;
  MlaCase(const Layout& L, uint64_t seed)
      : qr(testing::rand_tensor({kNnz, kHeads, kRope}, DType::kBFloat16, seed)),
        kr(testing::rand_tensor({kNnz, kRope}, DType::kBFloat16, seed + 1)),
        qn(testing::rand_tensor({kNnz, kHeads, kNope}, DType::kBFloat16, seed + 2)),
        kn(testing::rand_tensor({kNnz, kNope}, DType::kBFloat16, seed + 3)),
        cs(testing::rand_tensor({16, kRope}, DType::kFloat32, seed + 4, -1.0, 1.0)),
        pids(i32({3, 4, 5, 6, 7})),
        ckv(Tensor::zeros({L.pages, L.ps, kNope}, DType::kFloat8E4M3FN)),
        kpe(Tensor::zeros({L.pages, L.ps, kRope}, DType::kFloat8E4M3FN)) {}
};

TEST(RopeQuantizeAppend, GqaSlotsMatchRopeQuantizeAndFormulas) {
  Layout L;
  int idx = 0;
  for (bool hnd : {false, true}) {
    for (DType qd : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      SCOPED_TRACE(::testing::Message() << (hnd ? "HND " : "NHD ") << dtype_torch_name(qd));
      const int64_t nnz = 5, H = 4, Hk = 2, rope = 16, nope = idx % 2 == 0 ? 16 : 0;
      const int64_t D = rope + nope;
      const DType in = idx % 2 == 0 ? DType::kBFloat16 : DType::kFloat16;
      const Tensor qr = testing::rand_tensor({nnz, H, rope}, in, 100 + idx);
      const Tensor kr = testing::rand_tensor({nnz, Hk, rope}, in, 110 + idx);
      std::optional<Tensor> qn, kn;
      if (nope > 0) {
        qn = testing::rand_tensor({nnz, H, nope}, in, 120 + idx);
        kn = testing::rand_tensor({nnz, Hk, nope}, in, 130 + idx);
      }
      const Tensor v = testing::rand_tensor({nnz, Hk, D}, in, 140 + idx, -3.0, 3.0);
      const Tensor cs = testing::rand_tensor({16, rope}, DType::kFloat32, 150 + idx, -1.0, 1.0);
      const Tensor pids = i32({7, 1, 3, 0, 12});
      const Shape shape = hnd ? Shape{L.pages, Hk, L.ps, D} : Shape{L.pages, L.ps, Hk, D};
      Tensor kc = Tensor::full(shape, 0.0, qd), vc = Tensor::full(shape, 0.0, qd);
      std::memset(kc.data_ptr(), 0x11, kc.nbytes());
      std::memset(vc.data_ptr(), 0x22, vc.nbytes());
      const double skv = 0.5;
      auto [qro, qno] = rope_quantize_fp8_append_paged_kv_cache(
          qr, kr, qn, kn, v, cs, pids, PagedKVCache(kc, vc), i32(L.indices), i32(L.indptr),
          i32(L.bi), i32(L.pos), idx < 2, qd, 0.75, skv, L.ps, hnd ? "HND" : "NHD");
      auto [wqr, wkr, wqn, wkn] =
          rope_quantize_fp8(qr, kr, qn, kn, cs, pids, idx < 2, qd, 0.75, skv);
      EXPECT_TRUE(testing::all_close(qro, wqr, {0, 0}));
      EXPECT_TRUE(testing::all_close(qno, wqn, {0, 0}));
      std::vector<char> written(static_cast<std::size_t>(L.pages * L.ps), 0);
      const std::vector<double> vd = v.to_double_vector(), kd = kr.to_double_vector(),
                                csd = cs.to_double_vector();
      std::vector<double> got_rot, want_rot;
      for (int64_t i = 0; i < nnz; ++i) {
        const auto [page, s] = L.slot(i);
        written[page * L.ps + s] = 1;
        for (int64_t h = 0; h < Hk; ++h) {
          for (int64_t e = 0; e < D; ++e) {
            const uint8_t kb = hnd ? byte_at(kc, {page, h, s, e}) : byte_at(kc, {page, s, h, e});
            const uint8_t vb = hnd ? byte_at(vc, {page, h, s, e}) : byte_at(vc, {page, s, h, e});
            const uint8_t want_k =
                e < rope ? byte_at(wkr, {i, h, e}) : byte_at(wkn, {i, h, e - rope});
            EXPECT_EQ(kb, want_k) << i << " " << h << " " << e;
            const float x = static_cast<float>(vd[(i * Hk + h) * D + e]) * static_cast<float>(skv);
            EXPECT_EQ(vb, qd == DType::kFloat8E4M3FN ? float_to_e4m3fn_bits(x, true)
                                                     : float_to_e5m2_bits(x, true));
          }
          // The rotated key against the fp64 rotation (NeoX halves or interleaved pairs).
          const int64_t p = pids.data<int32_t>()[i];
          for (int64_t e = 0; e < rope; ++e) {
            const int64_t half = rope / 2;
            const bool neox = idx < 2;
            const int64_t j = neox ? e % half : e / 2;
            const double c = csd[p * rope + j], sn = csd[p * rope + half + j];
            const auto at = [&](int64_t f) { return kd[(i * Hk + h) * rope + f]; };
            double r;
            if (neox) {
              r = e < half ? at(e) * c - at(e + half) * sn : at(e) * c + at(e - half) * sn;
            } else {
              r = e % 2 == 0 ? at(e) * c - at(e + 1) * sn : at(e) * c + at(e - 1) * sn;
            }
            want_rot.push_back(r * skv);
            const uint8_t kb = hnd ? byte_at(kc, {page, h, s, e}) : byte_at(kc, {page, s, h, e});
            got_rot.push_back(qd == DType::kFloat8E4M3FN ? e4m3fn_bits_to_float(kb)
                                                         : e5m2_bits_to_float(kb));
          }
        }
      }
      EXPECT_TRUE(testing::all_close(
          got_rot, want_rot,
          {qd == DType::kFloat8E4M3FN ? 0.01 : 0.02, qd == DType::kFloat8E4M3FN ? 0.0625 : 0.125}));
      // Slots no token names keep their bytes.
      for (int64_t page = 0; page < L.pages; ++page) {
        for (int64_t s = 0; s < L.ps; ++s) {
          if (written[page * L.ps + s]) continue;
          EXPECT_EQ(hnd ? byte_at(kc, {page, 1, s, 0}) : byte_at(kc, {page, s, 1, 0}), 0x11);
          EXPECT_EQ(hnd ? byte_at(vc, {page, 0, s, D - 1}) : byte_at(vc, {page, s, 0, D - 1}),
                    0x22);
        }
      }
      ++idx;
    }
  }
}

TEST(RopeQuantizeAppend, MlaWritesCkvAndKpe) {
  Layout L;
  const MlaCase m(L, 200);
  const Tensor &qr = m.qr, &kr = m.kr, &qn = m.qn, &kn = m.kn, &cs = m.cs, &pids = m.pids;
  Tensor ckv = m.ckv, kpe = m.kpe;
  auto [qro, qno] = rope_quantize_fp8_append_paged_kv_cache(
      qr, kr, qn, kn, std::nullopt, cs, pids, PagedKVCache(ckv, kpe), i32(L.indices), i32(L.indptr),
      i32(L.bi), i32(L.pos), false, std::nullopt, 1.0, 2.0, L.ps);
  auto [wqr, wkr, wqn, wkn] =
      rope_quantize_fp8(qr, kr, qn, kn, cs, pids, false, DType::kFloat8E4M3FN, 1.0, 2.0);
  EXPECT_TRUE(testing::all_close(qro, wqr, {0, 0}));
  EXPECT_TRUE(testing::all_close(qno, wqn, {0, 0}));
  for (int64_t i = 0; i < MlaCase::kNnz; ++i) {
    const auto [page, s] = L.slot(i);
    EXPECT_TRUE(testing::all_close(ckv.select(0, page).select(0, s), wkn.select(0, i), {0, 0}));
    EXPECT_TRUE(testing::all_close(kpe.select(0, page).select(0, s), wkr.select(0, i), {0, 0}));
  }
}

TEST(RopeQuantizeAppend, BadInputAndBackends) {
  Layout L;
  const Tensor qr = testing::rand_tensor({5, 2, 8}, DType::kFloat16, 300);
  const Tensor kr = testing::rand_tensor({5, 1, 8}, DType::kFloat16, 301);
  const Tensor v = testing::rand_tensor({5, 1, 8}, DType::kFloat16, 302);
  const Tensor cs = testing::rand_tensor({16, 8}, DType::kFloat32, 303);
  const Tensor pids = i32({0, 1, 2, 3, 4});
  Tensor kc = Tensor::zeros({L.pages, L.ps, 1, 8}, DType::kFloat8E4M3FN);
  Tensor vc = Tensor::zeros({L.pages, L.ps, 1, 8}, DType::kFloat8E4M3FN);
  auto call = [&](std::optional<Tensor> vv, const PagedKVCache& c, std::vector<int32_t> bi,
                  std::vector<int32_t> pos, std::vector<int32_t> indices, int64_t ps = 4,
                  std::string_view layout = "NHD") {
    rope_quantize_fp8_append_paged_kv_cache(qr, kr, std::nullopt, std::nullopt, vv, cs, pids, c,
                                            i32(indices), i32(L.indptr), i32(bi), i32(pos), true,
                                            std::nullopt, 1.0, 1.0, ps, layout);
  };
  call(v, PagedKVCache(kc, vc), L.bi, L.pos, L.indices);  // valid
  EXPECT_FI_ERROR(call(std::nullopt, PagedKVCache(kc, vc), L.bi, L.pos, L.indices), kOp, "v");
  EXPECT_FI_ERROR(call(v, PagedKVCache(kc), L.bi, L.pos, L.indices), kOp, "paged_kv_cache");
  EXPECT_FI_ERROR(call(v, PagedKVCache(kc.to(DType::kFloat8E5M2), vc), L.bi, L.pos, L.indices), kOp,
                  "paged_kv_cache");
  EXPECT_FI_ERROR(call(v, PagedKVCache(kc, vc), L.bi, L.pos, L.indices, 2), kOp, "paged_kv_cache");
  EXPECT_FI_ERROR(call(v, PagedKVCache(kc, vc), L.bi, L.pos, L.indices, 4, "HND"), kOp,
                  "paged_kv_cache");
  EXPECT_FI_ERROR(call(v, PagedKVCache(kc, vc), {0, 0, 1, 2, 0}, L.pos, L.indices), kOp,
                  "batch_indices");
  EXPECT_FI_ERROR(call(v, PagedKVCache(kc, vc), L.bi, {2, 5, 0, 4, 6}, L.indices), kOp,
                  "positions");
  EXPECT_FI_ERROR(call(v, PagedKVCache(kc, vc), L.bi, L.pos, {3, 9, 2}), kOp, "kv_indices");
  EXPECT_FI_ERROR(call(v.slice(2, 0, 4), PagedKVCache(kc, vc), L.bi, L.pos, L.indices), kOp, "v");
  EXPECT_FI_ERROR(rope_quantize_fp8_append_paged_kv_cache(
                      qr, kr, std::nullopt, std::nullopt, v, cs, pids, PagedKVCache(kc, vc),
                      i32(L.indices), i32(L.indptr), i32(L.bi), i32(L.pos), true, DType::kFloat16),
                  kOp, "quantize_dtype");
  EXPECT_TRUE(op_has_backend(kOp, DeviceType::kCPU));
  EXPECT_EQ(op_has_backend(kOp, DeviceType::kCUDA), cuda_compiled());
}

Tensor i64(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kInt64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

// Upstream's kernel returns before touching a token whose batch index is negative (padding):
// no cache slot is written and the caller's q output rows of that token keep their bytes. Its
// Python converts the index arrays with .int(): int64 ones give the same call.
void check_padding_tokens_skipped(Device dev) {
  Layout L;
  MlaCase c(L, 300);
  const std::vector<int32_t> bi = {0, -1, 1, -1, 0};
  auto run = [&](bool int64, Tensor& ckv, Tensor& kpe, Tensor& qro, Tensor& qno) {
    auto idx = [&](const std::vector<int32_t>& v) { return (int64 ? i64(v) : i32(v)).to(dev); };
    rope_quantize_fp8_append_paged_kv_cache(
        c.qr.to(dev), c.kr.to(dev), c.qn.to(dev), c.kn.to(dev), std::nullopt, c.cs.to(dev),
        c.pids.to(dev), PagedKVCache(ckv, kpe), idx(L.indices), idx(L.indptr), idx(bi), idx(L.pos),
        true, std::nullopt, 1.0, 1.0, L.ps, "NHD", qro, qno);
  };
  auto fresh = [&](DType dt, const Shape& sh) { return Tensor::full(sh, 3.0, dt).to(dev); };
  Tensor ckv = c.ckv.to(dev), kpe = c.kpe.to(dev);
  Tensor qro = fresh(DType::kFloat8E4M3FN, c.qr.shape()),
         qno = fresh(DType::kFloat8E4M3FN, c.qn.shape());
  run(false, ckv, kpe, qro, qno);
  // Reference: the three real tokens alone, through rope_quantize_fp8.
  auto [qr_all, kr_all, qn_all, kn_all] = rope_quantize_fp8(c.qr, c.kr, c.qn, c.kn, c.cs, c.pids);
  const Tensor hc = ckv.to(Device::cpu()), hk = kpe.to(Device::cpu());
  const Tensor hqr = qro.to(Device::cpu()), hqn = qno.to(Device::cpu());
  for (int64_t i = 0; i < MlaCase::kNnz; ++i) {
    const auto [page, slot] = L.slot(i);
    for (int64_t e = 0; e < MlaCase::kNope; ++e) {
      const uint8_t want = bi[i] < 0 ? 0 : byte_at(kn_all, {i, e});
      EXPECT_EQ(byte_at(hc, {page, slot, e}), want) << i << " " << e;
    }
    for (int64_t e = 0; e < MlaCase::kRope; ++e) {
      const uint8_t want = bi[i] < 0 ? 0 : byte_at(kr_all, {i, e});
      EXPECT_EQ(byte_at(hk, {page, slot, e}), want) << i << " " << e;
    }
    // q rows: a padding token's keep the caller's 3.0 (e4m3 0x44).
    for (int64_t h = 0; h < MlaCase::kHeads; ++h) {
      for (int64_t e = 0; e < MlaCase::kRope; ++e) {
        EXPECT_EQ(byte_at(hqr, {i, h, e}), bi[i] < 0 ? 0x44 : byte_at(qr_all, {i, h, e}));
      }
      EXPECT_EQ(byte_at(hqn, {i, h, 0}), bi[i] < 0 ? 0x44 : byte_at(qn_all, {i, h, 0}));
    }
  }
  // int64 index arrays: the same bytes.
  Tensor ckv2 = c.ckv.to(dev), kpe2 = c.kpe.to(dev);
  Tensor qro2 = fresh(DType::kFloat8E4M3FN, c.qr.shape()),
         qno2 = fresh(DType::kFloat8E4M3FN, c.qn.shape());
  run(true, ckv2, kpe2, qro2, qno2);
  EXPECT_TRUE(testing::same_values(ckv2, ckv));
  EXPECT_TRUE(testing::same_values(kpe2, kpe));
  EXPECT_TRUE(testing::same_values(qro2, qro));
  EXPECT_TRUE(testing::same_values(qno2, qno));
}

TEST(RopeQuantizeAppend, PaddingTokensAreSkippedAndInt64IndicesAccepted) {
  check_padding_tokens_skipped(Device::cpu());
}

TEST(RopeQuantizeAppendCuda, PaddingTokensAreSkippedAndInt64IndicesAccepted) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  check_padding_tokens_skipped(Device::cuda());
}

// On the device: the same q outputs and the same cache bytes as the CPU reference, GQA in both
// layouts and fp8 kinds (with and without a nope part) and MLA; a bad slot is an Error before
// any write.
TEST(RopeQuantizeAppendCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device cuda = Device::cuda(0);
  Layout L;
  auto dev = [&](const Tensor& t) { return t.to(cuda); };
  for (bool hnd : {false, true}) {
    for (DType qd : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      const int64_t nnz = 5, H = 4, Hk = 2, rope = 16, nope = hnd ? 0 : 16, D = rope + nope;
      const DType in = hnd ? DType::kFloat16 : DType::kBFloat16;
      const Tensor qr = testing::rand_tensor({nnz, H, rope}, in, 500);
      const Tensor kr = testing::rand_tensor({nnz, Hk, rope}, in, 501);
      std::optional<Tensor> qn, kn;
      if (nope > 0) {
        qn = testing::rand_tensor({nnz, H, nope}, in, 502);
        kn = testing::rand_tensor({nnz, Hk, nope}, in, 503);
      }
      const Tensor v = testing::rand_tensor({nnz, Hk, D}, in, 504, -300.0, 300.0);
      const Tensor cs = testing::rand_tensor({16, rope}, DType::kFloat32, 505, -1.0, 1.0);
      const Tensor pids = i32({3, 4, 5, 6, 7});
      const Shape cshape = hnd ? Shape{L.pages, Hk, L.ps, D} : Shape{L.pages, L.ps, Hk, D};
      Tensor kc = Tensor::zeros(cshape, qd), vc = Tensor::zeros(cshape, qd);
      Tensor dkc = dev(kc), dvc = dev(vc);
      const std::string_view layout = hnd ? "HND" : "NHD";
      auto [qro, qno] = rope_quantize_fp8_append_paged_kv_cache(
          qr, kr, qn, kn, v, cs, pids, PagedKVCache(kc, vc), i32(L.indices), i32(L.indptr),
          i32(L.bi), i32(L.pos), true, qd, 1.5, 0.75, L.ps, layout);
      auto [dqro, dqno] = rope_quantize_fp8_append_paged_kv_cache(
          dev(qr), dev(kr), qn ? std::optional<Tensor>(dev(*qn)) : std::nullopt,
          kn ? std::optional<Tensor>(dev(*kn)) : std::nullopt, dev(v), dev(cs), dev(pids),
          PagedKVCache(dkc, dvc), dev(i32(L.indices)), dev(i32(L.indptr)), dev(i32(L.bi)),
          dev(i32(L.pos)), true, qd, 1.5, 0.75, L.ps, layout);
      EXPECT_TRUE(testing::all_close(dqro.to(Device::cpu()), qro, {0, 0}));
      EXPECT_TRUE(testing::all_close(dkc.to(Device::cpu()), kc, {0, 0})) << layout;
      EXPECT_TRUE(testing::all_close(dvc.to(Device::cpu()), vc, {0, 0})) << layout;
    }
  }
  // MLA: ckv and kpe.
  const MlaCase m(L, 600);
  const Tensor &qr = m.qr, &kr = m.kr, &qn = m.qn, &kn = m.kn, &cs = m.cs, &pids = m.pids;
  Tensor ckv = m.ckv, kpe = m.kpe;
  Tensor dckv = dev(ckv), dkpe = dev(kpe);
  rope_quantize_fp8_append_paged_kv_cache(
      qr, kr, qn, kn, std::nullopt, cs, pids, PagedKVCache(ckv, kpe), i32(L.indices), i32(L.indptr),
      i32(L.bi), i32(L.pos), false, std::nullopt, 1.0, 2.0, L.ps);
  rope_quantize_fp8_append_paged_kv_cache(dev(qr), dev(kr), dev(qn), dev(kn), std::nullopt, dev(cs),
                                          dev(pids), PagedKVCache(dckv, dkpe), dev(i32(L.indices)),
                                          dev(i32(L.indptr)), dev(i32(L.bi)), dev(i32(L.pos)),
                                          false, std::nullopt, 1.0, 2.0, L.ps);
  EXPECT_TRUE(testing::all_close(dckv.to(Device::cpu()), ckv, {0, 0}));
  EXPECT_TRUE(testing::all_close(dkpe.to(Device::cpu()), kpe, {0, 0}));
  EXPECT_FI_ERROR(rope_quantize_fp8_append_paged_kv_cache(
                      dev(qr), dev(kr), dev(qn), dev(kn), std::nullopt, dev(cs), dev(pids),
                      PagedKVCache(dckv, dkpe), dev(i32({3, 9, 2})), dev(i32(L.indptr)),
                      dev(i32(L.bi)), dev(i32(L.pos)), false, std::nullopt, 1.0, 2.0, L.ps),
                  kOp, "kv_indices");
}

TEST(RopeQuantizeAppend, RecordAndReplay) {
  Layout L;
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    Tensor kc = Tensor::zeros({L.pages, 2, L.ps, 16}, DType::kFloat8E4M3FN);
    Tensor vc = Tensor::zeros({L.pages, 2, L.ps, 16}, DType::kFloat8E4M3FN);
    rope_quantize_fp8_append_paged_kv_cache(testing::rand_tensor({5, 4, 8}, DType::kBFloat16, 400),
                                            testing::rand_tensor({5, 2, 8}, DType::kBFloat16, 401),
                                            testing::rand_tensor({5, 4, 8}, DType::kBFloat16, 402),
                                            testing::rand_tensor({5, 2, 8}, DType::kBFloat16, 403),
                                            testing::rand_tensor({5, 2, 16}, DType::kBFloat16, 404),
                                            testing::rand_tensor({16, 8}, DType::kFloat32, 405),
                                            i32({0, 1, 2, 3, 4}), PagedKVCache(kc, vc),
                                            i32(L.indices), i32(L.indptr), i32(L.bi), i32(L.pos),
                                            false, std::nullopt, 1.0, 1.0, L.ps, "HND");
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(testing::replays_identically(calls[0]));
}

// Written by Python as upstream's recorder writes upstream's own test call (twelve positional
// arguments, then page_size, kv_layout, quantize_dtype, scales, is_neox and enable_pdl by keyword),
// in upstream's safetensors format (the torch here predates float8, so .pt cannot hold the fp8
// caches): results (q_rope_out, q_nope_out) computed in fp32 the way the kernels round, and the
// cache this library's recorder would save as mutated.* added so the appended slots are checked.
TEST(RopeQuantizeAppend, UpstreamWrittenDumpReplays) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_rqa_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string py = R"PY(
import json, os, struct, sys
try:
    import torch
except ImportError:
    sys.exit(77)
root = sys.argv[1]
torch.manual_seed(11)
nnz, H, HK, R, N, PS, P = 3, 4, 2, 8, 8, 4, 3
qr = torch.randn(nnz, H, R).to(torch.bfloat16)
kr = torch.randn(nnz, HK, R).to(torch.bfloat16)
qn = torch.randn(nnz, H, N).to(torch.bfloat16)
kn = torch.randn(nnz, HK, N).to(torch.bfloat16)
v = torch.randn(nnz, HK, R + N).to(torch.bfloat16)
cs = torch.rand(16, R) * 2 - 1
pids = torch.tensor([5, 6, 7], dtype=torch.int32)
indices = torch.tensor([2, 0, 1], dtype=torch.int32)
indptr = torch.tensor([0, 2, 3], dtype=torch.int32)
bi = torch.tensor([0, 0, 1], dtype=torch.int32)
pos = torch.tensor([3, 4, 0], dtype=torch.int32)
def rot(x):  # interleaved (is_neox=False) pairs, fp32: two products then a difference / sum
    x = x.float()
    c = cs[pids.long(), : R // 2][:, None, :]
    s = cs[pids.long(), R // 2 :][:, None, :]
    e, o = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = e * c - o * s
    out[..., 1::2] = o * c + e * s
    return out
# This torch has no float8: e4m3fn codes by round-to-nearest-even over the code table (the values
# here stay far from the saturation bound).
def e4m3(code):
    e, m = (code >> 3) & 15, code & 7
    return (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
TABLE = [(e4m3(c), c) for c in range(0x7F)]
def f8(x):
    a = abs(x)
    best = min(TABLE, key=lambda vc: (abs(vc[0] - a), vc[1] & 1))
    return best[1] | (0x80 if x < 0 and best[1] != 0 else 0)
def q8(t):
    flat = [f8(float(x)) for x in t.reshape(-1).tolist()]
    return torch.tensor(flat, dtype=torch.uint8).reshape(t.shape)
q_rope_out = q8(rot(qr))
q_nope_out = q8(qn.float())
kc = torch.zeros(P, PS, HK, R + N, dtype=torch.uint8)
vc = torch.zeros(P, PS, HK, R + N, dtype=torch.uint8)
kq = q8(torch.cat([rot(kr), kn.float()], -1))
vq = q8(v.float())
for i in range(nnz):
    page = int(indices[int(indptr[int(bi[i])]) + int(pos[i]) // PS])
    kc[page, int(pos[i]) % PS] = kq[i]
    vc[page, int(pos[i]) % PS] = vq[i]
def save(path, tensors):  # spec safetensors: u64 header length, JSON header, raw bytes
    header, blobs, off = {}, [], 0
    for name, (t, dt) in tensors.items():
        t = t.contiguous()
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
d = os.path.join(root, "20261122_210000_001_pid4242_rope_quantize_fp8_append_paged_kv_cache_call0001")
os.makedirs(d)
zero = torch.zeros(P, PS, HK, R + N, dtype=torch.uint8)
inputs = {"arg_0": (qr, "BF16"), "arg_1": (kr, "BF16"), "arg_2": (qn, "BF16"), "arg_3": (kn, "BF16"),
          "arg_4": (v, "BF16"), "arg_5": (cs, "F32"), "arg_6": (pids, "I32"),
          "arg_7__0": (zero, "F8_E4M3"), "arg_7__1": (zero, "F8_E4M3"),
          "arg_8": (indices, "I32"), "arg_9": (indptr, "I32"), "arg_10": (bi, "I32"),
          "arg_11": (pos, "I32")}
save(d + "/inputs.safetensors", inputs)
save(d + "/outputs.safetensors", {"result_0": (q_rope_out, "F8_E4M3"), "result_1": (q_nope_out, "F8_E4M3")})
save(d + "/mutated.safetensors", {"arg_7__0": (kc, "F8_E4M3"), "arg_7__1": (vc, "F8_E4M3")})
def meta(shape, key):
    return {"type": "torch.Tensor", "shape": list(shape), "dtype": "torch.float8_e4m3fn",
            "stride": [PS * HK * (R + N), HK * (R + N), R + N, 1], "device": "cuda:0",
            "requires_grad": False, "is_contiguous": True, "tensor_key": key}
rec = {"function_name": "rope_quantize_fp8_append_paged_kv_cache", "module": "flashinfer.rope",
       "call_sequence": 1, "timestamp": "20261122_210000_001", "process_id": 4242,
       "input_metadata": {"arg_7": {"type": "tuple", "length": 2, "truncated": False,
                                    "items": [meta(kc.shape, "arg_7__0"), meta(vc.shape, "arg_7__1")]},
                          "kwarg_page_size": PS, "kwarg_kv_layout": "NHD",
                          "kwarg_quantize_dtype": {"type": "torch.dtype", "value": "torch.float8_e4m3fn"},
                          "kwarg_quant_scale_q": 1.0, "kwarg_quant_scale_kv": 1.0,
                          "kwarg_is_neox": False, "kwarg_enable_pdl": True},
       "output_metadata": {},
       "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": ["result_0", "result_1"],
                       "mutated_tensor_keys": ["arg_7__0", "arg_7__1"]},
       "tensor_format": "safetensors", "execution_status": "completed"}
with open(d + "/metadata.jsonl", "w") as f:
    f.write(json.dumps(rec) + "\n")
)PY";
  std::vector<replay::Result> results;
  if (!testing::run_dump_script(dir, py, dir / "dump", 1u, &results)) {
    GTEST_SKIP() << "python3-torch (with float8) not installed";
  }
  ASSERT_EQ(results.size(), 1u);
  EXPECT_GE(results[0].comparisons.size(), 4u);
}

}  // namespace
}  // namespace flashinfer
