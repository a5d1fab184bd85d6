#include "recorder/record_json.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "calls/written_tensors.h"
#include "core/tensor_span.h"
#include "flashinfer/dtype.h"
#include "flashinfer/version.h"
#include "recorder/call_extensions.h"
#include "recorder/dump_schema.h"
#include "recorder/python_json.h"
#include "recorder/record_tape.h"
#include "recorder/ring_heap.h"

namespace flashinfer::recorder::internal {

namespace schema = flashinfer::dump_schema;

namespace {

constexpr int kMaxDepth = 8;  // upstream's recursion cap for nested containers

// '"key": ' (keys are plain ASCII, escaped anyway).
void key_text(std::string& out, std::string_view key) {
  append_json_string(out, key);
  out += ": ";
}

template <typename W>
void shape_json(W& w, const Shape& s) {
  w.begin_array();
  for (int64_t d : s) w.integer(d);
  w.end_array();
}

// A float value: the text, cached (PyJsonWriter), or the number itself (a tape: formatted when
// a dump is written).
void float_value(PyJsonWriter& w, double d) {
  // Shortest round-trip digits are costly and a program passes the same few floats (eps,
  // scales) call after call: their text is cached per thread by bit pattern, bounded.
  thread_local std::unordered_map<uint64_t, std::string> float_text;
  uint64_t bits = 0;
  std::memcpy(&bits, &d, sizeof(bits));
  auto it = float_text.find(bits);
  if (it == float_text.end()) {
    if (float_text.size() >= 4096) float_text.clear();
    std::string t;
    append_json_float(t, d);
    it = float_text.emplace(bits, std::move(t)).first;
  }
  w.raw(it->second);
}
void float_value(RecordTape& w, double d) { w.number(d); }

// Writes one argument as upstream's _serialize_value does, collecting its tensors under their
// keys (nested ones as key__<i>). W: PyJsonWriter (text now) or RecordTape (text at a dump).
template <typename W>
void serialize(W& w, const Value& v, const std::string& key, Extracted& ex, int depth) {
  switch (v.kind()) {
    case Value::Kind::kNone:
      w.null();
      return;
    case Value::Kind::kBool:
      w.boolean(v.as_bool());
      return;
    case Value::Kind::kInt:
      w.integer(v.as_int());
      return;
    case Value::Kind::kFloat:
      float_value(w, v.as_float());
      return;
    case Value::Kind::kString:
      w.string(v.as_string());
      return;
    case Value::Kind::kDType:
      w.begin_object().key(schema::kType).string(schema::kTypeDType);
      w.key(schema::kValue).string(dtype_torch_name(v.as_dtype())).end_object();
      return;
    case Value::Kind::kEnum: {
      const EnumValue& e = v.as_enum();
      w.begin_object().key(schema::kType).string(schema::kTypeEnum);
      w.key(schema::kName).string(e.type + "." + e.name);
      w.key(schema::kValue);
      char* end = nullptr;
      const long long n = std::strtoll(e.value.c_str(), &end, 10);
      if (!e.value.empty() && end && *end == '\0') {
        w.integer(n);  // integer-valued enums stay ints
      } else {
        w.string(e.value);
      }
      w.end_object();
      return;
    }
    case Value::Kind::kTensor: {
      const Tensor& t = v.as_tensor();
      ex.add(key, t);
      w.begin_object().key(schema::kType).string(schema::kTypeTensor).key(schema::kShape);
      shape_json(w, t.shape());
      w.key(schema::kDType).string(dtype_torch_name(t.dtype())).key(schema::kStride);
      shape_json(w, t.strides());
      w.key(schema::kDevice).string(t.device().str()).key(schema::kRequiresGrad).boolean(false);
      w.key(schema::kIsContiguous).boolean(t.is_contiguous());
      w.key(schema::kTensorKey).string(key).end_object();
      return;
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const auto& items = v.items();
      w.begin_object().key(schema::kType);
      w.string(v.kind() == Value::Kind::kList ? schema::kTypeList : schema::kTypeTuple);
      w.key(schema::kLength).uinteger(items.size());
      if (depth >= kMaxDepth) {
        w.key(schema::kTruncated).boolean(true).end_object();
        return;
      }
      w.key(schema::kItems).begin_array();
      for (std::size_t i = 0; i < items.size(); ++i) {
        serialize(w, items[i], key + std::string(schema::kNestedSeparator) + std::to_string(i), ex,
                  depth + 1);
      }
      w.end_array().key(schema::kTruncated).boolean(false).end_object();
      return;
    }
    case Value::Kind::kDict: {
      const auto& items = v.dict_items();
      w.begin_object().key(schema::kType).string(schema::kTypeDict);
      w.key(schema::kLength).uinteger(items.size());
      if (depth >= kMaxDepth) {
        w.key(schema::kTruncated).boolean(true).end_object();
        return;
      }
      w.key(schema::kItems).begin_array();
      for (std::size_t i = 0; i < items.size(); ++i) {
        const std::string n = std::to_string(i);
        w.begin_object().key(schema::kKey);
        serialize(w, items[i].first, key + std::string(schema::kNestedKey) + n, ex, depth + 1);
        w.key(schema::kValue);
        serialize(w, items[i].second, key + std::string(schema::kNestedValue) + n, ex, depth + 1);
        w.end_object();
      }
      w.end_array().key(schema::kTruncated).boolean(false).end_object();
      return;
    }
    case Value::Kind::kObject:
      w.begin_object().key(schema::kType).string(v.as_object().type);
      w.key(schema::kRepr)
          .string(std::string_view(v.as_object().repr).substr(0, 1000))
          .end_object();
      return;
  }
  w.null();
}

// The "versions" value, the same for every record of the process.
const std::string& versions_text() {
  static const std::string text = [] {
    const BuildInfo& b = build_info();
    std::string t;
    PyJsonWriter w(t);
    w.begin_object().key(schema::kVersionFlashinfer).string(b.version);
    w.key(schema::kVersionFlashinferCpp).string(b.version);
    w.key(schema::kVersionCompiler).string(b.compiler);
    w.key(schema::kVersionCudaToolkit)
        .string(b.cuda ? std::string(b.cuda_version) : std::string("<none: CPU-only build>"));
    w.end_object();
    return t;
  }();
  return text;
}

// '"key": {shape, dtype, stride, device, original_device}, ...' for each staged tensor.
std::string details_members(const Extracted& ex) {
  std::string t;
  for (std::size_t i = 0; i < ex.tensors.size(); ++i) {
    const auto& [k, x] = ex.tensors[i];
    if (i) t += ", ";
    key_text(t, k);
    PyJsonWriter w(t);
    w.begin_object().key(schema::kShape);
    shape_json(w, x.shape());
    w.key(schema::kDType).string(dtype_torch_name(x.dtype())).key(schema::kStride);
    shape_json(w, x.strides());
    w.key(schema::kDevice).string("cpu");
    w.key(schema::kOriginalDevice).string(ex.devices[i].str());
    w.end_object();
  }
  return t;
}

std::string keys_text(const NamedTensors& t) {
  std::string s = "[";
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (i) s += ", ";
    append_json_string(s, t[i].first);
  }
  return s + "]";
}

void size_members(std::string& s, std::string_view bytes_key, std::string_view mb_key,
                  uint64_t bytes) {
  key_text(s, bytes_key);
  s += std::to_string(bytes);
  s += ", ";
  key_text(s, mb_key);
  // The float's repr is the costly part (shortest round-trip digits), and a program's calls
  // repeat the same few sizes: cached per thread by byte count, bounded.
  thread_local std::unordered_map<uint64_t, std::string> mb_text_cache;
  auto it = mb_text_cache.find(bytes);
  if (it == mb_text_cache.end()) {
    if (mb_text_cache.size() >= 4096) mb_text_cache.clear();
    std::string t;
    append_json_float(t, static_cast<double>(bytes) / 1048576.0);
    it = mb_text_cache.emplace(bytes, std::move(t)).first;
  }
  s += it->second;
}

}  // namespace

void Extracted::add(const std::string& key, const Tensor& t) {
  devices.push_back(t.device());
  if (by_reference && !spare.empty()) {
    auto& e = spare.back();
    e.first.assign(key);
    e.second = t;  // copy-assigned: the shape and stride vectors keep their buffers
    tensors.push_back(std::move(e));
    spare.pop_back();
  } else {
    tensors.emplace_back(key, by_reference ? t : detail::to_device_keep_layout(t, Device::cpu()));
  }
  bytes += t.nbytes();
}

namespace {

// The record key of parameter `i` (kwarg_<name> or arg_<i>), built in `out` (schema's
// *_key_into: no temporaries per argument in the recorder's hooks).
const std::string& param_key_into(std::string& out, const ParamDecl& pd, std::size_t i) {
  return pd.keyword_only ? schema::kwarg_key_into(out, pd.name) : schema::arg_key_into(out, i);
}

// input_metadata's object.
template <typename W>
void write_input_metadata(W& w, const OpDecl& decl, std::span<const Value> args, Extracted& ex) {
  w.begin_object();
  std::string key;
  for (std::size_t i = 0; i < args.size() && i < decl.params.size(); ++i) {
    const ParamDecl& pd = decl.params[i];
    // The holder of upstream's *args values (bind_arguments): written as the positional
    // arguments after the named ones (arg_<n>, arg_<n + 1>, ...), as upstream's recorder does.
    if (!decl.var_positional.empty() && pd.name == decl.var_positional) {
      if (!args[i].is_sequence()) continue;
      std::size_t n = 0;
      for (const ParamDecl& q : decl.params) n += q.keyword_only ? 0 : 1;
      for (const Value& x : args[i].items()) {
        const std::string& k = schema::arg_key_into(key, n++);
        if (x.is_tensor()) {
          ex.add(k, x.as_tensor());
        } else {
          w.key(k);
          serialize(w, x, k, ex, 0);
        }
      }
      continue;
    }
    if (pd.keyword_only && pd.default_value && *pd.default_value == args[i]) continue;
    param_key_into(key, pd, i);
    if (args[i].is_tensor()) {
      ex.add(key, args[i].as_tensor());
    } else {
      w.key(key);
      serialize(w, args[i], key, ex, 0);
    }
  }
  // This library's extension tensors (what a pointer argument names), after upstream's keys.
  if (const detail::RecordExtensionFn* extend = detail::record_extension(decl.name)) {
    std::vector<std::pair<std::string, Tensor>> extra;
    (*extend)(args, extra);
    for (const auto& [k, t] : extra) ex.add(k, t);
  }
  w.end_object();
}

template <typename W>
void write_head(W& w, const OpDecl& decl, std::span<const Value> args, int64_t call_sequence,
                std::string_view timestamp, int64_t pid, Extracted& ex) {
  w.begin_object().key(schema::kFunctionName).string(decl.name);
  w.key(schema::kModule).string(decl.module);
  w.key(schema::kCallSequence).integer(call_sequence);
  w.key(schema::kTimestamp).string(timestamp);
  w.key(schema::kProcessId).integer(pid);
  w.key(schema::kInputMetadata);
  write_input_metadata(w, decl, args, ex);
  // the record itself stays open: record_line() continues it
}

template <typename W>
void write_result(W& w, const Value& result, Extracted& out) {
  w.begin_object();
  if (result.is_tensor()) {
    out.add(std::string(schema::kResult), result.as_tensor());
  } else if (result.kind() == Value::Kind::kTuple) {
    const auto& items = result.items();
    for (std::size_t i = 0; i < items.size(); ++i) {
      const std::string key = std::string(schema::kResultPrefix) + std::to_string(i);
      if (items[i].is_tensor()) {
        out.add(key, items[i].as_tensor());
      } else {
        w.key(key);
        serialize(w, items[i], key, out, 0);
      }
    }
  } else {
    const std::string key(schema::kResult);
    w.key(key);
    serialize(w, result, key, out, 0);
  }
  w.end_object();
}

}  // namespace

std::string record_head(const OpDecl& decl, std::span<const Value> args, int64_t call_sequence,
                        const std::string& timestamp, int64_t pid, Extracted& ex) {
  std::string head;
  PyJsonWriter w(head);
  write_head(w, decl, args, call_sequence, timestamp, pid, ex);
  return head;
}

void extract_result_tape(const Value& result, Extracted& out, RecordTape& metadata) {
  metadata.clear();
  write_result(metadata, result, out);
}

namespace {

// A template's bytes (template_key): the metadata tape, then each tensor's key, dtype,
// original device, shape and strides, each list after its length.
void put_tape_key(std::string& k, const RecordTape& tape) {
  const uint64_t n = tape.bytes().size();
  k.append(reinterpret_cast<const char*>(&n), sizeof(n));
  k.append(tape.bytes().data(), tape.bytes().size());
}

void put_tensors_key(std::string& k, const Extracted& ex) {
  const uint64_t count = ex.tensors.size();
  k.append(reinterpret_cast<const char*>(&count), sizeof(count));
  for (std::size_t i = 0; i < ex.tensors.size(); ++i) {
    const auto& [key, t] = ex.tensors[i];
    const int64_t fixed[] = {static_cast<int64_t>(key.size()), static_cast<int64_t>(t.dtype()),
                             static_cast<int64_t>(ex.devices[i].type),
                             static_cast<int64_t>(ex.devices[i].index), t.dim()};
    k.append(reinterpret_cast<const char*>(fixed), sizeof(fixed));
    k.append(key);
    k.append(reinterpret_cast<const char*>(t.shape().data()), t.shape().size() * sizeof(int64_t));
    k.append(reinterpret_cast<const char*>(t.strides().data()),
             t.strides().size() * sizeof(int64_t));
  }
}

void set_metas(std::vector<TensorMeta>& metas, const Extracted& ex) {
  metas.resize(ex.tensors.size());
  for (std::size_t i = 0; i < ex.tensors.size(); ++i) {
    set_tensor_meta(metas[i], ex.tensors[i].first, ex.tensors[i].second);
    metas[i].device = ex.devices[i];
  }
}

// The template of a call whose metadata tape is `tape` and whose tensors are `sides`'s: a recent
// one with the same key from `templates` (the metadata was written into warm per-thread memory;
// only a new template is copied out, into memory the calls then share), else a new one that
// `fill` completes (its tensors' metadata and bytes) and `templates` keeps.
template <class T, std::size_t N, class Fill>
std::shared_ptr<const T> shared_template(RecentTemplates<T>* templates, const RecordTape& tape,
                                         const std::array<const Extracted*, N>& sides,
                                         Fill&& fill) {
  TemplateKey k;
  if (templates) {
    thread_local std::string key;
    key.clear();
    put_tape_key(key, tape);
    for (const Extracted* side : sides) put_tensors_key(key, *side);
    k = template_key(key);
    if (auto found = templates->find(k)) return found;
  }
  auto made = std::allocate_shared<T>(RingAlloc<T>{});  // read by every call that shares it
  made->metadata = tape;
  fill(*made);
  if (templates) templates->insert(k, made);
  return made;
}

}  // namespace

void fill_input_record_fields(InputRecord& rec, const OpDecl& decl, int64_t call_sequence,
                              std::string_view timestamp, int64_t pid, const std::string* tail,
                              std::optional<uint64_t> self_id, int64_t process_sequence) {
  rec.function_name = decl.name;
  rec.module = decl.module;
  rec.call_sequence = call_sequence;
  rec.pid = pid;
  rec.timestamp_len = static_cast<uint8_t>(std::min(timestamp.size(), rec.timestamp.size()));
  std::memcpy(rec.timestamp.data(), timestamp.data(), rec.timestamp_len);
  rec.tail = tail;
  rec.graph = false;
  rec.self_id = self_id;
  rec.process_sequence = process_sequence;
}

void fill_input_record(InputRecord& rec, const OpDecl& decl, std::span<const Value> args,
                       int64_t call_sequence, std::string_view timestamp, int64_t pid,
                       const std::string* tail, std::optional<uint64_t> self_id,
                       int64_t process_sequence, Extracted& ex,
                       RecentTemplates<InputTemplate>* templates) {
  fill_input_record_fields(rec, decl, call_sequence, timestamp, pid, tail, self_id,
                           process_sequence);
  thread_local RecordTape tape;
  tape.clear();
  write_input_metadata(tape, decl, args, ex);
  const std::array<const Extracted*, 1> sides = {&ex};
  rec.inputs = shared_template<InputTemplate>(templates, tape, sides, [&](InputTemplate& t) {
    t.bytes = ex.bytes;
    set_metas(t.tensors, ex);
  });
}

void fill_output_record(OutputRecord& rec, const OpDecl& decl, std::span<const Value> args,
                        const Value& result, Extracted& out, Extracted& mutated,
                        RecentTemplates<OutputTemplate>* templates) {
  thread_local RecordTape tape;
  tape.clear();
  write_result(tape, result, out);
  extract_mutated_into(decl, args, mutated);
  const std::array<const Extracted*, 2> sides = {&out, &mutated};
  rec.outputs = shared_template<OutputTemplate>(templates, tape, sides, [&](OutputTemplate& t) {
    t.bytes = out.bytes;
    set_metas(t.outputs, out);
    set_metas(t.mutated, mutated);
  });
}

void Extracted::clear() {
  static const Tensor kNone;
  for (auto& e : tensors) {
    if (spare.size() >= 64) break;
    e.second = kNone;  // the tensor is let go; its vectors' buffers stay
    spare.push_back(std::move(e));
  }
  tensors.clear();
  devices.clear();
  bytes = 0;
}

std::string record_tail(bool safetensors, const std::string& signature) {
  std::string tail;
  key_text(tail, schema::kTensorFormat);
  append_json_string(tail, safetensors ? schema::kFormatSafetensors : schema::kFormatTorch);
  tail += ", ";
  key_text(tail, schema::kFunctionSignature);
  append_json_string(tail, signature);
  tail += ", ";
  key_text(tail, schema::kVersions);
  tail += versions_text();
  return tail;
}

void finish_inputs(RecordParts& rec, const Extracted& ex, bool safetensors,
                   const std::string& signature, bool graph, std::optional<uint64_t> self_id,
                   int64_t process_sequence) {
  finish_inputs_with_tail(rec, ex, record_tail(safetensors, signature), graph, self_id,
                          process_sequence);
}

void set_graph_capture_flag(RecordParts& rec) {
  std::string key;
  key_text(key, schema::kGraphCapture);
  const std::string from = key + "false";
  if (rec.flags.compare(0, from.size(), from) == 0) rec.flags.replace(0, from.size(), key + "true");
}

void finish_inputs_with_tail(RecordParts& rec, const Extracted& ex, const std::string& tail,
                             bool graph, std::optional<uint64_t> self_id,
                             int64_t process_sequence) {
  rec.in_keys = keys_text(ex.tensors);
  rec.in_details = details_members(ex);
  rec.input_bytes = ex.bytes;
  rec.tail = tail;
  rec.flags.clear();
  key_text(rec.flags, schema::kGraphCapture);
  rec.flags += graph ? "true" : "false";
  if (self_id) {
    rec.flags += ", ";
    key_text(rec.flags, schema::kSelfId);
    rec.flags += std::to_string(*self_id);
  }
  // Extra keys upstream lacks (docs/LOGGING.md): where the call ran, and a process-wide call
  // order (directory names only resolve milliseconds, so replay uses it to order calls of one
  // process made within the same millisecond).
  bool cuda = false;
  for (const Device& d : ex.devices) cuda = cuda || d.is_cuda();
  rec.trailer.clear();
  key_text(rec.trailer, schema::kBackend);
  append_json_string(rec.trailer, cuda ? "cuda" : "cpu");
  rec.trailer += ", ";
  key_text(rec.trailer, schema::kProcessSequence);
  rec.trailer += std::to_string(process_sequence);
}

Outcome inputs_outcome(const RecordParts& rec) {
  Outcome o;
  o.tensor_info = "{";
  key_text(o.tensor_info, schema::kInputTensorKeys);
  o.tensor_info += rec.in_keys;
  o.tensor_info += ", ";
  key_text(o.tensor_info, schema::kOutputTensorKeys);
  o.tensor_info += "[], ";
  size_members(o.tensor_info, schema::kInputSizeBytes, schema::kInputSizeMb, rec.input_bytes);
  o.tensor_info += "}";
  return o;
}

Extracted extract_result(const Value& result, bool by_reference, std::string& output_metadata) {
  Extracted out;
  out.by_reference = by_reference;
  output_metadata.clear();
  PyJsonWriter w(output_metadata);
  write_result(w, result, out);
  return out;
}

Extracted extract_mutated(const OpDecl& decl, std::span<const Value> args, bool by_reference) {
  Extracted mutated;
  mutated.by_reference = by_reference;
  extract_mutated_into(decl, args, mutated);
  return mutated;
}

void extract_mutated_into(const OpDecl& decl, std::span<const Value> args, Extracted& mutated) {
  std::string key;
  std::size_t keyed = decl.params.size();  // the parameter `key` names
  detail::for_each_written_tensor(decl, args, [&](std::size_t i, int j, const Tensor& t) {
    if (i != keyed) param_key_into(key, decl.params[keyed = i], i);
    if (j < 0) {
      mutated.add(key, t);
    } else {  // an item of a (K, V) cache pair: key__0, key__1
      mutated.add(key + std::string(schema::kNestedSeparator) + std::to_string(j), t);
    }
  });
}

Outcome outputs_outcome(const RecordParts& rec, std::string output_metadata, const Extracted& out,
                        const Extracted& mutated) {
  Outcome o;
  o.output_metadata = std::move(output_metadata);
  std::string& t = o.tensor_info;
  t = "{";
  key_text(t, schema::kInputTensorKeys);
  t += rec.in_keys;
  t += ", ";
  key_text(t, schema::kOutputTensorKeys);
  t += keys_text(out.tensors);
  t += ", ";
  size_members(t, schema::kInputSizeBytes, schema::kInputSizeMb, rec.input_bytes);
  t += ", ";
  size_members(t, schema::kOutputSizeBytes, schema::kOutputSizeMb, out.bytes);
  t += ", ";
  size_members(t, schema::kTotalSizeBytes, schema::kTotalSizeMb, rec.input_bytes + out.bytes);
  t += ", ";
  key_text(t, schema::kMutatedTensorKeys);
  t += keys_text(mutated.tensors);
  t += "}";
  o.out_details = details_members(out);
  return o;
}

std::string record_line(const RecordParts& p, const Outcome& o, std::string_view status,
                        std::string_view dump_dir, std::string_view extra) {
  std::string s;
  s.reserve(p.head.size() + p.in_details.size() + o.out_details.size() + p.tail.size() +
            o.tensor_info.size() + o.output_metadata.size() + dump_dir.size() + extra.size() + 256);
  s += p.head;
  s += ", ";
  key_text(s, schema::kOutputMetadata);
  s += o.output_metadata;
  s += ", ";
  key_text(s, schema::kTensorInfo);
  s += o.tensor_info;
  s += ", ";
  key_text(s, schema::kTensorDetails);
  s += "{";
  s += p.in_details;
  if (!p.in_details.empty() && !o.out_details.empty()) s += ", ";
  s += o.out_details;
  s += "}, ";
  s += p.tail;
  s += ", ";
  key_text(s, schema::kExecutionStatus);
  append_json_string(s, status);
  s += ", ";
  s += p.flags;
  s += ", ";
  key_text(s, schema::kDumpDir);
  append_json_string(s, dump_dir);
  s += ", ";
  s += p.trailer;
  s += extra;
  s += '}';
  return s;
}

void record_line_pieces(const RecordParts& p, const Outcome& o, std::string_view status,
                        std::vector<std::string_view>& out) {
  // The fixed text between the parts, laid out once (the same keys record_line writes).
  struct Glue {
    std::string output_metadata, tensor_info, tensor_details, status, flags, dump_dir;
  };
  // Never destroyed: the exit trigger joins these pieces from an atexit handler, which runs
  // after the function-local statics constructed later than its registration are gone.
  static const Glue& g = *[] {
    auto* x = new Glue;
    const auto member = [](std::string_view key, std::string_view after) {
      std::string t = ", ";
      key_text(t, key);
      t += after;
      return t;
    };
    x->output_metadata = member(schema::kOutputMetadata, "");
    x->tensor_info = member(schema::kTensorInfo, "");
    x->tensor_details = member(schema::kTensorDetails, "{");
    x->status = member(schema::kExecutionStatus, "\"");
    x->flags = "\", ";
    x->dump_dir = member(schema::kDumpDir, "");
    return x;
  }();
  static constexpr std::string_view kComma = ", ", kClose = "}, ", kEnd = "}";
  out.clear();
  out.push_back(p.head);
  out.push_back(g.output_metadata);
  out.push_back(o.output_metadata);
  out.push_back(g.tensor_info);
  out.push_back(o.tensor_info);
  out.push_back(g.tensor_details);
  out.push_back(p.in_details);
  if (!p.in_details.empty() && !o.out_details.empty()) out.push_back(kComma);
  out.push_back(o.out_details);
  out.push_back(kClose);
  out.push_back(p.tail);
  out.push_back(g.status);
  out.push_back(status);
  out.push_back(g.flags);
  out.push_back(p.flags);
  out.push_back(g.dump_dir);
  out.push_back(std::string_view());  // the dump directory's JSON string
  out.push_back(kComma);
  out.push_back(p.trailer);
  out.push_back(kEnd);
}

void append_member(std::string& out, std::string_view key, std::string_view json_value) {
  out += ", ";
  key_text(out, key);
  out += json_value;
}

std::string mb_text(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", static_cast<double>(bytes) / 1048576.0);
  return b;
}

}  // namespace flashinfer::recorder::internal
