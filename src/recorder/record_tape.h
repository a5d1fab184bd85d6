// Private: a call's record kept in a compact structured form (the ring mode's hot path) and
// written as upstream's record text only when a dump is written. The writer is allocation-free
// and async-signal-safe (fixed buffers, std::to_chars), so the crash handler uses it too; its
// text is byte for byte record_line()'s (recorder/record_json.h) for the same call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/device.h"
#include "flashinfer/dtype.h"
#include "flashinfer/tensor.h"

namespace flashinfer::recorder::internal {

/// Text written through a fixed buffer: when it fills, its bytes go to `sink` (write(2) to one
/// or two files in a dump, a std::string in tests). No allocation; async-signal-safe when the
/// sink is.
class TextOut {
 public:
  using Sink = void (*)(void* ctx, const char* p, std::size_t n);
  TextOut(char* buf, std::size_t cap, Sink sink, void* ctx)
      : p_(buf), cap_(cap), sink_(sink), ctx_(ctx) {}
  void put(const char* s, std::size_t n) noexcept;
  void put(std::string_view s) noexcept { put(s.data(), s.size()); }
  void put(char c) noexcept {
    if (n_ == cap_) flush();
    p_[n_++] = c;
  }
  void put_u64(uint64_t v) noexcept;
  void put_i64(int64_t v) noexcept;
  /// json.dumps' float text: repr(), or NaN / Infinity / -Infinity.
  void put_json_float(double d) noexcept;
  /// A JSON string literal escaped as json.dumps does (ensure_ascii).
  void put_json_string(std::string_view s) noexcept;
  void flush() noexcept;

 private:
  char* p_;
  std::size_t cap_, n_ = 0;
  Sink sink_;
  void* ctx_;
};

/// Python's repr() of a double ("1.5", "1e-05", "1e+16", "nan", "inf") into `out` (at least 32
/// bytes); returns its length. Allocation-free; the same text as python_float_repr().
std::size_t float_repr_chars(double v, char* out) noexcept;

/// A JSON value (or an open object's members) recorded as the writer calls that would write it
/// (PyJsonWriter's interface), replayed as text by write_tape(). The bytes are reused from call
/// to call (clear() keeps the capacity), so recording allocates nothing once warm.
class RecordTape {
 public:
  enum Op : uint8_t {
    kBeginObject,
    kEndObject,
    kBeginArray,
    kEndArray,
    kKey,
    kNull,
    kTrue,
    kFalse,
    kInt,
    kUint,
    kFloat,
    kString,
  };
  void clear() { bytes_.clear(); }
  bool empty() const { return bytes_.empty(); }
  RecordTape& begin_object() { return op(kBeginObject); }
  RecordTape& end_object() { return op(kEndObject); }
  RecordTape& begin_array() { return op(kBeginArray); }
  RecordTape& end_array() { return op(kEndArray); }
  RecordTape& key(std::string_view k) { return text(kKey, k); }
  RecordTape& null() { return op(kNull); }
  RecordTape& boolean(bool b) { return op(b ? kTrue : kFalse); }
  RecordTape& integer(int64_t v) { return scalar(kInt, &v); }
  RecordTape& uinteger(uint64_t v) { return scalar(kUint, &v); }
  RecordTape& number(double v) { return scalar(kFloat, &v); }
  RecordTape& string(std::string_view s) { return text(kString, s); }
  std::span<const char> bytes() const { return bytes_; }

 private:
  RecordTape& op(Op o) {
    bytes_.push_back(static_cast<char>(o));
    return *this;
  }
  RecordTape& scalar(Op o, const void* v);
  RecordTape& text(Op o, std::string_view s);
  std::vector<char> bytes_;
};

/// Replays a tape as json.dumps text (PyJsonWriter's commas and ": "). A tape that leaves
/// containers open (a record head) leaves them open.
void write_tape(const RecordTape& tape, TextOut& out) noexcept;

/// A kept tensor as the record describes it (tensor_info and tensor_details).
struct TensorMeta {
  std::string key;
  DType dtype = DType::kFloat32;
  Shape shape, strides;
  Device device;  // the original device
};

/// What line 1 (inputs_saved) says that depends only on the op and its arguments (their values
/// and tensor metadata, not the tensors' bytes): input_metadata's object, the inputs' metadata
/// and their logical bytes. A decode step repeats these call after call, so the ring keeps one
/// immutable copy per distinct value, shared by the calls (RecentTemplates): writing them into
/// every kept call's cold storage was the largest part of the record's cost (session 17).
struct InputTemplate {
  RecordTape metadata;  // input_metadata's object
  std::vector<TensorMeta> tensors;
  uint64_t bytes = 0;  // logical input bytes, as upstream counts
};

/// What line 2 (completed) adds that depends only on the op, its arguments and its result's
/// values and metadata: output_metadata's object, the outputs' and mutated arguments' metadata.
struct OutputTemplate {
  RecordTape metadata;  // output_metadata's object
  std::vector<TensorMeta> outputs, mutated;
  uint64_t bytes = 0;  // logical output bytes
};

/// What determines a template, hashed: XXH3-128 of the bytes it is made from (the metadata
/// tape and the tensors' keys, dtypes, devices, shapes and strides). Templates are matched by
/// this hash alone, not compared member by member: comparing read the shared template's heap
/// blocks, as cold as the per-call copies they replace (session 17). A false match would take
/// two different argument texts with equal 128-bit hashes, the same assumption the dedup
/// layout's content addresses make.
struct TemplateKey {
  uint64_t lo = 0, hi = 0;  // {0, 0}: no entry
  friend bool operator==(const TemplateKey&, const TemplateKey&) = default;
};
TemplateKey template_key(std::span<const char> bytes);

/// An op's last few distinct templates (one cache per op and side: record templates here, the
/// ring's archive layouts), by TemplateKey. A few entries, as one op is called with a few
/// shapes in turn (a decode step's GEMMs: five weights, four output shapes; with four entries
/// they missed in turn, session 17). Thread-safe.
template <class T>
class RecentTemplates {
 public:
  /// The recent template with key `k`, or null.
  std::shared_ptr<const T> find(const TemplateKey& k) {
    std::lock_guard<std::mutex> l(mu_);
    for (std::size_t w = 0; w < kWays; ++w) {
      if (key_[w] == k) return entry_[w];
    }
    return nullptr;
  }
  void insert(const TemplateKey& k, std::shared_ptr<const T> t) {
    std::lock_guard<std::mutex> l(mu_);
    const std::size_t w = next_;
    next_ = (w + 1) % kWays;
    key_[w] = k;
    entry_[w] = std::move(t);
  }

 private:
  static constexpr std::size_t kWays = 8;
  std::mutex mu_;
  std::array<TemplateKey, kWays> key_{};  // together: a lookup reads two lines
  std::array<std::shared_ptr<const T>, kWays> entry_;
  std::size_t next_ = 0;  // the entry a miss replaces (round robin)
};

/// A call's line 1, structured: its own fields (what upstream writes before input_metadata,
/// and the flags after the tail) and its shared template.
struct InputRecord {
  // Views of text that outlives the record (the ring: its per-op copies of the declaration's).
  std::string_view function_name, module;
  int64_t call_sequence = 0, pid = 0;
  std::array<char, 32> timestamp{};  // timestamp_now()'s text, `timestamp_len` bytes
  uint8_t timestamp_len = 0;
  std::shared_ptr<const InputTemplate> inputs;
  const std::string* tail = nullptr;  // record_tail()'s text, owned by the caller
  bool graph = false;
  std::optional<uint64_t> self_id;
  int64_t process_sequence = 0;
};

/// What line 2 (completed) adds: the shared template of the result's output_metadata, the
/// outputs and the mutated arguments.
struct OutputRecord {
  std::shared_ptr<const OutputTemplate> outputs;
};

/// Writes one record line (with its '\n'): line 1 when `out` is null, else line 2. Its text is
/// record_line(parts, outcome, status, dump_dir, extra) for the same call, where
/// `dump_dir_json` are the pieces of the dump directory's JSON-escaped text (without quotes)
/// and `extra` the members after upstream's keys (', "tensor_store": "dedup"' in the dedup
/// layout). Allocation-free and async-signal-safe.
void write_record_line(const InputRecord& in, const OutputRecord* out,
                       std::span<const std::string_view> dump_dir_json, TextOut& text,
                       std::string_view extra = {}) noexcept;

/// Fills `m` (reusing its storage) from a tensor under `key`.
void set_tensor_meta(TensorMeta& m, std::string_view key, const Tensor& t);

}  // namespace flashinfer::recorder::internal
