// The shared input / output lists of src/trace/template_io.h.
#include "trace/template_io.h"

namespace flashinfer::trace::detail {

namespace {
const std::vector<std::string> kDenseQ = {"qo_len", "num_qo_heads", "head_dim"};
}  // namespace

std::vector<Io> dense_qkv_inputs() {
  const std::vector<std::string> kv = {"kv_len", "num_kv_heads", "head_dim"};
  return {T("q", kDenseQ), T("k", kv), T("v", kv)};
}

Io dense_output() { return T("output", kDenseQ).like("q"); }

std::vector<Axis> trtllm_paged_axes(int64_t num_tokens_init, int64_t num_pages_init,
                                    std::string max_pages_desc) {
  return {
      var("num_tokens", "Total query tokens across the batch.", num_tokens_init),
      cst("num_heads", "h"),
      cst("num_kv_heads", "kv"),
      cst("head_dim", "d"),
      cst("page_size", "ps"),
      var("num_pages", "", num_pages_init),
      cst("kv_cache_dim", "", "1 for interleaved (K,V) single tensor; 2 for separate K/V halves."),
      var("batch_size", "", 2),
      var("max_pages_per_seq", std::move(max_pages_desc), 3)};
}

Io trtllm_kv_cache() {
  return T("kv_cache", {"num_pages", "kv_cache_dim", "num_kv_heads", "page_size", "head_dim"});
}

Io paged_block_tables(const std::string& key) {
  return T(key, {"batch_size", "max_pages_per_seq"})
      .synth("int32")
      .init(
          "torch.randperm(num_pages)[:batch_size * max_pages_per_seq]"
          ".reshape(batch_size, max_pages_per_seq).to(torch.int32)");
}

std::vector<Io> fmha_v2_scalars() {
  return {S("num_heads", "int32").init("num_heads"), S("head_dim", "int32").init("head_dim"),
          S("seq_len", "int32").init("seq_len"), S("scale_softmax", "float32").init("1.0"),
          S("scale_bmm1", "float32").opt().init("1.0 / math.sqrt(head_dim)")};
}

std::vector<Io> fmha_v2_bshd_inputs(std::string out_desc) {
  std::vector<Io> in = {T("query", kBshd), T("key", kBshd), T("value", kBshd),
                        T("out", kBshd).desc(std::move(out_desc))};
  for (Io& io : fmha_v2_scalars()) in.push_back(std::move(io));
  in.push_back(S("scale_bmm2", "float32").opt());
  return in;
}

namespace {
std::vector<Io> marked_int32(std::vector<Io> in, Int32As mark) {
  for (Io& io : in) {
    if (mark == Int32As::kDtype) {
      io.dt("int32");
    } else {
      io.synth("int32");
    }
  }
  return in;
}
}  // namespace

std::vector<Io> append_row_slots(Int32As mark) {
  return marked_int32(
      {T("batch_indices", {"nnz_kv"})
           .init("torch.arange(nnz_kv, dtype=torch.int32, device=device) % batch_size"),
       T("positions", {"nnz_kv"})
           .init("torch.arange(nnz_kv, dtype=torch.int32, device=device) // batch_size")},
      mark);
}

std::vector<Io> append_page_table(Int32As mark) {
  return marked_int32(
      {T("kv_indices", {"num_kv_indices"})
           .init("torch.arange(num_pages, dtype=torch.int32, device=device)"),
       T("kv_indptr", {"batch_size_plus_1"})
           .init("torch.arange(batch_size + 1, dtype=torch.int32, device=device) * (num_pages "
                 "// batch_size)"),
       T("kv_last_page_len", {"batch_size"})
           .init("torch.full((batch_size,), page_size, dtype=torch.int32, device=device)")},
      mark);
}

Io rope_cos_sin_cache() {
  const std::string freqs =
      "torch.arange(max_seq_len).float()[:, None] * torch.pow(1e4, "
      "-torch.arange(0, rotary_dim, 2).float() / rotary_dim)[None, :]";
  return T("cos_sin_cache", {"max_seq_len", "rotary_dim"})
      .synth("float32")
      .init("torch.cat([torch.cos(" + freqs + "), torch.sin(" + freqs + ")], dim=-1).to(device)");
}

Io rope_positions(const std::string& key) {
  return T(key, {"nnz"})
      .synth("int32")
      .init("torch.arange(nnz, dtype=torch.int32, device=device) % max_seq_len");
}

std::vector<Io> rope_fp8_parts() {
  return {
      T("q_rope", {"nnz", "num_q_heads", "rope_dim"}),
      T("k_rope", {"nnz", "num_k_heads", "rope_dim"}),
      T("q_nope", {"nnz", "num_q_heads", "no_rope_dim"})
          .opt()
          .init("torch.randn((nnz, num_q_heads, no_rope_dim), device=device).to({dtype:q_rope})"),
      T("k_nope", {"nnz", "num_k_heads", "no_rope_dim"})
          .opt()
          .init("torch.randn((nnz, num_k_heads, no_rope_dim), device=device).to({dtype:q_rope})")};
}

std::vector<Io> rope_fp8_scalars(const std::string& neox_init) {
  return {S("is_neox", "int32").opt().init(neox_init),
          S("quant_scale_q", "float32").opt().init("1.0"),
          S("quant_scale_kv", "float32").opt().init("1.0")};
}

Io rope_fp8_out(const Io& part) { return T(part.key + "_out", part.dims).dt("float8_e4m3fn"); }

std::vector<Io> rope_fp8_inputs(std::vector<Io> parts, const std::string& neox_init) {
  parts.push_back(rope_cos_sin_cache());
  parts.push_back(rope_positions("pos_ids"));
  for (Io& io : rope_fp8_scalars(neox_init)) parts.push_back(std::move(io));
  return parts;
}

std::vector<Io> rope_fp8_outputs(const std::vector<Io>& parts) {
  std::vector<Io> out;
  for (const Io& p : parts) out.push_back(rope_fp8_out(p));
  return out;
}

}  // namespace flashinfer::trace::detail
