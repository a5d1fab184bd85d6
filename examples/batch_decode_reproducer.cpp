// The logging page's BatchDecodeWithPagedKVCacheWrapper reproducer, in C++: replay_sequence
// recreates the wrapper (__init__), re-plans it and re-runs it with one object registry, and
// compares the outputs. Exit status 0 when every call passed.
//   batch_decode_reproducer [DUMP_DIR] [--device cuda]
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "flashinfer/flashinfer.h"
#include "flashinfer/replay.h"

using namespace flashinfer;

int main(int argc, char** argv) {
  std::string dump_dir = "./batch_decode_dumps";
  Device device = Device::cpu();
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      device = Device::parse(argv[++i]);
    } else {
      dump_dir = argv[i];
    }
  }
  const auto results = replay::replay_sequence(dump_dir, device);
  int passed = 0, failed = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    const std::string dir = std::filesystem::path(r.dump_dir).filename().string();
    if (r.status == replay::Status::kError) {
      std::printf("[%zu] %s (%s): ❌ Error: %s\n", i + 1, r.function_name.c_str(), dir.c_str(),
                  r.error.c_str());
      ++failed;
    } else if (r.status == replay::Status::kPassed) {
      std::printf("[%zu] %s (%s): ✅ Passed\n", i + 1, r.function_name.c_str(), dir.c_str());
      ++passed;
    } else {
      std::printf("[%zu] %s (%s): ❌ Mismatch\n", i + 1, r.function_name.c_str(), dir.c_str());
      ++failed;
    }
  }
  std::printf("\nSummary: %d passed, %d failed\n", passed, failed);
  for (const auto& r : results) {
    if (r.function_name.ends_with(".run") && r.result.kind() == Value::Kind::kTuple) {
      const auto out = r.result.items()[0].as_tensor().to_double_vector();
      const auto lse = r.result.items()[1].as_tensor().to_double_vector();
      std::printf("\nReplayed output[0, :3, :3]: %.4f %.4f %.4f ...\n", out[0], out[1], out[2]);
      std::printf("Replayed LSE[0, :5]: %.4f %.4f %.4f %.4f %.4f\n", lse[0], lse[1], lse[2], lse[3],
                  lse[4]);
      break;
    }
  }
  return (failed == 0 && passed == 3) ? 0 : 1;
}
