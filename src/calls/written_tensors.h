// Private: the tensors a call writes, by its declaration's .mut() marks: a written parameter's
// tensor, or each tensor item of a written sequence (a (K, V) cache pair). One walk for the
// recorder's mutated side (recorder/record_json.cpp), the ring's written storages
// (recorder/ring.cpp) and `flashinfer bench`'s outputs (api/bench_support.cpp).
#pragma once

#include <cstddef>
#include <span>

#include "flashinfer/op_decl.h"

namespace flashinfer::detail {

/// Calls fn(param, item, tensor) for each tensor `args` passes to a written parameter of `decl`
/// (item: -1 for the parameter's own tensor, else the index in its sequence), in order.
template <typename Fn>
void for_each_written_tensor(const OpDecl& decl, std::span<const Value> args, Fn&& fn) {
  for (std::size_t i = 0; i < args.size() && i < decl.params.size(); ++i) {
    if (!decl.params[i].mutated) continue;
    if (args[i].is_tensor()) {
      fn(i, -1, args[i].as_tensor());
    } else if (args[i].is_sequence()) {
      const auto& items = args[i].items();
      for (std::size_t j = 0; j < items.size(); ++j) {
        if (items[j].is_tensor()) fn(i, static_cast<int>(j), items[j].as_tensor());
      }
    }
  }
}

}  // namespace flashinfer::detail
