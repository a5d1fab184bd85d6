// trtllm_ragged_attention_deepseek: against an fp64 formula (GQA, causal, sliding window, fp8
// inputs with fused scales, empty requests, strided views), a hand-checked golden, out/lse
// buffers, bad input, record and replay, an upstream-format dump written by Python, and the CUDA
// kernel against the CPU reference (skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "api/attention_common.h"
#include "flashinfer/ops/fmha_v2.h"
#include "flashinfer/ops/ragged_deepseek.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"
#if FLASHINFER_TEST_HAVE_CUDART
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer {
namespace {

using testing::int_tensor;

// On CUDA the split-KV partials live in the workspace: 64 MiB there (upstream's tests pass 128).
Tensor workspace(Device d = Device::cpu()) {
  return Tensor::zeros({d.is_cuda() ? int64_t{64} << 20 : 1 << 12}, DType::kUInt8, d);
}

struct Case {
  DType qk, v;
  int64_t dqk, dvo, hq, hkv;
  bool causal;
  int64_t window_left;
  std::vector<int32_t> qo_lens, kv_lens;
};

// Ragged inputs of one case: q [Nq, Hq, Dqk] as a strided view (rows padded), k, v dense.
struct Inputs {
  Tensor q, k, v, seq_lens, cq, ckv;
  std::vector<int32_t> cq_h, ckv_h;
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  in.cq_h = {0};
  in.ckv_h = {0};
  for (std::size_t b = 0; b < c.qo_lens.size(); ++b) {
    in.cq_h.push_back(in.cq_h.back() + c.qo_lens[b]);
    in.ckv_h.push_back(in.ckv_h.back() + c.kv_lens[b]);
  }
  const int64_t nq = in.cq_h.back(), nk = in.ckv_h.back();
  // fp8 inputs are drawn in [-4, 4) like quantized activations; 16-bit in [-1, 1).
  const double r = dtype_is_fp8(c.qk) ? 4.0 : 1.0;
  in.q = testing::rand_tensor({nq, c.hq, c.dqk + 16}, c.qk, seed, -r, r).slice(2, 0, c.dqk);
  in.k = testing::rand_tensor({nk, c.hkv, c.dqk}, c.qk, seed + 1, -r, r);
  in.v = testing::rand_tensor({nk, c.hkv, c.dvo}, c.v, seed + 2, -r, r);
  in.seq_lens = int_tensor(c.kv_lens);
  in.cq = int_tensor(in.cq_h);
  in.ckv = int_tensor(in.ckv_h);
  return in;
}

std::vector<double> rows_of(const Tensor& t, int64_t lo, int64_t hi) {
  return t.slice(0, lo, hi).contiguous().to_double_vector();
}

TEST(TrtllmRaggedDeepseek, MatchesFp64FormulaOverGrid) {
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16, e4m3 = DType::kFloat8E4M3FN;
  const std::vector<Case> cases = {
      {bf16, bf16, 192, 128, 4, 2, true, -1, {3, 1, 5}, {7, 1, 5}},
      {f16, f16, 192, 128, 3, 3, false, -1, {2, 2, 0}, {9, 0, 4}},
      {bf16, bf16, 128, 128, 2, 1, true, 3, {6, 2}, {6, 11}},
      {f16, f16, 256, 256, 2, 2, false, 2, {4}, {8}},
      {e4m3, e4m3, 192, 128, 4, 4, true, -1, {4, 3}, {4, 10}},
      {bf16, e4m3, 192, 128, 2, 1, false, -1, {1, 3}, {12, 3}},
  };
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    Inputs in = make_inputs(c, 10 + 7 * idx);
    const bool fp8 = dtype_is_fp8(c.qk) || dtype_is_fp8(c.v);
    // bmm1 fuses the softmax scale with dequant scales; bmm2 is the value scale.
    const double bmm1 = (fp8 ? 0.5 : 1.0) / std::sqrt(static_cast<double>(c.dqk));
    const double bmm2 = fp8 ? 0.25 : 1.0;
    const auto B = static_cast<int64_t>(c.qo_lens.size());
    const int64_t max_q = *std::max_element(c.qo_lens.begin(), c.qo_lens.end());
    const int64_t max_kv = *std::max_element(c.kv_lens.begin(), c.kv_lens.end());
    AttentionOutput r = trtllm_ragged_attention_deepseek(
        in.q, in.k, in.v, workspace(), in.seq_lens, max_q, max_kv + 3, bmm1, bmm2, -1.0, B,
        c.window_left, in.cq, in.ckv, false, c.causal, true);
    const DType od = dtype_is_fp8(c.qk) ? bf16 : c.qk;
    ASSERT_EQ(r.out.shape(), (Shape{in.cq_h.back(), c.hq, c.dvo}));
    ASSERT_EQ(r.out.dtype(), od);
    ASSERT_EQ(r.lse.shape(), (Shape{in.cq_h.back(), c.hq}));
    std::vector<double> want_o, want_lse;
    for (int64_t b = 0; b < B; ++b) {
      testing::RefOptions opt;
      opt.sm_scale = bmm1;
      opt.causal = c.causal;
      opt.window_left = c.window_left;
      opt.v_scale = bmm2;
      std::vector<double> o, lse;
      testing::ref_attention(rows_of(in.q, in.cq_h[b], in.cq_h[b + 1]),
                             rows_of(in.k, in.ckv_h[b], in.ckv_h[b + 1]),
                             rows_of(in.v, in.ckv_h[b], in.ckv_h[b + 1]), c.qo_lens[b],
                             c.kv_lens[b], c.hq, c.hkv, c.dqk, c.dvo, opt, o, lse);
      want_o.insert(want_o.end(), o.begin(), o.end());
      want_lse.insert(want_lse.end(), lse.begin(), lse.end());
    }
    const testing::Tolerance tol = testing::attention_tolerance(od);
    EXPECT_TRUE(testing::all_close(r.out, want_o, {tol.atol * (fp8 ? 4 : 1), tol.rtol}));
    EXPECT_TRUE(testing::all_close(r.lse, want_lse, {2e-4, 2e-4}));
    ++idx;
  }
}

// Hand-checked: one head, q = e0, bmm1_scale = ln 3, keys 0 and e0: scores 0 and ln 3, weights
// 1/4 and 3/4; v0 = 4 e0, v1 = 8 e1, bmm2_scale 0.5: out = 0.5 * (1, 6) = (0.5, 3), lse =
// log2(1 + 3) = 2. Causal with two queries over two keys: the first sees key 0 only: out =
// 0.5 * v0 = (2, 0), lse = log2(e^0) = 0.
TEST(TrtllmRaggedDeepseek, HandCheckedGolden) {
  const int64_t D = 128;
  auto unit = [&](int64_t rows, std::vector<std::pair<int64_t, double>> entries) {
    std::vector<double> v(static_cast<std::size_t>(rows * D), 0.0);
    for (auto [i, x] : entries) v[static_cast<std::size_t>(i)] = x;
    return Tensor::from_vector(v, {rows, 1, D}, DType::kFloat16);
  };
  Tensor k = unit(2, {{D, 1.0}});
  Tensor v = unit(2, {{0, 4.0}, {D + 1, 8.0}});
  Tensor q1 = unit(1, {{0, 1.0}});
  const double ln3 = std::log(3.0);
  AttentionOutput r = trtllm_ragged_attention_deepseek(
      q1, k, v, workspace(), int_tensor({2}), 1, 2, ln3, 0.5, 1.0, 1, -1, int_tensor({0, 1}),
      int_tensor({0, 2}), std::nullopt, false, true);
  std::vector<double> want(D, 0.0);
  want[0] = 0.5;
  want[1] = 3.0;
  EXPECT_TRUE(testing::all_close(r.out, want, {1e-3, 1e-3}));
  EXPECT_TRUE(testing::all_close(r.lse, std::vector<double>{2.0}, {1e-6, 1e-6}));
  Tensor q2 = unit(2, {{0, 1.0}, {D, 1.0}});
  r = trtllm_ragged_attention_deepseek(q2, k, v, workspace(), int_tensor({2}), 2, 2, ln3, 0.5, 1.0,
                                       1, -1, int_tensor({0, 2}), int_tensor({0, 2}), std::nullopt,
                                       true, true);
  std::vector<double> want2(2 * D, 0.0);
  want2[0] = 2.0;
  want2[D] = 0.5;
  want2[D + 1] = 3.0;
  EXPECT_TRUE(testing::all_close(r.out, want2, {1e-3, 1e-3}));
  EXPECT_TRUE(testing::all_close(r.lse, std::vector<double>{0.0, 2.0}, {1e-6, 1e-6}));
}

// A request with queries and no keys gives 0 and -inf, whatever skip_all_rows_active_check says
// (upstream 0.7.4: its check, False, gives that; its default True skips the check).
TEST(TrtllmRaggedDeepseek, RowsWithoutKeysWithEitherActiveCheck) {
  const int64_t D = 128;
  Tensor q = Tensor::empty({3, 1, D}, DType::kFloat16).uniform_(5);
  Tensor k = Tensor::empty({2, 1, D}, DType::kFloat16).uniform_(6);
  Tensor v = Tensor::empty({2, 1, D}, DType::kFloat16).uniform_(7);
  std::vector<std::vector<double>> outs;
  for (bool skip : {true, false}) {
    AttentionOutput r = trtllm_ragged_attention_deepseek(
        q, k, v, workspace(), int_tensor({2, 0}), 2, 2, 0.1, 1.0, 1.0, 2, -1, int_tensor({0, 1, 3}),
        int_tensor({0, 2, 2}), std::nullopt, false, true, std::nullopt, std::nullopt, std::nullopt,
        std::nullopt, Value::tuple({Value(), Value(), Value(), Value()}),
        Value::tuple({Value(0), Value(0), Value(0), Value(0)}), "trtllm-gen", std::nullopt,
        std::nullopt, std::nullopt, std::nullopt, skip);
    const std::vector<double> o = r.out.to_double_vector(), l = r.lse.to_double_vector();
    for (int64_t i = D; i < 3 * D; ++i) EXPECT_EQ(o[static_cast<std::size_t>(i)], 0.0) << i;
    EXPECT_EQ(l[1], -std::numeric_limits<double>::infinity());
    EXPECT_EQ(l[2], -std::numeric_limits<double>::infinity());
    EXPECT_TRUE(std::isfinite(l[0]));
    outs.push_back(o);
  }
  EXPECT_EQ(outs[0], outs[1]);
}

TEST(TrtllmRaggedDeepseek, OutAndLseBuffersAndTensorScales) {
  const Case c{DType::kBFloat16, DType::kBFloat16, 192, 128, 2, 1, true, -1, {2, 3}, {4, 3}};
  Inputs in = make_inputs(c, 3);
  auto call = [&](std::optional<Tensor> out, std::optional<Tensor> lse, bool ret,
                  ScalarOrTensor<double> s1) {
    return trtllm_ragged_attention_deepseek(in.q, in.k, in.v, workspace(), in.seq_lens, 3, 4, s1,
                                            1.0, 1.0, 2, -1, in.cq, in.ckv, std::nullopt, true, ret,
                                            std::nullopt, std::nullopt, out, lse);
  };
  AttentionOutput ref = call(std::nullopt, std::nullopt, true, 0.07);
  Tensor out = Tensor::zeros({5, 2, 128}, DType::kBFloat16);
  Tensor lse = Tensor::zeros({5, 2}, DType::kFloat32);
  AttentionOutput r = call(out, lse, false, Tensor::full({1}, 0.07, DType::kFloat32));
  EXPECT_FALSE(r.lse.defined());
  EXPECT_EQ(r.out.data_ptr(), out.data_ptr());
  EXPECT_TRUE(testing::all_close(out, ref.out, {0.0, 0.0}));
  EXPECT_TRUE(testing::all_close(lse, ref.lse, {0.0, 0.0}));
  // fp16 out for bf16 inputs.
  Tensor o16 = Tensor::zeros({5, 2, 128}, DType::kFloat16);
  call(o16, std::nullopt, false, 0.07);
  EXPECT_TRUE(testing::all_close(o16, ref.out, {1e-2, 2e-2}));
}

TEST(TrtllmRaggedDeepseek, BadInput) {
  const char* op = "trtllm_ragged_attention_deepseek";
  const Case c{DType::kBFloat16, DType::kBFloat16, 192, 128, 2, 1, true, -1, {2, 3}, {4, 3}};
  Inputs in = make_inputs(c, 5);
  struct Args {
    Tensor q, k, v, seq_lens, cq, ckv;
    int64_t max_q = 3, max_kv = 4, batch = 2, window_left = -1;
    std::optional<Tensor> sinks, out, lse;
    Value sage = Value::tuple({Value(), Value(), Value(), Value()});
    std::string backend = "trtllm-gen";
    std::optional<bool> fp16_softmax;
  };
  Args good;
  good.q = in.q;
  good.k = in.k;
  good.v = in.v;
  good.seq_lens = in.seq_lens;
  good.cq = in.cq;
  good.ckv = in.ckv;
  auto run = [&](const Args& a) {
    trtllm_ragged_attention_deepseek(a.q, a.k, a.v, workspace(), a.seq_lens, a.max_q, a.max_kv, 0.1,
                                     1.0, 1.0, a.batch, a.window_left, a.cq, a.ckv, std::nullopt,
                                     true, false, a.sinks, std::nullopt, a.out, a.lse, a.sage,
                                     Value::tuple({Value(0), Value(0), Value(0), Value(0)}),
                                     a.backend, std::nullopt, std::nullopt, a.fp16_softmax);
  };
  run(good);
  // A tensor bmm1_scale must be one torch.float32 element (upstream's check), a bf16 one refused.
  for (const Tensor& bad :
       {Tensor::full({1}, 0.1, DType::kBFloat16), Tensor::full({2}, 0.1, DType::kFloat32)}) {
    EXPECT_FI_ERROR(trtllm_ragged_attention_deepseek(
                        good.q, good.k, good.v, workspace(), good.seq_lens, good.max_q, good.max_kv,
                        bad, 1.0, 1.0, good.batch, good.window_left, good.cq, good.ckv,
                        std::nullopt, true, false, good.sinks, std::nullopt, good.out, good.lse,
                        good.sage, Value::tuple({Value(0), Value(0), Value(0), Value(0)}),
                        good.backend, std::nullopt, std::nullopt, good.fp16_softmax),
                    op, "bmm1_scale");
  }
  auto with = [&](auto f) {
    Args a = good;
    f(a);
    return a;
  };
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.q = in.q.slice(2, 0, 128); })), op, "query");
  EXPECT_FI_ERROR(run(with([&](Args& a) {
                    a.v = Tensor::zeros({7, 1, 192}, DType::kBFloat16);
                  })),
                  op, "query");
  EXPECT_FI_ERROR(run(with([&](Args& a) {
                    a.k = Tensor::zeros({7, 3, 192}, DType::kBFloat16);
                    a.v = Tensor::zeros({7, 3, 128}, DType::kBFloat16);
                  })),
                  op, "key");
  EXPECT_FI_ERROR(run(with([&](Args& a) {
                    a.q = in.q.to(DType::kFloat32);
                    a.k = in.k.to(DType::kFloat32);
                  })),
                  op, "query");
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.k = in.k.to(DType::kFloat16); })), op, "key");
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.v = in.v.to(DType::kFloat16); })), op, "value");
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.seq_lens = int_tensor({4, 2}); })), op, "seq_lens");
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.cq = int_tensor({0, 2, 4}); })), op, "cum_seq_lens_q");
  EXPECT_FI_ERROR(run(with([&](Args& a) {
                    a.ckv = int_tensor({0, 4, 9});
                  })),
                  op, "cum_seq_lens_kv");
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.max_q = 2; })), op, "max_q_len");
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.max_kv = 3; })), op, "max_kv_len");
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.batch = 3; })), op, "seq_lens");
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.window_left = -2; })), op, "window_left");
  EXPECT_FI_ERROR(run(with([&](Args& a) {
                    a.out = Tensor::zeros({5, 2, 192}, DType::kBFloat16);
                  })),
                  op, "out");
  EXPECT_FI_ERROR(run(with([&](Args& a) {
                    a.out = Tensor::zeros({5, 2, 128}, DType::kFloat8E4M3FN);
                  })),
                  op, "out");
  EXPECT_FI_ERROR(run(with([&](Args& a) {
                    a.lse = Tensor::zeros({5, 3}, DType::kFloat32);
                  })),
                  op, "lse");
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.sinks = Tensor::zeros({2}, DType::kFloat32); })), op,
                  "attention_sinks");
  EXPECT_FI_ERROR(run(with([&](Args& a) {
                    a.sage = Value::tuple(
                        {Value(Tensor::zeros({1}, DType::kFloat32)), Value(), Value(), Value()});
                  })),
                  op, "sage_attn_sfs");
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.backend = "fa2"; })), op, "backend");
  EXPECT_FI_ERROR(run(with([&](Args& a) { a.fp16_softmax = true; })), op, "use_fp16_softmax");
}

TEST(TrtllmRaggedDeepseek, RecordAndReplay) {
  const Case c{DType::kBFloat16, DType::kBFloat16, 192, 128, 2, 1, true, -1, {2, 3}, {4, 3}};
  Inputs in = make_inputs(c, 9);
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    trtllm_ragged_attention_deepseek(in.q, in.k, in.v, workspace(), in.seq_lens, 3, 4, 0.08, 1.0,
                                     -1.0, 2, -1, in.cq, in.ckv, false, true, true);
    Tensor out = Tensor::zeros({5, 2, 128}, DType::kBFloat16);
    trtllm_ragged_attention_deepseek(in.q, in.k, in.v, workspace(), in.seq_lens, 3, 4, 0.08, 1.0,
                                     1.0, 2, 1, in.cq, in.ckv, std::nullopt, false, false,
                                     std::nullopt, std::nullopt, out);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_TRUE(calls[0].result.is_sequence());  // (out, lse) with return_lse
  for (const auto& call : calls) EXPECT_TRUE(testing::replays_identically(call));
}

// A dump written by Python as upstream's recorder writes it, for the call SGLang's trtllm_mla
// backend makes (every argument by keyword, out= given, return_lse=True: the result is the
// (out, lse) tuple, saved as result_0 / result_1), expected values computed by torch in fp64.
TEST(TrtllmRaggedDeepseek, UpstreamWrittenDumpReplays) {
  // save() and record(): the shared writer (tests/util/upstream_dump_py.h).
  const std::string body = R"PY(
import math
torch.manual_seed(0)
H, HKV, DQK, DVO = 4, 4, 192, 128
qlens, kvlens = [3, 2], [5, 2]
cq = [0, 3, 5]
ck = [0, 5, 7]
q = torch.randn(5, H, DQK).to(torch.bfloat16)
k = torch.randn(7, HKV, DQK).to(torch.bfloat16)
v = torch.randn(7, HKV, DVO).to(torch.bfloat16)
scale = 1.0 / math.sqrt(DQK)
out = torch.empty(5, H, DVO, dtype=torch.float64)
lse = torch.empty(5, H, dtype=torch.float64)
for b in range(2):
    qb = q[cq[b]:cq[b + 1]].double()
    kb = k[ck[b]:ck[b + 1]].double()
    vb = v[ck[b]:ck[b + 1]].double()
    s = torch.einsum("qhd,khd->hqk", qb, kb) * scale
    ql, kl = qlens[b], kvlens[b]
    mask = torch.arange(kl)[None, :] <= (kl - ql + torch.arange(ql))[:, None]
    s = s.masked_fill(~mask[None], float("-inf"))
    out[cq[b]:cq[b + 1]] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vb)
    lse[cq[b]:cq[b + 1]] = (torch.logsumexp(s, -1) / math.log(2.0)).T
i32 = lambda x: torch.tensor(x, dtype=torch.int32)
record("trtllm_ragged_attention_deepseek", "flashinfer.prefill",
       {"kwarg_query": q, "kwarg_key": k, "kwarg_value": v,
        "kwarg_workspace_buffer": torch.zeros(256, dtype=torch.uint8),
        "kwarg_cum_seq_lens_q": i32(cq), "kwarg_cum_seq_lens_kv": i32(ck),
        "kwarg_seq_lens": i32(kvlens), "kwarg_out": torch.zeros(5, H, DVO, dtype=torch.bfloat16)},
       {"kwarg_max_q_len": 3, "kwarg_max_kv_len": 5, "kwarg_bmm1_scale": scale,
        "kwarg_bmm2_scale": 1.0, "kwarg_o_sf_scale": -1.0, "kwarg_batch_size": 2,
        "kwarg_window_left": -1, "kwarg_enable_pdl": False, "kwarg_is_causal": True,
        "kwarg_return_lse": True},
       [out.to(torch.bfloat16), lse.float()])  # the (out, lse) tuple: result_0, result_1
)PY";
  if (!testing::run_upstream_dump_script("fi_ragged_ds", body, 1)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

TEST(TrtllmRaggedDeepseekCuda, MatchesCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16, e4m3 = DType::kFloat8E4M3FN;
  const std::vector<Case> cases = {
      {bf16, bf16, 192, 128, 16, 16, true, -1, {37, 1, 200}, {37, 300, 200}},
      {f16, f16, 192, 128, 8, 2, false, -1, {5, 0, 9}, {100, 3, 9}},
      {e4m3, e4m3, 192, 128, 4, 4, true, 17, {64, 3}, {64, 70}},
      {bf16, e4m3, 128, 128, 6, 3, true, -1, {7}, {7}},
      {f16, f16, 256, 256, 2, 1, false, 5, {9, 2}, {9, 0}},
      // The FA2 prefill kernel's block heights: 128 rows (long MHA requests), 16 rows (short
      // GQA rows: the warps split the keys; DeepSeek's dims, the largest the 16-row block takes),
      // 64 rows (a GQA group of 16), with a window.
      {bf16, bf16, 128, 128, 8, 8, true, -1, {300, 129}, {300, 500}},
      {bf16, bf16, 192, 128, 8, 2, true, -1, {1, 2, 3}, {50, 1, 90}},
      {f16, f16, 192, 128, 16, 1, true, 30, {3, 1}, {100, 64}},
  };
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    Inputs in = make_inputs(c, 70 + idx);
    const auto B = static_cast<int64_t>(c.qo_lens.size());
    const int64_t max_q = *std::max_element(c.qo_lens.begin(), c.qo_lens.end());
    const int64_t max_kv = *std::max_element(c.kv_lens.begin(), c.kv_lens.end());
    const double bmm1 = 0.6 / std::sqrt(static_cast<double>(c.dqk)), bmm2 = 0.8;
    AttentionOutput want = trtllm_ragged_attention_deepseek(
        in.q, in.k, in.v, workspace(), in.seq_lens, max_q, max_kv, bmm1, bmm2, -1.0, B,
        c.window_left, in.cq, in.ckv, false, c.causal, true);
    // The default kernel, then the FA2 kernel (FLASHINFER_PREFILL_SM90=0): on sm_90 the Hopper
    // kernel takes the rows it fits (the 128-row MHA case), which would otherwise leave the FA2
    // kernel's block heights untested there.
    for (const char* sm90 : {static_cast<const char*>(nullptr), "0"}) {
      SCOPED_TRACE(sm90 ? "FLASHINFER_PREFILL_SM90=0" : "default kernel");
      const testing::ScopedEnv env("FLASHINFER_PREFILL_SM90", sm90);
      AttentionOutput got = trtllm_ragged_attention_deepseek(
          testing::to_keep_layout(in.q, gpu), in.k.to(gpu), in.v.to(gpu), workspace(gpu),
          in.seq_lens.to(gpu), max_q, max_kv, bmm1, bmm2, -1.0, B, c.window_left, in.cq.to(gpu),
          in.ckv.to(gpu), std::nullopt, c.causal, true);
      ASSERT_TRUE(got.out.device().is_cuda());
      EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()), want.out,
                                     testing::attention_tolerance(want.out.dtype())));
      // The tensor-core kernels scale and sum in another order than the CPU (as in
      // test_prefill_oracle).
      EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()), want.lse, {2e-3, 1e-3}));
    }
    ++idx;
  }
}

// The call's fields the Hopper kernel's dispatch reads (dtypes, dims, heads, a scale that folds).
kernels::AttentionParams attention_fields(const Case& c) {
  kernels::AttentionParams a;
  a.q_dtype = a.o_dtype = c.qk;
  a.kv.dtype = c.qk;
  a.num_qo_heads = static_cast<int32_t>(c.hq);
  a.num_kv_heads = static_cast<int32_t>(c.hkv);
  a.head_dim_qk = static_cast<int32_t>(c.dqk);
  a.head_dim_vo = static_cast<int32_t>(c.dvo);
  a.sm_scale = 0.05f;
  return a;
}

// Whether the CUDA call of `c` with bounds max_q x max_kv splits its keys across blocks: the
// grid the API sizes on the host from the query's rows and the bounds (api::ragged_device_grid),
// with the Hopper kernel's budget where its tall blocks run the items.
bool plan_splits(const Case& c, int64_t max_q, int64_t max_kv, Device gpu) {
  kernels::BlockTablePlan bp;
  bp.batch = static_cast<int32_t>(c.qo_lens.size());
  bp.total_rows = std::accumulate(c.qo_lens.begin(), c.qo_lens.end(), int64_t{0});
  bp.q_len = static_cast<int32_t>(std::min(max_q, bp.total_rows));
  bp.max_seq_len = static_cast<int32_t>(max_kv);
  return api::ragged_device_grid(bp, static_cast<int32_t>(c.hq / c.hkv),
                                 static_cast<int32_t>(c.hkv), static_cast<int32_t>(c.dqk),
                                 static_cast<int32_t>(c.dvo), api::tensor_core_max_grid(gpu),
                                 api::hopper_tall_max_grid(attention_fields(c), gpu), "test")
             .partial_rows > 0;
}

int64_t max_of(const std::vector<int32_t>& v) { return *std::max_element(v.begin(), v.end()); }

// Long-KV batches of few queries: the FA2 items split across the keys (partials in the
// workspace, merged after) against the CPU reference, causal and not, with a window, with the
// LSE returned (the merged one), written to a given buffer, and not requested.
TEST(TrtllmRaggedDeepseekCuda, SplitKvMatchesCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16;
  const std::vector<Case> cases = {
      {bf16, bf16, 192, 128, 16, 16, true, -1, {128}, {8192}},
      {bf16, bf16, 192, 128, 16, 16, false, -1, {128}, {8192}},
      {f16, f16, 128, 128, 8, 8, true, -1, {16, 40}, {6000, 3000}},
      {bf16, bf16, 128, 128, 8, 2, false, -1, {3, 1}, {5000, 7001}},
      {f16, f16, 192, 128, 16, 1, true, 2000, {5, 2}, {9000, 2}},
      {bf16, bf16, 256, 256, 4, 4, true, -1, {70}, {4096}},
  };
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    Inputs in = make_inputs(c, 90 + idx);
    const auto B = static_cast<int64_t>(c.qo_lens.size());
    const int64_t max_q = max_of(c.qo_lens), max_kv = max_of(c.kv_lens);
    ASSERT_TRUE(plan_splits(c, max_q, max_kv, gpu));  // the shape exercises the split
    const double bmm1 = 0.6 / std::sqrt(static_cast<double>(c.dqk)), bmm2 = 0.8;
    const AttentionOutput want = trtllm_ragged_attention_deepseek(
        in.q, in.k, in.v, workspace(), in.seq_lens, max_q, max_kv, bmm1, bmm2, -1.0, B,
        c.window_left, in.cq, in.ckv, false, c.causal, true);
    for (int lse_mode = 0; lse_mode < 3; ++lse_mode) {  // returned, given buffer, none
      SCOPED_TRACE(::testing::Message() << "lse mode " << lse_mode);
      std::optional<Tensor> lse_buf;
      if (lse_mode == 1) lse_buf = Tensor::zeros(want.lse.shape(), DType::kFloat32, gpu);
      AttentionOutput got = trtllm_ragged_attention_deepseek(
          testing::to_keep_layout(in.q, gpu), in.k.to(gpu), in.v.to(gpu), workspace(gpu),
          in.seq_lens.to(gpu), max_q, max_kv, bmm1, bmm2, -1.0, B, c.window_left, in.cq.to(gpu),
          in.ckv.to(gpu), std::nullopt, c.causal, lse_mode == 0, std::nullopt, std::nullopt,
          std::nullopt, lse_buf);
      ASSERT_TRUE(got.out.device().is_cuda());
      EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()), want.out,
                                     testing::attention_tolerance(want.out.dtype())));
      const Tensor lse = lse_mode == 0 ? got.lse : lse_mode == 1 ? *lse_buf : Tensor();
      if (lse.defined()) {
        EXPECT_TRUE(testing::all_close(lse.to(Device::cpu()), want.lse, {2e-3, 1e-3}));
      }
      if (lse_mode == 2) {
        EXPECT_FALSE(got.lse.defined());
      }
    }
    ++idx;
  }
}

// The split's partials live in the workspace: where it has no room for them (too small, or on
// another device) the call runs unsplit, the keys in one chunk, with the same result; a shape
// that does not split runs with a small one too.
TEST(TrtllmRaggedDeepseekCuda, SplitKvFallsBackToOneChunkWithoutRoomInTheWorkspace) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const DType bf16 = DType::kBFloat16;
  const Case c{bf16, bf16, 192, 128, 16, 16, true, -1, {128}, {8192}};
  Inputs in = make_inputs(c, 7);
  ASSERT_TRUE(plan_splits(c, 128, 8192, gpu));
  auto call = [&](const Tensor& ws) {
    return trtllm_ragged_attention_deepseek(
        in.q.to(gpu), in.k.to(gpu), in.v.to(gpu), ws, in.seq_lens.to(gpu), 128, 8192, 0.05, 1.0,
        -1.0, 1, -1, in.cq.to(gpu), in.ckv.to(gpu), std::nullopt, true, false);
  };
  const AttentionOutput want =
      trtllm_ragged_attention_deepseek(in.q, in.k, in.v, workspace(), in.seq_lens, 128, 8192, 0.05,
                                       1.0, -1.0, 1, -1, in.cq, in.ckv, false, true, false);
  for (const Tensor& ws : {Tensor::zeros({1 << 12}, DType::kUInt8, gpu), workspace()}) {
    SCOPED_TRACE(ws.device().str());
    const AttentionOutput got = call(ws);
    EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()), want.out,
                                   testing::attention_tolerance(bf16)));
  }
  const Case small{bf16, bf16, 192, 128, 16, 16, true, -1, {3}, {100}};
  Inputs si = make_inputs(small, 8);
  ASSERT_FALSE(plan_splits(small, 3, 100, gpu));
  AttentionOutput r = trtllm_ragged_attention_deepseek(
      si.q.to(gpu), si.k.to(gpu), si.v.to(gpu), Tensor::zeros({1 << 12}, DType::kUInt8, gpu),
      si.seq_lens.to(gpu), 3, 100, 0.05, 1.0, -1.0, 1, -1, si.cq.to(gpu), si.ckv.to(gpu),
      std::nullopt, true, false);
  EXPECT_TRUE(r.out.device().is_cuda());
}

// fmha_v2_prefill_deepseek passes no workspace: its split partials live in the per-stream
// scratch. One long request (2048 queries over 2048 keys, 2 heads) splits; twice, to run warm.
// Without return_lse: with it (fmha_v2's two-channel stats) the call runs on the CUDA-core ragged
// kernel, which has no plan (ragged_fa2_eligible), so the split path would not run; the LSE is
// checked by a second call.
TEST(TrtllmRaggedDeepseekCuda, FmhaV2DeepseekSplitKvMatchesCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const int64_t S = 2048, H = 2;
  const Tensor q = testing::rand_tensor({1, S, H, 192}, DType::kBFloat16, 11, -1.0, 1.0);
  const Tensor k = testing::rand_tensor({1, S, H, 192}, DType::kBFloat16, 12, -1.0, 1.0);
  const Tensor v = testing::rand_tensor({1, S, H, 128}, DType::kBFloat16, 13, -1.0, 1.0);
  const std::vector<int32_t> cq = {0, static_cast<int32_t>(S)}, kl = {static_cast<int32_t>(S)};
  int32_t max_rows = 0;
  const Case shape{DType::kBFloat16, DType::kBFloat16, 192, 128, H, H, true, -1, {}, {}};
  ASSERT_TRUE(api::one_shot_plan(cq.data(), kl.data(), 1, 1, static_cast<int32_t>(H), 192, 128, 0,
                                 api::tensor_core_max_grid(gpu), max_rows,
                                 api::hopper_tall_max_grid(attention_fields(shape), gpu))
                  .split_kv);
  Tensor out = Tensor::zeros({1, S, H, 128}, DType::kBFloat16);
  AttentionOutput want = fmha_v2_prefill_deepseek(q, k, v, out, H, 192, S, 1.0, 0.07, 0.5, true);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    Tensor out_d = Tensor::zeros({1, S, H, 128}, DType::kBFloat16, gpu);
    fmha_v2_prefill_deepseek(q.to(gpu), k.to(gpu), v.to(gpu), out_d, H, 192, S, 1.0, 0.07, 0.5,
                             /*return_lse=*/false);
    EXPECT_TRUE(testing::all_close(out_d.to(Device::cpu()), out,
                                   testing::attention_tolerance(DType::kBFloat16)))
        << "split path";
    Tensor out_l = Tensor::zeros({1, S, H, 128}, DType::kBFloat16, gpu);
    AttentionOutput got = fmha_v2_prefill_deepseek(q.to(gpu), k.to(gpu), v.to(gpu), out_l, H, 192,
                                                   S, 1.0, 0.07, 0.5, true);
    EXPECT_TRUE(testing::all_close(out_l.to(Device::cpu()), out,
                                   testing::attention_tolerance(DType::kBFloat16)))
        << "with the LSE";
    EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()), want.lse, {2e-3, 1e-3}));
  }
}

// On CUDA the lengths stay on the device and the grid is sized from the query's rows and the
// bounds given: calls whose max_q_len / max_kv_len are far above their requests' (requests cut
// into chunks of their own size, the grid's tiles past the last request's idle) match the CPU
// reference of the same call, on the FA2 kernel, split and not, and on the warp-per-row kernel
// (fp8), empty requests included.
TEST(TrtllmRaggedDeepseekCuda, PlannedOnTheDeviceForLooseBounds) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16, e4m3 = DType::kFloat8E4M3FN;
  struct Loose {
    Case c;
    int64_t max_q, max_kv;
  };
  const std::vector<Loose> cases = {
      {{bf16, bf16, 192, 128, 32, 32, true, -1, {600, 0, 600}, {600, 9, 700}}, 1024, 1000},
      {{bf16, bf16, 192, 128, 16, 16, true, -1, {37, 0, 5}, {37, 9, 300}}, 200, 4000},
      {{bf16, bf16, 192, 128, 16, 16, true, -1, {3, 1}, {5000, 200}}, 8, 9000},
      {{f16, f16, 128, 128, 8, 2, false, 40, {2, 7}, {600, 7}}, 16, 6000},
      {{e4m3, e4m3, 192, 128, 4, 4, true, -1, {6, 0, 2}, {6, 3, 50}}, 64, 1000},
  };
  int idx = 0, split = 0, unsplit = 0;
  for (const Loose& l : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const Case& c = l.c;
    if (!dtype_is_fp8(c.qk)) {
      (plan_splits(c, l.max_q, l.max_kv, gpu) ? split : unsplit)++;
    }
    Inputs in = make_inputs(c, 130 + idx);
    const auto B = static_cast<int64_t>(c.qo_lens.size());
    const double bmm1 = 0.6 / std::sqrt(static_cast<double>(c.dqk)), bmm2 = 0.8;
    const AttentionOutput want = trtllm_ragged_attention_deepseek(
        in.q, in.k, in.v, workspace(), in.seq_lens, l.max_q, l.max_kv, bmm1, bmm2, -1.0, B,
        c.window_left, in.cq, in.ckv, false, c.causal, true);
    const AttentionOutput got = trtllm_ragged_attention_deepseek(
        testing::to_keep_layout(in.q, gpu), in.k.to(gpu), in.v.to(gpu), workspace(gpu),
        in.seq_lens.to(gpu), l.max_q, l.max_kv, bmm1, bmm2, -1.0, B, c.window_left, in.cq.to(gpu),
        in.ckv.to(gpu), std::nullopt, c.causal, true);
    const testing::Tolerance tol = testing::attention_tolerance(want.out.dtype());
    EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()), want.out,
                                   {tol.atol * (dtype_is_fp8(c.qk) ? 4 : 1), tol.rtol}));
    EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()), want.lse, {2e-3, 1e-3}));
    ++idx;
  }
  EXPECT_GT(split, 0);  // grids the worst case splits, and one it fills without a split
  EXPECT_GT(unsplit, 0);
}

// vLLM's chunked-context prefill (mla/prefill/trtllm_ragged.py, run_prefill_context_chunk)
// passes its chunk's seq_lens as a host tensor and the cumulative lengths on the device: the
// lengths go up with the plan's inputs, the answer is the CPU's.
TEST(TrtllmRaggedDeepseekCuda, HostSeqLensAsVllmsChunkedContext) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const DType bf16 = DType::kBFloat16;
  const Case c{bf16, bf16, 192, 128, 16, 16, false, -1, {7, 30, 1}, {300, 64, 90}};
  Inputs in = make_inputs(c, 170);
  const double bmm1 = 1.0 / std::sqrt(192.0);
  const AttentionOutput want =
      trtllm_ragged_attention_deepseek(in.q, in.k, in.v, workspace(), in.seq_lens, 30, 300, bmm1,
                                       1.0, -1.0, 3, -1, in.cq, in.ckv, false, false, true);
  ASSERT_TRUE(in.seq_lens.device().is_cpu());
  const AttentionOutput got = trtllm_ragged_attention_deepseek(
      in.q.to(gpu), in.k.to(gpu), in.v.to(gpu), workspace(gpu), in.seq_lens, 30, 300, bmm1, 1.0,
      -1.0, 3, -1, in.cq.to(gpu), in.ckv.to(gpu), std::nullopt, false, true);
  EXPECT_TRUE(
      testing::all_close(got.out.to(Device::cpu()), want.out, testing::attention_tolerance(bf16)));
  EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()), want.lse, {2e-3, 1e-3}));
}

// Rows [lo, hi) of `got` (on the GPU) are NaN in every element, out and LSE.
void expect_nan_rows(const AttentionOutput& got, int64_t lo, int64_t hi) {
  for (const Tensor& t : {got.out, got.lse}) testing::expect_nan_rows(t, lo, hi);
}

// Rows [lo, hi) of `got` (on the GPU) match `want` (the CPU's).
void expect_rows(const AttentionOutput& got, const AttentionOutput& want, int64_t lo, int64_t hi,
                 bool fp8) {
  const testing::Tolerance tol = testing::attention_tolerance(want.out.dtype());
  EXPECT_TRUE(testing::all_close(got.out.to(Device::cpu()).slice(0, lo, hi),
                                 want.out.slice(0, lo, hi), {tol.atol * (fp8 ? 4 : 1), tol.rtol}));
  EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()).slice(0, lo, hi),
                                 want.lse.slice(0, lo, hi), {2e-3, 1e-3}));
}

// What the host checks refuse (and the CPU reference refuses by name), the device plan refuses
// without reading anything back: a request whose seq_lens disagrees with its key rows, or with
// more queries than max_q_len, gets NaN rows while the others are computed; index arrays the host
// would refuse whole (cum_seq_lens_q not ending at the query's rows, cum_seq_lens_kv decreasing)
// make every row NaN. On the FA2 kernel (bf16) and the warp-per-row kernel (fp8).
TEST(TrtllmRaggedDeepseekCuda, BadLengthsGiveNanRowsOnTheDevice) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const char* op = "trtllm_ragged_attention_deepseek";
  for (DType dt : {DType::kBFloat16, DType::kFloat8E4M3FN}) {
    SCOPED_TRACE(dtype_torch_name(dt));
    const bool fp8 = dtype_is_fp8(dt);
    const Case c{dt, dt, 192, 128, 4, 4, true, -1, {4, 6, 3}, {20, 30, 10}};
    Inputs in = make_inputs(c, 150);
    const double bmm1 = 0.5 / std::sqrt(192.0);
    const AttentionOutput want =
        trtllm_ragged_attention_deepseek(in.q, in.k, in.v, workspace(), in.seq_lens, 6, 30, bmm1,
                                         1.0, -1.0, 3, -1, in.cq, in.ckv, false, true, true);
    const Tensor qg = testing::to_keep_layout(in.q, gpu), kg = in.k.to(gpu), vg = in.v.to(gpu);
    auto call = [&](const std::vector<int32_t>& lens, const std::vector<int32_t>& cq,
                    const std::vector<int32_t>& ckv, int64_t max_q, Device d) {
      return trtllm_ragged_attention_deepseek(
          d.is_cuda() ? qg : in.q, d.is_cuda() ? kg : in.k, d.is_cuda() ? vg : in.v, workspace(d),
          int_tensor(lens).to(d), max_q, 30, bmm1, 1.0, -1.0, 3, -1, int_tensor(cq).to(d),
          int_tensor(ckv).to(d), std::nullopt, true, true);
    };
    const std::vector<int32_t> lens{20, 30, 10}, cq{0, 4, 10, 13}, ckv{0, 20, 50, 60};
    {
      SCOPED_TRACE("the lengths as given");
      const AttentionOutput got = call(lens, cq, ckv, 6, gpu);
      expect_rows(got, want, 0, 13, fp8);
    }
    {
      SCOPED_TRACE("seq_lens[1] disagrees with cum_seq_lens_kv");
      EXPECT_FI_ERROR(call({20, 31, 10}, cq, ckv, 6, Device::cpu()), op, "seq_lens");
      const AttentionOutput got = call({20, 31, 10}, cq, ckv, 6, gpu);
      expect_rows(got, want, 0, 4, fp8);
      expect_nan_rows(got, 4, 10);
      expect_rows(got, want, 10, 13, fp8);
    }
    {
      SCOPED_TRACE("request 1 has more queries than max_q_len");
      EXPECT_FI_ERROR(call(lens, cq, ckv, 5, Device::cpu()), op, "max_q_len");
      const AttentionOutput got = call(lens, cq, ckv, 5, gpu);
      expect_rows(got, want, 0, 4, fp8);
      expect_nan_rows(got, 4, 10);
      expect_rows(got, want, 10, 13, fp8);
    }
    {
      SCOPED_TRACE("cum_seq_lens_q ends before the query's last row");
      EXPECT_FI_ERROR(call(lens, {0, 4, 10, 12}, ckv, 6, Device::cpu()), op, "cum_seq_lens_q");
      expect_nan_rows(call(lens, {0, 4, 10, 12}, ckv, 6, gpu), 0, 13);
    }
    {
      SCOPED_TRACE("cum_seq_lens_kv decreases");
      EXPECT_FI_ERROR(call(lens, cq, {0, 20, 19, 60}, 6, Device::cpu()), op, "cum_seq_lens_kv");
      expect_nan_rows(call(lens, cq, {0, 20, 19, 60}, 6, gpu), 0, 13);
    }
  }
}

#if FLASHINFER_TEST_HAVE_CUDART
// Nothing is read back or synchronized: the call is captured into a CUDA graph after a warm-up,
// then replayed with other lengths written into the same device tensors (a chunked-prefill step
// of another shape), each replay matching the CPU reference of its lengths; a replay whose
// lengths break the rules gives NaN rows, and the next good one recovers.
TEST(TrtllmRaggedDeepseekCuda, CapturedCallReplaysNewLengths) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const int64_t nq = 40, nk = 3000, max_q = 32, max_kv = 2048;
  const DType bf16 = DType::kBFloat16;
  const Tensor q = testing::rand_tensor({nq, 8, 192}, bf16, 160, -1.0, 1.0);
  const Tensor k = testing::rand_tensor({nk, 8, 192}, bf16, 161, -1.0, 1.0);
  const Tensor v = testing::rand_tensor({nk, 8, 128}, bf16, 162, -1.0, 1.0);
  const Tensor qg = q.to(gpu), kg = k.to(gpu), vg = v.to(gpu), ws = workspace(gpu);
  Tensor lens_g = int_tensor({8, 2000, 100}).to(gpu);
  Tensor cq_g = int_tensor({0, 8, 32, 40}).to(gpu);
  Tensor ckv_g = int_tensor({0, 8, 2008, 2108}).to(gpu);
  Tensor out = Tensor::zeros({nq, 8, 128}, bf16, gpu);
  Tensor lse = Tensor::zeros({nq, 8}, DType::kFloat32, gpu);
  const double bmm1 = 1.0 / std::sqrt(192.0);
  auto call = [&] {
    trtllm_ragged_attention_deepseek(qg, kg, vg, ws, lens_g, max_q, max_kv, bmm1, 1.0, -1.0, 3, -1,
                                     cq_g, ckv_g, std::nullopt, true, false, std::nullopt,
                                     std::nullopt, out, lse);
  };
  testing::ReplayableGraph graph;
  ASSERT_NO_FATAL_FAILURE(testing::warm_up_for_replay(graph, call));
  ASSERT_NO_FATAL_FAILURE(testing::capture_for_replay(graph, call));
  struct Step {
    std::vector<int32_t> lens, cq, ckv;
    bool good;
  };
  const std::vector<Step> steps = {
      {{8, 2000, 100}, {0, 8, 32, 40}, {0, 8, 2008, 2108}, true},
      {{2048, 1, 900}, {0, 30, 31, 40}, {0, 2048, 2049, 2949}, true},
      {{2048, 1, 901}, {0, 30, 31, 40}, {0, 2048, 2049, 2949}, false},  // seq_lens[2] off by one
      {{40, 0, 8}, {0, 32, 32, 40}, {0, 40, 40, 48}, true},             // an empty request
  };
  for (const Step& st : steps) {
    SCOPED_TRACE(::testing::Message() << "cum_seq_lens_q ending request 0 at " << st.cq[1]);
    lens_g.copy_(int_tensor(st.lens));
    cq_g.copy_(int_tensor(st.cq));
    ckv_g.copy_(int_tensor(st.ckv));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(graph.exec, graph.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph.stream), cudaSuccess);
    AttentionOutput got{out, lse};
    std::vector<int32_t> lens = st.lens;
    if (!st.good) lens[2] = st.ckv[3] - st.ckv[2];  // the CPU's answer for the other requests
    const AttentionOutput want = trtllm_ragged_attention_deepseek(
        q, k, v, workspace(), int_tensor(lens), max_q, max_kv, bmm1, 1.0, -1.0, 3, -1,
        int_tensor(st.cq), int_tensor(st.ckv), false, true, true);
    expect_rows(got, want, 0, st.good ? nq : st.cq[2], false);
    if (!st.good) expect_nan_rows(got, st.cq[2], nq);
  }
  cudaGraphExecDestroy(graph.exec);
  cudaGraphDestroy(graph.graph);
  cudaStreamDestroy(graph.stream);
}
#endif

}  // namespace
}  // namespace flashinfer
