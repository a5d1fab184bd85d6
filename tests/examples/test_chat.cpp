// examples/chat on the real model (SmolLM2-135M-Instruct.Q4_1.gguf, fetched by
// scripts/bootstrap): the prefill's logits and 32 greedy tokens against an independent PyTorch
// implementation of the same weights (tests/examples/chat_reference.py, dequantized as the
// `gguf` package does), the answer to a question checked as text, and a batch against single
// runs.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "chat/smollm.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/gguf.h"
#include "flashinfer/gguf_tokenizer.h"
#include "util/gguf_builder.h"
#include "util/run_command.h"

namespace {

namespace fs = std::filesystem;

// "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging
// Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n
// <|im_start|>assistant\n" as the `tokenizers` package's byte-level BPE over the file's
// vocabulary and merges encodes it (the model's chat template).
const std::vector<int32_t> kFrancePrompt = {
    1,   9690, 198, 2683, 359,   253,  5356, 5646, 11173, 3365, 3511, 308,  34519,
    28,  7018, 411, 407,  19712, 8182, 2,    198,  1,     4093, 198,  1780, 314,
    260, 3575, 282, 4649, 47,    2,    198,  1,    520,   9531, 198};

smollm::Model* model() {
  static std::unique_ptr<smollm::Model> m = [] {
    // One thread: ctest runs tests side by side, and an OpenMP team whose second thread lost
    // its core waits a scheduler slice at every region (see docs/PERFORMANCE.md).
    omp_set_num_threads(1);
    const std::string path = flashinfer::gguf::default_model_path();
    if (!fs::exists(path)) return std::unique_ptr<smollm::Model>();
    return std::make_unique<smollm::Model>(smollm::load(path));
  }();
  return m.get();
}

#define REQUIRE_MODEL()                                                    \
  if (model() == nullptr)                                                  \
  GTEST_SKIP() << "no model at " << flashinfer::gguf::default_model_path() \
               << " (scripts/bootstrap fetches it)"

std::string text_of(const std::vector<int32_t>& ids) {
  static const flashinfer::gguf::Tokenizer tok(model()->file);
  return tok.decode(ids, /*skip_special=*/true);
}

TEST(Chat, ConfigComesFromTheFile) {
  REQUIRE_MODEL();
  const smollm::Config& c = model()->config;
  EXPECT_EQ(c.layers, 30);
  EXPECT_EQ(c.hidden, 576);
  EXPECT_EQ(c.num_qo_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate, 1536);
  EXPECT_EQ(c.vocab, 49152);
  EXPECT_EQ(c.rope_theta, 1e5);
  EXPECT_NEAR(c.rms_eps, 1e-5, 1e-12);
  EXPECT_EQ(model()->embed_type, "Q8_0");
  EXPECT_EQ(model()->layers[0].qkv_type, "Q4_1");
  EXPECT_EQ(text_of({4093, 198}), "user\n");
}

TEST(Chat, LogitsAndGreedyTokensMatchPyTorch) {
  REQUIRE_MODEL();
  smollm::GenerateOptions o;
  o.max_new_tokens = 32;
  o.keep_logits = true;
  const smollm::GenerateResult r = smollm::generate(*model(), {kFrancePrompt}, o);
  ASSERT_EQ(r.tokens[0].size(), 32u);

  const fs::path logits_file =
      fs::temp_directory_path() / ("chat_ref_logits_" + std::to_string(::getpid()) + ".f32");
  std::ostringstream ids;
  for (size_t i = 0; i < kFrancePrompt.size(); ++i) ids << (i ? "," : "") << kFrancePrompt[i];
  const auto cmd = "/usr/bin/python3 " + FLASHINFER_TEST_SOURCE_DIR +
                   "/tests/examples/chat_reference.py '" + flashinfer::gguf::default_model_path() +
                   "' " + ids.str() + " 32 '" + logits_file.string() + "'";
  const flashinfer::testing::CommandResult ref = flashinfer::testing::run_command(cmd);
  ASSERT_EQ(ref.status, 0) << ref.out;
  // The last line is the JSON list of greedy tokens.
  std::string last = ref.out.substr(ref.out.find_last_of('[', ref.out.size()));
  std::vector<int32_t> ref_tokens;
  for (char& ch : last)
    if (ch == '[' || ch == ']' || ch == ',') ch = ' ';
  std::istringstream in(last);
  for (int32_t t; in >> t;) ref_tokens.push_back(t);
  EXPECT_EQ(r.tokens[0], ref_tokens)
      << "ours: " << text_of(r.tokens[0]) << "\nPyTorch: " << text_of(ref_tokens);

  std::vector<float> ref_logits(static_cast<size_t>(model()->config.vocab));
  std::ifstream lf(logits_file, std::ios::binary);
  lf.read(reinterpret_cast<char*>(ref_logits.data()),
          static_cast<std::streamsize>(ref_logits.size() * sizeof(float)));
  ASSERT_TRUE(lf.good()) << "short logits file " << logits_file;
  fs::remove(logits_file);
  const std::vector<float>& ours = r.logits[0][0];
  // The two sides round q, k, v and the attention output to fp16 at the same points and sum in
  // different orders (everything else is fp32).
  double max_err = 0, sum_err = 0, max_ref = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const double e = std::abs(static_cast<double>(ours[i]) - ref_logits[i]);
    max_err = std::max(max_err, e);
    sum_err += e;
    max_ref = std::max(max_ref, std::abs(static_cast<double>(ref_logits[i])));
  }
  const double mean_err = sum_err / static_cast<double>(ours.size());
  // Measured here: max 0.022 and mean 0.011 at max |ref| 25.3; the bounds are about twice that.
  EXPECT_LT(max_err, 0.002 * max_ref) << "max |ref| " << max_ref;
  EXPECT_LT(mean_err, 0.001 * max_ref) << "max |ref| " << max_ref;
  std::printf("logits vs PyTorch: max |diff| %.4f, mean %.5f, max |logit| %.3f\n", max_err,
              mean_err, max_ref);
  EXPECT_EQ(std::max_element(ours.begin(), ours.end()) - ours.begin(),
            std::max_element(ref_logits.begin(), ref_logits.end()) - ref_logits.begin());
}

TEST(Chat, AnswersTheCapitalOfFrance) {
  REQUIRE_MODEL();
  smollm::GenerateOptions o;
  o.max_new_tokens = 24;
  o.stop_tokens = {2};  // <|im_end|>
  const smollm::GenerateResult r = smollm::generate(*model(), {kFrancePrompt}, o);
  const std::string answer = text_of(r.tokens[0]);
  EXPECT_NE(answer.find("Paris"), std::string::npos) << answer;
}

TEST(Chat, ABatchGivesEachRequestItsSingleRunTokens) {
  REQUIRE_MODEL();
  // The France prompt and a shorter one (its first 21 tokens: the system turn), batched, then
  // each alone: every op treats rows independently, so the tokens are the same.
  const std::vector<int32_t> other(kFrancePrompt.begin(), kFrancePrompt.begin() + 21);
  smollm::GenerateOptions o;
  o.max_new_tokens = 6;
  const auto both = smollm::generate(*model(), {kFrancePrompt, other}, o);
  EXPECT_EQ(both.tokens[0], smollm::generate(*model(), {kFrancePrompt}, o).tokens[0]);
  EXPECT_EQ(both.tokens[1], smollm::generate(*model(), {other}, o).tokens[0]);
  // A stop token ends the request that emits it, after that token; the others go on.
  o.stop_tokens = {both.tokens[1][1]};
  const auto stopped = smollm::generate(*model(), {kFrancePrompt, other}, o);
  for (size_t b = 0; b < 2; ++b) {
    const auto& t = both.tokens[b];
    const auto end = std::find(t.begin(), t.end(), o.stop_tokens[0]);
    const std::vector<int32_t> expect(t.begin(), end == t.end() ? end : end + 1);
    EXPECT_EQ(stopped.tokens[b], expect) << "request " << b;
  }
  EXPECT_LE(stopped.tokens[1].size(), 2u);
}

TEST(Chat, BadInput) {
  EXPECT_THROW(smollm::load("/nonexistent/model.gguf"), flashinfer::Error);
  REQUIRE_MODEL();
  EXPECT_THROW(smollm::generate(*model(), {}, {}), std::invalid_argument);
  EXPECT_THROW(smollm::generate(*model(), {{}}, {}), std::invalid_argument);
  EXPECT_THROW(smollm::generate(*model(), {{1, 49152}}, {}), std::out_of_range);
}

// ---- --device cuda (compiled here, never run on a machine without a GPU) ----

TEST(Chat, CudaWithoutAGpuIsAClearError) {
  if (flashinfer::cuda_compiled() && flashinfer::cuda_device_count() > 0)
    GTEST_SKIP() << "a GPU is present: ChatCuda.* runs the model there";
  const std::string path = model() ? flashinfer::gguf::default_model_path() : "/nonexistent.gguf";
  try {
    smollm::load(path, flashinfer::Device::cuda(0));
    ADD_FAILURE() << "load on cuda:0 without a GPU did not throw";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("no CUDA backend") != std::string::npos ||
                what.find("no CUDA device") != std::string::npos)
        << what;
  }
}

// A tiny Llama with random weights written as a GGUF file (tests/util/gguf_builder.h): 2
// layers, hidden 128, 2 query heads and 1 KV head of dim 64, FFN 96, vocabulary 200; Q4_1
// projections, a Q8_0 tied embedding, F32 norms, as SmolLM2's file. It needs no download, so
// the CUDA comparison below runs on any machine with a GPU (the real model's 98 MB cannot be
// carried to the device machines).
class TinyModelFile {
 public:
  TinyModelFile() {
    using B = flashinfer::testing::GgufBuilder;
    const uint64_t H = 128, I = 96, V = 200, layers = 2;
    std::mt19937_64 rng(2024);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    auto half = [](float v) { return B::le(flashinfer::float_to_half_bits(v), 2); };
    auto q4_1 = [&](uint64_t rows, uint64_t cols) {  // centred codes: w ~ d (q - 7.5)
      std::string bytes;
      for (uint64_t b = 0; b < rows * cols / 32; ++b) {
        const float d = 0.02f + 0.04f * u(rng);
        bytes += half(d) + half(-7.5f * d);
        for (int j = 0; j < 16; ++j) bytes.push_back(static_cast<char>(rng()));
      }
      return bytes;
    };
    auto q8_0 = [&](uint64_t rows, uint64_t cols) {
      std::string bytes;
      for (uint64_t b = 0; b < rows * cols / 32; ++b) {
        bytes += half(0.01f + 0.02f * u(rng));
        for (int j = 0; j < 32; ++j) bytes.push_back(static_cast<char>(rng()));
      }
      return bytes;
    };
    auto f32s = [&](uint64_t n) {
      std::string bytes;
      for (uint64_t i = 0; i < n; ++i) bytes += B::f32(0.8f + 0.4f * u(rng));
      return bytes;
    };
    B g;
    g.kv("general.architecture", B::kString, B::str("llama"))
        .kv("llama.block_count", B::kU32, B::u32(static_cast<uint32_t>(layers)))
        .kv("llama.embedding_length", B::kU32, B::u32(static_cast<uint32_t>(H)))
        .kv("llama.attention.head_count", B::kU32, B::u32(2))
        .kv("llama.attention.head_count_kv", B::kU32, B::u32(1))
        .kv("llama.feed_forward_length", B::kU32, B::u32(static_cast<uint32_t>(I)))
        .kv("llama.rope.freq_base", B::kF32, B::f32(1e4f))
        .kv("llama.attention.layer_norm_rms_epsilon", B::kF32, B::f32(1e-5f));
    constexpr uint32_t kF32 = 0, kQ4_1 = 3, kQ8_0 = 8;  // GGML type ids
    g.tensor("token_embd.weight", {H, V}, kQ8_0, q8_0(V, H));
    for (uint64_t l = 0; l < layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      g.tensor(p + "attn_norm.weight", {H}, kF32, f32s(H))
          .tensor(p + "ffn_norm.weight", {H}, kF32, f32s(H))
          .tensor(p + "attn_q.weight", {H, 128}, kQ4_1, q4_1(128, H))
          .tensor(p + "attn_k.weight", {H, 64}, kQ4_1, q4_1(64, H))
          .tensor(p + "attn_v.weight", {H, 64}, kQ4_1, q4_1(64, H))
          .tensor(p + "attn_output.weight", {H, H}, kQ4_1, q4_1(H, H))
          .tensor(p + "ffn_gate.weight", {H, I}, kQ4_1, q4_1(I, H))
          .tensor(p + "ffn_up.weight", {H, I}, kQ4_1, q4_1(I, H))
          .tensor(p + "ffn_down.weight", {I, H}, kQ4_1, q4_1(H, I));
    }
    g.tensor("output_norm.weight", {H}, kF32, f32s(H));
    path_ = fs::temp_directory_path() / ("chat_tiny_" + std::to_string(::getpid()) + ".gguf");
    std::ofstream(path_, std::ios::binary) << g.build();
  }
  ~TinyModelFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

// Two requests (5 and 19 prompt tokens: the second spans two pages of 16) of the tiny model.
const std::vector<std::vector<int32_t>> kTinyPrompts = {
    {1, 17, 42, 99, 150},
    {3, 5, 8, 13, 21, 34, 55, 89, 144, 7, 11, 19, 23, 29, 31, 37, 41, 43, 47}};

TEST(Chat, TinyRandomModelRunsOnTheCpu) {
  const TinyModelFile file;
  smollm::Model m = smollm::load(file.path());
  m.config.workspace_mb = 1;  // plenty at this size; zeroing 16 MiB per run dominated the test
  EXPECT_EQ(m.config.layers, 2);
  EXPECT_EQ(m.config.head_dim, 64);
  EXPECT_EQ(m.config.vocab, 200);
  smollm::GenerateOptions o;
  o.max_new_tokens = 5;
  o.keep_logits = true;
  const smollm::GenerateResult r = smollm::generate(m, kTinyPrompts, o);
  ASSERT_EQ(r.tokens.size(), 2u);
  for (const auto& t : r.tokens) ASSERT_EQ(t.size(), 5u);
  ASSERT_EQ(r.logits.size(), 5u);
  for (const auto& step : r.logits)
    for (const auto& row : step)
      for (float v : row) ASSERT_TRUE(std::isfinite(v));
  // Each request alone gives its batched tokens.
  for (size_t b = 0; b < 2; ++b)
    EXPECT_EQ(smollm::generate(m, {kTinyPrompts[b]}, o).tokens[0], r.tokens[b]) << b;
}

// The model on cuda:0, loaded once (the weights copied there).
smollm::Model* cuda_model() {
  static std::unique_ptr<smollm::Model> m = [] {
    if (model() == nullptr || !flashinfer::cuda_compiled() || flashinfer::cuda_device_count() == 0)
      return std::unique_ptr<smollm::Model>();
    return std::make_unique<smollm::Model>(
        smollm::load(flashinfer::gguf::default_model_path(), flashinfer::Device::cuda(0)));
  }();
  return m.get();
}

#define REQUIRE_CUDA_MODEL()                                                                     \
  REQUIRE_MODEL();                                                                               \
  if (!flashinfer::cuda_compiled()) GTEST_SKIP() << "CUDA half skipped: this build has no CUDA"; \
  if (flashinfer::cuda_device_count() == 0)                                                      \
  GTEST_SKIP() << "CUDA half skipped: no CUDA device is visible"

// Every weight of the CUDA model is on the GPU (the embedding's host copy apart).
TEST(ChatCuda, WeightsLiveOnTheDevice) {
  REQUIRE_CUDA_MODEL();
  const smollm::Model& m = *cuda_model();
  const flashinfer::Device dev = flashinfer::Device::cuda(0);
  EXPECT_EQ(m.device, dev);
  EXPECT_EQ(m.embed.device(), dev);
  EXPECT_TRUE(m.embed_host.device().is_cpu());
  EXPECT_EQ(m.output_norm.device(), dev);
  for (const smollm::Layer& L : m.layers)
    for (const flashinfer::Tensor* t :
         {&L.attn_norm, &L.ffn_norm, &L.qkv, &L.o, &L.gate_up, &L.down})
      EXPECT_EQ(t->device(), dev);
}

// The France prompt, 32 greedy tokens, on cuda:0 and on the CPU. The two differ only in the
// order of fp32 sums (and so in where fp16 roundings of q, k, v and the attention output fall),
// so each step's logits must agree within the bound LogitsAndGreedyTokensMatchPyTorch holds the
// CPU to against PyTorch (max 0.002, mean 0.001 of max |logit|: 0.05 and 0.025 here), and the
// 32 tokens must be the same, as they are against PyTorch with errors of that size (measured
// 0.016-0.022; the closest call, the first token, has its two best logits 0.08 apart). On a
// divergence the message gives the CPU's top-two margin at that step, to tell a near-tie from
// a bug. The answer text must name Paris.
TEST(ChatCuda, GreedyMatchesTheCpu) {
  REQUIRE_CUDA_MODEL();
  smollm::GenerateOptions o;
  o.max_new_tokens = 32;
  o.keep_logits = true;
  const smollm::GenerateResult cpu = smollm::generate(*model(), {kFrancePrompt}, o);
  const smollm::GenerateResult gpu = smollm::generate(*cuda_model(), {kFrancePrompt}, o);
  ASSERT_EQ(gpu.tokens[0].size(), 32u);
  ASSERT_EQ(gpu.logits.size(), cpu.logits.size());
  size_t same = 0;
  for (size_t step = 0; step < cpu.tokens[0].size(); ++step) {
    const std::vector<float>& r = cpu.logits[step][0];
    const std::vector<float>& g = gpu.logits[step][0];
    ASSERT_EQ(g.size(), r.size());
    double max_err = 0, sum_err = 0, max_ref = 0, top1 = -1e30, top2 = -1e30;
    for (size_t i = 0; i < r.size(); ++i) {
      const double e = std::abs(static_cast<double>(g[i]) - r[i]);
      max_err = std::max(max_err, e);
      sum_err += e;
      max_ref = std::max(max_ref, std::abs(static_cast<double>(r[i])));
      if (r[i] > top1) {
        top2 = top1;
        top1 = r[i];
      } else if (r[i] > top2) {
        top2 = r[i];
      }
    }
    EXPECT_LT(max_err, 0.002 * max_ref) << "step " << step;
    EXPECT_LT(sum_err / static_cast<double>(r.size()), 0.001 * max_ref) << "step " << step;
    if (step == 0)
      std::printf("prefill logits, cuda vs cpu: max |diff| %.4f, mean %.5f, max |logit| %.3f\n",
                  max_err, sum_err / static_cast<double>(r.size()), max_ref);
    if (gpu.tokens[0][step] != cpu.tokens[0][step]) {
      ADD_FAILURE() << "step " << step << ": cuda picked " << gpu.tokens[0][step] << ", cpu "
                    << cpu.tokens[0][step] << "; the CPU's top two logits are " << top1 - top2
                    << " apart, max |diff| this step " << max_err;
      break;  // the two runs continue from different tokens
    }
    ++same;
  }
  std::printf("cuda and cpu agree on %zu of %zu greedy tokens\n", same, cpu.tokens[0].size());
  EXPECT_EQ(gpu.tokens[0], cpu.tokens[0])
      << "cpu: " << text_of(cpu.tokens[0]) << "\ncuda: " << text_of(gpu.tokens[0]);
  o.keep_logits = false;
  o.max_new_tokens = 24;
  o.stop_tokens = {2};  // <|im_end|>
  const std::string answer = text_of(smollm::generate(*cuda_model(), {kFrancePrompt}, o).tokens[0]);
  EXPECT_NE(answer.find("Paris"), std::string::npos) << answer;
}

// A batch of two on the GPU gives each request its single-run tokens (every op treats rows
// independently there too), and top-k/top-p sampling (the CUDA sampler, ids read back) runs and
// stops at max_new_tokens.
TEST(ChatCuda, BatchAndSampling) {
  REQUIRE_CUDA_MODEL();
  const std::vector<int32_t> other(kFrancePrompt.begin(), kFrancePrompt.begin() + 21);
  smollm::GenerateOptions o;
  o.max_new_tokens = 6;
  const auto both = smollm::generate(*cuda_model(), {kFrancePrompt, other}, o);
  EXPECT_EQ(both.tokens[0], smollm::generate(*cuda_model(), {kFrancePrompt}, o).tokens[0]);
  EXPECT_EQ(both.tokens[1], smollm::generate(*cuda_model(), {other}, o).tokens[0]);
  o.greedy = false;
  const auto sampled = smollm::generate(*cuda_model(), {kFrancePrompt, other}, o);
  for (const auto& t : sampled.tokens) {
    EXPECT_EQ(t.size(), 6u);
    for (int32_t id : t) EXPECT_TRUE(id >= 0 && id < model()->config.vocab) << id;
  }
}

// The tiny random model on cuda:0 against the CPU: needs a GPU, not the real model file. Each
// step's logits within 1% of the largest (fp32 sums in another order, and fp16 roundings of
// q, k, v and the attention output that may fall one ulp apart, through 2 layers; a wrong
// kernel is off by O(1)), and the greedy tokens the same up to any step where the CPU's top two
// logits are within twice that bound (random weights make near-ties likelier than the real
// model's).
TEST(ChatCuda, TinyRandomModelMatchesTheCpu) {
  if (!flashinfer::cuda_compiled()) GTEST_SKIP() << "CUDA half skipped: this build has no CUDA";
  if (flashinfer::cuda_device_count() == 0)
    GTEST_SKIP() << "CUDA half skipped: no CUDA device is visible";
  const TinyModelFile file;
  smollm::Model cpu_m = smollm::load(file.path());
  smollm::Model gpu_m = smollm::load(file.path(), flashinfer::Device::cuda(0));
  cpu_m.config.workspace_mb = gpu_m.config.workspace_mb = 1;
  smollm::GenerateOptions o;
  o.max_new_tokens = 8;
  o.keep_logits = true;
  const smollm::GenerateResult cpu = smollm::generate(cpu_m, kTinyPrompts, o);
  const smollm::GenerateResult gpu = smollm::generate(gpu_m, kTinyPrompts, o);
  ASSERT_EQ(gpu.tokens.size(), 2u);
  for (size_t b = 0; b < 2; ++b) {
    ASSERT_EQ(gpu.tokens[b].size(), 8u);
    for (size_t step = 0; step < 8; ++step) {
      // Both requests run every step (no stop token), so row b of each step is request b.
      const std::vector<float>& r = cpu.logits[step][b];
      const std::vector<float>& g = gpu.logits[step][b];
      ASSERT_EQ(g.size(), r.size());
      double max_err = 0, max_ref = 0, top1 = -1e30, top2 = -1e30;
      for (size_t i = 0; i < r.size(); ++i) {
        max_err = std::max(max_err, std::abs(static_cast<double>(g[i]) - r[i]));
        max_ref = std::max(max_ref, std::abs(static_cast<double>(r[i])));
        if (r[i] > top1) {
          top2 = top1;
          top1 = r[i];
        } else if (r[i] > top2) {
          top2 = r[i];
        }
      }
      const double bound = 0.01 * std::max(1.0, max_ref);
      EXPECT_LT(max_err, bound) << "request " << b << " step " << step;
      if (gpu.tokens[b][step] != cpu.tokens[b][step]) {
        EXPECT_LT(top1 - top2, 2 * bound)
            << "request " << b << " step " << step << ": tokens differ, CPU top two " << top1 - top2
            << " apart";
        break;  // the runs go on from different tokens
      }
    }
  }
}

}  // namespace
