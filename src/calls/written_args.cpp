// The gate's written-argument check (include/flashinfer/op_typed.h, call_op): one check, derived
// from the declarations' .mut() marks, for every op.
#include <string>

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

void check_written_tensors(const OpDecl& decl, const CallTensor* tensors, std::size_t n) {
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
      if (!views_overlap(w, *tensors[j].tensor)) continue;
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, decl.name, arg_name(decl, tensors[i]),
                      "is written and must not overlap ", written(j) ? "the written " : "",
                      "argument '", arg_name(decl, tensors[j]), "' in memory (", w.describe(),
                      " at ", w.data_ptr(), "; ", tensors[j].tensor->describe(), " at ",
                      tensors[j].tensor->data_ptr(), ")");
    }
  }
}

}  // namespace flashinfer::detail
