// diff_recordings (include/flashinfer/replay_diff.h): aligns two recordings call by call and
// compares each pair's tensors with replay's comparison.
#include "flashinfer/replay_diff.h"

#include <bit>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/op_decl.h"
#include "recorder/dump_schema.h"

namespace flashinfer::replay {

namespace fs = std::filesystem;
namespace schema = flashinfer::dump_schema;
using Json = nlohmann::ordered_json;

namespace {

// Distance between two sign-magnitude codes `width` bits wide: the codes of a sign-magnitude
// float are ordered by magnitude, so the number of representable values between two of them is
// the difference of magnitudes (same sign) or their sum (opposite signs, +0 and -0 being one).
uint64_t sign_magnitude_distance(uint64_t x, uint64_t y, int width) {
  const uint64_t mag_mask = (uint64_t{1} << (width - 1)) - 1;
  const bool sx = (x >> (width - 1)) & 1u, sy = (y >> (width - 1)) & 1u;
  const uint64_t mx = x & mag_mask, my = y & mag_mask;
  if (sx == sy) return mx > my ? mx - my : my - mx;
  return mx + my;
}

}  // namespace

uint64_t ulp_distance(double a, double b, DType dtype) {
  if (!std::isfinite(a) || !std::isfinite(b)) return 0;
  const float fa = static_cast<float>(a), fb = static_cast<float>(b);
  switch (dtype) {
    case DType::kFloat64:
      return sign_magnitude_distance(std::bit_cast<uint64_t>(a), std::bit_cast<uint64_t>(b), 64);
    case DType::kFloat32:
      return sign_magnitude_distance(std::bit_cast<uint32_t>(fa), std::bit_cast<uint32_t>(fb), 32);
    case DType::kFloat16:
      return sign_magnitude_distance(float_to_half_bits(fa), float_to_half_bits(fb), 16);
    case DType::kBFloat16:
      return sign_magnitude_distance(float_to_bfloat16_bits(fa), float_to_bfloat16_bits(fb), 16);
    case DType::kFloat8E4M3FN:
      return sign_magnitude_distance(float_to_e4m3fn_bits(fa), float_to_e4m3fn_bits(fb), 8);
    case DType::kFloat8E5M2:
      return sign_magnitude_distance(float_to_e5m2_bits(fa), float_to_e5m2_bits(fb), 8);
    case DType::kFloat4E2M1FNx2:
      return sign_magnitude_distance(float_to_e2m1_bits(fa), float_to_e2m1_bits(fb), 4);
    default: {
      const long double d = std::fabs(static_cast<long double>(a) - static_cast<long double>(b));
      return d >= 1.8e19L ? UINT64_MAX : static_cast<uint64_t>(d);
    }
  }
}

bool DiffReport::equal() const {
  for (const CallDiff& c : calls) {
    if (!c.equal()) return false;
  }
  return true;
}

namespace {

// A recorded value with what legitimately differs between two runs taken out: a tensor's
// metadata (its data is compared as a tensor), an object's repr (it holds an address), a
// device. What remains (scalars, dtypes, enums, strings, structure) must be equal.
Json normalize(const Json& j, int depth = 0) {
  if (depth > 64) return Json("<too deep>");
  if (j.is_array()) {
    Json out = Json::array();
    for (const auto& x : j) out.push_back(normalize(x, depth + 1));
    return out;
  }
  if (!j.is_object()) return j;
  const std::string type_key(schema::kType);
  const auto t = j.find(type_key);
  if (t != j.end() && t->is_string()) {
    const std::string type = t->get<std::string>();
    if (type == schema::kTypeTensor) return Json{{type_key, type}};
    const bool plain = type == schema::kTypeDType || type == schema::kTypeEnum ||
                       type == schema::kTypeList || type == schema::kTypeTuple ||
                       type == schema::kTypeDict;
    if (!plain) return Json{{type_key, type}};  // a wrapper's self, a torch.device, ...
  }
  Json out = Json::object();
  for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = normalize(it.value(), depth + 1);
  return out;
}

Json metadata_member(const Json& rec, std::string_view key) {
  const auto it = rec.find(std::string(key));
  return it != rec.end() && it->is_object() ? *it : Json::object();
}

TensorDiff diff_tensor(const std::string& side, const std::string& key, const Tensor* a,
                       const Tensor* b, const DiffOptions& o) {
  TensorDiff d;
  d.side = side;
  if (!a || !b) {
    d.comparison.key = key;
    d.comparison.problem = !a ? "not recorded in A" : "not recorded in B";
    return d;
  }
  d.comparison = compare_tensors(key, *a, *b, o.rtol, o.atol);
  if (!d.comparison.problem.empty()) return d;
  const std::vector<double> x = a->to_double_vector(), y = b->to_double_vector();
  d.identical = true;
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
    const bool same = x[i] == y[i] ? std::signbit(x[i]) == std::signbit(y[i])
                                   : (std::isnan(x[i]) && std::isnan(y[i]));
    if (same) continue;
    d.identical = false;
    d.max_ulp_error = std::max(d.max_ulp_error, ulp_distance(x[i], y[i], a->dtype()));
  }
  return d;
}

// The name a recorded key is matched by: the parameter it binds to when the op is known, so
// that an argument passed positionally on one side (arg_2) and by keyword on the other
// (kwarg_eps, as a Python caller may) still meet. Nested items keep their suffix.
std::string canonical_key(const OpDecl* decl, const std::string& key) {
  if (!decl) return key;
  const auto sep = key.find(schema::kNestedSeparator);
  const std::string base = key.substr(0, sep);
  const std::string rest = sep == std::string::npos ? "" : key.substr(sep);
  if (base.starts_with(schema::kKwargPrefix)) {
    return "param " + base.substr(schema::kKwargPrefix.size()) + rest;
  }
  if (base.starts_with(schema::kArgPrefix)) {
    const std::string idx = base.substr(schema::kArgPrefix.size());
    if (!idx.empty() && idx.size() < 7 && idx.find_first_not_of("0123456789") == idx.npos) {
      const auto i = std::stoul(idx);
      if (i < decl->params.size()) return "param " + decl->params[i].name + rest;
    }
  }
  return key;
}

// Whether `j`, recorded for `key` by one side only, is the parameter's default: then the side
// that did not record it passed the same value by leaving it out.
bool is_default(const OpDecl* decl, const std::string& key, const Json& j) {
  if (!decl) return false;
  const std::string c = canonical_key(decl, key);
  if (!c.starts_with("param ")) return false;
  const int i = decl->param_index(c.substr(6));
  if (i < 0 || !decl->params[static_cast<std::size_t>(i)].default_value) return false;
  const Value& v = *decl->params[static_cast<std::size_t>(i)].default_value;
  switch (v.kind()) {
    case Value::Kind::kNone:
      return j.is_null();
    case Value::Kind::kBool:
      return j.is_boolean() && j.get<bool>() == v.as_bool();
    case Value::Kind::kInt:
      return j.is_number_integer() && j.get<int64_t>() == v.as_int();
    case Value::Kind::kFloat:
      return j.is_number() && j.get<double>() == v.as_float();
    case Value::Kind::kString:
      return j.is_string() && j.get<std::string>() == v.as_string();
    default:
      return false;
  }
}

// Keys of both sides matched by canonical name, A's order first: (key shown, A's, B's).
struct KeyPair {
  std::string shown;
  std::optional<std::string> a, b;
};
std::vector<KeyPair> pair_keys(const OpDecl* decl, const std::vector<std::string>& ka,
                               const std::vector<std::string>& kb) {
  std::vector<KeyPair> out;
  std::map<std::string, std::size_t> at;
  for (const auto& k : ka) {
    if (at.emplace(canonical_key(decl, k), out.size()).second) out.push_back({k, k, {}});
  }
  for (const auto& k : kb) {
    const auto [it, fresh] = at.emplace(canonical_key(decl, k), out.size());
    if (fresh) {
      out.push_back({k, {}, k});
    } else if (!out[it->second].b) {
      out[it->second].b = k;
    }
  }
  return out;
}

// Compares the tensors of one kind (inputs, outputs or mutated) of a pair; returns whether all
// are within tolerance.
bool diff_tensor_set(const OpDecl* decl, const std::string& side, const NamedTensors& a,
                     const NamedTensors& b, const DiffOptions& o, std::vector<TensorDiff>* out) {
  std::vector<std::string> ka, kb;
  std::map<std::string, const Tensor*> ma, mb;
  for (const auto& [k, t] : a) {
    ka.push_back(k);
    ma[k] = &t;
  }
  for (const auto& [k, t] : b) {
    kb.push_back(k);
    mb[k] = &t;
  }
  bool all = true;
  for (const KeyPair& k : pair_keys(decl, ka, kb)) {
    TensorDiff d =
        diff_tensor(side, k.shown, k.a ? ma.at(*k.a) : nullptr, k.b ? mb.at(*k.b) : nullptr, o);
    all = all && d.comparison.match;
    out->push_back(std::move(d));
  }
  return all;
}

// Compares the non-tensor values of a record member (input_metadata / output_metadata).
bool diff_values(const OpDecl* decl, const std::string& side, const Json& a, const Json& b,
                 std::vector<ValueDiff>* out) {
  std::vector<std::string> ka, kb;
  for (auto it = a.begin(); it != a.end(); ++it) ka.push_back(it.key());
  for (auto it = b.begin(); it != b.end(); ++it) kb.push_back(it.key());
  bool all = true;
  for (const KeyPair& k : pair_keys(decl, ka, kb)) {
    if (k.a && k.b && normalize(a.at(*k.a)) == normalize(b.at(*k.b))) continue;
    if (k.a && !k.b && is_default(decl, k.shown, a.at(*k.a))) continue;
    if (k.b && !k.a && is_default(decl, k.shown, b.at(*k.b))) continue;
    all = false;
    out->push_back({side, k.shown, k.a ? a.at(*k.a).dump() : "", k.b ? b.at(*k.b).dump() : ""});
  }
  return all;
}

void diff_pair(CallDiff& c, const DiffOptions& o) {
  RecordedCall a, b;
  try {
    a = load_recorded_call(c.dir_a);
  } catch (const std::exception& e) {
    c.error = std::string("A: ") + e.what();
    return;
  }
  try {
    b = load_recorded_call(c.dir_b);
  } catch (const std::exception& e) {
    c.error = std::string("B: ") + e.what();
    return;
  }
  const Json ra = Json::parse(a.metadata_json), rb = Json::parse(b.metadata_json);
  // Keys are matched by parameter when this library declares the op.
  const OpDecl* decl = OpRegistry::global().find(a.function_name);
  bool in_ok = diff_tensor_set(decl, "input", a.inputs, b.inputs, o, &c.tensors);
  in_ok = diff_values(decl, "input", metadata_member(ra, schema::kInputMetadata),
                      metadata_member(rb, schema::kInputMetadata), &c.values) &&
          in_ok;
  c.inputs_equal = in_ok;
  if (a.completed != b.completed) {
    c.incomplete = true;
    c.outputs_equal = false;
    c.values.push_back({"output", std::string(schema::kExecutionStatus),
                        a.completed ? "completed" : "incomplete",
                        b.completed ? "completed" : "incomplete"});
    return;
  }
  if (!a.completed) {
    c.incomplete = true;  // both died in the call: only the inputs can be compared
    return;
  }
  bool out_ok = diff_tensor_set(decl, "output", a.outputs, b.outputs, o, &c.tensors);
  out_ok = diff_tensor_set(decl, "mutated", a.mutated, b.mutated, o, &c.tensors) && out_ok;
  out_ok = diff_values(decl, "output", metadata_member(ra, schema::kOutputMetadata),
                       metadata_member(rb, schema::kOutputMetadata), &c.values) &&
           out_ok;
  c.outputs_equal = out_ok;
}

struct CallKey {
  std::string dir;
  std::string function_name;
  std::string align_key;  // function, object, occurrence
};

// Gives each call of a recording its alignment key: "<function>#<n>" for the n-th call of a free
// function, "<function>@<class>:<k>#<n>" for the n-th call of a method on the k-th object of
// its class. An object starts at its __init__ (ids are addresses and come back after a delete)
// or, when its construction was not recorded, at its first call.
std::vector<CallKey> keyed_calls(const std::vector<std::string>& dirs) {
  std::vector<CallKey> out;
  std::map<std::string, int> occurrences;
  std::map<std::pair<int64_t, uint64_t>, std::string> objects;  // (pid, self_id) -> "<class>:<k>"
  std::map<std::string, int> objects_per_class;
  for (const auto& d : dirs) {
    CallKey k;
    k.dir = d;
    std::string object;
    try {
      const RecordedCall c = load_recorded_call(d, false);
      k.function_name = c.function_name;
      if (c.self_id) {
        const auto dot = c.function_name.rfind('.');
        const std::string cls =
            dot == std::string::npos ? c.function_name : c.function_name.substr(0, dot);
        const std::pair<int64_t, uint64_t> id{c.process_id, *c.self_id};
        auto it = objects.find(id);
        if (it == objects.end() || c.function_name.ends_with(".__init__")) {
          const std::string name = cls + ":" + std::to_string(objects_per_class[cls]++);
          it = objects.insert_or_assign(id, name).first;
        }
        object = it->second;
      }
    } catch (const std::exception&) {
      k.function_name = "<unreadable record>";
    }
    const std::string base = object.empty() ? k.function_name : k.function_name + "@" + object;
    k.align_key = base + "#" + std::to_string(occurrences[base]++);
    out.push_back(std::move(k));
  }
  return out;
}

std::vector<std::string> calls_of(const std::string& root) {
  if (std::error_code ec; !fs::is_directory(root, ec)) {
    FLASHINFER_FAIL(ErrorCode::kIo, "diff", "", "recording not found: ", root);
  }
  if (fs::exists(fs::path(root) / schema::kMetadataFile)) return {root};
  return list_calls(root);
}

}  // namespace

DiffReport diff_recordings(const std::string& dir_a, const std::string& dir_b,
                           const DiffOptions& o) {
  DiffReport r;
  r.dir_a = dir_a;
  r.dir_b = dir_b;
  const std::vector<CallKey> a = keyed_calls(calls_of(dir_a));
  const std::vector<CallKey> b = keyed_calls(calls_of(dir_b));
  r.calls_a = static_cast<int>(a.size());
  r.calls_b = static_cast<int>(b.size());
  // Two single call directories are one pair whatever their functions.
  const bool single = a.size() == 1 && b.size() == 1 &&
                      fs::exists(fs::path(dir_a) / schema::kMetadataFile) &&
                      fs::exists(fs::path(dir_b) / schema::kMetadataFile);
  std::map<std::string, int> in_b;
  for (std::size_t j = 0; j < b.size(); ++j) in_b[b[j].align_key] = static_cast<int>(j);
  std::vector<int> match(a.size(), -1);
  std::vector<bool> used_b(b.size(), false);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto it = single ? in_b.begin() : in_b.find(a[i].align_key);
    if (it == in_b.end()) continue;
    match[i] = it->second;
    used_b[static_cast<std::size_t>(it->second)] = true;
  }
  std::size_t next_b = 0;  // a B-only call is placed before the first pair that follows it
  auto flush_b_until = [&](std::size_t end) {
    for (; next_b < end; ++next_b) {
      if (used_b[next_b]) continue;
      CallDiff c;
      c.function_name = b[next_b].function_name;
      c.index_b = static_cast<int>(next_b);
      c.dir_b = b[next_b].dir;
      r.calls.push_back(std::move(c));
    }
  };
  for (std::size_t i = 0; i < a.size(); ++i) {
    CallDiff c;
    c.function_name = a[i].function_name;
    c.index_a = static_cast<int>(i);
    c.dir_a = a[i].dir;
    if (match[i] >= 0) {
      const auto j = static_cast<std::size_t>(match[i]);
      flush_b_until(j);
      c.index_b = match[i];
      c.dir_b = b[j].dir;
      diff_pair(c, o);
    }
    r.calls.push_back(std::move(c));
  }
  flush_b_until(b.size());
  for (std::size_t i = 0; i < r.calls.size(); ++i) {
    const CallDiff& c = r.calls[i];
    const int n = static_cast<int>(i);
    if (!c.matched()) {
      if (r.first_unmatched < 0) r.first_unmatched = n;
      continue;
    }
    if (!c.error.empty()) continue;
    if (!c.inputs_equal && r.first_input_difference < 0) r.first_input_difference = n;
    if (c.inputs_equal && !c.outputs_equal && r.first_diverging < 0) r.first_diverging = n;
  }
  return r;
}

}  // namespace flashinfer::replay
