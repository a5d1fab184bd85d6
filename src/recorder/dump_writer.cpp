#include "recorder/dump_writer.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

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

std::size_t timestamp_now_into(char (&out)[kTimestampCap]) {
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
  std::memcpy(out, secs, secs_len);
  out[secs_len] = '_';
  out[secs_len + 1] = static_cast<char>('0' + m / 100);
  out[secs_len + 2] = static_cast<char>('0' + m / 10 % 10);
  out[secs_len + 3] = static_cast<char>('0' + m % 10);
  return secs_len + 4;
}

std::string timestamp_now() {
  char buf[kTimestampCap];
  return std::string(buf, timestamp_now_into(buf));
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

int64_t current_pid() {
  // Renewed in a forked child by the atfork handler registered with the first use.
  static std::atomic<int64_t> pid{-1};
  static std::once_flag once;
  std::call_once(once, [] {
    pid.store(::getpid());
    ::pthread_atfork(nullptr, nullptr, [] { pid.store(::getpid()); });
  });
  return pid.load(std::memory_order_relaxed);
}

namespace {

// save_torch's archive, written to an open (empty) file and closed: the layout comes from a
// per-thread cache (the same op records the same names, dtypes, shapes and strides call after
// call; pickling them and laying out the zip headers was a sixth of the call's CPU time), and the
// tensor bytes go through one copy (each entry's CRC and its bytes in the file from the same
// copy, so a tensor written by another thread meanwhile still gives a valid archive): a small
// archive is one write(2).
void write_torch_fd(Fd& fd, const std::string& path, std::string_view stem, const NamedTensors& t) {
  thread_local std::unordered_map<std::string, formats::ArchivePlan> cache;
  std::string key(stem);
  std::vector<const void*> data;
  data.reserve(t.size());
  std::vector<Tensor> host;  // keeps copies of non-CPU tensors alive while writing
  for (const auto& [name, x0] : t) {
    FLASHINFER_CHECK(x0.defined(), "save_torch", name, "undefined tensor");
    const Tensor& x = x0.device().is_cpu() ? x0 : host.emplace_back(x0.to(Device::cpu()));
    int64_t begin = x.storage_offset(), end = begin;
    if (x.numel() > 0) {
      std::tie(begin, end) = detail::covered_span(x.shape(), x.strides(), x.storage_offset());
    }
    const std::size_t es = dtype_size(x.dtype());
    data.push_back(end > begin ? static_cast<const char*>(x.data_ptr()) -
                                     (x.storage_offset() - begin) * static_cast<int64_t>(es)
                               : nullptr);
    const int64_t sizes[] = {static_cast<int64_t>(name.size()), static_cast<int64_t>(x.dtype()),
                             static_cast<int64_t>(x.dim()), x.storage_offset() - begin,
                             end - begin};
    key.append(reinterpret_cast<const char*>(sizes), sizeof(sizes));
    key += name;
    key.append(reinterpret_cast<const char*>(x.shape().data()), x.dim() * sizeof(int64_t));
    key.append(reinterpret_cast<const char*>(x.strides().data()), x.dim() * sizeof(int64_t));
  }
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::vector<formats::TorchItem> items;
    items.reserve(t.size());
    for (const auto& [name, x] : t) items.push_back(formats::torch_item(name, x));
    if (cache.size() >= 256) cache.clear();  // bounded: programs with ever new shapes
    it = cache.emplace(std::move(key), formats::plan_torch_archive(stem, items, data)).first;
  }
  formats::ArchivePlan& plan = it->second;
  for (std::size_t i = 0; i < plan.crc_slots.size(); ++i) {
    plan.pieces[plan.crc_slots[i].piece].data = data[i];
  }
  const bool ok = formats::write_archive_copied(fd.fd, plan);
  const int err = errno;
  for (const auto& slot : plan.crc_slots) plan.pieces[slot.piece].data = nullptr;
  fd.reset();
  if (!ok) {
    FLASHINFER_FAIL(ErrorCode::kIo, "recorder", "", "writing '", path,
                    "' failed: ", std::strerror(err));
  }
}

}  // namespace

// ---- prepared directories
// ------------------------------------------------------------------------

std::string pending_outputs_name(bool safetensors) {
  return "." + dump_schema::tensor_file(dump_schema::kOutputsStem, safetensors) + ".pending";
}

class DirPool {
 public:
  /// A directory ready to be renamed into place, with its files open (in files_' order).
  struct Ready {
    std::string dir;
    std::vector<int> fds;
  };
  DirPool(std::string root, std::vector<std::string> files)
      : root_(std::move(root)), files_(std::move(files)), pid_(current_pid()) {
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
    if (current_pid() != pid_) {
      // A forked child: the thread is the parent's, and so are the directories.
      new std::thread(std::move(thread_));  // never joined, never destroyed
      return;
    }
    if (thread_.joinable()) thread_.join();
    for (Ready& r : ready_) {
      for (int fd : r.fds) ::close(fd);
      for (const std::string& f : files_) ::unlink((r.dir + "/" + f).c_str());
      ::rmdir(r.dir.c_str());
    }
    ready_.clear();
    ::rmdir(root_.c_str());
  }
  /// A prepared directory, or nothing when none is ready (or in a forked child).
  std::optional<Ready> take() {
    if (current_pid() != pid_) return std::nullopt;
    std::optional<Ready> r;
    bool wake = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (ready_.empty()) {
        wake = idle_;
      } else {
        r = std::move(ready_.front());
        ready_.pop_front();
        wake = idle_ && ready_.size() <= kLow;
      }
      if (wake) idle_ = false;
    }
    if (wake) cv_.notify_one();
    return r;
  }

 private:
  static constexpr std::size_t kTarget = 32;        // directories kept ready
  static constexpr std::size_t kLow = kTarget / 2;  // the thread refills from here
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
        // Full: sleep until the calls have taken half (take() wakes it once, then).
        idle_ = true;
        cv_.wait(l, [this] { return stop_ || !idle_; });
        continue;
      }
      l.unlock();
      Ready r;
      r.dir = root_ + "/p" + std::to_string(k++);
      bool ok = ::mkdir(r.dir.c_str(), 0777) == 0;
      for (std::size_t i = 0; ok && i < files_.size(); ++i) {
        // The first file is metadata.jsonl: its lines are appended.
        const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (i == 0 ? O_APPEND : 0);
        const int fd = ::open((r.dir + "/" + files_[i]).c_str(), flags, 0644);
        ok = fd >= 0;
        if (ok) r.fds.push_back(fd);
      }
      l.lock();
      if (!ok) {  // a broken directory: calls make their own
        for (int fd : r.fds) ::close(fd);
        return;
      }
      ready_.push_back(std::move(r));
    }
  }
  const std::string root_;
  const std::vector<std::string> files_;
  const int64_t pid_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Ready> ready_;
  bool stop_ = false;
  bool idle_ = false;  // the thread waits for take() to wake it
  std::thread thread_;
};

DumpWriter::~DumpWriter() = default;

PreparedFiles DumpWriter::make_call_dir(const std::string& dir, bool use_pool) {
  PreparedFiles files;
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
            join_like_pathlib(cfg_.dump_dir, ".prealloc_pid" + std::to_string(current_pid())),
            std::vector<std::string>{
                std::string(dump_schema::kMetadataFile),
                dump_schema::tensor_file(dump_schema::kInputsStem, cfg_.safetensors),
                pending_outputs_name(cfg_.safetensors)});
      }
      pool = pool_.get();
    }
    if (pool) {
      if (std::optional<DirPool::Ready> r = pool->take()) {
        Fd metadata(r->fds[0]), inputs(r->fds[1]), outputs(r->fds[2]);
        if (::rename(r->dir.c_str(), dir.c_str()) == 0) {
          files.prepared = true;
          files.metadata = std::move(metadata);
          files.inputs = std::move(inputs);
          files.outputs = std::move(outputs);
          return files;
        }
      }
    }
  }
  make_call_dir(dir);
  return files;
}

void DumpWriter::write_outputs(const std::string& dir, const NamedTensors& t,
                               PreparedFiles& files) {
  if (!files.prepared) {
    write_tensors(dir, dump_schema::kOutputsStem, t);
    return;
  }
  const std::string pending = dir + "/" + pending_outputs_name(cfg_.safetensors);
  if (t.empty()) {
    files.outputs.reset();
    ::unlink(pending.c_str());
    return;
  }
  const std::string path =
      dir + "/" + dump_schema::tensor_file(dump_schema::kOutputsStem, cfg_.safetensors);
  if (cfg_.safetensors) {
    files.outputs.reset();
    save_safetensors(pending, t);
  } else {
    write_torch_fd(files.outputs, pending, dump_schema::kOutputsStem, t);
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

void DumpWriter::write_tensors(const std::string& dir, std::string_view stem, const NamedTensors& t,
                               Fd* open) {
  if (t.empty()) return;
  if (cfg_.dedup) {
    write_dedup(dir, stem, t);
    return;
  }
  const std::string path = dir + "/" + dump_schema::tensor_file(stem, cfg_.safetensors);
  if (open && open->fd >= 0 && !cfg_.safetensors) {
    write_torch_fd(*open, path, stem, t);
    return;
  }
  if (open) open->reset();
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
    const auto* live =
        n ? static_cast<const char*>(x.data_ptr()) - (x.storage_offset() - begin) * esize : nullptr;
    std::string blob = formats::dedup_blob_name(live, n);
    bool known = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      known = blobs_written_.count(blob) != 0;
    }
    // A blob to write: its name is the hash of its bytes, which load_dedup_refs checks, so both
    // come from one copy, since another thread may write a CPU tensor meanwhile (a workspace a
    // peer rank shares). A device tensor's host copy above is already private; a blob already
    // stored costs no copy.
    std::vector<char> snapshot;
    const char* base = live;
    if (!known && live && x0.device().is_cpu()) {
      snapshot.assign(live, live + n);
      base = snapshot.data();
      blob = formats::dedup_blob_name(base, n);
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
            final_path + ".tmp" + std::to_string(current_pid()) + "_" + std::to_string(k);
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
