// Sampling ops on the CPU backend (and on CUDA when a device is visible; those cases report an
// error and do nothing otherwise). Bytes are one read of the [batch, vocab] input: the lower
// bound every op pays; the rejection samplers and the bisection-based filters read it several
// times, so their bytes/s is an effective rate, not memory traffic.
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace {

using namespace flashinfer;

enum class Op {
  kSoftmax,
  kSamplingFromProbs,
  kSamplingFromLogits,
  kTopK,
  kTopP,
  kMinP,
  kTopKTopPJoint,
  kTopKTopPFirst,
  kTopKMask,
  kTopKRenorm,
  kTopPRenorm,
};

// Softmax of normal logits (stddev 2): a realistic, peaked row.
Tensor make_probs(int64_t batch, int64_t vocab, Tensor* logits_out) {
  Tensor logits = Tensor::empty({batch, vocab}, DType::kFloat32);
  logits.normal_(7, 0.0, 2.0);
  *logits_out = logits;
  return softmax(logits);
}

void run(Op op, const Tensor& probs, const Tensor& logits, int64_t step) {
  const int64_t seed = 1, off = step * 4096;
  switch (op) {
    case Op::kSoftmax:
      benchmark::DoNotOptimize(softmax(logits, 0.7).data_ptr());
      break;
    case Op::kSamplingFromProbs:
      benchmark::DoNotOptimize(
          sampling_from_probs(probs, std::nullopt, true, false, seed, off).samples.data_ptr());
      break;
    case Op::kSamplingFromLogits:
      benchmark::DoNotOptimize(
          sampling_from_logits(logits, std::nullopt, true, false, seed, off).data_ptr());
      break;
    case Op::kTopK:
      benchmark::DoNotOptimize(
          top_k_sampling_from_probs(probs, 50, std::nullopt, true, false, seed, off)
              .samples.data_ptr());
      break;
    case Op::kTopP:
      benchmark::DoNotOptimize(
          top_p_sampling_from_probs(probs, 0.9, std::nullopt, true, false, seed, off)
              .samples.data_ptr());
      break;
    case Op::kMinP:
      benchmark::DoNotOptimize(
          min_p_sampling_from_probs(probs, 0.05, std::nullopt, true, false, seed, off)
              .samples.data_ptr());
      break;
    case Op::kTopKTopPJoint:
      benchmark::DoNotOptimize(top_k_top_p_sampling_from_probs(probs, 50, 0.9, std::nullopt,
                                                               "joint", true, false, seed, off)
                                   .samples.data_ptr());
      break;
    case Op::kTopKTopPFirst:
      benchmark::DoNotOptimize(top_k_top_p_sampling_from_probs(probs, 50, 0.9, std::nullopt,
                                                               "top_k_first", true, false, seed,
                                                               off)
                                   .samples.data_ptr());
      break;
    case Op::kTopKMask:
      benchmark::DoNotOptimize(top_k_mask_logits(logits, 50).data_ptr());
      break;
    case Op::kTopKRenorm:
      benchmark::DoNotOptimize(top_k_renorm_probs(probs, 50).data_ptr());
      break;
    case Op::kTopPRenorm:
      benchmark::DoNotOptimize(top_p_renorm_probs(probs, 0.9).data_ptr());
      break;
  }
}

void BM_Sampling(benchmark::State& state, Op op, bool on_cuda) {
  if (on_cuda && cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t batch = state.range(0), vocab = state.range(1);
  Tensor logits;
  Tensor probs = make_probs(batch, vocab, &logits);
  if (on_cuda) {
    probs = probs.to(Device::cuda(0));
    logits = logits.to(Device::cuda(0));
  }
  int64_t step = 0;
  for (auto _ : state) {
    run(op, probs, logits, step++);
    // On CUDA each call uploads its per-row table and returns once its kernels have finished,
    // so an iteration is one complete call: copy, kernel(s) and the stream synchronization.
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * batch * vocab * 4);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * batch);
}

#define FI_SAMPLING_BENCH(name, op)                     \
  BENCHMARK_CAPTURE(BM_Sampling, name##_cpu, op, false) \
      ->Args({1, 32000})                                \
      ->Args({64, 32000})                               \
      ->Args({64, 128256})                              \
      ->Unit(benchmark::kMicrosecond)                   \
      ->UseRealTime();                                  \
  BENCHMARK_CAPTURE(BM_Sampling, name##_cuda, op, true) \
      ->Args({1, 32000})                                \
      ->Args({64, 32000})                               \
      ->Args({64, 128256})                              \
      ->Unit(benchmark::kMicrosecond)                   \
      ->UseRealTime()

FI_SAMPLING_BENCH(softmax, Op::kSoftmax);
FI_SAMPLING_BENCH(sampling_from_probs, Op::kSamplingFromProbs);
FI_SAMPLING_BENCH(sampling_from_logits, Op::kSamplingFromLogits);
FI_SAMPLING_BENCH(top_k_sampling_from_probs, Op::kTopK);
FI_SAMPLING_BENCH(top_p_sampling_from_probs, Op::kTopP);
FI_SAMPLING_BENCH(min_p_sampling_from_probs, Op::kMinP);
FI_SAMPLING_BENCH(top_k_top_p_joint, Op::kTopKTopPJoint);
FI_SAMPLING_BENCH(top_k_top_p_top_k_first, Op::kTopKTopPFirst);
FI_SAMPLING_BENCH(top_k_mask_logits, Op::kTopKMask);
FI_SAMPLING_BENCH(top_k_renorm_probs, Op::kTopKRenorm);
FI_SAMPLING_BENCH(top_p_renorm_probs, Op::kTopPRenorm);

}  // namespace
