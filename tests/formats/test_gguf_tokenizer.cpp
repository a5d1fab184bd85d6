// The GGUF tokenizer (flashinfer/gguf_tokenizer.h): byte-level BPE on small synthetic
// vocabularies with hand-checked results, bad tokenizer metadata, and the real model's
// tokenizer against the `tokenizers` PyPI package built from the same vocabulary and merges.
#include "flashinfer/gguf_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "flashinfer/error.h"
#include "util/gguf_builder.h"
#include "util/run_command.h"

namespace {

using flashinfer::Error;
using flashinfer::ErrorCode;
using flashinfer::gguf::ChatMessage;
using flashinfer::gguf::File;
using flashinfer::gguf::StreamDecoder;
using flashinfer::gguf::Tokenizer;
using B = flashinfer::testing::GgufBuilder;
namespace fs = std::filesystem;

// GPT-2's byte-level character of byte `b`, as UTF-8.
std::string byte_char(int b) {
  int cp = b;
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  if (!printable) {
    int n = 0;
    for (int k = 0; k < b; ++k) {
      if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE)) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::string string_array(const std::vector<std::string>& v) {
  std::string e;
  for (const auto& s : v) e += B::str(s);
  return B::array(B::kString, v.size(), e);
}

std::string i32_array(const std::vector<int32_t>& v) {
  std::string e;
  for (int32_t x : v) e += B::u32(static_cast<uint32_t>(x));
  return B::array(B::kI32, v.size(), e);
}

// Vocabulary: 0 "<|im_start|>", 1 "<|im_end|>" (control), then the 256 byte characters
// (ids 2..257), then the merged tokens in merge order.
struct Synth {
  std::vector<std::string> tokens = {"<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> types = {3, 3};
  std::vector<std::string> merges;
  std::string pre = "smollm";
  std::string model = "gpt2";
  std::string chat_template =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
      "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
      "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  Synth() {
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(byte_char(b));
      types.push_back(1);
    }
  }
  void merge(const std::string& a, const std::string& b) {
    merges.push_back(a + " " + b);
    tokens.push_back(a + b);
    types.push_back(1);
  }
  int32_t id(const std::string& t) const {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == t) return static_cast<int32_t>(i);
    }
    return -1;
  }
  File file() const {
    B b;
    b.kv("tokenizer.ggml.model", B::kString, B::str(model))
        .kv("tokenizer.ggml.pre", B::kString, B::str(pre))
        .kv("tokenizer.ggml.tokens", B::kArray, string_array(tokens))
        .kv("tokenizer.ggml.token_type", B::kArray, i32_array(types))
        .kv("tokenizer.ggml.merges", B::kArray, string_array(merges))
        .kv("tokenizer.ggml.eos_token_id", B::kU32, B::u32(1))
        .kv("tokenizer.chat_template", B::kString, B::str(chat_template));
    return File::from_bytes(b.build(), "tok.gguf");
  }
};

Synth hello_vocab() {
  Synth s;
  s.merge("l", "l");         // rank 0
  s.merge("h", "e");         // rank 1
  s.merge("ll", "o");        // rank 2
  s.merge("he", "llo");      // rank 3
  s.merge("\xc4\xa0", "w");  // "Ġw", rank 4
  s.merge("a", "a");         // rank 5
  return s;
}

TEST(GgufTokenizer, BpeMergesByRank) {
  const Synth s = hello_vocab();
  const Tokenizer t(s.file());
  EXPECT_EQ(t.vocab_size(), 2 + 256 + 6);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_EQ(t.end_of_turn_id(), 1);
  EXPECT_EQ(t.encode("hello"), (std::vector<int32_t>{s.id("hello")}));
  // "helo": "he" (rank 1) then nothing merges "l" "o".
  EXPECT_EQ(t.encode("helo"), (std::vector<int32_t>{s.id("he"), s.id("l"), s.id("o")}));
  // The space joins the next word ("Ġw" merge), then the rest stays bytes.
  EXPECT_EQ(t.encode("hello wo"),
            (std::vector<int32_t>{s.id("hello"), s.id("\xc4\xa0w"), s.id("o")}));
  // Equal ranks merge leftmost first: "aaa" -> "aa" "a".
  EXPECT_EQ(t.encode("aaa"), (std::vector<int32_t>{s.id("aa"), s.id("a")}));
  EXPECT_EQ(t.encode("aaaa"), (std::vector<int32_t>{s.id("aa"), s.id("aa")}));
  // Bytes of a multi-byte character map to their byte tokens: "é" = C3 A9.
  EXPECT_EQ(t.encode("\xc3\xa9"), (std::vector<int32_t>{2 + 0xC3, 2 + 0xA9}));
  EXPECT_EQ(t.decode(t.encode("\xc3\xa9 hello\n")), "\xc3\xa9 hello\n");
  EXPECT_EQ(t.token_text(s.id("\xc4\xa0w")), "\xc4\xa0w");
  EXPECT_EQ(t.token_bytes(s.id("\xc4\xa0w")), " w");
  EXPECT_EQ(t.token_bytes(2 + 0x0A), "\n");
  EXPECT_THROW((void)t.token_bytes(100000), Error);
  EXPECT_THROW((void)t.token_bytes(-1), Error);
}

TEST(GgufTokenizer, SpecialTokens) {
  const Synth s = hello_vocab();
  const Tokenizer t(s.file());
  const auto ids = t.encode("<|im_start|>hello<|im_end|>");
  EXPECT_EQ(ids, (std::vector<int32_t>{0, s.id("hello"), 1}));
  EXPECT_EQ(t.decode(ids), "<|im_start|>hello<|im_end|>");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "hello");
  // Not parsed: "<|im_end|>" is plain text (bytes and merges of its characters).
  const auto plain = t.encode("<|im_end|>", /*parse_special=*/false);
  EXPECT_EQ(plain.size(), 10u);
  EXPECT_EQ(t.decode(plain), "<|im_end|>");
}

TEST(GgufTokenizer, PreTokenizerSplit) {
  const Tokenizer t(hello_vocab().file());
  using V = std::vector<std::string>;
  // Contractions, words with their leading space, punctuation runs.
  EXPECT_EQ(t.pre_tokenize("I'll don't 'x"), (V{"I", "'ll", " don", "'t", " '", "x"}));
  EXPECT_EQ(t.pre_tokenize("Hi!! ok?"), (V{"Hi", "!!", " ok", "?"}));
  // Digits one by one (smollm), the space before them on its own.
  EXPECT_EQ(t.pre_tokenize("ab 123x"), (V{"ab", " ", "1", "2", "3", "x"}));
  // Whitespace runs: the last space goes with the next word, unless it ends the text.
  EXPECT_EQ(t.pre_tokenize("a   b  "), (V{"a", "  ", " b", "  "}));
  EXPECT_EQ(t.pre_tokenize("a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(t.pre_tokenize("x\t y"), (V{"x", "\t", " y"}));
  // Letters of any script; a non-breaking space is whitespace.
  EXPECT_EQ(t.pre_tokenize("caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd\xc2\xa0z"),
            (V{"caf\xc3\xa9", " \xe4\xbd\xa0\xe5\xa5\xbd", "\xc2\xa0", "z"}));
  // Invalid UTF-8 bytes are kept, as "other" characters.
  EXPECT_EQ(t.pre_tokenize("a\xff\xfe b"), (V{"a", "\xff\xfe", " b"}));
  EXPECT_EQ(t.decode(t.encode("a\xff\xfe b")), "a\xff\xfe b");
}

TEST(GgufTokenizer, ChatTemplate) {
  const Tokenizer t(hello_vocab().file());
  EXPECT_EQ(t.default_system_prompt(), "Be brief.");
  EXPECT_EQ(t.apply_chat_template({{"user", "Hi"}}, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(t.apply_chat_template({{"system", "S"}, {"user", "U"}, {"assistant", "A"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\nA<|im_end|>\n");
  Synth s = hello_vocab();
  s.chat_template = "{{ messages }}";
  const Tokenizer no_chatml(s.file());
  EXPECT_THROW((void)no_chatml.apply_chat_template({{"user", "Hi"}}), Error);
}

TEST(GgufTokenizer, StreamDecoderKeepsCharactersWhole) {
  const Tokenizer t(hello_vocab().file());
  // Emoji and CJK are byte tokens here: every character arrives over several tokens.
  const std::string text = "hello \xf0\x9f\x99\x82 \xe4\xbd\xa0!";
  StreamDecoder d(t);
  std::string all;
  for (int32_t id : t.encode(text)) {
    const std::string piece = d.push(id);
    EXPECT_EQ(flashinfer::gguf::utf8_complete_prefix(piece), piece.size());
    all += piece;
  }
  all += d.finish();
  EXPECT_EQ(all, text);
  EXPECT_EQ(flashinfer::gguf::utf8_complete_prefix("ab\xf0\x9f\x99"), 2u);
  EXPECT_EQ(flashinfer::gguf::utf8_complete_prefix("ab\xe4"), 2u);
  EXPECT_EQ(flashinfer::gguf::utf8_complete_prefix("ab\xe4\xbd\xa0"), 5u);
  EXPECT_EQ(flashinfer::gguf::utf8_complete_prefix("\x80\x80\x80\x80"), 4u);
  StreamDecoder cut(t);
  EXPECT_EQ(cut.push(2 + 0xF0), "");
  EXPECT_EQ(cut.finish(), "\xf0");  // an unfinished character is handed out at the end
  StreamDecoder skip(t, /*skip_special=*/true);
  EXPECT_EQ(skip.push(1), "");
}

TEST(GgufTokenizer, RejectsBadMetadata) {
  auto expect = [](const Synth& s, ErrorCode code, const std::string& needle) {
    try {
      Tokenizer t(s.file());
      ADD_FAILURE() << "accepted; expected '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Synth s = hello_vocab();
  s.model = "llama";
  expect(s, ErrorCode::kUnsupported, "tokenizer.ggml.model");
  s = hello_vocab();
  s.pre = "qwen2";
  expect(s, ErrorCode::kUnsupported, "qwen2");
  s = hello_vocab();
  s.merges.push_back("nospace");
  expect(s, ErrorCode::kFormat, "not two tokens");
  s = hello_vocab();
  s.merges.push_back("q zz");
  expect(s, ErrorCode::kFormat, "not in the vocabulary");
  s = hello_vocab();
  s.types.pop_back();
  expect(s, ErrorCode::kFormat, "token_type");
}

// ---- the real model against the tokenizers package ----

TEST(GgufTokenizerModel, MatchesTokenizersPackage) {
  const std::string model = flashinfer::gguf::default_model_path();
  if (!fs::exists(model)) {
    GTEST_SKIP() << "model file " << model
                 << " is absent (scripts/bootstrap fetches it; FLASHINFER_MODEL_PATH overrides)";
  }
  std::vector<std::string> corpus = {
      "Hello, world!",
      "What is the capital of France?",
      "  leading and trailing  ",
      "a  b   c\n\nd\t\te \n x",
      "price: 12345 dollars, 3.14159, 1,000,000 and 2024-11-22",
      "CJK: \xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x8c\xe3\x81\x93\xe3\x82\x93"
      "\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf\xe3\x80\x81\xec\x95\x88\xeb\x85\x95",
      "emoji \xf0\x9f\x99\x82\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd family "
      "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7",
      "accents: caf\xc3\xa9 na\xc3\xafve \xc3\x85ngstr\xc3\xb6m fa\xc3\xa7"
      "ade \xc3\x9f\xc3\xb1",
      "def f(x):\n    return x**2  # square\n\nclass A:\n\tpass\n",
      "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // C++",
      "don't I'll we've they're it's 'quoted' JOHN'S I'M",
      "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
      "digits \xc2\xb2\xc2\xb3 \xe2\x85\xab \xd9\xa3\xd9\xa4 \xc2\xbd",
      "tab\tand\xc2\xa0nbsp\xe3\x80\x80ideographic",
      "control \x14 char",
      "",
      "   ",
      "\n",
      "x\r\ny\n\n\n   z",
      "The quick brown fox jumps over the lazy dog. THE END?!...",
      "https://example.com/path?q=1&r=two#frag user@example.org",
      "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xd0\xbc\xd0\xb8\xd1\x80 "
      "\xce\xb3\xce\xb5\xce\xb9\xce\xac \xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d "
      "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d"
      "\xe0\xa4\xa4\xe0\xa5\x87",
  };
  // Plus random strings over pieces that stress the split: contractions, mixed scripts, digit
  // kinds, whitespace kinds, punctuation, special-token text and a byte with no token.
  const std::vector<std::string> atoms = {"a",
                                          "Z",
                                          "s",
                                          "t",
                                          "re",
                                          "ll",
                                          "ve",
                                          "d",
                                          "m",
                                          "'",
                                          "'s",
                                          "'LL",
                                          " ",
                                          "  ",
                                          "\n",
                                          "\t",
                                          "\r\n",
                                          "\xc2\xa0",
                                          "\xe3\x80\x80",
                                          "0",
                                          "7",
                                          "42",
                                          "\xc2\xb2",
                                          "\xd9\xa3",
                                          "\xe2\x85\xab",
                                          ".",
                                          ",",
                                          "!?",
                                          "(",
                                          ")",
                                          "{}",
                                          "_",
                                          "-",
                                          "#",
                                          "@",
                                          "\"",
                                          "\xc3\xa9",
                                          "\xc3\x85",
                                          "\xe4\xbd\xa0",
                                          "\xe5\xa5\xbd",
                                          "\xf0\x9f\x99\x82",
                                          "\xe2\x80\x8d",
                                          "\xd0\x96",
                                          "<|im_start|>",
                                          "<|im_end|>",
                                          "<|im",
                                          "\x14",
                                          "the",
                                          "The",
                                          "ing",
                                          "tion",
                                          "http"};
  std::mt19937 rng(1234);
  for (int k = 0; k < 300; ++k) {
    std::string s;
    const int len = static_cast<int>(rng() % 24);
    for (int j = 0; j < len; ++j) s += atoms[rng() % atoms.size()];
    corpus.push_back(s);
  }
  const fs::path dir = fs::temp_directory_path() / ("fi_gguf_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "corpus.json") << nlohmann::json(corpus).dump();
  const auto r = flashinfer::testing::run_command(
      "/usr/bin/python3 " + FLASHINFER_TEST_SOURCE_DIR + "/tests/formats/tokenizer_reference.py '" +
      model + "' '" + (dir / "corpus.json").string() + "' 2>&1");
  fs::remove_all(dir);
  if (r.status == 77) {  // the script's exit status without gguf / tokenizers
    GTEST_SKIP() << "the gguf / tokenizers PyPI packages are not installed (scripts/bootstrap)";
  }
  ASSERT_EQ(r.status, 0) << r.out;
  const auto ref = nlohmann::json::parse(r.out);
  ASSERT_EQ(ref.at("ids").size(), corpus.size());
  ASSERT_EQ(ref.at("decoded").size(), corpus.size());
  ASSERT_EQ(ref.at("pieces").size(), corpus.size());

  const File f = File::open(model);
  const Tokenizer t(f);
  EXPECT_EQ(t.pre(), "smollm");
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.pad_id(), 2);
  EXPECT_EQ(t.end_of_turn_id(), 2);
  for (std::size_t k = 0; k < corpus.size(); ++k) {
    const auto ids = t.encode(corpus[k]);
    EXPECT_EQ(ids, ref["ids"][k].get<std::vector<int32_t>>()) << "text #" << k << ": " << corpus[k];
    EXPECT_EQ(t.decode(ids), ref["decoded"][k].get<std::string>()) << "text #" << k;
    EXPECT_EQ(t.pre_tokenize(corpus[k]), ref["pieces"][k].get<std::vector<std::string>>())
        << "text #" << k;
  }
  // Known ids of the model's vocabulary.
  EXPECT_EQ(t.encode("Hello, world!"), (std::vector<int32_t>{19556, 28, 905, 17}));

  // The model's own template (tokenizer.chat_template), rendered for a user turn.
  EXPECT_EQ(t.apply_chat_template({{"user", "What is the capital of France?"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n");
  const auto chat = t.encode(t.apply_chat_template({{"user", "Hi"}}));
  EXPECT_EQ(chat.front(), 1);  // <|im_start|>
  EXPECT_EQ(t.decode(chat), t.apply_chat_template({{"user", "Hi"}}));
}

}  // namespace
