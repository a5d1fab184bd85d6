// Simple, correct-by-construction kernels: one thread per byte (gather) or per output element
// (dequantize); every fp32 operation is an explicitly IEEE-rounded intrinsic in the CPU
// reference's order, and the conversions are the constexpr bit functions the CPU uses.
#include "flashinfer/float_formats.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/nvfp4_cuda.h"
#include "kernels/cuda/quantization_cuda.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void gather_rows_kernel(RowGatherParams p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.rows * p.row_bytes) return;
  const int64_t r = idx / p.row_bytes, b = idx % p.row_bytes;
  p.out[idx] = p.input[p.src_row[r] * p.in_stride_bytes + b];
}

template <class Bits, Bits (*Encode)(float)>
__global__ void kv_dequantize_kernel(Nvfp4KvParams p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.m * p.k) return;
  const int64_t r = idx / p.k, c = idx % p.k;
  const uint8_t byte = p.fp4[r * p.fp4_stride_m + c / 2];
  const uint8_t code = c % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte);
  const float e = detail::DecodeMinifloat<2, 1, detail::Specials::kNone>(code);
  const float s =
      detail::DecodeMinifloat<4, 3, detail::Specials::kFiniteNan>(p.sf[r * p.sf_stride_m + c / 16]);
  const float y = __fmul_rn(__fmul_rn(e, s), p.global_scale);
  static_cast<Bits*>(const_cast<void*>(p.values))[r * p.value_stride_m + c] = Encode(y);
}

// One element of K (kv 0) or V (kv 1) of one request's token t; the tables are on the device.
template <uint16_t (*Encode)(float)>
__global__ void paged_dequantize_kernel(Nvfp4PagedDequantParams p, int kv, int64_t max_t,
                                        const int64_t* table, const int64_t* lens) {
  const int64_t dim = p.head_dim[kv];
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.batch * max_t * p.heads * dim) return;
  const int64_t d = idx % dim;
  const int64_t h = idx / dim % p.heads;
  const int64_t t = idx / dim / p.heads % max_t;
  const int64_t b = idx / dim / p.heads / max_t;
  if (t >= lens[b]) return;
  const int64_t* cs = p.cache_stride[kv];
  const int64_t* ss = p.sf_stride[kv];
  const int64_t* os = p.out_stride[kv];
  const int64_t page = table[b * p.table_cols + t / p.page_size];
  const int64_t entry = t % p.page_size;
  const uint8_t byte = p.cache[kv][page * cs[0] + entry * cs[1] + h * cs[2] + (d / 2) * cs[3]];
  const uint8_t code = d % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte);
  const float e = detail::DecodeMinifloat<2, 1, detail::Specials::kNone>(code);
  const float s = detail::DecodeMinifloat<4, 3, detail::Specials::kFiniteNan>(
      p.sf[kv][page * ss[0] + entry * ss[1] + h * ss[2] + (d / 16) * ss[3]]);
  static_cast<uint16_t*>(p.out[kv])[b * os[0] + t * os[1] + h * os[2] + d * os[3]] =
      Encode(__fmul_rn(__fmul_rn(e, s), p.scale[kv]));
}

__device__ uint16_t encode_bf16(float x) { return float_to_bfloat16_bits(x); }
__device__ uint16_t encode_half(float x) { return float_to_half_bits(x); }

}  // namespace

void gather_rows(const RowGatherParams& p, void* stream) {
  const int64_t n = p.rows * p.row_bytes;
  if (n == 0) return;
  launch_kernel("gather_rows", gather_rows_kernel, dim3(grid_for(n)), dim3(kThreads), 0,
                static_cast<cudaStream_t>(stream), false, p);
}

void nvfp4_kv_dequantize(const Nvfp4KvParams& p, void* stream) {
  const int64_t n = p.m * p.k;
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::kBFloat16) {
    launch_kernel("nvfp4_kv_dequantize", kv_dequantize_kernel<uint16_t, encode_bf16>,
                  dim3(grid_for(n)), dim3(kThreads), 0, s, false, p);
  } else if (p.dtype == DType::kFloat16) {
    launch_kernel("nvfp4_kv_dequantize", kv_dequantize_kernel<uint16_t, encode_half>,
                  dim3(grid_for(n)), dim3(kThreads), 0, s, false, p);
  } else {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "nvfp4_kv_dequantize", "output_dtype",
                    "must be bfloat16 or float16");
  }
}

void nvfp4_paged_dequantize(const Nvfp4PagedDequantParams& p, void* stream) {
  const char* op = "nvfp4_kv_dequantize_paged";
  if (p.out_dtype != DType::kBFloat16 && p.out_dtype != DType::kFloat16) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "output_k", "must be bfloat16 or float16");
  }
  int64_t max_t = 0;
  for (int64_t b = 0; b < p.batch; ++b) max_t = p.seq_lens[b] > max_t ? p.seq_lens[b] : max_t;
  if (p.batch == 0 || max_t == 0 || p.heads == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const size_t tbytes = static_cast<size_t>(p.batch * p.table_cols) * sizeof(int64_t);
  const size_t lbytes = static_cast<size_t>(p.batch) * sizeof(int64_t);
  void* buf = nullptr;
  FLASHINFER_CUDA_CALL(op, cudaMallocAsync(&buf, tbytes + lbytes, s));
  auto* table = static_cast<int64_t*>(buf);
  auto* lens = table + p.batch * p.table_cols;
  // From pageable host memory: the copies have left the caller's arrays when they return.
  cudaError_t err = cudaMemcpyAsync(table, p.block_table, tbytes, cudaMemcpyHostToDevice, s);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(lens, p.seq_lens, lbytes, cudaMemcpyHostToDevice, s);
  }
  for (int kv = 0; kv < 2 && err == cudaSuccess; ++kv) {
    const int64_t n = p.batch * max_t * p.heads * p.head_dim[kv];
    if (n == 0) continue;
    auto* kernel = p.out_dtype == DType::kBFloat16 ? paged_dequantize_kernel<encode_bf16>
                                                   : paged_dequantize_kernel<encode_half>;
    err = try_launch_kernel(kernel, dim3(grid_for(n)), dim3(kThreads), 0, s, false, p, kv, max_t,
                            static_cast<const int64_t*>(table), static_cast<const int64_t*>(lens));
  }
  const cudaError_t free_err = cudaFreeAsync(buf, s);  // stream-ordered: after the kernels
  FLASHINFER_CUDA_CALL(op, err);
  FLASHINFER_CUDA_CALL(op, free_err);
}

void batched_fp4_quantize(const GroupedQuantizeParams& p, void* stream, bool enable_pdl) {
  const char* op = "nvfp4_batched_quantize";
  if (!p.fp4 || p.silu_and_mul || p.rows != nullptr || p.padded_k != p.k) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "a",
                    "the CUDA batch quantizer takes unmasked NVFP4 input only");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t out_row = p.k / 2;
  // The CPU zeroes the whole output first; every byte is then written.
  FLASHINFER_CUDA_CALL(op,
                       cudaMemsetAsync(p.out, 0, static_cast<size_t>(p.groups * p.m * out_row), s));
  const auto elem = static_cast<int64_t>(dtype_size(p.in_dtype));
  for (int64_t g = 0; g < p.groups; ++g) {
    Fp4QuantizeParams q;
    q.input = static_cast<const char*>(p.input) + g * p.in_stride_g * elem;
    q.in_dtype = p.in_dtype;
    q.m = p.m;
    q.k = p.k;
    q.in_stride_m = p.in_stride_m;
    q.in_stride_k = 1;
    q.out = p.out + g * p.m * out_row;
    q.sf = p.sf + g * p.sf_per_group;
    q.sf_size = p.sf_per_group;
    q.global_scale = p.global_scale ? p.global_scale + (p.per_group_scale ? g : 0) : nullptr;
    q.sf_vec_size = 16;
    q.layout = SfLayoutCode::k128x4;
    fp4_quantize(q, stream, enable_pdl);
  }
}

}  // namespace flashinfer::kernels::cuda
