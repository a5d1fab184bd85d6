// The Flight Recorder: a CallObserver that writes upstream FlashInfer's dump layout
// (docs/LOGGING.md, reference flashinfer-logging-format.md section 3).
#include "flashinfer/recorder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
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
  NamedTensors tensors;         // staged host copies, in key order of appearance
  std::vector<Device> devices;  // each one's original device
  uint64_t bytes = 0;
};

void add_tensor(Extracted& ex, const std::string& key, const Tensor& t) {
  ex.devices.push_back(t.device());
  ex.tensors.emplace_back(key, detail::to_device_keep_layout(t, Device::cpu()));
  ex.bytes += t.nbytes();
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

struct Pending {
  bool dumping = false;
  std::string dir;  // filesystem path of the call directory
  Fd metadata;      // <dir>/metadata.jsonl, open from line 1 to line 2
  // The record's text in the pieces line 2 repeats from line 1 (records are written as text
  // directly: building a JSON document per call cost more than the files).
  std::string head;        // '{"function_name": ..., "input_metadata": {...}'
  std::string in_keys;     // '["arg_0", ...]'
  std::string in_details;  // '"arg_0": {...}, ...'
  std::string tail;        // '"tensor_format": ..., "versions": {...}'
  std::string tail2;       // '"graph_capture": ..., "process_sequence": N}'
  uint64_t input_bytes = 0;
};

// One record line: the keys and their order are upstream's (reference section 3.4).
std::string record_line(const Pending& p, std::string_view output_metadata,
                        std::string_view tensor_info, std::string_view out_details,
                        std::string_view status) {
  std::string s;
  s.reserve(p.head.size() + p.in_details.size() + out_details.size() + p.tail.size() +
            p.tail2.size() + tensor_info.size() + output_metadata.size() + 160);
  s += p.head;
  s += ", \"output_metadata\": ";
  s += output_metadata;
  s += ", \"tensor_info\": ";
  s += tensor_info;
  s += ", \"tensor_details\": {";
  s += p.in_details;
  if (!p.in_details.empty() && !out_details.empty()) s += ", ";
  s += out_details;
  s += "}, ";
  s += p.tail;
  s += ", \"execution_status\": ";
  append_json_string(s, status);
  s += ", ";
  s += p.tail2;
  return s;
}

class Recorder final : public CallObserver {
 public:
  explicit Recorder(Config c)
      : cfg_(std::move(c)), session_path_(join_like_pathlib(cfg_.dump_dir, "session.jsonl")) {}

  void on_call_begin(const OpDecl& decl, std::span<const Value> args) override;
  void on_call_end(const OpDecl& decl, std::span<const Value> args, const Value& result) override;
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view) override {
    // Only line 1 stays on record: the mark of a call that did not complete.
    if (!stack().empty()) stack().pop_back();
  }

  Stats stats() {
    std::lock_guard<std::mutex> l(mu_);
    return {dump_count_, total_bytes_, failed_};
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

  Config cfg_;
  std::map<std::pair<const OpDecl*, std::string>, std::string> signatures_;
  std::string session_path_;
  Fd session_;
  std::mutex mu_;
  std::map<std::string, int64_t> counters_;
  int64_t dump_count_ = 0;
  uint64_t total_bytes_ = 0;
  bool failed_ = false;
};

void Recorder::on_call_begin(const OpDecl& decl, std::span<const Value> args) {
  stack().push_back({});
  Pending& p = stack().back();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (failed_) return;
  }
  if (!should_dump(cfg_, decl.name)) return;
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
    char seqbuf[32];
    std::snprintf(seqbuf, sizeof(seqbuf), "%04lld", static_cast<long long>(seq));
    const std::string ts = timestamp_now();
    const int64_t pid = ::getpid();
    // Arguments: positional parameters are arg_<i> (self is arg_0 of a method), keyword-only
    // ones kwarg_<name> and only when they differ from their default, as a Python caller
    // would have passed them.
    Extracted ex;
    {
      PyJsonWriter w(p.head);
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
    write_tensors(p.dir, "inputs", ex.tensors);
    p.in_keys = keys_text(ex.tensors);
    p.in_details = details_members(ex);
    p.input_bytes = ex.bytes;
    p.tail = "\"tensor_format\": ";
    append_json_string(p.tail, cfg_.safetensors ? "safetensors" : "torch");
    p.tail += ", \"function_signature\": ";
    append_json_string(p.tail, signature_of(decl));
    p.tail += ", \"versions\": ";
    p.tail += versions_text();
    p.tail2 = "\"graph_capture\": false";
    if (decl.is_method() && !args.empty() && args[0].kind() == Value::Kind::kObject) {
      p.tail2 += ", \"self_id\": " + std::to_string(args[0].as_object().id);
    }
    p.tail2 += ", \"dump_dir\": ";
    append_json_string(p.tail2, p.dir);
    // Extra keys upstream lacks (docs/LOGGING.md): where the call ran, and a process-wide
    // call order (directory names only resolve milliseconds, so replay uses it to order calls
    // of one process made within the same millisecond).
    bool cuda = false;
    for (const Device& d : ex.devices) cuda = cuda || d.is_cuda();
    p.tail2 += cuda ? ", \"backend\": \"cuda\"" : ", \"backend\": \"cpu\"";
    p.tail2 += ", \"process_sequence\": " +
               std::to_string(g_process_sequence.fetch_add(1, std::memory_order_relaxed) + 1) + "}";
    std::string info =
        "{\"input_tensor_keys\": " + p.in_keys +
        ", \"output_tensor_keys\": [], \"input_size_bytes\": " + std::to_string(ex.bytes) +
        ", \"input_size_mb\": ";
    append_json_float(info, static_cast<double>(ex.bytes) / 1048576.0);
    info += "}";
    const std::string line = record_line(p, "{}", info, "", "inputs_saved");
    const std::string metadata_path = p.dir + "/metadata.jsonl";
    p.metadata = Fd(open_append(metadata_path));
    write_line(p.metadata.fd, metadata_path, line);
    write_line(session_fd(), session_path_, line);
    int64_t count = 0;
    {
      std::lock_guard<std::mutex> l(mu_);
      count = ++dump_count_;
      total_bytes_ += ex.bytes;
    }
    p.dumping = true;
    log_line("Dumped inputs to: " + p.dir + " (size: " + mb(ex.bytes) + " MB, total: " +
             std::to_string(count) + "/" + std::to_string(cfg_.max_count) + " dumps)");
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
    std::string out_meta;
    {
      PyJsonWriter w(out_meta);
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
    write_tensors(p.dir, "outputs", out.tensors);
    // Arguments the op wrote into, keyed like the inputs (replay compares them).
    Extracted mutated;
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
    write_tensors(p.dir, "mutated", mutated.tensors);
    const uint64_t total_call = p.input_bytes + out.bytes;
    std::string info = "{\"input_tensor_keys\": " + p.in_keys +
                       ", \"output_tensor_keys\": " + keys_text(out.tensors) +
                       ", \"input_size_bytes\": " + std::to_string(p.input_bytes) +
                       ", \"input_size_mb\": ";
    append_json_float(info, static_cast<double>(p.input_bytes) / 1048576.0);
    info += ", \"output_size_bytes\": " + std::to_string(out.bytes) + ", \"output_size_mb\": ";
    append_json_float(info, static_cast<double>(out.bytes) / 1048576.0);
    info += ", \"total_size_bytes\": " + std::to_string(total_call) + ", \"total_size_mb\": ";
    append_json_float(info, static_cast<double>(total_call) / 1048576.0);
    info += ", \"mutated_tensor_keys\": " + keys_text(mutated.tensors) + "}";
    const std::string line = record_line(p, out_meta, info, details_members(out), "completed");
    write_line(p.metadata.fd, p.dir + "/metadata.jsonl", line);
    p.metadata.reset();
    write_line(session_fd(), session_path_, line);
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
