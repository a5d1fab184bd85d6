// replay_from_dump / replay_sequence (include/flashinfer/replay.h).
#include "flashinfer/replay.h"
#include "flashinfer/replay_extensions.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "api/device_props.h"
#include "core/tensor_span.h"
#include "flashinfer/api_call.h"
#include "flashinfer/error.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/ops/backends.h"
#include "flashinfer/ops/upstream_arch.h"
#include "formats/dedup_store.h"
#include "formats/reader_limits.h"
#include "recorder/call_extensions.h"
#include "recorder/dump_schema.h"
#include "replay/collective_replay.h"
#include "replay/result_comparators.h"

namespace flashinfer::replay {

namespace fs = std::filesystem;
namespace schema = flashinfer::dump_schema;
using Json = nlohmann::ordered_json;

const char* status_name(Status s) {
  switch (s) {
    case Status::kPassed:
      return "passed";
    case Status::kMismatch:
      return "mismatch";
    case Status::kError:
      return "error";
    case Status::kIncomplete:
      return "incomplete";
    case Status::kNotRun:
      return "not run";
  }
  return "?";
}

std::pair<double, double> default_tolerance(DType d) {
  switch (d) {
    case DType::kFloat64:
      return {1e-10, 1e-12};
    case DType::kFloat32:
      return {1e-4, 1e-5};
    case DType::kFloat16:
      return {2e-3, 1e-3};
    case DType::kBFloat16:
      return {1.6e-2, 1e-2};
    case DType::kFloat8E4M3FN:
      return {1.25e-1, 3e-2};
    case DType::kFloat8E5M2:
      return {2.5e-1, 6e-2};
    default:
      return {0.0, 0.0};  // integers, bool, packed fp4: exact
  }
}

MetadataRecord parse_metadata(const std::string& text, const std::string& name) {
  MetadataRecord rec;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (line.size() > formats::kMaxMetadataLineBytes) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "", "a line of ", line.size(), " bytes in ",
                      name, " is over the limit of ", formats::kMaxMetadataLineBytes,
                      " (kMaxMetadataLineBytes)");
    }
    if (formats::json_too_deep(line)) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "", "a line in ", name, " nests more than ",
                      formats::kMaxJsonDepth, " deep (kMaxJsonDepth)");
    }
    line = formats::json_without_lone_surrogates(line);
    Json j;
    try {
      j = Json::parse(line);
    } catch (const std::exception&) {
      continue;  // a torn line (the writer died mid-line): the previous complete one stands
    }
    if (!j.is_object()) continue;
    ++rec.lines;
    rec.json = line;
    const auto st = j.find(schema::kExecutionStatus);
    if (st != j.end() && st->is_string() && st->get<std::string>() == schema::kStatusCompleted) {
      rec.completed = true;
    }
    rec.graph_pending =
        st != j.end() && st->is_string() && st->get<std::string>() == schema::kStatusGraphPending;
    rec.write_failed = st != j.end() && st->is_string() &&
                       st->get<std::string>() == schema::kStatusOutputsWriteFailed;
    if (rec.write_failed) {
      const auto w = j.find(schema::kWriteError);
      rec.write_error = w != j.end() && w->is_string() ? w->get<std::string>() : "";
    }
  }
  if (rec.completed) rec.graph_pending = rec.write_failed = false;
  if (rec.lines == 0) {
    FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "", "no complete record in ", name);
  }
  return rec;
}

MetadataRecord read_metadata(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    FLASHINFER_FAIL(ErrorCode::kIo, "replay", "", "metadata.jsonl not found: ", path);
  }
  // A regular file of bounded size: a FIFO or a symlink to /dev/zero is an error, not a hang.
  return parse_metadata(formats::read_regular_file(path, formats::kMaxMetadataFileBytes, "replay"),
                        path);
}

namespace {

// safetensors files hold contiguous data; the record keeps the original strides. Re-lay the
// values out with those strides (a deliberate improvement over upstream, which drops them).
Tensor restore_strides(const Tensor& contiguous, const Json& details) {
  const std::string stride_key(schema::kStride);
  if (!details.is_object() || !details.contains(stride_key) || !details[stride_key].is_array()) {
    return contiguous;
  }
  Shape stride;
  for (const auto& s : details[stride_key]) {
    if (!s.is_number_integer() || s.get<int64_t>() < 0) return contiguous;
    stride.push_back(s.get<int64_t>());
  }
  if (static_cast<int64_t>(stride.size()) != contiguous.dim() || stride == contiguous.strides() ||
      contiguous.numel() == 0) {
    return contiguous;
  }
  // Checked: strides from the record that wrap the span are an error, not a short buffer.
  const int64_t span = detail::covered_span(contiguous.shape(), stride, 0, "replay").second;
  if (span > 4 * contiguous.numel() + 1024) return contiguous;  // implausible: keep it simple
  Tensor buf = Tensor::zeros({span}, contiguous.dtype(), contiguous.device());
  Tensor view = buf.as_strided(contiguous.shape(), stride, 0);
  view.copy_(contiguous);
  return view;
}

struct Loaded {
  std::map<std::string, Tensor> tensors;
};

NamedTensors load_named_unchecked(const fs::path& dir, std::string_view stem) {
  // This library's dedup store (FLASHINFER_DUMP_DEDUP=1): references into <root>/tensors/.
  const fs::path refs = dir / (std::string(stem) + std::string(formats::kDedupRefsSuffix));
  if (fs::exists(refs)) return formats::load_dedup_refs(refs.string());
  const fs::path torch_file = dir / schema::tensor_file(stem, false);
  if (fs::exists(torch_file)) return load_torch(torch_file.string());
  const fs::path safetensors_file = dir / schema::tensor_file(stem, true);
  if (fs::exists(safetensors_file)) return load_safetensors(safetensors_file.string());
  return {};
}

NamedTensors load_named(const fs::path& dir, std::string_view stem) {
  NamedTensors out = load_named_unchecked(dir, stem);
  for (const auto& [k, t] : out) {
    if (!t.defined()) continue;
    const int64_t stored = static_cast<int64_t>(t.storage()->nbytes() / t.element_size());
    formats::check_broadcast_elements(t.numel(), stored, "replay", k);
  }
  return out;
}

// j[key] for a key of the schema (nlohmann's string_view lookups need a string).
// upstream_refusal for `op` on CUDA device `device` ("" when upstream runs it there, or when the
// device cannot be queried).
std::string upstream_refusal_on(const std::string& op, Device device) {
  if (!device.is_cuda() || upstream_arch_rule(op) == nullptr) return "";
  try {
    return upstream_refusal(op, api::compute_capability(device));
  } catch (const std::exception&) {
    return "";
  }
}

std::string str_at(const Json& j, std::string_view key, const char* fallback = "") {
  return j.value(std::string(key), std::string(fallback));
}

Value rebuild(const Json& j, const std::map<std::string, Tensor>& tensors, int depth) {
  if (depth > 64) FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "", "value nested too deeply");
  if (j.is_null()) return Value();
  if (j.is_boolean()) return Value(j.get<bool>());
  if (j.is_number_integer()) return Value(j.get<int64_t>());
  if (j.is_number_unsigned()) return Value(static_cast<int64_t>(j.get<uint64_t>()));
  if (j.is_number_float()) return Value(j.get<double>());
  if (j.is_string()) return Value(j.get<std::string>());
  if (j.is_array()) {
    Value::Items items;
    for (const auto& x : j) items.push_back(rebuild(x, tensors, depth + 1));
    return Value::list(std::move(items));
  }
  if (!j.is_object()) return Value();
  const std::string type = str_at(j, schema::kType);
  if (type == schema::kTypeDType) {
    const std::string v = str_at(j, schema::kValue);
    if (auto d = dtype_from_name(v)) return Value(*d);
    return Value(v);
  }
  if (type == schema::kTypeEnum) {
    const std::string name = str_at(j, schema::kName);
    const auto dot = name.rfind('.');
    EnumValue e;
    e.type = dot == std::string::npos ? "" : name.substr(0, dot);
    e.name = dot == std::string::npos ? name : name.substr(dot + 1);
    const std::string value_key(schema::kValue);
    const Json& v = j.contains(value_key) ? j[value_key] : Json();
    e.value = v.is_string() ? v.get<std::string>() : v.dump();
    return Value(std::move(e));
  }
  if (type == schema::kTypeList || type == schema::kTypeTuple || type == schema::kTypeDict) {
    const std::string items_key(schema::kItems);
    if (j.value(std::string(schema::kTruncated), false)) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "", "a ", type,
                      " argument was truncated when recorded and cannot be rebuilt");
    }
    if (!j.contains(items_key) || !j[items_key].is_array()) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "", "a ", type, " argument has no items");
    }
    if (type == schema::kTypeDict) {
      Value::DictItems items;
      for (const auto& kv : j[items_key]) {
        if (!kv.is_object()) FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "", "bad dict item");
        items.emplace_back(
            rebuild(kv.value(std::string(schema::kKey), Json()), tensors, depth + 1),
            rebuild(kv.value(std::string(schema::kValue), Json()), tensors, depth + 1));
      }
      return Value::dict(std::move(items));
    }
    Value::Items items;
    for (const auto& x : j[items_key]) items.push_back(rebuild(x, tensors, depth + 1));
    return type == schema::kTypeList ? Value::list(std::move(items))
                                     : Value::tuple(std::move(items));
  }
  if (type == schema::kTypeTensor) {
    const std::string key = str_at(j, schema::kTensorKey);
    auto it = tensors.find(key);
    if (it == tensors.end()) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "", "tensor '", key,
                      "' is named in the record but missing from the tensor file");
    }
    return Value(it->second);
  }
  // Any other object (a wrapper's self, a torch.device, ...): a placeholder the object
  // registry resolves for `self`.
  ObjectRef ref;
  ref.type = type;
  ref.repr = str_at(j, schema::kRepr);
  return Value(std::move(ref));
}

bool parse_index(const std::string& key, std::string_view prefix, int64_t* index) {
  if (!key.starts_with(prefix)) return false;
  const std::string rest = key.substr(prefix.size());
  if (rest.empty() || rest.find(schema::kNestedSeparator) != std::string::npos) return false;
  for (char c : rest) {
    if (c < '0' || c > '9') return false;
  }
  if (rest.size() > 6) return false;
  *index = std::stoll(rest);
  return true;
}

TensorComparison compare(const std::string& key, const Tensor& actual, const Tensor& expected,
                         const Options& o) {
  TensorComparison c;
  c.key = key;
  if (actual.shape() != expected.shape()) {
    c.problem = "shape " + shape_to_string(actual.shape()) + " vs recorded " +
                shape_to_string(expected.shape());
    return c;
  }
  if (actual.dtype() != expected.dtype()) {
    c.problem = std::string("dtype ") + std::string(dtype_torch_name(actual.dtype())) +
                " vs recorded " + std::string(dtype_torch_name(expected.dtype()));
    return c;
  }
  const auto [rtol0, atol0] = default_tolerance(expected.dtype());
  c.rtol = o.rtol.value_or(rtol0);
  c.atol = o.atol.value_or(atol0);
  const std::vector<double> a = actual.to_double_vector(), e = expected.to_double_vector();
  c.numel = static_cast<int64_t>(e.size());
  for (std::size_t i = 0; i < e.size(); ++i) {
    bool ok;
    if (std::isnan(e[i]) || std::isnan(a[i])) {
      ok = std::isnan(e[i]) && std::isnan(a[i]);
    } else if (std::isinf(e[i]) || std::isinf(a[i])) {
      ok = a[i] == e[i];
    } else {
      const double d = std::fabs(a[i] - e[i]);
      c.max_abs_error = std::max(c.max_abs_error, d);
      if (e[i] != 0.0) c.max_rel_error = std::max(c.max_rel_error, d / std::fabs(e[i]));
      ok = d <= c.atol + c.rtol * std::fabs(e[i]);
    }
    if (!ok) {
      if (c.first_mismatch < 0) c.first_mismatch = static_cast<int64_t>(i);
      ++c.mismatches;
    }
  }
  c.match = c.mismatches == 0;
  return c;
}

}  // namespace

TensorComparison compare_tensors(const std::string& key, const Tensor& actual,
                                 const Tensor& expected, std::optional<double> rtol,
                                 std::optional<double> atol) {
  Options o;
  o.rtol = rtol;
  o.atol = atol;
  return compare(key, actual, expected, o);
}

namespace {

// One attempt on o.device; `refused` is set when the call itself raised kUnsupported (an
// argument the device's kernels do not implement, e.g. ALiBi inside CUDA attention).
Result replay_once(const std::string& dump_dir, const Options& o, bool* refused) {
  Result r;
  r.dump_dir = dump_dir;
  bool invoking = false;
  try {
    const fs::path dir(dump_dir);
    if (!fs::is_directory(dir)) {
      FLASHINFER_FAIL(ErrorCode::kIo, "replay", "", "Dump directory not found: ", dump_dir);
    }
    const fs::path metadata_file = dir / schema::kMetadataFile;
    if (!fs::exists(metadata_file)) {
      FLASHINFER_FAIL(ErrorCode::kIo, "replay", "", schema::kMetadataFile, " not found in ",
                      dump_dir);
    }
    const MetadataRecord meta = read_metadata(metadata_file.string());
    r.metadata_json = meta.json;
    if (meta.graph_pending) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "",
                      "this call was captured into a CUDA graph and its tensors were never "
                      "written (the recording process did not call "
                      "flashinfer::recorder::flush_graph_dumps() after launching the graph): ",
                      dump_dir);
    }
    r.incomplete = !meta.completed;
    r.write_failed = meta.write_failed;
    if (meta.write_failed) {
      r.note = "the recording process could not write this call's outputs (" + meta.write_error +
               "): re-run, nothing to compare";
    }
    const Json rec = Json::parse(meta.json);
    r.function_name = str_at(rec, schema::kFunctionName);
    r.module = str_at(rec, schema::kModule);
    const bool safetensors = str_at(rec, schema::kTensorFormat, schema::kFormatTorch.data()) ==
                             schema::kFormatSafetensors;
    const std::string details_key(schema::kTensorDetails);
    const Json details = rec.contains(details_key) ? rec[details_key] : Json::object();

    // An op whose backend table has no kernel for the device asked for runs on the CPU
    // reference instead, and the result says so (breadth policy: every op has a CPU reference).
    r.ran_on = o.device;
    const std::vector<std::string> backends = op_backends(r.function_name);
    if (o.device.is_cuda() && !backends.empty() &&
        std::find(backends.begin(), backends.end(), "cuda") == backends.end()) {
      r.ran_on = Device::cpu();
      r.note = "no CUDA kernel for " + r.function_name +
               " in this build: replayed on the CPU reference instead";
      // Where upstream itself does not run the op on this GPU, the note says that instead.
      if (const std::string why = upstream_refusal_on(r.function_name, o.device); !why.empty()) {
        r.note = "upstream does not run " + r.function_name + " on " + o.device.str() + " (" + why +
                 "): replayed on the CPU reference instead";
      }
    }

    // Tensors, moved to the replay device with their layout.
    std::map<std::string, Tensor> tensors;
    for (auto& [k, t] : load_named(dir, schema::kInputsStem)) {
      Tensor x = safetensors && details.contains(k) ? restore_strides(t, details[k]) : t;
      tensors[k] = detail::to_device_keep_layout(x, r.ran_on);
    }
    for (auto& [k, t] : load_named(dir, schema::kOutputsStem)) r.expected.emplace_back(k, t);
    for (auto& [k, t] : load_named(dir, schema::kMutatedStem)) {
      r.expected_mutated.emplace_back(k, t);
    }

    // Arguments: arg_<i> positionally, kwarg_<name> by keyword.
    const std::string im_key(schema::kInputMetadata);
    const Json im = rec.contains(im_key) && rec[im_key].is_object() ? rec[im_key] : Json::object();
    int64_t max_index = -1, idx = 0;
    for (const auto& [k, t] : tensors) {
      if (parse_index(k, schema::kArgPrefix, &idx)) max_index = std::max(max_index, idx);
    }
    for (auto it = im.begin(); it != im.end(); ++it) {
      if (parse_index(it.key(), schema::kArgPrefix, &idx)) max_index = std::max(max_index, idx);
    }
    std::vector<Value> positional;
    for (int64_t i = 0; i <= max_index; ++i) {
      const std::string key = schema::arg_key(static_cast<std::size_t>(i));
      if (auto t = tensors.find(key); t != tensors.end()) {
        positional.push_back(Value(t->second));
      } else if (im.contains(key)) {
        positional.push_back(rebuild(im[key], tensors, 0));
      } else {
        positional.push_back(Value());
      }
    }
    std::vector<std::pair<std::string, Value>> keyword;
    for (const auto& [k, t] : tensors) {
      if (k.starts_with(schema::kKwargPrefix) &&
          k.find(schema::kNestedSeparator) == std::string::npos) {
        keyword.emplace_back(k.substr(schema::kKwargPrefix.size()), Value(t));
      }
    }
    for (auto it = im.begin(); it != im.end(); ++it) {
      const std::string& k = it.key();
      if (!k.starts_with(schema::kKwargPrefix)) continue;
      const std::string name = k.substr(schema::kKwargPrefix.size());
      if (std::any_of(keyword.begin(), keyword.end(),
                      [&](const auto& p) { return p.first == name; })) {
        continue;
      }
      keyword.emplace_back(name, rebuild(it.value(), tensors, 0));
    }
    r.kwargs = keyword;

    const OpDecl* decl = OpRegistry::global().find(r.function_name);
    if (!decl) {
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "replay", "", "function ", r.module, ".",
                      r.function_name, " is not provided by flashinfer-cpp");
    }
    if (!decl->invoke) {
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "replay", "", r.function_name,
                      " is declared without an invoker and cannot be replayed");
    }
    // Wrapper methods: `self` comes from the object registry, keyed like upstream.
    std::pair<int64_t, uint64_t> self_key{-1, 0};
    const std::string self_id_key(schema::kSelfId);
    if (rec.contains(self_id_key) && rec[self_id_key].is_number()) {
      self_key = {rec.value(std::string(schema::kProcessId), int64_t{0}),
                  rec[self_id_key].get<uint64_t>()};
      // A collective's method brings its own workspace (replay/collective_replay.h): upstream
      // records no __init__ of PcieIpcAllReduceWorkspace.
      if (!decl->is_constructor() && !detail::collective_spec(r.function_name)) {
        ObjectRegistry* reg = o.registry;
        auto it = reg ? reg->find(self_key) : ObjectRegistry::iterator();
        if (!reg || it == reg->end()) {
          FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "replay", "",
                          "Object (PID: ", self_key.first, ", ID: ", self_key.second,
                          ") not found in registry: replay the session from its __init__ call");
        }
        if (positional.empty()) positional.push_back(Value());
        positional[0] = it->second;
      }
    }
    r.args = bind_arguments(*decl, std::move(positional), keyword);
    // Arguments this library's recorder captured more of (extension tensors, e.g. the weights
    // behind a pointer table): rebuilt here; without those tensors nothing changes.
    apply_call_extensions(r.function_name, tensors, r.args);
    if (!o.run) {
      r.status = Status::kNotRun;
      return r;
    }
    const detail::CollectiveSpec* coll = detail::collective_spec(r.function_name);
    if (coll && coll->runs_alone && coll->runs_alone(r.function_name, r.args)) coll = nullptr;
    if (coll) {
      // A collective: every rank's recorded call runs with it (replay/collective_replay.h).
      std::string coll_note;
      invoking = true;
      r.result = detail::replay_collective(*coll, *decl, dump_dir, r.args, r.ran_on, &coll_note);
      invoking = false;
      r.note += (r.note.empty() ? "" : "; ") + coll_note;
    } else {
      ScopedUnobserved quiet;  // replaying must not log or record the calls again
      invoking = true;
      r.result = decl->invoke(CallArgs(*decl, r.args));
      invoking = false;
    }
    if (decl->is_constructor() && o.registry && r.result.kind() == Value::Kind::kObject) {
      (*o.registry)[self_key] = r.result;
    }
    std::string custom_note;
    if (o.compare_outputs) {
      std::map<std::string, Tensor> actual;
      if (r.result.is_tensor()) {
        actual[std::string(schema::kResult)] = r.result.as_tensor();
      } else if (r.result.is_sequence()) {
        // A tuple's items are result_<i>; a list's are result__<i> (the recorder's nested keys).
        const std::string prefix =
            r.result.kind() == Value::Kind::kTuple
                ? std::string(schema::kResultPrefix)
                : std::string(schema::kResult) + std::string(schema::kNestedSeparator);
        // Nested containers (BatchPOD's ((out_p, out_d), (lse_p, lse_d))): key__<j> below.
        std::function<void(const std::string&, const Value&)> add = [&](const std::string& key,
                                                                        const Value& v) {
          if (v.is_tensor()) {
            actual[key] = v.as_tensor();
          } else if (v.is_sequence()) {
            for (std::size_t j = 0; j < v.items().size(); ++j) {
              add(key + std::string(schema::kNestedSeparator) + std::to_string(j), v.items()[j]);
            }
          }
        };
        const auto& items = r.result.items();
        for (std::size_t i = 0; i < items.size(); ++i) add(prefix + std::to_string(i), items[i]);
      }
      // An op whose outputs need more than a key-by-key comparison (rows in an order the GPU
      // chooses) compares them itself and says what it skipped.
      detail::ResultCheck custom;
      const detail::CompareFn compare_fn = [&](const std::string& k, const Tensor& a,
                                               const Tensor& e) { return compare(k, a, e, o); };
      const detail::ResultComparatorWithArgs* cmp = detail::result_comparator(r.function_name);
      if (cmp && (*cmp)(r.args, actual, r.expected, compare_fn, custom)) {
        r.comparisons.insert(r.comparisons.end(), custom.comparisons.begin(),
                             custom.comparisons.end());
        r.skipped_outputs.insert(r.skipped_outputs.end(), custom.skipped.begin(),
                                 custom.skipped.end());
        custom_note = custom.note;
      }
      for (const auto& [k, e] : r.expected) {
        if (!custom_note.empty()) break;
        // Outputs upstream returns without writing are not compared (the note says which).
        if (std::find(decl->unwritten_results.begin(), decl->unwritten_results.end(), k) !=
            decl->unwritten_results.end()) {
          r.skipped_outputs.push_back(k);
          continue;
        }
        auto it = actual.find(k);
        if (it == actual.end()) {
          TensorComparison c;
          c.key = k;
          c.problem = "the replayed call returned no tensor '" + k + "'";
          r.comparisons.push_back(c);
        } else {
          r.comparisons.push_back(compare(k, it->second, e, o));
        }
      }
      for (const auto& [k, e] : r.expected_mutated) {
        // "arg_<i>", "kwarg_<name>", optionally "__<j>" for an item of a (K, V) pair.
        std::string base = k;
        int64_t item = -1;
        if (const auto sep = k.find(schema::kNestedSeparator); sep != std::string::npos) {
          base = k.substr(0, sep);
          const std::string rest = k.substr(sep + schema::kNestedSeparator.size());
          if (!rest.empty() && rest.size() < 6 &&
              rest.find_first_not_of("0123456789") == std::string::npos) {
            item = std::stoll(rest);
          }
        }
        int64_t i = -1;
        if (!parse_index(base, schema::kArgPrefix, &i) && base.starts_with(schema::kKwargPrefix)) {
          i = decl->param_index(base.substr(schema::kKwargPrefix.size()));
        }
        TensorComparison c;
        c.key = "mutated " + k;
        const Value* v = (i >= 0 && i < static_cast<int64_t>(r.args.size())) ? &r.args[i] : nullptr;
        if (v && item >= 0) {
          v = v->is_sequence() && item < static_cast<int64_t>(v->items().size()) ? &v->items()[item]
                                                                                 : nullptr;
        }
        if (!v || !v->is_tensor()) {
          c.problem = "argument '" + k + "' is not a tensor in the replayed call";
          r.comparisons.push_back(c);
          continue;
        }
        TensorComparison m = compare("mutated " + k, v->as_tensor(), e, o);
        if (!m.match && m.problem.empty() && custom.recheck_mutated) {
          custom.recheck_mutated(decl->params[static_cast<std::size_t>(i)].name, v->as_tensor(), e,
                                 m);
        }
        r.comparisons.push_back(m);
      }
    }
    if (!custom_note.empty()) {
      r.note += (r.note.empty() ? "" : "; ") + custom_note;
    } else if (!r.skipped_outputs.empty()) {
      std::string keys;
      for (const auto& k : r.skipped_outputs) keys += (keys.empty() ? "" : ", ") + k;
      r.note += (r.note.empty() ? "" : "; ") + std::string("not compared: ") + keys + " (" +
                decl->unwritten_reason + ")";
    }
    const bool all_match = std::all_of(r.comparisons.begin(), r.comparisons.end(),
                                       [](const TensorComparison& c) { return c.match; });
    r.status = r.incomplete ? Status::kIncomplete : all_match ? Status::kPassed : Status::kMismatch;
  } catch (const Error& e) {
    r.status = Status::kError;
    r.error = e.what();
    *refused = invoking && e.code() == ErrorCode::kUnsupported;
  } catch (const std::exception& e) {
    r.status = Status::kError;
    r.error = e.what();
  }
  return r;
}

// replay_from_dump; `cuda_refused` is set when the CUDA kernels refused the call (whether or
// not the CPU retry then succeeded).
Result replay_with_fallback(const std::string& dump_dir, const Options& o, bool* cuda_refused) {
  bool refused = false;
  Result r = replay_once(dump_dir, o, &refused);
  *cuda_refused = refused && o.device.is_cuda() && r.ran_on.is_cuda();
  if (!*cuda_refused) return r;
  // The op has a CUDA kernel, but not for this call's arguments: the CPU reference takes every
  // argument (breadth policy), so the call runs there and the result says why. A wrapper
  // method whose object was built on the GPU stays an error if the CPU refuses it too.
  Options cpu = o;
  cpu.device = Device::cpu();
  bool again = false;
  Result c = replay_once(dump_dir, cpu, &again);
  if (c.status == Status::kError) {
    r.note +=
        (r.note.empty() ? "" : "; ") + std::string("the CPU reference failed too: ") + c.error;
    return r;
  }
  c.note = "the CUDA kernels refused this call (" + r.error +
           "): replayed on the CPU reference instead" + (c.note.empty() ? "" : "; " + c.note);
  return c;
}

}  // namespace

Result replay_from_dump(const std::string& dump_dir, const Options& o) {
  bool refused = false;
  return replay_with_fallback(dump_dir, o, &refused);
}

std::vector<Result> replay_sequence(const std::string& root, Device device,
                                    std::optional<double> rtol, std::optional<double> atol) {
  SequenceOptions so;
  so.device = device;
  so.rtol = rtol;
  so.atol = atol;
  return replay_sequence(root, so);
}

std::vector<std::string> list_calls(const std::string& root) {
  if (std::error_code ec; !fs::is_directory(root, ec)) {
    FLASHINFER_FAIL(ErrorCode::kIo, "replay", "", "Dump directory not found: ", root);
  }
  // Symlinked call directories pointing out of the root are not followed.
  std::vector<fs::path> dirs = formats::call_directories(root, schema::kMetadataFile);
  // Name order is time order at millisecond resolution; within one millisecond of one process
  // our records' process_sequence gives the true order (upstream's dumps fall back to names).
  struct Key {
    std::string prefix;  // "<timestamp>_pid<PID>_"
    int64_t seq;
    std::string name;
  };
  std::map<std::string, Key> keys;
  for (const auto& d : dirs) {
    const std::string name = d.filename().string();
    Key k{name, -1, name};
    const auto pid = name.find(schema::kDirPidMarker);
    const auto end = pid == std::string::npos ? std::string::npos
                                              : name.find('_', pid + schema::kDirPidMarker.size());
    if (end != std::string::npos) k.prefix = name.substr(0, end + 1);
    try {
      const Json j = Json::parse(read_metadata((d / schema::kMetadataFile).string()).json);
      const std::string seq_key(schema::kProcessSequence);
      if (j.contains(seq_key) && j[seq_key].is_number_integer()) {
        k.seq = j[seq_key].get<int64_t>();
      }
    } catch (const std::exception&) {
      // An unreadable record sorts by name; replay reports the problem for that call.
    }
    keys[d.string()] = k;
  }
  std::sort(dirs.begin(), dirs.end(), [&](const fs::path& a, const fs::path& b) {
    const Key& x = keys[a.string()];
    const Key& y = keys[b.string()];
    if (x.prefix != y.prefix) return x.name < y.name;
    if (x.seq >= 0 && y.seq >= 0 && x.seq != y.seq) return x.seq < y.seq;
    return x.name < y.name;
  });
  std::vector<std::string> out;
  out.reserve(dirs.size());
  for (const auto& d : dirs) out.push_back(d.string());
  return out;
}

RecordedCall load_recorded_call(const std::string& dump_dir, bool with_tensors) {
  const fs::path dir(dump_dir);
  if (std::error_code ec; !fs::is_directory(dir, ec)) {
    FLASHINFER_FAIL(ErrorCode::kIo, "replay", "", "Dump directory not found: ", dump_dir);
  }
  const MetadataRecord meta = read_metadata((dir / schema::kMetadataFile).string());
  RecordedCall c;
  c.dump_dir = dump_dir;
  c.metadata_json = meta.json;
  c.completed = meta.completed;
  const Json rec = Json::parse(meta.json);
  c.function_name = str_at(rec, schema::kFunctionName);
  c.module = str_at(rec, schema::kModule);
  const std::string pid_key(schema::kProcessId), self_key(schema::kSelfId);
  if (rec.contains(pid_key) && rec[pid_key].is_number_integer()) {
    c.process_id = rec[pid_key].get<int64_t>();
  }
  if (rec.contains(self_key) && rec[self_key].is_number_unsigned()) {
    c.self_id = rec[self_key].get<uint64_t>();
  } else if (rec.contains(self_key) && rec[self_key].is_number_integer()) {
    c.self_id = static_cast<uint64_t>(rec[self_key].get<int64_t>());
  }
  if (!with_tensors) return c;
  const bool safetensors =
      str_at(rec, schema::kTensorFormat, schema::kFormatTorch.data()) == schema::kFormatSafetensors;
  const std::string details_key(schema::kTensorDetails);
  const Json details = rec.contains(details_key) ? rec[details_key] : Json::object();
  auto load = [&](std::string_view stem) {
    NamedTensors out = load_named(dir, stem);
    if (safetensors) {
      for (auto& [k, t] : out) {
        if (details.is_object() && details.contains(k)) t = restore_strides(t, details[k]);
      }
    }
    return out;
  };
  c.inputs = load(schema::kInputsStem);
  c.outputs = load(schema::kOutputsStem);
  c.mutated = load(schema::kMutatedStem);
  return c;
}

std::vector<Result> replay_sequence(const std::string& root, const SequenceOptions& so) {
  const std::vector<std::string> dirs = list_calls(root);
  ObjectRegistry registry;
  Options o;
  o.device = so.device;
  o.registry = &registry;
  o.rtol = so.rtol;
  o.atol = so.atol;
  // A wrapper built on the GPU cannot run a call its CUDA kernels refuse (a per-argument limit,
  // e.g. NVFP4 kv_cache_sf in a prefill wrapper): the object is rebuilt on the CPU from its
  // recorded calls so far (its __init__, plans and earlier runs, outputs not compared) and it
  // stays there for the rest of the sequence. Every such result says so in its note.
  using Key = std::pair<int64_t, uint64_t>;
  std::map<Key, std::vector<std::string>> history;  // each object's calls so far
  std::set<Key> moved;
  ObjectRegistry cpu_registry;
  Options cpu = o;
  cpu.device = Device::cpu();
  cpu.registry = &cpu_registry;
  std::vector<Result> out;
  for (const auto& d : dirs) {
    std::optional<Key> key;
    try {
      const RecordedCall c = load_recorded_call(d, false);
      if (c.self_id) key = Key{c.process_id, *c.self_id};
    } catch (const std::exception&) {
      // An unreadable record: replay_from_dump reports it.
    }
    Result r;
    if (key && moved.count(*key)) {
      r = replay_from_dump(d, cpu);
      r.note =
          "replayed on the CPU reference: its object moved there when the CUDA kernels "
          "refused an earlier call" +
          (r.note.empty() ? "" : "; " + r.note);
    } else {
      bool refused = false;
      r = replay_with_fallback(d, o, &refused);
      if (refused && r.status == Status::kError && key && history.count(*key)) {
        Options rebuild = cpu;
        rebuild.compare_outputs = false;
        std::string failed;
        for (const std::string& h : history[*key]) {
          const Result hr = replay_from_dump(h, rebuild);
          if (hr.status == Status::kError) {
            failed = hr.function_name + ": " + hr.error;
            break;
          }
        }
        if (failed.empty()) {
          Result c = replay_from_dump(d, cpu);
          if (c.status != Status::kError) {
            c.note = "the CUDA kernels refused this call (" + r.error +
                     "): its object was rebuilt on the CPU from its recorded calls and replayed "
                     "there" +
                     (c.note.empty() ? "" : "; " + c.note);
            r = std::move(c);
            moved.insert(*key);
          }
        } else {
          r.note += (r.note.empty() ? "" : "; ") +
                    std::string("rebuilding its object on the CPU failed at ") + failed;
        }
      }
    }
    if (key) history[*key].push_back(d);
    out.push_back(std::move(r));
    if (so.on_progress) so.on_progress(out.back());
  }
  return out;
}

void apply_call_extensions(const std::string& function_name,
                           const std::map<std::string, Tensor>& tensors, std::vector<Value>& args) {
  if (const detail::ReplayExtensionFn* extend = detail::replay_extension(function_name)) {
    (*extend)(tensors, args);
  }
}

}  // namespace flashinfer::replay
