// MiniMax sparse attention's selection ops (flashinfer.msa_ops): declarations, upstream's checks
// and messages, dispatch (CPU references; upstream runs them on SM120 / SM121 only), bench hooks.
// Facts: docs/upstream-facts/msa_ops.md.
#include "flashinfer/ops/msa.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/msa_cpu.h"
#include "kernels/msa_params.h"
#include "kernels/quantization_params.h"

namespace flashinfer {

template <>
struct ReturnName<MsaAttentionOutput> {
  static constexpr const char* value =
      "Tensor | tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]";
};

Value to_value(const MsaAttentionOutput& r) {
  if (r.lse_t.defined()) return Value::tuple({Value(r.out), Value(r.lse), Value(r.lse_t)});
  if (r.lse.defined()) return Value::tuple({Value(r.out), Value(r.lse)});
  return Value(r.out);
}

namespace {

using kernels::kMsaTile;
using kernels::kMsaTopk;

constexpr const char* kTopkModule = "flashinfer.msa_ops.sparse_topk_select";
constexpr const char* kProxyModule = "flashinfer.msa_ops.proxy_score";
constexpr const char* kPrefillModule = "flashinfer.msa_ops.sparse_prefill";
constexpr const char* kDecodeModule = "flashinfer.msa_ops.sparse_decode";

constexpr api::KernelEntry<kernels::MsaTopkParams> kTopkKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: upstream's count-rank rule per (query, head), queries in parallel", nullptr,
     [](const kernels::MsaTopkParams& p, const api::LaunchContext&) {
       kernels::cpu::msa_topk_select(p);
     }},
};
constexpr api::KernelEntry<kernels::MsaProxyParams> kProxyKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: per-tile maxima of fp32 q . k sums (head dim in order), queries and heads "
     "in parallel",
     nullptr,
     [](const kernels::MsaProxyParams& p, const api::LaunchContext&) {
       kernels::cpu::msa_proxy_score(p);
     }},
};

constexpr api::KernelEntry<kernels::MsaAttnParams> kAttnKernels[] = {
    {DeviceType::kCPU,
     "CPU reference: per (query, head) the listed tiles' visible keys, fp32 q . k sums, the "
     "softmax in fp64, rounded once",
     nullptr,
     [](const kernels::MsaAttnParams& p, const api::LaunchContext&) {
       kernels::cpu::msa_sparse_attention(p);
     }},
};

// The values of a small int32 index tensor on the host (checked by the callers' rules).
std::vector<int64_t> ints(const Tensor& t) { return api::host_ints(t); }

// Index vectors as the int32 host copies the kernels read.
std::vector<int32_t> to_i32(const std::vector<int64_t>& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

// q_offset: None, an int (set in p), or an int32 tensor of at least B entries (returned), for
// the proxy and the attention params alike.
template <class Params>
std::vector<int32_t> q_offsets(const char* op, const std::optional<Value>& q_offset, int64_t B,
                               Params& p) {
  std::vector<int32_t> offs;
  if (!q_offset || q_offset->is_none()) return offs;
  if (q_offset->is_tensor()) {
    FLASHINFER_CHECK(q_offset->as_tensor().dtype() == DType::kInt32, op, "q_offset",
                     "q_offset must be int32");
    offs = to_i32(ints(q_offset->as_tensor()));
    FLASHINFER_CHECK(static_cast<int64_t>(offs.size()) >= B, op, "q_offset", "expected ", B,
                     " entries, got ", offs.size());
    return offs;
  }
  FLASHINFER_CHECK(q_offset->kind() == Value::Kind::kInt, op, "q_offset",
                   "q_offset must be an int or an int32 tensor, got ", q_offset->repr());
  p.q_offset_scalar = true;
  p.q_offset_value = q_offset->as_int();
  return offs;
}

void check_int32_vector(const Tensor& t, const char* op, const char* arg) {
  api::check_dim(t, {1}, op, arg);
  api::check_dtype_in(t, {DType::kInt32}, op, arg);
}

Tensor topk_impl(const Tensor& max_score, int64_t topk, const std::optional<Value>& nvp_v,
                 std::optional<Tensor> output, int64_t fb, int64_t fe) {
  const char* op = "msa_topk_select";
  api::check_defined(max_score, op, "max_score");
  api::check_upstream_arch(op, "max_score", max_score.device());
  FLASHINFER_CHECK(max_score.dtype() == DType::kFloat32, op, "max_score",
                   "max_score must be float32, got ", dtype_torch_name(max_score.dtype()));
  FLASHINFER_CHECK(max_score.is_contiguous(), op, "max_score", "max_score must be contiguous");
  FLASHINFER_CHECK(max_score.dim() == 3, op, "max_score",
                   "max_score must be 3D (num_qo_heads, max_k_tiles, total_qo_len), got ",
                   max_score.dim(), "D");
  FLASHINFER_CHECK(topk == kMsaTopk, op, "topk", "topk must be 16, got ", topk);
  const int64_t H = max_score.size(0), P = max_score.size(1), S = max_score.size(2);
  FLASHINFER_CHECK(fb >= 0 && fe >= 0, op, "force_begin_blocks",
                   "force_begin_blocks / force_end_blocks must be >= 0");
  FLASHINFER_CHECK(fb + fe <= topk, op, "force_begin_blocks",
                   "force_begin_blocks + force_end_blocks (", fb, " + ", fe, ") must be <= topk (",
                   topk, ")");
  kernels::MsaTopkParams p;
  Tensor nvp_host;
  if (nvp_v && nvp_v->is_tensor()) {
    const Tensor& t = nvp_v->as_tensor();
    FLASHINFER_CHECK(t.dim() == 1 && t.dtype() == DType::kInt32, op, "num_valid_pages",
                     "num_valid_pages tensor must be 1D int32");
    FLASHINFER_CHECK(t.size(0) == S, op, "num_valid_pages",
                     "num_valid_pages tensor must have total_qo_len (", S, ") entries, got ",
                     t.size(0));
    FLASHINFER_CHECK(t.is_contiguous(), op, "num_valid_pages",
                     "num_valid_pages tensor must be contiguous");
    FLASHINFER_CHECK(t.device() == max_score.device(), op, "num_valid_pages",
                     "num_valid_pages must be on max_score's device");
    nvp_host = t.to(Device::cpu()).contiguous();
    p.nvp = nvp_host.data<int32_t>();
  } else {
    int64_t n = P;
    if (nvp_v && !nvp_v->is_none()) {
      FLASHINFER_CHECK(nvp_v->kind() == Value::Kind::kInt, op, "num_valid_pages",
                       "num_valid_pages must be an int or an int32 tensor, got ", nvp_v->repr());
      n = nvp_v->as_int();
    }
    FLASHINFER_CHECK(n > 0 && n <= P, op, "num_valid_pages",
                     "num_valid_pages must be in (0, max_k_tiles=", P, "], got ", n);
    FLASHINFER_CHECK(fb + fe <= n, op, "force_begin_blocks",
                     "force_begin_blocks + force_end_blocks (", fb, " + ", fe,
                     ") must be <= num_valid_pages (", n, ")");
    p.nvp_value = n;
  }
  if (output && output->defined()) {
    FLASHINFER_CHECK(output->shape() == (Shape{S, H, topk}), op, "output", "output shape must be (",
                     S, ", ", H, ", ", topk, "), got ", shape_to_string(output->shape()));
    FLASHINFER_CHECK(output->dtype() == DType::kInt32, op, "output", "output must be int32, got ",
                     dtype_torch_name(output->dtype()));
    api::check_same_device(*output, max_score, op, "output", "max_score");
  } else {
    output = Tensor::empty({S, H, topk}, DType::kInt32, max_score.device());
  }
  // The kernel writes a dense [S, H, 16] buffer; a strided `output` receives a copy.
  Tensor dense = output->is_contiguous()
                     ? *output
                     : Tensor::empty({S, H, topk}, DType::kInt32, max_score.device());
  p.scores = max_score.data<float>();
  p.H = H, p.P = P, p.S = S;
  p.force_begin = fb, p.force_end = fe;
  p.out = dense.data<int32_t>();
  api::launch(kTopkKernels, p, max_score.device(), op, "max_score");
  if (!output->is_contiguous()) output->copy_(dense);
  return *output;
}

// msa_proxy_score_fp4's extras: the scale buffers and the two (inverse) global scales.
struct Fp4Proxy {
  const Tensor& q_scale;
  const Tensor& k_scale;
  double q_global, k_global;
};

Tensor proxy_impl(const Fp4Proxy* fp4, const Tensor& q, const Tensor& k, const Tensor& cu_seqlens_q,
                  const std::optional<Tensor>& cu_seqlens_k,
                  const std::optional<Tensor>& page_table, const std::optional<Tensor>& seqused_k,
                  bool causal, std::optional<int64_t> max_seqlen_q,
                  std::optional<int64_t> max_k_tiles, std::optional<Tensor> output,
                  bool reduce_heads, const std::optional<Value>& q_offset) {
  const char* op = fp4 ? "msa_proxy_score_fp4" : "msa_proxy_score";
  const char* q_arg = fp4 ? "q_fp4" : "q";
  const char* k_arg = fp4 ? "k_fp4" : "k";
  const int64_t row = fp4 ? kMsaTile / 2 : kMsaTile;  // elements of a head row (packed: bytes)
  api::check_defined(q, op, q_arg);
  api::check_upstream_arch(op, q_arg, q.device());
  api::check_defined(k, op, k_arg);
  if (fp4) {
    FLASHINFER_CHECK(q.dtype() == DType::kUInt8 && k.dtype() == DType::kUInt8, op, q_arg,
                     "q_fp4/k_fp4 must be packed uint8 (e2m1x2)");
    api::check_defined(fp4->q_scale, op, "q_scale");
    api::check_defined(fp4->k_scale, op, "k_scale");
    FLASHINFER_CHECK(fp4->q_scale.dtype() == DType::kUInt8 && fp4->k_scale.dtype() == DType::kUInt8,
                     op, "q_scale", "q_scale/k_scale must be uint8 (e4m3 bytes)");
    api::check_dim(q, {3}, op, q_arg);
    FLASHINFER_CHECK(q.size(2) == row, op, q_arg, "q_fp4 last dim must be 64 (head_dim/2), got ",
                     q.size(2));
  } else {
    FLASHINFER_CHECK(q.dtype() == DType::kBFloat16 || q.dtype() == DType::kFloat16, op, "q",
                     "q must be bf16 or fp16, got ", dtype_torch_name(q.dtype()));
    api::check_dim(q, {3}, op, "q");
    FLASHINFER_CHECK(q.size(2) == kMsaTile, op, "q", "head_dim must be 128, got ", q.size(2));
  }
  FLASHINFER_CHECK(q.stride(2) == 1, op, q_arg, "must have stride 1 in the head dim");
  const bool paged = page_table && page_table->defined();
  const int64_t Hq = q.size(1), Hkv = k.dim() >= 2 ? k.size(1) : 0;
  FLASHINFER_CHECK(Hkv > 0 && Hq % Hkv == 0, op, k_arg,
                   "num_qo_heads must be a multiple of num_kv_heads");
  FLASHINFER_CHECK(fp4 || k.dtype() == q.dtype() || k.dtype() == DType::kFloat8E4M3FN, op, "k",
                   "k dtype must match q (or be float8_e4m3fn)");
  api::check_same_device(k, q, op, k_arg, q_arg);
  FLASHINFER_CHECK(k.stride(-1) == 1, op, k_arg, "must have stride 1 in the head dim");
  check_int32_vector(cu_seqlens_q, op, "cu_seqlens_q");
  api::check_same_device(cu_seqlens_q, q, op, "cu_seqlens_q", "q");
  kernels::MsaProxyParams p;
  std::vector<int64_t> cu_q = ints(cu_seqlens_q), cu_k, used, pages;
  int64_t B = 0, max_sk = 0;
  if (paged) {
    FLASHINFER_CHECK(seqused_k && seqused_k->defined(), op, "seqused_k",
                     "paged proxy requires seqused_k");
    FLASHINFER_CHECK(k.dim() == 4 && k.size(2) == kMsaTile && k.size(3) == row, op, k_arg,
                     fp4 ? "paged k_fp4 must be (num_pages, num_kv_heads, 128, 64)"
                         : "paged k must be (num_pages, num_kv_heads, 128, 128)");
    check_int32_vector(*seqused_k, op, "seqused_k");
    api::check_dim(*page_table, {2}, op, "page_table");
    api::check_dtype_in(*page_table, {DType::kInt32}, op, "page_table");
    B = seqused_k->size(0);
    FLASHINFER_CHECK(page_table->size(0) == B, op, "page_table", "expected ", B,
                     " rows (one per request), got ", page_table->size(0));
    used = ints(*seqused_k);
    pages = ints(page_table->contiguous());
    const int64_t width = page_table->size(1);
    for (int64_t b = 0; b < B; ++b) {
      FLASHINFER_CHECK(used[b] >= 0 && used[b] <= width * kMsaTile, op, "seqused_k", "entry ", b,
                       " is ", used[b], ", outside [0, ", width * kMsaTile,
                       "] (the page table's pages of 128 keys)");
      for (int64_t t = 0; t * kMsaTile < used[b]; ++t) {
        const int64_t pg = pages[b * width + t];
        FLASHINFER_CHECK(pg >= 0 && pg < k.size(0), op, "page_table", "entry (", b, ", ", t,
                         ") is ", pg, ", outside the ", k.size(0), " pages of k");
      }
      max_sk = std::max(max_sk, used[b]);
    }
    p.page_stride = width;
    p.k_stride_page = k.stride(0), p.k_stride_h = k.stride(1), p.k_stride_row = k.stride(2);
  } else {
    FLASHINFER_CHECK(cu_seqlens_k && cu_seqlens_k->defined(), op, "cu_seqlens_k",
                     "flat proxy requires cu_seqlens_k");
    FLASHINFER_CHECK(k.dim() == 3 && k.size(2) == row, op, k_arg,
                     fp4 ? "flat k_fp4 must be (total_k, num_kv_heads, 64)"
                         : "flat k must be (total_k, num_kv_heads, head_dim)");
    check_int32_vector(*cu_seqlens_k, op, "cu_seqlens_k");
    cu_k = ints(*cu_seqlens_k);
    B = static_cast<int64_t>(cu_k.size()) - 1;
    FLASHINFER_CHECK(B >= 0 && cu_k[0] >= 0, op, "cu_seqlens_k", "must start at a row >= 0");
    for (int64_t b = 0; b < B; ++b) {
      FLASHINFER_CHECK(cu_k[b + 1] >= cu_k[b] && cu_k[b + 1] <= k.size(0), op, "cu_seqlens_k",
                       "must be non-decreasing and within k's ", k.size(0), " rows");
      max_sk = std::max(max_sk, cu_k[b + 1] - cu_k[b]);
    }
    p.k_stride_row = k.stride(0), p.k_stride_h = k.stride(1);
  }
  FLASHINFER_CHECK(static_cast<int64_t>(cu_q.size()) == B + 1, op, "cu_seqlens_q", "expected ",
                   B + 1, " entries (batch ", B, "), got ", cu_q.size());
  const int64_t total_q = q.size(0);
  int64_t max_sq = 0;
  for (int64_t b = 0; b < B; ++b) {
    FLASHINFER_CHECK(cu_q[b] >= 0 && cu_q[b + 1] >= cu_q[b] && cu_q[b + 1] <= total_q, op,
                     "cu_seqlens_q", "must be non-decreasing and within q's ", total_q, " rows");
    max_sq = std::max(max_sq, cu_q[b + 1] - cu_q[b]);
  }
  const std::vector<int32_t> offs = q_offsets(op, q_offset, B, p);
  const int64_t H_out = reduce_heads ? 1 : Hq;
  if (!max_k_tiles && output && output->defined() && output->dim() == 3) {
    max_k_tiles = output->size(1);
  }
  const int64_t tiles = max_k_tiles.value_or((max_sk + kMsaTile - 1) / kMsaTile);
  FLASHINFER_CHECK(tiles >= 0, op, "max_k_tiles", "must be >= 0, got ", tiles);
  if (output && output->defined()) {
    FLASHINFER_CHECK(output->shape() == (Shape{H_out, tiles, total_q}), op, "output",
                     "output must be (", H_out, ", ", tiles, ", ", total_q, ")");
    FLASHINFER_CHECK(output->dtype() == DType::kFloat32, op, "output", "output must be float32");
    api::check_same_device(*output, q, op, "output", "q");
  } else {
    output = Tensor::empty({H_out, tiles, total_q}, DType::kFloat32, q.device());
  }
  Tensor dense = output->is_contiguous()
                     ? *output
                     : Tensor::empty({H_out, tiles, total_q}, DType::kFloat32, q.device());
  const std::vector<int32_t> cu_q32 = to_i32(cu_q), cu_k32 = to_i32(cu_k), used32 = to_i32(used),
                             pages32 = to_i32(pages);
  p.q = q.data_ptr(), p.q_dtype = q.dtype();
  p.q_stride_t = q.stride(0), p.q_stride_h = q.stride(1);
  p.k = k.data_ptr(), p.k_dtype = k.dtype();
  p.Hq = Hq, p.Hkv = Hkv, p.B = B, p.total_q = total_q, p.tiles = tiles;
  p.max_seqlen_q = max_seqlen_q.value_or(max_sq);
  p.cu_q = cu_q32.data();
  p.cu_k = paged ? nullptr : cu_k32.data();
  p.page_table = paged ? pages32.data() : nullptr;
  p.seqused_k = paged ? used32.data() : nullptr;
  p.q_offset = offs.empty() ? nullptr : offs.data();
  p.causal = causal;
  p.reduce_heads = reduce_heads;
  p.out = dense.data<float>();
  Tensor q_sf, k_sf;
  if (fp4) {
    // The scale buffers must hold the 128x4 layout of every row the kernel can read (upstream
    // does not check; an undersized buffer would be read out of bounds).
    auto sf_bytes = [](int64_t rows) {
      return kernels::sf_buffer_size(kernels::SfLayoutCode::k128x4, rows, kMsaTile / 16);
    };
    const int64_t q_rows = total_q * Hq,
                  k_rows = paged ? k.size(0) * Hkv * kMsaTile : k.size(0) * Hkv;
    q_sf = fp4->q_scale.contiguous().reshape({-1});
    k_sf = fp4->k_scale.contiguous().reshape({-1});
    FLASHINFER_CHECK(q_sf.numel() >= sf_bytes(q_rows), op, "q_scale", "holds ", q_sf.numel(),
                     " bytes; the 128x4 scales of ", q_rows, " rows take ", sf_bytes(q_rows));
    FLASHINFER_CHECK(k_sf.numel() >= sf_bytes(k_rows), op, "k_scale", "holds ", k_sf.numel(),
                     " bytes; the 128x4 scales of ", k_rows, " rows take ", sf_bytes(k_rows));
    api::check_same_device(q_sf, q, op, "q_scale", q_arg);
    api::check_same_device(k_sf, q, op, "k_scale", q_arg);
    p.fp4 = true;
    p.q_sf = q_sf.data<uint8_t>();
    p.k_sf = k_sf.data<uint8_t>();
    p.fp4_global = static_cast<float>(fp4->q_global * fp4->k_global);
  }
  api::launch(kProxyKernels, p, q.device(), op, q_arg);
  if (!output->is_contiguous()) output->copy_(dense);
  return *output;
}

// The keys both sparse attention ops read: flat (cu_k) or paged (page_table, seqused_k), checked
// on the host; fills p's key fields (the vectors it points into live in the result).
struct MsaKeys {
  std::vector<int32_t> cu_k, pages, used;
};
MsaKeys attn_keys(const char* op, const Tensor& k, const std::optional<Tensor>& cu_seqlens_k,
                  const std::optional<Tensor>& page_table, const std::optional<Tensor>& seqused_k,
                  int64_t B, kernels::MsaAttnParams& p) {
  MsaKeys r;
  const bool paged = page_table && page_table->defined();
  if (paged) {
    api::check_dim(*page_table, {2}, op, "page_table");
    FLASHINFER_CHECK(page_table->dtype() == DType::kInt32 && page_table->size(0) == B, op,
                     "page_table", "page_table must be int32 of shape (batch, max_pages)");
    r.pages = to_i32(ints(page_table->contiguous()));
    p.page_stride = page_table->size(1);
    p.kv_stride_page = k.stride(0), p.kv_stride_h = k.stride(1), p.kv_stride_row = k.stride(2);
  } else {
    p.kv_stride_row = k.stride(0), p.kv_stride_h = k.stride(1);
  }
  std::vector<int64_t> lens(static_cast<size_t>(B));
  if (cu_seqlens_k && cu_seqlens_k->defined()) {  // wins over seqused_k, as upstream's
    check_int32_vector(*cu_seqlens_k, op, "cu_seqlens_k");
    FLASHINFER_CHECK(cu_seqlens_k->size(0) == B + 1, op, "cu_seqlens_k",
                     "cu_seqlens_k must have batch_size + 1 entries");
    r.cu_k = to_i32(ints(*cu_seqlens_k));
    for (int64_t b = 0; b < B; ++b) {
      FLASHINFER_CHECK(
          r.cu_k[b] >= 0 && r.cu_k[b + 1] >= r.cu_k[b] && (paged || r.cu_k[b + 1] <= k.size(0)), op,
          "cu_seqlens_k", "must be non-decreasing and within k's rows");
      lens[b] = r.cu_k[b + 1] - r.cu_k[b];
    }
    if (paged) r.used = std::vector<int32_t>(lens.begin(), lens.end());
  } else {
    FLASHINFER_CHECK(seqused_k && seqused_k->defined(), op, "seqused_k",
                     "seqused_k must be given with page_table");
    check_int32_vector(*seqused_k, op, "seqused_k");
    FLASHINFER_CHECK(seqused_k->size(0) == B, op, "seqused_k", "seqused_k must have batch_size (",
                     B, ") entries");
    r.used = to_i32(ints(*seqused_k));
    for (int64_t b = 0; b < B; ++b) lens[b] = r.used[b];
  }
  if (paged) {
    for (int64_t b = 0; b < B; ++b) {
      FLASHINFER_CHECK(lens[b] >= 0 && lens[b] <= p.page_stride * kMsaTile, op, "seqused_k",
                       "request ", b, " has ", lens[b], " keys, more than its ", p.page_stride,
                       " pages of 128 hold");
      for (int64_t t = 0; t * kMsaTile < lens[b]; ++t) {
        const int64_t pg = r.pages[b * p.page_stride + t];
        FLASHINFER_CHECK(pg >= 0 && pg < k.size(0), op, "page_table", "entry (", b, ", ", t,
                         ") is ", pg, ", outside the ", k.size(0), " pages of k");
      }
    }
  }
  return r;
}

// Points p at the key vectors of `keys` (after the MsaKeys has its final address).
void attn_bind_keys(const MsaKeys& keys, bool paged, kernels::MsaAttnParams& p) {
  p.cu_k = paged ? nullptr : keys.cu_k.data();
  p.page_table = paged ? keys.pages.data() : nullptr;
  p.seqused_k = paged ? keys.used.data() : nullptr;
}

// The checks both ops share on k / v and the fp8 / NVFP4 rules; q's compute dtype `cdt`.
void attn_kv_checks(const char* op, const Tensor& q, DType cdt, const Tensor& k, const Tensor& v,
                    bool paged, const std::optional<Tensor>& k_scale,
                    const std::optional<Tensor>& v_scale) {
  api::check_defined(k, op, "k");
  api::check_defined(v, op, "v");
  FLASHINFER_CHECK_CODE(k.dtype() != DType::kUInt8 && v.dtype() != DType::kUInt8 &&
                            !(k_scale && k_scale->defined()) && !(v_scale && v_scale->defined()),
                        ErrorCode::kUnsupported, op, "k",
                        "NVFP4 K/V (packed uint8 with k_scale / v_scale) is not implemented in "
                        "flashinfer-cpp");
  if (k.dtype() == DType::kFloat8E4M3FN || v.dtype() == DType::kFloat8E4M3FN) {
    FLASHINFER_CHECK(k.dtype() == v.dtype(), op, "v", "k and v must both be float8_e4m3fn");
  } else {
    FLASHINFER_CHECK(k.dtype() == cdt, op, "k", "k/v dtype must match q (or be fp8/packed NVFP4)");
  }
  if (paged) {
    FLASHINFER_CHECK(k.dim() == 4 && k.size(2) == kMsaTile && k.size(3) == kMsaTile, op, "k",
                     "paged k/v must be (num_pages, num_kv_heads, 128, 128), got ",
                     shape_to_string(k.shape()));
  } else {
    FLASHINFER_CHECK(k.dim() == 3 && k.size(2) == kMsaTile, op, "k",
                     "flat k/v must be (total_k, num_kv_heads, head_dim)");
  }
  FLASHINFER_CHECK(v.shape() == k.shape() && v.dtype() == k.dtype(), op, "v",
                   "v must have the same shape and dtype as k");
  FLASHINFER_CHECK(v.strides() == k.strides(), op, "v", "v must have k's strides");
  api::check_same_device(k, q, op, "k", "q");
  api::check_same_device(v, q, op, "v", "q");
  FLASHINFER_CHECK(k.stride(-1) == 1, op, "k", "k must have stride 1 in the head dim");
  FLASHINFER_CHECK(k.size(1) >= 1 && q.size(1) % k.size(1) == 0, op, "k",
                   "num_qo_heads must be a multiple of num_kv_heads");
}

MsaAttentionOutput attn_run(const char* op, const Tensor& q, DType cdt, const Tensor& k,
                            const Tensor& v, const Tensor& q2k, kernels::MsaAttnParams& p,
                            std::optional<double> softmax_scale,
                            std::optional<double> v_global_scale, bool want_lse, bool want_lse_t,
                            double temperature) {
  const int64_t total_q = q.size(0), Hq = q.size(1);
  MsaAttentionOutput r;
  r.out = Tensor::empty({total_q, Hq, kMsaTile}, cdt, q.device());
  if (want_lse || want_lse_t) r.lse = Tensor::empty({total_q, Hq}, DType::kFloat32, q.device());
  if (want_lse_t) r.lse_t = Tensor::empty({total_q, Hq}, DType::kFloat32, q.device());
  p.q = q.data_ptr(), p.q_dtype = q.dtype();
  p.q_stride_t = q.stride(0), p.q_stride_h = q.stride(1);
  p.k = k.data_ptr(), p.v = v.data_ptr(), p.kv_dtype = k.dtype();
  p.Hq = Hq, p.Hkv = k.size(1), p.total_q = total_q, p.topk = q2k.size(2);
  p.q2k = q2k.data<int32_t>();
  // k_global_scale scales NVFP4 keys only (refused above); v_global_scale every output.
  p.scale = static_cast<float>(softmax_scale.value_or(1.0 / std::sqrt(128.0)));
  p.v_global_scale = static_cast<float>(v_global_scale.value_or(1.0));
  p.out = r.out.data_ptr(), p.out_dtype = cdt;
  p.lse = r.lse.defined() ? r.lse.data<float>() : nullptr;
  p.lse_t = r.lse_t.defined() ? r.lse_t.data<float>() : nullptr;
  p.temperature = static_cast<float>(temperature);
  api::launch(kAttnKernels, p, q.device(), op, "q");
  return r;
}

MsaAttentionOutput prefill_impl(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q2k,
    const Tensor& cu_seqlens_q, const std::optional<Tensor>& cu_seqlens_k, bool causal,
    std::optional<double> softmax_scale, const std::optional<Tensor>& page_table,
    const std::optional<Tensor>& seqused_k, bool return_lse, const std::optional<Tensor>& k_scale,
    const std::optional<Tensor>& v_scale, std::optional<double> v_global_scale,
    const std::optional<Value>& q_offset, bool return_lse_t, double temperature) {
  const char* op = "msa_sparse_attention";
  api::check_defined(q, op, "q");
  api::check_upstream_arch(op, "q", q.device());
  FLASHINFER_CHECK(q.dtype() == DType::kBFloat16 || q.dtype() == DType::kFloat16, op, "q",
                   "q must be bf16/fp16, got ", dtype_torch_name(q.dtype()));
  FLASHINFER_CHECK(q.dim() == 3, op, "q", "q must be 3D (total_q, num_qo_heads, head_dim)");
  FLASHINFER_CHECK(q.size(2) == kMsaTile, op, "q", "head_dim must be 128, got ", q.size(2));
  FLASHINFER_CHECK(q.is_contiguous(), op, "q", "q must be contiguous");
  api::check_defined(q2k, op, "q2k_indices");
  FLASHINFER_CHECK(q2k.dtype() == DType::kInt32 && q2k.dim() == 3, op, "q2k_indices",
                   "q2k_indices must be int32 of shape (Hkv, total_q, topk)");
  FLASHINFER_CHECK(q2k.is_contiguous(), op, "q2k_indices", "q2k_indices must be contiguous");
  const bool paged = page_table && page_table->defined();
  attn_kv_checks(op, q, q.dtype(), k, v, paged, k_scale, v_scale);
  if (!paged) {
    FLASHINFER_CHECK(cu_seqlens_k && cu_seqlens_k->defined(), op, "cu_seqlens_k",
                     "cu_seqlens_k is required for the non-paged path");
  } else {
    FLASHINFER_CHECK(
        (seqused_k && seqused_k->defined()) || (cu_seqlens_k && cu_seqlens_k->defined()), op,
        "seqused_k", "paged KV requires seqused_k");
  }
  // Upstream checks the dtype and rank only; rows past the tensor would be read out of bounds.
  FLASHINFER_CHECK(q2k.size(0) == k.size(1) && q2k.size(1) == q.size(0), op, "q2k_indices",
                   "q2k_indices must be int32 of shape (Hkv, total_q, topk)");
  const int64_t topk = q2k.size(2);
  FLASHINFER_CHECK(topk == 4 || topk == 8 || topk == 16 || topk == 32, op, "q2k_indices",
                   "topk must be 4, 8, 16, or 32, got ", topk);
  const int64_t G = q.size(1) / k.size(1);
  FLASHINFER_CHECK(G >= 1 && G <= 128 && (G & (G - 1)) == 0, op, "q",
                   "union path needs group_size dividing 32/64/128 with <= 32 tokens/tile, got "
                   "group_size ",
                   G);
  check_int32_vector(cu_seqlens_q, op, "cu_seqlens_q");
  const std::vector<int64_t> cq = ints(cu_seqlens_q);
  const int64_t B = static_cast<int64_t>(cq.size()) - 1;
  FLASHINFER_CHECK(B >= 0, op, "cu_seqlens_q", "needs at least one entry");
  for (int64_t b = 0; b < B; ++b) {
    FLASHINFER_CHECK(cq[b] >= 0 && cq[b + 1] >= cq[b] && cq[b + 1] <= q.size(0), op, "cu_seqlens_q",
                     "must be non-decreasing and within q's ", q.size(0), " rows");
  }
  kernels::MsaAttnParams p;
  const std::vector<int32_t> cq32(cq.begin(), cq.end());
  p.cu_q = cq32.data();
  p.B = B;
  const MsaKeys keys = attn_keys(op, k, cu_seqlens_k, page_table, seqused_k, B, p);
  attn_bind_keys(keys, paged, p);
  const std::vector<int32_t> offs = q_offsets(op, q_offset, B, p);
  p.q_offset = offs.empty() ? nullptr : offs.data();
  p.causal = causal;
  return attn_run(op, q, q.dtype(), k, v, q2k, p, softmax_scale, v_global_scale, return_lse,
                  return_lse_t, temperature);
}

MsaAttentionOutput decode_impl(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q2k,
    const std::optional<Tensor>& page_table, const std::optional<Tensor>& seqused_k,
    const std::optional<Tensor>& cu_seqlens_k, int64_t seqlen_q, bool causal,
    std::optional<double> softmax_scale, bool return_lse, const std::optional<Tensor>& k_scale,
    const std::optional<Tensor>& v_scale, std::optional<double> v_global_scale,
    const std::optional<Value>& q_offset, std::optional<DType> partial_dtype) {
  const char* op = "msa_sparse_decode_attention";
  api::check_defined(q, op, "q");
  api::check_upstream_arch(op, "q", q.device());
  FLASHINFER_CHECK(q.dim() == 3, op, "q", "q must be 3D (total_q, num_qo_heads, head_dim)");
  FLASHINFER_CHECK(seqlen_q > 0, op, "seqlen_q", "seqlen_q must be positive, got ", seqlen_q);
  const int64_t total_q = q.size(0);
  FLASHINFER_CHECK(total_q % seqlen_q == 0, op, "q", "q rows (", total_q,
                   ") must be batch_size * seqlen_q (", seqlen_q, ")");
  const int64_t B = total_q / seqlen_q;
  FLASHINFER_CHECK(q.dtype() == DType::kBFloat16 || q.dtype() == DType::kFloat16 ||
                       q.dtype() == DType::kFloat8E4M3FN,
                   op, "q", "q must be bf16/fp16/fp8_e4m3, got ", dtype_torch_name(q.dtype()));
  FLASHINFER_CHECK(q.size(2) == kMsaTile, op, "q", "head_dim must be 128, got ", q.size(2));
  FLASHINFER_CHECK(q.stride(2) == 1, op, "q", "q must have stride 1 in the head dim");
  const DType cdt = q.dtype() == DType::kFloat8E4M3FN ? DType::kBFloat16 : q.dtype();
  api::check_defined(k, op, "k");
  FLASHINFER_CHECK(k.dim() >= 2 && k.size(1) >= 1 && q.size(1) % k.size(1) == 0, op, "k",
                   "num_qo_heads must be a multiple of num_kv_heads");
  const int64_t G = q.size(1) / k.size(1);
  FLASHINFER_CHECK(G <= 16, op, "q", "GQA group size ", G, " must be <= 16 for decode");
  api::check_defined(q2k, op, "q2k_indices");
  FLASHINFER_CHECK(q2k.dim() == 3 && q2k.dtype() == DType::kInt32 && q2k.size(0) == k.size(1) &&
                       q2k.size(1) == total_q,
                   op, "q2k_indices", "q2k_indices must be int32 (num_kv_heads, total_q, topk)");
  FLASHINFER_CHECK(q2k.is_contiguous(), op, "q2k_indices", "q2k_indices must be contiguous");
  FLASHINFER_CHECK(q2k.size(2) > 0, op, "q2k_indices",
                   "q2k_indices topk dimension must be positive");
  const bool paged = page_table && page_table->defined();
  attn_kv_checks(op, q, cdt, k, v, paged, k_scale, v_scale);
  if (paged) {
    FLASHINFER_CHECK(seqused_k && seqused_k->defined(), op, "seqused_k",
                     "paged decode requires seqused_k");
  } else {
    FLASHINFER_CHECK(cu_seqlens_k && cu_seqlens_k->defined(), op, "cu_seqlens_k",
                     "flat decode requires cu_seqlens_k");
  }
  if (partial_dtype) {
    FLASHINFER_CHECK(
        *partial_dtype == DType::kFloat32 || *partial_dtype == DType::kBFloat16 ||
            *partial_dtype == DType::kFloat16 || *partial_dtype == DType::kFloat8E4M3FN,
        op, "partial_dtype", "unsupported partial_dtype ", dtype_torch_name(*partial_dtype));
  }
  kernels::MsaAttnParams p;
  std::vector<int32_t> cq;
  for (int64_t b = 0; b <= B; ++b) cq.push_back(static_cast<int32_t>(b * seqlen_q));
  p.cu_q = cq.data();
  p.B = B;
  // Paged decode takes its lengths from seqused_k (cu_seqlens_k is the flat path's).
  const MsaKeys keys =
      attn_keys(op, k, paged ? std::nullopt : cu_seqlens_k, page_table, seqused_k, B, p);
  attn_bind_keys(keys, paged, p);
  const std::vector<int32_t> offs = q_offsets(op, q_offset, B, p);
  p.q_offset = offs.empty() ? nullptr : offs.data();
  p.causal = causal;
  return attn_run(op, q, cdt, k, v, q2k, p, softmax_scale, v_global_scale, return_lse, false, 1.0);
}

// ---- bench hooks ----

// The proxy scores of batch_size requests of s_qo queries (num_qo_heads over num_kv_heads heads,
// head dim 128) against s_kv keys each, causal, flat keys.
BenchCase bench_proxy(const BenchShape& s, Device dev) {
  const int64_t B = s.batch_size, sq = std::max<int64_t>(1, s.s_qo),
                sk = std::max<int64_t>(1, s.s_kv);
  std::vector<int64_t> cq = {0}, ck = {0};
  for (int64_t b = 0; b < B; ++b) {
    cq.push_back(cq.back() + sq);
    ck.push_back(ck.back() + sk);
  }
  using api::bench::random_tensor;
  const DType dt = s.q_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  BenchCase c = api::bench::invoke_case(
      "msa_proxy_score",
      {Value(random_tensor({B * sq, s.num_qo_heads, kMsaTile}, dt, dev, s.random_seed)),
       Value(random_tensor({B * sk, s.num_kv_heads, kMsaTile}, dt, dev, s.random_seed + 1)),
       Value(api::bench::int32_tensor(cq, dev)), Value(api::bench::int32_tensor(ck, dev))});
  c.bytes = static_cast<double>(B * (sq * s.num_qo_heads + sk * s.num_kv_heads) * kMsaTile) * 2.0;
  c.flops = 2.0 * static_cast<double>(B * sq * s.num_qo_heads * sk * kMsaTile);
  return c;
}

// msa_proxy_score's shape on NVFP4 operands: packed bytes and e4m3 scales in [0.5, 2] drawn from
// the seed.
BenchCase bench_proxy_fp4(const BenchShape& s, Device dev) {
  const int64_t B = s.batch_size, sq = std::max<int64_t>(1, s.s_qo),
                sk = std::max<int64_t>(1, s.s_kv);
  std::vector<int64_t> cq = {0}, ck = {0};
  for (int64_t b = 0; b < B; ++b) {
    cq.push_back(cq.back() + sq);
    ck.push_back(ck.back() + sk);
  }
  uint64_t state = s.random_seed * 2654435761u + 1;
  auto bytes = [&](Shape shape, int lo, int span) {
    Tensor t = Tensor::empty(std::move(shape), DType::kUInt8);
    auto* p = static_cast<uint8_t*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel(); ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      p[i] =
          static_cast<uint8_t>(lo + static_cast<int>((state >> 33) % static_cast<uint64_t>(span)));
    }
    return t.to(dev);
  };
  auto sf_rows = [](int64_t rows) {
    return kernels::sf_buffer_size(kernels::SfLayoutCode::k128x4, rows, kMsaTile / 16);
  };
  const int64_t qr = B * sq * s.num_qo_heads, kr = B * sk * s.num_kv_heads;
  BenchCase c = api::bench::invoke_case(
      "msa_proxy_score_fp4",
      {Value(bytes({B * sq, s.num_qo_heads, kMsaTile / 2}, 0, 256)),
       Value(bytes({B * sk, s.num_kv_heads, kMsaTile / 2}, 0, 256)),
       Value(bytes({sf_rows(qr)}, 0x30, 16)), Value(bytes({sf_rows(kr)}, 0x30, 16)), Value(0.01),
       Value(0.02), Value(api::bench::int32_tensor(cq, dev)),
       Value(api::bench::int32_tensor(ck, dev))});
  c.bytes = static_cast<double>(qr + kr) * (kMsaTile / 2 + kMsaTile / 16);
  c.flops = 2.0 * static_cast<double>(B * sq * s.num_qo_heads * sk * kMsaTile);
  return c;
}

// The selection over the scores of batch_size * s_qo queries, num_qo_heads heads and
// ceil(s_kv / 128) tiles (at least 16).
BenchCase bench_topk(const BenchShape& s, Device dev) {
  const int64_t S = s.batch_size * std::max<int64_t>(1, s.s_qo);
  const int64_t P = std::max<int64_t>(16, (s.s_kv + kMsaTile - 1) / kMsaTile);
  BenchCase c = api::bench::invoke_case(
      "msa_topk_select", {Value(api::bench::random_tensor({s.num_qo_heads, P, S}, DType::kFloat32,
                                                          dev, s.random_seed)),
                          Value(int64_t{16})});
  c.bytes = static_cast<double>(s.num_qo_heads * P * S) * 4.0 +
            static_cast<double>(S * s.num_qo_heads * 16) * 4.0;
  return c;
}

// Sparse attention: batch_size requests of s_qo queries over s_kv keys, each query attending its
// request's last tiles (16 for the prefill, 4 for the decode), causal.
std::vector<Value> bench_attn_args(const BenchShape& s, Device dev, int64_t sq, int64_t topk,
                                   std::vector<int64_t>& cq, std::vector<int64_t>& ck) {
  const int64_t B = s.batch_size, sk = std::max<int64_t>(1, s.s_kv);
  const int64_t tiles = (sk + kMsaTile - 1) / kMsaTile;
  cq = {0}, ck = {0};
  for (int64_t b = 0; b < B; ++b) {
    cq.push_back(cq.back() + sq);
    ck.push_back(ck.back() + sk);
  }
  std::vector<int64_t> idx;
  for (int64_t h = 0; h < s.num_kv_heads; ++h) {
    for (int64_t r = 0; r < B * sq; ++r) {
      for (int64_t e = 0; e < topk; ++e) idx.push_back(e < tiles ? tiles - 1 - e : -1);
    }
  }
  using api::bench::random_tensor;
  const DType dt = s.q_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  Tensor q2k = api::bench::int32_tensor(idx, dev).reshape({s.num_kv_heads, B * sq, topk});
  return {Value(random_tensor({B * sq, s.num_qo_heads, kMsaTile}, dt, dev, s.random_seed)),
          Value(random_tensor({B * sk, s.num_kv_heads, kMsaTile}, dt, dev, s.random_seed + 1)),
          Value(random_tensor({B * sk, s.num_kv_heads, kMsaTile}, dt, dev, s.random_seed + 2)),
          Value(q2k)};
}

// Bytes: q and out once, each row's listed tiles of K and V (up to topk tiles of 128 keys).
double attn_bytes(const BenchShape& s, int64_t sq, int64_t topk) {
  const double rows = static_cast<double>(s.batch_size * sq);
  const double tiles = std::min<double>(
      static_cast<double>(topk),
      std::ceil(static_cast<double>(std::max<int64_t>(1, s.s_kv)) / static_cast<double>(kMsaTile)));
  return rows * static_cast<double>(s.num_qo_heads * kMsaTile) * 2.0 * 2.0 +
         rows * static_cast<double>(s.num_kv_heads) * tiles * kMsaTile * kMsaTile * 2.0 * 2.0;
}

BenchCase bench_sparse_prefill(const BenchShape& s, Device dev) {
  std::vector<int64_t> cq, ck;
  const int64_t sq = std::max<int64_t>(1, s.s_qo);
  std::vector<Value> a = bench_attn_args(s, dev, sq, 16, cq, ck);
  a.push_back(Value(api::bench::int32_tensor(cq, dev)));
  a.push_back(Value(api::bench::int32_tensor(ck, dev)));
  BenchCase c = api::bench::invoke_case("msa_sparse_attention", a, {{"causal", Value(true)}});
  c.bytes = attn_bytes(s, sq, 16);
  c.flops =
      4.0 * static_cast<double>(s.batch_size * sq * s.num_qo_heads * 16 * kMsaTile * kMsaTile);
  return c;
}

BenchCase bench_sparse_decode(const BenchShape& s, Device dev) {
  std::vector<int64_t> cq, ck;
  const int64_t sq = std::max<int64_t>(1, s.s_qo);
  std::vector<Value> a = bench_attn_args(s, dev, sq, 4, cq, ck);
  BenchCase c = api::bench::invoke_case(
      "msa_sparse_decode_attention", a,
      {{"cu_seqlens_k", Value(api::bench::int32_tensor(ck, dev))}, {"seqlen_q", Value(sq)}});
  c.bytes = attn_bytes(s, sq, 4);
  c.flops = 4.0 * static_cast<double>(s.batch_size * sq * s.num_qo_heads * 4 * kMsaTile * kMsaTile);
  return c;
}

}  // namespace

Tensor msa_topk_select(const Tensor& max_score, int64_t topk, std::optional<Value> num_valid_pages,
                       std::optional<Tensor> output, int64_t force_begin_blocks,
                       int64_t force_end_blocks) {
  return call_op<&msa_topk_select>(
      [&] {
        return topk_impl(max_score, topk, num_valid_pages, output, force_begin_blocks,
                         force_end_blocks);
      },
      max_score, topk, num_valid_pages, output, force_begin_blocks, force_end_blocks);
}

Tensor msa_proxy_score(const Tensor& q, const Tensor& k, const Tensor& cu_seqlens_q,
                       std::optional<Tensor> cu_seqlens_k, std::optional<Tensor> page_table,
                       std::optional<Tensor> seqused_k, bool causal,
                       std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_k_tiles,
                       std::optional<Tensor> output, bool reduce_heads,
                       std::optional<Value> q_offset) {
  return call_op<&msa_proxy_score>(
      [&] {
        return proxy_impl(nullptr, q, k, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, causal,
                          max_seqlen_q, max_k_tiles, output, reduce_heads, q_offset);
      },
      q, k, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, causal, max_seqlen_q, max_k_tiles,
      output, reduce_heads, q_offset);
}

MsaAttentionOutput msa_sparse_attention(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q2k_indices,
    const Tensor& cu_seqlens_q, std::optional<Tensor> cu_seqlens_k, bool causal,
    std::optional<double> softmax_scale, std::optional<Tensor> page_table,
    std::optional<Tensor> seqused_k, bool return_softmax_lse, std::optional<Tensor> k_scale,
    std::optional<Tensor> v_scale, std::optional<double> k_global_scale,
    std::optional<double> v_global_scale, std::optional<Value> q_offset,
    bool return_temperature_lse, double lse_temperature_scale) {
  return call_op<&msa_sparse_attention>(
      [&] {
        return prefill_impl(q, k, v, q2k_indices, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale,
                            page_table, seqused_k, return_softmax_lse, k_scale, v_scale,
                            v_global_scale, q_offset, return_temperature_lse,
                            lse_temperature_scale);
      },
      q, k, v, q2k_indices, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, page_table,
      seqused_k, return_softmax_lse, k_scale, v_scale, k_global_scale, v_global_scale, q_offset,
      return_temperature_lse, lse_temperature_scale);
}

MsaAttentionOutput msa_sparse_decode_attention(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q2k_indices,
    std::optional<Tensor> page_table, std::optional<Tensor> seqused_k,
    std::optional<Tensor> cu_seqlens_k, int64_t seqlen_q, bool causal,
    std::optional<double> softmax_scale, bool return_softmax_lse, std::optional<Tensor> k_scale,
    std::optional<Tensor> v_scale, std::optional<double> k_global_scale,
    std::optional<double> v_global_scale, std::optional<Value> q_offset,
    std::optional<DType> partial_dtype, std::optional<bool> force_fused) {
  return call_op<&msa_sparse_decode_attention>(
      [&] {
        return decode_impl(q, k, v, q2k_indices, page_table, seqused_k, cu_seqlens_k, seqlen_q,
                           causal, softmax_scale, return_softmax_lse, k_scale, v_scale,
                           v_global_scale, q_offset, partial_dtype);
      },
      q, k, v, q2k_indices, page_table, seqused_k, cu_seqlens_k, seqlen_q, causal, softmax_scale,
      return_softmax_lse, k_scale, v_scale, k_global_scale, v_global_scale, q_offset, partial_dtype,
      force_fused);
}

Tensor msa_proxy_score_fp4(const Tensor& q_fp4, const Tensor& k_fp4, const Tensor& q_scale,
                           const Tensor& k_scale, double q_global_scale, double k_global_scale,
                           const Tensor& cu_seqlens_q, std::optional<Tensor> cu_seqlens_k,
                           std::optional<Tensor> page_table, std::optional<Tensor> seqused_k,
                           bool causal, std::optional<int64_t> max_seqlen_q,
                           std::optional<int64_t> max_k_tiles, std::optional<Tensor> output,
                           bool reduce_heads, std::optional<Value> q_offset) {
  return call_op<&msa_proxy_score_fp4>(
      [&] {
        const Fp4Proxy fp4{q_scale, k_scale, q_global_scale, k_global_scale};
        return proxy_impl(&fp4, q_fp4, k_fp4, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k,
                          causal, max_seqlen_q, max_k_tiles, output, reduce_heads, q_offset);
      },
      q_fp4, k_fp4, q_scale, k_scale, q_global_scale, k_global_scale, cu_seqlens_q, cu_seqlens_k,
      page_table, seqused_k, causal, max_seqlen_q, max_k_tiles, output, reduce_heads, q_offset);
}

namespace detail {

void register_msa_ops(OpRegistry& r) {
  declare<&msa_proxy_score_fp4>(
      r,
      {.name = "msa_proxy_score_fp4",
       .module = kProxyModule,
       .summary = "MiniMax sparse attention: per-KV-tile maxima of NVFP4 q . k logits"},
      "q_fp4", "k_fp4", "q_scale", "k_scale", "q_global_scale", "k_global_scale", "cu_seqlens_q",
      "cu_seqlens_k", arg("page_table").kw(), arg("seqused_k").kw(), arg("causal", true).kw(),
      arg("max_seqlen_q").kw(), arg("max_k_tiles").kw(), arg("output").mut().kw(),
      arg("reduce_heads", false).kw(), arg("q_offset").kw());
  api::register_backends("msa_proxy_score_fp4", kProxyKernels);
  register_bench_hook("msa_proxy_score_fp4", bench_proxy_fp4);
  declare<&msa_sparse_attention>(
      r,
      {.name = "msa_sparse_attention",
       .module = kPrefillModule,
       .summary = "MiniMax sparse prefill attention over the KV tiles each query selected"},
      "q", "k", "v", "q2k_indices", "cu_seqlens_q", "cu_seqlens_k", arg("causal", false),
      "softmax_scale", "page_table", "seqused_k", arg("return_softmax_lse", false), "k_scale",
      "v_scale", "k_global_scale", "v_global_scale", "q_offset",
      arg("return_temperature_lse", false), arg("lse_temperature_scale", 1.0));
  declare<&msa_sparse_decode_attention>(
      r,
      {.name = "msa_sparse_decode_attention",
       .module = kDecodeModule,
       .summary = "MiniMax sparse decode attention over the KV tiles each query selected"},
      "q", "k", "v", "q2k_indices", arg("page_table").kw(), arg("seqused_k").kw(),
      arg("cu_seqlens_k").kw(), arg("seqlen_q", int64_t{1}).kw(), arg("causal", true).kw(),
      arg("softmax_scale").kw(), arg("return_softmax_lse", false).kw(), arg("k_scale").kw(),
      arg("v_scale").kw(), arg("k_global_scale").kw(), arg("v_global_scale").kw(),
      arg("q_offset").kw(), arg("partial_dtype").kw(), arg("force_fused").kw());
  api::register_backends("msa_sparse_attention", kAttnKernels);
  api::register_backends("msa_sparse_decode_attention", kAttnKernels);
  register_bench_hook("msa_sparse_attention", bench_sparse_prefill);
  register_bench_hook("msa_sparse_decode_attention", bench_sparse_decode);

  declare<&msa_topk_select>(
      r,
      {.name = "msa_topk_select",
       .module = kTopkModule,
       .summary = "MiniMax sparse attention: the top-16 KV tiles per query and head"},
      "max_score", "topk", "num_valid_pages", arg("output").mut(),
      arg("force_begin_blocks", int64_t{0}), arg("force_end_blocks", int64_t{0}));
  declare<&msa_proxy_score>(
      r,
      {.name = "msa_proxy_score",
       .module = kProxyModule,
       .summary = "MiniMax sparse attention: per-KV-tile maxima of the unscaled q . k logits"},
      "q", "k", "cu_seqlens_q", "cu_seqlens_k", arg("page_table").kw(), arg("seqused_k").kw(),
      arg("causal", true).kw(), arg("max_seqlen_q").kw(), arg("max_k_tiles").kw(),
      arg("output").mut().kw(), arg("reduce_heads", false).kw(), arg("q_offset").kw());
  api::register_backends("msa_topk_select", kTopkKernels);
  api::register_backends("msa_proxy_score", kProxyKernels);
  register_bench_hook("msa_proxy_score", bench_proxy);
  register_bench_hook("msa_topk_select", bench_topk);
}

}  // namespace detail

}  // namespace flashinfer
