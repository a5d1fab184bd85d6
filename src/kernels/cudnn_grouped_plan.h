// Private, plain C++ (no CUDA or cuDNN headers): how grouped_mm_bf16's parameter block becomes
// the tensors of cuDNN's MoE grouped matmul graph, whether a call fits that graph, and the key of
// its graph cache (kernels/cuda/grouped_gemm_cudnn.cpp). Pure functions, so the CPU tests check
// them exactly.
//
// The graph is upstream's (cudnn.gemm.ops.moe_grouped_matmul, mode NONE): one node reading the
// tokens [1, cum_m, k], the experts' weights [E, k, n] (column-major inner dims: this library's
// b [E, n, k] with its strides permuted) and the E + 1 int32 group boundaries [E + 1, 1, 1]
// (m_indptr as it is), computing in fp32 and writing [1, cum_m, n] in the io dtype. Group e is
// rows [m_indptr[e], m_indptr[e + 1]) of the tokens and the output, as in grouped_mm_bf16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "flashinfer/dtype.h"
#include "kernels/cudnn_gemm_plan.h"
#include "kernels/grouped_gemm_params.h"
#include "kernels/key_hash.h"

namespace flashinfer::kernels::dnn {

/// The node's four tensors (dims and strides in elements, alignment in bytes).
struct MoeTensors {
  Operand3d token, weight, offsets, out;
  friend bool operator==(const MoeTensors&, const MoeTensors&) = default;
};

/// The tensors of `p`. A row stride never stepped (cum_m == 1) is given its dense value, as the
/// GEMM graphs do, so that two calls differing only there share a graph.
inline MoeTensors moe_tensors(const GroupedMmCudaParams& p) {
  MoeTensors t;
  const int64_t e = p.num_groups, m = p.cum_m, n = p.n, k = p.k;
  const int64_t lda = m == 1 ? k : p.a_stride_m;
  const int64_t ldo = m == 1 ? n : p.out_stride_m;
  const int64_t ldb = p.b_stride_n;
  const int64_t bse = e == 1 ? n * ldb : p.b_stride_e;
  t.token.dims = {1, m, k};
  t.token.strides = {m * lda, lda, 1};
  t.weight.dims = {e, k, n};
  t.weight.strides = {bse, 1, ldb};
  t.offsets.dims = {e + 1, 1, 1};
  t.offsets.strides = {1, 1, 1};
  t.out.dims = {1, m, n};
  t.out.strides = {m * ldo, ldo, 1};
  t.token.align = alignment16(reinterpret_cast<std::uintptr_t>(p.a), 2, 1, 0);
  t.weight.align = alignment16(reinterpret_cast<std::uintptr_t>(p.b), 2, e, bse);
  t.offsets.align = alignment16(reinterpret_cast<std::uintptr_t>(p.m_indptr), 4, 1, 0);
  t.out.align = alignment16(reinterpret_cast<std::uintptr_t>(p.out), 2, 1, 0);
  return t;
}

/// Why `p` does not fit the graph this library hands cuDNN (empty: it fits). The graph's io
/// dtype is one for every tensor (upstream: bf16 or fp16 io, fp32 compute), so bf16 a, b and
/// out; no per-group weight map, no alpha; unit k strides and a unit n stride of out (the
/// layouts upstream hands it); every row start 16-byte aligned (the tensor-core engines'
/// vector loads); at least one row and one group.
inline std::string moe_misfit(const GroupedMmCudaParams& p) {
  if (p.in_dtype != DType::kBFloat16 || p.b_dtype != DType::kBFloat16) return "operands not bf16";
  if (p.out_dtype != DType::kBFloat16) return "out not bf16";
  if (p.b_index != nullptr || p.alpha != nullptr) return "weight map or alpha";
  if (p.num_groups < 1 || p.cum_m < 1 || p.n < 1 || p.k < 1) return "empty problem";
  if (p.a_stride_k != 1 || p.b_stride_k != 1 || (p.out_stride_n != 1 && p.n > 1)) {
    return "a k stride, b k stride or out n stride not 1";
  }
  const MoeTensors t = moe_tensors(p);
  for (const Operand3d* o : {&t.token, &t.weight, &t.out}) {
    if (o->align != 16) return "operand not 16-byte aligned";
    for (int i = 0; i < 3; ++i) {
      if (o->strides[i] != 1 && o->strides[i] % 8 != 0) return "row stride not a multiple of 8";
    }
  }
  if (p.k % 8 != 0 || p.n % 8 != 0) return "k or n not a multiple of 8";
  if (t.offsets.align < 4) return "m_indptr not 4-byte aligned";
  return "";
}

/// The graph cache's key: everything the graph and its execution plan depend on (the data
/// pointers only through their alignment, which moe_misfit fixes at 16 for the operands).
struct MoeGraphKey {
  int device = 0;
  MoeTensors t;
  friend bool operator==(const MoeGraphKey&, const MoeGraphKey&) = default;
};

inline MoeGraphKey make_moe_key(int device, const GroupedMmCudaParams& p) {
  return {device, moe_tensors(p)};
}

struct MoeGraphKeyHash {
  std::size_t operator()(const MoeGraphKey& key) const {
    KeyHasher hasher;
    for (const Operand3d* o : {&key.t.token, &key.t.weight, &key.t.offsets, &key.t.out}) {
      for (int i = 0; i < 3; ++i) {
        hasher.mix(static_cast<uint64_t>(o->dims[i]));
        hasher.mix(static_cast<uint64_t>(o->strides[i]));
      }
      hasher.mix(o->align);
    }
    hasher.mix(static_cast<uint32_t>(key.device));
    return hasher.value();
  }
};

/// Tensor ids of the graph (upstream's: token 1, weight 2, boundaries 3, output 100).
enum MoeUid : int64_t { kMoeToken = 1, kMoeWeight = 2, kMoeOffsets = 3, kMoeOut = 100 };

}  // namespace flashinfer::kernels::dnn
