// The Hopper MLA decode kernel (mla_sm90.h says where it runs): mla_decode_mma_kernel's blocks,
// pipeline, split and outputs (mla_cuda.cu), with its products on wgmma through CuTe (sm_90a):
//   - 256 threads, two warpgroups over the block's 64 MMA rows (heads, or the packed query rows
//     of calls of 32 heads or fewer: mla_mma_pack). Warpgroup wg takes q.k's k-steps
//     16 wg .. 16 wg + 15 of the ckv part and 32 + 2 wg, 33 + 2 wg of the kpe part, as two SS
//     wgmma (m64n32k16: Q and the cache tile through matrix descriptors) into their own
//     accumulators (the ckv and kpe sums take different scales), and output dims
//     256 wg .. 256 wg + 255 of O += P V, an RS wgmma (m64n256k16: P from registers, V the
//     tile's ckv dims as the MN-major B operand);
//   - Q (once) and each 32-token tile (ckv then kpe, 576 dims a token) are copied with 16-byte
//     cp.async into the 128-byte-swizzled layouts of CuTe's GMMA atoms (mla_sm90_traits.h: the
//     tile is K and V at once), in kSm90MlaStages stages, a tile's copy overlapping the math of
//     the tiles before it; the tile's row addresses are looked up once, one token a thread, into
//     shared memory (mla_decode_mma_kernel's copies, into these layouts);
//   - each warpgroup's partial logits (log2 units) go through shared memory to the other, which
//     adds them to its own: IEEE addition is commutative, so both hold the same logits bit for
//     bit, and from them the same maxima, probabilities and sums (mla_shape.h says why);
//   - the online softmax in base 2 on the S accumulators (dev::rescale_on_new_max), P rounded to
//     16 bits in the accumulator's order, which is the A operand's (the CPU tests check it).
// Writes by cp.async are generic-proxy writes and wgmma reads shared memory through the async
// proxy: every thread fences the proxies after its copies land, before the barrier the MMAs
// follow. Barriers a tile: the top one (the tile landed; every warpgroup is done with the tile
// kSm90MlaStages before, whose stage the bottom copy then refills), the exchange, and the bottom
// one (both warpgroups waited for their MMAs of this tile). An fp8 cache (TKV = uint8_t, e4m3 or
// e5m2 as p.kv_dtype says) is copied as stored into the stages and each tile widened (exactly,
// device/fp8_widen.cuh) into one 16-bit tile: the first barrier (the stage landed; both
// warpgroups are done with the 16-bit tile), the widening by every thread, the proxy fence, the
// second barrier, then the stage's refill and the MMAs, the exchange, and no bottom barrier. An
// fp8 query (trtllm's e4m3, bf16 output) is widened into Q as it is read. Device code only,
// sm_90a.
#pragma once

#include "kernels/cuda/device/cp_async.cuh"
#include "kernels/cuda/device/fastdiv.cuh"
#include "kernels/cuda/device/fp8_widen.cuh"
#include "kernels/cuda/device/mma.cuh"
#include "kernels/cuda/device/softmax_state.cuh"
#include "kernels/cuda/mla_kernel_common.cuh"
#include "kernels/cuda/mla_sm90_traits.h"

namespace flashinfer::kernels::cuda::mla {

template <class T, class TQ, class TKV>
__global__ void __launch_bounds__(kSm90MlaThreads, 1)
    mla_sm90_kernel(MlaAttentionParams p, dev::FastDivmod page_size, int32_t chunk, float* part_o,
                    float* part_ml) {
  using namespace cute;
  using Tr = Sm90Mla<T>;
  using E = typename Tr::E;
  constexpr int kTok = kMmaKvTile;
  constexpr int kStages = kSm90MlaStages;
  constexpr int kCkvUnits = kMmaCkvUnits;           // 64 16-bit units of a token's ckv part
  constexpr int kKpeUnits = kMmaUnits - kCkvUnits;  // 8 of its kpe part
  using Dt = MlaMmaDtypes<T, TQ, TKV>;              // the mma.sync kernel's dtypes and stored rows
  constexpr bool kFp8 = Dt::kFp8, kFp8Q = Dt::kFp8Q;
  constexpr int kUS = Dt::kUS, kCkvUS = Dt::kCkvUS;
  // The 16-bit tiles the MMAs read: one a stage, or one in all for fp8 (its stages as stored).
  constexpr int kTiles16 = kFp8 ? 1 : kStages;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  // The tiles at the swizzle's 1024-byte period (mla_sm90_smem_bytes has the slack).
  const uint32_t raw_addr = dev::cp_async::smem_addr(smem_raw);
  unsigned char* smem =
      smem_raw + ((kSm90MlaSmemAlign - (raw_addr % kSm90MlaSmemAlign)) % kSm90MlaSmemAlign);
  E* q_s = reinterpret_cast<E*>(smem);  // Tr::LayoutQ
  E* kv_s = q_s + kMmaRows * kMmaDim;   // kTiles16 x Tr::LayoutK
  // fp8 only: [kStages][kTok][kUS] 16-byte units, rows as stored (only the widening reads them).
  uint4* kv8_s = reinterpret_cast<uint4*>(kv_s + kTiles16 * Tr::kStageElems);
  float4* x_s = reinterpret_cast<float4*>(kv8_s + (kFp8 ? kStages * kTok * kUS : 0));
  // The exchange: [warpgroup][4][128] float4, a thread's 16 logits as 4 16-byte slots (each
  // quarter-warp's store one 128-byte line: conflict-free).
  int64_t* c_off = reinterpret_cast<int64_t*>(x_s + kSm90MlaWarpgroups * 4 * 128);
  int64_t* k_off = c_off + kTok;  // the global addresses of the tile's ckv / kpe rows
  static_assert(
      mla_sm90_smem_bytes(kFp8) == sizeof(E) * (kMmaRows * kMmaDim + kTiles16 * Tr::kStageElems) +
                                       (kFp8 ? sizeof(uint4) * kStages * kTok * kUS : 0) +
                                       sizeof(float4) * kSm90MlaWarpgroups * 4 * 128 +
                                       2 * sizeof(int64_t) * kTok + kSm90MlaSmemAlign,
      "the launcher's shared memory");
  static_assert(kMmaScoreFloats == 16, "a thread's S accumulator: 4 float4 slots");

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  const int wg = tid / 128, wt = tid % 128;  // the warpgroup (half of the dims), its thread
  const int warp = wt / 32;                  // its warp's 16 of the 64 rows
  const int gid = lane >> 2, tid4 = lane & 3;
  // The block's MMA rows and tokens (mla_mma_block, mla_decode_mma_kernel's).
  MlaMmaBlock blk;
  if (!mla_mma_block<kSm90MlaThreads, kTok>(p, chunk, part_o, part_ml, blk)) return;
  const int n_valid = blk.n_valid, n_tiles = blk.n_tiles;
  const int32_t begin = blk.begin, stop_first = blk.stop_first, stop = blk.stop;
  const auto qrow_of = [&](int m) { return blk.qrow_of(m); };
  const auto head_of = [&](int m) { return blk.head_of(m); };
  int32_t row_stop[2];  // this thread's two rows (gid and gid + 8 of its warp's 16)
#pragma unroll
  for (int r = 0; r < 2; ++r)
    row_stop[r] = mla_mma_row_stop(p, blk, chunk, warp * 16 + gid + 8 * r);

  // fp8 (16 values of a 16-byte unit x, dims dim .. dim + 15 of row r) widened to T exactly into
  // the swizzled tile `tile` (Q's layout or the cache tile's: `offset`). Threads with bit 2 of the
  // unit's index set store their two halves in the other order, so that each 8-thread phase of a
  // store covers the 8 bank groups once (fp8_widen.cuh's fp8_unit_widen_store does the same).
  auto widen_unit = [&]<__nv_fp8_interpretation_t kKind>(E* tile, auto offset, uint4 x, int r,
                                                         int dim) {
    const uint2 e0 = dev::fp8x4_widen<T, kKind>(x.x), e1 = dev::fp8x4_widen<T, kKind>(x.y);
    const uint2 e2 = dev::fp8x4_widen<T, kKind>(x.z), e3 = dev::fp8x4_widen<T, kKind>(x.w);
    const uint4 lo = make_uint4(e0.x, e0.y, e1.x, e1.y), hi = make_uint4(e2.x, e2.y, e3.x, e3.y);
    const bool swap = ((dim >> 6) & 1) != 0;  // bit 2 of the unit's index dim / 16
    *reinterpret_cast<uint4*>(tile + offset(r, dim + (swap ? 8 : 0))) = swap ? hi : lo;
    *reinterpret_cast<uint4*>(tile + offset(r, dim + (swap ? 0 : 8))) = swap ? lo : hi;
  };
  const auto q_at = [](int r, int d) { return Tr::q_offset(r, d); };
  const auto k_at = [](int r, int d) { return Tr::k_offset(r, d); };

  // Q: MMA row m is head head_of(m) of query row qrow_of(m), ckv dims 0-511, kpe 512-575; rows
  // past the last in use are zeros. 16-bit: thread tid copies unit tid % 64 of rows tid / 64 + 4 i,
  // then kpe unit tid % 8 of rows tid / 8 + 32 i (cp.async, in the first group). fp8 (trtllm's
  // e4m3 queries): 16-byte loads of 16 values, widened into the tile (made visible to wgmma by the
  // first tile's proxy fence and barrier).
  if constexpr (!kFp8Q) {
    auto copy_part = [&]<int kUnits>(const T* base, int64_t stride_n, int64_t stride_h, int dim0) {
      const int col = tid % kUnits;
#pragma unroll
      for (int r = tid / kUnits; r < kMmaRows; r += kSm90MlaThreads / kUnits) {
        const bool ok = r < n_valid;
        const T* src = ok ? base + qrow_of(r) * stride_n + head_of(r) * stride_h + col * 8 : base;
        dev::cp_async::copy16_zfill(q_s + Tr::q_offset(r, dim0 + col * 8), src, ok);
      }
    };
    copy_part.template operator()<kCkvUnits>(static_cast<const T*>(p.q_nope), p.qn_stride_n,
                                             p.qn_stride_h, 0);
    copy_part.template operator()<kKpeUnits>(static_cast<const T*>(p.q_pe), p.qp_stride_n,
                                             p.qp_stride_h, kMmaCkv);
  } else {
    mla_fp8_query_units<kSm90MlaThreads>(
        p, blk,
        [&](int r, int c, uint4 x, bool e5m2) {
          if (e5m2) {
            widen_unit.template operator()<__NV_E5M2>(q_s, q_at, x, r, 16 * c);
          } else {
            widen_unit.template operator()<__NV_E4M3>(q_s, q_at, x, r, 16 * c);
          }
        },
        [&](int r, int c) {
          *reinterpret_cast<uint4*>(q_s + Tr::q_offset(r, 16 * c)) = make_uint4(0, 0, 0, 0);
          *reinterpret_cast<uint4*>(q_s + Tr::q_offset(r, 16 * c + 8)) = make_uint4(0, 0, 0, 0);
        });
  }

  // The row addresses of tile `tile`'s tokens (mla_tile_page, an iteration ahead in the loop;
  // mla_tile_rows).
  auto page_id = [&](int tile) { return mla_tile_page<kTok>(blk, page_size, tile, tid); };
  auto fill_from = [&](int tile, int32_t page) {
    mla_tile_rows<kTok, TKV>(p, blk, page_size, tile, page, tid, c_off, k_off);
  };
  // Tile `tile` into stage tile % kStages: thread tid copies ckv unit tid % kCkvUS of tokens
  // tid / kCkvUS + kPass i and kpe unit tid % kKpeUS of token tid / kKpeUS (16-bit: every thread;
  // fp8: the first 128); one commit group a tile (empty past the end). 16-bit stages are the
  // swizzled tiles the MMAs read; fp8 stages keep the rows as stored (only the widening reads
  // them). Tokens at or past `stop` are zero-filled (their logits are masked, and 0 times a zero
  // row adds nothing to O).
  auto load = [&](int tile) {
    if (tile < n_tiles) {
      const int stage = tile % kStages;
      E* st = kv_s + stage * Tr::kStageElems;
      uint4* st8 = kv8_s + stage * kTok * kUS;
      const int32_t t0 = begin + tile * kTok;
      constexpr int kPass = kSm90MlaThreads / kCkvUS;  // tokens a pass: 4 (16-bit), 8 (fp8)
      constexpr int kPer = kTok / kPass;               // tokens a thread: 8, 4
      const int col = tid % kCkvUS, r0 = tid / kCkvUS;
      // Unit c of token r in the stage.
      const auto unit = [&](int r, int c) -> void* {
        if constexpr (kFp8) {
          return st8 + r * kUS + c;
        } else {
          return st + Tr::k_offset(r, c * 8);
        }
      };
      int64_t co[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) co[i] = c_off[r0 + i * kPass];  // all before any copy
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int r = r0 + i * kPass;
        dev::cp_async::copy16_zfill(
            unit(r, col), reinterpret_cast<const void*>(co[i] + int64_t{col} * 16), t0 + r < stop);
      }
      constexpr int kKpeUS = kUS - kCkvUS;  // 8, 4
      static_assert(kTok * kKpeUS <= kSm90MlaThreads, "one kpe unit a thread at most");
      const int kr = tid / kKpeUS, kc = tid % kKpeUS;
      if (!kFp8 || kr < kTok) {
        dev::cp_async::copy16_zfill(unit(kr, kCkvUS + kc),
                                    reinterpret_cast<const void*>(k_off[kr] + int64_t{kc} * 16),
                                    t0 + kr < stop);
      }
    }
    dev::cp_async::commit();
  };

  // Pipeline (mla_decode_mma_kernel's): one commit group a tile, the first with Q; at the top of
  // iteration `tile` groups 0 .. tile have landed (wait<kStages - 1>), and the barrier makes them
  // visible (the proxy fence first, for wgmma); a stage is refilled only after the barrier that
  // follows its last read; the address cache is refilled after the barrier that follows the last
  // copy that read it.
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    fill_from(s, page_id(s));
    __syncthreads();
    load(s);
    __syncthreads();
  }

  typename Tr::MmaS mma_s;
  typename Tr::MmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(wt);
  auto thr_o = mma_o.get_thread_slice(wt);
  // This warpgroup's k-steps (16 of the ckv part's 32, 2 of the kpe part's 4) as steps 0, 1, ...
  // of Q and the tile from its first dim on (the same swizzled addresses: a step's descriptor is
  // the first one's plus a constant, tests/api/test_mla_sm90_shape.cpp), so that the descriptors
  // of every step fold into one register base.
  constexpr int kNopeSteps = kMmaKStepsNope / kSm90MlaWarpgroups;
  constexpr int kPeSteps = (kMmaKSteps - kMmaKStepsNope) / kSm90MlaWarpgroups;
  const int nope_dim = wg * kNopeSteps * 16, pe_dim = kMmaCkv + wg * kPeSteps * 16;
  Tensor tSrQn = thr_s.partition_fragment_A(
      make_tensor(make_smem_ptr(q_s + Tr::q_offset(0, nope_dim)), typename Tr::LayoutQ{}));
  Tensor tSrQp = thr_s.partition_fragment_A(
      make_tensor(make_smem_ptr(q_s + Tr::q_offset(0, pe_dim)), typename Tr::LayoutQ{}));
  const int k_nope = Tr::k_offset(0, nope_dim), k_pe = Tr::k_offset(0, pe_dim);
  Tensor tSrSn = partition_fragment_C(mma_s, Shape<_64, Int<kTok>>{});  // ckv part of q.k
  Tensor tSrSp = partition_fragment_C(mma_s, Shape<_64, Int<kTok>>{});  // kpe part
  Tensor tOrO = partition_fragment_C(mma_o, Shape<_64, Int<kSm90MlaHalf>>{});
  Tensor tOrP = make_tensor<E>(typename Tr::LayoutP{});
  static_assert(decltype(size(tSrSn))::value == kMmaScoreFloats &&
                    decltype(size(tOrO))::value == kSm90MlaHalf / 2 &&
                    decltype(size(tOrP))::value == kMmaScoreFloats,
                "a thread's accumulators: 2 rows x (columns / 4); P is S");
  // Accumulator value v of a thread: row 16 warp + gid + 8 ((v >> 1) & 1), column
  // 8 (v >> 2) + 2 tid4 + (v & 1) (the m64nNk16 D fragment; tests/api/test_mla_sm90_shape.cpp).
#pragma unroll
  for (int i = 0; i < size(tOrO); ++i) tOrO(i) = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sm_scale = mla_sm_scale(p);
  const float c_n = sm_scale * p.ckv_scale * kMlaLog2e, c_p = sm_scale * p.kpe_scale * kMlaLog2e;
  const int v_half = wg == 0 ? Tr::v_half_elems(0) : Tr::v_half_elems(1);
  float4* x_mine = x_s + wg * 4 * 128 + wt;
  const float4* x_other = x_s + (1 - wg) * 4 * 128 + wt;
  uint32_t* p_pairs = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrP.data()));

  int32_t next_id = page_id(kStages);  // tile kStages's page, for the loop's first fill
#pragma unroll 1
  for (int tile = 0; tile < n_tiles; ++tile) {
    dev::cp_async::wait<kStages - 1>();  // tile `tile` (and Q) landed for this thread ...
    if constexpr (kFp8) {
      // ... for every thread, and both warpgroups are done with the 16-bit tile (each waited for
      // its MMAs of the tile before); the stage widened into it, then free for tile + kStages.
      __syncthreads();
      const uint4* st8 = kv8_s + (tile % kStages) * kTok * kUS;
      const bool e5m2 = p.kv_dtype == DType::kFloat8E5M2;
#pragma unroll 1
      for (int i = tid; i < kTok * kUS; i += kSm90MlaThreads) {
        const int r = i / kUS, c = i % kUS;
        if (e5m2) {
          widen_unit.template operator()<__NV_E5M2>(kv_s, k_at, st8[i], r, 16 * c);
        } else {
          widen_unit.template operator()<__NV_E4M3>(kv_s, k_at, st8[i], r, 16 * c);
        }
      }
      fill_from(tile + kStages, next_id);
      next_id = page_id(tile + kStages + 1);
      // The widened tile (generic stores) and Q visible to wgmma, for every thread; the addresses
      // of tile + kStages written before its copy.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
      load(tile + kStages);
    } else {
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // ... visible to wgmma ...
      __syncthreads();                                                // ... for every thread
      fill_from(tile + kStages, next_id);
      next_id = page_id(tile + kStages + 1);
    }
    E* st = kv_s + (kFp8 ? 0 : tile % kStages) * Tr::kStageElems;
    Tensor sV = make_tensor(make_smem_ptr(st + v_half), typename Tr::LayoutV{});
    Tensor tSrKn = thr_s.partition_fragment_B(
        make_tensor(make_smem_ptr(st + k_nope), typename Tr::LayoutK{}));  // (MMA, 1, 36)
    Tensor tSrKp =
        thr_s.partition_fragment_B(make_tensor(make_smem_ptr(st + k_pe), typename Tr::LayoutK{}));
    Tensor tOrV = thr_o.partition_fragment_B(sV);  // (MMA, 1, 2)

    // This warpgroup's share of q.k: its ckv steps into tSrSn, its kpe steps into tSrSp.
    warpgroup_fence_operand(tSrSn);
    warpgroup_fence_operand(tSrSp);
    warpgroup_arrive();
    mma_s.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
    for (int k = 0; k < kNopeSteps; ++k) {
      cute::gemm(mma_s, tSrQn(_, _, k), tSrKn(_, _, k), tSrSn);
      mma_s.accumulate_ = GMMA::ScaleOut::One;
    }
    mma_s.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
    for (int k = 0; k < kPeSteps; ++k) {
      cute::gemm(mma_s, tSrQp(_, _, k), tSrKp(_, _, k), tSrSp);
      mma_s.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrSn);
    warpgroup_fence_operand(tSrSp);

    // The partial logits (log2 units; _rn: no contraction into a later add, so each warpgroup
    // sends exactly the value it adds), handed to the other warpgroup and added to its own: the
    // same sum on both sides.
    float s[kMmaScoreFloats];
#pragma unroll
    for (int v = 0; v < kMmaScoreFloats; ++v) {
      s[v] = __fmaf_rn(c_p, tSrSp(v), __fmul_rn(c_n, tSrSn(v)));
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      x_mine[q * 128] = make_float4(s[4 * q], s[4 * q + 1], s[4 * q + 2], s[4 * q + 3]);
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 xo = x_other[q * 128];
      s[4 * q] = __fadd_rn(s[4 * q], xo.x);
      s[4 * q + 1] = __fadd_rn(s[4 * q + 1], xo.y);
      s[4 * q + 2] = __fadd_rn(s[4 * q + 2], xo.z);
      s[4 * q + 3] = __fadd_rn(s[4 * q + 3], xo.w);
    }
    // A token past its row's end weighs exactly 0 (past the block's last stop the tile's row is
    // zero-filled). A branch: most tiles have no such token.
    const int32_t t0 = begin + tile * kTok;
    if (__builtin_expect(t0 + kTok > stop_first, 0)) {  // block-uniform
#pragma unroll
      for (int v = 0; v < kMmaScoreFloats; ++v) {
        if (t0 + 8 * (v >> 2) + 2 * tid4 + (v & 1) >= row_stop[(v >> 1) & 1]) s[v] = -INFINITY;
      }
    }
    // Online softmax, base 2 (dev::rescale_on_new_max: rescale only when a row's maximum moves).
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int v = 0; v < kMmaScoreFloats; ++v) {
      tmax[(v >> 1) & 1] = fmaxf(tmax[(v >> 1) & 1], s[v]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
    }
    dev::rescale_on_new_max(m, l, tmax, [&](int r, float factor) {
#pragma unroll
      for (int v = 0; v < size(tOrO); ++v) {
        if (((v >> 1) & 1) == r) tOrO(v) *= factor;
      }
    });
    const float m_sub[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
#pragma unroll
    for (int v = 0; v < kMmaScoreFloats; v += 2) {
      const int r = (v >> 1) & 1;
      const float p0 = dev::exp2_ftz(s[v] - m_sub[r]), p1 = dev::exp2_ftz(s[v + 1] - m_sub[r]);
      l[r] += p0 + p1;
      p_pairs[v / 2] = dev::mma::pack2<T>(p0, p1);
    }

    // O += P V over this warpgroup's 256 dims (P's registers fenced like the accumulators: the
    // compiler must not move their writes past the wgmma that reads them).
    warpgroup_fence_operand(tOrP);
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
#pragma unroll
    for (int k = 0; k < size<2>(tOrP); ++k) {
      cute::gemm(mma_o, tOrP(_, _, k), tOrV(_, _, k), tOrO);
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    warpgroup_fence_operand(tOrP);
    if constexpr (!kFp8) {
      __syncthreads();  // both warpgroups are done with this stage: it takes tile + kStages
      load(tile + kStages);
    }  // (fp8: the next tile's first barrier)
  }
  dev::cp_async::wait<0>();  // the groups still open are empty; nothing lands after exit

  mla_mma_store<T, kSm90MlaHalf / 8>(p, blk, warp * 16, gid, tid4, wg * kSm90MlaHalf + tid4 * 2,
                                     wg == 0, m, l, part_o, part_ml,
                                     [&](int n, int e) { return tOrO(4 * n + e); });
}

}  // namespace flashinfer::kernels::cuda::mla
