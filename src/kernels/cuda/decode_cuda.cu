// Host side of the CUDA-core attention kernel (attention_decode_kernel.cuh): variant and
// instance dispatch, its occupancy for the split-KV planner, the split-KV merge pass, and the
// choice between it and the tensor-core prefill kernel.
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "core/env_switch.h"
#include "jit/attention_jit.h"
#include "kernels/cuda/attention_decode_kernel.cuh"
#include "kernels/cuda/attention_jit_launch.h"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/decode_cuda.h"
#include "kernels/cuda/prefill_cuda.h"
#include "kernels/occupancy.h"

namespace flashinfer::kernels::cuda {
namespace {

using decode::batch_decode_kernel;

std::atomic<AttentionKernelOverride> g_override{nullptr};
std::atomic<uint64_t> g_decode_launches{0};

int kv_bytes(DType kv) { return static_cast<int>(dtype_size(kv)); }

// FLASHINFER_DECODE_ROWS_PER_THREAD=1 forces one row a thread (to time one form against the
// other on a GPU: the planner's grid follows the block's occupancy, so a kernel-only comparison
// at one grid does not tell); anything else, or unset: decode_rows_per_thread. Read once.
bool one_row_forced() {
  static const bool v = detail::env_switch_is("FLASHINFER_DECODE_ROWS_PER_THREAD", "1");
  return v;
}

// The block shape, with the rows a thread owns (decode_rows_per_thread: 2 for blocks of 4 or more
// packed rows) chosen here on the host; the kernel instance follows s.rows_per_thread.
DecodeBlockShape shape_of(const AttentionParams& p) {
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int rows = p.max_work_rows * group, kvb = kv_bytes(p.kv.dtype);
  const int rpt =
      one_row_forced() ? 1 : decode_rows_per_thread(p.head_dim_qk, p.head_dim_vo, kvb, rows);
  return decode_block_shape(p.head_dim_qk, p.head_dim_vo, kvb, rows, rpt);
}

dim3 grid_of(const AttentionParams& p, const DecodeBlockShape& s) {
  const int64_t rows = static_cast<int64_t>(p.max_work_rows) * (p.num_qo_heads / p.num_kv_heads);
  return dim3(static_cast<unsigned>(p.num_work), static_cast<unsigned>(p.num_kv_heads),
              static_cast<unsigned>((rows + s.block_rows() - 1) / s.block_rows()));
}

template <class TQ, class TKV, class TO, int DQK, int DVO, int V>
void launch_aot(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  const DecodeBlockShape s = shape_of(p);
  const auto kernel = s.rows_per_thread == 2 ? batch_decode_kernel<TQ, TKV, TO, DQK, DVO, V, 2>
                                             : batch_decode_kernel<TQ, TKV, TO, DQK, DVO, V, 1>;
  launch_kernel("attention", kernel, grid_of(p, s), dim3(static_cast<unsigned>(s.threads())),
                static_cast<std::size_t>(s.smem_bytes), stream, enable_pdl, p);
}

// Head dims outside the AOT set: the same kernel, compiled by NVRTC; the spec is built on the
// first launch only (the key spells the same parameters).
void launch_jit(const AttentionParams& p, int variant, cudaStream_t stream, bool enable_pdl) {
  const DecodeBlockShape s = shape_of(p);
  const dim3 grid = grid_of(p, s);
  auto make = [&] {
    return jit::attention_cuda_core_spec(p.q_dtype, p.kv.dtype, p.o_dtype, p.head_dim_qk,
                                         p.head_dim_vo, variant, s.rows_per_thread);
  };
  const std::string key = "decode:" + std::to_string(static_cast<int>(p.q_dtype)) + ":" +
                          std::to_string(static_cast<int>(p.kv.dtype)) + ":" +
                          std::to_string(static_cast<int>(p.o_dtype)) + ":" +
                          std::to_string(p.head_dim_qk) + ":" + std::to_string(p.head_dim_vo) +
                          ":" + std::to_string(variant) + ":" + std::to_string(s.rows_per_thread);
  launch_attention_jit(key, make, p, grid.x, grid.y, grid.z, static_cast<unsigned>(s.threads()),
                       static_cast<std::size_t>(s.smem_bytes), stream, enable_pdl);
}

template <class TQ, class TKV, class TO, int DQK, int DVO>
void dispatch_variant(int variant, const AttentionParams& p, cudaStream_t stream, bool pdl) {
  switch (variant) {
    case 0:
      return launch_aot<TQ, TKV, TO, DQK, DVO, 0>(p, stream, pdl);
    case decode::kDecodeSoftCap:
      return launch_aot<TQ, TKV, TO, DQK, DVO, decode::kDecodeSoftCap>(p, stream, pdl);
    case decode::kDecodeMask:
      return launch_aot<TQ, TKV, TO, DQK, DVO, decode::kDecodeMask>(p, stream, pdl);
    default:
      return launch_aot<TQ, TKV, TO, DQK, DVO, decode::kDecodeSoftCap | decode::kDecodeMask>(
          p, stream, pdl);
  }
}

template <class TQ, class TKV>
void dispatch_dims(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  const int variant = decode_variant(p);
  // ALiBi and multi-item instances are built by the JIT on first use (rare in current models;
  // AOT would double the build's decode instances).
  if (p.head_dim_qk == p.head_dim_vo &&
      (variant & (decode::kDecodeAlibi | decode::kDecodeMultiItem)) == 0) {
    switch (p.head_dim_qk) {
      case 64:
        return dispatch_variant<TQ, TKV, TQ, 64, 64>(variant, p, stream, enable_pdl);
      case 128:
        return dispatch_variant<TQ, TKV, TQ, 128, 128>(variant, p, stream, enable_pdl);
      case 256:
        return dispatch_variant<TQ, TKV, TQ, 256, 256>(variant, p, stream, enable_pdl);
      default:
        break;
    }
  }
  if (!jit::attention_head_dim_ok(p.head_dim_qk) || !jit::attention_head_dim_ok(p.head_dim_vo)) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "attention", "head_dim", "head dims (", p.head_dim_qk,
                    ", ", p.head_dim_vo, ") are not supported on CUDA (multiples of 16 up to 256)");
  }
  launch_jit(p, variant, stream, enable_pdl);
}

// Calls f.template operator()<TQ, TKV>() for the dtypes of p (q: fp16/bf16; K/V: q's or fp8).
template <class F>
void visit_decode_dtypes(const AttentionParams& p, F&& f) {
  if (p.o_dtype != p.q_dtype) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "attention", "o_data_type",
                    "on CUDA the output dtype must be q's dtype");
  }
  const auto unsupported = [&] {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "attention", "kv_data_type", "dtype ",
                    dtype_torch_name(p.kv.dtype), " is not supported on CUDA with q ",
                    dtype_torch_name(p.q_dtype));
  };
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(p.q_dtype, "attention", "q", [&]<class T>() {
    visit_dtype<CudaElements, kFloat16, kBFloat16, kFloat8E4M3FN, kFloat8E5M2>(
        p.kv.dtype,
        [&]<class TKV>() {
          if constexpr (std::is_same_v<TKV, __half> || std::is_same_v<TKV, __nv_bfloat16>) {
            if (p.kv.dtype != p.q_dtype) unsupported();
            f.template operator()<T, T>();
          } else {
            f.template operator()<T, TKV>();
          }
        },
        unsupported);
  });
}

// Whether `base` and every stride (in elements of `elem` bytes) keep rows on 16-byte boundaries.
bool rows_aligned16(const void* base, std::initializer_list<int64_t> strides, std::size_t elem) {
  if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0) return false;
  for (int64_t s : strides) {
    if ((static_cast<std::size_t>(s) * elem) % 16 != 0) return false;
  }
  return true;
}

// The 16-byte copies and vector loads need every row of q, K, V and o to start on a 16-byte
// boundary; the API checks this before it plans a CUDA launch (attention_common.cpp).
void check_alignment(const AttentionParams& p) {
  const auto ok = rows_aligned16;
  const std::size_t qe = dtype_size(p.q_dtype), ke = dtype_size(p.kv.dtype);
  FLASHINFER_CHECK_CODE(ok(p.q, {p.q_stride_n, p.q_stride_h}, qe), ErrorCode::kUnsupported,
                        "attention", "q", "rows must start on 16-byte boundaries on CUDA");
  FLASHINFER_CHECK_CODE(ok(p.o, {p.o_stride_n, p.o_stride_h}, qe), ErrorCode::kUnsupported,
                        "attention", "out", "rows must start on 16-byte boundaries on CUDA");
  FLASHINFER_CHECK_CODE(
      ok(p.kv.k, {p.kv.k_stride_page, p.kv.k_stride_token, p.kv.k_stride_head}, ke),
      ErrorCode::kUnsupported, "attention", "k_cache",
      "rows must start on 16-byte boundaries on CUDA");
  FLASHINFER_CHECK_CODE(
      ok(p.kv.v, {p.kv.v_stride_page, p.kv.v_stride_token, p.kv.v_stride_head}, ke),
      ErrorCode::kUnsupported, "attention", "v_cache",
      "rows must start on 16-byte boundaries on CUDA");
  FLASHINFER_CHECK_CODE(p.tmp_v == nullptr || ok(p.tmp_v, {}, 4), ErrorCode::kUnsupported,
                        "attention", "float_workspace_buffer",
                        "must start on a 16-byte boundary on CUDA");
}

template <class TO>
void launch_merge(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  const dim3 grid(static_cast<unsigned>(p.num_merge), static_cast<unsigned>(p.num_qo_heads));
  // With PDL (as the attention kernel before it) the merge's launch overlaps that kernel's last
  // blocks; its blocks wait in pdl_wait() until the partials are complete and visible.
  launch_kernel("attention", merge_partials_kernel<TO>, grid, dim3(kMergeThreads), 0, stream,
                enable_pdl, p);
}

}  // namespace

int decode_variant(const AttentionParams& p) {
  int v = 0;
  if (p.logits_soft_cap > 0.0f) v |= decode::kDecodeSoftCap;
  // Rows of several queries in one block need the per-key test for causal and window limits.
  if (p.custom_mask != nullptr || ((p.causal || p.window_left >= 0) && p.max_work_rows > 1)) {
    v |= decode::kDecodeMask;
  }
  if (p.multi_item_rows != nullptr) v |= decode::kDecodeMask | decode::kDecodeMultiItem;
  if (p.alibi_slopes != nullptr) v |= decode::kDecodeAlibi;
  return v;
}

int decode_blocks_per_sm(const AttentionParams& p, int device) {
  const DecodeBlockShape s = shape_of(p);
  // JIT instances: an estimate (the AOT ones have the same body; two rows a thread take more,
  // and with fp8 K/V more again: ptxas gives the AOT fp8 two-row instances 167-168, and NVRTC's
  // one-row JIT instances 80 (session 59), where 64 planned a block an SM more than fits).
  int regs = s.rows_per_thread == 2 ? (kv_bytes(p.kv.dtype) == 1 ? 168 : 96) : 80;
  const int variant = decode_variant(p);
  if (variant < decode::kDecodeAlibi && p.head_dim_qk == p.head_dim_vo &&
      (p.head_dim_qk == 64 || p.head_dim_qk == 128 || p.head_dim_qk == 256) &&
      (p.q_dtype == DType::kFloat16 || p.q_dtype == DType::kBFloat16)) {
    visit_decode_dtypes(p, [&]<class TQ, class TKV>() {
      // The instance launch_aot picks: the variant and the rows a thread owns.
      auto get = [&]<int D, int R>() {
        cudaFuncAttributes a{};
        const auto kernel = variant == 0   ? batch_decode_kernel<TQ, TKV, TQ, D, D, 0, R>
                            : variant == 1 ? batch_decode_kernel<TQ, TKV, TQ, D, D, 1, R>
                            : variant == 2 ? batch_decode_kernel<TQ, TKV, TQ, D, D, 2, R>
                                           : batch_decode_kernel<TQ, TKV, TQ, D, D, 3, R>;
        if (cudaFuncGetAttributes(&a, kernel) == cudaSuccess) regs = a.numRegs;
      };
      auto get_dim = [&]<int D>() {
        if (s.rows_per_thread == 2) {
          get.template operator()<D, 2>();
        } else {
          get.template operator()<D, 1>();
        }
      };
      if (p.head_dim_qk == 64) get_dim.template operator()<64>();
      if (p.head_dim_qk == 128) get_dim.template operator()<128>();
      if (p.head_dim_qk == 256) get_dim.template operator()<256>();
    });
  }
  const int cc = detail::cuda_compute_capability(device);
  return occupancy_blocks_per_sm(device_limits(cc / 10, cc % 10), s.threads(), regs, s.smem_bytes);
}

int sm_count(int device) {
  int n = 0;
  FLASHINFER_CUDA_CALL("attention",
                       cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}

void set_attention_kernel_override(AttentionKernelOverride f) { g_override.store(f); }

uint64_t batch_decode_launches() { return g_decode_launches.load(std::memory_order_relaxed); }

bool attention_rows_aligned(const AttentionParams& p) {
  const std::size_t qe = dtype_size(p.q_dtype), ke = dtype_size(p.kv.dtype);
  return rows_aligned16(p.q, {p.q_stride_n, p.q_stride_h}, qe) &&
         rows_aligned16(p.o, {p.o_stride_n, p.o_stride_h}, qe) &&
         rows_aligned16(p.kv.k, {p.kv.k_stride_page, p.kv.k_stride_token, p.kv.k_stride_head},
                        ke) &&
         rows_aligned16(p.kv.v, {p.kv.v_stride_page, p.kv.v_stride_token, p.kv.v_stride_head}, ke);
}

void batch_attention(const AttentionParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  if (p.num_work == 0) return;
  if (AttentionKernelOverride f = g_override.load(); f != nullptr) {
    f(p, stream, enable_pdl);
  } else if (p.use_tensor_cores && prefill_supported(p)) {
    check_alignment(p);  // the FA2 kernel copies Q, K and V rows in 16-byte units too
    batch_prefill(p, stream, enable_pdl);
  } else {
    check_alignment(p);
    g_decode_launches.fetch_add(1, std::memory_order_relaxed);
    visit_decode_dtypes(p,
                        [&]<class TQ, class TKV>() { dispatch_dims<TQ, TKV>(p, s, enable_pdl); });
  }
  if (p.num_merge == 0) return;
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(
      p.q_dtype, "attention", "q", [&]<class TO>() { launch_merge<TO>(p, s, enable_pdl); });
}

}  // namespace flashinfer::kernels::cuda
