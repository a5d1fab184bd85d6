// Byte-level BPE tokenizer of a GGUF model (include/flashinfer/gguf_tokenizer.h).
#include "flashinfer/gguf_tokenizer.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "flashinfer/error.h"
#include "unicode_tables.h"

namespace flashinfer::gguf {
namespace {

constexpr const char* kOp = "gguf.Tokenizer";

template <std::size_t N>
bool in_ranges(const unicode::CodepointRange (&r)[N], uint32_t cp) {
  const auto* it = std::upper_bound(
      r, r + N, cp, [](uint32_t c, const unicode::CodepointRange& x) { return c < x.first; });
  return it != r && cp <= (it - 1)->last;
}

bool is_letter(uint32_t cp) { return in_ranges(unicode::kLetterRanges, cp); }
bool is_number(uint32_t cp) { return in_ranges(unicode::kNumberRanges, cp); }
// The Unicode White_Space property (what \s matches in the reference regex engines).
bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// One decoded character: code point and its byte span. An invalid byte is a character of its
// own with a code point no class matches (0x110000), so it joins "other" runs.
struct Char {
  uint32_t cp;
  std::size_t begin, end;
};

std::vector<Char> decode_utf8(std::string_view s) {
  std::vector<Char> out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int len = 0;
    uint32_t cp = 0;
    if (b < 0x80) {
      len = 1, cp = b;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2, cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, cp = b & 0x07;
    }
    bool ok = len > 0 && i + static_cast<std::size_t>(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      ok = (c & 0xC0) == 0x80;
      cp = (cp << 6) | (c & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid too.
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!ok) {
      out.push_back({0x110000, i, i + 1});
      ++i;
    } else {
      out.push_back({cp, i, i + static_cast<std::size_t>(len)});
      i += static_cast<std::size_t>(len);
    }
  }
  return out;
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// GPT-2's byte-to-character map: printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for
// themselves; the other 68 bytes take the code points 256, 257, ... in byte order.
struct ByteMap {
  uint32_t to_cp[256];
  int16_t from_cp[324];  // code point -> byte, -1 when no byte maps there
  ByteMap() {
    for (auto& b : from_cp) b = -1;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? b : next++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

enum class Class { kSpace, kLetter, kNumber, kOther };
Class classify(uint32_t cp) {
  if (is_space(cp)) return Class::kSpace;
  if (is_letter(cp)) return Class::kLetter;
  if (is_number(cp)) return Class::kNumber;
  return Class::kOther;
}

// GPT-2's split of chars [b, e): the first alternative that matches at each position of
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void gpt2_split(const std::vector<Char>& c, std::size_t b, std::size_t e,
                std::vector<std::pair<std::size_t, std::size_t>>& out) {
  std::size_t i = b;
  auto emit = [&](std::size_t j) {
    out.emplace_back(c[i].begin, c[j - 1].end);
    i = j;
  };
  while (i < e) {
    const uint32_t cp = c[i].cp;
    if (cp == '\'' && i + 1 < e) {
      const uint32_t n1 = c[i + 1].cp;
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        emit(i + 2);
        continue;
      }
      if (i + 2 < e) {
        const uint32_t n2 = c[i + 2].cp;
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          emit(i + 3);
          continue;
        }
      }
    }
    // " ?X+" for X = letters, numbers, other: an optional U+0020, then a run of one class.
    std::size_t start = i;
    if (cp == ' ' && i + 1 < e && classify(c[i + 1].cp) != Class::kSpace) start = i + 1;
    const Class k = classify(c[start].cp);
    if (k != Class::kSpace) {
      std::size_t j = start + 1;
      while (j < e && classify(c[j].cp) == k) ++j;
      emit(j);
      continue;
    }
    // Whitespace: the run, less its last character when a non-space follows (\s+(?!\S)),
    // unless that leaves nothing (then \s+ takes the one character).
    std::size_t j = i + 1;
    while (j < e && is_space(c[j].cp)) ++j;
    if (j < e && j - i >= 2) --j;
    emit(j);
  }
}

}  // namespace

Tokenizer::Tokenizer(const File& file) {
  const std::string model = file.get_string("tokenizer.ggml.model");
  FLASHINFER_CHECK_CODE(model == "gpt2", ErrorCode::kUnsupported, kOp, "file", "'", file.path(),
                        "': tokenizer.ggml.model is '", model,
                        "'; only gpt2 (byte-level BPE) is supported");
  pre_ = file.has("tokenizer.ggml.pre") ? file.get_string("tokenizer.ggml.pre") : "default";
  FLASHINFER_CHECK_CODE(pre_ == "smollm" || pre_ == "gpt2" || pre_ == "default",
                        ErrorCode::kUnsupported, kOp, "file", "'", file.path(),
                        "': pre-tokenizer '", pre_, "' is not supported (smollm, gpt2)");
  split_digits_ = pre_ == "smollm";

  tokens_ = file.get_string_array("tokenizer.ggml.tokens");
  auto fail = [&](const auto&... parts) {
    FLASHINFER_FAIL(ErrorCode::kFormat, kOp, "file", "'", file.path(), "': ", parts...);
  };
  if (tokens_.empty() || tokens_.size() > (std::size_t{1} << 30)) {
    fail("tokenizer.ggml.tokens has ", tokens_.size(), " entries");
  }
  const auto n = static_cast<int32_t>(tokens_.size());
  if (file.has("tokenizer.ggml.token_type")) {
    const auto t = file.get_int_array("tokenizer.ggml.token_type");
    if (t.size() != tokens_.size()) {
      fail("tokenizer.ggml.token_type has ", t.size(), " entries for ", tokens_.size(), " tokens");
    }
    types_.reserve(t.size());
    for (int64_t v : t) types_.push_back(static_cast<int32_t>(std::clamp<int64_t>(v, 0, 7)));
  } else {
    types_.assign(tokens_.size(), kNormal);
  }
  token_ids_.reserve(tokens_.size());
  for (int32_t id = 0; id < n; ++id) {
    token_ids_.emplace(tokens_[static_cast<std::size_t>(id)], id);  // first id wins
    const int32_t ty = types_[static_cast<std::size_t>(id)];
    if ((ty == kControl || ty == kUserDefined) && !tokens_[static_cast<std::size_t>(id)].empty()) {
      specials_.push_back(id);
    }
  }
  // Longest first, so the longest special token at a position wins.
  std::stable_sort(specials_.begin(), specials_.end(), [&](int32_t a, int32_t b) {
    return tokens_[static_cast<std::size_t>(a)].size() >
           tokens_[static_cast<std::size_t>(b)].size();
  });

  const auto& bm = byte_map();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, bm.to_cp[b]);
    byte_token_[b] = token_id(s);
  }

  const auto merges = file.get_string_array("tokenizer.ggml.merges");
  merges_.reserve(merges.size());
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const std::size_t sp = m.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == m.size()) {
      fail("merge ", r, " ('", m.substr(0, 64), "') is not two tokens separated by a space");
    }
    const int32_t a = token_id(std::string_view(m).substr(0, sp));
    const int32_t b = token_id(std::string_view(m).substr(sp + 1));
    const int32_t ab = token_id(m.substr(0, sp) + m.substr(sp + 1));
    if (a < 0 || b < 0 || ab < 0) {
      fail("merge ", r, " ('", m.substr(0, 64), "') names a token not in the vocabulary");
    }
    const uint64_t key = (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
    merges_.emplace(key, (uint64_t{r} << 32) | static_cast<uint32_t>(ab));  // first rank wins
  }

  auto id_or = [&](const char* key) -> int32_t {
    if (!file.has(key)) return -1;
    const int64_t v = file.get_int(key);
    if (v < 0 || v >= n) fail(key, " = ", v, " is not a token id (vocabulary of ", n, ")");
    return static_cast<int32_t>(v);
  };
  bos_id_ = id_or("tokenizer.ggml.bos_token_id");
  eos_id_ = id_or("tokenizer.ggml.eos_token_id");
  pad_id_ = id_or("tokenizer.ggml.padding_token_id");
  end_of_turn_id_ = token_id("<|im_end|>");

  if (file.has("tokenizer.chat_template")) {
    const std::string t = file.get_string("tokenizer.chat_template");
    const std::string sys = "<|im_start|>system\n";
    if (const auto p = t.find(sys); p != std::string::npos) {
      const auto q = t.find("<|im_end|>", p + sys.size());
      if (q != std::string::npos) default_system_ = t.substr(p + sys.size(), q - p - sys.size());
    }
    has_chatml_ =
        t.find("<|im_start|>") != std::string::npos && t.find("<|im_end|>") != std::string::npos;
  }
}

const std::string& Tokenizer::token_text(int32_t id) const {
  FLASHINFER_CHECK(id >= 0 && id < vocab_size(), kOp, "id", "token id ", id, " out of range [0, ",
                   vocab_size(), ")");
  return tokens_[static_cast<std::size_t>(id)];
}

int32_t Tokenizer::token_id(std::string_view text) const {
  const auto it = token_ids_.find(std::string(text));
  return it == token_ids_.end() ? -1 : it->second;
}

bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < vocab_size() && types_[static_cast<std::size_t>(id)] == kControl;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const std::string& t = token_text(id);
  const int32_t ty = types_[static_cast<std::size_t>(id)];
  if (ty == kControl || ty == kUserDefined) return t;
  // Byte-level: each character stands for one byte; a character outside the map is kept.
  std::string out;
  const auto& bm = byte_map();
  for (const Char& ch : decode_utf8(t)) {
    if (ch.cp < 324 && bm.from_cp[ch.cp] >= 0) {
      out += static_cast<char>(bm.from_cp[ch.cp]);
    } else {
      out.append(t, ch.begin, ch.end - ch.begin);
    }
  }
  return out;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  const std::vector<Char> c = decode_utf8(text);
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  std::size_t b = 0;
  for (std::size_t i = 0; i <= c.size(); ++i) {
    // With digit splitting every number character is a piece of its own, and the GPT-2 split
    // runs on the text between them.
    if (i == c.size() || (split_digits_ && is_number(c[i].cp))) {
      if (i > b) gpt2_split(c, b, i, spans);
      if (i < c.size()) spans.emplace_back(c[i].begin, c[i].end);
      b = i + 1;
    }
  }
  std::vector<std::string> out;
  out.reserve(spans.size());
  for (const auto& [s, e] : spans) out.emplace_back(text.substr(s, e - s));
  return out;
}

void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int prev, next;
  };
  std::vector<Sym> sym;
  sym.reserve(piece.size());
  for (unsigned char ch : piece) {
    const int32_t id = byte_token_[ch];
    if (id < 0) continue;  // no token for this byte: left out
    const int k = static_cast<int>(sym.size());
    sym.push_back({id, k - 1, -1});
    if (k > 0) sym[static_cast<std::size_t>(k - 1)].next = k;
  }
  if (sym.empty()) return;
  // Lowest rank first; among equal ranks (the same pair) the leftmost.
  struct Cand {
    uint32_t rank;
    int left;
    int32_t a, b, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> q;
  auto consider = [&](int l) {
    if (l < 0) return;
    const int r = sym[static_cast<std::size_t>(l)].next;
    if (r < 0) return;
    const int32_t a = sym[static_cast<std::size_t>(l)].id;
    const int32_t b = sym[static_cast<std::size_t>(r)].id;
    const auto it =
        merges_.find((uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b));
    if (it != merges_.end()) {
      q.push({static_cast<uint32_t>(it->second >> 32), l, a, b,
              static_cast<int32_t>(it->second & 0xFFFFFFFFu)});
    }
  };
  for (int k = 0; k + 1 < static_cast<int>(sym.size()); ++k) consider(k);
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    Sym& l = sym[static_cast<std::size_t>(c.left)];
    // Stale when the left symbol changed or its right neighbour is no longer the pair's.
    if (l.id != c.a || l.next < 0 || sym[static_cast<std::size_t>(l.next)].id != c.b) continue;
    const int r = l.next;
    l.id = c.merged;
    l.next = sym[static_cast<std::size_t>(r)].next;
    if (l.next >= 0) sym[static_cast<std::size_t>(l.next)].prev = c.left;
    sym[static_cast<std::size_t>(r)].id = -1;  // removed
    consider(l.prev);
    consider(c.left);
  }
  for (int k = 0; k >= 0; k = sym[static_cast<std::size_t>(k)].next) {
    out.push_back(sym[static_cast<std::size_t>(k)].id);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  auto plain = [&](std::string_view part) {
    for (const std::string& piece : pre_tokenize(part)) bpe(piece, out);
  };
  std::size_t start = 0;
  if (parse_special && !specials_.empty()) {
    for (std::size_t p = 0; p < text.size();) {
      int32_t hit = -1;
      for (int32_t id : specials_) {
        const std::string& s = tokens_[static_cast<std::size_t>(id)];
        if (text.compare(p, s.size(), s) == 0) {
          hit = id;
          break;
        }
      }
      if (hit < 0) {
        ++p;
        continue;
      }
      plain(text.substr(start, p - start));
      out.push_back(hit);
      p += tokens_[static_cast<std::size_t>(hit)].size();
      start = p;
    }
  }
  plain(text.substr(start));
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (skip_special && is_control(id)) continue;
    out += token_bytes(id);
  }
  return out;
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt) const {
  FLASHINFER_CHECK_CODE(has_chatml_, ErrorCode::kUnsupported, kOp, "chat_template",
                        "the model has no ChatML chat template (<|im_start|> ... <|im_end|>)");
  std::string s;
  if (!messages.empty() && messages[0].role != "system" && !default_system_.empty()) {
    s += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  }
  for (const ChatMessage& m : messages) {
    s += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) s += "<|im_start|>assistant\n";
  return s;
}

std::size_t utf8_complete_prefix(std::string_view s) {
  // Look back at most 3 bytes for the lead byte of a character that is still incomplete.
  const std::size_t n = s.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const std::size_t need = (b & 0xE0) == 0xC0   ? 2
                             : (b & 0xF0) == 0xE0 ? 3
                             : (b & 0xF8) == 0xF0 ? 4
                                                  : 1;
    return need > back ? n - back : n;
  }
  return n;
}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tok_.is_control(id)) return {};
  pending_ += tok_.token_bytes(id);
  const std::size_t k = utf8_complete_prefix(pending_);
  std::string out = pending_.substr(0, k);
  pending_.erase(0, k);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace flashinfer::gguf
