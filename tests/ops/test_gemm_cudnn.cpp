// The cuDNN backend of mm_bf16, bmm_bf16 and bmm_fp8 (kernels/cuda/gemm_cudnn.cpp): the graph's
// tensors and the graph cache's key (pure functions, on the CPU), the backend tables of a build
// with and without cuDNN, and backend="cudnn" against the CPU reference on a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "api/device_props.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/stream.h"
#include "kernels/cudnn_gemm_plan.h"
#include "ops/gemm_reference.h"
#include "util/test_util.h"

#if FLASHINFER_TEST_HAVE_CUDNN
#include "core/cuda_runtime.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/gemm_cudnn.h"
#endif
#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime.h>

#include "util/cuda_graph_util.h"
#endif

namespace flashinfer {
namespace {

namespace dnn = kernels::dnn;
using testing::all_close;
using testing::gemm_tol;
using testing::ref_bmm;

Tensor fp32_scalar(double v) { return Tensor::from_vector({v}, {1}, DType::kFloat32); }

#if FLASHINFER_TEST_HAVE_CUDNN
// libcudnn is opened on the first cuDNN GEMM, not at start-up: no GEMM of this process has run
// yet (ctest runs each test in its own process). Then it opens, GPU or not.
TEST(CudnnLoading, NotMappedUntilUsedThenOpens) {
  auto mapped = [] {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
      if (line.find("libcudnn") != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_FALSE(mapped());
  EXPECT_EQ(kernels::cuda::cudnn_load_error(), "");
  EXPECT_TRUE(mapped());
  EXPECT_EQ(kernels::cuda::cudnn_library_version().substr(0, 2), "9.");
}
#endif

// ---- the graph's tensors and the cache key (kernels/cudnn_gemm_plan.h) -------------------------

kernels::GemmParams params(int64_t batch, int64_t m, int64_t n, int64_t k, DType in, DType out) {
  kernels::GemmParams p;
  p.batch = batch;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a_dtype = p.b_dtype = in;
  p.out_dtype = out;
  p.a_stride_m = k;
  p.b_stride_n = k;
  p.out_stride_m = n;
  p.a_stride_b = batch > 1 ? m * k : 0;
  p.b_stride_b = batch > 1 ? n * k : 0;
  p.out_stride_b = batch > 1 ? m * n : 0;
  const auto at = [](std::uintptr_t v) { return reinterpret_cast<void*>(v); };
  p.a = at(0x10000);
  p.b = at(0x20000);
  p.out = at(0x30000);
  return p;
}

TEST(CudnnGemmPlan, TensorsAreUpstreams3dViews) {
  // mm: batch 1, padded rows; A [1, m, k] row-major, B [1, k, n] column-major, C [1, m, n].
  kernels::GemmParams p = params(1, 5, 24, 40, DType::kBFloat16, DType::kBFloat16);
  p.a_stride_m = 48;
  p.b_stride_n = 56;
  p.out_stride_m = 32;
  dnn::GemmTensors t = dnn::gemm_tensors(p);
  EXPECT_EQ(t.a.dims, (std::array<int64_t, 3>{1, 5, 40}));
  EXPECT_EQ(t.a.strides, (std::array<int64_t, 3>{5 * 48, 48, 1}));
  EXPECT_EQ(t.b.dims, (std::array<int64_t, 3>{1, 40, 24}));
  EXPECT_EQ(t.b.strides, (std::array<int64_t, 3>{24 * 56, 1, 56}));
  EXPECT_EQ(t.c.dims, (std::array<int64_t, 3>{1, 5, 24}));
  EXPECT_EQ(t.c.strides, (std::array<int64_t, 3>{5 * 32, 32, 1}));
  EXPECT_EQ(t.a.align, 16u);
  EXPECT_EQ(t.b.align, 16u);
  EXPECT_EQ(t.c.align, 16u);
  // bmm: the real batch strides.
  p = params(3, 7, 16, 32, DType::kFloat8E4M3FN, DType::kFloat16);
  p.a_stride_b = 1000;
  t = dnn::gemm_tensors(p);
  EXPECT_EQ(t.a.strides, (std::array<int64_t, 3>{1000, 32, 1}));
  EXPECT_EQ(t.b.strides, (std::array<int64_t, 3>{16 * 32, 1, 32}));
  EXPECT_EQ(t.c.strides, (std::array<int64_t, 3>{7 * 16, 16, 1}));
  // 1000 fp8 bytes between batches: every batch's A starts 8-byte aligned only.
  EXPECT_EQ(t.a.align, 8u);
  // Strides never stepped get their dense values: a single row (any stride, 0 from expand()),
  // a single column, batch 1's batch stride.
  p = params(1, 1, 1, 64, DType::kBFloat16, DType::kBFloat16);
  p.a_stride_m = 0;
  p.b_stride_n = 12345;
  p.out_stride_m = 0;
  p.a_stride_b = p.b_stride_b = p.out_stride_b = 777;
  t = dnn::gemm_tensors(p);
  EXPECT_EQ(t.a.strides, (std::array<int64_t, 3>{64, 64, 1}));
  EXPECT_EQ(t.b.strides, (std::array<int64_t, 3>{64, 1, 64}));
  EXPECT_EQ(t.c.strides, (std::array<int64_t, 3>{1, 1, 1}));
}

TEST(CudnnGemmPlan, AlignmentIsCappedAt16Bytes) {
  EXPECT_EQ(dnn::alignment16(0x10000, 2, 1, 0), 16u);
  EXPECT_EQ(dnn::alignment16(0x10002, 2, 1, 0), 2u);
  EXPECT_EQ(dnn::alignment16(0x10008, 2, 1, 0), 8u);
  EXPECT_EQ(dnn::alignment16(0x10000, 2, 2, 41 * 3), 2u);   // odd batch stride of bf16
  EXPECT_EQ(dnn::alignment16(0x10000, 2, 1, 41 * 3), 16u);  // unbatched: not stepped
  EXPECT_EQ(dnn::alignment16(0x10000, 1, 3, 4), 4u);
}

TEST(CudnnGemmPlan, CacheKeyHasEveryFieldTheGraphDependsOn) {
  const kernels::GemmParams p = params(1, 64, 128, 256, DType::kBFloat16, DType::kBFloat16);
  const dnn::GraphKey base = dnn::make_graph_key(0, p);
  const dnn::GraphKeyHash hash;
  EXPECT_EQ(base, dnn::make_graph_key(0, p));
  EXPECT_EQ(hash(base), hash(dnn::make_graph_key(0, p)));
  EXPECT_EQ(base.epilogue, dnn::Epilogue::kNone);
  // Other data at the same alignment: the same graph.
  kernels::GemmParams moved = p;
  moved.a = static_cast<const char*>(p.a) + 0x1000;
  moved.b = static_cast<const char*>(p.b) + 0x2000;
  moved.out = static_cast<char*>(p.out) + 0x100;
  EXPECT_EQ(base, dnn::make_graph_key(0, moved));
  // Each of these is another graph.
  std::vector<dnn::GraphKey> others;
  others.push_back(dnn::make_graph_key(1, p));
  for (int field = 0; field < 16; ++field) {
    kernels::GemmParams h = p;
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
        h.a_stride_b = h.m * h.k;
        h.b_stride_b = h.n * h.k;
        h.out_stride_b = h.m * h.n;
        break;
      case 4:
        h.a_stride_m += 8;
        break;
      case 5:
        h.b_stride_n += 8;
        break;
      case 6:
        h.out_stride_m += 8;
        break;
      case 7:
        h.a = static_cast<const char*>(h.a) + 2;
        break;
      case 8:
        h.b = static_cast<const char*>(h.b) + 4;
        break;
      case 9:
        h.out = static_cast<char*>(h.out) + 8;
        break;
      case 10:
        h.out_dtype = DType::kFloat16;
        break;
      case 11:
        h.a_dtype = h.b_dtype = DType::kFloat8E4M3FN;
        break;
      case 12:
        h.b_dtype = DType::kFloat8E5M2;
        break;
      case 13:
        h.bias = reinterpret_cast<const void*>(std::uintptr_t{0x40000});
        break;
      case 14:
        h.bias = reinterpret_cast<const void*>(std::uintptr_t{0x40004});  // 4-byte aligned
        break;
      default: {
        static const float scale = 1.0f;
        h.a_scale = h.b_scale = &scale;
        break;
      }
    }
    others.push_back(dnn::make_graph_key(0, h));
  }
  for (size_t i = 0; i < others.size(); ++i) {
    EXPECT_FALSE(others[i] == base) << i;
    for (size_t j = i + 1; j < others.size(); ++j) EXPECT_FALSE(others[i] == others[j]) << i << j;
  }
  EXPECT_EQ(others[14].epilogue, dnn::Epilogue::kBias);
  EXPECT_EQ(others[14].bias_align, 16u);
  EXPECT_EQ(others[15].bias_align, 4u);
  EXPECT_EQ(others[16].epilogue, dnn::Epilogue::kTensorScales);
  // Batch strides only count when batched.
  kernels::GemmParams s1 = p;
  s1.a_stride_b = 12345;
  EXPECT_EQ(base, dnn::make_graph_key(0, s1));
}

TEST(CudnnGemmPlan, WorkspaceGrowsInPowersOfTwoFrom1MiB) {
  EXPECT_EQ(dnn::workspace_grow_to(0), 0u);
  EXPECT_EQ(dnn::workspace_grow_to(1), uint64_t{1} << 20);
  EXPECT_EQ(dnn::workspace_grow_to(uint64_t{1} << 20), uint64_t{1} << 20);
  EXPECT_EQ(dnn::workspace_grow_to((uint64_t{1} << 20) + 1), uint64_t{2} << 20);
  EXPECT_EQ(dnn::workspace_grow_to(uint64_t{40} << 20), uint64_t{64} << 20);
}

#if FLASHINFER_TEST_HAVE_CUDNN
// Every kind of graph the backend builds, described and validated by the cuDNN frontend on the
// CPU: what the frontend checks without a device (each tensor's dims, strides and dtype, the
// nodes' attributes and the intermediates it infers). It does not check that the bias and the
// output agree with the matmul's shape (a [1, 1, n + 1] bias validates): lowering to cuDNN and
// choosing an engine need a GPU (GemmCudnnCuda below).
TEST(CudnnGemmPlan, GraphsValidateInTheFrontend) {
  static const float scale = 1.0f;
  const void* bias = reinterpret_cast<const void*>(std::uintptr_t{0x40000});
  std::vector<std::pair<std::string, kernels::GemmParams>> cases;
  cases.emplace_back("mm bf16", params(1, 64, 128, 256, DType::kBFloat16, DType::kBFloat16));
  kernels::GemmParams p = params(1, 7, 24, 40, DType::kBFloat16, DType::kFloat16);
  p.bias = bias;
  cases.emplace_back("mm bf16 -> fp16 + bias", p);
  p = params(1, 1, 24, 40, DType::kBFloat16, DType::kBFloat16);
  p.bias = bias;
  cases.emplace_back("one row + bias", p);
  p = params(1, 9, 24, 40, DType::kBFloat16, DType::kBFloat16);
  p.a_stride_m = 48;
  p.b_stride_n = 56;
  p.out_stride_m = 32;
  cases.emplace_back("padded strides", p);
  cases.emplace_back("bmm bf16", params(3, 17, 48, 64, DType::kBFloat16, DType::kBFloat16));
  for (DType tb : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
    for (DType od : {DType::kBFloat16, DType::kFloat16}) {
      p = params(2, 16, 32, 64, DType::kFloat8E4M3FN, od);
      p.b_dtype = tb;
      p.a_scale = p.b_scale = &scale;
      cases.emplace_back(
          "bmm fp8 e4m3 x " + std::string(dtype_name(tb)) + " -> " + std::string(dtype_name(od)),
          p);
    }
  }
  for (const auto& c : cases) {
    EXPECT_EQ(kernels::cuda::cudnn_validate_graph(c.second), "") << c.first;
  }
}
#endif

// ---- the backend tables ------------------------------------------------------------------------

TEST(CudnnBackendTable, SaysWhichImplementationServesCudnn) {
  const BuildInfo& b = build_info();
  const auto& fp8 = backend_requirement("bmm_fp8");
  for (const char* op : {"mm_bf16", "bmm_bf16"}) {
    const BackendInfo* dnn_info = backend_requirement(op).find("cudnn");
    if (!b.cuda) {
      EXPECT_EQ(dnn_info, nullptr) << op;
      continue;
    }
    ASSERT_NE(dnn_info, nullptr) << op;
    EXPECT_EQ(dnn_info->min_cc, 80) << op;
    const std::string impl = dnn_info->implementation;
    if (b.cudnn) {
      EXPECT_EQ(impl.rfind("cuDNN graph", 0), 0u) << impl;
    } else {
      EXPECT_EQ(impl, "cuBLASLt (no cuDNN in this build; serves the default)");
    }
  }
  EXPECT_EQ(fp8.is_backend_supported("cudnn"), b.cuda && b.cudnn);
  if (b.cuda && b.cudnn) {
    EXPECT_TRUE(fp8.is_backend_supported("cudnn", 89));
    EXPECT_TRUE(fp8.is_backend_supported("cudnn", 90));
    EXPECT_FALSE(fp8.is_backend_supported("cudnn", 86));
    EXPECT_EQ(fp8.supported_backends(90), (std::vector<std::string>{"cudnn", "cublas", "auto"}));
  }
  EXPECT_EQ(b.cudnn, !b.cudnn_version.empty());
  EXPECT_EQ(b.cudnn, !b.cudnn_frontend_version.empty());
  if (!b.cuda) {
    EXPECT_FALSE(b.cudnn);
  }
}

// ---- backend="cudnn" on a GPU against the CPU reference -------------------------------------

// A column-major [b, k, n] view: the transpose of a contiguous [b, n, k] tensor.
Tensor col_major(int64_t b, int64_t k, int64_t n, DType dt, uint64_t seed) {
  return Tensor::empty({b, n, k}, DType::kFloat32).normal_(seed).to(dt).transpose(1, 2);
}

// The same column-major view on `d`.
Tensor col_major_to(const Tensor& t, Device d) {
  return t.transpose(-2, -1).to(d).transpose(-2, -1);
}

TEST(GemmCudnnCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const bool fp8_device = api::compute_capability(g) >= 89;
  if (!build_info().cudnn) {
    // Without cuDNN, bmm_fp8's "cudnn" is refused by name; the bf16 GEMMs' runs cuBLASLt.
    Tensor Z8a = Tensor::zeros({1, 16, 32}, DType::kFloat8E4M3FN, g);
    Tensor Z8b = Tensor::zeros({1, 16, 32}, DType::kFloat8E4M3FN, g).transpose(1, 2);
    Tensor one = fp32_scalar(1.0).to(g);
    EXPECT_FI_ERROR(bmm_fp8(Z8a, Z8b, one, one, DType::kBFloat16, std::nullopt, "cudnn"), "bmm_fp8",
                    "backend");
  }
  struct Case {
    int64_t b, m, n, k;
  };
  const std::vector<Case> cases = {
      {1, 1, 16, 32}, {1, 7, 40, 24}, {3, 17, 48, 64}, {2, 64, 128, 256}, {1, 33, 130, 272}};
#if FLASHINFER_TEST_HAVE_CUDNN
  // Which library ran each case's bf16 calls: cuDNN's graph counters or cuBLASLt's plan counters
  // (where a bf16 "cudnn" call goes when cuDNN declines it). With k and n multiples of 16 cuDNN
  // must run them (as it ran CachedCallsAllocateNothing's 48 x 64 x 128), so that the comparison
  // below checks cuDNN's results and not the fallback's.
  const bool cudnn_loads = kernels::cuda::cudnn_load_error().empty();
  const auto ran_on = [](uint64_t cudnn_calls0, uint64_t lt_calls0) {
    const kernels::cuda::CudnnStats c = kernels::cuda::cudnn_stats();
    const kernels::cuda::CublasLtStats l = kernels::cuda::cublaslt_stats();
    const bool on_cudnn = c.graph_builds + c.graph_hits != cudnn_calls0;
    const bool on_lt = l.plan_builds + l.plan_hits != lt_calls0;
    return std::string(on_cudnn ? "cudnn" : "") + (on_lt ? "cublaslt" : "");
  };
#endif
  for (const Case& s : cases) {
    Tensor A = Tensor::empty({s.b, s.m, s.k}, DType::kFloat32).normal_(1).to(DType::kBFloat16);
    Tensor B = col_major(s.b, s.k, s.n, DType::kBFloat16, 2);
    Tensor bias = Tensor::empty({s.n}, DType::kFloat32).normal_(3).to(DType::kBFloat16);
    const Tensor Ag = A.to(g), Bg = col_major_to(B, g), bias_g = bias.to(g);
#if FLASHINFER_TEST_HAVE_CUDNN
    const kernels::cuda::CudnnStats c0 = kernels::cuda::cudnn_stats();
    const kernels::cuda::CublasLtStats l0 = kernels::cuda::cublaslt_stats();
    const uint64_t cudnn_calls0 = c0.graph_builds + c0.graph_hits;
    const uint64_t lt_calls0 = l0.plan_builds + l0.plan_hits;
#endif
    for (DType od : {DType::kBFloat16, DType::kFloat16}) {
      EXPECT_TRUE(all_close(bmm_bf16(Ag, Bg, std::nullopt, od, "cudnn"),
                            bmm_bf16(A, B, std::nullopt, od, "cudnn"), gemm_tol(od, s.k)))
          << s.b << "x" << s.m << "x" << s.n << "x" << s.k;
      const Tensor a2 = A.select(0, 0), b2 = B.select(0, 0);
      const Tensor a2g = Ag.select(0, 0), b2g = Bg.select(0, 0);
      EXPECT_TRUE(all_close(mm_bf16(a2g, b2g, std::nullopt, false, std::nullopt, od, "cudnn"),
                            mm_bf16(a2, b2, std::nullopt, false, std::nullopt, od, "cudnn"),
                            gemm_tol(od, s.k)))
          << s.m << "x" << s.n << "x" << s.k;
      EXPECT_TRUE(all_close(mm_bf16(a2g, b2g, bias_g, false, std::nullopt, od, "cudnn"),
                            mm_bf16(a2, b2, bias, false, std::nullopt, od, "cudnn"),
                            gemm_tol(od, s.k)))
          << "bias " << s.m << "x" << s.n << "x" << s.k;
    }
#if FLASHINFER_TEST_HAVE_CUDNN
    if (cudnn_loads && s.k % 16 == 0 && s.n % 16 == 0) {
      EXPECT_EQ(ran_on(cudnn_calls0, lt_calls0), "cudnn")
          << s.b << "x" << s.m << "x" << s.n << "x" << s.k << ": bf16 \"cudnn\" calls";
    }
#endif
    // cuDNN's fp8 engines, like cuBLASLt's, want k and n multiples of 16.
    if (!build_info().cudnn || !fp8_device || s.k % 16 != 0 || s.n % 16 != 0) continue;
    for (const auto& [ta, tb] :
         std::vector<std::pair<DType, DType>>{{DType::kFloat8E4M3FN, DType::kFloat8E4M3FN},
                                              {DType::kFloat8E4M3FN, DType::kFloat8E5M2}}) {
      Tensor A8 = A.to(ta);
      Tensor B8 = B.transpose(1, 2).contiguous().to(tb).transpose(1, 2);
      Tensor sa = fp32_scalar(0.5), sb = fp32_scalar(0.25);
      for (DType od : {DType::kBFloat16, DType::kFloat16}) {
        Tensor cpu = bmm_fp8(A8, B8, sa, sb, od, std::nullopt, "cudnn");
        Tensor gpu =
            bmm_fp8(A8.to(g), col_major_to(B8, g), sa.to(g), sb.to(g), od, std::nullopt, "cudnn");
        EXPECT_TRUE(all_close(gpu, cpu, gemm_tol(od, s.k)))
            << "fp8 " << s.b << "x" << s.m << "x" << s.n << "x" << s.k;
      }
    }
  }
  // Strided views: padded rows of a and out, a bias slice of a longer vector (2-byte aligned).
  const int64_t m = 9, n = 24, k = 40;
  Tensor wide = Tensor::empty({m, k + 8}, DType::kFloat32).normal_(4).to(DType::kBFloat16);
  Tensor wb = Tensor::empty({n, k + 8}, DType::kFloat32).normal_(5).to(DType::kBFloat16);
  Tensor bias_full = Tensor::empty({n + 1}, DType::kFloat32).normal_(6).to(DType::kBFloat16);
  Tensor out_full = Tensor::zeros({m, n + 8}, DType::kFloat16, g);
  Tensor out = out_full.slice(1, 0, n);
  Tensor r = mm_bf16(wide.to(g).slice(1, 0, k), wb.to(g).slice(1, 0, k).transpose(0, 1),
                     bias_full.to(g).slice(0, 1, n + 1), false, out, DType::kFloat16, "cudnn");
  EXPECT_EQ(r.data_ptr(), out.data_ptr());
  EXPECT_TRUE(all_close(
      out,
      mm_bf16(wide.slice(1, 0, k), wb.slice(1, 0, k).transpose(0, 1), bias_full.slice(0, 1, n + 1),
              false, std::nullopt, DType::kFloat16, "cudnn"),
      gemm_tol(DType::kFloat16, k)));
}

#if FLASHINFER_TEST_HAVE_CUDNN
// 100 calls of one shape on one stream after the first: every call finds its graph (no graph
// building, no plan) and nothing is allocated, neither by the cuDNN path (workspace) nor as
// tensor storage. Covers bf16 out, fp16 out with a bias, bmm_bf16 and fp8. None ran on cuBLASLt
// (where a bf16 "cudnn" call goes when cuDNN declines it: graph_hits counts declined entries too).
TEST(GemmCudnnCuda, CachedCallsAllocateNothing) {
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
  Tensor out_3 = Tensor::zeros({1, m, n}, DType::kBFloat16, g);
  Tensor A8 = a_h.to(DType::kFloat8E4M3FN).reshape({1, m, k}).to(g);
  Tensor B8 = w_h.to(DType::kFloat8E4M3FN).reshape({1, n, k}).to(g);
  Tensor out8 = Tensor::zeros({1, m, n}, DType::kBFloat16, g);
  Tensor one = fp32_scalar(1.0).to(g);
  const bool fp8_ok = api::compute_capability(g) >= 89;
  const auto run = [&] {
    mm_bf16(a, b, std::nullopt, false, out_bf, DType::kBFloat16, "cudnn");
    mm_bf16(a, b, bias, false, out_h, DType::kFloat16, "cudnn");
    bmm_bf16(a.reshape({1, m, k}), b.reshape({1, k, n}), out_3, DType::kBFloat16, "cudnn");
    if (fp8_ok) bmm_fp8(A8, B8.transpose(1, 2), one, one, DType::kBFloat16, out8, "cudnn");
  };
  run();
  const Tensor first_bf = out_bf.to(Device::cpu()), first_h = out_h.to(Device::cpu());
  const kernels::cuda::CudnnStats s0 = kernels::cuda::cudnn_stats();
  const kernels::cuda::CublasLtStats lt0 = kernels::cuda::cublaslt_stats();
  const uint64_t mallocs0 = detail::cuda_device_malloc_count();
  for (int i = 0; i < 100; ++i) run();
  const kernels::cuda::CudnnStats s1 = kernels::cuda::cudnn_stats();
  const kernels::cuda::CublasLtStats lt1 = kernels::cuda::cublaslt_stats();
  EXPECT_EQ(lt1.plan_builds + lt1.plan_hits, lt0.plan_builds + lt0.plan_hits)
      << "a \"cudnn\" call ran on cuBLASLt";
  EXPECT_EQ(s1.graph_builds, s0.graph_builds);
  EXPECT_EQ(s1.device_allocs, s0.device_allocs);
  EXPECT_EQ(s1.device_bytes, s0.device_bytes);
  EXPECT_EQ(s1.graph_hits - s0.graph_hits, uint64_t{100} * (fp8_ok ? 4 : 3));
  EXPECT_EQ(detail::cuda_device_malloc_count(), mallocs0);
  EXPECT_TRUE(all_close(out_bf.to(Device::cpu()), first_bf, gemm_tol(DType::kBFloat16, k)));
  EXPECT_TRUE(all_close(out_h.to(Device::cpu()), first_h, gemm_tol(DType::kFloat16, k)));
  // And they are right.
  EXPECT_TRUE(all_close(first_bf, ref_bmm(a.to(Device::cpu()), b.to(Device::cpu()), 1.0),
                        gemm_tol(DType::kBFloat16, k)));
}
#endif

#if FLASHINFER_TEST_HAVE_CUDNN && FLASHINFER_TEST_HAVE_CUDART
// A cached cuDNN call captured into a CUDA graph (global capture mode) and replayed gives the
// eager result.
TEST(GemmCudnnCuda, CachedCallCapturesIntoAGraph) {
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
  mm_bf16(a, b, bias, false, out, DType::kFloat16, "cudnn");  // warm-up: handle, graph, workspace
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const Tensor eager = out.to(Device::cpu());
  const kernels::cuda::CudnnStats s0 = kernels::cuda::cudnn_stats();
  ASSERT_EQ(cudaMemsetAsync(out.data_ptr(), 0, static_cast<size_t>(m * n) * 2, stream),
            cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(testing::capture_and_launch(stream, cudaStreamCaptureModeGlobal, [&] {
    mm_bf16(a, b, bias, false, out, DType::kFloat16, "cudnn");
  }));
  set_current_cuda_stream(prev);
  const kernels::cuda::CudnnStats s1 = kernels::cuda::cudnn_stats();
  EXPECT_EQ(s1.graph_builds, s0.graph_builds);
  EXPECT_EQ(s1.device_allocs, s0.device_allocs);
  EXPECT_TRUE(all_close(out.to(Device::cpu()), eager, gemm_tol(DType::kFloat16, k)));
  cudaStreamDestroy(stream);
}
#endif

}  // namespace
}  // namespace flashinfer
