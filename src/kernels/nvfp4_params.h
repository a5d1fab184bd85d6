// Private: what the CPU kernels of the grouped / fused NVFP4 and MXFP8 quantizers, the weight
// shuffles and the NVFP4 KV-cache quantizers receive (pointers, sizes, strides in elements).
#pragma once

#include <cstdint>

#include "flashinfer/dtype.h"
#include "kernels/page_append_params.h"
#include "kernels/quantization_params.h"  // Nvfp4FourOverSix

namespace flashinfer::kernels {

/// Grouped block quantization of L groups of [M, K] rows (batch/group-major input, strides in
/// elements). fp4: NVFP4 (blocks of 16, e4m3 scales, global scale per group or shared);
/// otherwise MXFP8 with K zero-padded to padded_k. Rows >= rows[g] are written as zero.
struct GroupedQuantizeParams {
  const void* input = nullptr;
  DType in_dtype = DType::kBFloat16;
  int64_t groups = 1, m = 0, k = 0;
  int64_t in_stride_g = 0, in_stride_m = 0;  // the K stride is 1
  bool silu_and_mul = false;                 // input rows hold [gate K | up K]
  const int32_t* rows = nullptr;             // [groups] valid rows, null: all m
  const float* global_scale = nullptr;       // fp4: [groups] or [1]
  bool per_group_scale = false;
  bool per_row_scale = false;  // nvfp4_batched_quantize: [m] scales, row r's for every group
  bool fp4 = true;
  int64_t padded_k = 0;            // mxfp8: K rounded up to 128 (fp4: k)
  uint8_t* out = nullptr;          // [groups, m, k/2] (fp4) or [groups, m, padded_k] (mxfp8)
  uint8_t* sf = nullptr;           // [groups, sf_per_group]
  int64_t sf_per_group = 0;        // bytes of one group's 128x4 scale block
  Nvfp4FourOverSix four_over_six;  // fp4: upstream 0.7.4's 4over6 recipe when on (CPU)
};

/// silu(gate) * up per row, rounded to the element type: out [m, k] contiguous.
struct SiluMulParams {
  const void* input = nullptr;
  DType dtype = DType::kBFloat16;
  int64_t m = 0, k = 0, in_stride_m = 0;
  void* out = nullptr;
};

/// out[i] = input[src_row[i]] for rows of row_bytes bytes.
struct RowGatherParams {
  const uint8_t* input = nullptr;
  int64_t rows = 0, row_bytes = 0, in_stride_bytes = 0;
  const int64_t* src_row = nullptr;
  uint8_t* out = nullptr;
};

/// NVFP4 KV-cache quantization / dequantization, linear scales, dense [m, k] rows.
struct Nvfp4KvParams {
  const void* values = nullptr;  // quantize: input [m, k]; dequantize: output [m, k]
  DType dtype = DType::kBFloat16;
  int64_t m = 0, k = 0, value_stride_m = 0;
  uint8_t* fp4 = nullptr;  // [m, k/2]
  int64_t fp4_stride_m = 0;
  uint8_t* sf = nullptr;  // [m, k/16]
  int64_t sf_stride_m = 0;
  float global_scale = 1.0f;
  // Dequantize: the scale as one fp32 on the kernel's device, read there instead of
  // global_scale (a device tensor's value, not read back to the host); null: global_scale.
  const float* global_scale_ptr = nullptr;
};

/// nvfp4_quantize_paged_kv_cache for one cache: input [pages, A, B, head_dim] (NHD: A = page_size,
/// B = heads; HND: A = heads, B = page_size), any strides (in elements). Row r of the outputs is
/// input row r in that logical order; blocks of 16 by fp4_quantize's rule (kernels/nvfp4_rules.h).
struct Nvfp4PagedQuantParams {
  const void* input = nullptr;
  DType dtype = DType::kBFloat16;
  int64_t shape[4] = {}, stride[4] = {};
  bool hnd = false;
  float global_scale = 1.0f;
  bool swizzle_sf = false;  // the V scales' 4-token interleave (nvfp4_v_scale_slot)
  uint8_t* out = nullptr;   // [rows, head_dim / 2] contiguous
  uint8_t* sf = nullptr;    // [pages, A, B, head_dim / 16] contiguous
};

/// max |x| over a 4-D fp16/bf16 tensor (any strides, in elements), NaN ignored; `result` is host
/// memory on every backend.
struct AbsMaxParams {
  const void* input = nullptr;
  DType dtype = DType::kBFloat16;
  int64_t shape[4] = {}, stride[4] = {};
  float* result = nullptr;
};

/// NVFP4 quantize-and-append into a paged cache (flashinfer.page's nvfp4 appends): token i of
/// append_key/value goes to nvfp4_append_target(p, i) of every head; a token without one is
/// skipped. Strides in elements (the caches are bytes: uint8 data, e4m3 scales; the last axis of
/// each is contiguous). The index arrays are host memory for the CPU, device memory for CUDA (read
/// there, as upstream's kernels read them: kernels/page_append_params.h).
struct Nvfp4PagedAppendParams {
  const void* key = nullptr;
  const void* value = nullptr;
  DType dtype = DType::kBFloat16;
  int64_t nnz = 0, heads = 0, head_dim = 0;
  int64_t k_stride_n = 0, k_stride_h = 0, v_stride_n = 0, v_stride_h = 0;
  // The targets: slot_mapping[i] (int64 or int32 [nnz]) where set, else append_slot(table, i).
  const void* slot_mapping = nullptr;
  bool slot_i64 = true;
  int64_t page_size = 1, slots_total = 0;  // slots: page slot / page_size, entry slot % page_size
  AppendTable table;
  uint8_t* k_cache = nullptr;
  uint8_t* v_cache = nullptr;
  uint8_t* k_sf = nullptr;
  uint8_t* v_sf = nullptr;
  int64_t kc_stride[3] = {}, vc_stride[3] = {};  // page, entry, head
  int64_t ks_stride[3] = {}, vs_stride[3] = {};
  float k_scale = 1.0f, v_scale = 1.0f;
  // The global decode scales as one-element fp32 device tensors, where the call passed those
  // (read by the kernel: no copy to the host); null: k_scale / v_scale.
  const float* k_scale_ptr = nullptr;
  const float* v_scale_ptr = nullptr;
};

/// Token i's target. Slot mapping (upstream's rule): a negative slot is padding and a slot past
/// the cache (>= slots_total) is skipped. Page table: kernels::append_slot.
FLASHINFER_HD AppendSlot nvfp4_append_target(const Nvfp4PagedAppendParams& p, int64_t i) {
  if (p.slot_mapping == nullptr) return append_slot(p.table, i);
  const int64_t slot = p.slot_i64 ? static_cast<const int64_t*>(p.slot_mapping)[i]
                                  : static_cast<const int32_t*>(p.slot_mapping)[i];
  AppendSlot s;
  if (slot < 0 || slot >= p.slots_total) return s;
  s.page = slot / p.page_size;
  s.entry = static_cast<int32_t>(slot % p.page_size);
  return s;
}

/// A global decode scale the kernels take: positive and finite (the host refuses others by name;
/// a device tensor's value is checked by the kernel, which then writes nothing).
FLASHINFER_HD bool nvfp4_append_scale_ok(float s) { return s > 0.0f && s <= 3.4028235e38f; }

/// Paged NVFP4 dequantization into dense [batch, max_seq_len, H, D] outputs: token t < seq_lens[b]
/// of request b is read from page block_table[b][t / page_size], entry t % page_size.
struct Nvfp4PagedDequantParams {
  const uint8_t* cache[2] = {};     // K, V packed e2m1
  const uint8_t* sf[2] = {};        // K, V e4m3 scales
  int64_t cache_stride[2][4] = {};  // page, entry, head, byte
  int64_t sf_stride[2][4] = {};
  int64_t head_dim[2] = {};
  float scale[2] = {1.0f, 1.0f};
  void* out[2] = {};
  int64_t out_stride[2][4] = {};  // batch, token, head, dim
  DType out_dtype = DType::kBFloat16;
  int64_t batch = 0, heads = 0, page_size = 1, table_cols = 0;
  const int64_t* block_table = nullptr;  // [batch, table_cols]
  const int64_t* seq_lens = nullptr;     // [batch]
};

}  // namespace flashinfer::kernels
