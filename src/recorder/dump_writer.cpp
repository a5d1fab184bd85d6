#include "recorder/dump_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <utility>

#include "flashinfer/error.h"
#include "flashinfer/value.h"
#include "recorder/dump_schema.h"
#include "recorder/python_json.h"

namespace flashinfer::recorder::internal {

namespace fs = std::filesystem;

Fd::Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd = std::exchange(o.fd, -1);
  }
  return *this;
}

void Fd::reset() {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

int open_append(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "cannot open '", path,
                    "': ", std::strerror(errno));
  }
  return fd;
}

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

namespace {

std::mutex g_sink_mu;  // one log line at a time, and the override below

LineSink& override_sink() {
  static LineSink* s = new LineSink();
  return *s;
}

}  // namespace

void set_override_sink(LineSink sink) {
  std::lock_guard<std::mutex> l(g_sink_mu);
  override_sink() = std::move(sink);
}

DumpWriter::DumpWriter(Config config, LineSink sink)
    : cfg_(std::move(config)),
      sink_(std::move(sink)),
      session_path_(join_like_pathlib(cfg_.dump_dir, std::string(dump_schema::kSessionFile))) {}

void DumpWriter::log(const std::string& line) {
  std::lock_guard<std::mutex> l(g_sink_mu);
  if (override_sink()) {
    override_sink()(line);
  } else if (sink_) {
    sink_(line);
  } else {
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
}

bool DumpWriter::failed() {
  std::lock_guard<std::mutex> l(mu_);
  return failed_;
}

void DumpWriter::fail_once(const std::string& what) {
  std::lock_guard<std::mutex> l(mu_);
  if (!failed_) {
    std::fprintf(stderr,
                 "[flashinfer] warning: the flight recorder stopped after an error and records "
                 "nothing more in this process: %s\n",
                 what.c_str());
  }
  failed_ = true;
}

Stats DumpWriter::stats() {
  std::lock_guard<std::mutex> l(mu_);
  return {dump_count_, total_bytes_, failed_};
}

std::optional<int64_t> DumpWriter::next_call(const std::string& name) {
  std::lock_guard<std::mutex> l(mu_);
  if (dump_count_ >= cfg_.max_count) {
    log("Dump limit reached (" + std::to_string(cfg_.max_count) + " dumps). Skipping dump for " +
        name + ". Increase FLASHINFER_DUMP_MAX_COUNT if needed.");
    return std::nullopt;
  }
  return ++counters_[name];
}

std::string DumpWriter::call_dir(const std::string& timestamp, int64_t pid, const std::string& name,
                                 int64_t call_sequence) const {
  char seq[32];
  std::snprintf(seq, sizeof(seq), "%04lld", static_cast<long long>(call_sequence));
  std::string dir_name = timestamp;
  dir_name += dump_schema::kDirPidMarker;
  dir_name += std::to_string(pid) + "_" + name;
  dir_name += dump_schema::kDirCallMarker;
  dir_name += seq;
  return join_like_pathlib(cfg_.dump_dir, dir_name);
}

void DumpWriter::make_call_dir(const std::string& dir) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (::mkdir(dir.c_str(), 0777) == 0 || errno == EEXIST) return;
    if (errno != ENOENT || attempt > 0) break;
    fs::create_directories(cfg_.dump_dir);
  }
  FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "cannot create '", dir,
                  "': ", std::strerror(errno));
}

bool DumpWriter::admit(const std::string& dir, const std::string& name, uint64_t input_bytes) {
  std::lock_guard<std::mutex> l(mu_);
  const double limit = cfg_.max_size_gb * 1024.0 * 1024.0 * 1024.0;
  if (static_cast<double>(total_bytes_ + input_bytes) <= limit) return true;
  log("Dump size limit reached (" + python_float_repr(cfg_.max_size_gb) +
      " GB). Skipping dump for " + name + ". Increase FLASHINFER_DUMP_MAX_SIZE_GB if needed.");
  ::rmdir(dir.c_str());
  return false;
}

int64_t DumpWriter::count_dump(uint64_t input_bytes) {
  std::lock_guard<std::mutex> l(mu_);
  total_bytes_ += input_bytes;
  return ++dump_count_;
}

uint64_t DumpWriter::add_bytes(uint64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  total_bytes_ += bytes;
  return total_bytes_;
}

void DumpWriter::write_tensors(const std::string& dir, std::string_view stem,
                               const NamedTensors& t) {
  if (t.empty()) return;
  const std::string path = dir + "/" + dump_schema::tensor_file(stem, cfg_.safetensors);
  if (cfg_.safetensors) {
    save_safetensors(path, t);
  } else {
    save_torch(path, t);
  }
}

void DumpWriter::append_session(const std::string& line) {
  int fd = -1;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (session_.fd < 0) session_ = Fd(open_append(session_path_));
    fd = session_.fd;
  }
  write_line(fd, session_path_, line);
}

void DumpWriter::append(const std::string& path, const std::string& line) {
  Fd fd(open_append(path));
  write_line(fd.fd, path, line);
}

}  // namespace flashinfer::recorder::internal
