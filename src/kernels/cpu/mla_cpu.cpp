#include "kernels/cpu/mla_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "kernels/cpu/cpu_row_io.h"
#include "kernels/cpu/elem_io.h"

namespace flashinfer::kernels::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Converts n elements at element offset `off` of `base` to fp32. One switch per row keeps the
// kernel a single instantiation for every (q, kv, o) dtype combination.
void load_f32(const void* base, DType dtype, int64_t off, int64_t n, float* dst) {
  rowio::load_row_dtype(base, dtype, off, n, dst, "mla", "dtype");
}

void store_f32(void* base, DType dtype, int64_t off, int64_t n, const float* src) {
  rowio::store_row_dtype(base, dtype, off, n, src, "mla", "out");
}

// ckv_scale_arr (MlaAttentionParams): the latent row of cache row `slot` dequantized by its
// groups' scales, each product rounded to q's dtype.
void apply_ckv_scale_arr(const MlaAttentionParams& p, int64_t slot, float* ckv) {
  const int64_t groups = p.dim_ckv / 128;
  const float* sc = p.ckv_scale_arr + slot * groups;
  for (int64_t d = 0; d < p.dim_ckv; ++d)
    ckv[d] = elem_io::round_to(p.q_dtype, ckv[d] * sc[d / 128]);
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void mla_attention(const MlaAttentionParams& p) {
  // The dtypes are checked here, outside the parallel region, where an exception may leave.
  float probe = 0.0f;
  load_f32(&probe, p.q_dtype, 0, 0, &probe);
  load_f32(&probe, p.kv_dtype, 0, 0, &probe);
  store_f32(&probe, p.o_dtype, 0, 0, &probe);
  const int64_t rows = p.qo_indptr[p.batch];
  const int64_t H = p.num_heads, dc = p.dim_ckv, dk = p.dim_kpe;
  std::vector<int32_t> row_req(static_cast<std::size_t>(rows));
  for (int32_t b = 0; b < p.batch; ++b) {
    for (int32_t r = p.qo_indptr[b]; r < p.qo_indptr[b + 1]; ++r) row_req[r] = b;
  }
  // Threads only pay off past ~1 MFLOP: below that, waking the team costs more than the work.
  int64_t work = 0;
  for (int32_t b = 0; b < p.batch; ++b) {
    work += int64_t{p.qo_indptr[b + 1] - p.qo_indptr[b]} * p.kv_lens[b];
  }
  work *= H * (2 * dc + dk);
#pragma omp parallel if (work > (int64_t{1} << 20))
  {
    std::vector<float> qn(static_cast<std::size_t>(H * dc)), qp(static_cast<std::size_t>(H * dk));
    std::vector<float> ckv(static_cast<std::size_t>(dc)), kpe(static_cast<std::size_t>(dk));
    std::vector<float> acc(static_cast<std::size_t>(H * dc));
    std::vector<float> s, m(static_cast<std::size_t>(H)), l(static_cast<std::size_t>(H));
#pragma omp for schedule(dynamic, 1)
    for (int64_t row = 0; row < rows; ++row) {
      const int32_t b = row_req[row];
      const int64_t qo_len = p.qo_indptr[b + 1] - p.qo_indptr[b];
      const int64_t kv_len = p.kv_lens[b];
      const int64_t pos = kv_len - qo_len + (row - p.qo_indptr[b]);
      const int64_t end = p.causal ? std::clamp<int64_t>(pos + 1, 0, kv_len) : kv_len;
      for (int64_t h = 0; h < H; ++h) {
        load_f32(p.q_nope, p.q_dtype, row * p.qn_stride_n + h * p.qn_stride_h, dc, &qn[h * dc]);
        load_f32(p.q_pe, p.q_dtype, row * p.qp_stride_n + h * p.qp_stride_h, dk,
                 qp.data() + h * dk);
      }
      s.assign(static_cast<std::size_t>(H * std::max<int64_t>(end, 1)), 0.0f);
      std::fill(m.begin(), m.end(), kNegInf);
      auto page_of = [&](int64_t t) {
        return static_cast<int64_t>(p.kv_indices[p.kv_indptr[b] + t / p.page_size]);
      };
      // Pass 1: scores (each latent row converted once for all heads).
      for (int64_t t = 0; t < end; ++t) {
        const int64_t page = page_of(t), slot = t % p.page_size;
        load_f32(p.ckv, p.kv_dtype, page * p.ckv_stride_page + slot * p.ckv_stride_token, dc,
                 ckv.data());
        if (p.ckv_scale_arr != nullptr)
          apply_ckv_scale_arr(p, page * p.page_size + slot, ckv.data());
        load_f32(p.kpe, p.kv_dtype, page * p.kpe_stride_page + slot * p.kpe_stride_token, dk,
                 kpe.data());
        for (int64_t h = 0; h < H; ++h) {
          const float x = p.sm_scale * (p.ckv_scale * dot(&qn[h * dc], ckv.data(), dc) +
                                        p.kpe_scale * dot(qp.data() + h * dk, kpe.data(), dk));
          s[h * end + t] = x;
          m[h] = std::max(m[h], x);
        }
      }
      // Softmax weights; a head whose scores are all -inf (or NaN) keeps them as they come.
      for (int64_t h = 0; h < H; ++h) {
        float sum = 0.0f;
        for (int64_t t = 0; t < end; ++t) {
          float& x = s[h * end + t];
          x = m[h] == kNegInf ? 0.0f : std::exp(x - m[h]);
          sum += x;
        }
        l[h] = sum;
      }
      // Pass 2: weighted sum of the latent rows.
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t t = 0; t < end; ++t) {
        const int64_t page = page_of(t), slot = t % p.page_size;
        load_f32(p.ckv, p.kv_dtype, page * p.ckv_stride_page + slot * p.ckv_stride_token, dc,
                 ckv.data());
        if (p.ckv_scale_arr != nullptr)
          apply_ckv_scale_arr(p, page * p.page_size + slot, ckv.data());
        for (int64_t h = 0; h < H; ++h) {
          const float w = s[h * end + t];
          float* a = &acc[h * dc];
          for (int64_t d = 0; d < dc; ++d) a[d] += w * ckv[d];
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        const bool empty = end == 0 || l[h] == 0.0f;
        const float f = empty ? 0.0f : p.out_scale * p.ckv_scale / l[h];
        float* a = &acc[h * dc];
        for (int64_t d = 0; d < dc; ++d) a[d] = empty ? 0.0f : a[d] * f;
        store_f32(p.o, p.o_dtype, row * p.o_stride_n + h * p.o_stride_h, dc, a);
        if (p.lse != nullptr) {
          float v = kNegInf;
          if (!empty) v = m[h] + std::log(l[h]);
          if (!p.lse_base_e && !empty) v *= 1.4426950408889634f;
          p.lse[row * p.lse_stride_n + h * p.lse_stride_h] = v;
        }
      }
    }
  }
}

void append_paged_mla_kv_cache(const MlaAppendParams& p) {
  const int64_t es = p.elem_size;
#pragma omp parallel for schedule(static) if (p.nnz * (p.dim_ckv + p.dim_kpe) * es > (1 << 20))
  for (int64_t i = 0; i < p.nnz; ++i) {
    // The host checked the table (api::load_append_targets): every row has its slot.
    const AppendSlot s = append_slot(p.table, i);
    if (s.page < 0) continue;
    const int64_t page = s.page, slot = s.entry;
    std::memcpy(
        static_cast<char*>(p.ckv) + (page * p.ckv_stride_page + slot * p.ckv_stride_token) * es,
        static_cast<const char*>(p.append_ckv) + i * p.ackv_stride_n * es,
        static_cast<std::size_t>(p.dim_ckv * es));
    std::memcpy(
        static_cast<char*>(p.kpe) + (page * p.kpe_stride_page + slot * p.kpe_stride_token) * es,
        static_cast<const char*>(p.append_kpe) + i * p.akpe_stride_n * es,
        static_cast<std::size_t>(p.dim_kpe * es));
  }
}

void concat_mla_k(const ConcatMlaKParams& p) {
  const int64_t es = p.elem_size;
  const int64_t bytes = p.tokens * p.num_heads * (p.nope_dim + p.rope_dim) * es;
#pragma omp parallel for schedule(static) if (bytes > (1 << 20))
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int64_t h = 0; h < p.num_heads; ++h) {
      char* k = static_cast<char*>(p.k) + (t * p.k_stride_t + h * p.k_stride_h) * es;
      std::memcpy(k,
                  static_cast<const char*>(p.k_nope) + (t * p.kn_stride_t + h * p.kn_stride_h) * es,
                  static_cast<std::size_t>(p.nope_dim * es));
      std::memcpy(k + p.nope_dim * es, static_cast<const char*>(p.k_rope) + t * p.kr_stride_t * es,
                  static_cast<std::size_t>(p.rope_dim * es));
    }
  }
}

}  // namespace flashinfer::kernels::cpu
