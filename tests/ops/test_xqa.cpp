// flashinfer.xqa: xqa against an fp64 formula (NHD/HND, fp16/bf16 q, fp8 KV with kv_scale, tensor
// scales, sinks [Hkv, group], sliding window) and bit-exact against xqa_batch_decode_with_kv_cache
// under upstream's scale mapping; xqa_mla against an fp64 MLA formula and its batch-decode twin;
// bad input; record and replay; a Python-written upstream-format dump of both (positional as
// upstream's decode wrappers call them).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "flashinfer/ops/backends.h"
#include "flashinfer/ops/mla.h"
#include "flashinfer/ops/xqa.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

Tensor i32(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::empty(shape, DType::kInt32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

Tensor scratch() { return Tensor::zeros({256}, DType::kUInt8); }

struct Paged {
  Tensor k, v, table, lens;
  std::vector<int32_t> kv_lens, tab;
  int64_t page_size = 0, per = 0;
};

// Caches [pages, ps, Hkv, D] (HND: [pages, Hkv, ps, D]); pages handed out in reverse.
Paged make_paged(const std::vector<int32_t>& lens, int64_t ps, int64_t hkv, int64_t d, DType dt,
                 bool hnd, uint64_t seed) {
  Paged p;
  p.kv_lens = lens;
  p.page_size = ps;
  for (int32_t l : lens) p.per = std::max<int64_t>(p.per, (l + ps - 1) / ps);
  const int64_t pages = static_cast<int64_t>(lens.size()) * p.per + 1;
  const Shape shape = hnd ? Shape{pages, hkv, ps, d} : Shape{pages, ps, hkv, d};
  const double r = dtype_is_fp8(dt) ? 3.0 : 1.0;
  p.k = testing::rand_tensor(shape, dt, seed, -r, r);
  p.v = testing::rand_tensor(shape, dt, seed + 1, -r, r);
  int32_t next = static_cast<int32_t>(pages) - 1;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    for (int64_t i = 0; i < p.per; ++i) p.tab.push_back(i * ps < lens[b] ? next-- : -1);
  }
  p.table = i32(p.tab, {static_cast<int64_t>(lens.size()), p.per});
  p.lens = i32(lens, {static_cast<int64_t>(lens.size()), 1});
  return p;
}

// Token t of request b, head g, as doubles.
std::vector<double> row(const Tensor& cache, const Paged& p, int64_t b, int64_t t, int64_t g,
                        bool hnd) {
  const int64_t page = p.tab[b * p.per + t / p.page_size];
  Tensor x = hnd ? cache.select(0, page).select(0, g).select(0, t % p.page_size)
                 : cache.select(0, page).select(0, t % p.page_size).select(0, g);
  return x.contiguous().to_double_vector();
}

TEST(Xqa, MatchesFp64FormulaAndItsBatchDecodeTwin) {
  struct Case {
    DType q, kv;
    bool hnd, sinks, tensor_scales;
    int64_t window;
  };
  const std::vector<Case> cases = {
      {DType::kBFloat16, DType::kBFloat16, false, false, false, 0},
      {DType::kFloat16, DType::kFloat16, true, true, true, 3},
      {DType::kBFloat16, DType::kFloat8E4M3FN, false, true, false, 0},
      {DType::kFloat16, DType::kFloat8E4M3FN, true, false, true, 5},
  };
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const int64_t H = 8, Hkv = 2, D = 64, ps = 4, G = H / Hkv;
    const std::vector<int32_t> lens = {9, 4, 13};
    Paged p = make_paged(lens, ps, Hkv, D, c.kv, c.hnd, 10 + idx);
    const int64_t B = static_cast<int64_t>(lens.size());
    const Tensor q = testing::rand_tensor({B, 1, H, D}, c.q, 20 + idx, -1.0, 1.0);
    const double qs = 0.9, ks = dtype_is_fp8(c.kv) ? 0.25 : 1.0;
    std::optional<Tensor> sinks;
    std::vector<double> sd(H, 0.0);
    if (c.sinks) {
      Tensor t = Tensor::empty({Hkv, G}, DType::kFloat32);
      for (int64_t h = 0; h < H; ++h) t.data<float>()[h] = static_cast<float>(sd[h] = 0.3 * h - 1);
      sinks = t;
    }
    auto scale = [&](double x) -> ScalarOrTensor<double> {
      if (c.tensor_scales) return Tensor::full({1}, x, DType::kFloat32);
      return x;
    };
    Tensor out = Tensor::zeros({B, 1, H, D}, c.q);
    xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), Hkv, ps, sinks, scale(qs),
        scale(ks), c.window, c.hnd ? "HND" : "NHD");
    // fp64: s = qs * ks / sqrt(D) * q.k, out = ks * softmax(s) v, window keeps the last `window`.
    const std::vector<double> qd = q.contiguous().to_double_vector();
    std::vector<double> want;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t L = lens[b], lo = c.window > 0 ? std::max<int64_t>(0, L - c.window) : 0;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / G;
        std::vector<double> s;
        double m = c.sinks ? sd[h] : -1e300;
        for (int64_t t = lo; t < L; ++t) {
          const auto k = row(p.k, p, b, t, g, c.hnd);
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += qd[(b * H + h) * D + e] * k[e];
          s.push_back(qs * ks / std::sqrt(double(D)) * dot);
          m = std::max(m, s.back());
        }
        double den = c.sinks ? std::exp(sd[h] - m) : 0.0;
        for (double x : s) den += std::exp(x - m);
        std::vector<double> o(D, 0.0);
        for (int64_t t = lo; t < L; ++t) {
          const auto v = row(p.v, p, b, t, g, c.hnd);
          for (int64_t e = 0; e < D; ++e) o[e] += std::exp(s[t - lo] - m) / den * ks * v[e];
        }
        want.insert(want.end(), o.begin(), o.end());
      }
    }
    testing::Tolerance tol = testing::attention_tolerance(c.q);
    if (dtype_is_fp8(c.kv)) tol.atol *= 4;
    EXPECT_TRUE(testing::all_close(out, want, tol));
    // The decode entry point under upstream's mapping gives the same bits.
    Tensor twin = xqa_batch_decode_with_kv_cache(
        q.select(1, 0), PagedKVCache(p.k, p.v), scratch(), p.table, p.lens.select(1, 0), p.per * ps,
        qs * ks / std::sqrt(double(D)), ks, c.window > 0 ? c.window - 1 : -1, std::nullopt,
        sinks ? std::optional<Tensor>(sinks->reshape({H})) : std::nullopt, c.hnd ? "HND" : "NHD");
    EXPECT_TRUE(testing::all_close(out.select(1, 0), twin, {0, 0}));
    ++idx;
  }
}

TEST(XqaMla, MatchesFp64FormulaAndItsBatchDecodeTwin) {
  const int64_t H = 4, R = 32, P = 16, D = R + P, ps = 4;
  const std::vector<int32_t> lens = {7, 3};
  for (DType dt : {DType::kBFloat16, DType::kFloat8E4M3FN}) {
    SCOPED_TRACE(dtype_torch_name(dt));
    Paged p = make_paged(lens, ps, 1, D, dt, false, 30);
    const Tensor q = testing::rand_tensor({2, 1, H, D}, dt, 31, -1.0, 1.0);
    const DType od = dtype_is_fp8(dt) ? DType::kBFloat16 : dt;
    Tensor out = Tensor::zeros({2, 1, H, R}, od);
    const double qs = 0.11, ks = 0.7;
    xqa_mla(q, p.k, p.k, p.table, p.lens, out, scratch(), scratch(), ps, qs,
            Tensor::full({1}, ks, DType::kFloat32));
    const std::vector<double> qd = q.contiguous().to_double_vector();
    std::vector<double> want;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> s;
        double m = -1e300;
        for (int64_t t = 0; t < lens[b]; ++t) {
          const auto kv = row(p.k, p, b, t, 0, false);
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += qd[(b * H + h) * D + e] * kv[e];
          s.push_back(qs * dot);
          m = std::max(m, s.back());
        }
        double den = 0;
        for (double x : s) den += std::exp(x - m);
        std::vector<double> o(R, 0.0);
        for (int64_t t = 0; t < lens[b]; ++t) {
          const auto kv = row(p.k, p, b, t, 0, false);
          for (int64_t e = 0; e < R; ++e) o[e] += std::exp(s[t] - m) / den * ks * kv[e];
        }
        want.insert(want.end(), o.begin(), o.end());
      }
    }
    testing::Tolerance tol = testing::attention_tolerance(od);
    if (dtype_is_fp8(dt)) tol.atol *= 4;
    EXPECT_TRUE(testing::all_close(out, want, tol));
    Tensor twin =
        xqa_batch_decode_with_kv_cache_mla(q, p.k.select(2, 0), scratch(), 128, R, P, p.table,
                                           p.lens.select(1, 0), p.per * ps, std::nullopt, qs, ks);
    EXPECT_TRUE(testing::all_close(out, twin, {0, 0}));
  }
}

TEST(Xqa, BadInput) {
  Paged p = make_paged({5, 3}, 4, 2, 32, DType::kBFloat16, false, 40);
  const Tensor q = testing::rand_tensor({2, 1, 4, 32}, DType::kBFloat16, 41);
  Tensor out = Tensor::zeros({2, 1, 4, 32}, DType::kBFloat16);
  const char* op = "xqa";
  xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 2, 4);  // valid
  EXPECT_FI_ERROR(xqa(q.select(1, 0), p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 2, 4),
                  op, "q");
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 2, 8), op,
                  "page_size");
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 1, 4), op,
                  "num_kv_heads");
  EXPECT_FI_ERROR(
      xqa(q, p.k, p.v.to(DType::kFloat16), p.table, p.lens, out, scratch(), scratch(), 2, 4), op,
      "v_cache");
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table.select(0, 0), p.lens, out, scratch(), scratch(), 2, 4),
                  op, "page_table");
  EXPECT_FI_ERROR(
      xqa(q, p.k, p.v, p.table, i32({5, 3, 1}, {3, 1}), out, scratch(), scratch(), 2, 4), op,
      "seq_lens");
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table, p.lens, Tensor::zeros({2, 1, 4, 32}, DType::kFloat16),
                      scratch(), scratch(), 2, 4),
                  op, "output");
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 2, 4,
                      Tensor::zeros({3}, DType::kFloat32)),
                  op, "sinks");
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 2, 4, std::nullopt,
                      1.0, 1.0, 0, "NHD", std::nullopt, std::nullopt, 1.0, 2),
                  op, "q_seq_len");
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 2, 4, std::nullopt,
                      Tensor::zeros({2}, DType::kFloat32)),
                  op, "q_scale");
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 2, 4, std::nullopt,
                      1.0, 1.0, 0, "NHD", std::nullopt, std::nullopt, 1.0, 1, std::nullopt,
                      std::nullopt, Tensor::zeros({1}, DType::kUInt8)),
                  op, "k_sf_cache");
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 2, 4, std::nullopt,
                      1.0, 1.0, -1),
                  op, "sliding_win_size");
  // xqa_mla
  Paged m = make_paged({5, 3}, 4, 1, 48, DType::kBFloat16, false, 42);
  const Tensor qm = testing::rand_tensor({2, 1, 4, 48}, DType::kBFloat16, 43);
  Tensor om = Tensor::zeros({2, 1, 4, 32}, DType::kBFloat16);
  xqa_mla(qm, m.k, m.k, m.table, m.lens, om, scratch(), scratch(), 4);  // valid
  EXPECT_FI_ERROR(xqa_mla(qm, m.k, m.v, m.table, m.lens, om, scratch(), scratch(), 4), "xqa_mla",
                  "v_cache");
  xqa_mla(qm, m.k, m.k.clone(), m.table, m.lens, om, scratch(), scratch(), 4);  // a copy is fine
  EXPECT_FI_ERROR(xqa_mla(qm, m.k, m.k, m.table, m.lens, om, scratch(), scratch(), 8), "xqa_mla",
                  "page_size");
  EXPECT_FI_ERROR(xqa_mla(qm, m.k, m.k, m.table, m.lens,
                          Tensor::zeros({2, 1, 4, 48}, DType::kBFloat16), scratch(), scratch(), 4),
                  "xqa_mla", "output");
  EXPECT_FI_ERROR(xqa_mla(qm, p.k, p.k, m.table, m.lens, om, scratch(), scratch(), 4), "xqa_mla",
                  "k_cache");
  EXPECT_FI_ERROR(xqa_mla(qm, m.k, m.k, m.table, m.lens, om, Tensor(), scratch(), 4), "xqa_mla",
                  "workspace_buffer");
}

TEST(Xqa, BackendsAndRecordReplay) {
  EXPECT_TRUE(op_has_backend("xqa", DeviceType::kCPU));
  EXPECT_TRUE(op_has_backend("xqa_mla", DeviceType::kCPU));
  EXPECT_EQ(op_has_backend("xqa", DeviceType::kCUDA),
            op_has_backend("xqa_batch_decode_with_kv_cache", DeviceType::kCUDA));
  Paged p = make_paged({5, 3}, 4, 2, 32, DType::kFloat16, true, 50);
  Paged m = make_paged({6, 2}, 2, 1, 48, DType::kBFloat16, false, 51);
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    Tensor out = Tensor::zeros({2, 1, 4, 32}, DType::kFloat16);
    xqa(testing::rand_tensor({2, 1, 4, 32}, DType::kFloat16, 52), p.k, p.v, p.table, p.lens, out,
        scratch(), scratch(), 2, 4, testing::rand_tensor({2, 2}, DType::kFloat32, 53), 0.8, 1.0, 2,
        "HND");
    Tensor om = Tensor::zeros({2, 1, 4, 32}, DType::kBFloat16);
    xqa_mla(testing::rand_tensor({2, 1, 4, 48}, DType::kBFloat16, 54), m.k, m.k, m.table, m.lens,
            om, scratch(), scratch(), 2, 0.1, 1.0);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& call : calls) EXPECT_TRUE(testing::replays_identically(call));
}

// Written by Python as upstream's recorder writes the calls upstream's own decode wrappers make
// (xqa: ten positional arguments, then keywords; xqa_mla: nine positional, q_scale / kv_scale by
// keyword, the latent cache passed twice). Upstream returns None and records no outputs; the
// expected written `output` is added as this library's mutated.pt so the values are checked too.
TEST(Xqa, UpstreamWrittenDumpReplays) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_xqa_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string py = R"PY(
import json, math, os, sys
try:
    import torch
except ImportError:
    sys.exit(77)
root = sys.argv[1]
torch.manual_seed(9)
def write(seq, name, inputs, meta, mutated):
    d = os.path.join(root, "20261122_205000_%03d_pid4242_%s_call%04d" % (seq, name, seq))
    os.makedirs(d)
    torch.save(inputs, d + "/inputs.pt")
    torch.save({}, d + "/outputs.pt")
    torch.save(mutated, d + "/mutated.pt")
    rec = {"function_name": name, "module": "flashinfer.xqa", "call_sequence": seq,
           "timestamp": "20261122_205000_%03d" % seq, "process_id": 4242,
           "input_metadata": meta, "output_metadata": {"result": None},
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": [],
                           "mutated_tensor_keys": list(mutated)},
           "tensor_format": "torch", "execution_status": "completed"}
    with open(d + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")

# xqa: B=2, H=8, HKV=2, D=64, NHD pages of 4, sinks [HKV, group], window of 6 tokens.
B, H, HKV, D, PS = 2, 8, 2, 64, 4
lens = [7, 10]
k = torch.randn(7, PS, HKV, D).to(torch.bfloat16)
v = torch.randn(7, PS, HKV, D).to(torch.bfloat16)
table = torch.tensor([[6, 2, -1], [0, 3, 5]], dtype=torch.int32)
q = torch.randn(B, 1, H, D).to(torch.bfloat16)
sinks = torch.randn(HKV, H // HKV, dtype=torch.float32)
qs, ks, win = 0.9, 1.0, 6
out = torch.zeros(B, 1, H, D, dtype=torch.float64)
for b in range(B):
    kk = torch.stack([k[int(table[b, t // PS]), t % PS] for t in range(lens[b])]).double()
    vv = torch.stack([v[int(table[b, t // PS]), t % PS] for t in range(lens[b])]).double()
    lo = max(0, lens[b] - win)
    for h in range(H):
        g = h // (H // HKV)
        s = (kk[lo:, g] @ q[b, 0, h].double()) * qs * ks / math.sqrt(D)
        p = torch.softmax(torch.cat([s, sinks.reshape(-1)[h:h + 1].double()]), 0)[:-1]
        out[b, 0, h] = ks * (p @ vv[lo:, g])
ws = torch.zeros(1024, dtype=torch.uint8)
sem = torch.zeros(64, dtype=torch.uint8)
write(1, "xqa", {"arg_0": q, "arg_1": k, "arg_2": v, "arg_3": table,
                 "arg_4": torch.tensor(lens, dtype=torch.int32).unsqueeze(1),
                 "arg_5": torch.zeros(B, 1, H, D, dtype=torch.bfloat16), "arg_6": ws, "arg_7": sem,
                 "kwarg_sinks": sinks},
      {"arg_8": HKV, "arg_9": PS, "kwarg_q_scale": qs, "kwarg_kv_scale": ks,
       "kwarg_sliding_win_size": win, "kwarg_kv_layout": "NHD", "kwarg_sm_count": 132,
       "kwarg_enable_pdl": True, "kwarg_rcp_out_scale": 1.0, "kwarg_q_seq_len": 1,
       "kwarg_mask": None},
      {"arg_5": out.to(torch.bfloat16)})

# xqa_mla: latent 32 + rope 16, 4 heads, pages of 4, q_scale / kv_scale as bmm1 / bmm2.
R, P, HM = 32, 16, 4
kv = torch.randn(5, PS, 1, R + P).to(torch.bfloat16)
mt = torch.tensor([[4, 1], [0, -1]], dtype=torch.int32)
mlens = [6, 3]
qm = torch.randn(2, 1, HM, R + P).to(torch.bfloat16)
om = torch.zeros(2, 1, HM, R, dtype=torch.float64)
for b in range(2):
    rows = torch.stack([kv[int(mt[b, t // PS]), t % PS, 0] for t in range(mlens[b])]).double()
    for h in range(HM):
        p = torch.softmax((rows @ qm[b, 0, h].double()) * 0.125, 0)
        om[b, 0, h] = 0.5 * (p @ rows[:, :R])
write(2, "xqa_mla", {"arg_0": qm, "arg_1": kv, "arg_2": kv, "arg_3": mt,
                     "arg_4": torch.tensor(mlens, dtype=torch.int32).unsqueeze(1),
                     "arg_5": torch.zeros(2, 1, HM, R, dtype=torch.bfloat16), "arg_6": ws,
                     "arg_7": sem},
      {"arg_8": PS, "kwarg_q_scale": 0.125, "kwarg_kv_scale": 0.5, "kwarg_sm_count": 132,
       "kwarg_enable_pdl": False},
      {"arg_5": om.to(torch.bfloat16)})
)PY";
  std::ofstream(dir / "make.py") << py;
  const int st = std::system(
      ("/usr/bin/python3 " + (dir / "make.py").string() + " " + (dir / "dump").string()).c_str());
  if (st != 0 && WIFEXITED(st) && WEXITSTATUS(st) == 77) {
    fs::remove_all(dir);
    GTEST_SKIP() << "python3-torch not installed";
  }
  ASSERT_EQ(st, 0);
  const auto results = replay::replay_sequence((dir / "dump").string());
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    EXPECT_FALSE(r.comparisons.empty()) << r.function_name;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer
