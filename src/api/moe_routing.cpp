// trtllm_gen_routing (flashinfer.fused_moe.trtllm_gen_routing): declaration, argument checks,
// dispatch. Semantics and sources: docs/MOE.md.
#include "flashinfer/ops/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/enum_table.h"
#include "api/kernel_table.h"
#include "api/moe_routing_checks.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/moe_quant_cpu.h"
#include "replay/result_comparators.h"

namespace flashinfer {

template <>
struct ArgTraits<RoutingMethodType> {
  static constexpr ParamKind kind = ParamKind::kEnum;
  static constexpr const char* type_name = "RoutingMethodType";
  static RoutingMethodType get(const CallArgs& a, std::size_t i) {
    return routing_method_type_from_value(
        a[i], a.decl().name, i < a.decl().params.size() ? a.decl().params[i].name : "");
  }
};
template <>
struct ReturnName<TrtllmGenRoutingResult> {
  static constexpr const char* value = "TrtllmGenRoutingResult";
};

namespace {
constexpr api::EnumTable<RoutingMethodType, 10> kRoutingMethods{
    "RoutingMethodType",
    {{{RoutingMethodType::Default, "Default"},
      {RoutingMethodType::Renormalize, "Renormalize"},
      {RoutingMethodType::DeepSeekV3, "DeepSeekV3"},
      {RoutingMethodType::Llama4, "Llama4"},
      {RoutingMethodType::RenormalizeNaive, "RenormalizeNaive"},
      {RoutingMethodType::TopK, "TopK"},
      {RoutingMethodType::SigmoidRenorm, "SigmoidRenorm"},
      {RoutingMethodType::MiniMax2, "MiniMax2"},
      {RoutingMethodType::Sigmoid, "Sigmoid"},
      {RoutingMethodType::TopKSigmoid, "TopKSigmoid"}}}};
}  // namespace

std::string_view routing_method_type_name(RoutingMethodType m) {
  return kRoutingMethods.name_of(m);
}

Value to_value(RoutingMethodType m) { return kRoutingMethods.to_value(m); }

// Upstream's Unspecified names no method: it and any other unknown name are kUnsupported.
RoutingMethodType routing_method_type_from_value(const Value& v, std::string_view op,
                                                 std::string_view arg) {
  return kRoutingMethods.from_value(v, op, arg, ErrorCode::kUnsupported);
}

namespace {

constexpr api::KernelEntry<kernels::TrtllmGenRoutingParams> kGenRoutingKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: routing per token, then the padded per-expert permutation in token order",
     nullptr,
     [](const kernels::TrtllmGenRoutingParams& p, const api::LaunchContext&) {
       kernels::cpu::trtllm_gen_routing(p);
     }},
};

// Routing::getMaxNumCtasInBatchDim, as upstream's Python mirrors it.
int64_t max_ctas_in_batch_dim(int64_t tokens, int64_t top_k, int64_t experts, int64_t tile) {
  int64_t remaining = tokens * top_k;
  const int64_t filled = std::min(experts, remaining);
  int64_t ctas = filled;
  remaining -= filled;
  if (remaining > 0) ctas += remaining / tile;
  return ctas;
}

TrtllmGenRoutingResult gen_routing_impl(const Tensor& logits, const std::optional<Tensor>& bias,
                                        RoutingMethodType method, int64_t top_k, int64_t nfse,
                                        int64_t n_group, int64_t topk_group, int64_t offset,
                                        std::optional<int64_t> local_num, double scale,
                                        int64_t tile, bool norm_topk_prob) {
  const char* op = "trtllm_gen_routing";
  api::check_defined(logits, op, "routing_logits");
  api::check_dim(logits, {2}, op, "routing_logits");
  api::check_dtype_in(logits, {DType::kFloat32, DType::kBFloat16}, op, "routing_logits");
  const int64_t T = logits.size(0), E = logits.size(1);
  FLASHINFER_CHECK(E <= 1 || logits.stride(1) == 1, op, "routing_logits",
                   "must be contiguous along the expert dimension, got strides ",
                   shape_to_string(logits.strides()));
  FLASHINFER_CHECK(T <= 1 || logits.stride(0) >= E, op, "routing_logits",
                   "rows must not overlap: stride(0) must be >= num_experts (", E, ")");
  FLASHINFER_CHECK(top_k >= 1 && top_k <= E, op, "top_k", "must be in [1, num_experts=", E,
                   "], got ", top_k);
  FLASHINFER_CHECK(tile >= 1 && (tile & (tile - 1)) == 0, op, "tile_tokens_dim",
                   "must be a positive power of two, got ", tile);
  if (bias) {
    api::check_dtype_in(*bias, {DType::kFloat32, DType::kBFloat16}, op, "routing_bias");
    FLASHINFER_CHECK(bias->numel() == E && bias->is_contiguous(), op, "routing_bias",
                     "must hold num_experts (", E, ") contiguous elements, got ",
                     shape_to_string(bias->shape()));
    api::check_same_device(*bias, logits, op, "routing_bias", "routing_logits");
  }
  if (method == RoutingMethodType::Llama4) {
    FLASHINFER_CHECK(top_k == 1, op, "top_k", "Llama4 routing selects one expert, got ", top_k);
  }
  const int64_t G = n_group > 0 ? n_group : 1;
  const int64_t TG = topk_group > 0 ? topk_group : G;
  if (method == RoutingMethodType::DeepSeekV3 && G > 1) {
    FLASHINFER_CHECK(E % G == 0, op, "n_group", "num_experts (", E,
                     ") must be divisible by n_group (", G, ")");
    FLASHINFER_CHECK(TG >= 1 && TG <= G, op, "topk_group", "must be in [1, n_group=", G, "], got ",
                     TG);
    FLASHINFER_CHECK(TG * (E / G) >= top_k, op, "topk_group",
                     "the kept groups hold fewer than top_k experts");
  }
  const int64_t L = local_num.value_or(E);
  FLASHINFER_CHECK(L >= 1 && offset >= 0 && offset + L <= E, op, "local_num_experts",
                   "local experts [", offset, ", ", offset + L, ") must lie in [0, num_experts=", E,
                   ")");
  FLASHINFER_CHECK(std::isfinite(scale), op, "routed_scaling_factor", "must be finite");
  // Fused shared experts: S slots appended per token (docs/MOE.md, "Fused shared experts");
  // upstream's kernels misplace them under expert parallelism (no check there: refused here).
  const int64_t S = api::check_fused_shared(op, nfse, static_cast<int64_t>(method), n_group, offset,
                                            L, E, ErrorCode::kUnsupported);
  const int64_t KS = top_k + S;
  const Device dev = logits.device();
  const int64_t max_ctas = max_ctas_in_batch_dim(T, KS, E + S, tile);
  // The permuted rows are numbered by the int32 outputs (expanded_idx_to_permuted_idx, the CTA
  // limits): a padded row count past 2^31 - 1 has no numbering, refused before its allocation.
  FLASHINFER_CHECK(max_ctas <= std::numeric_limits<int32_t>::max() / tile, op, "tile_tokens_dim",
                   "the padded rows (", max_ctas, " tiles of ", tile,
                   ") must fit the int32 permuted indices");
  const int64_t max_padded = max_ctas * tile;
  Tensor ids = Tensor::empty({T, KS}, DType::kInt32, dev);
  Tensor weights = Tensor::empty({T, KS}, DType::kBFloat16, dev);
  Tensor total = Tensor::empty({1}, DType::kInt32, dev);
  Tensor e2p = Tensor::empty({T, KS}, DType::kInt32, dev);
  Tensor p2t = Tensor::empty({max_padded}, DType::kInt32, dev);
  Tensor cta_batch = Tensor::empty({max_ctas}, DType::kInt32, dev);
  Tensor cta_limit = Tensor::empty({max_ctas}, DType::kInt32, dev);
  Tensor num_ctas = Tensor::empty({1}, DType::kInt32, dev);
  kernels::TrtllmGenRoutingParams p;
  p.routing.logits = logits.data_ptr();
  p.routing.logits_dtype = logits.dtype();
  p.routing.logits_stride = logits.stride(0);
  p.routing.bias = bias ? bias->data_ptr() : nullptr;
  p.routing.bias_dtype = bias ? bias->dtype() : DType::kFloat32;
  p.routing.num_tokens = T;
  p.routing.num_experts = E;
  p.routing.top_k = top_k;
  p.routing.n_group = G;
  p.routing.topk_group = TG;
  p.routing.routed_scaling_factor = static_cast<float>(scale);
  p.routing.norm_topk_prob = norm_topk_prob;
  p.routing.method = static_cast<kernels::MoeRouting>(method);
  p.local_expert_offset = offset;
  p.local_num_experts = L;
  p.num_shared = S;
  p.tile = tile;
  p.topk_ids = ids.data<int32_t>();
  p.topk_weights = static_cast<uint16_t*>(weights.data_ptr());
  p.total_padded = total.data<int32_t>();
  p.expanded_to_permuted = e2p.data<int32_t>();
  p.permuted_to_token = p2t.data<int32_t>();
  p.max_padded = max_padded;
  p.cta_to_batch = cta_batch.data<int32_t>();
  p.cta_to_mn_limit = cta_limit.data<int32_t>();
  p.max_ctas = max_ctas;
  p.num_ctas = num_ctas.data<int32_t>();
  api::launch(kGenRoutingKernels, p, dev, op, "routing_logits", false);
  return {ids, weights, total, e2p, p2t, cta_batch, cta_limit, num_ctas};
}

// trtllm_gen_routing: m tokens, 64 experts in 8 groups (4 kept), top-8, DeepSeekV3.
BenchCase bench_trtllm_gen_routing(const BenchShape& s, Device dev) {
  const int64_t T = s.m, E = 64, K = 8;
  BenchCase c = api::bench::invoke_case(
      "trtllm_gen_routing",
      {Value(api::bench::random_tensor({T, E}, DType::kFloat32, dev, s.random_seed, -3.0, 3.0)),
       Value(api::bench::random_tensor({E}, DType::kFloat32, dev, s.random_seed + 1, -0.2, 0.2)),
       to_value(RoutingMethodType::DeepSeekV3), Value(K)},
      {{"n_group", Value(int64_t{8})},
       {"topk_group", Value(int64_t{4})},
       {"routed_scaling_factor", Value(2.5)}});
  c.flops = static_cast<double>(T * E) * 4.0;
  c.bytes = static_cast<double>(T * E) * 4.0 + static_cast<double>(T * K) * 10.0;
  return c;
}

}  // namespace

TrtllmGenRoutingResult trtllm_gen_routing(const Tensor& routing_logits,
                                          std::optional<Tensor> routing_bias,
                                          RoutingMethodType routing_method, int64_t top_k,
                                          int64_t num_fused_shared_experts, int64_t n_group,
                                          int64_t topk_group, int64_t local_expert_offset,
                                          std::optional<int64_t> local_num_experts,
                                          double routed_scaling_factor, int64_t tile_tokens_dim,
                                          bool norm_topk_prob, std::optional<bool> enable_pdl) {
  return call_op<&trtllm_gen_routing>(
      [&] {
        return gen_routing_impl(routing_logits, routing_bias, routing_method, top_k,
                                num_fused_shared_experts, n_group, topk_group, local_expert_offset,
                                local_num_experts, routed_scaling_factor, tile_tokens_dim,
                                norm_topk_prob);
      },
      routing_logits, routing_bias, routing_method, top_k, num_fused_shared_experts, n_group,
      topk_group, local_expert_offset, local_num_experts, routed_scaling_factor, tile_tokens_dim,
      norm_topk_prob, enable_pdl);
}

namespace detail {
void register_moe_routing_ops(OpRegistry& r) {
  declare<&trtllm_gen_routing>(
      r,
      {.name = "trtllm_gen_routing",
       .module = "flashinfer.fused_moe.trtllm_gen_routing",
       .summary = "trtllm-gen MoE routing: expert selection and the padded per-expert "
                  "permutation",
       .returns = "TrtllmGenRoutingResult",
       .unwritten_results = {"result_4", "result_5", "result_6"},
       .unwritten_reason =
           "upstream leaves the entries of permuted_idx_to_token_idx, cta_idx_xy_to_batch_idx "
           "and cta_idx_xy_to_mn_limit beyond the padded count / CTA count undefined "
           "(torch.empty); their defined parts follow from expanded_idx_to_permuted_idx and "
           "total_num_padded_tokens, which are compared"},
      "routing_logits", arg("routing_bias").required(), "routing_method", "top_k",
      arg("num_fused_shared_experts", int64_t{0}).kw(), arg("n_group", int64_t{0}).kw(),
      arg("topk_group", int64_t{0}).kw(), arg("local_expert_offset", int64_t{0}).kw(),
      arg("local_num_experts").kw(), arg("routed_scaling_factor", 1.0).kw(),
      arg("tile_tokens_dim", int64_t{8}).kw(), arg("norm_topk_prob", true).kw(),
      arg("enable_pdl").kw());
  // The order of an expert's pairs is the GPU's choice: replay compares up to it.
  detail::register_result_comparator("trtllm_gen_routing", detail::compare_trtllm_gen_routing);
  api::register_backends("trtllm_gen_routing", kGenRoutingKernels);
  register_bench_hook("trtllm_gen_routing", bench_trtllm_gen_routing);
}
}  // namespace detail

}  // namespace flashinfer
