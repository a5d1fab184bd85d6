// Private to grouped_gemm_cutlass*.cu: CUTLASS's sm90 grouped GEMM as one template over the
// operands' element type (docs/GEMM_AND_QUANTIZATION.md, "Grouped GEMMs"). TMA loads, wgmma
// (warpgroup MMA, fp32 accumulators), two consumer warpgroups on 128 x 128 x (128 bytes of k)
// tiles with a producer warp ("cooperative"), persistent over the device's SMs, every group's tiles
// in one launch; out = round_bf16(alpha * acc), alpha one for all groups or one per weight. The
// groups' shapes, pointers and strides are written on the device by a small kernel from m_indptr
// (and b_index): no host copy, no synchronization, so a call can be captured in a CUDA graph;
// CUTLASS's scheduler reads them there and rewrites its TMA descriptors per group. Each instance
// lives in its own source (one per element type, compiled in parallel): bf16 in
// grouped_gemm_cutlass.cu, e4m3 in grouped_gemm_cutlass_fp8.cu. For e4m3 CUTLASS's FP8 mainloop
// adds each k tile's wgmma partial sums into separate fp32 accumulators (its "promotion", every 128
// k): the tensor core's own FP8 accumulation is narrower than fp32, so it never sums more than one
// tile.
#pragma once

#include <cuda_runtime.h>

#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/decode_cuda.h"
#include "kernels/cuda/grouped_gemm_shape.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/grouped_gemm_params.h"

namespace flashinfer::kernels::cuda::cutlass_grouped {

using Bf16 = cutlass::bfloat16_t;
using E4m3 = cutlass::float_e4m3_t;
// (M, N, K) of each group, on the device only.
using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using Shape3 = ProblemShape::UnderlyingProblemShape;
using LayoutA = cutlass::layout::RowMajor;     // a's rows: k contiguous
using LayoutB = cutlass::layout::ColumnMajor;  // the weight, [n, k] with k contiguous ("TN")
using LayoutD = cutlass::layout::RowMajor;     // out's rows: n contiguous
using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;

/// The CUTLASS types of the instance whose operands are `Elem` (bf16 or e4m3), output bf16.
template <class Elem>
struct Instance {
  static constexpr int kAlignAB = 16 / static_cast<int>(sizeof(Elem));  // elements in 16 bytes
  static constexpr int kAlignD = 8;
  // 128 bytes of k a tile: the widest k step of one wgmma row in the 128-byte swizzle.
  using TileShape =
      cute::Shape<cute::_128, cute::_128, cute::Int<128 / static_cast<int>(sizeof(Elem))>>;
  // D = round_bf16(alpha * acc): no source operand (C is void), one rounding, as the other
  // kernels; alpha from the device when given (every group reads alpha[0], or its own with one
  // alpha per weight: the prep kernel's per-group pointer array).
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, Bf16,
      LayoutD*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<Bf16, float, void, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Elem, LayoutA*, kAlignAB, Elem, LayoutB*,
      kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;

  /// The per-group arrays CUTLASS reads, carved from the front of the stream's scratch.
  struct Arrays {
    Shape3* shapes;
    const Elem** a;
    const Elem** b;
    Bf16** d;
    StrideA* sa;
    StrideB* sb;
    StrideD* sd;
    const float** alpha;  // alpha_per_weight only: group i's alpha[weight]
  };
};

constexpr std::size_t align16(std::size_t x) { return (x + 15) & ~std::size_t{15}; }
// CUTLASS keeps TMA descriptors (tensormaps, which must be 64-byte aligned) at the start of its
// workspace and aligns only its own offsets inside it: the workspace starts on 256 bytes.
constexpr std::size_t align256(std::size_t x) { return (x + 255) & ~std::size_t{255}; }

/// Bytes of the arrays of `groups` groups; with `base`, their addresses from there.
template <class I>
std::size_t group_arrays(int64_t groups, char* base, typename I::Arrays* out) {
  const auto n = static_cast<std::size_t>(groups);
  std::size_t off = 0;
  auto take = [&](auto*& ptr, std::size_t each) {
    using P = std::remove_reference_t<decltype(ptr)>;
    if (out != nullptr) ptr = reinterpret_cast<P>(base + off);
    off += align16(each * n);
  };
  typename I::Arrays g{};
  take(g.shapes, sizeof(Shape3));
  take(g.a, sizeof(*g.a));
  take(g.b, sizeof(*g.b));
  take(g.d, sizeof(*g.d));
  take(g.sa, sizeof(*g.sa));
  take(g.sb, sizeof(*g.sb));
  take(g.sd, sizeof(*g.sd));
  take(g.alpha, sizeof(*g.alpha));
  if (out != nullptr) *out = g;
  return off;
}

/// Group i's shape, operand addresses and strides (cutlass_group_fill, which the block-scaled
/// instance's prep kernel also calls), its rows from m_indptr as the other grouped
/// kernels read them (gmm_group_rows: clamped to [0, cum_m], none when the end is below the
/// start), its weight w = b_index[i] when given (SegmentGEMMWrapper's weight_indices, checked on
/// the host) or i, and with alpha_per_weight its scale's address alpha + w (cutlass_fused_moe's
/// per-expert FP8 dequantization scales). A group of no rows has no tiles: CUTLASS's scheduler
/// never visits it.
/// The first row and the weight of group i, which cutlass_group_fill wrote.
struct GroupRowWeight {
  int64_t begin, weight;
};
template <class I, class Elem>
__device__ __forceinline__ GroupRowWeight
cutlass_group_fill(const typename I::Arrays& g, int64_t i, const int32_t* m_indptr,
                   const int32_t* b_index, int64_t cum_m, int n, int k, const Elem* a, int64_t lda,
                   const Elem* b, int64_t ldb, int64_t b_stride_e, Bf16* d, int64_t ldd) {
  const grouped::GmmGroup r = grouped::gmm_group_rows(m_indptr[i], m_indptr[i + 1], cum_m);
  const int64_t w = b_index != nullptr ? b_index[i] : i;
  g.shapes[i] = Shape3{static_cast<int>(r.end - r.begin), n, k};
  g.a[i] = a + r.begin * lda;
  g.b[i] = b + w * b_stride_e;
  g.d[i] = d + r.begin * ldd;
  g.sa[i] = cute::make_stride(lda, cute::Int<1>{}, cute::Int<0>{});
  g.sb[i] = cute::make_stride(ldb, cute::Int<1>{}, cute::Int<0>{});
  g.sd[i] = cute::make_stride(ldd, cute::Int<1>{}, cute::Int<0>{});
  return {r.begin, w};
}
template <class I, class Elem>
__global__ void cutlass_group_prep_kernel(typename I::Arrays g, const int32_t* m_indptr,
                                          const int32_t* b_index, int64_t groups, int64_t cum_m,
                                          int n, int k, const Elem* a, int64_t lda, const Elem* b,
                                          int64_t ldb, int64_t b_stride_e, Bf16* d, int64_t ldd,
                                          const float* alpha_per_weight) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= groups) return;
  const GroupRowWeight rw = cutlass_group_fill<I, Elem>(g, i, m_indptr, b_index, cum_m, n, k, a,
                                                        lda, b, ldb, b_stride_e, d, ldd);
  if (alpha_per_weight != nullptr) g.alpha[i] = alpha_per_weight + rw.weight;
}

/// Adapters CUTLASS accepted and initialized, by everything their arguments hold: the device (its
/// SM count), the scratch's address (the per-group arrays and CUTLASS's workspace live there; the
/// groups' shapes are on the device only, so n and k are not in them), the group count and the
/// alpha (one pointer, or the arrays' per weight). A call that finds its adapter skips
/// can_implement and initialize: TMA descriptor encoding, driver entry-point lookups and the
/// kernel's shared-memory attribute on every call otherwise. Bounded: cleared past 256 entries.
template <class Gemm>
class AdapterCache {
 public:
  using Key = std::tuple<int, const void*, int64_t, const float*, bool>;
  static AdapterCache& instance() {
    static AdapterCache c;
    return c;
  }
  std::shared_ptr<Gemm> find(const Key& k) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = map_.find(k);
    return it == map_.end() ? nullptr : it->second;
  }
  void put(const Key& k, std::shared_ptr<Gemm> g) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (map_.size() >= 256) map_.clear();
    map_[k] = std::move(g);
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<Gemm>> map_;
};

/// The common end of the instances' runs: the adapter cached for `key` (device, scratch address,
/// group count, alpha), or a fresh one CUTLASS accepts for `args` and initializes with its
/// workspace at `workspace` (false, nothing queued, where it declines: initialize reads only the
/// arrays' addresses, not their contents); then `prep`, which queues the kernel writing the
/// per-group arrays, and the GEMM, both on `s`. kCuda Error naming `op` (and `what` ran) when a
/// launch fails.
template <class Gemm, class Prep>
bool run_adapter(const typename Gemm::Arguments& args, const typename AdapterCache<Gemm>::Key& key,
                 void* workspace, cudaStream_t s, const char* op, const char* what, Prep prep) {
  std::shared_ptr<Gemm> gemm = AdapterCache<Gemm>::instance().find(key);
  if (!gemm) {
    auto fresh = std::make_shared<Gemm>();
    if (fresh->can_implement(args) != cutlass::Status::kSuccess) return false;
    if (fresh->initialize(args, workspace, s) != cutlass::Status::kSuccess) return false;
    AdapterCache<Gemm>::instance().put(key, fresh);
    gemm = std::move(fresh);
  }
  prep();
  FLASHINFER_CUDA_CALL(op, cudaGetLastError());
  const cutlass::Status run = gemm->run(s);
  FLASHINFER_CHECK_CODE(run == cutlass::Status::kSuccess, ErrorCode::kCuda, op, "", what,
                        " launch: ", cutlassGetStatusString(run));
  FLASHINFER_CUDA_CALL(op, cudaGetLastError());
  return true;
}

/// Threads a block of the prep kernels (one thread a group).
constexpr int kPrepThreads = 128;

/// Runs `p` (already found to fit, cutlass_grouped_misfit) on instance I. False, having queued
/// nothing, when the stream's scratch cannot grow under a capture or CUTLASS declines.
template <class Elem>
bool run_instance(const GroupedMmCudaParams& p, cudaStream_t s, int device, StreamScratchPool& pool,
                  const char* op) {
  using I = Instance<Elem>;
  using Gemm = typename I::Gemm;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = sm_count(device);
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                {static_cast<int>(p.num_groups), nullptr, nullptr},
                                {nullptr, nullptr, nullptr, nullptr},
                                {{}, nullptr, nullptr, nullptr, nullptr},
                                hw};
  args.epilogue.thread.alpha = 1.0f;  // without alpha
  args.epilogue.thread.beta = 0.0f;
  const bool per_weight = p.alpha != nullptr && p.alpha_per_weight;
  const std::size_t arrays = align256(group_arrays<I>(p.num_groups, nullptr, nullptr));
  const std::size_t workspace = Gemm::get_workspace_size(args);

  // Under capture a scratch that would have to grow cannot (stream_scratch.h): the mma.sync
  // kernel, which needs none, takes the call, as it did before this path existed.
  const std::optional<StreamScratch> scratch =
      pool.try_acquire(op, device, s, arrays + align16(workspace));
  if (!scratch) return false;
  auto* base = static_cast<char*>(scratch->data());  // cudaMalloc'd: 256-byte aligned
  typename I::Arrays g{};
  group_arrays<I>(p.num_groups, base, &g);
  args.problem_shape = {static_cast<int>(p.num_groups), g.shapes, nullptr};
  args.mainloop.ptr_A = g.a;
  args.mainloop.dA = g.sa;
  args.mainloop.ptr_B = g.b;
  args.mainloop.dB = g.sb;
  args.epilogue.ptr_D = g.d;
  args.epilogue.dD = g.sd;
  // One alpha for every group, or group i's from the array the prep kernel writes.
  if (per_weight) {
    args.epilogue.thread.alpha_ptr_array = g.alpha;
    // Group l's alpha is element l of the array (stride 1 along the groups), as CUTLASS's grouped
    // GEMM example sets it; CUTLASS 4.2 reads element l whatever the stride, but a version that
    // refreshes the scalar only for a non-zero group stride would give every group group 0's.
    args.epilogue.thread.dAlpha = {cute::_0{}, cute::_0{}, 1};
  } else {
    args.epilogue.thread.alpha_ptr = p.alpha;
  }

  // Nothing is queued before CUTLASS has accepted the arguments (initialize reads only the
  // arrays' addresses, not their contents, which the prep kernel writes next): a refusal here
  // leaves the call to the mma.sync kernel. Arguments seen before reuse their adapter.
  const typename AdapterCache<Gemm>::Key key{device, base, p.num_groups,
                                             per_weight ? nullptr : p.alpha, per_weight};
  const auto blocks = static_cast<unsigned>((p.num_groups + kPrepThreads - 1) / kPrepThreads);
  return run_adapter<Gemm>(args, key, base + arrays, s, op, "CUTLASS grouped GEMM", [&] {
    cutlass_group_prep_kernel<I, Elem><<<blocks, kPrepThreads, 0, s>>>(
        g, p.m_indptr, p.b_index, p.num_groups, p.cum_m, static_cast<int>(p.n),
        static_cast<int>(p.k), static_cast<const Elem*>(p.a), p.a_stride_m,
        static_cast<const Elem*>(p.b), p.b_stride_n, p.b_stride_e, static_cast<Bf16*>(p.out),
        p.out_stride_m, per_weight ? p.alpha : nullptr);
  });
}

/// The e4m3 instance (grouped_gemm_cutlass_fp8.cu).
bool run_e4m3(const GroupedMmCudaParams& p, cudaStream_t s, int device, StreamScratchPool& pool,
              const char* op);

/// The e4m3 instance with DeepSeek's block scales (grouped_gemm_cutlass_fp8_block.cu; `p` taken by
/// cutlass_grouped_block_misfit).
bool run_fp8_block(const GroupedMmCudaParams& p, cudaStream_t s, int device,
                   StreamScratchPool& pool, const char* op);

}  // namespace flashinfer::kernels::cuda::cutlass_grouped
