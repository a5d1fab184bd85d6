// flashinfer.xqa: xqa against an fp64 formula (NHD/HND, fp16/bf16 q, fp8 KV with kv_scale, tensor
// scales, sinks [Hkv, group], sliding window) and bit-exact against xqa_batch_decode_with_kv_cache
// under upstream's scale mapping; xqa_mla against an fp64 MLA formula and its batch-decode twin;
// bad input; record and replay; a Python-written upstream-format dump of both (positional as
// upstream's decode wrappers call them); speculative decoding (q_seq_len > 1, the bit-packed
// draft mask, q_cu_seq_lens) against an fp64 formula and the decode name, bad input, replay.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "flashinfer/ops/attention.h"
#include "flashinfer/ops/backends.h"
#include "flashinfer/ops/mla.h"
#include "flashinfer/ops/xqa.h"
#include "flashinfer/replay.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#include "util/upstream_dump_py.h"

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
  std::vector<double> kd, vd;  // k and v as doubles, read once: the references read them per row
  std::vector<int32_t> kv_lens, tab;
  int64_t page_size = 0, per = 0, hkv = 0, d = 0;
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
  p.kd = p.k.to_double_vector();
  p.vd = p.v.to_double_vector();
  p.hkv = hkv;
  p.d = d;
  int32_t next = static_cast<int32_t>(pages) - 1;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    for (int64_t i = 0; i < p.per; ++i) p.tab.push_back(i * ps < lens[b] ? next-- : -1);
  }
  p.table = i32(p.tab, {static_cast<int64_t>(lens.size()), p.per});
  p.lens = i32(lens, {static_cast<int64_t>(lens.size()), 1});
  return p;
}

// Token t of request b, head g, of p.kd or p.vd.
std::vector<double> row(const std::vector<double>& cache, const Paged& p, int64_t b, int64_t t,
                        int64_t g, bool hnd) {
  const int64_t page = p.tab[b * p.per + t / p.page_size], s = t % p.page_size;
  const int64_t at =
      (hnd ? (page * p.hkv + g) * p.page_size + s : (page * p.page_size + s) * p.hkv + g) * p.d;
  return {cache.begin() + at, cache.begin() + at + p.d};
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
          const auto k = row(p.kd, p, b, t, g, c.hnd);
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += qd[(b * H + h) * D + e] * k[e];
          s.push_back(qs * ks / std::sqrt(double(D)) * dot);
          m = std::max(m, s.back());
        }
        double den = c.sinks ? std::exp(sd[h] - m) : 0.0;
        for (double x : s) den += std::exp(x - m);
        std::vector<double> o(D, 0.0);
        for (int64_t t = lo; t < L; ++t) {
          const auto v = row(p.vd, p, b, t, g, c.hnd);
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
          const auto kv = row(p.kd, p, b, t, 0, false);
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += qd[(b * H + h) * D + e] * kv[e];
          s.push_back(qs * dot);
          m = std::max(m, s.back());
        }
        double den = 0;
        for (double x : s) den += std::exp(x - m);
        std::vector<double> o(R, 0.0);
        for (int64_t t = 0; t < lens[b]; ++t) {
          const auto kv = row(p.kd, p, b, t, 0, false);
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
                  op, "mask");  // speculative decoding needs a mask, as upstream asserts
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 2, 4, std::nullopt,
                      1.0, 1.0, 0, "NHD", std::nullopt, std::nullopt, 1.0, 0),
                  op, "q_seq_len");
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 2, 4, std::nullopt,
                      Tensor::zeros({2}, DType::kFloat32)),
                  op, "q_scale");
  EXPECT_FI_ERROR(xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), 2, 4, std::nullopt,
                      Tensor::full({1}, 1.0, DType::kBFloat16)),
                  op, "q_scale");  // one element, but not torch.float32
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

# Speculative decoding (q_seq_len > 1): xqa with q_seq_len / mask by keyword, and the decode name
# as vLLM calls it, by keyword. The masks are written as torch >= 2.3 writes torch.uint16 (by
# hand: torch 1.13 here has no uint16); this library reads them as int16 bits.
torch.manual_seed(11)
def write2(seq, name, module, inputs, meta, outputs, mutated):
    d = os.path.join(root, "20261122_205000_%03d_pid4242_%s_call%04d" % (seq, name, seq))
    os.makedirs(d)
    save(inputs, d + "/inputs.pt")  # by hand (util/upstream_dump_py.h): torch.uint16 masks
    save(outputs, d + "/outputs.pt")
    if mutated:
        save(mutated, d + "/mutated.pt")
    rec = {"function_name": name, "module": module, "call_sequence": seq,
           "timestamp": "20261122_205000_%03d" % seq, "process_id": 4242,
           "input_metadata": meta, "output_metadata": {},
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": list(outputs),
                           "mutated_tensor_keys": list(mutated)},
           "tensor_format": "torch", "execution_status": "completed"}
    with open(d + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")

def causal_mask(rows, qlen):  # generate_causal_mask's bits: row t sees draft j <= t
    words = (qlen + 31) // 32
    m = torch.zeros(rows, words * 2, dtype=torch.int32)
    for r in range(rows):
        t = r % qlen
        for j in range(t + 1):
            m[r, j // 16] |= 1 << (j % 16)
    return m.to(torch.int16)

def attend(q, k, v, lens, qlen, scale, vscale, bits):
    # q [B * qlen, H, D]; k / v [B][L, HKV, D] doubles; bits(r, j) -> bool
    out = torch.zeros(q.shape, dtype=torch.float64)
    H, HKV = q.shape[1], k[0].shape[1]
    for b in range(len(lens)):
        L = lens[b]
        for t in range(qlen):
            r = b * qlen + t
            keys = [j for j in range(L) if j < L - qlen or bits(r, j - (L - qlen))]
            for h in range(H):
                g = h // (H // HKV)
                s = torch.stack([k[b][j, g] @ q[r, h].double() for j in keys]) * scale
                p = torch.softmax(s, 0)
                out[r, h] = vscale * (p @ torch.stack([v[b][j, g] for j in keys]))
    return out

B, H, HKV, D, PS, Q = 2, 4, 2, 32, 4, 2
lens = [6, 5]
table = torch.tensor([[5, 1], [0, 3]], dtype=torch.int32)
k = torch.randn(6, PS, HKV, D).to(torch.bfloat16)
v = torch.randn(6, PS, HKV, D).to(torch.bfloat16)
kk = [torch.stack([k[int(table[b, t // PS]), t % PS] for t in range(lens[b])]).double() for b in range(B)]
vv = [torch.stack([v[int(table[b, t // PS]), t % PS] for t in range(lens[b])]).double() for b in range(B)]
mask = causal_mask(B * Q, Q)
bits = lambda r, j: j <= r % Q
q = torch.randn(B, 1, Q, H, D).to(torch.bfloat16)
qs, ks = 0.9, 1.0
ref = attend(q.reshape(B * Q, H, D), kk, vv, lens, Q, qs * ks / math.sqrt(D), ks, bits)
ws = torch.zeros(1024, dtype=torch.uint8)
sem = torch.zeros(64, dtype=torch.uint8)
write2(3, "xqa", "flashinfer.xqa",
      {"arg_0": q, "arg_1": k, "arg_2": v, "arg_3": table,
       "arg_4": torch.tensor(lens, dtype=torch.int32).unsqueeze(1),
       "arg_5": torch.zeros(B, 1, Q, H, D, dtype=torch.bfloat16), "arg_6": ws, "arg_7": sem,
       "kwarg_mask": ("u16", mask)},
      {"arg_8": HKV, "arg_9": PS, "kwarg_sinks": None, "kwarg_q_scale": qs, "kwarg_kv_scale": ks,
       "kwarg_sliding_win_size": 0, "kwarg_kv_layout": "NHD", "kwarg_sm_count": 132,
       "kwarg_enable_pdl": True, "kwarg_rcp_out_scale": 1.0, "kwarg_q_seq_len": Q},
      {}, {"arg_5": ref.reshape(B, 1, Q, H, D).to(torch.bfloat16)})

# vLLM's call: query [B * Q, H, D], kv_cache (k, v) tuple, keywords throughout.
q2 = torch.randn(B * Q, H, D).to(torch.bfloat16)
full = lambda r, j: True
mask2 = torch.full((B, Q, 2), 0, dtype=torch.int16)
mask2[:, :, 0] = (1 << Q) - 1
bmm1 = 1.0 / math.sqrt(D)
# A bf16 cache: upstream's xqa kernel applies kv_scale = bmm2_scale * o_scale only to a quantized
# cache, after its Python divided q_scale by it: scores times bmm1 / 0.5, the output unscaled.
ref2 = attend(q2, kk, vv, lens, Q, bmm1 / 0.5, 1.0, full)
def tensor_meta(t, key):
    return {"type": "torch.Tensor", "shape": list(t.shape), "dtype": str(t.dtype),
            "stride": list(t.stride()), "device": "cuda:0", "requires_grad": False,
            "is_contiguous": t.is_contiguous(), "tensor_key": key}
write2(4, "xqa_batch_decode_with_kv_cache", "flashinfer.decode",
      {"kwarg_query": q2, "kwarg_kv_cache__0": k, "kwarg_kv_cache__1": v,
       "kwarg_workspace_buffer": torch.zeros(4096, dtype=torch.uint8), "kwarg_block_tables": table,
       "kwarg_seq_lens": torch.tensor(lens, dtype=torch.int32), "kwarg_mask": ("u16", mask2)},
      {"kwarg_kv_cache": {"type": "tuple", "length": 2, "truncated": False,
                          "items": [tensor_meta(k, "kwarg_kv_cache__0"),
                                    tensor_meta(v, "kwarg_kv_cache__1")]},
       "kwarg_max_seq_len": 8, "kwarg_bmm1_scale": bmm1, "kwarg_bmm2_scale": 0.5,
       "kwarg_window_left": -1, "kwarg_out": None, "kwarg_sinks": None, "kwarg_kv_layout": "NHD",
       "kwarg_enable_pdl": False, "kwarg_q_len_per_req": Q, "kwarg_o_scale": 1.0},
      {"result": ref2.to(torch.bfloat16)}, {})
)PY";
  std::vector<replay::Result> results;
  if (!testing::run_dump_script(dir, testing::kTorchSavePy + py, dir / "dump", 4u, &results)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
  for (const auto& r : results) EXPECT_FALSE(r.comparisons.empty()) << r.function_name;
}

// ---- speculative decoding (q_seq_len > 1 with xqa's bit-packed mask) ----

// Rows of ceil(q_len / 32) * 2 int16 words (upstream's uint16, which this library reads as int16
// bits), bit j of row r in word j / 16 at bit j % 16.
template <class F>
Tensor spec_mask(int64_t rows, int64_t q_len, F bit) {
  const int64_t w = (q_len + 31) / 32 * 2;
  Tensor m = Tensor::zeros({rows, w}, DType::kInt16);
  auto* d = static_cast<uint16_t*>(m.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < q_len; ++j) {
      if (bit(r, j)) d[r * w + j / 16] |= static_cast<uint16_t>(1u << (j % 16));
    }
  }
  return m;
}

// fp64: request b's query t (row qo[b] + t) sees every key before L - n (n = its query count)
// and draft key j (position L - n + j) when bit j of its mask row is set.
template <class F>
std::vector<double> spec_reference(const Tensor& q, const Paged& p, const std::vector<int32_t>& qo,
                                   int64_t H, int64_t hkv, double qs, double ks,
                                   const std::vector<double>* sinks, bool hnd, F bit) {
  const int64_t D = q.size(-1), G = H / hkv;
  const std::vector<double> qd = q.contiguous().to_double_vector();
  std::vector<double> want;
  for (std::size_t b = 0; b + 1 < qo.size(); ++b) {
    const int64_t n = qo[b + 1] - qo[b], L = p.kv_lens[b];
    for (int64_t t = 0; t < n; ++t) {
      const int64_t r = qo[b] + t;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / G;
        std::vector<int64_t> keys;
        for (int64_t kj = 0; kj < L; ++kj) {
          if (kj < L - n || bit(r, kj - (L - n))) keys.push_back(kj);
        }
        std::vector<double> s;
        double m = sinks ? (*sinks)[h] : -1e300;
        for (int64_t kj : keys) {
          const auto k = row(p.kd, p, static_cast<int64_t>(b), kj, g, hnd);
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += qd[(r * H + h) * D + e] * k[e];
          s.push_back(qs * ks / std::sqrt(double(D)) * dot);
          m = std::max(m, s.back());
        }
        double den = sinks ? std::exp((*sinks)[h] - m) : 0.0;
        for (double x : s) den += std::exp(x - m);
        std::vector<double> o(D, 0.0);
        for (std::size_t i = 0; i < keys.size(); ++i) {
          const auto v = row(p.vd, p, static_cast<int64_t>(b), keys[i], g, hnd);
          for (int64_t e = 0; e < D; ++e) o[e] += std::exp(s[i] - m) / den * ks * v[e];
        }
        want.insert(want.end(), o.begin(), o.end());
      }
    }
  }
  return want;
}

TEST(XqaSpecDec, MaskMatchesFp64FormulaAndItsBatchDecodeTwin) {
  struct Case {
    DType q, kv;
    bool hnd, sinks, ragged;
    int64_t q_len, H, hkv, D;
    std::vector<int32_t> lens, qo;  // qo: query offsets per request (ragged: q_cu_seq_lens)
  };
  const std::vector<Case> cases = {
      {DType::kBFloat16, DType::kBFloat16, false, true, false, 3, 8, 2, 32, {9, 6}, {0, 3, 6}},
      // 35 draft tokens: two 32-bit words per mask row.
      {DType::kFloat16,
       DType::kFloat8E4M3FN,
       true,
       false,
       false,
       35,
       4,
       1,
       16,
       {40, 37},
       {0, 35, 70}},
      // Variable query counts (q_cu_seq_lens); request 1 is all draft tokens.
      {DType::kBFloat16, DType::kBFloat16, false, true, true, 4, 4, 2, 32, {8, 2}, {0, 3, 5}},
  };
  int idx = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << idx);
    const int64_t B = static_cast<int64_t>(c.lens.size()), rows = c.qo.back(), ps = 4;
    Paged p = make_paged(c.lens, ps, c.hkv, c.D, c.kv, c.hnd, 60 + idx);
    const Shape qshape = c.ragged ? Shape{rows, c.H, c.D} : Shape{B, 1, c.q_len, c.H, c.D};
    const Tensor q = testing::rand_tensor(qshape, c.q, 70 + idx, -1.0, 1.0);
    const auto bit = [](int64_t r, int64_t j) { return (r * 7 + j * 3) % 4 != 1; };
    const Tensor mask = spec_mask(rows, c.q_len, bit);
    const double qs = 0.8, ks = dtype_is_fp8(c.kv) ? 0.5 : 1.0;
    std::optional<Tensor> sinks;
    std::vector<double> sd(c.H);
    if (c.sinks) {
      Tensor t = Tensor::empty({c.hkv, c.H / c.hkv}, DType::kFloat32);
      for (int64_t h = 0; h < c.H; ++h) t.data<float>()[h] = static_cast<float>(sd[h] = 0.2 * h);
      sinks = t;
    }
    const std::optional<Tensor> cu =
        c.ragged ? std::optional<Tensor>(i32(c.qo, {B + 1})) : std::nullopt;
    Tensor out = Tensor::zeros(qshape, c.q);
    xqa(q, p.k, p.v, p.table, p.lens, out, scratch(), scratch(), c.hkv, ps, sinks, qs, ks, 0,
        c.hnd ? "HND" : "NHD", std::nullopt, std::nullopt, 1.0, c.q_len, mask, cu);
    const auto want =
        spec_reference(q, p, c.qo, c.H, c.hkv, qs, ks, c.sinks ? &sd : nullptr, c.hnd, bit);
    testing::Tolerance tol = testing::attention_tolerance(c.q);
    if (dtype_is_fp8(c.kv)) tol.atol *= 4;
    EXPECT_TRUE(testing::all_close(out, want, tol));
    // The decode name under upstream's map: the same bits, and a uint32-word mask reads the same.
    Tensor words = Tensor::zeros({rows, mask.size(1) / 2}, DType::kInt32);
    std::memcpy(words.data_ptr(), mask.data_ptr(), static_cast<std::size_t>(mask.nbytes()));
    for (const Tensor& m : {mask, words}) {
      Tensor twin = xqa_batch_decode_with_kv_cache(
          q.reshape({rows, c.H, c.D}), PagedKVCache(p.k, p.v), scratch(), p.table,
          p.lens.select(1, 0), p.per * ps, qs * ks / std::sqrt(double(c.D)), ks, -1, std::nullopt,
          sinks ? std::optional<Tensor>(sinks->reshape({c.H})) : std::nullopt,
          c.hnd ? "HND" : "NHD", std::nullopt, c.q_len, 1.0, m, std::nullopt, cu);
      EXPECT_TRUE(testing::all_close(out.reshape({rows, c.H, c.D}), twin, {0, 0}));
    }
    ++idx;
  }
}

TEST(XqaSpecDec, Int32WordsAndCausalMaskAgree) {
  // generate_causal_mask's mask (bit j of row t set for j <= t) is the decode name's default
  // causal draft attention; the same bits as uint32 words (int32) read identically.
  const int64_t H = 4, hkv = 2, D = 32, Q = 3, ps = 4;
  Paged p = make_paged({7, 5}, ps, hkv, D, DType::kFloat16, false, 80);
  const Tensor q = testing::rand_tensor({6, H, D}, DType::kFloat16, 81, -1.0, 1.0);
  const Tensor causal = spec_mask(6, Q, [&](int64_t r, int64_t j) { return j <= r % Q; });
  Tensor words = Tensor::zeros({6, 1}, DType::kInt32);
  std::memcpy(words.data_ptr(), causal.data_ptr(), static_cast<std::size_t>(causal.nbytes()));
  const auto run = [&](std::optional<Tensor> m) {
    return xqa_batch_decode_with_kv_cache(
        q, PagedKVCache(p.k, p.v), scratch(), p.table, p.lens.select(1, 0), p.per * ps, 0.2, 1.0,
        -1, std::nullopt, std::nullopt, "NHD", std::nullopt, Q, 1.0, m);
  };
  const Tensor none = run(std::nullopt);
  EXPECT_TRUE(testing::all_close(run(causal), none, {0, 0}));
  EXPECT_TRUE(testing::all_close(run(words), none, {0, 0}));
  // A different mask changes the result (the bits are read).
  const Tensor full = spec_mask(6, Q, [](int64_t, int64_t) { return true; });
  EXPECT_FALSE(testing::all_close(run(full), none, {1e-3, 1e-3}));
}

// trtllm_batch_decode_with_kv_cache(backend="xqa") passes the mask on as upstream's does: the same
// bits as the xqa decode name; other backends refuse it.
TEST(XqaSpecDec, TrtllmDecodeXqaBackendTakesTheMask) {
  const int64_t H = 4, hkv = 2, D = 32, Q = 3, ps = 4;
  Paged p = make_paged({7, 5}, ps, hkv, D, DType::kBFloat16, true, 85);
  const Tensor q = testing::rand_tensor({6, H, D}, DType::kBFloat16, 86, -1.0, 1.0);
  const Tensor mask = spec_mask(6, Q, [](int64_t r, int64_t j) { return (r + 2 * j) % 3 != 1; });
  const Tensor want = xqa_batch_decode_with_kv_cache(
      q, PagedKVCache(p.k, p.v), scratch(), p.table, p.lens.select(1, 0), p.per * ps, 0.2, 0.9, -1,
      std::nullopt, std::nullopt, "HND", std::nullopt, Q, 1.0, mask);
  auto run = [&](std::string_view backend) {
    return trtllm_batch_decode_with_kv_cache(
               q, PagedKVCache(p.k, p.v), scratch(), p.table, p.lens.select(1, 0), p.per * ps, 0.2,
               0.9, -1, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, "HND",
               std::nullopt, backend, Q, 1.0, mask)
        .out;
  };
  EXPECT_TRUE(testing::all_close(run("xqa"), want, {0, 0}));
  for (const char* backend : {"auto", "trtllm-gen"}) {
    try {
      run(backend);
      ADD_FAILURE() << backend << " must refuse the mask";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_EQ(e.arg(), "mask");
    }
  }
}

TEST(XqaSpecDec, BadInput) {
  const int64_t H = 4, hkv = 2, D = 32, Q = 2, ps = 4;
  Paged p = make_paged({5, 3}, ps, hkv, D, DType::kBFloat16, false, 90);
  const Tensor q = testing::rand_tensor({2, 1, Q, H, D}, DType::kBFloat16, 91);
  Tensor out = Tensor::zeros({2, 1, Q, H, D}, DType::kBFloat16);
  const Tensor mask = spec_mask(4, Q, [](int64_t r, int64_t j) { return j <= r % Q; });
  const auto call = [&](const Tensor& qq, const std::optional<Tensor>& m, int64_t qlen,
                        std::optional<Tensor> cu = std::nullopt, int64_t win = 0,
                        const Tensor* lens = nullptr) {
    Tensor o = Tensor::zeros(qq.shape(), DType::kBFloat16);
    xqa(qq, p.k, p.v, p.table, lens ? *lens : p.lens, o, scratch(), scratch(), hkv, ps,
        std::nullopt, 1.0, 1.0, win, "NHD", std::nullopt, std::nullopt, 1.0, qlen, m, cu);
  };
  const char* op = "xqa";
  call(q, mask, Q);  // valid
  EXPECT_FI_ERROR(call(q, std::nullopt, Q), op, "mask");
  EXPECT_FI_ERROR(call(q, mask.to(DType::kInt64), Q), op, "mask");
  EXPECT_FI_ERROR(call(q, Tensor::zeros({4, 3}, DType::kInt16), Q), op, "mask");  // row width
  EXPECT_FI_ERROR(call(q, Tensor::zeros({3, 2}, DType::kInt16), Q), op, "mask");  // too few rows
  EXPECT_FI_ERROR(call(q.select(1, 0), mask, Q), op, "q");
  EXPECT_FI_ERROR(call(testing::rand_tensor({2, 1, 3, H, D}, DType::kBFloat16, 92), mask, Q), op,
                  "q");
  EXPECT_FI_ERROR(call(q.reshape({4, H, D}), mask, Q, i32({0, 2, 4, 4}, {4})), op, "q_cu_seq_lens");
  EXPECT_FI_ERROR(call(q.reshape({4, H, D}), mask, Q, i32({0, 3, 4}, {3})), op,
                  "q_cu_seq_lens");  // a request with more than q_seq_len queries
  EXPECT_FI_ERROR(call(testing::rand_tensor({2, 1, H, D}, DType::kBFloat16, 93), std::nullopt, 1,
                       i32({0, 1, 2}, {3})),
                  op, "q_cu_seq_lens");
  const Tensor short_lens = i32({5, 1}, {2, 1});
  EXPECT_FI_ERROR(call(q, mask, Q, std::nullopt, 0, &short_lens), op, "seq_lens");
  try {
    call(q, mask, Q, std::nullopt, 3);
    ADD_FAILURE() << "a window with speculative decoding must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.arg(), "sliding_win_size");
  }
  try {
    call(testing::rand_tensor({2, 1, H, D}, DType::kBFloat16, 94), mask, 1);
    ADD_FAILURE() << "a mask with q_seq_len == 1 must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.arg(), "mask");
  }
  // The decode name names its own arguments.
  const char* dop = "xqa_batch_decode_with_kv_cache";
  const Tensor q3 = q.reshape({4, H, D});
  EXPECT_FI_ERROR(xqa_batch_decode_with_kv_cache(q3, PagedKVCache(p.k, p.v), scratch(), p.table,
                                                 p.lens.select(1, 0), 8, 1.0, 1.0, 3, std::nullopt,
                                                 std::nullopt, "NHD", std::nullopt, Q, 1.0, mask),
                  dop, "window_left");
  EXPECT_FI_ERROR(xqa_batch_decode_with_kv_cache(q3, PagedKVCache(p.k, p.v), scratch(), p.table,
                                                 p.lens.select(1, 0), 8, 1.0, 1.0, -1, std::nullopt,
                                                 std::nullopt, "NHD", std::nullopt, Q, 1.0,
                                                 Tensor::zeros({4, 2}, DType::kFloat32)),
                  dop, "mask");
}

TEST(XqaSpecDec, RecordReplay) {
  const int64_t H = 4, hkv = 2, D = 32, Q = 3, ps = 4;
  Paged p = make_paged({6, 4}, ps, hkv, D, DType::kFloat16, true, 95);
  const Tensor mask = spec_mask(6, Q, [](int64_t r, int64_t j) { return (r + j) % 3 != 2; });
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    Tensor out = Tensor::zeros({2, 1, Q, H, D}, DType::kFloat16);
    xqa(testing::rand_tensor({2, 1, Q, H, D}, DType::kFloat16, 96), p.k, p.v, p.table, p.lens, out,
        scratch(), scratch(), hkv, ps, std::nullopt, 0.7, 1.0, 0, "HND", std::nullopt, std::nullopt,
        1.0, Q, mask);
    xqa_batch_decode_with_kv_cache(testing::rand_tensor({5, H, D}, DType::kFloat16, 97),
                                   PagedKVCache(p.k, p.v), scratch(), p.table, p.lens.select(1, 0),
                                   8, 0.1, 1.0, -1, std::nullopt, std::nullopt, "HND", std::nullopt,
                                   Q, 1.0, mask, std::nullopt, i32({0, 3, 5}, {3}));
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 2u);
  for (const auto& call : calls) EXPECT_TRUE(testing::replays_identically(call));
}

}  // namespace
}  // namespace flashinfer
