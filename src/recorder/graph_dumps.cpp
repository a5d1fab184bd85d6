#include "recorder/graph_dumps.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <utility>

#include "core/cuda_runtime.h"
#include "core/tensor_span.h"
#include "recorder/dump_schema.h"
#include "recorder/python_json.h"
#include "recorder/recorder_internal.h"

namespace flashinfer::recorder {

namespace {
std::mutex g_probe_mu;
std::function<bool()> g_capture_probe;  // tests pretend a capture with it
// Whether a probe is set: read on every recorded call without taking the lock (the probe is a
// test hook; the lock was a few percent of the ring's hooks).
std::atomic<bool> g_has_probe{false};
}  // namespace

void set_capture_probe(std::function<bool()> probe) {
  std::lock_guard<std::mutex> l(g_probe_mu);
  g_capture_probe = std::move(probe);
  g_has_probe.store(static_cast<bool>(g_capture_probe), std::memory_order_release);
}

namespace internal {

namespace fs = std::filesystem;
namespace schema = flashinfer::dump_schema;

namespace {

bool any_cuda(const Value& v) {
  if (v.is_tensor()) return v.as_tensor().device().is_cuda();
  if (v.kind() == Value::Kind::kList || v.kind() == Value::Kind::kTuple) {
    for (const Value& x : v.items()) {
      if (any_cuda(x)) return true;
    }
  }
  if (v.kind() == Value::Kind::kDict) {
    for (const auto& [k, x] : v.dict_items()) {
      if (any_cuda(k) || any_cuda(x)) return true;
    }
  }
  return false;
}

NamedTensors stage(const NamedTensors& refs) {
  NamedTensors host;
  for (const auto& [key, t] : refs) {
    host.emplace_back(key, detail::to_device_keep_layout(t, Device::cpu()));
  }
  return host;
}

}  // namespace

namespace {
// The test probe's answer, when one is set.
std::optional<bool> probe_answer() {
  if (!g_has_probe.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard<std::mutex> l(g_probe_mu);
  if (!g_capture_probe) return std::nullopt;
  return g_capture_probe();
}
}  // namespace

bool capture_in_progress(std::span<const Value> args, bool* asked) {
  if (const std::optional<bool> p = probe_answer()) return *p;
  if (!detail::cuda_storage_made()) return false;  // no CUDA tensor exists
  for (const Value& a : args) {
    if (any_cuda(a)) {
      if (asked != nullptr) *asked = true;
      return detail::cuda_current_stream_capturing();
    }
  }
  return false;
}

bool result_capture_in_progress(const Value& result) {
  if (const std::optional<bool> p = probe_answer()) return *p;
  if (!detail::cuda_storage_made() || !any_cuda(result)) return false;
  try {
    return detail::cuda_current_stream_capturing();
  } catch (const std::exception&) {  // no usable device: nothing can be capturing
    return false;
  }
}

void GraphDumps::add(GraphEntry e) {
  std::lock_guard<std::mutex> l(mu_);
  entries_.push_back(std::move(e));
}

int GraphDumps::clear() {
  std::lock_guard<std::mutex> l(mu_);
  const int n = static_cast<int>(entries_.size());
  entries_.clear();
  flush_index_.clear();
  return n;
}

int GraphDumps::flush(DumpWriter& writer, const char* why, bool synchronize) {
  std::lock_guard<std::mutex> l(mu_);
  if (entries_.empty()) return 0;
  // Called while a capture is on (this thread's stream, or a global-mode capture anywhere), the
  // synchronize and the copies to the host would end that capture: the entries wait for a later
  // flush.
  bool capture_on = false;
  if (detail::cuda_storage_made()) {  // else no capture can hold CUDA work of ours
    try {
      capture_on = detail::cuda_current_stream_capturing();
    } catch (const std::exception&) {  // no usable device: nothing can be capturing
    }
  }
  if (capture_on) {
    writer.log(std::string("flush_graph_dumps (") + why +
               "): skipped while a CUDA-graph capture is on; " + std::to_string(entries_.size()) +
               " entries kept for the next flush");
    return 0;
  }
  try {
    if (synchronize) {
      std::vector<int> devices;
      for (const GraphEntry& e : entries_) {
        for (const auto& [k, t] : e.tensors) {
          if (t.device().is_cuda()) devices.push_back(t.device().index);
        }
      }
      std::sort(devices.begin(), devices.end());
      devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
      for (int d : devices) detail::cuda_device_synchronize(d);
    }
    std::map<std::string, int> index;  // this flush's snapshot number per call directory
    for (const GraphEntry& e : entries_) {
      if (!index.count(e.dir)) index[e.dir] = ++flush_index_[e.dir];
    }
    const std::string metadata_name(schema::kMetadataFile);
    for (const GraphEntry& e : entries_) {
      const int k = index[e.dir];
      char sub[32];
      std::snprintf(sub, sizeof(sub), schema::kFlushDirFormat, k);
      const std::string snap = e.dir + "/" + std::string(schema::kGraphFlushesDir) + "/" + sub;
      fs::create_directories(snap);  // also recreates a call directory removed meanwhile
      const std::string_view kind = e.outputs ? schema::kOutputsStem : schema::kInputsStem;
      const NamedTensors host = stage(e.tensors);
      writer.write_tensors(e.dir, kind, host);
      writer.write_tensors(snap, kind, host);
      if (e.outputs) {
        const NamedTensors m = stage(e.mutated);
        writer.write_tensors(e.dir, schema::kMutatedStem, m);
        writer.write_tensors(snap, schema::kMutatedStem, m);
      }
      const std::string_view status =
          e.outputs ? schema::kStatusCompleted : schema::kStatusInputsSaved;
      std::string snap_json;
      append_json_string(snap_json, snap);
      std::string extra;
      append_member(extra, schema::kGraphCaptureFlushed, "true");
      append_member(extra, schema::kGraphCaptureFlushIndex, std::to_string(k));
      append_member(extra, schema::kGraphCaptureSnapshotDir, snap_json);
      const std::string base_line = record_line(*e.record, e.outcome, status, e.dir, extra);
      writer.append(e.dir + "/" + metadata_name, base_line);
      writer.append_session(base_line);
      std::string base_json;
      append_json_string(base_json, e.dir);
      append_member(extra, schema::kGraphCaptureBaseDumpDir, base_json);
      const std::string snap_line = record_line(*e.record, e.outcome, status, snap, extra);
      writer.append(snap + "/" + metadata_name, snap_line);
      writer.append_session(snap_line);
    }
  } catch (const std::exception& e) {
    writer.fail_once(std::string("flushing CUDA-graph dumps: ") + e.what());
    return 0;
  }
  const int n = static_cast<int>(entries_.size());
  writer.log(std::string("flush_graph_dumps (") + why + "): wrote " + std::to_string(n) +
             " pending entries");
  return n;
}

}  // namespace internal
}  // namespace flashinfer::recorder
