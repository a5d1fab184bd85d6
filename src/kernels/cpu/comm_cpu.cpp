#include "kernels/cpu/comm_cpu.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "flashinfer/error.h"
#include "kernels/comm_rules.h"
#include "kernels/cpu/comm_wait.h"
#include "kernels/cpu/elem_io.h"
#include "kernels/quantization_params.h"

namespace flashinfer::kernels::cpu {
void allreduce_fusion(const AllReduceFusionParams& p) {
  using elem_io::load_or_fp32;
  using elem_io::round_to;
  using elem_io::store_or_fp32;
  const int64_t T = p.tokens, H = p.hidden;
  const ArPattern pat = ar_pattern(p.pattern);
  const DType dt = p.dtype;
  const float scale = p.scale_factor ? *p.scale_factor : p.scale_value;
#pragma omp parallel for schedule(static) if (T * H * p.world_size >= 65536)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> r(static_cast<std::size_t>(H)), y(static_cast<std::size_t>(H));
    for (int64_t j = 0; j < H; ++j) {
      const int64_t i = t * H + j;
      auto load = [&](int k) { return load_or_fp32(p.peer_in[k], dt, i); };
      auto round = [&](float v) { return round_to(dt, v); };
      const float s =
          p.mnnvl ? mnnvl_rank_sum(p.world_size, p.oneshot, load, round)
                  : ar_rank_sum(p.world_size, p.fp32_acc, p.island8, p.oneshot, load, round);
      if (pat.allreduce_out) {
        store_or_fp32(p.output, dt, i, s);
        continue;
      }
      // residual_out (and the MoE sum_out) may be residual_in or input: read before written.
      const float ri = load_or_fp32(p.residual_in, dt, i);
      if (p.sum_out) store_or_fp32(p.sum_out, dt, i, s);
      const float v = fp32_add(s, ri);
      store_or_fp32(p.residual_out, dt, i, v);
      r[static_cast<std::size_t>(j)] = load_or_fp32(p.residual_out, dt, i);
    }
    if (pat.allreduce_out) continue;
    auto round = [&](float v) { return round_to(dt, v); };
    // In the CUDA kernel's order (a block tree), so that the fp32 inv and everything from it
    // agree bit for bit: MNNVL two-shot's per-token scale is amax of the fp32 norm / 448, where a
    // last-place difference of the sum shows in nearly every token's scale.
    const float ss = ar_square_sum(H, [&](float acc, int64_t j) {
      return p.mnnvl ? mnnvl_ftz(fp32_add(acc, mnnvl_square(r[j], p.oneshot, round)))
                     : fp32_add(acc, fp32_mul(r[j], r[j]));
    });
    const float inv =
        fp32_div(1.0f, std::sqrt(fp32_add(fp32_div(ss, static_cast<float>(H)), p.eps)));
    // MNNVL's two-shot per-token FP8 scales the fp32 norm; everything else quantizes y.
    const bool quant_fp32 = p.mnnvl && !p.oneshot && pat.quant == 4;
    for (int64_t j = 0; j < H; ++j) {
      const float gj = load_or_fp32(p.gamma, dt, j);
      const float yf = p.mnnvl ? mnnvl_norm(r[j], inv, gj, p.weight_bias, p.oneshot)
                               : fp32_mul(fp32_mul(r[j], inv), fp32_add(p.weight_bias, gj));
      const float yv = round_to(dt, yf);
      y[static_cast<std::size_t>(j)] = quant_fp32 ? yf : yv;
      if (pat.norm_out) store_or_fp32(p.norm_out, dt, t * H + j, yv);
    }
    auto* q8 = static_cast<uint8_t*>(p.quant_out);
    switch (pat.quant) {
      case 1:
        for (int64_t j = 0; j < H; ++j) q8[t * H + j] = ar_fp8_static(y[j], scale);
        break;
      case 2: {
        const int64_t nb = H / kNvfp4Block;
        auto* sf = static_cast<uint8_t*>(p.scale_out);
        for (int64_t b = 0; b < nb; ++b) {
          const Nvfp4Block blk = ar_nvfp4_block(&y[b * kNvfp4Block], scale);
          for (int k = 0; k < kNvfp4Block / 2; ++k) {
            q8[t * (H / 2) + b * (kNvfp4Block / 2) + k] =
                static_cast<uint8_t>(blk.packed >> (8 * k));
          }
          sf[sf_offset(static_cast<SfLayoutCode>(p.layout_code), t, b, nb)] = blk.sf;
        }
        break;
      }
      case 3: {
        const int64_t G = H / p.group_size, words = (G + 3) / 4;
        auto* sw = static_cast<int32_t*>(p.scale_out);
        std::vector<uint8_t> codes(static_cast<std::size_t>(words * 4), 0);  // padding bytes 0
        for (int64_t g = 0; g < G; ++g) {
          float amax = 0.0f;
          for (int64_t j = g * p.group_size; j < (g + 1) * p.group_size; ++j) {
            amax = fp32_abs_max(amax, y[j]);
          }
          const float s = ar_group_scale(amax, &codes[static_cast<std::size_t>(g)]);
          for (int64_t j = g * p.group_size; j < (g + 1) * p.group_size; ++j) {
            q8[t * H + j] = ar_fp8_scaled(y[j], s);
          }
        }
        for (int64_t w = 0; w < words; ++w) {
          uint32_t word = 0;
          for (int k = 0; k < 4; ++k) word |= static_cast<uint32_t>(codes[w * 4 + k]) << (8 * k);
          sw[ar_group_scale_word(t, w * 4, p.scale_t_stride)] = static_cast<int32_t>(word);
        }
        break;
      }
      case 4: {
        float amax = 0.0f;
        for (int64_t j = 0; j < H; ++j) amax = fp32_abs_max(amax, y[j]);
        const float s = ar_token_scale(amax);
        static_cast<float*>(p.scale_out)[t] = s;
        for (int64_t j = 0; j < H; ++j) q8[t * H + j] = ar_fp8_scaled(y[j], s);
        break;
      }
      default:
        break;
    }
  }
}

void moe_local_value(const MoeLocalParams& p) {
  using elem_io::load_or_fp32;
  using elem_io::round_to;
  using elem_io::store_or_fp32;
  const DType dt = p.dtype;
  const int64_t T = p.tokens, H = p.hidden;
  auto round = [&](float v) { return round_to(dt, v); };
#pragma omp parallel for schedule(static) if (T * H >= 65536)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float v;
      if (p.pattern == 6) {
        v = ar_moe_reduction_value(
            p.experts, [&](int64_t e) { return load_or_fp32(p.active, dt, (e * T + t) * H + h); },
            [&](int64_t e) { return p.scale[e * T + t]; },
            [&] { return load_or_fp32(p.token, dt, t * H + h); }, round);
      } else {
        v = ar_moe_finalize_value(
            p.top_k, p.rows, p.expert_scale != nullptr, p.shared != nullptr,
            [&](int64_t k) { return static_cast<int64_t>(p.index[t * p.top_k + k]); },
            [&](int64_t j) { return load_or_fp32(p.input, dt, j * H + h); },
            [&](int64_t k) { return load_or_fp32(p.expert_scale, dt, t * p.top_k + k); },
            [&] { return load_or_fp32(p.shared, dt, t * H + h); }, round);
      }
      store_or_fp32(p.out, dt, t * H + h, v);
    }
  }
}

void decode_cp_a2a_alltoall(const DcpA2aParams& p) {
  char* mine = p.workspace + p.cp_rank * p.row_stride;
  std::atomic_ref<uint32_t> seq_ref(*reinterpret_cast<uint32_t*>(mine + DcpA2aParams::kSeqOffset));
  const uint32_t seq = seq_ref.load(std::memory_order_relaxed) + 1;
  seq_ref.store(seq, std::memory_order_relaxed);
  const int64_t slot = DcpA2aParams::kSlotsOffset + static_cast<int64_t>(seq & 1) * p.slot_bytes;
  std::memcpy(mine + slot, p.o_in, static_cast<std::size_t>(p.o_bytes()));
  std::memcpy(mine + slot + p.stats_offset(), p.stats_in,
              static_cast<std::size_t>(p.entries * p.cp_size * p.S * 4));
  std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(mine + DcpA2aParams::kFlagOffset))
      .store(seq, std::memory_order_release);
  const auto deadline = peer_wait_deadline();
  for (int r = 0; r < p.cp_size; ++r) {
    // A peer may be a call ahead already (it waits only for this rank's call).
    wait_for_peer_flag(
        *reinterpret_cast<uint32_t*>(p.workspace + r * p.row_stride + DcpA2aParams::kFlagOffset),
        seq, deadline, "decode_cp_a2a_alltoall", "workspace", p.cp_rank, r,
        "'s call (did every rank call it, after init and a barrier?)");
  }
  const int64_t row_o = p.D * 2, row_s = p.S * 4;
  for (int64_t e = 0; e < p.entries; ++e) {
    for (int r = 0; r < p.cp_size; ++r) {
      const char* src = p.workspace + r * p.row_stride + slot;
      const int64_t at = e * p.cp_size + p.cp_rank, to = e * p.cp_size + r;
      std::memcpy(static_cast<char*>(p.o_out) + to * row_o, src + at * row_o,
                  static_cast<std::size_t>(row_o));
      std::memcpy(reinterpret_cast<char*>(p.stats_out) + to * row_s,
                  src + p.stats_offset() + at * row_s, static_cast<std::size_t>(row_s));
    }
  }
}

}  // namespace flashinfer::kernels::cpu
