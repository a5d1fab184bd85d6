// grouped_mm_fp8_block_scaled's Hopper path (cutlass_fused_moe's DeepSeek FP8 block-scale GEMMs on
// the grouped route): CUTLASS's sm90 grouped GEMM with blockwise scaling (TMA, wgmma on e4m3, two
// consumer warpgroups on 128 x 128 x 128 tiles, a producer warp; "FP8Blockwise"): each 128-wide k
// block's wgmma partial sums are multiplied by the product of the row's activation scale and the
// weight's 128 x 128 block scale and added into fp32 accumulators (the mma.sync kernel and the
// GEMV route round each step apart: kernels/moe_cutlass_fp8_rules.h; here the scale product is
// one rounding and the add may fuse with it); out = round_bf16(acc). The scales stay in the
// layouts the route writes and upstream's weights carry: a's [row][k block] and each weight's
// [n block][k block], k-major for CUTLASS's scale config. Opt-in
// (FLASHINFER_MOE_FP8_BLOCK_CUTLASS=1) until a GPU has run it against the mma.sync kernel. Built
// with CUTLASS's headers for sm_90a (src/CMakeLists.txt, the flashinfer_cutlass target).
#include <cutlass/detail/blockwise_scale_layout.hpp>

#include "kernels/cuda/grouped_gemm_cutlass.cuh"
#include "kernels/cuda/grouped_gemm_cutlass.h"
#include "kernels/grouped_gemm_cutlass_rules.h"

namespace flashinfer::kernels::cuda {
namespace cutlass_grouped {
namespace {

// 1 x 128 activation scales and 128 x 128 weight scales, both k-major (a k block's scales
// consecutive), as the route stores them.
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::K,
                                                              cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

struct BlockInstance {
  // The e4m3 instance's tile (128 x 128 x 128 bytes of k), alignments and epilogue (D =
  // round_bf16(alpha acc), alpha 1 here: the scales are in the mainloop's promotion).
  using Plain = Instance<E4m3>;
  static constexpr int kAlignAB = Plain::kAlignAB;
  using TileShape = Plain::TileShape;
  using Epilogue = Plain::Epilogue;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4m3, cute::tuple<LayoutA*, LayoutSFA*>,
      kAlignAB, E4m3, cute::tuple<LayoutB*, LayoutSFB*>, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  // The plain instance's operand strides, so that its per-group arrays and fill serve here too.
  static_assert(std::is_same_v<typename Kernel::InternalStrideA, Plain::StrideA> &&
                    std::is_same_v<typename Kernel::InternalStrideB, Plain::StrideB> &&
                    std::is_same_v<typename Kernel::InternalStrideD, Plain::StrideD>,
                "the e4m3 instance's strides");

  /// The per-group arrays CUTLASS reads, carved from the front of the stream's scratch: the plain
  /// instance's (its alpha array unused), then each group's scales.
  struct Arrays {
    Plain::Arrays base;
    const float** sfa;
    const float** sfb;
  };

  /// Bytes of the arrays of `groups` groups; with `base`, their addresses from there.
  static std::size_t arrays(int64_t groups, char* base, Arrays* out) {
    std::size_t off = group_arrays<Plain>(groups, base, out != nullptr ? &out->base : nullptr);
    const std::size_t each = align16(sizeof(const float*) * static_cast<std::size_t>(groups));
    if (out != nullptr) {
      out->sfa = reinterpret_cast<const float**>(base + off);
      out->sfb = reinterpret_cast<const float**>(base + off + each);
    }
    return off + 2 * each;
  }
};

/// Group i's shape, operands, strides and scales (cutlass_group_prep_kernel's rows and weight map):
/// a's scales from its first row on, the weight's from its first n block on.
__global__ void cutlass_block_prep_kernel(BlockInstance::Arrays g, GroupedMmCudaParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.num_groups) return;
  const GroupRowWeight rw = cutlass_group_fill<BlockInstance::Plain, E4m3>(
      g.base, i, p.m_indptr, p.b_index, p.cum_m, static_cast<int>(p.n), static_cast<int>(p.k),
      static_cast<const E4m3*>(p.a), p.a_stride_m, static_cast<const E4m3*>(p.b), p.b_stride_n,
      p.b_stride_e, static_cast<Bf16*>(p.out), p.out_stride_m);
  g.sfa[i] = p.a_block_scale + rw.begin * p.a_block_scale_stride;
  g.sfb[i] = p.b_block_scale + rw.weight * p.b_block_scale_stride_e;
}

}  // namespace

bool run_fp8_block(const GroupedMmCudaParams& p, cudaStream_t s, int device,
                   StreamScratchPool& pool, const char* op) {
  using I = BlockInstance;
  using Gemm = I::Gemm;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = sm_count(device);
  typename Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.hw_info = hw;
  args.epilogue.thread.alpha = 1.0f;  // the scales are in the mainloop's promotion
  args.epilogue.thread.beta = 0.0f;
  // The group count before the workspace is sized (the shapes themselves are on the device).
  args.problem_shape = {static_cast<int>(p.num_groups), nullptr, nullptr};
  const std::size_t arrays = align256(I::arrays(p.num_groups, nullptr, nullptr));
  const std::size_t workspace = Gemm::get_workspace_size(args);
  const std::optional<StreamScratch> scratch =
      pool.try_acquire(op, device, s, arrays + align16(workspace));
  if (!scratch) return false;
  auto* base = static_cast<char*>(scratch->data());
  I::Arrays g{};
  I::arrays(p.num_groups, base, &g);
  args.problem_shape = {static_cast<int>(p.num_groups), g.base.shapes, nullptr};
  args.mainloop.ptr_A = g.base.a;
  args.mainloop.dA = g.base.sa;
  args.mainloop.ptr_B = g.base.b;
  args.mainloop.dB = g.base.sb;
  // The scales' layouts are derived from each group's shape (ScaleConfig); CUTLASS copies the
  // per-group layout arguments without reading them, so none are written.
  args.mainloop.ptr_SFA = g.sfa;
  args.mainloop.ptr_SFB = g.sfb;
  args.epilogue.ptr_D = g.base.d;
  args.epilogue.dD = g.base.sd;
  const typename AdapterCache<Gemm>::Key key{device, base, p.num_groups, nullptr, false};
  const auto blocks = static_cast<unsigned>((p.num_groups + kPrepThreads - 1) / kPrepThreads);
  return run_adapter<Gemm>(
      args, key, base + arrays, s, op, "CUTLASS block-scaled grouped GEMM",
      [&] { cutlass_block_prep_kernel<<<blocks, kPrepThreads, 0, s>>>(g, p); });
}

}  // namespace cutlass_grouped
}  // namespace flashinfer::kernels::cuda
