// flashinfer.comm.ulysses: the all-to-all of Ulysses context parallelism (docs/COMM.md, "Ulysses
// all-to-all"). Attention over a sequence sharded across W ranks trades the sequence shards for
// head slices before attention and back after it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flashinfer/comm.h"
#include "flashinfer/dtype.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

namespace flashinfer {

/// flashinfer.comm.ulysses.UlyssesCommunicator. The constructor is collective: every rank of
/// `group` calls it with the same max_elems, dtype (float16, bfloat16 or float32) and backend
/// ("auto", "nvlink" or "nccl"); device None means the group's device; at most 8 ranks (one
/// signal block's slots: upstream's NCCL path, which takes more, is not here). Each rank gets a
/// staging buffer of max_elems elements and a signal block that every rank maps (peer memory); with
/// one rank nothing is allocated. backend(): "nvlink" (upstream's fused push kernel) for 2, 4, 6 or
/// 8 ranks, else "nccl" with fallback_reason() saying why ("auto"; forced "nvlink" raises). Both
/// move the data through the peer buffers here, bit-identical as upstream's backends are.
class UlyssesCommunicator : public ApiObject {
 public:
  struct Impl;
  UlyssesCommunicator(std::shared_ptr<comm::CommBackend> group, int64_t max_elems, DType dtype,
                      std::string backend = "auto", std::optional<Value> device = std::nullopt);
  ~UlyssesCommunicator() override;
  UlyssesCommunicator(const UlyssesCommunicator&) = delete;
  UlyssesCommunicator& operator=(const UlyssesCommunicator&) = delete;

  /// Collective: x [B, S_local, H, D] (contiguous, the communicator's dtype and device, numel <=
  /// max_elems, H % W == 0) -> [B, S_local * W, H / W, D]: rank r gets heads [r * H / W, (r + 1)
  /// * H / W) of every rank's shard, the shards in rank order. One rank: x itself.
  Tensor scatter_heads(const Tensor& x);
  /// Collective, the inverse: x [B, S_global, H_local, D] (S_global % W == 0) ->
  /// [B, S_global / W, H_local * W, D]: sequence block r of every rank's head slice, the slices in
  /// rank order. One rank: x itself.
  Tensor gather_heads(const Tensor& x);
  /// Collective while buffers are held (every rank calls it): this rank's work synchronized, a
  /// barrier, the buffers released. Idempotent; later collectives are refused. Call it before
  /// the communicator goes: the destructor releases this rank's buffers without waiting for the
  /// peers. A rank's calls must come on one stream (its next call's kernel must follow its
  /// previous copy-out), as upstream's.
  void close();

  const std::string& backend() const;
  /// Why the backend is "nccl" when "nccl" was not requested; nullopt otherwise.
  const std::optional<std::string>& fallback_reason() const;
  int64_t world_size() const;
  int64_t rank() const;
  int64_t max_elems() const;
  DType dtype() const;
  Device device() const;

  std::string_view class_name() const override { return "UlyssesCommunicator"; }
  std::string_view module_name() const override { return "flashinfer.comm.ulysses"; }

 private:
  std::shared_ptr<Impl> impl_;
};

/// flashinfer.comm.ulysses.init_ulysses_a2a, the raw entry point under UlyssesCommunicator:
/// a handle over buffers the caller made and shared. out_ipc_ptrs[i] / signal_ipc_ptrs[i] are
/// rank i's output staging buffer (at least as large as any call's output, unchecked as
/// upstream's) and its 3456-byte signal block (vLLM's custom all-reduce Signal), as this rank
/// addresses them: device memory (CUDA IPC or peer access), or host memory every rank of the
/// process reaches (the CPU reference). rank in [0, world_size), world_size 2, 4, 6 or 8,
/// full_nvlink true (upstream has no other path). Zeroes this rank's signal block and waits for
/// it; every rank must then pass a group barrier before the first ulysses_a2a. Returns an opaque
/// nonzero handle for ulysses_a2a and dispose_ulysses_a2a. The handle owns nothing.
int64_t init_ulysses_a2a(const std::vector<int64_t>& out_ipc_ptrs,
                         const std::vector<int64_t>& signal_ipc_ptrs, int64_t rank,
                         int64_t world_size, bool full_nvlink);

/// flashinfer.comm.ulysses.dispose_ulysses_a2a: forgets the handle (0 is a no-op, as upstream's
/// delete of null); frees no buffer. A handle that is not live (disposed, never returned) is an
/// Error here where upstream's is undefined behaviour.
void dispose_ulysses_a2a(int64_t fa);

/// flashinfer.comm.ulysses.ulysses_a2a. Collective over the handle's ranks, each with the same
/// geometry in the same order. mode 0 (scatter): inp [B, S_local, H, D] -> out [B, S_local * W,
/// H / W, D]; mode 1 (gather): inp [B, S_local * W, H / W, D] -> out [B, S_local, H, D]; H is
/// the global head count. inp and out: contiguous, one dtype (float16, bfloat16, float32), in
/// the kind of memory the handle's buffers are (the CPU, or CUDA). out is written: this rank's
/// rows pass through every rank's staging buffer, then its own is copied into out. One call a
/// handle in flight, as upstream's.
void ulysses_a2a(int64_t fa, const Tensor& inp, const Tensor& out, int64_t B, int64_t S_local,
                 int64_t H, int64_t D, int64_t mode);

}  // namespace flashinfer
