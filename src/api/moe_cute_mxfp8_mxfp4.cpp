// flashinfer.fused_moe.cute_dsl.fused_moe_mxfp8_mxfp4: cute_dsl_fused_moe_mxfp8_mxfp4 and
// CuteDslMxfp8Mxfp4MoEWrapper. Upstream's validation (_validate_mixed_inputs and
// _validate_mixed_configuration, their order and words), the tactic list, then the math of
// quant_mode "w4a8" (src/api/moe_cute_w4a8.cpp), which upstream later made these names shims
// over. Facts: docs/upstream-facts/cute_dsl_moe_mxfp8_mxfp4.md; docs/MOE.md ("CuTe-DSL MXFP8 x
// MXFP4").
#include "flashinfer/ops/moe_cute_mxfp8_mxfp4.h"

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/moe_cute_w4a8.h"
#include "flashinfer/op_typed.h"

namespace flashinfer {
namespace {

constexpr const char* kMixedModule = "flashinfer.fused_moe.cute_dsl.fused_moe_mxfp8_mxfp4";
constexpr const char* kMixedFn = "cute_dsl_fused_moe_mxfp8_mxfp4";
constexpr const char* kMixedInit = "CuteDslMxfp8Mxfp4MoEWrapper.__init__";
constexpr const char* kMixedRun = "CuteDslMxfp8Mxfp4MoEWrapper.run";

// normalize_cute_dsl_moe_activation_type: Swiglu (3), Relu2 (6), GegluTanh (8).
void check_mixed_activation(const char* op, int64_t act) {
  FLASHINFER_CHECK(act == 3 || act == 6 || act == 8, op, "activation_type",
                   "Unsupported activation_type ", act,
                   "; expected ActivationType.Swiglu, ActivationType.GegluTanh or "
                   "ActivationType.Relu2");
}

// _validate_mixed_configuration.
void check_configuration(const char* op, int64_t num_experts, int64_t top_k, int64_t local,
                         int64_t offset, int64_t hidden, int64_t inter) {
  FLASHINFER_CHECK(num_experts > 0 && local > 0, op,
                   num_experts > 0 ? "num_local_experts" : "num_experts",
                   "num_experts and num_local_experts must be positive");
  FLASHINFER_CHECK(top_k >= 1 && top_k <= num_experts, op, "top_k",
                   "top_k must be in [1, num_experts]");
  FLASHINFER_CHECK(offset >= 0 && offset + local <= num_experts, op, "local_expert_offset",
                   "local expert range must be contained in [0, num_experts)");
  FLASHINFER_CHECK(hidden > 0 && hidden % 128 == 0, op, "hidden_size",
                   "hidden_size must be a positive multiple of 128");
  FLASHINFER_CHECK(inter > 0 && inter % 128 == 0, op, "intermediate_size",
                   "intermediate_size must be a positive multiple of 128");
}

void check_mixed_shape(const char* op, const Tensor& t, const char* arg, const Shape& want) {
  FLASHINFER_CHECK(t.shape() == want, op, arg, arg, " must have shape ", shape_to_string(want),
                   ", got ", shape_to_string(t.shape()));
}

// convert_sf_to_mma_layout's view: shape (32, 4, mt, 4, kt, E) and exactly its strides.
void check_mma_scales(const char* op, const Tensor& s, const char* arg, int64_t E, int64_t rows,
                      int64_t cols) {
  const int64_t mt = (rows + 127) / 128, kt = (cols + 127) / 128;
  const Shape shape{32, 4, mt, 4, kt, E};
  FLASHINFER_CHECK(s.shape() == shape, op, arg, arg, " must have MMA scale shape ",
                   shape_to_string(shape), ", got ", shape_to_string(s.shape()));
  const Shape want{16, 4, kt * 512, 1, 512, mt * kt * 512};
  FLASHINFER_CHECK(s.strides() == want, op, arg, arg, " must use MMA scale strides ",
                   shape_to_string(want), ", got ", shape_to_string(s.strides()));
}

// canonicalize_mxfp8_mxfp4_tactic: None (the autotuner's choice), -1 where the runner takes it
// (the wrapper's run: the default tactic; the function canonicalizes it first and refuses it),
// else exactly (tile_size, ((tile, n1), (tile / 128, 1), False), ((tile, n2), (tile / 128, cn),
// False)) from the 32 the kernels have. A tactic chooses tiles only: the result does not depend
// on it.
void check_tactic(const char* op, const std::optional<Value>& tactic, bool minus_one_ok) {
  if (!tactic || tactic->is_none()) return;
  if (minus_one_ok && tactic->kind() == Value::Kind::kInt && tactic->as_int() == -1) return;
  FLASHINFER_CHECK(tactic->is_sequence() && tactic->items().size() == 3, op, "tactic",
                   "tactic must be (tile_size, gemm1_tactic, gemm2_tactic)");
  // A pair of ints (tile or cluster shape), or with pair false the tile size alone.
  auto ints = [](const Value& v, std::vector<int64_t>& out, bool pair = true) {
    if (!pair) {
      if (v.kind() != Value::Kind::kInt) return false;
      out.push_back(v.as_int());
      return true;
    }
    if (!v.is_sequence() || v.items().size() != 2) return false;
    for (const Value& i : v.items()) {
      if (i.kind() != Value::Kind::kInt) return false;
      out.push_back(i.as_int());
    }
    return true;
  };
  // gemm tactic ((tm, tn), (cm, cn), False) into {tm, tn, cm, cn}.
  auto gemm = [&](const Value& g, std::vector<int64_t>& out) {
    if (!g.is_sequence() || g.items().size() != 3) return false;
    const Value& flag = g.items()[2];
    if (flag.kind() != Value::Kind::kBool || flag.as_bool()) return false;
    return ints(g.items()[0], out) && ints(g.items()[1], out) && out.size() == 4;
  };
  const auto& it = tactic->items();
  std::vector<int64_t> tile, g1, g2;
  bool ok = ints(it[0], tile, false) && gemm(it[1], g1) && gemm(it[2], g2);
  if (ok) {
    const int64_t t = tile[0], cm = t / 128;
    ok = (t == 128 || t == 256) && g1[0] == t && (g1[1] == 128 || g1[1] == 256) && g1[2] == cm &&
         g1[3] == 1 && g2[0] == t &&
         (g2[1] == 64 || g2[1] == 128 || g2[1] == 192 || g2[1] == 256) && g2[2] == cm &&
         (g2[3] == 1 || g2[3] == 2);
  }
  FLASHINFER_CHECK(ok, op, "tactic", "unsupported MXFP8 x MXFP4 MoE tactic: ", tactic->repr());
}

struct MixedProblem {
  int64_t num_experts = 0, top_k = 0, local = 0, offset = 0, act = 3;
  double alpha = 1.0, beta = 0.0, limit = 3.4028234663852886e38;
  std::optional<int64_t> hidden, inter;  // the wrapper's sizes (the function infers them)
};

// _validate_mixed_inputs, in its order.
void validate_inputs(const char* op, const MixedProblem& m, const Tensor& x, const Tensor& x_sf,
                     const Tensor& ids, const Tensor& scales, const Tensor& w1, const Tensor& w1_sf,
                     const Tensor& a1, const Tensor& w2, const Tensor& w2_sf, const Tensor& a2,
                     const std::optional<Tensor>& out) {
  api::check_defined(x, op, "x");
  const std::pair<const Tensor*, const char*> rest[] = {
      {&x_sf, "x_sf"},    {&ids, "token_selected_experts"}, {&scales, "token_final_scales"},
      {&w1, "w1_weight"}, {&w1_sf, "w1_weight_sf"},         {&a1, "w1_alpha"},
      {&w2, "w2_weight"}, {&w2_sf, "w2_weight_sf"},         {&a2, "w2_alpha"}};
  for (const auto& [t, name] : rest) {
    api::check_defined(*t, op, name);
    FLASHINFER_CHECK(t->device() == x.device(), op, name, name, " must be on ", x.device().str(),
                     ", got ", t->device().str());
  }
  if (out && out->defined()) {
    FLASHINFER_CHECK(out->device() == x.device(), op, "moe_output", "moe_output must be on ",
                     x.device().str(), ", got ", out->device().str());
  }
  FLASHINFER_CHECK(x.dim() == 2, op, "x", "x must be 2D, got shape ", shape_to_string(x.shape()));
  const int64_t T = x.size(0), H = x.size(1);
  FLASHINFER_CHECK(T > 0, op, "x", "x must contain at least one token");
  if (m.hidden) {
    FLASHINFER_CHECK(H == *m.hidden, op, "x", "x must have hidden size ", *m.hidden, ", got ", H);
  }
  FLASHINFER_CHECK(w2.dim() == 3, op, "w2_weight",
                   "w2_weight must be a 3D grouped packed-weight tensor");
  const int64_t I = m.inter.value_or(2 * w2.size(2)), E = m.local;
  check_configuration(op, m.num_experts, m.top_k, E, m.offset, H, I);
  const bool gated = m.act != 6;
  const int64_t G1 = gated ? 2 * I : I;
  check_mixed_shape(op, x_sf, "x_sf", {T, H / 32});
  check_mixed_shape(op, ids, "token_selected_experts", {T, m.top_k});
  check_mixed_shape(op, scales, "token_final_scales", {T, m.top_k});
  check_mixed_shape(op, w1, "w1_weight", {E, G1, H / 2});
  check_mixed_shape(op, w2, "w2_weight", {E, H, I / 2});
  check_mixed_shape(op, a1, "w1_alpha", {E});
  check_mixed_shape(op, a2, "w2_alpha", {E});
  const std::pair<const Tensor*, const char*> dense[] = {{&x, "x"},
                                                         {&x_sf, "x_sf"},
                                                         {&ids, "token_selected_experts"},
                                                         {&scales, "token_final_scales"},
                                                         {&w1, "w1_weight"},
                                                         {&a1, "w1_alpha"},
                                                         {&w2, "w2_weight"},
                                                         {&a2, "w2_alpha"}};
  for (const auto& [t, name] : dense) {
    FLASHINFER_CHECK(t->is_contiguous(), op, name, name, " must be contiguous");
  }
  check_mma_scales(op, w1_sf, "w1_weight_sf", E, G1, H);
  check_mma_scales(op, w2_sf, "w2_weight_sf", E, H, I);
  // dtype checks (TypeError upstream), in its order; `got` appends the dtype found.
  auto need = [&](const Tensor& t, DType d, const char* arg, const char* text, bool got) {
    FLASHINFER_CHECK(t.dtype() == d, op, arg, text, got ? ", got " : "",
                     got ? dtype_torch_name(t.dtype()) : "");
  };
  need(x, DType::kFloat8E4M3FN, "x", "x must have dtype torch.float8_e4m3fn", true);
  need(x_sf, DType::kUInt8, "x_sf", "x_sf must have dtype torch.uint8", true);
  need(ids, DType::kInt32, "token_selected_experts",
       "token_selected_experts must have dtype torch.int32", true);
  need(scales, DType::kFloat32, "token_final_scales",
       "token_final_scales must have dtype torch.float32", true);
  need(w1, DType::kUInt8, "w1_weight", "w1_weight must contain packed MXFP4 uint8 values", false);
  need(w2, DType::kUInt8, "w2_weight", "w2_weight must contain packed MXFP4 uint8 values", false);
  need(w1_sf, DType::kUInt8, "w1_weight_sf", "w1_weight_sf must contain E8M0 uint8 scale codes",
       false);
  need(w2_sf, DType::kUInt8, "w2_weight_sf", "w2_weight_sf must contain E8M0 uint8 scale codes",
       false);
  need(a1, DType::kFloat32, "w1_alpha", "w1_alpha must have dtype torch.float32", false);
  need(a2, DType::kFloat32, "w2_alpha", "w2_alpha must have dtype torch.float32", false);
  if (out && out->defined()) {
    need(*out, DType::kBFloat16, "moe_output", "moe_output must have dtype torch.bfloat16", false);
    FLASHINFER_CHECK(out->shape() == Shape({T, H}), op, "moe_output",
                     "moe_output must have shape (", T, ", ", H, "), got ",
                     shape_to_string(out->shape()));
    FLASHINFER_CHECK(out->is_contiguous(), op, "moe_output", "moe_output must be contiguous");
  }
}

Tensor mixed_impl(const char* op, const MixedProblem& m, const Tensor& x, const Tensor& x_sf,
                  const Tensor& ids, const Tensor& scales, const Tensor& w1, const Tensor& w1_sf,
                  const Tensor& a1, const Tensor& w2, const Tensor& w2_sf, const Tensor& a2,
                  const std::optional<Tensor>& out, const std::optional<Value>& tactic) {
  validate_inputs(op, m, x, x_sf, ids, scales, w1, w1_sf, a1, w2, w2_sf, a2, out);
  check_tactic(op, tactic, /*minus_one_ok=*/op == std::string_view(kMixedRun));
  // Upstream's kernels exist for SM100 / SM103 only (GEMM1's "requires SM10x family").
  api::check_upstream_arch(op, "x", x.device());
  // There, no CUDA kernel here: refused, so a replay on the GPU falls back to the CPU.
  FLASHINFER_CHECK_CODE(x.device().is_cpu(), ErrorCode::kUnsupported, op, "x",
                        "the MXFP8 x MXFP4 fused MoE has a CPU reference only (no CUDA kernel "
                        "here)");
  // moe_output is zeroed, then accumulated into (the w4a8 path writes every row).
  return moe_cute::cute_w4a8_impl(op, x, x_sf, ids, scales, w1, w1_sf, a1, std::nullopt, w2, w2_sf,
                                  a2, m.num_experts, m.top_k, m.local, m.offset, DType::kBFloat16,
                                  out, true, m.act, m.alpha, m.beta, m.limit, std::nullopt,
                                  std::nullopt, std::nullopt);
}

using MixedInit =
    Init<CuteDslMxfp8Mxfp4MoEWrapper, int64_t, int64_t, int64_t, int64_t, std::optional<int64_t>,
         std::optional<int64_t>, int64_t, bool, std::string, bool, int64_t, double, double, double>;

}  // namespace

Tensor cute_dsl_fused_moe_mxfp8_mxfp4(const Tensor& x, const Tensor& x_sf,
                                      const Tensor& token_selected_experts,
                                      const Tensor& token_final_scales, const Tensor& w1_weight,
                                      const Tensor& w1_weight_sf, const Tensor& w1_alpha,
                                      const Tensor& w2_weight, const Tensor& w2_weight_sf,
                                      const Tensor& w2_alpha, int64_t num_experts, int64_t top_k,
                                      std::optional<int64_t> num_local_experts,
                                      int64_t local_expert_offset, std::optional<Tensor> moe_output,
                                      std::optional<Value> aux_stream, std::optional<Value> tactic,
                                      bool enable_pdl, int64_t activation_type, double swiglu_alpha,
                                      double swiglu_beta, double swiglu_limit) {
  return call_op<&cute_dsl_fused_moe_mxfp8_mxfp4>(
      [&] {
        check_mixed_activation(kMixedFn, activation_type);
        MixedProblem m;
        m.num_experts = num_experts, m.top_k = top_k, m.offset = local_expert_offset;
        m.local = num_local_experts.value_or(num_experts);  // 0 is refused, as upstream
        m.act = activation_type, m.alpha = swiglu_alpha, m.beta = swiglu_beta,
        m.limit = swiglu_limit;
        return mixed_impl(kMixedFn, m, x, x_sf, token_selected_experts, token_final_scales,
                          w1_weight, w1_weight_sf, w1_alpha, w2_weight, w2_weight_sf, w2_alpha,
                          moe_output, tactic);
      },
      x, x_sf, token_selected_experts, token_final_scales, w1_weight, w1_weight_sf, w1_alpha,
      w2_weight, w2_weight_sf, w2_alpha, num_experts, top_k, num_local_experts, local_expert_offset,
      moe_output, aux_stream, tactic, enable_pdl, activation_type, swiglu_alpha, swiglu_beta,
      swiglu_limit);
}

CuteDslMxfp8Mxfp4MoEWrapper::CuteDslMxfp8Mxfp4MoEWrapper(
    int64_t num_experts, int64_t top_k, int64_t hidden_size, int64_t intermediate_size,
    std::optional<int64_t> max_num_tokens, std::optional<int64_t> num_local_experts,
    int64_t local_expert_offset, bool use_cuda_graph, std::string device, bool enable_pdl,
    int64_t activation_type, double swiglu_alpha, double swiglu_beta, double swiglu_limit) {
  call_init<MixedInit>(
      [&] {
        check_mixed_activation(kMixedInit, activation_type);
        // "requires a CUDA device" upstream; a CPU wrapper is ours (replay, the reference).
        FLASHINFER_CHECK(device == "cpu" || device.rfind("cuda", 0) == 0, kMixedInit, "device",
                         "CuteDslMxfp8Mxfp4MoEWrapper requires a CUDA device, got \"", device,
                         "\"");
        const int64_t local = num_local_experts.value_or(num_experts);
        check_configuration(kMixedInit, num_experts, top_k, local, local_expert_offset, hidden_size,
                            intermediate_size);
        // max_num_tokens is accepted and ignored (deprecated upstream), as use_cuda_graph
        // changes only which streams upstream's runs use.
        num_experts_ = num_experts, top_k_ = top_k, hidden_size_ = hidden_size;
        intermediate_size_ = intermediate_size, num_local_experts_ = local;
        local_expert_offset_ = local_expert_offset, activation_type_ = activation_type;
        swiglu_alpha_ = swiglu_alpha, swiglu_beta_ = swiglu_beta, swiglu_limit_ = swiglu_limit;
      },
      *this, num_experts, top_k, hidden_size, intermediate_size, max_num_tokens, num_local_experts,
      local_expert_offset, use_cuda_graph, device, enable_pdl, activation_type, swiglu_alpha,
      swiglu_beta, swiglu_limit);
}

Tensor CuteDslMxfp8Mxfp4MoEWrapper::run(const Tensor& x, const Tensor& x_sf,
                                        const Tensor& token_selected_experts,
                                        const Tensor& token_final_scales, const Tensor& w1_weight,
                                        const Tensor& w1_weight_sf, const Tensor& w1_alpha,
                                        const Tensor& w2_weight, const Tensor& w2_weight_sf,
                                        const Tensor& w2_alpha, std::optional<Value> tactic) {
  return call_op<&CuteDslMxfp8Mxfp4MoEWrapper::run>(
      [&] {
        MixedProblem m;
        m.num_experts = num_experts_, m.top_k = top_k_, m.local = num_local_experts_;
        m.offset = local_expert_offset_, m.act = activation_type_;
        m.alpha = swiglu_alpha_, m.beta = swiglu_beta_, m.limit = swiglu_limit_;
        m.hidden = hidden_size_, m.inter = intermediate_size_;
        return mixed_impl(kMixedRun, m, x, x_sf, token_selected_experts, token_final_scales,
                          w1_weight, w1_weight_sf, w1_alpha, w2_weight, w2_weight_sf, w2_alpha,
                          std::nullopt, tactic);
      },
      *this, x, x_sf, token_selected_experts, token_final_scales, w1_weight, w1_weight_sf, w1_alpha,
      w2_weight, w2_weight_sf, w2_alpha, tactic);
}

namespace {

// 8 experts, top-2 (weights 0.75 / 0.25), x e4m3 with ue8m0 scales near 1, random MXFP4 weights
// (every byte a valid pair) with scales near 2^-6, alphas 1; H and I rounded up to 128.
BenchCase bench_mixed(const BenchShape& s, Device dev, bool wrapper) {
  const int64_t T = std::max<int64_t>(1, s.m), E = 8, K = 2;
  const int64_t H = std::max<int64_t>(128, (s.hidden_size + 127) / 128 * 128);
  const int64_t I = std::max<int64_t>(128, (s.n + 127) / 128 * 128);
  std::vector<double> ids, rw;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t e0 = (t * 5) % E, e1 = (e0 + 1 + t % (E - 1)) % E;
    ids.insert(ids.end(), {static_cast<double>(e0), static_cast<double>(e1)});
    rw.insert(rw.end(), {0.75, 0.25});
  }
  const uint64_t sd = s.random_seed;
  // Bytes in [lo, hi] from a small LCG (every device of one seed gets the same).
  auto bytes = [](int64_t n, uint64_t seed, int lo, int hi) {
    std::vector<double> v(static_cast<size_t>(n));
    uint64_t st = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (double& b : v) {
      st = st * 6364136223846793005ULL + 1442695040888963407ULL;
      b = lo + static_cast<int>((st >> 33) % static_cast<uint64_t>(hi - lo + 1));
    }
    return v;
  };
  auto u8 = [&](const Shape& shape, uint64_t seed, int lo, int hi) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return Tensor::from_vector(bytes(n, seed, lo, hi), shape, DType::kUInt8).to(dev);
  };
  // The MMA view over 128x4-swizzled codes near 2^-6: (32, 4, mt, 4, kt, E) with its strides.
  auto scales = [&](int64_t rows, int64_t cols, uint64_t seed) {
    const int64_t mt = rows / 128, kt = cols / 128;
    const Tensor base = u8({E * mt * kt * 512}, seed, 120, 123);
    return Tensor::from_storage(base.storage(), {32, 4, mt, 4, kt, E},
                                {16, 4, kt * 512, 1, 512, mt * kt * 512}, 0, DType::kUInt8);
  };
  std::vector<double> xv = bytes(T * H, sd + 1, 0, 64);
  for (double& v : xv) v = (v - 32.0) / 16.0;  // e4m3 values in [-2, 2]
  const Tensor x = Tensor::from_vector(xv, {T, H}, DType::kFloat8E4M3FN).to(dev);
  const std::vector<Value> args{Value(x),
                                Value(u8({T, H / 32}, sd + 2, 126, 128)),
                                Value(Tensor::from_vector(ids, {T, K}, DType::kInt32).to(dev)),
                                Value(Tensor::from_vector(rw, {T, K}, DType::kFloat32).to(dev)),
                                Value(u8({E, 2 * I, H / 2}, sd + 3, 0, 255)),
                                Value(scales(2 * I, H, sd + 4)),
                                Value(Tensor::full({E}, 1.0, DType::kFloat32).to(dev)),
                                Value(u8({E, H, I / 2}, sd + 5, 0, 255)),
                                Value(scales(H, I, sd + 6)),
                                Value(Tensor::full({E}, 1.0, DType::kFloat32).to(dev))};
  BenchCase c;
  if (wrapper) {
    std::vector<Value> a{api::bench::bench_object(std::make_shared<CuteDslMxfp8Mxfp4MoEWrapper>(
        E, K, H, I, std::nullopt, std::nullopt, 0, false, dev.str()))};
    a.insert(a.end(), args.begin(), args.end());
    c = api::bench::invoke_case(kMixedRun, a);
  } else {
    std::vector<Value> a = args;
    a.insert(a.end(), {Value(E), Value(K)});
    c = api::bench::invoke_case(kMixedFn, a);
  }
  const double rows = static_cast<double>(T * K);
  c.flops = 2.0 * rows * H * (2 * I) + 2.0 * rows * I * H;
  c.bytes = static_cast<double>(T * H) * 3.0 + static_cast<double>(E * 3 * I * H) / 2;
  return c;
}

BenchCase bench_mixed_fn(const BenchShape& s, Device dev) { return bench_mixed(s, dev, false); }
BenchCase bench_mixed_wrapper(const BenchShape& s, Device dev) { return bench_mixed(s, dev, true); }

}  // namespace

namespace detail {

void register_moe_cute_mxfp8_mxfp4_ops(OpRegistry& r) {
  declare<&cute_dsl_fused_moe_mxfp8_mxfp4>(
      r,
      {.name = kMixedFn,
       .module = kMixedModule,
       .summary = "CuTe-DSL MXFP8 x MXFP4 fused MoE (SM100): precomputed routing, GEMM1, "
                  "activation requantized to MXFP8, GEMM2, weighted combine in bf16"},
      "x", "x_sf", "token_selected_experts", "token_final_scales", "w1_weight", "w1_weight_sf",
      "w1_alpha", "w2_weight", "w2_weight_sf", "w2_alpha", "num_experts", "top_k",
      "num_local_experts", arg("local_expert_offset", int64_t{0}), arg("moe_output").mut(),
      "aux_stream", "tactic", arg("enable_pdl", true), arg("activation_type", int64_t{3}),
      arg("swiglu_alpha", 1.0), arg("swiglu_beta", 0.0),
      arg("swiglu_limit", 3.4028234663852886e38));
  declare_init<MixedInit>(
      r,
      {.name = kMixedInit,
       .module = kMixedModule,
       .summary = "CuTe-DSL MXFP8 x MXFP4 fused-MoE wrapper (settings fixed at construction)"},
      "num_experts", "top_k", "hidden_size", "intermediate_size", "max_num_tokens",
      "num_local_experts", arg("local_expert_offset", int64_t{0}), arg("use_cuda_graph", false),
      arg("device", "cuda"), arg("enable_pdl", true), arg("activation_type", int64_t{3}),
      arg("swiglu_alpha", 1.0), arg("swiglu_beta", 0.0),
      arg("swiglu_limit", 3.4028234663852886e38));
  declare<&CuteDslMxfp8Mxfp4MoEWrapper::run>(
      r,
      {.name = kMixedRun,
       .module = kMixedModule,
       .summary = "CuTe-DSL MXFP8 x MXFP4 fused MoE with the wrapper's settings"},
      "x", "x_sf", "token_selected_experts", "token_final_scales", "w1_weight", "w1_weight_sf",
      "w1_alpha", "w2_weight", "w2_weight_sf", "w2_alpha", "tactic");
  static constexpr api::BackendSummary kBackends[] = {
      {DeviceType::kCPU,
       "CPU reference (quant_mode w4a8's): MXFP8 x and MXFP4 weights decoded exactly, fp32 "
       "GEMMs per expert, the activation requantized to MXFP8, fp32 finalize rounded once to "
       "bf16"}};
  for (const char* name : {kMixedFn, kMixedInit, kMixedRun})
    api::register_backends(name, kBackends);
  register_bench_hook(kMixedFn, bench_mixed_fn);
  register_bench_hook(kMixedRun, bench_mixed_wrapper);
}

}  // namespace detail

}  // namespace flashinfer
