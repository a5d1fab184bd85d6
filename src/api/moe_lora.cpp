// Multi-LoRA over MoE (flashinfer.fused_moe.bgmv_moe, flashinfer.fused_moe.moe_lora_delta):
// declarations, argument checks, dispatch. CPU only. Semantics and sources: docs/MOE.md.
#include "flashinfer/ops/moe_lora.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/moe_lora_cpu.h"
#include "recorder/call_extensions.h"

namespace flashinfer {

namespace {

constexpr const char* kBgmvModule = "flashinfer.fused_moe.bgmv_moe";
constexpr const char* kDeltaModule = "flashinfer.fused_moe.moe_lora_delta";

// ---- weight banks behind the int64 pointer tables -------------------------------------------
// Upstream's kernels trust the device addresses in w_ptr. Here an address is read only when it
// lies, with the whole matrix it names, inside a bank fill_w_ptr registered and that is still
// alive: a recording's table (another process's addresses) fails with an error, not a crash.
struct Bank {
  std::weak_ptr<Storage> storage;
  std::uintptr_t begin = 0, end = 0;
  DType dtype = DType::kBFloat16;
};
std::mutex g_bank_mutex;
std::vector<Bank> g_banks;

void register_bank(const Tensor& w) {
  std::lock_guard<std::mutex> lock(g_bank_mutex);
  std::erase_if(g_banks, [](const Bank& b) { return b.storage.expired(); });
  const auto begin = reinterpret_cast<std::uintptr_t>(w.data_ptr());
  for (const Bank& b : g_banks) {
    if (b.begin == begin && b.end == begin + w.nbytes() && b.dtype == w.dtype()) return;
  }
  g_banks.push_back({w.storage(), begin, begin + w.nbytes(), w.dtype()});
}

// The storage holding [addr, addr + nbytes) in a live bank of `dtype`, or nullptr.
std::shared_ptr<Storage> find_bank(std::uintptr_t addr, std::size_t nbytes, DType dtype) {
  std::lock_guard<std::mutex> lock(g_bank_mutex);
  for (const Bank& b : g_banks) {
    if (b.dtype != dtype || addr < b.begin || addr + nbytes > b.end || addr + nbytes < addr) {
      continue;
    }
    if (auto s = b.storage.lock()) return s;
  }
  return nullptr;
}

// ---- pointer tables across processes (this library's dump extension) -------------------------
// A recorded w_ptr holds the recording process's addresses. When this library records, it also
// stores every live bank a table points into (fi_ext__<param>__bank<j>, the bank's elements) and
// the address of its first byte then (fi_ext__<param>__bank<j>__base, int64 [1]); replay
// registers the loaded banks and rewrites the table's entries into them. Upstream's recordings
// have no such keys: their tables stay as recorded and the op refuses them, naming the table.

struct LiveBank {
  std::shared_ptr<Storage> storage;
  std::uintptr_t begin = 0, end = 0;
  DType dtype = DType::kBFloat16;
};

std::optional<LiveBank> bank_at(std::uintptr_t addr) {
  std::lock_guard<std::mutex> lock(g_bank_mutex);
  for (const Bank& b : g_banks) {
    if (addr < b.begin || addr >= b.end) continue;
    if (auto st = b.storage.lock()) return LiveBank{std::move(st), b.begin, b.end, b.dtype};
  }
  return std::nullopt;
}

using TableParams = std::vector<std::pair<std::size_t, std::string>>;  // (index, name)

std::string bank_key(const std::string& param, std::size_t j) {
  return std::string(detail::kExtensionPrefix) + param + "__bank" + std::to_string(j);
}

void capture_tables(const TableParams& tables, std::span<const Value> args,
                    std::vector<std::pair<std::string, Tensor>>& extra) {
  for (const auto& [idx, name] : tables) {
    if (idx >= args.size() || !args[idx].is_tensor()) continue;
    const Tensor& t = args[idx].as_tensor();
    if (!t.defined() || t.dtype() != DType::kInt64 || !t.device().is_cpu() || !t.is_contiguous()) {
      continue;  // the op refuses it anyway
    }
    std::vector<LiveBank> found;
    const auto* v = t.data<int64_t>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const auto addr = static_cast<std::uintptr_t>(v[i]);
      if (std::any_of(found.begin(), found.end(),
                      [&](const LiveBank& b) { return addr >= b.begin && addr < b.end; })) {
        continue;
      }
      if (auto b = bank_at(addr)) found.push_back(std::move(*b));
    }
    for (std::size_t j = 0; j < found.size(); ++j) {
      const LiveBank& b = found[j];
      const std::size_t es = dtype_size(b.dtype);
      const auto base = reinterpret_cast<std::uintptr_t>(b.storage->data());
      extra.emplace_back(
          bank_key(name, j),
          Tensor::from_storage(b.storage, {static_cast<int64_t>((b.end - b.begin) / es)}, {1},
                               static_cast<int64_t>((b.begin - base) / es), b.dtype));
      Tensor where = Tensor::empty({1}, DType::kInt64);
      where.data<int64_t>()[0] = static_cast<int64_t>(b.begin);
      extra.emplace_back(bank_key(name, j) + "__base", where);
    }
  }
}

void rebuild_tables(const TableParams& tables, const std::map<std::string, Tensor>& tensors,
                    std::vector<Value>& args) {
  for (const auto& [idx, name] : tables) {
    if (idx >= args.size() || !args[idx].is_tensor()) continue;
    struct Moved {
      std::uintptr_t old_begin, old_end, now;
    };
    std::vector<Moved> moved;
    for (std::size_t j = 0;; ++j) {
      const auto b = tensors.find(bank_key(name, j));
      const auto w = tensors.find(bank_key(name, j) + "__base");
      if (b == tensors.end() || w == tensors.end()) break;
      const Tensor& bank = b->second;
      if (!bank.device().is_cpu() || !bank.is_contiguous() || w->second.numel() != 1) break;
      register_bank(bank);  // alive while the replayed call runs (the loaded inputs hold it)
      const auto old = static_cast<std::uintptr_t>(w->second.to(DType::kInt64).data<int64_t>()[0]);
      moved.push_back(
          {old, old + bank.nbytes(), reinterpret_cast<std::uintptr_t>(bank.data_ptr())});
    }
    if (moved.empty()) continue;
    const Tensor old_table = args[idx].as_tensor();
    if (old_table.dtype() != DType::kInt64 || !old_table.device().is_cpu()) continue;
    const Tensor src = old_table.contiguous();
    Tensor table = Tensor::empty(src.shape(), DType::kInt64);
    auto* out = table.data<int64_t>();
    const auto* in = src.data<int64_t>();
    for (int64_t i = 0; i < src.numel(); ++i) {
      const auto addr = static_cast<std::uintptr_t>(in[i]);
      out[i] = in[i];
      for (const Moved& m : moved) {
        if (addr >= m.old_begin && addr < m.old_end) {
          out[i] = static_cast<int64_t>(m.now + (addr - m.old_begin));
          break;
        }
      }
    }
    args[idx] = Value(table);
  }
}

void register_table_extension(OpRegistry& r, const char* op,
                              std::initializer_list<const char*> params) {
  const OpDecl* d = r.find(op);
  if (d == nullptr) return;
  TableParams tables;
  for (const char* p : params) {
    for (std::size_t i = 0; i < d->params.size(); ++i) {
      if (d->params[i].name == p) tables.emplace_back(i, p);
    }
  }
  detail::register_call_extension(
      op,
      [tables](std::span<const Value> args, std::vector<std::pair<std::string, Tensor>>& extra) {
        capture_tables(tables, args, extra);
      },
      [tables](const std::map<std::string, Tensor>& tensors, std::vector<Value>& args) {
        rebuild_tables(tables, tensors, args);
      });
}

constexpr api::KernelEntry<kernels::BgmvMoeParams> kShrinkKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 dot per (slice, pair, rank), rounded into y", nullptr,
     [](const kernels::BgmvMoeParams& p, const api::LaunchContext&) {
       kernels::cpu::bgmv_moe_shrink(p);
     }},
};
constexpr api::KernelEntry<kernels::BgmvMoeParams> kExpandKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 dot per (slice, pair, column), pairs in order", nullptr,
     [](const kernels::BgmvMoeParams& p, const api::LaunchContext&) {
       kernels::cpu::bgmv_moe_expand(p);
     }},
};
// The composite ops run the shrink and expand kernels on the host themselves; this is what
// list-ops and is_backend_supported report for them.
constexpr api::BackendSummary kCompositeBackends[] = {
    {DeviceType::kCPU, "CPU reference: shrink into the LoRA dtype, fp32 expand"},
};

std::vector<int64_t> index_vector(const Tensor& t, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  api::check_dtype_in(t, {DType::kInt32, DType::kInt64}, op, arg);
  FLASHINFER_CHECK_CODE(t.device().is_cpu(), ErrorCode::kUnsupported, op, arg,
                        "the MoE LoRA ops run on the CPU only");
  const Tensor c = t.contiguous().to(DType::kInt64);
  const auto* d = c.data<int64_t>();
  return std::vector<int64_t>(d, d + c.numel());
}

void check_host(const Tensor& t, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK_CODE(t.device().is_cpu(), ErrorCode::kUnsupported, op, arg,
                        "the MoE LoRA ops run on the CPU only");
  FLASHINFER_CHECK(t.is_contiguous(), op, arg, "must be contiguous");
}

// token / expert / lora per pair: a pair is skipped (lora -1) when its token is outside
// lora_indices or has no adapter; experts of the other pairs must lie in [0, num_experts).
void fill_pairs(kernels::BgmvMoeParams& p, const Tensor& sorted_token_ids, const Tensor& expert_ids,
                const Tensor& lora_indices, int64_t num_experts, const char* op) {
  FLASHINFER_CHECK(sorted_token_ids.dim() == 1, op, "sorted_token_ids", "must be 1D, got ",
                   shape_to_string(sorted_token_ids.shape()));
  p.token = index_vector(sorted_token_ids, op, "sorted_token_ids");
  p.expert = index_vector(expert_ids, op, "expert_ids");
  const std::vector<int64_t> per_token = index_vector(lora_indices, op, "lora_indices");
  p.num_pairs = static_cast<int64_t>(p.token.size());
  FLASHINFER_CHECK(expert_ids.shape() == sorted_token_ids.shape(), op, "expert_ids",
                   "must have the shape of sorted_token_ids ",
                   shape_to_string(sorted_token_ids.shape()), ", got ",
                   shape_to_string(expert_ids.shape()));
  FLASHINFER_CHECK(lora_indices.dim() == 1, op, "lora_indices", "must be 1D [num_tokens], got ",
                   shape_to_string(lora_indices.shape()));
  const auto T = static_cast<int64_t>(per_token.size());
  p.lora.resize(p.token.size());
  for (std::size_t q = 0; q < p.token.size(); ++q) {
    // Upstream's kernels skip a pair whose token lies outside [0, lora_indices.size(0)) (the
    // padding entries of an aligned table): its output is left untouched (moe_bgmv_impl.cuh).
    if (p.token[q] < 0 || p.token[q] >= T) {
      p.lora[q] = -1;
      continue;
    }
    p.lora[q] = per_token[static_cast<std::size_t>(p.token[q])] < 0
                    ? -1
                    : per_token[static_cast<std::size_t>(p.token[q])];
    if (p.lora[q] >= 0) {
      FLASHINFER_CHECK(p.expert[q] >= 0 && p.expert[q] < num_experts, op, "expert_ids", "entry ", q,
                       " = ", p.expert[q], " is not in [0, num_experts=", num_experts, ")");
    }
  }
}

// Resolves w_ptr [S, E] entries for every pair that is not skipped; `keep` holds the banks.
void resolve_pointers(kernels::BgmvMoeParams& p, const Tensor& w_ptr, int64_t lora_stride,
                      int64_t rows, int64_t cols, const char* op, const char* arg,
                      std::vector<std::shared_ptr<Storage>>& keep) {
  const int64_t S = p.num_slices, P = p.num_pairs;
  const std::string_view w(arg);
  const char* stride_arg = w == "w_ptr_a"   ? "lora_stride_a"
                           : w == "w_ptr_b" ? "lora_stride_b"
                                            : "lora_stride";
  FLASHINFER_CHECK(lora_stride >= 0, op, stride_arg, "must be >= 0, got ", lora_stride);
  const auto* table = w_ptr.data<int64_t>();
  const int64_t E = w_ptr.size(1);
  const std::size_t es = dtype_size(p.dtype);
  const std::size_t nbytes = static_cast<std::size_t>(rows * cols) * es;
  p.weight.assign(static_cast<std::size_t>(S * P), nullptr);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t q = 0; q < P; ++q) {
      const int64_t l = p.lora[static_cast<std::size_t>(q)];
      if (l < 0) continue;
      const int64_t e = p.expert[static_cast<std::size_t>(q)];
      const auto addr = static_cast<std::uintptr_t>(table[s * E + e]) +
                        static_cast<std::uintptr_t>(l * lora_stride) * es;
      auto bank = find_bank(addr, nbytes, p.dtype);
      FLASHINFER_CHECK(bank != nullptr, op, arg, "entry [", s, ", ", e, "] + lora ", l,
                       " * lora_stride does not address a live ", rows, "x", cols, " ",
                       dtype_torch_name(p.dtype),
                       " matrix of a weight bank registered with fill_w_ptr in this process "
                       "(a recorded pointer table names the recording process's memory)");
      keep.push_back(std::move(bank));
      p.weight[static_cast<std::size_t>(s * P + q)] = reinterpret_cast<const void*>(addr);
    }
  }
}

void check_w_ptr(const Tensor& w_ptr, int64_t slices, const char* op, const char* arg) {
  check_host(w_ptr, op, arg);
  FLASHINFER_CHECK(w_ptr.dtype() == DType::kInt64, op, arg, "must be int64, got ",
                   dtype_torch_name(w_ptr.dtype()));
  FLASHINFER_CHECK(w_ptr.dim() == 2 && w_ptr.size(0) == slices, op, arg,
                   "must be [num_slices=", slices, ", num_experts], got ",
                   shape_to_string(w_ptr.shape()));
}

void shrink_impl(const Tensor& y, const Tensor& x, const Tensor& w_ptr, const Tensor& token_ids,
                 const Tensor& expert_ids, const Tensor& lora_indices, int64_t lora_stride,
                 bool per_pair_input, const char* op, const char* w_arg = "w_ptr") {
  check_host(y, op, "y");
  check_host(x, op, "x");
  api::check_dtype_in(x, {DType::kFloat16, DType::kBFloat16}, op, "x");
  api::check_same_dtype(y, x, op, "y", "x");
  FLASHINFER_CHECK(y.dim() == 3, op, "y", "must be [num_slices, num_pairs, rank], got ",
                   shape_to_string(y.shape()));
  FLASHINFER_CHECK(x.dim() == 2, op, "x", "must be 2D, got ", shape_to_string(x.shape()));
  check_w_ptr(w_ptr, y.size(0), op, w_arg);
  kernels::BgmvMoeParams p;
  p.num_slices = y.size(0);
  fill_pairs(p, token_ids, expert_ids, lora_indices, w_ptr.size(1), op);
  FLASHINFER_CHECK(y.size(1) == p.num_pairs, op, "y", "dim 1 must be num_pairs=", p.num_pairs,
                   ", got ", y.size(1));
  const int64_t rows = per_pair_input ? p.num_pairs : lora_indices.size(0);
  FLASHINFER_CHECK(x.size(0) == rows, op, "x", "must have ", rows,
                   per_pair_input ? " rows (num_pairs, per_pair_input)" : " rows (num_tokens)",
                   ", got ", x.size(0));
  p.dtype = x.dtype();
  p.x = x.data_ptr();
  p.y = y.data_ptr();
  p.rank = y.size(2);
  p.feat = x.size(1);
  p.per_pair_input = per_pair_input;
  std::vector<std::shared_ptr<Storage>> keep;
  resolve_pointers(p, w_ptr, lora_stride, p.rank, p.feat, op, w_arg, keep);
  api::launch(kShrinkKernels, p, x.device(), op, "x");
}

void expand_impl(const Tensor& y, const Tensor& x, const Tensor& w_ptr, const Tensor& token_ids,
                 const Tensor& expert_ids, const Tensor& topk_weights, const Tensor& lora_indices,
                 const Tensor& slice_start_loc, const std::vector<int64_t>& output_slices,
                 int64_t lora_stride, bool finalize, const char* op, const char* w_arg = "w_ptr") {
  check_host(y, op, "y");
  check_host(x, op, "x");
  FLASHINFER_CHECK(y.dtype() == DType::kFloat32, op, "y", "must be float32, got ",
                   dtype_torch_name(y.dtype()));
  api::check_dtype_in(x, {DType::kFloat16, DType::kBFloat16}, op, "x");
  FLASHINFER_CHECK(x.dim() == 3, op, "x", "must be [num_slices, num_pairs, rank], got ",
                   shape_to_string(x.shape()));
  FLASHINFER_CHECK(y.dim() == 2, op, "y", "must be 2D, got ", shape_to_string(y.shape()));
  check_w_ptr(w_ptr, x.size(0), op, w_arg);
  kernels::BgmvMoeParams p;
  p.num_slices = x.size(0);
  fill_pairs(p, token_ids, expert_ids, lora_indices, w_ptr.size(1), op);
  FLASHINFER_CHECK(x.size(1) == p.num_pairs, op, "x", "dim 1 must be num_pairs=", p.num_pairs,
                   ", got ", x.size(1));
  check_host(topk_weights, op, "topk_weights");
  FLASHINFER_CHECK(topk_weights.dtype() == DType::kFloat32 && topk_weights.numel() == p.num_pairs,
                   op, "topk_weights", "must be float32 [num_pairs=", p.num_pairs, "], got ",
                   dtype_torch_name(topk_weights.dtype()), " ",
                   shape_to_string(topk_weights.shape()));
  FLASHINFER_CHECK(!output_slices.empty(), op, "output_slices", "must not be empty");
  for (int64_t f : output_slices) {
    FLASHINFER_CHECK_CODE(f == output_slices[0], ErrorCode::kUnsupported, op, "output_slices",
                          "slices of different widths are not supported (upstream's kernel "
                          "reads output_slices[0] for every slice)");
  }
  p.slice_start = index_vector(slice_start_loc, op, "slice_start_loc");
  FLASHINFER_CHECK(static_cast<int64_t>(p.slice_start.size()) == p.num_slices, op,
                   "slice_start_loc", "must hold num_slices=", p.num_slices, " entries, got ",
                   p.slice_start.size());
  p.feat = output_slices[0];
  FLASHINFER_CHECK(p.feat >= 1, op, "output_slices", "must be positive, got ", p.feat);
  for (int64_t st : p.slice_start) {
    FLASHINFER_CHECK(st >= 0 && st + p.feat <= y.size(1), op, "slice_start_loc", "slice [", st,
                     ", ", st + p.feat, ") does not fit y's ", y.size(1), " columns");
  }
  const int64_t rows = finalize ? lora_indices.size(0) : p.num_pairs;
  FLASHINFER_CHECK(y.size(0) == rows, op, "y", "must have ", rows,
                   finalize ? " rows (num_tokens, finalize)" : " rows (num_pairs)", ", got ",
                   y.size(0));
  p.dtype = x.dtype();
  p.x = x.data_ptr();
  p.y = y.data_ptr();
  p.rank = x.size(2);
  p.topk_weights = topk_weights.data<float>();
  p.y_cols = y.size(1);
  p.finalize = finalize;
  std::vector<std::shared_ptr<Storage>> keep;
  resolve_pointers(p, w_ptr, lora_stride, p.feat, p.rank, op, w_arg, keep);
  api::launch(kExpandKernels, p, x.device(), op, "x");
}

// bgmv_moe's banks: a list of [max_loras, num_experts, rows, cols] tensors of x's dtype.
void check_banks(const std::vector<Tensor>& banks, const Tensor& x, int64_t num_experts,
                 const char* op, const char* arg) {
  FLASHINFER_CHECK(!banks.empty(), op, arg, "must be a non-empty list");
  for (const Tensor& w : banks) {
    check_host(w, op, arg);
    api::check_same_dtype(w, x, op, arg, "x");
    FLASHINFER_CHECK(w.dim() == 4 && w.size(1) == num_experts, op, arg,
                     "each must be [max_loras, num_experts=", num_experts, ", rows, cols], got ",
                     shape_to_string(w.shape()));
    FLASHINFER_CHECK(w.shape() == banks[0].shape(), op, arg,
                     "every slice must have one shape (upstream uses one lora_stride), got ",
                     shape_to_string(w.shape()), " and ", shape_to_string(banks[0].shape()));
  }
}

void bank_pointers(kernels::BgmvMoeParams& p, const std::vector<Tensor>& banks, const char* op,
                   const char* arg) {
  const int64_t S = p.num_slices, P = p.num_pairs;
  p.weight.assign(static_cast<std::size_t>(S * P), nullptr);
  for (int64_t s = 0; s < S; ++s) {
    const Tensor& w = banks[static_cast<std::size_t>(s)];
    for (int64_t q = 0; q < P; ++q) {
      const int64_t l = p.lora[static_cast<std::size_t>(q)];
      if (l < 0) continue;
      FLASHINFER_CHECK(l < w.size(0), op, "lora_indices", "adapter ", l, " of pair ", q,
                       " is not in ", arg, " (max_loras=", w.size(0), ")");
      const int64_t off =
          (l * w.size(1) + p.expert[static_cast<std::size_t>(q)]) * w.size(2) * w.size(3);
      p.weight[static_cast<std::size_t>(s * P + q)] =
          static_cast<const uint8_t*>(w.data_ptr()) +
          static_cast<std::size_t>(off) * w.element_size();
    }
  }
}

Tensor bgmv_moe_impl(const Tensor& x, const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                     const Tensor& token_ids, const Tensor& expert_ids, const Tensor& lora_indices,
                     const Tensor& topk_weights, int64_t num_experts,
                     std::optional<int64_t> output_dim) {
  const char* op = "bgmv_moe";
  check_host(x, op, "x");
  api::check_dtype_in(x, {DType::kFloat16, DType::kBFloat16}, op, "x");
  FLASHINFER_CHECK(x.dim() == 2, op, "x", "must be [num_tokens, hidden], got ",
                   shape_to_string(x.shape()));
  check_banks(a, x, num_experts, op, "lora_a_weights");
  check_banks(b, x, num_experts, op, "lora_b_weights");
  FLASHINFER_CHECK(b.size() == a.size(), op, "lora_b_weights", "must hold as many slices (",
                   b.size(), ") as lora_a_weights (", a.size(), ")");
  const int64_t S = static_cast<int64_t>(a.size()), R = a[0].size(2), H = x.size(1);
  const int64_t F = b[0].size(2);
  FLASHINFER_CHECK(a[0].size(3) == H, op, "lora_a_weights",
                   "must be [max_loras, E, rank, hidden=", H, "], got ",
                   shape_to_string(a[0].shape()));
  FLASHINFER_CHECK(b[0].size(3) == R && b[0].size(0) == a[0].size(0), op, "lora_b_weights",
                   "must be [max_loras=", a[0].size(0), ", E, feat_out, rank=", R, "], got ",
                   shape_to_string(b[0].shape()));
  const int64_t T = x.size(0);
  FLASHINFER_CHECK(lora_indices.numel() == T, op, "lora_indices", "must hold num_tokens=", T,
                   " entries, got ", lora_indices.numel());
  kernels::BgmvMoeParams p;
  p.num_slices = S;
  fill_pairs(p, token_ids, expert_ids, lora_indices, num_experts, op);
  check_host(topk_weights, op, "topk_weights");
  FLASHINFER_CHECK(topk_weights.dtype() == DType::kFloat32 && topk_weights.numel() == p.num_pairs,
                   op, "topk_weights", "must be float32 [num_pairs=", p.num_pairs, "], got ",
                   dtype_torch_name(topk_weights.dtype()), " ",
                   shape_to_string(topk_weights.shape()));
  const int64_t total = output_dim.value_or(S * F);
  FLASHINFER_CHECK(total >= S * F, op, "output_dim", "must be >= the slices' total width ", S * F,
                   ", got ", total);
  Tensor shrink = Tensor::zeros({S, p.num_pairs, R}, x.dtype());
  p.dtype = x.dtype();
  p.x = x.data_ptr();
  p.y = shrink.data_ptr();
  p.rank = R;
  p.feat = H;
  bank_pointers(p, a, op, "lora_a_weights");
  kernels::cpu::bgmv_moe_shrink(p);
  Tensor y = Tensor::zeros({T, total}, DType::kFloat32);
  p.x = shrink.data_ptr();
  p.y = y.data_ptr();
  p.feat = F;
  p.topk_weights = topk_weights.data<float>();
  p.slice_start.clear();
  for (int64_t s = 0; s < S; ++s) p.slice_start.push_back(s * F);
  p.y_cols = total;
  p.finalize = true;
  bank_pointers(p, b, op, "lora_b_weights");
  kernels::cpu::bgmv_moe_expand(p);
  return y.to(x.dtype());
}

void check_delta_dtypes(DType lora_dtype, DType out_dtype, const char* op) {
  FLASHINFER_CHECK(lora_dtype == DType::kBFloat16 || lora_dtype == DType::kFloat16, op,
                   "lora_dtype", "must be torch.bfloat16 or torch.float16, got ",
                   dtype_torch_name(lora_dtype));
  FLASHINFER_CHECK(
      out_dtype == DType::kBFloat16 || out_dtype == DType::kFloat16 || out_dtype == DType::kFloat32,
      op, "out_dtype", "must be a float dtype (bf16, fp16, fp32), got ",
      dtype_torch_name(out_dtype));
}

// Upstream's _expanded_pairs: pair p = token * top_k + slot.
void expanded_pairs(const Tensor& topk_ids, const Tensor& lora_ids, int64_t num_experts,
                    Tensor& token, Tensor& expert, const char* op) {
  check_host(topk_ids, op, "topk_ids");
  FLASHINFER_CHECK(topk_ids.dim() == 2, op, "topk_ids", "must be [num_tokens, top_k], got ",
                   shape_to_string(topk_ids.shape()));
  FLASHINFER_CHECK(lora_ids.dim() == 1 && lora_ids.size(0) == topk_ids.size(0), op, "lora_ids",
                   "must be [num_tokens=", topk_ids.size(0), "], got ",
                   shape_to_string(lora_ids.shape()));
  const int64_t T = topk_ids.size(0), K = topk_ids.size(1);
  const std::vector<int64_t> ids = index_vector(topk_ids, op, "topk_ids");
  const std::vector<int64_t> loras = index_vector(lora_ids, op, "lora_ids");
  for (int64_t i = 0; i < T * K; ++i) {
    if (loras[static_cast<std::size_t>(i / K)] < 0) continue;
    FLASHINFER_CHECK(
        ids[static_cast<std::size_t>(i)] >= 0 && ids[static_cast<std::size_t>(i)] < num_experts, op,
        "topk_ids", "entry ", i, " = ", ids[static_cast<std::size_t>(i)],
        " is not in [0, num_experts=", num_experts, ") (w_ptr_a.shape[1])");
  }
  token = Tensor::empty({T * K}, DType::kInt64);
  for (int64_t i = 0; i < T * K; ++i) token.data<int64_t>()[i] = i / K;
  expert = topk_ids.contiguous().reshape({T * K});
}

// The matrices a delta op's pairs read, checked against its rank and widths (rows x cols) before
// it allocates its [P, rank] and [P, width] buffers: the check shrink_impl / expand_impl make
// later, made first, so a rank or width no registered matrix has is refused naming the table,
// not tried as an allocation of that size.
void check_table_first(const Tensor& w_ptr, int64_t lora_stride, const Tensor& token,
                       const Tensor& expert, const Tensor& lora_ids, DType dtype, int64_t rows,
                       int64_t cols, const char* op, const char* arg) {
  check_w_ptr(w_ptr, w_ptr.size(0), op, arg);
  kernels::BgmvMoeParams p;
  p.num_slices = w_ptr.size(0);
  p.dtype = dtype;
  fill_pairs(p, token, expert, lora_ids, w_ptr.size(1), op);
  std::vector<std::shared_ptr<Storage>> keep;
  resolve_pointers(p, w_ptr, lora_stride, rows, cols, op, arg, keep);
}

Tensor gemm1_impl(const Tensor& hidden, const Tensor& w_ptr_a, int64_t stride_a,
                  const Tensor& w_ptr_b, int64_t stride_b, const Tensor& topk_ids,
                  const Tensor& lora_ids, int64_t rank, int64_t inter, DType lora_dtype,
                  double scale, DType out_dtype) {
  const char* op = "bgmv_moe_gemm1_lora_delta";
  check_host(hidden, op, "hidden_states");
  FLASHINFER_CHECK(hidden.dim() == 2, op, "hidden_states", "must be [T, H], got ",
                   shape_to_string(hidden.shape()));
  api::check_dtype_in(hidden, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op,
                      "hidden_states");
  check_delta_dtypes(lora_dtype, out_dtype, op);
  FLASHINFER_CHECK(
      w_ptr_a.dim() == 2 && w_ptr_a.size(0) == 2, op, "w_ptr_a",
      "FC1 LoRA is a 2-slice (gate, up) GLU projection: must be [2, num_experts], got ",
      shape_to_string(w_ptr_a.shape()));
  FLASHINFER_CHECK(
      w_ptr_b.dim() == 2 && w_ptr_b.size(0) == 2, op, "w_ptr_b",
      "FC1 LoRA is a 2-slice (gate, up) GLU projection: must be [2, num_experts], got ",
      shape_to_string(w_ptr_b.shape()));
  FLASHINFER_CHECK(rank >= 1, op, "rank", "must be positive, got ", rank);
  FLASHINFER_CHECK(inter >= 1, op, "intermediate_size", "must be positive, got ", inter);
  Tensor token, expert;
  FLASHINFER_CHECK(w_ptr_b.size(1) == w_ptr_a.size(1), op, "w_ptr_b", "must list as many experts (",
                   w_ptr_b.size(1), ") as w_ptr_a (", w_ptr_a.size(1), ")");
  expanded_pairs(topk_ids, lora_ids, w_ptr_a.size(1), token, expert, op);
  const int64_t T = hidden.size(0), K = topk_ids.size(1), P = T * K;
  FLASHINFER_CHECK(topk_ids.size(0) == T, op, "topk_ids", "must have T=", T, " rows, got ",
                   topk_ids.size(0));
  const Tensor x = hidden.to(lora_dtype).contiguous();
  check_table_first(w_ptr_a, stride_a, token, expert, lora_ids, lora_dtype, rank, hidden.size(1),
                    op, "w_ptr_a");
  check_table_first(w_ptr_b, stride_b, token, expert, lora_ids, lora_dtype, inter, rank, op,
                    "w_ptr_b");
  Tensor shrink = Tensor::zeros({2, P, rank}, lora_dtype);
  shrink_impl(shrink, x, w_ptr_a, token, expert, lora_ids, stride_a, false, op, "w_ptr_a");
  Tensor starts = Tensor::empty({2}, DType::kInt64);
  starts.data<int64_t>()[0] = 0;
  starts.data<int64_t>()[1] = inter;
  Tensor unit = Tensor::full({P}, 1.0, DType::kFloat32);
  Tensor y = Tensor::zeros({P, 2 * inter}, DType::kFloat32);
  expand_impl(y, shrink, w_ptr_b, token, expert, unit, lora_ids, starts, {inter, inter}, stride_b,
              false, op, "w_ptr_b");
  if (scale != 1.0) {
    float* d = y.data<float>();
    for (int64_t i = 0; i < y.numel(); ++i) d[i] *= static_cast<float>(scale);
  }
  return y.reshape({T, K, 2 * inter}).to(out_dtype);
}

Tensor gemm2_impl(const Tensor& act, const Tensor& perm_t, const Tensor& w_ptr_a, int64_t stride_a,
                  const Tensor& w_ptr_b, int64_t stride_b, const Tensor& topk_ids,
                  const Tensor& topk_weights, const Tensor& lora_ids, int64_t rank, int64_t hidden,
                  DType lora_dtype, double scale, DType out_dtype) {
  const char* op = "bgmv_moe_gemm2_lora_delta";
  check_host(act, op, "gemm1_activation_output");
  FLASHINFER_CHECK(act.dim() == 2, op, "gemm1_activation_output", "must be [padded_rows, I], got ",
                   shape_to_string(act.shape()));
  api::check_dtype_in(act, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op,
                      "gemm1_activation_output");
  check_delta_dtypes(lora_dtype, out_dtype, op);
  FLASHINFER_CHECK(w_ptr_a.dim() == 2 && w_ptr_a.size(0) == 1, op, "w_ptr_a",
                   "FC2 LoRA is a single down-projection slice: must be [1, num_experts], got ",
                   shape_to_string(w_ptr_a.shape()));
  FLASHINFER_CHECK(w_ptr_b.dim() == 2 && w_ptr_b.size(0) == 1, op, "w_ptr_b",
                   "FC2 LoRA is a single down-projection slice: must be [1, num_experts], got ",
                   shape_to_string(w_ptr_b.shape()));
  FLASHINFER_CHECK(rank >= 1, op, "rank", "must be positive, got ", rank);
  FLASHINFER_CHECK(hidden >= 1, op, "hidden_size", "must be positive, got ", hidden);
  Tensor token, expert;
  FLASHINFER_CHECK(w_ptr_b.size(1) == w_ptr_a.size(1), op, "w_ptr_b", "must list as many experts (",
                   w_ptr_b.size(1), ") as w_ptr_a (", w_ptr_a.size(1), ")");
  expanded_pairs(topk_ids, lora_ids, w_ptr_a.size(1), token, expert, op);
  const int64_t T = topk_ids.size(0), K = topk_ids.size(1), P = T * K, I = act.size(1);
  FLASHINFER_CHECK(perm_t.dim() == 1 && perm_t.size(0) == P, op, "expanded_idx_to_permuted_idx",
                   "must be [T * top_k = ", P, "], got ", shape_to_string(perm_t.shape()));
  const std::vector<int64_t> perm = index_vector(perm_t, op, "expanded_idx_to_permuted_idx");
  check_host(topk_weights, op, "topk_weights");
  FLASHINFER_CHECK(topk_weights.numel() == P, op, "topk_weights", "must hold T * top_k = ", P,
                   " weights, got ", shape_to_string(topk_weights.shape()));
  // The permuted activation gathered into expanded order; inactive slots (< 0) stay zero.
  const Tensor a_src = act.to(lora_dtype).contiguous();
  Tensor a_exp = Tensor::zeros({P, I}, lora_dtype);
  const std::size_t row_bytes = static_cast<std::size_t>(I) * dtype_size(lora_dtype);
  for (int64_t q = 0; q < P; ++q) {
    const int64_t r = perm[static_cast<std::size_t>(q)];
    if (r < 0) continue;
    FLASHINFER_CHECK(r < act.size(0), op, "expanded_idx_to_permuted_idx", "entry ", q, " = ", r,
                     " is not a row of gemm1_activation_output (", act.size(0), " rows)");
    std::memcpy(
        static_cast<uint8_t*>(a_exp.data_ptr()) + static_cast<std::size_t>(q) * row_bytes,
        static_cast<const uint8_t*>(a_src.data_ptr()) + static_cast<std::size_t>(r) * row_bytes,
        row_bytes);
  }
  check_table_first(w_ptr_a, stride_a, token, expert, lora_ids, lora_dtype, rank, I, op, "w_ptr_a");
  check_table_first(w_ptr_b, stride_b, token, expert, lora_ids, lora_dtype, hidden, rank, op,
                    "w_ptr_b");
  Tensor shrink = Tensor::zeros({1, P, rank}, lora_dtype);
  shrink_impl(shrink, a_exp, w_ptr_a, token, expert, lora_ids, stride_a, true, op, "w_ptr_a");
  Tensor starts = Tensor::zeros({1}, DType::kInt64);
  const Tensor w = topk_weights.contiguous().reshape({P}).to(DType::kFloat32);
  Tensor y = Tensor::zeros({T, hidden}, DType::kFloat32);
  expand_impl(y, shrink, w_ptr_b, token, expert, w, lora_ids, starts, {hidden}, stride_b, true, op,
              "w_ptr_b");
  if (scale != 1.0) {
    float* d = y.data<float>();
    for (int64_t i = 0; i < y.numel(); ++i) d[i] *= static_cast<float>(scale);
  }
  return y.to(out_dtype);
}

// ---- bench cases: 8 experts, top-2, 2 adapters, rank 16 -----------------------------------------
struct LoraBenchData {
  int64_t T, K, E = 8, L = 2, R = 16, H = 256, I = 128;
  Tensor x, topk, tok, exp, lora, wts;
  Tensor a_bank, b_bank, wa, wb;
  int64_t sa = 0, sb = 0;
};

// Bench weight banks live for the process, one per shape and seed: every case built from one
// seed then holds the same addresses in its pointer tables, so a table captured from one case
// (test_backend_ops' reference run) still names live weights when another case is run.
Tensor bench_bank(const Shape& shape, uint64_t seed) {
  static std::mutex mutex;
  static std::map<std::pair<Shape, uint64_t>, Tensor> banks;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, added] = banks.try_emplace({shape, seed});
  if (added) {
    it->second = api::bench::random_tensor(shape, DType::kBFloat16, Device::cpu(), seed, -0.1, 0.1);
  }
  return it->second;
}

LoraBenchData lora_bench_data(const BenchShape& s, int64_t slices, int64_t feat_in,
                              int64_t feat_out) {
  LoraBenchData d;
  d.T = s.m;
  d.K = 2;
  const int64_t P = d.T * d.K;
  d.x = api::bench::random_tensor({d.T, feat_in}, DType::kBFloat16, Device::cpu(), s.random_seed);
  d.topk = Tensor::empty({d.T, d.K}, DType::kInt64);
  d.tok = Tensor::empty({P}, DType::kInt64);
  d.lora = Tensor::empty({d.T}, DType::kInt64);
  for (int64_t i = 0; i < P; ++i) {
    d.topk.data<int64_t>()[i] = (i * 3 + i / d.K) % d.E;
    d.tok.data<int64_t>()[i] = i / d.K;
  }
  for (int64_t t = 0; t < d.T; ++t) d.lora.data<int64_t>()[t] = t % 3 == 2 ? -1 : t % d.L;
  d.exp = d.topk.reshape({P});
  d.wts = api::bench::random_tensor({P}, DType::kFloat32, Device::cpu(), s.random_seed + 1, 0, 1);
  d.a_bank = bench_bank({d.L, d.E, d.R, feat_in}, s.random_seed + 2);
  d.b_bank = bench_bank({d.L, d.E, feat_out, d.R}, s.random_seed + 3);
  d.wa = Tensor::zeros({slices, d.E}, DType::kInt64);
  d.wb = Tensor::zeros({slices, d.E}, DType::kInt64);
  for (int64_t sl = 0; sl < slices; ++sl) {
    d.sa = fill_w_ptr(d.wa, d.a_bank, d.E, sl);
    d.sb = fill_w_ptr(d.wb, d.b_bank, d.E, sl);
  }
  return d;
}

BenchCase bench_shrink(const BenchShape& s, Device) {
  LoraBenchData d = lora_bench_data(s, 1, 256, 256);
  const int64_t P = d.T * d.K;
  BenchCase c = api::bench::invoke_case(
      "bgmv_moe_shrink", {Value(Tensor::zeros({1, P, d.R}, DType::kBFloat16)), Value(d.x),
                          Value(d.wa), Value(d.tok), Value(d.exp), Value(d.lora), Value(d.sa)});
  c.flops = 2.0 * static_cast<double>(P * d.R * d.H);
  c.bytes = api::bench::nbytes({d.T, d.H}, DType::kBFloat16) +
            api::bench::nbytes({P, d.R, d.H}, DType::kBFloat16);
  return c;
}
BenchCase bench_expand(const BenchShape& s, Device) {
  LoraBenchData d = lora_bench_data(s, 1, 256, 256);
  const int64_t P = d.T * d.K;
  BenchCase c = api::bench::invoke_case(
      "bgmv_moe_expand",
      {Value(Tensor::zeros({d.T, d.H}, DType::kFloat32)),
       Value(api::bench::random_tensor({1, P, d.R}, DType::kBFloat16, Device::cpu(), 7)),
       Value(d.wb), Value(d.tok), Value(d.exp), Value(d.wts), Value(d.lora),
       Value(Tensor::zeros({1}, DType::kInt64)), Value::list({Value(d.H)}), Value(d.sb)});
  c.flops = 2.0 * static_cast<double>(P * d.R * d.H);
  c.bytes = api::bench::nbytes({P, d.R, d.H}, DType::kBFloat16) +
            api::bench::nbytes({d.T, d.H}, DType::kFloat32);
  return c;
}
BenchCase bench_bgmv_moe(const BenchShape& s, Device) {
  LoraBenchData d = lora_bench_data(s, 1, 256, 256);
  const int64_t P = d.T * d.K;
  BenchCase c = api::bench::invoke_case(
      "bgmv_moe", {Value(d.x), Value::list({Value(d.a_bank)}), Value::list({Value(d.b_bank)}),
                   Value(d.tok), Value(d.exp), Value(d.lora), Value(d.wts), Value(d.E)});
  c.flops = 4.0 * static_cast<double>(P * d.R * d.H);
  c.bytes = 2.0 * api::bench::nbytes({P, d.R, d.H}, DType::kBFloat16);
  return c;
}
BenchCase bench_gemm1(const BenchShape& s, Device) {
  LoraBenchData d = lora_bench_data(s, 2, 256, 128);
  const int64_t P = d.T * d.K;
  BenchCase c =
      api::bench::invoke_case("bgmv_moe_gemm1_lora_delta",
                              {Value(d.x), Value(d.wa), Value(d.sa), Value(d.wb), Value(d.sb),
                               Value(d.topk), Value(d.lora), Value(d.R), Value(d.I)},
                              {{"scale", Value(0.5)}});
  c.flops = 2.0 * 2.0 * static_cast<double>(P * d.R * (d.H + d.I));
  c.bytes = 2.0 * api::bench::nbytes({P, d.R, d.H + d.I}, DType::kBFloat16);
  return c;
}
BenchCase bench_gemm2(const BenchShape& s, Device) {
  LoraBenchData d = lora_bench_data(s, 1, 128, 256);
  const int64_t P = d.T * d.K;
  Tensor perm = Tensor::empty({P}, DType::kInt64);
  for (int64_t i = 0; i < P; ++i) perm.data<int64_t>()[i] = i % 5 == 4 ? -1 : (P - 1 - i);
  BenchCase c = api::bench::invoke_case(
      "bgmv_moe_gemm2_lora_delta",
      {Value(api::bench::random_tensor({P, d.I}, DType::kBFloat16, Device::cpu(), 9)), Value(perm),
       Value(d.wa), Value(d.sa), Value(d.wb), Value(d.sb), Value(d.topk),
       Value(d.wts.reshape({d.T, d.K})), Value(d.lora), Value(d.R), Value(d.H)},
      {{"scale", Value(0.5)}});
  c.flops = 2.0 * static_cast<double>(P * d.R * (d.H + d.I));
  c.bytes = api::bench::nbytes({P, d.R, d.H + d.I}, DType::kBFloat16);
  return c;
}

}  // namespace

int64_t fill_w_ptr(const Tensor& w_ptr, const Tensor& weights, int64_t num_experts,
                   int64_t slice_id) {
  const char* op = "fill_w_ptr";
  check_host(w_ptr, op, "w_ptr");
  check_host(weights, op, "weights");
  FLASHINFER_CHECK(w_ptr.dtype() == DType::kInt64 && w_ptr.dim() == 2, op, "w_ptr",
                   "must be int64 [num_slices, num_experts], got ", dtype_torch_name(w_ptr.dtype()),
                   " ", shape_to_string(w_ptr.shape()));
  FLASHINFER_CHECK(weights.dim() == 4, op, "weights",
                   "must be [max_loras, num_experts, rows, cols], got ",
                   shape_to_string(weights.shape()));
  api::check_dtype_in(weights, {DType::kFloat16, DType::kBFloat16}, op, "weights");
  FLASHINFER_CHECK(
      num_experts >= 1 && num_experts <= weights.size(1) && num_experts <= w_ptr.size(1), op,
      "num_experts", "must be in [1, ", std::min(weights.size(1), w_ptr.size(1)), "], got ",
      num_experts);
  FLASHINFER_CHECK(slice_id >= 0 && slice_id < w_ptr.size(0), op, "slice_id", "must be in [0, ",
                   w_ptr.size(0), "), got ", slice_id);
  register_bank(weights);
  const auto base = reinterpret_cast<std::uintptr_t>(weights.data_ptr());
  const auto expert_bytes = static_cast<std::uintptr_t>(weights.stride(1)) * weights.element_size();
  auto* table = w_ptr.data<int64_t>() + slice_id * w_ptr.size(1);
  for (int64_t e = 0; e < num_experts; ++e) {
    table[e] = static_cast<int64_t>(base + static_cast<std::uintptr_t>(e) * expert_bytes);
  }
  return weights.stride(0);
}

void bgmv_moe_shrink(const Tensor& y, const Tensor& x, const Tensor& w_ptr,
                     const Tensor& sorted_token_ids, const Tensor& expert_ids,
                     const Tensor& lora_indices, int64_t lora_stride, bool per_pair_input) {
  call_op<&bgmv_moe_shrink>(
      [&] {
        shrink_impl(y, x, w_ptr, sorted_token_ids, expert_ids, lora_indices, lora_stride,
                    per_pair_input, "bgmv_moe_shrink");
      },
      y, x, w_ptr, sorted_token_ids, expert_ids, lora_indices, lora_stride, per_pair_input);
}

void bgmv_moe_expand(const Tensor& y, const Tensor& x, const Tensor& w_ptr,
                     const Tensor& sorted_token_ids, const Tensor& expert_ids,
                     const Tensor& topk_weights, const Tensor& lora_indices,
                     const Tensor& slice_start_loc, std::vector<int64_t> output_slices,
                     int64_t lora_stride, bool finalize) {
  call_op<&bgmv_moe_expand>(
      [&] {
        expand_impl(y, x, w_ptr, sorted_token_ids, expert_ids, topk_weights, lora_indices,
                    slice_start_loc, output_slices, lora_stride, finalize, "bgmv_moe_expand");
      },
      y, x, w_ptr, sorted_token_ids, expert_ids, topk_weights, lora_indices, slice_start_loc,
      output_slices, lora_stride, finalize);
}

Tensor bgmv_moe(const Tensor& x, std::vector<Tensor> lora_a_weights,
                std::vector<Tensor> lora_b_weights, const Tensor& sorted_token_ids,
                const Tensor& expert_ids, const Tensor& lora_indices, const Tensor& topk_weights,
                int64_t num_experts, std::optional<int64_t> output_dim) {
  return call_op<&bgmv_moe>(
      [&] {
        return bgmv_moe_impl(x, lora_a_weights, lora_b_weights, sorted_token_ids, expert_ids,
                             lora_indices, topk_weights, num_experts, output_dim);
      },
      x, lora_a_weights, lora_b_weights, sorted_token_ids, expert_ids, lora_indices, topk_weights,
      num_experts, output_dim);
}

Tensor bgmv_moe_gemm1_lora_delta(const Tensor& hidden_states, const Tensor& w_ptr_a,
                                 int64_t lora_stride_a, const Tensor& w_ptr_b,
                                 int64_t lora_stride_b, const Tensor& topk_ids,
                                 const Tensor& lora_ids, int64_t rank, int64_t intermediate_size,
                                 DType lora_dtype, double scale, DType out_dtype) {
  return call_op<&bgmv_moe_gemm1_lora_delta>(
      [&] {
        return gemm1_impl(hidden_states, w_ptr_a, lora_stride_a, w_ptr_b, lora_stride_b, topk_ids,
                          lora_ids, rank, intermediate_size, lora_dtype, scale, out_dtype);
      },
      hidden_states, w_ptr_a, lora_stride_a, w_ptr_b, lora_stride_b, topk_ids, lora_ids, rank,
      intermediate_size, lora_dtype, scale, out_dtype);
}

Tensor bgmv_moe_gemm2_lora_delta(const Tensor& gemm1_activation_output,
                                 const Tensor& expanded_idx_to_permuted_idx, const Tensor& w_ptr_a,
                                 int64_t lora_stride_a, const Tensor& w_ptr_b,
                                 int64_t lora_stride_b, const Tensor& topk_ids,
                                 const Tensor& topk_weights, const Tensor& lora_ids, int64_t rank,
                                 int64_t hidden_size, DType lora_dtype, double scale,
                                 DType out_dtype) {
  return call_op<&bgmv_moe_gemm2_lora_delta>(
      [&] {
        return gemm2_impl(gemm1_activation_output, expanded_idx_to_permuted_idx, w_ptr_a,
                          lora_stride_a, w_ptr_b, lora_stride_b, topk_ids, topk_weights, lora_ids,
                          rank, hidden_size, lora_dtype, scale, out_dtype);
      },
      gemm1_activation_output, expanded_idx_to_permuted_idx, w_ptr_a, lora_stride_a, w_ptr_b,
      lora_stride_b, topk_ids, topk_weights, lora_ids, rank, hidden_size, lora_dtype, scale,
      out_dtype);
}

namespace detail {
void register_moe_lora_ops(OpRegistry& r) {
  declare<&bgmv_moe_shrink>(
      r,
      {.name = "bgmv_moe_shrink",
       .module = kBgmvModule,
       .summary = "MoE LoRA shrink: y[slice, pair] += x[token or pair] @ A[expert, lora].T"},
      arg("y").mut(), "x", "w_ptr", "sorted_token_ids", "expert_ids", "lora_indices", "lora_stride",
      arg("per_pair_input", false).kw());
  declare<&bgmv_moe_expand>(
      r,
      {.name = "bgmv_moe_expand",
       .module = kBgmvModule,
       .summary = "MoE LoRA expand: weighted combine per token, or per-pair store"},
      arg("y").mut(), "x", "w_ptr", "sorted_token_ids", "expert_ids", "topk_weights",
      "lora_indices", "slice_start_loc", "output_slices", "lora_stride",
      arg("finalize", true).kw());
  declare<&bgmv_moe>(r,
                     {.name = "bgmv_moe",
                      .module = kBgmvModule,
                      .summary = "Multi-LoRA MoE BGMV: shrink and weighted expand in one call"},
                     "x", "lora_a_weights", "lora_b_weights", "sorted_token_ids", "expert_ids",
                     "lora_indices", "topk_weights", "num_experts", "output_dim");
  declare<&bgmv_moe_gemm1_lora_delta>(
      r,
      {.name = "bgmv_moe_gemm1_lora_delta",
       .module = kDeltaModule,
       .summary = "FC1 (gate_up) MoE LoRA delta per (token, slot), unweighted"},
      "hidden_states", "w_ptr_a", "lora_stride_a", "w_ptr_b", "lora_stride_b", "topk_ids",
      "lora_ids", "rank", "intermediate_size", arg("lora_dtype", DType::kBFloat16).kw(),
      arg("scale", 1.0).kw(), arg("out_dtype", DType::kBFloat16).kw());
  declare<&bgmv_moe_gemm2_lora_delta>(
      r,
      {.name = "bgmv_moe_gemm2_lora_delta",
       .module = kDeltaModule,
       .summary = "FC2 (down) MoE LoRA delta, routing-weighted and combined per token"},
      "gemm1_activation_output", "expanded_idx_to_permuted_idx", "w_ptr_a", "lora_stride_a",
      "w_ptr_b", "lora_stride_b", "topk_ids", "topk_weights", "lora_ids", "rank", "hidden_size",
      arg("lora_dtype", DType::kBFloat16).kw(), arg("scale", 1.0).kw(),
      arg("out_dtype", DType::kBFloat16).kw());
  api::register_backends("bgmv_moe_shrink", kShrinkKernels);
  api::register_backends("bgmv_moe_expand", kExpandKernels);
  api::register_backends("bgmv_moe", kCompositeBackends);
  api::register_backends("bgmv_moe_gemm1_lora_delta", kCompositeBackends);
  api::register_backends("bgmv_moe_gemm2_lora_delta", kCompositeBackends);
  register_bench_hook("bgmv_moe_shrink", bench_shrink);
  register_bench_hook("bgmv_moe_expand", bench_expand);
  register_bench_hook("bgmv_moe", bench_bgmv_moe);
  register_bench_hook("bgmv_moe_gemm1_lora_delta", bench_gemm1);
  register_bench_hook("bgmv_moe_gemm2_lora_delta", bench_gemm2);
  register_table_extension(r, "bgmv_moe_shrink", {"w_ptr"});
  register_table_extension(r, "bgmv_moe_expand", {"w_ptr"});
  register_table_extension(r, "bgmv_moe_gemm1_lora_delta", {"w_ptr_a", "w_ptr_b"});
  register_table_extension(r, "bgmv_moe_gemm2_lora_delta", {"w_ptr_a", "w_ptr_b"});
}
}  // namespace detail

}  // namespace flashinfer
