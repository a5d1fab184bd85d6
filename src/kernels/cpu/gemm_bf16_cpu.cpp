#include "kernels/cpu/gemm_bf16_cpu.h"

#include <array>
#include <cstdlib>
#include <cstring>

#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_avx512.h"

#if defined(FLASHINFER_HAVE_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace flashinfer::kernels::cpu {
namespace {

// bf16 bits of every fp8 byte: the fp32 value is exact in bf16, so its top half is the answer.
template <float (*kDecode)(uint8_t)>
std::array<uint16_t, 256> fp8_to_bf16_table() {
  std::array<uint16_t, 256> t{};
  for (int i = 0; i < 256; ++i) {
    const float v = kDecode(static_cast<uint8_t>(i));
    uint32_t u;
    std::memcpy(&u, &v, 4);
    t[static_cast<std::size_t>(i)] = static_cast<uint16_t>(u >> 16);
  }
  return t;
}

float e4m3(uint8_t b) { return e4m3fn_bits_to_float(b); }
float e5m2(uint8_t b) { return e5m2_bits_to_float(b); }

template <class T, class F>
void copy_rows(const T* s, int64_t rows, int64_t cols, int64_t sr, int64_t sc, uint16_t* d, F f) {
  // Threads share the rows of a weight-sized copy (the GEMM after it runs on the same team).
#pragma omp parallel for schedule(static) if (rows > 1 && rows * cols >= (1 << 20))
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = s + r * sr;
    uint16_t* o = d + r * cols;
    if (sc == 1) {
      for (int64_t c = 0; c < cols; ++c) o[c] = f(row[c]);
    } else {
      for (int64_t c = 0; c < cols; ++c) o[c] = f(row[c * sc]);
    }
  }
}

#if FLASHINFER_CPU_AVX512
// n fp8 codes -> bf16 bits through the 256-entry table held in eight registers: four two-source
// word permutes (64 entries each) picked by the code's top two bits. 32 codes per step.
FI_AVX512 void fp8_row_avx512(const uint8_t* src, int64_t n, const uint16_t* table, uint16_t* dst) {
  __m512i t[8];
  for (int i = 0; i < 8; ++i) t[i] = _mm512_loadu_si512(table + 32 * i);
  const __m512i b6 = _mm512_set1_epi16(0x40), b7 = _mm512_set1_epi16(0x80);
  for (int64_t j = 0; j < n; j += 32) {
    const int64_t left = n - j;
    const __mmask32 lanes = left >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu)
                                       : static_cast<__mmask32>((1u << left) - 1u);
    const __m512i idx = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(lanes, src + j));
    // vpermt2w uses the low 6 bits of each index: entries [64 q, 64 q + 64) of quarter q.
    const __m512i q0 = _mm512_permutex2var_epi16(t[0], idx, t[1]);
    const __m512i q1 = _mm512_permutex2var_epi16(t[2], idx, t[3]);
    const __m512i q2 = _mm512_permutex2var_epi16(t[4], idx, t[5]);
    const __m512i q3 = _mm512_permutex2var_epi16(t[6], idx, t[7]);
    const __mmask32 hi6 = _mm512_test_epi16_mask(idx, b6), hi7 = _mm512_test_epi16_mask(idx, b7);
    const __m512i lo = _mm512_mask_blend_epi16(hi6, q0, q1);
    const __m512i hi = _mm512_mask_blend_epi16(hi6, q2, q3);
    _mm512_mask_storeu_epi16(dst + j, lanes, _mm512_mask_blend_epi16(hi7, lo, hi));
  }
}
#endif

}  // namespace

bool exact_in_bf16(DType dt) {
  return dt == DType::kBFloat16 || dt == DType::kFloat8E4M3FN || dt == DType::kFloat8E5M2;
}

const uint16_t* fp8_bf16_table(DType dt) {
  static const std::array<uint16_t, 256> k4 = fp8_to_bf16_table<e4m3>();
  static const std::array<uint16_t, 256> k5 = fp8_to_bf16_table<e5m2>();
  return dt == DType::kFloat8E4M3FN ? k4.data() : k5.data();
}

void fp8_to_bf16(const uint8_t* src, int64_t n, DType dt, uint16_t* dst) {
  const uint16_t* t = fp8_bf16_table(dt);
#if FLASHINFER_CPU_AVX512
  if (use_avx512()) {
    fp8_row_avx512(src, n, t, dst);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = t[src[i]];
}

void to_bf16_rows(const void* src, DType dt, int64_t rows, int64_t cols, int64_t stride_r,
                  int64_t stride_c, uint16_t* dst) {
  if (dt == DType::kBFloat16) {
    copy_rows(static_cast<const uint16_t*>(src), rows, cols, stride_r, stride_c, dst,
              [](uint16_t v) { return v; });
    return;
  }
  const uint16_t* t = fp8_bf16_table(dt);
  if (stride_c == 1) {
    const auto* s8 = static_cast<const uint8_t*>(src);
#pragma omp parallel for schedule(static) if (rows > 1 && rows * cols >= (1 << 20))
    for (int64_t r = 0; r < rows; ++r) fp8_to_bf16(s8 + r * stride_r, cols, dt, dst + r * cols);
    return;
  }
  copy_rows(static_cast<const uint8_t*>(src), rows, cols, stride_r, stride_c, dst,
            [t](uint8_t v) { return t[v]; });
}

#if defined(FLASHINFER_HAVE_ONEDNN)

bool onednn_gemm_available() {
  static const bool on = [] {
    const char* e = std::getenv("FLASHINFER_CPU_ONEDNN");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

bool bf16_gemm_nt(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                  const uint16_t* b, int64_t ldb, float* c, int64_t ldc) {
  if (!onednn_gemm_available() || m <= 0 || n <= 0 || k <= 0) return false;
  using dnnl::memory;
  try {
    // One engine and stream for the process; oneDNN's primitive cache makes the per-call
    // primitive creation a lookup for a repeated shape.
    static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const memory::desc a_md({m, k}, memory::data_type::bf16, memory::dims{lda, 1});
    // B is [n, k] row-major: the logical [k, n] weights with strides (1, ldb).
    const memory::desc b_md({k, n}, memory::data_type::bf16, memory::dims{1, ldb});
    const memory::desc c_md({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
#if DNNL_VERSION_MAJOR >= 3
    const dnnl::matmul::primitive_desc pd(eng, a_md, b_md, c_md);
#else
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), eng);
#endif
    const dnnl::matmul mm(pd);
    memory am(a_md, eng, const_cast<uint16_t*>(a));
    memory bm(b_md, eng, const_cast<uint16_t*>(b));
    memory cm(c_md, eng, c);
    dnnl::stream s(eng);
    mm.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    s.wait();
    return true;
  } catch (const dnnl::error&) {
    return false;  // the caller's sgemm path computes the same product
  }
}

#else

bool onednn_gemm_available() { return false; }

bool bf16_gemm_nt(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t,
                  float*, int64_t) {
  return false;
}

#endif

}  // namespace flashinfer::kernels::cpu
