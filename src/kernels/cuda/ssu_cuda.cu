#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device/vec.cuh"
#include "kernels/cuda/ssu_cuda.h"
#include "kernels/ssu_rules.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kRows = 8;  // state rows (d) of one (sequence, head) per block: a warp each

// State elements to and from fp32 (int16 rows are scaled by the caller).
template <class ST>
__device__ __forceinline__ float st_to_f32(ST v) {
  return to_f32(v);
}
template <>
__device__ __forceinline__ float st_to_f32<int16_t>(int16_t v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float st_to_f32<int8_t>(int8_t v) {
  return static_cast<float>(v);
}
// float8_e4m3fn states travel as their bytes.
template <>
__device__ __forceinline__ float st_to_f32<uint8_t>(uint8_t v) {
  return detail::DecodeMinifloat<4, 3, detail::Specials::kFiniteNan>(v);
}

template <class ST>
inline constexpr bool kScaledState =
    std::is_same_v<ST, int16_t> || std::is_same_v<ST, int8_t> || std::is_same_v<ST, uint8_t>;
template <class ST>
inline constexpr DType kScaledDtype = std::is_same_v<ST, int16_t>  ? DType::kInt16
                                      : std::is_same_v<ST, int8_t> ? DType::kInt8
                                                                   : DType::kFloat8E4M3FN;

// One value of a scaled state (int16 / int8 clamped and rounded, e4m3 saturated).
template <class ST>
__device__ __forceinline__ ST scaled_code(float s, float encode) {
  constexpr DType d = kScaledDtype<ST>;
  const float q = fminf(fmaxf(s * encode, -ssu::scaled_qmax(d)), ssu::scaled_qmax(d));
  if constexpr (std::is_same_v<ST, uint8_t>) {
    return float_to_e4m3fn_bits(q, true);
  } else {
    return static_cast<ST>(rintf(q));
  }
}

__device__ __forceinline__ float warp_reduce_max(float v) {
  FLASHINFER_UNROLL
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A lane's E contiguous elements from n0 of a row at `row`: one vector access when the row is
// aligned for it (`vec`) and the chunk lies inside dstate, element by element otherwise.
template <class ST, int E>
__device__ __forceinline__ void load_chunk(const ST* row, int64_t n0, int64_t dstate, bool vec,
                                           float (&v)[E]) {
  if (vec && n0 + E <= dstate) {
    dev::Vec<ST, E> c;
    c.load(row + n0);
    FLASHINFER_UNROLL
    for (int j = 0; j < E; ++j) v[j] = st_to_f32(c.v[j]);
    return;
  }
  FLASHINFER_UNROLL
  for (int j = 0; j < E; ++j) v[j] = n0 + j < dstate ? st_to_f32(row[n0 + j]) : 0.0f;
}

template <class ST, int E>
__device__ __forceinline__ void store_chunk(ST* row, int64_t n0, int64_t dstate, bool vec,
                                            const ST (&c)[E]) {
  if (vec && n0 + E <= dstate) {
    dev::Vec<ST, E> w;
    FLASHINFER_UNROLL
    for (int j = 0; j < E; ++j) w.v[j] = c[j];
    w.store(row + n0);
    return;
  }
  FLASHINFER_UNROLL
  for (int j = 0; j < E; ++j) {
    if (n0 + j < dstate) row[n0 + j] = c[j];
  }
}

// The warp's row stored at `row` in the state dtype (every lane calls it: int16 takes a warp
// max). fp16 with a seed rounds stochastically with the random bits of the element pair at
// sr_base + n in the read slot; int16 writes its decode scale to *scale (lane 0).
template <class ST, int E>
__device__ __forceinline__ void store_state_row(const SsuParams& p, ST* row, float* scale,
                                                const float (&s)[E], int64_t n0, bool vec,
                                                uint64_t sr_base, int lane) {
  ST c[E];
  if constexpr (kScaledState<ST>) {
    float amax = 0.0f;
    FLASHINFER_UNROLL
    for (int j = 0; j < E; ++j) {
      if (n0 + j < p.dstate) amax = fmaxf(amax, fabsf(s[j]));
    }
    const float enc = ssu::scaled_encode(kScaledDtype<ST>, warp_reduce_max(amax));
    FLASHINFER_UNROLL
    for (int j = 0; j < E; ++j) c[j] = scaled_code<ST>(s[j], enc);
    if (lane == 0) *scale = 1.0f / enc;
  } else if constexpr (std::is_same_v<ST, __half>) {
    if (p.rand_seed) {
      const int64_t seed = *p.rand_seed;
      FLASHINFER_UNROLL
      for (int j = 0; j < E; j += 2) {  // n0 is even: the pairs are (n0 + j, n0 + j + 1)
        const uint32_t w = ssu::sr_word(seed, p.philox_rounds, sr_base + n0 + j);
        c[j] = __ushort_as_half(ssu::f16_stochastic_bits(s[j], ssu::sr_bits(w, n0 + j)));
        c[j + 1] =
            __ushort_as_half(ssu::f16_stochastic_bits(s[j + 1], ssu::sr_bits(w, n0 + j + 1)));
      }
    } else {
      FLASHINFER_UNROLL
      for (int j = 0; j < E; ++j) c[j] = __float2half_rn(s[j]);
    }
  } else {
    FLASHINFER_UNROLL
    for (int j = 0; j < E; ++j) c[j] = from_f32<ST>(s[j]);
  }
  store_chunk<ST, E>(row, n0, p.dstate, vec, c);
}

template <class ST, int E>
__global__ void __launch_bounds__(kRows * 32)
    ssu_kernel(SsuParams p, bool state_vec, bool inter_vec) {
  static_assert(E % 2 == 0, "stochastic rounding pairs elements within a lane");
  pdl_wait();
  __shared__ float sB[kSsuMaxDstate], sC[kSsuMaxDstate];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t rblocks = (p.dim + kRows - 1) / kRows;
  const int64_t s = blockIdx.x / rblocks;
  const int64_t d = (blockIdx.x % rblocks) * kRows + warp;
  const int64_t h = blockIdx.y;
  if (s >= p.num_seqs) return;
  const bool row = d < p.dim;  // a block's idle warps still take part in its barriers
  const int64_t ds = p.dstate, n0 = static_cast<int64_t>(lane) * E;

  int64_t begin = 0, len = p.T, seq = s;
  if (p.cu_seqlens) {
    begin = ssu::load_index(p.cu_seqlens, p.cu_seqlens_i64, s);
    const int64_t end = ssu::load_index(p.cu_seqlens, p.cu_seqlens_i64, s + 1);
    if (begin < 0 || end < begin || end > p.total_tokens) return;  // the CPU path refuses these
    len = min(end - begin, p.T);
    seq = 0;
  }
  if (len <= 0) return;
  int64_t init = 0;
  if (p.num_accepted) {
    init = max(ssu::load_index(p.num_accepted, p.num_accepted_i64, s) - 1, int64_t{0});
  }
  // An accepted-token column past the index tensor's (the CPU path refuses it) reads no slot.
  const bool bad_col = p.src_idx && p.src_stride1 != 0 && init >= p.src_cols;
  const int64_t src =
      !p.src_idx ? s
      : bad_col  ? int64_t{-1}
                 : ssu::load_index(p.src_idx, p.idx_i64, s * p.src_stride0 + init * p.src_stride1);
  const bool pad = !bad_col && src == p.pad_slot_id;
  auto out_off = [&](int64_t tok) {
    return seq * p.out_seq + tok * p.out_tok + h * p.out_head + d;
  };
  if (!pad && (bad_col || src < 0 || src >= p.slots)) {  // refused by the CPU path: NaN, no state
    if (row && lane == 0) {
      for (int64_t t = 0; t < len; ++t) {
        store_any(p.out, out_off(begin + t), p.io_dtype, __int_as_float(0x7fc00000));
      }
    }
    return;
  }
  const int64_t g = h / (p.nheads / p.ngroups);
  const int64_t row_off = (h * p.dim + d) * ds;  // within a slot
  const uint64_t sr_base = static_cast<uint64_t>(src * p.state_stride_slot + row_off);

  float st[E];
  FLASHINFER_UNROLL
  for (int j = 0; j < E; ++j) st[j] = 0.0f;
  if (row && !pad) {
    load_chunk<ST, E>(static_cast<const ST*>(p.state) + src * p.state_stride_slot + row_off, n0, ds,
                      state_vec, st);
    if (p.state_scale) {
      const float sc = p.state_scale[src * p.scale_stride_slot + h * p.dim + d];
      FLASHINFER_UNROLL
      for (int j = 0; j < E; ++j) st[j] *= sc;
    }
  }
  const float A = p.A[h * p.A_stride];
  const float Dv = p.D ? load_any(p.D, h * p.D_stride, p.w_dtype) : 0.0f;
  const float bias = p.dt_bias ? load_any(p.dt_bias, h * p.dt_bias_stride, p.w_dtype) : 0.0f;

  for (int64_t t = 0; t < len; ++t) {
    const int64_t tok = begin + t;
    __syncthreads();  // the previous token's B and C are read
    for (int64_t i = threadIdx.x; i < ds; i += blockDim.x) {
      sB[i] = load_any(p.B.data, seq * p.B.seq + tok * p.B.tok + g * p.B.head + i, p.io_dtype);
      sC[i] = load_any(p.C.data, seq * p.C.seq + tok * p.C.tok + g * p.C.head + i, p.io_dtype);
    }
    __syncthreads();
    if (!row) continue;
    float dt =
        load_any(p.dt.data, seq * p.dt.seq + tok * p.dt.tok + h * p.dt.head, p.dt_dtype) + bias;
    if (p.dt_softplus) dt = ssu::softplus(dt);
    const float dA = expf(A * dt);
    const float x =
        load_any(p.x.data, seq * p.x.seq + tok * p.x.tok + h * p.x.head + d, p.io_dtype);
    float acc = 0.0f;
    FLASHINFER_UNROLL
    for (int j = 0; j < E; ++j) {
      const int64_t n = n0 + j;
      if (n < ds) {
        st[j] = st[j] * dA + (sB[n] * dt) * x;
        acc += st[j] * sC[n];
      }
    }
    float y = Dv * x + warp_reduce_sum(acc);
    if (p.z.data) {
      y = ssu::gate(
          y, load_any(p.z.data, seq * p.z.seq + tok * p.z.tok + h * p.z.head + d, p.io_dtype));
    }
    if (lane == 0) store_any(p.out, out_off(tok), p.io_dtype, y);
    if (!p.multi_token || pad) continue;
    if (p.dst_idx) {
      const int64_t dst =
          ssu::load_index(p.dst_idx, p.idx_i64, s * p.dst_stride0 + t * p.dst_stride1);
      if (dst != p.pad_slot_id && dst >= 0 && dst < p.slots) {
        float* scale =
            p.state_scale ? p.state_scale + dst * p.scale_stride_slot + h * p.dim + d : nullptr;
        store_state_row<ST, E>(p, static_cast<ST*>(p.state) + dst * p.state_stride_slot + row_off,
                               scale, st, n0, state_vec, sr_base, lane);
      }
    } else if (p.inter) {
      const int64_t e = p.inter_idx ? ssu::load_index(p.inter_idx, p.idx_i64, s) : src;
      if (e >= 0 && e < p.inter_entries && t < p.inter_steps) {
        const int64_t r = ((e * p.inter_steps + t) * p.nheads + h) * p.dim + d;
        store_state_row<ST, E>(p, static_cast<ST*>(p.inter) + r * ds,
                               p.inter_scales ? p.inter_scales + r : nullptr, st, n0, inter_vec,
                               sr_base, lane);
      }
    }
  }
  if (!row || pad || !p.update_state || (p.multi_token && p.dst_idx)) return;
  const int64_t dst =
      !p.multi_token && p.dst_idx ? ssu::load_index(p.dst_idx, p.idx_i64, s * p.dst_stride0) : src;
  if (dst == p.pad_slot_id || dst < 0 || dst >= p.slots) return;
  float* scale =
      p.state_scale ? p.state_scale + dst * p.scale_stride_slot + h * p.dim + d : nullptr;
  store_state_row<ST, E>(p, static_cast<ST*>(p.state) + dst * p.state_stride_slot + row_off, scale,
                         st, n0, state_vec, sr_base, lane);
}

// checkpointing_ssu: the block's rows replay the slot's ring history into the checkpoint (each
// history row's B in shared memory), store it on a flush, then run the new tokens as
// ssu_kernel does and append them to the ring (x by each row's lane 0, dt and B by the first
// row block of the head, B once per group).
template <class ST, int E>
// At least 2 blocks an SM: ptxas otherwise held the 8-values-a-lane instances to 64 registers
// and spilled.
__global__ void __launch_bounds__(kRows * 32, 2) ckpt_ssu_kernel(CkptSsuParams c, bool state_vec) {
  static_assert(E % 2 == 0, "stochastic rounding pairs elements within a lane");
  pdl_wait();
  const SsuParams& p = c.ssu;
  __shared__ float sB[kSsuMaxDstate], sC[kSsuMaxDstate];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t rblocks = (p.dim + kRows - 1) / kRows;
  const int64_t b = blockIdx.x / rblocks;
  const bool first_rows = blockIdx.x % rblocks == 0;
  const int64_t d = (blockIdx.x % rblocks) * kRows + warp;
  const int64_t h = blockIdx.y;
  if (b >= p.num_seqs) return;
  const bool row = d < p.dim;
  const int64_t ds = p.dstate, n0 = static_cast<int64_t>(lane) * E;
  const int64_t slot = p.src_idx ? ssu::load_index(p.src_idx, p.idx_i64, b * p.src_stride0) : b;
  if (slot == p.pad_slot_id) return;  // padding: nothing computed or written
  int64_t begin = 0, len = p.T, seq = b;
  if (p.cu_seqlens) {
    begin = ssu::load_index(p.cu_seqlens, p.cu_seqlens_i64, b);
    const int64_t end = ssu::load_index(p.cu_seqlens, p.cu_seqlens_i64, b + 1);
    if (begin < 0 || end < begin || end > p.total_tokens) return;  // the CPU path refuses these
    len = min(end - begin, p.T);
    seq = 0;
  }
  if (len <= 0) return;
  auto out_off = [&](int64_t tok) {
    return seq * p.out_seq + tok * p.out_tok + h * p.out_head + d;
  };
  // What the CPU path refuses on the host: NaN outputs, nothing stored.
  const bool bad_slot = slot < 0 || slot >= p.slots;
  const int64_t r0 = bad_slot ? 0 : c.ring_start[slot], pn = bad_slot ? 0 : c.pnat[slot];
  if (bad_slot || r0 < 0 || r0 >= c.L || pn < 0 || pn > c.W) {
    if (row && lane == 0) {
      for (int64_t t = 0; t < len; ++t) {
        store_any(p.out, out_off(begin + t), p.io_dtype, __int_as_float(0x7fc00000));
      }
    }
    return;
  }
  const int64_t g = h / (p.nheads / p.ngroups);
  const int64_t row_off = (h * p.dim + d) * ds;
  const uint64_t sr_base = static_cast<uint64_t>(slot * p.state_stride_slot + row_off);
  float st[E];
  FLASHINFER_UNROLL
  for (int j = 0; j < E; ++j) st[j] = 0.0f;
  if (row) {
    load_chunk<ST, E>(static_cast<const ST*>(p.state) + slot * p.state_stride_slot + row_off, n0,
                      ds, state_vec, st);
    if (p.state_scale) {
      const float sc = p.state_scale[slot * p.scale_stride_slot + h * p.dim + d];
      FLASHINFER_UNROLL
      for (int j = 0; j < E; ++j) st[j] *= sc;
    }
  }
  const float A = p.A[h * p.A_stride];
  for (int64_t i = 0; i < pn; ++i) {  // the history, oldest first
    const int64_t rr = (r0 + i) % c.L;
    __syncthreads();
    for (int64_t k = threadIdx.x; k < ds; k += blockDim.x) {
      sB[k] =
          load_any(c.B_cache, slot * c.bc_slot + g * c.bc_group + rr * c.bc_row + k, p.io_dtype);
    }
    __syncthreads();
    if (!row) continue;
    const float dt = c.dt_cache[slot * c.dc_slot + h * c.dc_head + rr];
    const float dA = expf(A * dt);
    const float x =
        load_any(c.x_cache, slot * c.xc_slot + h * c.xc_head + rr * c.xc_row + d, p.io_dtype);
    FLASHINFER_UNROLL
    for (int j = 0; j < E; ++j) {
      if (n0 + j < ds) st[j] = st[j] * dA + (sB[n0 + j] * dt) * x;
    }
  }
  if (row && pn + len > c.W) {  // a flush: the replayed checkpoint, not this call's tokens
    float* scale =
        p.state_scale ? p.state_scale + slot * p.scale_stride_slot + h * p.dim + d : nullptr;
    store_state_row<ST, E>(p, static_cast<ST*>(p.state) + slot * p.state_stride_slot + row_off,
                           scale, st, n0, state_vec, sr_base, lane);
  }
  const float Dv = p.D ? load_any(p.D, h * p.D_stride, p.w_dtype) : 0.0f;
  const float bias = p.dt_bias ? load_any(p.dt_bias, h * p.dt_bias_stride, p.w_dtype) : 0.0f;
  const bool group_leader = first_rows && h % (p.nheads / p.ngroups) == 0;
  for (int64_t t = 0; t < len; ++t) {
    const int64_t tok = begin + t, rr = (r0 + pn + t) % c.L;
    __syncthreads();
    for (int64_t k = threadIdx.x; k < ds; k += blockDim.x) {
      sB[k] = load_any(p.B.data, seq * p.B.seq + tok * p.B.tok + g * p.B.head + k, p.io_dtype);
      sC[k] = load_any(p.C.data, seq * p.C.seq + tok * p.C.tok + g * p.C.head + k, p.io_dtype);
    }
    __syncthreads();
    float dt =
        load_any(p.dt.data, seq * p.dt.seq + tok * p.dt.tok + h * p.dt.head, p.dt_dtype) + bias;
    if (p.dt_softplus) dt = ssu::softplus(dt);
    if (group_leader) {  // B appended once per group (values of the io dtype: exact)
      for (int64_t k = threadIdx.x; k < ds; k += blockDim.x) {
        store_any(c.B_cache, slot * c.bc_slot + g * c.bc_group + rr * c.bc_row + k, p.io_dtype,
                  sB[k]);
      }
    }
    if (first_rows && threadIdx.x == 0) c.dt_cache[slot * c.dc_slot + h * c.dc_head + rr] = dt;
    if (!row) continue;
    const float dA = expf(A * dt);
    const float x =
        load_any(p.x.data, seq * p.x.seq + tok * p.x.tok + h * p.x.head + d, p.io_dtype);
    float acc = 0.0f;
    FLASHINFER_UNROLL
    for (int j = 0; j < E; ++j) {
      const int64_t n = n0 + j;
      if (n < ds) {
        st[j] = st[j] * dA + (sB[n] * dt) * x;
        acc += st[j] * sC[n];
      }
    }
    float y = Dv * x + warp_reduce_sum(acc);
    if (p.z.data) {
      y = ssu::gate(
          y, load_any(p.z.data, seq * p.z.seq + tok * p.z.tok + h * p.z.head + d, p.io_dtype));
    }
    if (lane == 0) {
      store_any(p.out, out_off(tok), p.io_dtype, y);
      store_any(c.x_cache, slot * c.xc_slot + h * c.xc_head + rr * c.xc_row + d, p.io_dtype, x);
    }
  }
}

bool ssu_aligned16(const void* ptr, int64_t elems_a, int64_t elems_b, int64_t elem_bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (elems_a * elem_bytes) % 16 == 0 &&
         (elems_b * elem_bytes) % 16 == 0;
}

// Both kernels' grid (a block per sequence and 8 rows, by head), after the limits they share.
dim3 ssu_grid(const SsuParams& p, const char* op) {
  const int64_t rblocks = (p.dim + kRows - 1) / kRows;
  FLASHINFER_CHECK(p.num_seqs * rblocks <= 0x7fffffff && p.nheads <= 65535, op, "x",
                   "grid too large: ", p.num_seqs, " sequences x ", p.nheads, " heads");
  FLASHINFER_CHECK(p.dstate <= kSsuMaxDstate, op, "state", "dstate ", p.dstate,
                   " above the CUDA kernel's ", kSsuMaxDstate);
  return dim3(static_cast<unsigned>(p.num_seqs * rblocks), static_cast<unsigned>(p.nheads));
}

// f(std::integral_constant<int, E>) with E = 2, 4 or 8 state values a lane for dstate.
template <class F>
void with_values_a_lane(int64_t dstate, F&& f) {
  const int64_t per_lane = (dstate + 31) / 32;
  if (per_lane <= 2) {
    f(std::integral_constant<int, 2>{});
  } else if (per_lane <= 4) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, 8>{});
  }
}

template <class ST>
void launch_typed(const SsuParams& p, dim3 grid, cudaStream_t stream, bool enable_pdl) {
  const int64_t sz = static_cast<int64_t>(sizeof(ST));
  const bool state_vec = ssu_aligned16(p.state, p.state_stride_slot, p.dstate, sz);
  const bool inter_vec = p.inter && ssu_aligned16(p.inter, p.dstate, p.dstate, sz);
  with_values_a_lane(p.dstate, [&](auto e) {
    launch_kernel("selective_state_update", ssu_kernel<ST, decltype(e)::value>, grid,
                  dim3(kRows * 32), 0, stream, enable_pdl, p, state_vec, inter_vec);
  });
}

template <class ST>
void launch_ckpt_typed(const CkptSsuParams& c, dim3 grid, cudaStream_t stream, bool enable_pdl) {
  const SsuParams& p = c.ssu;
  const bool state_vec = ssu_aligned16(p.state, p.state_stride_slot, p.dstate, sizeof(ST));
  with_values_a_lane(p.dstate, [&](auto e) {
    launch_kernel("checkpointing_ssu", ckpt_ssu_kernel<ST, decltype(e)::value>, grid,
                  dim3(kRows * 32), 0, stream, enable_pdl, c, state_vec);
  });
}
}  // namespace

void selective_state_update(const SsuParams& p, void* stream, bool enable_pdl) {
  if (p.num_seqs == 0 || p.nheads == 0 || p.dim == 0) return;
  const dim3 grid = ssu_grid(p, "selective_state_update");
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.state_dtype) {
    case DType::kFloat16:
      launch_typed<__half>(p, grid, s, enable_pdl);
      break;
    case DType::kBFloat16:
      launch_typed<__nv_bfloat16>(p, grid, s, enable_pdl);
      break;
    case DType::kInt16:
      launch_typed<int16_t>(p, grid, s, enable_pdl);
      break;
    default:
      launch_typed<float>(p, grid, s, enable_pdl);
      break;
  }
}

void checkpointing_ssu(const CkptSsuParams& c, void* stream, bool enable_pdl) {
  const SsuParams& p = c.ssu;
  if (p.num_seqs == 0 || p.nheads == 0 || p.dim == 0) return;
  const dim3 grid = ssu_grid(p, "checkpointing_ssu");
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.state_dtype) {
    case DType::kFloat16:
      launch_ckpt_typed<__half>(c, grid, s, enable_pdl);
      break;
    case DType::kBFloat16:
      launch_ckpt_typed<__nv_bfloat16>(c, grid, s, enable_pdl);
      break;
    case DType::kInt8:
      launch_ckpt_typed<int8_t>(c, grid, s, enable_pdl);
      break;
    case DType::kFloat8E4M3FN:
      launch_ckpt_typed<uint8_t>(c, grid, s, enable_pdl);
      break;
    default:
      launch_ckpt_typed<float>(c, grid, s, enable_pdl);
      break;
  }
}

}  // namespace flashinfer::kernels::cuda
