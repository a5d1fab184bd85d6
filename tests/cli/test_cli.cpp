// The `flashinfer` command: subcommand table, --help for each, version, info, list-ops.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "flashinfer/flashinfer.h"
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
  if (flashinfer::cuda_device_count() == 0) {
    EXPECT_NE(r.out.find("CPU-only mode"), std::string::npos) << r.out;
  } else {
    EXPECT_NE(r.out.find("GPU 0:"), std::string::npos) << r.out;
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
