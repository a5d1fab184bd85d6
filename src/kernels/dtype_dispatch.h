// Private: runtime DType -> compile-time element type, for the kernels of every backend (.cpp and
// .cu). A call site lists the dtypes it accepts and gets one instantiation per listed dtype:
//
//   dispatch_dtype<CpuElements, kFloat32, kFloat16, kBFloat16>(
//       p.dtype, "rmsnorm", "input", [&]<class T>() { return rmsnorm_rows<T>(p); });
//
// An unlisted dtype throws Error(kUnsupported) naming the op and the argument, with the file and
// line of the call site. visit_dtype takes the fallback as a callable instead (a different
// error, or a value). The element map is a parameter: CpuElements (below) for the CPU kernels,
// CudaElements (kernels/cuda/cuda_utils.cuh) for the CUDA ones, DTypeConstants where a kernel
// template takes the DType itself.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "flashinfer/dtype.h"
#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"

namespace flashinfer::kernels {

// Short names for the template argument lists of the call sites.
inline constexpr DType kFloat32 = DType::kFloat32;
inline constexpr DType kFloat16 = DType::kFloat16;
inline constexpr DType kBFloat16 = DType::kBFloat16;
inline constexpr DType kFloat64 = DType::kFloat64;
inline constexpr DType kFloat8E4M3FN = DType::kFloat8E4M3FN;
inline constexpr DType kFloat8E5M2 = DType::kFloat8E5M2;
inline constexpr DType kInt8 = DType::kInt8;
inline constexpr DType kUInt8 = DType::kUInt8;
inline constexpr DType kInt16 = DType::kInt16;
inline constexpr DType kInt32 = DType::kInt32;
inline constexpr DType kInt64 = DType::kInt64;

/// An element map gives `Map::type<D>` (void where D has no element type on that backend) and
/// `Map::kBackend`, the words that end "dtype ... is not supported on ".
template <DType D>
struct CpuElement {
  using type = void;
};
#define FLASHINFER_CPU_ELEMENT(D, T) \
  template <>                        \
  struct CpuElement<DType::D> {      \
    using type = T;                  \
  }
FLASHINFER_CPU_ELEMENT(kFloat32, float);
FLASHINFER_CPU_ELEMENT(kFloat64, double);
FLASHINFER_CPU_ELEMENT(kFloat16, Half);
FLASHINFER_CPU_ELEMENT(kBFloat16, BFloat16);
FLASHINFER_CPU_ELEMENT(kFloat8E4M3FN, Float8E4M3FN);
FLASHINFER_CPU_ELEMENT(kFloat8E5M2, Float8E5M2);
FLASHINFER_CPU_ELEMENT(kInt8, int8_t);
FLASHINFER_CPU_ELEMENT(kUInt8, uint8_t);
FLASHINFER_CPU_ELEMENT(kInt16, int16_t);
FLASHINFER_CPU_ELEMENT(kInt32, int32_t);
FLASHINFER_CPU_ELEMENT(kInt64, int64_t);
#undef FLASHINFER_CPU_ELEMENT

/// The CPU kernels' element types: float, double, the storage types of float_formats.h, ints.
struct CpuElements {
  template <DType D>
  using type = typename CpuElement<D>::type;
  static constexpr const char* kBackend = "the CPU";
};

/// `type<D>` is std::integral_constant<DType, D>: for kernel templates that take the DType.
struct DTypeConstants {
  template <DType D>
  using type = std::integral_constant<DType, D>;
};

namespace dispatch_detail {

template <class Map, class F, DType D, DType...>
struct VisitResult {
  using type = decltype(std::declval<F&>().template operator()<typename Map::template type<D>>());
};

template <class R, class Map, DType D, DType... kRest, class F, class Otherwise>
R visit_dtype_from(DType dtype, F& f, Otherwise& otherwise) {
  using T = typename Map::template type<D>;
  static_assert(!std::is_void_v<T>, "a listed dtype has no element type in this map");
  static_assert(std::is_same_v<decltype(f.template operator()<T>()), R>,
                "every listed dtype must give the same result type");
  if (dtype == D) return f.template operator()<T>();
  if constexpr (sizeof...(kRest) == 0) {
    return otherwise();
  } else {
    return visit_dtype_from<R, Map, kRest...>(dtype, f, otherwise);
  }
}

}  // namespace dispatch_detail

/// Calls `f.template operator()<Map::type<D>>()` for the listed D equal to `dtype` and returns
/// its result; calls `otherwise()` when `dtype` is not listed (it returns the same type, or
/// throws).
template <class Map, DType... kAccepted, class F, class Otherwise>
decltype(auto) visit_dtype(DType dtype, F&& f, Otherwise&& otherwise) {
  static_assert(sizeof...(kAccepted) > 0, "list at least one dtype");
  using R = typename dispatch_detail::VisitResult<Map, F, kAccepted...>::type;
  return dispatch_detail::visit_dtype_from<R, Map, kAccepted...>(dtype, f, otherwise);
}

/// visit_dtype whose fallback throws Error(kUnsupported, op, arg): "dtype torch.float64 is not
/// supported on the CPU", with the file and line of the caller (std::source_location is not in
/// clang 14 with libstdc++).
template <class Map, DType... kAccepted, class F>
decltype(auto) dispatch_dtype(DType dtype, const char* op, const char* arg, F&& f,
                              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  using R = typename dispatch_detail::VisitResult<Map, F, kAccepted...>::type;
  return visit_dtype<Map, kAccepted...>(dtype, f, [&]() -> R {
    ::flashinfer::detail::fail(ErrorCode::kUnsupported, file, line, op, arg, "dtype ",
                               dtype_torch_name(dtype), " is not supported on ", Map::kBackend);
  });
}

}  // namespace flashinfer::kernels
