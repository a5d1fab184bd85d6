// The Hopper MLA decode kernel's CuTe layouts (src/kernels/cuda/mla_sm90_traits.h), evaluated on
// the CPU where the build has CUTLASS's headers: one tile of the latent cache is K of S = Q K^T
// and V of O += P V (the two views name the same element at every (token, dim)), the copies'
// 16-byte units land contiguously and once, the accumulator coordinates the kernel's masks,
// softmax rows and epilogue assume, and P written from S is the A operand of P V value for value.
// Also, without CuTe: the launcher's rule and the shared memory (src/kernels/cuda/mla_sm90.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>

#include "kernels/cuda/mla_sm90.h"

#if FLASHINFER_TEST_HAVE_CUTE
#include "kernels/cuda/mla_sm90_traits.h"
#include "util/wgmma_accumulator.h"
#endif

namespace flashinfer::kernels::cuda::mla {
namespace {

MlaAttentionParams deepseek_call(DType q, DType kv, DType o) {
  MlaAttentionParams p;
  p.dim_ckv = kMmaCkv;
  p.dim_kpe = kMmaKpe;
  p.q_dtype = q;
  p.kv_dtype = kv;
  p.o_dtype = o;
  p.num_heads = 128;
  return p;
}

TEST(MlaSm90Shape, LauncherRule) {
  constexpr auto bf16 = DType::kBFloat16, f16 = DType::kFloat16, e4m3 = DType::kFloat8E4M3FN;
  const MlaAttentionParams p = deepseek_call(bf16, bf16, bf16);
  EXPECT_TRUE(mla_sm90_takes(p, 9, 0, true));
  EXPECT_FALSE(mla_sm90_takes(p, 9, 0, false)) << "opt-in";
  EXPECT_FALSE(mla_sm90_takes(p, 8, 0, true)) << "wgmma: sm_90 only";
  EXPECT_FALSE(mla_sm90_takes(p, 10, 0, true)) << "sm_90a code does not run on sm_100";
  EXPECT_TRUE(mla_sm90_takes(deepseek_call(f16, f16, f16), 9, 0, true));
  // The tensor-core kernel's dtypes: fp8 caches, trtllm's e4m3 queries with a bf16 output.
  EXPECT_TRUE(mla_sm90_takes(deepseek_call(bf16, e4m3, bf16), 9, 0, true));
  EXPECT_TRUE(mla_sm90_takes(deepseek_call(f16, DType::kFloat8E5M2, f16), 9, 0, true));
  EXPECT_TRUE(mla_sm90_takes(deepseek_call(e4m3, e4m3, bf16), 9, 0, true));
  EXPECT_FALSE(mla_sm90_takes(deepseek_call(e4m3, e4m3, f16), 9, 0, true));
  EXPECT_FALSE(mla_sm90_takes(deepseek_call(bf16, f16, bf16), 9, 0, true));
  EXPECT_FALSE(mla_sm90_takes(deepseek_call(bf16, bf16, DType::kFloat32), 9, 0, true));
  // A NoPE call (head_dim_kpe 0: vLLM's SM90 sparse MLA backend) stays on the mma.sync kernel.
  MlaAttentionParams nope = deepseek_call(bf16, e4m3, bf16);
  nope.dim_kpe = 0;
  EXPECT_FALSE(mla_sm90_takes(nope, 9, 0, true));
  // Nor does a call with per-token ckv scales (ckv_scale_arr: SGLang's DSA fp8 cache).
  MlaAttentionParams arr = deepseek_call(bf16, e4m3, bf16);
  const float scales[4] = {1, 1, 1, 1};
  arr.ckv_scale_arr = scales;
  EXPECT_FALSE(mla_sm90_takes(arr, 9, 0, true));
  // Blocks that take Q, three stages and the exchange fit an H100's / H200's 227 KiB; fp8 stages
  // take half the bytes and one 16-bit tile.
  for (bool fp8 : {false, true}) {
    EXPECT_LE(mla_sm90_smem_bytes(fp8), std::size_t{227} * 1024) << fp8;
  }
  EXPECT_EQ(mla_sm90_smem_bytes(false) - mla_sm90_smem_bytes(true),
            std::size_t{2} * kMmaKvTile * kMmaDim / 2);
}

#if FLASHINFER_TEST_HAVE_CUTE

template <class T>
void check_views() {
  using Tr = Sm90Mla<T>;
  // K: every (token, dim) once in [0, 32 x 576), 16-byte units contiguous and aligned.
  std::set<int> seen;
  for (int t = 0; t < kMmaKvTile; ++t) {
    for (int d = 0; d < kMmaDim; d += 8) {
      const int base = Tr::k_offset(t, d);
      ASSERT_EQ(base % 8, 0) << t << "," << d;
      for (int j = 0; j < 8; ++j) {
        ASSERT_EQ(Tr::k_offset(t, d + j), base + j) << t << "," << d + j;
        ASSERT_TRUE(seen.insert(base + j).second) << "K element twice";
      }
    }
  }
  ASSERT_EQ(static_cast<int>(seen.size()), Tr::kStageElems);
  EXPECT_EQ(*seen.rbegin(), Tr::kStageElems - 1);
  // V of each warpgroup is K's first 512 dims, transposed: the same element everywhere.
  for (int wd = 0; wd < kSm90MlaWarpgroups; ++wd) {
    const int base = Tr::v_half_elems(wd);
    EXPECT_EQ(base % (kSm90MlaSmemAlign / 2), 0) << "a whole number of swizzle periods";
    for (int d = 0; d < kSm90MlaHalf; ++d) {
      for (int t = 0; t < kMmaKvTile; ++t) {
        ASSERT_EQ(base + Tr::v_offset(d, t), Tr::k_offset(t, kSm90MlaHalf * wd + d))
            << "warpgroup " << wd << " dim " << d << " token " << t;
      }
    }
  }
  // Q: every (row, dim) once in [0, 64 x 576), 16-byte units contiguous.
  seen.clear();
  for (int r = 0; r < kMmaRows; ++r) {
    for (int d = 0; d < kMmaDim; d += 8) {
      const int base = Tr::q_offset(r, d);
      ASSERT_EQ(base % 8, 0);
      for (int j = 0; j < 8; ++j) {
        ASSERT_EQ(Tr::q_offset(r, d + j), base + j);
        ASSERT_TRUE(seen.insert(base + j).second) << "Q element twice";
      }
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), kMmaRows * kMmaDim);
  EXPECT_EQ(*seen.rbegin(), kMmaRows * kMmaDim - 1);
}

TEST(MlaSm90Shape, CacheTileIsKAndVAtEveryElement) {
  check_views<__nv_bfloat16>();
  check_views<__half>();
}

template <class T>
void check_fragments() {
  using namespace cute;
  using Tr = Sm90Mla<T>;
  typename Tr::MmaS mma_s;
  typename Tr::MmaO mma_o;
  ASSERT_EQ(int(size(mma_s)), 128);
  ASSERT_EQ(int(size(mma_o)), 128);
  for (int t = 0; t < 128; ++t) {
    auto thr_s = mma_s.get_thread_slice(t);
    auto thr_o = mma_o.get_thread_slice(t);
    Tensor cs = thr_s.partition_C(make_identity_tensor(Shape<_64, Int<kMmaKvTile>>{}));
    Tensor co = thr_o.partition_C(make_identity_tensor(Shape<_64, Int<kSm90MlaHalf>>{}));
    ASSERT_EQ(int(size(cs)), kMmaScoreFloats);
    ASSERT_EQ(int(size(co)), kSm90MlaHalf / 2);
    // (the kernel's fragment formula, tests/util/wgmma_accumulator.h)
    ASSERT_NO_FATAL_FAILURE(flashinfer::testing::expect_wgmma_acc_coords(cs, t, "S"));
    ASSERT_NO_FATAL_FAILURE(flashinfer::testing::expect_wgmma_acc_coords(co, t, "O"));
    // S's k-steps: 36 of 16 dims (a warpgroup runs its share of them).
    Tensor qa = thr_s.partition_A(make_identity_tensor(Shape<_64, Int<kMmaDim>>{}));
    ASSERT_EQ(int(size<2>(qa)), kMmaKSteps);
    // O += P V reads A element (a, 0, k) from register LayoutP(a, 0, k), which holds P of S value
    // LayoutP(a, 0, k): both must name the same (row, token); pairs in consecutive registers.
    Tensor ca = thr_o.partition_A(make_identity_tensor(Shape<_64, Int<kMmaKvTile>>{}));
    const typename Tr::LayoutP lp{};
    ASSERT_EQ(int(size(ca)), int(size(lp)));
    ASSERT_EQ(int(size<2>(ca)), kMmaKvTile / 16);
    for (int a = 0; a < int(size<0>(ca)); ++a) {
      for (int k = 0; k < int(size<2>(ca)); ++k) {
        ASSERT_EQ(ca(a, 0, k), cs(lp(a, 0, k))) << "thread " << t << " A value " << a;
        if (a % 2 == 0) {
          ASSERT_EQ(lp(a, 0, k) % 2, 0);
          ASSERT_EQ(lp(a + 1, 0, k), lp(a, 0, k) + 1);
        }
      }
    }
  }
}

// The kernel reads warpgroup wg's k-steps of q.k (ckv steps 16 wg + j, kpe steps 32 + 2 wg + j)
// as steps j of Q and of the tile from the step's first dim on. On the device a descriptor's start
// address is the tensor's shared address plus the step's offset in the layout; on the host CuTe
// counts the address as 0 (and says so on stdout, captured here), so the check is: step j's
// descriptor from the shifted base, its start moved by the base's shift, is the whole operand's
// step, bit for bit (start, strides, swizzle mode, base offset).
template <class T>
void check_step_bases() {
  using namespace cute;
  using Tr = Sm90Mla<T>;
  using E = typename Tr::E;
  typename Tr::MmaS mma_s;
  E* base = nullptr;  // (any address: the host descriptors leave it out)
  const auto shifted = [](GmmaDescriptor d, int elems) {
    d.bitfield.start_address_ =
        static_cast<uint16_t>(d.bitfield.start_address_ + elems * sizeof(E) / 16);
    return uint64_t(d);
  };
  ::testing::internal::CaptureStdout();
  for (int t : {0, 5, 127}) {
    auto thr = mma_s.get_thread_slice(t);
    auto frag_a = [&](E* p) {
      return thr.partition_fragment_A(make_tensor(make_smem_ptr(p), typename Tr::LayoutQ{}));
    };
    auto frag_b = [&](E* p) {
      return thr.partition_fragment_B(make_tensor(make_smem_ptr(p), typename Tr::LayoutK{}));
    };
    const auto q_all = frag_a(base);
    const auto k_all = frag_b(base);
    for (int wg = 0; wg < kSm90MlaWarpgroups; ++wg) {
      const int nope_dim = wg * 256, pe_dim = kMmaCkv + wg * 32;
      const int qn0 = Tr::q_offset(0, nope_dim), qp0 = Tr::q_offset(0, pe_dim);
      const int kn0 = Tr::k_offset(0, nope_dim), kp0 = Tr::k_offset(0, pe_dim);
      EXPECT_EQ(qn0 % 8, 0);  // whole 16-byte units
      EXPECT_EQ(qp0 % 8, 0);
      EXPECT_EQ(kn0 % 8, 0);
      EXPECT_EQ(kp0 % 8, 0);
      const auto qn = frag_a(base + qn0);
      const auto qp = frag_a(base + qp0);
      const auto kn = frag_b(base + kn0);
      const auto kp = frag_b(base + kp0);
      for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(shifted(qn(0, 0, j), qn0), uint64_t(q_all(0, 0, 16 * wg + j))) << wg << "," << j;
        EXPECT_EQ(shifted(kn(0, 0, j), kn0), uint64_t(k_all(0, 0, 16 * wg + j))) << wg << "," << j;
      }
      for (int j = 0; j < 2; ++j) {
        EXPECT_EQ(shifted(qp(0, 0, j), qp0), uint64_t(q_all(0, 0, 32 + 2 * wg + j)))
            << wg << "," << j;
        EXPECT_EQ(shifted(kp(0, 0, j), kp0), uint64_t(k_all(0, 0, 32 + 2 * wg + j)))
            << wg << "," << j;
      }
    }
  }
  (void)::testing::internal::GetCapturedStdout();
}

TEST(MlaSm90Shape, WarpgroupStepsAreTheOperandsSteps) {
  check_step_bases<__nv_bfloat16>();
  check_step_bases<__half>();
}

TEST(MlaSm90Shape, AccumulatorCoordinatesAndPFromS) {
  check_fragments<__nv_bfloat16>();
  check_fragments<__half>();
}

#endif  // FLASHINFER_TEST_HAVE_CUTE

}  // namespace
}  // namespace flashinfer::kernels::cuda::mla
