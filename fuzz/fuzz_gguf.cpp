// libFuzzer target: flashinfer::gguf::File::from_bytes must reject any malformed input with
// flashinfer::Error; what it accepts must be safe to walk: every metadata accessor, every
// tensor's raw bytes and dequantization, and the tokenizer built from its vocabulary (which
// then encodes and decodes the input's own bytes).
#include <cstddef>
#include <cstdint>
#include <string>

#include "flashinfer/error.h"
#include "flashinfer/gguf.h"
#include "flashinfer/gguf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flashinfer::gguf;
  try {
    const File f = File::from_bytes(std::string(reinterpret_cast<const char*>(data), size));
    for (const auto& key : f.keys()) {
      const Value& v = f.get(key);
      (void)v.summary();
      try {
        if (v.type == ValueType::kArray) {
          (void)f.get_float_array(key);
          (void)f.get_int_array(key);
        } else {
          (void)f.get_int(key);
        }
      } catch (const flashinfer::Error&) {
      }
    }
    for (const auto& t : f.tensors()) {
      (void)f.raw_tensor(t);
      if (can_dequantize(t.type) && t.numel() <= (int64_t{1} << 20)) {
        (void)f.dequantize(t, flashinfer::DType::kBFloat16);
      }
    }
    if (f.has("tokenizer.ggml.tokens")) {
      const Tokenizer tok(f);
      const std::string text(reinterpret_cast<const char*>(data), size < 256 ? size : 256);
      const auto ids = tok.encode(text);
      (void)tok.decode(ids);
      (void)tok.apply_chat_template({{"user", text}});
    }
  } catch (const flashinfer::Error&) {
  }
  return 0;
}
