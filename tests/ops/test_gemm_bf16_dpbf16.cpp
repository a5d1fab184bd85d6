// The large-m bf16 GEMM kernel (kernels/cpu/gemm_bf16_dpbf16_cpu.cpp: fp32 FMAs on AVX-512 BF16
// CPUs, dense operands) against its specification bit for bit: oneDNN's avx512_core_bf16 sums (k in
// chunks of min(k, 512), or 1024 for k > 1024, each from +0, added in order; in a chunk, vdpbf16ps
// per k pair: element 2p + 1, then 2p, each an fp32 FMA with its inputs and result flushed when
// subnormal, per the Intel SDM), written as a scalar model here; and against the oneDNN path it
// replaces (same bytes) where the build has oneDNN. Ragged m / n / k tails, odd k, batches,
// bias, both output dtypes; inputs outside the FMA path's exact range
// (subnormal, tiny, huge, Inf, NaN) in the activation or in one weight panel, which take the
// vdpbf16ps path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "api/gemm_params.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/gemm_bf16_cpu.h"
#include "kernels/cpu/gemm_bf16_dpbf16_cpu.h"
#include "kernels/cpu/gemm_cpu.h"

namespace flashinfer {
namespace {

using kernels::cpu::CpuIsa;
using kernels::cpu::GemmPath;

Tensor randn(const Shape& shape, uint64_t seed) {
  return Tensor::empty(shape, DType::kFloat32).normal_(seed, 0, 1).to(DType::kBFloat16);
}

// A [.., m, k] row-major times B [.., k, n] (a view of a [.., n, k] weight) into a new out.
Tensor run(const Tensor& A, const Tensor& B, DType out_dtype, GemmPath path,
           const Tensor* bias = nullptr) {
  Shape shape = A.shape();
  shape.back() = B.size(-1);
  Tensor out = Tensor::empty(shape, out_dtype);
  kernels::GemmParams p = api::gemm_params(A, B, out);
  if (bias) {
    p.bias = bias->data_ptr();
    p.bias_dtype = bias->dtype();
    p.bias_stride = bias->stride(0);
  }
  kernels::cpu::gemm_with(p, path, CpuIsa::kAvx512);
  return out;
}

float f32(uint16_t h) { return bfloat16_bits_to_float(h); }
float flush(float x, bool on) {
  return on && std::fabs(x) < 0x1p-126f ? std::copysign(0.0f, x) : x;
}

// The specification: fp32 sums of one batch item (a row i at a + i * lda, weight row j at
// b + j * ldb), daz_ftz as vdpbf16ps does (false: plain FMAs).
std::vector<float> model_sums(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                              int64_t m, int64_t n, int64_t k, bool daz_ftz) {
  const int64_t kch = k <= 512 ? k : k <= 1024 ? 512 : 1024;
  std::vector<float> c(static_cast<std::size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float total = 0.0f;
      for (int64_t k0 = 0; k0 < k; k0 += kch) {
        const int64_t k1 = std::min(k, k0 + kch);
        float acc = 0.0f;
        for (int64_t kk = k0; kk < k1; kk += 2) {
          for (int64_t e : {kk + 1, kk}) {
            if (e >= k1) continue;  // the pair's zero padding: acc + 0 = acc
            acc = flush(std::fma(flush(f32(a[i * lda + e]), daz_ftz),
                                 flush(f32(b[j * ldb + e]), daz_ftz), acc),
                        daz_ftz);
          }
        }
        total = k0 == 0 ? acc : total + acc;
      }
      c[static_cast<std::size_t>(i * n + j)] = total;
    }
  }
  return c;
}

bool is_nan16(uint16_t h, DType dt) {
  return dt == DType::kBFloat16 ? (h & 0x7FFF) > 0x7F80 : (h & 0x7FFF) > 0x7C00;
}

// Elements of out [batch, m, n] that differ in bits from want (NaN matches any NaN).
int mismatches(const Tensor& out, const std::vector<uint16_t>& want) {
  const auto* o = static_cast<const uint16_t*>(out.contiguous().data_ptr());
  int bad = 0;
  for (std::size_t x = 0; x < want.size(); ++x) {
    const bool both_nan = is_nan16(o[x], out.dtype()) && is_nan16(want[x], out.dtype());
    if (o[x] != want[x] && !both_nan && ++bad <= 3) {
      ADD_FAILURE() << "element " << x << ": got 0x" << std::hex << o[x] << ", want 0x" << want[x];
    }
  }
  return bad;
}

// The model's sums of every batch item, [batch][m * n].
std::vector<std::vector<float>> sums(const Tensor& A, const Tensor& W, bool daz_ftz = true) {
  const int64_t batch = A.dim() == 3 ? A.size(0) : 1, m = A.size(-2), k = A.size(-1),
                n = W.size(-2);
  const auto* a = static_cast<const uint16_t*>(A.data_ptr());
  const auto* w = static_cast<const uint16_t*>(W.data_ptr());
  std::vector<std::vector<float>> c;
  for (int64_t bi = 0; bi < batch; ++bi) {
    c.push_back(model_sums(a + bi * (A.dim() == 3 ? A.stride(0) : 0), A.stride(-2),
                           w + bi * (W.dim() == 3 ? W.stride(0) : 0), W.stride(-2), m, n, k,
                           daz_ftz));
  }
  return c;
}

// The expected bits from the sums: bf16_path's epilogue (hardware bf16 conversion, which
// flushes, into a dense bf16 out without bias; else + bias, one software rounding).
std::vector<uint16_t> finish(const std::vector<std::vector<float>>& c, int64_t n, DType out_dt,
                             const Tensor* bias) {
  std::vector<uint16_t> out;
  for (const auto& cb : c) {
    for (std::size_t x = 0; x < cb.size(); ++x) {
      float v = cb[x];
      if (bias) {
        v += f32(static_cast<const uint16_t*>(bias->data_ptr())[static_cast<int64_t>(x) % n]);
      } else if (out_dt == DType::kBFloat16) {
        v = flush(v, true);
      }
      out.push_back(out_dt == DType::kBFloat16 ? float_to_bfloat16_bits(v) : float_to_half_bits(v));
    }
  }
  return out;
}

// Every sum gets 2^16 at k = 0 and -2^16 at k = k - 5 (odd k - 5 when k is even; in the last k
// chunk): the partial sums in between are held at 2^-7 resolution, so the order of the roundings
// shows in the bf16 result.
void cancel(Tensor& A, Tensor& W) {
  const int64_t m = A.size(-2), n = W.size(-2), k = A.size(-1);
  const int64_t sa = A.stride(-2), sw = W.stride(-2);
  const int64_t batch = A.dim() == 3 ? A.size(0) : 1;
  for (int64_t bi = 0; bi < batch; ++bi) {
    auto* a = static_cast<uint16_t*>(A.data_ptr()) + (A.dim() == 3 ? bi * A.stride(0) : 0);
    auto* w = static_cast<uint16_t*>(W.data_ptr()) + (W.dim() == 3 ? bi * W.stride(0) : 0);
    for (int64_t i = 0; i < m; ++i) a[i * sa] = 0x4380, a[i * sa + k - 5] = 0xC380;  // +-256
    for (int64_t j = 0; j < n; ++j) w[j * sw] = w[j * sw + k - 5] = 0x4380;
  }
}

struct Shape3 {
  int64_t m, n, k;
};

bool available() { return kernels::cpu::bf16_dpbf16_gemm_available(); }

// Random N(0, 1) operands (all in the FMA path's range): the kernel is the model (and the plain
// FMA model: the exactness argument), and the oneDNN path's bytes.
TEST(GemmBf16Dpbf16, RaggedShapesAreTheOneDnnSumsBitForBit) {
  if (!available()) GTEST_SKIP() << "no AVX-512 BF16 (or AMX present): the kernel is off";
  for (Shape3 s : {Shape3{143, 37, 300}, Shape3{131, 70, 600}, Shape3{150, 40, 1100},
                   Shape3{129, 33, 257}, Shape3{129, 40, 2100}, Shape3{30, 64, 128}}) {
    SCOPED_TRACE(::testing::Message() << s.m << "x" << s.n << "x" << s.k);
    Tensor A = randn({s.m, s.k}, s.m + s.k);
    Tensor W = randn({s.n, s.k}, s.n + s.k + 1);
    cancel(A, W);
    Tensor B = W.transpose(0, 1);
    const auto want = finish(sums(A, W), s.n, DType::kBFloat16, nullptr);
    EXPECT_EQ(want, finish(sums(A, W, /*daz_ftz=*/false), s.n, DType::kBFloat16, nullptr));
    const Tensor got = run(A, B, DType::kBFloat16, GemmPath::kDpbf16);
    EXPECT_EQ(mismatches(got, want), 0);
    if (s.m > kernels::cpu::kGemmSmallMMax) {  // kAuto: the small-m path below
      EXPECT_EQ(mismatches(run(A, B, DType::kBFloat16, GemmPath::kAuto), want), 0);
    }
    if (kernels::cpu::onednn_gemm_available()) {
      EXPECT_EQ(mismatches(run(A, B, DType::kBFloat16, GemmPath::kBf16), want), 0);
    }
  }
}

// Batches, bias, fp16 out: the model through store_cols, and the oneDNN path's bytes. Padded
// operand rows (row stride > k) stay on oneDNN, whose sums then differ (another blocking).
TEST(GemmBf16Dpbf16, BatchesBiasFp16OutAndPaddedRows) {
  if (!available()) GTEST_SKIP() << "no AVX-512 BF16 (or AMX present): the kernel is off";
  const int64_t m = 133, n = 45, k = 700;
  Tensor A = randn({2, m, k}, 7), W = randn({2, n, k}, 8);
  cancel(A, W);
  Tensor bias = randn({n}, 9);
  const auto c = sums(A, W);
  for (DType out_dt : {DType::kBFloat16, DType::kFloat16}) {
    for (const Tensor* bs : std::vector<const Tensor*>{nullptr, &bias}) {
      SCOPED_TRACE(::testing::Message() << dtype_torch_name(out_dt) << (bs ? " bias" : ""));
      const Tensor got = run(A, W.transpose(1, 2), out_dt, GemmPath::kDpbf16, bs);
      EXPECT_EQ(mismatches(got, finish(c, n, out_dt, bs)), 0);
      if (kernels::cpu::onednn_gemm_available()) {
        const Tensor old = run(A, W.transpose(1, 2), out_dt, GemmPath::kBf16, bs);
        EXPECT_EQ(std::memcmp(got.data_ptr(), old.data_ptr(), got.nbytes()), 0);
      }
    }
  }
  if (kernels::cpu::onednn_gemm_available()) {
    Tensor Ap = randn({m, k + 2}, 10).slice(1, 0, k), Wp = randn({n, k + 4}, 11).slice(1, 0, k);
    cancel(Ap, Wp);
    const Tensor got = run(Ap, Wp.transpose(0, 1), DType::kBFloat16, GemmPath::kAuto);
    const Tensor old = run(Ap, Wp.transpose(0, 1), DType::kBFloat16, GemmPath::kBf16);
    EXPECT_EQ(std::memcmp(got.data_ptr(), old.data_ptr(), got.nbytes()), 0);
  }
}

// Values outside [2^-56, 2^48): in the activation (every chunk takes vdpbf16ps) or in one weight
// panel (that chunk does). A crafted pair makes the two paths differ where the fallback is
// missed: products 2^-126 (1 + 2^-6) then -2^-126 sum to 2^-132, which vdpbf16ps flushes to 0
// and an FMA keeps (visible through the bias path's software rounding).
TEST(GemmBf16Dpbf16, OutOfRangeInputsTakeTheVdpbf16psPath) {
  if (!available()) GTEST_SKIP() << "no AVX-512 BF16 (or AMX present): the kernel is off";
  const int64_t m = 131, n = 70, k = 300;
  const uint16_t kSub = 0x0023, kTiny = 0x0C80, kHuge = 0x5800, kInf = 0x7F80, kNaN = 0x7FC1;
  auto bits = [](float v) { return float_to_bfloat16_bits(v); };
  for (int c = 0; c < 7; ++c) {
    SCOPED_TRACE(::testing::Message() << "case " << c);
    Tensor A = randn({m, k}, 11), W = randn({n, k}, 12);
    auto* a = static_cast<uint16_t*>(A.data_ptr());
    auto* w = static_cast<uint16_t*>(W.data_ptr());
    // Column 40 (the second 32-column panel) of the weight, or the activation.
    auto* t = c % 2 == 0 ? w + 40 * k : a + 5 * k;
    bool crafted = false;
    switch (c) {
      case 0:  // crafted: a in range, b = +-2^-70 (out of range) in weight row 40
      case 1:  // the same with the roles swapped: out of range in activation row 5
        for (int64_t x = 0; x < k; ++x) (c == 0 ? a[5 * k + x] : w[40 * k + x]) = 0;
        (c == 0 ? a : w)[(c == 0 ? 5 : 40) * k + 1] = bits(0x1p-56f * (1.0f + 0x1p-6f));
        (c == 0 ? a : w)[(c == 0 ? 5 : 40) * k + 0] = bits(0x1p-56f);
        t[1] = bits(0x1p-70f);
        t[0] = bits(-0x1p-70f);
        crafted = true;
        break;
      case 2:
        t[17] = kSub, t[200] = kSub | 0x8000;
        break;
      case 3:
        t[3] = kTiny, t[299] = kHuge;
        break;
      case 4:
        t[100] = kInf;
        break;
      case 5:
        t[7] = kNaN, t[8] = kInf | 0x8000;
        break;
      default:
        a[3 * k + 9] = kSub, w[63 * k + 250] = kNaN;
        break;
    }
    Tensor zero = Tensor::zeros({n}, DType::kBFloat16);
    const auto c0 = sums(A, W);
    for (const Tensor* bs : std::vector<const Tensor*>{nullptr, &zero}) {
      const auto want = finish(c0, n, DType::kBFloat16, bs);
      const Tensor got = run(A, W.transpose(0, 1), DType::kBFloat16, GemmPath::kDpbf16, bs);
      EXPECT_EQ(mismatches(got, want), 0) << (bs ? "bias" : "");
      if (crafted && bs) {
        // The FMA model differs at (5, 40): the case is one the fallback must catch.
        EXPECT_NE(want[5 * n + 40], finish(sums(A, W, false), n, DType::kBFloat16, bs)[5 * n + 40]);
        EXPECT_EQ(want[5 * n + 40], 0);
      }
      if (kernels::cpu::onednn_gemm_available()) {
        const Tensor old = run(A, W.transpose(0, 1), DType::kBFloat16, GemmPath::kBf16, bs);
        std::vector<uint16_t> ob(static_cast<std::size_t>(m * n));
        std::memcpy(ob.data(), old.data_ptr(), ob.size() * 2);
        EXPECT_EQ(mismatches(got, ob), 0) << "vs oneDNN " << (bs ? "bias" : "");
      }
    }
  }
}

// The benchmark shapes against the oneDNN path (too slow for CI: run with
// --gtest_also_run_disabled_tests).
TEST(GemmBf16Dpbf16, DISABLED_BenchShapesMatchOneDnn) {
  if (!available() || !kernels::cpu::onednn_gemm_available()) GTEST_SKIP();
  for (Shape3 s : {Shape3{256, 4096, 4096}, Shape3{1024, 1024, 1024}, Shape3{512, 2048, 2048}}) {
    Tensor A = randn({s.m, s.k}, 1), W = randn({s.n, s.k}, 2);
    cancel(A, W);
    Tensor B = W.transpose(0, 1);
    const Tensor got = run(A, B, DType::kBFloat16, GemmPath::kAuto);
    const Tensor old = run(A, B, DType::kBFloat16, GemmPath::kBf16);
    EXPECT_EQ(std::memcmp(got.data_ptr(), old.data_ptr(), got.nbytes()), 0)
        << s.m << "x" << s.n << "x" << s.k;
  }
}

}  // namespace
}  // namespace flashinfer
