// per_token_group_quant_8bit on CUDA (and TRT-LLM's 1x128 activation quantization of
// fp8_blockscale_gemm_sm90, GroupQuant8Params::trtllm_1x128): one warp per (row, group), 16-byte
// loads where the groups allow (group_quant_kernel), else element loads
// (group_quant_strided_kernel). The lanes stride the group for the absolute maximum (a warp
// max-reduction), lane 0 writes the scale, then every lane writes its quantized elements with the
// same arithmetic as the CPU reference (x / s, fmax/fmin clamp, saturating RNE fp8 conversion or a
// truncating int8 cast).
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/quant8_cuda.h"
#include "kernels/cuda/vec_cuda.cuh"

#include <type_traits>

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kQuant8WarpsPerBlock = 8;

// The per-group arithmetic both kernel forms share (the CPU reference's): the stored scale from
// the group's absolute maximum, and one element's code. TRT-LLM's 1x128 rule multiplies by
// quant = 448 / amax and stores 1 / quant; the other rule divides by the scale it stores.
struct GroupRule {
  float scale, quant;
};
__device__ __forceinline__ GroupRule group_rule(float amax, const GroupQuant8Params& p) {
  if (p.trtllm_1x128) {
    const float quant = amax != 0.0f ? __fdiv_rn(448.0f, amax) : 1.0f;
    return {__fdiv_rn(1.0f, quant), quant};
  }
  float s = fmaxf(amax, p.eps) / p.qmax;
  if (p.ue8m0) {
    int e = 0;
    const float m = frexpf(fmaxf(s, 1e-10f), &e);
    s = ldexpf(1.0f, m == 0.5f ? e - 1 : e);
  }
  return {s, 0.0f};
}
__device__ __forceinline__ uint8_t group_code(float x, GroupRule g, const GroupQuant8Params& p) {
  if (p.trtllm_1x128) {
    return static_cast<uint8_t>(
        __nv_cvt_float_to_fp8(__fmul_rn(x, g.quant), __NV_SATFINITE, __NV_E4M3));
  }
  const float v = fminf(fmaxf(__fdiv_rn(x, g.scale), p.qmin), p.qmax);
  if (p.out_dtype == DType::kInt8) {
    return static_cast<uint8_t>(static_cast<int8_t>(__float2int_rz(v)));
  }
  if (p.out_dtype == DType::kFloat8E4M3FN) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
  }
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One warp per (row, group), element loads: the form for groups that do not start on 16-byte
// boundaries. Named apart from the vector kernel for the static SASS rule `quant`.
template <class T>
__global__ void __launch_bounds__(kQuant8WarpsPerBlock * 32)
    group_quant_strided_kernel(GroupQuant8Params p) {
  const int64_t groups = p.k / p.group_size;
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * kQuant8WarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (gid >= p.rows * groups) return;
  const int64_t r = gid / groups, g = gid % groups;
  const int64_t xs = p.x_row_stride();
  const T* x = static_cast<const T*>(p.x) + r * xs + g * p.group_size;
  float amax = 0.0f;
  for (int64_t i = lane; i < p.group_size; i += 32) amax = fmaxf(amax, fabsf(to_f32(x[i])));
  const GroupRule rule = group_rule(warp_max(amax), p);
  if (lane == 0) p.scales[r * p.s_stride_row + g * p.s_stride_group] = rule.scale;
  auto* q = static_cast<uint8_t*>(p.q) + r * p.k + g * p.group_size;
  for (int64_t i = lane; i < p.group_size; i += 32) q[i] = group_code(to_f32(x[i]), rule, p);
}

// As group_quant_strided_kernel with 16-byte loads (V elements) and V-byte stores, where the
// input and output start on 16-byte boundaries and a group fills whole 16-byte chunks: a lane
// takes chunks lane, lane + 32, ...; the absolute maximum is a max (the same value in any order).
// The second pass reloads the group (from L1) rather than keeping a runtime-sized array. The
// grid holds the device's resident blocks and strides over the groups, a warp per group.
template <class T>
__global__ void __launch_bounds__(kQuant8WarpsPerBlock * 32)
    group_quant_kernel(GroupQuant8Params p) {
  constexpr int V = kVecElems<T>;
  using Out = std::conditional_t<V == 8, uint2, std::conditional_t<V == 4, uint32_t, uint4>>;
  static_assert(sizeof(Out) == V);
  const int64_t groups = p.k / p.group_size, chunks = p.group_size / V;
  const int lane = threadIdx.x & 31;
  for (int64_t gid = static_cast<int64_t>(blockIdx.x) * kQuant8WarpsPerBlock + threadIdx.x / 32;
       gid < p.rows * groups; gid += static_cast<int64_t>(gridDim.x) * kQuant8WarpsPerBlock) {
    const int64_t r = gid / groups, g = gid % groups;
    const int64_t xs = p.x_row_stride();
    const auto* x =
        reinterpret_cast<const Vec16<T>*>(static_cast<const T*>(p.x) + r * xs + g * p.group_size);
    float amax = 0.0f;
    for (int64_t c = lane; c < chunks; c += 32) {
      const Vec16<T> v = x[c];
#pragma unroll
      for (int j = 0; j < V; ++j) amax = fmaxf(amax, fabsf(to_f32(v.v[j])));
    }
    const GroupRule rule = group_rule(warp_max(amax), p);
    if (lane == 0) p.scales[r * p.s_stride_row + g * p.s_stride_group] = rule.scale;
    auto* q = reinterpret_cast<Out*>(static_cast<uint8_t*>(p.q) + r * p.k + g * p.group_size);
    for (int64_t c = lane; c < chunks; c += 32) {
      const Vec16<T> v = x[c];
      uint8_t b[V];
#pragma unroll
      for (int j = 0; j < V; ++j) b[j] = group_code(to_f32(v.v[j]), rule, p);
      Out o;
      memcpy(&o, b, V);
      q[c] = o;
    }
  }
}

}  // namespace

void per_token_group_quant_8bit(const GroupQuant8Params& p, void* stream) {
  if (p.scales_padded_total > 0) {  // the TMA padding rows: defined bytes (zeros)
    FLASHINFER_CUDA_CALL(
        "per_token_group_quant_8bit",
        cudaMemsetAsync(p.scales, 0, static_cast<size_t>(p.scales_padded_total) * sizeof(float),
                        static_cast<cudaStream_t>(stream)));
  }
  const int64_t groups = p.rows * (p.k / p.group_size);
  if (groups == 0) return;
  const int64_t blocks = (groups + kQuant8WarpsPerBlock - 1) / kQuant8WarpsPerBlock;
  FLASHINFER_CHECK_CODE(blocks <= 0x7FFFFFFF, ErrorCode::kUnsupported, "per_token_group_quant_8bit",
                        "x", "too many groups");
  const char* op = "per_token_group_quant_8bit";
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(p.dtype, op, "x", [&]<class T>() {
    // Groups start at multiples of group_size elements, so whole 16-byte chunks per group, rows
    // of x a multiple of 16 bytes apart and 16-byte aligned bases put every group's input and
    // output on 16-byte boundaries.
    const int64_t xs = p.x_row_stride();
    const bool vec = (p.group_size * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                     (xs * static_cast<int64_t>(sizeof(T))) % 16 == 0 && aligned16(p.x, 0, 1) &&
                     aligned16(p.q, 0, 1);
    const auto s = static_cast<cudaStream_t>(stream);
    if (vec) {
      launch_kernel(
          op, group_quant_kernel<T>,
          dim3(resident_grid(op, group_quant_kernel<T>, kQuant8WarpsPerBlock * 32, blocks)),
          dim3(kQuant8WarpsPerBlock * 32), 0, s, false, p);
    } else {
      launch_kernel(op, group_quant_strided_kernel<T>, dim3(static_cast<unsigned>(blocks)),
                    dim3(kQuant8WarpsPerBlock * 32), 0, s, false, p);
    }
  });
}

}  // namespace flashinfer::kernels::cuda
