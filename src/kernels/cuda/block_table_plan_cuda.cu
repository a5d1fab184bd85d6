// The device-side plan of the block-table decode calls (kernels/block_table_plan.h): a block per
// request reads its length and checks the page ids its keys need, then writes that request's part
// of the plan, so no block waits on another.
#include "kernels/cuda/block_table_plan_cuda.h"
#include "kernels/cuda/cuda_utils.cuh"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kPlanThreads = 128;

// A NaN of the output's dtype, as its bits (fp32, fp16 or bf16: the outputs the call allows).
__device__ __forceinline__ void store_nan(void* o, int64_t i, DType d) {
  if (d == DType::kFloat32) {
    static_cast<uint32_t*>(o)[i] = 0x7fc00000u;
  } else {
    static_cast<uint16_t*>(o)[i] = d == DType::kBFloat16 ? uint16_t{0x7fc0} : uint16_t{0x7e00};
  }
}

__global__ void __launch_bounds__(kPlanThreads) block_table_plan_kernel(BlockTablePlan p) {
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t len = p.seq_lens[b * p.seq_lens_stride];
  bool ok = block_plan_len_ok(p, len);
  if (ok) {  // the same for the whole block
    const int32_t blocks = static_cast<int32_t>((len + p.page_size - 1) / p.page_size);
    const int32_t* row = p.block_tables + b * p.table_stride;
    bool bad = false;
    for (int32_t i = tid; i < blocks; i += kPlanThreads) bad |= !block_plan_page_ok(p, row[i]);
    ok = __syncthreads_or(bad) == 0;
  }
  if (tid == 0) {
    p.qo_indptr[b] = b * p.q_len;
    p.kv_indptr[b] = static_cast<int32_t>(b * p.table_stride);
    p.kv_lens[b] = ok ? static_cast<int32_t>(len) : 0;
    if (b == p.batch - 1) {
      p.qo_indptr[p.batch] = p.batch * p.q_len;
      p.kv_indptr[p.batch] = static_cast<int32_t>(p.batch * p.table_stride);
    }
  }
  if (p.row_req != nullptr) {  // MLA: a row each
    for (int32_t i = tid; i < p.q_len; i += kPlanThreads) p.row_req[b * p.q_len + i] = ok ? b : -1;
    if (ok && tid == 0) atomicMax(p.max_kv, static_cast<int32_t>(len));
  }
  const int32_t items = p.work != nullptr ? block_plan_tiles(p) * p.num_chunks : 0;
  for (int32_t k = tid; k < items; k += kPlanThreads) {
    p.work[static_cast<int64_t>(b) * items + k] = block_plan_item(p, b, k, len, ok);
  }
  if (p.work != nullptr && p.num_chunks > 1) {
    for (int32_t k = tid; k < p.q_len * p.num_chunks; k += kPlanThreads) {
      const int32_t i = k / p.num_chunks, c = k % p.num_chunks;
      p.merge_rows[(static_cast<int64_t>(b) * p.q_len + i) * p.num_chunks + c] =
          block_plan_merge_row(p, b, i, c, len, ok);
    }
    for (int32_t i = tid; i < p.q_len; i += kPlanThreads) {
      const int32_t m = b * p.q_len + i;
      p.merge_indptr[m] = m * p.num_chunks;
      p.merge_out_row[m] = block_plan_merge_out_row(p, b, i, len, ok);
    }
    if (b == p.batch - 1 && tid == 0) {
      p.merge_indptr[p.batch * p.q_len] = p.batch * p.q_len * p.num_chunks;
    }
    if (b == 0) {  // the idle chunks' empty state: score -inf, value 0
      const int64_t hd = static_cast<int64_t>(p.num_qo_heads) * p.head_dim_vo;
      float* v = p.tmp_v + static_cast<int64_t>(p.empty_row) * hd;
      for (int64_t x = tid; x < hd; x += kPlanThreads) v[x] = 0.0f;
      for (int32_t h = tid; h < p.num_qo_heads; h += kPlanThreads) {
        p.tmp_s[static_cast<int64_t>(p.empty_row) * p.num_qo_heads + h] = -INFINITY;
      }
    }
  }
  if (!ok) {  // a refused request: NaN rows, its pages never read
    const int64_t per_row = static_cast<int64_t>(p.num_qo_heads) * p.head_dim_vo;
    for (int64_t x = tid; x < p.q_len * per_row; x += kPlanThreads) {
      const int64_t r = static_cast<int64_t>(b) * p.q_len + x / per_row;
      const int64_t h = x % per_row / p.head_dim_vo, d = x % p.head_dim_vo;
      store_nan(p.o, r * p.o_stride_n + h * p.o_stride_h + d, p.o_dtype);
    }
    if (p.lse != nullptr) {
      for (int64_t x = tid; x < static_cast<int64_t>(p.q_len) * p.num_qo_heads; x += kPlanThreads) {
        const int64_t r = static_cast<int64_t>(b) * p.q_len + x / p.num_qo_heads;
        p.lse[r * p.lse_stride_n + x % p.num_qo_heads * p.lse_stride_h] = NAN;
      }
    }
  }
}

}  // namespace

void block_table_plan(const BlockTablePlan& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.max_kv != nullptr) {
    FLASHINFER_CUDA_CALL("block_table_plan", cudaMemsetAsync(p.max_kv, 0, sizeof(int32_t), s));
  }
  if (p.batch == 0) return;
  launch_kernel("block_table_plan", block_table_plan_kernel, dim3(static_cast<unsigned>(p.batch)),
                dim3(kPlanThreads), 0, s, /*enable_pdl=*/false, p);
}

}  // namespace flashinfer::kernels::cuda
