// The Flight Recorder: a CallObserver that writes upstream FlashInfer's dump layout
// (docs/LOGGING.md, reference flashinfer-logging-format.md section 3).
#include "flashinfer/recorder.h"

#include <fcntl.h>
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

Json shape_json(const Shape& s) {
  Json a = Json::array();
  for (int64_t d : s) a.push_back(d);
  return a;
}

std::string mb(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", static_cast<double>(bytes) / 1048576.0);
  return b;
}

struct Extracted {
  NamedTensors tensors;  // staged host copies, in key order of appearance
  std::map<std::string, Device> original_device;
  uint64_t bytes = 0;
};

void add_tensor(Extracted& ex, const std::string& key, const Tensor& t) {
  ex.original_device[key] = t.device();
  ex.tensors.emplace_back(key, detail::to_device_keep_layout(t, Device::cpu()));
  ex.bytes += t.nbytes();
}

Json serialize(const Value& v, const std::string& key, Extracted& ex, int depth) {
  switch (v.kind()) {
    case Value::Kind::kNone:
      return nullptr;
    case Value::Kind::kBool:
      return v.as_bool();
    case Value::Kind::kInt:
      return v.as_int();
    case Value::Kind::kFloat:
      return v.as_float();
    case Value::Kind::kString:
      return v.as_string();
    case Value::Kind::kDType:
      return Json{{"type", "torch.dtype"}, {"value", std::string(dtype_torch_name(v.as_dtype()))}};
    case Value::Kind::kEnum: {
      const EnumValue& e = v.as_enum();
      Json value = e.value;
      char* end = nullptr;
      const long long n = std::strtoll(e.value.c_str(), &end, 10);
      if (!e.value.empty() && end && *end == '\0') value = n;  // integer-valued enums stay ints
      return Json{{"type", "enum"}, {"name", e.type + "." + e.name}, {"value", value}};
    }
    case Value::Kind::kTensor: {
      const Tensor& t = v.as_tensor();
      add_tensor(ex, key, t);
      return Json{{"type", "torch.Tensor"},
                  {"shape", shape_json(t.shape())},
                  {"dtype", std::string(dtype_torch_name(t.dtype()))},
                  {"stride", shape_json(t.strides())},
                  {"device", t.device().str()},
                  {"requires_grad", false},
                  {"is_contiguous", t.is_contiguous()},
                  {"tensor_key", key}};
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const auto& items = v.items();
      const char* type = v.kind() == Value::Kind::kList ? "list" : "tuple";
      if (depth >= kMaxDepth) {
        return Json{{"type", type}, {"length", items.size()}, {"truncated", true}};
      }
      Json arr = Json::array();
      for (std::size_t i = 0; i < items.size(); ++i) {
        arr.push_back(serialize(items[i], key + "__" + std::to_string(i), ex, depth + 1));
      }
      return Json{{"type", type}, {"length", items.size()}, {"items", arr}, {"truncated", false}};
    }
    case Value::Kind::kDict: {
      const auto& items = v.dict_items();
      if (depth >= kMaxDepth) {
        return Json{{"type", "dict"}, {"length", items.size()}, {"truncated", true}};
      }
      Json arr = Json::array();
      for (std::size_t i = 0; i < items.size(); ++i) {
        const std::string s = std::to_string(i);
        arr.push_back(
            Json{{"key", serialize(items[i].first, key + "__key_" + s, ex, depth + 1)},
                 {"value", serialize(items[i].second, key + "__value_" + s, ex, depth + 1)}});
      }
      return Json{{"type", "dict"}, {"length", items.size()}, {"items", arr}, {"truncated", false}};
    }
    case Value::Kind::kObject:
      return Json{{"type", v.as_object().type}, {"repr", v.as_object().repr.substr(0, 1000)}};
  }
  return nullptr;
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

// One write(2) per line on an O_APPEND descriptor: concurrent writers never tear a line.
void append_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "cannot open '", path,
                    "': ", std::strerror(errno));
  }
  const std::string buf = line + "\n";
  const ssize_t n = ::write(fd, buf.data(), buf.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(buf.size())) {
    FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "writing '", path,
                    "' failed: ", n < 0 ? std::strerror(err) : "short write");
  }
}

Json versions_json() {
  const BuildInfo& b = build_info();
  Json v;
  v["flashinfer"] = std::string(b.version);
  v["flashinfer_cpp"] = std::string(b.version);
  v["compiler"] = std::string(b.compiler);
  v["cuda_toolkit"] = b.cuda ? std::string(b.cuda_version) : std::string("<none: CPU-only build>");
  return v;
}

Json tensor_details(const Extracted& ex) {
  Json d = Json::object();
  for (const auto& [k, t] : ex.tensors) {
    d[k] = Json{{"shape", shape_json(t.shape())},
                {"dtype", std::string(dtype_torch_name(t.dtype()))},
                {"stride", shape_json(t.strides())},
                {"device", "cpu"},
                {"original_device", ex.original_device.at(k).str()}};
  }
  return d;
}

Json keys_json(const NamedTensors& t) {
  Json a = Json::array();
  for (const auto& kv : t) a.push_back(kv.first);
  return a;
}

// ---- the observer
// --------------------------------------------------------------------------------

std::atomic<int64_t> g_process_sequence{0};

struct Pending {
  bool dumping = false;
  std::string dir;  // filesystem path of the call directory
  Json record;      // line 1, updated into line 2
  uint64_t input_bytes = 0;
};

class Recorder final : public CallObserver {
 public:
  explicit Recorder(Config c) : cfg_(std::move(c)) {}

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

  Config cfg_;
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
    // Arguments: positional parameters are arg_<i> (self is arg_0 of a method), keyword-only
    // ones kwarg_<name> and only when they differ from their default, as a Python caller
    // would have passed them.
    Extracted ex;
    Json input_meta = Json::object();
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
        input_meta[key] = serialize(args[i], key, ex, 0);
      }
    }
    char seqbuf[32];
    std::snprintf(seqbuf, sizeof(seqbuf), "%04lld", static_cast<long long>(seq));
    const std::string ts = timestamp_now();
    const std::string name =
        ts + "_pid" + std::to_string(::getpid()) + "_" + decl.name + "_call" + seqbuf;
    p.dir = (fs::path(cfg_.dump_dir) / name).string();
    fs::create_directories(p.dir);
    {
      std::lock_guard<std::mutex> l(mu_);
      const double limit = cfg_.max_size_gb * 1024.0 * 1024.0 * 1024.0;
      if (static_cast<double>(total_bytes_ + ex.bytes) > limit) {
        log_line("Dump size limit reached (" + python_float_repr(cfg_.max_size_gb) +
                 " GB). Skipping dump for " + decl.name +
                 ". Increase FLASHINFER_DUMP_MAX_SIZE_GB if needed.");
        std::error_code ec;
        fs::remove(p.dir, ec);
        return;
      }
    }
    write_tensors(p.dir, "inputs", ex.tensors);
    Json& r = p.record;
    r["function_name"] = decl.name;
    r["module"] = decl.module;
    r["call_sequence"] = seq;
    r["timestamp"] = ts;
    r["process_id"] = static_cast<int64_t>(::getpid());
    r["input_metadata"] = input_meta;
    r["output_metadata"] = Json::object();
    r["tensor_info"] = Json{{"input_tensor_keys", keys_json(ex.tensors)},
                            {"output_tensor_keys", Json::array()},
                            {"input_size_bytes", ex.bytes},
                            {"input_size_mb", static_cast<double>(ex.bytes) / 1048576.0}};
    r["tensor_details"] = tensor_details(ex);
    r["tensor_format"] = cfg_.safetensors ? "safetensors" : "torch";
    r["function_signature"] = decl.signature();
    r["versions"] = versions_json();
    r["execution_status"] = "inputs_saved";
    r["graph_capture"] = false;
    if (decl.is_method() && !args.empty() && args[0].kind() == Value::Kind::kObject) {
      r["self_id"] = args[0].as_object().id;
    }
    r["dump_dir"] = join_like_pathlib(cfg_.dump_dir, name);
    // Extra keys upstream lacks (docs/LOGGING.md): where the call ran.
    std::string backend = "cpu";
    for (const auto& [k, d] : ex.original_device) {
      if (d.is_cuda()) backend = "cuda";
    }
    r["backend"] = backend;
    // Process-wide call order: directory names only resolve milliseconds, so replay uses this
    // to order calls of one process made within the same millisecond.
    r["process_sequence"] = g_process_sequence.fetch_add(1, std::memory_order_relaxed) + 1;
    const std::string line = python_json_dumps(r);
    append_line(p.dir + "/metadata.jsonl", line);
    append_line((fs::path(cfg_.dump_dir) / "session.jsonl").string(), line);
    int64_t count = 0;
    {
      std::lock_guard<std::mutex> l(mu_);
      count = ++dump_count_;
      total_bytes_ += ex.bytes;
    }
    p.input_bytes = ex.bytes;
    p.dumping = true;
    log_line("Dumped inputs to: " + r["dump_dir"].get<std::string>() + " (size: " + mb(ex.bytes) +
             " MB, total: " + std::to_string(count) + "/" + std::to_string(cfg_.max_count) +
             " dumps)");
    log_line("Inputs dumped to: " + r["dump_dir"].get<std::string>());
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
    Json out_meta = Json::object();
    if (result.is_tensor()) {
      add_tensor(out, "result", result.as_tensor());
    } else if (result.kind() == Value::Kind::kTuple) {
      const auto& items = result.items();
      for (std::size_t i = 0; i < items.size(); ++i) {
        const std::string key = "result_" + std::to_string(i);
        if (items[i].is_tensor()) {
          add_tensor(out, key, items[i].as_tensor());
        } else {
          out_meta[key] = serialize(items[i], key, out, 0);
        }
      }
    } else {
      out_meta["result"] = serialize(result, "result", out, 0);
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
    Json& r = p.record;
    r["output_metadata"] = out_meta;
    Json& info = r["tensor_info"];
    info["output_tensor_keys"] = keys_json(out.tensors);
    info["output_size_bytes"] = out.bytes;
    info["output_size_mb"] = static_cast<double>(out.bytes) / 1048576.0;
    info["total_size_bytes"] = p.input_bytes + out.bytes;
    info["total_size_mb"] = static_cast<double>(p.input_bytes + out.bytes) / 1048576.0;
    info["mutated_tensor_keys"] = keys_json(mutated.tensors);
    const Json out_details = tensor_details(out);
    for (auto it = out_details.begin(); it != out_details.end(); ++it) {
      r["tensor_details"][it.key()] = it.value();
    }
    r["execution_status"] = "completed";
    const std::string line = python_json_dumps(r);
    append_line(p.dir + "/metadata.jsonl", line);
    append_line((fs::path(cfg_.dump_dir) / "session.jsonl").string(), line);
    uint64_t total = 0;
    {
      std::lock_guard<std::mutex> l(mu_);
      total_bytes_ += out.bytes;
      total = total_bytes_;
    }
    log_line("Dumped outputs to: " + r["dump_dir"].get<std::string>() +
             " (output size: " + mb(out.bytes) + " MB, total dump size: " + mb(total) + " MB)");
    log_line("Outputs dumped to: " + r["dump_dir"].get<std::string>());
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
