// The tokenizer of a GGUF model: GPT-2 style byte-level BPE built from the file's vocabulary
// (tokenizer.ggml.tokens / token_type / merges), the model's pre-tokenizer split
// (tokenizer.ggml.pre), and its ChatML chat template (tokenizer.chat_template). docs/MODEL.md
// lists the rules. No Python, no regex engine, no Jinja: the split and the template are coded
// for the formats SmolLM2 (and other "smollm"/"gpt2" ChatML models) use; anything else is an
// Error(kUnsupported) when the tokenizer is built.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "flashinfer/gguf.h"

namespace flashinfer::gguf {

/// One turn of a conversation: role ("system", "user", "assistant") and content.
struct ChatMessage {
  std::string role;
  std::string content;
};

class Tokenizer {
 public:
  /// GGUF token types (tokenizer.ggml.token_type).
  enum TokenType : int32_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
  };

  /// Builds the tokenizer of `file`: tokenizer.ggml.model must be "gpt2" and tokenizer.ggml.pre
  /// "smollm" (digits split one by one, then the GPT-2 split) or "gpt2"/"default" (the GPT-2
  /// split alone). The vocabulary and merges are validated (untrusted input): Error(kFormat).
  explicit Tokenizer(const File& file);

  /// Token ids of `text`. With `parse_special`, the text of a control or user-defined token
  /// (e.g. "<|im_start|>") becomes that token; otherwise it is tokenized as plain text. A
  /// character whose byte has no token in the vocabulary is left out (as the reference
  /// tokenizers do when the model has no unknown token).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  /// The bytes the tokens stand for (may end inside a UTF-8 character; see StreamDecoder).
  /// Control tokens give their text unless `skip_special`.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  /// The bytes of one token (its text for control tokens). Error for an id out of range.
  std::string token_bytes(int32_t id) const;
  /// The token's string as stored in the vocabulary ("Ġthe").
  const std::string& token_text(int32_t id) const;
  /// The id of a vocabulary string, or -1.
  int32_t token_id(std::string_view text) const;

  /// Renders `messages` with the model's chat template (ChatML: "<|im_start|>role\ncontent
  /// <|im_end|>\n" per turn, the template's default system turn first when the first message is
  /// not a system message, and "<|im_start|>assistant\n" when `add_generation_prompt`).
  std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt = true) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }  // -1 when the file names none
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }
  /// Token id of "<|im_end|>", which ends an assistant turn (-1 when absent).
  int32_t end_of_turn_id() const { return end_of_turn_id_; }
  bool is_control(int32_t id) const;
  const std::string& pre() const { return pre_; }
  /// The system message the template adds when the conversation has none (may be empty).
  const std::string& default_system_prompt() const { return default_system_; }

  /// The pre-tokenizer's pieces of `text` (no special-token handling): for tests.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

 private:
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t> token_ids_;
  // (left id << 32 | right id) -> (rank << 32 | merged id)
  std::unordered_map<uint64_t, uint64_t> merges_;
  int32_t byte_token_[256];        // token of each byte's byte-level character, or -1
  std::vector<int32_t> specials_;  // control and user-defined tokens, matched in text
  std::string pre_;
  bool split_digits_ = false;
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1, end_of_turn_id_ = -1;
  std::string default_system_;
  bool has_chatml_ = false;
};

/// Turns generated tokens into text as they come, never cutting a UTF-8 character: push() returns
/// the complete characters now available and keeps an unfinished one for the next call; finish()
/// returns what is left (an unfinishable sequence is returned as its bytes).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tok_(tokenizer), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string finish();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

/// Length of the longest prefix of `s` that does not end inside a UTF-8 character that could
/// still be completed (an invalid byte counts as complete).
std::size_t utf8_complete_prefix(std::string_view s);

}  // namespace flashinfer::gguf
