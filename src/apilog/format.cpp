#include "apilog/format.h"

#include <ctime>
#include <exception>

#include "core/cuda_runtime.h"
#include "flashinfer/version.h"

namespace flashinfer::detail::apilog {

namespace {

constexpr std::string_view kEquals =
    "================================================================================";
constexpr std::string_view kDashes =
    "--------------------------------------------------------------------------------";
static_assert(kEquals.size() == 80 && kDashes.size() == 80);

void append_indent(std::string& out, int indent) {
  out.append(static_cast<std::size_t>(2 * indent), ' ');
}

void format_tensor(std::string& out, const Tensor& t, int level, int indent) {
  std::string prefix(static_cast<std::size_t>(2 * indent), ' ');
  out += prefix;
  out += "Tensor(";
  prefix += "  ";
  out += '\n';
  out += prefix;
  out += "shape=";
  out += shape_to_string(t.shape());
  out += '\n';
  out += prefix;
  out += "stride=";
  out += shape_to_string(t.strides());
  out += '\n';
  out += prefix;
  out += "dtype=";
  out += dtype_torch_name(t.dtype());
  out += '\n';
  out += prefix;
  out += "device=";
  out += t.device().str();
  out += '\n';
  out += prefix;
  out += "requires_grad=False";  // no autograd here
  out += '\n';
  out += prefix;
  out += t.is_contiguous() ? "is_contiguous=True" : "is_contiguous=False";
  if (level >= 5) append_tensor_stats(out, t, prefix);
  out += '\n';
  append_indent(out, indent);
  out += ')';
}

// Lists, tuples and dicts: one "[i]: " line per item with the child formatted one level deeper,
// its own indentation included after the colon (upstream's layout, odd spacing and all).
void format_items(std::string& out, const Value& v, int level, int indent) {
  const Value::Kind kind = v.kind();
  const char* open = kind == Value::Kind::kList ? "[" : kind == Value::Kind::kTuple ? "(" : "{";
  const char* close = kind == Value::Kind::kList ? "]" : kind == Value::Kind::kTuple ? ")" : "}";
  const std::size_t n = kind == Value::Kind::kDict ? v.dict_items().size() : v.items().size();
  append_indent(out, indent);
  out += open;
  if (n == 0) {
    out += close;
    return;
  }
  if (kind == Value::Kind::kDict) {
    for (const auto& [key, val] : v.dict_items()) {
      out += '\n';
      append_indent(out, indent + 1);
      out += key.repr();
      out += ": ";
      format_value(out, val, level, indent + 1);
    }
  } else {
    const auto& items = v.items();
    for (std::size_t i = 0; i < items.size(); ++i) {
      out += '\n';
      append_indent(out, indent + 1);
      out += '[';
      out += std::to_string(i);
      out += "]: ";
      format_value(out, items[i], level, indent + 1);
    }
  }
  out += '\n';
  append_indent(out, indent);
  out += close;
}

}  // namespace

std::string timestamp_now() {
  // localtime_r is comparatively slow; the text changes once a second.
  thread_local std::time_t last = -1;
  thread_local char buf[32] = {};
  const std::time_t now = std::time(nullptr);
  if (now != last) {
    std::tm tm{};
    localtime_r(&now, &tm);
    if (std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm) == 0) buf[0] = '\0';
    last = now;
  }
  return buf;
}

void format_value(std::string& out, const Value& v, int level, int indent) {
  switch (v.kind()) {
    case Value::Kind::kTensor:
      format_tensor(out, v.as_tensor(), level, indent);
      return;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kDict:
      format_items(out, v, level, indent);
      return;
    case Value::Kind::kEnum: {
      const EnumValue& e = v.as_enum();
      append_indent(out, indent);
      out += e.type;
      out += '.';
      out += e.name;
      out += " (value=";
      out += e.value;
      out += ')';
      return;
    }
    default:
      // None, bool, int, float (Python's str), str (repr with quotes), dtype (torch.float16),
      // wrapper objects (their repr).
      append_indent(out, indent);
      out += v.repr();
      return;
  }
}

std::string banner_record() {
  std::string s;
  s.reserve(512);
  s += kEquals;
  s += "\n[";
  s += timestamp_now();
  s += "] FlashInfer API Logging - System Information\n";
  s += kEquals;
  s += '\n';
  s += "FlashInfer version: ";
  s += version();
  s += '\n';
  const std::string cuda = cuda_runtime_version();
  s += cuda.empty() ? std::string("CUDA toolkit version: <unavailable - CPU-only build?>")
                    : "CUDA toolkit version: " + cuda;
  s += '\n';
  s += "cuDNN version: <not available>\n";  // flashinfer-cpp never links cuDNN
  const int n = cuda_runtime_device_count();
  if (n > 0) {
    s += "Number of GPUs: " + std::to_string(n) + "\n";
    for (int i = 0; i < n; ++i) {
      try {
        const std::string name = cuda_device_name(i);
        const int cc = cuda_compute_capability(i);
        s += "  GPU " + std::to_string(i) + ": " + name + "\n";
        s += "    Compute capability: " + std::to_string(cc / 10) + "." + std::to_string(cc % 10) +
             " (SM" + std::to_string(cc) + ")\n";
      } catch (const std::exception& e) {
        s += "  GPU " + std::to_string(i) + ": <error: " + e.what() + ">\n";
      }
    }
  } else {
    s += "CUDA: Not available (CPU-only mode)\n";
  }
  s += kEquals;
  s += "\n\n";
  return s;
}

std::string name_record(std::string_view op_name) {
  std::string s;
  s.reserve(48 + op_name.size());
  s += '[';
  s += timestamp_now();
  s += "] FlashInfer API Call: ";
  s += op_name;
  s += '\n';
  return s;
}

std::string input_record(const OpDecl& decl, std::span<const Value> args, int level) {
  std::string s;
  s.reserve(1024);
  s += kEquals;
  s += "\n[";
  s += timestamp_now();
  s += "] FlashInfer API Call: ";
  s += decl.name;
  s += '\n';
  s += kDashes;

  // C++ has no keyword arguments: a required parameter is shown as positional; an optional one
  // as a keyword argument when it differs from its default, else under the defaults.
  const bool aligned = args.size() == decl.params.size();
  std::string positional, keyword, defaults;
  std::size_t npos = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const ParamDecl* p = aligned ? &decl.params[i] : nullptr;
    // The holder of upstream's *args values (bind_arguments): they are positional arguments
    // after the named ones, as upstream prints them; nothing when none were given.
    if (p && !decl.var_positional.empty() && p->name == decl.var_positional) {
      if (args[i].is_sequence()) {
        for (const Value& x : args[i].items()) {
          positional += "\n  arg[" + std::to_string(npos++) + "]:\n";
          format_value(positional, x, level, 2);
        }
      }
      continue;
    }
    std::string* section = &positional;
    if (p && p->default_value) {
      section = (args[i] == *p->default_value) ? &defaults : &keyword;
    } else if (p && p->keyword_only) {
      section = &keyword;
    }
    *section += '\n';
    if (section == &positional) {
      *section += "  arg[" + std::to_string(npos++) + "]:";
    } else {
      *section += "  " + p->name + (section == &defaults ? "= [DEFAULT]" : "=");
    }
    *section += '\n';
    format_value(*section, args[i], level, 2);
  }
  if (!positional.empty()) {
    s += "\nPositional input arguments:";
    s += positional;
  }
  if (!keyword.empty()) {
    s += "\nKeyword input arguments:";
    s += keyword;
  }
  if (positional.empty() && keyword.empty()) s += "\n(No explicit arguments)";
  if (!defaults.empty()) {
    s += "\nDefault parameters (not explicitly provided):";
    s += defaults;
  }
  s += '\n';
  return s;
}

std::string output_record(const Value& result, int level) {
  std::string s = "Output value:\n";
  format_value(s, result, level, 1);
  s += '\n';
  s += kEquals;
  s += "\n\n";
  return s;
}

}  // namespace flashinfer::detail::apilog
