// The smallest use of the public API: rmsnorm on a small fp16 batch, printed next to the same
// formula computed in double.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "flashinfer/flashinfer.h"

int main(int argc, char** argv) {
  using namespace flashinfer;
  Device device = Device::cpu();
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0) device = Device::parse(argv[i + 1]);
  }
  const int64_t batch = 4, hidden = 8;
  Tensor x = Tensor::empty({batch, hidden}, DType::kFloat16, device);
  x.uniform_(/*seed=*/42, -2.0, 2.0);
  Tensor w = Tensor::empty({hidden}, DType::kFloat16, device);
  w.uniform_(/*seed=*/7, 0.5, 1.5);

  Tensor y = rmsnorm(x, w, 1e-6);

  const std::vector<double> xs = x.to_double_vector(), ws = w.to_double_vector();
  const std::vector<double> ys = y.to_double_vector();
  std::printf("flashinfer-cpp %s: rmsnorm on %s, input [%lld, %lld] %s\n",
              std::string(version()).c_str(), device.str().c_str(), (long long)batch,
              (long long)hidden, std::string(dtype_torch_name(x.dtype())).c_str());
  double max_err = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    double ss = 0.0;
    for (int64_t i = 0; i < hidden; ++i) ss += xs[b * hidden + i] * xs[b * hidden + i];
    const double r = 1.0 / std::sqrt(ss / hidden + 1e-6);
    std::printf("row %lld:", (long long)b);
    for (int64_t i = 0; i < hidden; ++i) {
      const double ref = xs[b * hidden + i] * r * ws[i];
      max_err = std::fmax(max_err, std::fabs(ys[b * hidden + i] - ref));
      std::printf(" %8.4f", ys[b * hidden + i]);
    }
    std::printf("\n");
  }
  std::printf("max |out - fp64 formula| = %.3g (fp16 output)\n", max_err);
  return max_err < 1e-2 ? 0 : 1;
}
