// The generation loop of llama_model.h. Data flow of one forward pass over n new tokens (bf16
// everywhere; each op rounds once where it writes):
//   x = embed[tokens]; per layer: x = rmsnorm(x) (layer 0, residual = x) or
//   fused_add_rmsnorm(x, residual); qkv = x W_qkv^T; RoPE on q, k; k, v appended to the layer's
//   paged cache; o = attention(q, cache); h = o W_o^T; fused_add_rmsnorm(h, residual);
//   x = silu_and_mul(h W_gu^T) W_down^T. Finally fused_add_rmsnorm(x, residual, final_norm) and
//   the logits of each request's last row, x W_lm^T (fp16).
#include "llama/llama_model.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>

namespace llama {

using flashinfer::Device;
using flashinfer::DType;
using flashinfer::Tensor;

namespace {

// Philox offsets of consecutive sampling steps lie this far apart, so no two steps reuse a
// uniform (one step draws a few per rejection round, far fewer than this).
constexpr int64_t kOffsetStride = 1 << 16;

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("llama config: " + what);
}

// mm_bf16 takes B as [k, n] column-major: the transpose view of an [n, k] row-major weight.
Tensor T(const Tensor& weight) { return weight.transpose(0, 1); }

Tensor int32_tensor(const std::vector<int64_t>& values, Device device) {
  std::vector<double> v(values.begin(), values.end());
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::kInt32).to(device);
}

// A CSR page table: request b owns pages indices[indptr[b] .. indptr[b+1]) and holds
// lengths[b] tokens, the last page filled to last_page_len[b].
struct PageTable {
  Tensor indptr, indices, last_page_len;
};

PageTable page_table(const std::vector<std::vector<int64_t>>& pages_of,
                     const std::vector<int64_t>& lengths, int64_t page_size, Device device) {
  std::vector<int64_t> indptr{0}, indices, last;
  for (size_t b = 0; b < lengths.size(); ++b) {
    const int64_t used = (lengths[b] + page_size - 1) / page_size;
    for (int64_t p = 0; p < used; ++p) indices.push_back(pages_of[b][static_cast<size_t>(p)]);
    indptr.push_back(static_cast<int64_t>(indices.size()));
    last.push_back(lengths[b] == 0 ? 0 : lengths[b] - (used - 1) * page_size);
  }
  return {int32_tensor(indptr, device), int32_tensor(indices, device), int32_tensor(last, device)};
}

// Embedding lookup as a host gather of bf16 rows (no gather op in the library), then one copy.
Tensor embed_tokens(const Tensor& embed, const std::vector<int32_t>& tokens, Device device) {
  const int64_t hidden = embed.size(1);
  const size_t row_bytes = static_cast<size_t>(hidden) * embed.element_size();
  Tensor x = Tensor::empty({static_cast<int64_t>(tokens.size()), hidden}, embed.dtype());
  const auto* src = static_cast<const char*>(embed.data_ptr());
  auto* dst = static_cast<char*>(x.data_ptr());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= embed.size(0))
      throw std::out_of_range("token id " + std::to_string(tokens[i]) + " outside the vocab");
    std::memcpy(dst + i * row_bytes, src + static_cast<size_t>(tokens[i]) * row_bytes, row_bytes);
  }
  return x.to(device);
}

// One forward pass over the new tokens; `attend(q, cache)` is the planned wrapper's run().
template <class Attend>
Tensor forward(const Config& c, const Weights& w, const std::vector<int32_t>& tokens,
               const Tensor& batch_indices, const Tensor& positions, const PageTable& pt,
               const std::vector<Tensor>& caches, Device device, Attend&& attend) {
  using namespace flashinfer;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t qd = c.num_qo_heads * c.head_dim, kd = c.num_kv_heads * c.head_dim;
  Tensor x = embed_tokens(w.embed, tokens, device);
  Tensor residual;
  for (int64_t l = 0; l < c.layers; ++l) {
    const LayerWeights& L = w.layers[static_cast<size_t>(l)];
    if (l == 0) {
      residual = x;
      x = rmsnorm(x, L.input_norm, c.rms_eps);
    } else {
      fused_add_rmsnorm(x, residual, L.input_norm, c.rms_eps);
    }
    const Tensor qkv = mm_bf16(x, T(L.qkv_proj));
    const Tensor q = qkv.slice(1, 0, qd).view({n, c.num_qo_heads, c.head_dim});
    const Tensor k = qkv.slice(1, qd, qd + kd).view({n, c.num_kv_heads, c.head_dim});
    const Tensor v = qkv.slice(1, qd + kd, qd + 2 * kd).view({n, c.num_kv_heads, c.head_dim});
    auto [q_rope, k_rope] =
        apply_rope_pos_ids(q, k, positions, std::nullopt, /*interleave=*/false, 1.0, c.rope_theta);
    const Tensor& cache = caches[static_cast<size_t>(l)];
    append_paged_kv_cache(k_rope, v, batch_indices, positions, cache, pt.indices, pt.indptr,
                          pt.last_page_len, "NHD");
    const Tensor o = attend(q_rope, cache);
    Tensor h = mm_bf16(o.view({n, qd}), T(L.o_proj));
    fused_add_rmsnorm(h, residual, L.post_norm, c.rms_eps);
    const Tensor act = silu_and_mul(mm_bf16(h, T(L.gate_up)));
    x = mm_bf16(act, T(L.down_proj));
  }
  fused_add_rmsnorm(x, residual, w.final_norm, c.rms_eps);
  return x;
}

}  // namespace

void Config::validate() const {
  require(layers >= 1, "layers must be >= 1");
  require(hidden >= 1, "hidden must be >= 1");
  require(num_qo_heads >= 1 && num_kv_heads >= 1, "head counts must be >= 1");
  require(num_qo_heads % num_kv_heads == 0, "num_qo_heads must be a multiple of num_kv_heads");
  require(head_dim == 64 || head_dim == 128 || head_dim == 256,
          "head_dim must be 64, 128 or 256 (the attention kernels' sizes)");
  require(intermediate >= 1, "intermediate must be >= 1");
  require(vocab >= 2, "vocab must be >= 2");
  require(page_size >= 1, "page_size must be >= 1");
  require(rope_theta > 0, "rope_theta must be > 0");
  require(rms_eps > 0, "rms_eps must be > 0");
  require(workspace_mb >= 1, "workspace_mb must be >= 1");
}

Weights make_weights(const Config& c, Device device) {
  c.validate();
  uint64_t seed = c.weight_seed;
  // Each tensor gets its own seed so the weights do not depend on the creation order's length.
  auto proj = [&](int64_t out, int64_t in) {
    Tensor t = Tensor::empty({out, in}, DType::kBFloat16, device);
    t.normal_(seed++, 0.0, 1.0 / std::sqrt(static_cast<double>(in)));
    return t;
  };
  auto norm = [&]() {
    Tensor t = Tensor::empty({c.hidden}, DType::kBFloat16, device);
    t.uniform_(seed++, 0.8, 1.2);
    return t;
  };
  Weights w;
  w.embed = Tensor::empty({c.vocab, c.hidden}, DType::kBFloat16);
  w.embed.normal_(seed++, 0.0, 1.0);
  const int64_t qkv_out = (c.num_qo_heads + 2 * c.num_kv_heads) * c.head_dim;
  for (int64_t l = 0; l < c.layers; ++l) {
    LayerWeights L;
    L.input_norm = norm();
    L.qkv_proj = proj(qkv_out, c.hidden);
    L.o_proj = proj(c.hidden, c.num_qo_heads * c.head_dim);
    L.post_norm = norm();
    L.gate_up = proj(2 * c.intermediate, c.hidden);
    L.down_proj = proj(c.hidden, c.intermediate);
    w.layers.push_back(std::move(L));
  }
  w.final_norm = norm();
  w.lm_head = proj(c.vocab, c.hidden);
  return w;
}

std::vector<std::vector<int32_t>> make_prompts(const std::vector<int64_t>& lengths, int64_t vocab,
                                               uint64_t seed) {
  std::mt19937_64 rng(seed);  // fully specified by the standard: same ids everywhere
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t len : lengths) {
    std::vector<int32_t> p;
    for (int64_t i = 0; i < len; ++i)
      p.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
    prompts.push_back(std::move(p));
  }
  return prompts;
}

GenerateResult generate(const Config& c, const Weights& w,
                        const std::vector<std::vector<int32_t>>& prompts,
                        const GenerateOptions& opt, Device device) {
  using namespace flashinfer;
  using Clock = std::chrono::steady_clock;
  c.validate();
  if (prompts.empty()) throw std::invalid_argument("generate: no prompts");
  if (opt.steps < 0) throw std::invalid_argument("generate: steps must be >= 0");
  const size_t batch = prompts.size();
  const auto B = static_cast<int64_t>(batch);

  // Pages: each request reserves what its final length needs; page ids are dealt out in a
  // seeded shuffled order so a request's pages are scattered through the cache, as in a server.
  std::vector<int64_t> lengths(batch);
  std::vector<std::vector<int64_t>> pages_of(batch);
  int64_t total_pages = 0;
  for (size_t b = 0; b < batch; ++b) {
    if (prompts[b].empty()) throw std::invalid_argument("generate: empty prompt");
    const auto final_len = static_cast<int64_t>(prompts[b].size()) + opt.steps;
    total_pages += (final_len + c.page_size - 1) / c.page_size;
  }
  std::vector<int64_t> order(static_cast<size_t>(total_pages));
  for (int64_t i = 0; i < total_pages; ++i) order[static_cast<size_t>(i)] = i;
  std::mt19937_64 rng(7);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  size_t next_page = 0;
  for (size_t b = 0; b < batch; ++b) {
    const auto final_len = static_cast<int64_t>(prompts[b].size()) + opt.steps;
    for (int64_t p = 0; p < (final_len + c.page_size - 1) / c.page_size; ++p)
      pages_of[b].push_back(order[next_page++]);
  }

  // One cache per layer: [pages, 2 (K, V), page_size, Hkv, D] bf16, NHD.
  std::vector<Tensor> caches;
  for (int64_t l = 0; l < c.layers; ++l)
    caches.push_back(Tensor::zeros({total_pages, 2, c.page_size, c.num_kv_heads, c.head_dim},
                                   DType::kBFloat16, device));

  const int64_t ws_bytes = c.workspace_mb << 20;
  BatchPrefillWithPagedKVCacheWrapper prefill(Tensor::zeros({ws_bytes}, DType::kUInt8, device));
  BatchDecodeWithPagedKVCacheWrapper decode(Tensor::zeros({ws_bytes}, DType::kUInt8, device));

  GenerateResult result;
  result.tokens.resize(batch);
  std::vector<int32_t> last_tokens(batch);

  // Samples one token per request from the logits of `rows` (the last row of each request).
  int64_t sample_step = 0;
  auto sample = [&](const Tensor& hidden, const std::vector<int64_t>& rows) {
    Tensor last = Tensor::empty({B, c.hidden}, DType::kBFloat16, device);
    for (size_t b = 0; b < batch; ++b)
      last.select(0, static_cast<int64_t>(b)).copy_(hidden.select(0, rows[b]));
    // fp16 logits: 3 more mantissa bits than bf16, so close candidates stay distinct.
    const Tensor logits =
        mm_bf16(last, T(w.lm_head), std::nullopt, false, std::nullopt, DType::kFloat16);
    const Tensor ids = top_k_top_p_sampling_from_logits(
        logits, opt.top_k, opt.top_p, std::nullopt, "top_k_first", /*deterministic=*/true,
        /*check_nan=*/false, static_cast<int64_t>(opt.seed), sample_step * kOffsetStride);
    ++sample_step;
    if (opt.keep_logits) result.logits.push_back(logits.to_double_vector());
    const std::vector<double> v = ids.to_double_vector();
    for (size_t b = 0; b < batch; ++b) {
      last_tokens[b] = static_cast<int32_t>(v[b]);
      result.tokens[b].push_back(last_tokens[b]);
    }
  };

  // ---- prefill: every prompt token at once, causal within each request ----
  const auto t0 = Clock::now();
  std::vector<int32_t> tokens;
  std::vector<int64_t> qo_indptr{0}, last_rows;
  for (size_t b = 0; b < batch; ++b) {
    tokens.insert(tokens.end(), prompts[b].begin(), prompts[b].end());
    lengths[b] = static_cast<int64_t>(prompts[b].size());
    qo_indptr.push_back(qo_indptr.back() + lengths[b]);
    last_rows.push_back(qo_indptr.back() - 1);
  }
  {
    const PageTable pt = page_table(pages_of, lengths, c.page_size, device);
    const Tensor qo = int32_tensor(qo_indptr, device);
    const Tensor seq_lens = get_seq_lens(pt.indptr, pt.last_page_len, c.page_size);
    auto [batch_indices, positions] =
        get_batch_indices_positions(qo, seq_lens, static_cast<int64_t>(tokens.size()));
    PrefillPlanOptions po;
    po.causal = true;
    po.q_data_type = DType::kBFloat16;
    prefill.plan(qo, pt.indptr, pt.indices, pt.last_page_len, c.num_qo_heads, c.num_kv_heads,
                 c.head_dim, c.page_size, po);
    const Tensor hidden = forward(
        c, w, tokens, batch_indices, positions, pt, caches, device,
        [&](const Tensor& q, const Tensor& cache) -> Tensor { return prefill.run(q, cache); });
    sample(hidden, last_rows);
  }
  const auto t1 = Clock::now();

  // ---- decode: one new token per request and step; one plan serves every layer ----
  const Tensor append_indptr = [&] {
    std::vector<int64_t> v;
    for (int64_t b = 0; b <= B; ++b) v.push_back(b);
    return int32_tensor(v, device);
  }();
  std::vector<int64_t> rows(batch);
  for (size_t b = 0; b < batch; ++b) rows[b] = static_cast<int64_t>(b);
  for (int64_t s = 0; s < opt.steps; ++s) {
    for (size_t b = 0; b < batch; ++b) ++lengths[b];
    const PageTable pt = page_table(pages_of, lengths, c.page_size, device);
    const Tensor seq_lens = get_seq_lens(pt.indptr, pt.last_page_len, c.page_size);
    auto [batch_indices, positions] = get_batch_indices_positions(append_indptr, seq_lens, B);
    BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
    po.q_data_type = DType::kBFloat16;
    decode.plan(pt.indptr, pt.indices, pt.last_page_len, c.num_qo_heads, c.num_kv_heads, c.head_dim,
                c.page_size, po);
    const Tensor hidden = forward(
        c, w, last_tokens, batch_indices, positions, pt, caches, device,
        [&](const Tensor& q, const Tensor& cache) -> Tensor { return decode.run(q, cache); });
    sample(hidden, rows);
  }
  const auto t2 = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  result.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  return result;
}

}  // namespace llama
