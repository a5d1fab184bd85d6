// Private: JIT compilation of CUDA kernels with NVRTC and the on-disk cache (docs/JIT.md).
//
// A ModuleSpec names a module's sources (the main translation unit and the headers it includes,
// as text), its parameters and flags, and the kernels to instantiate (C++ name expressions). Its
// URI hashes all of that with the target architecture, the NVRTC version and the library
// version. build() returns the module's cubin from the first of: a read-only AOT directory, the
// user cache, a fresh NVRTC compile (then published into the user cache under a file lock with a
// write-to-temp + rename, so concurrent processes produce one intact entry). Compiling needs no
// GPU; loading (load_kernel) does. This layer sits below api and above core.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashinfer::detail {
struct Settings;
}

namespace flashinfer::jit {

/// A compilation target: sm_80, sm_90a (arch-specific features), ...
struct Arch {
  int sm = 0;                // 10 * major + minor
  char suffix = '\0';        // 'a' or 'f', or none
  std::string name() const;  // "sm_90a"
  bool operator==(const Arch&) const = default;
};

/// Parses "sm_90a", "90a", "9.0a" (FLASHINFER_CUDA_ARCH_LIST's spelling) or "compute_90a".
std::optional<Arch> parse_arch(std::string_view text);
/// The target for a device of compute capability `cc` (10 * major + minor): upstream's rule,
/// SM 9.x and 10.x get 'a'; an entry of `arch_list` with the same SM number wins.
Arch arch_for_device(int cc, const std::vector<Arch>& arch_list);

struct ModuleSpec {
  std::string name;    // readable prefix of the URI: "attention_cuda_core_f16_f16_f16_96_96"
  std::string source;  // the main translation unit, as written beside the cubin (module.cu)
  // Headers the source includes, by include name ("kernels/attention_params.h") and text. The
  // CUDA toolkit's own headers come from its include directory instead.
  std::vector<std::pair<std::string, std::string>> headers;
  // What the source was generated from (head dims, dtypes): hashed and kept in the manifest.
  std::vector<std::pair<std::string, std::string>> params;
  std::vector<std::string> flags;    // extra NVRTC options (-D defines among them)
  std::vector<std::string> kernels;  // name expressions: "&ns::kernel<__half, 96>"
};

struct JitConfig {
  std::filesystem::path cache_root;  // <FLASHINFER_WORKSPACE_BASE or $HOME>/.cache/flashinfer-cpp
  std::vector<std::filesystem::path> aot_dirs;  // read-only prebuilt sets, searched first
  bool verbose = false;                         // FLASHINFER_JIT_VERBOSE
  bool debug = false;                           // FLASHINFER_JIT_DEBUG
  std::vector<Arch> arch_list;                  // FLASHINFER_CUDA_ARCH_LIST (empty: unset)
  int nvcc_threads = 1;                         // FLASHINFER_NVCC_THREADS -> --split-compile
  int max_jobs = 0;                             // MAX_JOBS: parallel compiles (0: CPUs)
  std::vector<std::string> include_dirs;        // the CUDA toolkit's (baked in at build time)
  // Warnings (always) and progress lines (verbose); default: stderr, "flashinfer.jit: " prefix.
  std::function<void(const std::string&)> log;
};

/// The configuration from parsed settings (problems in them are reported by their owner).
JitConfig config_from_settings(const detail::Settings& settings);
/// config_from_settings(load_settings()), built once.
const JitConfig& default_config();

/// Whether this build can compile (NVRTC linked in: the CUDA toolkit was found at build time).
bool compiler_available();
/// NVRTC's version "13.0"; "" without it.
std::string compiler_version();

/// The full NVRTC option list for `spec` on `arch` (architecture, standard, the debug and verbose
/// flags, split-compile, the spec's flags, include directories).
std::vector<std::string> compile_options(const ModuleSpec& spec, const Arch& arch,
                                         const JitConfig& config);
/// "<name>_<32 hex digits>": xxh3-128 of the sources, parameters, options (include directories
/// excluded: they name paths, not content), arch, NVRTC version and library version.
std::string module_uri(const ModuleSpec& spec, const Arch& arch, const JitConfig& config);

struct CompiledModule {
  enum class From { kCompiled, kCache, kAot };
  std::string uri;
  Arch arch;
  std::string cubin;                                         // the ELF image
  std::vector<std::pair<std::string, std::string>> lowered;  // name expression -> symbol
  From from = From::kCompiled;
  std::filesystem::path dir;  // the entry it came from or was written to

  /// The mangled symbol of a kernel name expression; throws if the module lacks it.
  const std::string& symbol(std::string_view expr) const;
};

/// NVRTC compile only: no cache. Throws Error(kUnsupported) without NVRTC, Error(kInternal)
/// with the compiler's log when the source does not compile.
CompiledModule compile(const ModuleSpec& spec, const Arch& arch, const JitConfig& config);

/// The module from an AOT directory, the user cache, or a compile published into the cache.
CompiledModule build(const ModuleSpec& spec, const Arch& arch,
                     const JitConfig& config = default_config());

/// Writes `m` as an entry under `root` (<root>/<version>/<arch>/<uri>/: module.cu, include/,
/// module.cubin, manifest.json) through a temporary directory and a rename, under the entry's
/// lock. Used by build() for the user cache and by `flashinfer jit build` for an AOT set.
std::filesystem::path publish(const std::filesystem::path& root, const ModuleSpec& spec,
                              const CompiledModule& m, const JitConfig& config);

/// The entry directory of `uri` under a cache or AOT root.
std::filesystem::path entry_dir(const std::filesystem::path& root, const Arch& arch,
                                std::string_view uri);

/// NVRTC compiles this process has run (tests count cache hits with it).
uint64_t compile_count();

/// One cache entry, as `flashinfer jit ls` shows it.
struct CacheEntry {
  std::filesystem::path dir;
  std::string uri, name, arch, version;
  std::size_t cubin_bytes = 0;
  bool valid = false;   // manifest readable and the cubin's hash matches
  std::string problem;  // why not
};
/// Every entry under `root` (all versions and architectures), sorted by directory.
std::vector<CacheEntry> list_entries(const std::filesystem::path& root);
/// Removes everything under `root` that this library writes there (version directories); the
/// number of entries removed.
std::size_t clear_cache(const std::filesystem::path& root);

/// Loads `m` on the current CUDA device (cudaLibraryLoadData, once per URI and device) and
/// returns the kernel of `expr` as a cudaKernel_t (usable wherever the runtime takes a kernel
/// function pointer). Throws Error(kUnsupported) in a build without CUDA, Error(kCuda) when the
/// runtime refuses the image.
void* load_kernel(const CompiledModule& m, std::string_view expr);

/// The current CUDA device's target: arch_for_device(its compute capability, config.arch_list).
Arch current_device_arch(const JitConfig& config);

/// Launches a kernel from load_kernel with cudaLaunchKernelExC (programmatic stream serialization
/// set to `enable_pdl`); `args` point at the kernel's arguments, as the runtime takes them. Raises
/// the kernel's dynamic shared memory limit first when `smem` is over the default 48 KiB. Throws
/// Error(kCuda, op) when the launch fails.
void launch(const char* op, void* kernel, unsigned grid_x, unsigned grid_y, unsigned grid_z,
            unsigned block, std::size_t smem, void* stream, bool enable_pdl, void** args);

}  // namespace flashinfer::jit
