// Private: what the attention areas (page, decode, prefill) share: host copies and checks of
// index arrays, paged-cache views, the work-partition planner, wrapper state and the run path.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flashinfer/op_decl.h"
#include "flashinfer/ops/attention.h"
#include "flashinfer/tensor.h"
#include "kernels/attention_params.h"
#include "kernels/block_table_plan.h"
#include "kernels/page_append_params.h"
#include "kernels/page_guard.h"

namespace flashinfer {
namespace detail {

/// Everything a wrapper keeps between plan() and run().
struct WrapperState {
  // Constructor arguments.
  Tensor float_workspace;
  // Bytes of split-KV scratch plan() may use; -1: float_workspace's size.
  int64_t workspace_cap = -1;
  bool sizing_only = false;  // workspace_size(): plan on the host, copy nothing to the device
  Device device;
  bool hnd = false;
  bool use_cuda_graph = false;
  bool use_tensor_cores = false;
  // build_plan: a decode call without use_tensor_cores that runs on the tensor-core kernel all
  // the same (api::decode_tensor_cores_auto).
  bool tensor_cores_auto = false;
  std::string backend = "auto";
  // Built with upstream's AttentionSink JIT variant (jit_args): run takes (sink, sm_scale)
  // through its *args (api/attention_sink.h).
  bool sink_variant = false;

  // plan()
  bool planned = false;
  bool paged = true;
  bool decode = false;
  int32_t batch = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim_qk = 0, head_dim_vo = 0;
  int32_t page_size = 1;
  int64_t q_len_per_req = 1;
  DType q_dtype = DType::kFloat16, kv_dtype = DType::kFloat16, o_dtype = DType::kFloat16;
  bool causal = false;
  // NVFP4 caches: V block scales in the linear layout (xqa's) instead of TRT-LLM's 4-token
  // interleave (the paged wrappers' and trtllm-gen's).
  bool nvfp4_v_linear = false;
  int64_t window_left = -1;
  double logits_soft_cap = 0.0;
  double sm_scale = 1.0;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_lens;
  int64_t max_page_id = -1;  // largest page id in kv_indices (-1 when none)
  int64_t total_qo = 0, total_kv = 0;
  std::vector<uint8_t> packed_mask;  // per-request segments, each byte-aligned
  std::vector<int64_t> mask_indptr;  // bit offset of each request's segment
  // Multi-item scoring (upstream's mask mode, in place of a custom mask): prefix_len and
  // max_item_len a request, and each query row's [0, a), [lo, q] (AttentionParams::
  // multi_item_bounds and multi_item_rows); empty in any other mode.
  std::vector<int32_t> item_bounds, item_rows;
  kernels::AttentionPlan plan;
  // use_cuda_graph on CUDA: the first plan fixes the grid (work items, merged rows, partial
  // rows) and the batch; later plans are padded to it (padding items have request -1) so the
  // kernels a graph captured keep reading valid plan arrays at the same addresses.
  int64_t graph_batch = -1, graph_work_cap = 0, graph_merge_cap = 0, graph_partial_cap = 0;
  int64_t graph_rows_per_tile = 0;  // prefill under use_cuda_graph: the first plan's tile
  // Prefill under use_cuda_graph: the query rows every plan may have (upstream 0.7.4's
  // max_total_num_rows; -1: the first plan's), which sizes the captured tile and merge grid.
  int64_t max_total_num_rows = -1;
  // use_cuda_graph: the constructor's paged_kv_indices_buffer / custom_mask_buf sizes (elements,
  // bytes; 0: not given). The first plan sizes the device arrays to hold them, and a later plan
  // that needs more is refused: a captured graph holds the arrays' addresses.
  int64_t graph_indices_buffer = 0, graph_mask_buffer = 0;
  // use_cuda_graph on CUDA: the pages of the K/V cache the runs captured so far read (the
  // smallest; -1 before any capture). A graph replays against that cache without run()'s check,
  // so a re-plan whose page ids it copies is checked against it (ids read at run: the guard).
  // Mutable: run_planned, which sees the cache, takes the state as const.
  mutable int64_t graph_cache_pages = -1;
  // BatchAttention: the device plan() builds on (upstream's `device` argument): -1 the CPU, -2
  // the calling thread's current CUDA device ("cuda", as torch.device reads it), else a CUDA
  // device index.
  int home_device = -1;
  const char* indices_arg = "indices";  // the plan argument of the page ids (load_page_table)
  // Device copies (CUDA): all int32 arrays in one buffer, the mask in another.
  Tensor dev_ints, dev_mask, dev_mask_indptr, dev_item_bounds;
  // Optional per-head factors of single_prefill (fp32, on the device): [Hq], [Hkv], [Hkv].
  Tensor scale_q, scale_k, scale_v;
  // ALiBi slopes on the device (pos_encoding_mode="ALIBI" with the CUDA decode kernel).
  Tensor dev_alibi;
  // Element offsets in dev_ints: qo_indptr, kv_indptr, kv_indices, kv_lens, work,
  // merge_indptr, merge_rows, merge_out_row, and the page guard's verdicts (live_indices).
  int64_t dev_off[9] = {};
  // Page ids read when the call runs (CUDA; the paged decode and prefill wrappers; kernels/
  // page_guard.h): upstream's kernels read the caller's indices tensor then, and its plan copies
  // nothing to the host. live_indices is that tensor (under use_cuda_graph the constructor's
  // buffer, which plan copies the ids into: graph_indices), live_base the plan's first entry in
  // it (indptr[0]); kv_indices above stays empty and max_page_id -1. run() copies the ids into
  // dev_ints' page area before the attention kernels, checking them against the cache, and
  // writes NaN rows for a request with an id outside it after them. Undefined: the ids plan
  // copied (a host tensor, another output dtype, the paths that read the ids on the host).
  Tensor live_indices, graph_indices;
  int64_t live_base = 0;
  // Under use_cuda_graph: the plan's ids, copied into graph_indices once build_plan accepts the
  // plan; whether the first plan read its ids at run (later plans must agree: a captured graph
  // holds the guard kernels or not).
  Tensor graph_ids_src;
  bool graph_live_ids = false;
  // pos_encoding_mode inside attention (api/attention_pos_encoding.h): 0 none, 1 ROPE_LLAMA,
  // 2 ALIBI (slopes per qo head, on the host: the CPU backend alone runs these modes).
  int32_t pos_encoding = 0;
  double rope_scale = 1.0, rope_theta = 1e4;
  // A raw JIT module's RoPE reciprocals as its caller passed them (0: 1 / rope_scale and
  // 1 / rope_theta), so the kernel reads upstream's exact float.
  double rope_rcp_scale = 0, rope_rcp_theta = 0;
  std::vector<float> alibi_slopes;
  // A block-table decode call planned on the device (api::build_block_table_plan): the plan
  // kernel's inputs; run() points its outputs at dev_ints and launches it before the attention
  // kernels, which read the block table in place (block_plan->block_tables).
  std::optional<kernels::BlockTablePlan> block_plan;
  Tensor block_plan_table;                   // keeps the table block_plan reads alive
  std::shared_ptr<void> block_plan_scratch;  // the lease dev_ints and the partials live in
};

/// Whether the planned call runs on the tensor-core path (the prefill kernels): every prefill,
/// decode with use_tensor_cores, and decode the planner put there (tensor_cores_auto).
inline bool tensor_core_path(const WrapperState& s) {
  return !s.decode || s.use_tensor_cores || s.tensor_cores_auto;
}

}  // namespace detail

namespace api {

/// An int32 1-D index tensor (defined, rank 1, int32) of expected_len elements (< 0: any).
void check_index_tensor(const Tensor& t, const char* op, const char* arg,
                        int64_t expected_len = -1);
/// An int32 1-D index tensor copied to the host; expected_len < 0 accepts any length.
std::vector<int32_t> index_to_host(const Tensor& t, const char* op, const char* arg,
                                   int64_t expected_len = -1);
/// An index tensor as upstream's Python passes it on after `.int()`: an int64 one as an int32
/// copy on its device (Tensor::to, which saturates where torch would wrap: only values past
/// int32 differ), any other as it is (the int32 checks then name what is wrong).
Tensor int32_index(const Tensor& t);
/// indptr[0] == 0 and non-decreasing.
void check_indptr(const std::vector<int32_t>& indptr, const char* op, const char* arg);
/// "NHD" → false, "HND" → true; anything else is an error naming `arg`.
bool parse_kv_layout(std::string_view layout, const char* op, const char* arg);
/// Head counts and dims the kernels support.
void check_heads(int64_t num_qo_heads, int64_t num_kv_heads, const char* op, const char* qo_arg,
                 const char* kv_arg);
void check_head_dim(int64_t head_dim, const char* op, const char* arg);
/// Single decode / prefill's q, k, v (and their module forms'): defined, q of rank `q_dim`
/// (2 for decode, 3 for prefill), k and v of rank 3.
void check_single_qkv(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_dim,
                      const char* op);
/// Only "NONE": RoPE is applied by the rope ops before attention.
void check_pos_encoding(std::string_view mode, const char* op);
/// A page table: checks indptr/indices/last_page_len and returns per-request lengths.
/// Records `op`'s backends: those of the batch-attention kernel every attention op runs.
void register_attention_backends(std::string_view op);
/// vLLM passes seq_lens= ([batch] int32 KV lengths) with the page table: each must equal the
/// length the table gives (after load_page_table), else an error naming seq_lens.
void check_seq_lens(const detail::WrapperState& s, const std::optional<Tensor>& seq_lens,
                    const char* op);
/// live_ids: the ids may stay in `indices`, read when the call runs (WrapperState::live_indices),
/// where the call allows it (a CUDA wrapper, a device int32 tensor or under use_cuda_graph the
/// constructor's device buffer, an fp32 / fp16 / bf16 output, a 16-bit or fp8 cache); the
/// callers whose paths read the ids on the host pass false.
void load_page_table(detail::WrapperState& s, const Tensor& indptr, const Tensor& indices,
                     const Tensor& last_page_len, int64_t page_size, const char* op,
                     const char* indptr_arg, const char* indices_arg, const char* last_arg,
                     bool live_ids = false);
/// The page ids the plan holds (kv_indptr's end): kv_indices' size, or the live ones'.
int64_t page_id_count(const detail::WrapperState& s);
/// Whether a constructor's CUDA-graph index buffer can be the tensor the kernels read in place
/// (plan copies into it, run reads it): on `device`, int32, 1-D, contiguous.
bool graph_index_buffer_usable(const Tensor& t, Device device);
/// Under use_cuda_graph, plan's `src` into the first src.numel() elements of the constructor's
/// buffer `buf`, as upstream's plan copies it; nothing when `src` is the buffer (or its prefix).
void copy_into_graph_buffer(const Tensor& buf, const Tensor& src);
/// A plan's device array `dev` (on `device`) refilled with the 1-D host array `host` in its first
/// host.numel() elements, in place when it is large enough: a CUDA graph captured earlier holds
/// its address in its kernels' arguments. It must also hold `need` elements in all (room past
/// host's that each run fills: the live page ids); a new array holds at least `capacity`. Under
/// `graph` an array the first plan sized never moves: a plan that needs more is refused naming
/// `arg` (upstream: more than the constructor's buffer holds).
void refill_plan_array(Tensor& dev, const Tensor& host, Device device, bool graph, const char* op,
                       const char* arg, int64_t capacity = 0, int64_t need = 0);
/// Where each of `nnz` appended tokens goes (append_paged_kv_cache, append_paged_mla_kv_cache):
/// the page table (into `s`, checked against `num_pages`) and batch_indices / positions on the
/// host, each element inside its request's length.
struct AppendTargets {
  std::vector<int32_t> batch_indices, positions;
};
AppendTargets load_append_targets(detail::WrapperState& s, const Tensor& batch_indices,
                                  const Tensor& positions, const Tensor& kv_indices,
                                  const Tensor& kv_indptr, const Tensor& kv_last_page_len,
                                  int64_t num_pages, int64_t page_size, int64_t nnz,
                                  const char* op);
/// The index arrays of an append as its kernel reads them (kernels::AppendTable). On the CPU,
/// load_append_targets checks them on the host (a bad call is refused by name) and the table
/// points at the checked copies in `host` / `targets`. On a device only their dtypes, ranks and
/// lengths are checked, as upstream does: the table points at the tensors themselves (a dense copy
/// on the device where one is strided), no element is read on the host, nothing is synchronized,
/// and the kernel refuses a bad row itself (kernels::append_slot). The table points into this
/// object: keep it alive across the launch.
struct AppendIndexArrays {
  detail::WrapperState host;
  AppendTargets targets;
  std::vector<int32_t> last_page_len;  // CPU: request b's last page length (0: no pages)
  std::vector<Tensor> dense;           // device: the tensors the table points at
  kernels::AppendTable table;
};
void load_append_index_arrays(AppendIndexArrays& a, const Tensor& batch_indices,
                              const Tensor& positions, const Tensor& kv_indices,
                              const Tensor& kv_indptr, const Tensor& kv_last_page_len,
                              int64_t num_pages, int64_t page_size, int64_t nnz, const char* op);
/// K and V of a paged cache as given (a pair, or the halves of one [pages, 2, ...] tensor), in
/// the cache's own layout (not permuted), checked for their rank only; `page_size_one_forms` as
/// below. paged_cache_views' first step, and the NVFP4 ops' (whose caches take other checks).
std::pair<Tensor, Tensor> split_paged_cache(const PagedKVCache& cache, bool hnd, const char* op,
                                            const char* arg, bool page_size_one_forms);
/// K and V of a paged cache as [pages, page_size, H, D] views (HND caches are permuted views).
/// `page_size_one_forms`: also upstream's _unpack_paged_kv_cache forms of page size 1 without the
/// page axis (a pair of 3-D tensors, or a 4-D [tokens, 2, ...] tensor), which every wrapper that
/// unpacks its cache that way takes (the trtllm-gen entry points do not: block_cache_views).
std::pair<Tensor, Tensor> paged_cache_views(const PagedKVCache& cache, bool hnd, const char* op,
                                            const char* arg, bool page_size_one_forms = true);
/// Registers the recorder's extension of `run_op` (a paged wrapper's run: the ids it read when it
/// ran, fi_ext__kv_indices_at_run; src/api/attention_ids_at_run.cpp).
void register_paged_ids_at_run(const char* run_op);
/// Packs a bool [total] mask (or takes a packed uint8 one) into per-request byte-aligned
/// segments of qo_len_i * kv_len_i bits.
void load_custom_mask(detail::WrapperState& s, const std::optional<Tensor>& custom_mask,
                      const std::optional<Tensor>& packed_custom_mask, const char* op);
/// Multi-item scoring (the prefill plans' prefix_len_ptr, token_pos_in_items_ptr,
/// token_pos_in_items_len, max_item_len_ptr; SGLang's scoring API): upstream's mask mode, which
/// replaces causal and any custom mask, as each query row's two runs of keys and each request's
/// bounds (WrapperState::item_rows, item_bounds), which every backend runs (no qo_len x kv_len
/// bits). Nothing when prefix_len_ptr is not given.
void load_multi_item_mask(detail::WrapperState& s, const std::optional<Tensor>& prefix_len_ptr,
                          const std::optional<Tensor>& token_pos_in_items_ptr,
                          int64_t token_pos_in_items_len,
                          const std::optional<Tensor>& max_item_len_ptr, const char* op);
/// The split-KV chunk (upstream's binary search), in KV units (pages; tokens when ragged): with
/// tiles[b] query tiles and units[b] KV units for request b, the smallest chunk >= min_chunk such
/// that sum_b tiles[b] * ceil(units[b] / chunk) work items fit max_grid / num_kv_heads. 0 (no
/// split) when the unsplit work already fills max_grid or when no chunk adds work items.
int64_t plan_kv_chunk(const std::vector<int64_t>& tiles, const std::vector<int64_t>& units,
                      int64_t num_kv_heads, int64_t max_grid, int64_t min_chunk);
/// A split-KV chunk of `chunk` units (pages of `unit` tokens; unit 1: tokens) rounded up to whole
/// K/V tiles of `tile` tokens, so that only a request's last chunk ends inside one of the
/// tensor-core kernels' tiles (a tile cut by a chunk end costs a whole tile of MMAs). Unchanged
/// when chunk is 0 (no split) or a unit does not divide the tile (page sizes other than powers of
/// two: whole tiles would need chunks of lcm(unit, tile) tokens). Rounding up only lowers the
/// work-item count, so a chunk that fit the grid budget still does.
int64_t round_kv_chunk_to_tiles(int64_t chunk, int64_t unit, int64_t tile);
/// The wrappers' smallest KV chunk, in tokens, where the CUDA-core kernel runs on a GPU (decode,
/// and prefill calls that fall back to it); one K/V tile of the 16-row block for tensor-core
/// decode (64 keys, 128 at head dim 64); upstream's 128 elsewhere (docs/ATTENTION.md,
/// "Split-KV planner").
inline constexpr int64_t kCudaCoreDecodeMinChunkTokens = 32;
/// Packed rows a decode request holds (queries x GQA group) from which a call planned with
/// use_tensor_cores=False runs on the tensor-core kernel on a GPU all the same
/// (decode_tensor_cores_auto). Below it the CUDA-core kernel is not issue-bound; from it, each
/// K/V element widened to fp32 feeds >= 4 FMAs a row group and the kernel reached 30-55 % of the
/// HBM (H200, session 31) where the tensor-core path reached 83 % (H100, session 39). Upstream's
/// block-sparse wrapper draws its own line between the two kernels at the same 4 (R * group).
inline constexpr int64_t kDecodeTensorCoreMinRows = 4;
/// The conditions of decode_tensor_cores_auto that need no device: a decode call planned with
/// use_tensor_cores=False, backend "auto" or "trtllm-gen" (an explicit "fa2" keeps upstream's
/// CUDA-core kernel), no position encoding inside attention (RoPE's rounding differs between the
/// two kernels, as upstream's does), at least kDecodeTensorCoreMinRows packed rows a request, up
/// to 16 of them only where the FA2 kernel's block for them is its 16-row one (head dims up to
/// 192, a decode's variants: prefill_cta_rows), and not switched off (`env_off`:
/// FLASHINFER_DECODE_TENSOR_CORES=0).
bool decode_tensor_cores_wanted(const detail::WrapperState& s, bool env_off);
/// Whether build_plan puts decode call s on the tensor-core kernel without use_tensor_cores:
/// decode_tensor_cores_wanted on a CUDA device whose FA2 kernel takes the call's dtypes, head
/// dims, variant and scale (docs/ATTENTION.md, "Decode on tensor cores").
bool decode_tensor_cores_auto(const detail::WrapperState& s);
/// Whether a plan of s keeps the route (tensor cores or CUDA cores) of the wrapper's first plan
/// instead of deciding again: under CUDA graphs on a GPU once that first plan sized the grid
/// (its kernel and grid were captured; a later plan for the CUDA-core kernel could need more
/// work items than the captured grid holds, or its larger max_grid).
bool decode_route_held(const detail::WrapperState& s);
/// Blocks the tensor-core (FA2) prefill kernel runs at once on `device`: the planner's max_grid
/// for it (2 x SMs). 0 on a device without those kernels (CPU, or a build without CUDA).
int64_t tensor_core_max_grid(Device device);
/// The work partition of a one-shot call that has no wrapper plan
/// (trtllm_ragged_attention_deepseek, the fmha_v2 names, trtllm_fmha_v2_prefill on CUDA), laid out
/// as build_plan lays out the wrappers' (work items, partial rows, merge pass). Each request's
/// queries are cut into tiles of the planner's size (max(1, cta_tile_q / group), cta_tile_q from
/// the batch's average packed length); when those items do not fill max_grid blocks, each tile's
/// keys are cut into chunks by the wrappers' rule for ragged KV (plan_kv_chunk over tokens, at
/// least 128), rounded up to whole K/V tiles of the FA2 block that runs them (prefill_kv_tile of
/// prefill_cta_rows with `variant`). max_grid <= 0: no split. `max_grid_tall` (> 0): the budget
/// instead where the items (more than 64 packed rows) run in the Hopper kernel's tall blocks,
/// fewer an SM (prefill_sm90_tall_blocks_per_sm x SMs). `max_rows` receives the largest tile
/// (AttentionParams::max_work_rows). partial_rows_capacity = num_partial_rows.
kernels::AttentionPlan one_shot_plan(const int32_t* qo_indptr, const int32_t* kv_lens,
                                     int32_t batch, int32_t group, int32_t num_kv_heads,
                                     int32_t head_dim_qk, int32_t head_dim_vo, int variant,
                                     int64_t max_grid, int32_t& max_rows,
                                     int64_t max_grid_tall = 0);
/// The grid of a ragged call whose lengths stay on the device (trtllm_ragged_attention_deepseek on
/// CUDA), in the compact layout of kernels/block_table_plan.h, from what the host knows: bp.batch
/// requests, bp.total_rows query rows, at most bp.q_len queries and bp.max_seq_len keys each.
/// Tiles of the planner's height for the average query count (one_shot_plan's), bp.tile_cap of
/// them (every request's queries in whole tiles can take no more); each tile's keys split into
/// num_chunks chunks when those tiles, every request max_seq_len keys long, would not fill
/// max_grid blocks (max_grid_tall where the Hopper kernel's tall blocks run them): the wrappers'
/// rule over tokens, at least 128 a chunk, in whole K/V tiles. Sets bp's compact, tile_rows,
/// tile_cap, num_chunks, chunk_tokens, min_chunk_tokens and empty_row. `variant`: the prefill
/// kernels' variant bits (soft cap), as one_shot_plan's. A split whose partials (total_rows x
/// num_chunks + 1 rows of (Hq x (head_dim_vo + 1)) floats) would pass `partial_bytes_cap` bytes
/// (>= 0: the caller's workspace) is not made: the keys stay in one chunk.
struct RaggedDeviceGrid {
  int64_t items = 0;         // work items: tile_cap x num_chunks
  int64_t partial_rows = 0;  // split: total_rows x num_chunks + the empty state's row; else 0
  int32_t max_rows = 0;      // the largest tile (AttentionParams::max_work_rows)
};
RaggedDeviceGrid ragged_device_grid(kernels::BlockTablePlan& bp, int32_t group,
                                    int32_t num_kv_heads, int32_t head_dim_qk, int32_t head_dim_vo,
                                    int64_t max_grid, int64_t max_grid_tall, const char* op,
                                    int variant = 0, int64_t partial_bytes_cap = -1);
/// one_shot_plan's `max_grid_tall` for call `a` on `device`: the Hopper kernel's tall blocks an SM
/// where they would run its items of more than 64 packed rows (prefill_sm90_tall_blocks_per_sm)
/// times the SMs; 0 where they would not (another device, a build without the kernel, a CPU).
int64_t hopper_tall_max_grid(const kernels::AttentionParams& a, Device device);
/// Bytes of the fp32 partials of `plan` for num_qo_heads heads of head_dim_vo: tmp_v
/// [rows, Hq, Dvo] then tmp_s [rows, Hq].
inline int64_t plan_partial_bytes(const kernels::AttentionPlan& plan, int32_t num_qo_heads,
                                  int32_t head_dim_vo) {
  return plan.num_partial_rows * num_qo_heads * (int64_t{head_dim_vo} + 1) * 4;
}
/// The split-KV partials of `plan` in a caller's workspace (trtllm_ragged_attention_deepseek,
/// trtllm_fmha_v2_prefill): tmp_v from the first 16-byte boundary at or after `base`, tmp_s right
/// after it. Fails naming `op` and `arg` when `base` is nullptr (the workspace is not a
/// contiguous tensor on the inputs' device) or the `bytes` from `base` cannot hold them, as
/// upstream's workspace allocator refuses a workspace too small for its scratch.
std::pair<float*, float*> workspace_partials(void* base, int64_t bytes,
                                             const kernels::AttentionPlan& plan,
                                             int32_t num_qo_heads, int32_t head_dim_vo,
                                             const char* op, const char* arg);
/// Builds the work partition (split-KV when it helps fill the device) and copies everything
/// the kernels need to the wrapper's device.
void build_plan(detail::WrapperState& s, std::optional<int64_t> fixed_split_size,
                bool disable_split_kv, const char* op);
/// The inputs of a block-table decode call's device-side plan (kernels::BlockTablePlan's first
/// part) for `batch` requests of q_len queries (causal when several) over a cache of num_pages
/// pages of page_size tokens: seq_lens (int32 [seq_lens_len], or [>= batch] when negative) and
/// block_tables (int32 [>= batch, max_blocks]) as the plan kernel reads them, on their device; a
/// table whose rows are not dense is copied dense into `table` (else `table` is block_tables),
/// which must outlive the plan. Checks the dtypes, ranks and int32 ranges; no element is read.
kernels::BlockTablePlan block_table_plan_inputs(const Tensor& seq_lens, const Tensor& block_tables,
                                                int64_t batch, int64_t q_len, int64_t seq_lens_len,
                                                int64_t max_seq_len, int64_t page_size,
                                                int64_t num_pages, const char* op, Tensor& table);
/// The block table of a device-side plan, read in place (`table` is block_tables) or, where its
/// rows are not dense, copied dense into `table`, which must outlive the plan: bp's block_tables,
/// table_stride and max_blocks. Refuses row offsets past the int32 range naming block_tables.
void block_table_plan_table(kernels::BlockTablePlan& bp, const Tensor& block_tables, int64_t batch,
                            const char* op, Tensor& table);
/// The inputs of a one-shot prefill call's device plan (trtllm_ragged_attention_deepseek,
/// trtllm_fmha_v2_prefill): seq_lens (int32 [batch], any stride) and cum_seq_lens_q (int32
/// [batch + 1], contiguous) on the device, the query's `rows`, at most max_q_len queries a
/// request (clamped to rows), the rules' cu_q_exact and no causal count rule. With `cu_kv`
/// (contiguous) ragged K/V of kv_rows key rows, each request at most max_kv_len (clamped to
/// kv_rows) keys; without, the caller sets the block table (block_table_plan_table), page_size,
/// num_pages and max_seq_len.
kernels::BlockTablePlan one_shot_plan_inputs(const Tensor& seq_lens, const Tensor& cu_q,
                                             int64_t batch, int64_t rows, int64_t max_q_len,
                                             const Tensor* cu_kv, int64_t kv_rows,
                                             int64_t max_kv_len);
/// The device-side plan of a block-table decode call (kernels/block_table_plan.h) with inputs `in`
/// (block_table_plan_inputs, whose `table` it keeps), for `s` set up as a host plan would be
/// (dims, dtypes, qo_indptr of q_len queries a request) but with every request
/// block_plan_worst_len long (kv_lens, kv_indptr, no kv_indices): build_plan sizes the grid for
/// that worst case and copies nothing; the plan arrays and the split-KV partials (one more row,
/// the empty state) go to block_plan_scratch, and run() fills the arrays from the device tensors
/// before the attention kernels. Nothing is read on the host and nothing synchronizes: a CUDA
/// graph captures the call.
void build_block_table_plan(detail::WrapperState& s, const kernels::BlockTablePlan& in,
                            const Tensor& table, const char* op);
/// Device memory for a device-side plan's arrays (and partials): `bytes` of the current stream's
/// scratch on `device` (kernels/cuda/stream_scratch.h), 256-byte aligned, held while `lease`
/// lives. Not a tensor of the call: a CUDA graph captured around the call keeps reading these
/// addresses on every replay, so they must outlive the call, and a warm stream allocates
/// nothing. The first call on a stream must come before a capture (as engines warm up before
/// they capture); growing it during a capture is refused by name.
struct BlockPlanScratch {
  std::shared_ptr<void> lease;
  void* data = nullptr;
  int32_t* extra = nullptr;  // place_device_plan's `extra_ints`, where asked for
};
BlockPlanScratch block_plan_scratch(Device device, std::size_t bytes, const char* op);
/// The arrays of a one-shot call's device plan (trtllm_ragged_attention_deepseek's,
/// trtllm_fmha_v2_prefill's) in the stream's block-plan scratch: indptrs and lengths, then the
/// work items and merge arrays of `g` (`items`: the tensor-core kernels run the call) or the
/// warp-per-row kernel's row map (bp.total_rows entries). The split's partials (g.partial_rows
/// rows of num_qo_heads x (head_dim_vo + 1) floats) go there too, or, with `has_workspace`, to
/// the caller's workspace (`workspace` null where it is not usable: refused naming
/// workspace_buffer, as too small a one). Sets bp's output arrays; they stay leased while the
/// returned scratch lives, with `extra_ints` more int32 (the returned `extra`) for a prepass that
/// writes the plan kernel's inputs (cudnn_batch_prefill_with_kv_cache's).
BlockPlanScratch place_device_plan(kernels::BlockTablePlan& bp, const RaggedDeviceGrid& g,
                                   bool items, bool has_workspace, void* workspace,
                                   int64_t workspace_bytes, int32_t num_qo_heads,
                                   int32_t head_dim_vo, Device device, const char* op,
                                   int64_t extra_ints = 0);
/// Runs the plan kernel of kernels/block_table_plan.h for `p` on `device` (CUDA only: a CPU state
/// plans on the host).
void launch_block_table_plan(const kernels::BlockTablePlan& p, Device device, const char* op);
/// The run-time page ids' kernels (kernels/page_guard.h) on `device`'s current stream: the copy
/// (before the attention kernels), or with nan_rows the bad requests' NaN rows (after them).
void launch_page_guard(const kernels::PageGuardParams& p, bool nan_rows, Device device,
                       const char* op);
/// For workspace_size(): a copy of the wrapper's constructor state, planning on the host only
/// (no device copies) and not limited by the float workspace.
detail::WrapperState sizing_state(const detail::WrapperState& s);
/// The bytes of a built plan: fp32 partials, and the int32 arrays run() reads on a device.
WorkspaceSizes plan_workspace_sizes(const detail::WrapperState& s);
/// The output fields of `p`: o [rows, Hq, Dvo] (its data, dtype and row / head strides) and, when
/// defined, lse [rows, Hq] fp32.
void set_attention_outputs(kernels::AttentionParams& p, const Tensor& o, const Tensor& lse);
/// run(): checks q/out/lse against the plan, then computes. k/v are [*, tokens, H, D]-ordered
/// views: [pages, page_size, H, D] (paged) or [tokens, H, D] (ragged).
AttentionOutput run_planned(const detail::WrapperState& s, const Tensor& q, const Tensor& k,
                            const Tensor& v, const AttentionRunOptions& o, const char* op,
                            const char* k_arg, const char* v_arg);
/// Checks that a dtype is a supported q/o (fp16, bf16, fp32) or kv (+ fp8) dtype.
void check_q_dtype(DType d, const char* op, const char* arg);
void check_kv_dtype(DType d, DType q, const char* op, const char* arg);

/// Under use_cuda_graph, records the constructor's page-index and custom-mask buffers' sizes
/// (WrapperState::graph_indices_buffer / graph_mask_buffer): the first plan sizes the device
/// arrays to hold them. Call after init_wrapper.
void set_graph_buffers(detail::WrapperState& s, const std::optional<Tensor>& indices_buffer,
                       const std::optional<Tensor>& mask_buffer);

/// The common plan() settings: dtypes, scales, window, soft cap.
void plan_settings(detail::WrapperState& s, int64_t num_qo_heads, int64_t num_kv_heads,
                   int64_t head_dim_qk, int64_t head_dim_vo, DType q_dtype,
                   std::optional<DType> kv_dtype, std::optional<DType> o_dtype,
                   std::optional<double> sm_scale, int64_t window_left,
                   std::optional<double> logits_soft_cap, std::string_view pos_encoding_mode,
                   const char* op);
/// The checks every wrapper constructor makes.
/// `fa3`: the prefill wrappers, whose backend may also be "fa3" (check_prefill_backend).
void init_wrapper(detail::WrapperState& s, const Tensor& float_workspace_buffer,
                  std::string_view kv_layout, bool use_cuda_graph, std::string_view backend,
                  const std::optional<Value>& jit_args, const char* op, bool fa3 = false);

/// A prefill `backend`: "auto" (on sm_90 the Hopper kernel where a call fits it, as upstream's
/// auto picks its fa3 there), "fa2" (the FA2 kernel always) or, where `fa3`, "fa3" (the Hopper
/// kernel where the call fits it, the FA2 kernel otherwise: the same attention), refused by name
/// on a CUDA device other than sm_90. kUnsupported naming `backend` otherwise.
/// `wrapper`: the batch prefill wrappers, which also take upstream's "cutlass" (its Blackwell
/// CUTLASS FMHA): the same attention here, refused by name on a GPU other than sm100 / sm103.
void check_prefill_backend(std::string_view backend, Device device, bool fa3, const char* op,
                           bool wrapper = false);

/// A fused scale (bmm1_scale, bmm2_scale, ...) given as a number or a one-element floating
/// tensor. A tensor on `on_device` (the query's device, for the calls that plan there) stays
/// there: *dev gets it as fp32 [1] for the kernels to read (nothing is read back, so a CUDA graph
/// captures the call and each replay sees the tensor's value then), and 1 is returned. Any other
/// tensor is read on the host. Errors name `arg`: a tensor of other than one element or of a
/// non-floating dtype, a non-finite value read on the host.
double fused_scale_value(const ScalarOrTensor<double>& x, const char* op, const char* arg,
                         std::optional<Device> on_device = std::nullopt, Tensor* dev = nullptr);
/// fused_scale_value read on the host for the ops whose tensor scale must be torch.float32
/// (trtllm_ragged_attention_deepseek, xqa): a one-element tensor of another dtype names `arg`.
double fused_fp32_scale_value(const ScalarOrTensor<double>& x, const char* op, const char* arg);

}  // namespace api
}  // namespace flashinfer
