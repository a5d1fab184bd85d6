// Op-specific comparison of a replayed call's outputs with the recorded ones, for outputs that a
// plain key-by-key comparison would misjudge: e.g. the trtllm MoE ops' do_finalize=False rows,
// whose order (and padding) the GPU's routing kernel chooses. Registered by the ops (once,
// before any call), consulted by replay.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/replay.h"
#include "flashinfer/tensor.h"
#include "flashinfer/tensor_io.h"
#include "flashinfer/value.h"

namespace flashinfer::detail {

/// Replay's element-wise comparison (shape, dtype, tolerance of the replay's options).
using CompareFn = std::function<replay::TensorComparison(
    const std::string& key, const Tensor& actual, const Tensor& expected)>;

/// What a comparator did: its comparisons, the recorded keys (or parts) it did not compare, and
/// why (appended to the replay's note).
struct ResultCheck {
  std::vector<replay::TensorComparison> comparisons;
  std::vector<std::string> skipped;
  std::string note;
  /// Optional: a second look at an argument the call wrote (named by its parameter) whose
  /// default comparison failed without a problem (shape, dtype), as the comparator judges its
  /// results (chunk_gated_delta_rule's state pools and checkpoints). May set c.match.
  std::function<void(std::string_view param, const Tensor& actual, const Tensor& expected,
                     replay::TensorComparison& c)>
      recheck_mutated;
};

/// Compares the replayed outputs `actual` (keyed as the recorder keys them: result,
/// result__<i>, ...) with the recorded `expected`. Returns false to leave the call to the
/// default comparison (e.g. a form of the op whose outputs need nothing special).
using ResultComparator =
    std::function<bool(const std::map<std::string, Tensor>& actual, const NamedTensors& expected,
                       const CompareFn& compare, ResultCheck& out)>;

/// As ResultComparator, also given the replayed call's arguments (bound to the declaration's
/// parameters, as they are after the call): for an op whose outputs' tolerance follows from its
/// inputs (mm_gguf: the CPU's and the GPU's sums of one dot product differ within a bound of
/// the products' magnitudes). The one form the registry keeps.
using ResultComparatorWithArgs =
    std::function<bool(const std::vector<Value>& args, const std::map<std::string, Tensor>& actual,
                       const NamedTensors& expected, const CompareFn& compare, ResultCheck& out)>;

void register_result_comparator(const std::string& op, ResultComparator fn);
void register_result_comparator_with_args(const std::string& op, ResultComparatorWithArgs fn);
/// The comparator registered for `op` (either form), or null.
const ResultComparatorWithArgs* result_comparator(std::string_view op);

/// The trtllm MoE ops' comparator (do_finalize=False, or a LoRA delta): rows of the permuted
/// outputs (result__0, and result__3 when present; with a delta and do_finalize=True the list is
/// [output, expanded_idx_to_permuted_idx, activation] and result__2 is the permuted one) are
/// compared through each side's own expanded_idx_to_permuted_idx (result__2, or result__1);
/// that map itself is compared as the set of pairs with a local expert; recorded rows no pair
/// refers to (padding) are skipped and counted.
bool compare_trtllm_moe_unfinalized(const std::map<std::string, Tensor>& actual,
                                    const NamedTensors& expected, const CompareFn& compare,
                                    ResultCheck& out);

/// trtllm_gen_routing's comparator (docs/MOE.md, "trtllm_gen_routing"): the GPU orders the
/// pairs of one expert by shared-memory atomics, so expanded_idx_to_permuted_idx (result_3) is
/// compared up to that order (each local expert's set of slots, assigned to its pairs in pair
/// order on both sides) and permuted_idx_to_token_idx (result_4) through each side's own
/// result_3; the CTA lists (result_5, result_6) over the first num_non_exiting_ctas (result_7)
/// entries; result_0..2 and result_7 as they are. Slots and CTAs past those are undefined
/// upstream (torch.empty): skipped and counted.
bool compare_trtllm_gen_routing(const std::map<std::string, Tensor>& actual,
                                const NamedTensors& expected, const CompareFn& compare,
                                ResultCheck& out);

}  // namespace flashinfer::detail
