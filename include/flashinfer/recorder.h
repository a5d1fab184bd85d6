// The Flight Recorder (FLASHINFER_LOGLEVEL >= 10): every public call's inputs and outputs, in
// upstream FlashInfer's dump layout, so a session can be replayed here or by upstream's tools.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace flashinfer::recorder {

struct Config {
  std::string dump_dir = "flashinfer_dumps";  // FLASHINFER_DUMP_DIR (no %i substitution)
  double max_size_gb = 20.0;                  // FLASHINFER_DUMP_MAX_SIZE_GB
  int64_t max_count = 1000;                   // FLASHINFER_DUMP_MAX_COUNT
  std::vector<std::string> include;           // FLASHINFER_DUMP_INCLUDE (fnmatch patterns)
  std::vector<std::string> exclude;           // FLASHINFER_DUMP_EXCLUDE
  bool safetensors = false;                   // FLASHINFER_DUMP_SAFETENSORS == "1"
  // This library's extensions (docs/LOGGING.md, "Ring mode" and "Dedup").
  /// FLASHINFER_DUMP_RING: > 0 keeps the last `ring` calls in memory and writes nothing until
  /// a trigger (or dump_ring()) writes them, in upstream's layout, under dump_dir.
  int64_t ring = 0;
  int64_t ring_mb = 1024;  // FLASHINFER_DUMP_RING_MB: the ring's memory bound (oldest go first)
  /// FLASHINFER_DUMP_TRIGGER: what dumps the ring: "crash" (SIGSEGV, SIGBUS, SIGILL, SIGFPE,
  /// SIGABRT), "signal" (SIGUSR1, the process goes on), "nan" (NaN/Inf in a floating output),
  /// "error" (an op raised flashinfer::Error); not by default, "exit" (the process exits
  /// normally, or recording stops: the last calls of a run, e.g. for a demo or a test).
  std::vector<std::string> triggers = {"crash", "signal", "nan", "error"};
  /// FLASHINFER_DUMP_RING_VERIFY == "full": a tensor is shared with a kept call only when a hash
  /// of all its bytes matches (one extra read of every input per call). Default ("sampled"):
  /// same storage span, no library write to it since, and a sampled fingerprint matches
  /// (docs/LOGGING.md, "What unchanged means").
  bool ring_verify_full = false;
  /// FLASHINFER_DUMP_DEDUP == "1" (record-everything mode): each distinct tensor content is
  /// stored once under <dump_dir>/tensors/, records refer to it (`flashinfer export` expands).
  bool dedup = false;
};

/// The configuration the FLASHINFER_DUMP_* variables describe (unset ones keep the defaults
/// above; unparsable numbers give one warning and the default).
Config config_from_env();

/// Where the recorder's log lines go ("Dumped inputs to: ...", the limit warnings): one line
/// per call, without its newline.
using LineSink = std::function<void(const std::string& line)>;

/// Starts recording every outermost public call with `config` (replacing any running
/// recorder). Its log lines go to the API log destination (as upstream's recorder logs through
/// the API logger), whatever the API log level. The library starts it by itself at load when
/// FLASHINFER_LOGLEVEL >= 10.
void start(const Config& config);
/// The same, with the log lines given to `sink` instead (an empty sink: stdout).
void start(const Config& config, LineSink sink);
/// Stops recording; files already written stay.
void stop();
/// Whether a call made now would be recorded: a recorder is running and has not stopped for
/// good (after a write failure, or at FLASHINFER_DUMP_MAX_COUNT dumps).
bool active();

/// CUDA graphs (upstream's flush_graph_dumps). A call made while its stream is being captured
/// into a CUDA graph cannot copy its tensors (that would break the capture): its directory and
/// records are written with execution_status "graph_capture_pending_flush" and its tensors are
/// held by reference. After launching the graph, call flush_graph_dumps(): it synchronizes the
/// devices involved (unless `synchronize` is false) and writes every pending call's files as
/// they are now, both in the call's directory (latest values) and in a new
/// graph_flushes/flush_<k>/ snapshot, with records in both. Returns the number of entries
/// written (an inputs and an outputs entry per call). What is pending at a normal exit is
/// flushed then.
int flush_graph_dumps(bool synchronize = true);
/// Drops every pending captured call (and the snapshot counters); returns how many entries.
int clear_graph_dumps();

/// Ring mode: writes the calls the ring holds now as a dump of upstream's layout in a new
/// directory <dump_dir>/ring_pid<PID>_dump<NNNN>_<reason>/ (session.jsonl, one directory per
/// call, trigger.json) and returns its path; empty when no ring recorder runs or nothing could
/// be written. `reason` is a word naming why (letters, digits, '-', '_'; others become '_').
std::string dump_ring(const std::string& reason);

struct Stats {
  int64_t dumps = 0;         // call directories created
  uint64_t total_bytes = 0;  // logical tensor bytes written (inputs + outputs)
  bool failed = false;       // a write failed and recording stopped
  // Ring mode
  int64_t ring_calls = 0;   // calls held now
  uint64_t ring_bytes = 0;  // distinct tensor bytes held now (shared tensors counted once)
  int64_t ring_dumps = 0;   // dumps written by triggers and dump_ring()
  // Of ring_bytes: spans no kept call holds, kept for a later call passing the same unwritten
  // storage span (a weight); dropped before any kept call is evicted for the bound.
  uint64_t ring_retained_bytes = 0;
  // Bytes copied into the ring since it started: whole copies, KV-cache deltas' rows, small
  // tensors (what sharing saves does not count).
  uint64_t ring_copied_bytes = 0;
  // Dedup mode
  uint64_t distinct_bytes = 0;  // bytes of distinct tensor contents stored
};
Stats stats();

/// Whether `name` passes the include/exclude filters (include first, then exclude), as
/// upstream's _should_dump_function decides.
bool should_dump(const Config& config, const std::string& name);

/// Splits "a, b,,c" on commas, trimming spaces and dropping empties (upstream's parsing).
std::vector<std::string> split_patterns(const std::string& text);

}  // namespace flashinfer::recorder
