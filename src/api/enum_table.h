#pragma once
// One table per upstream Python enum (ActivationType, RoutingMethodType, SfLayout, ...): the
// member names as upstream spells them and their integer values. Recorded arguments come back as
// an EnumValue ("ActivationType.Swiglu" from upstream's recorder, "Swiglu" from ours) or as a
// bare int, and every enum reads them the same way.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "flashinfer/error.h"
#include "flashinfer/value.h"

namespace flashinfer::api {

template <class E>
struct EnumMember {
  E value;
  std::string_view name;
};

template <class E, std::size_t N>
struct EnumTable {
  std::string_view type_name;
  std::array<EnumMember<E>, N> members;

  // Out-of-range casts fall back to the first member's name rather than reading past the table.
  constexpr std::string_view name_of(E e) const {
    for (const auto& m : members) {
      if (m.value == e) return m.name;
    }
    return members[0].name;
  }

  Value to_value(E e) const {
    return Value(EnumValue{std::string(type_name), std::string(name_of(e)),
                           std::to_string(static_cast<int64_t>(e))});
  }

  // `unknown_name` is the error code for a well-formed member name this table lacks: kUnsupported
  // where upstream has members we do not implement, kInvalidArgument otherwise. With
  // `match_value`, a member whose name differs is still found by its recorded integer value.
  E from_value(const Value& v, std::string_view op, std::string_view arg,
               ErrorCode unknown_name = ErrorCode::kInvalidArgument,
               bool match_value = false) const {
    if (v.kind() == Value::Kind::kInt) {
      for (const auto& m : members) {
        if (static_cast<int64_t>(m.value) == v.as_int()) return m.value;
      }
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, arg, "no ", type_name, " member has value ",
                      v.as_int());
    }
    FLASHINFER_CHECK(v.kind() == Value::Kind::kEnum, op, arg, "expected a member of ", type_name,
                     " or an int, got ", v.repr());
    const EnumValue& e = v.as_enum();
    std::string_view name = e.name;
    if (const auto dot = name.rfind('.'); dot != std::string_view::npos) {
      name = name.substr(dot + 1);
    }
    for (const auto& m : members) {
      if (name == m.name) return m.value;
      if (match_value && e.value == std::to_string(static_cast<int64_t>(m.value))) return m.value;
    }
    FLASHINFER_FAIL(unknown_name, op, arg, type_name, " member ", e.name,
                    unknown_name == ErrorCode::kUnsupported ? " is not supported by flashinfer-cpp"
                                                            : " is unknown");
  }
};

}  // namespace flashinfer::api
