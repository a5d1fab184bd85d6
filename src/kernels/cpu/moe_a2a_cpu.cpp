#include "kernels/cpu/moe_a2a_cpu.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "flashinfer/error.h"
#include "kernels/cpu/comm_wait.h"
#include "kernels/cpu/elem_io.h"

namespace flashinfer::kernels::cpu {
namespace {

uint32_t& u32_at(char* row, int64_t off) { return *reinterpret_cast<uint32_t*>(row + off); }
int32_t* i32_at(char* row, int64_t off) { return reinterpret_cast<int32_t*>(row + off); }

// This rank's next call number (dispatches and combines count alike on every rank).
uint32_t next_flag(char* mine, const MoeA2aLayout& l) {
  std::atomic_ref<uint32_t> fv(u32_at(mine, l.flag_val));
  const uint32_t flag = moe_a2a_next_flag(fv.load(std::memory_order_relaxed));
  fv.store(flag, std::memory_order_relaxed);
  return flag;
}

// Publishes `flag` in slot `rank` of every active peer's flag array at `flags`.
template <class P>
void publish(const P& p, int64_t flags, uint32_t flag) {
  for (int t = 0; t < p.ep_size; ++t) {
    if (!p.is_active(t)) continue;
    std::atomic_ref<uint32_t>(u32_at(p.row(t), flags + 4 * p.ep_rank))
        .store(flag, std::memory_order_release);
  }
}

// Waits until every active peer's slot of this rank's flag array at `flags` has reached `flag`
// (a peer may be a step ahead: a combine's done value follows its call value).
template <class P>
void wait_for(const P& p, int64_t flags, uint32_t flag, const char* op) {
  const auto deadline = peer_wait_deadline();
  char* mine = p.row(p.ep_rank);
  for (int s = 0; s < p.ep_size; ++s) {
    if (!p.is_active(s)) continue;
    wait_for_peer_flag(u32_at(mine, flags + 4 * s), flag, deadline, op, "", p.ep_rank, s,
                       " (did every active rank make the same calls?)");
  }
}

template <class P>
void publish_and_wait(const P& p, int64_t flags, uint32_t flag, const char* op) {
  publish(p, flags, flag);
  wait_for(p, flags, flag, op);
}

}  // namespace

void moe_a2a_dispatch(const MoeA2aDispatchParams& p) {
  const MoeA2aLayout& l = p.layout;
  char* mine = p.row(p.ep_rank);
  const uint32_t flag = next_flag(mine, l);
  // Every active rank has finished summing the previous combine (it published `flag` as its
  // done value): its reads of the combine regions, which this dispatch's rows may overlap when
  // the regions grow, are over.
  if (flag > 1) wait_for(p, l.combine_flags, flag, p.op);
  int32_t* send = i32_at(mine, l.send_counters);
  std::fill(send, send + p.ep_size, 0);
  // Sources that take no part send nothing (the active ones overwrite their counts).
  for (int s = 0; s < p.ep_size; ++s) {
    if (!p.is_active(s)) i32_at(mine, l.recv_counters)[s] = 0;
  }
  int32_t* targets = i32_at(mine, l.topk_target_ranks);
  int32_t* slots = i32_at(mine, l.topk_send_indices);
  const int K = p.top_k;
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int k = 0; k < K; ++k) {
      const int32_t e = p.experts[t * K + k];
      int target = moe_a2a_slot_rank(e, p.num_experts, p.ep_size);
      // A token reaches a rank once: the lowest slot routed there sends.
      for (int j = 0; j < k && target >= 0; ++j) {
        if (targets[t * K + j] == target) target = -1;
      }
      if (target >= 0 && !p.is_active(target)) target = -1;
      if (target < 0) {
        // A duplicate (the rank's first slot holds its target), an id whose rank is outside
        // [0, ep_size) or an inactive rank: nothing sent.
        targets[t * K + k] = -1;
        slots[t * K + k] = -1;
        continue;
      }
      const int32_t dst = send[target]++;
      targets[t * K + k] = target;
      slots[t * K + k] = dst;
      char* row = p.row(target);
      for (int i = 0; i < p.num_payloads; ++i) {
        const int64_t rb = p.row_bytes[i];
        std::memcpy(row + p.region[i] + (p.ep_rank * p.runtime_max + dst) * rb,
                    static_cast<const char*>(p.payload[i]) + t * rb, static_cast<std::size_t>(rb));
      }
    }
  }
  for (int t = 0; t < p.ep_size; ++t) {
    if (!p.is_active(t)) continue;
    i32_at(p.row(t), l.recv_counters)[p.ep_rank] = send[t];
    if (p.eplb_local) {
      std::memcpy(i32_at(p.row(t), l.eplb_stats) + p.ep_rank * p.eplb_experts, p.eplb_local,
                  static_cast<std::size_t>(p.eplb_count) * 4);
    }
  }
  publish_and_wait(p, l.dispatch_flags, flag, p.op);
}

void moe_a2a_combine(const MoeA2aCombineParams& p) {
  const MoeA2aLayout& l = p.layout;
  char* mine = p.row(p.ep_rank);
  const uint32_t flag = next_flag(mine, l);
  const int64_t H = p.hidden, rb = p.region_row_bytes();
  const int64_t pb = H * static_cast<int64_t>(dtype_size(p.payload_dtype));
  if (p.payload) {
    const int32_t* recv = i32_at(mine, l.recv_counters);
    for (int s = 0; s < p.ep_size; ++s) {
      if (!p.is_active(s)) continue;
      for (int64_t i = 0; i < std::min<int64_t>(recv[s], p.runtime_max); ++i) {
        const int64_t r = s * p.runtime_max + i;
        const char* src = static_cast<const char*>(p.payload) + r * pb;
        char* dst = mine + p.combine_offset + r * rb;
        if (p.region_dtype == p.payload_dtype) {
          std::memcpy(dst, src, static_cast<std::size_t>(rb));
        } else {
          for (int64_t h = 0; h < H; ++h) {
            elem_io::encode(dst, p.region_dtype, h, elem_io::load_or_fp32(src, p.payload_dtype, h));
          }
        }
      }
    }
  }
  publish_and_wait(p, l.combine_flags, flag, p.op);
  const int32_t* targets = i32_at(mine, l.topk_target_ranks);
  const int32_t* slots = i32_at(mine, l.topk_send_indices);
  const int K = p.top_k;
  const char* src[MoeA2aLayout::kMaxTopK];
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int k = 0; k < K; ++k) {
      const int32_t target = targets[t * K + k], slot = slots[t * K + k];
      // A table left by no dispatch, or read with another runtime_max (the module functions
      // take both from the caller), names no row outside the regions.
      src[k] = slot >= 0 && slot < p.runtime_max && target >= 0 && target < p.ep_size &&
                       p.is_active(target)
                   ? p.row(target) + p.combine_offset + (p.ep_rank * p.runtime_max + slot) * rb
                   : nullptr;
    }
    for (int64_t h = 0; h < H; ++h) {
      const float s = moe_a2a_tree_sum(K, [&](int k) {
        return src[k] ? elem_io::load_or_fp32(src[k], p.region_dtype, h) : 0.0f;
      });
      elem_io::store_or_fp32(p.out, p.out_dtype, t * H + h, s);
    }
  }
  // Done reading the peers' combine regions: the next dispatch may overwrite them.
  publish(p, l.combine_flags, moe_a2a_next_flag(flag));
}

void moe_a2a_sanitize_expert_ids(const MoeA2aSanitizeParams& p) {
  const auto* recv = reinterpret_cast<const int32_t*>(p.row + p.layout.recv_counters);
  for (int s = 0; s < p.ep_size; ++s) {
    for (int64_t i = std::max<int64_t>(recv[s], 0); i < p.runtime_max; ++i) {
      std::fill_n(p.ids + (s * p.runtime_max + i) * p.top_k, p.top_k, p.invalid_id);
    }
  }
}

}  // namespace flashinfer::kernels::cpu
