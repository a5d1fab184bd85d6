// Op declarations seen from outside the library: a user declares a free function and a
// stateful wrapper with the same mechanism the built-in ops use, and gets observation (the hook
// logging and recording use) and replay-style invocation for them.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>

#include "flashinfer/flashinfer.h"
#include "util/test_util.h"

namespace myengine {

using namespace flashinfer;

// ---- a user op: scale(x, factor=2.0, *, bias=None) -> Tensor ----
Tensor scale(const Tensor& x, double factor = 2.0, std::optional<double> bias = std::nullopt);

const OpDecl& scale_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "myengine_scale";
    decl.module = "myengine.ops";
    decl.params = {ParamDecl("x", ParamKind::kTensor),
                   ParamDecl("factor", ParamKind::kFloat).def(2.0),
                   ParamDecl("bias", ParamKind::kFloat).opt().kw()};
    decl.returns = "Tensor";
    decl.invoke = [](const CallArgs& a) -> Value {
      return scale(a.tensor(0), a.f64(1), a.optional_f64(2));
    };
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

Tensor scale(const Tensor& x, double factor, std::optional<double> bias) {
  return call_api(
      &scale_decl,
      [&] {
        FLASHINFER_CHECK(x.dtype() == DType::kFloat32, "myengine_scale", "x", "needs float32");
        std::vector<double> v = x.to_double_vector();
        for (double& e : v) e = e * factor + bias.value_or(0.0);
        return Tensor::from_vector(v, x.shape(), DType::kFloat32);
      },
      x, factor, bias);
}

// ---- a user wrapper: AccumulatorWrapper(init) with add(x) -> Tensor ----
class AccumulatorWrapper : public ApiObject {
 public:
  explicit AccumulatorWrapper(double init);
  Tensor add(const Tensor& x);
  std::string_view class_name() const override { return "AccumulatorWrapper"; }
  std::string_view module_name() const override { return "myengine.state"; }
  double total() const { return total_; }

 private:
  double total_;
};

void register_accumulator() {
  static const bool once = [] {
    OpDecl init;
    init.name = "AccumulatorWrapper.__init__";
    init.module = "myengine.state";
    init.class_name = "AccumulatorWrapper";
    init.params = {ParamDecl("self", ParamKind::kObject), ParamDecl("init", ParamKind::kFloat)};
    init.returns = "None";
    init.invoke = [](const CallArgs& a) -> Value {
      auto obj = std::make_shared<AccumulatorWrapper>(a.f64(1));
      ObjectRef ref{std::string(obj->class_name()), obj->repr(), obj->object_id(), obj, nullptr};
      return Value(std::move(ref));
    };
    register_op(std::move(init));
    OpDecl add;
    add.name = "AccumulatorWrapper.add";
    add.module = "myengine.state";
    add.class_name = "AccumulatorWrapper";
    add.params = {ParamDecl("self", ParamKind::kObject), ParamDecl("x", ParamKind::kTensor)};
    add.returns = "Tensor";
    add.invoke = [](const CallArgs& a) -> Value {
      return a.object_as<AccumulatorWrapper>(0).add(a.tensor(1));
    };
    register_op(std::move(add));
    return true;
  }();
  (void)once;
}

const OpDecl& acc_init_decl() {
  register_accumulator();
  return *OpRegistry::global().find("AccumulatorWrapper.__init__");
}
const OpDecl& acc_add_decl() {
  register_accumulator();
  return *OpRegistry::global().find("AccumulatorWrapper.add");
}

AccumulatorWrapper::AccumulatorWrapper(double init) : total_(init) {
  call_api(
      &acc_init_decl, [] {}, *this, init);
}

Tensor AccumulatorWrapper::add(const Tensor& x) {
  return call_api(
      &acc_add_decl,
      [&] {
        for (double v : x.to_double_vector()) total_ += v;
        return Tensor::full({1}, total_, DType::kFloat32);
      },
      *this, x);
}

// ---- a user op that writes: add_into(x, y, out) (out = x + y) ----
const OpDecl& add_into_decl() {
  static const OpDecl& d = [] {
    OpDecl decl;
    decl.name = "myengine_add_into";
    decl.module = "myengine.ops";
    decl.params = {ParamDecl("x", ParamKind::kTensor), ParamDecl("y", ParamKind::kTensor),
                   ParamDecl("out", ParamKind::kTensor).mut()};
    decl.returns = "None";
    return std::cref(register_op(std::move(decl)));
  }();
  return d;
}

void add_into(const Tensor& x, const Tensor& y, Tensor& out) {
  call_api(
      &add_into_decl,
      [&] {
        float* o = out.data<float>();
        const float* a = x.data<float>();
        const float* b = y.data<float>();
        for (int64_t i = 0; i < out.numel(); ++i) o[i] = a[i] + b[i];
      },
      x, y, out);
}

}  // namespace myengine

namespace flashinfer {
namespace {

// Records every observed call.
struct Recorder : CallObserver {
  struct Call {
    std::string name;
    std::vector<Value> args;
    Value result;
    std::string error;
    bool ended = false;
  };
  std::mutex mu;
  std::vector<Call> calls;
  void on_call_begin(const OpDecl& d, std::span<const Value> args) override {
    std::lock_guard<std::mutex> l(mu);
    calls.push_back({d.name, {args.begin(), args.end()}, Value(), "", false});
  }
  void on_call_end(const OpDecl&, std::span<const Value>, const Value& r) override {
    std::lock_guard<std::mutex> l(mu);
    calls.back().result = r;
    calls.back().ended = true;
  }
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view what) override {
    std::lock_guard<std::mutex> l(mu);
    calls.back().error = std::string(what);
  }
};

struct ScopedObserver {
  std::shared_ptr<CallObserver> obs;
  explicit ScopedObserver(std::shared_ptr<CallObserver> o) : obs(std::move(o)) {
    add_call_observer(obs);
  }
  ~ScopedObserver() { remove_call_observer(obs); }
};

TEST(OpDecl, BuiltinRmsnormDeclaration) {
  const OpDecl* d = OpRegistry::global().find("rmsnorm");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->module, "flashinfer.norm");
  EXPECT_FALSE(d->is_method());
  EXPECT_EQ(d->signature(), "(input, weight, eps=1e-06, out=None, enable_pdl=None)");
  ASSERT_EQ(d->params.size(), 5u);
  EXPECT_EQ(d->params[2].kind, ParamKind::kFloat);
  EXPECT_TRUE(d->params[3].optional);
  EXPECT_EQ(d->param_index("out"), 3);
  EXPECT_EQ(d->param_index("nope"), -1);
  EXPECT_TRUE(d->invoke != nullptr);
}

TEST(OpDecl, UserOpIsListedObservedAndInvocable) {
  using myengine::scale;
  using myengine::scale_decl;
  const OpDecl& d = scale_decl();
  EXPECT_EQ(d.signature(), "(x, factor=2.0, *, bias=None)");
  bool listed = false;
  for (const OpDecl* op : OpRegistry::global().ops()) listed |= op->name == "myengine_scale";
  EXPECT_TRUE(listed);

  auto rec = std::make_shared<Recorder>();
  Tensor x = Tensor::from_vector({1, 2}, {2}, DType::kFloat32);
  {
    ScopedObserver s(rec);
    Tensor y = scale(x, 3.0, 0.5);
    EXPECT_EQ(y.to_double_vector(), (std::vector<double>{3.5, 6.5}));
  }
  ASSERT_EQ(rec->calls.size(), 1u);
  const auto& c = rec->calls[0];
  EXPECT_EQ(c.name, "myengine_scale");
  ASSERT_EQ(c.args.size(), 3u);
  EXPECT_TRUE(c.args[0].is_tensor());
  EXPECT_EQ(c.args[1].as_float(), 3.0);
  EXPECT_EQ(c.args[2].as_float(), 0.5);
  EXPECT_TRUE(c.ended);
  EXPECT_EQ(c.result.as_tensor().to_double_vector(), (std::vector<double>{3.5, 6.5}));

  // Replay-style: bind positional + keyword values to the declaration and invoke.
  auto values = bind_arguments(d, {Value(x)}, {{"bias", Value(1.0)}});
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(values[1].as_float(), 2.0);  // default filled in
  Value r = d.invoke(CallArgs(d, values));
  EXPECT_EQ(r.as_tensor().to_double_vector(), (std::vector<double>{3.0, 5.0}));

  // With no observer installed nothing is recorded.
  scale(x);
  EXPECT_EQ(rec->calls.size(), 1u);
}

TEST(OpDecl, ErrorsPropagateAndAreObserved) {
  auto rec = std::make_shared<Recorder>();
  ScopedObserver s(rec);
  Tensor bad = Tensor::zeros({2}, DType::kInt32);
  EXPECT_FI_ERROR(myengine::scale(bad), "myengine_scale", "x");
  ASSERT_EQ(rec->calls.size(), 1u);
  EXPECT_FALSE(rec->calls[0].ended);
  EXPECT_NE(rec->calls[0].error.find("needs float32"), std::string::npos);
}

namespace shown {
struct Shown {
  int v;
};
std::ostream& operator<<(std::ostream& os, const Shown& x) { return os << "Shown(" << x.v << ")"; }
}  // namespace shown

// A failed check's message is its parts streamed in order: literals, C strings (a null one
// printed as "(null)"), std::string, string_view, integers, floating point, and any type with an
// operator<<.
TEST(OpDecl, CheckMessagesStreamEveryPartInOrder) {
  const std::string s = "str";
  const std::string_view sv = "view";
  const char* cstr = "cstr";
  const char* null_cstr = nullptr;
  char buffer[8] = "buf";
  try {
    FLASHINFER_CHECK(false, "the_op", "the_arg", "lit ", s, ' ', sv, ' ', cstr, ' ', null_cstr, ' ',
                     buffer, ' ', 42, ' ', -7L, ' ', 2.5, ' ', std::size_t{3}, ' ', true, ' ',
                     shown::Shown{5});
    FAIL() << "no error";
  } catch (const flashinfer::Error& e) {
    EXPECT_EQ(e.code(), flashinfer::ErrorCode::kInvalidArgument);
    EXPECT_EQ(e.op(), "the_op");
    EXPECT_EQ(e.arg(), "the_arg");
    EXPECT_EQ(e.detail(), "lit str view cstr (null) buf 42 -7 2.5 3 1 Shown(5)");
  }
  try {
    FLASHINFER_FAIL(flashinfer::ErrorCode::kUnsupported, "op2", "");
  } catch (const flashinfer::Error& e) {
    EXPECT_EQ(e.code(), flashinfer::ErrorCode::kUnsupported);
    EXPECT_EQ(e.detail(), "");
  }
}

TEST(OpDecl, WrapperMethodsShareAStableObjectId) {
  auto rec = std::make_shared<Recorder>();
  ScopedObserver s(rec);
  myengine::AccumulatorWrapper acc(1.0);
  acc.add(Tensor::from_vector({2, 3}, {2}, DType::kFloat32));
  Tensor t = acc.add(Tensor::from_vector({4}, {1}, DType::kFloat32));
  EXPECT_EQ(t.item(), 10.0);
  ASSERT_EQ(rec->calls.size(), 3u);
  EXPECT_EQ(rec->calls[0].name, "AccumulatorWrapper.__init__");
  EXPECT_EQ(rec->calls[1].name, "AccumulatorWrapper.add");
  const ObjectRef& self0 = rec->calls[0].args[0].as_object();
  EXPECT_EQ(self0.type, "AccumulatorWrapper");
  EXPECT_EQ(self0.id, acc.object_id());
  EXPECT_EQ(rec->calls[2].args[0].as_object().id, acc.object_id());
  // Python's repr: the address in lowercase hex after 0x, as %p writes it.
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%llx", static_cast<unsigned long long>(acc.object_id()));
  EXPECT_EQ(self0.repr, std::string("<myengine.state.AccumulatorWrapper object at 0x") + hex + ">");
  myengine::AccumulatorWrapper other(0.0);
  EXPECT_NE(other.object_id(), acc.object_id());
}

TEST(OpDecl, WrapperReplaysFromValues) {
  const OpDecl& init = myengine::acc_init_decl();
  const OpDecl& add = myengine::acc_add_decl();
  // __init__ gets a placeholder self (the recorded one) and returns the new live object.
  Value obj = init.invoke(CallArgs(init, bind_arguments(init, {Value(), Value(5.0)})));
  ASSERT_EQ(obj.kind(), Value::Kind::kObject);
  ASSERT_NE(obj.as_object().get(), nullptr);
  Value r = add.invoke(
      CallArgs(add, bind_arguments(add, {obj, Value(Tensor::full({3}, 1.0, DType::kFloat32))})));
  EXPECT_EQ(r.as_tensor().item(), 8.0);
  // A method invoked with something that is not a live object fails cleanly.
  EXPECT_FI_ERROR(add.invoke(CallArgs(add, {Value(), Value(Tensor::zeros({1}, DType::kFloat32))})),
                  "AccumulatorWrapper.add", "self");
}

// An object of another class, for the wrong-self case below.
class OtherObject : public ApiObject {
 public:
  std::string_view class_name() const override { return "OtherObject"; }
  std::string_view module_name() const override { return "myengine.state"; }
};

// A method rebuilt from Values whose self is a non-owning reference (what an observer captures
// from a live call) fails with an Error naming the op and `self` once that object is destroyed,
// or when it is of another class: never a dynamic_cast on freed memory.
TEST(OpDecl, WrapperMethodRefusesADestroyedOrForeignSelf) {
  const OpDecl& add = myengine::acc_add_decl();
  const Value x(Tensor::full({1}, 1.0, DType::kFloat32));
  Value self;
  {
    myengine::AccumulatorWrapper acc(2.0);
    self = to_value(acc);
    EXPECT_TRUE(api_object_live(&acc));
    EXPECT_EQ(add.invoke(CallArgs(add, {self, x})).as_tensor().item(), 3.0);
  }
  EXPECT_FALSE(api_object_live(self.as_object().raw));
  EXPECT_FI_ERROR(add.invoke(CallArgs(add, {self, x})), "AccumulatorWrapper.add", "self");
  try {
    add.invoke(CallArgs(add, {self, x}));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("destroyed"), std::string::npos) << e.what();
  }
  OtherObject other;
  EXPECT_FI_ERROR(add.invoke(CallArgs(add, {to_value(other), x})), "AccumulatorWrapper.add",
                  "self");
  // A copy is an object of its own, live until it is destroyed.
  auto copy = std::make_unique<OtherObject>(other);
  const ApiObject* copy_addr = copy.get();
  EXPECT_TRUE(api_object_live(copy_addr));
  copy.reset();
  EXPECT_FALSE(api_object_live(copy_addr));
  EXPECT_TRUE(api_object_live(&other));
}

TEST(OpDecl, BindArgumentsRejectsBadCalls) {
  const OpDecl& d = myengine::scale_decl();
  EXPECT_FI_ERROR(bind_arguments(d, {}), "myengine_scale", "x");
  EXPECT_FI_ERROR(bind_arguments(d, {Value(1), Value(2), Value(3), Value(4)}), "myengine_scale",
                  "");
  EXPECT_FI_ERROR(bind_arguments(d, {Value(1)}, {{"nope", Value(1)}}), "myengine_scale", "nope");
  EXPECT_FI_ERROR(bind_arguments(d, {Value(1)}, {{"x", Value(1)}}), "myengine_scale", "x");
  EXPECT_FI_ERROR(CallArgs(d, {Value("str"), Value(1.0), Value()}).tensor(0), "myengine_scale",
                  "x");
}

// An IntEnum member where the signature says int (vLLM and SGLang pass their RoutingMethodType /
// ActivationType members; upstream's recorder writes them as {"type": "enum", "value": 1}): its
// integer value, as Python's IntEnum is an int. An enum without an integer value names the
// argument.
TEST(OpDecl, IntParameterTakesAnIntEnumMember) {
  const OpDecl* d = OpRegistry::global().find("shuffle_matrix_a");
  ASSERT_NE(d, nullptr);
  Tensor x = Tensor::empty({64, 4}, DType::kUInt8);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<uint8_t>()[i] = static_cast<uint8_t>(i);
  const Value by_int = d->invoke(CallArgs(*d, bind_arguments(*d, {Value(x), Value(128)})));
  const Value by_enum = d->invoke(
      CallArgs(*d, bind_arguments(*d, {Value(x), Value(EnumValue{"TileSize", "Wide", "128"})})));
  EXPECT_EQ(by_enum.as_tensor().to_double_vector(), by_int.as_tensor().to_double_vector());
  EXPECT_FI_ERROR(
      d->invoke(CallArgs(*d, bind_arguments(*d, {Value(x), Value(EnumValue{"Mode", "B", "bee"})}))),
      "shuffle_matrix_a", "epilogue_tile_m");
}

TEST(OpDecl, RegistryRejectsMalformedDeclarations) {
  OpDecl dup;
  dup.name = "rmsnorm";
  dup.module = "x";
  EXPECT_THROW(register_op(dup), Error);
  OpDecl no_self;
  no_self.name = "W.run";
  no_self.module = "x";
  no_self.class_name = "W";
  no_self.params = {ParamDecl("x", ParamKind::kTensor)};
  EXPECT_THROW(register_op(no_self), Error);
  OpDecl order;
  order.name = "bad_order";
  order.module = "x";
  order.params = {ParamDecl("a", ParamKind::kInt).def(1), ParamDecl("b", ParamKind::kInt)};
  EXPECT_THROW(register_op(order), Error);
  EXPECT_EQ(OpRegistry::global().find("bad_order"), nullptr);
}

// An observer that throws never breaks the call it observes.
struct Throwing : CallObserver {
  void on_call_begin(const OpDecl&, std::span<const Value>) override {
    throw std::runtime_error("x");
  }
  void on_call_end(const OpDecl&, std::span<const Value>, const Value&) override {
    throw std::runtime_error("y");
  }
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view) override {}
};

TEST(OpDecl, ThrowingObserverDoesNotAlterTheResult) {
  ScopedObserver s(std::make_shared<Throwing>());
  Tensor x = Tensor::from_vector({3, 4}, {1, 2}, DType::kFloat32);
  Tensor w = Tensor::from_vector({1, 1}, {2}, DType::kFloat32);
  Tensor y = rmsnorm(x, w, 0.0);
  EXPECT_NEAR(y.to_double_vector()[0], 3.0 / std::sqrt(12.5), 1e-6);
}

TEST(Value, PythonReprs) {
  EXPECT_EQ(python_float_repr(1e-6), "1e-06");
  EXPECT_EQ(python_float_repr(2.0), "2.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(-3.25), "-3.25");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1.5e-5), "1.5e-05");
  EXPECT_EQ(Value("NHD").repr(), "'NHD'");
  EXPECT_EQ(Value("it's").repr(), "\"it's\"");
  EXPECT_EQ(Value(true).repr(), "True");
  EXPECT_EQ(Value().repr(), "None");
  EXPECT_EQ(Value(DType::kBFloat16).repr(), "torch.bfloat16");
  EXPECT_EQ(Value::tuple({Value(1)}).repr(), "(1,)");
  EXPECT_EQ(Value::list({Value(1), Value(2.5)}).repr(), "[1, 2.5]");
  EXPECT_EQ(to_value(std::vector<int>{1, 2}).items().size(), 2u);
  EXPECT_TRUE(to_value(std::optional<Tensor>()).is_none());
  EXPECT_TRUE(Value(Tensor()).is_none());
  EXPECT_THROW(Value(1).as_string(), Error);
  EXPECT_EQ(Value(3).as_float(), 3.0);
}

// The gate packs a live call's tensor arguments as borrowed Values (no copy of the Tensor); a
// copy of such a Value owns its tensor, so an observer that keeps one can use it after the call,
// when the caller's tensors are gone.
TEST(Value, ABorrowedTensorIsCopiedAsAnOwningOne) {
  auto t = std::make_unique<Tensor>(Tensor::from_vector({1, 2}, {2}, DType::kFloat32));
  Value b = Value::borrow(*t);
  ASSERT_TRUE(b.is_tensor());
  EXPECT_EQ(&b.as_tensor(), t.get());  // referred to, not copied
  EXPECT_EQ(b, Value(*t));             // the same view as an owning Value of it
  const Value c = b;
  Value d;
  d = b;
  EXPECT_NE(&c.as_tensor(), t.get());
  EXPECT_NE(&d.as_tensor(), t.get());
  const Value m = std::move(b);  // a move still refers to it
  EXPECT_EQ(&m.as_tensor(), t.get());
  const Value seq = Value::tuple({m});  // an item is a copy
  EXPECT_NE(&seq.items()[0].as_tensor(), t.get());
  t.reset();
  for (const Value* v : {&c, static_cast<const Value*>(&d), &seq.items()[0]}) {
    EXPECT_EQ(v->as_tensor().to_double_vector(), (std::vector<double>{1, 2}));
  }
  EXPECT_TRUE(Value::borrow(Tensor()).is_none());
}

TEST(OpDecl, AnObserversCopiesOfTheArgumentsOutliveTheCall) {
  auto rec = std::make_shared<Recorder>();
  {
    ScopedObserver s(rec);
    const Tensor x = Tensor::from_vector({1, 2}, {1, 2}, DType::kFloat32);
    const Tensor w = Tensor::from_vector({1, 1}, {2}, DType::kFloat32);
    rmsnorm(x, w, 0.0);
  }
  ASSERT_EQ(rec->calls.size(), 1u);
  const auto& c = rec->calls[0];
  ASSERT_TRUE(c.ended);
  EXPECT_EQ(c.args[0].as_tensor().to_double_vector(), (std::vector<double>{1, 2}));
  EXPECT_EQ(c.args[1].as_tensor().to_double_vector(), (std::vector<double>{1, 1}));
  EXPECT_EQ(c.result.as_tensor().numel(), 2);
}

// The observers installed when a call begins see its end too, even one removed meanwhile.
struct RemovesItself : CallObserver, std::enable_shared_from_this<RemovesItself> {
  int begins = 0, ends = 0;
  void on_call_begin(const OpDecl&, std::span<const Value>) override {
    ++begins;
    remove_call_observer(shared_from_this());
  }
  void on_call_end(const OpDecl&, std::span<const Value>, const Value&) override { ++ends; }
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view) override {}
};

TEST(OpDecl, AnObserverRemovedDuringACallSeesItsEnd) {
  auto obs = std::make_shared<RemovesItself>();
  add_call_observer(obs);
  const Tensor x = Tensor::from_vector({3, 4}, {1, 2}, DType::kFloat32);
  const Tensor w = Tensor::from_vector({1, 1}, {2}, DType::kFloat32);
  rmsnorm(x, w, 0.0);
  rmsnorm(x, w, 0.0);
  EXPECT_EQ(obs->begins, 1);
  EXPECT_EQ(obs->ends, 1);
}

// An op declared outside the library gets the gate's written-argument check from its `.mut()`
// marks, like the built-in ones: an `out` overlapping an input, or broadcast, is refused before
// the body runs, naming both arguments.
TEST(OpDecl, UserOpWrittenArgumentsAreChecked) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {4}, DType::kFloat32);
  Tensor y = Tensor::from_vector(std::vector<double>{10, 20, 30, 40}, {4}, DType::kFloat32);
  Tensor out = Tensor::zeros({4}, DType::kFloat32);
  ::myengine::add_into(x, y, out);
  EXPECT_EQ(out.to_double_vector(), (std::vector<double>{11, 22, 33, 44}));

  Tensor big = Tensor::zeros({8}, DType::kFloat32);
  Tensor lo = big.slice(0, 0, 4), mid = big.slice(0, 2, 6);
  try {
    ::myengine::add_into(lo, y, mid);
    FAIL() << "an out overlapping x was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("myengine_add_into"), std::string::npos) << what;
    EXPECT_NE(what.find("out"), std::string::npos) << what;
    EXPECT_NE(what.find("'x'"), std::string::npos) << what;
  }
  EXPECT_EQ(big.to_double_vector(), std::vector<double>(8, 0.0)) << "the body ran";
  Tensor bcast = Tensor::zeros({1}, DType::kFloat32).as_strided({4}, {0}, 0);
  EXPECT_THROW(::myengine::add_into(x, y, bcast), Error);
  // Observed, the refused call is reported to the observers as a failed call.
  auto rec = std::make_shared<Recorder>();
  {
    ScopedObserver s(rec);
    EXPECT_THROW(::myengine::add_into(lo, y, mid), Error);
  }
  ASSERT_EQ(rec->calls.size(), 1u);
  EXPECT_NE(rec->calls[0].error.find("must not overlap"), std::string::npos) << rec->calls[0].error;
  EXPECT_FALSE(rec->calls[0].ended);
}

}  // namespace
}  // namespace flashinfer
