// The logging page's bmm_fp8 reproducer, in C++: find the latest bmm_fp8 dump, rebuild the call
// with replay_from_dump (run = false), call bmm_fp8 with the rebuilt arguments, and compare
// with the recorded output. Exit status 0 when it matches.
//   bmm_fp8_reproducer [DUMP_DIR] [--device cuda]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "flashinfer/flashinfer.h"
#include "flashinfer/replay.h"

using namespace flashinfer;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::string dump_dir = "./bmm_fp8_dumps";
  Device device = Device::cpu();
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      device = Device::parse(argv[++i]);
    } else {
      dump_dir = argv[i];
    }
  }
  std::vector<fs::path> dumps;
  for (const auto& e : fs::directory_iterator(dump_dir)) {
    if (e.is_directory() && e.path().filename().string().find("bmm_fp8") != std::string::npos) {
      dumps.push_back(e.path());
    }
  }
  if (dumps.empty()) {
    std::printf("no bmm_fp8 dump in %s\n", dump_dir.c_str());
    return 1;
  }
  std::sort(dumps.begin(), dumps.end());
  std::printf("Loading dump from: %s\n", dumps.back().c_str());
  replay::Options o;
  o.device = device;
  o.run = false;  // we call the function ourselves below
  replay::Result r = replay::replay_from_dump(dumps.back().string(), o);
  if (!r.error.empty()) {
    std::printf("cannot rebuild the call: %s\n", r.error.c_str());
    return 1;
  }
  // args: (A, B, A_scale, B_scale, dtype, out, backend), bound to bmm_fp8's parameters.
  const auto& a = r.args;
  Tensor res = bmm_fp8(
      a[0].as_tensor(), a[1].as_tensor(), a[2].as_tensor(), a[3].as_tensor(), a[4].as_dtype(),
      a[5].is_none() ? std::nullopt : std::optional<Tensor>(a[5].as_tensor()), a[6].as_string());
  std::printf("Replayed output shape: %s\n", shape_to_string(res.shape()).c_str());
  for (const auto& [key, expected] : r.expected) {
    if (key != "result") continue;
    const auto got = res.to_double_vector(), want = expected.to_double_vector();
    double max_diff = 0.0;
    bool ok = got.size() == want.size();
    for (std::size_t i = 0; ok && i < got.size(); ++i) {
      const double d = std::fabs(got[i] - want[i]);
      max_diff = std::max(max_diff, d);
      if (d > 1e-3 + 1e-3 * std::fabs(want[i])) ok = false;
    }
    if (ok) {
      std::printf("\n✅ Output matches expected result!\n");
      return 0;
    }
    std::printf("\n❌ Output mismatch! Max diff: %g\n", max_diff);
    return 1;
  }
  std::printf("no recorded output to compare with\n");
  return 1;
}
