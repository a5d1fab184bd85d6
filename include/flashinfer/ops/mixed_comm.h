// flashinfer.comm.mixed_comm: MixedCommHandler and run_mixed_comm, the collectives of a node
// split into tensor-parallel (TP) and data-parallel (DP) ranks: all-reduce over TP, all-gather
// and reduce-scatter over DP, and the fused all-reduce + all-gather / reduce-scatter +
// all-reduce. The ranks meet through a comm::CommBackend (flashinfer/comm.h); the data moves
// through buffers every rank maps. CPU reference and CUDA kernels; docs/COMM.md, "Mixed TP / DP
// collectives".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/comm.h"
#include "flashinfer/device.h"
#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// flashinfer.comm.mixed_comm.MixedCommOp (upstream's IntEnum, same names and values).
enum class MixedCommOp : int {
  ALLREDUCE = 0,
  ALLGATHER = 1,
  REDUCESCATTER = 2,
  ALLREDUCE_ALLGATHER = 3,
  REDUCESCATTER_ALLREDUCE = 4,
};
/// "ALLREDUCE", ...
std::string_view mixed_comm_op_name(MixedCommOp op);
/// Recorded as upstream's enum member: EnumValue{"MixedCommOp", "ALLREDUCE", "0"}.
Value to_value(MixedCommOp op);

/// flashinfer.comm.mixed_comm.MixedCommMode (upstream's IntEnum, same names and values). 0-5
/// are the fused kernels (MC: multicast, UC: unicast; WAITS / BYTES1 / BYTES2 their schedules),
/// 6 and 7 NCCL calls, 8 upstream's autotuned choice.
enum class MixedCommMode : int {
  FUSED_OPT_WAITS_MC = 0,
  FUSED_OPT_WAITS_UC = 1,
  FUSED_OPT_BYTES1_MC = 2,
  FUSED_OPT_BYTES1_UC = 3,
  FUSED_OPT_BYTES2_MC = 4,
  FUSED_OPT_BYTES2_UC = 5,
  NCCL_ONE = 6,
  NCCL_TP_DP = 7,
  AUTOTUNE = 8,
};
std::string_view mixed_comm_mode_name(MixedCommMode mode);
Value to_value(MixedCommMode mode);

/// flashinfer.comm.mixed_comm.ParallelInfo: a rank's place in local (intra-node) x inter
/// (inter-node) ranks, each split into TP x DP. world_rank = inter_rank * local_size +
/// local_rank; local_rank = local_tp_rank + local_dp_rank * local_tp_size (and the same for the
/// inter ranks); tp_rank = local_tp_rank + inter_tp_rank * local_tp_size, dp_rank likewise. A
/// split size None is derived from the other (both None: all TP). Throws flashinfer::Error
/// (kInvalidArgument) where upstream's asserts fail.
struct ParallelInfo {
  ParallelInfo(int64_t world_rank, int64_t world_size, int64_t local_rank, int64_t local_size,
               int64_t inter_rank, int64_t inter_size, std::optional<int64_t> local_tp_size,
               std::optional<int64_t> local_dp_size, std::optional<int64_t> inter_tp_size,
               std::optional<int64_t> inter_dp_size);
  int64_t world_rank, world_size, local_rank, local_size, inter_rank, inter_size;
  int64_t local_tp_size, local_dp_size, inter_tp_size, inter_dp_size;
  int64_t local_tp_rank() const { return local_rank % local_tp_size; }
  int64_t local_dp_rank() const { return local_rank / local_tp_size; }
  int64_t inter_tp_rank() const { return inter_rank % inter_tp_size; }
  int64_t inter_dp_rank() const { return inter_rank / inter_tp_size; }
  int64_t tp_rank() const { return local_tp_rank() + inter_tp_rank() * local_tp_size; }
  int64_t tp_size() const { return local_tp_size * inter_tp_size; }
  int64_t dp_rank() const { return local_dp_rank() + inter_dp_rank() * local_dp_size; }
  int64_t dp_size() const { return local_dp_size * inter_dp_size; }
  bool use_local_tp() const { return local_tp_size > 1; }
  bool use_inter_tp() const { return inter_tp_size > 1; }
  bool use_tp() const { return tp_size() > 1; }
  bool use_dp() const { return dp_size() > 1; }
  bool use_inter() const { return inter_size > 1; }
  bool use_mixed() const { return use_tp() && use_dp(); }
};

/// flashinfer.comm.mixed_comm.MixedCommHandler. Collective: every rank of one node constructs it
/// with the same split, dtype (fp16 or bf16) and device, and comm_backend (required in C++:
/// upstream's torch.distributed world; its size and rank are world_size and world_rank).
/// local_size must be 2, 4 or 8 (upstream compiles those splits only). One node only: several
/// nodes (inter_size > 1, upstream's nvshmem) are refused, not implemented. grid_size,
/// max_block_size, min_block_size, min_num_steps, ib_enable_ibgda and should_init_nvshmem only
/// steer upstream's launches; they are checked as upstream checks them and change no value.
/// use_autotune keeps AUTOTUNE among the valid modes (and the default of mode None); it resolves
/// to FUSED_OPT_WAITS_UC here, since a timing cannot be replayed.
class MixedCommHandler : public ApiObject {
 public:
  struct Impl;
  MixedCommHandler(int64_t world_rank, int64_t world_size, int64_t local_rank, int64_t local_size,
                   int64_t inter_rank, int64_t inter_size, std::optional<int64_t> local_tp_size,
                   std::optional<int64_t> local_dp_size, std::optional<int64_t> inter_tp_size,
                   std::optional<int64_t> inter_dp_size, DType dtype, Device device,
                   std::optional<int64_t> grid_size = std::nullopt,
                   std::optional<int64_t> max_block_size = std::nullopt,
                   int64_t min_block_size = 256, int64_t min_num_steps = 4,
                   bool ib_enable_ibgda = true, bool should_init_nvshmem = true,
                   bool use_autotune = true,
                   std::shared_ptr<comm::CommBackend> comm_backend = nullptr);
  ~MixedCommHandler() override;
  MixedCommHandler(const MixedCommHandler&) = delete;
  MixedCommHandler& operator=(const MixedCommHandler&) = delete;

  const ParallelInfo& para_info() const;
  DType dtype() const;
  Device device() const;
  bool use_autotune() const;
  /// Upstream's lists, in its order: ops by the split (mixed: the two fused ops; TP only:
  /// ALLREDUCE; DP only: ALLGATHER, REDUCESCATTER); modes WAITS_MC, WAITS_UC, the BYTES1 pair
  /// with local TP, NCCL_ONE, NCCL_TP_DP when mixed, AUTOTUNE with use_autotune.
  std::vector<MixedCommOp> get_valid_op_list() const;
  std::vector<MixedCommMode> get_valid_mode_list() const;
  /// The mode AUTOTUNE stands for (FUSED_OPT_WAITS_UC: one fixed choice, the same on every
  /// rank; upstream times the modes).
  MixedCommMode select_autotune_mode(MixedCommOp op, const Tensor& x_in) const;

  /// Collective, while idle: this rank's work synchronized, a barrier, the buffers marked
  /// detached (fused modes refused until checkpoint_restore; the NCCL modes keep working, as
  /// upstream's), a barrier, the backend dropped. A no-op while detached. Upstream releases the
  /// physical memory and keeps the addresses; here the memory stays allocated.
  void checkpoint_prepare();
  /// Collective: comm_backend must have the handler's local rank and size (upstream's
  /// ValueErrors); the exchange restarts as a new handler's; a barrier. A no-op while attached.
  void checkpoint_restore(std::shared_ptr<comm::CommBackend> comm_backend);
  /// Collective (a barrier, then the buffers released; upstream's skips the barrier while
  /// detached); later calls refused. Once only (upstream's assert).
  void shutdown();

  /// "MixedCommHandler(rank=1, size=4, group=0x..., local_tp_size=2, local_dp_size=2,
  /// dtype=torch.bfloat16, use_autotune=True)": a recording keeps each rank's place and split
  /// (upstream's handler has Python's default repr).
  std::string repr() const override;
  std::string_view class_name() const override { return "MixedCommHandler"; }
  std::string_view module_name() const override { return "flashinfer.comm.mixed_comm"; }
  Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

/// Collective: every rank of the handler calls it with the same op, mode and shapes. x_in
/// [n, ...] (the handler's dtype and device, at least 2-D); returns x_out (allocated when None):
///   ALLREDUCE (TP only)          [n, ...]       the sum over the ranks
///   ALLGATHER (DP only)          [dp * n, ...]  block k = rank k's x_in
///   REDUCESCATTER (DP only)      [n / dp, ...]  the sum of every rank's block dp_rank
///   ALLREDUCE_ALLGATHER (mixed)  [dp * n, ...]  block k = the sum over the TP ranks of DP rank k
///   REDUCESCATTER_ALLREDUCE      [n / dp, ...]  the sum over all ranks of block dp_rank
/// Sums are fp32, rounded once to the dtype (NCCL_TP_DP's reduce-scatter + all-reduce: twice), in
/// upstream's fused kernels' order where it is fixed (docs/COMM.md: rank order, the unicast
/// reduce-scatter's own block first, the DP groups descending for REDUCESCATTER_ALLREDUCE) and
/// in rank order otherwise. Fused modes turn an aligned pair of -0 elements into +0 where
/// upstream's buffers do (its "not yet written" mark); NCCL modes do not. mode None: AUTOTUNE with
/// use_autotune, else NCCL_TP_DP when valid, else NCCL_ONE. Fused modes need contiguous tensors and
/// a multiple of 8 elements; empty inputs are refused. Compute capability 9.0 or 10.0 on CUDA.
Tensor run_mixed_comm(MixedCommOp op, std::shared_ptr<MixedCommHandler> handler, const Tensor& x_in,
                      std::optional<Tensor> x_out = std::nullopt,
                      std::optional<MixedCommMode> mode = std::nullopt);

}  // namespace flashinfer
