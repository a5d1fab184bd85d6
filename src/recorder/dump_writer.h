// Private: the writing half of the recorder. Owns the dump directory: call directories and
// their names, the count and size limits, session.jsonl, tensor files, appends of record lines,
// the recorder's log lines (through the sink it was given when installed), and the one warning
// after which recording stops.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "flashinfer/recorder.h"
#include "flashinfer/tensor_io.h"

namespace flashinfer::recorder::internal {

/// A file descriptor closed when its owner goes (a call's metadata.jsonl between its lines).
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept;
  Fd& operator=(Fd&& o) noexcept;
  ~Fd() { reset(); }
  void reset();
};

/// getpid(2), remembered (and renewed in a forked child): two system calls per recorded call
/// otherwise.
int64_t current_pid();

/// A call directory's files when it came ready from the pool (DumpWriter::make_call_dir): the
/// directory was renamed into place and its files are already open, so the call opens nothing.
struct PreparedFiles {
  bool prepared = false;
  Fd inputs;    // the empty inputs file
  Fd metadata;  // metadata.jsonl, opened for append
  Fd outputs;   // the hidden pending outputs file (renamed into place once written)
};

/// Opens `path` for append (created if missing); throws flashinfer::Error(kIo).
int open_append(const std::string& path);
/// Appends `line` + '\n' with one write(2) (an O_APPEND descriptor never tears a line).
void write_line(int fd, const std::string& path, std::string line);
/// Python's str(Path(dir) / name): drops "." components and repeated or trailing slashes.
std::string join_like_pathlib(const std::string& dir, const std::string& name);
/// Local time "YYYYMMDD_HHMMSS_mmm" (milliseconds truncated), upstream's directory timestamp.
std::string timestamp_now();
/// The same text into `out` (no allocation: the ring's hooks); returns its length.
inline constexpr std::size_t kTimestampCap = 40;
std::size_t timestamp_now_into(char (&out)[kTimestampCap]);

/// Directories made ahead, off the calls' critical path: on ext4 allocating an inode costs
/// tens of microseconds, several per call. A background thread keeps a few directories, each
/// with its empty files (metadata.jsonl, the inputs file and a hidden ".<outputs file>.pending"),
/// open, under <DUMP_DIR>/.prealloc_pid<PID>/; a call renames one into place and writes to the
/// descriptors it is handed (no path lookup). The thread is woken when half the directories
/// are taken, not on every call (a futex wake and a context switch per call otherwise).
class DirPool;

class DumpWriter {
 public:
  DumpWriter(Config config, LineSink sink);
  ~DumpWriter();

  const Config& config() const { return cfg_; }

  /// One of the recorder's log lines ("Dumped inputs to: ..."), to the sink it was installed
  /// with (or the test override of set_log_sink; stdout when neither).
  void log(const std::string& line);

  /// Whether a write failed (then nothing more is recorded).
  bool failed();
  /// Prints the one warning and stops recording.
  void fail_once(const std::string& what);
  Stats stats();

  /// The call number of a new dump of `name` (upstream's per-function counter), or nullopt
  /// with the count-limit line logged when FLASHINFER_DUMP_MAX_COUNT dumps exist.
  std::optional<int64_t> next_call(const std::string& name);
  /// "<DUMP_DIR>/<ts>_pid<PID>_<name>_call<NNNN>", as str(Path(DUMP_DIR) / name).
  std::string call_dir(const std::string& timestamp, int64_t pid, const std::string& name,
                       int64_t call_sequence) const;
  /// The call's directory: one mkdir(2); the dump directory itself is created on first use
  /// (and again if someone removed it meanwhile).
  void make_call_dir(const std::string& dir);
  /// The same from the pool of prepared directories when it has one (`use_pool`); then the
  /// result holds the prepared files, open (write_tensors, write_outputs and drop_prepared()
  /// use and tidy them).
  PreparedFiles make_call_dir(const std::string& dir, bool use_pool);
  /// The outputs file: in a prepared directory written to its pending file and renamed into
  /// place; the pending file goes when there is nothing to write.
  void write_outputs(const std::string& dir, const NamedTensors& t, PreparedFiles& files);
  /// Removes the prepared files a call did not use (no input tensors; the call raised).
  void drop_prepared(const std::string& dir, bool inputs, bool outputs);
  /// The size check upstream makes before writing inputs: false (the size-limit line logged
  /// and the directory removed) when the dump would pass FLASHINFER_DUMP_MAX_SIZE_GB.
  bool admit(const std::string& dir, const std::string& name, uint64_t input_bytes);
  /// Counts a dump whose line 1 is written; returns the number of dumps so far.
  int64_t count_dump(uint64_t input_bytes);
  /// Adds output bytes; returns the total written so far.
  uint64_t add_bytes(uint64_t bytes);

  /// <dir>/<stem>.pt or .safetensors (nothing for no tensors); in dedup mode
  /// <dir>/<stem>.refs.json and the blobs not yet in <DUMP_DIR>/tensors/.
  /// With `open` (a prepared file, empty) a torch archive is written to it, and it is closed.
  void write_tensors(const std::string& dir, std::string_view stem, const NamedTensors& t,
                     Fd* open = nullptr);
  /// Appends one line to <DUMP_DIR>/session.jsonl (kept open for the recorder's life).
  void append_session(const std::string& line);
  /// Bytes of distinct tensor contents written to the dedup store.
  uint64_t distinct_bytes();
  /// Opens, appends one line to and closes `path`.
  void append(const std::string& path, const std::string& line);

 private:
  void write_dedup(const std::string& dir, std::string_view stem, const NamedTensors& t);
  Config cfg_;
  LineSink sink_;
  std::string session_path_;
  std::string store_;                    // <DUMP_DIR>/tensors
  std::set<std::string> blobs_written_;  // dedup: blob names known to be in the store
  uint64_t distinct_bytes_ = 0;
  int64_t tmp_counter_ = 0;
  Fd session_;
  std::mutex mu_;
  std::map<std::string, int64_t> counters_;
  int64_t dump_count_ = 0;
  uint64_t total_bytes_ = 0;
  bool failed_ = false;
  bool pool_tried_ = false;
  static constexpr int64_t kPoolAfterCalls = 8;  // call directories made before the pool starts
  int64_t plain_dirs_ = 0;
  std::unique_ptr<DirPool> pool_;  // made on the first call directory; goes first
};

/// Tests only (recorder_internal.h): the sink that overrides every recorder's own.
void set_override_sink(LineSink sink);

}  // namespace flashinfer::recorder::internal
