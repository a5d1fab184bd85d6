// Trace templates: from a call's arguments (or from axis values alone) to a flashinfer-bench
// definition. The rules follow upstream's fi_trace (flashinfer/trace/template.py): how each axis
// finds its value, how input and output dtypes resolve, how the name is formed and the key order
// of the JSON. docs/TRACE.md lists them.
#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "flashinfer/error.h"
#include "flashinfer/trace.h"
#include "trace/trace_template.h"

namespace flashinfer::trace {

namespace detail {

namespace {

using Json = nlohmann::ordered_json;

// The tensor a descriptor points at: the parameter, or one item of a tuple parameter. A paged
// cache given as one combined tensor [num_pages, 2, ...] (NHD) stands for its (k, v) pair: item i
// is its slice [:, i] (upstream finds no tensor there and leaves the cache's axes unresolved),
// and where a template names the cache as one 4-D tensor, the combined one has the dims of a
// half (upstream would read the 2 as page_size).
std::optional<Arg> tensor_of(const Args& args, const std::string& param, int tuple_idx,
                             std::size_t rank = 0) {
  auto it = args.find(param);
  if (it == args.end()) return std::nullopt;
  const Arg* a = &it->second;
  // Page size 1 without its axis (the forms upstream's _unpack_paged_kv_cache takes: a pair of
  // 3-D [tokens, H, D] caches, or one [tokens, 2, H, D] tensor) where the template names a 4-D
  // cache: page_size 1 goes in, so the heads and head dim land on their axes.
  const auto page_axis_of_one = [rank](Arg t) {
    if (rank == 4 && t.shape.size() == 3) t.shape.insert(t.shape.begin() + 1, 1);
    return t;
  };
  if (tuple_idx >= 0) {
    if (a->kind == Arg::Kind::kTensor &&
        (a->shape.size() == 5 || (a->shape.size() == 4 && rank == 4)) && a->shape[1] == 2) {
      Arg half = *a;
      half.shape.erase(half.shape.begin() + 1);
      return page_axis_of_one(half);
    }
    if (a->kind != Arg::Kind::kTuple || static_cast<int>(a->items.size()) <= tuple_idx) {
      return std::nullopt;
    }
    a = &a->items[static_cast<std::size_t>(tuple_idx)];
  }
  if (a->kind != Arg::Kind::kTensor) return std::nullopt;
  if (rank == 4 && a->shape.size() == 5 && a->shape[1] == 2) {
    // The whole combined cache where the template names one [num_pages, page_size, ...] cache
    // (append_paged_kv_cache): its dims are those of either half.
    Arg half = *a;
    half.shape.erase(half.shape.begin() + 1);
    return half;
  }
  return page_axis_of_one(*a);
}

std::optional<int64_t> scalar_of(const Args& args, const std::string& name) {
  auto it = args.find(name);
  if (it == args.end()) return std::nullopt;
  if (it->second.kind == Arg::Kind::kInt || it->second.kind == Arg::Kind::kFloat) {
    return it->second.i;  // Python's int(): a float truncates (kept in `i` when converted)
  }
  return std::nullopt;
}

std::optional<int64_t> dim_of(const Args& args, const Io& io, const std::string& axis) {
  const auto t = tensor_of(args, io.source(), io.tuple_idx, io.dims.size());
  if (!t) return std::nullopt;
  std::size_t d = 0;
  while (d < io.dims.size() && io.dims[d] != axis) ++d;
  if (d >= t->shape.size()) return std::nullopt;
  return t->shape[d];
}

bool has_dim(const Io& io, const std::string& axis) {
  for (const auto& d : io.dims) {
    if (d == axis) return true;
  }
  return false;
}

// Upstream's order of sources for an axis: a value fixed by the template; the first required
// tensor input carrying the axis; a scalar input named after it; the first optional tensor
// carrying it; a scalar argument of the axis's name. The first source found is the only one
// read, even when its tensor is absent from this call.
std::optional<int64_t> axis_value(const Template& t, const Axis& axis, const Args& args) {
  if (axis.is_const && axis.value) return axis.value;
  for (bool allow_optional : {false, true}) {
    if (allow_optional) {
      for (const Io& io : t.inputs) {
        if (io.scalar && io.key == axis.name) return scalar_of(args, io.source());
      }
    }
    for (const Io& io : t.inputs) {
      if (io.scalar || (io.optional && !allow_optional) || !has_dim(io, axis.name)) continue;
      return dim_of(args, io, axis.name);
    }
  }
  return scalar_of(args, axis.name);
}

std::map<std::string, int64_t> axis_values(const Template& t, const Args& args) {
  std::map<std::string, int64_t> v;
  for (const Axis& a : t.axes) {
    if (auto x = axis_value(t, a, args)) v[a.name] = *x;
  }
  return v;
}

std::string name_from(const Template& t, const std::map<std::string, int64_t>& values) {
  std::string name = t.name_prefix.empty() ? t.op_type : t.name_prefix;
  for (const Axis& a : t.axes) {
    if (!a.is_const) continue;
    auto it = values.find(a.name);
    if (it == values.end()) continue;
    const std::string& pfx = a.abbrev ? *a.abbrev : a.name;
    if (pfx.empty()) continue;
    name += "_" + pfx + std::to_string(it->second);
  }
  return name;
}

std::string input_dtype(const Io& io, const Args& args) {
  if (io.scalar) return io.dtype;
  if (const auto a = tensor_of(args, io.source(), io.tuple_idx, io.dims.size())) return a->dtype;
  if (io.optional && !io.dtype.empty()) return io.dtype;
  return "unknown";
}

std::string output_dtype(const Template& t, const Io& io, const Args& args) {
  if (io.scalar) return io.dtype;
  if (!io.dtype_from.empty()) {
    if (const auto a = tensor_of(args, io.dtype_from, -1)) return a->dtype;
    return io.dtype.empty() ? "unknown" : io.dtype;
  }
  if (!io.dtype.empty()) return io.dtype;
  // Otherwise the first present input tensor sharing an axis with this output.
  for (const Io& in : t.inputs) {
    if (in.scalar) continue;
    bool shares = false;
    for (const auto& d : io.dims) shares = shares || has_dim(in, d);
    if (!shares) continue;
    if (const auto a = tensor_of(args, in.source(), in.tuple_idx, in.dims.size())) {
      return a->dtype;
    }
  }
  return "unknown";
}

Json shape_json(const Io& io) {
  if (io.scalar) return nullptr;
  Json s = Json::array();
  for (const auto& d : io.dims) s.push_back(d);
  return s;
}

std::string torch_dtype(const std::string& d) {
  if (d == "unknown" || d.empty()) return "torch.float32";
  // torch < 2.1 has no float8 dtypes: such inputs fall back to float32 there.
  if (d.rfind("float8", 0) == 0) return "getattr(torch, \"" + d + "\", torch.float32)";
  return "torch." + d;
}

// The generic init: each var axis a keyword (small default), each const axis baked in, each
// input built from its init expression (or random data of its shape and resolved dtype).
std::string generic_init(const Template& t, const std::map<std::string, int64_t>& values,
                         const Json& inputs) {
  std::ostringstream o;
  o << "import math\nimport torch\n\n\ndef init(*";
  for (const Axis& a : t.axes) {
    if (!a.is_const) o << ", " << a.name << "=" << a.init_value;
  }
  o << ", device=\"cpu\", seed=0):\n    torch.manual_seed(seed)\n";
  for (const Axis& a : t.axes) {
    if (!a.is_const) continue;
    auto it = values.find(a.name);
    o << "    " << a.name << " = " << (it == values.end() ? 1 : it->second) << "\n";
  }
  // Shape names that are not axes (upstream's derived names), sized from the axes above.
  for (const Derived& d : t.derived) {
    // A number used as a shape name (upstream's "1") needs no definition.
    if (d.name.find_first_not_of("0123456789") == std::string::npos) continue;
    o << "    " << d.name << " = ";
    if (d.of.empty()) {
      o << d.by << "\n";
    } else if (d.times > 0) {
      o << d.of << " * " << d.times << "\n";
    } else {
      o << d.of << " // " << (d.by_axis.empty() ? std::to_string(d.by) : d.by_axis) << "\n";
    }
  }
  std::vector<std::string> keys;
  for (const Io& io : t.inputs) {
    const std::string dt = inputs[io.key]["dtype"].get<std::string>();
    std::string expr = io.init_expr;
    if (expr.empty()) {
      if (io.optional) continue;  // run() takes None
      if (io.scalar) {
        expr = io.dtype.rfind("int", 0) == 0 ? "1" : "1.0";
      } else {
        std::string shape;
        for (const auto& d : io.dims) shape += d + ", ";
        const std::string tdt = torch_dtype(dt != "unknown" ? dt : io.synth_dtype);
        const bool integral = tdt.find("int") != std::string::npos || tdt == "torch.bool";
        expr = integral ? "torch.ones((" + shape + "), dtype=" + tdt + ", device=device)"
                        : "torch.randn((" + shape + "), device=device).to(" + tdt + ")";
      }
    }
    o << "    " << io.key << " = " << expr << "\n";
    keys.push_back(io.key);
  }
  o << "    return {";
  for (std::size_t i = 0; i < keys.size(); ++i) {
    o << (i ? ", " : "") << "\"" << keys[i] << "\": " << keys[i];
  }
  o << "}\n";
  std::string s = o.str();
  // dtype placeholders in init expressions: {dtype:<key>} is that input's resolved torch dtype.
  for (const Io& io : t.inputs) {
    const std::string ph = "{dtype:" + io.key + "}";
    const std::string dt = inputs[io.key]["dtype"].get<std::string>();
    const std::string tdt = torch_dtype(dt != "unknown" ? dt : io.synth_dtype);
    for (std::size_t p = s.find(ph); p != std::string::npos; p = s.find(ph, p + tdt.size())) {
      s.replace(p, ph.size(), tdt);
    }
  }
  return s;
}

}  // namespace

std::string definition_name(const Template& t, const Args& args) {
  return name_from(t, axis_values(t, args));
}

std::string render(const Template& t, const Args& args, const std::string& fi_api,
                   std::string* name_out) {
  const auto values = axis_values(t, args);
  Json j;
  j["name"] = name_from(t, values);
  if (name_out) *name_out = j["name"].get<std::string>();
  j["description"] = t.description;
  j["op_type"] = t.op_type;
  Json tags = Json::array();
  tags.push_back("fi_api:" + fi_api);
  for (const auto& tag : t.tags) tags.push_back(tag);
  j["tags"] = tags;
  Json axes = Json::object();
  for (const Axis& a : t.axes) {
    Json e;
    e["type"] = a.is_const ? "const" : "var";
    if (a.is_const) {
      if (auto it = values.find(a.name); it != values.end()) e["value"] = it->second;
    }
    if (!a.description.empty()) e["description"] = a.description;
    axes[a.name] = e;
  }
  j["axes"] = axes;
  if (!t.constraints.empty()) j["constraints"] = t.constraints;
  Json inputs = Json::object();
  for (const Io& io : t.inputs) {
    Json e;
    e["shape"] = shape_json(io);
    e["dtype"] = input_dtype(io, args);
    if (io.optional) e["optional"] = true;
    if (!io.description.empty()) e["description"] = io.description;
    inputs[io.key] = e;
  }
  j["inputs"] = inputs;
  Json outputs = Json::object();
  for (const Io& io : t.outputs) {
    Json e;
    e["shape"] = shape_json(io);
    e["dtype"] = output_dtype(t, io, args);
    if (io.optional) e["optional"] = true;
    if (!io.out_param.empty()) e["param"] = io.out_param;
    if (!io.description.empty()) e["description"] = io.description;
    outputs[io.key] = e;
  }
  j["outputs"] = outputs;
  // {axis:NAME} in the reference: that constant axis's value (a constant no input carries).
  std::string ref = t.reference;
  for (const auto& [axis, val] : values) {
    const std::string ph = "{axis:" + axis + "}", num = std::to_string(val);
    for (std::size_t p = ref.find(ph); p != std::string::npos; p = ref.find(ph, p + num.size())) {
      ref.replace(p, ph.size(), num);
    }
  }
  j["reference"] = "import math\nimport torch\n\n\n" + ref;
  j["init"] = generic_init(t, values, inputs);
  // json.dumps(indent=2) layout, ASCII only, as upstream writes its files.
  return j.dump(2, ' ', true);
}

const Derived* find_derived(const Template& t, std::string_view name) {
  for (const Derived& d : t.derived) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

namespace {
const std::unordered_map<std::string_view, std::vector<const Template*>>& template_index() {
  static const auto* index = [] {
    auto* m = new std::unordered_map<std::string_view, std::vector<const Template*>>();
    for (const Template& t : templates()) (*m)[t.op].push_back(&t);
    return m;
  }();
  return *index;
}
}  // namespace

const Template* find_template(std::string_view op) {
  auto it = template_index().find(op);
  return it == template_index().end() ? nullptr : it->second.front();
}

std::vector<const Template*> templates_of(std::string_view op) {
  auto it = template_index().find(op);
  return it == template_index().end() ? std::vector<const Template*>{} : it->second;
}

const Template* find_template(std::string_view op, const Args& args) {
  auto it = template_index().find(op);
  if (it == template_index().end()) return nullptr;
  for (const Template* t : it->second) {
    const bool outside =
        std::any_of(t->only_when.begin(), t->only_when.end(), [&](const Template::OnlyWhen& w) {
          const int64_t x = scalar_of(args, w.param).value_or(w.values.front());
          return std::find(w.values.begin(), w.values.end(), x) == w.values.end();
        });
    if (outside) continue;
    if (t->select_param.empty()) return t;
    if (!t->positive_param.empty() && scalar_of(args, t->positive_param).value_or(0) <= 0) {
      continue;
    }
    if (!t->select_strings.empty()) {
      auto it = args.find(t->select_param);
      const std::string& x = it != args.end() && it->second.kind == Arg::Kind::kString
                                 ? it->second.s
                                 : t->select_string_default;
      for (const std::string& s : t->select_strings) {
        if (s == x) return t;
      }
      continue;
    }
    const auto v = scalar_of(args, t->select_param);
    const int64_t x = v ? *v : t->select_default;
    for (int64_t s : t->select_values) {
      if (s == x) return t;
    }
  }
  return nullptr;
}

}  // namespace detail

namespace {

detail::Arg to_arg(const Value& v) {
  detail::Arg a;
  switch (v.kind()) {
    case Value::Kind::kTensor: {
      const Tensor& t = v.as_tensor();
      a.kind = detail::Arg::Kind::kTensor;
      a.shape.assign(t.shape().begin(), t.shape().end());
      a.dtype = std::string(dtype_name(t.dtype()));
      break;
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      a.kind = detail::Arg::Kind::kTuple;
      for (const Value& x : v.items()) a.items.push_back(to_arg(x));
      break;
    case Value::Kind::kBool:
      a.kind = detail::Arg::Kind::kInt;
      a.i = v.as_bool() ? 1 : 0;
      break;
    case Value::Kind::kInt:
      a.kind = detail::Arg::Kind::kInt;
      a.i = v.as_int();
      break;
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      a.kind = detail::Arg::Kind::kFloat;
      a.i = (d > -9.2e18 && d < 9.2e18) ? static_cast<int64_t>(d) : 0;
      break;
    }
    case Value::Kind::kString:
      a.kind = detail::Arg::Kind::kString;
      a.s = v.as_string();
      break;
    case Value::Kind::kNone:
      break;
    default:
      a.kind = detail::Arg::Kind::kOther;
      break;
  }
  return a;
}

detail::Args args_of(const OpDecl& decl, std::span<const Value> values) {
  detail::Args args;
  const std::size_t n = std::min(decl.params.size(), values.size());
  for (std::size_t i = 0; i < n; ++i) args[decl.params[i].name] = to_arg(values[i]);
  return args;
}

std::string fi_api_of(const OpDecl& decl) { return decl.module + "." + decl.name; }

const detail::Template& require_template(std::string_view op) {
  const detail::Template* t = detail::find_template(op);
  if (!t) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "trace", "routine", "op '", std::string(op),
                    "' has no trace template (`flashinfer trace --list` lists them)");
  }
  return *t;
}

}  // namespace

std::vector<std::string> traced_ops() {
  std::vector<std::string> ops;
  for (const auto& t : detail::templates()) ops.push_back(t.op);
  std::sort(ops.begin(), ops.end());
  // An op with selected templates is listed once.
  ops.erase(std::unique(ops.begin(), ops.end()), ops.end());
  return ops;
}

std::optional<std::string> definition_for_call(const OpDecl& decl, std::span<const Value> args) {
  const detail::Args a = args_of(decl, args);
  const detail::Template* t = detail::find_template(decl.name, a);
  if (!t) return std::nullopt;
  return detail::render(*t, a, fi_api_of(decl), nullptr);
}

std::optional<std::string> definition_name_for_call(const OpDecl& decl,
                                                    std::span<const Value> args) {
  const detail::Args a = args_of(decl, args);
  const detail::Template* t = detail::find_template(decl.name, a);
  if (!t) return std::nullopt;
  return detail::definition_name(*t, a);
}

std::vector<AxisInfo> template_axes(std::string_view op) {
  std::vector<AxisInfo> out;
  for (const auto& a : require_template(op).axes) out.push_back({a.name, a.is_const});
  return out;
}

std::string definition_for_axes(std::string_view op, const std::map<std::string, int64_t>& axes_in,
                                DType dtype) {
  // An op with selected templates takes its selector as one more `axis` (--axis
  // routing_method_type=2); without it, the first template.
  std::map<std::string, int64_t> axes = axes_in;
  const detail::Template* picked = &require_template(op);
  if (!picked->select_param.empty()) {
    detail::Args sel;
    if (auto it = axes.find(picked->select_param); it != axes.end()) {
      sel[it->first].kind = detail::Arg::Kind::kInt;
      sel[it->first].i = it->second;
      axes.erase(it);
    }
    for (const detail::Template* v : detail::templates_of(op)) {
      // The positive selector is an axis of its template: read, not removed.
      if (auto it = axes.find(v->positive_param); !v->positive_param.empty() && it != axes.end()) {
        sel[it->first].kind = detail::Arg::Kind::kInt;
        sel[it->first].i = it->second;
      }
    }
    // A string selector cannot be an axis value: the first template (detail::
    // definition_for_template_axes writes the others).
    if (picked->select_strings.empty()) picked = detail::find_template(op, sel);
    if (!picked) {
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "trace", "routine", "op ", std::string(op),
                      " has no trace template for that ", require_template(op).select_param);
    }
  }
  return detail::definition_for_template_axes(op, *picked, axes, dtype);
}

std::string detail::definition_for_template_axes(std::string_view op, const detail::Template& t,
                                                 const std::map<std::string, int64_t>& axes,
                                                 DType dtype) {
  const OpDecl* decl = OpRegistry::global().find(op);
  if (!decl) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "trace", "routine", "no op named '",
                    std::string(op), "'");
  }
  std::function<int64_t(const std::string&)> value = [&](const std::string& axis) -> int64_t {
    if (const detail::Derived* d = detail::find_derived(t, axis)) {
      if (d->of.empty()) return d->by;
      if (d->times > 0) return value(d->of) * d->times;
      const int64_t by = d->by_axis.empty() ? d->by : value(d->by_axis);
      return by > 0 ? value(d->of) / by : 0;
    }
    for (const auto& a : t.axes) {
      if (a.name != axis) continue;
      if (a.value) return *a.value;
      auto it = axes.find(axis);
      if (it != axes.end()) return it->second;
      if (a.is_const) {
        FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "trace", axis, "constant axis '", axis,
                        "' of ", std::string(op), " needs a value (--axis ", axis, "=N)");
      }
      return 1;
    }
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "trace", axis, "template of ", std::string(op),
                    " names an unknown axis '", axis, "'");
  };
  for (const auto& [name, v] : axes) {
    bool known = false;
    for (const auto& a : t.axes) known = known || a.name == name;
    if (!known) {
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "trace", name, "op ", std::string(op),
                      " has no axis '", name, "'");
    }
    (void)v;
  }
  // A call made of the required inputs: each tensor shaped by its axes.
  detail::Args args;
  for (const detail::Io& io : t.inputs) {
    if (io.optional) continue;
    if (io.scalar) {
      detail::Arg s;
      s.kind = detail::Arg::Kind::kInt;
      for (const auto& a : t.axes) {
        if (a.name == io.key) s.i = value(a.name);
      }
      args[io.source()] = s;
      continue;
    }
    detail::Arg tensor;
    tensor.kind = detail::Arg::Kind::kTensor;
    for (const auto& d : io.dims) tensor.shape.push_back(value(d));
    tensor.dtype = !io.synth_dtype.empty() ? io.synth_dtype
                   : !io.dtype.empty()     ? io.dtype
                                           : std::string(dtype_name(dtype));
    if (io.tuple_idx < 0) {
      args[io.source()] = std::move(tensor);
    } else {
      detail::Arg& tup = args[io.source()];
      tup.kind = detail::Arg::Kind::kTuple;
      if (tup.items.size() <= static_cast<std::size_t>(io.tuple_idx)) {
        tup.items.resize(static_cast<std::size_t>(io.tuple_idx) + 1);
      }
      tup.items[static_cast<std::size_t>(io.tuple_idx)] = std::move(tensor);
    }
  }
  // Constant axes no tensor carries are read from an argument of their name.
  for (const auto& a : t.axes) {
    if (a.is_const && !args.count(a.name)) {
      detail::Arg s;
      s.kind = detail::Arg::Kind::kInt;
      s.i = value(a.name);
      args[a.name] = s;
    }
  }
  return detail::render(t, args, fi_api_of(*decl), nullptr);
}

}  // namespace flashinfer::trace
