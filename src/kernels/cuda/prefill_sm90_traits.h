// The CuTe types of the Hopper prefill kernel (prefill_sm90_kernel.cuh): its two tiled wgmma
// MMAs and the swizzled shared-memory layouts of its tiles. Host-compilable (CUTLASS's headers and
// the CUDA toolkit's fp16 / bf16 types), so that the CPU tests evaluate the same layouts the
// kernel is compiled with (tests/api/test_prefill_sm90_shape.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>

#include "kernels/cuda/prefill_sm90_shape.h"

namespace flashinfer::kernels::cuda::prefill {

template <class T>
struct CuteElement;
template <>
struct CuteElement<__half> {
  using type = cute::half_t;
};
template <>
struct CuteElement<__nv_bfloat16> {
  using type = cute::bfloat16_t;
};

/// The CuTe types of one instance: the two tiled MMAs (one m64 atom a warpgroup, kWG of them
/// stacked along the rows) and the shared-memory layouts of Q [64 kWG x DQK], K [kv_tile x DQK x
/// stages] (K-major, the B operand of S) and V^T [DVO x kv_tile x stages] (MN-major, the B
/// operand of O: DVO contiguous within a key, i.e. V's rows as stored).
/// kTileN / kStages: the keys of a K/V tile and its stages (the overlapped form's are
/// kSm90OverlapKvTile and kSm90OverlapStages).
template <class T, int DQK, int DVO, int kWG = kSm90Warpgroups,
          int kTileN = prefill_sm90_kv_tile(DQK, DVO, kWG), int kStages = kSm90Stages>
struct Sm90Prefill {
  using E = typename CuteElement<T>::type;
  static constexpr int kN = kTileN;
  static constexpr int kCtaQ = prefill_sm90_cta_q(kWG);
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kWG>, cute::_1, cute::_1>>;
  using MmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<E, E, float,
                                 cute::Shape<cute::_64, cute::Int<kN>, cute::Int<DQK>>>(),
      AtomLayout{}));
  using MmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<E, E, float, cute::Shape<cute::_64, cute::Int<DVO>, cute::Int<kN>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      AtomLayout{}));
  using LayoutQ = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<E>{},
                                               cute::Shape<cute::Int<kCtaQ>, cute::Int<DQK>>{}));
  using LayoutK = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<E>{},
      cute::Shape<cute::Int<kN>, cute::Int<DQK>, cute::Int<kStages>>{}));
  using LayoutVt = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<E>{},
      cute::Shape<cute::Int<DVO>, cute::Int<kN>, cute::Int<kStages>>{}));
  // The element offsets a tile's coordinates have in shared memory: the layouts above carry their
  // swizzle as a flag of the shared-memory pointer, which applies it to byte addresses (the
  // hardware's 128-byte swizzle, from a 1024-byte aligned base); evaluated without a pointer they
  // would swizzle element offsets instead. These are the position-independent forms, the same
  // function in element units (what the CPU tests evaluate).
  using OffsetsQ = decltype(cute::as_position_independent_swizzle_layout(LayoutQ{}));
  using OffsetsK = decltype(cute::as_position_independent_swizzle_layout(LayoutK{}));
  using OffsetsVt = decltype(cute::as_position_independent_swizzle_layout(LayoutVt{}));
  // The element offsets of K's (key, dim) and of V^T's (dim, key) in stage 0, for the kernel's
  // own stores into the tiles (the fp8 widening's 16-byte units), as the hardware swizzles them.
  // Never LayoutK{}(...) / LayoutVt{}(...) for this: without their pointer those apply the
  // byte swizzle (Swizzle<3,4,3>) to 16-bit element offsets, which put 3 of every 4 widened
  // units of a tile in another key's place (session 64's H200 run: every fp8 Hopper case wrong).
  CUTE_HOST_DEVICE static constexpr int k_offset(int key, int dim) {
    return static_cast<int>(OffsetsK{}(key, dim, 0));
  }
  CUTE_HOST_DEVICE static constexpr int vt_offset(int dim, int key) {
    return static_cast<int>(OffsetsVt{}(dim, key, 0));
  }
  // Byte steps of the kernel's copies: `rows` keys further along K and along V^T's key mode (the
  // swizzle's phase repeats every 8 keys, so for `rows` a multiple of 8 each step is one constant
  // for every (key, unit): tests/api/test_prefill_sm90_shape.cpp checks it over the whole tile).
  template <int rows>
  static constexpr int k_step_bytes() {
    static_assert(rows % 8 == 0, "a whole number of swizzle phases");
    return 2 * (static_cast<int>(OffsetsK{}(rows, 0, 0)) - static_cast<int>(OffsetsK{}(0, 0, 0)));
  }
  // Byte step of `cols` elements along a K row (a multiple of the 64-element swizzle atom: the
  // next atom over, the same swizzle phase; the 192-wide K rows' three unit columns a thread).
  template <int cols>
  static constexpr int k_col_step_bytes() {
    static_assert(cols % 64 == 0, "whole swizzle atoms");
    return 2 * (static_cast<int>(OffsetsK{}(0, cols, 0)) - static_cast<int>(OffsetsK{}(0, 0, 0)));
  }
  template <int rows>
  static constexpr int v_step_bytes() {
    static_assert(rows % 8 == 0, "a whole number of swizzle phases");
    return 2 * (static_cast<int>(OffsetsVt{}(0, rows, 0)) - static_cast<int>(OffsetsVt{}(0, 0, 0)));
  }
  // The A operand of O += P V: per thread the S accumulator's values in order, as 16-bit pairs
  // (((2, 2, 2), 1, kN / 16): one m64k16 fragment per 16 keys).
  using LayoutP = cute::Layout<
      cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_2>, cute::_1, cute::Int<kN / 16>>>;
};

}  // namespace flashinfer::kernels::cuda::prefill
