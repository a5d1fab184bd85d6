// Private: how the library's own argument types are rebuilt from recorded Values (the ArgTraits
// customization point of flashinfer/op_typed.h) and named in list-ops (ReturnName).
#pragma once

#include <cstdint>

#include "flashinfer/op_typed.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/ops/page.h"
#include "flashinfer/ops/quantization.h"
#include "flashinfer/ops/sampling.h"

namespace flashinfer {

/// A paged cache: a 5-D tensor, or a (k_cache, v_cache) pair (recorded as a tuple).
template <>
struct ArgTraits<PagedKVCache> {
  static constexpr ParamKind kind = ParamKind::kAny;
  static PagedKVCache get(const CallArgs& a, std::size_t i) {
    FLASHINFER_CHECK(
        a[i].is_tensor() || (a[i].is_sequence() && a[i].items().size() == 2 &&
                             a[i].items()[0].is_tensor() && a[i].items()[1].is_tensor()),
        a.decl().name, a.decl().params.at(i).name,
        "expected a tensor or a (k_cache, v_cache) pair, got ", a[i].repr());
    return PagedKVCache::from_value(a[i]);
  }
};

/// Upstream's Union[Tensor, int] / Union[Tensor, float].
template <class T>
struct ArgTraits<ScalarOrTensor<T>> {
  static constexpr ParamKind kind = ParamKind::kAny;
  static ScalarOrTensor<T> get(const CallArgs& a, std::size_t i) {
    if (a[i].is_tensor()) return ScalarOrTensor<T>(a[i].as_tensor());
    if constexpr (std::is_integral_v<T>) {
      return ScalarOrTensor<T>(a.i64(i));
    } else {
      return ScalarOrTensor<T>(a.f64(i));
    }
  }
};

/// Recorded as upstream's enum member (or its integer value).
SfLayout sf_layout_from_value(const Value& v);
template <>
struct ArgTraits<SfLayout> {
  static constexpr ParamKind kind = ParamKind::kEnum;
  static constexpr const char* type_name = "SfLayout";
  static SfLayout get(const CallArgs& a, std::size_t i) { return sf_layout_from_value(a[i]); }
};

template <>
struct ReturnName<AttentionOutput> {
  static constexpr const char* value = "Tensor | tuple[Tensor, Tensor]";
};
template <>
struct ReturnName<Nvfp4QuantizeResult> {
  static constexpr const char* value = "tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]";
};
template <>
struct ReturnName<CudnnPrefillResult> {
  static constexpr const char* value = "tuple[Tensor, Tensor | None]";
};
template <>
struct ReturnName<WorkspaceSizes> {
  static constexpr const char* value = "tuple[int, int]";
};
template <>
struct ReturnName<SamplingResult> {
  static constexpr const char* value = "Tensor | tuple[Tensor, Tensor]";
};

}  // namespace flashinfer
