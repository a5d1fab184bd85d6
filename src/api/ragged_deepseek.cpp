// trtllm_ragged_attention_deepseek (flashinfer.prefill): declaration, checks and dispatch to the
// CPU reference (kernels/cpu/ragged_attention_cpu.cpp) or the CUDA kernel
// (kernels/cuda/ragged_attention_cuda.cu).
#include "flashinfer/ops/ragged_deepseek.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/ragged_attention.h"
#include "flashinfer/op_typed.h"
#include "kernels/block_table_plan.h"
#include "kernels/cpu/ragged_attention_cpu.h"
#include "kernels/ragged_attention_params.h"
#if FLASHINFER_WITH_CUDA
#include "core/cuda_runtime.h"
#include "kernels/cuda/decode_cuda.h"
#include "kernels/cuda/ragged_attention_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kRaggedDeepseekOp = "trtllm_ragged_attention_deepseek";

}  // namespace

namespace api {
namespace {

constexpr api::KernelEntry<kernels::RaggedAttentionParams> kRaggedKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 softmax, OpenMP over (query row, KV head)", nullptr,
     [](const kernels::RaggedAttentionParams& p, const api::LaunchContext&) {
       kernels::cpu::ragged_attention(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA: the FA2 prefill kernel where it fits (16-bit dtypes, built head dims), else a "
     "warp per (row, head) with an fp32 online softmax",
     [](const kernels::RaggedAttentionParams& p) {
       return api::Refusal{nullptr, kernels::cuda::ragged_attention_unsupported(p)};
     },
     [](const kernels::RaggedAttentionParams& p, const api::LaunchContext& c) {
       kernels::cuda::ragged_attention(p, c.stream, c.enable_pdl);
     }},
#endif
};
}  // namespace

void run_ragged_attention(kernels::RaggedAttentionParams p, Device device, const char* op,
                          const char* arg, std::optional<bool> enable_pdl,
                          const Tensor* workspace) {
  Tensor dev_ints;  // the index arrays on the device (CUDA); alive until the launch returns
  if (device.is_cuda()) {
    std::vector<int32_t> all(p.cu_q, p.cu_q + p.batch + 1);
    all.insert(all.end(), p.cu_kv, p.cu_kv + p.batch + 1);
    all.insert(all.end(), p.kv_lens, p.kv_lens + p.batch);
    for (int32_t b = 0; b < p.batch; ++b) {
      all.insert(all.end(), static_cast<std::size_t>(p.cu_q[b + 1] - p.cu_q[b]), b);
    }
    // The FA2 prefill kernel's work items where it fits (appended as int32 words: a WorkItem is
    // six of them), split across the keys when they would not fill the device, with the merge
    // pass's arrays after them.
    std::size_t work_at = 0, merge_at = 0;
    kernels::AttentionPlan plan;
#if FLASHINFER_WITH_CUDA
    // Eligibility reads the current device's limits: the tensors' device, not the caller's.
    const flashinfer::detail::CudaDeviceScope on_device(device);
    if (p.batch > 0 && kernels::cuda::ragged_fa2_eligible(p)) {
      const int tall = kernels::cuda::ragged_hopper_blocks_per_sm(p, device.index);
      plan = api::one_shot_plan(p.cu_q, p.kv_lens, p.batch, p.num_qo_heads / p.num_kv_heads,
                                p.num_kv_heads, p.head_dim_qk, p.head_dim_vo, 0,
                                api::tensor_core_max_grid(device), p.fa2_max_rows,
                                tall * static_cast<int64_t>(kernels::cuda::sm_count(device.index)));
      work_at = all.size();
      all.resize(work_at + plan.work.size() * 6);
      std::memcpy(all.data() + work_at, plan.work.data(),
                  plan.work.size() * sizeof(kernels::WorkItem));
      p.fa2_num_work = static_cast<int32_t>(plan.work.size());
      if (plan.split_kv) {
        merge_at = all.size();
        all.insert(all.end(), plan.merge_indptr.begin(), plan.merge_indptr.end());
        all.insert(all.end(), plan.merge_rows.begin(), plan.merge_rows.end());
        all.insert(all.end(), plan.merge_out_row.begin(), plan.merge_out_row.end());
        p.fa2_num_merge = static_cast<int32_t>(plan.merge_out_row.size());
        p.fa2_partial_rows = plan.num_partial_rows;
        if (workspace != nullptr) {  // else the CUDA backend's per-stream scratch
          const bool usable = workspace->device() == device && workspace->is_contiguous();
          std::tie(p.tmp_v, p.tmp_s) = api::workspace_partials(
              usable ? workspace->data_ptr() : nullptr, static_cast<int64_t>(workspace->nbytes()),
              plan, p.num_qo_heads, p.head_dim_vo, op, "workspace_buffer");
        }
      }
    }
#else
    (void)workspace;
#endif
    all.push_back(0);  // never empty
    Tensor h = Tensor::empty({static_cast<int64_t>(all.size())}, DType::kInt32);
    std::memcpy(h.data_ptr(), all.data(), all.size() * sizeof(int32_t));
    dev_ints = h.to(device);
    const auto* base = dev_ints.data<const int32_t>();
    p.cu_q = base;
    p.cu_kv = base + p.batch + 1;
    p.kv_lens = p.cu_kv + p.batch + 1;
    p.row_req = p.kv_lens + p.batch;
    if (!plan.work.empty()) p.fa2_work = reinterpret_cast<const kernels::WorkItem*>(base + work_at);
    if (plan.split_kv) {
      p.fa2_merge_indptr = base + merge_at;
      p.fa2_merge_rows = p.fa2_merge_indptr + plan.merge_indptr.size();
      p.fa2_merge_out_row = p.fa2_merge_rows + plan.merge_rows.size();
    }
  }
  launch(kRaggedKernels, p, device, op, arg, enable_pdl);
}

void register_ragged_attention_backends(std::string_view op) {
  register_backends(op, kRaggedKernels);
}

#if FLASHINFER_WITH_CUDA
namespace {

// The device tensors of a call planned on the device (run_ragged_attention_planned_on_device).
struct RaggedDeviceLengths {
  const Tensor* seq_lens = nullptr;  // int32 [batch], any stride
  Tensor cu_q, cu_kv;                // int32 [batch + 1], contiguous
  int64_t max_q_len = 0, max_kv_len = 0, kv_rows = 0;
};

// `p` with its index arrays on the device, read by the kernels only (nothing comes back to the
// host, nothing synchronizes, a CUDA graph captures the call): the host sizes the grid from what
// it knows (the query's rows, batch_size, max_q_len, max_kv_len: api::ragged_device_grid), and the
// plan kernel of kernels/block_table_plan.h (its ragged K/V form, compact layout) fills it from
// the real lengths, checking them by the host's rules first: a request they refuse gets NaN
// rows, a call they refuse NaN everywhere. The FA2 kernel's items where it fits, else the
// warp-per-row kernel through the plan's row map.
void run_ragged_attention_planned_on_device(kernels::RaggedAttentionParams p, Device device,
                                            const char* op, const char* arg,
                                            std::optional<bool> enable_pdl, const Tensor* workspace,
                                            const RaggedDeviceLengths& in) {
  const flashinfer::detail::CudaDeviceScope on_device(device);
  kernels::BlockTablePlan bp = api::one_shot_plan_inputs(
      *in.seq_lens, in.cu_q, p.batch, p.rows, in.max_q_len, &in.cu_kv, in.kv_rows, in.max_kv_len);

  // The split's partials go to the caller's workspace where it passes one (less the up to 15
  // bytes skipped to a 16-byte boundary), else to the stream's scratch.
  const bool usable =
      workspace != nullptr && workspace->device() == device && workspace->is_contiguous();
  const int64_t partial_cap =
      workspace == nullptr ? -1
      : usable             ? std::max<int64_t>(0, static_cast<int64_t>(workspace->nbytes()) - 15)
                           : 0;
  api::RaggedDeviceGrid grid;
  const bool fa2 = kernels::cuda::ragged_fa2_eligible(p);
  if (fa2) {
    const int tall = kernels::cuda::ragged_hopper_blocks_per_sm(p, device.index);
    grid = api::ragged_device_grid(
        bp, p.num_qo_heads / p.num_kv_heads, p.num_kv_heads, p.head_dim_qk, p.head_dim_vo,
        api::tensor_core_max_grid(device),
        tall * static_cast<int64_t>(kernels::cuda::sm_count(device.index)), op, 0, partial_cap);
  }
  const bool split = grid.partial_rows > 0;
  const api::BlockPlanScratch mem = api::place_device_plan(
      bp, grid, fa2, workspace != nullptr, usable ? workspace->data_ptr() : nullptr,
      workspace != nullptr ? static_cast<int64_t>(workspace->nbytes()) : 0, p.num_qo_heads,
      p.head_dim_vo, device, op);
  kernels::block_plan_set_output(bp, p, p.num_qo_heads, p.head_dim_vo);
  p.cu_q = bp.qo_indptr;
  p.cu_kv = bp.kv_indptr;
  p.kv_lens = bp.kv_lens;
  p.row_req = bp.row_req;
  if (fa2) {
    p.fa2_work = bp.work;
    p.fa2_num_work = static_cast<int32_t>(grid.items);
    p.fa2_max_rows = grid.max_rows;
    if (split) {
      p.fa2_merge_indptr = bp.merge_indptr;
      p.fa2_merge_rows = bp.merge_rows;
      p.fa2_merge_out_row = bp.merge_out_row;
      p.fa2_num_merge = p.rows;  // an entry a query row
      p.fa2_partial_rows = grid.partial_rows;
      p.tmp_v = bp.tmp_v;
      p.tmp_s = bp.tmp_s;
    }
  }
  // The attention kernels' refusals first: after the plan kernel ran, one would leave its NaN
  // rows in `out`.
  const char* why = kernels::cuda::ragged_attention_unsupported(p);
  FLASHINFER_CHECK_CODE(why == nullptr, ErrorCode::kUnsupported, op, arg, why);
  api::launch_block_table_plan(bp, device, op);
  launch(kRaggedKernels, p, device, op, arg, enable_pdl);  // `mem` released once queued
}

}  // namespace
#endif

}  // namespace api

namespace {

void ragged_deepseek_check_last_contiguous(const Tensor& t, const char* arg) {
  FLASHINFER_CHECK(t.stride(t.dim() - 1) == 1 || t.size(t.dim() - 1) <= 1, kRaggedDeepseekOp, arg,
                   "the last axis must be contiguous");
}

// Host copies given as hints must hold the lengths the device tensors imply.
void check_hint(const std::optional<Tensor>& hint, const std::vector<int32_t>& want,
                const char* arg) {
  if (!hint) return;
  const std::vector<int32_t> got =
      api::index_to_host(*hint, kRaggedDeepseekOp, arg, static_cast<int64_t>(want.size()));
  for (std::size_t i = 0; i < want.size(); ++i) {
    FLASHINFER_CHECK(got[i] == want[i], kRaggedDeepseekOp, arg, "element ", i, " (", got[i],
                     ") disagrees with the lengths of the device tensors (", want[i], ")");
  }
}

bool is_unset(const Value& v) {
  if (v.is_none()) return true;
  if (v.is_sequence()) {
    for (const Value& x : v.items()) {
      if (!is_unset(x)) return false;
    }
    return true;
  }
  return v.kind() == Value::Kind::kInt && v.as_int() == 0;
}

AttentionOutput ragged_deepseek_ragged_impl(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& workspace_buffer,
    const Tensor& seq_lens, int64_t max_q_len, int64_t max_kv_len,
    const ScalarOrTensor<double>& bmm1_scale, const ScalarOrTensor<double>& bmm2_scale,
    int64_t batch_size, int64_t window_left, const Tensor& cum_seq_lens_q,
    const Tensor& cum_seq_lens_kv, std::optional<bool> enable_pdl, bool is_causal, bool return_lse,
    const std::optional<Tensor>& attention_sinks, std::optional<double> skip_softmax,
    const std::optional<Tensor>& out_arg, const std::optional<Tensor>& lse_arg,
    const Value& sage_attn_sfs, const Value& num_elts_per_sage_attn_blk, std::string_view backend,
    const std::optional<Tensor>& q_seq_lens_cpu, const std::optional<Tensor>& kv_seq_lens_cpu,
    std::optional<bool> use_fp16_softmax, std::optional<bool> uses_spcompress) {
  auto unsupported = [&](bool bad, const char* arg, const char* why) {
    FLASHINFER_CHECK_CODE(!bad, ErrorCode::kUnsupported, kRaggedDeepseekOp, arg, why);
  };
  unsupported(attention_sinks.has_value(), "attention_sinks", "attention sinks are not supported");
  unsupported(skip_softmax.has_value(), "skip_softmax_threshold_scale_factor",
              "skip-softmax is not supported");
  unsupported(!is_unset(sage_attn_sfs), "sage_attn_sfs", "SageAttention is not supported");
  unsupported(!is_unset(num_elts_per_sage_attn_blk), "num_elts_per_sage_attn_blk",
              "SageAttention is not supported");
  unsupported(use_fp16_softmax.value_or(false), "use_fp16_softmax",
              "the fp16 softmax is not supported");
  unsupported(uses_spcompress.value_or(false), "uses_spcompress", "not supported");
  FLASHINFER_CHECK(backend == "trtllm-gen" || backend == "cute-dsl", kRaggedDeepseekOp, "backend",
                   "must be \"trtllm-gen\" or \"cute-dsl\", got \"", backend, "\"");
  for (const auto& [t, arg] :
       {std::pair{&query, "query"}, std::pair{&key, "key"}, std::pair{&value, "value"}}) {
    api::check_defined(*t, kRaggedDeepseekOp, arg);
    api::check_dim(*t, {3}, kRaggedDeepseekOp, arg);
    ragged_deepseek_check_last_contiguous(*t, arg);
  }
  api::check_defined(workspace_buffer, kRaggedDeepseekOp, "workspace_buffer");
  const int64_t dqk = query.size(2), dvo = value.size(2);
  const bool dims_ok =
      key.size(2) == dqk &&
      ((dqk == 192 && dvo == 128) || (dqk == 128 && dvo == 128) || (dqk == 256 && dvo == 256));
  FLASHINFER_CHECK(dims_ok, kRaggedDeepseekOp, "query", "head dims (query ", dqk, ", key ",
                   key.size(2), ", value ", dvo,
                   ") are not supported: (192, 192, 128), (128, 128, 128) or (256, 256, 256)");
  const int64_t nq = query.size(0), hq = query.size(1), nk = key.size(0), hkv = key.size(1);
  api::check_heads(hq, hkv, kRaggedDeepseekOp, "query", "key");
  FLASHINFER_CHECK(value.size(0) == nk && value.size(1) == hkv, kRaggedDeepseekOp, "value",
                   "must be [", nk, ", ", hkv, ", ", dvo, "], got ",
                   shape_to_string(value.shape()));
  const DType qd = query.dtype();
  FLASHINFER_CHECK(qd == DType::kFloat16 || qd == DType::kBFloat16 || qd == DType::kFloat8E4M3FN,
                   kRaggedDeepseekOp, "query", "dtype ", dtype_torch_name(qd),
                   " is not supported (float16, bfloat16, float8_e4m3fn)");
  api::check_same_dtype(key, query, kRaggedDeepseekOp, "key", "query");
  FLASHINFER_CHECK(value.dtype() == qd || value.dtype() == DType::kFloat8E4M3FN, kRaggedDeepseekOp,
                   "value", "dtype ", dtype_torch_name(value.dtype()), " must be query's (",
                   dtype_torch_name(qd), ") or float8_e4m3fn");
  api::check_same_device(key, query, kRaggedDeepseekOp, "key", "query");
  api::check_same_device(value, query, kRaggedDeepseekOp, "value", "query");
  // seq_lens may be a host tensor: vLLM's chunked-context prefill (run_prefill_context_chunk)
  // passes its chunk's lengths from the CPU while the cumulative ones go to the device.
  for (const auto& [t, arg] :
       {std::pair{&seq_lens, "seq_lens"}, std::pair{&cum_seq_lens_q, "cum_seq_lens_q"},
        std::pair{&cum_seq_lens_kv, "cum_seq_lens_kv"}}) {
    api::check_defined(*t, kRaggedDeepseekOp, arg);
    if (t != &seq_lens || !t->device().is_cpu()) {
      api::check_same_device(*t, query, kRaggedDeepseekOp, arg, "query");
    }
  }
  FLASHINFER_CHECK(batch_size >= 0 && batch_size < (int64_t{1} << 31), kRaggedDeepseekOp,
                   "batch_size", "must be in [0, 2^31), got ", batch_size);
  FLASHINFER_CHECK(window_left >= -1 && window_left < (int64_t{1} << 31), kRaggedDeepseekOp,
                   "window_left", "must be -1 (no window) or a non-negative count, got ",
                   window_left);
  FLASHINFER_CHECK(max_q_len >= 0, kRaggedDeepseekOp, "max_q_len", "must be >= 0, got ", max_q_len);
  FLASHINFER_CHECK(max_kv_len >= 0, kRaggedDeepseekOp, "max_kv_len", "must be >= 0, got ",
                   max_kv_len);
  // On CUDA the lengths stay on the device: the kernels read them, a plan kernel checks them by
  // the rules below (a request they refuse: NaN rows; arrays they refuse: every row NaN), nothing
  // is read back, and a CUDA graph captures the call. The host copies upstream takes as hints
  // (q_seq_lens_cpu, kv_seq_lens_cpu) are then checked for shape only.
#if FLASHINFER_WITH_CUDA
  const bool device_plan = query.device().is_cuda() && batch_size > 0;
#else
  const bool device_plan = false;
#endif
  std::vector<int32_t> lens, cq, ckv;
  Tensor seq_lens_dev = seq_lens;  // the device plan's seq_lens
  if (device_plan) {
    api::check_index_tensor(seq_lens, kRaggedDeepseekOp, "seq_lens", batch_size);
    // Host lengths go up to the device with the plan's other inputs (under a capture the copy of
    // a caller's host tensor is refused by name: a replay would not see its later contents).
    if (seq_lens.device() != query.device()) seq_lens_dev = seq_lens.to(query.device());
    api::check_index_tensor(cum_seq_lens_q, kRaggedDeepseekOp, "cum_seq_lens_q", batch_size + 1);
    api::check_index_tensor(cum_seq_lens_kv, kRaggedDeepseekOp, "cum_seq_lens_kv", batch_size + 1);
    FLASHINFER_CHECK(nq <= std::numeric_limits<int32_t>::max(), kRaggedDeepseekOp, "query",
                     "more than 2^31 - 1 rows");
    FLASHINFER_CHECK(nk <= std::numeric_limits<int32_t>::max(), kRaggedDeepseekOp, "key",
                     "more than 2^31 - 1 rows");
    if (q_seq_lens_cpu) {
      api::check_index_tensor(*q_seq_lens_cpu, kRaggedDeepseekOp, "q_seq_lens_cpu", batch_size);
    }
    if (kv_seq_lens_cpu) {
      api::check_index_tensor(*kv_seq_lens_cpu, kRaggedDeepseekOp, "kv_seq_lens_cpu", batch_size);
    }
  } else {
    lens = api::index_to_host(seq_lens, kRaggedDeepseekOp, "seq_lens", batch_size);
    cq = api::index_to_host(cum_seq_lens_q, kRaggedDeepseekOp, "cum_seq_lens_q", batch_size + 1);
    ckv = api::index_to_host(cum_seq_lens_kv, kRaggedDeepseekOp, "cum_seq_lens_kv", batch_size + 1);
    api::check_indptr(cq, kRaggedDeepseekOp, "cum_seq_lens_q");
    api::check_indptr(ckv, kRaggedDeepseekOp, "cum_seq_lens_kv");
    FLASHINFER_CHECK(cq.back() == nq, kRaggedDeepseekOp, "cum_seq_lens_q", "ends at ", cq.back(),
                     " but query has ", nq, " rows");
    FLASHINFER_CHECK(ckv.back() <= nk, kRaggedDeepseekOp, "cum_seq_lens_kv", "ends at ", ckv.back(),
                     " but key has ", nk, " rows");
  }
  std::vector<int32_t> qlens;
  for (int64_t b = 0; b < batch_size && !device_plan; ++b) {
    const int32_t ql = cq[b + 1] - cq[b], kl = ckv[b + 1] - ckv[b];
    FLASHINFER_CHECK(lens[b] == kl, kRaggedDeepseekOp, "seq_lens", "element ", b, " (", lens[b],
                     ") disagrees with cum_seq_lens_kv (", kl, " rows)");
    FLASHINFER_CHECK(ql <= max_q_len, kRaggedDeepseekOp, "max_q_len", "request ", b, " has ", ql,
                     " queries, more than max_q_len=", max_q_len);
    FLASHINFER_CHECK(kl <= max_kv_len, kRaggedDeepseekOp, "max_kv_len", "request ", b, " has ", kl,
                     " keys, more than max_kv_len=", max_kv_len);
    qlens.push_back(ql);
  }
  if (!device_plan) {
    check_hint(q_seq_lens_cpu, qlens, "q_seq_lens_cpu");
    check_hint(kv_seq_lens_cpu, lens, "kv_seq_lens_cpu");
  }
  const double s1 = api::fused_fp32_scale_value(bmm1_scale, kRaggedDeepseekOp, "bmm1_scale");
  const double s2 = api::fused_fp32_scale_value(bmm2_scale, kRaggedDeepseekOp, "bmm2_scale");

  const Shape oshape{nq, hq, dvo};
  Tensor out;
  if (out_arg) {
    out = *out_arg;
    api::check_defined(out, kRaggedDeepseekOp, "out");
    api::check_shape_eq(out, oshape, kRaggedDeepseekOp, "out");
    FLASHINFER_CHECK_CODE(out.dtype() == DType::kFloat16 || out.dtype() == DType::kBFloat16,
                          ErrorCode::kUnsupported, kRaggedDeepseekOp, "out", "dtype ",
                          dtype_torch_name(out.dtype()), " is not supported (float16, bfloat16)");
    api::check_same_device(out, query, kRaggedDeepseekOp, "out", "query");
    ragged_deepseek_check_last_contiguous(out, "out");
    api::check_writable(out, kRaggedDeepseekOp, "out");
    for (const auto& [t, arg] :
         {std::pair{&query, "query"}, std::pair{&key, "key"}, std::pair{&value, "value"}}) {
      api::check_no_overlap(out, *t, kRaggedDeepseekOp, "out", arg);
    }
  } else {
    out = Tensor::empty(oshape, qd == DType::kFloat8E4M3FN ? DType::kBFloat16 : qd, query.device());
  }
  Tensor lse;
  if (lse_arg) {
    lse = *lse_arg;
    api::check_defined(lse, kRaggedDeepseekOp, "lse");
    api::check_shape_eq(lse, Shape{nq, hq}, kRaggedDeepseekOp, "lse");
    FLASHINFER_CHECK(lse.dtype() == DType::kFloat32, kRaggedDeepseekOp, "lse",
                     "must be torch.float32, got ", dtype_torch_name(lse.dtype()));
    api::check_same_device(lse, query, kRaggedDeepseekOp, "lse", "query");
    api::check_writable(lse, kRaggedDeepseekOp, "lse");
    api::check_no_overlap(lse, out, kRaggedDeepseekOp, "lse", "out");
  } else if (return_lse) {
    lse = Tensor::empty({nq, hq}, DType::kFloat32, query.device());
  }

  if (nq > 0 && hq > 0) {
    kernels::RaggedAttentionParams p;
    p.q = query.data_ptr();
    p.k = key.data_ptr();
    p.v = value.data_ptr();
    p.q_dtype = qd;
    p.k_dtype = key.dtype();
    p.v_dtype = value.dtype();
    p.q_stride_n = query.stride(0);
    p.q_stride_h = query.stride(1);
    p.k_stride_n = key.stride(0);
    p.k_stride_h = key.stride(1);
    p.v_stride_n = value.stride(0);
    p.v_stride_h = value.stride(1);
    p.cu_q = cq.data();
    p.cu_kv = ckv.data();
    p.kv_lens = lens.data();
    p.o = out.data_ptr();
    p.o_dtype = out.dtype();
    p.o_stride_n = out.stride(0);
    p.o_stride_h = out.stride(1);
    if (lse.defined()) {
      p.lse = lse.data<float>();
      p.lse_stride_n = lse.stride(0);
      p.lse_stride_h = lse.stride(1);
    }
    p.batch = static_cast<int32_t>(batch_size);
    p.rows = static_cast<int32_t>(nq);
    p.num_qo_heads = static_cast<int32_t>(hq);
    p.num_kv_heads = static_cast<int32_t>(hkv);
    p.head_dim_qk = static_cast<int32_t>(dqk);
    p.head_dim_vo = static_cast<int32_t>(dvo);
    p.window_left = static_cast<int32_t>(window_left);
    p.bmm1_scale = static_cast<float>(s1);
    p.bmm2_scale = static_cast<float>(s2);
    p.causal = is_causal;
#if FLASHINFER_WITH_CUDA
    if (device_plan) {
      api::RaggedDeviceLengths in;
      in.seq_lens = &seq_lens_dev;
      in.cu_q = cum_seq_lens_q.contiguous();
      in.cu_kv = cum_seq_lens_kv.contiguous();
      in.max_q_len = max_q_len;
      in.max_kv_len = max_kv_len;
      in.kv_rows = nk;
      api::run_ragged_attention_planned_on_device(p, query.device(), kRaggedDeepseekOp, "query",
                                                  enable_pdl, &workspace_buffer, in);
    } else
#endif
    {
      api::run_ragged_attention(p, query.device(), kRaggedDeepseekOp, "query", enable_pdl,
                                &workspace_buffer);
    }
  }
  AttentionOutput r;
  r.out = out;
  if (return_lse) r.lse = lse;
  return r;
}

// flashinfer bench: batch_size requests of s_qo queries over s_kv keys each, DeepSeek's head
// dims (192 / 128), num_qo_heads query and num_kv_heads key/value heads, s.causal.
BenchCase ragged_deepseek_bench_ragged(const BenchShape& s, Device dev) {
  FLASHINFER_CHECK(s.s_qo <= s.s_kv || !s.causal, kRaggedDeepseekOp, "s_qo",
                   "needs s_qo <= s_kv when causal");
  const DType qd = s.q_dtype == DType::kFloat32 ? DType::kBFloat16 : s.q_dtype;
  const int64_t B = s.batch_size, nq = B * s.s_qo, nk = B * s.s_kv;
  std::vector<int64_t> cq{0}, ck{0}, lens;
  for (int64_t b = 0; b < B; ++b) {
    cq.push_back((b + 1) * s.s_qo);
    ck.push_back((b + 1) * s.s_kv);
    lens.push_back(s.s_kv);
  }
  Tensor q = api::bench::random_tensor({nq, s.num_qo_heads, 192}, qd, dev, s.random_seed);
  Tensor k = api::bench::random_tensor({nk, s.num_kv_heads, 192}, qd, dev, s.random_seed + 1);
  Tensor v = api::bench::random_tensor({nk, s.num_kv_heads, 128}, qd, dev, s.random_seed + 2);
  // Upstream's benchmarks pass 128 MiB; on CUDA the split-KV partials live there.
  const Tensor ws =
      Tensor::zeros({dev.is_cuda() ? int64_t{128} << 20 : 1 << 12}, DType::kUInt8, dev);
  BenchCase c = api::bench::invoke_case(
      kRaggedDeepseekOp,
      {Value(q), Value(k), Value(v), Value(ws), Value(api::bench::int32_tensor(lens, dev)),
       Value(s.s_qo), Value(s.s_kv), Value(1.0 / std::sqrt(192.0)), Value(1.0), Value(-1.0),
       Value(B), Value(-1), Value(api::bench::int32_tensor(cq, dev)),
       Value(api::bench::int32_tensor(ck, dev)), Value(false), Value(s.causal), Value(true)});
  c.flops = static_cast<double>(B) *
            api::bench::attention_flops(s.s_qo, s.s_kv, s.num_qo_heads, 192, 128, s.causal);
  c.bytes = api::bench::nbytes({nq, s.num_qo_heads, 192 + 128}, qd) +
            api::bench::nbytes({nk, s.num_kv_heads, 192 + 128}, qd);
  return c;
}

}  // namespace

AttentionOutput trtllm_ragged_attention_deepseek(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& workspace_buffer,
    const Tensor& seq_lens, int64_t max_q_len, int64_t max_kv_len,
    ScalarOrTensor<double> bmm1_scale, ScalarOrTensor<double> bmm2_scale, double o_sf_scale,
    int64_t batch_size, int64_t window_left, const Tensor& cum_seq_lens_q,
    const Tensor& cum_seq_lens_kv, std::optional<bool> enable_pdl, bool is_causal, bool return_lse,
    std::optional<Tensor> attention_sinks,
    std::optional<double> skip_softmax_threshold_scale_factor, std::optional<Tensor> out,
    std::optional<Tensor> lse, Value sage_attn_sfs, Value num_elts_per_sage_attn_blk,
    std::string_view backend, std::optional<Tensor> q_seq_lens_cpu,
    std::optional<Tensor> kv_seq_lens_cpu, std::optional<bool> use_fp16_softmax,
    std::optional<bool> uses_spcompress, bool skip_all_rows_active_check) {
  return call_op<&trtllm_ragged_attention_deepseek>(
      [&] {
        (void)o_sf_scale;  // scales nvfp4 outputs only, never produced here
        return ragged_deepseek_ragged_impl(
            query, key, value, workspace_buffer, seq_lens, max_q_len, max_kv_len, bmm1_scale,
            bmm2_scale, batch_size, window_left, cum_seq_lens_q, cum_seq_lens_kv, enable_pdl,
            is_causal, return_lse, attention_sinks, skip_softmax_threshold_scale_factor, out, lse,
            sage_attn_sfs, num_elts_per_sage_attn_blk, backend, q_seq_lens_cpu, kv_seq_lens_cpu,
            use_fp16_softmax, uses_spcompress);
      },
      query, key, value, workspace_buffer, seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale,
      o_sf_scale, batch_size, window_left, cum_seq_lens_q, cum_seq_lens_kv, enable_pdl, is_causal,
      return_lse, attention_sinks, skip_softmax_threshold_scale_factor, out, lse, sage_attn_sfs,
      num_elts_per_sage_attn_blk, backend, q_seq_lens_cpu, kv_seq_lens_cpu, use_fp16_softmax,
      uses_spcompress, skip_all_rows_active_check);
}

namespace detail {
void register_ragged_deepseek_ops(OpRegistry& r) {
  declare<&trtllm_ragged_attention_deepseek>(
      r,
      {.name = kRaggedDeepseekOp,
       .module = "flashinfer.prefill",
       .summary = "Ragged prefill attention, DeepSeek head dims (qk 192, vo 128), base-2 LSE"},
      "query", "key", "value", "workspace_buffer", "seq_lens", "max_q_len", "max_kv_len",
      "bmm1_scale", "bmm2_scale", "o_sf_scale", "batch_size", "window_left", "cum_seq_lens_q",
      "cum_seq_lens_kv", arg("enable_pdl").required(), "is_causal", "return_lse", "attention_sinks",
      "skip_softmax_threshold_scale_factor", arg("out").mut(), arg("lse").mut(),
      arg("sage_attn_sfs", Value::tuple({Value(), Value(), Value(), Value()})),
      arg("num_elts_per_sage_attn_blk", Value::tuple({Value(0), Value(0), Value(0), Value(0)})),
      arg("backend", "trtllm-gen"), "q_seq_lens_cpu", "kv_seq_lens_cpu", "use_fp16_softmax",
      "uses_spcompress", arg("skip_all_rows_active_check", true));
  api::register_ragged_attention_backends(kRaggedDeepseekOp);
  register_bench_hook(kRaggedDeepseekOp, ragged_deepseek_bench_ragged);
}
}  // namespace detail

}  // namespace flashinfer
