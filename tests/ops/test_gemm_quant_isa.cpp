// The CPU quantizers' row kernels are compiled for the baseline target, AVX2 and AVX-512 and
// picked at run time; tests/ops/test_quantization.cpp checks the picked one bit by bit against
// the reference formulas. Here every instruction set this CPU has must give the same bytes as the
// baseline build, on random data mixed with the special values (NaN, infinities, subnormals,
// signed zeros, saturating magnitudes), for each input dtype, block size, scale layout and a
// strided input.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "api/quantize_params.h"
#include "flashinfer/flashinfer.h"
#include "kernels/cpu/quantization_cpu.h"

namespace flashinfer {
namespace {

using kernels::SfLayoutCode;
using kernels::cpu::CpuIsa;
using kernels::cpu::detected_cpu_isa;

std::vector<CpuIsa> vector_isas() {
  std::vector<CpuIsa> v;
  for (CpuIsa i : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (i <= detected_cpu_isa()) v.push_back(i);
  }
  return v;
}

// [m, k] input of `dt` (as its bits, in a wider row of `pitch` elements) with special values
// sprinkled in: every 7th element is one of them.
Tensor mixed_input(int64_t m, int64_t k, int64_t pitch, DType dt, uint64_t seed) {
  Tensor t = Tensor::empty({m, pitch}, DType::kFloat32).normal_(seed, 0, 3).to(dt);
  const std::vector<double> specials = {0.0,  -0.0,  1e30,   -1e30, 1e-40, -3e-39,
                                        1e-6, 448.0, -500.0, 6.0,   0.25,  65504.0};
  std::vector<double> v = t.to_double_vector();
  for (size_t i = 0; i < v.size(); i += 7) v[i] = specials[(i / 7) % specials.size()];
  v[3] = std::numeric_limits<double>::infinity();
  v[pitch + 5] = -std::numeric_limits<double>::infinity();
  v[2 * pitch + 1] = std::numeric_limits<double>::quiet_NaN();
  Tensor r = Tensor::from_vector(v, {m, pitch}, dt);
  return r.slice(1, 0, k);
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  return std::vector<uint8_t>(p, p + t.numel() * static_cast<int64_t>(t.element_size()));
}

struct Fp4Out {
  std::vector<uint8_t> q, sf;
};

Fp4Out run_fp4(const Tensor& x, int vec, bool ue8m0, SfLayoutCode layout, bool strided,
               CpuIsa isa) {
  const int64_t m = x.size(0), k = x.size(1);
  const Tensor in = strided ? x.transpose(0, 1).contiguous().transpose(0, 1) : x;
  Tensor q = Tensor::zeros({m, k / 2}, DType::kUInt8);
  const int64_t sf_size = kernels::sf_buffer_size(layout, m, k / vec);
  Tensor sf = Tensor::full({sf_size}, 7, DType::kUInt8);  // the kernel must write every byte
  const float gs = 448.0f * 6.0f / 40.0f;
  auto p = api::quantize_params<kernels::Fp4QuantizeParams>(in, q, sf, layout);
  p.global_scale = ue8m0 ? nullptr : &gs;
  p.sf_vec_size = vec;
  p.ue8m0 = ue8m0;
  kernels::cpu::fp4_quantize_with(p, isa);
  return {bytes_of(q), bytes_of(sf)};
}

TEST(QuantizerIsa, Fp4EveryIsaGivesTheBaselineBytes) {
  const int64_t m = 37, k = 96;
  for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3FN}) {
    const Tensor x = mixed_input(m, k, k + 8, dt, 1 + static_cast<uint64_t>(dt));
    for (auto [vec, ue8m0] : {std::pair<int, bool>{16, false}, {32, true}}) {
      for (SfLayoutCode layout :
           {SfLayoutCode::k128x4, SfLayoutCode::k8x4, SfLayoutCode::kLinear}) {
        for (bool strided : {false, true}) {
          const Fp4Out base = run_fp4(x, vec, ue8m0, layout, strided, CpuIsa::kScalar);
          for (CpuIsa isa : vector_isas()) {
            const Fp4Out got = run_fp4(x, vec, ue8m0, layout, strided, isa);
            EXPECT_EQ(got.q, base.q) << dtype_torch_name(dt) << " vec " << vec << " isa "
                                     << static_cast<int>(isa) << " strided " << strided;
            EXPECT_EQ(got.sf, base.sf)
                << dtype_torch_name(dt) << " vec " << vec << " isa " << static_cast<int>(isa);
          }
        }
      }
    }
  }
}

TEST(QuantizerIsa, Mxfp8EveryIsaGivesTheBaselineBytes) {
  const int64_t m = 29, k = 160;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor x = mixed_input(m, k, k + 3, dt, 9 + static_cast<uint64_t>(dt));
    for (bool strided : {false, true}) {
      const Tensor in = strided ? x.transpose(0, 1).contiguous().transpose(0, 1) : x;
      auto run = [&](CpuIsa isa) {
        Tensor q = Tensor::zeros({m, k}, DType::kUInt8);
        const int64_t sf_size = kernels::sf_buffer_size(SfLayoutCode::k128x4, m, k / 32);
        Tensor sf = Tensor::full({sf_size}, 7, DType::kUInt8);
        const auto p =
            api::quantize_params<kernels::Mxfp8QuantizeParams>(in, q, sf, SfLayoutCode::k128x4);
        kernels::cpu::mxfp8_quantize_with(p, isa);
        return std::pair(bytes_of(q), bytes_of(sf));
      };
      const auto base = run(CpuIsa::kScalar);
      for (CpuIsa isa : vector_isas()) {
        const auto got = run(isa);
        EXPECT_EQ(got.first, base.first)
            << dtype_torch_name(dt) << " isa " << static_cast<int>(isa);
        EXPECT_EQ(got.second, base.second)
            << dtype_torch_name(dt) << " isa " << static_cast<int>(isa);
      }
    }
  }
}

}  // namespace
}  // namespace flashinfer
