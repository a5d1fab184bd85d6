// Private to the FP4 / FP8 MoE tests: their deterministic random packed weights and e4m3 scale
// codes, and the shared fp64-formula comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "flashinfer/float_formats.h"
#include "flashinfer/tensor.h"
#include "ops/op_test_util.h"
#include "util/upstream_dump_py.h"

#if FLASHINFER_TEST_HAVE_CUDART
#include "api/device_props.h"
#include "kernels/cuda/moe_cuda.h"
#endif

namespace flashinfer::testing::moe_fp4 {

/// A 64-bit LCG: the same sequence on every platform.
struct Rng {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * (next() / 2147483648.0); }
};

/// `v`'s bytes as a tensor of `shape` and `dtype` (sizes must agree).
inline Tensor bytes_tensor(const std::vector<uint8_t>& v, const Shape& shape,
                           DType dtype = DType::kUInt8) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(static_cast<size_t>(t.numel()) * t.element_size(), v.size());
  std::memcpy(t.data_ptr(), v.data(), v.size());
  return t;
}

inline std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  Rng r{seed};
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(r.next() & 0xFF);
  return v;
}

/// e4m3 codes of values in [lo, hi).
inline std::vector<uint8_t> e4m3_codes(size_t n, uint64_t seed, double lo, double hi) {
  Rng r{seed};
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = float_to_e4m3fn_bits(static_cast<float>(r.uniform(lo, hi)), true);
  return v;
}

/// n fp32 values uniform in [lo, hi), as doubles.
inline std::vector<double> uniform_f32(Rng& r, int64_t n, double lo, double hi) {
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& d : v) d = static_cast<float>(r.uniform(lo, hi));
  return v;
}

/// A test layer's optional parts: biases of `bias_dt` (fc1 [E, N1], fc2 [E, H]), SwigluBias
/// parameters ([E] each) and the routing weights of T tokens, top-2.
struct LayerExtras {
  std::vector<double> b1, b2, alpha, beta, limit, rw;
  void make(Rng& r, int64_t E, int64_t N1, int64_t H, int64_t T, DType bias_dt, bool bias,
            bool swiglu_params);
  /// Output j of the activation of GEMM1's row g (fp64): Relu, Relu2, SwigluStep (limit 7), Swiglu,
  /// or SwigluBias with expert e's parameters when given; up half first, gate second.
  double act_ref(ActivationType act, const std::vector<double>& g, int64_t j, int64_t I,
                 int64_t e) const;
};

/// An optional per-expert fp32 parameter [E] (SwigluBias alpha / beta / limit): none when empty.
inline std::optional<Tensor> opt_expert_f32(const std::vector<double>& v, int64_t E) {
  if (v.empty()) return std::nullopt;
  return Tensor::from_vector(v, {E}, DType::kFloat32);
}

/// An optional expert bias [E, n] of dt: none when empty.
inline std::optional<Tensor> opt_bias(const std::vector<double>& b, int64_t E, int64_t n,
                                      DType dt) {
  if (b.empty()) return std::nullopt;
  return Tensor::from_vector(b, {E, n}, dt);
}

/// The 4-bit code at (row, col) of plain packed weights (rows of row_bytes, low nibble first).
inline uint32_t plain_code(const std::vector<uint8_t>& plain, int64_t row_bytes, int64_t row,
                           int64_t col) {
  const uint8_t b = plain[static_cast<size_t>(row * row_bytes + col / 2)];
  return static_cast<uint32_t>(col % 2 == 0 ? b & 0xF : b >> 4);
}

/// Calls f(word, blk, pr, q, wd) for every 32-bit word of [rows, k] SM90-interleaved 4-bit
/// weights `w`: word wd (0..7) of physical row pr (0..15) of 16-row block blk in 64-column
/// partition q.
template <class F>
void for_each_sm90_word(const uint8_t* w, int64_t rows, int64_t k, const F& f) {
  for (int64_t blk = 0; blk < rows / 16; ++blk) {
    for (int pr = 0; pr < 16; ++pr) {
      for (int64_t q = 0; q < k / 64; ++q) {
        for (int wd = 0; wd < 8; ++wd) {
          uint32_t v = 0;
          std::memcpy(&v, w + (blk * 16 + pr) * (k / 2) + 32 * q + 4 * wd, 4);
          f(v, blk, pr, q, wd);
        }
      }
    }
  }
}

/// The 16-bit-unit SM90 layouts ("fp4_fp8", "int4"), independently of the kernels' lane rules:
/// word wd of physical row pr of 16-row block blk in 64-column partition q holds in nibble n the
/// code of logical row 16 blk + pr % 8 + 8 (n / 4), column 64 q + 32 (wd / 4) + 16 (pr / 8) +
/// 4 (wd % 4) + n % 4. Checks every nibble of interleaved `w` against the plain bytes, read
/// through code_of(word, n).
template <class CodeOf>
void expect_sm90_unit_words_hold(const uint8_t* w, const std::vector<uint8_t>& plain, int64_t rows,
                                 int64_t k, const CodeOf& code_of) {
  for_each_sm90_word(w, rows, k, [&](uint32_t v, int64_t blk, int pr, int64_t q, int wd) {
    for (int n = 0; n < 8; ++n) {
      const int64_t row = blk * 16 + pr % 8 + 8 * (n / 4);
      const int64_t col = 64 * q + 32 * (wd / 4) + 16 * (pr / 8) + 4 * (wd % 4) + n % 4;
      ASSERT_EQ(code_of(v, n), plain_code(plain, k / 2, row, col))
          << "block " << blk << " row " << pr << " partition " << q << " word " << wd;
    }
  });
}

/// Top-2 expert ids [T, 2] int32 over n experts: two distinct experts per token, spread so that
/// every expert gets rows.
inline Tensor top2_ids(int64_t T, int64_t n) {
  std::vector<double> v;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t a = (t * 3) % n, b = (a + 1 + (t * 5) % (n - 1)) % n;
    v.push_back(static_cast<double>(a));
    v.push_back(static_cast<double>(b));
  }
  return Tensor::from_vector(v, {T, 2}, DType::kInt32);
}

/// v rounded to dt (fp16 or bf16; fp32 otherwise), as a double.
inline double to_dt(DType dt, double v) {
  const float f = static_cast<float>(v);
  if (dt == DType::kFloat16) return half_bits_to_float(float_to_half_bits(f));
  if (dt == DType::kBFloat16) return bfloat16_bits_to_float(float_to_bfloat16_bits(f));
  return f;
}

inline void LayerExtras::make(Rng& r, int64_t E, int64_t N1, int64_t H, int64_t T, DType bias_dt,
                              bool bias, bool swiglu_params) {
  if (bias) {
    b1 = uniform_f32(r, E * N1, -0.5, 0.5);
    b2 = uniform_f32(r, E * H, -0.5, 0.5);
    for (auto& d : b1) d = to_dt(bias_dt, d);
    for (auto& d : b2) d = to_dt(bias_dt, d);
  }
  if (swiglu_params) {
    alpha = uniform_f32(r, E, 1.5, 2.0);
    beta = uniform_f32(r, E, 0.5, 1.0);
    limit = uniform_f32(r, E, 1.0, 3.0);
  }
  rw = uniform_f32(r, T * 2, 0.1, 0.9);
}

inline double silu(double v) { return v / (1.0 + std::exp(-v)); }

inline double LayerExtras::act_ref(ActivationType act, const std::vector<double>& g, int64_t j,
                                   int64_t I, int64_t e) const {
  const size_t up = static_cast<size_t>(j), gate = static_cast<size_t>(I + j);
  const size_t ei = static_cast<size_t>(e);
  if (act == ActivationType::Relu2) {
    const double a = std::max(g[up], 0.0);
    return a * a;
  }
  if (act == ActivationType::Relu) return std::max(g[up], 0.0);
  if (act == ActivationType::SwigluStep) {
    return std::min(silu(g[gate]), 7.0) * std::clamp(g[up], -7.0, 7.0);
  }
  if (alpha.empty()) return silu(g[gate]) * g[up];
  const double gl = std::min(g[gate], limit[ei]);
  const double ul = std::clamp(g[up], -limit[ei], limit[ei]) + beta[ei];
  return gl / (1.0 + std::exp(-alpha[ei] * gl)) * ul;
}

/// A quantized MoE output against its fp64 formula: quantization codes can flip where fp32 and
/// fp64 sums round differently, so a loose elementwise bound, plus a tight bound on the mean
/// error that a wrong formula would break.
inline void expect_close_to_formula(const std::vector<double>& got,
                                    const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  double max_ref = 0.0, err_sum = 0.0;
  for (double w : want) max_ref = std::max(max_ref, std::fabs(w));
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    err_sum += err;
    if (err > 0.02 * std::fabs(want[i]) + 0.02 * max_ref) ++bad;
  }
  EXPECT_EQ(bad, 0) << "max |ref| " << max_ref;
  EXPECT_LT(err_sum / static_cast<double>(got.size()), 2e-3 * max_ref + 1e-6);
  EXPECT_GT(max_ref, 0.0);
}

/// Case (a struct with dt, act, bias, make(seed), run() and expected()) in bf16 and fp16, with
/// Swiglu (with biases) and Relu2, each against its fp64 formula.
template <class Case>
void expect_dtypes_and_acts_match_formula(uint64_t seed) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (ActivationType act : {ActivationType::Swiglu, ActivationType::Relu2}) {
      Case c;
      c.dt = dt;
      c.act = act;
      c.bias = act == ActivationType::Swiglu;
      c.make(++seed);
      SCOPED_TRACE(std::string(dtype_label(dt)) + " act " + std::to_string(static_cast<int>(act)));
      expect_close_to_formula(c.run()[0].to_double_vector(), c.expected());
    }
  }
}

/// Calls f(t, k, e) for every pair (token t, slot k) of the top-2 `ids` [T, 2] whose expert is
/// local (e = id - ep_rank * E in [0, E)), tokens in order: the fp64 formulas' routing loop.
template <class F>
void for_each_local_pair(const Tensor& ids, int64_t T, int64_t E, int64_t ep_rank, F f) {
  const auto idv = ids.to_double_vector();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < 2; ++k) {
      const int64_t e = static_cast<int64_t>(idv[static_cast<size_t>(t * 2 + k)]) - ep_rank * E;
      if (e >= 0 && e < E) f(t, k, e);
    }
  }
}

/// c.quant_scales() with entry i replaced by t (bad-input tests).
template <class Case>
std::vector<Tensor> quant_scales_with(const Case& c, size_t i, Tensor t) {
  auto qs = c.quant_scales();
  qs[i] = std::move(t);
  return qs;
}

/// Two quant_scales fewer than the path takes: refused naming quant_scales.
template <class Case>
void expect_short_quant_scales_refused(const Case& c) {
  auto qs = c.quant_scales();
  qs.resize(qs.size() - 2);
  EXPECT_FI_ERROR((void)c.run(qs), "cutlass_fused_moe", "quant_scales");
}

/// Expert-parallel rank 1 of 2 and tensor-parallel rank 1 of 2 (no fc2 bias there).
template <class Case>
void set_rank1_of_2(Case& c) {
  c.ep_rank = 1;
  c.ep_size = 2;
  c.tp_rank = 1;
  c.tp_size = 2;
}

/// A call without a CUDA kernel: refused with kUnsupported naming `input` (so replay falls back
/// to the CPU).
template <class F>
void expect_refused_on_cuda(F call) {
  try {
    call();
    ADD_FAILURE() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_EQ(e.arg(), "input") << e.what();
  }
}

#if FLASHINFER_TEST_HAVE_CUDART
/// The CUDA tests of cutlass_fused_moe's mixed-input paths: on a GPU below sm`min_cc` the golden
/// call is refused (upstream's refusal); otherwise the golden (`golden(dev)` returns its output on
/// the CPU, `expect_golden` checks it exactly) on both routes (1: a block per pair; 2: tiles of
/// pairs of one expert), then `cases(route)` for routes 1, 2 and 0 (the op's choice). Each route
/// is set for its call only.
template <class Golden, class ExpectGolden, class Cases>
void expect_sm90_mixed_routes(const Golden& golden, const ExpectGolden& expect_golden,
                              const Cases& cases, int min_cc = 90) {
  const Device d = Device::cuda(0);
  if (api::compute_capability(d) < min_cc) {
    expect_refused_on_cuda([&] { (void)golden(d); });
    return;
  }
  struct RouteScope {
    explicit RouteScope(int force) { kernels::cuda::set_cutlass_moe_route(force); }
    ~RouteScope() { kernels::cuda::set_cutlass_moe_route(0); }
  };
  for (int force : {1, 2}) {
    const RouteScope route(force);
    expect_golden(golden(d));
  }
  for (int force : {1, 2, 0}) {
    const RouteScope route(force);
    SCOPED_TRACE(::testing::Message() << "route " << force);
    cases(d);
  }
}
#endif

/// Runs every case (`c.run()`) under a recorder; each cutlass_fused_moe call it made (weight
/// preparations left out) must succeed and replay identically.
template <class Case>
void expect_cutlass_moe_calls_replay(const std::vector<Case>& cases) {
  std::vector<RecordingObserver::Call> calls;
  {
    RecordingScope scope;
    for (const Case& c : cases) (void)c.run();
    for (const auto& call : scope.observer().calls) {
      if (call.name == "cutlass_fused_moe") calls.push_back(call);
    }
  }
  ASSERT_EQ(calls.size(), cases.size());
  for (const auto& call : calls) {
    ASSERT_TRUE(call.error.empty()) << call.error;
    EXPECT_TRUE(replays_identically(call));
  }
}

/// Two recorded calls replayed: a default Case with 3 tokens (seed), and an fp16 Relu2 one
/// with biases and 2 tokens (seed + 1).
template <class Case>
void expect_default_and_fp16_relu2_replay(uint64_t seed) {
  std::vector<Case> cases(2);
  cases[0].T = 3;
  cases[0].make(seed);
  cases[1].T = 2;
  cases[1].act = ActivationType::Relu2;
  cases[1].dt = DType::kFloat16;
  cases[1].bias = true;
  cases[1].make(seed + 1);
  expect_cutlass_moe_calls_replay(cases);
}

/// Python for the torch-written cutlass_fused_moe dumps (appended to upstream_dump_py.h's
/// helpers): dt(), tmeta() and rec_moe(tensors, quant_scales, meta, out, E, T), which writes one
/// call in upstream's recorder layout, quant_scales as kwarg_quant_scales__<i> with list
/// metadata, the returned list as result__0..3 (the scratch three garbage, as upstream's
/// torch.empty leaves them).
inline constexpr const char* kCutlassMoeDumpPy = R"PY(
import os
import torch.nn.functional as F
def dt(x): return {"type": "torch.dtype", "value": x}
def tmeta(t, key):
    return {"type": "torch.Tensor", "shape": list(t.shape), "dtype": str(t.dtype),
            "stride": list(t.stride()), "device": "cuda:0", "requires_grad": False,
            "is_contiguous": True, "tensor_key": key}
def rec_moe(tensors, qs, meta, out, E, T):
    seq[0] += 1
    call = "%s/20261123_090000_%03d_pid4242_cutlass_fused_moe_call%04d" % (d, seq[0], seq[0])
    os.makedirs(call)
    for i, q in enumerate(qs):
        tensors["kwarg_quant_scales__%d" % i] = q
    meta["kwarg_quant_scales"] = {"type": "list", "length": len(qs), "truncated": False,
        "items": [tmeta(q, "kwarg_quant_scales__%d" % i) for i, q in enumerate(qs)]}
    save(tensors, call + "/inputs.pt")
    outs = {"result__0": out, "result__1": torch.full((1,), 7, dtype=torch.int32),
            "result__2": torch.full((E, T), 3.0), "result__3": torch.full((E,), 9, dtype=torch.int32)}
    save(outs, call + "/outputs.pt")
    rec = {"function_name": "cutlass_fused_moe", "module": "flashinfer.fused_moe.core",
           "call_sequence": seq[0], "timestamp": "20261123_090000_%03d" % seq[0],
           "process_id": 4242, "input_metadata": meta, "output_metadata": {},
           "tensor_info": {"input_tensor_keys": list(tensors), "output_tensor_keys": list(outs)},
           "tensor_format": "torch", "execution_status": "completed"}
    with open(call + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")
)PY";

/// Writes `calls` (Python appended to kCutlassMoeDumpPy) and replays them: each of the
/// `expected` cutlass_fused_moe calls must pass, comparing result__0 only (the three scratch
/// outputs skipped). False when python3-torch is not installed.
inline bool cutlass_moe_dumps_replay(const std::string& tag, const std::string& calls,
                                     std::size_t expected) {
  std::vector<replay::Result> results;
  if (!run_upstream_dump_script(tag, std::string(kCutlassMoeDumpPy) + calls, expected, &results)) {
    return false;
  }
  for (const auto& r : results) {
    EXPECT_EQ(r.comparisons.size(), 1u) << r.function_name;
    if (r.comparisons.size() == 1) {
      EXPECT_EQ(r.comparisons[0].key, "result__0");
    }
    EXPECT_EQ(r.skipped_outputs, (std::vector<std::string>{"result__1", "result__2", "result__3"}));
  }
  return true;
}

}  // namespace flashinfer::testing::moe_fp4
