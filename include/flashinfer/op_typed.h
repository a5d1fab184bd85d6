// Typed op declarations: an op is declared once, from the C++ function (or method, or
// constructor) that implements it, plus upstream's parameter names and defaults. The parameter
// kinds, the invoker that replays the op from Values, the packing of a live call for logging and
// recording, and the registration are all derived from the function's type, so they cannot drift
// from it: a declaration that names too few or too many parameters, a default that does not
// convert to its parameter's type, or a gate call whose arguments differ from the declared
// function's is a compile error.
//
//   // in the area's .cpp, the op's declaration:
//   api::declare<&rmsnorm>(registry, {.name = "rmsnorm", .module = "flashinfer.norm",
//                                     .summary = "..."},
//                          "input", "weight", arg("eps", 1e-6), arg("out").mut(), "enable_pdl");
//   // the public function's body, through the gate:
//   Tensor rmsnorm(const Tensor& input, ..., std::optional<bool> enable_pdl) {
//     return call_op<&rmsnorm>([&] { return rmsnorm_impl(...); }, input, weight, eps, out,
//                              enable_pdl);
//   }
//
// Keyword-only parameters that C++ passes as one options struct keep a single field list:
// FLASHINFER_OPTION_FIELDS(PlanOptions, pos_encoding_mode, window_left, ...) next to the struct
// names its fields once; a declaration whose last parameter is that struct takes one keyword-only
// parameter per field (default: the field's value in a default-constructed struct), and the gate
// records each field as `kwarg_<name>`. Code outside the library declares its own ops the same
// way (`declare` on any OpRegistry, usually OpRegistry::global()).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "flashinfer/api_call.h"
#include "flashinfer/error.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/value.h"

namespace flashinfer {

// ---- ArgTraits<T>: what kind a C++ parameter type has and how it is rebuilt from a Value -------
//
// Specialize it for a type of your own (an enum, a small struct): `kind`, and
// `static T get(const CallArgs& a, std::size_t i)` that throws flashinfer::Error (via the
// CallArgs getters or FLASHINFER_CHECK) on a value of the wrong kind. `type_name` (optional) is
// the enum or class name recorded for kEnum / kObject.
template <class T, class Enable = void>
struct ArgTraits;  // undefined: a parameter type with no traits does not compile

template <>
struct ArgTraits<Tensor> {
  static constexpr ParamKind kind = ParamKind::kTensor;
  static Tensor get(const CallArgs& a, std::size_t i) { return a.tensor(i); }
};
template <>
struct ArgTraits<bool> {
  static constexpr ParamKind kind = ParamKind::kBool;
  static bool get(const CallArgs& a, std::size_t i) { return a.boolean(i); }
};
template <class T>
struct ArgTraits<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static constexpr ParamKind kind = ParamKind::kInt;
  static T get(const CallArgs& a, std::size_t i) {
    const int64_t v = a.i64(i);
    FLASHINFER_CHECK(std::in_range<T>(v), a.decl().name,
                     i < a.decl().params.size() ? a.decl().params[i].name : "", "value ", v,
                     " is out of range");
    return static_cast<T>(v);
  }
};
template <class T>
struct ArgTraits<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static constexpr ParamKind kind = ParamKind::kFloat;
  static T get(const CallArgs& a, std::size_t i) { return static_cast<T>(a.f64(i)); }
};
template <>
struct ArgTraits<std::string> {
  static constexpr ParamKind kind = ParamKind::kString;
  static std::string get(const CallArgs& a, std::size_t i) { return a.str(i); }
};
template <>
struct ArgTraits<std::string_view> {
  static constexpr ParamKind kind = ParamKind::kString;
  static std::string_view get(const CallArgs& a, std::size_t i) { return a.str_view(i); }
};
template <>
struct ArgTraits<DType> {
  static constexpr ParamKind kind = ParamKind::kDType;
  static DType get(const CallArgs& a, std::size_t i) { return a.dtype(i); }
};
template <>
struct ArgTraits<Value> {  // taken as recorded (a jit_args list, a (K, V) pair)
  static constexpr ParamKind kind = ParamKind::kAny;
  static Value get(const CallArgs& a, std::size_t i) { return a[i]; }
};
/// An API object passed or returned by shared pointer (a workspace that a function creates and
/// later calls take): None for nullptr; an owning reference otherwise.
template <class T>
requires std::is_base_of_v<ApiObject, T> Value to_value(const std::shared_ptr<T>& p) {
  if (!p) return Value();
  ObjectRef ref;
  ref.type = std::string(p->class_name());
  ref.repr = p->repr();
  ref.id = p->object_id();
  ref.object = std::static_pointer_cast<ApiObject>(p);
  return Value(std::move(ref));
}
template <class T>
requires std::is_base_of_v<ApiObject, T>
struct ArgTraits<std::shared_ptr<T>> {
  static constexpr ParamKind kind = ParamKind::kObject;
  static constexpr bool optional = true;  // nullptr is None
  static std::shared_ptr<T> get(const CallArgs& a, std::size_t i) {
    if (a[i].is_none()) return nullptr;
    auto* p = &a.object_as<T>(i);
    const ObjectRef& ref = a[i].as_object();
    // An owning reference shares ownership; a borrowed one (a live call's argument) does not.
    return ref.object ? std::shared_ptr<T>(ref.object, p)
                      : std::shared_ptr<T>(std::shared_ptr<T>{}, p);
  }
};

namespace detail {
template <class T>
struct TypeNameOf {
  static constexpr const char* value = nullptr;
};
template <class T>
requires requires { ArgTraits<T>::type_name; }
struct TypeNameOf<T> {
  static constexpr const char* value = ArgTraits<T>::type_name;
};
}  // namespace detail

template <class T>
struct ArgTraits<std::optional<T>> {
  static constexpr ParamKind kind = ArgTraits<T>::kind;
  static constexpr bool optional = true;
  static constexpr const char* type_name = detail::TypeNameOf<T>::value;
  static std::optional<T> get(const CallArgs& a, std::size_t i) {
    if (a[i].is_none()) return std::nullopt;
    return ArgTraits<T>::get(a, i);
  }
};
template <class T>
struct ArgTraits<std::vector<T>> {
  static constexpr ParamKind kind = ParamKind::kList;
  static std::vector<T> get(const CallArgs& a, std::size_t i) {
    FLASHINFER_CHECK(a[i].is_sequence(), a.decl().name, a.decl().params.at(i).name,
                     "expected a list, got ", value_kind_name(a[i].kind()));
    std::vector<T> out;
    for (const Value& item : a[i].items()) {
      OpDecl one;
      one.name = a.decl().name;
      one.params = {a.decl().params.at(i)};
      out.push_back(ArgTraits<T>::get(CallArgs(one, {item}), 0));
    }
    return out;
  }
};

// ---- Options structs: one field list ------------------------------------------------------------

/// One field of an options struct: upstream's keyword name and the member.
template <class S, class M>
struct OptionField {
  const char* name;
  M S::*member;
  using type = M;
};

template <class S, class M>
constexpr OptionField<S, M> option_field(const char* name, M S::*member) {
  return {name, member};
}

/// Whether `S` has a field list (declared with FLASHINFER_OPTION_FIELDS).
template <class S>
concept OptionsStruct = requires {
  flashinfer_option_fields(std::type_identity<S>{});
};

namespace detail {

// Counts an aggregate's members (the largest brace-initializer list that compiles), so a field
// list that forgets a member is a compile error.
struct AnyInit {
  template <class T>
  operator T() const;  // NOLINT: only used in unevaluated brace-initialization
};
template <class S, std::size_t... I>
constexpr bool brace_constructible(std::index_sequence<I...>) {
  return requires { S{(static_cast<void>(I), AnyInit{})...}; };
}
template <class S, std::size_t N = 0>
constexpr std::size_t aggregate_arity() {
  if constexpr (N > 64) {
    return N;
  } else if constexpr (brace_constructible<S>(std::make_index_sequence<N + 1>{})) {
    return aggregate_arity<S, N + 1>();
  } else {
    return N;
  }
}

}  // namespace detail

/// The tuple of OptionField of `S`. The field list's completeness is checked here, where the
/// op layer uses it, rather than beside every FLASHINFER_OPTION_FIELDS: counting an aggregate's
/// members instantiates a requires-expression per member, and the header's users (every test
/// source) paid for it in each translation unit.
template <OptionsStruct S>
constexpr auto option_fields() {
  constexpr auto fields = flashinfer_option_fields(std::type_identity<S>{});
  static_assert(std::tuple_size_v<decltype(fields)> == detail::aggregate_arity<S>(),
                "FLASHINFER_OPTION_FIELDS(S, ...) must list every member of S");
  return fields;
}

// FLASHINFER_OPTION_FIELDS(S, a, b, c): S's keyword fields, in upstream's order.
#define FLASHINFER_OPT_PARENS ()
#define FLASHINFER_OPT_EXPAND(...) \
  FLASHINFER_OPT_EXPAND3(FLASHINFER_OPT_EXPAND3(FLASHINFER_OPT_EXPAND3(__VA_ARGS__)))
#define FLASHINFER_OPT_EXPAND3(...) \
  FLASHINFER_OPT_EXPAND2(FLASHINFER_OPT_EXPAND2(FLASHINFER_OPT_EXPAND2(__VA_ARGS__)))
#define FLASHINFER_OPT_EXPAND2(...) \
  FLASHINFER_OPT_EXPAND1(FLASHINFER_OPT_EXPAND1(FLASHINFER_OPT_EXPAND1(__VA_ARGS__)))
#define FLASHINFER_OPT_EXPAND1(...) __VA_ARGS__
#define FLASHINFER_OPT_EACH(S, ...) \
  __VA_OPT__(FLASHINFER_OPT_EXPAND(FLASHINFER_OPT_EACH_STEP(S, __VA_ARGS__)))
#define FLASHINFER_OPT_EACH_STEP(S, f, ...) \
  ::flashinfer::option_field(#f, &S::f)     \
      __VA_OPT__(, FLASHINFER_OPT_EACH_AGAIN FLASHINFER_OPT_PARENS(S, __VA_ARGS__))
#define FLASHINFER_OPT_EACH_AGAIN() FLASHINFER_OPT_EACH_STEP
// A template, so that the tuple (one std::make_tuple of the fields) is instantiated only where
// the op layer reads the list, not in every includer of the header: an std::tuple_cat of
// one-element tuples here cost each includer of the attention header about 3 s of compile
// (clang -ftime-trace of a test source, session 52).
#define FLASHINFER_OPTION_FIELDS(S, ...)                                            \
  template <std::same_as<S> FlashinferOptionsT>                                     \
  constexpr auto flashinfer_option_fields(std::type_identity<FlashinferOptionsT>) { \
    return std::make_tuple(FLASHINFER_OPT_EACH(FlashinferOptionsT, __VA_ARGS__));   \
  }                                                                                 \
  static_assert(true, "FLASHINFER_OPTION_FIELDS(" #S ", ...) takes a semicolon")

// ---- Parameter specs: upstream's names, defaults and flags --------------------------------------

/// A parameter's upstream name and what the C++ type cannot say: its default (for parameters
/// that are not std::optional; an std::optional parameter defaults to None), whether the op
/// writes into it, and whether upstream takes it by keyword only. `D` is the default's type
/// (void: none), checked against the parameter's type at compile time.
template <class D = void>
struct Arg {
  const char* name;
  std::optional<std::conditional_t<std::is_void_v<D>, int, D>> default_value;
  bool mutated = false;
  bool keyword_only = false;
  const char* type_name = nullptr;  // kEnum / kObject class name
  ParamKind kind = ParamKind::kAny;
  bool kind_set = false;
  bool no_default = false;
  const char* in_place_of = nullptr;       // see same_view_as()
  const char* in_place_of_also = nullptr;  // a second input it may be (same_view_as twice)
  const char* inside_of = nullptr;         // see within()

  constexpr Arg mut() const {
    Arg a = *this;
    a.mutated = true;
    return a;
  }
  constexpr Arg kw() const {
    Arg a = *this;
    a.keyword_only = true;
    return a;
  }
  /// A parameter upstream requires although None is a valid value (`routing_bias` of the MoE
  /// ops): an std::optional parameter without the default None.
  constexpr Arg required() const {
    Arg a = *this;
    a.no_default = true;
    return a;
  }
  /// A written parameter that may be exactly the input `input` (the same view: address, shape,
  /// strides and dtype), for an op whose upstream use writes its result over its input. Any
  /// other overlap with `input` is still refused. Each use says why in a comment. Given twice,
  /// the parameter may be either input.
  constexpr Arg same_view_as(const char* input) const {
    Arg a = *this;
    (a.in_place_of ? a.in_place_of_also : a.in_place_of) = input;
    return a;
  }
  /// A written parameter that may be a view lying inside the input `input`'s span (the ids a
  /// MoE all-to-all received are a view of its workspace, which the op also takes). Overlap with
  /// any other argument is still refused.
  constexpr Arg within(const char* input) const {
    Arg a = *this;
    a.inside_of = input;
    return a;
  }
  constexpr Arg type(const char* t) const {
    Arg a = *this;
    a.type_name = t;
    return a;
  }
  /// Overrides the derived kind (e.g. a (K, V) pair or a tensor: kAny).
  constexpr Arg as(ParamKind k) const {
    Arg a = *this;
    a.kind = k;
    a.kind_set = true;
    return a;
  }
};

inline Arg<void> arg(const char* name) { return Arg<void>{name, std::nullopt}; }
template <class D>
Arg<std::decay_t<D>> arg(const char* name, D default_value) {
  return Arg<std::decay_t<D>>{name, std::move(default_value)};
}
/// A field of the options struct that needs more than its name and default (mut, type, as, or
/// a default other than the default-constructed field's, e.g. a dtype upstream spells 'float16').
inline Arg<void> field(const char* name) { return Arg<void>{name, std::nullopt}; }
template <class D>
Arg<std::decay_t<D>> field(const char* name, D default_value) {
  return Arg<std::decay_t<D>>{name, std::move(default_value)};
}

/// The subset of an options struct's fields an op takes upstream, in upstream's order (when
/// several ops share one options struct). Unlisted fields must stay unset; the op checks that.
struct OnlyFields {
  std::vector<const char*> names;
  OnlyFields(std::initializer_list<const char*> n) : names(n) {}
};

/// What a declaration says besides its parameters.
struct OpSpec {
  const char* name;                      // "rmsnorm", "BatchDecodeWithPagedKVCacheWrapper.plan"
  const char* module;                    // upstream's defining module
  const char* summary;                   // one line for list-ops
  const char* returns = nullptr;         // default: derived from the C++ return type
  const char* var_positional = nullptr;  // upstream's *args name
  const char* var_keyword = nullptr;     // upstream's **kwargs name: the options fields are
                                         // taken through it (absent from the signature text)
  bool options_keyword_only = true;      // false: the options fields are upstream's
                                         // positional-or-keyword parameters with defaults
  // Result keys ("result__1", ...) upstream returns without writing (scratch), and why: replay
  // does not compare them and says so.
  std::vector<std::string> unwritten_results = {};
  const char* unwritten_reason = nullptr;
};

// ---- Return-type names
// ---------------------------------------------------------------------------

template <class R>
struct ReturnName {
  static constexpr const char* value = "object";
};
template <>
struct ReturnName<void> {
  static constexpr const char* value = "None";
};
template <>
struct ReturnName<Tensor> {
  static constexpr const char* value = "Tensor";
};
template <>
struct ReturnName<std::pair<Tensor, Tensor>> {
  static constexpr const char* value = "tuple[Tensor, Tensor]";
};
template <>
struct ReturnName<std::tuple<Tensor, Tensor>> {
  static constexpr const char* value = "tuple[Tensor, Tensor]";
};
template <>
struct ReturnName<bool> {
  static constexpr const char* value = "bool";
};
template <>
struct ReturnName<int64_t> {
  static constexpr const char* value = "int";
};

// ---- What is declared: a function, a method or a constructor
// -------------------------------------

/// A constructor as an op (`Class.__init__`): the argument types the constructor takes.
template <class C, class... A>
struct Init {
  using Class = C;
};

namespace detail {

template <class T>
using Plain = std::remove_cvref_t<T>;

template <class F>
struct FnInfo;
template <class R, class... A>
struct FnInfo<R (*)(A...)> {
  using Ret = R;
  using Args = std::tuple<Plain<A>...>;
  using Class = void;
};
template <class R, class C, class... A>
struct FnInfo<R (C::*)(A...)> {
  using Ret = R;
  using Args = std::tuple<Plain<A>...>;
  using Class = C;
};
template <class R, class C, class... A>
struct FnInfo<R (C::*)(A...) const> {
  using Ret = R;
  using Args = std::tuple<Plain<A>...>;
  using Class = C;
};

// What an op key (a function pointer, a member function pointer or an Init<>) declares.
template <auto Key>
struct OpInfo : FnInfo<decltype(Key)> {
  static constexpr bool is_init = false;
};
template <class C, class... A>
struct InitInfo {
  using Ret = void;
  using Args = std::tuple<Plain<A>...>;
  using Class = C;
  static constexpr bool is_init = true;
};

template <class Key>
struct KeyOf;  // Key type → info
template <auto Fn>
struct FnKey {};
template <auto Fn>
struct KeyOf<FnKey<Fn>> : OpInfo<Fn> {};
template <class C, class... A>
struct KeyOf<Init<C, A...>> : InitInfo<C, A...> {};

// ---- The written-argument check (every call) ---------------------------------------------------
//
// An op that writes into a tensor argument (declared .mut(): out=, in-place tensors) would give a
// result that depends on the kernel's schedule if that tensor shared memory with another tensor
// argument, or repeated an element through a zero stride. The gate refuses such calls before the
// op runs, for every op from its declaration alone (no per-op code). It costs one load and a
// branch for ops that write nothing; for the others, one pass over their tensor arguments.

/// Throws flashinfer::Error naming the op, the written argument and the other one when a written
/// tensor (its parameter marked mutated) overlaps another of `tensors` in memory or has stride 0
/// on a dimension of size > 1. Overlap is exact memory overlap (src/core/view_overlap.h).
struct WritePlan;
void check_written_tensors(const WritePlan& plan, const CallTensor* tensors, std::size_t n);

/// What the gate reads from a declaration on every call.
struct WritePlan {
  const OpDecl* decl = nullptr;
  bool any_written = false;      // some parameter is marked mutated
  std::vector<int> field_param;  // options-struct field k: its parameter index, -1 if not taken
  std::vector<std::pair<int, int>> same_view;  // (written, input) that may be one view
  std::vector<std::pair<int, int>> inside;     // (written, input) it may lie inside (within())
};

/// The registered declaration of each op key (set when the op is declared).
template <class Key>
struct DeclSlot {
  static inline const OpDecl* decl = nullptr;
  static inline std::atomic<const WritePlan*> plan{nullptr};
};

/// The plan of an op that is called but not declared: nothing known to be written.
inline const WritePlan kUndeclaredWritePlan{};

// The tensors of one call argument: a Tensor, an optional or a vector of them, a type with
// for_each_tensor(f) (f(tensor, item); PagedKVCache), or an options struct's tensor fields.
class CallTensors {
 public:
  void add(const Tensor& t, int param, int item) {
    if (!t.defined()) return;
    const CallTensor c{&t, param, item};
    if (n_ < kInline) {
      inline_[n_++] = c;
      return;
    }
    if (more_.empty()) more_.assign(inline_, inline_ + kInline);
    more_.push_back(c);
    ++n_;
  }
  const CallTensor* data() const { return more_.empty() ? inline_ : more_.data(); }
  std::size_t size() const { return n_; }

 private:
  static constexpr std::size_t kInline = 16;
  CallTensor inline_[kInline];  // NOLINT: uninitialized on purpose (filled before read)
  std::size_t n_ = 0;
  std::vector<CallTensor> more_;
};

template <class Args>
struct LastIsOptions : std::false_type {};
template <class... A>
requires(sizeof...(A) > 0) struct LastIsOptions<std::tuple<A...>>
    : std::bool_constant<OptionsStruct<std::tuple_element_t<sizeof...(A) - 1, std::tuple<A...>>>> {
};

template <class Args>
constexpr std::size_t named_arity() {
  return std::tuple_size_v<Args> - (LastIsOptions<Args>::value ? 1 : 0);
}

template <class T>
ParamDecl param_decl_for(const std::string& name) {
  ParamDecl p(name, ArgTraits<T>::kind);
  if constexpr (requires { ArgTraits<T>::optional; }) {
    if (ArgTraits<T>::optional) p.opt();
  }
  if constexpr (requires { ArgTraits<T>::type_name; }) {
    if (ArgTraits<T>::type_name) p.type(ArgTraits<T>::type_name);
  }
  return p;
}

// The same_view_as() marks of a declaration's named parameters, as (written, input) names.
inline std::vector<std::pair<std::string, std::string>>& pending_same_view() {
  thread_local std::vector<std::pair<std::string, std::string>> v;
  return v;
}
// The within() marks likewise.
inline std::vector<std::pair<std::string, std::string>>& pending_inside() {
  thread_local std::vector<std::pair<std::string, std::string>> v;
  return v;
}

template <class T, class D>
void apply_arg(ParamDecl& p, const Arg<D>& a) {
  if (a.in_place_of) pending_same_view().emplace_back(a.name, a.in_place_of);
  if (a.in_place_of_also) pending_same_view().emplace_back(a.name, a.in_place_of_also);
  if (a.inside_of) {
    pending_inside().emplace_back(a.name, a.inside_of);
    p.within = a.inside_of;
  }
  if constexpr (!std::is_void_v<D>) {
    static_assert(std::is_constructible_v<T, D> ||
                      (std::is_same_v<T, DType> || std::is_same_v<T, std::optional<DType>>),
                  "a declared default must convert to its parameter's type");
    if (a.default_value) p.def(to_value(*a.default_value));
  }
  if (a.mutated) p.mut();
  if (a.keyword_only) p.kw();
  if (a.type_name) p.type(a.type_name);
  if (a.kind_set) p.kind = a.kind;
  if (a.no_default) p.default_value.reset();
}

// Checks, once at registration, that every default rebuilds into its parameter's type.
template <class T>
void check_default(const OpDecl& d, std::size_t i) {
  if (!d.params[i].default_value) return;
  OpDecl one;
  one.name = d.name;
  one.params = {d.params[i]};
  (void)ArgTraits<T>::get(CallArgs(one, {*d.params[i].default_value}), 0);
}

template <class S, class F>
void for_each_field(F&& f) {
  std::apply([&](const auto&... fld) { (f(fld), ...); }, option_fields<S>());
}

// Adds one keyword-only parameter per selected field of S.
template <class S>
void add_option_params(OpDecl& d, const std::vector<const char*>* only, bool in_kwargs,
                       bool keyword_only) {
  const S defaults{};
  std::vector<ParamDecl> params;
  for_each_field<S>([&](const auto& fld) {
    using M = typename std::remove_cvref_t<decltype(fld)>::type;
    ParamDecl p = param_decl_for<M>(fld.name);
    if (!p.default_value) p.def(to_value(defaults.*(fld.member)));
    if (keyword_only) p.kw();
    p.in_kwargs = in_kwargs;
    params.push_back(std::move(p));
  });
  if (!only) {
    for (auto& p : params) d.params.push_back(std::move(p));
    return;
  }
  for (const char* n : *only) {
    auto it =
        std::find_if(params.begin(), params.end(), [&](const ParamDecl& p) { return p.name == n; });
    FLASHINFER_CHECK(it != params.end(), "declare", "fields", "op '", d.name,
                     "': the options struct has no field '", n, "'");
    d.params.push_back(*it);
  }
}

// Applies a field override (field("q_data_type", "float16").kw(), ...) to the declared param.
template <class D>
void apply_field_override(OpDecl& d, const Arg<D>& a) {
  const int i = d.param_index(a.name);
  FLASHINFER_CHECK(i >= 0, "declare", "fields", "op '", d.name, "': no options field '", a.name,
                   "'");
  ParamDecl& p = d.params[static_cast<std::size_t>(i)];
  if constexpr (!std::is_void_v<D>) {
    if (a.default_value) p.default_value = to_value(*a.default_value);
  }
  if (a.mutated) p.mut();
  if (a.type_name) p.type(a.type_name);
  if (a.kind_set) p.kind = a.kind;
}

// Rebuilds S from the call's keyword values (those the declaration has).
template <class S>
S options_from(const CallArgs& a) {
  S s{};
  const OpDecl& d = a.decl();
  for_each_field<S>([&](const auto& fld) {
    using M = typename std::remove_cvref_t<decltype(fld)>::type;
    const int i = d.param_index(fld.name);
    if (i >= 0) s.*(fld.member) = ArgTraits<M>::get(a, static_cast<std::size_t>(i));
  });
  return s;
}

// Appends S's declared fields' values, in declaration order.
template <class S>
void pack_options(const OpDecl& d, std::size_t first, const S& s, std::vector<Value>& out) {
  for (std::size_t i = first; i < d.params.size(); ++i) {
    bool found = false;
    for_each_field<S>([&](const auto& fld) {
      if (!found && d.params[i].name == fld.name) {
        out.push_back(to_value(s.*(fld.member)));
        found = true;
      }
    });
  }
}

// pack_options with each field's parameter found once, at declaration (WritePlan::field_param),
// instead of by name on every observed call (a name compare per field and parameter was a fifth
// of the packing's time, session 17). By name when some parameter from `first` on is no field.
template <class S>
void pack_options_planned(const OpDecl& d, std::size_t first, const S& s, std::vector<Value>& out,
                          const std::vector<int>& field_param) {
  std::size_t taken = 0;
  for (const int p : field_param) taken += p >= static_cast<int>(first) ? 1 : 0;
  if (first + taken != d.params.size()) {
    pack_options<S>(d, first, s, out);
    return;
  }
  out.resize(d.params.size());
  std::size_t k = 0;
  for_each_field<S>([&](const auto& fld) {
    const int p = k < field_param.size() ? field_param[k] : -1;
    ++k;
    if (p >= static_cast<int>(first)) out[static_cast<std::size_t>(p)] = to_value(s.*(fld.member));
  });
}

// The values of a live call, aligned with the declaration's parameters.
template <class Key, class... A>
std::vector<Value> pack_call(const OpDecl& d, const A&... args) {
  using Args = typename KeyOf<Key>::Args;
  std::vector<Value> out;
  out.reserve(d.params.size());
  [[maybe_unused]] auto one = [&](const auto& x) {  // unused by ops without parameters
    using X = Plain<decltype(x)>;
    if constexpr (OptionsStruct<X> && LastIsOptions<Args>::value) {
      const WritePlan* plan = DeclSlot<Key>::plan.load(std::memory_order_acquire);
      if (plan && plan->decl == &d) {
        pack_options_planned<X>(d, out.size(), x, out, plan->field_param);
      } else {
        pack_options<X>(d, out.size(), x, out);
      }
    } else {
      out.push_back(live_value(x));
    }
  };
  (one(args), ...);
  return out;
}

template <class T>
decltype(auto) rebuild(const CallArgs& a, std::size_t i) {
  if constexpr (OptionsStruct<T>) {
    (void)i;
    return options_from<T>(a);
  } else {
    return ArgTraits<T>::get(a, i);
  }
}

// Runs the op from the call's Values.
template <class Key>
Value invoke(const CallArgs& a);

template <auto Fn>
struct Invoke {
  template <std::size_t... I>
  static Value run(const CallArgs& a, std::index_sequence<I...>) {
    using Info = OpInfo<Fn>;
    using Args = typename Info::Args;
    constexpr std::size_t off = std::is_void_v<typename Info::Class> ? 0 : 1;
    auto args = std::tuple<std::tuple_element_t<I, Args>...>(
        rebuild<std::tuple_element_t<I, Args>>(a, I + off)...);
    auto call = [&]() -> decltype(auto) {
      if constexpr (off) {
        return (a.object_as<typename Info::Class>(0).*Fn)(std::get<I>(args)...);
      } else {
        return Fn(std::get<I>(args)...);
      }
    };
    if constexpr (std::is_void_v<typename Info::Ret>) {
      call();
      return Value();
    } else {
      return to_value(call());
    }
  }
};

template <class C, class... A>
struct InvokeInit {
  template <std::size_t... I>
  static Value run(const CallArgs& a, std::index_sequence<I...>) {
    using Args = std::tuple<Plain<A>...>;
    auto obj = std::make_shared<C>(rebuild<std::tuple_element_t<I, Args>>(a, I + 1)...);
    ObjectRef ref;
    ref.type = std::string(obj->class_name());
    ref.repr = obj->repr();
    ref.id = obj->object_id();
    ref.object = obj;
    return Value(std::move(ref));
  }
};

template <class Key>
struct Invoker;
template <auto Fn>
struct Invoker<FnKey<Fn>> {
  static Value run(const CallArgs& a) {
    using Args = typename OpInfo<Fn>::Args;
    return Invoke<Fn>::run(a, std::make_index_sequence<std::tuple_size_v<Args>>{});
  }
};
template <class C, class... A>
struct Invoker<Init<C, A...>> {
  static Value run(const CallArgs& a) {
    return InvokeInit<C, A...>::run(a, std::index_sequence_for<A...>{});
  }
};

// declare_key's work that does not depend on the op, out of line (src/calls/declare.cpp): an
// op's instance of declare_key is then little more than a call per parameter. With the whole
// body inline, every op's instance carried it (a fifth of the op layer's code, session 53).
OpDecl begin_decl(const OpSpec& spec, const char* default_returns, bool is_method);
const OpDecl& finish_decl(OpRegistry& registry, OpDecl&& d, const OpDecl*& slot_decl,
                          std::atomic<const WritePlan*>& slot_plan,
                          const std::vector<const char*>* field_names);

// One named parameter of type T from its spec; instantiated per (T, spec type), not per op.
template <class T, class D>
[[gnu::noinline]] void append_param(OpDecl& d, const Arg<D>& a) {
  ParamDecl p = param_decl_for<T>(a.name);
  apply_arg<T>(p, a);
  d.params.push_back(std::move(p));
}
template <class T>
[[gnu::noinline]] void append_param(OpDecl& d, const char* name) {
  append_param<T>(d, arg(name));
}

// The specs after the named parameters: OnlyFields{...} and field overrides.
inline void find_only_fields(const std::vector<const char*>*& only, const OnlyFields& o) {
  only = &o.names;
}
template <class X>
void find_only_fields(const std::vector<const char*>*&, const X&) {}
inline void apply_option_spec(OpDecl&, const OnlyFields&) {}
template <class D>
void apply_option_spec(OpDecl& d, const Arg<D>& a) {
  apply_field_override(d, a);
}

// The names of S's fields, in order.
template <class S>
const std::vector<const char*>* option_field_names() {
  static const std::vector<const char*> names = [] {
    std::vector<const char*> v;
    for_each_field<S>([&](const auto& fld) { v.push_back(fld.name); });
    return v;
  }();
  return &names;
}

template <class Key, class... Specs>
const OpDecl& declare_key(OpRegistry& registry, const OpSpec& spec, const Specs&... specs) {
  using Info = KeyOf<Key>;
  using Args = typename Info::Args;
  constexpr std::size_t n_named = named_arity<Args>();
  constexpr bool has_options = LastIsOptions<Args>::value;
  constexpr std::size_t n_specs = sizeof...(Specs);
  // Leading specs name the parameters; after them, an options struct takes an optional
  // OnlyFields and field overrides.
  static_assert(n_specs >= n_named, "declare: fewer names than the function has parameters");
  static_assert(has_options || n_specs == n_named,
                "declare: more names than the function has parameters");

  OpDecl d = begin_decl(spec, ReturnName<typename Info::Ret>::value,
                        !std::is_void_v<typename Info::Class>);
  const auto spec_tuple = std::forward_as_tuple(specs...);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (append_param<std::tuple_element_t<I, Args>>(d, std::get<I>(spec_tuple)), ...);
  }
  (std::make_index_sequence<n_named>{});
  const std::vector<const char*>* field_names = nullptr;
  if constexpr (has_options) {
    using S = std::tuple_element_t<n_named, Args>;
    const std::vector<const char*>* only = nullptr;
    [&]<std::size_t... J>(std::index_sequence<J...>) {
      (find_only_fields(only, std::get<n_named + J>(spec_tuple)), ...);
    }
    (std::make_index_sequence<n_specs - n_named>{});
    add_option_params<S>(d, only, spec.var_keyword != nullptr, spec.options_keyword_only);
    [&]<std::size_t... J>(std::index_sequence<J...>) {
      (apply_option_spec(d, std::get<n_named + J>(spec_tuple)), ...);
    }
    (std::make_index_sequence<n_specs - n_named>{});
    field_names = option_field_names<S>();
  }
  // Every default must rebuild into its parameter's type (caught at registration).
  constexpr std::size_t off = std::is_void_v<typename Info::Class> ? 0 : 1;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (check_default<std::tuple_element_t<I, Args>>(d, I + off), ...);
  }
  (std::make_index_sequence<n_named>{});
  d.invoke = [](const CallArgs& a) -> Value { return Invoker<Key>::run(a); };
  return finish_decl(registry, std::move(d), DeclSlot<Key>::decl, DeclSlot<Key>::plan, field_names);
}

template <class Key>
const OpDecl& decl_of() {
  if (!DeclSlot<Key>::decl) OpRegistry::global();  // built-in ops are declared on first use
  FLASHINFER_CHECK(DeclSlot<Key>::decl != nullptr, "call_op", "", "op called before declared");
  return *DeclSlot<Key>::decl;
}

template <class Key, class Fn, class... A>
[[gnu::noinline, gnu::cold]] decltype(auto) call_op_observed(Fn&& fn, const A&... args) {
  const OpDecl& decl = decl_of<Key>();
  return run_observed(decl, std::forward<Fn>(fn), [&] { return pack_call<Key>(decl, args...); });
}

// The gate's arguments must be exactly the declared function's parameters, in order (methods and
// constructors pass their object first).
template <class Key, class... A>
constexpr bool gate_args_match() {
  using Args = typename KeyOf<Key>::Args;
  if constexpr (std::is_void_v<typename KeyOf<Key>::Class>) {
    return std::is_same_v<Args, std::tuple<Plain<A>...>>;
  } else {
    using Tail = std::tuple<Plain<A>...>;
    if constexpr (sizeof...(A) == 0) {
      return false;
    } else {
      return []<class Self, class... Rest>(std::type_identity<std::tuple<Self, Rest...>>) {
        return std::is_base_of_v<typename KeyOf<Key>::Class, Self> &&
               std::is_same_v<Args, std::tuple<Rest...>>;
      }(std::type_identity<Tail>{});
    }
  }
}

// The write plan of Key, building the registry on the first call of a built-in op.
template <class Key>
[[gnu::noinline, gnu::cold]] const WritePlan* resolve_write_plan() {
  OpRegistry::global();
  const WritePlan* plan = DeclSlot<Key>::plan.load(std::memory_order_acquire);
  return plan ? plan : &kUndeclaredWritePlan;
}

template <class T>
void collect_tensors(const T& x, int param, CallTensors& out, const WritePlan& plan) {
  if constexpr (std::is_same_v<T, Tensor>) {
    out.add(x, param, -1);
  } else if constexpr (std::is_same_v<T, std::optional<Tensor>>) {
    if (x) out.add(*x, param, -1);
  } else if constexpr (std::is_same_v<T, std::vector<Tensor>>) {
    int item = 0;
    for (const Tensor& t : x) out.add(t, param, item++);
  } else if constexpr (std::is_same_v<T, std::optional<std::vector<Tensor>>>) {
    if (x) collect_tensors(*x, param, out, plan);
  } else if constexpr (requires { x.for_each_tensor([](const Tensor&, int) {}); }) {
    x.for_each_tensor([&](const Tensor& t, int item) { out.add(t, param, item); });
  } else if constexpr (OptionsStruct<T>) {
    std::size_t k = 0;
    for_each_field<T>([&](const auto& fld) {
      const int p = k < plan.field_param.size() ? plan.field_param[k] : -1;
      ++k;
      if constexpr (!OptionsStruct<Plain<decltype(x.*(fld.member))>>) {
        if (p >= 0) collect_tensors(x.*(fld.member), p, out, plan);
      }
    });
  }
}

template <class... A>
void check_call_writes(const WritePlan& plan, const A&... args) {
  CallTensors tensors;
  int param = 0;
  (collect_tensors(args, param++, tensors, plan), ...);
  check_written_tensors(plan, tensors.data(), tensors.size());
}

template <class Key, class Fn, class... A>
inline decltype(auto) call_key(Fn&& fn, const A&... args) {
  static_assert(gate_args_match<Key, A...>(),
                "call_op: the arguments must be the declared function's parameters, in order");
  const WritePlan* plan = DeclSlot<Key>::plan.load(std::memory_order_acquire);
  if (FLASHINFER_UNLIKELY(plan == nullptr)) plan = resolve_write_plan<Key>();
  if (FLASHINFER_LIKELY(!g_call_hooks_active.load(std::memory_order_relaxed))) {
    if (plan->any_written) check_call_writes(*plan, args...);
    return std::forward<Fn>(fn)();
  }
  // Observed, a refused call is reported to the observers like any other failed call.
  return call_op_observed<Key>(
      [&]() -> decltype(auto) {
        if (plan->any_written) check_call_writes(*plan, args...);
        return std::forward<Fn>(fn)();
      },
      args...);
}

}  // namespace detail

/// Declares the free function or method `Fn` in `registry`: `specs` name its parameters in order
/// (a name, or arg(name, default).mut().kw()); when its last parameter is an options struct,
/// OnlyFields{...} and field(name, ...) overrides may follow. Returns the stored declaration.
template <auto Fn, class... Specs>
const OpDecl& declare(OpRegistry& registry, const OpSpec& spec, const Specs&... specs) {
  return detail::declare_key<detail::FnKey<Fn>>(registry, spec, specs...);
}

/// Declares the constructor of C taking A... as `C.__init__` (`self` is added).
template <class InitKey, class... Specs>
const OpDecl& declare_init(OpRegistry& registry, const OpSpec& spec, const Specs&... specs) {
  return detail::declare_key<InitKey>(registry, spec, specs...);
}

/// Runs `body` as a call of the declared op `Fn`; `args` are Fn's arguments in order (a method
/// passes *this first). Disabled, this is one relaxed atomic load and a predictable branch.
template <auto Fn, class Body, class... A>
inline decltype(auto) call_op(Body&& body, const A&... args) {
  return detail::call_key<detail::FnKey<Fn>>(std::forward<Body>(body), args...);
}

/// The constructor form of call_op: `call_init<DecodeInit>(body, *this, args...)`.
template <class InitKey, class Body, class... A>
inline decltype(auto) call_init(Body&& body, const A&... args) {
  return detail::call_key<InitKey>(std::forward<Body>(body), args...);
}

/// The declaration of `Fn` (after the registry has been built).
template <auto Fn>
const OpDecl& op_decl() {
  return detail::decl_of<detail::FnKey<Fn>>();
}

}  // namespace flashinfer
