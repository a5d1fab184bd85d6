// Benchmark cases declared next to the ops (`flashinfer bench`, modelled on upstream's
// flashinfer_benchmark.py). An op's declaration may carry a bench hook: given the parsed shape
// flags and a device, it builds the op's arguments as Values (seeded random fills, identical on
// every device), a callable that runs the op through its invoker, and upstream's FLOP and byte
// counts for the shape.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/device.h"
#include "flashinfer/dtype.h"
#include "flashinfer/tensor_io.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// The shape flags of `flashinfer bench` (upstream's names). Each routine reads the ones it
/// uses; the defaults are small enough for a quick CPU run.
struct BenchShape {
  // attention
  int64_t batch_size = 4;
  int64_t s_qo = 64;
  int64_t s_kv = 512;
  int64_t num_qo_heads = 8;
  int64_t num_kv_heads = 2;
  int64_t head_dim_qk = 64;
  int64_t head_dim_vo = 64;
  int64_t page_size = 16;
  DType q_dtype = DType::kBFloat16;
  DType kv_dtype = DType::kBFloat16;
  bool causal = false;
  // Multi-item scoring (SGLang's scoring API; the prefill wrappers' prefix_len_ptr,
  // token_pos_in_items_ptr, max_item_len_ptr), where prefix_len >= 0: each request's s_kv tokens
  // (s_qo == s_kv, causal) are a prefix of prefix_len tokens, then items of item_len tokens, each
  // after a delimiter (token_pos_in_items 0, 1 .. item_len, 0, 1 ..), the last cut where the
  // request ends.
  int64_t prefix_len = -1;
  int64_t item_len = 0;
  // BatchMLAPagedAttentionWrapper.run's latent widths (upstream's flags; head_dim_kpe 0: a NoPE
  // model's MLA)
  int64_t head_dim_ckv = 512;
  int64_t head_dim_kpe = 64;
  // gemm (bmm uses batch_size as the batch), quantization uses m x k
  int64_t m = 256, n = 256, k = 256;
  DType input_dtype = DType::kBFloat16;  // norm, activation, gemm, quantization inputs
  std::optional<DType> out_dtype;        // gemm output (default bf16)
  // cutlass_fused_moe: DeepSeek's FP8 block scale (bf16 input quantized 1x128 inside, e4m3
  // weights with 128 x 128 block scales), upstream's use_deepseek_fp8_block_scale
  bool use_deepseek_fp8_block_scale = false;
  // cutlass_fused_moe: W4A16 MXFP4 (input_dtype activations, MXFP4 weights in upstream's SM90
  // layouts), upstream's use_w4_group_scaling with uint8 weights
  bool use_w4_group_scaling = false;
  // norm / activation / sampling
  int64_t hidden_size = 4096;
  int64_t vocab_size = 32000;
  int64_t top_k = 50;
  double top_p = 0.9;
  uint64_t random_seed = 42;
};

/// One benchmarkable instance of an op on one device.
struct BenchCase {
  std::string description;  // the shape in words, for -v
  /// One timed iteration (a wrapper's plan runs once when the case is built; run() is timed).
  std::function<void()> run;
  /// The tensors to compare across backends after one run(): result and mutated arguments.
  std::function<NamedTensors()> outputs;
  /// The call's arguments (bound to the op's parameters) where the case calls a declared op:
  /// refcheck hands them to the op's replay comparator, if it has one. Empty otherwise.
  std::function<std::vector<Value>()> args;
  double flops = 0.0;  // per iteration
  double bytes = 0.0;  // per iteration, each input and output counted once
};

using BenchHook = std::function<BenchCase(const BenchShape&, Device)>;

/// The bench table: routine hooks keyed by op name, kept apart from the op declarations (an
/// engine declaring its own ops need not know about benchmarks). Built-in ops register theirs
/// with the declarations; code outside the library may add its own.
void register_bench_hook(std::string op_name, BenchHook hook);
/// The hook of `op_name`, or nullptr when the op has no bench routine.
const BenchHook* find_bench_hook(std::string_view op_name);
/// Names of every op with a bench routine, sorted.
std::vector<std::string> bench_routines();

/// Runs `c` dry_run_iters times untimed, then num_iters times timed; returns milliseconds per
/// iteration. CPU: steady clock around each run. CUDA: CUDA events on the current stream, the L2
/// flushed before each iteration when flush_l2. Throws flashinfer::Error(kUnsupported) for CUDA
/// when the library was built without CUDA or no GPU is present.
std::vector<double> bench_time_ms(const BenchCase& c, Device device, int dry_run_iters,
                                  int num_iters, bool flush_l2 = true);

/// How a CUDA case is timed, as upstream's bench_gpu_time (the CPU's steady clock ignores it).
struct BenchTiming {
  /// Every timed call reads cold memory: eagerly the L2 is flushed before each iteration; in a
  /// CUDA graph the calls rotate through copies of the inputs (bench_rotation_count).
  bool cold_l2 = true;
  /// Capture iters_within_graph calls into one CUDA graph and time its replays (upstream's
  /// default; --no_cuda_graph turns it off): the launch overhead amortized.
  bool cuda_graph = true;
  int iters_within_graph = 10;
};

/// Times and how they were taken.
struct BenchTimes {
  std::vector<double> ms;  // per call
  /// "cuda_graph" (each time a replay's over its calls), "cuda_events" or "steady_clock".
  std::string method;
  int64_t input_copies = 1;  // the copies a CUDA graph's calls rotated through
  /// Why a CUDA graph was asked for and not used (the calls could not be captured: they
  /// allocate, synchronize or copy through the host), "" otherwise.
  std::string note;
};

/// Copies of a call's inputs a CUDA graph rotates through so that no call finds the previous
/// ones' data in the L2 (upstream's calculate_rotation_count): 1 when one call's bytes are at
/// least 5 x the L2, else max(2, ceil(5 x L2 / bytes) + 1); 1 for no bytes.
int64_t bench_rotation_count(double bytes, int64_t l2_bytes);

/// Times `first` on `device` as `timing` asks. A CUDA graph's input copies are more cases from
/// `make` (same shape, same values, their own memory); when the calls cannot be captured they
/// are timed with CUDA events instead, and `note` says why. The arguments are checked as by
/// bench_time_ms.
BenchTimes bench_time(const BenchCase& first, const std::function<BenchCase()>& make, Device device,
                      int dry_run_iters, int num_iters, const BenchTiming& timing);

}  // namespace flashinfer
