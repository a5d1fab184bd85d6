// Private, plain C++ (no CUDA or cuDNN headers): how the GEMM ops' parameter block becomes the
// tensors of a cuDNN matmul graph, and the key of the cuDNN backend's graph cache
// (kernels/cuda/gemm_cudnn.cpp; docs/GEMM_AND_QUANTIZATION.md, "The cuDNN path"). Pure
// functions, so the CPU tests check them exactly.
//
// The graph is upstream's (flashinfer/gemm/gemm_base.py, build_cudnn_gemm_bf16_graph and
// build_cudnn_gemm_fp8_graph): 3-D tensors A [b, m, k], B [b, k, n] and C [b, m, n] with their
// real strides (a 2-D operand is batch 1), one matmul node computing in fp32 into an fp32
// intermediate, then pointwise nodes in fp32: + bias ([1, 1, n], bf16) for the bf16 GEMMs, * A's
// scale then * B's scale ([1, 1, 1], fp32) for FP8, and the last node's output in the requested
// dtype (a single rounding, as the CPU reference does).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/gemm_params.h"
#include "kernels/key_hash.h"

namespace flashinfer::kernels::dnn {

/// One operand as cuDNN sees it: dims and strides (elements) of a 3-D tensor, and the byte
/// alignment every batch's matrix start has (a power of two, at most 16: what the tensor
/// descriptor's alignment attribute is set to; cuDNN assumes 16 unless told).
struct Operand3d {
  std::array<int64_t, 3> dims{}, strides{};
  uint32_t align = 16;
  friend bool operator==(const Operand3d&, const Operand3d&) = default;
};

/// Largest power of two, at most 16, dividing the address of every batch's matrix.
inline uint32_t alignment16(std::uintptr_t addr, std::size_t elem_size, int64_t batch,
                            int64_t batch_stride) {
  uint64_t bits = static_cast<uint64_t>(addr) | 16u;
  if (batch > 1) bits |= static_cast<uint64_t>(batch_stride) * elem_size;
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit
}

/// The three operands of `p`. A stride that is never stepped (the batch stride when batch == 1,
/// the row stride of a single row, the column stride of a single column) is given its dense
/// value, so that two calls differing only there share a graph, and so that cuDNN never sees a
/// meaningless stride (0 from a broadcast view, say).
struct GemmTensors {
  Operand3d a, b, c;
  friend bool operator==(const GemmTensors&, const GemmTensors&) = default;
};

inline GemmTensors gemm_tensors(const GemmParams& p) {
  GemmTensors t;
  const int64_t bt = p.batch, m = p.m, n = p.n, k = p.k;
  const int64_t lda = m == 1 ? k : p.a_stride_m;
  const int64_t ldb = n == 1 ? k : p.b_stride_n;
  const int64_t ldc = m == 1 ? n : p.out_stride_m;
  t.a.dims = {bt, m, k};
  t.a.strides = {bt > 1 ? p.a_stride_b : m * lda, lda, 1};
  t.b.dims = {bt, k, n};
  t.b.strides = {bt > 1 ? p.b_stride_b : n * ldb, 1, ldb};
  t.c.dims = {bt, m, n};
  t.c.strides = {bt > 1 ? p.out_stride_b : m * ldc, ldc, 1};
  t.a.align =
      alignment16(reinterpret_cast<std::uintptr_t>(p.a), dtype_size(p.a_dtype), bt, p.a_stride_b);
  t.b.align =
      alignment16(reinterpret_cast<std::uintptr_t>(p.b), dtype_size(p.b_dtype), bt, p.b_stride_b);
  t.c.align = alignment16(reinterpret_cast<std::uintptr_t>(p.out), dtype_size(p.out_dtype), bt,
                          p.out_stride_b);
  return t;
}

/// The pointwise tail after the matmul.
enum class Epilogue : uint8_t {
  kNone,          // C = A @ B
  kBias,          // C = A @ B + bias[n]
  kTensorScales,  // C = (A @ B) * A_scale * B_scale (FP8, one fp32 scale per operand)
};

/// The graph cache's key: everything the graph and its execution plan depend on, and nothing
/// that varies between calls of one shape (data, bias and scale pointers at the same alignment).
struct GraphKey {
  int device = 0;
  GemmTensors t;
  DType a_type = DType::kBFloat16, b_type = DType::kBFloat16, c_type = DType::kBFloat16;
  Epilogue epilogue = Epilogue::kNone;
  DType bias_type = DType::kBFloat16;  // kBFloat16 unless epilogue == kBias
  uint32_t bias_align = 16;            // 16 unless epilogue == kBias
  friend bool operator==(const GraphKey&, const GraphKey&) = default;
};

inline GraphKey make_graph_key(int device, const GemmParams& p) {
  GraphKey key;
  key.device = device;
  key.t = gemm_tensors(p);
  key.a_type = p.a_dtype;
  key.b_type = p.b_dtype;
  key.c_type = p.out_dtype;
  if (p.a_scale || p.b_scale) {
    key.epilogue = Epilogue::kTensorScales;
  } else if (p.bias) {
    key.epilogue = Epilogue::kBias;
    key.bias_type = p.bias_dtype;
    key.bias_align =
        alignment16(reinterpret_cast<std::uintptr_t>(p.bias), dtype_size(p.bias_dtype), 1, 0);
  }
  return key;
}

struct GraphKeyHash {
  std::size_t operator()(const GraphKey& key) const {
    KeyHasher hasher;
    const auto mix = [&hasher](uint64_t v) { hasher.mix(v); };
    for (const Operand3d* o : {&key.t.a, &key.t.b, &key.t.c}) {
      for (int i = 0; i < 3; ++i) {
        mix(static_cast<uint64_t>(o->dims[i]));
        mix(static_cast<uint64_t>(o->strides[i]));
      }
      mix(o->align);
    }
    mix((static_cast<uint64_t>(key.a_type) << 32) | static_cast<uint64_t>(key.b_type));
    mix((static_cast<uint64_t>(key.c_type) << 32) | static_cast<uint64_t>(key.bias_type));
    mix((uint64_t{key.bias_align} << 40) | (static_cast<uint64_t>(key.epilogue) << 32) |
        static_cast<uint32_t>(key.device));
    return hasher.value();
  }
};

/// Tensor ids of the graph (cuDNN's variant pack is keyed by them).
enum Uid : int64_t { kUidA = 1, kUidB, kUidC, kUidBias, kUidAScale, kUidBScale };

/// Bytes a stream's persistent workspace grows to for a graph needing `need`: the policy of every
/// per-stream scratch (cuda::scratch_grow_to: a power of two of at least 1 MiB, past 64 MiB a
/// multiple of 2 MiB; 0 when none is needed), so a few growths cover every graph a process runs.
constexpr uint64_t workspace_grow_to(uint64_t need) { return cuda::scratch_grow_to(need); }

}  // namespace flashinfer::kernels::dnn
