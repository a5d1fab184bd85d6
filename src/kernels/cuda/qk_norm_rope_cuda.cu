#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/qk_norm_rope_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kQkNormThreads = 64;
constexpr const char* kQkNormOp = "fused_qk_rmsnorm_rope";

__device__ __forceinline__ void store(void* out, int64_t idx, float v, bool fp8, float scale) {
  if (fp8) {
    static_cast<uint8_t*>(out)[idx] = float_to_e4m3fn_bits(__fmul_rn(v, scale), true);
  } else {
    static_cast<uint16_t*>(out)[idx] = float_to_bfloat16_bits(v);
  }
}

// Channel c of a q/k row after the RMS norm (the CPU's rounding to bf16 included).
__device__ __forceinline__ float normed(const QkNormRopeParams& p, const uint16_t* src,
                                        const uint16_t* w, int64_t c, float rcp) {
  const float x = bfloat16_bits_to_float(src[c]);
  if (!p.norm) return x;
  float v = __fmul_rn(__fmul_rn(x, rcp), bfloat16_bits_to_float(w[c]));
  if (!p.fp8) v = bfloat16_bits_to_float(float_to_bfloat16_bits(v));
  return v;
}

__global__ void qk_norm_rope_kernel(QkNormRopeParams p, const float* freq, const int* section) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.tokens * 3) return;
  const int64_t t = idx / 3;
  const int part = static_cast<int>(idx % 3);
  const int64_t d = p.d, half = d / 2, row = (p.hq + p.hk + p.hv) * d;
  const uint16_t* in = p.qkv + t * row;
  if (part == 2) {
    const uint16_t* v = in + (p.hq + p.hk) * d;
    const int64_t nv = p.hv * d;
    for (int64_t c = 0; c < nv; ++c) {
      if (p.fp8) {
        store(p.v_out, t * nv + c, bfloat16_bits_to_float(v[c]), true, p.v_scale);
      } else {
        static_cast<uint16_t*>(p.v_out)[t * nv + c] = v[c];
      }
    }
    return;
  }
  const int64_t s = t % p.seq_len, hw = p.pph * p.ppw;
  const int64_t pos[3] = {s / hw, (s % hw) / p.ppw, (s % hw) % p.ppw};
  const int64_t heads = part == 0 ? p.hq : p.hk;
  const uint16_t* src = in + (part == 0 ? 0 : p.hq * d);
  const uint16_t* w = part == 0 ? p.q_weight : p.k_weight;
  void* out = part == 0 ? p.q_out : p.k_out;
  const int64_t n = heads * d;
  float ss = 0.0f;
  for (int64_t c = 0; c < n; ++c) {
    const float x = bfloat16_bits_to_float(src[c]);
    ss = __fadd_rn(ss, __fmul_rn(x, x));
  }
  const float rcp =
      __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(n)), p.eps)));
  const bool yarn = p.factor != 1.0f;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = p.interleave ? 2 * i : i, b = p.interleave ? 2 * i + 1 : i + half;
      const float xa = normed(p, src, w, h * d + a, rcp);
      const float xb = normed(p, src, w, h * d + b, rcp);
      const float theta = __fmul_rn(static_cast<float>(pos[section[i]]), freq[i]);
      const float sn = sinf(theta), cs = cosf(theta);
      float ya = __fmaf_rn(xa, cs, -__fmul_rn(xb, sn));
      float yb = __fmaf_rn(xb, cs, __fmul_rn(xa, sn));
      if (yarn) {
        ya = __fmul_rn(ya, p.attention_factor);
        yb = __fmul_rn(yb, p.attention_factor);
      }
      store(out, t * n + h * d + a, ya, p.fp8, p.out_scale);
      store(out, t * n + h * d + b, yb, p.fp8, p.out_scale);
    }
  }
}

}  // namespace

void fused_qk_rmsnorm_rope(const QkNormRopeParams& p, void* stream) {
  if (p.tokens == 0 || p.d == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t half = p.d / 2;
  // The CPU's own frequency table, built on the host and copied once per call.
  std::vector<float> freq(static_cast<size_t>(half));
  std::vector<int> section(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    freq[static_cast<size_t>(i)] = cpu::qk_rope_freq(p, i, &section[static_cast<size_t>(i)]);
  }
  const size_t fbytes = freq.size() * sizeof(float), sbytes = section.size() * sizeof(int);
  void* table = nullptr;
  FLASHINFER_CUDA_CALL(kQkNormOp, malloc_async(&table, fbytes + sbytes, s));
  auto* dfreq = static_cast<float*>(table);
  auto* dsection = reinterpret_cast<int*>(static_cast<char*>(table) + fbytes);
  cudaError_t err = cudaMemcpyAsync(dfreq, freq.data(), fbytes, cudaMemcpyHostToDevice, s);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(dsection, section.data(), sbytes, cudaMemcpyHostToDevice, s);
  }
  if (err == cudaSuccess) {
    const auto blocks = static_cast<unsigned>((p.tokens * 3 + kQkNormThreads - 1) / kQkNormThreads);
    err = try_launch_kernel(qk_norm_rope_kernel, dim3(blocks), dim3(kQkNormThreads), 0, s, false, p,
                            static_cast<const float*>(dfreq), static_cast<const int*>(dsection));
  }
  // Stream-ordered free: after the kernel that reads the table.
  const cudaError_t free_err = cudaFreeAsync(table, s);
  FLASHINFER_CUDA_CALL(kQkNormOp, err);
  FLASHINFER_CUDA_CALL(kQkNormOp, free_err);
  // The host vectors may go now: a copy from pageable memory has left them when it returns.
}

}  // namespace flashinfer::kernels::cuda
