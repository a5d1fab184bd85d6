#include "flashinfer/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "flashinfer/error.h"
#include "flashinfer/op_decl.h"

namespace flashinfer {

Value::Value() noexcept = default;
Value::Value(std::nullopt_t) noexcept {}
Value::Value(bool v) noexcept : v_(v) {}
Value::Value(IntTag, int64_t v) noexcept : v_(v) {}
Value::Value(FloatTag, double v) noexcept : v_(v) {}
Value::Value(const char* v) : v_(std::string(v)) {}
Value::Value(std::string v) : v_(std::move(v)) {}
Value::Value(std::string_view v) : v_(std::string(v)) {}
Value::Value(DType v) noexcept : v_(v) {}
Value::Value(EnumValue v) : v_(std::move(v)) {}
Value::Value(ObjectRef v) : v_(std::move(v)) {}

Value::Value(Tensor v) {
  if (v.defined()) v_ = std::move(v);
}

Value Value::borrow(const Tensor& t) {
  Value v;
  if (t.defined()) v.v_ = Borrowed{&t};
  return v;
}

Value::Value(const Value& other) {
  if (const auto* b = std::get_if<Borrowed>(&other.v_)) {
    v_ = *b->t;
  } else {
    v_ = other.v_;
  }
}

Value& Value::operator=(const Value& other) {
  if (this != &other) *this = Value(other);  // the copy constructor makes a borrowed one owning
  return *this;
}

Value::Value(Value&&) noexcept = default;
Value& Value::operator=(Value&&) noexcept = default;
Value::~Value() = default;

Value Value::list(Items items) {
  Value v;
  v.v_ = Seq{std::make_shared<const Items>(std::move(items)), false};
  return v;
}

Value Value::tuple(Items items) {
  Value v;
  v.v_ = Seq{std::make_shared<const Items>(std::move(items)), true};
  return v;
}

Value Value::dict(DictItems items) {
  Value v;
  v.v_ = Map{std::make_shared<const DictItems>(std::move(items))};
  return v;
}

Value::Kind Value::kind() const {
  switch (v_.index()) {
    case 0:
      return Kind::kNone;
    case 1:
      return Kind::kBool;
    case 2:
      return Kind::kInt;
    case 3:
      return Kind::kFloat;
    case 4:
      return Kind::kString;
    case 5:
      return Kind::kDType;
    case 6:
      return Kind::kEnum;
    case 7:
      return Kind::kTensor;
    case 8:
      return std::get<Seq>(v_).tuple ? Kind::kTuple : Kind::kList;
    case 9:
      return Kind::kDict;
    case 10:
      return Kind::kObject;
    default:
      return Kind::kTensor;  // Borrowed
  }
}

std::string_view value_kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kDType:
      return "dtype";
    case Value::Kind::kEnum:
      return "enum";
    case Value::Kind::kTensor:
      return "Tensor";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kTuple:
      return "tuple";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kObject:
      return "object";
  }
  return "?";
}

namespace {
[[noreturn]] void wrong_kind(Value::Kind have, std::string_view want) {
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "Value", "", "expected ", want, ", got ",
                  value_kind_name(have));
}
}  // namespace

bool Value::as_bool() const {
  if (auto* p = std::get_if<bool>(&v_)) return *p;
  wrong_kind(kind(), "bool");
}
int64_t Value::as_int() const {
  if (auto* p = std::get_if<int64_t>(&v_)) return *p;
  wrong_kind(kind(), "int");
}
double Value::as_float() const {
  if (auto* p = std::get_if<double>(&v_)) return *p;
  if (auto* p = std::get_if<int64_t>(&v_)) return static_cast<double>(*p);
  wrong_kind(kind(), "float");
}
const std::string& Value::as_string() const {
  if (auto* p = std::get_if<std::string>(&v_)) return *p;
  wrong_kind(kind(), "str");
}
DType Value::as_dtype() const {
  if (auto* p = std::get_if<DType>(&v_)) return *p;
  wrong_kind(kind(), "dtype");
}
const EnumValue& Value::as_enum() const {
  if (auto* p = std::get_if<EnumValue>(&v_)) return *p;
  wrong_kind(kind(), "enum");
}
const Tensor& Value::as_tensor() const {
  if (auto* p = std::get_if<Tensor>(&v_)) return *p;
  if (auto* p = std::get_if<Borrowed>(&v_)) return *p->t;
  wrong_kind(kind(), "Tensor");
}
const Value::Items& Value::items() const {
  if (auto* p = std::get_if<Seq>(&v_)) return *p->items;
  wrong_kind(kind(), "list or tuple");
}
const Value::DictItems& Value::dict_items() const {
  if (auto* p = std::get_if<Map>(&v_)) return *p->items;
  wrong_kind(kind(), "dict");
}
const ObjectRef& Value::as_object() const {
  if (auto* p = std::get_if<ObjectRef>(&v_)) return *p;
  wrong_kind(kind(), "object");
}

bool operator==(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kBool:
      return a.as_bool() == b.as_bool();
    case Value::Kind::kInt:
      return a.as_int() == b.as_int();
    case Value::Kind::kFloat:
      return a.as_float() == b.as_float();
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kDType:
      return a.as_dtype() == b.as_dtype();
    case Value::Kind::kEnum:
      return a.as_enum() == b.as_enum();
    case Value::Kind::kTensor: {
      const Tensor& x = a.as_tensor();
      const Tensor& y = b.as_tensor();
      return x.storage() == y.storage() && x.shape() == y.shape() && x.strides() == y.strides() &&
             x.storage_offset() == y.storage_offset() && x.dtype() == y.dtype();
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return a.items() == b.items();
    case Value::Kind::kDict:
      return a.dict_items() == b.dict_items();
    case Value::Kind::kObject:
      return a.as_object().id == b.as_object().id;
  }
  return false;
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Shortest round-tripping digits, then Python's layout: scientific when the decimal exponent
  // is < -4 or >= 16, else positional with at least one digit after the point.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const auto epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp = std::stoi(sci.substr(epos + 1));
  bool neg = false;
  if (!mant.empty() && mant[0] == '-') {
    neg = true;
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += e;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
  } else {
    const auto intlen = static_cast<std::size_t>(exp) + 1;
    if (digits.size() <= intlen) {
      out = digits + std::string(intlen - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, intlen) + "." + digits.substr(intlen);
    }
  }
  return neg ? "-" + out : out;
}

namespace {
std::string python_str_repr(const std::string& s) {
  // Python prefers single quotes unless the text has one and no double quote.
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}
}  // namespace

std::string Value::repr() const {
  switch (kind()) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kFloat:
      return python_float_repr(as_float());
    case Kind::kString:
      return python_str_repr(as_string());
    case Kind::kDType:
      return std::string(dtype_torch_name(as_dtype()));
    case Kind::kEnum:
      return "<" + as_enum().type + "." + as_enum().name + ": " + as_enum().value + ">";
    case Kind::kTensor:
      return as_tensor().describe();
    case Kind::kList:
    case Kind::kTuple: {
      const bool tuple = kind() == Kind::kTuple;
      std::string s = tuple ? "(" : "[";
      const auto& it = items();
      for (std::size_t i = 0; i < it.size(); ++i) {
        if (i) s += ", ";
        s += it[i].repr();
      }
      if (tuple && it.size() == 1) s += ",";
      s += tuple ? ")" : "]";
      return s;
    }
    case Kind::kDict: {
      std::string s = "{";
      bool first = true;
      for (const auto& [k, v] : dict_items()) {
        if (!first) s += ", ";
        first = false;
        s += k.repr() + ": " + v.repr();
      }
      return s + "}";
    }
    case Kind::kObject:
      return as_object().repr;
  }
  return "?";
}

Value to_value(const ApiObject& obj) {
  ObjectRef ref;
  ref.type = std::string(obj.class_name());
  ref.repr = obj.repr();
  ref.id = obj.object_id();
  ref.raw = const_cast<ApiObject*>(&obj);
  return Value(std::move(ref));
}

}  // namespace flashinfer
