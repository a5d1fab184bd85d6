// The CUDA sampling kernels (src/kernels/cuda/sampling_cuda.cu: 128-bit chunked loads, CUB block
// scans, dual-pivot rejection) against two oracles on the same parameters: the CPU reference
// (src/kernels/cpu/sampling_cpu.cpp) and the first-draft CUDA kernels that ran correctly on an
// H100 (tests/oracle/sampling_oracle.cu). Rows are laid out contiguous (the 128-bit path),
// column-strided and misaligned by one element (the scalar path); fp32, fp16 and bf16; rows of
// several chunks with a partial last vector. Where the three must pick the same tokens, the rows
// are "spiky": a few large, well-separated masses and a tail of tiny ones, so no prefix sum,
// pivot or nucleus boundary lies within fp32 summation error of a draw. At a 128k vocabulary,
// where summation order decides near-boundary draws, the samples are checked against the draw
// itself (inverse transform within rounding) and the filters. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/cpu/sampling_cpu.h"
#include "kernels/sampling_params.h"
#include "kernels/sampling_rules.h"
#include "util/test_util.h"
#if FLASHINFER_TEST_HAVE_ORACLES
#include "kernels/cuda/sampling_cuda.h"
#include "oracle/sampling_oracle.h"
#endif

namespace flashinfer {
namespace {

using kernels::FilterKind;
using kernels::SamplingKind;
using kernels::SamplingRow;

#if FLASHINFER_TEST_HAVE_ORACLES

enum class Impl { kCpu, kCuda, kOracle };

enum class Layout { kContiguous, kColumnStrided, kOffsetByOne };
const char* layout_name(Layout l) {
  return l == Layout::kContiguous      ? "contiguous"
         : l == Layout::kColumnStrided ? "strided"
                                       : "offset";
}

/// The same [B, V] values on the host and the device, in `layout`.
struct Input {
  Tensor host, dev;
};

Input make_input(const std::vector<double>& v, int64_t B, int64_t V, DType dt, Layout layout) {
  const Device gpu = Device::cuda(0);
  if (layout == Layout::kContiguous) {
    Tensor h = Tensor::from_vector(v, {B, V}, dt);
    return {h, h.to(gpu)};
  }
  const int64_t W = layout == Layout::kColumnStrided ? 2 * V : V + 1;
  std::vector<double> wide(static_cast<std::size_t>(B * W), 0.375);  // filler never read
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < V; ++i) {
      const int64_t col = layout == Layout::kColumnStrided ? 2 * i : i + 1;
      wide[static_cast<std::size_t>(b * W + col)] = v[static_cast<std::size_t>(b * V + i)];
    }
  }
  Tensor h = Tensor::from_vector(wide, {B, W}, dt);
  Tensor d = h.to(gpu);
  if (layout == Layout::kColumnStrided) return {h.slice(1, 0, W, 2), d.slice(1, 0, W, 2)};
  return {h.slice(1, 1, W), d.slice(1, 1, W)};
}

/// `rows` as the kernels receive per-row arguments: one tensor per field on `dev` (int64 source
/// rows, top_k, seed and offset; fp32 thresholds and temperature), read back by sampling_row()
/// value for value.
struct RowTensors {
  std::vector<Tensor> keep;  // the tensors `args` points into
  kernels::SamplingRowArgs args;
};

RowTensors row_tensors(const std::vector<SamplingRow>& rows, Device dev) {
  const int64_t B = static_cast<int64_t>(rows.size());
  RowTensors r;
  auto column = [&](DType dt, auto value_of) {
    Tensor h = Tensor::empty({B}, dt);
    for (int64_t b = 0; b < B; ++b) {
      const SamplingRow& row = rows[static_cast<std::size_t>(b)];
      if (dt == DType::kInt64) {
        h.data<int64_t>()[b] = static_cast<int64_t>(value_of(row));
      } else {
        h.data<float>()[b] = static_cast<float>(value_of(row));
      }
    }
    r.keep.push_back(h.to(dev));
    kernels::RowArg a;
    a.data = r.keep.back().data_ptr();
    a.dtype = dt;
    a.stride = 1;
    return a;
  };
  r.args.src_rows = B;
  r.args.indices = column(DType::kInt64, [](const SamplingRow& x) { return x.src_row; });
  r.args.seed = column(DType::kInt64, [](const SamplingRow& x) { return x.seed; });
  r.args.offset = column(DType::kInt64, [](const SamplingRow& x) { return x.offset; });
  r.args.top_k = column(DType::kInt64, [](const SamplingRow& x) { return x.top_k; });
  r.args.top_p = column(DType::kFloat32, [](const SamplingRow& x) { return x.top_p; });
  r.args.min_p = column(DType::kFloat32, [](const SamplingRow& x) { return x.min_p; });
  r.args.temperature = column(DType::kFloat32, [](const SamplingRow& x) { return x.temperature; });
  return r;
}

struct Samples {
  std::vector<double> tok, valid;
  bool operator==(const Samples& o) const { return tok == o.tok && valid == o.valid; }
};

Samples run_sample(Impl impl, const Input& in, const std::vector<SamplingRow>& rows,
                   SamplingKind kind) {
  const int64_t B = static_cast<int64_t>(rows.size());
  const Device dev = impl == Impl::kCpu ? Device::cpu() : Device::cuda(0);
  const Tensor& x = impl == Impl::kCpu ? in.host : in.dev;
  Tensor samples = Tensor::empty({B}, DType::kInt32, dev);
  Tensor valid = Tensor::empty({B}, DType::kBool, dev);
  const RowTensors table = row_tensors(rows, dev);
  kernels::SamplingParams p;
  p.input = x.data_ptr();
  p.dtype = x.dtype();
  p.vocab = x.size(1);
  p.in_stride_row = x.stride(0);
  p.in_stride_col = x.stride(1);
  p.rows = table.args;
  p.batch = B;
  p.samples = samples.data_ptr();
  p.out_dtype = DType::kInt32;
  p.valid = valid.data<bool>();
  p.kind = kind;
  if (impl == Impl::kCpu) {
    kernels::cpu::sample(p);
  } else {
    if (impl == Impl::kCuda) {
      kernels::cuda::sample(p, nullptr);
    } else {
      testing::oracle_sample(p, nullptr);
    }
    kernels::cuda::stream_synchronize(nullptr);
  }
  return {samples.to(Device::cpu()).to_double_vector(), valid.to(Device::cpu()).to_double_vector()};
}

Tensor run_filter(Impl impl, const Input& in, const std::vector<SamplingRow>& rows,
                  FilterKind kind) {
  const int64_t B = static_cast<int64_t>(rows.size());
  const Device dev = impl == Impl::kCpu ? Device::cpu() : Device::cuda(0);
  const Tensor& x = impl == Impl::kCpu ? in.host : in.dev;
  // As the ops: top-p renorm writes fp32, the others the input's dtype.
  const DType out_dt = kind == FilterKind::kTopPRenorm ? DType::kFloat32 : x.dtype();
  Tensor out = Tensor::empty({B, x.size(1)}, out_dt, dev);
  const RowTensors table = row_tensors(rows, dev);
  kernels::FilterParams p;
  p.input = x.data_ptr();
  p.in_dtype = x.dtype();
  p.out = out.data_ptr();
  p.out_dtype = out_dt;
  p.vocab = x.size(1);
  p.in_stride_row = x.stride(0);
  p.in_stride_col = x.stride(1);
  p.out_stride_row = out.stride(0);
  p.out_stride_col = out.stride(1);
  p.rows = table.args;
  p.batch = B;
  p.kind = kind;
  if (impl == Impl::kCpu) {
    kernels::cpu::filter(p);
  } else {
    if (impl == Impl::kCuda) {
      kernels::cuda::filter(p, nullptr);
    } else {
      testing::oracle_filter(p, nullptr);
    }
    kernels::cuda::stream_synchronize(nullptr);
  }
  return out.to(Device::cpu());
}

Tensor run_softmax(Impl impl, const Input& in, const std::vector<SamplingRow>& rows) {
  const int64_t B = static_cast<int64_t>(rows.size());
  const Device dev = impl == Impl::kCpu ? Device::cpu() : Device::cuda(0);
  const Tensor& x = impl == Impl::kCpu ? in.host : in.dev;
  Tensor out = Tensor::empty({B, x.size(1)}, DType::kFloat32, dev);
  const RowTensors table = row_tensors(rows, dev);
  kernels::SoftmaxParams p;
  p.logits = x.data_ptr();
  p.dtype = x.dtype();
  p.out = out.data<float>();
  p.vocab = x.size(1);
  p.in_stride_row = x.stride(0);
  p.in_stride_col = x.stride(1);
  p.rows = table.args;
  p.batch = B;
  if (impl == Impl::kCpu) {
    kernels::cpu::softmax(p);
  } else {
    if (impl == Impl::kCuda) {
      kernels::cuda::softmax(p, nullptr, false);
    } else {
      testing::oracle_softmax(p, nullptr);
    }
    kernels::cuda::stream_synchronize(nullptr);
  }
  return out.to(Device::cpu());
}

// Spiky rows: `big` tokens at random positions with distinct masses (0.5 .. 1.5 times their
// share of 1 - 1e-5, then normalized; sorted masses at least ~1% apart) and a tail of 1e-5 spread
// evenly, so each big token is well separated from every prefix sum and pivot.
std::vector<double> spiky_rows(int64_t B, int64_t V, int big, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<double> v(static_cast<std::size_t>(B * V));
  for (int64_t b = 0; b < B; ++b) {
    double* r = v.data() + b * V;
    for (int64_t i = 0; i < V; ++i) r[i] = 1e-5 / static_cast<double>(V);
    std::vector<int64_t> pos(static_cast<std::size_t>(V));
    for (int64_t i = 0; i < V; ++i) pos[static_cast<std::size_t>(i)] = i;
    std::shuffle(pos.begin(), pos.end(), gen);
    std::vector<double> w(static_cast<std::size_t>(big));
    for (int j = 0; j < big; ++j)
      w[static_cast<std::size_t>(j)] = 0.5 + (static_cast<double>(j) + 0.3) / big;
    std::shuffle(w.begin(), w.end(), gen);
    double s = 0.0;
    for (double x : w) s += x;
    for (int j = 0; j < big; ++j) {
      r[pos[static_cast<std::size_t>(j)]] = w[static_cast<std::size_t>(j)] / s * (1.0 - 1e-5);
    }
  }
  return v;
}

std::vector<SamplingRow> make_rows(int64_t B, uint64_t seed, uint64_t offset) {
  std::vector<SamplingRow> rows(static_cast<std::size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    SamplingRow& r = rows[static_cast<std::size_t>(b)];
    r.src_row = b;
    r.seed = seed;
    // One seed and offset for every row: a kernel reads element 0 of their tensors, as
    // upstream's do (the callers' offset 5 is unaligned to a Philox block).
    r.offset = offset;
    r.top_k = static_cast<int32_t>(1 + b % 12);
    r.top_p = 0.2f + 0.1f * static_cast<float>(b % 7);
    r.min_p = 0.05f * static_cast<float>(b % 9);
    r.temperature = 0.5f + 0.25f * static_cast<float>(b % 4);
  }
  return rows;
}

constexpr DType kDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
constexpr Layout kLayouts[] = {Layout::kContiguous, Layout::kColumnStrided, Layout::kOffsetByOne};

TEST(SamplingOracle, SamplersMatchOracleAndCpuOnSpikyRows) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t B = 48;
  for (int64_t V : {int64_t{100}, int64_t{257}, int64_t{20011}}) {
    const std::vector<double> v = spiky_rows(B, V, 24, static_cast<uint32_t>(V));
    for (DType dt : kDtypes) {
      for (Layout layout : kLayouts) {
        const Input in = make_input(v, B, V, dt, layout);
        const std::vector<SamplingRow> rows = make_rows(B, 8, 16);
        for (SamplingKind kind : {SamplingKind::kProbs, SamplingKind::kTopK, SamplingKind::kTopP,
                                  SamplingKind::kTopKTopP, SamplingKind::kMinP}) {
          const Samples cpu = run_sample(Impl::kCpu, in, rows, kind);
          const Samples cuda = run_sample(Impl::kCuda, in, rows, kind);
          const Samples oracle = run_sample(Impl::kOracle, in, rows, kind);
          const std::string what = std::string(dtype_torch_name(dt)) + " " + layout_name(layout) +
                                   " V " + std::to_string(V) + " kind " +
                                   std::to_string(static_cast<int>(kind));
          EXPECT_TRUE(cuda == cpu) << what;
          EXPECT_TRUE(cuda == oracle) << what;
          // Replays draw the same tokens.
          EXPECT_TRUE(run_sample(Impl::kCuda, in, rows, kind) == cuda) << what;
        }
      }
    }
  }
}

TEST(SamplingOracle, GumbelMatchesOracleAndCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t B = 32;
  // Noise vectors of 4, 2 and 1 elements (gumbel_vec_width).
  for (int64_t V : {int64_t{100}, int64_t{98}, int64_t{5003}}) {
    Tensor logits = Tensor::empty({B, V}, DType::kFloat32);
    logits.normal_(71, 0.0, 3.0);
    const std::vector<double> v = logits.to_double_vector();
    for (DType dt : kDtypes) {
      for (Layout layout : kLayouts) {
        const Input in = make_input(v, B, V, dt, layout);
        const std::vector<SamplingRow> rows = make_rows(B, 9, 5);
        const Samples cuda = run_sample(Impl::kCuda, in, rows, SamplingKind::kLogits);
        EXPECT_TRUE(cuda == run_sample(Impl::kCpu, in, rows, SamplingKind::kLogits))
            << dtype_torch_name(dt) << " " << layout_name(layout) << " V " << V;
        EXPECT_TRUE(cuda == run_sample(Impl::kOracle, in, rows, SamplingKind::kLogits))
            << dtype_torch_name(dt) << " " << layout_name(layout) << " V " << V;
      }
    }
  }
}

TEST(SamplingOracle, FiltersMatchOracleAndCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t B = 24;
  for (int64_t V : {int64_t{5}, int64_t{257}, int64_t{20011}}) {
    std::vector<double> v = spiky_rows(B, V, std::min<int>(24, static_cast<int>(V)), 3);
    // Ties at the top-k boundary and a NaN in one row (never kept).
    v[0] = v[1];
    v[static_cast<std::size_t>(V + 2)] = std::nan("");
    for (DType dt : kDtypes) {
      for (Layout layout : kLayouts) {
        const Input in = make_input(v, B, V, dt, layout);
        const std::vector<SamplingRow> rows = make_rows(B, 1, 0);
        const std::string what = std::string(dtype_torch_name(dt)) + " " + layout_name(layout) +
                                 " V " + std::to_string(V);
        for (FilterKind kind :
             {FilterKind::kTopKMask, FilterKind::kTopKRenorm, FilterKind::kTopPRenorm}) {
          const Tensor cpu = run_filter(Impl::kCpu, in, rows, kind);
          const Tensor cuda = run_filter(Impl::kCuda, in, rows, kind);
          const Tensor oracle = run_filter(Impl::kOracle, in, rows, kind);
          // The mask is exact; renormalized values differ by the sum's rounding only.
          const testing::Tolerance tol = kind == FilterKind::kTopKMask
                                             ? testing::Tolerance{0, 0}
                                             : testing::default_tolerance(dt);
          EXPECT_TRUE(testing::all_close(cuda, cpu, tol))
              << what << " kind " << static_cast<int>(kind);
          EXPECT_TRUE(testing::all_close(cuda, oracle, tol))
              << what << " kind " << static_cast<int>(kind);
        }
      }
    }
  }
}

TEST(SamplingOracle, SoftmaxMatchesOracleAndCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t B = 16;
  for (int64_t V : {int64_t{7}, int64_t{4100}, int64_t{20011}}) {
    Tensor logits = Tensor::empty({B, V}, DType::kFloat32);
    logits.normal_(5, 0.0, 4.0);
    std::vector<double> v = logits.to_double_vector();
    v[3] = -std::numeric_limits<double>::infinity();  // adds exactly 0
    for (DType dt : kDtypes) {
      for (Layout layout : kLayouts) {
        const Input in = make_input(v, B, V, dt, layout);
        const std::vector<SamplingRow> rows = make_rows(B, 0, 0);
        const Tensor cuda = run_softmax(Impl::kCuda, in, rows);
        EXPECT_TRUE(testing::all_close(cuda, run_softmax(Impl::kCpu, in, rows), {1e-7, 1e-5}))
            << dtype_torch_name(dt) << " " << layout_name(layout) << " V " << V;
        EXPECT_TRUE(testing::all_close(cuda, run_softmax(Impl::kOracle, in, rows), {1e-7, 1e-5}))
            << dtype_torch_name(dt) << " " << layout_name(layout) << " V " << V;
      }
    }
  }
}

// 64 x 128256 fp32 rows of random masses: each sample is the inverse transform of its row's draw
// (the fp64 prefix sum before the token is at most u, the one through it at least u, within
// rounding), filtered samples obey their filter, and a replay draws the same tokens.
TEST(SamplingOracle, LargeVocabDrawsAreInverseTransforms) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const int64_t B = 64, V = 128256;
  Tensor raw = Tensor::empty({B, V}, DType::kFloat32);
  raw.uniform_(17, 0.0, 1.0);
  std::vector<double> v = raw.to_double_vector();
  for (int64_t b = 0; b < B; ++b) {
    double s = 0.0;
    for (int64_t i = 0; i < V; ++i) s += v[b * V + i] = std::pow(v[b * V + i], 4.0);
    for (int64_t i = 0; i < V; ++i) v[b * V + i] = static_cast<float>(v[b * V + i] / s);
  }
  const Input in = make_input(v, B, V, DType::kFloat32, Layout::kContiguous);
  const std::vector<SamplingRow> rows = make_rows(B, 123, 40);
  const Samples probs = run_sample(Impl::kCuda, in, rows, SamplingKind::kProbs);
  EXPECT_TRUE(run_sample(Impl::kCuda, in, rows, SamplingKind::kProbs) == probs);
  for (int64_t b = 0; b < B; ++b) {
    const SamplingRow& r = rows[static_cast<std::size_t>(b)];
    const double u = kernels::philox_uniform_at(r.seed, static_cast<uint64_t>(b), r.offset);
    const int64_t t = static_cast<int64_t>(probs.tok[static_cast<std::size_t>(b)]);
    ASSERT_EQ(probs.valid[static_cast<std::size_t>(b)], 1.0);
    double before = 0.0;
    for (int64_t i = 0; i < t; ++i) before += v[b * V + i];
    EXPECT_LE(before, u + 1e-4) << "row " << b;
    EXPECT_GE(before + v[b * V + t], u - 1e-4) << "row " << b;
  }
  for (SamplingKind kind : {SamplingKind::kTopK, SamplingKind::kTopP, SamplingKind::kMinP}) {
    const Samples s = run_sample(Impl::kCuda, in, rows, kind);
    EXPECT_TRUE(run_sample(Impl::kCuda, in, rows, kind) == s);
    for (int64_t b = 0; b < B; ++b) {
      const SamplingRow& r = rows[static_cast<std::size_t>(b)];
      const double* row = v.data() + b * V;
      const int64_t t = static_cast<int64_t>(s.tok[static_cast<std::size_t>(b)]);
      ASSERT_EQ(s.valid[static_cast<std::size_t>(b)], 1.0);
      int64_t larger = 0;
      double mass = 0.0, mx = 0.0;
      for (int64_t i = 0; i < V; ++i) {
        larger += row[i] > row[t];
        mass += row[i] > row[t] ? row[i] : 0.0;
        mx = std::max(mx, row[i]);
      }
      if (kind == SamplingKind::kTopK) {
        EXPECT_LT(larger, r.top_k) << "row " << b;
      }
      if (kind == SamplingKind::kTopP) {
        EXPECT_LT(mass, r.top_p + 1e-4) << "row " << b;
      }
      if (kind == SamplingKind::kMinP) {
        EXPECT_GE(row[t], static_cast<double>(r.min_p) * mx * (1 - 1e-6)) << "row " << b;
      }
    }
  }
}

#else

TEST(SamplingOracle, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA: no oracle"; }

#endif  // FLASHINFER_TEST_HAVE_ORACLES

}  // namespace
}  // namespace flashinfer
