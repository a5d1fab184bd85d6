// Public top-k ops (flashinfer.topk, flashinfer.topk_varlen.topk_varlen): declarations, argument
// checks, dispatch. Selection rules shared by every backend are in flashinfer/ops/topk.h.
#include "flashinfer/ops/topk.h"

#include <algorithm>
#include <string>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/enum_table.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/topk_cpu.h"
#if FLASHINFER_WITH_CUDA
#include <optional>

#include "flashinfer/stream.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cuda/topk_cuda.h"
#endif

namespace flashinfer {

namespace {

constexpr const char* kTopkModule = "flashinfer.topk";
constexpr const char* kVarlenModule = "flashinfer.topk_varlen.topk_varlen";

constexpr api::EnumTable<TopKTieBreak, 3> kTieBreaks{"TopKTieBreak",
                                                     {{{TopKTieBreak::NONE, "NONE"},
                                                       {TopKTieBreak::SMALL, "SMALL"},
                                                       {TopKTieBreak::LARGE, "LARGE"}}}};

// The CPU backend reports page-table lookups outside the table (only CPU tensors get here with
// out-of-range values: the API checks them first, so this is a second line of defence).
struct TopKLaunch {
  kernels::TopKParams p;
  const char* op;
};

constexpr api::KernelEntry<TopKLaunch> kTopKKernels[] = {
    {DeviceType::kCPU, "CPU reference: radix select (11-bit histogram), OpenMP rows", nullptr,
     [](const TopKLaunch& l, const api::LaunchContext&) {
       const int64_t bad = kernels::cpu::top_k(l.p);
       FLASHINFER_CHECK(bad == 0, l.op, "src_page_table", bad,
                        " selected indices map outside the page table");
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per row, 4-pass radix select, ordered compaction",
     nullptr,
     [](const TopKLaunch& l, const api::LaunchContext& c) {
       kernels::cuda::top_k(l.p, c.stream, c.enable_pdl);
     }},
#endif
};

// k = 0 gives [rows, 0] outputs (upstream does not refuse it).
void check_k(int64_t k, const char* op, const char* arg) {
  FLASHINFER_CHECK(k >= 0, op, arg, "must be >= 0, got ", k);
  FLASHINFER_CHECK(k <= (int64_t{1} << 30), op, arg, "must be <= 2^30, got ", k);
}

// Upstream runs tie_break and dsa_graph_safe only on its FilteredTopK kernel, which holds at most
// 2048 selected elements per row: its launch returns cudaErrorNotSupported beyond.
void check_filtered_limit(int64_t k, TopKTieBreak tie_break, bool dsa_graph_safe, const char* op,
                          const char* arg) {
  FLASHINFER_CHECK(k <= 2048 || (tie_break == TopKTieBreak::NONE && !dsa_graph_safe), op, arg,
                   "k = ", k,
                   " > 2048 with tie_break or dsa_graph_safe is not supported (operation not "
                   "supported upstream: its filtered kernel keeps at most 2048 per row)");
}

void check_scores(const Tensor& input, const char* op, const char* arg) {
  api::check_defined(input, op, arg);
  api::check_dim(input, {2}, op, arg);
  api::check_dtype_in(input, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, arg);
  FLASHINFER_CHECK(input.size(0) >= 1, op, arg, "must have at least one row");
  FLASHINFER_CHECK(input.size(1) < (int64_t{1} << 31), op, arg,
                   "rows longer than 2^31 - 1 are not supported (int32 indices)");
}

// A per-row int32 vector of `n` entries on input's device, contiguous (kernels index it).
void check_row_vector(const Tensor& t, int64_t n, const Tensor& input, const char* op,
                      const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {1}, op, arg);
  api::check_dtype_in(t, {DType::kInt32}, op, arg);
  api::check_shape_eq(t, {n}, op, arg);
  api::check_same_device(t, input, op, arg, "input");
  FLASHINFER_CHECK(t.is_contiguous(), op, arg, "must be contiguous");
}

// An int32 output [rows, k] on input's device, contiguous.
void check_int_out(const Tensor& t, int64_t rows, int64_t k, const Tensor& input, const char* op,
                   const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dtype_in(t, {DType::kInt32}, op, arg);
  api::check_shape_eq(t, {rows, k}, op, arg);
  api::check_same_device(t, input, op, arg, "input");
  FLASHINFER_CHECK(t.is_contiguous(), op, arg, "must be contiguous");
}

// Host-side value checks of the per-row vectors when they live on the CPU (a CUDA kernel clamps
// instead, so device values never cause an out-of-bounds access).
void check_windows(const Tensor& input, const std::optional<Tensor>& lengths,
                   const std::optional<Tensor>& row_starts, const char* op) {
  if (!input.device().is_cpu()) return;
  const int64_t rows = input.size(0), cols = input.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = row_starts ? row_starts->data<int32_t>()[r] : 0;
    FLASHINFER_CHECK(s >= 0 && s <= cols, op, "row_starts", "row ", r, ": start ", s,
                     " is outside [0, ", cols, "]");
    if (lengths) {
      const int64_t l = lengths->data<int32_t>()[r];
      FLASHINFER_CHECK(l >= 0 && s + l <= cols, op, "lengths", "row ", r, ": length ", l,
                       " (start ", s, ") does not fit a row of ", cols, " scores");
    }
  }
}

kernels::TopKParams base_params(const Tensor& input, int64_t k, TopKTieBreak tie_break) {
  kernels::TopKParams p;
  p.input = input.data_ptr();
  p.dtype = input.dtype();
  p.rows = input.size(0);
  p.cols = input.size(1);
  p.in_stride_row = input.stride(0);
  p.in_stride_col = input.stride(1);
  p.k = k;
  p.prefer_large = tie_break == TopKTieBreak::LARGE;
  return p;
}

void run(const kernels::TopKParams& p, const Tensor& input, const char* op) {
  if (p.k == 0) return;
  TopKLaunch l{p, op};
#if FLASHINFER_WITH_CUDA
  // The CUDA kernel sorts through the stream's scratch (kernels/cuda/stream_scratch.h), held
  // until the launches are queued and never freed: a temporary tensor was allocated and freed on
  // every call, which a CUDA graph capturing the call refuses.
  std::optional<kernels::cuda::StreamScratch> scratch;
  if (p.sorted && input.device().is_cuda() && p.rows > 0) {
    static kernels::cuda::StreamScratchPool pool("top_k sort scratch");
    scratch = pool.acquire(op, input.device().index, current_cuda_stream(),
                           static_cast<std::size_t>(2 * p.rows * p.k) * sizeof(int64_t));
    l.p.sort_scratch = scratch->data();
  }
#endif
  api::launch(kTopKKernels, l, input.device(), op, "input");
}

// k above the row is accepted, as upstream: the row's elements, then index -1 and value 0 (the
// padding of upstream's filtered kernel; its radix kernel leaves those slots unwritten).
std::tuple<Tensor, Tensor> top_k_impl(const Tensor& input, int64_t k, bool sorted,
                                      TopKTieBreak tie_break, bool dsa_graph_safe) {
  const char* op = "top_k";
  check_scores(input, op, "input");
  check_k(k, op, "k");
  check_filtered_limit(k, tie_break, dsa_graph_safe, op, "k");
  Tensor values = Tensor::empty({input.size(0), k}, input.dtype(), input.device());
  Tensor indices = Tensor::empty({input.size(0), k}, DType::kInt64, input.device());
  kernels::TopKParams p = base_params(input, k, tie_break);
  p.sorted = sorted;
  p.indices = indices.data_ptr();
  p.index_dtype = DType::kInt64;
  p.idx_stride_row = indices.stride(0);
  p.idx_stride_col = indices.stride(1);
  p.values = values.data_ptr();
  p.val_stride_row = values.stride(0);
  p.val_stride_col = values.stride(1);
  p.zero_padded_values = true;
  run(p, input, op);
  return {values, indices};
}

Tensor page_table_impl(const Tensor& input, const Tensor& src_page_table, const Tensor& lengths,
                       int64_t k, const std::optional<Tensor>& row_to_batch, TopKTieBreak tie_break,
                       bool dsa_graph_safe, const std::optional<Tensor>& row_starts,
                       const std::optional<Tensor>& page_table_row_starts,
                       const TopKPageTableOptions& o) {
  const char* op = "top_k_page_table_transform";
  check_scores(input, op, "input");
  FLASHINFER_CHECK(input.stride(1) == 1 || input.size(1) <= 1, op, "input",
                   "the last dimension must be contiguous");
  check_k(k, op, "k");
  check_filtered_limit(k, tie_break, dsa_graph_safe, op, "k");
  const int64_t rows = input.size(0);
  api::check_defined(src_page_table, op, "src_page_table");
  api::check_dim(src_page_table, {2}, op, "src_page_table");
  api::check_dtype_in(src_page_table, {DType::kInt32}, op, "src_page_table");
  api::check_same_device(src_page_table, input, op, "src_page_table", "input");
  check_row_vector(lengths, rows, input, op, "lengths");
  if (row_to_batch) check_row_vector(*row_to_batch, rows, input, op, "row_to_batch");
  if (row_starts) check_row_vector(*row_starts, rows, input, op, "row_starts");
  if (page_table_row_starts) {
    check_row_vector(*page_table_row_starts, rows, input, op, "page_table_row_starts");
  }
  const int64_t ps = o.page_size;
  FLASHINFER_CHECK(ps >= 1 && ps <= (int64_t{1} << 30) && (ps & (ps - 1)) == 0, op, "page_size",
                   "must be a positive power of two no greater than 2**30, got ", ps);
  FLASHINFER_CHECK(ps == 1 || !row_starts || page_table_row_starts, op, "page_table_row_starts",
                   "is required with page_size > 1 and row_starts");
  Tensor out;
  if (o.out) {
    check_int_out(*o.out, rows, k, input, op, "out");
    api::check_no_overlap(*o.out, input, op, "out", "input");
    out = *o.out;
  } else {
    out = Tensor::empty({rows, k}, DType::kInt32, input.device());
  }
  if (o.out_raw_indices) {
    check_int_out(*o.out_raw_indices, rows, k, input, op, "out_raw_indices");
    api::check_no_overlap(*o.out_raw_indices, out, op, "out_raw_indices", "out");
  }
  check_windows(input, lengths, row_starts, op);
  if (input.device().is_cpu() && row_to_batch) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = row_to_batch->data<int32_t>()[r];
      FLASHINFER_CHECK(b >= 0 && b < src_page_table.size(0), op, "row_to_batch", "row ", r,
                       ": batch ", b, " is outside src_page_table's ", src_page_table.size(0),
                       " rows");
    }
  }
  kernels::TopKParams p = base_params(input, k, tie_break);
  p.lengths = lengths.data<int32_t>();
  p.row_starts = row_starts ? row_starts->data<int32_t>() : nullptr;
  p.output = kernels::TopKOutput::kPageTable;
  p.indices = out.data_ptr();
  p.index_dtype = DType::kInt32;
  p.idx_stride_row = k;
  p.idx_stride_col = 1;
  p.raw_indices = o.out_raw_indices ? o.out_raw_indices->data<int32_t>() : nullptr;
  p.page_table = src_page_table.data<int32_t>();
  p.pt_rows = src_page_table.size(0);
  p.pt_cols = src_page_table.size(1);
  p.pt_stride_row = src_page_table.stride(0);
  p.pt_stride_col = src_page_table.stride(1);
  p.row_to_batch = row_to_batch ? row_to_batch->data<int32_t>() : nullptr;
  p.page_table_row_starts =
      page_table_row_starts ? page_table_row_starts->data<int32_t>() : nullptr;
  p.page_size = ps;
  run(p, input, op);
  return out;
}

Tensor topk_ragged_impl(const Tensor& input, const Tensor& offsets, const Tensor& lengths,
                        int64_t k, TopKTieBreak tie_break, bool dsa_graph_safe,
                        const std::optional<Tensor>& row_starts) {
  const char* op = "top_k_ragged_transform";
  check_scores(input, op, "input");
  check_k(k, op, "k");
  check_filtered_limit(k, tie_break, dsa_graph_safe, op, "k");
  const int64_t rows = input.size(0);
  check_row_vector(offsets, rows, input, op, "offsets");
  check_row_vector(lengths, rows, input, op, "lengths");
  if (row_starts) check_row_vector(*row_starts, rows, input, op, "row_starts");
  check_windows(input, lengths, row_starts, op);
  Tensor out = Tensor::empty({rows, k}, DType::kInt32, input.device());
  kernels::TopKParams p = base_params(input, k, tie_break);
  p.lengths = lengths.data<int32_t>();
  p.row_starts = row_starts ? row_starts->data<int32_t>() : nullptr;
  p.output = kernels::TopKOutput::kRagged;
  p.indices = out.data_ptr();
  p.index_dtype = DType::kInt32;
  p.idx_stride_row = k;
  p.idx_stride_col = 1;
  p.offsets = offsets.data<int32_t>();
  run(p, input, op);
  return out;
}

std::tuple<Tensor, std::optional<Tensor>> varlen_impl(
    const Tensor& logits, const Tensor& seq_lens, int64_t top_k,
    const std::optional<Tensor>& pre_idx, int64_t compress_ratio, int64_t next_n,
    bool return_values, const std::optional<Tensor>& out_indices,
    const std::optional<Tensor>& out_values, std::string_view backend) {
  const char* op = "top_k_varlen";
  check_scores(logits, op, "logits");
  check_k(top_k, op, "top_k");
  FLASHINFER_CHECK(next_n >= 1, op, "next_n", "must be >= 1, got ", next_n);
  FLASHINFER_CHECK(compress_ratio >= 1, op, "compress_ratio", "must be >= 1, got ", compress_ratio);
  // Upstream 0.6.18's backends (no "radix_filter"), refused by name on a GPU upstream does not
  // run them on (radix: Blackwell and later; gvr: sm100 / sm103), as its @backend_requirement.
  api::check_backend(op, backend, logits.device());
  const int64_t rows = logits.size(0);
  api::check_defined(seq_lens, op, "seq_lens");
  api::check_dim(seq_lens, {1}, op, "seq_lens");
  api::check_dtype_in(seq_lens, {DType::kInt32}, op, "seq_lens");
  api::check_same_device(seq_lens, logits, op, "seq_lens", "logits");
  FLASHINFER_CHECK(seq_lens.is_contiguous(), op, "seq_lens", "must be contiguous");
  FLASHINFER_CHECK(seq_lens.size(0) * next_n == rows, op, "seq_lens", "logits has ", rows,
                   " rows but seq_lens has ", seq_lens.size(0), " entries with next_n=", next_n,
                   ": expected seq_lens.shape[0] * next_n == logits.shape[0]");
  if (pre_idx) {
    api::check_defined(*pre_idx, op, "pre_idx");
    api::check_dtype_in(*pre_idx, {DType::kInt32}, op, "pre_idx");
    api::check_shape_eq(*pre_idx, {seq_lens.size(0), top_k}, op, "pre_idx");
    api::check_same_device(*pre_idx, logits, op, "pre_idx", "logits");
  }
  Tensor idx;
  if (out_indices) {
    api::check_defined(*out_indices, op, "out_indices");
    api::check_dtype_in(*out_indices, {DType::kInt32}, op, "out_indices");
    api::check_shape_eq(*out_indices, {rows, top_k}, op, "out_indices");
    api::check_same_device(*out_indices, logits, op, "out_indices", "logits");
    api::check_writable(*out_indices, op, "out_indices");
    api::check_no_overlap(*out_indices, logits, op, "out_indices", "logits");
    idx = *out_indices;
  } else {
    idx = Tensor::empty({rows, top_k}, DType::kInt32, logits.device());
  }
  std::optional<Tensor> vals;
  if (return_values) {
    if (out_values) {
      api::check_defined(*out_values, op, "out_values");
      api::check_same_dtype(*out_values, logits, op, "out_values", "logits");
      api::check_shape_eq(*out_values, {rows, top_k}, op, "out_values");
      api::check_same_device(*out_values, logits, op, "out_values", "logits");
      api::check_writable(*out_values, op, "out_values");
      api::check_no_overlap(*out_values, logits, op, "out_values", "logits");
      api::check_no_overlap(*out_values, idx, op, "out_values", "out_indices");
      vals = *out_values;
    } else {
      vals = Tensor::empty({rows, top_k}, logits.dtype(), logits.device());
    }
  }
  kernels::TopKParams p = base_params(logits, top_k, TopKTieBreak::NONE);
  p.lengths = seq_lens.data<int32_t>();
  p.next_n = next_n;
  p.compress_ratio = compress_ratio;
  p.indices = idx.data_ptr();
  p.index_dtype = DType::kInt32;
  p.idx_stride_row = idx.stride(0);
  p.idx_stride_col = idx.stride(1);
  if (vals) {
    p.values = vals->data_ptr();
    p.val_stride_row = vals->stride(0);
    p.val_stride_col = vals->stride(1);
    p.zero_padded_values = true;
  }
  run(p, logits, op);
  return {idx, vals};
}

}  // namespace

Value to_value(TopKTieBreak tie_break) { return kTieBreaks.to_value(tie_break); }

TopKTieBreak topk_tie_break_from_value(const Value& v) {
  return kTieBreaks.from_value(v, "TopKTieBreak", "tie_break", ErrorCode::kInvalidArgument, true);
}

std::tuple<Tensor, Tensor> top_k(const Tensor& input, int64_t k, bool sorted, bool deterministic,
                                 TopKTieBreak tie_break, bool dsa_graph_safe) {
  return call_op<&top_k>([&] { return top_k_impl(input, k, sorted, tie_break, dsa_graph_safe); },
                         input, k, sorted, deterministic, tie_break, dsa_graph_safe);
}

Tensor top_k_page_table_transform(const Tensor& input, const Tensor& src_page_table,
                                  const Tensor& lengths, int64_t k,
                                  std::optional<Tensor> row_to_batch, bool deterministic,
                                  TopKTieBreak tie_break, bool dsa_graph_safe,
                                  std::optional<Tensor> row_starts,
                                  std::optional<Tensor> page_table_row_starts,
                                  TopKPageTableOptions options) {
  return call_op<&top_k_page_table_transform>(
      [&] {
        return page_table_impl(input, src_page_table, lengths, k, row_to_batch, tie_break,
                               dsa_graph_safe, row_starts, page_table_row_starts, options);
      },
      input, src_page_table, lengths, k, row_to_batch, deterministic, tie_break, dsa_graph_safe,
      row_starts, page_table_row_starts, options);
}

Tensor top_k_ragged_transform(const Tensor& input, const Tensor& offsets, const Tensor& lengths,
                              int64_t k, bool deterministic, TopKTieBreak tie_break,
                              bool dsa_graph_safe, std::optional<Tensor> row_starts) {
  return call_op<&top_k_ragged_transform>(
      [&] {
        return topk_ragged_impl(input, offsets, lengths, k, tie_break, dsa_graph_safe, row_starts);
      },
      input, offsets, lengths, k, deterministic, tie_break, dsa_graph_safe, row_starts);
}

std::tuple<Tensor, std::optional<Tensor>> top_k_varlen(
    const Tensor& logits, const Tensor& seq_lens, int64_t top_k, std::optional<Tensor> pre_idx,
    int64_t compress_ratio, int64_t next_n, bool return_values, std::optional<Tensor> out_indices,
    std::optional<Tensor> out_values, std::string_view backend, bool load_balance,
    std::optional<Value> workspace) {
  return call_op<&top_k_varlen>(
      [&] {
        return varlen_impl(logits, seq_lens, top_k, pre_idx, compress_ratio, next_n, return_values,
                           out_indices, out_values, backend);
      },
      logits, seq_lens, top_k, pre_idx, compress_ratio, next_n, return_values, out_indices,
      out_values, backend, load_balance, workspace);
}

namespace {

// Bench hooks: batch_size rows of vocab_size scores in input_dtype, k = top_k. Bytes: the input
// once and the outputs once; FLOPs: one compare per score.
BenchCase bench_top_k(const BenchShape& s, Device dev) {
  const Shape x{s.batch_size, s.vocab_size};
  const DType dt = s.input_dtype;
  BenchCase c = api::bench::invoke_case(
      "top_k", {Value(api::bench::random_tensor(x, dt, dev, s.random_seed)), Value(s.top_k)});
  c.flops = static_cast<double>(s.batch_size * s.vocab_size);
  c.bytes = api::bench::nbytes(x, dt) + api::bench::nbytes({s.batch_size, s.top_k}, dt) +
            api::bench::nbytes({s.batch_size, s.top_k}, DType::kInt64);
  return c;
}

// Row i's window starts at i (so windows differ) and holds vocab_size - 2i - 1 scores; the rows
// of the page-table case share batch row i / 2 (row_to_batch), pages of 4 scores.
std::vector<int64_t> bench_lengths(const BenchShape& s) {
  std::vector<int64_t> l;
  for (int64_t i = 0; i < s.batch_size; ++i)
    l.push_back(std::max<int64_t>(0, s.vocab_size - 2 * i - 1));
  return l;
}
std::vector<int64_t> bench_starts(const BenchShape& s) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < s.batch_size; ++i) v.push_back(std::min(i, s.vocab_size));
  return v;
}

BenchCase bench_page_table(const BenchShape& s, Device dev) {
  const Shape x{s.batch_size, s.vocab_size};
  const DType dt = s.input_dtype;
  const int64_t page = 4;
  const int64_t batches = (s.batch_size + 1) / 2;
  const int64_t width = (s.vocab_size + page - 1) / page;
  std::vector<int64_t> table, r2b;
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t e = 0; e < width; ++e) table.push_back((e * 7 + b * 3) % (width + 5));
  }
  for (int64_t i = 0; i < s.batch_size; ++i) r2b.push_back(i / 2);
  std::vector<int64_t> pts;
  for (int64_t i = 0; i < s.batch_size; ++i) pts.push_back(0);
  Tensor pt = api::bench::int32_tensor(table, Device::cpu()).view({batches, width}).to(dev);
  BenchCase c = api::bench::invoke_case(
      "top_k_page_table_transform",
      {Value(api::bench::random_tensor(x, dt, dev, s.random_seed)), Value(pt),
       Value(api::bench::int32_tensor(bench_lengths(s), dev)), Value(s.top_k),
       Value(api::bench::int32_tensor(r2b, dev))},
      {{"row_starts", Value(api::bench::int32_tensor(bench_starts(s), dev))},
       {"page_table_row_starts", Value(api::bench::int32_tensor(pts, dev))},
       {"page_size", Value(page)}});
  c.flops = static_cast<double>(s.batch_size * s.vocab_size);
  c.bytes = api::bench::nbytes(x, dt) + api::bench::nbytes({s.batch_size, s.top_k}, DType::kInt32);
  return c;
}

BenchCase topk_bench_ragged(const BenchShape& s, Device dev) {
  const Shape x{s.batch_size, s.vocab_size};
  const DType dt = s.input_dtype;
  std::vector<int64_t> offs;
  for (int64_t i = 0; i < s.batch_size; ++i) offs.push_back(i * 1000);
  BenchCase c = api::bench::invoke_case(
      "top_k_ragged_transform",
      {Value(api::bench::random_tensor(x, dt, dev, s.random_seed)),
       Value(api::bench::int32_tensor(offs, dev)),
       Value(api::bench::int32_tensor(bench_lengths(s), dev)), Value(s.top_k)},
      {{"tie_break", to_value(TopKTieBreak::LARGE)},
       {"row_starts", Value(api::bench::int32_tensor(bench_starts(s), dev))}});
  c.flops = static_cast<double>(s.batch_size * s.vocab_size);
  c.bytes = api::bench::nbytes(x, dt) + api::bench::nbytes({s.batch_size, s.top_k}, DType::kInt32);
  return c;
}

// next_n = 2: batch_size rows of (batch_size + 1) / 2 requests (batch_size rounded up to even).
BenchCase bench_varlen(const BenchShape& s, Device dev) {
  const int64_t reqs = (s.batch_size + 1) / 2;
  const Shape x{2 * reqs, s.vocab_size};
  const DType dt = s.input_dtype;
  std::vector<int64_t> lens;
  for (int64_t i = 0; i < reqs; ++i) lens.push_back(s.vocab_size - 3 * i);
  BenchCase c =
      api::bench::invoke_case("top_k_varlen",
                              {Value(api::bench::random_tensor(x, dt, dev, s.random_seed)),
                               Value(api::bench::int32_tensor(lens, dev)), Value(s.top_k)},
                              {{"next_n", Value(int64_t{2})}, {"return_values", Value(true)}});
  c.flops = static_cast<double>(2 * reqs * s.vocab_size);
  c.bytes = api::bench::nbytes(x, dt) + api::bench::nbytes({2 * reqs, s.top_k}, DType::kInt32) +
            api::bench::nbytes({2 * reqs, s.top_k}, dt);
  return c;
}

}  // namespace

namespace detail {
void register_topk_ops(OpRegistry& r) {
  declare<&top_k>(r,
                  {.name = "top_k",
                   .module = kTopkModule,
                   .summary = "The k largest elements of each row: (values, int64 indices)"},
                  "input", "k", arg("sorted", false), arg("deterministic", false),
                  arg("tie_break", TopKTieBreak::NONE), arg("dsa_graph_safe", false));
  declare<&top_k_page_table_transform>(
      r,
      {.name = "top_k_page_table_transform",
       .module = kTopkModule,
       .summary = "Top-k of each row's window, indices translated through a page table"},
      "input", "src_page_table", "lengths", "k", "row_to_batch", arg("deterministic", false),
      arg("tie_break", TopKTieBreak::NONE), arg("dsa_graph_safe", false), "row_starts",
      "page_table_row_starts", field("out").mut(), field("out_raw_indices").mut());
  declare<&top_k_ragged_transform>(
      r,
      {.name = "top_k_ragged_transform",
       .module = kTopkModule,
       .summary = "Top-k of each row's window, indices plus a per-row offset"},
      "input", "offsets", "lengths", "k", arg("deterministic", false),
      arg("tie_break", TopKTieBreak::NONE), arg("dsa_graph_safe", false), "row_starts");
  declare<&top_k_varlen>(
      r,
      {.name = "top_k_varlen",
       .module = kVarlenModule,
       .summary = "Top-k of decode-step logits with per-request lengths",
       .returns = "tuple[Tensor, Tensor | None]"},
      "logits", "seq_lens", "top_k", "pre_idx", arg("compress_ratio", int64_t{1}),
      arg("next_n", int64_t{1}), arg("return_values", false), arg("out_indices").mut(),
      arg("out_values").mut(), arg("backend", "auto"), arg("load_balance", true), "workspace");

  for (const char* name :
       {"top_k", "top_k_page_table_transform", "top_k_ragged_transform", "top_k_varlen"}) {
    api::register_backends(name, kTopKKernels);
  }
  register_bench_hook("top_k", bench_top_k);
  register_bench_hook("top_k_page_table_transform", bench_page_table);
  register_bench_hook("top_k_ragged_transform", topk_bench_ragged);
  register_bench_hook("top_k_varlen", bench_varlen);
}
}  // namespace detail

}  // namespace flashinfer
