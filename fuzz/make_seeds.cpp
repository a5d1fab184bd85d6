// Writes seed inputs for the fuzzers: valid files of each format, made by this library's
// writers, so fuzzing starts from deep inside the parsers. Usage: make_seeds <corpus root>.
#include <filesystem>
#include <fstream>
#include <string>

#include "../tests/util/gguf_builder.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/tensor_io.h"

int main(int argc, char** argv) {
  using namespace flashinfer;
  namespace fs = std::filesystem;
  if (argc != 2) return 2;
  const fs::path root(argv[1]);
  for (const char* d : {"torch", "safetensors", "metadata", "gguf"}) {
    fs::create_directories(root / d);
  }
  Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::kFloat16);
  Tensor b = Tensor::from_vector({448, -2}, {2}, DType::kFloat8E4M3FN);
  Tensor c = Tensor::from_vector({7}, {}, DType::kInt64);
  save_torch((root / "torch" / "seed1.pt").string(), {{"arg_0", a.transpose(0, 1)}, {"arg_1", b}});
  save_torch((root / "torch" / "seed2.pt").string(), {{"result", c}});
  save_safetensors((root / "safetensors" / "seed1.safetensors").string(),
                   {{"arg_0", a}, {"arg_1", b}, {"kwarg_x", c}});
  std::ofstream((root / "metadata" / "seed1.jsonl"))
      << R"({"function_name": "rmsnorm", "module": "flashinfer.norm", "call_sequence": 1, )"
      << R"("input_metadata": {"arg_2": 1e-06, "kwarg_d": {"type": "torch.dtype", "value": )"
      << R"("torch.float16"}}, "execution_status": "inputs_saved"})"
      << "\n"
      << R"({"function_name": "rmsnorm", "execution_status": "completed", "self_id": 1})"
      << "\n";
  // Hostile classes of issue 16: nesting past kMaxJsonDepth, in a metadata line and in a
  // safetensors header.
  std::ofstream(root / "metadata" / "deep.jsonl")
      << "{\"a\":" << std::string(2000, '[') << std::string(2000, ']') << "}\n";
  {
    const std::string h = "{\"a\":" + std::string(2000, '[') + std::string(2000, ']') + "}";
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
    std::ofstream(root / "safetensors" / "deep.safetensors", std::ios::binary) << bytes << h;
  }
  // GGUF: every metadata type (nested arrays included), a custom alignment, and a tensor of
  // each dequantized type.
  {
    using B = testing::GgufBuilder;
    B g;
    g.alignment = 64;
    g.kv("general.alignment", B::kU32, B::u32(64))
        .kv("general.architecture", B::kString, B::str("llama"))
        .kv("u8", B::kU8, "\x07")
        .kv("i8", B::kI8, "\xf9")
        .kv("u16", B::kU16, B::le(300, 2))
        .kv("i16", B::kI16, B::le(0xfff0, 2))
        .kv("i32", B::kI32, B::u32(0xfffffff0u))
        .kv("f32", B::kF32, B::f32(1e-5f))
        .kv("bool", B::kBool, "\x01")
        .kv("u64", B::kU64, B::u64(1))
        .kv("i64", B::kI64, B::u64(~uint64_t{0}))
        .kv("f64", B::kF64, B::f64(0.5))
        .kv("tokens", B::kArray,
            B::array(B::kString, 2,
                     B::str("a") + B::str("\xc4\xa0"
                                          "b")))
        .kv("types", B::kArray, B::array(B::kI32, 2, B::u32(1) + B::u32(3)))
        .kv("nested", B::kArray, B::array(B::kArray, 1, B::array(B::kF32, 1, B::f32(2.0f))));
    std::string q41 = B::le(0x3400, 2) + B::le(0xbc00, 2);
    std::string q80 = B::le(0x3800, 2);
    std::string q40 = B::le(0x4000, 2);
    for (int j = 0; j < 16; ++j) q41 += static_cast<char>(j * 17);
    for (int j = 0; j < 32; ++j) q80 += static_cast<char>(j * 7);
    for (int j = 0; j < 16; ++j) q40 += static_cast<char>(j * 9);
    g.tensor("w.f32", {2, 2}, 0, B::f32(1) + B::f32(2) + B::f32(3) + B::f32(4))
        .tensor("w.f16", {2}, 1, B::le(0x3c00, 2) + B::le(0xc000, 2))
        .tensor("w.bf16", {1}, 30, B::le(0x3f80, 2))
        .tensor("w.q4_1", {32, 1}, 3, q41)
        .tensor("w.q8_0", {32}, 8, q80)
        .tensor("w.q4_0", {32}, 2, q40);
    std::ofstream(root / "gguf" / "seed1.gguf", std::ios::binary) << g.build();
    // A tokenizer: byte tokens for "a", "b", " ", a merge and a control token.
    B tk;
    tk.kv("tokenizer.ggml.model", B::kString, B::str("gpt2"))
        .kv("tokenizer.ggml.pre", B::kString, B::str("smollm"))
        .kv("tokenizer.ggml.tokens", B::kArray,
            B::array(B::kString, 5,
                     B::str("<|im_end|>") + B::str("a") + B::str("b") + B::str("\xc4\xa0") +
                         B::str("ab")))
        .kv("tokenizer.ggml.token_type", B::kArray,
            B::array(B::kI32, 5, B::u32(3) + B::u32(1) + B::u32(1) + B::u32(1) + B::u32(1)))
        .kv("tokenizer.ggml.merges", B::kArray, B::array(B::kString, 1, B::str("a b")))
        .kv("tokenizer.chat_template", B::kString,
            B::str("<|im_start|>system\nHi<|im_end|>\n<|im_start|>assistant\n"));
    std::ofstream(root / "gguf" / "seed2.gguf", std::ios::binary) << tk.build();
  }
  return 0;
}
