// Trace templates: a flashinfer-bench *definition* (JSON) for a call of a public op, as upstream
// FlashInfer's fi_trace writes them (docs/TRACE.md). An op has a template when its annotation
// (src/trace/templates.cpp) says which of its dimensions are variable axes and which constants;
// the definition's name is the template's prefix plus each constant axis ("rmsnorm_h4096",
// "gqa_paged_decode_h32_kv8_d128_ps16").
//
// FLASHINFER_TRACE_DUMP=1 writes one definition per distinct (op, constant axes) seen into
// FLASHINFER_TRACE_DUMP_DIR (default ./fi_trace_out), and `flashinfer trace` writes one for a
// shape without running anything.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/value.h"

namespace flashinfer::trace {

/// Names of the ops (as declared: "rmsnorm", "BatchDecodeWithPagedKVCacheWrapper.run") that have
/// a trace template, sorted.
std::vector<std::string> traced_ops();

/// The definition (JSON text, json.dumps(indent=2) layout) of a call of `decl` with `args`
/// aligned with its parameters, or nullopt when the op has no template.
std::optional<std::string> definition_for_call(const OpDecl& decl, std::span<const Value> args);

/// The definition's name alone (what a dump file is called, less ".json"), or nullopt.
std::optional<std::string> definition_name_for_call(const OpDecl& decl,
                                                    std::span<const Value> args);

/// A definition built without running anything: the op's template with the given axis values
/// (axis name -> value; a constant axis without a value is an error, a variable one defaults to
/// 1) and `dtype` for every floating input whose dtype the template does not fix. Throws
/// flashinfer::Error (kInvalidArgument) naming the op and the missing axis, or when `op` has no
/// template.
std::string definition_for_axes(std::string_view op, const std::map<std::string, int64_t>& axes,
                                DType dtype = DType::kBFloat16);

/// The axes of `op`'s template in order, each with whether it is constant.
struct AxisInfo {
  std::string name;
  bool is_const = false;
};
std::vector<AxisInfo> template_axes(std::string_view op);

/// Installs the dump observer (what FLASHINFER_TRACE_DUMP=1 does at load): every observed call
/// of a traced op writes `<dir>/<name>.json` once per process and name. Replaces a running one.
void start_dump(std::string dir);
/// Removes it; returns how many definitions it wrote.
int64_t stop_dump();
bool dump_active();

}  // namespace flashinfer::trace
