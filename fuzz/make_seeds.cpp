// Writes seed inputs for the fuzzers: valid files of each format, made by this library's
// writers, so fuzzing starts from deep inside the parsers. Usage: make_seeds <corpus root>.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

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
  for (const char* d : {"torch", "safetensors", "metadata", "call"}) {
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
  return 0;
}
