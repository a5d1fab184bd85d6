// Private helpers for the op areas' bench hooks (see flashinfer/bench.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "flashinfer/bench.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/replay.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"

#include <memory>

namespace flashinfer::api::bench {

/// Uniform [low, high) values from `seed`, drawn in fp32 on the host and then converted and
/// moved, so every device (and every dtype) of one seed gets the same inputs.
Tensor random_tensor(const Shape& shape, DType dtype, Device device, uint64_t seed,
                     double low = -1.0, double high = 1.0);
/// An int32 tensor holding `values` on `device`.
Tensor int32_tensor(const std::vector<int64_t>& values, Device device);
/// The fused-MoE benches' routing: int32 [tokens, 2] on `device`, token t to experts (5 t) % E
/// and a second, different one of the E experts (E >= 2), so every expert gets tokens.
Tensor moe_top2_ids(int64_t tokens, int64_t experts, Device device);
/// Bytes of a tensor of this shape and dtype.
double nbytes(const Shape& shape, DType dtype);

/// A case that calls op `name`'s invoker with these arguments (bound as Python would: keyword
/// values by parameter name, defaults filled in). outputs() gives the last result's tensors
/// ("result", or "result[i]") and the mutated tensor arguments, copied to the host.
BenchCase invoke_case(const std::string& name, std::vector<Value> positional,
                      std::vector<std::pair<std::string, Value>> keyword = {});

/// Refcheck's comparison of one backend's outputs (`actual`, in the order of `expected`, the CPU
/// reference's) output by output: replay's element-wise comparison, or for an op with a replay
/// comparator (replay/result_comparators.h; given the case's args) that comparator's judgment of
/// the results and its second look at written arguments.
std::vector<replay::TensorComparison> judge_outputs(const std::string& routine, const BenchCase& c,
                                                    const NamedTensors& actual,
                                                    const NamedTensors& expected);

/// Upstream's attention FLOPs for one request: 2*qo*kv*Hq*(Dqk+Dvo), or with causal (the
/// right-aligned trapezoid) (2*kv - qo)*qo*Hq*(Dqk+Dvo).
double attention_flops(int64_t qo_len, int64_t kv_len, int64_t num_qo_heads, int64_t head_dim_qk,
                       int64_t head_dim_vo, bool causal);

/// A paged KV cache for attention benches: batch_size requests of s_kv tokens each,
/// ceil(s_kv / page_size) consecutive pages per request; K and V [pages, page_size, Hkv, D] in
/// kv_dtype; int32 page table.
struct BenchPages {
  Tensor k, v, indptr, indices, last_page_len;
};
BenchPages bench_pages(const BenchShape& s, Device dev);
/// A wrapper object as the invoker's `self` Value.
Value bench_object(std::shared_ptr<ApiObject> obj);
/// Upstream's attention bytes: q, k, v and o once each (no page-table bytes).
double bench_attention_bytes(const BenchShape& s, int64_t q_rows, int64_t kv_rows);

}  // namespace flashinfer::api::bench
