// nvfp4_quantize_append_paged_kv_cache -> attention round trips. Upstream's append writes K's and
// V's e4m3 block scales linearly (its test dequantizes both with `_nvfp4_dequant_linear`,
// is_sf_swizzled_layout=False); the xqa kernels read both linearly, so append -> xqa decode is
// exact. trtllm-gen and the paged wrappers read V's scales in TRT-LLM's 4-token interleave (their
// docstrings): the same cache round trips there once V's scales are interleaved, and not without.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "flashinfer/float_formats.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/ops/nvfp4.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

constexpr double kE2m1[16] = {0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6};
constexpr int64_t kPs = 4, kHkv = 2, kHq = 4, kD = 64,
                  kPages = 6;             // the interleave needs D % 64 == 0
constexpr double kKg = 0.05, kVg = 0.04;  // global decode scales

Tensor i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kInt32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// Element x of (page, entry, head g) of a cache with linear scales, in fp64.
double value(const Tensor& codes, const Tensor& sf, bool hnd, int64_t page, int64_t entry,
             int64_t g, int64_t x) {
  auto at = [&](const Tensor& t, int64_t last) {
    const int64_t i1 = hnd ? g : entry, i2 = hnd ? entry : g;
    return static_cast<const uint8_t*>(
        t.data_ptr())[page * t.stride(0) + i1 * t.stride(1) + i2 * t.stride(2) + last];
  };
  const uint8_t byte = at(codes, x / 2);
  return kE2m1[x % 2 == 0 ? (byte & 0xF) : (byte >> 4)] * e4m3fn_bits_to_float(at(sf, x / 16));
}

// TRT-LLM's 4-token V-scale interleave of a linear [pages, .., ps, .., D / 16] scale cache
// (upstream's nvfp4_quantize_paged_kv_cache reshape / permute).
Tensor interleave(const Tensor& lin, bool hnd) {
  const int64_t s4 = kD / 16 / 4;
  return hnd ? lin.view({kPages, kHkv, kPs / 4, 4, 4, s4})
                   .permute({0, 1, 2, 4, 5, 3})
                   .contiguous()
                   .view(lin.shape())
             : lin.view({kPages, kPs / 4, 4, kHkv, 4, s4})
                   .permute({0, 1, 4, 3, 5, 2})
                   .contiguous()
                   .view(lin.shape());
}

class Nvfp4AppendRoundTrip : public ::testing::TestWithParam<bool> {};

TEST_P(Nvfp4AppendRoundTrip, AppendThenDecode) {
  const bool hnd = GetParam();
  const char* layout = hnd ? "HND" : "NHD";
  // Two requests of 7 and 5 tokens over pages {4, 1} and {0, 5}, appended from scratch.
  const std::vector<int32_t> lens = {7, 5};
  const std::vector<std::vector<int32_t>> pages = {{4, 1}, {0, 5}};
  std::vector<int32_t> batch, pos;
  for (int32_t b = 0; b < 2; ++b) {
    for (int32_t t = 0; t < lens[b]; ++t) {
      batch.push_back(b);
      pos.push_back(t);
    }
  }
  const int64_t nnz = static_cast<int64_t>(batch.size());
  const Tensor k_in = testing::rand_tensor({nnz, kHkv, kD}, DType::kBFloat16, 31, -0.3, 0.3);
  const Tensor v_in = testing::rand_tensor({nnz, kHkv, kD}, DType::kBFloat16, 32, -0.3, 0.3);
  const Shape data = hnd ? Shape{kPages, kHkv, kPs, kD / 2} : Shape{kPages, kPs, kHkv, kD / 2};
  const Shape sfs = hnd ? Shape{kPages, kHkv, kPs, kD / 16} : Shape{kPages, kPs, kHkv, kD / 16};
  Tensor kc = Tensor::zeros(data, DType::kUInt8), vc = Tensor::zeros(data, DType::kUInt8);
  Tensor ks = Tensor::zeros(sfs, DType::kFloat8E4M3FN),
         vs = Tensor::zeros(sfs, DType::kFloat8E4M3FN);
  nvfp4_quantize_append_paged_kv_cache(k_in, v_in, i32(batch), i32(pos), PagedKVCache(kc, vc),
                                       PagedKVCache(ks, vs), i32({4, 1, 0, 5}), i32({0, 2, 4}),
                                       i32({3, 1}), kKg, kVg, layout);

  // fp64 over what append wrote (linear scales, global scales folded in), one query each.
  const Tensor q = testing::rand_tensor({2, kHq, kD}, DType::kBFloat16, 33, -1.0, 1.0);
  const std::vector<double> qd = q.to_double_vector();
  const double sm = 1.0 / std::sqrt(double(kD));
  std::vector<double> ref;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < kHq; ++h) {
      const int64_t g = h / (kHq / kHkv);
      std::vector<double> s;
      double mx = -INFINITY;
      for (int64_t j = 0; j < lens[b]; ++j) {
        double dot = 0;
        for (int64_t x = 0; x < kD; ++x) {
          dot += qd[(b * kHq + h) * kD + x] * value(kc, ks, hnd, pages[b][j / kPs], j % kPs, g, x);
        }
        s.push_back(dot * sm * kKg);
        mx = std::max(mx, s.back());
      }
      double sum = 0;
      for (double x : s) sum += std::exp(x - mx);
      std::vector<double> o(kD, 0.0);
      for (int64_t j = 0; j < lens[b]; ++j) {
        for (int64_t x = 0; x < kD; ++x) {
          o[x] += std::exp(s[j] - mx) / sum * kVg *
                  value(vc, vs, hnd, pages[b][j / kPs], j % kPs, g, x);
        }
      }
      ref.insert(ref.end(), o.begin(), o.end());
    }
  }
  Tensor bt = Tensor::empty({2, 2}, DType::kInt32);
  for (int i = 0; i < 4; ++i) bt.data<int32_t>()[i] = pages[i / 2][i % 2];
  const Tensor seq = i32(lens);
  const PagedKVCache cache(kc, vc);
  const testing::Tolerance tol = testing::attention_tolerance(DType::kBFloat16);

  // xqa reads both scale tensors linearly: append -> decode is exact.
  const Tensor x = xqa_batch_decode_with_kv_cache(
      q, cache, Tensor::zeros({64}, DType::kUInt8), bt, seq, 8, sm * kKg, kVg, -1, std::nullopt,
      std::nullopt, layout, std::nullopt, 1, 1.0, std::nullopt, to_value(PagedKVCache(ks, vs)));
  EXPECT_TRUE(testing::all_close(x, ref, tol));

  // trtllm-gen reads V's scales interleaved: the appended cache round trips once they are.
  auto trtllm = [&](const Tensor& v_scales) {
    return trtllm_batch_decode_with_kv_cache(
               q, cache, Tensor::zeros({64}, DType::kUInt8), bt, seq, 8, sm * kKg, kVg, -1,
               std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, layout,
               std::nullopt, "trtllm-gen", 1, 1.0, std::nullopt, std::nullopt, std::nullopt,
               std::nullopt, to_value(PagedKVCache(ks, v_scales)))
        .out;
  };
  EXPECT_TRUE(testing::all_close(trtllm(interleave(vs, hnd)), x, {0, 0}));
  // Read as written (linear), the V scales land on the wrong blocks.
  EXPECT_FALSE(testing::all_close(trtllm(vs), ref, tol));
}

INSTANTIATE_TEST_SUITE_P(Layouts, Nvfp4AppendRoundTrip, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "HND" : "NHD"; });

}  // namespace
}  // namespace flashinfer
