// Writes seed inputs for the fuzzers: valid files of each format, made by this library's
// writers, so fuzzing starts from deep inside the parsers. Usage: make_seeds <corpus root>.
#include <filesystem>
#include <fstream>
#include <string>

#include "flashinfer/flashinfer.h"
#include "flashinfer/tensor_io.h"

int main(int argc, char** argv) {
  using namespace flashinfer;
  namespace fs = std::filesystem;
  if (argc != 2) return 2;
  const fs::path root(argv[1]);
  for (const char* d : {"torch", "safetensors", "metadata"}) fs::create_directories(root / d);
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
