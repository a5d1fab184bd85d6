// Tests of the GEMM ops against a naive fp64 reference, bad input, backend queries, replay and
// CUDA vs CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/stream.h"
#include "kernels/cublaslt_plan.h"
#include "ops/gemm_reference.h"
#include "util/test_util.h"

#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime.h>

#include "core/cuda_runtime.h"
#include "kernels/cuda/gemm_cuda.h"
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer {
namespace {

using testing::all_close;
using testing::default_tolerance;
using testing::gemm_tol;
using testing::ref_bmm;
using testing::Tolerance;

Tensor fp32_scalar(double v) { return Tensor::from_vector({v}, {1}, DType::kFloat32); }

// A column-major [b, k, n] view: the transpose of a contiguous [b, n, k] tensor.
Tensor col_major(int64_t b, int64_t k, int64_t n, DType dt, uint64_t seed, double sd = 1.0) {
  Tensor t = Tensor::empty({b, n, k}, DType::kFloat32).normal_(seed, 0, sd).to(dt);
  return t.transpose(1, 2);
}

struct Shape4 {
  int64_t b, m, n, k;
};
const std::vector<Shape4> kShapes = {
    {1, 1, 1, 1}, {1, 7, 5, 3}, {3, 17, 33, 40}, {2, 64, 48, 128}, {1, 33, 130, 272}};

#if FLASHINFER_TEST_HAVE_CUDART
// cuBLASLt is opened on the first GEMM, not at start-up (linked, its static initializers cost every
// process ~55 ms): first in this file, so no GEMM of this process has run yet. Then it opens, GPU
// or not, and every function the GEMMs call resolves.
TEST(CublasLtLoading, NotMappedUntilUsedThenEveryFunctionResolves) {
  auto mapped = [] {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
      if (line.find("libcublasLt") != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_FALSE(mapped());
  EXPECT_EQ(kernels::cuda::cublaslt_load_error(), "");
  EXPECT_TRUE(mapped());
}
#endif

// ---- bf16 ---------------------------------------------------------------------------------------

TEST(MmBf16, MatchesFp64ReferenceOverShapes) {
  for (const auto& s : kShapes) {
    for (DType out_dt : {DType::kBFloat16, DType::kFloat16}) {
      Tensor a = Tensor::empty({s.m, s.k}, DType::kFloat32).normal_(s.m + s.k).to(DType::kBFloat16);
      Tensor b = col_major(1, s.k, s.n, DType::kBFloat16, s.n * 3 + s.k).select(0, 0);
      Tensor out = mm_bf16(a, b, std::nullopt, false, std::nullopt, out_dt);
      ASSERT_EQ(out.shape(), (Shape{s.m, s.n}));
      ASSERT_EQ(out.dtype(), out_dt);
      EXPECT_TRUE(all_close(out, ref_bmm(a, b, 1.0), gemm_tol(out_dt, s.k)))
          << s.m << "x" << s.n << "x" << s.k;
    }
  }
}

TEST(MmBf16, BiasStridedInputsAndOut) {
  const int64_t m = 9, n = 21, k = 35;
  // a: a row-major view with a padded row stride.
  Tensor wide = Tensor::empty({m, k + 13}, DType::kFloat32).normal_(1).to(DType::kBFloat16);
  Tensor a = wide.slice(1, 0, k);
  // b: the transpose of a padded [n, k] weight.
  Tensor wb = Tensor::empty({n, k + 3}, DType::kFloat32).normal_(2).to(DType::kBFloat16);
  Tensor b = wb.slice(1, 0, k).transpose(0, 1);
  Tensor bias = Tensor::empty({n}, DType::kFloat32).normal_(3).to(DType::kBFloat16);
  Tensor out = Tensor::zeros({m, n}, DType::kFloat16);
  Tensor r = mm_bf16(a, b, bias, false, out, DType::kFloat16);
  EXPECT_EQ(r.data_ptr(), out.data_ptr());
  const auto bv = bias.to_double_vector();
  EXPECT_TRUE(all_close(out, ref_bmm(a, b, 1.0, &bv), gemm_tol(DType::kFloat16, k)));
}

// Upstream's cuDNN backend (the default) takes any strides: a row-major b [k, n] and a
// column-major a give the same numbers as the usual layouts. float32 output (upstream's cudnn,
// cutlass, cutile and cuBLASLt without bias) keeps the fp32 sums; tgv is bf16-only.
TEST(MmBf16, AnyLayoutOnCudnnAndFloat32Output) {
  const int64_t m = 7, n = 24, k = 40;
  Tensor a = Tensor::empty({m, k}, DType::kFloat32).normal_(11).to(DType::kBFloat16);
  Tensor b = col_major(1, k, n, DType::kBFloat16, 12).select(0, 0);
  const Tensor want = mm_bf16(a, b);
  EXPECT_TRUE(all_close(mm_bf16(a, b.contiguous()), want.to_double_vector(), {0.0, 0.0}));
  Tensor a_cm = a.transpose(0, 1).contiguous().transpose(0, 1);
  EXPECT_TRUE(all_close(mm_bf16(a_cm, b.contiguous()), want.to_double_vector(), {0.0, 0.0}));
  Tensor f = mm_bf16(a, b, std::nullopt, false, std::nullopt, DType::kFloat32);
  ASSERT_EQ(f.dtype(), DType::kFloat32);
  EXPECT_TRUE(all_close(f, ref_bmm(a, b, 1.0), {1e-5, 1e-5}));
  Tensor bias = Tensor::empty({n}, DType::kFloat32).normal_(13).to(DType::kBFloat16);
  const auto bv = bias.to_double_vector();
  Tensor fb = mm_bf16(a, b, bias, false, std::nullopt, DType::kFloat32, "cutlass");
  EXPECT_TRUE(all_close(fb, ref_bmm(a, b, 1.0, &bv), {1e-5, 1e-5}));
  EXPECT_FI_ERROR(mm_bf16(a, b, std::nullopt, false, std::nullopt, DType::kFloat32, "tgv"),
                  "mm_bf16", "out_dtype");
  EXPECT_FI_ERROR(mm_bf16(a, b, bias, false, std::nullopt, DType::kFloat32, "cublaslt"), "mm_bf16",
                  "out_dtype");
  Tensor fo = Tensor::zeros({2, m, n}, DType::kFloat32);
  Tensor A3 = Tensor::empty({2, m, k}, DType::kBFloat16);
  Tensor B3 = Tensor::empty({2, n, k}, DType::kBFloat16).transpose(1, 2);
  for (int64_t i = 0; i < 2; ++i) {
    A3.select(0, i).copy_(a);
    B3.select(0, i).copy_(b);
  }
  bmm_bf16(A3, B3, fo, DType::kFloat32);
  EXPECT_TRUE(all_close(fo.select(0, 1), f.to_double_vector(), {1e-6, 1e-6}));
}

TEST(BmmBf16, MatchesFp64ReferenceOverShapes) {
  for (const auto& s : kShapes) {
    Tensor A =
        Tensor::empty({s.b, s.m, s.k}, DType::kFloat32).normal_(s.b + s.m).to(DType::kBFloat16);
    Tensor B = col_major(s.b, s.k, s.n, DType::kBFloat16, 7 + s.k);
    Tensor out = bmm_bf16(A, B);
    ASSERT_EQ(out.shape(), (Shape{s.b, s.m, s.n}));
    EXPECT_TRUE(all_close(out, ref_bmm(A, B, 1.0), gemm_tol(DType::kBFloat16, s.k)))
        << s.b << "x" << s.m << "x" << s.n << "x" << s.k;
  }
}

// ---- fp8 ----------------------------------------------------------------------------------------

TEST(BmmFp8, MatchesFp64ReferenceOverShapesAndDtypes) {
  const std::vector<std::pair<DType, DType>> combos = {{DType::kFloat8E4M3FN, DType::kFloat8E4M3FN},
                                                       {DType::kFloat8E4M3FN, DType::kFloat8E5M2},
                                                       {DType::kFloat8E5M2, DType::kFloat8E4M3FN}};
  for (const auto& s : kShapes) {
    for (auto [adt, bdt] : combos) {
      Tensor A = Tensor::empty({s.b, s.m, s.k}, DType::kFloat32).normal_(s.k, 0, 40).to(adt);
      Tensor B = col_major(s.b, s.k, s.n, bdt, s.n + 11, 40);
      const double sa = 0.0125, sb = 0.03125;
      for (DType out_dt : {DType::kBFloat16, DType::kFloat16}) {
        Tensor out = bmm_fp8(A, B, fp32_scalar(sa), fp32_scalar(sb), out_dt);
        ASSERT_EQ(out.dtype(), out_dt);
        EXPECT_TRUE(all_close(out, ref_bmm(A, B, static_cast<float>(sa) * static_cast<float>(sb)),
                              gemm_tol(out_dt, s.k)))
            << s.b << "x" << s.m << "x" << s.n << "x" << s.k;
      }
    }
  }
}

TEST(BmmFp8, SeedProducerExample) {
  // The logging page's producer: b, m, n, k = 4, 64, 128, 256, per-tensor scaled e4m3 inputs,
  // B a transposed [b, n, k], a pre-allocated bf16 out, backend "cublas".
  const int64_t b = 4, m = 64, n = 128, k = 256;
  auto to_float8 = [](const Tensor& x) {
    double amax = 1e-12;
    for (double v : x.to_double_vector()) amax = std::max(amax, std::fabs(v));
    const double scale = 448.0 / amax;
    std::vector<double> v = x.to_double_vector();
    for (double& e : v) e = std::clamp(e * scale, -448.0, 448.0);
    Tensor q = Tensor::from_vector(v, x.shape(), DType::kFloat8E4M3FN);
    return std::pair<Tensor, Tensor>(q, fp32_scalar(1.0 / scale));
  };
  Tensor input = Tensor::empty({b, m, k}, DType::kFloat32).normal_(100).to(DType::kBFloat16);
  Tensor mat2 = Tensor::empty({b, n, k}, DType::kFloat32).normal_(101).to(DType::kBFloat16);
  auto [input_fp8, input_inv_s] = to_float8(input);
  auto [mat2_fp8_rm, mat2_inv_s] = to_float8(mat2);
  Tensor mat2_fp8 = mat2_fp8_rm.transpose(1, 2);
  Tensor res = Tensor::empty({b, m, n}, DType::kBFloat16);
  bmm_fp8(input_fp8, mat2_fp8, input_inv_s, mat2_inv_s, DType::kBFloat16, res, "cublas");
  const double scale =
      static_cast<float>(input_inv_s.item()) * static_cast<float>(mat2_inv_s.item());
  EXPECT_TRUE(all_close(res, ref_bmm(input_fp8, mat2_fp8, scale), gemm_tol(DType::kBFloat16, k)));

  // Replay from Values (what the recorder stores): positional args as the page passes them.
  const OpDecl* d = OpRegistry::global().find("bmm_fp8");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->module, "flashinfer.gemm.gemm_base");
  Tensor res2 = Tensor::empty({b, m, n}, DType::kBFloat16);
  d->invoke(CallArgs(*d, bind_arguments(*d,
                                        {Value(input_fp8), Value(mat2_fp8), Value(input_inv_s),
                                         Value(mat2_inv_s), Value(DType::kBFloat16), Value(res2)},
                                        {{"backend", Value("cublas")}})));
  EXPECT_TRUE(all_close(res2, res, Tolerance{0, 0}));
}

// ---- fp4 ----------------------------------------------------------------------------------------

// backend="trtllm" takes the weight as trtllm-gen wants it, prepared as vLLM's
// FlashInferTrtllmNvFp4LinearKernel and upstream's tests do: shuffle_matrix_a(W, 128) and
// shuffle_matrix_sf_a(W's linear scales, 128) reshaped to the scales' shape, both passed
// transposed. The same bits as the plain weight with another backend.
TEST(MmFp4, TrtllmBackendTakesTheShuffledWeight) {
  const int64_t m = 5, n = 128, k = 64;
  Tensor a = Tensor::empty({m, k}, DType::kFloat32).normal_(3).to(DType::kBFloat16);
  Tensor w = Tensor::empty({n, k}, DType::kFloat32).normal_(4).to(DType::kBFloat16);
  const double gsa = 448.0 * 6.0 / 4.0, gsb = 448.0 * 6.0 / 3.0;
  auto [qa, sfa] = nvfp4_quantize(a, fp32_scalar(gsa), SfLayout::layout_8x4);
  auto [qb, sfb] = nvfp4_quantize(w, fp32_scalar(gsb));
  auto [qb_lin, sfb_lin] = nvfp4_quantize(w, fp32_scalar(gsb), SfLayout::layout_linear);
  const Tensor alpha = fp32_scalar(1.0 / (gsa * gsb));
  const Tensor plain = mm_fp4(qa, qb.transpose(0, 1), sfa, sfb.transpose(0, 1), alpha,
                              DType::kBFloat16, std::nullopt, 16, true, "cutlass", true);
  const Tensor w_shuf = shuffle_matrix_a(qb_lin, 128);
  const Tensor sf_shuf = shuffle_matrix_sf_a(sfb_lin, 128).reshape(sfb.shape());
  const Tensor t = mm_fp4(qa, w_shuf.transpose(0, 1), sfa, sf_shuf.transpose(0, 1), alpha,
                          DType::kBFloat16, std::nullopt, 16, true, "trtllm", true);
  EXPECT_TRUE(all_close(t, plain, Tolerance{0, 0}));
  // The unshuffled weight read as shuffled gives other numbers: the backend's layout matters.
  const Tensor wrong = mm_fp4(qa, qb.transpose(0, 1), sfa, sfb.transpose(0, 1), alpha,
                              DType::kBFloat16, std::nullopt, 16, true, "trtllm", true);
  EXPECT_FALSE(all_close(wrong, plain, Tolerance{1e-3, 1e-3}));
}

TEST(MmFp4, Nvfp4AndMxfp4MatchFp64ReferenceOfDequantizedOperands) {
  for (auto [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 8, 16}, {13, 24, 64}, {130, 40, 96}}) {
    for (bool nvfp4 : {true, false}) {
      if (!nvfp4 && k % 32 != 0) continue;
      for (bool a8x4 : {false, true}) {
        if (!nvfp4 && a8x4) continue;
        Tensor a = Tensor::empty({m, k}, DType::kFloat32).normal_(m + k).to(DType::kBFloat16);
        Tensor w = Tensor::empty({n, k}, DType::kFloat32).normal_(n + k).to(DType::kBFloat16);
        const double gsa = 448.0 * 6.0 / 4.0, gsb = 448.0 * 6.0 / 3.0;
        Tensor qa, sfa, qb, sfb, alpha;
        if (nvfp4) {
          std::tie(qa, sfa) = nvfp4_quantize(a, fp32_scalar(gsa),
                                             a8x4 ? SfLayout::layout_8x4 : SfLayout::layout_128x4);
          std::tie(qb, sfb) = nvfp4_quantize(w, fp32_scalar(gsb));
          alpha = fp32_scalar(1.0 / (gsa * gsb));
        } else {
          std::tie(qa, sfa) = mxfp4_quantize(a);
          std::tie(qb, sfb) = mxfp4_quantize(w);
        }
        Tensor out = mm_fp4(qa, qb.transpose(0, 1), sfa, sfb.transpose(0, 1),
                            nvfp4 ? std::optional<Tensor>(alpha) : std::nullopt, DType::kBFloat16,
                            std::nullopt, nvfp4 ? 16 : 32, a8x4, "auto", nvfp4);
        ASSERT_EQ(out.shape(), (Shape{m, n}));
        // Reference from the operands' exact dequantized values (8x4 scales re-laid via the
        // offset formula).
        std::vector<double> da(m * k), db(n * k);
        const int vec = nvfp4 ? 16 : 32;
        const int64_t kk = k;  // clang 14 cannot capture structured bindings in a lambda
        auto deq = [&, k = kk](const Tensor& q, const Tensor& sf, SfLayout l, int64_t rows,
                               std::vector<double>& dst) {
          const Tensor qc = q.contiguous();
          const Tensor sc = sf.contiguous();
          const auto* qp = static_cast<const uint8_t*>(qc.data_ptr());
          const auto* sp = static_cast<const uint8_t*>(sc.data_ptr());
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < k; ++c) {
              const uint8_t s = sp[sf_layout_offset(l, r, c / vec, k / vec)];
              const double scale = nvfp4 ? e4m3fn_bits_to_float(s) : std::ldexp(1.0, s - 127);
              const uint8_t byte = qp[r * (k / 2) + c / 2];
              dst[r * k + c] = e2m1_bits_to_float(c % 2 ? byte >> 4 : byte & 0xF) * scale;
            }
          }
        };
        deq(qa, sfa, a8x4 ? SfLayout::layout_8x4 : SfLayout::layout_128x4, m, da);
        deq(qb, sfb, SfLayout::layout_128x4, n, db);
        const double al = nvfp4 ? static_cast<float>(1.0 / (gsa * gsb)) : 1.0;
        std::vector<double> ref(m * n);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t c = 0; c < k; ++c) s += da[i * k + c] * db[j * k + c];
            ref[i * n + j] = al * s;
          }
        }
        EXPECT_TRUE(all_close(out, ref, gemm_tol(DType::kBFloat16, k)))
            << m << "x" << n << "x" << k << (nvfp4 ? " nvfp4" : " mxfp4") << (a8x4 ? " 8x4" : "");
        // And the fp4 GEMM approximates the original product.
        EXPECT_TRUE(all_close(out, ref_bmm(a, w.transpose(0, 1), 1.0),
                              Tolerance{0.8 * std::sqrt(static_cast<double>(k)), 0.25}));
      }
    }
  }
}

// ---- bad input ----------------------------------------------------------------------------------

// Upstream's defining module and signature text (inspect.signature at the pinned commit).
// Upstream 0.7.4's batch_invariant=True: on the CPU the usual result; refused as upstream
// refuses it (a backend other than "auto", mm_bf16's non-bf16 output, K or N off the alignment).
TEST(MmBf16, BatchInvariantAsUpstreamRefusesIt) {
  Tensor a = Tensor::empty({5, 64}, DType::kFloat32).normal_(3, 0, 1).to(DType::kBFloat16);
  Tensor b = col_major(1, 64, 24, DType::kBFloat16, 24, 1).select(0, 0);
  const Tensor want = mm_bf16(a, b, std::nullopt, false, std::nullopt, DType::kBFloat16, "auto");
  const Tensor got =
      mm_bf16(a, b, std::nullopt, false, std::nullopt, DType::kBFloat16, "auto", true);
  EXPECT_EQ(got.to_double_vector(), want.to_double_vector());
  const char* op = "mm_bf16";
  EXPECT_FI_ERROR(mm_bf16(a, b, std::nullopt, false, std::nullopt, DType::kBFloat16, "cudnn", true),
                  op, "batch_invariant");
  EXPECT_FI_ERROR(mm_bf16(a, b, std::nullopt, false, std::nullopt, DType::kFloat16, "auto", true),
                  op, "batch_invariant");
  Tensor a60 = a.slice(1, 0, 60).contiguous();
  Tensor b60 = col_major(1, 60, 24, DType::kBFloat16, 24, 1).select(0, 0);
  EXPECT_FI_ERROR(
      mm_bf16(a60, b60, std::nullopt, false, std::nullopt, DType::kBFloat16, "auto", true), op,
      "batch_invariant");
  Tensor A = Tensor::empty({2, 8, 32}, DType::kFloat32).normal_(4, 0, 8).to(DType::kFloat8E4M3FN);
  Tensor B = col_major(2, 32, 16, DType::kFloat8E4M3FN, 16, 8);
  const Tensor s = fp32_scalar(0.5);
  EXPECT_EQ(bmm_fp8(A, B, s, s, DType::kBFloat16, std::nullopt, "auto", true).to_double_vector(),
            bmm_fp8(A, B, s, s, DType::kBFloat16, std::nullopt, "auto").to_double_vector());
  EXPECT_FI_ERROR(bmm_fp8(A, B, s, s, DType::kBFloat16, std::nullopt, "cublas", true), "bmm_fp8",
                  "batch_invariant");
}

TEST(GemmDecl, SignaturesAndModulesEqualUpstream) {
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"mm_bf16",
       "(a, b, bias=None, pdl=False, out=None, out_dtype=torch.bfloat16, backend='cudnn', *, "
       "batch_invariant=False)"},
      {"bmm_bf16", "(A, B, out=None, out_dtype=torch.bfloat16, backend='cudnn')"},
      {"bmm_fp8",
       "(A, B, A_scale, B_scale, dtype, out=None, backend='cublas', *, batch_invariant=False)"},
      {"mm_fp4",
       "(a, b, a_descale, b_descale, alpha=None, out_dtype=torch.bfloat16, out=None, "
       "block_size=16, use_8x4_sf_layout=False, backend='auto', use_nvfp4=True, "
       "enable_pdl=True, *, batch_invariant=False)"},
  };
  for (const auto& [name, sig] : expected) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, "flashinfer.gemm.gemm_base") << name;
    EXPECT_EQ(d->signature(), sig) << name;
    EXPECT_TRUE(d->params.at(static_cast<std::size_t>(d->param_index("out"))).mutated) << name;
  }
}

TEST(GemmBadInput, ErrorsNameOpAndArgument) {
  Tensor A = Tensor::zeros({2, 8, 32}, DType::kFloat8E4M3FN);
  Tensor B = Tensor::zeros({2, 16, 32}, DType::kFloat8E4M3FN).transpose(1, 2);
  Tensor s = fp32_scalar(1.0);
  const DType bf = DType::kBFloat16;
  // k mismatch, batch mismatch, B not column-major, A not row-major, rank.
  EXPECT_FI_ERROR(
      bmm_fp8(A, Tensor::zeros({2, 16, 24}, DType::kFloat8E4M3FN).transpose(1, 2), s, s, bf),
      "bmm_fp8", "B");
  EXPECT_FI_ERROR(
      bmm_fp8(A, Tensor::zeros({3, 16, 32}, DType::kFloat8E4M3FN).transpose(1, 2), s, s, bf),
      "bmm_fp8", "B");
  EXPECT_FI_ERROR(bmm_fp8(A, Tensor::zeros({2, 32, 16}, DType::kFloat8E4M3FN), s, s, bf), "bmm_fp8",
                  "B");
  EXPECT_FI_ERROR(
      bmm_fp8(Tensor::zeros({2, 32, 8}, DType::kFloat8E4M3FN).transpose(1, 2), B, s, s, bf),
      "bmm_fp8", "A");
  EXPECT_FI_ERROR(bmm_fp8(A.select(0, 0), B, s, s, bf), "bmm_fp8", "A");
  // dtypes: non-fp8 operands, e5m2 x e5m2, output dtype.
  EXPECT_FI_ERROR(bmm_fp8(Tensor::zeros({2, 8, 32}, bf), B, s, s, bf), "bmm_fp8", "A");
  EXPECT_FI_ERROR(bmm_fp8(Tensor::zeros({2, 8, 32}, DType::kFloat8E5M2),
                          Tensor::zeros({2, 16, 32}, DType::kFloat8E5M2).transpose(1, 2), s, s, bf),
                  "bmm_fp8", "B");
  EXPECT_FI_ERROR(bmm_fp8(A, B, s, s, DType::kFloat32), "bmm_fp8", "dtype");
  // scales: shape, dtype.
  EXPECT_FI_ERROR(bmm_fp8(A, B, Tensor::zeros({2}, DType::kFloat32), s, bf), "bmm_fp8", "A_scale");
  EXPECT_FI_ERROR(bmm_fp8(A, B, s, Tensor::zeros({1}, DType::kFloat16), bf), "bmm_fp8", "B_scale");
  // out: shape, dtype.
  EXPECT_FI_ERROR(bmm_fp8(A, B, s, s, bf, Tensor::zeros({2, 8, 8}, bf)), "bmm_fp8", "out");
  EXPECT_FI_ERROR(bmm_fp8(A, B, s, s, bf, Tensor::zeros({2, 8, 16}, DType::kFloat16)), "bmm_fp8",
                  "out");
  // backend: unknown name.
  EXPECT_FI_ERROR(bmm_fp8(A, B, s, s, bf, std::nullopt, "rocblas"), "bmm_fp8", "backend");

  Tensor a = Tensor::zeros({4, 32}, bf);
  Tensor b = Tensor::zeros({8, 32}, bf).transpose(0, 1);
  EXPECT_FI_ERROR(
      mm_bf16(a, Tensor::zeros({32, 8}, bf), std::nullopt, false, std::nullopt, bf, "cublaslt"),
      "mm_bf16", "b");
  EXPECT_FI_ERROR(mm_bf16(a, Tensor::zeros({8, 16}, bf).transpose(0, 1)), "mm_bf16", "b");
  EXPECT_FI_ERROR(mm_bf16(a.to(DType::kFloat16), b), "mm_bf16", "a");
  EXPECT_FI_ERROR(mm_bf16(a, b, Tensor::zeros({4}, bf)), "mm_bf16", "bias");
  EXPECT_FI_ERROR(mm_bf16(a, b, std::nullopt, false, std::nullopt, DType::kFloat8E4M3FN), "mm_bf16",
                  "out_dtype");
  EXPECT_FI_ERROR(mm_bf16(a, b, std::nullopt, false, std::nullopt, bf, "tensorrt"), "mm_bf16",
                  "backend");
  EXPECT_FI_ERROR(bmm_bf16(a, b), "bmm_bf16", "A");

  // mm_fp4: block size, k not a multiple of the block, scale buffers.
  Tensor x = Tensor::empty({8, 64}, DType::kFloat32).normal_(5).to(bf);
  auto [qa, sfa] = nvfp4_quantize(x, s);
  auto [qb, sfb] = nvfp4_quantize(x, s);
  Tensor bt = qb.transpose(0, 1), sbt = sfb.transpose(0, 1);
  EXPECT_FI_ERROR(mm_fp4(qa, bt, sfa, sbt, s, bf, std::nullopt, 32), "mm_fp4", "block_size");
  EXPECT_FI_ERROR(mm_fp4(qa, bt, sfa.slice(0, 0, 64), sbt), "mm_fp4", "a_descale");
  EXPECT_FI_ERROR(mm_fp4(qa, bt, sfa, sfb.to(DType::kFloat32).transpose(0, 1)), "mm_fp4",
                  "b_descale");
  EXPECT_FI_ERROR(mm_fp4(qa, qb, sfa, sbt), "mm_fp4", "b");
  EXPECT_FI_ERROR(mm_fp4(qa.slice(1, 0, 12), bt.slice(0, 0, 12), sfa, sbt), "mm_fp4", "a");
  EXPECT_FI_ERROR(mm_fp4(qa, bt, sfa, sbt, Tensor::zeros({1}, DType::kFloat64)), "mm_fp4", "alpha");
  EXPECT_FI_ERROR(mm_fp4(qa, bt, sfa, sbt, s, bf, std::nullopt, 16, false, "cublas"), "mm_fp4",
                  "backend");
}

// ---- backend queries ----------------------------------------------------------------------------

TEST(BackendQueries, HonestAboutThisBuild) {
  const auto& fp8 = backend_requirement("bmm_fp8");
  EXPECT_EQ(fp8.default_backend, "cublas");
  EXPECT_TRUE(fp8.is_known_backend("cudnn"));
  EXPECT_FALSE(fp8.is_known_backend("rocblas"));
  // Backends this build does not have are never supported, on any compute capability. bmm_fp8's
  // "cudnn" is cuDNN's graph, offered only where the build has cuDNN (test_gemm_cudnn.cpp).
  const bool cudnn = build_info().cuda && build_info().cudnn;
  EXPECT_EQ(fp8.is_backend_supported("cudnn"), cudnn);
  EXPECT_FALSE(fp8.is_backend_supported("cutlass", 100));
  EXPECT_FALSE(backend_requirement("mm_bf16").is_backend_supported("tgv", 100));
  EXPECT_FALSE(backend_requirement("mm_fp4").is_backend_supported("cudnn", 100));
  // The quantizers' "cute-dsl" is upstream's CuTe-DSL semantics on this build's kernels.
  EXPECT_EQ(backend_requirement("fp4_quantize").is_backend_supported("cute-dsl", 100),
            cuda_compiled());
  if (cuda_compiled()) {
    EXPECT_TRUE(fp8.is_backend_supported("cublas"));
    EXPECT_TRUE(fp8.is_backend_supported("cublas", 90));
    EXPECT_TRUE(fp8.is_backend_supported("auto", 89));
    EXPECT_FALSE(fp8.is_backend_supported("cublas", 80));  // no fp8 tensor cores before sm89
    EXPECT_TRUE(fp8.is_compute_capability_supported(90));
    EXPECT_FALSE(fp8.is_compute_capability_supported(86));
    EXPECT_EQ(fp8.supported_backends(90),
              cudnn ? (std::vector<std::string>{"cudnn", "cublas", "auto"})
                    : (std::vector<std::string>{"cublas", "auto"}));
    EXPECT_TRUE(backend_requirement("mm_bf16").is_backend_supported("cudnn", 80));
    EXPECT_FALSE(backend_requirement("mm_bf16").is_backend_supported("cudnn", 75));
    // FP4 GEMMs are Blackwell-only upstream (its per-backend @supported_compute_capability).
    EXPECT_FALSE(backend_requirement("mm_fp4").is_backend_supported("auto", 90));
    EXPECT_TRUE(backend_requirement("mm_fp4").is_backend_supported("auto", 100));
    EXPECT_TRUE(backend_requirement("mxfp8_quantize").is_compute_capability_supported(90));
  } else {
    for (const auto& op : ops_with_backend_requirement()) {
      const auto& r = backend_requirement(op);
      EXPECT_TRUE(r.supported_backends().empty()) << op;
      EXPECT_FALSE(r.is_compute_capability_supported(90)) << op;
    }
  }
  for (const char* op : {"mm_bf16", "bmm_bf16", "bmm_fp8", "mm_fp4", "fp4_quantize",
                         "nvfp4_quantize", "mxfp4_quantize", "mxfp8_quantize"}) {
    const auto& r = backend_requirement(op);
    EXPECT_TRUE(r.is_known_backend(r.default_backend)) << op;
    // The declared default matches the table's.
    const OpDecl* d = OpRegistry::global().find(op);
    ASSERT_NE(d, nullptr) << op;
    const int i = d->param_index("backend");
    ASSERT_GE(i, 0) << op;
    EXPECT_EQ(d->params[i].default_value->as_string(), r.default_backend) << op;
  }
  EXPECT_FI_ERROR(backend_requirement("rmsnorm"), "backend_requirement", "op");
  // The CPU reference stands in for every backend upstream defines.
  Tensor a = Tensor::zeros({2, 16}, DType::kBFloat16);
  Tensor b = Tensor::zeros({4, 16}, DType::kBFloat16).transpose(0, 1);
  for (const char* be : {"cudnn", "cutlass", "tgv", "auto"}) {
    EXPECT_EQ(mm_bf16(a, b, std::nullopt, false, std::nullopt, DType::kBFloat16, be).shape(),
              (Shape{2, 4}));
  }
}

// ---- CUDA vs CPU --------------------------------------------------------------------------------

TEST(GemmCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  // A backend upstream has but this build does not run on a GPU: a clear error naming it.
  Tensor Z8a = Tensor::zeros({1, 16, 32}, DType::kFloat8E4M3FN, g);
  Tensor Z8b = Tensor::zeros({1, 16, 32}, DType::kFloat8E4M3FN, g).transpose(1, 2);
  Tensor one = fp32_scalar(1.0).to(g);
  if (!build_info().cudnn) {
    EXPECT_FI_ERROR(bmm_fp8(Z8a, Z8b, one, one, DType::kBFloat16, std::nullopt, "cudnn"), "bmm_fp8",
                    "backend");
  }
  // fp8 cuBLASLt needs sm89+; below that the default backend is refused by name.
  bool fp8_ok = true;
  try {
    bmm_fp8(Z8a, Z8b, one, one, DType::kBFloat16);
  } catch (const Error& e) {
    EXPECT_EQ(e.arg(), "backend") << e.what();
    fp8_ok = false;
  }
  if (fp8_ok) {
    // k = 24: not a multiple of 16, which cuBLASLt's fp8 kernels need.
    EXPECT_FI_ERROR(bmm_fp8(Z8a.slice(2, 0, 24), Z8b.slice(1, 0, 24), one, one, DType::kBFloat16),
                    "bmm_fp8", "A");
    // n = 8: cuBLASLt's fp8 heuristic answers CUBLAS_STATUS_NOT_SUPPORTED for an n that is not
    // a multiple of 16 (on the H100 this test once failed that way with n = 130); the op
    // refuses it first, naming B.
    EXPECT_FI_ERROR(bmm_fp8(Z8a, Z8b.slice(2, 0, 8), one, one, DType::kBFloat16), "bmm_fp8", "B");
    // An out whose rows are 20 bf16 = 40 bytes apart: not a multiple of 16 bytes.
    Tensor out20 = Tensor::zeros({1, 16, 20}, DType::kBFloat16, g).slice(2, 0, 16);
    EXPECT_FI_ERROR(bmm_fp8(Z8a, Z8b, one, one, DType::kBFloat16, out20), "bmm_fp8", "out");
  }
  for (const auto& s : kShapes) {
    Tensor A = Tensor::empty({s.b, s.m, s.k}, DType::kFloat32).normal_(1).to(DType::kBFloat16);
    Tensor B = col_major(s.b, s.k, s.n, DType::kBFloat16, 2);
    Tensor Bg = B.transpose(1, 2).to(g).transpose(1, 2);
    EXPECT_TRUE(all_close(bmm_bf16(A.to(g), Bg), bmm_bf16(A, B), gemm_tol(DType::kBFloat16, s.k)));
    Tensor a2 = A.select(0, 0), b2 = B.select(0, 0);
    EXPECT_TRUE(all_close(mm_bf16(a2.to(g), Bg.select(0, 0)), mm_bf16(a2, b2),
                          gemm_tol(DType::kBFloat16, s.k)));
    if (s.k % 16 == 0 && s.n % 16 == 0 && fp8_ok) {
      Tensor A8 = A.to(DType::kFloat8E4M3FN);
      Tensor B8 = B.transpose(1, 2).contiguous().to(DType::kFloat8E4M3FN);
      Tensor sa = fp32_scalar(0.5), sb = fp32_scalar(0.25);
      Tensor cpu = bmm_fp8(A8, B8.transpose(1, 2), sa, sb, DType::kBFloat16);
      Tensor gpu =
          bmm_fp8(A8.to(g), B8.to(g).transpose(1, 2), sa.to(g), sb.to(g), DType::kBFloat16);
      EXPECT_TRUE(all_close(gpu, cpu, gemm_tol(DType::kBFloat16, s.k)));
    }
  }
  // fp16 output (through fp32 on cuBLASLt) with a bias.
  {
    Tensor a2 = Tensor::empty({19, 40}, DType::kFloat32).normal_(5).to(DType::kBFloat16);
    Tensor b2 = col_major(1, 40, 24, DType::kBFloat16, 6).select(0, 0);
    Tensor bias = Tensor::empty({24}, DType::kFloat32).normal_(7).to(DType::kBFloat16);
    Tensor b2g = b2.transpose(0, 1).to(g).transpose(0, 1);
    EXPECT_TRUE(all_close(mm_bf16(a2.to(g), b2g, bias.to(g), false, std::nullopt, DType::kFloat16),
                          mm_bf16(a2, b2, bias, false, std::nullopt, DType::kFloat16),
                          gemm_tol(DType::kFloat16, 40)));
  }
  // FP4 GEMMs: upstream runs them on Blackwell only; on another GPU the call is refused as
  // upstream refuses it (docs/CONFORMANCE.md, "Ops upstream runs only on some GPUs").
  const bool fp4_ok =
      backend_requirement("mm_fp4").is_backend_supported("auto", api::compute_capability(g));
  auto fp4_matches = [&](const auto& run_gpu, const Tensor& cpu, const auto& tol) {
    if (fp4_ok) {
      EXPECT_TRUE(all_close(run_gpu(), cpu, tol));
      return;
    }
    try {
      run_gpu();
      ADD_FAILURE() << "mm_fp4 ran on a GPU upstream refuses it on";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("No suitable auto backends found for mm_fp4"),
                std::string::npos)
          << e.what();
    }
  };
  // MXFP4 operands.
  {
    Tensor a2 = Tensor::empty({21, 64}, DType::kFloat32).normal_(8).to(DType::kBFloat16);
    Tensor w2 = Tensor::empty({40, 64}, DType::kFloat32).normal_(9).to(DType::kBFloat16);
    // Plain variables, not structured bindings: the lambda below captures them (clang 14 cannot
    // capture a structured binding).
    const auto a2q = mxfp4_quantize(a2), w2q = mxfp4_quantize(w2);
    const Tensor qa2 = std::get<0>(a2q), sa2 = std::get<1>(a2q);
    const Tensor qb2 = std::get<0>(w2q), sb2 = std::get<1>(w2q);
    Tensor cpu2 = mm_fp4(qa2, qb2.transpose(0, 1), sa2, sb2.transpose(0, 1), std::nullopt,
                         DType::kFloat16, std::nullopt, 32, false, "auto", false);
    fp4_matches(
        [&] {
          return mm_fp4(qa2.to(g), qb2.to(g).transpose(0, 1), sa2.to(g), sb2.to(g).transpose(0, 1),
                        std::nullopt, DType::kFloat16, std::nullopt, 32, false, "auto", false);
        },
        cpu2, gemm_tol(DType::kFloat16, 64));
  }
  Tensor a = Tensor::empty({37, 128}, DType::kFloat32).normal_(3).to(DType::kBFloat16);
  Tensor w = Tensor::empty({72, 128}, DType::kFloat32).normal_(4).to(DType::kBFloat16);
  Tensor gs = fp32_scalar(100.0);
  const auto aq = nvfp4_quantize(a, gs), wq = nvfp4_quantize(w, gs);
  const Tensor qa = std::get<0>(aq), sfa = std::get<1>(aq);
  const Tensor qb = std::get<0>(wq), sfb = std::get<1>(wq);
  Tensor al = fp32_scalar(1e-4);
  Tensor cpu = mm_fp4(qa, qb.transpose(0, 1), sfa, sfb.transpose(0, 1), al);
  fp4_matches(
      [&] {
        return mm_fp4(qa.to(g), qb.to(g).transpose(0, 1), sfa.to(g), sfb.to(g).transpose(0, 1),
                      al.to(g));
      },
      cpu, gemm_tol(DType::kBFloat16, 128));
}

// bmm_fp8 as SGLang and vLLM call it for DeepSeek's absorbed MLA projections on Hopper: a batch of
// 16 to 128 heads, one or a few tokens (decode), k and n of 128 and 512, B a column-major view of
// the [heads, n, k] weight, with and without `out`. The operands are small integers and the
// scales powers of two, so every fp32 sum is exact in any order of accumulation and the GPU must
// give the CPU's bits. GemmCuda.MatchesCpu's one fp8 shape has 2 heads and 64 rows.
TEST(GemmCuda, BmmFp8AtTheEnginesMlaShapesIsExact) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  if (api::compute_capability(g) < 89) GTEST_SKIP() << "fp8 cuBLASLt needs sm89+";
  // Integers in [-3, 3]: |sum| <= 9 * 512 < 2^24, and each is an e4m3 value.
  auto small_ints = [](std::vector<int64_t> shape, uint64_t seed) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<double> v(static_cast<std::size_t>(n));
    uint64_t x = seed;
    for (double& e : v) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      e = static_cast<double>(static_cast<int64_t>((x >> 33) % 7) - 3);
    }
    return Tensor::from_vector(v, shape, DType::kFloat32).to(DType::kFloat8E4M3FN);
  };
  struct MlaShape {
    int64_t heads, tokens, k, n;
  };
  for (const MlaShape s :
       {MlaShape{16, 1, 128, 512}, MlaShape{16, 1, 512, 128}, MlaShape{128, 1, 128, 512},
        MlaShape{128, 3, 512, 128}, MlaShape{32, 16, 128, 512}}) {
    SCOPED_TRACE(::testing::Message()
                 << "heads " << s.heads << " tokens " << s.tokens << " k " << s.k << " n " << s.n);
    const Tensor A = small_ints({s.heads, s.tokens, s.k}, 41 + s.k);
    const Tensor Bt = small_ints({s.heads, s.n, s.k}, 43 + s.n);  // B = Bt^T, column-major
    const Tensor sa = fp32_scalar(0.5), sb = fp32_scalar(0.125);
    const Tensor cpu = bmm_fp8(A, Bt.transpose(1, 2), sa, sb, DType::kBFloat16);
    const Tensor Ag = A.to(g), Bg = Bt.to(g).transpose(1, 2), sag = sa.to(g), sbg = sb.to(g);
    EXPECT_EQ(testing::bytes_of(bmm_fp8(Ag, Bg, sag, sbg, DType::kBFloat16).to(Device::cpu())),
              testing::bytes_of(cpu));
    Tensor out = Tensor::zeros({s.heads, s.tokens, s.n}, DType::kBFloat16, g);
    bmm_fp8(Ag, Bg, sag, sbg, DType::kBFloat16, out);
    EXPECT_EQ(testing::bytes_of(out.to(Device::cpu())), testing::bytes_of(cpu));
    // fp16 out, as vLLM's fp16 models ask.
    const Tensor cpu16 = bmm_fp8(A, Bt.transpose(1, 2), sa, sb, DType::kFloat16);
    EXPECT_EQ(testing::bytes_of(bmm_fp8(Ag, Bg, sag, sbg, DType::kFloat16).to(Device::cpu())),
              testing::bytes_of(cpu16));
  }
}

// Views whose data pointer is only element-aligned (cuBLASLt's heuristic assumes 256 bytes
// unless told), an odd leading dimension, and overlapping rows, which cuBLASLt cannot take.
TEST(GemmCuda, UnalignedViewsMatchCpuAndOverlapIsRefused) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t m = 19, n = 24, k = 40;
  Tensor a_full = Tensor::empty({m, k + 1}, DType::kFloat32).normal_(11).to(DType::kBFloat16);
  Tensor b_full = Tensor::empty({n, k + 1}, DType::kFloat32).normal_(12).to(DType::kBFloat16);
  Tensor a = a_full.slice(1, 1, k + 1);                  // 2-byte offset, ld 41
  Tensor b = b_full.slice(1, 1, k + 1).transpose(0, 1);  // column-major [k, n], ld 41
  Tensor ag = a_full.to(g).slice(1, 1, k + 1);
  Tensor bg = b_full.to(g).slice(1, 1, k + 1).transpose(0, 1);
  for (DType od : {DType::kBFloat16, DType::kFloat16}) {
    Tensor out_full = Tensor::zeros({m, n + 1}, od, g);
    Tensor out = out_full.slice(1, 1, n + 1);  // 2-byte offset, ld 25
    mm_bf16(ag, bg, std::nullopt, false, out, od);
    EXPECT_TRUE(
        all_close(out, mm_bf16(a, b, std::nullopt, false, std::nullopt, od), gemm_tol(od, k)))
        << dtype_torch_name(od);
  }
  // A bias that is a 2-byte aligned slice of a longer vector.
  Tensor bias_full = Tensor::empty({n + 1}, DType::kFloat32).normal_(16).to(DType::kBFloat16);
  Tensor bias_g = bias_full.to(g).slice(0, 1, n + 1);
  EXPECT_TRUE(all_close(mm_bf16(ag, bg, bias_g), mm_bf16(a, b, bias_full.slice(0, 1, n + 1)),
                        gemm_tol(DType::kBFloat16, k)));
  // Batched, with a batch stride that is not a multiple of 256 bytes.
  Tensor A3 = Tensor::empty({3, m, k}, DType::kFloat32).normal_(13).to(DType::kBFloat16);
  Tensor B3 = col_major(3, k, n, DType::kBFloat16, 14);
  Tensor A3g = A3.to(g).slice(1, 1, m);
  EXPECT_TRUE(all_close(bmm_bf16(A3g, B3.transpose(1, 2).to(g).transpose(1, 2)),
                        bmm_bf16(A3.slice(1, 1, m), B3), gemm_tol(DType::kBFloat16, k)));
  // Overlapping columns of b (stride 0, as from expand()): fine on the CPU, refused on CUDA.
  Tensor col = Tensor::empty({k, 1}, DType::kFloat32).normal_(15).to(DType::kBFloat16);
  Tensor bo = col.as_strided({k, n}, {1, 0}, 0);
  EXPECT_NO_THROW(mm_bf16(a, bo));
  EXPECT_FI_ERROR(mm_bf16(ag, col.to(g).as_strided({k, n}, {1, 0}, 0)), "mm_bf16", "b");
}

// ---- the cuBLASLt plan (kernels/cublaslt_plan.h): pure functions, checked on the CPU ----------

namespace lt = kernels::lt;

lt::RowMajorGemm row_major(int64_t batch, int64_t m, int64_t n, int64_t k, DType in, DType out) {
  lt::RowMajorGemm g;
  g.batch = batch;
  g.m = m;
  g.n = n;
  g.k = k;
  g.x_type = g.w_type = in;
  g.d_type = out;
  g.ldx = k;
  g.ldw = k;
  g.ldd = n;
  g.stride_x = m * k;
  g.stride_w = n * k;
  g.stride_d = m * n;
  g.x_addr = g.w_addr = g.d_addr = 0x10000;  // 256-byte aligned
  return g;
}

// out [m, n] = x [m, k] @ w [n, k]^T row-major is D (n x m) = A^T B with A = w (k x n) and
// B = x (k x m) column-major: transa T, transb N, cuBLASLt m = our n, n = our m.
TEST(CublasLtPlan, RowMajorMapsToTn) {
  lt::RowMajorGemm g = row_major(1, 37, 72, 128, DType::kBFloat16, DType::kBFloat16);
  g.ldx = 136;  // rows of x 136 elements apart
  g.ldw = 130;
  g.ldd = 80;
  const lt::ColMajorGemm c = lt::to_col_major(g);
  EXPECT_TRUE(c.transa);
  EXPECT_FALSE(c.transb);
  EXPECT_EQ(c.m, 72);
  EXPECT_EQ(c.n, 37);
  EXPECT_EQ(c.k, 128);
  EXPECT_EQ(c.lda, 130);
  EXPECT_EQ(c.ldb, 136);
  EXPECT_EQ(c.ldd, 80);
  EXPECT_EQ(c.batch, 1);
  EXPECT_EQ(c.stride_a, 0);  // batch strides only matter (and only count) when batch > 1
  EXPECT_EQ(c.stride_b, 0);
  EXPECT_EQ(c.stride_d, 0);
  // Batched: the batch strides follow their operands through the swap.
  lt::RowMajorGemm b = row_major(3, 17, 33, 40, DType::kBFloat16, DType::kFloat16);
  const lt::ColMajorGemm cb = lt::to_col_major(b);
  EXPECT_EQ(cb.batch, 3);
  EXPECT_EQ(cb.stride_a, 33 * 40);  // w
  EXPECT_EQ(cb.stride_b, 17 * 40);  // x
  EXPECT_EQ(cb.stride_d, 17 * 33);
  // A single row or column may come with any stride: the dense ld replaces it.
  lt::RowMajorGemm one = row_major(1, 1, 1, 40, DType::kBFloat16, DType::kBFloat16);
  one.ldx = 0;
  one.ldw = 7;
  one.ldd = 0;
  const lt::ColMajorGemm c1 = lt::to_col_major(one);
  EXPECT_EQ(c1.lda, 40);
  EXPECT_EQ(c1.ldb, 40);
  EXPECT_EQ(c1.ldd, 1);
}

TEST(CublasLtPlan, RowMajorGemmFromTheOpsParameters) {
  // What api::gemm_params makes of A [2, 5, 48] (row stride 64), B = [2, 24, 48]^T, out [2, 5, 24].
  alignas(256) static uint8_t buf[64];
  kernels::GemmParams p;
  p.a = buf;
  p.a_dtype = DType::kFloat8E4M3FN;
  p.a_stride_b = 5 * 64;
  p.a_stride_m = 64;
  p.b = buf + 32;
  p.b_dtype = DType::kFloat8E5M2;
  p.b_stride_b = 24 * 48;
  p.b_stride_n = 48;
  p.out = buf + 16;
  p.out_dtype = DType::kBFloat16;
  p.out_stride_b = 5 * 24;
  p.out_stride_m = 24;
  p.batch = 2;
  p.m = 5;
  p.n = 24;
  p.k = 48;
  const lt::RowMajorGemm g = lt::row_major_gemm(p);
  EXPECT_EQ(g.ldx, 64);
  EXPECT_EQ(g.ldw, 48);
  EXPECT_EQ(g.ldd, 24);
  EXPECT_EQ(g.x_type, DType::kFloat8E4M3FN);
  EXPECT_EQ(g.w_type, DType::kFloat8E5M2);
  const lt::ColMajorGemm c = lt::to_col_major(g);
  EXPECT_EQ(c.lda, 48);
  EXPECT_EQ(c.ldb, 64);
  EXPECT_EQ(c.stride_a, 24 * 48);
  EXPECT_EQ(c.stride_b, 5 * 64);
  EXPECT_EQ(c.stride_d, 5 * 24);
  EXPECT_EQ(c.align_b, 64u);  // x: 256-aligned start, batch stride 320 bytes
  EXPECT_EQ(c.align_a, 32u);  // w: start at +32, batch stride 1152 bytes
  EXPECT_EQ(c.align_d, 16u);  // out: start at +16, batch stride 240 bytes
}

TEST(CublasLtPlan, AlignmentBytes) {
  EXPECT_EQ(lt::alignment_bytes(0x10000, 2, 1, 0), 256u);  // capped at 256
  EXPECT_EQ(lt::alignment_bytes(0x10002, 2, 1, 0), 2u);
  EXPECT_EQ(lt::alignment_bytes(0x10010, 1, 1, 0), 16u);
  EXPECT_EQ(lt::alignment_bytes(0x10000, 2, 1, 3), 256u);  // one batch: the stride is unused
  EXPECT_EQ(lt::alignment_bytes(0x10000, 2, 2, 3), 2u);    // second matrix at +6 bytes
  EXPECT_EQ(lt::alignment_bytes(0x10000, 2, 2, 40), 16u);  // +80 bytes
  EXPECT_EQ(lt::alignment_bytes(0x10000, 4, 3, 64), 256u);
}

TEST(CublasLtPlan, Fp8RequirementsNameTheOperand) {
  const DType f8 = DType::kFloat8E4M3FN, bf = DType::kBFloat16;
  // m is free (cuBLASLt's n); k, n multiples of 16, 16-byte rows, 16-byte starts.
  EXPECT_FALSE(lt::fp8_refusal(row_major(1, 1, 16, 16, f8, bf)).refused());
  EXPECT_FALSE(lt::fp8_refusal(row_major(2, 7, 48, 128, f8, bf)).refused());
  const auto refused = [](const lt::RowMajorGemm& g) { return lt::fp8_refusal(g).operand; };
  EXPECT_EQ(refused(row_major(1, 16, 16, 24, f8, bf)), lt::Operand::kX);    // k = 24
  EXPECT_EQ(refused(row_major(1, 33, 130, 272, f8, bf)), lt::Operand::kW);  // n = 130
  lt::RowMajorGemm g = row_major(1, 16, 32, 64, f8, bf);
  g.ldx = 72;  // x rows 72 bytes apart
  EXPECT_EQ(refused(g), lt::Operand::kX);
  g = row_major(1, 16, 32, 64, f8, bf);
  g.ldw = 68;
  EXPECT_EQ(refused(g), lt::Operand::kW);
  g = row_major(1, 16, 32, 64, f8, bf);
  g.ldd = 36;  // 72 bytes of bf16
  EXPECT_EQ(refused(g), lt::Operand::kD);
  g.ldd = 40;  // 80 bytes: fine
  EXPECT_FALSE(lt::fp8_refusal(g).refused());
  g.m = 1;  // a single row: ldd is replaced by n, fine whatever it was
  g.ldd = 36;
  EXPECT_FALSE(lt::fp8_refusal(g).refused());
  g = row_major(1, 16, 32, 64, f8, bf);
  g.x_addr += 8;
  EXPECT_EQ(refused(g), lt::Operand::kX);
  g = row_major(1, 16, 32, 64, f8, bf);
  g.w_addr += 8;
  EXPECT_EQ(refused(g), lt::Operand::kW);
  g = row_major(1, 16, 32, 64, f8, bf);
  g.d_addr += 8;
  EXPECT_EQ(refused(g), lt::Operand::kD);
  // Batched: every batch's matrix must start aligned (a stride of 17 * 64 + 8 bytes is not).
  g = row_major(2, 17, 32, 64, f8, bf);
  g.stride_x = 17 * 64 + 8;
  EXPECT_EQ(refused(g), lt::Operand::kX);
  EXPECT_NE(std::string(lt::fp8_refusal(g).reason).find("16-byte"), std::string::npos);
}

TEST(CublasLtPlan, CacheKeyHasEveryFieldThePlanDependsOn) {
  const lt::RowMajorGemm g = row_major(1, 64, 128, 256, DType::kBFloat16, DType::kBFloat16);
  const uint64_t ws = lt::workspace_bytes_for(9);
  const lt::LtKey base = lt::make_key(0, g, false, DType::kBFloat16, lt::ScaleMode::kNone, ws);
  const lt::LtKeyHash hash;
  EXPECT_EQ(base, lt::make_key(0, g, false, DType::kBFloat16, lt::ScaleMode::kNone, ws));
  EXPECT_EQ(hash(base),
            hash(lt::make_key(0, g, false, DType::kBFloat16, lt::ScaleMode::kNone, ws)));
  // Other data at the same alignment: the same plan.
  lt::RowMajorGemm moved = g;
  moved.x_addr += 0x1000;
  moved.w_addr += 0x2000;
  moved.d_addr += 0x100;
  EXPECT_EQ(base, lt::make_key(0, moved, false, DType::kBFloat16, lt::ScaleMode::kNone, ws));
  // Each of these is another plan.
  std::vector<lt::LtKey> others;
  others.push_back(lt::make_key(1, g, false, DType::kBFloat16, lt::ScaleMode::kNone, ws));
  others.push_back(lt::make_key(0, g, true, DType::kBFloat16, lt::ScaleMode::kNone, ws));
  others.push_back(lt::make_key(0, g, false, DType::kBFloat16, lt::ScaleMode::kDeviceAlpha, ws));
  others.push_back(lt::make_key(0, g, false, DType::kBFloat16, lt::ScaleMode::kNone, 0));
  for (int field = 0; field < 12; ++field) {
    lt::RowMajorGemm h = g;
    switch (field) {
      case 0:
        h.m += 1;
        break;
      case 1:
        h.n += 16;
        break;
      case 2:
        h.k += 16;
        break;
      case 3:
        h.batch = 2;
        break;
      case 4:
        h.ldx += 8;
        break;
      case 5:
        h.ldw += 8;
        break;
      case 6:
        h.ldd += 8;
        break;
      case 7:
        h.x_addr += 2;
        break;
      case 8:
        h.w_addr += 16;
        break;
      case 9:
        h.d_addr += 64;
        break;
      case 10:
        h.d_type = DType::kFloat16;
        break;
      default:
        h.x_type = h.w_type = DType::kFloat8E4M3FN;
        break;
    }
    others.push_back(lt::make_key(0, h, false, DType::kBFloat16, lt::ScaleMode::kNone, ws));
  }
  for (size_t i = 0; i < others.size(); ++i) {
    EXPECT_FALSE(others[i] == base) << i;
    for (size_t j = i + 1; j < others.size(); ++j) EXPECT_FALSE(others[i] == others[j]) << i << j;
  }
  // Batch strides only count when batched.
  lt::RowMajorGemm s1 = g;
  s1.stride_x = 12345;
  EXPECT_EQ(base, lt::make_key(0, s1, false, DType::kBFloat16, lt::ScaleMode::kNone, ws));
}

TEST(CublasLtPlan, WorkspaceFollowsTheCublasRecommendation) {
  EXPECT_EQ(lt::workspace_bytes_for(8), uint64_t{4} << 20);   // Ampere, Ada
  EXPECT_EQ(lt::workspace_bytes_for(9), uint64_t{32} << 20);  // Hopper
  EXPECT_EQ(lt::workspace_bytes_for(10), uint64_t{32} << 20);
}

#if FLASHINFER_TEST_HAVE_CUDART

// 100 calls of one shape on one stream after the first: every call finds its plan (no
// descriptor building, no heuristic query) and nothing is allocated, neither by the cuBLASLt
// path (workspace, scratch) nor as tensor storage. Covers bf16 out, fp16 out with a bias (the
// fp32 staging path), fp8 and fp4. The bf16 GEMMs name backend "auto" (cuBLASLt in every build;
// their default "cudnn" is cuDNN's graph where the build has cuDNN: test_gemm_cudnn.cpp).
TEST(GemmCuda, CachedCallsAllocateNothing) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t m = 48, n = 64, k = 128;
  const Tensor a_h = Tensor::empty({m, k}, DType::kFloat32).normal_(21);
  const Tensor w_h = Tensor::empty({n, k}, DType::kFloat32).normal_(22);  // b^T
  Tensor a = a_h.to(DType::kBFloat16).to(g);
  Tensor b = w_h.to(DType::kBFloat16).to(g).transpose(0, 1);
  Tensor bias = Tensor::empty({n}, DType::kFloat32).normal_(23).to(DType::kBFloat16).to(g);
  Tensor out_bf = Tensor::zeros({m, n}, DType::kBFloat16, g);
  Tensor out_h = Tensor::zeros({m, n}, DType::kFloat16, g);
  Tensor A8 = a_h.to(DType::kFloat8E4M3FN).reshape({1, m, k}).to(g);
  Tensor B8 = w_h.to(DType::kFloat8E4M3FN).reshape({1, n, k}).to(g);
  Tensor out8 = Tensor::zeros({1, m, n}, DType::kBFloat16, g);
  Tensor one = fp32_scalar(1.0).to(g);
  bool fp8_ok = true;
  try {
    bmm_fp8(A8, B8.transpose(1, 2), one, one, DType::kBFloat16, out8);
  } catch (const Error& e) {
    EXPECT_EQ(e.arg(), "backend") << e.what();  // below sm89
    fp8_ok = false;
  }
  const auto run = [&] {
    mm_bf16(a, b, std::nullopt, false, out_bf, DType::kBFloat16, "auto");
    mm_bf16(a, b, bias, false, out_h, DType::kFloat16, "auto");
    if (fp8_ok) bmm_fp8(A8, B8.transpose(1, 2), one, one, DType::kBFloat16, out8);
  };
  run();
  const Tensor first_bf = out_bf.to(Device::cpu()), first_h = out_h.to(Device::cpu());
  const kernels::cuda::CublasLtStats s0 = kernels::cuda::cublaslt_stats();
  const uint64_t mallocs0 = detail::cuda_device_malloc_count();
  for (int i = 0; i < 100; ++i) run();
  const kernels::cuda::CublasLtStats s1 = kernels::cuda::cublaslt_stats();
  EXPECT_EQ(s1.plan_builds, s0.plan_builds);
  EXPECT_EQ(s1.device_allocs, s0.device_allocs);
  EXPECT_EQ(s1.device_bytes, s0.device_bytes);
  EXPECT_EQ(s1.plan_hits - s0.plan_hits, uint64_t{100} * (fp8_ok ? 3 : 2));
  EXPECT_EQ(detail::cuda_device_malloc_count(), mallocs0);
  EXPECT_TRUE(all_close(out_bf.to(Device::cpu()), first_bf, gemm_tol(DType::kBFloat16, k)));
  EXPECT_TRUE(all_close(out_h.to(Device::cpu()), first_h, gemm_tol(DType::kFloat16, k)));
  // And they are right.
  EXPECT_TRUE(all_close(first_bf, ref_bmm(a.to(Device::cpu()), b.to(Device::cpu()), 1.0),
                        gemm_tol(DType::kBFloat16, k)));
}

// A cached cuBLASLt call ("auto") captured into a CUDA graph (global capture mode, so an
// allocation or a synchronization inside it would fail the capture) and replayed gives the eager
// result.
TEST(GemmCuda, CachedCallCapturesIntoAGraph) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t m = 32, n = 48, k = 64;
  Tensor a = Tensor::empty({m, k}, DType::kFloat32).normal_(31).to(DType::kBFloat16).to(g);
  Tensor b =
      Tensor::empty({n, k}, DType::kFloat32).normal_(32).to(DType::kBFloat16).to(g).transpose(0, 1);
  Tensor bias = Tensor::empty({n}, DType::kFloat32).normal_(33).to(DType::kBFloat16).to(g);
  Tensor out = Tensor::zeros({m, n}, DType::kFloat16, g);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* const prev = current_cuda_stream();
  set_current_cuda_stream(stream);
  mm_bf16(a, b, bias, false, out, DType::kFloat16, "auto");  // warm-up: plan, workspace, scratch
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const Tensor eager = out.to(Device::cpu());
  const kernels::cuda::CublasLtStats s0 = kernels::cuda::cublaslt_stats();
  ASSERT_EQ(cudaMemsetAsync(out.data_ptr(), 0, static_cast<size_t>(m * n) * 2, stream),
            cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(testing::capture_and_launch(stream, cudaStreamCaptureModeGlobal, [&] {
    mm_bf16(a, b, bias, false, out, DType::kFloat16, "auto");
  }));
  set_current_cuda_stream(prev);
  const kernels::cuda::CublasLtStats s1 = kernels::cuda::cublaslt_stats();
  EXPECT_EQ(s1.plan_builds, s0.plan_builds);
  EXPECT_EQ(s1.device_allocs, s0.device_allocs);
  EXPECT_TRUE(all_close(out.to(Device::cpu()), eager, gemm_tol(DType::kFloat16, k)));
  cudaStreamDestroy(stream);
}

#endif  // FLASHINFER_TEST_HAVE_CUDART

}  // namespace
}  // namespace flashinfer
