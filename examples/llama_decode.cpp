// A small Llama-style model served end to end with flashinfer-cpp: seeded random bf16 weights,
// a batch of prompts of different lengths, a paged KV cache, batch prefill, then decode steps
// with top-k/top-p sampling. Prints the generated token ids and the decode throughput.
//
//   llama_decode [--device cpu|cuda] [--steps 16] [--top_k 50] [--top_p 0.9] [--seed 42]
//                [--layers 4] [--hidden 512] [--num_qo_heads 8] [--num_kv_heads 2]
//                [--head_dim 64] [--intermediate 1408] [--vocab 4096] [--page_size 16]
//                [--prompt_lens 5,9,13,17] [--weight_seed 1234] [--prompt_seed 1]
//                [--workspace_mb 16]
//
// With FLASHINFER_LOGLEVEL=10 every library call of the loop is recorded into
// FLASHINFER_DUMP_DIR (default ./flashinfer_dumps) for `flashinfer replay`.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "llama/llama_model.h"

namespace {

void usage(FILE* f) {
  std::fprintf(
      f,
      "usage: llama_decode [--device cpu|cuda[:N]] [--steps N] [--top_k K] [--top_p P] "
      "[--seed S]\n"
      "                    [--layers N] [--hidden N] [--num_qo_heads N] [--num_kv_heads N]\n"
      "                    [--head_dim 64|128|256] [--intermediate N] [--vocab N] "
      "[--page_size N]\n"
      "                    [--prompt_lens L1,L2,...] [--weight_seed S] [--prompt_seed S]\n"
      "                    [--workspace_mb N]  (float workspace of each attention wrapper)\n");
}

int64_t parse_int(const std::string& flag, const std::string& text) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw std::invalid_argument(flag + " expects an integer, got '" + text + "'");
  return v;
}

double parse_double(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw std::invalid_argument(flag + " expects a number, got '" + text + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flashinfer;
  llama::Config config;
  llama::GenerateOptions options;
  std::string device_text = "cpu";
  std::vector<int64_t> prompt_lens = {5, 9, 13, 17};
  int64_t seed = 42, weight_seed = 1234, prompt_seed = 1;
  const std::map<std::string, int64_t*> int_flags = {{"--steps", &options.steps},
                                                     {"--top_k", &options.top_k},
                                                     {"--seed", &seed},
                                                     {"--layers", &config.layers},
                                                     {"--hidden", &config.hidden},
                                                     {"--num_qo_heads", &config.num_qo_heads},
                                                     {"--num_kv_heads", &config.num_kv_heads},
                                                     {"--head_dim", &config.head_dim},
                                                     {"--intermediate", &config.intermediate},
                                                     {"--vocab", &config.vocab},
                                                     {"--page_size", &config.page_size},
                                                     {"--weight_seed", &weight_seed},
                                                     {"--prompt_seed", &prompt_seed},
                                                     {"--workspace_mb", &config.workspace_mb}};
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "-h" || flag == "--help") {
        usage(stdout);
        return 0;
      }
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      const std::string value = argv[++i];
      if (auto it = int_flags.find(flag); it != int_flags.end()) {
        *it->second = parse_int(flag, value);
      } else if (flag == "--device") {
        device_text = value;
      } else if (flag == "--top_p") {
        options.top_p = parse_double(flag, value);
      } else if (flag == "--prompt_lens") {
        prompt_lens.clear();
        std::stringstream ss(value);
        std::string item;
        while (std::getline(ss, item, ',')) {
          const int64_t len = parse_int(flag, item);
          if (len < 1) throw std::invalid_argument("--prompt_lens entries must be >= 1");
          prompt_lens.push_back(len);
        }
        if (prompt_lens.empty()) throw std::invalid_argument("--prompt_lens is empty");
      } else {
        throw std::invalid_argument("unknown flag " + flag);
      }
    }
    options.seed = static_cast<uint64_t>(seed);
    config.weight_seed = static_cast<uint64_t>(weight_seed);
    if (options.steps < 0) throw std::invalid_argument("--steps must be >= 0");
    config.validate();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama_decode: %s\n", e.what());
    usage(stderr);
    return 2;
  }

  try {
    const Device device = Device::parse(device_text);
    if (device.is_cuda()) {
      if (!cuda_compiled()) {
        std::fprintf(stderr,
                     "llama_decode: --device %s asked for, but this build has no CUDA backend "
                     "(configure with -DFLASHINFER_ENABLE_CUDA=ON)\n",
                     device_text.c_str());
        return 2;
      }
      if (device.index >= cuda_device_count()) {
        std::fprintf(stderr,
                     "llama_decode: --device %s asked for, but %d CUDA device(s) are visible\n",
                     device_text.c_str(), cuda_device_count());
        return 2;
      }
    }

    std::printf(
        "flashinfer-cpp %s: Llama-style decode on %s: %lld layers, hidden %lld, %lld q heads, "
        "%lld kv heads, head_dim %lld, MLP %lld, vocab %lld, page %lld (bf16, random weights "
        "seed %llu)\n",
        std::string(version()).c_str(), device.str().c_str(), (long long)config.layers,
        (long long)config.hidden, (long long)config.num_qo_heads, (long long)config.num_kv_heads,
        (long long)config.head_dim, (long long)config.intermediate, (long long)config.vocab,
        (long long)config.page_size, (unsigned long long)config.weight_seed);
    const llama::Weights weights = llama::make_weights(config, device);
    const auto prompts =
        llama::make_prompts(prompt_lens, config.vocab, static_cast<uint64_t>(prompt_seed));
    const llama::GenerateResult r = llama::generate(config, weights, prompts, options, device);

    std::printf("sampling: top_k %lld, top_p %g, seed %llu; %lld decode steps\n",
                (long long)options.top_k, options.top_p, (unsigned long long)options.seed,
                (long long)options.steps);
    for (size_t b = 0; b < prompts.size(); ++b) {
      std::printf("request %zu: prompt (%zu tokens)", b, prompts[b].size());
      for (int32_t t : prompts[b]) std::printf(" %d", t);
      std::printf("\n           generated");
      for (int32_t t : r.tokens[b]) std::printf(" %d", t);
      std::printf("\n");
    }
    long long prompt_tokens = 0;
    for (const auto& p : prompts) prompt_tokens += static_cast<long long>(p.size());
    const double decode_tokens = static_cast<double>(prompts.size()) * options.steps;
    std::printf("prefill: %lld tokens in %.3f s (%.1f tokens/s, incl. first sample)\n",
                prompt_tokens, r.prefill_seconds, prompt_tokens / r.prefill_seconds);
    if (options.steps > 0)
      std::printf("decode: %.0f tokens in %.3f s: %.1f tokens/s (batch %zu)\n", decode_tokens,
                  r.decode_seconds, decode_tokens / r.decode_seconds, prompts.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama_decode: %s\n", e.what());
    return 1;
  }
  return 0;
}
