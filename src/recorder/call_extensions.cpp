#include "recorder/call_extensions.h"

#include <mutex>

namespace flashinfer::detail {
namespace {

struct Extensions {
  std::mutex mu;
  std::map<std::string, std::pair<RecordExtensionFn, ReplayExtensionFn>, std::less<>> by_op;
};

Extensions& extensions() {
  static Extensions e;
  return e;
}

}  // namespace

void register_call_extension(const std::string& op, RecordExtensionFn record,
                             ReplayExtensionFn replay) {
  Extensions& e = extensions();
  std::lock_guard<std::mutex> lock(e.mu);
  e.by_op[op] = {std::move(record), std::move(replay)};
}

// Entries are registered with the ops (once, before any call) and never removed, so the
// pointers stay valid.
const RecordExtensionFn* record_extension(std::string_view op) {
  Extensions& e = extensions();
  std::lock_guard<std::mutex> lock(e.mu);
  auto it = e.by_op.find(op);
  return it == e.by_op.end() ? nullptr : &it->second.first;
}

const ReplayExtensionFn* replay_extension(std::string_view op) {
  Extensions& e = extensions();
  std::lock_guard<std::mutex> lock(e.mu);
  auto it = e.by_op.find(op);
  return it == e.by_op.end() ? nullptr : &it->second.second;
}

}  // namespace flashinfer::detail
