// A small Llama-style model and its batched generation loop, written on flashinfer-cpp's public
// API only: paged KV cache, batch prefill then batch decode, RMSNorm, RoPE, bf16 GEMMs, SwiGLU
// and top-k/top-p sampling. Weights are seeded random numbers (no checkpoint), so the point is
// the serving loop, not the text. Shared by examples/llama_decode.cpp and its test.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace llama {

struct Config {
  int64_t layers = 4;
  int64_t hidden = 512;
  int64_t num_qo_heads = 8;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 64;
  int64_t intermediate = 1408;  // MLP width
  int64_t vocab = 4096;
  int64_t page_size = 16;
  double rope_theta = 1e4;
  double rms_eps = 1e-5;
  uint64_t weight_seed = 1234;
  int64_t workspace_mb = 16;  // float workspace of each attention wrapper

  /// Throws std::invalid_argument naming the first bad field.
  void validate() const;
};

/// One decoder layer; projection weights are [out_features, in_features] bf16 (as a checkpoint
/// stores them), passed to mm_bf16 as their column-major transpose.
struct LayerWeights {
  flashinfer::Tensor input_norm;  // [hidden]
  flashinfer::Tensor qkv_proj;    // [(Hq + 2 Hkv) * D, hidden]: q rows, then k, then v
  flashinfer::Tensor o_proj;      // [hidden, Hq * D]
  flashinfer::Tensor post_norm;   // [hidden]
  flashinfer::Tensor gate_up;     // [2 * intermediate, hidden]: gate rows, then up
  flashinfer::Tensor down_proj;   // [hidden, intermediate]
};

struct Weights {
  flashinfer::Tensor embed;  // [vocab, hidden] bf16 on the host (the lookup is a host gather)
  std::vector<LayerWeights> layers;
  flashinfer::Tensor final_norm;  // [hidden]
  flashinfer::Tensor lm_head;     // [vocab, hidden]
};

/// Seeded random bf16 weights on `device`, scaled so activations stay O(1): projections
/// N(0, 1/in_features), embeddings N(0, 1), norm weights uniform in [0.8, 1.2).
Weights make_weights(const Config& config, flashinfer::Device device);

/// Prompts of the given lengths with token ids uniform in [0, vocab), from `seed`.
std::vector<std::vector<int32_t>> make_prompts(const std::vector<int64_t>& lengths, int64_t vocab,
                                               uint64_t seed);

struct GenerateOptions {
  int64_t steps = 16;  // decode steps after the prefill
  int64_t top_k = 50;
  double top_p = 0.9;
  uint64_t seed = 42;        // sampling seed; sampling step s uses Philox offset s * 2^16
  bool keep_logits = false;  // copy every step's logits to the result (for tests)
};

struct GenerateResult {
  /// Per request: the generated tokens, 1 from the prefill then 1 per decode step.
  std::vector<std::vector<int32_t>> tokens;
  /// When keep_logits: per sampling step (prefill first), [batch * vocab] row-major.
  std::vector<std::vector<double>> logits;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

/// Runs the prompts as one batch: a causal prefill over the paged cache, which samples each
/// request's first token, then `steps` decode steps of one token per request. Every tensor
/// lives on `device`; the weights must be there too (make_weights(config, device)).
GenerateResult generate(const Config& config, const Weights& weights,
                        const std::vector<std::vector<int32_t>>& prompts,
                        const GenerateOptions& options, flashinfer::Device device);

}  // namespace llama
