// flashinfer.cute_dsl.sparse.bsa_attn_sm120.bsa_attn_sm120_blk64_fwd: upstream's checks and
// messages, the metadata rules, returns, dispatch and a bench hook (docs/ATTENTION.md,
// "Block-sparse attention on SM120").
#include "flashinfer/ops/bsa_attn.h"

#include <cmath>
#include <string>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/bsa_params.h"
#include "kernels/cpu/bsa_cpu.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/bsa_cuda.h"
#endif

namespace flashinfer {

template <>
struct ReturnName<BsaOutput> {
  static constexpr const char* value = "tuple[Tensor, Tensor | None]";
};

Value to_value(const BsaOutput& r) {
  return Value::tuple({Value(r.out), r.return_lse ? Value(r.lse) : Value()});
}

namespace {

using kernels::BsaParams;
constexpr const char* kBsaOp = "bsa_attn_sm120_blk64_fwd";

constexpr api::KernelEntry<BsaParams> kBsaKernels[] = {
    {DeviceType::kCPU, "CPU reference: each query row's softmax over its blocks' keys, fp32",
     nullptr,
     [](const BsaParams& p, const api::LaunchContext&) { kernels::cpu::bsa_attn_blk64_fwd(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: a warp per query row, online softmax over its blocks",
     nullptr,
     [](const BsaParams& p, const api::LaunchContext& c) {
       kernels::cuda::bsa_attn_blk64_fwd(p, c.stream, c.enable_pdl);
     }},
#endif
};

void need_int32(const Tensor& t, const Tensor& q, const char* arg) {
  FLASHINFER_CHECK(t.dtype() == DType::kInt32, kBsaOp, arg, arg, " must be int32, got ",
                   dtype_torch_name(t.dtype()));
  api::check_same_device(t, q, kBsaOp, arg, "q");
}

BsaOutput bsa_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& index,
                   int64_t bsn, const std::optional<Tensor>& block_sizes,
                   const std::optional<Tensor>& nums, std::optional<double> scale, bool return_lse,
                   std::optional<Tensor> out, std::optional<Tensor> lse) {
  const char* op = kBsaOp;
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{q, "q"},
                                {k, "k"},
                                {v, "v"},
                                {index, "q2k_block_index"}}) {
    api::check_defined(t, op, name);
  }
  FLASHINFER_CHECK(q.dtype() == DType::kFloat16 || q.dtype() == DType::kBFloat16, op, "q",
                   "bsa_attn_sm120_blk64_fwd only supports fp16/bf16");
  FLASHINFER_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), op,
                   k.dtype() != q.dtype() ? "k" : "v", "q, k, v must have the same dtype");
  api::check_same_device(k, q, op, "k", "q");
  api::check_same_device(v, q, op, "v", "q");
  for (const auto& [t, name] :
       {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}, {v, "v"}}) {
    api::check_dim(t, {4}, op, name);
  }
  FLASHINFER_CHECK(q.size(3) == 128, op, "q", "sm120_blk64 requires head_dim=128, got ", q.size(3));
  FLASHINFER_CHECK(v.size(3) == 128, op, "v", "sm120_blk64 requires head_dim_v=128, got ",
                   v.size(3));
  FLASHINFER_CHECK(k.size(3) == 128, op, "k", "dim must be 128 in mode k, got ", k.size(3));
  const int64_t B = q.size(0), Sq = q.size(1), Hq = q.size(2), Sk = k.size(1), Hkv = k.size(2);
  FLASHINFER_CHECK(Hkv >= 1 && Hq % Hkv == 0, op, "k",
                   "num_heads must be divisible by num_kv_heads");
  FLASHINFER_CHECK(k.size(0) == B, op, "k", "k must be [B=", B, ", Sk, Hkv, 128], got ",
                   shape_to_string(k.shape()));
  FLASHINFER_CHECK(v.shape() == k.shape(), op, "v", "v must match k's shape ",
                   shape_to_string(k.shape()), ", got ", shape_to_string(v.shape()));
  for (const auto& [t, name] :
       {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}, {v, "v"}}) {
    FLASHINFER_CHECK(t.numel() == 0 || t.stride(-1) == 1, op, name, name,
                     " must be contiguous in its last dimension");
  }
  constexpr int64_t BLK = BsaParams::kBlock;
  const int64_t NQ = (Sq + BLK - 1) / BLK, NK = (Sk + BLK - 1) / BLK;
  need_int32(index, q, "q2k_block_index");
  FLASHINFER_CHECK(index.dim() == 4 && index.size(0) == B && index.size(1) == Hq &&
                       index.size(2) == NQ && index.size(3) >= 1,
                   op, "q2k_block_index", "q2k_block_index must be [B=", B, ", Hq=", Hq,
                   ", NQ=", NQ, ", W >= 1], got ", shape_to_string(index.shape()));
  const int64_t W = index.size(3);
  const bool has_nums = nums && nums->defined() && nums->numel() > 0;
  if (has_nums) {
    need_int32(*nums, q, "q2k_block_nums");
    api::check_shape_eq(*nums, {B, Hq, NQ}, op, "q2k_block_nums");
  } else {
    FLASHINFER_CHECK(bsn >= 1 && bsn <= W, op, "block_sparse_num", "block_sparse_num (", bsn,
                     ") must lie in [1, W=", W, "] without q2k_block_nums");
  }
  const bool has_sizes = block_sizes && block_sizes->defined() && block_sizes->numel() > 0;
  int mode = 0;
  if (has_sizes) {
    const Tensor& bs = *block_sizes;
    need_int32(bs, q, "block_sizes");
    mode = static_cast<int>(bs.dim());
    const bool ok = (mode == 1 && bs.shape() == Shape{NK}) ||
                    (mode == 2 && bs.shape() == Shape({B, NK})) ||
                    (mode == 3 && bs.shape() == Shape({B, Hq, NK}));
    FLASHINFER_CHECK(ok, op, "block_sizes", "block_sizes must be [NK=", NK,
                     "], [B, NK] or [B, Hq, NK], got ", shape_to_string(bs.shape()));
  }
  const Tensor idx = index.contiguous();
  const Tensor nums_c = has_nums ? nums->contiguous() : Tensor();
  const Tensor sizes_c = has_sizes ? block_sizes->contiguous() : Tensor();
  // Upstream trusts the metadata (ids and counts are not range-checked: undefined there); the
  // CPU path refuses what would read outside K or the index rows.
  if (q.device().is_cpu()) {
    const auto iv = api::host_ints(idx);
    const auto nv = has_nums ? api::host_ints(nums_c) : std::vector<int64_t>{};
    for (int64_t row = 0; row < B * Hq * NQ; ++row) {
      const int64_t n = has_nums ? nv[row] : bsn;
      FLASHINFER_CHECK(n >= 0 && n <= W, op, "q2k_block_nums", "row ", row, "'s count ", n,
                       " is outside [0, W=", W, "]");
      for (int64_t j = 0; j < n; ++j) {
        const int64_t id = iv[row * W + j];
        FLASHINFER_CHECK(id >= 0 && id < NK, op, "q2k_block_index", "row ", row, " lists block ",
                         id, ", outside [0, NK=", NK, ")");
      }
    }
  }
  if (out && out->defined()) {
    FLASHINFER_CHECK(out->dtype() == q.dtype(), op, "out", "out must have q's dtype");
    api::check_shape_eq(*out, {B, Sq, Hq, 128}, op, "out");
    api::check_same_device(*out, q, op, "out", "q");
    FLASHINFER_CHECK(out->numel() == 0 || out->stride(-1) == 1, op, "out",
                     "out must be contiguous in its last dimension");
    api::check_writable(*out, op, "out");
  } else {
    out = Tensor::empty({B, Sq, Hq, 128}, q.dtype(), q.device());
  }
  if (lse && lse->defined()) {
    FLASHINFER_CHECK(lse->dtype() == DType::kFloat32, op, "lse", "lse must be float32");
    api::check_shape_eq(*lse, {B, Hq, Sq}, op, "lse");
    api::check_same_device(*lse, q, op, "lse", "q");
    api::check_writable(*lse, op, "lse");
  } else {
    lse = Tensor::empty({B, Hq, Sq}, DType::kFloat32, q.device());
  }
  BsaParams p;
  p.B = B, p.Sq = Sq, p.Sk = Sk, p.Hq = Hq, p.Hkv = Hkv, p.NQ = NQ, p.NK = NK, p.W = W;
  p.dtype = q.dtype();
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr();
  for (int i = 0; i < 3; ++i) {
    p.q_s[i] = q.stride(i), p.k_s[i] = k.stride(i), p.v_s[i] = v.stride(i);
    p.out_s[i] = out->stride(i), p.lse_s[i] = lse->stride(i);
  }
  p.index = idx.data<int32_t>();
  if (has_nums) p.nums = nums_c.data<int32_t>();
  p.block_sparse_num = bsn;
  if (has_sizes) p.block_sizes = sizes_c.data<int32_t>(), p.block_sizes_mode = mode;
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(128.0));
  p.out = out->data_ptr();
  p.lse = lse->data<float>();
  api::check_upstream_arch(op, "q", q.device());
  api::launch(kBsaKernels, p, q.device(), op, "q");
  BsaOutput r;
  r.out = *out;
  r.lse = *lse;
  r.return_lse = return_lse;
  return r;
}

}  // namespace

BsaOutput bsa_attn_sm120_blk64_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& q2k_block_index, int64_t block_sparse_num,
                                   std::optional<Tensor> block_sizes,
                                   std::optional<Tensor> q2k_block_nums,
                                   std::optional<double> softmax_scale, bool return_lse,
                                   std::optional<Tensor> out, std::optional<Tensor> lse) {
  return call_op<&bsa_attn_sm120_blk64_fwd>(
      [&] {
        return bsa_impl(q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums,
                        softmax_scale, return_lse, out, lse);
      },
      q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums, softmax_scale,
      return_lse, out, lse);
}

namespace {

// Bench: batch_size x s_qo queries and s_kv keys, num_qo_heads over num_kv_heads, bf16, each
// query block attending to a quarter of the key blocks (at least one), SGLang's video shape.
BenchCase bench_bsa(const BenchShape& s, Device dev) {
  const int64_t B = s.batch_size, Sq = s.s_qo, Sk = std::max<int64_t>(1, s.s_kv);
  const int64_t Hq = s.num_qo_heads;
  const int64_t Hkv = std::max<int64_t>(1, s.num_kv_heads);
  const int64_t NQ = (Sq + 63) / 64, NK = std::max<int64_t>(1, (Sk + 63) / 64);
  const int64_t W = std::max<int64_t>(1, NK / 4);
  using api::bench::random_tensor;
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < B * Hq * NQ; ++i) {
    for (int64_t j = 0; j < W; ++j) idx.push_back((i * 7 + j * 3) % NK);
  }
  Tensor index = api::bench::int32_tensor(idx, dev).view({B, Hq, NQ, W});
  BenchCase c = api::bench::invoke_case(
      kBsaOp, {Value(random_tensor({B, Sq, Hq, 128}, DType::kBFloat16, dev, s.random_seed)),
               Value(random_tensor({B, Sk, Hkv, 128}, DType::kBFloat16, dev, s.random_seed + 1)),
               Value(random_tensor({B, Sk, Hkv, 128}, DType::kBFloat16, dev, s.random_seed + 2)),
               Value(index), Value(W)});
  c.flops = static_cast<double>(B * Hq * Sq * W * 64) * 128.0 * 4.0;
  c.bytes = static_cast<double>(B * Sq * Hq * 128) * 4.0 +
            static_cast<double>(B * Hq * NQ * W * 64 * 128) * 4.0;
  return c;
}

}  // namespace

namespace detail {

void register_bsa_ops(OpRegistry& r) {
  declare<&bsa_attn_sm120_blk64_fwd>(
      r,
      {.name = kBsaOp,
       .module = "flashinfer.cute_dsl.sparse.bsa_attn_sm120",
       .summary = "Block-sparse attention forward over 64-token blocks (SM120)"},
      "q", "k", "v", "q2k_block_index", "block_sparse_num", "block_sizes", "q2k_block_nums",
      "softmax_scale", arg("return_lse", false), arg("out").mut(), arg("lse").mut());
  api::register_backends(kBsaOp, kBsaKernels);
  register_bench_hook(kBsaOp, bench_bsa);
}

}  // namespace detail

}  // namespace flashinfer
