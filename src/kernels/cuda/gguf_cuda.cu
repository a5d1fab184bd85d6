// mm_gguf on CUDA: out = a @ dequant(b)^T, b being GGUF Q4_1 / Q8_0 blocks exactly as the file
// stores them (kernels/gguf_mm_params.h). Two simple kernels, both fp32 accumulation:
//   - m < 16 (decode): one warp per weight row; lane t dequantizes value t of each block and
//     multiplies it into up to 8 rows of a; a warp sum gives each output.
//   - m >= 16 (prefill): 32 x 32 output tiles; per step one GGML block (32 k values) of 32
//     weight rows is dequantized into shared memory beside 32 x 32 activations.
// The blocks are read byte by byte (the fp16 scales as two bytes), so b's rows need no
// alignment: a row stride of any byte count works. Sums run in another order than the CPU's,
// which is the whole difference (the dequantized weights are the CPU's bit for bit).
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/gguf_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kBlockValues = 32;  // GGML block: 32 values

template <GgmlQuantType kType>
constexpr int block_bytes() {
  return kType == GgmlQuantType::kQ4_1 ? 20 : 34;
}

// The little-endian fp16 at p, whatever p's alignment.
__device__ __forceinline__ float half_at(const uint8_t* p) {
  const auto bits = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(bits));
}

// Value t (0..31) of the block at `blk`, as the GGUF formula writes it: d * q (+ m), each
// operation rounded in fp32 (no fused multiply-add), so equal to the CPU's gguf_dequantize_row.
template <GgmlQuantType kType>
__device__ __forceinline__ float dequant(const uint8_t* blk, int t) {
  if constexpr (kType == GgmlQuantType::kQ4_1) {
    const unsigned byte = blk[4 + (t & 15)];
    const unsigned q = t < 16 ? (byte & 15u) : (byte >> 4);
    return __fadd_rn(__fmul_rn(half_at(blk), static_cast<float>(q)), half_at(blk + 2));
  } else {
    const auto q = static_cast<int8_t>(blk[2 + t]);
    return __fmul_rn(half_at(blk), static_cast<float>(q));
  }
}

// ---- m < 16: one warp per weight row ----

constexpr int kWarpRows = 8;           // rows of a per warp (gridDim.y covers the rest)
constexpr int kGgufWarpsPerBlock = 4;  // weight rows per thread block
constexpr int64_t kWarpMaxM = 16;      // the tiled kernel takes m >= this

template <class TA, GgmlQuantType kType>
__global__ void gguf_mm_warp_kernel(GgufMmParams p) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGgufWarpsPerBlock + (threadIdx.x >> 5);
  // The whole warp leaves together, so the shuffles below always see 32 lanes.
  if (j >= p.n) return;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kWarpRows;
  const int64_t rows_left = p.m - m0;
  const int rows = rows_left < kWarpRows ? static_cast<int>(rows_left) : kWarpRows;
  const int64_t blocks = p.k / kBlockValues;
  const uint8_t* wrow = p.b + j * p.b_row_bytes;
  const TA* a = static_cast<const TA*>(p.a) + m0 * p.a_stride_m;
  float acc[kWarpRows];
#pragma unroll
  for (int i = 0; i < kWarpRows; ++i) acc[i] = 0.0f;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const float w = dequant<kType>(wrow + blk * block_bytes<kType>(), lane);
    const int64_t kk = (blk * kBlockValues + lane) * p.a_stride_k;
#pragma unroll
    for (int i = 0; i < kWarpRows; ++i) {
      if (i < rows) acc[i] += to_f32(a[i * p.a_stride_m + kk]) * w;
    }
  }
#pragma unroll
  for (int i = 0; i < kWarpRows; ++i) {
    if (i >= rows) break;  // rows is the same on every lane: the shuffles stay uniform
    const float s = warp_reduce_sum(acc[i]);
    if (lane == 0) store_any(p.out, (m0 + i) * p.out_stride_m + j * p.out_stride_n, p.out_dtype, s);
  }
}

// ---- m >= 16: 32 x 32 output tiles, one GGML block of k per step ----

constexpr int kGgufTile = 32;
constexpr int kTileThreads = 256;  // 8 warps; each thread owns 4 outputs of one column
constexpr int kTileRowsPerThread = kGgufTile / (kTileThreads / 32);
constexpr int64_t kMaxGridY = 65535;

template <class TA, GgmlQuantType kType>
__global__ void gguf_mm_tiled_kernel(GgufMmParams p) {
  // +1 column: thread tx reads w_s[tx][kk], 33 floats apart, so the 32 lanes hit 32 banks.
  __shared__ float a_s[kGgufTile][kGgufTile + 1];
  __shared__ float w_s[kGgufTile][kGgufTile + 1];
  const int tx = static_cast<int>(threadIdx.x & 31), ty = static_cast<int>(threadIdx.x >> 5);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGgufTile;
  const int64_t blocks = p.k / kBlockValues;
  const int64_t m_tiles = (p.m + kGgufTile - 1) / kGgufTile;
  const TA* a = static_cast<const TA*>(p.a);
  // m tiles beyond gridDim.y (65535) loop here; the bound is the same for the whole block, so
  // every thread reaches the same __syncthreads().
  for (int64_t mt = blockIdx.y; mt < m_tiles; mt += gridDim.y) {
    const int64_t m0 = mt * kGgufTile;
    float acc[kTileRowsPerThread];
#pragma unroll
    for (int s = 0; s < kTileRowsPerThread; ++s) acc[s] = 0.0f;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t kk = blk * kBlockValues + tx;
#pragma unroll
      for (int s = 0; s < kTileRowsPerThread; ++s) {
        const int r = ty + s * (kTileThreads / 32);
        const int64_t mi = m0 + r, nj = n0 + r;
        a_s[r][tx] = mi < p.m ? to_f32(a[mi * p.a_stride_m + kk * p.a_stride_k]) : 0.0f;
        w_s[r][tx] = nj < p.n
                         ? dequant<kType>(p.b + nj * p.b_row_bytes + blk * block_bytes<kType>(), tx)
                         : 0.0f;
      }
      __syncthreads();
#pragma unroll 8
      for (int t = 0; t < kBlockValues; ++t) {
        const float w = w_s[tx][t];
#pragma unroll
        for (int s = 0; s < kTileRowsPerThread; ++s)
          acc[s] += a_s[ty + s * (kTileThreads / 32)][t] * w;
      }
      __syncthreads();  // the next step overwrites the tiles
    }
    const int64_t nj = n0 + tx;
#pragma unroll
    for (int s = 0; s < kTileRowsPerThread; ++s) {
      const int64_t mi = m0 + ty + s * (kTileThreads / 32);
      if (mi < p.m && nj < p.n)
        store_any(p.out, mi * p.out_stride_m + nj * p.out_stride_n, p.out_dtype, acc[s]);
    }
  }
}

template <class TA, GgmlQuantType kType>
void launch(const GgufMmParams& p, cudaStream_t stream) {
  if (p.m < kWarpMaxM) {
    const int64_t gx = (p.n + kGgufWarpsPerBlock - 1) / kGgufWarpsPerBlock;
    FLASHINFER_CHECK_CODE(gx <= 0x7FFFFFFF, ErrorCode::kUnsupported, "mm_gguf", "b",
                          "more than 2^31 - 1 thread blocks of ", kGgufWarpsPerBlock,
                          " weight rows");
    const int64_t gy = (p.m + kWarpRows - 1) / kWarpRows;  // 1 or 2
    launch_kernel("mm_gguf", gguf_mm_warp_kernel<TA, kType>,
                  dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)),
                  dim3(kGgufWarpsPerBlock * 32), 0, stream, false, p);
    return;
  }
  const int64_t gx = (p.n + kGgufTile - 1) / kGgufTile;
  FLASHINFER_CHECK_CODE(gx <= 0x7FFFFFFF, ErrorCode::kUnsupported, "mm_gguf", "b",
                        "more than 2^31 - 1 tiles of ", kGgufTile, " weight rows");
  const int64_t m_tiles = (p.m + kGgufTile - 1) / kGgufTile;
  const int64_t gy = m_tiles < kMaxGridY ? m_tiles : kMaxGridY;
  launch_kernel("mm_gguf", gguf_mm_tiled_kernel<TA, kType>,
                dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(kTileThreads), 0,
                stream, false, p);
}

}  // namespace

void gguf_mm(const GgufMmParams& p, void* stream) {
  if (p.m == 0 || p.n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.a_dtype, "mm_gguf", "a", [&]<class T>() {
        if (p.type == GgmlQuantType::kQ4_1) {
          launch<T, GgmlQuantType::kQ4_1>(p, s);
        } else {
          launch<T, GgmlQuantType::kQ8_0>(p, s);
        }
      });
}

}  // namespace flashinfer::kernels::cuda
