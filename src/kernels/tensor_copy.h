// Private: Tensor's copies, casts and fills between two views on one CUDA device, as plain C++
// with FLASHINFER_HD: the kernel (kernels/cuda/tensor_copy_cuda.cu) and the CPU tests
// (tests/core/test_tensor.cpp, TensorCopyKernel.*) run the same expressions.
//
// Before, a strided device copy, a dtype cast of a device tensor and a non-zero fill of one went
// through the host: two synchronizing copies, so an op that made a strided device input dense,
// or cast a one-element scale, stalled its stream and could not be captured into a CUDA graph.
// Element i of the logical row-major order moves from src's offset of i to dst's; a cast goes
// through double with core/element.h's rounding (the CPU's Tensor::to), so both sides give the
// same bits.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/element.h"
#include "flashinfer/dtype.h"
#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels {

/// Dimensions after merging: views of more (rare: none of torch's own ops makes one) take the
/// host path.
inline constexpr int kTensorCopyMaxDims = 8;

struct TensorCopyArgs {
  int ndim = 0;  // 0: one element
  int64_t numel = 0;
  int64_t shape[kTensorCopyMaxDims] = {};
  int64_t src_stride[kTensorCopyMaxDims] = {};  // in elements
  int64_t dst_stride[kTensorCopyMaxDims] = {};
  const uint8_t* src = nullptr;  // the view's first element; null: a fill with `fill`
  uint8_t* dst = nullptr;
  DType src_dtype = DType::kFloat32, dst_dtype = DType::kFloat32;
  uint8_t src_size = 4, dst_size = 4;  // bytes an element
  uint8_t fill[8] = {};                // a fill's element, encoded in dst_dtype
};

/// Merges dimensions both views step over as one (the outer's stride is the inner's times its
/// size on both sides) and drops those of size 1: a dense copy becomes one dimension, a slice of
/// rows two. `src_strides` may be empty (a fill). False if more than kTensorCopyMaxDims remain or
/// the view is empty (nothing to do).
inline bool tensor_copy_dims(const std::vector<int64_t>& shape,
                             const std::vector<int64_t>& dst_strides,
                             const std::vector<int64_t>& src_strides, TensorCopyArgs* a) {
  const bool fill = src_strides.empty();
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n == 0) return false;
  std::vector<int64_t> sh, ds, ss;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    const int64_t sst = fill ? 0 : src_strides[d];
    if (!sh.empty() && ds.back() == shape[d] * dst_strides[d] && ss.back() == shape[d] * sst) {
      sh.back() *= shape[d];
      ds.back() = dst_strides[d];
      ss.back() = sst;
    } else {
      sh.push_back(shape[d]);
      ds.push_back(dst_strides[d]);
      ss.push_back(sst);
    }
  }
  if (sh.size() > static_cast<std::size_t>(kTensorCopyMaxDims)) return false;
  a->ndim = static_cast<int>(sh.size());
  a->numel = n;
  for (std::size_t d = 0; d < sh.size(); ++d) {
    a->shape[d] = sh[d];
    a->dst_stride[d] = ds[d];
    a->src_stride[d] = ss[d];
  }
  return true;
}

/// The offsets (in elements) of logical element i in src and dst: i's digits in the merged shape,
/// innermost first. Index is int32_t when every offset and the element count fit (the kernel's
/// common case: 32-bit division is a few instructions, 64-bit a call).
template <class Index>
FLASHINFER_HD void tensor_copy_offsets(const TensorCopyArgs& a, Index i, Index* src_off,
                                       Index* dst_off) {
  Index s = 0, d = 0;
  FLASHINFER_UNROLL
  for (int k = kTensorCopyMaxDims - 1; k >= 0; --k) {
    if (k < a.ndim) {
      const Index n = static_cast<Index>(a.shape[k]);
      const Index q = i / n, r = i - q * n;
      s += r * static_cast<Index>(a.src_stride[k]);
      d += r * static_cast<Index>(a.dst_stride[k]);
      i = q;
    }
  }
  *src_off = s;
  *dst_off = d;
}

/// Writes logical element i of dst. kBytes > 0: the dtypes match (or a fill), elements of kBytes
/// bytes aligned to their size, moved as one word; kBytes 0: any pair, cast when the dtypes
/// differ.
template <int kBytes, class Index>
FLASHINFER_HD void tensor_copy_element(const TensorCopyArgs& a, Index i) {
  Index so = 0, dof = 0;
  tensor_copy_offsets(a, i, &so, &dof);
  uint8_t* d = a.dst + static_cast<int64_t>(dof) * a.dst_size;
  // The fill's bytes (kernel parameters) and the source (global memory) are read on separate
  // paths: one pointer to either would be a generic address on the device.
  if constexpr (kBytes > 0) {
    // An unsigned word of kBytes bytes: the move is one load and one store.
    using T =
        std::conditional_t<kBytes == 1, uint8_t,
                           std::conditional_t<kBytes == 2, uint16_t,
                                              std::conditional_t<kBytes == 4, uint32_t, uint64_t>>>;
    static_assert(kBytes == 1 || kBytes == 2 || kBytes == 4 || kBytes == 8);
    const uint8_t* s = a.src + static_cast<int64_t>(so) * kBytes;
    T v;
#ifdef __CUDA_ARCH__  // one aligned load and store (memcpy would move bytes)
    if (a.src == nullptr) {
      memcpy(&v, a.fill, kBytes);
    } else {
      v = *reinterpret_cast<const T*>(s);
    }
    *reinterpret_cast<T*>(d) = v;
#else
    memcpy(&v, a.src == nullptr ? a.fill : s, kBytes);
    memcpy(d, &v, kBytes);
#endif
  } else if (a.src == nullptr) {
    for (int b = 0; b < a.dst_size; ++b) d[b] = a.fill[b];
  } else {
    const uint8_t* s = a.src + static_cast<int64_t>(so) * a.src_size;
    if (a.src_dtype == a.dst_dtype) {
      for (int b = 0; b < a.dst_size; ++b) d[b] = s[b];
    } else {
      ::flashinfer::detail::encode_element(a.dst_dtype,
                                           ::flashinfer::detail::decode_element(a.src_dtype, s), d);
    }
  }
}

/// Whether 32-bit indices reach every element and offset of the view pair.
inline bool tensor_copy_fits_int32(const TensorCopyArgs& a) {
  constexpr int64_t kMax = 0x7fffffff;
  if (a.numel > kMax) return false;
  int64_t s = 0, d = 0;
  for (int k = 0; k < a.ndim; ++k) {
    s += (a.shape[k] - 1) * a.src_stride[k];
    d += (a.shape[k] - 1) * a.dst_stride[k];
  }
  return s <= kMax && d <= kMax;
}

}  // namespace flashinfer::kernels
