// The API logger: a CallObserver installed while the level asks for per-call records, and a
// destination (stdout, stderr, a file, or a callback sink) written one whole record at a time
// under a lock. It is configured from the settings parsed when the library loads
// (src/startup/startup.cpp); it knows nothing of the flight recorder.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "apilog/api_logger.h"
#include "apilog/format.h"
#include "calls/name_filter.h"
#include "core/settings.h"
#include "flashinfer/api_call.h"
#include "flashinfer/api_log.h"

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

std::once_flag g_banner_once;

void write_banner_once() {
  std::call_once(g_banner_once, [] { writer().write(banner_record()); });
}

void emit(std::string_view rec) {
  // At load with a level other than 0 the banner is written at once (configure()); when
  // logging is turned on later, it precedes the first record.
  write_banner_once();
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

}  // namespace

void emit_banner() { write_banner_once(); }

void emit_line(std::string_view line) {
  std::string rec(line);
  rec += '\n';
  emit(rec);
}

}  // namespace apilog

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

}  // namespace api_log

namespace detail::apilog {

static bool ring_mode(const Settings& s) { return s.log_level >= 10 && s.dump_ring > 0; }

void configure(const Settings& s) {
  if (const auto* p = s.problem("FLASHINFER_LOGLEVEL")) warn(p->message);
  // As upstream, a file destination is opened (created) when logging is configured on; at
  // level 0 it is opened only if logging is turned on later.
  writer().set_destination(s.log_dest, /*open_now=*/s.log_level != 0);
  api_log::set_filters(s.dump_include, s.dump_exclude);
  // Ring mode (level 10 with FLASHINFER_DUMP_RING) writes nothing until a trigger: the logger
  // writes no per-call records there. Its level-5 statistics of every tensor (weights included)
  // cost more than the ring itself: 3-5x the decode step of examples/llama_decode (session 17).
  // A program that wants both sets the level from code (api_log::set_level).
  api_log::set_level(ring_mode(s) ? 0 : s.log_level);
  // Upstream logs the system banner at import whenever the level is not 0 (even 2, which
  // logs nothing per call, and negative levels).
  if (s.log_level != 0) emit_banner();
}

}  // namespace detail::apilog
}  // namespace flashinfer
