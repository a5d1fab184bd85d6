// `flashinfer jit build|ls|clear` (docs/JIT.md): an AOT set built from a SPECS file, listed, served
// read-only to a lookup, and the user cache cleared. Compiling needs NVRTC (a CUDA build), not a
// GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "jit/jit.h"
#include "util/run_command.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;
using testing::run_command;

TEST(CliJit, BuildListClear) {
  const fs::path tmp = fs::temp_directory_path() / ("fi_cli_jit_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  std::ofstream(tmp / "specs.txt") << "# one module\n"
                                      "attention_cuda_core q=float16 kv=float16 o=float16 "
                                      "head_dim_qk=48 head_dim_vo=48  # comment\n\n";
  std::ofstream(tmp / "bad.txt") << "attention_mma dtype=float16 head_dim=72\n";
  const std::string env = "FLASHINFER_WORKSPACE_BASE=" + tmp.string() + " ";
  const std::string bin = std::string(FLASHINFER_TEST_BIN_DIR) + "/flashinfer ";

  if (!jit::compiler_available()) {
    // A build without CUDA refuses to compile (exit 4) before it reads the list.
    const auto r = run_command(env + bin + "jit build --list " + (tmp / "specs.txt").string() +
                               " --out " + (tmp / "aot").string() + " --arch sm_80");
    EXPECT_EQ(r.status, 4) << r.out;
    fs::remove_all(tmp);
    GTEST_SKIP() << "built without CUDA (no NVRTC)";
  }
  auto r = run_command(env + bin + "jit build --list " + (tmp / "bad.txt").string() + " --out " +
                       (tmp / "aot").string() + " --arch sm_80");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("bad.txt:1"), std::string::npos) << r.out;
  r = run_command(env + bin + "jit build --list " + (tmp / "specs.txt").string() + " --out " +
                  (tmp / "aot").string());
  EXPECT_EQ(r.status, 2) << r.out;  // no --arch and no FLASHINFER_CUDA_ARCH_LIST
  r = run_command(env + "FLASHINFER_CUDA_ARCH_LIST=8.0 " + bin + "jit build --list " +
                  (tmp / "specs.txt").string() + " --out " + (tmp / "aot").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("built    sm_80 attention_cuda_core_float16_float16_float16_48_48_"),
            std::string::npos)
      << r.out;
  // Again: already present, nothing compiled.
  r = run_command(env + bin + "jit build --list " + (tmp / "specs.txt").string() + " --out " +
                  (tmp / "aot").string() + " --arch sm_80");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("present  sm_80"), std::string::npos) << r.out;

  r = run_command(env + bin + "jit ls --dir " + (tmp / "aot").string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("1 entries"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attention_cuda_core_float16_float16_float16_48_48_"), std::string::npos);
  EXPECT_EQ(r.out.find("CORRUPT"), std::string::npos) << r.out;

  // `ls` shows the user cache and the AOT roots; `clear` empties the user cache only.
  r = run_command(env + "FLASHINFER_JIT_AOT_DIR=" + (tmp / "aot").string() + " " + bin + "jit ls");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("cache " + (tmp / ".cache" / "flashinfer-cpp").string() + ": 0 entries"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("aot (read-only) " + (tmp / "aot").string() + ": 1 entries"),
            std::string::npos)
      << r.out;
  r = run_command(env + "FLASHINFER_JIT_AOT_DIR=" + (tmp / "aot").string() + " " + bin +
                  "jit clear");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(jit::list_entries(tmp / "aot").size(), 1u);
  r = run_command(env + bin + "jit clear --dir " + (tmp / "aot").string());
  EXPECT_NE(r.out.find("removed 1 entries"), std::string::npos) << r.out;
  EXPECT_TRUE(jit::list_entries(tmp / "aot").empty());
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace flashinfer
