// Private: moving a view to another device without losing its layout.
#pragma once

#include "core/strided.h"
#include "flashinfer/tensor.h"

namespace flashinfer::detail {

/// A copy of `t` on `device` with the same shape, strides and offset-within-span: only the
/// storage span the view covers is copied (the recorder stages inputs this way, replay moves
/// recorded tensors to the replay device this way). `t` itself when already there.
inline Tensor to_device_keep_layout(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  if (t.numel() == 0) return Tensor::empty(t.shape(), t.dtype(), device);
  const auto [begin, end] = covered_span(t.shape(), t.strides(), t.storage_offset());
  Tensor span = Tensor::from_storage(t.storage(), {end - begin}, {1}, begin, t.dtype());
  return span.to(device).as_strided(t.shape(), t.strides(), 0);
}

}  // namespace flashinfer::detail
