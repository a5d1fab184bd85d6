// The Flight Recorder's observer and public API (include/flashinfer/recorder.h): a CallObserver
// that writes upstream FlashInfer's dump layout (docs/LOGGING.md, reference
// flashinfer-logging-format.md section 3). The work is split by concern: record_json.* turns a
// call into record text and tensors, dump_writer.* owns the dump directory and its limits,
// graph_dumps.* defers calls captured into CUDA graphs; this file decides, per call, what
// happens. It knows nothing of the API logger: its log lines go to the sink it is installed with.
#include "flashinfer/recorder.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "calls/name_filter.h"
#include "core/cuda_runtime.h"
#include "core/settings.h"
#include "flashinfer/api_call.h"
#include "recorder/dump_schema.h"
#include "recorder/dump_writer.h"
#include "recorder/graph_dumps.h"
#include "recorder/python_json.h"
#include "recorder/record_json.h"
#include "recorder/recorder_internal.h"
#include "recorder/ring.h"

namespace flashinfer::recorder {

namespace schema = flashinfer::dump_schema;
using internal::DumpWriter;
using internal::Extracted;
using internal::Fd;
using internal::GraphDumps;
using internal::GraphEntry;
using internal::Outcome;
using internal::RecordParts;

// ---- configuration
// -------------------------------------------------------------------------------

std::vector<std::string> split_patterns(const std::string& text) {
  return detail::split_pattern_list(text);
}

bool should_dump(const Config& config, const std::string& name) {
  // The same matcher as the API logger's level-3 filter.
  detail::NameFilter f{config.include, config.exclude};
  return f.passes(name);
}

Config config_from(const detail::Settings& s) {
  Config c;
  c.dump_dir = s.dump_dir;
  c.max_size_gb = s.dump_max_size_gb;
  c.max_count = s.dump_max_count;
  c.include = s.dump_include;
  c.exclude = s.dump_exclude;
  c.safetensors = s.dump_safetensors;
  c.ring = s.dump_ring;
  c.ring_mb = s.dump_ring_mb;
  c.triggers = s.dump_trigger;
  c.dedup = s.dump_dedup;
  c.ring_verify_full = s.dump_ring_verify_full;
  return c;
}

void warn_about_settings(const detail::Settings& s) {
  for (const auto& p : s.problems) {
    if (p.variable.starts_with("FLASHINFER_DUMP_")) {
      std::fprintf(stderr, "[flashinfer] warning: %s\n", p.message.c_str());
    }
  }
}

Config config_from_env() {
  const detail::Settings s = detail::parse_settings();
  warn_about_settings(s);
  return config_from(s);
}

void set_log_sink(LogSink sink) { internal::set_override_sink(std::move(sink)); }

std::string startup_banner(const Config& c) {
  // Upstream's _warn_dump(), line by line (print() of each piece), where its words are true of
  // this library in this mode: ring mode keeps the last calls instead of dumping all, and a C++
  // process has no torch.cuda.CUDAGraph.replay() to hook.
  auto list = [](const std::vector<std::string>& v) {  // Python's repr() of a list of str
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      out += Value(v[i]).repr();
    }
    return out + "]";
  };
  const std::string sep(80, '=');
  std::string s = sep + "\n";
  s += "WARNING: FlashInfer API Logging is set to Level 10 (Tensor Dumping).\n";
  if (c.ring > 0) {
    static const std::map<std::string, std::string> kWhen = {{"crash", "a fatal signal"},
                                                             {"signal", "SIGUSR1"},
                                                             {"nan", "a NaN/Inf output"},
                                                             {"error", "an op's Error"},
                                                             {"exit", "a normal exit"}};
    std::string when;
    for (const auto& t : c.triggers) {
      const auto it = kWhen.find(t);
      if (it == kWhen.end()) continue;  // unknown words were warned about and do nothing
      when += (when.empty() ? "" : ", ") + t + " (" + it->second + ")";
    }
    const std::string n = std::to_string(c.ring);
    s += "Ring mode (FLASHINFER_DUMP_RING=" + n +
         "): the inputs and outputs, tensors included, of\n";
    s += "the last " + n + " FlashInfer API calls (at most " + std::to_string(c.ring_mb) +
         " MB) are kept in memory, and written to disk in\n";
    s += "the configured dump directory, as ring_pid" + std::to_string(::getpid()) +
         "_dump<NNNN>_<trigger>/, only when a trigger fires:\n";
    s += (when.empty() ? std::string("none (only recorder::dump_ring() writes them)") : when) +
         ". Ensure that you are NOT processing sensitive data\n";
  } else {
    s += "This will dump ALL input and outputs including tensors for FlashInfer APIs to disk in\n";
    s += "the configured dump directory. Ensure that you are NOT processing sensitive data\n";
  }
  s += "or that the dump directory is secure. To disable dumping, unset FLASHINFER_LOGLEVEL or\n";
  s += "set it to below 10. For more information, see https://docs.flashinfer.ai/logging.html\n";
  s += "Current dump directory is: " + c.dump_dir + "\n";
  if (c.safetensors) {
    s += "⚠️  SAFETENSORS mode enabled: tensor stride/non-contiguity will NOT be preserved.\n";
    s += "    Tensors will be saved as contiguous. Use torch.save (default) to preserve "
         "strides.\n";
  }
  if (!c.include.empty()) s += "Include filter: " + list(c.include) + "\n";
  if (!c.exclude.empty()) s += "Exclude filter: " + list(c.exclude) + "\n";
  if (c.ring > 0) {
    s += "CUDA graphs: a call made while a graph is being captured is not kept (copying its "
         "tensors would break the capture).\n";
  } else {
    s += "CUDA graph capture stores tensor references; they are written when the program calls "
         "flashinfer::recorder::flush_graph_dumps() after launching the graph, and at a normal "
         "exit.\n";
  }
  s += sep + "\n";
  return s;
}

// ---- the observer
// --------------------------------------------------------------------------------

namespace {

std::atomic<int64_t> g_process_sequence{0};

// A call between its begin and its end (a thread's stack: observed calls do not nest, but an
// observer's begin may fail before the end arrives).
struct Pending {
  bool dumping = false;
  bool graph = false;  // captured into a CUDA graph: files wait for flush_graph_dumps()
  bool asked = false;  // the begin asked the runtime (a CUDA argument): the end need not
  std::string dir;     // filesystem path of the call directory
  // The directory came from the pool (its pending outputs file is there, open); metadata is
  // <dir>/metadata.jsonl, open from line 1 to line 2.
  internal::PreparedFiles files;
  std::shared_ptr<RecordParts> rec;  // set once the call is to be dumped
};

int flush_graph_dumps_at_exit();

class Recorder final : public CallObserver {
 public:
  Recorder(Config c, LineSink sink)
      : writer_(std::move(c), std::move(sink)),
        filter_{writer_.config().include, writer_.config().exclude} {
    if (writer_.config().dedup) {
      internal::append_member(extra_, schema::kTensorStore,
                              "\"" + std::string(schema::kTensorStoreDedup) + "\"");
    }
  }

  void on_call_begin(const OpDecl& decl, std::span<const Value> args) override;
  void on_call_end(const OpDecl& decl, std::span<const Value> args, const Value& result) override;
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view) override {
    // Only line 1 stays on record: the mark of a call that did not complete.
    if (stack().empty()) return;
    if (stack().back().files.prepared) {
      stack().back().files.outputs.reset();
      writer_.drop_prepared(stack().back().dir, false, true);
    }
    stack().pop_back();
  }
  // Filtered-out calls are not even packed for observation (unless another observer wants
  // them; then on_call_begin filters again).
  bool wants(const OpDecl& decl) override { return filter_.passes(decl.name); }

  Stats stats() { return writer_.stats(); }
  // Whether a call now would still be recorded: a write failure or the count limit ends the
  // recording for good (the size limit only skips calls too large for what is left).
  bool recording() {
    const Stats s = writer_.stats();
    return !s.failed && s.dumps < writer_.config().max_count;
  }
  int flush_graph(const char* why, bool synchronize) {
    return graph_.flush(writer_, why, synchronize);
  }
  int clear_graph() { return graph_.clear(); }

 private:
  static std::vector<Pending>& stack() {
    thread_local std::vector<Pending> s;
    return s;
  }

  // The record tail (tensor format, signature, versions) of an op, laid out once (keyed by
  // address and name: a test may declare a short-lived op at an address a later one reuses).
  // Escaping the signature on every call was a few percent of a recorded call's CPU time.
  const std::string& tail_of(const OpDecl& decl) {
    std::lock_guard<std::mutex> l(mu_);
    const auto key = std::make_pair(&decl, decl.name);
    auto it = tails_.find(key);
    if (it == tails_.end()) {
      it =
          tails_.emplace(key, internal::record_tail(writer_.config().safetensors, decl.signature()))
              .first;
    }
    return it->second;  // std::map: the reference stays valid
  }

  void add_graph_entry(GraphEntry e) {
    graph_.add(std::move(e));
    // Values captured in a graph exist only once the graph runs: what is still pending when
    // the process exits normally is written then (a killed process loses it, as upstream's).
    static std::once_flag once;
    std::call_once(once, [] { std::atexit([] { flush_graph_dumps_at_exit(); }); });
  }

  DumpWriter writer_;
  std::string extra_;          // record keys after upstream's (dedup mode: "tensor_store")
  detail::NameFilter filter_;  // built once: a filtered-out call must cost next to nothing
  GraphDumps graph_;
  std::mutex mu_;
  std::map<std::pair<const OpDecl*, std::string>, std::string> tails_;
};

void Recorder::on_call_begin(const OpDecl& decl, std::span<const Value> args) {
  stack().push_back({});
  Pending& p = stack().back();
  if (writer_.failed()) return;
  if (!filter_.passes(decl.name)) return;
  const std::optional<int64_t> seq = writer_.next_call(decl.name);
  if (!seq) return;
  try {
    p.rec = std::make_shared<RecordParts>();
    p.graph = internal::capture_in_progress(args, &p.asked);
    // Not captured here: the copies to the host may run while another thread captures.
    const detail::CudaRelaxedCaptureScope relaxed(!p.graph);
    const std::string ts = internal::timestamp_now();
    const int64_t pid = internal::current_pid();
    RecordParts& rec = *p.rec;
    Extracted ex;
    ex.by_reference = p.graph;
    rec.head = internal::record_head(decl, args, *seq, ts, pid, ex);
    p.dir = writer_.call_dir(ts, pid, decl.name, *seq);
    if (!writer_.admit(p.dir, decl.name, ex.bytes)) return;
    // A prepared directory (renamed into place) keeps inode allocations off this path.
    p.files = writer_.make_call_dir(p.dir, /*use_pool=*/!p.graph);
    if (!p.graph) writer_.write_tensors(p.dir, schema::kInputsStem, ex.tensors, &p.files.inputs);
    if (p.files.prepared && ex.tensors.empty()) {
      p.files.inputs.reset();
      writer_.drop_prepared(p.dir, true, false);
    }
    std::optional<uint64_t> self_id;
    if (decl.is_method() && !args.empty() && args[0].kind() == Value::Kind::kObject) {
      self_id = args[0].as_object().id;
    }
    internal::finish_inputs_with_tail(
        rec, ex, tail_of(decl), p.graph, self_id,
        g_process_sequence.fetch_add(1, std::memory_order_relaxed) + 1);
    Outcome none = internal::inputs_outcome(rec);
    const std::string line = internal::record_line(
        rec, none, p.graph ? schema::kStatusGraphPending : schema::kStatusInputsSaved, p.dir,
        extra_);
    const std::string metadata_path = p.dir + "/" + std::string(schema::kMetadataFile);
    if (p.files.metadata.fd < 0) p.files.metadata = Fd(internal::open_append(metadata_path));
    internal::write_line(p.files.metadata.fd, metadata_path, line);
    writer_.append_session(line);
    if (p.graph) add_graph_entry({p.dir, p.rec, std::move(none), false, ex.tensors, {}});
    const int64_t count = writer_.count_dump(ex.bytes);
    p.dumping = true;
    writer_.log("Dumped inputs to: " + p.dir + " (size: " + internal::mb_text(ex.bytes) +
                " MB, total: " + std::to_string(count) + "/" +
                std::to_string(writer_.config().max_count) + " dumps" +
                (p.graph ? ", graph-deferred)" : ")"));
    writer_.log("Inputs dumped to: " + p.dir);
  } catch (const std::exception& e) {
    p.dumping = false;
    writer_.fail_once(std::string("dumping ") + decl.name + ": " + e.what());
  }
}

void Recorder::on_call_end(const OpDecl& decl, std::span<const Value> args, const Value& result) {
  if (stack().empty()) return;
  Pending p = std::move(stack().back());
  stack().pop_back();
  if (!p.dumping) return;
  // A call with no CUDA argument (its inputs copied at its begin) whose result is device memory
  // written under a capture: its outputs wait for flush_graph_dumps() as a captured call's do.
  const bool late_graph = !p.graph && !p.asked && internal::result_capture_in_progress(result);
  if (late_graph) {
    auto marked = std::make_shared<RecordParts>(*p.rec);
    internal::set_graph_capture_flag(*marked);
    p.rec = std::move(marked);
    p.graph = true;
  }
  const detail::CudaRelaxedCaptureScope relaxed(!p.graph);  // (as in on_call_begin)
  try {
    std::string output_metadata;
    Extracted out = internal::extract_result(result, p.graph, output_metadata);
    // Arguments the op wrote into, keyed like the inputs (replay compares them).
    Extracted mutated = internal::extract_mutated(decl, args, p.graph);
    if (!p.graph) {
      writer_.write_outputs(p.dir, out.tensors, p.files);
      writer_.write_tensors(p.dir, schema::kMutatedStem, mutated.tensors);
    } else if (late_graph) {
      writer_.write_outputs(p.dir, {}, p.files);  // the pool's pending outputs file goes
    }
    const RecordParts& rec = *p.rec;
    Outcome o = internal::outputs_outcome(rec, std::move(output_metadata), out, mutated);
    const std::string line = internal::record_line(
        rec, o, p.graph ? schema::kStatusGraphPending : schema::kStatusCompleted, p.dir, extra_);
    internal::write_line(p.files.metadata.fd, p.dir + "/" + std::string(schema::kMetadataFile),
                         line);
    p.files.metadata.reset();
    writer_.append_session(line);
    if (p.graph) {
      add_graph_entry(
          {p.dir, p.rec, std::move(o), true, std::move(out.tensors), std::move(mutated.tensors)});
    }
    const uint64_t total = writer_.add_bytes(out.bytes);
    writer_.log("Dumped outputs to: " + p.dir + " (output size: " + internal::mb_text(out.bytes) +
                " MB, total dump size: " + internal::mb_text(total) + " MB)");
    writer_.log("Outputs dumped to: " + p.dir);
  } catch (const std::exception& e) {
    writer_.fail_once(std::string("dumping the outputs of ") + decl.name + ": " + e.what());
    // Left at inputs_saved, the call would read as one the process died in: say that writing
    // its outputs failed (a full disk can still take one short line, often). No completed
    // line was written (its fd is closed once it is).
    if (p.files.metadata.fd >= 0) {
      try {
        std::string what;
        append_json_string(what, e.what());
        std::string extra;
        internal::append_member(extra, schema::kWriteError, what);
        const std::string line =
            internal::record_line(*p.rec, internal::inputs_outcome(*p.rec),
                                  schema::kStatusOutputsWriteFailed, p.dir, extra);
        internal::write_line(p.files.metadata.fd, p.dir + "/" + std::string(schema::kMetadataFile),
                             line);
      } catch (const std::exception&) {
        // Nothing more can be written: show reports the call as incomplete.
      }
    }
  }
}

std::mutex g_mu;
std::shared_ptr<Recorder> g_recorder;
std::shared_ptr<internal::RingRecorder> g_ring;  // ring mode (only one of the two runs)

std::shared_ptr<Recorder> current() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_recorder;
}

int flush_graph_dumps_at_exit() {
  auto r = current();
  return r ? r->flush_graph("atexit", true) : 0;
}

bool has_exit_trigger(const Config& c) {
  return std::find(c.triggers.begin(), c.triggers.end(), "exit") != c.triggers.end();
}
bool g_ring_exit_trigger = false;  // the running ring dumps when it stops or the process exits

void stop_locked() {
  if (g_recorder) remove_call_observer(g_recorder);
  g_recorder.reset();
  if (g_ring) {
    remove_call_observer(internal::as_observer(g_ring));
    if (g_ring_exit_trigger) internal::ring_dump(*g_ring, "exit");
    internal::ring_shutdown(*g_ring);
  }
  g_ring.reset();
  g_ring_exit_trigger = false;
}

}  // namespace

void start(const Config& config, LineSink sink) {
  std::lock_guard<std::mutex> l(g_mu);
  stop_locked();
  if (config.ring > 0) {
    g_ring = internal::make_ring_recorder(config, std::move(sink));
    g_ring_exit_trigger = has_exit_trigger(config);
    if (g_ring_exit_trigger) {
      // Registered after g_ring was constructed, so it runs before g_ring is destroyed.
      static std::once_flag once;
      std::call_once(once, [] { std::atexit([] { stop(); }); });
    }
    add_call_observer(internal::as_observer(g_ring), /*priority=*/-100);
    return;
  }
  g_recorder = std::make_shared<Recorder>(config, std::move(sink));
  // Priority -100: its begin runs before the API logger's and its end after it, so its dump
  // lines enclose a call's records as upstream's do.
  add_call_observer(g_recorder, /*priority=*/-100);
}

void stop() {
  std::lock_guard<std::mutex> l(g_mu);
  stop_locked();
}

std::string dump_ring(const std::string& reason) {
  std::shared_ptr<internal::RingRecorder> r;
  {
    std::lock_guard<std::mutex> l(g_mu);
    r = g_ring;
  }
  return r ? internal::ring_dump(*r, reason) : std::string();
}

int flush_graph_dumps(bool synchronize) {
  auto r = current();
  return r ? r->flush_graph("explicit", synchronize) : 0;
}

int clear_graph_dumps() {
  auto r = current();
  return r ? r->clear_graph() : 0;
}

bool active() {
  {
    std::lock_guard<std::mutex> l(g_mu);
    if (g_ring != nullptr) return true;  // ring mode records until stopped
  }
  auto r = current();
  return r != nullptr && r->recording();
}

Stats stats() {
  std::shared_ptr<internal::RingRecorder> ring;
  {
    std::lock_guard<std::mutex> l(g_mu);
    ring = g_ring;
  }
  if (ring) return internal::ring_stats(*ring);
  auto r = current();
  return r ? r->stats() : Stats{};
}

}  // namespace flashinfer::recorder
