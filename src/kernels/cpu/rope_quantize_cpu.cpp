#include "kernels/cpu/rope_quantize_cpu.h"

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/rope_rules.h"

namespace flashinfer::kernels::cpu {
namespace {

float load(const void* base, DType d, int64_t off) {
  return d == DType::kFloat16 ? static_cast<const Half*>(base)[off].to_float()
                              : static_cast<const BFloat16*>(base)[off].to_float();
}

// Saturating like CUDA's __NV_SATFINITE conversion the upstream kernel uses.
uint8_t to_fp8(float x, DType d) {
  return d == DType::kFloat8E4M3FN ? float_to_e4m3fn_bits(x, true) : float_to_e5m2_bits(x, true);
}

}  // namespace

void rope_quantize(const RopeQuantizeParams& p) {
  FLASHINFER_CHECK_CODE(p.in_dtype == DType::kFloat16 || p.in_dtype == DType::kBFloat16,
                        ErrorCode::kUnsupported, "rope_quantize_fp8", "q_rope",
                        "the CPU kernel takes float16 or bfloat16 inputs");
#pragma omp parallel for schedule(static) if (p.nnz > 64)
  for (int64_t t = 0; t < p.nnz; ++t) {
    const int64_t pos =
        p.pos_int64 ? static_cast<const int64_t*>(p.pos)[t] : static_cast<const int32_t*>(p.pos)[t];
    const float* cs = p.cos_sin + pos * p.cos_sin_stride;
    for (const RopeQuantPart& part : p.part) {
      const int64_t half = part.dim / 2;
      for (int64_t h = 0; h < part.heads; ++h) {
        const int64_t in = t * part.in_stride_n + h * part.in_stride_h;
        auto* out = static_cast<uint8_t*>(part.out) + t * part.out_stride_n + h * part.out_stride_h;
        for (int64_t i = 0; i < part.dim; ++i) {
          const float x = load(part.in, p.in_dtype, in + i);
          float y = x;
          if (part.rope) {
            const int64_t j = p.interleave ? i / 2 : (i < half ? i : i - half);
            const float c = cs[j], s = cs[half + j];
            // Upstream's arithmetic (kernels/rope_rules.h): fma(x, c, rn(+-other * s)).
            if (p.interleave) {
              y = (i % 2 == 0) ? rope_rotate_one(x, c, -load(part.in, p.in_dtype, in + i + 1), s)
                               : rope_rotate_one(x, c, load(part.in, p.in_dtype, in + i - 1), s);
            } else {
              y = i < half ? rope_rotate_one(x, c, -load(part.in, p.in_dtype, in + i + half), s)
                           : rope_rotate_one(x, c, load(part.in, p.in_dtype, in + i - half), s);
            }
          }
          out[i] = to_fp8(y * part.scale, p.out_dtype);
        }
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
