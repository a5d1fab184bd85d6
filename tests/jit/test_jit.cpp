// The JIT (src/jit, docs/JIT.md): settings, URIs, NVRTC compiles to cubin for sm_80 and sm_90a
// (no GPU needed), the on-disk cache (hit, miss, invalidation, corrupt-entry recovery, a
// two-process race), the read-only AOT directory, ls/clear, and the attention kernels at head
// dims the AOT build lacks. Loading and running the cubins need a GPU: test_backend_ops and the
// *Cuda attention tests do that where one exists.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/settings.h"
#include "flashinfer/error.h"
#include "flashinfer/version.h"
#include "jit/attention_jit.h"
#include "jit/jit.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;
using jit::Arch;
using jit::CompiledModule;
using jit::JitConfig;
using jit::ModuleSpec;

#define SKIP_WITHOUT_NVRTC()                                                         \
  do {                                                                               \
    if (!jit::compiler_available()) GTEST_SKIP() << "built without CUDA (no NVRTC)"; \
  } while (0)

// A fresh directory per test, removed (made writable first) at the end.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() /
           ("fi_jit_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(path, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    }
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

// A config over `root` with its log lines captured.
struct Captured {
  JitConfig config;
  std::vector<std::string> lines;
};
std::unique_ptr<Captured> make_config(const fs::path& root) {
  auto c = std::make_unique<Captured>();
  detail::Settings s;
  s.workspace_base = root.string();
  c->config = jit::config_from_settings(s);
  Captured* raw = c.get();
  c->config.log = [raw](const std::string& l) { raw->lines.push_back(l); };
  return c;
}

ModuleSpec tiny_spec(int scale = 2) {
  ModuleSpec s;
  s.name = "tiny";
  s.source =
      "#include \"tiny/helper.cuh\"\n"
      "namespace t {\n"
      "template <int N> __global__ void scale(float* x) { x[threadIdx.x] = helper(x[threadIdx.x]) "
      "* N; }\n"
      "}\n";
  s.headers = {
      {"tiny/helper.cuh", "__device__ inline float helper(float v) { return v + 1.0f; }\n"}};
  s.params = {{"scale", std::to_string(scale)}};
  s.kernels = {"&t::scale<" + std::to_string(scale) + ">"};
  return s;
}

const Arch kSm80{80, '\0'};
const Arch kSm90a{90, 'a'};

// ELF header facts of a cubin: magic, EM_CUDA (190), and the SM number (e_flags bits 8..15 from
// ELF ABI version 8, CUDA 13; bits 0..7 before).
void expect_cubin_for(const std::string& cubin, int sm) {
  ASSERT_GE(cubin.size(), 64u);
  EXPECT_EQ(cubin.substr(0, 4), std::string("\x7f"
                                            "ELF",
                                            4));
  EXPECT_EQ(static_cast<unsigned char>(cubin[4]), 2);  // ELFCLASS64
  uint16_t machine = 0;
  std::memcpy(&machine, cubin.data() + 18, 2);
  EXPECT_EQ(machine, 190);  // EM_CUDA
  uint32_t flags = 0;
  std::memcpy(&flags, cubin.data() + 48, 4);
  const int abi = static_cast<unsigned char>(cubin[8]);
  const int got = abi >= 8 ? static_cast<int>((flags >> 8) & 0xff) : static_cast<int>(flags & 0xff);
  EXPECT_EQ(got, sm) << "e_flags " << std::hex << flags << " abi " << std::dec << abi;
}

std::size_t count_files(const fs::path& root) {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

// ---- settings and configuration -----------------------------------------------------------------

TEST(JitSettings, ParsesUpstreamVariables) {
  const std::map<std::string, std::string> env = {{"FLASHINFER_WORKSPACE_BASE", "/scratch/x"},
                                                  {"FLASHINFER_JIT_VERBOSE", "1"},
                                                  {"FLASHINFER_JIT_DEBUG", "1"},
                                                  {"FLASHINFER_CUDA_ARCH_LIST", " 8.0  9.0a,10.0a"},
                                                  {"FLASHINFER_NVCC_THREADS", "4"},
                                                  {"MAX_JOBS", "3"},
                                                  {"FLASHINFER_JIT_AOT_DIR", "/opt/a::/opt/b"}};
  const detail::Settings s = detail::parse_settings([&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  EXPECT_TRUE(s.problems.empty());
  EXPECT_EQ(s.workspace_base, "/scratch/x");
  EXPECT_TRUE(s.jit_verbose);
  EXPECT_TRUE(s.jit_debug);
  EXPECT_EQ(s.cuda_arch_list, (std::vector<std::string>{"8.0", "9.0a", "10.0a"}));
  EXPECT_EQ(s.nvcc_threads, 4);
  EXPECT_EQ(s.max_jobs, 3);
  EXPECT_EQ(s.jit_aot_dirs, (std::vector<std::string>{"/opt/a", "/opt/b"}));

  const JitConfig c = jit::config_from_settings(s);
  EXPECT_EQ(c.cache_root, fs::path("/scratch/x/.cache/flashinfer-cpp"));
  EXPECT_EQ(c.arch_list, (std::vector<Arch>{{80, '\0'}, {90, 'a'}, {100, 'a'}}));
  EXPECT_EQ(c.aot_dirs.size(), 2u);
  const auto o = jit::compile_options(tiny_spec(), kSm90a, c);
  auto has = [&](const std::string& f) { return std::find(o.begin(), o.end(), f) != o.end(); };
  EXPECT_TRUE(has("--gpu-architecture=sm_90a"));
  EXPECT_TRUE(has("-G"));  // FLASHINFER_JIT_DEBUG
  EXPECT_FALSE(has("-DNDEBUG"));
  EXPECT_TRUE(has("--ptxas-options=-v"));  // FLASHINFER_JIT_VERBOSE
  EXPECT_TRUE(has("--split-compile=4"));   // FLASHINFER_NVCC_THREADS
}

TEST(JitSettings, DefaultsAndBadValues) {
  const std::map<std::string, std::string> env = {{"HOME", "/home/u"},
                                                  {"FLASHINFER_JIT_VERBOSE", "yes"},
                                                  {"FLASHINFER_NVCC_THREADS", "0"},
                                                  {"MAX_JOBS", "many"}};
  const detail::Settings s = detail::parse_settings([&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  EXPECT_FALSE(s.jit_verbose);  // upstream: == "1" only
  EXPECT_EQ(s.nvcc_threads, 1);
  EXPECT_EQ(s.max_jobs, 0);
  ASSERT_NE(s.problem("FLASHINFER_NVCC_THREADS"), nullptr);
  ASSERT_NE(s.problem("MAX_JOBS"), nullptr);
  EXPECT_TRUE(s.workspace_base.empty());
  const JitConfig c = jit::config_from_settings(s);
  const auto o = jit::compile_options(tiny_spec(), kSm80, c);
  EXPECT_NE(std::find(o.begin(), o.end(), "-DNDEBUG"), o.end());
  EXPECT_EQ(std::find(o.begin(), o.end(), "-G"), o.end());
  for (const auto& f : o) EXPECT_FALSE(f.starts_with("--split-compile")) << f;
  // $HOME is the default base (the test process's own).
  if (const char* h = std::getenv("HOME"); h && *h) {
    EXPECT_EQ(c.cache_root, fs::path(h) / ".cache" / "flashinfer-cpp");
  }
}

TEST(JitArch, ParsesSpellings) {
  EXPECT_EQ(jit::parse_arch("sm_80"), (Arch{80, '\0'}));
  EXPECT_EQ(jit::parse_arch("9.0a"), (Arch{90, 'a'}));
  EXPECT_EQ(jit::parse_arch("90a"), (Arch{90, 'a'}));
  EXPECT_EQ(jit::parse_arch("12.0f"), (Arch{120, 'f'}));
  EXPECT_EQ(jit::parse_arch("compute_86"), (Arch{86, '\0'}));
  EXPECT_FALSE(jit::parse_arch("sm_").has_value());
  EXPECT_FALSE(jit::parse_arch("9.0.1").has_value());
  EXPECT_FALSE(jit::parse_arch("x80").has_value());
  EXPECT_EQ((Arch{90, 'a'}).name(), "sm_90a");
  // Upstream's suffix rule, and an explicit list entry winning.
  EXPECT_EQ(jit::arch_for_device(90, {}), (Arch{90, 'a'}));
  EXPECT_EQ(jit::arch_for_device(100, {}), (Arch{100, 'a'}));
  EXPECT_EQ(jit::arch_for_device(80, {}), (Arch{80, '\0'}));
  EXPECT_EQ(jit::arch_for_device(90, {Arch{90, '\0'}}), (Arch{90, '\0'}));
}

TEST(JitUri, HashesEverythingThatChangesTheCubin) {
  const JitConfig c = make_config("/nonexistent")->config;
  const std::string base = jit::module_uri(tiny_spec(), kSm80, c);
  EXPECT_TRUE(base.starts_with("tiny_"));
  EXPECT_EQ(base.size(), 5u + 32u);
  EXPECT_EQ(jit::module_uri(tiny_spec(), kSm80, c), base);  // stable
  ModuleSpec s = tiny_spec();
  s.source += "\n";
  EXPECT_NE(jit::module_uri(s, kSm80, c), base);
  s = tiny_spec();
  s.headers[0].second += " ";
  EXPECT_NE(jit::module_uri(s, kSm80, c), base);
  s = tiny_spec();
  s.flags.push_back("-DX=1");
  EXPECT_NE(jit::module_uri(s, kSm80, c), base);
  s = tiny_spec();
  s.params[0].second = "3";
  EXPECT_NE(jit::module_uri(s, kSm80, c), base);
  EXPECT_NE(jit::module_uri(tiny_spec(), kSm90a, c), base);
  EXPECT_NE(jit::module_uri(tiny_spec(), Arch{90, '\0'}, c),
            jit::module_uri(tiny_spec(), kSm90a, c));
  JitConfig dbg = c;
  dbg.debug = true;
  EXPECT_NE(jit::module_uri(tiny_spec(), kSm80, dbg), base);
  // Include directories name paths, not content: not hashed (an AOT set moves between machines).
  JitConfig moved = c;
  moved.include_dirs = {"/elsewhere/include"};
  EXPECT_EQ(jit::module_uri(tiny_spec(), kSm80, moved), base);
}

// ---- compile and cache --------------------------------------------------------------------------

TEST(JitCompile, CubinForSm80AndSm90a) {
  SKIP_WITHOUT_NVRTC();
  const JitConfig c = make_config("/nonexistent")->config;
  for (const Arch& a : {kSm80, kSm90a}) {
    const CompiledModule m = jit::compile(tiny_spec(), a, c);
    expect_cubin_for(m.cubin, a.sm);
    EXPECT_EQ(m.symbol("&t::scale<2>"), "_ZN1t5scaleILi2EEEvPf");  // Itanium mangling
    EXPECT_NE(m.symbol("&t::scale<2>").find("scale"), std::string::npos);
    EXPECT_NE(m.cubin.find(m.symbol("&t::scale<2>")), std::string::npos);  // in the symbol table
  }
  ModuleSpec bad = tiny_spec();
  bad.source += "this does not compile;\n";
  try {
    jit::compile(bad, kSm80, c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NVRTC could not compile tiny"), std::string::npos);
  }
}

TEST(JitCache, MissThenHitThenInvalidation) {
  SKIP_WITHOUT_NVRTC();
  TempDir tmp("cache");
  auto cap = make_config(tmp.path);
  const JitConfig& c = cap->config;
  const uint64_t n0 = jit::compile_count();
  const CompiledModule a = jit::build(tiny_spec(), kSm80, c);
  EXPECT_EQ(a.from, CompiledModule::From::kCompiled);
  EXPECT_EQ(jit::compile_count(), n0 + 1);
  const fs::path dir = tmp.path / ".cache" / "flashinfer-cpp" / std::string(version()) / "sm_80" /
                       jit::module_uri(tiny_spec(), kSm80, c);
  EXPECT_EQ(a.dir, dir);
  EXPECT_TRUE(fs::exists(dir / "module.cubin"));
  EXPECT_TRUE(fs::exists(dir / "manifest.json"));
  EXPECT_TRUE(fs::exists(dir / "module.cu"));  // the generated source, beside the cubin
  EXPECT_TRUE(fs::exists(dir / "include" / "tiny" / "helper.cuh"));

  const CompiledModule b = jit::build(tiny_spec(), kSm80, c);  // hit: no compile
  EXPECT_EQ(b.from, CompiledModule::From::kCache);
  EXPECT_EQ(jit::compile_count(), n0 + 1);
  EXPECT_EQ(b.cubin, a.cubin);
  EXPECT_EQ(b.lowered, a.lowered);

  ModuleSpec changed = tiny_spec();
  changed.source += "// edited\n";
  EXPECT_EQ(jit::build(changed, kSm80, c).from, CompiledModule::From::kCompiled);
  ModuleSpec flag = tiny_spec();
  flag.flags.push_back("-DSOMETHING=1");
  EXPECT_EQ(jit::build(flag, kSm80, c).from, CompiledModule::From::kCompiled);
  EXPECT_EQ(jit::build(tiny_spec(), kSm90a, c).from, CompiledModule::From::kCompiled);
  EXPECT_EQ(jit::compile_count(), n0 + 4);
  EXPECT_EQ(jit::build(tiny_spec(), kSm90a, c).from, CompiledModule::From::kCache);
  EXPECT_EQ(jit::compile_count(), n0 + 4);
  EXPECT_TRUE(cap->lines.empty());  // no warnings

  // ls and clear.
  const auto entries = jit::list_entries(c.cache_root);
  ASSERT_EQ(entries.size(), 4u);
  for (const auto& e : entries) {
    EXPECT_TRUE(e.valid) << e.dir << ": " << e.problem;
    EXPECT_EQ(e.name, "tiny");
    EXPECT_EQ(e.version, std::string(version()));
    EXPECT_GT(e.cubin_bytes, 0u);
  }
  EXPECT_EQ(jit::clear_cache(c.cache_root), 4u);
  EXPECT_TRUE(jit::list_entries(c.cache_root).empty());
  EXPECT_EQ(jit::build(tiny_spec(), kSm80, c).from, CompiledModule::From::kCompiled);
}

// A cache that cannot be written (here its root lies under a regular file, which even root
// cannot make a directory of) costs the cache, not the call: the module is compiled for the
// process with one line saying so, and compiled again next time.
TEST(JitCache, AnUnwritableCacheCompilesWithoutCachingAndSaysSo) {
  SKIP_WITHOUT_NVRTC();
  TempDir tmp("unwritable");
  const fs::path file = tmp.path / "a_file";
  std::ofstream(file) << "not a directory";
  auto cap = make_config(file);
  const uint64_t n0 = jit::compile_count();
  const CompiledModule a = jit::build(tiny_spec(), kSm80, cap->config);
  EXPECT_EQ(a.from, CompiledModule::From::kCompiled);
  EXPECT_FALSE(a.cubin.empty());
  EXPECT_TRUE(a.dir.empty());
  ASSERT_EQ(cap->lines.size(), 1u);
  EXPECT_NE(cap->lines[0].find("JIT cache not writable"), std::string::npos) << cap->lines[0];
  EXPECT_EQ(jit::build(tiny_spec(), kSm80, cap->config).from, CompiledModule::From::kCompiled);
  EXPECT_EQ(jit::compile_count(), n0 + 2);
}

TEST(JitCache, CorruptEntryIsRebuiltWithAWarning) {
  SKIP_WITHOUT_NVRTC();
  TempDir tmp("corrupt");
  auto cap = make_config(tmp.path);
  const JitConfig& c = cap->config;
  const CompiledModule a = jit::build(tiny_spec(), kSm80, c);
  const fs::path cubin = a.dir / "module.cubin";
  fs::resize_file(cubin, fs::file_size(cubin) / 2);  // truncated
  const uint64_t n0 = jit::compile_count();
  const CompiledModule b = jit::build(tiny_spec(), kSm80, c);
  EXPECT_EQ(b.from, CompiledModule::From::kCompiled);
  EXPECT_EQ(jit::compile_count(), n0 + 1);
  EXPECT_EQ(b.cubin, a.cubin);
  ASSERT_EQ(cap->lines.size(), 1u);
  EXPECT_NE(cap->lines[0].find("is corrupt"), std::string::npos) << cap->lines[0];
  EXPECT_EQ(jit::build(tiny_spec(), kSm80, c).from, CompiledModule::From::kCache);

  // Same length, one byte flipped: the hash catches it.
  {
    std::fstream f(cubin, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a' ^ a.cubin[100]);
  }
  EXPECT_EQ(jit::build(tiny_spec(), kSm80, c).from, CompiledModule::From::kCompiled);
  // A malformed manifest.
  std::ofstream(a.dir / "manifest.json") << "{not json";
  EXPECT_EQ(jit::build(tiny_spec(), kSm80, c).from, CompiledModule::From::kCompiled);
  EXPECT_EQ(cap->lines.size(), 3u);
  EXPECT_EQ(jit::list_entries(c.cache_root).size(), 1u);
  // No temporary or stale directories left behind.
  for (const auto& e : fs::directory_iterator(a.dir.parent_path())) {
    const std::string n = e.path().filename().string();
    EXPECT_FALSE(n.starts_with(".tmp.") || n.starts_with(".stale.")) << n;
  }
}

TEST(JitCache, TwoProcessesCompilingOneUriMakeOneEntry) {
  SKIP_WITHOUT_NVRTC();
  TempDir tmp("race");
  auto cap = make_config(tmp.path);
  const JitConfig& c = cap->config;
  int go[2], result[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(result), 0);
  pid_t kids[2];
  for (pid_t& kid : kids) {
    kid = ::fork();
    ASSERT_GE(kid, 0);
    if (kid == 0) {
      ::close(go[1]);
      char x;
      if (::read(go[0], &x, 1) != 1) ::_exit(10);  // both start together
      try {
        const CompiledModule m = jit::build(tiny_spec(), kSm80, c);
        // One line: "<compiled 0/1> <cubin size> <cubin bytes>".
        std::string line = std::string(m.from == CompiledModule::From::kCompiled ? "1" : "0") +
                           " " + std::to_string(m.cubin.size()) + " ";
        line += m.cubin;
        if (::write(result[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
          ::_exit(11);
        }
      } catch (...) {
        ::_exit(12);
      }
      ::_exit(0);
    }
  }
  ::close(go[0]);
  ASSERT_EQ(::write(go[1], "gg", 2), 2);
  ::close(go[1]);
  for (pid_t kid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(kid, &status, 0), kid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  ::close(result[1]);
  std::string all;
  char buf[65536];
  for (ssize_t n; (n = ::read(result[0], buf, sizeof buf)) > 0;) all.append(buf, n);
  ::close(result[0]);
  // Parse the two records.
  std::vector<std::pair<int, std::string>> got;
  std::size_t pos = 0;
  while (pos < all.size()) {
    const int compiled = all[pos] - '0';
    const std::size_t sp = all.find(' ', pos + 2);
    const std::size_t size = std::stoul(all.substr(pos + 2, sp - pos - 2));
    got.emplace_back(compiled, all.substr(sp + 1, size));
    pos = sp + 1 + size;
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first + got[1].first, 1);  // exactly one compiled; the other waited, then hit
  EXPECT_EQ(got[0].second, got[1].second);
  const auto entries = jit::list_entries(c.cache_root);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0].valid);
  // The parent now hits the entry.
  const CompiledModule m = jit::build(tiny_spec(), kSm80, c);
  EXPECT_EQ(m.from, CompiledModule::From::kCache);
  EXPECT_EQ(m.cubin, got[0].second);
}

TEST(JitAot, ReadOnlyDirectoryServesHitsAndIsNeverWritten) {
  SKIP_WITHOUT_NVRTC();
  TempDir tmp("aot");
  const fs::path aot = tmp.path / "aot";
  auto cap = make_config(tmp.path / "home");
  JitConfig& c = cap->config;
  // Prebuild one module into the AOT root, as `flashinfer jit build --out` does.
  const CompiledModule pre = jit::compile(tiny_spec(), kSm80, c);
  jit::publish(aot, tiny_spec(), pre, c);
  const std::size_t files_before = count_files(aot);
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(aot); it != fs::recursive_directory_iterator();
       ++it) {
    fs::permissions(it->path(),
                    fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                    fs::perm_options::remove, ec);
  }
  fs::permissions(aot, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                  fs::perm_options::remove, ec);
  c.aot_dirs = {aot};
  const uint64_t n0 = jit::compile_count();
  const CompiledModule hit = jit::build(tiny_spec(), kSm80, c);
  EXPECT_EQ(hit.from, CompiledModule::From::kAot);
  EXPECT_EQ(hit.cubin, pre.cubin);
  EXPECT_EQ(jit::compile_count(), n0);
  EXPECT_FALSE(fs::exists(c.cache_root));  // nothing in the user cache either

  // A miss compiles into the user cache.
  const CompiledModule miss = jit::build(tiny_spec(3), kSm80, c);
  EXPECT_EQ(miss.from, CompiledModule::From::kCompiled);
  EXPECT_TRUE(miss.dir.string().starts_with(c.cache_root.string()));
  EXPECT_EQ(jit::build(tiny_spec(3), kSm80, c).from, CompiledModule::From::kCache);
  EXPECT_EQ(count_files(aot), files_before);

  // A corrupt AOT entry is skipped with a warning, never repaired in place.
  fs::permissions(hit.dir, fs::perms::owner_write, fs::perm_options::add, ec);
  fs::permissions(hit.dir / "module.cubin", fs::perms::owner_write, fs::perm_options::add, ec);
  fs::resize_file(hit.dir / "module.cubin", 10);
  fs::permissions(hit.dir, fs::perms::owner_write, fs::perm_options::remove, ec);
  const CompiledModule fallback = jit::build(tiny_spec(), kSm80, c);
  EXPECT_EQ(fallback.from, CompiledModule::From::kCompiled);
  EXPECT_EQ(fs::file_size(hit.dir / "module.cubin"), 10u);
  ASSERT_FALSE(cap->lines.empty());
  EXPECT_NE(cap->lines.back().find("is unusable"), std::string::npos) << cap->lines.back();
}

// ---- attention at head dims the AOT build lacks -------------------------------------------------

// One cache for the attention compiles of this binary (each takes seconds), removed when the
// process exits (a static TempDir, not a leaked one, so that its destructor runs).
const JitConfig& attention_config() {
  static TempDir dir("attn");
  static Captured* c = make_config(dir.path).release();
  return c->config;
}

TEST(JitAttention, HeadDim96CudaCoreKernelCompiles) {
  SKIP_WITHOUT_NVRTC();
  const ModuleSpec s =
      jit::attention_cuda_core_spec(DType::kFloat16, DType::kFloat16, DType::kFloat16, 96, 96);
  const CompiledModule m = jit::build(s, kSm80, attention_config());
  expect_cubin_for(m.cubin, 80);
  const std::string& sym = m.symbol(s.kernels[0]);
  EXPECT_NE(sym.find("batch_decode_kernel"), std::string::npos) << sym;
  EXPECT_NE(m.cubin.find(sym), std::string::npos);
  EXPECT_EQ(jit::build(s, kSm80, attention_config()).from, CompiledModule::From::kCache);
}

TEST(JitAttention, DeepSeekQk192Vo128WithFp8KvCompilesForSm90a) {
  SKIP_WITHOUT_NVRTC();
  const ModuleSpec s = jit::attention_cuda_core_spec(DType::kBFloat16, DType::kFloat8E4M3FN,
                                                     DType::kBFloat16, 192, 128);
  const CompiledModule m = jit::build(s, kSm90a, attention_config());
  expect_cubin_for(m.cubin, 90);
  EXPECT_NE(m.cubin.find(m.symbol(s.kernels[0])), std::string::npos);
}

// ALiBi instances exist only through the JIT (decode_cuda.cu): NVRTC must take every variant.
TEST(JitAttention, DecodeAlibiVariantsCompileForSm90a) {
  SKIP_WITHOUT_NVRTC();
  for (int variant : {4, 7}) {
    const ModuleSpec s = jit::attention_cuda_core_spec(DType::kFloat16, DType::kFloat16,
                                                       DType::kFloat16, 128, 128, variant);
    const CompiledModule m = jit::build(s, kSm90a, attention_config());
    expect_cubin_for(m.cubin, 90);
    EXPECT_NE(m.cubin.find(m.symbol(s.kernels[0])), std::string::npos) << variant;
  }
}

// Multi-item scoring's rows on the CUDA-core kernel exist only through the JIT too
// (kDecodeMultiItem; the AOT two-row instances spilled with the test in): one and two rows a
// thread, with and without the soft cap.
TEST(JitAttention, DecodeMultiItemVariantsCompileForSm90a) {
  SKIP_WITHOUT_NVRTC();
  for (int rows : {1, 2}) {
    for (int variant : {10, 11}) {
      const ModuleSpec s = jit::attention_cuda_core_spec(DType::kBFloat16, DType::kBFloat16,
                                                         DType::kBFloat16, 128, 128, variant, rows);
      const CompiledModule m = jit::build(s, kSm90a, attention_config());
      expect_cubin_for(m.cubin, 90);
      EXPECT_NE(m.cubin.find(m.symbol(s.kernels[0])), std::string::npos) << variant << " " << rows;
    }
  }
}

// Two rows a thread (decode_rows_per_thread, GQA groups >= 4) on the JIT: the instances a GPU
// runs with kRows = 2 (ALiBi at head dim 128 with 16-bit and fp8 K/V, 16-bit head dim 32; a
// session-59 review found no other JIT kernel takes two rows, the 96 / 96 one this compiled
// before among them).
TEST(JitAttention, DecodeTwoRowsAThreadCompilesForSm90a) {
  SKIP_WITHOUT_NVRTC();
  struct Row {
    DType q, kv;
    int64_t d;
    int variant;
  };
  for (const Row& r : {Row{DType::kFloat16, DType::kFloat16, 128, 5},
                       Row{DType::kBFloat16, DType::kFloat8E4M3FN, 128, 4},
                       Row{DType::kBFloat16, DType::kBFloat16, 32, 0}}) {
    const ModuleSpec s = jit::attention_cuda_core_spec(r.q, r.kv, r.q, r.d, r.d, r.variant, 2);
    const std::string dims = std::to_string(r.d) + ", " + std::to_string(r.d) + ", ";
    EXPECT_NE(s.kernels[0].find(dims + std::to_string(r.variant) + ", 2>"), std::string::npos)
        << s.kernels[0];
    const CompiledModule m = jit::build(s, kSm90a, attention_config());
    expect_cubin_for(m.cubin, 90);
    EXPECT_NE(m.cubin.find(m.symbol(s.kernels[0])), std::string::npos) << r.d << " " << r.variant;
  }
}

TEST(JitAttention, HeadDim80TensorCoreKernelCompiles) {
  SKIP_WITHOUT_NVRTC();
  const ModuleSpec s = jit::attention_mma_spec(DType::kBFloat16, 80);
  const CompiledModule m = jit::build(s, kSm80, attention_config());
  expect_cubin_for(m.cubin, 80);
  EXPECT_NE(m.symbol(s.kernels[0]).find("prefill_mma_kernel"), std::string::npos);
}

TEST(JitAttention, SpecsAndListLines) {
  EXPECT_TRUE(jit::attention_head_dim_ok(96));
  EXPECT_TRUE(jit::attention_head_dim_ok(16));
  EXPECT_FALSE(jit::attention_head_dim_ok(72));
  EXPECT_FALSE(jit::attention_head_dim_ok(272));
  const ModuleSpec a = jit::spec_from_line(
      "attention_cuda_core q=float16 kv=float8_e4m3fn o=float16 head_dim_qk=192 head_dim_vo=128");
  EXPECT_EQ(a.name, "attention_cuda_core_float16_float8_e4m3fn_float16_192_128");
  EXPECT_EQ(a.kernels.size(), 1u);
  EXPECT_NE(a.kernels[0].find("__nv_fp8_e4m3, __half, 192, 128, 0>"), std::string::npos);
  // The decode kernel's variant bits: the name says them, the expression instantiates them.
  const ModuleSpec v = jit::spec_from_line(
      "attention_cuda_core q=bfloat16 kv=bfloat16 o=bfloat16 head_dim_qk=96 head_dim_vo=96 "
      "variant=7");
  EXPECT_EQ(v.name, "attention_cuda_core_bfloat16_bfloat16_bfloat16_96_96_softcap_mask_alibi");
  EXPECT_NE(v.kernels[0].find("96, 96, 7>"), std::string::npos);
  const ModuleSpec mi = jit::spec_from_line(
      "attention_cuda_core q=bfloat16 kv=bfloat16 o=bfloat16 head_dim_qk=128 head_dim_vo=128 "
      "variant=10");
  EXPECT_EQ(mi.name, "attention_cuda_core_bfloat16_bfloat16_bfloat16_128_128_mask_multiitem");
  EXPECT_NE(mi.kernels[0].find("128, 128, 10>"), std::string::npos);
  EXPECT_THROW(jit::spec_from_line("attention_cuda_core q=float16 kv=float16 o=float16 "
                                   "head_dim_qk=96 head_dim_vo=96 variant=16"),
               Error);
  // Two rows a thread: its own module (name, key parameter, kernel expression); one row a thread
  // keeps the names and expressions of before.
  const ModuleSpec r2 = jit::spec_from_line(
      "attention_cuda_core q=bfloat16 kv=bfloat16 o=bfloat16 head_dim_qk=96 head_dim_vo=96 "
      "variant=1 rows_per_thread=2");
  EXPECT_EQ(r2.name, "attention_cuda_core_bfloat16_bfloat16_bfloat16_96_96_softcap_rows2");
  EXPECT_NE(r2.kernels[0].find("96, 96, 1, 2>"), std::string::npos);
  EXPECT_EQ(r2.params.back(), (std::pair<std::string, std::string>{"rows_per_thread", "2"}));
  const ModuleSpec r1 = jit::spec_from_line(
      "attention_cuda_core q=bfloat16 kv=bfloat16 o=bfloat16 head_dim_qk=96 head_dim_vo=96 "
      "rows_per_thread=1");
  EXPECT_EQ(r1.name, "attention_cuda_core_bfloat16_bfloat16_bfloat16_96_96");
  EXPECT_NE(r1.kernels[0].find("96, 96, 0>"), std::string::npos);
  EXPECT_EQ(r1.params.size(), jit::attention_cuda_core_spec(DType::kBFloat16, DType::kBFloat16,
                                                            DType::kBFloat16, 96, 96)
                                  .params.size());
  EXPECT_THROW(jit::spec_from_line("attention_cuda_core q=float16 kv=float16 o=float16 "
                                   "head_dim_qk=96 head_dim_vo=96 rows_per_thread=3"),
               Error);
  EXPECT_THROW(jit::attention_cuda_core_spec(DType::kFloat16, DType::kFloat16, DType::kFloat16, 96,
                                             96, 0, 4),
               Error);
  const ModuleSpec b = jit::spec_from_line("attention_mma dtype=bf16 head_dim=96");
  EXPECT_EQ(b.name, "attention_mma_bfloat16_96");
  // The kernel headers travel with the spec (embedded at build time).
  bool has_params = false;
  for (const auto& [n, t] : b.headers) {
    has_params = has_params || (n == "kernels/attention_params.h" && !t.empty());
  }
  EXPECT_TRUE(has_params);
  auto expect_list_error = [](const char* line) {
    try {
      jit::spec_from_line(line);
      ADD_FAILURE() << "accepted: " << line;
    } catch (const Error& e) {
      EXPECT_EQ(e.arg(), "list") << line;
      EXPECT_EQ(e.op(), "jit") << line;
    }
  };
  expect_list_error("attention_mma dtype=bf16 head_dim=72");
  expect_list_error("attention_mma dtype=bf16");
  expect_list_error("attention_mma dtype=bf16 head_dim=96 extra=1");
  expect_list_error("attention_mma dtype=nope head_dim=96");
  expect_list_error("norm x=1");
  expect_list_error("attention_mma head_dim");
  EXPECT_THROW(
      jit::attention_cuda_core_spec(DType::kFloat32, DType::kFloat32, DType::kFloat32, 96, 96),
      Error);
}

}  // namespace
}  // namespace flashinfer
