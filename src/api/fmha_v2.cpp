// fmha_v2_prefill_deepseek and fmha_v2_prefill_sm120 (flashinfer.prefill): dense-batch prefill
// through the ragged-attention kernels (api/ragged_attention.h), each batch entry one request
// of seq_len queries over seq_len keys.
#include "flashinfer/ops/fmha_v2.h"

#include <cmath>
#include <vector>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/ragged_attention.h"
#include "flashinfer/op_typed.h"

namespace flashinfer {
namespace {

constexpr const char* kDeepseek = "fmha_v2_prefill_deepseek";
constexpr const char* kSm120 = "fmha_v2_prefill_sm120";

// Rows (batch, seq) as one axis: stride(1) when the two axes collapse, else a dense copy.
Tensor rows_view(const Tensor& t) {
  const Tensor c = t.stride(0) == t.size(1) * t.stride(1) ? t : t.contiguous();
  return c;
}

AttentionOutput fmha_v2_impl(const char* op, const Tensor& query, const Tensor& key,
                             const Tensor& value, const Tensor& out, int64_t num_heads,
                             int64_t head_dim, int64_t seq_len, std::optional<double> scale_bmm1,
                             std::optional<double> scale_bmm2, bool causal, bool return_lse,
                             const std::optional<Tensor>& lse_arg,
                             const std::optional<Tensor>& scale_bmm1_d,
                             const std::optional<Tensor>& scale_bmm2_d, bool deepseek) {
  FLASHINFER_CHECK_CODE(!scale_bmm1_d, ErrorCode::kUnsupported, op, "scale_bmm1_d",
                        "device scales are not supported; pass scale_bmm1");
  FLASHINFER_CHECK_CODE(!scale_bmm2_d, ErrorCode::kUnsupported, op, "scale_bmm2_d",
                        "device scales are not supported; pass scale_bmm2");
  for (const auto& [t, arg] : {std::pair{&query, "query"}, std::pair{&key, "key"},
                               std::pair{&value, "value"}, std::pair{&out, "out"}}) {
    api::check_defined(*t, op, arg);
    api::check_dim(*t, {4}, op, arg);
    FLASHINFER_CHECK(t->stride(3) == 1 || t->size(3) <= 1, op, arg,
                     "the last axis must be contiguous");
  }
  const int64_t B = query.size(0), S = query.size(1), H = query.size(2), D = query.size(3);
  const int64_t hkv = key.size(2), dv = value.size(3);
  FLASHINFER_CHECK(num_heads == H, op, "num_heads", num_heads, " != query's ", H, " heads");
  FLASHINFER_CHECK(head_dim == D, op, "head_dim", head_dim, " != query's head dim ", D);
  FLASHINFER_CHECK(seq_len == S, op, "seq_len", seq_len, " != query's ", S, " tokens per batch");
  if (deepseek) {
    FLASHINFER_CHECK(D == 192 && dv == 128, op, "query",
                     "DeepSeek head dims are query/key 192 and value 128, got ", D, " and ", dv);
  }
  FLASHINFER_CHECK(D >= 1 && D <= 256 && dv >= 1 && dv <= 256, op, "head_dim",
                   "head dims must be in [1, 256], got ", D, " and ", dv);
  FLASHINFER_CHECK(key.size(0) == B && key.size(1) == S && key.size(3) == D, op, "key", "must be [",
                   B, ", ", S, ", Hkv, ", D, "], got ", shape_to_string(key.shape()));
  FLASHINFER_CHECK(value.size(0) == B && value.size(1) == S && value.size(2) == hkv, op, "value",
                   "must be [", B, ", ", S, ", ", hkv, ", Dv], got ",
                   shape_to_string(value.shape()));
  FLASHINFER_CHECK(hkv >= 1 && H % hkv == 0, op, "key", "heads (", hkv,
                   ") must divide the query's ", H);
  const DType qd = query.dtype();
  FLASHINFER_CHECK(qd == DType::kFloat16 || qd == DType::kBFloat16 || qd == DType::kFloat8E4M3FN,
                   op, "query", "dtype ", dtype_torch_name(qd),
                   " is not supported (float16, bfloat16, float8_e4m3fn)");
  api::check_same_dtype(key, query, op, "key", "query");
  api::check_same_dtype(value, query, op, "value", "query");
  api::check_same_device(key, query, op, "key", "query");
  api::check_same_device(value, query, op, "value", "query");
  api::check_same_device(out, query, op, "out", "query");
  api::check_shape_eq(out, Shape{B, S, H, dv}, op, "out");
  FLASHINFER_CHECK_CODE(out.dtype() == DType::kFloat16 || out.dtype() == DType::kBFloat16,
                        ErrorCode::kUnsupported, op, "out", "dtype ", dtype_torch_name(out.dtype()),
                        " is not supported (float16, bfloat16)");
  api::check_writable(out, op, "out");
  for (const auto& [t, arg] :
       {std::pair{&query, "query"}, std::pair{&key, "key"}, std::pair{&value, "value"}}) {
    api::check_no_overlap(out, *t, op, "out", arg);
  }
  Tensor lse;
  if (lse_arg) {
    lse = *lse_arg;
    api::check_defined(lse, op, "lse");
    api::check_shape_eq(lse, Shape{B, S, H, 2}, op, "lse");
    FLASHINFER_CHECK(lse.dtype() == DType::kFloat32, op, "lse", "must be torch.float32, got ",
                     dtype_torch_name(lse.dtype()));
    FLASHINFER_CHECK(lse.stride(3) == 1, op, "lse", "the last axis must be contiguous");
    api::check_same_device(lse, query, op, "lse", "query");
    api::check_writable(lse, op, "lse");
    api::check_no_overlap(lse, out, op, "lse", "out");
  } else if (return_lse) {
    lse = Tensor::empty({B, S, H, 2}, DType::kFloat32, query.device());
  }
  const double s1 = scale_bmm1.value_or(1.0), s2 = scale_bmm2.value_or(1.0);
  FLASHINFER_CHECK(std::isfinite(s1), op, "scale_bmm1", "must be finite, got ", s1);
  FLASHINFER_CHECK(std::isfinite(s2), op, "scale_bmm2", "must be finite, got ", s2);
  if (B * S > 0 && H > 0) {
    const Tensor q = rows_view(query), k = rows_view(key), v = rows_view(value);
    const bool out_rows = out.stride(0) == S * out.stride(1);
    Tensor o = out_rows ? out : Tensor::empty({B, S, H, dv}, out.dtype(), out.device());
    const bool lse_rows = !lse.defined() || lse.stride(0) == S * lse.stride(1);
    Tensor st = lse_rows ? lse : Tensor::empty({B, S, H, 2}, DType::kFloat32, lse.device());
    std::vector<int32_t> cu, lens;
    for (int64_t b = 0; b <= B; ++b) cu.push_back(static_cast<int32_t>(b * S));
    for (int64_t b = 0; b < B; ++b) lens.push_back(static_cast<int32_t>(S));
    kernels::RaggedAttentionParams p;
    p.q = q.data_ptr();
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    p.q_dtype = p.k_dtype = p.v_dtype = qd;
    p.q_stride_n = q.stride(1);
    p.q_stride_h = q.stride(2);
    p.k_stride_n = k.stride(1);
    p.k_stride_h = k.stride(2);
    p.v_stride_n = v.stride(1);
    p.v_stride_h = v.stride(2);
    p.cu_q = cu.data();
    p.cu_kv = cu.data();
    p.kv_lens = lens.data();
    p.o = o.data_ptr();
    p.o_dtype = o.dtype();
    p.o_stride_n = o.stride(1);
    p.o_stride_h = o.stride(2);
    if (st.defined()) {
      p.stats = st.data<float>();
      p.stats_stride_n = st.stride(1);
      p.stats_stride_h = st.stride(2);
      // FMHAv2 keeps fp8 softmax probabilities scaled by 256 (the largest power of two under
      // e4m3's 448), and its saved sum with them.
      p.stats_sum_scale = qd == DType::kFloat8E4M3FN ? 256.0f : 1.0f;
    }
    p.batch = static_cast<int32_t>(B);
    p.rows = static_cast<int32_t>(B * S);
    p.num_qo_heads = static_cast<int32_t>(H);
    p.num_kv_heads = static_cast<int32_t>(hkv);
    p.head_dim_qk = static_cast<int32_t>(D);
    p.head_dim_vo = static_cast<int32_t>(dv);
    p.bmm1_scale = static_cast<float>(s1);
    p.bmm2_scale = static_cast<float>(s2);
    p.causal = causal;
    api::run_ragged_attention(p, query.device(), op, "query", std::nullopt);
    if (!out_rows) Tensor(out).copy_(o);  // a view of the caller's buffer
    if (!lse_rows) lse.copy_(st);
  }
  AttentionOutput r;
  r.out = out;
  if (return_lse) r.lse = lse;
  return r;
}

// flashinfer bench: batch_size sequences of s_qo tokens, num_qo_heads heads (key/value too).
BenchCase bench_fmha_v2(const char* op, const BenchShape& s, Device dev, bool deepseek) {
  const DType qd = s.q_dtype == DType::kFloat32 ? DType::kBFloat16 : s.q_dtype;
  const int64_t B = s.batch_size, S = s.s_qo, H = s.num_qo_heads;
  const int64_t D = deepseek ? 192 : s.head_dim_qk, dv = deepseek ? 128 : s.head_dim_vo;
  const Tensor q = api::bench::random_tensor({B, S, H, D}, qd, dev, s.random_seed);
  const Tensor k = api::bench::random_tensor({B, S, H, D}, qd, dev, s.random_seed + 1);
  const Tensor v = api::bench::random_tensor({B, S, H, dv}, qd, dev, s.random_seed + 2);
  const Tensor o =
      Tensor::zeros({B, S, H, dv}, qd == DType::kFloat8E4M3FN ? DType::kBFloat16 : qd, dev);
  const double softmax = qd == DType::kFloat8E4M3FN ? 1.0 : 0.0;
  const double bmm1 = 1.0 / std::sqrt(static_cast<double>(D));
  BenchCase c =
      deepseek
          ? api::bench::invoke_case(op,
                                    {Value(q), Value(k), Value(v), Value(o), Value(H), Value(D),
                                     Value(S), Value(softmax), Value(bmm1)},
                                    {{"return_lse", Value(true)}})
          : api::bench::invoke_case(op,
                                    {Value(q), Value(k), Value(v), Value(o), Value(H), Value(D),
                                     Value(S), Value(softmax), Value(bmm1)},
                                    {{"causal", Value(s.causal)}, {"return_lse", Value(true)}});
  c.flops =
      static_cast<double>(B) * api::bench::attention_flops(S, S, H, D, dv, deepseek || s.causal);
  c.bytes = api::bench::nbytes({B, S, H, 2 * D + 2 * dv}, qd);
  return c;
}

}  // namespace

AttentionOutput fmha_v2_prefill_deepseek(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& out,
    int64_t num_heads, int64_t head_dim, int64_t seq_len, std::optional<double> scale_softmax,
    std::optional<double> scale_bmm1, std::optional<double> scale_bmm2, bool return_lse,
    std::optional<Tensor> lse, std::optional<Tensor> scale_bmm1_d,
    std::optional<Tensor> scale_bmm2_d) {
  return call_op<&fmha_v2_prefill_deepseek>(
      [&] {
        (void)scale_softmax;  // FMHAv2's internal softmax-quantization scale: no effect on values
        return fmha_v2_impl(kDeepseek, query, key, value, out, num_heads, head_dim, seq_len,
                            scale_bmm1, scale_bmm2, true, return_lse, lse, scale_bmm1_d,
                            scale_bmm2_d, true);
      },
      query, key, value, out, num_heads, head_dim, seq_len, scale_softmax, scale_bmm1, scale_bmm2,
      return_lse, lse, scale_bmm1_d, scale_bmm2_d);
}

AttentionOutput fmha_v2_prefill_sm120(const Tensor& query, const Tensor& key, const Tensor& value,
                                      const Tensor& out, int64_t num_heads, int64_t head_dim,
                                      int64_t seq_len, std::optional<double> scale_softmax,
                                      std::optional<double> scale_bmm1,
                                      std::optional<double> scale_bmm2, bool causal,
                                      bool return_lse, std::optional<Tensor> lse,
                                      std::optional<Tensor> scale_bmm1_d,
                                      std::optional<Tensor> scale_bmm2_d) {
  return call_op<&fmha_v2_prefill_sm120>(
      [&] {
        (void)scale_softmax;
        return fmha_v2_impl(kSm120, query, key, value, out, num_heads, head_dim, seq_len,
                            scale_bmm1, scale_bmm2, causal, return_lse, lse, scale_bmm1_d,
                            scale_bmm2_d, false);
      },
      query, key, value, out, num_heads, head_dim, seq_len, scale_softmax, scale_bmm1, scale_bmm2,
      causal, return_lse, lse, scale_bmm1_d, scale_bmm2_d);
}

namespace detail {
void register_fmha_v2_ops(OpRegistry& r) {
  declare<&fmha_v2_prefill_sm120>(
      r,
      {.name = kSm120,
       .module = "flashinfer.prefill",
       .summary = "FMHAv2 dense-batch prefill (causal flag), softmax statistics as (max, sum)"},
      "query", "key", "value", arg("out").mut(), "num_heads", "head_dim", "seq_len",
      arg("scale_softmax").required(), "scale_bmm1", "scale_bmm2", arg("causal", true),
      arg("return_lse", false), arg("lse").mut(), "scale_bmm1_d", "scale_bmm2_d");
  declare<&fmha_v2_prefill_deepseek>(
      r,
      {.name = kDeepseek,
       .module = "flashinfer.prefill",
       .summary = "FMHAv2 causal prefill, DeepSeek head dims (qk 192, vo 128)"},
      "query", "key", "value", arg("out").mut(), "num_heads", "head_dim", "seq_len",
      arg("scale_softmax").required(), "scale_bmm1", "scale_bmm2", arg("return_lse", false),
      arg("lse").mut(), "scale_bmm1_d", "scale_bmm2_d");
  api::register_ragged_attention_backends(kSm120);
  api::register_ragged_attention_backends(kDeepseek);
  register_bench_hook(
      kSm120, [](const BenchShape& s, Device dev) { return bench_fmha_v2(kSm120, s, dev, false); });
  register_bench_hook(kDeepseek, [](const BenchShape& s, Device dev) {
    return bench_fmha_v2(kDeepseek, s, dev, true);
  });
}
}  // namespace detail

}  // namespace flashinfer
