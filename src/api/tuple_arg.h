// Private: the ArgTraits of a fixed-size Python tuple parameter (upstream's
// scale_granularity_mnk=(1, 128, 128)), for the ops that take one. Kept out of
// flashinfer/op_typed.h so that only those ops' files see it.
#pragma once

#include <cstddef>
#include <tuple>
#include <utility>

#include "flashinfer/op_typed.h"

namespace flashinfer {

/// A list or tuple of exactly sizeof...(T) items, each rebuilt with its own traits.
template <class... T>
struct ArgTraits<std::tuple<T...>> {
  static constexpr ParamKind kind = ParamKind::kList;
  static std::tuple<T...> get(const CallArgs& a, std::size_t i) {
    FLASHINFER_CHECK(a[i].is_sequence() && a[i].items().size() == sizeof...(T), a.decl().name,
                     a.decl().params.at(i).name, "expected a tuple of ", sizeof...(T),
                     " items, got ", value_kind_name(a[i].kind()));
    OpDecl one;
    one.name = a.decl().name;
    one.params = {a.decl().params.at(i)};
    return items(a[i], one, std::index_sequence_for<T...>{});
  }

 private:
  template <std::size_t... I>
  static std::tuple<T...> items(const Value& v, const OpDecl& one, std::index_sequence<I...>) {
    return std::tuple<T...>{ArgTraits<T>::get(CallArgs(one, {v.items()[I]}), 0)...};
  }
};

}  // namespace flashinfer
