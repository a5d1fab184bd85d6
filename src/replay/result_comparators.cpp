#include "replay/result_comparators.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace flashinfer::detail {
namespace {

struct Comparators {
  std::mutex mu;
  std::map<std::string, ResultComparatorWithArgs, std::less<>> by_op;
};

Comparators& comparators() {
  static Comparators c;
  return c;
}

const Tensor* find(const NamedTensors& t, const std::string& key) {
  for (const auto& [k, v] : t) {
    if (k == key) return &v;
  }
  return nullptr;
}

// Rows of `permuted` ([rows, cols]) in expanded order: row i of the result is
// permuted[idx[i]] for every i with idx[i] >= 0 (the others dropped). `used` marks the rows read.
// An index outside [0, rows) leaves `bad` set.
Tensor gather_rows(const Tensor& permuted, const std::vector<int64_t>& idx, std::vector<char>* used,
                   bool* bad) {
  const Tensor p = permuted.to(Device::cpu()).contiguous();
  const int64_t rows = p.dim() >= 1 ? p.size(0) : 0;
  const int64_t cols = rows > 0 ? p.numel() / rows : 0;
  int64_t n = 0;
  for (int64_t v : idx) n += v >= 0;
  Shape shape = p.shape();
  if (shape.empty()) shape = {0};
  shape[0] = n;
  Tensor out = Tensor::empty(shape, p.dtype());
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * p.element_size();
  const auto* src = static_cast<const uint8_t*>(p.data_ptr());
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  if (used) used->assign(static_cast<std::size_t>(rows), 0);
  int64_t r = 0;
  for (int64_t v : idx) {
    if (v < 0) continue;
    if (v >= rows) {
      *bad = true;
      std::memset(dst + static_cast<std::size_t>(r++) * row_bytes, 0, row_bytes);
      continue;
    }
    if (used) (*used)[static_cast<std::size_t>(v)] = 1;
    std::memcpy(dst + static_cast<std::size_t>(r++) * row_bytes,
                src + static_cast<std::size_t>(v) * row_bytes, row_bytes);
  }
  return out;
}

std::vector<int64_t> as_indices(const Tensor& t) {
  std::vector<int64_t> v;
  for (double d : t.to(Device::cpu()).to_double_vector()) v.push_back(static_cast<int64_t>(d));
  return v;
}

}  // namespace

void register_result_comparator_with_args(const std::string& op, ResultComparatorWithArgs fn) {
  Comparators& c = comparators();
  std::lock_guard<std::mutex> lock(c.mu);
  c.by_op[op] = std::move(fn);
}

void register_result_comparator(const std::string& op, ResultComparator fn) {
  register_result_comparator_with_args(
      op, [fn = std::move(fn)](const std::vector<Value>&, const std::map<std::string, Tensor>& a,
                               const NamedTensors& e, const CompareFn& cmp,
                               ResultCheck& out) { return fn(a, e, cmp, out); });
}

// Entries are registered with the ops and never removed, so the pointers stay valid.
const ResultComparatorWithArgs* result_comparator(std::string_view op) {
  Comparators& c = comparators();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.by_op.find(op);
  return it == c.by_op.end() ? nullptr : &it->second;
}

bool compare_trtllm_moe_unfinalized(const std::map<std::string, Tensor>& actual,
                                    const NamedTensors& expected, const CompareFn& compare,
                                    ResultCheck& out) {
  // do_finalize=False records a list [gemm2_output, expert_weights,
  // expanded_idx_to_permuted_idx (, gemm1 activation output)]; a finalized call with a LoRA
  // delta [output, expanded_idx_to_permuted_idx, gemm1 activation output] (its result__1 int32,
  // where the other form's holds the routing weights); a finalized call is one tensor.
  const Tensor* rec_r1 = find(expected, "result__1");
  const bool lora_finalized = rec_r1 && rec_r1->dtype() == DType::kInt32;
  const char* idx_key = lora_finalized ? "result__1" : "result__2";
  const Tensor* rec_idx_t = find(expected, idx_key);
  auto act_idx_it = actual.find(idx_key);
  if (!rec_idx_t || find(expected, "result") || act_idx_it == actual.end()) return false;
  const std::vector<int64_t> rec_idx = as_indices(*rec_idx_t);
  const std::vector<int64_t> act_idx = as_indices(act_idx_it->second);

  // result__2: which (token, k) pairs have a local expert must agree; the rows they occupy are
  // the routing kernel's choice (tile padding, the order of its shared-memory atomics).
  replay::TensorComparison ci;
  ci.key = idx_key;
  ci.numel = static_cast<int64_t>(rec_idx.size());
  if (rec_idx.size() != act_idx.size()) {
    ci.problem = "shape " + shape_to_string(act_idx_it->second.shape()) + " vs recorded " +
                 shape_to_string(rec_idx_t->shape());
    out.comparisons.push_back(ci);
    return true;
  }
  for (std::size_t i = 0; i < rec_idx.size(); ++i) {
    if ((rec_idx[i] >= 0) != (act_idx[i] >= 0)) {
      if (ci.first_mismatch < 0) ci.first_mismatch = static_cast<int64_t>(i);
      ++ci.mismatches;
    }
  }
  ci.match = ci.mismatches == 0;
  if (!ci.match) ci.problem = "the pairs with a local expert differ";
  out.comparisons.push_back(ci);

  // expert_weights (the finalized output with a LoRA delta): in (token, k) order on both sides,
  // compared as is.
  const char* as_is = lora_finalized ? "result__0" : "result__1";
  if (const Tensor* rec_w = find(expected, as_is)) {
    if (auto it = actual.find(as_is); it != actual.end()) {
      out.comparisons.push_back(compare(as_is, it->second, *rec_w));
    }
  }

  // The permuted outputs: each side's rows gathered into (token, k) order through its own map.
  std::string padding;
  const std::vector<const char*> permuted =
      lora_finalized ? std::vector<const char*>{"result__2"}
                     : std::vector<const char*>{"result__0", "result__3"};
  for (const char* key : permuted) {
    const Tensor* rec = find(expected, key);
    if (!rec) continue;
    auto it = actual.find(key);
    if (it == actual.end()) {
      replay::TensorComparison c;
      c.key = key;
      c.problem = std::string("the replayed call returned no tensor '") + key + "'";
      out.comparisons.push_back(c);
      continue;
    }
    std::vector<char> used;
    bool bad_rec = false, bad_act = false;
    const Tensor e = gather_rows(*rec, rec_idx, &used, &bad_rec);
    const Tensor a = gather_rows(it->second, act_idx, nullptr, &bad_act);
    replay::TensorComparison c = compare(std::string(key) + " (rows via " + idx_key + ")", a, e);
    if (bad_rec || bad_act) {
      c.match = false;
      c.problem = std::string(bad_rec ? "recorded" : "replayed") + " " + idx_key +
                  " points past the rows of " + key;
    }
    out.comparisons.push_back(c);
    int64_t unused = 0;
    for (char u : used) unused += !u;
    if (unused > 0) {
      out.skipped.push_back(std::string(key) + " padding rows");
      padding += (padding.empty() ? "" : ", ") + std::to_string(unused) + " of " +
                 std::to_string(used.size()) + " rows of " + key;
    }
  }
  out.note = lora_finalized
                 ? "result__2 compared row by row through each side's result__1 (the row order "
                   "is the routing kernel's choice); result__1 compared as the set of local "
                   "pairs"
                 : "result__0/result__3 compared row by row through each side's result__2 (the "
                   "row order is the routing kernel's choice); result__2 compared as the set of "
                   "local pairs";
  if (!padding.empty()) {
    out.note += "; not compared: " + padding + " (padding: no pair refers to them)";
  }
  return true;
}

namespace {

Tensor int32_tensor(const std::vector<int64_t>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kInt32);
  for (std::size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(v[i]);
  return t;
}

// e2p with each local expert's slots reassigned in pair order: pair i gets the r-th smallest
// slot of its expert when it is the r-th pair of that expert (-1 stays -1). Two permutations
// that differ only in the order of an expert's pairs give the same result.
std::vector<int64_t> canonical_slots(const std::vector<int64_t>& e2p,
                                     const std::vector<int64_t>& ids) {
  std::map<int64_t, std::vector<int64_t>> slots;
  for (std::size_t i = 0; i < e2p.size(); ++i) {
    if (e2p[i] >= 0) slots[ids[i]].push_back(e2p[i]);
  }
  for (auto& [e, v] : slots) std::sort(v.begin(), v.end());
  std::map<int64_t, std::size_t> next;
  std::vector<int64_t> out(e2p.size(), -1);
  for (std::size_t i = 0; i < e2p.size(); ++i) {
    if (e2p[i] >= 0) out[i] = slots[ids[i]][next[ids[i]]++];
  }
  return out;
}

}  // namespace

bool compare_trtllm_gen_routing(const std::map<std::string, Tensor>& actual,
                                const NamedTensors& expected, const CompareFn& compare,
                                ResultCheck& out) {
  // TrtllmGenRoutingResult is a tuple: its items are recorded as result_0 .. result_7.
  const char* keys[8] = {"result_0", "result_1", "result_2", "result_3",
                         "result_4", "result_5", "result_6", "result_7"};
  const Tensor* rec[8];
  const Tensor* act[8];
  for (int i = 0; i < 8; ++i) {
    rec[i] = find(expected, keys[i]);
    auto it = actual.find(keys[i]);
    act[i] = it == actual.end() ? nullptr : &it->second;
    if (!rec[i] || !act[i]) return false;  // not this op's full result: the default comparison
  }
  // As they are: topk_ids, topk_weights, total_num_padded_tokens, num_non_exiting_ctas (none
  // depends on the order within an expert).
  for (int i : {0, 1, 2, 7}) out.comparisons.push_back(compare(keys[i], *act[i], *rec[i]));
  const std::vector<int64_t> rec_ids = as_indices(*rec[0]), act_ids = as_indices(*act[0]);
  const std::vector<int64_t> rec_e2p = as_indices(*rec[3]), act_e2p = as_indices(*act[3]);
  if (rec_e2p.size() != act_e2p.size() || rec_ids.size() != rec_e2p.size() ||
      act_ids.size() != act_e2p.size()) {
    replay::TensorComparison c;
    c.key = keys[3];
    c.problem = "shape " + shape_to_string(act[3]->shape()) + " vs recorded " +
                shape_to_string(rec[3]->shape()) + " (or topk_ids of another size)";
    out.comparisons.push_back(c);
    return true;
  }
  // result_3: each expert's slots as a set, assigned to its pairs in pair order.
  out.comparisons.push_back(
      compare("result_3 (each expert's slots, in pair order)",
              int32_tensor(canonical_slots(act_e2p, act_ids), act[3]->shape()),
              int32_tensor(canonical_slots(rec_e2p, rec_ids), rec[3]->shape())));
  // result_4: the token of every local pair's slot, through each side's own result_3.
  std::vector<char> used;
  bool bad_rec = false, bad_act = false;
  const Tensor e = gather_rows(*rec[4], rec_e2p, &used, &bad_rec);
  const Tensor a = gather_rows(*act[4], act_e2p, nullptr, &bad_act);
  replay::TensorComparison c4 = compare("result_4 (via result_3)", a, e);
  if (bad_rec || bad_act) {
    c4.match = false;
    c4.problem = std::string(bad_rec ? "recorded" : "replayed") +
                 " result_3 points past permuted_idx_to_token_idx";
  }
  out.comparisons.push_back(c4);
  int64_t unused = 0;
  for (char u : used) unused += !u;
  // result_5 / result_6: the first num_non_exiting_ctas entries (the recorded count).
  const std::vector<int64_t> n_rec = as_indices(*rec[7]);
  const int64_t n = n_rec.empty() ? 0 : n_rec[0];
  int64_t cta_tail = 0;
  for (int i : {5, 6}) {
    if (n < 0 || n > rec[i]->numel() || n > act[i]->numel() || rec[i]->dim() != 1 ||
        act[i]->dim() != 1) {
      replay::TensorComparison c;
      c.key = keys[i];
      c.problem = "num_non_exiting_ctas (" + std::to_string(n) + ") exceeds its " +
                  shape_to_string(act[i]->shape()) + " / recorded " +
                  shape_to_string(rec[i]->shape());
      out.comparisons.push_back(c);
      continue;
    }
    out.comparisons.push_back(compare(std::string(keys[i]) + " (first num_non_exiting_ctas)",
                                      act[i]->to(Device::cpu()).slice(0, 0, n),
                                      rec[i]->to(Device::cpu()).slice(0, 0, n)));
    cta_tail += rec[i]->numel() - n;
  }
  out.note =
      "result_3 compared as each expert's set of slots (the order of an expert's pairs is the "
      "GPU's shared-memory atomics' choice), result_4 through each side's result_3, result_5/6 "
      "over the first num_non_exiting_ctas entries";
  if (unused > 0) {
    out.skipped.push_back("result_4 padding slots");
    out.note += "; not compared: " + std::to_string(unused) + " of " + std::to_string(used.size()) +
                " entries of result_4 (no pair refers to them)";
  }
  if (cta_tail > 0) {
    out.skipped.push_back("result_5/6 entries past num_non_exiting_ctas");
    out.note += "; " + std::to_string(cta_tail) +
                " entries of result_5/6 past num_non_exiting_ctas (undefined upstream)";
  }
  return true;
}

}  // namespace flashinfer::detail
