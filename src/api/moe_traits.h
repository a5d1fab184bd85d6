// Private: how the MoE argument types are rebuilt from recorded Values (shared by moe.cpp and
// moe_quant.cpp, so each specialization is defined once).
#pragma once

#include "flashinfer/op_typed.h"
#include "flashinfer/ops/moe.h"
#include "flashinfer/ops/moe_quant.h"

namespace flashinfer {

template <>
struct ArgTraits<WeightLayout> {
  static constexpr ParamKind kind = ParamKind::kEnum;
  static constexpr const char* type_name = "WeightLayout";
  static WeightLayout get(const CallArgs& a, std::size_t i) {
    return weight_layout_from_value(a[i], a.decl().name,
                                    i < a.decl().params.size() ? a.decl().params[i].name : "");
  }
};
template <>
struct ArgTraits<MoeTopkIds> {
  static constexpr ParamKind kind = ParamKind::kAny;
  static MoeTopkIds get(const CallArgs& a, std::size_t i) {
    const Value& v = a[i];
    if (v.is_tensor()) return MoeTopkIds(v.as_tensor());
    FLASHINFER_CHECK(v.is_sequence() && v.items().size() == 2 && v.items()[0].is_tensor() &&
                         v.items()[1].is_tensor(),
                     a.decl().name, a.decl().params.at(i).name,
                     "expected a packed tensor or a (topk_ids, topk_weights) pair, got ", v.repr());
    return MoeTopkIds(v.items()[0].as_tensor(), v.items()[1].as_tensor());
  }
};
template <>
struct ArgTraits<Fp8QuantizationType> {
  static constexpr ParamKind kind = ParamKind::kEnum;
  static constexpr const char* type_name = "Fp8QuantizationType";
  static Fp8QuantizationType get(const CallArgs& a, std::size_t i) {
    return fp8_quantization_type_from_value(
        a[i], a.decl().name, i < a.decl().params.size() ? a.decl().params[i].name : "");
  }
};

}  // namespace flashinfer
