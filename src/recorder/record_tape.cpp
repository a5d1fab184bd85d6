#include "recorder/record_tape.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include <xxhash.h>

#include "recorder/dump_schema.h"

namespace flashinfer::recorder::internal {

namespace schema = flashinfer::dump_schema;

// ---- TextOut
// -----------------------------------------------------------------------------------

void TextOut::flush() noexcept {
  if (n_ && sink_) sink_(ctx_, p_, n_);
  n_ = 0;
}

void TextOut::put(const char* s, std::size_t n) noexcept {
  while (n > 0) {
    if (n_ == cap_) flush();
    const std::size_t k = n < cap_ - n_ ? n : cap_ - n_;
    std::memcpy(p_ + n_, s, k);
    n_ += k;
    s += k;
    n -= k;
  }
}

void TextOut::put_u64(uint64_t v) noexcept {
  char b[24];
  const auto r = std::to_chars(b, b + sizeof(b), v);
  put(b, static_cast<std::size_t>(r.ptr - b));
}

void TextOut::put_i64(int64_t v) noexcept {
  char b[24];
  const auto r = std::to_chars(b, b + sizeof(b), v);
  put(b, static_cast<std::size_t>(r.ptr - b));
}

std::size_t float_repr_chars(double v, char* out) noexcept {
  const auto copy = [out](const char* s) {
    const std::size_t n = std::strlen(s);
    std::memcpy(out, s, n);
    return n;
  };
  if (std::isnan(v)) return copy("nan");
  if (std::isinf(v)) return copy(v > 0 ? "inf" : "-inf");
  // Shortest round-tripping digits (std::to_chars does not allocate), then Python's layout:
  // scientific when the decimal exponent is < -4 or >= 16, else positional with at least one
  // digit after the point (python_float_repr's rules).
  char sci[40];
  const auto res = std::to_chars(sci, sci + sizeof(sci), v, std::chars_format::scientific);
  const char* end = res.ptr;
  const char* e = sci;
  while (e < end && *e != 'e') ++e;
  int exp = 0;
  std::from_chars(e + 1 + (e[1] == '+' ? 1 : 0), end, exp);
  const char* m = sci;
  std::size_t n = 0;
  if (*m == '-') {
    out[n++] = '-';
    ++m;
  }
  char digits[32] = {};
  std::size_t nd = 0;
  for (const char* c = m; c < e; ++c) {
    if (*c != '.') digits[nd++] = *c;
  }
  const auto put = [&](const char* s, std::size_t k) {
    std::memcpy(out + n, s, k);
    n += k;
  };
  if (exp < -4 || exp >= 16) {
    put(digits, 1);
    if (nd > 1) {
      out[n++] = '.';
      put(digits + 1, nd - 1);
    }
    out[n++] = 'e';
    out[n++] = exp < 0 ? '-' : '+';
    const int a = exp < 0 ? -exp : exp;
    if (a < 10) out[n++] = '0';
    const auto r = std::to_chars(out + n, out + n + 8, a);
    n = static_cast<std::size_t>(r.ptr - out);
  } else if (exp < 0) {
    out[n++] = '0';
    out[n++] = '.';
    for (int i = 0; i < -exp - 1; ++i) out[n++] = '0';
    put(digits, nd);
  } else {
    const auto intlen = static_cast<std::size_t>(exp) + 1;
    if (nd <= intlen) {
      put(digits, nd);
      for (std::size_t i = nd; i < intlen; ++i) out[n++] = '0';
      put(".0", 2);
    } else {
      put(digits, intlen);
      out[n++] = '.';
      put(digits + intlen, nd - intlen);
    }
  }
  return n;
}

void TextOut::put_json_float(double d) noexcept {
  if (std::isnan(d)) {
    put("NaN");
  } else if (std::isinf(d)) {
    put(d > 0 ? "Infinity" : "-Infinity");
  } else {
    char b[48];
    put(b, float_repr_chars(d, b));
  }
}

namespace {

// The length of the well-formed UTF-8 sequence starting at s[i] (a byte >= 0x80), or 0 when it
// does not start one (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
int utf8_sequence_length(std::string_view s, std::size_t i) noexcept {
  const auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = at(i);
  int len = 0;
  unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + static_cast<std::size_t>(len) > s.size()) return 0;
  if (at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (int k = 2; k < len; ++k)
    if (at(i + k) < 0x80 || at(i + k) > 0xBF) return 0;
  return len;
}

void put_u_escape(TextOut& out, uint32_t cp) noexcept {
  static constexpr char kHex[] = "0123456789abcdef";
  const char b[6] = {
      '\\', 'u', kHex[(cp >> 12) & 15], kHex[(cp >> 8) & 15], kHex[(cp >> 4) & 15], kHex[cp & 15]};
  out.put(b, sizeof(b));
}

}  // namespace

void TextOut::put_json_string(std::string_view s) noexcept {
  // append_json_string's escaping (recorder/python_json.cpp), without allocating.
  put('"');
  for (std::size_t i = 0; i < s.size();) {
    std::size_t j = i;
    while (j < s.size() && s[j] >= 0x20 && s[j] < 0x7f && s[j] != '"' && s[j] != '\\') ++j;
    if (j > i) {
      put(s.data() + i, j - i);
      i = j;
      continue;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"') {
      put("\\\"");
    } else if (c == '\\') {
      put("\\\\");
    } else if (c == '\n') {
      put("\\n");
    } else if (c == '\r') {
      put("\\r");
    } else if (c == '\t') {
      put("\\t");
    } else if (c == '\b') {
      put("\\b");
    } else if (c == '\f') {
      put("\\f");
    } else if (c < 0x20 || c == 0x7f) {
      put_u_escape(*this, c);
    } else if (c < 0x80) {
      put(static_cast<char>(c));
    } else {
      // UTF-8 as \uXXXX (surrogate pairs above the BMP); a byte that starts no well-formed
      // sequence as Python's surrogateescape decodes it (U+DC00 + byte).
      const int len = utf8_sequence_length(s, i);
      uint32_t cp = 0;
      if (len == 0) {
        cp = 0xDC00 + c;
      } else {
        cp = c & (0x7F >> len);
        for (int k = 1; k < len; ++k)
          cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      }
      if (cp >= 0x10000) {
        cp -= 0x10000;
        put_u_escape(*this, 0xD800 + (cp >> 10));
        put_u_escape(*this, 0xDC00 + (cp & 0x3FF));
      } else {
        put_u_escape(*this, cp);
      }
      i += static_cast<std::size_t>(len == 0 ? 1 : len);
      continue;
    }
    ++i;
  }
  put('"');
}

// ---- RecordTape
// --------------------------------------------------------------------------------

RecordTape& RecordTape::scalar(Op o, const void* v) {
  const std::size_t at = bytes_.size();
  bytes_.resize(at + 9);
  bytes_[at] = static_cast<char>(o);
  std::memcpy(bytes_.data() + at + 1, v, 8);
  return *this;
}

RecordTape& RecordTape::text(Op o, std::string_view s) {
  const std::size_t at = bytes_.size();
  const auto n = static_cast<uint32_t>(s.size());
  bytes_.resize(at + 5 + n);
  bytes_[at] = static_cast<char>(o);
  std::memcpy(bytes_.data() + at + 1, &n, 4);
  if (n) std::memcpy(bytes_.data() + at + 5, s.data(), n);
  return *this;
}

void write_tape(const RecordTape& tape, TextOut& out) noexcept {
  // PyJsonWriter's state: bit d of `empty` set while the container at depth d has no member.
  uint64_t empty = 0;
  int depth = 0;
  bool after_key = false;
  const auto before_value = [&] {
    if (after_key) {
      after_key = false;
      return;
    }
    if (depth == 0) return;
    const uint64_t bit = uint64_t{1} << (depth - 1);
    if (empty & bit) {
      empty &= ~bit;
    } else {
      out.put(", ");
    }
  };
  const std::span<const char> b = tape.bytes();
  for (std::size_t i = 0; i < b.size();) {
    const auto op = static_cast<RecordTape::Op>(b[i++]);
    switch (op) {
      case RecordTape::kBeginObject:
      case RecordTape::kBeginArray:
        before_value();
        out.put(op == RecordTape::kBeginObject ? '{' : '[');
        if (depth < 64) empty |= uint64_t{1} << depth;
        ++depth;
        break;
      case RecordTape::kEndObject:
      case RecordTape::kEndArray:
        --depth;
        out.put(op == RecordTape::kEndObject ? '}' : ']');
        break;
      case RecordTape::kNull:
        before_value();
        out.put("null");
        break;
      case RecordTape::kTrue:
        before_value();
        out.put("true");
        break;
      case RecordTape::kFalse:
        before_value();
        out.put("false");
        break;
      case RecordTape::kInt:
      case RecordTape::kUint:
      case RecordTape::kFloat: {
        before_value();
        char v[8];
        std::memcpy(v, b.data() + i, 8);
        i += 8;
        if (op == RecordTape::kInt) {
          int64_t x;
          std::memcpy(&x, v, 8);
          out.put_i64(x);
        } else if (op == RecordTape::kUint) {
          uint64_t x;
          std::memcpy(&x, v, 8);
          out.put_u64(x);
        } else {
          double x;
          std::memcpy(&x, v, 8);
          out.put_json_float(x);
        }
        break;
      }
      case RecordTape::kKey:
      case RecordTape::kString: {
        uint32_t n = 0;
        std::memcpy(&n, b.data() + i, 4);
        const std::string_view s(b.data() + i + 4, n);
        i += 4 + n;
        before_value();
        out.put_json_string(s);
        if (op == RecordTape::kKey) {
          out.put(": ");
          after_key = true;
        }
        break;
      }
    }
  }
}

// ---- record lines
// ------------------------------------------------------------------------------

namespace {

// '"key": ' (record_json's key_text).
void key_text(TextOut& out, std::string_view key) {
  out.put_json_string(key);
  out.put(": ");
}

void shape_text(TextOut& out, const Shape& s) {
  out.put('[');
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out.put(", ");
    out.put_i64(s[i]);
  }
  out.put(']');
}

void keys_text(TextOut& out, const std::vector<TensorMeta>& t) {
  out.put('[');
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (i) out.put(", ");
    out.put_json_string(t[i].key);
  }
  out.put(']');
}

void device_text(TextOut& out, const Device& d) {
  if (d.is_cpu()) {
    out.put_json_string("cpu");
    return;
  }
  out.put("\"cuda:");
  out.put_i64(d.index);
  out.put('"');
}

// '"key": {shape, dtype, stride, device, original_device}, ...' (record_json's details_members).
void details_members(TextOut& out, const std::vector<TensorMeta>& t) {
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (i) out.put(", ");
    key_text(out, t[i].key);
    out.put('{');
    key_text(out, schema::kShape);
    shape_text(out, t[i].shape);
    out.put(", ");
    key_text(out, schema::kDType);
    out.put_json_string(dtype_torch_name(t[i].dtype));
    out.put(", ");
    key_text(out, schema::kStride);
    shape_text(out, t[i].strides);
    out.put(", ");
    key_text(out, schema::kDevice);
    out.put_json_string("cpu");
    out.put(", ");
    key_text(out, schema::kOriginalDevice);
    device_text(out, t[i].device);
    out.put('}');
  }
}

void size_members(TextOut& out, std::string_view bytes_key, std::string_view mb_key,
                  uint64_t bytes) {
  key_text(out, bytes_key);
  out.put_u64(bytes);
  out.put(", ");
  key_text(out, mb_key);
  out.put_json_float(static_cast<double>(bytes) / 1048576.0);
}

}  // namespace

// A record without its templates (not filled): no tensors, empty metadata. At namespace scope,
// constant-initialized: a function-local static's guard is not async-signal-safe.
const InputTemplate kNoInputs;
const OutputTemplate kNoOutputs;

void write_record_line(const InputRecord& in, const OutputRecord* o,
                       std::span<const std::string_view> dump_dir_json, TextOut& out,
                       std::string_view extra) noexcept {
  const InputTemplate& ins = in.inputs ? *in.inputs : kNoInputs;
  const OutputTemplate* outs = o ? o->outputs.get() : nullptr;
  if (o && !outs) outs = &kNoOutputs;
  // record_head()'s text: the call's own keys, then its template's input_metadata.
  out.put('{');
  key_text(out, schema::kFunctionName);
  out.put_json_string(in.function_name);
  out.put(", ");
  key_text(out, schema::kModule);
  out.put_json_string(in.module);
  out.put(", ");
  key_text(out, schema::kCallSequence);
  out.put_i64(in.call_sequence);
  out.put(", ");
  key_text(out, schema::kTimestamp);
  out.put_json_string(std::string_view(in.timestamp.data(), in.timestamp_len));
  out.put(", ");
  key_text(out, schema::kProcessId);
  out.put_i64(in.pid);
  out.put(", ");
  key_text(out, schema::kInputMetadata);
  if (ins.metadata.empty()) {
    out.put("{}");
  } else {
    write_tape(ins.metadata, out);
  }
  out.put(", ");
  key_text(out, schema::kOutputMetadata);
  if (o) {
    write_tape(outs->metadata, out);
  } else {
    out.put("{}");
  }
  out.put(", ");
  key_text(out, schema::kTensorInfo);
  out.put('{');
  key_text(out, schema::kInputTensorKeys);
  keys_text(out, ins.tensors);
  out.put(", ");
  key_text(out, schema::kOutputTensorKeys);
  if (o) {
    keys_text(out, outs->outputs);
  } else {
    out.put("[]");
  }
  out.put(", ");
  size_members(out, schema::kInputSizeBytes, schema::kInputSizeMb, ins.bytes);
  if (o) {
    out.put(", ");
    size_members(out, schema::kOutputSizeBytes, schema::kOutputSizeMb, outs->bytes);
    out.put(", ");
    size_members(out, schema::kTotalSizeBytes, schema::kTotalSizeMb, ins.bytes + outs->bytes);
    out.put(", ");
    key_text(out, schema::kMutatedTensorKeys);
    keys_text(out, outs->mutated);
  }
  out.put("}, ");
  key_text(out, schema::kTensorDetails);
  out.put('{');
  details_members(out, ins.tensors);
  if (o) {
    if (!ins.tensors.empty() && !outs->outputs.empty()) out.put(", ");
    details_members(out, outs->outputs);
  }
  out.put("}, ");
  if (in.tail) out.put(*in.tail);
  out.put(", ");
  key_text(out, schema::kExecutionStatus);
  out.put_json_string(o ? schema::kStatusCompleted : schema::kStatusInputsSaved);
  out.put(", ");
  key_text(out, schema::kGraphCapture);
  out.put(in.graph ? "true" : "false");
  if (in.self_id) {
    out.put(", ");
    key_text(out, schema::kSelfId);
    out.put_u64(*in.self_id);
  }
  out.put(", ");
  key_text(out, schema::kDumpDir);
  out.put('"');
  for (std::string_view p : dump_dir_json) out.put(p);
  out.put("\", ");
  bool cuda = false;
  for (const TensorMeta& t : ins.tensors) cuda = cuda || t.device.is_cuda();
  key_text(out, schema::kBackend);
  out.put_json_string(cuda ? "cuda" : "cpu");
  out.put(", ");
  key_text(out, schema::kProcessSequence);
  out.put_i64(in.process_sequence);
  out.put(extra);
  out.put("}\n");
}

TemplateKey template_key(std::span<const char> bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  // {0, 0} marks an empty entry; a hash equal to it is moved off it.
  return {h.low64, h.high64 | (h.low64 == 0 && h.high64 == 0 ? 1 : 0)};
}

void set_tensor_meta(TensorMeta& m, std::string_view key, const Tensor& t) {
  m.key.assign(key);
  m.dtype = t.dtype();
  const Shape& s = t.shape();
  const Shape& st = t.strides();
  m.shape.assign(s.begin(), s.end());
  m.strides.assign(st.begin(), st.end());
  m.device = t.device();
}

}  // namespace flashinfer::recorder::internal
