// The logging page's bmm_fp8 producer, in C++: quantize random bf16 inputs to e4m3 with
// per-tensor scales, call bmm_fp8 with a column-major B and a pre-allocated bf16 out. Run it
// with the flight recorder on:
//   FLASHINFER_LOGLEVEL=10 FLASHINFER_DUMP_DIR=./bmm_fp8_dumps bmm_fp8_producer [--device cuda]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "flashinfer/flashinfer.h"

using namespace flashinfer;

// Per-tensor FP8 quantization: (x_fp8, dequantization scale = amax / 448), as the page's
// to_float8. `x` is [b, r, c], either contiguous or the transpose of a contiguous [b, c, r]; the
// result keeps that layout (B must stay column-major).
static std::pair<Tensor, Tensor> to_float8(const Tensor& x, Device device) {
  std::vector<double> v = x.to_double_vector();
  double amax = 1e-12;
  for (double e : v) amax = std::max(amax, std::fabs(e));
  const double scale = 448.0 / amax;
  for (double& e : v) e = std::clamp(e * scale, -448.0, 448.0);
  Tensor q = Tensor::from_vector(v, x.shape(), DType::kFloat8E4M3FN);
  const bool transposed = !x.is_contiguous();
  Tensor base = transposed ? Tensor::empty({x.size(0), x.size(2), x.size(1)}, DType::kFloat8E4M3FN)
                           : Tensor::empty(x.shape(), DType::kFloat8E4M3FN);
  (transposed ? base.transpose(1, 2) : base).copy_(q);
  base = base.to(device);  // contiguous storage moves as is
  return {transposed ? base.transpose(1, 2) : base,
          Tensor::from_vector({1.0 / scale}, {1}, DType::kFloat32).to(device)};
}

int main(int argc, char** argv) {
  Device device = Device::cpu();
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0) device = Device::parse(argv[i + 1]);
  }
  const int64_t b = 4, m = 64, n = 128, k = 256;
  Tensor input_bf16 = Tensor::empty({b, m, k}, DType::kBFloat16);
  input_bf16.normal_(1);
  Tensor mat2_bf16 = Tensor::empty({b, n, k}, DType::kBFloat16).transpose(-2, -1);  // column-major
  mat2_bf16.normal_(2);
  auto [input_fp8, input_inv_s] = to_float8(input_bf16, device);
  auto [mat2_fp8, mat2_inv_s] = to_float8(mat2_bf16, device);
  Tensor res = Tensor::empty({b, m, n}, DType::kBFloat16, device);
  // Logged and dumped at level 10.
  bmm_fp8(input_fp8, mat2_fp8, input_inv_s, mat2_inv_s, DType::kBFloat16, res, "cublas");
  const auto v = res.to_double_vector();
  std::printf("Output shape: %s\nOutput[0, :3, :3]:\n", shape_to_string(res.shape()).c_str());
  for (int r = 0; r < 3; ++r)
    std::printf("  %10.4f %10.4f %10.4f\n", v[r * n], v[r * n + 1], v[r * n + 2]);
  return 0;
}
