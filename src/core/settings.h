// Private: every FLASHINFER_* setting, parsed by one parser with upstream's rules (reference
// flashinfer-logging-format.md section 1) for upstream's variables. The library parses the
// environment once, when it loads (load_settings()); the API logger and the flight recorder are
// configured from that one struct, so the two can never read a variable differently.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashinfer::detail {

struct Settings {
  int log_level = 0;                          // FLASHINFER_LOGLEVEL, Python int()
  std::string log_dest = "stdout";            // FLASHINFER_LOGDEST, raw ("%i" kept)
  std::string dump_dir = "flashinfer_dumps";  // FLASHINFER_DUMP_DIR, raw (no "%i")
  double dump_max_size_gb = 20.0;             // FLASHINFER_DUMP_MAX_SIZE_GB, Python float()
  int64_t dump_max_count = 1000;              // FLASHINFER_DUMP_MAX_COUNT, Python int()
  std::vector<std::string> dump_include;      // FLASHINFER_DUMP_INCLUDE, split on ',', stripped
  std::vector<std::string> dump_exclude;      // FLASHINFER_DUMP_EXCLUDE, same
  bool dump_safetensors = false;              // FLASHINFER_DUMP_SAFETENSORS == "1" exactly
  // This library's own flight-recorder extensions (docs/LOGGING.md, "Ring mode", "Dedup").
  int64_t dump_ring = 0;        // FLASHINFER_DUMP_RING: calls kept in memory (0: off)
  int64_t dump_ring_mb = 1024;  // FLASHINFER_DUMP_RING_MB: memory bound of the ring
  std::vector<std::string> dump_trigger = {"crash", "signal", "nan", "error"};  // _TRIGGER
  bool dump_dedup = false;  // FLASHINFER_DUMP_DEDUP == "1": content-addressed tensors
  // FLASHINFER_DUMP_RING_VERIFY == "full" (default "sampled"): how the ring tells unchanged.
  bool dump_ring_verify_full = false;
  // This library's own: the host allocator cache limit (README), Python int() >= 0.
  std::optional<int64_t> host_cache_mb;  // FLASHINFER_HOST_CACHE_MB; nullopt: unset/invalid
  // JIT compilation (docs/JIT.md), upstream's variables and one of this library's own.
  std::string workspace_base;               // FLASHINFER_WORKSPACE_BASE, raw; empty: $HOME
  bool jit_verbose = false;                 // FLASHINFER_JIT_VERBOSE == "1"
  bool jit_debug = false;                   // FLASHINFER_JIT_DEBUG == "1"
  std::vector<std::string> cuda_arch_list;  // FLASHINFER_CUDA_ARCH_LIST: "8.0 9.0a" split
  int64_t nvcc_threads = 1;                 // FLASHINFER_NVCC_THREADS, Python int() >= 1
  int64_t max_jobs = 0;                     // MAX_JOBS, Python int() >= 1; 0: unset
  std::vector<std::string> jit_aot_dirs;    // FLASHINFER_JIT_AOT_DIR, ':'-separated (ours)
  // Trace templates (docs/TRACE.md), upstream's names and rules: on unless unset, "" or "0".
  bool trace_dump = false;                      // FLASHINFER_TRACE_DUMP
  std::string trace_dump_dir = "fi_trace_out";  // FLASHINFER_TRACE_DUMP_DIR

  /// A variable that could not be parsed keeps its default; upstream raises at import, here
  /// the owner of the setting prints `message` once (docs/LOGGING.md, differences).
  struct Problem {
    std::string variable;  // "FLASHINFER_LOGLEVEL"
    std::string message;   // "FLASHINFER_LOGLEVEL='abc' is not an integer; ..."
  };
  std::vector<Problem> problems;

  /// The message about `variable`, if it could not be parsed.
  const Problem* problem(std::string_view variable) const;
};

/// Reads a variable: nullptr when unset.
using EnvLookup = std::function<const char*(const char* name)>;

/// Parses every setting from `lookup` (the process environment by default).
Settings parse_settings(const EnvLookup& lookup = {});

/// The settings as the environment held them when the library loaded: parsed once, on first
/// use (the load-time initializer asks first).
const Settings& load_settings();

/// Python's int(text): surrounding whitespace, an optional sign, decimal digits with single
/// underscores between them. Out-of-range values saturate.
std::optional<int64_t> parse_python_int(std::string_view text);
/// Python's float(text): surrounding whitespace, a sign, digits (single underscores between
/// digits), a fraction, an exponent, or inf / infinity / nan in any case.
std::optional<double> parse_python_float(std::string_view text);

}  // namespace flashinfer::detail
