#include "kernels/cpu/prims_ts_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/elem_io.h"

namespace flashinfer::kernels::cpu {
namespace {

using elem_io::load_or_fp32;
using elem_io::store_or_fp32;

bool key_visible(const TsAttentionParams& p, int64_t b, int64_t g, int64_t i, int64_t t) {
  if (p.kv_valid_bits) {
    const uint32_t w = p.kv_valid_bits[b * p.kv_valid_words + t / 32];
    if (((w >> (t % 32)) & 1u) == 0) return false;
  }
  if (p.q_block_size > 0) {
    const int64_t row = (b * p.num_kv_heads + g) * p.num_q_blocks + i / p.q_block_size;
    const int64_t* first = p.block_indices + p.block_begin[row];
    const int64_t* last = p.block_indices + p.block_end[row];
    if (std::find(first, last, t / p.kv_block_size) == last) return false;
  }
  return true;
}

void run_query(const TsAttentionParams& p, int64_t b, int64_t h, int64_t i,
               std::vector<int64_t>& keys, std::vector<float>& s, std::vector<float>& q,
               std::vector<float>& o) {
  const int64_t g = h / (p.num_qo_heads / p.num_kv_heads);
  const int64_t Dk = p.head_dim_qk, Dv = p.head_dim_vo;
  const int64_t kv = p.kv_len[b], ql = p.q_len[b], row = p.q_row0[b] + i;
  const int64_t cur = kv - ql + i;
  int64_t end = kv;
  if (p.causal) end = std::min(end, cur + 1);
  if (p.window_right >= 0) end = std::min(end, cur + p.window_right + 1);
  const int64_t begin = p.window_left >= 0 ? std::max<int64_t>(0, cur - p.window_left) : 0;
  for (int64_t d = 0; d < Dk; ++d) {
    q[d] = load_or_fp32(p.q, p.q_dtype, row * p.q_row_stride + h * p.q_head_stride + d);
  }
  keys.clear();
  for (int64_t t = begin; t < end; ++t) {
    if (key_visible(p, b, g, i, t)) keys.push_back(t);
  }
  auto page_of = [&](int64_t t) { return p.pages[p.page_indptr[b] + t / p.page_size]; };
  s.resize(keys.size());
  float m = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < keys.size(); ++j) {
    const int64_t t = keys[j];
    const int64_t base =
        page_of(t) * p.k_page_stride + (t % p.page_size) * p.k_slot_stride + g * p.k_head_stride;
    float acc = 0.0f;
    for (int64_t d = 0; d < Dk; ++d) acc += q[d] * load_or_fp32(p.k, p.kv_dtype, base + d);
    s[j] = acc * p.bmm1_scale;
    m = std::fmax(m, s[j]);
  }
  const float sink = p.sinks ? p.sinks[h] : -std::numeric_limits<float>::infinity();
  m = std::fmax(m, sink);
  std::fill(o.begin(), o.begin() + Dv, 0.0f);
  float l = 0.0f;
  if (!keys.empty() && std::isfinite(m)) {
    for (size_t j = 0; j < keys.size(); ++j) {
      const int64_t t = keys[j];
      const float e = std::exp(s[j] - m);
      l += e;
      const int64_t base =
          page_of(t) * p.v_page_stride + (t % p.page_size) * p.v_slot_stride + g * p.v_head_stride;
      for (int64_t d = 0; d < Dv; ++d) o[d] += e * load_or_fp32(p.v, p.kv_dtype, base + d);
    }
  }
  if (p.sinks && std::isfinite(m)) l += std::exp(sink - m);
  const bool empty = !(l > 0.0f);
  for (int64_t d = 0; d < Dv; ++d) {
    store_or_fp32(p.o, p.o_dtype, row * p.o_row_stride + h * p.o_head_stride + d,
                  empty ? 0.0f : o[d] / l * p.bmm2_scale);
  }
  if (p.lse) {
    const float e = empty ? -std::numeric_limits<float>::infinity() : m + std::log(l);
    p.lse[row * p.lse_row_stride + h * p.lse_head_stride] =
        p.lse_log2 ? e * 1.4426950408889634f : e;
  }
}

}  // namespace

void prims_ts_attention(const TsAttentionParams& p) {
#pragma omp parallel if (p.batch * p.num_qo_heads > 1)
  {
    std::vector<int64_t> keys;
    std::vector<float> s, q(static_cast<size_t>(p.head_dim_qk)),
        o(static_cast<size_t>(p.head_dim_vo));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < p.num_qo_heads; ++h) {
        for (int64_t i = 0; i < p.q_len[b]; ++i) run_query(p, b, h, i, keys, s, q, o);
      }
    }
  }
}

}  // namespace flashinfer::kernels::cpu
