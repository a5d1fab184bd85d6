// Private: the CUDA-graph deferral of the recorder (reference flashinfer-logging-format.md
// section 3.8). A call made while its stream is being captured cannot copy its tensors: they
// are held by reference here until flush() writes them, into the call's directory (latest
// values) and into a new graph_flushes/flush_<k>/ snapshot, with records in both.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "flashinfer/value.h"
#include "recorder/dump_writer.h"
#include "recorder/record_json.h"

namespace flashinfer::recorder::internal {

/// A captured call's tensors, held by reference until flush() writes them.
struct GraphEntry {
  std::string dir;                            // the call's directory
  std::shared_ptr<const RecordParts> record;  // the record as of this entry's line
  Outcome outcome;                            // for an outputs entry
  bool outputs = false;                       // "inputs" or "outputs" entry
  NamedTensors tensors;
  NamedTensors mutated;  // arguments the op wrote into (outputs entry only)
};

class GraphDumps {
 public:
  void add(GraphEntry e);
  /// Writes every pending entry as its tensors are now (after synchronizing their devices
  /// when asked) and logs "flush_graph_dumps (<why>): wrote N pending entries". Returns N.
  int flush(DumpWriter& writer, const char* why, bool synchronize);
  /// Drops the pending entries and the snapshot counters; returns how many entries.
  int clear();

 private:
  std::mutex mu_;
  std::vector<GraphEntry> entries_;
  std::map<std::string, int> flush_index_;  // per call directory
};

/// Whether a call with these arguments is being captured into a CUDA graph. Only calls with a
/// CUDA tensor ask the runtime (a CPU call must not create a CUDA context; `*asked` is set when
/// the runtime was asked); the test probe of set_capture_probe() answers first when set.
bool capture_in_progress(std::span<const Value> args, bool* asked = nullptr);

/// Asked at the end of a call that capture_in_progress() neither found captured nor asked the
/// runtime about (no CUDA argument): whether its result holds a CUDA tensor made while this
/// thread's stream is being captured (a view of device memory, such as MoeAlltoAll's workspace
/// views). Its values exist only once the graph runs, and copying them would break the capture.
/// The test probe answers first when set.
bool result_capture_in_progress(const Value& result);

}  // namespace flashinfer::recorder::internal
