// flashinfer.attention.prims_ts (decode, mla_decode, context, block_sparse): upstream's
// task-scheduled attention entry points with their checks and messages, every layout turned into
// the one description the CPU reference takes (kernels/prims_ts_params.h), upstream's SM100 /
// SM103 refusal elsewhere on CUDA (docs/ATTENTION.md, "Task-scheduled attention").
#include "flashinfer/ops/prims_ts.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "api/arg_traits.h"
#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/prims_ts_cpu.h"
#include "kernels/prims_ts_params.h"

namespace flashinfer {
namespace prims_ts {

namespace {

using kernels::TsAttentionParams;

constexpr const char* kTsDecodeModule = "flashinfer.attention.prims_ts.decode";
constexpr const char* kTsMlaModule = "flashinfer.attention.prims_ts.mla_decode";
constexpr const char* kTsContextModule = "flashinfer.attention.prims_ts.context";
constexpr const char* kTsSparseModule = "flashinfer.attention.prims_ts.block_sparse";
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

constexpr api::KernelEntry<TsAttentionParams> kTsKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: each query's softmax over its visible keys (mask, window, blocks, valid "
     "bits), fp32",
     nullptr,
     [](const TsAttentionParams& p, const api::LaunchContext&) {
       kernels::cpu::prims_ts_attention(p);
     }},
};

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }
std::string dt(DType d) { return std::string(dtype_torch_name(d)); }

// An int32 1-D metadata tensor's values.
std::vector<int64_t> ints1d(const Tensor& t, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK(t.dim() == 1, op, arg, arg, " must be one-dimensional");
  FLASHINFER_CHECK(t.dtype() == DType::kInt32, op, arg, arg, " must have dtype torch.int32");
  return api::host_ints(t);
}

// The op whose upstream_arch rule `op` refuses by: a wrapper's plan checks the device as its
// module's one-shot form does (the plans have no bench case, which a rule needs); the runs have
// rules of their own with the same text.
const char* rule_of(std::string_view op) {
  static constexpr std::pair<std::string_view, const char*> kByClass[] = {
      {"BatchDecodePagedTSWrapper.", "batch_decode_with_paged_kv_cache"},
      {"BatchMLADecodePagedTSWrapper.", "batch_decode_mla_with_paged_kv_cache"},
      {"BatchPrefillTSWrapper.", "batch_prefill"},
      {"BatchPrefillPagedTSWrapper.", "batch_prefill_with_paged_kv_cache"},
      {"BlockSparseTSWrapper.", "block_sparse_attention"},
      {"BlockSparsePagedTSWrapper.", "block_sparse_attention_with_paged_kv_cache"},
  };
  if (!op.ends_with(".plan")) return nullptr;
  for (const auto& [prefix, rule] : kByClass) {
    if (op.starts_with(prefix)) return rule;
  }
  return nullptr;
}
void check_arch(const char* op, const char* arg, Device dev) {
  const char* rule = rule_of(op);
  api::check_upstream_arch_as(rule ? rule : op, op, arg, dev);
}

// A tensor of rank 3 or 4 (the layouts' q / k / v), checked before its sizes are read.
void need_rank34(const Tensor& t, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK(t.dim() == 3 || t.dim() == 4, op, arg, arg, " must be a 3-D or 4-D tensor, got ",
                   shape_to_string(t.shape()));
}

// attention-ts decode takes HND caches only (upstream's _validate_layout).
void check_decode_layout(std::string_view kv_layout, const char* op) {
  FLASHINFER_CHECK_CODE(kv_layout != "NHD", ErrorCode::kUnsupported, op, "kv_layout",
                        "attention-ts decode currently supports kv_layout='HND' only");
  FLASHINFER_CHECK(kv_layout == "HND", op, "kv_layout", "kv_layout must be exactly 'HND', got ",
                   quoted(kv_layout));
}

// The standalone functions' scratch: bytes (int8 or uint8), which the CPU reference leaves alone.
void check_workspace_dtype(const Tensor& workspace_buffer, const char* op) {
  api::check_defined(workspace_buffer, op, "workspace_buffer");
  FLASHINFER_CHECK(
      workspace_buffer.dtype() == DType::kInt8 || workspace_buffer.dtype() == DType::kUInt8, op,
      "workspace_buffer", "workspace_buffer must have dtype torch.int8 or torch.uint8");
}

// upstream's _validate_scale: finite, positive, a positive float32.
float scale_of(double v, const char* op, const char* arg) {
  FLASHINFER_CHECK(std::isfinite(v) && v > 0.0, op, arg, arg, " must be finite and positive");
  const auto f = static_cast<float>(v);
  FLASHINFER_CHECK(f > 0.0f && std::isfinite(f), op, arg, arg,
                   " must be representable as a positive float32");
  return f;
}

// "dense" -> false, "causal" -> true.
bool causal_of(std::string_view mask, const char* op, bool context) {
  if (mask == "dense") return false;
  if (mask == "causal") return true;
  if (context && mask == "variable_window") {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "mask_type",
                    "mask_type='variable_window' (a newer upstream's per-request windows) is not "
                    "implemented in flashinfer-cpp");
  }
  FLASHINFER_FAIL(ErrorCode::kInvalidArgument, op, "mask_type",
                  context
                      ? "mask_type must be exactly 'dense', 'causal', or 'variable_window', got "
                      : "mask_type must be exactly 'dense' or 'causal', got ",
                  quoted(mask));
}

// A CSR page table: indptr starts at 0, strictly increasing, ends at indices' length.
void check_csr(const std::vector<int64_t>& indptr, int64_t batch, int64_t nnz, const char* op) {
  FLASHINFER_CHECK(static_cast<int64_t>(indptr.size()) == batch + 1, op, "paged_kv_indptr",
                   "paged_kv_indptr must have B + 1 elements: expected ", batch + 1, ", got ",
                   indptr.size());
  FLASHINFER_CHECK(indptr[0] == 0, op, "paged_kv_indptr", "paged_kv_indptr must start at zero");
  for (int64_t b = 0; b < batch; ++b) {
    FLASHINFER_CHECK(indptr[b + 1] > indptr[b], op, "paged_kv_indptr",
                     "paged_kv_indptr must be strictly increasing so every request contains at "
                     "least one page");
  }
  FLASHINFER_CHECK(indptr[batch] == nnz, op, "paged_kv_indptr",
                   "the final paged_kv_indptr offset must equal paged_kv_indices.numel(): "
                   "expected ",
                   nnz, ", got ", indptr[batch]);
}

// K and V of an HND cache as [pages, Hkv, page_size, D] views with compact inner strides.
std::pair<Tensor, Tensor> hnd_cache(const PagedKVCache& c, const char* op, const char* arg) {
  Tensor k, v;
  if (c.is_pair()) {
    k = c.first(), v = c.second();
    api::check_defined(k, op, arg);
    api::check_defined(v, op, arg);
    FLASHINFER_CHECK(k.dim() == 4 && v.dim() == 4, op, arg,
                     "tuple K/V caches must each have shape [num_pages, Hkv, page_size, head_dim]");
  } else {
    const Tensor& kv = c.first();
    api::check_defined(kv, op, arg);
    FLASHINFER_CHECK(kv.dim() == 5 && kv.size(1) == 2, op, arg,
                     "combined paged_kv_cache must have shape [num_pages, 2, Hkv, page_size, "
                     "head_dim]");
    k = kv.select(1, 0), v = kv.select(1, 1);
  }
  FLASHINFER_CHECK(k.shape() == v.shape(), op, arg,
                   "K and V cache views must have identical logical shapes");
  FLASHINFER_CHECK(k.dtype() == v.dtype(), op, arg,
                   "K and V cache views must have identical dtypes");
  api::check_same_device(v, k, op, arg, arg);
  for (const auto& [t, name] :
       {std::pair<const Tensor&, const char*>{k, "K cache"}, {v, "V cache"}}) {
    const int64_t P = t.size(2), D = t.size(3);
    FLASHINFER_CHECK(t.stride(1) == P * D && t.stride(2) == D && t.stride(3) == 1, op, arg, name,
                     " must have compact HND inner strides (", P * D, ", ", D, ", 1), got (",
                     t.stride(1), ", ", t.stride(2), ", ", t.stride(3), ")");
    FLASHINFER_CHECK(t.size(0) <= 1 || t.stride(0) >= t.size(1) * P * D, op, arg, name,
                     " pages overlap: outer stride ", t.stride(0), " is smaller than ",
                     t.size(1) * P * D);
  }
  return {k, v};
}

// Checks a caller's out, or makes one.
Tensor out_for(std::optional<Tensor>& out, const Shape& shape, DType dtype, Device dev,
               const char* op) {
  if (!out || !out->defined()) return Tensor::empty(shape, dtype, dev);
  FLASHINFER_CHECK(out->shape() == shape, op, "out", "out must have shape ", shape_to_string(shape),
                   ", got ", shape_to_string(out->shape()));
  FLASHINFER_CHECK(out->dtype() == dtype, op, "out", "out must have dtype ", dt(dtype), ", got ",
                   dt(out->dtype()));
  FLASHINFER_CHECK(out->device() == dev, op, "out", "out must be on ", dev.str());
  FLASHINFER_CHECK(out->is_contiguous(), op, "out", "out must have compact strides");
  return *out;
}

}  // namespace

/// What a wrapper keeps from plan (and what a one-shot call builds): the per-request layout the
/// CPU reference reads, as host arrays, and the call's geometry.
struct TsPlan {
  bool planned = false;
  std::string kv_layout = "HND";
  int64_t batch = 0, Hq = 0, Hkv = 0, D = 0, Dv = 0, page_size = 1;
  DType q_dtype = DType::kFloat16, kv_dtype = DType::kFloat16, o_dtype = DType::kFloat16;
  bool causal = false;
  int64_t window_left = -1;
  // Q: fixed (seq_len_q rows a request; 3-D [B, Hq, D] when seq_len_q is 1 and not packed) or
  // packed by qo_indptr.
  bool packed = false;
  int64_t seq_len_q = 1, total_q = 0;
  std::vector<int64_t> q_row0, q_len, kv_len, page_indptr, pages;
  int64_t num_pages_min = 0;  // the cache must hold more pages than the largest id
  // Context: the planned shapes of q and k.
  Shape q_shape, k_shape;
  float scale1 = 1.0f, scale2 = 1.0f;
  // Block-sparse.
  int64_t q_block_size = 0, kv_block_size = 0, max_blocks_per_row = 0, seq_len_kv = 0;
  bool use_kv_valid_bits = false;
  Device device;
};

namespace {

// Q rows from the layout: a fixed layout's request b starts at row b * seq_len_q.
void fixed_q_rows(TsPlan& s) {
  s.q_row0.resize(s.batch), s.q_len.assign(s.batch, s.seq_len_q);
  for (int64_t b = 0; b < s.batch; ++b) s.q_row0[b] = b * s.seq_len_q;
  s.total_q = s.batch * s.seq_len_q;
}

// A packed layout's qo_indptr (decode / MLA rules): starts at 0, strictly increasing, each
// request at most max_q.
void packed_q_rows(TsPlan& s, const std::vector<int64_t>& qo, int64_t max_q, const char* op) {
  FLASHINFER_CHECK(static_cast<int64_t>(qo.size()) == s.batch + 1, op, "qo_indptr",
                   "qo_indptr must have B + 1 elements: expected ", s.batch + 1, ", got ",
                   qo.size());
  FLASHINFER_CHECK(qo[0] == 0, op, "qo_indptr", "qo_indptr must start at zero");
  s.q_row0.resize(s.batch), s.q_len.resize(s.batch);
  for (int64_t b = 0; b < s.batch; ++b) {
    FLASHINFER_CHECK(qo[b + 1] > qo[b], op, "qo_indptr", "qo_indptr must be strictly increasing");
    s.q_row0[b] = qo[b], s.q_len[b] = qo[b + 1] - qo[b];
    FLASHINFER_CHECK(max_q <= 0 || s.q_len[b] <= max_q, op, "qo_indptr",
                     "qo_indptr contains a per-request Q length larger than max_seq_len_q (", max_q,
                     "): got ", s.q_len[b]);
  }
  s.total_q = qo[s.batch];
  s.packed = true;
}

// The cache pages every request's keys need exist (upstream trusts them; the CPU must not read
// outside the cache).
void check_pages(const TsPlan& s, int64_t num_pages, const char* op, const char* arg) {
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t need = (s.kv_len[b] + s.page_size - 1) / s.page_size;
    FLASHINFER_CHECK(s.page_indptr[b + 1] - s.page_indptr[b] >= need, op, arg, "request ", b,
                     " has ", s.kv_len[b], " K/V tokens but ",
                     s.page_indptr[b + 1] - s.page_indptr[b], " pages of ", s.page_size);
    for (int64_t j = 0; j < need; ++j) {
      const int64_t id = s.pages[s.page_indptr[b] + j];
      FLASHINFER_CHECK(id >= 0 && id < num_pages, op, arg, "page id ", id, " of request ", b,
                       " is outside the cache's ", num_pages, " pages");
    }
  }
}

void check_causal(const TsPlan& s, const char* op, const char* what) {
  if (!s.causal) return;
  for (int64_t b = 0; b < s.batch; ++b) {
    FLASHINFER_CHECK(s.q_len[b] <= s.kv_len[b], op, "mask_type", what, b, " has Q=", s.q_len[b],
                     " and K/V=", s.kv_len[b]);
  }
}

// Fills the params' request arrays from the plan and runs the reference.
void run_reference(const TsPlan& s, TsAttentionParams& p, Device dev, const char* op) {
  p.batch = s.batch, p.num_qo_heads = s.Hq, p.num_kv_heads = s.Hkv;
  p.head_dim_qk = s.D, p.head_dim_vo = s.Dv;
  p.q_dtype = s.q_dtype, p.kv_dtype = s.kv_dtype, p.o_dtype = s.o_dtype;
  p.q_row0 = s.q_row0.data(), p.q_len = s.q_len.data(), p.kv_len = s.kv_len.data();
  p.page_size = s.page_size, p.page_indptr = s.page_indptr.data(), p.pages = s.pages.data();
  p.causal = s.causal, p.window_left = s.window_left;
  check_arch(op, "q", dev);
  api::launch(kTsKernels, p, dev, op, "q");
}

// ---- decode ------------------------------------------------------------------------------------

// The parameters a geometry check blames: a plan's own, or the tensors (and out_dtype) a one-shot
// or standalone form reads the geometry from.
struct GeoArgs {
  const char *heads, *head_dim, *page, *q_dtype, *kv_dtype, *o_dtype;
};
constexpr GeoArgs kDecodePlanArgs{"num_qo_heads", "head_dim",     "page_size",
                                  "q_data_type",  "kv_data_type", "o_data_type"};
constexpr GeoArgs kDecodeOneShotArgs{"q", "paged_kv_cache", "paged_kv_cache",
                                     "q", "paged_kv_cache", "out_dtype"};
constexpr GeoArgs kStandaloneArgs{"query", "kv_cache", "kv_cache",
                                  "query", "kv_cache", "out_dtype"};
constexpr GeoArgs kMlaPlanArgs{"num_heads",   "page_size",    "page_size",
                               "q_data_type", "kv_data_type", "o_data_type"};

void decode_geometry(TsPlan& s, int64_t Hq, int64_t Hkv, int64_t D, int64_t page_size, DType q,
                     DType kv, DType o, std::string_view mask, int64_t window_left,
                     const GeoArgs& a, const char* op) {
  FLASHINFER_CHECK(Hq > 0 && Hkv > 0, op, a.heads, "q batch size and head count must be positive");
  FLASHINFER_CHECK(Hq % Hkv == 0, op, a.heads,
                   "num_qo_heads must be divisible by num_kv_heads, got ", Hq, " and ", Hkv);
  FLASHINFER_CHECK_CODE(Hq / Hkv <= 32, ErrorCode::kUnsupported, op, a.heads,
                        "attention-ts decode requires 1 <= Hq/Hkv <= 32, got ", Hq / Hkv);
  FLASHINFER_CHECK_CODE(D == 64 || D == 128 || D == 256, ErrorCode::kUnsupported, op, a.head_dim,
                        "attention-ts decode requires head_dim in (64, 128, 256), got ", D);
  FLASHINFER_CHECK_CODE(page_size == 16 || page_size == 32 || page_size == 64 || page_size == 128,
                        ErrorCode::kUnsupported, op, a.page,
                        "attention-ts decode requires page_size in (16, 32, 64, 128), got ",
                        page_size);
  for (const auto& [d, arg] : {std::pair<DType, const char*>{q, a.q_dtype}, {kv, a.kv_dtype}}) {
    FLASHINFER_CHECK_CODE(
        d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kFloat8E4M3FN,
        ErrorCode::kUnsupported, op, arg,
        "attention-ts decode supports torch.float16, torch.bfloat16, and torch.float8_e4m3fn; "
        "got ",
        dt(d));
  }
  FLASHINFER_CHECK_CODE(q == kv, ErrorCode::kUnsupported, op, a.kv_dtype,
                        "attention-ts decode requires Q, K, and V to use the same dtype; got Q ",
                        dt(q), " and K/V ", dt(kv));
  const bool ok = (q == DType::kFloat16 && o == DType::kFloat16) ||
                  (q == DType::kBFloat16 && o == DType::kBFloat16) ||
                  (q == DType::kFloat8E4M3FN && (o == DType::kFloat16 || o == q));
  FLASHINFER_CHECK_CODE(ok, ErrorCode::kUnsupported, op, a.o_dtype,
                        "attention-ts decode supports FP16->FP16, BF16->BF16, FP8-E4M3->FP16, "
                        "and FP8-E4M3->FP8-E4M3; got ",
                        dt(q), "->", dt(o));
  s.causal = causal_of(mask, op, false);
  FLASHINFER_CHECK(window_left >= -1, op, "window_left",
                   "window_left must be -1 (disabled) or non-negative");
  FLASHINFER_CHECK(window_left <= int64_t{kInt32Max} - 1, op, "window_left",
                   "window_left must be no larger than 2**31 - 2");
  FLASHINFER_CHECK(window_left < 0 || s.causal, op, "window_left",
                   "window_left requires mask_type='causal'");
  s.Hq = Hq, s.Hkv = Hkv, s.D = s.Dv = D, s.page_size = page_size;
  s.q_dtype = q, s.kv_dtype = kv, s.o_dtype = o, s.window_left = window_left;
}

// Q rows of a decode call: fixed by seq_len_q, or packed by qo_indptr with max_seq_len_q.
void decode_q_layout(TsPlan& s, int64_t seq_len_q, const std::optional<Tensor>& qo_indptr,
                     std::optional<int64_t> max_seq_len_q, const char* op) {
  FLASHINFER_CHECK(seq_len_q > 0, op, "seq_len_q", "seq_len_q must be positive");
  s.seq_len_q = seq_len_q;
  if (!qo_indptr || !qo_indptr->defined()) {
    FLASHINFER_CHECK(!max_seq_len_q || *max_seq_len_q == seq_len_q, op, "max_seq_len_q",
                     "fixed seq_len_q and max_seq_len_q must agree: got ", seq_len_q, " and ",
                     max_seq_len_q.value_or(0));
    fixed_q_rows(s);
    return;
  }
  int64_t bound = max_seq_len_q.value_or(seq_len_q != 1 ? seq_len_q : 0);
  if (max_seq_len_q && seq_len_q != 1) {
    FLASHINFER_CHECK(*max_seq_len_q == seq_len_q, op, "max_seq_len_q",
                     "seq_len_q and max_seq_len_q must agree when both provide the packed static "
                     "bound: got ",
                     seq_len_q, " and ", *max_seq_len_q);
  }
  packed_q_rows(s, ints1d(*qo_indptr, op, "qo_indptr"), bound, op);
}

Shape decode_q_shape(const TsPlan& s) {
  if (s.packed) return {s.total_q, s.Hq, s.D};
  if (s.seq_len_q == 1) return {s.batch, s.Hq, s.D};
  return {s.batch, s.seq_len_q, s.Hq, s.D};
}

void check_q(const Tensor& q, const TsPlan& s, const Shape& shape, const char* op,
             const char* arg) {
  api::check_defined(q, op, arg);
  FLASHINFER_CHECK(q.shape() == shape, op, arg, arg, " must have shape ", shape_to_string(shape),
                   " for this layout, got ", shape_to_string(q.shape()));
  FLASHINFER_CHECK(q.dtype() == s.q_dtype, op, arg, arg, " dtype must match the plan (",
                   dt(s.q_dtype), "), got ", dt(q.dtype()));
  FLASHINFER_CHECK(q.is_contiguous(), op, arg, arg, " must have compact strides");
}

// The decode run: q and the HND cache against the plan.
Tensor decode_run(const TsPlan& s, const Tensor& q, const PagedKVCache& cache,
                  std::optional<double> bmm1, double bmm2, std::optional<Tensor> out,
                  const char* op) {
  FLASHINFER_CHECK(s.planned, op, "self", "plan() must be called before run()");
  const Shape qs = decode_q_shape(s);
  if (s.packed) {
    FLASHINFER_CHECK(q.dim() == 3 && q.size(0) == s.total_q, op, "q",
                     "packed q token count must match qo_indptr at plan time: expected ", s.total_q,
                     ", got ", q.dim() == 3 ? q.size(0) : -1);
  }
  check_q(q, s, qs, op, "q");
  const auto [k, v] = hnd_cache(cache, op, "paged_kv_cache");
  FLASHINFER_CHECK(
      k.size(1) == s.Hkv && k.size(2) == s.page_size && k.size(3) == s.D, op, "paged_kv_cache",
      "paged_kv_cache geometry does not match the launch: expected Hkv/page/D=(", s.Hkv, ", ",
      s.page_size, ", ", s.D, "), got (", k.size(1), ", ", k.size(2), ", ", k.size(3), ")");
  FLASHINFER_CHECK(k.dtype() == s.kv_dtype, op, "paged_kv_cache",
                   "K/V dtype must match the launch (", dt(s.kv_dtype), "), got ", dt(k.dtype()));
  api::check_same_device(k, q, op, "paged_kv_cache", "q");
  check_pages(s, k.size(0), op, "paged_kv_indices");
  Tensor o = out_for(out, qs, s.o_dtype, q.device(), op);
  TsAttentionParams p;
  p.q = q.data_ptr(), p.q_row_stride = s.Hq * s.D, p.q_head_stride = s.D;
  p.o = o.data_ptr(), p.o_row_stride = s.Hq * s.D, p.o_head_stride = s.D;
  p.k = k.data_ptr(), p.k_page_stride = k.stride(0), p.k_head_stride = k.stride(1);
  p.k_slot_stride = k.stride(2);
  p.v = v.data_ptr(), p.v_page_stride = v.stride(0), p.v_head_stride = v.stride(1);
  p.v_slot_stride = v.stride(2);
  p.bmm1_scale =
      scale_of(bmm1.value_or(1.0 / std::sqrt(static_cast<double>(s.D))), op, "bmm1_scale");
  p.bmm2_scale = scale_of(bmm2, op, "bmm2_scale");
  run_reference(s, p, q.device(), op);
  return o;
}

// plan's CSR with last_page_len: K/V lengths (pages - 1) * page_size + last.
void decode_csr(TsPlan& s, const Tensor& indptr, const Tensor& indices, const Tensor& last,
                std::optional<int64_t> max_kv_len, const char* op) {
  const auto ip = ints1d(indptr, op, "paged_kv_indptr");
  const auto lp = ints1d(last, op, "paged_kv_last_page_len");
  FLASHINFER_CHECK(!lp.empty(), op, "paged_kv_last_page_len",
                   "paged_kv_last_page_len must contain at least one request");
  s.batch = static_cast<int64_t>(lp.size());
  s.pages = ints1d(indices, op, "paged_kv_indices");
  check_csr(ip, s.batch, static_cast<int64_t>(s.pages.size()), op);
  s.page_indptr = ip;
  s.kv_len.resize(s.batch);
  int64_t longest = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    FLASHINFER_CHECK(lp[b] >= 1 && lp[b] <= s.page_size, op, "paged_kv_last_page_len",
                     "paged_kv_last_page_len values must be in [1, ", s.page_size, "]");
    s.kv_len[b] = (ip[b + 1] - ip[b] - 1) * s.page_size + lp[b];
    longest = std::max(longest, s.kv_len[b]);
  }
  if (max_kv_len) {
    FLASHINFER_CHECK(longest <= *max_kv_len, op, "max_kv_len",
                     "planned KV metadata contains a request longer than max_kv_len (", *max_kv_len,
                     "): got ", longest);
  }
}

}  // namespace

Tensor prims_ts_batch_decode_with_kv_cache(
    const Tensor& query, const PagedKVCache& kv_cache, const Tensor& workspace_buffer,
    const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices, const Tensor& seq_lens,
    int64_t max_seq_len, int64_t seq_len_q, std::optional<Tensor> qo_indptr,
    std::optional<int64_t> max_seq_len_q, std::optional<double> bmm1_scale, double bmm2_scale,
    std::optional<Tensor> out, std::optional<DType> out_dtype, std::string mask_type,
    int64_t window_left, std::string kv_layout) {
  return call_op<&prims_ts_batch_decode_with_kv_cache>(
      [&] {
        const char* op = "prims_ts_batch_decode_with_kv_cache";
        check_decode_layout(kv_layout, op);
        need_rank34(query, op, "query");
        check_workspace_dtype(workspace_buffer, op);
        const auto [k, v] = hnd_cache(kv_cache, op, "kv_cache");
        TsPlan s;
        const DType o_dt = out_dtype.value_or(out && out->defined() ? out->dtype() : query.dtype());
        decode_geometry(s, query.size(-2), k.size(1), k.size(3), k.size(2), query.dtype(),
                        k.dtype(), o_dt, mask_type, window_left, kStandaloneArgs, op);
        FLASHINFER_CHECK(max_seq_len > 0 && max_seq_len <= kInt32Max - 255, op, "max_seq_len",
                         "max_seq_len must be in [1, 2147483392], got ", max_seq_len);
        const auto sl = ints1d(seq_lens, op, "seq_lens");
        FLASHINFER_CHECK(!sl.empty(), op, "seq_lens", "seq_lens must contain at least one request");
        s.batch = static_cast<int64_t>(sl.size());
        decode_q_layout(s, seq_len_q, qo_indptr, max_seq_len_q, op);
        FLASHINFER_CHECK(!s.packed || max_seq_len_q || seq_len_q != 1, op, "max_seq_len_q",
                         "max_seq_len_q is required with qo_indptr for the standalone "
                         "workspace/JIT interface");
        s.page_indptr = ints1d(paged_kv_indptr, op, "paged_kv_indptr");
        s.pages = ints1d(paged_kv_indices, op, "paged_kv_indices");
        FLASHINFER_CHECK(static_cast<int64_t>(s.page_indptr.size()) == s.batch + 1, op,
                         "paged_kv_indptr", "paged_kv_indptr must have B + 1 elements: expected ",
                         s.batch + 1, ", got ", s.page_indptr.size());
        // Upstream trusts these values (no device-to-host read); the CPU checks what it reads.
        for (int64_t b = 0; b < s.batch; ++b) {
          FLASHINFER_CHECK(sl[b] > 0 && sl[b] <= max_seq_len, op, "seq_lens", "seq_lens[", b,
                           "] = ", sl[b], " is outside [1, max_seq_len=", max_seq_len, "]");
          FLASHINFER_CHECK(s.page_indptr[b] >= 0 && s.page_indptr[b] <= s.page_indptr[b + 1] &&
                               s.page_indptr[b + 1] <= static_cast<int64_t>(s.pages.size()),
                           op, "paged_kv_indptr", "paged_kv_indptr row ", b,
                           " is outside paged_kv_indices");
        }
        s.kv_len = sl;
        check_causal(s, op,
                     "causal decode requires every per-request Q length to be no greater than "
                     "its K/V length; request ");
        s.planned = true;
        return decode_run(s, query, kv_cache, bmm1_scale, bmm2_scale, out, op);
      },
      query, kv_cache, workspace_buffer, paged_kv_indptr, paged_kv_indices, seq_lens, max_seq_len,
      seq_len_q, qo_indptr, max_seq_len_q, bmm1_scale, bmm2_scale, out, out_dtype, mask_type,
      window_left, kv_layout);
}

using DecodeTsInit = Init<BatchDecodePagedTSWrapper, std::string>;

BatchDecodePagedTSWrapper::BatchDecodePagedTSWrapper(std::string kv_layout)
    : s_(std::make_unique<TsPlan>()) {
  call_init<DecodeTsInit>(
      [&] {
        const char* op = "BatchDecodePagedTSWrapper.__init__";
        check_decode_layout(kv_layout, op);
        s_->kv_layout = kv_layout;
      },
      *this, kv_layout);
}
BatchDecodePagedTSWrapper::~BatchDecodePagedTSWrapper() = default;

void BatchDecodePagedTSWrapper::plan(const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
                                     const Tensor& paged_kv_last_page_len, int64_t num_qo_heads,
                                     int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
                                     int64_t seq_len_q, std::optional<Tensor> qo_indptr,
                                     std::optional<int64_t> max_seq_len_q, DType q_data_type,
                                     std::optional<DType> kv_data_type,
                                     std::optional<DType> o_data_type, std::string mask_type,
                                     int64_t window_left, std::optional<int64_t> max_kv_len) {
  call_op<&BatchDecodePagedTSWrapper::plan>(
      [&] {
        const char* op = "BatchDecodePagedTSWrapper.plan";
        TsPlan s;
        s.kv_layout = s_->kv_layout;
        decode_geometry(s, num_qo_heads, num_kv_heads, head_dim, page_size, q_data_type,
                        kv_data_type.value_or(q_data_type), o_data_type.value_or(q_data_type),
                        mask_type, window_left, kDecodePlanArgs, op);
        decode_csr(s, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, max_kv_len, op);
        decode_q_layout(s, seq_len_q, qo_indptr, max_seq_len_q, op);
        check_causal(s, op,
                     "causal decode requires every per-request Q length to be no greater than "
                     "its K/V length; request ");
        s.device = paged_kv_indptr.device();
        check_arch(op, "paged_kv_indptr", s.device);
        s.planned = true;
        *s_ = std::move(s);  // a failed re-plan leaves the previous plan usable
      },
      *this, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
      head_dim, page_size, seq_len_q, qo_indptr, max_seq_len_q, q_data_type, kv_data_type,
      o_data_type, mask_type, window_left, max_kv_len);
}

Tensor BatchDecodePagedTSWrapper::run(const Tensor& q, const PagedKVCache& paged_kv_cache,
                                      std::optional<double> bmm1_scale, double bmm2_scale,
                                      std::optional<Tensor> out) {
  return call_op<&BatchDecodePagedTSWrapper::run>(
      [&] {
        return decode_run(*s_, q, paged_kv_cache, bmm1_scale, bmm2_scale, out,
                          "BatchDecodePagedTSWrapper.run");
      },
      *this, q, paged_kv_cache, bmm1_scale, bmm2_scale, out);
}

Tensor batch_decode_with_paged_kv_cache(
    const Tensor& q, const PagedKVCache& paged_kv_cache, const Tensor& paged_kv_indptr,
    const Tensor& paged_kv_indices, const Tensor& paged_kv_last_page_len, int64_t seq_len_q,
    std::optional<Tensor> qo_indptr, std::optional<int64_t> max_seq_len_q, std::string mask_type,
    int64_t window_left, std::string kv_layout, std::optional<double> bmm1_scale, double bmm2_scale,
    std::optional<Tensor> out, std::optional<DType> out_dtype) {
  return call_op<&batch_decode_with_paged_kv_cache>(
      [&] {
        const char* op = "batch_decode_with_paged_kv_cache";
        check_decode_layout(kv_layout, op);
        need_rank34(q, op, "q");
        const auto [k, v] = hnd_cache(paged_kv_cache, op, "paged_kv_cache");
        TsPlan s;
        const DType o_dt = out_dtype.value_or(out && out->defined() ? out->dtype() : q.dtype());
        decode_geometry(s, q.size(-2), k.size(1), k.size(3), k.size(2), q.dtype(), q.dtype(), o_dt,
                        mask_type, window_left, kDecodeOneShotArgs, op);
        decode_csr(s, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, std::nullopt, op);
        decode_q_layout(s, seq_len_q, qo_indptr, max_seq_len_q, op);
        check_causal(s, op,
                     "causal decode requires every per-request Q length to be no greater than "
                     "its K/V length; request ");
        s.planned = true;
        return decode_run(s, q, paged_kv_cache, bmm1_scale, bmm2_scale, out, op);
      },
      q, paged_kv_cache, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, seq_len_q,
      qo_indptr, max_seq_len_q, mask_type, window_left, kv_layout, bmm1_scale, bmm2_scale, out,
      out_dtype);
}

// ---- MLA decode ---------------------------------------------------------------------------------

namespace {

constexpr int64_t kLatent = 512, kRope = 64, kMlaDim = kLatent + kRope;

void mla_geometry(TsPlan& s, int64_t H, int64_t lora, int64_t rope, int64_t page_size, DType q,
                  DType kv, DType o, std::string_view mask, const GeoArgs& a, const char* op) {
  FLASHINFER_CHECK_CODE(lora == kLatent && rope == kRope, ErrorCode::kUnsupported, op,
                        "kv_lora_rank",
                        "attention-ts MLA decode currently requires kv_lora_rank=512 and "
                        "qk_rope_head_dim=64; got ",
                        lora, " and ", rope);
  FLASHINFER_CHECK(H > 0, op, a.heads, "num_heads must be positive");
  FLASHINFER_CHECK_CODE(q == kv, ErrorCode::kUnsupported, op, a.kv_dtype,
                        "attention-ts MLA decode requires query and KV cache to use the same "
                        "dtype; got ",
                        dt(q), " and ", dt(kv));
  FLASHINFER_CHECK_CODE(q == DType::kBFloat16 || q == DType::kFloat8E4M3FN, ErrorCode::kUnsupported,
                        op, a.q_dtype,
                        "attention-ts MLA decode supports BF16 and FP8-E4M3 input; got ", dt(q));
  FLASHINFER_CHECK_CODE(o == DType::kBFloat16, ErrorCode::kUnsupported, op, a.o_dtype,
                        "attention-ts MLA decode currently supports BF16 output only; got ", dt(o));
  FLASHINFER_CHECK_CODE(page_size == 16 || page_size == 32 || page_size == 64 || page_size == 128,
                        ErrorCode::kUnsupported, op, a.page,
                        "attention-ts decode requires page_size in (16, 32, 64, 128), got ",
                        page_size);
  s.causal = causal_of(mask, op, false);
  s.Hq = H, s.Hkv = 1, s.D = kMlaDim, s.Dv = kLatent, s.page_size = page_size;
  s.q_dtype = q, s.kv_dtype = kv, s.o_dtype = o;
}

// The block table [B, max_pages] int32 and seq_lens [B] int32: each request's pages are its row.
void mla_tables(TsPlan& s, const Tensor& block_tables, const Tensor& seq_lens,
                std::optional<int64_t> max_kv_len, const char* bound_arg, const char* op) {
  api::check_defined(block_tables, op, "block_tables");
  FLASHINFER_CHECK(block_tables.dim() == 2, op, "block_tables",
                   "block_tables must be rank 2, got rank ", block_tables.dim());
  FLASHINFER_CHECK(block_tables.dtype() == DType::kInt32, op, "block_tables",
                   "block_tables must have dtype torch.int32");
  const auto sl = ints1d(seq_lens, op, "seq_lens");
  s.batch = static_cast<int64_t>(sl.size());
  FLASHINFER_CHECK(s.batch > 0, op, "seq_lens", "seq_lens must contain at least one request");
  FLASHINFER_CHECK(block_tables.size(0) == s.batch, op, "block_tables",
                   "block_tables must have one row per request: expected ", s.batch, ", got ",
                   block_tables.size(0));
  int64_t longest = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    FLASHINFER_CHECK(sl[b] > 0, op, "seq_lens",
                     "every planned request must contain at least one KV token");
    longest = std::max(longest, sl[b]);
  }
  const int64_t bound = max_kv_len.value_or(longest);
  FLASHINFER_CHECK(longest <= bound, op, bound_arg,
                   "planned KV metadata contains a request longer than max_kv_len (", bound,
                   "): got ", longest);
  const int64_t cols = block_tables.size(1), need = (bound + s.page_size - 1) / s.page_size;
  FLASHINFER_CHECK(cols >= need, op, "block_tables",
                   "block_tables must have at least ceil(max_seq_len / page_size) columns (", need,
                   "), got ", cols);
  s.pages = api::host_ints(block_tables);
  s.page_indptr.resize(s.batch + 1);
  for (int64_t b = 0; b <= s.batch; ++b) s.page_indptr[b] = b * cols;
  s.kv_len = sl;
}

// MLA Q rows: fixed [B, SQ, H, 576] with SQ = seq_len_q (or max_seq_len_q), or packed.
void mla_q_layout(TsPlan& s, std::optional<int64_t> seq_len_q,
                  const std::optional<Tensor>& qo_indptr, std::optional<int64_t> max_seq_len_q,
                  const char* op) {
  if (qo_indptr && qo_indptr->defined()) {
    const auto qo = ints1d(*qo_indptr, op, "qo_indptr");
    FLASHINFER_CHECK(static_cast<int64_t>(qo.size()) == s.batch + 1, op, "qo_indptr",
                     "qo_indptr must contain batch_size + 1 cumulative offsets: expected ",
                     s.batch + 1, ", got ", qo.size());
    FLASHINFER_CHECK(qo[0] == 0, op, "qo_indptr", "qo_indptr must start at 0");
    packed_q_rows(s, qo, max_seq_len_q.value_or(seq_len_q.value_or(0)), op);
    return;
  }
  if (seq_len_q && max_seq_len_q) {
    FLASHINFER_CHECK(*seq_len_q == *max_seq_len_q, op, "max_seq_len_q",
                     "fixed query length must equal max_seq_len_q: got SQ=", *seq_len_q,
                     " and max_seq_len_q=", *max_seq_len_q);
  }
  s.seq_len_q = seq_len_q.value_or(max_seq_len_q.value_or(1));
  FLASHINFER_CHECK(s.seq_len_q > 0, op, "seq_len_q", "seq_len_q must be positive");
  fixed_q_rows(s);
}

Tensor mla_run(const TsPlan& s, const Tensor& query, const Tensor& kv_cache, double bmm1,
               double bmm2, std::optional<Tensor> out, const char* op) {
  FLASHINFER_CHECK(s.planned, op, "self", "plan() must be called before run()");
  api::check_defined(query, op, "query");
  api::check_defined(kv_cache, op, "kv_cache");
  FLASHINFER_CHECK(query.size(-1) == kMlaDim, op, "query", "query last dimension must be 576, got ",
                   query.size(-1));
  const Shape qs =
      s.packed ? Shape{s.total_q, s.Hq, kMlaDim} : Shape{s.batch, s.seq_len_q, s.Hq, kMlaDim};
  if (s.packed) {
    FLASHINFER_CHECK(query.dim() == 3 && query.size(0) == s.total_q, op, "query",
                     "packed query rows must match the final planned qo_indptr offset (", s.total_q,
                     "), got ", query.dim() == 3 ? query.size(0) : -1);
  }
  check_q(query, s, qs, op, "query");
  Tensor c = kv_cache;
  if (c.dim() == 4) {
    FLASHINFER_CHECK(c.size(1) == 1, op, "kv_cache",
                     "rank-4 kv_cache must have shape [num_pages, 1, page_size, 576]");
    c = c.select(1, 0);
  }
  FLASHINFER_CHECK(c.dim() == 3, op, "kv_cache",
                   "kv_cache must have shape [num_pages, page_size, 576] or [num_pages, 1, "
                   "page_size, 576]");
  FLASHINFER_CHECK(c.size(2) == kMlaDim, op, "kv_cache",
                   "kv_cache last dimension must be 576, got ", c.size(2));
  FLASHINFER_CHECK(c.size(1) == s.page_size, op, "kv_cache",
                   "kv_cache page size does not match the launch: expected ", s.page_size, ", got ",
                   c.size(1));
  FLASHINFER_CHECK(c.dtype() == s.kv_dtype, op, "kv_cache",
                   "attention-ts MLA decode requires query and KV cache to use the same dtype; "
                   "got ",
                   dt(query.dtype()), " and ", dt(c.dtype()));
  FLASHINFER_CHECK(c.stride(2) == 1 && c.stride(1) == kMlaDim, op, "kv_cache",
                   "kv_cache must be compact");
  api::check_same_device(c, query, op, "kv_cache", "query");
  check_pages(s, c.size(0), op, "block_tables");
  const Shape os =
      s.packed ? Shape{s.total_q, s.Hq, kLatent} : Shape{s.batch, s.seq_len_q, s.Hq, kLatent};
  Tensor o = out_for(out, os, s.o_dtype, query.device(), op);
  TsAttentionParams p;
  p.q = query.data_ptr(), p.q_row_stride = s.Hq * kMlaDim, p.q_head_stride = kMlaDim;
  p.o = o.data_ptr(), p.o_row_stride = s.Hq * kLatent, p.o_head_stride = kLatent;
  p.k = p.v = c.data_ptr();
  p.k_page_stride = p.v_page_stride = c.stride(0);
  p.k_slot_stride = p.v_slot_stride = c.stride(1);
  p.bmm1_scale = scale_of(bmm1, op, "bmm1_scale");
  p.bmm2_scale = scale_of(bmm2, op, "bmm2_scale");
  run_reference(s, p, query.device(), op);
  return o;
}

void mla_check_causal(const TsPlan& s, const char* op) {
  check_causal(s, op,
               "causal MLA decode requires every per-request Q length to be no greater than its "
               "K/V length; request ");
}

int64_t kv_page_size(const Tensor& kv_cache, const char* op) {
  api::check_defined(kv_cache, op, "kv_cache");
  FLASHINFER_CHECK(kv_cache.dim() == 3 || kv_cache.dim() == 4, op, "kv_cache",
                   "kv_cache must have shape [num_pages, page_size, 576] or [num_pages, 1, "
                   "page_size, 576]");
  return kv_cache.size(-2);
}

}  // namespace

Tensor prims_ts_batch_decode_with_kv_cache_mla(
    const Tensor& query, const Tensor& kv_cache, const Tensor& workspace_buffer,
    int64_t kv_lora_rank, int64_t qk_rope_head_dim, const Tensor& block_tables,
    const Tensor& seq_lens, int64_t max_seq_len, std::optional<Tensor> qo_indptr,
    std::optional<int64_t> max_seq_len_q, std::optional<Tensor> out, double bmm1_scale,
    double bmm2_scale, std::string mask_type, DType out_dtype) {
  return call_op<&prims_ts_batch_decode_with_kv_cache_mla>(
      [&] {
        const char* op = "prims_ts_batch_decode_with_kv_cache_mla";
        need_rank34(query, op, "query");
        check_workspace_dtype(workspace_buffer, op);
        TsPlan s;
        mla_geometry(s, query.size(-2), kv_lora_rank, qk_rope_head_dim, kv_page_size(kv_cache, op),
                     query.dtype(), kv_cache.dtype(), out_dtype, mask_type, kStandaloneArgs, op);
        FLASHINFER_CHECK(max_seq_len > 0, op, "max_seq_len", "max_seq_len must be positive");
        mla_tables(s, block_tables, seq_lens, max_seq_len, "max_seq_len", op);
        const bool packed = qo_indptr && qo_indptr->defined();
        FLASHINFER_CHECK(!packed || max_seq_len_q, op, "max_seq_len_q",
                         "max_seq_len_q is required when qo_indptr selects packed query");
        mla_q_layout(
            s, packed ? std::nullopt : std::optional<int64_t>(query.dim() == 4 ? query.size(1) : 1),
            qo_indptr, max_seq_len_q, op);
        mla_check_causal(s, op);
        s.planned = true;
        return mla_run(s, query, kv_cache, bmm1_scale, bmm2_scale, out, op);
      },
      query, kv_cache, workspace_buffer, kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens,
      max_seq_len, qo_indptr, max_seq_len_q, out, bmm1_scale, bmm2_scale, mask_type, out_dtype);
}

using MlaTsInit = Init<BatchMLADecodePagedTSWrapper>;

BatchMLADecodePagedTSWrapper::BatchMLADecodePagedTSWrapper() : s_(std::make_unique<TsPlan>()) {
  call_init<MlaTsInit>([] {}, *this);
}
BatchMLADecodePagedTSWrapper::~BatchMLADecodePagedTSWrapper() = default;

void BatchMLADecodePagedTSWrapper::plan(const Tensor& block_tables, const Tensor& seq_lens,
                                        int64_t num_heads, int64_t kv_lora_rank,
                                        int64_t qk_rope_head_dim, int64_t page_size,
                                        std::optional<int64_t> seq_len_q,
                                        std::optional<Tensor> qo_indptr,
                                        std::optional<int64_t> max_seq_len_q, DType q_data_type,
                                        std::optional<DType> kv_data_type, DType o_data_type,
                                        std::string mask_type, std::optional<int64_t> max_kv_len) {
  call_op<&BatchMLADecodePagedTSWrapper::plan>(
      [&] {
        const char* op = "BatchMLADecodePagedTSWrapper.plan";
        TsPlan s;
        mla_geometry(s, num_heads, kv_lora_rank, qk_rope_head_dim, page_size, q_data_type,
                     kv_data_type.value_or(q_data_type), o_data_type, mask_type, kMlaPlanArgs, op);
        mla_tables(s, block_tables, seq_lens, max_kv_len, "max_kv_len", op);
        mla_q_layout(s, seq_len_q, qo_indptr, max_seq_len_q, op);
        mla_check_causal(s, op);
        s.device = block_tables.device();
        check_arch(op, "block_tables", s.device);
        s.planned = true;
        *s_ = std::move(s);
      },
      *this, block_tables, seq_lens, num_heads, kv_lora_rank, qk_rope_head_dim, page_size,
      seq_len_q, qo_indptr, max_seq_len_q, q_data_type, kv_data_type, o_data_type, mask_type,
      max_kv_len);
}

Tensor BatchMLADecodePagedTSWrapper::run(const Tensor& query, const Tensor& kv_cache,
                                         double bmm1_scale, double bmm2_scale,
                                         std::optional<Tensor> out) {
  return call_op<&BatchMLADecodePagedTSWrapper::run>(
      [&] {
        return mla_run(*s_, query, kv_cache, bmm1_scale, bmm2_scale, out,
                       "BatchMLADecodePagedTSWrapper.run");
      },
      *this, query, kv_cache, bmm1_scale, bmm2_scale, out);
}

Tensor batch_decode_mla_with_paged_kv_cache(
    const Tensor& query, const Tensor& kv_cache, const Tensor& block_tables, const Tensor& seq_lens,
    std::optional<Tensor> qo_indptr, std::optional<int64_t> max_seq_len_q, int64_t kv_lora_rank,
    int64_t qk_rope_head_dim, std::string mask_type, std::optional<int64_t> max_kv_len,
    double bmm1_scale, double bmm2_scale, std::optional<Tensor> out, DType out_dtype) {
  return call_op<&batch_decode_mla_with_paged_kv_cache>(
      [&] {
        const char* op = "batch_decode_mla_with_paged_kv_cache";
        need_rank34(query, op, "query");
        TsPlan s;
        mla_geometry(s, query.size(-2), kv_lora_rank, qk_rope_head_dim, kv_page_size(kv_cache, op),
                     query.dtype(), kv_cache.dtype(), out_dtype, mask_type, kStandaloneArgs, op);
        mla_tables(s, block_tables, seq_lens, max_kv_len, "max_kv_len", op);
        const bool packed = qo_indptr && qo_indptr->defined();
        mla_q_layout(
            s, packed ? std::nullopt : std::optional<int64_t>(query.dim() == 4 ? query.size(1) : 1),
            qo_indptr, max_seq_len_q, op);
        mla_check_causal(s, op);
        s.planned = true;
        return mla_run(s, query, kv_cache, bmm1_scale, bmm2_scale, out, op);
      },
      query, kv_cache, block_tables, seq_lens, qo_indptr, max_seq_len_q, kv_lora_rank,
      qk_rope_head_dim, mask_type, max_kv_len, bmm1_scale, bmm2_scale, out, out_dtype);
}

// ---- context ------------------------------------------------------------------------------------

namespace {

// kn / vn: the K and V arguments' names ("k" / "v", or the paged "k_cache" / "v_cache").
void context_geometry(TsPlan& s, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dk, DType q, DType k,
                      DType v, std::optional<DType> o, std::string_view mask, int64_t window_left,
                      const char* kn, const char* vn, const char* op) {
  for (const auto& [d, arg] : {std::pair<DType, const char*>{q, "q"}, {k, kn}, {v, vn}}) {
    FLASHINFER_CHECK_CODE(
        d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kFloat8E4M3FN,
        ErrorCode::kUnsupported, op, arg,
        "attention-ts context supports torch.float16, torch.bfloat16, and "
        "torch.float8_e4m3fn; got ",
        dt(d));
  }
  FLASHINFER_CHECK_CODE(q == k && q == v, ErrorCode::kUnsupported, op, q != k ? kn : vn,
                        "attention-ts context requires Q, K, and V to use the same dtype; got Q ",
                        dt(q), ", K ", dt(k), ", and V ", dt(v));
  const DType od = o.value_or(q);
  FLASHINFER_CHECK_CODE(
      od == DType::kFloat16 || od == DType::kBFloat16 || od == DType::kFloat8E4M3FN,
      ErrorCode::kUnsupported, op, "out_dtype",
      "attention-ts context supports torch.float16, torch.bfloat16, and torch.float8_e4m3fn; "
      "got ",
      dt(od));
  FLASHINFER_CHECK(D == Dk, op, kn, "Q and K/V head dimensions must match; got Q ", D, " and K/V ",
                   Dk);
  FLASHINFER_CHECK_CODE(D == 128 || D == 256, ErrorCode::kUnsupported, op, "q",
                        "attention-ts context supports head_dim in (128, 256); got ", D);
  FLASHINFER_CHECK(Hq > 0 && Hkv > 0, op, "q", "Q and KV head counts must be positive");
  FLASHINFER_CHECK(Hq % Hkv == 0, op, kn,
                   "the Q head count must be divisible by the KV head count; got ", Hq, " and ",
                   Hkv);
  s.causal = causal_of(mask, op, true);
  FLASHINFER_CHECK(window_left != 0, op, "window_left",
                   "window_left=0 is unsupported; use -1 to disable the window");
  FLASHINFER_CHECK(window_left >= -1, op, "window_left",
                   "window_left must be -1 (disabled) or positive");
  FLASHINFER_CHECK(window_left <= int64_t{kInt32Max} - 1, op, "window_left",
                   "window_left must be no larger than 2147483646");
  if (window_left > 0) {
    FLASHINFER_CHECK(s.causal, op, "window_left",
                     "a positive window_left requires mask_type='causal'");
    const int64_t r = Hq / Hkv;
    FLASHINFER_CHECK_CODE(r > 1 && r % 2 == 0, ErrorCode::kUnsupported, op, "window_left",
                          "a positive left window requires grouped-query attention with an even "
                          "Hq/Hkv ratio greater than one; got ",
                          r);
  }
  s.Hq = Hq, s.Hkv = Hkv, s.D = s.Dv = D, s.window_left = window_left;
  s.q_dtype = q, s.kv_dtype = k, s.o_dtype = od;
}

void context_check_causal(const TsPlan& s, const char* op) {
  if (!s.causal) return;
  for (int64_t b = 0; b < s.batch; ++b) {
    FLASHINFER_CHECK(s.q_len[b] <= s.kv_len[b], op, "mask_type",
                     "bottom-right causal context requires Sq <= Sk for each request; got batch ",
                     b, ": Sq=", s.q_len[b], ", Sk=", s.kv_len[b]);
  }
}

// A packed layout's indptr (context rules): int32, at least 2 entries, from 0, strictly
// increasing, ending at the tensor's extent.
std::vector<int64_t> context_indptr(const Tensor& t, int64_t extent, const char* op,
                                    const char* arg) {
  const auto v = ints1d(t, op, arg);
  FLASHINFER_CHECK(v.size() >= 2, op, arg, arg, " must contain at least start and end offsets");
  FLASHINFER_CHECK(v[0] == 0, op, arg, arg, " must start at 0");
  FLASHINFER_CHECK(v.back() == extent, op, arg, "the final ", arg,
                   " offset must equal the packed tensor extent; expected ", extent, ", got ",
                   v.back());
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    FLASHINFER_CHECK(v[i + 1] > v[i], op, arg, arg, " offsets must be strictly increasing");
  }
  return v;
}

// Fixed [B, S, H, D] or packed [total, H, D] q / k / v: the plan's layout. K / V as pages: one page
// of Sk tokens a request (fixed), or one token a page (packed).
void context_layout(TsPlan& s, const Tensor& q, const Tensor& k, const Tensor& v,
                    const std::optional<Tensor>& qo_indptr, const std::optional<Tensor>& kv_indptr,
                    const char* op) {
  for (const auto& [t, name] :
       {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}, {v, "v"}}) {
    api::check_defined(t, op, name);
    FLASHINFER_CHECK(t.is_contiguous(), op, name, name, " must have compact strides");
  }
  FLASHINFER_CHECK(v.shape() == k.shape(), op, "v", "v must have the same shape as k");
  api::check_same_device(k, q, op, "k", "q");
  api::check_same_device(v, q, op, "v", "q");
  const bool has_q = qo_indptr && qo_indptr->defined(), has_k = kv_indptr && kv_indptr->defined();
  FLASHINFER_CHECK(has_q == has_k, op, has_q ? "kv_indptr" : "qo_indptr",
                   "qo_indptr and kv_indptr must be provided together");
  if (!has_q) {
    FLASHINFER_CHECK(q.dim() == 4 && k.dim() == 4, op, "q",
                     "fixed Q/K/V must use [B, S, H, D] storage; got q rank ", q.dim(),
                     " and k rank ", k.dim());
    FLASHINFER_CHECK(q.size(0) == k.size(0), op, "k", "q and k batch dimensions must match");
    s.batch = q.size(0), s.seq_len_q = q.size(1);
    FLASHINFER_CHECK(s.batch > 0 && s.seq_len_q > 0 && k.size(1) > 0, op, "q",
                     "fixed Q/K/V must hold at least one request, query and key");
    fixed_q_rows(s);
    s.kv_len.assign(s.batch, k.size(1));
    s.page_size = k.size(1);
    s.page_indptr.resize(s.batch + 1), s.pages.resize(s.batch);
    for (int64_t b = 0; b <= s.batch; ++b) s.page_indptr[b] = b;
    for (int64_t b = 0; b < s.batch; ++b) s.pages[b] = b;
  } else {
    FLASHINFER_CHECK(q.dim() == 3 && k.dim() == 3, op, "q",
                     "packed Q/K/V must use [total, H, D] storage; got q rank ", q.dim(),
                     " and k rank ", k.dim());
    const auto qo = context_indptr(*qo_indptr, q.size(0), op, "qo_indptr");
    const auto kvp = context_indptr(*kv_indptr, k.size(0), op, "kv_indptr");
    FLASHINFER_CHECK(qo.size() == kvp.size(), op, "kv_indptr",
                     "qo_indptr and kv_indptr must describe the same batch; got ", qo.size() - 1,
                     " and ", kvp.size() - 1, " rows");
    s.batch = static_cast<int64_t>(qo.size()) - 1;
    packed_q_rows(s, qo, 0, op);
    s.page_size = 1;
    s.kv_len.resize(s.batch);
    for (int64_t b = 0; b < s.batch; ++b) s.kv_len[b] = kvp[b + 1] - kvp[b];
    s.page_indptr = kvp;
    s.pages.resize(static_cast<std::size_t>(k.size(0)));
    for (int64_t t = 0; t < k.size(0); ++t) s.pages[t] = t;
  }
  s.q_shape = q.shape(), s.k_shape = k.shape();
}

// The run: q / k / v (fixed or packed) or the paged caches against the plan.
Tensor context_run(const TsPlan& s, const Tensor& q, const Tensor& k, const Tensor& v,
                   std::optional<Tensor> out, bool paged, const char* op) {
  FLASHINFER_CHECK(s.planned, op, "self", "plan() must be called before run()");
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{q, "q"},
                                {k, paged ? "k_cache" : "k"},
                                {v, paged ? "v_cache" : "v"}}) {
    api::check_defined(t, op, name);
  }
  FLASHINFER_CHECK(q.shape() == s.q_shape, op, "q", "q must have shape ",
                   shape_to_string(s.q_shape), ", got ", shape_to_string(q.shape()));
  FLASHINFER_CHECK(k.shape() == s.k_shape, op, paged ? "k_cache" : "k", "k must have shape ",
                   shape_to_string(s.k_shape), ", got ", shape_to_string(k.shape()));
  FLASHINFER_CHECK(v.shape() == k.shape(), op, paged ? "v_cache" : "v",
                   "v must have the same shape as k");
  FLASHINFER_CHECK(q.dtype() == s.q_dtype && k.dtype() == s.kv_dtype && v.dtype() == s.kv_dtype, op,
                   "q", "q, k and v must have the planned dtype ", dt(s.q_dtype));
  api::check_same_device(k, q, op, paged ? "k_cache" : "k", "q");
  api::check_same_device(v, q, op, paged ? "v_cache" : "v", "q");
  FLASHINFER_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), op, "q",
                   "q, k and v must have compact strides");
  if (paged) check_pages(s, k.size(0), op, "paged_kv_indices");
  Tensor o = out_for(out, q.shape(), s.o_dtype, q.device(), op);
  TsAttentionParams p;
  const int64_t row = s.Hq * s.D;
  p.q = q.data_ptr(), p.q_row_stride = row, p.q_head_stride = s.D;
  p.o = o.data_ptr(), p.o_row_stride = row, p.o_head_stride = s.D;
  p.k = k.data_ptr(), p.v = v.data_ptr();
  if (paged) {  // [pages, Hkv, page_size, D]
    p.k_page_stride = p.v_page_stride = k.stride(0);
    p.k_head_stride = p.v_head_stride = k.stride(1);
    p.k_slot_stride = p.v_slot_stride = k.stride(2);
  } else if (!s.packed) {  // [B, Sk, Hkv, D]: a page a request
    p.k_page_stride = p.v_page_stride = k.stride(0);
    p.k_slot_stride = p.v_slot_stride = k.stride(1);
    p.k_head_stride = p.v_head_stride = k.stride(2);
  } else {  // [total_k, Hkv, D]: a page a token
    p.k_page_stride = p.v_page_stride = k.stride(0);
    p.k_head_stride = p.v_head_stride = k.stride(1);
  }
  p.bmm1_scale = s.scale1, p.bmm2_scale = s.scale2;
  run_reference(s, p, q.device(), op);
  return o;
}

void context_scales(TsPlan& s, std::optional<double> sm_scale, double output_scale,
                    const char* op) {
  s.scale1 = scale_of(sm_scale.value_or(1.0 / std::sqrt(static_cast<double>(s.D))), op, "sm_scale");
  s.scale2 = scale_of(output_scale, op, "output_scale");
}

// The paged plan: q packed by qo_indptr, HND caches, the CSR with last_page_len.
TsPlan paged_context_plan(const Tensor& q, const Tensor& kc, const Tensor& vc,
                          const Tensor& qo_indptr, const Tensor& indptr, const Tensor& indices,
                          const Tensor& last, int64_t page_size, std::string_view mask,
                          int64_t window_left, std::optional<double> sm_scale, double output_scale,
                          std::optional<DType> out_dtype, const char* op) {
  TsPlan s;
  api::check_defined(q, op, "q");
  api::check_defined(kc, op, "k_cache");
  api::check_defined(vc, op, "v_cache");
  FLASHINFER_CHECK(q.dim() == 3, op, "q",
                   "paged context Q must use packed [total_q, Hq, D] storage; got rank ", q.dim());
  FLASHINFER_CHECK(kc.dim() == 4 && vc.shape() == kc.shape(), op, "k_cache",
                   "paged K/V caches must use [num_pages, Hkv, page_size, D] storage");
  FLASHINFER_CHECK_CODE(page_size == 16 || page_size == 32 || page_size == 64 || page_size == 128,
                        ErrorCode::kUnsupported, op, "page_size",
                        "attention-ts paged context supports page_size in (16, 32, 64, 128); got ",
                        page_size);
  FLASHINFER_CHECK(kc.size(2) == page_size, op, "k_cache",
                   "K/V cache page extent must equal page_size=", page_size, "; got ", kc.size(2));
  context_geometry(s, q.size(1), kc.size(1), q.size(2), kc.size(3), q.dtype(), kc.dtype(),
                   vc.dtype(), out_dtype, mask, window_left, "k_cache", "v_cache", op);
  FLASHINFER_CHECK_CODE(mask != "variable_window", ErrorCode::kUnsupported, op, "mask_type",
                        "mask_type='variable_window' is not supported for paged context");
  const auto qo = context_indptr(qo_indptr, q.size(0), op, "qo_indptr");
  s.batch = static_cast<int64_t>(qo.size()) - 1;
  packed_q_rows(s, qo, 0, op);
  const auto ip = ints1d(indptr, op, "paged_kv_indptr");
  FLASHINFER_CHECK(ip.size() == qo.size(), op, "paged_kv_indptr",
                   "paged_kv_indptr and qo_indptr must describe the same batch");
  const auto lp = ints1d(last, op, "paged_kv_last_page_len");
  s.pages = ints1d(indices, op, "paged_kv_indices");
  s.page_size = page_size;
  check_csr(ip, s.batch, static_cast<int64_t>(s.pages.size()), op);
  FLASHINFER_CHECK(static_cast<int64_t>(lp.size()) == s.batch, op, "paged_kv_last_page_len",
                   "paged_kv_last_page_len must have one entry per request");
  for (std::size_t i = 0; i < s.pages.size(); ++i) {
    FLASHINFER_CHECK(s.pages[i] >= 0 && s.pages[i] < kc.size(0), op, "paged_kv_indices",
                     "paged_kv_indices entries must index the physical page pool; entry ", i,
                     " is ", s.pages[i], ", pool has ", kc.size(0), " pages");
  }
  s.page_indptr = ip;
  s.kv_len.resize(s.batch);
  for (int64_t b = 0; b < s.batch; ++b) {
    FLASHINFER_CHECK(lp[b] >= 1 && lp[b] <= page_size, op, "paged_kv_last_page_len",
                     "paged_kv_last_page_len entries must be in [1, page_size]; batch ", b, " has ",
                     lp[b]);
    s.kv_len[b] = (ip[b + 1] - ip[b] - 1) * page_size + lp[b];
  }
  context_check_causal(s, op);
  context_scales(s, sm_scale, output_scale, op);
  s.q_shape = q.shape(), s.k_shape = kc.shape();
  s.device = q.device();
  check_arch(op, "q", s.device);
  s.planned = true;
  return s;
}

TsPlan context_plan(const Tensor& q, const Tensor& k, const Tensor& v,
                    const std::optional<Tensor>& qo_indptr, const std::optional<Tensor>& kv_indptr,
                    std::string_view mask, int64_t window_left, std::optional<double> sm_scale,
                    double output_scale, std::optional<DType> out_dtype, const char* op) {
  TsPlan s;
  need_rank34(q, op, "q");
  need_rank34(k, op, "k");
  need_rank34(v, op, "v");
  context_geometry(s, q.size(-2), k.size(-2), q.size(-1), k.size(-1), q.dtype(), k.dtype(),
                   v.dtype(), out_dtype, mask, window_left, "k", "v", op);
  FLASHINFER_CHECK_CODE(mask != "variable_window", ErrorCode::kUnsupported, op, "mask_type",
                        "mask_type='variable_window' is not implemented in flashinfer-cpp");
  context_layout(s, q, k, v, qo_indptr, kv_indptr, op);
  context_check_causal(s, op);
  context_scales(s, sm_scale, output_scale, op);
  s.device = q.device();
  check_arch(op, "q", s.device);
  s.planned = true;
  return s;
}

}  // namespace

using PrefillTsInit = Init<BatchPrefillTSWrapper>;

BatchPrefillTSWrapper::BatchPrefillTSWrapper() : s_(std::make_unique<TsPlan>()) {
  call_init<PrefillTsInit>([] {}, *this);
}
BatchPrefillTSWrapper::~BatchPrefillTSWrapper() = default;

void BatchPrefillTSWrapper::plan(const Tensor& q, const Tensor& k, const Tensor& v,
                                 std::optional<Tensor> qo_indptr, std::optional<Tensor> kv_indptr,
                                 std::string mask_type, int64_t window_left,
                                 std::optional<double> sm_scale, double output_scale,
                                 std::optional<DType> out_dtype) {
  call_op<&BatchPrefillTSWrapper::plan>(
      [&] {
        *s_ = context_plan(q, k, v, qo_indptr, kv_indptr, mask_type, window_left, sm_scale,
                           output_scale, out_dtype, "BatchPrefillTSWrapper.plan");
      },
      *this, q, k, v, qo_indptr, kv_indptr, mask_type, window_left, sm_scale, output_scale,
      out_dtype);
}

Tensor BatchPrefillTSWrapper::run(const Tensor& q, const Tensor& k, const Tensor& v,
                                  std::optional<Tensor> out) {
  return call_op<&BatchPrefillTSWrapper::run>(
      [&] { return context_run(*s_, q, k, v, out, false, "BatchPrefillTSWrapper.run"); }, *this, q,
      k, v, out);
}

using PrefillPagedTsInit = Init<BatchPrefillPagedTSWrapper, std::string>;

BatchPrefillPagedTSWrapper::BatchPrefillPagedTSWrapper(std::string kv_layout)
    : s_(std::make_unique<TsPlan>()) {
  call_init<PrefillPagedTsInit>(
      [&] {
        FLASHINFER_CHECK_CODE(kv_layout == "HND", ErrorCode::kUnsupported,
                              "BatchPrefillPagedTSWrapper.__init__", "kv_layout",
                              "attention-ts paged context supports only kv_layout='HND'; got ",
                              quoted(kv_layout));
      },
      *this, kv_layout);
}
BatchPrefillPagedTSWrapper::~BatchPrefillPagedTSWrapper() = default;

void BatchPrefillPagedTSWrapper::plan(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                      const Tensor& qo_indptr, const Tensor& paged_kv_indptr,
                                      const Tensor& paged_kv_indices,
                                      const Tensor& paged_kv_last_page_len, int64_t page_size,
                                      std::string mask_type, int64_t window_left,
                                      std::optional<double> sm_scale, double output_scale,
                                      std::optional<DType> out_dtype) {
  call_op<&BatchPrefillPagedTSWrapper::plan>(
      [&] {
        *s_ =
            paged_context_plan(q, k_cache, v_cache, qo_indptr, paged_kv_indptr, paged_kv_indices,
                               paged_kv_last_page_len, page_size, mask_type, window_left, sm_scale,
                               output_scale, out_dtype, "BatchPrefillPagedTSWrapper.plan");
      },
      *this, q, k_cache, v_cache, qo_indptr, paged_kv_indptr, paged_kv_indices,
      paged_kv_last_page_len, page_size, mask_type, window_left, sm_scale, output_scale, out_dtype);
}

Tensor BatchPrefillPagedTSWrapper::run(const Tensor& q, const Tensor& k_cache,
                                       const Tensor& v_cache, std::optional<Tensor> out) {
  return call_op<&BatchPrefillPagedTSWrapper::run>(
      [&] {
        return context_run(*s_, q, k_cache, v_cache, out, true, "BatchPrefillPagedTSWrapper.run");
      },
      *this, q, k_cache, v_cache, out);
}

Tensor batch_prefill(const Tensor& q, const Tensor& k, const Tensor& v,
                     std::optional<Tensor> qo_indptr, std::optional<Tensor> kv_indptr,
                     std::string mask_type, int64_t window_left, std::optional<double> sm_scale,
                     double output_scale, std::optional<DType> out_dtype,
                     std::optional<Tensor> out) {
  return call_op<&batch_prefill>(
      [&] {
        const char* op = "batch_prefill";
        const auto od =
            out_dtype ? out_dtype
                      : (out && out->defined() ? std::optional<DType>(out->dtype()) : std::nullopt);
        const TsPlan s = context_plan(q, k, v, qo_indptr, kv_indptr, mask_type, window_left,
                                      sm_scale, output_scale, od, op);
        return context_run(s, q, k, v, out, false, op);
      },
      q, k, v, qo_indptr, kv_indptr, mask_type, window_left, sm_scale, output_scale, out_dtype,
      out);
}

Tensor batch_prefill_with_paged_kv_cache(
    const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& qo_indptr,
    const Tensor& paged_kv_indptr, const Tensor& paged_kv_indices,
    const Tensor& paged_kv_last_page_len, int64_t page_size, std::string kv_layout,
    std::string mask_type, int64_t window_left, std::optional<double> sm_scale, double output_scale,
    std::optional<DType> out_dtype, std::optional<Tensor> out) {
  return call_op<&batch_prefill_with_paged_kv_cache>(
      [&] {
        const char* op = "batch_prefill_with_paged_kv_cache";
        FLASHINFER_CHECK_CODE(kv_layout == "HND", ErrorCode::kUnsupported, op, "kv_layout",
                              "attention-ts paged context supports only kv_layout='HND'; got ",
                              quoted(kv_layout));
        const auto od =
            out_dtype ? out_dtype
                      : (out && out->defined() ? std::optional<DType>(out->dtype()) : std::nullopt);
        const TsPlan s = paged_context_plan(q, k_cache, v_cache, qo_indptr, paged_kv_indptr,
                                            paged_kv_indices, paged_kv_last_page_len, page_size,
                                            mask_type, window_left, sm_scale, output_scale, od, op);
        return context_run(s, q, k_cache, v_cache, out, true, op);
      },
      q, k_cache, v_cache, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
      page_size, kv_layout, mask_type, window_left, sm_scale, output_scale, out_dtype, out);
}

// ---- block-sparse -------------------------------------------------------------------------------

namespace {

// The static profile: head_dim 128, fp16 / bf16 throughout, a power-of-two GQA ratio up to 32, a
// Q block some row-pure Q tile covers, a supported KV block.
// The parameters a static-profile check blames: a plan's own, or the tensors a one-shot form
// reads the profile from.
struct SparseArgs {
  const char *head_dim, *q_dtype, *kv_dtype, *o_dtype, *heads, *sq, *skv;
};
constexpr SparseArgs kSparsePlanArgs{"head_dim",     "q_data_type", "kv_data_type", "o_data_type",
                                     "num_qo_heads", "seq_len_q",   "seq_len_kv"};
constexpr SparseArgs kSparseFlatArgs{"q", "q", "k", "out", "q", "q", "k"};
constexpr SparseArgs kSparsePagedArgs{"q", "q", "paged_kv_cache", "out", "q", "q", "seq_len_kv"};

void sparse_geometry(TsPlan& s, int64_t Sq, int64_t Skv, int64_t Hq, int64_t Hkv, int64_t D,
                     int64_t qbs, int64_t kvbs, int64_t max_blocks, std::string_view mask, DType q,
                     DType kv, DType o, const SparseArgs& a, const char* op) {
  FLASHINFER_CHECK(D == 128, op, a.head_dim, "block-sparse requires head_dim=128");
  FLASHINFER_CHECK(q == kv && q == o, op, q != kv ? a.kv_dtype : a.o_dtype,
                   "block-sparse requires matching Q, K/V, and output dtypes");
  FLASHINFER_CHECK_CODE(q == DType::kFloat16 || q == DType::kBFloat16, ErrorCode::kUnsupported, op,
                        a.q_dtype, "block-sparse supports only torch.float16 and torch.bfloat16");
  FLASHINFER_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0, op, a.heads,
                   "num_qo_heads must be divisible by num_kv_heads");
  const int64_t r = Hq / Hkv;
  FLASHINFER_CHECK(r <= 32, op, a.heads, "block-sparse supports at most 32 Q heads per KV head");
  FLASHINFER_CHECK((r & (r - 1)) == 0, op, a.heads, "Q heads per KV head must be a power of two");
  FLASHINFER_CHECK(qbs > 0 && qbs <= kInt32Max, op, "q_block_size",
                   "q_block_size must be a positive Python integer, got ", qbs);
  // A Q tile of t rows is row-pure when it holds whole q blocks of the GQA group. (Upstream also
  // limits fine KV blocks to tiles of at most 32 rows; the smallest row-pure tile is always
  // one of those, since each larger tile needs more divisibility, so that rule refuses nothing.)
  bool pure = false;
  for (int64_t t : {8, 16, 32, 64, 128}) pure = pure || (t % r == 0 && qbs % (t / r) == 0);
  FLASHINFER_CHECK(pure, op, "q_block_size", "block-sparse Q geometry has no row-pure Q tile");
  FLASHINFER_CHECK(kvbs == 8 || kvbs == 16 || kvbs == 32 || (kvbs > 0 && kvbs % 64 == 0), op,
                   "kv_block_size",
                   "kv_block_size must be 8, 16, 32, or a positive multiple of 64");
  FLASHINFER_CHECK(kvbs <= kInt32Max, op, "kv_block_size",
                   "kv_block_size must fit in signed int32");
  FLASHINFER_CHECK(Sq > 0, op, a.sq, "seq_len_q must be positive");
  FLASHINFER_CHECK(Skv > 0, op, a.skv, "seq_len_kv must be positive");
  s.causal = causal_of(mask, op, false);
  FLASHINFER_CHECK(!s.causal || Sq <= Skv, op, "mask_type",
                   "causal block-sparse requires seq_len_q <= seq_len_kv");
  const int64_t nkb = (Skv + kvbs - 1) / kvbs;
  FLASHINFER_CHECK(max_blocks >= 0, op, "max_blocks_per_row",
                   "max_blocks_per_row must be non-negative");
  FLASHINFER_CHECK(max_blocks <= nkb, op, "max_blocks_per_row",
                   "max_blocks_per_row cannot exceed the number of semantic KV blocks (", nkb, ")");
  s.Hq = Hq, s.Hkv = Hkv, s.D = s.Dv = D, s.seq_len_q = Sq, s.seq_len_kv = Skv;
  s.q_block_size = qbs, s.kv_block_size = kvbs, s.max_blocks_per_row = max_blocks;
  s.q_dtype = q, s.kv_dtype = kv, s.o_dtype = o;
}

// The BSR of a run: per row (b, g, q block) its [begin, end) in block_indices. A row whose
// offsets or ids are not valid (ids strictly increasing, inside the request's live keys, at most
// max_blocks_per_row) is empty (upstream fails it closed: zeros); `strict` (the one-shot
// functions, which inspect the BSR first) raises instead.
struct Bsr {
  std::vector<int64_t> begin, end, ids;
};
Bsr load_bsr(const TsPlan& s, const Tensor& block_indptr, const Tensor& block_indices,
             int64_t max_blocks, bool strict, const char* op) {
  const int64_t nqb = (s.seq_len_q + s.q_block_size - 1) / s.q_block_size;
  api::check_defined(block_indptr, op, "block_indptr");
  FLASHINFER_CHECK(block_indptr.dtype() == DType::kInt32, op, "block_indptr",
                   "block_indptr must have dtype torch.int32");
  const Shape want{s.batch, s.Hkv, nqb + 1};
  FLASHINFER_CHECK(block_indptr.shape() == want, op, "block_indptr",
                   "block_indptr must have shape ", shape_to_string(want), ", got ",
                   shape_to_string(block_indptr.shape()));
  Bsr r;
  r.ids = ints1d(block_indices, op, "block_indices");
  const auto ip = api::host_ints(block_indptr);
  const auto n = static_cast<int64_t>(r.ids.size());
  const int64_t rows = s.batch * s.Hkv * nqb;
  r.begin.assign(rows, 0), r.end.assign(rows, 0);
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t live = s.kv_len[b];
    for (int64_t g = 0; g < s.Hkv; ++g) {
      for (int64_t qb = 0; qb < nqb; ++qb) {
        const int64_t at = (b * s.Hkv + g) * (nqb + 1) + qb;
        const int64_t lo = ip[at], hi = ip[at + 1];
        bool ok = lo >= 0 && lo <= hi && hi <= n && hi - lo <= max_blocks;
        for (int64_t j = lo; ok && j < hi; ++j) {
          ok = r.ids[j] >= 0 && r.ids[j] * s.kv_block_size < live &&
               (j == lo || r.ids[j] > r.ids[j - 1]);
        }
        FLASHINFER_CHECK(ok || !strict, op, "block_indices", "block row (batch ", b, ", kv head ",
                         g, ", q block ", qb, ") is not a valid row: offsets [", lo, ", ", hi,
                         ") must lie in block_indices (", n,
                         " ids) and its ids be strictly increasing KV blocks that start inside "
                         "the request's ",
                         live, " keys");
        const int64_t row = (b * s.Hkv + g) * nqb + qb;
        if (ok) r.begin[row] = lo, r.end[row] = hi;
      }
    }
  }
  return r;
}

// The largest row of a BSR (the one-shot functions' max_blocks_per_row).
int64_t largest_row(const Tensor& block_indptr, const char* op) {
  api::check_defined(block_indptr, op, "block_indptr");
  FLASHINFER_CHECK(block_indptr.dtype() == DType::kInt32, op, "block_indptr",
                   "block_indptr must have dtype torch.int32");
  FLASHINFER_CHECK(block_indptr.dim() == 3 && block_indptr.size(2) >= 2, op, "block_indptr",
                   "block_indptr must be [B, Hkv, num_q_blocks + 1], got ",
                   shape_to_string(block_indptr.shape()));
  const auto ip = api::host_ints(block_indptr);
  int64_t m = 0;
  const int64_t w = block_indptr.size(2);
  for (std::size_t i = 0; i + 1 < ip.size(); ++i) {
    if ((static_cast<int64_t>(i) + 1) % w != 0) m = std::max(m, ip[i + 1] - ip[i]);
  }
  return m;
}

Tensor sparse_run(const TsPlan& s, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& block_indptr, const Tensor& block_indices,
                  const std::optional<Tensor>& kv_valid_bits, std::optional<double> sm_scale,
                  std::optional<Tensor> out, bool paged, bool strict, const char* op) {
  FLASHINFER_CHECK(s.planned, op, "self", "plan() must be called before run()");
  const Shape qs{s.batch, s.seq_len_q, s.Hq, s.D};
  api::check_defined(q, op, "q");
  FLASHINFER_CHECK(q.shape() == qs && q.is_contiguous(), op, "q", "q must have compact BSHD shape ",
                   shape_to_string(qs), ", got ", shape_to_string(q.shape()));
  FLASHINFER_CHECK(q.dtype() == s.q_dtype, op, "q", "q dtype must match the plan (", dt(s.q_dtype),
                   "), got ", dt(q.dtype()));
  FLASHINFER_CHECK(k.dtype() == s.kv_dtype && v.dtype() == s.kv_dtype, op, "k",
                   "K/V dtype must match the plan (", dt(s.kv_dtype), "), got ", dt(k.dtype()));
  api::check_same_device(k, q, op, "k", "q");
  api::check_same_device(v, q, op, "v", "q");
  if (!paged) {
    const Shape ks{s.batch, s.seq_len_kv, s.Hkv, s.D};
    for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{k, "k"}, {v, "v"}}) {
      FLASHINFER_CHECK(t.shape() == ks && t.is_contiguous(), op, name, name,
                       " must have compact BSHD shape ", shape_to_string(ks), ", got ",
                       shape_to_string(t.shape()));
    }
  } else {
    FLASHINFER_CHECK(k.size(1) == s.Hkv && k.size(2) == s.page_size && k.size(3) == s.D, op,
                     "paged_kv_cache",
                     "paged_kv_cache geometry does not match the plan: expected "
                     "Hkv/page/D=(",
                     s.Hkv, ", ", s.page_size, ", ", s.D, "), got (", k.size(1), ", ", k.size(2),
                     ", ", k.size(3), ")");
  }
  const uint32_t* bits = nullptr;
  std::vector<uint32_t> words;
  const int64_t nwords = (s.seq_len_kv + 31) / 32;
  const bool has_bits = kv_valid_bits && kv_valid_bits->defined();
  FLASHINFER_CHECK(!s.use_kv_valid_bits || has_bits, op, "kv_valid_bits",
                   "kv_valid_bits is required when use_kv_valid_bits=True");
  FLASHINFER_CHECK(s.use_kv_valid_bits || !has_bits, op, "kv_valid_bits",
                   "kv_valid_bits must be None when use_kv_valid_bits=False");
  if (has_bits) {
    // torch.uint32 upstream; int32 here (no uint32 dtype): the same 32 bits a word.
    FLASHINFER_CHECK(
        kv_valid_bits->dtype() == DType::kInt32, op, "kv_valid_bits",
        "kv_valid_bits must hold 32-bit words (torch.uint32 upstream, int32 here), got ",
        dt(kv_valid_bits->dtype()));
    api::check_shape_eq(*kv_valid_bits, {s.batch, nwords}, op, "kv_valid_bits");
    for (int64_t x : api::host_ints(*kv_valid_bits)) words.push_back(static_cast<uint32_t>(x));
    bits = words.data();
  }
  TsPlan run = s;  // the pages a paged run's requests may use (invalid ones: zeros)
  Bsr bsr = load_bsr(s, block_indptr, block_indices, s.max_blocks_per_row, strict, op);
  const int64_t nqb = (s.seq_len_q + s.q_block_size - 1) / s.q_block_size;
  if (paged) {
    for (int64_t b = 0; b < s.batch; ++b) {
      const int64_t need = (s.kv_len[b] + s.page_size - 1) / s.page_size;
      bool ok = s.page_indptr[b + 1] - s.page_indptr[b] >= need;
      for (int64_t j = 0; ok && j < need; ++j) {
        const int64_t id = run.pages[s.page_indptr[b] + j];
        ok = id >= 0 && id < k.size(0);
      }
      FLASHINFER_CHECK(ok || !strict, op, "paged_kv_indices", "request ", b,
                       "'s pages do not cover its ", s.kv_len[b], " keys inside the cache's ",
                       k.size(0), " pages");
      if (ok) continue;
      for (int64_t row = b * s.Hkv * nqb; row < (b + 1) * s.Hkv * nqb; ++row) {
        bsr.begin[row] = bsr.end[row] = 0;  // upstream fails the rows closed
      }
      for (int64_t j = s.page_indptr[b]; j < s.page_indptr[b + 1]; ++j) run.pages[j] = 0;
      run.kv_len[b] = 0;
    }
  }
  Tensor o = out_for(out, qs, s.o_dtype, q.device(), op);
  TsAttentionParams p;
  const int64_t row = s.Hq * s.D;
  p.q = q.data_ptr(), p.q_row_stride = row, p.q_head_stride = s.D;
  p.o = o.data_ptr(), p.o_row_stride = row, p.o_head_stride = s.D;
  p.k = k.data_ptr(), p.v = v.data_ptr();
  if (paged) {
    p.k_page_stride = k.stride(0), p.k_head_stride = k.stride(1), p.k_slot_stride = k.stride(2);
    p.v_page_stride = v.stride(0), p.v_head_stride = v.stride(1), p.v_slot_stride = v.stride(2);
  } else {
    p.k_page_stride = p.v_page_stride = k.stride(0);
    p.k_slot_stride = p.v_slot_stride = k.stride(1);
    p.k_head_stride = p.v_head_stride = k.stride(2);
  }
  p.q_block_size = s.q_block_size, p.kv_block_size = s.kv_block_size, p.num_q_blocks = nqb;
  p.block_begin = bsr.begin.data(), p.block_end = bsr.end.data(), p.block_indices = bsr.ids.data();
  p.kv_valid_bits = bits, p.kv_valid_words = nwords;
  p.bmm1_scale = scale_of(sm_scale.value_or(1.0 / std::sqrt(128.0)), op, "sm_scale");
  p.bmm2_scale = 1.0f;
  run_reference(run, p, q.device(), op);
  return o;
}

// A contiguous layout as pages: one page of Skv tokens a request.
void contiguous_pages(TsPlan& s) {
  s.page_size = s.seq_len_kv;
  s.kv_len.assign(s.batch, s.seq_len_kv);
  s.page_indptr.resize(s.batch + 1), s.pages.resize(s.batch);
  for (int64_t b = 0; b <= s.batch; ++b) s.page_indptr[b] = b;
  for (int64_t b = 0; b < s.batch; ++b) s.pages[b] = b;
  fixed_q_rows(s);
}

// The paged plan's request lengths: seq_lens_kv, or seq_len_kv for every request.
void paged_sparse_lengths(TsPlan& s, const Tensor& indptr, const std::optional<Tensor>& seq_lens,
                          int64_t page_size, const char* op) {
  s.page_indptr = ints1d(indptr, op, "paged_kv_indptr");
  FLASHINFER_CHECK(s.page_indptr.size() >= 2, op, "paged_kv_indptr",
                   "paged_kv_indptr must describe at least one request");
  s.batch = static_cast<int64_t>(s.page_indptr.size()) - 1;
  FLASHINFER_CHECK(page_size > 0, op, "page_size", "page_size must be positive");
  s.page_size = page_size;
  FLASHINFER_CHECK(s.page_indptr[0] == 0, op, "paged_kv_indptr",
                   "paged_kv_indptr must start at zero");
  for (int64_t b = 0; b < s.batch; ++b) {
    FLASHINFER_CHECK(s.page_indptr[b + 1] >= s.page_indptr[b], op, "paged_kv_indptr",
                     "paged_kv_indptr must be non-decreasing");
  }
  if (seq_lens && seq_lens->defined()) {
    s.kv_len = ints1d(*seq_lens, op, "seq_lens_kv");
    FLASHINFER_CHECK(static_cast<int64_t>(s.kv_len.size()) == s.batch, op, "seq_lens_kv",
                     "seq_lens_kv must have one entry per request");
    for (int64_t l : s.kv_len) {
      FLASHINFER_CHECK(l >= 0 && l <= s.seq_len_kv, op, "seq_lens_kv",
                       "seq_lens_kv entries must lie in [0, seq_len_kv=", s.seq_len_kv, "], got ",
                       l);
      FLASHINFER_CHECK(!s.causal || s.seq_len_q <= l, op, "mask_type",
                       "causal block-sparse requires seq_len_q <= seq_len_kv");
    }
  } else {
    s.kv_len.assign(s.batch, s.seq_len_kv);
  }
  fixed_q_rows(s);
}

}  // namespace

using SparseTsInit = Init<BlockSparseTSWrapper>;

BlockSparseTSWrapper::BlockSparseTSWrapper() : s_(std::make_unique<TsPlan>()) {
  call_init<SparseTsInit>([] {}, *this);
}
BlockSparseTSWrapper::~BlockSparseTSWrapper() = default;

void BlockSparseTSWrapper::plan(int64_t batch_size, int64_t seq_len_q, int64_t seq_len_kv,
                                int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim,
                                int64_t q_block_size, int64_t kv_block_size, std::string device,
                                int64_t max_blocks_per_row, bool use_kv_valid_bits,
                                std::string mask_type, DType q_data_type,
                                std::optional<DType> kv_data_type,
                                std::optional<DType> o_data_type) {
  call_op<&BlockSparseTSWrapper::plan>(
      [&] {
        const char* op = "BlockSparseTSWrapper.plan";
        TsPlan s;
        sparse_geometry(s, seq_len_q, seq_len_kv, num_qo_heads, num_kv_heads, head_dim,
                        q_block_size, kv_block_size, max_blocks_per_row, mask_type, q_data_type,
                        kv_data_type.value_or(q_data_type), o_data_type.value_or(q_data_type),
                        kSparsePlanArgs, op);
        FLASHINFER_CHECK(batch_size > 0, op, "batch_size", "batch_size must be positive");
        s.batch = batch_size;
        s.use_kv_valid_bits = use_kv_valid_bits;
        // The per-request arrays (contiguous_pages) wait for the first run, whose q has this
        // batch: as upstream's plan, a batch_size alone allocates nothing (2^31 requests would
        // be tens of GB of host arrays here).
        s.device = Device::parse(device);
        check_arch(op, "device", s.device);
        s.planned = true;
        *s_ = std::move(s);
      },
      *this, batch_size, seq_len_q, seq_len_kv, num_qo_heads, num_kv_heads, head_dim, q_block_size,
      kv_block_size, device, max_blocks_per_row, use_kv_valid_bits, mask_type, q_data_type,
      kv_data_type, o_data_type);
}

Tensor BlockSparseTSWrapper::run(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& block_indptr, const Tensor& block_indices,
                                 std::optional<Tensor> kv_valid_bits,
                                 std::optional<double> sm_scale, std::optional<Tensor> out) {
  return call_op<&BlockSparseTSWrapper::run>(
      [&] {
        const char* op = "BlockSparseTSWrapper.run";
        api::check_defined(k, op, "k");
        api::check_defined(v, op, "v");
        // The plan's request arrays, made once q has the planned batch (see plan); any other q
        // sparse_run refuses before it reads them.
        if (s_->planned && s_->kv_len.empty() && q.defined() && q.dim() == 4 &&
            q.size(0) == s_->batch) {
          contiguous_pages(*s_);
        }
        return sparse_run(*s_, q, k, v, block_indptr, block_indices, kv_valid_bits, sm_scale, out,
                          false, false, op);
      },
      *this, q, k, v, block_indptr, block_indices, kv_valid_bits, sm_scale, out);
}

using SparsePagedTsInit = Init<BlockSparsePagedTSWrapper>;

BlockSparsePagedTSWrapper::BlockSparsePagedTSWrapper() : s_(std::make_unique<TsPlan>()) {
  call_init<SparsePagedTsInit>([] {}, *this);
}
BlockSparsePagedTSWrapper::~BlockSparsePagedTSWrapper() = default;

void BlockSparsePagedTSWrapper::plan(const Tensor& paged_kv_indptr, int64_t seq_len_q,
                                     int64_t seq_len_kv, int64_t num_qo_heads, int64_t num_kv_heads,
                                     int64_t head_dim, int64_t q_block_size, int64_t kv_block_size,
                                     int64_t page_size, int64_t max_blocks_per_row,
                                     bool use_kv_valid_bits, std::optional<Tensor> seq_lens_kv,
                                     std::string mask_type, DType q_data_type,
                                     std::optional<DType> kv_data_type,
                                     std::optional<DType> o_data_type) {
  call_op<&BlockSparsePagedTSWrapper::plan>(
      [&] {
        const char* op = "BlockSparsePagedTSWrapper.plan";
        TsPlan s;
        sparse_geometry(s, seq_len_q, seq_len_kv, num_qo_heads, num_kv_heads, head_dim,
                        q_block_size, kv_block_size, max_blocks_per_row, mask_type, q_data_type,
                        kv_data_type.value_or(q_data_type), o_data_type.value_or(q_data_type),
                        kSparsePlanArgs, op);
        s.use_kv_valid_bits = use_kv_valid_bits;
        paged_sparse_lengths(s, paged_kv_indptr, seq_lens_kv, page_size, op);
        s.device = paged_kv_indptr.device();
        check_arch(op, "paged_kv_indptr", s.device);
        s.planned = true;
        *s_ = std::move(s);
      },
      *this, paged_kv_indptr, seq_len_q, seq_len_kv, num_qo_heads, num_kv_heads, head_dim,
      q_block_size, kv_block_size, page_size, max_blocks_per_row, use_kv_valid_bits, seq_lens_kv,
      mask_type, q_data_type, kv_data_type, o_data_type);
}

namespace {

Tensor paged_sparse_run(TsPlan s, const Tensor& q, const PagedKVCache& cache, const Tensor& indices,
                        const Tensor& block_indptr, const Tensor& block_indices,
                        const std::optional<Tensor>& bits, std::optional<double> sm_scale,
                        std::optional<Tensor> out, bool strict, const char* op) {
  FLASHINFER_CHECK(s.planned, op, "self", "plan() must be called before run()");
  const auto [k, v] = hnd_cache(cache, op, "paged_kv_cache");
  s.pages = ints1d(indices, op, "paged_kv_indices");
  FLASHINFER_CHECK(static_cast<int64_t>(s.pages.size()) == s.page_indptr[s.batch], op,
                   "paged_kv_indices", "paged_kv_indices must have ", s.page_indptr[s.batch],
                   " entries (the planned final paged_kv_indptr offset), got ", s.pages.size());
  return sparse_run(s, q, k, v, block_indptr, block_indices, bits, sm_scale, out, true, strict, op);
}

}  // namespace

Tensor BlockSparsePagedTSWrapper::run(const Tensor& q, const PagedKVCache& paged_kv_cache,
                                      const Tensor& paged_kv_indices, const Tensor& block_indptr,
                                      const Tensor& block_indices,
                                      std::optional<Tensor> kv_valid_bits,
                                      std::optional<double> sm_scale, std::optional<Tensor> out) {
  return call_op<&BlockSparsePagedTSWrapper::run>(
      [&] {
        return paged_sparse_run(*s_, q, paged_kv_cache, paged_kv_indices, block_indptr,
                                block_indices, kv_valid_bits, sm_scale, out, false,
                                "BlockSparsePagedTSWrapper.run");
      },
      *this, q, paged_kv_cache, paged_kv_indices, block_indptr, block_indices, kv_valid_bits,
      sm_scale, out);
}

Tensor block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& block_indptr, const Tensor& block_indices,
                              int64_t q_block_size, int64_t kv_block_size,
                              std::optional<Tensor> kv_valid_bits, std::string mask_type,
                              std::optional<double> sm_scale, std::optional<Tensor> out) {
  return call_op<&block_sparse_attention>(
      [&] {
        const char* op = "block_sparse_attention";
        for (const auto& [t, name] :
             {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}, {v, "v"}}) {
          api::check_defined(t, op, name);
          FLASHINFER_CHECK(t.dim() == 4 && t.is_contiguous(), op, name, name,
                           " must be rank 4 compact BSHD");
        }
        FLASHINFER_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), op, "k",
                         "Q and K batch/head dimensions must agree");
        FLASHINFER_CHECK(k.shape() == v.shape(), op, "v", "K and V must have identical shapes");
        TsPlan s;
        const int64_t nkb = (k.size(1) + std::max<int64_t>(kv_block_size, 1) - 1) /
                            std::max<int64_t>(kv_block_size, 1);
        sparse_geometry(s, q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), q_block_size,
                        kv_block_size, std::min(largest_row(block_indptr, op), nkb), mask_type,
                        q.dtype(), k.dtype(), out && out->defined() ? out->dtype() : q.dtype(),
                        kSparseFlatArgs, op);
        s.batch = q.size(0);
        s.use_kv_valid_bits = kv_valid_bits && kv_valid_bits->defined();
        contiguous_pages(s);
        s.planned = true;
        return sparse_run(s, q, k, v, block_indptr, block_indices, kv_valid_bits, sm_scale, out,
                          false, true, op);
      },
      q, k, v, block_indptr, block_indices, q_block_size, kv_block_size, kv_valid_bits, mask_type,
      sm_scale, out);
}

Tensor block_sparse_attention_with_paged_kv_cache(
    const Tensor& q, const PagedKVCache& paged_kv_cache, const Tensor& paged_kv_indptr,
    const Tensor& paged_kv_indices, const Tensor& block_indptr, const Tensor& block_indices,
    int64_t q_block_size, int64_t kv_block_size, int64_t seq_len_kv,
    std::optional<Tensor> seq_lens_kv, std::optional<Tensor> kv_valid_bits, std::string mask_type,
    std::optional<double> sm_scale, std::optional<Tensor> out) {
  return call_op<&block_sparse_attention_with_paged_kv_cache>(
      [&] {
        const char* op = "block_sparse_attention_with_paged_kv_cache";
        api::check_defined(q, op, "q");
        FLASHINFER_CHECK(q.dim() == 4 && q.is_contiguous(), op, "q",
                         "q must be rank 4 compact BSHD");
        const auto [k, v] = hnd_cache(paged_kv_cache, op, "paged_kv_cache");
        FLASHINFER_CHECK(q.size(3) == k.size(3), op, "paged_kv_cache",
                         "Q and paged K/V head dimensions must agree: expected ", q.size(3),
                         ", got ", k.size(3));
        api::check_same_device(paged_kv_indptr, q, op, "paged_kv_indptr", "q");
        TsPlan s;
        const int64_t nkb = (seq_len_kv + std::max<int64_t>(kv_block_size, 1) - 1) /
                            std::max<int64_t>(kv_block_size, 1);
        sparse_geometry(s, q.size(1), seq_len_kv, q.size(2), k.size(1), q.size(3), q_block_size,
                        kv_block_size, std::min(largest_row(block_indptr, op), nkb), mask_type,
                        q.dtype(), k.dtype(), out && out->defined() ? out->dtype() : q.dtype(),
                        kSparsePagedArgs, op);
        s.use_kv_valid_bits = kv_valid_bits && kv_valid_bits->defined();
        paged_sparse_lengths(s, paged_kv_indptr, seq_lens_kv, k.size(2), op);
        FLASHINFER_CHECK(s.batch == q.size(0), op, "paged_kv_indptr",
                         "the paged metadata batch size must equal q.shape[0]: expected ",
                         q.size(0), ", got ", s.batch);
        s.planned = true;
        return paged_sparse_run(s, q, paged_kv_cache, paged_kv_indices, block_indptr, block_indices,
                                kv_valid_bits, sm_scale, out, true, op);
      },
      q, paged_kv_cache, paged_kv_indptr, paged_kv_indices, block_indptr, block_indices,
      q_block_size, kv_block_size, seq_len_kv, seq_lens_kv, kv_valid_bits, mask_type, sm_scale,
      out);
}

// ---- bench hooks
// ---------------------------------------------------------------------------------

namespace {

using api::bench::int32_tensor;
using api::bench::invoke_case;
using api::bench::random_tensor;

int64_t pick(int64_t v, std::initializer_list<int64_t> allowed, int64_t fallback) {
  for (int64_t a : allowed) {
    if (a == v) return v;
  }
  return fallback;
}

// batch_size requests of s_kv keys in consecutive pages of P: CSR (indptr, indices, last) and
// the pages' count.
struct BenchCsr {
  std::vector<int64_t> indptr{0}, indices, last, seq;
  int64_t pages = 0;
};
BenchCsr bench_csr(int64_t B, int64_t kv, int64_t P) {
  BenchCsr c;
  const int64_t n = (kv + P - 1) / P;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < n; ++j) c.indices.push_back(c.pages++);
    c.indptr.push_back(c.pages);
    c.last.push_back(kv - (n - 1) * P);
    c.seq.push_back(kv);
  }
  return c;
}

double bench_flops(const BenchShape& s, int64_t q_len, int64_t dqk, int64_t dvo, bool causal) {
  return static_cast<double>(s.batch_size) *
         api::bench::attention_flops(q_len, s.s_kv, s.num_qo_heads, dqk, dvo, causal);
}

// Paged decode, one query a request, bf16, HND combined cache.
BenchCase bench_decode(const BenchShape& s, Device dev, bool standalone, bool wrapper = false) {
  const int64_t B = s.batch_size, Hq = s.num_qo_heads, Hkv = s.num_kv_heads;
  const int64_t D = pick(s.head_dim_qk, {64, 128, 256}, 128);
  const int64_t P = pick(s.page_size, {16, 32, 64, 128}, 16), kv = std::max<int64_t>(1, s.s_kv);
  const BenchCsr c = bench_csr(B, kv, P);
  Tensor q = random_tensor({B, Hq, D}, DType::kBFloat16, dev, s.random_seed);
  Tensor cache = random_tensor({c.pages, 2, Hkv, P, D}, DType::kBFloat16, dev, s.random_seed + 1);
  std::shared_ptr<BatchDecodePagedTSWrapper> w;
  if (wrapper) {
    w = std::make_shared<BatchDecodePagedTSWrapper>();
    w->plan(int32_tensor(c.indptr, dev), int32_tensor(c.indices, dev), int32_tensor(c.last, dev),
            Hq, Hkv, D, P, 1, std::nullopt, std::nullopt, DType::kBFloat16);
  }
  BenchCase bc =
      wrapper ? invoke_case("BatchDecodePagedTSWrapper.run",
                            {api::bench::bench_object(w), Value(q), Value(cache)})
      : standalone
          ? invoke_case("prims_ts_batch_decode_with_kv_cache",
                        {Value(q), Value(cache), Value(Tensor::zeros({16}, DType::kUInt8, dev)),
                         Value(int32_tensor(c.indptr, dev)), Value(int32_tensor(c.indices, dev)),
                         Value(int32_tensor(c.seq, dev)), Value(kv)})
          : invoke_case("batch_decode_with_paged_kv_cache",
                        {Value(q), Value(cache), Value(int32_tensor(c.indptr, dev)),
                         Value(int32_tensor(c.indices, dev)), Value(int32_tensor(c.last, dev))});
  bc.flops = bench_flops(s, 1, D, D, false);
  bc.bytes = api::bench::nbytes({B * kv * Hkv * 2, D}, DType::kBFloat16) +
             2.0 * api::bench::nbytes({B, Hq, D}, DType::kBFloat16);
  return bc;
}

// MLA decode, one query a request, 512 + 64, bf16, a block table of consecutive pages.
BenchCase bench_mla(const BenchShape& s, Device dev, bool standalone, bool wrapper = false) {
  const int64_t B = s.batch_size, H = s.num_qo_heads;
  const int64_t P = pick(s.page_size, {16, 32, 64, 128}, 16), kv = std::max<int64_t>(1, s.s_kv);
  const int64_t n = (kv + P - 1) / P;
  std::vector<int64_t> table, seq(static_cast<std::size_t>(B), kv);
  for (int64_t i = 0; i < B * n; ++i) table.push_back(i);
  Tensor q = random_tensor({B, 1, H, kMlaDim}, DType::kBFloat16, dev, s.random_seed);
  Tensor cache = random_tensor({B * n, P, kMlaDim}, DType::kBFloat16, dev, s.random_seed + 1);
  Tensor bt = int32_tensor(table, dev).view({B, n});
  std::shared_ptr<BatchMLADecodePagedTSWrapper> w;
  if (wrapper) {
    w = std::make_shared<BatchMLADecodePagedTSWrapper>();
    w->plan(bt, int32_tensor(seq, dev), H, kLatent, kRope, P);
  }
  BenchCase bc =
      wrapper ? invoke_case("BatchMLADecodePagedTSWrapper.run",
                            {api::bench::bench_object(w), Value(q), Value(cache)},
                            {{"bmm1_scale", Value(1.0 / std::sqrt(192.0))}})
      : standalone
          ? invoke_case("prims_ts_batch_decode_with_kv_cache_mla",
                        {Value(q), Value(cache), Value(Tensor::zeros({16}, DType::kInt8, dev)),
                         Value(int64_t{512}), Value(int64_t{64}), Value(bt),
                         Value(int32_tensor(seq, dev)), Value(kv)},
                        {{"bmm1_scale", Value(1.0 / std::sqrt(192.0))}})
          : invoke_case("batch_decode_mla_with_paged_kv_cache",
                        {Value(q), Value(cache), Value(bt), Value(int32_tensor(seq, dev))},
                        {{"bmm1_scale", Value(1.0 / std::sqrt(192.0))}});
  bc.flops = bench_flops(s, 1, kMlaDim, kLatent, false);
  bc.bytes = api::bench::nbytes({B * kv, kMlaDim}, DType::kBFloat16) +
             api::bench::nbytes({B, H, kMlaDim + kLatent}, DType::kBFloat16);
  return bc;
}

// Prefill: fixed [B, s_qo, H, D] (causal where the shape asks and s_qo <= s_kv) or paged (HND);
// the one-shot form or the wrapper's run.
BenchCase bench_context(const BenchShape& s, Device dev, bool paged, bool wrapper = false) {
  const int64_t B = s.batch_size, Hq = s.num_qo_heads, Hkv = s.num_kv_heads;
  const int64_t D = pick(s.head_dim_qk, {128, 256}, 128);
  const int64_t sq = std::max<int64_t>(1, s.s_qo), kv = std::max<int64_t>(1, s.s_kv);
  const bool causal = s.causal && sq <= kv;
  const std::string mask = causal ? "causal" : "dense";
  const int64_t P = pick(s.page_size, {16, 32, 64, 128}, 16);
  const BenchCsr c = bench_csr(B, kv, P);
  std::vector<int64_t> qo{0};
  for (int64_t b = 0; b < B; ++b) qo.push_back(qo.back() + sq);
  const Tensor q = paged ? random_tensor({B * sq, Hq, D}, DType::kBFloat16, dev, s.random_seed)
                         : random_tensor({B, sq, Hq, D}, DType::kBFloat16, dev, s.random_seed);
  const Shape ks = paged ? Shape{c.pages, Hkv, P, D} : Shape{B, kv, Hkv, D};
  const Tensor k = random_tensor(ks, DType::kBFloat16, dev, s.random_seed + 1);
  const Tensor v = random_tensor(ks, DType::kBFloat16, dev, s.random_seed + 2);
  const Tensor qo_t = int32_tensor(qo, dev), ip = int32_tensor(c.indptr, dev),
               ind = int32_tensor(c.indices, dev), last = int32_tensor(c.last, dev);
  BenchCase bc;
  if (wrapper && paged) {
    auto w = std::make_shared<BatchPrefillPagedTSWrapper>();
    w->plan(q, k, v, qo_t, ip, ind, last, P, mask);
    bc = invoke_case("BatchPrefillPagedTSWrapper.run",
                     {api::bench::bench_object(w), Value(q), Value(k), Value(v)});
  } else if (wrapper) {
    auto w = std::make_shared<BatchPrefillTSWrapper>();
    w->plan(q, k, v, std::nullopt, std::nullopt, mask);
    bc = invoke_case("BatchPrefillTSWrapper.run",
                     {api::bench::bench_object(w), Value(q), Value(k), Value(v)});
  } else if (paged) {
    bc =
        invoke_case("batch_prefill_with_paged_kv_cache",
                    {Value(q), Value(k), Value(v), Value(qo_t), Value(ip), Value(ind), Value(last)},
                    {{"page_size", Value(P)}, {"mask_type", Value(mask)}});
  } else {
    bc = invoke_case("batch_prefill", {Value(q), Value(k), Value(v)}, {{"mask_type", Value(mask)}});
  }
  bc.flops = bench_flops(s, sq, D, D, causal);
  bc.bytes = api::bench::bench_attention_bytes(s, B * sq, B * kv);
  return bc;
}

// Block-sparse: q blocks of 16 rows, KV blocks of 64 keys, each row listing every other block;
// the one-shot form or the wrapper's run.
BenchCase bench_sparse(const BenchShape& s, Device dev, bool paged, bool wrapper = false) {
  const int64_t B = s.batch_size, Hq = s.num_qo_heads, Hkv = s.num_kv_heads, D = 128;
  const int64_t sq = std::max<int64_t>(1, s.s_qo), kv = std::max<int64_t>(1, s.s_kv);
  const int64_t qbs = 16, kvbs = 64, nqb = (sq + qbs - 1) / qbs, nkb = (kv + kvbs - 1) / kvbs;
  std::vector<int64_t> ip, ids;
  int64_t widest = 0;
  for (int64_t row = 0; row < B * Hkv; ++row) {
    for (int64_t qb = 0; qb < nqb; ++qb) {
      ip.push_back(static_cast<int64_t>(ids.size()));
      for (int64_t j = qb % 2; j < nkb; j += 2) ids.push_back(j);
      widest = std::max(widest, static_cast<int64_t>(ids.size()) - ip.back());
    }
    ip.push_back(static_cast<int64_t>(ids.size()));
  }
  if (ids.empty()) ids.push_back(0);
  const Tensor indptr = int32_tensor(ip, dev).view({B, Hkv, nqb + 1});
  const Tensor blocks = int32_tensor(ids, dev);
  const Tensor q = random_tensor({B, sq, Hq, D}, DType::kBFloat16, dev, s.random_seed);
  const int64_t P = pick(s.page_size, {16, 32, 64, 128}, 16);
  const BenchCsr c = bench_csr(B, kv, P);
  BenchCase bc;
  if (!paged) {
    const Tensor k = random_tensor({B, kv, Hkv, D}, DType::kBFloat16, dev, s.random_seed + 1);
    const Tensor v = random_tensor({B, kv, Hkv, D}, DType::kBFloat16, dev, s.random_seed + 2);
    if (wrapper) {
      auto w = std::make_shared<BlockSparseTSWrapper>();
      w->plan(B, sq, kv, Hq, Hkv, D, qbs, kvbs, dev.str(), widest, false, "dense",
              DType::kBFloat16);
      bc = invoke_case("BlockSparseTSWrapper.run", {api::bench::bench_object(w), Value(q), Value(k),
                                                    Value(v), Value(indptr), Value(blocks)});
    } else {
      bc = invoke_case("block_sparse_attention", {Value(q), Value(k), Value(v), Value(indptr),
                                                  Value(blocks), Value(qbs), Value(kvbs)});
    }
  } else {
    const Tensor cache =
        random_tensor({c.pages, 2, Hkv, P, D}, DType::kBFloat16, dev, s.random_seed + 1);
    const Tensor pip = int32_tensor(c.indptr, dev), pind = int32_tensor(c.indices, dev);
    if (wrapper) {
      auto w = std::make_shared<BlockSparsePagedTSWrapper>();
      w->plan(pip, sq, kv, Hq, Hkv, D, qbs, kvbs, P, widest, false, std::nullopt, "dense",
              DType::kBFloat16);
      bc = invoke_case("BlockSparsePagedTSWrapper.run",
                       {api::bench::bench_object(w), Value(q), Value(cache), Value(pind),
                        Value(indptr), Value(blocks)});
    } else {
      bc = invoke_case("block_sparse_attention_with_paged_kv_cache",
                       {Value(q), Value(cache), Value(pip), Value(pind), Value(indptr),
                        Value(blocks), Value(qbs), Value(kvbs)},
                       {{"seq_len_kv", Value(kv)}});
    }
  }
  bc.flops = bench_flops(s, sq, D, D, false) / 2.0;
  bc.bytes = api::bench::bench_attention_bytes(s, B * sq, B * kv) / 2.0;
  return bc;
}

}  // namespace

void register_ops(OpRegistry& r) {
  declare<&prims_ts_batch_decode_with_kv_cache>(
      r,
      {.name = "prims_ts_batch_decode_with_kv_cache",
       .module = kTsDecodeModule,
       .summary = "Task-scheduled paged decode (HND cache, CSR page table, bmm1 / bmm2 scales)"},
      "query", "kv_cache", "workspace_buffer", "paged_kv_indptr", "paged_kv_indices", "seq_lens",
      "max_seq_len", arg("seq_len_q", int64_t{1}).kw(), arg("qo_indptr").kw(),
      arg("max_seq_len_q").kw(), arg("bmm1_scale").kw(), arg("bmm2_scale", 1.0).kw(),
      arg("out").mut().kw(), arg("out_dtype").kw(), arg("mask_type", "dense").kw(),
      arg("window_left", int64_t{-1}).kw(), arg("kv_layout", "HND").kw());
  declare_init<DecodeTsInit>(r,
                             {.name = "BatchDecodePagedTSWrapper.__init__",
                              .module = kTsDecodeModule,
                              .summary = "Task-scheduled paged decode wrapper"},
                             arg("kv_layout", "HND"));
  declare<&BatchDecodePagedTSWrapper::plan>(
      r,
      {.name = "BatchDecodePagedTSWrapper.plan",
       .module = kTsDecodeModule,
       .summary = "Reads and checks the page table once"},
      "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads",
      "num_kv_heads", "head_dim", "page_size", arg("seq_len_q", int64_t{1}).kw(),
      arg("qo_indptr").kw(), arg("max_seq_len_q").kw(), arg("q_data_type", DType::kFloat16).kw(),
      arg("kv_data_type").kw(), arg("o_data_type").kw(), arg("mask_type", "dense").kw(),
      arg("window_left", int64_t{-1}).kw(), arg("max_kv_len").kw());
  declare<&BatchDecodePagedTSWrapper::run>(
      r,
      {.name = "BatchDecodePagedTSWrapper.run",
       .module = kTsDecodeModule,
       .summary = "Task-scheduled paged decode with the current plan"},
      "q", "paged_kv_cache", arg("bmm1_scale").kw(), arg("bmm2_scale", 1.0).kw(),
      arg("out").mut().kw());
  declare<&batch_decode_with_paged_kv_cache>(
      r,
      {.name = "batch_decode_with_paged_kv_cache",
       .module = kTsDecodeModule,
       .summary = "One-shot task-scheduled paged decode (plan then run)"},
      "q", "paged_kv_cache", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len",
      arg("seq_len_q", int64_t{1}).kw(), arg("qo_indptr").kw(), arg("max_seq_len_q").kw(),
      arg("mask_type", "dense").kw(), arg("window_left", int64_t{-1}).kw(),
      arg("kv_layout", "HND").kw(), arg("bmm1_scale").kw(), arg("bmm2_scale", 1.0).kw(),
      arg("out").mut().kw(), arg("out_dtype").kw());

  declare<&prims_ts_batch_decode_with_kv_cache_mla>(
      r,
      {.name = "prims_ts_batch_decode_with_kv_cache_mla",
       .module = kTsMlaModule,
       .summary = "Task-scheduled DeepSeek MLA decode over a block table (512 + 64)"},
      "query", "kv_cache", "workspace_buffer", "kv_lora_rank", "qk_rope_head_dim", "block_tables",
      "seq_lens", "max_seq_len", arg("qo_indptr").kw(), arg("max_seq_len_q").kw(),
      arg("out").mut().kw(), arg("bmm1_scale", 1.0).kw(), arg("bmm2_scale", 1.0).kw(),
      arg("mask_type", "causal").kw(), arg("out_dtype", DType::kBFloat16).kw());
  declare_init<MlaTsInit>(r, {.name = "BatchMLADecodePagedTSWrapper.__init__",
                              .module = kTsMlaModule,
                              .summary = "Task-scheduled MLA decode wrapper"});
  declare<&BatchMLADecodePagedTSWrapper::plan>(
      r,
      {.name = "BatchMLADecodePagedTSWrapper.plan",
       .module = kTsMlaModule,
       .summary = "Reads and checks the block table and lengths once"},
      "block_tables", "seq_lens", "num_heads", "kv_lora_rank", "qk_rope_head_dim", "page_size",
      arg("seq_len_q").kw(), arg("qo_indptr").kw(), arg("max_seq_len_q").kw(),
      arg("q_data_type", DType::kBFloat16).kw(), arg("kv_data_type").kw(),
      arg("o_data_type", DType::kBFloat16).kw(), arg("mask_type", "causal").kw(),
      arg("max_kv_len").kw());
  declare<&BatchMLADecodePagedTSWrapper::run>(
      r,
      {.name = "BatchMLADecodePagedTSWrapper.run",
       .module = kTsMlaModule,
       .summary = "Task-scheduled MLA decode with the current plan"},
      "query", "kv_cache", arg("bmm1_scale", 1.0).kw(), arg("bmm2_scale", 1.0).kw(),
      arg("out").mut().kw());
  declare<&batch_decode_mla_with_paged_kv_cache>(
      r,
      {.name = "batch_decode_mla_with_paged_kv_cache",
       .module = kTsMlaModule,
       .summary = "One-shot task-scheduled MLA decode (plan then run)"},
      "query", "kv_cache", "block_tables", "seq_lens", arg("qo_indptr").kw(),
      arg("max_seq_len_q").kw(), arg("kv_lora_rank", int64_t{512}).kw(),
      arg("qk_rope_head_dim", int64_t{64}).kw(), arg("mask_type", "causal").kw(),
      arg("max_kv_len").kw(), arg("bmm1_scale", 1.0).kw(), arg("bmm2_scale", 1.0).kw(),
      arg("out").mut().kw(), arg("out_dtype", DType::kBFloat16).kw());

  declare_init<PrefillTsInit>(r, {.name = "BatchPrefillTSWrapper.__init__",
                                  .module = kTsContextModule,
                                  .summary = "Task-scheduled prefill wrapper (fixed or packed)"});
  declare<&BatchPrefillTSWrapper::plan>(r,
                                        {.name = "BatchPrefillTSWrapper.plan",
                                         .module = kTsContextModule,
                                         .summary = "Checks the layout and reads the offsets once"},
                                        "q", "k", "v", arg("qo_indptr").kw(), arg("kv_indptr").kw(),
                                        arg("mask_type", "dense").kw(),
                                        arg("window_left", int64_t{-1}).kw(), arg("sm_scale").kw(),
                                        arg("output_scale", 1.0).kw(), arg("out_dtype").kw());
  declare<&BatchPrefillTSWrapper::run>(r,
                                       {.name = "BatchPrefillTSWrapper.run",
                                        .module = kTsContextModule,
                                        .summary = "Task-scheduled prefill with the current plan"},
                                       "q", "k", "v", arg("out").mut().kw());
  declare_init<PrefillPagedTsInit>(r,
                                   {.name = "BatchPrefillPagedTSWrapper.__init__",
                                    .module = kTsContextModule,
                                    .summary = "Task-scheduled paged prefill wrapper"},
                                   arg("kv_layout", "HND"));
  declare<&BatchPrefillPagedTSWrapper::plan>(
      r,
      {.name = "BatchPrefillPagedTSWrapper.plan",
       .module = kTsContextModule,
       .summary = "Snapshots the page table and checks the layout"},
      "q", "k_cache", "v_cache", "qo_indptr", "paged_kv_indptr", "paged_kv_indices",
      "paged_kv_last_page_len", arg("page_size", int64_t{32}).kw(), arg("mask_type", "dense").kw(),
      arg("window_left", int64_t{-1}).kw(), arg("sm_scale").kw(), arg("output_scale", 1.0).kw(),
      arg("out_dtype").kw());
  declare<&BatchPrefillPagedTSWrapper::run>(
      r,
      {.name = "BatchPrefillPagedTSWrapper.run",
       .module = kTsContextModule,
       .summary = "Task-scheduled paged prefill with the current plan"},
      "q", "k_cache", "v_cache", arg("out").mut().kw());
  declare<&batch_prefill>(r,
                          {.name = "batch_prefill",
                           .module = kTsContextModule,
                           .summary = "One-shot task-scheduled prefill (plan then run)"},
                          "q", "k", "v", arg("qo_indptr").kw(), arg("kv_indptr").kw(),
                          arg("mask_type", "dense").kw(), arg("window_left", int64_t{-1}).kw(),
                          arg("sm_scale").kw(), arg("output_scale", 1.0).kw(),
                          arg("out_dtype").kw(), arg("out").mut().kw());
  declare<&batch_prefill_with_paged_kv_cache>(
      r,
      {.name = "batch_prefill_with_paged_kv_cache",
       .module = kTsContextModule,
       .summary = "One-shot task-scheduled paged prefill (plan then run)"},
      "q", "k_cache", "v_cache", "qo_indptr", "paged_kv_indptr", "paged_kv_indices",
      "paged_kv_last_page_len", arg("page_size", int64_t{32}).kw(), arg("kv_layout", "HND").kw(),
      arg("mask_type", "dense").kw(), arg("window_left", int64_t{-1}).kw(), arg("sm_scale").kw(),
      arg("output_scale", 1.0).kw(), arg("out_dtype").kw(), arg("out").mut().kw());

  declare_init<SparseTsInit>(r, {.name = "BlockSparseTSWrapper.__init__",
                                 .module = kTsSparseModule,
                                 .summary = "Task-scheduled block-sparse attention wrapper"});
  declare<&BlockSparseTSWrapper::plan>(
      r,
      {.name = "BlockSparseTSWrapper.plan",
       .module = kTsSparseModule,
       .summary = "Checks the static profile (not logged upstream)"},
      "batch_size", "seq_len_q", "seq_len_kv", "num_qo_heads", "num_kv_heads", "head_dim",
      "q_block_size", "kv_block_size", arg("device").required().kw(),
      arg("max_blocks_per_row").required().kw(), arg("use_kv_valid_bits").required().kw(),
      arg("mask_type", "dense").kw(), arg("q_data_type", DType::kFloat16).kw(),
      arg("kv_data_type").kw(), arg("o_data_type").kw());
  declare<&BlockSparseTSWrapper::run>(
      r,
      {.name = "BlockSparseTSWrapper.run",
       .module = kTsSparseModule,
       .summary = "Block-sparse attention with the current plan (invalid rows: zeros)"},
      "q", "k", "v", "block_indptr", "block_indices", arg("kv_valid_bits").kw(),
      arg("sm_scale").kw(), arg("out").mut().kw());
  declare_init<SparsePagedTsInit>(r, {.name = "BlockSparsePagedTSWrapper.__init__",
                                      .module = kTsSparseModule,
                                      .summary = "Task-scheduled paged block-sparse wrapper"});
  declare<&BlockSparsePagedTSWrapper::plan>(
      r,
      {.name = "BlockSparsePagedTSWrapper.plan",
       .module = kTsSparseModule,
       .summary = "Snapshots the page offsets and lengths (not logged upstream)"},
      "paged_kv_indptr", "seq_len_q", "seq_len_kv", "num_qo_heads", "num_kv_heads", "head_dim",
      "q_block_size", "kv_block_size", "page_size", arg("max_blocks_per_row").required().kw(),
      arg("use_kv_valid_bits").required().kw(), arg("seq_lens_kv").kw(),
      arg("mask_type", "dense").kw(), arg("q_data_type", DType::kFloat16).kw(),
      arg("kv_data_type").kw(), arg("o_data_type").kw());
  declare<&BlockSparsePagedTSWrapper::run>(
      r,
      {.name = "BlockSparsePagedTSWrapper.run",
       .module = kTsSparseModule,
       .summary = "Paged block-sparse attention with the current plan (invalid rows: zeros)"},
      "q", "paged_kv_cache", "paged_kv_indices", "block_indptr", "block_indices",
      arg("kv_valid_bits").kw(), arg("sm_scale").kw(), arg("out").mut().kw());
  declare<&block_sparse_attention>(
      r,
      {.name = "block_sparse_attention",
       .module = kTsSparseModule,
       .summary = "One-shot block-sparse attention (the BSR inspected first)"},
      "q", "k", "v", "block_indptr", "block_indices", "q_block_size", "kv_block_size",
      arg("kv_valid_bits").kw(), arg("mask_type", "dense").kw(), arg("sm_scale").kw(),
      arg("out").mut().kw());
  declare<&block_sparse_attention_with_paged_kv_cache>(
      r,
      {.name = "block_sparse_attention_with_paged_kv_cache",
       .module = kTsSparseModule,
       .summary = "One-shot paged block-sparse attention (the BSR inspected first)"},
      "q", "paged_kv_cache", "paged_kv_indptr", "paged_kv_indices", "block_indptr", "block_indices",
      "q_block_size", "kv_block_size", arg("seq_len_kv").required().kw(), arg("seq_lens_kv").kw(),
      arg("kv_valid_bits").kw(), arg("mask_type", "dense").kw(), arg("sm_scale").kw(),
      arg("out").mut().kw());
  for (const char* op : {"prims_ts_batch_decode_with_kv_cache",
                         "BatchDecodePagedTSWrapper.__init__",
                         "BatchDecodePagedTSWrapper.plan",
                         "BatchDecodePagedTSWrapper.run",
                         "batch_decode_with_paged_kv_cache",
                         "prims_ts_batch_decode_with_kv_cache_mla",
                         "BatchMLADecodePagedTSWrapper.__init__",
                         "BatchMLADecodePagedTSWrapper.plan",
                         "BatchMLADecodePagedTSWrapper.run",
                         "batch_decode_mla_with_paged_kv_cache",
                         "BatchPrefillTSWrapper.__init__",
                         "BatchPrefillTSWrapper.plan",
                         "BatchPrefillTSWrapper.run",
                         "BatchPrefillPagedTSWrapper.__init__",
                         "BatchPrefillPagedTSWrapper.plan",
                         "BatchPrefillPagedTSWrapper.run",
                         "batch_prefill",
                         "batch_prefill_with_paged_kv_cache",
                         "BlockSparseTSWrapper.__init__",
                         "BlockSparseTSWrapper.plan",
                         "BlockSparseTSWrapper.run",
                         "BlockSparsePagedTSWrapper.__init__",
                         "BlockSparsePagedTSWrapper.plan",
                         "BlockSparsePagedTSWrapper.run",
                         "block_sparse_attention",
                         "block_sparse_attention_with_paged_kv_cache"}) {
    api::register_backends(op, kTsKernels);
  }
  register_bench_hook("batch_decode_with_paged_kv_cache",
                      [](const BenchShape& s, Device d) { return bench_decode(s, d, false); });
  register_bench_hook("prims_ts_batch_decode_with_kv_cache",
                      [](const BenchShape& s, Device d) { return bench_decode(s, d, true); });
  register_bench_hook("batch_decode_mla_with_paged_kv_cache",
                      [](const BenchShape& s, Device d) { return bench_mla(s, d, false); });
  register_bench_hook("prims_ts_batch_decode_with_kv_cache_mla",
                      [](const BenchShape& s, Device d) { return bench_mla(s, d, true); });
  register_bench_hook("batch_prefill",
                      [](const BenchShape& s, Device d) { return bench_context(s, d, false); });
  register_bench_hook("batch_prefill_with_paged_kv_cache",
                      [](const BenchShape& s, Device d) { return bench_context(s, d, true); });
  register_bench_hook("block_sparse_attention",
                      [](const BenchShape& s, Device d) { return bench_sparse(s, d, false); });
  register_bench_hook("block_sparse_attention_with_paged_kv_cache",
                      [](const BenchShape& s, Device d) { return bench_sparse(s, d, true); });
  register_bench_hook("BatchDecodePagedTSWrapper.run", [](const BenchShape& s, Device d) {
    return bench_decode(s, d, false, true);
  });
  register_bench_hook("BatchMLADecodePagedTSWrapper.run",
                      [](const BenchShape& s, Device d) { return bench_mla(s, d, false, true); });
  register_bench_hook("BatchPrefillTSWrapper.run", [](const BenchShape& s, Device d) {
    return bench_context(s, d, false, true);
  });
  register_bench_hook("BatchPrefillPagedTSWrapper.run", [](const BenchShape& s, Device d) {
    return bench_context(s, d, true, true);
  });
  register_bench_hook("BlockSparseTSWrapper.run", [](const BenchShape& s, Device d) {
    return bench_sparse(s, d, false, true);
  });
  register_bench_hook("BlockSparsePagedTSWrapper.run",
                      [](const BenchShape& s, Device d) { return bench_sparse(s, d, true, true); });
}

}  // namespace prims_ts

namespace detail {
void register_prims_ts_ops(OpRegistry& r) { prims_ts::register_ops(r); }
}  // namespace detail

}  // namespace flashinfer
