// A Llama-architecture model read from a GGUF file (SmolLM2-135M-Instruct.Q4_1.gguf by default)
// and its batched generation loop, on flashinfer-cpp's public API only: paged KV cache, batch
// prefill then batch decode wrappers, rmsnorm / fused_add_rmsnorm, RoPE (interleaved pairs),
// mm_gguf on the quantized weights as the file stores them, silu_and_mul, and sampling.
// Shared by examples/chat/chat.cpp, its test and its benchmark.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/gguf.h"

namespace smollm {

/// The architecture, from the GGUF metadata (llama.*).
struct Config {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t num_qo_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  int64_t vocab = 0;
  double rope_theta = 1e4;
  double rms_eps = 1e-5;
  int64_t page_size = 16;
  int64_t workspace_mb = 16;
};

/// One decoder layer. Projections are GGUF blocks as stored ([out_features, row bytes] uint8,
/// mm_gguf's b); q, k and v rows are concatenated into one matrix, and gate and up, so each
/// takes one call. Norm weights are fp32, as stored.
struct Layer {
  flashinfer::Tensor attn_norm, ffn_norm;
  flashinfer::Tensor qkv, o, gate_up, down;
  std::string qkv_type, o_type, gate_up_type, down_type;  // "Q4_1" / "Q8_0"
};

/// Every tensor below except embed_host lives on `device`; on the CPU they are the mapped file's
/// bytes (the norms dequantized), on CUDA copies of them made by load().
struct Model {
  explicit Model(flashinfer::gguf::File f) : file(std::move(f)) {}
  Config config;
  flashinfer::Device device = flashinfer::Device::cpu();
  flashinfer::gguf::File file;  // keeps the mapped weights alive
  flashinfer::Tensor embed;     // token_embd.weight blocks [vocab, row bytes] (also the lm head)
  /// The same blocks in host memory (the mapped file): embedding rows are dequantized there.
  flashinfer::Tensor embed_host;
  std::string embed_type;
  std::vector<Layer> layers;
  flashinfer::Tensor output_norm;  // fp32 [hidden]
};

/// Opens `path` and builds the model on `device` (the CPU, or a CUDA device: every weight is
/// copied there once); throws flashinfer::Error (bad file, no such device) or
/// std::runtime_error (an architecture or tensor type this code does not run).
Model load(const std::string& path, flashinfer::Device device = flashinfer::Device::cpu());

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  bool greedy = true;
  int64_t top_k = 50;
  double top_p = 0.9;
  uint64_t seed = 42;
  std::vector<int32_t> stop_tokens;  // a request ends after emitting one of these
  bool keep_logits = false;          // copy every step's fp32 logits into the result
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> tokens;  // per request, generated tokens (stop included)
  /// When keep_logits: per step, per request still running, its logits (vocab floats).
  std::vector<std::vector<std::vector<float>>> logits;
  int64_t prompt_tokens = 0, decode_steps = 0, decoded_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

/// Called after every sampling step with (request, token).
using TokenCallback = std::function<void(size_t, int32_t)>;

/// Runs the prompts as one batch: one causal prefill over the paged cache (samples each
/// request's first token), then decode steps of one token per running request until each has
/// max_new_tokens or a stop token. Runs on the model's device: on CUDA every tensor of the
/// forward pass (activations, KV caches, workspaces, page tables, positions) is on the GPU and
/// each op runs its CUDA kernel; the host computes only the page tables (uploaded), the
/// embedding rows (dequantized, uploaded) and the greedy argmax (logits read back).
GenerateResult generate(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                        const GenerateOptions& options, const TokenCallback& on_token = {});

}  // namespace smollm
