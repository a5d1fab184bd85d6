// Shared machinery of the attention areas: index checks, paged-cache views, the planner and the
// run path of the wrappers (and of the single-request ops, which are one-request plans).
#include "api/attention_common.h"
#include "api/attention_nvfp4.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <string_view>

#include "api/attention_pos_encoding.h"
#include "api/attention_sink.h"
#include "api/checks.h"
#include "api/device_props.h"
#include "api/kernel_table.h"
#include "core/cuda_runtime.h"
#include "core/env_switch.h"
#include "flashinfer/error.h"
#include "flashinfer/stream.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cuda/prefill_shape.h"  // plain constexpr: the planner's tile rule on every build
#include "kernels/cuda/prefill_sm90_shape.h"  // ditto: the Hopper kernel's blocks an SM
#include "kernels/page_guard.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/block_table_plan_cuda.h"
#include "kernels/cuda/decode_cuda.h"
#include "kernels/cuda/page_guard_cuda.h"
#include "kernels/cuda/prefill_cuda.h"
#include "kernels/cuda/prefill_sm90.h"
#include "kernels/cuda/stream_scratch.h"
#endif

namespace flashinfer::api {

// Every attention op (decode, prefill, batch wrappers) runs one batch-attention kernel.
constexpr KernelEntry<kernels::AttentionParams> kAttentionKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 online softmax, OpenMP over (request, head, chunk)",
     nullptr,
     [](const kernels::AttentionParams& p, const LaunchContext&) {
       kernels::cpu::batch_attention(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: split-KV online softmax + merge pass", nullptr,
     [](const kernels::AttentionParams& p, const LaunchContext& c) {
       kernels::cuda::batch_attention(p, c.stream, c.enable_pdl);
     }},
#endif
};
void register_attention_backends(std::string_view op) { register_backends(op, kAttentionKernels); }

#if FLASHINFER_WITH_CUDA
// The device-side plan of the block-table decode calls (build_block_table_plan), on CUDA only:
// the CPU plans on the host.
constexpr KernelEntry<kernels::BlockTablePlan> kBlockTablePlanKernels[] = {
    {DeviceType::kCUDA, "CUDA kernel: one block per request", nullptr,
     [](const kernels::BlockTablePlan& p, const LaunchContext& c) {
       kernels::cuda::block_table_plan(p, c.stream);
     }},
};
// The paged wrappers' run-time page ids (kernels/page_guard.h), on CUDA only: the CPU reads them
// on the host. The copy before the attention kernels, the NaN rows after them.
constexpr KernelEntry<kernels::PageGuardParams> kPageGuardCopyKernels[] = {
    {DeviceType::kCUDA, "CUDA kernel: one block per request", nullptr,
     [](const kernels::PageGuardParams& p, const LaunchContext& c) {
       kernels::cuda::page_guard_copy(p, c.stream);
     }},
};
constexpr KernelEntry<kernels::PageGuardParams> kPageGuardNanKernels[] = {
    {DeviceType::kCUDA, "CUDA kernel: one block per request", nullptr,
     [](const kernels::PageGuardParams& p, const LaunchContext& c) {
       kernels::cuda::page_guard_nan_rows(p, c.stream);
     }},
};
#endif

void check_index_tensor(const Tensor& t, const char* op, const char* arg, int64_t expected_len) {
  check_defined(t, op, arg);
  check_dim(t, {1}, op, arg);
  FLASHINFER_CHECK(t.dtype() == DType::kInt32, op, arg, "expected an int32 tensor, got ",
                   dtype_torch_name(t.dtype()));
  if (expected_len >= 0) {
    FLASHINFER_CHECK(t.size(0) == expected_len, op, arg, "expected ", expected_len,
                     " elements, got ", t.size(0));
  }
}

std::vector<int32_t> index_to_host(const Tensor& t, const char* op, const char* arg,
                                   int64_t expected_len) {
  check_index_tensor(t, op, arg, expected_len);
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<int32_t> v(static_cast<std::size_t>(h.numel()));
  if (!v.empty()) std::memcpy(v.data(), h.data_ptr(), v.size() * sizeof(int32_t));
  return v;
}

Tensor int32_index(const Tensor& t) {
  return t.defined() && t.dtype() == DType::kInt64 ? t.to(DType::kInt32) : t;
}

void check_indptr(const std::vector<int32_t>& indptr, const char* op, const char* arg) {
  FLASHINFER_CHECK(!indptr.empty(), op, arg, "needs batch_size + 1 >= 1 elements");
  FLASHINFER_CHECK(indptr[0] == 0, op, arg, "must start at 0, got ", indptr[0]);
  for (std::size_t i = 1; i < indptr.size(); ++i) {
    FLASHINFER_CHECK(indptr[i] >= indptr[i - 1], op, arg, "must be non-decreasing: element ", i,
                     " (", indptr[i], ") < element ", i - 1, " (", indptr[i - 1], ")");
  }
}

bool parse_kv_layout(std::string_view layout, const char* op, const char* arg) {
  if (layout == "NHD") return false;
  if (layout == "HND") return true;
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, arg, "must be \"NHD\" or \"HND\", got \"",
                  layout, "\"");
}

void check_heads(int64_t num_qo_heads, int64_t num_kv_heads, const char* op, const char* qo_arg,
                 const char* kv_arg) {
  FLASHINFER_CHECK(num_qo_heads >= 1 && num_qo_heads <= 4096, op, qo_arg,
                   "must be in [1, 4096], got ", num_qo_heads);
  FLASHINFER_CHECK(num_kv_heads >= 1, op, kv_arg, "must be >= 1, got ", num_kv_heads);
  FLASHINFER_CHECK(num_qo_heads % num_kv_heads == 0, op, kv_arg, "num_qo_heads (", num_qo_heads,
                   ") must be a multiple of num_kv_heads (", num_kv_heads, ")");
}

void check_head_dim(int64_t head_dim, const char* op, const char* arg) {
  // 64/128/256 are built ahead of time on CUDA; any other multiple of 16 up to 256 is compiled
  // on first use (docs/JIT.md); the CPU reference takes them all.
  FLASHINFER_CHECK_CODE(head_dim >= 16 && head_dim <= 256 && head_dim % 16 == 0,
                        ErrorCode::kUnsupported, op, arg, "head_dim ", head_dim,
                        " is not supported (a multiple of 16 up to 256)");
}

void check_single_qkv(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_dim,
                      const char* op) {
  check_defined(q, op, "q");
  check_defined(k, op, "k");
  check_defined(v, op, "v");
  check_dim(q, {q_dim}, op, "q");
  check_dim(k, {3}, op, "k");
  check_dim(v, {3}, op, "v");
}

void check_pos_encoding(std::string_view mode, const char* op) {
  if (mode == "NONE") return;
  if (mode == "ROPE_LLAMA" || mode == "ALIBI") {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "pos_encoding_mode", "\"", mode,
                    "\" is not implemented for this op (only the single and batch decode / "
                    "prefill ops take it); apply RoPE with the rope ops before attention");
  }
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "pos_encoding_mode",
                  "must be \"NONE\", \"ROPE_LLAMA\" or \"ALIBI\", got \"", mode, "\"");
}

void check_q_dtype(DType d, const char* op, const char* arg) {
  FLASHINFER_CHECK(d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kFloat32, op, arg,
                   "dtype ", dtype_torch_name(d), " is not supported (float16, bfloat16, float32)");
}

void check_kv_dtype(DType d, DType q, const char* op, const char* arg) {
  FLASHINFER_CHECK(d == q || dtype_is_fp8(d), op, arg, "dtype ", dtype_torch_name(d),
                   " must be q's dtype (", dtype_torch_name(q), ") or an fp8 dtype");
}

AppendTargets load_append_targets(detail::WrapperState& s, const Tensor& batch_indices,
                                  const Tensor& positions, const Tensor& kv_indices,
                                  const Tensor& kv_indptr, const Tensor& kv_last_page_len,
                                  int64_t num_pages, int64_t page_size, int64_t nnz,
                                  const char* op) {
  load_page_table(s, kv_indptr, kv_indices, kv_last_page_len, page_size, op, "kv_indptr",
                  "kv_indices", "kv_last_page_len");
  FLASHINFER_CHECK(s.max_page_id < num_pages, op, "kv_indices", "refers to page ", s.max_page_id,
                   " but the cache has ", num_pages, " pages");
  AppendTargets t{index_to_host(batch_indices, op, "batch_indices", nnz),
                  index_to_host(positions, op, "positions", nnz)};
  const auto& bi = t.batch_indices;
  const auto& pos = t.positions;
  const auto batch = static_cast<int64_t>(s.kv_lens.size());
  for (int64_t i = 0; i < nnz; ++i) {
    FLASHINFER_CHECK(bi[i] >= 0 && bi[i] < batch, op, "batch_indices", "element ", i, " (", bi[i],
                     ") is outside [0, ", batch, ")");
    FLASHINFER_CHECK(pos[i] >= 0 && pos[i] < s.kv_lens[bi[i]], op, "positions", "element ", i, " (",
                     pos[i], ") is outside request ", bi[i], "'s length ", s.kv_lens[bi[i]]);
  }
  return t;
}

void load_append_index_arrays(AppendIndexArrays& a, const Tensor& batch_indices,
                              const Tensor& positions, const Tensor& kv_indices,
                              const Tensor& kv_indptr, const Tensor& kv_last_page_len,
                              int64_t num_pages, int64_t page_size, int64_t nnz, const char* op) {
  kernels::AppendTable& t = a.table;
  t.num_pages = num_pages;
  if (kv_indptr.device().is_cpu()) {
    a.targets = load_append_targets(a.host, batch_indices, positions, kv_indices, kv_indptr,
                                    kv_last_page_len, num_pages, page_size, nnz, op);
    const detail::WrapperState& s = a.host;
    const auto batch = static_cast<int64_t>(s.kv_lens.size());
    a.last_page_len.assign(static_cast<std::size_t>(batch), 0);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t pages = s.kv_indptr[b + 1] - s.kv_indptr[b];
      if (pages > 0)
        a.last_page_len[b] = static_cast<int32_t>(s.kv_lens[b] - (pages - 1) * page_size);
    }
    t.kv_indptr = s.kv_indptr.data();  // rebased to 0, with kv_indices sliced to match
    t.kv_indices = s.kv_indices.data();
    t.kv_last_page_len = a.last_page_len.data();
    t.batch_indices = a.targets.batch_indices.data();
    t.positions = a.targets.positions.data();
    t.batch = batch;
    t.num_indices = static_cast<int64_t>(s.kv_indices.size());
    t.page_size = static_cast<int32_t>(page_size);
    return;
  }
  FLASHINFER_CHECK(page_size >= 1 && page_size <= (1 << 20), op, "page_size",
                   "must be in [1, 2^20], got ", page_size);
  auto dense = [&](const Tensor& x, const char* arg, int64_t expected_len) -> const int32_t* {
    check_index_tensor(x, op, arg, expected_len);
    FLASHINFER_CHECK(x.device() == kv_indptr.device(), op, arg, "is on ", x.device().str(),
                     " but kv_indptr is on ", kv_indptr.device().str());
    a.dense.push_back(x.contiguous());
    return a.dense.back().numel() > 0 ? a.dense.back().data<const int32_t>() : nullptr;
  };
  a.dense.reserve(5);
  t.kv_indptr = dense(kv_indptr, "kv_indptr", -1);
  FLASHINFER_CHECK(kv_indptr.size(0) >= 1, op, "kv_indptr", "needs batch_size + 1 >= 1 elements");
  t.batch = kv_indptr.size(0) - 1;
  t.kv_indices = dense(kv_indices, "kv_indices", -1);
  t.num_indices = kv_indices.size(0);
  t.kv_last_page_len = dense(kv_last_page_len, "kv_last_page_len", t.batch);
  t.batch_indices = dense(batch_indices, "batch_indices", nnz);
  t.positions = dense(positions, "positions", nnz);
  t.page_size = static_cast<int32_t>(page_size);
}

namespace {

// load_page_table's live ids (WrapperState::live_indices): the tensor run() reads the ids from,
// or undefined where plan copies them. Under use_cuda_graph the constructor's device buffer (the
// captured kernels' source), into which plan copies `indices` whole as upstream's plan does;
// else, with FLASHINFER_PAGE_IDS_AT_RUN=1, `indices` itself, on the wrapper's device. Eager calls
// keep the host copy by default: the guard's two launches a run are not timed on a GPU yet,
// against a plan's synchronization they save (docs/ATTENTION.md, "Page ids read at run").
Tensor live_page_ids(detail::WrapperState& s, const Tensor& indices, int64_t end, const char* op,
                     const char* indices_arg) {
  if (!s.device.is_cuda() || s.sizing_only || !kernels::page_guard_output_ok(s.o_dtype) ||
      s.kv_dtype == DType::kUInt8 ||
      (!s.use_cuda_graph && !detail::env_switch_is("FLASHINFER_PAGE_IDS_AT_RUN", "1"))) {
    return {};
  }
  check_index_tensor(indices, op, indices_arg);
  FLASHINFER_CHECK(indices.numel() >= end, op, indices_arg, "has ", indices.numel(),
                   " elements but the page table ends at ", end);
  if (s.use_cuda_graph) {
    Tensor& buf = s.graph_indices;
    if (!buf.defined()) return {};
    FLASHINFER_CHECK(indices.numel() <= buf.numel(), op, indices_arg, "has ", indices.numel(),
                     " elements; under use_cuda_graph plan copies them into the constructor's "
                     "page-index buffer, of ",
                     buf.numel());
    // Copied at the end of an accepted plan (build_plan), so a refused plan leaves the buffer a
    // captured graph reads as it was.
    s.graph_ids_src = indices;
    return buf;
  }
  return indices.device() == s.device && indices.is_contiguous() ? indices : Tensor();
}

}  // namespace

int64_t page_id_count(const detail::WrapperState& s) {
  return s.kv_indptr.empty() ? 0 : s.kv_indptr.back();
}

bool graph_index_buffer_usable(const Tensor& t, Device device) {
  return t.defined() && t.device() == device && t.dtype() == DType::kInt32 && t.dim() == 1 &&
         t.is_contiguous();
}

void copy_into_graph_buffer(const Tensor& buf, const Tensor& src) {
  if (src.numel() == 0 || src.data_ptr() == buf.data_ptr()) return;
  Tensor dst = buf.slice(0, 0, src.numel());
  dst.copy_(src);
}

void load_page_table(detail::WrapperState& s, const Tensor& indptr, const Tensor& indices,
                     const Tensor& last_page_len, int64_t page_size, const char* op,
                     const char* indptr_arg, const char* indices_arg, const char* last_arg,
                     bool live_ids) {
  FLASHINFER_CHECK(page_size >= 1 && page_size <= (1 << 20), op, "page_size",
                   "must be in [1, 2^20], got ", page_size);
  s.kv_indptr = index_to_host(indptr, op, indptr_arg);
  s.indices_arg = indices_arg;
  // Request b owns indices[indptr[b]:indptr[b + 1]]; the first entry need not be 0 (vLLM passes
  // a slice of the whole batch's indptr), so the table is rebased to start at 0.
  const int32_t base = s.kv_indptr.empty() ? 0 : s.kv_indptr[0];
  FLASHINFER_CHECK(base >= 0, op, indptr_arg, "must not start below 0, got ", base);
  for (std::size_t i = 1; i < s.kv_indptr.size(); ++i) {
    FLASHINFER_CHECK(s.kv_indptr[i] >= s.kv_indptr[i - 1], op, indptr_arg,
                     "must be non-decreasing: element ", i, " (", s.kv_indptr[i], ") < element ",
                     i - 1, " (", s.kv_indptr[i - 1], ")");
  }
  for (int32_t& x : s.kv_indptr) x -= base;  // cannot overflow: base <= x
  check_indptr(s.kv_indptr, op, indptr_arg);
  const auto batch = static_cast<int64_t>(s.kv_indptr.size()) - 1;
  const int64_t end = static_cast<int64_t>(base) + s.kv_indptr.back();
  const std::vector<int32_t> last = index_to_host(last_page_len, op, last_arg, batch);
  s.max_page_id = -1;
  s.kv_indices.clear();
  s.graph_ids_src = Tensor();
  s.live_indices = live_ids ? live_page_ids(s, indices, end, op, indices_arg) : Tensor();
  // Under use_cuda_graph a captured graph holds the first plan's choice (its guard kernels read
  // the constructor's buffer): a re-plan that would change it is refused.
  if (s.use_cuda_graph && s.device.is_cuda() && !s.sizing_only && s.graph_batch >= 0) {
    FLASHINFER_CHECK(s.live_indices.defined() == s.graph_live_ids, op, indices_arg,
                     "under use_cuda_graph the first plan fixed whether the page ids are read at "
                     "run (its dtypes and the constructor's buffer decide it); this plan differs");
  }
  s.live_base = base;
  if (!s.live_indices.defined()) {
    s.kv_indices = index_to_host(indices, op, indices_arg);
    FLASHINFER_CHECK(static_cast<int64_t>(s.kv_indices.size()) >= end, op, indices_arg, "has ",
                     s.kv_indices.size(), " elements but ", indptr_arg, " ends at ", end);
    s.kv_indices.assign(s.kv_indices.begin() + base, s.kv_indices.begin() + end);
    for (std::size_t i = 0; i < s.kv_indices.size(); ++i) {
      FLASHINFER_CHECK(s.kv_indices[i] >= 0, op, indices_arg, "page id ", s.kv_indices[i], " at ",
                       i, " is negative");
      s.max_page_id = std::max<int64_t>(s.max_page_id, s.kv_indices[i]);
    }
  }
  s.kv_lens.assign(static_cast<std::size_t>(batch), 0);
  int64_t total = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = s.kv_indptr[b + 1] - s.kv_indptr[b];
    // No pages, no keys, whatever last_page_len says (upstream's paged_kv_t::get_length): vLLM
    // pads a CUDA graph's batch with such requests and last_page_len 1 ("flashinfer treats 0 as
    // a full page").
    if (pages == 0) continue;
    FLASHINFER_CHECK(last[b] >= 1 && last[b] <= page_size, op, last_arg, "element ", b, " (",
                     last[b], ") is outside [1, page_size=", page_size, "]");
    const int64_t len = (pages - 1) * page_size + last[b];
    FLASHINFER_CHECK(len <= std::numeric_limits<int32_t>::max(), op, indptr_arg, "request ", b,
                     " is longer than 2^31 - 1 tokens");
    s.kv_lens[b] = static_cast<int32_t>(len);
    total += len;
  }
  s.total_kv = total;
  s.page_size = static_cast<int32_t>(page_size);
  s.paged = true;
}

void check_seq_lens(const detail::WrapperState& s, const std::optional<Tensor>& seq_lens,
                    const char* op) {
  if (!seq_lens) return;
  const std::vector<int32_t> lens =
      index_to_host(*seq_lens, op, "seq_lens", static_cast<int64_t>(s.kv_lens.size()));
  for (std::size_t b = 0; b < lens.size(); ++b) {
    FLASHINFER_CHECK(lens[b] == s.kv_lens[b], op, "seq_lens", "element ", b, " is ", lens[b],
                     " but the page table (indptr and last_page_len) gives request ", b, " ",
                     s.kv_lens[b], " tokens");
  }
}

std::pair<Tensor, Tensor> split_paged_cache(const PagedKVCache& cache, bool hnd, const char* op,
                                            const char* arg, bool page_size_one_forms) {
  Tensor k, v;
  // Upstream's _unpack_paged_kv_cache also takes page size 1 without its axis: a pair of 3-D
  // [tokens, H, D] tensors (SGLang's token-granular K/V pools, every MHA layer) or a 4-D
  // [tokens, 2, H, D] tensor; the page axis goes in as 1 (before H for NHD, after it for HND).
  const int64_t page_axis = hnd ? 2 : 1;
  if (cache.is_pair()) {
    k = cache.first();
    v = cache.second();
    check_defined(k, op, arg);
    check_defined(v, op, arg);
    if (page_size_one_forms && k.dim() == 3 && v.dim() == 3) {
      k = k.unsqueeze(page_axis);
      v = v.unsqueeze(page_axis);
    }
    FLASHINFER_CHECK(
        k.dim() == 4 && v.dim() == 4, op, arg, "(k_cache, v_cache) must be 4-D tensors",
        page_size_one_forms ? " (or 3-D at page size 1)" : "", ", got ",
        shape_to_string(cache.first().shape()), " and ", shape_to_string(cache.second().shape()));
  } else {
    Tensor kv = cache.first();
    check_defined(kv, op, arg);
    if (page_size_one_forms && kv.dim() == 4) kv = kv.unsqueeze(page_axis + 1);
    FLASHINFER_CHECK(
        kv.dim() == 5 && kv.size(1) == 2, op, arg, "expected a 5-D tensor [pages, 2, ...]",
        page_size_one_forms ? " (or 4-D at page size 1)" : "",
        " or a (k_cache, v_cache) pair, got shape ", shape_to_string(cache.first().shape()));
    k = kv.select(1, 0);
    v = kv.select(1, 1);
  }
  return {k, v};
}

std::pair<Tensor, Tensor> paged_cache_views(const PagedKVCache& cache, bool hnd, const char* op,
                                            const char* arg, bool page_size_one_forms) {
  auto [k, v] = split_paged_cache(cache, hnd, op, arg, page_size_one_forms);
  if (cache.is_pair()) {
    FLASHINFER_CHECK(k.dtype() == v.dtype(), op, arg, "k_cache and v_cache dtypes differ");
    FLASHINFER_CHECK(k.device() == v.device(), op, arg, "k_cache and v_cache devices differ");
    FLASHINFER_CHECK(k.size(0) == v.size(0) && k.size(1) == v.size(1) && k.size(2) == v.size(2), op,
                     arg, "k_cache ", shape_to_string(k.shape()), " and v_cache ",
                     shape_to_string(v.shape()), " disagree");
  }
  if (hnd) {
    k = k.permute({0, 2, 1, 3});
    v = v.permute({0, 2, 1, 3});
  }
  FLASHINFER_CHECK(k.stride(3) == 1 && v.stride(3) == 1, op, arg,
                   "the head_dim axis must be contiguous (stride 1)");
  return {k, v};
}

namespace {

// Request b's qo_len * kv_len mask bits.
int64_t mask_bits(const detail::WrapperState& s, std::size_t b) {
  return static_cast<int64_t>(s.qo_indptr[b + 1] - s.qo_indptr[b]) * s.kv_lens[b];
}

// The custom mask's layout (upstream's segment_packbits): each request's qo_len * kv_len bits
// from a byte boundary, little-endian bit order; s.mask_indptr[b] is request b's first bit.
// Sizes s.packed_mask (zeros) and s.mask_indptr.
void lay_out_mask(detail::WrapperState& s) {
  const auto batch = static_cast<std::size_t>(s.batch);
  s.mask_indptr.resize(batch);
  int64_t bytes = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    s.mask_indptr[b] = bytes * 8;
    bytes += (mask_bits(s, b) + 7) / 8;
  }
  s.packed_mask.assign(static_cast<std::size_t>(bytes), 0);
}

}  // namespace

void load_custom_mask(detail::WrapperState& s, const std::optional<Tensor>& custom_mask,
                      const std::optional<Tensor>& packed_custom_mask, const char* op) {
  s.packed_mask.clear();
  s.mask_indptr.clear();
  s.item_bounds.clear();
  s.item_rows.clear();
  if (!custom_mask && !packed_custom_mask) return;
  const auto batch = static_cast<std::size_t>(s.batch);
  lay_out_mask(s);
  if (custom_mask) {
    const Tensor& m = *custom_mask;
    check_defined(m, op, "custom_mask");
    FLASHINFER_CHECK(m.dtype() == DType::kBool, op, "custom_mask", "expected torch.bool, got ",
                     dtype_torch_name(m.dtype()));
    int64_t total = 0;
    for (std::size_t b = 0; b < batch; ++b) total += mask_bits(s, b);
    FLASHINFER_CHECK(m.numel() == total, op, "custom_mask", "expected ", total,
                     " elements (sum of qo_len * kv_len), got ", m.numel());
    const Tensor h = m.to(Device::cpu()).contiguous();
    const auto* src = static_cast<const uint8_t*>(h.data_ptr());
    int64_t k = 0;
    for (std::size_t b = 0; b < batch; ++b) {
      const int64_t n = mask_bits(s, b), bit0 = s.mask_indptr[b];
      for (int64_t i = 0; i < n; ++i, ++k) {
        const int64_t bit = bit0 + i;
        if (src[k]) s.packed_mask[bit >> 3] |= static_cast<uint8_t>(1u << (bit & 7));
      }
    }
  } else {
    const Tensor& m = *packed_custom_mask;
    check_defined(m, op, "packed_custom_mask");
    FLASHINFER_CHECK(m.dtype() == DType::kUInt8, op, "packed_custom_mask",
                     "expected torch.uint8, got ", dtype_torch_name(m.dtype()));
    const auto bytes = static_cast<int64_t>(s.packed_mask.size());
    FLASHINFER_CHECK(m.numel() == bytes, op, "packed_custom_mask", "expected ", bytes,
                     " bytes (each request's qo_len * kv_len bits rounded up to "
                     "whole bytes), got ",
                     m.numel());
    const Tensor h = m.to(Device::cpu()).contiguous();
    if (!s.packed_mask.empty())
      std::memcpy(s.packed_mask.data(), h.data_ptr(), s.packed_mask.size());
  }
  s.causal = false;  // a custom mask overrides causal, as upstream
}

namespace {

// An index tensor's values as unsigned integers of its width (upstream passes torch.uint16 /
// torch.uint32 tensors; they load here as int16 / int32 holding the same bits), on the host.
std::vector<uint64_t> unsigned_values_to_host(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  const DType dt = t.dtype();
  FLASHINFER_CHECK(
      dt == DType::kInt16 || dt == DType::kInt32 || dt == DType::kInt64 || dt == DType::kUInt8, op,
      arg,
      "expected an unsigned index tensor (torch.uint16 / torch.uint32, read here as "
      "int16 / int32 bits, or int64), got ",
      dtype_torch_name(dt));
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<uint64_t> v(static_cast<std::size_t>(h.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kInt16) {
      v[i] = static_cast<uint16_t>(h.data<int16_t>()[i]);
    } else if (dt == DType::kInt32) {
      v[i] = static_cast<uint32_t>(h.data<int32_t>()[i]);
    } else if (dt == DType::kInt64) {
      FLASHINFER_CHECK(h.data<int64_t>()[i] >= 0, op, arg, "holds a negative value ",
                       h.data<int64_t>()[i]);
      v[i] = static_cast<uint64_t>(h.data<int64_t>()[i]);
    } else {
      v[i] = h.data<uint8_t>()[i];
    }
  }
  return v;
}

}  // namespace

void load_multi_item_mask(detail::WrapperState& s, const std::optional<Tensor>& prefix_len_ptr,
                          const std::optional<Tensor>& token_pos_in_items_ptr,
                          int64_t token_pos_in_items_len,
                          const std::optional<Tensor>& max_item_len_ptr, const char* op) {
  s.item_bounds.clear();
  s.item_rows.clear();
  if (!prefix_len_ptr) {
    FLASHINFER_CHECK(!token_pos_in_items_ptr && !max_item_len_ptr && token_pos_in_items_len == 0,
                     op, "prefix_len_ptr",
                     "is required with token_pos_in_items_ptr, token_pos_in_items_len and "
                     "max_item_len_ptr (multi-item scoring)");
    return;
  }
  FLASHINFER_CHECK(token_pos_in_items_ptr.has_value(), op, "token_pos_in_items_ptr",
                   "is required with prefix_len_ptr (multi-item scoring)");
  FLASHINFER_CHECK(max_item_len_ptr.has_value(), op, "max_item_len_ptr",
                   "is required with prefix_len_ptr (multi-item scoring)");
  FLASHINFER_CHECK(token_pos_in_items_len >= 0, op, "token_pos_in_items_len", "must be >= 0, got ",
                   token_pos_in_items_len);
  // The rows live with the plan, a pair a query: under a CUDA graph a captured kernel would read
  // the first plan's array, which a later plan of more queries outgrows (upstream's graph mode
  // reads the caller's tensors in place; SGLang's scoring does not capture).
  FLASHINFER_CHECK_CODE(!(s.use_cuda_graph && s.device.is_cuda()), ErrorCode::kUnsupported, op,
                        "prefix_len_ptr",
                        "multi-item scoring is not supported under use_cuda_graph here");
  const auto batch = static_cast<std::size_t>(s.batch);
  const std::vector<uint64_t> prefix =
      unsigned_values_to_host(*prefix_len_ptr, op, "prefix_len_ptr");
  const std::vector<uint64_t> pos =
      unsigned_values_to_host(*token_pos_in_items_ptr, op, "token_pos_in_items_ptr");
  const std::vector<uint64_t> max_item =
      unsigned_values_to_host(*max_item_len_ptr, op, "max_item_len_ptr");
  // Upstream's kernels read the first `batch` entries of each.
  FLASHINFER_CHECK(prefix.size() >= batch, op, "prefix_len_ptr", "must hold one length a request (",
                   batch, "), got ", prefix.size());
  FLASHINFER_CHECK(max_item.size() >= batch, op, "max_item_len_ptr",
                   "must hold one length a request (", batch, "), got ", max_item.size());
  const auto len = static_cast<uint64_t>(token_pos_in_items_len);
  FLASHINFER_CHECK(pos.size() >= batch * len, op, "token_pos_in_items_ptr", "must hold ",
                   batch * len, " entries (token_pos_in_items_len a request), got ", pos.size());
  // Upstream's mode replaces any custom mask; the rows below stand in for its bits.
  s.packed_mask.clear();
  s.mask_indptr.clear();
  constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
  // The kernels' bounds (AttentionParams::multi_item_bounds): past kv_len (< 2^31), any value
  // skips the same keys.
  std::vector<int32_t> bounds(2 * batch);
  for (std::size_t b = 0; b < batch; ++b) {
    bounds[2 * b] = static_cast<int32_t>(std::min<uint64_t>(prefix[b], kI32Max));
    bounds[2 * b + 1] = static_cast<int32_t>(std::min<uint64_t>(max_item[b], kI32Max));
  }
  // Each query row's keys as AttentionParams::multi_item_rows holds them: [0, a) and [lo, q].
  std::vector<int32_t> rows(2 * static_cast<std::size_t>(s.qo_indptr[batch]));
  for (std::size_t b = 0; b < batch; ++b) {
    const int64_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b], kv_len = s.kv_lens[b];
    // A prefix past 2^62 keeps every query in it (the arithmetic below stays in int64).
    const auto p = static_cast<int64_t>(std::min<uint64_t>(prefix[b], uint64_t{1} << 62));
    const uint64_t* item_pos = pos.data() + b * len;
    // FA2's logits_mask_multi_item_scoring: query i sits at q = kv_len - qo_len + i and sees
    // keys j <= q; a query in the prefix (q < prefix_len) sees them all, one inside the items
    // only the prefix and the keys (q - t, q] of its own item, t = token_pos_in_items[q -
    // prefix_len] (0 for a delimiter, which sees the prefix only). The sliding window is the
    // kernels' (they apply window_left to these rows too).
    for (int64_t i = 0; i < qo_len; ++i) {
      const int64_t q = kv_len - qo_len + i;
      int64_t a = 0, lo = kI32Max;  // q < 0, before the sequence: sees nothing
      if (q >= 0 && q < p) {
        a = q + 1;
      } else if (q >= p) {
        FLASHINFER_CHECK(static_cast<uint64_t>(q - p) < len, op, "token_pos_in_items_len",
                         "request ", b, "'s token at position ", q, " is past its ", len,
                         " entries of token_pos_in_items_ptr (prefix_len ", p, ")");
        const auto t = static_cast<int64_t>(item_pos[q - p]);
        // Upstream's kernels skip the key tiles below a tile's first query less max_item_len:
        // safe while t <= max_item_len + 1 (the own item's first key is q - t + 1).
        FLASHINFER_CHECK(static_cast<uint64_t>(t) <= max_item[b] + 1, op, "max_item_len_ptr",
                         "request ", b, "'s max_item_len ", max_item[b],
                         " is below a token_pos_in_items entry (", t,
                         "): upstream's kernels would skip keys the token sees");
        a = p;
        lo = std::max(p, q - t + 1);
      }
      const auto r = static_cast<std::size_t>(s.qo_indptr[b] + i);
      rows[2 * r] = static_cast<int32_t>(a);  // a <= q + 1 <= kv_len
      rows[2 * r + 1] = static_cast<int32_t>(lo);
    }
  }
  s.item_rows = std::move(rows);
  s.item_bounds = std::move(bounds);
  s.causal = false;  // the rows hold the causal rule, as upstream's mask mode does
}

namespace {

int64_t attention_common_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The keys of the K/V tile a tensor-core prefill chunk spans whole: the FA2 kernel's tile for
// the blocks it launches for `packed_rows` rows (fp8 K/V: no 128-row block) and, where the Hopper
// kernel's blocks of `hopper_wg` warpgroups run the plan (hopper_wg > 0), the least common
// multiple with the Hopper kernel's.
int64_t prefill_chunk_tile(int64_t packed_rows, int dqk, int dvo, int variant, int hopper_wg,
                           bool fp8_kv = false) {
  namespace pf = kernels::cuda::prefill;
  int64_t tile = pf::prefill_kv_tile(
      pf::prefill_launch_cta_rows(static_cast<int>(packed_rows), dqk, dvo, variant, fp8_kv), dqk,
      dvo);
  if (hopper_wg > 0) tile = std::lcm(tile, int64_t{pf::prefill_sm90_kv_tile(dqk, dvo, hopper_wg)});
  return tile;
}

}  // namespace

int64_t round_kv_chunk_to_tiles(int64_t chunk, int64_t unit, int64_t tile) {
  if (chunk <= 0 || unit <= 0 || tile <= 0 || tile % unit != 0) return chunk;
  const int64_t per_tile = tile / unit;  // units a tile
  return attention_common_ceil_div(chunk, per_tile) * per_tile;
}

namespace {

// Blocks of the tensor-core (FA2) prefill kernel an SM runs at once: its tiles are sized for two.
constexpr int64_t kTensorCoreBlocksPerSm = 2;

// Total work items if every request's KV is cut into chunks of `chunk` units.
int64_t count_work(const std::vector<int64_t>& tiles, const std::vector<int64_t>& units,
                   int64_t chunk) {
  int64_t n = 0;
  for (std::size_t b = 0; b < tiles.size(); ++b) {
    n += tiles[b] * std::max<int64_t>(1, attention_common_ceil_div(units[b], chunk));
  }
  return n;
}

// Every request's queries in tiles of rows_per_tile; with chunk_units > 0, each tile's keys in
// chunks of chunk_units units (of `unit` keys: pages, or tokens) with a partial row per query and
// chunk and a merge entry per query; requests of one chunk stay final.
kernels::AttentionPlan partition(const int32_t* qo_indptr, const int32_t* kv_lens,
                                 const std::vector<int64_t>& units, int64_t rows_per_tile,
                                 int64_t chunk_units, int64_t unit) {
  kernels::AttentionPlan plan;
  plan.cta_tile_q = static_cast<int32_t>(rows_per_tile);
  for (int32_t b = 0; b < static_cast<int32_t>(units.size()); ++b) {
    const int64_t qo_len = qo_indptr[b + 1] - qo_indptr[b];
    const int64_t kv_len = kv_lens[b];
    const int64_t chunks =
        chunk_units > 0 ? std::max<int64_t>(1, attention_common_ceil_div(units[b], chunk_units))
                        : 1;
    for (int64_t q0 = 0; q0 < qo_len; q0 += rows_per_tile) {
      const int64_t q1 = std::min(qo_len, q0 + rows_per_tile);
      if (chunks == 1) {
        plan.work.push_back({b, static_cast<int32_t>(q0), static_cast<int32_t>(q1), 0,
                             static_cast<int32_t>(kv_len), -1});
        continue;
      }
      plan.split_kv = true;
      std::vector<int64_t> bases;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t k0 = c * chunk_units * unit;
        const int64_t k1 = std::min(kv_len, (c + 1) * chunk_units * unit);
        bases.push_back(plan.num_partial_rows);
        plan.work.push_back({b, static_cast<int32_t>(q0), static_cast<int32_t>(q1),
                             static_cast<int32_t>(k0), static_cast<int32_t>(k1),
                             static_cast<int32_t>(plan.num_partial_rows)});
        plan.num_partial_rows += q1 - q0;
      }
      for (int64_t i = q0; i < q1; ++i) {
        for (int64_t base : bases) plan.merge_rows.push_back(static_cast<int32_t>(base + i - q0));
        plan.merge_indptr.push_back(static_cast<int32_t>(plan.merge_rows.size()));
        plan.merge_out_row.push_back(static_cast<int32_t>(qo_indptr[b] + i));
      }
    }
  }
  if (plan.split_kv) plan.kv_chunk_size = static_cast<int32_t>(chunk_units * unit);
  return plan;
}

// Queries per work item of a prefill: upstream's cta_tile_q from the batch's average packed
// (GQA heads folded into rows) query length, over the group.
int64_t prefill_rows_per_tile(int64_t total_qo, int32_t batch, int32_t group, int32_t head_dim_vo) {
  const double avg_packed = batch > 0 ? static_cast<double>(total_qo) * group / batch : 0.0;
  const int64_t cta_tile_q =
      kernels::cuda::prefill::prefill_plan_cta_tile_q(avg_packed, head_dim_vo);
  return std::max<int64_t>(1, cta_tile_q / group);
}

}  // namespace

int64_t plan_kv_chunk(const std::vector<int64_t>& tiles, const std::vector<int64_t>& units,
                      int64_t num_kv_heads, int64_t max_grid, int64_t min_chunk) {
  int64_t base_work = 0, max_units = 1;
  for (std::size_t b = 0; b < tiles.size(); ++b) {
    base_work += tiles[b];
    max_units = std::max(max_units, units[b]);
  }
  if (base_work * num_kv_heads >= max_grid) return 0;  // the device is full without a split
  const int64_t budget = std::max<int64_t>(1, max_grid / num_kv_heads);
  int64_t lo = min_chunk, hi = std::max(min_chunk, max_units);
  while (lo < hi) {  // smallest chunk whose work fits the grid
    const int64_t mid = (lo + hi) / 2;
    if (count_work(tiles, units, mid) <= budget) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return count_work(tiles, units, lo) > base_work ? lo : 0;
}

int64_t tensor_core_max_grid(Device device) {
#if FLASHINFER_WITH_CUDA
  if (device.is_cuda()) {
    return kTensorCoreBlocksPerSm * static_cast<int64_t>(kernels::cuda::sm_count(device.index));
  }
#endif
  (void)device;
  return 0;
}

int64_t hopper_tall_max_grid(const kernels::AttentionParams& a, Device device) {
#if FLASHINFER_WITH_CUDA
  if (device.is_cuda()) {
    return kernels::cuda::prefill_sm90_tall_blocks_per_sm(a, device.index) *
           static_cast<int64_t>(kernels::cuda::sm_count(device.index));
  }
#endif
  (void)a;
  (void)device;
  return 0;
}

kernels::AttentionPlan one_shot_plan(const int32_t* qo_indptr, const int32_t* kv_lens,
                                     int32_t batch, int32_t group, int32_t num_kv_heads,
                                     int32_t head_dim_qk, int32_t head_dim_vo, int variant,
                                     int64_t max_grid, int32_t& max_rows, int64_t max_grid_tall) {
  max_rows = 0;
  if (batch <= 0) return {};
  const int64_t rows_per_tile =
      prefill_rows_per_tile(qo_indptr[batch] - qo_indptr[0], batch, group, head_dim_vo);
  std::vector<int64_t> tiles(static_cast<std::size_t>(batch)), units(tiles.size());
  for (int32_t b = 0; b < batch; ++b) {
    const int64_t qo_len = qo_indptr[b + 1] - qo_indptr[b];
    tiles[b] = attention_common_ceil_div(qo_len, rows_per_tile);
    units[b] = kv_lens[b];
    if (qo_len > 0)
      max_rows = static_cast<int32_t>(std::max<int64_t>(max_rows, std::min(qo_len, rows_per_tile)));
  }
  // The wrappers' rule for ragged KV (plan_kv_chunk over tokens, at least 128 a chunk), the chunk
  // then rounded up to whole K/V tiles of the block that runs the items (the FA2 kernel's, and
  // the Hopper kernel's where `tall`: their least common multiple), so that only a request's last
  // chunk ends inside a tile. Rounding up only lowers the work-item count.
  namespace pf = kernels::cuda::prefill;
  // Items the Hopper kernel's tall blocks run (more than 64 packed rows, a variant it has: plain
  // or soft-capped): its budget (one block an SM at head dims >= 128), and whole tiles of its keys.
  const bool tall = max_grid_tall > 0 && int64_t{max_rows} * group >= pf::kSm90MinPackedRows &&
                    (variant & ~pf::kPrefillSoftCap) == 0 &&
                    pf::prefill_sm90_dim_built(head_dim_qk, head_dim_vo, 2);
  if (max_grid > 0 && tall) max_grid = max_grid_tall;
  int64_t chunk = max_grid > 0 ? plan_kv_chunk(tiles, units, num_kv_heads, max_grid, 128) : 0;
  chunk = round_kv_chunk_to_tiles(chunk, 1,
                                  prefill_chunk_tile(int64_t{max_rows} * group, head_dim_qk,
                                                     head_dim_vo, variant, tall ? 2 : 0));
  kernels::AttentionPlan plan = partition(qo_indptr, kv_lens, units, rows_per_tile, chunk, 1);
  plan.partial_rows_capacity = plan.num_partial_rows;
  return plan;
}

RaggedDeviceGrid ragged_device_grid(kernels::BlockTablePlan& bp, int32_t group,
                                    int32_t num_kv_heads, int32_t head_dim_qk, int32_t head_dim_vo,
                                    int64_t max_grid, int64_t max_grid_tall, const char* op,
                                    int variant, int64_t partial_bytes_cap) {
  namespace pf = kernels::cuda::prefill;
  constexpr int64_t kMinChunk = 128;  // one_shot_plan's floor
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  RaggedDeviceGrid g;
  bp.compact = true;
  bp.num_chunks = 1;
  bp.chunk_tokens = 0;
  bp.min_chunk_tokens = 1;
  bp.empty_row = -1;
  bp.tile_cap = 0;
  bp.q_len = std::max<int32_t>(bp.q_len, 0);  // the rules' tile counts take it as given
  const int64_t batch = bp.batch, q_len = bp.q_len, rows = bp.total_rows;
  if (batch <= 0) return g;
  // Tiles of the planner's height for the call's average query count (one_shot_plan's rule);
  // the largest a request's tile can be is max_q_len queries.
  const int64_t tile_rows =
      prefill_rows_per_tile(rows, static_cast<int32_t>(batch), group, head_dim_vo);
  bp.tile_rows = static_cast<int32_t>(tile_rows);
  g.max_rows = static_cast<int32_t>(std::min(q_len, tile_rows));
  // Whole tiles of every request's queries: at most max_q_len of them each, rows in all.
  const int64_t cap = std::min(batch * attention_common_ceil_div(q_len, tile_rows),
                               (rows + batch * (tile_rows - 1)) / tile_rows);
  FLASHINFER_CHECK(cap <= kInt32Max, op, "max_q_len", "more than 2^31 - 1 query tiles");
  bp.tile_cap = static_cast<int32_t>(cap);
  // Split keys where those tiles, every request max_kv_len keys long, would not fill max_grid
  // blocks (the Hopper kernel's budget where its tall blocks run them), in whole K/V tiles.
  const bool tall = max_grid_tall > 0 && int64_t{g.max_rows} * group >= pf::kSm90MinPackedRows &&
                    (variant & ~pf::kPrefillSoftCap) == 0 &&
                    pf::prefill_sm90_dim_built(head_dim_qk, head_dim_vo, 2);
  if (max_grid > 0 && tall) max_grid = max_grid_tall;
  const int64_t kv_tile = prefill_chunk_tile(int64_t{g.max_rows} * group, head_dim_qk, head_dim_vo,
                                             variant, tall ? 2 : 0);
  const int64_t worst = std::max<int64_t>(bp.max_seq_len, 0);
  int64_t chunk = max_grid > 0 && cap > 0
                      ? plan_kv_chunk({cap}, {worst}, num_kv_heads, max_grid, kMinChunk)
                      : 0;
  chunk = round_kv_chunk_to_tiles(chunk, 1, kv_tile);
  // The split's partials must fit where they go; otherwise unsplit (the same numbers, less
  // parallel), as the wrappers' planner does: the split is the bounds' worst case, which the real
  // lengths may not need.
  const int64_t heads = int64_t{group} * num_kv_heads;
  if (chunk > 0 && partial_bytes_cap >= 0 &&
      (rows * attention_common_ceil_div(worst, chunk) + 1) * heads * (head_dim_vo + 1) * 4 >
          partial_bytes_cap) {
    chunk = 0;
  }
  const int64_t chunks =
      chunk > 0 ? std::max<int64_t>(1, attention_common_ceil_div(worst, chunk)) : 1;
  FLASHINFER_CHECK(cap * chunks <= kInt32Max && (chunks == 1 || rows * chunks < kInt32Max), op,
                   "max_kv_len", "the split's work items or partial rows past the int32 range");
  g.items = cap * chunks;
  if (chunks > 1) {
    bp.num_chunks = static_cast<int32_t>(chunks);
    bp.chunk_tokens = static_cast<int32_t>(chunk);
    bp.min_chunk_tokens =
        static_cast<int32_t>(std::min(chunk, round_kv_chunk_to_tiles(kMinChunk, 1, kv_tile)));
    bp.empty_row = static_cast<int32_t>(rows * chunks);
    g.partial_rows = rows * chunks + 1;
  }
  return g;
}

BlockPlanScratch place_device_plan(kernels::BlockTablePlan& bp, const RaggedDeviceGrid& g,
                                   bool items, bool has_workspace, void* workspace,
                                   int64_t workspace_bytes, int32_t num_qo_heads,
                                   int32_t head_dim_vo, Device device, const char* op,
                                   int64_t extra_ints) {
  const int64_t batch = bp.batch, rows = bp.total_rows, nc = bp.num_chunks;
  const bool split = items && g.partial_rows > 0;
  const int64_t merges = split ? rows : 0;  // an entry a query row
  const int64_t plan_ints =
      2 * (batch + 1) + batch +
      (items ? g.items * 6 + (split ? 2 * merges + 1 + merges * nc : 0) : rows);
  const int64_t ints = plan_ints + extra_ints;
  const bool own_partials = split && !has_workspace;
  const int64_t partial_floats = split ? g.partial_rows * num_qo_heads * (head_dim_vo + 1) : 0;
  const int64_t int_bytes = (4 * (ints + 1) + 255) / 256 * 256;
  BlockPlanScratch mem = block_plan_scratch(
      device, static_cast<std::size_t>(int_bytes + (own_partials ? 4 * partial_floats : 0)), op);
  auto* base = static_cast<int32_t*>(mem.data);
  if (extra_ints > 0) mem.extra = base + plan_ints;
  bp.qo_indptr = base;
  bp.kv_indptr = bp.qo_indptr + batch + 1;
  bp.kv_lens = bp.kv_indptr + batch + 1;
  int32_t* next = bp.kv_lens + batch;
  if (!items) {
    bp.row_req = next;
    return mem;
  }
  bp.work = reinterpret_cast<kernels::WorkItem*>(next);
  if (!split) return mem;
  bp.merge_indptr = next + g.items * 6;
  bp.merge_rows = bp.merge_indptr + merges + 1;
  bp.merge_out_row = bp.merge_rows + merges * nc;
  if (own_partials) {
    bp.tmp_v = reinterpret_cast<float*>(static_cast<uint8_t*>(mem.data) + int_bytes);
    bp.tmp_s = bp.tmp_v + g.partial_rows * num_qo_heads * head_dim_vo;
  } else {
    kernels::AttentionPlan sized;  // the partials' rows, the empty state's included
    sized.num_partial_rows = g.partial_rows;
    std::tie(bp.tmp_v, bp.tmp_s) = workspace_partials(
        workspace, workspace_bytes, sized, num_qo_heads, head_dim_vo, op, "workspace_buffer");
  }
  return mem;
}

std::pair<float*, float*> workspace_partials(void* base, int64_t bytes,
                                             const kernels::AttentionPlan& plan,
                                             int32_t num_qo_heads, int32_t head_dim_vo,
                                             const char* op, const char* arg) {
  const int64_t need = plan_partial_bytes(plan, num_qo_heads, head_dim_vo);
  FLASHINFER_CHECK(base != nullptr, op, arg,
                   "must be a contiguous tensor on the inputs' device: this call splits the "
                   "keys across blocks and keeps ",
                   need, " bytes of partial results there");
  const auto addr = reinterpret_cast<std::uintptr_t>(base);
  const auto skip = static_cast<int64_t>((16 - addr % 16) % 16);
  FLASHINFER_CHECK(bytes - skip >= need, op, arg, "holds ", bytes,
                   " bytes, too few for this call's split-KV partials (", need,
                   " bytes from its first 16-byte boundary: ", plan.num_partial_rows, " rows x ",
                   num_qo_heads, " heads x (", head_dim_vo, " + 1) floats)");
  auto* v = reinterpret_cast<float*>(addr + static_cast<std::uintptr_t>(skip));
  return {v, v + plan.num_partial_rows * num_qo_heads * head_dim_vo};
}

void refill_plan_array(Tensor& dev, const Tensor& host, Device device, bool graph, const char* op,
                       const char* arg, int64_t capacity, int64_t need) {
  const int64_t n = std::max(host.numel(), need);
  const bool fits = dev.defined() && dev.dtype() == host.dtype() && dev.numel() >= n;
  if (!fits && graph && dev.defined() && dev.dtype() == host.dtype()) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, arg, "under use_cuda_graph this plan needs ",
                    n, " elements of a device array the first plan sized to ", dev.numel(),
                    " (a captured graph reads it in place); give the constructor a larger ",
                    std::string_view(arg).find("mask") != std::string_view::npos
                        ? "custom_mask_buf"
                        : "page-index buffer");
  }
  if (!fits) dev = Tensor::empty({std::max(n, capacity)}, host.dtype(), device);
  // The host array's elements only: the room past them (`need`) is each run's to fill (a copy
  // of n elements from host.numel() refused every plan that read its page ids at run).
  dev.slice(0, 0, host.numel()).copy_(host);
}

namespace {

// The plan's fields the kernels' dispatch rules read (dtypes, heads, head dims, soft cap, scale),
// as kernels::AttentionParams, for the planner to ask them which kernel and block a call gets.
[[maybe_unused]] kernels::AttentionParams plan_kernel_config(const detail::WrapperState& s) {
  kernels::AttentionParams cfg;
  cfg.q_dtype = s.q_dtype;
  cfg.o_dtype = s.o_dtype;
  cfg.kv.dtype = s.kv_dtype;
  cfg.num_qo_heads = s.num_qo_heads;
  cfg.num_kv_heads = s.num_kv_heads;
  cfg.head_dim_qk = s.head_dim_qk;
  cfg.head_dim_vo = s.head_dim_vo;
  cfg.logits_soft_cap = static_cast<float>(s.logits_soft_cap);
  cfg.sm_scale = static_cast<float>(s.sm_scale);
  return cfg;
}

// The planned call's compile-time variant bits of the tensor-core prefill kernels.
[[maybe_unused]] int plan_variant(const detail::WrapperState& s) {
  return kernels::cuda::prefill::prefill_variant_bits(
      s.logits_soft_cap > 0.0, !s.mask_indptr.empty() || !s.item_bounds.empty(),
      s.pos_encoding == 2);
}

// Whether the Hopper prefill kernel (kernels/cuda/prefill_sm90.h) would take the call if its plan
// had 128-row tiles (its tall blocks; a plan of 64-row tiles then gets its one-warpgroup blocks
// where they are built): an sm_90 device, a backend other than "fa2", and the kernel's dims,
// dtypes, variants and scale (prefill_sm90_fits). Its tiles are 128 rows at head dim 256 too, where
// the FA2 kernel's plan would have 64.
bool hopper_prefill_candidate(const detail::WrapperState& s) {
#if FLASHINFER_WITH_CUDA
  namespace pf = kernels::cuda::prefill;
  if (!s.device.is_cuda() || !detail::tensor_core_path(s) || s.backend == "fa2") return false;
  if (kernels::cuda::prefill_sm90_off_by_env()) return false;  // the FA2 kernel's plans too
  if (!kernels::cuda::prefill_sm90_built()) return false;      // a build without CUTLASS
  if (compute_capability(s.device) != 90) return false;
  // Multi-item scoring's rows: the Hopper rule's own bit (kSm90MultiItem), not a custom mask.
  const bool multi_item = !s.item_bounds.empty();
  const int dqk = static_cast<int>(s.head_dim_qk), dvo = static_cast<int>(s.head_dim_vo);
  return pf::prefill_sm90_fits(
      9, 0, pf::kSm90MinPackedRows, dqk, dvo,
      kernels::cuda::prefill_sm90_dtypes_fit(s.q_dtype, s.kv_dtype, s.o_dtype, dqk, dvo,
                                             multi_item),
      pf::prefill_sm90_variant(s.logits_soft_cap > 0.0, !s.mask_indptr.empty(), multi_item,
                               s.pos_encoding == 2),
      pf::prefill_scale_folds(static_cast<float>(s.sm_scale), s.scale_q.defined(),
                              s.scale_k.defined()),
      std::numeric_limits<long long>::max());
#else
  (void)s;
  return false;
#endif
}

}  // namespace

bool decode_tensor_cores_wanted(const detail::WrapperState& s, bool env_off) {
  // trtllm-gen: the decode wrapper runs this library's kernels for it, as for "auto".
  const bool backend = s.backend == "auto" || s.backend == "trtllm-gen";
  if (!s.decode || s.use_tensor_cores || !backend || s.pos_encoding != 0 || env_off) return false;
  const int64_t group = s.num_kv_heads > 0 ? s.num_qo_heads / s.num_kv_heads : 0;
  const int64_t packed = s.q_len_per_req * group;
  if (packed < kDecodeTensorCoreMinRows) return false;
  // Up to 16 packed rows the FA2 kernel's block is its 16-row one, which holds the group in one
  // m16 fragment: head dims up to 192, a decode's variants (prefill_cta_rows). Elsewhere (head
  // dim 256) it would be a 64-row block of 4 to 16 rows; the CUDA-core kernel keeps those.
  namespace pf = kernels::cuda::prefill;
  return packed > 16 ||
         pf::prefill_cta_rows(static_cast<int>(packed), static_cast<int>(s.head_dim_qk),
                              static_cast<int>(s.head_dim_vo), plan_variant(s)) == 16;
}

bool decode_tensor_cores_auto(const detail::WrapperState& s) {
#if FLASHINFER_WITH_CUDA
  if (!s.device.is_cuda() ||
      !decode_tensor_cores_wanted(s, kernels::cuda::decode_tensor_cores_off_by_env())) {
    return false;
  }
  // The FA2 kernel itself, not the first-draft one (JIT head dims) nor the CUDA-core fallbacks
  // of batch_attention: what the plan's dtypes, dims, soft cap and scale ask of it. A run whose
  // sinks or q_scale / k_scale the kernel does not take still falls back at run time, as
  // use_tensor_cores=True calls do.
  return kernels::cuda::prefill_fa2_takes(plan_kernel_config(s), s.device.index);
#else
  (void)s;
  return false;
#endif
}

bool decode_route_held(const detail::WrapperState& s) {
  return s.use_cuda_graph && s.device.is_cuda() && !s.sizing_only && s.graph_batch >= 0;
}

void build_plan(detail::WrapperState& s, std::optional<int64_t> fixed_split_size,
                bool disable_split_kv, const char* op) {
  // Set again at the end: a plan refused part way leaves run() refusing, not running the last
  // plan's arrays against this one's page table.
  s.planned = false;
  // A captured graph replays the ids this plan copies (from indices, or trtllm-gen's
  // block_tables) against the cache it captured, with no run() to check them: an id past it
  // would be read out of bounds (the MLA wrapper's rule too). Ids read at run: the guard's.
  FLASHINFER_CHECK(
      s.live_indices.defined() || s.graph_cache_pages < 0 || s.max_page_id < s.graph_cache_pages,
      op, s.indices_arg, "refers to page ", s.max_page_id,
      " but the cache a captured run read has ", s.graph_cache_pages,
      " pages (under use_cuda_graph a graph replays against it)");
  if (!decode_route_held(s)) s.tensor_cores_auto = decode_tensor_cores_auto(s);
  const int32_t group = s.num_qo_heads / s.num_kv_heads;
  // The Hopper kernel's tiles are upstream's for head dim 128 at every head dim it takes.
  const bool hopper = hopper_prefill_candidate(s);
  const int32_t tile_dim_vo = hopper ? std::min<int32_t>(128, s.head_dim_vo) : s.head_dim_vo;
  // Rows per work item: decode keeps a request's queries together; prefill picks upstream's
  // cta_tile_q from the average packed (GQA heads folded into rows) query length.
  int64_t rows_per_tile = s.decode ? std::max<int64_t>(1, s.q_len_per_req)
                                   : prefill_rows_per_tile(s.total_qo, s.batch, group, tile_dim_vo);
  const bool graph = s.use_cuda_graph && s.device.is_cuda() && !s.sizing_only;
  if (graph && !s.decode) {
    // Under CUDA graphs the launch (kernel, block height, grid) is captured once and replayed
    // after later plans: every plan keeps the first one's tile, chosen as upstream chooses it
    // there, for the worst case of the first plan's token count (all of it in one request), and
    // runs launch for that tile (run_planned), so the captured blocks cover any later work item.
    // A later tile picked from its own lengths could be taller than the captured blocks, whose
    // rows past them would go unwritten.
    if (s.graph_batch < 0) {
      const int64_t rows = std::max(s.total_qo, s.max_total_num_rows);
      s.graph_rows_per_tile =
          prefill_rows_per_tile(std::max<int64_t>(1, rows - s.batch + 1), 1, group, tile_dim_vo);
    }
    rows_per_tile = s.graph_rows_per_tile;
  }
  if (graph && s.decode && s.graph_batch >= 0) {
    // A decode graph captured its launch for the first plan's queries a request (the block's
    // rows): a taller plan would leave rows of o and of the partials unwritten at replay.
    FLASHINFER_CHECK(rows_per_tile == s.graph_rows_per_tile, op, "q_len_per_req",
                     "under use_cuda_graph the queries a request are fixed by the first plan (",
                     s.graph_rows_per_tile, "), got ", rows_per_tile);
  }
  const int64_t unit = s.paged ? s.page_size : 1;
  std::vector<int64_t> tiles(static_cast<std::size_t>(s.batch)), units(tiles.size());
  for (int32_t b = 0; b < s.batch; ++b) {
    tiles[b] = attention_common_ceil_div(s.qo_indptr[b + 1] - s.qo_indptr[b], rows_per_tile);
    units[b] = s.paged ? s.kv_indptr[b + 1] - s.kv_indptr[b] : s.kv_lens[b];
  }
  // Blocks the device runs at once. CUDA: the CUDA-core kernel's occupancy (from its registers
  // and the block shape's threads and shared memory) x SMs; the tensor-core kernel 2 x SMs
  // (tensor_core_max_grid), the Hopper kernel's tall blocks at head dims 128 / 256 1 x SMs. CPU:
  // threads x 2.
  int64_t max_grid;
  // Smallest KV chunk in tokens: upstream's 128, except on a GPU for the CUDA-core kernel (below:
  // decode, and the prefill calls that fall back to it), whose 128-key blocks ran 20-25 us alone
  // on an SM (H200, batch 1 x kv 512 / 2048: 0.57x-0.67x upstream) while 100 SMs idled, so chunks
  // of 32 spread such calls over the SMs; and for tensor-core decode, one K/V tile of its 16-row
  // block (below). The budget (max_grid) still caps the chunks, so calls that fill the device do
  // not change.
  int64_t min_chunk_tokens = 128;
  int64_t chunk_tile = 0;  // tokens: the auto chunk is rounded up to whole tiles of it (prefill)
#if FLASHINFER_WITH_CUDA
  if (s.device.is_cuda()) {
    int64_t per_sm = kTensorCoreBlocksPerSm;
    namespace pf = kernels::cuda::prefill;
    // The tensor-core kernels take what prefill_supported() takes: the FA2 kernel's head-dim
    // pairs (192/128 included) and equal dims, fp8 K/V only where the FA2 kernel has an fp8
    // instance (prefill_fp8_kv_built); the rest runs on the CUDA-core kernel.
    const int variant = plan_variant(s);
    const bool fp8_core = dtype_is_fp8(s.kv_dtype) &&
                          !pf::prefill_fp8_kv_built(static_cast<int>(s.head_dim_qk),
                                                    static_cast<int>(s.head_dim_vo), variant);
    const bool tc_dims =
        pf::prefill_dims_built(static_cast<int>(s.head_dim_qk), static_cast<int>(s.head_dim_vo)) ||
        s.head_dim_qk == s.head_dim_vo;
    // The run's q_scale / k_scale are not known here; the plan's scale decides. A run whose
    // scales make the product non-positive goes to the CUDA-core kernel with this plan: only its
    // sizing (max_grid, the smallest chunk) is the tensor-core kernel's, as with the other
    // run-time fallbacks (sinks, alignment).
    const bool tc_scale = pf::prefill_scale_folds(static_cast<float>(s.sm_scale),
                                                  s.scale_q.defined(), s.scale_k.defined());
    // sm_90: the Hopper kernel takes the calls whose plan gives it its blocks (prefill_sm90.h:
    // tall ones for more than 64 packed rows, one-warpgroup ones for 17 to 64); its tiles leave
    // room for prefill_sm90_min_blocks of them an SM (one tall block at head dims 128, 192 / 128
    // and 256).
    int hopper_wg = 0;  // the Hopper kernel's warpgroups a block where its blocks run the plan
    if (hopper) {
      // The launcher picks the block from the largest work item's rows (max_work_rows; under CUDA
      // graphs the plan's tile): a batch of requests shorter than the tile gets the block of
      // their length, not the tile's.
      int64_t item_rows = graph ? rows_per_tile : 0;
      for (int32_t b = 0; b < s.batch && !graph; ++b) {
        item_rows = std::max<int64_t>(
            item_rows, std::min<int64_t>(s.qo_indptr[b + 1] - s.qo_indptr[b], rows_per_tile));
      }
      const int64_t packed = item_rows * group;
      const int wg = packed >= pf::kSm90MinPackedRows        ? 2
                     : packed >= pf::kSm90MinPackedRowsSmall ? 1
                                                             : 0;
      if (wg > 0 && pf::prefill_sm90_dim_built(static_cast<int>(s.head_dim_qk),
                                               static_cast<int>(s.head_dim_vo), wg)) {
        per_sm = pf::prefill_sm90_min_blocks(static_cast<int>(s.head_dim_qk), wg);
        hopper_wg = wg;
      }
    }
    // Decode on the FA2 kernel's 16-row blocks (tensor-core decode): chunks of one K/V tile at
    // least (64 keys; 128 at head dim 64, as before), not prefill's 128. A block's partials are
    // at most 16 rows, so small chunks cost little merge work, and short calls spread over more
    // SMs, as the CUDA-core kernel's 32-token chunks did (1.4x-1.65x at batch 1 x kv 512 / 2048,
    // H200, session 31). The budget (max_grid) still sets the chunk of calls that fill the device.
    const int dqk = static_cast<int>(s.head_dim_qk), dvo = static_cast<int>(s.head_dim_vo);
    if (s.decode && detail::tensor_core_path(s) && pf::prefill_dims_built(dqk, dvo) &&
        pf::prefill_cta_rows(static_cast<int>(rows_per_tile * group), dqk, dvo, variant) == 16) {
      // Whole pages of at least a tile (the chunk is counted in pages below).
      const int64_t unit_tokens = s.paged ? s.page_size : 1;
      min_chunk_tokens =
          attention_common_ceil_div(pf::prefill_kv_tile(16, dqk, dvo), unit_tokens) * unit_tokens;
    }
    const bool cuda_core = !detail::tensor_core_path(s) || fp8_core || !tc_dims || !tc_scale;
    if (!s.decode && !cuda_core && pf::prefill_dims_built(dqk, dvo)) {
      // Prefill on tensor cores: chunks of whole K/V tiles of the block that runs them (the FA2
      // kernel's; with the Hopper kernel's, their least common multiple), as one_shot_plan's.
      chunk_tile = prefill_chunk_tile(rows_per_tile * group, dqk, dvo, variant, hopper_wg,
                                      dtype_is_fp8(s.kv_dtype));
    }
    if (cuda_core) {
      kernels::AttentionParams cfg = plan_kernel_config(s);
      cfg.max_work_rows = static_cast<int32_t>(rows_per_tile);
      cfg.causal = s.causal;
      cfg.window_left = static_cast<int32_t>(s.window_left);
      // The instance the run takes (its registers set the occupancy): the kernel's variant asks
      // whether a mask, multi-item rows or ALiBi slopes are given, not what they hold, and
      // nothing here reads them.
      static const uint8_t kMaskGiven = 0;
      static const int32_t kItemRowsGiven = 0;
      static const float kSlopesGiven = 0.0f;
      if (!s.mask_indptr.empty()) cfg.custom_mask = &kMaskGiven;
      if (!s.item_bounds.empty()) cfg.multi_item_rows = &kItemRowsGiven;
      if (s.pos_encoding == 2) cfg.alibi_slopes = &kSlopesGiven;
      per_sm = std::max(1, kernels::cuda::decode_blocks_per_sm(cfg, s.device.index));
      min_chunk_tokens = kCudaCoreDecodeMinChunkTokens;
    }
    max_grid = per_sm * static_cast<int64_t>(kernels::cuda::sm_count(s.device.index));
  } else
#endif
  {
    max_grid = 2 * static_cast<int64_t>(kernels::cpu::num_threads());
  }
  int64_t chunk = 0;  // in units (pages, or tokens for ragged); 0 = no split
  if (fixed_split_size && *fixed_split_size == -1) fixed_split_size.reset();  // upstream's "none"
  if (fixed_split_size) {
    FLASHINFER_CHECK(*fixed_split_size >= 1, op, "fixed_split_size", "must be >= 1 or -1, got ",
                     *fixed_split_size);
    if (!disable_split_kv) chunk = *fixed_split_size;
  } else if (!disable_split_kv) {
    chunk = plan_kv_chunk(tiles, units, s.num_kv_heads, max_grid,
                          std::max<int64_t>(min_chunk_tokens / unit, 1));
    chunk = round_kv_chunk_to_tiles(chunk, unit, chunk_tile);
  }
  s.plan = partition(s.qo_indptr.data(), s.kv_lens.data(), units, rows_per_tile, chunk, unit);
  // Partials must fit the float workspace; otherwise run unsplit (same numbers, less parallel).
  // Less the up to 15 bytes run() skips to the partials' 16-byte boundary (run_planned_options,
  // workspace_partials): a plan that fit only without them would fail at run time instead of
  // running unsplit.
  const int64_t have = std::max<int64_t>(
      0,
      (s.workspace_cap >= 0 ? s.workspace_cap : static_cast<int64_t>(s.float_workspace.nbytes())) -
          15);
  auto partial_bytes = [&](int64_t rows) {
    return rows * s.num_qo_heads * (s.head_dim_vo + 1) * 4;
  };
  if (graph && s.graph_batch < 0) {
    // The first plan sizes the grid every later plan of this wrapper keeps: at least what a
    // split plan can use (max_grid / KV heads) and what this one needs.
    s.graph_batch = s.batch;
    s.graph_live_ids = s.live_indices.defined();
    if (s.decode) s.graph_rows_per_tile = rows_per_tile;
    s.graph_work_cap =
        std::max<int64_t>(max_grid / std::max<int32_t>(1, s.num_kv_heads), s.plan.work.size());
    s.graph_merge_cap =
        std::max<int64_t>(std::max(s.total_qo, s.max_total_num_rows), s.plan.merge_out_row.size());
    s.graph_partial_cap = s.graph_work_cap * rows_per_tile;
    if (partial_bytes(s.graph_partial_cap) > have) s.graph_partial_cap = 0;  // never split
  }
  const int64_t partial_cap = graph ? s.graph_partial_cap : s.plan.num_partial_rows;
  // Unsplit too where the split's merged rows outgrow the first plan's grid under
  // use_cuda_graph (a prefill re-plan of more queries): unsplit, it may still fit.
  if (s.plan.split_kv &&
      (partial_bytes(s.plan.num_partial_rows) > have || s.plan.num_partial_rows > partial_cap ||
       (graph && static_cast<int64_t>(s.plan.merge_out_row.size()) > s.graph_merge_cap))) {
    s.plan = partition(s.qo_indptr.data(), s.kv_lens.data(), units, rows_per_tile, 0, unit);
  }
  s.plan.partial_rows_capacity = std::max(partial_cap, s.plan.num_partial_rows);
  s.plan.min_kv_chunk = static_cast<int32_t>(
      round_kv_chunk_to_tiles(std::max<int64_t>(min_chunk_tokens / unit, 1), unit, chunk_tile) *
      unit);
  if (graph) {
    FLASHINFER_CHECK(s.batch == s.graph_batch, op, "indptr",
                     "under use_cuda_graph the batch size is fixed by the first plan (",
                     s.graph_batch, "), got ", s.batch);
    auto& pl = s.plan;
    FLASHINFER_CHECK(static_cast<int64_t>(pl.work.size()) <= s.graph_work_cap &&
                         static_cast<int64_t>(pl.merge_out_row.size()) <= s.graph_merge_cap,
                     op, "indptr", "under use_cuda_graph a plan may not need more work items (",
                     pl.work.size(), ") than the first plan's grid (", s.graph_work_cap, ")");
    pl.work.resize(static_cast<std::size_t>(s.graph_work_cap),
                   kernels::WorkItem{-1, 0, 0, 0, 0, -1});
    const int32_t last = pl.merge_indptr.back();
    pl.merge_indptr.resize(static_cast<std::size_t>(s.graph_merge_cap) + 1, last);
    pl.merge_out_row.resize(static_cast<std::size_t>(s.graph_merge_cap), -1);
    pl.merge_rows.resize(static_cast<std::size_t>(s.graph_partial_cap), 0);
  }

  // The device copies a re-plan refills in place when they are large enough (a new buffer each
  // plan left a graph captured earlier reading the freed one): refill_plan_array.
  auto refill = [&](Tensor& dev, const Tensor& host, const char* arg, int64_t capacity = 0,
                    int64_t need = 0) {
    refill_plan_array(dev, host, s.device, graph, op, arg, capacity, need);
  };
  // A device-side plan (build_block_table_plan) is filled on the device by run().
  const bool on_device = s.device.is_cuda() && !s.sizing_only && !s.block_plan;
  if (on_device && s.pos_encoding == 2) {
    const std::vector<double> slopes(s.alibi_slopes.begin(), s.alibi_slopes.end());
    refill(s.dev_alibi,
           Tensor::from_vector(slopes, {static_cast<int64_t>(slopes.size())}, DType::kFloat32),
           "num_qo_heads");
  } else if (!graph) {  // kept under use_cuda_graph: a graph captured with ALiBi reads it
    s.dev_alibi = Tensor();
  }
  // Kept under use_cuda_graph: a graph captured with the mask reads it in place.
  if (!on_device || (s.mask_indptr.empty() && !graph)) {
    s.dev_mask = Tensor();
    s.dev_mask_indptr = Tensor();
  }
  if (!on_device || s.item_bounds.empty()) s.dev_item_bounds = Tensor();
  if (on_device) {
    std::vector<int32_t> all;
    auto append = [&](int idx, const int32_t* p, std::size_t n) {
      s.dev_off[idx] = static_cast<int64_t>(all.size());
      all.insert(all.end(), p, p + n);
    };
    // kv_indices last: under use_cuda_graph every array before it has a fixed size, so their
    // offsets (captured in a graph's kernel arguments) do not move when a re-plan has more pages.
    append(0, s.qo_indptr.data(), s.qo_indptr.size());
    append(1, s.kv_indptr.data(), s.kv_indptr.size());
    append(3, s.kv_lens.data(), s.kv_lens.size());
    append(4, reinterpret_cast<const int32_t*>(s.plan.work.data()), s.plan.work.size() * 6);
    append(5, s.plan.merge_indptr.data(), s.plan.merge_indptr.size());
    append(6, s.plan.merge_rows.data(), s.plan.merge_rows.size());
    append(7, s.plan.merge_out_row.data(), s.plan.merge_out_row.size());
    // The page guard's inputs (kernels/page_guard.h): the plan's first id in the caller's tensor
    // (indptr[0]), then a verdict a request, written by each run with live ids. Always there, so
    // that the page area's offset does not depend on the plan's ids.
    std::vector<int32_t> guard(static_cast<std::size_t>(s.batch) + 1, 0);
    guard[0] = static_cast<int32_t>(s.live_base);
    append(8, guard.data(), guard.size());
    const bool live = s.live_indices.defined();
    // Live ids are copied in by each run (kernels/page_guard.h): room only.
    append(2, s.kv_indices.data(), s.kv_indices.size());
    all.push_back(0);  // never empty
    Tensor h = Tensor::empty({static_cast<int64_t>(all.size())}, DType::kInt32);
    std::memcpy(h.data_ptr(), all.data(), all.size() * sizeof(int32_t));
    const int64_t room = graph ? s.graph_indices_buffer : live ? page_id_count(s) : 0;
    // At least 64 Ki ints, so that a wrapper's re-plans refill in place; not for a plan made
    // inside a capture (single_prefill / single_decode / POD plan each call: a captured graph
    // keeps every block allocated under it, 256 KiB a call where its arrays take a few hundred
    // bytes).
    const int64_t floor = detail::cuda_current_stream_capturing() ? 0 : int64_t{1} << 16;
    refill(s.dev_ints, h, s.indices_arg, std::max<int64_t>(floor, s.dev_off[2] + room + 1),
           live ? s.dev_off[2] + page_id_count(s) + 1 : 0);
    if (!s.mask_indptr.empty()) {
      // Whole 32-bit words (the CUDA kernels read the bits a word at a time), zero-padded.
      const auto words = static_cast<int64_t>(s.packed_mask.size() / 4 + 1);
      Tensor hm = Tensor::zeros({4 * words}, DType::kUInt8);
      std::memcpy(hm.data_ptr(), s.packed_mask.data(), s.packed_mask.size());
      // (The constructor's buffer in the same whole words: a mask that fits it fits this.)
      refill(s.dev_mask, hm, "custom_mask", graph ? 4 * (s.graph_mask_buffer / 4 + 1) : 0);
      Tensor hi = Tensor::empty({static_cast<int64_t>(s.mask_indptr.size())}, DType::kInt64);
      std::memcpy(hi.data_ptr(), s.mask_indptr.data(), s.mask_indptr.size() * sizeof(int64_t));
      refill(s.dev_mask_indptr, hi, "custom_mask");
    }
    if (!s.item_bounds.empty()) {  // never under use_cuda_graph (load_multi_item_mask)
      // The bounds, then the rows (build_params points into it).
      const std::size_t nb = s.item_bounds.size(), nr = s.item_rows.size();
      Tensor hb = Tensor::empty({static_cast<int64_t>(nb + nr)}, DType::kInt32);
      auto* dst = static_cast<int32_t*>(hb.data_ptr());
      std::memcpy(dst, s.item_bounds.data(), nb * sizeof(int32_t));
      if (nr > 0) std::memcpy(dst + nb, s.item_rows.data(), nr * sizeof(int32_t));
      refill(s.dev_item_bounds, hb, "prefix_len_ptr");
    }
  }
  // Under use_cuda_graph with live ids: plan's ids into the constructor's buffer, as upstream's
  // plan copies them, now that the plan is accepted (load_page_table's live_page_ids).
  if (s.graph_ids_src.defined()) {
    const Tensor src = s.graph_ids_src;
    s.graph_ids_src = Tensor();
    copy_into_graph_buffer(s.live_indices, src);
  }
  s.planned = true;
}

BlockPlanScratch block_plan_scratch(Device device, std::size_t bytes, const char* op) {
#if FLASHINFER_WITH_CUDA
  static kernels::cuda::StreamScratchPool pool("block-table plan scratch");
  auto lease = std::make_shared<kernels::cuda::StreamScratch>(
      pool.acquire(op, device.index, current_cuda_stream(), bytes));
  BlockPlanScratch s;
  s.data = lease->data();
  s.lease = std::move(lease);
  return s;
#else
  (void)bytes;
  FLASHINFER_FAIL(ErrorCode::kInternal, op, "", "a device-side plan on ", device.str(),
                  " (host-side bug)");
#endif
}

void launch_page_guard(const kernels::PageGuardParams& p, bool nan_rows, Device device,
                       const char* op) {
#if FLASHINFER_WITH_CUDA
  if (nan_rows) {
    launch(kPageGuardNanKernels, p, device, op, "out");
  } else {
    launch(kPageGuardCopyKernels, p, device, op, "indices");
  }
#else
  (void)p;
  (void)nan_rows;
  FLASHINFER_FAIL(ErrorCode::kInternal, op, "", "run-time page ids on ", device.str(),
                  " (host-side bug)");
#endif
}

void launch_block_table_plan(const kernels::BlockTablePlan& p, Device device, const char* op) {
#if FLASHINFER_WITH_CUDA
  launch(kBlockTablePlanKernels, p, device, op, "seq_lens");
#else
  (void)p;
  FLASHINFER_FAIL(ErrorCode::kInternal, op, "", "a device-side plan on ", device.str(),
                  " (host-side bug)");
#endif
}

void block_table_plan_table(kernels::BlockTablePlan& bp, const Tensor& block_tables, int64_t batch,
                            const char* op, Tensor& table) {
  const int64_t max_blocks = block_tables.size(1);
  table = max_blocks <= 1 || block_tables.stride(1) == 1 ? block_tables : block_tables.contiguous();
  FLASHINFER_CHECK(
      batch * std::max<int64_t>(table.stride(0), max_blocks) <= std::numeric_limits<int32_t>::max(),
      op, "block_tables", "a row offset past the int32 range");
  bp.block_tables = table.numel() > 0 ? table.data<const int32_t>() : nullptr;
  bp.table_stride = batch > 1 ? table.stride(0) : max_blocks;
  bp.max_blocks = static_cast<int32_t>(max_blocks);
}

kernels::BlockTablePlan one_shot_plan_inputs(const Tensor& seq_lens, const Tensor& cu_q,
                                             int64_t batch, int64_t rows, int64_t max_q_len,
                                             const Tensor* cu_kv, int64_t kv_rows,
                                             int64_t max_kv_len) {
  kernels::BlockTablePlan bp;
  bp.seq_lens = seq_lens.data<const int32_t>();
  bp.seq_lens_stride = seq_lens.stride(0);
  bp.batch = static_cast<int32_t>(batch);
  // A request never has more queries than the query has rows: a bound past that only grows the
  // grid.
  bp.q_len = static_cast<int32_t>(std::min(max_q_len, rows));
  bp.cu_q = cu_q.data<const int32_t>();
  bp.total_rows = rows;
  bp.cu_q_exact = true;
  bp.causal = false;  // a request may have more queries than keys (they see none)
  if (cu_kv != nullptr) {
    bp.cu_kv = cu_kv->data<const int32_t>();
    bp.kv_rows = kv_rows;
    bp.page_size = 1;
    bp.max_seq_len = static_cast<int32_t>(
        std::min({max_kv_len, kv_rows, int64_t{std::numeric_limits<int32_t>::max()}}));
    bp.max_blocks = bp.max_seq_len;
  }
  return bp;
}

kernels::BlockTablePlan block_table_plan_inputs(const Tensor& seq_lens, const Tensor& block_tables,
                                                int64_t batch, int64_t q_len, int64_t seq_lens_len,
                                                int64_t max_seq_len, int64_t page_size,
                                                int64_t num_pages, const char* op, Tensor& table) {
  check_index_tensor(seq_lens, op, "seq_lens", seq_lens_len);
  FLASHINFER_CHECK(seq_lens.size(0) >= batch, op, "seq_lens", "has ", seq_lens.size(0),
                   " elements for a batch of ", batch);
  FLASHINFER_CHECK(max_seq_len <= std::numeric_limits<int32_t>::max(), op, "max_seq_len",
                   "must fit int32, got ", max_seq_len);
  kernels::BlockTablePlan bp;
  block_table_plan_table(bp, block_tables, batch, op, table);
  FLASHINFER_CHECK(batch * q_len <= std::numeric_limits<int32_t>::max(), op, "block_tables",
                   "a row offset past the int32 range");
  bp.seq_lens = seq_lens.data<const int32_t>();
  bp.seq_lens_stride = seq_lens.stride(0);
  bp.num_pages = num_pages;
  bp.page_size = static_cast<int32_t>(page_size);
  bp.batch = static_cast<int32_t>(batch);
  bp.q_len = static_cast<int32_t>(q_len);
  bp.max_seq_len = static_cast<int32_t>(max_seq_len);
  bp.causal = q_len > 1;  // several queries of a request: its last tokens, causal among themselves
  return bp;
}

void build_block_table_plan(detail::WrapperState& s, const kernels::BlockTablePlan& in,
                            const Tensor& table, const char* op) {
  FLASHINFER_CHECK_CODE(s.device.is_cuda() && !s.use_cuda_graph && s.paged && s.batch == in.batch,
                        ErrorCode::kInternal, op, "",
                        "a device-side plan for a CPU, graph or ragged state");
  const int32_t batch = s.batch;
  const int32_t q_len = in.q_len;
  kernels::BlockTablePlan bp = in;
  s.block_plan = bp;  // build_plan copies nothing to the device
  s.block_plan_table = table;
  build_plan(s, std::nullopt, /*disable_split_kv=*/false, op);

  kernels::AttentionPlan& pl = s.plan;
  // The callers route a bound of no queries to the host plan (no grid to lay out).
  FLASHINFER_CHECK_CODE(q_len >= 1, ErrorCode::kInternal, op, "",
                        "a device-side plan for requests of no queries");
  const int32_t tile_rows = std::max<int32_t>(1, pl.cta_tile_q);
  const int64_t tiles = (q_len + tile_rows - 1) / tile_rows;
  const int64_t items = static_cast<int64_t>(pl.work.size());
  const int64_t chunks = batch > 0 ? items / (batch * tiles) : 1;
  // The worst-case partition build_plan made is the layout the rules reproduce (every request as
  // long, so as many items each); anything else is a bug here.
  FLASHINFER_CHECK_CODE(
      batch == 0 || (chunks >= 1 && items == batch * tiles * chunks &&
                     (chunks == 1 ? !pl.split_kv
                                  : pl.split_kv && pl.num_partial_rows == batch * q_len * chunks &&
                                        static_cast<int64_t>(pl.merge_out_row.size()) ==
                                            int64_t{batch} * q_len)),
      ErrorCode::kInternal, op, "", "the worst-case plan is not the device plan's layout");
  bp.tile_rows = tile_rows;
  bp.num_chunks = static_cast<int32_t>(chunks);
  bp.chunk_tokens = pl.split_kv ? pl.kv_chunk_size : 0;
  bp.min_chunk_tokens = std::max(1, std::min(pl.min_kv_chunk, pl.kv_chunk_size));
  int64_t floats = 0;
  if (pl.split_kv) {
    // One more partial row: the empty state the idle chunks' merge entries name.
    bp.empty_row = static_cast<int32_t>(pl.num_partial_rows);
    pl.partial_rows_capacity = pl.num_partial_rows + 1;
    floats = pl.partial_rows_capacity * s.num_qo_heads * (s.head_dim_vo + 1);
  } else {
    pl.partial_rows_capacity = 0;
  }
  s.block_plan = bp;
  // The arrays in run_planned_options' layout, filled by the plan kernel (kv_indices: the table).
  int64_t n = 0;
  auto place = [&](int idx, int64_t count) {
    s.dev_off[idx] = n;
    n += count;
  };
  place(0, int64_t{batch} + 1);
  place(1, int64_t{batch} + 1);
  place(3, batch);
  place(4, items * 6);
  place(5, static_cast<int64_t>(pl.merge_indptr.size()));
  place(6, static_cast<int64_t>(pl.merge_rows.size()));
  place(7, static_cast<int64_t>(pl.merge_out_row.size()));
  s.dev_off[2] = n;
  // Both in the stream's scratch: the ints, then the partials from a 256-byte boundary.
  const int64_t int_bytes = (4 * (n + 1) + 255) / 256 * 256;
  BlockPlanScratch mem =
      block_plan_scratch(s.device, static_cast<std::size_t>(int_bytes + 4 * floats), op);
  s.block_plan_scratch = std::move(mem.lease);
  s.dev_ints = Tensor::from_blob(mem.data, {n + 1}, {1}, DType::kInt32, s.device);
  s.float_workspace = floats > 0 ? Tensor::from_blob(static_cast<uint8_t*>(mem.data) + int_bytes,
                                                     {floats}, {1}, DType::kFloat32, s.device)
                                 : Tensor();
}

namespace {

AttentionOutput run_planned_options(const detail::WrapperState& s, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttentionRunOptions& o, const char* op,
                                    const char* k_arg, const char* v_arg);

}  // namespace

void set_attention_outputs(kernels::AttentionParams& p, const Tensor& o, const Tensor& lse) {
  p.o = o.data_ptr();
  p.o_dtype = o.dtype();
  p.o_stride_n = o.stride(0);
  p.o_stride_h = o.stride(1);
  if (lse.defined()) {
    p.lse = lse.data<float>();
    p.lse_stride_n = lse.stride(0);
    p.lse_stride_h = lse.stride(1);
  }
}

namespace {

// Upstream 0.7.4's run(lse_base=, lse_layout=) of the prefill wrappers: both checked even without
// an LSE. "HN" runs the kernels on the transposed view of a contiguous [Hq, rows] buffer (the
// caller's, which must be that, or a new one): the same values, written where upstream's
// post-kernel transpose puts them (the view then meets run_planned_options' lse checks: dtype,
// device). "ln" is the kernels' lse_base_e.
AttentionOutput run_with_lse_layout(const detail::WrapperState& s, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttentionRunOptions& o, const char* op,
                                    const char* k_arg, const char* v_arg) {
  FLASHINFER_CHECK(o.lse_base == "log2" || o.lse_base == "ln", op, "lse_base",
                   "must be one of ('log2', 'ln'), got '", o.lse_base, "'");
  FLASHINFER_CHECK(o.lse_layout == "NH" || o.lse_layout == "HN", op, "lse_layout",
                   "must be one of ('NH', 'HN'), got '", o.lse_layout, "'");
  if (o.lse_layout == "NH") return run_planned_options(s, q, k, v, o, op, k_arg, v_arg);
  Tensor hn;
  if (o.lse) {
    hn = *o.lse;
    check_defined(hn, op, "lse");
    check_shape_eq(hn, {s.num_qo_heads, s.total_qo}, op, "lse");
    FLASHINFER_CHECK(hn.is_contiguous(), op, "lse", "for lse_layout=\"HN\" must be contiguous");
  } else if (o.return_lse) {
    hn = Tensor::empty({s.num_qo_heads, s.total_qo}, DType::kFloat32, s.device);
  }
  AttentionRunOptions nh = o;
  nh.lse_layout = "NH";
  if (hn.defined()) nh.lse = hn.transpose(0, 1);
  AttentionOutput r = run_planned_options(s, q, k, v, nh, op, k_arg, v_arg);
  if (o.return_lse) r.lse = hn;
  return r;
}

}  // namespace

AttentionOutput run_planned(const detail::WrapperState& s, const Tensor& q, const Tensor& k,
                            const Tensor& v, const AttentionRunOptions& o, const char* op,
                            const char* k_arg, const char* v_arg) {
  FLASHINFER_CHECK(s.planned, op, "self", "run() called before plan()");
  // A JIT variant's run(*args) (the AttentionSink one): into sinks and the score scale.
  if (s.sink_variant || (o.args && !o.args->is_none())) {
    return run_with_lse_layout(s, q, k, v, apply_variant_args(s, o, op), op, k_arg, v_arg);
  }
  return run_with_lse_layout(s, q, k, v, o, op, k_arg, v_arg);
}

namespace {

AttentionOutput run_planned_options(const detail::WrapperState& s, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttentionRunOptions& o, const char* op,
                                    const char* k_arg, const char* v_arg) {
  // NVFP4 caches (uint8 KV, kv_cache_sf): dequantized pages, then this path (attention_nvfp4.cpp).
  if (o.kv_cache_sf || s.kv_dtype == DType::kUInt8) {
    return run_planned_nvfp4(s, q, k, v, o, op, k_arg, v_arg);
  }
  // Options this library does not implement must stay unset.
  FLASHINFER_CHECK_CODE(!o.skip_softmax_threshold_scale_factor, ErrorCode::kUnsupported, op,
                        "skip_softmax_threshold_scale_factor", "not supported");
  FLASHINFER_CHECK_CODE(!o.use_fp16_softmax.value_or(false), ErrorCode::kUnsupported, op,
                        "use_fp16_softmax", "not supported (softmax is fp32)");
  FLASHINFER_CHECK_CODE(!o.uses_spcompress.value_or(false), ErrorCode::kUnsupported, op,
                        "uses_spcompress", "not supported");
  // o_scale (ragged prefill): upstream's fa2/fa3 ragged run never passes it to a kernel (only
  // its cutlass backend, not offered here, does), so it has no effect.
  if (o.q_len_per_req) {
    FLASHINFER_CHECK(*o.q_len_per_req == s.q_len_per_req, op, "q_len_per_req", "is ",
                     *o.q_len_per_req, " but plan() was given ", s.q_len_per_req);
  }
  check_defined(q, op, "q");
  check_dim(q, {3}, op, "q");
  FLASHINFER_CHECK(q.device() == s.device, op, "q", "is on ", q.device().str(),
                   " but the wrapper runs on ", s.device.str());
  FLASHINFER_CHECK(q.dtype() == s.q_dtype, op, "q", "dtype ", dtype_torch_name(q.dtype()),
                   " does not match plan's q_data_type ", dtype_torch_name(s.q_dtype));
  check_shape_eq(q, {s.total_qo, s.num_qo_heads, s.head_dim_qk}, op, "q");
  FLASHINFER_CHECK(q.stride(2) == 1, op, "q", "the head_dim axis must be contiguous");

  const int64_t kd = k.dim();  // 4 (paged) or 3 (ragged)
  for (const auto& [t, arg, dim] :
       {std::tuple{&k, k_arg, s.head_dim_qk}, std::tuple{&v, v_arg, s.head_dim_vo}}) {
    FLASHINFER_CHECK(t->device() == s.device, op, arg, "is on ", t->device().str(),
                     " but the wrapper runs on ", s.device.str());
    FLASHINFER_CHECK(t->dtype() == s.kv_dtype, op, arg, "dtype ", dtype_torch_name(t->dtype()),
                     " does not match plan's kv_data_type ", dtype_torch_name(s.kv_dtype));
    FLASHINFER_CHECK(t->dim() == kd, op, arg, "rank mismatch between k and v");
    FLASHINFER_CHECK(t->size(kd - 2) == s.num_kv_heads && t->size(kd - 1) == dim, op, arg, "has ",
                     t->size(kd - 2), " heads of dim ", t->size(kd - 1), ", plan() said ",
                     s.num_kv_heads, " heads of dim ", dim);
    FLASHINFER_CHECK(t->stride(kd - 1) == 1, op, arg, "the head_dim axis must be contiguous");
    if (s.paged) {
      FLASHINFER_CHECK(t->size(1) == s.page_size, op, arg, "page size ", t->size(1),
                       " does not match plan's page_size ", s.page_size);
      FLASHINFER_CHECK(s.max_page_id < t->size(0), op, arg, "the page table refers to page ",
                       s.max_page_id, " but the cache has ", t->size(0), " pages");
      // Only a run being captured: a replay reads the cache of its capture (with several
      // graphs, the smallest of their caches); load_page_table checks re-plans against it.
      if (s.use_cuda_graph && s.device.is_cuda() && detail::cuda_current_stream_capturing()) {
        s.graph_cache_pages =
            s.graph_cache_pages < 0 ? t->size(0) : std::min(s.graph_cache_pages, t->size(0));
      }
    } else {
      FLASHINFER_CHECK(t->size(0) >= s.total_kv, op, arg, "has ", t->size(0),
                       " rows but kv_indptr ends at ", s.total_kv);
    }
  }

  // sinks [Hq]: one logit per qo head, taken as fp32 on the wrapper's device.
  Tensor sinks;
  if (o.sinks) {
    check_defined(*o.sinks, op, "sinks");
    check_dim(*o.sinks, {1}, op, "sinks");
    FLASHINFER_CHECK(o.sinks->size(0) == s.num_qo_heads, op, "sinks", "expected ", s.num_qo_heads,
                     " elements (one per qo head), got ", o.sinks->size(0));
    FLASHINFER_CHECK(dtype_is_floating(o.sinks->dtype()), op, "sinks",
                     "expected a floating-point tensor, got ", dtype_torch_name(o.sinks->dtype()));
    check_same_device(*o.sinks, q, op, "sinks", "q");
    sinks = o.sinks->to(DType::kFloat32).contiguous();
  }

  AttentionOutput result;
  const Shape o_shape{s.total_qo, s.num_qo_heads, s.head_dim_vo};
  if (o.out) {
    const Tensor& out = *o.out;
    check_defined(out, op, "out");
    check_shape_eq(out, o_shape, op, "out");
    FLASHINFER_CHECK(out.dtype() == s.o_dtype, op, "out", "dtype ", dtype_torch_name(out.dtype()),
                     " does not match o_data_type ", dtype_torch_name(s.o_dtype));
    check_same_device(out, q, op, "out", "q");
    FLASHINFER_CHECK(out.stride(2) == 1, op, "out", "the head_dim axis must be contiguous");
    result.out = out;
  } else {
    result.out = Tensor::empty(o_shape, s.o_dtype, s.device);
  }
  Tensor lse;
  if (o.lse) {
    lse = *o.lse;
    check_defined(lse, op, "lse");
    check_shape_eq(lse, {s.total_qo, s.num_qo_heads}, op, "lse");
    FLASHINFER_CHECK(lse.dtype() == DType::kFloat32, op, "lse", "must be torch.float32");
    check_same_device(lse, q, op, "lse", "q");
  } else if (o.return_lse) {
    lse = Tensor::empty({s.total_qo, s.num_qo_heads}, DType::kFloat32, s.device);
  }
  if (o.return_lse) result.lse = lse;
  if (s.total_qo == 0) return result;

  // The CUDA kernels read q and write o in 16-byte units: a view whose rows do not start on
  // 16-byte boundaries goes through an aligned copy (same numbers, one copy more).
  auto rows_aligned = [](const Tensor& t) {
    const std::size_t e = dtype_size(t.dtype());
    return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0 &&
           (static_cast<std::size_t>(t.stride(0)) * e) % 16 == 0 &&
           (static_cast<std::size_t>(t.stride(1)) * e) % 16 == 0;
  };
  const bool cuda = s.device.is_cuda();
  const Tensor q_run = cuda && !rows_aligned(q) ? q.clone() : q;
  const Tensor o_run =
      cuda && !rows_aligned(result.out) ? Tensor::empty(o_shape, s.o_dtype, s.device) : result.out;

  kernels::AttentionParams p;
  p.q = q_run.data_ptr();
  p.q_dtype = q_run.dtype();
  p.q_stride_n = q_run.stride(0);
  p.q_stride_h = q_run.stride(1);
  p.kv.k = k.data_ptr();
  p.kv.v = v.data_ptr();
  p.kv.dtype = s.kv_dtype;
  if (s.paged) {
    p.kv.k_stride_page = k.stride(0);
    p.kv.k_stride_token = k.stride(1);
    p.kv.k_stride_head = k.stride(2);
    p.kv.v_stride_page = v.stride(0);
    p.kv.v_stride_token = v.stride(1);
    p.kv.v_stride_head = v.stride(2);
    p.kv.page_size = s.page_size;
  } else {
    p.kv.k_stride_token = k.stride(0);
    p.kv.k_stride_head = k.stride(1);
    p.kv.v_stride_token = v.stride(0);
    p.kv.v_stride_head = v.stride(1);
  }
  set_attention_outputs(p, o_run, lse);
  p.lse_base_e = o.lse_base == "ln";
  p.batch = s.batch;
  p.num_qo_heads = s.num_qo_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim_qk = s.head_dim_qk;
  p.head_dim_vo = s.head_dim_vo;
  p.sm_scale = static_cast<float>(s.sm_scale * o.q_scale.value_or(1.0) * o.k_scale.value_or(1.0));
  p.logits_soft_cap = static_cast<float>(s.logits_soft_cap);
  p.v_scale = static_cast<float>(o.v_scale.value_or(1.0));
  p.causal = s.causal;
  const int64_t window = o.window_left.value_or(s.window_left);
  FLASHINFER_CHECK(window >= -1 && window <= std::numeric_limits<int32_t>::max(), op, "window_left",
                   "must be -1 or a non-negative int32, got ", window);
  p.window_left = static_cast<int32_t>(window);
  p.num_work = static_cast<int32_t>(s.plan.work.size());
  for (const kernels::WorkItem& w : s.plan.work) {
    p.max_work_rows = std::max(p.max_work_rows, w.qo_end - w.qo_begin);
  }
  // Under CUDA graphs the launch is sized for the plan's tile, not this plan's items (build_plan).
  if (s.use_cuda_graph && s.device.is_cuda()) {
    p.max_work_rows = std::max(p.max_work_rows, s.plan.cta_tile_q);
  }
  p.use_tensor_cores = detail::tensor_core_path(s);
  p.prefill_fa2_only = s.backend == "fa2";
  p.num_merge = static_cast<int32_t>(s.plan.merge_out_row.size());
  if (s.plan.partial_rows_capacity > 0) {
    // From the workspace's first 16-byte boundary (the CUDA kernels' vector stores; the plan
    // kept 15 bytes for the skip): a workspace view at 4, 8 or 12 bytes past one is accepted.
    const auto addr = reinterpret_cast<std::uintptr_t>(s.float_workspace.data_ptr());
    auto* ws = reinterpret_cast<float*>(addr + (16 - addr % 16) % 16);
    p.tmp_v = ws;
    p.tmp_s = ws + s.plan.partial_rows_capacity * s.num_qo_heads * s.head_dim_vo;
  }
  if (s.scale_q.defined()) p.scale_q = s.scale_q.data<const float>();
  if (s.scale_k.defined()) p.scale_k = s.scale_k.data<const float>();
  if (s.scale_v.defined()) p.scale_v = s.scale_v.data<const float>();
  if (sinks.defined()) p.sinks = sinks.data<const float>();
  if (s.device.is_cpu()) {
    p.qo_indptr = s.qo_indptr.data();
    p.kv.kv_indptr = s.kv_indptr.data();
    p.kv.kv_indices = s.paged ? s.kv_indices.data() : nullptr;
    p.kv_lens = s.kv_lens.data();
    p.work = s.plan.work.data();
    p.merge_indptr = s.plan.merge_indptr.data();
    p.merge_rows = s.plan.merge_rows.data();
    p.merge_out_row = s.plan.merge_out_row.data();
    if (!s.mask_indptr.empty()) {
      p.custom_mask = s.packed_mask.data();
      p.mask_indptr = s.mask_indptr.data();
    }
    if (!s.item_bounds.empty()) {
      p.multi_item_bounds = s.item_bounds.data();
      p.multi_item_rows = s.item_rows.data();
    }
  } else {
    const auto* base = s.dev_ints.data<const int32_t>();
    p.qo_indptr = base + s.dev_off[0];
    p.kv.kv_indptr = base + s.dev_off[1];
    p.kv.kv_indices = s.paged ? base + s.dev_off[2] : nullptr;
    p.kv_lens = base + s.dev_off[3];
    p.work = reinterpret_cast<const kernels::WorkItem*>(base + s.dev_off[4]);
    p.merge_indptr = base + s.dev_off[5];
    p.merge_rows = base + s.dev_off[6];
    p.merge_out_row = base + s.dev_off[7];
    // (Under use_cuda_graph the mask and the slopes stay on the device for the graphs that
    // captured them; this plan reads them only when it has them.)
    if (s.dev_mask.defined() && !s.mask_indptr.empty()) {
      p.custom_mask = s.dev_mask.data<const uint8_t>();
      p.mask_indptr = s.dev_mask_indptr.data<const int64_t>();
    }
    if (s.dev_item_bounds.defined()) {
      p.multi_item_bounds = s.dev_item_bounds.data<const int32_t>();
      p.multi_item_rows = p.multi_item_bounds + s.item_bounds.size();
    }
  }
  if (s.dev_alibi.defined() && s.pos_encoding == 2)
    p.alibi_slopes = s.dev_alibi.data<const float>();
  if (s.block_plan) {
    // The plan on the device: its kernel fills the arrays above (and writes the NaN rows of the
    // requests it refuses) before the attention kernels read them; pages come from the table.
    kernels::BlockTablePlan bp = *s.block_plan;
    p.kv.kv_indices = bp.block_tables;
    int32_t* base = s.dev_ints.data<int32_t>();
    bp.qo_indptr = base + s.dev_off[0];
    bp.kv_indptr = base + s.dev_off[1];
    bp.kv_lens = base + s.dev_off[3];
    bp.work = reinterpret_cast<kernels::WorkItem*>(base + s.dev_off[4]);
    bp.merge_indptr = base + s.dev_off[5];
    bp.merge_rows = base + s.dev_off[6];
    bp.merge_out_row = base + s.dev_off[7];
    bp.tmp_v = p.tmp_v;
    bp.tmp_s = p.tmp_s;
    kernels::block_plan_set_output(bp, p, p.num_qo_heads, p.head_dim_vo);
#if FLASHINFER_WITH_CUDA
    // The kernels' one refusal after the plan kernel ran would leave its NaN rows in `out`: the
    // K/V rows' alignment (q and o are aligned copies by now), checked first.
    FLASHINFER_CHECK_CODE(kernels::cuda::attention_rows_aligned(p), ErrorCode::kUnsupported, op,
                          k_arg, "rows must start on 16-byte boundaries on CUDA");
#endif
    launch_block_table_plan(bp, s.device, op);
  }
  // Live page ids (kernels/page_guard.h): copied in and checked before the kernels, a bad
  // request's NaN rows after them.
  const bool live = s.live_indices.defined() && !s.block_plan && s.paged;
  kernels::PageGuardParams g;
  if (live) {
    int32_t* dev = s.dev_ints.data<int32_t>();
    g.src = s.live_indices.data<const int32_t>();
    g.base = dev + s.dev_off[8];
    g.dst = dev + s.dev_off[2];
    g.kv_indptr = dev + s.dev_off[1];
    g.qo_indptr = dev + s.dev_off[0];
    g.bad = dev + s.dev_off[8] + 1;
    g.num_pages = std::min(k.size(0), v.size(0));
    // Every id would be bad and page 0 does not exist: refused here, as the host check did.
    FLASHINFER_CHECK(g.num_pages > 0 || page_id_count(s) == 0, op, k_arg,
                     "the cache has no pages but the page table has ", page_id_count(s));
    g.batch = s.batch;
    g.o = p.o;
    g.o_dtype = p.o_dtype;
    g.o_stride_n = p.o_stride_n;
    g.o_stride_h = p.o_stride_h;
    g.lse = p.lse;
    g.lse_stride_n = p.lse_stride_n;
    g.lse_stride_h = p.lse_stride_h;
    g.num_heads = p.num_qo_heads;
    g.head_dim = p.head_dim_vo;
    launch_page_guard(g, /*nan_rows=*/false, s.device, op);
  }
  // RoPE / ALiBi inside attention: the CPU reference computes them (ALiBi on CUDA: the decode
  // kernel's variant).
  if (!api::run_with_pos_encoding(s, p, op)) {
    launch(kAttentionKernels, p, s.device, op, "q", o.enable_pdl);
  }
  if (live) launch_page_guard(g, /*nan_rows=*/true, s.device, op);
  if (o_run.data_ptr() != result.out.data_ptr()) result.out.copy_(o_run);
  return result;
}

}  // namespace

detail::WrapperState sizing_state(const detail::WrapperState& s) {
  detail::WrapperState t;
  t.device = s.device;
  t.hnd = s.hnd;
  t.use_cuda_graph = s.use_cuda_graph;
  t.use_tensor_cores = s.use_tensor_cores;
  t.backend = s.backend;
  t.workspace_cap = std::numeric_limits<int64_t>::max();
  t.sizing_only = true;
  return t;
}

WorkspaceSizes plan_workspace_sizes(const detail::WrapperState& s) {
  WorkspaceSizes w;
  w.float_workspace_size = s.plan.num_partial_rows * s.num_qo_heads * (s.head_dim_vo + 1) * 4;
  const std::size_t ints = s.qo_indptr.size() + s.kv_indptr.size() +
                           static_cast<std::size_t>(page_id_count(s)) + s.kv_lens.size() + 1 +
                           s.kv_lens.size() + s.plan.work.size() * 6 + s.plan.merge_indptr.size() +
                           s.plan.merge_rows.size() + s.plan.merge_out_row.size() + 1;
  w.int_workspace_size = static_cast<int64_t>(ints * sizeof(int32_t));
  return w;
}

void plan_settings(detail::WrapperState& s, int64_t num_qo_heads, int64_t num_kv_heads,
                   int64_t head_dim_qk, int64_t head_dim_vo, DType q_dtype,
                   std::optional<DType> kv_dtype, std::optional<DType> o_dtype,
                   std::optional<double> sm_scale, int64_t window_left,
                   std::optional<double> logits_soft_cap, std::string_view pos_encoding_mode,
                   const char* op) {
  check_heads(num_qo_heads, num_kv_heads, op, "num_qo_heads", "num_kv_heads");
  check_head_dim(head_dim_qk, op, "head_dim_qk");
  check_head_dim(head_dim_vo, op, "head_dim_vo");
  check_pos_encoding(pos_encoding_mode, op);
  check_q_dtype(q_dtype, op, "q_data_type");
  const DType kv = kv_dtype.value_or(q_dtype);
  // torch.uint8: an NVFP4 cache, read with run()'s kv_cache_sf (attention_nvfp4.cpp).
  if (kv != DType::kUInt8) check_kv_dtype(kv, q_dtype, op, "kv_data_type");
  const DType od = o_dtype.value_or(q_dtype);
  check_q_dtype(od, op, "o_data_type");
  FLASHINFER_CHECK(window_left >= -1 && window_left <= std::numeric_limits<int32_t>::max(), op,
                   "window_left", "must be -1 or a non-negative int32, got ", window_left);
  const double cap = logits_soft_cap.value_or(0.0);
  FLASHINFER_CHECK(cap >= 0.0 && std::isfinite(cap), op, "logits_soft_cap",
                   "must be finite and >= 0, got ", cap);
  const double scale = sm_scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim_qk)));
  FLASHINFER_CHECK(std::isfinite(scale), op, "sm_scale", "must be finite, got ", scale);
  s.num_qo_heads = static_cast<int32_t>(num_qo_heads);
  s.num_kv_heads = static_cast<int32_t>(num_kv_heads);
  s.head_dim_qk = static_cast<int32_t>(head_dim_qk);
  s.head_dim_vo = static_cast<int32_t>(head_dim_vo);
  s.q_dtype = q_dtype;
  s.kv_dtype = kv;
  s.o_dtype = od;
  s.sm_scale = scale;
  s.window_left = window_left;
  s.logits_soft_cap = cap;
}

void check_prefill_backend(std::string_view backend, Device device, bool fa3, const char* op,
                           bool wrapper) {
  if (wrapper && backend == "cutlass") {
    // vLLM's MLA prefill on Blackwell (BatchPrefillWithRaggedKVCacheWrapper(backend="cutlass")):
    // upstream builds that FMHA for sm100a; a recording of it replays here on the CPU (a CUDA
    // refusal falls back there) or on an sm100-family GPU.
    FLASHINFER_CHECK_CODE(!device.is_cuda() || compute_capability(device) / 10 == 10,
                          ErrorCode::kUnsupported, op, "backend",
                          "\"cutlass\" runs on sm100 / sm103 only (upstream builds its CUTLASS "
                          "FMHA for Blackwell); this device is sm",
                          device.is_cuda() ? compute_capability(device) : 0);
    return;
  }
  if (!fa3) {
    FLASHINFER_CHECK_CODE(backend == "auto" || backend == "fa2", ErrorCode::kUnsupported, op,
                          "backend", "\"", backend, "\" is not available (\"auto\" or \"fa2\")");
    return;
  }
  FLASHINFER_CHECK_CODE(backend == "auto" || backend == "fa2" || backend == "fa3",
                        ErrorCode::kUnsupported, op, "backend", "\"", backend,
                        "\" is not available (\"auto\", \"fa2\" or \"fa3\"",
                        wrapper ? ", or \"cutlass\" on sm100)" : ")");
  // "fa3" is upstream's Hopper kernel (built for sm90a only); on another GPU it is refused, as
  // upstream's cannot run there. The CPU runs every backend's attention (replay anywhere).
  FLASHINFER_CHECK_CODE(
      backend != "fa3" || !device.is_cuda() || compute_capability(device) / 10 == 9,
      ErrorCode::kUnsupported, op, "backend",
      "\"fa3\" runs on sm90 only (upstream builds it for sm90a); this device is sm",
      backend == "fa3" && device.is_cuda() ? compute_capability(device) : 0);
}

void set_graph_buffers(detail::WrapperState& s, const std::optional<Tensor>& indices_buffer,
                       const std::optional<Tensor>& mask_buffer) {
  if (!s.use_cuda_graph) return;
  if (indices_buffer && indices_buffer->defined()) {
    s.graph_indices_buffer = indices_buffer->numel();
    // The buffer a plan's ids go to and run() reads them from (load_page_table's live ids).
    if (s.device.is_cuda() && graph_index_buffer_usable(*indices_buffer, s.device)) {
      s.graph_indices = *indices_buffer;
    }
  }
  if (mask_buffer && mask_buffer->defined()) s.graph_mask_buffer = mask_buffer->numel();
}

void init_wrapper(detail::WrapperState& s, const Tensor& float_workspace_buffer,
                  std::string_view kv_layout, bool use_cuda_graph, std::string_view backend,
                  const std::optional<Value>& jit_args, const char* op, bool fa3) {
  check_defined(float_workspace_buffer, op, "float_workspace_buffer");
  FLASHINFER_CHECK(float_workspace_buffer.is_contiguous(), op, "float_workspace_buffer",
                   "must be contiguous");
  // Split-KV partials are fp32 arrays starting at the buffer's address: a view at an offset that
  // is not a multiple of 4 bytes would make every access to them misaligned (a fault that ends
  // the CUDA context on a GPU, undefined behaviour on the CPU).
  FLASHINFER_CHECK(reinterpret_cast<std::uintptr_t>(float_workspace_buffer.data_ptr()) % 4 == 0, op,
                   "float_workspace_buffer", "must be 4-byte aligned (a view at byte offset ",
                   float_workspace_buffer.storage_offset() * float_workspace_buffer.element_size(),
                   " is not)");
  s.float_workspace = float_workspace_buffer;
  s.device = float_workspace_buffer.device();
  s.hnd = parse_kv_layout(kv_layout, op, "kv_layout");
  s.use_cuda_graph = use_cuda_graph;
  check_prefill_backend(backend, s.device, fa3, op, /*wrapper=*/fa3);
  s.backend = std::string(backend);
  FLASHINFER_CHECK_CODE(!jit_args || jit_args->is_none(), ErrorCode::kUnsupported, op, "jit_args",
                        "JIT variants are not supported");
}

double fused_scale_value(const ScalarOrTensor<double>& x, const char* op, const char* arg,
                         std::optional<Device> on_device, Tensor* dev) {
  double v = x.scalar();
  if (x.is_tensor()) {
    const Tensor& t = x.tensor();
    check_defined(t, op, arg);
    FLASHINFER_CHECK(t.numel() == 1, op, arg, "a tensor scale must hold one element, got ",
                     t.numel());
    FLASHINFER_CHECK(dtype_is_floating(t.dtype()), op, arg, "a tensor scale must be floating, got ",
                     dtype_torch_name(t.dtype()));
    if (on_device && dev != nullptr && t.device() == *on_device) {
      *dev = t.reshape({1}).to(DType::kFloat32);  // on the device (Tensor::to)
      return 1.0;
    }
    // Read on the host: a read back a CUDA graph cannot hold (Tensor.copy_ would refuse it).
    FLASHINFER_CHECK_CODE(!t.device().is_cuda() || !detail::cuda_current_stream_capturing(),
                          ErrorCode::kUnsupported, op, arg,
                          "a CUDA tensor scale is read on the host here, which a CUDA graph "
                          "cannot capture; pass a float");
    v = t.item();
  }
  FLASHINFER_CHECK(std::isfinite(v), op, arg, "must be finite, got ", v);
  return v;
}

double fused_fp32_scale_value(const ScalarOrTensor<double>& x, const char* op, const char* arg) {
  // After fused_scale_value's own checks of definedness and size, which name the argument first.
  if (x.is_tensor() && x.tensor().defined() && x.tensor().numel() == 1) {
    FLASHINFER_CHECK(x.tensor().dtype() == DType::kFloat32, op, arg,
                     "a tensor scale must be torch.float32, got ",
                     dtype_torch_name(x.tensor().dtype()));
  }
  return fused_scale_value(x, op, arg);
}

}  // namespace flashinfer::api
