// trtllm_fmha_v2_prefill (flashinfer.prefill): declaration, checks, the CPU reference
// (kernels/cpu/fmha_v2_prefill_cpu.cpp) and the CUDA backend: the call as a batch attention on
// the shared kernels (the FA2 prefill kernel where it fits, else the CUDA-core kernel). What
// those kernels cannot express (fp8 inputs, chunked attention, softmax statistics, ALiBi after a
// soft cap) is refused by name, so replay --device cuda falls back to the CPU for it.
#include "flashinfer/ops/fmha_v2_prefill.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/fmha_v2_prefill_cpu.h"
#include "kernels/fmha_v2_prefill_params.h"
#if FLASHINFER_WITH_CUDA
#include <cstdint>
#include <cstring>
#include <tuple>

#include "core/cuda_runtime.h"
#include "kernels/cuda/decode_cuda.h"
#include "kernels/cuda/prefill_shape.h"
#endif

namespace flashinfer {

FmhaV2Qkv FmhaV2Qkv::from_value(const Value& v) {
  if (v.is_tensor()) return FmhaV2Qkv(v.as_tensor());
  const auto& it = v.items();
  if (it.size() == 2) return FmhaV2Qkv(it[0].as_tensor(), it[1].as_tensor());
  return FmhaV2Qkv(it.at(0).as_tensor(), it.at(1).as_tensor(), it.at(2).as_tensor());
}

Value to_value(const FmhaV2Qkv& qkv) {
  if (qkv.is_single()) return Value(qkv.tensors().at(0));
  Value::Items items;
  for (const Tensor& t : qkv.tensors()) items.push_back(Value(t));
  return Value::tuple(std::move(items));
}

/// Upstream's Union[Tensor, Tuple[Tensor, Tensor], Tuple[Tensor, Tensor, Tensor]].
template <>
struct ArgTraits<FmhaV2Qkv> {
  static constexpr ParamKind kind = ParamKind::kAny;
  static FmhaV2Qkv get(const CallArgs& a, std::size_t i) {
    bool ok = a[i].is_tensor();
    if (a[i].is_sequence()) {
      const auto& it = a[i].items();
      ok = (it.size() == 2 || it.size() == 3) &&
           std::all_of(it.begin(), it.end(), [](const Value& x) { return x.is_tensor(); });
    }
    FLASHINFER_CHECK(ok, a.decl().name, a.decl().params.at(i).name,
                     "expected a tensor or a tuple of two or three tensors, got ", a[i].repr());
    return FmhaV2Qkv::from_value(a[i]);
  }
};

namespace {

constexpr const char* kFmhaV2PrefillOp = "trtllm_fmha_v2_prefill";

#if FLASHINFER_WITH_CUDA
// The call as the shared kernels' AttentionParams, data pointers only (fmha_v2_prefill_run_cuda
// adds the index arrays). FMHAv2's ALiBi bias slope * (j - pos) and the kernels' slope * (j - i)
// differ by a constant per query row, which the softmax cancels (statistics with ALiBi are refused
// by the API).
kernels::AttentionParams as_attention(const kernels::FmhaV2PrefillParams& p) {
  kernels::AttentionParams a;
  a.q = p.q;
  a.q_dtype = p.dtype;
  a.q_stride_n = p.q_stride_n;
  a.q_stride_h = p.q_stride_h;
  a.kv.k = p.k;
  a.kv.v = p.v;
  a.kv.dtype = p.dtype;
  a.kv.k_stride_page = p.k_stride_page;
  a.kv.k_stride_token = p.k_stride_n;
  a.kv.k_stride_head = p.k_stride_h;
  a.kv.v_stride_page = p.v_stride_page;
  a.kv.v_stride_token = p.v_stride_n;
  a.kv.v_stride_head = p.v_stride_h;
  a.kv.page_size = p.page_size > 0 ? p.page_size : 1;
  a.o = p.o;
  a.o_dtype = p.o_dtype;
  a.o_stride_n = p.o_stride_n;
  a.o_stride_h = p.o_stride_h;
  a.batch = p.batch;
  a.num_qo_heads = p.num_qo_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.head_dim_qk = p.head_dim_qk;
  a.head_dim_vo = p.head_dim_vo;
  a.sm_scale = p.bmm1_scale;
  a.v_scale = p.bmm2_scale;
  a.logits_soft_cap = p.soft_cap;
  a.causal = p.causal;
  // Positions fit 32 bits (kv_lens are int32): a wider window hides nothing, as no window.
  a.window_left = p.window_left > INT32_MAX ? -1 : static_cast<int32_t>(p.window_left);
  a.use_tensor_cores = true;
  return a;
}

api::Refusal cuda_supports(const kernels::FmhaV2PrefillParams& p) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return {"qkv", "fp8 e4m3 inputs run on the CPU reference only"};
  }
  if (p.chunk > 0) {
    return {"chunked_attention_size", "chunked attention runs on the CPU reference only"};
  }
  if (p.stats != nullptr) {
    return {"save_softmax_stats", "softmax statistics run on the CPU reference only"};
  }
  if (p.alibi_slopes != nullptr && p.soft_cap > 0.0f) {
    return {"pos_encoding_mode",
            "ALiBi with a soft cap runs on the CPU reference only (FMHAv2 adds the bias after the "
            "cap, the CUDA kernels before it)"};
  }
  const int dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  const bool jit_dims = dqk == dvo && dqk >= 16 && dqk <= 256 && dqk % 16 == 0;
  if (!kernels::cuda::prefill::prefill_dims_built(dqk, dvo) && !jit_dims) {
    return {"qkv",
            "head dims must be equal multiples of 16 up to 256, or 192 / 128, on CUDA; others run "
            "on the CPU reference"};
  }
  if (!kernels::cuda::attention_rows_aligned(as_attention(p))) {
    return {"qkv", "every q, K, V and out row must start on 16 bytes on CUDA"};
  }
  return {};
}

// The index arrays (host in `p`) go to the device in one int32 tensor, the per-head floats in
// one fp32 tensor; both stay alive until the launches are queued (stream-ordered frees).
void fmha_v2_prefill_run_cuda(const kernels::FmhaV2PrefillParams& p, const api::LaunchContext& c) {
  kernels::AttentionParams a = as_attention(p);
  if (const kernels::FmhaV2DevicePlan* d = p.device_plan) {  // filled by the plan kernel
    a.qo_indptr = d->qo_indptr;
    a.kv.kv_indptr = d->kv_indptr;
    a.kv.kv_indices = d->kv_indices;
    a.kv_lens = d->kv_lens;
    a.work = d->work;
    a.num_work = d->num_work;
    a.max_work_rows = d->max_work_rows;
    a.merge_indptr = d->merge_indptr;
    a.merge_rows = d->merge_rows;
    a.merge_out_row = d->merge_out_row;
    a.num_merge = d->num_merge;
    a.tmp_v = d->tmp_v;
    a.tmp_s = d->tmp_s;
    a.sinks = d->sinks;
    if (a.num_work > 0) kernels::cuda::batch_attention(a, c.stream, c.enable_pdl);
    return;
  }
  const std::size_t nb = static_cast<std::size_t>(p.batch);
  const bool paged = p.page_size > 0;
  std::vector<int32_t> ints(p.cu_q, p.cu_q + nb + 1);  // qo_indptr
  const std::size_t kv_indptr_at = ints.size();
  for (std::size_t b = 0; b <= nb; ++b) {  // paged: request b's row of block_tables
    ints.push_back(paged ? static_cast<int32_t>(b * p.bt_stride) : p.cu_kv[b]);
  }
  const std::size_t kv_lens_at = ints.size();
  ints.insert(ints.end(), p.kv_lens, p.kv_lens + nb);
  const std::size_t pages_at = ints.size();
  if (paged) ints.insert(ints.end(), p.block_tables, p.block_tables + nb * p.bt_stride);
  // Work items split across the keys when they would not fill the device (the wrappers' rule),
  // the partials in the caller's workspace, merged after the items (batch_attention).
  const int variant = (p.soft_cap > 0.0f ? kernels::cuda::prefill::kPrefillSoftCap : 0) |
                      (p.alibi_slopes != nullptr ? kernels::cuda::prefill::kPrefillAlibi : 0);
  // The Hopper kernel's tall blocks, where they run the items, fit one an SM at head dims >= 128
  // (one_shot_plan applies their budget only to the variants they have: not ALiBi, set on `a`
  // further down).
  const kernels::AttentionPlan plan = api::one_shot_plan(
      p.cu_q, p.kv_lens, p.batch, p.num_qo_heads / p.num_kv_heads, p.num_kv_heads, p.head_dim_qk,
      p.head_dim_vo, variant, api::tensor_core_max_grid(c.device), a.max_work_rows,
      api::hopper_tall_max_grid(a, c.device));
  const std::vector<kernels::WorkItem>& work = plan.work;
  const std::size_t work_at = ints.size();
  ints.resize(work_at + work.size() * 6);
  if (!work.empty()) {
    std::memcpy(ints.data() + work_at, work.data(), work.size() * sizeof(kernels::WorkItem));
  }
  const std::size_t merge_at = ints.size();
  if (plan.split_kv) {
    ints.insert(ints.end(), plan.merge_indptr.begin(), plan.merge_indptr.end());
    ints.insert(ints.end(), plan.merge_rows.begin(), plan.merge_rows.end());
    ints.insert(ints.end(), plan.merge_out_row.begin(), plan.merge_out_row.end());
    std::tie(a.tmp_v, a.tmp_s) =
        api::workspace_partials(p.workspace, p.workspace_bytes, plan, p.num_qo_heads, p.head_dim_vo,
                                kFmhaV2PrefillOp, "workspace_buffer");
  }
  ints.push_back(0);  // never empty
  Tensor hi = Tensor::empty({static_cast<int64_t>(ints.size())}, DType::kInt32);
  std::memcpy(hi.data_ptr(), ints.data(), ints.size() * sizeof(int32_t));
  const Tensor di = hi.to(c.device);
  const auto* base = di.data<const int32_t>();
  a.qo_indptr = base;
  a.kv.kv_indptr = base + kv_indptr_at;
  a.kv_lens = base + kv_lens_at;
  if (paged) a.kv.kv_indices = base + pages_at;
  a.work = reinterpret_cast<const kernels::WorkItem*>(base + work_at);
  a.num_work = static_cast<int32_t>(work.size());
  if (plan.split_kv) {
    a.merge_indptr = base + merge_at;
    a.merge_rows = a.merge_indptr + plan.merge_indptr.size();
    a.merge_out_row = a.merge_rows + plan.merge_rows.size();
    a.num_merge = static_cast<int32_t>(plan.merge_out_row.size());
  }
  const int64_t H = p.num_qo_heads;
  Tensor hf = Tensor::zeros({2 * H}, DType::kFloat32);
  if (p.sinks) std::memcpy(hf.data<float>(), p.sinks, H * sizeof(float));
  if (p.alibi_slopes) std::memcpy(hf.data<float>() + H, p.alibi_slopes, H * sizeof(float));
  Tensor df;
  if (p.sinks || p.alibi_slopes) {
    df = hf.to(c.device);
    if (p.sinks) a.sinks = df.data<const float>();
    if (p.alibi_slopes) a.alibi_slopes = df.data<const float>() + H;
  }
  kernels::cuda::batch_attention(a, c.stream, c.enable_pdl);
}
#endif

constexpr api::KernelEntry<kernels::FmhaV2PrefillParams> kFmhaV2PrefillKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 softmax, OpenMP over (query row, KV head)", nullptr,
     [](const kernels::FmhaV2PrefillParams& p, const api::LaunchContext&) {
       kernels::cpu::fmha_v2_prefill(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA: the batch-attention kernels (FA2 prefill where it fits, else the CUDA-core kernel), "
     "work items per request and query tile, split across the keys when they would not fill the "
     "device",
     cuda_supports, fmha_v2_prefill_run_cuda},
#endif
};

#if FLASHINFER_WITH_CUDA
// The device tensors of a call planned on the device (fmha_v2_prefill_planned_on_device).
struct FmhaV2DeviceLengths {
  const Tensor* seq_lens = nullptr;  // int32 [batch], any stride
  Tensor cu_q, cu_kv, table;  // int32 (cu_q, cu_kv contiguous): cu_kv ragged only, table paged only
  const float* sinks = nullptr;  // the caller's [Hq] fp32 on the device, or nullptr
  int64_t max_q_len = 0, max_kv_len = 0, kv_rows = 0, num_pages = 0;
};

// `p` (its host index arrays unset) planned on the device as trtllm_ragged_attention_deepseek's
// calls are (ragged_deepseek.cpp): the grid from the query's rows and the bounds
// (api::ragged_device_grid), filled in the compact layout by the block-table plan kernel from the
// device lengths, paged (the block table read in place) or ragged; the host's rules its rules (a
// refused request's rows NaN; every row for index arrays the host would refuse). Nothing is read
// back and nothing synchronizes: a CUDA graph captures the call.
void fmha_v2_prefill_planned_on_device(kernels::FmhaV2PrefillParams p, Device device,
                                       const FmhaV2DeviceLengths& in) {
  const char* op = kFmhaV2PrefillOp;
  const flashinfer::detail::CudaDeviceScope on_device(device);
  const bool paged = p.page_size > 0;
  kernels::BlockTablePlan bp =
      api::one_shot_plan_inputs(*in.seq_lens, in.cu_q, p.batch, p.rows, in.max_q_len,
                                paged ? nullptr : &in.cu_kv, in.kv_rows, in.max_kv_len);
  Tensor table;  // in.table, or its dense copy: alive until the launches are queued
  if (paged) {
    api::block_table_plan_table(bp, in.table, p.batch, op, table);
    bp.num_pages = in.num_pages;
    bp.page_size = p.page_size;
    // A request's keys at most: the bound, or the table row's room.
    bp.max_seq_len = static_cast<int32_t>(
        std::min({in.max_kv_len, int64_t{bp.max_blocks} * p.page_size, int64_t{INT32_MAX}}));
  }
  const kernels::AttentionParams a = as_attention(p);
  const int variant = p.soft_cap > 0.0f ? kernels::cuda::prefill::kPrefillSoftCap : 0;
  const api::RaggedDeviceGrid grid = api::ragged_device_grid(
      bp, p.num_qo_heads / p.num_kv_heads, p.num_kv_heads, p.head_dim_qk, p.head_dim_vo,
      api::tensor_core_max_grid(device), api::hopper_tall_max_grid(a, device), op, variant,
      // The caller's workspace holds the split's partials (less the up to 15 bytes skipped to a
      // 16-byte boundary): none where it is not on the device.
      p.workspace != nullptr ? std::max<int64_t>(0, p.workspace_bytes - 15) : 0);
  const api::BlockPlanScratch mem =
      api::place_device_plan(bp, grid, /*items=*/true, /*has_workspace=*/true, p.workspace,
                             p.workspace_bytes, p.num_qo_heads, p.head_dim_vo, device, op);
  bp.o = p.o;
  bp.o_dtype = p.o_dtype;
  bp.o_stride_n = p.o_stride_n;
  bp.o_stride_h = p.o_stride_h;
  bp.num_qo_heads = p.num_qo_heads;
  bp.head_dim_vo = p.head_dim_vo;
  kernels::FmhaV2DevicePlan d;
  d.qo_indptr = bp.qo_indptr;
  d.kv_indptr = bp.kv_indptr;
  d.kv_indices = paged ? bp.block_tables : nullptr;
  d.kv_lens = bp.kv_lens;
  d.work = bp.work;
  d.num_work = static_cast<int32_t>(grid.items);
  d.max_work_rows = grid.max_rows;
  if (grid.partial_rows > 0) {
    d.merge_indptr = bp.merge_indptr;
    d.merge_rows = bp.merge_rows;
    d.merge_out_row = bp.merge_out_row;
    d.num_merge = p.rows;  // an entry a query row
    d.tmp_v = bp.tmp_v;
    d.tmp_s = bp.tmp_s;
  }
  d.sinks = in.sinks;
  p.device_plan = &d;
  // The kernels' refusals first: after the plan kernel ran, one would leave its NaN rows in `out`.
  const api::Refusal r = cuda_supports(p);
  FLASHINFER_CHECK_CODE(!r.refused(), ErrorCode::kUnsupported, op, r.arg, r.reason);
  api::launch_block_table_plan(bp, device, op);
  api::launch(kFmhaV2PrefillKernels, p, device, op, "qkv", std::nullopt);  // `mem` held till here
}
#endif

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

void check_3d(const Tensor& t, const char* what) {
  api::check_defined(t, kFmhaV2PrefillOp, "qkv");
  FLASHINFER_CHECK(t.dim() == 3, kFmhaV2PrefillOp, "qkv", what,
                   " must be 3-D [tokens, heads, head_dim], got ", shape_to_string(t.shape()));
}

void fmha_v2_prefill_check_last_contiguous(const Tensor& t) {
  FLASHINFER_CHECK(t.stride(-1) == 1 || t.size(-1) <= 1, kFmhaV2PrefillOp, "qkv",
                   "the head_dim axis must be contiguous");
}

// Whether a call plans on the device (fmha_v2_prefill_planned_on_device): on CUDA, a call the
// tensor-core kernels run (16-bit inputs; `host_only`: chunked attention, softmax statistics or
// ALiBi, whose slopes are made on the host), batch_size > 0, every tensor it reads the lengths
// and pages from (and the sinks) on the query's device. Anything else keeps the host plan.
bool fmha_v2_plans_on_device(const Tensor& q, int64_t batch, bool host_only,
                             const std::optional<Tensor>& sinks,
                             std::initializer_list<const Tensor*> index_tensors) {
#if FLASHINFER_WITH_CUDA
  if (!q.device().is_cuda() || batch <= 0 || host_only) return false;
  if (q.dtype() != DType::kFloat16 && q.dtype() != DType::kBFloat16) return false;
  if (sinks && (!sinks->defined() || sinks->device() != q.device())) return false;
  return std::all_of(index_tensors.begin(), index_tensors.end(),
                     [&](const Tensor* t) { return t->defined() && t->device() == q.device(); });
#else
  (void)q;
  (void)batch;
  (void)host_only;
  (void)sinks;
  (void)index_tensors;
  return false;
#endif
}

AttentionOutput fmha_v2_prefill_impl(
    const FmhaV2Qkv& qkv, std::string_view layout, const Tensor& workspace_buffer,
    const Tensor& seq_lens, int64_t max_q_len, int64_t max_kv_len, double bmm1_scale,
    double bmm2_scale, int64_t batch_size, const Tensor& cum_seq_lens_q,
    const Tensor& cum_seq_lens_kv, const std::optional<Tensor>& block_tables,
    const std::optional<Tensor>& out_arg, std::optional<DType> out_dtype,
    const std::optional<Tensor>& sinks, const std::optional<std::string>& pos_encoding_mode,
    std::optional<double> soft_cap, std::string_view mask_mode, int64_t window_left,
    int64_t chunked_attention_size, bool save_softmax_stats, double skip_softmax) {
  api::check_defined(workspace_buffer, kFmhaV2PrefillOp, "workspace_buffer");
  // Upstream passes `pos_encoding_mode.lower() == "alibi"` to its kernels: any other value is
  // no positional encoding.
  const bool alibi = pos_encoding_mode && lower(*pos_encoding_mode) == "alibi";
  FLASHINFER_CHECK(std::isfinite(skip_softmax) && skip_softmax >= 0, kFmhaV2PrefillOp,
                   "skip_softmax_threshold_scale_factor", "must be finite and >= 0, got ",
                   skip_softmax);
  // Upstream's kernels skip a whole KV tile's softmax and BMM2 when exp(tile max - running max) <
  // factor / kv_len for every row of a warpgroup: the result depends on the kernel's tile size
  // and schedule, which no exact reference can follow.
  FLASHINFER_CHECK_CODE(skip_softmax == 0.0, ErrorCode::kUnsupported, kFmhaV2PrefillOp,
                        "skip_softmax_threshold_scale_factor",
                        "skip-softmax is a lossy approximation decided per KV tile of upstream's "
                        "kernels (tile size and schedule dependent) and cannot be reproduced "
                        "exactly; pass 0");
  // ---- layout ----
  const auto& t = qkv.tensors();
  const bool paged = layout == "Q_PAGED_KV_NHD" || layout == "Q_PAGED_KV_HND";
  const bool hnd = layout == "Q_PAGED_KV_HND";
  const std::size_t want = layout == "PACKED_QKV"                   ? 1
                           : layout == "SEPARATE_Q_K_V"             ? 3
                           : (layout == "CONTIGUOUS_Q_KV" || paged) ? 2
                                                                    : 0;
  FLASHINFER_CHECK(want != 0, kFmhaV2PrefillOp, "input_layout", "unsupported input_layout '",
                   layout,
                   "' (PACKED_QKV, CONTIGUOUS_Q_KV, Q_PAGED_KV_HND, Q_PAGED_KV_NHD, "
                   "SEPARATE_Q_K_V)");
  FLASHINFER_CHECK(
      qkv.is_single() == (want == 1) && t.size() == want, kFmhaV2PrefillOp, "qkv", "input_layout ",
      layout, " takes ",
      want == 1 ? std::string("one tensor") : "a tuple of " + std::to_string(want), ", got ",
      qkv.is_single() ? std::string("one tensor") : "a tuple of " + std::to_string(t.size()));
  for (const Tensor& x : t) api::check_defined(x, kFmhaV2PrefillOp, "qkv");
  Tensor q, k, v;  // q [tokens, H, D]; k/v views with a page axis if paged
  int64_t hkv = 0, page_size = 0, num_pages = 0;
  if (layout == "PACKED_QKV") {
    FLASHINFER_CHECK(t[0].dim() == 4 && t[0].size(1) == 3, kFmhaV2PrefillOp, "qkv",
                     "PACKED_QKV expects [tokens, 3, num_heads, head_dim], got ",
                     shape_to_string(t[0].shape()));
    q = t[0].select(1, 0);
    k = t[0].select(1, 1);
    v = t[0].select(1, 2);
    hkv = q.size(1);
  } else if (layout == "CONTIGUOUS_Q_KV") {
    check_3d(t[0], "Q");
    FLASHINFER_CHECK(t[1].dim() == 4 && t[1].size(1) == 2, kFmhaV2PrefillOp, "qkv",
                     "CONTIGUOUS_Q_KV expects KV [tokens, 2, num_kv_heads, head_dim], got ",
                     shape_to_string(t[1].shape()));
    q = t[0];
    k = t[1].select(1, 0);
    v = t[1].select(1, 1);
    hkv = k.size(1);
  } else if (layout == "SEPARATE_Q_K_V") {
    check_3d(t[0], "Q");
    check_3d(t[1], "K");
    check_3d(t[2], "V");
    q = t[0];
    k = t[1];
    v = t[2];
    hkv = k.size(1);
    FLASHINFER_CHECK(v.size(0) == k.size(0) && v.size(1) == hkv, kFmhaV2PrefillOp, "qkv", "V ",
                     shape_to_string(v.shape()), " does not match K ", shape_to_string(k.shape()));
    FLASHINFER_CHECK(!(soft_cap && *soft_cap > 0), kFmhaV2PrefillOp, "logits_soft_cap_scale",
                     "soft capping is not supported for the SEPARATE_Q_K_V input layout (as "
                     "upstream)");
  } else {
    check_3d(t[0], "Q");
    FLASHINFER_CHECK(t[1].dim() == 5 && t[1].size(1) == 2, kFmhaV2PrefillOp, "qkv", layout,
                     " expects paged KV [pages, 2, ",
                     hnd ? "num_kv_heads, page_size" : "page_size, num_kv_heads",
                     ", head_dim], got ", shape_to_string(t[1].shape()));
    q = t[0];
    // [pages, page_size, Hkv, D] views (HND transposed), so one set of strides serves both.
    k = t[1].select(1, 0);
    v = t[1].select(1, 1);
    if (hnd) {
      k = k.transpose(1, 2);
      v = v.transpose(1, 2);
    }
    num_pages = k.size(0);
    page_size = k.size(1);
    hkv = k.size(2);
    FLASHINFER_CHECK(page_size >= 1, kFmhaV2PrefillOp, "qkv", "page_size must be >= 1");
    FLASHINFER_CHECK(block_tables.has_value(), kFmhaV2PrefillOp, "block_tables", "is required for ",
                     layout);
  }
  for (const Tensor* x : {&q, &k, &v}) fmha_v2_prefill_check_last_contiguous(*x);
  const int64_t rows = q.size(0), H = q.size(1), D = q.size(2), dv = v.size(-1);
  FLASHINFER_CHECK(k.size(-1) == D, kFmhaV2PrefillOp, "qkv", "key head_dim ", k.size(-1),
                   " != query's ", D);
  FLASHINFER_CHECK(D >= 1 && D <= 256 && dv >= 1 && dv <= 256, kFmhaV2PrefillOp, "qkv",
                   "head dims must be in [1, 256], got ", D, " and ", dv);
  FLASHINFER_CHECK(hkv >= 1 && H % hkv == 0, kFmhaV2PrefillOp, "qkv", "KV heads (", hkv,
                   ") must divide the query's ", H);
  const DType qd = q.dtype();
  FLASHINFER_CHECK(qd == DType::kFloat16 || qd == DType::kBFloat16 || qd == DType::kFloat8E4M3FN,
                   kFmhaV2PrefillOp, "qkv", "dtype ", dtype_torch_name(qd),
                   " is not supported (float16, bfloat16, float8_e4m3fn)");
  FLASHINFER_CHECK(qd != DType::kFloat8E4M3FN || layout != "SEPARATE_Q_K_V", kFmhaV2PrefillOp,
                   "qkv",
                   "fp8 e4m3 is not supported for the SEPARATE_Q_K_V input layout (as upstream)");
  for (const Tensor& x : t) {
    api::check_same_dtype(x, t[0], kFmhaV2PrefillOp, "qkv", "qkv");
    api::check_same_device(x, t[0], kFmhaV2PrefillOp, "qkv", "qkv");
  }
  // ---- lengths ----
  FLASHINFER_CHECK(batch_size >= 0, kFmhaV2PrefillOp, "batch_size", "must be >= 0, got ",
                   batch_size);
  FLASHINFER_CHECK(max_q_len >= 0, kFmhaV2PrefillOp, "max_q_len", "must be >= 0, got ", max_q_len);
  FLASHINFER_CHECK(max_kv_len >= 0, kFmhaV2PrefillOp, "max_kv_len", "must be >= 0, got ",
                   max_kv_len);
  // On CUDA, where the call runs on the tensor-core kernels, the lengths stay on the device (as
  // trtllm_ragged_attention_deepseek's: fmha_v2_prefill_planned_on_device); the host rules below
  // become the plan kernel's, refused requests' rows NaN.
  const bool device_plan = fmha_v2_plans_on_device(
      q, batch_size, chunked_attention_size > 0 || save_softmax_stats || alibi, sinks,
      {&seq_lens, &cum_seq_lens_q, paged ? &*block_tables : &cum_seq_lens_kv});
  std::vector<int32_t> kv_lens, cu_q, cu_kv;
  if (device_plan) {
    api::check_index_tensor(seq_lens, kFmhaV2PrefillOp, "seq_lens", batch_size);
    api::check_index_tensor(cum_seq_lens_q, kFmhaV2PrefillOp, "cum_seq_lens_q", batch_size + 1);
    if (!paged) {
      api::check_index_tensor(cum_seq_lens_kv, kFmhaV2PrefillOp, "cum_seq_lens_kv", batch_size + 1);
    }
    FLASHINFER_CHECK(rows <= INT32_MAX && k.size(0) <= INT32_MAX, kFmhaV2PrefillOp, "qkv",
                     "more than 2^31 - 1 rows");
  } else {
    kv_lens = api::index_to_host(seq_lens, kFmhaV2PrefillOp, "seq_lens", batch_size);
    cu_q = api::index_to_host(cum_seq_lens_q, kFmhaV2PrefillOp, "cum_seq_lens_q", batch_size + 1);
    api::check_indptr(cu_q, kFmhaV2PrefillOp, "cum_seq_lens_q");
    FLASHINFER_CHECK(cu_q.back() == rows, kFmhaV2PrefillOp, "cum_seq_lens_q", "ends at ",
                     cu_q.back(), " but the query has ", rows, " tokens");
  }
  if (!paged && !device_plan) {
    cu_kv =
        api::index_to_host(cum_seq_lens_kv, kFmhaV2PrefillOp, "cum_seq_lens_kv", batch_size + 1);
    api::check_indptr(cu_kv, kFmhaV2PrefillOp, "cum_seq_lens_kv");
    FLASHINFER_CHECK(cu_kv.back() <= k.size(0), kFmhaV2PrefillOp, "cum_seq_lens_kv", "ends at ",
                     cu_kv.back(), " but the key has ", k.size(0), " tokens");
  }
  for (int64_t b = 0; b < batch_size && !device_plan; ++b) {
    FLASHINFER_CHECK(kv_lens[b] >= 0 && kv_lens[b] <= max_kv_len, kFmhaV2PrefillOp, "seq_lens",
                     "seq_lens[", b, "] = ", kv_lens[b],
                     " is outside [0, max_kv_len = ", max_kv_len, "]");
    FLASHINFER_CHECK(cu_q[b + 1] - cu_q[b] <= max_q_len, kFmhaV2PrefillOp, "max_q_len", "request ",
                     b, " has ", cu_q[b + 1] - cu_q[b],
                     " queries, more than max_q_len = ", max_q_len);
    if (!paged) {
      FLASHINFER_CHECK(cu_kv[b + 1] - cu_kv[b] == kv_lens[b], kFmhaV2PrefillOp, "cum_seq_lens_kv",
                       "request ", b, " spans ", cu_kv[b + 1] - cu_kv[b], " key rows but seq_lens[",
                       b, "] = ", kv_lens[b]);
    }
  }
  std::vector<int32_t> table;
  int64_t bt_stride = 0;
  if (paged) {
    const Tensor& bt = *block_tables;
    api::check_defined(bt, kFmhaV2PrefillOp, "block_tables");
    FLASHINFER_CHECK(bt.dim() == 2 && bt.size(0) == batch_size && bt.dtype() == DType::kInt32,
                     kFmhaV2PrefillOp, "block_tables",
                     "must be int32 [batch_size, max_num_pages], got ",
                     dtype_torch_name(bt.dtype()), " ", shape_to_string(bt.shape()));
    bt_stride = bt.size(1);
  }
  if (paged && !device_plan) {
    const Tensor h = block_tables->to(Device::cpu()).contiguous();
    table.assign(h.data<int32_t>(), h.data<int32_t>() + h.numel());
    for (int64_t b = 0; b < batch_size; ++b) {
      const int64_t need = (kv_lens[b] + page_size - 1) / page_size;
      FLASHINFER_CHECK(need <= bt_stride, kFmhaV2PrefillOp, "block_tables", "request ", b,
                       " needs ", need, " pages but the table has ", bt_stride, " columns");
      for (int64_t p = 0; p < need; ++p) {
        const int32_t page = table[b * bt_stride + p];
        FLASHINFER_CHECK(page >= 0 && page < num_pages, kFmhaV2PrefillOp, "block_tables",
                         "block_tables[", b, ", ", p, "] = ", page, " is not a page of the cache (",
                         num_pages, " pages)");
      }
    }
  }
  // ---- mask ----
  const std::string mode = lower(mask_mode);
  FLASHINFER_CHECK(
      mode == "causal" || mode == "sliding_window" || mode == "chunked" || mode == "padding",
      kFmhaV2PrefillOp, "mask_mode", "unsupported mask_mode '", mask_mode,
      "' (causal, sliding_window, chunked, padding)");
  FLASHINFER_CHECK(window_left >= -1, kFmhaV2PrefillOp, "window_left", "must be >= -1, got ",
                   window_left);
  FLASHINFER_CHECK(
      chunked_attention_size >= 0 && (chunked_attention_size & (chunked_attention_size - 1)) == 0,
      kFmhaV2PrefillOp, "chunked_attention_size", "must be 0 or a power of 2, got ",
      chunked_attention_size);
  FLASHINFER_CHECK(mode != "chunked" || chunked_attention_size > 0, kFmhaV2PrefillOp,
                   "chunked_attention_size",
                   "mask_mode 'chunked' needs chunked_attention_size > 0");
  FLASHINFER_CHECK(mode != "padding" || (window_left < 0 && chunked_attention_size == 0),
                   kFmhaV2PrefillOp, "mask_mode",
                   "sliding window and chunked attention need causal masking");
  FLASHINFER_CHECK(std::isfinite(bmm1_scale), kFmhaV2PrefillOp, "bmm1_scale", "must be finite");
  FLASHINFER_CHECK(std::isfinite(bmm2_scale), kFmhaV2PrefillOp, "bmm2_scale", "must be finite");
  const double cap = soft_cap.value_or(0.0);
  FLASHINFER_CHECK(std::isfinite(cap) && cap >= 0, kFmhaV2PrefillOp, "logits_soft_cap_scale",
                   "must be finite and >= 0, got ", cap);
  // ---- sinks ----
  Tensor sinks_h, sinks_d;
  if (sinks) {
    api::check_defined(*sinks, kFmhaV2PrefillOp, "sinks");
    FLASHINFER_CHECK(sinks->dim() == 1 && sinks->size(0) == H && sinks->dtype() == DType::kFloat32,
                     kFmhaV2PrefillOp, "sinks", "must be float32 [", H, "], got ",
                     dtype_torch_name(sinks->dtype()), " ", shape_to_string(sinks->shape()));
    FLASHINFER_CHECK_CODE(!save_softmax_stats, ErrorCode::kUnsupported, kFmhaV2PrefillOp,
                          "save_softmax_stats",
                          "softmax statistics with sinks are not supported (upstream's "
                          "convention for that case is not pinned down)");
    if (device_plan) {
      sinks_d = sinks->contiguous();  // read by the kernels in place
    } else {
      sinks_h = sinks->to(Device::cpu()).contiguous();
    }
    // FMHAv2 adds slope * absolute key column, so the sink's weight against the keys depends on
    // that offset, a convention not pinned down here.
    FLASHINFER_CHECK_CODE(!alibi, ErrorCode::kUnsupported, kFmhaV2PrefillOp, "sinks",
                          "sinks with pos_encoding_mode=\"alibi\" are not supported");
  }
  FLASHINFER_CHECK_CODE(!(alibi && save_softmax_stats), ErrorCode::kUnsupported, kFmhaV2PrefillOp,
                        "save_softmax_stats",
                        "softmax statistics with ALiBi are not supported (the stored max "
                        "includes FMHAv2's absolute-column bias)");
  FLASHINFER_CHECK_CODE(!(save_softmax_stats && qd == DType::kFloat8E4M3FN),
                        ErrorCode::kUnsupported, kFmhaV2PrefillOp, "save_softmax_stats",
                        "softmax statistics with fp8 inputs are not supported (upstream's "
                        "scaling of them is not pinned down)");
  // ---- output ----
  const DType od = out_arg ? out_arg->dtype() : out_dtype.value_or(qd);
  if (qd == DType::kFloat8E4M3FN) {
    FLASHINFER_CHECK(od == DType::kFloat16 || od == DType::kBFloat16 || od == DType::kFloat8E4M3FN,
                     kFmhaV2PrefillOp, out_arg ? "out" : "out_dtype", "output dtype ",
                     dtype_torch_name(od),
                     " is not supported for fp8 inputs (float16, bfloat16, float8_e4m3fn)");
  } else {
    FLASHINFER_CHECK(od == qd, kFmhaV2PrefillOp, out_arg ? "out" : "out_dtype", "output dtype ",
                     dtype_torch_name(od), " must be the query's (", dtype_torch_name(qd),
                     ") for 16-bit inputs");
  }
  // FMHAv2's ALiBi slopes (fmha::AlibiParams(h), scale_after_alibi 1): with p = the largest power
  // of two <= H, head h < p gets 2^(-8 (h + 1) / p), the others 2^(-4 (2 (h - p) + 1) / p),
  // computed in fp32 as the kernel does.
  std::vector<float> slopes;
  if (alibi) {
    int64_t p2 = 1;
    while (p2 * 2 <= H) p2 *= 2;
    const float neg4 = -4.0f / static_cast<float>(p2);
    for (int64_t h = 0; h < H; ++h) {
      slopes.push_back(h < p2 ? std::exp2(static_cast<float>((h + 1) * 2) * neg4)
                              : std::exp2(static_cast<float>(2 * (h - p2) + 1) * neg4));
    }
  }
  Tensor out;
  if (out_arg) {
    out = *out_arg;
    api::check_defined(out, kFmhaV2PrefillOp, "out");
    api::check_shape_eq(out, Shape{rows, H, dv}, kFmhaV2PrefillOp, "out");
    FLASHINFER_CHECK(out.stride(2) == 1 || dv <= 1, kFmhaV2PrefillOp, "out",
                     "the head_dim axis must be contiguous");
    api::check_same_device(out, q, kFmhaV2PrefillOp, "out", "qkv");
    api::check_writable(out, kFmhaV2PrefillOp, "out");
    for (const Tensor& x : t) api::check_no_overlap(out, x, kFmhaV2PrefillOp, "out", "qkv");
  } else {
    out = Tensor::empty({rows, H, dv}, od, q.device());
  }
  Tensor stats;
  if (save_softmax_stats) stats = Tensor::empty({rows, H, 2}, DType::kFloat32, q.device());
  if (rows > 0 && H > 0) {
    kernels::FmhaV2PrefillParams p;
    p.q = q.data_ptr();
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    p.dtype = qd;
    p.q_stride_n = q.stride(0);
    p.q_stride_h = q.stride(1);
    if (paged) {
      p.k_stride_page = k.stride(0);
      p.k_stride_n = k.stride(1);
      p.k_stride_h = k.stride(2);
      p.v_stride_page = v.stride(0);
      p.v_stride_n = v.stride(1);
      p.v_stride_h = v.stride(2);
      p.block_tables = table.data();
      p.bt_stride = bt_stride;
      p.page_size = static_cast<int32_t>(page_size);
    } else {
      p.k_stride_n = k.stride(0);
      p.k_stride_h = k.stride(1);
      p.v_stride_n = v.stride(0);
      p.v_stride_h = v.stride(1);
      p.cu_kv = cu_kv.data();
    }
    p.cu_q = cu_q.data();
    p.kv_lens = kv_lens.data();
    p.o = out.data_ptr();
    p.o_dtype = od;
    p.o_stride_n = out.stride(0);
    p.o_stride_h = out.stride(1);
    if (sinks_h.defined()) p.sinks = sinks_h.data<float>();
    if (alibi) p.alibi_slopes = slopes.data();
    if (stats.defined()) {
      p.stats = stats.data<float>();
      p.stats_stride_n = stats.stride(0);
      p.stats_stride_h = stats.stride(1);
    }
    p.batch = static_cast<int32_t>(batch_size);
    p.rows = static_cast<int32_t>(rows);
    p.num_qo_heads = static_cast<int32_t>(H);
    p.num_kv_heads = static_cast<int32_t>(hkv);
    p.head_dim_qk = static_cast<int32_t>(D);
    p.head_dim_vo = static_cast<int32_t>(dv);
    p.causal = mode != "padding";
    p.window_left = window_left;
    p.chunk = chunked_attention_size;
    p.bmm1_scale = static_cast<float>(bmm1_scale);
    p.bmm2_scale = static_cast<float>(bmm2_scale);
    p.soft_cap = static_cast<float>(cap);
    if (workspace_buffer.device() == q.device() && workspace_buffer.is_contiguous()) {
      p.workspace = workspace_buffer.data_ptr();
      p.workspace_bytes = static_cast<int64_t>(workspace_buffer.nbytes());
    }
#if FLASHINFER_WITH_CUDA
    if (device_plan) {
      FmhaV2DeviceLengths in;
      in.seq_lens = &seq_lens;
      in.cu_q = cum_seq_lens_q.contiguous();
      if (paged) {
        in.table = *block_tables;
        in.num_pages = num_pages;
      } else {
        in.cu_kv = cum_seq_lens_kv.contiguous();
        in.kv_rows = k.size(0);
      }
      if (sinks_d.defined()) in.sinks = sinks_d.data<const float>();
      in.max_q_len = max_q_len;
      in.max_kv_len = max_kv_len;
      fmha_v2_prefill_planned_on_device(p, q.device(), in);
    } else
#endif
    {
      api::launch(kFmhaV2PrefillKernels, p, q.device(), kFmhaV2PrefillOp, "qkv", std::nullopt);
    }
  } else if (stats.defined()) {
    stats.fill_(0.0);
  }
  AttentionOutput r;
  r.out = out;
  if (save_softmax_stats) r.lse = stats;
  return r;
}

// flashinfer bench: Q_PAGED_KV_HND (SGLang's layout), batch_size requests of s_qo queries over
// s_kv keys in pages of page_size, causal.
BenchCase bench_fmha_v2_prefill(const BenchShape& s, Device dev) {
  const DType qd = s.q_dtype == DType::kFloat32 ? DType::kBFloat16 : s.q_dtype;
  const int64_t B = s.batch_size, Sq = s.s_qo, Skv = std::max(s.s_kv, s.s_qo);
  const int64_t H = s.num_qo_heads, Hkv = s.num_kv_heads, D = s.head_dim_qk;
  const int64_t ps = s.page_size, per = (Skv + ps - 1) / ps;
  const Tensor q = api::bench::random_tensor({B * Sq, H, D}, qd, dev, s.random_seed);
  const Tensor kv = api::bench::random_tensor({B * per, 2, Hkv, ps, D}, qd, dev, s.random_seed + 1);
  std::vector<int64_t> table, lens, cu_q, cu_kv;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t p = 0; p < per; ++p) table.push_back(b * per + p);
    lens.push_back(Skv);
  }
  for (int64_t b = 0; b <= B; ++b) {
    cu_q.push_back(b * Sq);
    cu_kv.push_back(b * Skv);
  }
  Tensor bt = api::bench::int32_tensor(table, dev).reshape({B, per});
  // Upstream's benchmarks pass 128 MiB; on CUDA the split-KV partials live there.
  const Tensor ws = Tensor::zeros({dev.is_cuda() ? int64_t{128} << 20 : 1024}, DType::kUInt8, dev);
  BenchCase c = api::bench::invoke_case(
      kFmhaV2PrefillOp,
      {Value::tuple({Value(q), Value(kv)}), Value(std::string("Q_PAGED_KV_HND")), Value(ws),
       Value(api::bench::int32_tensor(lens, dev)), Value(Sq), Value(Skv),
       Value(1.0 / std::sqrt(static_cast<double>(D))), Value(1.0), Value(B),
       Value(api::bench::int32_tensor(cu_q, dev)), Value(api::bench::int32_tensor(cu_kv, dev))},
      {{"block_tables", Value(bt)}, {"mask_mode", Value(std::string("causal"))}});
  c.flops = static_cast<double>(B) * api::bench::attention_flops(Sq, Skv, H, D, D, true);
  c.bytes =
      api::bench::nbytes({B * Sq, H, 2 * D}, qd) + api::bench::nbytes({B * Skv, Hkv, 2 * D}, qd);
  return c;
}

}  // namespace

AttentionOutput trtllm_fmha_v2_prefill(
    const FmhaV2Qkv& qkv, std::string_view input_layout, const Tensor& workspace_buffer,
    const Tensor& seq_lens, int64_t max_q_len, int64_t max_kv_len, double bmm1_scale,
    double bmm2_scale, int64_t batch_size, const Tensor& cum_seq_lens_q,
    const Tensor& cum_seq_lens_kv, std::optional<Tensor> block_tables, std::optional<Tensor> out,
    std::optional<DType> out_dtype, std::optional<Tensor> sinks,
    std::optional<std::string> pos_encoding_mode, std::optional<double> logits_soft_cap_scale,
    std::string_view mask_mode, int64_t window_left, int64_t chunked_attention_size,
    bool save_softmax_stats, double skip_softmax_threshold_scale_factor) {
  return call_op<&trtllm_fmha_v2_prefill>(
      [&] {
        return fmha_v2_prefill_impl(
            qkv, input_layout, workspace_buffer, seq_lens, max_q_len, max_kv_len, bmm1_scale,
            bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv, block_tables, out, out_dtype,
            sinks, pos_encoding_mode, logits_soft_cap_scale, mask_mode, window_left,
            chunked_attention_size, save_softmax_stats, skip_softmax_threshold_scale_factor);
      },
      qkv, input_layout, workspace_buffer, seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale,
      batch_size, cum_seq_lens_q, cum_seq_lens_kv, block_tables, out, out_dtype, sinks,
      pos_encoding_mode, logits_soft_cap_scale, mask_mode, window_left, chunked_attention_size,
      save_softmax_stats, skip_softmax_threshold_scale_factor);
}

namespace detail {
void register_fmha_v2_prefill_ops(OpRegistry& r) {
  declare<&trtllm_fmha_v2_prefill>(
      r,
      {.name = kFmhaV2PrefillOp,
       .module = "flashinfer.prefill",
       .summary = "TRT-LLM FMHAv2 prefill: packed/contiguous/separate/paged inputs, mask modes, "
                  "soft cap, sinks, ALiBi, softmax statistics, e4m3 output (CPU only)"},
      "qkv", "input_layout", "workspace_buffer", "seq_lens", "max_q_len", "max_kv_len",
      "bmm1_scale", "bmm2_scale", "batch_size", "cum_seq_lens_q", "cum_seq_lens_kv", "block_tables",
      arg("out").mut(), "out_dtype", "sinks", "pos_encoding_mode", "logits_soft_cap_scale",
      arg("mask_mode", "causal"), arg("window_left", -1), arg("chunked_attention_size", 0),
      arg("save_softmax_stats", false), arg("skip_softmax_threshold_scale_factor", 0));
  api::register_backends(kFmhaV2PrefillOp, kFmhaV2PrefillKernels);
  register_bench_hook(kFmhaV2PrefillOp, bench_fmha_v2_prefill);
}
}  // namespace detail

}  // namespace flashinfer
