// The `flashinfer` command: subcommand table, --help for each, version, info, list-ops.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernel_switches.h"
#include "kernels/cpu/cpu_isa.h"
#include "util/run_command.h"

namespace {

using CliResult = flashinfer::testing::CommandResult;
using flashinfer::testing::run_command;
using flashinfer::testing::run_flashinfer;

TEST(Cli, HelpListsEverySubcommand) {
  CliResult r = run_flashinfer("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* sub : {"version", "info", "list-ops"}) {
    EXPECT_NE(r.out.find(sub), std::string::npos) << sub;
    CliResult h = run_flashinfer(std::string(sub) + " --help");
    EXPECT_EQ(h.status, 0) << sub;
    EXPECT_NE(h.out.find("Usage"), std::string::npos) << h.out;
  }
}

TEST(Cli, NoOrUnknownSubcommandFails) {
  EXPECT_NE(run_flashinfer("").status, 0);
  CliResult r = run_flashinfer("frobnicate");
  EXPECT_NE(r.status, 0);
}

// A usage mistake is named, with the closest valid spelling when one is close, and the valid
// ones listed; exit status 2.
TEST(Cli, UnknownCommandsAndOptionsNameTheMistakeAndTheClosestSpelling) {
  const std::string commands =
      "commands: version, info, list-ops, replay, show, diff, repro, export, bench, jit, trace";
  CliResult r = run_flashinfer("bogus");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("flashinfer: unknown command 'bogus'\n" + commands), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("did you mean"), std::string::npos) << r.out;
  for (const auto& [typo, meant] :
       std::vector<std::pair<std::string, std::string>>{{"shw", "show"},
                                                        {"replya", "replay"},
                                                        {"lsit-ops", "list-ops"},
                                                        {"infoo", "info"},
                                                        {"expor", "export"},
                                                        {"benc", "bench"}}) {
    r = run_flashinfer(typo + " --dir x");
    EXPECT_EQ(r.status, 2) << typo;
    EXPECT_NE(
        r.out.find("unknown command '" + typo + "'; did you mean '" + meant + "'?\n" + commands),
        std::string::npos)
        << r.out;
  }
  r = run_flashinfer("");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("flashinfer: a command is required; " + commands), std::string::npos)
      << r.out;
  // Options: of the tool, then of a command (the value after a known option is not checked).
  r = run_flashinfer("--hlep");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("flashinfer: unknown option '--hlep'; did you mean '--help'?"),
            std::string::npos)
      << r.out;
  r = run_flashinfer("show --dri /nonexistent");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("flashinfer show: unknown option '--dri'; did you mean '--dir'?\n"
                       "options: --help, -h, --dir, --verbose, -v"),
            std::string::npos)
      << r.out;
  r = run_flashinfer("replay --dir /nonexistent --devcie=cpu");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("flashinfer replay: unknown option '--devcie'; did you mean '--device'?"),
            std::string::npos)
      << r.out;
  r = run_flashinfer("replay --dir /nonexistent --frobnicate");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("flashinfer replay: unknown option '--frobnicate'\noptions: "),
            std::string::npos)
      << r.out;
  // Known options with a bad value keep CLI11's message, which names the value.
  r = run_flashinfer("replay --dir /nonexistent --rtol lots");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out.find("unknown option"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lots"), std::string::npos) << r.out;
  // A value that looks like an option is not taken for one.
  r = run_flashinfer("replay --dir /nonexistent --rtol -1");
  EXPECT_EQ(r.out.find("unknown option"), std::string::npos) << r.out;
}

// `flashinfer info` names the CPU kernels' tier and, below the top one, what the CPU lacks.
TEST(Cli, InfoNamesTheCpuTierAndWhy) {
  namespace k = flashinfer::kernels::cpu;
  const CliResult r = run_flashinfer("info");
  EXPECT_EQ(r.status, 0);
  const k::CpuFeatures f = k::cpu_features();
  std::string tier = "scalar (";
  if (k::cpu_isa() == k::CpuIsa::kAvx512) {
    tier = f.avx512_bf16 ? "AVX-512 BF16 (" : "AVX-512 (";
  } else if (k::cpu_isa() == k::CpuIsa::kAvx2) {
    tier = "AVX2 (AVX2, FMA, F16C with OS support; not AVX-512: no ";
  }
  EXPECT_NE(r.out.find("\nCPU tier: " + tier), std::string::npos) << r.out;
  if (k::cpu_isa() == k::CpuIsa::kAvx2 && !f.avx512f) {
    EXPECT_NE(r.out.find("not AVX-512: no AVX512F"), std::string::npos) << r.out;
  }
}

TEST(Cli, VersionMatchesTheLibrary) {
  CliResult r = run_flashinfer("version");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, std::string(flashinfer::version()) + "\n");
}

TEST(Cli, InfoReportsBuildAndDevices) {
  CliResult r = run_flashinfer("info");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("flashinfer-cpp " + std::string(flashinfer::version())), std::string::npos);
  EXPECT_NE(
      r.out.find(flashinfer::cuda_compiled() ? "CUDA compiled in: yes" : "CUDA compiled in: no"),
      std::string::npos)
      << r.out;
  // Which GEMM libraries serve the `backend=` names.
  const flashinfer::BuildInfo& b = flashinfer::build_info();
  EXPECT_NE(
      r.out.find(!b.cuda   ? "GEMM libraries: none"
                 : b.cudnn ? ", cuDNN (backend 'cudnn'; headers " + std::string(b.cudnn_version)
                           : std::string("; no cuDNN in this build")),
      std::string::npos)
      << r.out;
  // Whether grouped_mm_bf16's CUTLASS path is built (it needs CUDA).
  if (b.cuda) {
    EXPECT_TRUE(r.out.find("; CUTLASS (grouped_mm_bf16 on sm_90") != std::string::npos ||
                r.out.find("; no CUTLASS in this build") != std::string::npos)
        << r.out;
  } else {
    EXPECT_EQ(r.out.find("CUTLASS"), std::string::npos) << r.out;
  }
  // The libcudnn the process loads: a version (or why not), in a build with cuDNN.
  if (b.cuda && b.cudnn) {
    const std::string loaded = flashinfer::cudnn_runtime_version();
    EXPECT_FALSE(loaded.empty());
    EXPECT_NE(r.out.find("libcudnn loaded: " + loaded), std::string::npos) << r.out;
  } else {
    EXPECT_EQ(flashinfer::cudnn_runtime_version(), "");
  }
  // Whether the cudnn_* attention ops can run cuDNN's SDPA graph.
  EXPECT_NE(
      r.out.find(b.cuda && b.cudnn ? "cuDNN attention: yes (SDPA graph" : "cuDNN attention: no ("),
      std::string::npos)
      << r.out;
  if (flashinfer::cuda_device_count() == 0) {
    EXPECT_NE(r.out.find("CPU-only mode"), std::string::npos) << r.out;
  } else {
    EXPECT_NE(r.out.find("GPU 0:"), std::string::npos) << r.out;
  }
}

// With CUDA compiled in, info lists the kernels' switches and which of them this environment
// sets: the flipping value says "in effect", another value is shown but keeps the default.
TEST(Cli, InfoListsTheKernelSwitchesAndTheirValues) {
  const std::string bin = std::string(FLASHINFER_TEST_BIN_DIR) + "/flashinfer info";
  const auto plain =
      run_command("env -u FLASHINFER_DECODE_TENSOR_CORES -u FLASHINFER_PREFILL_SM90 " + bin);
  // The CPU kernels' switches in every build.
  EXPECT_NE(plain.out.find("  FLASHINFER_CPU_ONEDNN=0: "), std::string::npos) << plain.out;
  if (plain.out.find("CUDA compiled in: yes") == std::string::npos) {
    EXPECT_EQ(plain.out.find("FLASHINFER_DECODE_TENSOR_CORES"), std::string::npos) << plain.out;
    GTEST_SKIP() << "no CUDA backend: no CUDA kernel switches";
  }
  EXPECT_NE(plain.out.find("FLASHINFER_DECODE_TENSOR_CORES=0: decode without use_tensor_cores on "
                           "the CUDA-core kernel at every GQA group [unset]"),
            std::string::npos)
      << plain.out;
  for (const char* name : {"FLASHINFER_PREFILL_SM90=0", "FLASHINFER_PREFILL_SM90_PINGPONG=1",
                           "FLASHINFER_DECODE_ROWS_PER_THREAD=1", "FLASHINFER_MLA_TENSOR_CORES=0",
                           "FLASHINFER_GROUPED_MM_CUTLASS=0", "FLASHINFER_MOE_GROUPED=0",
                           "FLASHINFER_CUDA_CACHING_ALLOCATOR=0"}) {
    EXPECT_NE(plain.out.find(std::string("  ") + name + ": "), std::string::npos) << name;
  }
  const auto set = run_command("FLASHINFER_DECODE_TENSOR_CORES=0 FLASHINFER_PREFILL_SM90=1 " + bin);
  EXPECT_NE(set.out.find("every GQA group [set to \"0\": in effect]"), std::string::npos)
      << set.out;
  EXPECT_NE(set.out.find("Hopper kernel (sm_90) [set to \"1\"]"), std::string::npos) << set.out;
}

// The switch list is the sources' own: every FLASHINFER_* name the library, its headers or the CLI
// reads is either a kernel switch or one of the known settings below (logging, recording, JIT,
// paths, limits), and every switch is still read somewhere. A new variable that steers a kernel
// must join kernel_switches.h, or bench rows made with it would not say so.
TEST(Cli, KernelSwitchListMatchesTheVariablesTheSourcesRead) {
  namespace fs = std::filesystem;
  const std::set<std::string> settings = {
      "FLASHINFER_LOGLEVEL", "FLASHINFER_LOGDEST", "FLASHINFER_HOST_CACHE_MB",
      "FLASHINFER_WORKSPACE_BASE", "FLASHINFER_MODEL_PATH", "FLASHINFER_CUDA_ARCH_LIST",
      "FLASHINFER_NVCC_THREADS", "FLASHINFER_JIT_VERBOSE", "FLASHINFER_JIT_DEBUG",
      "FLASHINFER_JIT_AOT_DIR", "FLASHINFER_TRACE_DUMP", "FLASHINFER_TRACE_DUMP_DIR",
      // Upstream's own settings: its quantizers' NVFP4 recipe (4over6, its error mode and fast
      // error, the exact-math association), read as upstream reads them.
      "FLASHINFER_NVFP4_4OVER6", "FLASHINFER_NVFP4_4OVER6_ERR_MODE",
      "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH", "FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH"};
  const std::regex name(R"re("(FLASHINFER_[A-Z0-9_]*[A-Z0-9])")re");
  std::set<std::string> read;
  for (const char* sub : {"src", "include", "tools"}) {
    for (const auto& e :
         fs::recursive_directory_iterator(fs::path(FLASHINFER_TEST_SOURCE_DIR) / sub)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh")) {
        continue;
      }
      if (e.path().filename() == "kernel_switches.h") continue;  // the list itself
      std::ifstream in(e.path());
      std::stringstream text;
      text << in.rdbuf();
      const std::string t = text.str();
      for (std::sregex_iterator it(t.begin(), t.end(), name), end; it != end; ++it) {
        read.insert((*it)[1].str());
      }
    }
  }
  std::set<std::string> switches;
  for (const auto& k : flashinfer::cli::kKernelSwitches) switches.insert(k.name);
  ASSERT_GE(read.size(), 10u) << "the scan found too few names: wrong source dir?";
  for (const std::string& n : read) {
    const bool recorder = n.rfind("FLASHINFER_DUMP_", 0) == 0;  // the Flight Recorder's settings
    EXPECT_TRUE(switches.count(n) || settings.count(n) || recorder)
        << n << " is read by the sources: a kernel switch (kernel_switches.h) or a setting?";
  }
  for (const std::string& n : switches) {
    EXPECT_TRUE(read.count(n)) << n << " is listed as a switch but no source reads it";
  }
}

TEST(Cli, InfoReportsTheHostCacheLimitFromTheEnvironment) {
  const std::string bin = std::string(FLASHINFER_TEST_BIN_DIR) + "/flashinfer info";
  EXPECT_NE(run_command("env -u FLASHINFER_HOST_CACHE_MB " + bin).out.find("limit 1024 MiB"),
            std::string::npos);
  EXPECT_NE(run_command("FLASHINFER_HOST_CACHE_MB=0 " + bin).out.find("host cache: limit 0 MiB"),
            std::string::npos);
  EXPECT_NE(run_command("FLASHINFER_HOST_CACHE_MB=64 " + bin).out.find("limit 64 MiB"),
            std::string::npos);
  // Not a number of MiB (also a negative one): the default, not 0 or "unlimited", and a warning.
  for (const char* bad : {"lots", "-1", "64MB", "99999999999999999999"}) {
    const auto r = run_command(std::string("FLASHINFER_HOST_CACHE_MB=") + bad + " " + bin);
    EXPECT_NE(r.out.find("limit 1024 MiB"), std::string::npos) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("warning: FLASHINFER_HOST_CACHE_MB"), std::string::npos) << bad;
  }
}

TEST(Cli, ListOpsComesFromTheDeclarations) {
  CliResult r = run_flashinfer("list-ops");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("rmsnorm"), std::string::npos);
  EXPECT_NE(r.out.find("flashinfer.norm"), std::string::npos);
  EXPECT_NE(r.out.find("(input, weight, eps=1e-06, out=None, enable_pdl=None)"), std::string::npos);
  const auto n = flashinfer::OpRegistry::global().ops().size();
  EXPECT_NE(r.out.find(std::to_string(n) + " ops\n"), std::string::npos) << r.out;
  CliResult v = run_flashinfer("list-ops -v --module flashinfer.norm");
  EXPECT_EQ(v.status, 0);
  EXPECT_NE(v.out.find("bool | None"), std::string::npos) << v.out;
  CliResult none = run_flashinfer("list-ops --module no.such.module");
  EXPECT_NE(none.out.find("0 ops"), std::string::npos);
}

}  // namespace
