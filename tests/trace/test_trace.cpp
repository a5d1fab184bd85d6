// Trace templates (docs/TRACE.md): definitions equal upstream's own outputs for the same call,
// every definition the library can emit validates (schema, and its reference runs under
// /usr/bin/python3 + torch when present), the FLASHINFER_TRACE_DUMP observer writes one file per
// name, `flashinfer trace` writes without running, and the llama demo's dump validates.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "core/settings.h"
#include "flashinfer/flashinfer.h"
#include "trace/trace_template.h"
#include "util/remove_at_exit.h"
#include "util/run_command.h"
#include "util/test_util.h"

namespace fi = flashinfer;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using fi::DType;
using fi::Tensor;
using fi::Value;

namespace {

const fs::path kSource = FLASHINFER_TEST_SOURCE_DIR;
const fs::path kData = kSource / "tests/trace/data/upstream";

Json read_json(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return Json::parse(ss.str());
}

Tensor ones(std::vector<int64_t> shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt);
  t.fill_(1.0);
  return t;
}

Value T(std::vector<int64_t> shape, DType dt) { return Value(Tensor::empty(shape, dt)); }
// A tensor of that shape over one element (all strides 0): the MoE weights' shapes without their
// gigabytes (a definition reads only shapes and dtypes).
Value B(std::vector<int64_t> shape, DType dt) {
  return Value(Tensor::empty({1}, dt).as_strided(shape, std::vector<int64_t>(shape.size(), 0), 0));
}

// Arguments of `op` bound by keyword, aligned with its declaration (defaults filled in).
std::vector<Value> bind(const std::string& op, std::vector<std::pair<std::string, Value>> kw) {
  const fi::OpDecl* d = fi::OpRegistry::global().find(op);
  EXPECT_NE(d, nullptr) << op;
  return fi::bind_arguments(*d, {}, std::move(kw));
}

std::string definition(const std::string& op, const std::vector<Value>& args) {
  const fi::OpDecl* d = fi::OpRegistry::global().find(op);
  auto text = fi::trace::definition_for_call(*d, args);
  EXPECT_TRUE(text.has_value()) << op << " has no template";
  return text.value_or("{}");
}

// Upstream's example call behind each of its files in tests/trace/data/upstream: the shapes its
// constant axes name, small variable axes, the dtypes the file records.
struct UpstreamCall {
  std::string op;
  std::function<std::vector<Value>()> args;
};

// The calls of the expected files derived for templates_attention_extra.cpp's templates
// (tests/trace/data/upstream/SOURCES.md, "Derived from the template source").
void add_extra_upstream_calls(std::map<std::string, UpstreamCall>& m) {
  const DType bf = DType::kBFloat16, i32 = DType::kInt32, u8 = DType::kUInt8;
  const DType i8 = DType::kInt8, e4m3 = DType::kFloat8E4M3FN;
  const auto call = [&](std::string name, std::string op,
                        std::vector<std::pair<std::string, Value>> kw) {
    m[std::move(name)] = {op, [op, kw] { return bind(op, kw); }};
  };
  call("var_block_sparse_run_h32_kv8_d128", "VariableBlockSparseAttentionWrapper.run",
       {{"self", Value()},
        {"q", T({16, 32, 128}, bf)},
        {"k", T({16, 8, 128}, bf)},
        {"v", T({16, 8, 128}, bf)}});
  call("trtllm_batch_context_h32_kv8_d128_ps16", "trtllm_batch_context_with_kv_cache",
       {{"query", T({12, 32, 128}, bf)},
        {"kv_cache", T({8, 2, 8, 16, 128}, bf)},
        {"workspace_buffer", T({16}, u8)},
        {"block_tables", T({2, 4}, i32)},
        {"seq_lens", T({2}, i32)},
        {"max_q_len", Value(int64_t{6})},
        {"max_kv_len", Value(int64_t{64})},
        {"bmm1_scale", Value(0.088)},
        {"bmm2_scale", Value(1.0)},
        {"batch_size", Value(int64_t{2})},
        {"cum_seq_lens_q", T({3}, i32)},
        {"cum_seq_lens_kv", T({3}, i32)}});
  const auto mla = [&](DType dt, int64_t page_size) {
    return std::vector<std::pair<std::string, Value>>{
        {"query", T({2, 1, 128, 576}, dt)},    {"kv_cache", T({8, page_size, 576}, dt)},
        {"workspace_buffer", T({16}, i8)},     {"qk_nope_head_dim", Value(int64_t{128})},
        {"kv_lora_rank", Value(int64_t{512})}, {"qk_rope_head_dim", Value(int64_t{64})},
        {"block_tables", T({2, 4}, i32)},      {"seq_lens", T({2}, i32)},
        {"max_seq_len", Value(int64_t{200})}};
  };
  call("trtllm_batch_decode_mla_h128_d_qk576_ckv512_kpe64_nope128_ps64",
       "trtllm_batch_decode_with_kv_cache_mla", mla(bf, 64));
  call("xqa_batch_decode_mla_h128_d_qk576_ckv512_kpe64_nope128_ps32",
       "xqa_batch_decode_with_kv_cache_mla", mla(e4m3, 32));
  call("xqa_h32_kv8_d128_ps16", "xqa",
       {{"q", T({2, 32, 128}, bf)},
        {"k_cache", T({8, 8, 16, 128}, bf)},
        {"v_cache", T({8, 8, 16, 128}, bf)},
        {"page_table", T({2, 4}, i32)},
        {"seq_lens", T({2}, i32)},
        {"output", T({2, 32, 128}, bf)},
        {"workspace_buffer", T({16}, u8)},
        {"semaphores", T({8}, i32)},
        {"num_kv_heads", Value(int64_t{8})},
        {"page_size", Value(int64_t{16})},
        {"kv_layout", Value("HND")}});
  call("xqa_mla_h128_ckv576_kpe512_ps32", "xqa_mla",
       {{"q", T({2, 128, 576}, e4m3)},
        {"k_cache", T({8, 32, 576}, e4m3)},
        {"v_cache", T({8, 32, 512}, e4m3)},
        {"page_table", T({2, 4}, i32)},
        {"seq_lens", T({2}, i32)},
        {"output", T({2, 128, 512}, bf)},
        {"workspace_buffer", T({16}, u8)},
        {"semaphores", T({8}, i32)},
        {"page_size", Value(int64_t{32})}});
  call("append_paged_mla_kv_cache_ckv512_kpe64", "append_paged_mla_kv_cache",
       {{"append_ckv", T({5, 512}, bf)},
        {"append_kpe", T({5, 64}, bf)},
        {"batch_indices", T({5}, i32)},
        {"positions", T({5}, i32)},
        {"ckv_cache", T({8, 64, 512}, bf)},
        {"kpe_cache", T({8, 64, 64}, bf)},
        {"kv_indices", T({8}, i32)},
        {"kv_indptr", T({3}, i32)},
        {"kv_last_page_len", T({2}, i32)}});
  // A (k_cache, v_cache) pair where the template names one 4-D cache: page_size has no value.
  call("rope_quantize_fp8_append_paged_kv_cache_h32_kv8_rope64",
       "rope_quantize_fp8_append_paged_kv_cache",
       {{"q_rope", T({5, 32, 64}, bf)},
        {"k_rope", T({5, 8, 64}, bf)},
        {"q_nope", T({5, 32, 64}, bf)},
        {"k_nope", T({5, 8, 64}, bf)},
        {"v", T({5, 8, 128}, bf)},
        {"cos_sin_cache", T({4096, 64}, DType::kFloat32)},
        {"pos_ids", T({5}, i32)},
        {"paged_kv_cache", Value::tuple({T({8, 16, 8, 128}, e4m3), T({8, 16, 8, 128}, e4m3)})},
        {"kv_indices", T({8}, i32)},
        {"kv_indptr", T({3}, i32)},
        {"batch_indices", T({5}, i32)},
        {"positions", T({5}, i32)}});
  call("tgv_gemm_sm100_N256_K128", "tgv_gemm_sm100",
       {{"a", T({5, 128}, bf)}, {"b", T({128, 256}, bf)}, {"bias", T({256}, bf)}});
  call("tinygemm_bf16_n256_k128", "tinygemm_bf16",
       {{"input", T({4, 128}, bf)},
        {"weight", T({256, 128}, bf)},
        {"out", T({4, 256}, bf)},
        {"bias", T({256}, bf)}});
  // (data, scale) pairs where the template names one tensor each: N and K without value.
  call("grouped_gemm_nt_masked", "grouped_gemm_nt_masked",
       {{"lhs", Value::tuple({T({4, 64, 64}, u8), T({4, 64, 8}, e4m3)})},
        {"rhs", Value::tuple({T({4, 128, 64}, u8), T({4, 128, 8}, e4m3)})},
        {"out", T({4, 64, 128}, bf)},
        {"masked_m", T({4}, i32)},
        {"ab_dtype", Value("float4_e2m1fn")},
        {"sf_dtype", Value("float8_e4m3fn")},
        {"c_dtype", Value("bfloat16")},
        {"sf_vec_size", Value(int64_t{16})}});
  call("top_k_varlen_n8192_k1024", "top_k_varlen",
       {{"logits", T({4, 8192}, bf)}, {"seq_lens", T({4}, i32)}, {"top_k", Value(int64_t{1024})}});
  const DType f32 = DType::kFloat32;
  call("mm_M1_16_K7168_N256_k7168_n256", "mm_M1_16_K7168_N256",
       {{"mat_a", T({4, 7168}, bf)}, {"mat_b", T({7168, 256}, bf)}, {"out", T({4, 256}, f32)}});
  call("fp8_blockscale_gemm_sm90_n1536_k7168", "fp8_blockscale_gemm_sm90",
       {{"input", T({4, 7168}, e4m3)},
        {"weight", T({1536, 7168}, e4m3)},
        {"input_scale", T({4, 56}, f32)},
        {"weight_scale", T({12, 56}, f32)}});
  call("batch_deepgemm_fp8_nt_groupwise_n4096_k7168", "batch_deepgemm_fp8_nt_groupwise",
       {{"a", T({4, 64, 7168}, e4m3)},
        {"b", T({4, 4096, 7168}, e4m3)},
        {"a_scale", T({4, 64, 56}, f32)},
        {"b_scale", T({4, 32, 56}, f32)},
        {"masked_m", T({4}, i32)},
        {"expected_m", Value(int64_t{32})}});
  // The template gives value and out the query's head_dim: 192 here.
  call("fmha_v2_prefill_deepseek_h16_d192", "fmha_v2_prefill_deepseek",
       {{"query", T({2, 64, 16, 192}, bf)},
        {"key", T({2, 64, 16, 192}, bf)},
        {"value", T({2, 64, 16, 128}, bf)},
        {"out", T({2, 64, 16, 128}, bf)},
        {"num_heads", Value(int64_t{16})},
        {"head_dim", Value(int64_t{192})},
        {"seq_len", Value(int64_t{64})},
        {"scale_softmax", Value(1.0)}});
  call("trtllm_ragged_attention_deepseek_h128_d192", "trtllm_ragged_attention_deepseek",
       {{"query", T({12, 128, 192}, bf)},
        {"key", T({20, 128, 192}, bf)},
        {"value", T({20, 128, 128}, bf)},
        {"workspace_buffer", T({16}, u8)},
        {"seq_lens", T({2}, i32)},
        {"max_q_len", Value(int64_t{6})},
        {"max_kv_len", Value(int64_t{10})},
        {"bmm1_scale", Value(0.07)},
        {"bmm2_scale", Value(1.0)},
        {"o_sf_scale", Value(1.0)},
        {"batch_size", Value(int64_t{2})},
        {"window_left", Value(int64_t{-1})},
        {"cum_seq_lens_q", T({3}, i32)},
        {"cum_seq_lens_kv", T({3}, i32)},
        {"enable_pdl", Value()},
        {"is_causal", Value(true)},
        {"return_lse", Value(false)}});
  // A packed [tokens, 3, H, D] qkv where the template names [num_tokens, num_heads, head_dim]:
  // its dims are read by position (3 heads of 32), as upstream's template reads them.
  call("trtllm_fmha_v2_prefill_h3_d32", "trtllm_fmha_v2_prefill",
       {{"qkv", T({12, 3, 32, 128}, bf)},
        {"input_layout", Value("PACKED_QKV")},
        {"workspace_buffer", T({16}, u8)},
        {"seq_lens", T({2}, i32)},
        {"max_q_len", Value(int64_t{6})},
        {"max_kv_len", Value(int64_t{6})},
        {"bmm1_scale", Value(0.088)},
        {"bmm2_scale", Value(1.0)},
        {"batch_size", Value(int64_t{2})},
        {"cum_seq_lens_q", T({3}, i32)},
        {"cum_seq_lens_kv", T({3}, i32)}});
  // The NVFP4 paged appends (committed outputs): 2 KV heads of 64 (32 packed bytes, 4 scales of
  // 16), pages of 4, NHD, bf16 rows.
  const auto nvfp4_cache = [&](int64_t last, DType dt) {
    return Value::tuple({T({6, 4, 2, last}, dt), T({6, 4, 2, last}, dt)});
  };
  call("nvfp4_quantize_append_paged_kv_cache_kv2_d64_pd32_sd4_ps4",
       "nvfp4_quantize_append_paged_kv_cache",
       {{"append_key", T({5, 2, 64}, bf)},
        {"append_value", T({5, 2, 64}, bf)},
        {"batch_indices", T({5}, i32)},
        {"positions", T({5}, i32)},
        {"paged_kv_cache", nvfp4_cache(32, u8)},
        {"kv_cache_sf", nvfp4_cache(4, e4m3)},
        {"kv_indices", T({6}, i32)},
        {"kv_indptr", T({3}, i32)},
        {"kv_last_page_len", T({2}, i32)},
        {"k_scale", Value(1.0)},
        {"v_scale", Value(1.0)}});
  call("nvfp4_quantize_append_paged_kv_cache_with_slot_mapping_kv2_d64_pd32_sd4_ps4",
       "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
       {{"append_key", T({5, 2, 64}, bf)},
        {"append_value", T({5, 2, 64}, bf)},
        {"slot_mapping", T({5}, i32)},
        {"paged_kv_cache", nvfp4_cache(32, u8)},
        {"kv_cache_sf", nvfp4_cache(4, e4m3)},
        {"k_scale", T({1}, DType::kFloat32)},
        {"v_scale", T({1}, DType::kFloat32)}});
}

std::map<std::string, UpstreamCall> upstream_calls() {
  const DType bf = DType::kBFloat16, f32 = DType::kFloat32, i32 = DType::kInt32;
  std::map<std::string, UpstreamCall> m;
  auto norm = [&](const char* op, int64_t h) {
    return UpstreamCall{op, [=] {
                          return bind(op, {{"input", T({3, h}, bf)}, {"weight", T({h}, bf)}});
                        }};
  };
  auto add_norm = [&](const char* op, int64_t h) {
    return UpstreamCall{
        op, [=] {
          return bind(
              op, {{"input", T({3, h}, bf)}, {"residual", T({3, h}, bf)}, {"weight", T({h}, bf)}});
        }};
  };
  m["rmsnorm_h4096"] = norm("rmsnorm", 4096);
  m["gemma_rmsnorm_h4608"] = norm("gemma_rmsnorm", 4608);
  m["fused_add_rmsnorm_h5120"] = add_norm("fused_add_rmsnorm", 5120);
  m["gemma_fused_add_rmsnorm_h4608"] = add_norm("gemma_fused_add_rmsnorm", 4608);
  using Kw = std::vector<std::pair<std::string, Value>>;
  // (bind is called parenthesized below: a std::string op would find std::bind by ADL.)
  // The RoPE family, {rope, llama31_rope} x {ragged (indptr, offsets), pos_ids} x {out of place,
  // in place}: 5 tokens, 32 q and 8 k heads of 128, two requests.
  for (const char* base : {"rope", "llama31_rope"}) {
    for (const char* pos : {"", "_pos_ids"}) {
      for (const char* place : {"", "_inplace"}) {
        const std::string stem = std::string(base) + pos + place, op = "apply_" + stem;
        const bool ragged = *pos == '\0';
        m[stem + "_h32_kv8_d128"] = {
            op, [=] {
              Kw kw = {{"q", T({5, 32, 128}, bf)}, {"k", T({5, 8, 128}, bf)}};
              if (ragged) {
                kw.emplace_back("indptr", T({3}, i32));
                kw.emplace_back("offsets", T({2}, i32));
              } else {
                kw.emplace_back("pos_ids", T({5}, i32));
              }
              return (bind)(op, std::move(kw));
            }};
      }
    }
  }
  // Samplers from probabilities: [2, vocab] fp32 probs, per-row int32 top_k and fp32 top_p.
  const std::tuple<const char*, const char*, int64_t> samplers[] = {
      {"top_k_sampling", "top_k_sampling_from_probs", 128256},
      {"top_p_sampling", "top_p_sampling_from_probs", 128256},
      {"top_p_sampling", "top_p_sampling_from_probs", 151936},
      {"top_k_top_p_sampling", "top_k_top_p_sampling_from_probs", 128256},
      {"top_k_top_p_sampling", "top_k_top_p_sampling_from_probs", 151936}};
  for (const auto& smp : samplers) {
    const std::string stem = std::get<0>(smp), op = std::get<1>(smp);
    const int64_t vocab = std::get<2>(smp);
    m[stem + "_v" + std::to_string(vocab)] = {op, [=] {
                                                Kw kw = {{"probs", T({2, vocab}, f32)}};
                                                if (stem.find("top_k") != std::string::npos) {
                                                  kw.emplace_back("top_k", T({2}, i32));
                                                }
                                                if (stem.find("top_p") != std::string::npos) {
                                                  kw.emplace_back("top_p", T({2}, f32));
                                                }
                                                return (bind)(op, std::move(kw));
                                              }};
  }
  // The renormalizers and the logits mask: [2, 32000] fp32 and a scalar threshold.
  const std::tuple<const char*, const char*, const char*, double> renorms[] = {
      {"top_k_renorm_probs", "probs", "top_k", 50},
      {"top_k_mask_logits", "logits", "top_k", 50},
      {"top_p_renorm_probs", "probs", "top_p", 0.9}};
  for (const auto& rn : renorms) {
    const std::string op = std::get<0>(rn), input = std::get<1>(rn), arg = std::get<2>(rn);
    // top_k as an int (upstream's call), top_p as a float.
    const Value threshold =
        arg == "top_k" ? Value(static_cast<int64_t>(std::get<3>(rn))) : Value(std::get<3>(rn));
    m[op + "_v32000"] = {op, [=] {
                           return (bind)(op, Kw{{input, T({2, 32000}, f32)}, {arg, threshold}});
                         }};
  }
  for (const int64_t k : {3456, 4096, 7168}) {
    m["fp4_quantize_k" + std::to_string(k)] = {"fp4_quantize", [=] {
                                                 return bind("fp4_quantize",
                                                             {{"input", T({3, k}, bf)},
                                                              {"global_scale", T({1}, f32)},
                                                              {"sf_vec_size", Value(16)}});
                                               }};
  }
  m["fused_add_rmsnorm_quant_h7168"] = {"fused_add_rmsnorm_quant", [=] {
                                          return bind("fused_add_rmsnorm_quant",
                                                      {{"out", T({3, 7168}, DType::kFloat8E4M3FN)},
                                                       {"input", T({3, 7168}, bf)},
                                                       {"residual", T({3, 7168}, bf)},
                                                       {"weight", T({7168}, bf)},
                                                       {"scale", T({1}, f32)}});
                                        }};
  m["layernorm_quant_h768"] = {"layernorm_quant", [=] {
                                 return bind("layernorm_quant",
                                             {{"out", T({3, 768}, DType::kFloat8E4M3FN)},
                                              {"input", T({3, 768}, bf)},
                                              {"gemma", T({768}, f32)},
                                              {"beta", T({768}, f32)},
                                              {"scale", T({1}, f32)}});
                               }};
  m["concat_mla_k_h128_nope128_rope64_d192"] = {"concat_mla_k", [=] {
                                                  return bind("concat_mla_k",
                                                              {{"k", T({3, 128, 192}, bf)},
                                                               {"k_nope", T({3, 128, 128}, bf)},
                                                               {"k_rope", T({3, 1, 64}, bf)}});
                                                }};
  m["gemm_fp8_nt_groupwise_n1536_k7168"] = {"gemm_fp8_nt_groupwise", [=] {
                                              const DType f8 = DType::kFloat8E4M3FN;
                                              return bind("gemm_fp8_nt_groupwise",
                                                          {{"a", T({3, 7168}, f8)},
                                                           {"b", T({1536, 7168}, f8)},
                                                           {"a_scale", T({3, 56}, f32)},
                                                           {"b_scale", T({56, 12}, f32)}});
                                            }};
  m["layernorm_h768"] = {"layernorm", [=] {
                           return bind("layernorm", {{"input", T({3, 768}, bf)},
                                                     {"gemma", T({768}, f32)},
                                                     {"beta", T({768}, f32)}});
                         }};
  for (const char* op : {"silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"}) {
    m[std::string(op) + "_h16384"] = {op, [=] { return bind(op, {{"input", T({3, 16384}, bf)}}); }};
  }
  m["merge_state_h32_d128"] = {"merge_state", [=] {
                                 return bind("merge_state", {{"v_a", T({5, 32, 128}, bf)},
                                                             {"s_a", T({5, 32}, f32)},
                                                             {"v_b", T({5, 32, 128}, bf)},
                                                             {"s_b", T({5, 32}, f32)}});
                               }};
  m["merge_state_in_place_h32_d128"] = {"merge_state_in_place", [=] {
                                          return bind("merge_state_in_place",
                                                      {{"v", T({5, 32, 128}, bf)},
                                                       {"s", T({5, 32}, f32)},
                                                       {"v_other", T({5, 32, 128}, bf)},
                                                       {"s_other", T({5, 32}, f32)}});
                                        }};
  m["merge_states_h32_d128"] = {
      "merge_states", [=] {
        return bind("merge_states", {{"v", T({5, 3, 32, 128}, bf)}, {"s", T({5, 3, 32}, f32)}});
      }};
  m["chain_speculative_sampling_v32000"] = {
      "chain_speculative_sampling", [=] {
        return bind("chain_speculative_sampling", {{"draft_probs", T({2, 3, 32000}, f32)},
                                                   {"draft_token_ids", T({2, 3}, i32)},
                                                   {"target_probs", T({2, 4, 32000}, f32)}});
      }};
  auto paged = [=](int64_t pages) {
    return Value::tuple({T({pages, 16, 8, 128}, bf), T({pages, 16, 8, 128}, bf)});
  };
  m["gqa_paged_decode_h32_kv8_d128_ps16"] = {
      "BatchDecodeWithPagedKVCacheWrapper.run", [=] {
        return bind("BatchDecodeWithPagedKVCacheWrapper.run",
                    {{"self", Value()}, {"q", T({2, 32, 128}, bf)}, {"paged_kv_cache", paged(6)}});
      }};
  m["gqa_paged_prefill_h32_kv8_d128_ps16"] = {
      "BatchPrefillWithPagedKVCacheWrapper.run", [=] {
        return bind("BatchPrefillWithPagedKVCacheWrapper.run",
                    {{"self", Value()}, {"q", T({7, 32, 128}, bf)}, {"paged_kv_cache", paged(6)}});
      }};
  m["append_paged_kv_cache_kv8_d128"] = {"append_paged_kv_cache", [=] {
                                           return bind("append_paged_kv_cache",
                                                       {{"append_key", T({5, 8, 128}, bf)},
                                                        {"append_value", T({5, 8, 128}, bf)},
                                                        {"batch_indices", T({5}, i32)},
                                                        {"positions", T({5}, i32)},
                                                        {"paged_kv_cache", paged(6)},
                                                        {"kv_indices", T({6}, i32)},
                                                        {"kv_indptr", T({3}, i32)},
                                                        {"kv_last_page_len", T({2}, i32)}});
                                         }};
  m["gqa_ragged_h32_kv8_d128"] = {"BatchPrefillWithRaggedKVCacheWrapper.run", [=] {
                                    return bind("BatchPrefillWithRaggedKVCacheWrapper.run",
                                                {{"self", Value()},
                                                 {"q", T({7, 32, 128}, bf)},
                                                 {"k", T({9, 8, 128}, bf)},
                                                 {"v", T({9, 8, 128}, bf)}});
                                  }};
  m["mla_paged_decode_h16_ckv512_kpe64_ps1"] = {"BatchMLAPagedAttentionWrapper.run", [=] {
                                                  return bind("BatchMLAPagedAttentionWrapper.run",
                                                              {{"self", Value()},
                                                               {"q_nope", T({2, 16, 512}, bf)},
                                                               {"q_pe", T({2, 16, 64}, bf)},
                                                               {"ckv_cache", T({6, 1, 512}, bf)},
                                                               {"kpe_cache", T({6, 1, 64}, bf)}});
                                                }};
  m["gemm_bf16_N4096_K4096"] = {
      "mm_bf16", [=] {
        return bind("mm_bf16", {{"a", T({3, 4096}, bf)}, {"b", T({4096, 4096}, bf)}});
      }};
  // Upstream's other committed outputs of the same templates (other shapes, other ops of a
  // family).
  m["gqa_paged_decode_h32_kv8_d128_ps64"] = {
      "BatchDecodeWithPagedKVCacheWrapper.run", [=] {
        return bind(
            "BatchDecodeWithPagedKVCacheWrapper.run",
            {{"self", Value()},
             {"q", T({2, 32, 128}, bf)},
             {"paged_kv_cache", Value::tuple({T({3, 64, 8, 128}, bf), T({3, 64, 8, 128}, bf)})}});
      }};
  m["mla_paged_decode_h16_ckv512_kpe64_ps64"] = {"BatchMLAPagedAttentionWrapper.run", [=] {
                                                   return bind("BatchMLAPagedAttentionWrapper.run",
                                                               {{"self", Value()},
                                                                {"q_nope", T({2, 16, 512}, bf)},
                                                                {"q_pe", T({2, 16, 64}, bf)},
                                                                {"ckv_cache", T({3, 64, 512}, bf)},
                                                                {"kpe_cache", T({3, 64, 64}, bf)}});
                                                 }};
  m["rmsnorm_h7168"] = norm("rmsnorm", 7168);
  m["rmsnorm_quant_h7168"] = {"rmsnorm_quant", [=] {
                                return bind("rmsnorm_quant",
                                            {{"out", T({3, 7168}, DType::kFloat8E4M3FN)},
                                             {"input", T({3, 7168}, bf)},
                                             {"weight", T({7168}, bf)},
                                             {"scale", T({1}, f32)}});
                              }};
  m["softmax_v32000"] = {
      "softmax", [=] {
        return bind("softmax", {{"logits", T({2, 32000}, f32)}, {"temperature", Value(1.0)}});
      }};
  // The quantized GEMMs and quantizer, with upstream's example shapes (tests/trace/example.py).
  const DType f8 = DType::kFloat8E4M3FN, u8 = DType::kUInt8;
  m["gemm_fp8_N1536_K7168"] = {"mm_fp8", [=] {
                                 return bind("mm_fp8", {{"a", T({3, 7168}, f8)},
                                                        {"b", T({56, 1536, 128}, f8)},
                                                        {"alpha", T({}, f32)}});
                               }};
  m["gemm_mxfp8_N4096_K4096"] = {"mm_mxfp8", [=] {
                                   return bind("mm_mxfp8", {{"a", T({128, 4096}, f8)},
                                                            {"b", T({4096, 4096}, f8)},
                                                            {"a_descale", T({16384}, u8)},
                                                            {"b_descale", T({524288}, u8)}});
                                 }};
  m["bmm_mxfp8_N128_K128"] = {"bmm_mxfp8", [=] {
                                return bind("bmm_mxfp8", {{"A", T({2, 128, 128}, f8)},
                                                          {"B", T({2, 128, 128}, f8)},
                                                          {"A_scale", T({1024}, u8)},
                                                          {"B_scale", T({1024}, u8)},
                                                          {"dtype", Value(bf)}});
                              }};
  m["gemm_fp4_N2048_K7168_block_size16"] = {"mm_fp4", [=] {
                                              return bind("mm_fp4",
                                                          {{"a", T({3, 7168}, u8)},
                                                           {"b", T({7168, 2048}, u8)},
                                                           {"a_descale", T({3, 448}, f8)},
                                                           {"b_descale", T({7168, 128}, f8)},
                                                           {"block_size", Value(16)}});
                                            }};
  m["nvfp4_quantize_k4096"] = {
      "nvfp4_quantize", [=] {
        return bind("nvfp4_quantize", {{"a", T({3, 4096}, bf)}, {"a_global_sf", T({1}, f32)}});
      }};
  m["mxfp4_quantize_k4096"] = {"mxfp4_quantize", [=] {
                                 return bind("mxfp4_quantize", {{"a", T({3, 4096}, bf)}});
                               }};
  m["mxfp8_quantize_k4096"] = {"mxfp8_quantize", [=] {
                                 return bind("mxfp8_quantize", {{"input", T({3, 4096}, bf)}});
                               }};
  m["silu_and_mul_nvfp4_quantize_k16384"] = {"silu_and_mul_nvfp4_quantize", [=] {
                                               return bind("silu_and_mul_nvfp4_quantize",
                                                           {{"input", T({3, 16384}, bf)},
                                                            {"global_scale", T({1}, f32)},
                                                            {"sf_vec_size", Value(16)}});
                                             }};
  m["quantize_nvfp4_smooth_N3072"] = {"nvfp4_quantize_smooth", [=] {
                                        return bind("nvfp4_quantize_smooth",
                                                    {{"x", T({3, 3072}, bf)},
                                                     {"pre_quant_scale", T({3072}, bf)},
                                                     {"global_scale", T({1}, f32)}});
                                      }};
  m["mxfp8_grouped_quantize_k4096"] = {"mxfp8_grouped_quantize", [=] {
                                         return bind(
                                             "mxfp8_grouped_quantize",
                                             {{"a", T({2, 256, 4096}, bf)}, {"mask", T({2}, i32)}});
                                       }};
  m["mla_rope_quantize_fp8_h128_rope64"] = {"mla_rope_quantize_fp8", [=] {
                                              return bind("mla_rope_quantize_fp8",
                                                          {{"q_rope", T({4, 128, 64}, bf)},
                                                           {"k_rope", T({4, 64}, bf)},
                                                           {"q_nope", T({4, 128, 512}, bf)},
                                                           {"k_nope", T({4, 512}, bf)},
                                                           {"cos_sin_cache", T({4096, 64}, f32)},
                                                           {"pos_ids", T({4}, i32)},
                                                           {"is_neox", Value(false)}});
                                            }};
  m["fmha_v2_prefill_sm120_h4_d128"] = {"fmha_v2_prefill_sm120", [=] {
                                          const std::vector<int64_t> s = {1, 128, 4, 128};
                                          return bind("fmha_v2_prefill_sm120",
                                                      {{"query", T(s, f8)},
                                                       {"key", T(s, f8)},
                                                       {"value", T(s, f8)},
                                                       {"out", T(s, bf)},
                                                       {"num_heads", Value(4)},
                                                       {"head_dim", Value(128)},
                                                       {"seq_len", Value(128)},
                                                       {"scale_softmax", Value(1.0)},
                                                       {"scale_bmm1", Value(0.01)},
                                                       {"scale_bmm2", Value(0.02)},
                                                       {"scale_bmm1_d", T({1}, f32)},
                                                       {"scale_bmm2_d", T({1}, f32)},
                                                       {"causal", Value(true)}});
                                        }};
  // (No structured bindings: clang cannot capture them in the lambda.)
  for (const auto& nk : {std::pair<int64_t, int64_t>{256, 7168}, {32, 3072}}) {
    const int64_t n = nk.first, k = nk.second;
    m["gemm_bf16_N" + std::to_string(n) + "_K" + std::to_string(k)] = {
        "mm_bf16", [=] {
          return bind("mm_bf16", {{"a", T({3, k}, bf)}, {"b", T({k, n}, bf)}});
        }};
  }
  // trtllm_fp8_block_scale_moe: one file per routing_method_type (upstream's dispatch), the
  // DeepSeek-V3 shapes of upstream's example (256 experts, 32 local, h7168, i2048); its calls
  // pass a bf16 routing_bias for every routing (the files record its dtype).
  const std::pair<int64_t, const char*> moe_fp8[] = {
      {0, "moe_fp8_block_scale_default_routing_topk8_e32_h7168_i2048"},
      {1, "moe_fp8_block_scale_renormalize_routing_topk8_e32_h7168_i2048"},
      {2, "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"},
      {3, "moe_fp8_block_scale_llama4_routing_topk1_e32_h7168_i2048"},
      {4, "moe_fp8_block_scale_renormalize_naive_routing_topk8_e32_h7168_i2048"},
      {5, "moe_fp8_block_scale_topk_routing_topk8_e32_h7168_i2048"}};
  for (const auto& rf : moe_fp8) {
    const int64_t rt = rf.first;
    m[rf.second] = {"trtllm_fp8_block_scale_moe", [=] {
                      const DType f8 = DType::kFloat8E4M3FN;
                      const bool ds = rt == 2;
                      return bind("trtllm_fp8_block_scale_moe",
                                  {{"routing_logits", T({3, 256}, f32)},
                                   {"routing_bias", T({256}, bf)},
                                   {"hidden_states", T({3, 7168}, f8)},
                                   {"hidden_states_scale", T({56, 3}, f32)},
                                   {"gemm1_weights", B({32, 4096, 7168}, f8)},
                                   {"gemm1_weights_scale", B({32, 32, 56}, f32)},
                                   {"gemm2_weights", B({32, 7168, 2048}, f8)},
                                   {"gemm2_weights_scale", B({32, 56, 16}, f32)},
                                   {"num_experts", Value(int64_t{256})},
                                   {"top_k", Value(int64_t{rt == 3 ? 1 : 8})},
                                   {"n_group", ds ? Value(int64_t{8}) : Value()},
                                   {"topk_group", ds ? Value(int64_t{4}) : Value()},
                                   {"intermediate_size", Value(int64_t{2048})},
                                   {"local_expert_offset", Value(int64_t{0})},
                                   {"local_num_experts", Value(int64_t{32})},
                                   {"routed_scaling_factor", Value(2.5)},
                                   {"routing_method_type", Value(rt)}});
                    }};
  }
  // DeepSeek-V3 with one fused shared expert: 32 routed experts, 33 weight rows (upstream's
  // example).
  m["moe_fp8_block_scale_ds_shared_experts_s1_e33_topk8_ng8_kg4_h7168_i2048"] = {
      "trtllm_fp8_block_scale_moe", [=] {
        const DType f8 = DType::kFloat8E4M3FN;
        return bind("trtllm_fp8_block_scale_moe",
                    {{"routing_logits", T({3, 32}, f32)},
                     {"routing_bias", T({32}, bf)},
                     {"hidden_states", T({3, 7168}, f8)},
                     {"hidden_states_scale", T({56, 3}, f32)},
                     {"gemm1_weights", B({33, 4096, 7168}, f8)},
                     {"gemm1_weights_scale", B({33, 32, 56}, f32)},
                     {"gemm2_weights", B({33, 7168, 2048}, f8)},
                     {"gemm2_weights_scale", B({33, 56, 16}, f32)},
                     {"num_experts", Value(int64_t{32})},
                     {"top_k", Value(int64_t{8})},
                     {"n_group", Value(int64_t{8})},
                     {"topk_group", Value(int64_t{4})},
                     {"intermediate_size", Value(int64_t{2048})},
                     {"local_expert_offset", Value(int64_t{0})},
                     {"local_num_experts", Value(int64_t{32})},
                     {"routed_scaling_factor", Value(2.5)},
                     {"routing_method_type", Value(int64_t{2})},
                     {"num_fused_shared_experts", Value(int64_t{1})}});
      }};
  // trtllm_fp4_block_scale_moe, the same shapes in NVFP4 (upstream's example passes no
  // routing_bias and no gemm biases; DeepSeek-V3's group axes come last in its names).
  const std::pair<int64_t, const char*> moe_fp4[] = {
      {0, "moe_fp4_block_scale_default_routing_topk8_e32_h7168_i2048"},
      {1, "moe_fp4_block_scale_renormalize_routing_topk8_e32_h7168_i2048"},
      {2, "moe_fp4_block_scale_ds_routing_topk8_e32_h7168_i2048_ng8_kg4"},
      {3, "moe_fp4_block_scale_llama4_routing_topk1_e32_h7168_i2048"},
      {4, "moe_fp4_block_scale_renormalize_naive_routing_topk8_e32_h7168_i2048"},
      {5, "moe_fp4_block_scale_topk_routing_topk8_e32_h7168_i2048"}};
  for (const auto& rf : moe_fp4) {
    const int64_t rt = rf.first;
    m[rf.second] = {"trtllm_fp4_block_scale_moe", [=] {
                      const DType f8 = DType::kFloat8E4M3FN, u8 = DType::kUInt8;
                      const bool ds = rt == 2;
                      return bind("trtllm_fp4_block_scale_moe",
                                  {{"routing_logits", T({3, 256}, bf)},
                                   {"routing_bias", Value()},
                                   {"hidden_states", T({3, 3584}, u8)},
                                   {"gemm1_bias", Value()},
                                   {"gemm1_alpha", Value()},
                                   {"gemm1_beta", Value()},
                                   {"gemm1_clamp_limit", Value()},
                                   {"gemm2_bias", Value()},
                                   {"hidden_states_scale", T({3, 448}, f8)},
                                   {"gemm1_weights", B({32, 4096, 3584}, u8)},
                                   {"gemm1_weights_scale", B({32, 4096, 448}, f8)},
                                   {"gemm2_weights", B({32, 7168, 1024}, u8)},
                                   {"gemm2_weights_scale", B({32, 7168, 128}, f8)},
                                   {"output1_scale_scalar", T({32}, f32)},
                                   {"output1_scale_gate_scalar", T({32}, f32)},
                                   {"output2_scale_scalar", T({32}, f32)},
                                   {"num_experts", Value(int64_t{256})},
                                   {"top_k", Value(int64_t{rt == 3 ? 1 : 8})},
                                   {"n_group", ds ? Value(int64_t{8}) : Value()},
                                   {"topk_group", ds ? Value(int64_t{4}) : Value()},
                                   {"intermediate_size", Value(int64_t{2048})},
                                   {"local_expert_offset", Value(int64_t{0})},
                                   {"local_num_experts", Value(int64_t{32})},
                                   {"routed_scaling_factor", Value(2.5)},
                                   {"routing_method_type", Value(rt)}});
                    }};
  }
  // mm_bf16_fp4, one template per backend (the weight layouts of prepare_bf16_fp4_weights);
  // upstream's calls pass alpha to the cudnn and cute-dsl ones, none to the native one.
  m["mm_bf16_fp4_cudnn_N2048_K7168_block_size16"] = {
      "mm_bf16_fp4", [=] {
        return bind("mm_bf16_fp4", {{"a", T({3, 7168}, bf)},
                                    {"b", T({2048, 3584}, DType::kUInt8)},
                                    {"b_descale", T({2048, 448}, DType::kFloat8E4M3FN)},
                                    {"alpha", T({1}, f32)},
                                    {"backend", Value("cudnn")}});
      }};
  m["mm_bf16_fp4_cute_dsl_N2048_K7168_block_size16"] = {
      "mm_bf16_fp4", [=] {
        return bind("mm_bf16_fp4", {{"a", T({3, 7168}, bf)},
                                    {"b", T({448, 4096}, i32)},
                                    {"b_descale", T({448, 2048}, DType::kUInt8)},
                                    {"alpha", T({1}, f32)},
                                    {"backend", Value("cute-dsl")}});
      }};
  m["mm_bf16_fp4_cute_dsl_native_sf1d_N256_K1024_K_packed512_block_size16_SF_dim_016384"] = {
      "mm_bf16_fp4", [=] {
        // 128x4-swizzled scales of [256, 64]: 256 rows x 64 columns, padded to (128, 4) tiles.
        return bind("mm_bf16_fp4", {{"a", T({3, 1024}, bf)},
                                    {"b", T({256, 512}, DType::kUInt8)},
                                    {"b_descale", T({16384}, DType::kFloat8E4M3FN)},
                                    {"backend", Value("cute-dsl-native")}});
      }};
  // SVDQuant at Qwen-Image's shapes (N = K = 3072, rank 32): scale buffers 128x4-swizzled,
  // [3 -> 128 rows, 192 columns] for a, [3072, 192] for b.
  m["gemm_nvfp4_svdquant_N3072_K_packed1536_SF_B589824_rank32"] = {
      "mm_nvfp4_svdquant", [=] {
        const DType u8 = DType::kUInt8;
        return bind("mm_nvfp4_svdquant", {{"a", T({3, 1536}, u8)},
                                          {"b", T({3072, 1536}, u8)},
                                          {"a_sf", T({128 * 192}, u8)},
                                          {"b_sf", T({3072 * 192}, u8)},
                                          {"alpha", T({1}, f32)},
                                          {"d", T({3, 32}, bf)},
                                          {"l1", T({3072, 32}, bf)}});
      }};
  m["linear_nvfp4_svdquant_N3072_K3072_K_packed1536_SF_B589824_rank32"] = {
      "svdquant_linear", [=] {
        const DType u8 = DType::kUInt8;
        return bind("svdquant_linear", {{"x", T({3, 3072}, bf)},
                                        {"weight_fp4", T({3072, 1536}, u8)},
                                        {"weight_sf", T({3072 * 192}, u8)},
                                        {"alpha", T({1}, f32)},
                                        {"pre_quant_scale", T({3072}, bf)},
                                        {"l2t_smoothed", T({3072, 32}, bf)},
                                        {"l1_scaled", T({3072, 32}, bf)},
                                        {"global_scale", T({1}, f32)}});
      }};
  // trtllm_batch_decode_with_kv_cache with block sparsity: 16 heads over 2 KV heads, d128, pages
  // of 16, an HND cache of K and V halves, per-KV-head page tables.
  m["trtllm_batch_decode_block_sparse_h16_kv2_d128_ps16"] = {
      "trtllm_batch_decode_with_kv_cache", [=] {
        return bind("trtllm_batch_decode_with_kv_cache",
                    {{"query", T({2, 16, 128}, bf)},
                     {"kv_cache", T({8, 2, 2, 16, 128}, bf)},
                     {"workspace_buffer", T({16}, DType::kUInt8)},
                     {"block_tables", T({2, 2, 4}, i32)},
                     {"seq_lens", T({2, 2}, i32)},
                     {"max_seq_len", Value(int64_t{64})},
                     {"enable_block_sparse_attention", Value(true)}});
      }};
  // nvfp4_kv_dequantize_paged, one template per kv_layout (NHD by default): 2 heads, k dim 64,
  // v dim 128, page size 4.
  for (const bool hnd : {false, true}) {
    const std::string name =
        std::string("nvfp4_kv_dequantize_paged_") + (hnd ? "hnd_" : "") + "h2_dk64_dv128_ps4";
    m[name] = {"nvfp4_kv_dequantize_paged", [=]() -> std::vector<Value> {
                 const DType u8 = DType::kUInt8, f8 = DType::kFloat8E4M3FN;
                 const auto page = [&](int64_t last, DType dt) -> Value {
                   return hnd ? T({6, 2, 4, last}, dt) : T({6, 4, 2, last}, dt);
                 };
                 std::vector<std::pair<std::string, Value>> kw = {
                     {"paged_kv_cache", Value::tuple({page(32, u8), page(64, u8)})},
                     {"kv_cache_sf", Value::tuple({page(4, f8), page(8, f8)})},
                     {"block_tables", T({2, 3}, i32)},
                     {"seq_lens", T({2}, i32)},
                     {"k_scale", T({1}, f32)},
                     {"v_scale", T({1}, f32)},
                     {"output_k", T({2, 12, 2, 64}, bf)},
                     {"output_v", T({2, 12, 2, 128}, bf)}};
                 if (hnd) kw.emplace_back("kv_layout", Value("HND"));
                 // (Parenthesized: a named vector argument would find std::bind by ADL.)
                 return (bind)("nvfp4_kv_dequantize_paged", std::move(kw));
               }};
  }
  // trtllm_gen_routing: 256 experts, top-8, tile 8 (upstream's example call: fp32 logits, no
  // bias, Renormalize).
  m["trtllm_gen_routing_e256_k8_t8"] = {"trtllm_gen_routing", [=] {
                                          return bind("trtllm_gen_routing",
                                                      {{"routing_logits", T({5, 256}, f32)},
                                                       {"routing_bias", Value()},
                                                       {"routing_method", Value(int64_t{1})},
                                                       {"top_k", Value(int64_t{8})},
                                                       {"tile_tokens_dim", Value(int64_t{8})}});
                                        }};
  // Upstream templates without a committed output (attention.py's single / xqa / cudnn /
  // wrapper-run templates and segment_gemm_run): the expected files are derived from the
  // template source for these calls (tests/trace/data/upstream/SOURCES.md).
  m["single_decode_h32_kv8_d128"] = {
      "single_decode_with_kv_cache", [=] {
        return bind(
            "single_decode_with_kv_cache",
            {{"q", T({32, 128}, bf)}, {"k", T({64, 8, 128}, bf)}, {"v", T({64, 8, 128}, bf)}});
      }};
  m["single_prefill_h32_kv8_d128"] = {
      "single_prefill_with_kv_cache", [=] {
        return bind(
            "single_prefill_with_kv_cache",
            {{"q", T({7, 32, 128}, bf)}, {"k", T({9, 8, 128}, bf)}, {"v", T({9, 8, 128}, bf)}});
      }};
  m["block_sparse_run_h32_kv8_d128"] = {"BlockSparseAttentionWrapper.run", [=] {
                                          return bind("BlockSparseAttentionWrapper.run",
                                                      {{"self", Value()},
                                                       {"q", T({16, 32, 128}, bf)},
                                                       {"k", T({16, 8, 128}, bf)},
                                                       {"v", T({16, 8, 128}, bf)}});
                                        }};
  m["xqa_batch_decode_h32_kv8_d128_ps16"] = {"xqa_batch_decode_with_kv_cache", [=] {
                                               return bind("xqa_batch_decode_with_kv_cache",
                                                           {{"query", T({2, 32, 128}, bf)},
                                                            {"kv_cache", T({8, 2, 8, 16, 128}, bf)},
                                                            {"workspace_buffer", T({16}, u8)},
                                                            {"block_tables", T({2, 4}, i32)},
                                                            {"seq_lens", T({2}, i32)},
                                                            {"max_seq_len", Value(int64_t{64})}});
                                             }};
  m["cudnn_batch_decode_h32_kv8_d128_ps16"] = {
      "cudnn_batch_decode_with_kv_cache", [=] {
        return bind("cudnn_batch_decode_with_kv_cache", {{"q", T({2, 32, 128}, bf)},
                                                         {"k_cache", T({8, 8, 16, 128}, bf)},
                                                         {"v_cache", T({8, 8, 16, 128}, bf)},
                                                         {"scale", Value(0.088)},
                                                         {"workspace_buffer", T({16}, u8)},
                                                         {"max_sequence_kv", Value(int64_t{64})},
                                                         {"block_tables", T({2, 4}, i32)}});
      }};
  m["cudnn_batch_prefill_h32_kv8_d128_ps16"] = {
      "cudnn_batch_prefill_with_kv_cache", [=] {
        return bind("cudnn_batch_prefill_with_kv_cache",
                    {{"q", T({12, 32, 128}, bf)},
                     {"k_cache", T({8, 8, 16, 128}, bf)},
                     {"v_cache", T({8, 8, 16, 128}, bf)},
                     {"scale", Value(0.088)},
                     {"workspace_buffer", T({16}, u8)},
                     {"max_token_per_sequence", Value(int64_t{6})},
                     {"max_sequence_kv", Value(int64_t{64})},
                     {"actual_seq_lens_q", T({2, 1, 1, 1}, i32)},
                     {"actual_seq_lens_kv", T({2, 1, 1, 1}, i32)},
                     {"block_tables", T({2, 4}, i32)},
                     {"causal", Value(true)},
                     {"return_lse", Value(true)}});
      }};
  // The wrapper runs with a (k, v) pair: a template naming the cache as one 4-D tensor finds
  // none (as append_paged_kv_cache_kv8_d128.json shows), so its axes there have no value.
  const auto pair = [=] { return Value::tuple({T({8, 16, 8, 128}, bf), T({8, 16, 8, 128}, bf)}); };
  m["batch_attention_run_h32_d128"] = {
      "BatchAttention.run", [=] {
        return bind("BatchAttention.run",
                    {{"self", Value()}, {"q", T({5, 32, 128}, bf)}, {"kv_cache", pair()}});
      }};
  m["pod_run_h32_kv8_d128"] = {"PODWithPagedKVCacheWrapper.run", [=] {
                                 return bind("PODWithPagedKVCacheWrapper.run",
                                             {{"self", Value()},
                                              {"q_p", T({7, 32, 128}, bf)},
                                              {"k_p", T({7, 8, 128}, bf)},
                                              {"v_p", T({7, 8, 128}, bf)},
                                              {"q_d", T({2, 32, 128}, bf)},
                                              {"paged_kv_cache_d", pair()}});
                               }};
  m["batch_pod_run_h32_d128"] = {"BatchPODWithPagedKVCacheWrapper.run", [=] {
                                   return bind("BatchPODWithPagedKVCacheWrapper.run",
                                               {{"self", Value()},
                                                {"q_p", T({7, 32, 128}, bf)},
                                                {"paged_kv_cache_p", pair()},
                                                {"q_d", T({2, 32, 128}, bf)},
                                                {"paged_kv_cache_d", pair()}});
                                 }};
  m["multi_level_cascade_run_h32_d128"] = {
      "MultiLevelCascadeAttentionWrapper.run", [=] {
        return bind("MultiLevelCascadeAttentionWrapper.run",
                    {{"self", Value()}, {"q", T({2, 32, 128}, bf)}, {"paged_kv_cache", pair()}});
      }};
  m["trtllm_batch_decode_h32_kv8_d128_ps16"] = {
      "trtllm_batch_decode_with_kv_cache", [=] {
        return bind("trtllm_batch_decode_with_kv_cache", {{"query", T({2, 32, 128}, bf)},
                                                          {"kv_cache", T({8, 2, 8, 16, 128}, bf)},
                                                          {"workspace_buffer", T({16}, u8)},
                                                          {"block_tables", T({2, 4}, i32)},
                                                          {"seq_lens", T({2}, i32)},
                                                          {"max_seq_len", Value(int64_t{64})}});
      }};
  m["segment_gemm_run_k128_n256"] = {"SegmentGEMMWrapper.run", [=] {
                                       return bind("SegmentGEMMWrapper.run",
                                                   {{"self", Value()},
                                                    {"x", T({6, 128}, bf)},
                                                    {"weights", T({2, 128, 256}, bf)},
                                                    {"batch_size", Value(int64_t{2})},
                                                    {"weight_column_major", Value(false)}});
                                     }};
  m["bmm_bf16_N256_K128"] = {
      "bmm_bf16", [=] {
        return bind("bmm_bf16", {{"A", T({2, 5, 128}, bf)}, {"B", T({2, 128, 256}, bf)}});
      }};
  m["bmm_fp8_N256_K128"] = {"bmm_fp8", [=] {
                              const DType e4m3 = DType::kFloat8E4M3FN;
                              return bind("bmm_fp8", {{"A", T({2, 5, 128}, e4m3)},
                                                      {"B", T({2, 128, 256}, e4m3)},
                                                      {"A_scale", T({1}, f32)},
                                                      {"B_scale", T({1}, f32)},
                                                      {"dtype", Value(bf)}});
                            }};
  m["rope_quantize_fp8_h32_kv8_rope64"] = {"rope_quantize_fp8", [=] {
                                             return bind("rope_quantize_fp8",
                                                         {{"q_rope", T({5, 32, 64}, bf)},
                                                          {"k_rope", T({5, 8, 64}, bf)},
                                                          {"q_nope", T({5, 32, 64}, bf)},
                                                          {"k_nope", T({5, 8, 64}, bf)},
                                                          {"cos_sin_cache", T({4096, 64}, f32)},
                                                          {"pos_ids", T({5}, i32)}});
                                           }};
  for (const bool inplace : {false, true}) {
    const std::string op =
        std::string("apply_rope_with_cos_sin_cache") + (inplace ? "_inplace" : "");
    m[std::string("rope_cos_sin_cache") + (inplace ? "_inplace" : "") + "_d128"] = {
        op, [=] {
          return bind(op, {{"positions", T({5}, i32)},
                           {"query", T({5, 4096}, bf)},
                           {"key", T({5, 1024}, bf)},
                           {"head_size", Value(int64_t{128})},
                           {"cos_sin_cache", T({4096, 128}, f32)}});
        }};
  }
  // The MoE entry points of src/trace/templates_moe_entry.cpp (upstream's moe.py templates, no
  // committed output; tests/trace/data/upstream/SOURCES.md): DeepSeek-V3 shapes (256 experts, 32
  // local, h7168, i2048, top-8) for the trtllm-gen ops, 3 tokens.
  {
    const DType i64 = DType::kInt64;
    const auto none = [] { return Value(); };
    using KwList = std::vector<std::pair<std::string, Value>>;
    auto routing = [=](KwList kw, bool routed) {
      for (const char* p : {"n_group", "topk_group"}) kw.emplace_back(p, none());
      kw.emplace_back("num_experts", Value(int64_t{256}));
      kw.emplace_back("top_k", Value(int64_t{8}));
      kw.emplace_back("intermediate_size", Value(int64_t{2048}));
      kw.emplace_back("local_expert_offset", Value(int64_t{0}));
      kw.emplace_back("local_num_experts", Value(int64_t{32}));
      if (routed) {
        kw.emplace_back("topk_ids", T({3, 8}, i32));
      } else {
        kw.emplace_back("routing_logits", T({3, 256}, f32));
      }
      return kw;
    };
    m["trtllm_bf16_moe_topk8_e32_h7168_i2048"] = {
        "trtllm_bf16_moe", [=] {
          KwList kw = routing({{"routing_bias", T({256}, bf)},
                               {"hidden_states", T({3, 7168}, bf)},
                               {"gemm1_weights", B({32, 4096, 7168}, bf)},
                               {"gemm2_weights", B({32, 7168, 2048}, bf)},
                               {"routed_scaling_factor", none()},
                               {"routing_method_type", Value(int64_t{1})}},
                              false);
          return (bind)("trtllm_bf16_moe", std::move(kw));
        }};
    m["trtllm_bf16_routed_moe_topk8_e32_h7168"] = {
        "trtllm_bf16_routed_moe", [=] {
          KwList kw = routing({{"hidden_states", T({3, 7168}, bf)},
                               {"gemm1_weights", B({32, 4096, 7168}, bf)},
                               {"gemm2_weights", B({32, 7168, 2048}, bf)},
                               {"routed_scaling_factor", none()}},
                              true);
          return (bind)("trtllm_bf16_routed_moe", std::move(kw));
        }};
    auto per_tensor = [=](bool routed) {
      KwList kw = routing({{"routing_bias", routed ? none() : T({256}, bf)},
                           {"hidden_states", T({3, 7168}, f8)},
                           {"gemm1_weights", B({32, 4096, 7168}, f8)},
                           {"output1_scales_scalar", T({32}, f32)},
                           {"output1_scales_gate_scalar", T({32}, f32)},
                           {"gemm2_weights", B({32, 7168, 2048}, f8)},
                           {"output2_scales_scalar", T({32}, f32)},
                           {"routed_scaling_factor", Value(2.5)},
                           {"use_routing_scales_on_input", Value(false)}},
                          routed);
      return kw;
    };
    m["trtllm_fp8_per_tensor_scale_moe_topk8_e32_h7168_i2048"] = {
        "trtllm_fp8_per_tensor_scale_moe",
        [=] { return (bind)("trtllm_fp8_per_tensor_scale_moe", per_tensor(false)); }};
    m["trtllm_fp8_per_tensor_scale_routed_moe_topk8_e32_h7168"] = {
        "trtllm_fp8_per_tensor_scale_routed_moe",
        [=] { return (bind)("trtllm_fp8_per_tensor_scale_routed_moe", per_tensor(true)); }};
    m["trtllm_fp8_block_scale_routed_moe_topk8_e32_h7168"] = {
        "trtllm_fp8_block_scale_routed_moe", [=] {
          KwList kw = routing({{"routing_bias", none()},
                               {"hidden_states", T({3, 7168}, f8)},
                               {"hidden_states_scale", T({56, 3}, f32)},
                               {"gemm1_weights", B({32, 4096, 7168}, f8)},
                               {"gemm1_weights_scale", B({32, 32, 56}, f32)},
                               {"gemm2_weights", B({32, 7168, 2048}, f8)},
                               {"gemm2_weights_scale", B({32, 56, 16}, f32)},
                               {"routed_scaling_factor", none()}},
                              true);
          return (bind)("trtllm_fp8_block_scale_routed_moe", std::move(kw));
        }};
    m["trtllm_fp4_block_scale_routed_moe_topk8_e32_h7168_act3"] = {
        "trtllm_fp4_block_scale_routed_moe", [=] {
          KwList kw = routing({{"routing_bias", none()},
                               {"hidden_states", T({3, 3584}, u8)},
                               {"hidden_states_scale", T({3, 448}, f8)},
                               {"gemm1_weights", B({32, 4096, 3584}, u8)},
                               {"gemm1_weights_scale", B({32, 4096, 448}, f8)},
                               {"gemm1_bias", none()},
                               {"gemm1_alpha", none()},
                               {"gemm1_beta", none()},
                               {"gemm1_clamp_limit", none()},
                               {"gemm2_weights", B({32, 7168, 1024}, u8)},
                               {"gemm2_weights_scale", B({32, 7168, 128}, f8)},
                               {"gemm2_bias", none()},
                               {"output1_scale_scalar", T({32}, f32)},
                               {"output1_scale_gate_scalar", T({32}, f32)},
                               {"output2_scale_scalar", T({32}, f32)},
                               {"routed_scaling_factor", none()}},
                              true);
          return (bind)("trtllm_fp4_block_scale_routed_moe", std::move(kw));
        }};
    m["trtllm_mxint4_block_scale_moe_topk8_e32_h7168"] = {
        "trtllm_mxint4_block_scale_moe", [=] {
          KwList kw = routing({{"routing_bias", T({256}, bf)},
                               {"hidden_states", T({3, 7168}, bf)},
                               {"gemm1_weights", B({32, 4096, 3584}, u8)},
                               {"gemm1_weights_scale", B({32, 4096, 224}, bf)},
                               {"gemm1_alpha", none()},
                               {"gemm1_beta", none()},
                               {"gemm1_clamp_limit", none()},
                               {"gemm2_weights", B({32, 7168, 1024}, u8)},
                               {"gemm2_weights_scale", B({32, 7168, 64}, bf)},
                               {"routed_scaling_factor", none()}},
                              false);
          return (bind)("trtllm_mxint4_block_scale_moe", std::move(kw));
        }};
    // Mixtral-like: 8 experts, top-2, h4096, i14336.
    m["cutlass_fused_moe_e8_h4096_i14336_topk2"] = {
        "cutlass_fused_moe", [=] {
          return bind("cutlass_fused_moe", {{"input", T({3, 4096}, bf)},
                                            {"token_selected_experts", T({3, 2}, i32)},
                                            {"token_final_scales", T({3, 2}, f32)},
                                            {"fc1_expert_weights", B({8, 28672, 4096}, bf)},
                                            {"fc2_expert_weights", B({8, 4096, 14336}, bf)},
                                            {"output_dtype", Value(bf)},
                                            {"quant_scales", Value::list({})}});
        }};
    // b12x and CuTe-DSL NVFP4: 8 experts, top-2, h2048, i768 (linear 3-D scales, as the
    // templates shape them).
    const KwList b12x = {{"x", T({3, 2048}, bf)},
                         {"w1_weight", B({8, 1536, 1024}, u8)},
                         {"w1_weight_sf", B({8, 1536, 128}, f8)},
                         {"w2_weight", B({8, 2048, 384}, u8)},
                         {"w2_weight_sf", B({8, 2048, 48}, f8)},
                         {"token_selected_experts", T({3, 2}, i32)},
                         {"token_final_scales", T({3, 2}, f32)},
                         {"w1_alpha", T({8}, f32)},
                         {"w2_alpha", T({8}, f32)},
                         {"fc2_input_scale", T({1}, f32)}};
    m["b12x_fused_moe_topk2_e8_h2048"] = {"b12x_fused_moe", [=] {
                                            KwList kw = b12x;
                                            kw.emplace_back("num_experts", Value(int64_t{8}));
                                            kw.emplace_back("top_k", Value(int64_t{2}));
                                            return (bind)("b12x_fused_moe", std::move(kw));
                                          }};
    m["b12x_moe_wrapper_e8_h2048"] = {"B12xMoEWrapper.run", [=] {
                                        KwList kw = b12x;
                                        kw.emplace_back("self", Value());
                                        return (bind)("B12xMoEWrapper.run", std::move(kw));
                                      }};
    const KwList cute = {{"x", T({3, 1024}, u8)},
                         {"x_sf", T({3, 128}, f8)},
                         {"token_selected_experts", T({3, 2}, i32)},
                         {"token_final_scales", T({3, 2}, f32)},
                         {"w1_weight", B({8, 1536, 1024}, u8)},
                         {"w1_weight_sf", B({8, 1536, 128}, f8)},
                         {"w1_alpha", T({8}, f32)},
                         {"fc2_input_scale", T({1}, f32)},
                         {"w2_weight", B({8, 2048, 384}, u8)},
                         {"w2_weight_sf", B({8, 2048, 48}, f8)},
                         {"w2_alpha", T({8}, f32)}};
    m["cute_dsl_fused_moe_nvfp4_topk2_e8_h2048"] = {
        "cute_dsl_fused_moe_nvfp4", [=] {
          KwList kw = cute;
          kw.emplace_back("num_experts", Value(int64_t{8}));
          kw.emplace_back("top_k", Value(int64_t{2}));
          kw.emplace_back("num_local_experts", Value(int64_t{8}));
          return (bind)("cute_dsl_fused_moe_nvfp4", std::move(kw));
        }};
    m["cute_dsl_moe_wrapper_e8_h2048"] = {"CuteDslMoEWrapper.run", [=] {
                                            KwList kw = cute;
                                            kw.emplace_back("self", Value());
                                            kw.emplace_back("tactic", Value());
                                            return (bind)("CuteDslMoEWrapper.run", std::move(kw));
                                          }};
    // SM90 weight preparation: 2 experts of 128 rows, K = 2048 (MXFP4: uint8 E8M0 scales per
    // 32); the scale fold with bf16 scales of group 128 (upstream's W4A8 case).
    for (const bool il : {true, false}) {
      m[std::string("sm90_mixed_gemm_humming_weight_preprocess") + (il ? "" : "_logical")] = {
          "preprocess_moe_weights_for_sm90_mixed_gemm_humming", [=] {
            return bind("preprocess_moe_weights_for_sm90_mixed_gemm_humming",
                        {{"weight", T({2, 128, 1024}, u8)},
                         {"raw_scale", T({2, 128, 64}, u8)},
                         {"interleave", Value(il)}});
          }};
    }
    m["sm90_mixed_gemm_scale_interleave"] = {
        "interleave_moe_scales_for_sm90_mixed_gemm", [=] {
          return bind("interleave_moe_scales_for_sm90_mixed_gemm",
                      {{"scales", T({2, 128, 16}, bf)}, {"group_size", Value(int64_t{128})}});
        }};
    m["sm90_mixed_gemm_weight_interleave"] = {
        "interleave_moe_weights_for_sm90_mixed_gemm", [=] {
          return bind("interleave_moe_weights_for_sm90_mixed_gemm",
                      {{"weight", T({2, 128, 1024}, u8)}, {"quant_type", Value("fp4_fp8")}});
        }};
    m["fused_topk_deepseek_e256_k8"] = {"fused_topk_deepseek", [=] {
                                          return bind("fused_topk_deepseek",
                                                      {{"scores", T({5, 256}, f32)},
                                                       {"bias", T({256}, f32)},
                                                       {"n_group", Value(int64_t{8})},
                                                       {"topk_group", Value(int64_t{4})},
                                                       {"topk", Value(int64_t{8})},
                                                       {"routed_scaling_factor", Value(2.5)},
                                                       {"topk_values", T({5, 8}, f32)},
                                                       {"topk_indices", T({5, 8}, i32)}});
                                        }};
    m["hash_topk_e256_k8_v1024"] = {"hash_topk", [=] {
                                      return bind("hash_topk", {{"router_logits", T({5, 256}, f32)},
                                                                {"input_ids", T({5}, i64)},
                                                                {"tid2eid", T({1024, 8}, i32)}});
                                    }};
  }
  add_extra_upstream_calls(m);
  return m;
}

// The fields the issue names, compared one by one: name, op_type, tags, axes (type, value),
// constraints, and inputs/outputs (names in order, shape, dtype, optional).
void expect_same_definition(const Json& up, const Json& ours, const std::string& file) {
  SCOPED_TRACE(file);
  EXPECT_EQ(ours.at("name"), up.at("name"));
  EXPECT_EQ(ours.at("op_type"), up.at("op_type"));
  EXPECT_EQ(ours.at("tags"), up.at("tags"));
  EXPECT_EQ(ours.value("constraints", Json::array()), up.value("constraints", Json::array()));
  std::vector<std::string> up_axes, our_axes;
  for (auto& [k, v] : up.at("axes").items()) up_axes.push_back(k);
  for (auto& [k, v] : ours.at("axes").items()) our_axes.push_back(k);
  EXPECT_EQ(our_axes, up_axes);
  for (auto& [k, v] : up.at("axes").items()) {
    if (!ours.at("axes").contains(k)) continue;
    const Json& o = ours.at("axes").at(k);
    EXPECT_EQ(o.at("type"), v.at("type")) << "axis " << k;
    EXPECT_EQ(o.value("value", Json()), v.value("value", Json())) << "axis " << k;
  }
  for (const char* side : {"inputs", "outputs"}) {
    std::vector<std::string> uk, ok;
    for (auto& [k, v] : up.at(side).items()) uk.push_back(k);
    for (auto& [k, v] : ours.at(side).items()) ok.push_back(k);
    EXPECT_EQ(ok, uk) << side;
    for (auto& [k, v] : up.at(side).items()) {
      if (!ours.at(side).contains(k)) continue;
      const Json& o = ours.at(side).at(k);
      EXPECT_EQ(o.at("shape"), v.at("shape")) << side << " " << k;
      EXPECT_EQ(o.at("dtype"), v.at("dtype")) << side << " " << k;
      EXPECT_EQ(o.value("optional", false), v.value("optional", false)) << side << " " << k;
    }
  }
}

const std::set<std::string> kDtypes = {
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",     "int8",
    "uint8",   "int16",   "int32",   "int64",    "bool",          "float4_e2m1fn_x2"};

// Schema checks of one definition. `unresolved` collects constant axes left without a value (a
// (k, v) tuple parameter read as one tensor, as upstream's append_paged_kv_cache does).
void validate(const Json& d, const std::string& op, std::vector<std::string>* unresolved) {
  SCOPED_TRACE(d.value("name", std::string("?")));
  for (const char* f : {"name", "description", "op_type", "tags", "axes", "inputs", "outputs",
                        "reference", "init"}) {
    ASSERT_TRUE(d.contains(f)) << "missing " << f;
  }
  const fi::OpDecl* decl = fi::OpRegistry::global().find(op);
  ASSERT_NE(decl, nullptr);
  const auto& tags = d.at("tags");
  ASSERT_FALSE(tags.empty());
  EXPECT_EQ(tags[0], "fi_api:" + decl->module + "." + decl->name);
  bool status = false;
  for (const auto& t : tags) status = status || t.get<std::string>().rfind("status:", 0) == 0;
  // Upstream's SVDQuant templates carry no status tag (their committed files), nor its SM90
  // weight-preparation templates (moe.py).
  EXPECT_TRUE(status || op == "nvfp4_quantize_smooth" || op == "mm_nvfp4_svdquant" ||
              op == "svdquant_linear" ||
              op == "preprocess_moe_weights_for_sm90_mixed_gemm_humming" ||
              op == "interleave_moe_scales_for_sm90_mixed_gemm" ||
              op == "interleave_moe_weights_for_sm90_mixed_gemm")
      << "no status: tag";
  std::string expected_name;
  // The op's template that wrote `d`: for ops with selected templates (the MoE routing
  // variants), the one whose prefix starts the name (the longest such).
  const fi::trace::detail::Template* tmpl = nullptr;
  const std::string dname = d.at("name").get<std::string>();
  for (const auto* t : fi::trace::detail::templates_of(op)) {
    const bool starts = dname == t->name_prefix || dname.rfind(t->name_prefix + "_", 0) == 0;
    if (starts && (!tmpl || t->name_prefix.size() > tmpl->name_prefix.size())) tmpl = t;
  }
  ASSERT_NE(tmpl, nullptr) << "no template of " << op << " writes " << dname;
  expected_name = tmpl->name_prefix;
  for (const auto& a : tmpl->axes) {
    const Json& j = d.at("axes").at(a.name);
    const std::string type = j.at("type");
    EXPECT_TRUE(type == "var" || type == "const") << a.name;
    if (type == "var") {
      EXPECT_FALSE(j.contains("value")) << a.name;
    }
    if (type == "const") {
      if (j.contains("value")) {
        EXPECT_TRUE(j.at("value").is_number_integer()) << a.name;
        const std::string pfx = a.abbrev ? *a.abbrev : a.name;
        if (!pfx.empty()) expected_name += "_" + pfx + std::to_string(j.at("value").get<int64_t>());
      } else if (unresolved) {
        unresolved->push_back(op + ":" + a.name);
      }
    }
  }
  EXPECT_EQ(d.at("name"), expected_name);
  for (const char* side : {"inputs", "outputs"}) {
    ASSERT_FALSE(d.at(side).empty()) << side;
    for (auto& [k, v] : d.at(side).items()) {
      const std::string dt = v.at("dtype");
      const bool optional = v.value("optional", false);
      // "dtype": a torch.dtype argument (upstream's mm_bf16_fp4 out_dtype).
      // "string" / "str": a str scalar (upstream's b12x quant_mode, the SM90 weight
      // interleave's quant_type).
      EXPECT_TRUE(kDtypes.count(dt) || (dt == "unknown" && optional) ||
                  ((dt == "string" || dt == "str") && v.at("shape").is_null()) ||
                  (dt == "unknown" && std::string(side) == "inputs") ||
                  (dt == "dtype" && v.at("shape").is_null()))
          << side << " " << k << " dtype " << dt;
      if (v.at("shape").is_null()) continue;
      for (const auto& axis : v.at("shape")) {
        // An axis, or one of the template's derived names (upstream's "K_div_32", ...).
        EXPECT_TRUE(d.at("axes").contains(axis.get<std::string>()) ||
                    fi::trace::detail::find_derived(*tmpl, axis.get<std::string>()) != nullptr)
            << side << " " << k << " names unknown axis " << axis;
      }
    }
  }
  // The annotations name the op's declared parameters.
  for (const auto& io : tmpl->inputs) {
    const std::string p = io.source();
    const bool declared = decl->param_index(p) >= 0;
    const bool axis = [&] {
      for (const auto& a : tmpl->axes) {
        if (a.name == p) return true;
      }
      return false;
    }();
    // plan() inputs are not parameters of the method (and are optional in the definition).
    EXPECT_TRUE(declared || (io.scalar && axis) || (io.from_plan && io.optional))
        << op << ": input " << io.key << " reads '" << p << "', not a parameter of the op";
  }
  for (const auto& io : tmpl->outputs) {
    for (const std::string& p : {io.dtype_from, io.out_param}) {
      if (!p.empty()) {
        EXPECT_GE(decl->param_index(p), 0) << op << ": output " << io.key << " " << p;
      }
    }
  }
}

// The Python side of the checks, one process for all of them: `import torch` is most of its cost
// (tests/trace/check_definitions.py; manifest {"run": [files], "io": [{definition, out, set}]}).
// Returns whether torch was importable (without it the references are only parsed).
bool run_python(const Json& manifest, const fs::path& dir) {
  const fs::path m = dir / "manifest.json";
  std::ofstream(m) << manifest.dump();
  const auto r = fi::testing::run_command("/usr/bin/python3 " +
                                          (kSource / "tests/trace/check_definitions.py").string() +
                                          " '" + m.string() + "'");
  EXPECT_EQ(r.status, 0) << r.out;
  return r.out.rfind("torch: yes", 0) == 0;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("fi_trace_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  fi::testing::remove_at_exit(d);  // also when an ASSERT ends the test before its remove_all
  return d;
}

// The unquantized MoE entry points' small shapes: 8 experts (4 local), top-2, h32, i16.
const std::map<std::string, int64_t> kMoeBf16Axes = {
    {"num_experts", 8},        {"top_k", 2},          {"num_local_experts", 4}, {"hidden_size", 32},
    {"intermediate_size", 16}, {"gemm1_out_size", 32}};

const std::map<std::string, int64_t> kB12xAxes = {{"num_experts", 8},
                                                  {"top_k", 2},
                                                  {"num_local_experts", 8},
                                                  {"hidden_size", 64},
                                                  {"gemm1_out_size", 64}};
const std::map<std::string, int64_t> kCuteDslAxes = {{"num_experts", 8},
                                                     {"top_k", 2},
                                                     {"num_local_experts", 4},
                                                     {"hidden_size", 64},
                                                     {"gemm1_out_size", 128}};

// Small constant axis values for building every definition from axes alone.
std::map<std::string, int64_t> small_axes(const std::string& op,
                                          const fi::trace::detail::Template& tmpl) {
  static const std::map<std::string, int64_t> v = {{"hidden_size", 32},
                                                   {"vocab_size", 64},
                                                   {"num_heads", 4},
                                                   {"head_dim", 16},
                                                   {"num_qo_heads", 4},
                                                   {"num_kv_heads", 2},
                                                   {"page_size", 4},
                                                   {"num_q_heads", 4},
                                                   {"num_k_heads", 2},
                                                   {"num_experts", 8},
                                                   {"topk", 2},
                                                   {"k", 3},
                                                   {"N", 8},
                                                   {"K", 16},
                                                   {"head_dim_ckv", 32},
                                                   {"head_dim_kpe", 8},
                                                   {"nope_dim", 16},
                                                   {"rope_dim", 8},
                                                   {"total_dim", 24},
                                                   {"num_heads_broadcast", 1},
                                                   {"num_heads_qo", 4},
                                                   {"num_heads_kv", 2}};
  // Ops whose references need K (or N) to hold whole scale blocks.
  static const std::map<std::string, std::map<std::string, int64_t>> per_op = {
      {"mm_fp8", {{"K", 256}}},
      // 16 experts, top-4, tiles of 4: a few experts hold more than one tile.
      {"trtllm_gen_routing", {{"num_experts", 16}, {"top_k", 4}, {"tile_tokens_dim", 4}}},
      {"mm_mxfp8", {{"K", 64}}},
      {"bmm_mxfp8", {{"K", 64}}},
      {"mm_fp4", {{"K", 32}, {"N", 32}, {"block_size", 16}}},
      {"mxfp4_quantize", {{"K", 64}}},
      {"silu_and_mul_nvfp4_quantize", {{"K_doubled", 64}}},
      {"nvfp4_quantize_smooth", {{"N", 32}}},
      {"mxfp8_grouped_quantize", {{"K", 96}}},
      {"mxfp8_quantize", {{"K", 64}}},
      {"mla_rope_quantize_fp8", {{"num_q_heads", 2}, {"rope_dim", 8}, {"rotary_dim", 8}}},
      {"fmha_v2_prefill_sm120", {{"num_heads", 2}, {"head_dim", 16}}},
      // Whole 128-wide scale blocks; 2 groups of 4 experts, 4 of them local.
      // The cute-dsl layout's tiles are 64 wide in N; the native scale buffer of [64, 2] padded
      // to 128 rows x 4 columns.
      {"mm_bf16_fp4",
       {{"N", 64}, {"K", 32}, {"block_size", 16}, {"K_packed", 16}, {"SF_dim_0", 512}}},
      // K = 32 (two 16-wide scale blocks); the weight's scale buffer padded to 128 x 4.
      {"mm_nvfp4_svdquant", {{"N", 32}, {"K_packed", 16}, {"SF_B", 512}, {"rank", 32}}},
      {"svdquant_linear", {{"N", 32}, {"K", 32}, {"K_packed", 16}, {"SF_B", 512}, {"rank", 32}}},
      {"trtllm_batch_decode_with_kv_cache",
       {{"num_heads", 4},
        {"num_kv_heads", 2},
        {"head_dim", 16},
        {"page_size", 4},
        {"kv_cache_dim", 2}}},
      {"xqa_batch_decode_with_kv_cache", {{"kv_cache_dim", 2}}},
      {"rope_quantize_fp8", {{"num_q_heads", 2}, {"rope_dim", 8}, {"rotary_dim", 8}}},
      // Heads of 16, the first 8 channels rotated.
      {"apply_rope_with_cos_sin_cache",
       {{"num_q_heads_x_head_size", 64},
        {"num_k_heads_x_head_size", 32},
        {"head_size", 16},
        {"rotary_dim", 8}}},
      {"apply_rope_with_cos_sin_cache_inplace",
       {{"num_q_heads_x_head_size", 64},
        {"num_k_heads_x_head_size", 32},
        {"head_size", 16},
        {"rotary_dim", 8}}},
      {"nvfp4_kv_dequantize_paged",
       {{"num_heads", 2}, {"k_head_dim", 32}, {"v_head_dim", 16}, {"page_size", 4}}},
      {"trtllm_fp8_block_scale_moe",
       {{"num_experts", 8},
        {"top_k", 2},
        {"n_group", 2},
        {"topk_group", 1},
        {"num_local_experts", 4},
        {"hidden_size", 256},
        {"intermediate_size", 128},
        {"gemm1_out_size", 256},
        {"num_hidden_blocks", 2},
        {"num_intermediate_blocks", 1},
        {"num_gemm1_out_blocks", 2},
        {"num_fused_shared_experts", 1},
        {"num_weight_rows", 9}}},
      // Packed halves and scale blocks of 16 consistent with h64, i32.
      {"trtllm_fp4_block_scale_moe",
       {{"num_experts", 8},
        {"top_k", 2},
        {"n_group", 2},
        {"topk_group", 1},
        {"num_local_experts", 4},
        {"hidden_size", 64},
        {"intermediate_size", 32},
        {"gemm1_out_size", 64},
        {"num_packed_hidden", 32},
        {"num_fp4_hidden_blocks", 4},
        {"num_packed_intermediate", 16},
        {"num_fp4_intermediate_blocks", 2}}},
      // The MoE entry points (templates_moe_entry.cpp): 4 local experts, top-2; the routed
      // forms' num_experts and intermediate_size are variable (8 and the init's default).
      {"trtllm_bf16_moe", kMoeBf16Axes},
      {"trtllm_bf16_routed_moe", kMoeBf16Axes},
      {"trtllm_fp8_per_tensor_scale_moe", kMoeBf16Axes},
      {"trtllm_fp8_per_tensor_scale_routed_moe", kMoeBf16Axes},
      {"trtllm_fp8_block_scale_routed_moe",
       {{"top_k", 2},
        {"num_local_experts", 4},
        {"hidden_size", 256},
        {"gemm1_out_size", 256},
        {"num_hidden_blocks", 2},
        {"num_intermediate_blocks", 1},
        {"num_gemm1_out_blocks", 2}}},
      {"trtllm_fp4_block_scale_routed_moe",
       {{"top_k", 2},
        {"num_local_experts", 4},
        {"hidden_size", 64},
        {"gemm1_out_size", 64},
        {"num_packed_hidden", 32},
        {"num_packed_intermediate", 16},
        {"num_fp4_intermediate_blocks", 2},
        {"activation_type", 3}}},
      {"trtllm_mxint4_block_scale_moe",
       {{"num_experts", 8},
        {"top_k", 2},
        {"num_local_experts", 4},
        {"hidden_size", 64},
        {"gemm1_out_size", 64},
        {"num_packed_hidden", 32},
        {"num_mxint4_hidden_blocks", 2},
        {"num_packed_intermediate", 16},
        {"num_mxint4_intermediate_blocks", 1}}},
      {"cutlass_fused_moe", kMoeBf16Axes},
      {"hash_topk", {{"num_routed_experts", 8}, {"topk", 3}, {"vocab", 16}}},
      // b12x: h64, i32 (no expert parallelism: 8 local of 8); CuTe-DSL: h64, i64 (GEMM1's rows
      // interleaved in groups of 64), 4 local of 8.
      {"b12x_fused_moe", kB12xAxes},
      {"B12xMoEWrapper.run", kB12xAxes},
      {"cute_dsl_fused_moe_nvfp4", kCuteDslAxes},
      {"CuteDslMoEWrapper.run", kCuteDslAxes}};
  // The ops of templates_attention_extra.cpp: HND K/V halves; a latent of 16 + rope 8.
  static const std::map<std::string, std::map<std::string, int64_t>> per_op_extra = {
      {"trtllm_batch_context_with_kv_cache", {{"kv_cache_dim", 2}}},
      {"trtllm_batch_decode_with_kv_cache_mla",
       {{"head_dim_qk", 24},
        {"kv_lora_rank", 16},
        {"qk_rope_head_dim", 8},
        {"qk_nope_head_dim", 16}}},
      {"xqa_batch_decode_with_kv_cache_mla",
       {{"head_dim_qk", 24},
        {"kv_lora_rank", 16},
        {"qk_rope_head_dim", 8},
        {"qk_nope_head_dim", 16}}},
      {"rope_quantize_fp8_append_paged_kv_cache",
       {{"num_q_heads", 2}, {"rope_dim", 8}, {"rotary_dim", 8}}},
      {"tinygemm_bf16", {{"N", 16}}},
      {"top_k_varlen", {{"max_seq_len", 16}, {"top_k", 4}}},
      // The router GEMM's fixed shape; whole 128-wide scale blocks for the FP8 GEMMs.
      {"mm_M1_16_K7168_N256", {{"K", 7168}, {"N", 256}}},
      {"fp8_blockscale_gemm_sm90", {{"K", 256}, {"N", 256}}},
      {"batch_deepgemm_fp8_nt_groupwise", {{"K", 256}, {"N", 256}}},
      // NVFP4 appends: head_dim 16 is one scale block of 8 packed bytes.
      {"nvfp4_quantize_append_paged_kv_cache", {{"packed_head_dim", 8}, {"scale_dim", 1}}},
      {"nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
       {{"packed_head_dim", 8}, {"scale_dim", 1}, {"one", 1}}}};
  std::map<std::string, int64_t> out;
  for (const auto& a : tmpl.axes) {
    if (!a.is_const) continue;
    auto e = per_op_extra.find(op);
    auto o = per_op.find(op);
    if (e != per_op_extra.end() && e->second.count(a.name)) {
      out[a.name] = e->second.at(a.name);
    } else if (o != per_op.end() && o->second.count(a.name)) {
      out[a.name] = o->second.at(a.name);
    } else {
      out[a.name] = v.at(a.name);
    }
  }
  return out;
}

std::map<std::string, int64_t> small_axes(const std::string& op) {
  return small_axes(op, *fi::trace::detail::find_template(op));
}

}  // namespace

TEST(Trace, UpstreamComparison) {
  const auto calls = upstream_calls();
  int compared = 0;
  for (const auto& entry : fs::directory_iterator(kData)) {
    if (entry.path().extension() != ".json") continue;
    const std::string stem = entry.path().stem().string();
    auto it = calls.find(stem);
    ASSERT_NE(it, calls.end()) << "no call for upstream file " << stem;
    const Json up = read_json(entry.path());
    const Json ours = Json::parse(definition(it->second.op, it->second.args()));
    expect_same_definition(up, ours, stem);
    std::vector<std::string> unresolved;
    validate(ours, it->second.op, &unresolved);
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(calls.size()));
  EXPECT_GE(compared, 99);
}

TEST(Trace, EveryTemplateNamesADeclaredOp) {
  const auto ops = fi::trace::traced_ops();
  EXPECT_GE(ops.size(), 60u);
  std::set<std::string> prefixes;
  for (const auto& op : ops) {
    EXPECT_NE(fi::OpRegistry::global().find(op), nullptr) << op;
    const auto variants = fi::trace::detail::templates_of(op);
    ASSERT_FALSE(variants.empty()) << op;
    std::set<std::pair<int64_t, std::string>> selected;
    std::set<std::string> strings;
    for (const auto* t : variants) {
      // Two templates with one name prefix would write one file for both.
      EXPECT_TRUE(prefixes.insert(t->name_prefix).second) << t->name_prefix;
      // Several templates of one op are told apart by one selector, one value each.
      if (variants.size() > 1) {
        EXPECT_EQ(t->select_param, variants.front()->select_param) << op;
        EXPECT_FALSE(t->select_param.empty()) << op;
        for (int64_t v : t->select_values) {
          EXPECT_TRUE(selected.insert({v, t->positive_param}).second) << op << " " << v;
        }
        for (const std::string& v : t->select_strings) {
          EXPECT_TRUE(strings.insert(v).second) << op << " " << v;
        }
      }
    }
  }
}

// Writes every traced op's definition (every template of it) from small axes into `dir`,
// validating each; `files` receives the paths.
void write_every_definition(const fs::path& dir, std::vector<fs::path>* files) {
  for (const auto& op : fi::trace::traced_ops()) {
    // Every template of the op: selected ones by their selector value.
    for (const auto* tmpl : fi::trace::detail::templates_of(op)) {
      auto axes = small_axes(op, *tmpl);
      // A string selector is no axis value: that template directly.
      const bool by_string = !tmpl->select_strings.empty();
      if (!tmpl->select_param.empty() && !by_string) {
        axes[tmpl->select_param] = tmpl->select_values.front();
      }
      const std::string text =
          by_string
              ? fi::trace::detail::definition_for_template_axes(op, *tmpl, axes, DType::kBFloat16)
              : fi::trace::definition_for_axes(op, axes, DType::kBFloat16);
      const Json d = Json::parse(text);
      EXPECT_EQ(d.at("name").get<std::string>().rfind(tmpl->name_prefix, 0), 0u) << op;
      std::vector<std::string> unresolved;
      validate(d, op, &unresolved);
      EXPECT_TRUE(unresolved.empty()) << op << ": " << unresolved.front();
      const fs::path p = dir / (d.at("name").get<std::string>() + ".json");
      EXPECT_FALSE(fs::exists(p)) << "two ops write " << p;
      std::ofstream(p) << text;
      files->push_back(p);
    }
  }
}

// The schema checks here; their references run in DefinitionsRunAndMatchTheLibrary (one Python
// process for all the checks that need one).
TEST(Trace, EveryDefinitionValidates) {
  const fs::path dir = fresh_dir("all");
  std::vector<fs::path> files;
  write_every_definition(dir, &files);
  EXPECT_GE(files.size(), 80u);
  // FI_TRACE_TEST_KEEP=DIR keeps a copy of every definition (to diff a change of the templates).
  if (const char* keep = std::getenv("FI_TRACE_TEST_KEEP")) {
    fs::copy(dir, keep, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  fs::remove_all(dir);
}

TEST(Trace, DefinitionForAxesErrors) {
  EXPECT_THROW(fi::trace::definition_for_axes("rmsnorm", {}), fi::Error);  // hidden_size missing
  EXPECT_THROW(fi::trace::definition_for_axes("rmsnorm", {{"hidden_size", 8}, {"bogus", 1}}),
               fi::Error);
  EXPECT_THROW(fi::trace::definition_for_axes("bmm_fp8", {{"hidden_size", 8}}), fi::Error);
  try {
    fi::trace::definition_for_axes("rmsnorm", {});
  } catch (const fi::Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_size"), std::string::npos) << e.what();
  }
  // The same shape written from axes and seen in a call: one name, one definition.
  const auto from_axes =
      Json::parse(fi::trace::definition_for_axes("rmsnorm", {{"hidden_size", 4096}}));
  const auto from_call = Json::parse(
      definition("rmsnorm", bind("rmsnorm", {{"input", T({1, 4096}, DType::kBFloat16)},
                                             {"weight", T({4096}, DType::kBFloat16)}})));
  EXPECT_EQ(from_axes, from_call);
}

// An op with several templates: the call's argument picks one (upstream's dispatch), a value no
// template takes writes nothing (routing_method_type 6, Unspecified), and `flashinfer trace`
// takes the selector as an axis.
// Page size 1 without the page axis (SGLang's K/V pools, upstream's _unpack_paged_kv_cache forms):
// a pair of 3-D [tokens, H, D] caches or one [tokens, 2, H, D] tensor names the definition as
// the 4-D page-size-1 cache would.
TEST(Trace, PageSizeOneCachesWithoutThePageAxisNameTheirAxes) {
  const DType bf = DType::kBFloat16;
  const fi::OpDecl* d = fi::OpRegistry::global().find("BatchDecodeWithPagedKVCacheWrapper.run");
  ASSERT_NE(d, nullptr);
  const auto name = [&](Value cache) {
    return fi::trace::definition_name_for_call(
               *d, bind("BatchDecodeWithPagedKVCacheWrapper.run",
                        {{"self", Value()}, {"q", T({2, 32, 128}, bf)}, {"paged_kv_cache", cache}}))
        .value_or("none");
  };
  const std::string want = "gqa_paged_decode_h32_kv8_d128_ps1";
  EXPECT_EQ(name(Value::tuple({T({40, 1, 8, 128}, bf), T({40, 1, 8, 128}, bf)})), want);
  EXPECT_EQ(name(Value::tuple({T({40, 8, 128}, bf), T({40, 8, 128}, bf)})), want);
  EXPECT_EQ(name(T({40, 2, 8, 128}, bf)), want);
  EXPECT_EQ(name(T({40, 2, 1, 8, 128}, bf)), want);
}

TEST(Trace, SelectedTemplates) {
  const auto call = [](int64_t rt, int64_t shared = 0) {
    return bind("trtllm_fp8_block_scale_moe",
                {{"routing_logits", T({2, 8}, DType::kFloat32)},
                 {"routing_bias", T({8}, DType::kBFloat16)},
                 {"hidden_states", T({2, 256}, DType::kFloat8E4M3FN)},
                 {"hidden_states_scale", T({2, 2}, DType::kFloat32)},
                 {"gemm1_weights", T({4, 256, 256}, DType::kFloat8E4M3FN)},
                 {"gemm1_weights_scale", T({4, 2, 2}, DType::kFloat32)},
                 {"gemm2_weights", T({4, 256, 128}, DType::kFloat8E4M3FN)},
                 {"gemm2_weights_scale", T({4, 2, 1}, DType::kFloat32)},
                 {"num_experts", Value(int64_t{8})},
                 {"top_k", Value(int64_t{2})},
                 {"n_group", Value(int64_t{2})},
                 {"topk_group", Value(int64_t{1})},
                 {"intermediate_size", Value(int64_t{128})},
                 {"local_expert_offset", Value(int64_t{0})},
                 {"local_num_experts", Value(int64_t{4})},
                 {"routed_scaling_factor", Value(1.0)},
                 {"routing_method_type", Value(rt)},
                 {"num_fused_shared_experts", shared ? Value(shared) : Value()}});
  };
  const fi::OpDecl* d = fi::OpRegistry::global().find("trtllm_fp8_block_scale_moe");
  ASSERT_NE(d, nullptr);
  const std::map<int64_t, std::string> want = {
      {0, "moe_fp8_block_scale_default_routing_topk2_e4_h256_i128"},
      {1, "moe_fp8_block_scale_renormalize_routing_topk2_e4_h256_i128"},
      {2, "moe_fp8_block_scale_ds_routing_topk2_ng2_kg1_e4_h256_i128"},
      {3, "moe_fp8_block_scale_llama4_routing_topk2_e4_h256_i128"},
      {4, "moe_fp8_block_scale_renormalize_naive_routing_topk2_e4_h256_i128"},
      {5, "moe_fp8_block_scale_topk_routing_topk2_e4_h256_i128"}};
  for (const auto& [rt, name] : want) {
    EXPECT_EQ(fi::trace::definition_name_for_call(*d, call(rt)).value_or("none"), name);
    const Json j = Json::parse(definition("trtllm_fp8_block_scale_moe", call(rt)));
    EXPECT_EQ(j.at("name"), name);
    // Only DeepSeek-V3 routing has the group axes and inputs; its bias is required.
    EXPECT_EQ(j.at("axes").contains("n_group"), rt == 2) << rt;
    EXPECT_EQ(j.at("inputs").at("routing_bias").value("optional", false), rt != 2) << rt;
  }
  EXPECT_FALSE(fi::trace::definition_name_for_call(*d, call(6)).has_value());
  // Fused shared experts pick DeepSeek-V3's sibling (its rows counted as num_weight_rows); other
  // routings ignore them.
  EXPECT_EQ(fi::trace::definition_name_for_call(*d, call(2, 1)).value_or("none"),
            "moe_fp8_block_scale_ds_shared_experts_s1_e4_topk2_ng2_kg1_h256_i128");
  EXPECT_EQ(fi::trace::definition_name_for_call(*d, call(0, 1)).value_or("none"), want.at(0));
  EXPECT_FALSE(fi::trace::definition_for_call(*d, call(6)).has_value());
  // From axes: the selector as one more axis; without it, the first template (Default).
  std::map<std::string, int64_t> axes = {{"num_experts", 8},
                                         {"top_k", 2},
                                         {"n_group", 2},
                                         {"topk_group", 1},
                                         {"num_local_experts", 4},
                                         {"hidden_size", 256},
                                         {"intermediate_size", 128},
                                         {"gemm1_out_size", 256},
                                         {"num_hidden_blocks", 2},
                                         {"num_intermediate_blocks", 1},
                                         {"num_gemm1_out_blocks", 2},
                                         {"routing_method_type", 2}};
  EXPECT_EQ(
      Json::parse(fi::trace::definition_for_axes("trtllm_fp8_block_scale_moe", axes)).at("name"),
      want.at(2));
  axes["routing_method_type"] = 6;
  EXPECT_THROW(fi::trace::definition_for_axes("trtllm_fp8_block_scale_moe", axes), fi::Error);
  axes.erase("routing_method_type");
  axes.erase("n_group");
  axes.erase("topk_group");
  EXPECT_EQ(
      Json::parse(fi::trace::definition_for_axes("trtllm_fp8_block_scale_moe", axes)).at("name"),
      want.at(0));
}

// Upstream's NVFP4 MoE definitions model its example's calls only: no fused shared experts and
// SwiGLU (their names have no axis for either). Other calls get no definition rather than one that
// misnames them; absent optional scales are "unknown", as upstream writes an input it gives no
// dtype.
TEST(Trace, Fp4MoeOnlyForTheCallsItsDefinitionModels) {
  const fi::OpDecl* d = fi::OpRegistry::global().find("trtllm_fp4_block_scale_moe");
  ASSERT_NE(d, nullptr);
  const auto base =
      upstream_calls().at("moe_fp4_block_scale_default_routing_topk8_e32_h7168_i2048");
  const auto with = [&](const std::string& param, Value v) {
    std::vector<Value> a = base.args();
    a.at(static_cast<std::size_t>(d->param_index(param))) = std::move(v);
    return a;
  };
  const std::string name = "moe_fp4_block_scale_default_routing_topk8_e32_h7168_i2048";
  EXPECT_EQ(fi::trace::definition_name_for_call(*d, base.args()).value_or("none"), name);
  EXPECT_EQ(fi::trace::definition_name_for_call(*d, with("activation_type", Value(int64_t{3})))
                .value_or("none"),
            name);
  EXPECT_FALSE(
      fi::trace::definition_for_call(*d, with("num_fused_shared_experts", Value(int64_t{1})))
          .has_value());
  EXPECT_FALSE(
      fi::trace::definition_for_call(*d, with("activation_type", Value(int64_t{0}))).has_value());
  const Json j =
      Json::parse(definition("trtllm_fp4_block_scale_moe", with("hidden_states_scale", Value())));
  EXPECT_EQ(j.at("inputs").at("hidden_states_scale").at("dtype"), "unknown");
  EXPECT_EQ(j.at("inputs").at("output1_scale_scalar").at("dtype"), "float32");  // the call's
  EXPECT_EQ(
      Json::parse(definition("trtllm_fp4_block_scale_moe", with("output1_scale_scalar", Value())))
          .at("inputs")
          .at("output1_scale_scalar")
          .at("dtype"),
      "unknown");
  // nvfp4_kv_dequantize_paged writes its outputs in place, and upstream's name no parameter.
  const auto kv = upstream_calls().at("nvfp4_kv_dequantize_paged_h2_dk64_dv128_ps4");
  const Json k = Json::parse(definition(kv.op, kv.args()));
  EXPECT_FALSE(k.at("outputs").at("output_k").contains("param"));
  EXPECT_FALSE(k.at("outputs").at("output_v").contains("param"));
}

// Templates chosen by a string argument: mm_bf16_fp4's backend (a backend no template takes
// writes nothing), nvfp4_kv_dequantize_paged's kv_layout (None counts as its default, "NHD").
TEST(Trace, StringSelectedTemplates) {
  const fi::OpDecl* mm = fi::OpRegistry::global().find("mm_bf16_fp4");
  ASSERT_NE(mm, nullptr);
  const auto mm_call = [](const char* backend) {
    return bind("mm_bf16_fp4", {{"a", T({2, 64}, DType::kBFloat16)},
                                {"b", T({64, 32}, DType::kUInt8)},
                                {"b_descale", T({64, 4}, DType::kFloat8E4M3FN)},
                                {"backend", Value(backend)}});
  };
  EXPECT_EQ(fi::trace::definition_name_for_call(*mm, mm_call("cudnn")).value_or("none"),
            "mm_bf16_fp4_cudnn_N64_K64_block_size16");
  EXPECT_EQ(fi::trace::definition_name_for_call(*mm, mm_call("cute-dsl")).value_or("none"),
            "mm_bf16_fp4_cute_dsl_N4_K64_block_size16");
  EXPECT_FALSE(fi::trace::definition_name_for_call(*mm, mm_call("cutlass")).has_value());
  const fi::OpDecl* kv = fi::OpRegistry::global().find("nvfp4_kv_dequantize_paged");
  ASSERT_NE(kv, nullptr);
  const auto kv_call = [](Value layout) {
    const DType u8 = DType::kUInt8, f8 = DType::kFloat8E4M3FN;
    return bind("nvfp4_kv_dequantize_paged",
                {{"paged_kv_cache", Value::tuple({T({3, 4, 2, 8}, u8), T({3, 4, 2, 8}, u8)})},
                 {"kv_cache_sf", Value::tuple({T({3, 4, 2, 1}, f8), T({3, 4, 2, 1}, f8)})},
                 {"block_tables", T({1, 3}, DType::kInt32)},
                 {"seq_lens", T({1}, DType::kInt32)},
                 {"k_scale", T({1}, DType::kFloat32)},
                 {"v_scale", T({1}, DType::kFloat32)},
                 {"output_k", T({1, 12, 2, 16}, DType::kBFloat16)},
                 {"output_v", T({1, 12, 2, 16}, DType::kBFloat16)},
                 {"kv_layout", std::move(layout)}});
  };
  EXPECT_EQ(fi::trace::definition_name_for_call(*kv, kv_call(Value())).value_or("none"),
            "nvfp4_kv_dequantize_paged_h2_dk16_dv16_ps4");
  // HND reads the same tensors as [pages, heads, page_size, dim].
  EXPECT_EQ(fi::trace::definition_name_for_call(*kv, kv_call(Value("HND"))).value_or("none"),
            "nvfp4_kv_dequantize_paged_hnd_h4_dk16_dv16_ps2");
  EXPECT_FALSE(fi::trace::definition_name_for_call(*kv, kv_call(Value("NDH"))).has_value());
  // The NVFP4 append: NHD (the default) only; upstream's HND naming is not established.
  const fi::OpDecl* app =
      fi::OpRegistry::global().find("nvfp4_quantize_append_paged_kv_cache_with_slot_mapping");
  const auto app_call = [&](Value layout) {
    const auto half = [](int64_t last, DType dt) {
      return Value::tuple({T({3, 4, 2, last}, dt), T({3, 4, 2, last}, dt)});
    };
    return bind("nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
                {{"append_key", T({2, 2, 32}, DType::kBFloat16)},
                 {"append_value", T({2, 2, 32}, DType::kBFloat16)},
                 {"slot_mapping", T({2}, DType::kInt32)},
                 {"paged_kv_cache", half(16, DType::kUInt8)},
                 {"kv_cache_sf", half(2, DType::kFloat8E4M3FN)},
                 {"k_scale", Value(1.0)},
                 {"v_scale", Value(1.0)},
                 {"kv_layout", std::move(layout)}});
  };
  EXPECT_EQ(fi::trace::definition_name_for_call(*app, app_call(Value("NHD"))).value_or("none"),
            "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping_kv2_d32_pd16_sd2_ps4");
  EXPECT_FALSE(fi::trace::definition_name_for_call(*app, app_call(Value("HND"))).has_value());
  // From axes alone: the first template (a string is no axis value).
  EXPECT_EQ(Json::parse(fi::trace::definition_for_axes("mm_bf16_fp4",
                                                       {{"N", 64}, {"K", 32}, {"block_size", 16}}))
                .at("name"),
            "mm_bf16_fp4_cudnn_N64_K32_block_size16");
}

TEST(Trace, SettingsParse) {
  auto parse = [](std::map<std::string, std::string> env) {
    return fi::detail::parse_settings([env](const char* n) -> const char* {
      auto it = env.find(n);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  };
  EXPECT_FALSE(parse({}).trace_dump);
  EXPECT_EQ(parse({}).trace_dump_dir, "fi_trace_out");
  EXPECT_FALSE(parse({{"FLASHINFER_TRACE_DUMP", "0"}}).trace_dump);
  EXPECT_FALSE(parse({{"FLASHINFER_TRACE_DUMP", ""}}).trace_dump);
  EXPECT_TRUE(parse({{"FLASHINFER_TRACE_DUMP", "1"}}).trace_dump);
  EXPECT_TRUE(parse({{"FLASHINFER_TRACE_DUMP", "true"}}).trace_dump);  // upstream: not "0"/""
  EXPECT_EQ(parse({{"FLASHINFER_TRACE_DUMP_DIR", "/x/y"}}).trace_dump_dir, "/x/y");
}

TEST(Trace, DumpObserverWritesOncePerName) {
  const fs::path dir = fresh_dir("dump");
  fi::trace::start_dump(dir.string());
  ASSERT_TRUE(fi::trace::dump_active());
  Tensor w = ones({64}, DType::kFloat32);
  for (int64_t rows : {1, 3, 5}) fi::rmsnorm(ones({rows, 64}, DType::kFloat32), w);
  Tensor w2 = ones({32}, DType::kFloat32);
  fi::rmsnorm(ones({2, 32}, DType::kFloat32), w2);
  fi::silu_and_mul(ones({2, 16}, DType::kFloat32));
  // An op without a template: not even packed for the dumper, no file.
  fi::packbits(ones({16}, DType::kBool));
  EXPECT_EQ(fi::trace::stop_dump(), 3);
  EXPECT_FALSE(fi::trace::dump_active());
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"rmsnorm_h64.json", "rmsnorm_h32.json",
                                          "silu_and_mul_h16.json"}));
  const Json d = read_json(dir / "rmsnorm_h64.json");
  EXPECT_EQ(d.at("inputs").at("hidden_states").at("dtype"), "float32");
  validate(d, "rmsnorm", nullptr);
  // After stop, calls write nothing more.
  fi::rmsnorm(ones({2, 16}, DType::kFloat32), ones({16}, DType::kFloat32));
  EXPECT_FALSE(fs::exists(dir / "rmsnorm_h16.json"));
  fs::remove_all(dir);
}

// A real trtllm_gen_routing call through the gate (its routing_method a RoutingMethodType, a
// bf16 bias, tile_tokens_dim left at its default 8): the definition upstream's call would give.
TEST(Trace, GenRoutingCallDumps) {
  const fs::path dir = fresh_dir("routing");
  fi::trace::start_dump(dir.string());
  fi::trtllm_gen_routing(ones({3, 16}, DType::kFloat32), ones({16}, DType::kBFloat16),
                         fi::RoutingMethodType::DeepSeekV3, 4, 0, 4, 2);
  EXPECT_EQ(fi::trace::stop_dump(), 1);
  const fs::path p = dir / "trtllm_gen_routing_e16_k4_t8.json";
  ASSERT_TRUE(fs::exists(p));
  const Json d = read_json(p);
  validate(d, "trtllm_gen_routing", nullptr);
  EXPECT_EQ(d.at("inputs").at("routing_logits").at("dtype"), "float32");
  EXPECT_EQ(d.at("inputs").at("routing_bias").at("dtype"), "bfloat16");
  EXPECT_EQ(d.at("inputs").at("routing_method").at("dtype"), "int32");
  EXPECT_EQ(d.at("outputs").at("topk_weights").at("dtype"), "bfloat16");
  fs::remove_all(dir);
}

// Real calls of MoE entry points under the dump: hash_topk, and Humming with interleave=False
// (the bool selects upstream's logical template).
TEST(Trace, MoeEntryCallsDump) {
  const fs::path dir = fresh_dir("moe_entry");
  fi::trace::start_dump(dir.string());
  fi::hash_topk(ones({3, 8}, DType::kFloat32), ones({3}, DType::kInt64),
                ones({4, 2}, DType::kInt32));
  fi::preprocess_moe_weights_for_sm90_mixed_gemm_humming(
      ones({1, 64, 64}, DType::kUInt8), ones({1, 64, 4}, DType::kUInt8), 11, false);
  EXPECT_EQ(fi::trace::stop_dump(), 2);
  const fs::path h = dir / "hash_topk_e8_k2_v4.json";
  const fs::path p = dir / "sm90_mixed_gemm_humming_weight_preprocess_logical.json";
  ASSERT_TRUE(fs::exists(h));
  ASSERT_TRUE(fs::exists(p));
  const Json dh = read_json(h), dp = read_json(p);
  validate(dh, "hash_topk", nullptr);
  validate(dp, "preprocess_moe_weights_for_sm90_mixed_gemm_humming", nullptr);
  EXPECT_EQ(dh.at("inputs").at("input_ids").at("dtype"), "int64");
  EXPECT_EQ(dh.at("outputs").at("topk_ids").at("dtype"), "int32");
  EXPECT_EQ(dp.at("outputs").at("processed_scale").at("dtype"), "uint8");
  EXPECT_EQ(dp.at("outputs").at("processed_scale").at("shape"),
            Json::parse(R"(["num_experts", "rows", "scale_groups"])"));
  fs::remove_all(dir);
}

TEST(Trace, CommandWritesWithoutRunning) {
  const fs::path dir = fresh_dir("cli");
  auto r = fi::testing::run_flashinfer(
      "trace --routine BatchDecodeWithPagedKVCacheWrapper.run "
      "--num_qo_heads 32 --num_kv_heads 8 --head_dim_qk 128 "
      "--page_size 16 -o " +
      dir.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const fs::path p = dir / "gqa_paged_decode_h32_kv8_d128_ps16.json";
  ASSERT_TRUE(fs::exists(p)) << r.out;
  expect_same_definition(read_json(kData / "gqa_paged_decode_h32_kv8_d128_ps16.json"), read_json(p),
                         "cli");
  r = fi::testing::run_flashinfer("trace --routine rmsnorm --axis hidden_size=4096 --stdout");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(Json::parse(r.out).at("name"), "rmsnorm_h4096");
  r = fi::testing::run_flashinfer("trace --routine rmsnorm --stdout");  // hidden_size missing
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("hidden_size"), std::string::npos) << r.out;
  r = fi::testing::run_flashinfer("trace --routine rmsnorm --axis hidden_size=x --stdout");
  EXPECT_EQ(r.status, 2) << r.out;
  r = fi::testing::run_flashinfer("trace --list");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(
      r.out.find(std::to_string(fi::trace::traced_ops().size()) + " ops with a trace template"),
      std::string::npos)
      << r.out;
  fs::remove_all(dir);
}

// FLASHINFER_TRACE_DUMP=1 on the llama demo into `dir`: one definition per distinct op and shape
// class, each validating; `files` receives them (none when the demo is not built).
void llama_demo_dump(const fs::path& dir, std::vector<fs::path>* files) {
  const fs::path bin = fs::path(FLASHINFER_TEST_BIN_DIR) / "llama_decode";
  if (!fs::exists(bin)) return;
  const std::size_t before = files->size();
  const auto r =
      fi::testing::run_command("FLASHINFER_TRACE_DUMP=1 FLASHINFER_TRACE_DUMP_DIR='" +
                               dir.string() + "' " + bin.string() + " --steps 3 --layers 2");
  ASSERT_EQ(r.status, 0) << r.out;
  std::map<std::string, std::string> by_prefix;  // name prefix -> file
  for (const auto& e : fs::directory_iterator(dir)) {
    const Json d = read_json(e.path());
    files->push_back(e.path());
    const std::string api = d.at("tags")[0].get<std::string>();
    const fi::OpDecl* decl = nullptr;
    for (const auto* op : fi::OpRegistry::global().ops()) {
      if ("fi_api:" + op->module + "." + op->name == api) decl = op;
    }
    ASSERT_NE(decl, nullptr) << api;
    std::vector<std::string> unresolved;
    validate(d, decl->name, &unresolved);
    // The demo's paged cache is one combined tensor: every constant axis resolves.
    EXPECT_TRUE(unresolved.empty()) << unresolved.front();
    const auto* t = fi::trace::detail::find_template(decl->name);
    by_prefix[t->name_prefix] = e.path().filename().string();
    EXPECT_EQ(e.path().filename().string(), d.at("name").get<std::string>() + ".json");
  }
  // Every traced op the demo calls (llama_decode.cpp, examples/llama/llama_model.cpp).
  EXPECT_TRUE(fs::exists(dir / "append_paged_kv_cache_kv2_d64_ps16.json"));
  EXPECT_TRUE(fs::exists(dir / "gqa_paged_decode_h8_kv2_d64_ps16.json"));
  for (const char* p : {"rmsnorm", "fused_add_rmsnorm", "rope_pos_ids", "append_paged_kv_cache",
                        "gemm_bf16", "silu_and_mul", "gqa_paged_prefill", "gqa_paged_decode",
                        "top_k_top_p_sampling_from_logits"}) {
    EXPECT_TRUE(by_prefix.count(p)) << "no definition for " << p;
  }
  EXPECT_EQ(files->size() - before, 13u);
}

// Every check that needs Python, in one process (tests/trace/check_definitions.py; torch loads
// once): every traced op's definition and the llama demo's dump run `run(**init())` with
// matching output shapes (parsed only without torch); and the references are the definitions'
// math: on the inputs their init builds, the library's CPU op gives the same outputs (bf16: a
// couple of ulps, the reference and the kernel both fp32).
TEST(Trace, DefinitionsRunAndMatchTheLibrary) {
  using Outs = std::vector<Tensor>;
  using In = std::map<std::string, Tensor>;
  struct Case {
    std::string op;
    std::function<Outs(In&)> call;
    // Wider than the dtype's default: the reference's fp8 outputs stay unrounded fp32 on a torch
    // without float8 (relative error up to 2^-4, subnormal steps of 2^-9).
    std::optional<fi::testing::Tolerance> tol = std::nullopt;
    // The template's name prefix, for an op with string-selected templates (else the first).
    std::string variant{};
    // Several cases of one op: a name for each, the axes changed from small_axes, and the
    // scalar inputs the reference gets instead of init's (a JSON object).
    std::string label{};
    std::map<std::string, int64_t> axes{};
    Json set = Json::object();
  };
  // e4m3 inputs arrive as float32 from a torch without float8 (values exact in e4m3).
  const auto e4m3 = [](const Tensor& t) { return t.to(DType::kFloat8E4M3FN); };
  auto tup4 = [](std::tuple<Tensor, Tensor, Tensor, Tensor> p) {
    return Outs{std::get<0>(p), std::get<1>(p), std::get<2>(p), std::get<3>(p)};
  };
  auto rope2 = [](std::pair<Tensor, Tensor> p) { return Outs{p.first, p.second}; };
  auto tup2 = [](std::tuple<Tensor, Tensor> p) { return Outs{std::get<0>(p), std::get<1>(p)}; };
  // trtllm_gen_routing with one method: 6 tokens of 16 experts, tiles of 4; all eight outputs
  // compared (the reference reproduces our order within an expert and the -1 fill).
  auto routing = [](std::string label, int64_t method, int64_t top_k, Json set = Json::object()) {
    set["routing_method"] = method;
    const int64_t n_group = set.value("n_group", int64_t{0});
    const int64_t topk_group = set.value("topk_group", int64_t{0});
    const int64_t offset = set.value("local_expert_offset", int64_t{0});
    const int64_t local = set.value("local_num_experts", int64_t{16});
    const double scale = set.value("routed_scaling_factor", 1.0);
    const bool norm = set.value("norm_topk_prob", true);
    Case c{"trtllm_gen_routing", [=](In& i) {
             const auto r = fi::trtllm_gen_routing(
                 i["routing_logits"], i["routing_bias"], static_cast<fi::RoutingMethodType>(method),
                 top_k, 0, n_group, topk_group, offset, local, scale, 4, norm);
             return std::apply([](const auto&... t) { return Outs{t...}; }, r);
           }};
    c.label = "trtllm_gen_routing_" + label;
    c.axes = {{"top_k", top_k}};
    c.set = set;
    return c;
  };
  std::vector<Case> cases = {
      {"rmsnorm", [](In& i) { return Outs{fi::rmsnorm(i["hidden_states"], i["weight"])}; }},
      {"gemma_rmsnorm",
       [](In& i) { return Outs{fi::gemma_rmsnorm(i["hidden_states"], i["weight"])}; }},
      {"fused_add_rmsnorm",
       [](In& i) {
         fi::fused_add_rmsnorm(i["hidden_states"], i["residual"], i["weight"]);
         return Outs{i["hidden_states"], i["residual"]};
       }},
      {"gemma_fused_add_rmsnorm",
       [](In& i) {
         fi::gemma_fused_add_rmsnorm(i["hidden_states"], i["residual"], i["weight"]);
         return Outs{i["hidden_states"], i["residual"]};
       }},
      {"layernorm",
       [](In& i) { return Outs{fi::layernorm(i["hidden_states"], i["weight"], i["bias"])}; }},
      {"silu_and_mul", [](In& i) { return Outs{fi::silu_and_mul(i["input"])}; }},
      {"gelu_and_mul", [](In& i) { return Outs{fi::gelu_and_mul(i["input"])}; }},
      {"gelu_tanh_and_mul", [](In& i) { return Outs{fi::gelu_tanh_and_mul(i["input"])}; }},
      {"merge_state",
       [&](In& i) { return tup2(fi::merge_state(i["v_a"], i["s_a"], i["v_b"], i["s_b"])); }},
      {"merge_states", [&](In& i) { return tup2(fi::merge_states(i["v"], i["s"])); }},
      {"merge_state_in_place",
       [](In& i) {
         fi::merge_state_in_place(i["v"], i["s"], i["v_other"], i["s_other"]);
         return Outs{i["v"], i["s"]};
       }},
      {"apply_rope_pos_ids",
       [&](In& i) { return rope2(fi::apply_rope_pos_ids(i["q"], i["k"], i["pos_ids"])); }},
      {"apply_llama31_rope_pos_ids",
       [&](In& i) { return rope2(fi::apply_llama31_rope_pos_ids(i["q"], i["k"], i["pos_ids"])); }},
      {"apply_rope",
       [&](In& i) { return rope2(fi::apply_rope(i["q"], i["k"], i["indptr"], i["offsets"])); }},
      {"apply_llama31_rope",
       [&](In& i) {
         return rope2(fi::apply_llama31_rope(i["q"], i["k"], i["indptr"], i["offsets"]));
       }},
      {"softmax", [](In& i) { return Outs{fi::softmax(i["logits"])}; }},
      {"top_k_mask_logits", [](In& i) { return Outs{fi::top_k_mask_logits(i["logits"], 20)}; }},
      {"top_k_renorm_probs", [](In& i) { return Outs{fi::top_k_renorm_probs(i["probs"], 20)}; }},
      {"top_p_renorm_probs", [](In& i) { return Outs{fi::top_p_renorm_probs(i["probs"], 0.9)}; }},
      {"mm_bf16", [](In& i) { return Outs{fi::mm_bf16(i["A"], i["B"])}; }},
      // Upstream's single_* definitions carry no sm_scale / causal: the op's defaults.
      {"single_decode_with_kv_cache",
       [](In& i) { return Outs{fi::single_decode_with_kv_cache(i["q"], i["k"], i["v"]).out}; }},
      {"single_prefill_with_kv_cache",
       [](In& i) { return Outs{fi::single_prefill_with_kv_cache(i["q"], i["k"], i["v"]).out}; }},
      // The op takes B column-major: the same values, transposed storage.
      {"bmm_bf16",
       [](In& i) {
         const Tensor b = i["B"].transpose(1, 2).contiguous().transpose(1, 2);
         return Outs{fi::bmm_bf16(i["A"], b)};
       }},
      {"top_k", [&](In& i) { return tup2(fi::top_k(i["input"], 3)); }},
      {"concat_mla_k",
       [](In& i) {
         fi::concat_mla_k(i["k"], i["k_nope"], i["k_rope"]);
         return Outs{i["k"]};
       }},
      // The reference's scales are linear and flat: the op's linear [M, K / 16], flattened.
      {"fp4_quantize",
       [](In& i) {
         auto [q, sf] = fi::fp4_quantize(i["input"], i["global_scale"], 16, false, false);
         return Outs{q, sf.reshape({sf.numel()})};
       }},
      {"nvfp4_quantize",
       [](In& i) {
         auto [q, sf] = fi::nvfp4_quantize(i["a"], i["a_global_sf"], fi::SfLayout::layout_linear);
         return Outs{q, sf.reshape({sf.numel()})};
       }},
      {"mxfp4_quantize",
       [](In& i) {
         auto [q, sf] =
             fi::mxfp4_quantize(i["a"], "cuda", std::nullopt, fi::SfLayout::layout_linear);
         return Outs{q, sf.reshape({sf.numel()})};
       }},
      {"silu_and_mul_nvfp4_quantize",
       [](In& i) {
         auto [q, sf] = fi::silu_and_mul_nvfp4_quantize(i["input"], i["global_scale"], 16, false);
         return Outs{q, sf.reshape({sf.numel()})};
       }},
      {"nvfp4_quantize_smooth",
       [](In& i) {
         auto [q, sf] = fi::nvfp4_quantize_smooth(i["x"], i["pre_quant_scale"], i["global_scale"]);
         return Outs{q, sf.reshape({sf.numel()})};
       }},
      {"mxfp8_grouped_quantize",
       [&](In& i) { return tup2(fi::mxfp8_grouped_quantize(i["a"], i["mask"])); }},
      {"mla_rope_quantize_fp8",
       [&](In& i) {
         return tup4(fi::mla_rope_quantize_fp8(i["q_rope"], i["k_rope"], i["q_nope"], i["k_nope"],
                                               i["cos_sin_cache"], i["pos_ids"], false));
       },
       fi::testing::Tolerance{2e-3, 6.3e-2}},
      {"apply_rope_with_cos_sin_cache",
       [&](In& i) {
         return rope2(fi::apply_rope_with_cos_sin_cache(i["positions"], i["query"], i["key"], 16,
                                                        i["cos_sin_cache"], true));
       }},
      // 3-D keys (num_k_heads 2), NeoX halves (init's is_neox).
      {"rope_quantize_fp8",
       [&](In& i) {
         return tup4(fi::rope_quantize_fp8(i["q_rope"], i["k_rope"], i["q_nope"], i["k_nope"],
                                           i["cos_sin_cache"], i["pos_ids"], true));
       },
       fi::testing::Tolerance{2e-3, 6.3e-2}},
      {"mm_bf16_fp4",
       [&](In& i) {
         return Outs{fi::mm_bf16_fp4(i["A"], i["B"], e4m3(i["b_descale"]), i["alpha"], "cudnn")};
       },
       std::nullopt, "mm_bf16_fp4_cudnn"},
      // The tile permutation of the cute-dsl layout: the reference decodes it on its own.
      {"mm_bf16_fp4",
       [](In& i) {
         return Outs{fi::mm_bf16_fp4(i["A"], i["B"], i["b_descale"], i["alpha"], "cute-dsl")};
       },
       std::nullopt, "mm_bf16_fp4_cute_dsl"},
      {"nvfp4_kv_dequantize_paged",
       [&](In& i) {
         fi::nvfp4_kv_dequantize_paged(fi::PagedKVCache(i["paged_k_cache"], i["paged_v_cache"]),
                                       fi::PagedKVCache(e4m3(i["k_scales"]), e4m3(i["v_scales"])),
                                       i["block_tables"], i["seq_lens"], i["k_scale"], i["v_scale"],
                                       i["output_k"], i["output_v"]);
         return Outs{i["output_k"], i["output_v"]};
       }},
      {"mm_nvfp4_svdquant",
       [](In& i) {
         return Outs{fi::mm_nvfp4_svdquant(i["a"], i["b"], i["a_sf"], i["b_sf"], i["alpha"], i["d"],
                                           i["l1"])};
       }},
      {"svdquant_linear",
       [](In& i) {
         return Outs{fi::svdquant_linear(i["x"], i["weight_fp4"], i["weight_sf"], i["alpha"],
                                         i["pre_quant_scale"], i["l2t_smoothed"], i["l1_scaled"],
                                         i["global_scale"])};
       }},
  };
  // Every routing method (Default .. Sigmoid), DeepSeekV3 with groups and a scale, an
  // expert-parallel shard (non-local experts give -1), SigmoidRenorm without normalization.
  cases.push_back(routing("default", 0, 4));
  cases.push_back(routing("renormalize", 1, 4));
  cases.push_back(
      routing("ds", 2, 4, {{"n_group", 4}, {"topk_group", 2}, {"routed_scaling_factor", 2.5}}));
  cases.push_back(routing("llama4", 3, 1));
  cases.push_back(
      routing("renormalize_naive", 4, 4, {{"local_expert_offset", 4}, {"local_num_experts", 8}}));
  cases.push_back(routing("topk", 5, 4));
  cases.push_back(routing("sigmoid_renorm", 6, 4, {{"norm_topk_prob", false}}));
  cases.push_back(routing("minimax2", 7, 4, {{"routed_scaling_factor", 2.5}}));
  cases.push_back(routing("sigmoid", 8, 4));
  // The unquantized MoE entry points (templates_moe_entry.cpp) against our CPU ops: MajorK
  // weights as the definitions write them, 8 experts of which 4 local, top-2, h32, i16.
  auto bf16_moe = [](std::string label, int64_t method, std::optional<double> scale,
                     std::optional<int64_t> n_group = std::nullopt,
                     std::optional<int64_t> topk_group = std::nullopt) {
    Json set = {{"routing_method_type", method}};
    if (scale) set["routed_scaling_factor"] = *scale;
    if (n_group) set["n_group"] = *n_group;
    if (topk_group) set["topk_group"] = *topk_group;
    Case c{"trtllm_bf16_moe", [=](In& i) {
             return Outs{fi::trtllm_bf16_moe(i["routing_logits"], std::nullopt, i["hidden_states"],
                                             i["gemm1_weights"], i["gemm2_weights"], 8, 2, n_group,
                                             topk_group, 16, 0, 4, scale, method, false,
                                             fi::WeightLayout::MajorK)};
           }};
    c.label = "trtllm_bf16_moe_" + label;
    c.set = set;
    return c;
  };
  // Default; Renormalize with a scale (which it ignores); DeepSeek-V3 (2 groups of 4, 1 kept,
  // scaled); TopK (raw logits as weights).
  cases.push_back(bf16_moe("default", 0, std::nullopt));
  cases.push_back(bf16_moe("renormalize", 1, 2.5));
  cases.push_back(bf16_moe("ds", 2, 2.5, 2, 1));
  cases.push_back(bf16_moe("topk", 5, std::nullopt));
  cases.push_back({"trtllm_bf16_routed_moe", [](In& i) {
                     return Outs{fi::trtllm_bf16_routed_moe(
                         fi::MoeTopkIds(i["topk_ids"]), i["hidden_states"], i["gemm1_weights"],
                         i["gemm2_weights"], 8, 2, std::nullopt, std::nullopt, 16, 0, 4,
                         std::nullopt, 0, false, fi::WeightLayout::MajorK)};
                   }});
  cases.push_back({"cutlass_fused_moe", [](In& i) {
                     return Outs{
                         fi::cutlass_fused_moe(i["input"], i["token_selected_experts"],
                                               i["token_final_scales"], i["fc1_expert_weights"],
                                               i["fc2_expert_weights"], DType::kBFloat16, {})[0]};
                   }});
  // The SM90 weight preparation, bit for bit: each weight interleave, the scale fold, and
  // Humming (max_range 4 of scales spread over 28, so blocks are clamped) in both layouts.
  for (const char* qt : {"fp4", "fp4_fp8", "int4"}) {
    Case c{"interleave_moe_weights_for_sm90_mixed_gemm", [=](In& i) {
             return Outs{fi::interleave_moe_weights_for_sm90_mixed_gemm(i["weight"], qt)};
           }};
    c.label = std::string("sm90_weight_interleave_") + qt;
    c.set = {{"quant_type", qt}};
    c.tol = fi::testing::Tolerance{0, 0};
    cases.push_back(c);
  }
  cases.push_back(
      {"interleave_moe_scales_for_sm90_mixed_gemm",
       [](In& i) { return Outs{fi::interleave_moe_scales_for_sm90_mixed_gemm(i["scales"], 32)}; },
       fi::testing::Tolerance{0, 0}});
  for (const bool il : {true, false}) {
    Case c{"preprocess_moe_weights_for_sm90_mixed_gemm_humming", [=](In& i) {
             auto [w, s, r] = fi::preprocess_moe_weights_for_sm90_mixed_gemm_humming(
                 i["weight"], i["raw_scale"], 4, il);
             return Outs{w, s, r};
           }};
    c.variant = il ? "sm90_mixed_gemm_humming_weight_preprocess"
                   : "sm90_mixed_gemm_humming_weight_preprocess_logical";
    c.label = c.variant;
    c.tol = fi::testing::Tolerance{0, 0};
    cases.push_back(c);
  }
  // FP8 block-scale routed: e4m3 values exact (multiples of 1/4), MajorK weights, 4 local
  // experts of 8, h256, i128 (whole 128 blocks). The definition's reference rounds the
  // activation to bf16; upstream's kernel, and so the library, quantize it to e4m3 per 128
  // columns (docs/MOE.md "FP8 block scale"), whose half ulp is 6.25 %: outputs here reach ~4400,
  // and differ from the reference by up to ~2 % of that, ~12 % relative.
  cases.push_back({"trtllm_fp8_block_scale_routed_moe",
                   [=](In& i) {
                     return Outs{fi::trtllm_fp8_block_scale_routed_moe(
                         fi::MoeTopkIds(i["topk_ids"]), std::nullopt, e4m3(i["hidden_states"]),
                         i["hidden_states_scale"], e4m3(i["gemm1_weights"]),
                         i["gemm1_weights_scale"], e4m3(i["gemm2_weights"]),
                         i["gemm2_weights_scale"], 8, 2, std::nullopt, std::nullopt, 128, 0, 4,
                         std::nullopt)};
                   },
                   fi::testing::Tolerance{100, 0.125}});
  // b12x and CuTe-DSL NVFP4: the definitions' linear e4m3 scales (exact e4m3 values in float32
  // on a torch without float8) given to the ops as they take them, e4m3 bytes in the 128x4
  // layout; 8 experts, top-2 (CuTe-DSL: 4 of them local, rows interleaved by 64).
  const auto swizzled = [](const Tensor& s) {
    const Tensor f8 = s.to(DType::kFloat8E4M3FN).contiguous();
    const Tensor bytes = Tensor::from_blob(f8.data_ptr(), {f8.size(0), f8.size(1), f8.size(2)},
                                           {f8.size(1) * f8.size(2), f8.size(2), 1}, DType::kUInt8,
                                           fi::Device::cpu());
    return fi::block_scale_interleave(bytes);
  };
  cases.push_back({"b12x_fused_moe", [=](In& i) {
                     return Outs{
                         fi::b12x_fused_moe(i["x"], i["w1_weight"], swizzled(i["w1_weight_sf"]),
                                            i["w2_weight"], swizzled(i["w2_weight_sf"]),
                                            i["token_selected_experts"], i["token_final_scales"], 8,
                                            2, i["w1_alpha"], i["w2_alpha"], i["fc2_input_scale"])};
                   }});
  cases.push_back({"cute_dsl_fused_moe_nvfp4", [=](In& i) {
                     return Outs{fi::cute_dsl_fused_moe_nvfp4(
                         i["x"], e4m3(i["x_sf"]), i["token_selected_experts"],
                         i["token_final_scales"], i["w1_weight"], swizzled(i["w1_weight_sf"]),
                         i["w1_alpha"], i["fc2_input_scale"], i["w2_weight"],
                         swizzled(i["w2_weight_sf"]), i["w2_alpha"], 8, 2, 4)};
                   }});
  cases.push_back({"hash_topk", [&](In& i) {
                     return tup2(fi::hash_topk(i["router_logits"], i["input_ids"], i["tid2eid"]));
                   }});
  // templates_attention_extra.cpp (small axes: 4 heads over 2 KV heads, pages of 4, 3 per
  // request; the MLA latent 16 + rope 8). The scales replace init's.
  const Json scales = {{"bmm1_scale", 0.25}, {"bmm2_scale", 1.5}};
  {
    Case c{"trtllm_batch_context_with_kv_cache", [](In& i) {
             const Tensor ws = Tensor::empty({1 << 16}, DType::kUInt8);
             return Outs{fi::trtllm_batch_context_with_kv_cache(
                             i["query"], i["kv_cache"], ws, i["block_tables"], i["seq_lens"], 2, 12,
                             0.25, 1.5, 2, i["cum_seq_lens_q"], i["cum_seq_lens_kv"])
                             .out};
           }};
    c.set = scales;
    cases.push_back(c);
    c = {"trtllm_batch_decode_with_kv_cache_mla", [](In& i) {
           return Outs{fi::trtllm_batch_decode_with_kv_cache_mla(
               i["query"], i["kv_cache"], i["workspace_buffer"], 16, 16, 8, i["block_tables"],
               i["seq_lens"], 12, 0, std::nullopt, 0.25, 1.5)};
         }};
    c.set = scales;
    cases.push_back(c);
    c = {"xqa_batch_decode_with_kv_cache_mla", [](In& i) {
           return Outs{fi::xqa_batch_decode_with_kv_cache_mla(
               i["query"], i["kv_cache"], i["workspace_buffer"], 16, 16, 8, i["block_tables"],
               i["seq_lens"], 12, std::nullopt, 0.25, 1.5)};
         }};
    c.set = scales;
    cases.push_back(c);
    c = {"append_paged_mla_kv_cache", [](In& i) {
           fi::append_paged_mla_kv_cache(i["append_ckv"], i["append_kpe"], i["batch_indices"],
                                         i["positions"], i["ckv_cache"], i["kpe_cache"],
                                         i["kv_indices"], i["kv_indptr"], i["kv_last_page_len"]);
           return Outs{i["ckv_cache"], i["kpe_cache"]};
         }};
    cases.push_back(c);
    // The query outputs; the op appends to its own fp8 (k, v) pages (8 pages of 4, 2 KV heads of
    // 8 + 8).
    c = {"rope_quantize_fp8_append_paged_kv_cache",
         [&](In& i) {
           Tensor kc = Tensor::empty({8, 4, 2, 16}, DType::kFloat8E4M3FN);
           Tensor vc = Tensor::empty({8, 4, 2, 16}, DType::kFloat8E4M3FN);
           kc.fill_(0.0);
           vc.fill_(0.0);
           return tup2(fi::rope_quantize_fp8_append_paged_kv_cache(
               i["q_rope"], i["k_rope"], i["q_nope"], i["k_nope"], i["v"], i["cos_sin_cache"],
               i["pos_ids"], fi::PagedKVCache(kc, vc), i["kv_indices"], i["kv_indptr"],
               i["batch_indices"], i["positions"], true, std::nullopt, 1.0, 1.0, 4));
         },
         fi::testing::Tolerance{2e-3, 6.3e-2}};
    cases.push_back(c);
    // The op takes b column-major: the same values, transposed storage.
    c = {"tgv_gemm_sm100", [](In& i) {
           const Tensor b = i["b"].transpose(0, 1).contiguous().transpose(0, 1);
           return Outs{fi::tgv_gemm_sm100(i["a"], b, i["bias"])};
         }};
    cases.push_back(c);
    c = {"tinygemm_bf16", [](In& i) {
           fi::tinygemm_bf16(i["input"], i["weight"], i["out"], i["bias"]);
           return Outs{i["out"]};
         }};
    cases.push_back(c);
    // Rows of 16 logits, top 4; rows shorter than 4 are padded with -1.
    c = {"top_k_varlen",
         [](In& i) { return Outs{std::get<0>(fi::top_k_varlen(i["logits"], i["seq_lens"], 4))}; }};
    cases.push_back(c);
    // The fixed router shape (mat_b column-major); the op writes fp32, the definition's out is
    // mat_a's bf16.
    c = {"mm_M1_16_K7168_N256", [](In& i) {
           const Tensor b = i["mat_b"].transpose(0, 1).contiguous().transpose(0, 1);
           Tensor out = Tensor::empty({i["mat_a"].shape()[0], 256}, DType::kFloat32);
           fi::mm_M1_16_K7168_N256(i["mat_a"], b, out);
           return Outs{out};
         }};
    cases.push_back(c);
    // Two requests of 2 queries over 3 keys, causal with a window of 1 key back.
    c = {"trtllm_ragged_attention_deepseek", [](In& i) {
           const Tensor ws = Tensor::empty({1 << 16}, DType::kUInt8);
           return Outs{fi::trtllm_ragged_attention_deepseek(
                           i["query"], i["key"], i["value"], ws, i["seq_lens"], 2, 3, 0.25, 1.5,
                           1.0, 2, 1, i["cum_seq_lens_q"], i["cum_seq_lens_kv"], std::nullopt, true,
                           false)
                           .out};
         }};
    c.axes = {{"head_dim", 128}};  // the op's head dims: (128, 128, 128) among three
    c.set = {{"bmm1_scale", 0.25}, {"bmm2_scale", 1.5}, {"window_left", 1}};
    cases.push_back(c);
    // e4m3 inputs (init's values are exact in e4m3), 1x128 / 128x128 block scales.
    c = {"fp8_blockscale_gemm_sm90", [&](In& i) {
           return Outs{fi::fp8_blockscale_gemm_sm90(e4m3(i["input"]), e4m3(i["weight"]),
                                                    i["input_scale"], i["weight_scale"])};
         }};
    c.axes = {};
    c.set = Json::object();
    cases.push_back(c);
    c = {"batch_deepgemm_fp8_nt_groupwise", [&](In& i) {
           return Outs{fi::batch_deepgemm_fp8_nt_groupwise(e4m3(i["a"]), e4m3(i["b"]), i["a_scale"],
                                                           i["b_scale"], i["masked_m"], 4)};
         }};
    cases.push_back(c);
    // The NVFP4 appends: the packed bytes bit for bit, the e4m3 scales exactly (init's scale
    // caches arrive as float32 from a torch without float8); k_scale 1.0, v_scale 0.5.
    c = {"nvfp4_quantize_append_paged_kv_cache", [&](In& i) {
           Tensor ks = e4m3(i["k_scale_cache"]), vs = e4m3(i["v_scale_cache"]);
           fi::nvfp4_quantize_append_paged_kv_cache(
               i["append_key"], i["append_value"], i["batch_indices"], i["positions"],
               fi::PagedKVCache(i["paged_k_cache"], i["paged_v_cache"]), fi::PagedKVCache(ks, vs),
               i["kv_indices"], i["kv_indptr"], i["kv_last_page_len"], 1.0, 0.5);
           return Outs{i["paged_k_cache"], i["paged_v_cache"], ks, vs};
         }};
    cases.push_back(c);
    c = {"nvfp4_quantize_append_paged_kv_cache_with_slot_mapping", [&](In& i) {
           Tensor ks = e4m3(i["k_scale_cache"]), vs = e4m3(i["v_scale_cache"]);
           fi::nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
               i["append_key"], i["append_value"], i["slot_mapping"],
               fi::PagedKVCache(i["paged_k_cache"], i["paged_v_cache"]), fi::PagedKVCache(ks, vs),
               i["k_scale"], i["v_scale"]);
           return Outs{i["paged_k_cache"], i["paged_v_cache"], ks, vs};
         }};
    cases.push_back(c);
  }
  const fs::path dir = fresh_dir("refs");
  Json manifest = {{"run", Json::array()}, {"io", Json::array()}};
  std::vector<fs::path> files;
  fs::create_directories(dir / "all");
  write_every_definition(dir / "all", &files);
  llama_demo_dump(dir / "llama", &files);
  for (const auto& f : files) manifest["run"].push_back(f.string());
  for (const Case& c : cases) {
    auto axes = small_axes(c.op);
    if (axes.count("vocab_size")) axes["vocab_size"] = 100;  // top-k of 20 leaves some out
    for (const auto& [k, v] : c.axes) axes[k] = v;
    const std::string stem = !c.label.empty() ? c.label : c.variant.empty() ? c.op : c.variant;
    const fs::path def = dir / (stem + ".json");
    const fi::trace::detail::Template* t = fi::trace::detail::find_template(c.op);
    for (const auto* v : fi::trace::detail::templates_of(c.op)) {
      if (v->name_prefix == c.variant) t = v;
    }
    std::ofstream(def) << fi::trace::detail::definition_for_template_axes(c.op, *t, axes,
                                                                          DType::kBFloat16);
    manifest["io"].push_back(
        {{"definition", def.string()}, {"out", (dir / (stem + ".pt")).string()}, {"set", c.set}});
  }
  // (The definitions and the demo's dump were validated above, Python or not.)
  if (!fs::exists("/usr/bin/python3")) {
    fs::remove_all(dir);
    GTEST_SKIP() << "no /usr/bin/python3";
  }
  const bool torch = run_python(manifest, dir);
  if (!torch) {
    fs::remove_all(dir);
    GTEST_SKIP() << "no torch for /usr/bin/python3: the references were only parsed";
  }
  for (const Case& c : cases) {
    const std::string stem = !c.label.empty() ? c.label : c.variant.empty() ? c.op : c.variant;
    SCOPED_TRACE(stem);
    const fs::path pt = dir / (stem + ".pt");
    In in;
    std::vector<Tensor> expected;
    for (auto& [name, t] : fi::load_torch(pt.string())) {
      if (name.rfind("in.", 0) == 0) in[name.substr(3)] = t;
      if (name.rfind("out.", 0) == 0) expected.push_back(t);
    }
    const Outs got = c.call(in);
    ASSERT_EQ(got.size(), expected.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      const DType dt = expected[k].dtype();
      const fi::testing::Tolerance tol = c.tol ? *c.tol
                                         : dt == DType::kBFloat16
                                             ? fi::testing::Tolerance{2e-2, 2e-2}
                                             : fi::testing::Tolerance{2e-4, 2e-4};
      EXPECT_TRUE(
          fi::testing::all_close(got[k].to(DType::kFloat32), expected[k].to(DType::kFloat32), tol))
          << "output " << k;
    }
  }
  fs::remove_all(dir);
}
