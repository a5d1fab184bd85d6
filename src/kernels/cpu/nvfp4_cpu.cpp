#include "kernels/cpu/nvfp4_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/quantization_cpu.h"
#include "kernels/dtype_dispatch.h"
#include "kernels/nvfp4_rules.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cpu {
namespace {

// silu(g) * u in fp32, rounded once to the element type (upstream's fused kernels compute the
// product in fp32 and keep it in the input's 16-bit type before quantizing it). The fp32 steps
// are kernels/fp32_rules.h's, which the CUDA kernel shares.
template <class T>
void silu_mul_row(const T* x, int64_t k, T* y) {
  for (int64_t j = 0; j < k; ++j) {
    y[j] = from_float<T>(silu_mul_f32(to_float(x[j]), to_float(x[k + j])));
  }
}

// Block t of 8 packed bytes to memory, byte t first.
void store_packed(const Nvfp4Block& b, uint8_t* q) {
  for (int t = 0; t < 8; ++t) q[t] = static_cast<uint8_t>(b.packed >> (8 * t));
}

template <class T>
void grouped_quantize_typed(const GroupedQuantizeParams& p) {
  const T* in = static_cast<const T*>(p.input);
  const int64_t out_row = p.fp4 ? p.k / 2 : p.padded_k;
  std::memset(p.out, 0, static_cast<size_t>(p.groups * p.m * out_row));
  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t rows = p.rows ? std::clamp<int64_t>(p.rows[g], 0, p.m) : p.m;
    uint8_t* sf = p.sf + g * p.sf_per_group;
    uint8_t* out = p.out + g * p.m * out_row;
    const T* x = in + g * p.in_stride_g;
    // The rows the kernel reads: the input itself, or its silu-and-mul / zero-padded copy.
    std::vector<T> tmp;
    int64_t stride = p.in_stride_m;
    const int64_t width = p.fp4 ? p.k : p.padded_k;
    if (p.silu_and_mul || width != p.k) {
      tmp.assign(static_cast<size_t>(rows * width), from_float<T>(0.0f));
      for (int64_t r = 0; r < rows; ++r) {
        if (p.silu_and_mul) {
          silu_mul_row(x + r * p.in_stride_m, p.k, tmp.data() + r * width);
        } else {
          std::copy(x + r * p.in_stride_m, x + r * p.in_stride_m + p.k, tmp.data() + r * width);
        }
      }
      x = tmp.data();
      stride = width;
    }
    if (p.fp4) {
      Fp4QuantizeParams q;
      q.input = x;
      q.in_dtype = p.in_dtype;
      q.m = rows;
      q.k = p.k;
      q.in_stride_m = stride;
      q.in_stride_k = 1;
      q.out = out;
      q.sf = sf;
      q.sf_size = p.sf_per_group;
      q.global_scale = p.global_scale ? p.global_scale + (p.per_group_scale ? g : 0) : nullptr;
      q.global_scale_per_row = p.per_row_scale;
      q.sf_vec_size = 16;
      q.layout = SfLayoutCode::k128x4;
      q.four_over_six = p.four_over_six;
      fp4_quantize(q);
    } else {
      Mxfp8QuantizeParams q;
      q.input = x;
      q.in_dtype = p.in_dtype;
      q.m = rows;
      q.k = p.padded_k;
      q.in_stride_m = stride;
      q.in_stride_k = 1;
      q.out = out;
      q.sf = sf;
      q.sf_size = p.sf_per_group;
      q.layout = SfLayoutCode::k128x4;
      mxfp8_quantize(q);
    }
  }
}

template <class T>
void kv_quantize_typed(const Nvfp4KvParams& p) {
  const float inv_gs = 1.0f / p.global_scale;
  const float inv6 = 1.0f / 6.0f;
#pragma omp parallel for schedule(static) if (p.m * p.k >= (1 << 15))
  for (int64_t r = 0; r < p.m; ++r) {
    const T* x = static_cast<const T*>(p.values) + r * p.value_stride_m;
    uint8_t* q = p.fp4 + r * p.fp4_stride_m;
    uint8_t* s = p.sf + r * p.sf_stride_m;
    for (int64_t b = 0; b < p.k / 16; ++b) {
      float v[16];
      float amax = 0.0f;
      for (int i = 0; i < 16; ++i) {
        v[i] = to_float(x[b * 16 + i]);
        amax = std::fmax(amax, std::fabs(v[i]));
      }
      const uint8_t code = float_to_e4m3fn_bits(inv_gs * (amax * inv6), /*saturate=*/true);
      s[b] = code;
      const float out_scale =
          amax != 0.0f ? 1.0f / (e4m3fn_bits_to_float(code) * p.global_scale) : 0.0f;
      for (int i = 0; i < 8; ++i) {
        q[b * 8 + i] = pack_e2m1x2(float_to_e2m1_bits(v[2 * i] * out_scale),
                                   float_to_e2m1_bits(v[2 * i + 1] * out_scale));
      }
    }
  }
}

template <class T>
void kv_dequantize_typed(const Nvfp4KvParams& p) {
  const float gs = p.global_scale_ptr != nullptr ? *p.global_scale_ptr : p.global_scale;
#pragma omp parallel for schedule(static) if (p.m * p.k >= (1 << 15))
  for (int64_t r = 0; r < p.m; ++r) {
    T* y = static_cast<T*>(const_cast<void*>(p.values)) + r * p.value_stride_m;
    const uint8_t* q = p.fp4 + r * p.fp4_stride_m;
    const uint8_t* s = p.sf + r * p.sf_stride_m;
    for (int64_t c = 0; c < p.k; ++c) {
      const uint8_t byte = q[c / 2];
      const float e = e2m1_bits_to_float(c % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte));
      y[c] = from_float<T>(e * e4m3fn_bits_to_float(s[c / 16]) * gs);
    }
  }
}

// One block of 16 by the append kernels' rule (kernels/nvfp4_rules.h).
template <class T>
void append_block(const T* x, float gs, uint8_t* packed, uint8_t* sf) {
  float v[16];
  for (int i = 0; i < 16; ++i) v[i] = to_float(x[i]);
  const Nvfp4Block b = nvfp4_append_block(v, gs);
  *sf = b.sf;
  store_packed(b, packed);
}

template <class T>
void paged_append_typed(const Nvfp4PagedAppendParams& p) {
#pragma omp parallel for schedule(static) if (p.nnz * p.heads * p.head_dim >= (1 << 15))
  for (int64_t i = 0; i < p.nnz; ++i) {
    const AppendSlot t = nvfp4_append_target(p, i);
    if (t.page < 0) continue;
    for (int64_t h = 0; h < p.heads; ++h) {
      for (int kv = 0; kv < 2; ++kv) {
        const T* x = static_cast<const T*>(kv == 0 ? p.key : p.value) +
                     i * (kv == 0 ? p.k_stride_n : p.v_stride_n) +
                     h * (kv == 0 ? p.k_stride_h : p.v_stride_h);
        const int64_t* cs = kv == 0 ? p.kc_stride : p.vc_stride;
        const int64_t* ss = kv == 0 ? p.ks_stride : p.vs_stride;
        uint8_t* q =
            (kv == 0 ? p.k_cache : p.v_cache) + t.page * cs[0] + t.entry * cs[1] + h * cs[2];
        uint8_t* sf = (kv == 0 ? p.k_sf : p.v_sf) + t.page * ss[0] + t.entry * ss[1] + h * ss[2];
        for (int64_t b = 0; b < p.head_dim / 16; ++b) {
          append_block(x + b * 16, kv == 0 ? p.k_scale : p.v_scale, q + b * 8, sf + b);
        }
      }
    }
  }
}

// Row r = (p, a, c) of [pages, A, B] in logical order; its 16-element blocks by fp4_quantize's
// rule, the scales linear or V-interleaved.
template <class T>
void paged_quantize_typed(const Nvfp4PagedQuantParams& p) {
  const int64_t A = p.shape[1], B = p.shape[2], d = p.shape[3], sd = d / 16;
  const int64_t rows = p.shape[0] * A * B;
#pragma omp parallel for schedule(static) if (rows * d >= (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = r % B, a = r / B % A, pg = r / B / A;
    const T* x =
        static_cast<const T*>(p.input) + pg * p.stride[0] + a * p.stride[1] + c * p.stride[2];
    for (int64_t b = 0; b < sd; ++b) {
      float v[16];
      for (int i = 0; i < 16; ++i) v[i] = to_float(x[(b * 16 + i) * p.stride[3]]);
      const Nvfp4Block blk = nvfp4_quantize_block(v, p.global_scale);
      store_packed(blk, p.out + r * (d / 2) + b * 8);
      p.sf[nvfp4_paged_sf_offset(p, pg, a, c, b)] = blk.sf;
    }
  }
}

template <class T>
void abs_max_typed(const AbsMaxParams& p) {
  float amax = 0.0f;
  for (int64_t i0 = 0; i0 < p.shape[0]; ++i0) {
    for (int64_t i1 = 0; i1 < p.shape[1]; ++i1) {
      for (int64_t i2 = 0; i2 < p.shape[2]; ++i2) {
        const T* x =
            static_cast<const T*>(p.input) + i0 * p.stride[0] + i1 * p.stride[1] + i2 * p.stride[2];
        for (int64_t i3 = 0; i3 < p.shape[3]; ++i3) {
          amax = fp32_abs_max(amax, to_float(x[i3 * p.stride[3]]));
        }
      }
    }
  }
  *p.result = amax;
}

template <class T>
void paged_dequant_typed(const Nvfp4PagedDequantParams& p) {
  for (int kv = 0; kv < 2; ++kv) {
    const int64_t* cs = p.cache_stride[kv];
    const int64_t* ss = p.sf_stride[kv];
    const int64_t* os = p.out_stride[kv];
    for (int64_t b = 0; b < p.batch; ++b) {
#pragma omp parallel for schedule(static) if (p.seq_lens[b] * p.heads * p.head_dim[kv] >= (1 << 15))
      for (int64_t t = 0; t < p.seq_lens[b]; ++t) {
        const int64_t page = p.block_table[b * p.table_cols + t / p.page_size];
        const int64_t entry = t % p.page_size;
        for (int64_t h = 0; h < p.heads; ++h) {
          const uint8_t* q = p.cache[kv] + page * cs[0] + entry * cs[1] + h * cs[2];
          const uint8_t* sf = p.sf[kv] + page * ss[0] + entry * ss[1] + h * ss[2];
          T* y = static_cast<T*>(p.out[kv]) + b * os[0] + t * os[1] + h * os[2];
          for (int64_t d = 0; d < p.head_dim[kv]; ++d) {
            const uint8_t byte = q[(d / 2) * cs[3]];
            const float e = e2m1_bits_to_float(d % 2 == 0 ? e2m1x2_low(byte) : e2m1x2_high(byte));
            y[d * os[3]] =
                from_float<T>(e * e4m3fn_bits_to_float(sf[(d / 16) * ss[3]]) * p.scale[kv]);
          }
        }
      }
    }
  }
}

}  // namespace

void nvfp4_paged_append(const Nvfp4PagedAppendParams& p) {
  dispatch_dtype<CpuElements, kFloat16, kBFloat16>(p.dtype, "nvfp4_paged_append", "append_key",
                                                   [&]<class T>() { paged_append_typed<T>(p); });
}

void nvfp4_paged_dequantize(const Nvfp4PagedDequantParams& p) {
  dispatch_dtype<CpuElements, kFloat16, kBFloat16>(p.out_dtype, "nvfp4_kv_dequantize_paged",
                                                   "output_k",
                                                   [&]<class T>() { paged_dequant_typed<T>(p); });
}

void nvfp4_paged_quantize(const Nvfp4PagedQuantParams& p) {
  dispatch_dtype<CpuElements, kFloat16, kBFloat16>(p.dtype, "nvfp4_quantize_paged_kv_cache",
                                                   "k_cache",
                                                   [&]<class T>() { paged_quantize_typed<T>(p); });
}

void abs_max(const AbsMaxParams& p) {
  dispatch_dtype<CpuElements, kFloat16, kBFloat16>(
      p.dtype, "nvfp4_quantize_paged_kv_cache", "k_cache", [&]<class T>() { abs_max_typed<T>(p); });
}

void grouped_quantize(const GroupedQuantizeParams& p) {
  if (p.in_dtype == DType::kFloat8E4M3FN) {  // nvfp4_batched_quantize only: no silu, no padding
    grouped_quantize_typed<Float8E4M3FN>(p);
    return;
  }
  dispatch_dtype<CpuElements, kFloat16, kBFloat16>(
      p.in_dtype, "grouped_quantize", "a", [&]<class T>() { grouped_quantize_typed<T>(p); });
}

void silu_and_mul_rows(const SiluMulParams& p) {
  dispatch_dtype<CpuElements, kFloat16, kBFloat16>(
      p.dtype, "silu_and_mul", "input", [&]<class T>() {
        const T* x = static_cast<const T*>(p.input);
        T* y = static_cast<T*>(p.out);
        for (int64_t r = 0; r < p.m; ++r) {
          silu_mul_row(x + r * p.in_stride_m, p.k, y + r * p.k);
        }
      });
}

void gather_rows(const RowGatherParams& p) {
  for (int64_t i = 0; i < p.rows; ++i) {
    std::memcpy(p.out + i * p.row_bytes, p.input + p.src_row[i] * p.in_stride_bytes,
                static_cast<size_t>(p.row_bytes));
  }
}

void nvfp4_kv_quantize(const Nvfp4KvParams& p) {
  dispatch_dtype<CpuElements, kFloat16, kBFloat16>(p.dtype, "nvfp4_kv_quantize", "input",
                                                   [&]<class T>() { kv_quantize_typed<T>(p); });
}

void nvfp4_kv_dequantize(const Nvfp4KvParams& p) {
  dispatch_dtype<CpuElements, kFloat16, kBFloat16>(p.dtype, "nvfp4_kv_dequantize", "output_dtype",
                                                   [&]<class T>() { kv_dequantize_typed<T>(p); });
}

}  // namespace flashinfer::kernels::cpu
