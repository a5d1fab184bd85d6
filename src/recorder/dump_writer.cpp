#include "recorder/dump_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <set>
#include <thread>
#include <utility>

#include "core/strided.h"
#include "flashinfer/error.h"
#include "flashinfer/value.h"
#include "formats/dedup_store.h"
#include "formats/torch_archive.h"
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
  // localtime_r and strftime per call were ~3 % of the ring's hook time; the text of the
  // current second is the same for every call in it, so it is kept per thread.
  thread_local std::time_t last = static_cast<std::time_t>(-1);
  thread_local char secs[32] = {0};
  thread_local std::size_t secs_len = 0;
  if (t != last) {
    std::tm tm{};
    localtime_r(&t, &tm);
    secs_len = std::strftime(secs, sizeof(secs), "%Y%m%d_%H%M%S", &tm);
    last = t;
  }
  const int m = static_cast<int>(ms.count());
  std::string out;
  out.reserve(secs_len + 4);
  out.append(secs, secs_len);
  out += '_';
  out += static_cast<char>('0' + m / 100);
  out += static_cast<char>('0' + m / 10 % 10);
  out += static_cast<char>('0' + m % 10);
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

// ---- prepared directories
// ------------------------------------------------------------------------

std::string pending_outputs_name(bool safetensors) {
  return "." + dump_schema::tensor_file(dump_schema::kOutputsStem, safetensors) + ".pending";
}

class DirPool {
 public:
  DirPool(std::string root, std::vector<std::string> files)
      : root_(std::move(root)), files_(std::move(files)), pid_(::getpid()) {
    thread_ = std::thread([this] { run(); });
    std::lock_guard<std::mutex> l(pools_mu());
    if (pools().empty()) {
      static std::once_flag once;
      std::call_once(once, [] {
        std::atexit([] {
          std::lock_guard<std::mutex> g(pools_mu());
          for (DirPool* p : pools()) p->shutdown();
        });
      });
    }
    pools().insert(this);
  }
  ~DirPool() {
    shutdown();
    std::lock_guard<std::mutex> l(pools_mu());
    pools().erase(this);
  }
  /// Stops the thread and removes the directories not used (at exit too: the recorder lives
  /// in the call gate's observer list, which is never destroyed). Idempotent.
  void shutdown() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    if (::getpid() != pid_) {
      // A forked child: the thread is the parent's, and so are the directories.
      new std::thread(std::move(thread_));  // never joined, never destroyed
      return;
    }
    if (thread_.joinable()) thread_.join();
    for (const std::string& d : ready_) {
      for (const std::string& f : files_) ::unlink((d + "/" + f).c_str());
      ::rmdir(d.c_str());
    }
    ready_.clear();
    ::rmdir(root_.c_str());
  }
  /// A prepared directory, or "" when none is ready (or in a forked child).
  std::string take() {
    if (::getpid() != pid_) return "";
    std::string d;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (ready_.empty()) return "";
      d = std::move(ready_.front());
      ready_.pop_front();
    }
    cv_.notify_one();
    return d;
  }

 private:
  static constexpr std::size_t kTarget = 32;
  static std::mutex& pools_mu() {
    static auto* m = new std::mutex();
    return *m;
  }
  static std::set<DirPool*>& pools() {  // the live pools, for the exit handler
    static auto* s = new std::set<DirPool*>();
    return *s;
  }
  void run() {
    if (::mkdir(root_.c_str(), 0777) != 0 && errno != EEXIST) return;
    int64_t k = 0;
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      if (ready_.size() >= kTarget) {
        cv_.wait(l);
        continue;
      }
      l.unlock();
      const std::string d = root_ + "/p" + std::to_string(k++);
      bool ok = ::mkdir(d.c_str(), 0777) == 0;
      for (const std::string& f : files_) {
        const int fd =
            ok ? ::open((d + "/" + f).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644) : -1;
        ok = ok && fd >= 0;
        if (fd >= 0) ::close(fd);
      }
      l.lock();
      if (!ok) return;  // a broken directory: calls make their own
      ready_.push_back(d);
    }
  }
  const std::string root_;
  const std::vector<std::string> files_;
  const pid_t pid_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> ready_;
  bool stop_ = false;
  std::thread thread_;
};

DumpWriter::~DumpWriter() = default;

bool DumpWriter::make_call_dir(const std::string& dir, bool use_pool) {
  if (use_pool && !cfg_.dedup) {
    DirPool* pool = nullptr;
    {
      std::lock_guard<std::mutex> l(mu_);
      // Short sessions never start the pool (nor leave it behind when they end in _exit or a
      // crash): it pays off in long ones.
      if (!pool_tried_ && ++plain_dirs_ >= kPoolAfterCalls) {
        pool_tried_ = true;
        std::error_code ec;
        fs::create_directories(cfg_.dump_dir, ec);
        pool_ = std::make_unique<DirPool>(
            join_like_pathlib(cfg_.dump_dir, ".prealloc_pid" + std::to_string(::getpid())),
            std::vector<std::string>{
                std::string(dump_schema::kMetadataFile),
                dump_schema::tensor_file(dump_schema::kInputsStem, cfg_.safetensors),
                pending_outputs_name(cfg_.safetensors)});
      }
      pool = pool_.get();
    }
    const std::string prepared = pool ? pool->take() : "";
    if (!prepared.empty() && ::rename(prepared.c_str(), dir.c_str()) == 0) return true;
  }
  make_call_dir(dir);
  return false;
}

void DumpWriter::write_outputs(const std::string& dir, const NamedTensors& t, bool prepared) {
  if (!prepared) {
    write_tensors(dir, dump_schema::kOutputsStem, t);
    return;
  }
  const std::string pending = dir + "/" + pending_outputs_name(cfg_.safetensors);
  if (t.empty()) {
    ::unlink(pending.c_str());
    return;
  }
  const std::string path =
      dir + "/" + dump_schema::tensor_file(dump_schema::kOutputsStem, cfg_.safetensors);
  if (cfg_.safetensors) {
    save_safetensors(pending, t);
  } else {
    formats::save_torch_stem(pending, dump_schema::kOutputsStem, t);
  }
  if (::rename(pending.c_str(), path.c_str()) != 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "cannot rename '", pending,
                    "': ", std::strerror(errno));
  }
}

void DumpWriter::drop_prepared(const std::string& dir, bool inputs, bool outputs) {
  if (inputs) {
    ::unlink(
        (dir + "/" + dump_schema::tensor_file(dump_schema::kInputsStem, cfg_.safetensors)).c_str());
  }
  if (outputs) ::unlink((dir + "/" + pending_outputs_name(cfg_.safetensors)).c_str());
}

DumpWriter::DumpWriter(Config config, LineSink sink)
    : cfg_(std::move(config)),
      sink_(std::move(sink)),
      session_path_(join_like_pathlib(cfg_.dump_dir, std::string(dump_schema::kSessionFile))),
      store_(join_like_pathlib(cfg_.dump_dir, std::string(formats::kDedupDir))) {}

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
  Stats s;
  s.dumps = dump_count_;
  s.total_bytes = total_bytes_;
  s.failed = failed_;
  s.distinct_bytes = distinct_bytes_;
  return s;
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
  if (cfg_.dedup) {
    write_dedup(dir, stem, t);
    return;
  }
  const std::string path = dir + "/" + dump_schema::tensor_file(stem, cfg_.safetensors);
  if (cfg_.safetensors) {
    save_safetensors(path, t);
  } else {
    save_torch(path, t);
  }
}

namespace {

void write_file(const std::string& path, const void* data, std::size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "cannot create '", path,
                    "': ", std::strerror(errno));
  }
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "writing '", path,
                      "' failed: ", w < 0 ? std::strerror(err) : "no progress");
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  ::close(fd);
}

void shape_text(std::string& s, const Shape& v) {
  s += '[';
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  s += ']';
}

}  // namespace

void DumpWriter::write_dedup(const std::string& dir, std::string_view stem, const NamedTensors& t) {
  std::string refs = "{\"format\": ";
  append_json_string(refs, formats::kDedupFormat);
  refs += ", \"tensors\": [";
  for (std::size_t i = 0; i < t.size(); ++i) {
    const auto& [key, x0] = t[i];
    const Tensor x = x0.device().is_cpu() ? x0 : x0.to(Device::cpu());
    const auto [begin, end] = detail::covered_span(x.shape(), x.strides(), x.storage_offset());
    const std::size_t esize = dtype_size(x.dtype());
    const std::size_t n = static_cast<std::size_t>(end - begin) * esize;
    const auto* base =
        n ? static_cast<const char*>(x.data_ptr()) - (x.storage_offset() - begin) * esize : nullptr;
    const std::string blob = formats::dedup_blob_name(base, n);
    bool known = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      known = blobs_written_.count(blob) != 0;
    }
    if (!known) {
      const std::string final_path = store_ + "/" + blob;
      struct stat st {};
      // Another process (or an earlier session in this directory) may have stored it.
      if (::stat(final_path.c_str(), &st) != 0 || static_cast<std::size_t>(st.st_size) != n) {
        if (::mkdir(store_.c_str(), 0777) != 0 && errno != EEXIST) {
          fs::create_directories(store_);
        }
        int64_t k = 0;
        {
          std::lock_guard<std::mutex> l(mu_);
          k = ++tmp_counter_;
        }
        // Written aside and renamed into place: a reader never sees half a blob.
        const std::string tmp =
            final_path + ".tmp" + std::to_string(::getpid()) + "_" + std::to_string(k);
        write_file(tmp, base, n);
        if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
          ::unlink(tmp.c_str());
          FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "cannot rename '", tmp,
                          "': ", std::strerror(errno));
        }
        std::lock_guard<std::mutex> l(mu_);
        distinct_bytes_ += n;
      }
      std::lock_guard<std::mutex> l(mu_);
      blobs_written_.insert(blob);
    }
    if (i) refs += ", ";
    refs += "{\"key\": ";
    append_json_string(refs, key);
    refs += ", \"blob\": ";
    append_json_string(refs, blob);
    refs += ", \"dtype\": ";
    append_json_string(refs, dtype_torch_name(x.dtype()));
    refs += ", \"shape\": ";
    shape_text(refs, x.shape());
    refs += ", \"stride\": ";
    shape_text(refs, x.strides());
    refs += ", \"storage_offset\": " + std::to_string(x.storage_offset() - begin);
    refs += ", \"nbytes\": " + std::to_string(n) + "}";
  }
  refs += "]}\n";
  write_file(dir + "/" + std::string(stem) + std::string(formats::kDedupRefsSuffix), refs.data(),
             refs.size());
}

uint64_t DumpWriter::distinct_bytes() {
  std::lock_guard<std::mutex> l(mu_);
  return distinct_bytes_;
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
