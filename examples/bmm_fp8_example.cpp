// The logging page's bmm_fp8 producer/reproducer, in C++. The producer quantizes random bf16
// inputs to e4m3 with per-tensor scales (to_float8), calls bmm_fp8 with a column-major B and a
// pre-allocated bf16 out, and captures the call the way the flight recorder sees it (a
// CallObserver receiving the arguments as Values). The reproducer rebuilds the call from those
// Values through the op's declaration and checks the output matches. Exit status 0 on a match.
//   bmm_fp8_example [--device cpu|cuda]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;

// Per-tensor FP8 quantization: returns (x_fp8, dequantization scale = amax / 448).
std::pair<Tensor, Tensor> to_float8(const Tensor& x, Device device) {
  std::vector<double> v = x.to_double_vector();
  double amax = 1e-12;
  for (double e : v) amax = std::max(amax, std::fabs(e));
  const double scale = 448.0 / amax;
  for (double& e : v) e = std::clamp(e * scale, -448.0, 448.0);
  Tensor q = Tensor::from_vector(v, x.shape(), DType::kFloat8E4M3FN).to(device);
  Tensor inv = Tensor::from_vector({1.0 / scale}, {1}, DType::kFloat32).to(device);
  return {q, inv};
}

// Keeps the arguments of every bmm_fp8 call, as the recorder would dump them.
class Capture : public CallObserver {
 public:
  std::vector<Value> args;
  void on_call_begin(const OpDecl& decl, std::span<const Value> a) override {
    if (decl.name == "bmm_fp8") args.assign(a.begin(), a.end());
  }
  void on_call_end(const OpDecl&, std::span<const Value>, const Value&) override {}
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view) override {}
};

}  // namespace

int main(int argc, char** argv) {
  Device device = Device::cpu();
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0) device = Device::parse(argv[i + 1]);
  }
  // Producer.
  const int64_t b = 4, m = 64, n = 128, k = 256;
  Tensor input_bf16 = Tensor::empty({b, m, k}, DType::kBFloat16).normal_(1);
  Tensor mat2_bf16 = Tensor::empty({b, n, k}, DType::kBFloat16).normal_(2);  // [b, n, k]
  auto [input_fp8, input_inv_s] = to_float8(input_bf16, device);
  auto [mat2_rows, mat2_inv_s] = to_float8(mat2_bf16, device);
  Tensor mat2_fp8 = mat2_rows.transpose(-2, -1);  // row major -> column major [b, k, n]
  Tensor res = Tensor::empty({b, m, n}, DType::kBFloat16, device);

  auto capture = std::make_shared<Capture>();
  add_call_observer(capture);
  bmm_fp8(input_fp8, mat2_fp8, input_inv_s, mat2_inv_s, DType::kBFloat16, res, "cublas");
  remove_call_observer(capture);
  const std::vector<double> expected = res.to_double_vector();
  std::printf("Output shape: (%lld, %lld, %lld)\nOutput[0, :3, :3]:\n", (long long)b, (long long)m,
              (long long)n);
  for (int i = 0; i < 3; ++i) {
    std::printf("  %10.4f %10.4f %10.4f\n", expected[i * n], expected[i * n + 1],
                expected[i * n + 2]);
  }

  // Reproducer: rebuild the call from the captured Values with a fresh output buffer.
  const OpDecl* decl = OpRegistry::global().find("bmm_fp8");
  std::vector<Value> args = capture->args;
  args[5] = Value(Tensor::empty({b, m, n}, DType::kBFloat16, device));
  const Value replayed = decl->invoke(CallArgs(*decl, args));
  const std::vector<double> got = replayed.as_tensor().to_double_vector();
  double max_diff = 0.0;
  for (size_t i = 0; i < got.size(); ++i)
    max_diff = std::max(max_diff, std::fabs(got[i] - expected[i]));
  const bool ok = max_diff <= 1e-3;
  std::printf("%s: replayed %s.%s, max diff %g\n", ok ? "match" : "MISMATCH", decl->module.c_str(),
              decl->name.c_str(), max_diff);
  return ok ? 0 : 1;
}
