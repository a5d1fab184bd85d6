// The one gate every public op goes through. Disabled (no observer, level 0) it costs one
// relaxed atomic load and a predictable branch; arguments are packed into Values only on the
// slow path, out of line.
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// Sees every outermost public call while installed: the API logger (levels 1/3/5) and the
/// flight recorder (level 10) are observers, and so can an engine's own tracer be. Arguments are
/// aligned with the declaration's parameters. Exceptions thrown by an observer are swallowed: an
/// observer never changes or breaks the call it observes.
class CallObserver {
 public:
  virtual ~CallObserver() = default;
  virtual void on_call_begin(const OpDecl& decl, std::span<const Value> args) = 0;
  virtual void on_call_end(const OpDecl& decl, std::span<const Value> args,
                           const Value& result) = 0;
  /// The op threw; the exception propagates to the caller after this returns.
  virtual void on_call_error(const OpDecl& decl, std::span<const Value> args,
                             std::string_view what) = 0;
  /// Whether this observer wants calls of `decl` at all. When no installed observer does, the
  /// call is not observed and its arguments are never packed into Values (so a call the
  /// recorder's include/exclude filter rejects costs next to nothing). Default: every call.
  virtual bool wants(const OpDecl& decl) {
    (void)decl;
    return true;
  }
};

/// Installs `observer`. Observers with a lower `priority` see a call's begin earlier and its end
/// later (they wrap the others); equal priorities keep installation order. The flight recorder
/// uses -100 so its dump messages enclose the API logger's records, as upstream's do.
void add_call_observer(std::shared_ptr<CallObserver> observer, int priority = 0);
void remove_call_observer(const std::shared_ptr<CallObserver>& observer);

/// While alive, public calls on this thread are not observed (replay uses it, so replaying a
/// session neither logs nor records it again).
class ScopedUnobserved {
 public:
  ScopedUnobserved();
  ~ScopedUnobserved();
  ScopedUnobserved(const ScopedUnobserved&) = delete;
  ScopedUnobserved& operator=(const ScopedUnobserved&) = delete;
};

namespace detail {

/// True while at least one observer is installed.
extern std::atomic<bool> g_call_hooks_active;

/// Whether a call of `decl` starting now on this thread is to be observed: it is the outermost
/// public call and some installed observer wants it.
bool call_wanted(const OpDecl& decl);

/// The extent of a public call that is not observed: calls made inside it are not outermost.
class UnobservedCallScope {
 public:
  UnobservedCallScope();
  ~UnobservedCallScope();
  UnobservedCallScope(const UnobservedCallScope&) = delete;
  UnobservedCallScope& operator=(const UnobservedCallScope&) = delete;
};

using DeclFn = const OpDecl& (*)();

/// One tensor of a live call.
struct CallTensor {
  const Tensor* tensor;
  int param;  // index into OpDecl::params
  int item;   // position inside a pair or list argument; -1: the argument itself
};

/// The gate's written-argument check for ops declared with register_op and called through
/// call_api (call_op has its own, with the typed declaration's plan): an Error naming the op and
/// both arguments when a tensor of a parameter marked mutated overlaps another tensor argument
/// or repeats elements through stride 0 (src/calls/written_args.cpp).
void check_api_written(const OpDecl& decl, const CallTensor* tensors, std::size_t n);

inline bool decl_writes(const OpDecl& decl) {
  for (const ParamDecl& p : decl.params)
    if (p.mutated) return true;
  return false;
}

template <class T>
void api_call_tensors(const T& x, int param, std::vector<CallTensor>& out) {
  if constexpr (std::is_same_v<T, Tensor>) {
    if (x.defined()) out.push_back({&x, param, -1});
  } else if constexpr (std::is_same_v<T, std::optional<Tensor>>) {
    if (x && x->defined()) out.push_back({&*x, param, -1});
  } else if constexpr (std::is_same_v<T, std::vector<Tensor>>) {
    int item = 0;
    for (const Tensor& t : x) {
      if (t.defined()) out.push_back({&t, param, item});
      ++item;
    }
  } else if constexpr (std::is_same_v<T, std::optional<std::vector<Tensor>>>) {
    if (x) api_call_tensors(*x, param, out);
  } else if constexpr (requires { x.for_each_tensor([](const Tensor&, int) {}); }) {
    x.for_each_tensor([&](const Tensor& t, int item) {
      if (t.defined()) out.push_back({&t, param, item});
    });
  }
}

template <class... Args>
[[gnu::noinline]] void check_api_writes(const OpDecl& decl, const Args&... args) {
  std::vector<CallTensor> tensors;
  int param = 0;
  (api_call_tensors(args, param++, tensors), ...);
  check_api_written(decl, tensors.data(), tensors.size());
}

// Whether any argument type can hold a tensor (otherwise the check compiles away).
template <class T>
inline constexpr bool may_hold_tensor = std::is_same_v<T, Tensor> ||
                                        std::is_same_v<T, std::optional<Tensor>> ||
                                        std::is_same_v<T, std::vector<Tensor>> ||
                                        std::is_same_v<T, std::optional<std::vector<Tensor>>> ||
                                        requires(const T& x) {
  x.for_each_tensor([](const Tensor&, int) {});
};

/// One observed call. Only the outermost public call on a thread is observed: an op that calls
/// another public op internally is recorded once, as itself.
class ObservedCall {
 public:
  ObservedCall(const OpDecl& decl, std::vector<Value> args);
  ~ObservedCall();
  bool active() const { return active_; }
  void finish(const Value& result);
  void fail(std::string_view what);

 private:
  const OpDecl* decl_;
  std::vector<Value> args_;
  // The observers installed when the call began (call_wanted's list): its begin, end and error
  // go to the same ones, and the list is taken once per call.
  std::shared_ptr<const std::vector<std::shared_ptr<CallObserver>>> observers_;
  bool active_;
};

/// A live call's argument as a Value: a tensor is borrowed (Value::borrow) for the call's
/// duration, since the call's arguments outlive its observers' hooks.
template <class T>
Value live_value(const T& x) {
  if constexpr (std::is_same_v<T, Tensor>) {
    return Value::borrow(x);
  } else if constexpr (std::is_same_v<T, std::optional<Tensor>>) {
    return x ? Value::borrow(*x) : Value();
  } else {
    return to_value(x);
  }
}

/// Runs `fn` as an observed call of `decl` when some observer wants it; `pack()` gives the
/// arguments as Values, aligned with the declaration (called only then).
template <class Fn, class Pack>
[[gnu::noinline, gnu::cold]] decltype(auto) run_observed(const OpDecl& decl, Fn&& fn, Pack&& pack) {
  using R = std::invoke_result_t<Fn>;
  if (!call_wanted(decl)) {
    UnobservedCallScope scope;
    return std::forward<Fn>(fn)();
  }
  ObservedCall call(decl, pack());
  if (!call.active()) return std::forward<Fn>(fn)();
  try {
    if constexpr (std::is_void_v<R>) {
      std::forward<Fn>(fn)();
      call.finish(Value());
    } else {
      R result = std::forward<Fn>(fn)();
      call.finish(live_value(result));
      return result;
    }
  } catch (const std::exception& e) {
    call.fail(e.what());
    throw;
  } catch (...) {
    call.fail("unknown exception");
    throw;
  }
}

template <class Fn, class... Args>
[[gnu::noinline, gnu::cold]] decltype(auto) call_observed(DeclFn decl_fn, Fn&& fn,
                                                          const Args&... args) {
  return run_observed(decl_fn(), std::forward<Fn>(fn), [&] {
    std::vector<Value> values;
    values.reserve(sizeof...(Args));
    (values.push_back(live_value(args)), ...);
    return values;
  });
}

}  // namespace detail

/// Runs `fn` (the op's body) as a call of the op that `decl_fn()` declares, with `args` in the
/// declaration's parameter order (wrapper methods pass `*this` first). Returns fn's result.
template <class Fn, class... Args>
inline decltype(auto) call_api(detail::DeclFn decl_fn, Fn&& fn, const Args&... args) {
  constexpr bool has_tensors = (detail::may_hold_tensor<std::decay_t<Args>> || ...);
  if (FLASHINFER_LIKELY(!detail::g_call_hooks_active.load(std::memory_order_relaxed))) {
    if constexpr (has_tensors) {
      const OpDecl& decl = decl_fn();
      if (detail::decl_writes(decl)) detail::check_api_writes(decl, args...);
    }
    return std::forward<Fn>(fn)();
  }
  // Observed, a refused call is reported to the observers like any other failed call.
  return detail::call_observed(
      decl_fn,
      [&]() -> decltype(auto) {
        if constexpr (has_tensors) {
          const OpDecl& decl = decl_fn();
          if (detail::decl_writes(decl)) detail::check_api_writes(decl, args...);
        }
        return std::forward<Fn>(fn)();
      },
      args...);
}

}  // namespace flashinfer
