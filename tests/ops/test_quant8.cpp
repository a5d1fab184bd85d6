// per_token_group_quant_8bit, packbits, segment_packbits: hand-checked golden values, a bit-exact
// comparison with an independent float implementation over dtypes, group sizes and formats, the
// column-major / TMA-aligned scale layouts, every bad input, record/replay.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "kernels/cpu/quant8_cpu.h"
#include "kernels/quant8_params.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
#include "kernels/cuda/quant8_cuda.h"
#endif

namespace flashinfer::testing {
namespace {

std::vector<double> values(const Tensor& t) {
  Tensor c = t.to(DType::kFloat64).contiguous();
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}
std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel() * static_cast<int64_t>(c.element_size()));
}
Tensor bools(const std::vector<double>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::kBool);
}

TEST(PerTokenGroupQuant8bit, Golden) {
  Tensor x = Tensor::from_vector({1, -2, 0.5, 4}, {1, 4}, DType::kFloat32);
  auto [q, s] = per_token_group_quant_8bit(x, 2);
  EXPECT_EQ(q.dtype(), DType::kFloat8E4M3FN);
  EXPECT_EQ(s.shape(), (Shape{1, 2}));
  EXPECT_EQ(values(q), (std::vector<double>{224, -448, 56, 448}));
  EXPECT_EQ(values(s), (std::vector<double>{2.0f / 448.0f, 4.0f / 448.0f}));
  // ue8m0 scales (column-major): 2/448 -> 2^-7, 4/448 -> 2^-6.
  auto [q2, s2] = per_token_group_quant_8bit(x, 2, 1e-10, std::nullopt, true, false, true);
  EXPECT_EQ(values(s2), (std::vector<double>{0.0078125, 0.015625}));
  EXPECT_EQ(values(q2), (std::vector<double>{128, -256, 32, 256}));
  // int8 truncates toward zero: 0.3 * 127 = 38.1 -> 38, -38.1 -> -38.
  Tensor y = Tensor::from_vector({1, 0.3, -1, -0.3}, {2, 2}, DType::kFloat32);
  auto [q3, s3] = per_token_group_quant_8bit(y, 2, 1e-10, DType::kInt8);
  EXPECT_EQ(q3.dtype(), DType::kInt8);
  EXPECT_EQ(values(q3), (std::vector<double>{127, 38, -127, -38}));
  // eps floors the scale of an all-zero group.
  auto [q4, s4] = per_token_group_quant_8bit(Tensor::zeros({1, 2}, DType::kFloat32), 2, 0.5);
  EXPECT_EQ(values(s4), (std::vector<double>{0.5f / 448.0f}));
  EXPECT_EQ(values(q4), (std::vector<double>{0, 0}));
}

TEST(PerTokenGroupQuant8bit, ScaleLayouts) {
  const int64_t t = 5, k = 6;
  Tensor x = rand_tensor({t, k}, DType::kBFloat16, 3);
  auto [q0, s0] = per_token_group_quant_8bit(x, 2);
  auto [q1, s1] = per_token_group_quant_8bit(x, 2, 1e-10, std::nullopt, true);
  auto [q2, s2] = per_token_group_quant_8bit(x, 2, 1e-10, std::nullopt, true, true);
  EXPECT_EQ(s1.shape(), (Shape{t, 3}));
  EXPECT_EQ(s1.strides(), (Shape{1, t}));
  EXPECT_EQ(s2.strides(), (Shape{1, 8}));  // 5 tokens rounded up to 8
  EXPECT_EQ(values(s0), values(s1));
  EXPECT_EQ(values(s0), values(s2));
  EXPECT_EQ(values(q0), values(q1));
  // The TMA padding (tokens 5..7 of each group's column) is zeros, not whatever the allocator
  // returned: a reader of the covered span (a copy, a TMA load) sees defined bytes. A buffer of
  // the same size filled with NaN and freed first, so a reused block would show.
  { Tensor junk = Tensor::full({3 * 8}, std::nan(""), DType::kFloat32); }
  auto [q3, s3] = per_token_group_quant_8bit(x, 2, 1e-10, std::nullopt, true, true);
  const float* raw = static_cast<const float*>(s3.storage()->data());
  for (int64_t g = 0; g < 3; ++g) {
    for (int64_t r = t; r < 8; ++r)
      EXPECT_EQ(raw[g * 8 + r], 0.0f) << "group " << g << " row " << r;
  }
}

// Independent float implementation of the definition (float_formats.h conversions).
uint8_t expect_code(float v, DType d) {
  return d == DType::kFloat8E4M3FN ? float_to_e4m3fn_bits(v, true) : float_to_e5m2_bits(v, true);
}

TEST(PerTokenGroupQuant8bit, BitExact) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (DType od : {DType::kFloat8E4M3FN, DType::kFloat8E5M2, DType::kInt8}) {
      for (int64_t gs : {1, 16, 128}) {
        for (bool ue8m0 : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dtype_label(dt) << " gs " << gs << " ue8m0 " << ue8m0
                                            << " out " << static_cast<int>(od));
          Tensor x = rand_tensor({3, 2, 256}, dt, gs + 7, -3, 3);
          if (ue8m0) x = x.view({6, 256});
          auto [q, s] = per_token_group_quant_8bit(x, gs, 1e-10, od, ue8m0, false, ue8m0);
          const auto xv = values(x), sv = values(ue8m0 ? s.contiguous() : s);
          Tensor qc = q.contiguous();
          const float qmax = od == DType::kInt8           ? 127.f
                             : od == DType::kFloat8E4M3FN ? 448.f
                                                          : 57344.f;
          const float qmin = od == DType::kInt8 ? -128.f : -qmax;
          const int64_t groups = 256 / gs;
          for (int64_t r = 0; r < 6; ++r) {
            for (int64_t g = 0; g < groups; ++g) {
              float amax = 0;
              for (int64_t i = 0; i < gs; ++i) {
                amax = std::fmax(amax, std::fabs(static_cast<float>(xv[r * 256 + g * gs + i])));
              }
              float sc = std::fmax(amax, 1e-10f) / qmax;
              if (ue8m0) sc = std::exp2(std::ceil(std::log2(sc)));
              ASSERT_EQ(sv[r * groups + g], sc) << r << "," << g;
              for (int64_t i = 0; i < gs; ++i) {
                const int64_t e = r * 256 + g * gs + i;
                const float v = std::fmin(std::fmax(static_cast<float>(xv[e]) / sc, qmin), qmax);
                if (od == DType::kInt8) {
                  ASSERT_EQ(qc.data<int8_t>()[e], static_cast<int8_t>(std::trunc(v))) << e;
                } else {
                  ASSERT_EQ(qc.data<uint8_t>()[e], expect_code(v, od)) << e;
                }
              }
            }
          }
        }
      }
    }
  }
}

// The CUDA kernel reads 16 bytes at a time where every group starts on a 16-byte boundary
// (group_quant_kernel, grid-stride) and element by element otherwise (group_quant_strided_kernel):
// the same values at an aligned address and one element past it take one kernel each, and both
// equal the CPU bit for bit. 600 x 4096 in groups of 128 is more groups than one pass of the
// vector grid (SMs x resident blocks x 8 warps) on an H100 or H200.
TEST(PerTokenGroupQuant8bitCuda, VectorAndStridedKernelsMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const auto& [rows, k, gs] :
         {std::array<int64_t, 3>{600, 4096, 128}, std::array<int64_t, 3>{7, 4096, 2048},
          std::array<int64_t, 3>{9, 256, 16}}) {
      Tensor buf = rand_tensor({rows * k + 1}, dt, rows + gs, -3, 3);
      Tensor bg = buf.to(g);
      for (int64_t off : {0, 1}) {  // 0: vector kernel; 1: misaligned, strided kernel
        Tensor x = buf.slice(0, off, off + rows * k).view({rows, k});
        Tensor xg = bg.slice(0, off, off + rows * k).view({rows, k});
        for (DType od : {DType::kFloat8E4M3FN, DType::kFloat8E5M2, DType::kInt8}) {
          for (bool ue8m0 : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << dtype_label(dt) << " " << rows << "x" << k << " gs " << gs << " offset "
                         << off << " ue8m0 " << ue8m0 << " out " << static_cast<int>(od));
            auto [q, s] = per_token_group_quant_8bit(x, gs, 1e-10, od, ue8m0, false, ue8m0);
            auto [qg, sg] = per_token_group_quant_8bit(xg, gs, 1e-10, od, ue8m0, false, ue8m0);
            EXPECT_EQ(bytes_of(qg), bytes_of(q));
            EXPECT_EQ(bytes_of(sg), bytes_of(s));
          }
        }
      }
    }
  }
}

// TRT-LLM's 1x128 rule on the CPU in its degenerate blocks, as the GPU computes them: a block
// holding an inf has quant 448 / inf = 0 and scale inf, its infs' codes are NaN (inf * 0) and its
// finite elements signed zeros; a block whose maximum is below 448 / FLT_MAX has quant inf and
// scale 0, its zeros' codes NaN (0 * inf) and its other elements saturate to +-448. NaN is the
// device's canonical positive NaN, 0x7F, whatever sign x86 gives the product.
TEST(PerTokenGroupQuant8bit, Trtllm1x128RuleDegenerateBlocks) {
  std::vector<float> x(256, 0.0f);
  for (int i = 0; i < 128; ++i) x[i] = static_cast<float>(i % 5 - 2);
  x[3] = INFINITY;
  x[4] = -INFINITY;
  for (int i = 128; i < 256; ++i) x[i] = (i % 3 - 1) * 1e-37f;
  std::vector<uint8_t> q(256, 0x55);
  std::vector<float> sc(2, -1.0f);
  kernels::GroupQuant8Params p;
  p.x = x.data();
  p.dtype = DType::kFloat32;
  p.q = q.data();
  p.scales = sc.data();
  p.s_stride_row = 2;
  p.rows = 1;
  p.k = 256;
  p.trtllm_1x128 = true;
  kernels::cpu::per_token_group_quant_8bit(p);
  EXPECT_EQ(sc[0], INFINITY);
  EXPECT_EQ(sc[1], 0.0f);
  for (int i = 0; i < 128; ++i) {
    SCOPED_TRACE(i);
    const uint8_t want = i == 3 || i == 4 ? 0x7F : (x[i] < 0 ? 0x80 : 0x00);
    EXPECT_EQ(q[i], want);
  }
  for (int i = 128; i < 256; ++i) {
    SCOPED_TRACE(i);
    const uint8_t want = x[i] == 0.0f ? 0x7F : (x[i] < 0 ? 0xFE : 0x7E);
    EXPECT_EQ(q[i], want);
  }
}

#if FLASHINFER_TEST_HAVE_CUDA_HEADERS
// TRT-LLM's 1x128 rule (GroupQuant8Params::trtllm_1x128: fp8_blockscale_gemm_sm90's BF16 input)
// through both kernel forms against the CPU reference, bit for bit: codes and scales of random
// blocks, an all-zero block (scale 1), blocks whose maximum is bf16's largest finite value and a
// tiny normal one, the degenerate blocks of Trtllm1x128RuleDegenerateBlocks, mixed signs; rows
// 16-byte aligned (the vector kernel) and 8 bytes off (element loads), both with row strides past
// k.
TEST(PerTokenGroupQuant8bitCuda, Trtllm1x128RuleMatchesCpuBitForBit) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const int64_t rows = 37, k = 1024, kb = k / 128;
  std::vector<double> v = rand_tensor({rows * k}, DType::kFloat32, 91, -5, 5).to_double_vector();
  for (int64_t i = 0; i < 128; ++i) v[3 * k + 256 + i] = 0.0;  // all zero
  v[5 * k + 7] = 3.3895313892515355e38;                        // bf16's largest finite
  v[5 * k + 8] = -3.3895313892515355e38;
  for (int64_t i = 0; i < 128; ++i) v[9 * k + i] = (i % 3 - 1) * 1e-30 * (i + 1);  // tiny
  // Degenerate blocks (NaN codes): an inf, and a maximum whose quant overflows.
  v[11 * k + 130] = INFINITY;
  for (int64_t i = 0; i < 128; ++i) v[13 * k + 512 + i] = (i % 3 - 1) * 1e-37;
  for (int64_t stride : {k, k + 8, k + 4}) {  // 16-byte rows, and rows 8 bytes off
    SCOPED_TRACE(::testing::Message() << "row stride " << stride);
    Tensor x = Tensor::zeros({rows, stride}, DType::kBFloat16);
    x.slice(1, 0, k).copy_(Tensor::from_vector(v, {rows, k}, DType::kBFloat16));
    const Tensor xg = x.to(g);
    auto quantize = [&](const Tensor& src, Device d) {
      Tensor q = Tensor::zeros({rows, k}, DType::kFloat8E4M3FN, d);
      Tensor sc = Tensor::zeros({rows, kb}, DType::kFloat32, d);
      kernels::GroupQuant8Params p;
      p.x = src.data_ptr();
      p.x_stride_row = stride;
      p.dtype = DType::kBFloat16;
      p.q = q.data_ptr();
      p.scales = sc.data<float>();
      p.s_stride_row = kb;
      p.rows = rows;
      p.k = k;
      p.trtllm_1x128 = true;
      if (d.is_cuda()) {
        kernels::cuda::per_token_group_quant_8bit(p, current_cuda_stream());
      } else {
        kernels::cpu::per_token_group_quant_8bit(p);
      }
      return std::pair<Tensor, Tensor>{q, sc};
    };
    const auto [q, sc] = quantize(x, Device::cpu());
    const auto [qg, scg] = quantize(xg, g);
    EXPECT_EQ(bytes_of(qg), bytes_of(q));
    EXPECT_EQ(bytes_of(scg), bytes_of(sc));
    EXPECT_EQ(sc.data<float>()[3 * kb + 2], 1.0f);  // the all-zero block
  }
}
#endif

TEST(PackBits, Golden) {
  Tensor x = bools({1, 0, 1, 1, 0, 0, 0, 1, 1, 1});
  EXPECT_EQ(values(packbits(x)), (std::vector<double>{177, 192}));
  EXPECT_EQ(values(packbits(x, "little")), (std::vector<double>{141, 3}));
  EXPECT_EQ(packbits(Tensor::empty({0}, DType::kBool)).numel(), 0);
  // Any shape is flattened; uint8 nonzero counts as 1.
  Tensor u = Tensor::from_vector({0, 7, 0, 0, 0, 0, 0, 0, 9}, {3, 3}, DType::kUInt8);
  EXPECT_EQ(values(packbits(u)), (std::vector<double>{64, 128}));
  auto [y, ip] = segment_packbits(x, Tensor::from_vector({0, 3, 3, 10}, {4}, DType::kInt32));
  EXPECT_EQ(values(y), (std::vector<double>{160, 142}));
  EXPECT_EQ(ip.dtype(), DType::kInt32);
  EXPECT_EQ(values(ip), (std::vector<double>{0, 1, 1, 2}));
}

TEST(Quant8, BadInput) {
  Tensor x = rand_tensor({2, 8}, DType::kFloat16, 1);
  const char* op = "per_token_group_quant_8bit";
  EXPECT_FI_ERROR(per_token_group_quant_8bit(x, 3), op, "group_size");
  EXPECT_FI_ERROR(per_token_group_quant_8bit(x, 0), op, "group_size");
  EXPECT_FI_ERROR(per_token_group_quant_8bit(rand_tensor({2, 8}, DType::kFloat64, 1), 4), op, "x");
  EXPECT_FI_ERROR(per_token_group_quant_8bit(strided_rand({2, 8}, DType::kFloat16, 1), 4), op, "x");
  EXPECT_FI_ERROR(per_token_group_quant_8bit(x, 4, 1e-10, DType::kFloat16), op, "dst_dtype");
  EXPECT_FI_ERROR(per_token_group_quant_8bit(x, 4, -1.0), op, "eps");
  EXPECT_FI_ERROR(per_token_group_quant_8bit(x, 4, 1e-10, std::nullopt, false, false, true), op,
                  "column_major_scales");
  EXPECT_FI_ERROR(per_token_group_quant_8bit(rand_tensor({2, 2, 8}, DType::kFloat16, 1), 4, 1e-10,
                                             std::nullopt, true),
                  op, "x");
  EXPECT_FI_ERROR(per_token_group_quant_8bit(x, 4, 1e-10, std::nullopt, false, false, false, "x"),
                  op, "backend");
  Tensor b = bools({1, 0, 1});
  EXPECT_FI_ERROR(packbits(b, "middle"), "packbits", "bitorder");
  EXPECT_FI_ERROR(packbits(x), "packbits", "x");
  const char* sp = "segment_packbits";
  EXPECT_FI_ERROR(segment_packbits(b, Tensor::from_vector({0, 4}, {2}, DType::kInt32)), sp,
                  "indptr");
  EXPECT_FI_ERROR(segment_packbits(b, Tensor::from_vector({2, 1}, {2}, DType::kInt32)), sp,
                  "indptr");
  EXPECT_FI_ERROR(segment_packbits(b, Tensor::from_vector({0, 1}, {2}, DType::kFloat32)), sp,
                  "indptr");
}

TEST(Quant8, RecordAndReplay) {
  Tensor x = rand_tensor({4, 64}, DType::kBFloat16, 2);
  Tensor b = bools({1, 1, 0, 1, 0, 0, 1, 1, 1});
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    per_token_group_quant_8bit(x, 32, 1e-10, DType::kFloat8E4M3FN, true, true, true);
    per_token_group_quant_8bit(x, 16, 1e-10, DType::kInt8);
    packbits(b, "little");
    segment_packbits(b, Tensor::from_vector({0, 2, 9}, {3}, DType::kInt32));
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 4u);
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(replays_identically(c));
  }
}

}  // namespace
}  // namespace flashinfer::testing
