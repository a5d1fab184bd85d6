// Collective communication of flashinfer.comm: the unified all-reduce fusion
// (create_allreduce_fusion_workspace, allreduce_fusion: the sum over a tensor-parallel group
// fused with the residual add, RMSNorm and quantization that follow it). The ranks meet through
// a comm::CommBackend (flashinfer/comm.h); the data moves through buffers every rank maps.
// CPU reference and CUDA kernel. docs/COMM.md gives the math and the replay of recordings
// made by every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "flashinfer/comm.h"
#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/quantization.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// flashinfer.comm.AllReduceFusionPattern (upstream's int constants).
namespace AllReduceFusionPattern {
inline constexpr int64_t kAllReduce = 0;
inline constexpr int64_t kARResidualRMSNorm = 1;
inline constexpr int64_t kARResidualRMSNormFP8Quant = 2;
inline constexpr int64_t kARResidualRMSNormFP4Quant = 3;
inline constexpr int64_t kARResidualRMSNormOutFP8Quant = 4;
inline constexpr int64_t kARResidualRMSNormOutFP4Quant = 5;
inline constexpr int64_t kMoEReductionARResidualRMSNorm = 6;
inline constexpr int64_t kMoEFinalizeARResidualRMSNorm = 7;
inline constexpr int64_t kARResidualRMSNormPerTokenGroupFP8PackedQuant = 8;
inline constexpr int64_t kARResidualRMSNormOutPerTokenGroupFP8PackedQuant = 9;
inline constexpr int64_t kARResidualRMSNormDynamicFP8Quant = 10;
inline constexpr int64_t kARResidualRMSNormOutDynamicFP8Quant = 11;
}  // namespace AllReduceFusionPattern

/// flashinfer.comm.QuantizationSFLayout: where NVFP4 scale bytes go.
namespace QuantizationSFLayout {
inline constexpr int64_t SWIZZLED_128x4 = 0;
inline constexpr int64_t SWIZZLED_8x4 = 1;
inline constexpr int64_t LINEAR = 2;
}  // namespace QuantizationSFLayout

class Mapping;

/// flashinfer.comm.trtllm_mnnvl_ar.MNNVLAllreduceFusionStrategy (upstream's enum values).
namespace MNNVLAllreduceFusionStrategy {
inline constexpr int64_t ONESHOT = 0;
inline constexpr int64_t TWOSHOT = 1;
inline constexpr int64_t AUTO = 99;
}  // namespace MNNVLAllreduceFusionStrategy

/// flashinfer.comm.workspace_base.AllReduceFusionWorkspace: what create_allreduce_fusion_workspace
/// returns and allreduce_fusion takes, a "trtllm" or an "mnnvl" workspace. Destroying one is the
/// caller's collective business, as upstream's destroy(): no rank may still be in a call on it.
class AllReduceFusionWorkspace : public ApiObject {
 public:
  virtual int64_t world_size() const = 0;
  virtual int64_t rank() const = 0;
  virtual std::string backend() const = 0;
  /// Whether calls of num_tokens x hidden_dim in dtype fit (use_oneshot: the strategy, None as
  /// the call's own choice would make it).
  virtual bool is_buffer_size_sufficient(int64_t tp_size, int64_t num_tokens, int64_t hidden_dim,
                                         DType dtype,
                                         std::optional<bool> use_oneshot = std::nullopt) const = 0;
  /// Collective (every rank calls it, as upstream's): this rank's work synchronized, a barrier,
  /// then the buffers released (idempotent); later calls on the workspace are refused.
  virtual void destroy() = 0;
  virtual Device device() const = 0;
};

/// The "trtllm" workspace of create_allreduce_fusion_workspace: this rank's place in the group,
/// the sizes it was made for, and the peer buffers (on comm_backend->device()) every rank maps.
class TRTLLMAllReduceFusionWorkspace : public AllReduceFusionWorkspace {
 public:
  struct Impl;
  explicit TRTLLMAllReduceFusionWorkspace(std::shared_ptr<Impl> impl);
  ~TRTLLMAllReduceFusionWorkspace() override;

  int64_t world_size() const override;
  int64_t rank() const override;
  std::string backend() const override { return "trtllm"; }
  int64_t max_token_num() const;
  int64_t hidden_dim() const;
  /// Upstream's metadata check: the group size, T * H against max_token_num * hidden_dim, fp32
  /// buffers for fp32 inputs only.
  bool is_buffer_size_sufficient(int64_t tp_size, int64_t num_tokens, int64_t hidden_dim,
                                 DType dtype,
                                 std::optional<bool> use_oneshot = std::nullopt) const override;
  void destroy() override;
  /// Collective: this rank's work synchronized, a barrier, the buffers marked detached
  /// (allreduce_fusion refuses them until checkpoint_restore), a barrier. Idempotent. Upstream
  /// releases the physical memory and keeps the addresses; here the memory stays allocated.
  void checkpoint_prepare();
  /// Collective: adopts comm_backend (the workspace's rank and world size), restarts the flag
  /// protocol (each rank's flags and call counters zeroed; the data slots undefined, as
  /// upstream's), a barrier. Idempotent.
  void checkpoint_restore(std::shared_ptr<comm::CommBackend> comm_backend);
  Device device() const override;
  Impl& impl() const { return *impl_; }

  std::string_view class_name() const override { return "TRTLLMAllReduceFusionWorkspace"; }
  std::string_view module_name() const override { return "flashinfer.comm.allreduce"; }

 private:
  std::shared_ptr<Impl> impl_;
};

/// The "mnnvl" workspace (flashinfer.comm.trtllm_mnnvl_ar): upstream's NVLink-multicast
/// all-reduce, whose kernels sum every rank's fp32 values in rank order from 0 and round once
/// (docs/COMM.md, "MNNVL all-reduce"). Upstream maps one multicast buffer over the group; here
/// the same per-rank buffers are peer memory (CUDA IPC, peer access, or host shared memory for
/// the CPU reference), so no multicast is needed. Sized in bytes, not for a dtype.
class MNNVLAllReduceFusionWorkspace : public AllReduceFusionWorkspace {
 public:
  struct Impl;
  /// Upstream's constructor (collective over mapping's TP group, through comm_backend, which
  /// C++ requires: upstream's None is MPI's world). buffer_size_in_bytes None: the larger of the
  /// one-shot size at min(2^20 / (tp * itemsize * H), max_num_tokens) tokens and the two-shot
  /// size at max_num_tokens (all three then required); rounded up to 32, at most 2^32 - 1. The
  /// usable size (buffer_size_bytes) is what the allocation, rounded up to 2 MiB with upstream's
  /// 2 KiB signal pad, holds for each of three buffers.
  MNNVLAllReduceFusionWorkspace(std::shared_ptr<Mapping> mapping,
                                std::optional<int64_t> max_num_tokens = std::nullopt,
                                std::optional<int64_t> hidden_dim = std::nullopt,
                                std::optional<DType> dtype = std::nullopt,
                                std::optional<int64_t> buffer_size_in_bytes = std::nullopt,
                                std::shared_ptr<comm::CommBackend> comm_backend = nullptr);
  ~MNNVLAllReduceFusionWorkspace() override;
  MNNVLAllReduceFusionWorkspace(const MNNVLAllReduceFusionWorkspace&) = delete;
  MNNVLAllReduceFusionWorkspace& operator=(const MNNVLAllReduceFusionWorkspace&) = delete;

  /// The mapping's world size (upstream's world_size attribute) and this rank's place in the TP
  /// group the calls sum over.
  int64_t world_size() const override;
  int64_t rank() const override;
  std::string backend() const override { return "mnnvl"; }
  int64_t buffer_size_bytes() const;
  int64_t workspace_size_bytes() const;  // 3 * buffer_size_bytes, as upstream's
  /// Bytes a call needs: one-shot T * H * tp * itemsize, two-shot 2 * ceil(T / tp) * tp * H *
  /// itemsize; AUTO picks one-shot while T * H * tp * itemsize <= 2^20.
  static int64_t get_required_buffer_size_bytes(
      int64_t tp_size, int64_t num_tokens, int64_t hidden_dim, DType dtype,
      int64_t strategy = MNNVLAllreduceFusionStrategy::AUTO);
  /// required <= buffer_size_bytes for upstream's strategy (MNNVLAllreduceFusionStrategy; any
  /// value but ONESHOT and AUTO sizes for two-shot, as upstream's).
  bool is_buffer_size_sufficient(int64_t tp_size, int64_t num_tokens, int64_t hidden_dim,
                                 DType dtype, int64_t strategy) const;
  /// The base's form: use_oneshot None is AUTO, true ONESHOT, false TWOSHOT.
  bool is_buffer_size_sufficient(int64_t tp_size, int64_t num_tokens, int64_t hidden_dim,
                                 DType dtype,
                                 std::optional<bool> use_oneshot = std::nullopt) const override;
  /// Collective here (a barrier before the memory goes, so no peer still reads it), where
  /// upstream's only drops its references: a rank destroying alone waits for its peers.
  void destroy() override;
  /// Collective: this rank's work synchronized, a barrier, the handles marked detached
  /// (allreduce_fusion refuses them with upstream's "MNNVL handles are not attached"), a
  /// barrier. A no-op while detached. Upstream releases the physical memory and keeps the
  /// addresses; here the memory stays allocated.
  void checkpoint_prepare();
  /// Collective: adopts comm_backend, restarts the exchange protocol as a new workspace's, a
  /// barrier. A no-op while attached. The backend must keep the workspace's rank and size
  /// (upstream's docstring asks it; here it is checked).
  void checkpoint_restore(std::shared_ptr<comm::CommBackend> comm_backend);
  Device device() const override;
  Impl& impl() const { return *impl_; }

  std::string_view class_name() const override { return "MNNVLAllReduceFusionWorkspace"; }
  std::string_view module_name() const override { return "flashinfer.comm.trtllm_mnnvl_ar"; }

 private:
  std::shared_ptr<Impl> impl_;
};

/// Collective: every rank of comm_backend's group calls it with the same sizes. backend:
/// "trtllm"; "mnnvl" (an MNNVLAllReduceFusionWorkspace: force_oneshot_support sizes it for
/// one-shot calls of max_token_num tokens, else upstream's default size); "auto": mnnvl when every
/// rank's GPU reports NVLink multicast (upstream's vote; CPU ranks have none), else trtllm up to
/// 16 ranks. world_size / rank default to the backend's and must agree with it; max_token_num,
/// hidden_dim and dtype (fp16, bf16, fp32) size the buffers. comm_backend is required (upstream's
/// None means torch.distributed's group, which C++ does not have); gpus_per_node and group change
/// nothing here.
/// create_allreduce_fusion_workspace's keyword-only arguments of upstream 0.7.4's
/// "mnnvl-cutedsl" backend (MNNVLCuteDSLConfig and its fusion switches): any given with another
/// backend is upstream's ValueError; that backend itself is refused (not implemented here).
struct AllReduceCuteDslOptions {
  std::optional<Value> top_k, rms_eps, weight_bias, routed_scaling_factor, include_shared_expert,
      add_residual, write_residual_output, apply_rms_norm, output_dtype, dynamic_fp8,
      write_norm_output, config;
};
FLASHINFER_OPTION_FIELDS(AllReduceCuteDslOptions, top_k, rms_eps, weight_bias,
                         routed_scaling_factor, include_shared_expert, add_residual,
                         write_residual_output, apply_rms_norm, output_dtype, dynamic_fp8,
                         write_norm_output, config);

std::shared_ptr<AllReduceFusionWorkspace> create_allreduce_fusion_workspace(
    std::string backend = "auto", std::optional<int64_t> world_size = std::nullopt,
    std::optional<int64_t> rank = std::nullopt, std::optional<int64_t> max_token_num = std::nullopt,
    std::optional<int64_t> hidden_dim = std::nullopt, std::optional<DType> dtype = std::nullopt,
    std::optional<int64_t> gpus_per_node = std::nullopt,
    std::shared_ptr<comm::CommBackend> comm_backend = nullptr, bool force_oneshot_support = false,
    std::optional<Value> group = std::nullopt, AllReduceCuteDslOptions options = {});

/// Collective: every rank calls it with its own input [T, H] (fp16, bf16 or fp32; the same T
/// and H everywhere). s = the ranks' inputs summed in rank order (fp32_acc: one fp32
/// accumulator, else each partial sum rounded to the dtype; the one-shot path reads -0 as +0).
/// Then by pattern (AllReduceFusionPattern):
///   0: output = s.
///   1..5, 8..11: residual_out = dtype(s + residual_in); y = dtype(residual_out * rsqrt(
///     mean(residual_out^2) + rms_eps) * (weight_bias + rms_gamma)); norm_out = y (1, 4, 5,
///     9, 11); quant_out from y: 2 / 4 FP8 e4m3 [T, H] = sat(y / scale_factor); 3 / 5 NVFP4
///     [T, H/2] with e4m3 block scales in scale_out (layout_code, scale_factor the global
///     scale); 8 / 9 FP8 with a power-of-two scale per block_quant_group_size elements packed
///     four exponent bytes an int32 in scale_out [T, ceil(G/4)] (strides 1, round_up(T, 4));
///     10 / 11 FP8 with a per-token scale max(amax / 448, 2^-9 / 448) in scale_out [T, 1] fp32.
/// Returns norm_out if given, else quant_out if given, else output (allocated when None).
/// Patterns 6 and 7 (the MoE reduction and finalize fusions, one-shot, 16-bit): each rank's local
/// value from the moe_* / expert arguments, every step rounded, then the rank sum with every
/// partial sum rounded and pattern 1's epilogue (docs/COMM.md, "The MoE patterns"). use_oneshot
/// None: one-shot while T * H * 2 * W * itemsize <= {2: 512, 4: 64, 8: 42} MiB; two-shot needs T >
/// W. launch_with_pdl and trigger_completion_at_end only order the CUDA launch. On an
/// MNNVLAllReduceFusionWorkspace, upstream's MNNVL kernels' arithmetic instead: patterns 0-5, 10
/// and 11; every input -0 read as +0, s one fp32 sum from 0 in rank order (one-shot: in chunks of 8
/// ranks above 8; two-shot: of 16), rounded once (two-shot: a -0 result is +0); fp32 subnormals
/// flushed to zero in the sum (upstream's -use_fast_math); residual_out = dtype(s + residual_in);
/// the norm's squares rounded to the dtype in one-shot, fp32 in two-shot; y = dtype((r * inv) * (wb
/// + g)) one-shot, dtype(((wb + g) * r) * inv) two-shot; patterns 10 / 11 scale the fp32 norm in
/// two-shot. fp32_acc and the MoE and group arguments are ignored; the outputs a pattern writes are
/// allocated when None; it returns output (0), norm_out (1) or quant_out. use_oneshot None:
/// one-shot while T * H * W * itemsize <= 2^20. Sizes are checked against buffer_size_bytes.
/// moe_finalize_backend (0.7.4, keyword-only): "trtllm" or "cake", upstream's two
/// implementations of pattern 7 (the same values); "cake" needs a TRT-LLM workspace.
Tensor allreduce_fusion(
    const Tensor& input, std::shared_ptr<AllReduceFusionWorkspace> workspace, int64_t pattern,
    bool launch_with_pdl = false, bool trigger_completion_at_end = true,
    std::optional<Tensor> output = std::nullopt, std::optional<Tensor> residual_out = std::nullopt,
    std::optional<Tensor> norm_out = std::nullopt, std::optional<Tensor> quant_out = std::nullopt,
    std::optional<Tensor> scale_out = std::nullopt,
    std::optional<Tensor> residual_in = std::nullopt,
    std::optional<Tensor> rms_gamma = std::nullopt, double rms_eps = 1e-6,
    std::optional<Value> scale_factor = std::nullopt,
    std::optional<int64_t> layout_code = std::nullopt,
    std::optional<bool> use_oneshot = std::nullopt, bool fp32_acc = false,
    std::optional<Value> moe_reduction_device_num_experts = std::nullopt,
    std::optional<Tensor> moe_reduction_scale_input = std::nullopt,
    std::optional<Tensor> moe_reduction_active_experts_token_input = std::nullopt,
    std::optional<Tensor> moe_reduction_token_input = std::nullopt,
    std::optional<Tensor> expanded_idx_to_permuted_idx = std::nullopt,
    std::optional<Tensor> expert_scale_factor = std::nullopt,
    std::optional<Tensor> shared_expert_output = std::nullopt,
    std::optional<int64_t> block_quant_group_size = std::nullopt, double weight_bias = 0.0,
    std::string_view moe_finalize_backend = "trtllm");

/// flashinfer.comm.mapping.Mapping: a rank's place in a TP x CP x PP grid and, within its TP
/// group, in the MoE's TP x EP x cluster split (the fields the comm ops read). tp_rank = rank %
/// tp_size, cp_rank = rank % (tp_size * cp_size) / tp_size, pp_rank = rank / (tp_size *
/// cp_size); moe_ep_rank = tp_rank % moe_ep_size. moe_cluster_size -1 means 1; moe_tp_size and
/// moe_ep_size -1 are derived so that moe_tp_size * moe_ep_size * moe_cluster_size == tp_size
/// (both -1: moe_ep_size 1).
class Mapping : public ApiObject {
 public:
  explicit Mapping(int64_t world_size = 1, int64_t rank = 0, int64_t gpus_per_node = 8,
                   int64_t cp_size = 1, int64_t tp_size = 1, int64_t pp_size = 1,
                   int64_t moe_cluster_size = -1, int64_t moe_tp_size = -1,
                   int64_t moe_ep_size = -1);
  int64_t world_size, rank, gpus_per_node, cp_size, tp_size, pp_size;
  int64_t moe_cluster_size, moe_tp_size, moe_ep_size;
  int64_t tp_rank() const { return rank % tp_size; }
  int64_t cp_rank() const { return rank % (tp_size * cp_size) / tp_size; }
  int64_t pp_rank() const { return rank / (tp_size * cp_size); }
  int64_t moe_ep_rank() const { return tp_rank() % moe_ep_size; }
  int64_t moe_tp_rank() const { return tp_rank() / (moe_ep_size * moe_cluster_size); }
  /// "Mapping(world_size=4, rank=1, gpus_per_node=8, cp_size=1, tp_size=4, pp_size=1,
  /// moe_cluster_size=1, moe_tp_size=1, moe_ep_size=4)": a recording keeps each rank's place.
  std::string repr() const override;
  std::string_view class_name() const override { return "Mapping"; }
  std::string_view module_name() const override { return "flashinfer.comm.mapping"; }
};

/// flashinfer.comm.mnnvl.MnnvlConfig: the CommBackend a workspace allocation exchanges through.
class MnnvlConfig : public ApiObject {
 public:
  explicit MnnvlConfig(std::shared_ptr<comm::CommBackend> comm_backend = nullptr)
      : comm_backend(std::move(comm_backend)) {}
  std::shared_ptr<comm::CommBackend> comm_backend;
  std::string_view class_name() const override { return "MnnvlConfig"; }
  std::string_view module_name() const override { return "flashinfer.comm.mnnvl"; }
};

/// flashinfer.comm.dcp_alltoall (decode context parallelism: each rank's partial attention
/// output and softmax statistics for the heads every other rank owns).
/// Bytes of one rank's workspace row: upstream's maxCh * cp_size * (512 KiB + 512), maxCh =
/// max(1, SMs / (2 * ceil(cp_size / 8))) of the current CUDA device (cuda:0 here; 1 channel
/// where no GPU is visible).
int64_t decode_cp_a2a_workspace_size(int64_t cp_size);

/// Collective over mapping.cp_size ranks (mnnvl_config->comm_backend, required in C++): an int64
/// [cp_size, row] tensor every rank sees whole, row r being rank r's memory (upstream: MNNVL
/// fabric memory). Here the ranks must share a process (threads, on one device or on devices
/// with peer access): one address space over several processes is refused (not implemented).
Tensor decode_cp_a2a_allocate_mnnvl_workspace(std::shared_ptr<Mapping> mapping,
                                              std::shared_ptr<MnnvlConfig> mnnvl_config = nullptr);

/// Resets this rank's row (every rank, then a barrier, before the first exchange).
void decode_cp_a2a_init_workspace(const Tensor& workspace, int64_t cp_rank, int64_t cp_size);

/// Collective: partial_o [..., cp_size, D] (fp16 / bf16, D * 2 bytes a multiple of 16) and
/// softmax_stats [..., cp_size, S] (fp32, S even, >= 2) with the same leading dims. Returns new
/// tensors of the same shapes where slot [..., p, :] holds rank p's input slot [..., cp_rank, :]
/// (a transpose over the ranks, bit for bit). enable_pdl only orders the CUDA launch.
/// out: upstream 0.7.4's preallocated (partial_o_out, softmax_stats_out), contiguous, each with
/// its input's dtype, shape and device; written and returned in place of new tensors.
std::tuple<Tensor, Tensor> decode_cp_a2a_alltoall(
    const Tensor& partial_o, const Tensor& softmax_stats, const Tensor& workspace, int64_t cp_rank,
    int64_t cp_size, std::optional<bool> enable_pdl = std::nullopt,
    const std::optional<std::vector<Tensor>>& out = std::nullopt);

/// flashinfer.comm.trtllm_moe_alltoall: the bytes one rank's MoE all-to-all workspace needs:
/// pad128(aux) + pad128(ep * max_num_tokens * dispatch bytes a token) + pad128(ep *
/// max_num_tokens * combine bytes a token), aux being upstream's counters, flags, the top_k
/// routing tables (22 slots a token) and the EPLB statistics, each region 128-byte aligned.
int64_t moe_a2a_get_workspace_size_per_rank(int64_t ep_size, int64_t max_num_tokens,
                                            int64_t total_dispatch_payload_size_per_token,
                                            int64_t combine_payload_size_per_token,
                                            int64_t eplb_stats_num_experts = 0);

// The functions beneath MoeAlltoAll, on a workspace the caller holds: uint8 [ep_size,
// size_per_rank] (contiguous, rows 8-byte aligned), row r being rank r's, the same storage on
// every rank. Here the ranks are threads of one process passing one tensor (MoeAlltoAll's
// workspace(), or any tensor they share; CUDA ranks on several devices need peer access). Every
// rank makes the same calls: moe_a2a_initialize, then a barrier (initialize has none), then
// dispatch and combine in turn (collectives). The metainfo is moe_a2a_initialize's.

/// Zeroes this rank's row (only) and returns the metainfo: CPU int64 [10], upstream's byte
/// offsets of a row's fields for ep_size ranks, max_num_tokens local tokens and
/// eplb_stats_num_experts statistics.
Tensor moe_a2a_initialize(const Tensor& workspace, int64_t ep_rank, int64_t ep_size,
                          int64_t max_num_tokens, int64_t eplb_stats_num_experts = 0);

/// A view of dtype, shape leading_shape + [-1], of the workspace's bytes [slice_start,
/// slice_end): offsets into the flattened workspace (rank slice_start / size_per_rank), one
/// rank's row only. A 1-D workspace is one row.
Tensor moe_a2a_wrap_payload_tensor_in_workspace(const Tensor& workspace,
                                                const std::vector<int64_t>& leading_shape,
                                                int64_t slice_start, int64_t slice_end,
                                                DType dtype);

/// Collective: MoeAlltoAll.dispatch on the caller's workspace (no sanitizing here: see
/// moe_a2a_sanitize_expert_ids). Returns per payload the [ep_size, runtime_max, cols] view of
/// this rank's receive region, the combine payload offset (bytes from a row's start, for
/// moe_a2a_combine), and with eplb_local_stats (int32 [n], n <= num_experts and the count
/// initialize reserved) the gathered statistics int32 [ep_size, n], row s being rank s's.
/// local tokens <= runtime_max_tokens_per_rank and <= initialize's max_num_tokens (upstream
/// leaves both to the caller).
std::tuple<std::vector<Tensor>, int64_t, std::optional<Tensor>> moe_a2a_dispatch(
    const Tensor& token_selected_experts, const std::vector<Tensor>& input_payloads,
    const Tensor& workspace, const Tensor& metainfo, int64_t runtime_max_tokens_per_rank,
    int64_t ep_rank, int64_t ep_size, int64_t top_k, int64_t num_experts,
    std::optional<bool> enable_pdl = std::nullopt,
    std::optional<Tensor> eplb_local_stats = std::nullopt, bool enable_rank_mask = false,
    std::optional<Tensor> active_rank_mask = std::nullopt);

/// Collective, after this rank's dispatch with the same runtime_max and top_k: MoeAlltoAll.combine
/// for its local_num_tokens tokens (the dispatch's) and combine_payload_offset (the dispatch's;
/// payload_in_workspace: the payload is wrap(workspace, [ep_size, runtime_max], row start +
/// offset, ...)). Returns [local_num_tokens, hidden].
Tensor moe_a2a_combine(const Tensor& payload, int64_t local_num_tokens, const Tensor& workspace,
                       const Tensor& metainfo, int64_t runtime_max_tokens_per_rank, int64_t ep_rank,
                       int64_t ep_size, int64_t top_k, int64_t combine_payload_offset,
                       bool payload_in_workspace = false,
                       std::optional<DType> output_dtype = std::nullopt,
                       std::optional<Tensor> output_scales = std::nullopt,
                       double output_scalar_scale = 1.0,
                       SfLayout sf_layout = SfLayout::layout_linear,
                       std::optional<Tensor> output = std::nullopt, bool use_low_precision = false,
                       std::optional<bool> enable_pdl = std::nullopt, bool enable_rank_mask = false,
                       std::optional<Tensor> active_rank_mask = std::nullopt);

/// In place, after this rank's dispatch: expert_ids (int32 [ep_size, runtime_max, top_k], the
/// received copy of an ids payload) gets invalid_expert_id in every slot of each row past the
/// count its source sent. Valid rows keep their global ids (upstream's kernel, whatever its
/// docstring says).
void moe_a2a_sanitize_expert_ids(const Tensor& expert_ids, const Tensor& workspace,
                                 const Tensor& metainfo, int64_t ep_rank, int64_t invalid_expert_id,
                                 std::optional<bool> enable_pdl = std::nullopt);

/// MoeAlltoAll.get_moe_workspace_size_per_rank (a static method): the size above for 16-bit
/// hidden states with int32 expert ids and fp32 scales: dispatch hidden * 2 + top_k * 8 + extra
/// bytes a token, combine hidden * 2.
int64_t moe_alltoall_get_moe_workspace_size_per_rank(int64_t ep_size, int64_t top_k,
                                                     int64_t max_num_tokens, int64_t hidden_size,
                                                     int64_t extra_payload_bytes_per_token = 0,
                                                     int64_t eplb_stats_num_experts = 0);

/// flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll: expert-parallel token exchange. dispatch
/// sends each local token to every rank that owns one of its top_k experts (the experts split
/// over the ranks in contiguous blocks); combine brings each rank's result for the tokens it
/// received back and sums it per token. Every rank of mapping's MoE EP group constructs one with
/// the same arguments and calls dispatch and combine in turn (collectives). Here the ranks must
/// share a process (threads: ranks in several processes need MNNVL fabric memory, refused by
/// name). Instances of one rank with equal sizes on one comm_backend share a workspace, as
/// upstream's workspace cache. backend "trtllm" (upstream's "cake" needs Blackwell: refused).
class MoeAlltoAll : public ApiObject {
 public:
  struct Impl;
  MoeAlltoAll(std::shared_ptr<Mapping> mapping, int64_t max_num_tokens, int64_t top_k,
              int64_t num_experts, std::optional<int64_t> workspace_size_per_rank = std::nullopt,
              std::optional<int64_t> hidden_size = std::nullopt,
              std::shared_ptr<MnnvlConfig> mnnvl_config = nullptr,
              int64_t eplb_stats_num_experts = 0, bool enable_rank_mask = false,
              std::string backend = "trtllm");
  ~MoeAlltoAll() override;
  MoeAlltoAll(const MoeAlltoAll&) = delete;
  MoeAlltoAll& operator=(const MoeAlltoAll&) = delete;

  /// Collective. token_selected_experts [T, top_k] int32 and 1..6 payloads [T, ...] (any dtype,
  /// contiguous) on the workspace's device, T <= runtime_max_tokens_per_rank <= max_num_tokens.
  /// Returns, per payload, a view [ep_size, runtime_max, row] of this rank's workspace: rows
  /// [s, 0, n_s) are the n_s tokens rank s sent here, in rank s's token order (upstream's order
  /// is its atomics'); later rows keep older bytes. A token reaches a rank once (its lowest slot
  /// routed there), ids outside [0, num_experts) and ranks off active_rank_mask (a CPU uint64
  /// [1] bit mask) reach none. invalid_token_expert_id: the received ids payload
  /// (expert_id_payload_index, int32 [T, top_k]) gets it in every slot of the rows past n_s.
  /// eplb_local_stats (int32 [eplb_stats_num_experts]) reaches every rank:
  /// eplb_gathered_stats() row s is rank s's. The views stay valid until the next dispatch.
  std::vector<Tensor> dispatch(const Tensor& token_selected_experts,
                               const std::vector<Tensor>& input_payloads,
                               int64_t runtime_max_tokens_per_rank,
                               std::optional<int64_t> invalid_token_expert_id = std::nullopt,
                               std::optional<int64_t> expert_id_payload_index = std::nullopt,
                               std::optional<Tensor> eplb_local_stats = std::nullopt,
                               std::optional<Tensor> active_rank_mask = std::nullopt);

  /// Collective, after dispatch. payload [ep_size, runtime_max, H] (fp16, bf16, fp32 or fp8
  /// e4m3): row [s, i] is this rank's (already weighted) result for the i-th token it received
  /// from rank s. Returns [T, H]: per local token, the rows its ranks hold for it summed in fp32
  /// in upstream's fixed order over the top_k slots, rounded once to the payload's dtype
  /// (use_low_precision: rows cast to fp8 e4m3 first, output bf16). payload_in_workspace: the
  /// payload is get_combine_payload_tensor_in_workspace's view. output: written and returned.
  /// Quantized outputs (output_scales) are refused: upstream runs them on SM100+ only, and
  /// flashinfer-cpp does not implement them.
  Tensor combine(const Tensor& payload, int64_t runtime_max_tokens_per_rank,
                 bool payload_in_workspace = false,
                 std::optional<DType> output_dtype = std::nullopt,
                 std::optional<Tensor> output_scales = std::nullopt,
                 double output_scalar_scale = 1.0, SfLayout sf_layout = SfLayout::layout_linear,
                 std::optional<Tensor> output = std::nullopt, bool use_low_precision = false,
                 std::optional<Tensor> active_rank_mask = std::nullopt);

  /// After dispatch: a [ep_size, runtime_max, hidden_size] view of dtype on this rank's combine
  /// region, for the experts to write into before combine(..., payload_in_workspace=True).
  Tensor get_combine_payload_tensor_in_workspace(int64_t runtime_max_tokens_per_rank,
                                                 int64_t hidden_size, DType dtype);

  /// Collective, while idle: this rank's work synchronized, then the workspace's handles marked
  /// unmapped (every call but checkpoint_restore refused until then). Idempotent. The memory
  /// stays allocated at its addresses (upstream releases the physical pages; flashinfer-cpp's
  /// in-process workspace keeps them).
  void checkpoint_prepare();
  /// Collective: adopts comm_backend (same rank and size as before), zeroes this rank's row as
  /// a new workspace's, checks the layout did not change, barrier; back to idle. Idempotent.
  void checkpoint_restore(std::shared_ptr<comm::CommBackend> comm_backend);

  /// The last dispatch's gathered EPLB statistics (int32 [ep_size, eplb_stats_num_experts]), or
  /// nullopt (no stats passed, or combined since).
  std::optional<Tensor> eplb_gathered_stats() const;
  /// The workspace [ep_size, workspace_size_per_rank] (uint8; row r is rank r's) and upstream's
  /// metainfo (CPU int64 [10], the byte offsets of a row's fields).
  Tensor workspace() const;
  Tensor metainfo() const;
  int64_t ep_rank() const;
  int64_t ep_size() const;
  std::string_view class_name() const override { return "MoeAlltoAll"; }
  std::string_view module_name() const override { return "flashinfer.comm.trtllm_moe_alltoall"; }

 private:
  std::shared_ptr<Impl> impl_;
};

/// flashinfer.comm.pcie_ipc_ar.PcieIpcAllReduceWorkspace: a plain all-reduce for PCIe-only
/// nodes (SGLang and vLLM call all_reduce on it). The constructor is collective (every rank
/// with the same arguments): 2, 4 or 8 ranks, bf16 or fp16 (one workspace serves both: only the
/// element size binds), max_numel a positive multiple of 8, max_blocks > 0. profile,
/// tune_batches and tune_cache only steer upstream's launch tuning (and the topology label);
/// nothing here depends on them.
class PcieIpcAllReduceWorkspace : public ApiObject {
 public:
  struct Impl;
  PcieIpcAllReduceWorkspace(std::shared_ptr<comm::CommBackend> group, int64_t max_numel,
                            DType dtype = DType::kBFloat16, int64_t max_blocks = 128,
                            std::optional<Value> profile = std::nullopt,
                            std::optional<Value> tune_batches = std::nullopt,
                            std::optional<Value> tune_cache = std::nullopt);
  ~PcieIpcAllReduceWorkspace() override;
  PcieIpcAllReduceWorkspace(const PcieIpcAllReduceWorkspace&) = delete;
  PcieIpcAllReduceWorkspace& operator=(const PcieIpcAllReduceWorkspace&) = delete;

  /// Collective: out = the sum of every rank's inp (same shape everywhere), in the ranks'
  /// 16-bit dtype, each partial sum rounded: rank order 0..W-1, except 8 ranks on every variant
  /// but FLAT_STAGED (upstream's 4 + 4 island kernels: ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7))).
  /// config: None (upstream's untuned choice), or (blocks, threads,
  /// variant) as a tuple, a dict or upstream's IpcLaunchConfig repr; variants 0-3 (UNSTAGED,
  /// STAGED, STAGED_RING, FLAT_STAGED). enable_pdl=True is refused as upstream refuses it.
  /// Returns out (allocated when None).
  Tensor all_reduce(const Tensor& inp, std::optional<Tensor> out = std::nullopt,
                    std::optional<Value> config = std::nullopt, bool enable_pdl = false);
  /// Whether all_reduce takes `inp` with config None (upstream's supports()).
  bool supports(const Tensor& inp) const;
  int64_t world_size() const;
  int64_t rank() const;
  /// Collective (every rank calls it, as upstream's): this rank's work synchronized, a barrier,
  /// then the buffers released (idempotent); later calls are refused.
  void destroy();

  std::string_view class_name() const override { return "PcieIpcAllReduceWorkspace"; }
  std::string_view module_name() const override { return "flashinfer.comm.pcie_ipc_ar"; }

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace flashinfer
