// rope_quantize_fp8_append_paged_kv_cache (flashinfer.rope): the queries through rope_quantize_fp8
// (a nested, unrecorded call: the same reference), the keys quantized the same way and, with the
// values, scattered into the paged cache: on the host for CPU tensors, by a CUDA kernel
// (kernels/cuda/rope_quantize_append_cuda.cu) for device tensors. Slots are checked on the host.
#include "flashinfer/ops/rope_quantize_append.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/rope_quantize.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/rope_quantize_append_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kRopeQuantizeAppendOp = "rope_quantize_fp8_append_paged_kv_cache";

uint8_t to_fp8(float x, DType d) {
  return d == DType::kFloat8E4M3FN ? float_to_e4m3fn_bits(x, true) : float_to_e5m2_bits(x, true);
}

// Copies the 1-byte elements of src row [n] (contiguous) to dst at element offset off.
void put_row(const Tensor& dst, int64_t off, const uint8_t* src, int64_t n) {
  std::memcpy(static_cast<uint8_t*>(dst.data_ptr()) + off, src, static_cast<std::size_t>(n));
}

// The device scatter: the (page, slot) pairs checked on the host go to the device once.
// Upstream converts the four index arrays with `.int()`: int32 as is, int64 narrowed (two's
// complement, as torch's cast) before anything reads them.
std::vector<int32_t> index_as_int(const Tensor& t, const char* arg, int64_t expected_len) {
  api::check_defined(t, kRopeQuantizeAppendOp, arg);
  if (t.dtype() != DType::kInt64) {
    return api::index_to_host(t, kRopeQuantizeAppendOp, arg, expected_len);
  }
  api::check_dim(t, {1}, kRopeQuantizeAppendOp, arg);
  if (expected_len >= 0) {
    FLASHINFER_CHECK(t.size(0) == expected_len, kRopeQuantizeAppendOp, arg, "expected ",
                     expected_len, " elements, got ", t.size(0));
  }
  const Tensor h = t.to(Device::cpu()).contiguous();
  const auto* p = h.data<const int64_t>();
  std::vector<int32_t> v(static_cast<std::size_t>(h.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(p[i]);
  return v;
}

void scatter_cuda(const Tensor& kr, const Tensor& kn, const Tensor& v,
                  const std::vector<std::pair<int64_t, int64_t>>& slot, const Tensor& c0,
                  const Tensor& c1, bool mla, bool hnd, int64_t hk, int64_t rope, int64_t nope,
                  DType qd, float v_scale, bool enable_pdl) {
#if FLASHINFER_WITH_CUDA
  const auto nnz = static_cast<int64_t>(slot.size());
  std::vector<int64_t> flat;
  flat.reserve(slot.size() * 2);
  for (const auto& [page, s] : slot) {
    flat.push_back(page);
    flat.push_back(s);
  }
  const Tensor slots =
      Tensor::from_vector(std::vector<double>(flat.begin(), flat.end()), {nnz, 2}, DType::kInt64)
          .to(c0.device());
  kernels::cuda::PagedFp8AppendParams p;
  p.nnz = nnz;
  p.heads = hk;
  p.rope = rope;
  p.nope = nope;
  p.mla = mla;
  p.hnd = hnd;
  p.k_rope = static_cast<const uint8_t*>(kr.data_ptr());
  p.k_nope = nope > 0 ? static_cast<const uint8_t*>(kn.data_ptr()) : nullptr;
  if (!mla) {
    p.v = v.data_ptr();
    p.v_dtype = v.dtype();
  }
  p.fp8 = qd;
  p.v_scale = v_scale;
  p.slots = slots.data<int64_t>();
  p.cache0 = static_cast<uint8_t*>(c0.data_ptr());
  p.cache1 = static_cast<uint8_t*>(c1.data_ptr());
  for (int64_t d = 0; d < c0.dim(); ++d) p.stride0[d] = c0.stride(d);
  for (int64_t d = 0; d < c1.dim(); ++d) p.stride1[d] = c1.stride(d);
  const api::launch_detail::LaunchScope scope(c0.device(), enable_pdl);
  kernels::cuda::paged_fp8_append(p, scope.context().stream, scope.context().enable_pdl);
#else
  (void)kr, (void)kn, (void)v, (void)slot, (void)c0, (void)c1, (void)mla, (void)hnd, (void)hk;
  (void)rope, (void)nope, (void)qd, (void)v_scale, (void)enable_pdl;
  FLASHINFER_FAIL(ErrorCode::kUnsupported, kRopeQuantizeAppendOp, "q_rope",
                  "this build has no CUDA backend");
#endif
}

std::tuple<Tensor, Tensor> impl(const Tensor& q_rope, const Tensor& k_rope,
                                const std::optional<Tensor>& q_nope,
                                const std::optional<Tensor>& k_nope, const std::optional<Tensor>& v,
                                const Tensor& cos_sin_cache, const Tensor& pos_ids,
                                const PagedKVCache& cache, const Tensor& kv_indices,
                                const Tensor& kv_indptr, const Tensor& batch_indices,
                                const Tensor& positions, bool is_neox,
                                std::optional<DType> quantize_dtype, double sq, double skv,
                                int64_t page_size, std::string_view kv_layout,
                                const std::optional<Tensor>& q_rope_out,
                                const std::optional<Tensor>& q_nope_out, bool enable_pdl) {
  api::check_defined(q_rope, kRopeQuantizeAppendOp, "q_rope");
  api::check_defined(k_rope, kRopeQuantizeAppendOp, "k_rope");
  const Device dev = q_rope.device();
  FLASHINFER_CHECK_CODE(dev.is_cpu() || (FLASHINFER_WITH_CUDA && dev.is_cuda()),
                        ErrorCode::kUnsupported, kRopeQuantizeAppendOp, "q_rope",
                        "this build has no kernel for ", dev.str());
  FLASHINFER_CHECK(cache.is_pair(), kRopeQuantizeAppendOp, "paged_kv_cache",
                   "must be a tuple of two tensors ((k_cache, v_cache) or (ckv_cache, "
                   "kpe_cache))");
  const bool mla = k_rope.dim() == 2;
  const bool hnd = api::parse_kv_layout(kv_layout, kRopeQuantizeAppendOp, "kv_layout");
  FLASHINFER_CHECK(page_size >= 1, kRopeQuantizeAppendOp, "page_size", "must be >= 1, got ",
                   page_size);
  FLASHINFER_CHECK(q_rope.dim() == 3, kRopeQuantizeAppendOp, "q_rope",
                   "must be [nnz, num_qo_heads, rope_dim], got ", shape_to_string(q_rope.shape()));
  const int64_t nnz = q_rope.size(0), rope = q_rope.size(2);
  FLASHINFER_CHECK(
      mla ? !v.has_value() : v.has_value(), kRopeQuantizeAppendOp, "v",
      mla ? "MLA (2-D k_rope) takes no V (pass None)" : "GQA/MHA (3-D k_rope) needs a V tensor");
  const DType qd = quantize_dtype.value_or(
      q_rope_out ? q_rope_out->dtype() : (q_nope_out ? q_nope_out->dtype() : DType::kFloat8E4M3FN));
  FLASHINFER_CHECK(qd == DType::kFloat8E4M3FN || qd == DType::kFloat8E5M2, kRopeQuantizeAppendOp,
                   "quantize_dtype", "must be float8_e4m3fn or float8_e5m2, got ",
                   dtype_torch_name(qd));
  const Tensor& c0 = cache.first();
  const Tensor& c1 = cache.second();
  api::check_defined(c0, kRopeQuantizeAppendOp, "paged_kv_cache");
  api::check_defined(c1, kRopeQuantizeAppendOp, "paged_kv_cache");
  FLASHINFER_CHECK(c0.dtype() == qd && c1.dtype() == qd, kRopeQuantizeAppendOp, "paged_kv_cache",
                   "cache dtype must be the quantize dtype ", dtype_torch_name(qd), ", got ",
                   dtype_torch_name(c0.dtype()), " and ", dtype_torch_name(c1.dtype()));
  for (const Tensor* c : {&c0, &c1}) {
    FLASHINFER_CHECK(c->device() == dev, kRopeQuantizeAppendOp, "paged_kv_cache",
                     "must be on q_rope's device (", dev.str(), "), got ", c->device().str());
    FLASHINFER_CHECK(c->stride(-1) == 1 || c->size(-1) <= 1, kRopeQuantizeAppendOp,
                     "paged_kv_cache", "the feature axis must be contiguous");
    api::check_writable(*c, kRopeQuantizeAppendOp, "paged_kv_cache");
  }
  const int64_t hk = mla ? 1 : k_rope.size(1);
  const int64_t nope = k_nope ? k_nope->size(-1) : 0;
  int64_t pages = 0;
  if (mla) {
    FLASHINFER_CHECK(c0.dim() == 3 && c1.dim() == 3 && c0.size(1) == page_size &&
                         c1.size(1) == page_size && c0.size(0) == c1.size(0) &&
                         c0.size(2) == nope && c1.size(2) == rope,
                     kRopeQuantizeAppendOp, "paged_kv_cache", "MLA caches must be ckv [pages, ",
                     page_size, ", ", nope, "] and kpe [pages, ", page_size, ", ", rope, "], got ",
                     shape_to_string(c0.shape()), " and ", shape_to_string(c1.shape()));
    pages = c0.size(0);
  } else {
    const Shape want = hnd ? Shape{c0.size(0), hk, page_size, rope + nope}
                           : Shape{c0.size(0), page_size, hk, rope + nope};
    FLASHINFER_CHECK(c0.dim() == 4 && c0.shape() == want && c1.shape() == want,
                     kRopeQuantizeAppendOp, "paged_kv_cache", "k_cache and v_cache must be ",
                     shape_to_string(want), " (", kv_layout,
                     ", head_dim = rope_dim + no_rope_dim), got ", shape_to_string(c0.shape()),
                     " and ", shape_to_string(c1.shape()));
    api::check_defined(*v, kRopeQuantizeAppendOp, "v");
    FLASHINFER_CHECK(
        v->dim() == 3 && v->size(0) == nnz && v->size(1) == hk && v->size(2) == rope + nope,
        kRopeQuantizeAppendOp, "v", "must be [", nnz, ", ", hk, ", ", rope + nope, "], got ",
        shape_to_string(v->shape()));
    api::check_same_device(*v, q_rope, kRopeQuantizeAppendOp, "v", "q_rope");
    FLASHINFER_CHECK(v->dtype() == q_rope.dtype(), kRopeQuantizeAppendOp, "v",
                     "must be q_rope's dtype ", dtype_torch_name(q_rope.dtype()), ", got ",
                     dtype_torch_name(v->dtype()));
    pages = c0.size(0);
  }
  // Index arrays (host), each token's slot checked before anything is written.
  const std::vector<int32_t> bi = index_as_int(batch_indices, "batch_indices", nnz);
  const std::vector<int32_t> ps = index_as_int(positions, "positions", nnz);
  const std::vector<int32_t> indptr = index_as_int(kv_indptr, "kv_indptr", -1);
  const std::vector<int32_t> idx = index_as_int(kv_indices, "kv_indices", -1);
  FLASHINFER_CHECK(!indptr.empty(), kRopeQuantizeAppendOp, "kv_indptr",
                   "must have batch_size + 1 entries");
  api::check_indptr(indptr, kRopeQuantizeAppendOp, "kv_indptr");
  FLASHINFER_CHECK(indptr.back() <= static_cast<int64_t>(idx.size()), kRopeQuantizeAppendOp,
                   "kv_indices", "has ", idx.size(), " entries, kv_indptr ends at ", indptr.back());
  const int64_t batch = static_cast<int64_t>(indptr.size()) - 1;
  std::vector<std::pair<int64_t, int64_t>> slot(static_cast<std::size_t>(nnz));
  std::vector<int64_t> skipped;
  for (int64_t i = 0; i < nnz; ++i) {
    // A negative batch index marks a padding token (CUDA-graph batches): upstream's kernel
    // returns before touching it, so it writes no K/V and leaves its q output rows as they were.
    if (bi[i] < 0) {
      slot[i] = {-1, -1};
      skipped.push_back(i);
      continue;
    }
    FLASHINFER_CHECK(bi[i] < batch, kRopeQuantizeAppendOp, "batch_indices", "batch_indices[", i,
                     "] = ", bi[i], " is not a request (", batch, " requests)");
    FLASHINFER_CHECK(ps[i] >= 0, kRopeQuantizeAppendOp, "positions", "positions[", i, "] = ", ps[i],
                     " < 0");
    const int64_t at = indptr[bi[i]] + ps[i] / page_size;
    FLASHINFER_CHECK(at < indptr[bi[i] + 1], kRopeQuantizeAppendOp, "positions", "positions[", i,
                     "] = ", ps[i], " lies past request ", bi[i], "'s ",
                     indptr[bi[i] + 1] - indptr[bi[i]], " pages");
    FLASHINFER_CHECK(idx[at] >= 0 && idx[at] < pages, kRopeQuantizeAppendOp, "kv_indices",
                     "kv_indices[", at, "] = ", idx[at], " is not a page of the cache (", pages,
                     " pages)");
    slot[i] = {idx[at], ps[i] % page_size};
  }
  // Queries and keys: rope_quantize_fp8's reference (nested call, not recorded). What only it
  // checks (k_rope's shape, cos_sin_cache, pos_ids) is this op's caller's error: named as this
  // op's, the arguments have the same names here.
  // The given q outputs' rows of padding tokens, restored after the nested call wrote them.
  std::vector<std::pair<Tensor, Tensor>> kept;
  for (const std::optional<Tensor>* o : {&q_rope_out, &q_nope_out}) {
    if (!*o || !(*o)->defined() || (*o)->dim() < 1 || (*o)->size(0) != nnz) continue;
    for (int64_t i : skipped) kept.emplace_back((*o)->select(0, i), (*o)->select(0, i).clone());
  }
  auto [qr, kr, qn, kn] = [&] {
    try {
      return rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, qd,
                               sq, skv, q_rope_out, std::nullopt, q_nope_out, std::nullopt,
                               enable_pdl);
    } catch (const Error& e) {
      if (e.op() != "rope_quantize_fp8") throw;
      throw Error(e.code(), kRopeQuantizeAppendOp, e.arg(), e.detail(), e.file(), e.line());
    }
  }();
  for (auto& [row, saved] : kept) row.copy_(saved);
  const Tensor krc = kr.contiguous(), knc = kn.contiguous();
  if (dev.is_cuda()) {
    scatter_cuda(krc, knc, mla ? Tensor() : v->contiguous(), slot, c0, c1, mla, hnd, hk, rope, nope,
                 qd, static_cast<float>(skv), enable_pdl);
    return {qr, qn};
  }
  const auto* kr8 = static_cast<const uint8_t*>(krc.data_ptr());
  const auto* kn8 = static_cast<const uint8_t*>(knc.data_ptr());
  std::vector<double> vd;
  if (!mla) vd = v->contiguous().to_double_vector();
  std::vector<uint8_t> vrow(static_cast<std::size_t>(rope + nope));
  for (int64_t i = 0; i < nnz; ++i) {
    const auto [page, s] = slot[i];
    if (page < 0) continue;  // a padding token
    if (mla) {
      put_row(c0, page * c0.stride(0) + s * c0.stride(1), kn8 + i * nope, nope);
      put_row(c1, page * c1.stride(0) + s * c1.stride(1), kr8 + i * rope, rope);
      continue;
    }
    for (int64_t h = 0; h < hk; ++h) {
      const int64_t off0 = page * c0.stride(0) + (hnd ? h * c0.stride(1) + s * c0.stride(2)
                                                      : s * c0.stride(1) + h * c0.stride(2));
      const int64_t off1 = page * c1.stride(0) + (hnd ? h * c1.stride(1) + s * c1.stride(2)
                                                      : s * c1.stride(1) + h * c1.stride(2));
      put_row(c0, off0, kr8 + (i * hk + h) * rope, rope);
      put_row(c0, off0 + rope, kn8 + (i * hk + h) * nope, nope);
      for (int64_t e = 0; e < rope + nope; ++e) {
        // Scaled in fp32, then converted: the rule rope_quantize_fp8 applies to its nope parts.
        vrow[e] = to_fp8(
            static_cast<float>(vd[(i * hk + h) * (rope + nope) + e]) * static_cast<float>(skv), qd);
      }
      put_row(c1, off1, vrow.data(), rope + nope);
    }
  }
  return {qr, qn};
}

// flashinfer bench: GQA, batch_size requests of s_qo new tokens each appended after s_kv - s_qo.
BenchCase rope_quantize_append_bench_append(const BenchShape& s, Device dev) {
  const DType in = s.q_dtype == DType::kFloat32 ? DType::kBFloat16 : s.q_dtype;
  const int64_t B = s.batch_size, n = s.s_qo, H = s.num_qo_heads, Hk = s.num_kv_heads;
  const int64_t D = s.head_dim_qk, ps = s.page_size, per = (std::max(s.s_kv, n) + ps - 1) / ps;
  std::vector<int64_t> indptr, indices, bi, pos, pids;
  for (int64_t b = 0; b <= B; ++b) indptr.push_back(b * per);
  for (int64_t p = 0; p < B * per; ++p) indices.push_back(p);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < n; ++t) {
      bi.push_back(b);
      pos.push_back(per * ps - n + t);
      pids.push_back(per * ps - n + t);
    }
  }
  Tensor cs = api::bench::random_tensor({per * ps, D}, DType::kFloat32, dev, s.random_seed + 5);
  BenchCase c = api::bench::invoke_case(
      kRopeQuantizeAppendOp,
      {Value(api::bench::random_tensor({B * n, H, D}, in, dev, s.random_seed)),
       Value(api::bench::random_tensor({B * n, Hk, D}, in, dev, s.random_seed + 1)), Value(),
       Value(), Value(api::bench::random_tensor({B * n, Hk, D}, in, dev, s.random_seed + 2)),
       Value(cs), Value(api::bench::int32_tensor(pids, dev)),
       Value::tuple({Value(Tensor::zeros({B * per, ps, Hk, D}, DType::kFloat8E4M3FN, dev)),
                     Value(Tensor::zeros({B * per, ps, Hk, D}, DType::kFloat8E4M3FN, dev))}),
       Value(api::bench::int32_tensor(indices, dev)), Value(api::bench::int32_tensor(indptr, dev)),
       Value(api::bench::int32_tensor(bi, dev)), Value(api::bench::int32_tensor(pos, dev))},
      {{"page_size", Value(ps)}});
  c.bytes = api::bench::nbytes({B * n, H + 2 * Hk, D}, in) +
            api::bench::nbytes({B * n, H + 2 * Hk, D}, DType::kFloat8E4M3FN);
  return c;
}

}  // namespace

std::tuple<Tensor, Tensor> rope_quantize_fp8_append_paged_kv_cache(
    const Tensor& q_rope, const Tensor& k_rope, std::optional<Tensor> q_nope,
    std::optional<Tensor> k_nope, std::optional<Tensor> v, const Tensor& cos_sin_cache,
    const Tensor& pos_ids, const PagedKVCache& paged_kv_cache, const Tensor& kv_indices,
    const Tensor& kv_indptr, const Tensor& batch_indices, const Tensor& positions, bool is_neox,
    std::optional<DType> quantize_dtype, double quant_scale_q, double quant_scale_kv,
    int64_t page_size, std::string_view kv_layout, std::optional<Tensor> q_rope_out,
    std::optional<Tensor> q_nope_out, bool enable_pdl) {
  return call_op<&rope_quantize_fp8_append_paged_kv_cache>(
      [&] {
        return impl(q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, pos_ids, paged_kv_cache,
                    kv_indices, kv_indptr, batch_indices, positions, is_neox, quantize_dtype,
                    quant_scale_q, quant_scale_kv, page_size, kv_layout, q_rope_out, q_nope_out,
                    enable_pdl);
      },
      q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, pos_ids, paged_kv_cache, kv_indices,
      kv_indptr, batch_indices, positions, is_neox, quantize_dtype, quant_scale_q, quant_scale_kv,
      page_size, kv_layout, q_rope_out, q_nope_out, enable_pdl);
}

namespace detail {
void register_rope_quantize_append_ops(OpRegistry& r) {
  declare<&rope_quantize_fp8_append_paged_kv_cache>(
      r,
      {.name = kRopeQuantizeAppendOp,
       .module = "flashinfer.rope",
       .summary = "rope_quantize_fp8 with K (and V) appended to a paged FP8 cache"},
      "q_rope", "k_rope", arg("q_nope").required(), arg("k_nope").required(), arg("v").required(),
      "cos_sin_cache", "pos_ids", arg("paged_kv_cache").mut(), "kv_indices", "kv_indptr",
      "batch_indices", "positions", arg("is_neox", true), "quantize_dtype",
      arg("quant_scale_q", 1.0), arg("quant_scale_kv", 1.0), arg("page_size", 16),
      arg("kv_layout", "NHD"), arg("q_rope_out").mut(), arg("q_nope_out").mut(),
      arg("enable_pdl", false));
  static constexpr api::BackendSummary kBackends[] = {
    {DeviceType::kCPU, "CPU reference: rope_quantize_fp8's, then a host scatter into the pages"},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA: rope_quantize_fp8's kernel, then a scatter kernel into the pages (V quantized there)"},
#endif
  };
  api::register_backends(kRopeQuantizeAppendOp, std::span<const api::BackendSummary>(kBackends));
  register_bench_hook(kRopeQuantizeAppendOp, rope_quantize_append_bench_append);
}
}  // namespace detail

}  // namespace flashinfer
