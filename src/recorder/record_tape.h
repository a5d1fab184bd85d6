// Private: a call's record kept in a compact structured form (the ring mode's hot path) and
// written as upstream's record text only when a dump is written. The writer is allocation-free
// and async-signal-safe (fixed buffers, std::to_chars), so the crash handler uses it too; its
// text is byte for byte record_line()'s (recorder/record_json.h) for the same call.
#pragma once

#include <cstddef>
#include <cstdint>
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

/// What a record's line 1 (inputs_saved) says, structured: the head as a tape, the inputs'
/// metadata, and the per-op tail (record_tail()'s text, owned by the caller and kept alive).
struct InputRecord {
  RecordTape head;  // '{"function_name": ..., "input_metadata": {...}' (the record left open)
  std::vector<TensorMeta> tensors;
  uint64_t bytes = 0;  // logical input bytes, as upstream counts
  const std::string* tail = nullptr;
  bool graph = false;
  std::optional<uint64_t> self_id;
  int64_t process_sequence = 0;
};

/// What line 2 (completed) adds: the result's output_metadata, the outputs and mutated
/// arguments.
struct OutputRecord {
  RecordTape metadata;  // output_metadata's object
  std::vector<TensorMeta> outputs, mutated;
  uint64_t bytes = 0;  // logical output bytes
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
