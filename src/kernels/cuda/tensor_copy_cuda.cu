// Tensor's copies, casts and fills on one device (kernels/tensor_copy.h): a grid-stride loop, each
// thread one element a step, so neighbouring threads touch neighbouring elements of the
// innermost merged dimension. Moves of one dtype take a word a step; casts go through double with
// the CPU's rounding.
#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/tensor_copy_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kCopyThreads = 256;
// Enough blocks to keep every SM of an H100 busy many times over (132 SMs x 8 resident blocks of
// 256); a larger tensor loops.
constexpr int64_t kCopyMaxBlocks = 4096;

// The loop counter is 64-bit whatever Index is: i + step may pass 2^31 - 1 on the last pass of a
// tensor just under it; only the offsets' divisions take Index.
template <int kBytes, class Index>
__global__ void __launch_bounds__(kCopyThreads) tensor_copy_kernel(TensorCopyArgs a) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kCopyThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kCopyThreads + threadIdx.x; i < a.numel;
       i += step) {
    tensor_copy_element<kBytes, Index>(a, static_cast<Index>(i));
  }
}

template <class Index>
void launch(const TensorCopyArgs& a, cudaStream_t s, dim3 grid) {
  const bool aligned = (reinterpret_cast<uintptr_t>(a.dst) % a.dst_size) == 0 &&
                       (a.src == nullptr || (reinterpret_cast<uintptr_t>(a.src) % a.src_size) == 0);
  const bool move = a.src == nullptr || a.src_dtype == a.dst_dtype;
  const int bytes = move && aligned ? a.dst_size : 0;
  switch (bytes) {
    case 1:
      return launch_kernel("Tensor.copy_", tensor_copy_kernel<1, Index>, grid, dim3(kCopyThreads),
                           0, s, false, a);
    case 2:
      return launch_kernel("Tensor.copy_", tensor_copy_kernel<2, Index>, grid, dim3(kCopyThreads),
                           0, s, false, a);
    case 4:
      return launch_kernel("Tensor.copy_", tensor_copy_kernel<4, Index>, grid, dim3(kCopyThreads),
                           0, s, false, a);
    case 8:
      return launch_kernel("Tensor.copy_", tensor_copy_kernel<8, Index>, grid, dim3(kCopyThreads),
                           0, s, false, a);
    default:
      return launch_kernel("Tensor.copy_", tensor_copy_kernel<0, Index>, grid, dim3(kCopyThreads),
                           0, s, false, a);
  }
}

// One chunk of a host-to-device copy by value: the bytes travel in the launch's parameters.
struct BytesByValue {
  uint8_t* dst;
  uint32_t n;
  uint8_t bytes[kBytesByValueChunk];
};
static_assert(sizeof(BytesByValue) <= 4096, "kernel parameters past 4 KiB");

__global__ void __launch_bounds__(kCopyThreads) bytes_by_value_kernel(const BytesByValue a) {
  for (uint32_t i = threadIdx.x; i < a.n; i += kCopyThreads) a.dst[i] = a.bytes[i];
}

}  // namespace

void copy_bytes_by_value(void* dst, const void* src, std::size_t nbytes, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const auto* from = static_cast<const uint8_t*>(src);
  auto* to = static_cast<uint8_t*>(dst);
  BytesByValue a{};
  for (std::size_t done = 0; done < nbytes; done += kBytesByValueChunk) {
    const std::size_t n = std::min(kBytesByValueChunk, nbytes - done);
    a.dst = to + done;
    a.n = static_cast<uint32_t>(n);
    std::memcpy(a.bytes, from + done, n);
    launch_kernel("Tensor.copy_", bytes_by_value_kernel, dim3(1), dim3(kCopyThreads), 0, s, false,
                  a);
  }
}

void tensor_copy(const TensorCopyArgs& a, void* stream) {
  if (a.numel <= 0) return;
  const int64_t blocks =
      std::min<int64_t>((a.numel + kCopyThreads - 1) / kCopyThreads, kCopyMaxBlocks);
  const dim3 grid(static_cast<unsigned>(blocks));
  const auto s = static_cast<cudaStream_t>(stream);
  if (tensor_copy_fits_int32(a)) {
    launch<int32_t>(a, s, grid);
  } else {
    launch<int64_t>(a, s, grid);
  }
}

}  // namespace flashinfer::kernels::cuda
