#include <algorithm>
#include <cstdint>

#include "kernels/comm_rules.h"
#include "kernels/cuda/comm_cuda.h"
#include "kernels/cuda/comm_sync.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cuda {
namespace {

constexpr int kCommThreads = kArThreads;  // the CPU reference sums the norm's squares in its order

template <class T>
__device__ __forceinline__ float round_t(float v) {
  return to_f32(from_f32<T>(v));
}

__device__ __forceinline__ float block_reduce_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fp32_abs_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = threadIdx.x < nwarps ? scratch[threadIdx.x] : 0.0f;
  if (warp == 0) {
    for (int o = 16; o > 0; o >>= 1) v = fp32_abs_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  v = scratch[0];
  __syncthreads();
  return v;
}

// kMnnvl: the MNNVL kernels' arithmetic (AllReduceFusionParams::mnnvl) as its own instance, so
// neither variant carries the other's registers.
template <class T, bool kMnnvl>
__global__ void __launch_bounds__(kCommThreads, 1)
    allreduce_fusion_kernel(AllReduceFusionParams p) {
  __shared__ uint32_t seq_s;
  __shared__ float scratch[32];
  pdl_wait();
  const int b = blockIdx.x, tid = threadIdx.x;
  const int64_t T_ = p.tokens, H = p.hidden;
  auto* own = static_cast<char*>(p.peer_buf[p.rank]);
  if (tid == 0) {
    auto* counters = reinterpret_cast<uint32_t*>(own + ArBufferLayout::kCountersOffset);
    seq_s = counters[b] + 1;  // only this block of this rank touches counters[b]
    counters[b] = seq_s;
  }
  __syncthreads();
  const uint32_t seq = seq_s;
  const int64_t slot = ArBufferLayout::kSlotsOffset + static_cast<int64_t>(seq & 1) * p.slot_stride;
  // 1. This block's rows of the input into this rank's slot.
  const T* in = static_cast<const T*>(p.input);
  T* mine = reinterpret_cast<T*>(own + slot);
  for (int64_t t = b; t < T_; t += gridDim.x) {
    for (int64_t j = tid; j < H; j += blockDim.x) mine[t * H + j] = in[t * H + j];
  }
  __threadfence_system();
  __syncthreads();
  // 2. Publish the call to every peer (flag row = this rank), then wait for every peer's.
  if (tid < p.world_size) {
    auto* flags = reinterpret_cast<uint32_t*>(static_cast<char*>(p.peer_buf[tid]) +
                                              ArBufferLayout::kFlagsOffset);
    store_release_sys(flags + p.rank * ArBufferLayout::kMaxBlocks + b, seq);
    const auto* my_flags = reinterpret_cast<const uint32_t*>(own + ArBufferLayout::kFlagsOffset);
    wait_for_call(my_flags + tid * ArBufferLayout::kMaxBlocks + b, seq, p.abort);
  }
  __syncthreads();
  // 3. The sums and the epilogue, a row at a time.
  const ArPattern pat = ar_pattern(p.pattern);
  const float scale = p.scale_factor ? *p.scale_factor : p.scale_value;
  for (int64_t t = b; t < T_; t += gridDim.x) {
    float ss = 0.0f;
    for (int64_t j = tid; j < H; j += blockDim.x) {
      const int64_t i = t * H + j;
      auto load = [&](int k) {
        return load_peer(
            reinterpret_cast<const T*>(static_cast<const char*>(p.peer_buf[k]) + slot) + i);
      };
      auto round = [](float v) { return round_t<T>(v); };
      const float s =
          kMnnvl ? mnnvl_rank_sum(p.world_size, p.oneshot, load, round)
                 : ar_rank_sum(p.world_size, p.fp32_acc, p.island8, p.oneshot, load, round);
      if (pat.allreduce_out) {
        static_cast<T*>(p.output)[i] = from_f32<T>(s);
        continue;
      }
      const float ri = to_f32(static_cast<const T*>(p.residual_in)[i]);  // before any store
      if (p.sum_out) static_cast<T*>(p.sum_out)[i] = from_f32<T>(s);
      const float v = round_t<T>(fp32_add(s, ri));
      static_cast<T*>(p.residual_out)[i] = from_f32<T>(v);
      ss = kMnnvl ? mnnvl_ftz(fp32_add(ss, mnnvl_square(v, p.oneshot, round)))
                  : fp32_add(ss, fp32_mul(v, v));
    }
    if (pat.allreduce_out) continue;
    ss = block_reduce_sum(ss, scratch);  // also orders the residual_out stores before the reads
    const float inv = fp32_div(1.0f, sqrtf(fp32_add(fp32_div(ss, static_cast<float>(H)), p.eps)));
    const T* r = static_cast<const T*>(p.residual_out) + t * H;
    const T* gamma = static_cast<const T*>(p.gamma);
    // The norm before its rounding to T (MNNVL's two-shot per-token FP8 quantizes it as is).
    auto yf_at = [&](int64_t j) {
      const float g = to_f32(gamma[j]), rj = to_f32(r[j]);
      return kMnnvl ? mnnvl_norm(rj, inv, g, p.weight_bias, p.oneshot)
                    : fp32_mul(fp32_mul(rj, inv), fp32_add(p.weight_bias, g));
    };
    auto y_at = [&](int64_t j) { return round_t<T>(yf_at(j)); };
    const bool quant_fp32 = kMnnvl && !p.oneshot && pat.quant == 4;
    auto* q8 = static_cast<uint8_t*>(p.quant_out);
    float amax = 0.0f;
    for (int64_t j = tid; j < H; j += blockDim.x) {
      const float yf = yf_at(j), y = round_t<T>(yf);
      if (pat.norm_out) static_cast<T*>(p.norm_out)[t * H + j] = from_f32<T>(y);
      if (pat.quant == 1) q8[t * H + j] = ar_fp8_static(y, scale);
      amax = fp32_abs_max(amax, quant_fp32 ? yf : y);
    }
    // The passes below read y back. With norm_out they load it from there (exactly y: y is
    // rounded to T) instead of recomputing it from residual_out and gamma; they read other
    // threads' elements, so the row is complete first.
    const T* nrow =
        pat.norm_out && !quant_fp32 ? static_cast<const T*>(p.norm_out) + t * H : nullptr;
    if (pat.norm_out && pat.quant != 0) __syncthreads();
    auto y_back = [&](int64_t j) {
      return quant_fp32 ? yf_at(j) : nrow ? to_f32(nrow[j]) : y_at(j);
    };
    if (pat.quant == 4) {
      amax = block_reduce_max(amax, scratch);
      const float s = ar_token_scale(amax);
      if (tid == 0) static_cast<float*>(p.scale_out)[t] = s;
      for (int64_t j = tid; j < H; j += blockDim.x) q8[t * H + j] = ar_fp8_scaled(y_back(j), s);
    } else if (pat.quant == 2) {
      const int64_t nb = H / kNvfp4Block;
      for (int64_t blk = tid; blk < nb; blk += blockDim.x) {
        float v[kNvfp4Block];
        for (int e = 0; e < kNvfp4Block; ++e) v[e] = y_back(blk * kNvfp4Block + e);
        const Nvfp4Block q = ar_nvfp4_block(v, scale);
        for (int k = 0; k < kNvfp4Block / 2; ++k) {
          q8[t * (H / 2) + blk * (kNvfp4Block / 2) + k] = static_cast<uint8_t>(q.packed >> (8 * k));
        }
        static_cast<uint8_t*>(
            p.scale_out)[sf_offset(static_cast<SfLayoutCode>(p.layout_code), t, blk, nb)] = q.sf;
      }
    } else if (pat.quant == 3) {
      const int64_t G = H / p.group_size, words = (G + 3) / 4;
      for (int64_t w = tid; w < words; w += blockDim.x) {
        uint32_t word = 0;
        for (int k = 0; k < 4; ++k) {
          const int64_t g = w * 4 + k;
          if (g >= G) break;  // padding bytes stay 0
          float gmax = 0.0f;
          for (int64_t j = g * p.group_size; j < (g + 1) * p.group_size; ++j) {
            gmax = fp32_abs_max(gmax, y_back(j));
          }
          uint8_t code = 0;
          const float s = ar_group_scale(gmax, &code);
          for (int64_t j = g * p.group_size; j < (g + 1) * p.group_size; ++j) {
            q8[t * H + j] = ar_fp8_scaled(y_back(j), s);
          }
          word |= static_cast<uint32_t>(code) << (8 * k);
        }
        static_cast<int32_t*>(p.scale_out)[ar_group_scale_word(t, w * 4, p.scale_t_stride)] =
            static_cast<int32_t>(word);
      }
    }
    __syncthreads();  // scratch and the row's residual_out before the next row
  }
}

// allreduce_fusion's MoE patterns: this rank's local value, one element a thread, the CPU's
// arithmetic (kernels/comm_rules.h).
template <class T>
__global__ void moe_local_value_kernel(MoeLocalParams p) {
  const int64_t n = p.tokens * p.hidden, H = p.hidden, Tk = p.tokens;
  auto round = [](float v) { return round_t<T>(v); };
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, h = i % H;
    float v;
    if (p.pattern == 6) {
      const T* active = static_cast<const T*>(p.active);
      v = ar_moe_reduction_value(
          p.experts, [&](int64_t e) { return to_f32(active[(e * Tk + t) * H + h]); },
          [&](int64_t e) { return p.scale[e * Tk + t]; },
          [&] { return to_f32(static_cast<const T*>(p.token)[i]); }, round);
    } else {
      const T* in = static_cast<const T*>(p.input);
      const T* sc = static_cast<const T*>(p.expert_scale);
      v = ar_moe_finalize_value(
          p.top_k, p.rows, sc != nullptr, p.shared != nullptr,
          [&](int64_t k) { return static_cast<int64_t>(p.index[t * p.top_k + k]); },
          [&](int64_t j) { return to_f32(in[j * H + h]); },
          [&](int64_t k) { return to_f32(sc[t * p.top_k + k]); },
          [&] { return to_f32(static_cast<const T*>(p.shared)[i]); }, round);
    }
    static_cast<T*>(p.out)[i] = from_f32<T>(v);
  }
}

// decode_cp_a2a_alltoall, step 1: this rank's partial_o and stats into its slot of the call
// about to be made (the counter still holds the last one).
__global__ void dcp_a2a_put_kernel(DcpA2aParams p) {
  pdl_wait();
  char* mine = p.workspace + p.cp_rank * p.row_stride;
  const uint32_t seq = *reinterpret_cast<const uint32_t*>(mine + DcpA2aParams::kSeqOffset) + 1;
  char* slot = mine + DcpA2aParams::kSlotsOffset + static_cast<int64_t>(seq & 1) * p.slot_bytes;
  const int64_t o_words = p.o_bytes() / 4, s_words = p.entries * p.cp_size * p.S;
  const auto* o = static_cast<const uint32_t*>(p.o_in);
  const auto* st = reinterpret_cast<const uint32_t*>(p.stats_in);
  auto* dst_o = reinterpret_cast<uint32_t*>(slot);
  auto* dst_s = reinterpret_cast<uint32_t*>(slot + p.stats_offset());
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < o_words;
       i += stride) {
    dst_o[i] = o[i];
  }
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < s_words;
       i += stride) {
    dst_s[i] = st[i];
  }
  __threadfence_system();  // the peers read these from other devices
}

// Step 2 (one thread): the call made and published, every peer's awaited.
__global__ void dcp_a2a_sync_kernel(DcpA2aParams p) {
  char* mine = p.workspace + p.cp_rank * p.row_stride;
  auto* counter = reinterpret_cast<uint32_t*>(mine + DcpA2aParams::kSeqOffset);
  const uint32_t seq = *counter + 1;
  *counter = seq;
  __threadfence_system();
  store_release_sys(reinterpret_cast<uint32_t*>(mine + DcpA2aParams::kFlagOffset), seq);
  for (int r = 0; r < p.cp_size; ++r) {
    const auto* flag = reinterpret_cast<const uint32_t*>(p.workspace + r * p.row_stride +
                                                         DcpA2aParams::kFlagOffset);
    wait_for_call(flag, seq, p.abort);
  }
}

// Step 3: slot [e, r, :] of the outputs from rank r's slot [e, cp_rank, :].
__global__ void dcp_a2a_get_kernel(DcpA2aParams p) {
  const uint32_t seq = *reinterpret_cast<const uint32_t*>(p.workspace + p.cp_rank * p.row_stride +
                                                          DcpA2aParams::kSeqOffset);
  const int64_t slot = DcpA2aParams::kSlotsOffset + static_cast<int64_t>(seq & 1) * p.slot_bytes;
  const int64_t o_words = p.D / 2, s_words = p.S;  // a row's 4-byte words
  const int64_t rows = p.entries * p.cp_size;
  const int64_t total = rows * (o_words + s_words);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / (o_words + s_words), w = i % (o_words + s_words);
    const int64_t e = row / p.cp_size, r = row % p.cp_size;
    const char* src = p.workspace + r * p.row_stride + slot;
    const int64_t at = e * p.cp_size + p.cp_rank;
    if (w < o_words) {
      static_cast<uint32_t*>(p.o_out)[row * o_words + w] =
          __ldcg(reinterpret_cast<const unsigned int*>(src) + at * o_words + w);
    } else {
      reinterpret_cast<uint32_t*>(p.stats_out)[row * s_words + (w - o_words)] =
          __ldcg(reinterpret_cast<const unsigned int*>(src + p.stats_offset()) + at * s_words +
                 (w - o_words));
    }
  }
}

}  // namespace

int allreduce_fusion_blocks(int64_t tokens, int world_size, int sm_count) {
  // The same grid for every call on a workspace, whatever its token count: each block numbers
  // the calls it makes, and its slot is that number's parity, so every block must take part in
  // every call (blocks without rows only synchronize). Then a block reaching call k + 2 knows
  // each peer's same block published call k + 1, which that peer's kernel starts only after its
  // whole call-k kernel (every block's reads of call k) is done.
  (void)tokens;
  int64_t g = sm_count / (world_size > 0 ? world_size : 1);
  if (g > ArBufferLayout::kMaxBlocks) g = ArBufferLayout::kMaxBlocks;
  return static_cast<int>(g < 1 ? 1 : g);
}

void allreduce_fusion(const AllReduceFusionParams& p, void* stream, bool enable_pdl, int sm_count) {
  const dim3 grid(p.blocks > 0 ? std::min(p.blocks, ArBufferLayout::kMaxBlocks)
                               : allreduce_fusion_blocks(p.tokens, p.world_size, sm_count));
  const auto s = static_cast<cudaStream_t>(stream);
  auto launch = [&](auto kernel) {
    launch_kernel("allreduce_fusion", kernel, grid, dim3(kCommThreads), 0, s, enable_pdl, p);
  };
  switch (p.dtype) {
    case DType::kFloat16:
      p.mnnvl ? launch(allreduce_fusion_kernel<__half, true>)
              : launch(allreduce_fusion_kernel<__half, false>);
      break;
    case DType::kBFloat16:
      p.mnnvl ? launch(allreduce_fusion_kernel<__nv_bfloat16, true>)
              : launch(allreduce_fusion_kernel<__nv_bfloat16, false>);
      break;
    default:
      p.mnnvl ? launch(allreduce_fusion_kernel<float, true>)
              : launch(allreduce_fusion_kernel<float, false>);
      break;
  }
}

void preload_allreduce_fusion() {
  preload_kernels("allreduce_fusion",
                  {reinterpret_cast<const void*>(allreduce_fusion_kernel<__half, false>),
                   reinterpret_cast<const void*>(allreduce_fusion_kernel<__half, true>),
                   reinterpret_cast<const void*>(allreduce_fusion_kernel<__nv_bfloat16, false>),
                   reinterpret_cast<const void*>(allreduce_fusion_kernel<__nv_bfloat16, true>),
                   reinterpret_cast<const void*>(allreduce_fusion_kernel<float, false>),
                   reinterpret_cast<const void*>(allreduce_fusion_kernel<float, true>)});
}

void preload_decode_cp_a2a_alltoall() {
  preload_kernels("decode_cp_a2a_alltoall", {reinterpret_cast<const void*>(dcp_a2a_put_kernel),
                                             reinterpret_cast<const void*>(dcp_a2a_sync_kernel),
                                             reinterpret_cast<const void*>(dcp_a2a_get_kernel)});
}

void moe_local_value(const MoeLocalParams& p, void* stream, int sm_count) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t n = p.tokens * p.hidden;
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>((n + 255) / 256, static_cast<int64_t>(sm_count) * 8))));
  if (p.dtype == DType::kFloat16) {
    launch_kernel("allreduce_fusion", moe_local_value_kernel<__half>, grid, dim3(256), 0, s, false,
                  p);
  } else {
    launch_kernel("allreduce_fusion", moe_local_value_kernel<__nv_bfloat16>, grid, dim3(256), 0, s,
                  false, p);
  }
}

void decode_cp_a2a_alltoall(const DcpA2aParams& p, void* stream, bool enable_pdl, int sm_count) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t words = p.entries * p.cp_size * (p.D / 2 + p.S);
  const int blocks = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((words + 255) / 256, static_cast<int64_t>(sm_count) * 4)));
  launch_kernel("decode_cp_a2a_alltoall", dcp_a2a_put_kernel, dim3(blocks), dim3(256), 0, s,
                enable_pdl, p);
  launch_kernel("decode_cp_a2a_alltoall", dcp_a2a_sync_kernel, dim3(1), dim3(1), 0, s, false, p);
  launch_kernel("decode_cp_a2a_alltoall", dcp_a2a_get_kernel, dim3(blocks), dim3(256), 0, s, false,
                p);
}

}  // namespace flashinfer::kernels::cuda
