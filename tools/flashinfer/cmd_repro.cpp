// `flashinfer repro --dir CALL -o OUT`: writes a standalone C++ program (main.cpp and a
// CMakeLists.txt using find_package(flashinfer_cpp)) that loads one recorded call's tensors,
// runs the call and compares its outputs with the recording: something to hand to a kernel
// developer. The code is generated from the op's declaration in the registry, one named local
// per argument; a wrapper method's program also replays the object's __init__ and the calls made
// on it before, from the same recording.
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "commands.h"
#include "flashinfer/error.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/replay.h"
#include "flashinfer/tensor_io.h"
#include "recorder/dump_schema.h"

namespace flashinfer::cli {

namespace fs = std::filesystem;
namespace schema = flashinfer::dump_schema;

namespace {

using Json = nlohmann::ordered_json;

// ---- C++ spelling helpers

// A C++ string literal holding exactly `s`: printable ASCII as is, everything else as a
// three-digit octal escape (which cannot run into the next character).
std::string cpp_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c >= 0x20 && c < 0x7F && c != '?') {  // '?': no trigraph surprises
      out += ch;
    } else {
      char b[8];
      std::snprintf(b, sizeof(b), "\\%03o", c);
      out += b;
    }
  }
  return out + "\"";
}

// Text safe inside a // comment: one line, printable ASCII.
std::string comment_text(std::string_view s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    out += (c >= 0x20 && c < 0x7F) ? ch : '?';
  }
  return out;
}

bool is_cpp_keyword(const std::string& s) {
  static const std::set<std::string> k = {
      "alignas",   "alignof",      "and",       "asm",       "auto",      "bool",
      "break",     "case",         "catch",     "char",      "class",     "const",
      "constexpr", "continue",     "default",   "delete",    "do",        "double",
      "else",      "enum",         "explicit",  "export",    "extern",    "false",
      "float",     "for",          "friend",    "goto",      "if",        "inline",
      "int",       "long",         "mutable",   "namespace", "new",       "noexcept",
      "not",       "nullptr",      "operator",  "or",        "private",   "protected",
      "public",    "register",     "return",    "short",     "signed",    "sizeof",
      "static",    "struct",       "switch",    "template",  "this",      "throw",
      "true",      "try",          "typedef",   "typeid",    "typename",  "union",
      "unsigned",  "using",        "virtual",   "void",      "volatile",  "while",
      "xor",       "concept",      "requires",  "co_await",  "co_return", "co_yield",
      "char8_t",   "consteval",    "constinit", "decltype",  "bitand",    "bitor",
      "compl",     "not_eq",       "or_eq",     "xor_eq",    "and_eq",    "static_assert",
      "wchar_t",   "thread_local", "main",      "fi",        "self",      "std"};
  return k.contains(s);
}

// A C++ identifier for a recorded name: other characters become '_'; names that are keywords,
// start with a digit or use the generated code's own prefixes ("repro_", "step_") get a '_'.
std::string identifier(std::string_view name) {
  std::string s;
  for (const char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_';
    s += ok ? ch : '_';
  }
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) s = "v_" + s;
  if (is_cpp_keyword(s) || s.starts_with("repro_") || s.starts_with("step_") || s[0] == '_') {
    s += '_';
  }
  return s;
}

std::string dtype_enumerator(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "fi::DType::kFloat32";
    case DType::kFloat16:
      return "fi::DType::kFloat16";
    case DType::kBFloat16:
      return "fi::DType::kBFloat16";
    case DType::kFloat64:
      return "fi::DType::kFloat64";
    case DType::kFloat8E4M3FN:
      return "fi::DType::kFloat8E4M3FN";
    case DType::kFloat8E5M2:
      return "fi::DType::kFloat8E5M2";
    case DType::kInt8:
      return "fi::DType::kInt8";
    case DType::kUInt8:
      return "fi::DType::kUInt8";
    case DType::kInt16:
      return "fi::DType::kInt16";
    case DType::kInt32:
      return "fi::DType::kInt32";
    case DType::kInt64:
      return "fi::DType::kInt64";
    case DType::kBool:
      return "fi::DType::kBool";
    case DType::kFloat4E2M1FNx2:
      return "fi::DType::kFloat4E2M1FNx2";
  }
  return "fi::DType::kFloat32";
}

std::string int_literal(const Json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return "static_cast<int64_t>(UINT64_C(" + std::to_string(u) + "))";  // as replay reads it
    }
    return std::to_string(u);
  }
  const int64_t v = j.get<int64_t>();
  if (v == std::numeric_limits<int64_t>::min()) return "std::numeric_limits<int64_t>::min()";
  return std::to_string(v);
}

std::string double_literal(double v) {
  char b[40];
  std::snprintf(b, sizeof(b), "%.17g", v);
  std::string s = b;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// ---- one recorded call turned into C++

struct Local {
  std::string type;     // C++ type of the local
  std::string init;     // its initializer
  std::string comment;  // what was recorded
};

class StepWriter {
 public:
  StepWriter(const replay::RecordedCall& call, const OpDecl& decl, int step, int steps,
             std::string data_dir)
      : call_(call), decl_(decl), step_(step), steps_(steps), data_(std::move(data_dir)) {
    rec_ = Json::parse(call.metadata_json);
    const std::string im_key(schema::kInputMetadata);
    im_ = rec_.contains(im_key) && rec_[im_key].is_object() ? rec_[im_key] : Json::object();
    const std::string details_key(schema::kTensorDetails);
    details_ = rec_.contains(details_key) && rec_[details_key].is_object() ? rec_[details_key]
                                                                           : Json::object();
  }

  std::string write() {
    std::ostringstream o;
    const std::string fn = comment_text(call_.function_name);
    o << "\n    // ---- step " << step_ << " of " << steps_ << ": " << fn << " ("
      << comment_text(decl_.module) << ")\n";
    o << "    // recorded in " << comment_text(fs::path(call_.dump_dir).filename().string())
      << "\n";
    o << "    // signature: " << comment_text(decl_.signature()) << "\n";
    o << "    {\n";
    o << "      const auto step_inputs = repro_load(" << cpp_string(data_ + "/inputs.pt") << ");\n";
    tensor_locals(o);
    std::vector<std::string> positional;
    std::vector<std::pair<std::string, std::string>> keyword;
    arguments(o, &positional, &keyword);
    o << "      std::printf(\"step " << step_ << ": %s\\n\", " << cpp_string(call_.function_name)
      << ");\n";
    o << "      const fi::Value step_result = repro_run(" << cpp_string(call_.function_name) << ",";
    // One argument a line when they do not fit on one.
    std::vector<std::string> kw;
    for (const auto& [name, expr] : keyword)
      kw.push_back("{" + cpp_string(name) + ", " + expr + "}");
    auto list = [&o](const std::vector<std::string>& items) {
      std::size_t len = 0;
      for (const auto& x : items) len += x.size() + 2;
      const char* sep = len > 90 ? ",\n           " : ", ";
      o << "\n          {";
      for (std::size_t i = 0; i < items.size(); ++i) o << (i ? sep : "") << items[i];
      o << "}";
    };
    list(positional);
    o << ",";
    list(kw);
    o << ",\n          step_inputs);\n";
    if (decl_.is_constructor()) {
      o << "      repro_self = step_result;  // the object the later steps call\n";
    }
    outputs(o);
    o << "    }\n";
    return o.str();
  }

 private:
  // The parameter name of a recorded key's base ("arg_2" -> the op's third parameter).
  std::string base_name(const std::string& base) const {
    if (base.starts_with(schema::kArgPrefix)) {
      const std::string idx = base.substr(schema::kArgPrefix.size());
      if (!idx.empty() && idx.size() < 7 && idx.find_first_not_of("0123456789") == idx.npos) {
        const auto i = std::stoul(idx);
        if (i < decl_.params.size()) return decl_.params[i].name;
      }
      return base;
    }
    if (base.starts_with(schema::kKwargPrefix)) return base.substr(schema::kKwargPrefix.size());
    return base;
  }

  std::string unique(std::string name) {
    std::string n = name;
    for (int k = 2; used_.contains(n); ++k) n = name + "_" + std::to_string(k);
    used_.insert(n);
    return n;
  }

  // One fi::Tensor local per recorded input tensor, named after its parameter.
  void tensor_locals(std::ostringstream& o) {
    for (const auto& [key, t] : call_.inputs) {
      std::string base = key, rest;
      if (const auto sep = key.find(schema::kNestedSeparator); sep != std::string::npos) {
        base = key.substr(0, sep);
        rest = key.substr(sep + schema::kNestedSeparator.size());
      }
      const std::string name =
          unique(identifier(base_name(base) + (rest.empty() ? "" : "_" + rest)));
      tensor_local_[key] = name;
      o << "      fi::Tensor " << name << " = repro_tensor(step_inputs, " << cpp_string(key)
        << ");  // " << comment_text(std::string(dtype_torch_name(t.dtype()))) << " "
        << comment_text(shape_to_string(t.shape())) << "\n";
    }
  }

  // A recorded non-tensor value as a C++ expression of type fi::Value (replay's rebuild, spelled
  // out).
  std::string value_expr(const Json& j, int depth) {
    if (depth > 64) FLASHINFER_FAIL(ErrorCode::kFormat, "repro", "", "value nested too deeply");
    if (j.is_null()) return "fi::Value()";
    if (j.is_boolean()) return j.get<bool>() ? "fi::Value(true)" : "fi::Value(false)";
    if (j.is_number_integer()) return "fi::Value(int64_t{" + int_literal(j) + "})";
    if (j.is_number_float()) return "fi::Value(" + double_literal(j.get<double>()) + ")";
    if (j.is_string()) return "fi::Value(std::string(" + cpp_string(j.get<std::string>()) + "))";
    if (j.is_array()) {
      std::string s = "fi::Value::list({";
      bool first = true;
      for (const auto& x : j) {
        s += (first ? "" : ", ") + value_expr(x, depth + 1);
        first = false;
      }
      return s + "})";
    }
    if (!j.is_object()) return "fi::Value()";
    const std::string type = j.value(std::string(schema::kType), std::string());
    if (type == schema::kTypeDType) {
      const std::string v = j.value(std::string(schema::kValue), std::string());
      if (auto d = dtype_from_name(v)) return "fi::Value(" + dtype_enumerator(*d) + ")";
      return "fi::Value(std::string(" + cpp_string(v) + "))";
    }
    if (type == schema::kTypeEnum) {
      const std::string name = j.value(std::string(schema::kName), std::string());
      const auto dot = name.rfind('.');
      const std::string value_key(schema::kValue);
      const Json& v = j.contains(value_key) ? j[value_key] : Json();
      return "fi::Value(fi::EnumValue{" +
             cpp_string(dot == std::string::npos ? "" : name.substr(0, dot)) + ", " +
             cpp_string(dot == std::string::npos ? name : name.substr(dot + 1)) + ", " +
             cpp_string(v.is_string() ? v.get<std::string>() : v.dump()) + "})";
    }
    if (type == schema::kTypeList || type == schema::kTypeTuple || type == schema::kTypeDict) {
      const std::string items_key(schema::kItems);
      if (j.value(std::string(schema::kTruncated), false) || !j.contains(items_key) ||
          !j[items_key].is_array()) {
        FLASHINFER_FAIL(ErrorCode::kFormat, "repro", "", "a ", type,
                        " argument was truncated when recorded (or has no items) and cannot be "
                        "rebuilt");
      }
      std::string s = type == schema::kTypeDict   ? "fi::Value::dict({"
                      : type == schema::kTypeList ? "fi::Value::list({"
                                                  : "fi::Value::tuple({";
      bool first = true;
      for (const auto& x : j[items_key]) {
        s += first ? "" : ", ";
        first = false;
        if (type == schema::kTypeDict) {
          const Json k = x.is_object() ? x.value(std::string(schema::kKey), Json()) : Json();
          const Json v = x.is_object() ? x.value(std::string(schema::kValue), Json()) : Json();
          s += "{" + value_expr(k, depth + 1) + ", " + value_expr(v, depth + 1) + "}";
        } else {
          s += value_expr(x, depth + 1);
        }
      }
      return s + "})";
    }
    if (type == schema::kTypeTensor) {
      const std::string key = j.value(std::string(schema::kTensorKey), std::string());
      const auto it = tensor_local_.find(key);
      if (it == tensor_local_.end()) {
        FLASHINFER_FAIL(ErrorCode::kFormat, "repro", "", "tensor '", key,
                        "' is named in the record but missing from the tensor file");
      }
      return "fi::Value(" + it->second + ")";
    }
    // Another object (a torch.device, a foreign object): the placeholder replay also passes.
    return "repro_object(" + cpp_string(type) + ", " +
           cpp_string(j.value(std::string(schema::kRepr), std::string())) + ")";
  }

  // A typed local for a top-level value where the type is plain, a fi::Value otherwise.
  Local local_for(const Json& j) {
    if (j.is_boolean()) return {"bool", j.get<bool>() ? "true" : "false", ""};
    if (j.is_number_integer()) return {"int64_t", int_literal(j), ""};
    if (j.is_number_float()) return {"double", double_literal(j.get<double>()), ""};
    if (j.is_string()) return {"std::string", cpp_string(j.get<std::string>()), ""};
    if (j.is_null()) return {"fi::Value", "fi::Value()", "None"};
    if (j.is_object()) {
      const std::string type = j.value(std::string(schema::kType), std::string());
      if (type == schema::kTypeDType) {
        const std::string v = j.value(std::string(schema::kValue), std::string());
        if (auto d = dtype_from_name(v)) return {"fi::DType", dtype_enumerator(*d), v};
      }
    }
    return {"fi::Value", value_expr(j, 0), ""};
  }

  // The arguments as replay rebuilds them: arg_<i> positionally (None where nothing was
  // recorded), kwarg_<name> by keyword; defaults are filled by bind_arguments at run time.
  void arguments(std::ostringstream& o, std::vector<std::string>* positional,
                 std::vector<std::pair<std::string, std::string>>* keyword) {
    auto index_of = [](const std::string& k, int64_t* i) {
      if (!k.starts_with(schema::kArgPrefix)) return false;
      const std::string rest = k.substr(schema::kArgPrefix.size());
      if (rest.empty() || rest.size() > 6 || rest.find_first_not_of("0123456789") != rest.npos) {
        return false;
      }
      *i = std::stoll(rest);
      return true;
    };
    int64_t max_index = -1, idx = 0;
    for (const auto& [k, t] : call_.inputs) {
      if (index_of(k, &idx)) max_index = std::max(max_index, idx);
    }
    for (auto it = im_.begin(); it != im_.end(); ++it) {
      if (index_of(it.key(), &idx)) max_index = std::max(max_index, idx);
    }
    const bool method = decl_.is_method();
    for (int64_t i = 0; i <= max_index; ++i) {
      const std::string key = schema::arg_key(static_cast<std::size_t>(i));
      if (method && i == 0 && !decl_.is_constructor()) {
        positional->push_back("repro_self");  // the object the __init__ step made
        continue;
      }
      if (auto t = tensor_local_.find(key); t != tensor_local_.end()) {
        positional->push_back("fi::Value(" + t->second + ")");
      } else if (im_.contains(key)) {
        positional->push_back(emit_local(o, base_name(key), im_[key]));
      } else {
        positional->push_back("fi::Value()");
      }
    }
    std::set<std::string> seen;
    for (const auto& [k, t] : call_.inputs) {
      if (k.starts_with(schema::kKwargPrefix) && k.find(schema::kNestedSeparator) == k.npos) {
        const std::string name = k.substr(schema::kKwargPrefix.size());
        seen.insert(name);
        keyword->emplace_back(name, "fi::Value(" + tensor_local_.at(k) + ")");
      }
    }
    for (auto it = im_.begin(); it != im_.end(); ++it) {
      const std::string& k = it.key();
      if (!k.starts_with(schema::kKwargPrefix)) continue;
      const std::string name = k.substr(schema::kKwargPrefix.size());
      if (!seen.insert(name).second) continue;
      keyword->emplace_back(name, emit_local(o, name, it.value()));
    }
  }

  // Declares a local for one recorded value; returns the fi::Value expression passing it.
  std::string emit_local(std::ostringstream& o, const std::string& param, const Json& j) {
    const Local l = local_for(j);
    const std::string name = unique(identifier(param));
    o << "      const " << l.type << " " << name << " = " << l.init << ";";
    if (!l.comment.empty()) o << "  // " << comment_text(l.comment);
    o << "\n";
    return l.type == "fi::Value" ? name : "fi::Value(" + name + ")";
  }

  // Compares what the call returned and what it wrote with the recorded outputs.
  void outputs(std::ostringstream& o) {
    if (!call_.completed) {
      o << "      // The recorded process died inside this call: no outputs were recorded.\n";
      o << "      std::printf(\"  the recorded call never completed; it completed here\\n\");\n";
      o << "      repro_ok = false;\n";
      return;
    }
    if (!call_.outputs.empty()) {
      o << "      const auto step_expected = repro_load(" << cpp_string(data_ + "/outputs.pt")
        << ");\n";
      o << "      const auto step_actual = repro_returned(step_result);\n";
      for (const auto& [key, t] : call_.outputs) {
        o << "      repro_ok = repro_check(" << cpp_string(key)
          << ", step_actual, step_expected) && "
          << "repro_ok;\n";
      }
    }
    if (!call_.mutated.empty()) {
      o << "      const auto step_expected_mutated = repro_load("
        << cpp_string(data_ + "/mutated.pt") << ");\n";
      for (const auto& [key, t] : call_.mutated) {
        const auto it = tensor_local_.find(key);
        if (it == tensor_local_.end()) {
          o << "      std::printf(\"  mutated " << comment_text(key)
            << ": not a tensor argument of the call\\n\");\n    repro_ok = false;\n";
          continue;
        }
        // The argument's tensor now holds what the call wrote into it.
        const std::string k = cpp_string("mutated " + key);
        o << "      repro_ok = repro_check(" << k << ", {{" << k << ", " << it->second
          << "}},\n                             {{" << k << ", step_expected_mutated.at("
          << cpp_string(key) << ")}}) &&\n                 repro_ok;\n";
      }
    }
    if (call_.outputs.empty() && call_.mutated.empty() && !decl_.is_constructor()) {
      o << "      (void)step_result;  // nothing recorded to compare\n";
    }
  }

  const replay::RecordedCall& call_;
  const OpDecl& decl_;
  int step_, steps_;
  std::string data_;
  Json rec_, im_, details_;
  std::map<std::string, std::string> tensor_local_;  // tensor key -> local name
  std::set<std::string> used_{"step_inputs", "step_result", "step_expected", "step_actual",
                              "step_expected_mutated"};
};

constexpr const char* kPrologue = R"(#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/replay.h"
#include "flashinfer/replay_extensions.h"
#include "flashinfer/tensor_io.h"

namespace fi = flashinfer;

// Helpers of the steps below (a step uses those it needs).
namespace {

std::string repro_data = REPRO_DATA_DIR;  // --data overrides
fi::Device repro_device = fi::Device::parse(REPRO_DEVICE);
std::optional<double> repro_rtol, repro_atol;  // default: replay's per-dtype tolerances
bool repro_ok = true;
[[maybe_unused]] fi::Value repro_self;  // a wrapper method's object, made by the __init__ step

using TensorMap = std::map<std::string, fi::Tensor>;

// The tensors of one recorded file under the data directory (torch.save format).
[[maybe_unused]] TensorMap repro_load(const std::string& file) {
  const std::string path = repro_data + "/" + file;
  TensorMap m;
  if (!std::filesystem::exists(path)) return m;
  for (auto& [key, t] : fi::load_torch(path)) m[key] = t;
  return m;
}

// A recorded input tensor on the device the call runs on, with its recorded strides (a strided
// view is moved with the span of storage it covers, as replay moves it).
[[maybe_unused]] fi::Tensor repro_tensor(const TensorMap& m, const std::string& key) {
  const auto it = m.find(key);
  if (it == m.end()) throw std::runtime_error("tensor '" + key + "' missing from the data");
  const fi::Tensor& t = it->second;
  if (t.device() == repro_device) return t;
  if (t.is_contiguous() || t.numel() == 0) return t.to(repro_device);
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  const fi::Tensor covered =
      fi::Tensor::from_storage(t.storage(), {span}, {1}, t.storage_offset(), t.dtype());
  return covered.to(repro_device).as_strided(t.shape(), t.strides(), 0);
}

// An object the recording could not describe further (as replay passes it).
[[maybe_unused]] fi::Value repro_object(const std::string& type, const std::string& repr) {
  fi::ObjectRef ref;
  ref.type = type;
  ref.repr = repr;
  return fi::Value(std::move(ref));
}

// Runs op `name` through its declaration, binding the arguments as Python would (defaults
// filled in), then rebuilding those this library's recorder captured more of from the step's
// extension tensors (e.g. the weight banks behind a LoRA pointer table): the path `flashinfer
// replay` takes.
[[maybe_unused]] fi::Value repro_run(const std::string& name,
                                     std::vector<fi::Value> positional,
                                     std::vector<std::pair<std::string, fi::Value>> keyword,
                                     const TensorMap& inputs) {
  const fi::OpDecl* op = fi::OpRegistry::global().find(name);
  if (!op || !op->invoke) throw std::runtime_error("this flashinfer-cpp cannot run " + name);
  std::vector<fi::Value> args =
      fi::bind_arguments(*op, std::move(positional), std::move(keyword));
  fi::replay::apply_call_extensions(name, inputs, args);
  return op->invoke(fi::CallArgs(*op, std::move(args)));
}

// The tensors a call returned, under the keys the recorder gives them.
[[maybe_unused]] TensorMap repro_returned(const fi::Value& result) {
  TensorMap m;
  if (result.is_tensor()) m["result"] = result.as_tensor();
  if (result.kind() == fi::Value::Kind::kTuple) {
    for (std::size_t i = 0; i < result.items().size(); ++i) {
      if (result.items()[i].is_tensor()) {
        m["result_" + std::to_string(i)] = result.items()[i].as_tensor();
      }
    }
  }
  return m;
}

// Compares one output with the recording and prints how far off it is.
[[maybe_unused]] bool repro_check(const std::string& key, const TensorMap& actual,
                                  const TensorMap& expected) {
  const auto a = actual.find(key);
  const auto e = expected.find(key);
  if (a == actual.end() || e == expected.end()) {
    std::printf("  %s: FAIL (%s)\n", key.c_str(),
                a == actual.end() ? "the call returned no such tensor" : "not recorded");
    return false;
  }
  const auto c = fi::replay::compare_tensors(key, a->second, e->second, repro_rtol, repro_atol);
  if (!c.problem.empty()) {
    std::printf("  %s: FAIL (%s)\n", key.c_str(), c.problem.c_str());
  } else {
    std::printf("  %s: %s, max abs error %.6g, %lld of %lld elements outside rtol %g, atol %g\n",
                key.c_str(), c.match ? "ok" : "FAIL", c.max_abs_error,
                static_cast<long long>(c.mismatches), static_cast<long long>(c.numel), c.rtol,
                c.atol);
  }
  return c.match;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--device") {
      repro_device = fi::Device::parse(argv[++i]);
    } else if (i + 1 < argc && a == "--data") {
      repro_data = argv[++i];
    } else if (i + 1 < argc && a == "--rtol") {
      repro_rtol = std::stod(argv[++i]);
    } else if (i + 1 < argc && a == "--atol") {
      repro_atol = std::stod(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--device cpu|cuda[:N]] [--data DIR] [--rtol R] [--atol A]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    std::printf("flashinfer-cpp %s, running on %s\n", std::string(fi::version()).c_str(),
                repro_device.str().c_str());
)";

constexpr const char* kEpilogue = R"(    std::printf(repro_ok ? "PASS\n" : "FAIL\n");
    return repro_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("ERROR: %s\n", e.what());
    return 2;
  }
}
)";

struct ReproArgs {
  std::string dir;
  std::string out;
};

// The calls the program replays: the call itself, or for a wrapper method the object's __init__
// and every call on it up to this one (ids are addresses, reused after a delete: the object
// starts at its latest __init__ before the call).
std::vector<std::string> steps_for(const replay::RecordedCall& call, const OpDecl& decl) {
  if (!decl.is_method() || decl.is_constructor() || !call.self_id) return {call.dump_dir};
  const fs::path self_dir = fs::absolute(call.dump_dir).lexically_normal();
  const fs::path root = (self_dir.has_filename() ? self_dir : self_dir.parent_path()).parent_path();
  std::vector<std::string> all;
  try {
    all = replay::list_calls(root.string());
  } catch (const std::exception&) {
  }
  std::vector<replay::RecordedCall> same;
  bool found = false;
  for (const auto& d : all) {
    replay::RecordedCall c;
    try {
      c = replay::load_recorded_call(d, false);
    } catch (const std::exception&) {
      continue;
    }
    if (fs::equivalent(d, call.dump_dir)) {
      found = true;
      break;
    }
    if (c.self_id != call.self_id || c.process_id != call.process_id) continue;
    if (c.function_name.ends_with(".__init__")) same.clear();
    same.push_back(c);
  }
  if (!found || same.empty() || !same.front().function_name.ends_with(".__init__")) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "repro", "--dir", call.function_name,
                    " is a method of an object whose __init__ is not recorded in ", root.string(),
                    " (the session this call directory belongs to): a standalone program cannot "
                    "rebuild the object. Record from the object's construction, or use "
                    "`flashinfer replay --dir ",
                    root.string(), "`");
  }
  std::vector<std::string> out;
  for (const auto& c : same) out.push_back(c.dump_dir);
  out.push_back(call.dump_dir);
  return out;
}

int run_repro(const ReproArgs& a) {
  if (std::error_code ec;
      !fs::is_directory(a.dir, ec) || !fs::exists(fs::path(a.dir) / schema::kMetadataFile, ec)) {
    std::fprintf(stderr, "flashinfer repro: not a call directory (no %s): %s\n",
                 std::string(schema::kMetadataFile).c_str(), a.dir.c_str());
    return 2;
  }
  const replay::RecordedCall call = replay::load_recorded_call(a.dir, false);
  const OpDecl* decl = OpRegistry::global().find(call.function_name);
  if (!decl || !decl->invoke) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "repro", "--dir", "function ", call.module, ".",
                    call.function_name, " is not provided by flashinfer-cpp");
  }
  const std::vector<std::string> dirs = steps_for(call, *decl);
  const fs::path out(a.out);
  fs::create_directories(out / "data");
  std::ostringstream body;
  std::string device = "cpu";
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    const replay::RecordedCall c = replay::load_recorded_call(dirs[i]);
    const OpDecl* d = OpRegistry::global().find(c.function_name);
    if (!d || !d->invoke) {
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "repro", "--dir", "function ", c.function_name,
                      " is not provided by flashinfer-cpp");
    }
    const Json rec = Json::parse(c.metadata_json);
    if (i + 1 == dirs.size()) {
      device = rec.value(std::string(schema::kBackend), std::string("cpu"));
      if (device != "cuda") device = "cpu";
    }
    // The tensors are re-saved in torch.save format whatever way they were stored.
    const std::string data = "step" + std::to_string(i + 1);
    const fs::path sd = out / "data" / data;
    fs::create_directories(sd);
    for (const char* f : {"inputs.pt", "outputs.pt", "mutated.pt", "metadata.jsonl"}) {
      fs::remove(sd / f);
    }
    if (!c.inputs.empty()) save_torch((sd / "inputs.pt").string(), c.inputs);
    if (!c.outputs.empty()) save_torch((sd / "outputs.pt").string(), c.outputs);
    if (!c.mutated.empty()) save_torch((sd / "mutated.pt").string(), c.mutated);
    std::ofstream(sd / "metadata.jsonl") << c.metadata_json << "\n";
    body << StepWriter(c, *d, static_cast<int>(i) + 1, static_cast<int>(dirs.size()), data).write();
  }
  std::ostringstream main_cpp;
  main_cpp << "// Reproduces one recorded FlashInfer call with flashinfer-cpp. Generated by\n"
           << "//   flashinfer repro --dir " << comment_text(fs::path(a.dir).filename().string())
           << "\n"
           << "// Call: " << comment_text(call.function_name) << " (" << comment_text(call.module)
           << "), recorded on " << device << ".\n";
  if (dirs.size() > 1) {
    main_cpp << "// A wrapper method needs its object: steps 1 to " << dirs.size() - 1
             << " replay the object's __init__ and\n// the calls made on it before, from the "
                "same recording.\n";
  }
  main_cpp
      << "// The recorded tensors are in data/step<N>/ (torch.save format: torch.load(path,\n"
      << "// weights_only=True) reads them). Each call runs through its declaration in the\n"
      << "// library's op registry (flashinfer/op_decl.h, the path `flashinfer replay` takes),\n"
      << "// with every recorded argument spelled out as a local below, and its outputs are\n"
      << "// compared with the recorded ones (replay's per-dtype tolerances unless given).\n"
      << "//\n"
      << "//   cmake -S . -B build -DCMAKE_PREFIX_PATH=<flashinfer-cpp prefix>\n"
      << "//   cmake --build build\n"
      << "//   ./build/repro [--device cpu|cuda[:N]] [--data DIR] [--rtol R] [--atol A]\n"
      << "// Exit status: 0 when the outputs match the recording, 1 when they do not, 2 on an\n"
      << "// error (the message says which).\n"
      << kPrologue << body.str() << kEpilogue;
  std::ofstream(out / "main.cpp") << main_cpp.str();
  std::ofstream(out / "CMakeLists.txt")
      << "# A reproducer of one recorded call, generated by `flashinfer repro`.\n"
      << "cmake_minimum_required(VERSION 3.24)\n"
      << "project(flashinfer_repro LANGUAGES CXX)\n"
      << "find_package(flashinfer_cpp REQUIRED)\n"
      << "add_executable(repro main.cpp)\n"
      << "target_compile_features(repro PRIVATE cxx_std_20)\n"
      << "target_compile_definitions(repro PRIVATE\n"
      << "  REPRO_DATA_DIR=\"${CMAKE_CURRENT_SOURCE_DIR}/data\"\n"
      << "  REPRO_DEVICE=\"" << device << "\")\n"
      << "target_link_libraries(repro PRIVATE flashinfer::flashinfer)\n";
  std::printf("Wrote %s and %s (%zu call%s, tensors in %s)\n", (out / "main.cpp").c_str(),
              (out / "CMakeLists.txt").c_str(), dirs.size(), dirs.size() == 1 ? "" : "s",
              (out / "data").c_str());
  return 0;
}

}  // namespace

Command repro_command() {
  return {"repro",
          "Write a standalone C++ program (and CMakeLists.txt) that re-runs one recorded call "
          "and compares it with the recording",
          [](Args& sub) {
            auto a = std::make_shared<ReproArgs>();
            sub.add_option("--dir", a->dir, "One call directory of a recording").required();
            sub.add_option("-o,--out", a->out,
                           "Directory to write main.cpp, CMakeLists.txt "
                           "and data/ into (created)")
                .required();
            sub.footer(
                "Build the result with cmake -S OUT -B OUT/build "
                "-DCMAKE_PREFIX_PATH=<flashinfer-cpp prefix> && cmake --build OUT/build. "
                "Exit status: 0 when written, 2 on a usage error or a directory that is not a "
                "call, 4 when the call cannot be reproduced standalone (unknown op, a wrapper "
                "method whose __init__ is not recorded).");
            return std::function<int()>([a] { return run_repro(*a); });
          }};
}

}  // namespace flashinfer::cli
