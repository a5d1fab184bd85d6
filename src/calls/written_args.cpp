// The gate's written-argument check (include/flashinfer/op_typed.h, call_op): one check, derived
// from the declarations' .mut() marks, for every op.
#include <cstdint>
#include <string>
#include <vector>

#include "core/strided.h"
#include "core/view_overlap.h"
#include "flashinfer/error.h"
#include "flashinfer/op_typed.h"

namespace flashinfer::detail {

namespace {

std::string arg_name(const OpDecl& decl, const CallTensor& c) {
  std::string s = decl.params[static_cast<std::size_t>(c.param)].name;
  if (c.item >= 0) s += "[" + std::to_string(c.item) + "]";
  return s;
}

}  // namespace

void check_written_tensors(const WritePlan& plan, const CallTensor* tensors, std::size_t n) {
  const OpDecl& decl = *plan.decl;
  // Written tensor i is exactly input j, where the declaration allows that (same_view_as).
  auto allowed_same_view = [&](std::size_t i, std::size_t j) {
    const Tensor& a = *tensors[i].tensor;
    const Tensor& b = *tensors[j].tensor;
    for (const auto& [w, in] : plan.same_view) {
      if (w == tensors[i].param && in == tensors[j].param && a.data_ptr() == b.data_ptr() &&
          a.shape() == b.shape() && a.strides() == b.strides() && a.dtype() == b.dtype() &&
          a.device() == b.device()) {
        return true;
      }
    }
    return false;
  };
  // Written tensor i lies inside input j's span of one storage, where the declaration allows
  // that (within()).
  auto allowed_inside = [&](std::size_t i, std::size_t j) {
    const Tensor& a = *tensors[i].tensor;
    const Tensor& b = *tensors[j].tensor;
    for (const auto& [w, in] : plan.inside) {
      if (w != tensors[i].param || in != tensors[j].param || a.storage() != b.storage()) continue;
      // Byte ranges: the two may differ in dtype (int32 ids in a uint8 workspace).
      const auto [a0, a1] = covered_span(a.shape(), a.strides(), a.storage_offset());
      const auto [b0, b1] = covered_span(b.shape(), b.strides(), b.storage_offset());
      const auto ea = static_cast<int64_t>(a.element_size());
      const auto eb = static_cast<int64_t>(b.element_size());
      if (a0 * ea >= b0 * eb && a1 * ea <= b1 * eb) return true;
    }
    return false;
  };
  auto written = [&](std::size_t i) {
    return decl.params[static_cast<std::size_t>(tensors[i].param)].mutated;
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (!written(i)) continue;
    const Tensor& w = *tensors[i].tensor;
    if (const int64_t d = broadcast_dim(w); d >= 0) {
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, decl.name, arg_name(decl, tensors[i]),
                      "is written but has stride 0 in dimension ", d,
                      " (a broadcast view: several of its elements are one memory location)");
    }
    for (std::size_t j = 0; j < n; ++j) {
      // Two written tensors are compared once, and the error names the later one.
      if (j == i || (j > i && written(j))) continue;
      if (!views_overlap(w, *tensors[j].tensor) || allowed_same_view(i, j) ||
          allowed_inside(i, j)) {
        continue;
      }
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, decl.name, arg_name(decl, tensors[i]),
                      "is written and must not overlap ", written(j) ? "the written " : "",
                      "argument '", arg_name(decl, tensors[j]), "' in memory (", w.describe(),
                      " at ", w.data_ptr(), "; ", tensors[j].tensor->describe(), " at ",
                      tensors[j].tensor->data_ptr(), ")");
    }
  }
}

void check_api_written(const OpDecl& decl, const CallTensor* tensors, std::size_t n) {
  WritePlan plan;
  plan.decl = &decl;
  plan.any_written = true;
  // A caller may pass fewer arguments than declared, never more; anything beyond is ignored.
  std::vector<CallTensor> known;
  known.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    if (tensors[i].param >= 0 && static_cast<std::size_t>(tensors[i].param) < decl.params.size())
      known.push_back(tensors[i]);
  check_written_tensors(plan, known.data(), known.size());
}

}  // namespace flashinfer::detail
