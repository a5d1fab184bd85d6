// `flashinfer jit build|ls|clear`: the JIT cache and AOT sets (docs/JIT.md).
#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "flashinfer/error.h"
#include "jit/attention_jit.h"
#include "jit/jit.h"

namespace flashinfer::cli {

namespace {

namespace fs = std::filesystem;

struct JitArgs {
  std::string list, out, arch, dir;
  int jobs = 0;
};

// Non-empty lines of a SPECS file; '#' starts a comment.
std::vector<std::pair<int, std::string>> read_list(const std::string& path) {
  std::ifstream in(path);
  if (!in) FLASHINFER_FAIL(ErrorCode::kIo, "jit", "list", "cannot read ", path);
  std::vector<std::pair<int, std::string>> lines;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    lines.emplace_back(n, line);
  }
  return lines;
}

std::vector<jit::Arch> target_archs(const std::string& arg, const jit::JitConfig& config) {
  std::vector<jit::Arch> out;
  if (arg.empty()) {
    out = config.arch_list;
    if (out.empty()) {
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "jit", "arch",
                      "no target architecture: pass --arch sm_80,sm_90a or set "
                      "FLASHINFER_CUDA_ARCH_LIST");
    }
    return out;
  }
  std::size_t pos = 0;
  while (pos <= arg.size()) {
    const std::size_t comma = arg.find(',', pos);
    const std::string tok =
        arg.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!tok.empty()) {
      auto a = jit::parse_arch(tok);
      FLASHINFER_CHECK(a.has_value(), "jit", "arch", "'", tok, "' is not an architecture");
      out.push_back(*a);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

int run_build(const JitArgs& a) {
  const jit::JitConfig& config = jit::default_config();
  FLASHINFER_CHECK_CODE(jit::compiler_available(), ErrorCode::kUnsupported, "jit", "",
                        "flashinfer-cpp was built without CUDA: nothing can be compiled");
  std::vector<jit::ModuleSpec> specs;
  for (const auto& [n, line] : read_list(a.list)) {
    try {
      specs.push_back(jit::spec_from_line(line));
    } catch (const Error& e) {
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "jit", "list", a.list, ":", n, ": ", e.what());
    }
  }
  const std::vector<jit::Arch> archs = target_archs(a.arch, config);
  struct Job {
    const jit::ModuleSpec* spec;
    jit::Arch arch;
  };
  std::vector<Job> jobs;
  for (const auto& s : specs)
    for (const auto& ar : archs) jobs.push_back({&s, ar});
  // MAX_JOBS (or -j) parallel NVRTC compiles; each NVRTC program is independent.
  int threads = a.jobs > 0 ? a.jobs : config.max_jobs;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min<int>(threads, static_cast<int>(std::max<std::size_t>(1, jobs.size())));
  std::atomic<std::size_t> next{0};
  std::atomic<int> failed{0};
  std::mutex out_mu;
  auto worker = [&] {
    for (std::size_t i; (i = next++) < jobs.size();) {
      const Job& j = jobs[i];
      try {
        const std::string uri = jit::module_uri(*j.spec, j.arch, config);
        std::string what = "present";
        const fs::path dir = jit::entry_dir(a.out, j.arch, uri);
        bool valid = false;
        for (const auto& e : jit::list_entries(a.out)) valid = valid || (e.dir == dir && e.valid);
        if (!valid) {
          const jit::CompiledModule m = jit::compile(*j.spec, j.arch, config);
          jit::publish(a.out, *j.spec, m, config);
          what = "built";
        }
        std::lock_guard<std::mutex> g(out_mu);
        std::printf("%-8s %s %s\n", what.c_str(), j.arch.name().c_str(), uri.c_str());
      } catch (const Error& e) {
        std::lock_guard<std::mutex> g(out_mu);
        std::fprintf(stderr, "flashinfer: %s for %s: %s\n", j.spec->name.c_str(),
                     j.arch.name().c_str(), e.what());
        ++failed;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  std::printf("%zu modules x %zu architectures into %s (%d failed)\n", specs.size(), archs.size(),
              a.out.c_str(), failed.load());
  return failed.load() == 0 ? 0 : 1;
}

void print_entries(const fs::path& root, const char* label) {
  const auto entries = jit::list_entries(root);
  std::printf("%s %s: %zu entries\n", label, root.c_str(), entries.size());
  for (const auto& e : entries) {
    std::printf("  %-8s %-7s %8zu  %s%s%s\n", e.version.c_str(), e.arch.c_str(), e.cubin_bytes,
                e.uri.c_str(), e.valid ? "" : "  CORRUPT: ", e.valid ? "" : e.problem.c_str());
  }
}

int run_ls(const JitArgs& a) {
  if (!a.dir.empty()) {
    print_entries(a.dir, "directory");
    return 0;
  }
  const jit::JitConfig& config = jit::default_config();
  print_entries(config.cache_root, "cache");
  for (const auto& d : config.aot_dirs) print_entries(d, "aot (read-only)");
  return 0;
}

int run_clear(const JitArgs& a) {
  const fs::path root = a.dir.empty() ? jit::default_config().cache_root : fs::path(a.dir);
  const std::size_t n = jit::clear_cache(root);
  std::printf("removed %zu entries from %s\n", n, root.c_str());
  return 0;
}

}  // namespace

Command jit_command() {
  return {"jit", "JIT kernel cache: build an AOT set, list or clear cached modules", [](Args& sub) {
            auto a = std::make_shared<JitArgs>();
            sub.require_subcommand(1);
            Args build = sub.add_subcommand(
                "build", "Prebuild the modules of a SPECS file into a directory (an AOT set)");
            build.add_option("--list", a->list, "SPECS file: one module per line").required();
            build.add_option("--out", a->out, "Output root (may ship read-only)").required();
            build.add_option("--arch", a->arch,
                             "Targets, e.g. sm_80,sm_90a (default: FLASHINFER_CUDA_ARCH_LIST)");
            build.add_option("-j,--jobs", a->jobs, "Parallel compiles (default: MAX_JOBS, CPUs)");
            Args ls = sub.add_subcommand("ls", "List cached modules (user cache, AOT dirs)");
            ls.add_option("--dir", a->dir, "List this root instead");
            Args clear = sub.add_subcommand("clear", "Remove the user cache's modules");
            clear.add_option("--dir", a->dir, "Clear this root instead");
            return std::function<int()>([a, build, ls, clear] {
              if (build.parsed()) return run_build(*a);
              if (ls.parsed()) return run_ls(*a);
              if (clear.parsed()) return run_clear(*a);
              return 2;
            });
          }};
}

}  // namespace flashinfer::cli
