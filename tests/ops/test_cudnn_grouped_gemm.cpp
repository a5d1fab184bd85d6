// The cuDNN backend of grouped_mm_bf16 (kernels/cuda/grouped_gemm_cudnn.cpp): the MoE grouped
// matmul graph's tensors, which calls fit it and the graph cache's key (pure functions, on the
// CPU), the graph validated in the cuDNN frontend for sm_80 and sm_90 (CPU, the installed
// libcudnn), and backend="cudnn" on a GPU against the CPU reference with cuDNN's run counter.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/cudnn_grouped_plan.h"
#include "ops/gemm_reference.h"
#include "util/test_util.h"

#if FLASHINFER_TEST_HAVE_CUDNN
#include "kernels/cuda/grouped_gemm_cudnn.h"
#endif
#if FLASHINFER_TEST_HAVE_CUDART
#include <cuda_runtime.h>

#include "flashinfer/stream.h"
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer {
namespace {

namespace dnn = kernels::dnn;
using testing::all_close;
using testing::gemm_tol;

// A contiguous call: a [cum_m, k], b [e, n, k], out [cum_m, n], all bf16, at 16-byte aligned
// (fake) addresses; nothing is dereferenced.
kernels::GroupedMmCudaParams params(int64_t e, int64_t cum_m, int64_t n, int64_t k) {
  kernels::GroupedMmCudaParams p;
  p.a = reinterpret_cast<const void*>(std::uintptr_t{0x10000});
  p.a_stride_m = k;
  p.b = reinterpret_cast<const void*>(std::uintptr_t{0x20000});
  p.b_stride_e = n * k;
  p.b_stride_n = k;
  p.m_indptr = reinterpret_cast<const int32_t*>(std::uintptr_t{0x30000});
  p.num_groups = e;
  p.cum_m = cum_m;
  p.n = n;
  p.k = k;
  p.out = reinterpret_cast<void*>(std::uintptr_t{0x40000});
  p.out_stride_m = n;
  return p;
}

using Dims = std::array<int64_t, 3>;

// Upstream's layouts: tokens [1, cum_m, k] row-major, weights [E, k, n] column-major inner dims
// (b [E, n, k] permuted), boundaries [E + 1, 1, 1], out [1, cum_m, n].
TEST(CudnnGroupedPlan, TensorsAreUpstreamsViews) {
  kernels::GroupedMmCudaParams p = params(3, 20, 64, 128);
  dnn::MoeTensors t = dnn::moe_tensors(p);
  EXPECT_EQ(t.token.dims, (Dims{1, 20, 128}));
  EXPECT_EQ(t.token.strides, (Dims{2560, 128, 1}));
  EXPECT_EQ(t.weight.dims, (Dims{3, 128, 64}));
  EXPECT_EQ(t.weight.strides, (Dims{8192, 1, 128}));
  EXPECT_EQ(t.offsets.dims, (Dims{4, 1, 1}));
  EXPECT_EQ(t.offsets.strides, (Dims{1, 1, 1}));
  EXPECT_EQ(t.out.dims, (Dims{1, 20, 64}));
  EXPECT_EQ(t.out.strides, (Dims{1280, 64, 1}));
  for (const dnn::Operand3d* o : {&t.token, &t.weight, &t.offsets, &t.out}) {
    EXPECT_EQ(o->align, 16u);
  }
  EXPECT_EQ(dnn::moe_misfit(p), "");
  // Padded rows: the real strides; one expert: its batch stride is dense; one row: dense too.
  p.a_stride_m = 136;
  p.b_stride_n = 144;
  p.b_stride_e = 10000;
  p.out_stride_m = 72;
  t = dnn::moe_tensors(p);
  EXPECT_EQ(t.token.strides, (Dims{20 * 136, 136, 1}));
  EXPECT_EQ(t.weight.strides, (Dims{10000, 1, 144}));
  EXPECT_EQ(t.out.strides, (Dims{20 * 72, 72, 1}));
  EXPECT_EQ(dnn::moe_misfit(p), "");
  p.num_groups = 1;
  p.cum_m = 1;
  t = dnn::moe_tensors(p);
  EXPECT_EQ(t.weight.strides, (Dims{64 * 144, 1, 144}));
  EXPECT_EQ(t.token.strides, (Dims{128, 128, 1}));
  EXPECT_EQ(t.out.strides, (Dims{64, 64, 1}));
  EXPECT_EQ(t.offsets.dims, (Dims{2, 1, 1}));
  // m_indptr's alignment is its own (int32: at least 4).
  p.m_indptr = reinterpret_cast<const int32_t*>(std::uintptr_t{0x30004});
  EXPECT_EQ(dnn::moe_tensors(p).offsets.align, 4u);
  EXPECT_EQ(dnn::moe_misfit(p), "");
}

// Every call the graph does not take (the op then runs the grouped kernel).
TEST(CudnnGroupedPlan, MisfitsAreDeclined) {
  const auto misfit = [](auto edit) {
    kernels::GroupedMmCudaParams p = params(4, 32, 64, 128);
    edit(p);
    return dnn::moe_misfit(p);
  };
  using P = kernels::GroupedMmCudaParams;
  EXPECT_EQ(misfit([](P&) {}), "");
  EXPECT_NE(misfit([](P& p) { p.out_dtype = DType::kFloat16; }), "");
  EXPECT_NE(misfit([](P& p) { p.out_dtype = DType::kFloat32; }), "");
  EXPECT_NE(misfit([](P& p) { p.in_dtype = DType::kFloat16; }), "");
  EXPECT_NE(misfit([](P& p) { p.b_dtype = DType::kFloat8E4M3FN; }), "");
  EXPECT_NE(misfit([](P& p) { p.in_dtype = p.b_dtype = DType::kFloat8E4M3FN; }), "");
  static const float alpha = 1.0f;
  EXPECT_NE(misfit([](P& p) { p.alpha = &alpha; }), "");
  static const int32_t index[4] = {0, 1, 2, 3};
  EXPECT_NE(misfit([](P& p) { p.b_index = index; }), "");
  EXPECT_NE(misfit([](P& p) { p.cum_m = 0; }), "");
  EXPECT_NE(misfit([](P& p) { p.a_stride_k = 2; }), "");
  EXPECT_NE(misfit([](P& p) { p.b_stride_k = 64; }), "");  // b n-contiguous
  EXPECT_NE(misfit([](P& p) { p.out_stride_n = 2; }), "");
  EXPECT_NE(misfit([](P& p) { p.a_stride_m = 132; }), "");  // rows 8-byte aligned only
  EXPECT_NE(misfit([](P& p) { p.out_stride_m = 68; }), "");
  EXPECT_NE(misfit([](P& p) { p.b_stride_e = 64 * 128 + 4; }), "");
  EXPECT_NE(misfit([](P& p) { p.a = reinterpret_cast<const void*>(std::uintptr_t{0x10008}); }), "");
  EXPECT_NE(misfit([](P& p) { p.out = reinterpret_cast<void*>(std::uintptr_t{0x40002}); }), "");
  EXPECT_NE(misfit([](P& p) {
              p.k = 100;
              p.a_stride_m = p.b_stride_n = 104;
            }),
            "");
  EXPECT_NE(misfit([](P& p) {
              p.n = 60;
              p.out_stride_m = 64;
            }),
            "");
}

TEST(CudnnGroupedPlan, CacheKeyHasEveryFieldTheGraphDependsOn) {
  const kernels::GroupedMmCudaParams base = params(4, 32, 64, 128);
  const dnn::MoeGraphKey k0 = dnn::make_moe_key(0, base);
  const dnn::MoeGraphKeyHash hash;
  // Other data at the same alignment: the same graph.
  kernels::GroupedMmCudaParams p = base;
  p.a = reinterpret_cast<const void*>(std::uintptr_t{0x90000});
  p.b = reinterpret_cast<const void*>(std::uintptr_t{0xA0000});
  p.out = reinterpret_cast<void*>(std::uintptr_t{0xB0000});
  p.m_indptr = reinterpret_cast<const int32_t*>(std::uintptr_t{0xC0000});
  EXPECT_EQ(dnn::make_moe_key(0, p), k0);
  EXPECT_EQ(hash(dnn::make_moe_key(0, p)), hash(k0));
  std::vector<std::pair<std::string, kernels::GroupedMmCudaParams>> changed;
  const auto add = [&](const char* what, auto edit) {
    kernels::GroupedMmCudaParams q = base;
    edit(q);
    changed.emplace_back(what, q);
  };
  using P = kernels::GroupedMmCudaParams;
  add("groups", [](P& q) { q.num_groups = 5; });
  add("cum_m", [](P& q) { q.cum_m = 33; });
  add("n", [](P& q) {
    q.n = 72;
    q.out_stride_m = 72;
    q.b_stride_e = 72 * 128;
  });
  add("k", [](P& q) {
    q.k = 136;
    q.a_stride_m = q.b_stride_n = 136;
    q.b_stride_e = 64 * 136;
  });
  add("a row stride", [](P& q) { q.a_stride_m = 136; });
  add("b row stride", [](P& q) { q.b_stride_n = 136; });
  add("b expert stride", [](P& q) { q.b_stride_e = 64 * 136; });
  add("out row stride", [](P& q) { q.out_stride_m = 72; });
  add("m_indptr alignment",
      [](P& q) { q.m_indptr = reinterpret_cast<const int32_t*>(std::uintptr_t{0x30004}); });
  for (const auto& c : changed) {
    EXPECT_NE(dnn::make_moe_key(0, c.second), k0) << c.first;
    EXPECT_NE(hash(dnn::make_moe_key(0, c.second)), hash(k0)) << c.first;
  }
  EXPECT_NE(dnn::make_moe_key(1, base), k0);
  EXPECT_NE(hash(dnn::make_moe_key(1, base)), hash(k0));
}

#if FLASHINFER_TEST_HAVE_CUDNN
// The graphs this backend builds, described and validated by the cuDNN frontend on the CPU for
// sm_80 and sm_90 (each tensor's dims, strides and dtype, the node's inputs). Lowering to cuDNN
// and choosing an engine need a GPU (GroupedMmCudnnCuda below).
TEST(CudnnGroupedPlan, GraphsValidateInTheFrontend) {
  std::vector<std::pair<std::string, kernels::GroupedMmCudaParams>> cases;
  cases.emplace_back("4 experts", params(4, 32, 64, 128));
  cases.emplace_back("1 expert, 1 row", params(1, 1, 64, 128));
  kernels::GroupedMmCudaParams p = params(8, 100, 256, 512);
  p.a_stride_m = 520;
  p.b_stride_n = 520;
  p.b_stride_e = 300 * 520;
  p.out_stride_m = 264;
  cases.emplace_back("padded strides", p);
  for (int sm : {80, 90}) {
    for (const auto& c : cases) {
      ASSERT_EQ(dnn::moe_misfit(c.second), "") << c.first;
      EXPECT_EQ(kernels::cuda::cudnn_validate_grouped_mm(c.second, sm), "")
          << c.first << ", sm " << sm;
    }
  }
}
#endif

// ---- backend="cudnn" on a GPU against the CPU reference -----------------------------------

Tensor i32(const std::vector<int64_t>& v) {
  std::vector<double> d(v.begin(), v.end());
  return Tensor::from_vector(d, {static_cast<int64_t>(v.size())}, DType::kInt32);
}

Tensor bf16_normal(const Shape& s, uint64_t seed) {
  return Tensor::empty(s, DType::kFloat32).normal_(seed).to(DType::kBFloat16);
}

// Why the loaded libcudnn cannot run the graph (empty when it can).
std::string grouped_unavailable() {
#if FLASHINFER_TEST_HAVE_CUDNN
  return kernels::cuda::cudnn_grouped_unavailable();
#else
  return "no cuDNN in this build";
#endif
}

uint64_t cudnn_runs() {
#if FLASHINFER_TEST_HAVE_CUDNN
  return kernels::cuda::cudnn_grouped_stats().runs;
#else
  return 0;
#endif
}

// Fitting calls run cuDNN's graph (its counter says so where the build has cuDNN) and match the
// CPU reference within the accumulation bound, rows outside every group included (zero); a
// second call of a shape finds its graph. Calls that do not fit run the grouped kernel.
TEST(GroupedMmCudnnCuda, MatchesCpuAndRunsCudnn) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  // cuDNN runs where the build has it and the loaded libcudnn has the node (9.15.0 on).
  const bool has_cudnn = build_info().cudnn && grouped_unavailable().empty();
  struct Case {
    int64_t n, k;
    std::vector<int64_t> indptr;
  };
  const std::vector<Case> cases = {
      {64, 128, {0, 5, 5, 37, 40}},              // an empty group
      {128, 256, {0, 1}},                        // one expert, one row
      {256, 512, {0, 100, 228, 300, 301, 512}},  // larger groups
      {64, 64, {3, 10, 20}},                     // rows before and after the groups
  };
  for (const Case& c : cases) {
    const int64_t e = static_cast<int64_t>(c.indptr.size()) - 1;
    const int64_t cum = std::max<int64_t>(c.indptr.back(), 1) + (c.indptr[0] > 0 ? 4 : 0);
    const Tensor a = bf16_normal({cum, c.k}, 1), b = bf16_normal({e, c.n, c.k}, 2);
    const Tensor want = grouped_mm_bf16(a, b, i32(c.indptr));
    const Tensor ag = a.to(g), bg = b.to(g), ig = i32(c.indptr).to(g);
    const uint64_t runs0 = cudnn_runs();
    for (int rep = 0; rep < 2; ++rep) {
      const Tensor got = grouped_mm_bf16(ag, bg, ig);
      EXPECT_TRUE(all_close(got, want, gemm_tol(DType::kBFloat16, c.k)))
          << "n " << c.n << " k " << c.k << " groups " << e << " rep " << rep;
    }
    EXPECT_EQ(cudnn_runs() - runs0, has_cudnn ? 2u : 0u) << "n " << c.n << " k " << c.k;
  }
  // Not fitting: fp16 and fp32 out, rows of a at an 8-byte stride: the grouped kernel.
  const std::vector<int64_t> indptr = {0, 7, 16};
  const Tensor a = bf16_normal({16, 68}, 3), b = bf16_normal({2, 64, 64}, 4);
  const Tensor ag = a.to(g), bg = b.to(g), ig = i32(indptr).to(g);
  const uint64_t runs0 = cudnn_runs();
  for (DType od : {DType::kFloat16, DType::kFloat32}) {
    EXPECT_TRUE(all_close(grouped_mm_bf16(ag.slice(1, 0, 64), bg, ig, std::nullopt, od),
                          grouped_mm_bf16(a.slice(1, 0, 64), b, i32(indptr), std::nullopt, od),
                          gemm_tol(od, 64)));
  }
  EXPECT_TRUE(all_close(grouped_mm_bf16(ag.slice(1, 4, 68), bg, ig),
                        grouped_mm_bf16(a.slice(1, 4, 68), b, i32(indptr)),
                        gemm_tol(DType::kBFloat16, 64)));
  EXPECT_EQ(cudnn_runs(), runs0);
}

#if FLASHINFER_TEST_HAVE_CUDNN
// One graph per shape: the second call of a shape builds nothing (and with a libcudnn older
// than the node, nothing is built at all).
TEST(GroupedMmCudnnCuda, SecondCallFindsItsGraph) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const Tensor a = bf16_normal({48, 128}, 5).to(g), b = bf16_normal({3, 64, 128}, 6).to(g);
  const Tensor ig = i32({0, 10, 30, 48}).to(g);
  (void)grouped_mm_bf16(a, b, ig);
  const kernels::cuda::CudnnGroupedStats s0 = kernels::cuda::cudnn_grouped_stats();
  (void)grouped_mm_bf16(a, b, ig);
  const kernels::cuda::CudnnGroupedStats s1 = kernels::cuda::cudnn_grouped_stats();
  EXPECT_EQ(s1.graph_builds, s0.graph_builds);
  EXPECT_EQ(s1.device_allocs, s0.device_allocs);
  if (grouped_unavailable().empty()) {
    EXPECT_EQ(s1.graph_hits, s0.graph_hits + 1);
    EXPECT_EQ(s1.runs, s0.runs + 1);
  } else {
    // A libcudnn older than the node (9.14 on the H200 of 2026-11-26): declined before any
    // graph is built, every call.
    EXPECT_EQ(s1.graph_builds, 0u) << grouped_unavailable();
    EXPECT_EQ(s1.runs, 0u);
  }
}
#endif

#if FLASHINFER_TEST_HAVE_CUDART
// A call captured into a CUDA graph runs the grouped kernel (a capture allows no handle creation
// or graph building; declined, not refused), even after an eager call warmed cuDNN up: the
// captured graph replays the kernel, and the result is the CPU reference's.
TEST(GroupedMmCudnnCuda, CapturedCallRunsTheGroupedKernel) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const std::vector<int64_t> indptr = {0, 12, 32};
  const Tensor a = bf16_normal({32, 64}, 7), b = bf16_normal({2, 64, 64}, 8);
  const Tensor want = grouped_mm_bf16(a, b, i32(indptr));
  const Tensor ag = a.to(g), bg = b.to(g), ig = i32(indptr).to(g);
  Tensor out = Tensor::zeros({32, 64}, DType::kBFloat16, g);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* const prev = current_cuda_stream();
  set_current_cuda_stream(stream);
  (void)grouped_mm_bf16(ag, bg, ig, out);  // eager: cuDNN where the build has it
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(out.data_ptr(), 0, 32 * 64 * 2, stream), cudaSuccess);
  const uint64_t runs0 = cudnn_runs();
  ASSERT_NO_FATAL_FAILURE(testing::capture_and_launch(stream, cudaStreamCaptureModeGlobal,
                                                      [&] { grouped_mm_bf16(ag, bg, ig, out); }));
  set_current_cuda_stream(prev);
  EXPECT_EQ(cudnn_runs(), runs0);
  EXPECT_TRUE(all_close(out.to(Device::cpu()), want, gemm_tol(DType::kBFloat16, 64)));
  cudaStreamDestroy(stream);
}
#endif

}  // namespace
}  // namespace flashinfer
