#include "flashinfer/op_decl.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <deque>
#include <iterator>
#include <mutex>
#include <optional>
#include <unordered_set>

#include "flashinfer/error.h"

namespace flashinfer {

std::string_view param_kind_name(ParamKind kind) {
  switch (kind) {
    case ParamKind::kTensor:
      return "tensor";
    case ParamKind::kInt:
      return "int";
    case ParamKind::kFloat:
      return "float";
    case ParamKind::kBool:
      return "bool";
    case ParamKind::kString:
      return "str";
    case ParamKind::kDType:
      return "dtype";
    case ParamKind::kEnum:
      return "enum";
    case ParamKind::kList:
      return "list";
    case ParamKind::kObject:
      return "object";
    case ParamKind::kAny:
      return "any";
  }
  return "?";
}

// ---- OpDecl
// --------------------------------------------------------------------------------------

std::string_view OpDecl::method_name() const {
  std::string_view n = name;
  if (!is_method()) return n;
  auto dot = n.rfind('.');
  return dot == std::string_view::npos ? n : n.substr(dot + 1);
}

std::string OpDecl::signature() const {
  // Python's inspect.signature text: keyword-only parameters follow `*args` or a bare `*`;
  // parameters taken through **kwargs are not listed.
  std::string s = "(";
  auto put = [&](const std::string& part) {
    if (s.size() > 1) s += ", ";
    s += part;
  };
  bool star_written = false;
  for (const ParamDecl& p : params) {
    // A parameter named like the *var_positional holds its values (bind_arguments): it is the
    // `*args` itself, not a parameter of its own.
    if (!var_positional.empty() && p.name == var_positional) continue;
    if (p.keyword_only && !star_written) {
      if (!var_positional.empty()) {
        put("*" + var_positional);
      } else if (!p.in_kwargs) {
        put("*");
      }
      star_written = true;
    }
    if (p.in_kwargs) continue;
    put(p.default_value ? p.name + "=" + p.default_value->repr() : p.name);
  }
  if (!star_written && !var_positional.empty()) put("*" + var_positional);
  if (!var_keyword.empty()) put("**" + var_keyword);
  return s + ")";
}

int OpDecl::param_index(std::string_view n) const {
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == n) return static_cast<int>(i);
  }
  return -1;
}

// ---- CallArgs
// ------------------------------------------------------------------------------------

CallArgs::CallArgs(const OpDecl& decl, std::vector<Value> values)
    : decl_(&decl), values_(std::move(values)) {
  FLASHINFER_CHECK(values_.size() == decl.params.size(), decl.name, "", "expected ",
                   decl.params.size(), " argument values, got ", values_.size());
}

void CallArgs::kind_error(std::size_t i, std::string_view expected) const {
  const std::string_view have = i < values_.size() ? value_kind_name(values_[i].kind()) : "nothing";
  const std::string arg = i < decl_->params.size() ? decl_->params[i].name : std::to_string(i);
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, decl_->name, arg, "expected ", expected, ", got ",
                  have);
}

Tensor CallArgs::tensor(std::size_t i) const {
  if (i >= values_.size() || !values_[i].is_tensor()) kind_error(i, "Tensor");
  return values_[i].as_tensor();
}
std::optional<Tensor> CallArgs::optional_tensor(std::size_t i) const {
  if (i < values_.size() && values_[i].is_none()) return std::nullopt;
  return tensor(i);
}
int64_t CallArgs::i64(std::size_t i) const {
  // An IntEnum member is an int (Python's IntEnum subclasses int): engines pass their own
  // RoutingMethodType / ActivationType members where upstream's signature says int, and
  // upstream's recorder writes them as enums with their integer value.
  if (i < values_.size() && values_[i].kind() == Value::Kind::kEnum) {
    const std::string& v = values_[i].as_enum().value;
    int64_t x = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec == std::errc() && end == v.data() + v.size() && !v.empty()) return x;
    kind_error(i, "int (or an IntEnum member with an integer value)");
  }
  if (i >= values_.size() || values_[i].kind() != Value::Kind::kInt) kind_error(i, "int");
  return values_[i].as_int();
}
std::optional<int64_t> CallArgs::optional_i64(std::size_t i) const {
  if (i < values_.size() && values_[i].is_none()) return std::nullopt;
  return i64(i);
}
double CallArgs::f64(std::size_t i) const {
  if (i >= values_.size() ||
      (values_[i].kind() != Value::Kind::kFloat && values_[i].kind() != Value::Kind::kInt)) {
    kind_error(i, "float");
  }
  return values_[i].as_float();
}
std::optional<double> CallArgs::optional_f64(std::size_t i) const {
  if (i < values_.size() && values_[i].is_none()) return std::nullopt;
  return f64(i);
}
bool CallArgs::boolean(std::size_t i) const {
  if (i >= values_.size() || values_[i].kind() != Value::Kind::kBool) kind_error(i, "bool");
  return values_[i].as_bool();
}
std::optional<bool> CallArgs::optional_bool(std::size_t i) const {
  if (i < values_.size() && values_[i].is_none()) return std::nullopt;
  return boolean(i);
}
std::string CallArgs::str(std::size_t i) const { return std::string(str_view(i)); }
std::string_view CallArgs::str_view(std::size_t i) const {
  if (i >= values_.size() || values_[i].kind() != Value::Kind::kString) kind_error(i, "str");
  return values_[i].as_string();
}
DType CallArgs::dtype(std::size_t i) const {
  if (i < values_.size() && values_[i].kind() == Value::Kind::kString) {
    // Upstream passes dtypes as torch.dtype or as strings ("float16"); accept both.
    if (auto d = dtype_from_name(values_[i].as_string())) return *d;
  }
  if (i >= values_.size() || values_[i].kind() != Value::Kind::kDType) kind_error(i, "dtype");
  return values_[i].as_dtype();
}
std::optional<DType> CallArgs::optional_dtype(std::size_t i) const {
  if (i < values_.size() && values_[i].is_none()) return std::nullopt;
  return dtype(i);
}
ApiObject& CallArgs::object(std::size_t i) const {
  if (i >= values_.size() || values_[i].kind() != Value::Kind::kObject ||
      values_[i].as_object().get() == nullptr) {
    kind_error(i, "a live API object");
  }
  const ObjectRef& ref = values_[i].as_object();
  // A non-owning reference (the self an observer captured from a live call) can outlive its
  // object; object_as's dynamic_cast would then read freed memory. An owning one is live.
  if (!ref.object && !api_object_live(ref.raw)) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, decl_->name, decl_->params[i].name,
                    "expected a live API object, got ", ref.repr, ", which was destroyed");
  }
  return *ref.get();
}

// ---- bind_arguments
// ------------------------------------------------------------------------------

std::vector<Value> bind_arguments(const OpDecl& decl, std::vector<Value> positional,
                                  std::vector<std::pair<std::string, Value>> keyword) {
  const auto n = decl.params.size();
  // Keyword-only parameters are never filled by position (Python's rule).
  const auto n_positional = static_cast<std::size_t>(std::count_if(
      decl.params.begin(), decl.params.end(), [](const ParamDecl& p) { return !p.keyword_only; }));
  // Values past the positional parameters go to *var_positional: as one tuple into the
  // parameter of that name when the op declares one (a JIT variant's run(q, kv, *args)).
  const int var_idx = decl.var_positional.empty() ? -1 : decl.param_index(decl.var_positional);
  std::optional<Value> var_values;
  if (positional.size() > n_positional && var_idx >= 0) {
    const auto first = positional.begin() + static_cast<std::ptrdiff_t>(n_positional);
    std::vector<Value> extra(std::make_move_iterator(first),
                             std::make_move_iterator(positional.end()));
    positional.resize(n_positional);
    var_values = Value::tuple(std::move(extra));
  }
  if (positional.size() > n_positional && !decl.var_positional.empty()) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, decl.name, decl.var_positional,
                    positional.size() - n_positional, " extra positional argument(s) given to *",
                    decl.var_positional, "; pass them by keyword");
  }
  FLASHINFER_CHECK(positional.size() <= n_positional, decl.name, "", "takes ", n_positional,
                   " positional arguments but ", positional.size(), " were given");
  std::vector<std::optional<Value>> slots(n);
  for (std::size_t i = 0; i < positional.size(); ++i) slots[i] = std::move(positional[i]);
  if (var_values) slots[static_cast<std::size_t>(var_idx)] = std::move(*var_values);
  for (auto& [name, v] : keyword) {
    int idx = decl.param_index(name);
    FLASHINFER_CHECK(idx >= 0, decl.name, name, "unexpected keyword argument");
    FLASHINFER_CHECK(!slots[idx].has_value(), decl.name, name, "given more than once");
    slots[idx] = std::move(v);
  }
  std::vector<Value> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (slots[i]) {
      out.push_back(std::move(*slots[i]));
    } else {
      FLASHINFER_CHECK(decl.params[i].default_value.has_value(), decl.name, decl.params[i].name,
                       "missing required argument");
      out.push_back(*decl.params[i].default_value);
    }
  }
  return out;
}

// ---- ApiObject
// -----------------------------------------------------------------------------------

namespace {
struct LiveObjects {
  std::mutex mu;
  std::unordered_set<const ApiObject*> set;
};
// Never destroyed: objects with static storage may be destroyed after any other static.
LiveObjects& live_objects() {
  static auto* l = new LiveObjects;
  return *l;
}
void enter_live(const ApiObject* p) {
  LiveObjects& l = live_objects();
  std::lock_guard lock(l.mu);
  l.set.insert(p);
}
}  // namespace

ApiObject::ApiObject() { enter_live(this); }
ApiObject::ApiObject(const ApiObject&) { enter_live(this); }
ApiObject::~ApiObject() {
  LiveObjects& l = live_objects();
  std::lock_guard lock(l.mu);
  l.set.erase(this);
}

bool api_object_live(const ApiObject* p) {
  if (p == nullptr) return false;
  LiveObjects& l = live_objects();
  std::lock_guard lock(l.mu);
  return l.set.count(p) != 0;
}

std::string ApiObject::repr() const {
  // Python's repr writes the address as %p does: 0x and lowercase hex. Built on every observed
  // call of a wrapper method (its self argument), so without snprintf (a tenth of the
  // argument packing's time, session 17).
  const std::string_view module = module_name(), cls = class_name();
  constexpr std::string_view kAt = " object at 0x";
  char hex[16];
  const auto [end, ec] = std::to_chars(hex, hex + sizeof(hex), object_id(), 16);
  (void)ec;  // 16 hex digits always fit
  std::string s;
  s.reserve(module.size() + cls.size() + kAt.size() + 20);
  s += '<';
  s += module;
  s += '.';
  s += cls;
  s += kAt;
  s.append(hex, end);
  s += '>';
  return s;
}

// ---- OpRegistry
// ----------------------------------------------------------------------------------

struct OpRegistry::Impl {
  mutable std::mutex mu;
  std::deque<OpDecl> decls;  // deque: stable addresses
};

OpRegistry::OpRegistry() : impl_(std::make_unique<Impl>()) {}
OpRegistry::~OpRegistry() = default;

// OpRegistry::global(), the registry holding the built-in ops, and register_op() are defined
// with the list of built-in areas (src/api/registry.cpp): core declares the registry class, the
// api layer owns the global one, so core never calls into api.

const OpDecl& OpRegistry::add(OpDecl decl) {
  const char* op = "register_op";
  FLASHINFER_CHECK(!decl.name.empty(), op, "name", "an op needs a name");
  FLASHINFER_CHECK(!decl.module.empty(), op, "module", "op '", decl.name, "' needs a module");
  if (decl.is_method()) {
    FLASHINFER_CHECK(decl.name.starts_with(decl.class_name + ".") &&
                         decl.name.size() > decl.class_name.size() + 1,
                     op, "name", "method '", decl.name, "' must be named '", decl.class_name,
                     ".<method>'");
    FLASHINFER_CHECK(!decl.params.empty() && decl.params[0].kind == ParamKind::kObject &&
                         decl.params[0].name == "self",
                     op, "params", "method '", decl.name,
                     "' must declare 'self' (kind object) as its first parameter");
  }
  bool seen_default = false;
  for (const ParamDecl& p : decl.params) {
    FLASHINFER_CHECK(!p.name.empty(), op, "params", "op '", decl.name,
                     "' has an unnamed parameter");
    FLASHINFER_CHECK(std::count_if(decl.params.begin(), decl.params.end(),
                                   [&](const ParamDecl& q) { return q.name == p.name; }) == 1,
                     op, "params", "op '", decl.name, "' declares '", p.name, "' twice");
    if (!p.keyword_only) {
      FLASHINFER_CHECK(!(seen_default && p.required()), op, "params", "op '", decl.name,
                       "': required parameter '", p.name, "' follows a parameter with a default");
      seen_default = seen_default || !p.required();
    }
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const OpDecl& d : impl_->decls) {
    FLASHINFER_CHECK(d.name != decl.name, op, "name", "an op named '", decl.name,
                     "' is already declared");
  }
  impl_->decls.push_back(std::move(decl));
  return impl_->decls.back();
}

const OpDecl* OpRegistry::find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const OpDecl& d : impl_->decls) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::vector<const OpDecl*> OpRegistry::ops() const {
  std::vector<const OpDecl*> out;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const OpDecl& d : impl_->decls) out.push_back(&d);
  }
  std::sort(out.begin(), out.end(),
            [](const OpDecl* a, const OpDecl* b) { return a->name < b->name; });
  return out;
}

}  // namespace flashinfer
