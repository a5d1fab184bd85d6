// The generation loop of smollm.h. One forward pass over n new tokens, fp32 activations and
// residual stream (with bf16 ones the greedy answer depended on rounding noise: SmolLM2's top
// two first tokens for the France question lie 0.08 apart), fp16 only for q, k, v, the paged
// cache and the attention output (the attention kernels take fp16/bf16):
//   x = embed[tokens] (Q8_0 rows dequantized on the host)
//   per layer: h = rmsnorm(x) (layer 0, residual = x) or fused_add_rmsnorm(x, residual);
//     qkv = mm_gguf(h, W_qkv); RoPE (interleaved pairs: llama.cpp's converter permuted the q/k
//     rows for that) on q, k; k, v appended to the layer's paged cache; o = attention(q, cache);
//     h = mm_gguf(o, W_o); fused_add_rmsnorm(h, residual); x = mm_gguf(silu_and_mul(
//     mm_gguf(h, W_gate_up)), W_down)
//   fused_add_rmsnorm(x, residual, output_norm); logits = mm_gguf(x_last, token_embd, fp32).
// On CUDA (Model::device) all of that runs on the GPU; the host's part is the small index
// arrays (page tables, qo_indptr), the embedding rows and, for greedy, the argmax: each is an
// explicit copy below (docs/CHAT.md lists them).
#include "chat/smollm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace smollm {

using flashinfer::Device;
using flashinfer::DType;
using flashinfer::Tensor;
namespace gguf = flashinfer::gguf;

namespace {

std::string quant_name(const gguf::TensorInfo& t, const std::string& what) {
  const std::string name = gguf::ggml_type_name(t.type);
  if (name != "Q4_1" && name != "Q8_0")
    throw std::runtime_error(what + " (" + t.name + ") is " + name +
                             "; this model code runs Q4_1 and Q8_0 weights");
  return name;
}

// Rows of several matrices of one quantized type, one after the other, as one [rows, bytes]
// tensor (one mm_gguf call instead of several).
Tensor concat_rows(const gguf::File& f, const std::vector<std::string>& names, std::string& type) {
  int64_t rows = 0, row_bytes = -1;
  for (const std::string& n : names) {
    const gguf::TensorInfo& t = f.tensor(n);
    const std::string ty = quant_name(t, n);
    if (row_bytes < 0) {
      type = ty;
      row_bytes = static_cast<int64_t>(t.row_bytes());
    } else if (ty != type || static_cast<int64_t>(t.row_bytes()) != row_bytes) {
      throw std::runtime_error(n + " does not match the type/row length of " + names[0]);
    }
    rows += t.rows();
  }
  Tensor out = Tensor::empty({rows, row_bytes}, DType::kUInt8);
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  for (const std::string& n : names) {
    const std::span<const uint8_t> src = f.raw_data(f.tensor(n));
    std::memcpy(dst, src.data(), src.size());
    dst += src.size();
  }
  return out;
}

Tensor matrix(const gguf::File& f, const std::string& name, std::string& type) {
  const gguf::TensorInfo& t = f.tensor(name);
  type = quant_name(t, name);
  return f.raw_tensor(t);
}

Tensor norm_weight(const gguf::File& f, const std::string& name, int64_t hidden) {
  Tensor w = f.dequantize(name, DType::kFloat32);
  if (w.dim() != 1 || w.size(0) != hidden)
    throw std::runtime_error(name + " is not a [" + std::to_string(hidden) + "] vector");
  return w;
}

// Built on the host, then copied to `dev` (no copy when dev is the CPU).
Tensor int32_tensor(const std::vector<int64_t>& values, Device dev) {
  std::vector<double> v(values.begin(), values.end());
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::kInt32).to(dev);
}

struct PageTable {
  Tensor indptr, indices, last_page_len;
};

// CSR page table of the requests `which`: request b owns pages_of[b] and holds lengths[b] tokens.
PageTable page_table(const std::vector<size_t>& which,
                     const std::vector<std::vector<int64_t>>& pages_of,
                     const std::vector<int64_t>& lengths, int64_t page_size, Device dev) {
  std::vector<int64_t> indptr{0}, indices, last;
  for (size_t b : which) {
    const int64_t used = (lengths[b] + page_size - 1) / page_size;
    for (int64_t p = 0; p < used; ++p) indices.push_back(pages_of[b][static_cast<size_t>(p)]);
    indptr.push_back(static_cast<int64_t>(indices.size()));
    last.push_back(lengths[b] - (used - 1) * page_size);
  }
  return {int32_tensor(indptr, dev), int32_tensor(indices, dev), int32_tensor(last, dev)};
}

// Embedding rows: each token's quantized row dequantized to fp32 on the host (a gather of a few
// rows: no op of ours does it), then copied to the model's device (none on the CPU).
Tensor embed_tokens(const Model& m, const std::vector<int32_t>& tokens) {
  const int64_t hidden = m.config.hidden;
  Tensor x = Tensor::empty({static_cast<int64_t>(tokens.size()), hidden}, DType::kFloat32);
  const auto* base = static_cast<const uint8_t*>(m.embed_host.data_ptr());
  const gguf::GGMLType type = m.file.tensor("token_embd.weight").type;
  auto* dst = static_cast<float*>(x.data_ptr());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= m.config.vocab)
      throw std::out_of_range("token id " + std::to_string(tokens[i]) + " outside the vocabulary");
    gguf::dequantize_row(type, base + tokens[i] * m.embed_host.stride(0),
                         dst + static_cast<int64_t>(i) * hidden, hidden);
  }
  return x.to(m.device);
}

template <class Attend>
Tensor forward(const Model& m, const std::vector<int32_t>& tokens, const Tensor& batch_indices,
               const Tensor& positions, const PageTable& pt, const std::vector<Tensor>& caches,
               Attend&& attend) {
  using namespace flashinfer;
  const Config& c = m.config;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t qd = c.num_qo_heads * c.head_dim, kd = c.num_kv_heads * c.head_dim;
  Tensor x = embed_tokens(m, tokens);
  Tensor residual;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const Layer& L = m.layers[l];
    if (l == 0) {
      residual = x;
      x = rmsnorm(x, L.attn_norm, c.rms_eps);
    } else {
      fused_add_rmsnorm(x, residual, L.attn_norm, c.rms_eps);
    }
    // q, k, v in fp16 for the attention kernels (and the cache); everything else fp32.
    const Tensor qkv = mm_gguf(x, L.qkv, L.qkv_type, std::nullopt, DType::kFloat16);
    const Tensor q = qkv.slice(1, 0, qd).view({n, c.num_qo_heads, c.head_dim});
    const Tensor k = qkv.slice(1, qd, qd + kd).view({n, c.num_kv_heads, c.head_dim});
    const Tensor v = qkv.slice(1, qd + kd, qd + 2 * kd).view({n, c.num_kv_heads, c.head_dim});
    auto [q_rope, k_rope] =
        apply_rope_pos_ids(q, k, positions, std::nullopt, /*interleave=*/true, 1.0, c.rope_theta);
    append_paged_kv_cache(k_rope, v, batch_indices, positions, caches[l], pt.indices, pt.indptr,
                          pt.last_page_len, "NHD");
    const Tensor o = attend(q_rope, caches[l]);
    Tensor h = mm_gguf(o.view({n, qd}), L.o, L.o_type, std::nullopt, DType::kFloat32);
    fused_add_rmsnorm(h, residual, L.ffn_norm, c.rms_eps);
    const Tensor gate_up = mm_gguf(h, L.gate_up, L.gate_up_type, std::nullopt, DType::kFloat32);
    x = mm_gguf(silu_and_mul(gate_up), L.down, L.down_type, std::nullopt, DType::kFloat32);
  }
  fused_add_rmsnorm(x, residual, m.output_norm, c.rms_eps);
  return x;
}

int32_t argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace

Model load(const std::string& path, Device device) {
  if (device.is_cuda() && !flashinfer::op_has_backend("mm_gguf", flashinfer::DeviceType::kCUDA))
    throw std::runtime_error("this build has no CUDA backend (mm_gguf has no CUDA kernel)");
  if (device.is_cuda() && device.index >= flashinfer::cuda_device_count())
    throw std::runtime_error("no CUDA device " + device.str() + " is visible (" +
                             std::to_string(flashinfer::cuda_device_count()) + " visible)");
  Model m(gguf::File::open(path));
  m.device = device;
  const gguf::File& f = m.file;
  const std::string arch = f.get_string("general.architecture");
  if (arch != "llama")
    throw std::runtime_error(path + ": architecture '" + arch + "', this code runs 'llama'");
  Config& c = m.config;
  c.layers = f.get_int("llama.block_count");
  c.hidden = f.get_int("llama.embedding_length");
  c.num_qo_heads = f.get_int("llama.attention.head_count");
  c.num_kv_heads = f.get_int("llama.attention.head_count_kv");
  c.intermediate = f.get_int("llama.feed_forward_length");
  c.rope_theta = f.has("llama.rope.freq_base") ? f.get_float("llama.rope.freq_base") : 1e4;
  c.rms_eps = f.get_float("llama.attention.layer_norm_rms_epsilon");
  if (c.layers < 1 || c.hidden < 1 || c.num_qo_heads < 1 || c.num_kv_heads < 1 ||
      c.hidden % c.num_qo_heads != 0 || c.num_qo_heads % c.num_kv_heads != 0)
    throw std::runtime_error(path + ": inconsistent llama.* sizes");
  c.head_dim = c.hidden / c.num_qo_heads;
  if (f.has("llama.rope.dimension_count") && f.get_int("llama.rope.dimension_count") != c.head_dim)
    throw std::runtime_error(path + ": partial rotary dims are not supported");
  const gguf::TensorInfo& emb = f.tensor("token_embd.weight");
  if (emb.ne.size() != 2 || emb.ne[0] != c.hidden)
    throw std::runtime_error(path + ": token_embd.weight is not [vocab, hidden]");
  c.vocab = emb.ne[1];
  if (f.has_tensor("output.weight"))
    throw std::runtime_error(path + ": a separate output.weight (untied lm head) is not supported");
  m.embed_host = matrix(f, "token_embd.weight", m.embed_type);
  // Weights go to the device once; on the CPU .to() returns the mapped tensor itself.
  m.embed = m.embed_host.to(device);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = norm_weight(f, p + "attn_norm.weight", c.hidden).to(device);
    L.ffn_norm = norm_weight(f, p + "ffn_norm.weight", c.hidden).to(device);
    L.qkv =
        concat_rows(f, {p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"}, L.qkv_type)
            .to(device);
    L.o = matrix(f, p + "attn_output.weight", L.o_type).to(device);
    L.gate_up =
        concat_rows(f, {p + "ffn_gate.weight", p + "ffn_up.weight"}, L.gate_up_type).to(device);
    L.down = matrix(f, p + "ffn_down.weight", L.down_type).to(device);
    const int64_t qkv_rows = (c.num_qo_heads + 2 * c.num_kv_heads) * c.head_dim;
    if (L.qkv.size(0) != qkv_rows || L.gate_up.size(0) != 2 * c.intermediate ||
        L.o.size(0) != c.hidden || L.down.size(0) != c.hidden)
      throw std::runtime_error(path + ": layer " + std::to_string(l) + " has unexpected shapes");
    m.layers.push_back(std::move(L));
  }
  m.output_norm = norm_weight(f, "output_norm.weight", c.hidden).to(device);
  return m;
}

GenerateResult generate(const Model& m, const std::vector<std::vector<int32_t>>& prompts,
                        const GenerateOptions& opt, const TokenCallback& on_token) {
  using namespace flashinfer;
  using Clock = std::chrono::steady_clock;
  const Config& c = m.config;
  const Device dev = m.device;
  if (prompts.empty()) throw std::invalid_argument("generate: no prompts");
  if (opt.max_new_tokens < 1) throw std::invalid_argument("generate: max_new_tokens must be >= 1");
  const size_t batch = prompts.size();

  // Pages: each request reserves what its longest possible length needs.
  std::vector<std::vector<int64_t>> pages_of(batch);
  int64_t total_pages = 0;
  for (size_t b = 0; b < batch; ++b) {
    if (prompts[b].empty()) throw std::invalid_argument("generate: empty prompt");
    const auto final_len = static_cast<int64_t>(prompts[b].size()) + opt.max_new_tokens;
    for (int64_t p = 0; p < (final_len + c.page_size - 1) / c.page_size; ++p)
      pages_of[b].push_back(total_pages++);
  }
  std::vector<Tensor> caches;
  for (int64_t l = 0; l < c.layers; ++l)
    caches.push_back(Tensor::zeros({total_pages, 2, c.page_size, c.num_kv_heads, c.head_dim},
                                   DType::kFloat16, dev));
  // The workspace's device is the wrappers' device.
  const int64_t ws_bytes = c.workspace_mb << 20;
  BatchPrefillWithPagedKVCacheWrapper prefill(Tensor::zeros({ws_bytes}, DType::kUInt8, dev));
  BatchDecodeWithPagedKVCacheWrapper decode(Tensor::zeros({ws_bytes}, DType::kUInt8, dev));

  GenerateResult result;
  result.tokens.resize(batch);
  std::vector<int64_t> lengths(batch);
  std::vector<int32_t> last_token(batch);
  std::vector<bool> done(batch, false);
  int64_t step = 0;

  // Samples the next token of requests `which` from rows `rows` of `hidden`.
  auto sample = [&](const Tensor& hidden, const std::vector<size_t>& which,
                    const std::vector<int64_t>& rows) {
    const auto A = static_cast<int64_t>(which.size());
    Tensor last = hidden;
    if (hidden.size(0) != A) {
      last = Tensor::empty({A, c.hidden}, DType::kFloat32, dev);
      for (int64_t i = 0; i < A; ++i)
        last.select(0, i).copy_(hidden.select(0, rows[static_cast<size_t>(i)]));
    }
    const Tensor logits = mm_gguf(last, m.embed, m.embed_type, std::nullopt, DType::kFloat32);
    // Greedy's argmax and keep_logits read the logits on the host: on CUDA an explicit copy
    // of A x vocab floats (waits for the step), on the CPU the tensor itself.
    Tensor host_logits;
    if (opt.greedy || opt.keep_logits) host_logits = logits.to(Device::cpu());
    const float* lp =
        host_logits.defined() ? static_cast<const float*>(host_logits.data_ptr()) : nullptr;
    std::vector<int32_t> ids(which.size());
    if (opt.greedy) {
      // Greedy is an argmax over the fp32 logits (FlashInfer has no argmax op, and top-k
      // sampling with k = 1 keeps ties).
      for (int64_t i = 0; i < A; ++i)
        ids[static_cast<size_t>(i)] = argmax(lp + i * c.vocab, c.vocab);
    } else {
      const Tensor t = top_k_top_p_sampling_from_logits(
          logits, opt.top_k, opt.top_p, std::nullopt, "top_k_first", /*deterministic=*/true,
          /*check_nan=*/false, static_cast<int64_t>(opt.seed), step * (int64_t{1} << 20));
      const std::vector<double> v = t.to_double_vector();  // the A sampled ids, to the host
      for (size_t i = 0; i < which.size(); ++i) ids[i] = static_cast<int32_t>(v[i]);
    }
    if (opt.keep_logits) {
      std::vector<std::vector<float>> rowsv;
      for (int64_t i = 0; i < A; ++i) rowsv.emplace_back(lp + i * c.vocab, lp + (i + 1) * c.vocab);
      result.logits.push_back(std::move(rowsv));
    }
    ++step;
    for (size_t i = 0; i < which.size(); ++i) {
      const size_t b = which[i];
      last_token[b] = ids[i];
      result.tokens[b].push_back(ids[i]);
      if (on_token) on_token(b, ids[i]);
      const bool stop = std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), ids[i]) !=
                        opt.stop_tokens.end();
      if (stop || static_cast<int64_t>(result.tokens[b].size()) >= opt.max_new_tokens)
        done[b] = true;
    }
  };

  // ---- prefill: every prompt token at once, causal within each request ----
  const auto t0 = Clock::now();
  std::vector<size_t> all(batch);
  std::vector<int32_t> tokens;
  std::vector<int64_t> qo_indptr{0}, last_rows;
  for (size_t b = 0; b < batch; ++b) {
    all[b] = b;
    tokens.insert(tokens.end(), prompts[b].begin(), prompts[b].end());
    lengths[b] = static_cast<int64_t>(prompts[b].size());
    qo_indptr.push_back(qo_indptr.back() + lengths[b]);
    last_rows.push_back(qo_indptr.back() - 1);
  }
  result.prompt_tokens = static_cast<int64_t>(tokens.size());
  {
    const PageTable pt = page_table(all, pages_of, lengths, c.page_size, dev);
    const Tensor qo = int32_tensor(qo_indptr, dev);
    const Tensor seq_lens = get_seq_lens(pt.indptr, pt.last_page_len, c.page_size);
    auto [batch_indices, positions] =
        get_batch_indices_positions(qo, seq_lens, static_cast<int64_t>(tokens.size()));
    PrefillPlanOptions po;
    po.causal = true;
    po.q_data_type = DType::kFloat16;
    prefill.plan(qo, pt.indptr, pt.indices, pt.last_page_len, c.num_qo_heads, c.num_kv_heads,
                 c.head_dim, c.page_size, po);
    const Tensor hidden =
        forward(m, tokens, batch_indices, positions, pt, caches,
                [&](const Tensor& q, const Tensor& cache) { return prefill.run(q, cache); });
    sample(hidden, all, last_rows);
  }
  const auto t1 = Clock::now();

  // ---- decode: one token per running request and step; one plan serves every layer ----
  for (;;) {
    std::vector<size_t> active;
    for (size_t b = 0; b < batch; ++b)
      if (!done[b]) active.push_back(b);
    if (active.empty()) break;
    std::vector<int32_t> step_tokens;
    std::vector<int64_t> append{0}, rows;
    for (size_t b : active) {
      ++lengths[b];
      step_tokens.push_back(last_token[b]);
      append.push_back(static_cast<int64_t>(append.size()));
      rows.push_back(static_cast<int64_t>(rows.size()));
    }
    const auto A = static_cast<int64_t>(active.size());
    const PageTable pt = page_table(active, pages_of, lengths, c.page_size, dev);
    const Tensor seq_lens = get_seq_lens(pt.indptr, pt.last_page_len, c.page_size);
    auto [batch_indices, positions] =
        get_batch_indices_positions(int32_tensor(append, dev), seq_lens, A);
    BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
    po.q_data_type = DType::kFloat16;
    decode.plan(pt.indptr, pt.indices, pt.last_page_len, c.num_qo_heads, c.num_kv_heads, c.head_dim,
                c.page_size, po);
    const Tensor hidden =
        forward(m, step_tokens, batch_indices, positions, pt, caches,
                [&](const Tensor& q, const Tensor& cache) { return decode.run(q, cache); });
    sample(hidden, active, rows);
    ++result.decode_steps;
    result.decoded_tokens += A;
  }
  const auto t2 = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  result.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  return result;
}

}  // namespace smollm
