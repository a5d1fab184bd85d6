// Per-op backend tables (src/api/kernel_table.h): dispatch, refusals, and the index the tools
// and replay read.
#include <gtest/gtest.h>

#include <string>

#include "api/kernel_table.h"
#include "flashinfer/flashinfer.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

int g_ran = 0;

constexpr api::KernelEntry<int> kCpuOnly[] = {
    {DeviceType::kCPU, "test kernel",
     [](const int& p) {
       return p >= 0 ? api::Refusal{} : api::Refusal{"count", "must not be negative here"};
     },
     [](const int& p, const api::LaunchContext& c) {
       EXPECT_TRUE(c.device.is_cpu());
       EXPECT_EQ(c.stream, nullptr);
       EXPECT_FALSE(c.enable_pdl);
       g_ran = p;
     }},
};

TEST(KernelTable, LaunchRunsTheDevicesEntry) {
  g_ran = 0;
  api::launch(kCpuOnly, 7, Device::cpu(), "test_op", "x");
  EXPECT_EQ(g_ran, 7);
}

TEST(KernelTable, RefusalNamesItsArgumentAndReason) {
  g_ran = 0;
  try {
    api::launch(kCpuOnly, -1, Device::cpu(), "test_op", "x");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    const std::string what = e.what();
    EXPECT_EQ(e.op(), "test_op");
    EXPECT_EQ(e.arg(), "count");
    EXPECT_NE(what.find("must not be negative here"), std::string::npos) << what;
    EXPECT_NE(what.find("test kernel"), std::string::npos) << what;
  }
  EXPECT_EQ(g_ran, 0);  // refused before launching
}

TEST(KernelTable, NoEntryForTheDeviceIsAnErrorNamingTheArgument) {
  try {
    api::launch(kCpuOnly, 1, Device::cuda(), "test_op", "x");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    const std::string what = e.what();
    EXPECT_EQ(e.op(), "test_op");
    EXPECT_EQ(e.arg(), "x");
    if (cuda_compiled()) {
      EXPECT_NE(what.find("no cuda kernel for this op"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find("CUDA tensor given to a build without the CUDA backend"),
                std::string::npos)
          << what;
    }
  }
}

// Every built-in op has a CPU reference in its table, and a CUDA entry exactly when this build
// has the CUDA backend (every area has CUDA kernels, except the host-side dequantizers).
TEST(KernelTable, EveryDeclaredOpHasABackendTable) {
  for (const OpDecl* d : OpRegistry::global().ops()) {
    SCOPED_TRACE(d->name);
    const auto backends = op_backends(d->name);
    ASSERT_FALSE(backends.empty());
    EXPECT_EQ(backends.front(), "cpu");
    EXPECT_TRUE(op_has_backend(d->name, DeviceType::kCPU));
    if (!cuda_compiled()) {
      EXPECT_FALSE(op_has_backend(d->name, DeviceType::kCUDA));
    }
    for (const auto& [backend, impl] : op_backend_implementations(d->name)) {
      EXPECT_FALSE(impl.empty()) << backend;
    }
  }
  EXPECT_TRUE(op_backends("no_such_op").empty());
  if (cuda_compiled()) {
    EXPECT_TRUE(op_has_backend("rmsnorm", DeviceType::kCUDA));
    EXPECT_TRUE(op_has_backend("BatchDecodeWithPagedKVCacheWrapper.run", DeviceType::kCUDA));
    EXPECT_FALSE(op_has_backend("mxfp8_dequantize_host", DeviceType::kCUDA));
  }
}

}  // namespace
}  // namespace flashinfer
