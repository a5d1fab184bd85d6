// FLASHINFER_TRACE_DUMP: an observer on the call gate (like the API logger and the recorder) that
// writes one definition per distinct name, i.e. per (op, constant axes), as upstream's auto-dump
// does: `<dir>/<name>.json`, once per process. It asks the gate only for ops with a template, so
// every other op's calls are not even packed for it.
#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "flashinfer/api_call.h"
#include "flashinfer/trace.h"
#include "trace/trace_template.h"

namespace flashinfer::trace {

namespace {

class TraceDumper final : public CallObserver {
 public:
  explicit TraceDumper(std::string dir) : dir_(std::move(dir)) {}

  bool wants(const OpDecl& decl) override { return detail::find_template(decl.name) != nullptr; }

  void on_call_begin(const OpDecl& decl, std::span<const Value> args) override {
    // The name first: a shape already written costs no rendering.
    auto name = definition_name_for_call(decl, args);
    if (!name) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!written_.insert(*name).second) return;
    }
    const auto text = definition_for_call(decl, args);
    if (!text) return;
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(dir_, ec);
    const fs::path final_path = fs::path(dir_) / (*name + ".json");
    // Written beside and renamed, so a reader never sees half a file.
    const fs::path tmp = fs::path(dir_) / ("." + *name + ".json.tmp" + std::to_string(::getpid()));
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << *text;
      if (!f) {
        warn(tmp.string());
        return;
      }
    }
    fs::rename(tmp, final_path, ec);
    if (ec) {
      warn(final_path.string());
      fs::remove(tmp, ec);
      return;
    }
    count_.fetch_add(1, std::memory_order_relaxed);
  }
  void on_call_end(const OpDecl&, std::span<const Value>, const Value&) override {}
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view) override {}

  int64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  static void warn(const std::string& path) {
    static std::atomic<bool> once{false};
    if (!once.exchange(true)) {
      std::fprintf(stderr, "[flashinfer] warning: FLASHINFER_TRACE_DUMP could not write %s\n",
                   path.c_str());
    }
  }
  std::string dir_;
  std::mutex mu_;
  std::set<std::string> written_;
  std::atomic<int64_t> count_{0};
};

std::mutex g_mu;
std::shared_ptr<TraceDumper>& current() {
  static auto* p = new std::shared_ptr<TraceDumper>();  // outlives other static destructors
  return *p;
}

}  // namespace

void start_dump(std::string dir) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& cur = current();
  if (cur) remove_call_observer(cur);
  cur = std::make_shared<TraceDumper>(std::move(dir));
  add_call_observer(cur, 100);
}

int64_t stop_dump() {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& cur = current();
  if (!cur) return 0;
  remove_call_observer(cur);
  const int64_t n = cur->count();
  cur.reset();
  return n;
}

bool dump_active() {
  std::lock_guard<std::mutex> lock(g_mu);
  return current() != nullptr;
}

}  // namespace flashinfer::trace
