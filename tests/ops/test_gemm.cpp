// Tests of the GEMM ops against a naive fp64 reference, bad input, backend queries, replay and
// CUDA vs CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "ops/gemm_reference.h"
#include "util/test_util.h"

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
TEST(GemmDecl, SignaturesAndModulesEqualUpstream) {
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"mm_bf16",
       "(a, b, bias=None, pdl=False, out=None, out_dtype=torch.bfloat16, backend='cudnn')"},
      {"bmm_bf16", "(A, B, out=None, out_dtype=torch.bfloat16, backend='cudnn')"},
      {"bmm_fp8", "(A, B, A_scale, B_scale, dtype, out=None, backend='cublas')"},
      {"mm_fp4",
       "(a, b, a_descale, b_descale, alpha=None, out_dtype=torch.bfloat16, out=None, "
       "block_size=16, use_8x4_sf_layout=False, backend='auto', use_nvfp4=True, "
       "enable_pdl=True)"},
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
  EXPECT_FI_ERROR(mm_bf16(a, Tensor::zeros({32, 8}, bf)), "mm_bf16", "b");
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
  // Backends this build does not have are never supported, on any compute capability.
  EXPECT_FALSE(fp8.is_backend_supported("cudnn"));
  EXPECT_FALSE(fp8.is_backend_supported("cutlass", 100));
  EXPECT_FALSE(backend_requirement("mm_bf16").is_backend_supported("tgv", 100));
  EXPECT_FALSE(backend_requirement("mm_fp4").is_backend_supported("cudnn", 100));
  EXPECT_FALSE(backend_requirement("fp4_quantize").is_backend_supported("cute-dsl", 100));
  if (cuda_compiled()) {
    EXPECT_TRUE(fp8.is_backend_supported("cublas"));
    EXPECT_TRUE(fp8.is_backend_supported("cublas", 90));
    EXPECT_TRUE(fp8.is_backend_supported("auto", 89));
    EXPECT_FALSE(fp8.is_backend_supported("cublas", 80));  // no fp8 tensor cores before sm89
    EXPECT_TRUE(fp8.is_compute_capability_supported(90));
    EXPECT_FALSE(fp8.is_compute_capability_supported(86));
    EXPECT_EQ(fp8.supported_backends(90), (std::vector<std::string>{"cublas", "auto"}));
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
  EXPECT_FI_ERROR(bmm_fp8(Z8a, Z8b, one, one, DType::kBFloat16, std::nullopt, "cudnn"), "bmm_fp8",
                  "backend");
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
  }
  for (const auto& s : kShapes) {
    Tensor A = Tensor::empty({s.b, s.m, s.k}, DType::kFloat32).normal_(1).to(DType::kBFloat16);
    Tensor B = col_major(s.b, s.k, s.n, DType::kBFloat16, 2);
    Tensor Bg = B.transpose(1, 2).to(g).transpose(1, 2);
    EXPECT_TRUE(all_close(bmm_bf16(A.to(g), Bg), bmm_bf16(A, B), gemm_tol(DType::kBFloat16, s.k)));
    Tensor a2 = A.select(0, 0), b2 = B.select(0, 0);
    EXPECT_TRUE(all_close(mm_bf16(a2.to(g), Bg.select(0, 0)), mm_bf16(a2, b2),
                          gemm_tol(DType::kBFloat16, s.k)));
    if (s.k % 16 == 0 && fp8_ok) {
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
    auto [qa2, sa2] = mxfp4_quantize(a2);
    auto [qb2, sb2] = mxfp4_quantize(w2);
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
  auto [qa, sfa] = nvfp4_quantize(a, gs);
  auto [qb, sfb] = nvfp4_quantize(w, gs);
  Tensor al = fp32_scalar(1e-4);
  Tensor cpu = mm_fp4(qa, qb.transpose(0, 1), sfa, sfb.transpose(0, 1), al);
  fp4_matches(
      [&] {
        return mm_fp4(qa.to(g), qb.to(g).transpose(0, 1), sfa.to(g), sfb.to(g).transpose(0, 1),
                      al.to(g));
      },
      cpu, gemm_tol(DType::kBFloat16, 128));
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

}  // namespace
}  // namespace flashinfer
