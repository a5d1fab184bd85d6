#include "kernels/cpu/gemm_bf16_cpu.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/env_switch.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_avx512.h"

#if defined(FLASHINFER_HAVE_ONEDNN)
#include <omp.h>

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
void copy_rows(const T* s, int64_t rows, int64_t cols, int64_t sr, int64_t sc, uint16_t* d, F f,
               bool parallel) {
  // Threads share the rows of a weight-sized copy (the GEMM after it runs on the same team).
#pragma omp parallel for schedule(static) if (parallel && rows > 1 && rows * cols >= (1 << 20))
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
FI_AVX512 inline void fp8_row_avx512(const uint8_t* src, int64_t n, const __m512i* t,
                                     uint16_t* dst) {
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

FI_AVX512 void fp8_rows_avx512(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols,
                               const uint16_t* table, uint16_t* dst, int64_t ldd,
                               const int32_t* perm) {
  __m512i t[8];
  for (int i = 0; i < 8; ++i) t[i] = _mm512_loadu_si512(table + 32 * i);
  for (int64_t r = 0; r < rows; ++r) {
    fp8_row_avx512(src + r * src_stride, cols, t, dst + (perm ? perm[r] : r) * ldd);
  }
}

// The whole 16-lane groups of scale_to_bf16_row; returns how many elements it wrote.
FI_AVX512 int64_t scale_to_bf16_avx512(const float* c, float alpha, bool add_zero, uint16_t* out,
                                       int64_t n) {
  const __m512 a = _mm512_set1_ps(alpha), z = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m512 v = _mm512_mul_ps(a, _mm512_loadu_ps(c + j));
    if (add_zero) v = _mm512_add_ps(v, z);
    simd512::store(reinterpret_cast<BFloat16*>(out + j), v);
  }
  return j;
}
#endif

}  // namespace

void scale_to_bf16_row(const float* c, float alpha, bool add_zero, uint16_t* out, int64_t n) {
  int64_t j = 0;
#if FLASHINFER_CPU_AVX512
  if (use_avx512()) j = scale_to_bf16_avx512(c, alpha, add_zero, out, n);
#endif
  for (; j < n; ++j) {
    const float v = alpha * c[j];
    out[j] = float_to_bfloat16_bits(add_zero ? v + 0.0f : v);
  }
}

bool exact_in_bf16(DType dt) {
  return dt == DType::kBFloat16 || dt == DType::kFloat8E4M3FN || dt == DType::kFloat8E5M2;
}

const uint16_t* fp8_bf16_table(DType dt) {
  static const std::array<uint16_t, 256> k4 = fp8_to_bf16_table<e4m3>();
  static const std::array<uint16_t, 256> k5 = fp8_to_bf16_table<e5m2>();
  return dt == DType::kFloat8E4M3FN ? k4.data() : k5.data();
}

void fp8_to_bf16(const uint8_t* src, int64_t n, DType dt, uint16_t* dst) {
  fp8_to_bf16_rows(src, n, 1, n, dt, dst, n, nullptr);
}

void fp8_to_bf16_rows(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, DType dt,
                      uint16_t* dst, int64_t ldd, const int32_t* perm) {
  const uint16_t* t = fp8_bf16_table(dt);
#if FLASHINFER_CPU_AVX512
  if (use_avx512()) {
    fp8_rows_avx512(src, src_stride, rows, cols, t, dst, ldd, perm);
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* d = dst + (perm ? perm[r] : r) * ldd;
    for (int64_t i = 0; i < cols; ++i) d[i] = t[src[r * src_stride + i]];
  }
}

void to_bf16_rows(const void* src, DType dt, int64_t rows, int64_t cols, int64_t stride_r,
                  int64_t stride_c, uint16_t* dst, bool parallel) {
  if (dt == DType::kBFloat16) {
    copy_rows(
        static_cast<const uint16_t*>(src), rows, cols, stride_r, stride_c, dst,
        [](uint16_t v) { return v; }, parallel);
    return;
  }
  const uint16_t* t = fp8_bf16_table(dt);
  if (stride_c == 1) {
    const auto* s8 = static_cast<const uint8_t*>(src);
    if (!parallel) {
      fp8_to_bf16_rows(s8, stride_r, rows, cols, dt, dst, cols, nullptr);
      return;
    }
#pragma omp parallel for schedule(static) if (rows > 1 && rows * cols >= (1 << 20))
    for (int64_t r = 0; r < rows; ++r) fp8_to_bf16(s8 + r * stride_r, cols, dt, dst + r * cols);
    return;
  }
  copy_rows(
      static_cast<const uint8_t*>(src), rows, cols, stride_r, stride_c, dst,
      [t](uint8_t v) { return t[v]; }, parallel);
}

#if defined(FLASHINFER_HAVE_ONEDNN)

bool onednn_gemm_available() {
  static const bool on = [] { return !detail::env_switch_is("FLASHINFER_CPU_ONEDNN", "0"); }();
  return on;
}

namespace {

// A matmul primitive with user-managed scratchpad (so one primitive may run on several threads
// at once, each with its own scratch, as torch runs oneDNN), cached per problem: the
// primitive_desc construction (implementation dispatch) is skipped for a repeated shape. The
// thread count is part of the key because oneDNN sizes its decomposition for the team it sees at
// creation; `serial` primitives run inside our own OpenMP team, where oneDNN runs single-threaded.
struct MatmulKey {
  int64_t m, n, k, lda, ldb, ldc;
  int dst;  // 0 f32, 1 bf16, 2 f16
  uint32_t alpha_bits;
  int threads;
  bool operator==(const MatmulKey&) const = default;
};

struct Matmul {
  dnnl::matmul prim;
  std::size_t scratch_bytes = 0;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// Throws dnnl::error when oneDNN refuses the problem.
Matmul get_matmul(const MatmulKey& key) {
  static std::mutex mu;
  static std::vector<std::pair<MatmulKey, Matmul>> cache;  // most recent last
  constexpr std::size_t kMaxEntries = 64;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = cache.begin(); it != cache.end(); ++it) {
      if (it->first == key) {
        std::rotate(it, it + 1, cache.end());
        return cache.back().second;
      }
    }
  }
  using dnnl::memory;
  const memory::desc a_md({key.m, key.k}, memory::data_type::bf16, memory::dims{key.lda, 1});
  // B is [n, k] row-major: the logical [k, n] weights with strides (1, ldb).
  const memory::desc b_md({key.k, key.n}, memory::data_type::bf16, memory::dims{1, key.ldb});
  const memory::data_type dt = key.dst == 0   ? memory::data_type::f32
                               : key.dst == 1 ? memory::data_type::bf16
                                              : memory::data_type::f16;
  const memory::desc c_md({key.m, key.n}, dt, memory::dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  float alpha;
  std::memcpy(&alpha, &key.alpha_bits, 4);
  // Output scale: one fp32 multiply of the fp32 sum before the store's rounding.
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  auto& eng = cpu_engine();
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::matmul::primitive_desc pd(eng, a_md, b_md, c_md, attr);
#else
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng);
#endif
  Matmul mm{dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace_back(key, mm);
  if (cache.size() > kMaxEntries) cache.erase(cache.begin());
  return mm;
}

// `scratch`: at least mm.scratch_bytes, or null to allocate them here.
void run_matmul(const Matmul& mm, const MatmulKey& key, const void* a, const void* b, void* c,
                uint8_t* scratch_mem = nullptr) {
  using dnnl::memory;
  auto& eng = cpu_engine();
  const memory::data_type dt = key.dst == 0   ? memory::data_type::f32
                               : key.dst == 1 ? memory::data_type::bf16
                                              : memory::data_type::f16;
  HostBuffer<uint8_t> own(scratch_mem ? 0 : mm.scratch_bytes);
  uint8_t* scratch = scratch_mem ? scratch_mem : own.get();
  memory am({{key.m, key.k}, memory::data_type::bf16, memory::dims{key.lda, 1}}, eng,
            const_cast<void*>(a));
  memory bm({{key.k, key.n}, memory::data_type::bf16, memory::dims{1, key.ldb}}, eng,
            const_cast<void*>(b));
  memory cm({{key.m, key.n}, dt, memory::dims{key.ldc, 1}}, eng, c);
  memory sm({{static_cast<int64_t>(mm.scratch_bytes)}, memory::data_type::u8, memory::dims{1}}, eng,
            scratch);
  dnnl::stream s(eng);
  mm.prim.execute(
      s,
      {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
  s.wait();
}

uint32_t f32_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

}  // namespace

bool bf16_gemm_nt_out(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                      const uint16_t* b, int64_t ldb, float alpha, DType out_dtype, void* out) {
  if (!onednn_gemm_available() || m <= 0 || n <= 0 || k <= 0 ||
      (out_dtype != DType::kBFloat16 && out_dtype != DType::kFloat16)) {
    return false;
  }
  try {
    const MatmulKey key{m,
                        n,
                        k,
                        lda,
                        ldb,
                        n,
                        out_dtype == DType::kBFloat16 ? 1 : 2,
                        f32_bits(alpha),
                        omp_get_max_threads()};
    run_matmul(get_matmul(key), key, a, b, out);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

bool bf16_gemm_nt_chunked(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                          const std::function<void(int64_t, int64_t, uint16_t*)>& fill_b,
                          const std::function<void(int64_t, int64_t, const float*)>& epilogue) {
  if (!onednn_gemm_available() || m <= 0 || n <= 0 || k <= 0) return false;
  // Column chunks of about 1 MiB of bf16 B (half an L2) and a multiple of 64 columns (oneDNN's
  // N block), at least four per thread when n allows: handed out one at a time, so a thread
  // that lost its core to another process leaves its remaining chunks to the others.
  const int nthr = omp_get_max_threads();
  int64_t nc = std::max<int64_t>(64, ((int64_t{512} * 1024) / k) / 64 * 64);
  while (nc > 64 && (n + nc - 1) / nc < 4 * nthr) nc -= 64;
  nc = std::min(nc, n);
  const int64_t chunks = (n + nc - 1) / nc, tail = n - (chunks - 1) * nc;
  Matmul full, last;
  MatmulKey kf{m, nc, k, lda, k, nc, 0, f32_bits(1.0f), 1}, kl = kf;
  kl.n = kl.ldc = tail;
  try {
    full = get_matmul(kf);
    last = tail == nc ? full : get_matmul(kl);
  } catch (const dnnl::error&) {
    return false;
  }
  // Per-thread buffers, allocated before the team starts (nothing inside it may throw out).
  const std::size_t bsz = static_cast<std::size_t>(nc * k), csz = static_cast<std::size_t>(m * nc),
                    ssz = (std::max(full.scratch_bytes, last.scratch_bytes) + 63) / 64 * 64;
  HostBuffer<uint16_t> b(bsz * nthr);
  HostBuffer<float> c(csz * nthr);
  HostBuffer<uint8_t> scratch(ssz * nthr);
  bool ok = true;
#pragma omp parallel num_threads(nthr) if (chunks > 1)
  {
    const int t = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t ci = 0; ci < chunks; ++ci) {
      const int64_t j0 = ci * nc, w = ci + 1 == chunks ? tail : nc;
      fill_b(j0, w, b.get() + bsz * t);
      try {
        run_matmul(w == nc ? full : last, w == nc ? kf : kl, a, b.get() + bsz * t,
                   c.get() + csz * t, scratch.get() + ssz * t);
        epilogue(j0, w, c.get() + csz * t);
      } catch (const dnnl::error&) {
#pragma omp atomic write
        ok = false;
      }
    }
  }
  return ok;
}

#else

bool onednn_gemm_available() { return false; }

bool bf16_gemm_nt_out(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t,
                      float, DType, void*) {
  return false;
}

bool bf16_gemm_nt_chunked(int64_t, int64_t, int64_t, const uint16_t*, int64_t,
                          const std::function<void(int64_t, int64_t, uint16_t*)>&,
                          const std::function<void(int64_t, int64_t, const float*)>&) {
  return false;
}

#endif

}  // namespace flashinfer::kernels::cpu
