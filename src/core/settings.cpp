#include "core/settings.h"

#include <cctype>
#include <climits>
#include <cstdlib>
#include <string>

#include "calls/name_filter.h"

namespace flashinfer::detail {

namespace {

// Python's str.isspace() for ASCII: the C whitespace plus the four separators \x1c-\x1f.
bool py_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

std::string_view strip(std::string_view t) {
  while (!t.empty() && py_space(t.front())) t.remove_prefix(1);
  while (!t.empty() && py_space(t.back())) t.remove_suffix(1);
  return t;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// digitpart: digit ('_'? digit)*. Consumes it from `t` into `out` (underscores dropped).
bool take_digits(std::string_view& t, std::string& out) {
  if (t.empty() || !is_digit(t.front())) return false;
  std::size_t i = 0;
  while (i < t.size()) {
    if (is_digit(t[i])) {
      out += t[i++];
    } else if (t[i] == '_' && i + 1 < t.size() && is_digit(t[i + 1])) {
      ++i;
    } else {
      break;
    }
  }
  t.remove_prefix(i);
  return true;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) return false;
  }
  return true;
}

}  // namespace

std::optional<int64_t> parse_python_int(std::string_view text) {
  text = strip(text);
  bool neg = false;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    neg = text.front() == '-';
    text.remove_prefix(1);
  }
  std::string digits;
  if (!take_digits(text, digits) || !text.empty()) return std::nullopt;
  int64_t v = 0;
  for (char c : digits) {
    if (v > (INT64_MAX - 9) / 10) {
      v = INT64_MAX;  // saturate
      break;
    }
    v = v * 10 + (c - '0');
  }
  return neg ? -v : v;
}

std::optional<double> parse_python_float(std::string_view text) {
  text = strip(text);
  std::string norm;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    norm += text.front();
    text.remove_prefix(1);
  }
  if (iequals(text, "inf") || iequals(text, "infinity") || iequals(text, "nan")) {
    return std::strtod((norm + std::string(text)).c_str(), nullptr);
  }
  const bool int_part = take_digits(text, norm);
  bool frac_part = false;
  if (!text.empty() && text.front() == '.') {
    norm += '.';
    text.remove_prefix(1);
    frac_part = take_digits(text, norm);
  }
  if (!int_part && !frac_part) return std::nullopt;
  if (!text.empty() && (text.front() == 'e' || text.front() == 'E')) {
    norm += 'e';
    text.remove_prefix(1);
    if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
      norm += text.front();
      text.remove_prefix(1);
    }
    if (!take_digits(text, norm)) return std::nullopt;
  }
  if (!text.empty()) return std::nullopt;
  return std::strtod(norm.c_str(), nullptr);
}

namespace {

// The JIT's variables (docs/JIT.md). Upstream reads FLASHINFER_JIT_VERBOSE/DEBUG as == "1",
// FLASHINFER_NVCC_THREADS and MAX_JOBS with int(), FLASHINFER_CUDA_ARCH_LIST split on
// whitespace ("8.0 9.0a"); commas and semicolons are accepted too (CMake's list spelling).
template <class Get>
void parse_jit_settings(const Get& get, Settings& s) {
  if (const char* v = get("FLASHINFER_WORKSPACE_BASE")) s.workspace_base = v;
  if (const char* v = get("FLASHINFER_JIT_VERBOSE")) s.jit_verbose = std::string_view(v) == "1";
  if (const char* v = get("FLASHINFER_JIT_DEBUG")) s.jit_debug = std::string_view(v) == "1";
  if (const char* v = get("FLASHINFER_CUDA_ARCH_LIST")) {
    std::string_view t = v;
    while (!t.empty()) {
      std::size_t i = 0;
      while (i < t.size() && (py_space(t[i]) || t[i] == ',' || t[i] == ';')) ++i;
      t.remove_prefix(i);
      i = 0;
      while (i < t.size() && !py_space(t[i]) && t[i] != ',' && t[i] != ';') ++i;
      if (i > 0) s.cuda_arch_list.emplace_back(t.substr(0, i));
      t.remove_prefix(i);
    }
  }
  auto positive = [&](const char* var, int64_t& field, const char* fallback) {
    const char* v = get(var);
    if (!v || !*v) return;
    if (auto n = parse_python_int(v); n && *n >= 1) {
      field = *n;
    } else {
      s.problems.push_back(
          {var, std::string(var) + "='" + v + "' is not a positive integer; using " + fallback});
    }
  };
  positive("FLASHINFER_NVCC_THREADS", s.nvcc_threads, "1");
  positive("MAX_JOBS", s.max_jobs, "the number of CPUs");
  if (const char* v = get("FLASHINFER_JIT_AOT_DIR")) {
    std::string_view t = v;
    while (!t.empty()) {
      const std::size_t i = t.find(':');
      const std::string_view dir = t.substr(0, i);
      if (!dir.empty()) s.jit_aot_dirs.emplace_back(dir);
      if (i == std::string_view::npos) break;
      t.remove_prefix(i + 1);
    }
  }
}

}  // namespace

const Settings::Problem* Settings::problem(std::string_view variable) const {
  for (const Problem& p : problems) {
    if (p.variable == variable) return &p;
  }
  return nullptr;
}

Settings parse_settings(const EnvLookup& lookup) {
  auto get = [&](const char* name) -> const char* {
    return lookup ? lookup(name) : std::getenv(name);
  };
  Settings s;
  if (const char* v = get("FLASHINFER_LOGLEVEL")) {
    if (auto n = parse_python_int(v)) {
      s.log_level = static_cast<int>(*n > INT_MAX ? INT_MAX : *n < INT_MIN ? INT_MIN : *n);
    } else {
      s.problems.push_back({"FLASHINFER_LOGLEVEL", std::string("FLASHINFER_LOGLEVEL='") + v +
                                                       "' is not an integer; API logging is off "
                                                       "(level 0)"});
    }
  }
  if (const char* v = get("FLASHINFER_LOGDEST")) s.log_dest = v;
  if (const char* v = get("FLASHINFER_DUMP_DIR")) s.dump_dir = v;
  if (const char* v = get("FLASHINFER_DUMP_MAX_SIZE_GB")) {
    if (auto d = parse_python_float(v)) {
      s.dump_max_size_gb = *d;
    } else {
      s.problems.push_back(
          {"FLASHINFER_DUMP_MAX_SIZE_GB",
           std::string("FLASHINFER_DUMP_MAX_SIZE_GB='") + v + "' is not a number; using 20"});
    }
  }
  if (const char* v = get("FLASHINFER_DUMP_MAX_COUNT")) {
    if (auto n = parse_python_int(v)) {
      s.dump_max_count = *n;
    } else {
      s.problems.push_back(
          {"FLASHINFER_DUMP_MAX_COUNT",
           std::string("FLASHINFER_DUMP_MAX_COUNT='") + v + "' is not an integer; using 1000"});
    }
  }
  if (const char* v = get("FLASHINFER_DUMP_INCLUDE")) s.dump_include = split_pattern_list(v);
  if (const char* v = get("FLASHINFER_DUMP_EXCLUDE")) s.dump_exclude = split_pattern_list(v);
  if (const char* v = get("FLASHINFER_DUMP_SAFETENSORS")) {
    s.dump_safetensors = std::string_view(v) == "1";
  }
  auto non_negative = [&](const char* var, int64_t& field, const char* fallback) {
    const char* v = get(var);
    if (!v || !*v) return;
    if (auto n = parse_python_int(v); n && *n >= 0) {
      field = *n;
    } else {
      s.problems.push_back({var, std::string(var) + "='" + v +
                                     "' is not a non-negative integer; using " + fallback});
    }
  };
  non_negative("FLASHINFER_DUMP_RING", s.dump_ring, "0 (ring mode off)");
  non_negative("FLASHINFER_DUMP_RING_MB", s.dump_ring_mb, "1024");
  if (const char* v = get("FLASHINFER_DUMP_TRIGGER")) {
    std::vector<std::string> triggers;
    for (std::string& t : split_pattern_list(v)) {
      if (t == "crash" || t == "signal" || t == "nan" || t == "error" || t == "exit") {
        triggers.push_back(std::move(t));
      } else {
        s.problems.push_back(
            {"FLASHINFER_DUMP_TRIGGER", "FLASHINFER_DUMP_TRIGGER: unknown trigger '" + t +
                                            "' ignored (known: crash, signal, nan, error, exit)"});
      }
    }
    s.dump_trigger = std::move(triggers);
  }
  if (const char* v = get("FLASHINFER_DUMP_DEDUP")) s.dump_dedup = std::string_view(v) == "1";
  if (const char* v = get("FLASHINFER_DUMP_RING_VERIFY"); v && *v) {
    const std::string_view mode(v);
    if (mode == "full" || mode == "sampled") {
      s.dump_ring_verify_full = mode == "full";
    } else {
      s.problems.push_back({"FLASHINFER_DUMP_RING_VERIFY", "FLASHINFER_DUMP_RING_VERIFY='" +
                                                               std::string(mode) +
                                                               "' is not 'sampled' or 'full'; "
                                                               "using 'sampled'"});
    }
  }
  if (const char* v = get("FLASHINFER_HOST_CACHE_MB"); v && *v) {
    if (auto n = parse_python_int(v); n && *n >= 0 && *n <= (int64_t{1} << 40)) {
      s.host_cache_mb = *n;
    } else {
      s.problems.push_back({"FLASHINFER_HOST_CACHE_MB", std::string("FLASHINFER_HOST_CACHE_MB=") +
                                                            v + " is not a number of MiB"});
    }
  }
  parse_jit_settings(get, s);
  if (const char* v = get("FLASHINFER_TRACE_DUMP")) {
    s.trace_dump = *v != '\0' && std::string_view(v) != "0";
  }
  if (const char* v = get("FLASHINFER_TRACE_DUMP_DIR"); v && *v) s.trace_dump_dir = v;
  return s;
}

const Settings& load_settings() {
  static const Settings* s = new Settings(parse_settings());  // never destroyed
  return *s;
}

}  // namespace flashinfer::detail
