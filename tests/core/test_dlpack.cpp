// DLPack export/import: zero copy, strides and offsets kept, ownership handed over.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include "flashinfer/flashinfer.h"

namespace flashinfer {
namespace {

TEST(DLPack, RoundTripIsZeroCopyAndKeepsLayout) {
  Tensor base =
      Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4}, DType::kBFloat16);
  Tensor view = base.transpose(0, 1).slice(0, 1, 3);  // [2, 3], strides [1, 4], offset 1
  DLManagedTensor* m = to_dlpack(view);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.shape[0], 2);
  EXPECT_EQ(m->dl_tensor.shape[1], 3);
  EXPECT_EQ(m->dl_tensor.strides[0], 1);
  EXPECT_EQ(m->dl_tensor.strides[1], 4);
  EXPECT_EQ(m->dl_tensor.byte_offset, 2u);  // one bf16 element
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLBfloat);
  EXPECT_EQ(m->dl_tensor.dtype.bits, 16);
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCPU);
  EXPECT_EQ(m->dl_tensor.data, base.storage()->data());
  Tensor back = from_dlpack(m);
  EXPECT_EQ(back.shape(), view.shape());
  EXPECT_EQ(back.strides(), view.strides());
  EXPECT_EQ(back.data_ptr(), view.data_ptr());
  EXPECT_EQ(back.dtype(), DType::kBFloat16);
  EXPECT_EQ(back.to_double_vector(), view.to_double_vector());
  back.fill_(-2.0);  // shared memory: the original sees it
  EXPECT_EQ(base.to_double_vector()[1], -2.0);
}

TEST(DLPack, ExportOutlivesTheTensorAndDeleterRunsOnce) {
  DLManagedTensor* m = nullptr;
  {
    Tensor t = Tensor::full({5}, 3.0, DType::kInt32);
    m = to_dlpack(t);
  }
  EXPECT_EQ(static_cast<int32_t*>(m->dl_tensor.data)[4], 3);
  {
    Tensor imported = from_dlpack(m);
    Tensor copy = imported;
    EXPECT_EQ(copy.to_double_vector(), (std::vector<double>{3, 3, 3, 3, 3}));
  }  // deleter ran here; ASan would flag a double free or a leak
}

TEST(DLPack, AllDTypesRoundTrip) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto d = static_cast<DType>(i);
    Tensor t = Tensor::zeros({2, 2}, d);
    Tensor back = from_dlpack(to_dlpack(t));
    EXPECT_EQ(back.dtype(), d) << dtype_name(d);
    EXPECT_EQ(back.data_ptr(), t.data_ptr());
  }
}

struct Foreign {
  float data[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  DLManagedTensor managed{};
  static int deleted;
};
int Foreign::deleted = 0;

void foreign_deleter(DLManagedTensor* self) {
  ++Foreign::deleted;
  delete static_cast<Foreign*>(self->manager_ctx);
}

TEST(DLPack, ImportsForeignTensorsAndRejectsUnknownTypes) {
  auto* f = new Foreign();
  f->managed.dl_tensor = {f->data, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, f->shape, nullptr, 0};
  f->managed.manager_ctx = f;
  f->managed.deleter = foreign_deleter;
  Foreign::deleted = 0;
  {
    Tensor t = from_dlpack(&f->managed);  // null strides mean row-major
    EXPECT_EQ(t.strides(), (Shape{3, 1}));
    EXPECT_EQ(t.to_double_vector(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  }
  EXPECT_EQ(Foreign::deleted, 1);

  auto* g = new Foreign();
  g->managed.dl_tensor = {g->data, {kDLCPU, 0}, 2, {kDLComplex, 64, 1}, g->shape, nullptr, 0};
  g->managed.manager_ctx = g;
  g->managed.deleter = foreign_deleter;
  Foreign::deleted = 0;
  EXPECT_THROW(from_dlpack(&g->managed), Error);
  EXPECT_EQ(Foreign::deleted, 1);  // ownership was taken even though the import failed
  EXPECT_THROW(from_dlpack(nullptr), Error);
}

}  // namespace
}  // namespace flashinfer
