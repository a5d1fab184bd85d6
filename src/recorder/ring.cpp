#include "recorder/ring.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "api/attention_common.h"
#include "apilog/format.h"
#include "calls/name_filter.h"
#include "calls/written_tensors.h"
#include "core/cuda_runtime.h"
#include "core/strided.h"
#include "flashinfer/error.h"
#include "flashinfer/ops/page.h"
#include "flashinfer/recorder.h"
#include "formats/torch_archive.h"
#include "recorder/call_extensions.h"
#include "recorder/dump_schema.h"
#include "recorder/dump_writer.h"
#include "recorder/graph_dumps.h"
#include "recorder/python_json.h"
#include "recorder/record_json.h"
#include "recorder/record_tape.h"
#include "recorder/ring_copy.h"
#include "recorder/ring_dedup_dump.h"
#include "recorder/ring_heap.h"
#include "recorder/span_index.h"

namespace flashinfer::recorder::internal {

namespace schema = flashinfer::dump_schema;

namespace {

// ---- tensor bytes
// ------------------------------------------------------------------------------

struct BlobKey {
  uint64_t lo = 0, hi = 0, size = 0;
  bool operator==(const BlobKey&) const = default;
};
struct BlobKeyHash {
  std::size_t operator()(const BlobKey& k) const { return k.lo ^ (k.hi * 31) ^ k.size; }
};

// Where a blob's bytes came from (default mode): a span of device memory, keyed by device and
// first byte address.
struct SpanKey {
  int64_t device = 0;  // DeviceType * 65536 + index
  uintptr_t lo = 0;
  auto operator<=>(const SpanKey&) const = default;
};

// Frees large host buffers on a thread of its own. Giving a large buffer back to the system
// unmaps its pages (munmap or a heap trim: page-table and page-allocator work in proportion to
// its size); done in the hook that evicts it, it stalled the call that happened to push a
// prefill's activations out of the ring (2.6 % of a SmolLM2 decode step, session 18). The thread
// starts with the first such buffer and is never joined (its object is never destroyed, so a
// blob freed during static destruction still finds it); a forked child frees inline (the
// thread is not there, its mutex may have been held at the fork).
class Reaper {
 public:
  static constexpr uint64_t kMinBytes = uint64_t{256} << 10;
  static void free_later(uint8_t* p) {
    static Reaper* r = new Reaper;  // never destroyed (see above)
    if (::getpid() != r->pid_) {
      ::operator delete(p);
      return;
    }
    {
      std::lock_guard<std::mutex> l(r->mu_);
      r->queue_.push_back(p);
    }
    r->cv_.notify_one();
  }

 private:
  Reaper() : pid_(::getpid()) {
    std::thread([this] { run(); }).detach();
  }
  void run() {
    std::vector<uint8_t*> batch;
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return !queue_.empty(); });
        batch.swap(queue_);
      }
      for (uint8_t* p : batch) ::operator delete(p);
      batch.clear();
    }
  }
  const pid_t pid_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint8_t*> queue_;
};

// Host memory for blobs, reused: a decode step keeps and evicts hundreds of activation copies,
// and going through malloc for each made the copies page-fault and the heap churn (perf: malloc,
// free and page faults took a sixth of the ring's time). Sizes are rounded up to one of two
// classes per power of two, 3 or 4 times 2^(top - 1) for a size in (2^top, 2^(top + 1)] (at
// most 50 % slack); freed buffers are kept per class up to a bound.
class BlobPool {
 public:
  explicit BlobPool(uint64_t retain) : retain_(retain) {}
  ~BlobPool() {
    for (auto& v : free_)
      for (uint8_t* p : v) ::operator delete(p);
  }
  static uint64_t rounded(uint64_t n) {
    if (n <= 256) return 256;
    const int top = 63 - __builtin_clzll(n - 1);  // 2^top < n <= 2^(top+1)
    const uint64_t quarter = uint64_t{1} << (top - 1);
    return (n + quarter - 1) / quarter * quarter;
  }
  // The free list of a rounded() size: 256 bytes, then 3 and 4 times 2^(top - 1) for each top.
  static std::size_t slot(uint64_t cls) {
    if (cls <= 256) return 0;
    const int top = 63 - __builtin_clzll(cls - 1);  // 8 <= top, 2^top < cls <= 2^(top+1)
    const uint64_t m = cls >> (top - 1);            // 3 or 4
    return 1 + static_cast<std::size_t>(top - 8) * 2 + static_cast<std::size_t>(m - 3);
  }
  uint8_t* get(uint64_t cls) {
    {
      std::lock_guard<std::mutex> l(mu_);
      std::vector<uint8_t*>& v = free_[slot(cls)];
      if (!v.empty()) {
        uint8_t* p = v.back();
        v.pop_back();
        retained_ -= cls;
        return p;
      }
    }
    return static_cast<uint8_t*>(::operator new(cls));
  }
  void put(uint8_t* p, uint64_t cls) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (retained_ + cls <= retain_) {
        free_[slot(cls)].push_back(p);
        retained_ += cls;
        return;
      }
    }
    if (cls >= Reaper::kMinBytes) {
      Reaper::free_later(p);
    } else {
      ::operator delete(p);
    }
  }

 private:
  std::mutex mu_;
  uint64_t retain_, retained_ = 0;
  // By slot(): an array, not a hash map (its bucket and node were two cold lines on every
  // blob freed and allocated, a tenth of eviction's time, session 15).
  std::array<std::vector<uint8_t*>, 1 + 56 * 2> free_;
};

// A delta's patches, in the ring's heap.
using PatchList = std::vector<formats::Patch, RingAlloc<formats::Patch>>;

// A probe's words (Blob::probe), in the ring's heap.
struct ProbeFree {
  void operator()(uint64_t* p) const noexcept;
};
using ProbeWords = std::unique_ptr<uint64_t[], ProbeFree>;

// One distinct tensor content: the covered span of a tensor's storage, on the host.
struct Blob;
using RetainedList = std::list<std::shared_ptr<Blob>, RingAlloc<std::shared_ptr<Blob>>>;
struct Blob {
  uint8_t* data = nullptr;
  uint64_t size = 0;
  bool pinned = false;
  void* event = nullptr;         // a CUDA copy not yet known to be complete
  std::optional<BlobKey> key;    // FLASHINFER_DUMP_RING_VERIFY=full: its content hash
  std::optional<SpanKey> where;  // default mode: its entry in the span table
  std::shared_ptr<std::atomic<uint64_t>> held;  // the ring's byte counter
  std::shared_ptr<BlobPool> pool;               // host blobs: where the memory goes back
  uint64_t capacity = 0;                        // bytes allocated (the pool's size class)
  // A delta (a KV cache an append wrote into): the span's bytes are `base`'s with `patches`
  // laid over; `data` holds only the patched bytes (the patches point into it), and `size`
  // stays the span's. A delta's base is never a delta.
  std::shared_ptr<Blob> base;
  PatchList patches;
  uint64_t patched_bytes = 0;  // the bytes at `data`: the ranges this delta's call wrote
  uint64_t patches_size = 0;   // the bytes `patches` cover
  // The delta this one was made from, when some of `patches` still point into its bytes (or
  // into those of the deltas it holds): a chain back to the base, at most kMaxDeltaChain long.
  std::shared_ptr<Blob> prev;
  uint32_t chain = 0;  // deltas from the base to this one
  // A large span shared call after call (a weight): the kept bytes same_as_kept compares (its
  // two 64-byte edges, then its 64 sampled words), copied out of the copy at the first sampled
  // comparison. Later comparisons read these few adjacent lines instead of 66 lines of the copy
  // in as many pages (a cache and TLB miss each, the largest single item of the hooks in a
  // decode step, session 16). Made and read under the ring's lock; the copy never changes, so
  // the comparisons are the same.
  ProbeWords probe;
  // Held by no kept call, kept for a later call that passes the same span (a weight):
  // RingRecorder::retained_, where `retained_at` points.
  bool retained = false;
  RetainedList::iterator retained_at;
  // The span's bytes where a whole copy sits: the blob's own, or its base's for a delta.
  const uint8_t* span_bytes() const { return base ? base->data : data; }

  // `alloc` bytes are allocated (a delta's patched bytes; the span's size otherwise).
  Blob(uint64_t n, bool pin, std::shared_ptr<std::atomic<uint64_t>> counter,
       std::shared_ptr<BlobPool> from, uint64_t alloc = UINT64_MAX)
      : size(n), pinned(pin), held(std::move(counter)), pool(std::move(from)) {
    if (alloc == UINT64_MAX) alloc = n;
    capacity = pinned ? alloc : BlobPool::rounded(alloc);
    const detail::CudaRelaxedCaptureScope relaxed(pinned);  // (another thread's capture)
    data = pinned ? static_cast<uint8_t*>(detail::cuda_pinned_alloc(alloc)) : pool->get(capacity);
    held->fetch_add(capacity, std::memory_order_relaxed);
  }
  ~Blob() {
    const detail::CudaRelaxedCaptureScope relaxed(pinned || event);  // (another thread's capture)
    if (event) {
      detail::cuda_event_wait(event);
      detail::cuda_event_destroy(event);
    }
    if (pinned) {
      detail::cuda_pinned_free(data);
    } else {
      pool->put(data, capacity);
    }
    held->fetch_sub(capacity, std::memory_order_relaxed);
  }
  Blob(const Blob&) = delete;
  Blob& operator=(const Blob&) = delete;
};

// Spans up to this size (CPU, default mode) are copied into the kept call's arena instead of a
// blob each, and never shared across calls: sharing one meant comparing it whole with the kept
// copy (same_as_kept), about what a copy costs, and its blob, control block and span-index
// entry were each a cold line to make and another to free; the index's small classes also made
// every library write probe them (session 17). Weights, KV caches and large outputs stay blobs,
// shared by span.
constexpr uint64_t kArenaMaxBytes = 4096;

// The arenas' buffers: 4 KiB, any span an arena holds fits one. They come from the ring's heap
// (ring_heap.h: huge pages, whole 64-byte lines for the streamed copies), whose free list for
// their size hands the buffers a recycled call gave back to the next calls. (A pool of the
// ring's own in front of it added a second lock and free list, session 21. A buffer of 16 KiB
// kept by each call made the ring hold twice the bytes its calls use, all of it page-faulted in
// as the ring filled, session 17.)
constexpr uint64_t kChunkBytes = 4096;
static_assert(kArenaMaxBytes <= kChunkBytes);

// A kept call's small tensors' bytes (kArenaMaxBytes), laid end to end in 4 KiB buffers from the
// ring's heap: keeping them allocates nothing once warm and evicting the call frees nothing
// per tensor. A full buffer is followed by another, never moved, so the pointers handed out (the
// call's archive pieces, read by the crash handler) stay valid until the call is recycled.
// Written only by the thread running the call.
class Arena {
 public:
  Arena() = default;
  ~Arena() { reset(); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Room for `n` bytes (0 < n <= kArenaMaxBytes): on a line of its own from 64 bytes on (the
  // copy streams whole lines), else 16-byte aligned.
  uint8_t* take(uint64_t n) {
    const uint64_t align = n >= 64 ? 64 : 16;
    uint64_t at = (off_ + align - 1) / align * align;
    if (chunks_.empty() || at + n > kChunkBytes) {
      chunks_.reserve(chunks_.size() + 1);  // no throw between taking the buffer and holding it
      chunks_.push_back(static_cast<uint8_t*>(RingHeap::allocate(kChunkBytes)));
      off_ = at = 0;
    }
    uint8_t* p = chunks_.back() + at;
    used_ += at + n - off_;
    off_ = at + n;
    return p;
  }
  // The bytes taken since the last reset, alignment included (what the ring's bound counts).
  uint64_t used() const { return used_; }
  std::span<uint8_t* const> chunks() const { return chunks_; }
  // The buffers go back to the ring's heap (the call is recycled or freed).
  void reset() noexcept {
    for (uint8_t* p : chunks_) RingHeap::deallocate(p, kChunkBytes);
    chunks_.clear();
    off_ = used_ = 0;
  }

 private:
  std::vector<uint8_t*, RingAlloc<uint8_t*>> chunks_;  // in use order; the last being filled
  uint64_t off_ = 0;                                   // taken in chunks_.back()
  uint64_t used_ = 0;                                  // a full buffer's unused end is not counted
};

// Blobs held by a call (one per tensor, null for an arena's), in the ring's heap.
using BlobList = std::vector<std::shared_ptr<Blob>, RingAlloc<std::shared_ptr<Blob>>>;

// A kept tensor: its torch metadata and the bytes holding its span (a blob owned by the call's
// `blobs`, or the call's arena).
struct KeptTensor {
  formats::TorchItem item;
  const uint8_t* data = nullptr;
  const formats::Patch* patches = nullptr;  // a delta's patches over `data`
  std::size_t n_patches = 0;
};

// A call's tensor as keep() and note_writes() read it: its record key and the tensor (an
// argument, the result or one of its items, or an Extracted's entry), not copied.
struct TensorRef {
  std::string_view key;
  const Tensor* t = nullptr;
};
using TensorRefs = std::vector<TensorRef>;

void refs_of(const NamedTensors& tensors, TensorRefs& out) {
  out.clear();
  for (const auto& [k, t] : tensors) out.push_back({k, &t});
}

// ---- call shapes: the fast path of a call that repeats a recent call's arguments
//
// A decode step calls each op with the arguments of the step before: the same shapes,
// strides, scalars and objects over new bytes. A call's record template and archive layouts
// depend on nothing else, so the op keeps its recent ones by the XXH3-128 of the arguments'
// raw values (put_raw_value) and a call that finds its key skips what makes them: the record
// tape, the template's and layouts' keys, the tensors' extraction (about half of the hooks'
// instructions on a warm cache, session 18). The key covers every value the record text and
// layouts read (and more: a float's bits, an object's whole repr), so equal keys mean equal
// templates, as with TemplateKey.

// How deep put_raw_value follows containers (the record writes to kMaxDepth; deeper values
// only make the key more specific).
constexpr int kMaxRawDepth = 6;

void put_raw_bytes(std::string& k, const void* p, std::size_t n) {
  k.append(static_cast<const char*>(p), n);
}

void put_raw_string(std::string& k, const std::string& s) {
  const uint64_t n = s.size();
  put_raw_bytes(k, &n, sizeof(n));
  k += s;
}

// Appends what `v`'s record text and archive layout are made from. A tensor is taken only where
// the record takes tensors out by position: as `v` itself when `tensor_here` (an argument, the
// result), as an item of a list or tuple `v` when `tensor_items` (a result tuple's, the *args
// holder's). False when one lies elsewhere or the nesting is deeper than kMaxRawDepth: such a
// call takes the general path.
bool put_raw_value(std::string& k, const Value& v, bool tensor_here, bool tensor_items, int depth) {
  const Value::Kind kind = v.kind();
  k.push_back(static_cast<char>(kind));
  switch (kind) {
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kBool:
      k.push_back(v.as_bool() ? 1 : 0);
      return true;
    case Value::Kind::kInt: {
      const int64_t x = v.as_int();
      put_raw_bytes(k, &x, sizeof(x));
      return true;
    }
    case Value::Kind::kFloat: {
      const double x = v.as_float();
      put_raw_bytes(k, &x, sizeof(x));
      return true;
    }
    case Value::Kind::kString:
      put_raw_string(k, v.as_string());
      return true;
    case Value::Kind::kDType: {
      const int64_t d = static_cast<int64_t>(v.as_dtype());
      put_raw_bytes(k, &d, sizeof(d));
      return true;
    }
    case Value::Kind::kEnum: {
      const EnumValue& e = v.as_enum();
      put_raw_string(k, e.type);
      put_raw_string(k, e.name);
      put_raw_string(k, e.value);
      return true;
    }
    case Value::Kind::kTensor: {
      if (!tensor_here) return false;
      const Tensor& t = v.as_tensor();
      const Device d = t.device();
      const int64_t fixed[] = {static_cast<int64_t>(t.dtype()), static_cast<int64_t>(d.type),
                               d.index, t.dim(), t.storage_offset()};
      put_raw_bytes(k, fixed, sizeof(fixed));
      put_raw_bytes(k, t.shape().data(), t.shape().size() * sizeof(int64_t));
      put_raw_bytes(k, t.strides().data(), t.strides().size() * sizeof(int64_t));
      return true;
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const auto& items = v.items();
      const uint64_t n = items.size();
      put_raw_bytes(k, &n, sizeof(n));
      if (depth >= kMaxRawDepth) return false;
      for (const Value& x : items) {
        if (!put_raw_value(k, x, tensor_items, false, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const auto& items = v.dict_items();
      const uint64_t n = items.size();
      put_raw_bytes(k, &n, sizeof(n));
      if (depth >= kMaxRawDepth) return false;
      for (const auto& [a, b] : items) {
        if (!put_raw_value(k, a, false, false, depth + 1)) return false;
        if (!put_raw_value(k, b, false, false, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kObject: {
      const ObjectRef& o = v.as_object();
      put_raw_string(k, o.type);
      put_raw_string(k, o.repr);
      put_raw_bytes(k, &o.id, sizeof(o.id));
      return true;
    }
  }
  return false;
}

// The arguments' key (put_raw_value over each argument). Tensors are taken as arguments and as
// items of a list or tuple argument: upstream's *args holder's items, which the record writes as
// arguments of their own, and a (K, V) cache pair's, which it writes as key__0, key__1.
bool put_raw_args(std::string& k, std::span<const Value> args) {
  for (const Value& a : args) {
    if (!put_raw_value(k, a, true, true, 0)) return false;
  }
  return true;
}

// Where a call's tensor is: argument `arg`, or item `item` of it (the *args holder's items, a
// cache pair's).
struct ArgAt {
  uint32_t arg = 0;
  int32_t item = -1;
  const Tensor& in(std::span<const Value> args) const {
    return item < 0 ? args[arg].as_tensor() : args[arg].items()[item].as_tensor();
  }
};

// Appends where the tensors among list or tuple argument `at`'s items are.
void push_tensor_items(std::vector<ArgAt>& out, const Value& v, uint32_t at) {
  const auto& items = v.items();
  for (std::size_t j = 0; j < items.size(); ++j) {
    if (items[j].is_tensor()) out.push_back({at, static_cast<int32_t>(j)});
  }
}

// What a call with a given argument key has: its line-1 template, its inputs' archive layout
// and which arguments are the input tensors (in the record's order).
struct InputShape {
  std::shared_ptr<const InputTemplate> tmpl;
  std::shared_ptr<const formats::ArchivePlan> layout;  // null: no input tensors
  std::vector<ArgAt> args;  // input tensor j: at args[j], key tmpl->tensors[j].key
};

// What a call with a given argument key and result key has on line 2: the template, the
// outputs' and mutated arguments' layouts, and where those tensors are.
struct OutputShape {
  std::shared_ptr<const OutputTemplate> tmpl;
  std::shared_ptr<const formats::ArchivePlan> outputs, mutated;  // null: none
  std::vector<int32_t> results;     // output j: the result (-1) or its tuple item results[j]
  std::vector<ArgAt> mutated_args;  // mutated tensor j: at mutated_args[j]
};

std::string json_escaped(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out.substr(1, out.size() - 2);  // without the quotes
}

// A kept call's files, laid out. Immutable once published, except for the CRC fields that
// writing an archive fills in (always with the same values). The record lines are not text
// yet: the call's InputRecord and, once it completed, `out` (recorder/record_tape.h) are
// written as text only when a dump is (the record text built for every kept call was about a
// third of the hooks' time, session 11).
// One archive of a kept call: a layout shared by every call whose tensors have the same
// metadata (names, dtypes, shapes, strides, spans: immutable, CRC fields unfilled) and the
// call's own bytes for each item. A dump writes it with formats::write_archive_layout, which
// computes the CRCs on the way (copying the layout into every kept call was ~15 % of the
// hooks' time, most of it cache misses on the call's cold copy, session 14).
struct KeptArchive {
  std::shared_ptr<const formats::ArchivePlan> layout;
  // Item i's bytes (pointer, size, patches).
  std::vector<formats::ArchivePlan::Piece, RingAlloc<formats::ArchivePlan::Piece>> data;
};

// The inputs archive is the call's `begin` files' only: a completed call's `end` files hold
// line 2 and the outputs and mutated arguments, and a dump takes the inputs from `begin`
// (copying them into `end` was a cold copy per call, session 18).
struct CallFiles {
  static void* operator new(std::size_t n) { return RingHeap::allocate(n); }
  static void operator delete(void* p, std::size_t n) noexcept { RingHeap::deallocate(p, n); }
  OutputRecord out;       // line 2's additions, when `complete`
  bool complete = false;  // line 2 (completed) follows line 1 (inputs_saved)
  KeptArchive inputs, outputs, mutated;
  bool has_inputs = false, has_outputs = false, has_mutated = false;
};

struct RingCall {
  // The call's directory, <ts>_pid<PID>_<name>_call<NNNN>, is laid out only when a dump writes
  // it (call_dir_name: the crash handler included), from the record's timestamp, pid and name
  // and `sequence` (two strings built for every kept call were cold lines of the hooks).
  std::string_view name_json;  // the function name, JSON-escaped (the op's copy)
  int64_t sequence = 0, process_sequence = 0;
  // Keeps every large tensor's bytes alive; null for a tensor in the arena (blobs[j] is input
  // j's: the KV-cache delta path looks inputs up by index).
  BlobList blobs;
  Arena arena;              // the small tensors' bytes
  uint64_t arena_held = 0;  // arena bytes counted in the ring's bound (under its lock)
  std::unique_ptr<CallFiles> begin, end;
  std::atomic<CallFiles*> files{nullptr};
  InputRecord rec;  // line 1's record, structured
  bool evicted = false;
  std::size_t slot = 0;  // its index in slots_ (kept index % N)
  // A wrapper's setup call (`__init__`, `plan`, `begin_forward`) and its object: once evicted
  // it is kept as an anchor, so the object's later calls in the ring still replay.
  std::optional<uint64_t> self_id;
  std::string method;
  bool setup = false;
};

// ---- async-signal-safe text and files
// ---------------------------------------------------------

// A fixed buffer that text is appended to without allocating.
struct FixedText {
  char* p;
  std::size_t cap, n = 0;
  bool overflow = false;
  FixedText(char* buf, std::size_t c) : p(buf), cap(c) { p[0] = '\0'; }
  void put(const char* s, std::size_t len) {
    if (n + len + 1 > cap) {
      overflow = true;
      return;
    }
    std::memcpy(p + n, s, len);
    n += len;
    p[n] = '\0';
  }
  void put(std::string_view s) { put(s.data(), s.size()); }
  void put_u64(uint64_t v, int min_digits = 1) {
    char d[24];
    int k = 0;
    do {
      d[k++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v > 0 || k < min_digits);
    char r[24];
    for (int i = 0; i < k; ++i) r[i] = d[k - 1 - i];
    put(r, static_cast<std::size_t>(k));
  }
};

void put_i64(FixedText& t, int64_t v) {
  if (v < 0) {
    t.put("-", 1);
    t.put_u64(static_cast<uint64_t>(0) - static_cast<uint64_t>(v));
  } else {
    t.put_u64(static_cast<uint64_t>(v));
  }
}

// `c`'s directory name, <ts>_pid<PID>_<name>_call<NNNN> (dump_writer's call_dir layout), into
// `buf` (NUL-terminated), the name JSON-escaped when `json`; empty when it does not fit.
// Allocation-free (the crash handler's dumps).
std::string_view call_dir_name(const RingCall& c, char* buf, std::size_t cap, bool json) {
  FixedText t(buf, cap);
  t.put(c.rec.timestamp.data(), c.rec.timestamp_len);
  t.put(schema::kDirPidMarker);
  t.put_u64(static_cast<uint64_t>(c.rec.pid));
  t.put("_", 1);
  t.put(json ? c.name_json : c.rec.function_name);
  t.put(schema::kDirCallMarker);
  t.put_u64(static_cast<uint64_t>(c.sequence), 4);
  if (t.overflow) {
    buf[0] = '\0';
    return {};
  }
  return {buf, t.n};
}

bool write_all(int fd, const char* p, std::size_t n) noexcept {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// mkdir -p on a mutable path buffer, component by component.
bool make_dirs(char* path) noexcept {
  const std::size_t n = std::strlen(path);
  for (std::size_t i = 1; i <= n; ++i) {
    if (path[i] == '/' || path[i] == '\0') {
      const char c = path[i];
      path[i] = '\0';
      const int rc = ::mkdir(path, 0777);
      const bool ok = rc == 0 || errno == EEXIST;
      path[i] = c;
      if (!ok) return false;
    }
  }
  return true;
}

int open_new(const char* path) noexcept {
  int fd;
  do {
    fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

const char* signal_name(int signo) {
  switch (signo) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGILL:
      return "SIGILL";
    case SIGFPE:
      return "SIGFPE";
    case SIGABRT:
      return "SIGABRT";
    default:
      return "signal";
  }
}

constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

// A kept span in the default mode: sharing it again needs the same storage object (not only
// the same address: freed memory is reused), no library write to the storage since (its
// write_count(), counted by note_write; a write through a storage that does not own its memory
// also erases the entries of every span it overlaps), and the live bytes equal to the kept copy
// where they are compared (writes made outside the library: same_as_kept).
struct SpanEntry {
  std::weak_ptr<Blob> blob;
  std::weak_ptr<Storage> storage;
  uint32_t shares = 0;  // times shared since kept
  // The same span of the same storage had been kept before: by an earlier call whose copy has
  // left (its entry stayed behind as a ghost, the blob expired), or by this call's input side
  // (a KV cache an append wrote). Worth retaining when its calls go (RingRecorder::retained_).
  bool again = false;
  // The storage's write_count() when kept. (It makes an index entry 72 bytes; packed into 64
  // with a 32-bit count, the hooks measured 3-5 % slower, unexplained: session 22.)
  uint64_t writes = 0;
};

// One size class's index of kept spans, in the ring's heap.
using SpanTable = SpanIndex<SpanEntry, RingAlloc<SpanEntry>>;

int64_t device_code(const Device& d) {
  return static_cast<int64_t>(d.type) * 65536 + static_cast<int64_t>(d.index);
}

// A delta of a delta of ... at most this many deltas from their base, with at most this many
// patches: then a whole copy (their destructors recurse along the chain; the patch list is
// copied into each new delta).
constexpr uint32_t kMaxDeltaChain = 128;
constexpr std::size_t kMaxDeltaPatches = 4096;

// Spans up to this size are compared whole; larger ones by their edges and samples.
constexpr uint64_t kWholeCompareBytes = 4096;
constexpr uint64_t kEdgeBytes = 64;
constexpr int kSamples = 64;  // 8-byte words spread evenly over the span
// Shares of a span over 4 KiB between two comparisons of its sampled words: the 64 samples lie
// in up to 64 pages, and reading them on every call that passes a weight was the largest single
// cost of the hooks (sessions 12-14: a TLB and cache miss per sample, ~10 % of the ring's time
// in a decode step). The edges are compared on every share.
constexpr uint32_t kSampleEvery = 8;

// Whether the live bytes src[at, at + len) equal what blob `b` kept there (a delta: its base
// with its patches laid over).
bool kept_equals(const Blob& b, const uint8_t* src, uint64_t at, uint64_t len) {
  if (!b.base) return std::memcmp(b.data + at, src + at, len) == 0;
  const uint8_t* base = b.base->data;
  uint64_t pos = at;
  const uint64_t end = at + len;
  // The first patch ending after `at` (a chain's delta carries many).
  const auto first =
      std::partition_point(b.patches.begin(), b.patches.end(),
                           [at](const formats::Patch& q) { return q.at + q.size <= at; });
  for (auto it = first; it != b.patches.end(); ++it) {
    const formats::Patch& q = *it;
    if (q.at + q.size <= pos) continue;
    if (q.at >= end) break;
    if (q.at > pos) {
      if (std::memcmp(base + pos, src + pos, q.at - pos) != 0) return false;
      pos = q.at;
    }
    const uint64_t e = std::min(end, q.at + q.size);
    if (std::memcmp(q.bytes + (pos - q.at), src + pos, e - pos) != 0) return false;
    pos = e;
  }
  return pos >= end || std::memcmp(base + pos, src + pos, end - pos) == 0;
}

// The default mode's check for writes made outside the library (docs/LOGGING.md), against the
// kept copy itself (no hash: exact where it looks): the whole span up to 4 KiB; above that its
// first and last 64 bytes on every share, and on every kSampleEvery-th share of the entry also
// 64 words spread evenly. A write that changes none of the compared bytes (a few elements in
// the middle of a large tensor) is not seen; FLASHINFER_DUMP_RING_VERIFY=full is.
constexpr std::size_t kEdgeWords = kEdgeBytes / 8;
constexpr std::size_t kProbeWords = 2 * kEdgeWords + kSamples;  // Blob::probe: edges, samples

void ProbeFree::operator()(uint64_t* p) const noexcept {
  RingHeap::deallocate(p, kProbeWords * sizeof(uint64_t));
}

// The distance between two sampled words of an n-byte span (the first at 0, the last ending at
// or before n).
constexpr uint64_t sample_step(uint64_t n) { return (n - 8) / (kSamples - 1); }

// The comparison of a span of `n` > kWholeCompareBytes live bytes at `live` with its kept copy:
// its first and last kEdgeBytes, and when `sampled` its kSamples words spread evenly.
// `equal(at, len, word)` compares live[at, at + len) with the kept bytes there, which a probe
// (Blob::probe) holds from its word `word` on.
template <typename Equal>
bool edges_and_samples_equal(const uint8_t* live, uint64_t n, bool sampled, Equal&& equal) {
  if (!equal(0, kEdgeBytes, 0) || !equal(n - kEdgeBytes, kEdgeBytes, kEdgeWords)) return false;
  if (!sampled) return true;
  const uint64_t step = sample_step(n);
  // Asked for all at once, the samples' misses overlap instead of each waiting for the last.
  for (int i = 0; i < kSamples; ++i) __builtin_prefetch(live + step * static_cast<uint64_t>(i));
  for (int i = 0; i < kSamples; ++i) {
    if (!equal(step * static_cast<uint64_t>(i), 8, 2 * kEdgeWords + static_cast<std::size_t>(i))) {
      return false;
    }
  }
  return true;
}

bool same_as_kept(Blob& b, const uint8_t* src, uint64_t n, uint32_t shares) {
  // (No CPU span this small is shared since the arena, kArenaMaxBytes: kept for a lower limit.)
  if (n <= kWholeCompareBytes) return kept_equals(b, src, 0, n);
  const bool sampled = shares % kSampleEvery == 0;
  if (sampled && !b.probe && !b.base) {
    const uint64_t step = sample_step(n);
    b.probe.reset(static_cast<uint64_t*>(RingHeap::allocate(kProbeWords * sizeof(uint64_t))));
    uint64_t* w = b.probe.get();
    std::memcpy(w, b.data, kEdgeBytes);
    std::memcpy(w + kEdgeWords, b.data + n - kEdgeBytes, kEdgeBytes);
    for (int i = 0; i < kSamples; ++i) {
      std::memcpy(w + 2 * kEdgeWords + i, b.data + step * static_cast<uint64_t>(i), 8);
    }
  }
  // Against the probe once it is made, else the copy.
  return edges_and_samples_equal(src, n, sampled, [&](uint64_t at, uint64_t len, std::size_t word) {
    return b.probe ? std::memcmp(b.probe.get() + word, src + at, len) == 0
                   : kept_equals(b, src, at, len);
  });
}

// same_as_kept for the bytes [at, at + n) of blob `b` (a whole copy, no delta) against the live
// span `src` (the blob's first byte's live address): the same comparison over the view, made
// against the copy (the blob's probe holds the whole span's words, not the view's).
bool same_as_kept_at(const Blob& b, const uint8_t* src, uint64_t at, uint64_t n, uint32_t shares) {
  if (n <= kWholeCompareBytes) return kept_equals(b, src, at, n);
  return edges_and_samples_equal(
      src + at, n, shares % kSampleEvery == 0,
      [&](uint64_t x, uint64_t len, std::size_t) { return kept_equals(b, src, at + x, len); });
}

// Whether the NaN trigger checks `t` on its span's bytes: a CPU tensor whose elements fill its
// span (no gaps) in one of ring_checkable's dtypes.
bool nonfinite_checked_on_bytes(const Tensor& t, uint64_t span_elems) {
  return t.device().is_cpu() && static_cast<uint64_t>(t.numel()) == span_elems &&
         ring_checkable(t.dtype());
}

// The NaN trigger's check of a kept tensor: over `bytes` (its live bytes) when
// nonfinite_checked_on_bytes; others (strided, fp8, CUDA) take the level-5 statistics path.
bool kept_has_nonfinite(const Tensor& t, const uint8_t* bytes, uint64_t span_elems) {
  if (!dtype_is_floating(t.dtype()) || t.numel() == 0) return false;
  if (nonfinite_checked_on_bytes(t, span_elems)) {
    return ring_any_nonfinite(bytes, span_elems * dtype_size(t.dtype()), t.dtype());
  }
  return detail::apilog::tensor_has_nonfinite(t);
}

// The NaN trigger's check of a delta's new bytes (what the op wrote; the rest was checked when
// it was written, or was not written by the library): false when `t` is not a tensor whose
// elements fill its span in one of the four dtypes (the caller checks it whole then).
bool patches_have_nonfinite(const Tensor& t, uint64_t span_elems, const Blob& delta,
                            bool& handled) {
  handled = t.device().is_cpu() && static_cast<uint64_t>(t.numel()) == span_elems;
  if (!handled) return false;
  if (!ring_checkable(t.dtype())) {
    handled = !dtype_is_floating(t.dtype());
    return false;
  }
  const uint64_t es = dtype_size(t.dtype());
  return ring_any_nonfinite(delta.data, delta.patched_bytes / es * es, t.dtype());
}

// Byte ranges [at, at + size) of a kept span, sorted.
using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

// Sorts `r` and merges ranges that overlap or touch.
void merge_ranges(Ranges& r) {
  std::sort(r.begin(), r.end());
  std::size_t k = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (k > 0 && r[i].first <= r[k - 1].first + r[k - 1].second) {
      const uint64_t end = std::max(r[k - 1].first + r[k - 1].second, r[i].first + r[i].second);
      r[k - 1].second = end - r[k - 1].first;
    } else {
      r[k++] = r[i];
    }
  }
  r.resize(k);
}

constexpr std::string_view kAppendPagedKVCache = "append_paged_kv_cache";

// The rows an append wrote into its cache `c` ([pages, 2, page_size, Hkv, D] for NHD, [pages,
// 2, Hkv, page_size, D] for HND), as byte ranges from `span_begin` (in elements): each appended
// token's K and V rows (D elements per head) in its page's slot. `indptr` and `indices` as the
// call passed them (request b's pages are indices[indptr[b]:indptr[b + 1]]; the op rebases both
// to indptr's first entry, which leaves the sum the same). The op has run and checked its
// arguments; the bounds here only keep the reads inside the arrays. False when out of bounds.
bool append_rows(const Tensor& c, bool hnd, std::span<const int32_t> bi,
                 std::span<const int32_t> pos, std::span<const int32_t> indices,
                 std::span<const int32_t> indptr, int64_t span_begin, Ranges& out) {
  if (c.dim() != 5 || c.size(1) != 2 || c.stride(4) != 1 || bi.size() != pos.size()) return false;
  const int64_t pages = c.size(0), dim = c.size(4);
  const int64_t page_size = hnd ? c.size(3) : c.size(2), heads = hnd ? c.size(2) : c.size(3);
  const int64_t token_stride = hnd ? c.stride(3) : c.stride(2);
  const int64_t head_stride = hnd ? c.stride(2) : c.stride(3);
  if (page_size < 1) return false;
  const uint64_t es = dtype_size(c.dtype());
  const auto n_ptr = static_cast<int64_t>(indptr.size());
  const auto n_idx = static_cast<int64_t>(indices.size());
  for (std::size_t i = 0; i < bi.size(); ++i) {
    const int64_t b = bi[i], p = pos[i];
    const int64_t slot = b >= 0 && b + 1 < n_ptr && p >= 0
                             ? int64_t{indptr[static_cast<std::size_t>(b)]} + p / page_size
                             : -1;
    const int64_t page = slot >= 0 && slot < n_idx ? indices[static_cast<std::size_t>(slot)] : -1;
    if (page < 0 || page >= pages) return false;
    for (int64_t kv = 0; kv < 2; ++kv) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t e = c.storage_offset() + page * c.stride(0) + kv * c.stride(1) +
                          p % page_size * token_stride + h * head_stride;
        if (e < span_begin) return false;
        out.emplace_back(static_cast<uint64_t>(e - span_begin) * es,
                         static_cast<uint64_t>(dim) * es);
      }
    }
  }
  return true;
}

// The bytes append_paged_kv_cache wrote into its single-tensor cache `cache`, relative to the
// first byte of the cache's kept span (`span_begin`, in elements): append_rows over the call's
// index tensors, each read in place when it is a contiguous CPU int32 vector (as the engines
// and the example pass them), else through the API's host copy (api::index_to_host). (Reading
// them through the API's loaders, views and copies of each, took ~90 allocations per append,
// most of the append's end hook beyond its copies, session 21.) False when the call is not one
// this understands (a (K, V) pair, CUDA tensors): the cache is then copied whole.
bool append_written_ranges(const OpDecl& decl, std::span<const Value> args, const Tensor& cache,
                           int64_t span_begin, Ranges& out) {
  out.clear();
  const auto arg = [&](std::string_view name) -> const Value* {
    for (std::size_t i = 0; i < decl.params.size() && i < args.size(); ++i) {
      if (decl.params[i].name == name) return &args[i];
    }
    return nullptr;
  };
  const Value* key = arg("append_key");
  const Value* bi = arg("batch_indices");
  const Value* pos = arg("positions");
  const Value* kv = arg("paged_kv_cache");
  const Value* indices = arg("kv_indices");
  const Value* indptr = arg("kv_indptr");
  const Value* layout = arg("kv_layout");
  if (!key || !bi || !pos || !kv || !indices || !indptr || !layout) return false;
  if (!kv->is_tensor() || !key->is_tensor() || !bi->is_tensor() || !pos->is_tensor() ||
      !indices->is_tensor() || !indptr->is_tensor() || layout->kind() != Value::Kind::kString) {
    return false;
  }
  const Tensor& c = kv->as_tensor();
  if (!c.device().is_cpu() || c.data_ptr() != cache.data_ptr() || c.shape() != cache.shape() ||
      c.strides() != cache.strides() || key->as_tensor().dim() < 1) {
    return false;
  }
  try {
    const char* op = "append_paged_kv_cache";
    const bool hnd = api::parse_kv_layout(layout->as_string(), op, "kv_layout");
    const int64_t nnz = key->as_tensor().size(0);
    std::vector<int32_t> copies[4];
    const auto ints = [op](const Value* v, const char* name, int64_t n,
                           std::vector<int32_t>& copy) -> std::span<const int32_t> {
      const Tensor& t = v->as_tensor();
      if (t.device().is_cpu() && t.dtype() == DType::kInt32 && t.dim() == 1 &&
          (t.size(0) <= 1 || t.stride(0) == 1) && (n < 0 || t.size(0) == n)) {
        return {static_cast<const int32_t*>(t.data_ptr()), static_cast<std::size_t>(t.size(0))};
      }
      copy = api::index_to_host(t, op, name, n);
      return copy;
    };
    if (!append_rows(c, hnd, ints(bi, "batch_indices", nnz, copies[0]),
                     ints(pos, "positions", nnz, copies[1]),
                     ints(indices, "kv_indices", -1, copies[2]),
                     ints(indptr, "kv_indptr", -1, copies[3]), span_begin, out)) {
      out.clear();
      return false;
    }
  } catch (const std::exception&) {
    return false;
  }
  merge_ranges(out);
  return true;
}

// A small tensor kept by the call's outputs or written arguments (its span `src`, `n` bytes),
// and where its copy went: a result that is also a written argument is copied once.
struct SmallWritten {
  const uint8_t* src;
  uint64_t n;
  const uint8_t* kept;
};

const uint8_t kNoBytes[1] = {0};  // where an empty tensor's (zero) bytes are

// Keeps CPU tensor `t`'s span (`src`, `n` <= kArenaMaxBytes bytes, `span_elems` elements) in
// `arena`, with the NaN trigger's check (`nonfinite`, as keep()'s) fused into the copy where it
// can be; returns where the bytes are. `just_written`: a span already kept by this
// on_call_end is not copied again. The copy is streamed (nothing compares it: no reads of the
// arena's cold lines before they are written), unfenced: ring_copy_fence() before publishing.
// `small_written`: the spans this on_call_end kept so far.
const uint8_t* keep_small(const Tensor& t, const uint8_t* src, uint64_t n, uint64_t span_elems,
                          Arena& arena, bool* nonfinite, bool just_written,
                          std::vector<SmallWritten>& small_written, uint64_t& copied) {
  const uint8_t* kept = nullptr;
  bool checked = false;
  if (just_written) {
    for (const SmallWritten& w : small_written) {
      if (w.src == src && w.n == n) kept = w.kept;
    }
  }
  if (!kept && n == 0) kept = kNoBytes;
  if (!kept) {
    uint8_t* dst = arena.take(n);
    checked = nonfinite && !*nonfinite && nonfinite_checked_on_bytes(t, span_elems);
    const bool bad = ring_copy_streamed(dst, src, n, checked, t.dtype());
    if (checked) *nonfinite = bad;
    if (just_written) small_written.push_back({src, n, dst});
    kept = dst;
    copied += n;
  }
  // The live bytes (equal to the kept ones).
  if (nonfinite && !*nonfinite && !checked) *nonfinite = kept_has_nonfinite(t, src, span_elems);
  return kept;
}

// Points `dst`'s items at the kept tensors' bytes (its layout set by the caller).
void set_pieces(KeptArchive& dst, const std::vector<KeptTensor>& t) {
  dst.data.resize(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    // The item's span in bytes: its data piece's size in the layout (not read there: cold).
    const uint64_t n = static_cast<uint64_t>(t[i].item.span) * dtype_size(t[i].item.dtype);
    dst.data[i] = {t[i].data, 0, n, t[i].patches, t[i].n_patches};
  }
}

// Whether two kept archives write the same bytes: the same layout over the same blobs (so the
// same tensor bytes and CRCs). No allocation: the crash handler calls it.
bool same_archive(const KeptArchive& a, const KeptArchive& b) noexcept {
  if (a.layout != b.layout || a.data.size() != b.data.size()) return false;
  for (std::size_t i = 0; i < a.data.size(); ++i) {
    const auto &x = a.data[i], &y = b.data[i];
    if (x.data != y.data || x.size != y.size || x.patches != y.patches ||
        x.n_patches != y.n_patches) {
      return false;
    }
  }
  return true;
}

bool same_owner(const std::weak_ptr<Storage>& a, const std::shared_ptr<Storage>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

// TextOut's sink in a dump: the same bytes to two files (fds[0], fds[1]).
void write_to_fds(void* ctx, const char* p, std::size_t n) {
  const int* fds = static_cast<const int*>(ctx);
  write_all(fds[0], p, n);
  write_all(fds[1], p, n);
}

}  // namespace

// A kept call's metadata.jsonl lines as text, from its structured record: line 1
// (inputs_saved) and, once the call completed, line 2 (completed); `dump_dir_json` are the
// pieces of the call directory's JSON-escaped path (no quotes); `extra` the members after
// upstream's keys (the dedup layout's "tensor_store", as record-everything mode writes it). Every
// dump writes records through this (dump_ring, SIGUSR1, nan, error, exit, and the crash handler):
// it allocates nothing and is async-signal-safe.
void write_kept_call_records(const RingCall& c, const CallFiles& f,
                             std::span<const std::string_view> dump_dir_json, TextOut& out,
                             std::string_view extra) noexcept {
  write_record_line(c.rec, nullptr, dump_dir_json, out, extra);
  if (f.complete) write_record_line(c.rec, &f.out, dump_dir_json, out, extra);
}

namespace {}  // namespace

// ---- the recorder
// --------------------------------------------------------------------------------

std::atomic<uint64_t> g_next_ring_id{0};  // RingRecorder::id_

class RingRecorder final : public CallObserver, public std::enable_shared_from_this<RingRecorder> {
 public:
  RingRecorder(Config c, LineSink sink);
  ~RingRecorder() override;

  void on_call_begin(const OpDecl& decl, std::span<const Value> args) override;
  void on_call_end(const OpDecl& decl, std::span<const Value> args, const Value& result) override;
  void on_call_error(const OpDecl& decl, std::span<const Value> args,
                     std::string_view what) override;
  // Every call, kept or not: what a filtered-out call writes must reach the span table too.
  bool wants(const OpDecl&) override { return true; }

  std::string dump(const std::string& reason, RingCall* trigger);
  // From the crash handler: no allocation, no locks.
  void dump_from_signal(int signo) noexcept;
  Stats stats();
  void install_handlers();
  void remove_handlers();

 private:
  struct OpInfo;
  // An input shared at the begin hook without its comparison with the kept copy, which the end
  // hook makes (deferred_checks_locked): reading any byte of a weight's first page just before
  // the GEMM that streams it made that GEMM's kernel 25 % slower (SmolLM2's down projection,
  // session 23). Only for CPU inputs the call does not write, which are the bytes it read
  // until it returns.
  struct Deferred {
    std::shared_ptr<Blob> blob;
    const uint8_t* src = nullptr;  // the live span
    uint64_t n = 0;
    uint32_t shares = 0;  // the share count same_as_kept takes (its sampling)
    uint32_t index = 0;   // the input's position (its blob and archive piece)
    std::shared_ptr<Storage> storage;
  };
  static constexpr std::size_t kMaxDeferred = 4;
  struct Pending {
    std::shared_ptr<RingCall> call;
    OpInfo* op = nullptr;   // the call's op (its archive templates)
    bool observed = false;  // not kept (filtered out, or captured), but its writes are noted
    bool keyed = false;     // in_key is the arguments' key (the op's shapes apply)
    bool asked = false;     // the begin asked the runtime about a capture (a CUDA argument)
    TemplateKey in_key;
    std::array<Deferred, kMaxDeferred> deferred;
    std::size_t n_deferred = 0;
  };
  // A thread's working memory for the hooks (they do not nest within a thread), reused from
  // call to call: one thread_local, reached once per hook (each thread_local of a shared
  // library is a __tls_get_addr call; two dozen of them were ~4 % of the hooks, session 18).
  struct HookScratch {
    std::vector<Pending> stack;  // the calls begun and not yet ended
    Extracted ex, out, mutated;
    TensorRefs in_refs, out_refs, mut_refs;
    RecordTape metadata;
    std::string raw;  // a key's bytes (put_raw_value)
    std::vector<KeptTensor> kept_in, kept_out, kept_mut, spare;
    BlobList blobs, prior;
    std::vector<Ranges> written;
    std::vector<const Storage*> written_storages;
    std::vector<SmallWritten> small_written;
    // The ops this thread's calls used, by declaration (direct-mapped): found here, an op's
    // OpInfo needs neither the lock nor the cold lookup in signatures_ (session 18). `ring` is
    // the recorder's id (not its address, which a later recorder may reuse).
    struct OpSlot {
      const OpDecl* decl = nullptr;
      uint64_t ring = 0;
      OpInfo* op = nullptr;
    };
    std::array<OpSlot, 64> ops{};
  };
  // Not inlined: inlined, GCC recomputed the thread_local's address (a __tls_get_addr call in a
  // shared library) at each of the hooks' two dozen uses of it (session 21).
  [[gnu::noinline]] static HookScratch& scratch() {
    thread_local HookScratch s;
    return s;
  }

  // Keeps `tensors` into `out` (its elements reused: no allocation once warm), their blobs
  // into `owner` (one element per tensor: null for one copied into `arena`, the call's: spans
  // up to kArenaMaxBytes). `nonfinite` (the NaN trigger, outputs): set when a kept tensor holds
  // a NaN or an Inf.
  // `prior` and `written` (mutated arguments of an op whose writes are known, by tensor): the
  // blob the call kept for the tensor as an input and the byte ranges the op wrote into it; the
  // tensor is then kept as a delta of it when that is small (KV caches).
  // `defer` (the begin hook's inputs): where shares whose comparison waits for the end hook go
  // (Deferred), for the tensors whose storage is not in `written_storages`.
  void keep(std::span<const TensorRef> tensors, std::vector<KeptTensor>& out, BlobList& owner,
            Arena& arena, bool* nonfinite = nullptr, const BlobList* prior = nullptr,
            const std::vector<Ranges>* written = nullptr, bool just_written = false,
            Pending* defer = nullptr, std::span<const Storage* const> written_storages = {});
  // Makes the comparisons `p`'s begin hook deferred; a differing input is copied now (the bytes
  // the call read: it does not write them) and replaces the shared one in `c`.
  void deferred_checks_locked(Pending& p, RingCall* c);
  // Indexes `blob`, the new copy of span `at` (n bytes) of `t`'s storage.
  void index_locked(const std::shared_ptr<Blob>& blob, const SpanKey& at, uint64_t n,
                    const std::shared_ptr<Storage>& storage);
  // Counts the bytes `c` has taken in its arena since it was last counted in the bound.
  void count_arena_locked(RingCall& c);
  // `before`'s span (the same `at`, `n` bytes) after writes to `written`: its base with the
  // written ranges (and `before`'s own patches) copied from `src`, the live bytes. Null when
  // that would not be small (then a whole copy is the new base).
  std::shared_ptr<Blob> delta_of(const std::shared_ptr<Blob>& before, const SpanKey& at,
                                 const Ranges& written, const uint8_t* src, uint64_t n);
  // `src`: the live bytes (CPU; unread for CUDA).
  // `defer`: set instead of comparing (a whole copy, not a delta), when given.
  std::shared_ptr<Blob> share_span_locked(const SpanKey& at, uint64_t n, const Tensor& t,
                                          const uint8_t* src, bool cuda, Deferred* defer = nullptr);
  // A CPU tensor whose span lies inside a kept span of its storage (a strided view of a kept
  // tensor): that span's blob, `offset` bytes into which the view's span starts.
  std::shared_ptr<Blob> share_enclosing_locked(const SpanKey& at, uint64_t n, const Tensor& t,
                                               const uint8_t* src, uint64_t& offset);
  // A recorded (or filtered-out) call wrote `tensors`: kept spans overlapping them are stale.
  void note_writes(std::span<const TensorRef> tensors);
  void note_write_locked(const Tensor& t);
  // Points `dst` at the layout of an archive of `t` (shared) and at t's bytes. `side`: 0 inputs,
  // 1 outputs, 2 mutated (`stem`), the op's template it looks in first. `known`: the layout,
  // when the call's shape gave it (InputShape, OutputShape).
  void plan(KeptArchive& dst, std::string_view stem, const std::vector<KeptTensor>& t, OpInfo& op,
            int side, const std::shared_ptr<const formats::ArchivePlan>* known = nullptr);
  // Remembers the shapes of a call that took the general path (its key `k`), when its
  // tensors are where the fast path looks for them.
  void remember_input_shape(OpInfo& op, const TemplateKey& k, const OpDecl& decl,
                            std::span<const Value> args, const Extracted& ex, const RingCall& c,
                            const CallFiles& files);
  void remember_output_shape(OpInfo& op, const TemplateKey& k, const OpDecl& decl,
                             std::span<const Value> args, const Value& result, const Extracted& out,
                             const Extracted& mutated, const CallFiles& files);
  void publish(const std::shared_ptr<RingCall>& call);
  void evict_oldest_locked();
  void release_locked(RingCall& c);
  // Frees `b` (unless held elsewhere) and forgets its key or span once it is gone.
  void forget_locked(std::shared_ptr<Blob> b);
  // The span index's entry that `b` is the kept copy of, while its storage is alive and
  // unwritten by the library since: the entry a later call can share `b` by. Null otherwise.
  SpanEntry* current_entry_locked(const Blob& b);
  // `b`, which no kept call holds any more, when a later call could share it
  // (current_entry_locked): moved into retained_ if its span was shared or kept before, or else
  // freed with its index entry left as a ghost (SpanEntry::again). False when it cannot be
  // shared (forget_locked frees it then).
  bool retain_locked(std::shared_ptr<Blob>& b);
  // `b` is held by a call again (or will be freed): out of retained_. The caller holds `b`.
  void unretain_locked(Blob& b);
  void drop_retained_locked();  // the oldest retained blob
  // What a call wrote is unknown (extracting it failed): nothing kept is shared any more.
  void unshare_all_locked() {
    for (auto& m : spans_) m.clear();
    while (!retained_.empty()) drop_retained_locked();
  }
  // Whether the ring holds more than its bound once every retained blob is dropped (they go
  // before any kept call does).
  bool over_bound_locked();
  void anchor_locked(std::shared_ptr<RingCall> c);
  // An evicted call no one else holds is cleared and kept for the next call: freeing its
  // strings and file layouts and allocating them again was ~6 % of the hooks' time.
  void recycle_locked(std::shared_ptr<RingCall> c);
  std::shared_ptr<RingCall> new_call();
  void wait_copies_locked();
  // Per op: its record tail (record_tail: format, signature, versions), laid out once, and its
  // call counter (counters_, by name), found by one lookup of the declaration.
  // Per side (inputs, outputs, mutated), the op's last few archive layouts (plan()): a call
  // with the tensor metadata of one of the op's recent calls finds its layout here, in the
  // entry the hook has just touched, instead of in the per-thread cache (whose bucket and node
  // were two cold lines per archive, half of plan's own time, session 15).
  struct OpInfo {
    std::string name, module, tail;  // the kept calls' records point at name and module
    std::string name_json;           // name, JSON-escaped (call directories in a dump)
    std::atomic<int64_t>* calls = nullptr;
    std::array<RecentTemplates<formats::ArchivePlan>, 3> layouts;
    // The record templates of the op's recent calls (record_tape.h), shared by its kept calls.
    RecentTemplates<InputTemplate> input_records;
    RecentTemplates<OutputTemplate> output_records;
    // The fast path (InputShape): by the arguments' key, and by that and the result's key.
    // No record extension, or one that says per call whether it applies (extension_applies:
    // such calls take the general path, the others the fast one).
    bool shapes_apply = false;
    const detail::ExtensionAppliesFn* extension_applies = nullptr;
    int var_positional = -1;  // the *args holder's parameter
    RecentTemplates<InputShape> input_shapes;
    RecentTemplates<OutputShape> output_shapes;
  };
  OpInfo& op_info_locked(const OpDecl& decl);
  // Writes the kept calls under `root` (a buffer holding the root path); async-signal-safe.
  // `reason`/`signo` and `trigger` go to trigger.json. Returns false if nothing was written.
  // An archive file already written in the dump being written: an equal one is linked to it.
  struct WrittenArchive {
    const KeptArchive* archive = nullptr;
    const RingCall* call = nullptr;
    std::string_view stem;  // schema::kInputsStem ...
  };
  bool write_dump(char* root, std::size_t root_rel_at, const char* reason, int signo,
                  const RingCall* trigger, std::vector<WrittenArchive>& archives) noexcept;
  void log(const std::string& line);

  Config cfg_;
  LineSink sink_;
  const uint64_t id_ = g_next_ring_id.fetch_add(1, std::memory_order_relaxed) + 1;
  detail::NameFilter filter_;
  const int64_t pid_;
  std::string prefix_;       // join_like_pathlib(dump_dir, ""): "<dir>/"
  std::string prefix_json_;  // the same, JSON-escaped
  std::string extra_;        // record keys after upstream's (dedup layout: "tensor_store")
  uint64_t limit_bytes_;

  std::mutex mu_;
  std::deque<std::shared_ptr<RingCall>, RingAlloc<std::shared_ptr<RingCall>>>
      calls_;                                                            // oldest first
  std::unordered_map<BlobKey, std::weak_ptr<Blob>, BlobKeyHash> blobs_;  // verify=full
  // The default mode's kept spans, by size class: class k holds spans of [2^k, 2^(k+1)) bytes,
  // so a write [a, b) can only overlap spans of class k that start in (a - 2^(k+1), b): a few
  // probes per class in use, whatever the number of kept spans. Each class is a flat table
  // (span_index.h, one cache line per probe); the std::map per class it replaces cost a cold
  // line per tree level on every lookup, insert and erase (session 15).
  std::array<SpanTable, 64> spans_;
  // Bit k set when spans_[k] may be non-empty (set on insert, cleared by note_write_locked when
  // it finds the class empty): a write walks only these (the 64 map headers are 48 cache lines,
  // all cold after a GEMM; checking each for emptiness on every write was most of note_writes,
  // session 14).
  uint64_t classes_ = 0;
  // Per class, an interval holding every span in it (grown on insert, reset when the class is
  // found empty): a write outside it skips the class's tree. The large classes hold mostly the
  // weights, which no write reaches; walking their cold trees was most of note_writes' own
  // time (session 14, second round). 64 x 16 bytes, contiguous.
  struct Bounds {
    uintptr_t lo = UINTPTR_MAX, hi = 0;
  };
  std::array<Bounds, 64> bounds_{};
  static std::size_t span_class(uint64_t n) {
    return static_cast<std::size_t>(63 - __builtin_clzll(n));
  }
  // A CUDA graph was captured: its replays write CUDA memory unobserved, so CUDA spans are no
  // longer shared.
  std::atomic<bool> graphs_seen_{false};
  // Also a capture this process made before the ring started (graphs captured at an engine's
  // start-up, a ring started later or restarted).
  bool graphs_seen() const { return graphs_seen_.load() || detail::graph_capture_seen(); }
  // A call was captured: the graph's replays will write CUDA memory without any call being seen,
  // so kept CUDA spans can no longer be trusted (the CPU ones stay).
  void note_capture() {
    if (graphs_seen_.exchange(true)) return;
    std::lock_guard<std::mutex> l(mu_);
    const auto cpu = [](const auto& e) { return e.device == device_code(Device::cpu()); };
    for (auto& m : spans_) m.retain(cpu);
  }
  // A span of a storage that does not own its memory was kept (note_writes).
  std::atomic<bool> unowned_spans_{false};
  // Calls per op name (map nodes never move; atomic: counted without the lock by a call whose
  // op the thread's HookScratch::ops found).
  std::map<std::string, std::atomic<int64_t>> counters_;
  // By declaration, then name (a declaration's address may be reused by another op): entries
  // that never move, so the references op_info_locked returns stay valid. Before, the counter
  // was looked up by name in counters_ on every call (a walk over cold string nodes).
  std::unordered_map<const OpDecl*, std::list<OpInfo, RingAlloc<OpInfo>>> signatures_;
  std::shared_ptr<std::atomic<uint64_t>> held_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<BlobPool> pool_;
  // Kept spans that no kept call holds any more, still their storage's current content: kept
  // within the bound (oldest dropped first, before any call is evicted) for the next call that
  // passes them. A ring shorter than a model's decode step evicted each weight's last holder
  // before the next step passed the weight again, so every step copied the whole model: ring
  // mode was 39-42 % slower than level 0 on SmolLM2-135M with N=256 (session 23).
  RetainedList retained_;
  uint64_t retained_bytes_ = 0;
  std::atomic<uint64_t> copied_{0};  // Stats::ring_copied_bytes
  static constexpr std::size_t kMaxSpareCalls = 64;
  std::vector<std::shared_ptr<RingCall>> spare_calls_;  // recycle_locked

  // What the crash handler reads: slot k % N holds the k-th kept call (null once evicted).
  std::vector<std::atomic<RingCall*>> slots_;
  // Per slot, where the kept call in it keeps what its eviction touches (the call's own lines,
  // its blobs and arena buffers), written when the call completes. A call's begin hook, which
  // will evict the call in the slot it is about to take once the ring is full, prefetches these
  // first: they are cold by then (256 calls later), and evicting meant a dozen misses one after
  // another, a fifth of the hooks' time (session 22). Read without the lock; only prefetched.
  struct EvictHint {
    std::array<std::atomic<const void*>, 16> at{};
  };
  std::vector<EvictHint> hints_;
  void set_evict_hint_locked(const RingCall& c);
  void prefetch_eviction() const;
  std::atomic<uint64_t> kept_{0};
  // Evicted setup calls of wrapper objects still needed to replay the kept calls (call order),
  // and the same pointers for the crash handler.
  static constexpr std::size_t kMaxAnchors = 256;
  std::deque<std::shared_ptr<RingCall>> anchors_;
  std::array<std::atomic<RingCall*>, kMaxAnchors> anchor_slots_{};
  std::atomic<RingCall*> last_begun_{nullptr};
  // The archives a dump wrote, allocated ahead (the crash handler cannot allocate): one table
  // for dump() (under mu_) and one for the crash handler, which may interrupt a dump().
  std::vector<WrittenArchive> written_dump_, written_crash_;
  std::atomic<int64_t> dumps_{0};
  std::atomic<bool> nan_fired_{false}, error_fired_{false};
  std::atomic<int64_t> process_sequence_{0};

  bool trig_crash_ = false, trig_signal_ = false, trig_nan_ = false, trig_error_ = false;
  std::thread watcher_;
  int pipe_[2] = {-1, -1};
  bool handlers_ = false;
};

namespace {

std::atomic<RingRecorder*> g_crash_ring{nullptr};
std::atomic<uint64_t> g_hook_ticks{0};  // ring_hook_seconds()
std::atomic<uint64_t> g_shape_hits{0};  // ring_shape_hits()

// The hooks' clock. On x86 the time-stamp counter: two steady_clock::now() calls per hook (vDSO
// clock_gettime) were ~0.2 % of a decode step (session 19), rdtsc is a few cycles. It is
// converted to seconds only when read, by its rate against steady_clock measured at the first
// reading; the counter is invariant wherever the kernel reports constant_tsc.
uint64_t hook_ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

struct TickOrigin {
  uint64_t ticks = hook_ticks();
  std::chrono::steady_clock::time_point time = std::chrono::steady_clock::now();
};
const TickOrigin g_tick_origin;

double seconds_per_tick() {
#if defined(__x86_64__) || defined(__i386__)
  // Measured over at least 10 ms (the first reading may wait for them).
  auto now = std::chrono::steady_clock::now();
  if (now - g_tick_origin.time < std::chrono::milliseconds(10)) {
    std::this_thread::sleep_until(g_tick_origin.time + std::chrono::milliseconds(10));
  }
  const uint64_t t = hook_ticks();
  now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - g_tick_origin.time).count();
  return t > g_tick_origin.ticks ? secs / static_cast<double>(t - g_tick_origin.ticks) : 0.0;
#else
  return static_cast<double>(std::chrono::steady_clock::period::num) /
         static_cast<double>(std::chrono::steady_clock::period::den);
#endif
}

// Adds the time from its construction to its destruction to g_hook_ticks.
struct HookTimer {
  uint64_t t0 = hook_ticks();
  ~HookTimer() { g_hook_ticks.fetch_add(hook_ticks() - t0, std::memory_order_relaxed); }
};
// Dump directories are numbered per process, not per recorder: a recorder started again in
// the same process must not write into an earlier one's dump directory.
std::atomic<int64_t> g_dump_number{0};
std::atomic<int64_t> g_dump_number_pid{-1};  // the process the numbers count for (fork)
struct sigaction g_old_crash[32];
struct sigaction g_old_usr1;
std::atomic<int> g_usr1_fd{-1};
std::atomic<int> g_in_crash{0};

void crash_handler(int signo, siginfo_t*, void*) {
  RingRecorder* r = g_crash_ring.load(std::memory_order_acquire);
  if (r && g_in_crash.fetch_add(1) == 0) r->dump_from_signal(signo);
  // The previous disposition (default: terminate, with a core) takes the re-raised signal
  // when this handler returns.
  ::sigaction(signo, &g_old_crash[signo], nullptr);
  ::raise(signo);
}

void usr1_handler(int) {
  const int saved = errno;
  const int fd = g_usr1_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const char c = 'u';
    (void)!::write(fd, &c, 1);
  }
  errno = saved;
}

bool has(const std::vector<std::string>& v, const char* s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

bool is_flashinfer_error() {
  try {
    if (auto e = std::current_exception()) std::rethrow_exception(e);
  } catch (const Error&) {
    return true;
  } catch (...) {
  }
  return false;
}

std::string sanitized(const std::string& reason) {
  std::string r;
  for (char c : reason.substr(0, 64)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    r += ok ? c : '_';
  }
  return r.empty() ? "api" : r;
}

}  // namespace

RingRecorder::RingRecorder(Config c, LineSink sink)
    : cfg_(std::move(c)),
      sink_(std::move(sink)),
      filter_{cfg_.include, cfg_.exclude},
      pid_(::getpid()),
      prefix_(join_like_pathlib(cfg_.dump_dir, "")),
      prefix_json_(json_escaped(prefix_)),
      limit_bytes_(static_cast<uint64_t>(std::max<int64_t>(cfg_.ring_mb, 0)) << 20),
      slots_(static_cast<std::size_t>(std::max<int64_t>(cfg_.ring, 1))),
      hints_(slots_.size()) {
  // Freed blob memory kept for reuse: an eighth of the bound (outside it), at most 64 MiB.
  pool_ = std::make_shared<BlobPool>(std::min<uint64_t>(limit_bytes_ / 8, uint64_t{64} << 20));
  if (g_dump_number_pid.exchange(pid_) != pid_) g_dump_number.store(0);
  // Regions of at least 4 KiB: a write of an activation probes a region or two of the classes
  // of small tensors instead of one per 2^(k+1) bytes it covers. (CPU spans up to
  // kArenaMaxBytes are in the calls' arenas, not here: those classes hold CUDA spans only.)
  for (unsigned k = 0; k < spans_.size(); ++k) {
    spans_[k] = SpanTable(std::max(k + 1, 12u));
  }
  trig_crash_ = has(cfg_.triggers, "crash");
  trig_signal_ = has(cfg_.triggers, "signal");
  trig_nan_ = has(cfg_.triggers, "nan");
  trig_error_ = has(cfg_.triggers, "error");
  if (cfg_.dedup) {
    append_member(extra_, schema::kTensorStore,
                  "\"" + std::string(schema::kTensorStoreDedup) + "\"");
  }
  const std::size_t archives = (slots_.size() + kMaxAnchors) * 3;
  written_dump_.reserve(archives);
  written_crash_.reserve(archives);
}

RingRecorder::~RingRecorder() { remove_handlers(); }

void RingRecorder::log(const std::string& line) {
  // The same route as the disk recorder's lines (the override sink of tests first).
  DumpWriter w(cfg_, sink_);
  w.log(line);
}

void RingRecorder::install_handlers() {
  if (handlers_) return;
  handlers_ = true;
  if (trig_crash_) {
    g_crash_ring.store(this, std::memory_order_release);
    g_in_crash.store(0);
    struct sigaction sa {};
    sa.sa_sigaction = crash_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    for (int s : kCrashSignals) ::sigaction(s, &sa, &g_old_crash[s]);
  }
  if (trig_signal_ && ::pipe2(pipe_, O_CLOEXEC) == 0) {
    g_usr1_fd.store(pipe_[1]);
    // A SIGUSR1 only wakes this thread: the dump itself runs here, with ordinary code.
    std::weak_ptr<RingRecorder> self = weak_from_this();
    const int rd = pipe_[0];
    watcher_ = std::thread([self, rd] {
      char c = 0;
      while (true) {
        const ssize_t n = ::read(rd, &c, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || c == 'q') return;
        if (auto r = self.lock()) r->dump("signal", nullptr);
      }
    });
    struct sigaction sa {};
    sa.sa_handler = usr1_handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGUSR1, &sa, &g_old_usr1);
  }
}

void RingRecorder::remove_handlers() {
  if (!handlers_) return;
  handlers_ = false;
  if (trig_crash_) {
    RingRecorder* me = this;
    if (g_crash_ring.compare_exchange_strong(me, nullptr)) {
      for (int s : kCrashSignals) ::sigaction(s, &g_old_crash[s], nullptr);
    }
  }
  if (pipe_[1] >= 0) {
    ::sigaction(SIGUSR1, &g_old_usr1, nullptr);
    g_usr1_fd.store(-1);
    const char q = 'q';
    (void)!::write(pipe_[1], &q, 1);
    if (watcher_.joinable()) {
      if (watcher_.get_id() == std::this_thread::get_id()) {
        watcher_.detach();  // the last reference went in the watcher itself
      } else {
        watcher_.join();
      }
    }
    ::close(pipe_[0]);
    ::close(pipe_[1]);
    pipe_[0] = pipe_[1] = -1;
  }
}

RingRecorder::OpInfo& RingRecorder::op_info_locked(const OpDecl& decl) {
  auto& known = signatures_[&decl];
  for (OpInfo& op : known) {
    if (op.name == decl.name && op.module == decl.module) return op;
  }
  OpInfo& op = known.emplace_back();
  op.name = decl.name;
  op.name_json = json_escaped(decl.name);
  op.module = decl.module;
  op.tail = record_tail(false, decl.signature());
  op.calls = &counters_[decl.name];
  const bool extended = detail::record_extension(decl.name) != nullptr;
  op.extension_applies = extended ? detail::extension_applies(decl.name) : nullptr;
  op.shapes_apply = !extended || op.extension_applies != nullptr;
  if (!decl.var_positional.empty()) op.var_positional = decl.param_index(decl.var_positional);
  return op;
}

std::shared_ptr<Blob> RingRecorder::delta_of(const std::shared_ptr<Blob>& before, const SpanKey& at,
                                             const Ranges& written, const uint8_t* src,
                                             uint64_t n) {
  if (!before || before->pinned || before->size != n || !before->where || !(*before->where == at)) {
    return nullptr;
  }
  if (before->base && before->chain >= kMaxDeltaChain) return nullptr;
  thread_local Ranges w;
  w.assign(written.begin(), written.end());
  merge_ranges(w);
  uint64_t own = 0;
  for (const auto& [a, len] : w) {
    if (a + len > n) return nullptr;
    own += len;
  }
  // `before`'s patches where this call did not write: their bytes stay where they are (in
  // `before` or the deltas it holds), so each append copies only its own rows. (Copying every
  // patch since the base again on each append was most of the ring's time in an append.)
  const PatchList& bp = before->patches;
  // An append writes slots no earlier append of the chain wrote (a token's row once), so
  // `before`'s patches are usually kept whole: then its list is copied run by run between this
  // call's ranges, not walked patch by patch (~20 k instructions per append with 128 deltas
  // in the chain, session 19).
  bool disjoint = true;
  for (const auto& r : w) {
    const uint64_t a = r.first;  // (clang 14 captures no structured binding)
    const auto it = std::partition_point(
        bp.begin(), bp.end(), [a](const formats::Patch& q) { return q.at + q.size <= a; });
    if (it != bp.end() && it->at < a + r.second) {
      disjoint = false;
      break;
    }
  }
  const PatchList* carried = &bp;
  uint64_t total = own + before->patches_size;
  if (!disjoint) {
    thread_local PatchList kept;
    kept.clear();
    total = own;
    std::size_t j = 0;
    for (const formats::Patch& q : bp) {
      const uint64_t end = q.at + q.size;
      while (j < w.size() && w[j].first + w[j].second <= q.at) ++j;
      uint64_t pos = q.at;
      for (std::size_t k = j; pos < end;) {
        while (k < w.size() && w[k].first + w[k].second <= pos) ++k;
        const uint64_t stop = k < w.size() ? std::min(end, w[k].first) : end;
        if (stop > pos) {
          kept.push_back({pos, stop - pos, q.bytes + (pos - q.at)});
          total += stop - pos;
        }
        if (k == w.size() || w[k].first >= end) break;
        pos = w[k].first + w[k].second;
      }
    }
    carried = &kept;
  }
  // Past a quarter of the span (or a long chain), a whole copy becomes the next base: a chain
  // of deltas costs each append its own rows plus the list of patches, which grows with it.
  if (total > n / 4 || carried->size() + w.size() > kMaxDeltaPatches) return nullptr;
  auto blob = std::allocate_shared<Blob>(RingAlloc<Blob>{}, n, false, held_, pool_, own);
  blob->base = before->base ? before->base : before;
  if (!carried->empty()) blob->prev = before;
  blob->chain = before->base ? before->chain + 1 : 1;
  blob->patches.reserve(carried->size() + w.size());
  // Both lists are sorted and disjoint: merged by offset, the kept patches run by run.
  uint64_t off = 0;
  auto from = carried->begin();
  for (const auto& r : w) {
    const uint64_t at_w = r.first, len = r.second;  // (clang 14 captures no structured binding)
    const auto to = std::partition_point(from, carried->end(),
                                         [at_w](const formats::Patch& q) { return q.at < at_w; });
    blob->patches.insert(blob->patches.end(), from, to);
    from = to;
    std::memcpy(blob->data + off, src + at_w, len);
    blob->patches.push_back({at_w, len, blob->data + off});
    off += len;
  }
  blob->patches.insert(blob->patches.end(), from, carried->end());
  blob->patched_bytes = own;
  blob->patches_size = total;
  return blob;
}

void RingRecorder::keep(std::span<const TensorRef> tensors, std::vector<KeptTensor>& out,
                        BlobList& owner, Arena& arena, bool* nonfinite, const BlobList* prior,
                        const std::vector<Ranges>* written, bool just_written, Pending* defer,
                        std::span<const Storage* const> written_storages) {
  HookScratch& h = scratch();
  resize_reusing(out, tensors.size(), h.spare);
  bool small = false;   // a copy into the arena, to be fenced
  uint64_t copied = 0;  // Stats::ring_copied_bytes
  for (std::size_t ti = 0; ti < tensors.size(); ++ti) {
    const std::string_view key = tensors[ti].key;
    const Tensor& t = *tensors[ti].t;
    KeptTensor& k = out[ti];
    k.item.name.assign(key);
    k.item.dtype = t.dtype();
    k.item.shape.assign(t.shape().begin(), t.shape().end());
    k.item.strides.assign(t.strides().begin(), t.strides().end());
    std::shared_ptr<Blob> blob;
    bool checked = false;  // the NaN check made while copying
    int64_t begin = t.storage_offset(), end = begin;
    if (t.numel() > 0) {
      std::tie(begin, end) = detail::covered_span(t.shape(), t.strides(), t.storage_offset());
    }
    k.item.offset = t.storage_offset() - begin;
    k.item.span = end - begin;
    const uint64_t n = static_cast<uint64_t>(end - begin) * dtype_size(t.dtype());
    const uint8_t* src =
        n ? static_cast<const uint8_t*>(t.data_ptr()) - k.item.offset * dtype_size(t.dtype())
          : nullptr;
    const bool cuda = t.device().is_cuda();
    if (!cuda && !cfg_.ring_verify_full && n <= kArenaMaxBytes) {
      k.data = keep_small(t, src, n, static_cast<uint64_t>(k.item.span), arena, nonfinite,
                          just_written, h.small_written, copied);
      k.patches = nullptr;
      k.n_patches = 0;
      owner.push_back(nullptr);
      small = true;
      continue;
    }
    std::optional<SpanKey> at;
    uint64_t view_at = 0;  // where the span starts in a larger kept span shared with it
    if (!cfg_.ring_verify_full && n > 0 && !(cuda && graphs_seen())) {
      // The default mode: the same storage span, unwritten by the library since it was kept,
      // and equal to the kept copy where same_as_kept compares (CPU only: reading device
      // memory here would wait for the stream) is the same content.
      at = SpanKey{device_code(t.device()), reinterpret_cast<uintptr_t>(src)};
      if (just_written) {
        // The call's outputs and written arguments: note_writes has just counted their writes
        // (or dropped the kept spans they overlap), so no entry can be shared and the table is
        // not searched. Only a span this call kept a moment ago can be (a result that is also
        // a written argument): the same bytes now.
        for (const auto& b : owner) {
          if (b && b->where && *b->where == *at && b->size == n) blob = b;
        }
      } else {
        Deferred* d = nullptr;
        if (defer && !cuda && n > kWholeCompareBytes && defer->n_deferred < kMaxDeferred &&
            std::find(written_storages.begin(), written_storages.end(), t.storage().get()) ==
                written_storages.end()) {
          d = &defer->deferred[defer->n_deferred];
        }
        std::lock_guard<std::mutex> l(mu_);
        blob = share_span_locked(*at, n, t, src, cuda, d);
        if (blob && d && d->blob) {
          d->src = src;
          d->n = n;
          d->index = static_cast<uint32_t>(ti);
          d->storage = t.storage();
          ++defer->n_deferred;
        }
        if (!blob && !cuda) blob = share_enclosing_locked(*at, n, t, src, view_at);
      }
    } else if (!cuda) {
      const XXH128_hash_t h = XXH3_128bits(src, n);
      const BlobKey bk{h.low64, h.high64, n};
      {
        std::lock_guard<std::mutex> l(mu_);
        auto it = blobs_.find(bk);
        if (it != blobs_.end()) blob = it->second.lock();
      }
      if (!blob) {
        blob = std::allocate_shared<Blob>(RingAlloc<Blob>{}, n, false, held_, pool_);
        ring_copy(blob->data, src, n);
        copied += n;
        blob->key = bk;
        std::lock_guard<std::mutex> l(mu_);
        blobs_[bk] = blob;
      }
    }
    if (!blob) {
      if (cuda) {
        // The exit dump awaits these copies and reads page-locked memory: it must run before the
        // CUDA runtime's teardown, which the runtime registered with atexit at its first use,
        // before this copy; a stop registered now runs earlier (atexit runs in reverse order).
        static std::once_flag exit_before_cuda;
        std::call_once(exit_before_cuda, [] { std::atexit([] { flashinfer::recorder::stop(); }); });
        // Copied on the call's stream into page-locked memory; the copy is awaited only when
        // a dump is written.
        blob = std::allocate_shared<Blob>(RingAlloc<Blob>{}, n, true, held_, pool_);
        blob->event = detail::cuda_copy_to_host_async(blob->data, src, n, t.device().index);
        copied += n;
      } else {
        if (at && prior && written && ti < prior->size() && (*prior)[ti]) {
          blob = delta_of((*prior)[ti], *at, (*written)[ti], src, n);
          if (blob) copied += blob->patched_bytes;
        }
        if (!blob) {
          blob = std::allocate_shared<Blob>(RingAlloc<Blob>{}, n, false, held_, pool_);
          // The NaN trigger's check of an output, in the copy's pass over the source.
          if (nonfinite && !*nonfinite &&
              nonfinite_checked_on_bytes(t, static_cast<uint64_t>(k.item.span))) {
            *nonfinite = ring_copy_check(blob->data, src, n, t.dtype());
            checked = true;
          } else {
            ring_copy(blob->data, src, n);
          }
          copied += n;
        }
      }
      if (at) {
        std::lock_guard<std::mutex> l(mu_);
        index_locked(blob, *at, n, t.storage());
      }
    }
    if (nonfinite && !*nonfinite && !checked) {
      bool handled = false;
      if (blob->base) {
        *nonfinite = patches_have_nonfinite(t, static_cast<uint64_t>(k.item.span), *blob, handled);
        if (!handled) *nonfinite = detail::apilog::tensor_has_nonfinite(t);
      } else {
        // The live bytes (equal to the kept ones), not the copy: that was written past the cache.
        *nonfinite = kept_has_nonfinite(t, cuda ? nullptr : src, k.item.span);
      }
    }
    k.data = blob->span_bytes() + view_at;
    k.patches = blob->patches.empty() ? nullptr : blob->patches.data();
    k.n_patches = blob->patches.size();
    owner.push_back(std::move(blob));
  }
  // The arena's streamed stores are ordered before the call is published (a dump on another
  // thread, the crash handler).
  if (small) ring_copy_fence();
  if (copied) copied_.fetch_add(copied, std::memory_order_relaxed);
}

void RingRecorder::index_locked(const std::shared_ptr<Blob>& blob, const SpanKey& at, uint64_t n,
                                const std::shared_ptr<Storage>& storage) {
  blob->where = at;
  classes_ |= uint64_t{1} << span_class(n);
  Bounds& bd = bounds_[span_class(n)];
  bd.lo = std::min(bd.lo, at.lo);
  bd.hi = std::max(bd.hi, static_cast<uintptr_t>(at.lo + n));
  if (!storage->owns_memory()) unowned_spans_.store(true, std::memory_order_relaxed);
  SpanTable& m = spans_[span_class(n)];
  const uint64_t writes = storage->write_count();
  // The same span of the same storage kept before (the entry this one replaces, live or a
  // ghost): likely passed again (SpanEntry::again).
  const SpanEntry* old = m.find(at.device, at.lo, n);
  const bool again = old && same_owner(old->storage, storage);
  m.put(at.device, at.lo, n, SpanEntry{blob, storage, 0, again, writes},
        [](const SpanEntry& e) { return !e.blob.expired(); });
}

void RingRecorder::deferred_checks_locked(Pending& p, RingCall* c) {
  for (std::size_t i = 0; i < p.n_deferred; ++i) {
    Deferred& d = p.deferred[i];
    if (c && !c->evicted && d.blob->where && !same_as_kept(*d.blob, d.src, d.n, d.shares)) {
      // Written outside the library since it was kept: the bytes the call read (it writes
      // none of them) are copied now, and replace the shared copy in the call.
      auto blob = std::allocate_shared<Blob>(RingAlloc<Blob>{}, d.n, false, held_, pool_);
      ring_copy(blob->data, d.src, d.n);
      copied_.fetch_add(d.n, std::memory_order_relaxed);
      index_locked(blob, *d.blob->where, d.n, d.storage);
      CallFiles* f = c->begin.get();
      if (f && d.index < f->inputs.data.size()) f->inputs.data[d.index].data = blob->data;
      if (d.index < c->blobs.size()) c->blobs[d.index] = std::move(blob);
    }
    d = Deferred{};
  }
  p.n_deferred = 0;
}

std::shared_ptr<Blob> RingRecorder::share_span_locked(const SpanKey& at, uint64_t n,
                                                      const Tensor& t, const uint8_t* src,
                                                      bool cuda, Deferred* defer) {
  SpanEntry* e = spans_[span_class(n)].find(at.device, at.lo, n);
  if (!e || !same_owner(e->storage, t.storage()) || e->writes != t.storage()->write_count()) {
    return nullptr;
  }
  auto b = e->blob.lock();
  if (!b) return nullptr;
  // Shared now, or freed when its bytes differ: retained no longer.
  unretain_locked(*b);
  if (defer && !b->base) {
    defer->blob = b;
    defer->shares = ++e->shares;
    return b;
  }
  // CUDA spans are not read here (it would wait for the stream): docs/LOGGING.md.
  if (!cuda && !same_as_kept(*b, src, n, ++e->shares)) return nullptr;
  return b;
}

std::shared_ptr<Blob> RingRecorder::share_enclosing_locked(const SpanKey& at, uint64_t n,
                                                           const Tensor& t, const uint8_t* src,
                                                           uint64_t& offset) {
  const uint64_t writes = t.storage()->write_count();
  // (The span itself, kept, was looked at by share_span_locked: not a view of it.)
  const auto same = [&](const SpanTable::Entry& e) {
    return (e.lo != at.lo || e.bytes != n) && e.value.writes == writes &&
           same_owner(e.value.storage, t.storage()) && !e.value.blob.expired();
  };
  // The enclosing span's class or the next: a view covering at least a quarter of it (the q or
  // k of a fused qkv output). Smaller views of larger spans are copied.
  const std::size_t k0 = span_class(n);
  for (std::size_t k = k0; k <= k0 + 1 && k < spans_.size(); ++k) {
    if (!(classes_ >> k & 1) || at.lo < bounds_[k].lo || at.lo + n > bounds_[k].hi) continue;
    SpanTable::Entry* e = spans_[k].find_enclosing(at.device, at.lo, n, same);
    if (!e) continue;
    std::shared_ptr<Blob> b = e->value.blob.lock();
    // A delta's bytes under the view are spread over its patches: not shared this way.
    if (!b || b->base) return nullptr;
    const uint64_t off = at.lo - e->lo;
    if (!same_as_kept_at(*b, src - off, off, n, ++e->value.shares)) return nullptr;
    unretain_locked(*b);
    offset = off;
    return b;
  }
  return nullptr;
}

void RingRecorder::note_write_locked(const Tensor& t) {
  if (t.numel() == 0) return;
  const auto [begin, end] = detail::covered_span(t.shape(), t.strides(), t.storage_offset());
  const uint64_t es = dtype_size(t.dtype());
  const auto* base = static_cast<const uint8_t*>(t.data_ptr()) - t.storage_offset() * es;
  const auto a = reinterpret_cast<uintptr_t>(base + begin * es);
  const auto b = reinterpret_cast<uintptr_t>(base + end * es);
  const int64_t dev = device_code(t.device());
  for (uint64_t bits = classes_; bits != 0; bits &= bits - 1) {
    const auto k = static_cast<std::size_t>(__builtin_ctzll(bits));
    if (b <= bounds_[k].lo || a >= bounds_[k].hi) continue;
    SpanTable& m = spans_[k];
    if (m.empty()) {
      classes_ &= ~(uint64_t{1} << k);
      bounds_[k] = {};
      continue;
    }
    m.erase_overlapping(dev, a, b);
  }
}

void RingRecorder::note_writes(std::span<const TensorRef> tensors) {
  if (cfg_.ring_verify_full || tensors.empty()) return;
  // A write through a storage that owns its memory is counted in the storage: its kept spans
  // are stale by the count (share_span_locked), and no other live storage covers that memory,
  // unless a kept span's storage wraps memory from elsewhere (from_blob). Only then, or for a
  // write through such a storage, are the kept spans the write overlaps looked for and erased:
  // walking the size classes' tables on every write was a tenth of the hooks' time, session 22.
  bool walk = unowned_spans_.load(std::memory_order_relaxed);
  for (const TensorRef& r : tensors) {
    if (r.t->numel() == 0) continue;
    const Storage* s = r.t->storage().get();
    if (!s) continue;  // (a tensor without memory: nothing written)
    s->count_write();
    walk = walk || !s->owns_memory();
  }
  if (!walk) return;
  std::lock_guard<std::mutex> l(mu_);
  for (const TensorRef& r : tensors) note_write_locked(*r.t);
}

void RingRecorder::plan(KeptArchive& dst, std::string_view stem, const std::vector<KeptTensor>& t,
                        OpInfo& op, int side,
                        const std::shared_ptr<const formats::ArchivePlan>* known) {
  if (known) {
    if (dst.layout != *known) dst.layout = *known;
    set_pieces(dst, t);
    return;
  }
  // An archive's layout depends on its tensors' names, dtypes, shapes, strides and spans only;
  // the tensor bytes are pointers beside it. A decode step calls the same ops with the same
  // layouts over and over, so the layouts are made once, cached per thread (no lock) and
  // shared by the kept calls (the pickling and zip headers took a sixth of the ring's time,
  // session 9; copying the cached layout into each call ~15 %, session 14). The key is the
  // metadata laid end to end in one buffer, built in warm memory; the op's recent layouts are
  // matched by its 128-bit hash (record_tape.h, TemplateKey).
  thread_local std::unordered_map<std::string, std::shared_ptr<const formats::ArchivePlan>> cache;
  thread_local std::string key;
  key.assign(stem);
  const auto put = [](const void* p, std::size_t n) { key.append(static_cast<const char*>(p), n); };
  for (const KeptTensor& k : t) {
    const uint64_t sizes[] = {k.item.name.size(), static_cast<uint64_t>(k.item.dtype),
                              k.item.shape.size(), static_cast<uint64_t>(k.item.offset),
                              static_cast<uint64_t>(k.item.span)};
    put(sizes, sizeof(sizes));
    key += k.item.name;
    put(k.item.shape.data(), k.item.shape.size() * sizeof(int64_t));
    put(k.item.strides.data(), k.item.strides.size() * sizeof(int64_t));
  }
  RecentTemplates<formats::ArchivePlan>& recent = op.layouts[static_cast<std::size_t>(side)];
  const TemplateKey h = template_key(key);
  if (auto found = recent.find(h)) {
    if (dst.layout != found) dst.layout = std::move(found);
  } else {
    auto it = cache.find(key);
    if (it == cache.end()) {
      std::vector<formats::TorchItem> items;
      items.reserve(t.size());
      for (const KeptTensor& k : t) items.push_back(k.item);
      const std::vector<const void*> none(t.size(), nullptr);
      if (cache.size() >= 1024) cache.clear();  // bounded: programs with ever new shapes
      it = cache
               .emplace(key, std::allocate_shared<const formats::ArchivePlan>(
                                 RingAlloc<formats::ArchivePlan>{},
                                 formats::plan_torch_archive(stem, items, none)))
               .first;
    }
    if (dst.layout != it->second) dst.layout = it->second;
    recent.insert(h, it->second);
  }
  set_pieces(dst, t);
}

void RingRecorder::remember_input_shape(OpInfo& op, const TemplateKey& k, const OpDecl& decl,
                                        std::span<const Value> args, const Extracted& ex,
                                        const RingCall& c, const CallFiles& files) {
  auto shape = std::allocate_shared<InputShape>(RingAlloc<InputShape>{});
  // write_input_metadata's tensors, by position: every tensor argument but a keyword-only
  // one left at its default, and the tensors among a list or tuple argument's items (the *args
  // holder's, a cache pair's).
  for (std::size_t i = 0; i < args.size() && i < decl.params.size(); ++i) {
    const ParamDecl& pd = decl.params[i];
    const auto at = static_cast<uint32_t>(i);
    const bool holder = static_cast<int>(i) == op.var_positional;
    if (!holder && pd.keyword_only && pd.default_value && *pd.default_value == args[i]) continue;
    if (args[i].is_sequence()) {
      push_tensor_items(shape->args, args[i], at);
    } else if (args[i].is_tensor() && !holder) {
      shape->args.push_back({at, -1});
    }
  }
  // Taken only when they are the general path's tensors, in its order, under its keys.
  if (!c.rec.inputs) return;
  const std::vector<TensorMeta>& metas = c.rec.inputs->tensors;
  if (shape->args.size() != ex.tensors.size() || metas.size() != ex.tensors.size()) return;
  for (std::size_t j = 0; j < shape->args.size(); ++j) {
    const Tensor& a = shape->args[j].in(args);
    const auto& [key, e] = ex.tensors[j];
    if (a.data_ptr() != e.data_ptr() || a.shape() != e.shape() || a.strides() != e.strides() ||
        metas[j].key != key) {
      return;
    }
  }
  shape->tmpl = c.rec.inputs;
  if (files.has_inputs) shape->layout = files.inputs.layout;
  op.input_shapes.insert(k, std::move(shape));
}

void RingRecorder::remember_output_shape(OpInfo& op, const TemplateKey& k, const OpDecl& decl,
                                         std::span<const Value> args, const Value& result,
                                         const Extracted& out, const Extracted& mutated,
                                         const CallFiles& files) {
  auto shape = std::allocate_shared<OutputShape>(RingAlloc<OutputShape>{});
  // write_result's and extract_mutated_into's tensors, by position.
  if (result.is_tensor()) {
    shape->results.push_back(-1);
  } else if (result.kind() == Value::Kind::kTuple) {
    const auto& items = result.items();
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (items[i].is_tensor()) shape->results.push_back(static_cast<int32_t>(i));
    }
  }
  for (std::size_t i = 0; i < args.size() && i < decl.params.size(); ++i) {
    if (!decl.params[i].mutated) continue;
    const auto at = static_cast<uint32_t>(i);
    if (args[i].is_tensor()) {
      shape->mutated_args.push_back({at, -1});
    } else if (args[i].is_sequence()) {  // a (K, V) cache pair
      push_tensor_items(shape->mutated_args, args[i], at);
    }
  }
  if (!files.out.outputs) return;
  const OutputTemplate& t = *files.out.outputs;
  if (shape->results.size() != out.tensors.size() || t.outputs.size() != out.tensors.size() ||
      shape->mutated_args.size() != mutated.tensors.size() ||
      t.mutated.size() != mutated.tensors.size()) {
    return;
  }
  for (std::size_t j = 0; j < shape->results.size(); ++j) {
    const int32_t r = shape->results[j];
    const Tensor& a = r < 0 ? result.as_tensor() : result.items()[r].as_tensor();
    const auto& [key, e] = out.tensors[j];
    if (a.data_ptr() != e.data_ptr() || a.shape() != e.shape() || t.outputs[j].key != key) return;
  }
  for (std::size_t j = 0; j < shape->mutated_args.size(); ++j) {
    const Tensor& a = shape->mutated_args[j].in(args);
    const auto& [key, e] = mutated.tensors[j];
    if (a.data_ptr() != e.data_ptr() || a.shape() != e.shape() || t.mutated[j].key != key) return;
  }
  shape->tmpl = files.out.outputs;
  if (files.has_outputs) shape->outputs = files.outputs.layout;
  if (files.has_mutated) shape->mutated = files.mutated.layout;
  op.output_shapes.insert(k, std::move(shape));
}

void RingRecorder::evict_oldest_locked() {
  std::shared_ptr<RingCall> old = std::move(calls_.front());
  calls_.pop_front();
  old->evicted = true;
  // Only its own slot can hold it (a later call may have taken the slot already).
  RingCall* p = old.get();
  slots_[old->slot].compare_exchange_strong(p, nullptr);
  // A completed setup call of a wrapper object stays as an anchor: without the object's
  // __init__ and latest plan, none of its kept run() calls could be replayed.
  if (old->setup && old->end) {
    anchor_locked(std::move(old));
    return;
  }
  release_locked(*old);
  recycle_locked(std::move(old));
}

void RingRecorder::set_evict_hint_locked(const RingCall& c) {
  EvictHint& hint = hints_[c.slot % hints_.size()];
  std::size_t i = 0;
  const auto put = [&](const void* p) {
    if (i < hint.at.size()) hint.at[i++].store(p, std::memory_order_relaxed);
  };
  // The call's lines (its control block just before it), its blob list, the blobs (their
  // control blocks hold them), its arena's buffer list and buffers (the heap's free list is
  // written into a freed buffer).
  const uintptr_t self = reinterpret_cast<uintptr_t>(&c);
  for (uintptr_t at = 0; at < sizeof(RingCall) + 64; at += 64) {
    put(reinterpret_cast<const void*>(self - 64 + at));
  }
  put(c.blobs.data());
  for (const auto& b : c.blobs) {
    if (b) put(b.get());
  }
  const std::span<uint8_t* const> chunks = c.arena.chunks();
  put(chunks.data());
  for (uint8_t* chunk : chunks) put(chunk);
  while (i < hint.at.size()) hint.at[i++].store(nullptr, std::memory_order_relaxed);
}

void RingRecorder::prefetch_eviction() const {
  const uint64_t k = kept_.load(std::memory_order_relaxed);
  if (k < slots_.size()) return;  // the ring is not full: nothing to evict
  const EvictHint& hint = hints_[k % hints_.size()];
  for (const auto& a : hint.at) {
    // A stale address (the call was evicted another way and its memory reused) costs a
    // useless prefetch only: a prefetch never faults.
    if (const void* p = a.load(std::memory_order_relaxed)) __builtin_prefetch(p, 1);
  }
}

void RingRecorder::recycle_locked(std::shared_ptr<RingCall> c) {
  // Held elsewhere (its on_call_end still to come): freed when the last holder lets go.
  if (c.use_count() != 1 || spare_calls_.size() >= kMaxSpareCalls) return;
  RingCall& r = *c;
  r.files.store(nullptr, std::memory_order_release);
  r.name_json = {};
  r.sequence = r.process_sequence = 0;
  // The record's and the inputs' storage stays for the next call (filled in place).
  r.rec.inputs.reset();
  r.rec.tail = nullptr;
  r.rec.self_id.reset();
  r.rec.process_sequence = 0;
  r.blobs.clear();
  r.arena.reset();
  r.arena_held = 0;
  // begin and end stay allocated: the next call lays its files out over them.
  r.evicted = false;
  r.slot = 0;
  r.self_id.reset();
  r.method.clear();
  r.setup = false;
  spare_calls_.push_back(std::move(c));
}

std::shared_ptr<RingCall> RingRecorder::new_call() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!spare_calls_.empty()) {
      std::shared_ptr<RingCall> c = std::move(spare_calls_.back());
      spare_calls_.pop_back();
      return c;
    }
  }
  return std::allocate_shared<RingCall>(RingAlloc<RingCall>{});
}

void RingRecorder::release_locked(RingCall& c) {
  // Its bytes go now unless a later call shares them; keys of freed blobs are forgotten.
  // (A crash on another thread at this very moment could read freed bytes: the handler
  // loads the slot before it was cleared. The window is a few instructions wide.)
  // Only a blob this call holds alone is freed here, so only its table entry can expire: a
  // shared one (a weight kept by every later call) is not looked up at all (eviction was
  // ~8 % of the hooks' time, most of it these lookups and the lists built for them).
  for (std::size_t i = 0; i < c.blobs.size(); ++i) {
    auto& b = c.blobs[i];
    if (!b) continue;
    // The same blob twice in one call (an input kept again as an output) counts once.
    for (std::size_t j = i + 1; j < c.blobs.size(); ++j) {
      if (c.blobs[j] == b) c.blobs[j].reset();
    }
    if (b.use_count() != 1) continue;
    if (!retain_locked(b)) forget_locked(std::move(b));
  }
  c.blobs.clear();
  // The arena's bytes leave the bound now; its buffers stay with the call until it is recycled
  // (or freed with it).
  held_->fetch_sub(c.arena_held, std::memory_order_relaxed);
  c.arena_held = 0;
}

void RingRecorder::forget_locked(std::shared_ptr<Blob> b) {
  const std::optional<BlobKey> key = b->key;
  const std::optional<SpanKey> where = b->where;
  const uint64_t size = b->size;
  b.reset();
  if (key) {
    auto it = blobs_.find(*key);
    if (it != blobs_.end() && it->second.expired()) blobs_.erase(it);
  }
  if (where) {
    SpanTable& m = spans_[span_class(size)];
    m.erase_if_at(where->device, where->lo, size,
                  [](const SpanEntry& e) { return e.blob.expired(); });
    if (m.empty()) {
      // The class's interval starts over (it only grows while the class holds spans).
      classes_ &= ~(uint64_t{1} << span_class(size));
      bounds_[span_class(size)] = {};
    }
  }
}

SpanEntry* RingRecorder::current_entry_locked(const Blob& b) {
  // (A KV cache's delta too: until the next append writes the cache, it is the cache's content,
  // and that append's input shares it, its output a delta of it, instead of a whole copy.)
  if (!b.where) return nullptr;
  SpanEntry* e = spans_[span_class(b.size)].find(b.where->device, b.where->lo, b.size);
  if (!e || e->blob.lock().get() != &b) return nullptr;
  const std::shared_ptr<Storage> s = e->storage.lock();
  return s && s->write_count() == e->writes ? e : nullptr;
}

bool RingRecorder::retain_locked(std::shared_ptr<Blob>& b) {
  // CUDA spans are not shared after a graph capture: no later call could use it.
  if (b->pinned && graphs_seen()) return false;
  SpanEntry* e = current_entry_locked(*b);
  if (!e) return false;
  if (e->shares == 0 && !e->again) {
    // Passed to one call only so far (an output the caller holds, or a weight whose calls all
    // left before the next pass): freed, its entry left as a ghost, so that a later keep of
    // the same span marks the new entry `again`. Retaining every such span would fill the
    // bound with tensors never passed again.
    b.reset();
    return true;
  }
  // The oldest retained blob goes when it can no longer be shared (its storage freed or
  // written), so that those do not wait for the bound to be reached.
  if (!retained_.empty() && !current_entry_locked(*retained_.front())) drop_retained_locked();
  retained_.push_back(std::move(b));
  Blob& r = *retained_.back();
  r.retained = true;
  r.retained_at = std::prev(retained_.end());
  retained_bytes_ += r.capacity;
  return true;
}

void RingRecorder::unretain_locked(Blob& b) {
  if (!b.retained) return;
  b.retained = false;
  retained_bytes_ -= b.capacity;
  retained_.erase(b.retained_at);
}

void RingRecorder::drop_retained_locked() {
  std::shared_ptr<Blob> b = std::move(retained_.front());
  retained_.pop_front();
  b->retained = false;
  retained_bytes_ -= b->capacity;
  forget_locked(std::move(b));
}

bool RingRecorder::over_bound_locked() {
  while (held_->load(std::memory_order_relaxed) > limit_bytes_ && !retained_.empty()) {
    drop_retained_locked();
  }
  return held_->load(std::memory_order_relaxed) > limit_bytes_;
}

void RingRecorder::count_arena_locked(RingCall& c) {
  const uint64_t used = c.arena.used();
  held_->fetch_add(used - c.arena_held, std::memory_order_relaxed);
  c.arena_held = used;
}

void RingRecorder::anchor_locked(std::shared_ptr<RingCall> c) {
  // The newer setup call of the same object and method supersedes the older one; a new
  // __init__ at an object's address means the old object is gone with all its anchors.
  std::deque<std::shared_ptr<RingCall>> stale;
  for (auto it = anchors_.begin(); it != anchors_.end();) {
    const bool same_object = (*it)->self_id == c->self_id;
    if (same_object && ((*it)->method == c->method || c->method == "__init__")) {
      stale.push_back(std::move(*it));
      it = anchors_.erase(it);
    } else {
      ++it;
    }
  }
  anchors_.push_back(std::move(c));  // evicted in call order, so anchors_ stays in call order
  while (anchors_.size() > kMaxAnchors) {
    stale.push_back(std::move(anchors_.front()));
    anchors_.pop_front();
  }
  for (std::size_t i = 0; i < kMaxAnchors; ++i) {
    anchor_slots_[i].store(i < anchors_.size() ? anchors_[i].get() : nullptr,
                           std::memory_order_release);
  }
  for (auto& a : stale) release_locked(*a);
}

void RingRecorder::publish(const std::shared_ptr<RingCall>& call) {
  std::lock_guard<std::mutex> l(mu_);
  count_arena_locked(*call);
  const std::size_t n = slots_.size();
  while (calls_.size() >= n) evict_oldest_locked();
  calls_.push_back(call);
  const uint64_t k = kept_.load(std::memory_order_relaxed);
  call->slot = static_cast<std::size_t>(k % n);
  slots_[k % n].store(call.get(), std::memory_order_release);
  kept_.store(k + 1, std::memory_order_release);
  // The newest call stays; older ones go, oldest first, while the bound is passed.
  while (over_bound_locked() && calls_.size() > 1) evict_oldest_locked();
}

void RingRecorder::on_call_begin(const OpDecl& decl, std::span<const Value> args) {
  const HookTimer timer;
  HookScratch& h = scratch();
  h.stack.push_back({});
  prefetch_eviction();
  if (capture_in_progress(args, &h.stack.back().asked)) {
    note_capture();  // copying now would break the capture: not kept
    return;
  }
  if (!filter_.passes(decl.name)) {
    h.stack.back().observed = true;
    return;
  }
  try {
    std::shared_ptr<RingCall> call = new_call();
    int64_t seq = 0;
    const std::string* tail = nullptr;
    HookScratch::OpSlot& slot = h.ops[(reinterpret_cast<uintptr_t>(&decl) >> 4) % h.ops.size()];
    OpInfo* op = nullptr;
    if (slot.decl == &decl && slot.ring == id_ && slot.op->name == decl.name &&
        slot.op->module == decl.module) {
      op = slot.op;
    } else {
      std::lock_guard<std::mutex> l(mu_);
      op = &op_info_locked(decl);
      slot = {&decl, id_, op};
    }
    seq = op->calls->fetch_add(1, std::memory_order_relaxed) + 1;
    tail = &op->tail;
    h.stack.back().op = op;
    char ts_text[kTimestampCap];
    const std::string_view ts(ts_text, timestamp_now_into(ts_text));
    // Emptied before the hook returns so that it holds no tensor longer than the call.
    Extracted& ex = h.ex;
    ex.clear();
    ex.by_reference = true;  // the ring takes its own copies below
    struct Clear {
      Extracted& e;
      ~Clear() { e.clear(); }
    } clear_ex{ex};
    // The record is kept structured (record_tape.h) and written as text only in a dump.
    std::optional<uint64_t> self_id;
    if (decl.is_method() && !args.empty() && args[0].kind() == Value::Kind::kObject) {
      self_id = args[0].as_object().id;
      call->self_id = self_id;
      call->method.assign(decl.method_name());
      call->setup =
          call->method == "__init__" || call->method == "plan" || call->method == "begin_forward";
    }
    const int64_t pseq = process_sequence_.fetch_add(1, std::memory_order_relaxed) + 1;
    // The fast path: the arguments' key found among the op's recent calls' (InputShape).
    Pending& pending = h.stack.back();
    std::shared_ptr<const InputShape> shape;
    if (op->shapes_apply && !(op->extension_applies && (*op->extension_applies)(args))) {
      std::string& raw = h.raw;
      raw.clear();
      if (put_raw_args(raw, args)) {
        pending.keyed = true;
        pending.in_key = template_key(raw);
        shape = op->input_shapes.find(pending.in_key);
      }
    }
    TensorRefs& in_refs = h.in_refs;
    in_refs.clear();
    if (shape) {
      g_shape_hits.fetch_add(1, std::memory_order_relaxed);
      fill_input_record_fields(call->rec, decl, seq, ts, pid_, tail, self_id, pseq);
      call->rec.inputs = shape->tmpl;
      for (std::size_t j = 0; j < shape->args.size(); ++j) {
        in_refs.push_back({shape->tmpl->tensors[j].key, &shape->args[j].in(args)});
      }
    } else {
      fill_input_record(call->rec, decl, args, seq, ts, pid_, tail, self_id, pseq, ex,
                        &op->input_records);
      refs_of(ex.tensors, in_refs);
    }
    call->rec.function_name = op->name;  // the declaration may go before a dump is written
    call->rec.module = op->module;
    // The kept inputs' metadata is needed only to lay out the archive below: per thread, in
    // warm memory (the call's record has its own copy, rec.inputs; blobs[j] is input j's).
    std::vector<KeptTensor>& kept_in = h.kept_in;
    // The storages this call writes (its declared written arguments): their comparisons with
    // the kept copies cannot wait for the end hook (Deferred).
    std::vector<const Storage*>& written_storages = h.written_storages;
    written_storages.clear();
    detail::for_each_written_tensor(decl, args, [&](std::size_t, int, const Tensor& t) {
      written_storages.push_back(t.storage().get());
    });
    keep(in_refs, kept_in, call->blobs, call->arena, nullptr, nullptr, nullptr, false, &pending,
         written_storages);
    in_refs.clear();
    call->name_json = op->name_json;
    call->sequence = seq;
    call->process_sequence = pseq;

    std::unique_ptr<CallFiles> files =
        call->begin ? std::move(call->begin) : std::make_unique<CallFiles>();
    files->complete = false;
    files->has_outputs = files->has_mutated = false;
    files->has_inputs = !kept_in.empty();
    if (files->has_inputs) {
      plan(files->inputs, schema::kInputsStem, kept_in, *op, 0, shape ? &shape->layout : nullptr);
    }
    if (!shape && pending.keyed) {
      remember_input_shape(*op, pending.in_key, decl, args, ex, *call, *files);
    }
    call->begin = std::move(files);
    call->files.store(call->begin.get(), std::memory_order_release);
    publish(call);
    last_begun_.store(call.get(), std::memory_order_release);
    h.stack.back().call = std::move(call);
  } catch (const std::exception& e) {
    log(std::string("[flashinfer] ring recorder: keeping ") + decl.name + " failed: " + e.what());
  }
}

void RingRecorder::on_call_end(const OpDecl& decl, std::span<const Value> args,
                               const Value& result) {
  const HookTimer timer;
  HookScratch& h = scratch();
  if (h.stack.empty()) return;
  if (h.stack.back().n_deferred != 0) {
    std::lock_guard<std::mutex> l(mu_);
    deferred_checks_locked(h.stack.back(), h.stack.back().call.get());
  }
  std::shared_ptr<RingCall> call = std::move(h.stack.back().call);
  // A kept call is not being captured (on_call_begin): its copies, events and evictions may
  // run while another thread captures.
  const detail::CudaRelaxedCaptureScope relaxed(call != nullptr);
  const bool asked = h.stack.back().asked;
  const bool observed = h.stack.back().observed;
  OpInfo* const op = h.stack.back().op;
  const bool keyed = h.stack.back().keyed;
  const TemplateKey in_key = h.stack.back().in_key;
  h.stack.pop_back();
  // Emptied before returning.
  Extracted &out = h.out, &mutated = h.mutated;
  TensorRefs &out_refs = h.out_refs, &mut_refs = h.mut_refs;
  RecordTape& scratch_metadata = h.metadata;
  out.clear();
  mutated.clear();
  out.by_reference = mutated.by_reference = true;
  struct Clear {
    HookScratch& h;
    ~Clear() {
      h.out.clear();
      h.mutated.clear();
      h.out_refs.clear();
      h.mut_refs.clear();
    }
  } clear_extracted{h};
  // What the call wrote (its outputs and written arguments) is new content: a kept span of it
  // is not shared any more.
  const auto note_call_writes = [&] {
    extract_result_tape(result, out, scratch_metadata);
    extract_mutated_into(decl, args, mutated);
    refs_of(out.tensors, out_refs);
    refs_of(mutated.tensors, mut_refs);
    note_writes(out_refs);
    note_writes(mut_refs);
  };
  if (!call) {
    if (observed && !cfg_.ring_verify_full) note_call_writes();
    return;
  }
  RingCall* expected = call.get();
  last_begun_.compare_exchange_strong(expected, nullptr);
  if (!asked && result_capture_in_progress(result)) {
    // Kept at its begin (no CUDA argument), but its result is device memory written under a
    // capture: copying it would break the capture, and its values exist once the graph runs.
    // The call stays with its inputs only, as a call whose outputs could not be kept; what it
    // wrote is new content all the same (a CPU argument it wrote must not be shared stale).
    note_capture();
    if (!cfg_.ring_verify_full) {
      try {
        note_call_writes();
      } catch (const std::exception&) {
        std::lock_guard<std::mutex> l(mu_);
        unshare_all_locked();
      }
    }
    return;
  }
  bool nan = false;
  bool evicted = false;
  std::unique_ptr<CallFiles> files;
  BlobList& blobs = h.blobs;
  std::vector<KeptTensor>&kept_out = h.kept_out, &kept_mut = h.kept_mut;
  {
    std::lock_guard<std::mutex> l(mu_);
    evicted = call->evicted;
    if (!evicted) files = std::move(call->end);  // a recycled call's earlier layout, reused
  }
  try {
    // The fast path: the arguments' and the result's keys found among the op's recent calls'.
    std::shared_ptr<const OutputShape> shape;
    TemplateKey out_key;
    bool out_keyed = false;
    if (keyed && !evicted) {
      std::string& raw = h.raw;
      raw.clear();
      put_raw_bytes(raw, &in_key, sizeof(in_key));
      if (put_raw_value(raw, result, true, result.kind() == Value::Kind::kTuple, 0)) {
        out_keyed = true;
        out_key = template_key(raw);
        shape = op->output_shapes.find(out_key);
      }
    }
    if (!files && !evicted) files = std::make_unique<CallFiles>();
    if (evicted) {
      extract_result_tape(result, out, scratch_metadata);
      extract_mutated_into(decl, args, mutated);
      refs_of(out.tensors, out_refs);
      refs_of(mutated.tensors, mut_refs);
    } else if (shape) {
      g_shape_hits.fetch_add(1, std::memory_order_relaxed);
      files->out.outputs = shape->tmpl;
      for (std::size_t j = 0; j < shape->results.size(); ++j) {
        const int32_t r = shape->results[j];
        const Tensor* t = r < 0 ? &result.as_tensor() : &result.items()[r].as_tensor();
        out_refs.push_back({shape->tmpl->outputs[j].key, t});
      }
      for (std::size_t j = 0; j < shape->mutated_args.size(); ++j) {
        mut_refs.push_back({shape->tmpl->mutated[j].key, &shape->mutated_args[j].in(args)});
      }
    } else {
      fill_output_record(files->out, decl, args, result, out, mutated, &op->output_records);
      refs_of(out.tensors, out_refs);
      refs_of(mutated.tensors, mut_refs);
    }
    // Before the outputs are kept: what the op wrote is new content, not what a kept span holds.
    note_writes(out_refs);
    note_writes(mut_refs);
    const bool check = trig_nan_ && !nan_fired_.load(std::memory_order_relaxed);
    if (evicted) {
      if (check) {
        for (const NamedTensors* side : {&out.tensors, &mutated.tensors}) {
          for (const auto& [k, t] : *side) nan = nan || detail::apilog::tensor_has_nonfinite(t);
        }
      }
      throw std::runtime_error("evicted before it completed");
    }
    blobs.clear();
    h.small_written.clear();
    keep(out_refs, kept_out, blobs, call->arena, check ? &nan : nullptr, nullptr, nullptr, true);
    // A KV cache an append wrote a few rows into: kept as the bytes it held as this call's
    // input plus the rows written (a delta), not copied whole on every append.
    BlobList& prior = h.prior;
    std::vector<Ranges>& written = h.written;
    prior.assign(mut_refs.size(), nullptr);
    if (written.size() < mut_refs.size()) written.resize(mut_refs.size());
    if (!cfg_.ring_verify_full && decl.name == kAppendPagedKVCache) {
      for (std::size_t m = 0; m < mut_refs.size(); ++m) {
        const std::string_view key = mut_refs[m].key;
        const Tensor& t = *mut_refs[m].t;
        if (t.numel() == 0 || !t.device().is_cpu()) continue;
        const int64_t begin =
            detail::covered_span(t.shape(), t.strides(), t.storage_offset()).first;
        if (!append_written_ranges(decl, args, t, begin, written[m])) continue;
        std::lock_guard<std::mutex> l(mu_);
        if (call->evicted) break;
        const std::vector<TensorMeta>& ins = call->rec.inputs->tensors;
        for (std::size_t j = 0; j < ins.size() && j < call->blobs.size(); ++j) {
          if (ins[j].key == key) prior[m] = call->blobs[j];
        }
      }
    }
    keep(mut_refs, kept_mut, blobs, call->arena, check ? &nan : nullptr, &prior, &written, true);
    prior.clear();
    files->complete = true;
    files->has_outputs = !kept_out.empty();
    files->has_mutated = !kept_mut.empty();
    if (files->has_outputs) {
      plan(files->outputs, schema::kOutputsStem, kept_out, *op, 1,
           shape ? &shape->outputs : nullptr);
    }
    if (files->has_mutated) {
      plan(files->mutated, schema::kMutatedStem, kept_mut, *op, 2,
           shape ? &shape->mutated : nullptr);
    }
    if (!shape && out_keyed) {
      remember_output_shape(*op, out_key, decl, args, result, out, mutated, *files);
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!call->evicted) {
        files->has_inputs = false;  // begin's (CallFiles)
        for (auto& b : blobs) {
          if (b) call->blobs.push_back(std::move(b));
        }
        count_arena_locked(*call);
        call->end = std::move(files);
        call->files.store(call->end.get(), std::memory_order_release);
        set_evict_hint_locked(*call);
        // The outputs count toward the bound too.
        while (over_bound_locked() && calls_.size() > 1) {
          if (calls_.front() == call) break;
          evict_oldest_locked();
        }
      }
    }
    blobs.clear();
  } catch (const std::exception& e) {
    blobs.clear();
    if (!evicted) {
      log(std::string("[flashinfer] ring recorder: keeping the outputs of ") + decl.name +
          " failed: " + e.what());
    }
  }
  if (nan && !nan_fired_.exchange(true)) dump("nan", call.get());
}

void RingRecorder::on_call_error(const OpDecl& decl, std::span<const Value> args,
                                 std::string_view) {
  const HookTimer timer;
  std::vector<Pending>& stack = scratch().stack;
  if (stack.empty()) return;
  if (stack.back().n_deferred != 0) {
    std::lock_guard<std::mutex> l(mu_);
    deferred_checks_locked(stack.back(), stack.back().call.get());
  }
  std::shared_ptr<RingCall> call = std::move(stack.back().call);
  const bool observed = stack.back().observed;
  stack.pop_back();
  // The op may have written part of its written arguments before it raised.
  if ((call || observed) && !cfg_.ring_verify_full) {
    try {
      const Extracted written = extract_mutated(decl, args, true);
      TensorRefs refs;
      refs_of(written.tensors, refs);
      note_writes(refs);
    } catch (const std::exception&) {
      std::lock_guard<std::mutex> l(mu_);
      unshare_all_locked();
    }
  }
  if (!call) return;
  RingCall* expected = call.get();
  last_begun_.compare_exchange_strong(expected, nullptr);
  // Only line 1 stays on record, as in the disk recorder: the call did not complete.
  if (trig_error_ && is_flashinfer_error() && !error_fired_.exchange(true)) {
    dump("error", call.get());
  }
}

void RingRecorder::wait_copies_locked() {
  auto wait = [](const std::shared_ptr<RingCall>& c) {
    for (const auto& b : c->blobs) {
      if (b && b->event) {
        detail::cuda_event_wait(b->event);
        detail::cuda_event_destroy(b->event);
        b->event = nullptr;
      }
    }
  };
  for (const auto& c : calls_) wait(c);
  // The anchors (evicted __init__ / plan calls a dump writes too) keep their copies: theirs may
  // still be in flight (a review found them written unwaited in session 79).
  for (const auto& c : anchors_) wait(c);
}

std::string RingRecorder::dump(const std::string& reason, RingCall* trigger) {
  const detail::CudaRelaxedCaptureScope relaxed;  // (the SIGUSR1 watcher, another's capture)
  const std::string why = sanitized(reason);
  dumps_.fetch_add(1);
  const int64_t k = g_dump_number.fetch_add(1) + 1;
  char num[16];
  std::snprintf(num, sizeof(num), "%04lld", static_cast<long long>(k));
  std::string rel = "ring_pid" + std::to_string(pid_) + "_dump" + num + "_" + why;
  std::string root = prefix_ + rel;
  std::vector<char> buf(root.size() + 4096);
  std::memcpy(buf.data(), root.data(), root.size() + 1);
  bool ok = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    wait_copies_locked();
    ok = write_dump(buf.data(), prefix_.size(), why.c_str(), 0, trigger, written_dump_);
  }
  if (!ok) {
    std::fprintf(stderr, "[flashinfer] warning: the ring dump to '%s' failed: %s\n", root.c_str(),
                 std::strerror(errno));
    return "";
  }
  log("Ring dump (" + why + ") written to: " + root);
  return root;
}

void RingRecorder::dump_from_signal(int signo) noexcept {
  // Everything on the stack: nothing may allocate here.
  char root[4096];
  FixedText t(root, sizeof(root));
  t.put(prefix_.c_str(), prefix_.size());  // prefix_ is immutable after construction
  const std::size_t rel_at = t.n;
  dumps_.fetch_add(1);
  const int64_t k = g_dump_number.fetch_add(1) + 1;
  t.put("ring_pid");
  t.put_u64(static_cast<uint64_t>(pid_));
  t.put("_dump");
  t.put_u64(static_cast<uint64_t>(k), 4);
  t.put("_crash");
  if (t.overflow) return;
  static const char kMsg[] = "[flashinfer] fatal signal: writing the flight recorder's ring to ";
  (void)!::write(2, kMsg, sizeof(kMsg) - 1);
  (void)!::write(2, root, t.n);
  (void)!::write(2, "\n", 1);
  write_dump(root, rel_at, "crash", signo, last_begun_.load(std::memory_order_acquire),
             written_crash_);
}

bool RingRecorder::write_dump(char* root, std::size_t rel_at, const char* reason, int signo,
                              const RingCall* trigger,
                              std::vector<WrittenArchive>& archives) noexcept {
  const std::size_t root_len = std::strlen(root);
  if (!make_dirs(root)) return false;
  archives.clear();  // keeps its capacity: no allocation below while it stays within it
  char path[8192], linked[8192], line_buf[16384];
  auto path_into = [&](char* buf, std::size_t cap, const char* dir, std::string_view name) {
    FixedText p(buf, cap);
    p.put(root, root_len);
    if (dir) {
      p.put("/");
      p.put(dir, std::strlen(dir));
    }
    p.put("/");
    p.put(name);
    return !p.overflow;
  };
  auto file_path = [&](const char* dir, std::string_view name) {
    return path_into(path, sizeof(path), dir, name);
  };
  // The root as JSON text: the escaped dump directory prefix, then the plain ASCII rest.
  const std::string_view rel(root + rel_at, root_len - rel_at);
  if (!file_path(nullptr, schema::kSessionFile)) return false;
  const int session = open_new(path);
  if (session < 0) return false;
  const uint64_t kept = kept_.load(std::memory_order_acquire);
  const uint64_t n = slots_.size();
  const uint64_t first = kept > n ? kept - n : 0;
  uint64_t written = 0;
  const RingCall* last = nullptr;
  // The anchors (older setup calls of wrapper objects) first, then the ring, oldest first.
  for (uint64_t i = 0; i < kMaxAnchors + kept - first; ++i) {
    RingCall* c = i < kMaxAnchors
                      ? anchor_slots_[i].load(std::memory_order_acquire)
                      : slots_[(first + i - kMaxAnchors) % n].load(std::memory_order_acquire);
    if (!c) continue;
    CallFiles* f = c->files.load(std::memory_order_acquire);
    if (!f) continue;
    char dir_buf[1024], dir_json_buf[2048];
    const char* dir = dir_buf;
    const std::string_view dir_name = call_dir_name(*c, dir_buf, sizeof(dir_buf), false);
    const std::string_view dir_json = call_dir_name(*c, dir_json_buf, sizeof(dir_json_buf), true);
    if (dir_name.empty() || dir_json.empty()) continue;
    if (!file_path(dir, "")) continue;
    path[std::strlen(path) - 1] = '\0';  // the call directory itself
    if (::mkdir(path, 0777) != 0 && errno != EEXIST) continue;
    if (!file_path(dir, schema::kMetadataFile)) continue;
    const int meta = open_new(path);
    if (meta < 0) continue;
    {
      // Both files get the same lines: metadata.jsonl and the dump's session.jsonl.
      int fds[2] = {meta, session};
      TextOut out(line_buf, sizeof(line_buf), write_to_fds, fds);
      const std::string_view dump_dir_json[] = {prefix_json_, rel, "/", dir_json};
      write_kept_call_records(*c, *f, dump_dir_json, out, extra_);
      out.flush();
    }
    ::close(meta);
    struct Side {
      bool has;
      const KeptArchive* archive;
      std::string_view stem;
    };
    const CallFiles* in = c->begin.get();  // the inputs archive (CallFiles)
    const Side sides[] = {{in && in->has_inputs, in ? &in->inputs : nullptr, schema::kInputsStem},
                          {f->has_outputs, &f->outputs, schema::kOutputsStem},
                          {f->has_mutated, &f->mutated, schema::kMutatedStem}};
    for (const Side& s : sides) {
      if (!s.has) continue;
      if (cfg_.dedup) {  // <stem>.refs.json, each blob once per dump (ring_dedup_dump.h)
        write_ring_dedup_side(root, dir_name, s.stem, *s.archive->layout->items,
                              s.archive->data.data());
        continue;
      }
      char name[32];
      FixedText nm(name, sizeof(name));
      nm.put(s.stem);
      nm.put(schema::kTorchExtension);
      const std::string_view file(name, nm.n);
      if (!file_path(dir, file)) continue;
      // Each distinct archive once per dump: an archive equal to one already written (the same
      // tensors, held in the same blobs, in the same layout) becomes a hard link to that file,
      // so upstream's loader still finds every call's own file. A copy where link(2) fails.
      bool done = false;
      for (const WrittenArchive& w : archives) {
        if (w.stem != s.stem || !same_archive(*w.archive, *s.archive)) continue;
        char other[1024];
        if (!call_dir_name(*w.call, other, sizeof(other), false).empty() &&
            path_into(linked, sizeof(linked), other, file)) {
          ::unlink(path);  // a file left by an earlier attempt at the same path
          done = ::link(linked, path) == 0;
        }
        break;
      }
      if (done) continue;
      const int fd = open_new(path);
      if (fd < 0) continue;
      const bool ok = formats::write_archive_layout(fd, *s.archive->layout, s.archive->data.data());
      ::close(fd);
      if (ok && archives.size() < archives.capacity()) archives.push_back({s.archive, c, s.stem});
    }
    ++written;
    last = c;
  }
  ::close(session);
  // trigger.json: why, and which call.
  if (!file_path(nullptr, "trigger.json")) return false;
  const int tj = open_new(path);
  if (tj < 0) return false;
  char text[4096];
  FixedText j(text, sizeof(text));
  j.put("{\"reason\": \"");
  j.put(reason, std::strlen(reason));
  j.put("\", \"signal\": ");
  if (signo) {
    j.put_u64(static_cast<uint64_t>(signo));
    j.put(", \"signal_name\": \"");
    const char* sn = signal_name(signo);
    j.put(sn, std::strlen(sn));
    j.put("\"");
  } else {
    j.put("null");
  }
  j.put(", \"process_id\": ");
  j.put_u64(static_cast<uint64_t>(pid_));
  j.put(", \"calls\": ");
  j.put_u64(written);
  j.put(", \"ring_size\": ");
  j.put_u64(n);
  j.put(", \"triggering_call\": ");
  (void)last;
  bool found = false;
  if (trigger) {
    for (uint64_t i = first; i < kept; ++i) {
      if (slots_[i % n].load(std::memory_order_acquire) == trigger) found = true;
    }
  }
  if (found) {
    j.put("{\"");
    j.put(schema::kFunctionName);
    j.put("\": \"");
    j.put(trigger->name_json);
    j.put("\", \"");
    j.put(schema::kCallSequence);
    j.put("\": ");
    put_i64(j, trigger->sequence);
    j.put(", \"");
    j.put(schema::kProcessSequence);
    j.put("\": ");
    put_i64(j, trigger->process_sequence);
    j.put(", \"dump_dir\": \"");
    j.put(prefix_json_);
    j.put(rel);
    j.put("/");
    char dir_json_buf[2048];
    j.put(call_dir_name(*trigger, dir_json_buf, sizeof(dir_json_buf), true));
    j.put("\"}");
  } else {
    j.put("null");
  }
  j.put("}\n");
  const bool ok = !j.overflow && write_all(tj, text, j.n);
  ::close(tj);
  return ok;
}

Stats RingRecorder::stats() {
  std::lock_guard<std::mutex> l(mu_);
  Stats s;
  s.ring_calls = static_cast<int64_t>(calls_.size());
  s.ring_bytes = held_->load(std::memory_order_relaxed);
  s.ring_retained_bytes = retained_bytes_;
  s.ring_copied_bytes = copied_.load(std::memory_order_relaxed);
  s.ring_dumps = dumps_.load();
  return s;
}

std::shared_ptr<RingRecorder> make_ring_recorder(const Config& config, LineSink sink) {
  auto r = std::make_shared<RingRecorder>(config, std::move(sink));
  r->install_handlers();
  return r;
}

std::shared_ptr<CallObserver> as_observer(const std::shared_ptr<RingRecorder>& r) { return r; }

std::string ring_dump(RingRecorder& r, const std::string& reason) {
  return r.dump(reason, nullptr);
}

Stats ring_stats(RingRecorder& r) { return r.stats(); }

double ring_hook_seconds() {
  const uint64_t ticks = g_hook_ticks.load(std::memory_order_relaxed);
  if (ticks == 0) return 0.0;
  static const double rate = seconds_per_tick();  // one rate, so equal counts read equal
  return static_cast<double>(ticks) * rate;
}

uint64_t ring_shape_hits() { return g_shape_hits.load(std::memory_order_relaxed); }

void ring_shutdown(RingRecorder& r) { r.remove_handlers(); }

}  // namespace flashinfer::recorder::internal
