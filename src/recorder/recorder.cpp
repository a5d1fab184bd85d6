// The Flight Recorder: a CallObserver that writes upstream FlashInfer's dump layout
// (docs/LOGGING.md, reference flashinfer-logging-format.md section 3).
#include "flashinfer/recorder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "apilog/name_filter.h"
#include "core/cuda_runtime.h"
#include "core/tensor_span.h"
#include "flashinfer/api_call.h"
#include "flashinfer/error.h"
#include "flashinfer/tensor_io.h"
#include "flashinfer/version.h"
#include "recorder/python_json.h"
#include "recorder/recorder_internal.h"

namespace flashinfer::recorder {

namespace fs = std::filesystem;

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

Config config_from_env() {
  Config c;
  if (const char* v = std::getenv("FLASHINFER_DUMP_DIR")) c.dump_dir = v;
  if (const char* v = std::getenv("FLASHINFER_DUMP_MAX_SIZE_GB")) {
    char* end = nullptr;
    const double d = std::strtod(v, &end);
    if (end != v && *end == '\0') {
      c.max_size_gb = d;
    } else {
      std::fprintf(stderr,
                   "[flashinfer] warning: FLASHINFER_DUMP_MAX_SIZE_GB='%s' is not a number; "
                   "using 20\n",
                   v);
    }
  }
  if (const char* v = std::getenv("FLASHINFER_DUMP_MAX_COUNT")) {
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (end != v && *end == '\0') {
      c.max_count = n;
    } else {
      std::fprintf(stderr,
                   "[flashinfer] warning: FLASHINFER_DUMP_MAX_COUNT='%s' is not an integer; "
                   "using 1000\n",
                   v);
    }
  }
  if (const char* v = std::getenv("FLASHINFER_DUMP_INCLUDE")) c.include = split_patterns(v);
  if (const char* v = std::getenv("FLASHINFER_DUMP_EXCLUDE")) c.exclude = split_patterns(v);
  if (const char* v = std::getenv("FLASHINFER_DUMP_SAFETENSORS"))
    c.safetensors = std::string(v) == "1";
  return c;
}

// ---- log lines
// -----------------------------------------------------------------------------------

namespace {

std::mutex g_log_mu;
LogSink& log_sink() {
  static LogSink* s = new LogSink();
  return *s;
}

void log_line(const std::string& line) {
  std::lock_guard<std::mutex> l(g_log_mu);
  if (log_sink()) {
    log_sink()(line);
  } else {
    detail::api_log_emit_line(line);  // upstream logs these through the API logger
  }
}

}  // namespace

void set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> l(g_log_mu);
  log_sink() = std::move(sink);
}

// ---- value serialization (reference section 3.5)
// -------------------------------------------------

namespace {

constexpr int kMaxDepth = 8;

void shape_json(PyJsonWriter& w, const Shape& s) {
  w.begin_array();
  for (int64_t d : s) w.integer(d);
  w.end_array();
}

std::string mb(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", static_cast<double>(bytes) / 1048576.0);
  return b;
}

struct Extracted {
  NamedTensors tensors;         // staged host copies (references during a graph capture)
  std::vector<Device> devices;  // each one's original device
  uint64_t bytes = 0;
  bool by_reference = false;  // CUDA-graph capture: no copy now, values taken at flush time
};

void add_tensor(Extracted& ex, const std::string& key, const Tensor& t) {
  ex.devices.push_back(t.device());
  ex.tensors.emplace_back(key,
                          ex.by_reference ? t : detail::to_device_keep_layout(t, Device::cpu()));
  ex.bytes += t.nbytes();
}

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

std::mutex g_probe_mu;
std::function<bool()> g_capture_probe;  // tests pretend a capture with it

// Whether this call is being captured into a CUDA graph: then copying its tensors would break
// the capture. Only calls with a CUDA tensor ask the runtime (a CPU call must not create a
// CUDA context).
bool capture_in_progress(std::span<const Value> args) {
  {
    std::lock_guard<std::mutex> l(g_probe_mu);
    if (g_capture_probe) return g_capture_probe();
  }
  for (const Value& a : args) {
    if (any_cuda(a)) return detail::cuda_current_stream_capturing();
  }
  return false;
}

// Writes one argument as upstream's _serialize_value does, collecting its tensors under their
// keys (nested ones as key__<i>).
void serialize(PyJsonWriter& w, const Value& v, const std::string& key, Extracted& ex, int depth) {
  switch (v.kind()) {
    case Value::Kind::kNone:
      w.null();
      return;
    case Value::Kind::kBool:
      w.boolean(v.as_bool());
      return;
    case Value::Kind::kInt:
      w.integer(v.as_int());
      return;
    case Value::Kind::kFloat:
      w.number(v.as_float());
      return;
    case Value::Kind::kString:
      w.string(v.as_string());
      return;
    case Value::Kind::kDType:
      w.begin_object().key("type").string("torch.dtype");
      w.key("value").string(dtype_torch_name(v.as_dtype())).end_object();
      return;
    case Value::Kind::kEnum: {
      const EnumValue& e = v.as_enum();
      w.begin_object().key("type").string("enum").key("name").string(e.type + "." + e.name);
      w.key("value");
      char* end = nullptr;
      const long long n = std::strtoll(e.value.c_str(), &end, 10);
      if (!e.value.empty() && end && *end == '\0') {
        w.integer(n);  // integer-valued enums stay ints
      } else {
        w.string(e.value);
      }
      w.end_object();
      return;
    }
    case Value::Kind::kTensor: {
      const Tensor& t = v.as_tensor();
      add_tensor(ex, key, t);
      w.begin_object().key("type").string("torch.Tensor").key("shape");
      shape_json(w, t.shape());
      w.key("dtype").string(dtype_torch_name(t.dtype())).key("stride");
      shape_json(w, t.strides());
      w.key("device").string(t.device().str()).key("requires_grad").boolean(false);
      w.key("is_contiguous").boolean(t.is_contiguous()).key("tensor_key").string(key);
      w.end_object();
      return;
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const auto& items = v.items();
      w.begin_object().key("type").string(v.kind() == Value::Kind::kList ? "list" : "tuple");
      w.key("length").uinteger(items.size());
      if (depth >= kMaxDepth) {
        w.key("truncated").boolean(true).end_object();
        return;
      }
      w.key("items").begin_array();
      for (std::size_t i = 0; i < items.size(); ++i) {
        serialize(w, items[i], key + "__" + std::to_string(i), ex, depth + 1);
      }
      w.end_array().key("truncated").boolean(false).end_object();
      return;
    }
    case Value::Kind::kDict: {
      const auto& items = v.dict_items();
      w.begin_object().key("type").string("dict").key("length").uinteger(items.size());
      if (depth >= kMaxDepth) {
        w.key("truncated").boolean(true).end_object();
        return;
      }
      w.key("items").begin_array();
      for (std::size_t i = 0; i < items.size(); ++i) {
        const std::string n = std::to_string(i);
        w.begin_object().key("key");
        serialize(w, items[i].first, key + "__key_" + n, ex, depth + 1);
        w.key("value");
        serialize(w, items[i].second, key + "__value_" + n, ex, depth + 1);
        w.end_object();
      }
      w.end_array().key("truncated").boolean(false).end_object();
      return;
    }
    case Value::Kind::kObject:
      w.begin_object().key("type").string(v.as_object().type);
      w.key("repr").string(v.as_object().repr.substr(0, 1000)).end_object();
      return;
  }
  w.null();
}

// Python's str(Path(a) / b): drops "." components and repeated or trailing slashes.
std::string join_like_pathlib(const std::string& dir, const std::string& name) {
  std::string out = dir.starts_with("/") ? "/" : "";
  std::size_t i = 0;
  while (i <= dir.size()) {
    std::size_t j = dir.find('/', i);
    if (j == std::string::npos) j = dir.size();
    const std::string part = dir.substr(i, j - i);
    if (!part.empty() && part != ".") {
      if (!out.empty() && out.back() != '/') out += '/';
      out += part;
    }
    i = j + 1;
  }
  if (!out.empty() && out.back() != '/') out += '/';
  return out + name;
}

std::string timestamp_now() {
  const auto now = std::chrono::system_clock::now();
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof(b), "%Y%m%d_%H%M%S", &tm);
  char out[40];
  std::snprintf(out, sizeof(out), "%s_%03d", b, static_cast<int>(ms.count()));
  return out;
}

int open_append(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "cannot open '", path,
                    "': ", std::strerror(errno));
  }
  return fd;
}

// One write(2) per line on an O_APPEND descriptor: concurrent writers never tear a line.
void write_line(int fd, const std::string& path, std::string line) {
  line += '\n';
  ssize_t n = 0;
  do {
    n = ::write(fd, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(line.size())) {
    FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "writing '", path,
                    "' failed: ", n < 0 ? std::strerror(errno) : "short write");
  }
}

// A file descriptor closed when its owner goes (a call's metadata.jsonl between its two lines).
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

// The "versions" value, the same for every record of the process.
const std::string& versions_text() {
  static const std::string text = [] {
    const BuildInfo& b = build_info();
    std::string t;
    PyJsonWriter w(t);
    w.begin_object().key("flashinfer").string(b.version);
    w.key("flashinfer_cpp").string(b.version).key("compiler").string(b.compiler);
    w.key("cuda_toolkit")
        .string(b.cuda ? std::string(b.cuda_version) : std::string("<none: CPU-only build>"));
    w.end_object();
    return t;
  }();
  return text;
}

// '"key": {shape, dtype, stride, device, original_device}, ...' for each staged tensor.
std::string details_members(const Extracted& ex) {
  std::string t;
  for (std::size_t i = 0; i < ex.tensors.size(); ++i) {
    const auto& [k, x] = ex.tensors[i];
    if (i) t += ", ";
    append_json_string(t, k);
    t += ": ";
    PyJsonWriter w(t);
    w.begin_object().key("shape");
    shape_json(w, x.shape());
    w.key("dtype").string(dtype_torch_name(x.dtype())).key("stride");
    shape_json(w, x.strides());
    w.key("device").string("cpu").key("original_device").string(ex.devices[i].str());
    w.end_object();
  }
  return t;
}

std::string keys_text(const NamedTensors& t) {
  std::string s = "[";
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (i) s += ", ";
    append_json_string(s, t[i].first);
  }
  return s + "]";
}

// ---- the observer
// --------------------------------------------------------------------------------

std::atomic<int64_t> g_process_sequence{0};

// A call's record as text, in the pieces line 2 (and a graph flush's lines) repeat from line 1
// (records are written as text directly: building a JSON document per call cost more than
// the files).
struct RecordParts {
  std::string head;        // '{"function_name": ..., "input_metadata": {...}'
  std::string in_keys;     // '["arg_0", ...]'
  std::string in_details;  // '"arg_0": {...}, ...'
  std::string tail;        // '"tensor_format": ..., "versions": {...}'
  std::string flags;       // '"graph_capture": ...[, "self_id": N]'
  std::string trailer;     // '"backend": ..., "process_sequence": N'
  uint64_t input_bytes = 0;
};

struct Pending {
  bool dumping = false;
  bool graph = false;  // captured into a CUDA graph: files wait for flush_graph_dumps()
  std::string dir;     // filesystem path of the call directory
  Fd metadata;         // <dir>/metadata.jsonl, open from line 1 to line 2
  std::shared_ptr<RecordParts> rec;  // set once the call is to be dumped
  NamedTensors graph_inputs;         // references, when captured
};

// What line 2 adds to line 1.
struct Outcome {
  std::string output_metadata = "{}";
  std::string tensor_info;
  std::string out_details;
};

// One record line: the keys and their order are upstream's (reference section 3.4); `extra`
// holds keys appended after them (", \"k\": v" ...).
std::string record_line(const RecordParts& p, const Outcome& o, std::string_view status,
                        std::string_view dump_dir, std::string_view extra = {}) {
  std::string s;
  s.reserve(p.head.size() + p.in_details.size() + o.out_details.size() + p.tail.size() +
            o.tensor_info.size() + o.output_metadata.size() + dump_dir.size() + extra.size() + 256);
  s += p.head;
  s += ", \"output_metadata\": ";
  s += o.output_metadata;
  s += ", \"tensor_info\": ";
  s += o.tensor_info;
  s += ", \"tensor_details\": {";
  s += p.in_details;
  if (!p.in_details.empty() && !o.out_details.empty()) s += ", ";
  s += o.out_details;
  s += "}, ";
  s += p.tail;
  s += ", \"execution_status\": ";
  append_json_string(s, status);
  s += ", ";
  s += p.flags;
  s += ", \"dump_dir\": ";
  append_json_string(s, dump_dir);
  s += ", ";
  s += p.trailer;
  s += extra;
  s += '}';
  return s;
}

// A captured call's tensors, held by reference until flush_graph_dumps() writes them
// (reference section 3.8).
struct GraphEntry {
  std::string dir;                            // the call's directory
  std::shared_ptr<const RecordParts> record;  // the record as of this entry's line
  Outcome outcome;                            // for an outputs entry
  bool outputs = false;                       // "inputs" or "outputs" entry
  NamedTensors tensors;
  NamedTensors mutated;  // arguments the op wrote into (outputs entry only)
};

class Recorder final : public CallObserver {
 public:
  explicit Recorder(Config c)
      : cfg_(std::move(c)),
        filter_{cfg_.include, cfg_.exclude},
        session_path_(join_like_pathlib(cfg_.dump_dir, "session.jsonl")) {}

  void on_call_begin(const OpDecl& decl, std::span<const Value> args) override;
  void on_call_end(const OpDecl& decl, std::span<const Value> args, const Value& result) override;
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view) override {
    // Only line 1 stays on record: the mark of a call that did not complete.
    if (!stack().empty()) stack().pop_back();
  }
  // Filtered-out calls are not even packed for observation (unless another observer wants
  // them; then on_call_begin filters again).
  bool wants(const OpDecl& decl) override { return filter_.passes(decl.name); }

  Stats stats() {
    std::lock_guard<std::mutex> l(mu_);
    return {dump_count_, total_bytes_, failed_};
  }

  int flush_graph(const char* why, bool synchronize);
  int clear_graph() {
    std::lock_guard<std::mutex> l(graph_mu_);
    const int n = static_cast<int>(graph_entries_.size());
    graph_entries_.clear();
    flush_index_.clear();
    return n;
  }

 private:
  static std::vector<Pending>& stack() {
    thread_local std::vector<Pending> s;
    return s;
  }
  void fail_once(const std::string& what) {
    std::lock_guard<std::mutex> l(mu_);
    if (!failed_) {
      std::fprintf(stderr,
                   "[flashinfer] warning: the flight recorder stopped after an error and records "
                   "nothing more in this process: %s\n",
                   what.c_str());
    }
    failed_ = true;
  }
  void write_tensors(const std::string& dir, const char* stem, const NamedTensors& t) {
    if (t.empty()) return;
    if (cfg_.safetensors) {
      save_safetensors(dir + "/" + stem + ".safetensors", t);
    } else {
      save_torch(dir + "/" + stem + ".pt", t);
    }
  }
  void append(const std::string& path, const std::string& line) {
    Fd fd(open_append(path));
    write_line(fd.fd, path, line);
  }

  // The call's directory: one mkdir(2); the dump directory itself is created on first use (and
  // again if someone removed it meanwhile).
  void make_call_dir(const std::string& dir) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (::mkdir(dir.c_str(), 0777) == 0 || errno == EEXIST) return;
      if (errno != ENOENT || attempt > 0) break;
      fs::create_directories(cfg_.dump_dir);
    }
    FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "cannot create '", dir,
                    "': ", std::strerror(errno));
  }
  // session.jsonl stays open (O_APPEND) for the recorder's life: a line is still one write(2),
  // and a call saves two open/close pairs.
  int session_fd() {
    std::lock_guard<std::mutex> l(mu_);
    if (session_.fd < 0) session_ = Fd(open_append(session_path_));
    return session_.fd;
  }

  // decl.signature() text, built once per op (keyed by address and name: a test may declare
  // a short-lived op at an address a later one reuses).
  std::string signature_of(const OpDecl& decl) {
    std::lock_guard<std::mutex> l(mu_);
    const auto key = std::make_pair(&decl, decl.name);
    auto it = signatures_.find(key);
    if (it == signatures_.end()) it = signatures_.emplace(key, decl.signature()).first;
    return it->second;
  }

  void add_graph_entry(GraphEntry e);

  Config cfg_;
  detail::NameFilter filter_;  // built once: a filtered-out call must cost next to nothing
  std::map<std::pair<const OpDecl*, std::string>, std::string> signatures_;
  std::string session_path_;
  Fd session_;
  std::mutex mu_;
  std::map<std::string, int64_t> counters_;
  int64_t dump_count_ = 0;
  uint64_t total_bytes_ = 0;
  bool failed_ = false;
  std::mutex graph_mu_;  // the captured calls waiting for flush_graph_dumps()
  std::vector<GraphEntry> graph_entries_;
  std::map<std::string, int> flush_index_;  // per call directory
};

void Recorder::on_call_begin(const OpDecl& decl, std::span<const Value> args) {
  stack().push_back({});
  Pending& p = stack().back();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (failed_) return;
  }
  if (!filter_.passes(decl.name)) return;
  int64_t seq = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (dump_count_ >= cfg_.max_count) {
      log_line("Dump limit reached (" + std::to_string(cfg_.max_count) +
               " dumps). Skipping dump for " + decl.name +
               ". Increase FLASHINFER_DUMP_MAX_COUNT if needed.");
      return;
    }
    seq = ++counters_[decl.name];
  }
  try {
    p.rec = std::make_shared<RecordParts>();
    p.graph = capture_in_progress(args);
    char seqbuf[32];
    std::snprintf(seqbuf, sizeof(seqbuf), "%04lld", static_cast<long long>(seq));
    const std::string ts = timestamp_now();
    const int64_t pid = ::getpid();
    RecordParts& rec = *p.rec;
    // Arguments: positional parameters are arg_<i> (self is arg_0 of a method), keyword-only
    // ones kwarg_<name> and only when they differ from their default, as a Python caller
    // would have passed them.
    Extracted ex;
    ex.by_reference = p.graph;
    {
      PyJsonWriter w(rec.head);
      w.begin_object().key("function_name").string(decl.name).key("module").string(decl.module);
      w.key("call_sequence").integer(seq).key("timestamp").string(ts);
      w.key("process_id").integer(pid).key("input_metadata").begin_object();
      for (std::size_t i = 0; i < args.size() && i < decl.params.size(); ++i) {
        const ParamDecl& pd = decl.params[i];
        std::string key;
        if (pd.keyword_only) {
          if (pd.default_value && *pd.default_value == args[i]) continue;
          key = "kwarg_" + pd.name;
        } else {
          key = "arg_" + std::to_string(i);
        }
        if (args[i].is_tensor()) {
          add_tensor(ex, key, args[i].as_tensor());
        } else {
          w.key(key);
          serialize(w, args[i], key, ex, 0);
        }
      }
      w.end_object();  // the record itself stays open: record_line() continues it
    }
    const std::string name = ts + "_pid" + std::to_string(pid) + "_" + decl.name + "_call" + seqbuf;
    p.dir = join_like_pathlib(cfg_.dump_dir, name);  // as str(Path(DUMP_DIR) / name)
    make_call_dir(p.dir);
    {
      std::lock_guard<std::mutex> l(mu_);
      const double limit = cfg_.max_size_gb * 1024.0 * 1024.0 * 1024.0;
      if (static_cast<double>(total_bytes_ + ex.bytes) > limit) {
        log_line("Dump size limit reached (" + python_float_repr(cfg_.max_size_gb) +
                 " GB). Skipping dump for " + decl.name +
                 ". Increase FLASHINFER_DUMP_MAX_SIZE_GB if needed.");
        ::rmdir(p.dir.c_str());
        return;
      }
    }
    if (!p.graph) write_tensors(p.dir, "inputs", ex.tensors);
    rec.in_keys = keys_text(ex.tensors);
    rec.in_details = details_members(ex);
    rec.input_bytes = ex.bytes;
    rec.tail = "\"tensor_format\": ";
    append_json_string(rec.tail, cfg_.safetensors ? "safetensors" : "torch");
    rec.tail += ", \"function_signature\": ";
    append_json_string(rec.tail, signature_of(decl));
    rec.tail += ", \"versions\": ";
    rec.tail += versions_text();
    rec.flags = p.graph ? "\"graph_capture\": true" : "\"graph_capture\": false";
    if (decl.is_method() && !args.empty() && args[0].kind() == Value::Kind::kObject) {
      rec.flags += ", \"self_id\": " + std::to_string(args[0].as_object().id);
    }
    // Extra keys upstream lacks (docs/LOGGING.md): where the call ran, and a process-wide
    // call order (directory names only resolve milliseconds, so replay uses it to order calls
    // of one process made within the same millisecond).
    bool cuda = false;
    for (const Device& d : ex.devices) cuda = cuda || d.is_cuda();
    rec.trailer = cuda ? "\"backend\": \"cuda\"" : "\"backend\": \"cpu\"";
    rec.trailer += ", \"process_sequence\": " +
                   std::to_string(g_process_sequence.fetch_add(1, std::memory_order_relaxed) + 1);
    Outcome none;
    none.tensor_info =
        "{\"input_tensor_keys\": " + rec.in_keys +
        ", \"output_tensor_keys\": [], \"input_size_bytes\": " + std::to_string(ex.bytes) +
        ", \"input_size_mb\": ";
    append_json_float(none.tensor_info, static_cast<double>(ex.bytes) / 1048576.0);
    none.tensor_info += "}";
    const std::string line =
        record_line(rec, none, p.graph ? "graph_capture_pending_flush" : "inputs_saved", p.dir);
    const std::string metadata_path = p.dir + "/metadata.jsonl";
    p.metadata = Fd(open_append(metadata_path));
    write_line(p.metadata.fd, metadata_path, line);
    write_line(session_fd(), session_path_, line);
    if (p.graph) {
      p.graph_inputs = ex.tensors;
      add_graph_entry({p.dir, p.rec, std::move(none), false, std::move(ex.tensors), {}});
    }
    int64_t count = 0;
    {
      std::lock_guard<std::mutex> l(mu_);
      count = ++dump_count_;
      total_bytes_ += ex.bytes;
    }
    p.dumping = true;
    log_line("Dumped inputs to: " + p.dir + " (size: " + mb(ex.bytes) +
             " MB, total: " + std::to_string(count) + "/" + std::to_string(cfg_.max_count) +
             " dumps" + (p.graph ? ", graph-deferred)" : ")"));
    log_line("Inputs dumped to: " + p.dir);
  } catch (const std::exception& e) {
    p.dumping = false;
    fail_once(std::string("dumping ") + decl.name + ": " + e.what());
  }
}

void Recorder::on_call_end(const OpDecl& decl, std::span<const Value> args, const Value& result) {
  if (stack().empty()) return;
  Pending p = std::move(stack().back());
  stack().pop_back();
  if (!p.dumping) return;
  try {
    Extracted out;
    out.by_reference = p.graph;
    Outcome o;
    o.output_metadata.clear();
    {
      PyJsonWriter w(o.output_metadata);
      w.begin_object();
      if (result.is_tensor()) {
        add_tensor(out, "result", result.as_tensor());
      } else if (result.kind() == Value::Kind::kTuple) {
        const auto& items = result.items();
        for (std::size_t i = 0; i < items.size(); ++i) {
          const std::string key = "result_" + std::to_string(i);
          if (items[i].is_tensor()) {
            add_tensor(out, key, items[i].as_tensor());
          } else {
            w.key(key);
            serialize(w, items[i], key, out, 0);
          }
        }
      } else {
        w.key("result");
        serialize(w, result, "result", out, 0);
      }
      w.end_object();
    }
    // Arguments the op wrote into, keyed like the inputs (replay compares them).
    Extracted mutated;
    mutated.by_reference = p.graph;
    for (std::size_t i = 0; i < args.size() && i < decl.params.size(); ++i) {
      const ParamDecl& pd = decl.params[i];
      if (!pd.mutated) continue;
      const std::string key = pd.keyword_only ? "kwarg_" + pd.name : "arg_" + std::to_string(i);
      if (args[i].is_tensor()) {
        add_tensor(mutated, key, args[i].as_tensor());
      } else if (args[i].is_sequence()) {  // a (K, V) cache pair: key__0, key__1
        const auto& items = args[i].items();
        for (std::size_t j = 0; j < items.size(); ++j) {
          if (items[j].is_tensor()) {
            add_tensor(mutated, key + "__" + std::to_string(j), items[j].as_tensor());
          }
        }
      }
    }
    if (!p.graph) {
      write_tensors(p.dir, "outputs", out.tensors);
      write_tensors(p.dir, "mutated", mutated.tensors);
    }
    const RecordParts& rec = *p.rec;
    const uint64_t total_call = rec.input_bytes + out.bytes;
    o.tensor_info = "{\"input_tensor_keys\": " + rec.in_keys +
                    ", \"output_tensor_keys\": " + keys_text(out.tensors) +
                    ", \"input_size_bytes\": " + std::to_string(rec.input_bytes) +
                    ", \"input_size_mb\": ";
    append_json_float(o.tensor_info, static_cast<double>(rec.input_bytes) / 1048576.0);
    o.tensor_info +=
        ", \"output_size_bytes\": " + std::to_string(out.bytes) + ", \"output_size_mb\": ";
    append_json_float(o.tensor_info, static_cast<double>(out.bytes) / 1048576.0);
    o.tensor_info +=
        ", \"total_size_bytes\": " + std::to_string(total_call) + ", \"total_size_mb\": ";
    append_json_float(o.tensor_info, static_cast<double>(total_call) / 1048576.0);
    o.tensor_info += ", \"mutated_tensor_keys\": " + keys_text(mutated.tensors) + "}";
    o.out_details = details_members(out);
    const std::string line =
        record_line(rec, o, p.graph ? "graph_capture_pending_flush" : "completed", p.dir);
    write_line(p.metadata.fd, p.dir + "/metadata.jsonl", line);
    p.metadata.reset();
    write_line(session_fd(), session_path_, line);
    if (p.graph) {
      add_graph_entry(
          {p.dir, p.rec, std::move(o), true, std::move(out.tensors), std::move(mutated.tensors)});
    }
    uint64_t total = 0;
    {
      std::lock_guard<std::mutex> l(mu_);
      total_bytes_ += out.bytes;
      total = total_bytes_;
    }
    log_line("Dumped outputs to: " + p.dir + " (output size: " + mb(out.bytes) +
             " MB, total dump size: " + mb(total) + " MB)");
    log_line("Outputs dumped to: " + p.dir);
  } catch (const std::exception& e) {
    fail_once(std::string("dumping the outputs of ") + decl.name + ": " + e.what());
  }
}

int flush_graph_dumps_at_exit();

void Recorder::add_graph_entry(GraphEntry e) {
  std::lock_guard<std::mutex> l(graph_mu_);
  graph_entries_.push_back(std::move(e));
  // Values captured in a graph exist only once the graph runs: what is still pending when the
  // process exits normally is written then (a killed process loses it, as upstream's does).
  static std::once_flag once;
  std::call_once(once, [] { std::atexit([] { flush_graph_dumps_at_exit(); }); });
}

// Writes every captured call's tensors as they are now: <dir>/<kind> (the latest values) and
// <dir>/graph_flushes/flush_<k>/<kind> (this flush's snapshot), with records in both
// (reference section 3.8). Returns the number of entries written.
int Recorder::flush_graph(const char* why, bool synchronize) {
  std::lock_guard<std::mutex> l(graph_mu_);
  if (graph_entries_.empty()) return 0;
  try {
    if (synchronize) {
      std::vector<int> devices;
      for (const GraphEntry& e : graph_entries_) {
        for (const auto& [k, t] : e.tensors) {
          if (t.device().is_cuda()) devices.push_back(t.device().index);
        }
      }
      std::sort(devices.begin(), devices.end());
      devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
      for (int d : devices) detail::cuda_device_synchronize(d);
    }
    std::map<std::string, int> index;  // this flush's snapshot number per call directory
    for (const GraphEntry& e : graph_entries_) {
      if (!index.count(e.dir)) index[e.dir] = ++flush_index_[e.dir];
    }
    for (const GraphEntry& e : graph_entries_) {
      const int k = index[e.dir];
      char sub[32];
      std::snprintf(sub, sizeof(sub), "flush_%04d", k);
      const std::string snap = e.dir + "/graph_flushes/" + sub;
      fs::create_directories(snap);  // also recreates a call directory removed meanwhile
      auto stage = [](const NamedTensors& refs) {
        NamedTensors host;
        for (const auto& [key, t] : refs) {
          host.emplace_back(key, detail::to_device_keep_layout(t, Device::cpu()));
        }
        return host;
      };
      const char* kind = e.outputs ? "outputs" : "inputs";
      const NamedTensors host = stage(e.tensors);
      write_tensors(e.dir, kind, host);
      write_tensors(snap, kind, host);
      if (e.outputs) {
        const NamedTensors m = stage(e.mutated);
        write_tensors(e.dir, "mutated", m);
        write_tensors(snap, "mutated", m);
      }
      const char* status = e.outputs ? "completed" : "inputs_saved";
      std::string extra =
          ", \"graph_capture_flushed\": true, \"graph_capture_flush_index\": " + std::to_string(k) +
          ", \"graph_capture_snapshot_dir\": ";
      append_json_string(extra, snap);
      const std::string base_line = record_line(*e.record, e.outcome, status, e.dir, extra);
      append(e.dir + "/metadata.jsonl", base_line);
      write_line(session_fd(), session_path_, base_line);
      extra += ", \"graph_capture_base_dump_dir\": ";
      append_json_string(extra, e.dir);
      const std::string snap_line = record_line(*e.record, e.outcome, status, snap, extra);
      append(snap + "/metadata.jsonl", snap_line);
      write_line(session_fd(), session_path_, snap_line);
    }
  } catch (const std::exception& e) {
    fail_once(std::string("flushing CUDA-graph dumps: ") + e.what());
    return 0;
  }
  const int n = static_cast<int>(graph_entries_.size());
  log_line(std::string("flush_graph_dumps (") + why + "): wrote " + std::to_string(n) +
           " pending entries");
  return n;
}

std::mutex g_mu;
std::shared_ptr<Recorder> g_recorder;

}  // namespace

void start(const Config& config) {
  std::lock_guard<std::mutex> l(g_mu);
  if (g_recorder) remove_call_observer(g_recorder);
  g_recorder = std::make_shared<Recorder>(config);
  add_call_observer(g_recorder, /*priority=*/-100);
}

void stop() {
  std::lock_guard<std::mutex> l(g_mu);
  if (g_recorder) remove_call_observer(g_recorder);
  g_recorder.reset();
}

int flush_graph_dumps(bool synchronize) {
  std::shared_ptr<Recorder> r;
  {
    std::lock_guard<std::mutex> l(g_mu);
    r = g_recorder;
  }
  return r ? r->flush_graph("explicit", synchronize) : 0;
}

int clear_graph_dumps() {
  std::shared_ptr<Recorder> r;
  {
    std::lock_guard<std::mutex> l(g_mu);
    r = g_recorder;
  }
  return r ? r->clear_graph() : 0;
}

namespace {
int flush_graph_dumps_at_exit() {
  std::shared_ptr<Recorder> r;
  {
    std::lock_guard<std::mutex> l(g_mu);
    r = g_recorder;
  }
  return r ? r->flush_graph("atexit", true) : 0;
}
}  // namespace

void set_capture_probe(std::function<bool()> probe) {
  std::lock_guard<std::mutex> l(g_probe_mu);
  g_capture_probe = std::move(probe);
}

bool active() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_recorder != nullptr;
}

Stats stats() {
  std::shared_ptr<Recorder> r;
  {
    std::lock_guard<std::mutex> l(g_mu);
    r = g_recorder;
  }
  return r ? r->stats() : Stats{};
}

std::string startup_banner(const Config& c) {
  const std::string sep(80, '=');
  std::string s = sep + "\n";
  s += "WARNING: FlashInfer API Logging is set to Level 10 (Tensor Dumping).\n";
  s += "Every API call's input and output tensors are written to disk before and after it runs.\n";
  s += "This slows every call down and can use a lot of disk space quickly.\n";
  s += "Limit it with FLASHINFER_DUMP_MAX_COUNT, FLASHINFER_DUMP_MAX_SIZE_GB and the\n";
  s += "FLASHINFER_DUMP_INCLUDE / FLASHINFER_DUMP_EXCLUDE filters; use it for debugging only.\n";
  s += "Current dump directory is: " + c.dump_dir + "\n";
  if (c.safetensors) {
    s += "⚠️  SAFETENSORS mode enabled: tensors are saved contiguous; the original strides "
         "are\n";
    s += "   kept in the metadata and restored on replay.\n";
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", '" : "'") + v[i] + "'";
    return out + "]";
  };
  if (!c.include.empty()) s += "Include filter: " + list(c.include) + "\n";
  if (!c.exclude.empty()) s += "Exclude filter: " + list(c.exclude) + "\n";
  // Upstream hooks torch's CUDAGraph.replay; a C++ caller launches graphs itself.
  s += "CUDA graph capture stores tensor references; call flush_graph_dumps() after launching a "
       "graph to write them.\n";
  s += sep + "\n";
  return s;
}

int level_from_env() {
  const char* v = std::getenv("FLASHINFER_LOGLEVEL");
  if (!v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (end != v && *end == '\0') ? static_cast<int>(n) : 0;
}

void start_from_env() {
  if (level_from_env() < 10) return;
  const Config c = config_from_env();
  const std::string banner = startup_banner(c);
  std::fwrite(banner.data(), 1, banner.size(), stdout);
  std::fflush(stdout);
  start(c);
}

}  // namespace flashinfer::recorder
