// Attention through a compiled module: gen_single_{decode,prefill}_module's uri, the two
// *_with_jit_module functions against single_decode / single_prefill_with_kv_cache bit for bit
// (upstream runs the same module for both), the raw *args by the module's flags, refusals by
// name, record / replay, and CUDA against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

using testing::rand_tensor;
constexpr DType kF16 = DType::kFloat16;
constexpr DType kBf = DType::kBFloat16;
constexpr DType kF32 = DType::kFloat32;
constexpr const char* kDecodeOp = "single_decode_with_kv_cache_with_jit_module";
constexpr const char* kPrefillOp = "single_prefill_with_kv_cache_with_jit_module";

// The five raw decode arguments; upstream's single_decode_with_kv_cache passes the reciprocals.
Value decode_args(Value alibi, double cap, double sm_scale, double rcp_scale = 1.0,
                  double rcp_theta = 1e-4) {
  return Value::tuple(
      {std::move(alibi), Value(cap), Value(sm_scale), Value(rcp_scale), Value(rcp_theta)});
}
Value prefill_args(Value mask, double cap, double sm_scale, Value alibi = Value(),
                   double rcp_scale = 1.0, double rcp_theta = 1e-4) {
  return Value::tuple({std::move(mask), std::move(alibi), Value(), Value(), Value(cap),
                       Value(sm_scale), Value(rcp_scale), Value(rcp_theta)});
}
// Upstream's get_alibi_slopes for a power-of-two head count: 2^(-8 (h + 1) / hq).
Tensor standard_slopes(int64_t hq) {
  std::vector<double> s(static_cast<std::size_t>(hq));
  for (int64_t h = 0; h < hq; ++h) s[h] = std::exp2(-8.0 * double(h + 1) / double(hq));
  return Tensor::from_vector(s, {hq}, kF32);
}

::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  return testing::all_close(a, b, {0.0, 0.0});
}

std::shared_ptr<AttentionJitModule> decode_module(DType q, DType kv, int64_t d, int64_t posenc = 0,
                                                  bool swa = false, bool cap = false) {
  return gen_single_decode_module(q, kv, q, d, d, posenc, swa, cap).build_and_load();
}
std::shared_ptr<AttentionJitModule> prefill_module(DType q, int64_t dqk, int64_t dvo,
                                                   int64_t posenc = 0, bool swa = false,
                                                   bool cap = false) {
  return gen_single_prefill_module("fa2", q, q, q, dqk, dvo, posenc, swa, cap, false)
      .build_and_load();
}

// ---- the module and its uri ---------------------------------------------------------------------

TEST(AttentionJitModule, UriIsUpstreams) {
  const JitSpec d = gen_single_decode_module(kF16, kF16, kF16, 128, 128, 0, false, false);
  EXPECT_EQ(d.name,
            "single_decode_with_kv_cache_dtype_q_f16_dtype_kv_f16_dtype_o_f16_head_dim_qk_128_"
            "head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False");
  const JitSpec p = gen_single_prefill_module("fa2", kBf, DType::kFloat8E4M3FN, kBf, 192, 128, 2,
                                              true, true, false);
  EXPECT_EQ(p.name,
            "single_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_e4m3_dtype_o_bf16_head_dim_qk_192_"
            "head_dim_vo_128_posenc_2_use_swa_True_use_logits_cap_True_f16qk_False");
  const auto m = p.build_and_load();
  EXPECT_EQ(m->uri(), p.name);
  EXPECT_EQ(m->class_name(), "Module");  // type(obj).__name__ of upstream's tvm_ffi.Module
  EXPECT_EQ(m->repr(), "Module(uri=" + p.name + ")");
}

TEST(AttentionJitModule, UriReadsBack) {
  for (const JitSpec& s :
       {gen_single_decode_module(kBf, DType::kFloat8E5M2, kBf, 64, 64, 1, true, false),
        gen_single_prefill_module("fa2", kF16, kF16, kF16, 256, 256, 0, false, true, true)}) {
    const auto m = AttentionJitModule::from_uri(s.name);
    ASSERT_NE(m, nullptr) << s.name;
    EXPECT_EQ(m->uri(), s.name);
    EXPECT_EQ(m->params().kind, s.params.kind);
    EXPECT_EQ(m->params().dtype_kv, s.params.dtype_kv);
    EXPECT_EQ(m->params().pos_encoding_mode, s.params.pos_encoding_mode);
    EXPECT_EQ(m->params().use_fp16_qk_reduction, s.params.use_fp16_qk_reduction);
  }
  const std::string ok = gen_single_decode_module(kF16, kF16, kF16, 128, 128, 0, false, false).name;
  EXPECT_EQ(AttentionJitModule::from_uri(ok + "_x"), nullptr);
  EXPECT_EQ(AttentionJitModule::from_uri("batch_decode_with_kv_cache_dtype_q_f16"), nullptr);
  std::string f32 = ok;
  f32.replace(f32.find("q_f16"), 5, "q_f32");  // float32 has no name in upstream's uri
  EXPECT_EQ(AttentionJitModule::from_uri(f32), nullptr);
  std::string zero = ok;
  zero.replace(zero.find("qk_128"), 6, "qk_0128");  // not upstream's spelling
  EXPECT_EQ(AttentionJitModule::from_uri(zero), nullptr);
  // Upstream's fa3 module: recognized, and refused by name.
  const std::string fa3 =
      gen_single_prefill_module("fa2", kF16, kF16, kF16, 128, 128, 0, false, false, false).name +
      "_sm90";
  EXPECT_FI_ERROR((void)AttentionJitModule::from_uri(fa3), "gen_single_prefill_module", "backend");
}

TEST(AttentionJitModule, GenRefusesByName) {
  EXPECT_FI_ERROR((void)gen_single_decode_module(kF32, kF32, kF32, 128, 128, 0, false, false),
                  "gen_single_decode_module", "dtype_q");
  EXPECT_FI_ERROR(
      (void)gen_single_decode_module(DType::kInt8, DType::kInt8, kF16, 128, 128, 0, false, false),
      "gen_single_decode_module", "dtype_q");
  EXPECT_FI_ERROR((void)gen_single_decode_module(kF16, kBf, kF16, 128, 128, 0, false, false),
                  "gen_single_decode_module", "dtype_kv");
  EXPECT_FI_ERROR((void)gen_single_decode_module(kF16, kF16, kF16, 100, 100, 0, false, false),
                  "gen_single_decode_module", "head_dim_qk");
  EXPECT_FI_ERROR((void)gen_single_decode_module(kF16, kF16, kF16, 128, 128, 3, false, false),
                  "gen_single_decode_module", "pos_encoding_mode");
  EXPECT_FI_ERROR(
      (void)gen_single_prefill_module("auto", kF16, kF16, kF16, 128, 128, 0, false, false, false),
      "gen_single_prefill_module", "backend");
  try {
    (void)gen_single_prefill_module("fa3", kF16, kF16, kF16, 128, 128, 0, false, false, false);
    ADD_FAILURE() << "fa3 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  }
  JitSpec s = gen_single_decode_module(kF16, kF16, kF16, 128, 128, 0, false, false);
  s.name += "_renamed";
  EXPECT_FI_ERROR((void)s.build_and_load(), "JitSpec.build_and_load", "name");
}

// ---- decode -------------------------------------------------------------------------------------

struct DecodeVariant {
  const char* label;
  DType q, kv;
  int64_t hq, hkv, d, kv_len;
  bool hnd;
  int64_t posenc;  // the module's
  bool swa, cap;
};

class JitModuleDecode : public ::testing::TestWithParam<DecodeVariant> {};

// Upstream's single_decode_with_kv_cache runs the standard module of its flags: the same call
// through the module gives the same bits.
TEST_P(JitModuleDecode, EqualsSingleDecodeBitForBit) {
  const DecodeVariant c = GetParam();
  const Tensor q = rand_tensor({c.hq, c.d}, c.q, 1);
  Shape kv_shape{c.kv_len, c.hkv, c.d};
  if (c.hnd) kv_shape = {c.hkv, c.kv_len, c.d};
  const Tensor k = rand_tensor(kv_shape, c.kv, 2), v = rand_tensor(kv_shape, c.kv, 3);
  const char* layout = c.hnd ? "HND" : "NHD";
  const double sm_scale = 0.7 / std::sqrt(double(c.d));
  const double cap = c.cap ? 3.0 : 0.0;
  const int64_t window = c.swa ? 9 : -1;
  const char* modes[] = {"NONE", "ROPE_LLAMA", "ALIBI"};
  Value alibi;
  // Upstream's slopes, which single_decode_with_kv_cache passes (AlibiSlopesAreTheCallers
  // shows a module reads the caller's).
  if (c.posenc == 2) alibi = Value(standard_slopes(c.hq));
  const auto m = decode_module(c.q, c.kv, c.d, c.posenc, c.swa, c.cap);
  const Tensor got = single_decode_with_kv_cache_with_jit_module(
      m, q, k, v, decode_args(alibi, cap, sm_scale, 1.0 / 2.0, 1.0 / 5e4), layout, window);
  const AttentionOutput want = single_decode_with_kv_cache(
      q, k, v, layout, modes[c.posenc], false, std::nullopt, std::nullopt, std::nullopt, window,
      c.cap ? std::optional<double>(cap) : std::nullopt, sm_scale, 2.0, 5e4);
  EXPECT_TRUE(same_bits(got, want.out));
  // return_lse: computed and dropped, as upstream.
  const Tensor got_lse = single_decode_with_kv_cache_with_jit_module(
      m, q, k, v, decode_args(alibi, cap, sm_scale, 1.0 / 2.0, 1.0 / 5e4), layout, window, true);
  EXPECT_TRUE(same_bits(got_lse, want.out));
}

INSTANTIATE_TEST_SUITE_P(
    Variants, JitModuleDecode,
    ::testing::Values(DecodeVariant{"plain", kF16, kF16, 8, 2, 64, 37, false, 0, false, false},
                      DecodeVariant{"hnd_bf16", kBf, kBf, 4, 4, 128, 50, true, 0, false, false},
                      DecodeVariant{"softcap", kF16, kF16, 8, 2, 64, 37, false, 0, false, true},
                      DecodeVariant{"window", kBf, kBf, 8, 1, 64, 40, false, 0, true, false},
                      DecodeVariant{"rope", kF16, kF16, 4, 2, 64, 21, false, 1, false, false},
                      DecodeVariant{"alibi", kF16, kF16, 8, 2, 64, 33, false, 2, false, false},
                      DecodeVariant{"fp8_kv", kBf, DType::kFloat8E4M3FN, 8, 2, 64, 30, false, 0,
                                    false, false}),
    [](const auto& info) { return std::string(info.param.label); });

// What a module's flags do not read is ignored, as by upstream's kernel: a soft cap without
// use_logits_soft_cap, a window without use_sliding_window, RoPE reciprocals and slopes
// without the position encoding.
TEST(JitModuleDecodeArgs, UnflaggedArgumentsAreIgnored) {
  const Tensor q = rand_tensor({8, 64}, kF16, 4);
  const Tensor k = rand_tensor({30, 2, 64}, kF16, 5), v = rand_tensor({30, 2, 64}, kF16, 6);
  const auto m = decode_module(kF16, kF16, 64);
  const double scale = 0.125;
  const Tensor plain =
      single_decode_with_kv_cache_with_jit_module(m, q, k, v, decode_args(Value(), 0.0, scale));
  const Tensor other = single_decode_with_kv_cache_with_jit_module(
      m, q, k, v, decode_args(Value(standard_slopes(8)), 5.0, scale, 0.25, 0.5), "NHD",
      /*window_left=*/3);
  EXPECT_TRUE(same_bits(plain, other));
  // A window module reads any negative window_left as no window, as upstream's variant.
  const Tensor no_window = single_decode_with_kv_cache_with_jit_module(
      decode_module(kF16, kF16, 64, 0, /*swa=*/true), q, k, v, decode_args(Value(), 0.0, scale),
      "NHD", -5);
  EXPECT_TRUE(same_bits(plain, no_window));
  // Integers are numbers too (a Python caller may pass 1 for sm_scale).
  const Tensor ints = single_decode_with_kv_cache_with_jit_module(
      m, q, k, v,
      Value::tuple(
          {Value(), Value(int64_t{0}), Value(int64_t{1}), Value(int64_t{1}), Value(int64_t{1})}));
  const Tensor ones = single_decode_with_kv_cache_with_jit_module(
      m, q, k, v, decode_args(Value(), 0.0, 1.0, 1.0, 1.0));
  EXPECT_TRUE(same_bits(ints, ones));
}

// The caller's ALiBi slopes are the module's: a head whose slope changes changes alone, and
// matches an fp64 softmax with the bias slope * (j - (kv_len - 1)) (the query at position
// kv_len - 1; any per-head constant in the bias cancels in the softmax).
TEST(JitModuleDecodeArgs, AlibiSlopesAreTheCallers) {
  const int64_t hq = 4, d = 64, L = 25;
  const Tensor q = rand_tensor({hq, d}, kF32, 7).to(kF16);
  const Tensor k = rand_tensor({L, hq, d}, kF16, 8), v = rand_tensor({L, hq, d}, kF16, 9);
  const auto m = decode_module(kF16, kF16, d, 2);
  const double scale = 1.0 / 8.0;
  std::vector<double> slopes = {0.5, 0.25, 0.125, 0.0625};
  const Tensor a = single_decode_with_kv_cache_with_jit_module(
      m, q, k, v, decode_args(Value(Tensor::from_vector(slopes, {hq}, kF32)), 0.0, scale));
  slopes[2] = 1.5;
  const Tensor b = single_decode_with_kv_cache_with_jit_module(
      m, q, k, v, decode_args(Value(Tensor::from_vector(slopes, {hq}, kF32)), 0.0, scale));
  for (int64_t h = 0; h < hq; ++h) {
    const bool same = same_bits(a.select(0, h), b.select(0, h));
    EXPECT_EQ(same, h != 2) << "head " << h;
  }
  const std::vector<double> qd = q.to_double_vector(), kd = k.to_double_vector(),
                            vd = v.to_double_vector();
  std::vector<double> want(static_cast<std::size_t>(d), 0.0), s(static_cast<std::size_t>(L));
  const int64_t h = 2;
  double mx = -std::numeric_limits<double>::infinity(), sum = 0;
  for (int64_t j = 0; j < L; ++j) {
    double dot = 0;
    for (int64_t x = 0; x < d; ++x) dot += qd[h * d + x] * kd[(j * hq + h) * d + x];
    s[j] = dot * scale + slopes[2] * double(j - (L - 1));
    mx = std::max(mx, s[j]);
  }
  for (int64_t j = 0; j < L; ++j) {
    const double p = std::exp(s[j] - mx);
    sum += p;
    for (int64_t x = 0; x < d; ++x) want[x] += p * vd[(j * hq + h) * d + x];
  }
  for (auto& x : want) x /= sum;
  EXPECT_TRUE(testing::all_close(b.select(0, h), want, testing::attention_tolerance(kF16)));
}

TEST(JitModuleDecodeArgs, BadInputIsRefusedByName) {
  const Tensor q = rand_tensor({8, 64}, kF16, 4);
  const Tensor k = rand_tensor({30, 2, 64}, kF16, 5), v = rand_tensor({30, 2, 64}, kF16, 6);
  const auto m = decode_module(kF16, kF16, 64);
  const Value ok = decode_args(Value(), 0.0, 0.125);
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(nullptr, q, k, v, ok),
                  kDecodeOp, "jit_module");
  // Arity and kinds of *args.
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(
                      m, q, k, v, Value::tuple({Value(), Value(0.0), Value(0.125)})),
                  kDecodeOp, "args");
  EXPECT_FI_ERROR(
      (void)single_decode_with_kv_cache_with_jit_module(
          m, q, k, v, Value::tuple({Value(), Value("x"), Value(0.1), Value(1.0), Value(1.0)})),
      kDecodeOp, "args");
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(
                      m, q, k, v, decode_args(Value(1.0), 0.0, 0.125)),
                  kDecodeOp, "args");
  // The tensors must be what the module was built for (upstream would misread the memory).
  EXPECT_FI_ERROR(
      (void)single_decode_with_kv_cache_with_jit_module(m, q.to(kBf), k.to(kBf), v.to(kBf), ok),
      kDecodeOp, "q");
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(
                      m, q, k.to(DType::kFloat8E4M3FN), v.to(DType::kFloat8E4M3FN), ok),
                  kDecodeOp, "k");
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(decode_module(kF16, kF16, 128),
                                                                    q, k, v, ok),
                  kDecodeOp, "q");
  EXPECT_FI_ERROR(
      (void)single_decode_with_kv_cache_with_jit_module(
          gen_single_decode_module(kF16, kF16, kBf, 64, 64, 0, false, false).build_and_load(), q, k,
          v, ok),
      kDecodeOp, "jit_module");
  EXPECT_FI_ERROR(
      (void)single_decode_with_kv_cache_with_jit_module(prefill_module(kF16, 64, 64), q, k, v, ok),
      kDecodeOp, "jit_module");
  // Flags that need their argument.
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(
                      decode_module(kF16, kF16, 64, 0, false, true), q, k, v, ok),
                  kDecodeOp, "args");
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(
                      decode_module(kF16, kF16, 64, 2), q, k, v, ok),
                  kDecodeOp, "args");
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(
                      decode_module(kF16, kF16, 64, 2), q, k, v,
                      decode_args(Value(Tensor::zeros({4}, kF32)), 0.0, 0.1)),
                  kDecodeOp, "args");
  EXPECT_FI_ERROR(
      (void)single_decode_with_kv_cache_with_jit_module(decode_module(kF16, kF16, 64, 1), q, k, v,
                                                        decode_args(Value(), 0.0, 0.1, 0.0, 1e-4)),
      kDecodeOp, "args");
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(m, q, k, v, ok, "NDH"),
                  kDecodeOp, "kv_layout");
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(m, q, k, v, Value(0.1)),
                  kDecodeOp, "args");
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(
                      m, q, k, v, decode_args(Value(), 0.0, std::nan(""))),
                  kDecodeOp, "args");
  // The single-decode checks name this op.
  EXPECT_FI_ERROR((void)single_decode_with_kv_cache_with_jit_module(
                      m, q, k, rand_tensor({29, 2, 64}, kF16, 6), ok),
                  kDecodeOp, "v");
}

// ---- prefill ------------------------------------------------------------------------------------

TEST(JitModulePrefill, EqualsSinglePrefillBitForBit) {
  const int64_t qo = 13, kv = 40, hq = 4, hkv = 2;
  for (const auto& [dqk, dvo] : {std::pair<int64_t, int64_t>{64, 64}, {192, 128}}) {
    const Tensor q = rand_tensor({qo, hq, dqk}, kBf, 11);
    const Tensor k = rand_tensor({kv, hkv, dqk}, kBf, 12), v = rand_tensor({kv, hkv, dvo}, kBf, 13);
    const double scale = 1.0 / std::sqrt(double(dqk));
    const auto m = prefill_module(kBf, dqk, dvo);
    for (int64_t mode : {0, 1}) {
      const AttentionOutput got = single_prefill_with_kv_cache_with_jit_module(
          m, q, k, v, prefill_args(Value(), 0.0, scale), "NHD", mode, -1, true);
      const AttentionOutput want = single_prefill_with_kv_cache(
          q, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
          std::nullopt, mode == 1, "NHD", "NONE", false, scale, -1, std::nullopt, std::nullopt,
          std::nullopt, "fa2", true);
      EXPECT_TRUE(same_bits(got.out, want.out)) << dqk << " mode " << mode;
      EXPECT_TRUE(same_bits(got.lse, want.lse)) << dqk << " mode " << mode;
      EXPECT_EQ(got.out.shape(), (Shape{qo, hq, dvo}));
    }
  }
}

// RoPE (the reciprocals as passed) and ALiBi (the caller's slopes) in the prefill module; no LSE
// without return_lse.
TEST(JitModulePrefill, PositionEncodingsEqualSinglePrefill) {
  const int64_t qo = 7, kv = 19, hq = 4, d = 64;
  const Tensor q = rand_tensor({qo, hq, d}, kF16, 24);
  const Tensor k = rand_tensor({kv, 2, d}, kF16, 25), v = rand_tensor({kv, 2, d}, kF16, 26);
  const AttentionOutput rope = single_prefill_with_kv_cache_with_jit_module(
      prefill_module(kF16, d, d, 1), q, k, v,
      prefill_args(Value(), 0.0, 0.1, Value(), 1.0 / 4.0, 1.0 / 5e5), "NHD", 1);
  EXPECT_FALSE(rope.lse.defined());
  const AttentionOutput want_rope = single_prefill_with_kv_cache(
      q, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
      true, "NHD", "ROPE_LLAMA", false, 0.1, -1, std::nullopt, 4.0, 5e5);
  EXPECT_TRUE(same_bits(rope.out, want_rope.out));
  const AttentionOutput plain =
      single_prefill_with_kv_cache(q, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                   std::nullopt, std::nullopt, true, "NHD", "NONE", false, 0.1);
  EXPECT_FALSE(same_bits(rope.out, plain.out));  // the rotation took effect
  const Tensor alibi = single_prefill_with_kv_cache_with_jit_module(
      prefill_module(kF16, d, d, 2), q, k, v,
      prefill_args(Value(), 0.0, 0.1, Value(standard_slopes(hq))), "NHD", 0);
  const AttentionOutput want_alibi =
      single_prefill_with_kv_cache(q, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                   std::nullopt, std::nullopt, false, "NHD", "ALIBI", false, 0.1);
  EXPECT_TRUE(same_bits(alibi, want_alibi.out));
}

TEST(JitModulePrefill, CustomMaskSoftCapAndWindow) {
  const int64_t qo = 9, kv = 21, hq = 4, d = 64;
  const Tensor q = rand_tensor({qo, hq, d}, kF16, 21);
  const Tensor k = rand_tensor({hq, kv, d}, kF16, 22), v = rand_tensor({hq, kv, d}, kF16, 23);
  // Packed little-endian bits of the flattened [qo, kv] mask: keep j % 3 != i % 3.
  std::vector<double> bytes(static_cast<std::size_t>((qo * kv + 7) / 8), 0.0);
  for (int64_t i = 0; i < qo; ++i) {
    for (int64_t j = 0; j < kv; ++j) {
      const int64_t bit = i * kv + j;
      if (j % 3 != i % 3) bytes[bit / 8] += double(1 << (bit % 8));
    }
  }
  const Tensor packed = Tensor::from_vector(bytes, {int64_t(bytes.size())}, DType::kUInt8);
  const auto m = prefill_module(kF16, d, d, 0, true, true);
  const Tensor got = single_prefill_with_kv_cache_with_jit_module(
      m, q, k, v, prefill_args(Value(packed), 4.0, 0.1), "HND", /*mask_mode=*/2,
      /*window_left=*/11);
  const AttentionOutput want =
      single_prefill_with_kv_cache(q, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                   std::nullopt, packed, false, "HND", "NONE", false, 0.1, 11, 4.0);
  EXPECT_TRUE(same_bits(got, want.out));
  // Mask mode 0 does not read the mask.
  const Tensor unmasked = single_prefill_with_kv_cache_with_jit_module(
      m, q, k, v, prefill_args(Value(packed), 4.0, 0.1), "HND", 0, 11);
  const AttentionOutput dense = single_prefill_with_kv_cache(
      q, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
      false, "HND", "NONE", false, 0.1, 11, 4.0);
  EXPECT_TRUE(same_bits(unmasked, dense.out));
}

TEST(JitModulePrefill, BadInputIsRefusedByName) {
  const Tensor q = rand_tensor({5, 4, 64}, kF16, 31);
  const Tensor k = rand_tensor({9, 2, 64}, kF16, 32), v = rand_tensor({9, 2, 64}, kF16, 33);
  const auto m = prefill_module(kF16, 64, 64);
  const Value ok = prefill_args(Value(), 0.0, 0.125);
  EXPECT_FI_ERROR((void)single_prefill_with_kv_cache_with_jit_module(m, q, k, v, ok, "NHD", 2),
                  kPrefillOp, "args");
  EXPECT_FI_ERROR((void)single_prefill_with_kv_cache_with_jit_module(m, q, k, v, ok, "NHD", 7),
                  kPrefillOp, "mask_mode");
  try {
    (void)single_prefill_with_kv_cache_with_jit_module(m, q, k, v, ok, "NHD", 3);
    ADD_FAILURE() << "mask_mode 3 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_EQ(e.arg(), "mask_mode");
  }
  EXPECT_FI_ERROR((void)single_prefill_with_kv_cache_with_jit_module(
                      m, q, k, v,
                      Value::tuple({Value(), Value(), Value(Tensor::zeros({4}, DType::kUInt8)),
                                    Value(), Value(0.0), Value(0.1), Value(1.0), Value(1.0)})),
                  kPrefillOp, "args");
  EXPECT_FI_ERROR((void)single_prefill_with_kv_cache_with_jit_module(
                      m, q, k, v, decode_args(Value(), 0.0, 0.125)),
                  kPrefillOp, "args");
  EXPECT_FI_ERROR((void)single_prefill_with_kv_cache_with_jit_module(
                      m, q, k, rand_tensor({9, 2, 128}, kF16, 33), ok),
                  kPrefillOp, "v");
  EXPECT_FI_ERROR((void)single_prefill_with_kv_cache_with_jit_module(decode_module(kF16, kF16, 64),
                                                                     q, k, v, ok),
                  kPrefillOp, "jit_module");
  EXPECT_FI_ERROR(
      (void)single_prefill_with_kv_cache_with_jit_module(
          m, q, k, v,
          Value::tuple({Value(), Value(), Value(), Value(Tensor::zeros({4}, DType::kUInt8)),
                        Value(0.0), Value(0.1), Value(1.0), Value(1.0)})),
      kPrefillOp, "args");
  // A packed mask of the wrong size: 5 x 9 bits need 6 bytes.
  EXPECT_FI_ERROR(
      (void)single_prefill_with_kv_cache_with_jit_module(
          m, q, k, v, prefill_args(Value(Tensor::zeros({5}, DType::kUInt8)), 0.0, 0.1), "NHD", 2),
      kPrefillOp, "args");
  // Causal needs kv_len >= qo_len (right-aligned), as single_prefill_with_kv_cache.
  EXPECT_FI_ERROR((void)single_prefill_with_kv_cache_with_jit_module(
                      m, rand_tensor({12, 4, 64}, kF16, 34), k, v, ok, "NHD", 1),
                  kPrefillOp, "mask_mode");
}

// ---- record and replay --------------------------------------------------------------------------

TEST(JitModuleReplay, RecordedCallsReplayFromTheUri) {
  const auto dir = testing::record_dump("jit_module", [] {
    const Tensor q = rand_tensor({8, 64}, kF16, 41);
    const Tensor k = rand_tensor({30, 2, 64}, kF16, 42), v = rand_tensor({30, 2, 64}, kF16, 43);
    (void)single_decode_with_kv_cache_with_jit_module(decode_module(kF16, kF16, 64, 0, true, true),
                                                      q, k, v, decode_args(Value(), 5.0, 0.125),
                                                      "NHD", 7, true);
    const Tensor qp = rand_tensor({6, 4, 64}, kBf, 44);
    const Tensor kp = rand_tensor({10, 2, 64}, kBf, 45), vp = rand_tensor({10, 2, 64}, kBf, 46);
    (void)single_prefill_with_kv_cache_with_jit_module(prefill_module(kBf, 64, 64), qp, kp, vp,
                                                       prefill_args(Value(), 0.0, 0.125), "NHD", 1,
                                                       -1, true);
    // Tensors among the *args: the caller's slopes, a packed mask (6 x 10 bits: 8 bytes).
    (void)single_decode_with_kv_cache_with_jit_module(
        decode_module(kF16, kF16, 64, 2), q, k, v,
        decode_args(Value(rand_tensor({8}, kF32, 47, 0.0, 1.0)), 0.0, 0.125));
    (void)single_prefill_with_kv_cache_with_jit_module(
        prefill_module(kBf, 64, 64), qp, kp, vp,
        prefill_args(Value(rand_tensor({8}, DType::kUInt8, 48, 0.0, 255.0)), 0.0, 0.125), "NHD", 2);
  });
  const auto results = replay::replay_sequence(dir.string());
  ASSERT_EQ(results.size(), 4u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
  }
  std::filesystem::remove_all(dir);
}

// A module upstream recorded is only its class name and repr: refused by name. One whose repr
// carries a uri (this library's records) is rebuilt and runs as the live one did.
TEST(JitModuleReplay, ModuleFromItsRecordedRepr) {
  const Tensor q = rand_tensor({8, 64}, kF16, 51);
  const Tensor k = rand_tensor({30, 2, 64}, kF16, 52), v = rand_tensor({30, 2, 64}, kF16, 53);
  const auto m = decode_module(kF16, kF16, 64);
  const Value args = decode_args(Value(), 0.0, 0.125);
  const Tensor live = single_decode_with_kv_cache_with_jit_module(m, q, k, v, args);
  const auto run = [&](const std::string& repr) {
    ObjectRef ref;
    ref.type = "Module";
    ref.repr = repr;
    std::vector<Value> pos = {Value(std::move(ref)), Value(q), Value(k), Value(v)};
    for (const Value& x : args.items()) pos.push_back(x);
    const OpDecl* d = OpRegistry::global().find(kDecodeOp);
    CallArgs bound(*d, bind_arguments(*d, pos, {}));
    return d->invoke(bound);
  };
  // Upstream's fa3 uri names a module not built here: refused naming this op.
  EXPECT_FI_ERROR(
      (void)run(
          "Module(uri=" +
          gen_single_prefill_module("fa2", kF16, kF16, kF16, 64, 64, 0, false, false, false).name +
          "_sm90)"),
      kDecodeOp, "jit_module");
  const Value rebuilt = run(m->repr());
  ASSERT_TRUE(rebuilt.is_tensor());
  EXPECT_TRUE(same_bits(rebuilt.as_tensor(), live));
  try {
    (void)run("<tvm_ffi.Module object at 0x7f5e2c1b9d30>");
    ADD_FAILURE() << "an upstream module was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_EQ(e.op(), kDecodeOp);
    EXPECT_EQ(e.arg(), "jit_module");
  }
}

TEST(JitModuleReplay, SignaturesAreUpstreams) {
  EXPECT_EQ(OpRegistry::global().find(kDecodeOp)->signature(),
            "(jit_module, q, k, v, *args, kv_layout='NHD', window_left=-1, return_lse=False)");
  EXPECT_EQ(OpRegistry::global().find(kPrefillOp)->signature(),
            "(jit_module, q, k, v, *args, kv_layout='NHD', mask_mode=0, window_left=-1, "
            "return_lse=False)");
}

// ---- CUDA ---------------------------------------------------------------------------------------

TEST(JitModuleCuda, MatchesSingleDecodeAndPrefillOnTheGpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda(0);
  const Tensor q = rand_tensor({8, 128}, kBf, 61).to(g);
  const Tensor k = rand_tensor({300, 2, 128}, kBf, 62).to(g),
               v = rand_tensor({300, 2, 128}, kBf, 63).to(g);
  const Tensor got = single_decode_with_kv_cache_with_jit_module(
      decode_module(kBf, kBf, 128), q, k, v, decode_args(Value(), 0.0, 0.088));
  const AttentionOutput want =
      single_decode_with_kv_cache(q, k, v, "NHD", "NONE", false, std::nullopt, std::nullopt,
                                  std::nullopt, -1, std::nullopt, 0.088);
  EXPECT_TRUE(same_bits(got.to(Device::cpu()), want.out.to(Device::cpu())));
  const Tensor qp = rand_tensor({64, 8, 128}, kBf, 64).to(g);
  const AttentionOutput gp = single_prefill_with_kv_cache_with_jit_module(
      prefill_module(kBf, 128, 128), qp, k, v, prefill_args(Value(), 0.0, 0.088), "NHD", 1);
  const AttentionOutput wp = single_prefill_with_kv_cache(
      qp, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
      true, "NHD", "NONE", false, 0.088, -1, std::nullopt, std::nullopt, std::nullopt, "fa2");
  EXPECT_TRUE(same_bits(gp.out.to(Device::cpu()), wp.out.to(Device::cpu())));
  // The caller's slopes reach the decode kernel's ALiBi variant (uploaded by the plan).
  const Tensor slopes = Tensor::from_vector({0.9, 0.02, 0.3, 0.0, 0.5, 0.11, 0.7, 0.05}, {8}, kF32);
  const auto am = decode_module(kBf, kBf, 128, 2);
  const Tensor ga = single_decode_with_kv_cache_with_jit_module(
      am, q, k, v, decode_args(Value(slopes.to(g)), 0.0, 0.088));
  const Tensor ca = single_decode_with_kv_cache_with_jit_module(
      am, q.to(Device::cpu()), k.to(Device::cpu()), v.to(Device::cpu()),
      decode_args(Value(slopes), 0.0, 0.088));
  EXPECT_TRUE(testing::all_close(ga.to(Device::cpu()), ca, testing::attention_tolerance(kBf)));
}

}  // namespace
}  // namespace flashinfer
