// Value: one argument or result of a public op, as logging, recording and replay see it.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "flashinfer/dtype.h"
#include "flashinfer/tensor.h"

namespace flashinfer {

class ApiObject;

/// A Python-style enum member: `type` is the class ("PosEncodingMode"), `name` the member
/// ("ROPE_LLAMA"), `value` its value (kept as text, the way upstream records it, plus the integer
/// when it has one).
struct EnumValue {
  std::string type;
  std::string name;
  std::string value;
  friend bool operator==(const EnumValue&, const EnumValue&) = default;
};

/// A reference to a stateful API object (a wrapper's `self`). `object` owns it when the value
/// was made by replay; a live call refers to it through `raw` without owning it.
struct ObjectRef {
  std::string type;  // runtime class name
  std::string repr;  // "<flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper object at 0x...>"
  uint64_t id = 0;   // the object's stable id (self_id in records)
  std::shared_ptr<ApiObject> object;
  ApiObject* raw = nullptr;
  ApiObject* get() const { return object ? object.get() : raw; }
};

class Value {
 public:
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kDType,
    kEnum,
    kTensor,
    kList,
    kTuple,
    kDict,
    kObject
  };
  using Items = std::vector<Value>;
  using DictItems = std::vector<std::pair<Value, Value>>;

  // The constructors are out of line (src/core/value.cpp), like the special members below:
  // an inline one makes every includer instantiate the variant's destructor and its visitation.
  Value() noexcept;
  Value(std::nullopt_t) noexcept;
  Value(bool v) noexcept;
  template <std::integral T>
  requires(!std::same_as<T, bool>) Value(T v)
  noexcept : Value(IntTag{}, static_cast<int64_t>(v)) {}
  template <std::floating_point T>
  Value(T v) noexcept : Value(FloatTag{}, static_cast<double>(v)) {}
  Value(const char* v);
  Value(std::string v);
  Value(std::string_view v);
  Value(DType v) noexcept;
  Value(EnumValue v);
  Value(Tensor v);  // an undefined tensor becomes None
  Value(ObjectRef v);

  /// A tensor argument of a live call, referred to instead of copied (a copy of a Tensor costs
  /// two allocations and a reference count): valid only while `t` is. Copying the Value makes an
  /// owning tensor again, so only a moved Value can refer to `t`; the call gate packs a call's
  /// tensor arguments this way for the call's duration. An undefined tensor becomes None.
  static Value borrow(const Tensor& t);

  // Out of line, though defaulted: inline, every includer instantiated the variant's visitation
  // tables for them (clang -ftime-trace: about 1.3 s of the public header's 3.6 s, session 52).
  // Values are made only for observed calls, so unobserved calls do not pay for the calls.
  Value(const Value& other);
  Value& operator=(const Value& other);
  Value(Value&&) noexcept;
  Value& operator=(Value&&) noexcept;
  ~Value();

  static Value list(Items items);
  static Value tuple(Items items);
  static Value dict(DictItems items);

  Kind kind() const;
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_tensor() const { return kind() == Kind::kTensor; }
  bool is_sequence() const { return kind() == Kind::kList || kind() == Kind::kTuple; }

  // Typed access; each throws flashinfer::Error (kInvalidArgument) on a kind mismatch.
  bool as_bool() const;
  int64_t as_int() const;
  double as_float() const;  // ints widen
  const std::string& as_string() const;
  DType as_dtype() const;
  const EnumValue& as_enum() const;
  const Tensor& as_tensor() const;
  const Items& items() const;  // list or tuple
  const DictItems& dict_items() const;
  const ObjectRef& as_object() const;

  /// Structural equality; tensors are equal when they are the same view of the same storage.
  friend bool operator==(const Value& a, const Value& b);

  /// Python's repr() of the value for scalars, dtypes and strings; a short form for the rest.
  std::string repr() const;

 private:
  struct IntTag {};
  struct FloatTag {};
  Value(IntTag, int64_t v) noexcept;
  Value(FloatTag, double v) noexcept;
  struct Seq {
    std::shared_ptr<const Items> items;
    bool tuple;
  };
  struct Map {
    std::shared_ptr<const DictItems> items;
  };
  struct Borrowed {
    const Tensor* t;
  };
  std::variant<std::monostate, bool, int64_t, double, std::string, DType, EnumValue, Tensor, Seq,
               Map, ObjectRef, Borrowed>
      v_;
};

std::string_view value_kind_name(Value::Kind kind);

/// Python's repr() of a float: "1e-06", "0.5", "2.0", "inf", "nan".
std::string python_float_repr(double v);

// ---- to_value: how a C++ argument becomes a Value (found by ADL for user enums) ----
inline Value to_value(const Value& v) { return v; }
inline Value to_value(const Tensor& t) { return Value(t); }
inline Value to_value(bool v) { return Value(v); }
template <std::integral T>
requires(!std::same_as<T, bool>) Value to_value(T v) { return Value(v); }
template <std::floating_point T>
Value to_value(T v) {
  return Value(v);
}
inline Value to_value(const char* v) { return Value(v); }
inline Value to_value(const std::string& v) { return Value(v); }
inline Value to_value(std::string_view v) { return Value(v); }
inline Value to_value(DType v) { return Value(v); }
inline Value to_value(const EnumValue& v) { return Value(v); }
inline Value to_value(std::nullopt_t) { return Value(); }
Value to_value(const ApiObject& obj);

// The container overloads refer to each other (an optional list, a list of tuples): declared
// first so each finds the others whatever the element type.
template <class T>
Value to_value(const std::optional<T>& v);
template <class T>
Value to_value(const std::vector<T>& v);
template <class... T>
Value to_value(const std::tuple<T...>& t);
template <class A, class B>
Value to_value(const std::pair<A, B>& p);

template <class T>
Value to_value(const std::optional<T>& v) {
  if (!v) return Value();
  return to_value(*v);
}
template <class T>
Value to_value(const std::vector<T>& v) {
  Value::Items items;
  items.reserve(v.size());
  for (const auto& x : v) items.push_back(to_value(x));
  return Value::list(std::move(items));
}
template <class... T>
Value to_value(const std::tuple<T...>& t) {
  Value::Items items;
  std::apply([&](const auto&... x) { (items.push_back(to_value(x)), ...); }, t);
  return Value::tuple(std::move(items));
}
template <class A, class B>
Value to_value(const std::pair<A, B>& p) {
  return Value::tuple({to_value(p.first), to_value(p.second)});
}

}  // namespace flashinfer
