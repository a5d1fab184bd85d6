// CUDA kernels for the state merges (merge_state, merge_state_in_place, merge_states) and the
// paged-cache append. Both are memory-bound copies with light math.
#include <algorithm>

#include "kernels/cuda/attention_cuda_common.cuh"
#include "kernels/cuda/cascade_cuda.h"
#include "kernels/merge_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

// Block per (row, head); threads stride over head_dim, each folding the states for its dims by
// upstream's rules (kernels/merge_rules.h): a pair given apart (merge_state, in place or not),
// else a fold over the stacked states (merge_states), one state copied through.
template <class T>
__global__ void merge_states_kernel(MergeParams p) {
  const int64_t n = blockIdx.x, h = blockIdx.y;
  if (p.mask && !p.mask[n]) return;
  auto state_s = [&](int64_t k) {
    if (k == 1 && p.s_b) return p.s_b[n * p.sb_stride_n + h * p.sb_stride_h];
    return p.s[n * p.s_stride_n + k * p.s_stride_k + h * p.s_stride_h];
  };
  auto state_v = [&](int64_t k) {
    if (k == 1 && p.v_b)
      return static_cast<const T*>(p.v_b) + n * p.vb_stride_n + h * p.vb_stride_h;
    return static_cast<const T*>(p.v) + n * p.v_stride_n + k * p.v_stride_k + h * p.v_stride_h;
  };
  const bool pair = p.num_states == 2 && p.v_b;
  const MergePair mp = pair ? merge_pair(state_s(0), state_s(1)) : MergePair{0.0f, 0.0f, 0.0f};
  float s_out = -INFINITY;
  if (pair) {
    s_out = mp.s;
  } else if (p.num_states == 1) {
    s_out = state_s(0);
  } else if (p.num_states > 1) {
    MergeFold f;
    for (int64_t k = 0; k < p.num_states; ++k) f.fold(state_s(k));
    s_out = f.lse();
  }
  // In place (v_out == v): every thread reads its own dims before writing them.
  T* out = static_cast<T*>(p.v_out) + n * p.vo_stride_n + h * p.vo_stride_h;
  for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float acc = 0.0f;
    if (pair) {
      acc = mp.a_scale * to_f32(state_v(0)[d]) + mp.b_scale * to_f32(state_v(1)[d]);
    } else if (p.num_states == 1) {
      acc = to_f32(state_v(0)[d]);
    } else if (p.num_states > 1) {
      MergeFold f;
      for (int64_t k = 0; k < p.num_states; ++k) {
        f.fold(state_s(k));
        acc = acc * f.f_prev + to_f32(state_v(k)[d]) * f.f_new;
      }
      acc *= f.out_scale();
    }
    out[d] = from_f32<T>(acc);
  }
  __syncthreads();  // all reads of s done before thread 0 overwrites it (in place)
  if (threadIdx.x == 0) p.s_out[n * p.so_stride_n + h * p.so_stride_h] = s_out;
}

// Block per appended row; threads copy (head, dim) elements of K and V. The copy moves bits
// only, so elements of the right width stand for any dtype. The index arrays are read here, on
// the device (kernels/page_append_params.h): a row append_slot refuses is not written.
// The kernels return before forming the pointers of a refused row: pointers that may be null
// would be generic, not global, and the copies LD / ST rather than LDG / STG.
template <class T>
struct AppendRow {
  const T *ak, *av;  // the appended row's K and V
  T *ck, *cv;        // its token's K and V in the cache
};

template <class T>
__device__ __forceinline__ AppendRow<T> append_row(const AppendParams& p, int64_t i, AppendSlot s) {
  return {static_cast<const T*>(p.append_key) + i * p.ak_stride_n,
          static_cast<const T*>(p.append_value) + i * p.av_stride_n,
          static_cast<T*>(p.k_out) + s.page * p.k_stride_page + s.entry * p.k_stride_token,
          static_cast<T*>(p.v_out) + s.page * p.v_stride_page + s.entry * p.v_stride_token};
}

template <class T>
__global__ void append_strided_kernel(AppendParams p) {
  const AppendSlot s = append_slot(p.table, blockIdx.x);
  if (s.page < 0) return;
  const auto [ak, av, ck, cv] = append_row<T>(p, blockIdx.x, s);
  for (int64_t e = threadIdx.x; e < p.num_heads * p.head_dim; e += blockDim.x) {
    const int64_t h = e / p.head_dim, d = e % p.head_dim;
    ck[h * p.k_stride_head + d] = ak[h * p.ak_stride_h + d];
    cv[h * p.v_stride_head + d] = av[h * p.av_stride_h + d];
  }
}

// As append_strided_kernel, 16 bytes (V elements of T) per copy: every row start (append rows,
// cache tokens, heads) is 16-byte aligned and head_dim a multiple of V (append_vectorizable).
// Named apart from the element-copy kernel for the static SASS rule `rowops`.
template <class T>
__global__ void append_kernel(AppendParams p) {
  constexpr int64_t V = 16 / sizeof(T);
  const AppendSlot s = append_slot(p.table, blockIdx.x);
  if (s.page < 0) return;
  const auto [ak, av, ck, cv] = append_row<T>(p, blockIdx.x, s);
  const int64_t chunks = p.head_dim / V;
  for (int64_t e = threadIdx.x; e < p.num_heads * chunks; e += blockDim.x) {
    const int64_t h = e / chunks, d = e % chunks * V;
    *reinterpret_cast<uint4*>(ck + h * p.k_stride_head + d) =
        *reinterpret_cast<const uint4*>(ak + h * p.ak_stride_h + d);
    *reinterpret_cast<uint4*>(cv + h * p.v_stride_head + d) =
        *reinterpret_cast<const uint4*>(av + h * p.av_stride_h + d);
  }
}

// Whether every K/V row start of an append is 16-byte aligned and head_dim fills whole 16-byte
// chunks (elements of `elem` bytes).
bool append_vectorizable(const AppendParams& p) {
  const int64_t elem = p.elem_size;
  auto ok = [elem](const void* ptr, int64_t stride) {
    return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0 && (stride * elem) % 16 == 0;
  };
  return (p.head_dim * elem) % 16 == 0 && ok(p.append_key, p.ak_stride_n) &&
         ok(p.append_key, p.ak_stride_h) && ok(p.append_value, p.av_stride_n) &&
         ok(p.append_value, p.av_stride_h) && ok(p.k_out, p.k_stride_token) &&
         ok(p.k_out, p.k_stride_head) && ok(p.k_out, p.k_stride_page) &&
         ok(p.v_out, p.v_stride_token) && ok(p.v_out, p.v_stride_head) &&
         ok(p.v_out, p.v_stride_page);
}

template <class T>
void launch_append(const AppendParams& p, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(p.nnz));
  if (append_vectorizable(p)) {
    append_kernel<T><<<grid, 256, 0, s>>>(p);
  } else {
    append_strided_kernel<T><<<grid, 256, 0, s>>>(p);
  }
}

// get_batch_indices_positions: a thread per output element (kernels/page_append_params.h).
__global__ void batch_indices_positions_kernel(BatchIndicesPositionsParams p) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < p.nnz;
       j += int64_t{gridDim.x} * blockDim.x) {
    batch_indices_positions_at(p, j);
  }
}

// get_seq_lens: a thread per request.
__global__ void seq_lens_kernel(SeqLensParams p) {
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < p.batch;
       b += int64_t{gridDim.x} * blockDim.x) {
    p.out[b] = seq_len_at(p, b);
  }
}

}  // namespace

void seq_lens(const SeqLensParams& p, void* stream) {
  if (p.batch == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((p.batch + kThreads - 1) / kThreads, 1024);
  seq_lens_kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                    static_cast<cudaStream_t>(stream)>>>(p);
  FLASHINFER_CUDA_CALL("get_seq_lens", cudaGetLastError());
}

void batch_indices_positions(const BatchIndicesPositionsParams& p, void* stream) {
  if (p.nnz == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((p.nnz + kThreads - 1) / kThreads, 4096);
  batch_indices_positions_kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                                   static_cast<cudaStream_t>(stream)>>>(p);
  FLASHINFER_CUDA_CALL("get_batch_indices_positions", cudaGetLastError());
}

void merge_states(const MergeParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(p.seq), static_cast<unsigned>(p.num_heads));
  dispatch_dtype<CudaElements, kFloat32, kFloat16, kBFloat16>(
      p.v_dtype, "merge_states", "v",
      [&]<class T>() { merge_states_kernel<T><<<grid, 128, 0, s>>>(p); });
  FLASHINFER_CUDA_CALL("merge_states", cudaGetLastError());
}

void append_paged_kv_cache(const AppendParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  // Copies are dtype-agnostic: move elements of the right width.
  switch (p.elem_size) {
    case 1:
      launch_append<uint8_t>(p, s);
      break;
    case 2:
      launch_append<uint16_t>(p, s);
      break;
    case 4:
      launch_append<uint32_t>(p, s);
      break;
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "append_paged_kv_cache", "paged_kv_cache",
                      "element size ", p.elem_size, " is not supported on CUDA");
  }
  FLASHINFER_CUDA_CALL("append_paged_kv_cache", cudaGetLastError());
}

}  // namespace flashinfer::kernels::cuda
