// The CuTe types of the Hopper MLA decode kernel (mla_sm90_kernel.cuh): its two wgmma MMAs and
// the swizzled shared-memory layouts of Q and of the latent cache tiles. Host-compilable
// (CUTLASS's headers and the toolkit's fp16 / bf16 types), so that the CPU tests evaluate the
// layouts the kernel is compiled with (tests/api/test_mla_sm90_shape.cpp).
//
// A cache token's 576 dims (ckv 512, then kpe 64) are one row of the tile, and the tile is both
// operands that read the cache: K of S = Q K^T (K-major: a token's dims contiguous) and, its first
// 512 dims, V of O += P V (MN-major: the output dims contiguous within a token). Both views are
// the same bytes: 8-token x 64-dim swizzle atoms, the atoms of a tile's tokens consecutive, then
// the next 64 dims (LayoutK's default order; LayoutV tiles its atoms tokens first to match), so
// that V element (d, t) and K element (t, d) have one offset (the CPU tests check every one).
#pragma once

#include "kernels/cuda/mla_sm90.h"
#include "kernels/cuda/prefill_sm90_traits.h"  // CuteElement

namespace flashinfer::kernels::cuda::mla {

template <class T>
struct Sm90Mla {
  using E = typename prefill::CuteElement<T>::type;
  static constexpr int kTokens = kMmaKvTile;
  // One m64 atom a warpgroup: each warpgroup runs its own MMAs over the block's 64 rows.
  using MmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<
          E, E, float, cute::Shape<cute::_64, cute::Int<kTokens>, cute::Int<kMmaDim>>>()));
  using MmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<
          E, E, float, cute::Shape<cute::_64, cute::Int<kSm90MlaHalf>, cute::Int<kTokens>>,
          cute::GMMA::Major::K, cute::GMMA::Major::MN>()));
  using LayoutQ = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<E>{},
                                               cute::Shape<cute::_64, cute::Int<kMmaDim>>{}));
  using LayoutK = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<E>{}, cute::Shape<cute::Int<kTokens>, cute::Int<kMmaDim>>{}));
  // A warpgroup's 256 output dims of V over the tile's tokens, at the stage's element offset
  // v_half_elems(wd) (a whole number of swizzle periods: the same swizzle phase).
  using LayoutV =
      decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<E>{},
                                   cute::Shape<cute::Int<kSm90MlaHalf>, cute::Int<kTokens>>{},
                                   cute::Step<cute::_2, cute::_1>{}));
  using OffsetsQ = decltype(cute::as_position_independent_swizzle_layout(LayoutQ{}));
  using OffsetsK = decltype(cute::as_position_independent_swizzle_layout(LayoutK{}));
  using OffsetsV = decltype(cute::as_position_independent_swizzle_layout(LayoutV{}));
  static constexpr int kStageElems = kTokens * kMmaDim;
  // The element offsets of Q's (row, dim), K's (token, dim) and V's (dim, token) from their tile's
  // base, as the hardware swizzles them (for the kernel's own copies into the tiles).
  CUTE_HOST_DEVICE static constexpr int q_offset(int row, int dim) {
    return static_cast<int>(OffsetsQ{}(row, dim));
  }
  CUTE_HOST_DEVICE static constexpr int k_offset(int token, int dim) {
    return static_cast<int>(OffsetsK{}(token, dim));
  }
  CUTE_HOST_DEVICE static constexpr int v_offset(int dim, int token) {
    return static_cast<int>(OffsetsV{}(dim, token));
  }
  /// Where warpgroup wd's half of V starts in a stage: K's (0, 256 wd).
  CUTE_HOST_DEVICE static constexpr int v_half_elems(int wd) {
    return k_offset(0, kSm90MlaHalf * wd);
  }
  // The A operand of O += P V: per thread the S accumulator's values in order, as 16-bit pairs
  // (((2, 2, 2), 1, kTokens / 16): one m64k16 fragment per 16 tokens).
  using LayoutP = cute::Layout<
      cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_2>, cute::_1, cute::Int<kTokens / 16>>>;
};

}  // namespace flashinfer::kernels::cuda::mla
