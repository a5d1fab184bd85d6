// A user program built against the installed package: runs rmsnorm and checks one value.
#include <cmath>
#include <cstdio>

#include "flashinfer/flashinfer.h"

int main() {
  using namespace flashinfer;
  Tensor x = Tensor::from_vector({3.0, 4.0}, {1, 2}, DType::kFloat32);
  Tensor w = Tensor::from_vector({1.0, 2.0}, {2}, DType::kFloat32);
  Tensor y = rmsnorm(x, w, 0.0);
  // rms([3, 4]) = sqrt(12.5); y = [3, 8] / sqrt(12.5)
  const double e0 = 3.0 / std::sqrt(12.5), e1 = 8.0 / std::sqrt(12.5);
  const auto v = y.to_double_vector();
  std::printf("consumer: flashinfer %s rmsnorm -> [%.6f, %.6f]\n", std::string(version()).c_str(),
              v[0], v[1]);
  return (std::fabs(v[0] - e0) < 1e-6 && std::fabs(v[1] - e1) < 1e-6) ? 0 : 1;
}
