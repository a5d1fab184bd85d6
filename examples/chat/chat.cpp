// chat: answers prompts with a GGUF Llama model (default: SmolLM2-135M-Instruct.Q4_1.gguf, which
// scripts/bootstrap fetches), batched over flashinfer-cpp's paged KV cache.
//
//   chat [--model PATH] [--prompt TEXT]... [--greedy] [--max_new_tokens N] [--device cpu|cuda]
//        [--top_k K] [--top_p P] [--seed S] [--bench PROMPT_LEN,BATCH]
//
// Prompts come from --prompt (any number; they run as one batch) or, without one, from
// standard input, one prompt per line. Each prompt is wrapped in the model's chat template
// (user turn, then the assistant's). A single prompt's answer streams as it is generated;
// with several, each answer is printed when it is complete. One prompt is printed as a
// transcript ("user: ...", "assistant: ..."). Sampling is top-k/top-p unless
// --greedy. Timing goes to standard error. --bench runs BATCH random prompts of PROMPT_LEN
// tokens for max_new_tokens each and prints prefill and decode tokens/s as one JSON line.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "chat/smollm.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/gguf.h"
#include "flashinfer/gguf_tokenizer.h"
#include "flashinfer/recorder.h"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "chat: " << why << "\n"
            << "usage: chat [--model PATH] [--prompt TEXT]... [--greedy] [--max_new_tokens N]\n"
               "            [--device cpu|cuda] [--top_k K] [--top_p P] [--seed S]\n";
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = flashinfer::gguf::default_model_path();
  std::vector<std::string> prompts;
  std::string device = "cpu";
  smollm::GenerateOptions opt;
  int64_t bench_prompt_len = 0, bench_batch = 1;
  opt.greedy = false;
  opt.max_new_tokens = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--model") {
        model_path = value();
      } else if (a == "--prompt") {
        prompts.push_back(value());
      } else if (a == "--greedy") {
        opt.greedy = true;
      } else if (a == "--max_new_tokens") {
        opt.max_new_tokens = std::stoll(value());
      } else if (a == "--device") {
        device = value();
      } else if (a == "--top_k") {
        opt.top_k = std::stoll(value());
      } else if (a == "--top_p") {
        opt.top_p = std::stod(value());
      } else if (a == "--seed") {
        opt.seed = std::stoull(value());
      } else if (a == "--bench") {
        // PROMPT_LEN,BATCH: timing on random prompts (bench/chat_vs_peers.py)
        const std::string v = value();
        const size_t comma = v.find(',');
        if (comma == std::string::npos) usage("--bench takes PROMPT_LEN,BATCH");
        bench_prompt_len = std::stoll(v.substr(0, comma));
        bench_batch = std::stoll(v.substr(comma + 1));
        if (bench_prompt_len < 1 || bench_batch < 1) usage("--bench values must be >= 1");
        opt.greedy = true;
      } else if (a == "-h" || a == "--help") {
        usage("help");
      } else {
        usage("unknown argument " + a);
      }
    } catch (const std::logic_error&) {
      usage("bad value for " + a);
    }
  }
  if (opt.max_new_tokens < 1) usage("--max_new_tokens must be >= 1");
  if (device != "cpu" && device != "cuda") usage("--device must be cpu or cuda");
  if (device == "cuda") {
    // Say plainly why the GPU cannot be used rather than run anything on the CPU instead.
    if (!flashinfer::cuda_compiled()) {
      std::cerr << "chat: --device cuda: this build has no CUDA backend; use --device cpu\n";
      return 2;
    }
    if (flashinfer::cuda_device_count() == 0) {
      std::cerr << "chat: --device cuda: no CUDA device is visible; use --device cpu\n";
      return 2;
    }
  }
  if (prompts.empty() && bench_prompt_len == 0) {
    for (std::string line; std::getline(std::cin, line);)
      if (!line.empty()) prompts.push_back(line);
    if (prompts.empty()) usage("no prompt (give --prompt TEXT or lines on standard input)");
  }

  try {
    const smollm::Model model = smollm::load(
        model_path, device == "cuda" ? flashinfer::Device::cuda(0) : flashinfer::Device::cpu());
    const flashinfer::gguf::Tokenizer tok(model.file);
    std::vector<std::vector<int32_t>> ids;
    if (bench_prompt_len > 0) {
      // Benchmark mode: bench_batch prompts of bench_prompt_len seeded random ids, no stop
      // token, so every request runs max_new_tokens.
      std::mt19937_64 rng(7);
      for (int64_t b = 0; b < bench_batch; ++b) {
        std::vector<int32_t> p;
        for (int64_t i = 0; i < bench_prompt_len; ++i)
          p.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(model.config.vocab)));
        ids.push_back(std::move(p));
      }
      prompts.assign(ids.size(), "(random ids)");
    } else {
      for (const std::string& p : prompts)
        ids.push_back(tok.encode(tok.apply_chat_template({{"user", p}}, true)));
      for (int32_t t : {tok.end_of_turn_id(), tok.eos_id()})
        if (t >= 0) opt.stop_tokens.push_back(t);
    }
    // One prompt is printed as a transcript: "user: ...", then "assistant: " and the answer,
    // streamed. When the API log writes its records to stdout or stderr (FLASHINFER_LOGLEVEL > 0
    // without a FLASHINFER_LOGDEST file), a streamed answer would have them inside its line on
    // the terminal: the answer is then printed whole once generated. (The level-10 warning
    // block comes at load, before main, so it never splits a line.)
    const bool transcript = prompts.size() == 1 && bench_prompt_len == 0;
    const std::string log_dest = flashinfer::api_log::destination();
    const bool log_on_terminal =
        flashinfer::api_log::level() > 0 && (log_dest == "stdout" || log_dest == "stderr");
    const bool stream = transcript && !log_on_terminal;
    if (transcript) {
      std::printf("user: %s\n", prompts[0].c_str());
      if (stream) std::printf("assistant: ");
      std::fflush(stdout);
    }
    std::vector<std::string> answers(prompts.size());
    std::vector<flashinfer::gguf::StreamDecoder> decoders(
        prompts.size(), flashinfer::gguf::StreamDecoder(tok, /*skip_special=*/true));
    const smollm::GenerateResult r = smollm::generate(model, ids, opt, [&](size_t b, int32_t id) {
      const std::string piece = decoders[b].push(id);
      answers[b] += piece;
      if (stream) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
    });
    for (size_t b = 0; b < prompts.size(); ++b) {
      const std::string rest = decoders[b].finish();
      answers[b] += rest;
      if (stream) std::fwrite(rest.data(), 1, rest.size(), stdout);
    }
    if (bench_prompt_len > 0) {
      // The first greedy token of each prompt lets bench/chat_vs_peers.py check that the
      // peers ran the same prompts.
      std::string first;
      for (const auto& t : r.tokens) first += (first.empty() ? "" : ", ") + std::to_string(t[0]);
      std::printf(
          "{\"batch\": %lld, \"prompt_len\": %lld, \"new_tokens\": %lld, "
          "\"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"first\": [%s]}\n",
          static_cast<long long>(bench_batch), static_cast<long long>(bench_prompt_len),
          static_cast<long long>(opt.max_new_tokens), r.prompt_tokens / r.prefill_seconds,
          r.decode_seconds > 0 ? r.decoded_tokens / r.decode_seconds : 0.0, first.c_str());
      return 0;
    }
    if (stream) {
      std::printf("\n");
    } else if (transcript) {
      std::printf("assistant: %s\n", answers[0].c_str());
    } else {
      for (size_t b = 0; b < prompts.size(); ++b)
        std::printf("[%zu] %s\n%s\n\n", b, prompts[b].c_str(), answers[b].c_str());
    }
    std::fflush(stdout);
    std::fprintf(stderr,
                 "chat: %zu prompt(s), %lld prompt tokens prefilled in %.3f s (%.1f tok/s); "
                 "%lld tokens decoded in %lld steps, %.3f s (%.1f tok/s)\n",
                 prompts.size(), static_cast<long long>(r.prompt_tokens), r.prefill_seconds,
                 r.prompt_tokens / r.prefill_seconds, static_cast<long long>(r.decoded_tokens),
                 static_cast<long long>(r.decode_steps), r.decode_seconds,
                 r.decode_seconds > 0 ? r.decoded_tokens / r.decode_seconds : 0.0);
  } catch (const std::exception& e) {
    std::cerr << "chat: " << e.what() << "\n";
    flashinfer::recorder::stop();
    return 1;
  }
  // A recording's exit dump (FLASHINFER_DUMP_RING with the exit trigger) written now, while the
  // CUDA runtime is still up: at exit it could run after the runtime's teardown.
  flashinfer::recorder::stop();
  return 0;
}
