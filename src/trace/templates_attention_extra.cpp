// Trace templates for the declared ops whose upstream template had no counterpart here: the
// remaining attention entry points (variable block-sparse, trtllm context, the MLA decodes, xqa),
// the MLA page append and the fused RoPE + FP8 + append, and the small GEMMs and top_k_varlen.
// Names, op_type, axes, inputs and outputs follow upstream's templates as read (file and commit
// in tests/trace/data/upstream/SOURCES.md); `reference` and `init` are ours (docs/TRACE.md).
#include "trace/template_builders.h"
#include "trace/template_io.h"

namespace flashinfer::trace::detail {

namespace {

// ---------------------------------------------------------------------------------------------
// attention (attention.py, page.py at the commits in SOURCES.md)

void add_attention_group(std::vector<Template>& v) {
  const std::string attend = kAttend;
  // VariableBlockSparseAttentionWrapper.run: block_sparse_run's schema. The per-row block map is
  // plan()'s, so the reference attends to every block (not causal, 1/sqrt(head_dim), as
  // block_sparse_run's). The op's own q is [num_qo_heads, qo_len, head_dim]; upstream's template
  // names the dims [qo_len, num_qo_heads, head_dim], and the reference reads them as named.
  v.push_back({.op = "VariableBlockSparseAttentionWrapper.run",
               .op_type = "block_sparse",
               .name_prefix = "var_block_sparse_run",
               .description = "Variable block-sparse attention over q, k, v; the per-row block "
                              "map is given to plan() (the reference attends to every block).",
               .axes = {cst("num_qo_heads", "h"), cst("num_kv_heads", "kv"), cst("head_dim", "d"),
                        var("qo_len", "Query sequence length (variable).", 3),
                        var("kv_len", "Key/value sequence length (variable).", 5)},
               .inputs = dense_qkv_inputs(),
               .outputs = {dense_output()},
               .tags = {"status:verified", "sparse:block"},
               .reference = attend + R"PY(

def run(q, k, v):
    out, _ = _attend(q, k, v, 1.0 / math.sqrt(q.shape[-1]), False)
    return out.to(q.dtype)
)PY"});

  // trtllm_batch_context_with_kv_cache (flashinfer.prefill): trtllm_batch_decode's axes plus the
  // cumulative query / KV lengths; bmm1_scale and bmm2_scale are required here.
  {
    auto axes =
        trtllm_paged_axes(4, 8, "Maximum number of pages per sequence (block_tables width).");
    axes.push_back(var("batch_size_plus_1_q", "batch_size + 1.", 3));
    axes.push_back(var("batch_size_plus_1_kv", "batch_size + 1.", 3));
    v.push_back(
        {.op = "trtllm_batch_context_with_kv_cache",
         .op_type = "trtllm_paged",
         .name_prefix = "trtllm_batch_context",
         .description = "TRT-LLM paged context/prefill: kv_cache [num_pages, kv_cache_dim, "
                        "num_kv_heads, page_size, head_dim] (HND, K and V halves), rectangular "
                        "block_tables, variable query lengths from cum_seq_lens_q; causal (query "
                        "i of m sees keys j <= n - m + i).",
         .axes = std::move(axes),
         .inputs =
             {T("query", kPagedTok), trtllm_kv_cache(), paged_block_tables("block_tables"),
              T("seq_lens", {"batch_size"})
                  .synth("int32")
                  .init("torch.randint(num_tokens // batch_size, max_pages_per_seq * page_size + "
                        "1, (batch_size,), dtype=torch.int32)"),
              S("max_q_len", "int32").init("num_tokens // batch_size"),
              S("max_kv_len", "int32").init("int(seq_lens.max())"),
              S("bmm1_scale", "float32").init("1.0 / math.sqrt(head_dim)"),
              S("bmm2_scale", "float32").init("1.0"),
              S("batch_size_scalar", "int32").from("batch_size").init("batch_size"),
              T("cum_seq_lens_q", {"batch_size_plus_1_q"})
                  .synth("int32")
                  .init("(torch.arange(batch_size + 1) * (num_tokens // batch_size))"
                        ".to(torch.int32)"),
              T("cum_seq_lens_kv", {"batch_size_plus_1_kv"})
                  .synth("int32")
                  .init("torch.cat([torch.zeros(1, dtype=torch.int32), "
                        "seq_lens.cumsum(0).to(torch.int32)])")},
         .outputs = {T("output", kPagedTok).like("query")},
         .tags = {"status:verified", "stage:prefill", "backend:trtllm"},
         .reference = attend + R"PY(

def run(query, kv_cache, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale,
        batch_size_scalar, cum_seq_lens_q, cum_seq_lens_kv):
    _, kv_dim, num_kv_heads, page_size, head_dim = kv_cache.shape
    if kv_dim != 2:
        raise NotImplementedError("kv_cache_dim 1 (interleaved K/V)")
    out = torch.zeros(query.shape, dtype=torch.float32)
    for b in range(block_tables.shape[0]):
        n = int(seq_lens[b])
        q0, q1 = int(cum_seq_lens_q[b]), int(cum_seq_lens_q[b + 1])
        pages = block_tables[b, :(n + page_size - 1) // page_size].long()
        # [pages, heads, page_size, dim] -> [tokens, heads, dim]
        k = kv_cache[pages, 0].permute(0, 2, 1, 3).reshape(-1, num_kv_heads, head_dim)[:n]
        v = kv_cache[pages, 1].permute(0, 2, 1, 3).reshape(-1, num_kv_heads, head_dim)[:n]
        o, _ = _attend(query[q0:q1], k, v, float(bmm1_scale), True)
        out[q0:q1] = o * float(bmm2_scale)
    return out.to(query.dtype)
)PY"});
  }

  // trtllm_batch_decode_with_kv_cache_mla / xqa_batch_decode_with_kv_cache_mla (flashinfer.mla):
  // one schema, query [batch, q_len, H, kv_lora_rank + rope] against the latent cache [ckv | kpe];
  // qk_nope_head_dim, kv_lora_rank and qk_rope_head_dim are constant axes read from the scalar
  // arguments of their names.
  const auto mla = [&](const char* op, const char* prefix, const char* backend, const char* desc) {
    const std::vector<std::string> qd = {"batch_size", "q_len_per_request", "num_heads",
                                         "head_dim_qk"};
    return Template{
        .op = op,
        .op_type = "mla_paged",
        .name_prefix = prefix,
        .description = desc,
        .axes = {var("batch_size", "", 2),
                 var("q_len_per_request", "Query length per request (MTP depth).", 2),
                 cst("num_heads", "h"), cst("head_dim_qk", "d_qk"), cst("kv_lora_rank", "ckv"),
                 cst("qk_rope_head_dim", "kpe"), cst("qk_nope_head_dim", "nope"),
                 var("num_pages", "", 8), cst("page_size", "ps"), var("max_pages_per_seq", "", 3)},
        .inputs =
            {T("query", qd),
             T("kv_cache", {"num_pages", "page_size", "head_dim_qk"})
                 .desc("Paged latent cache [ckv | kpe]; a 4-D [pages, 1, page_size, dim] cache is "
                       "also accepted by the reference."),
             T("workspace_buffer", {"num_pages"}).synth("int8"),
             S("qk_nope_head_dim", "int32").init("qk_nope_head_dim"),
             S("kv_lora_rank", "int32").init("kv_lora_rank"),
             S("qk_rope_head_dim", "int32").init("qk_rope_head_dim"),
             paged_block_tables("block_tables"),
             T("seq_lens", {"batch_size"})
                 .synth("int32")
                 .init("torch.randint(q_len_per_request, max_pages_per_seq * page_size + 1, "
                       "(batch_size,), dtype=torch.int32)"),
             S("max_seq_len", "int32").init("int(seq_lens.max())"),
             S("bmm1_scale", "float32").opt().init("1.0 / math.sqrt(head_dim_qk)"),
             S("bmm2_scale", "float32").opt()},
        .outputs = {T("output", {"batch_size", "q_len_per_request", "num_heads", "kv_lora_rank"})
                        .like("query")},
        .tags = {"status:verified", "stage:decode", backend, "mla"},
        .reference = attend + R"PY(

def run(query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
        block_tables, seq_lens, max_seq_len, bmm1_scale=None, bmm2_scale=None):
    # s = bmm1_scale * q . [ckv | kpe], out = bmm2_scale * softmax(s) . ckv (the op's defaults:
    # both scales 1); several queries per request are its last tokens, causal among themselves.
    if kv_cache.dim() == 4:
        kv_cache = kv_cache.squeeze(1)
    batch, q_len, heads, dim = query.shape
    page_size = kv_cache.shape[1]
    rank = int(kv_lora_rank)
    s1 = 1.0 if bmm1_scale is None else float(bmm1_scale)
    s2 = 1.0 if bmm2_scale is None else float(bmm2_scale)
    out = torch.zeros((batch, q_len, heads, rank), dtype=torch.float32)
    for b in range(batch):
        n = int(seq_lens[b])
        pages = block_tables[b, :(n + page_size - 1) // page_size].long()
        kv = kv_cache[pages].reshape(-1, 1, dim)[:n]
        o, _ = _attend(query[b], kv, kv[..., :rank], s1, True)
        out[b] = o * s2
    return out.to(query.dtype)
)PY"};
  };
  v.push_back(mla("trtllm_batch_decode_with_kv_cache_mla", "trtllm_batch_decode_mla",
                  "backend:trtllm",
                  "TRT-LLM MLA paged decode: query [Q_nope | Q_pe] with head_dim_qk = "
                  "kv_lora_rank + qk_rope_head_dim, latent cache [ckv | kpe]; the output is "
                  "kv_lora_rank wide."));
  v.push_back(mla("xqa_batch_decode_with_kv_cache_mla", "xqa_batch_decode_mla", "backend:xqa",
                  "XQA MLA paged decode wrapper: trtllm_batch_decode_mla's math (upstream's "
                  "kernel takes fp8 e4m3 query and cache)."));
  // Upstream's xqa variant names q's length axis "(must be 1)" and gives the workspace no
  // description; neither is a compared field, the schema is the same.
  v.back().axes[1].description = "Query length per request (must be 1).";
  v.back().axes[1].init_value = 1;
  v.back().inputs[0].description.clear();
  v.back().inputs[1].description.clear();

  // xqa / xqa_mla (flashinfer.xqa; upstream's templates live in page.py). The definitions name q
  // [num_tokens, heads, dim] and the caches HND [num_pages, num_kv_heads, page_size, head_dim]
  // (xqa) or [num_pages, page_size, dim] (xqa_mla); the references read them as named. Neither
  // names a scale: xqa's are 1 (s = q.k / sqrt(head_dim)), xqa_mla's too (s = q.k, no
  // 1/sqrt: its kernel leaves that to the caller's q_scale).
  const std::vector<std::string> xq = {"num_tokens", "num_heads_qo", "head_dim"};
  const std::vector<std::string> hnd = {"num_pages", "num_kv_heads", "page_size", "head_dim"};
  const auto xqa_tail = [](std::vector<Io> in) {
    in.push_back(paged_block_tables("page_table"));
    in.push_back(T("seq_lens", {"batch_size"})
                     .synth("int32")
                     .init("torch.randint(num_tokens // batch_size, max_pages_per_seq * "
                           "page_size + 1, (batch_size,), dtype=torch.int32)"));
    return in;
  };
  v.push_back(
      {.op = "xqa",
       .op_type = "xqa",
       .name_prefix = "xqa",
       .description = "XQA paged decode kernel: separate k/v caches (HND as named here), "
                      "rectangular page_table [batch_size, max_pages_per_seq]; the "
                      "requests' num_tokens / batch_size queries are their last tokens.",
       .axes = {var("num_tokens", "", 2), cst("num_heads_qo", "h"), cst("num_kv_heads", "kv"),
                cst("head_dim", "d"), var("num_pages", "", 8), cst("page_size", "ps"),
                var("batch_size", "", 2), var("max_pages_per_seq", "", 3)},
       .inputs = xqa_tail({T("q", xq), T("k_cache", hnd), T("v_cache", hnd)}),
       .outputs = {T("output", xq).like("q")},
       .tags = {"status:verified", "backend:xqa"},
       .reference = attend + R"PY(

def run(q, k_cache, v_cache, page_table, seq_lens):
    num_tokens, heads, dim = q.shape
    _, num_kv_heads, page_size, _ = k_cache.shape
    batch = page_table.shape[0]
    q_len = num_tokens // batch
    lens = seq_lens.reshape(-1)
    out = torch.zeros((num_tokens, heads, dim), dtype=torch.float32)
    for b in range(batch):
        n = int(lens[b])
        pages = page_table[b, :(n + page_size - 1) // page_size].long()
        k = k_cache[pages].permute(0, 2, 1, 3).reshape(-1, num_kv_heads, dim)[:n]
        v = v_cache[pages].permute(0, 2, 1, 3).reshape(-1, num_kv_heads, dim)[:n]
        rows = slice(b * q_len, (b + 1) * q_len)
        out[rows], _ = _attend(q[rows], k, v, 1.0 / math.sqrt(dim), True)
    return out.to(q.dtype)
)PY"});
  const std::vector<std::string> xm = {"num_tokens", "num_heads_qo", "head_dim_ckv"};
  v.push_back(
      {.op = "xqa_mla",
       .op_type = "xqa",
       .name_prefix = "xqa_mla",
       .description = "XQA MLA decode over the latent cache: s = q . k (no 1/sqrt), the "
                      "output the softmax-weighted latent rows (head_dim_ckv wide, as "
                      "declared; our op passes the latent cache as both k_cache and "
                      "v_cache, so v_cache is not read).",
       .axes = {var("num_tokens", "", 2), cst("num_heads_qo", "h"), cst("head_dim_ckv", "ckv"),
                cst("head_dim_kpe", "kpe"), var("num_pages", "", 8), cst("page_size", "ps"),
                var("batch_size", "", 2), var("max_pages_per_seq", "", 3)},
       .inputs = xqa_tail({T("q", xm), T("k_cache", {"num_pages", "page_size", "head_dim_ckv"}),
                           T("v_cache", {"num_pages", "page_size", "head_dim_kpe"})}),
       .outputs = {T("output", xm).like("q")},
       .tags = {"status:verified", "backend:xqa", "mla"},
       .reference = attend + R"PY(

def run(q, k_cache, v_cache, page_table, seq_lens):
    num_tokens, heads, dim = q.shape
    page_size = k_cache.shape[1]
    batch = page_table.shape[0]
    q_len = num_tokens // batch
    lens = seq_lens.reshape(-1)
    out = torch.zeros((num_tokens, heads, dim), dtype=torch.float32)
    for b in range(batch):
        n = int(lens[b])
        pages = page_table[b, :(n + page_size - 1) // page_size].long()
        kv = k_cache[pages].reshape(-1, 1, dim)[:n]
        rows = slice(b * q_len, (b + 1) * q_len)
        out[rows], _ = _attend(q[rows], kv, kv, 1.0, True)
    return out.to(q.dtype)
)PY"});
}

// ---------------------------------------------------------------------------------------------
// page / rope (page.py, rope.py at the commits in SOURCES.md)

void add_page_rope_group(std::vector<Template>& v) {
  // The page tables of both appends: request b owns pages kv_indices[kv_indptr[b] ..], appended
  // token i belongs to request i % batch_size at position i // batch_size (distinct slots).
  const auto paging = [](std::vector<Io> in) {
    in.push_back(T("kv_indices", {"num_kv_indices"})
                     .synth("int32")
                     .init("torch.randperm(num_pages).to(torch.int32)"));
    in.push_back(T("kv_indptr", {"batch_size_plus_1"})
                     .synth("int32")
                     .init("(torch.arange(batch_size + 1) * (num_pages // batch_size))"
                           ".to(torch.int32)"));
    return in;
  };
  const auto slots = [](const char* nnz) {
    const std::string n = nnz;
    return std::vector<Io>{T("batch_indices", {n})
                               .synth("int32")
                               .init("(torch.arange(" + n + ") % batch_size).to(torch.int32)"),
                           T("positions", {n})
                               .synth("int32")
                               .init("(torch.arange(" + n + ") // batch_size).to(torch.int32)")};
  };

  // append_paged_mla_kv_cache (flashinfer.page): the caches are optional inputs (so page_size is
  // a variable axis) and the two outputs, written without a `param`, as upstream's template.
  {
    std::vector<Io> in = {T("append_ckv", {"nnz_kv", "head_dim_ckv"}),
                          T("append_kpe", {"nnz_kv", "head_dim_kpe"})};
    for (Io& io : slots("nnz_kv")) in.push_back(io);
    in.push_back(T("ckv_cache", {"num_pages", "page_size", "head_dim_ckv"})
                     .opt()
                     .init("torch.zeros((num_pages, page_size, head_dim_ckv), device=device)"
                           ".to({dtype:append_ckv})"));
    in.push_back(T("kpe_cache", {"num_pages", "page_size", "head_dim_kpe"})
                     .opt()
                     .init("torch.zeros((num_pages, page_size, head_dim_kpe), device=device)"
                           ".to({dtype:append_kpe})"));
    in = paging(std::move(in));
    in.push_back(T("kv_last_page_len", {"batch_size"})
                     .synth("int32")
                     .init("torch.full((batch_size,), page_size, dtype=torch.int32)"));
    v.push_back(
        {.op = "append_paged_mla_kv_cache",
         .op_type = "page_append",
         .name_prefix = "append_paged_mla_kv_cache",
         .description = "Append MLA (ckv, kpe) rows into an MLA paged cache: token i goes to "
                        "page kv_indices[kv_indptr[batch_indices[i]] + positions[i] // "
                        "page_size], slot positions[i] % page_size.",
         .axes = {var("nnz_kv", "Total K/V tokens to append.", 4), cst("head_dim_ckv", "ckv"),
                  cst("head_dim_kpe", "kpe"), var("num_pages", "", 8),
                  var("page_size", "Size of each page (from optional cache).", 4),
                  var("batch_size", "", 2), var("batch_size_plus_1", "batch_size + 1.", 3),
                  var("num_kv_indices", "", 8)},
         .inputs = std::move(in),
         .outputs = {T("ckv_cache", {"num_pages", "page_size", "head_dim_ckv"}).like("append_ckv"),
                     T("kpe_cache", {"num_pages", "page_size", "head_dim_kpe"}).like("append_kpe")},
         .constraints = {"batch_size_plus_1 == batch_size + 1"},
         .tags = {"status:verified"},
         .reference =
             R"PY(def run(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache,
        kv_indices, kv_indptr, kv_last_page_len):
    if ckv_cache is None or kpe_cache is None:
        raise NotImplementedError("the caches are the outputs: both are needed")
    ckv, kpe = ckv_cache.clone(), kpe_cache.clone()
    page_size = ckv.shape[1]
    for i in range(batch_indices.shape[0]):
        b, pos = int(batch_indices[i]), int(positions[i])
        page = int(kv_indices[int(kv_indptr[b]) + pos // page_size])
        ckv[page, pos % page_size] = append_ckv[i]
        kpe[page, pos % page_size] = append_kpe[i]
    return ckv, kpe
)PY"});
  }

  // rope_quantize_fp8_append_paged_kv_cache (flashinfer.rope): rope_quantize_fp8's inputs plus v
  // and the paging; the outputs are the two quantized query parts only. paged_kv_cache is named
  // as one 4-D tensor: a (k_cache, v_cache) pair leaves page_size without value.
  {
    const std::string cache =
        "torch.zeros((num_pages, page_size, num_k_heads, head_dim), "
        "device=device).to({dtype:q_rope})";
    const std::vector<Io> parts = rope_fp8_parts();
    std::vector<Io> in = parts;
    in.push_back(
        T("v", {"nnz", "num_k_heads", "head_dim"})
            .opt()
            .desc("GQA/MHA value tensor (None for MLA).")
            .init("torch.randn((nnz, num_k_heads, head_dim), device=device).to({dtype:q_rope})"));
    in.push_back(rope_cos_sin_cache());
    in.push_back(rope_positions("pos_ids"));
    in.push_back(T("paged_kv_cache", {"num_pages", "page_size", "num_k_heads", "head_dim"})
                     .desc("Paged KV cache pair: (k_cache, v_cache) for GQA/MHA, (ckv_cache, "
                           "kpe_cache) for MLA.")
                     .init("(" + cache + ", " + cache + ")"));
    in = paging(std::move(in));
    for (Io& io : slots("nnz")) in.push_back(io);
    for (Io& io : rope_fp8_scalars("True")) in.push_back(std::move(io));
    v.push_back(
        {.op = "rope_quantize_fp8_append_paged_kv_cache",
         .op_type = "rope",
         .name_prefix = "rope_quantize_fp8_append_paged_kv_cache",
         .description = "RoPE + FP8 quantization (rope_quantize_fp8's math) with K (and V) "
                        "appended to the paged cache: token i to page kv_indices[kv_indptr["
                        "batch_indices[i]] + positions[i] // page_size], slot positions[i] % "
                        "page_size, K as [rope | nope]; the outputs are the quantized query parts.",
         .axes = {var("nnz", "Total number of tokens across the batch."), cst("num_q_heads", "h"),
                  cst("num_k_heads", "kv"), cst("rope_dim", "rope"), var("no_rope_dim", "", 8),
                  var("head_dim", "Full KV head_dim (nope + rope); unset for MLA.", 16),
                  var("max_seq_len", "", 16), cst("rotary_dim", ""), var("num_pages", "", 8),
                  cst("page_size", "ps"), var("batch_size", "", 2), var("batch_size_plus_1", "", 3),
                  var("num_kv_indices", "", 8)},
         .inputs = std::move(in),
         .outputs = {rope_fp8_out(parts[0]), rope_fp8_out(parts[2])},
         .tags = {"status:verified", "fused", "quantize:fp8"},
         .reference =
             std::string(kRopeFp8Helpers) +
             R"PY(def run(q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, pos_ids, paged_kv_cache, kv_indices,
        kv_indptr, batch_indices, positions, is_neox=True, quant_scale_q=1.0, quant_scale_kv=1.0):
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache.float()[pos_ids.long()]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    neox = True if is_neox is None else bool(is_neox)
    sq = 1.0 if quant_scale_q is None else quant_scale_q
    skv = 1.0 if quant_scale_kv is None else quant_scale_kv
    mla = k_rope.dim() == 2
    k = _rotate(k_rope.float(), cos[:, 0] if mla else cos, sin[:, 0] if mla else sin, neox)
    if not isinstance(paged_kv_cache, (tuple, list)):
        raise NotImplementedError("paged_kv_cache as a (k_cache, v_cache) pair")
    first, second = paged_kv_cache
    page_size = first.shape[1]
    if mla:  # (ckv_cache, kpe_cache): the latent k_nope and the rotated k_rope
        rows = (_fp8(k_nope, skv), _fp8(k, skv))
    else:  # (k_cache, v_cache): K as [rope | nope], V
        rows = (torch.cat([_fp8(k, skv).float(), _fp8(k_nope, skv).float()], dim=-1),
                _fp8(v, skv))
    for i in range(batch_indices.shape[0]):
        b, pos = int(batch_indices[i]), int(positions[i])
        page = int(kv_indices[int(kv_indptr[b]) + pos // page_size])
        first[page, pos % page_size] = rows[0][i].to(first.dtype)
        second[page, pos % page_size] = rows[1][i].to(second.dtype)
    q = _rotate(q_rope.float(), cos, sin, neox)
    return _fp8(q, sq), _fp8(q_nope, sq)
)PY"});
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM / top-k (page.py, gemm.py, topk.py at the commits in SOURCES.md)

void add_gemm_topk_group(std::vector<Template>& v) {
  // tgv_gemm_sm100 (flashinfer.gemm; upstream's template sits in page.py): N and K constants
  // without an abbreviation (the name spells them), b [K, N] (column-major in memory).
  v.push_back({.op = "tgv_gemm_sm100",
               .op_type = "gemm_bf16",
               .name_prefix = "tgv_gemm_sm100",
               .description = "TGV GEMM: output = a @ b + bias, fp32 accumulation, the bias added "
                              "in fp32 before the one rounding to a's dtype.",
               .axes = {var("M", "", 3), cst("N", "N"), cst("K", "K")},
               .inputs = {T("a", {"M", "K"}),
                          T("b", {"K", "N"}).desc("Weight matrix in column-major layout."),
                          T("bias", {"N"}).desc("Bias tensor.")},
               .outputs = {T("output", {"M", "N"}).like("a")},
               .tags = {"status:verified", "backend:tgv"},
               .reference = R"PY(def run(a, b, bias):
    return (a.float() @ b.float() + bias.float()).to(a.dtype)
)PY"});

  // tinygemm_bf16 (flashinfer.gemm.routergemm): F.linear into `out`; the output takes input's
  // dtype and carries no `param` (upstream's template).
  v.push_back(
      {.op = "tinygemm_bf16",
       .op_type = "gemm_bf16",
       .name_prefix = "tinygemm_bf16",
       .description = "Small-batch bf16 GEMM (F.linear): out = input @ weight.T + bias, "
                      "fp32 accumulation, the bias added before the one rounding.",
       .axes = {var("M", "Number of rows in input (small).", 3), cst("N", "n"), cst("K", "k")},
       .inputs = {T("input", {"M", "K"}), T("weight", {"N", "K"}),
                  T("out", {"M", "N"}).desc("In-place output buffer."),
                  T("bias", {"N"}).opt().init("torch.randn((N,), device=device).to({dtype:input})"),
                  S("use_pdl", "int32").opt()},
       .outputs = {T("out", {"M", "N"}).like("input")},
       .tags = {"status:verified"},
       .reference = R"PY(def run(input, weight, out, bias=None, use_pdl=None):
    res = input.float() @ weight.float().T
    if bias is not None:
        res = res + bias.float()[None, :]
    return res.to(input.dtype)
)PY"});

  // grouped_gemm_nt_masked (flashinfer.gemm.kernels.grouped_gemm_masked_wrapper): lhs and rhs
  // are (data, scale) pairs in a call, named as one tensor each, so a call leaves N and K without
  // value (upstream's rules); the definition carries no scale layout, and the reference
  // multiplies the values as given (a pair raises NotImplementedError).
  v.push_back(
      {.op = "grouped_gemm_nt_masked",
       .op_type = "gemm_fp8",
       .name_prefix = "grouped_gemm_nt_masked",
       .description = "Grouped GEMM with masked M: out[g, :masked_m[g]] = lhs[g, :masked_m[g]] @ "
                      "rhs[g].T (fp32 accumulation); rows past masked_m[g] keep out's contents.",
       .axes = {var("num_groups", "Number of expert groups.", 2),
                var("max_m", "Max rows per group (padded).", 4), cst("N", "n"), cst("K", "k")},
       .inputs = {T("lhs", {"num_groups", "max_m", "K"})
                      .desc("Tuple (lhs_data, lhs_sf) in a call: quantized A and its scales."),
                  T("rhs", {"num_groups", "N", "K"})
                      .desc("Tuple (rhs_data, rhs_sf) in a call: quantized B and its scales."),
                  T("out", {"num_groups", "max_m", "N"}).desc("In-place output buffer."),
                  T("masked_m", {"num_groups"})
                      .synth("int32")
                      .desc("Per-group valid row count.")
                      .init("torch.randint(0, max_m + 1, (num_groups,), dtype=torch.int32)"),
                  S("ab_dtype", "int32"), S("sf_dtype", "int32"), S("c_dtype", "int32"),
                  S("sf_vec_size", "int32")},
       .outputs = {T("out", {"num_groups", "max_m", "N"}).like("out")},
       .tags = {"status:verified", "moe", "quantization:fp8"},
       .reference = R"PY(def run(lhs, rhs, out, masked_m, ab_dtype, sf_dtype, c_dtype, sf_vec_size):
    if isinstance(lhs, (tuple, list)) or isinstance(rhs, (tuple, list)):
        raise NotImplementedError("quantized (data, scale) pairs: the definition has no layout")
    res = out.clone()
    for g in range(lhs.shape[0]):
        m = int(masked_m[g])
        res[g, :m] = (lhs[g, :m].float() @ rhs[g].float().T).to(res.dtype)
    return res
)PY"});

  // top_k_varlen (flashinfer.topk_varlen; upstream's topk.py): top_k is a constant axis read
  // from the scalar argument. Our op's order: a row's selected indices ascending, -1 past a
  // short row's length (upstream's order is unspecified; its check compares values).
  v.push_back(
      {.op = "top_k_varlen",
       .op_type = "topk",
       .name_prefix = "top_k_varlen",
       .description = "Decode-step top-K over each row's first seq_lens[r] logits: the selected "
                      "column indices ascending, -1 past a row shorter than top_k.",
       .axes = {var("batch_size", "Number of decode requests.", 3),
                cst("max_seq_len", "n", "Logits row width (padded)."),
                cst("top_k", "k", "Number of top elements per row.")},
       .inputs = {T("logits", {"batch_size", "max_seq_len"}),
                  T("seq_lens", {"batch_size"})
                      .synth("int32")
                      .desc("Effective KV-cache length per request.")
                      .init("torch.cat([torch.tensor([max(1, top_k // 2)]), torch.randint(top_k, "
                            "max_seq_len + 1, (batch_size - 1,))]).to(torch.int32)"),
                  S("top_k", "int32").init("top_k"),
                  T("pre_idx", {"batch_size", "top_k"})
                      .dt("int32")
                      .opt()
                      .desc("Previous-step top-K indices (a hint; no effect on the answer).")},
       .outputs = {T("indices", {"batch_size", "top_k"}).dt("int32")},
       .tags = {"status:verified"},
       .reference = R"PY(def run(logits, seq_lens, top_k, pre_idx=None):
    rows, width = logits.shape
    k = int(top_k)
    out = torch.full((rows, k), -1, dtype=torch.int32)
    for r in range(rows):
        n = max(0, min(int(seq_lens[r]), width))
        sel = torch.topk(logits[r, :n].float(), min(k, n)).indices
        out[r, :sel.numel()] = torch.sort(sel).values.to(torch.int32)
    return out
)PY"});
}

// ---------------------------------------------------------------------------------------------
// Further templates of upstream's gemm.py (1af46284) and page.py (b36e76a8) for ops declared
// here: the DeepSeek-V3 router GEMM, the SM90 FP8 block-scale GEMMs, and three prefills.

// Values exact in e4m3 (multiples of 1/8 in [0.5, 1.5)): a torch without float8 builds them as
// float32 and the library's e4m3 copy holds the same numbers.
std::string e4m3_exact_init(const std::string& shape, const std::string& key) {
  return "(torch.randint(4, 12, " + shape + ", device=device) / 8.0).to({dtype:" + key + "})";
}

void add_more_gemm_prefill_group(std::vector<Template>& v) {
  const std::string attend = kAttend;
  // mm_M1_16_K7168_N256 (flashinfer.gemm.routergemm): upstream's template gives `out` the
  // dtype of mat_a (the op writes fp32; the reference rounds as the definition says).
  v.push_back({.op = "mm_M1_16_K7168_N256",
               .op_type = "gemm_bf16",
               .name_prefix = "mm_M1_16_K7168_N256",
               .description = "DeepSeek-V3 router GEMM: out = mat_a @ mat_b, M in [1, 16], "
                              "K = 7168, N = 256 (mat_b column-major), fp32 accumulation.",
               .axes = {var("M", "Number of tokens (1-16).", 3),
                        cst("K", "k", "DeepSeek-V3 hidden dim (7168)."),
                        cst("N", "n", "Number of experts (256).")},
               .inputs = {T("mat_a", {"M", "K"}), T("mat_b", {"K", "N"}),
                          T("out", {"M", "N"}).desc("In-place output.")},
               .outputs = {T("out", {"M", "N"}).like("mat_a")},
               .tags = {"status:verified", "moe"},
               .reference = R"PY(def run(mat_a, mat_b, out):
    return (mat_a.float() @ mat_b.float()).to(mat_a.dtype)
)PY"});

  // fp8_blockscale_gemm_sm90 / batch_deepgemm_fp8_nt_groupwise (flashinfer.gemm.gemm_base):
  // 1x128 scales along K for the activations, 128x128 blocks for the weights.
  const std::string blockscale = R"PY(def _dequant(x, scale, rows_per_block):
    # scale [.., R // rows_per_block (or R), K // 128]: each entry covers rows_per_block rows
    # and 128 columns of x.
    s = scale.float().repeat_interleave(rows_per_block, dim=-2)[..., : x.shape[-2], :]
    return x.float() * s.repeat_interleave(128, dim=-1)[..., : x.shape[-1]]

)PY";
  v.push_back(
      {.op = "fp8_blockscale_gemm_sm90",
       .op_type = "gemm_fp8",
       .name_prefix = "fp8_blockscale_gemm_sm90",
       .description = "FP8 block-scale GEMM: out = (input * input_scale) @ (weight * "
                      "weight_scale).T, 1x128 scales for input, 128x128 for weight, bf16 out.",
       .axes = {var("M", "", 3), cst("N", "n"), cst("K", "k"),
                var("K_div_128", "K // 128 (input block scale dim).", 1),
                var("N_div_128", "N // 128.", 1)},
       .inputs = {T("input", {"M", "K"}).init(e4m3_exact_init("(M, K)", "input")),
                  T("weight", {"N", "K"}).init(e4m3_exact_init("(N, K)", "weight")),
                  T("input_scale", {"M", "K_div_128"})
                      .dt("float32")
                      .opt()
                      .init("torch.rand((M, K // 128), device=device) + 0.5"),
                  T("weight_scale", {"N_div_128", "K_div_128"})
                      .dt("float32")
                      .opt()
                      .init("torch.rand(((N + 127) // 128, K // 128), device=device) + 0.5")},
       .outputs = {T("out", {"M", "N"}).dt("bfloat16")},
       .tags = {"status:verified", "quantization:float8_e4m3fn"},
       .reference = blockscale + R"PY(def run(input, weight, input_scale=None, weight_scale=None):
    a = input.float() if input_scale is None else _dequant(input, input_scale, 1)
    w = weight.float() if weight_scale is None else _dequant(weight, weight_scale, 128)
    return (a @ w.T).to(torch.bfloat16)
)PY"});
  v.push_back(
      {.op = "batch_deepgemm_fp8_nt_groupwise",
       .op_type = "gemm_fp8",
       .name_prefix = "batch_deepgemm_fp8_nt_groupwise",
       .description = "Batched FP8 group-wise GEMM with masked M: out[g, :masked_m[g]] = "
                      "(a * a_scale) @ (b * b_scale).T, 1x128 / 128x128 scales, each read as "
                      "UE8M0 (its power of two rounded down, as DeepGEMM on SM100); rows past "
                      "masked_m[g] are 0 here (the op leaves them undefined).",
       .axes = {var("batch_size", "", 2), var("M_max", "", 4), cst("N", "n"), cst("K", "k"),
                var("K_div_128", "K // 128 (input block scale dim).", 1),
                var("N_div_128", "N // 128.", 1)},
       .inputs = {T("a", {"batch_size", "M_max", "K"})
                      .init(e4m3_exact_init("(batch_size, M_max, K)", "a")),
                  T("b", {"batch_size", "N", "K"}).init(e4m3_exact_init("(batch_size, N, K)", "b")),
                  T("a_scale", {"batch_size", "M_max", "K_div_128"})
                      .synth("float32")
                      .init("torch.rand((batch_size, M_max, K // 128), device=device) + 0.5"),
                  T("b_scale", {"batch_size", "N_div_128", "K_div_128"})
                      .synth("float32")
                      .init("torch.rand((batch_size, (N + 127) // 128, K // 128), "
                            "device=device) + 0.5"),
                  T("masked_m", {"batch_size"})
                      .synth("int32")
                      .init("torch.randint(0, M_max + 1, (batch_size,), dtype=torch.int32)"),
                  S("expected_m", "int32").init("M_max")},
       .outputs = {T("out", {"batch_size", "M_max", "N"}).dt("bfloat16")},
       .tags = {"status:verified", "quantization:float8_e4m3fn"},
       .reference = blockscale + R"PY(def run(a, b, a_scale, b_scale, masked_m, expected_m):
    out = torch.zeros((a.shape[0], a.shape[1], b.shape[1]), dtype=torch.float32)
    ue8m0 = lambda s: torch.exp2(torch.floor(torch.log2(s.float())))
    for g in range(a.shape[0]):
        m = int(masked_m[g])
        x = _dequant(a[g], ue8m0(a_scale[g]), 1)[:m]
        w = _dequant(b[g], ue8m0(b_scale[g]), 128)
        out[g, :m] = x @ w.T
    return out.to(torch.bfloat16)
)PY"});

  // fmha_v2_prefill_deepseek (flashinfer.prefill): fixed-length causal prefill; the definition
  // gives value and out the query's head_dim (upstream's template). The device scale tensors, with
  // the scale_size axis, as upstream's newer template has them (no dtype declared there).
  auto fmha_v2_deepseek_inputs = [] {
    std::vector<Io> in = fmha_v2_bshd_inputs("In-place output buffer.");
    in.push_back(T("scale_bmm1_d", {"scale_size"}).opt());
    in.push_back(T("scale_bmm2_d", {"scale_size"}).opt());
    return in;
  };
  v.push_back({.op = "fmha_v2_prefill_deepseek",
               .op_type = "trtllm_paged",
               .name_prefix = "fmha_v2_prefill_deepseek",
               .description = "DeepSeek FMHAv2 prefill: per request, causal (query i sees keys "
                              "0..i); s = scale_bmm1 * q.k (default 1), out = scale_bmm2 * "
                              "softmax(s) v; scale_softmax changes no value.",
               .axes = {var("batch_size", "", 2), var("seq_len", "", 3), cst("num_heads", "h"),
                        cst("head_dim", "d"), var("scale_size", "Device scale tensors' length.")},
               .inputs = fmha_v2_deepseek_inputs(),
               .outputs = {T("out", kBshd).like("query")},
               .tags = {"status:verified", "stage:prefill", "backend:trtllm"},
               .reference = attend + R"PY(

def run(query, key, value, out, num_heads, head_dim, seq_len, scale_softmax, scale_bmm1=None,
        scale_bmm2=None, scale_bmm1_d=None, scale_bmm2_d=None):
    if scale_bmm1_d is not None or scale_bmm2_d is not None:
        raise NotImplementedError("device scale tensors (scale_bmm1_d / scale_bmm2_d)")
    s1 = 1.0 if scale_bmm1 is None else float(scale_bmm1)
    s2 = 1.0 if scale_bmm2 is None else float(scale_bmm2)
    res = torch.zeros(query.shape[:3] + (value.shape[-1],), dtype=torch.float32)
    for b in range(query.shape[0]):
        res[b], _ = _attend(query[b], key[b], value[b], s1, True)
    return (res * s2).to(query.dtype)
)PY"});

  // trtllm_ragged_attention_deepseek (flashinfer.prefill): ragged q / k / v by cumulative lengths;
  // `batch_size` is both an axis and a scalar input (upstream's template).
  const std::vector<std::string> qtok = {"num_q_tokens", "num_heads", "head_dim"};
  const std::vector<std::string> kvtok = {"num_kv_tokens", "num_heads", "head_dim"};
  const std::string cum_init = "torch.cat([torch.zeros(1, dtype=torch.int32), ";
  v.push_back(
      {.op = "trtllm_ragged_attention_deepseek",
       .op_type = "trtllm_paged",
       .name_prefix = "trtllm_ragged_attention_deepseek",
       .description = "DeepSeek ragged prefill: request b's queries cum_seq_lens_q[b]..[b + 1] "
                      "against its keys cum_seq_lens_kv[b]..[b + 1]; query i of m at position "
                      "n - m + i, causal when is_causal, window_left >= 0 keeping keys j >= "
                      "position - window_left; s = bmm1_scale * q.k, out = bmm2_scale * "
                      "softmax(s) v.",
       .axes = {var("num_q_tokens", "", 4), var("num_kv_tokens", "", 6), cst("num_heads", "h"),
                cst("head_dim", "d"), var("batch_size", "", 2),
                var("batch_size_plus_1", "batch_size + 1.", 3)},
       .inputs = {T("query", qtok), T("key", kvtok), T("value", kvtok),
                  T("workspace_buffer", {"num_q_tokens"}).synth("int8"),
                  T("seq_lens", {"batch_size"})
                      .synth("int32")
                      .init("torch.full((batch_size,), num_kv_tokens // batch_size, "
                            "dtype=torch.int32)"),
                  S("max_q_len", "int32").init("num_q_tokens // batch_size"),
                  S("max_kv_len", "int32").init("num_kv_tokens // batch_size"),
                  S("bmm1_scale", "float32").init("1.0 / math.sqrt(head_dim)"),
                  S("bmm2_scale", "float32").init("1.0"), S("o_sf_scale", "float32").init("1.0"),
                  S("batch_size", "int32").init("batch_size"), S("window_left", "int32").init("-1"),
                  T("cum_seq_lens_q", {"batch_size_plus_1"})
                      .synth("int32")
                      .init("(torch.arange(batch_size + 1) * (num_q_tokens // batch_size))"
                            ".to(torch.int32)"),
                  T("cum_seq_lens_kv", {"batch_size_plus_1"})
                      .synth("int32")
                      .init(cum_init + "seq_lens.cumsum(0).to(torch.int32)])"),
                  S("is_causal", "int32").init("True"), S("return_lse", "int32").init("False")},
       .outputs = {T("output", qtok).like("query")},
       .tags = {"status:verified", "stage:prefill", "backend:trtllm"},
       .reference =
           R"PY(def run(query, key, value, workspace_buffer, seq_lens, max_q_len, max_kv_len,
        bmm1_scale, bmm2_scale, o_sf_scale, batch_size, window_left, cum_seq_lens_q,
        cum_seq_lens_kv, is_causal, return_lse):
    heads = query.shape[1]
    out = torch.zeros(query.shape[:2] + (value.shape[-1],), dtype=torch.float32)
    for b in range(int(batch_size)):
        q0, q1 = int(cum_seq_lens_q[b]), int(cum_seq_lens_q[b + 1])
        k0, k1 = int(cum_seq_lens_kv[b]), int(cum_seq_lens_kv[b + 1])
        m, n = q1 - q0, k1 - k0
        pos = n - m + torch.arange(m).reshape(-1, 1)
        j = torch.arange(n).reshape(1, -1)
        keep = torch.ones((m, n), dtype=torch.bool)
        if is_causal:
            keep &= j <= pos
        if int(window_left) >= 0:
            keep &= j >= pos - int(window_left)
        for h in range(heads):
            s = (query[q0:q1, h].float() @ key[k0:k1, h].float().T) * float(bmm1_scale)
            s = s.masked_fill(~keep, -float("inf"))
            p = torch.nan_to_num(torch.softmax(s, -1))  # a row without keys gives 0
            out[q0:q1, h] = (p @ value[k0:k1, h].float()) * float(bmm2_scale)
    return out.to(query.dtype)
)PY"});

  // trtllm_fmha_v2_prefill (flashinfer.prefill; upstream's template sits in page.py): qkv named
  // as one [num_tokens, num_heads, head_dim] tensor (a packed [tokens, 3, H, D] call reads its
  // dims by position, as upstream's would); the reference takes q = k = v from it, causal.
  const std::vector<std::string> qkv = {"num_tokens", "num_heads", "head_dim"};
  v.push_back({.op = "trtllm_fmha_v2_prefill",
               .op_type = "trtllm_paged",
               .name_prefix = "trtllm_fmha_v2_prefill",
               .description =
                   "TRT-LLM FMHAv2 prefill over variable-length requests (cum_seq_lens_q / "
                   "cum_seq_lens_kv), causal; the definition's single qkv tensor stands for "
                   "q = k = v.",
               .axes = {var("num_tokens", "", 4), cst("num_heads", "h"), cst("head_dim", "d"),
                        var("batch_size", "", 2),
                        var("batch_size_plus_1_q", "batch_size + 1 for cum_seq_lens_q.", 3),
                        var("batch_size_plus_1_kv", "batch_size + 1 for cum_seq_lens_kv.", 3)},
               .inputs = {T("qkv", qkv)
                              .desc("Fused qkv or q tensor (layout determined by "
                                    "input_layout)."),
                          T("seq_lens", {"batch_size"})
                              .synth("int32")
                              .init("torch.full((batch_size,), num_tokens // batch_size, "
                                    "dtype=torch.int32)"),
                          S("max_q_len", "int32").init("num_tokens // batch_size"),
                          S("max_kv_len", "int32").init("num_tokens // batch_size"),
                          S("bmm1_scale", "float32").init("1.0 / math.sqrt(head_dim)"),
                          S("bmm2_scale", "float32").init("1.0"),
                          S("batch_size_scalar", "int32").from("batch_size").init("batch_size"),
                          T("cum_seq_lens_q", {"batch_size_plus_1_q"})
                              .synth("int32")
                              .init(cum_init + "seq_lens.cumsum(0).to(torch.int32)])"),
                          T("cum_seq_lens_kv", {"batch_size_plus_1_kv"})
                              .synth("int32")
                              .init(cum_init + "seq_lens.cumsum(0).to(torch.int32)])")},
               .outputs = {T("output", qkv).like("qkv")},
               .tags = {"status:verified", "stage:prefill", "backend:trtllm"},
               .reference = attend + R"PY(

def run(qkv, seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale, batch_size_scalar,
        cum_seq_lens_q, cum_seq_lens_kv):
    out = torch.zeros(qkv.shape, dtype=torch.float32)
    for b in range(int(batch_size_scalar)):
        q0, q1 = int(cum_seq_lens_q[b]), int(cum_seq_lens_q[b + 1])
        k0, k1 = int(cum_seq_lens_kv[b]), int(cum_seq_lens_kv[b + 1])
        o, _ = _attend(qkv[q0:q1], qkv[k0:k1], qkv[k0:k1], float(bmm1_scale), True)
        out[q0:q1] = o * float(bmm2_scale)
    return out.to(qkv.dtype)
)PY"});
}

// ---------------------------------------------------------------------------------------------
// NVFP4 paged append (flashinfer.page): the schemas of upstream's committed outputs
// nvfp4_quantize_append_paged_kv_cache(_with_slot_mapping)_kv2_d64_pd32_sd4_ps4.json (commits in
// SOURCES.md; their template text is in no stored version). The (k, v) cache and scale-cache
// tuples are named per half; only the NHD layout is established (upstream's files are NHD), so
// kv_layout selects the template and an HND call writes no definition. The references are ours:
// src/kernels/cpu/nvfp4_cpu.cpp's block of 16, sf = e4m3(amax / (6 * scale)),
// q = e2m1(x / (sf * scale)) (nearest, ties to even), the first code in the low nibble.

void add_nvfp4_append_group(std::vector<Template>& v) {
  const std::vector<std::string> kv = {"nnz_kv", "num_kv_heads", "head_dim"};
  const std::vector<std::string> packed = {"num_pages", "page_size", "num_kv_heads",
                                           "packed_head_dim"};
  const std::vector<std::string> scales = {"num_pages", "page_size", "num_kv_heads", "scale_dim"};
  const std::string bytes_init =
      "torch.zeros((num_pages, page_size, num_kv_heads, packed_head_dim), dtype=torch.uint8, "
      "device=device)";
  const auto sf_init = [](const std::string& key) {
    return "torch.zeros((num_pages, page_size, num_kv_heads, scale_dim), device=device).to("
           "{dtype:" +
           key + "})";
  };
  // The four caches, inputs then outputs (updated in place), as upstream's files list them.
  const auto caches_in = [&] {
    return std::vector<Io>{
        T("paged_k_cache", packed).from("paged_kv_cache").item(0).synth("uint8").init(bytes_init),
        T("paged_v_cache", packed).from("paged_kv_cache").item(1).synth("uint8").init(bytes_init),
        T("k_scale_cache", scales)
            .from("kv_cache_sf")
            .item(0)
            .synth("float8_e4m3fn")
            .init(sf_init("k_scale_cache")),
        T("v_scale_cache", scales)
            .from("kv_cache_sf")
            .item(1)
            .synth("float8_e4m3fn")
            .init(sf_init("v_scale_cache"))};
  };
  const std::vector<Io> caches_out = {T("paged_k_cache", packed)
                                          .dt("uint8")
                                          .writes("paged_kv_cache")
                                          .desc("Updated packed K cache (in-place)."),
                                      T("paged_v_cache", packed)
                                          .dt("uint8")
                                          .writes("paged_kv_cache")
                                          .desc("Updated packed V cache (in-place)."),
                                      T("k_scale_cache", scales)
                                          .dt("float8_e4m3fn")
                                          .writes("kv_cache_sf")
                                          .desc("Updated K scale cache (in-place)."),
                                      T("v_scale_cache", scales)
                                          .dt("float8_e4m3fn")
                                          .writes("kv_cache_sf")
                                          .desc("Updated V scale cache (in-place).")};
  const std::vector<Axis> dims = {var("nnz_kv", "Total K/V tokens to append."),
                                  cst("num_kv_heads", "kv"),
                                  cst("head_dim", "d"),
                                  cst("packed_head_dim", "pd"),
                                  cst("scale_dim", "sd"),
                                  var("num_pages"),
                                  cst("page_size", "ps")};
  const std::vector<std::string> shape_rules = {"packed_head_dim * 2 == head_dim",
                                                "scale_dim * 16 == head_dim"};
  // Quantizes [n, heads, dim] rows into (bytes [n, heads, dim / 2], scales [n, heads, dim / 16])
  // and writes row i at (page, entry) of the caches; a float32 scale cache (the stand-in of a
  // torch without float8) receives the scale's value.
  const std::string helpers = std::string(kFp4Quant) + R"PY(

def _quantize(rows, scale):
    n, h, d = rows.shape
    x = rows.float().reshape(n * h, d // 16, 16)
    amax = x.abs().amax(dim=-1)
    s = amax / (6.0 * scale) if scale > 0 else torch.zeros_like(amax)
    sf, sf_bits = _e4m3_rn(s)
    os = torch.where((amax > 0) & (sf > 0), 1.0 / (sf * scale), torch.zeros_like(sf))
    codes = _e2m1_rn(x * os.unsqueeze(-1)).reshape(n * h, d)
    return _pack(codes).reshape(n, h, d // 2), sf.reshape(n, h, -1), sf_bits.reshape(n, h, -1)


def _write(cache, sf_cache, rows, scale, pages, entries):
    q, sf, sf_bits = _quantize(rows, scale)
    for i in range(rows.shape[0]):
        page, entry = int(pages[i]), int(entries[i])
        if page < 0 or page >= cache.shape[0]:
            continue
        cache[page, entry] = q[i]
        sf_cache[page, entry] = sf_bits[i] if sf_cache.dtype == torch.uint8 else sf[i].to(sf_cache.dtype)


def _scale(s):
    return float(s.reshape(-1)[0]) if isinstance(s, torch.Tensor) else float(s)
)PY";

  // Both templates: the dims plus `axes`, append_key / append_value, `before` the caches and
  // `after` them as inputs, the caches as outputs, `rule` and the shape rules, the quantizer, and
  // a reference whose `run` (`run_head`) finds each row's page and entry, then writes K and V.
  const auto push = [&](const char* op, const char* desc, std::vector<Axis> axes,
                        std::vector<Io> before, std::vector<Io> after, const char* rule,
                        const char* run_head) {
    std::vector<Axis> a = dims;
    for (Axis& x : axes) a.push_back(std::move(x));
    std::vector<Io> in = {T("append_key", kv), T("append_value", kv)};
    for (Io& io : before) in.push_back(std::move(io));
    for (Io& io : caches_in()) in.push_back(std::move(io));
    for (Io& io : after) in.push_back(std::move(io));
    std::vector<std::string> c = {rule};
    c.insert(c.end(), shape_rules.begin(), shape_rules.end());
    v.push_back({.op = op,
                 .op_type = "page_append",
                 .name_prefix = op,
                 .description = desc,
                 .axes = std::move(a),
                 .inputs = std::move(in),
                 .outputs = caches_out,
                 .constraints = std::move(c),
                 .tags = {"status:verified"},
                 .reference = helpers + run_head + R"PY(
    _write(paged_k_cache, k_scale_cache, append_key, _scale(k_scale), pages, entries)
    _write(paged_v_cache, v_scale_cache, append_value, _scale(v_scale), pages, entries)
    return paged_k_cache, paged_v_cache, k_scale_cache, v_scale_cache
)PY",
                 .select_param = "kv_layout",
                 .select_strings = {"NHD"},
                 .select_string_default = "NHD"});
  };

  push(
      "nvfp4_quantize_append_paged_kv_cache",
      "Quantize fp16/bf16 K/V rows into an NVFP4 paged KV cache, updating both the packed uint8 "
      "E2M1 cache and the FP8 E4M3 per-block scale cache.",
      {var("batch_size", "", 2), var("batch_size_plus_1", "batch_size + 1.", 3),
       var("num_kv_indices", "Flat length of kv_indices.")},
      append_row_slots(Int32As::kSynth),
      [] {
        std::vector<Io> after = append_page_table(Int32As::kSynth);
        after.push_back(S("k_scale", "float64").init("1.0"));
        after.push_back(S("v_scale", "float64").init("0.5"));
        return after;
      }(),
      "batch_size_plus_1 == batch_size + 1", R"PY(

def run(append_key, append_value, batch_indices, positions, paged_k_cache, paged_v_cache,
        k_scale_cache, v_scale_cache, kv_indices, kv_indptr, kv_last_page_len, k_scale, v_scale):
    ps = paged_k_cache.shape[1]
    pages = [int(kv_indices[int(kv_indptr[int(b)]) + int(p) // ps])
             for b, p in zip(batch_indices, positions)]
    entries = [int(p) % ps for p in positions])PY");

  // _with_slot_mapping: a flat slot per row (page * page_size + entry; negative ones skipped);
  // the scales one-element tensors (upstream's file records them as ["one"] float32).
  Axis one = cst("one", "");
  one.value = 1;
  push("nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
       "Quantize fp16/bf16 K/V rows into an NVFP4 paged KV cache using a flat slot_mapping array. "
       "Negative slots are ignored by the runtime API.",
       {one},
       {T("slot_mapping", {"nnz_kv"})
            .synth("int32")
            .init("torch.arange(nnz_kv, dtype=torch.int32, device=device) % (num_pages * "
                  "page_size)")},
       {T("k_scale", {"one"})
            .dt("float32")
            .synth("float32")
            .init("torch.ones((one,), device=device)"),
        T("v_scale", {"one"})
            .dt("float32")
            .synth("float32")
            .init("torch.full((one,), 0.5, device=device)")},
       "one == 1", R"PY(

def run(append_key, append_value, slot_mapping, paged_k_cache, paged_v_cache, k_scale_cache,
        v_scale_cache, k_scale, v_scale):
    ps = paged_k_cache.shape[1]
    pages = [int(s) // ps if int(s) >= 0 else -1 for s in slot_mapping]
    entries = [int(s) % ps if int(s) >= 0 else 0 for s in slot_mapping])PY");
}

}  // namespace

void add_attention_extra(std::vector<Template>& v) {
  add_attention_group(v);
  add_page_rope_group(v);
  add_gemm_topk_group(v);
  add_more_gemm_prefill_group(v);
  add_nvfp4_append_group(v);
}

}  // namespace flashinfer::trace::detail
