// Tensor: factories, metadata, views, copies, fills, conversions, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <string_view>

#include "core/cuda_runtime.h"
#include "core/strided.h"
#include "flashinfer/flashinfer.h"
#include "kernels/tensor_copy.h"
#include "util/test_util.h"
#if FLASHINFER_TEST_HAVE_CUDART
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer {
namespace {

std::vector<double> iota(int64_t n) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), 0.0);
  return v;
}

// The row decomposition behind device copies of strided views (Tensor::copy_ moves such views
// with a 2-D copy that never touches the bytes between rows, which may never have been written).
TEST(Strided, RowSpanOfPaddedAndTransposedViews) {
  using detail::as_row_span;
  detail::RowSpan r;
  ASSERT_TRUE(as_row_span({5, 6}, {8, 1}, &r));  // 5 rows of 6 in rows of 8
  EXPECT_EQ(r.rows, 5);
  EXPECT_EQ(r.cols, 6);
  EXPECT_EQ(r.pitch, 8);
  ASSERT_TRUE(as_row_span({6, 5}, {1, 8}, &r));  // its transpose: the same rows
  EXPECT_EQ(r.rows, 5);
  EXPECT_EQ(r.cols, 6);
  EXPECT_EQ(r.pitch, 8);
  ASSERT_TRUE(as_row_span({2, 3, 4}, {24, 8, 1}, &r));  // outer dims at one pitch collapse
  EXPECT_EQ(r.rows, 6);
  EXPECT_EQ(r.cols, 4);
  EXPECT_EQ(r.pitch, 8);
  ASSERT_TRUE(as_row_span({3, 4}, {4, 1}, &r));  // contiguous: one run
  EXPECT_EQ(r.rows, 1);
  EXPECT_EQ(r.cols, 12);
  ASSERT_TRUE(as_row_span({1, 4, 1}, {100, 3, 7}, &r));  // size-1 dims ignored; runs of 1
  EXPECT_EQ(r.rows, 4);
  EXPECT_EQ(r.cols, 1);
  EXPECT_EQ(r.pitch, 3);
  EXPECT_FALSE(as_row_span({2, 3, 4}, {32, 8, 1}, &r));  // two pitches
  EXPECT_FALSE(as_row_span({3, 4}, {0, 1}, &r));         // broadcast
  EXPECT_FALSE(as_row_span({3, 4}, {2, 1}, &r));         // overlapping rows
  EXPECT_FALSE(as_row_span({0, 4}, {4, 1}, &r));         // empty
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_torch_name(DType::kFloat16), "torch.float16");
  EXPECT_EQ(dtype_torch_name(DType::kBFloat16), "torch.bfloat16");
  EXPECT_EQ(dtype_torch_name(DType::kFloat8E4M3FN), "torch.float8_e4m3fn");
  EXPECT_EQ(dtype_torch_name(DType::kFloat8E5M2), "torch.float8_e5m2");
  EXPECT_EQ(dtype_torch_name(DType::kFloat4E2M1FNx2), "torch.float4_e2m1fn_x2");
  EXPECT_EQ(dtype_torch_name(DType::kBool), "torch.bool");
  EXPECT_EQ(dtype_size(DType::kFloat64), 8u);
  EXPECT_EQ(dtype_size(DType::kInt16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat4E2M1FNx2), 1u);
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto d = static_cast<DType>(i);
    EXPECT_EQ(dtype_from_name(dtype_torch_name(d)), d);
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  }
  EXPECT_EQ(dtype_from_name("half"), DType::kFloat16);
  EXPECT_EQ(dtype_from_name("bf16"), DType::kBFloat16);
  EXPECT_EQ(dtype_from_name("torch.long"), DType::kInt64);
  EXPECT_FALSE(dtype_from_name("torch.complex64").has_value());
  EXPECT_TRUE(dtype_is_floating(DType::kFloat8E5M2));
  EXPECT_FALSE(dtype_is_floating(DType::kInt8));
  EXPECT_TRUE(dtype_is_integral(DType::kUInt8));
  EXPECT_FALSE(dtype_is_integral(DType::kBool));
}

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_THROW(Device::parse("cuda:"), Error);
  EXPECT_THROW(Device::parse("cuda:-1"), Error);
  EXPECT_THROW(Device::parse("gpu"), Error);
}

TEST(Tensor, EmptyIsContiguousWithRowMajorStrides) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::kFloat16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(-3), 12);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
  EXPECT_THROW(t.size(3), Error);
  EXPECT_THROW(Tensor::empty({2, -1}, DType::kFloat32), Error);
  EXPECT_FALSE(Tensor().defined());
}

// The flight recorder's ring trusts a kept copy of an owning storage's span while the
// storage's write count is unchanged; memory wrapped by from_blob is not owned.
TEST(Storage, OnlyAllocatedMemoryIsOwnedAndWritesAreCountedPerStorage) {
  const Tensor t = Tensor::empty({4}, DType::kFloat32);
  const Tensor w = Tensor::from_blob(t.data_ptr(), {4}, {}, DType::kFloat32, Device::cpu());
  EXPECT_TRUE(t.storage()->owns_memory());
  EXPECT_FALSE(w.storage()->owns_memory());
  EXPECT_EQ(t.storage()->write_count(), 0u);
  t.storage()->count_write();
  t.slice(0, 1, 3).storage()->count_write();  // a view counts in its storage
  EXPECT_EQ(t.storage()->write_count(), 2u);
  EXPECT_EQ(w.storage()->write_count(), 0u);
}

TEST(Tensor, FromVectorRoundsToNearestEven) {
  // 1 + 2^-11 is halfway between two fp16 values: ties to even gives 1.0.
  Tensor t = Tensor::from_vector({1.0 + std::ldexp(1.0, -11), 3.0}, {2}, DType::kFloat16);
  EXPECT_EQ(t.to_double_vector(), (std::vector<double>{1.0, 3.0}));
  EXPECT_THROW(Tensor::from_vector({1.0}, {2}, DType::kFloat32), Error);
}

TEST(Tensor, SliceSelectTransposePermute) {
  Tensor t = Tensor::from_vector(iota(24), {2, 3, 4}, DType::kFloat32);
  Tensor s = t.slice(2, 1, 4, 2);  // columns 1 and 3
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.strides(), (Shape{12, 4, 2}));
  EXPECT_EQ(s.storage_offset(), 1);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.select(0, 1).select(0, 2).to_double_vector(), (std::vector<double>{21, 23}));
  EXPECT_EQ(t.slice(1, -2, 100).shape(), (Shape{2, 2, 4}));
  Tensor tr = t.transpose(0, 2);
  EXPECT_EQ(tr.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(tr.select(0, 1).select(0, 2).to_double_vector(), (std::vector<double>{9, 21}));
  Tensor p = t.permute({1, 2, 0});
  EXPECT_EQ(p.shape(), (Shape{3, 4, 2}));
  EXPECT_EQ(p.strides(), (Shape{4, 1, 12}));
  EXPECT_THROW(t.permute({0, 0, 1}), Error);
  EXPECT_THROW(t.select(1, 3), Error);
  EXPECT_THROW(t.slice(0, 0, 1, 0), Error);
  // Views share storage: writing through a view is seen by the base.
  t.select(0, 0).select(0, 0).fill_(-1.0);
  EXPECT_EQ(t.to_double_vector()[3], -1.0);
  EXPECT_EQ(t.to_double_vector()[4], 4.0);
}

TEST(Tensor, AsStridedIsBoundsChecked) {
  Tensor t = Tensor::from_vector(iota(6), {6}, DType::kInt32);
  Tensor a = t.as_strided({2, 2}, {1, 2}, 1);  // [[1,3],[2,4]]
  EXPECT_EQ(a.to_double_vector(), (std::vector<double>{1, 3, 2, 4}));
  EXPECT_THROW(t.as_strided({2, 2}, {3, 2}, 1), Error);  // would reach element 6
  EXPECT_THROW(t.as_strided({2}, {-1}, 3), Error);
}

// Issue 16: (size-1)*stride used to wrap, so a view far outside its storage passed the check
// and fill_/rmsnorm on it segfaulted. Every view constructor now does checked arithmetic.
TEST(Tensor, ViewArithmeticOverflowIsAnError) {
  Tensor t = Tensor::from_vector(iota(16), {16}, DType::kFloat32);
  auto expect_overflow = [](auto&& make, const char* op) {
    try {
      make();
      ADD_FAILURE() << "no error for " << op;
    } catch (const Error& e) {
      EXPECT_EQ(e.op(), op);
      EXPECT_NE(std::string(e.what()).find("overflows int64"), std::string::npos) << e.what();
    }
  };
  expect_overflow([&] { return t.as_strided({5}, {int64_t{1} << 62}, 0); }, "Tensor.from_storage");
  expect_overflow(
      [&] {
        return t.as_strided({3, 2}, {int64_t{1} << 62, 1}, 0);
      },
      "Tensor.from_storage");
  expect_overflow([&] { return t.as_strided({2}, {1}, INT64_MAX); }, "Tensor.from_storage");
  expect_overflow([&] { return t.as_strided({1}, {1}, INT64_MAX); }, "Tensor.from_storage");
  float blob[4] = {};
  expect_overflow(
      [&] {
        return Tensor::from_blob(blob, {3}, {int64_t{1} << 62}, DType::kFloat32, Device::cpu(),
                                 nullptr);
      },
      "Tensor.from_blob");
  // span * element size overflows even though the span itself fits.
  expect_overflow(
      [&] {
        return Tensor::from_blob(blob, {2}, {int64_t{1} << 61}, DType::kFloat32, Device::cpu(),
                                 nullptr);
      },
      "Tensor.from_blob");
  expect_overflow(
      [&] {
        return Tensor::empty({0}, DType::kFloat32).view({INT64_MAX, 2, 0});
      },
      "Tensor.view");
  // A huge step keeps one element and does not wrap the size or the stride.
  Tensor s = t.slice(0, 1, 16, INT64_MAX);
  EXPECT_EQ(s.shape(), (Shape{1}));
  EXPECT_EQ(s.to_double_vector(), (std::vector<double>{1.0}));
  // The tensor is intact, and fill_ on a legal view still works.
  Tensor v = t.as_strided({4}, {4}, 0);
  v.fill_(7.0);
  EXPECT_EQ(t.to_double_vector()[12], 7.0);
  EXPECT_EQ(t.to_double_vector()[13], 13.0);
}

TEST(Tensor, ViewAndReshape) {
  Tensor t = Tensor::from_vector(iota(24), {2, 3, 4}, DType::kFloat32);
  EXPECT_EQ(t.view({6, 4}).strides(), (Shape{4, 1}));
  EXPECT_EQ(t.view({-1}).shape(), (Shape{24}));
  EXPECT_EQ(t.view({2, 12}).storage(), t.storage());
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_THROW(t.view({-1, -1}), Error);
  // Merging dims (1, 2) of a transposed tensor is not a view: reshape copies.
  Tensor tr = t.transpose(1, 2);  // [2, 4, 3], strides [12, 1, 4]
  EXPECT_THROW(tr.view({2, 12}), Error);
  Tensor r = tr.reshape({2, 12});
  EXPECT_NE(r.storage(), t.storage());
  EXPECT_EQ(r.to_double_vector()[1], 4.0);  // tr[0][0][1] = t[0][1][0]
  // Splitting a dim of a strided view is a view.
  Tensor s = t.slice(2, 0, 4, 2);  // [2, 3, 2], strides [12, 4, 2]
  Tensor sv = s.view({6, 2});
  EXPECT_EQ(sv.strides(), (Shape{4, 2}));
  EXPECT_EQ(sv.to_double_vector(), s.to_double_vector());
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 2, 3, 4}));
  EXPECT_EQ(t.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(t.unsqueeze(0).squeeze(0).shape(), t.shape());
}

// Copies between views of every element size, with sizes that are not multiples of the
// 32-element tiles the transposed path uses, both directions of a transpose, a step slice and a
// three-dimensional permutation: each equals the logical element order.
TEST(Tensor, StridedCopiesOfEveryElementSizeMatchLogicalOrder) {
  for (DType dt : {DType::kUInt8, DType::kBFloat16, DType::kFloat32, DType::kInt64}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<double> v(3 * 37 * 45);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 251);
    const Tensor t = Tensor::from_vector(v, {3, 37, 45}, dt);
    for (const Tensor& view :
         {t.transpose(1, 2), t.permute({2, 0, 1}), t.transpose(0, 2),
          t.slice(2, 1, 45, 3).transpose(1, 2), t.select(0, 1).transpose(0, 1)}) {
      const Tensor c = view.contiguous();
      EXPECT_TRUE(c.is_contiguous());
      EXPECT_EQ(c.to_double_vector(), view.to_double_vector());
      // Into a transposed destination: contiguous source, strided target.
      Tensor dst = Tensor::zeros(view.shape(), dt);
      const int64_t nd = dst.dim();
      Tensor dst_t =
          Tensor::zeros(dst.transpose(nd - 2, nd - 1).shape(), dt).transpose(nd - 2, nd - 1);
      dst_t.copy_(c);
      EXPECT_EQ(dst_t.to_double_vector(), view.to_double_vector());
    }
  }
}

TEST(Tensor, ContiguousCloneCopy) {
  Tensor t = Tensor::from_vector(iota(12), {3, 4}, DType::kBFloat16);
  EXPECT_EQ(t.contiguous().storage(), t.storage());
  Tensor tr = t.transpose(0, 1);
  Tensor c = tr.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_double_vector(), tr.to_double_vector());
  EXPECT_EQ(c.to_double_vector()[1], 4.0);
  Tensor cl = t.clone();
  EXPECT_NE(cl.storage(), t.storage());
  // copy_ between two non-contiguous views.
  Tensor dst = Tensor::zeros({4, 6}, DType::kBFloat16).slice(1, 0, 6, 2);  // [4, 3]
  dst.copy_(tr.slice(1, 0, 3));
  EXPECT_EQ(dst.to_double_vector(), tr.slice(1, 0, 3).to_double_vector());
  EXPECT_THROW(dst.copy_(t), Error);                                      // shape mismatch
  EXPECT_THROW(dst.copy_(tr.slice(1, 0, 3).to(DType::kFloat32)), Error);  // dtype mismatch
}

TEST(Tensor, FillAndCasts) {
  Tensor t = Tensor::full({2, 2}, 2.5, DType::kFloat16);
  EXPECT_EQ(t.to_double_vector(), (std::vector<double>{2.5, 2.5, 2.5, 2.5}));
  Tensor i = Tensor::from_vector({-3.7, 2.9, 1e10, -1e10}, {4}, DType::kFloat32).to(DType::kInt8);
  EXPECT_EQ(i.to_double_vector(), (std::vector<double>{-3, 2, 127, -128}));
  Tensor b = Tensor::from_vector({0.0, -0.5, 3.0}, {3}, DType::kFloat32).to(DType::kBool);
  EXPECT_EQ(b.to_double_vector(), (std::vector<double>{0, 1, 1}));
  Tensor f8 =
      Tensor::from_vector({448.0, 1000.0, 0.1}, {3}, DType::kFloat32).to(DType::kFloat8E4M3FN);
  auto v = f8.to_double_vector();
  EXPECT_EQ(v[0], 448.0);
  EXPECT_TRUE(std::isnan(v[1]));  // torch semantics: beyond the range is NaN
  EXPECT_EQ(v[2], 0.1015625);
  Tensor fp4 = Tensor::from_vector({0.5, -6.0, 7.0, 1.25}, {2}, DType::kFloat4E2M1FNx2);
  EXPECT_EQ(fp4.to_double_vector(), (std::vector<double>{0.5, -6.0, 6.0, 1.0}));
  EXPECT_EQ(static_cast<const uint8_t*>(fp4.data_ptr())[0], 0xF1);  // low nibble = element 0
  EXPECT_THROW(fp4.to(DType::kFloat32), Error);
  EXPECT_DOUBLE_EQ(Tensor::full({1}, 7.0, DType::kInt64).item(), 7.0);
  EXPECT_THROW(t.item(), Error);
}

// Values a dtype cannot hold are errors, as torch's: NaN is NaN in every floating dtype that has
// one, and never a silent 0 in an integer tensor; normal_ wants a floating dtype.
TEST(Tensor, FillWithUnrepresentableValuesAndNormalOnIntegers) {
  const double nan = std::nan(""), inf = INFINITY;
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                  DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
    EXPECT_TRUE(std::isnan(Tensor::full({2}, nan, d).to_double_vector()[1])) << dtype_name(d);
  }
  for (DType d : {DType::kInt8, DType::kUInt8, DType::kInt16, DType::kInt32, DType::kInt64}) {
    for (double v : {nan, inf, -inf}) {
      try {
        Tensor::full({2}, v, d);
        ADD_FAILURE() << dtype_name(d) << " took " << v;
      } catch (const Error& e) {
        EXPECT_EQ(e.arg(), "value") << e.what();
      }
    }
    EXPECT_THROW(Tensor::zeros({2}, d).normal_(1), Error) << dtype_name(d);
  }
  EXPECT_THROW(Tensor::full({1}, 128, DType::kInt8), Error);
  EXPECT_THROW(Tensor::full({1}, -1, DType::kUInt8), Error);
  EXPECT_THROW(Tensor::full({1}, 2147483648.0, DType::kInt32), Error);
  EXPECT_THROW(Tensor::full({1}, 9223372036854775808.0, DType::kInt64), Error);
  EXPECT_THROW(Tensor::full({1}, nan, DType::kFloat4E2M1FNx2), Error);
  // The range's ends, and fractions truncated toward zero as torch does.
  EXPECT_EQ(Tensor::full({1}, 127.9, DType::kInt8).item(), 127.0);
  EXPECT_EQ(Tensor::full({1}, -128.0, DType::kInt8).item(), -128.0);
  EXPECT_EQ(Tensor::full({1}, -0.5, DType::kUInt8).item(), 0.0);
  EXPECT_EQ(Tensor::full({1}, -2147483648.0, DType::kInt32).item(), -2147483648.0);
  EXPECT_EQ(Tensor::full({1}, -9223372036854775808.0, DType::kInt64).item(),
            -9223372036854775808.0);
  EXPECT_THROW(Tensor::zeros({2}, DType::kBool).normal_(1), Error);
}

// Every dtype, a value whose bytes differ (the typed fill) and one whose bytes are all equal (a
// memset), over run lengths around the fill's doubling copies; then views: step slices, a
// transpose, rows of a slice (contiguous runs), a size-1 middle dimension, stride-0 and
// overlapping views. The oracle is the set of storage offsets each view covers (walked here by
// index): those hold the value's bytes, every other byte keeps the sentinel.
struct FillCase {
  DType dtype;
  double value, same_bytes, sentinel;
};

std::vector<FillCase> fill_cases() {
  return {{DType::kFloat32, -1.75, -0.0, 3.0},     {DType::kFloat16, -1.75, 0.0, 3.0},
          {DType::kBFloat16, -1.75, -0.0, 3.0},    {DType::kFloat64, -1.75, 0.0, 3.0},
          {DType::kFloat8E4M3FN, -1.75, 1.0, 3.0}, {DType::kFloat8E5M2, -1.75, 1.0, 3.0},
          {DType::kInt8, -3.0, 5.0, 7.0},          {DType::kUInt8, 200.0, 0.0, 7.0},
          {DType::kInt16, -300.0, -1.0, 7.0},      {DType::kInt32, -70000.0, -1.0, 7.0},
          {DType::kInt64, -5e9, -1.0, 7.0},        {DType::kBool, 1.0, 0.0, 0.0},
          {DType::kFloat4E2M1FNx2, -1.5, 6.0, 0.5}};
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.storage()->data());
  return std::vector<uint8_t>(p, p + t.storage()->nbytes());
}

// Storage offsets (elements) of every element of a view.
std::vector<int64_t> covered_offsets(const Tensor& v) {
  std::vector<int64_t> out;
  std::vector<int64_t> idx(static_cast<std::size_t>(v.dim()), 0);
  for (int64_t e = 0; e < v.numel(); ++e) {
    int64_t off = v.storage_offset();
    for (int64_t d = 0; d < v.dim(); ++d) off += idx[d] * v.stride(d);
    out.push_back(off);
    for (int64_t d = v.dim() - 1; d >= 0 && ++idx[d] == v.size(d); --d) idx[d] = 0;
  }
  return out;
}

TEST(Tensor, FillAndZerosOfEveryDtypeAndLength) {
  for (const FillCase& c : fill_cases()) {
    SCOPED_TRACE(dtype_name(c.dtype));
    const std::size_t es = dtype_size(c.dtype);
    const int per = c.dtype == DType::kFloat4E2M1FNx2 ? 2 : 1;  // values per element
    for (double v : {c.value, c.same_bytes}) {
      const std::vector<uint8_t> one = bytes_of(Tensor::full({1}, v, c.dtype));
      for (int64_t n : {1, 2, 3, 7, 64, 1001}) {
        const Tensor t = Tensor::full({n}, v, c.dtype);
        EXPECT_EQ(t.to_double_vector(), std::vector<double>(n * per, v)) << n;
        const std::vector<uint8_t> b = bytes_of(t);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::memcmp(b.data() + i * es, one.data(), es), 0) << v << " " << n << " " << i;
        }
      }
    }
    // zeros: every byte 0, also where the allocator hands back memory a fill just used.
    { Tensor junk = Tensor::full({3, 333}, c.value, c.dtype); }
    for (const Shape& shape : {Shape{3, 333}, Shape{}, Shape{0, 4}, Shape{5}}) {
      const Tensor z = Tensor::zeros(shape, c.dtype);
      EXPECT_EQ(z.shape(), shape);
      EXPECT_TRUE(z.is_contiguous());
      for (uint8_t x : bytes_of(z)) ASSERT_EQ(x, 0);
      EXPECT_EQ(z.to_double_vector(), std::vector<double>(z.numel() * per, 0.0));
    }
  }
}

TEST(Tensor, FillOfStridedAndOverlappingViewsOfEveryDtype) {
  for (const FillCase& c : fill_cases()) {
    SCOPED_TRACE(dtype_name(c.dtype));
    const std::size_t es = dtype_size(c.dtype);
    const std::vector<uint8_t> sentinel = bytes_of(Tensor::full({1}, c.sentinel, c.dtype));
    const std::function<Tensor(const Tensor&)> views[] = {
        [](const Tensor& t) { return t; },
        [](const Tensor& t) { return t.slice(2, 1, 9); },      // rows of 8: contiguous runs
        [](const Tensor& t) { return t.slice(2, 0, 10, 3); },  // inner stride 3
        [](const Tensor& t) { return t.transpose(0, 2); },
        [](const Tensor& t) { return t.slice(0, 1, 3); },                  // one contiguous block
        [](const Tensor& t) { return t.slice(1, 2, 3).slice(2, 3, 10); },  // size-1 middle dim
        [](const Tensor& t) { return t.select(1, 4).slice(0, 1, 4, 2); },
        [](const Tensor& t) {
          return t.as_strided({3, 4}, {0, 1}, 5);
        },  // rows alias
        [](const Tensor& t) {
          return t.as_strided({4, 3}, {1, 0}, 2);
        },  // inner stride 0
        [](const Tensor& t) {
          return t.as_strided({5, 6}, {4, 1}, 7);
        },  // overlapping rows
        [](const Tensor& t) {
          return t.as_strided({1, 1}, {9, 9}, 17);
        },  // one element
    };
    for (double v : {c.value, c.same_bytes}) {
      const std::vector<uint8_t> one = bytes_of(Tensor::full({1}, v, c.dtype));
      for (std::size_t vi = 0; vi < std::size(views); ++vi) {
        Tensor base = Tensor::full({4, 6, 10}, c.sentinel, c.dtype);
        Tensor view = views[vi](base);
        view.fill_(v);
        std::vector<bool> hit(240, false);
        for (int64_t off : covered_offsets(view)) hit[static_cast<std::size_t>(off)] = true;
        const std::vector<uint8_t> b = bytes_of(base);
        for (std::size_t i = 0; i < 240; ++i) {
          ASSERT_EQ(std::memcmp(b.data() + i * es, (hit[i] ? one : sentinel).data(), es), 0)
              << "view " << vi << " value " << v << " element " << i;
        }
      }
    }
  }
}

// ---- the device-side copy kernel's body (kernels/tensor_copy.h), run here on host buffers

// Writes dst (a view) from src (a view of the same shape; undefined: a fill with `fill`'s first
// element) with tensor_copy_element<kBytes, Index>, element by element as the kernel's threads do.
template <int kBytes, class Index>
void run_copy_body(const Tensor& dst, const Tensor& src, const Tensor& fill = Tensor()) {
  kernels::TensorCopyArgs a;
  ASSERT_TRUE(kernels::tensor_copy_dims(dst.shape(), dst.strides(),
                                        src.defined() ? src.strides() : Shape{}, &a));
  a.dst = static_cast<uint8_t*>(dst.data_ptr());
  a.dst_dtype = dst.dtype();
  a.dst_size = static_cast<uint8_t>(dtype_size(dst.dtype()));
  if (src.defined()) {
    a.src = static_cast<const uint8_t*>(src.data_ptr());
    a.src_dtype = src.dtype();
    a.src_size = static_cast<uint8_t>(dtype_size(src.dtype()));
  } else {
    a.src_dtype = dst.dtype();
    a.src_size = a.dst_size;
    std::memcpy(a.fill, fill.data_ptr(), a.dst_size);
  }
  if (sizeof(Index) == 4) {
    ASSERT_TRUE(kernels::tensor_copy_fits_int32(a));
  }
  for (int64_t i = 0; i < a.numel; ++i)
    kernels::tensor_copy_element<kBytes, Index>(a, static_cast<Index>(i));
}

template <class Index>
void run_copy_body_sized(int bytes, const Tensor& dst, const Tensor& src, const Tensor& fill) {
  switch (bytes) {
    case 1:
      return run_copy_body<1, Index>(dst, src, fill);
    case 2:
      return run_copy_body<2, Index>(dst, src, fill);
    case 4:
      return run_copy_body<4, Index>(dst, src, fill);
    case 8:
      return run_copy_body<8, Index>(dst, src, fill);
    default:
      return run_copy_body<0, Index>(dst, src, fill);
  }
}

// Views of a [4, 6, 10] base as the copy tests take them: dense, sliced, strided, transposed,
// size-1 and broadcast dimensions (sources only), one element.
std::vector<std::function<Tensor(const Tensor&)>> copy_views(bool as_source) {
  std::vector<std::function<Tensor(const Tensor&)>> v = {
      [](const Tensor& t) { return t; },
      [](const Tensor& t) { return t.slice(2, 1, 9); },
      [](const Tensor& t) { return t.slice(2, 0, 10, 3); },
      [](const Tensor& t) { return t.transpose(0, 2); },
      [](const Tensor& t) {
        return t.permute({1, 2, 0});
      },
      [](const Tensor& t) { return t.slice(1, 2, 3).slice(2, 3, 10); },
      [](const Tensor& t) { return t.select(1, 4).slice(0, 1, 4, 2); },
      [](const Tensor& t) {
        return t.as_strided({1, 1}, {9, 9}, 17);
      },
      [](const Tensor& t) { return t.select(0, 3).select(0, 5).select(0, 9); },  // 0-dim
  };
  if (as_source) {
    v.push_back([](const Tensor& t) { return t.as_strided({4, 3}, {1, 0}, 2); });  // broadcast
    v.push_back([](const Tensor& t) { return t.as_strided({5, 6}, {4, 1}, 7); });  // overlapping
  }
  return v;
}

TEST(TensorCopyKernel, DimensionsMergeWhereBothViewsAllow) {
  kernels::TensorCopyArgs a;
  ASSERT_TRUE(kernels::tensor_copy_dims({4, 6, 10}, {60, 10, 1}, {60, 10, 1}, &a));
  EXPECT_EQ(a.ndim, 1);
  EXPECT_EQ(a.shape[0], 240);
  EXPECT_EQ(a.numel, 240);
  // Rows of a slice: the inner two merge on the source only, so they stay apart.
  ASSERT_TRUE(kernels::tensor_copy_dims({4, 6, 8}, {48, 8, 1}, {60, 10, 1}, &a));
  EXPECT_EQ(a.ndim, 2);
  EXPECT_EQ(a.shape[0], 24);
  EXPECT_EQ(a.shape[1], 8);
  EXPECT_EQ(a.src_stride[0], 10);
  EXPECT_EQ(a.dst_stride[0], 8);
  // Size-1 dimensions drop out; a fill merges on the destination alone.
  ASSERT_TRUE(kernels::tensor_copy_dims({1, 5, 1, 3}, {99, 3, 7, 1}, {}, &a));
  EXPECT_EQ(a.ndim, 1);
  EXPECT_EQ(a.shape[0], 15);
  EXPECT_EQ(a.src_stride[0], 0);
  ASSERT_TRUE(kernels::tensor_copy_dims({}, {}, {}, &a));  // one element
  EXPECT_EQ(a.ndim, 0);
  EXPECT_EQ(a.numel, 1);
  EXPECT_FALSE(kernels::tensor_copy_dims({3, 0}, {1, 1}, {1, 1}, &a));  // nothing to do
  // Nine dimensions that cannot merge are the host's; nine that merge to one are not.
  Shape shape(9, 2), dense(9), gapped(9);
  for (int d = 8, s = 1; d >= 0; --d, s *= 2) dense[static_cast<std::size_t>(d)] = s;
  for (int d = 8, s = 1; d >= 0; --d, s *= 3) gapped[static_cast<std::size_t>(d)] = s;
  EXPECT_FALSE(kernels::tensor_copy_dims(shape, dense, gapped, &a));
  ASSERT_TRUE(kernels::tensor_copy_dims(shape, dense, dense, &a));
  EXPECT_EQ(a.ndim, 1);
  // 32-bit indices: every element and offset below 2^31.
  ASSERT_TRUE(kernels::tensor_copy_dims({2, 3}, {3, 1}, {int64_t{1} << 30, 1}, &a));
  EXPECT_TRUE(kernels::tensor_copy_fits_int32(a));
  ASSERT_TRUE(kernels::tensor_copy_dims({3, 3}, {3, 1}, {int64_t{1} << 30, 1}, &a));
  EXPECT_FALSE(kernels::tensor_copy_fits_int32(a));
}

// Every (source view, destination view) pair: the body writes exactly the destination's
// elements, in the source's row-major order, word moves and byte moves alike.
TEST(TensorCopyKernel, BodyCopiesEveryViewPairAsTheHostDoes) {
  for (DType dt : {DType::kUInt8, DType::kBFloat16, DType::kFloat32, DType::kInt64}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<double> v(240);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7) % 101);
    const Tensor src_base = Tensor::from_vector(v, {4, 6, 10}, dt);
    const auto srcs = copy_views(true);
    const auto dsts = copy_views(false);
    for (std::size_t si = 0; si < srcs.size(); ++si) {
      const Tensor src = srcs[si](src_base);
      for (std::size_t di = 0; di < dsts.size(); ++di) {
        Tensor want_base = Tensor::full({4, 6, 10}, 111.0, dt);
        Tensor want = dsts[di](want_base);
        if (want.shape() != src.shape()) continue;  // the pairs of one shape
        want.copy_(src);
        for (int bytes : {0, static_cast<int>(dtype_size(dt))}) {
          for (bool wide : {false, true}) {
            Tensor base = Tensor::full({4, 6, 10}, 111.0, dt);
            Tensor dst = dsts[di](base);
            if (wide) {
              run_copy_body_sized<int64_t>(bytes, dst, src, Tensor());
            } else {
              run_copy_body_sized<int32_t>(bytes, dst, src, Tensor());
            }
            ASSERT_EQ(bytes_of(base), bytes_of(want_base))
                << "source view " << si << " destination view " << di << " word " << bytes
                << " int64 " << wide;
          }
        }
      }
    }
    // Each view copied into a dense tensor of its shape (contiguous()), and the reverse.
    for (std::size_t si = 0; si < srcs.size(); ++si) {
      const Tensor src = srcs[si](src_base);
      Tensor dense = Tensor::full(src.shape(), 111.0, dt);
      run_copy_body_sized<int32_t>(static_cast<int>(dtype_size(dt)), dense, src, Tensor());
      EXPECT_EQ(dense.to_double_vector(), src.contiguous().to_double_vector()) << si;
    }
    for (std::size_t di = 0; di < dsts.size(); ++di) {
      Tensor base = Tensor::full({4, 6, 10}, 111.0, dt), want_base = base.clone();
      Tensor dst = dsts[di](base), want = dsts[di](want_base);
      const Tensor src = Tensor::from_vector(
          std::vector<double>(v.begin(), v.begin() + dst.numel()), dst.shape(), dt);
      want.copy_(src);
      run_copy_body_sized<int32_t>(0, dst, src, Tensor());
      EXPECT_EQ(bytes_of(base), bytes_of(want_base)) << di;
    }
  }
}

// A cast through the body gives Tensor::to's bits for every pair of dtypes (fp4 pairs excepted:
// a cast to or from them changes the shape), over values at every format's edges.
TEST(TensorCopyKernel, BodyCastsEveryDtypePairAsTensorTo) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> values = {
      0.0,      -0.0,    1.0,     -1.5,     0.1,          448.0,         464.0, 465.0,
      480.0,    57344.0, 61440.0, 65504.0,  65520.0,      1e-8,          -3e-5, 6e-8,
      1.17e-38, 1e39,    -1e39,   inf,      -inf,         std::nan(""),  127.5, -128.9,
      255.0,    256.0,   32767.0, -32769.0, 2147483647.0, -2147483649.0, 5e18,  -9.3e18,
      0.5,      2.5,     3.5,     -2.5};
  const DType all[] = {DType::kFloat32,      DType::kFloat16,    DType::kBFloat16, DType::kFloat64,
                       DType::kFloat8E4M3FN, DType::kFloat8E5M2, DType::kInt8,     DType::kUInt8,
                       DType::kInt16,        DType::kInt32,      DType::kInt64,    DType::kBool};
  const int64_t n = static_cast<int64_t>(values.size());
  for (DType from : all) {
    // The values as `from` holds them (a NaN in an integer dtype is 0, as encode_element writes).
    Tensor src = Tensor::empty({n}, from);
    for (int64_t i = 0; i < n; ++i) {
      ::flashinfer::detail::encode_element(
          from, values[static_cast<std::size_t>(i)],
          static_cast<uint8_t*>(src.data_ptr()) + i * dtype_size(from));
    }
    for (DType to : all) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
      const Tensor want = src.to(to);
      // Strided on both sides too: every other element of the source into a transposed pair.
      Tensor dst = Tensor::full({n}, 0.0, to);
      run_copy_body<0, int32_t>(dst, src);
      EXPECT_EQ(bytes_of(dst), bytes_of(want));
      const Tensor src2 = src.slice(0, 0, 4 * (n / 4), 2).view({n / 4, 2});
      Tensor dst2 = Tensor::full({2, n / 4}, 0.0, to).transpose(0, 1);
      run_copy_body<0, int64_t>(dst2, src2);
      EXPECT_EQ(bytes_of(dst2.contiguous()), bytes_of(src2.to(to).contiguous()));
    }
  }
}

TEST(TensorCopyKernel, BodyFillsEveryViewAsFillDoes) {
  for (const FillCase& c : fill_cases()) {
    SCOPED_TRACE(dtype_name(c.dtype));
    const Tensor one = Tensor::full({1}, c.value, c.dtype);
    for (const auto& view : copy_views(false)) {
      Tensor base = Tensor::full({4, 6, 10}, c.sentinel, c.dtype), want_base = base.clone();
      view(want_base).fill_(c.value);
      for (int bytes : {0, static_cast<int>(dtype_size(c.dtype))}) {
        Tensor b = base.clone();
        run_copy_body_sized<int32_t>(bytes, view(b), Tensor(), one);
        EXPECT_EQ(bytes_of(b), bytes_of(want_base)) << bytes;
      }
    }
  }
}

// ---- the same on a device: Tensor's copies, casts and fills there no longer go through the host

TEST(Tensor, CudaStridedCopiesCastsAndFillsMatchTheHost) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::kUInt8, DType::kBFloat16, DType::kFloat32, DType::kInt64}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<double> v(240);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7) % 101);
    const Tensor host = Tensor::from_vector(v, {4, 6, 10}, dt);
    const Tensor dev = host.to(gpu);
    const auto srcs = copy_views(true);
    const auto dsts = copy_views(false);
    for (std::size_t si = 0; si < srcs.size(); ++si) {
      // contiguous() and a cast of a strided view, on the device.
      const Tensor view = srcs[si](dev);
      const Tensor c = view.contiguous();
      EXPECT_EQ(c.device(), gpu);
      EXPECT_EQ(c.to_double_vector(), srcs[si](host).contiguous().to_double_vector()) << si;
      for (DType to : {DType::kFloat16, DType::kFloat8E4M3FN, DType::kInt32}) {
        const Tensor cast = view.to(to);
        EXPECT_EQ(cast.device(), gpu);
        EXPECT_EQ(bytes_of(cast.to(Device::cpu())), bytes_of(srcs[si](host).to(to))) << si;
      }
      // Device to host: only the view's elements cross (made dense on the device first).
      Tensor to_host = Tensor::full(view.shape(), 111.0, dt);
      to_host.copy_(view);
      EXPECT_EQ(to_host.to_double_vector(), srcs[si](host).to_double_vector()) << si;
      for (std::size_t di = 0; di < dsts.size(); ++di) {
        Tensor want_base = Tensor::full({4, 6, 10}, 111.0, dt);
        Tensor want = dsts[di](want_base);
        if (want.shape() != view.shape()) continue;
        want.copy_(srcs[si](host));
        Tensor base = Tensor::full({4, 6, 10}, 111.0, dt, gpu);
        dsts[di](base).copy_(view);
        EXPECT_EQ(bytes_of(base.to(Device::cpu())), bytes_of(want_base))
            << "source view " << si << " destination view " << di;
        // Host to a strided device view: its elements written, its neighbours untouched.
        Tensor base2 = Tensor::full({4, 6, 10}, 111.0, dt, gpu);
        dsts[di](base2).copy_(srcs[si](host));
        EXPECT_EQ(bytes_of(base2.to(Device::cpu())), bytes_of(want_base))
            << "host source view " << si << " device destination view " << di;
      }
    }
  }
  for (const FillCase& c : fill_cases()) {
    SCOPED_TRACE(dtype_name(c.dtype));
    for (const auto& view : copy_views(false)) {
      Tensor want_base = Tensor::full({4, 6, 10}, c.sentinel, c.dtype);
      Tensor base = want_base.to(gpu);
      view(want_base).fill_(c.value);
      view(base).fill_(c.value);
      EXPECT_EQ(bytes_of(base.to(Device::cpu())), bytes_of(want_base));
    }
  }
}

#if FLASHINFER_TEST_HAVE_CUDART
// What a CUDA graph needs of them: nothing synchronizes, so a capture in global mode succeeds, and
// the graph's launch writes what the eager calls write.
TEST(Tensor, CudaStridedCopiesCastsAndFillsCaptureIntoAGraph) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const Tensor host = Tensor::from_vector(iota(240), {4, 6, 10}, DType::kBFloat16);
  const Tensor dev = host.to(gpu);
  Tensor dense = Tensor::empty({10, 6, 4}, DType::kBFloat16, gpu);
  Tensor cast = Tensor::empty({4, 6, 5}, DType::kFloat32, gpu);
  Tensor filled = Tensor::zeros({4, 6, 10}, DType::kFloat16, gpu);
  const auto calls = [&] {
    dense.copy_(dev.transpose(0, 2));
    cast.copy_(dev.slice(2, 0, 10, 2).to(DType::kFloat32));
    filled.slice(2, 1, 9).fill_(2.5);
  };
  calls();  // eager first, as engines warm up
  // The cast makes a new tensor inside the capture: the allocator never hands a capture a cached
  // block (the graph addresses it on every replay); it makes a fresh one in relaxed capture mode
  // (a plain cudaMalloc ends a global-mode capture: the first GPU run, 2026-11-30), kept until a
  // capture hold ends (a CudaGraphMemoryScope, or flashinfer bench's graph timing) or, without
  // a hold, the graph's for good.
  for (const bool with_hold : {true, false}) {
    SCOPED_TRACE(with_hold ? "under a capture hold" : "no hold");
    dense.fill_(0.0);
    cast.fill_(0.0);
    filled.fill_(0.0);
    std::optional<CudaGraphMemoryScope> scope;
    if (with_hold) scope.emplace(0);
    ASSERT_EQ(scope.has_value() && scope->active(), with_hold);
    ASSERT_NO_FATAL_FAILURE(testing::capture_on_own_stream(calls));
    EXPECT_EQ(dense.to_double_vector(), host.transpose(0, 2).to_double_vector());
    EXPECT_EQ(cast.to_double_vector(), host.slice(2, 0, 10, 2).to_double_vector());
    Tensor want = Tensor::zeros({4, 6, 10}, DType::kFloat16);
    want.slice(2, 1, 9).fill_(2.5);
    EXPECT_EQ(filled.to_double_vector(), want.to_double_vector());
  }
}

// Inside a capture, a host-to-device copy made under a CaptureUploadScope (an op's own per-call
// metadata: single_prefill_with_kv_cache's plan) goes by value: the graph keeps the bytes as they
// were at capture, however the host memory changes after; 10,001 bytes take three launches, the
// last one partial, and a strided device view is filled from such a copy made dense on the
// device. Outside a scope a host tensor's copy is refused (a replay would not see its later
// contents), and a copy to the host has no graph form: both refused by name, the capture intact.
TEST(Tensor, CudaHostToDeviceCopiesInsideACaptureKeepTheCapturedBytes) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  Tensor host = Tensor::empty({10001}, DType::kUInt8);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  const std::vector<double> want = host.to_double_vector();
  Tensor rows_host = Tensor::from_vector(iota(24), {4, 6}, DType::kFloat32);
  Tensor dev = Tensor::zeros({10001}, DType::kUInt8, gpu);
  Tensor base = Tensor::full({4, 9}, -1.0, DType::kFloat32, gpu);
  const std::vector<double> want_base = [&] {
    Tensor b = Tensor::full({4, 9}, -1.0, DType::kFloat32);
    b.slice(1, 2, 8).copy_(rows_host);
    return b.to_double_vector();
  }();
  const CudaGraphMemoryScope hold(0);
  ASSERT_NO_FATAL_FAILURE(testing::capture_on_own_stream([&] {
    EXPECT_FI_ERROR(dev.copy_(host), "Tensor.copy_", "src");
    {
      const detail::CaptureUploadScope by_value;
      dev.copy_(host);
      base.slice(1, 2, 8).copy_(rows_host);
      EXPECT_FI_ERROR(dev.to(Device::cpu()), "Tensor.copy_", "src");
    }
    host.fill_(0.0);  // after the capture, before the launch: not what the graph writes
    rows_host.fill_(0.0);
  }));
  EXPECT_EQ(dev.to_double_vector(), want);
  EXPECT_EQ(base.to_double_vector(), want_base);
}
#endif

// CudaGraphMemoryScope holds the device's allocator in a CUDA build with the cache on (no GPU
// needed: the hold is the allocator's bookkeeping), and is inert elsewhere; scopes nest.
TEST(Tensor, CudaGraphMemoryScopeHoldsTheAllocatorWhereThereIsOne) {
  const char* env = std::getenv("FLASHINFER_CUDA_CACHING_ALLOCATOR");
  const bool cache_on = cuda_compiled() && (env == nullptr || std::string_view(env) != "0");
  CudaGraphMemoryScope outer(0);
  EXPECT_EQ(outer.active(), cache_on);
  {
    CudaGraphMemoryScope inner(0);
    EXPECT_EQ(inner.active(), cache_on);
  }
  CudaGraphMemoryScope out_of_range(1000);
  EXPECT_FALSE(out_of_range.active());
}

TEST(Tensor, SeededRandomFillIsReproducible) {
  Tensor a = Tensor::empty({64, 33}, DType::kFloat32);
  Tensor b = Tensor::empty({64, 33}, DType::kFloat32);
  a.uniform_(123, -2.0, 3.0);
  b.uniform_(123, -2.0, 3.0);
  const auto va = a.to_double_vector(), vb = b.to_double_vector();
  EXPECT_EQ(va, vb);
  double lo = 1e9, hi = -1e9, sum = 0;
  for (double x : va) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    sum += x;
  }
  EXPECT_GE(lo, -2.0);
  EXPECT_LT(hi, 3.0);
  EXPECT_NEAR(sum / va.size(), 0.5, 0.1);  // mean of U(-2, 3); 2112 samples, sd of mean ~0.03
  b.uniform_(124, -2.0, 3.0);
  EXPECT_NE(va, b.to_double_vector());
  // A strided destination gets the values in logical order.
  Tensor c = Tensor::empty({33, 64}, DType::kFloat32).transpose(0, 1);
  c.uniform_(123, -2.0, 3.0);
  EXPECT_EQ(c.to_double_vector(), va);
  Tensor n = Tensor::empty({4096}, DType::kFloat32);
  n.normal_(5, 1.0, 2.0);
  double m = 0, m2 = 0;
  for (double x : n.to_double_vector()) {
    m += x;
    m2 += x * x;
  }
  m /= 4096;
  EXPECT_NEAR(m, 1.0, 0.1);
  EXPECT_NEAR(std::sqrt(m2 / 4096 - m * m), 2.0, 0.1);
}

TEST(Tensor, FromBlobUsesCallerMemoryAndDeleter) {
  std::vector<float> buf = {1, 2, 3, 4, 5, 6};
  int deleted = 0;
  {
    Tensor t = Tensor::from_blob(
        buf.data(), {2, 2}, {3, 1}, DType::kFloat32, Device::cpu(), [&](void*) { ++deleted; }, 1);
    EXPECT_EQ(t.to_double_vector(), (std::vector<double>{2, 3, 5, 6}));
    t.fill_(0.0);
    Tensor view = t.slice(0, 1, 2);
    EXPECT_EQ(deleted, 0);
  }
  EXPECT_EQ(deleted, 1);
  EXPECT_EQ(buf, (std::vector<float>{1, 0, 0, 4, 0, 0}));
}

TEST(Tensor, DescribeAndShapeText) {
  EXPECT_EQ(shape_to_string({}), "()");
  EXPECT_EQ(shape_to_string({3}), "(3,)");
  EXPECT_EQ(shape_to_string({2, 3}), "(2, 3)");
  EXPECT_EQ(Tensor::empty({2, 3}, DType::kFloat32).describe(),
            "Tensor(shape=(2, 3), stride=(3, 1), dtype=torch.float32, device=cpu)");
}

TEST(Tensor, CudaRequestsFailCleanlyWithoutAGpu) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_THROW(Tensor::empty({2}, DType::kFloat32, Device::cuda(0)), Error);
  EXPECT_THROW(Tensor::zeros({2}, DType::kFloat32).to(Device::cuda(0)), Error);
}

TEST(Tensor, CudaRoundTrip) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Tensor h = Tensor::from_vector(iota(24), {2, 3, 4}, DType::kFloat16);
  Tensor d = h.to(Device::cuda(0));
  EXPECT_EQ(d.device(), Device::cuda(0));
  EXPECT_EQ(d.to_double_vector(), h.to_double_vector());
  // Non-contiguous on both sides.
  Tensor dt = d.transpose(0, 2);
  EXPECT_EQ(dt.to(Device::cpu()).to_double_vector(), h.transpose(0, 2).to_double_vector());
  Tensor dst = Tensor::zeros({4, 3, 2}, DType::kFloat16, Device::cuda(0)).transpose(0, 2);
  dst.copy_(h);
  EXPECT_EQ(dst.to_double_vector(), h.to_double_vector());
  Tensor r = Tensor::empty({100}, DType::kFloat32, Device::cuda(0));
  r.uniform_(9);
  Tensor rh = Tensor::empty({100}, DType::kFloat32);
  rh.uniform_(9);
  EXPECT_EQ(r.to_double_vector(), rh.to_double_vector());
}

// Zero fills of contiguous device tensors are one cudaMemsetAsync on the current stream; other
// values and strided views take the host path. Both must give torch's result: every byte of a
// dirty allocation cleared, -0.0 keeping its sign, a strided view's neighbours untouched.
TEST(Tensor, CudaZeroFillClearsExactlyTheTensor) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Tensor d = Tensor::from_vector(iota(24), {4, 6}, DType::kBFloat16).to(Device::cuda(0));
  d.fill_(0.0);
  EXPECT_EQ(d.to_double_vector(), std::vector<double>(24, 0.0));
  EXPECT_EQ(Tensor::zeros({1000}, DType::kFloat32, Device::cuda(0)).to_double_vector(),
            std::vector<double>(1000, 0.0));
  Tensor n = Tensor::from_vector(iota(3), {3}, DType::kFloat32).to(Device::cuda(0));
  n.fill_(-0.0);
  for (double v : n.to_double_vector()) {
    EXPECT_EQ(v, 0.0);
    EXPECT_TRUE(std::signbit(v));
  }
  Tensor e = Tensor::from_vector(iota(24), {4, 6}, DType::kFloat32).to(Device::cuda(0));
  e.select(1, 2).fill_(0.0);  // a strided column
  std::vector<double> want = iota(24);
  for (int r = 0; r < 4; ++r) want[static_cast<std::size_t>(r * 6 + 2)] = 0.0;
  EXPECT_EQ(e.to_double_vector(), want);
  Tensor part = Tensor::from_vector(iota(24), {24}, DType::kFloat16).to(Device::cuda(0));
  part.slice(0, 4, 10).fill_(0.0);  // contiguous, at an offset: only its 6 elements
  want = iota(24);
  for (int i = 4; i < 10; ++i) want[static_cast<std::size_t>(i)] = 0.0;
  EXPECT_EQ(part.to_double_vector(), want);
}

}  // namespace
}  // namespace flashinfer
