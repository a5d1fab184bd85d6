// Private: the trace-template machinery behind flashinfer/trace.h. A template annotates one
// declared op: its axes (variable or constant, with the abbreviation its definition name uses),
// its inputs and outputs (shape by axis names, where each comes from among the op's parameters)
// and our own PyTorch `reference` / `init` snippets. The table of templates is
// src/trace/templates.cpp, one entry per op, found by the op's declared name.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "flashinfer/dtype.h"

namespace flashinfer::trace::detail {

struct Axis {
  std::string name{};
  bool is_const = false;
  // Prefix in the definition name: nullopt uses the axis name, "" leaves the axis out.
  std::optional<std::string> abbrev{};
  std::string description{};
  std::optional<int64_t> value{};  // a constant fixed by the template itself
  int64_t init_value = 4;          // a variable axis's default in the init snippet
};

/// One input or output of a definition.
struct Io {
  std::string key{};                // the JSON name ("hidden_states")
  std::vector<std::string> dims{};  // axis names; unused for a scalar
  bool scalar = false;              // a non-tensor: "shape": null
  std::string param{};              // the op parameter holding it (empty: same as key)
  int tuple_idx = -1;               // index into a tuple parameter (paged_kv_cache's k, v)
  std::string dtype{};              // fixed dtype (outputs; optional inputs; scalars)
  std::string dtype_from{};         // outputs: the dtype of this parameter's tensor
  bool optional = false;
  std::string description{};
  std::string out_param{};  // outputs: the parameter written in place ("param" in the JSON)
  // `flashinfer trace` builds a call from axis values: the dtype to give this input there
  // (empty: the --dtype given for activations). Index arrays say "int32".
  std::string synth_dtype{};
  // The init snippet's Python expression building this input (may use the axis names, earlier
  // inputs, `device`, and {dtype:<key>} for an input's resolved torch dtype); empty: random data
  // of its shape and dtype (optional inputs are left out).
  std::string init_expr{};
  // Not a parameter of this op: given to an earlier call (the wrappers' plan()), so absent from
  // the call's arguments (such inputs are optional, their dtype "unknown").
  bool from_plan = false;

  Io& from(std::string p) {
    param = std::move(p);
    return *this;
  }
  Io& item(int i) {
    tuple_idx = i;
    return *this;
  }
  Io& dt(std::string d) {
    dtype = std::move(d);
    return *this;
  }
  Io& like(std::string p) {
    dtype_from = std::move(p);
    return *this;
  }
  Io& opt() {
    optional = true;
    return *this;
  }
  Io& desc(std::string d) {
    description = std::move(d);
    return *this;
  }
  Io& writes(std::string p) {
    out_param = std::move(p);
    return *this;
  }
  Io& synth(std::string d) {
    synth_dtype = std::move(d);
    return *this;
  }
  Io& plan() {
    from_plan = true;
    optional = true;
    return *this;
  }
  Io& init(std::string e) {
    init_expr = std::move(e);
    return *this;
  }
  const std::string& source() const { return param.empty() ? key : param; }
};

/// A dimension name in a shape that is not an axis of the definition: upstream's templates write
/// such names (gemm_fp8's "K_div_block_size", gemm_mxfp8's "K_div_32") without declaring them.
/// They never take part in naming or axis values; `flashinfer trace` and the init snippet size
/// them as `of // by_axis` (another axis), `of // by`, or the fixed `by` when `of` is empty.
struct Derived {
  std::string name{};
  std::string of{};
  std::string by_axis{};
  int64_t by = 1;
  // > 0: `of * times` instead (upstream's "N_mul_2").
  int64_t times = 0;
};

struct Template {
  std::string op{};       // declared op name: "rmsnorm", "BatchDecodeWithPagedKVCacheWrapper.run"
  std::string op_type{};  // "rmsnorm", "gqa_paged", ...
  std::string name_prefix{};  // "rmsnorm", "gqa_paged_decode"
  std::string description{};
  std::vector<Axis> axes{};
  std::vector<Io> inputs{};
  std::vector<Io> outputs{};
  std::vector<std::string> constraints{};
  std::vector<Derived> derived{};   // shape names that are not axes
  std::vector<std::string> tags{};  // after the fi_api tag: "status:verified", "fused", ...
  // Python source defining run(<input keys>); `{axis:NAME}` stands for that axis's value.
  std::string reference{};
  // Several templates for one op (upstream's trace dispatch, e.g. one per MoE
  // routing_method_type): this one applies when the integer argument `select_param` is one of
  // `select_values` (an absent argument counts as `select_default`). Empty: the op's only one.
  std::string select_param{};
  std::vector<int64_t> select_values{};
  int64_t select_default = 0;
  // And only when this integer argument is > 0 (None = 0): upstream's shared-experts sibling of
  // the DeepSeek-V3 MoE template. Such a template comes before its plain sibling in the table.
  std::string positive_param{};
  // Or selected by a string argument (upstream's mm_bf16_fp4 `backend`, nvfp4_kv_dequantize_
  // paged `kv_layout`): this one applies when `select_param` is one of `select_strings` (an
  // absent argument counts as `select_string_default`).
  std::vector<std::string> select_strings{};
  std::string select_string_default{};
  // And only when each of these integer arguments is one of its values (absent or None: the
  // first). Upstream's template models only those calls (the NVFP4 MoE: no shared experts,
  // SwiGLU); a call outside them gets no definition rather than one that misnames it.
  struct OnlyWhen {
    std::string param;
    std::vector<int64_t> values;
  };
  std::vector<OnlyWhen> only_when{};
};

/// The table (src/trace/templates.cpp): built once, never destroyed.
const std::vector<Template>& templates();
/// The op's first template (its only one unless it has selected variants).
const Template* find_template(std::string_view op);
/// Every template of the op, in table order.
std::vector<const Template*> templates_of(std::string_view op);
/// The derived shape name `name` of `t`, or nullptr.
const Derived* find_derived(const Template& t, std::string_view name);

/// An argument as templates see it: a tensor's shape and dtype, a tuple, a number, or nothing.
struct Arg {
  enum class Kind { kNone, kTensor, kTuple, kInt, kFloat, kString, kOther } kind = Kind::kNone;
  std::vector<int64_t> shape{};
  std::string dtype{};
  std::vector<Arg> items{};
  int64_t i = 0;
  std::string s{};  // kString
};
using Args = std::map<std::string, Arg, std::less<>>;

/// The op's template for a call with `args` (its selector matching), or nullptr when none
/// applies (upstream writes nothing then, e.g. routing_method_type Unspecified).
const Template* find_template(std::string_view op, const Args& args);

/// Builds the definition (an ordered JSON document's text) from `args` by parameter name; the
/// fi_api tag is `fi_api`. `name_out` receives the definition name.
std::string render(const Template& t, const Args& args, const std::string& fi_api,
                   std::string* name_out);
std::string definition_name(const Template& t, const Args& args);

/// `definition_for_axes` for one given template of `op` (a string-selected one, which axis values
/// cannot name).
std::string definition_for_template_axes(std::string_view op, const Template& t,
                                         const std::map<std::string, int64_t>& axes, DType dtype);

}  // namespace flashinfer::trace::detail
