// Public paged-KV utilities (flashinfer.page): declarations, checks, dispatch.
#include "flashinfer/ops/page.h"

#include <cstring>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/stream.h"
#include "kernels/cpu/attention_cpu.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/cascade_cuda.h"
#endif

namespace flashinfer {

PagedKVCache PagedKVCache::from_value(const Value& v) {
  if (v.is_tensor()) return PagedKVCache(v.as_tensor());
  FLASHINFER_CHECK(v.is_sequence() && v.items().size() == 2, "", "paged_kv_cache",
                   "expected a tensor or a (k_cache, v_cache) pair");
  return PagedKVCache(v.items()[0].as_tensor(), v.items()[1].as_tensor());
}

Value to_value(const PagedKVCache& cache) {
  if (!cache.is_pair()) return Value(cache.first());
  return Value::tuple({Value(cache.first()), Value(cache.second())});
}

namespace {

constexpr const char* kPageCacheModule = "flashinfer.page";

Tensor page_host_int32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kInt32);
  if (!v.empty()) std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

// The backends of the append kernel (src/api/kernel_table.h). The parameters' index table
// points at host copies checked on the host (CPU) or at the device tensors themselves (CUDA:
// api::load_append_index_arrays).
constexpr api::KernelEntry<kernels::AppendParams> kPageAppendKernels[] = {
    {DeviceType::kCPU, "CPU reference: row copies, OpenMP over appended rows", nullptr,
     [](const kernels::AppendParams& p, const api::LaunchContext&) {
       kernels::cpu::append_paged_kv_cache(p);
     }},
#if FLASHINFER_WITH_CUDA
    // The kernel moves 1-, 2- or 4-byte elements; the CPU reference copies any width.
    {DeviceType::kCUDA,
     "CUDA kernel: one block per appended row, index arrays read on the device (rows whose "
     "target is outside the page table are not written)",
     [](const kernels::AppendParams& p) {
       return p.elem_size == 1 || p.elem_size == 2 || p.elem_size == 4
                  ? api::Refusal{}
                  : api::Refusal{nullptr, "the CUDA kernel moves 1-, 2- or 4-byte elements only"};
     },
     [](const kernels::AppendParams& p, const api::LaunchContext& c) {
       kernels::cuda::append_paged_kv_cache(p, c.stream);
     }},
#endif
};

// get_batch_indices_positions: upstream runs a Triton kernel on the indices' device, reading
// them there. So does the CUDA kernel here (no host copy, no synchronization: a CUDA graph can
// capture the call); the CPU reference checks the index values first.
constexpr api::KernelEntry<kernels::BatchIndicesPositionsParams> kBatchIndicesPositionsKernels[] = {
    {DeviceType::kCPU, "CPU reference: a binary search of append_indptr per element", nullptr,
     [](const kernels::BatchIndicesPositionsParams& p, const api::LaunchContext&) {
       for (int64_t j = 0; j < p.nnz; ++j) kernels::batch_indices_positions_at(p, j);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: a thread per element, the same rule", nullptr,
     [](const kernels::BatchIndicesPositionsParams& p, const api::LaunchContext& c) {
       kernels::cuda::batch_indices_positions(p, c.stream);
     }},
#endif
};

std::tuple<Tensor, Tensor> get_batch_indices_positions_impl(const Tensor& append_indptr,
                                                            const Tensor& seq_lens, int64_t nnz,
                                                            std::optional<Tensor> batch_indices,
                                                            std::optional<Tensor> positions) {
  const char* op = "get_batch_indices_positions";
  for (const auto& [t, arg] :
       {std::pair{&append_indptr, "append_indptr"}, std::pair{&seq_lens, "seq_lens"}}) {
    api::check_defined(*t, op, arg);
    api::check_dim(*t, {1}, op, arg);
    api::check_dtype_in(*t, {DType::kInt32, DType::kInt64}, op, arg);
    FLASHINFER_CHECK(t->is_contiguous(), op, arg, "must be contiguous");
  }
  FLASHINFER_CHECK(append_indptr.size(0) >= 1, op, "append_indptr",
                   "needs batch_size + 1 >= 1 elements");
  const int64_t batch = append_indptr.size(0) - 1;
  api::check_shape_eq(seq_lens, {batch}, op, "seq_lens");
  api::check_same_device(seq_lens, append_indptr, op, "seq_lens", "append_indptr");
  FLASHINFER_CHECK(nnz >= 0 && nnz <= INT32_MAX, op, "nnz", "must be in [0, 2^31), got ", nnz);
  const Device dev = append_indptr.device();
  if (dev.is_cpu()) {
    // Upstream's kernel trusts the values; a bad indptr there writes past the outputs.
    const bool i64 = append_indptr.dtype() == DType::kInt64;
    auto at = [&](int64_t i) { return kernels::bip_load(append_indptr.data_ptr(), i64, i); };
    FLASHINFER_CHECK(at(0) >= 0, op, "append_indptr", "must start at >= 0, got ", at(0));
    for (int64_t i = 1; i <= batch; ++i) {
      FLASHINFER_CHECK(at(i) >= at(i - 1), op, "append_indptr", "must be non-decreasing: element ",
                       i, " (", at(i), ") < element ", i - 1, " (", at(i - 1), ")");
    }
    FLASHINFER_CHECK(nnz >= at(batch), op, "nnz", "is ", nnz, " but append_indptr ends at ",
                     at(batch), " (the outputs hold nnz elements)");
  }
  // Given buffers: exactly (nnz,) int32 on the indices' device, as upstream's
  // check_shape_dtype_device.
  auto output = [&](std::optional<Tensor>& buf, const char* arg) {
    if (!buf) return Tensor::empty({nnz}, DType::kInt32, dev);
    api::check_defined(*buf, op, arg);
    api::check_dtype_in(*buf, {DType::kInt32}, op, arg);
    api::check_shape_eq(*buf, {nnz}, op, arg);
    api::check_same_device(*buf, append_indptr, op, arg, "append_indptr");
    api::check_writable(*buf, op, arg);
    return *buf;
  };
  Tensor out_b = output(batch_indices, "batch_indices");
  Tensor out_p = output(positions, "positions");
  api::check_no_overlap(out_p, out_b, op, "positions", "batch_indices");
  kernels::BatchIndicesPositionsParams p;
  p.indptr = append_indptr.data_ptr();
  p.indptr_i64 = append_indptr.dtype() == DType::kInt64;
  p.seq_lens = seq_lens.data_ptr();
  p.seq_lens_i64 = seq_lens.dtype() == DType::kInt64;
  p.batch = batch;
  p.nnz = nnz;
  p.batch_indices = out_b.data<int32_t>();
  p.bi_stride = out_b.stride(0);
  p.positions = out_p.data<int32_t>();
  p.pos_stride = out_p.stride(0);
  p.zero_positions = !positions.has_value();
  api::launch(kBatchIndicesPositionsKernels, p, dev, op, "append_indptr");
  return {out_b, out_p};
}

void append_impl(const Tensor& append_key, const Tensor& append_value, const Tensor& batch_indices,
                 const Tensor& positions, const PagedKVCache& paged_kv_cache,
                 const Tensor& kv_indices, const Tensor& kv_indptr, const Tensor& kv_last_page_len,
                 std::string_view kv_layout) {
  const char* op = "append_paged_kv_cache";
  const bool hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
  auto [k, v] = api::paged_cache_views(paged_kv_cache, hnd, op, "paged_kv_cache");
  for (const auto& [t, arg, cache] :
       {std::tuple{&append_key, "append_key", &k}, std::tuple{&append_value, "append_value", &v}}) {
    api::check_defined(*t, op, arg);
    api::check_dim(*t, {3}, op, arg);
    api::check_same_dtype(*t, *cache, op, arg, "paged_kv_cache");
    api::check_same_device(*t, *cache, op, arg, "paged_kv_cache");
    FLASHINFER_CHECK(t->size(1) == cache->size(2) && t->size(2) == cache->size(3), op, arg,
                     "rows are [", t->size(1), ", ", t->size(2), "] but the cache holds [",
                     cache->size(2), ", ", cache->size(3), "] per token");
    FLASHINFER_CHECK(t->stride(2) == 1, op, arg, "the head_dim axis must be contiguous");
  }
  const int64_t nnz = append_key.size(0);
  FLASHINFER_CHECK(append_value.size(0) == nnz, op, "append_value", "has ", append_value.size(0),
                   " rows, append_key has ", nnz);
  FLASHINFER_CHECK(k.size(3) == v.size(3), op, "paged_kv_cache",
                   "k and v head dims differ (not supported by append)");
  for (const auto* t : {&batch_indices, &positions, &kv_indices, &kv_indptr, &kv_last_page_len}) {
    FLASHINFER_CHECK(t->device() == k.device(), op,
                     t == &batch_indices ? "batch_indices"
                     : t == &positions   ? "positions"
                     : t == &kv_indices  ? "kv_indices"
                     : t == &kv_indptr   ? "kv_indptr"
                                         : "kv_last_page_len",
                     "is on ", t->device().str(), " but paged_kv_cache is on ", k.device().str());
  }
  api::AppendIndexArrays idx;
  api::load_append_index_arrays(idx, batch_indices, positions, kv_indices, kv_indptr,
                                kv_last_page_len, k.size(0), k.size(1), nnz, op);
  if (nnz == 0) return;
  kernels::AppendParams p;
  p.table = idx.table;
  p.append_key = append_key.data_ptr();
  p.append_value = append_value.data_ptr();
  p.ak_stride_n = append_key.stride(0);
  p.ak_stride_h = append_key.stride(1);
  p.av_stride_n = append_value.stride(0);
  p.av_stride_h = append_value.stride(1);
  p.k_stride_page = k.stride(0);
  p.k_stride_token = k.stride(1);
  p.k_stride_head = k.stride(2);
  p.v_stride_page = v.stride(0);
  p.v_stride_token = v.stride(1);
  p.v_stride_head = v.stride(2);
  p.k_out = k.data_ptr();
  p.v_out = v.data_ptr();
  p.elem_size = static_cast<int64_t>(k.element_size());
  p.nnz = nnz;
  p.num_heads = k.size(2);
  p.head_dim = k.size(3);
  api::launch(kPageAppendKernels, p, k.device(), op, "paged_kv_cache");
}

}  // namespace

// A plain helper, as upstream's flashinfer.page.get_seq_lens (not an @flashinfer_api op): not
// declared, so never logged or recorded.
// On CUDA a kernel computes it on the device (upstream: torch ops there), with no host copy, so
// a CUDA graph can capture it; the CPU checks the values.
Tensor get_seq_lens(const Tensor& kv_indptr, const Tensor& kv_last_page_len, int64_t page_size) {
  const char* op = "get_seq_lens";
  FLASHINFER_CHECK(page_size >= 1, op, "page_size", "must be >= 1, got ", page_size);
#if FLASHINFER_WITH_CUDA
  if (kv_indptr.device().is_cuda()) {
    // The CPU path's checks (index_to_host's), without reading the values.
    api::check_index_tensor(kv_indptr, op, "kv_indptr");
    FLASHINFER_CHECK(kv_indptr.size(0) >= 1, op, "kv_indptr", "needs batch_size + 1 >= 1 elements");
    const int64_t batch = kv_indptr.size(0) - 1;
    api::check_index_tensor(kv_last_page_len, op, "kv_last_page_len", batch);
    api::check_same_device(kv_last_page_len, kv_indptr, op, "kv_last_page_len", "kv_indptr");
    const Tensor ip = kv_indptr.contiguous(), last = kv_last_page_len.contiguous();
    Tensor out = Tensor::empty({batch}, DType::kInt32, kv_indptr.device());
    kernels::SeqLensParams p;
    p.indptr = ip.data<int32_t>();
    p.last = last.data<int32_t>();
    p.batch = batch;
    p.page_size = page_size;
    p.out = out.data<int32_t>();
    kernels::cuda::seq_lens(p, current_cuda_stream());
    return out;
  }
#endif
  const std::vector<int32_t> indptr = api::index_to_host(kv_indptr, op, "kv_indptr");
  api::check_indptr(indptr, op, "kv_indptr");
  const auto batch = static_cast<int64_t>(indptr.size()) - 1;
  const std::vector<int32_t> last =
      api::index_to_host(kv_last_page_len, op, "kv_last_page_len", batch);
  api::check_same_device(kv_last_page_len, kv_indptr, op, "kv_last_page_len", "kv_indptr");
  std::vector<int32_t> lens(static_cast<std::size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = indptr[b + 1] - indptr[b];
    // Checked: a page_size such as 2^62 must not wrap into a small, plausible length.
    const int64_t full = std::max<int64_t>(pages - 1, 0);
    int64_t len = 0;
    FLASHINFER_CHECK(!__builtin_mul_overflow(full, page_size, &len) && len <= INT32_MAX, op,
                     "page_size", "request ", b, " has ", full, " full pages of ", page_size,
                     " tokens: its length does not fit in int32");
    len += last[b];
    FLASHINFER_CHECK(len >= 0 && len <= INT32_MAX, op, "kv_last_page_len", "element ", b,
                     " gives a length outside int32: ", len);
    lens[b] = static_cast<int32_t>(len);
  }
  return page_host_int32(lens).to(kv_indptr.device());
}

std::tuple<Tensor, Tensor> get_batch_indices_positions(const Tensor& append_indptr,
                                                       const Tensor& seq_lens, int64_t nnz,
                                                       std::optional<Tensor> batch_indices,
                                                       std::optional<Tensor> positions) {
  return call_op<&get_batch_indices_positions>(
      [&] {
        return get_batch_indices_positions_impl(append_indptr, seq_lens, nnz, batch_indices,
                                                positions);
      },
      append_indptr, seq_lens, nnz, batch_indices, positions);
}

void append_paged_kv_cache(const Tensor& append_key, const Tensor& append_value,
                           const Tensor& batch_indices, const Tensor& positions,
                           const PagedKVCache& paged_kv_cache, const Tensor& kv_indices,
                           const Tensor& kv_indptr, const Tensor& kv_last_page_len,
                           std::string_view kv_layout) {
  call_op<&append_paged_kv_cache>(
      [&] {
        // Upstream converts the index arrays with .int().
        using api::int32_index;
        append_impl(append_key, append_value, int32_index(batch_indices), int32_index(positions),
                    paged_kv_cache, int32_index(kv_indices), int32_index(kv_indptr),
                    int32_index(kv_last_page_len), kv_layout);
      },
      append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr,
      kv_last_page_len, kv_layout);
}

namespace {

// Bench hook: the last s_qo tokens of each of batch_size requests of s_kv tokens are written
// (again) into the bench cache (NHD, K and V as a pair). Bytes: the appended K and V read once
// and written once, plus the int32 batch indices and positions. FLOPs: 0.
BenchCase page_bench_append(const BenchShape& s, Device dev) {
  FLASHINFER_CHECK(s.s_qo <= s.s_kv, "append_paged_kv_cache", "s_qo",
                   "the bench appends s_qo tokens into requests of s_kv tokens: need s_qo <= s_kv");
  const api::bench::BenchPages p = api::bench::bench_pages(s, dev);
  const int64_t nnz = s.batch_size * s.s_qo;
  std::vector<int64_t> batch(static_cast<std::size_t>(nnz)), pos(static_cast<std::size_t>(nnz));
  for (int64_t i = 0; i < nnz; ++i) {
    batch[static_cast<std::size_t>(i)] = i / s.s_qo;
    pos[static_cast<std::size_t>(i)] = s.s_kv - s.s_qo + i % s.s_qo;
  }
  const Shape kv{nnz, s.num_kv_heads, s.head_dim_qk};
  BenchCase c = api::bench::invoke_case(
      "append_paged_kv_cache",
      {Value(api::bench::random_tensor(kv, s.kv_dtype, dev, s.random_seed + 7)),
       Value(api::bench::random_tensor(kv, s.kv_dtype, dev, s.random_seed + 8)),
       Value(api::bench::int32_tensor(batch, dev)), Value(api::bench::int32_tensor(pos, dev)),
       Value::tuple({Value(p.k), Value(p.v)}), Value(p.indices), Value(p.indptr),
       Value(p.last_page_len)});
  c.bytes = 4.0 * api::bench::nbytes(kv, s.kv_dtype) + 8.0 * static_cast<double>(nnz);
  return c;
}

}  // namespace

namespace detail {
void register_page_ops(OpRegistry& r) {
  declare<&get_batch_indices_positions>(
      r,
      {.name = "get_batch_indices_positions",
       .module = kPageCacheModule,
       .summary = "Request index and absolute position of every appended row"},
      "append_indptr", "seq_lens", "nnz", arg("batch_indices").mut(), arg("positions").mut());
  declare<&append_paged_kv_cache>(
      r,
      {.name = "append_paged_kv_cache",
       .module = kPageCacheModule,
       .summary = "Writes appended key/value rows into their pages of a paged KV cache"},
      "append_key", "append_value", "batch_indices", "positions", arg("paged_kv_cache").mut(),
      "kv_indices", "kv_indptr", "kv_last_page_len", arg("kv_layout", "NHD"));
  api::register_backends("get_batch_indices_positions", kBatchIndicesPositionsKernels);
  api::register_backends("append_paged_kv_cache", kPageAppendKernels);
  register_bench_hook("append_paged_kv_cache", page_bench_append);
}
}  // namespace detail

}  // namespace flashinfer
