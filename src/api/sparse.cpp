// Block-sparse attention (flashinfer.sparse): BlockSparseAttentionWrapper as upstream's fa2 path
// plans it: each block row is a request of R queries over a paged view of k / v whose pages
// are the C-key block columns, so the batch-attention plan/run path (attention_common.h) and its
// kernels compute it; the per-block mask becomes each request's custom mask. pos_encoding_mode
// therefore sees a block row's queries and gathered keys at their positions within that request
// (api/attention_pos_encoding.h, CPU only).
#include "flashinfer/ops/sparse.h"

#include <cmath>
#include <cstring>

#include "api/arg_traits.h"
#include "api/attention_common.h"
#include "api/attention_pos_encoding.h"
#include "api/bench_support.h"
#include "api/checks.h"

namespace flashinfer {
namespace {

constexpr const char* kSparseModule = "flashinfer.sparse";
using SparseInit = Init<BlockSparseAttentionWrapper, Tensor, std::string>;

Tensor sparse_host_int32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kInt32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// k or v [N, Hkv, D] as pages [N / C, C, Hkv, D] (a view: rows stay where they are).
Tensor as_pages(const Tensor& t, int64_t c) {
  return t.as_strided({t.size(0) / c, c, t.size(1), t.size(2)},
                      {t.stride(0) * c, t.stride(0), t.stride(1), t.stride(2)}, t.storage_offset());
}

}  // namespace

BlockSparseAttentionWrapper::BlockSparseAttentionWrapper(Tensor float_workspace_buffer,
                                                         std::string backend)
    : s_(std::make_unique<detail::WrapperState>()) {
  call_init<SparseInit>(
      [&] {
        api::init_wrapper(*s_, float_workspace_buffer, "NHD", false, backend, std::nullopt,
                          "BlockSparseAttentionWrapper.__init__");
      },
      *this, float_workspace_buffer, backend);
}

BlockSparseAttentionWrapper::~BlockSparseAttentionWrapper() = default;

void BlockSparseAttentionWrapper::plan(
    const Tensor& indptr, const Tensor& indices, int64_t M, int64_t N, int64_t R, int64_t C,
    int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, std::optional<Tensor> mask,
    std::optional<Tensor> packed_mask, bool causal, std::string_view pos_encoding_mode,
    bool use_fp16_qk_reduction, std::optional<double> logits_soft_cap,
    std::optional<double> sm_scale, std::optional<double> rope_scale,
    std::optional<double> rope_theta, DType q_data_type, std::optional<DType> kv_data_type,
    DType o_data_type, bool non_blocking, std::optional<Tensor> block_mask) {
  call_op<&BlockSparseAttentionWrapper::plan>(
      [&] {
        const char* op = "BlockSparseAttentionWrapper.plan";
        detail::WrapperState& s = *s_;
        s.planned = false;
        FLASHINFER_CHECK_CODE(
            !block_mask, ErrorCode::kUnsupported, op, "block_mask",
            "the per-head block mask of upstream's VSA backends is not supported");
        FLASHINFER_CHECK(M >= 0, op, "M", "must be >= 0, got ", M);
        FLASHINFER_CHECK(R >= 1, op, "R", "must be >= 1, got ", R);
        FLASHINFER_CHECK(C >= 1, op, "C", "must be >= 1, got ", C);
        FLASHINFER_CHECK(N >= 0 && N % C == 0, op, "N", "must be a non-negative multiple of C (", C,
                         "), got ", N);
        api::check_head_dim(head_dim, op, "head_dim");
        api::plan_settings(s, num_qo_heads, num_kv_heads, head_dim, head_dim, q_data_type,
                           kv_data_type, o_data_type, sm_scale, -1, logits_soft_cap, "NONE", op);
        const int64_t mb = (M + R - 1) / R, nb = N / C;
        const std::vector<int32_t> ip = api::index_to_host(indptr, op, "indptr", mb + 1);
        api::check_indptr(ip, op, "indptr");
        const std::vector<int32_t> ix = api::index_to_host(indices, op, "indices", ip.back());
        for (std::size_t i = 0; i < ix.size(); ++i) {
          FLASHINFER_CHECK(ix[i] >= 0 && ix[i] < nb, op, "indices", "element ", i, " (", ix[i],
                           ") is not a block column in [0, ", nb, ")");
        }
        // Block row i: a request of its rows, one C-key page per block.
        std::vector<int32_t> last(static_cast<std::size_t>(mb)), qo{0};
        for (int64_t i = 0; i < mb; ++i) {
          last[i] = ip[i + 1] > ip[i] ? static_cast<int32_t>(C) : 0;
          qo.push_back(static_cast<int32_t>(std::min<int64_t>((i + 1) * R, M)));
        }
        api::load_page_table(s, sparse_host_int32(ip), sparse_host_int32(ix),
                             sparse_host_int32(last), C, op, "indptr", "indices", "indptr");
        s.decode = false;
        s.qo_indptr = qo;
        s.batch = static_cast<int32_t>(mb);
        s.total_qo = M;
        s.causal = causal;
        // mask [nnz, R, C] → each block row's [rows, nnz_row * C] row-major mask, concatenated.
        std::optional<Tensor> custom;
        if (mask) {
          api::check_defined(*mask, op, "mask");
          FLASHINFER_CHECK(mask->dtype() == DType::kBool, op, "mask", "expected torch.bool, got ",
                           dtype_torch_name(mask->dtype()));
          api::check_shape_eq(*mask, {ip.back(), R, C}, op, "mask");
          const Tensor h = mask->to(Device::cpu()).contiguous();
          const auto* src = static_cast<const uint8_t*>(h.data_ptr());
          std::vector<uint8_t> flat;
          for (int64_t i = 0; i < mb; ++i) {
            const int64_t rows = qo[i + 1] - qo[i];
            for (int64_t r = 0; r < rows; ++r) {
              for (int32_t blk = ip[i]; blk < ip[i + 1]; ++blk) {
                for (int64_t c = 0; c < C; ++c) flat.push_back(src[(blk * R + r) * C + c]);
              }
            }
          }
          Tensor t = Tensor::empty({static_cast<int64_t>(flat.size())}, DType::kBool);
          if (!flat.empty()) std::memcpy(t.data_ptr(), flat.data(), flat.size());
          custom = t;
        }
        try {
          api::load_custom_mask(s, custom, mask ? std::nullopt : packed_mask, op);
        } catch (const Error& e) {
          throw Error(e.code(), e.op(), e.arg() == "custom_mask" ? "mask" : "packed_mask",
                      e.detail(), e.file(), e.line());
        }
        if (s.causal) {
          for (int32_t b = 0; b < s.batch; ++b) {
            const int32_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
            // A block row with no blocks sees no key either way (zeros, LSE -inf).
            FLASHINFER_CHECK(s.kv_lens[b] == 0 || s.kv_lens[b] >= qo_len, op, "causal",
                             "block row ", b, " has ", qo_len, " rows but sees ", s.kv_lens[b],
                             " keys (causal masks are right-aligned and need kv_len >= qo_len)");
          }
        }
        // Upstream plans its decode kernel (use_tensor_cores=False) when R * group < 4 and no
        // mask is given: with a positional encoding that kernel's rules apply (rotation kept in
        // fp32, fp8 K takes RoPE). Each block row stays a request at the prefill positions.
        if (pos_encoding_mode != "NONE" && R * (num_qo_heads / num_kv_heads) < 4 && !mask &&
            !packed_mask) {
          s.decode = true;
          s.use_tensor_cores = false;
          s.q_len_per_req = R;
        }
        api::plan_pos_encoding(s, pos_encoding_mode, rope_scale, rope_theta, op);
        api::build_plan(s, std::nullopt, false, op);
        m_ = M;
        n_ = N;
        c_ = C;
        (void)use_fp16_qk_reduction;  // scores are always fp32
        (void)non_blocking;
      },
      *this, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask, packed_mask,
      causal, pos_encoding_mode, use_fp16_qk_reduction, logits_soft_cap, sm_scale, rope_scale,
      rope_theta, q_data_type, kv_data_type, o_data_type, non_blocking, block_mask);
}

AttentionOutput BlockSparseAttentionWrapper::run(
    const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> scale_q,
    std::optional<Tensor> scale_k, std::optional<Tensor> scale_v, std::optional<Tensor> out,
    std::optional<Tensor> lse, bool return_lse, std::optional<bool> enable_pdl) {
  return call_op<&BlockSparseAttentionWrapper::run>(
      [&] {
        const char* op = "BlockSparseAttentionWrapper.run";
        FLASHINFER_CHECK(s_->planned, op, "self", "run() called before plan()");
        for (const auto& [t, arg] : {std::pair{&scale_q, "scale_q"}, std::pair{&scale_k, "scale_k"},
                                     std::pair{&scale_v, "scale_v"}}) {
          FLASHINFER_CHECK_CODE(!*t, ErrorCode::kUnsupported, op, arg,
                                "per-head fp8 scales are not supported here");
        }
        for (const auto& [t, arg] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
          api::check_defined(*t, op, arg);
          api::check_dim(*t, {3}, op, arg);
          FLASHINFER_CHECK(t->size(0) == n_, op, arg, "has ", t->size(0), " rows, plan's N is ",
                           n_);
        }
        api::check_defined(q, op, "q");
        api::check_dim(q, {3}, op, "q");
        FLASHINFER_CHECK(q.size(0) == m_, op, "q", "has ", q.size(0), " rows, plan's M is ", m_);
        AttentionRunOptions o;
        o.out = out;
        o.lse = lse;
        o.return_lse = return_lse;
        o.enable_pdl = enable_pdl;
        return api::run_planned(*s_, q, as_pages(k, c_), as_pages(v, c_), o, op, "k", "v");
      },
      *this, q, k, v, scale_q, scale_k, scale_v, out, lse, return_lse, enable_pdl);
}

// ---- VariableBlockSparseAttentionWrapper ---------------------------------------------------

namespace {

using VarInit = Init<VariableBlockSparseAttentionWrapper, Tensor, std::string>;

// An integer [rows, cols] tensor on the host as int64 values.
std::vector<int64_t> int_matrix(const Tensor& t, int64_t rows, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dim(t, {2}, op, arg);
  FLASHINFER_CHECK(dtype_is_integral(t.dtype()), op, arg, "expected an integer tensor, got ",
                   dtype_torch_name(t.dtype()));
  FLASHINFER_CHECK(t.size(0) == rows, op, arg, "has ", t.size(0), " rows, expected num_kv_heads ",
                   rows);
  std::vector<int64_t> out;
  for (double x : t.to_double_vector()) {
    FLASHINFER_CHECK(x >= 0, op, arg, "block sizes must be >= 0, got ", x);
    out.push_back(static_cast<int64_t>(x));
  }
  return out;
}

}  // namespace

VariableBlockSparseAttentionWrapper::VariableBlockSparseAttentionWrapper(
    Tensor float_workspace_buffer, std::string backend)
    : s_(std::make_unique<detail::WrapperState>()) {
  call_init<VarInit>(
      [&] {
        api::init_wrapper(*s_, float_workspace_buffer, "NHD", false, backend, std::nullopt,
                          "VariableBlockSparseAttentionWrapper.__init__");
      },
      *this, float_workspace_buffer, backend);
}

VariableBlockSparseAttentionWrapper::~VariableBlockSparseAttentionWrapper() = default;

void VariableBlockSparseAttentionWrapper::plan(
    const Tensor& block_mask_map, const Tensor& block_row_sz, const Tensor& block_col_sz,
    int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, bool causal,
    std::string_view pos_encoding_mode, bool use_fp16_qk_reduction,
    std::optional<double> logits_soft_cap, std::optional<double> sm_scale,
    std::optional<double> rope_scale, std::optional<double> rope_theta, bool non_blocking,
    DType q_data_type, std::optional<DType> kv_data_type) {
  call_op<&VariableBlockSparseAttentionWrapper::plan>(
      [&] {
        const char* op = "VariableBlockSparseAttentionWrapper.plan";
        detail::WrapperState& s = *s_;
        s.planned = false;
        api::check_heads(num_qo_heads, num_kv_heads, op, "num_qo_heads", "num_kv_heads");
        api::check_head_dim(head_dim, op, "head_dim");
        // The kernels see one kv head per request and the group's query heads as its heads.
        const int64_t group = num_qo_heads / num_kv_heads;
        api::plan_settings(s, group, 1, head_dim, head_dim, q_data_type, kv_data_type, q_data_type,
                           sm_scale, -1, logits_soft_cap, "NONE", op);
        // Upstream's run passes None as the kernel's ALiBi slopes (flashinfer/sparse.py), which
        // an ALIBI kernel would read through a null pointer: no defined result to reproduce.
        FLASHINFER_CHECK_CODE(pos_encoding_mode != "ALIBI", ErrorCode::kUnsupported, op,
                              "pos_encoding_mode",
                              "\"ALIBI\" is not supported here (upstream's run passes no ALiBi "
                              "slopes to its kernel)");
        api::check_defined(block_mask_map, op, "block_mask_map");
        api::check_dim(block_mask_map, {3}, op, "block_mask_map");
        FLASHINFER_CHECK(block_mask_map.dtype() == DType::kBool, op, "block_mask_map",
                         "expected torch.bool, got ", dtype_torch_name(block_mask_map.dtype()));
        FLASHINFER_CHECK(block_mask_map.size(0) == num_kv_heads, op, "block_mask_map", "has ",
                         block_mask_map.size(0), " heads, expected num_kv_heads ", num_kv_heads);
        const int64_t mb = block_mask_map.size(1), nb = block_mask_map.size(2);
        const std::vector<int64_t> rows =
            int_matrix(block_row_sz, num_kv_heads, op, "block_row_sz");
        const std::vector<int64_t> cols =
            int_matrix(block_col_sz, num_kv_heads, op, "block_col_sz");
        FLASHINFER_CHECK(block_row_sz.size(1) == mb, op, "block_row_sz", "has ",
                         block_row_sz.size(1), " block rows, block_mask_map has ", mb);
        FLASHINFER_CHECK(block_col_sz.size(1) == nb, op, "block_col_sz", "has ",
                         block_col_sz.size(1), " block columns, block_mask_map has ", nb);
        const Tensor mh = block_mask_map.to(Device::cpu()).contiguous();
        const auto* m = static_cast<const uint8_t*>(mh.data_ptr());
        // Every head's sizes sum to the same qo_len / kv_len (q and k hold them per head).
        int64_t qo_len = -1, kv_len = -1;
        for (int64_t h = 0; h < num_kv_heads; ++h) {
          int64_t rq = 0, ck = 0;
          for (int64_t r = 0; r < mb; ++r) rq += rows[h * mb + r];
          for (int64_t c = 0; c < nb; ++c) ck += cols[h * nb + c];
          if (h == 0) {
            qo_len = rq;
            kv_len = ck;
          }
          FLASHINFER_CHECK(rq == qo_len, op, "block_row_sz", "head ", h, " rows sum to ", rq,
                           ", head 0's to ", qo_len);
          FLASHINFER_CHECK(ck == kv_len, op, "block_col_sz", "head ", h, " columns sum to ", ck,
                           ", head 0's to ", kv_len);
        }
        // Requests (h, r): rows in order, keys = token ids h * kv_len + (kept columns' tokens).
        std::vector<int32_t> qo{0}, ip{0}, ix, last;
        for (int64_t h = 0; h < num_kv_heads; ++h) {
          for (int64_t r = 0; r < mb; ++r) {
            qo.push_back(static_cast<int32_t>(qo.back() + rows[h * mb + r]));
            int64_t start = 0;
            for (int64_t c = 0; c < nb; ++c) {
              if (m[(h * mb + r) * nb + c]) {
                for (int64_t t = 0; t < cols[h * nb + c]; ++t) {
                  ix.push_back(static_cast<int32_t>(h * kv_len + start + t));
                }
              }
              start += cols[h * nb + c];
            }
            ip.push_back(static_cast<int32_t>(ix.size()));
            last.push_back(ip.back() > ip[ip.size() - 2] ? 1 : 0);
          }
        }
        api::load_page_table(s, sparse_host_int32(ip), sparse_host_int32(ix),
                             sparse_host_int32(last), 1, op, "block_mask_map", "block_mask_map",
                             "block_mask_map");
        s.decode = false;
        api::plan_pos_encoding(s, pos_encoding_mode, rope_scale, rope_theta, op);
        s.qo_indptr = qo;
        s.batch = static_cast<int32_t>(num_kv_heads * mb);
        s.total_qo = qo.back();
        s.causal = causal;
        for (int32_t b = 0; causal && b < s.batch; ++b) {
          const int32_t n = s.qo_indptr[b + 1] - s.qo_indptr[b];
          FLASHINFER_CHECK(s.kv_lens[b] == 0 || s.kv_lens[b] >= n, op, "causal", "block row ",
                           b % mb, " of kv head ", b / mb, " has ", n, " rows but sees ",
                           s.kv_lens[b],
                           " keys (causal masks are right-aligned and need kv_len >= qo_len)");
        }
        api::build_plan(s, std::nullopt, false, op);
        hq_ = num_qo_heads;
        hkv_ = num_kv_heads;
        qo_len_ = qo_len;
        kv_len_ = kv_len;
        (void)use_fp16_qk_reduction;  // scores are always fp32
        (void)non_blocking;
      },
      *this, block_mask_map, block_row_sz, block_col_sz, num_qo_heads, num_kv_heads, head_dim,
      causal, pos_encoding_mode, use_fp16_qk_reduction, logits_soft_cap, sm_scale, rope_scale,
      rope_theta, non_blocking, q_data_type, kv_data_type);
}

AttentionOutput VariableBlockSparseAttentionWrapper::run(const Tensor& q, const Tensor& k,
                                                         const Tensor& v, std::optional<Tensor> out,
                                                         std::optional<Tensor> lse, bool return_lse,
                                                         std::optional<bool> enable_pdl) {
  return call_op<&VariableBlockSparseAttentionWrapper::run>(
      [&] {
        const char* op = "VariableBlockSparseAttentionWrapper.run";
        const detail::WrapperState& s = *s_;
        FLASHINFER_CHECK(s.planned, op, "self", "run() called before plan()");
        const int64_t d = s.head_dim_qk, g = hq_ / hkv_;
        api::check_defined(q, op, "q");
        api::check_shape_eq(q, {hq_, qo_len_, d}, op, "q");
        for (const auto& [t, arg] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
          api::check_defined(*t, op, arg);
          api::check_shape_eq(*t, {hkv_, kv_len_, d}, op, arg);
        }
        // Upstream's rearrangement: q (Hkv G) L D -> (Hkv L) G D; k, v -> (Hkv L) 1 1 D pages.
        const Tensor qr = q.view({hkv_, g, qo_len_, d})
                              .permute({0, 2, 1, 3})
                              .contiguous()
                              .view({hkv_ * qo_len_, g, d});
        const Tensor kr = k.contiguous().view({hkv_ * kv_len_, 1, 1, d});
        const Tensor vr = v.contiguous().view({hkv_ * kv_len_, 1, 1, d});
        // Upstream checks a given out / lse against the kernel's layout ([Hkv * L, G, D] /
        // [Hkv * L, G]), fills it in that layout and returns head-major copies; the head-major
        // shapes of the result are accepted too (filled with the result).
        const bool out_kernel = out && out->shape() == Shape{hkv_ * qo_len_, g, d};
        const bool lse_kernel = lse && lse->shape() == Shape{hkv_ * qo_len_, g};
        if (out) {
          api::check_defined(*out, op, "out");
          if (!out_kernel) api::check_shape_eq(*out, {hq_, qo_len_, d}, op, "out");
          FLASHINFER_CHECK(out->dtype() == s.o_dtype, op, "out", "dtype ",
                           dtype_torch_name(out->dtype()), " must be plan's q_data_type ",
                           dtype_torch_name(s.o_dtype));
          api::check_same_device(*out, q, op, "out", "q");
        }
        if (lse) {
          api::check_defined(*lse, op, "lse");
          if (!lse_kernel) api::check_shape_eq(*lse, {hq_, qo_len_}, op, "lse");
          FLASHINFER_CHECK(lse->dtype() == DType::kFloat32, op, "lse", "must be torch.float32");
          api::check_same_device(*lse, q, op, "lse", "q");
        }
        AttentionRunOptions o;
        o.return_lse = return_lse || lse.has_value();
        o.enable_pdl = enable_pdl;
        AttentionOutput r = api::run_planned(s, qr, kr, vr, o, op, "k", "v");
        AttentionOutput res;
        const Tensor ro = r.out.view({hkv_, qo_len_, g, d}).permute({0, 2, 1, 3});
        if (out_kernel) {
          Tensor(*out).copy_(r.out);
          res.out = ro.contiguous().view({hq_, qo_len_, d});
        } else if (out) {
          out->copy_(ro.contiguous().view({hq_, qo_len_, d}));
          res.out = *out;
        } else {
          res.out = ro.contiguous().view({hq_, qo_len_, d});
        }
        if (o.return_lse) {
          const Tensor rl = r.lse.view({hkv_, qo_len_, g}).permute({0, 2, 1});
          if (lse_kernel) {
            Tensor(*lse).copy_(r.lse);
            res.lse = rl.contiguous().view({hq_, qo_len_});
          } else {
            Tensor l = lse ? *lse : Tensor::empty({hq_, qo_len_}, DType::kFloat32, q.device());
            l.view({hkv_, g, qo_len_}).copy_(rl);
            res.lse = l;
          }
          if (!return_lse) res.lse = Tensor();
        }
        return res;
      },
      *this, q, k, v, out, lse, return_lse, enable_pdl);
}

namespace {

// Bench hook: one request of s_qo * batch_size queries and s_kv keys, blocks of 16 x page_size,
// every other block column of each block row kept (causal off: a block row need not see as many
// keys as it has rows).
BenchCase bench_block_sparse(const BenchShape& s, Device dev) {
  const int64_t R = 16, C = s.page_size, M = s.batch_size * s.s_qo, N = (s.s_kv / C) * C;
  const int64_t mb = (M + R - 1) / R, nb = N / C;
  std::vector<int64_t> ip{0}, ix;
  for (int64_t i = 0; i < mb; ++i) {
    for (int64_t j = i % 2; j < nb; j += 2) ix.push_back(j);
    ip.push_back(static_cast<int64_t>(ix.size()));
  }
  auto w =
      std::make_shared<BlockSparseAttentionWrapper>(Tensor::empty({16 << 20}, DType::kUInt8, dev));
  w->plan(api::bench::int32_tensor(ip, dev), api::bench::int32_tensor(ix, dev), M, N, R, C,
          s.num_qo_heads, s.num_kv_heads, s.head_dim_qk, std::nullopt, std::nullopt, false, "NONE",
          false, std::nullopt, std::nullopt, std::nullopt, std::nullopt, s.q_dtype, s.kv_dtype,
          s.q_dtype);
  BenchCase c = api::bench::invoke_case(
      "BlockSparseAttentionWrapper.run",
      {api::bench::bench_object(w),
       Value(api::bench::random_tensor({M, s.num_qo_heads, s.head_dim_qk}, s.q_dtype, dev,
                                       s.random_seed)),
       Value(api::bench::random_tensor({N, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, dev,
                                       s.random_seed + 1)),
       Value(api::bench::random_tensor({N, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, dev,
                                       s.random_seed + 2))});
  // Each kept block: R x C scores and outputs.
  c.flops = 2.0 * static_cast<double>(ix.size()) * R * C * s.num_qo_heads * (2 * s.head_dim_qk);
  BenchShape one = s;
  one.head_dim_vo = s.head_dim_qk;
  c.bytes = api::bench::bench_attention_bytes(one, M, N);
  return c;
}

// Bench hook: num_kv_heads heads of batch_size * s_qo queries and s_kv keys, 4 block rows and 4
// block columns of equal size per head, a checkerboard of kept blocks plus the diagonal.
BenchCase bench_variable_block_sparse(const BenchShape& s, Device dev) {
  const int64_t hkv = s.num_kv_heads, d = s.head_dim_qk;
  const int64_t qo = (s.batch_size * s.s_qo) / 4 * 4, kv = s.s_kv / 4 * 4;
  Tensor mask = Tensor::empty({hkv, 4, 4}, DType::kBool);
  Tensor rows = Tensor::empty({hkv, 4}, DType::kInt32),
         cols = Tensor::empty({hkv, 4}, DType::kInt32);
  int64_t kept = 0;
  for (int64_t h = 0; h < hkv; ++h) {
    for (int64_t i = 0; i < 4; ++i) {
      rows.data<int32_t>()[h * 4 + i] = static_cast<int32_t>(qo / 4);
      cols.data<int32_t>()[h * 4 + i] = static_cast<int32_t>(kv / 4);
      for (int64_t j = 0; j < 4; ++j) {
        const bool keep = i == j || (i + j + h) % 2 == 0;
        mask.data<bool>()[(h * 4 + i) * 4 + j] = keep;
        kept += keep;
      }
    }
  }
  auto w = std::make_shared<VariableBlockSparseAttentionWrapper>(
      Tensor::empty({16 << 20}, DType::kUInt8, dev));
  w->plan(mask.to(dev), rows.to(dev), cols.to(dev), s.num_qo_heads, hkv, d, false, "NONE", false,
          std::nullopt, std::nullopt, std::nullopt, std::nullopt, true, s.q_dtype, s.kv_dtype);
  BenchCase c = api::bench::invoke_case(
      "VariableBlockSparseAttentionWrapper.run",
      {api::bench::bench_object(w),
       Value(api::bench::random_tensor({s.num_qo_heads, qo, d}, s.q_dtype, dev, s.random_seed)),
       Value(api::bench::random_tensor({hkv, kv, d}, s.kv_dtype, dev, s.random_seed + 1)),
       Value(api::bench::random_tensor({hkv, kv, d}, s.kv_dtype, dev, s.random_seed + 2))});
  const double per_block = static_cast<double>(qo / 4) * (kv / 4);
  c.flops = 2.0 * kept * per_block * (s.num_qo_heads / hkv) * (2 * d);
  BenchShape one = s;
  one.head_dim_vo = d;
  c.bytes = api::bench::bench_attention_bytes(one, qo, kv);
  return c;
}

}  // namespace

namespace detail {
void register_sparse_ops(OpRegistry& r) {
  declare_init<SparseInit>(r,
                           {.name = "BlockSparseAttentionWrapper.__init__",
                            .module = kSparseModule,
                            .summary = "Attention with a block-sparse (BSR) mask"},
                           "float_workspace_buffer", arg("backend", "auto"));
  declare<&BlockSparseAttentionWrapper::plan>(
      r,
      {.name = "BlockSparseAttentionWrapper.plan",
       .module = kSparseModule,
       .summary = "Plans block-sparse attention from the BSR layout"},
      "indptr", "indices", "M", "N", "R", "C", "num_qo_heads", "num_kv_heads", "head_dim", "mask",
      "packed_mask", arg("causal", false), arg("pos_encoding_mode", "NONE"),
      arg("use_fp16_qk_reduction", false), "logits_soft_cap", "sm_scale", "rope_scale",
      "rope_theta", arg("q_data_type", "float16"), "kv_data_type", arg("o_data_type", "float16"),
      arg("non_blocking", true), "block_mask");
  declare<&BlockSparseAttentionWrapper::run>(
      r,
      {.name = "BlockSparseAttentionWrapper.run",
       .module = kSparseModule,
       .summary = "Block-sparse attention with the current plan"},
      "q", "k", "v", "scale_q", "scale_k", "scale_v", arg("out").mut(), arg("lse").mut(),
      arg("return_lse", false), "enable_pdl");
  api::register_attention_backends("BlockSparseAttentionWrapper.__init__");
  api::register_attention_backends("BlockSparseAttentionWrapper.plan");
  api::register_attention_backends("BlockSparseAttentionWrapper.run");
  register_bench_hook("BlockSparseAttentionWrapper.run", bench_block_sparse);
  declare_init<VarInit>(r,
                        {.name = "VariableBlockSparseAttentionWrapper.__init__",
                         .module = kSparseModule,
                         .summary = "Attention with per-kv-head variable-size block-sparse masks"},
                        "float_workspace_buffer", arg("backend", "auto"));
  declare<&VariableBlockSparseAttentionWrapper::plan>(
      r,
      {.name = "VariableBlockSparseAttentionWrapper.plan",
       .module = kSparseModule,
       .summary = "Plans variable block-sparse attention from the per-head block map"},
      "block_mask_map", "block_row_sz", "block_col_sz", "num_qo_heads", "num_kv_heads", "head_dim",
      arg("causal", false), arg("pos_encoding_mode", "NONE"), arg("use_fp16_qk_reduction", false),
      "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta", arg("non_blocking", true),
      arg("q_data_type", "float16"), "kv_data_type");
  declare<&VariableBlockSparseAttentionWrapper::run>(
      r,
      {.name = "VariableBlockSparseAttentionWrapper.run",
       .module = kSparseModule,
       .summary = "Variable block-sparse attention with the current plan"},
      "q", "k", "v", arg("out").mut(), arg("lse").mut(), arg("return_lse", false), "enable_pdl");
  api::register_attention_backends("VariableBlockSparseAttentionWrapper.__init__");
  api::register_attention_backends("VariableBlockSparseAttentionWrapper.plan");
  api::register_attention_backends("VariableBlockSparseAttentionWrapper.run");
  register_bench_hook("VariableBlockSparseAttentionWrapper.run", bench_variable_block_sparse);
}
}  // namespace detail

}  // namespace flashinfer
