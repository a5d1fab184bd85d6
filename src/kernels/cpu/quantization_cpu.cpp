#include "kernels/cpu/quantization_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/dtype_dispatch.h"
#include "kernels/nvfp4_rules.h"  // mxfp8_scale_code / mxfp8_value_code, shared with CUDA
#include "kernels/quant_batch_invariant_rules.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QUANT_CPU_X86 1
#else
#define QUANT_CPU_X86 0
#endif

namespace flashinfer::kernels::cpu {
namespace {

inline float load(const Half* p) { return p->to_float(); }
inline float load(const BFloat16* p) { return p->to_float(); }
inline float load(const Float8E4M3FN* p) { return p->to_float(); }
inline float load(const float* p) { return *p; }

// The row kernels are written once with fixed block sizes and unit-stride scratch so the
// compiler vectorizes them, and instantiated three times: for the baseline target (SSE2), and
// under AVX2 and AVX-512 target attributes, picked at run time. Every step is exact elementwise
// IEEE arithmetic (products, quotients, bit manipulation; nothing an FMA could contract), and
// the block maximum ignores NaN and is order-independent, so all three give the same bits.

// Block amax with fmax semantics (NaN ignored): eight lane-wise maxima, then combined. The
// maximum of a set does not depend on the order, so this equals a sequential scan.
template <int kVec>
[[gnu::always_inline]] inline float block_amax(const float* v) {
  static_assert(kVec % 8 == 0);
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < kVec; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const float a = std::fabs(v[i + l]);
      lane[l] = a > lane[l] ? a : lane[l];
    }
  }
  float amax = 0.0f;
  for (int l = 0; l < 8; ++l) amax = lane[l] > amax ? lane[l] : amax;
  return amax;
}

template <class T, int kVec>
[[gnu::always_inline]] inline void load_block(const T* x, int64_t stride, float* v) {
  if (stride == 1) {
    for (int i = 0; i < kVec; ++i) v[i] = load(x + i);
  } else {
    for (int i = 0; i < kVec; ++i) v[i] = load(x + i * stride);
  }
}

template <class T, int kVec>
[[gnu::always_inline]] inline void fp4_row(const Fp4QuantizeParams& p, float gs, int64_t r) {
  const T* x = static_cast<const T*>(p.input) + r * p.in_stride_m;
  uint8_t* q = p.out + r * (p.k / 2);
  const int64_t num_sf_cols = p.k / kVec;
  for (int64_t b = 0; b < num_sf_cols; ++b) {
    float v[kVec];
    load_block<T, kVec>(x + b * kVec * p.in_stride_k, p.in_stride_k, v);
    if constexpr (std::is_same_v<T, Float8E4M3FN>) {  // upstream's fp8 path (nvfp4_rules.h)
      for (int i = 0; i < kVec; ++i) v[i] = fp8_fp4_prescale(v[i], gs);
      const Fp8Fp4Scale s = fp8_fp4_scale(block_amax<kVec>(v), gs, p.ue8m0);
      p.sf[sf_offset(p.layout, r, b, num_sf_cols)] = s.code;
      uint8_t* qb = q + b * (kVec / 2);
      for (int i = 0; i < kVec / 2; ++i) {
        qb[i] = pack_e2m1x2(float_to_e2m1_bits(v[2 * i] * s.out),
                            float_to_e2m1_bits(v[2 * i + 1] * s.out));
      }
      continue;
    }
    if constexpr (kVec == 16) {
      if (p.four_over_six.on) {  // upstream 0.7.4's 4over6 recipe (nvfp4_rules.h)
        const Nvfp4Block blk = nvfp4_4over6_block(v, gs, p.four_over_six);
        p.sf[sf_offset(p.layout, r, b, num_sf_cols)] = blk.sf;
        for (int i = 0; i < 8; ++i) q[b * 8 + i] = static_cast<uint8_t>(blk.packed >> (8 * i));
        continue;
      }
    }
    const float amax = block_amax<kVec>(v);
    uint8_t sf_code;
    float sf_val;
    if (p.ue8m0) {
      sf_code = ue8m0_round_up(amax / 6.0f);
      sf_val = ue8m0_to_float(sf_code);
    } else {
      sf_code = float_to_e4m3fn_bits(gs * amax / 6.0f, /*saturate=*/true);
      sf_val = e4m3fn_bits_to_float(sf_code);
    }
    p.sf[sf_offset(p.layout, r, b, num_sf_cols)] = sf_code;
    // Codes first (a straight loop the compiler vectorizes), then the nibble packing.
    uint8_t c[kVec];
    // A scale that decodes to 0 gives signed zeros (upstream 0.7.4's output scale 0: ue8m0 code 0
    // always, an e4m3 zero through nvfp4_code; 0.6.18 divided by 2^-127 for ue8m0).
    if (p.ue8m0 ? sf_code == 0 : (p.cute_dsl_zero && sf_val == 0.0f)) {
      for (int i = 0; i < kVec; ++i) c[i] = float_to_e2m1_bits(v[i] * 0.0f);
    } else if (p.ue8m0) {
      for (int i = 0; i < kVec; ++i) c[i] = float_to_e2m1_bits(v[i] / sf_val);
    } else {
      for (int i = 0; i < kVec; ++i) c[i] = nvfp4_code(v[i], gs, sf_val);
    }
    uint8_t* qb = q + b * (kVec / 2);
    for (int i = 0; i < kVec / 2; ++i) qb[i] = pack_e2m1x2(c[2 * i], c[2 * i + 1]);
  }
}

template <class T>
[[gnu::always_inline]] inline void mxfp8_row(const Mxfp8QuantizeParams& p, int64_t r) {
  const T* x = static_cast<const T*>(p.input) + r * p.in_stride_m;
  uint8_t* q = p.out + r * p.k;
  const int64_t num_sf_cols = p.k / 32;
  for (int64_t b = 0; b < num_sf_cols; ++b) {
    float v[32];
    load_block<T, 32>(x + b * 32 * p.in_stride_k, p.in_stride_k, v);
    const uint8_t sf_code = mxfp8_scale_code(block_amax<32>(v));
    const float sf_val = ue8m0_to_float(sf_code);
    p.sf[sf_offset(p.layout, r, b, num_sf_cols)] = sf_code;
    for (int i = 0; i < 32; ++i) q[b * 32 + i] = mxfp8_value_code(v[i], sf_val);
  }
}

// Rows [r0, r1) for one instruction set. vec is 16 or 32 (the ops check it).
template <class T>
[[gnu::always_inline]] inline void fp4_rows_body(const Fp4QuantizeParams& p, float gs, int64_t r0,
                                                 int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    float g = gs;
    if (p.global_scale_per_row) {
      g = p.global_scale[r];
      if (p.global_scale_inversed) g = 1.0f / g;
    }
    if (p.sf_vec_size == 16) {
      fp4_row<T, 16>(p, g, r);
    } else {
      fp4_row<T, 32>(p, g, r);
    }
  }
}

template <class T>
[[gnu::always_inline]] inline void mxfp8_rows_body(const Mxfp8QuantizeParams& p, int64_t r0,
                                                   int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) mxfp8_row<T>(p, r);
}

template <class T>
void fp4_rows_base(const Fp4QuantizeParams& p, float gs, int64_t r0, int64_t r1) {
  fp4_rows_body<T>(p, gs, r0, r1);
}
template <class T>
void mxfp8_rows_base(const Mxfp8QuantizeParams& p, int64_t r0, int64_t r1) {
  mxfp8_rows_body<T>(p, r0, r1);
}

#if QUANT_CPU_X86
#define FI_TARGET_AVX2 __attribute__((target("avx2")))
#define FI_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
template <class T>
FI_TARGET_AVX2 void fp4_rows_avx2(const Fp4QuantizeParams& p, float gs, int64_t r0, int64_t r1) {
  fp4_rows_body<T>(p, gs, r0, r1);
}
template <class T>
FI_TARGET_AVX512 void fp4_rows_avx512(const Fp4QuantizeParams& p, float gs, int64_t r0,
                                      int64_t r1) {
  fp4_rows_body<T>(p, gs, r0, r1);
}
template <class T>
FI_TARGET_AVX2 void mxfp8_rows_avx2(const Mxfp8QuantizeParams& p, int64_t r0, int64_t r1) {
  mxfp8_rows_body<T>(p, r0, r1);
}
template <class T>
FI_TARGET_AVX512 void mxfp8_rows_avx512(const Mxfp8QuantizeParams& p, int64_t r0, int64_t r1) {
  mxfp8_rows_body<T>(p, r0, r1);
}
#undef FI_TARGET_AVX2
#undef FI_TARGET_AVX512

#endif

// Rows [0, m) of k elements in tasks of ~16K elements, spread over the threads when the whole is
// large enough to pay for waking them.
template <class F>
void for_row_tasks(int64_t m, int64_t k, F&& rows) {
  const int64_t rows_per_task = std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1));
  const int64_t tasks = (m + rows_per_task - 1) / rows_per_task;
#pragma omp parallel for schedule(dynamic, 1) if (m * k >= (1 << 15))
  for (int64_t t = 0; t < tasks; ++t) {
    rows(t * rows_per_task, std::min(m, (t + 1) * rows_per_task));
  }
}

template <class T>
void fp4_rows(const Fp4QuantizeParams& p, float gs, CpuIsa isa) {
  auto fn = &fp4_rows_base<T>;
#if QUANT_CPU_X86
  if (isa == CpuIsa::kAvx512) fn = &fp4_rows_avx512<T>;
  if (isa == CpuIsa::kAvx2) fn = &fp4_rows_avx2<T>;
#else
  (void)isa;
#endif
  if (!p.per_token_scale) {
    for_row_tasks(p.m, p.k, [&](int64_t r0, int64_t r1) { fn(p, gs, r0, r1); });
    return;
  }
  // Per token: each row's amax (NaN ignored, as the blocks') sets its own global scale.
  const float gsi = p.per_token_gsi ? *p.per_token_gsi : p.per_token_gsi_value;
  for_row_tasks(p.m, p.k, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* x = static_cast<const T*>(p.input) + r * p.in_stride_m;
      float amax = 0.0f;
      for (int64_t i = 0; i < p.k; ++i) {
        const float a = std::fabs(load(x + i * p.in_stride_k));
        amax = a > amax ? a : amax;
      }
      const PerTokenScales s = nvfp4_per_token_scales(amax, gsi);
      p.per_token_scale[r] = s.scale;
      fn(p, s.encode, r, r + 1);
    }
  });
}

template <class T>
void mxfp8_rows(const Mxfp8QuantizeParams& p, CpuIsa isa) {
  auto fn = &mxfp8_rows_base<T>;
#if QUANT_CPU_X86
  if (isa == CpuIsa::kAvx512) fn = &mxfp8_rows_avx512<T>;
  if (isa == CpuIsa::kAvx2) fn = &mxfp8_rows_avx2<T>;
#else
  (void)isa;
#endif
  for_row_tasks(p.m, p.k, [&](int64_t r0, int64_t r1) { fn(p, r0, r1); });
}

}  // namespace

void fp4_quantize(const Fp4QuantizeParams& p) { fp4_quantize_with(p, cpu_isa()); }

void mxfp8_quantize(const Mxfp8QuantizeParams& p) { mxfp8_quantize_with(p, cpu_isa()); }

void fp4_quantize_with(const Fp4QuantizeParams& p, CpuIsa isa) {
  isa = std::min(isa, detected_cpu_isa());
  std::memset(p.sf, 0, static_cast<size_t>(p.sf_size));
  float gs = p.global_scale ? *p.global_scale : 1.0f;
  if (p.global_scale_inversed) gs = 1.0f / gs;
  dispatch_dtype<CpuElements, kFloat16, kBFloat16, kFloat8E4M3FN>(
      p.in_dtype, "fp4_quantize", "input", [&]<class T>() { fp4_rows<T>(p, gs, isa); });
}

void mxfp8_quantize_with(const Mxfp8QuantizeParams& p, CpuIsa isa) {
  isa = std::min(isa, detected_cpu_isa());
  std::memset(p.sf, 0, static_cast<size_t>(p.sf_size));
  dispatch_dtype<CpuElements, kFloat16, kBFloat16, kFloat32>(
      p.in_dtype, "mxfp8_quantize", "input", [&]<class T>() { mxfp8_rows<T>(p, isa); });
}

void batch_invariant_quantize(const BatchInvariantQuantizeParams& p) {
  namespace bi = batch_invariant;
  std::memset(p.sf, 0, static_cast<size_t>(p.sf_size));
  const bool nv = p.format == BatchInvariantFormat::kNvfp4;
  const bool fp8 = p.format == BatchInvariantFormat::kMxfp8;
  const int vec = nv ? 16 : 32;
  const int64_t num_sf_cols = p.k / vec;
  const int64_t row_bytes = fp8 ? p.k : p.k / 2;
  for_row_tasks(p.m, p.k, [&](int64_t r0, int64_t r1) {
    std::vector<float> x(static_cast<size_t>(p.k));
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < p.k; ++i) {
        x[static_cast<size_t>(i)] =
            elem_io::load_or_fp32(p.input, p.in_dtype, r * p.in_stride_m + i * p.in_stride_k);
      }
      float gs = p.global_scale;
      if (nv && p.per_token_scale) {
        const bi::PerTokenScales s =
            bi::nvfp4_per_token(bi::block_amax(x.data(), static_cast<int>(p.k)), p.per_token_gsi);
        p.per_token_scale[r] = s.pts;
        gs = s.ges;
      }
      uint8_t* q = p.out + r * row_bytes;
      for (int64_t b = 0; b < num_sf_cols; ++b) {
        const float* v = x.data() + b * vec;
        uint8_t codes[32];
        const uint8_t sf = nv ? bi::nvfp4_block(v, gs, codes) : bi::mx_block(v, fp8, codes);
        p.sf[sf_offset(p.layout, r, b, num_sf_cols)] = sf;
        if (fp8) {
          std::memcpy(q + b * 32, codes, 32);
        } else {
          for (int i = 0; i < vec / 2; ++i) {
            q[b * (vec / 2) + i] = pack_e2m1x2(codes[2 * i], codes[2 * i + 1]);
          }
        }
      }
    }
  });
}

void block_dequantize(const BlockDequantizeParams& p) {
  const int64_t num_sf_cols = p.k / p.sf_vec_size;
#pragma omp parallel for schedule(static) if (p.m * p.k >= (1 << 15))
  for (int64_t r = 0; r < p.m; ++r) {
    const uint8_t* d = p.data + r * p.data_stride_m;
    float* y = p.out + r * p.k;
    for (int64_t c = 0; c < p.k; ++c) {
      const uint8_t s = p.sf[sf_offset(p.layout, r, c / p.sf_vec_size, num_sf_cols)];
      const float sf = !p.sf_ue8m0     ? e4m3fn_bits_to_float(s)
                       : p.ue8m0_shift ? f32_from_bits(static_cast<uint32_t>(s) << 23)
                                       : ue8m0_to_float(s);
      const float scale = sf * p.global_scale;  // upstream scales the scale first
      float q;
      if (p.fp4) {
        const uint8_t byte = d[c / 2];
        q = e2m1_bits_to_float((c % 2) == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte));
      } else {
        q = e4m3fn_bits_to_float(d[c]);
      }
      y[c] = q * scale;
    }
  }
}

void block_scale_interleave(const BlockScaleInterleaveParams& p) {
  const int64_t per_batch = sf_buffer_size(SfLayoutCode::k128x4, p.rows, p.cols);
  const int64_t es = p.elem_size;
  auto* out = static_cast<uint8_t*>(p.out);
  const auto* in = static_cast<const uint8_t*>(p.input);
  std::memset(out, 0, static_cast<size_t>(p.batch * per_batch * es));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t r = 0; r < p.rows; ++r) {
      for (int64_t c = 0; c < p.cols; ++c) {
        const int64_t src = b * p.in_stride_b + r * p.in_stride_r + c * p.in_stride_c;
        const int64_t dst = b * per_batch + sf_offset(SfLayoutCode::k128x4, r, c, p.cols);
        std::memcpy(out + dst * es, in + src * es, static_cast<size_t>(es));
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
