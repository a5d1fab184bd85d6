#include <algorithm>
#include <cstdint>

#include "kernels/cuda/comm_sync.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/moe_a2a_cuda.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kRouteThreads = 512;  // 16 warps: the route kernel's tile of tokens
constexpr int kWarps = kRouteThreads / 32;
constexpr int kCopyThreads = 256;

__device__ __forceinline__ int32_t* i32(char* row, int64_t off) {
  return reinterpret_cast<int32_t*>(row + off);
}
__device__ __forceinline__ uint32_t* u32(char* row, int64_t off) {
  return reinterpret_cast<uint32_t*>(row + off);
}

// Begin (one block): the call counted in flag_val; sources that take no part sent nothing; every
// active rank done summing the previous combine (its done value is this call's number) before
// any row of this dispatch moves: the regions may overlap when they grow.
__global__ void moe_a2a_dispatch_begin_kernel(MoeA2aDispatchParams p) {
  __shared__ uint32_t flag;
  const MoeA2aLayout& l = p.layout;
  char* mine = p.row(p.ep_rank);
  const int j = threadIdx.x;
  if (j == 0) {
    flag = moe_a2a_next_flag(*u32(mine, l.flag_val));
    *u32(mine, l.flag_val) = flag;
  }
  __syncthreads();
  if (j < p.ep_size) {
    if (!p.is_active(j)) i32(mine, l.recv_counters)[j] = 0;
    if (flag > 1 && p.is_active(j))
      wait_for_call(u32(mine, l.combine_flags + 4 * j), flag, p.abort);
  }
}

// Route (one block): every token's targets (-1: a duplicate of a lower slot's
// rank, an id out of range, an inactive rank) and its row on each target, numbered in token
// order: within a warp by ballots over the ranks, across warps and tiles by per-warp counts and a
// running carry in shared memory. The tables go to this rank's row, the totals to
// send_counters.
__global__ void __launch_bounds__(kRouteThreads) moe_a2a_route_kernel(MoeA2aDispatchParams p) {
  __shared__ int32_t warp_count[kWarps][MoeA2aLayout::kMaxRanks];
  __shared__ int32_t carry[MoeA2aLayout::kMaxRanks];
  const MoeA2aLayout& l = p.layout;
  char* mine = p.row(p.ep_rank);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid < p.ep_size) carry[tid] = 0;
  int32_t* targets = i32(mine, l.topk_target_ranks);
  int32_t* slots = i32(mine, l.topk_send_indices);
  const int K = p.top_k;
  const unsigned lt_mask = (1u << lane) - 1u;
  __syncthreads();
  for (int64_t tile = 0; tile < p.tokens; tile += kRouteThreads) {
    const int64_t t = tile + tid;
    uint64_t sends = 0;  // bit r: this token goes to rank r
    if (t < p.tokens) {
      for (int k = 0; k < K; ++k) {
        const int32_t e = p.experts[t * K + k];
        int target = moe_a2a_slot_rank(e, p.num_experts, p.ep_size);
        if (target >= 0 && (((sends >> target) & 1u) != 0 || !p.is_active(target))) target = -1;
        if (target >= 0) sends |= uint64_t{1} << target;
        targets[t * K + k] = target;
        slots[t * K + k] = -1;
      }
    }
    // Rows within the warp: the lanes below this one that go to the same rank.
    for (int r = 0; r < p.ep_size; ++r) {
      const bool mine_r = ((sends >> r) & 1u) != 0;
      const unsigned b = __ballot_sync(0xffffffffu, mine_r);
      if (lane == 0) warp_count[warp][r] = __popc(b);
      if (mine_r) {
        for (int k = 0; k < K; ++k) {
          if (targets[t * K + k] == r) slots[t * K + k] = __popc(b & lt_mask);
        }
      }
    }
    __syncthreads();
    if (t < p.tokens) {
      for (int k = 0; k < K; ++k) {
        const int r = targets[t * K + k];
        if (r < 0) continue;
        int32_t base = carry[r];
        for (int w = 0; w < warp; ++w) base += warp_count[w][r];
        slots[t * K + k] += base;
      }
    }
    __syncthreads();
    if (tid < p.ep_size) {
      int32_t sum = 0;
      for (int w = 0; w < kWarps; ++w) sum += warp_count[w][tid];
      carry[tid] += sum;
    }
    __syncthreads();
  }
  if (tid < p.ep_size) i32(mine, l.send_counters)[tid] = carry[tid];
}

// Copies `bytes` from src to dst with the widest accesses both allow.
__device__ __forceinline__ void copy_row(char* dst, const char* src, int64_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
                 static_cast<uintptr_t>(bytes);
  if ((a & 15u) == 0) {
    for (int64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else if ((a & 3u) == 0) {
    for (int64_t i = threadIdx.x; i < bytes / 4; i += blockDim.x) {
      reinterpret_cast<uint32_t*>(dst)[i] = reinterpret_cast<const uint32_t*>(src)[i];
    }
  } else {
    for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
  }
}

// A block a token: its payload rows into each target's receive region, at the row routing gave.
__global__ void moe_a2a_copy_kernel(MoeA2aDispatchParams p) {
  const int64_t t = blockIdx.x;
  char* mine = p.row(p.ep_rank);
  const int32_t* targets = i32(mine, p.layout.topk_target_ranks);
  const int32_t* slots = i32(mine, p.layout.topk_send_indices);
  for (int k = 0; k < p.top_k; ++k) {
    const int32_t r = targets[t * p.top_k + k], dst = slots[t * p.top_k + k];
    if (r < 0) continue;
    char* row = p.row(r);
    for (int i = 0; i < p.num_payloads; ++i) {
      const int64_t rb = p.row_bytes[i];
      copy_row(row + p.region[i] + (p.ep_rank * p.runtime_max + dst) * rb,
               static_cast<const char*>(p.payload[i]) + t * rb, rb);
    }
  }
  __threadfence_system();  // the peers read these rows from other devices
}

// One block: counts and EPLB statistics to every active peer, the call published there, every
// active peer's awaited here.
__global__ void moe_a2a_dispatch_signal_kernel(MoeA2aDispatchParams p) {
  const MoeA2aLayout& l = p.layout;
  char* mine = p.row(p.ep_rank);
  const int j = threadIdx.x;
  if (j < p.ep_size && p.is_active(j)) {
    i32(p.row(j), l.recv_counters)[p.ep_rank] = i32(mine, l.send_counters)[j];
    if (p.eplb_local) {
      int32_t* dst = i32(p.row(j), l.eplb_stats) + p.ep_rank * p.eplb_experts;
      for (int64_t e = 0; e < p.eplb_count; ++e) dst[e] = p.eplb_local[e];
    }
  }
  __threadfence_system();
  __syncthreads();
  const uint32_t flag = *u32(mine, l.flag_val);
  if (j < p.ep_size && p.is_active(j)) {
    store_release_sys(u32(p.row(j), l.dispatch_flags + 4 * p.ep_rank), flag);
    wait_for_call(u32(mine, l.dispatch_flags + 4 * j), flag, p.abort);
  }
}

// The payload's valid rows (i < this rank's count from source s) into its combine region,
// cast to fp8 e4m3 (round to nearest, saturating) where the region is fp8.
__global__ void moe_a2a_combine_prepare_kernel(MoeA2aCombineParams p) {
  char* mine = p.row(p.ep_rank);
  const int32_t* recv = i32(mine, p.layout.recv_counters);
  const int64_t H = p.hidden, rows = p.ep_size * p.runtime_max;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int s = static_cast<int>(row / p.runtime_max);
    const int64_t i = row % p.runtime_max;
    if (!p.is_active(s) || i >= __ldcg(recv + s)) continue;  // peers wrote the counts
    char* dst = mine + p.combine_offset + row * p.region_row_bytes();
    if (p.region_dtype == p.payload_dtype) {
      copy_row(dst, static_cast<const char*>(p.payload) + row * p.region_row_bytes(),
               p.region_row_bytes());
    } else {
      for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
        const float v = load_any(p.payload, row * H + h, p.payload_dtype);
        reinterpret_cast<__nv_fp8_e4m3*>(dst)[h] = __nv_fp8_e4m3(v);
      }
    }
  }
  __threadfence_system();
}

// One block: the call counted, published in every active peer, every active peer's awaited.
__global__ void moe_a2a_combine_signal_kernel(MoeA2aCombineParams p) {
  __shared__ uint32_t flag;
  char* mine = p.row(p.ep_rank);
  if (threadIdx.x == 0) {
    flag = moe_a2a_next_flag(*u32(mine, p.layout.flag_val));
    *u32(mine, p.layout.flag_val) = flag;
  }
  __threadfence_system();
  __syncthreads();
  const int j = threadIdx.x;
  if (j < p.ep_size && p.is_active(j)) {
    store_release_sys(u32(p.row(j), p.layout.combine_flags + 4 * p.ep_rank), flag);
    wait_for_call(u32(mine, p.layout.combine_flags + 4 * j), flag, p.abort);
  }
}

// A block a token: each slot that sent reads its rank's row for the token; the slots summed in
// fp32 in moe_a2a_tree_sum's order (+0 for the others), rounded once. T is the region's element
// type: 16-byte aligned rows are read 16 bytes a slot at a time (a slot that
// sent nothing reads as zero bytes, which decode to +0 in every region dtype), others an element
// at a time.
template <int K, class T>
__global__ void moe_a2a_combine_sum_kernel(MoeA2aCombineParams p) {
  __shared__ const char* src[MoeA2aLayout::kMaxTopK];
  const int64_t t = blockIdx.x;
  char* mine = p.row(p.ep_rank);
  if (threadIdx.x < p.top_k) {
    const int k = threadIdx.x;
    const int32_t r = i32(mine, p.layout.topk_target_ranks)[t * p.top_k + k];
    const int32_t slot = i32(mine, p.layout.topk_send_indices)[t * p.top_k + k];
    // As the CPU reference: a table no dispatch left names no row outside the regions.
    src[k] = slot >= 0 && slot < p.runtime_max && r >= 0 && r < p.ep_size && p.is_active(r)
                 ? p.row(r) + p.combine_offset +
                       (p.ep_rank * p.runtime_max + slot) * p.region_row_bytes()
                 : nullptr;
  }
  __syncthreads();
  const int64_t rb = p.region_row_bytes();
  // Every slot's row starts 16-byte aligned only if the rank rows, the region and the row size
  // all are (workspace_size_per_rank need only be a multiple of 8).
  const auto align = reinterpret_cast<uintptr_t>(p.workspace) |
                     static_cast<uintptr_t>(p.rank_stride) |
                     static_cast<uintptr_t>(p.combine_offset) | static_cast<uintptr_t>(rb);
  if ((align & 15u) != 0) {
    for (int64_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      const float s = moe_a2a_tree_sum_fixed<K>(
          [&](int k) { return src[k] ? load_peer(reinterpret_cast<const T*>(src[k]) + h) : 0.0f; });
      store_any(p.out, t * p.hidden + h, p.out_dtype, s);
    }
    return;
  }
  constexpr int kPer = 16 / sizeof(T);  // elements in 16 bytes
  for (int64_t c = threadIdx.x; c < rb / 16; c += blockDim.x) {
    uint4 w[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      w[k] = src[k] ? __ldcg(reinterpret_cast<const uint4*>(src[k]) + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const float s = moe_a2a_tree_sum_fixed<K>([&](int k) {
        T v[kPer];
        memcpy(v, &w[k], 16);
        return to_f32(v[e]);
      });
      store_any(p.out, t * p.hidden + c * kPer + e, p.out_dtype, s);
    }
  }
}

template <int K>
void launch_combine_sum(const MoeA2aCombineParams& p, cudaStream_t s, const char* op) {
  const dim3 grid(static_cast<unsigned>(p.tokens)), block(kCopyThreads);
  switch (p.region_dtype) {
    case DType::kFloat16:
      launch_kernel(op, moe_a2a_combine_sum_kernel<K, __half>, grid, block, 0, s, false, p);
      break;
    case DType::kBFloat16:
      launch_kernel(op, moe_a2a_combine_sum_kernel<K, __nv_bfloat16>, grid, block, 0, s, false, p);
      break;
    case DType::kFloat8E4M3FN:
      launch_kernel(op, moe_a2a_combine_sum_kernel<K, __nv_fp8_e4m3>, grid, block, 0, s, false, p);
      break;
    default:
      launch_kernel(op, moe_a2a_combine_sum_kernel<K, float>, grid, block, 0, s, false, p);
      break;
  }
}

// One block: this rank is done reading the peers' combine regions (its done value, the call's
// number + 1, in every active peer's slot).
__global__ void moe_a2a_combine_done_kernel(MoeA2aCombineParams p) {
  char* mine = p.row(p.ep_rank);
  const uint32_t flag = *u32(mine, p.layout.flag_val);
  __threadfence_system();
  const int j = threadIdx.x;
  if (j < p.ep_size && p.is_active(j)) {
    store_release_sys(u32(p.row(j), p.layout.combine_flags + 4 * p.ep_rank),
                      moe_a2a_next_flag(flag));
  }
}

__global__ void moe_a2a_sanitize_kernel(MoeA2aSanitizeParams p) {
  const auto* recv = reinterpret_cast<const int32_t*>(p.row + p.layout.recv_counters);
  const int64_t n = p.ep_size * p.runtime_max * p.top_k;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / p.top_k;
    if (row % p.runtime_max >= __ldcg(recv + row / p.runtime_max)) p.ids[i] = p.invalid_id;
  }
}

template <int K>
const void* combine_sum_kernel_of(DType region_dtype) {
  switch (region_dtype) {
    case DType::kFloat16:
      return reinterpret_cast<const void*>(moe_a2a_combine_sum_kernel<K, __half>);
    case DType::kBFloat16:
      return reinterpret_cast<const void*>(moe_a2a_combine_sum_kernel<K, __nv_bfloat16>);
    case DType::kFloat8E4M3FN:
      return reinterpret_cast<const void*>(moe_a2a_combine_sum_kernel<K, __nv_fp8_e4m3>);
    default:
      return reinterpret_cast<const void*>(moe_a2a_combine_sum_kernel<K, float>);
  }
}

}  // namespace

void preload_moe_a2a_dispatch() {
  preload_kernels("MoeAlltoAll.dispatch",
                  {reinterpret_cast<const void*>(moe_a2a_dispatch_begin_kernel),
                   reinterpret_cast<const void*>(moe_a2a_route_kernel),
                   reinterpret_cast<const void*>(moe_a2a_copy_kernel),
                   reinterpret_cast<const void*>(moe_a2a_dispatch_signal_kernel)});
}

void preload_moe_a2a_combine(const MoeA2aCombineParams& p) {
  const void* sum = nullptr;
  switch (p.top_k) {
    case 1:
      sum = combine_sum_kernel_of<1>(p.region_dtype);
      break;
    case 2:
      sum = combine_sum_kernel_of<2>(p.region_dtype);
      break;
    case 4:
      sum = combine_sum_kernel_of<4>(p.region_dtype);
      break;
    case 6:
      sum = combine_sum_kernel_of<6>(p.region_dtype);
      break;
    case 8:
      sum = combine_sum_kernel_of<8>(p.region_dtype);
      break;
    case 10:
      sum = combine_sum_kernel_of<10>(p.region_dtype);
      break;
    case 12:
      sum = combine_sum_kernel_of<12>(p.region_dtype);
      break;
    case 14:
      sum = combine_sum_kernel_of<14>(p.region_dtype);
      break;
    case 16:
      sum = combine_sum_kernel_of<16>(p.region_dtype);
      break;
    case 18:
      sum = combine_sum_kernel_of<18>(p.region_dtype);
      break;
    case 22:
      sum = combine_sum_kernel_of<22>(p.region_dtype);
      break;
    default:
      break;  // refused by moe_a2a_combine itself
  }
  preload_kernels(p.op, {reinterpret_cast<const void*>(moe_a2a_combine_prepare_kernel),
                         reinterpret_cast<const void*>(moe_a2a_combine_signal_kernel),
                         reinterpret_cast<const void*>(moe_a2a_combine_done_kernel)});
  if (sum != nullptr) preload_kernels(p.op, {sum});
}

void moe_a2a_dispatch(const MoeA2aDispatchParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const char* op = p.op;
  launch_kernel(op, moe_a2a_dispatch_begin_kernel, dim3(1), dim3(MoeA2aLayout::kMaxRanks), 0, s,
                false, p);
  launch_kernel(op, moe_a2a_route_kernel, dim3(1), dim3(kRouteThreads), 0, s, false, p);
  if (p.tokens > 0) {
    launch_kernel(op, moe_a2a_copy_kernel, dim3(static_cast<unsigned>(p.tokens)),
                  dim3(kCopyThreads), 0, s, false, p);
  }
  launch_kernel(op, moe_a2a_dispatch_signal_kernel, dim3(1), dim3(MoeA2aLayout::kMaxRanks), 0, s,
                false, p);
}

void moe_a2a_combine(const MoeA2aCombineParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const char* op = p.op;
  if (p.payload) {
    const int64_t rows = p.ep_size * p.runtime_max;
    launch_kernel(op, moe_a2a_combine_prepare_kernel,
                  dim3(static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(rows, 1), 4096))),
                  dim3(kCopyThreads), 0, s, false, p);
  }
  launch_kernel(op, moe_a2a_combine_signal_kernel, dim3(1), dim3(MoeA2aLayout::kMaxRanks), 0, s,
                false, p);
  if (p.tokens > 0) {
    switch (p.top_k) {  // the API admits these only (moe_a2a_top_k_supported)
      case 1:
        launch_combine_sum<1>(p, s, op);
        break;
      case 2:
        launch_combine_sum<2>(p, s, op);
        break;
      case 4:
        launch_combine_sum<4>(p, s, op);
        break;
      case 6:
        launch_combine_sum<6>(p, s, op);
        break;
      case 8:
        launch_combine_sum<8>(p, s, op);
        break;
      case 10:
        launch_combine_sum<10>(p, s, op);
        break;
      case 12:
        launch_combine_sum<12>(p, s, op);
        break;
      case 14:
        launch_combine_sum<14>(p, s, op);
        break;
      case 16:
        launch_combine_sum<16>(p, s, op);
        break;
      case 18:
        launch_combine_sum<18>(p, s, op);
        break;
      case 22:
        launch_combine_sum<22>(p, s, op);
        break;
      default:
        FLASHINFER_FAIL(ErrorCode::kInternal, op, "", "unsupported top_k ", p.top_k);
    }
  }
  launch_kernel(op, moe_a2a_combine_done_kernel, dim3(1), dim3(MoeA2aLayout::kMaxRanks), 0, s,
                false, p);
}

void moe_a2a_sanitize_expert_ids(const MoeA2aSanitizeParams& p, void* stream) {
  const int64_t n = p.ep_size * p.runtime_max * p.top_k;
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1024));
  launch_kernel(p.op, moe_a2a_sanitize_kernel, dim3(blocks), dim3(256), 0,
                static_cast<cudaStream_t>(stream), false, p);
}

}  // namespace flashinfer::kernels::cuda
