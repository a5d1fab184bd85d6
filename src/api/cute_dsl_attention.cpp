// flashinfer.cute_dsl.attention.wrappers (batch_decode, batch_prefill, batch_mla): upstream's
// CuTe-DSL attention wrappers with their checks, split / reduction rules and texts, run by the
// task-scheduled attention's CPU reference (kernels/prims_ts_params.h describes every layout),
// upstream's Blackwell-only kernels refused elsewhere on CUDA (docs/ATTENTION.md, "CuTe-DSL
// attention wrappers").
#include "flashinfer/ops/cute_dsl_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "core/cuda_runtime.h"
#include "kernels/cpu/prims_ts_cpu.h"
#include "kernels/prims_ts_params.h"

namespace flashinfer {

struct CuteDslPlan {
  bool planned = false;
  Tensor workspace;
  // Decode.
  int64_t batch = 0, Hq = 0, Hkv = 0, D = 0, q_len = 1, page_size = 1, kv_splits = 1;
  std::string reduction = "none";
  DType q_dtype = DType::kBFloat16, o_dtype = DType::kBFloat16;
  int64_t window_left = -1, window_right = 0;
  std::optional<double> sm_scale;
  std::vector<int64_t> seq_lens, table_offsets, pages;
  // Prefill.
  bool paged = false, hnd = false, causal = true;
  std::vector<int64_t> qo_indptr, kv_len, page_indptr;
  int64_t total_q = 0, total_kv = 0;
  DType kv_dtype = DType::kFloat16;
  // MLA.
  int64_t num_heads = 128;
  bool var_seq = true;
};

namespace {

using kernels::TsAttentionParams;

constexpr const char* kDecodeMod = "flashinfer.cute_dsl.attention.wrappers.batch_decode";
constexpr const char* kPrefillMod = "flashinfer.cute_dsl.attention.wrappers.batch_prefill";
constexpr const char* kMlaMod = "flashinfer.cute_dsl.attention.wrappers.batch_mla";

constexpr api::KernelEntry<TsAttentionParams> kCuteAttnKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: each query's softmax over its window's keys (sinks, base-2 LSE), fp32",
     nullptr,
     [](const TsAttentionParams& p, const api::LaunchContext&) {
       kernels::cpu::prims_ts_attention(p);
     }},
};

std::string tn(DType d) { return std::string(dtype_torch_name(d)); }

// A plan refuses by its class's run rule: the runs carry the rules (and the cases).
void check_arch(const char* op, const char* arg, Device dev) {
  const std::string_view o(op);
  const std::string rule =
      o.ends_with(".plan") ? std::string(o.substr(0, o.find('.'))) + ".run" : std::string(o);
  api::check_upstream_arch_as(rule.c_str(), op, arg, dev);
}

std::vector<int64_t> ints(const Tensor& t, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK(t.dim() == 1 && (t.dtype() == DType::kInt32 || t.dtype() == DType::kInt64), op,
                   arg, arg, " must be a 1-D int32 tensor");
  return api::host_ints(t);
}

// Upstream sizes splits from the device's SMs; an unknown count (0) is the B200's 148, which the
// CPU takes too.
int64_t sm_count(Device dev) {
#if FLASHINFER_WITH_CUDA
  if (dev.is_cuda()) return detail::cuda_sm_count(dev.index);
#endif
  (void)dev;
  return 148;
}

int64_t next_pow2(int64_t x) {
  return x <= 1 ? 1 : int64_t{1} << (64 - std::countl_zero(static_cast<uint64_t>(x - 1)));
}

// The decode plan's checks, window resolution, split and reduction (upstream's _plan_impl).
void decode_plan(CuteDslPlan& s, int64_t batch, int64_t max_kv_len, int64_t Hq, int64_t Hkv,
                 int64_t D, DType q, std::optional<DType> kv, std::optional<DType> o,
                 std::optional<double> sm_scale, std::optional<int64_t> kv_splits,
                 const std::string& reduction, int64_t q_len, std::optional<int64_t> wl,
                 std::optional<int64_t> wr, std::optional<bool> is_causal, Device dev,
                 const char* cls, const char* op) {
  FLASHINFER_CHECK_CODE(!kv || *kv == q, ErrorCode::kUnsupported, op, "kv_data_type",
                        "cute-dsl decode requires kv_data_type == q_data_type");
  FLASHINFER_CHECK(Hkv > 0 && Hq > 0 && Hq % Hkv == 0, op, "num_qo_heads", "num_qo_heads (", Hq,
                   ") must be a multiple of num_kv_heads (", Hkv, ")");
  FLASHINFER_CHECK(D > 0 && D % 64 == 0, op, "head_dim", "head_dim (", D,
                   ") must be a positive multiple of 64");
  const DType od = o.value_or(q);
  for (const auto& [d, arg] :
       {std::pair<DType, const char*>{q, "q_data_type"}, {od, "o_data_type"}}) {
    FLASHINFER_CHECK(d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kFloat8E5M2 ||
                         d == DType::kFloat8E4M3FN,
                     op, arg, "cute-dsl decode does not support ", tn(d),
                     "; supported: [torch.float16, torch.bfloat16, torch.float8_e5m2, "
                     "torch.float8_e4m3fn]");
  }
  FLASHINFER_CHECK(q_len >= 1, op, "q_len_per_req", "q_len_per_req must be positive");
  FLASHINFER_CHECK(batch >= 1, op, "batch_size", "batch_size must be positive");
  if (is_causal) {
    FLASHINFER_CHECK(!wl && (!wr || *wr == 0), op, "is_causal", cls,
                     ".plan() got deprecated `is_causal` together with explicit window arguments "
                     "[window_left, window_right]; use `window_left` and `window_right` only");
    wl = std::nullopt;
    wr = *is_causal ? std::optional<int64_t>(0) : std::nullopt;
  }
  FLASHINFER_CHECK(!wl || *wl >= 0, op, "window_left", "window_left must be None or >= 0");
  FLASHINFER_CHECK(!wr || *wr >= 0, op, "window_right", "window_right must be None or >= 0");
  FLASHINFER_CHECK(
      reduction == "auto" || reduction == "none" || reduction == "atomic" || reduction == "kernel",
      op, "reduction", "reduction must be 'auto', 'none', 'atomic' or 'kernel', got '", reduction,
      "'");
  // kv_splits: upstream's _compute_kv_splits when not given.
  int64_t ks = kv_splits.value_or(0);
  if (ks <= 0) {
    if (reduction == "none") {
      ks = 1;
    } else {
      int64_t ght = std::min<int64_t>(32, next_pow2(Hq / Hkv));
      int64_t pt = std::min<int64_t>(32 / ght, next_pow2(q_len));
      if ((q == DType::kFloat8E4M3FN || q == DType::kFloat8E5M2) && ght == 1 && pt == 1) ght = 2;
      const int64_t grid_yz = batch * Hkv * ((Hq / Hkv + ght - 1) / ght) * ((q_len + pt - 1) / pt);
      const int64_t sms = sm_count(dev);
      ks = std::max<int64_t>(1, sms / grid_yz);
      if (sms == 148 && grid_yz == 32) ks = 9;
      ks = std::min(ks, std::max<int64_t>(1, (max_kv_len + 255) / 256));
      if (reduction == "atomic" && ks != 1 && ks != 2 && ks != 4) ks = 8;
    }
  }
  std::string red = reduction;
  const bool atomic_dtype =
      od == DType::kFloat32 || od == DType::kFloat16 || od == DType::kBFloat16;
  if (red == "auto") {
    red = ks == 1                                             ? "none"
          : (atomic_dtype && (ks == 2 || ks == 4 || ks == 8)) ? "atomic"
                                                              : "kernel";
  }
  if (red == "atomic") {
    FLASHINFER_CHECK(ks == 1 || ks == 2 || ks == 4 || ks == 8 || ks == 16, op, "kv_splits",
                     "atomic reduction requires kv_splits \u2208 {1,2,4,8,16}, got ", ks);
    FLASHINFER_CHECK(atomic_dtype, op, "o_data_type",
                     "atomic reduction requires output dtype in (float32, float16, bfloat16); "
                     "got ",
                     tn(od));
  }
  FLASHINFER_CHECK(red != "none" || ks == 1, op, "kv_splits",
                   "reduction=\"none\" requires kv_splits == 1, got ", ks);
  s.batch = batch, s.Hq = Hq, s.Hkv = Hkv, s.D = D, s.q_len = q_len, s.kv_splits = ks;
  s.reduction = red, s.q_dtype = q, s.o_dtype = od, s.sm_scale = sm_scale;
  s.window_left = wl.value_or(-1), s.window_right = wr.value_or(-1);
}

// The "kernel" reduction's fp32 partials: o [splits, b, q_len, H, D], l and m [splits, b, q_len,
// H], the maximum [b, q_len, H].
void check_workspace(const CuteDslPlan& s, int64_t b, int64_t q_len, const char* op) {
  if (s.reduction != "kernel") return;
  const int64_t rows = b * q_len * s.Hq;
  const int64_t need = (s.kv_splits * rows * s.D + 2 * s.kv_splits * rows + rows) * 4;
  const int64_t have = s.workspace.nbytes();
  if (need > have) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "float_workspace_buffer",
                    "kernel reduction with kv_splits=", s.kv_splits, " batch_size=", b,
                    " q_len_per_req=", q_len, " num_qo_heads=", s.Hq, " head_dim=", s.D,
                    " requires ", need, " byte workspace which exceeds provided workspace of ",
                    have, " bytes");
  }
}

// sinks [Hq] fp32 on q's device, contiguous.
const float* sinks_of(const std::optional<Tensor>& sinks, const Tensor& q, int64_t Hq,
                      const char* op) {
  if (!sinks || !sinks->defined()) return nullptr;
  const Tensor& t = *sinks;
  FLASHINFER_CHECK(t.dim() == 1 && t.size(0) == Hq, op, "sinks",
                   "sinks tensor must have shape (num_qo_heads,) = (", Hq, ",), got shape ",
                   shape_to_string(t.shape()));
  FLASHINFER_CHECK(t.dtype() == DType::kFloat32, op, "sinks", "sinks must be float32, got ",
                   tn(t.dtype()));
  FLASHINFER_CHECK(t.device() == q.device(), op, "sinks", "sinks must be on device ",
                   q.device().str(), ", got ", t.device().str());
  FLASHINFER_CHECK(t.is_contiguous(), op, "sinks", "sinks tensor must be contiguous");
  return t.data<float>();
}

// Runs the reference with q rows contiguous [rows, Hq, D] (a copy where q is a view) and the
// output written through a contiguous buffer copied into `out` where that is a view.
void run_ref(TsAttentionParams& p, const Tensor& q, Tensor& o, const char* op) {
  const Tensor qc = q.contiguous();
  Tensor oc = o.is_contiguous() ? o : Tensor::empty(o.shape(), o.dtype(), o.device());
  p.q = qc.data_ptr(), p.q_head_stride = qc.size(-1), p.q_row_stride = qc.size(-1) * qc.size(-2);
  p.o = oc.data_ptr(), p.o_head_stride = oc.size(-1), p.o_row_stride = oc.size(-1) * oc.size(-2);
  check_arch(op, "q", q.device());
  api::launch(kCuteAttnKernels, p, q.device(), op, "q");
  if (!o.is_contiguous()) o.copy_(oc);
}

void set_requests(TsAttentionParams& p, const std::vector<int64_t>& q0,
                  const std::vector<int64_t>& ql, const std::vector<int64_t>& kv,
                  const std::vector<int64_t>& page_indptr, const std::vector<int64_t>& pages,
                  int64_t page_size) {
  p.batch = static_cast<int64_t>(ql.size());
  p.q_row0 = q0.data(), p.q_len = ql.data(), p.kv_len = kv.data();
  p.page_indptr = page_indptr.data(), p.pages = pages.data(), p.page_size = page_size;
}

// The decode run shared by both wrappers: q [b, q_len, Hq, D] rows, K / V as pages.
Tensor decode_run(CuteDslPlan& s, const Tensor& q4, const Tensor& k, const Tensor& v,
                  int64_t page_size, const std::vector<int64_t>& page_indptr,
                  const std::vector<int64_t>& pages, const std::vector<int64_t>& kv_len,
                  std::optional<Tensor> out, std::optional<double> sm_scale,
                  std::optional<double> o_scale, const std::optional<Tensor>& sinks,
                  std::optional<Tensor> lse, const Shape& out_shape, const char* op) {
  const int64_t b = q4.size(0), ql = q4.size(1);
  check_workspace(s, b, ql, op);
  Tensor o;
  if (out && out->defined()) {
    o = *out;
    api::check_shape_eq(o, out_shape, op, "out");
    FLASHINFER_CHECK(o.dtype() == s.o_dtype, op, "out", "out must have dtype ", tn(s.o_dtype));
    api::check_same_device(o, q4, op, "out", "q");
  } else {
    o = Tensor::empty(out_shape, s.o_dtype, q4.device());
  }
  TsAttentionParams p;
  p.num_qo_heads = s.Hq, p.num_kv_heads = s.Hkv, p.head_dim_qk = p.head_dim_vo = s.D;
  p.q_dtype = s.q_dtype, p.kv_dtype = k.dtype(), p.o_dtype = s.o_dtype;
  p.k = k.data_ptr(), p.v = v.data_ptr();
  p.k_page_stride = k.stride(0), p.k_slot_stride = k.stride(1), p.k_head_stride = k.stride(2);
  p.v_page_stride = v.stride(0), p.v_slot_stride = v.stride(1), p.v_head_stride = v.stride(2);
  std::vector<int64_t> q0(static_cast<size_t>(b)), qlv(static_cast<size_t>(b), ql);
  for (int64_t i = 0; i < b; ++i) q0[i] = i * ql;
  set_requests(p, q0, qlv, kv_len, page_indptr, pages, page_size);
  p.window_left = s.window_left, p.window_right = s.window_right;
  const double scale = sm_scale.value_or(s.sm_scale.value_or(1.0 / std::sqrt(double(s.D))));
  p.bmm1_scale = static_cast<float>(scale);
  p.bmm2_scale = static_cast<float>(o_scale.value_or(1.0));
  p.sinks = sinks_of(sinks, q4, s.Hq, op);
  if (lse && lse->defined()) {
    FLASHINFER_CHECK(lse->dtype() == DType::kFloat32, op, "lse",
                     "lse must be float32 (LSE is log2-base); got ", tn(lse->dtype()));
    api::check_same_device(*lse, q4, op, "lse", "q");
    FLASHINFER_CHECK(lse->numel() == b * ql * s.Hq && lse->is_contiguous(), op, "lse", "lse shape ",
                     shape_to_string(lse->shape()), " must equal (b, s_q, h_q)");
    p.lse = lse->data<float>(), p.lse_row_stride = s.Hq, p.lse_head_stride = 1, p.lse_log2 = true;
  }
  run_ref(p, q4, o, op);
  return o;
}

}  // namespace

// ---- BatchDecodeCuteDSLWrapper -----------------------------------------------------------------

using CuteDecodeInit = Init<BatchDecodeCuteDSLWrapper, Tensor, bool>;

BatchDecodeCuteDSLWrapper::BatchDecodeCuteDSLWrapper(Tensor float_workspace_buffer,
                                                     bool use_cuda_graph)
    : s_(std::make_unique<CuteDslPlan>()) {
  call_init<CuteDecodeInit>(
      [&] {
        api::check_defined(float_workspace_buffer, "BatchDecodeCuteDSLWrapper.__init__",
                           "float_workspace_buffer");
        s_->workspace = float_workspace_buffer;
      },
      *this, float_workspace_buffer, use_cuda_graph);
}
BatchDecodeCuteDSLWrapper::~BatchDecodeCuteDSLWrapper() = default;
int64_t BatchDecodeCuteDSLWrapper::kv_splits() const { return s_->kv_splits; }
std::string BatchDecodeCuteDSLWrapper::reduction() const { return s_->reduction; }

void BatchDecodeCuteDSLWrapper::plan(int64_t batch_size, int64_t max_kv_len, int64_t num_qo_heads,
                                     int64_t num_kv_heads, int64_t head_dim,
                                     const CuteDslDecodePlanOptions& o) {
  call_op<&BatchDecodeCuteDSLWrapper::plan>(
      [&] {
        const char* op = "BatchDecodeCuteDSLWrapper.plan";
        CuteDslPlan s;
        s.workspace = s_->workspace;
        decode_plan(s, batch_size, max_kv_len, num_qo_heads, num_kv_heads, head_dim, o.q_data_type,
                    o.kv_data_type, o.o_data_type, o.sm_scale, o.kv_splits, o.reduction,
                    o.q_len_per_req, o.window_left, o.window_right, o.is_causal,
                    s.workspace.device(), "BatchDecodeCuteDSLWrapper", op);
        check_workspace(s, batch_size, o.q_len_per_req, op);
        check_arch(op, "float_workspace_buffer", s.workspace.device());
        s.planned = true;
        *s_ = std::move(s);
      },
      *this, batch_size, max_kv_len, num_qo_heads, num_kv_heads, head_dim, o);
}

Tensor BatchDecodeCuteDSLWrapper::run(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const CuteDslDecodeRunOptions& o) {
  return call_op<&BatchDecodeCuteDSLWrapper::run>(
      [&] {
        const char* op = "BatchDecodeCuteDSLWrapper.run";
        CuteDslPlan& s = *s_;
        FLASHINFER_CHECK_CODE(s.planned, ErrorCode::kInvalidArgument, op, "self",
                              "Call plan() before run().");
        for (const auto& [t, n] :
             {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}, {v, "v"}}) {
          api::check_defined(t, op, n);
        }
        FLASHINFER_CHECK(q.dtype() == s.q_dtype && k.dtype() == s.q_dtype && v.dtype() == s.q_dtype,
                         op, "q", "q/k/v dtype mismatch: expected ", tn(s.q_dtype),
                         ", got q=", tn(q.dtype()), ", k=", tn(k.dtype()), ", v=", tn(v.dtype()));
        FLASHINFER_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, "q",
                         "q/k/v must be 4D [b, s, h, d]; got shapes ", shape_to_string(q.shape()),
                         ", ", shape_to_string(k.shape()), ", ", shape_to_string(v.shape()));
        FLASHINFER_CHECK(q.size(2) == s.Hq && q.size(3) == s.D && k.size(0) == q.size(0) &&
                             k.size(2) == s.Hkv && k.size(3) == s.D,
                         op, "q", "q/k/v shape mismatch with plan: q=", shape_to_string(q.shape()),
                         ", k=", shape_to_string(k.shape()), ", v=", shape_to_string(v.shape()),
                         "; expected q=[b,*,", s.Hq, ",", s.D, "], k=[b,*,", s.Hkv, ",", s.D, "]");
        FLASHINFER_CHECK(k.shape() == v.shape(), op, "v", "k.shape=", shape_to_string(k.shape()),
                         " must equal v.shape=", shape_to_string(v.shape()));
        FLASHINFER_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, op, "q",
                         "head_dim must be the innermost (contiguous) dimension");
        api::check_same_device(k, q, op, "k", "q");
        api::check_same_device(v, q, op, "v", "q");
        const int64_t b = q.size(0), skv = k.size(1);
        FLASHINFER_CHECK(skv >= 1, op, "k", "k must hold at least one key");
        // Every request is one page of s_kv tokens.
        std::vector<int64_t> ip(static_cast<size_t>(b + 1)), pages(static_cast<size_t>(b)),
            kv(static_cast<size_t>(b), skv);
        for (int64_t i = 0; i <= b; ++i) ip[i] = i;
        for (int64_t i = 0; i < b; ++i) pages[i] = i;
        return decode_run(s, q, k, v, skv, ip, pages, kv, o.out, o.sm_scale, o.o_scale, o.sinks,
                          o.lse, q.shape(), op);
      },
      *this, q, k, v, o);
}

// ---- BatchDecodePagedCuteDSLWrapper ------------------------------------------------------------

using CutePagedDecodeInit = Init<BatchDecodePagedCuteDSLWrapper, Tensor, bool>;

BatchDecodePagedCuteDSLWrapper::BatchDecodePagedCuteDSLWrapper(Tensor float_workspace_buffer,
                                                               bool use_cuda_graph)
    : s_(std::make_unique<CuteDslPlan>()) {
  call_init<CutePagedDecodeInit>(
      [&] {
        api::check_defined(float_workspace_buffer, "BatchDecodePagedCuteDSLWrapper.__init__",
                           "float_workspace_buffer");
        s_->workspace = float_workspace_buffer;
      },
      *this, float_workspace_buffer, use_cuda_graph);
}
BatchDecodePagedCuteDSLWrapper::~BatchDecodePagedCuteDSLWrapper() = default;

void BatchDecodePagedCuteDSLWrapper::plan(const Tensor& indptr, const Tensor& indices,
                                          const Tensor& seq_lens, int64_t num_qo_heads,
                                          int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
                                          const CuteDslPagedDecodePlanOptions& o) {
  call_op<&BatchDecodePagedCuteDSLWrapper::plan>(
      [&] {
        const char* op = "BatchDecodePagedCuteDSLWrapper.plan";
        FLASHINFER_CHECK(page_size == 8 || page_size == 16 || page_size == 32 || page_size == 64,
                         op, "page_size",
                         "cute-dsl paged decode supports page_size \u2208 {8,16,32,64}, got ",
                         page_size);
        CuteDslPlan s;
        s.workspace = s_->workspace;
        s.seq_lens = ints(seq_lens, op, "seq_lens");
        const auto B = static_cast<int64_t>(s.seq_lens.size());
        FLASHINFER_CHECK(B >= 1, op, "seq_lens", "seq_lens must hold at least one request");
        int64_t longest = 0;
        for (int64_t l : s.seq_lens) {
          FLASHINFER_CHECK(l >= 1, op, "seq_lens", "every seq_lens entry must be positive, got ",
                           l);
          longest = std::max(longest, l);
        }
        // Upstream reads the longest length back only from CPU seq_lens (no sync for device ones:
        // their bound is 2^31 - 1, which only moves the split choice).
        const int64_t max_kv = o.max_kv_len.value_or(
            seq_lens.device().is_cpu() ? longest : int64_t{std::numeric_limits<int32_t>::max()});
        FLASHINFER_CHECK(longest <= max_kv, op, "max_kv_len", "max_kv_len (", max_kv,
                         ") is below the longest seq_lens entry (", longest, ")");
        decode_plan(s, B, max_kv, num_qo_heads, num_kv_heads, head_dim, o.q_data_type,
                    o.kv_data_type, o.o_data_type, o.sm_scale, o.kv_splits, o.reduction,
                    o.q_len_per_req, o.window_left, o.window_right, o.is_causal,
                    s.workspace.device(), "BatchDecodePagedCuteDSLWrapper", op);
        const auto ip = ints(indptr, op, "indptr");
        FLASHINFER_CHECK(static_cast<int64_t>(ip.size()) >= B, op, "indptr", "indptr length (",
                         ip.size(), ") must be at least batch_size (", B, ")");
        s.pages = ints(indices, op, "indices");
        s.table_offsets.assign(ip.begin(), ip.begin() + B);
        // Each request reads ceil(seq_len / page_size) ids from its offset (upstream trusts
        // them; the CPU checks what it would read).
        for (int64_t b = 0; b < B; ++b) {
          const int64_t need = (s.seq_lens[b] + page_size - 1) / page_size;
          FLASHINFER_CHECK(ip[b] >= 0 && ip[b] + need <= static_cast<int64_t>(s.pages.size()), op,
                           "indices", "request ", b, " needs ", need, " page ids from offset ",
                           ip[b], " but indices holds ", s.pages.size());
        }
        s.page_size = page_size;
        check_workspace(s, B, o.q_len_per_req, op);
        check_arch(op, "indptr", indptr.device());
        s.planned = true;
        *s_ = std::move(s);
      },
      *this, indptr, indices, seq_lens, num_qo_heads, num_kv_heads, head_dim, page_size, o);
}

Tensor BatchDecodePagedCuteDSLWrapper::run(const Tensor& q, const Tensor& k_cache,
                                           const Tensor& v_cache,
                                           const CuteDslPagedDecodeRunOptions& o) {
  return call_op<&BatchDecodePagedCuteDSLWrapper::run>(
      [&] {
        const char* op = "BatchDecodePagedCuteDSLWrapper.run";
        CuteDslPlan& s = *s_;
        FLASHINFER_CHECK(s.planned, op, "self", "Call plan() before run().");
        api::check_defined(q, op, "q");
        api::check_defined(k_cache, op, "k_cache");
        api::check_defined(v_cache, op, "v_cache");
        FLASHINFER_CHECK(q.dtype() == s.q_dtype, op, "q", "q.dtype=", tn(q.dtype()),
                         " mismatches planned ", tn(s.q_dtype));
        FLASHINFER_CHECK(k_cache.dtype() == q.dtype() && v_cache.dtype() == q.dtype(), op,
                         "k_cache", "k_cache/v_cache dtype must equal q.dtype=", tn(q.dtype()));
        FLASHINFER_CHECK(k_cache.shape() == v_cache.shape(), op, "v_cache",
                         "k_cache.shape=", shape_to_string(k_cache.shape()),
                         " must equal v_cache.shape=", shape_to_string(v_cache.shape()));
        FLASHINFER_CHECK(k_cache.dim() == 4, op, "k_cache",
                         "k_cache must be 4D [num_pages, page_size, num_kv_heads, head_dim]; got ",
                         shape_to_string(k_cache.shape()));
        FLASHINFER_CHECK(
            k_cache.size(1) == s.page_size && k_cache.size(2) == s.Hkv && k_cache.size(3) == s.D,
            op, "k_cache", "k_cache shape ", shape_to_string(k_cache.shape()),
            " mismatches plan: expected [*, ", s.page_size, ", ", s.Hkv, ", ", s.D, "]");
        FLASHINFER_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, op, "k_cache",
                         "head_dim must be the innermost (contiguous) dimension");
        api::check_same_device(k_cache, q, op, "k_cache", "q");
        api::check_same_device(v_cache, q, op, "v_cache", "q");
        Tensor q4;
        if (q.dim() == 3) {
          FLASHINFER_CHECK(q.size(0) % s.batch == 0, op, "q", "q.shape[0]=", q.size(0),
                           " not divisible by planned batch_size=", s.batch);
          q4 = q.contiguous().view({s.batch, q.size(0) / s.batch, q.size(1), q.size(2)});
        } else {
          FLASHINFER_CHECK(q.dim() == 4, op, "q", "q must be 3D or 4D; got ndim=", q.dim());
          FLASHINFER_CHECK(q.size(0) == s.batch, op, "q", "q.shape[0]=", q.size(0),
                           " mismatches planned batch_size=", s.batch);
          q4 = q;
        }
        FLASHINFER_CHECK(q4.size(2) == s.Hq && q4.size(3) == s.D, op, "q", "q shape ",
                         shape_to_string(q.shape()), " mismatches plan (num_qo_heads=", s.Hq,
                         ", head_dim=", s.D, ")");
        if (o.out && o.out->defined()) {
          FLASHINFER_CHECK(o.out->dim() == 3 || o.out->dim() == 4, op, "out",
                           "out must be 3D or 4D; got ndim=", o.out->dim());
        }
        if (o.skip_softmax_threshold_scale_factor) {
          FLASHINFER_CHECK(*o.skip_softmax_threshold_scale_factor > 0, op,
                           "skip_softmax_threshold_scale_factor",
                           "skip_softmax_threshold_scale_factor must be > 0; got ",
                           *o.skip_softmax_threshold_scale_factor);
        }
        const int64_t ql = q4.size(1);
        std::optional<Tensor> lse = o.lse;
        if (lse && lse->defined()) {
          const bool ok =
              lse->shape() == Shape{s.batch, ql, s.Hq} || lse->shape() == Shape{s.batch * ql, s.Hq};
          FLASHINFER_CHECK(ok, op, "lse", "lse shape ", shape_to_string(lse->shape()),
                           " doesn't match expected (B, Q, H) or its 3D-flat form");
        }
        for (int64_t b = 0; b < s.batch; ++b) {
          const int64_t need = (s.seq_lens[b] + s.page_size - 1) / s.page_size;
          for (int64_t j = 0; j < need; ++j) {
            const int64_t id = s.pages[s.table_offsets[b] + j];
            FLASHINFER_CHECK(id >= 0 && id < k_cache.size(0), op, "k_cache", "page id ", id,
                             " of request ", b, " is outside the cache's ", k_cache.size(0),
                             " pages");
          }
        }
        std::vector<int64_t> ip(s.table_offsets);
        ip.push_back(static_cast<int64_t>(s.pages.size()));
        Tensor out4 = o.out && o.out->defined() ? *o.out : Tensor();
        Tensor res =
            decode_run(s, q4, k_cache, v_cache, s.page_size, ip, s.pages, s.seq_lens,
                       o.out && o.out->defined()
                           ? std::optional<Tensor>(
                                 out4.dim() == 3 ? out4.view({s.batch, ql, s.Hq, s.D}) : out4)
                           : std::nullopt,
                       o.sm_scale, o.o_scale, o.sinks, lse, Shape{s.batch, ql, s.Hq, s.D}, op);
        if (out4.defined()) return out4;
        return q.dim() == 3 ? res.view(q.shape()) : res;
      },
      *this, q, k_cache, v_cache, o);
}

// ---- BatchPrefillCuteDSLWrapper ----------------------------------------------------------------

using CutePrefillInit = Init<BatchPrefillCuteDSLWrapper, Tensor, bool>;

BatchPrefillCuteDSLWrapper::BatchPrefillCuteDSLWrapper(Tensor float_workspace_buffer,
                                                       bool use_cuda_graph)
    : s_(std::make_unique<CuteDslPlan>()) {
  call_init<CutePrefillInit>(
      [&] {
        api::check_defined(float_workspace_buffer, "BatchPrefillCuteDSLWrapper.__init__",
                           "float_workspace_buffer");
        s_->workspace = float_workspace_buffer;
      },
      *this, float_workspace_buffer, use_cuda_graph);
}
BatchPrefillCuteDSLWrapper::~BatchPrefillCuteDSLWrapper() = default;

void BatchPrefillCuteDSLWrapper::plan(
    const Tensor& qo_indptr, std::optional<Tensor> kv_indptr, std::optional<int64_t> num_qo_heads,
    std::optional<int64_t> num_kv_heads, std::optional<int64_t> head_dim_qk,
    std::optional<int64_t> head_dim_vo, bool causal, std::optional<double> sm_scale,
    DType q_data_type, DType kv_data_type, int64_t window_left, std::optional<Value> variant,
    int64_t window_right, std::optional<int64_t> page_size, std::optional<Tensor> paged_kv_indptr,
    std::optional<Tensor> paged_kv_indices, std::optional<Tensor> paged_kv_last_page_len,
    std::string kv_layout) {
  call_op<&BatchPrefillCuteDSLWrapper::plan>(
      [&] {
        const char* op = "BatchPrefillCuteDSLWrapper.plan";
        FLASHINFER_CHECK(num_qo_heads && num_kv_heads && head_dim_qk, op,
                         !num_qo_heads   ? "num_qo_heads"
                         : !num_kv_heads ? "num_kv_heads"
                                         : "head_dim_qk",
                         "num_qo_heads, num_kv_heads and head_dim_qk are required");
        FLASHINFER_CHECK(kv_layout == "NHD" || kv_layout == "HND", op, "kv_layout",
                         "kv_layout must be 'NHD' or 'HND', got '", kv_layout, "'");
        FLASHINFER_CHECK_CODE(!variant || variant->is_none(), ErrorCode::kUnsupported, op,
                              "variant",
                              "attention variants (ALiBi, RPE, sigmoid, sinks, custom "
                              "AttentionVariant objects) are not implemented in flashinfer-cpp");
        CuteDslPlan s;
        s.workspace = s_->workspace;
        const int64_t Hq = *num_qo_heads, Hkv = *num_kv_heads, D = *head_dim_qk;
        FLASHINFER_CHECK(Hkv > 0 && Hq % Hkv == 0, op, "num_qo_heads",
                         "num_qo_heads must be divisible by num_kv_heads");
        FLASHINFER_CHECK(!head_dim_vo || *head_dim_vo == D, op, "head_dim_vo",
                         "head_dim_vo must be None or equal to head_dim_qk");
        FLASHINFER_CHECK(q_data_type == DType::kFloat16 || q_data_type == DType::kBFloat16 ||
                             q_data_type == DType::kFloat8E4M3FN,
                         op, "q_data_type", "Unsupported input data type: ", tn(q_data_type));
        const int64_t kgran = q_data_type == DType::kFloat8E4M3FN ? 32 : 16;
        FLASHINFER_CHECK(D > 0 && D % kgran == 0, op, "head_dim_qk", "head_dim=", D,
                         " must be a positive multiple of ", kgran,
                         " (MMA K-dimension granularity for ", dtype_size(q_data_type) * 8,
                         "-bit dtype)");
        FLASHINFER_CHECK(!(causal && window_right >= 0), op, "window_right",
                         "window_right is mutually exclusive with causal (causal already bounds "
                         "lookahead at 0)");
        const bool paged = page_size.has_value();
        if (paged) {
          FLASHINFER_CHECK(*page_size >= 8 && 128 % *page_size == 0, op, "page_size",
                           "page_size=", *page_size,
                           " must be >= 8 and divide the 128-token KV tile (8/16/32/64/128)");
          FLASHINFER_CHECK(paged_kv_indptr && paged_kv_indices && paged_kv_last_page_len, op,
                           "paged_kv_indptr",
                           "paged plan requires paged_kv_indptr, paged_kv_indices and "
                           "paged_kv_last_page_len");
          FLASHINFER_CHECK(!kv_indptr, op, "kv_indptr",
                           "pass either kv_indptr (ragged) or the paged_kv_* triple, not both");
        } else {
          FLASHINFER_CHECK(kv_indptr.has_value(), op, "kv_indptr",
                           "kv_indptr is required for a ragged plan");
          FLASHINFER_CHECK_CODE(kv_layout == "NHD", ErrorCode::kUnsupported, op, "kv_layout",
                                "HND layout is only supported with paged KV");
        }
        s.qo_indptr = ints(qo_indptr, op, "qo_indptr");
        FLASHINFER_CHECK(s.qo_indptr.size() >= 2 && s.qo_indptr[0] == 0, op, "qo_indptr",
                         "qo_indptr must start at 0 and hold batch_size + 1 entries");
        const auto B = static_cast<int64_t>(s.qo_indptr.size()) - 1;
        s.kv_len.resize(B);
        for (int64_t b = 0; b < B; ++b) {
          FLASHINFER_CHECK(s.qo_indptr[b + 1] >= s.qo_indptr[b], op, "qo_indptr",
                           "qo_indptr must be non-decreasing");
        }
        if (paged) {
          const auto ip = ints(*paged_kv_indptr, op, "paged_kv_indptr");
          const auto last = ints(*paged_kv_last_page_len, op, "paged_kv_last_page_len");
          s.pages = ints(*paged_kv_indices, op, "paged_kv_indices");
          FLASHINFER_CHECK(
              static_cast<int64_t>(ip.size()) == B + 1 && static_cast<int64_t>(last.size()) == B,
              op, "paged_kv_indptr", "paged_kv_indptr / last_page_len must describe ", B,
              " requests");
          for (int64_t b = 0; b < B; ++b) {
            FLASHINFER_CHECK(ip[b + 1] > ip[b] && ip[b] >= 0 &&
                                 ip[b + 1] <= static_cast<int64_t>(s.pages.size()),
                             op, "paged_kv_indptr", "request ", b,
                             "'s pages are outside paged_kv_indices");
            FLASHINFER_CHECK(last[b] >= 1 && last[b] <= *page_size, op, "paged_kv_last_page_len",
                             "paged_kv_last_page_len must lie in [1, page_size]");
            s.kv_len[b] = (ip[b + 1] - ip[b] - 1) * *page_size + last[b];
          }
          s.page_indptr = ip;
          s.page_size = *page_size;
        } else {
          const auto kv = ints(*kv_indptr, op, "kv_indptr");
          FLASHINFER_CHECK(static_cast<int64_t>(kv.size()) == B + 1 && kv[0] == 0, op, "kv_indptr",
                           "kv_indptr must start at 0 and hold batch_size + 1 entries");
          for (int64_t b = 0; b < B; ++b) s.kv_len[b] = kv[b + 1] - kv[b];
          s.page_indptr = kv;
          s.page_size = 1;
          s.total_kv = kv[B];
          s.pages.resize(static_cast<size_t>(s.total_kv));
          for (int64_t t = 0; t < s.total_kv; ++t) s.pages[t] = t;
        }
        for (int64_t b = 0; b < B; ++b) {
          FLASHINFER_CHECK(s.kv_len[b] >= 1, op, paged ? "paged_kv_indptr" : "kv_indptr",
                           "cute-dsl prefill requires kv_len >= 1 for every batch item; "
                           "zero-length KV items are not supported");
        }
        s.batch = B, s.Hq = Hq, s.Hkv = Hkv, s.D = D, s.paged = paged, s.hnd = kv_layout == "HND";
        s.causal = causal, s.window_left = window_left, s.window_right = window_right;
        s.sm_scale = sm_scale, s.q_dtype = q_data_type, s.kv_dtype = kv_data_type;
        s.o_dtype = q_data_type == DType::kFloat8E4M3FN ? DType::kFloat16 : q_data_type;
        s.total_q = s.qo_indptr[B];
        check_arch(op, "qo_indptr", qo_indptr.device());
        s.planned = true;
        *s_ = std::move(s);
      },
      *this, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, causal,
      sm_scale, q_data_type, kv_data_type, window_left, variant, window_right, page_size,
      paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, kv_layout);
}

namespace {

AttentionOutput prefill_run(const CuteDslPlan& s, const Tensor& q, const Tensor& k, const Tensor& v,
                            std::optional<Tensor> out, bool return_lse, std::optional<Tensor> lse,
                            const char* op) {
  FLASHINFER_CHECK(k.dim() >= 3 && v.dim() >= 3, op, "k",
                   "k and v must be [.., num_kv_heads, head_dim] tensors, got ",
                   shape_to_string(k.shape()));
  FLASHINFER_CHECK(q.dtype() == s.q_dtype, op, "q", "q.dtype=", tn(q.dtype()),
                   " does not match the planned q_data_type=", tn(s.q_dtype));
  FLASHINFER_CHECK(k.dtype() == s.q_dtype, op, "k", "k.dtype=", tn(k.dtype()),
                   " does not match the planned q_data_type=", tn(s.q_dtype));
  FLASHINFER_CHECK_CODE(v.dtype() == k.dtype(), ErrorCode::kUnsupported, op, "v",
                        "mixed K/V dtypes (V=", tn(v.dtype()), " with planned ", tn(k.dtype()),
                        ") are not implemented in flashinfer-cpp");
  FLASHINFER_CHECK(q.dim() == 3 && q.size(0) == s.total_q, op, "q", "q must be [", s.total_q,
                   ", num_qo_heads, head_dim], got ", shape_to_string(q.shape()));
  FLASHINFER_CHECK(q.size(-1) == s.D, op, "q", "q.shape[-1]=", q.size(-1),
                   " does not match the planned head_dim=", s.D);
  FLASHINFER_CHECK(q.size(-2) == s.Hq, op, "q", "q.shape[-2]=", q.size(-2),
                   " does not match the planned num_qo_heads=", s.Hq);
  FLASHINFER_CHECK(k.size(-2) == s.Hkv, op, "k", "k.shape[-2]=", k.size(-2),
                   " does not match the planned num_kv_heads=", s.Hkv);
  FLASHINFER_CHECK(k.size(-1) == s.D && v.shape() == k.shape(), op, "v",
                   "k and v must be [.., num_kv_heads, head_dim] of one shape");
  FLASHINFER_CHECK(k.stride(-1) == 1 && v.stride(-1) == 1, op, "k",
                   "k head_dim must be contiguous");
  api::check_same_device(k, q, op, "k", "q");
  api::check_same_device(v, q, op, "v", "q");
  Tensor o;
  if (out && out->defined()) {
    o = *out;
    api::check_shape_eq(o, q.shape(), op, "out");
    FLASHINFER_CHECK(o.dtype() == s.o_dtype, op, "out", "out must have dtype ", tn(s.o_dtype));
    FLASHINFER_CHECK(o.device() == q.device(), op, "out", "out.device=", o.device().str(),
                     " does not match the planned device=", q.device().str());
  } else {
    o = Tensor::empty(q.shape(), s.o_dtype, q.device());
  }
  TsAttentionParams p;
  p.num_qo_heads = s.Hq, p.num_kv_heads = s.Hkv, p.head_dim_qk = p.head_dim_vo = s.D;
  p.q_dtype = s.q_dtype, p.kv_dtype = k.dtype(), p.o_dtype = s.o_dtype;
  p.k = k.data_ptr(), p.v = v.data_ptr();
  if (s.paged) {  // [pages, page_size, Hkv, D] views
    p.k_page_stride = k.stride(0), p.k_slot_stride = k.stride(1), p.k_head_stride = k.stride(2);
    p.v_page_stride = v.stride(0), p.v_slot_stride = v.stride(1), p.v_head_stride = v.stride(2);
  } else {  // [total_kv, Hkv, D]: a page a token
    FLASHINFER_CHECK(k.dim() == 3 && k.size(0) == s.total_kv, op, "k", "k must be [", s.total_kv,
                     ", num_kv_heads, head_dim], got ", shape_to_string(k.shape()));
    p.k_page_stride = k.stride(0), p.k_head_stride = k.stride(1);
    p.v_page_stride = v.stride(0), p.v_head_stride = v.stride(1);
  }
  const auto B = static_cast<int64_t>(s.kv_len.size());
  std::vector<int64_t> q0(s.qo_indptr.begin(), s.qo_indptr.begin() + B), ql(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) ql[b] = s.qo_indptr[b + 1] - s.qo_indptr[b];
  set_requests(p, q0, ql, s.kv_len, s.page_indptr, s.pages, s.page_size);
  p.causal = s.causal, p.window_left = s.window_left,
  p.window_right = s.causal ? -1 : s.window_right;
  p.bmm1_scale = static_cast<float>(s.sm_scale.value_or(1.0 / std::sqrt(double(s.D))));
  Tensor l;
  if (return_lse) {
    if (lse && lse->defined()) {
      l = *lse;
      api::check_shape_eq(l, {s.total_q, s.Hq}, op, "lse");
      FLASHINFER_CHECK(l.dtype() == DType::kFloat32 && l.is_contiguous(), op, "lse",
                       "lse must be a contiguous float32 tensor");
      api::check_same_device(l, q, op, "lse", "q");
    } else {
      l = Tensor::empty({s.total_q, s.Hq}, DType::kFloat32, q.device());
    }
    p.lse = l.data<float>(), p.lse_row_stride = s.Hq, p.lse_head_stride = 1, p.lse_log2 = true;
  }
  run_ref(p, q, o, op);
  AttentionOutput r;
  r.out = o;
  if (return_lse) r.lse = l;
  return r;
}

}  // namespace

AttentionOutput BatchPrefillCuteDSLWrapper::run(const Tensor& q, const Tensor& k, const Tensor& v,
                                                std::optional<Tensor> out, bool return_lse,
                                                std::optional<Tensor> lse) {
  return call_op<&BatchPrefillCuteDSLWrapper::run>(
      [&] {
        const char* op = "BatchPrefillCuteDSLWrapper.run";
        FLASHINFER_CHECK(s_->planned, op, "self", "Plan the prefill attention computation first!");
        FLASHINFER_CHECK(!s_->paged, op, "self",
                         "this wrapper was planned for a paged KV cache; use run_paged()");
        for (const auto& [t, n] :
             {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}, {v, "v"}}) {
          api::check_defined(t, op, n);
        }
        return prefill_run(*s_, q, k, v, out, return_lse, lse, op);
      },
      *this, q, k, v, out, return_lse, lse);
}

AttentionOutput BatchPrefillCuteDSLWrapper::run_paged(const Tensor& q,
                                                      const PagedKVCache& paged_kv_cache,
                                                      std::optional<Tensor> out, bool return_lse,
                                                      std::optional<Tensor> lse) {
  return call_op<&BatchPrefillCuteDSLWrapper::run_paged>(
      [&] {
        const char* op = "BatchPrefillCuteDSLWrapper.run_paged";
        const CuteDslPlan& s = *s_;
        FLASHINFER_CHECK(s.planned, op, "self", "Plan the prefill attention computation first!");
        FLASHINFER_CHECK(s.paged, op, "self",
                         "this wrapper was planned for ragged KV; use run() or re-plan with "
                         "page_size + the paged_kv_* triple");
        api::check_defined(q, op, "q");
        const auto [k, v] = api::paged_cache_views(paged_kv_cache, s.hnd, op, "paged_kv_cache");
        FLASHINFER_CHECK(k.size(1) == s.page_size && k.size(2) == s.Hkv && k.size(3) == s.D, op,
                         "paged_kv_cache", "k_cache logical shape ", shape_to_string(k.shape()),
                         " mismatches plan (page_size=", s.page_size, ", num_kv_heads=", s.Hkv,
                         ", head_dim=", s.D, ")");
        for (int64_t id : s.pages) {
          FLASHINFER_CHECK(id >= 0 && id < k.size(0), op, "paged_kv_cache", "page id ", id,
                           " is outside the cache's ", k.size(0), " pages");
        }
        return prefill_run(s, q, k, v, out, return_lse, lse, op);
      },
      *this, q, paged_kv_cache, out, return_lse, lse);
}

// ---- BatchMLADecodeCuteDSLWrapper --------------------------------------------------------------

using CuteMlaInit = Init<BatchMLADecodeCuteDSLWrapper, Tensor>;

BatchMLADecodeCuteDSLWrapper::BatchMLADecodeCuteDSLWrapper(Tensor workspace_buffer)
    : s_(std::make_unique<CuteDslPlan>()) {
  call_init<CuteMlaInit>(
      [&] {
        const char* op = "BatchMLADecodeCuteDSLWrapper.__init__";
        api::check_defined(workspace_buffer, op, "workspace_buffer");
        FLASHINFER_CHECK(workspace_buffer.dtype() == DType::kInt8, op, "workspace_buffer",
                         "workspace_buffer must be torch.int8, got ", tn(workspace_buffer.dtype()));
        s_->workspace = workspace_buffer;
      },
      *this, workspace_buffer);
}
BatchMLADecodeCuteDSLWrapper::~BatchMLADecodeCuteDSLWrapper() = default;

namespace {

constexpr int64_t kMlaL = 512, kMlaR = 64, kMlaW = kMlaL + kMlaR;

bool mla_can_implement(int64_t L, int64_t R, DType in, DType out, int64_t page_size, int64_t H,
                       int64_t q_len, int64_t split_kv) {
  const bool f16 = (in == DType::kFloat16 || in == DType::kBFloat16) &&
                   (out == DType::kFloat16 || out == DType::kBFloat16);
  const bool f8 =
      in == DType::kFloat8E4M3FN && (out == DType::kFloat8E4M3FN || out == DType::kBFloat16);
  return L == kMlaL && R == kMlaR && (f16 || f8) && page_size != 1 && page_size > 0 &&
         128 % page_size == 0 && H >= 1 && H <= 128 && (H == 128 || split_kv == 1) && q_len >= 1 &&
         q_len <= 4;
}

}  // namespace

void BatchMLADecodeCuteDSLWrapper::plan(int64_t kv_lora_rank, int64_t qk_rope_head_dim,
                                        int64_t num_heads, int64_t page_size, DType q_dtype,
                                        std::optional<DType> out_dtype, bool is_var_seq,
                                        std::optional<bool> enable_pdl,
                                        std::optional<Value> variant) {
  call_op<&BatchMLADecodeCuteDSLWrapper::plan>(
      [&] {
        const char* op = "BatchMLADecodeCuteDSLWrapper.plan";
        FLASHINFER_CHECK_CODE(!variant || variant->is_none(), ErrorCode::kUnsupported, op,
                              "variant",
                              "attention variants (score_mod, update_statistics, "
                              "transform_output) are not implemented in flashinfer-cpp");
        const DType od =
            out_dtype.value_or(q_dtype == DType::kFloat8E4M3FN ? DType::kBFloat16 : q_dtype);
        // Blame the first parameter the kernel's can_implement rejects.
        const char* bad = kv_lora_rank != kMlaL       ? "kv_lora_rank"
                          : qk_rope_head_dim != kMlaR ? "qk_rope_head_dim"
                          : !mla_can_implement(kMlaL, kMlaR, q_dtype, od, 32, 128, 1, 1)
                              ? (out_dtype ? "out_dtype" : "q_dtype")
                          : !mla_can_implement(kMlaL, kMlaR, q_dtype, od, page_size, 128, 1, 1)
                              ? "page_size"
                              : "num_heads";
        FLASHINFER_CHECK(
            mla_can_implement(kv_lora_rank, qk_rope_head_dim, q_dtype, od, page_size, num_heads, 1,
                              1),
            op, bad,
            "cute_dsl_mla_decode: unsupported configuration (q_len=1, num_heads=", num_heads,
            ", page_size=", page_size, ", in_dtype=", tn(q_dtype), ", out_dtype=", tn(od), ")");
        CuteDslPlan s;
        s.workspace = s_->workspace;
        s.num_heads = num_heads, s.page_size = page_size, s.q_dtype = q_dtype, s.o_dtype = od;
        s.var_seq = is_var_seq;
        (void)enable_pdl;
        check_arch(op, "workspace_buffer", s.workspace.device());
        s.planned = true;
        *s_ = std::move(s);
      },
      *this, kv_lora_rank, qk_rope_head_dim, num_heads, page_size, q_dtype, out_dtype, is_var_seq,
      enable_pdl, variant);
}

Tensor BatchMLADecodeCuteDSLWrapper::run(const Tensor& q, const Tensor& kv_cache,
                                         const Tensor& block_tables, const Tensor& seq_lens,
                                         int64_t max_seq_len, double softmax_scale,
                                         double output_scale, std::optional<Tensor> out) {
  return call_op<&BatchMLADecodeCuteDSLWrapper::run>(
      [&] {
        const char* op = "BatchMLADecodeCuteDSLWrapper.run";
        const CuteDslPlan& s = *s_;
        FLASHINFER_CHECK(s.planned, op, "self", "Call plan() before run().");
        api::check_defined(q, op, "q");
        api::check_defined(kv_cache, op, "kv_cache");
        FLASHINFER_CHECK(q.dim() == 4 && q.size(-1) == kMlaW, op, "q", "q.shape[-1]=", q.size(-1),
                         " does not match the planned kv_lora_rank + qk_rope_head_dim = ", kMlaW);
        FLASHINFER_CHECK(q.dtype() == s.q_dtype, op, "q", "q.dtype=", tn(q.dtype()),
                         " does not match the planned q_dtype=", tn(s.q_dtype));
        FLASHINFER_CHECK(kv_cache.dtype() == s.q_dtype, op, "kv_cache",
                         "kv_cache.dtype=", tn(kv_cache.dtype()),
                         " does not match the planned q_dtype=", tn(s.q_dtype));
        Tensor c = kv_cache;
        if (c.dim() == 4) {
          FLASHINFER_CHECK(c.size(1) == 1, op, "kv_cache",
                           "Expected 4D kv_cache shape [num_pages, 1, page_size, D], got ",
                           shape_to_string(c.shape()));
          c = c.select(1, 0);
        }
        FLASHINFER_CHECK(c.dim() == 3, op, "kv_cache",
                         "kv_cache must be 3D or 4D, got ndim=", kv_cache.dim());
        FLASHINFER_CHECK(c.size(1) == s.page_size && c.size(2) == kMlaW && c.stride(2) == 1, op,
                         "kv_cache", "kv_cache must be [num_pages, ", s.page_size, ", ", kMlaW,
                         "] with contiguous features, got ", shape_to_string(c.shape()));
        api::check_same_device(c, q, op, "kv_cache", "q");
        const int64_t B = q.size(0), ql = q.size(1), H = q.size(2);
        FLASHINFER_CHECK(B >= 1, op, "q", "q must hold at least one request");
        FLASHINFER_CHECK(H == s.num_heads, op, "q", "q has ", H, " heads, the plan ", s.num_heads);
        FLASHINFER_CHECK(ql >= 1 && ql <= 4, op, "q",
                         "cute_dsl_mla_decode: unsupported "
                         "configuration (q_len=",
                         ql, ", num_heads=", H, ", page_size=", s.page_size, ")");
        const int64_t split_kv =
            std::min<int64_t>(std::max<int64_t>(1, sm_count(q.device()) / B / (ql * 2)), 32);
        FLASHINFER_CHECK(H == 128 || split_kv == 1, op, "q", "num_heads=", H,
                         " < 128 requires split_kv==1, got split_kv=", split_kv);
        if (split_kv > 1) {
          const int64_t need = B * std::max<int64_t>(H, 128) * ql * split_kv * (kMlaL + 1) * 4;
          FLASHINFER_CHECK(static_cast<int64_t>(s.workspace.nbytes()) >= need, op,
                           "workspace_buffer", "workspace_buffer too small: ", s.workspace.nbytes(),
                           " bytes, need ", need, " bytes");
        }
        api::check_defined(block_tables, op, "block_tables");
        FLASHINFER_CHECK(block_tables.dim() == 2 && block_tables.size(0) == B &&
                             block_tables.dtype() == DType::kInt32,
                         op, "block_tables", "block_tables must be [B, max_pages] int32");
        const auto sl = ints(seq_lens, op, "seq_lens");
        FLASHINFER_CHECK(static_cast<int64_t>(sl.size()) == B, op, "seq_lens",
                         "seq_lens must have one entry per request");
        (void)max_seq_len;  // unused upstream too
        const int64_t cols = block_tables.size(1);
        CuteDslPlan r;
        r.pages = api::host_ints(block_tables);
        r.page_indptr.resize(static_cast<size_t>(B + 1));
        for (int64_t b = 0; b <= B; ++b) r.page_indptr[b] = b * cols;
        for (int64_t b = 0; b < B; ++b) {
          const int64_t need = (sl[b] + s.page_size - 1) / s.page_size;
          FLASHINFER_CHECK(sl[b] >= 1 && need <= cols, op, "seq_lens", "seq_lens[", b, "]=", sl[b],
                           " needs ", need, " block table columns, the table has ", cols);
          for (int64_t j = 0; j < need; ++j) {
            const int64_t id = r.pages[b * cols + j];
            FLASHINFER_CHECK(id >= 0 && id < c.size(0), op, "block_tables", "page id ", id,
                             " is outside the cache's ", c.size(0), " pages");
          }
        }
        Tensor o;
        const Shape os{B, ql, H, kMlaL};
        if (out && out->defined()) {
          o = *out;
          api::check_shape_eq(o, os, op, "out");
          FLASHINFER_CHECK(o.dtype() == s.o_dtype, op, "out", "out.dtype=", tn(o.dtype()),
                           " does not match the planned out_dtype=", tn(s.o_dtype));
          api::check_same_device(o, q, op, "out", "q");
        } else {
          o = Tensor::empty(os, s.o_dtype, q.device());
        }
        TsAttentionParams p;
        p.num_qo_heads = H, p.num_kv_heads = 1, p.head_dim_qk = kMlaW, p.head_dim_vo = kMlaL;
        p.q_dtype = s.q_dtype, p.kv_dtype = c.dtype(), p.o_dtype = s.o_dtype;
        p.k = p.v = c.data_ptr();
        p.k_page_stride = p.v_page_stride = c.stride(0);
        p.k_slot_stride = p.v_slot_stride = c.stride(1);
        std::vector<int64_t> q0(static_cast<size_t>(B)), qlv(static_cast<size_t>(B), ql);
        for (int64_t b = 0; b < B; ++b) q0[b] = b * ql;
        set_requests(p, q0, qlv, sl, r.page_indptr, r.pages, s.page_size);
        p.bmm1_scale = static_cast<float>(softmax_scale);
        p.bmm2_scale = static_cast<float>(output_scale);
        run_ref(p, q, o, op);
        return o;
      },
      *this, q, kv_cache, block_tables, seq_lens, max_seq_len, softmax_scale, output_scale, out);
}

namespace {

using api::bench::bench_object;
using api::bench::int32_tensor;
using api::bench::invoke_case;
using api::bench::random_tensor;

// Each hook plans a wrapper on `dev` and times its run: batch_size requests, one query each
// (prefill: s_qo), s_kv keys, bf16.
BenchCase bench_decode_run(const BenchShape& s, Device dev) {
  const int64_t B = s.batch_size, Hq = s.num_qo_heads, Hkv = s.num_kv_heads;
  const int64_t D = s.head_dim_qk % 64 == 0 ? s.head_dim_qk : 128,
                kv = std::max<int64_t>(1, s.s_kv);
  auto w = std::make_shared<BatchDecodeCuteDSLWrapper>(
      Tensor::zeros({int64_t{16} << 20}, DType::kUInt8, dev));
  CuteDslDecodePlanOptions o;
  w->plan(B, kv, Hq, Hkv, D, o);
  BenchCase c = invoke_case(
      "BatchDecodeCuteDSLWrapper.run",
      {bench_object(w), Value(random_tensor({B, 1, Hq, D}, DType::kBFloat16, dev, s.random_seed)),
       Value(random_tensor({B, kv, Hkv, D}, DType::kBFloat16, dev, s.random_seed + 1)),
       Value(random_tensor({B, kv, Hkv, D}, DType::kBFloat16, dev, s.random_seed + 2))});
  c.flops = static_cast<double>(B) * api::bench::attention_flops(1, kv, Hq, D, D, false);
  c.bytes = api::bench::bench_attention_bytes(s, B, B * kv);
  return c;
}

BenchCase bench_paged_decode_run(const BenchShape& s, Device dev) {
  const int64_t B = s.batch_size, Hq = s.num_qo_heads, Hkv = s.num_kv_heads;
  const int64_t D = s.head_dim_qk % 64 == 0 ? s.head_dim_qk : 128,
                kv = std::max<int64_t>(1, s.s_kv);
  const int64_t P = s.page_size == 8 || s.page_size == 32 || s.page_size == 64 ? s.page_size : 16;
  const int64_t n = (kv + P - 1) / P;
  std::vector<int64_t> indptr, indices, lens(static_cast<size_t>(B), kv);
  for (int64_t b = 0; b < B; ++b) indptr.push_back(b * n);
  for (int64_t i = 0; i < B * n; ++i) indices.push_back(i);
  auto w = std::make_shared<BatchDecodePagedCuteDSLWrapper>(
      Tensor::zeros({int64_t{16} << 20}, DType::kUInt8, dev));
  w->plan(int32_tensor(indptr, dev), int32_tensor(indices, dev), int32_tensor(lens, dev), Hq, Hkv,
          D, P);
  BenchCase c = invoke_case(
      "BatchDecodePagedCuteDSLWrapper.run",
      {bench_object(w), Value(random_tensor({B, Hq, D}, DType::kBFloat16, dev, s.random_seed)),
       Value(random_tensor({B * n, P, Hkv, D}, DType::kBFloat16, dev, s.random_seed + 1)),
       Value(random_tensor({B * n, P, Hkv, D}, DType::kBFloat16, dev, s.random_seed + 2))});
  c.flops = static_cast<double>(B) * api::bench::attention_flops(1, kv, Hq, D, D, false);
  c.bytes = api::bench::bench_attention_bytes(s, B, B * kv);
  return c;
}

BenchCase bench_prefill_run(const BenchShape& s, Device dev, bool paged = false) {
  const int64_t B = s.batch_size, Hq = s.num_qo_heads, Hkv = s.num_kv_heads;
  const int64_t D = s.head_dim_qk % 16 == 0 ? s.head_dim_qk : 128;
  const int64_t sq = std::max<int64_t>(1, s.s_qo), kv = std::max<int64_t>(1, s.s_kv);
  std::vector<int64_t> qo{0}, kvi{0};
  for (int64_t b = 0; b < B; ++b) qo.push_back(qo.back() + sq), kvi.push_back(kvi.back() + kv);
  const bool causal = s.causal && sq <= kv;
  auto w = std::make_shared<BatchPrefillCuteDSLWrapper>(Tensor::zeros({16}, DType::kUInt8, dev));
  if (paged) {  // NHD pages of 16, consecutive
    const int64_t P = 16, n = (kv + P - 1) / P;
    std::vector<int64_t> ip{0}, ind, last;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < n; ++j) ind.push_back(b * n + j);
      ip.push_back((b + 1) * n);
      last.push_back(kv - (n - 1) * P);
    }
    w->plan(int32_tensor(qo, dev), std::nullopt, Hq, Hkv, D, std::nullopt, causal, std::nullopt,
            DType::kBFloat16, DType::kBFloat16, -1, std::nullopt, -1, P, int32_tensor(ip, dev),
            int32_tensor(ind, dev), int32_tensor(last, dev));
    BenchCase c = invoke_case(
        "BatchPrefillCuteDSLWrapper.run_paged",
        {bench_object(w),
         Value(random_tensor({B * sq, Hq, D}, DType::kBFloat16, dev, s.random_seed)),
         Value(random_tensor({B * n, 2, P, Hkv, D}, DType::kBFloat16, dev, s.random_seed + 1))});
    c.flops = static_cast<double>(B) * api::bench::attention_flops(sq, kv, Hq, D, D, causal);
    c.bytes = api::bench::bench_attention_bytes(s, B * sq, B * kv);
    return c;
  }
  w->plan(int32_tensor(qo, dev), int32_tensor(kvi, dev), Hq, Hkv, D, std::nullopt, causal,
          std::nullopt, DType::kBFloat16, DType::kBFloat16);
  BenchCase c = invoke_case(
      "BatchPrefillCuteDSLWrapper.run",
      {bench_object(w), Value(random_tensor({B * sq, Hq, D}, DType::kBFloat16, dev, s.random_seed)),
       Value(random_tensor({B * kv, Hkv, D}, DType::kBFloat16, dev, s.random_seed + 1)),
       Value(random_tensor({B * kv, Hkv, D}, DType::kBFloat16, dev, s.random_seed + 2))});
  c.flops = static_cast<double>(B) * api::bench::attention_flops(sq, kv, Hq, D, D, causal);
  c.bytes = api::bench::bench_attention_bytes(s, B * sq, B * kv);
  return c;
}

// 128 heads (fewer need an unsplit KV, which these shapes do not give), page 32.
BenchCase bench_mla_run(const BenchShape& s, Device dev) {
  const int64_t B = s.batch_size, H = 128, P = 32, kv = std::max<int64_t>(1, s.s_kv);
  const int64_t n = (kv + P - 1) / P;
  std::vector<int64_t> table, lens(static_cast<size_t>(B), kv);
  for (int64_t i = 0; i < B * n; ++i) table.push_back(i);
  auto w = std::make_shared<BatchMLADecodeCuteDSLWrapper>(
      Tensor::zeros({int64_t{24} << 20}, DType::kInt8, dev));
  w->plan(kMlaL, kMlaR, H, P);
  BenchCase c = invoke_case(
      "BatchMLADecodeCuteDSLWrapper.run",
      {bench_object(w),
       Value(random_tensor({B, 1, H, kMlaW}, DType::kBFloat16, dev, s.random_seed)),
       Value(random_tensor({B * n, P, kMlaW}, DType::kBFloat16, dev, s.random_seed + 1)),
       Value(int32_tensor(table, dev).view({B, n})), Value(int32_tensor(lens, dev)), Value(kv),
       Value(1.0 / std::sqrt(192.0))});
  c.flops = static_cast<double>(B) * api::bench::attention_flops(1, kv, H, kMlaW, kMlaL, false);
  c.bytes = api::bench::nbytes({B * kv, kMlaW}, DType::kBFloat16) +
            api::bench::nbytes({B, H, kMlaW + kMlaL}, DType::kBFloat16);
  return c;
}

}  // namespace

namespace detail {

void register_cute_dsl_attention_ops(OpRegistry& r) {
  declare_init<CuteDecodeInit>(r,
                               {.name = "BatchDecodeCuteDSLWrapper.__init__",
                                .module = kDecodeMod,
                                .summary = "CuTe-DSL decode wrapper (equal-length K/V)"},
                               "float_workspace_buffer", arg("use_cuda_graph", false));
  declare<&BatchDecodeCuteDSLWrapper::plan>(
      r,
      {.name = "BatchDecodeCuteDSLWrapper.plan",
       .module = kDecodeMod,
       .summary = "Resolves the window, the KV split and the reduction",
       .var_positional = "deprecated_positional_args",
       .var_keyword = "kwargs"},
      "batch_size", "max_kv_len", "num_qo_heads", "num_kv_heads", "head_dim");
  declare<&BatchDecodeCuteDSLWrapper::run>(r,
                                           {.name = "BatchDecodeCuteDSLWrapper.run",
                                            .module = kDecodeMod,
                                            .summary = "CuTe-DSL decode with the current plan",
                                            .var_positional = "deprecated_positional_args",
                                            .var_keyword = "kwargs"},
                                           "q", "k", "v", field("out").mut(), field("lse").mut());
  declare_init<CutePagedDecodeInit>(r,
                                    {.name = "BatchDecodePagedCuteDSLWrapper.__init__",
                                     .module = kDecodeMod,
                                     .summary = "CuTe-DSL paged decode wrapper"},
                                    "float_workspace_buffer", arg("use_cuda_graph", false));
  declare<&BatchDecodePagedCuteDSLWrapper::plan>(
      r,
      {.name = "BatchDecodePagedCuteDSLWrapper.plan",
       .module = kDecodeMod,
       .summary = "Reads the page table and lengths; resolves window, split and reduction",
       .var_positional = "deprecated_positional_args",
       .var_keyword = "kwargs"},
      "indptr", "indices", "seq_lens", "num_qo_heads", "num_kv_heads", "head_dim", "page_size");
  declare<&BatchDecodePagedCuteDSLWrapper::run>(
      r,
      {.name = "BatchDecodePagedCuteDSLWrapper.run",
       .module = kDecodeMod,
       .summary = "CuTe-DSL paged decode with the current plan",
       .var_positional = "deprecated_positional_args",
       .var_keyword = "kwargs"},
      "q", "k_cache", "v_cache", field("out").mut(), field("lse").mut());
  declare_init<CutePrefillInit>(r,
                                {.name = "BatchPrefillCuteDSLWrapper.__init__",
                                 .module = kPrefillMod,
                                 .summary = "CuTe-DSL prefill wrapper (ragged or paged K/V)"},
                                "float_workspace_buffer", arg("use_cuda_graph", false));
  declare<&BatchPrefillCuteDSLWrapper::plan>(
      r,
      {.name = "BatchPrefillCuteDSLWrapper.plan",
       .module = kPrefillMod,
       .summary = "Reads the offsets (or page table); checks the configuration"},
      "qo_indptr", "kv_indptr", "num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo",
      arg("causal", true), "sm_scale", arg("q_data_type", DType::kFloat16),
      arg("kv_data_type", DType::kFloat16), arg("window_left", int64_t{-1}), "variant",
      arg("window_right", int64_t{-1}), "page_size", "paged_kv_indptr", "paged_kv_indices",
      "paged_kv_last_page_len", arg("kv_layout", "NHD"));
  declare<&BatchPrefillCuteDSLWrapper::run>(
      r,
      {.name = "BatchPrefillCuteDSLWrapper.run",
       .module = kPrefillMod,
       .summary = "CuTe-DSL ragged prefill with the current plan"},
      "q", "k", "v", arg("out").mut(), arg("return_lse", false), arg("lse").mut());
  declare<&BatchPrefillCuteDSLWrapper::run_paged>(
      r,
      {.name = "BatchPrefillCuteDSLWrapper.run_paged",
       .module = kPrefillMod,
       .summary = "CuTe-DSL paged prefill with the current plan"},
      "q", "paged_kv_cache", arg("out").mut(), arg("return_lse", false), arg("lse").mut());
  declare_init<CuteMlaInit>(r,
                            {.name = "BatchMLADecodeCuteDSLWrapper.__init__",
                             .module = kMlaMod,
                             .summary = "CuTe-DSL DeepSeek MLA decode wrapper"},
                            "workspace_buffer");
  declare<&BatchMLADecodeCuteDSLWrapper::plan>(
      r,
      {.name = "BatchMLADecodeCuteDSLWrapper.plan",
       .module = kMlaMod,
       .summary = "Checks the configuration the kernel implements"},
      arg("kv_lora_rank", int64_t{512}), arg("qk_rope_head_dim", int64_t{64}),
      arg("num_heads", int64_t{128}), arg("page_size", int64_t{1}),
      arg("q_dtype", DType::kBFloat16), "out_dtype", arg("is_var_seq", true), "enable_pdl",
      "variant");
  declare<&BatchMLADecodeCuteDSLWrapper::run>(
      r,
      {.name = "BatchMLADecodeCuteDSLWrapper.run",
       .module = kMlaMod,
       .summary = "CuTe-DSL MLA decode with the current plan"},
      "q", "kv_cache", "block_tables", "seq_lens", "max_seq_len", "softmax_scale",
      arg("output_scale", 1.0), arg("out").mut());
  for (const char* op :
       {"BatchDecodeCuteDSLWrapper.__init__", "BatchDecodeCuteDSLWrapper.plan",
        "BatchDecodeCuteDSLWrapper.run", "BatchDecodePagedCuteDSLWrapper.__init__",
        "BatchDecodePagedCuteDSLWrapper.plan", "BatchDecodePagedCuteDSLWrapper.run",
        "BatchPrefillCuteDSLWrapper.__init__", "BatchPrefillCuteDSLWrapper.plan",
        "BatchPrefillCuteDSLWrapper.run", "BatchPrefillCuteDSLWrapper.run_paged",
        "BatchMLADecodeCuteDSLWrapper.__init__", "BatchMLADecodeCuteDSLWrapper.plan",
        "BatchMLADecodeCuteDSLWrapper.run"}) {
    api::register_backends(op, kCuteAttnKernels);
  }
  register_bench_hook("BatchDecodeCuteDSLWrapper.run", bench_decode_run);
  register_bench_hook("BatchDecodePagedCuteDSLWrapper.run", bench_paged_decode_run);
  register_bench_hook("BatchPrefillCuteDSLWrapper.run",
                      [](const BenchShape& s, Device d) { return bench_prefill_run(s, d); });
  register_bench_hook("BatchPrefillCuteDSLWrapper.run_paged",
                      [](const BenchShape& s, Device d) { return bench_prefill_run(s, d, true); });
  register_bench_hook("BatchMLADecodeCuteDSLWrapper.run", bench_mla_run);
}

}  // namespace detail
}  // namespace flashinfer
