// Replay of recorded calls (ours or upstream FlashInfer's Python recorder's): rebuild each call
// from its dump directory, run it with this library's kernels on the device asked for, and say
// whether it reproduces the recorded outputs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashinfer/device.h"
#include "flashinfer/tensor.h"
#include "flashinfer/tensor_io.h"
#include "flashinfer/value.h"

namespace flashinfer::replay {

/// Live objects of a session (wrappers made by replayed `__init__` calls), keyed by
/// (process id, self_id) as upstream keys them.
using ObjectRegistry = std::map<std::pair<int64_t, uint64_t>, Value>;

struct Options {
  bool compare_outputs = true;
  Device device = Device::cpu();
  bool run = true;
  ObjectRegistry* registry = nullptr;  // shared across calls of a sequence; may be null
  std::optional<double> rtol;          // override the per-dtype default
  std::optional<double> atol;
};

/// Per-dtype default tolerances used to compare replayed outputs with recorded ones:
/// |actual - expected| <= atol + rtol * |expected|; integer, bool and packed fp4 must match
/// exactly.
std::pair<double, double> default_tolerance(DType dtype);  // (rtol, atol)

/// How one tensor compared.
struct TensorComparison {
  std::string key;
  bool match = false;
  std::string problem;     // "shape (2, 3) vs (2, 4)", "dtype ...", "missing", or empty
  int64_t mismatches = 0;  // elements outside the tolerance (NaN/Inf parity included)
  int64_t numel = 0;
  int64_t first_mismatch = -1;  // flat index
  double max_abs_error = 0.0;
  double max_rel_error = 0.0;
  double rtol = 0.0, atol = 0.0;
};

/// Compares `actual` with `expected` as replay does (shape, dtype, then every element with the
/// per-dtype default tolerance unless rtol/atol are given). Used by `flashinfer bench --refcheck`.
TensorComparison compare_tensors(const std::string& key, const Tensor& actual,
                                 const Tensor& expected, std::optional<double> rtol = std::nullopt,
                                 std::optional<double> atol = std::nullopt);

enum class Status {
  kPassed,      // ran and matched (or nothing to compare)
  kMismatch,    // ran, outputs differ
  kError,       // could not be rebuilt or the op raised
  kIncomplete,  // the record has no "completed" line: the recorded process died in the call
  kNotRun,      // run=false
};
const char* status_name(Status s);

struct Result {
  std::string dump_dir;
  std::string function_name;
  std::string module;
  Status status = Status::kNotRun;
  std::vector<Value> args;                            // bound to the op's parameters
  std::vector<std::pair<std::string, Value>> kwargs;  // as recorded (kwarg_<name>)
  NamedTensors expected;                              // outputs file
  NamedTensors expected_mutated;                      // mutated file (this library's dumps)
  Value result;                                       // what the replayed call returned
  std::vector<TensorComparison> comparisons;
  std::string error;
  std::string metadata_json;  // the record used (last complete line)
  /// Where the call actually ran: the device asked for, or the CPU when the op has no kernel for
  /// that device in this build (then `note` says so).
  Device ran_on = Device::cpu();
  std::string note;
  /// Recorded outputs not compared because upstream returns them unwritten (OpDecl::
  /// unwritten_results); `note` names them and says why.
  std::vector<std::string> skipped_outputs;
  bool incomplete = false;  // only line 1 was on record
  /// Incomplete because writing its outputs failed (not a crash); `note` has the failure.
  bool write_failed = false;
};

/// Replays one call directory. Never throws for a bad dump: problems are reported in
/// `error` with status kError.
Result replay_from_dump(const std::string& dump_dir, const Options& options = {});

/// Replays every call directory under `root` (immediate subdirectories holding a
/// metadata.jsonl, in name order) with one shared object registry.
std::vector<Result> replay_sequence(const std::string& root, Device device = Device::cpu(),
                                    std::optional<double> rtol = std::nullopt,
                                    std::optional<double> atol = std::nullopt);

struct SequenceOptions {
  Device device = Device::cpu();
  std::optional<double> rtol, atol;
  std::function<void(const Result&)> on_progress;  // after each call, e.g. a progress line
};
std::vector<Result> replay_sequence(const std::string& root, const SequenceOptions& options);

/// Reads a metadata.jsonl: the last complete, parseable line wins; a torn last line is skipped.
/// Also reports whether a "completed" line exists. Throws flashinfer::Error(kIo/kFormat).
struct MetadataRecord {
  std::string json;  // the chosen line
  bool completed = false;
  int lines = 0;
  /// Recorded during a CUDA-graph capture and never flushed: no tensor was written (not a
  /// crash; see recorder::flush_graph_dumps()).
  bool graph_pending = false;
  /// The call returned but writing its outputs failed (execution_status outputs_write_failed):
  /// not a crash. `write_error` is the recorded failure.
  bool write_failed = false;
  std::string write_error;
};
MetadataRecord read_metadata(const std::string& path);
/// The same over the text of a metadata.jsonl (`name` is used in error messages).
MetadataRecord parse_metadata(const std::string& text, const std::string& name = "<memory>");

/// One recorded call as stored, neither rebuilt nor run: its record and its tensors (safetensors
/// strides restored). What `flashinfer diff` compares and `flashinfer repro` packs.
struct RecordedCall {
  std::string dump_dir;
  std::string function_name;
  std::string module;
  std::string metadata_json;  // the record used (last complete line)
  bool completed = false;     // a "completed" line exists (else only inputs are on record)
  int64_t process_id = 0;
  std::optional<uint64_t> self_id;  // wrapper methods (and __init__)
  NamedTensors inputs, outputs, mutated;
};
/// Reads one call directory. Throws flashinfer::Error(kIo/kFormat) for a missing or bad record
/// or tensor file; with `tensors` false only the record is read.
RecordedCall load_recorded_call(const std::string& dump_dir, bool tensors = true);

/// The call directories under `root` in call order, the order replay_sequence runs them.
/// Throws flashinfer::Error(kIo) when `root` is not a directory.
std::vector<std::string> list_calls(const std::string& root);

}  // namespace flashinfer::replay
