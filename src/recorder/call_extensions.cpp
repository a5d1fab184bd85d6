#include "recorder/call_extensions.h"

#include <mutex>

namespace flashinfer::detail {
namespace {

struct Extension {
  RecordExtensionFn record;
  ReplayExtensionFn replay;
  ExtensionAppliesFn applies;
};

struct Extensions {
  std::mutex mu;
  std::map<std::string, Extension, std::less<>> by_op;
};

Extensions& extensions() {
  static Extensions e;
  return e;
}

}  // namespace

void register_call_extension(const std::string& op, RecordExtensionFn record,
                             ReplayExtensionFn replay, ExtensionAppliesFn applies) {
  Extensions& e = extensions();
  std::lock_guard<std::mutex> lock(e.mu);
  e.by_op[op] = {std::move(record), std::move(replay), std::move(applies)};
}

// Entries are registered with the ops (once, before any call) and never removed, so the
// pointers stay valid.
const RecordExtensionFn* record_extension(std::string_view op) {
  Extensions& e = extensions();
  std::lock_guard<std::mutex> lock(e.mu);
  auto it = e.by_op.find(op);
  return it == e.by_op.end() ? nullptr : &it->second.record;
}

const ReplayExtensionFn* replay_extension(std::string_view op) {
  Extensions& e = extensions();
  std::lock_guard<std::mutex> lock(e.mu);
  auto it = e.by_op.find(op);
  return it == e.by_op.end() ? nullptr : &it->second.replay;
}

const ExtensionAppliesFn* extension_applies(std::string_view op) {
  Extensions& e = extensions();
  std::lock_guard<std::mutex> lock(e.mu);
  auto it = e.by_op.find(op);
  return it == e.by_op.end() || !it->second.applies ? nullptr : &it->second.applies;
}

}  // namespace flashinfer::detail
