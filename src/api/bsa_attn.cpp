// The block-sparse attention forwards of flashinfer.cute_dsl.sparse: bsa_attn_sm120_blk64_fwd,
// bsa_attn_sm100_blk128_fwd and bsa_attn_sm100_blk64_fwd. Upstream's checks and messages, each
// one's metadata rules and returns, dispatch and bench hooks (docs/ATTENTION.md, "Block-sparse
// attention on SM120" and "on SM100"; docs/upstream-facts/bsa_attn.md, bsa_attn_sm100.md).
#include "flashinfer/ops/bsa_attn.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
constexpr const char* kBsa128Op = "bsa_attn_sm100_blk128_fwd";
constexpr const char* kBsa64Op = "bsa_attn_sm100_blk64_fwd";

constexpr api::KernelEntry<BsaParams> kBsaKernels[] = {
    {DeviceType::kCPU, "CPU reference: each query row's softmax over its blocks' keys, fp32",
     nullptr, [](const BsaParams& p, const api::LaunchContext&) { kernels::cpu::bsa_attn_fwd(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: a warp per query row, online softmax over its blocks",
     nullptr,
     [](const BsaParams& p, const api::LaunchContext& c) {
       kernels::cuda::bsa_attn_fwd(p, c.stream, c.enable_pdl);
     }},
#endif
};

void need_int32(const Tensor& t, const Tensor& q, const char* arg, const char* op = kBsaOp) {
  FLASHINFER_CHECK(t.dtype() == DType::kInt32, op, arg, arg, " must be int32, got ",
                   dtype_torch_name(t.dtype()));
  api::check_same_device(t, q, op, arg, "q");
}

// Upstream trusts the metadata (ids and counts are not range-checked: undefined there); for CPU
// tensors every row's count must lie in [lo, W] and its listed ids in [0, NK), so that nothing
// reads outside K or the index rows. (The CUDA kernel skips what lies outside.)
void check_rows_cpu(const char* op, const BsaParams& p, const Tensor& idx, const Tensor& nums,
                    int64_t lo, const char* below_lo) {
  if (!idx.device().is_cpu()) return;
  const auto iv = api::host_ints(idx);
  const auto nv = nums.defined() ? api::host_ints(nums) : std::vector<int64_t>{};
  const char* count_arg = nums.defined() ? "q2k_block_nums" : "block_sparse_num";
  for (int64_t row = 0; row < kernels::bsa_meta_rows(p); ++row) {
    const int64_t n = nums.defined() ? nv[row] : p.block_sparse_num;
    FLASHINFER_CHECK(n <= p.W, op, count_arg, "row ", row, "'s count ", n, " exceeds W=", p.W);
    FLASHINFER_CHECK(n >= lo, op, count_arg, "row ", row, "'s count ", n, " ", below_lo);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t id = iv[row * p.W + j];
      FLASHINFER_CHECK(id >= 0 && id < p.NK, op, "q2k_block_index", "row ", row, " lists block ",
                       id, ", outside [0, NK=", p.NK, ")");
    }
  }
}

// q, k, v (and out / lse when given) into p: sizes, dtype, strides.
void fill_inputs(BsaParams& p, const Tensor& q, const Tensor& k, const Tensor& v) {
  p.B = q.size(0), p.Sq = q.size(1), p.Hq = q.size(2), p.Sk = k.size(1), p.Hkv = k.size(2);
  p.NQ = (p.Sq + p.block - 1) / p.block, p.NK = (p.Sk + p.block - 1) / p.block;
  p.dtype = q.dtype();
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr();
  for (int i = 0; i < 3; ++i)
    p.q_s[i] = q.stride(i), p.k_s[i] = k.stride(i), p.v_s[i] = v.stride(i);
  if (k.size(0) == 1) p.k_s[0] = 0, p.v_s[0] = 0;  // one batch of keys for all (SM100 blk64)
}

void fill_outputs(BsaParams& p, const Tensor& out, const Tensor* lse) {
  p.out = out.data_ptr();
  for (int i = 0; i < 3; ++i) p.out_s[i] = out.stride(i);
  if (lse) {
    p.lse = lse->data<float>();
    for (int i = 0; i < 3; ++i) p.lse_s[i] = lse->stride(i);
  }
}

// Upstream's maybe_contiguous: a copy only where the last dimension is strided.
Tensor unit_last(const Tensor& t) {
  return t.numel() == 0 || t.stride(-1) == 1 ? t : t.contiguous();
}

// The checks every forward starts with: q, k, v and the index defined, q, k, v 4-D on q's device.
void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor& index) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{q, "q"},
                                {k, "k"},
                                {v, "v"},
                                {index, "q2k_block_index"}}) {
    api::check_defined(t, op, name);
  }
  for (const auto& [t, name] :
       {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}, {v, "v"}}) {
    api::check_dim(t, {4}, op, name);
  }
  api::check_same_device(k, q, op, "k", "q");
  api::check_same_device(v, q, op, "v", "q");
}

// A caller's out or lse: `dtype`, `shape`, on q's device, writable, and where `strided_text` is
// given, unit stride in its last dimension (the kernels write through it).
void check_given_output(const char* op, const Tensor& t, const char* arg, DType dtype,
                        const char* dtype_text, const Shape& shape, const Tensor& q,
                        const char* strided_text) {
  FLASHINFER_CHECK(t.dtype() == dtype, op, arg, dtype_text);
  api::check_shape_eq(t, shape, op, arg);
  api::check_same_device(t, q, op, arg, "q");
  if (strided_text) FLASHINFER_CHECK(t.numel() == 0 || t.stride(-1) == 1, op, arg, strided_text);
  api::check_writable(t, op, arg);
}

BsaOutput bsa_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& index,
                   int64_t bsn, const std::optional<Tensor>& block_sizes,
                   const std::optional<Tensor>& nums, std::optional<double> scale, bool return_lse,
                   std::optional<Tensor> out, std::optional<Tensor> lse) {
  const char* op = kBsaOp;
  check_qkv(op, q, k, v, index);
  FLASHINFER_CHECK(q.dtype() == DType::kFloat16 || q.dtype() == DType::kBFloat16, op, "q",
                   "bsa_attn_sm120_blk64_fwd only supports fp16/bf16");
  FLASHINFER_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), op,
                   k.dtype() != q.dtype() ? "k" : "v", "q, k, v must have the same dtype");
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
  constexpr int64_t BLK = 64;
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
  BsaParams p;
  fill_inputs(p, q, k, v);
  p.W = W;
  p.block_sparse_num = bsn;
  check_rows_cpu(op, p, idx, nums_c, 0, "is negative");
  if (out && out->defined()) {
    check_given_output(op, *out, "out", q.dtype(), "out must have q's dtype", {B, Sq, Hq, 128}, q,
                       "out must be contiguous in its last dimension");
  } else {
    out = Tensor::empty({B, Sq, Hq, 128}, q.dtype(), q.device());
  }
  if (lse && lse->defined()) {
    check_given_output(op, *lse, "lse", DType::kFloat32, "lse must be float32", {B, Hq, Sq}, q,
                       nullptr);
  } else {
    lse = Tensor::empty({B, Hq, Sq}, DType::kFloat32, q.device());
  }
  fill_outputs(p, *out, &*lse);
  p.index = idx.data<int32_t>();
  if (has_nums) p.nums = nums_c.data<int32_t>();
  if (has_sizes) p.block_sizes = sizes_c.data<int32_t>(), p.block_sizes_mode = mode;
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(128.0));
  api::check_upstream_arch(op, "q", q.device());
  api::launch(kBsaKernels, p, q.device(), op, "q");
  BsaOutput r;
  r.out = *out;
  r.lse = *lse;
  r.return_lse = return_lse;
  return r;
}

// block_sizes for the SM100 forwards: 1-D [NK] int32 (indexed by the block id alone).
void check_sizes_1d(const char* op, const Tensor& bs, const Tensor& q, int64_t nk) {
  need_int32(bs, q, "block_sizes", op);
  FLASHINFER_CHECK(bs.shape() == Shape{nk}, op, "block_sizes", "block_sizes must be [NK=", nk,
                   "] (one size a KV block), got ", shape_to_string(bs.shape()));
}

BsaOutput bsa128_impl(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                      const Tensor& index, int64_t bsn, const std::optional<Tensor>& block_sizes,
                      const std::optional<Tensor>& nums, bool allow_empty,
                      std::optional<double> scale, std::optional<bool> pack_gqa, bool return_lse,
                      std::optional<Tensor> out, std::optional<Tensor> lse) {
  const char* op = kBsa128Op;
  check_qkv(op, q_in, k_in, v_in, index);
  FLASHINFER_CHECK(q_in.dtype() == DType::kFloat16 || q_in.dtype() == DType::kBFloat16, op, "q",
                   "inputs must be float16 or bfloat16");
  FLASHINFER_CHECK(k_in.dtype() == q_in.dtype() && v_in.dtype() == q_in.dtype(), op,
                   k_in.dtype() != q_in.dtype() ? "k" : "v", "inputs must have the same dtype");
  // Where upstream's arch assert comes: after the dtypes, before the heads and the metadata.
  api::check_upstream_arch(op, "q", q_in.device());
  const Tensor q = unit_last(q_in), k = unit_last(k_in), v = unit_last(v_in);
  const int64_t B = q.size(0), Sq = q.size(1), Hq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(2);
  // The kernel's head dims (its wrapper's plan takes 64, 96, 128); upstream's (192, 128) pair is
  // unverified, so refused here.
  FLASHINFER_CHECK(D == 64 || D == 96 || D == 128, op, "q",
                   "sm100_blk128 supports head_dim 64, 96 or 128, got ", D);
  FLASHINFER_CHECK(Hkv >= 1 && Hq % Hkv == 0, op, "k", "num_head % num_head_kv == 0 (", Hq,
                   " query heads, ", Hkv, " KV heads)");
  FLASHINFER_CHECK(k.size(0) == B && k.size(3) == D, op, "k", "k must be [B=", B, ", Sk, Hkv, ", D,
                   "], got ", shape_to_string(k.shape()));
  FLASHINFER_CHECK(v.shape() == k.shape(), op, "v", "v must match k's shape ",
                   shape_to_string(k.shape()), " (head_dim_v = head_dim), got ",
                   shape_to_string(v.shape()));
  need_int32(index, q, "q2k_block_index", op);
  const bool has_sizes = block_sizes && block_sizes->defined();  // an empty one is present
  const bool has_nums = nums && nums->defined();
  if (has_sizes) need_int32(*block_sizes, q, "block_sizes", op);
  if (has_nums) {
    need_int32(*nums, q, "q2k_block_nums", op);
  } else {
    FLASHINFER_CHECK(bsn >= 2 && bsn % 2 == 0, op, "block_sparse_num", "block_sparse_num=", bsn,
                     " must be even and >= 2");
  }
  BsaParams p;
  p.op = op, p.block = 128, p.dim = D, p.tail_mask = false;
  fill_inputs(p, q, k, v);
  // Packed GQA (the default where the group divides the 128-row tile): the metadata is per KV
  // head over packed rows, [B, Hkv, ceil(g Sq / 128), W]; an explicit True is dropped otherwise.
  const int64_t g = Hq / Hkv;
  const bool pack = pack_gqa.value_or(g > 1) && g > 1 && 128 % g == 0;
  p.pack_g = pack ? g : 1;
  const int64_t Hm = pack ? Hkv : Hq, NM = pack ? (g * Sq + 127) / 128 : p.NQ;
  FLASHINFER_CHECK(index.dim() == 4 && index.size(0) == B && index.size(1) == Hm &&
                       index.size(2) == NM && index.size(3) >= 1,
                   op, "q2k_block_index", "q2k_block_index must be [B=", B, ", ",
                   pack ? "Hkv=" : "Hq=", Hm, ", ", pack ? "ceil(g Sq / 128)=" : "NQ=", NM,
                   ", W >= 1]", pack ? " (packed GQA)" : "", ", got ",
                   shape_to_string(index.shape()));
  p.W = index.size(3);
  // Upstream reads past the row (undefined); checked on every device (no data needed).
  FLASHINFER_CHECK(has_nums || bsn <= p.W, op, "block_sparse_num", "block_sparse_num=", bsn,
                   " exceeds the index's W=", p.W);
  if (has_nums) api::check_shape_eq(*nums, {B, Hm, NM}, op, "q2k_block_nums");
  if (has_sizes) check_sizes_1d(op, *block_sizes, q, p.NK);
  const Tensor idx = index.contiguous();
  const Tensor nums_c = has_nums ? nums->contiguous() : Tensor();
  const Tensor sizes_c = has_sizes ? block_sizes->contiguous() : Tensor();
  p.block_sparse_num = bsn;
  // A row with no blocks: zeros and -inf where allow_empty_block_nums (undefined upstream else).
  check_rows_cpu(op, p, idx, nums_c,
                 has_nums && allow_empty ? std::numeric_limits<int64_t>::min() : 1,
                 "is below 1 with allow_empty_block_nums=False");
  if (out && out->defined()) {
    check_given_output(op, *out, "out", q.dtype(), "out must have q's dtype", {B, Sq, Hq, D}, q,
                       "out must be contiguous in its last dimension");
  } else {
    out = Tensor::empty({B, Sq, Hq, D}, q.dtype(), q.device());
  }
  // An lse is written and returned where the caller passed one, or allocated for return_lse.
  const bool want_lse = (lse && lse->defined()) || return_lse;
  if (lse && lse->defined()) {
    check_given_output(op, *lse, "lse", DType::kFloat32, "lse must be float32", {B, Hq, Sq}, q,
                       "lse must be contiguous along seqlen");
  } else if (return_lse) {
    lse = Tensor::empty({B, Hq, Sq}, DType::kFloat32, q.device());
  }
  fill_outputs(p, *out, want_lse ? &*lse : nullptr);
  p.index = idx.data<int32_t>();
  if (has_nums) p.nums = nums_c.data<int32_t>();
  if (has_sizes) p.block_sizes = sizes_c.data<int32_t>(), p.block_sizes_mode = 1;
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D)));
  api::launch(kBsaKernels, p, q.device(), op, "q");
  BsaOutput r;
  r.out = *out;
  if (want_lse) r.lse = *lse;
  r.return_lse = want_lse;
  return r;
}

BsaOutput bsa64_impl(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                     const Tensor& index, int64_t bsn, const std::optional<Tensor>& block_sizes,
                     const std::optional<Tensor>& nums, std::optional<double> scale,
                     bool return_lse, std::optional<Tensor> out, std::optional<Tensor> lse) {
  const char* op = kBsa64Op;
  check_qkv(op, q_in, k_in, v_in, index);
  // Upstream copies each with .contiguous() (the kernels read unit-stride head dims).
  const Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  FLASHINFER_CHECK(q.dtype() == DType::kBFloat16, op, "q", "blk64 kernel only supports bfloat16");
  FLASHINFER_CHECK(k.dtype() == DType::kBFloat16 && v.dtype() == DType::kBFloat16, op,
                   k.dtype() != DType::kBFloat16 ? "k" : "v",
                   "blk64 kernel only supports bfloat16");
  FLASHINFER_CHECK(q.size(3) == 128, op, "q", "blk64 kernel requires head_dim=128, got ",
                   q.size(3));
  const int64_t B = q.size(0), Sq = q.size(1), H = q.size(2);
  // No KV-head mapping (MHA); one KV head or one batch of keys broadcast, as upstream's copies
  // into its padded buffers do.
  FLASHINFER_CHECK(
      (k.size(0) == B || k.size(0) == 1) && (k.size(2) == H || k.size(2) == 1) && k.size(3) == 128,
      op, "k", "k must be [B=", B, " or 1, Sk, H=", H,
      " or 1, 128] (MHA: no KV-head mapping), got ", shape_to_string(k.shape()));
  FLASHINFER_CHECK(v.shape() == k.shape(), op, "v", "v must match k's shape ",
                   shape_to_string(k.shape()), ", got ", shape_to_string(v.shape()));
  need_int32(index, q, "q2k_block_index", op);
  const bool has_nums = nums && nums->defined() && nums->numel() > 0;
  const bool has_sizes = block_sizes && block_sizes->defined() && block_sizes->numel() > 0;
  BsaParams p;
  p.op = op, p.block = 64, p.dim = 128, p.tail_mask = false;
  fill_inputs(p, q, k, v);
  FLASHINFER_CHECK(index.dim() == 4, op, "q2k_block_index", "q2k_block_index must be 4-D, got ",
                   shape_to_string(index.shape()));
  FLASHINFER_CHECK(index.size(0) == B, op, "q2k_block_index", "q2k_block_index batch mismatch");
  FLASHINFER_CHECK(index.size(1) == H, op, "q2k_block_index", "q2k_block_index heads mismatch");
  FLASHINFER_CHECK(index.size(2) == p.NQ, op, "q2k_block_index",
                   "q2k_block_index q_blocks mismatch");
  FLASHINFER_CHECK(index.size(3) >= 1, op, "q2k_block_index", "q2k_block_index has no slots");
  if (has_nums) {
    need_int32(*nums, q, "q2k_block_nums", op);
    api::check_shape_eq(*nums, {B, H, p.NQ}, op, "q2k_block_nums");
  } else {
    FLASHINFER_CHECK(bsn >= 1, op, "block_sparse_num", "block_sparse_num must be >= 1");
    FLASHINFER_CHECK(index.size(3) == bsn, op, "q2k_block_index",
                     "q2k_block_index kv_blocks mismatch (W=", index.size(3),
                     ", block_sparse_num=", bsn, ")");
  }
  if (has_sizes) check_sizes_1d(op, *block_sizes, q, p.NK);
  p.W = index.size(3);
  const Tensor idx = index.contiguous();
  const Tensor nums_c = has_nums ? nums->contiguous() : Tensor();
  const Tensor sizes_c = has_sizes ? block_sizes->contiguous() : Tensor();
  p.block_sparse_num = bsn;
  check_rows_cpu(op, p, idx, nums_c, 1,
                 "is below 1: empty rows are undefined upstream (its wrapper refuses them)");
  // The kernel writes a fresh bf16 output and fp32 lse, and the caller's tensors receive copies
  // (upstream's copy_ would also convert dtypes: here they must be the kernel's), the lse only
  // with return_lse (left as it was otherwise).
  if (out && out->defined()) {
    check_given_output(op, *out, "out", DType::kBFloat16, "out must be bfloat16", {B, Sq, H, 128},
                       q, nullptr);
  }
  const bool user_lse = return_lse && lse && lse->defined();
  if (user_lse) {
    check_given_output(op, *lse, "lse", DType::kFloat32, "lse must be float32", {B, H, Sq}, q,
                       nullptr);
  }
  Tensor o = Tensor::empty({B, Sq, H, 128}, DType::kBFloat16, q.device());
  Tensor l = Tensor::empty({B, H, Sq}, DType::kFloat32, q.device());
  fill_outputs(p, o, return_lse ? &l : nullptr);
  p.index = idx.data<int32_t>();
  if (has_nums) p.nums = nums_c.data<int32_t>();
  if (has_sizes) p.block_sizes = sizes_c.data<int32_t>(), p.block_sizes_mode = 1;
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(128.0));
  api::check_upstream_arch(op, "q", q.device());
  api::launch(kBsaKernels, p, q.device(), op, "q");
  BsaOutput r;
  r.return_lse = return_lse;
  if (out && out->defined()) {
    out->copy_(o);
    r.out = *out;
  } else {
    r.out = o;
  }
  if (user_lse) {
    lse->copy_(l);
    r.lse = *lse;
  } else if (return_lse) {
    r.lse = l;
  }
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

BsaOutput bsa_attn_sm100_blk128_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& q2k_block_index, int64_t block_sparse_num,
                                    std::optional<Tensor> block_sizes,
                                    std::optional<Tensor> q2k_block_nums,
                                    bool allow_empty_block_nums,
                                    std::optional<double> softmax_scale,
                                    std::optional<bool> pack_gqa, bool return_lse,
                                    std::optional<Tensor> out, std::optional<Tensor> lse) {
  return call_op<&bsa_attn_sm100_blk128_fwd>(
      [&] {
        return bsa128_impl(q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums,
                           allow_empty_block_nums, softmax_scale, pack_gqa, return_lse, out, lse);
      },
      q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums,
      allow_empty_block_nums, softmax_scale, pack_gqa, return_lse, out, lse);
}

BsaOutput bsa_attn_sm100_blk64_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& q2k_block_index, int64_t block_sparse_num,
                                   std::optional<Tensor> block_sizes,
                                   std::optional<Tensor> q2k_block_nums,
                                   std::optional<double> softmax_scale, bool return_lse,
                                   std::optional<Tensor> out, std::optional<Tensor> lse) {
  return call_op<&bsa_attn_sm100_blk64_fwd>(
      [&] {
        return bsa64_impl(q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums,
                          softmax_scale, return_lse, out, lse);
      },
      q, k, v, q2k_block_index, block_sparse_num, block_sizes, q2k_block_nums, softmax_scale,
      return_lse, out, lse);
}

namespace {

// Bench: batch_size x s_qo queries and s_kv keys, num_qo_heads over num_kv_heads, bf16, each
// query block attending to a quarter of the key blocks (at least one), SGLang's video shape.
// `block`-token blocks, head dim `dim`; the metadata per query head, or packed per KV head where
// `packed` (bsa_attn_sm100_blk128_fwd's default for GQA); W even where `even` (blk128's uniform
// mode), the slot count where `w_is_n` (blk64's).
BenchCase bench_bsa_with(const char* op, const BenchShape& s, Device dev, int64_t block,
                         DType dtype, bool packed, bool even) {
  const int64_t B = s.batch_size, Sq = s.s_qo, Sk = std::max<int64_t>(1, s.s_kv);
  const int64_t Hq = s.num_qo_heads;
  const int64_t Hkv = std::max<int64_t>(1, s.num_kv_heads);
  const int64_t g = Hq / Hkv;
  const bool pack = packed && g > 1 && block % g == 0;
  const int64_t NK = std::max<int64_t>(1, (Sk + block - 1) / block);
  const int64_t Hm = pack ? Hkv : Hq,
                NM = pack ? (g * Sq + block - 1) / block : (Sq + block - 1) / block;
  int64_t W = std::max<int64_t>(1, NK / 4);
  if (even) W = std::max<int64_t>(2, W + W % 2);
  using api::bench::random_tensor;
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < B * Hm * NM; ++i) {
    for (int64_t j = 0; j < W; ++j) idx.push_back((i * 7 + j * 3) % NK);
  }
  Tensor index = api::bench::int32_tensor(idx, dev).view({B, Hm, NM, W});
  BenchCase c = api::bench::invoke_case(
      op, {Value(random_tensor({B, Sq, Hq, 128}, dtype, dev, s.random_seed)),
           Value(random_tensor({B, Sk, Hkv, 128}, dtype, dev, s.random_seed + 1)),
           Value(random_tensor({B, Sk, Hkv, 128}, dtype, dev, s.random_seed + 2)), Value(index),
           Value(W)});
  c.flops = static_cast<double>(B * Hq * Sq * W * block) * 128.0 * 4.0;
  c.bytes = static_cast<double>(B * Sq * Hq * 128) * 4.0 +
            static_cast<double>(B * Hq * ((Sq + block - 1) / block) * W * block * 128) * 4.0;
  return c;
}

// SGLang's video shape: bf16, each query block attending to a quarter of the key blocks (at
// least one).
BenchCase bench_bsa(const BenchShape& s, Device dev) {
  return bench_bsa_with(kBsaOp, s, dev, 64, DType::kBFloat16, false, false);
}
BenchCase bench_bsa128(const BenchShape& s, Device dev) {
  return bench_bsa_with(kBsa128Op, s, dev, 128, DType::kBFloat16, true, true);
}
// MHA only: the query heads' count for the keys too.
BenchCase bench_bsa64(const BenchShape& s, Device dev) {
  BenchShape mha = s;
  mha.num_kv_heads = s.num_qo_heads;
  return bench_bsa_with(kBsa64Op, mha, dev, 64, DType::kBFloat16, false, false);
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
  declare<&bsa_attn_sm100_blk128_fwd>(
      r,
      {.name = kBsa128Op,
       .module = "flashinfer.cute_dsl.sparse.bsa_attn_sm100_blk128",
       .summary = "Block-sparse attention forward over 128-token blocks (SM100 / SM110)"},
      "q", "k", "v", "q2k_block_index", "block_sparse_num", "block_sizes", "q2k_block_nums",
      arg("allow_empty_block_nums", true), "softmax_scale", "pack_gqa", arg("return_lse", false),
      arg("out").mut(), arg("lse").mut());
  api::register_backends(kBsa128Op, kBsaKernels);
  register_bench_hook(kBsa128Op, bench_bsa128);
  declare<&bsa_attn_sm100_blk64_fwd>(
      r,
      {.name = kBsa64Op,
       .module = "flashinfer.cute_dsl.sparse.bsa_attn_sm100_blk64",
       .summary = "Block-sparse attention forward over 64-token blocks (SM100 / SM103, bf16 MHA)"},
      "q", "k", "v", "q2k_block_index", "block_sparse_num", "block_sizes", "q2k_block_nums",
      "softmax_scale", arg("return_lse", false), arg("out").mut(), arg("lse").mut());
  api::register_backends(kBsa64Op, kBsaKernels);
  register_bench_hook(kBsa64Op, bench_bsa64);
}

}  // namespace detail

}  // namespace flashinfer
