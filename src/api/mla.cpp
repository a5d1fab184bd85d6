// DeepSeek MLA (flashinfer.mla._core) and its layout helpers (flashinfer.page's
// append_paged_mla_kv_cache, flashinfer.concat_ops.concat_mla_k): declarations, checks, plan
// state and dispatch. Attention runs on the CPU reference or the CUDA kernel
// (kernels/cuda/mla_cuda.cu); the two layout helpers are CPU-only for now (the backend tables
// say so, and a replay with --device cuda falls back to the CPU for them).
#include "flashinfer/ops/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/device_props.h"
#include "api/kernel_table.h"
#include "api/page_ids_at_run.h"
#include "core/cuda_runtime.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/mla_cpu.h"
#include "kernels/mla_params.h"
#include "recorder/call_extensions.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/mla_cuda.h"
#endif

namespace flashinfer {
namespace detail {

/// What BatchMLAPagedAttentionWrapper keeps between plan() and run().
struct MlaWrapperState {
  Tensor float_workspace;
  Device device;
  bool use_cuda_graph = false;
  std::string backend = "auto";
  bool planned = false;
  // BatchMLAPagedAttentionWrapper.plan's run contract (upstream 0.7.4's MLAInputContract): the
  // LSE every run asks for, run's out dtype, the scale family, and whether the plan was the
  // legacy flat CSR form (whose "none" LSE mode lets a run ask for one, as upstream's).
  std::string lse_mode = "none", scale_mode = "default";
  DType out_dtype = DType::kBFloat16;
  bool legacy_csr = true;
  int32_t batch = 0, num_heads = 0, dim_ckv = 0, dim_kpe = 0, page_size = 1;
  bool causal = false;
  double sm_scale = 1.0;
  DType q_dtype = DType::kBFloat16, kv_dtype = DType::kBFloat16;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_lens;
  int64_t max_page_id = -1;
  // BatchMLAPagedAttentionWrapper reads its page ids when it runs, as upstream's kernels read the
  // caller's kv_indices tensor then (engines write new ids into it after plan): live_indices is
  // that tensor, plan's kv_indices where it is on the wrapper's device, under use_cuda_graph the
  // constructor's buffer (graph_indices_buf), which plan copies into. Undefined: the ids plan
  // copied (kv_indices above; a host tensor on a CUDA wrapper, as upstream's .to(device) copies).
  // CPU: run() reads and checks them; CUDA: the kernels read them, after a guard kernel
  // (kernels/mla_page_guard.h) has refused, with NaN rows, each request with a bad id.
  Tensor graph_indices_buf, live_indices;
  // Under use_cuda_graph the constructor's other buffers, which plan fills as upstream's plan does
  // (vLLM's SM90 sparse backend reads its kv_indptr buffer on the device to place each step's
  // ids): qo_indptr, kv_indptr, kv_len_arr.
  Tensor graph_qo_buf, graph_kv_indptr_buf, graph_kv_len_buf;
  // The index arrays on the device a CUDA run uses: qo_indptr, kv_indptr, kv_lens, row_req, the
  // largest kv_lens entry (one int) and kv_indices, at the offsets dev_off (kv_indices last).
  // Uploaded by the wrappers' plan() on a CUDA device, else by the first run (the trtllm / xqa
  // MLA entry points plan inside run).
  Tensor dev_ints;
  bool dev_ints_current = false;
  int64_t dev_off[6] = {};
  // BatchDecodeMlaWithPagedKVCacheWrapper in CUDA-graph mode: the batch size fixed at __init__
  // and the room of its page-index buffer (upstream's plan checks both).
  int64_t fixed_batch = 0, indices_capacity = 0;
  // CUDA-graph mode on a CUDA device (both wrappers): the first plan fixes the batch, the room
  // for query rows (graph_rows: its rows or its batch, the larger; row_req gets that many
  // entries, those past a plan's rows -1, so a graph captured with more rows skips them) and
  // dev_ints' layout, kv_indices getting graph_indices_cap entries (the constructor's
  // page-index buffer, else the first plan's pages); every plan then rewrites dev_ints in place,
  // so a graph captured around run() reads the latest plan: its kernels take the chunk from the
  // device's largest length (MlaAttentionParams::max_kv_dev) and their splits from the grid.
  int64_t graph_batch = -1, graph_rows = -1, graph_indices_cap = 0;
  // What else a captured graph holds from the first plan (a re-plan may not change it: a page
  // size read by kernels built for another would index past the page lists), and the pages of
  // the smallest cache a captured run read (later plans' page ids are checked against it: run()
  // is not called before a replay). -1: no run captured yet.
  int32_t graph_page_size = 0, graph_heads = 0, graph_dim_ckv = 0;
  bool graph_causal = false;
  double graph_sm_scale = 0.0;
  DType graph_q_dtype = DType::kBFloat16, graph_kv_dtype = DType::kBFloat16;
  int64_t graph_cache_pages = -1;
  // The trtllm / xqa MLA decode on CUDA plan on the device (kernels/block_table_plan.h): the plan
  // kernel's inputs, run by run_mla before the MLA kernels, which read the block table in place
  // and take their KV chunk from the longest accepted length (dev_ints' max slot); the host knows
  // only max_seq_len (block_max_kv: it, or the table row's room when shorter).
  std::optional<kernels::BlockTablePlan> block_plan;
  Tensor block_plan_table;
  int32_t block_max_kv = 0;
  std::shared_ptr<void> block_plan_scratch;  // dev_ints' memory (api::block_plan_scratch)
};

}  // namespace detail

namespace {

constexpr const char* kMlaClass = "BatchMLAPagedAttentionWrapper";
constexpr const char* kMlaModule = "flashinfer.mla._core";
constexpr const char* kTrtllmOp = "trtllm_batch_decode_with_kv_cache_mla";
constexpr const char* kMlaXqaOp = "xqa_batch_decode_with_kv_cache_mla";

constexpr const char* kDecodeClass = "BatchDecodeMlaWithPagedKVCacheWrapper";

using MlaDecodeInit = Init<BatchDecodeMlaWithPagedKVCacheWrapper, Tensor, bool, bool,
                           std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>>;

using MlaInit =
    Init<BatchMLAPagedAttentionWrapper, Tensor, bool, std::optional<Tensor>, std::optional<Tensor>,
         std::optional<Tensor>, std::optional<Tensor>, std::string>;

constexpr api::KernelEntry<kernels::MlaAttentionParams> kMlaKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 accumulation, OpenMP over query rows", nullptr,
     [](const kernels::MlaAttentionParams& p, const api::LaunchContext&) {
       kernels::cpu::mla_attention(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: fp32 online softmax, warp per head, shared latent tiles, split-KV + merge",
     [](const kernels::MlaAttentionParams& p) {
       return api::Refusal{nullptr, kernels::cuda::mla_attention_unsupported(p)};
     },
     [](const kernels::MlaAttentionParams& p, const api::LaunchContext& c) {
       kernels::cuda::mla_attention(p, c.stream, c.enable_pdl);
     }},
#endif
};
constexpr api::KernelEntry<kernels::MlaAppendParams> kMlaAppendKernels[] = {
    {DeviceType::kCPU, "CPU reference: row copies, OpenMP over appended rows", nullptr,
     [](const kernels::MlaAppendParams& p, const api::LaunchContext&) {
       kernels::cpu::append_paged_mla_kv_cache(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: row copies, a warp (16-byte copies) or a block per appended row, index arrays "
     "read on the device (rows whose target is outside the page table are not written)",
     nullptr,
     [](const kernels::MlaAppendParams& p, const api::LaunchContext& c) {
       kernels::cuda::append_paged_mla_kv_cache(p, c.stream);
     }},
#endif
};
constexpr api::KernelEntry<kernels::ConcatMlaKParams> kConcatKernels[] = {
    {DeviceType::kCPU, "CPU reference: row copies, OpenMP over tokens", nullptr,
     [](const kernels::ConcatMlaKParams& p, const api::LaunchContext&) {
       kernels::cpu::concat_mla_k(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: row copies, block per (token, head)",
     [](const kernels::ConcatMlaKParams& p) {
       return p.num_heads > 65535 ? api::Refusal{"k", "more than 65535 heads"} : api::Refusal{};
     },
     [](const kernels::ConcatMlaKParams& p, const api::LaunchContext& c) {
       kernels::cuda::concat_mla_k(p, c.stream);
     }},
#endif
};

int32_t to_i32(int64_t v, const char* op, const char* arg, int64_t lo = 1) {
  FLASHINFER_CHECK(v >= lo && v <= std::numeric_limits<int32_t>::max(), op, arg, "must be in [", lo,
                   ", 2^31 - 1], got ", v);
  return static_cast<int32_t>(v);
}

void mla_check_last_contiguous(const Tensor& t, const char* op, const char* arg) {
  FLASHINFER_CHECK(t.stride(t.dim() - 1) == 1 || t.size(t.dim() - 1) <= 1, op, arg,
                   "the last axis must be contiguous");
}

// ---- append_paged_mla_kv_cache / concat_mla_k ---------------------------------------------

void append_mla_impl(const Tensor& append_ckv, const Tensor& append_kpe,
                     const Tensor& batch_indices, const Tensor& positions, const Tensor& ckv,
                     const Tensor& kpe, const Tensor& kv_indices, const Tensor& kv_indptr,
                     const Tensor& kv_last_page_len) {
  const char* op = "append_paged_mla_kv_cache";
  api::check_defined(ckv, op, "ckv_cache");
  api::check_defined(kpe, op, "kpe_cache");
  api::check_dim(ckv, {3}, op, "ckv_cache");
  api::check_dim(kpe, {3}, op, "kpe_cache");
  api::check_same_dtype(kpe, ckv, op, "kpe_cache", "ckv_cache");
  api::check_same_device(kpe, ckv, op, "kpe_cache", "ckv_cache");
  FLASHINFER_CHECK(kpe.size(0) == ckv.size(0) && kpe.size(1) == ckv.size(1), op, "kpe_cache",
                   "has [pages, page_size] = [", kpe.size(0), ", ", kpe.size(1),
                   "] but ckv_cache has [", ckv.size(0), ", ", ckv.size(1), "]");
  mla_check_last_contiguous(ckv, op, "ckv_cache");
  mla_check_last_contiguous(kpe, op, "kpe_cache");
  api::check_writable(ckv, op, "ckv_cache");
  api::check_writable(kpe, op, "kpe_cache");
  api::check_no_overlap(ckv, kpe, op, "ckv_cache", "kpe_cache");
  for (const auto& [t, arg, cache] :
       {std::tuple{&append_ckv, "append_ckv", &ckv}, std::tuple{&append_kpe, "append_kpe", &kpe}}) {
    api::check_defined(*t, op, arg);
    api::check_dim(*t, {2}, op, arg);
    api::check_same_dtype(*t, *cache, op, arg, cache == &ckv ? "ckv_cache" : "kpe_cache");
    api::check_same_device(*t, *cache, op, arg, cache == &ckv ? "ckv_cache" : "kpe_cache");
    FLASHINFER_CHECK(t->size(1) == cache->size(2), op, arg, "rows have ", t->size(1),
                     " elements but the cache holds ", cache->size(2), " per token");
    mla_check_last_contiguous(*t, op, arg);
  }
  const int64_t nnz = append_ckv.size(0);
  FLASHINFER_CHECK(append_kpe.size(0) == nnz, op, "append_kpe", "has ", append_kpe.size(0),
                   " rows, append_ckv has ", nnz);
  for (const auto& [t, arg] :
       {std::pair{&batch_indices, "batch_indices"}, std::pair{&positions, "positions"},
        std::pair{&kv_indices, "kv_indices"}, std::pair{&kv_indptr, "kv_indptr"},
        std::pair{&kv_last_page_len, "kv_last_page_len"}}) {
    api::check_defined(*t, op, arg);
    api::check_same_device(*t, ckv, op, arg, "ckv_cache");
  }
  api::AppendIndexArrays idx;
  api::load_append_index_arrays(idx, batch_indices, positions, kv_indices, kv_indptr,
                                kv_last_page_len, ckv.size(0), ckv.size(1), nnz, op);
  if (nnz == 0) return;
  kernels::MlaAppendParams p;
  p.append_ckv = append_ckv.data_ptr();
  p.append_kpe = append_kpe.data_ptr();
  p.ackv_stride_n = append_ckv.stride(0);
  p.akpe_stride_n = append_kpe.stride(0);
  p.ckv = ckv.data_ptr();
  p.kpe = kpe.data_ptr();
  p.ckv_stride_page = ckv.stride(0);
  p.ckv_stride_token = ckv.stride(1);
  p.kpe_stride_page = kpe.stride(0);
  p.kpe_stride_token = kpe.stride(1);
  p.table = idx.table;
  p.nnz = nnz;
  p.dim_ckv = ckv.size(2);
  p.dim_kpe = kpe.size(2);
  p.elem_size = static_cast<int64_t>(ckv.element_size());
  api::launch(kMlaAppendKernels, p, ckv.device(), op, "ckv_cache");
}

void concat_mla_k_impl(const Tensor& k, const Tensor& k_nope, const Tensor& k_rope) {
  const char* op = "concat_mla_k";
  for (const auto& [t, arg] :
       {std::pair{&k, "k"}, std::pair{&k_nope, "k_nope"}, std::pair{&k_rope, "k_rope"}}) {
    api::check_defined(*t, op, arg);
    api::check_dim(*t, {3}, op, arg);
    mla_check_last_contiguous(*t, op, arg);
  }
  api::check_dtype_in(
      k, {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3FN, DType::kFloat8E5M2}, op, "k");
  api::check_same_dtype(k_nope, k, op, "k_nope", "k");
  api::check_same_dtype(k_rope, k, op, "k_rope", "k");
  api::check_same_device(k_nope, k, op, "k_nope", "k");
  api::check_same_device(k_rope, k, op, "k_rope", "k");
  const int64_t tokens = k.size(0), heads = k.size(1);
  FLASHINFER_CHECK(k_nope.size(0) == tokens && k_nope.size(1) == heads, op, "k_nope", "must be [",
                   tokens, ", ", heads, ", nope_dim], got ", shape_to_string(k_nope.shape()));
  FLASHINFER_CHECK(k_rope.size(0) == tokens && k_rope.size(1) == 1, op, "k_rope", "must be [",
                   tokens, ", 1, rope_dim], got ", shape_to_string(k_rope.shape()));
  FLASHINFER_CHECK(k.size(2) == k_nope.size(2) + k_rope.size(2), op, "k", "last dim ", k.size(2),
                   " must be nope_dim + rope_dim = ", k_nope.size(2) + k_rope.size(2));
  api::check_writable(k, op, "k");
  api::check_no_overlap(k, k_nope, op, "k", "k_nope");
  api::check_no_overlap(k, k_rope, op, "k", "k_rope");
  if (k.numel() == 0) return;
  kernels::ConcatMlaKParams p;
  p.k = k.data_ptr();
  p.k_nope = k_nope.data_ptr();
  p.k_rope = k_rope.data_ptr();
  p.k_stride_t = k.stride(0);
  p.k_stride_h = k.stride(1);
  p.kn_stride_t = k_nope.stride(0);
  p.kn_stride_h = k_nope.stride(1);
  p.kr_stride_t = k_rope.stride(0);
  p.tokens = tokens;
  p.num_heads = heads;
  p.nope_dim = k_nope.size(2);
  p.rope_dim = k_rope.size(2);
  p.elem_size = static_cast<int64_t>(k.element_size());
  api::launch(kConcatKernels, p, k.device(), op, "k");
}

// ---- attention --------------------------------------------------------------------------

// One MLA attention call after planning: checks the tensors against the plan and runs.
// q_nope/q_pe [rows, H, *], ckv/kpe [pages, page_size, *] views.
struct MlaRun {
  const char* op;
  const char *qn_arg, *qp_arg, *ckv_arg, *kpe_arg;
  Tensor q_nope, q_pe, ckv, kpe;
  std::optional<Tensor> out, lse;
  bool return_lse = false, lse_base_e = false;
  DType o_dtype = DType::kBFloat16;
  float ckv_scale = 1.0f, kpe_scale = 1.0f, out_scale = 1.0f;
  // The block-table decode calls' bmm1_scale / bmm2_scale given as tensors on the device (fp32
  // [1]): factors of sm_scale and out_scale the CUDA kernels read (MlaAttentionParams::*_dev).
  Tensor sm_scale_dev, out_scale_dev;
  // BatchMLAPagedAttentionWrapper.run's ckv_scale_arr, checked (MlaAttentionParams::ckv_scale_arr).
  Tensor ckv_scale_arr;
};

bool graph_mode(const detail::MlaWrapperState& s) { return s.use_cuda_graph && s.device.is_cuda(); }

int32_t max_kv_len(const detail::MlaWrapperState& s) {
  return s.kv_lens.empty() ? 0 : *std::max_element(s.kv_lens.begin(), s.kv_lens.end());
}

// Puts the plan's index arrays (and the row -> request map) on `dev`, once per plan and device;
// a re-plan reuses the buffer when it is large enough (in CUDA-graph mode it always is, and the
// offsets never move: plan_upload).
void upload_indices(detail::MlaWrapperState& s, Device dev) {
  if (s.dev_ints_current && s.dev_ints.defined() && s.dev_ints.device() == dev) return;
  std::vector<int32_t> all;
  auto append = [&](int idx, const std::vector<int32_t>& v) {
    s.dev_off[idx] = static_cast<int64_t>(all.size());
    all.insert(all.end(), v.begin(), v.end());
  };
  std::vector<int32_t> row_req;
  for (int32_t b = 0; b < s.batch; ++b) {
    row_req.insert(row_req.end(), static_cast<std::size_t>(s.qo_indptr[b + 1] - s.qo_indptr[b]), b);
  }
  // CUDA-graph mode: the captured grid's rows past this plan's belong to no request (skipped).
  if (graph_mode(s) && s.graph_rows > static_cast<int64_t>(row_req.size())) {
    row_req.resize(static_cast<std::size_t>(s.graph_rows), -1);
  }
  append(0, s.qo_indptr);
  append(1, s.kv_indptr);
  append(2, s.kv_lens);
  append(4, row_req);
  append(5, {max_kv_len(s)});
  // kv_indices last: the arrays before it have sizes the graph mode fixes.
  append(3, s.kv_indices);
  all.push_back(0);  // never empty
  const auto n = static_cast<int64_t>(all.size());
  // Live ids are read from the caller's tensor: no room for them here.
  const int64_t room = s.live_indices.defined() ? 0 : s.graph_indices_cap;
  const int64_t capacity = graph_mode(s) ? s.dev_off[3] + room + 1 : n;
  Tensor h = Tensor::empty({n}, DType::kInt32);
  std::memcpy(h.data_ptr(), all.data(), all.size() * sizeof(int32_t));
  if (!s.dev_ints.defined() || s.dev_ints.device() != dev || s.dev_ints.numel() < n) {
    s.dev_ints = Tensor::empty({std::max(n, capacity)}, DType::kInt32, dev);
  }
  s.dev_ints.slice(0, 0, n).copy_(h);
  s.dev_ints_current = true;
}

// The end of both wrappers' plan() on a CUDA device: the plan's arrays go to the device here, as
// upstream's plan copies them (run() then makes no copy and no synchronization). In CUDA-graph
// mode the first plan fixes the batch, the query rows and the page-index room, and every plan
// uploads in place (a graph replayed after a re-plan reads the arrays; run() is not called then).
void plan_upload(detail::MlaWrapperState& s, const char* op, const char* batch_arg,
                 const char* indices_arg) {
  if (!s.device.is_cuda()) return;
  if (!graph_mode(s)) {
    upload_indices(s, s.device);
    return;
  }
  const int64_t rows = s.qo_indptr.back();
  const int64_t pages = s.kv_indptr.back();
  // The first plan's values, fixed only once it is accepted (a refused first plan fixes nothing).
  const bool first = s.graph_batch < 0;
  const int64_t cap =
      first && s.graph_indices_cap == 0 ? std::max<int64_t>(pages, 1) : s.graph_indices_cap;
  if (!first) {
    FLASHINFER_CHECK(s.batch == s.graph_batch, op, batch_arg,
                     "under use_cuda_graph the batch size is fixed by the first plan (",
                     s.graph_batch, "), got ", s.batch);
    FLASHINFER_CHECK(rows <= s.graph_rows, op, "qo_indptr",
                     "under use_cuda_graph a plan has at most the query rows the first plan made "
                     "room for (",
                     s.graph_rows, ": its rows or its batch size, the larger), got ", rows);
    FLASHINFER_CHECK(s.page_size == s.graph_page_size, op, "page_size",
                     "under use_cuda_graph the page size is fixed by the first plan (",
                     s.graph_page_size, "), got ", s.page_size);
    FLASHINFER_CHECK(s.num_heads == s.graph_heads && s.dim_ckv == s.graph_dim_ckv &&
                         s.causal == s.graph_causal && s.sm_scale == s.graph_sm_scale &&
                         s.q_dtype == s.graph_q_dtype && s.kv_dtype == s.graph_kv_dtype,
                     op, "self",
                     "under use_cuda_graph the heads, head dims, dtypes, causal and sm_scale are "
                     "fixed by the first plan (a captured graph holds them)");
  }
  FLASHINFER_CHECK(pages <= cap, op, indices_arg, "has ", pages,
                   " page ids; under use_cuda_graph a plan holds at most ", cap,
                   " (the constructor's page-index buffer, else the first plan's pages)");
  FLASHINFER_CHECK(s.graph_cache_pages < 0 || s.max_page_id < s.graph_cache_pages, op, indices_arg,
                   "refers to page ", s.max_page_id, " but the cache the last run read has ",
                   s.graph_cache_pages, " pages (a graph replays against it)");
  if (first) {
    s.graph_batch = s.batch;
    // The captured grid's rows (a block a row): vLLM's SM90 sparse backend re-plans one wrapper
    // with each step's rows, at most one a request.
    s.graph_rows = std::max<int64_t>(rows, s.batch);
    s.graph_indices_cap = cap;
    s.graph_page_size = s.page_size;
    s.graph_heads = s.num_heads;
    s.graph_dim_ckv = s.dim_ckv;
    s.graph_causal = s.causal;
    s.graph_sm_scale = s.sm_scale;
    s.graph_q_dtype = s.q_dtype;
    s.graph_kv_dtype = s.kv_dtype;
  }
  upload_indices(s, s.device);
}

// CPU: the ids run() reads from live_indices, checked where the kernel reads them (each request's
// first ceil(kv_len / page_size), for requests with query rows): no negative id; the largest
// goes to max_page_id, which run_mla checks against the cache.
void read_live_page_ids(detail::MlaWrapperState& s, const char* op) {
  const int64_t n = s.kv_indptr.back();
  const Tensor h = s.live_indices.slice(0, 0, n).contiguous();
  const auto* ids = n > 0 ? h.data<const int32_t>() : nullptr;
  s.kv_indices.assign(ids, ids + n);
  s.max_page_id = -1;
  for (int32_t b = 0; b < s.batch; ++b) {
    if (s.qo_indptr[b + 1] == s.qo_indptr[b]) continue;
    const int64_t pages = (int64_t{s.kv_lens[b]} + s.page_size - 1) / s.page_size;
    for (int64_t i = s.kv_indptr[b]; i < s.kv_indptr[b] + pages; ++i) {
      FLASHINFER_CHECK(s.kv_indices[i] >= 0, op, "kv_indices", "page id ", s.kv_indices[i], " at ",
                       i, " is negative (the ids are read when the call runs)");
      s.max_page_id = std::max<int64_t>(s.max_page_id, s.kv_indices[i]);
    }
  }
}

// plan()'s choice of the tensor run() reads the page ids from (detail::MlaWrapperState,
// live_indices): under use_cuda_graph the constructor's buffer, into which plan then copies its
// ids as upstream's does (copy_plan_page_ids); else plan's kv_indices where it lives on the
// wrapper's device. Undefined: plan copies the ids (a host tensor on a CUDA wrapper; the
// CUDA-graph mode without a buffer).
Tensor live_page_ids(detail::MlaWrapperState& s, const Tensor& kv_indices, int64_t n,
                     const char* op) {
  if (s.use_cuda_graph) {
    Tensor& buf = s.graph_indices_buf;
    if (!buf.defined()) return {};
    // Upstream copies the whole tensor into the buffer's prefix.
    FLASHINFER_CHECK(std::max(n, kv_indices.numel()) <= buf.numel(), op, "kv_indices", "has ",
                     kv_indices.numel(), " elements; under use_cuda_graph a plan copies them into ",
                     "the constructor's kv_indices buffer, of ", buf.numel());
    return buf;
  }
  if (kv_indices.device() == s.device && kv_indices.is_contiguous()) return kv_indices;
  return {};
}

// The end of an accepted plan under use_cuda_graph: its ids into the constructor's buffer, as
// upstream's plan copies them. vLLM passes the buffer itself (or its prefix): nothing to copy.
void copy_plan_page_ids(const detail::MlaWrapperState& s, const Tensor& kv_indices) {
  if (s.use_cuda_graph && s.live_indices.defined()) {
    api::copy_into_graph_buffer(s.live_indices, kv_indices);
  }
}

// Under use_cuda_graph, plan's qo_indptr, kv_indptr and kv_len_arr into the constructor's
// buffers, as upstream's plan copies them (whole: upstream's copy_ refuses another size). With
// copy false, the size checks only (before the plan changes anything).
void copy_plan_arrays(detail::MlaWrapperState& s, const Tensor& qo_indptr, const Tensor& kv_indptr,
                      const Tensor& kv_len_arr, const char* op, bool copy) {
  if (!s.use_cuda_graph) return;
  for (const auto& [buf, src, arg] : {std::tuple{&s.graph_qo_buf, &qo_indptr, "qo_indptr"},
                                      std::tuple{&s.graph_kv_indptr_buf, &kv_indptr, "kv_indptr"},
                                      std::tuple{&s.graph_kv_len_buf, &kv_len_arr, "kv_len_arr"}}) {
    if (!buf->defined()) continue;
    FLASHINFER_CHECK(src->numel() == buf->numel(), op, arg, "has ", src->numel(),
                     " elements; under use_cuda_graph plan copies it into the constructor's "
                     "buffer of ",
                     buf->numel());
    if (copy) api::copy_into_graph_buffer(*buf, *src);
  }
}

AttentionOutput run_mla(detail::MlaWrapperState& s, const MlaRun& r) {
  const char* op = r.op;
  const int64_t rows = s.qo_indptr.back();
  const int64_t H = s.num_heads;
  FLASHINFER_CHECK(
      r.q_nope.size(0) == rows && r.q_nope.size(1) == H && r.q_nope.size(2) == s.dim_ckv, op,
      r.qn_arg, "must be [", rows, ", ", H, ", ", s.dim_ckv, "], got ",
      shape_to_string(r.q_nope.shape()));
  FLASHINFER_CHECK(r.q_pe.size(0) == rows && r.q_pe.size(1) == H && r.q_pe.size(2) == s.dim_kpe, op,
                   r.qp_arg, "must be [", rows, ", ", H, ", ", s.dim_kpe, "], got ",
                   shape_to_string(r.q_pe.shape()));
  FLASHINFER_CHECK(r.ckv.size(2) == s.dim_ckv, op, r.ckv_arg, "holds ", r.ckv.size(2),
                   " latent elements per token, expected ", s.dim_ckv);
  FLASHINFER_CHECK(r.kpe.size(2) == s.dim_kpe, op, r.kpe_arg, "holds ", r.kpe.size(2),
                   " rope elements per token, expected ", s.dim_kpe);
  FLASHINFER_CHECK(r.ckv.size(1) == s.page_size, op, r.ckv_arg, "page_size ", r.ckv.size(1),
                   " does not match the plan's ", s.page_size);
  FLASHINFER_CHECK(r.kpe.size(0) == r.ckv.size(0) && r.kpe.size(1) == r.ckv.size(1), op, r.kpe_arg,
                   "must have ckv's [pages, page_size] = [", r.ckv.size(0), ", ", r.ckv.size(1),
                   "], got ", shape_to_string(r.kpe.shape()));
  if (s.live_indices.defined() && !s.device.is_cuda()) read_live_page_ids(s, op);
  FLASHINFER_CHECK(s.max_page_id < r.ckv.size(0), op, r.ckv_arg, "has ", r.ckv.size(0),
                   " pages but the page table refers to page ", s.max_page_id);
  // Only a run being captured: a replay reads the cache of its capture, whatever eager runs read
  // since; with several graphs, the smallest of their caches.
  if (graph_mode(s) && detail::cuda_current_stream_capturing()) {
    s.graph_cache_pages =
        s.graph_cache_pages < 0 ? r.ckv.size(0) : std::min(s.graph_cache_pages, r.ckv.size(0));
  }
  FLASHINFER_CHECK(r.q_nope.dtype() == s.q_dtype, op, r.qn_arg, "dtype ",
                   dtype_torch_name(r.q_nope.dtype()), " is not the planned ",
                   dtype_torch_name(s.q_dtype));
  api::check_same_dtype(r.q_pe, r.q_nope, op, r.qp_arg, r.qn_arg);
  FLASHINFER_CHECK(r.ckv.dtype() == s.kv_dtype, op, r.ckv_arg, "dtype ",
                   dtype_torch_name(r.ckv.dtype()), " is not the planned ",
                   dtype_torch_name(s.kv_dtype));
  api::check_same_dtype(r.kpe, r.ckv, op, r.kpe_arg, r.ckv_arg);
  for (const auto& [t, arg] :
       {std::pair{&r.q_pe, r.qp_arg}, std::pair{&r.ckv, r.ckv_arg}, std::pair{&r.kpe, r.kpe_arg}}) {
    api::check_same_device(*t, r.q_nope, op, arg, r.qn_arg);
  }
  for (const auto& [t, arg] : {std::pair{&r.q_nope, r.qn_arg}, std::pair{&r.q_pe, r.qp_arg},
                               std::pair{&r.ckv, r.ckv_arg}, std::pair{&r.kpe, r.kpe_arg}}) {
    mla_check_last_contiguous(*t, op, arg);
  }
  FLASHINFER_CHECK(r.q_nope.device() == s.device, op, r.qn_arg, "is on ", r.q_nope.device().str(),
                   " but the wrapper was built for ", s.device.str());
  const Shape oshape{rows, H, s.dim_ckv};
  Tensor out;
  if (r.out) {
    out = *r.out;
    api::check_defined(out, op, "out");
    api::check_shape_eq(out, oshape, op, "out");
    FLASHINFER_CHECK(out.dtype() == r.o_dtype, op, "out", "dtype must be ",
                     dtype_torch_name(r.o_dtype), ", got ", dtype_torch_name(out.dtype()));
    api::check_same_device(out, r.q_nope, op, "out", r.qn_arg);
    mla_check_last_contiguous(out, op, "out");
    api::check_writable(out, op, "out");
    for (const auto& [t, arg] : {std::pair{&r.q_nope, r.qn_arg}, std::pair{&r.q_pe, r.qp_arg},
                                 std::pair{&r.ckv, r.ckv_arg}, std::pair{&r.kpe, r.kpe_arg}}) {
      api::check_no_overlap(out, *t, op, "out", arg);
    }
    if (r.ckv_scale_arr.defined()) {
      api::check_no_overlap(out, r.ckv_scale_arr, op, "out", "ckv_scale_arr");
    }
  } else {
    out = Tensor::empty(oshape, r.o_dtype, r.q_nope.device());
  }
  Tensor lse;
  const bool want_lse = r.return_lse || r.lse.has_value();
  if (r.lse) {
    lse = *r.lse;
    api::check_defined(lse, op, "lse");
    api::check_shape_eq(lse, Shape{rows, H}, op, "lse");
    FLASHINFER_CHECK(lse.dtype() == DType::kFloat32, op, "lse", "must be torch.float32, got ",
                     dtype_torch_name(lse.dtype()));
    api::check_same_device(lse, r.q_nope, op, "lse", r.qn_arg);
    api::check_writable(lse, op, "lse");
    api::check_no_overlap(lse, out, op, "lse", "out");
  } else if (want_lse) {
    lse = Tensor::empty({rows, H}, DType::kFloat32, r.q_nope.device());
  }
  if (rows > 0) {
    kernels::MlaAttentionParams p;
    p.q_nope = r.q_nope.data_ptr();
    p.q_pe = r.q_pe.data_ptr();
    p.q_dtype = r.q_nope.dtype();
    p.qn_stride_n = r.q_nope.stride(0);
    p.qn_stride_h = r.q_nope.stride(1);
    p.qp_stride_n = r.q_pe.stride(0);
    p.qp_stride_h = r.q_pe.stride(1);
    p.ckv = r.ckv.data_ptr();
    p.kpe = r.kpe.data_ptr();
    p.kv_dtype = r.ckv.dtype();
    p.ckv_stride_page = r.ckv.stride(0);
    p.ckv_stride_token = r.ckv.stride(1);
    p.kpe_stride_page = r.kpe.stride(0);
    p.kpe_stride_token = r.kpe.stride(1);
    p.kv_indptr = s.kv_indptr.data();
    p.kv_indices = s.kv_indices.data();
    p.page_size = s.page_size;
    p.qo_indptr = s.qo_indptr.data();
    p.kv_lens = s.kv_lens.data();
    p.o = out.data_ptr();
    p.o_dtype = out.dtype();
    p.o_stride_n = out.stride(0);
    p.o_stride_h = out.stride(1);
    if (want_lse) {
      p.lse = lse.data<float>();
      p.lse_stride_n = lse.stride(0);
      p.lse_stride_h = lse.stride(1);
    }
    p.lse_base_e = r.lse_base_e;
    p.batch = s.batch;
    p.num_heads = s.num_heads;
    p.dim_ckv = s.dim_ckv;
    p.dim_kpe = s.dim_kpe;
    p.sm_scale = static_cast<float>(s.sm_scale);
    p.ckv_scale = r.ckv_scale;
    p.kpe_scale = r.kpe_scale;
    if (r.ckv_scale_arr.defined()) p.ckv_scale_arr = r.ckv_scale_arr.data<const float>();
    p.out_scale = r.out_scale;
    if (r.sm_scale_dev.defined()) p.sm_scale_dev = r.sm_scale_dev.data<const float>();
    if (r.out_scale_dev.defined()) p.out_scale_dev = r.out_scale_dev.data<const float>();
    p.causal = s.causal;
    // The rows of this call's q / out (a captured grid keeps them; a replay after a re-plan with
    // fewer rows skips the rest through row_req -1, one with more computes these only).
    p.rows = static_cast<int32_t>(rows);
    p.max_kv_len = max_kv_len(s);
    if (r.q_nope.device().is_cuda()) {
      // The kernel reads the index arrays on its device.
      upload_indices(s, r.q_nope.device());
      const auto* base = s.dev_ints.data<const int32_t>();
      p.qo_indptr = base + s.dev_off[0];
      p.kv_indptr = base + s.dev_off[1];
      p.kv_lens = base + s.dev_off[2];
      p.kv_indices = base + s.dev_off[3];
      p.row_req = base + s.dev_off[4];
      if (s.live_indices.defined()) {
        // The caller's ids, checked on the device by the guard kernel the launcher runs first.
        p.kv_indices = s.live_indices.numel() > 0 ? s.live_indices.data<const int32_t>() : nullptr;
        p.guard_row_req = s.dev_ints.data<int32_t>() + s.dev_off[4];
        p.guard_pages = r.ckv.size(0);
      }
      if (s.block_plan) {
        // The plan on the device: its kernel fills the arrays above (and the NaN rows of the
        // requests it refuses) before the MLA kernels read them.
        kernels::BlockTablePlan bp = *s.block_plan;
        int32_t* w = s.dev_ints.data<int32_t>();
        bp.qo_indptr = w + s.dev_off[0];
        bp.kv_indptr = w + s.dev_off[1];
        bp.kv_lens = w + s.dev_off[2];
        bp.row_req = w + s.dev_off[4];
        bp.max_kv = w + s.dev_off[5];
        kernels::block_plan_set_output(bp, p, p.num_heads, p.dim_ckv);
#if FLASHINFER_WITH_CUDA
        // The MLA kernels' refusal, first: after the plan kernel it would leave NaN rows in out.
        if (const char* why = kernels::cuda::mla_attention_unsupported(p)) {
          FLASHINFER_FAIL(ErrorCode::kUnsupported, op, r.qn_arg, why);
        }
#endif
        api::launch_block_table_plan(bp, r.q_nope.device(), op);
        p.kv_indices = bp.block_tables;
        p.max_kv_dev = bp.max_kv;
        p.max_kv_len = s.block_max_kv;
      }
      if (graph_mode(s)) {
        // The splits for the longest request the page room allows; the chunk from the plan's
        // longest, on the device.
        p.max_kv_dev = base + s.dev_off[5];
        p.max_kv_len = static_cast<int32_t>(std::min<int64_t>(s.graph_indices_cap * s.page_size,
                                                              std::numeric_limits<int32_t>::max()));
      }
    }
    api::launch(kMlaKernels, p, r.q_nope.device(), op, r.qn_arg);
  }
  AttentionOutput res;
  res.out = out;
  if (r.return_lse) res.lse = lse;
  return res;
}

// run_mla with the plan's sm_scale replaced for this call only (a run's scale arguments).
AttentionOutput run_mla_with_sm_scale(detail::MlaWrapperState& s, const MlaRun& r, double sm) {
  const double planned = s.sm_scale;
  s.sm_scale = sm;
  try {
    AttentionOutput res = run_mla(s, r);
    s.sm_scale = planned;
    return res;
  } catch (...) {
    s.sm_scale = planned;
    throw;
  }
}

// The four 3-D inputs of a wrapper's run, checked and named (the caches' names differ by class).
MlaRun mla_run_inputs(const char* op, const Tensor& q_nope, const Tensor& q_pe, const Tensor& ckv,
                      const char* ckv_arg, const Tensor& kpe, const char* kpe_arg) {
  for (const auto& [t, arg] : {std::pair{&q_nope, "q_nope"}, std::pair{&q_pe, "q_pe"},
                               std::pair{&ckv, ckv_arg}, std::pair{&kpe, kpe_arg}}) {
    api::check_defined(*t, op, arg);
    api::check_dim(*t, {3}, op, arg);
  }
  MlaRun r;
  r.op = op;
  r.qn_arg = "q_nope";
  r.qp_arg = "q_pe";
  r.ckv_arg = ckv_arg;
  r.kpe_arg = kpe_arg;
  r.q_nope = q_nope;
  r.q_pe = q_pe;
  r.ckv = ckv;
  r.kpe = kpe;
  return r;
}

float finite_scale(std::optional<double> v, const char* op, const char* arg) {
  if (!v) return 1.0f;
  FLASHINFER_CHECK(std::isfinite(*v), op, arg, "must be finite, got ", *v);
  return static_cast<float>(*v);
}

// The optional parts of trtllm_batch_decode_with_kv_cache_mla (xqa's MLA name has none of them),
// checked against each other by the entry point.
struct BlockMlaExtras {
  // > 0: sparse MLA (DeepSeek's DSA). block_tables holds, for each query, top-k token slots
  // (page * page_size + offset) into the cache, -1 for none.
  int64_t sparse_top_k = 0;
  std::optional<Tensor> top_k_lens;      // sparse: each query's active prefix (the rope-less path)
  std::optional<Tensor> cum_seq_lens_q;  // ragged queries [total_q, H, D]
  std::optional<int64_t> max_q_len;
  // Decode context parallelism: this rank holds global positions cp_world * k + cp_rank.
  bool dcp = false;
  int64_t cp_world = 1, cp_rank = 0;
  std::optional<Tensor> causal_seqlens_kv_global;
  std::optional<Tensor> lse;
  bool return_lse = false;
  bool lse_base_e = false;  // natural-log LSE (cute-dsl's), else base 2 (trtllm-gen's)
};

// trtllm / xqa MLA decode: block tables to a planned state, then run_mla. Dense calls of uniform
// query counts on CUDA plan on the device; ragged, sparse and context-parallel calls plan on the
// host, each query of the last two its own request of the keys it sees (no causal mask left).
AttentionOutput block_mla_impl(const char* op, const Tensor& query, const Tensor& kv_cache,
                               const Tensor& workspace_buffer, int64_t qk_nope_head_dim,
                               int64_t kv_lora_rank, int64_t qk_rope_head_dim,
                               const Tensor& block_tables, const Tensor& seq_lens,
                               int64_t max_seq_len, const std::optional<Tensor>& out,
                               const ScalarOrTensor<double>& bmm1_scale,
                               const ScalarOrTensor<double>& bmm2_scale,
                               const BlockMlaExtras& x = {}) {
  api::check_defined(query, op, "query");
  api::check_defined(kv_cache, op, "kv_cache");
  api::check_defined(workspace_buffer, op, "workspace_buffer");
  api::check_defined(block_tables, op, "block_tables");
  api::check_defined(seq_lens, op, "seq_lens");
  const bool ragged = x.cum_seq_lens_q.has_value();
  const bool sparse = x.sparse_top_k > 0;
  api::check_dim(query, {ragged ? 3 : 4}, op, "query");
  api::check_dim(kv_cache, {3, 4}, op, "kv_cache");
  to_i32(qk_nope_head_dim, op, "qk_nope_head_dim");
  const int32_t dc = to_i32(kv_lora_rank, op, "kv_lora_rank");
  // Only the sparse calls take upstream's rope-less (512 / 0) layout.
  const int32_t dk = to_i32(qk_rope_head_dim, op, "qk_rope_head_dim", sparse ? 0 : 1);
  const int64_t D = query.size(-1);
  FLASHINFER_CHECK(D == int64_t{dc} + dk, op, "query", "last dim ", D,
                   " must be kv_lora_rank + qk_rope_head_dim = ", int64_t{dc} + dk);
  Tensor kv = kv_cache;
  if (kv.dim() == 4) {
    FLASHINFER_CHECK(kv.size(1) == 1, op, "kv_cache",
                     "a 4-D cache must be [pages, 1, page_size, D], got ",
                     shape_to_string(kv.shape()));
    kv = kv.select(1, 0);
  }
  FLASHINFER_CHECK(kv.size(2) == int64_t{dc} + dk, op, "kv_cache", "last dim ", kv.size(2),
                   " must be kv_lora_rank + qk_rope_head_dim = ", int64_t{dc} + dk);
  const DType qd = query.dtype();
  FLASHINFER_CHECK(qd == DType::kFloat16 || qd == DType::kBFloat16 || qd == DType::kFloat8E4M3FN,
                   op, "query", "dtype ", dtype_torch_name(qd),
                   " is not supported (float16, bfloat16, float8_e4m3fn)");
  const DType kd = kv.dtype();
  FLASHINFER_CHECK(kd == qd || kd == DType::kFloat8E4M3FN, op, "kv_cache", "dtype ",
                   dtype_torch_name(kd), " must be query's (", dtype_torch_name(qd),
                   ") or float8_e4m3fn");
  api::check_same_device(kv, query, op, "kv_cache", "query");
  api::check_same_device(block_tables, query, op, "block_tables", "query");
  api::check_same_device(seq_lens, query, op, "seq_lens", "query");
  // Sparse and context-parallel calls are upstream's Blackwell kernels' (trtllm-gen, cute-dsl):
  // the CPU reference here, so a replay on a GPU falls back to it.
  FLASHINFER_CHECK_CODE(!(sparse || x.dcp) || query.device().is_cpu(), ErrorCode::kUnsupported, op,
                        sparse ? "sparse_mla_top_k" : "enable_dcp",
                        sparse ? "sparse MLA runs on the CPU reference only here"
                               : "context parallelism runs on the CPU reference only here");
  // Requests, rows and each row's request: uniform q_len queries a request, or cum_seq_lens_q's.
  int64_t batch = 0, q_len = 0;
  const int64_t H = query.size(-2);
  to_i32(H, op, "query");
  std::vector<int32_t> qo_indptr{0};
  if (ragged) {
    api::check_index_tensor(seq_lens, op, "seq_lens");
    batch = seq_lens.size(0);
    qo_indptr = api::index_to_host(*x.cum_seq_lens_q, op, "cum_seq_lens_q", batch + 1);
    api::check_indptr(qo_indptr, op, "cum_seq_lens_q");
    FLASHINFER_CHECK(qo_indptr.back() == query.size(0), op, "cum_seq_lens_q", "ends at ",
                     qo_indptr.back(), " but query has ", query.size(0), " rows");
    for (int64_t b = 0; b < batch; ++b) {
      q_len = std::max<int64_t>(q_len, qo_indptr[b + 1] - qo_indptr[b]);
    }
    if (x.max_q_len) {
      FLASHINFER_CHECK(*x.max_q_len > 0 && *x.max_q_len <= query.size(0), op, "max_q_len",
                       "must be in [1, total_q=", query.size(0), "], got ", *x.max_q_len);
      FLASHINFER_CHECK(*x.max_q_len >= q_len, op, "max_q_len", "is ", *x.max_q_len,
                       " but a request has ", q_len, " queries");
    }
  } else {
    batch = query.size(0);
    q_len = query.size(1);
    for (int64_t b = 0; b < batch; ++b) qo_indptr.push_back(static_cast<int32_t>((b + 1) * q_len));
  }
  const int64_t rows = ragged ? query.size(0) : batch * q_len;
  if (sparse) {
    // One row of top-k slots a query: [rows, top_k] for ragged queries, else [batch, q_len, top_k].
    const Shape want = ragged ? Shape{rows, x.sparse_top_k} : Shape{batch, q_len, x.sparse_top_k};
    FLASHINFER_CHECK(block_tables.shape() == want, op, "block_tables",
                     "sparse MLA takes a table of top-k token slots ", shape_to_string(want),
                     ", got ", shape_to_string(block_tables.shape()));
  } else {
    api::check_dim(block_tables, {2}, op, "block_tables");
    FLASHINFER_CHECK(block_tables.size(0) == batch, op, "block_tables", "has ",
                     block_tables.size(0), " rows, query has batch ", batch);
  }
  FLASHINFER_CHECK(block_tables.dtype() == DType::kInt32, op, "block_tables",
                   "must be torch.int32, got ", dtype_torch_name(block_tables.dtype()));
  // On CUDA seq_lens and block_tables stay on the device: the plan kernel reads them
  // (kernels/block_table_plan.h) and nothing synchronizes, so a CUDA graph captures the call
  // (host copies of them keep the host plan).
  FLASHINFER_CHECK(max_seq_len >= 0, op, "max_seq_len", "must be >= 0, got ", max_seq_len);
  const bool device_plan = query.device().is_cuda() && seq_lens.device() == query.device() &&
                           block_tables.device() == query.device() && !ragged && !sparse && !x.dcp;
  const int64_t page_size = kv.size(1);
  FLASHINFER_CHECK(page_size >= 1, op, "kv_cache", "page_size must be >= 1");
  const int64_t max_blocks = block_tables.size(-1);
  std::vector<int32_t> lens;
  std::vector<double> table;
  kernels::BlockTablePlan plan_in;  // device plans: their inputs
  Tensor table_dev;                 // and the table they read
  if (device_plan) {
    plan_in = api::block_table_plan_inputs(seq_lens, block_tables, batch, q_len, batch, max_seq_len,
                                           page_size, kv.size(0), op, table_dev);
  } else {
    lens = api::index_to_host(seq_lens, op, "seq_lens", batch);
    table = block_tables.numel() > 0 ? block_tables.to(Device::cpu()).to_double_vector()
                                     : std::vector<double>{};
  }
  detail::MlaWrapperState s;
  s.device = query.device();
  s.batch = static_cast<int32_t>(batch);
  s.num_heads = static_cast<int32_t>(H);
  s.dim_ckv = dc;
  s.dim_kpe = dk;
  s.page_size = static_cast<int32_t>(page_size);
  // Several queries of a request are its last tokens, causal among themselves (MTP).
  s.causal = ragged || q_len > 1;
  s.q_dtype = qd;
  s.kv_dtype = kd;
  s.kv_indptr.push_back(0);
  if (device_plan) {
    s.qo_indptr = qo_indptr;
    s.block_plan = plan_in;
    s.block_plan_table = table_dev;
    s.block_max_kv = static_cast<int32_t>(kernels::block_plan_worst_len(plan_in));
    // dev_ints as run_mla reads it: qo_indptr, kv_indptr, kv_lens, row_req, the longest length,
    // all written by the plan kernel (no kv_indices: the table is read in place).
    s.dev_off[0] = 0;
    s.dev_off[1] = batch + 1;
    s.dev_off[2] = 2 * (batch + 1);
    s.dev_off[4] = s.dev_off[2] + batch;
    s.dev_off[5] = s.dev_off[4] + rows;
    s.dev_off[3] = s.dev_off[5] + 1;
    api::BlockPlanScratch mem = api::block_plan_scratch(
        query.device(), static_cast<std::size_t>(4 * (s.dev_off[3] + 1)), op);
    s.block_plan_scratch = std::move(mem.lease);
    s.dev_ints =
        Tensor::from_blob(mem.data, {s.dev_off[3] + 1}, {1}, DType::kInt32, query.device());
    s.dev_ints_current = true;
  }
  // Request b's first `blocks` page ids, checked.
  auto pages_of = [&](int64_t b, int64_t blocks) {
    FLASHINFER_CHECK(blocks <= max_blocks, op, "block_tables", "request ", b, " needs ", blocks,
                     " blocks but the table has ", max_blocks, " columns");
    std::vector<int32_t> ids;
    for (int64_t j = 0; j < blocks; ++j) {
      const auto id = static_cast<int64_t>(table[static_cast<std::size_t>(b * max_blocks + j)]);
      FLASHINFER_CHECK(id >= 0 && id < kv.size(0), op, "block_tables", "entry [", b, ", ", j, "] (",
                       id, ") is outside [0, ", kv.size(0), ")");
      ids.push_back(static_cast<int32_t>(id));
      s.max_page_id = std::max(s.max_page_id, id);
    }
    return ids;
  };
  // A query row as a request of its own: its keys, no mask.
  auto add_row_request = [&](const std::vector<int32_t>& ids, int64_t len) {
    FLASHINFER_CHECK(s.kv_indices.size() + ids.size() <= std::numeric_limits<int32_t>::max(), op,
                     "block_tables", "the call's keys take more than 2^31 - 1 page ids");
    s.kv_indices.insert(s.kv_indices.end(), ids.begin(), ids.end());
    s.kv_indptr.push_back(static_cast<int32_t>(s.kv_indices.size()));
    s.kv_lens.push_back(static_cast<int32_t>(len));
    s.qo_indptr.push_back(static_cast<int32_t>(s.qo_indptr.size()));
  };
  std::vector<int32_t> top_k_lens, global_lens;
  if (x.top_k_lens)
    top_k_lens = api::index_to_host(*x.top_k_lens, op, "sparse_mla_top_k_lens", rows);
  if (x.dcp) {
    global_lens =
        api::index_to_host(*x.causal_seqlens_kv_global, op, "causal_seqlens_kv_global", batch);
  }
  if (!device_plan && (sparse || x.dcp)) {
    s.qo_indptr = {0};
    s.batch = static_cast<int32_t>(rows);
    s.causal = false;
  } else if (!device_plan) {
    s.qo_indptr = qo_indptr;
  }
  const int64_t num_slots = kv.size(0) * page_size;
  for (int64_t b = 0; b < batch && !device_plan; ++b) {
    const int64_t len = lens[b], first = qo_indptr[b], L = qo_indptr[b + 1] - qo_indptr[b];
    FLASHINFER_CHECK(len >= 0, op, "seq_lens", "element ", b, " (", len, ") is negative");
    if (sparse) {
      // Query t of L sees the first min(top_k, len - (L - 1 - t)) entries of its row (seq_lens
      // counts the row's leading entries, causal across a request's queries), or the first
      // sparse_mla_top_k_lens of them; -1 entries none.
      for (int64_t t = 0; t < L; ++t) {
        const int64_t row = first + t;
        int64_t count = x.top_k_lens ? top_k_lens[row] : len - (L - 1 - t);
        count = std::clamp<int64_t>(count, 0, x.sparse_top_k);
        std::vector<int32_t> slots;
        for (int64_t j = 0; j < count; ++j) {
          const auto id =
              static_cast<int64_t>(table[static_cast<std::size_t>(row * x.sparse_top_k + j)]);
          if (id == -1) continue;
          FLASHINFER_CHECK(id >= 0 && id < num_slots, op, "block_tables", "query ", row, "'s slot ",
                           j, " (", id, ") is outside [0, ", num_slots, ") (-1 marks none)");
          slots.push_back(static_cast<int32_t>(id));
          s.max_page_id = std::max(s.max_page_id, id);
        }
        add_row_request(slots, static_cast<int64_t>(slots.size()));
      }
      continue;
    }
    FLASHINFER_CHECK(len <= max_seq_len, op, "seq_lens", "element ", b, " (", len,
                     ") is outside [0, max_seq_len=", max_seq_len, "]");
    const std::vector<int32_t> ids = pages_of(b, (len + page_size - 1) / page_size);
    if (x.dcp) {
      // Local key k is global position cp_world * k + cp_rank; query t of L sees global
      // positions up to causal_seqlens_kv_global[b] - L + t, a prefix of the local keys.
      for (int64_t t = 0; t < L; ++t) {
        const int64_t bound = int64_t{global_lens[b]} - L + t - x.cp_rank;
        const int64_t count = bound < 0 ? 0 : std::min(len, bound / x.cp_world + 1);
        const auto blocks = static_cast<std::ptrdiff_t>((count + page_size - 1) / page_size);
        add_row_request(std::vector<int32_t>(ids.begin(), ids.begin() + blocks), count);
      }
      continue;
    }
    FLASHINFER_CHECK(L <= 1 || len >= L, op, "seq_lens", "request ", b, " has ", len,
                     " tokens, fewer than its ", L, " queries");
    FLASHINFER_CHECK(s.kv_indices.size() + ids.size() <= std::numeric_limits<int32_t>::max(), op,
                     "block_tables", "the call's keys take more than 2^31 - 1 page ids");
    s.kv_indices.insert(s.kv_indices.end(), ids.begin(), ids.end());
    s.kv_indptr.push_back(static_cast<int32_t>(s.kv_indices.size()));
    s.kv_lens.push_back(static_cast<int32_t>(len));
  }
  MlaRun r;
  const std::optional<Device> scale_dev =
      device_plan ? std::optional<Device>(query.device()) : std::nullopt;
  s.sm_scale = api::fused_scale_value(bmm1_scale, op, "bmm1_scale", scale_dev, &r.sm_scale_dev);
  r.op = op;
  r.qn_arg = r.qp_arg = "query";
  r.ckv_arg = r.kpe_arg = "kv_cache";
  const Tensor q3 = ragged ? query : query.view({rows, H, D});
  r.q_nope = q3.slice(2, 0, dc);
  r.q_pe = q3.slice(2, dc, D);
  // Sparse rows address single tokens: the cache as pages of one token.
  const Tensor kv_run = sparse ? kv.reshape({num_slots, 1, D}) : kv;
  if (sparse) s.page_size = 1;
  r.ckv = kv_run.slice(2, 0, dc);
  r.kpe = kv_run.slice(2, dc, D);
  r.o_dtype = qd == DType::kFloat8E4M3FN ? DType::kBFloat16 : qd;
  r.out_scale = static_cast<float>(
      api::fused_scale_value(bmm2_scale, op, "bmm2_scale", scale_dev, &r.out_scale_dev));
  const Shape out_shape = ragged ? Shape{rows, H, dc} : Shape{batch, q_len, H, dc};
  std::optional<Tensor> out3;
  if (out) {
    api::check_defined(*out, op, "out");
    api::check_shape_eq(*out, out_shape, op, "out");
    out3 = out->view({rows, H, dc});
  }
  r.out = out3;
  // The LSE [rows, H], or [batch, q_len, H] (upstream returns the caller's shape). Without
  // return_lse upstream 0.7.4 drops a given lse buffer (`lse = None`): it is left untouched.
  if (x.lse && x.return_lse) {
    api::check_defined(*x.lse, op, "lse");
    if (!ragged && x.lse->dim() == 3) {
      api::check_shape_eq(*x.lse, Shape{batch, q_len, H}, op, "lse");
      FLASHINFER_CHECK(
          x.lse->is_contiguous(), op, "lse",
          "a [batch, q_len, H] buffer must be contiguous (it is written as [rows, H])");
      r.lse = x.lse->view({rows, H});
    } else {
      r.lse = *x.lse;
    }
  }
  r.return_lse = x.return_lse;
  r.lse_base_e = x.lse_base_e;
  AttentionOutput res = run_mla(s, r);
  AttentionOutput ret;
  ret.out = out ? *out : res.out.view(out_shape);
  if (x.return_lse) ret.lse = x.lse ? *x.lse : res.lse;
  return ret;
}

}  // namespace

void append_paged_mla_kv_cache(const Tensor& append_ckv, const Tensor& append_kpe,
                               const Tensor& batch_indices, const Tensor& positions,
                               const Tensor& ckv_cache, const Tensor& kpe_cache,
                               const Tensor& kv_indices, const Tensor& kv_indptr,
                               const Tensor& kv_last_page_len) {
  call_op<&append_paged_mla_kv_cache>(
      [&] {
        // Upstream converts the index arrays with .int().
        using api::int32_index;
        append_mla_impl(append_ckv, append_kpe, int32_index(batch_indices), int32_index(positions),
                        ckv_cache, kpe_cache, int32_index(kv_indices), int32_index(kv_indptr),
                        int32_index(kv_last_page_len));
      },
      append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indices, kv_indptr,
      kv_last_page_len);
}

void concat_mla_k(const Tensor& k, const Tensor& k_nope, const Tensor& k_rope,
                  const std::string& backend) {
  call_op<&concat_mla_k>(
      [&] {
        // Upstream 0.7.4's two backends make the same copy ("cake": SM100-class GPUs and
        // DeepSeek's shapes only, which a replay elsewhere does not need to keep).
        FLASHINFER_CHECK(backend == "default" || backend == "cake", "concat_mla_k", "backend",
                         "unsupported concat_mla_k backend: '", backend, "'");
        concat_mla_k_impl(k, k_nope, k_rope);
      },
      k, k_nope, k_rope, backend);
}

// ---- BatchMLAPagedAttentionWrapper ------------------------------------------------------

BatchMLAPagedAttentionWrapper::BatchMLAPagedAttentionWrapper(
    Tensor float_workspace_buffer, bool use_cuda_graph, std::optional<Tensor> qo_indptr,
    std::optional<Tensor> kv_indptr, std::optional<Tensor> kv_indices,
    std::optional<Tensor> kv_len_arr, std::string backend)
    : s_(std::make_unique<detail::MlaWrapperState>()) {
  call_init<MlaInit>(
      [&] {
        const char* op = "BatchMLAPagedAttentionWrapper.__init__";
        api::check_defined(float_workspace_buffer, op, "float_workspace_buffer");
        // Upstream 0.7.4's closed set. Each names one of its kernels; every one computes this
        // attention, which this library runs with its own kernels.
        static constexpr const char* kBackends[] = {"auto",
                                                    "autotune",
                                                    "cute-dsl",
                                                    "cute-dsl-modular",
                                                    "cute-dsl-monolithic",
                                                    "cute-dsl-rubin-mtp",
                                                    "cutile",
                                                    "cutlass",
                                                    "fa2",
                                                    "fa3",
                                                    "trtllm-gen",
                                                    "xqa"};
        FLASHINFER_CHECK(
            std::find(std::begin(kBackends), std::end(kBackends), backend) != std::end(kBackends),
            op, "backend",
            "backend must be one of 'auto', 'autotune', 'cute-dsl', "
            "'cute-dsl-modular', 'cute-dsl-monolithic', 'cute-dsl-rubin-mtp', "
            "'cutile', 'cutlass', 'fa2', 'fa3', 'trtllm-gen', 'xqa', got '",
            backend, "'.");
        // "fa3" is upstream's Hopper kernel (built for sm90a only): the same attention, which
        // this library runs with its own kernels (the CPU reference, or on CUDA the tensor-core
        // MLA kernel where the call fits); on another GPU it is refused as upstream's cannot run.
        const Device dev = float_workspace_buffer.device();
        FLASHINFER_CHECK_CODE(
            backend != "fa3" || !dev.is_cuda() || api::compute_capability(dev) / 10 == 9,
            ErrorCode::kUnsupported, op, "backend",
            "\"fa3\" runs on sm90 only (upstream builds it for sm90a); this device "
            "is sm",
            api::compute_capability(dev));
        s_->float_workspace = float_workspace_buffer;
        s_->device = float_workspace_buffer.device();
        s_->use_cuda_graph = use_cuda_graph;
        s_->backend = backend;
        // Under use_cuda_graph upstream's plan copies into these buffers; here the page-index
        // buffer's size bounds every plan's pages (plan_upload), the others are not needed.
        if (use_cuda_graph && kv_indices && kv_indices->defined()) {
          s_->graph_indices_cap = kv_indices->numel();
        }
        // The buffers plan fills and run() reads the page ids from (live_page_ids), where the
        // kernels can read them.
        auto keep = [&](const std::optional<Tensor>& t, Tensor& dst) {
          if (use_cuda_graph && t && api::graph_index_buffer_usable(*t, s_->device)) dst = *t;
        };
        keep(kv_indices, s_->graph_indices_buf);
        keep(qo_indptr, s_->graph_qo_buf);
        keep(kv_indptr, s_->graph_kv_indptr_buf);
        keep(kv_len_arr, s_->graph_kv_len_buf);
      },
      *this, float_workspace_buffer, use_cuda_graph, qo_indptr, kv_indptr, kv_indices, kv_len_arr,
      backend);
}

BatchMLAPagedAttentionWrapper::~BatchMLAPagedAttentionWrapper() = default;

namespace {

// The python repr of a string, as upstream's messages print it.
std::string py_str(const std::string& v) { return "'" + v + "'"; }

// plan's flat dense form (upstream 0.7.4's _DenseMetadata, its checks and texts) read as the
// CSR plan: request b's pages are the first ceil(seq_lens[b] / page_size) ids of its row of
// block_tables, copied (upstream's fa2 / fa3 plan concatenates them). Host int32 tensors.
struct DenseAsCsr {
  Tensor qo_indptr, kv_indptr, kv_indices, kv_len_arr;
};
DenseAsCsr dense_as_csr(const Tensor& cu, const Tensor& bt, const Tensor& seq_lens,
                        std::optional<int64_t> max_q_len, int64_t page_size, Device wrapper,
                        const char* op) {
  const auto tensor_checks = [&](const Tensor& t, const char* name, int64_t rank) {
    api::check_defined(t, op, name);
    std::string shape = "(";  // python's tuple
    for (int64_t i = 0; i < t.dim(); ++i) shape += (i ? ", " : "") + std::to_string(t.size(i));
    shape += t.dim() == 1 ? ",)" : ")";
    FLASHINFER_CHECK(t.dim() == rank, op, name, name, " metadata must be rank-", rank,
                     ", got shape ", shape, ".");
    FLASHINFER_CHECK(t.dtype() == DType::kInt32, op, name, name,
                     " metadata must have dtype torch.int32, got ", dtype_torch_name(t.dtype()),
                     ".");
    FLASHINFER_CHECK(t.device().is_cpu() || t.device() == wrapper, op, name, name,
                     " metadata must be on CPU or wrapper device ", wrapper.str(), ", got ",
                     t.device().str(), ".");
    FLASHINFER_CHECK(t.is_contiguous(), op, name, name, " metadata must be contiguous.");
  };
  tensor_checks(cu, "cum_seq_lens_q", 1);
  tensor_checks(bt, "block_tables", 2);
  tensor_checks(seq_lens, "seq_lens", 1);
  const std::vector<int32_t> qo = api::index_to_host(cu, op, "cum_seq_lens_q");
  FLASHINFER_CHECK(!qo.empty(), op, "cum_seq_lens_q",
                   "cum_seq_lens_q metadata must contain at least one element.");
  FLASHINFER_CHECK(qo[0] == 0, op, "cum_seq_lens_q", "cum_seq_lens_q metadata must start at zero.");
  for (std::size_t i = 1; i < qo.size(); ++i) {
    FLASHINFER_CHECK(qo[i] >= qo[i - 1], op, "cum_seq_lens_q",
                     "cum_seq_lens_q metadata must be nondecreasing.");
  }
  const auto B = static_cast<int64_t>(qo.size()) - 1;
  FLASHINFER_CHECK(bt.size(0) == B && seq_lens.size(0) == B, op, "block_tables",
                   "dense metadata batch dimensions must agree: cum_seq_lens_q describes ", B,
                   ", block_tables has ", bt.size(0), ", and seq_lens has ", seq_lens.size(0), ".");
  const std::vector<int32_t> lens = api::index_to_host(seq_lens, op, "seq_lens");
  const Tensor table = bt.to(Device::cpu()).contiguous();
  const auto* ids = table.data<int32_t>();
  const int64_t width = bt.size(1);
  std::vector<double> kv_indptr{0.0}, kv_indices;
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    FLASHINFER_CHECK(lens[b] >= 0, op, "seq_lens", "seq_lens metadata must be nonnegative.");
    const int64_t pages = (lens[b] + page_size - 1) / page_size;
    FLASHINFER_CHECK(pages <= width, op, "block_tables",
                     "block_tables metadata width is smaller than the live page count implied by "
                     "seq_lens and page_size.");
    for (int64_t j = 0; j < pages; ++j) kv_indices.push_back(ids[b * width + j]);
    kv_indptr.push_back(static_cast<double>(kv_indices.size()));
    longest = std::max<int64_t>(longest, qo[b + 1] - qo[b]);
  }
  if (max_q_len) {
    FLASHINFER_CHECK(*max_q_len >= longest, op, "max_q_len", "max_q_len metadata must be at least ",
                     longest, ", got ", *max_q_len, ".");
  }
  DenseAsCsr r;
  r.qo_indptr = cu.to(Device::cpu());
  r.kv_indptr = Tensor::from_vector(kv_indptr, {B + 1}, DType::kInt32);
  r.kv_indices =
      Tensor::from_vector(kv_indices, {static_cast<int64_t>(kv_indices.size())}, DType::kInt32);
  r.kv_len_arr = seq_lens.to(Device::cpu());
  return r;
}

}  // namespace

void BatchMLAPagedAttentionWrapper::plan(
    std::optional<Tensor> qo_indptr_arg, std::optional<Tensor> kv_indptr_arg,
    std::optional<Tensor> kv_indices_arg, std::optional<Tensor> kv_len_arr_arg,
    std::optional<int64_t> num_heads_arg, std::optional<int64_t> head_dim_ckv_arg,
    std::optional<int64_t> head_dim_kpe_arg, std::optional<int64_t> page_size_arg,
    std::optional<bool> causal_arg, std::optional<double> sm_scale_arg,
    std::optional<DType> q_data_type_arg, std::optional<DType> kv_data_type_arg, bool use_profiler,
    const MlaPlanOptions& options) {
  call_op<&BatchMLAPagedAttentionWrapper::plan>(
      [&] {
        const char* op = "BatchMLAPagedAttentionWrapper.plan";
        detail::MlaWrapperState& s = *s_;
        const MlaPlanOptions& o = options;
        // Upstream 0.7.4's forms and their checks, in its order.
        const bool csr_any = qo_indptr_arg || kv_indptr_arg || kv_indices_arg || kv_len_arr_arg;
        const bool dense_fields = o.cum_seq_lens_q || o.block_tables || o.seq_lens;
        const bool dense_any = dense_fields || o.max_q_len;
        if (!o.metadata.is_none()) {
          FLASHINFER_CHECK(!(csr_any || dense_any), op, "metadata",
                           "Both metadata object and flat metadata arguments were provided; only "
                           "one representation may be supplied.");
          FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "metadata",
                          "an MLAPlanMetadata object is not supported here (upstream's recorder "
                          "keeps only its repr, so no recording of such a plan replays, upstream's "
                          "own replay included): pass its CSR or dense fields as plan's flat "
                          "arguments");
        }
        FLASHINFER_CHECK(!(csr_any && dense_any), op, "cum_seq_lens_q",
                         "flat CSR and dense metadata forms cannot be mixed.");
        FLASHINFER_CHECK(csr_any || dense_any, op, "qo_indptr",
                         "plan() requires metadata or flat metadata arguments.");
        std::string missing;
        const char* first_missing = nullptr;
        for (const auto& [given, name] : {std::pair{num_heads_arg.has_value(), "num_heads"},
                                          {head_dim_ckv_arg.has_value(), "head_dim_ckv"},
                                          {head_dim_kpe_arg.has_value(), "head_dim_kpe"},
                                          {page_size_arg.has_value(), "page_size"},
                                          {causal_arg.has_value(), "causal"},
                                          {sm_scale_arg.has_value(), "sm_scale"},
                                          {q_data_type_arg.has_value(), "q_data_type"},
                                          {kv_data_type_arg.has_value(), "kv_data_type"}}) {
          if (given) continue;
          missing += (missing.empty() ? "" : ", ") + std::string(name);
          if (!first_missing) first_missing = name;
        }
        FLASHINFER_CHECK(missing.empty(), op, first_missing ? first_missing : "",
                         "plan() missing required arguments: ", missing);
        const int64_t num_heads = *num_heads_arg, head_dim_ckv = *head_dim_ckv_arg,
                      head_dim_kpe = *head_dim_kpe_arg, page_size = *page_size_arg;
        const bool causal = *causal_arg;
        const double sm_scale = *sm_scale_arg;
        const DType q_data_type = *q_data_type_arg, kv_data_type = *kv_data_type_arg;
        FLASHINFER_CHECK(page_size > 0, op, "page_size", "page_size must be a positive int, got ",
                         page_size, ".");
        FLASHINFER_CHECK(num_heads > 0, op, "num_heads",
                         "num_heads and page_size must be positive.");
        FLASHINFER_CHECK(std::isfinite(sm_scale), op, "sm_scale", "sm_scale must be finite.");
        FLASHINFER_CHECK(head_dim_ckv > 0, op, "head_dim_ckv", "head_dim_ckv must be > 0, got ",
                         head_dim_ckv, ".");
        FLASHINFER_CHECK(head_dim_kpe >= 0, op, "head_dim_kpe", "head_dim_kpe must be >= 0, got ",
                         head_dim_kpe, ".");
        const auto one_of = [&](const std::string& v, std::initializer_list<const char*> ok,
                                const char* arg) {
          for (const char* x : ok) {
            if (v == x) return;
          }
          FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, arg, "unsupported ", arg, " ", py_str(v),
                          ".");
        };
        if (o.query_layout) one_of(*o.query_layout, {"packed", "split"}, "query_layout");
        if (o.kv_cache_layout) one_of(*o.kv_cache_layout, {"packed", "split"}, "kv_cache_layout");
        one_of(o.lse_mode, {"none", "base2", "basee"}, "lse_mode");
        one_of(o.output_scale, {"none", "per-tensor"}, "output_scale");
        one_of(o.scale_mode, {"default", "kv-per-tensor", "bmm-scalar", "bmm-tensor"},
               "scale_mode");
        // What no kernel here computes (upstream: a backend's capability refusal).
        for (const auto& [on, arg, what] :
             {std::tuple{o.output_scale == "per-tensor", "output_scale",
                         "an FP8 output with a per-tensor scale"},
              {o.skip_softmax, "skip_softmax", "skip-softmax attention"},
              {o.use_sinks, "use_sinks", "attention sinks"}}) {
          FLASHINFER_CHECK_CODE(!on, ErrorCode::kUnsupported, op, arg,
                                "No supported planned MLA backend: ", what,
                                " is not implemented here");
        }
        const DType out_dtype = o.output_dtype.value_or(q_data_type);
        FLASHINFER_CHECK_CODE(out_dtype == q_data_type, ErrorCode::kUnsupported, op, "output_dtype",
                              "No supported planned MLA backend: fa2 backend "
                              "output_dtype must match q_data_type, got ",
                              dtype_torch_name(out_dtype), " and ", dtype_torch_name(q_data_type),
                              ".");
        // An fp8 cache planned "default" takes its scales per tensor (upstream's upgrade for
        // the callers that pass ckv_scale / kpe_scale at run).
        std::string scale_mode = o.scale_mode;
        const bool fp8_kv = dtype_is_fp8(kv_data_type);
        if (fp8_kv && scale_mode == "default" && q_data_type != DType::kFloat8E4M3FN) {
          scale_mode = "kv-per-tensor";
        }
        FLASHINFER_CHECK_CODE(fp8_kv || scale_mode != "kv-per-tensor", ErrorCode::kUnsupported, op,
                              "scale_mode",
                              "No supported planned MLA backend: non-FP8 MLA plans "
                              "require scale_mode='default'.");
        // The tensors of the form given.
        Tensor qo_indptr, kv_indptr, kv_indices, kv_len_arr;
        if (dense_any) {
          FLASHINFER_CHECK(dense_fields, op, "max_q_len",
                           "max_q_len metadata requires the complete dense metadata form, "
                           "including cum_seq_lens_q, block_tables, and seq_lens.");
          std::string absent;
          for (const auto& [t, name] : {std::pair{&o.cum_seq_lens_q, "cum_seq_lens_q"},
                                        {&o.block_tables, "block_tables"},
                                        {&o.seq_lens, "seq_lens"}}) {
            if (!*t) absent += (absent.empty() ? "" : ", ") + std::string(name);
          }
          FLASHINFER_CHECK(absent.empty(), op, "cum_seq_lens_q",
                           "dense metadata form is partial; missing required fields: ", absent,
                           ".");
          const DenseAsCsr d = dense_as_csr(*o.cum_seq_lens_q, *o.block_tables, *o.seq_lens,
                                            o.max_q_len, page_size, s.device, op);
          qo_indptr = d.qo_indptr, kv_indptr = d.kv_indptr, kv_indices = d.kv_indices;
          kv_len_arr = d.kv_len_arr;
        } else {
          std::string absent;
          for (const auto& [t, name] : {std::pair{&qo_indptr_arg, "qo_indptr"},
                                        {&kv_indptr_arg, "kv_indptr"},
                                        {&kv_indices_arg, "kv_indices"},
                                        {&kv_len_arr_arg, "kv_len_arr"}}) {
            if (!*t) absent += (absent.empty() ? "" : ", ") + std::string(name);
          }
          FLASHINFER_CHECK(absent.empty(), op, "qo_indptr",
                           "CSR metadata form is partial; missing required fields: ", absent, ".");
          qo_indptr = *qo_indptr_arg, kv_indptr = *kv_indptr_arg, kv_indices = *kv_indices_arg;
          kv_len_arr = *kv_len_arr_arg;
        }
        s.planned = false;
        FLASHINFER_CHECK_CODE(!use_profiler, ErrorCode::kUnsupported, op, "use_profiler",
                              "the profiler is not supported");
        s.lse_mode = o.lse_mode;
        s.scale_mode = scale_mode;
        s.out_dtype = out_dtype;
        s.legacy_csr = csr_any;
        s.num_heads = to_i32(num_heads, op, "num_heads");
        s.dim_ckv = to_i32(head_dim_ckv, op, "head_dim_ckv");
        // head_dim_kpe 0: a NoPE model's MLA (vLLM's SM90 sparse backend; upstream's fa3 kernel
        // takes it since its NoPE change): scores from the latent alone, on every backend.
        s.dim_kpe = to_i32(head_dim_kpe, op, "head_dim_kpe", 0);
        s.page_size = to_i32(page_size, op, "page_size");
        FLASHINFER_CHECK(std::isfinite(sm_scale), op, "sm_scale", "must be finite, got ", sm_scale);
        api::check_q_dtype(q_data_type, op, "q_data_type");
        api::check_kv_dtype(kv_data_type, q_data_type, op, "kv_data_type");
        s.q_dtype = q_data_type;
        s.kv_dtype = kv_data_type;
        s.causal = causal;
        s.sm_scale = sm_scale;
        s.qo_indptr = api::index_to_host(qo_indptr, op, "qo_indptr");
        api::check_indptr(s.qo_indptr, op, "qo_indptr");
        const auto batch = static_cast<int64_t>(s.qo_indptr.size()) - 1;
        s.kv_indptr = api::index_to_host(kv_indptr, op, "kv_indptr", batch + 1);
        api::check_indptr(s.kv_indptr, op, "kv_indptr");
        api::check_index_tensor(kv_indices, op, "kv_indices");
        FLASHINFER_CHECK(kv_indices.numel() >= s.kv_indptr.back(), op, "kv_indices", "has ",
                         kv_indices.numel(), " elements but kv_indptr ends at ",
                         s.kv_indptr.back());

        s.kv_lens = api::index_to_host(kv_len_arr, op, "kv_len_arr", batch);
        for (int64_t b = 0; b < batch; ++b) {
          const int64_t pages = s.kv_indptr[b + 1] - s.kv_indptr[b];
          FLASHINFER_CHECK(s.kv_lens[b] >= 0 && s.kv_lens[b] <= pages * page_size, op, "kv_len_arr",
                           "element ", b, " (", s.kv_lens[b], ") is outside [0, ", pages,
                           " pages * page_size ", page_size, "]");
          const int64_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
          FLASHINFER_CHECK(!causal || qo_len <= s.kv_lens[b], op, "kv_len_arr", "request ", b,
                           " has ", qo_len, " queries but only ", s.kv_lens[b],
                           " tokens (causal queries are the request's last tokens)");
        }
        // kv_indices may live elsewhere: upstream reads the others on the host and moves
        // kv_indices to the device (vLLM's SM90 sparse backend passes host indptrs and lengths
        // with its device buffer of page ids).
        for (const auto& [t, arg] :
             {std::pair{&kv_indptr, "kv_indptr"}, std::pair{&kv_len_arr, "kv_len_arr"}}) {
          api::check_same_device(*t, qo_indptr, op, arg, "qo_indptr");
        }
        s.batch = static_cast<int32_t>(batch);
        // The ids: read when the call runs (upstream's kernels read the tensor then), or copied
        // here.
        s.live_indices = live_page_ids(s, kv_indices, s.kv_indptr.back(), op);
        s.kv_indices.clear();
        s.max_page_id = -1;
        if (!s.live_indices.defined()) {
          const std::vector<int32_t> idx = api::index_to_host(kv_indices, op, "kv_indices");
          s.kv_indices.assign(idx.begin(), idx.begin() + s.kv_indptr.back());
          for (std::size_t i = 0; i < s.kv_indices.size(); ++i) {
            FLASHINFER_CHECK(s.kv_indices[i] >= 0, op, "kv_indices", "page id ", s.kv_indices[i],
                             " at ", i, " is negative");
            s.max_page_id = std::max<int64_t>(s.max_page_id, s.kv_indices[i]);
          }
        }
        copy_plan_arrays(s, qo_indptr, kv_indptr, kv_len_arr, op, /*copy=*/false);
        s.dev_ints_current = false;
        plan_upload(s, op, "qo_indptr", "kv_indices");
        copy_plan_page_ids(s, kv_indices);
        copy_plan_arrays(s, qo_indptr, kv_indptr, kv_len_arr, op, /*copy=*/true);
        s.planned = true;
      },
      *this, qo_indptr_arg, kv_indptr_arg, kv_indices_arg, kv_len_arr_arg, num_heads_arg,
      head_dim_ckv_arg, head_dim_kpe_arg, page_size_arg, causal_arg, sm_scale_arg, q_data_type_arg,
      kv_data_type_arg, use_profiler, options);
}

namespace {

// ckv_scale_arr (upstream's checks, flashinfer/mla: fp32, ckv_cache.shape[:-1] + (head_dim_ckv //
// 128,), on ckv_cache's device, contiguous, an fp8 e4m3 cache): per-token, per-128-channel scales
// that replace ckv_scale (upstream's kernels dequantize with the array alone; SGLang's DSA backend
// passes ckv_scale 1.0 beside it, so 1.0 is taken and another value refused).
Tensor check_ckv_scale_arr(const detail::MlaWrapperState& s, const Tensor& arr,
                           const Tensor& ckv_cache, MlaRun& r) {
  const char* op = r.op;
  api::check_defined(arr, op, "ckv_scale_arr");
  FLASHINFER_CHECK(s.kv_dtype == DType::kFloat8E4M3FN, op, "ckv_scale_arr",
                   "is only valid with an fp8 e4m3 cache (kv_data_type torch.float8_e4m3fn); "
                   "planned ",
                   dtype_torch_name(s.kv_dtype));
  FLASHINFER_CHECK(s.dim_ckv % 128 == 0, op, "ckv_scale_arr",
                   "needs head_dim_ckv a multiple of 128 (one scale per 128 channels), got ",
                   s.dim_ckv);
  FLASHINFER_CHECK(arr.dtype() == DType::kFloat32, op, "ckv_scale_arr",
                   "must be torch.float32, got ", dtype_torch_name(arr.dtype()));
  Shape want(ckv_cache.shape().begin(), ckv_cache.shape().end() - 1);
  want.push_back(s.dim_ckv / 128);
  api::check_shape_eq(arr, want, op, "ckv_scale_arr");
  api::check_same_device(arr, ckv_cache, op, "ckv_scale_arr", "ckv_cache");
  FLASHINFER_CHECK(arr.is_contiguous(), op, "ckv_scale_arr", "must be contiguous");
  FLASHINFER_CHECK(r.ckv_scale == 1.0f, op, "ckv_scale",
                   "must be None or 1.0 with ckv_scale_arr (the array holds the ckv scales), got ",
                   r.ckv_scale);
  return arr;
}

}  // namespace

namespace {

// run's query= / kv_cache= (upstream 0.7.4's structural inputs): one tensor (the two parts
// joined on the last axis), an exact 2-tuple of them, or a dual value whose split member is used.
// `what` names it in messages ("query", "KV cache"); `width` is the first part's planned width.
std::pair<Tensor, Tensor> structural_split(const Value& v, const char* what, const char* arg,
                                           int64_t width, int64_t total, DType planned,
                                           const char* planned_name, const char* op) {
  const auto leaf = [&](const Value& x) -> Tensor {
    FLASHINFER_CHECK(x.is_tensor(), op, arg, what,
                     " structural MLA input leaves must be torch.Tensor.");
    return x.as_tensor();
  };
  const auto packed = [&](const Tensor& t) -> std::pair<Tensor, Tensor> {
    FLASHINFER_CHECK(t.dim() == 3, op, arg, "packed ", what, " must have rank 3.");
    FLASHINFER_CHECK(t.size(2) == total, op, arg, "packed ", what,
                     " last dimension does not match planned split widths.");
    FLASHINFER_CHECK(t.dtype() == planned, op, arg, what, ".dtype=", dtype_torch_name(t.dtype()),
                     " does not match the planned ", planned_name, "=", dtype_torch_name(planned),
                     ".");
    return {t.slice(2, 0, width), t.slice(2, width, total)};
  };
  if (v.is_tensor()) return packed(v.as_tensor());
  FLASHINFER_CHECK(v.kind() == Value::Kind::kTuple, op, arg, what,
                   " structural MLA input must be a tensor or exact 2-tuple.");
  const auto& items = v.items();
  FLASHINFER_CHECK(items.size() == 2, op, arg, what,
                   " structural MLA input tuples must have length 2.");
  const auto is_pair = [](const Value& x) {
    return x.kind() == Value::Kind::kTuple && x.items().size() == 2 && x.items()[0].is_tensor() &&
           x.items()[1].is_tensor();
  };
  if (items[0].is_tensor() && items[1].is_tensor()) {
    return {items[0].as_tensor(), items[1].as_tensor()};
  }
  // The dual forms (packed, (a, b)) and ((a, b), packed): the split member.
  if (items[0].is_tensor() && is_pair(items[1])) {
    return {items[1].items()[0].as_tensor(), items[1].items()[1].as_tensor()};
  }
  if (is_pair(items[0]) && items[1].is_tensor()) {
    return {items[0].items()[0].as_tensor(), items[0].items()[1].as_tensor()};
  }
  for (const Value& x : items) {
    if (!x.is_sequence()) (void)leaf(x);
  }
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, arg, what,
                  " structural MLA input has malformed nesting.");
}

// upstream's _raise_planned_run_mismatch.
[[noreturn]] void planned_mismatch(const char* op, const char* arg, const char* name,
                                   const std::string& planned, const std::string& got) {
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, arg, "MLA planned run argument ", name,
                  " mismatch: planned ", planned, ", got ", got,
                  "; re-plan with the needed arguments.");
}

}  // namespace

AttentionOutput BatchMLAPagedAttentionWrapper::run(
    std::optional<Tensor> q_nope, std::optional<Tensor> q_pe, std::optional<Tensor> ckv_cache,
    std::optional<Tensor> kpe_cache, std::optional<Tensor> out, std::optional<Tensor> lse,
    bool return_lse, std::optional<Tensor> profiler_buffer, std::optional<Tensor> kv_len,
    std::optional<Tensor> page_table, bool return_lse_base_on_e, std::optional<double> o_scale,
    const MlaRunOptions& options) {
  return call_op<&BatchMLAPagedAttentionWrapper::run>(
      [&] {
        const char* op = "BatchMLAPagedAttentionWrapper.run";
        const MlaRunOptions& o = options;
        detail::MlaWrapperState& s = *s_;
        // The legacy pairs or query= / kv_cache= (upstream 0.7.4's normalization, its order).
        const bool query_given = !o.query.is_none(), cache_given = !o.kv_cache.is_none();
        if (!query_given) {
          FLASHINFER_CHECK(q_nope.has_value() == q_pe.has_value(), op, q_nope ? "q_pe" : "q_nope",
                           "q_nope and q_pe must both be provided.");
          FLASHINFER_CHECK(q_nope.has_value(), op, "query",
                           "run() requires query= or q_nope and q_pe.");
        } else {
          FLASHINFER_CHECK(!q_nope && !q_pe, op, "query",
                           "pass either query= or q_nope/q_pe, not both.");
        }
        if (!cache_given) {
          FLASHINFER_CHECK(ckv_cache.has_value() == kpe_cache.has_value(), op,
                           ckv_cache ? "kpe_cache" : "ckv_cache",
                           "ckv_cache and kpe_cache must both be provided.");
          FLASHINFER_CHECK(ckv_cache.has_value(), op, "kv_cache",
                           "run() requires kv_cache= or ckv_cache and kpe_cache.");
        } else {
          FLASHINFER_CHECK(!ckv_cache && !kpe_cache, op, "kv_cache",
                           "pass either kv_cache= or ckv_cache/kpe_cache, not both.");
        }
        FLASHINFER_CHECK(s.planned, op, "self",
                         "BatchMLAPagedAttentionWrapper.run() called before plan().");
        // The planned run contract (MLAInputContract.validate_run_options).
        const std::string lse_got = return_lse || lse || return_lse_base_on_e
                                        ? (return_lse_base_on_e ? "basee" : "base2")
                                        : "none";
        // A legacy flat CSR plan of "none" takes the LSE a run asks for (upstream's
        // compatibility path, with a DeprecationWarning there).
        const bool relaxed = s.legacy_csr && s.lse_mode == "none";
        if (!relaxed && lse_got != s.lse_mode) {
          planned_mismatch(op, "return_lse", "LSE mode", py_str(s.lse_mode), py_str(lse_got));
        }
        if (out && out->defined() && out->dtype() != s.out_dtype) {
          planned_mismatch(op, "out", "output dtype", std::string(dtype_torch_name(s.out_dtype)),
                           std::string(dtype_torch_name(out->dtype())));
        }
        if (o_scale) planned_mismatch(op, "o_scale", "o_scale", "'none'", "'per-tensor'");
        if (o.sinks) planned_mismatch(op, "sinks", "sinks", "False", "True");
        if (o.skip_softmax_threshold_scale_factor) {
          planned_mismatch(op, "skip_softmax_threshold_scale_factor", "skip_softmax", "False",
                           "True");
        }
        const bool has_kv_scale = o.ckv_scale || o.ckv_scale_arr || o.kpe_scale;
        const bool has_bmm = o.bmm1_scale || o.bmm2_scale;
        FLASHINFER_CHECK(!(has_kv_scale && has_bmm), op, "bmm1_scale",
                         "KV and BMM scale families are mutually exclusive.");
        FLASHINFER_CHECK(o.bmm1_scale.has_value() == o.bmm2_scale.has_value(), op,
                         o.bmm1_scale ? "bmm2_scale" : "bmm1_scale",
                         "bmm1_scale and bmm2_scale must be provided together.");
        std::string scale_got = s.scale_mode == "kv-per-tensor" ? "kv-per-tensor" : "default";
        if (has_bmm) {
          FLASHINFER_CHECK(o.bmm1_scale->is_tensor() == o.bmm2_scale->is_tensor(), op, "bmm2_scale",
                           "bmm1_scale and bmm2_scale must have the same scale type.");
          scale_got = o.bmm1_scale->is_tensor() ? "bmm-tensor" : "bmm-scalar";
        }
        if (scale_got != s.scale_mode) {
          planned_mismatch(op, has_bmm ? "bmm1_scale" : "ckv_scale", "scale mode",
                           py_str(s.scale_mode), py_str(scale_got));
        }
        // kv-per-tensor: upstream 0.7.4 wants exactly one of ckv_scale / ckv_scale_arr and a
        // kpe_scale. A legacy flat CSR plan keeps the pinned release's rule (scales default to 1,
        // ckv_scale 1.0 beside the array), so its older recordings replay.
        if (s.scale_mode == "kv-per-tensor" && !s.legacy_csr) {
          FLASHINFER_CHECK(o.ckv_scale.has_value() != o.ckv_scale_arr.has_value(), op, "ckv_scale",
                           "Exactly one of ckv_scale or ckv_scale_arr is required when "
                           "kv_data_type is FP8.");
          FLASHINFER_CHECK(o.kpe_scale.has_value(), op, "kpe_scale",
                           "kpe_scale is required when kv_data_type is FP8.");
        } else if (s.scale_mode != "kv-per-tensor" && !s.legacy_csr) {
          // (A flat CSR plan keeps taking KV scales with a 16-bit cache, as this library's
          // wrapper always has; upstream refuses them there too.)
          FLASHINFER_CHECK(!has_kv_scale, op,
                           o.ckv_scale       ? "ckv_scale"
                           : o.ckv_scale_arr ? "ckv_scale_arr"
                                             : "kpe_scale",
                           "ckv_scale / ckv_scale_arr / kpe_scale are only valid when "
                           "kv_data_type is FP8.");
        }
        Tensor qn, qp, ckv, kpe;
        if (query_given) {
          std::tie(qn, qp) = structural_split(o.query, "query", "query", s.dim_ckv,
                                              s.dim_ckv + s.dim_kpe, s.q_dtype, "q_data_type", op);
        } else {
          qn = *q_nope, qp = *q_pe;
        }
        if (cache_given) {
          std::tie(ckv, kpe) =
              structural_split(o.kv_cache, "KV cache", "kv_cache", s.dim_ckv, s.dim_ckv + s.dim_kpe,
                               s.kv_dtype, "kv_data_type", op);
        } else {
          ckv = *ckv_cache, kpe = *kpe_cache;
        }
        FLASHINFER_CHECK_CODE(!profiler_buffer, ErrorCode::kUnsupported, op, "profiler_buffer",
                              "the profiler is not supported");
        FLASHINFER_CHECK_CODE(!kv_len, ErrorCode::kUnsupported, op, "kv_len",
                              "kv_len is only supported with cutlass backend.");
        FLASHINFER_CHECK_CODE(!page_table, ErrorCode::kUnsupported, op, "page_table",
                              "page_table is only supported with cutlass backend.");
        MlaRun r = mla_run_inputs(op, qn, qp, ckv, "ckv_cache", kpe, "kpe_cache");
        FLASHINFER_CHECK(qn.size(0) == s.qo_indptr.back() && qn.size(1) == s.num_heads, op,
                         "q_nope", "q_nope rows and heads must match the planned query shape.");
        r.out = out;
        r.lse = lse;
        r.return_lse = return_lse;
        r.lse_base_e = return_lse_base_on_e;
        r.o_dtype = s.out_dtype;
        r.ckv_scale = finite_scale(o.ckv_scale, op, "ckv_scale");
        r.kpe_scale = finite_scale(o.kpe_scale, op, "kpe_scale");
        if (o.ckv_scale_arr) {
          r.ckv_scale_arr = check_ckv_scale_arr(*s_, *o.ckv_scale_arr, ckv, r);
        }
        if (!has_bmm) return run_mla(s, r);
        // bmm1_scale replaces sm_scale, bmm2_scale multiplies the output (the trtllm MLA
        // entry point's math); a tensor is read where the kernels read it.
        for (const auto& [x, name] :
             {std::pair{&*o.bmm1_scale, "bmm1_scale"}, std::pair{&*o.bmm2_scale, "bmm2_scale"}}) {
          FLASHINFER_CHECK(!x->is_tensor() ||
                               (x->tensor().dtype() == DType::kFloat32 && x->tensor().numel() == 1),
                           op, name, name,
                           " must be a one-element torch.float32 tensor or a number");
        }
        const std::optional<Device> scale_dev =
            s.device.is_cuda() ? std::optional<Device>(s.device) : std::nullopt;
        const double sm =
            api::fused_scale_value(*o.bmm1_scale, op, "bmm1_scale", scale_dev, &r.sm_scale_dev);
        r.out_scale = static_cast<float>(
            api::fused_scale_value(*o.bmm2_scale, op, "bmm2_scale", scale_dev, &r.out_scale_dev));
        return run_mla_with_sm_scale(s, r, sm);
      },
      *this, q_nope, q_pe, ckv_cache, kpe_cache, out, lse, return_lse, profiler_buffer, kv_len,
      page_table, return_lse_base_on_e, o_scale, options);
}

// ---- BatchDecodeMlaWithPagedKVCacheWrapper ----------------------------------------------
// Upstream's deprecated SM80 MLA decode: run_mla with one query row per request.

BatchDecodeMlaWithPagedKVCacheWrapper::BatchDecodeMlaWithPagedKVCacheWrapper(
    Tensor float_workspace_buffer, bool use_cuda_graph, bool use_tensor_cores,
    std::optional<Tensor> paged_kv_indptr_buffer, std::optional<Tensor> paged_kv_indices_buffer,
    std::optional<Tensor> paged_kv_last_page_len_buffer)
    : s_(std::make_unique<detail::MlaWrapperState>()) {
  call_init<MlaDecodeInit>(
      [&] {
        const char* op = "BatchDecodeMlaWithPagedKVCacheWrapper.__init__";
        api::check_defined(float_workspace_buffer, op, "float_workspace_buffer");
        if (use_cuda_graph) {
          // Upstream's rule: in CUDA-graph mode the three buffers fix the batch size.
          for (const auto& [t, arg] :
               {std::pair{&paged_kv_indptr_buffer, "paged_kv_indptr_buffer"},
                std::pair{&paged_kv_indices_buffer, "paged_kv_indices_buffer"},
                std::pair{&paged_kv_last_page_len_buffer, "paged_kv_last_page_len_buffer"}}) {
            FLASHINFER_CHECK(t->has_value() && (*t)->defined(), op, arg,
                             "must be a tensor in cudagraph mode");
            api::check_dim(**t, {1}, op, arg);
          }
          s_->fixed_batch = paged_kv_last_page_len_buffer->size(0);
          FLASHINFER_CHECK(paged_kv_indptr_buffer->size(0) == s_->fixed_batch + 1, op,
                           "paged_kv_indptr_buffer",
                           "must hold batch_size + 1 = ", s_->fixed_batch + 1, " elements, got ",
                           paged_kv_indptr_buffer->size(0));
          s_->indices_capacity = paged_kv_indices_buffer->size(0);
        }
        s_->float_workspace = float_workspace_buffer;
        s_->device = float_workspace_buffer.device();
        s_->use_cuda_graph = use_cuda_graph;
      },
      *this, float_workspace_buffer, use_cuda_graph, use_tensor_cores, paged_kv_indptr_buffer,
      paged_kv_indices_buffer, paged_kv_last_page_len_buffer);
}

BatchDecodeMlaWithPagedKVCacheWrapper::~BatchDecodeMlaWithPagedKVCacheWrapper() = default;

void BatchDecodeMlaWithPagedKVCacheWrapper::plan(
    const Tensor& indptr, const Tensor& indices, const Tensor& last_page_len, int64_t num_qo_heads,
    int64_t head_dim_compressed_kv, int64_t page_size, double sm_scale, int64_t window_left,
    std::optional<double> logits_soft_cap, DType data_type, std::optional<DType> q_data_type,
    std::optional<double> rope_scale, std::optional<double> rope_theta) {
  call_op<&BatchDecodeMlaWithPagedKVCacheWrapper::plan>(
      [&] {
        const char* op = "BatchDecodeMlaWithPagedKVCacheWrapper.plan";
        detail::MlaWrapperState& s = *s_;
        s.planned = false;
        s.num_heads = to_i32(num_qo_heads, op, "num_qo_heads");
        s.dim_ckv = to_i32(head_dim_compressed_kv, op, "head_dim_compressed_kv");
        FLASHINFER_CHECK(std::isfinite(sm_scale), op, "sm_scale", "must be finite, got ", sm_scale);
        // Upstream's run checks the cap's sign; the kernels never apply it (see the header).
        FLASHINFER_CHECK(logits_soft_cap.value_or(0.0) >= 0.0, op, "logits_soft_cap",
                         "must be non-negative, got ", *logits_soft_cap);
        const DType qd = q_data_type.value_or(data_type);
        api::check_q_dtype(qd, op, "q_data_type");
        api::check_kv_dtype(data_type, qd, op, "data_type");
        detail::WrapperState table;
        api::load_page_table(table, indptr, indices, last_page_len, page_size, op, "indptr",
                             "indices", "last_page_len");
        const auto batch = static_cast<int64_t>(table.kv_lens.size());
        if (s.use_cuda_graph) {
          FLASHINFER_CHECK(batch == s.fixed_batch, op, "last_page_len", "batch size ", batch,
                           " differs from the ", s.fixed_batch,
                           " fixed at __init__ (cudagraph mode)");
          FLASHINFER_CHECK(static_cast<int64_t>(table.kv_indices.size()) <= s.indices_capacity, op,
                           "indices", "has ", table.kv_indices.size(),
                           " page ids, more than paged_kv_indices_buffer holds (",
                           s.indices_capacity, ")");
        }
        s.page_size = table.page_size;
        s.kv_indptr = std::move(table.kv_indptr);
        s.kv_indices = std::move(table.kv_indices);
        s.kv_lens = std::move(table.kv_lens);
        s.max_page_id = table.max_page_id;
        s.qo_indptr.resize(static_cast<std::size_t>(batch) + 1);
        for (int64_t b = 0; b <= batch; ++b) s.qo_indptr[b] = static_cast<int32_t>(b);
        s.batch = static_cast<int32_t>(batch);
        s.causal = false;  // one query per request, at its last position: sees every token
        s.sm_scale = sm_scale;
        s.q_dtype = qd;
        s.kv_dtype = data_type;
        s.dim_kpe = 0;  // q_pe's, at run
        s.dev_ints_current = false;
        s.graph_indices_cap = s.indices_capacity;
        plan_upload(s, op, "last_page_len", "indices");
        s.planned = true;
      },
      *this, indptr, indices, last_page_len, num_qo_heads, head_dim_compressed_kv, page_size,
      sm_scale, window_left, logits_soft_cap, data_type, q_data_type, rope_scale, rope_theta);
}

AttentionOutput BatchDecodeMlaWithPagedKVCacheWrapper::run(
    const Tensor& q_nope, const Tensor& q_pe, const Tensor& paged_ckv_cache,
    const Tensor& paged_kpe_cache, std::optional<double> q_scale, std::optional<double> k_scale,
    std::optional<double> v_scale, std::optional<Tensor> out, std::optional<Tensor> lse,
    bool return_lse, bool enable_pdl) {
  return call_op<&BatchDecodeMlaWithPagedKVCacheWrapper::run>(
      [&] {
        const char* op = "BatchDecodeMlaWithPagedKVCacheWrapper.run";
        detail::MlaWrapperState& s = *s_;
        FLASHINFER_CHECK(s.planned, op, "self", "run() called before plan()");
        MlaRun r = mla_run_inputs(op, q_nope, q_pe, paged_ckv_cache, "paged_ckv_cache",
                                  paged_kpe_cache, "paged_kpe_cache");
        r.out = out;
        r.lse = lse;
        r.return_lse = return_lse;
        r.o_dtype = s.q_dtype;
        // Upstream multiplies the output by v_scale after the kernel; folding it into the
        // final normalization rounds once instead of twice (within one ulp of upstream).
        r.out_scale = finite_scale(v_scale, op, "v_scale");
        finite_scale(q_scale, op, "q_scale");
        finite_scale(k_scale, op, "k_scale");
        s.dim_kpe = to_i32(q_pe.size(2), op, "q_pe");
        // q_scale and k_scale fold into sm_scale on the host, in double, as upstream's Python.
        return run_mla_with_sm_scale(s, r,
                                     s.sm_scale * q_scale.value_or(1.0) * k_scale.value_or(1.0));
      },
      *this, q_nope, q_pe, paged_ckv_cache, paged_kpe_cache, q_scale, k_scale, v_scale, out, lse,
      return_lse, enable_pdl);
}

// ---- block-table entry points -----------------------------------------------------------

AttentionOutput trtllm_batch_decode_with_kv_cache_mla(
    const Tensor& query, const Tensor& kv_cache, const Tensor& workspace_buffer,
    int64_t qk_nope_head_dim, int64_t kv_lora_rank, int64_t qk_rope_head_dim,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_seq_len,
    int64_t sparse_mla_top_k, std::optional<Tensor> out, ScalarOrTensor<double> bmm1_scale,
    ScalarOrTensor<double> bmm2_scale, std::optional<Tensor> sinks,
    std::optional<double> skip_softmax_threshold_scale_factor, std::optional<bool> enable_pdl,
    std::string_view backend, bool is_var_seq, bool uses_shared_paged_kv_idx,
    std::optional<Tensor> lse, bool return_lse, std::string_view cute_dsl_impl,
    std::string_view kv_scale_format, std::optional<Tensor> cum_seq_lens_q,
    std::optional<int64_t> max_q_len, std::optional<Tensor> multi_ctas_kv_counter_buffer,
    std::optional<Tensor> sparse_mla_top_k_lens, bool enable_dcp, int64_t cp_world, int64_t cp_rank,
    std::optional<Tensor> causal_seqlens_kv_global, std::optional<bool> use_fp16_softmax,
    std::optional<std::string> return_lse_base) {
  return call_op<&trtllm_batch_decode_with_kv_cache_mla>(
      [&] {
        const char* op = kTrtllmOp;
        // Upstream 0.7.4 checks return_lse_base before anything else.
        FLASHINFER_CHECK(
            !return_lse_base || *return_lse_base == "basee" || *return_lse_base == "base2", op,
            "return_lse_base", "return_lse_base must be 'basee', 'base2', or None; got '",
            return_lse_base.value_or(""), "'");
        auto unsupported = [&](bool bad, const char* arg, const char* why) {
          FLASHINFER_CHECK_CODE(!bad, ErrorCode::kUnsupported, op, arg, why);
        };
        unsupported(sinks.has_value(), "sinks", "attention sinks are not supported for MLA");
        unsupported(skip_softmax_threshold_scale_factor.has_value(),
                    "skip_softmax_threshold_scale_factor", "skip-softmax is not supported");
        unsupported(use_fp16_softmax.value_or(false), "use_fp16_softmax",
                    "the fp16 softmax is not supported");
        unsupported(!uses_shared_paged_kv_idx, "uses_shared_paged_kv_idx",
                    "separate K/V page indices are not supported");
        FLASHINFER_CHECK_CODE(backend == "auto" || backend == "trtllm-gen" || backend == "xqa" ||
                                  backend == "cute-dsl",
                              ErrorCode::kUnsupported, op, "backend", "unknown backend \"", backend,
                              "\"");
        BlockMlaExtras x;
        // Sparse MLA (upstream's trtllm-gen only): top-k token slots a query.
        FLASHINFER_CHECK(sparse_mla_top_k >= 0, op, "sparse_mla_top_k", "must be >= 0, got ",
                         sparse_mla_top_k);
        x.sparse_top_k = sparse_mla_top_k;
        if (sparse_mla_top_k > 0) {
          unsupported(backend == "cute-dsl" || backend == "xqa", "backend",
                      "sparse MLA runs on the trtllm-gen backend only (as upstream's)");
        }
        // The per-query active lengths belong to upstream's rope-less (512 / 0) sparse path, which
        // requires them; the DeepSeek layout refuses them.
        FLASHINFER_CHECK(!sparse_mla_top_k_lens || (sparse_mla_top_k > 0 && qk_rope_head_dim == 0),
                         op, "sparse_mla_top_k_lens",
                         "is only taken by the sparse qk_rope_head_dim=0 path");
        FLASHINFER_CHECK(sparse_mla_top_k == 0 || qk_rope_head_dim != 0 || sparse_mla_top_k_lens,
                         op, "sparse_mla_top_k_lens",
                         "is required by the sparse qk_rope_head_dim=0 path");
        x.top_k_lens = sparse_mla_top_k_lens;
        FLASHINFER_CHECK(!max_q_len || cum_seq_lens_q, op, "max_q_len",
                         "is only taken with cum_seq_lens_q");
        x.cum_seq_lens_q = cum_seq_lens_q;
        x.max_q_len = max_q_len;
        // Decode context parallelism (upstream's cute-dsl kernel): natural-log LSE required.
        if (!enable_dcp) {
          FLASHINFER_CHECK(cp_world == 1 && cp_rank == 0 && !causal_seqlens_kv_global, op,
                           "enable_dcp", "DCP arguments require enable_dcp=True");
        } else {
          unsupported(backend != "auto" && backend != "cute-dsl", "backend",
                      "context parallelism runs on the cute-dsl backend only (as upstream's)");
          FLASHINFER_CHECK(return_lse, op, "return_lse",
                           "context parallelism needs return_lse=True (ranks merge by their LSE)");
          FLASHINFER_CHECK(sparse_mla_top_k == 0, op, "sparse_mla_top_k",
                           "is not taken with context parallelism");
          FLASHINFER_CHECK(!cum_seq_lens_q, op, "cum_seq_lens_q",
                           "is not taken with context parallelism");
          FLASHINFER_CHECK(cp_world >= 1, op, "cp_world", "must be >= 1, got ", cp_world);
          FLASHINFER_CHECK(cp_rank >= 0 && cp_rank < cp_world, op, "cp_rank", "must be in [0, ",
                           cp_world, "), got ", cp_rank);
          FLASHINFER_CHECK(causal_seqlens_kv_global.has_value(), op, "causal_seqlens_kv_global",
                           "is required with enable_dcp=True");
          x.dcp = true;
          x.cp_world = cp_world;
          x.cp_rank = cp_rank;
          x.causal_seqlens_kv_global = causal_seqlens_kv_global;
        }
        // The LSE: trtllm-gen's is base 2, cute-dsl's the natural log (context parallelism runs
        // there, and upstream's "auto" sends ragged queries with an LSE there).
        const bool want_lse = return_lse || lse.has_value();
        unsupported(want_lse && backend == "xqa", "return_lse",
                    "the xqa backend returns no LSE (as upstream's)");
        unsupported(cum_seq_lens_q && backend == "xqa", "cum_seq_lens_q",
                    "the xqa backend takes one query a request (as upstream's)");
        // Ragged queries with an LSE: upstream's trtllm-gen refuses them, and its cute-dsl (where
        // "auto" sends them) takes no sparse call.
        unsupported(want_lse && cum_seq_lens_q && (backend == "trtllm-gen" || sparse_mla_top_k > 0),
                    "return_lse", "trtllm-gen returns no LSE with cum_seq_lens_q (as upstream's)");
        x.lse = lse;
        x.return_lse = return_lse;
        // return_lse_base (0.7.4) overrides each backend's default; it turns no LSE on.
        x.lse_base_e = return_lse_base ? *return_lse_base == "basee"
                                       : backend == "cute-dsl" || enable_dcp ||
                                             (cum_seq_lens_q && backend == "auto");
        (void)enable_pdl;
        (void)is_var_seq;
        (void)cute_dsl_impl;
        (void)kv_scale_format;
        (void)multi_ctas_kv_counter_buffer;
        return block_mla_impl(op, query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank,
                              qk_rope_head_dim, block_tables, seq_lens, max_seq_len, out,
                              bmm1_scale, bmm2_scale, x);
      },
      query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
      block_tables, seq_lens, max_seq_len, sparse_mla_top_k, out, bmm1_scale, bmm2_scale, sinks,
      skip_softmax_threshold_scale_factor, enable_pdl, backend, is_var_seq,
      uses_shared_paged_kv_idx, lse, return_lse, cute_dsl_impl, kv_scale_format, cum_seq_lens_q,
      max_q_len, multi_ctas_kv_counter_buffer, sparse_mla_top_k_lens, enable_dcp, cp_world, cp_rank,
      causal_seqlens_kv_global, use_fp16_softmax, return_lse_base);
}

Tensor xqa_batch_decode_with_kv_cache_mla(
    const Tensor& query, const Tensor& kv_cache, const Tensor& workspace_buffer,
    int64_t qk_nope_head_dim, int64_t kv_lora_rank, int64_t qk_rope_head_dim,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_seq_len,
    std::optional<Tensor> out, ScalarOrTensor<double> bmm1_scale, ScalarOrTensor<double> bmm2_scale,
    std::optional<Tensor> sinks, std::optional<bool> enable_pdl) {
  return call_op<&xqa_batch_decode_with_kv_cache_mla>(
      [&] {
        FLASHINFER_CHECK_CODE(!sinks, ErrorCode::kUnsupported, kMlaXqaOp, "sinks",
                              "attention sinks are not supported for MLA");
        (void)enable_pdl;
        return block_mla_impl(kMlaXqaOp, query, kv_cache, workspace_buffer, qk_nope_head_dim,
                              kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens, max_seq_len,
                              out, bmm1_scale, bmm2_scale)
            .out;
      },
      query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
      block_tables, seq_lens, max_seq_len, out, bmm1_scale, bmm2_scale, sinks, enable_pdl);
}

// ---- bench hooks ------------------------------------------------------------------------

namespace {

constexpr int64_t kBenchCkv = 512;  // DeepSeek's latent and rope widths
constexpr int64_t kBenchKpe = 64;

// A latent cache for the benches: batch_size requests of s_kv tokens, consecutive pages.
struct BenchLatent {
  Tensor ckv, kpe, qo_indptr, kv_indptr, kv_indices, kv_lens, block_tables, seq_lens;
  int64_t pages_per_req = 0;
};

BenchLatent bench_latent(const BenchShape& s, Device dev, int64_t qo_per_req,
                         int64_t ckv = kBenchCkv, int64_t kpe = kBenchKpe) {
  BenchLatent l;
  l.pages_per_req = (s.s_kv + s.page_size - 1) / s.page_size;
  const int64_t pages = l.pages_per_req * s.batch_size;
  l.ckv = api::bench::random_tensor({pages, s.page_size, ckv}, s.kv_dtype, dev, s.random_seed + 1);
  l.kpe = api::bench::random_tensor({pages, s.page_size, kpe}, s.kv_dtype, dev, s.random_seed + 2);
  std::vector<int64_t> qo{0}, kvp{0}, idx, lens, table;
  for (int64_t b = 0; b < s.batch_size; ++b) {
    qo.push_back((b + 1) * qo_per_req);
    kvp.push_back((b + 1) * l.pages_per_req);
    lens.push_back(s.s_kv);
    for (int64_t j = 0; j < l.pages_per_req; ++j) {
      idx.push_back(b * l.pages_per_req + j);
      table.push_back(b * l.pages_per_req + j);
    }
  }
  l.qo_indptr = api::bench::int32_tensor(qo, dev);
  l.kv_indptr = api::bench::int32_tensor(kvp, dev);
  l.kv_indices = api::bench::int32_tensor(idx, dev);
  l.kv_lens = api::bench::int32_tensor(lens, dev);
  l.block_tables = api::bench::int32_tensor(table, dev).view({s.batch_size, l.pages_per_req});
  l.seq_lens = l.kv_lens;
  return l;
}

double mla_bytes(const BenchShape& s, int64_t rows, DType q, DType kv, int64_t ckv = kBenchCkv,
                 int64_t kpe = kBenchKpe) {
  const double qo = 2.0 * api::bench::nbytes({rows, s.num_qo_heads, ckv + kpe}, q);
  return qo + api::bench::nbytes({s.batch_size * s.s_kv, ckv + kpe}, kv);
}

// BatchMLAPagedAttentionWrapper.run: s_qo queries per request (causal per s.causal), latent
// widths head_dim_ckv / head_dim_kpe (512 / 64; kpe 0: a NoPE model's); plan once.
BenchCase bench_mla_run(const BenchShape& s, Device dev) {
  FLASHINFER_CHECK(s.s_qo <= s.s_kv, kMlaClass, "s_qo", "needs s_qo <= s_kv");
  const int64_t dc = s.head_dim_ckv, dk = s.head_dim_kpe;
  BenchLatent l = bench_latent(s, dev, s.s_qo, dc, dk);
  auto w =
      std::make_shared<BatchMLAPagedAttentionWrapper>(Tensor::empty({1 << 20}, DType::kUInt8, dev));
  DType qd = s.q_dtype == DType::kFloat32 ? DType::kBFloat16 : s.q_dtype;
  DType kd = dtype_is_fp8(s.kv_dtype) ? s.kv_dtype : qd;
  if (kd != s.kv_dtype) {
    l.ckv = l.ckv.to(kd);
    l.kpe = l.kpe.to(kd);
  }
  w->plan(l.qo_indptr, l.kv_indptr, l.kv_indices, l.kv_lens, s.num_qo_heads, dc, dk, s.page_size,
          s.causal, 1.0 / std::sqrt(192.0), qd, kd);
  const int64_t rows = s.batch_size * s.s_qo;
  Tensor qn = api::bench::random_tensor({rows, s.num_qo_heads, dc}, qd, dev, s.random_seed);
  Tensor qp = api::bench::random_tensor({rows, s.num_qo_heads, dk}, qd, dev, s.random_seed + 3);
  BenchCase c = api::bench::invoke_case(
      std::string(kMlaClass) + ".run",
      {api::bench::bench_object(w), Value(qn), Value(qp), Value(l.ckv), Value(l.kpe)});
  // Upstream's count with qk dim ckv + kpe and vo dim ckv.
  c.flops = static_cast<double>(s.batch_size) *
            api::bench::attention_flops(s.s_qo, s.s_kv, s.num_qo_heads, dc + dk, dc, s.causal);
  c.bytes = mla_bytes(s, rows, qd, kd, dc, dk);
  return c;
}

// BatchDecodeMlaWithPagedKVCacheWrapper.run: one query per request; plan once.
BenchCase bench_mla_decode_run(const BenchShape& s, Device dev) {
  BenchLatent l = bench_latent(s, dev, 1);
  auto w = std::make_shared<BatchDecodeMlaWithPagedKVCacheWrapper>(
      Tensor::empty({1 << 20}, DType::kUInt8, dev));
  const DType qd = s.q_dtype == DType::kFloat32 ? DType::kFloat16 : s.q_dtype;
  const DType kd = dtype_is_fp8(s.kv_dtype) ? s.kv_dtype : qd;
  if (kd != s.kv_dtype) {
    l.ckv = l.ckv.to(kd);
    l.kpe = l.kpe.to(kd);
  }
  const int64_t last = s.s_kv - (l.pages_per_req - 1) * s.page_size;
  w->plan(l.kv_indptr, l.kv_indices,
          api::bench::int32_tensor(std::vector<int64_t>(s.batch_size, last), dev), s.num_qo_heads,
          kBenchCkv, s.page_size, 1.0 / std::sqrt(192.0), -1, std::nullopt, kd, qd);
  Tensor qn =
      api::bench::random_tensor({s.batch_size, s.num_qo_heads, kBenchCkv}, qd, dev, s.random_seed);
  Tensor qp = api::bench::random_tensor({s.batch_size, s.num_qo_heads, kBenchKpe}, qd, dev,
                                        s.random_seed + 3);
  BenchCase c = api::bench::invoke_case(
      std::string(kDecodeClass) + ".run",
      {api::bench::bench_object(w), Value(qn), Value(qp), Value(l.ckv), Value(l.kpe)});
  c.flops = static_cast<double>(s.batch_size) *
            api::bench::attention_flops(1, s.s_kv, s.num_qo_heads, kBenchCkv + kBenchKpe, kBenchCkv,
                                        false);
  c.bytes = mla_bytes(s, s.batch_size, qd, kd);
  return c;
}

// The block-table entry points: one query per request.
BenchCase bench_block_mla(const std::string& name, const BenchShape& s, Device dev) {
  BenchLatent l = bench_latent(s, dev, 1);
  DType qd = s.q_dtype == DType::kFloat32 ? DType::kBFloat16 : s.q_dtype;
  const int64_t pages = l.pages_per_req * s.batch_size;
  Tensor kv = api::bench::random_tensor({pages, s.page_size, kBenchCkv + kBenchKpe}, qd, dev,
                                        s.random_seed + 1);
  Tensor q = api::bench::random_tensor({s.batch_size, 1, s.num_qo_heads, kBenchCkv + kBenchKpe}, qd,
                                       dev, s.random_seed);
  BenchCase c = api::bench::invoke_case(
      name,
      {Value(q), Value(kv), Value(Tensor::zeros({1 << 12}, DType::kUInt8, dev)), Value(128),
       Value(kBenchCkv), Value(kBenchKpe), Value(l.block_tables), Value(l.seq_lens), Value(s.s_kv)},
      {{"bmm1_scale", Value(1.0 / std::sqrt(192.0))}});
  c.flops = static_cast<double>(s.batch_size) * 2.0 * static_cast<double>(s.s_kv) *
            static_cast<double>(s.num_qo_heads) * (kBenchCkv + kBenchKpe + kBenchCkv);
  c.bytes = mla_bytes(s, s.batch_size, qd, qd);
  return c;
}

// append_paged_mla_kv_cache: the last s_qo tokens of each request are (re)written.
BenchCase bench_append_mla(const BenchShape& s, Device dev) {
  FLASHINFER_CHECK(s.s_qo <= s.s_kv, "append_paged_mla_kv_cache", "s_qo", "needs s_qo <= s_kv");
  BenchLatent l = bench_latent(s, dev, s.s_qo);
  const int64_t nnz = s.batch_size * s.s_qo;
  std::vector<int64_t> bi, pos;
  for (int64_t i = 0; i < nnz; ++i) {
    bi.push_back(i / s.s_qo);
    pos.push_back(s.s_kv - s.s_qo + i % s.s_qo);
  }
  std::vector<int64_t> last;
  for (int64_t b = 0; b < s.batch_size; ++b) {
    last.push_back(s.s_kv - (l.pages_per_req - 1) * s.page_size);
  }
  BenchCase c = api::bench::invoke_case(
      "append_paged_mla_kv_cache",
      {Value(api::bench::random_tensor({nnz, kBenchCkv}, s.kv_dtype, dev, s.random_seed + 5)),
       Value(api::bench::random_tensor({nnz, kBenchKpe}, s.kv_dtype, dev, s.random_seed + 6)),
       Value(api::bench::int32_tensor(bi, dev)), Value(api::bench::int32_tensor(pos, dev)),
       Value(l.ckv), Value(l.kpe), Value(l.kv_indices), Value(l.kv_indptr),
       Value(api::bench::int32_tensor(last, dev))});
  c.bytes = 2.0 * api::bench::nbytes({nnz, kBenchCkv + kBenchKpe}, s.kv_dtype) + 8.0 * nnz;
  return c;
}

// concat_mla_k: batch_size * s_kv tokens, num_qo_heads heads, nope 128 and rope 64 (DeepSeek).
BenchCase bench_concat(const BenchShape& s, Device dev) {
  const int64_t t = s.batch_size * s.s_kv, h = s.num_qo_heads;
  const DType d = s.input_dtype == DType::kFloat32 ? DType::kBFloat16 : s.input_dtype;
  BenchCase c = api::bench::invoke_case(
      "concat_mla_k", {Value(Tensor::zeros({t, h, 192}, d, dev)),
                       Value(api::bench::random_tensor({t, h, 128}, d, dev, s.random_seed)),
                       Value(api::bench::random_tensor({t, 1, 64}, d, dev, s.random_seed + 1))});
  c.bytes = api::bench::nbytes({t, h, 192}, d) + api::bench::nbytes({t, h, 128}, d) +
            api::bench::nbytes({t, 1, 64}, d);
  return c;
}

}  // namespace

namespace detail {
// The recorder's extension of BatchMLAPagedAttentionWrapper.run (recorder/call_extensions.h;
// docs/LOGGING.md, "Extension tensors"): run reads its page ids when it runs, and engines write
// them after plan, so the ids plan's record holds may not be the ones run read. The recorder adds
// those as fi_ext__kv_indices_at_run; a replay writes them where its wrapper reads them before
// run (without the key, as in upstream's recordings, it runs over plan's).
struct MlaWrapperAccess {
  static MlaWrapperState* state(std::span<const Value> args) {
    if (args.empty() || args[0].kind() != Value::Kind::kObject) return nullptr;
    auto* w = dynamic_cast<BatchMLAPagedAttentionWrapper*>(args[0].as_object().get());
    return w != nullptr ? w->s_.get() : nullptr;
  }
};

namespace {

using api::kIdsAtRunKey;

// Whether the recorder adds the ids for a call of this wrapper state: inside a CUDA-graph capture
// a copy would join the graph, so the recording keeps plan's ids.
bool records_ids(const detail::MlaWrapperState* s) {
  return s != nullptr && s->planned && s->live_indices.defined() && !s->kv_indptr.empty() &&
         s->kv_indptr.back() > 0 &&
         !(s->live_indices.device().is_cuda() && cuda_current_stream_capturing());
}

// The other calls keep the ring recorder's fast path.
bool ids_at_run_apply(std::span<const Value> args) {
  return records_ids(detail::MlaWrapperAccess::state(args));
}

void record_ids_at_run(std::span<const Value> args,
                       std::vector<std::pair<std::string, Tensor>>& extra) {
  const detail::MlaWrapperState* s = detail::MlaWrapperAccess::state(args);
  if (!records_ids(s)) return;
  // A copy: the buffer may change again before the recorder writes the call out.
  extra.emplace_back(kIdsAtRunKey, s->live_indices.slice(0, 0, s->kv_indptr.back()).clone());
}

void replay_ids_at_run(const std::map<std::string, Tensor>& tensors, std::vector<Value>& args) {
  const auto it = tensors.find(kIdsAtRunKey);
  detail::MlaWrapperState* s = detail::MlaWrapperAccess::state(args);
  if (it == tensors.end() || s == nullptr || !s->planned || s->kv_indptr.empty()) return;
  const int64_t n = s->kv_indptr.back();
  const Tensor live = s->live_indices.defined() ? s->live_indices.slice(0, 0, n) : Tensor();
  // Plan's copy replaced (a host tensor on a CUDA wrapper): run uploads it again.
  if (api::write_recorded_ids(it->second, n, live, s->kv_indices, s->max_page_id) ==
      api::RecordedIds::kHost) {
    s->dev_ints_current = false;
  }
}

}  // namespace

void register_mla_ops(OpRegistry& r) {
  detail::register_call_extension("BatchMLAPagedAttentionWrapper.run", record_ids_at_run,
                                  replay_ids_at_run, ids_at_run_apply);
  declare<&append_paged_mla_kv_cache>(
      r,
      {.name = "append_paged_mla_kv_cache",
       .module = "flashinfer.page",
       .summary = "Writes appended latent (ckv) and rope (kpe) rows into an MLA paged cache"},
      "append_ckv", "append_kpe", "batch_indices", "positions", arg("ckv_cache").mut(),
      arg("kpe_cache").mut(), "kv_indices", "kv_indptr", "kv_last_page_len");
  declare<&concat_mla_k>(r,
                         {.name = "concat_mla_k",
                          .module = "flashinfer.concat_ops",
                          .summary = "k = (k_nope, k_rope broadcast to every head) for MLA"},
                         arg("k").mut(), "k_nope", "k_rope", arg("backend", "default").kw());
  declare_init<MlaInit>(
      r,
      {.name = "BatchMLAPagedAttentionWrapper.__init__",
       .module = kMlaModule,
       .summary = "MLA attention over a paged latent cache (plan once, run per layer)"},
      "float_workspace_buffer", arg("use_cuda_graph", false), "qo_indptr", "kv_indptr",
      "kv_indices", "kv_len_arr", arg("backend", "auto"));
  declare<&BatchMLAPagedAttentionWrapper::plan>(
      r,
      {.name = "BatchMLAPagedAttentionWrapper.plan",
       .module = kMlaModule,
       .summary = "Validates the MLA page table and lengths"},
      "qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr", "num_heads", "head_dim_ckv",
      "head_dim_kpe", "page_size", "causal", "sm_scale", "q_data_type", "kv_data_type",
      arg("use_profiler", false), field("metadata").type("MLAPlanMetadata"));
  declare<&BatchMLAPagedAttentionWrapper::run>(
      r,
      {.name = "BatchMLAPagedAttentionWrapper.run",
       .module = kMlaModule,
       .summary = "MLA attention with the current plan"},
      "q_nope", "q_pe", "ckv_cache", "kpe_cache", arg("out").mut(), arg("lse").mut(),
      arg("return_lse", false), "profiler_buffer", "kv_len", "page_table",
      arg("return_lse_base_on_e", false), "o_scale");
  declare<&trtllm_batch_decode_with_kv_cache_mla>(
      r,
      {.name = kTrtllmOp,
       .module = kMlaModule,
       .summary = "MLA decode over a block-table latent cache (trtllm convention)"},
      "query", "kv_cache", "workspace_buffer", "qk_nope_head_dim", "kv_lora_rank",
      "qk_rope_head_dim", "block_tables", "seq_lens", "max_seq_len", arg("sparse_mla_top_k", 0),
      arg("out").mut(), arg("bmm1_scale", 1.0), arg("bmm2_scale", 1.0), "sinks",
      "skip_softmax_threshold_scale_factor", "enable_pdl", arg("backend", "auto"),
      arg("is_var_seq", true), arg("uses_shared_paged_kv_idx", true), arg("lse").mut(),
      arg("return_lse", false), arg("cute_dsl_impl", "auto"), arg("kv_scale_format", "auto"),
      "cum_seq_lens_q", "max_q_len", "multi_ctas_kv_counter_buffer", "sparse_mla_top_k_lens",
      arg("enable_dcp", false), arg("cp_world", 1), arg("cp_rank", 0), "causal_seqlens_kv_global",
      "use_fp16_softmax", "return_lse_base");
  declare<&xqa_batch_decode_with_kv_cache_mla>(
      r,
      {.name = kMlaXqaOp,
       .module = kMlaModule,
       .summary = "MLA decode over a block-table latent cache (XQA backend's name)"},
      "query", "kv_cache", "workspace_buffer", "qk_nope_head_dim", "kv_lora_rank",
      "qk_rope_head_dim", "block_tables", "seq_lens", "max_seq_len", arg("out").mut(),
      arg("bmm1_scale", 1.0), arg("bmm2_scale", 1.0), "sinks", "enable_pdl");
  declare_init<MlaDecodeInit>(
      r,
      {.name = "BatchDecodeMlaWithPagedKVCacheWrapper.__init__",
       .module = "flashinfer.decode",
       .summary = "Deprecated SM80 MLA decode wrapper over a paged latent cache"},
      "float_workspace_buffer", arg("use_cuda_graph", false), arg("use_tensor_cores", false),
      "paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer");
  declare<&BatchDecodeMlaWithPagedKVCacheWrapper::plan>(
      r,
      {.name = "BatchDecodeMlaWithPagedKVCacheWrapper.plan",
       .module = "flashinfer.decode",
       .summary = "Validates the page table of an MLA decode batch"},
      "indptr", "indices", "last_page_len", "num_qo_heads", "head_dim_compressed_kv", "page_size",
      "sm_scale", arg("window_left", -1), "logits_soft_cap", arg("data_type", "float16"),
      "q_data_type", "rope_scale", "rope_theta");
  declare<&BatchDecodeMlaWithPagedKVCacheWrapper::run>(
      r,
      {.name = "BatchDecodeMlaWithPagedKVCacheWrapper.run",
       .module = "flashinfer.decode",
       .summary = "MLA decode (one query per request) with the current plan"},
      "q_nope", "q_pe", "paged_ckv_cache", "paged_kpe_cache", "q_scale", "k_scale", "v_scale",
      arg("out").mut(), arg("lse").mut(), arg("return_lse", false), arg("enable_pdl", false));
  api::register_backends("append_paged_mla_kv_cache", kMlaAppendKernels);
  api::register_backends("concat_mla_k", kConcatKernels);
  for (const char* op : {"BatchMLAPagedAttentionWrapper.__init__",
                         "BatchMLAPagedAttentionWrapper.plan", "BatchMLAPagedAttentionWrapper.run",
                         kTrtllmOp, kMlaXqaOp, "BatchDecodeMlaWithPagedKVCacheWrapper.__init__",
                         "BatchDecodeMlaWithPagedKVCacheWrapper.plan",
                         "BatchDecodeMlaWithPagedKVCacheWrapper.run"}) {
    api::register_backends(op, kMlaKernels);
  }
  register_bench_hook("append_paged_mla_kv_cache", bench_append_mla);
  register_bench_hook("concat_mla_k", bench_concat);
  register_bench_hook("BatchMLAPagedAttentionWrapper.run", bench_mla_run);
  register_bench_hook("BatchDecodeMlaWithPagedKVCacheWrapper.run", bench_mla_decode_run);
  register_bench_hook(kTrtllmOp, [](const BenchShape& s, Device dev) {
    return bench_block_mla(kTrtllmOp, s, dev);
  });
  register_bench_hook(kMlaXqaOp, [](const BenchShape& s, Device dev) {
    return bench_block_mla(kMlaXqaOp, s, dev);
  });
}
}  // namespace detail

}  // namespace flashinfer
