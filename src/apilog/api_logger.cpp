// The API logger: a CallObserver installed while the level asks for per-call records, a
// destination (stdout, stderr, a file, or a callback sink) written one whole record at a time
// under a lock, and the configuration read from the environment when the library loads.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "apilog/format.h"
#include "apilog/name_filter.h"
#include "flashinfer/api_call.h"
#include "flashinfer/api_log.h"
#include "recorder/recorder_internal.h"

namespace flashinfer {
namespace detail {
namespace apilog {
namespace {

using api_log::Sink;

void warn(const std::string& text) {
  std::fprintf(stderr, "[flashinfer] warning: %s\n", text.c_str());
  std::fflush(stderr);
}

std::string substitute_pid(std::string_view dest, long pid) {
  std::string out;
  const std::string p = std::to_string(pid);
  for (std::size_t i = 0; i < dest.size(); ++i) {
    if (dest[i] == '%' && i + 1 < dest.size() && dest[i + 1] == 'i') {
      out += p;
      ++i;
    } else {
      out += dest[i];
    }
  }
  return out;
}

// Where records go. Every record is written whole under one lock, so records of concurrent
// calls never interleave; file records are write(2)s on an O_APPEND descriptor, so nothing is
// buffered in the process when it crashes.
class Writer {
 public:
  bool set_destination(std::string_view dest, bool open_now) {
    std::lock_guard<std::mutex> lock(mu_);
    close_file();
    dest_ = std::string(dest);
    warned_ = false;
    if (dest_ == "stdout") {
      kind_ = Kind::kStdout;
    } else if (dest_ == "stderr") {
      kind_ = Kind::kStderr;
    } else {
      kind_ = Kind::kFile;
      if (open_now) return open_file();
    }
    return true;
  }

  std::string destination() {
    std::lock_guard<std::mutex> lock(mu_);
    return dest_;
  }

  void set_sink(Sink sink) {
    std::lock_guard<std::mutex> lock(mu_);
    sink_ = std::move(sink);
  }

  void write(std::string_view rec) {
    std::lock_guard<std::mutex> lock(mu_);
    if (sink_) {
      sink_(rec);
      return;
    }
    switch (kind_) {
      case Kind::kStdout:
        write_stream(stdout, rec);
        return;
      case Kind::kStderr:
        write_stream(stderr, rec);
        return;
      case Kind::kFile:
        write_file(rec);
        return;
    }
  }

  void flush() {
    std::lock_guard<std::mutex> lock(mu_);
    if (kind_ == Kind::kStdout) std::fflush(stdout);
    if (kind_ == Kind::kStderr) std::fflush(stderr);
    if (kind_ == Kind::kFile && fd_ >= 0) (void)::fdatasync(fd_);
  }

 private:
  enum class Kind { kStdout, kStderr, kFile };

  static void write_stream(std::FILE* f, std::string_view rec) {
    std::fwrite(rec.data(), 1, rec.size(), f);
    std::fflush(f);
  }

  void close_file() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    failed_ = false;
  }

  // Opens the file for append ("%i" -> pid). One warning per destination when it cannot be.
  bool open_file() {
    const long pid = static_cast<long>(::getpid());
    path_ = substitute_pid(dest_, pid);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      failed_ = true;
      if (!warned_) {
        warned_ = true;
        warn("cannot open the API log destination '" + path_ + "' (FLASHINFER_LOGDEST): " +
             std::strerror(errno) + "; API log records are dropped, API calls are unaffected");
      }
      return false;
    }
    fd_pid_ = pid;
    return true;
  }

  void write_file(std::string_view rec) {
    // A forked child with "%i" in the destination gets its own file.
    if (fd_ >= 0 && dest_.find("%i") != std::string::npos &&
        static_cast<long>(::getpid()) != fd_pid_) {
      close_file();
    }
    if (fd_ < 0) {
      if (failed_ || !open_file()) return;
    }
    const char* p = rec.data();
    std::size_t left = rec.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (!warned_) {
          warned_ = true;
          warn("writing the API log to '" + path_ +
               "' failed: " + std::strerror(n < 0 ? errno : EIO) +
               "; records may be lost, API calls are unaffected");
        }
        return;
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }

  std::mutex mu_;
  Kind kind_ = Kind::kStdout;
  std::string dest_ = "stdout";
  std::string path_;
  int fd_ = -1;
  long fd_pid_ = 0;
  bool failed_ = false;  // the current file destination could not be opened
  bool warned_ = false;  // one warning per destination
  Sink sink_;
};

Writer& writer() {
  static Writer* w = new Writer();  // used until process exit, never destroyed
  return *w;
}

std::atomic<int> g_level{0};
std::atomic<bool> g_has_filters{false};

struct FilterState {
  std::mutex mu;
  std::shared_ptr<const NameFilter> filter = std::make_shared<const NameFilter>();
};
FilterState& filter_state() {
  static FilterState* f = new FilterState();
  return *f;
}

void emit(std::string_view rec) {
  // The banner precedes the first record, so loading the library never touches the GPU.
  static std::once_flag banner_once;
  std::call_once(banner_once, [] { writer().write(banner_record()); });
  writer().write(rec);
}

// Per thread: the level the current outermost call's input record was written at (0: none),
// so its output record matches even if the level changes during the call.
thread_local int t_open_record_level = 0;

class ApiLogger final : public CallObserver {
 public:
  void on_call_begin(const OpDecl& decl, std::span<const Value> args) override {
    t_open_record_level = 0;
    const int lvl = g_level.load(std::memory_order_relaxed);
    if (lvl == 1) {
      emit(name_record(decl.name));
    } else if (lvl >= 3 && api_log::passes_filters(decl.name)) {
      const int fmt = lvl >= 5 ? 5 : 3;
      emit(input_record(decl, args, fmt));
      t_open_record_level = fmt;
    }
  }
  void on_call_end(const OpDecl&, std::span<const Value>, const Value& result) override {
    const int fmt = t_open_record_level;
    t_open_record_level = 0;
    if (fmt) emit(output_record(result, fmt));
  }
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view) override {
    // Upstream writes nothing when the op raises: the inputs are on record, no output block.
    t_open_record_level = 0;
  }
};

std::mutex g_install_mu;

void apply_level(int level) {
  std::lock_guard<std::mutex> lock(g_install_mu);
  static std::shared_ptr<CallObserver> logger;
  g_level.store(level, std::memory_order_relaxed);
  const bool wanted = level == 1 || level >= 3;
  if (wanted && !logger) {
    logger = std::make_shared<ApiLogger>();
    add_call_observer(logger);
  } else if (!wanted && logger) {
    remove_call_observer(logger);
    logger.reset();
  }
}

// Python's int(): surrounding whitespace, an optional sign, digits with single underscores
// between them. Values beyond int saturate (they all mean "5 plus the recorder" anyway).
std::optional<int> parse_level(std::string_view text) {
  const char* ws = " \t\n\r\f\v";
  const auto b = text.find_first_not_of(ws);
  if (b == std::string_view::npos) return std::nullopt;
  text = text.substr(b, text.find_last_not_of(ws) - b + 1);
  bool neg = false;
  if (text[0] == '+' || text[0] == '-') {
    neg = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) return std::nullopt;
  long long v = 0;
  bool prev_digit = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '_') {
      if (!prev_digit || i + 1 == text.size()) return std::nullopt;
      prev_digit = false;
      continue;
    }
    if (c < '0' || c > '9') return std::nullopt;
    prev_digit = true;
    if (v < INT_MAX) v = v * 10 + (c - '0');
  }
  if (v > INT_MAX) v = INT_MAX;
  return static_cast<int>(neg ? -v : v);
}

}  // namespace

// Called once from a static initializer of the call gate's translation unit, which every
// program using an op links: the environment is read when the library loads.
void init_from_env() noexcept {
  try {
    api_log::configure_from_env();
  } catch (const std::exception& e) {
    warn(std::string("API logging configuration failed: ") + e.what());
  } catch (...) {
    warn("API logging configuration failed");
  }
}

}  // namespace apilog

void api_log_init_from_env() noexcept { apilog::init_from_env(); }

void api_log_emit_line(std::string_view line) {
  std::string rec(line);
  rec += '\n';
  apilog::emit(rec);
}

}  // namespace detail

namespace api_log {

using detail::apilog::filter_state;
using detail::apilog::g_level;
using detail::apilog::writer;

int level() { return g_level.load(std::memory_order_relaxed); }

void set_level(int level) { detail::apilog::apply_level(level); }

bool set_destination(std::string_view destination) {
  return writer().set_destination(destination, /*open_now=*/true);
}

std::string destination() { return writer().destination(); }

void set_sink(Sink sink) { writer().set_sink(std::move(sink)); }

void set_filters(std::vector<std::string> include, std::vector<std::string> exclude) {
  auto f = std::make_shared<detail::NameFilter>();
  f->include = std::move(include);
  f->exclude = std::move(exclude);
  const bool any = !f->empty();
  auto& st = filter_state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.filter = std::move(f);
  detail::apilog::g_has_filters.store(any, std::memory_order_relaxed);
}

bool passes_filters(std::string_view op_name) {
  if (!detail::apilog::g_has_filters.load(std::memory_order_relaxed)) return true;
  std::shared_ptr<const detail::NameFilter> f;
  {
    auto& st = filter_state();
    std::lock_guard<std::mutex> lock(st.mu);
    f = st.filter;
  }
  return f->passes(op_name);
}

void flush() { writer().flush(); }

void configure_from_env() {
  int lvl = 0;
  if (const char* text = std::getenv("FLASHINFER_LOGLEVEL")) {
    if (auto parsed = detail::apilog::parse_level(text)) {
      lvl = *parsed;
    } else {
      detail::apilog::warn(std::string("FLASHINFER_LOGLEVEL='") + text +
                           "' is not an integer; API logging is off (level 0)");
    }
  }
  const char* dest = std::getenv("FLASHINFER_LOGDEST");
  // As upstream, a file destination is opened (created) at configuration time when logging is
  // on; at level 0 it is opened only if logging is turned on later.
  writer().set_destination(dest ? dest : "stdout", /*open_now=*/lvl != 0);
  const char* inc = std::getenv("FLASHINFER_DUMP_INCLUDE");
  const char* exc = std::getenv("FLASHINFER_DUMP_EXCLUDE");
  set_filters(detail::split_pattern_list(inc ? inc : ""),
              detail::split_pattern_list(exc ? exc : ""));
  // Level 10 and above: the flight recorder too (it prints its warning block on stdout).
  if (lvl >= 10 && !recorder::active()) recorder::start_from_env();
  set_level(lvl);
}

}  // namespace api_log
}  // namespace flashinfer
