// The call gate (include/flashinfer/api_call.h): the installed observers, the outermost-call
// tracking and the notifications. It is the layer below both the API logger (src/apilog) and
// the flight recorder (src/recorder), which plug into it as observers and know nothing of each
// other; the load-time configuration that installs them lives above both (src/startup).
#include "flashinfer/api_call.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>

namespace flashinfer {
namespace detail {

std::atomic<bool> g_call_hooks_active{false};

namespace {

struct Observers {
  std::mutex mu;
  // Copy-on-write: a call takes a snapshot, so observers can be removed during a call.
  std::shared_ptr<const std::vector<std::shared_ptr<CallObserver>>> list =
      std::make_shared<const std::vector<std::shared_ptr<CallObserver>>>();
};

Observers& observers() {
  static Observers* o = new Observers();  // outlives static destructors of other units
  return *o;
}

// Priorities of the installed observers (guarded by Observers::mu).
std::map<const CallObserver*, int>& observer_priorities() {
  static auto* m = new std::map<const CallObserver*, int>();
  return *m;
}

using ObserverList = std::shared_ptr<const std::vector<std::shared_ptr<CallObserver>>>;

ObserverList snapshot() {
  auto& o = observers();
  std::lock_guard<std::mutex> lock(o.mu);
  return o.list;
}

}  // namespace

thread_local int t_call_depth = 0;
// The list call_wanted read for the call about to begin on this thread (ObservedCall takes it):
// one snapshot per call instead of one per notification.
thread_local ObserverList t_wanted;

namespace {

// An observer must never break the call: report its failure once per process and go on.
void report_observer_failure(const char* what) {
  static std::atomic<bool> reported{false};
  if (!reported.exchange(true)) {
    std::fprintf(stderr, "[flashinfer] warning: a call observer failed and was ignored: %s\n",
                 what);
  }
}

// Begin notifications go in installation order and end notifications in reverse, so observers
// nest: the first installed sees the call first and last (the recorder wraps the logger's lines
// the way upstream's dump messages wrap its level-5 records).
template <class F>
void notify(const ObserverList& list, F&& f, bool reverse = false) {
  const auto n = list->size();
  for (std::size_t k = 0; k < n; ++k) {
    const auto& obs = (*list)[reverse ? n - 1 - k : k];
    try {
      f(*obs);
    } catch (const std::exception& e) {
      report_observer_failure(e.what());
    } catch (...) {
      report_observer_failure("unknown exception");
    }
  }
}

}  // namespace

bool call_wanted(const OpDecl& decl) {
  if (t_call_depth != 0) return false;  // only the outermost call is observed
  ObserverList list = snapshot();
  for (const auto& obs : *list) {
    bool wanted = true;  // a failing wants() lets the observer's own hooks report it
    try {
      wanted = obs->wants(decl);
    } catch (...) {
    }
    if (wanted) {
      t_wanted = std::move(list);
      return true;
    }
  }
  return false;
}

UnobservedCallScope::UnobservedCallScope() { ++t_call_depth; }
UnobservedCallScope::~UnobservedCallScope() { --t_call_depth; }

ObservedCall::ObservedCall(const OpDecl& decl, std::vector<Value> args)
    : decl_(&decl), args_(std::move(args)), active_(t_call_depth == 0) {
  ++t_call_depth;
  if (!active_) return;
  observers_ = t_wanted ? std::move(t_wanted) : snapshot();  // a move leaves t_wanted empty
  notify(observers_, [&](CallObserver& o) { o.on_call_begin(*decl_, args_); });
}

ObservedCall::~ObservedCall() { --t_call_depth; }

void ObservedCall::finish(const Value& result) {
  if (!active_) return;
  notify(
      observers_, [&](CallObserver& o) { o.on_call_end(*decl_, args_, result); }, true);
}

void ObservedCall::fail(std::string_view what) {
  if (!active_) return;
  notify(
      observers_, [&](CallObserver& o) { o.on_call_error(*decl_, args_, what); }, true);
}

}  // namespace detail

// Counts as an enclosing call, so no call inside is the outermost one.
ScopedUnobserved::ScopedUnobserved() { ++detail::t_call_depth; }
ScopedUnobserved::~ScopedUnobserved() { --detail::t_call_depth; }

void add_call_observer(std::shared_ptr<CallObserver> observer, int priority) {
  if (!observer) return;
  auto& o = detail::observers();
  std::lock_guard<std::mutex> lock(o.mu);
  auto next = std::make_shared<std::vector<std::shared_ptr<CallObserver>>>(*o.list);
  auto& prio = detail::observer_priorities();
  prio[observer.get()] = priority;
  // Insert after every observer of lower or equal priority.
  auto at = next->begin();
  while (at != next->end() && prio[at->get()] <= priority) ++at;
  next->insert(at, std::move(observer));
  o.list = std::move(next);
  detail::g_call_hooks_active.store(true, std::memory_order_relaxed);
}

void remove_call_observer(const std::shared_ptr<CallObserver>& observer) {
  auto& o = detail::observers();
  std::lock_guard<std::mutex> lock(o.mu);
  auto next = std::make_shared<std::vector<std::shared_ptr<CallObserver>>>(*o.list);
  next->erase(std::remove(next->begin(), next->end(), observer), next->end());
  if (std::find(next->begin(), next->end(), observer) == next->end()) {
    detail::observer_priorities().erase(observer.get());
  }
  detail::g_call_hooks_active.store(!next->empty(), std::memory_order_relaxed);
  o.list = std::move(next);
}

}  // namespace flashinfer
