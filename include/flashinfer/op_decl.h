// Op declarations: each public op (free function or wrapper method) is declared once, and that
// declaration is what logging, recording, replay and `flashinfer list-ops` read (bench routines
// live in their own table, flashinfer/bench.h). Code outside the library declares its own ops with
// the same types (see register_op).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// What a parameter holds. `optional` on ParamDecl says whether None is also accepted.
enum class ParamKind { kTensor, kInt, kFloat, kBool, kString, kDType, kEnum, kList, kObject, kAny };

std::string_view param_kind_name(ParamKind kind);

struct ParamDecl {
  std::string name;
  ParamKind kind = ParamKind::kAny;
  bool optional = false;               // None is a valid value
  std::optional<Value> default_value;  // nullopt: required
  bool keyword_only = false;           // passed by keyword upstream (recorded as kwarg_<name>)
  bool mutated = false;                // the op writes into this tensor (out=, in-place ops)
  bool in_kwargs = false;              // keyword-only, taken through upstream's **kwargs: accepted
                                       // by keyword but absent from the signature text
  std::string type_name;               // enum class or object class, for kEnum / kObject
  std::string within;  // written, it may lie inside this input's span (op_typed.h, Arg::within)

  ParamDecl() = default;
  ParamDecl(std::string n, ParamKind k) : name(std::move(n)), kind(k) {}

  /// Marks the parameter optional with default None.
  ParamDecl& opt() {
    optional = true;
    if (!default_value) default_value = Value();
    return *this;
  }
  ParamDecl& def(Value v) {
    default_value = std::move(v);
    return *this;
  }
  ParamDecl& kw() {
    keyword_only = true;
    return *this;
  }
  /// Marks a tensor the op writes into; the recorder saves its value after the call.
  ParamDecl& mut(bool yes = true) {
    mutated = yes;
    return *this;
  }
  ParamDecl& type(std::string t) {
    type_name = std::move(t);
    return *this;
  }
  bool required() const { return !default_value.has_value(); }
};

class CallArgs;
/// Runs the op from Values (replay, tools): returns its result as a Value.
using OpInvoker = std::function<Value(const CallArgs&)>;

struct OpDecl {
  std::string name;               // as logged: "rmsnorm", "BatchDecodeWithPagedKVCacheWrapper.plan"
  std::string module;             // FlashInfer's Python module: "flashinfer.norm"
  std::string class_name;         // wrapper class for methods, empty for free functions
  std::vector<ParamDecl> params;  // methods: params[0] is `self`
  // Upstream's variadic parameters, kept for the signature text (`function_signature` in records):
  // `*var_positional` stands before the keyword-only parameters, `**var_keyword` last.
  std::string var_positional;  // "args", "deprecated_positional_args"; empty: none
  std::string var_keyword;     // "kwargs"; empty: none
  std::string returns;         // "Tensor", "None", "tuple[Tensor, Tensor]", ...
  std::string summary;         // one line for list-ops
  OpInvoker invoke;            // may be empty: then the op cannot be replayed
  // Result keys of the recorded outputs ("result__1", ...) that upstream returns without
  // writing (scratch tensors): replay skips them and reports `unwritten_reason`.
  std::vector<std::string> unwritten_results;
  std::string unwritten_reason;

  bool is_method() const { return !class_name.empty(); }
  /// "plan" for "X.plan", the name itself for free functions.
  std::string_view method_name() const;
  bool is_constructor() const { return method_name() == "__init__"; }
  /// Python's inspect.signature text: "(input, weight, eps=1e-06, out=None, enable_pdl=None)".
  std::string signature() const;
  /// Index of the parameter called `name`, or -1.
  int param_index(std::string_view name) const;
};

/// Arguments of one call, aligned with OpDecl::params (defaults filled in). Typed getters throw
/// flashinfer::Error naming the op and the parameter when a value has the wrong kind.
class CallArgs {
 public:
  CallArgs(const OpDecl& decl, std::vector<Value> values);

  const OpDecl& decl() const { return *decl_; }
  std::size_t size() const { return values_.size(); }
  const Value& operator[](std::size_t i) const { return values_.at(i); }
  const std::vector<Value>& values() const { return values_; }

  Tensor tensor(std::size_t i) const;
  std::optional<Tensor> optional_tensor(std::size_t i) const;
  int64_t i64(std::size_t i) const;
  std::optional<int64_t> optional_i64(std::size_t i) const;
  double f64(std::size_t i) const;
  std::optional<double> optional_f64(std::size_t i) const;
  bool boolean(std::size_t i) const;
  std::optional<bool> optional_bool(std::size_t i) const;
  std::string str(std::size_t i) const;
  /// A view of the string argument i (valid while this CallArgs lives).
  std::string_view str_view(std::size_t i) const;
  DType dtype(std::size_t i) const;
  std::optional<DType> optional_dtype(std::size_t i) const;
  ApiObject& object(std::size_t i) const;
  template <class T>
  T& object_as(std::size_t i) const;

 private:
  [[noreturn]] void kind_error(std::size_t i, std::string_view expected) const;
  const OpDecl* decl_;
  std::vector<Value> values_;
};

/// Binds positional and keyword values to `decl`'s parameters the way Python would: fills
/// defaults, and throws flashinfer::Error for a missing required parameter, an unknown keyword,
/// a parameter given twice, or too many positional values.
std::vector<Value> bind_arguments(const OpDecl& decl, std::vector<Value> positional,
                                  std::vector<std::pair<std::string, Value>> keyword = {});

/// Base of every stateful API class (the attention wrappers). Its id is its address, as
/// upstream records `self_id = id(self)` (a Python object's id is its address) and prints that
/// address in its repr, so `self_id` equals the address in "<... object at 0x...>" and
/// `__init__`, `plan` and `run` replay in order on one object. As upstream's, an id is unique
/// among live objects; a destroyed object's id may come back for a later one.
class ApiObject {
 public:
  virtual ~ApiObject();
  /// Runtime class name as upstream logs it ("BatchDecodeWithPagedKVCacheWrapper").
  virtual std::string_view class_name() const = 0;
  /// FlashInfer module that defines the class ("flashinfer.decode").
  virtual std::string_view module_name() const = 0;
  /// The object's address, recorded as `self_id`.
  uint64_t object_id() const { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(this)); }
  /// "<flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper object at 0x7f4f8d343150>": the
  /// address is object_id() in hex.
  /// A class may say more (Mapping: its fields, as upstream's repr does).
  virtual std::string repr() const;

 protected:
  // Each constructor enters the object in a process-wide set of live objects and the destructor
  // takes it out, so a call rebuilt from Values (replay, tests) whose non-owning self refers to
  // a destroyed object fails with an Error instead of reading freed memory (api_object_live).
  ApiObject();
  ApiObject(const ApiObject&);  // a copy lives elsewhere: it has its own id
  ApiObject& operator=(const ApiObject&) { return *this; }
};

/// Whether `p` is the address of an ApiObject constructed and not yet destroyed.
bool api_object_live(const ApiObject* p);

template <class T>
T& CallArgs::object_as(std::size_t i) const {
  auto* p = dynamic_cast<T*>(&object(i));
  if (!p) kind_error(i, "object of the declared class");
  return *p;
}

/// The process-wide table of declared ops. Built-in ops are registered on first use.
class OpRegistry {
 public:
  static OpRegistry& global();

  /// Adds a declaration; throws flashinfer::Error if the name is taken or the declaration is
  /// malformed (a method without `self`, a required parameter after a defaulted one, ...).
  const OpDecl& add(OpDecl decl);
  const OpDecl* find(std::string_view name) const;
  /// All declarations, sorted by name.
  std::vector<const OpDecl*> ops() const;

  OpRegistry();
  ~OpRegistry();
  OpRegistry(const OpRegistry&) = delete;
  OpRegistry& operator=(const OpRegistry&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Declares an op in the global registry; returns the stored declaration (stable address).
const OpDecl& register_op(OpDecl decl);

}  // namespace flashinfer
