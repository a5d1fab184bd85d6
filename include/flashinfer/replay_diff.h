// Comparing two recordings call by call (`flashinfer diff A B`): the GPU recording against a
// replay of it on the CPU, version A of an engine against version B. Calls are aligned by
// function, then by their order among calls of that function, and for wrapper methods by object
// (the k-th object of a class in A is the k-th of that class in B). The report names the first
// call whose inputs agree but whose outputs differ (the diverging kernel) and the first call
// whose inputs differ (how far the divergence spread), with per-tensor errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashinfer/replay.h"

namespace flashinfer::replay {

struct DiffOptions {
  std::optional<double> rtol, atol;  // default: replay's per-dtype tolerances
};

/// One tensor of a matched pair of calls (A is "actual", B is "expected" for the tolerance).
struct TensorDiff {
  std::string side;  // "input", "output" or "mutated"
  TensorComparison comparison;
  /// Largest distance in units in the last place of the tensor's dtype between finite elements
  /// (for integer and bool dtypes, the largest difference); 0 when shapes or dtypes differ.
  uint64_t max_ulp_error = 0;
  bool identical = false;  // bit for bit (NaN matching NaN)
};

/// A non-tensor argument or result whose recorded values differ (JSON text of each side; empty
/// when the side does not have it).
struct ValueDiff {
  std::string side;  // "input" or "output"
  std::string key;   // "arg_2", "kwarg_eps", "result"
  std::string a, b;
};

struct CallDiff {
  std::string function_name;
  int index_a = -1, index_b = -1;  // position in each recording's call order, -1: not there
  std::string dir_a, dir_b;
  bool inputs_equal = true;
  bool outputs_equal = true;
  bool incomplete = false;          // one side has no outputs on record (died in the call)
  std::vector<TensorDiff> tensors;  // every tensor compared, in inputs, outputs, mutated order
  std::vector<ValueDiff> values;    // only the differing ones
  std::string error;                // a call directory could not be read
  bool matched() const { return index_a >= 0 && index_b >= 0; }
  bool equal() const { return matched() && error.empty() && inputs_equal && outputs_equal; }
};

struct DiffReport {
  std::string dir_a, dir_b;
  int calls_a = 0, calls_b = 0;
  /// Matched pairs in A's order; a call of one side only stands where it fell in its own order.
  std::vector<CallDiff> calls;
  int first_diverging = -1;         // index into calls: inputs agree, outputs differ
  int first_input_difference = -1;  // index into calls: inputs differ
  int first_unmatched = -1;         // index into calls: a call only one side has
  bool equal() const;
};

/// Compares the recordings under `a` and `b`: session roots, or two single call directories.
/// Throws flashinfer::Error(kIo) when either is not a readable directory; a call directory that
/// cannot be read is reported in its CallDiff's `error`.
DiffReport diff_recordings(const std::string& a, const std::string& b,
                           const DiffOptions& options = {});

/// Distance in units in the last place between two values of `dtype` (each exactly
/// representable in it, as Tensor::to_double_vector gives them); for integers the difference.
/// NaN or infinite values give 0 (they are counted as mismatches instead).
uint64_t ulp_distance(double a, double b, DType dtype);

}  // namespace flashinfer::replay
