// Instructions per call of the API logging paths, for docs/PERFORMANCE.md: timings on a shared
// machine are noisy, instruction counts are not. Run under callgrind:
//   valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=cg.out
//            build/bin/callgrind_api_log gated 3
//   (then: instructions per call = the "totals:" line of cg.out / 200)
// Modes: direct (the CPU kernel, no gate), gated (the same body through call_api with rmsnorm's
// declaration), public (rmsnorm()); the second argument is the log level (log file in /tmp).
#include <valgrind/callgrind.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "flashinfer/api_log.h"
#include "flashinfer/flashinfer.h"
#include "kernels/cpu/norm_cpu.h"

using namespace flashinfer;

namespace {
const OpDecl& rmsnorm_decl() {
  static const OpDecl& d = *OpRegistry::global().find("rmsnorm");
  return d;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s direct|gated|public LEVEL\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const int m = mode == "direct" ? 0 : mode == "gated" ? 1 : 2;
  Tensor x = Tensor::empty({4, 256}, DType::kFloat16);
  x.uniform_(1);
  Tensor w = Tensor::empty({256}, DType::kFloat16);
  w.uniform_(2);
  Tensor out = Tensor::empty({4, 256}, DType::kFloat16);
  kernels::RmsNormParams p;
  p.input = x.data_ptr();
  p.weight = w.data_ptr();
  p.out = out.data_ptr();
  p.dtype = DType::kFloat16;
  p.batch = 4;
  p.hidden = 256;
  p.in_stride_b = 256;
  p.out_stride_b = 256;
  p.eps = 1e-6f;
  const std::string log = "/tmp/callgrind_api_log_" + std::to_string(std::rand()) + ".log";
  api_log::set_destination(log);
  api_log::set_level(std::atoi(argv[2]));
  rmsnorm_decl();
  const double eps = 1e-6;
  const std::optional<Tensor> o = out;
  const std::optional<bool> pdl;
  auto once = [&] {
    if (m == 0) {
      Tensor r = [&] {
        kernels::cpu::rmsnorm(p);
        return out;
      }();
      return r.data_ptr();
    }
    if (m == 1) {
      Tensor r = call_api(
          &rmsnorm_decl,
          [&] {
            kernels::cpu::rmsnorm(p);
            return out;
          },
          x, w, eps, o, pdl);
      return r.data_ptr();
    }
    Tensor r = rmsnorm(x, w, 1e-6, out);
    return r.data_ptr();
  };
  for (int i = 0; i < 20; ++i) once();  // warm-up: banner, tables, allocator
  CALLGRIND_ZERO_STATS;
  CALLGRIND_START_INSTRUMENTATION;
  for (int i = 0; i < 200; ++i) once();
  CALLGRIND_STOP_INSTRUMENTATION;
  api_log::set_level(0);
  std::remove(log.c_str());
  return 0;
}
