// fmha_v2_prefill_deepseek and fmha_v2_prefill_sm120: against an fp64 causal formula (bf16, fp16,
// fp8 e4m3 with the 256-scaled statistics, GQA, strided out/lse), the (max, sum) statistics
// format, bad input, record and replay, an upstream-format dump, and CUDA against the CPU
// (skipped without a GPU).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "flashinfer/ops/fmha_v2.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer {
namespace {

struct Dense {
  Tensor q, k, v;
};

Dense make_dense(int64_t B, int64_t S, int64_t H, int64_t hkv, int64_t D, int64_t dv, DType d,
                 uint64_t seed) {
  const double r = dtype_is_fp8(d) ? 4.0 : 1.0;
  return {testing::rand_tensor({B, S, H, D}, d, seed, -r, r),
          testing::rand_tensor({B, S, hkv, D}, d, seed + 1, -r, r),
          testing::rand_tensor({B, S, hkv, dv}, d, seed + 2, -r, r)};
}

// fp64 reference per batch entry: o [B*S*H*dv], lse base e [B*S*H], max score [B*S*H].
void reference(const Dense& x, double bmm1, double bmm2, bool causal, std::vector<double>& o,
               std::vector<double>& lse_e, std::vector<double>& mx) {
  const int64_t B = x.q.size(0), S = x.q.size(1), H = x.q.size(2), D = x.q.size(3);
  const int64_t hkv = x.k.size(2), dv = x.v.size(3);
  o.clear();
  lse_e.clear();
  mx.clear();
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<double> q = x.q.select(0, b).contiguous().to_double_vector();
    const std::vector<double> k = x.k.select(0, b).contiguous().to_double_vector();
    const std::vector<double> v = x.v.select(0, b).contiguous().to_double_vector();
    testing::RefOptions opt;
    opt.sm_scale = bmm1;
    opt.causal = causal;
    opt.v_scale = bmm2;
    std::vector<double> ob, lb;
    testing::ref_attention(q, k, v, S, S, H, hkv, D, dv, opt, ob, lb);
    o.insert(o.end(), ob.begin(), ob.end());
    for (double l : lb) lse_e.push_back(l * std::log(2.0));
    for (int64_t i = 0; i < S; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= (causal ? i : S - 1); ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += q[(i * H + h) * D + d] * k[(j * hkv + h / (H / hkv)) * D + d];
          }
          m = std::max(m, dot * bmm1);
        }
        mx.push_back(m);
      }
    }
  }
}

TEST(FmhaV2PrefillDeepseek, MatchesFp64FormulaAndStatistics) {
  struct Case {
    DType d, o;
    int64_t B, S, H, hkv;
    bool strided_out;
  };
  const std::vector<Case> cases = {
      {DType::kBFloat16, DType::kBFloat16, 2, 5, 3, 3, false},
      {DType::kFloat16, DType::kFloat16, 1, 7, 4, 2, true},
      {DType::kFloat8E4M3FN, DType::kBFloat16, 2, 4, 2, 2, false},
      {DType::kFloat8E4M3FN, DType::kFloat16, 1, 3, 2, 1, true},
  };
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    Dense x = make_dense(c.B, c.S, c.H, c.hkv, 192, 128, c.d, 20 + idx);
    const bool fp8 = dtype_is_fp8(c.d);
    const double bmm1 = (fp8 ? 0.25 : 1.0) / std::sqrt(192.0), bmm2 = fp8 ? 0.5 : 1.0;
    // A strided out: the first S slots of a longer buffer (batch and sequence axes do not
    // collapse into one row axis).
    Tensor big = Tensor::full({c.B, c.S + 1, c.H, 128}, 5.0, c.o);
    Tensor out = c.strided_out ? big.slice(1, 0, c.S) : Tensor::zeros({c.B, c.S, c.H, 128}, c.o);
    Tensor stats_big = Tensor::zeros({c.B, c.S + 2, c.H, 2}, DType::kFloat32);
    std::optional<Tensor> stats;
    if (c.strided_out) stats = stats_big.slice(1, 1, c.S + 1);
    AttentionOutput r = fmha_v2_prefill_deepseek(x.q, x.k, x.v, out, c.H, 192, c.S, fp8 ? 1.0 : 0.0,
                                                 bmm1, bmm2, true, stats);
    EXPECT_EQ(r.out.data_ptr(), out.data_ptr());
    ASSERT_EQ(r.lse.shape(), (Shape{c.B, c.S, c.H, 2}));
    std::vector<double> o, lse_e, mx;
    reference(x, bmm1, bmm2, true, o, lse_e, mx);
    const testing::Tolerance tol = testing::attention_tolerance(c.o);
    EXPECT_TRUE(testing::all_close(out.contiguous(), o, {tol.atol * (fp8 ? 4 : 1), tol.rtol}));
    if (c.strided_out) {
      // The slot past the view stays untouched.
      EXPECT_TRUE(testing::all_close(big.slice(1, c.S, c.S + 1).contiguous(),
                                     std::vector<double>(c.B * c.H * 128, 5.0), {0, 0}));
    }
    const std::vector<double> st = r.lse.contiguous().to_double_vector();
    const double descale = fp8 ? 256.0 : 1.0;
    std::vector<double> got_m, got_lse;
    for (std::size_t i = 0; i < st.size(); i += 2) {
      got_m.push_back(st[i]);
      got_lse.push_back(st[i] + std::log(st[i + 1] / descale));
    }
    EXPECT_TRUE(testing::all_close(got_m, mx, {1e-4, 1e-4}));
    EXPECT_TRUE(testing::all_close(got_lse, lse_e, {2e-4, 2e-4}));
    ++idx;
  }
}

TEST(FmhaV2PrefillSm120, CausalFlagDimsAndReturn) {
  Dense x = make_dense(2, 6, 4, 2, 128, 64, DType::kBFloat16, 40);
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    Tensor out = Tensor::zeros({2, 6, 4, 64}, DType::kBFloat16);
    AttentionOutput r =
        fmha_v2_prefill_sm120(x.q, x.k, x.v, out, 4, 128, 6, 0.0, 0.09, 1.5, causal, false);
    EXPECT_FALSE(r.lse.defined());
    std::vector<double> o, lse_e, mx;
    reference(x, 0.09, 1.5, causal, o, lse_e, mx);
    EXPECT_TRUE(testing::all_close(out, o, testing::attention_tolerance(DType::kBFloat16)));
  }
  // Defaults: both scales 1.
  Dense y = make_dense(1, 3, 1, 1, 64, 64, DType::kFloat16, 41);
  Tensor out = Tensor::zeros({1, 3, 1, 64}, DType::kFloat16);
  fmha_v2_prefill_sm120(y.q, y.k, y.v, out, 1, 64, 3, std::nullopt);
  std::vector<double> o, lse_e, mx;
  reference(y, 1.0, 1.0, true, o, lse_e, mx);
  EXPECT_TRUE(testing::all_close(out, o, testing::attention_tolerance(DType::kFloat16)));
}

TEST(FmhaV2Prefill, BadInput) {
  const char* op = "fmha_v2_prefill_deepseek";
  Dense x = make_dense(1, 4, 2, 2, 192, 128, DType::kBFloat16, 50);
  Tensor out = Tensor::zeros({1, 4, 2, 128}, DType::kBFloat16);
  auto call = [&](const Tensor& q, const Tensor& o, int64_t H, int64_t D, int64_t S,
                  std::optional<Tensor> lse = std::nullopt,
                  std::optional<Tensor> d1 = std::nullopt) {
    fmha_v2_prefill_deepseek(q, x.k, x.v, o, H, D, S, 0.0, 0.1, 1.0, false, lse, d1);
  };
  call(x.q, out, 2, 192, 4);  // valid
  EXPECT_FI_ERROR(call(x.q, out, 3, 192, 4), op, "num_heads");
  EXPECT_FI_ERROR(call(x.q, out, 2, 128, 4), op, "head_dim");
  EXPECT_FI_ERROR(call(x.q, out, 2, 192, 5), op, "seq_len");
  EXPECT_FI_ERROR(call(x.q.to(DType::kFloat16), out, 2, 192, 4), op, "key");
  EXPECT_FI_ERROR(call(x.q, Tensor::zeros({1, 4, 2, 128}, DType::kFloat8E4M3FN), 2, 192, 4), op,
                  "out");
  EXPECT_FI_ERROR(call(x.q, Tensor::zeros({1, 4, 2, 64}, DType::kBFloat16), 2, 192, 4), op, "out");
  EXPECT_FI_ERROR(call(x.q, out, 2, 192, 4, Tensor::zeros({1, 4, 2}, DType::kFloat32)), op, "lse");
  EXPECT_FI_ERROR(call(x.q, x.q, 2, 192, 4), op, "out");
  EXPECT_FI_ERROR(call(x.q, out, 2, 192, 4, std::nullopt, Tensor::full({1}, 0.1, DType::kFloat32)),
                  op, "scale_bmm1_d");
  Dense y = make_dense(1, 4, 2, 2, 128, 128, DType::kBFloat16, 51);
  EXPECT_FI_ERROR(fmha_v2_prefill_deepseek(y.q, y.k, y.v, out, 2, 128, 4, 0.0), op, "query");
}

TEST(FmhaV2Prefill, RecordAndReplay) {
  Dense x = make_dense(1, 4, 2, 1, 192, 128, DType::kBFloat16, 60);
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    Tensor out = Tensor::zeros({1, 4, 2, 128}, DType::kBFloat16);
    fmha_v2_prefill_deepseek(x.q, x.k, x.v, out, 2, 192, 4, 0.0, 0.07, 1.0, true);
    Tensor out2 = Tensor::zeros({1, 4, 2, 128}, DType::kBFloat16);
    fmha_v2_prefill_sm120(x.q, x.k, x.v, out2, 2, 192, 4, 0.0, 0.07, 1.0, false);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_TRUE(calls[0].result.is_sequence());
  for (const auto& call : calls) EXPECT_TRUE(testing::replays_identically(call));
}

// Written by Python as upstream's recorder writes it: upstream's own test call (positional
// q, k, v, o, num_heads, head_dim, seq_len; scales and lse by keyword, return_lse=True), the
// expected statistics computed by torch in fp64.
TEST(FmhaV2Prefill, UpstreamWrittenDumpReplays) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_fmha_v2_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string py = R"PY(
import json, math, os, sys
try:
    import torch
except ImportError:
    sys.exit(77)
d = sys.argv[1] + "/20261122_171000_001_pid4242_fmha_v2_prefill_deepseek_call0001"
os.makedirs(d)
torch.manual_seed(1)
B, S, H = 2, 6, 2
q = torch.randn(B, S, H, 192).to(torch.bfloat16)
k = torch.randn(B, S, H, 192).to(torch.bfloat16)
v = torch.randn(B, S, H, 128).to(torch.bfloat16)
o = torch.zeros(B, S, H, 128, dtype=torch.bfloat16)
lse = torch.zeros(B, S, H, 2, dtype=torch.float32)
scale = 1.0 / math.sqrt(192)
s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * scale
mask = torch.ones(S, S, dtype=torch.bool).tril()
s = s.masked_fill(~mask, float("-inf"))
out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v.double())
m = s.amax(-1)
stats = torch.stack([m, torch.exp(s - m[..., None]).sum(-1)], -1).permute(0, 2, 1, 3)
inputs = {"arg_0": q, "arg_1": k, "arg_2": v, "arg_3": o, "kwarg_lse": lse}
torch.save(inputs, d + "/inputs.pt")
torch.save({"result_0": out.to(torch.bfloat16), "result_1": stats.float()}, d + "/outputs.pt")
rec = {"function_name": "fmha_v2_prefill_deepseek", "module": "flashinfer.prefill",
       "call_sequence": 1, "timestamp": "20261122_171000_001", "process_id": 4242,
       "input_metadata": {"arg_4": H, "arg_5": 192, "arg_6": S, "kwarg_scale_softmax": 0.0,
                          "kwarg_scale_bmm1": scale, "kwarg_scale_bmm2": 1.0,
                          "kwarg_return_lse": True},
       "output_metadata": {},
       "tensor_info": {"input_tensor_keys": list(inputs.keys()),
                       "output_tensor_keys": ["result_0", "result_1"]},
       "tensor_format": "torch", "execution_status": "completed"}
with open(d + "/metadata.jsonl", "w") as f:
    f.write(json.dumps(rec) + "\n")
)PY";
  // The script writes the one call directory into the dump; the call must replay and pass.
  if (!testing::run_dump_script(dir, py, dir, 1u)) GTEST_SKIP() << "python3-torch not installed";
}

TEST(FmhaV2PrefillCuda, MatchesCpu) {
  if (!testing::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  for (DType d : {DType::kBFloat16, DType::kFloat8E4M3FN}) {
    SCOPED_TRACE(dtype_torch_name(d));
    Dense x = make_dense(2, 70, 4, 2, 192, 128, d, 80);
    Tensor out = Tensor::zeros({2, 70, 4, 128}, DType::kBFloat16);
    AttentionOutput want =
        fmha_v2_prefill_deepseek(x.q, x.k, x.v, out, 4, 192, 70, 1.0, 0.05, 0.5, true);
    Tensor out_d = Tensor::zeros({2, 70, 4, 128}, DType::kBFloat16, gpu);
    AttentionOutput got = fmha_v2_prefill_deepseek(x.q.to(gpu), x.k.to(gpu), x.v.to(gpu), out_d, 4,
                                                   192, 70, 1.0, 0.05, 0.5, true);
    EXPECT_TRUE(testing::all_close(out_d.to(Device::cpu()), want.out,
                                   testing::attention_tolerance(DType::kBFloat16)));
    EXPECT_TRUE(testing::all_close(got.lse.to(Device::cpu()), want.lse, {1e-4, 1e-4}));
  }
}

}  // namespace
}  // namespace flashinfer
