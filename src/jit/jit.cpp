// The JIT's cache, URIs and configuration (docs/JIT.md). NVRTC itself is in nvrtc_compile.cpp and
// loading in jit_load.cpp, the only two files that need the CUDA toolkit.
#include "jit/jit.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/settings.h"
#include "flashinfer/error.h"
#include "flashinfer/version.h"

#ifndef FLASHINFER_JIT_CUDA_INCLUDE_DIRS
#define FLASHINFER_JIT_CUDA_INCLUDE_DIRS ""
#endif

namespace flashinfer::jit {

namespace fs = std::filesystem;

namespace detail_jit {
std::atomic<uint64_t> g_compiles{0};
}

namespace {

constexpr const char* kOp = "jit";
constexpr int kManifestFormat = 1;

void default_log(const std::string& line) {
  std::fprintf(stderr, "flashinfer.jit: %s\n", line.c_str());
}

void log_line(const JitConfig& c, const std::string& line) {
  if (c.log) {
    c.log(line);
  } else {
    default_log(line);
  }
}

std::string hex128(const void* data, std::size_t n) {
  const XXH128_hash_t h = XXH3_128bits(data, n);
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

std::string read_file(const fs::path& p, bool* ok) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    *ok = false;
    return {};
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  *ok = static_cast<bool>(in) || in.eof();
  return ss.str();
}

void write_file(const fs::path& p, std::string_view data) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) FLASHINFER_FAIL(ErrorCode::kIo, kOp, "", "cannot create ", p.string());
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w <= 0) {
      ::close(fd);
      FLASHINFER_FAIL(ErrorCode::kIo, kOp, "", "cannot write ", p.string());
    }
    done += static_cast<std::size_t>(w);
  }
  // Durable before the rename publishes it: a crash never leaves a renamed, half-written entry.
  ::fsync(fd);
  ::close(fd);
}

// Held for the lifetime of the object: flock on <dir>/.locks/<uri>.lock.
class FileLock {
 public:
  explicit FileLock(const fs::path& file) {
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) FLASHINFER_FAIL(ErrorCode::kIo, kOp, "", "cannot open lock file ", file.string());
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        ::close(fd_);
        FLASHINFER_FAIL(ErrorCode::kIo, kOp, "", "cannot lock ", file.string());
      }
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// Reads and validates an entry. nullopt with `problem` set when it is missing or corrupt.
std::optional<CompiledModule> read_entry(const fs::path& dir, std::string_view uri,
                                         const std::vector<std::string>& kernels,
                                         std::string* problem) {
  bool ok = true;
  const std::string text = read_file(dir / "manifest.json", &ok);
  if (!ok) {
    *problem = "missing";
    return std::nullopt;
  }
  CompiledModule m;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.at("format").get<int>() != kManifestFormat || j.at("uri").get<std::string>() != uri) {
      *problem = "manifest does not describe this module";
      return std::nullopt;
    }
    const std::string cubin = read_file(dir / "module.cubin", &ok);
    if (!ok) {
      *problem = "module.cubin is missing";
      return std::nullopt;
    }
    const auto& c = j.at("cubin");
    if (cubin.size() != c.at("bytes").get<std::size_t>() ||
        hex128(cubin.data(), cubin.size()) != c.at("xxh3_128").get<std::string>()) {
      *problem = "module.cubin does not match its manifest (size or hash)";
      return std::nullopt;
    }
    for (const auto& [expr, sym] : j.at("kernels").items()) {
      m.lowered.emplace_back(expr, sym.get<std::string>());
    }
    for (const std::string& k : kernels) {
      bool found = false;
      for (const auto& e : m.lowered) found = found || e.first == k;
      if (!found) {
        *problem = "manifest lacks kernel " + k;
        return std::nullopt;
      }
    }
    const auto arch = parse_arch(j.at("arch").get<std::string>());
    if (!arch) {
      *problem = "manifest names an unknown architecture";
      return std::nullopt;
    }
    m.arch = *arch;
    m.cubin = cubin;
  } catch (const nlohmann::json::exception& e) {
    *problem = std::string("manifest.json is malformed (") + e.what() + ")";
    return std::nullopt;
  }
  m.uri = std::string(uri);
  m.dir = dir;
  return m;
}

fs::path home_dir() {
  if (const char* h = std::getenv("HOME"); h && *h) return h;
  return fs::current_path();
}

}  // namespace

// ---- architectures ------------------------------------------------------------------------------

std::string Arch::name() const {
  std::string s = "sm_" + std::to_string(sm);
  if (suffix) s += suffix;
  return s;
}

std::optional<Arch> parse_arch(std::string_view t) {
  if (t.starts_with("sm_")) {
    t.remove_prefix(3);
  } else if (t.starts_with("compute_")) {
    t.remove_prefix(8);
  }
  Arch a;
  if (!t.empty() && (t.back() == 'a' || t.back() == 'f')) {
    a.suffix = t.back();
    t.remove_suffix(1);
  }
  std::string digits;
  const std::size_t dot = t.find('.');
  if (dot != std::string_view::npos) {
    // "9.0": major.minor, one minor digit.
    if (dot == 0 || dot + 2 != t.size()) return std::nullopt;
    digits = std::string(t.substr(0, dot)) + std::string(t.substr(dot + 1));
  } else {
    digits = std::string(t);
  }
  if (digits.size() < 2 || digits.size() > 3) return std::nullopt;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  a.sm = std::stoi(digits);
  if (a.sm < 50) return std::nullopt;
  return a;
}

Arch arch_for_device(int cc, const std::vector<Arch>& arch_list) {
  for (const Arch& a : arch_list) {
    if (a.sm == cc) return a;
  }
  Arch a{cc, '\0'};
  if (cc / 10 == 9 || cc / 10 == 10) a.suffix = 'a';
  return a;
}

// ---- configuration ------------------------------------------------------------------------------

JitConfig config_from_settings(const detail::Settings& s) {
  JitConfig c;
  const fs::path base = s.workspace_base.empty() ? home_dir() : fs::path(s.workspace_base);
  c.cache_root = base / ".cache" / "flashinfer-cpp";
  for (const std::string& d : s.jit_aot_dirs) c.aot_dirs.emplace_back(d);
  c.verbose = s.jit_verbose;
  c.debug = s.jit_debug;
  for (const std::string& t : s.cuda_arch_list) {
    if (auto a = parse_arch(t)) {
      c.arch_list.push_back(*a);
    } else {
      default_log("FLASHINFER_CUDA_ARCH_LIST: '" + t + "' is not an architecture; ignored");
    }
  }
  c.nvcc_threads = static_cast<int>(std::min<int64_t>(s.nvcc_threads, 256));
  c.max_jobs = static_cast<int>(std::min<int64_t>(s.max_jobs, 1024));
  std::string_view dirs = FLASHINFER_JIT_CUDA_INCLUDE_DIRS;
  while (!dirs.empty()) {
    const std::size_t i = dirs.find('|');
    if (i != 0) c.include_dirs.emplace_back(dirs.substr(0, i));
    if (i == std::string_view::npos) break;
    dirs.remove_prefix(i + 1);
  }
  return c;
}

const JitConfig& default_config() {
  static const JitConfig* c = new JitConfig(config_from_settings(detail::load_settings()));
  return *c;
}

// ---- URIs ---------------------------------------------------------------------------------------

std::vector<std::string> compile_options(const ModuleSpec& spec, const Arch& arch,
                                         const JitConfig& config) {
  std::vector<std::string> o = {"--gpu-architecture=" + arch.name(), "-std=c++20",
                                "-default-device"};
  if (config.debug) {
    o.push_back("-G");  // NVRTC: device debug info, optimizations off (nvcc's -G -O0)
  } else {
    o.push_back("-DNDEBUG");
    if (config.verbose) o.push_back("-lineinfo");
  }
  if (config.verbose) o.push_back("--ptxas-options=-v");
  if (config.nvcc_threads > 1)
    o.push_back("--split-compile=" + std::to_string(config.nvcc_threads));
  for (const std::string& f : spec.flags) o.push_back(f);
  for (const std::string& d : config.include_dirs) o.push_back("-I" + d);
  return o;
}

std::string module_uri(const ModuleSpec& spec, const Arch& arch, const JitConfig& config) {
  // Length-prefixed fields: no two different specs serialize to the same bytes.
  std::string key;
  auto add = [&](std::string_view s) {
    key += std::to_string(s.size());
    key += ':';
    key += s;
  };
  add("flashinfer-cpp jit module v1");
  add(version());
  add(compiler_version());
  add(arch.name());
  add(spec.name);
  add(spec.source);
  for (const auto& [n, t] : spec.headers) {
    add(n);
    add(t);
  }
  for (const auto& [k, v] : spec.params) {
    add(k);
    add(v);
  }
  for (const std::string& o : compile_options(spec, arch, config)) {
    if (!o.starts_with("-I")) add(o);
  }
  for (const std::string& k : spec.kernels) add(k);
  return spec.name + "_" + hex128(key.data(), key.size());
}

fs::path entry_dir(const fs::path& root, const Arch& arch, std::string_view uri) {
  return root / std::string(version()) / arch.name() / std::string(uri);
}

const std::string& CompiledModule::symbol(std::string_view expr) const {
  for (const auto& [e, s] : lowered) {
    if (e == expr) return s;
  }
  FLASHINFER_FAIL(ErrorCode::kInternal, kOp, "", "module ", uri, " has no kernel ", expr);
}

uint64_t compile_count() { return detail_jit::g_compiles.load(); }

// ---- publishing and lookup ----------------------------------------------------------------------

namespace {

fs::path lock_path(const fs::path& root, const Arch& arch, std::string_view uri) {
  return entry_dir(root, arch, uri).parent_path() / ".locks" / (std::string(uri) + ".lock");
}

// publish() with the entry's lock already held by the caller.
fs::path publish_locked(const fs::path& root, const ModuleSpec& spec, const CompiledModule& m,
                        const JitConfig& config) {
  const fs::path final_dir = entry_dir(root, m.arch, m.uri);
  const fs::path arch_dir = final_dir.parent_path();
  std::error_code ec;
  std::string problem;
  if (read_entry(final_dir, m.uri, spec.kernels, &problem)) return final_dir;  // a peer won

  static std::atomic<uint64_t> seq{0};
  const std::string tag = std::to_string(::getpid()) + "." + std::to_string(seq++);
  const fs::path tmp = arch_dir / (".tmp." + m.uri + "." + tag);
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp / "include", ec);
  if (ec) FLASHINFER_FAIL(ErrorCode::kIo, kOp, "", "cannot create ", tmp.string());
  try {
    write_file(tmp / "module.cu", spec.source);
    for (const auto& [name, text] : spec.headers) {
      const fs::path p = tmp / "include" / name;
      fs::create_directories(p.parent_path(), ec);
      write_file(p, text);
    }
    write_file(tmp / "module.cubin", m.cubin);
    nlohmann::json j;
    j["format"] = kManifestFormat;
    j["name"] = spec.name;
    j["uri"] = m.uri;
    j["arch"] = m.arch.name();
    j["version"] = std::string(version());
    j["nvrtc"] = compiler_version();
    j["options"] = compile_options(spec, m.arch, config);
    j["params"] = nlohmann::json::object();
    for (const auto& [k, v] : spec.params) j["params"][k] = v;
    j["kernels"] = nlohmann::json::object();
    for (const auto& [e, s] : m.lowered) j["kernels"][e] = s;
    j["cubin"] = {{"file", "module.cubin"},
                  {"bytes", m.cubin.size()},
                  {"xxh3_128", hex128(m.cubin.data(), m.cubin.size())}};
    write_file(tmp / "manifest.json", j.dump(2) + "\n");
    if (fs::exists(final_dir)) {
      // Corrupt or stale: moved aside first, since rename() cannot replace a non-empty directory.
      const fs::path stale = arch_dir / (".stale." + m.uri + "." + tag);
      fs::rename(final_dir, stale, ec);
      fs::remove_all(stale, ec);
    }
    fs::rename(tmp, final_dir, ec);
    if (ec) {
      FLASHINFER_FAIL(ErrorCode::kIo, kOp, "", "cannot publish ", final_dir.string(), ": ",
                      ec.message());
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return final_dir;
}

}  // namespace

fs::path publish(const fs::path& root, const ModuleSpec& spec, const CompiledModule& m,
                 const JitConfig& config) {
  FileLock lock(lock_path(root, m.arch, m.uri));
  return publish_locked(root, spec, m, config);
}

CompiledModule build(const ModuleSpec& spec, const Arch& arch, const JitConfig& config) {
  const std::string uri = module_uri(spec, arch, config);
  std::string problem;
  for (const fs::path& aot : config.aot_dirs) {
    const fs::path dir = entry_dir(aot, arch, uri);
    if (!fs::exists(dir)) continue;
    if (auto m = read_entry(dir, uri, spec.kernels, &problem)) {
      m->from = CompiledModule::From::kAot;
      if (config.verbose)
        log_line(config, "Loading JIT ops: " + uri + " (AOT " + aot.string() + ")");
      return *m;
    }
    // Never repaired in place: AOT directories are read-only; the user cache serves instead.
    log_line(config, "AOT entry " + dir.string() + " is unusable (" + problem + "); ignored");
  }
  const fs::path dir = entry_dir(config.cache_root, arch, uri);
  if (auto m = read_entry(dir, uri, spec.kernels, &problem)) {
    m->from = CompiledModule::From::kCache;
    if (config.verbose) log_line(config, "Loading JIT ops: " + uri + " (cache)");
    return *m;
  }
  if (problem != "missing") {
    log_line(config, "cache entry " + dir.string() + " is corrupt (" + problem + "); rebuilding");
  }
  // Compiled under the entry's lock, so concurrent processes (and threads: flock is per open
  // file description) compile it once; a peer may have published it while we waited.
  std::optional<FileLock> lock;
  try {
    lock.emplace(lock_path(config.cache_root, arch, uri));
  } catch (const Error& e) {
    // A cache that cannot be written (a read-only home, a full disk) costs the cache, not the
    // call: the module is compiled for this process alone.
    log_line(config, std::string("JIT cache not writable (") + e.what() + "): compiling " + uri +
                         " without caching it");
    CompiledModule m = compile(spec, arch, config);
    m.from = CompiledModule::From::kCompiled;
    return m;
  }
  if (auto m = read_entry(dir, uri, spec.kernels, &problem)) {
    m->from = CompiledModule::From::kCache;
    return *m;
  }
  CompiledModule m = compile(spec, arch, config);
  m.dir = publish_locked(config.cache_root, spec, m, config);
  m.from = CompiledModule::From::kCompiled;
  return m;
}

// ---- listing ------------------------------------------------------------------------------------

std::vector<CacheEntry> list_entries(const fs::path& root) {
  std::vector<CacheEntry> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& ver : fs::directory_iterator(root, ec)) {
    if (!ver.is_directory()) continue;
    for (const auto& arch : fs::directory_iterator(ver.path(), ec)) {
      if (!arch.is_directory()) continue;
      for (const auto& ent : fs::directory_iterator(arch.path(), ec)) {
        const std::string fname = ent.path().filename().string();
        if (!ent.is_directory() || fname.starts_with(".")) continue;
        CacheEntry e;
        e.dir = ent.path();
        e.uri = fname;
        e.version = ver.path().filename().string();
        e.arch = arch.path().filename().string();
        bool ok = true;
        const std::string text = read_file(ent.path() / "manifest.json", &ok);
        try {
          if (ok) e.name = nlohmann::json::parse(text).value("name", "");
        } catch (const nlohmann::json::exception&) {
        }
        std::string problem;
        if (auto m = read_entry(ent.path(), fname, {}, &problem)) {
          e.valid = true;
          e.cubin_bytes = m->cubin.size();
        } else {
          e.problem = problem;
        }
        out.push_back(std::move(e));
      }
    }
  }
  std::sort(out.begin(), out.end(),
            [](const CacheEntry& a, const CacheEntry& b) { return a.dir < b.dir; });
  return out;
}

std::size_t clear_cache(const fs::path& root) {
  const std::size_t n = list_entries(root).size();
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return 0;
  for (const auto& ver : fs::directory_iterator(root, ec)) {
    if (ver.is_directory()) fs::remove_all(ver.path(), ec);
  }
  return n;
}

}  // namespace flashinfer::jit
