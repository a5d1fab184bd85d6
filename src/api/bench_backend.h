// `flashinfer bench --backends cudnn auto` for the routines of ops that take a `backend`
// argument (the GEMMs): which of the op's backends (upstream's names) a bench hook passes, and
// the dense tensor-core peak a routine's operand width is measured against. Kept out of
// flashinfer/bench.h (BenchShape), which nearly every source includes: only the GEMM hooks and
// the bench command read this.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flashinfer::api::bench {

/// While alive, bench hooks that call an op with a `backend` argument pass `name` (one thread:
/// the bench command builds its cases on the thread that runs it). Nests; the innermost wins.
class ScopedOpBackend {
 public:
  explicit ScopedOpBackend(std::string name);
  ~ScopedOpBackend();
  ScopedOpBackend(const ScopedOpBackend&) = delete;
  ScopedOpBackend& operator=(const ScopedOpBackend&) = delete;
  /// Whether a hook read the name (op_backend) since this scope began: false after a routine
  /// whose op has no backend choice, so the command can refuse the name instead of timing the
  /// op's default under it.
  bool used() const { return used_; }

 private:
  friend std::string op_backend(std::string_view fallback);
  std::string name_;
  bool used_ = false;
  ScopedOpBackend* outer_;
};

/// The backend a hook passes to its op: the innermost ScopedOpBackend's name (marking it used),
/// else `fallback` (the hook's own default).
std::string op_backend(std::string_view fallback);

/// Backend names of upstream's flashinfer_benchmark.py that select a wrapper's own option rather
/// than an op's `backend` argument, for the routines that have them: the decode wrapper's "fa2"
/// (use_tensor_cores=False: the CUDA-core kernel, or from 4 packed rows a request on a GPU the
/// tensor-core kernel, api::decode_tensor_cores_auto; FLASHINFER_DECODE_TENSOR_CORES=0 keeps the
/// CUDA-core kernel) and "fa2_tc" (use_tensor_cores=True, the tensor-core prefill kernel with the
/// GQA group packed into its rows). Empty for other routines.
std::vector<std::string> wrapper_backends(std::string_view routine);

/// Operand width in bits that a routine's tensor-core work runs at, for "% of the dense peak":
/// 8 for the fp8 routines (bmm_fp8, grouped_mm_fp8, ...: the name says so, whatever
/// --input_dtype), 4 for fp4 ones (no figure: this build's fp4 GEMMs run on 16-bit tensor cores
/// after dequantization), else the bits of the GEMM's input dtype (routines with "mm" in the name)
/// or of the attention q dtype. 0 when the routine has no tensor-core peak to speak of.
constexpr int bench_operand_bits(std::string_view routine, int input_bits, int q_bits) {
  if (routine.find("fp4") != std::string_view::npos) return 0;
  if (routine.find("fp8") != std::string_view::npos) return 8;
  return routine.find("mm") != std::string_view::npos ? input_bits : q_bits;
}

/// Dense tensor-core rate of `bits`-wide operands relative to 16-bit ones on compute capability
/// cc (NVIDIA's datasheets): 1 for 16-bit; 2 for 8-bit on sm89+ (Ada, Hopper, Blackwell: fp8 at
/// twice the bf16 rate, e.g. H100 SXM 1979 against 989 TFLOP/s); 0 where the device has no such
/// tensor cores (fp8 before sm89) or the width has no figure here.
constexpr double dense_tensor_rate_vs_16bit(int cc, int bits) {
  return bits == 16 ? 1.0 : (bits == 8 && cc >= 89) ? 2.0 : 0.0;
}

}  // namespace flashinfer::api::bench
