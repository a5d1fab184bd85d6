// NVRTC: a ModuleSpec to a cubin for one architecture. nvrtcGetCUBIN needs no GPU, so every
// compile path is testable on a machine without one. Compiled out in a build without CUDA.
#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "flashinfer/error.h"
#include "jit/jit.h"

#if FLASHINFER_WITH_CUDA
#include <nvrtc.h>
#endif

namespace flashinfer::jit {

namespace detail_jit {
extern std::atomic<uint64_t> g_compiles;
}

#if FLASHINFER_WITH_CUDA

namespace {

void check(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) {
    FLASHINFER_FAIL(ErrorCode::kInternal, "jit", "", what, " failed: ", nvrtcGetErrorString(r));
  }
}

std::string program_log(nvrtcProgram p) {
  std::size_t n = 0;
  if (nvrtcGetProgramLogSize(p, &n) != NVRTC_SUCCESS || n <= 1) return {};
  std::string log(n, '\0');
  nvrtcGetProgramLog(p, log.data());
  log.resize(n - 1);  // the terminating NUL
  return log;
}

}  // namespace

bool compiler_available() { return true; }

std::string compiler_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor);
}

CompiledModule compile(const ModuleSpec& spec, const Arch& arch, const JitConfig& config) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<const char*> hdr_text, hdr_name;
  for (const auto& [n, t] : spec.headers) {
    hdr_name.push_back(n.c_str());
    hdr_text.push_back(t.c_str());
  }
  nvrtcProgram prog = nullptr;
  check(nvrtcCreateProgram(&prog, spec.source.c_str(), (spec.name + ".cu").c_str(),
                           static_cast<int>(hdr_text.size()), hdr_text.data(), hdr_name.data()),
        "nvrtcCreateProgram");
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtcDestroyProgram(p); }
  } destroy{&prog};
  for (const std::string& k : spec.kernels)
    check(nvrtcAddNameExpression(prog, k.c_str()), k.c_str());
  const std::vector<std::string> opts = compile_options(spec, arch, config);
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  const nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  detail_jit::g_compiles.fetch_add(1);
  const std::string log = program_log(prog);
  if (r != NVRTC_SUCCESS) {
    FLASHINFER_FAIL(ErrorCode::kInternal, "jit", "", "NVRTC could not compile ", spec.name, " for ",
                    arch.name(), ": ", nvrtcGetErrorString(r), "\n", log);
  }
  CompiledModule m;
  m.uri = module_uri(spec, arch, config);
  m.arch = arch;
  std::size_t n = 0;
  check(nvrtcGetCUBINSize(prog, &n), "nvrtcGetCUBINSize");
  m.cubin.resize(n);
  check(nvrtcGetCUBIN(prog, m.cubin.data()), "nvrtcGetCUBIN");
  for (const std::string& k : spec.kernels) {
    const char* lowered = nullptr;
    check(nvrtcGetLoweredName(prog, k.c_str(), &lowered), "nvrtcGetLoweredName");
    m.lowered.emplace_back(k, lowered);
  }
  m.from = CompiledModule::From::kCompiled;
  if (config.verbose) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    std::string line = "Compiled " + m.uri + " for " + arch.name() + " in " + std::to_string(ms) +
                       " ms (" + std::to_string(n) + " bytes)";
    if (!log.empty()) line += "\n" + log;
    if (config.log) {
      config.log(line);
    } else {
      std::fprintf(stderr, "flashinfer.jit: %s\n", line.c_str());
    }
  }
  return m;
}

#else  // !FLASHINFER_WITH_CUDA

bool compiler_available() { return false; }
std::string compiler_version() { return ""; }

CompiledModule compile(const ModuleSpec& spec, const Arch& arch, const JitConfig&) {
  FLASHINFER_FAIL(ErrorCode::kUnsupported, "jit", "", "cannot compile ", spec.name, " for ",
                  arch.name(), ": flashinfer-cpp was built without CUDA (no NVRTC)");
}

#endif

}  // namespace flashinfer::jit
