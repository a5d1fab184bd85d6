// BatchAttentionWithAttentionSinkWrapper: against an fp64 formula (a per-head sink logit in the
// softmax denominator, upstream's test math), causal and sliding window, GQA, fp16/bf16 and fp8
// KV; run's sm_scale replacing plan's; the jit arguments upstream records; bad input; record and
// replay; a Python-written upstream-format dump (the parent's keyword __init__, positional
// run(q, (k, v), sink, sm_scale)).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "flashinfer/api_log.h"
#include "flashinfer/ops/attention_sink.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

namespace flashinfer {
namespace {

constexpr const char* kInit = "BatchAttentionWithAttentionSinkWrapper.__init__";
constexpr const char* kRun = "BatchAttentionWithAttentionSinkWrapper.run";

// o[i, h] = sum_j e^{s_j} v_j / (sum_j e^{s_j} + e^{sink[h]}), s_j = scale * q.k_j over the keys
// query i sees (right-aligned causal, window_left).
std::vector<double> sink_reference(const std::vector<double>& q, const std::vector<double>& k,
                                   const std::vector<double>& v, int64_t qo, int64_t kv, int64_t hq,
                                   int64_t hkv, int64_t d, double scale,
                                   const std::vector<double>& sink, bool causal,
                                   int64_t window_left) {
  std::vector<double> o(static_cast<std::size_t>(qo * hq * d), 0.0);
  for (int64_t i = 0; i < qo; ++i) {
    const int64_t pos = kv - qo + i;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hkv);
      std::vector<std::pair<int64_t, double>> s;
      double m = sink[h];
      for (int64_t j = 0; j < kv; ++j) {
        if ((causal && j > pos) || (window_left >= 0 && j < pos - window_left)) continue;
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += q[(i * hq + h) * d + e] * k[(j * hkv + g) * d + e];
        s.emplace_back(j, scale * dot);
        m = std::max(m, scale * dot);
      }
      if (s.empty()) continue;
      double den = std::exp(sink[h] - m);
      for (const auto& [j, x] : s) den += std::exp(x - m);
      for (const auto& [j, x] : s) {
        for (int64_t e = 0; e < d; ++e) {
          o[(i * hq + h) * d + e] += std::exp(x - m) / den * v[(j * hkv + g) * d + e];
        }
      }
    }
  }
  return o;
}

TEST(AttentionSinkWrapper, MatchesFp64Formula) {
  struct Case {
    DType q, kv;
    int64_t hq, hkv, page, window;
    bool causal, hnd;
    double run_scale;  // 0: run passes None (plan's scale)
  };
  const std::vector<Case> cases = {
      {DType::kBFloat16, DType::kBFloat16, 4, 2, 4, -1, true, false, 0.0},
      {DType::kFloat16, DType::kFloat16, 4, 4, 3, 3, true, true, 0.2},
      {DType::kBFloat16, DType::kFloat8E4M3FN, 8, 2, 5, -1, false, false, 0.15},
      {DType::kFloat16, DType::kFloat16, 2, 1, 1, 1, true, false, 0.3},
  };
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const int64_t D = 64;
    const std::vector<int32_t> qo = {3, 1, 4}, kv = {7, 5, 4};
    std::vector<std::vector<double>> kd, vd;
    testing::PagedFixture f =
        testing::make_paged(kv, c.page, c.hkv, D, c.kv, c.hnd, idx % 2 == 1, 60 + idx, kd, vd);
    const Tensor q = testing::rand_tensor({8, c.hq, D}, c.q, 70 + idx, -1.0, 1.0);
    Tensor sink = Tensor::empty({c.hq}, DType::kFloat32);
    std::vector<double> sd;
    for (int64_t h = 0; h < c.hq; ++h) {
      sink.data<float>()[h] = static_cast<float>(0.5 * h - 1.0);
      sd.push_back(0.5 * h - 1.0);
    }
    auto w = BatchAttentionWithAttentionSinkWrapper::create(
        Tensor::zeros({4096}, DType::kUInt8), c.hnd ? "HND" : "NHD", false, std::nullopt,
        std::nullopt, "fa2", "NONE", false, c.q, c.kv, D, D, c.window);
    PrefillPlanOptions po;
    po.causal = c.causal;
    po.window_left = c.window;
    po.q_data_type = c.q;
    po.kv_data_type = c.kv;
    w->plan(testing::int_tensor({0, 3, 4, 8}), f.indptr, f.indices, f.last_page_len, c.hq, c.hkv, D,
            c.page, po);
    AttentionRunOptions ro;
    const double kscale = dtype_is_fp8(c.kv) ? 0.5 : 1.0;
    if (dtype_is_fp8(c.kv)) ro.k_scale = ro.v_scale = kscale;
    const AttentionOutput r =
        w->run(q, f.cache(), sink,
               c.run_scale > 0 ? std::optional<double>(c.run_scale) : std::nullopt, ro);
    const double scale = (c.run_scale > 0 ? c.run_scale : 1.0 / std::sqrt(double(D))) * kscale;
    const std::vector<double> qd = q.contiguous().to_double_vector();
    std::vector<double> want;
    int64_t row = 0;
    for (std::size_t b = 0; b < qo.size(); ++b) {
      std::vector<double> vb = vd[b];
      for (double& x : vb) x *= kscale;
      const auto ob = sink_reference(testing::rows_of(qd, row, row + qo[b], c.hq * D), kd[b], vb,
                                     qo[b], kv[b], c.hq, c.hkv, D, scale, sd, c.causal, c.window);
      want.insert(want.end(), ob.begin(), ob.end());
      row += qo[b];
    }
    EXPECT_TRUE(testing::all_close(r.out, want, testing::attention_tolerance(c.q)));
    ++idx;
  }
}

// Hand-checked: two keys with equal scores, values 1 and 3, sink ln 2: (1 + 3) / (1 + 1 + 2) = 1.
TEST(AttentionSinkWrapper, Golden) {
  Tensor kc = Tensor::zeros({1, 2, 1, 16}, DType::kFloat16);
  Tensor vc = Tensor::zeros({1, 2, 1, 16}, DType::kFloat16);
  vc.select(1, 0).fill_(1.0);
  vc.select(1, 1).fill_(3.0);
  auto w = BatchAttentionWithAttentionSinkWrapper::create(
      Tensor::zeros({1 << 16}, DType::kUInt8), "NHD", false, std::nullopt, std::nullopt, "auto",
      "NONE", false, DType::kFloat16, DType::kFloat16, 16, 16);
  PrefillPlanOptions po;
  po.q_data_type = DType::kFloat16;
  w->plan(testing::int_tensor({0, 1}), testing::int_tensor({0, 1}), testing::int_tensor({0}),
          testing::int_tensor({2}), 1, 1, 16, 2, po);
  const AttentionOutput r = w->run(Tensor::zeros({1, 1, 16}, DType::kFloat16), PagedKVCache(kc, vc),
                                   Tensor::full({1}, std::log(2.0), DType::kFloat32), 0.125);
  EXPECT_TRUE(testing::all_close(r.out, std::vector<double>(16, 1.0), {1e-3, 0}));
}

TEST(AttentionSinkWrapper, CreateRecordsUpstreamJitArguments) {
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    BatchAttentionWithAttentionSinkWrapper::create(
        Tensor::zeros({64}, DType::kUInt8), "NHD", false, std::nullopt, std::nullopt, "auto",
        "NONE", false, DType::kBFloat16, DType::kBFloat16, 64, 64, 127);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, kInit);
  const Value& args = calls[0].inputs.at(11);
  ASSERT_TRUE(args.is_sequence());
  EXPECT_EQ(args.items()[0].as_string(), "batch_prefill_attention_sink_bf16_swa_True_fa2");
  EXPECT_EQ(args.items()[11].as_string(), "AttentionSink");
  EXPECT_EQ(calls[0].inputs.at(10).as_string(), "fa2");
}

TEST(AttentionSinkWrapper, BadInput) {
  const Tensor ws = Tensor::zeros({1 << 16}, DType::kUInt8);
  EXPECT_FI_ERROR(BatchAttentionWithAttentionSinkWrapper w(ws), kInit, "jit_args");
  Value other = Value::list({Value("u"), Value(DType::kFloat16), Value(DType::kFloat16),
                             Value(DType::kFloat16), Value(DType::kInt32), Value(64), Value(64),
                             Value::list({}), Value::list({}), Value::list({}), Value::list({}),
                             Value("LogitsSoftCap"), Value("")});
  EXPECT_FI_ERROR(BatchAttentionWithAttentionSinkWrapper(ws, "NHD", false, std::nullopt,
                                                         std::nullopt, std::nullopt, std::nullopt,
                                                         std::nullopt, std::nullopt, "fa2", other),
                  kInit, "jit_args");
  EXPECT_FI_ERROR(BatchAttentionWithAttentionSinkWrapper::create(ws, "NHD", false, std::nullopt,
                                                                 std::nullopt, "fa2", "ROPE_LLAMA"),
                  kInit, "jit_kwargs");
  EXPECT_FI_ERROR(BatchAttentionWithAttentionSinkWrapper::create(ws, "NHD", false, std::nullopt,
                                                                 std::nullopt, "cudnn"),
                  kInit, "backend");
  auto w = BatchAttentionWithAttentionSinkWrapper::create(ws, "NHD", false, std::nullopt,
                                                          std::nullopt, "fa2", "NONE", false,
                                                          DType::kFloat16, DType::kFloat16, 16, 16);
  Tensor kc = Tensor::zeros({1, 2, 1, 16}, DType::kFloat16);
  const Tensor q = Tensor::zeros({1, 1, 16}, DType::kFloat16);
  EXPECT_FI_ERROR(w->run(q, PagedKVCache(kc, kc), Tensor::zeros({1}, DType::kFloat32), 0.1), kRun,
                  "self");
  PrefillPlanOptions po;
  po.q_data_type = DType::kFloat16;
  w->plan(testing::int_tensor({0, 1}), testing::int_tensor({0, 1}), testing::int_tensor({0}),
          testing::int_tensor({2}), 1, 1, 16, 2, po);
  AttentionRunOptions ro;
  ro.sinks = Tensor::zeros({1}, DType::kFloat32);
  EXPECT_FI_ERROR(w->run(q, PagedKVCache(kc, kc), Tensor::zeros({1}, DType::kFloat32), 0.1, ro),
                  kRun, "sinks");
  EXPECT_FI_ERROR(w->run(q, PagedKVCache(kc, kc), Tensor::zeros({1}, DType::kFloat32), NAN), kRun,
                  "sm_scale");
}

TEST(AttentionSinkWrapper, RecordAndReplay) {
  std::vector<std::vector<double>> kd, vd;
  testing::PagedFixture f =
      testing::make_paged({5, 3}, 2, 2, 32, DType::kBFloat16, false, false, 90, kd, vd);
  const Tensor q = testing::rand_tensor({4, 4, 32}, DType::kBFloat16, 91, -1.0, 1.0);
  auto capture = std::make_shared<testing::CallCapture>();
  add_call_observer(capture);
  Tensor direct;
  {
    auto w = BatchAttentionWithAttentionSinkWrapper::create(
        Tensor::zeros({4096}, DType::kUInt8), "NHD", false, std::nullopt, std::nullopt, "fa2",
        "NONE", false, DType::kBFloat16, DType::kBFloat16, 32, 32);
    PrefillPlanOptions po;
    po.causal = true;
    po.q_data_type = DType::kBFloat16;
    w->plan(testing::int_tensor({0, 2, 4}), f.indptr, f.indices, f.last_page_len, 4, 2, 32, 2, po);
    direct = w->run(q, f.cache(), testing::rand_tensor({4}, DType::kFloat32, 92), 0.2).out;
  }
  remove_call_observer(capture);
  // Only the wrapper's own methods: the paged prefill wrapper inside is not observed.
  ASSERT_EQ(capture->calls.size(), 3u);
  EXPECT_EQ(capture->calls[2].decl->name, kRun);
  const std::vector<Value> replayed = capture->replay();
  ASSERT_TRUE(replayed[2].is_tensor());
  EXPECT_TRUE(testing::all_close(replayed[2].as_tensor(), direct, {0, 0}));
}

// Written by Python as upstream's recorder writes the calls SGLang makes: __init__ recorded with
// the parent's keyword arguments (jit_args / jit_kwargs built by the subclass), plan positional
// plus keywords, run(q, (k_cache, v_cache), sink, sm_scale) positional; one self_id.
constexpr const char* kWrapperDumpPy = R"PY(
import json, math, os, sys
try:
    import torch
except ImportError:
    sys.exit(77)
root = sys.argv[1]
torch.manual_seed(5)
H, HKV, D, PS = 4, 2, 64, 4
SELF = 140234567890123
def obj():
    return {"type": "BatchAttentionWithAttentionSinkWrapper",
            "repr": "<flashinfer.attention.BatchAttentionWithAttentionSinkWrapper object at 0x%x>" % SELF}
def ser(v):
    if isinstance(v, torch.dtype):
        return {"type": "torch.dtype", "value": str(v)}
    if isinstance(v, (list, tuple)):
        return {"type": "list" if isinstance(v, list) else "tuple", "length": len(v),
                "items": [ser(x) for x in v], "truncated": False}
    if isinstance(v, dict):
        return {"type": "dict", "length": len(v), "truncated": False,
                "items": [{"key": ser(k), "value": ser(x)} for k, x in v.items()]}
    return v
def write(seq, name, inputs, meta, outputs, out_meta):
    d = os.path.join(root, "20261122_204000_%03d_pid4242_%s_call%04d" % (seq, name, seq))
    os.makedirs(d)
    torch.save(inputs, d + "/inputs.pt")
    torch.save(outputs, d + "/outputs.pt")
    meta = dict(meta, arg_0=obj())
    rec = {"function_name": name, "module": "flashinfer.prefill", "call_sequence": seq,
           "timestamp": "20261122_204000_%03d" % seq, "process_id": 4242,
           "input_metadata": meta, "output_metadata": out_meta,
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": list(outputs)},
           "tensor_format": "torch", "execution_status": "completed", "self_id": SELF}
    with open(d + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")

jit_args = ["batch_prefill_attention_sink_bf16_swa_False_fa2", torch.bfloat16, torch.bfloat16,
            torch.bfloat16, torch.int32, D, D, ["sink"], ["float"], ["sm_scale"], ["double"],
            "AttentionSink", "<the variant's CUDA source>"]
jit_kwargs = {"use_sliding_window": False, "use_fp16_qk_reduction": False, "pos_encoding_mode": 0}
write(1, "BatchAttentionWithAttentionSinkWrapper.__init__",
      {"kwarg_float_workspace_buffer": torch.zeros(4096, dtype=torch.uint8)},
      {"kwarg_kv_layout": "NHD", "kwarg_use_cuda_graph": False, "kwarg_qo_indptr_buf": None,
       "kwarg_paged_kv_indptr_buf": None, "kwarg_paged_kv_indices_buf": None,
       "kwarg_paged_kv_last_page_len_buf": None, "kwarg_custom_mask_buf": None,
       "kwarg_mask_indptr_buf": None, "kwarg_backend": "fa2", "kwarg_jit_args": ser(jit_args),
       "kwarg_jit_kwargs": ser(jit_kwargs)},
      {}, {"result": None})

qlens, kvlens = [2, 3], [6, 3]
pages = [[4, 0], [2]]
kc = torch.randn(6, PS, HKV, D).to(torch.bfloat16)
vc = torch.randn(6, PS, HKV, D).to(torch.bfloat16)
indptr = torch.tensor([0, 2, 3], dtype=torch.int32)
indices = torch.tensor([4, 0, 2], dtype=torch.int32)
last = torch.tensor([2, 3], dtype=torch.int32)
qo = torch.tensor([0, 2, 5], dtype=torch.int32)
write(2, "BatchAttentionWithAttentionSinkWrapper.plan",
      {"arg_1": qo, "arg_2": indptr, "arg_3": indices, "arg_4": last},
      {"arg_5": H, "arg_6": HKV, "arg_7": D, "arg_8": PS, "kwarg_causal": True,
       "kwarg_window_left": -1, "kwarg_q_data_type": ser(torch.bfloat16),
       "kwarg_kv_data_type": ser(torch.bfloat16)},
      {}, {"result": None})

q = torch.randn(5, H, D).to(torch.bfloat16)
sink = torch.randn(H, dtype=torch.float32)
scale = D ** -0.5
out = torch.zeros(5, H, D, dtype=torch.float64)
row = 0
for b in range(2):
    k = torch.cat([kc[p] for p in pages[b]])[: kvlens[b]].double()
    v = torch.cat([vc[p] for p in pages[b]])[: kvlens[b]].double()
    for i in range(qlens[b]):
        pos = kvlens[b] - qlens[b] + i
        for h in range(H):
            g = h // (H // HKV)
            s = (k[: pos + 1, g] @ q[row + i, h].double()) * scale
            full = torch.cat([s, sink[h : h + 1].double()])
            p = torch.softmax(full, 0)[:-1]
            out[row + i, h] = p @ v[: pos + 1, g]
    row += qlens[b]
write(3, "BatchAttentionWithAttentionSinkWrapper.run",
      {"arg_1": q, "arg_2__0": kc, "arg_2__1": vc, "arg_3": sink},
      {"arg_2": {"type": "tuple", "length": 2, "truncated": False,
                 "items": [{"type": "torch.Tensor", "tensor_key": "arg_2__0"},
                           {"type": "torch.Tensor", "tensor_key": "arg_2__1"}]},
       "arg_4": scale},
      {"result": out.to(torch.bfloat16)}, {})
)PY";

// ---- The plain prefill wrappers built with the AttentionSink variant's jit_args (upstream's
// tests/attention/test_attention_sink.py): run(q, kv, sink, sm_scale) through run's *args.

// Upstream's jit_args list for the variant (the CUDA source string stands in as text).
Value sink_jit_args(DType dt, int64_t d) {
  return Value::list({Value("batch_prefill_attention_sink_bf16_swa_False_fa2"), Value(dt),
                      Value(dt), Value(dt), Value(DType::kInt32), Value(d), Value(d),
                      Value::list({Value("sink")}), Value::list({Value("float")}),
                      Value::list({Value("sm_scale")}), Value::list({Value("double")}),
                      Value("AttentionSink"), Value("<the variant's CUDA source>")});
}
Value sink_jit_kwargs() { return Value::dict({{Value("use_sliding_window"), Value(false)}}); }

AttentionRunOptions variant_args(const Tensor& sink, double sm_scale) {
  AttentionRunOptions o;
  o.args = Value::tuple({Value(sink), Value(sm_scale)});
  return o;
}

TEST(SinkJitArgs, RaggedAndPagedWrappersMatchFp64) {
  const int64_t D = 64, hq = 4, hkv = 2;
  const std::vector<int32_t> qo = {3, 1, 4}, kv = {7, 5, 4};
  for (const DType dt : {DType::kFloat16, DType::kBFloat16}) {
    for (const bool causal : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype_torch_name(dt) << " causal " << causal);
      const Tensor q = testing::rand_tensor({8, hq, D}, dt, 31, -1.0, 1.0);
      const Tensor k = testing::rand_tensor({16, hkv, D}, dt, 32, -1.0, 1.0);
      const Tensor v = testing::rand_tensor({16, hkv, D}, dt, 33, -1.0, 1.0);
      const Tensor sink = testing::rand_tensor({hq}, DType::kFloat32, 34, 0.0, 5.0);
      const double scale = 0.15;
      BatchPrefillWithRaggedKVCacheWrapper w(Tensor::zeros({4096}, DType::kUInt8), "NHD", false,
                                             std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                             "fa2", sink_jit_args(dt, D), sink_jit_kwargs());
      PrefillPlanOptions po;
      po.causal = causal;
      po.q_data_type = dt;
      w.plan(testing::int_tensor({0, 3, 4, 8}), testing::int_tensor({0, 7, 12, 16}), hq, hkv, D,
             po);
      const AttentionOutput r = w.run(q, k, v, variant_args(sink, scale));
      const std::vector<double> qd = q.to_double_vector(), kd = k.to_double_vector(),
                                vd = v.to_double_vector(), sd = sink.to_double_vector();
      std::vector<double> want;
      int64_t row = 0, col = 0;
      for (std::size_t b = 0; b < qo.size(); ++b) {
        const auto ob = sink_reference(testing::rows_of(qd, row, row + qo[b], hq * D),
                                       testing::rows_of(kd, col, col + kv[b], hkv * D),
                                       testing::rows_of(vd, col, col + kv[b], hkv * D), qo[b],
                                       kv[b], hq, hkv, D, scale, sd, causal, -1);
        want.insert(want.end(), ob.begin(), ob.end());
        row += qo[b];
        col += kv[b];
      }
      EXPECT_TRUE(testing::all_close(r.out, want, testing::attention_tolerance(dt)));

      // The paged wrapper with the same jit_args gives BatchAttentionWithAttentionSinkWrapper's
      // result (one page per token, upstream's test layout).
      const Tensor pk = k.unsqueeze(1), pv = v.unsqueeze(1);
      std::vector<int32_t> idx(16);
      for (int32_t i = 0; i < 16; ++i) idx[i] = i;
      PrefillPlanOptions pp = po;
      BatchPrefillWithPagedKVCacheWrapper pw(Tensor::zeros({4096}, DType::kUInt8), "NHD", false,
                                             std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                             std::nullopt, std::nullopt, "fa3",
                                             sink_jit_args(dt, D), sink_jit_kwargs());
      pw.plan(testing::int_tensor({0, 3, 4, 8}), testing::int_tensor({0, 7, 12, 16}),
              testing::int_tensor(idx), testing::int_tensor({1, 1, 1}), hq, hkv, D, 1, pp);
      const AttentionOutput pr = pw.run(q, PagedKVCache(pk, pv), variant_args(sink, scale));
      EXPECT_TRUE(testing::all_close(pr.out, want, testing::attention_tolerance(dt)));
      auto sw = BatchAttentionWithAttentionSinkWrapper::create(
          Tensor::zeros({4096}, DType::kUInt8), "NHD", false, std::nullopt, std::nullopt, "fa2",
          "NONE", false, dt, dt, D, D, -1);
      sw->plan(testing::int_tensor({0, 3, 4, 8}), testing::int_tensor({0, 7, 12, 16}),
               testing::int_tensor(idx), testing::int_tensor({1, 1, 1}), hq, hkv, D, 1, pp);
      EXPECT_TRUE(testing::all_close(sw->run(q, PagedKVCache(pk, pv), sink, scale).out, pr.out,
                                     {0.0, 0.0}));
    }
  }
}

// The binder: values past run's positional parameters go to *args, as upstream's recorder
// writes them (arg_4 / arg_5 of the ragged run); the signature text keeps `*args`.
TEST(SinkJitArgs, PositionalValuesBindToArgs) {
  const OpDecl* run = OpRegistry::global().find("BatchPrefillWithRaggedKVCacheWrapper.run");
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->signature().find("args="), std::string::npos) << run->signature();
  EXPECT_NE(run->signature().find("(self, q, k, v, *args, q_scale=None"), std::string::npos)
      << run->signature();
  auto w = std::make_shared<BatchPrefillWithRaggedKVCacheWrapper>(
      Tensor::zeros({1 << 16}, DType::kUInt8), "NHD", false, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt, "fa2", sink_jit_args(DType::kFloat16, 32), std::nullopt);
  PrefillPlanOptions po;
  w->plan(testing::int_tensor({0, 2}), testing::int_tensor({0, 3}), 2, 1, 32, po);
  const Tensor q = testing::rand_tensor({2, 2, 32}, DType::kFloat16, 41, -1.0, 1.0);
  const Tensor k = testing::rand_tensor({3, 1, 32}, DType::kFloat16, 42, -1.0, 1.0);
  const Tensor v = testing::rand_tensor({3, 1, 32}, DType::kFloat16, 43, -1.0, 1.0);
  const Tensor sink = Tensor::full({2}, 1.5, DType::kFloat32);
  const Value self = to_value(*w);
  const std::vector<Value> bound =
      bind_arguments(*run, {self, Value(q), Value(k), Value(v), Value(sink), Value(0.25)});
  const int ai = run->param_index("args");
  ASSERT_GE(ai, 0);
  ASSERT_TRUE(bound[static_cast<std::size_t>(ai)].is_sequence());
  EXPECT_EQ(bound[static_cast<std::size_t>(ai)].items().size(), 2u);
  const Value r = run->invoke(CallArgs(*run, bound));
  ASSERT_TRUE(r.is_tensor());
  EXPECT_TRUE(
      testing::all_close(r.as_tensor(), w->run(q, k, v, variant_args(sink, 0.25)).out, {0, 0}));
  // *args given positionally and by keyword.
  EXPECT_FI_ERROR(bind_arguments(*run, {self, Value(q), Value(k), Value(v), Value(sink)},
                                 {{"args", Value::tuple({Value(sink)})}}),
                  "BatchPrefillWithRaggedKVCacheWrapper.run", "args");
  // Ops without an `args` parameter still refuse extra positional values.
  const OpDecl* dec = OpRegistry::global().find("BatchDecodeWithPagedKVCacheWrapper.run");
  ASSERT_NE(dec, nullptr);
  EXPECT_FI_ERROR(bind_arguments(*dec, {Value(), Value(q), Value(k), Value(sink)}),
                  "BatchDecodeWithPagedKVCacheWrapper.run", "args");
}

TEST(SinkJitArgs, BadInput) {
  const Tensor ws = Tensor::zeros({1 << 16}, DType::kUInt8);
  const char* init = "BatchPrefillWithRaggedKVCacheWrapper.__init__";
  const char* run = "BatchPrefillWithRaggedKVCacheWrapper.run";
  auto make = [&](Value jit_args, std::optional<Value> jit_kwargs) {
    return BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", false, std::nullopt, std::nullopt,
                                                std::nullopt, std::nullopt, "fa2", jit_args,
                                                jit_kwargs);
  };
  // Another variant, a malformed list, a rotary pos_encoding_mode, jit_kwargs without jit_args.
  std::vector<Value> other = sink_jit_args(DType::kFloat16, 32).items();
  other[11] = Value("FlashSigmoid");
  EXPECT_FI_ERROR(make(Value::list(other), std::nullopt), init, "jit_args");
  EXPECT_FI_ERROR(make(Value::list({Value("x")}), std::nullopt), init, "jit_args");
  EXPECT_FI_ERROR(make(sink_jit_args(DType::kFloat16, 32),
                       Value::dict({{Value("pos_encoding_mode"), Value(int64_t{1})}})),
                  init, "jit_kwargs");
  EXPECT_FI_ERROR(make(Value(), sink_jit_kwargs()), init, "jit_kwargs");

  const Tensor q = Tensor::zeros({2, 2, 32}, DType::kFloat16);
  const Tensor k = Tensor::zeros({3, 1, 32}, DType::kFloat16);
  const Tensor sink = Tensor::zeros({2}, DType::kFloat32);
  PrefillPlanOptions po;
  auto w = make(sink_jit_args(DType::kFloat16, 32), sink_jit_kwargs());
  w.plan(testing::int_tensor({0, 2}), testing::int_tensor({0, 3}), 2, 1, 32, po);
  // The variant's arguments missing, short, of the wrong kinds, not finite; the sink twice.
  EXPECT_FI_ERROR(w.run(q, k, k), run, "args");
  AttentionRunOptions o;
  o.args = Value::tuple({Value(sink)});
  EXPECT_FI_ERROR(w.run(q, k, k, o), run, "args");
  o.args = Value::tuple({Value(0.1), Value(0.1)});
  EXPECT_FI_ERROR(w.run(q, k, k, o), run, "args");
  o.args = Value::tuple({Value(sink), Value("x")});
  EXPECT_FI_ERROR(w.run(q, k, k, o), run, "args");
  EXPECT_FI_ERROR(w.run(q, k, k, variant_args(sink, NAN)), run, "args");
  o = variant_args(sink, 0.1);
  o.sinks = sink;
  EXPECT_FI_ERROR(w.run(q, k, k, o), run, "sinks");
  // A sink of the wrong size is checked as the sinks option is.
  EXPECT_FI_ERROR(w.run(q, k, k, variant_args(Tensor::zeros({3}, DType::kFloat32), 0.1)), run,
                  "sinks");
  // A wrapper without jit_args given *args.
  BatchPrefillWithRaggedKVCacheWrapper plain(ws);
  plain.plan(testing::int_tensor({0, 2}), testing::int_tensor({0, 3}), 2, 1, 32, po);
  EXPECT_FI_ERROR(plain.run(q, k, k, variant_args(sink, 0.1)), run, "args");
}

// Through the Flight Recorder and replay_sequence: the recorder writes the variant's *args as
// upstream's recorder does, positional after the named arguments (arg_4 the sink, arg_5 the
// scale), never as a keyword.
TEST(SinkJitArgs, RecordAndReplay) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_sink_jit_rec_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    recorder::Config cfg;
    cfg.dump_dir = dir.string();
    recorder::start(cfg, [](const std::string&) {});
    BatchPrefillWithRaggedKVCacheWrapper w(
        Tensor::zeros({1 << 16}, DType::kUInt8), "NHD", false, std::nullopt, std::nullopt,
        std::nullopt, std::nullopt, "fa2", sink_jit_args(DType::kBFloat16, 32), sink_jit_kwargs());
    PrefillPlanOptions po;
    po.causal = true;
    po.q_data_type = DType::kBFloat16;
    w.plan(testing::int_tensor({0, 2, 3}), testing::int_tensor({0, 3, 7}), 4, 2, 32, po);
    w.run(testing::rand_tensor({3, 4, 32}, DType::kBFloat16, 51, -1.0, 1.0),
          testing::rand_tensor({7, 2, 32}, DType::kBFloat16, 52, -1.0, 1.0),
          testing::rand_tensor({7, 2, 32}, DType::kBFloat16, 53, -1.0, 1.0),
          variant_args(testing::rand_tensor({4}, DType::kFloat32, 54, 0.0, 3.0), 0.2));
    recorder::stop();
  }
  testing::replay_expecting_every_call_to_pass(dir, 3u);
  bool seen = false;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename() != "metadata.jsonl" ||
        e.path().parent_path().string().find("KVCacheWrapper.run") == std::string::npos) {
      continue;
    }
    std::ifstream f(e.path());
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("\"arg_5\": 0.2"), std::string::npos) << text;
    EXPECT_NE(text.find("\"arg_4\""), std::string::npos) << text;
    EXPECT_EQ(text.find("kwarg_args"), std::string::npos) << text;
    seen = true;
  }
  EXPECT_TRUE(seen);
  fs::remove_all(dir);
}

// The API log prints the variant's *args as positional arguments after the named ones
// (upstream: arg[4] the sink, arg[5] the scale) and lists no `args` parameter.
TEST(SinkJitArgs, ApiLogPrintsThemPositionally) {
  BatchPrefillWithRaggedKVCacheWrapper w(Tensor::zeros({1 << 16}, DType::kUInt8), "NHD", false,
                                         std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                         "fa2", sink_jit_args(DType::kFloat16, 32), std::nullopt);
  PrefillPlanOptions po;
  w.plan(testing::int_tensor({0, 2}), testing::int_tensor({0, 3}), 2, 1, 32, po);
  const Tensor q = Tensor::zeros({2, 2, 32}, DType::kFloat16);
  const Tensor k = Tensor::zeros({3, 1, 32}, DType::kFloat16);
  std::string text;
  api_log::set_sink([&](std::string_view r) { text += r; });
  api_log::set_level(3);
  w.run(q, k, k, variant_args(Tensor::zeros({2}, DType::kFloat32), 0.25));
  api_log::set_level(0);
  api_log::set_sink(nullptr);
  EXPECT_NE(text.find("arg[4]:"), std::string::npos) << text;
  const std::size_t a5 = text.find("arg[5]:");
  ASSERT_NE(a5, std::string::npos) << text;
  EXPECT_NE(text.find("0.25", a5), std::string::npos) << text;
  EXPECT_EQ(text.find("args="), std::string::npos) << text;
}

// Written by Python the way upstream's recorder writes upstream's own sink test: the ragged and
// paged wrappers built with the variant's jit_args / jit_kwargs by keyword, plan positional plus
// keywords, run(q, k, v, sink, sm_scale) and run(q, (k, v), sink, sm_scale) all positional.
constexpr const char* kJitArgsDumpPy = R"PY(
import json, math, os, sys
try:
    import torch
except ImportError:
    sys.exit(77)
root = sys.argv[1]
torch.manual_seed(7)
H, HKV, D = 4, 2, 64
def obj(cls, sid):
    return {"type": cls, "repr": "<flashinfer.prefill.%s object at 0x%x>" % (cls, sid)}
def ser(v):
    if isinstance(v, torch.dtype):
        return {"type": "torch.dtype", "value": str(v)}
    if isinstance(v, (list, tuple)):
        return {"type": "list" if isinstance(v, list) else "tuple", "length": len(v),
                "items": [ser(x) for x in v], "truncated": False}
    if isinstance(v, dict):
        return {"type": "dict", "length": len(v), "truncated": False,
                "items": [{"key": ser(k), "value": ser(x)} for k, x in v.items()]}
    return v
seq = [0]
def write(cls, sid, method, inputs, meta, outputs):
    seq[0] += 1
    name = cls + "." + method
    d = os.path.join(root, "20261123_020000_%03d_pid4242_%s_call%04d" % (seq[0], name, seq[0]))
    os.makedirs(d)
    torch.save(inputs, d + "/inputs.pt")
    tensors = {k: x for k, x in outputs.items() if x is not None}
    torch.save(tensors, d + "/outputs.pt")
    rec = {"function_name": name, "module": "flashinfer.prefill", "call_sequence": seq[0],
           "timestamp": "20261123_020000_%03d" % seq[0], "process_id": 4242,
           "input_metadata": dict(meta, arg_0=obj(cls, sid)),
           "output_metadata": {k: None for k, x in outputs.items() if x is None},
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": list(tensors)},
           "tensor_format": "torch", "execution_status": "completed", "self_id": sid}
    with open(d + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")
jit_args = ["batch_prefill_attention_sink_bf16_swa_False_fa2", torch.bfloat16, torch.bfloat16,
            torch.bfloat16, torch.int32, D, D, ["sink"], ["float"], ["sm_scale"], ["double"],
            "AttentionSink", "<the variant's CUDA source>"]
jit_kwargs = {"use_sliding_window": False}
qlens, kvlens = [2, 3], [6, 3]
qo = torch.tensor([0, 2, 5], dtype=torch.int32)
kvp = torch.tensor([0, 6, 9], dtype=torch.int32)
q = torch.randn(5, H, D).to(torch.bfloat16)
k = torch.randn(9, HKV, D).to(torch.bfloat16)
v = torch.randn(9, HKV, D).to(torch.bfloat16)
sink = torch.rand(H, dtype=torch.float32) * 5
scale = 1.0 / math.sqrt(D)
out = torch.zeros(5, H, D, dtype=torch.float64)
row = col = 0
for b in range(2):
    kb, vb = k[col : col + kvlens[b]].double(), v[col : col + kvlens[b]].double()
    for i in range(qlens[b]):
        pos = kvlens[b] - qlens[b] + i
        for h in range(H):
            g = h // (H // HKV)
            s = (kb[: pos + 1, g] @ q[row + i, h].double()) * scale
            p = torch.softmax(torch.cat([s, sink[h : h + 1].double()]), 0)[:-1]
            out[row + i, h] = p @ vb[: pos + 1, g]
    row += qlens[b]
    col += kvlens[b]
out = out.to(torch.bfloat16)
ws = torch.zeros(4096, dtype=torch.uint8)
for cls, sid in (("BatchPrefillWithRaggedKVCacheWrapper", 140111), ("BatchPrefillWithPagedKVCacheWrapper", 140222)):
    write(cls, sid, "__init__", {"arg_1": ws},
          {"kwarg_kv_layout": "NHD", "kwarg_backend": "fa2", "kwarg_jit_args": ser(jit_args),
           "kwarg_jit_kwargs": ser(jit_kwargs)}, {"result": None})
    common = {"kwarg_causal": True, "kwarg_window_left": -1,
              "kwarg_q_data_type": ser(torch.bfloat16), "kwarg_kv_data_type": ser(torch.bfloat16)}
    if cls.startswith("BatchPrefillWithRagged"):
        write(cls, sid, "plan", {"arg_1": qo, "arg_2": kvp},
              dict(common, arg_3=H, arg_4=HKV, arg_5=D), {"result": None})
        write(cls, sid, "run", {"arg_1": q, "arg_2": k, "arg_3": v, "arg_4": sink},
              {"arg_5": scale}, {"result": out})
    else:  # one token per page, as upstream's test
        idx = torch.arange(9, dtype=torch.int32)
        last = torch.ones(2, dtype=torch.int32)
        write(cls, sid, "plan", {"arg_1": qo, "arg_2": kvp, "arg_3": idx, "arg_4": last},
              dict(common, arg_5=H, arg_6=HKV, arg_7=D, arg_8=1), {"result": None})
        write(cls, sid, "run",
              {"arg_1": q, "arg_2__0": k.unsqueeze(1), "arg_2__1": v.unsqueeze(1), "arg_3": sink},
              {"arg_2": {"type": "tuple", "length": 2, "truncated": False,
                         "items": [{"type": "torch.Tensor", "tensor_key": "arg_2__0"},
                                   {"type": "torch.Tensor", "tensor_key": "arg_2__1"}]},
               "arg_4": scale}, {"result": out})
)PY";

// Both upstream-written dumps above come from one python start: importing torch is most of the
// time, and ctest runs every TEST in a process of its own.
TEST(AttentionSinkUpstreamDumps, WrapperAndJitArgsDumpsReplay) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_sink_dumps_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  if (!testing::run_python_scripts(
          dir, {{kWrapperDumpPy, dir / "wrapper"}, {kJitArgsDumpPy, dir / "jit_args"}})) {
    GTEST_SKIP() << "python3-torch not installed";
  }
  {
    SCOPED_TRACE("BatchAttentionWithAttentionSinkWrapper as SGLang calls it");
    testing::replay_expecting_every_call_to_pass(dir / "wrapper", 3u);
  }
  {
    SCOPED_TRACE("the ragged and paged wrappers with the variant's jit_args");
    testing::replay_expecting_every_call_to_pass(dir / "jit_args", 6u);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer
