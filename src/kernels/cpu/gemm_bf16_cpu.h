// CPU bf16 GEMM with fp32 accumulation for the large-m GEMMs (mm_bf16, bmm_bf16, bmm_fp8 and
// mm_fp8 with m > kGemmSmallMMax): oneDNN's matmul (Debian's libdnnl-dev, native avx512_bf16 /
// AMX instructions where the CPU has them, the library PyTorch's CPU matmul uses). fp8 inputs
// are widened to bf16 first, which is exact (e4m3 and e5m2 values are all bf16 values). Built
// without oneDNN, or with FLASHINFER_CPU_ONEDNN=0 in the environment, every entry point reports
// "not available" and the callers keep their OpenBLAS sgemm path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/host_allocator.h"
#include "flashinfer/dtype.h"

namespace flashinfer::kernels::cpu {

/// True when this build has oneDNN and FLASHINFER_CPU_ONEDNN is not "0" (read once).
bool onednn_gemm_available();

/// True for the input dtypes whose every value is a bf16 value (bf16, e4m3fn, e5m2).
bool exact_in_bf16(DType dt);

/// The bf16 bits of each of the 256 codes of an fp8 dtype (e4m3fn or e5m2).
const uint16_t* fp8_bf16_table(DType dt);

/// n contiguous fp8 codes (e4m3fn or e5m2) -> bf16 bits, on the calling thread (AVX-512 where
/// the CPU has it).
void fp8_to_bf16(const uint8_t* src, int64_t n, DType dt, uint16_t* dst);

/// rows x cols fp8 codes (row r at src + r * src_stride) -> bf16 bits at dst + dst_row(r) * ldd,
/// dst_row(r) = perm ? perm[r] : r. One pass with the table held in registers (AVX-512).
void fp8_to_bf16_rows(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, DType dt,
                      uint16_t* dst, int64_t ldd, const int32_t* perm);

/// Copies a strided [rows, cols] matrix of an exact_in_bf16 dtype into dense bf16 bits (rows
/// shared by an OpenMP team for large copies when `parallel`).
void to_bf16_rows(const void* src, DType dt, int64_t rows, int64_t cols, int64_t stride_r,
                  int64_t stride_c, uint16_t* dst, bool parallel = true);

/// out[j] = bf16(alpha * c[j]) (plus 0.0f first when add_zero: turns a -0 into +0), j < n: the
/// bits of float_to_bfloat16_bits, 16 lanes at a time where the CPU has AVX-512.
void scale_to_bf16_row(const float* c, float alpha, bool add_zero, uint16_t* out, int64_t n);

/// out[m, n] (dense rows: out_dtype bf16 or fp16, row stride n) = round(alpha * a[m, k] *
/// b[n, k]^T) written by oneDNN itself (fp32 accumulation, one fp32 multiply by alpha when alpha
/// != 1, one RNE rounding by oneDNN's store, with no fp32 product in memory): the numbers of
/// float_to_bfloat16_bits(alpha * sum) except that on avx512_bf16 CPUs the hardware conversion
/// flushes fp32 results below 2^-126 to +-0 and keeps NaN payloads (torch's bf16 matmul is the
/// same primitive). False (out untouched) when not available.
bool bf16_gemm_nt_out(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                      const uint16_t* b, int64_t ldb, float alpha, DType out_dtype, void* out);

/// C = a[m, k] * B^T for a B that exists only chunk by chunk: one OpenMP team shares the column
/// chunks of n; for each, fill_b(j0, nc, dst) writes B's rows [j0, j0 + nc) as dense bf16
/// [nc, k] into a per-thread buffer (still in cache when oneDNN reads it), oneDNN's matmul runs
/// single-threaded into a per-thread dense fp32 [m, nc], and epilogue(j0, nc, c) consumes it.
/// The fp32 sums are those of one oneDNN matmul over the whole B. One parallel region per call (an
/// OpenMP join costs a time slice when the machine is oversubscribed). False (nothing called)
/// when oneDNN is not available or refuses the shapes.
bool bf16_gemm_nt_chunked(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                          const std::function<void(int64_t, int64_t, uint16_t*)>& fill_b,
                          const std::function<void(int64_t, int64_t, const float*)>& epilogue);

/// Uninitialized scratch from the host allocator, whose cache keeps large blocks: a fresh
/// operand-sized buffer every call would page-fault on every 4 KiB.
template <class T>
class HostBuffer {
 public:
  explicit HostBuffer(std::size_t n)
      : p_(static_cast<T*>(detail::host_alloc(n ? n * sizeof(T) : 1, &cap_))) {}
  ~HostBuffer() { detail::host_free(p_, cap_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  T* get() const { return p_; }

 private:
  std::size_t cap_ = 0;
  T* p_;
};

}  // namespace flashinfer::kernels::cpu
