// Block-table attention under TensorRT-LLM's calling convention (upstream's trtllm-gen/xqa entry
// points): trtllm_batch_decode_with_kv_cache (flashinfer.decode) and
// trtllm_batch_context_with_kv_cache (flashinfer.prefill). Both adapt the block table into the
// page table of the shared batch-attention kernels (one plan per call), so the CPU reference and
// the CUDA kernels are those of the wrappers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "core/cuda_runtime.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/ops/attention.h"
#if FLASHINFER_WITH_CUDNN
#include "api/device_props.h"
#include "api/kernel_table.h"
#include "kernels/cuda/attention_cudnn.h"
#endif
#if FLASHINFER_WITH_CUDA
#include "flashinfer/stream.h"
#include "kernels/block_table_plan.h"
#include "kernels/cuda/cudnn_ragged_plan_cuda.h"
#include "kernels/cuda/decode_cuda.h"
#include "kernels/cuda/prefill_shape.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kDecodeOp = "trtllm_batch_decode_with_kv_cache";
constexpr const char* kContextOp = "trtllm_batch_context_with_kv_cache";
constexpr const char* kTrtllmAttentionXqaOp = "xqa_batch_decode_with_kv_cache";
constexpr const char* kCudnnPrefillOp = "cudnn_batch_prefill_with_kv_cache";
constexpr const char* kCudnnDecodeOp = "cudnn_batch_decode_with_kv_cache";
#if FLASHINFER_WITH_CUDNN
constexpr const char* kCudnnPrefillSummary =
    "Batch prefill attention under cuDNN's interface (cuDNN's SDPA graph for a paged cache where "
    "it fits, else this library's kernels)";
constexpr const char* kCudnnDecodeSummary =
    "Batch decode attention under cuDNN's interface (cuDNN's SDPA graph where it fits, else this "
    "library's kernels)";
#else
constexpr const char* kCudnnPrefillSummary =
    "Batch prefill attention under cuDNN's interface (this library's kernels)";
constexpr const char* kCudnnDecodeSummary =
    "Batch decode attention under cuDNN's interface (this library's kernels)";
#endif

// K and V as [pages, page_size, Hkv, D] views. Upstream also takes a 5-D cache whose second
// axis has size 1: K and V are then the same tensor.
std::pair<Tensor, Tensor> block_cache_views(const PagedKVCache& cache, bool hnd, const char* op) {
  if (!cache.is_pair() && cache.first().defined() && cache.first().dim() == 5 &&
      cache.first().size(1) == 1) {
    Tensor k = cache.first().select(1, 0);
    return api::paged_cache_views(PagedKVCache(k, k), hnd, op, "kv_cache", false);
  }
  return api::paged_cache_views(cache, hnd, op, "kv_cache", false);
}

// What both entry points share once the query rows of each request are known.
struct BlockCall {
  const char* op;
  Tensor query;
  const PagedKVCache* kv_cache;
  const Tensor* workspace_buffer;
  const Tensor* block_tables;
  std::vector<int32_t> qo_indptr;  // [batch + 1]
  std::vector<int32_t> kv_lens;    // [batch] (host plans)
  // A CUDA call of q_len queries a request (no mask, no NVFP4 cache) plans on the device
  // (kernels/block_table_plan.h): seq_lens stays there, kv_lens stays empty, and the host plans
  // the grid for max_seq_len.
  const Tensor* seq_lens = nullptr;
  int64_t max_seq_len = 0;
  // trtllm_batch_context_with_kv_cache planned on the device: cum_seq_lens_q there (contiguous
  // int32 [batch + 1]), read by the plan kernel; qo_indptr is then the worst case, every request
  // max_q_len queries long, which the host plans the grid for.
  const Tensor* cu_seq_lens_q = nullptr;
  bool causal = false;
  bool hnd = true;
  double bmm1 = 1.0, out_scale = 1.0;
  // bmm1_scale / bmm2_scale given as tensors on the device of a call planned there (fp32 [1]):
  // factors of the scores and of the output the kernels read, times bmm1 and out_scale.
  Tensor bmm1_dev, bmm2_dev;
  int64_t window_left = -1;
  std::optional<Tensor> out, lse, sinks;
  std::optional<DType> out_dtype;
  bool return_lse = false;
  std::optional<bool> enable_pdl;
  std::optional<Value> kv_cache_sf;  // NVFP4 block scales (uint8 cache)
  bool sf_v_linear = false;          // xqa reads V's block scales linearly, trtllm-gen interleaved
  bool f32_out = false;              // fp32 output for an fp8 result quantized afterwards (xqa)
  // xqa speculative decoding: the bit-packed draft mask and the q_seq_len its rows are sized for.
  std::optional<Tensor> spec_mask;
  int64_t spec_q_len = 1;
  // Upstream 0.7.4's windows the kernels' flags do not express (trtllm context's window_right and
  // variable windows, trtllm decode's context-parallel rows), as a key mask: whether request b's
  // query t (its t-th row) sees its key j. CPU reference only.
  std::function<bool(int64_t b, int64_t t, int64_t j)> key_mask;
  // The cuDNN ops: run cuDNN's SDPA graph where the build has cuDNN and the call fits it
  // (run_cudnn), with the graph's sequence extents (the API's maxima).
  bool cudnn = false;
  int64_t cudnn_max_s_q = 1, cudnn_max_s_kv = 0;
};

#if FLASHINFER_WITH_CUDNN
// `c` on cuDNN's SDPA graph (kernels/cuda/attention_cudnn.h), once run_block_call has checked
// it: k and v are its [pages, page_size, Hkv, D] views, `table` the host copy of its block table
// ([rows, table_cols]), `od` the output dtype. nullopt, having run nothing, when the call does not
// fit the graph (a dtype, scale, output or length cuDNN's graph does not express, no GPU of
// sm80+, or cuDNN has no plan): the caller runs this library's kernels, so nothing that runs
// there stops running. out and lse, when given, must be exactly what the kernels' path accepts;
// anything else goes that path too, which then names the argument.
std::optional<AttentionOutput> run_cudnn(const BlockCall& c, const Tensor& k, const Tensor& v,
                                         const int32_t* table, int64_t table_cols, DType od) {
  const Tensor& q = c.query;
  const Device dev = q.device();
  if (!dev.is_cuda() || api::compute_capability(dev) < 80) return std::nullopt;
  const DType dt = q.dtype();
  if ((dt != DType::kBFloat16 && dt != DType::kFloat16) || k.dtype() != dt || od != dt) {
    return std::nullopt;
  }
  if (c.out_scale != 1.0 || c.bmm1_dev.defined() || c.bmm2_dev.defined() || c.sinks ||
      c.window_left >= 0 || c.spec_mask || c.f32_out ||
      (c.kv_cache_sf && !c.kv_cache_sf->is_none())) {
    return std::nullopt;
  }
  const int64_t batch = static_cast<int64_t>(c.kv_lens.size());
  const int64_t rows = q.size(0), hq = q.size(1), d = q.size(2), hkv = k.size(2);
  if (batch == 0 || rows == 0 || d % 8 != 0 || d > 256) return std::nullopt;
  // The graph's page table has ceil(max_sequence_kv / page_size) columns per request, copied
  // each call: a maximum far beyond the lengths is left to the kernels.
  const int64_t page_size = k.size(1);
  // cuDNN's paged SDPA engines take power-of-two block sizes only (their planners refuse others:
  // decline before building a graph that would be refused).
  if (page_size < 1 || (page_size & (page_size - 1)) != 0) return std::nullopt;
  if (c.cudnn_max_s_kv < 1 || c.cudnn_max_s_kv > std::numeric_limits<int32_t>::max() ||
      batch * ((c.cudnn_max_s_kv + page_size - 1) / page_size) > (int64_t{1} << 22)) {
    return std::nullopt;
  }
  // Empty requests (no queries, or no keys: an all-masked row) are left to the kernels, whose
  // results for them are defined.
  for (int64_t b = 0; b < batch; ++b) {
    if (c.kv_lens[b] < 1 || c.qo_indptr[b + 1] - c.qo_indptr[b] < 1) return std::nullopt;
  }
  const auto aligned = [](const Tensor& t) {
    return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  if (q.stride(2) != 1 || k.stride(3) != 1 || v.stride(3) != 1 || !aligned(q) || !aligned(k) ||
      !aligned(v)) {
    return std::nullopt;
  }
  const Shape o_shape{rows, hq, d};
  Tensor out;
  if (c.out) {
    const Tensor& o = *c.out;
    if (!o.defined() || o.shape() != o_shape || o.dtype() != od || o.device() != dev ||
        o.stride(2) != 1 || !aligned(o)) {
      return std::nullopt;
    }
    out = o;
  } else {
    out = Tensor::empty(o_shape, od, dev);
  }
  const bool stats = c.return_lse || c.lse;
  Tensor lse;
  if (c.lse) {
    const Tensor& l = *c.lse;
    if (!l.defined() || l.shape() != Shape{rows, hq} || l.dtype() != DType::kFloat32 ||
        l.device() != dev || !l.is_contiguous() || !aligned(l)) {
      return std::nullopt;
    }
    lse = l;
  } else if (stats) {
    lse = Tensor::empty({rows, hq}, DType::kFloat32, dev);
  }

  kernels::dnn::SdpaProblem p;
  p.batch = batch;
  p.hq = hq;
  p.hkv = hkv;
  p.d = d;
  p.max_s_q = c.cudnn_max_s_q;
  // The graph's key extent is whole pages (the page table's columns times page_size), as the
  // frontend infers when none is given: cuDNN's paged planner refuses other values; each
  // request's own length still bounds its keys. Decode steps within one page share a graph.
  p.max_s_kv = (c.cudnn_max_s_kv + page_size - 1) / page_size * page_size;
  p.num_pages = k.size(0);
  p.page_size = page_size;
  p.q_stride_n = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.o_stride_n = out.stride(0);
  p.o_stride_h = out.stride(1);
  p.k_stride_page = k.stride(0);
  p.k_stride_row = k.stride(1);
  p.k_stride_h = k.stride(2);
  p.v_stride_page = v.stride(0);
  p.v_stride_row = v.stride(1);
  p.v_stride_h = v.stride(2);
  if (stats) {
    p.lse_stride_n = lse.stride(0);
    p.lse_stride_h = lse.stride(1);
  }
  // One query per request (decode) is row b: no ragged offsets.
  p.ragged = c.cudnn_max_s_q > 1;
  p.causal = c.causal;
  p.stats = stats;
  p.dtype = dt;
  p.scale = static_cast<float>(c.bmm1);

  std::vector<int32_t> lens_q(static_cast<std::size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) lens_q[b] = c.qo_indptr[b + 1] - c.qo_indptr[b];
  kernels::cuda::CudnnSdpaCall call;
  call.problem = p;
  call.q = q.data_ptr();
  call.k = k.data_ptr();
  call.v = v.data_ptr();
  call.out = out.data_ptr();
  call.lse = stats ? lse.data<float>() : nullptr;
  call.lens_q = &lens_q;
  call.lens_kv = &c.kv_lens;
  call.qo_indptr = &c.qo_indptr;
  call.table = table;
  call.table_cols = table_cols;
  const Tensor& ws = *c.workspace_buffer;
  if (ws.is_contiguous()) {
    call.workspace = ws.data_ptr();
    call.workspace_bytes = ws.nbytes();
  }
  api::launch_detail::LaunchScope scope(dev, c.enable_pdl);
  if (!kernels::cuda::cudnn_sdpa(call, scope.context().stream, c.op)) return std::nullopt;
  AttentionOutput r;
  r.out = out;
  if (c.return_lse) r.lse = lse;
  return r;
}
#endif

// The kernels' custom mask (bit-packed per request, rows of kv_lens[b] bits, each request's bits
// starting on a byte) from visible(b, t, j): request b's query t sees its key j.
void fill_key_mask(detail::WrapperState& s,
                   const std::function<bool(int64_t, int64_t, int64_t)>& visible) {
  const auto batch = static_cast<std::size_t>(s.batch);
  s.packed_mask.clear();
  s.mask_indptr.assign(batch, 0);
  int64_t bit = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    const int64_t qo = s.qo_indptr[b + 1] - s.qo_indptr[b], len = s.kv_lens[b];
    bit = (bit + 7) / 8 * 8;
    s.mask_indptr[b] = bit;
    s.packed_mask.resize(static_cast<std::size_t>((bit + qo * len + 7) / 8), 0);
    for (int64_t t = 0; t < qo; ++t) {
      for (int64_t j = 0; j < len; ++j, ++bit) {
        if (visible(static_cast<int64_t>(b), t, j)) {
          s.packed_mask[static_cast<std::size_t>(bit >> 3)] |=
              static_cast<uint8_t>(1u << (bit & 7));
        }
      }
    }
  }
}

// xqa's speculative-decoding mask (csrc/xqa/mha.cu, applyMaskFromInput) as the kernels' custom
// mask: request b's query t sees every key before its last qo_len positions, and draft key j
// (position L - qo_len + j) when bit j of mask row qo_indptr[b] + t is set; rows are
// ceil(q_seq_len / 32) * 2 uint16 words, bit j in word j / 16 at bit j % 16.
void load_spec_dec_mask(detail::WrapperState& s, const Tensor& mask, int64_t q_len,
                        const char* op) {
  api::check_defined(mask, op, "mask");
  FLASHINFER_CHECK(mask.dtype() == DType::kInt16 || mask.dtype() == DType::kInt32, op, "mask",
                   "expected torch.uint16 bits (int16 here) or their uint32 words (int32), got ",
                   dtype_torch_name(mask.dtype()));
  const int64_t words16 = (q_len + 31) / 32 * 2;
  const int64_t per_row = mask.dtype() == DType::kInt16 ? words16 : words16 / 2;
  FLASHINFER_CHECK(mask.dim() >= 1 && mask.size(-1) == per_row, op, "mask", "rows must hold ",
                   per_row, " ", dtype_torch_name(mask.dtype()),
                   " elements (ceil(q_seq_len / 32) * 32 bits) for q_seq_len ", q_len, ", got ",
                   shape_to_string(mask.shape()));
  const int64_t rows = mask.numel() / per_row;
  FLASHINFER_CHECK(rows >= s.total_qo, op, "mask", "has ", rows, " rows for ", s.total_qo,
                   " query tokens");
  const Tensor h = mask.to(Device::cpu()).contiguous();
  const auto* bytes = static_cast<const uint8_t*>(h.data_ptr());
  const auto bit_of = [&](int64_t row, int64_t j) {
    const int64_t byte = row * words16 * 2 + j / 8;  // little-endian words: bit j in byte j / 8
    return (bytes[byte] >> (j % 8)) & 1;
  };
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t qo = s.qo_indptr[b + 1] - s.qo_indptr[b], len = s.kv_lens[b];
    FLASHINFER_CHECK(qo <= len, op, "seq_lens", "request ", b, " has ", qo,
                     " draft tokens but only ", len, " keys");
  }
  fill_key_mask(s, [&](int64_t b, int64_t t, int64_t kj) {
    const int64_t qo = s.qo_indptr[b + 1] - s.qo_indptr[b];
    const int64_t j = kj - (s.kv_lens[b] - qo);
    return j < 0 || bit_of(s.qo_indptr[b] + t, j) != 0;
  });
}

AttentionOutput run_block_call(BlockCall& c) {
  const char* op = c.op;
  api::check_defined(c.query, op, "query");
  api::check_dim(c.query, {3}, op, "query");
  if (dtype_is_fp8(c.query.dtype())) {
    // An fp8 query (SGLang's and vLLM's trtllm backends quantize q for an fp8 KV cache): its
    // values widened to the 16-bit output dtype (bf16 for an fp32 one, the fp8 outputs' path),
    // which holds every e4m3 and e5m2 value exactly, so the scores are the fp8 values' products.
    const DType od0 = c.out_dtype ? *c.out_dtype : (c.out ? c.out->dtype() : c.query.dtype());
    FLASHINFER_CHECK_CODE(!dtype_is_fp8(od0), ErrorCode::kInternal, op, c.out ? "out" : "out_dtype",
                          "an fp8 output reaches run_block_call (host-side bug)");
    c.query = c.query.to(od0 == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16);
  }
  const Tensor& q = c.query;
  FLASHINFER_CHECK(
      q.dtype() == DType::kFloat16 || q.dtype() == DType::kBFloat16 || q.dtype() == DType::kFloat32,
      op, "query", "dtype ", dtype_torch_name(q.dtype()),
      " is not supported (float16, bfloat16; float32 on the CPU)");
  auto [k, v] = block_cache_views(*c.kv_cache, c.hnd, op);
  api::check_same_device(k, q, op, "kv_cache", "query");
  // uint8: NVFP4 (two e2m1 codes per byte, read through kv_cache_sf by run_planned).
  const bool nvfp4 = k.dtype() == DType::kUInt8;
  if (!nvfp4) api::check_kv_dtype(k.dtype(), q.dtype(), op, "kv_cache");
  const Tensor& ws = *c.workspace_buffer;
  api::check_defined(ws, op, "workspace_buffer");
  api::check_same_device(ws, q, op, "workspace_buffer", "query");

  const int64_t num_pages = k.size(0), page_size = k.size(1), hkv = k.size(2);
  const int64_t d = nvfp4 ? 2 * k.size(3) : k.size(3);
  FLASHINFER_CHECK(page_size >= 1 && page_size <= (1 << 20), op, "kv_cache", "page size ",
                   page_size, " is outside [1, 2^20]");
  FLASHINFER_CHECK(v.size(3) == k.size(3), op, "kv_cache", "K and V head dims differ");
  FLASHINFER_CHECK(q.size(2) == d, op, "query", "head_dim ", q.size(2),
                   " does not match the cache's ", d);
  api::check_heads(q.size(1), hkv, op, "query", "kv_cache");
  api::check_head_dim(d, op, "query");

  // The block table: only the blocks a request's length needs are read (and must be valid).
  const Tensor& bt = *c.block_tables;
  api::check_defined(bt, op, "block_tables");
  api::check_dim(bt, {2}, op, "block_tables");
  FLASHINFER_CHECK(bt.dtype() == DType::kInt32, op, "block_tables", "expected int32, got ",
                   dtype_torch_name(bt.dtype()));
  const bool device_plan = c.seq_lens != nullptr;
  const auto batch = static_cast<int64_t>(c.qo_indptr.size()) - 1;
  FLASHINFER_CHECK(bt.size(0) >= batch, op, "block_tables", "has ", bt.size(0),
                   " rows for a batch of ", batch);
  const int64_t max_blocks = bt.size(1);

  detail::WrapperState s;
  s.device = q.device();
  s.hnd = c.hnd;
  const DType od = c.out_dtype ? *c.out_dtype : (c.out ? c.out->dtype() : q.dtype());
  FLASHINFER_CHECK(od == q.dtype() || od == DType::kFloat16 || od == DType::kBFloat16 ||
                       (c.f32_out && od == DType::kFloat32),
                   op, "out_dtype", "must be query's dtype, float16 or bfloat16, got ",
                   dtype_torch_name(od));
  if (c.out && c.out_dtype) {
    FLASHINFER_CHECK(c.out->dtype() == *c.out_dtype, op, "out", "dtype ",
                     dtype_torch_name(c.out->dtype()), " differs from out_dtype ",
                     dtype_torch_name(*c.out_dtype));
  }
  api::plan_settings(s, q.size(1), hkv, d, d, q.dtype(), k.dtype(), od, c.bmm1, c.window_left,
                     std::nullopt, "NONE", op);
  // Device scales as the kernels' per-head factors (scale_q multiplies head h's scores, scale_v
  // group g's output), every head the one value: broadcast on the device, nothing read back. A
  // per-head score factor keeps the call on the CUDA-core kernels (prefill_scale_folds).
  const auto per_head = [](const Tensor& one, int64_t heads) {
    return one.as_strided({heads}, {0}, one.storage_offset()).contiguous();
  };
  if (c.bmm1_dev.defined()) s.scale_q = per_head(c.bmm1_dev, q.size(1));
  if (c.bmm2_dev.defined()) s.scale_v = per_head(c.bmm2_dev, hkv);
  s.paged = true;
  s.page_size = static_cast<int32_t>(page_size);
  s.batch = static_cast<int32_t>(batch);
  s.qo_indptr = c.qo_indptr;
  s.causal = c.causal;
  s.nvfp4_v_linear = c.sf_v_linear;
  s.kv_indptr.assign(static_cast<std::size_t>(batch) + 1, 0);
  s.max_page_id = -1;
  Tensor table_dev;                 // device plans: the block table the kernels read in place
  kernels::BlockTablePlan plan_in;  // device plans: their inputs
  Tensor bth;                       // host plans: the block table on the host
  const int32_t* table = nullptr;   // its elements
  if (device_plan) {
    // Uniform query counts: request b's rows are b * q_len on. Variable ones (cu_seq_lens_q): at
    // most q_len a request, where cum_seq_lens_q says.
    const int64_t q_len = batch > 0 ? c.qo_indptr[1] - c.qo_indptr[0] : 1;
    plan_in = api::block_table_plan_inputs(*c.seq_lens, bt, batch, q_len, -1, c.max_seq_len,
                                           page_size, num_pages, op, table_dev);
    if (c.cu_seq_lens_q != nullptr) {
      plan_in.cu_q = c.cu_seq_lens_q->data<const int32_t>();
      plan_in.total_rows = q.size(0);
      plan_in.causal = c.causal;
    }
    // The grid of the worst case: every request that long.
    const int64_t worst = kernels::block_plan_worst_len(plan_in);
    const int64_t worst_blocks = (worst + page_size - 1) / page_size;
    s.kv_lens.assign(static_cast<std::size_t>(batch), static_cast<int32_t>(worst));
    for (int64_t b = 0; b < batch; ++b) {
      s.kv_indptr[b + 1] = static_cast<int32_t>((b + 1) * worst_blocks);
    }
    s.total_kv = batch * worst;
  } else {
    FLASHINFER_CHECK(static_cast<int64_t>(c.kv_lens.size()) == batch, op, "seq_lens",
                     "host-side bug: ", c.kv_lens.size(), " lengths for a batch of ", batch);
    bth = bt.to(Device::cpu()).contiguous();
    table = static_cast<const int32_t*>(bth.data_ptr());
    s.kv_lens = c.kv_lens;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = c.kv_lens[b];
      const int64_t blocks = (len + page_size - 1) / page_size;
      FLASHINFER_CHECK(blocks <= max_blocks, op, "block_tables", "request ", b, " has ", len,
                       " tokens, ", blocks, " blocks, but the table has ", max_blocks, " columns");
      for (int64_t i = 0; i < blocks; ++i) {
        const int32_t page = table[b * max_blocks + i];
        FLASHINFER_CHECK(page >= 0 && page < num_pages, op, "block_tables", "entry [", b, ", ", i,
                         "] = ", page, " is outside the cache's ", num_pages, " pages");
        s.kv_indices.push_back(page);
        s.max_page_id = std::max<int64_t>(s.max_page_id, page);
      }
      s.kv_indptr[b + 1] = static_cast<int32_t>(s.kv_indices.size());
      s.total_kv += len;
    }
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
      FLASHINFER_CHECK(!c.causal || qo_len <= c.kv_lens[b], op, "seq_lens", "request ", b, " has ",
                       qo_len, " queries but only ", c.kv_lens[b], " keys");
    }
  }
  s.total_qo = s.qo_indptr.back();
  // Variable query counts planned on the device: the grid is the worst case's, the rows the
  // query's (cum_seq_lens_q places them; the plan kernel refuses a request whose rows are not
  // inside them).
  const bool device_rows = device_plan && c.cu_seq_lens_q != nullptr;
  FLASHINFER_CHECK(!device_rows || q.size(0) <= std::numeric_limits<int32_t>::max(), op, "query",
                   "more than 2^31 - 1 rows");
  FLASHINFER_CHECK(device_rows || q.size(0) == s.total_qo, op, "query", "has ", q.size(0),
                   " rows, expected ", s.total_qo);
#if FLASHINFER_WITH_CUDNN
  if (c.cudnn) {
    if (std::optional<AttentionOutput> r = run_cudnn(c, k, v, table, max_blocks, od)) return *r;
  }
#endif
  if (c.spec_mask) {
    FLASHINFER_CHECK_CODE(q.device().is_cpu(), ErrorCode::kUnsupported, op, "mask",
                          "speculative-decoding masks run on the CPU reference only; pass CPU "
                          "tensors");
    s.causal = false;
    load_spec_dec_mask(s, *c.spec_mask, c.spec_q_len, op);
  }
  if (c.key_mask) {
    FLASHINFER_CHECK_CODE(q.device().is_cpu(), ErrorCode::kUnsupported, op, "query",
                          "this window (upstream 0.7.4's window_right, variable windows or "
                          "context-parallel rows) runs on the CPU reference only; pass CPU "
                          "tensors");
    s.causal = false;
    fill_key_mask(s, c.key_mask);
  }

  // Split-KV partials go to scratch of our own (at most 64 MiB), allocated after planning:
  // workspace_buffer is the caller's and stays untouched, so it replays as an input.
  s.workspace_cap = int64_t{64} << 20;
  if (device_plan) {
    api::build_block_table_plan(s, plan_in, table_dev, op);
    if (device_rows) s.total_qo = q.size(0);  // what run checks q, out and lse against
  } else {
    api::build_plan(s, std::nullopt, /*disable_split_kv=*/false, op);
    if (s.plan.num_partial_rows > 0) {
      const int64_t floats = s.plan.num_partial_rows * s.num_qo_heads * (s.head_dim_vo + 1);
      s.float_workspace = Tensor::empty({floats}, DType::kFloat32, s.device);
    }
  }

  AttentionRunOptions o;
  o.v_scale = c.out_scale;
  o.out = c.out;
  o.lse = c.lse;
  o.return_lse = c.return_lse;
  o.enable_pdl = c.enable_pdl;
  o.sinks = c.sinks;
  if (c.kv_cache_sf && !c.kv_cache_sf->is_none()) {
    FLASHINFER_CHECK(
        c.kv_cache_sf->is_tensor() ||
            (c.kv_cache_sf->is_sequence() && c.kv_cache_sf->items().size() == 2 &&
             c.kv_cache_sf->items()[0].is_tensor() && c.kv_cache_sf->items()[1].is_tensor()),
        op, "kv_cache_sf", "expected a tensor or a (k_scales, v_scales) pair, got ",
        c.kv_cache_sf->repr());
    o.kv_cache_sf = PagedKVCache::from_value(*c.kv_cache_sf);
  }
  return api::run_planned(s, q, k, v, o, op, "kv_cache", "kv_cache");
}

// Whether a call of uniform query counts plans on the device (BlockCall::seq_lens): on CUDA, with
// seq_lens and block_tables on the query's device (host copies of them keep the host plan), without
// a speculative-decoding mask and without an NVFP4 cache (whose pages are dequantized through a
// host plan, api/attention_nvfp4.h).
bool plans_on_device(const Tensor& query, const PagedKVCache& kv_cache, const Tensor& seq_lens,
                     const Tensor& block_tables, const std::optional<Value>& kv_cache_sf,
                     const std::optional<Tensor>& mask) {
  const bool nvfp4 = (kv_cache_sf && !kv_cache_sf->is_none()) ||
                     (kv_cache.first().defined() && kv_cache.first().dtype() == DType::kUInt8);
  return query.defined() && query.device().is_cuda() && seq_lens.defined() &&
         seq_lens.device() == query.device() && block_tables.defined() &&
         block_tables.device() == query.device() && !mask && !nvfp4;
}

// Whether a cum_seq_lens_q-like index tensor can stay on the query's device for the plan kernel
// (kernels/block_table_plan.h, BlockTablePlan::cu_q): int32, 1-D, contiguous, batch + 1 >= 1
// entries there.
bool device_indptr(const Tensor& t, const Tensor& query) {
  return t.defined() && query.defined() && t.device() == query.device() &&
         t.dtype() == DType::kInt32 && t.dim() == 1 && t.is_contiguous() && t.size(0) >= 1;
}

// The worst case of a device-planned call of variable query counts: `batch` requests of max_q
// queries each (the grid the host plans; the plan kernel places the real ones).
std::vector<int32_t> worst_indptr(int64_t batch, int64_t max_q, const char* op, const char* arg) {
  FLASHINFER_CHECK(max_q >= 0 && max_q <= std::numeric_limits<int32_t>::max(), op, arg,
                   "must be in [0, 2^31), got ", max_q);
  std::vector<int32_t> v;
  for (int64_t b = 0; b <= batch; ++b) v.push_back(static_cast<int32_t>(b * max_q));
  return v;
}

// The int32 lengths of the first `batch` requests.
std::vector<int32_t> lengths(const Tensor& seq_lens, int64_t batch, int64_t max_len, const char* op,
                             const char* max_arg) {
  std::vector<int32_t> lens = api::index_to_host(seq_lens, op, "seq_lens");
  FLASHINFER_CHECK(static_cast<int64_t>(lens.size()) >= batch, op, "seq_lens", "has ", lens.size(),
                   " elements for a batch of ", batch);
  lens.resize(static_cast<std::size_t>(batch));
  for (std::size_t b = 0; b < lens.size(); ++b) {
    FLASHINFER_CHECK(lens[b] >= 0, op, "seq_lens", "element ", b, " is negative (", lens[b], ")");
    FLASHINFER_CHECK(lens[b] <= max_len, op, max_arg, "is ", max_len, " but seq_lens[", b, "] is ",
                     lens[b]);
  }
  return lens;
}

void check_common_unsupported(const char* op, std::optional<DType>,
                              std::optional<double> o_sf_scale,
                              std::optional<int64_t> o_sf_vec_size,
                              const std::optional<Value>& kv_cache_sf,
                              std::optional<double> skip_softmax, bool uses_shared_paged_kv_idx,
                              const std::optional<Tensor>& counter, const Tensor& query) {
  FLASHINFER_CHECK_CODE(!o_sf_scale, ErrorCode::kUnsupported, op, "o_sf_scale",
                        "NVFP4 output is not supported");
  FLASHINFER_CHECK_CODE(!o_sf_vec_size, ErrorCode::kUnsupported, op, "o_sf_vec_size",
                        "NVFP4 output is not supported");
  static_cast<void>(kv_cache_sf);  // NVFP4 block scales: run_block_call passes them on
  FLASHINFER_CHECK_CODE(!skip_softmax, ErrorCode::kUnsupported, op,
                        "skip_softmax_threshold_scale_factor", "not supported");
  FLASHINFER_CHECK_CODE(uses_shared_paged_kv_idx, ErrorCode::kUnsupported, op,
                        "uses_shared_paged_kv_idx",
                        "separate K and V block tables are not supported");
  if (counter) {  // scratch upstream (multi-CTA semaphores): checked, not written
    api::check_defined(*counter, op, "multi_ctas_kv_counter_buffer");
    api::check_same_device(*counter, query, op, "multi_ctas_kv_counter_buffer", "query");
  }
}

// A call of fp8 output (the xqa decode name's `out`; trtllm decode / context with an fp8 `out`
// or `out_dtype`, as vLLM's fused output quantization asks on Blackwell, or an fp8 query without
// either): computed in fp32, then each value times `mul` converted once to `dtype` with
// saturation to +-448 / +-57344 (CUDA's __nv_fp8 conversions' satfinite). CPU only; into `out`
// where given.
AttentionOutput run_block_call_fp8_out(BlockCall& c, const std::optional<Tensor>& out, DType dtype,
                                       double mul) {
  const char* op = c.op;
  const char* arg = out ? "out" : "out_dtype";
  FLASHINFER_CHECK_CODE(c.query.device().is_cpu(), ErrorCode::kUnsupported, op, arg,
                        "fp8 outputs run on the CPU reference only; pass CPU tensors");
  if (out) {
    api::check_defined(*out, op, "out");
    api::check_shape_eq(*out, c.query.shape(), op, "out");
    FLASHINFER_CHECK(out->device() == c.query.device(), op, "out", "is on ", out->device().str(),
                     ", query on ", c.query.device().str());
  }
  c.out.reset();
  c.out_dtype = DType::kFloat32;
  c.f32_out = true;
  AttentionOutput r = run_block_call(c);
  const Tensor f = r.out.contiguous();
  const auto m = static_cast<float>(mul);
  Tensor q8 = Tensor::empty(f.shape(), dtype);
  auto* dst = static_cast<uint8_t*>(q8.data_ptr());
  const bool e4m3 = dtype == DType::kFloat8E4M3FN;
  for (int64_t i = 0; i < f.numel(); ++i) {
    const float x = f.data<float>()[i] * m;
    dst[i] = e4m3 ? float_to_e4m3fn_bits(x, /*saturate=*/true)
                  : float_to_e5m2_bits(x, /*saturate=*/true);
  }
  if (out) {
    Tensor o = *out;
    o.copy_(q8);
    r.out = o;
  } else {
    r.out = q8;
  }
  return r;
}

// The output dtype of a trtllm decode / context call, as upstream: out's, else out_dtype, else the
// query's.
DType trtllm_out_dtype(const Tensor& query, const std::optional<Tensor>& out,
                       std::optional<DType> out_dtype) {
  return out ? out->dtype() : out_dtype.value_or(query.dtype());
}

// Upstream's xqa kernels (mha.cu, mha_sm90.cu) apply their kv_scale (the Python's bmm2_scale *
// o_scale) only to a quantized cache (isKVCacheQuantized: elements under 2 bytes), while the
// Python has already divided q_scale by it (q_scale = bmm1_scale / kv_scale * sqrt(head_dim)). So
// with a 16-bit cache the scores are scaled by bmm1_scale / (bmm2_scale * o_scale) and the
// attention is not scaled at all (fp8 outputs still by rcp_out_scale). Host scales only: a
// device-resident scale keeps the plain meaning.
void xqa_unquantized_cache_scales(BlockCall& c, const PagedKVCache& kv_cache) {
  const DType kv = kv_cache.first().dtype();
  if (dtype_size(kv) < 2 || c.bmm1_dev.defined() || c.bmm2_dev.defined()) return;
  c.bmm1 = c.bmm1 / c.out_scale;
  c.out_scale = 1.0;
}

std::vector<int32_t> flat_lengths(const Tensor& t, const char* op, const char* arg);

// trtllm_batch_decode_with_kv_cache's upstream 0.7.4 additions.
struct DecodeExtras {
  int64_t cp_world = 1, cp_rank = 0;
  std::optional<Tensor> causal_seqlens_kv_global, request_order;
  std::optional<Value> request_order_plan;
  int64_t sparse_top_k = 0;
};

// Python's tuple text of a shape: "(2, 3)", "(4,)".
std::string py_shape(const Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) {
    s += (i ? ", " : "") + std::to_string(t.size(i));
  }
  return s + (t.dim() == 1 ? ",)" : ")");
}

// Upstream 0.7.4's refusals of its context-parallel speculative decode (decode.py, then its
// Cake DCP runner's), in order; the hardware rule (SM100 / SM103) is this build's CUDA refusal.
void check_dcp_decode(const char* op, const Tensor& q, const PagedKVCache& kv_cache,
                      std::string_view backend, std::string_view kv_layout,
                      std::optional<int64_t> q_len_per_req,
                      const std::optional<Tensor>& cum_seq_lens_q, int64_t window_left,
                      const std::optional<Tensor>& mask, const std::optional<Tensor>& sinks,
                      std::optional<double> skip_softmax, const std::optional<Value>& kv_cache_sf,
                      bool uses_shared_paged_kv_idx, bool block_sparse,
                      const std::optional<Value>& bmm1_scale_log2,
                      const ScalarOrTensor<double>& bmm1_scale,
                      const ScalarOrTensor<double>& bmm2_scale, std::optional<double> o_scale,
                      const std::optional<Tensor>& out, std::optional<DType> out_dtype,
                      const std::optional<Tensor>& lse, bool return_lse, const DecodeExtras& x) {
  auto need = [&](bool ok, const char* arg, const char* text) {
    FLASHINFER_CHECK(ok, op, arg, text);
  };
  need(backend == "auto" || backend == "trtllm-gen", "backend",
       "DCP speculative decode is only available through backend='auto', backend='trtllm-gen', "
       "or the explicit Cake FMHA product backend");
  need(kv_layout == "HND", "kv_layout",
       "DCP speculative decode currently requires kv_layout='HND'");
  const DType kv = kv_cache.first().dtype();
  need((kv == DType::kBFloat16 || kv == DType::kFloat8E4M3FN) &&
           (!kv_cache_sf || kv_cache_sf->is_none()),
       "kv_cache",
       "DCP speculative decode supports BF16 or FP8 e4m3 KV cache, but not NVFP4 or block scale "
       "tensors");
  need(q_len_per_req.has_value(), "q_len_per_req",
       "DCP speculative decode requires uniform q_len_per_req");
  need(!cum_seq_lens_q, "cum_seq_lens_q",
       "DCP speculative decode does not yet support ragged query lengths");
  need(window_left == -1 && !mask, window_left != -1 ? "window_left" : "mask",
       "DCP speculative decode currently supports causal full attention only");
  need(!sinks, "sinks", "DCP speculative decode does not yet support attention sinks");
  need(!skip_softmax, "skip_softmax_threshold_scale_factor",
       "DCP speculative decode does not support skip-softmax");
  need(uses_shared_paged_kv_idx, "uses_shared_paged_kv_idx",
       "DCP speculative decode requires a shared K/V page table");
  need(!block_sparse, "enable_block_sparse_attention",
       "DCP speculative decode does not support block-sparse attention");
  need(!bmm1_scale_log2 || bmm1_scale_log2->is_none(), "bmm1_scale_log2",
       "DCP speculative decode takes a host bmm1_scale; bmm1_scale_log2 device tensors are not "
       "yet supported");
  need(!bmm1_scale.is_tensor() && !bmm2_scale.is_tensor(), "bmm1_scale",
       "DCP speculative decode requires host scalar bmm1/bmm2 scales");
  need(o_scale.value_or(1.0) == 1.0, "o_scale",
       "DCP speculative decode currently requires o_scale=1.0");
  need(!out || out->dtype() == DType::kBFloat16, "out",
       "DCP speculative decode requires BF16 output");
  need(!out_dtype || *out_dtype == DType::kBFloat16, "out_dtype",
       "DCP speculative decode requires out_dtype=torch.bfloat16");
  need(return_lse || lse.has_value(), "return_lse",
       "DCP speculative decode requires return_lse=True or a caller-owned lse buffer");
  need(q.dtype() == DType::kBFloat16, "query", "DCP speculative FMHA requires a BF16 query tensor");
  FLASHINFER_CHECK(x.cp_world == 1 || x.cp_world == 2 || x.cp_world == 4 || x.cp_world == 8, op,
                   "cp_world", "cp_world must be one of (1, 2, 4, 8)");
  FLASHINFER_CHECK(x.cp_rank >= 0 && x.cp_rank < x.cp_world, op, "cp_rank",
                   "cp_rank must be in [0, ", x.cp_world, "), got ", x.cp_rank);
  const Tensor& g = *x.causal_seqlens_kv_global;
  FLASHINFER_CHECK(g.dtype() == DType::kInt32 && g.dim() == 1, op, "causal_seqlens_kv_global",
                   "must be an int32 [batch] tensor");
  need(g.is_contiguous(), "causal_seqlens_kv_global",
       "causal_seqlens_kv_global must be contiguous");
  FLASHINFER_CHECK_CODE(q.device().is_cpu(), ErrorCode::kUnsupported, op,
                        "causal_seqlens_kv_global",
                        "DCP speculative decode runs on SM100 / SM103 upstream; here on the CPU "
                        "reference only (pass CPU tensors)");
}

AttentionOutput decode_impl(
    const Tensor& query, const PagedKVCache& kv_cache, const Tensor& workspace_buffer,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_seq_len,
    const ScalarOrTensor<double>& bmm1_scale, const ScalarOrTensor<double>& bmm2_scale,
    int64_t window_left, const std::optional<Tensor>& out, std::optional<DType> out_dtype,
    std::optional<double> o_sf_scale, std::optional<int64_t> o_sf_vec_size,
    const std::optional<Tensor>& sinks, std::string_view kv_layout, std::optional<bool> enable_pdl,
    std::string_view backend, std::optional<int64_t> q_len_per_req, std::optional<double> o_scale,
    const std::optional<Tensor>& mask, std::optional<int64_t> max_q_len,
    const std::optional<Tensor>& cum_seq_lens_q, std::optional<double> skip_softmax,
    const std::optional<Value>& kv_cache_sf, bool uses_shared_paged_kv_idx,
    const std::optional<Tensor>& lse, bool return_lse, const std::optional<Value>& bmm1_scale_log2,
    const std::optional<Tensor>& counter, bool enable_block_sparse_attention,
    const std::optional<Value>& transform_mode, const DecodeExtras& x = {}) {
  const char* op = kDecodeOp;
  // Upstream 0.7.4's first checks (decode.py), then its token-sparse and context-parallel paths.
  const bool dcp = x.causal_seqlens_kv_global.has_value();
  FLASHINFER_CHECK(!x.request_order || backend == "cake", op, "request_order",
                   "request_order requires the explicit backend='cake'");
  FLASHINFER_CHECK(!x.request_order_plan || x.request_order_plan->is_none() ||
                       (x.request_order && x.request_order->device().is_cuda()),
                   op, "request_order_plan",
                   "request_order_plan requires a device request_order "
                   "tensor");
  FLASHINFER_CHECK(!(x.request_order && dcp), op, "request_order",
                   "request_order is not supported by DCP speculative decode");
  FLASHINFER_CHECK(!(dcp && enable_pdl.value_or(false)), op, "enable_pdl",
                   "DCP speculative decode does not support enable_pdl=True");
  if (x.sparse_top_k != 0) {
    // Token-sparse MQA decode: request b's one query attends K row block_tables[b, 0, j] and V
    // row block_tables[b, 1, j] for j < seq_lens[b], no positional mask. Upstream's checks in
    // its order; then those rows are gathered into a cache of one-token pages, request b's at
    // pages b k + j, and the dense decode runs on it.
    const int64_t k = x.sparse_top_k, tokens = query.dim() >= 1 ? query.size(0) : 0;
    FLASHINFER_CHECK(q_len_per_req.value_or(0) == 1 && !cum_seq_lens_q, op, "sparse_top_k",
                     "sparse_top_k requires one query token per request");
    FLASHINFER_CHECK(window_left == -1 && !sinks, op, "sparse_top_k",
                     "sparse_top_k supports neither a sliding window nor attention sinks");
    FLASHINFER_CHECK(
        !uses_shared_paged_kv_idx && block_tables.dim() == 3 && block_tables.size(1) == 2 &&
            block_tables.size(2) == k && block_tables.size(0) >= tokens && seq_lens.dim() == 1 &&
            seq_lens.size(0) >= tokens,
        op, "block_tables",
        "sparse_top_k requires uses_shared_paged_kv_idx=False, block_tables of shape "
        "[batch_size, 2, ",
        k, "] and batch_size seq_lens, got ", py_shape(block_tables), " and ", py_shape(seq_lens));
    const bool hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
    auto [kv_k, kv_v] = block_cache_views(kv_cache, hnd, op);
    FLASHINFER_CHECK(kv_k.size(1) == 1 && kv_k.stride(0) == kv_v.stride(0), op, "kv_cache",
                     "sparse_top_k needs one-token K and V pages of one stride");
    FLASHINFER_CHECK(kv_k.size(2) == 1, op, "kv_cache", "sparse_top_k needs one KV head (MQA)");
    FLASHINFER_CHECK(kv_k.size(3) != 512, op, "sparse_top_k",
                     "sparse_top_k with head dim 512 is MLA's: use "
                     "trtllm_batch_decode_with_kv_cache_mla");
    FLASHINFER_CHECK(k > 0 && k % 4 == 0 && tokens <= 65535, op, "sparse_top_k",
                     "sparse_top_k must be a multiple of 4 and batch_size at most 65535");
    FLASHINFER_CHECK(backend == "auto" || backend == "trtllm-gen", op, "backend",
                     "sparse_top_k is only supported by the trtllm-gen backend, got '", backend,
                     "'");
    FLASHINFER_CHECK_CODE(query.dim() == 3 && query.size(1) <= 128, ErrorCode::kUnsupported, op,
                          "query",
                          "Token-sparse attention supports MLA decode, or MQA decode with one KV "
                          "head, page size 1, no top-k lengths and at most 128 query heads");
    FLASHINFER_CHECK_CODE(query.device().is_cpu(), ErrorCode::kUnsupported, op, "sparse_top_k",
                          "token-sparse decode runs on the CPU reference only (pass CPU tensors)");
    // An NVFP4 cache's block scales would have to be gathered with its rows.
    FLASHINFER_CHECK_CODE(kv_k.dtype() != DType::kUInt8 && (!kv_cache_sf || kv_cache_sf->is_none()),
                          ErrorCode::kUnsupported, op, "kv_cache_sf",
                          "token-sparse decode over an NVFP4 cache is not implemented");
    const std::vector<int32_t> lens = lengths(seq_lens, tokens, max_seq_len, op, "max_seq_len");
    const Tensor table = block_tables.to(Device::cpu()).contiguous();
    const auto* idx = table.data<int32_t>();
    const int64_t pages = kv_k.size(0), d = kv_k.size(3);
    Tensor gk = Tensor::zeros({tokens * k, 1, 1, d}, kv_k.dtype(), Device::cpu());
    Tensor gv = Tensor::zeros({tokens * k, 1, 1, d}, kv_v.dtype(), Device::cpu());
    std::vector<double> pages_of(static_cast<std::size_t>(tokens * k));
    for (int64_t b = 0; b < tokens; ++b) {
      FLASHINFER_CHECK(lens[static_cast<std::size_t>(b)] <= k, op, "seq_lens", "seq_lens[", b,
                       "] = ", lens[static_cast<std::size_t>(b)], " exceeds sparse_top_k ", k);
      for (int64_t j = 0; j < k; ++j) {
        pages_of[static_cast<std::size_t>(b * k + j)] = static_cast<double>(b * k + j);
        if (j >= lens[static_cast<std::size_t>(b)]) continue;
        for (int64_t kv = 0; kv < 2; ++kv) {
          // Negative entries read row 0, as upstream's reference clamps them.
          const int64_t row = std::max<int32_t>(idx[(b * 2 + kv) * k + j], 0);
          FLASHINFER_CHECK(row < pages, op, "block_tables", "entry [", b, ", ", kv, ", ", j,
                           "] = ", row, " is outside the cache's ", pages, " pages");
          (kv == 0 ? gk : gv)
              .slice(0, b * k + j, b * k + j + 1)
              .copy_((kv == 0 ? kv_k : kv_v).slice(0, row, row + 1));
        }
      }
    }
    const PagedKVCache gathered(gk, gv);
    const Tensor dense_table = Tensor::from_vector(pages_of, {tokens, k}, DType::kInt32);
    return decode_impl(query, gathered, workspace_buffer, dense_table, seq_lens, max_seq_len,
                       bmm1_scale, bmm2_scale, -1, out, out_dtype, o_sf_scale, o_sf_vec_size, sinks,
                       kv_layout, enable_pdl, "trtllm-gen", 1, o_scale, mask, max_q_len,
                       std::nullopt, skip_softmax, kv_cache_sf, true, lse, return_lse,
                       bmm1_scale_log2, counter, enable_block_sparse_attention, transform_mode);
  }
  FLASHINFER_CHECK(dcp || (x.cp_world == 1 && x.cp_rank == 0), op, "causal_seqlens_kv_global",
                   "cp_world/cp_rank require causal_seqlens_kv_global to enable the DCP "
                   "speculative decode path");
  // Upstream's DCP refusals come before its generic ones.
  if (dcp) {
    check_dcp_decode(op, query, kv_cache, backend, kv_layout, q_len_per_req, cum_seq_lens_q,
                     window_left, mask, sinks, skip_softmax, kv_cache_sf, uses_shared_paged_kv_idx,
                     enable_block_sparse_attention, bmm1_scale_log2, bmm1_scale, bmm2_scale,
                     o_scale, out, out_dtype, lse, return_lse, x);
  }
  check_common_unsupported(op, out_dtype, o_sf_scale, o_sf_vec_size, kv_cache_sf, skip_softmax,
                           uses_shared_paged_kv_idx, counter, query);
  FLASHINFER_CHECK(
      backend == "auto" || backend == "xqa" || backend == "trtllm-gen" || backend == "cake", op,
      "backend", "must be \"auto\", \"xqa\", \"trtllm-gen\" or \"cake\", got \"", backend, "\"");
  FLASHINFER_CHECK_CODE(backend != "cake", ErrorCode::kUnsupported, op, "backend",
                        "the 'cake' FMHA kernels (SM100 / SM103) are not implemented here");
  // The bit-packed draft mask is the xqa kernels' (upstream passes it on to xqa); trtllm-gen's
  // treatment of it, and which kernel "auto" picks, depend on the GPU.
  FLASHINFER_CHECK_CODE(!mask || backend == "xqa", ErrorCode::kUnsupported, op, "mask",
                        "speculative-decoding masks are supported with backend=\"xqa\" only, got "
                        "backend=\"",
                        backend, "\"");
  FLASHINFER_CHECK_CODE(!bmm1_scale_log2 || bmm1_scale_log2->is_none(), ErrorCode::kUnsupported, op,
                        "bmm1_scale_log2", "not supported; pass bmm1_scale");
  FLASHINFER_CHECK_CODE(!enable_block_sparse_attention, ErrorCode::kUnsupported, op,
                        "enable_block_sparse_attention", "not supported");
  FLASHINFER_CHECK_CODE(!transform_mode || transform_mode->is_none(), ErrorCode::kUnsupported, op,
                        "bf16q_fp8kv_transform_mode", "not supported");
  FLASHINFER_CHECK(max_seq_len >= 0, op, "max_seq_len", "must be >= 0, got ", max_seq_len);
  api::check_defined(query, op, "query");
  api::check_dim(query, {3}, op, "query");
  const int64_t tokens = query.size(0);

  BlockCall c;
  c.op = op;
  c.query = query;
  c.kv_cache = &kv_cache;
  c.workspace_buffer = &workspace_buffer;
  c.block_tables = &block_tables;
  c.hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
  // Where the tensors allow it, the call plans on the device (and cum_seq_lens_q stays there).
  const bool on_device =
      plans_on_device(query, kv_cache, seq_lens, block_tables, kv_cache_sf, mask);
  int64_t batch = 0;
  if (q_len_per_req) {
    // Uniform query count per request (upstream ignores cum_seq_lens_q then).
    FLASHINFER_CHECK(*q_len_per_req >= 1, op, "q_len_per_req", "must be >= 1, got ",
                     *q_len_per_req);
    FLASHINFER_CHECK(tokens % *q_len_per_req == 0, op, "query", "has ", tokens,
                     " rows, not a multiple of q_len_per_req=", *q_len_per_req);
    batch = tokens / *q_len_per_req;
    for (int64_t b = 0; b <= batch; ++b) {
      c.qo_indptr.push_back(static_cast<int32_t>(b * *q_len_per_req));
    }
  } else {
    FLASHINFER_CHECK(cum_seq_lens_q.has_value() && max_q_len.has_value(), op, "cum_seq_lens_q",
                     "q_len_per_req=None needs cum_seq_lens_q and max_q_len");
    // (max_q_len 0: no query rows to plan a grid for; the host plan takes it.)
    if (on_device && *max_q_len >= 1 && device_indptr(*cum_seq_lens_q, query)) {
      // Planned on the device with cum_seq_lens_q there (as the context call).
      batch = cum_seq_lens_q->size(0) - 1;
      c.qo_indptr = worst_indptr(batch, *max_q_len, op, "max_q_len");
      c.cu_seq_lens_q = &*cum_seq_lens_q;
    } else {
      c.qo_indptr = api::index_to_host(*cum_seq_lens_q, op, "cum_seq_lens_q");
      api::check_indptr(c.qo_indptr, op, "cum_seq_lens_q");
      batch = static_cast<int64_t>(c.qo_indptr.size()) - 1;
      for (int64_t b = 0; b < batch; ++b) {
        FLASHINFER_CHECK(c.qo_indptr[b + 1] - c.qo_indptr[b] <= *max_q_len, op, "max_q_len", "is ",
                         *max_q_len, " but request ", b, " has ",
                         c.qo_indptr[b + 1] - c.qo_indptr[b], " queries");
      }
    }
  }
  if (on_device && (q_len_per_req || c.cu_seq_lens_q != nullptr)) {
    c.seq_lens = &seq_lens;
    c.max_seq_len = max_seq_len;
  } else if (dcp) {
    c.kv_lens.assign(static_cast<std::size_t>(batch), 0);  // from the rows' visible counts below
  } else {
    c.kv_lens = lengths(seq_lens, batch, max_seq_len, op, "max_seq_len");
  }
  if (mask) {  // xqa's draft mask (see trtllm_attention_xqa_impl below)
    FLASHINFER_CHECK_CODE(q_len_per_req && *q_len_per_req > 1, ErrorCode::kUnsupported, op, "mask",
                          "a speculative-decoding mask needs q_len_per_req > 1");
    FLASHINFER_CHECK_CODE(window_left < 0, ErrorCode::kUnsupported, op, "window_left",
                          "a sliding window with a speculative-decoding mask is not supported "
                          "(upstream's xqa kernel drops whole KV tiles there)");
    c.spec_mask = mask;
    c.spec_q_len = *q_len_per_req;
  } else {
    // Several queries of a request are its last tokens, causal among themselves (speculative
    // verification, as the trtllm-gen kernels treat them); one query sees every key.
    for (int64_t b = 0; b < batch; ++b) c.causal |= c.qo_indptr[b + 1] - c.qo_indptr[b] > 1;
  }
  if (dcp) {
    // This rank holds global positions l W + r; query row j of request b sees local keys
    // l < n_j = max(0, floor((S + j - r) / W) + 1), S = causal_seqlens_kv_global[b]. seq_lens
    // masks nothing there; the keys read are at most max_seq_len.
    const std::vector<int32_t> S =
        flat_lengths(*x.causal_seqlens_kv_global, op, "causal_seqlens_kv_global");
    FLASHINFER_CHECK(static_cast<int64_t>(S.size()) >= batch, op, "causal_seqlens_kv_global",
                     "has ", S.size(), " entries for a batch of ", batch);
    const int64_t W = x.cp_world, r = x.cp_rank;
    auto visible_count = [S, W, r](int64_t b, int64_t j) {
      const int64_t delta = static_cast<int64_t>(S[static_cast<std::size_t>(b)]) + j - r;
      return delta >= 0 ? delta / W + 1 : int64_t{0};
    };
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t q_len = c.qo_indptr[b + 1] - c.qo_indptr[b];
      c.kv_lens[static_cast<std::size_t>(b)] = static_cast<int32_t>(
          std::min<int64_t>(max_seq_len, q_len > 0 ? visible_count(b, q_len - 1) : 0));
    }
    c.causal = false;
    c.key_mask = [visible_count](int64_t b, int64_t t, int64_t j) {
      return j < visible_count(b, t);
    };
  }
  // Tensor scales stay on the device where the call plans there (c.seq_lens set above).
  const std::optional<Device> scale_dev =
      c.seq_lens ? std::optional<Device>(query.device()) : std::nullopt;
  c.bmm1 = api::fused_scale_value(bmm1_scale, op, "bmm1_scale", scale_dev, &c.bmm1_dev);
  double o_mul = 1.0;
  if (o_scale) {
    FLASHINFER_CHECK(std::isfinite(*o_scale) && *o_scale != 0.0, op, "o_scale",
                     "must be finite and non-zero, got ", *o_scale);
    // xqa (upstream's "auto" on SM80/SM90) scales the KV by bmm2_scale * o_scale and multiplies
    // only an fp8 output by 1 / o_scale; 16-bit outputs keep the o_scale factor.
    if (backend != "trtllm-gen") o_mul = *o_scale;
  }
  c.out_scale =
      api::fused_scale_value(bmm2_scale, op, "bmm2_scale", scale_dev, &c.bmm2_dev) * o_mul;
  if (backend == "xqa") xqa_unquantized_cache_scales(c, kv_cache);
  c.window_left = window_left;
  c.out = out;
  c.out_dtype = out_dtype;
  c.lse = lse;
  c.return_lse = return_lse;
  c.sinks = sinks;
  c.enable_pdl = enable_pdl;
  c.kv_cache_sf = kv_cache_sf;
  // NVFP4 V scales: xqa's linear layout for backend="xqa"; "auto" is trtllm-gen's interleave
  // (SM100, where upstream's auto picks trtllm-gen, is where engines enable NVFP4 KV caches).
  c.sf_v_linear = backend == "xqa";
  if (const DType od = trtllm_out_dtype(query, out, out_dtype); dtype_is_fp8(od)) {
    // xqa's 1 / o_scale on an fp8 output (o_mul above), none for trtllm-gen.
    return run_block_call_fp8_out(c, out, od, 1.0 / o_mul);
  }
  return run_block_call(c);
}

AttentionOutput context_impl(
    const Tensor& query, const PagedKVCache& kv_cache, const Tensor& workspace_buffer,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_q_len, int64_t max_kv_len,
    const ScalarOrTensor<double>& bmm1_scale, const ScalarOrTensor<double>& bmm2_scale,
    int64_t batch_size, const Tensor& cum_seq_lens_q, const Tensor& cum_seq_lens_kv,
    int64_t window_left, const std::optional<Tensor>& out, std::optional<DType> out_dtype,
    std::optional<double> o_sf_scale, std::optional<int64_t> o_sf_vec_size,
    std::string_view kv_layout, std::optional<bool> enable_pdl, const std::optional<Tensor>& sinks,
    const std::optional<Value>& kv_cache_sf, std::optional<double> skip_softmax,
    bool uses_shared_paged_kv_idx, bool causal, const std::optional<Tensor>& lse, bool return_lse,
    const std::optional<Tensor>& counter, std::optional<bool> use_fp16_softmax,
    std::optional<bool> uses_spcompress, std::string_view backend, int64_t window_right,
    const std::optional<Tensor>& vw_starts, const std::optional<Tensor>& vw_ends) {
  const char* op = kContextOp;
  // Upstream 0.7.4's window arguments, its checks in its order (prefill.py).
  FLASHINFER_CHECK(backend == "trtllm-gen" || backend == "cake", op, "backend",
                   "trtllm_batch_context_with_kv_cache backend must be 'trtllm-gen' or 'cake'");
  FLASHINFER_CHECK(window_left >= -1 && window_right >= -1, op,
                   window_left < -1 ? "window_left" : "window_right",
                   "window_left and window_right must be at least -1");
  const bool variable = vw_starts.has_value() || vw_ends.has_value();
  std::vector<int32_t> vw_lo, vw_hi;
  if (variable) {
    FLASHINFER_CHECK(vw_starts && vw_ends, op,
                     vw_starts ? "variable_window_token_ends" : "variable_window_token_starts",
                     "variable_window_token_starts and variable_window_token_ends must be "
                     "provided together");
    FLASHINFER_CHECK(window_left == -1 && window_right == -1, op, "window_left",
                     "variable windows cannot be combined with fixed window bounds");
    for (const auto& [t, name] : {std::pair{&*vw_starts, "variable_window_token_starts"},
                                  {&*vw_ends, "variable_window_token_ends"}}) {
      FLASHINFER_CHECK(t->dim() == 1 && t->size(0) == query.size(0), op, name, "Invalid shape of ",
                       name, ": expected (", query.size(0), ",), got ",
                       shape_to_string(t->shape()));
      FLASHINFER_CHECK(t->dtype() == DType::kInt32, op, name, "Invalid dtype of ", name,
                       ": expected torch.int32, got ", dtype_torch_name(t->dtype()));
      FLASHINFER_CHECK(t->device() == query.device(), op, name, "Invalid device of ", name,
                       ": expected ", query.device().str(), ", got ", t->device().str());
      FLASHINFER_CHECK(t->is_contiguous(), op, name, "variable window bounds must be contiguous");
    }
    if (query.device().is_cpu()) {
      vw_lo = flat_lengths(*vw_starts, op, "variable_window_token_starts");
      vw_hi = flat_lengths(*vw_ends, op, "variable_window_token_ends");
    }
  } else if (causal) {
    FLASHINFER_CHECK(window_right == -1 || window_right == 0, op, "window_right",
                     "causal attention requires window_right to be -1 or 0");
  } else {
    FLASHINFER_CHECK(!(window_left == -1 && window_right >= 0), op, "window_right",
                     "right-only non-causal windows are unsupported");
    FLASHINFER_CHECK(!(window_left >= 0 && window_right == -1), op, "window_right",
                     "non-causal fixed-window attention requires window_right >= 0");
  }
  if (backend == "cake") {
    FLASHINFER_CHECK_CODE(
        !variable && !(!causal && window_right > 0) && !(!causal && window_left >= 0),
        ErrorCode::kUnsupported, op, "backend",
        "The cake backend supports only dense attention or a causal left "
        "window; two-sided, non-causal sliding, and variable attention windows "
        "are unsupported.");
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "backend",
                    "the 'cake' FMHA kernels (SM100 / SM103) are not implemented here");
  }
  const bool two_sided = !variable && !causal && window_left >= 0 && window_right >= 0;
  check_common_unsupported(op, out_dtype, o_sf_scale, o_sf_vec_size, kv_cache_sf, skip_softmax,
                           uses_shared_paged_kv_idx, counter, query);
  FLASHINFER_CHECK_CODE(!use_fp16_softmax.value_or(false), ErrorCode::kUnsupported, op,
                        "use_fp16_softmax", "not supported (softmax is fp32)");
  FLASHINFER_CHECK_CODE(!uses_spcompress.value_or(false), ErrorCode::kUnsupported, op,
                        "uses_spcompress", "not supported");
  FLASHINFER_CHECK(batch_size >= 0, op, "batch_size", "must be >= 0, got ", batch_size);
  FLASHINFER_CHECK(max_q_len >= 0, op, "max_q_len", "must be >= 0, got ", max_q_len);
  FLASHINFER_CHECK(max_kv_len >= 0, op, "max_kv_len", "must be >= 0, got ", max_kv_len);

  BlockCall c;
  c.op = op;
  c.query = query;
  c.kv_cache = &kv_cache;
  c.workspace_buffer = &workspace_buffer;
  c.block_tables = &block_tables;
  c.hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
  // On CUDA, with cum_seq_lens_q, seq_lens and block_tables on the query's device, the call plans
  // there as the block-table decode calls do (kernels/block_table_plan.h): the grid for every
  // request max_q_len queries and max_kv_len keys long, filled by the plan kernel from the device
  // tensors; nothing is read back. A request the host checks would refuse gets NaN rows (on the
  // CPU the call is an Error naming the argument).
  // (max_q_len 0: no query rows to plan a grid for; the host plan takes it, as it does requests
  // of no queries.)
  const bool device_plan =
      max_q_len >= 1 && device_indptr(cum_seq_lens_q, query) &&
      plans_on_device(query, kv_cache, seq_lens, block_tables, kv_cache_sf, std::nullopt);
  if (device_plan) {
    api::check_index_tensor(cum_seq_lens_q, op, "cum_seq_lens_q", batch_size + 1);
    c.qo_indptr = worst_indptr(batch_size, max_q_len, op, "max_q_len");
    c.seq_lens = &seq_lens;
    c.max_seq_len = max_kv_len;
    c.cu_seq_lens_q = &cum_seq_lens_q;
  } else {
    c.qo_indptr = api::index_to_host(cum_seq_lens_q, op, "cum_seq_lens_q", batch_size + 1);
    api::check_indptr(c.qo_indptr, op, "cum_seq_lens_q");
    for (int64_t b = 0; b < batch_size; ++b) {
      FLASHINFER_CHECK(c.qo_indptr[b + 1] - c.qo_indptr[b] <= max_q_len, op, "max_q_len", "is ",
                       max_q_len, " but request ", b, " has ", c.qo_indptr[b + 1] - c.qo_indptr[b],
                       " queries");
    }
    // Each request's KV length is seq_lens[b] (its queries are its last tokens), bounded by
    // max_kv_len as the kernels' grid is.
    c.kv_lens = lengths(seq_lens, batch_size, max_kv_len, op, "max_kv_len");
  }
  // With a paged cache upstream's launcher hands cum_seq_lens_kv to the kernel, which does not
  // read it for KV positions: the block table and seq_lens place every key. Its contents vary by
  // caller (vLLM and upstream's tests pass the per-request block-table offsets, cumulative page
  // counts; others the cumulative token counts), so only its form is checked.
  api::check_defined(cum_seq_lens_kv, op, "cum_seq_lens_kv");
  api::check_dim(cum_seq_lens_kv, {1}, op, "cum_seq_lens_kv");
  FLASHINFER_CHECK(cum_seq_lens_kv.dtype() == DType::kInt32, op, "cum_seq_lens_kv",
                   "expected an int32 tensor, got ", dtype_torch_name(cum_seq_lens_kv.dtype()));
  FLASHINFER_CHECK(cum_seq_lens_kv.size(0) == batch_size + 1, op, "cum_seq_lens_kv", "expected ",
                   batch_size + 1, " elements (batch_size + 1), got ", cum_seq_lens_kv.size(0));
  c.causal = causal && !variable;  // variable windows replace the causal mask upstream
  // Tensor scales are read back (the tensor-core prefill kernels take the factor as a parameter),
  // except in a call being captured into a CUDA graph, which cannot read back: there they stay on
  // the device as the decode call keeps them, and the kernels that read them run.
  const bool tensor_scale = bmm1_scale.is_tensor() || bmm2_scale.is_tensor();
  const std::optional<Device> scale_dev =
      device_plan && tensor_scale && detail::cuda_current_stream_capturing()
          ? std::optional<Device>(query.device())
          : std::nullopt;
  c.bmm1 = api::fused_scale_value(bmm1_scale, op, "bmm1_scale", scale_dev, &c.bmm1_dev);
  c.out_scale = api::fused_scale_value(bmm2_scale, op, "bmm2_scale", scale_dev, &c.bmm2_dev);
  c.window_left = window_left;
  // Windows the kernels' flags do not express, as a key mask over each request's keys: query t
  // of request b sits at p = kv_len - qo_len + t (inclusive bounds).
  if (variable) {
    c.window_left = -1;
    c.key_mask = [&c, vw_lo, vw_hi](int64_t b, int64_t t, int64_t j) {
      const auto row = static_cast<std::size_t>(c.qo_indptr[b] + t);
      return j >= vw_lo[row] && j <= vw_hi[row];
    };
  } else if (two_sided) {
    c.window_left = -1;
    c.key_mask = [&c, window_left, window_right](int64_t b, int64_t t, int64_t j) {
      const int64_t p = c.kv_lens[b] - (c.qo_indptr[b + 1] - c.qo_indptr[b]) + t;
      return j >= p - window_left && j <= p + window_right;
    };
  }
  c.out = out;
  c.out_dtype = out_dtype;
  c.lse = lse;
  c.return_lse = return_lse;
  c.sinks = sinks;
  c.enable_pdl = enable_pdl;
  c.kv_cache_sf = kv_cache_sf;
  if (const DType od = trtllm_out_dtype(query, out, out_dtype); dtype_is_fp8(od)) {
    return run_block_call_fp8_out(c, out, od, 1.0);
  }
  return run_block_call(c);
}

Tensor trtllm_attention_xqa_impl(
    const Tensor& query, const PagedKVCache& kv_cache, const Tensor& workspace_buffer,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_seq_len,
    const ScalarOrTensor<double>& bmm1_scale, const ScalarOrTensor<double>& bmm2_scale,
    int64_t window_left, const std::optional<Tensor>& out, const std::optional<Tensor>& sinks,
    std::string_view kv_layout, std::optional<bool> enable_pdl,
    std::optional<int64_t> q_len_per_req, std::optional<double> o_scale,
    const std::optional<Tensor>& mask, const std::optional<Value>& kv_cache_sf,
    const std::optional<Tensor>& q_cu_seq_lens) {
  const char* op = kTrtllmAttentionXqaOp;
  FLASHINFER_CHECK(max_seq_len >= 0, op, "max_seq_len", "must be >= 0, got ", max_seq_len);
  api::check_defined(query, op, "query");
  api::check_dim(query, {3}, op, "query");
  const int64_t q_len = q_len_per_req.value_or(1);
  FLASHINFER_CHECK(q_len >= 1, op, "q_len_per_req", "must be >= 1, got ", q_len);
  BlockCall c;
  c.op = op;
  c.query = query;
  c.kv_cache = &kv_cache;
  c.workspace_buffer = &workspace_buffer;
  c.block_tables = &block_tables;
  c.hnd = api::parse_kv_layout(kv_layout, op, "kv_layout");
  const bool on_device =
      plans_on_device(query, kv_cache, seq_lens, block_tables, kv_cache_sf, mask);
  int64_t batch = 0;
  if (on_device && q_cu_seq_lens && device_indptr(*q_cu_seq_lens, query)) {
    // Planned on the device with q_cu_seq_lens there (as the context call).
    batch = q_cu_seq_lens->size(0) - 1;
    c.qo_indptr = worst_indptr(batch, q_len, op, "q_len_per_req");
    c.cu_seq_lens_q = &*q_cu_seq_lens;
  } else if (q_cu_seq_lens) {
    c.qo_indptr = api::index_to_host(*q_cu_seq_lens, op, "q_cu_seq_lens");
    api::check_indptr(c.qo_indptr, op, "q_cu_seq_lens");
    batch = static_cast<int64_t>(c.qo_indptr.size()) - 1;
    for (int64_t b = 0; b < batch; ++b) {
      FLASHINFER_CHECK(c.qo_indptr[b + 1] - c.qo_indptr[b] <= q_len, op, "q_cu_seq_lens",
                       "request ", b, " has ", c.qo_indptr[b + 1] - c.qo_indptr[b],
                       " queries, more than q_len_per_req=", q_len);
    }
  } else {
    FLASHINFER_CHECK(query.size(0) % q_len == 0, op, "query", "has ", query.size(0),
                     " rows, not a multiple of q_len_per_req=", q_len);
    batch = query.size(0) / q_len;
    for (int64_t b = 0; b <= batch; ++b) c.qo_indptr.push_back(static_cast<int32_t>(b * q_len));
  }
  if (on_device && (!q_cu_seq_lens || c.cu_seq_lens_q != nullptr)) {
    c.seq_lens = &seq_lens;
    c.max_seq_len = max_seq_len;
  } else {
    c.kv_lens = lengths(seq_lens, batch, max_seq_len, op, "max_seq_len");
  }
  if (mask) {
    // Upstream's xqa kernels read the mask only when compiled for q_seq_len > 1, and then skip
    // whole KV tiles for a sliding window (mha.cu): a window is not pinned down per token there.
    FLASHINFER_CHECK_CODE(q_len > 1, ErrorCode::kUnsupported, op, "mask",
                          "a speculative-decoding mask needs q_len_per_req > 1");
    FLASHINFER_CHECK_CODE(window_left < 0, ErrorCode::kUnsupported, op, "window_left",
                          "a sliding window with a speculative-decoding mask is not supported "
                          "(upstream's xqa kernel drops whole KV tiles there)");
    c.spec_mask = mask;
    c.spec_q_len = q_len;
  } else {
    // Without a mask the draft tokens are causal among themselves (generate_causal_mask's).
    for (int64_t b = 0; b < batch; ++b) c.causal |= c.qo_indptr[b + 1] - c.qo_indptr[b] > 1;
  }
  const std::optional<Device> scale_dev =
      c.seq_lens ? std::optional<Device>(query.device()) : std::nullopt;
  c.bmm1 = api::fused_scale_value(bmm1_scale, op, "bmm1_scale", scale_dev, &c.bmm1_dev);
  const double o_mul = o_scale.value_or(1.0);
  FLASHINFER_CHECK(std::isfinite(o_mul) && o_mul != 0.0, op, "o_scale",
                   "must be finite and non-zero, got ", o_mul);
  c.out_scale =
      api::fused_scale_value(bmm2_scale, op, "bmm2_scale", scale_dev, &c.bmm2_dev) * o_mul;
  xqa_unquantized_cache_scales(c, kv_cache);
  c.window_left = window_left;
  c.out = out;  // upstream: out's dtype, else query's
  c.sinks = sinks;
  c.enable_pdl = enable_pdl;
  c.kv_cache_sf = kv_cache_sf;
  c.sf_v_linear = true;  // the xqa kernels read V's NVFP4 block scales linearly
  if (!out || !dtype_is_fp8(out->dtype())) return run_block_call(c).out;
  // fp8 output: xqa multiplies the (bmm2_scale * o_scale)-scaled result by rcp_out_scale =
  // 1 / o_scale and converts with saturation.
  return run_block_call_fp8_out(c, out, out->dtype(), 1.0 / o_mul).out;
}

// Lengths given in any shape with `batch` int32 elements (cuDNN takes [batch, 1, 1, 1]).
std::vector<int32_t> flat_lengths(const Tensor& t, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK(t.dtype() == DType::kInt32, op, arg, "expected int32, got ",
                   dtype_torch_name(t.dtype()));
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<int32_t> v(static_cast<std::size_t>(h.numel()));
  if (!v.empty()) std::memcpy(v.data(), h.data_ptr(), v.size() * sizeof(int32_t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    FLASHINFER_CHECK(v[i] >= 0, op, arg, "element ", i, " is negative (", v[i], ")");
  }
  return v;
}

// Row starts from batch offsets, or nullopt. Upstream's units: "elements" of the tensor's own
// storage (a row is `token_stride` elements, so a view such as V inside an interleaved QKV
// buffer, stride 3 * H * D, is addressed as cuDNN addresses it), "bytes" of it, or "tokens".
std::optional<std::vector<int64_t>> offset_rows(const std::optional<Tensor>& t, int64_t batch,
                                                int64_t token_stride, int64_t elem,
                                                std::string_view units, const char* op,
                                                const char* arg) {
  if (!t) return std::nullopt;
  api::check_defined(*t, op, arg);
  FLASHINFER_CHECK(t->dtype() == DType::kInt32 || t->dtype() == DType::kInt64, op, arg,
                   "expected an int32 or int64 tensor, got ", dtype_torch_name(t->dtype()));
  FLASHINFER_CHECK(t->numel() >= batch, op, arg, "has ", t->numel(), " elements for a batch of ",
                   batch);
  const std::vector<double> v = t->to(Device::cpu()).contiguous().to_double_vector();
  const int64_t unit =
      units == "tokens" ? 1 : std::max<int64_t>(token_stride, 1) * (units == "bytes" ? elem : 1);
  std::vector<int64_t> rows(static_cast<std::size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const auto x = static_cast<int64_t>(v[b]);
    FLASHINFER_CHECK(x >= 0 && x % unit == 0, op, arg, "element ", b, " (", x,
                     ") is not a whole number of rows of ", unit, " ", units);
    rows[b] = x / unit;
  }
  return rows;
}

// With "tokens" offsets upstream lets the lengths go: they are the indptr's differences.
std::vector<int32_t> lengths_from_indptr(const Tensor& t, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK(t.dtype() == DType::kInt32 || t.dtype() == DType::kInt64, op, arg,
                   "expected an int32 or int64 tensor, got ", dtype_torch_name(t.dtype()));
  const std::vector<double> v = t.to(Device::cpu()).contiguous().to_double_vector();
  FLASHINFER_CHECK(!v.empty(), op, arg, "an indptr needs batch + 1 elements, got none");
  std::vector<int32_t> lens;
  for (std::size_t b = 0; b + 1 < v.size(); ++b) {
    const double n = v[b + 1] - v[b];
    FLASHINFER_CHECK(n >= 0 && n <= std::numeric_limits<int32_t>::max(), op, arg, "element ", b + 1,
                     " (", v[b + 1], ") is below element ", b, " (", v[b], ")");
    lens.push_back(static_cast<int32_t>(n));
  }
  return lens;
}

#if FLASHINFER_WITH_CUDA
// What cudnn_ragged_on_device needs of one batch-offsets tensor: a dense int32 / int64 copy on
// the device (the tensor itself where it is one) with at least `need` entries, or nullopt where
// the call must take the host path (another device or dtype, too few entries: the host path
// names the argument).
std::optional<Tensor> dense_index_on(const Tensor& t, Device device, bool int64_ok, int64_t need) {
  if (!t.defined() || t.device() != device || t.numel() < need) return std::nullopt;
  if (t.dtype() != DType::kInt32 && (!int64_ok || t.dtype() != DType::kInt64)) return std::nullopt;
  return t.is_contiguous() ? t : t.contiguous();  // a copy on the device: capturable
}

// cudnn_batch_prefill_with_kv_cache's ragged call (no block table) with its lengths and batch
// offsets on the GPU, planned there: a prepass (kernels/cudnn_ragged_plan.h) finds each request's
// rows and key range and the host checks' verdict, the block-table plan kernel lays out the
// tensor-core prefill kernels' work in the compact layout from them (a grid sized from the
// query's rows and the two bounds: api::ragged_device_grid), and the kernels run. Nothing is read
// back and nothing synchronizes (the host plan read all six tensors back), so a CUDA graph (SGLang
// captures its vision encoder) captures the call; a call the host would refuse gets NaN in every
// output row instead. nullopt where the call does not fit this path (CPU tensors, dtypes or head
// dims the tensor-core kernels do not take, tensor scales, rows off 16 bytes, shapes the host
// path refuses by name): the host plan then runs it.
std::optional<CudnnPrefillResult> cudnn_ragged_on_device(
    const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& workspace,
    int64_t max_q, int64_t max_kv, const std::optional<Tensor>& lens_q,
    const std::optional<Tensor>& lens_kv, bool causal, bool return_lse,
    const std::optional<ScalarOrTensor<double>>& q_scale,
    const std::optional<ScalarOrTensor<double>>& k_scale,
    const std::optional<ScalarOrTensor<double>>& v_scale, const std::optional<Tensor>& off_q,
    const std::optional<Tensor>& off_o, const std::optional<Tensor>& off_k,
    const std::optional<Tensor>& off_v, std::string_view units, const std::optional<Tensor>& out,
    const std::optional<Tensor>& lse, std::optional<DType> o_data_type) {
  namespace kc = kernels::cuda;
  const char* op = kCudnnPrefillOp;
  const Device dev = q.device();
  if (!dev.is_cuda() || q.dim() != 3 || k.dim() != 3 || v.dim() != 3) return std::nullopt;
  if (k.device() != dev || v.device() != dev) return std::nullopt;
  const DType dt = q.dtype();
  if (dt != DType::kFloat16 && dt != DType::kBFloat16) return std::nullopt;
  if (k.dtype() != dt || v.dtype() != dt || o_data_type.value_or(dt) != dt ||
      (out && out->dtype() != dt)) {
    return std::nullopt;
  }
  for (const auto* x : {&q_scale, &k_scale, &v_scale}) {
    if (*x && ((*x)->is_tensor() || !std::isfinite((*x)->scalar()))) return std::nullopt;
  }
  const int64_t rows = q.size(0), hq = q.size(1), d = q.size(2);
  const int64_t hkv = k.size(1), dvo = v.size(2);
  // api::check_heads's rules (the host path names them).
  if (hq < 1 || hq > 4096 || hkv < 1 || hq % hkv != 0 || v.size(1) != hkv || k.size(2) != d ||
      dvo != d) {
    return std::nullopt;
  }
  const bool jit_dims = d >= 16 && d <= 256 && d % 16 == 0;
  if (!kc::prefill::prefill_dims_built(static_cast<int>(d), static_cast<int>(dvo)) && !jit_dims) {
    return std::nullopt;
  }
  if (q.stride(2) != 1 || k.stride(2) != 1 || v.stride(2) != 1) return std::nullopt;
  // No query row: nothing to plan (the host path checks the lengths add up to none).
  if (rows == 0 || rows > std::numeric_limits<int32_t>::max()) return std::nullopt;
  // Lengths (or, with "tokens" offsets, the offsets' differences) and the batch.
  const bool tokens = units == "tokens";
  int64_t batch = 0;
  if (lens_q) {
    if (!lens_q->defined() || lens_q->dtype() != DType::kInt32) return std::nullopt;
    batch = lens_q->numel();
  } else if (tokens && off_q && off_q->defined()) {
    batch = off_q->numel() - 1;
  } else {
    return std::nullopt;
  }
  if (batch <= 0 || batch > std::numeric_limits<int32_t>::max()) return std::nullopt;
  std::optional<Tensor> lq, lk;
  if (lens_q && !(lq = dense_index_on(*lens_q, dev, false, batch))) return std::nullopt;
  if (lens_kv) {
    if (lens_kv->numel() != batch || !(lk = dense_index_on(*lens_kv, dev, false, batch))) {
      return std::nullopt;
    }
  } else if (!tokens || !off_k) {
    return std::nullopt;
  } else if (off_k->numel() - 1 != batch) {
    return std::nullopt;
  }
  // Offsets (batch + 1 entries where a length comes from them) and their units: a row of each
  // tensor is stride(0) elements ("elements"), that many times the element's bytes ("bytes"), or
  // one ("tokens"), as the host path's offset_rows.
  const int64_t o_stride = out && out->dim() == 3 ? out->stride(0) : hq * dvo;
  auto unit = [&](int64_t stride, int64_t elem) {
    return tokens ? int64_t{1} : std::max<int64_t>(stride, 1) * (units == "bytes" ? elem : 1);
  };
  kernels::CudnnRaggedPlan cp;
  const std::optional<Tensor>* offs[4] = {&off_q, &off_o, &off_k, &off_v};
  const int64_t units_of[4] = {unit(q.stride(0), q.element_size()), unit(o_stride, dtype_size(dt)),
                               unit(k.stride(0), k.element_size()),
                               unit(v.stride(0), v.element_size())};
  std::optional<Tensor> dense[4];
  for (int i = 0; i < 4; ++i) {
    if (!*offs[i]) continue;
    const int64_t need = (i == 0 && !lens_q) || (i == 2 && !lens_kv) ? batch + 1 : batch;
    if (!(dense[i] = dense_index_on(**offs[i], dev, true, need))) return std::nullopt;
    cp.off[i] = dense[i]->data_ptr();
    cp.off64[i] = dense[i]->dtype() == DType::kInt64;
    cp.unit[i] = units_of[i];
  }
  // Outputs: exactly the host path's shapes, or nullopt (it names them).
  Tensor o_t, lse_t;
  if (out) {
    if (!out->defined() || out->device() != dev || out->shape() != Shape{rows, hq, dvo} ||
        out->stride(2) != 1) {
      return std::nullopt;
    }
    o_t = *out;
  }
  if (lse) {
    if (!lse->defined() || lse->device() != dev || lse->dtype() != DType::kFloat32 ||
        lse->shape() != Shape{rows, hq}) {
      return std::nullopt;
    }
    lse_t = *lse;
  }
  if (!o_t.defined()) o_t = Tensor::empty({rows, hq, dvo}, dt, dev);
  if (return_lse && !lse_t.defined()) lse_t = Tensor::empty({rows, hq}, DType::kFloat32, dev);

  kernels::AttentionParams a;
  a.q = q.data_ptr();
  a.q_dtype = dt;
  a.q_stride_n = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.kv.k = k.data_ptr();
  a.kv.v = v.data_ptr();
  a.kv.dtype = dt;
  a.kv.k_stride_token = k.stride(0);
  a.kv.k_stride_head = k.stride(1);
  a.kv.v_stride_token = v.stride(0);
  a.kv.v_stride_head = v.stride(1);
  a.kv.page_size = 1;
  api::set_attention_outputs(a, o_t, lse_t);
  a.batch = static_cast<int32_t>(batch);
  a.num_qo_heads = static_cast<int32_t>(hq);
  a.num_kv_heads = static_cast<int32_t>(hkv);
  a.head_dim_qk = static_cast<int32_t>(d);
  a.head_dim_vo = static_cast<int32_t>(dvo);
  const auto scalar = [](const std::optional<ScalarOrTensor<double>>& x) {
    return x ? x->scalar() : 1.0;
  };
  a.sm_scale = static_cast<float>(scale * scalar(q_scale) * scalar(k_scale));
  a.v_scale = static_cast<float>(scalar(v_scale));
  a.causal = causal;
  a.use_tensor_cores = true;
  if (!kc::attention_rows_aligned(a)) return std::nullopt;

  const flashinfer::detail::CudaDeviceScope on_device(dev);
  kernels::BlockTablePlan bp;
  bp.batch = static_cast<int32_t>(batch);
  bp.total_rows = rows;
  bp.q_len = static_cast<int32_t>(std::clamp<int64_t>(max_q, 0, rows));
  bp.cu_q_exact = true;
  bp.causal = causal;
  const int64_t kv_rows = std::min(k.size(0), v.size(0));
  bp.kv_rows = kv_rows;
  bp.page_size = 1;
  bp.max_seq_len = static_cast<int32_t>(std::clamp<int64_t>(
      max_kv, 0, std::min<int64_t>(kv_rows, std::numeric_limits<int32_t>::max())));
  bp.max_blocks = bp.max_seq_len;
  // The caller's workspace holds the split's partials (less the up to 15 bytes skipped to a
  // 16-byte boundary), as cuDNN's scratch there: none where it is not on the device.
  const bool usable = workspace.device() == dev && workspace.is_contiguous();
  const int64_t ws_bytes = usable ? static_cast<int64_t>(workspace.nbytes()) : 0;
  const api::RaggedDeviceGrid grid = api::ragged_device_grid(
      bp, static_cast<int32_t>(hq / hkv), static_cast<int32_t>(hkv), static_cast<int32_t>(d),
      static_cast<int32_t>(dvo), api::tensor_core_max_grid(dev), api::hopper_tall_max_grid(a, dev),
      op, 0, std::max<int64_t>(0, ws_bytes - 15));
  // The prepass's arrays after the plan's: cu_q [batch + 1], kv_start, kv_len [batch], refuse.
  const api::BlockPlanScratch mem = api::place_device_plan(
      bp, grid, /*items=*/true, /*has_workspace=*/true, usable ? workspace.data_ptr() : nullptr,
      ws_bytes, static_cast<int32_t>(hq), static_cast<int32_t>(dvo), dev, op, 3 * batch + 2);
  cp.lens_q = lq ? lq->data<const int32_t>() : nullptr;
  cp.lens_kv = lk ? lk->data<const int32_t>() : nullptr;
  cp.batch = static_cast<int32_t>(batch);
  cp.q_rows = rows;
  cp.kv_rows = kv_rows;
  cp.max_q = max_q;
  cp.max_kv = max_kv;
  cp.causal = causal;
  cp.cu_q = mem.extra;
  cp.kv_start = cp.cu_q + batch + 1;
  cp.kv_len = cp.kv_start + batch;
  cp.refuse = cp.kv_len + batch;
  bp.cu_q = cp.cu_q;
  bp.kv_start = cp.kv_start;
  bp.seq_lens = cp.kv_len;
  bp.seq_lens_stride = 1;
  bp.refuse = cp.refuse;
  kernels::block_plan_set_output(bp, a, a.num_qo_heads, a.head_dim_vo);
  a.qo_indptr = bp.qo_indptr;
  a.kv.kv_indptr = bp.kv_indptr;
  a.kv_lens = bp.kv_lens;
  a.work = bp.work;
  a.num_work = static_cast<int32_t>(grid.items);
  a.max_work_rows = grid.max_rows;
  if (grid.partial_rows > 0) {
    a.merge_indptr = bp.merge_indptr;
    a.merge_rows = bp.merge_rows;
    a.merge_out_row = bp.merge_out_row;
    a.num_merge = static_cast<int32_t>(rows);  // an entry a query row
    a.tmp_v = bp.tmp_v;
    a.tmp_s = bp.tmp_s;
  }
  void* stream = current_cuda_stream();
  kc::cudnn_ragged_plan(cp, stream);
  api::launch_block_table_plan(bp, dev, op);
  if (a.num_work > 0) kc::batch_attention(a, stream, /*enable_pdl=*/false);
  CudnnPrefillResult r;  // `mem` and the dense copies held until the launches are queued
  r.out = o_t;
  if (return_lse) r.lse = lse_t;
  return r;
}
#endif

CudnnPrefillResult cudnn_prefill_impl(
    const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, double scale,
    const Tensor& workspace_buffer, int64_t max_token_per_sequence, int64_t max_sequence_kv,
    const std::optional<Tensor>& actual_seq_lens_q, const std::optional<Tensor>& actual_seq_lens_kv,
    const std::optional<Tensor>& block_tables, bool causal, bool return_lse,
    const std::optional<ScalarOrTensor<double>>& q_scale,
    const std::optional<ScalarOrTensor<double>>& k_scale,
    const std::optional<ScalarOrTensor<double>>& v_scale,
    const std::optional<Tensor>& batch_offsets_q, const std::optional<Tensor>& batch_offsets_o,
    const std::optional<Tensor>& batch_offsets_k, const std::optional<Tensor>& batch_offsets_v,
    const std::optional<Tensor>& batch_offsets_stats, std::string_view batch_offsets_units,
    const std::optional<Tensor>& out, const std::optional<Tensor>& lse,
    std::optional<DType> o_data_type, const std::optional<std::string>& backend,
    std::string_view lse_base, std::optional<int64_t> window_left,
    const std::optional<Tensor>& sinks) {
  const char* op = kCudnnPrefillOp;
  // Upstream 0.7.4 checks lse_base first (utils.check_lse_base).
  FLASHINFER_CHECK(lse_base == "log2" || lse_base == "ln", op, "lse_base",
                   "lse_base must be one of ('log2', 'ln'), got '", lse_base, "'");
  api::check_defined(q, op, "q");
  api::check_dim(q, {3}, op, "q");
  if (sinks) {
    const Tensor& t = *sinks;
    FLASHINFER_CHECK(
        t.defined() && t.dim() == 1 && t.size(0) == q.size(1) && t.dtype() == DType::kFloat32 &&
            t.is_contiguous() && t.device() == q.device(),
        op, "sinks", "sinks must be a contiguous float32 tensor of shape (num_heads_qo,) = (",
        q.size(1), ",) on ", q.device().str(), ", got shape ",
        t.defined() ? shape_to_string(t.shape()) : std::string("None"));
  }
  // The functional API's window: None is none (its wrapper maps -1 to None; -1 is none here too).
  FLASHINFER_CHECK(!window_left || *window_left >= -1, op, "window_left",
                   "must be None or >= -1, got ", window_left.value_or(0));
  const int64_t wl = window_left.value_or(-1);
  const bool masked_extras = wl >= 0 || sinks.has_value();
  if (backend && *backend == "cubin") {
    FLASHINFER_CHECK_CODE(lse_base == "log2", ErrorCode::kUnsupported, op, "lse_base",
                          "the cubin cuDNN prefill path only returns base-2 LSE");
    FLASHINFER_CHECK_CODE(!masked_extras, ErrorCode::kUnsupported, op,
                          wl >= 0 ? "window_left" : "sinks",
                          "sliding windows and attention sinks require the cuDNN graph backend; "
                          "the cubin backend does not support them");
  }
  // lse_base "ln": the natural-log LSE upstream's graph returns (ours is base 2, times fp32 ln 2).
  const auto to_ln = [&](Tensor& l) {
    if (lse_base != "ln" || !l.defined()) return;
    const Tensor h = l.to(Device::cpu()).contiguous();
    std::vector<float> v(static_cast<std::size_t>(h.numel()));
    std::memcpy(v.data(), h.data_ptr(), v.size() * sizeof(float));
    for (float& x : v) x *= 0.693147182464599609375f;
    Tensor c = Tensor::empty(h.shape(), DType::kFloat32, Device::cpu());
    std::memcpy(c.data_ptr(), v.data(), v.size() * sizeof(float));
    l.copy_(c);
  };
  api::check_defined(k_cache, op, "k_cache");
  api::check_defined(v_cache, op, "v_cache");
  api::check_defined(workspace_buffer, op, "workspace_buffer");
  FLASHINFER_CHECK(std::isfinite(scale), op, "scale", "must be finite, got ", scale);
  FLASHINFER_CHECK(batch_offsets_units == "elements" || batch_offsets_units == "bytes" ||
                       batch_offsets_units == "tokens",
                   op, "batch_offsets_units",
                   "must be \"elements\", \"bytes\" or \"tokens\", got \"", batch_offsets_units,
                   "\"");
  FLASHINFER_CHECK_CODE(!batch_offsets_stats, ErrorCode::kUnsupported, op, "batch_offsets_stats",
                        "not supported (lse is [rows, Hq])");
  const bool tokens = batch_offsets_units == "tokens";
  FLASHINFER_CHECK(actual_seq_lens_q || (tokens && batch_offsets_q), op, "actual_seq_lens_q",
                   "is required (the query count of each request) unless batch_offsets_q is a "
                   "\"tokens\" indptr");
  FLASHINFER_CHECK(actual_seq_lens_kv || (tokens && batch_offsets_k && !block_tables), op,
                   "actual_seq_lens_kv",
                   "is required (the key count of each request) unless batch_offsets_k is a "
                   "\"tokens\" indptr of ragged K/V");
#if FLASHINFER_WITH_CUDA
  if (!block_tables && !masked_extras) {
    if (std::optional<CudnnPrefillResult> r = cudnn_ragged_on_device(
            q, k_cache, v_cache, scale, workspace_buffer, max_token_per_sequence, max_sequence_kv,
            actual_seq_lens_q, actual_seq_lens_kv, causal, return_lse, q_scale, k_scale, v_scale,
            batch_offsets_q, batch_offsets_o, batch_offsets_k, batch_offsets_v, batch_offsets_units,
            out, lse, o_data_type)) {
      to_ln(r->lse);
      return *r;
    }
  }
#endif
  const std::vector<int32_t> lq =
      actual_seq_lens_q ? flat_lengths(*actual_seq_lens_q, op, "actual_seq_lens_q")
                        : lengths_from_indptr(*batch_offsets_q, op, "batch_offsets_q");
  const std::vector<int32_t> lk =
      actual_seq_lens_kv ? flat_lengths(*actual_seq_lens_kv, op, "actual_seq_lens_kv")
                         : lengths_from_indptr(*batch_offsets_k, op, "batch_offsets_k");
  const auto batch = static_cast<int64_t>(lq.size());
  FLASHINFER_CHECK(static_cast<int64_t>(lk.size()) == batch, op, "actual_seq_lens_kv", "has ",
                   lk.size(), " elements, actual_seq_lens_q has ", batch);
  std::vector<int32_t> qo_indptr{0};
  for (int64_t b = 0; b < batch; ++b) {
    FLASHINFER_CHECK(lq[b] <= max_token_per_sequence, op, "max_token_per_sequence", "is ",
                     max_token_per_sequence, " but actual_seq_lens_q[", b, "] is ", lq[b]);
    FLASHINFER_CHECK(lk[b] <= max_sequence_kv, op, "max_sequence_kv", "is ", max_sequence_kv,
                     " but actual_seq_lens_kv[", b, "] is ", lk[b]);
    qo_indptr.push_back(static_cast<int32_t>(qo_indptr.back() + lq[b]));
  }
  const std::string_view units = batch_offsets_units;
  const int64_t hq = q.size(1), d = q.size(2);
  // Requests must be packed: offsets, when given, are the running sums.
  const auto oq = offset_rows(batch_offsets_q, batch, q.stride(0), q.element_size(), units, op,
                              "batch_offsets_q");
  const int64_t oelem = dtype_size(o_data_type.value_or(out ? out->dtype() : q.dtype()));
  const int64_t o_stride = out && out->dim() == 3 ? out->stride(0) : hq * v_cache.size(-1);
  const auto oo =
      offset_rows(batch_offsets_o, batch, o_stride, oelem, units, op, "batch_offsets_o");
  for (int64_t b = 0; b < batch; ++b) {
    FLASHINFER_CHECK_CODE(!oq || (*oq)[b] == qo_indptr[b], ErrorCode::kUnsupported, op,
                          "batch_offsets_q", "request ", b, " starts at row ", (*oq)[b],
                          "; only packed requests (offsets = running sums) are supported");
    FLASHINFER_CHECK_CODE(!oo || (*oo)[b] == qo_indptr[b], ErrorCode::kUnsupported, op,
                          "batch_offsets_o", "must address the same rows as batch_offsets_q");
  }

  AttentionRunOptions o;
  o.q_scale = q_scale ? std::optional<double>(api::fused_scale_value(*q_scale, op, "q_scale"))
                      : std::nullopt;
  o.k_scale = k_scale ? std::optional<double>(api::fused_scale_value(*k_scale, op, "k_scale"))
                      : std::nullopt;
  o.v_scale = v_scale ? std::optional<double>(api::fused_scale_value(*v_scale, op, "v_scale"))
                      : std::nullopt;
  o.out = out;
  o.lse = lse;
  o.return_lse = return_lse;
  CudnnPrefillResult result;
  if (block_tables) {
    FLASHINFER_CHECK_CODE(!batch_offsets_k && !batch_offsets_v, ErrorCode::kUnsupported, op,
                          "batch_offsets_k", "batch offsets of a paged cache are not supported");
    const PagedKVCache cache(k_cache, v_cache);
    BlockCall c;
    c.op = op;
    c.query = q;
    c.kv_cache = &cache;
    c.workspace_buffer = &workspace_buffer;
    c.block_tables = &*block_tables;
    c.qo_indptr = qo_indptr;
    c.kv_lens = lk;
    c.causal = causal;
    c.hnd = true;  // cuDNN's pages are [pages, Hkv, page_size, D]
    c.bmm1 = scale * o.q_scale.value_or(1.0) * o.k_scale.value_or(1.0);
    c.out_scale = o.v_scale.value_or(1.0);
    c.out = out;
    c.out_dtype = o_data_type;
    c.lse = lse;
    c.return_lse = return_lse;
    c.window_left = wl;
    c.sinks = sinks;
    c.cudnn = !masked_extras;  // the graph here takes neither a window nor sinks
    c.cudnn_max_s_q = max_token_per_sequence;
    c.cudnn_max_s_kv = max_sequence_kv;
    AttentionOutput r = run_block_call(c);
    result.out = r.out;
    result.lse = r.lse;
    to_ln(result.lse);
    return result;
  }
  // Ragged K/V rows [rows, Hkv, D].
  api::check_dim(k_cache, {3}, op, "k_cache");
  api::check_dim(v_cache, {3}, op, "v_cache");
  const int64_t hkv = k_cache.size(1);
  const auto ok = offset_rows(batch_offsets_k, batch, k_cache.stride(0), k_cache.element_size(),
                              units, op, "batch_offsets_k");
  const auto ov = offset_rows(batch_offsets_v, batch, v_cache.stride(0), v_cache.element_size(),
                              units, op, "batch_offsets_v");
  detail::WrapperState s;
  s.device = q.device();
  api::check_same_device(k_cache, q, op, "k_cache", "q");
  api::check_same_device(v_cache, q, op, "v_cache", "q");
  api::check_same_dtype(v_cache, k_cache, op, "v_cache", "k_cache");
  FLASHINFER_CHECK(v_cache.size(1) == hkv, op, "v_cache", "has ", v_cache.size(1),
                   " heads, k_cache has ", hkv);
  api::check_heads(hq, hkv, op, "q", "k_cache");
  api::check_head_dim(d, op, "q");
  FLASHINFER_CHECK(k_cache.size(2) == d && v_cache.size(2) == d, op, "k_cache",
                   "head_dim must match q's ", d);
  api::plan_settings(s, hq, hkv, d, d, q.dtype(), k_cache.dtype(), o_data_type, scale, wl,
                     std::nullopt, "NONE", op);
  o.sinks = sinks;
  s.paged = false;
  s.page_size = 1;
  s.batch = static_cast<int32_t>(batch);
  s.qo_indptr = qo_indptr;
  s.kv_lens = lk;
  s.causal = causal;
  s.kv_indptr.assign(static_cast<std::size_t>(batch) + 1, 0);
  int64_t next = 0, end = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = ok ? (*ok)[b] : next;
    FLASHINFER_CHECK_CODE(!ov || (*ov)[b] == start, ErrorCode::kUnsupported, op, "batch_offsets_v",
                          "must address the same rows as batch_offsets_k");
    FLASHINFER_CHECK(start <= std::numeric_limits<int32_t>::max(), op, "batch_offsets_k", "row ",
                     start, " is beyond 2^31 - 1");
    s.kv_indptr[b] = static_cast<int32_t>(start);
    next = start + lk[b];
    end = std::max(end, next);
    FLASHINFER_CHECK(!causal || lq[b] <= lk[b], op, "actual_seq_lens_kv", "request ", b, " has ",
                     lq[b], " queries but only ", lk[b], " keys");
  }
  s.kv_indptr[batch] = static_cast<int32_t>(std::min<int64_t>(end, INT32_MAX));
  s.total_kv = end;  // run() checks the K/V rows cover every request
  s.total_qo = qo_indptr.back();
  s.workspace_cap = int64_t{64} << 20;
  api::build_plan(s, std::nullopt, /*disable_split_kv=*/false, op);
  if (s.plan.num_partial_rows > 0) {
    s.float_workspace =
        Tensor::empty({s.plan.num_partial_rows * s.num_qo_heads * (s.head_dim_vo + 1)},
                      DType::kFloat32, s.device);
  }
  AttentionOutput r = api::run_planned(s, q, k_cache, v_cache, o, op, "k_cache", "v_cache");
  result.out = r.out;
  result.lse = r.lse;
  to_ln(result.lse);
  return result;
}

Tensor cudnn_decode_impl(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         double scale, const Tensor& workspace_buffer, int64_t max_sequence_kv,
                         const std::optional<Tensor>& actual_seq_lens_kv,
                         const std::optional<Tensor>& block_tables,
                         const std::optional<Tensor>& batch_offsets_q,
                         const std::optional<Tensor>& batch_offsets_o,
                         const std::optional<Tensor>& batch_offsets_k,
                         const std::optional<Tensor>& batch_offsets_v,
                         const std::optional<Tensor>& out) {
  const char* op = kCudnnDecodeOp;
  for (const auto& [t, name] : {std::pair{&batch_offsets_q, "batch_offsets_q"},
                                std::pair{&batch_offsets_o, "batch_offsets_o"},
                                std::pair{&batch_offsets_k, "batch_offsets_k"},
                                std::pair{&batch_offsets_v, "batch_offsets_v"}}) {
    FLASHINFER_CHECK_CODE(!t->has_value(), ErrorCode::kUnsupported, op, name,
                          "ragged batch offsets are not supported");
  }
  api::check_defined(q, op, "q");
  api::check_dim(q, {3}, op, "q");
  api::check_defined(k_cache, op, "k_cache");
  api::check_dim(k_cache, {4}, op, "k_cache");
  FLASHINFER_CHECK(std::isfinite(scale), op, "scale", "must be finite, got ", scale);
  FLASHINFER_CHECK(max_sequence_kv >= 0 && max_sequence_kv <= std::numeric_limits<int32_t>::max(),
                   op, "max_sequence_kv", "must be in [0, 2^31 - 1], got ", max_sequence_kv);
  const int64_t batch = q.size(0);
  std::vector<int32_t> lens;
  if (actual_seq_lens_kv) {
    lens = flat_lengths(*actual_seq_lens_kv, op, "actual_seq_lens_kv");
    FLASHINFER_CHECK(static_cast<int64_t>(lens.size()) == batch, op, "actual_seq_lens_kv", "has ",
                     lens.size(), " elements for a batch of ", batch);
  } else {
    lens.assign(static_cast<std::size_t>(batch), static_cast<int32_t>(max_sequence_kv));
  }
  for (std::size_t b = 0; b < lens.size(); ++b) {
    FLASHINFER_CHECK(lens[b] <= max_sequence_kv, op, "max_sequence_kv", "is ", max_sequence_kv,
                     " but request ", b, " has ", lens[b], " keys");
  }
  // Without a block table request b's cache is page b, one page as long as the sequence.
  Tensor table;
  if (block_tables) {
    table = *block_tables;
  } else {
    std::vector<int32_t> ids(static_cast<std::size_t>(batch));
    std::iota(ids.begin(), ids.end(), 0);
    Tensor h = Tensor::empty({batch, 1}, DType::kInt32);
    if (batch > 0) std::memcpy(h.data_ptr(), ids.data(), ids.size() * sizeof(int32_t));
    table = h;
  }
  const PagedKVCache cache(k_cache, v_cache);
  BlockCall c;
  c.op = op;
  c.query = q;
  c.kv_cache = &cache;
  c.workspace_buffer = &workspace_buffer;
  c.block_tables = &table;
  for (int64_t b = 0; b <= batch; ++b) c.qo_indptr.push_back(static_cast<int32_t>(b));
  c.kv_lens = lens;
  c.hnd = true;
  c.bmm1 = scale;
  c.out = out;
  c.cudnn = true;
  c.cudnn_max_s_kv = max_sequence_kv;
  return run_block_call(c).out;
}

}  // namespace

AttentionOutput trtllm_batch_decode_with_kv_cache(
    const Tensor& query, const PagedKVCache& kv_cache, const Tensor& workspace_buffer,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_seq_len,
    ScalarOrTensor<double> bmm1_scale, ScalarOrTensor<double> bmm2_scale, int64_t window_left,
    std::optional<Tensor> out, std::optional<DType> out_dtype, std::optional<double> o_sf_scale,
    std::optional<int64_t> o_sf_vec_size, std::optional<Tensor> sinks, std::string_view kv_layout,
    std::optional<bool> enable_pdl, std::string_view backend, std::optional<int64_t> q_len_per_req,
    std::optional<double> o_scale, std::optional<Tensor> mask, std::optional<int64_t> max_q_len,
    std::optional<Tensor> cum_seq_lens_q, std::optional<double> skip_softmax_threshold_scale_factor,
    std::optional<Value> kv_cache_sf, bool uses_shared_paged_kv_idx, std::optional<Tensor> lse,
    bool return_lse, std::optional<Value> bmm1_scale_log2,
    std::optional<Tensor> multi_ctas_kv_counter_buffer, bool enable_block_sparse_attention,
    int64_t cp_world, int64_t cp_rank, std::optional<Tensor> causal_seqlens_kv_global,
    std::optional<Value> bf16q_fp8kv_transform_mode, std::optional<Tensor> request_order,
    std::optional<Value> request_order_plan, int64_t sparse_top_k, bool length_aware_schedule) {
  return call_op<&trtllm_batch_decode_with_kv_cache>(
      [&] {
        // length_aware_schedule: a Cake scheduling hint (no value changes).
        (void)length_aware_schedule;
        const DecodeExtras x{
            cp_world,           cp_rank,     causal_seqlens_kv_global, request_order,
            request_order_plan, sparse_top_k};
        return decode_impl(
            query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale,
            bmm2_scale, window_left, out, out_dtype, o_sf_scale, o_sf_vec_size, sinks, kv_layout,
            enable_pdl, backend, q_len_per_req, o_scale, mask, max_q_len, cum_seq_lens_q,
            skip_softmax_threshold_scale_factor, kv_cache_sf, uses_shared_paged_kv_idx, lse,
            return_lse, bmm1_scale_log2, multi_ctas_kv_counter_buffer,
            enable_block_sparse_attention, bf16q_fp8kv_transform_mode, x);
      },
      query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale,
      bmm2_scale, window_left, out, out_dtype, o_sf_scale, o_sf_vec_size, sinks, kv_layout,
      enable_pdl, backend, q_len_per_req, o_scale, mask, max_q_len, cum_seq_lens_q,
      skip_softmax_threshold_scale_factor, kv_cache_sf, uses_shared_paged_kv_idx, lse, return_lse,
      bmm1_scale_log2, multi_ctas_kv_counter_buffer, enable_block_sparse_attention, cp_world,
      cp_rank, causal_seqlens_kv_global, bf16q_fp8kv_transform_mode, request_order,
      request_order_plan, sparse_top_k, length_aware_schedule);
}

AttentionOutput trtllm_batch_context_with_kv_cache(
    const Tensor& query, const PagedKVCache& kv_cache, const Tensor& workspace_buffer,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_q_len, int64_t max_kv_len,
    ScalarOrTensor<double> bmm1_scale, ScalarOrTensor<double> bmm2_scale, int64_t batch_size,
    const Tensor& cum_seq_lens_q, const Tensor& cum_seq_lens_kv, int64_t window_left,
    std::optional<Tensor> out, std::optional<DType> out_dtype, std::optional<double> o_sf_scale,
    std::optional<int64_t> o_sf_vec_size, std::string_view kv_layout,
    std::optional<bool> enable_pdl, std::optional<Tensor> sinks, std::optional<Value> kv_cache_sf,
    std::optional<double> skip_softmax_threshold_scale_factor, bool uses_shared_paged_kv_idx,
    bool causal, std::optional<Tensor> lse, bool return_lse,
    std::optional<Tensor> multi_ctas_kv_counter_buffer, std::optional<bool> use_fp16_softmax,
    std::optional<bool> uses_spcompress, std::string_view backend, int64_t window_right,
    std::optional<Tensor> variable_window_token_starts,
    std::optional<Tensor> variable_window_token_ends) {
  return call_op<&trtllm_batch_context_with_kv_cache>(
      [&] {
        return context_impl(
            query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len,
            bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv, window_left, out,
            out_dtype, o_sf_scale, o_sf_vec_size, kv_layout, enable_pdl, sinks, kv_cache_sf,
            skip_softmax_threshold_scale_factor, uses_shared_paged_kv_idx, causal, lse, return_lse,
            multi_ctas_kv_counter_buffer, use_fp16_softmax, uses_spcompress, backend, window_right,
            variable_window_token_starts, variable_window_token_ends);
      },
      query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale,
      bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv, window_left, out, out_dtype,
      o_sf_scale, o_sf_vec_size, kv_layout, enable_pdl, sinks, kv_cache_sf,
      skip_softmax_threshold_scale_factor, uses_shared_paged_kv_idx, causal, lse, return_lse,
      multi_ctas_kv_counter_buffer, use_fp16_softmax, uses_spcompress, backend, window_right,
      variable_window_token_starts, variable_window_token_ends);
}

Tensor xqa_batch_decode_with_kv_cache(
    const Tensor& query, const PagedKVCache& kv_cache, const Tensor& workspace_buffer,
    const Tensor& block_tables, const Tensor& seq_lens, int64_t max_seq_len,
    ScalarOrTensor<double> bmm1_scale, ScalarOrTensor<double> bmm2_scale, int64_t window_left,
    std::optional<Tensor> out, std::optional<Tensor> sinks, std::string_view kv_layout,
    std::optional<bool> enable_pdl, std::optional<int64_t> q_len_per_req,
    std::optional<double> o_scale, std::optional<Tensor> mask, std::optional<Value> kv_cache_sf,
    std::optional<Tensor> q_cu_seq_lens) {
  return call_op<&xqa_batch_decode_with_kv_cache>(
      [&] {
        return trtllm_attention_xqa_impl(query, kv_cache, workspace_buffer, block_tables, seq_lens,
                                         max_seq_len, bmm1_scale, bmm2_scale, window_left, out,
                                         sinks, kv_layout, enable_pdl, q_len_per_req, o_scale, mask,
                                         kv_cache_sf, q_cu_seq_lens);
      },
      query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale,
      bmm2_scale, window_left, out, sinks, kv_layout, enable_pdl, q_len_per_req, o_scale, mask,
      kv_cache_sf, q_cu_seq_lens);
}

Value to_value(const CudnnPrefillResult& r) {
  return Value::tuple({Value(r.out), r.lse.defined() ? Value(r.lse) : Value()});
}

CudnnPrefillResult cudnn_batch_prefill_with_kv_cache(
    const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, double scale,
    const Tensor& workspace_buffer, int64_t max_token_per_sequence, int64_t max_sequence_kv,
    std::optional<Tensor> actual_seq_lens_q, std::optional<Tensor> actual_seq_lens_kv,
    std::optional<Tensor> block_tables, bool causal, bool return_lse,
    std::optional<ScalarOrTensor<double>> q_scale, std::optional<ScalarOrTensor<double>> k_scale,
    std::optional<ScalarOrTensor<double>> v_scale, std::optional<Tensor> batch_offsets_q,
    std::optional<Tensor> batch_offsets_o, std::optional<Tensor> batch_offsets_k,
    std::optional<Tensor> batch_offsets_v, std::optional<Tensor> batch_offsets_stats,
    std::string_view batch_offsets_units, std::optional<Tensor> out, std::optional<Tensor> lse,
    bool is_cuda_graph_compatible, std::optional<std::string> backend,
    std::optional<DType> o_data_type, std::string_view lse_base, std::optional<int64_t> window_left,
    std::optional<Tensor> sinks) {
  return call_op<&cudnn_batch_prefill_with_kv_cache>(
      [&] {
        return cudnn_prefill_impl(
            q, k_cache, v_cache, scale, workspace_buffer, max_token_per_sequence, max_sequence_kv,
            actual_seq_lens_q, actual_seq_lens_kv, block_tables, causal, return_lse, q_scale,
            k_scale, v_scale, batch_offsets_q, batch_offsets_o, batch_offsets_k, batch_offsets_v,
            batch_offsets_stats, batch_offsets_units, out, lse, o_data_type, backend, lse_base,
            window_left, sinks);
      },
      q, k_cache, v_cache, scale, workspace_buffer, max_token_per_sequence, max_sequence_kv,
      actual_seq_lens_q, actual_seq_lens_kv, block_tables, causal, return_lse, q_scale, k_scale,
      v_scale, batch_offsets_q, batch_offsets_o, batch_offsets_k, batch_offsets_v,
      batch_offsets_stats, batch_offsets_units, out, lse, is_cuda_graph_compatible, backend,
      o_data_type, lse_base, window_left, sinks);
}

Tensor cudnn_batch_decode_with_kv_cache(
    const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, double scale,
    const Tensor& workspace_buffer, int64_t max_sequence_kv,
    std::optional<Tensor> actual_seq_lens_kv, std::optional<Tensor> block_tables,
    bool is_cuda_graph_compatible, std::optional<Tensor> batch_offsets_q,
    std::optional<Tensor> batch_offsets_o, std::optional<Tensor> batch_offsets_k,
    std::optional<Tensor> batch_offsets_v, std::optional<Tensor> out) {
  return call_op<&cudnn_batch_decode_with_kv_cache>(
      [&] {
        return cudnn_decode_impl(q, k_cache, v_cache, scale, workspace_buffer, max_sequence_kv,
                                 actual_seq_lens_kv, block_tables, batch_offsets_q, batch_offsets_o,
                                 batch_offsets_k, batch_offsets_v, out);
      },
      q, k_cache, v_cache, scale, workspace_buffer, max_sequence_kv, actual_seq_lens_kv,
      block_tables, is_cuda_graph_compatible, batch_offsets_q, batch_offsets_o, batch_offsets_k,
      batch_offsets_v, out);
}

namespace {

// A block-table cache for the bench hooks: batch_size requests of s_kv keys, pages handed out
// in reverse order (so the table is not the identity), HND K/V pair, sinks on every head.
struct BenchBlocks {
  Tensor k, v, block_tables, seq_lens, sinks, workspace;
};

BenchBlocks bench_blocks(const BenchShape& s, Device dev) {
  const int64_t per = (s.s_kv + s.page_size - 1) / s.page_size, pages = per * s.batch_size;
  BenchBlocks b;
  b.k = api::bench::random_tensor({pages, s.num_kv_heads, s.page_size, s.head_dim_qk}, s.kv_dtype,
                                  dev, s.random_seed + 1);
  b.v = api::bench::random_tensor({pages, s.num_kv_heads, s.page_size, s.head_dim_qk}, s.kv_dtype,
                                  dev, s.random_seed + 2);
  std::vector<int64_t> table, lens;
  for (int64_t r = 0; r < s.batch_size; ++r) {
    for (int64_t i = 0; i < per; ++i) table.push_back(pages - 1 - (r * per + i));
    lens.push_back(s.s_kv);
  }
  b.block_tables = api::bench::int32_tensor(table, dev).view({s.batch_size, per});
  b.seq_lens = api::bench::int32_tensor(lens, dev);
  b.sinks = api::bench::random_tensor({s.num_qo_heads}, DType::kFloat32, dev, s.random_seed + 3);
  b.workspace = Tensor::zeros({1 << 16}, DType::kUInt8, dev);
  return b;
}

BenchCase bench_trtllm_decode(const BenchShape& s, Device dev) {
  BenchBlocks b = bench_blocks(s, dev);
  Tensor q = api::bench::random_tensor({s.batch_size, s.num_qo_heads, s.head_dim_qk}, s.q_dtype,
                                       dev, s.random_seed);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim_qk));
  BenchCase c = api::bench::invoke_case(
      kDecodeOp,
      {Value(q), Value::tuple({b.k, b.v}), Value(b.workspace), Value(b.block_tables),
       Value(b.seq_lens), Value(s.s_kv)},
      {{"bmm1_scale", Value(scale)}, {"bmm2_scale", Value(1.0)}, {"sinks", Value(b.sinks)}});
  c.flops =
      static_cast<double>(s.batch_size) *
      api::bench::attention_flops(1, s.s_kv, s.num_qo_heads, s.head_dim_qk, s.head_dim_qk, false);
  c.bytes = api::bench::bench_attention_bytes(s, s.batch_size, s.batch_size * s.s_kv);
  return c;
}

BenchCase bench_trtllm_context(const BenchShape& s, Device dev) {
  BenchBlocks b = bench_blocks(s, dev);
  const int64_t qo = std::min(s.s_qo, s.s_kv);  // causal needs kv_len >= qo_len
  std::vector<int64_t> cq, ck;
  for (int64_t r = 0; r <= s.batch_size; ++r) {
    cq.push_back(r * qo);
    ck.push_back(r * s.s_kv);
  }
  Tensor q = api::bench::random_tensor({s.batch_size * qo, s.num_qo_heads, s.head_dim_qk},
                                       s.q_dtype, dev, s.random_seed);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim_qk));
  BenchCase c = api::bench::invoke_case(
      kContextOp,
      {Value(q), Value::tuple({b.k, b.v}), Value(b.workspace), Value(b.block_tables),
       Value(b.seq_lens), Value(qo), Value(s.s_kv), Value(scale), Value(1.0), Value(s.batch_size),
       Value(api::bench::int32_tensor(cq, dev)), Value(api::bench::int32_tensor(ck, dev))},
      {{"sinks", Value(b.sinks)}});
  c.flops =
      static_cast<double>(s.batch_size) *
      api::bench::attention_flops(qo, s.s_kv, s.num_qo_heads, s.head_dim_qk, s.head_dim_qk, true);
  c.bytes = api::bench::bench_attention_bytes(s, s.batch_size * qo, s.batch_size * s.s_kv);
  return c;
}

BenchCase bench_xqa_decode(const BenchShape& s, Device dev) {
  BenchBlocks b = bench_blocks(s, dev);
  Tensor q = api::bench::random_tensor({s.batch_size, s.num_qo_heads, s.head_dim_qk}, s.q_dtype,
                                       dev, s.random_seed);
  // xqa's default layout is NHD: the same pages seen through an NHD view.
  BenchCase c = api::bench::invoke_case(
      kTrtllmAttentionXqaOp,
      {Value(q), Value::tuple({b.k.transpose(1, 2), b.v.transpose(1, 2)}), Value(b.workspace),
       Value(b.block_tables), Value(b.seq_lens), Value(s.s_kv)},
      {{"bmm1_scale", Value(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk)))},
       {"sinks", Value(b.sinks)}});
  c.flops =
      static_cast<double>(s.batch_size) *
      api::bench::attention_flops(1, s.s_kv, s.num_qo_heads, s.head_dim_qk, s.head_dim_qk, false);
  c.bytes = api::bench::bench_attention_bytes(s, s.batch_size, s.batch_size * s.s_kv);
  return c;
}

// cudnn_batch_prefill_with_kv_cache as the engines' vision encoders call it: ragged K/V, packed
// requests with element offsets, not causal.
BenchCase bench_cudnn_prefill(const BenchShape& s, Device dev) {
  const int64_t rows = s.batch_size * s.s_qo;
  std::vector<int64_t> lens, offq, offk;
  for (int64_t r = 0; r < s.batch_size; ++r) {
    lens.push_back(s.s_qo);
    offq.push_back(r * s.s_qo * s.num_qo_heads * s.head_dim_qk);
    offk.push_back(r * s.s_qo * s.num_kv_heads * s.head_dim_qk);
  }
  Tensor q = api::bench::random_tensor({rows, s.num_qo_heads, s.head_dim_qk}, s.q_dtype, dev,
                                       s.random_seed);
  Tensor k = api::bench::random_tensor({rows, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, dev,
                                       s.random_seed + 1);
  Tensor v = api::bench::random_tensor({rows, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, dev,
                                       s.random_seed + 2);
  Tensor len = api::bench::int32_tensor(lens, dev).view({s.batch_size, 1, 1, 1});
  Tensor oq = api::bench::int32_tensor(offq, dev), ok = api::bench::int32_tensor(offk, dev);
  BenchCase c = api::bench::invoke_case(
      kCudnnPrefillOp,
      {Value(q), Value(k), Value(v), Value(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk))),
       Value(Tensor::zeros({1 << 16}, DType::kUInt8, dev))},
      {{"max_token_per_sequence", Value(s.s_qo)},
       {"max_sequence_kv", Value(s.s_qo)},
       {"actual_seq_lens_q", Value(len)},
       {"actual_seq_lens_kv", Value(len)},
       {"causal", Value(s.causal)},
       {"return_lse", Value(false)},
       {"batch_offsets_q", Value(oq)},
       {"batch_offsets_o", Value(oq)},
       {"batch_offsets_k", Value(ok)},
       {"batch_offsets_v", Value(ok)}});
  c.flops = static_cast<double>(s.batch_size) *
            api::bench::attention_flops(s.s_qo, s.s_qo, s.num_qo_heads, s.head_dim_qk,
                                        s.head_dim_qk, s.causal);
  c.bytes = api::bench::bench_attention_bytes(s, rows, rows);
  return c;
}

BenchCase bench_cudnn_decode(const BenchShape& s, Device dev) {
  BenchBlocks b = bench_blocks(s, dev);
  Tensor q = api::bench::random_tensor({s.batch_size, s.num_qo_heads, s.head_dim_qk}, s.q_dtype,
                                       dev, s.random_seed);
  BenchCase c = api::bench::invoke_case(
      kCudnnDecodeOp,
      {Value(q), Value(b.k), Value(b.v), Value(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk))),
       Value(b.workspace)},
      {{"max_sequence_kv", Value(s.s_kv)},
       {"actual_seq_lens_kv", Value(b.seq_lens.view({s.batch_size, 1, 1, 1}))},
       {"block_tables", Value(b.block_tables)}});
  c.flops =
      static_cast<double>(s.batch_size) *
      api::bench::attention_flops(1, s.s_kv, s.num_qo_heads, s.head_dim_qk, s.head_dim_qk, false);
  c.bytes = api::bench::bench_attention_bytes(s, s.batch_size, s.batch_size * s.s_kv);
  return c;
}

}  // namespace

namespace detail {
void register_trtllm_attention_ops(OpRegistry& r) {
  declare<&trtllm_batch_decode_with_kv_cache>(
      r,
      {.name = kDecodeOp,
       .module = "flashinfer.decode",
       .summary = "Batch decode attention over a block-table paged KV cache (trtllm convention)"},
      "query", "kv_cache", "workspace_buffer", "block_tables", "seq_lens", "max_seq_len",
      arg("bmm1_scale", 1.0), arg("bmm2_scale", 1.0), arg("window_left", -1), arg("out").mut(),
      "out_dtype", "o_sf_scale", "o_sf_vec_size", "sinks", arg("kv_layout", "HND"), "enable_pdl",
      arg("backend", "auto"), arg("q_len_per_req", 1), arg("o_scale", 1.0), "mask", "max_q_len",
      "cum_seq_lens_q", "skip_softmax_threshold_scale_factor", "kv_cache_sf",
      arg("uses_shared_paged_kv_idx", true), arg("lse").mut(), arg("return_lse", false),
      "bmm1_scale_log2", "multi_ctas_kv_counter_buffer",
      arg("enable_block_sparse_attention", false), arg("cp_world", 1), arg("cp_rank", 0),
      "causal_seqlens_kv_global", "bf16q_fp8kv_transform_mode", "request_order",
      "request_order_plan", arg("sparse_top_k", 0), arg("length_aware_schedule", false));
  declare<&trtllm_batch_context_with_kv_cache>(
      r,
      {.name = kContextOp,
       .module = "flashinfer.prefill",
       .summary = "Batch prefill attention over a block-table paged KV cache (trtllm convention)"},
      "query", "kv_cache", "workspace_buffer", "block_tables", "seq_lens", "max_q_len",
      "max_kv_len", "bmm1_scale", "bmm2_scale", "batch_size", "cum_seq_lens_q", "cum_seq_lens_kv",
      arg("window_left", -1), arg("out").mut(), "out_dtype", "o_sf_scale", "o_sf_vec_size",
      arg("kv_layout", "HND"), "enable_pdl", "sinks", "kv_cache_sf",
      "skip_softmax_threshold_scale_factor", arg("uses_shared_paged_kv_idx", true),
      arg("causal", true), arg("lse").mut(), arg("return_lse", false),
      "multi_ctas_kv_counter_buffer", "use_fp16_softmax", "uses_spcompress",
      arg("backend", "trtllm-gen"), arg("window_right", -1), "variable_window_token_starts",
      "variable_window_token_ends");
  declare<&xqa_batch_decode_with_kv_cache>(
      r,
      {.name = kTrtllmAttentionXqaOp,
       .module = "flashinfer.decode",
       .summary = "Batch decode over a block-table paged KV cache (xqa convention, NHD default)"},
      "query", "kv_cache", "workspace_buffer", "block_tables", "seq_lens", "max_seq_len",
      arg("bmm1_scale", 1.0), arg("bmm2_scale", 1.0), arg("window_left", -1), arg("out").mut(),
      "sinks", arg("kv_layout", "NHD"), "enable_pdl", arg("q_len_per_req", 1), arg("o_scale", 1.0),
      "mask", "kv_cache_sf", "q_cu_seq_lens");
  api::register_attention_backends(kTrtllmAttentionXqaOp);
  register_bench_hook(kTrtllmAttentionXqaOp, bench_xqa_decode);
  declare<&cudnn_batch_prefill_with_kv_cache>(
      r,
      {.name = kCudnnPrefillOp,
       .module = "flashinfer.cudnn.prefill",
       .summary = kCudnnPrefillSummary},
      "q", "k_cache", "v_cache", "scale", "workspace_buffer", arg("max_token_per_sequence").kw(),
      arg("max_sequence_kv").kw(), arg("actual_seq_lens_q").kw(), arg("actual_seq_lens_kv").kw(),
      arg("block_tables").kw(), arg("causal").kw(), arg("return_lse").kw(), arg("q_scale").kw(),
      arg("k_scale").kw(), arg("v_scale").kw(), arg("batch_offsets_q").kw(),
      arg("batch_offsets_o").kw(), arg("batch_offsets_k").kw(), arg("batch_offsets_v").kw(),
      arg("batch_offsets_stats").kw(), arg("batch_offsets_units", "elements").kw(),
      arg("out").mut().kw(), arg("lse").mut().kw(), arg("is_cuda_graph_compatible", false).kw(),
      arg("backend").kw(), arg("o_data_type").kw(), arg("lse_base", "log2").kw(),
      arg("window_left").kw(), arg("sinks").kw());
  api::register_attention_backends(kCudnnPrefillOp);
  register_bench_hook(kCudnnPrefillOp, bench_cudnn_prefill);
  declare<&cudnn_batch_decode_with_kv_cache>(
      r,
      {.name = kCudnnDecodeOp, .module = "flashinfer.cudnn.decode", .summary = kCudnnDecodeSummary},
      "q", "k_cache", "v_cache", "scale", "workspace_buffer", arg("max_sequence_kv").kw(),
      arg("actual_seq_lens_kv").kw(), arg("block_tables").kw(),
      arg("is_cuda_graph_compatible", false).kw(), arg("batch_offsets_q").kw(),
      arg("batch_offsets_o").kw(), arg("batch_offsets_k").kw(), arg("batch_offsets_v").kw(),
      arg("out").mut().kw());
  api::register_attention_backends(kCudnnDecodeOp);
  register_bench_hook(kCudnnDecodeOp, bench_cudnn_decode);
  api::register_attention_backends(kDecodeOp);
  api::register_attention_backends(kContextOp);
  register_bench_hook(kDecodeOp, bench_trtllm_decode);
  register_bench_hook(kContextOp, bench_trtllm_context);
}
}  // namespace detail

}  // namespace flashinfer
