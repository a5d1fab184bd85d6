// Level-5 statistics lines: CPU tensors are reduced in place, CUDA tensors on their device with
// one small copy back, and nothing runs while the stream is being captured into a CUDA graph.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "apilog/format.h"
#include "core/cuda_runtime.h"
#include "flashinfer/stream.h"
#include "kernels/apilog_stats_params.h"
#include "kernels/cpu/apilog_stats_cpu.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/apilog_stats_cuda.h"
#endif

namespace flashinfer::detail::apilog {

namespace {

// Python's "%.6f" (NaN is always "nan", never "-nan"). to_chars with a precision rounds exactly
// as printf does, several times faster.
std::string fixed6(double v) {
  if (std::isnan(v)) return "nan";
  char buf[400];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed, 6);
  return std::string(buf, res.ptr);
}

void add_line(std::string& out, std::string_view prefix, const std::string& text) {
  out += '\n';
  out += prefix;
  out += text;
}

kernels::TensorStatsParams stats_params(const Tensor& t) {
  kernels::TensorStatsParams p;
  if (t.dim() > kernels::kStatsMaxDims) {
    throw std::runtime_error("tensors with more than " + std::to_string(kernels::kStatsMaxDims) +
                             " dimensions are not supported");
  }
  p.data = t.data_ptr();
  p.dtype = t.dtype();
  p.ndim = static_cast<int>(t.dim());
  p.numel = t.numel();
  for (int d = 0; d < p.ndim; ++d) {
    p.shape[d] = t.shape()[d];
    p.strides[d] = t.strides()[d];
  }
  return p;
}

}  // namespace

bool tensor_has_nonfinite(const Tensor& t) {
  if (!dtype_is_floating(t.dtype()) || t.numel() == 0) return false;
  const kernels::TensorStatsParams p = stats_params(t);
  if (t.device().is_cpu()) {
    const kernels::TensorStats s = kernels::cpu::tensor_stats(p);
    return s.nan_count > 0 || s.inf_count > 0;
  }
#if FLASHINFER_WITH_CUDA
  if (detail::cuda_current_stream_capturing()) return false;
  const detail::CudaRelaxedCaptureScope relaxed;  // (another thread's capture)
  const kernels::TensorStats s =
      kernels::cuda::tensor_stats(p, t.device().index, current_cuda_stream());
  return s.nan_count > 0 || s.inf_count > 0;
#else
  return false;
#endif
}

void append_tensor_stats(std::string& out, const Tensor& t, std::string_view prefix) {
  try {
    if (t.device().is_cuda() && detail::cuda_current_stream_capturing()) {
      add_line(out, prefix, "[statistics skipped: CUDA graph capture in progress]");
      return;
    }
    const bool floating = dtype_is_floating(t.dtype());
    const bool integral = dtype_is_integral(t.dtype());
    if ((!floating && !integral) || t.numel() == 0) return;  // bool, fp4: no statistics
    // A dimension of stride 0 repeats every element of the rest the same number of times: the
    // statistics of the view without it are the same, with the counts scaled. So a broadcast
    // view costs what its storage does ({1, 2^34} of one element: one element), not numel.
    Shape distinct = t.shape();
    int64_t repeat = 1;
    for (std::size_t d = 0; d < distinct.size(); ++d) {
      if (t.strides()[d] == 0 && distinct[d] > 1) {
        repeat *= distinct[d];  // divides numel, which fits in int64
        distinct[d] = 1;
      }
    }
    const Tensor v = repeat == 1 ? t : t.as_strided(distinct, t.strides(), t.storage_offset());
    const kernels::TensorStatsParams p = stats_params(v);
    kernels::TensorStats s;
    if (t.device().is_cpu()) {
      s = kernels::cpu::tensor_stats(p);
    } else {
#if FLASHINFER_WITH_CUDA
      const detail::CudaRelaxedCaptureScope relaxed;  // (another thread's capture)
      s = kernels::cuda::tensor_stats(p, t.device().index, current_cuda_stream());
#else
      throw std::runtime_error("CUDA tensor in a build without the CUDA backend");
#endif
    }
    s.nan_count *= repeat;
    s.inf_count *= repeat;
    const double n = static_cast<double>(s.count);  // of the distinct view: the mean is the same
    if (floating) {
      // torch semantics on .float(): NaN propagates into min, max and mean.
      const bool nan = s.nan_count > 0;
      const double mean = nan ? std::nan("") : static_cast<double>(static_cast<float>(s.sum / n));
      add_line(out, prefix, "min=" + fixed6(nan ? std::nan("") : s.min));
      add_line(out, prefix, "max=" + fixed6(nan ? std::nan("") : s.max));
      add_line(out, prefix, "mean=" + fixed6(mean));
      add_line(out, prefix, "nan_count=" + std::to_string(s.nan_count));
      add_line(out, prefix, "inf_count=" + std::to_string(s.inf_count));
    } else {
      add_line(out, prefix, "min=" + std::to_string(s.imin));
      add_line(out, prefix, "max=" + std::to_string(s.imax));
      add_line(out, prefix, "mean=" + fixed6(static_cast<double>(static_cast<float>(s.sum / n))));
    }
  } catch (const std::exception& e) {
    add_line(out, prefix, std::string("[statistics error: ") + e.what() + "]");
  }
}

}  // namespace flashinfer::detail::apilog
