// Writes seed inputs for the fuzzers: valid files of each format, made by this library's
// writers, so fuzzing starts from deep inside the parsers. Usage: make_seeds <corpus root>.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "../tests/util/gguf_builder.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/tensor_io.h"
#include "fuzz_call_dir_format.h"
#include "util/torch_archive.h"

namespace {

namespace fs = std::filesystem;
using Files = std::vector<std::pair<std::string, std::string>>;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_seed(const fs::path& p, const Files& files) {
  std::ofstream(p, std::ios::binary) << flashinfer::fuzz::join_call_files(files);
}

// Whole call directories for fuzz_call_dir: calls recorded by this library's recorder, and each
// hostile class of issue 16 built from one of them.
void call_dir_seeds(const fs::path& out) {
  using namespace flashinfer;
  const fs::path rec = out / "recorded";
  fs::remove_all(rec);
  recorder::Config c;
  c.dump_dir = rec.string();
  recorder::start(c, [](const std::string&) {});
  const Tensor x = Tensor::from_vector({1, -2, 3, 4, 0.5, 6}, {2, 3}, DType::kFloat32);
  const Tensor w = Tensor::from_vector({1, 0.5, 2}, {3}, DType::kFloat32);
  rmsnorm(x, w);
  Tensor in = x.clone(), res = x.clone();
  fused_add_rmsnorm(in, res, w);
  Tensor act = Tensor::empty({2, 1}, DType::kFloat32);
  silu_and_mul(x.slice(1, 0, 2), act);
  recorder::stop();
  recorder::Config s = c;
  s.dump_dir = (rec / "st").string();
  s.safetensors = true;
  recorder::start(s, [](const std::string&) {});
  rmsnorm(x.transpose(0, 1), Tensor::from_vector({1, 2}, {2}, DType::kFloat32));
  recorder::stop();
  std::vector<fs::path> dirs;
  for (const auto& base : {rec, rec / "st"}) {
    for (const auto& e : fs::directory_iterator(base)) {
      if (e.is_directory() && fs::exists(e.path() / "metadata.jsonl")) dirs.push_back(e.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  std::vector<Files> calls;
  for (const auto& d : dirs) {
    Files f;
    for (std::string_view n : fuzz::kCallFileNames) {
      if (fs::exists(d / std::string(n))) f.emplace_back(std::string(n), slurp(d / std::string(n)));
    }
    calls.push_back(f);
    write_seed(out / ("recorded" + std::to_string(calls.size())), f);
  }
  fs::remove_all(rec);
  if (calls.empty()) return;
  const Files& base = calls[0];  // rmsnorm, torch format
  auto with = [&](const std::string& name, const std::string& content) {
    Files f = base;
    bool found = false;
    for (auto& [n, c] : f) {
      if (n == name) c = content, found = true;
    }
    if (!found) f.emplace_back(name, content);
    return f;
  };
  const std::string meta = base[0].second;
  // Metadata: nested past kMaxJsonDepth; a number where a string belongs; a non-UTF-8 name with
  // escape sequences; a torn last line; the write-failure status; nothing at all.
  write_seed(out / "deep_json", with("metadata.jsonl", "{\"a\":" + std::string(2000, '[') +
                                                           std::string(2000, ']') + "}\n"));
  auto replace_all = [](std::string t, const std::string& from, const std::string& to) {
    for (std::size_t p = t.find(from); p != std::string::npos; p = t.find(from, p + to.size())) {
      t.replace(p, from.size(), to);
    }
    return t;
  };
  write_seed(out / "name_is_number",
             with("metadata.jsonl",
                  replace_all(meta, "\"function_name\": \"rmsnorm\"", "\"function_name\": 42")));
  write_seed(out / "name_control_bytes",
             with("metadata.jsonl", replace_all(meta, "\"function_name\": \"rmsnorm\"",
                                                "\"function_name\": \"rms\\u001b[2J\xff\"")));
  write_seed(out / "torn_line", with("metadata.jsonl", meta.substr(0, meta.size() * 3 / 4)));
  write_seed(out / "write_failed", with("metadata.jsonl", replace_all(meta, "\"completed\"",
                                                                      "\"outputs_write_failed\"")));
  write_seed(out / "empty_metadata", with("metadata.jsonl", ""));
  // Tensors: a stride of 2^62 (the span arithmetic overflows), a huge size, a truncated archive,
  // shapes in tensor_details whose strides wrap.
  const fs::path tmp = out / "tmp.pt";
  testing::write_storage_archive(tmp.string(), "inputs",
                                 testing::rebuild_tensor_pickle({5}, {int64_t{1} << 62}));
  write_seed(out / "stride_2_62", with("inputs.pt", slurp(tmp)));
  testing::write_storage_archive(tmp.string(), "inputs",
                                 testing::rebuild_tensor_pickle({int64_t{1} << 40, 4}, {0, 1}));
  write_seed(out / "broadcast_2_40", with("inputs.pt", slurp(tmp)));
  fs::remove(tmp);
  write_seed(out / "truncated_inputs",
             with("inputs.pt", base[1].second.substr(0, base[1].second.size() / 2)));
  write_seed(out / "wrapping_details",
             with("metadata.jsonl",
                  replace_all(meta, "\"stride\": [3, 1]", "\"stride\": [4611686018427387904, 1]")));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flashinfer;
  if (argc != 2) return 2;
  const fs::path root(argv[1]);
  for (const char* d : {"torch", "safetensors", "metadata", "gguf", "call"}) {
    fs::create_directories(root / d);
  }
  call_dir_seeds(root / "call");
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
