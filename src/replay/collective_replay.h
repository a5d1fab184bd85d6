// Replaying a collective (allreduce_fusion): one rank's recorded call cannot be recomputed from
// its own inputs, so replay finds the same call of every other rank in the recording, runs all
// of them as threads of one comm::ThreadGroup on the replay device, and keeps this rank's
// result. Which recorded calls form a group: each rank's calls on one workspace are a stream
// (the workspace's repr, within its process, from the call that created it); the creating call's
// recorded world_size and rank place the stream in its group; the k-th call of one stream meets
// the k-th call of the others. docs/COMM.md, "Replay".
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/comm.h"
#include "flashinfer/device.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/tensor_io.h"
#include "flashinfer/value.h"

namespace flashinfer::detail {

struct CollectiveSpec {
  std::string op;                   // the collective op (its calls take the workspace)
  std::size_t workspace_param = 1;  // the workspace among the op's bound arguments
  // Functions of `also` whose workspace sits elsewhere (a method's self, 0).
  std::map<std::string, std::size_t, std::less<>> workspace_params;
  std::size_t workspace_param_of(std::string_view fn) const {
    auto it = workspace_params.find(fn);
    return it == workspace_params.end() ? workspace_param : it->second;
  }
  std::string creator;  // the function whose result is the workspace
  // The group size and rank among the creator's arguments (nullopt: not recorded; streams then
  // take ranks in process-id order, then in the order their workspaces were made).
  std::optional<std::size_t> creator_world_param, creator_rank_param;
  // A Mapping among the creator's arguments (its repr's fields): the group is its MoE EP group
  // (moe_ep_size ranks), the rank its moe_ep_rank.
  std::optional<std::size_t> creator_mapping_param;
  std::size_t creator_comm_param = 7;  // the creator's CommBackend, replaced by the replay's
  // The op's own rank and group-size arguments, where it has them (decode_cp_a2a_alltoall):
  // streams are then keyed by (process, rank), with no creation call.
  std::optional<std::size_t> rank_param, world_param;
  /// The op's workspace argument is the group's CommBackend itself (quantized_all_reduce): a
  /// stream is a rank's calls with one backend, placed by the rank, size and group its repr
  /// says (ThreadCommBackend's), else by process id; no creation call.
  bool workspace_is_backend = false;
  /// The workspace object's repr places its stream as a backend's does (rank=, size=, group=:
  /// MixedCommHandler's); a workspace without a creation call and without those fields is
  /// placed by process id.
  bool place_by_workspace_repr = false;
  /// A workspace for one rank of the replay, on `comm`'s device, fit for that rank's recorded
  /// arguments `args` (bound to the op's parameters); `creator_args` are the rank's recorded
  /// creation's (bound, prepared as below), null when the recording has none.
  std::function<Value(const std::shared_ptr<comm::CommBackend>& comm,
                      const std::vector<Value>& args, const std::vector<Value>* creator_args)>
      make_workspace;
  /// Puts the replay group's backend into a creation's arguments (unset: the argument at
  /// creator_comm_param becomes the backend).
  std::function<void(std::vector<Value>& args, const std::shared_ptr<comm::CommBackend>& comm)>
      prepare_creator;
  /// A creation whose arguments name memory (init_ulysses_a2a's addresses): makes that memory
  /// for one rank of the replay group, puts it into `args` and returns what owns it, kept until
  /// every rank's creation returned. Set, it stands in for prepare_creator.
  std::function<Value(std::vector<Value>& args, const std::shared_ptr<comm::CommBackend>& comm)>
      creator_workspace;
  /// A call that involves no other rank (dispose_ulysses_a2a(0), a call refused before any
  /// exchange for its null handle): replayed alone, as an ordinary call. Unset: none.
  std::function<bool(std::string_view function, const std::vector<Value>& args)> runs_alone;
  /// Other functions whose calls on the same workspace join op's streams (MoeAlltoAll's combine
  /// after its dispatch): the k-th call of a rank, whichever of them, meets every rank's k-th.
  std::vector<std::string> also;
  /// Functions of `also` that are not collective themselves (a view of the workspace): a call
  /// replays after its prelude, which every rank's matching prelude call joins.
  std::vector<std::string> local;
  /// The function whose latest call before a call of `function` must run first on the fresh
  /// workspace (the state it leaves: combine needs its dispatch), or "".
  std::function<std::string(std::string_view function)> prelude;
  /// After the prelude ran on the fresh workspace (its result `got`, its recorded outputs
  /// `recorded`): adapts the call's arguments to what the prelude made here (MoeAlltoAll's
  /// combine payload, whose rows follow the recorded dispatch's row order), or unset.
  std::function<void(std::string_view function, std::vector<Value>& args, const Value& got,
                     const NamedTensors& recorded)>
      after_prelude;
  /// Adapts a call's rebuilt arguments to the replay workspace (a payload recorded as a view of
  /// the recording's workspace, a backend argument), or unset.
  std::function<void(std::string_view function, std::vector<Value>& args,
                     const std::shared_ptr<comm::CommBackend>& comm)>
      adjust_args;
};

/// Registers spec.op, spec.also and spec.creator (whose calls are collective too: replaying one
/// makes every rank's workspace of that group together).
void register_collective(CollectiveSpec spec);
/// The spec registered for `op` (the collective or its creator), or null.
const CollectiveSpec* collective_spec(std::string_view op);

/// Runs the group of recorded calls that `dump_dir` belongs to, every rank in a thread on
/// `device`, this call with `args` (so its written arguments are the ones replay compares);
/// returns this call's result and says in `note` which calls ran with it. Throws
/// flashinfer::Error naming what is missing (a rank not recorded, too few calls).
Value replay_collective(const CollectiveSpec& spec, const OpDecl& decl, const std::string& dump_dir,
                        std::vector<Value>& args, Device device, std::string* note);

}  // namespace flashinfer::detail
