// The part of an op's declaration (include/flashinfer/op_typed.h, declare_key) that does not
// depend on the op's C++ types: its header fields, and its registration with its write plan.
#include <string>
#include <utility>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/op_typed.h"

namespace flashinfer::detail {

namespace {

// The (written, input) parameter indices of a declaration's same_view_as() or within() marks.
std::vector<std::pair<int, int>> written_input_pairs(
    const OpDecl& stored, const std::vector<std::pair<std::string, std::string>>& marks,
    const char* mark) {
  std::vector<std::pair<int, int>> out;
  for (const auto& [w, in] : marks) {
    const int wi = stored.param_index(w), ii = stored.param_index(in);
    FLASHINFER_CHECK(wi >= 0 && ii >= 0 && stored.params[static_cast<std::size_t>(wi)].mutated,
                     "declare", w, "op '", stored.name, "': ", mark,
                     " needs a written parameter and an existing input");
    out.emplace_back(wi, ii);
  }
  return out;
}

}  // namespace

OpDecl begin_decl(const OpSpec& spec, const char* default_returns, bool is_method) {
  OpDecl d;
  pending_same_view().clear();
  pending_inside().clear();
  d.name = spec.name;
  d.module = spec.module;
  d.summary = spec.summary ? spec.summary : "";
  d.returns = spec.returns ? spec.returns : default_returns;
  if (spec.var_positional) d.var_positional = spec.var_positional;
  if (spec.var_keyword) d.var_keyword = spec.var_keyword;
  d.unwritten_results = spec.unwritten_results;
  if (spec.unwritten_reason) d.unwritten_reason = spec.unwritten_reason;
  if (is_method) {
    const std::string name = spec.name;
    d.class_name = name.substr(0, name.rfind('.'));
    d.params.push_back(ParamDecl("self", ParamKind::kObject).type(d.class_name));
  }
  return d;
}

const OpDecl& finish_decl(OpRegistry& registry, OpDecl&& d, const OpDecl*& slot_decl,
                          std::atomic<const WritePlan*>& slot_plan,
                          const std::vector<const char*>* field_names) {
  const OpDecl& stored = registry.add(std::move(d));
  if (slot_decl) return stored;
  slot_decl = &stored;
  auto* plan = new WritePlan();  // one per op, for the life of the process
  plan->decl = &stored;
  for (const ParamDecl& p : stored.params) plan->any_written = plan->any_written || p.mutated;
  if (field_names) {
    for (const char* n : *field_names) plan->field_param.push_back(stored.param_index(n));
  }
  plan->same_view = written_input_pairs(stored, pending_same_view(), "same_view_as()");
  plan->inside = written_input_pairs(stored, pending_inside(), "within()");
  slot_plan.store(plan, std::memory_order_release);
  return stored;
}

}  // namespace flashinfer::detail
