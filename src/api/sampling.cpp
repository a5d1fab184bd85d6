// Public sampling ops (flashinfer.sampling): declarations, argument checks, per-row arguments and
// dispatch. Shapes, dtypes, devices and scalars are checked here, on the host, before any kernel
// runs, and so are the values of CPU tensors; the values of CUDA tensors are read only by the
// kernels (see "Per-row arguments" below).
#include "flashinfer/ops/sampling.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "api/arg_traits.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "core/cuda_runtime.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/topk.h"
#include "flashinfer/stream.h"
#include "kernels/cpu/sampling_cpu.h"
#include "kernels/cpu/spec_sampling_cpu.h"
#include "kernels/sampling_params.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/sampling_cuda.h"
#include "kernels/cuda/spec_sampling_cuda.h"
#endif

namespace flashinfer {

Value to_value(const SamplingResult& r) {
  if (r.valid.defined()) return Value::tuple({Value(r.samples), Value(r.valid)});
  return Value(r.samples);
}

namespace {

using kernels::FilterKind;
using kernels::SamplingKind;
using SeedArg = std::optional<ScalarOrTensor<int64_t>>;

constexpr const char* kSamplingModule = "flashinfer.sampling";
constexpr uint64_t kTorchDefaultSeed = 67280421310721ull;

// ---------------------------------------------------------------------------------------------
// The library-owned default stream, standing in for upstream's torch generator.

struct DefaultStream {
  std::mutex mu;
  uint64_t seed = kTorchDefaultSeed;
  uint64_t offset = 0;
};

DefaultStream& default_stream() {
  static DefaultStream s;
  return s;
}

// As upstream 0.7.4's get_seed_and_offset: the call draws at the current offset, which then
// advances by `increment` rounded up to a multiple of 4 ("reserve this call's range"; 0.6.18
// drew at the advanced value).
std::pair<uint64_t, uint64_t> draw_seed_offset(uint64_t increment) {
  DefaultStream& s = default_stream();
  std::lock_guard<std::mutex> lock(s.mu);
  const uint64_t at = s.offset;
  s.offset += (increment + 3) / 4 * 4;
  return {s.seed, at};
}

// ---------------------------------------------------------------------------------------------
// Checks and host copies of small per-row tensors.

void check_input(const Tensor& x, const char* op, const char* arg) {
  api::check_defined(x, op, arg);
  api::check_dim(x, {2}, op, arg);
  api::check_dtype_in(x, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, arg);
  api::check_non_empty(x, op, arg);
}

// A 1-D tensor of one of `dtypes` on `ref`'s device (its length is the caller's to check).
void check_1d_tensor(const Tensor& t, const Tensor& ref, std::initializer_list<DType> dtypes,
                     const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {1}, op, arg);
  api::check_dtype_in(t, dtypes, op, arg);
  api::check_same_device(t, ref, op, arg, "the input");
}

// A 1-D tensor of `len` entries (or 1 when `allow_one`) on `ref`'s device.
void check_row_tensor(const Tensor& t, int64_t len, bool allow_one, const Tensor& ref,
                      std::initializer_list<DType> dtypes, const char* op, const char* arg) {
  check_1d_tensor(t, ref, dtypes, op, arg);
  const int64_t n = t.size(0);
  FLASHINFER_CHECK(n == len || (allow_one && n == 1), op, arg, "expected length ", len,
                   allow_one ? " (or 1)" : "", ", got shape ", shape_to_string(t.shape()));
}

// ---------------------------------------------------------------------------------------------
// Per-row arguments. The kernels read each row's values where they are (kernels/sampling_rules.h:
// sampling_row): a scalar, or a 1-D tensor by pointer, dtype and stride. Shapes, dtypes, devices
// and scalar values are checked here for every device; a tensor's values only on the CPU, where
// reading them costs nothing. A CUDA tensor's values are never copied to the host (no
// synchronization, so a call can be captured in a CUDA graph): the kernels clamp what could
// read out of bounds (indices; top_k < 1 as upstream reads it) and use the rest as given.

struct SamplingRows {
  kernels::SamplingRowArgs args;
  int64_t batch = 0;  // output rows
};

kernels::RowArg tensor_arg(const Tensor& t) {
  kernels::RowArg a;
  a.data = t.data_ptr();
  a.dtype = t.dtype();
  a.stride = t.size(0) == 1 ? 0 : t.stride(0);  // one entry: every row reads it
  return a;
}

kernels::RowArg int_arg(int64_t v) {
  kernels::RowArg a;
  a.int_value = v;
  return a;
}

// Output rows and their source rows; checks `indices` (its values on the CPU).
SamplingRows base_rows(const Tensor& input, const std::optional<Tensor>& indices, const char* op) {
  SamplingRows r;
  const int64_t src_rows = input.size(0);
  r.args.src_rows = src_rows;
  r.batch = src_rows;
  if (!indices) return r;
  const Tensor& idx = *indices;
  api::check_defined(idx, op, "indices");
  api::check_dim(idx, {1}, op, "indices");
  api::check_dtype_in(idx, {DType::kInt32, DType::kInt64}, op, "indices");
  api::check_same_device(idx, input, op, "indices", "the input");
  r.batch = idx.size(0);
  r.args.indices = tensor_arg(idx);
  if (idx.device().is_cpu()) {
    const std::vector<int64_t> v = api::host_ints(idx);
    for (std::size_t i = 0; i < v.size(); ++i) {
      FLASHINFER_CHECK(v[i] >= 0 && v[i] < src_rows, op, "indices", "indices[", i, "] = ", v[i],
                       " is out of range [0, ", src_rows, ")");
    }
  }
  return r;
}

// A per-row threshold tensor: one entry per output row; one read at the input row (indices[b])
// one per input row (upstream 0.7.4's check_tensor_param: the probabilities' row count).
void check_threshold_tensor(const Tensor& t, const SamplingRows& rows, bool at_src_row,
                            const Tensor& ref, std::initializer_list<DType> dtypes, const char* op,
                            const char* arg) {
  if (!at_src_row || rows.args.indices.data == nullptr) {
    check_row_tensor(t, rows.batch, false, ref, dtypes, op, arg);
    return;
  }
  check_1d_tensor(t, ref, dtypes, op, arg);
  FLASHINFER_CHECK(t.size(0) == rows.args.src_rows, op, arg,
                   "is read at the input rows (indices[b]), as upstream's kernel reads it: one "
                   "entry per input row (",
                   rows.args.src_rows, "), got ", t.size(0));
}

void apply_top_k(SamplingRows& rows, const ScalarOrTensor<int64_t>& top_k, const Tensor& input,
                 const char* op) {
  auto check = [&](std::size_t i, int64_t k) {
    FLASHINFER_CHECK(k >= 1, op, "top_k", "must be >= 1, got ", k,
                     top_k.is_tensor() ? " at row " + std::to_string(i) : std::string());
  };
  if (top_k.is_tensor()) {
    check_threshold_tensor(top_k.tensor(), rows, rows.args.top_k_by_src_row, input,
                           {DType::kInt32, DType::kInt64}, op, "top_k");
    rows.args.top_k = tensor_arg(top_k.tensor());
    if (input.device().is_cpu()) {
      const std::vector<int64_t> v = api::host_ints(top_k.tensor());
      for (std::size_t i = 0; i < v.size(); ++i) check(i, v[i]);
    }
  } else {
    if (rows.batch > 0) check(0, top_k.scalar());
    rows.args.top_k = int_arg(top_k.scalar());
  }
}

// A float per-row argument; `ok` says whether a value is in range, `range` describes the range.
template <class Ok>
void apply_float(SamplingRows& rows, const ScalarOrTensor<double>& arg,
                 kernels::RowArg kernels::SamplingRowArgs::*field, const Tensor& input,
                 const char* op, const char* name, const char* range, Ok ok,
                 bool at_src_row = false) {
  // Checked as the kernels read it, in fp32: a temperature of 1e-50 is 0 there.
  auto check = [&](std::size_t i, double v) {
    FLASHINFER_CHECK(ok(static_cast<double>(static_cast<float>(v))), op, name, "must be in ", range,
                     " (as fp32), got ", v,
                     arg.is_tensor() ? " at row " + std::to_string(i) : std::string());
  };
  if (arg.is_tensor()) {
    check_threshold_tensor(arg.tensor(), rows, at_src_row, input,
                           {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16},
                           op, name);
    rows.args.*field = tensor_arg(arg.tensor());
    if (input.device().is_cpu()) {
      const std::vector<double> v = arg.tensor().to_double_vector();
      for (std::size_t i = 0; i < v.size(); ++i) check(i, v[i]);
    }
  } else {
    if (rows.batch > 0) check(0, arg.scalar());
    kernels::RowArg a;
    a.dtype = DType::kFloat32;
    a.float_value = static_cast<float>(arg.scalar());
    rows.args.*field = a;
  }
}

void apply_top_p(SamplingRows& rows, const ScalarOrTensor<double>& top_p, const Tensor& input,
                 const char* op) {
  apply_float(
      rows, top_p, &kernels::SamplingRowArgs::top_p, input, op, "top_p", "(0, 1]",
      [](double v) { return v > 0.0 && v <= 1.0; }, rows.args.top_p_by_src_row);
}

// Without seed/offset the draws come from the default generator, advanced on the host: inside
// a CUDA graph capture that (seed, offset) would be baked into the graph and every replay would
// draw the same tokens. Refused, as upstream's generator refuses get_state() under capture.
void check_capture_has_seed(const Tensor& input, const char* op) {
  FLASHINFER_CHECK_CODE(!(input.device().is_cuda() && detail::cuda_current_stream_capturing()),
                        ErrorCode::kUnsupported, op, "seed",
                        "the stream is being captured into a CUDA graph: pass seed and offset "
                        "tensors (a host-drawn seed would be fixed into the graph, so every "
                        "replay would draw the same tokens)");
}

// Validates seed/offset; the default stream is advanced later, once every check has passed.
void check_seed_offset(const SeedArg& seed, const SeedArg& offset, int64_t batch,
                       const Tensor& input, const char* op) {
  FLASHINFER_CHECK(seed.has_value() == offset.has_value(), op, seed ? "offset" : "seed",
                   "seed and offset must be given together");
  if (!seed) {
    check_capture_has_seed(input, op);
    return;
  }
  FLASHINFER_CHECK(seed->is_tensor() == offset->is_tensor(), op, "offset",
                   "seed and offset must both be integers or both be tensors");
  if (seed->is_tensor()) {
    check_row_tensor(seed->tensor(), batch, true, input, {DType::kInt64}, op, "seed");
    check_row_tensor(offset->tensor(), batch, true, input, {DType::kInt64}, op, "offset");
  }
}

void apply_seed_offset(SamplingRows& rows, const SeedArg& seed, const SeedArg& offset,
                       uint64_t increment) {
  if (!seed) {
    const auto [s, o] = draw_seed_offset(increment);
    rows.args.seed = int_arg(static_cast<int64_t>(s));
    rows.args.offset = int_arg(static_cast<int64_t>(o));
    return;
  }
  auto arg = [](const ScalarOrTensor<int64_t>& a) {
    return a.is_tensor() ? tensor_arg(a.tensor()) : int_arg(a.scalar());
  };
  rows.args.seed = arg(*seed);
  rows.args.offset = arg(*offset);
}

// ---------------------------------------------------------------------------------------------
// The backends of each sampling kernel (src/api/kernel_table.h). Every sampler, filter and
// softmax op validates its arguments here, on the host; the kernels accept whatever passes.

using api::KernelEntry;
using api::LaunchContext;

constexpr KernelEntry<kernels::SamplingParams> kSampleKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: inverse CDF, Gumbel-max or dual-pivot rejection per row (Philox)", nullptr,
     [](const kernels::SamplingParams& p, const LaunchContext&) { kernels::cpu::sample(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per row, the same Philox draws as the CPU", nullptr,
     [](const kernels::SamplingParams& p, const LaunchContext& c) {
       kernels::cuda::sample(p, c.stream);
     }},
#endif
};
constexpr KernelEntry<kernels::FilterParams> kFilterKernels[] = {
    {DeviceType::kCPU, "CPU reference: per-row top-k/top-p pivot search", nullptr,
     [](const kernels::FilterParams& p, const LaunchContext&) { kernels::cpu::filter(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per row", nullptr,
     [](const kernels::FilterParams& p, const LaunchContext& c) {
       kernels::cuda::filter(p, c.stream);
     }},
#endif
};
constexpr KernelEntry<kernels::SoftmaxParams> kSoftmaxKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 max-subtracted softmax per row", nullptr,
     [](const kernels::SoftmaxParams& p, const LaunchContext&) { kernels::cpu::softmax(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per row", nullptr,
     [](const kernels::SoftmaxParams& p, const LaunchContext& c) {
       kernels::cuda::softmax(p, c.stream, c.enable_pdl);
     }},
#endif
};

// check_nan=True: whether a [rows, cols] input holds a NaN (written to *found).
struct NanScan {
  const Tensor* x = nullptr;
  bool* found = nullptr;
};
constexpr KernelEntry<NanScan> kNanScanKernels[] = {
    {DeviceType::kCPU, "CPU scan", nullptr,
     [](const NanScan& s, const LaunchContext&) {
       const Tensor& x = *s.x;
       *s.found = kernels::cpu::has_nan(x.data_ptr(), x.dtype(), x.size(0), x.size(1), x.stride(0),
                                        x.stride(1));
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: a device flag", nullptr,
     [](const NanScan& s, const LaunchContext& c) {
       const Tensor& x = *s.x;
       Tensor flag = Tensor::empty({1}, DType::kInt32, x.device());
       kernels::cuda::nan_flag(x.data_ptr(), x.dtype(), x.size(0), x.size(1), x.stride(0),
                               x.stride(1), flag.data<int32_t>(), c.stream);
       *s.found = flag.item() != 0.0;
     }},
#endif
};

void check_no_nan(const Tensor& x, const char* op, const char* arg,
                  const char* what = "contains NaN (check_nan=True)") {
  bool nan = false;
  api::launch(kNanScanKernels, NanScan{&x, &nan}, x.device(), op, arg);
  FLASHINFER_CHECK(!nan, op, arg, what);
}

// The logits compositions check the probabilities they sample from, as upstream's do (NaN logits,
// +inf logits and rows masked to -inf everywhere all give NaN probabilities).
constexpr const char* kSoftmaxNan = "its softmax contains NaN (check_nan=True)";

// Intermediate [batch, vocab] rows of the multi-kernel paths (renormed probs, masked logits,
// their softmax). CPU: fresh tensors. CUDA: views of the stream's sampling scratch
// (kernels::cuda::sampling_scratch), whose lock this object holds until it dies, after the call
// has queued the last kernel reading them; nothing is allocated once the scratch is large enough.
class Intermediates {
 public:
  Intermediates(Device device, int64_t batch, int64_t vocab, const std::vector<DType>& dtypes) {
    std::vector<std::size_t> offsets;
    std::size_t bytes = 0;
    for (DType dt : dtypes) {
      offsets.push_back(bytes);
      bytes += (static_cast<std::size_t>(batch * vocab) * dtype_size(dt) + 255) / 256 * 256;
    }
#if FLASHINFER_WITH_CUDA
    const bool scratch = device.is_cuda() && bytes > 0;
#else
    const bool scratch = false;
#endif
    if (!scratch) {
      for (DType dt : dtypes) t_.push_back(Tensor::empty({batch, vocab}, dt, device));
      return;
    }
#if FLASHINFER_WITH_CUDA
    lease_ = kernels::cuda::sampling_scratch(device.index, current_cuda_stream(), bytes);
    std::size_t i = 0;
    for (DType dt : dtypes) {
      t_.push_back(Tensor::from_blob(static_cast<char*>(lease_.data()) + offsets[i++],
                                     {batch, vocab}, {vocab, 1}, dt, device));
    }
#endif
  }
  Intermediates(const Intermediates&) = delete;
  Intermediates& operator=(const Intermediates&) = delete;

  const Tensor& operator[](std::size_t i) const { return t_[i]; }

 private:
#if FLASHINFER_WITH_CUDA
  kernels::cuda::SamplingScratch lease_;
#endif
  std::vector<Tensor> t_;
};

// `src` cast into `dst` (same shape, both contiguous rows), rounding to nearest even as
// Tensor::to does, without allocating on the device.
void round_into(const Tensor& src, const Tensor& dst) {
  if (src.numel() == 0) return;
#if FLASHINFER_WITH_CUDA
  if (src.device().is_cuda() &&
      detail::cuda_tensor_copy(dst.data_ptr(), dst.dtype(), src.shape(), dst.strides(),
                               src.data_ptr(), src.dtype(), src.strides(), nullptr,
                               src.device().index)) {
    return;
  }
#endif
  Tensor d = dst;
  d.copy_(src.to(dst.dtype()));
}

// ---------------------------------------------------------------------------------------------
// Launch helpers (arguments already validated).

SamplingResult launch_sample(const char* op, const Tensor& input, const SamplingRows& rows,
                             SamplingKind kind, DType out_dtype, bool return_valid,
                             const Tensor* sample_map = nullptr) {
  const int64_t batch = rows.batch;
  SamplingResult r;
  r.samples = Tensor::empty({batch}, out_dtype, input.device());
  if (return_valid) r.valid = Tensor::empty({batch}, DType::kBool, input.device());
  if (batch > 0) {
    kernels::SamplingParams p;
    p.input = input.data_ptr();
    p.dtype = input.dtype();
    p.vocab = input.size(1);
    p.in_stride_row = input.stride(0);
    p.in_stride_col = input.stride(1);
    p.rows = rows.args;
    p.batch = batch;
    p.samples = r.samples.data_ptr();
    p.out_dtype = out_dtype;
    p.valid = return_valid ? r.valid.data<bool>() : nullptr;
    p.kind = kind;
    if (sample_map != nullptr) {  // int64 [batch, vocab], unit column stride
      p.sample_map = sample_map->data<int64_t>();
      p.sample_map_stride = sample_map->stride(0);
    }
    api::launch(kSampleKernels, p, input.device(), op, "probs");
  }
  return r;
}

// Writes the filtered rows into `out` ([batch, vocab]).
void launch_filter_into(const char* op, const Tensor& input, const SamplingRows& rows,
                        FilterKind kind, const Tensor& out) {
  if (rows.batch == 0) return;
  kernels::FilterParams p;
  p.input = input.data_ptr();
  p.in_dtype = input.dtype();
  p.out = out.data_ptr();
  p.out_dtype = out.dtype();
  p.vocab = input.size(1);
  p.in_stride_row = input.stride(0);
  p.in_stride_col = input.stride(1);
  p.out_stride_row = out.stride(0);
  p.out_stride_col = out.stride(1);
  p.rows = rows.args;
  p.batch = rows.batch;
  p.kind = kind;
  api::launch(kFilterKernels, p, input.device(), op, "probs");
}

Tensor launch_filter(const char* op, const Tensor& input, const SamplingRows& rows, FilterKind kind,
                     DType out_dtype) {
  Tensor out = Tensor::empty({rows.batch, input.size(1)}, out_dtype, input.device());
  launch_filter_into(op, input, rows, kind, out);
  return out;
}

// Writes the softmax rows into `out` (contiguous fp32 [batch, vocab]).
void launch_softmax_into(const char* op, const Tensor& logits, const SamplingRows& rows,
                         std::optional<bool> enable_pdl, const Tensor& out) {
  if (rows.batch == 0) return;
  kernels::SoftmaxParams p;
  p.logits = logits.data_ptr();
  p.dtype = logits.dtype();
  p.out = out.data<float>();
  p.vocab = logits.size(1);
  p.in_stride_row = logits.stride(0);
  p.in_stride_col = logits.stride(1);
  p.rows = rows.args;
  p.batch = rows.batch;
  api::launch(kSoftmaxKernels, p, logits.device(), op, "logits", enable_pdl);
}

Tensor launch_softmax(const char* op, const Tensor& logits, const SamplingRows& rows,
                      std::optional<bool> enable_pdl) {
  Tensor out = Tensor::empty({rows.batch, logits.size(1)}, DType::kFloat32, logits.device());
  launch_softmax_into(op, logits, rows, enable_pdl, out);
  return out;
}

constexpr KernelEntry<kernels::SamplingParams> kTopKFirstLogitsKernels[] = {
    {DeviceType::kCPU, "CPU: top-k mask, softmax and top-p rejection fused per row (Philox)",
     nullptr,
     [](const kernels::SamplingParams& p, const LaunchContext&) {
       kernels::cpu::sample_top_k_first_from_logits(p);
     }},
};

// top_k_top_p_sampling_from_logits, "top_k_first", on the CPU: one fused kernel that gives the
// samples of launch_filter(kTopKMask) -> launch_softmax -> launch_sample(kTopP).
Tensor launch_top_k_first_logits(const char* op, const Tensor& logits, const SamplingRows& rows,
                                 DType out_dtype) {
  const int64_t batch = rows.batch;
  Tensor samples = Tensor::empty({batch}, out_dtype, logits.device());
  if (batch == 0) return samples;
  kernels::SamplingParams p;
  p.input = logits.data_ptr();
  p.dtype = logits.dtype();
  p.vocab = logits.size(1);
  p.in_stride_row = logits.stride(0);
  p.in_stride_col = logits.stride(1);
  p.rows = rows.args;
  p.batch = batch;
  p.samples = samples.data_ptr();
  p.out_dtype = out_dtype;
  p.kind = SamplingKind::kTopP;
  api::launch(kTopKFirstLogitsKernels, p, logits.device(), op, "logits");
  return samples;
}

// The input's own rows (no indices): what upstream's filters and softmax run over before a
// sampler reads their output through indices. Per-row thresholds read at the source row are
// then read at row r.
SamplingRows input_rows(SamplingRows rows) {
  rows.args.indices = {};
  rows.batch = rows.args.src_rows;
  return rows;
}

DType sample_dtype(const std::optional<Tensor>& indices) {
  return indices ? indices->dtype() : DType::kInt32;
}

uint64_t rng_increment(SamplingKind kind, int64_t batch, int64_t vocab) {
  const uint64_t b = static_cast<uint64_t>(batch);
  switch (kind) {
    case SamplingKind::kProbs:
    case SamplingKind::kMinP:
      return b;
    case SamplingKind::kLogits:
      return b * static_cast<uint64_t>(vocab);
    default:
      return b * kernels::kRejectionWordsPerRow;
  }
}

// ---------------------------------------------------------------------------------------------
// Op bodies.

struct Filters {
  const ScalarOrTensor<int64_t>* top_k = nullptr;
  const ScalarOrTensor<double>* top_p = nullptr;
  const ScalarOrTensor<double>* min_p = nullptr;
};

// Everything a sampler needs, checked, with seed/offset resolved.
SamplingRows prepare_sampling(const char* op, const char* input_name, const Tensor& input,
                              const std::optional<Tensor>& indices, Filters f, bool check_nan,
                              const SeedArg& seed, const SeedArg& offset, SamplingKind rng_kind) {
  check_input(input, op, input_name);
  SamplingRows rows = base_rows(input, indices, op);
  // Where upstream 0.7.4's kernels read a per-row threshold when indices map output row b to
  // input row indices[b]: top_p, top_k and min_p all at the input row (0.6.18 read the top-k
  // sampler's top_k and min_p at the output row; upstream PR 5340). "top_k_first" filters the
  // input's rows with top_k[row] before top-p samples through indices.
  rows.args.top_p_by_src_row = true;
  rows.args.top_k_by_src_row = true;
  rows.args.min_p_by_src_row = true;
  if (f.top_k) apply_top_k(rows, *f.top_k, input, op);
  if (f.top_p) apply_top_p(rows, *f.top_p, input, op);
  if (f.min_p) {
    apply_float(
        rows, *f.min_p, &kernels::SamplingRowArgs::min_p, input, op, "min_p", "[0, 1]",
        [](double v) { return v >= 0.0 && v <= 1.0; }, rows.args.min_p_by_src_row);
  }
  check_seed_offset(seed, offset, rows.batch, input, op);
  if (check_nan) check_no_nan(input, op, input_name);
  apply_seed_offset(rows, seed, offset, rng_increment(rng_kind, rows.batch, input.size(1)));
  return rows;
}

SamplingResult simple_sampler(const char* op, const Tensor& probs, SamplingKind kind, Filters f,
                              const std::optional<Tensor>& indices, bool check_nan,
                              const SeedArg& seed, const SeedArg& offset, bool return_valid) {
  const SamplingRows rows =
      prepare_sampling(op, "probs", probs, indices, f, check_nan, seed, offset, kind);
  return launch_sample(op, probs, rows, kind, sample_dtype(indices), return_valid);
}

// Upstream's fast path for "top_k_first" (0.7.4's sampling.py, _top_k_first_fast_path): with
// `indices` absent or a 1-D int32 / int64 tensor on the input's device, a select k in (0, 256]
// below the vocabulary (a Python int top_k, or for a top_k tensor of one entry per input row the
// caller's top_k_max) and a vocabulary of at least 65536, upstream selects each input row's top
// select-k (flashinfer.top_k, sorted: descending, ties by ascending index); for a top_k tensor
// it keeps each row's first max(k, 1) columns (all for k < 0: a k above top_k_max is cut to it,
// and k = 0 is greedy) and sets the rest to -inf (logits) or 0 (probs); makes them probabilities
// (the fp32 softmax of the logits; the probs over their sum); samples top-p over those columns
// with the call's indices, seed and offset (top_p_sampling_from_probs: the same increment of the
// default stream, 32 per row, and check_nan on the kept columns), and reports the sampled
// column's token of the sampled input row. It is equal in distribution to the masked path, not
// draw for draw, so a replay of upstream's call must take it too.
constexpr int64_t kTopKFirstFastMaxK = 256;
constexpr int64_t kTopKFirstFastMinVocab = 65536;

/// The select k of the fast path when it applies, else nullopt.
std::optional<int64_t> top_k_first_fast_k(const Tensor& x, const ScalarOrTensor<int64_t>& top_k,
                                          const std::optional<Tensor>& indices,
                                          std::optional<int64_t> top_k_max) {
  if (x.dim() != 2) return std::nullopt;
  if (indices && (indices->dim() != 1 || indices->device() != x.device() ||
                  (indices->dtype() != DType::kInt32 && indices->dtype() != DType::kInt64))) {
    return std::nullopt;
  }
  // A top_k tensor the kernels could not read as it is (another device, a float dtype) takes the
  // masked path, whose checks name it.
  if (top_k.is_tensor() &&
      (top_k.tensor().dim() != 1 || top_k.tensor().size(0) != x.size(0) ||
       top_k.tensor().device() != x.device() ||
       (top_k.tensor().dtype() != DType::kInt32 && top_k.tensor().dtype() != DType::kInt64))) {
    return std::nullopt;
  }
  const std::optional<int64_t> k = top_k.is_tensor() ? top_k_max : top_k.scalar();
  const int64_t v = x.size(1);
  if (!k || *k <= 0 || *k > kTopKFirstFastMaxK || v < kTopKFirstFastMinVocab || *k >= v) {
    return std::nullopt;
  }
  return k;
}

SamplingResult top_k_first_fast(const char* op, const char* input_name, const Tensor& x,
                                const ScalarOrTensor<int64_t>& top_k, int64_t select_k,
                                const ScalarOrTensor<double>& top_p,
                                const std::optional<Tensor>& indices, bool from_logits,
                                bool check_nan, const SeedArg& seed, const SeedArg& offset,
                                bool return_valid) {
  check_input(x, op, input_name);
  {  // indices, top_p, seed and offset checked before anything runs
    SamplingRows chk = base_rows(x, indices, op);
    chk.args.top_p_by_src_row = true;  // as prepare_sampling reads it below
    apply_top_p(chk, top_p, x, op);
    check_seed_offset(seed, offset, chk.batch, x, op);
  }
  auto [values, tokens] = flashinfer::top_k(x, select_k, /*sorted=*/true, /*deterministic=*/true);
  const Tensor v = values.to(DType::kFloat32);
  const SamplingRows own = base_rows(v, std::nullopt, op);
  // A top_k tensor keeps each row's prefix of the sorted columns (sampling_column_limit), read at
  // the input row as upstream's top_k.int() is.
  SamplingRows by_row = own;
  if (top_k.is_tensor()) by_row.args.top_k = tensor_arg(top_k.tensor());
  Tensor probs;
  if (from_logits) {
    probs = top_k.is_tensor()
                ? launch_softmax(
                      op, launch_filter(op, v, by_row, FilterKind::kColumnMask, DType::kFloat32),
                      own, std::nullopt)
                : launch_softmax(op, v, own, std::nullopt);
  } else {
    // Upstream divides the kept values by their sum, so a NaN among them makes the row NaN and
    // check_nan raises; the renorm below would zero it: checked on the kept values first (the
    // column mask keeps them as they are, the others -inf).
    if (check_nan) {
      check_no_nan(top_k.is_tensor()
                       ? launch_filter(op, v, by_row, FilterKind::kColumnMask, DType::kFloat32)
                       : v,
                   op, input_name);
    }
    if (top_k.is_tensor()) {
      probs = launch_filter(op, v, by_row, FilterKind::kColumnRenorm, DType::kFloat32);
    } else {
      // top_k_renorm_probs keeping all k columns: each over the row's sum.
      SamplingRows all = own;
      all.args.top_k = int_arg(select_k);
      probs = launch_filter(op, v, all, FilterKind::kTopKRenorm, DType::kFloat32);
    }
  }
  const Filters f{nullptr, &top_p, nullptr};
  const SamplingRows rows = prepare_sampling(op, input_name, probs, indices, f, check_nan, seed,
                                             offset, SamplingKind::kTopP);
  return launch_sample(op, probs, rows, SamplingKind::kTopP, sample_dtype(indices), return_valid,
                       &tokens);
}

void check_order(const std::string& order, const char* op) {
  FLASHINFER_CHECK(order == "top_k_first" || order == "joint", op, "filter_apply_order",
                   "must be \"top_k_first\" or \"joint\", got \"", order, "\"");
}

SamplingResult top_k_top_p_probs_impl(const Tensor& probs, const ScalarOrTensor<int64_t>& top_k,
                                      const ScalarOrTensor<double>& top_p,
                                      const std::optional<Tensor>& indices,
                                      const std::string& order, bool check_nan, const SeedArg& seed,
                                      const SeedArg& offset, bool return_valid,
                                      std::optional<int64_t> top_k_max) {
  const char* op = "top_k_top_p_sampling_from_probs";
  check_order(order, op);
  const Filters f{&top_k, &top_p, nullptr};
  if (order == "joint") {
    return simple_sampler(op, probs, SamplingKind::kTopKTopP, f, indices, check_nan, seed, offset,
                          return_valid);
  }
  if (const auto k = top_k_first_fast_k(probs, top_k, indices, top_k_max)) {
    return top_k_first_fast(op, "probs", probs, top_k, *k, top_p, indices, false, check_nan, seed,
                            offset, return_valid);
  }
  // Upstream's composition: top_k_renorm_probs over the input's rows, then top-p sampling
  // through indices.
  const SamplingRows rows = prepare_sampling(op, "probs", probs, indices, f, check_nan, seed,
                                             offset, SamplingKind::kTopP);
  const SamplingRows in_rows = input_rows(rows);
  const Intermediates tmp(probs.device(), in_rows.batch, probs.size(1), {probs.dtype()});
  launch_filter_into(op, probs, in_rows, FilterKind::kTopKRenorm, tmp[0]);
  return launch_sample(op, tmp[0], rows, SamplingKind::kTopP, sample_dtype(indices), return_valid);
}

Tensor top_k_top_p_logits_impl(const Tensor& logits, const ScalarOrTensor<int64_t>& top_k,
                               const ScalarOrTensor<double>& top_p,
                               const std::optional<Tensor>& indices, const std::string& order,
                               bool check_nan, const SeedArg& seed, const SeedArg& offset,
                               std::optional<int64_t> top_k_max) {
  const char* op = "top_k_top_p_sampling_from_logits";
  check_order(order, op);
  const Filters f{&top_k, &top_p, nullptr};
  if (const auto k = order == "top_k_first" ? top_k_first_fast_k(logits, top_k, indices, top_k_max)
                                            : std::nullopt) {
    return top_k_first_fast(op, "logits", logits, top_k, *k, top_p, indices, true, check_nan, seed,
                            offset, false)
        .samples;
  }
  // Upstream's compositions: softmax over the input's rows, then the joint sampler through
  // indices; or top_k_mask_logits and softmax over the input's rows, then top-p sampling
  // through indices.
  const SamplingRows rows = prepare_sampling(op, "logits", logits, indices, f, false, seed, offset,
                                             SamplingKind::kTopKTopP);
  const SamplingRows in_rows = input_rows(rows);
  const Device dev = logits.device();
  const int64_t vocab = logits.size(1);
  // torch.softmax keeps 16-bit logits' dtype: upstream samples from probabilities rounded to it.
  // The rounded copy goes into the last scratch slot (no allocation per call on the device).
  const DType ldt = logits.dtype();
  auto as_torch_softmax = [&](const Tensor& probs, const Tensor& rounded) -> Tensor {
    if (ldt == DType::kFloat32) return probs;
    round_into(probs, rounded);
    return rounded;
  };
  if (order == "joint") {
    std::vector<DType> slots{DType::kFloat32};
    if (ldt != DType::kFloat32) slots.push_back(ldt);
    const Intermediates tmp(dev, in_rows.batch, vocab, slots);
    launch_softmax_into(op, logits, in_rows, std::nullopt, tmp[0]);
    if (check_nan) check_no_nan(tmp[0], op, "logits", kSoftmaxNan);
    return launch_sample(op, as_torch_softmax(tmp[0], tmp[slots.size() - 1]), rows,
                         SamplingKind::kTopKTopP, sample_dtype(indices), false)
        .samples;
  }
  if (dev.is_cpu()) {
    if (check_nan) {
      const Tensor masked = launch_filter(op, logits, in_rows, FilterKind::kTopKMask, ldt);
      check_no_nan(launch_softmax(op, masked, in_rows, std::nullopt), op, "logits", kSoftmaxNan);
    }
    // The same three steps fused per output row on the CPU (no [rows, vocab] intermediates).
    return launch_top_k_first_logits(op, logits, rows, sample_dtype(indices));
  }
  std::vector<DType> slots{ldt, DType::kFloat32};
  if (ldt != DType::kFloat32) slots.push_back(ldt);
  const Intermediates tmp(dev, in_rows.batch, vocab, slots);
  launch_filter_into(op, logits, in_rows, FilterKind::kTopKMask, tmp[0]);
  launch_softmax_into(op, tmp[0], in_rows, std::nullopt, tmp[1]);
  if (check_nan) check_no_nan(tmp[1], op, "logits", kSoftmaxNan);
  return launch_sample(op, as_torch_softmax(tmp[1], tmp[slots.size() - 1]), rows,
                       SamplingKind::kTopP, sample_dtype(indices), false)
      .samples;
}

Tensor softmax_impl(const Tensor& logits, const std::optional<ScalarOrTensor<double>>& temperature,
                    std::optional<bool> enable_pdl) {
  const char* op = "softmax";
  check_input(logits, op, "logits");
  SamplingRows rows = base_rows(logits, std::nullopt, op);
  if (temperature) {
    apply_float(rows, *temperature, &kernels::SamplingRowArgs::temperature, logits, op,
                "temperature", "[0, inf)", [](double v) { return v >= 0.0 && std::isfinite(v); });
  }
  return launch_softmax(op, logits, rows, enable_pdl);
}

Tensor renorm_impl(const char* op, const char* input_name, const Tensor& input,
                   const ScalarOrTensor<int64_t>* top_k, const ScalarOrTensor<double>* top_p,
                   FilterKind kind, DType out_dtype) {
  check_input(input, op, input_name);
  SamplingRows rows = base_rows(input, std::nullopt, op);
  if (top_k) apply_top_k(rows, *top_k, input, op);
  if (top_p) apply_top_p(rows, *top_p, input, op);
  return launch_filter(op, input, rows, kind, out_dtype);
}

// ---------------------------------------------------------------------------------------------
// chain_speculative_sampling: the CPU reference and the CUDA kernel take the same Philox draws
// and add the residual in the same order (kernels/spec_sampling_rules.h), so they agree exactly.

constexpr api::KernelEntry<kernels::ChainSpecParams> kChainSpecKernels[] = {
    {DeviceType::kCPU, "CPU reference: one Philox stream per request, OpenMP rows", nullptr,
     [](const kernels::ChainSpecParams& p, const api::LaunchContext&) {
       kernels::cpu::chain_speculative_sampling(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per request, the same draws and sums as the CPU",
     nullptr,
     [](const kernels::ChainSpecParams& p, const api::LaunchContext& c) {
       kernels::cuda::chain_speculative_sampling(p, c.stream, c.enable_pdl);
     }},
#endif
};

std::tuple<Tensor, Tensor, Tensor> chain_spec_impl(const Tensor& draft_probs,
                                                   const Tensor& draft_token_ids,
                                                   const Tensor& target_probs,
                                                   const std::optional<Tensor>& acc_in,
                                                   const std::optional<Tensor>& emi_in,
                                                   const SeedArg& seed, const SeedArg& offset) {
  const char* op = "chain_speculative_sampling";
  api::check_defined(draft_probs, op, "draft_probs");
  api::check_dim(draft_probs, {3}, op, "draft_probs");
  api::check_dtype_in(draft_probs, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op,
                      "draft_probs");
  const int64_t b = draft_probs.size(0), n = draft_probs.size(1), v = draft_probs.size(2);
  FLASHINFER_CHECK(v >= 1, op, "draft_probs", "the vocabulary must not be empty");
  api::check_defined(target_probs, op, "target_probs");
  api::check_same_dtype(target_probs, draft_probs, op, "target_probs", "draft_probs");
  api::check_shape_eq(target_probs, {b, n + 1, v}, op, "target_probs");
  api::check_same_device(target_probs, draft_probs, op, "target_probs", "draft_probs");
  api::check_defined(draft_token_ids, op, "draft_token_ids");
  api::check_dtype_in(draft_token_ids, {DType::kInt32, DType::kInt64}, op, "draft_token_ids");
  api::check_shape_eq(draft_token_ids, {b, n}, op, "draft_token_ids");
  api::check_same_device(draft_token_ids, draft_probs, op, "draft_token_ids", "draft_probs");
  // Upstream casts the ids and the counters to int32 (`.int()`) and returns int32 tokens; an
  // int64 counter is thereby a copy: the kernel adds to the copy and the caller's counter comes
  // back unchanged. The same here.
  const DType id = DType::kInt32;
  auto counter = [&](const std::optional<Tensor>& t, const char* arg) {
    if (!t) return Tensor::zeros({b}, id, draft_probs.device());
    api::check_defined(*t, op, arg);
    api::check_dtype_in(*t, {DType::kInt32, DType::kInt64}, op, arg);
    api::check_shape_eq(*t, {b}, op, arg);
    api::check_same_device(*t, draft_probs, op, arg, "draft_probs");
    FLASHINFER_CHECK(t->is_contiguous(), op, arg, "must be contiguous");
    return *t;
  };
  Tensor acc = counter(acc_in, "maybe_output_accepted_token_num");
  Tensor emi = counter(emi_in, "maybe_output_emitted_draft_token_num");
  FLASHINFER_CHECK(!acc_in || !emi_in || !detail::views_overlap(acc, emi), op,
                   "maybe_output_emitted_draft_token_num",
                   "must not overlap maybe_output_accepted_token_num");
  FLASHINFER_CHECK(seed.has_value() == offset.has_value(), op, seed ? "offset" : "seed",
                   "seed and offset must be given together");
  // A seed or offset: an integer, or an int32/int64 tensor of one entry (every request) or one
  // per request (read at the request's row, as upstream 0.7.4's kernel does; 0.6.18 read element
  // 0). A tensor on the probabilities' device is read by the kernel, so a CUDA call never waits
  // for it.
  Tensor seed_keep, offset_keep;
  auto per_row = [&](const ScalarOrTensor<int64_t>& a, const char* arg,
                     Tensor& keep) -> kernels::RowArg {
    if (!a.is_tensor()) return int_arg(a.scalar());
    FLASHINFER_CHECK(a.tensor().numel() == 1 || (a.tensor().dim() == 1 && a.tensor().size(0) == b),
                     op, arg, "expected an integer or a tensor of 1 or ", b, " elements");
    api::check_dtype_in(a.tensor(), {DType::kInt64, DType::kInt32}, op, arg);
    keep = a.tensor().reshape({a.tensor().numel()});
    if (!keep.device().is_cpu()) api::check_same_device(keep, draft_probs, op, arg, "draft_probs");
    return tensor_arg(keep);
  };
  // The draft ids index the probability rows: checked here on the CPU, so a bad id is an Error;
  // a CUDA call's ids are only seen by the kernel, which clamps the column it reads
  // (spec_draft_column), so a bad id is never an out-of-bounds read.
  const Tensor dp = draft_probs.contiguous(), tp = target_probs.contiguous(),
               ids = draft_token_ids.contiguous().to(id);
  if (b * n > 0 && ids.device().is_cpu()) {
    const std::vector<int64_t> host_ids = api::host_ints(ids.reshape({b * n}));
    for (int64_t i = 0; i < b * n; ++i) {
      const int64_t d = host_ids[static_cast<std::size_t>(i)];
      FLASHINFER_CHECK(d >= 0 && d < v, op, "draft_token_ids", "token ", d, " at [", i / n, ", ",
                       i % n, "] is outside the vocabulary of ", v);
    }
  }
  Tensor out = Tensor::empty({b, n + 1}, id, draft_probs.device());
  kernels::ChainSpecParams p;
  p.draft_probs = dp.data_ptr();
  p.target_probs = tp.data_ptr();
  p.dtype = dp.dtype();
  p.draft_ids = ids.data_ptr();
  p.out_ids = out.data_ptr();
  const Tensor acc32 = acc.to(id), emi32 = emi.to(id);  // the same tensors when int32
  p.accepted = acc32.data_ptr();
  p.emitted = emi32.data_ptr();
  p.id_dtype = id;
  p.batch = b;
  p.n = n;
  p.vocab = v;
  if (b > 0) {
    if (seed) {
      p.seed = per_row(*seed, "seed", seed_keep);
      p.offset = per_row(*offset, "offset", offset_keep);
    } else {
      check_capture_has_seed(draft_probs, op);
      // Upstream 0.7.4's increment: batch * (n + 2) words (0.6.18: n + 1).
      const auto [s, o] = draw_seed_offset(static_cast<uint64_t>(b * (n + 2)));
      p.seed = int_arg(static_cast<int64_t>(s));
      p.offset = int_arg(static_cast<int64_t>(o));
    }
  }
  api::launch(kChainSpecKernels, p, draft_probs.device(), op, "draft_probs");
  return {out, acc, emi};
}

// ---------------------------------------------------------------------------------------------
// Declarations. Upstream's samplers take `generator` (a torch.Generator) right after
// `deterministic`; it has no C++ counterpart. Each sampler is declared through
// WithGenerator<&fn, Pos>::op, the same function with that slot inserted at position Pos, so
// recorded argument indices match upstream's. The slot is recorded as None, and a recorded
// generator is ignored on replay.

struct TorchGenerator {};
using GeneratorSlot = std::optional<TorchGenerator>;
Value to_value(TorchGenerator) { return Value(); }
constexpr GeneratorSlot kNoGenerator;

template <auto Fn, class Head, class Tail>
struct WithGeneratorAt;
template <auto Fn, class... H, class... T>
struct WithGeneratorAt<Fn, std::tuple<H...>, std::tuple<T...>> {
  static auto op(H... head, GeneratorSlot, T... tail) { return Fn(head..., tail...); }
};
template <auto Fn, std::size_t Pos, class Args, std::size_t... I, std::size_t... J>
WithGeneratorAt<Fn, std::tuple<std::tuple_element_t<I, Args>...>,
                std::tuple<std::tuple_element_t<Pos + J, Args>...>>
    split_at(std::index_sequence<I...>, std::index_sequence<J...>);  // unevaluated only
template <auto Fn, std::size_t Pos, class Args = typename detail::FnInfo<decltype(Fn)>::Args>
using WithGenerator = decltype(split_at<Fn, Pos, Args>(
    std::make_index_sequence<Pos>{}, std::make_index_sequence<std::tuple_size_v<Args> - Pos>{}));

}  // namespace

template <>
struct ArgTraits<TorchGenerator> {
  static constexpr ParamKind kind = ParamKind::kObject;
  static TorchGenerator get(const CallArgs&, std::size_t) { return {}; }
};

// ---------------------------------------------------------------------------------------------
// Public functions.

std::tuple<Tensor, Tensor, Tensor> chain_speculative_sampling(
    const Tensor& draft_probs, const Tensor& draft_token_ids, const Tensor& target_probs,
    std::optional<Tensor> maybe_output_accepted_token_num,
    std::optional<Tensor> maybe_output_emitted_draft_token_num, bool deterministic, SeedArg seed,
    SeedArg offset) {
  return call_op<&WithGenerator<&chain_speculative_sampling, 6>::op>(
      [&] {
        return chain_spec_impl(draft_probs, draft_token_ids, target_probs,
                               maybe_output_accepted_token_num,
                               maybe_output_emitted_draft_token_num, seed, offset);
      },
      draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num,
      maybe_output_emitted_draft_token_num, deterministic, kNoGenerator, seed, offset);
}

void sampling_manual_seed(uint64_t seed) {
  DefaultStream& s = default_stream();
  std::lock_guard<std::mutex> lock(s.mu);
  s.seed = seed;
  s.offset = 0;
}

Tensor softmax(const Tensor& logits, std::optional<ScalarOrTensor<double>> temperature,
               std::optional<bool> enable_pdl) {
  return call_op<&softmax>([&] { return softmax_impl(logits, temperature, enable_pdl); }, logits,
                           temperature, enable_pdl);
}

SamplingResult sampling_from_probs(const Tensor& probs, std::optional<Tensor> indices,
                                   bool deterministic, bool check_nan, SeedArg seed, SeedArg offset,
                                   bool return_valid) {
  return call_op<&WithGenerator<&sampling_from_probs, 3>::op>(
      [&] {
        return simple_sampler("sampling_from_probs", probs, SamplingKind::kProbs, {}, indices,
                              check_nan, seed, offset, return_valid);
      },
      probs, indices, deterministic, kNoGenerator, check_nan, seed, offset, return_valid);
}

Tensor sampling_from_logits(const Tensor& logits, std::optional<Tensor> indices, bool deterministic,
                            bool check_nan, SeedArg seed, SeedArg offset) {
  return call_op<&WithGenerator<&sampling_from_logits, 3>::op>(
      [&] {
        const char* op = "sampling_from_logits";
        const SamplingRows rows = prepare_sampling(op, "logits", logits, indices, {}, check_nan,
                                                   seed, offset, SamplingKind::kLogits);
        return launch_sample(op, logits, rows, SamplingKind::kLogits, sample_dtype(indices), false)
            .samples;
      },
      logits, indices, deterministic, kNoGenerator, check_nan, seed, offset);
}

SamplingResult top_p_sampling_from_probs(const Tensor& probs, ScalarOrTensor<double> top_p,
                                         std::optional<Tensor> indices, bool deterministic,
                                         bool check_nan, SeedArg seed, SeedArg offset,
                                         bool return_valid) {
  return call_op<&WithGenerator<&top_p_sampling_from_probs, 4>::op>(
      [&] {
        return simple_sampler("top_p_sampling_from_probs", probs, SamplingKind::kTopP,
                              {nullptr, &top_p, nullptr}, indices, check_nan, seed, offset,
                              return_valid);
      },
      probs, top_p, indices, deterministic, kNoGenerator, check_nan, seed, offset, return_valid);
}

SamplingResult top_k_sampling_from_probs(const Tensor& probs, ScalarOrTensor<int64_t> top_k,
                                         std::optional<Tensor> indices, bool deterministic,
                                         bool check_nan, SeedArg seed, SeedArg offset,
                                         bool return_valid) {
  return call_op<&WithGenerator<&top_k_sampling_from_probs, 4>::op>(
      [&] {
        return simple_sampler("top_k_sampling_from_probs", probs, SamplingKind::kTopK,
                              {&top_k, nullptr, nullptr}, indices, check_nan, seed, offset,
                              return_valid);
      },
      probs, top_k, indices, deterministic, kNoGenerator, check_nan, seed, offset, return_valid);
}

SamplingResult min_p_sampling_from_probs(const Tensor& probs, ScalarOrTensor<double> min_p,
                                         std::optional<Tensor> indices, bool deterministic,
                                         bool check_nan, SeedArg seed, SeedArg offset,
                                         bool return_valid) {
  return call_op<&WithGenerator<&min_p_sampling_from_probs, 4>::op>(
      [&] {
        return simple_sampler("min_p_sampling_from_probs", probs, SamplingKind::kMinP,
                              {nullptr, nullptr, &min_p}, indices, check_nan, seed, offset,
                              return_valid);
      },
      probs, min_p, indices, deterministic, kNoGenerator, check_nan, seed, offset, return_valid);
}

SamplingResult top_k_top_p_sampling_from_probs(const Tensor& probs, ScalarOrTensor<int64_t> top_k,
                                               ScalarOrTensor<double> top_p,
                                               std::optional<Tensor> indices,
                                               const std::string& filter_apply_order,
                                               bool deterministic, bool check_nan, SeedArg seed,
                                               SeedArg offset, bool return_valid,
                                               std::optional<int64_t> top_k_max) {
  return call_op<&WithGenerator<&top_k_top_p_sampling_from_probs, 6>::op>(
      [&] {
        return top_k_top_p_probs_impl(probs, top_k, top_p, indices, filter_apply_order, check_nan,
                                      seed, offset, return_valid, top_k_max);
      },
      probs, top_k, top_p, indices, filter_apply_order, deterministic, kNoGenerator, check_nan,
      seed, offset, return_valid, top_k_max);
}

Tensor top_k_top_p_sampling_from_logits(const Tensor& logits, ScalarOrTensor<int64_t> top_k,
                                        ScalarOrTensor<double> top_p, std::optional<Tensor> indices,
                                        const std::string& filter_apply_order, bool deterministic,
                                        bool check_nan, SeedArg seed, SeedArg offset,
                                        std::optional<int64_t> top_k_max) {
  return call_op<&WithGenerator<&top_k_top_p_sampling_from_logits, 6>::op>(
      [&] {
        return top_k_top_p_logits_impl(logits, top_k, top_p, indices, filter_apply_order, check_nan,
                                       seed, offset, top_k_max);
      },
      logits, top_k, top_p, indices, filter_apply_order, deterministic, kNoGenerator, check_nan,
      seed, offset, top_k_max);
}

Tensor top_k_mask_logits(const Tensor& logits, ScalarOrTensor<int64_t> top_k) {
  return call_op<&top_k_mask_logits>(
      [&] {
        return renorm_impl("top_k_mask_logits", "logits", logits, &top_k, nullptr,
                           FilterKind::kTopKMask, logits.dtype());
      },
      logits, top_k);
}

Tensor top_k_renorm_probs(const Tensor& probs, ScalarOrTensor<int64_t> top_k,
                          bool is_deterministic) {
  return call_op<&top_k_renorm_probs>(
      [&] {
        return renorm_impl("top_k_renorm_probs", "probs", probs, &top_k, nullptr,
                           FilterKind::kTopKRenorm, probs.dtype());
      },
      probs, top_k, is_deterministic);
}

Tensor top_p_renorm_probs(const Tensor& probs, ScalarOrTensor<double> top_p,
                          bool is_deterministic) {
  return call_op<&top_p_renorm_probs>(
      [&] {
        return renorm_impl("top_p_renorm_probs", "probs", probs, nullptr, &top_p,
                           FilterKind::kTopPRenorm, DType::kFloat32);
      },
      probs, top_p, is_deterministic);
}

namespace {

// Bench hooks: logits [batch_size, vocab_size] fp32 (uniform in [-8, 8)). Bytes: logits read
// once, the output written once (fp32 probabilities or masked logits, int32 sampled ids).
// FLOPs: softmax 3 per element (subtract max, exp, scale); the samplers and the mask are
// comparisons and selections, counted as 0 FLOPs.
Tensor bench_logits(const BenchShape& s, Device dev) {
  return api::bench::random_tensor({s.batch_size, s.vocab_size}, DType::kFloat32, dev,
                                   s.random_seed, -8.0, 8.0);
}

BenchCase bench_softmax(const BenchShape& s, Device dev) {
  BenchCase c = api::bench::invoke_case("softmax", {Value(bench_logits(s, dev))});
  c.flops = 3.0 * static_cast<double>(s.batch_size * s.vocab_size);
  c.bytes = 2.0 * api::bench::nbytes({s.batch_size, s.vocab_size}, DType::kFloat32);
  return c;
}

// Probabilities: the softmax of the bench logits (computed once, outside the timing).
Tensor bench_probs(const BenchShape& s, Device dev) { return softmax(bench_logits(s, dev)); }

// A sampler over [batch, vocab] fp32 input with extra positional arguments (from `extra`),
// seeded: reads the input once and writes one int32 id per row.
BenchHook bench_sampler(const char* name, bool from_logits,
                        std::function<std::vector<Value>(const BenchShape&)> extra) {
  return [name, from_logits, extra](const BenchShape& s, Device dev) {
    std::vector<Value> args = {Value(from_logits ? bench_logits(s, dev) : bench_probs(s, dev))};
    for (Value& v : extra(s)) args.push_back(std::move(v));
    BenchCase c = api::bench::invoke_case(
        name, std::move(args),
        {{"seed", Value(static_cast<int64_t>(s.random_seed))}, {"offset", Value(int64_t{0})}});
    c.bytes = api::bench::nbytes({s.batch_size, s.vocab_size}, DType::kFloat32) +
              4.0 * static_cast<double>(s.batch_size);
    return c;
  };
}

// A filter: [batch, vocab] fp32 in (logits or probs) and out, one threshold.
BenchHook bench_filter(const char* name, bool from_logits,
                       std::function<Value(const BenchShape&)> threshold) {
  return [name, from_logits, threshold](const BenchShape& s, Device dev) {
    BenchCase c = api::bench::invoke_case(
        name, {Value(from_logits ? bench_logits(s, dev) : bench_probs(s, dev)), threshold(s)});
    c.bytes = 2.0 * api::bench::nbytes({s.batch_size, s.vocab_size}, DType::kFloat32);
    return c;
  };
}

std::vector<Value> no_extra(const BenchShape&) { return {}; }

// batch_size requests of 4 draft tokens over vocab_size: draft and target probabilities from
// softmax of random logits (target sharper), draft tokens 7 * i mod vocab; seed 1, offset 0.
BenchCase bench_chain_spec(const BenchShape& s, Device dev) {
  const int64_t n = 4, v = s.vocab_size;
  Tensor dl = api::bench::random_tensor({s.batch_size, n, v}, DType::kFloat32, Device::cpu(),
                                        s.random_seed, -2, 2);
  Tensor tl = api::bench::random_tensor({s.batch_size, n + 1, v}, DType::kFloat32, Device::cpu(),
                                        s.random_seed + 1, -4, 4);
  auto probs = [](Tensor t) {
    const int64_t rows = t.numel() / t.size(-1), cols = t.size(-1);
    float* x = t.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (int64_t j = 0; j < cols; ++j) sum += std::exp(x[r * cols + j]);
      for (int64_t j = 0; j < cols; ++j) {
        x[r * cols + j] = static_cast<float>(std::exp(x[r * cols + j]) / sum);
      }
    }
    return t;
  };
  std::vector<double> ids;
  for (int64_t i = 0; i < s.batch_size * n; ++i) ids.push_back(static_cast<double>((7 * i) % v));
  BenchCase c = api::bench::invoke_case(
      "chain_speculative_sampling",
      {Value(probs(dl).to(dev)),
       Value(Tensor::from_vector(ids, {s.batch_size, n}, DType::kInt32).to(dev)),
       Value(probs(tl).to(dev))},
      // The engines pass the acceptance counters, which the op adds to (so they start at 0).
      {{"maybe_output_accepted_token_num",
        Value(Tensor::zeros({s.batch_size}, DType::kInt32).to(dev))},
       {"maybe_output_emitted_draft_token_num",
        Value(Tensor::zeros({s.batch_size}, DType::kInt32).to(dev))},
       {"seed", Value(int64_t{1})},
       {"offset", Value(int64_t{0})}});
  c.bytes = api::bench::nbytes({s.batch_size, 2 * n + 1, v}, DType::kFloat32);
  return c;
}

}  // namespace

namespace detail {

void register_sampling_ops(OpRegistry& r) {
  constexpr const char* kSamplerReturns = "Union[Tensor, Tuple[Tensor, Tensor]]";
  // indices, deterministic, generator, check_nan, seed, offset: upstream's samplers' tail.
  const auto indices = arg("indices");
  const auto deterministic = arg("deterministic", true);
  const auto generator = arg("generator").type("torch.Generator");
  const auto check_nan = arg("check_nan", false);
  const auto return_valid = arg("return_valid", false);
  const auto order = arg("filter_apply_order", "top_k_first");

  declare<&WithGenerator<&chain_speculative_sampling, 6>::op>(
      r,
      {.name = "chain_speculative_sampling",
       .module = kSamplingModule,
       .summary = "Chain speculative sampling: accepted draft tokens, a residual/bonus token, "
                  "acceptance counts (Philox seed/offset)",
       .returns = "tuple[Tensor, Tensor, Tensor]"},
      "draft_probs", "draft_token_ids", "target_probs",
      arg("maybe_output_accepted_token_num").mut(),
      arg("maybe_output_emitted_draft_token_num").mut(), deterministic, generator, "seed",
      "offset");
  api::register_backends("chain_speculative_sampling", kChainSpecKernels);
  register_bench_hook("chain_speculative_sampling", bench_chain_spec);
  declare<&softmax>(r,
                    {.name = "softmax",
                     .module = kSamplingModule,
                     .summary = "Softmax of logits / temperature (scalar or per row), fp32 output"},
                    "logits", "temperature", "enable_pdl");
  declare<&WithGenerator<&sampling_from_probs, 3>::op>(
      r,
      {.name = "sampling_from_probs",
       .module = kSamplingModule,
       .summary = "Inverse-CDF sampling from probabilities (Philox seed/offset)",
       .returns = kSamplerReturns},
      "probs", indices, deterministic, generator, check_nan, "seed", "offset", return_valid);
  declare<&WithGenerator<&sampling_from_logits, 3>::op>(
      r,
      {.name = "sampling_from_logits",
       .module = kSamplingModule,
       .summary = "Gumbel-max sampling from logits (Philox seed/offset)"},
      "logits", indices, deterministic, generator, check_nan, "seed", "offset");
  declare<&WithGenerator<&top_p_sampling_from_probs, 4>::op>(
      r,
      {.name = "top_p_sampling_from_probs",
       .module = kSamplingModule,
       .summary = "Top-p sampling by dual-pivot rejection",
       .returns = kSamplerReturns},
      "probs", "top_p", indices, deterministic, generator, check_nan, "seed", "offset",
      return_valid);
  declare<&WithGenerator<&top_k_sampling_from_probs, 4>::op>(
      r,
      {.name = "top_k_sampling_from_probs",
       .module = kSamplingModule,
       .summary = "Top-k sampling by dual-pivot rejection",
       .returns = kSamplerReturns},
      "probs", "top_k", indices, deterministic, generator, check_nan, "seed", "offset",
      return_valid);
  declare<&WithGenerator<&min_p_sampling_from_probs, 4>::op>(
      r,
      {.name = "min_p_sampling_from_probs",
       .module = kSamplingModule,
       .summary = "Min-p sampling: keep p >= min_p * max(p)",
       .returns = kSamplerReturns},
      "probs", "min_p", indices, deterministic, generator, check_nan, "seed", "offset",
      return_valid);
  declare<&WithGenerator<&top_k_top_p_sampling_from_probs, 6>::op>(
      r,
      {.name = "top_k_top_p_sampling_from_probs",
       .module = kSamplingModule,
       .summary = "Top-k and top-p sampling from probabilities (top_k_first or joint)",
       .returns = kSamplerReturns},
      "probs", "top_k", "top_p", indices, order, deterministic, generator, check_nan, "seed",
      "offset", return_valid, "top_k_max");
  declare<&WithGenerator<&top_k_top_p_sampling_from_logits, 6>::op>(
      r,
      {.name = "top_k_top_p_sampling_from_logits",
       .module = kSamplingModule,
       .summary = "Top-k and top-p sampling from logits (top_k_first or joint)"},
      "logits", "top_k", "top_p", indices, order, deterministic, generator, check_nan, "seed",
      "offset", "top_k_max");
  declare<&top_k_mask_logits>(r,
                              {.name = "top_k_mask_logits",
                               .module = kSamplingModule,
                               .summary = "Logits outside the top-k set to -inf"},
                              "logits", "top_k");
  declare<&top_k_renorm_probs>(r,
                               {.name = "top_k_renorm_probs",
                                .module = kSamplingModule,
                                .summary = "Probs outside the top-k zeroed and renormalized"},
                               "probs", "top_k", arg("is_deterministic", false));
  declare<&top_p_renorm_probs>(
      r,
      {.name = "top_p_renorm_probs",
       .module = kSamplingModule,
       .summary = "Probs outside the top-p nucleus zeroed and renormalized (fp32)"},
      "probs", "top_p", arg("is_deterministic", false));

  // Backends. The samplers end in the sampling kernel (the top-k/top-p combinations filter or
  // take the softmax first, on the same device); the mask and renorm ops are the filter kernel.
  api::register_backends("softmax", kSoftmaxKernels);
  for (const char* op : {"sampling_from_probs", "sampling_from_logits", "top_p_sampling_from_probs",
                         "top_k_sampling_from_probs", "min_p_sampling_from_probs",
                         "top_k_top_p_sampling_from_probs", "top_k_top_p_sampling_from_logits"}) {
    api::register_backends(op, kSampleKernels);
  }
  for (const char* op : {"top_k_mask_logits", "top_k_renorm_probs", "top_p_renorm_probs"}) {
    api::register_backends(op, kFilterKernels);
  }

  register_bench_hook("softmax", bench_softmax);
  register_bench_hook("sampling_from_probs", bench_sampler("sampling_from_probs", false, no_extra));
  register_bench_hook("sampling_from_logits",
                      bench_sampler("sampling_from_logits", true, no_extra));
  register_bench_hook("top_p_sampling_from_probs",
                      bench_sampler("top_p_sampling_from_probs", false, [](const BenchShape& s) {
                        return std::vector<Value>{Value(s.top_p)};
                      }));
  register_bench_hook("top_k_sampling_from_probs",
                      bench_sampler("top_k_sampling_from_probs", false, [](const BenchShape& s) {
                        return std::vector<Value>{Value(s.top_k)};
                      }));
  register_bench_hook("min_p_sampling_from_probs",
                      bench_sampler("min_p_sampling_from_probs", false, [](const BenchShape&) {
                        return std::vector<Value>{Value(0.1)};
                      }));
  const auto k_and_p = [](const BenchShape& s) {
    return std::vector<Value>{Value(s.top_k), Value(s.top_p)};
  };
  register_bench_hook("top_k_top_p_sampling_from_probs",
                      bench_sampler("top_k_top_p_sampling_from_probs", false, k_and_p));
  register_bench_hook("top_k_top_p_sampling_from_logits",
                      bench_sampler("top_k_top_p_sampling_from_logits", true, k_and_p));
  register_bench_hook(
      "top_k_mask_logits",
      bench_filter("top_k_mask_logits", true, [](const BenchShape& s) { return Value(s.top_k); }));
  register_bench_hook("top_k_renorm_probs",
                      bench_filter("top_k_renorm_probs", false,
                                   [](const BenchShape& s) { return Value(s.top_k); }));
  register_bench_hook("top_p_renorm_probs",
                      bench_filter("top_p_renorm_probs", false,
                                   [](const BenchShape& s) { return Value(s.top_p); }));
}

}  // namespace detail
}  // namespace flashinfer
