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
#include <sstream>
#include <string>
#include <vector>

#include "chat/smollm.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/gguf.h"
#include "flashinfer/gguf_tokenizer.h"
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
  const auto cmd = "/usr/bin/python3 " FLASHINFER_TEST_SOURCE_DIR
                   "/tests/examples/chat_reference.py '" +
                   flashinfer::gguf::default_model_path() + "' " + ids.str() + " 32 '" +
                   logits_file.string() + "'";
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

}  // namespace
