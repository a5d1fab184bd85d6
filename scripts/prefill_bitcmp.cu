// Bit-identity check of the FA2 prefill kernel (batch_prefill_kernel) against another revision
// (scripts/prefill-bitcmp builds it): both kernels on the same inputs, each with its revision's
// tile shapes; outputs compared bitwise, and within a bf16 tolerance where they differ (a changed
// K/V tile rounds P at other running maxima); and the headline shapes timed (kernel only,
// cudaEvent, TFLOP/s over the visible (query, key) pairs and % of 989 dense bf16 TFLOP/s).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bitcmp_util.cuh"
#include "kernels/cuda/prefill_kernel.cuh"
#include "old_kernel.cuh"

// scripts/prefill-bitcmp ... --strict: CLOSE is a failure too.
#ifdef FLASHINFER_BITCMP_STRICT
constexpr bool kStrict = true;
#else
constexpr bool kStrict = false;
#endif

using namespace flashinfer;
using namespace flashinfer::kernels;
using namespace flashinfer::kernels::cuda;

struct Case {
  const char* name;
  int hq, hkv;
  std::vector<int> qo_lens, kv_lens;  // per request, kv >= qo
  bool causal = true;
  int window = -1;
  bool nan_k = false, big = false, split = false, fp8 = false, sinks = false;
  float sm_scale = 0.0f;  // 0: 1 / sqrt(DQK)
  int chunk = 1024;       // split: keys per work item
  bool timing = false;
};

// Whether two device arrays of n values (bf16 bits, or fp32) agree within |a - b| <= tol (1 +
// |a|) + abs_tol, NaN where the other is NaN and infinities equal; prints the largest difference.
template <class E>
static bool close_values(const void* a, const void* b, size_t n, float tol, const char* what,
                         float abs_tol = 0.0f) {
  std::vector<E> ha(n), hb(n);
  CK(cudaMemcpy(ha.data(), a, n * sizeof(E), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hb.data(), b, n * sizeof(E), cudaMemcpyDeviceToHost));
  auto value = [](E x) {
    if constexpr (sizeof(E) == 2) {
      const uint32_t u = static_cast<uint32_t>(x) << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    } else {
      return x;
    }
  };
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const float x = value(ha[i]), y = value(hb[i]);
    if (std::isnan(x) || std::isnan(y) || std::isinf(x) || std::isinf(y)) {
      const bool same = (std::isnan(x) && std::isnan(y)) || x == y;
      bad += same ? 0 : 1;
      continue;
    }
    const double d = std::fabs(static_cast<double>(x) - y);
    worst = std::max(worst, d);
    bad += d <= tol * (1.0 + std::fabs(x)) + abs_tol ? 0 : 1;
  }
  printf("  %s: max |diff| %.3g%s\n", what, worst, bad ? "" : " (within tolerance)");
  if (bad) printf("  %s: %zu of %zu values outside tolerance %.3g\n", what, bad, n, tol);
  return bad == 0;
}

// Both kernels at one instance (kCtaQ rows a block, variant V), K/V of TKV (bf16, or fp8 bytes
// read as e4m3), head dims DQK / DVO.
template <class TKV, int DQK, int DVO, int kCtaQ, int V>
bool run_case(const Case& c) {
  constexpr int PS = 16;
  using T = __nv_bfloat16;
  const int B = static_cast<int>(c.kv_lens.size());
  const int group = c.hq / c.hkv;
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, kv_lens;
  int pages = 0;
  double pairs = 0;
  for (int b = 0; b < B; ++b) {
    const int qo = c.qo_lens[b], kv = c.kv_lens[b];
    qo_indptr.push_back(qo_indptr.back() + qo);
    const int np = (kv + PS - 1) / PS;
    kv_indptr.push_back(kv_indptr.back() + np);
    kv_lens.push_back(kv);
    pages += np;
    for (int i = 0; i < qo; ++i) {  // visible keys of query i (causal, window)
      const int pos = kv - qo + i;
      const int hi = c.causal ? pos + 1 : kv;
      const int lo = c.window >= 0 ? std::max(0, pos - c.window) : 0;
      pairs += std::max(0, hi - lo);
    }
  }
  for (int i = 0; i < pages; ++i) kv_indices.push_back(i);
  for (int i = pages - 1; i > 0; --i) std::swap(kv_indices[i], kv_indices[rnd() % (i + 1)]);
  const int rows = qo_indptr.back();
  const float qs = c.big ? 6.0f : 1.0f;
  std::vector<uint16_t> q(static_cast<size_t>(rows) * c.hq * DQK);
  for (auto& x : q) x = bf(nrm() * qs);
  const size_t kn = static_cast<size_t>(pages) * PS * c.hkv * DQK;
  const size_t vn = static_cast<size_t>(pages) * PS * c.hkv * DVO;
  std::vector<uint8_t> kraw(kn * sizeof(TKV)), vraw(vn * sizeof(TKV));
  if (sizeof(TKV) == 2) {
    auto* k16 = reinterpret_cast<uint16_t*>(kraw.data());
    auto* v16 = reinterpret_cast<uint16_t*>(vraw.data());
    for (size_t i = 0; i < kn; ++i) k16[i] = bf(nrm() * qs);
    for (size_t i = 0; i < vn; ++i) v16[i] = bf(nrm());
    if (c.nan_k) k16[rnd() % (kn / 4)] = 0x7fc0;
  } else {
    for (auto& x : kraw) x = static_cast<uint8_t>(rnd() & 0xff);
    for (auto& x : vraw) x = static_cast<uint8_t>(rnd() & 0xff);
    for (auto& x : kraw) x = (x & 0x7f) == 0x7f ? x & 0xfe : x;  // no NaN unless asked
    for (auto& x : vraw) x = (x & 0x7f) == 0x7f ? x & 0xfe : x;
    if (c.nan_k) kraw[rnd() % (kn / 4)] = 0x7f;
  }
  // Custom mask: random bits of each request's qo x kv.
  std::vector<int64_t> mask_indptr{0};
  std::vector<uint32_t> mask_words;
  if constexpr ((V & prefill::kPrefillCustomMask) != 0) {
    int64_t bits = 0;
    for (int b = 0; b < B; ++b) {
      bits += static_cast<int64_t>(c.qo_lens[b]) * c.kv_lens[b];
      mask_indptr.push_back(bits);
    }
    mask_words.resize(static_cast<size_t>(bits / 32 + 2));
    for (auto& w : mask_words) w = rnd() | rnd() << 21;
  }
  // Work: whole requests, or chunks of `chunk` keys with partial rows.
  std::vector<WorkItem> work;
  int64_t prow = 0;
  int max_rows = 0;
  for (int b = 0; b < B; ++b) {
    const int L = c.kv_lens[b], qo = c.qo_lens[b];
    max_rows = std::max(max_rows, qo);
    if (!c.split) {
      work.push_back({b, 0, qo, 0, L, -1});
    } else {
      for (int k0 = 0; k0 < L; k0 += c.chunk) {
        work.push_back({b, 0, qo, k0, std::min(L, k0 + c.chunk), static_cast<int32_t>(prow)});
        prow += qo;
      }
    }
  }
  AttentionParams p{};
  p.q = dev_copy(q);
  p.q_dtype = DType::kBFloat16;
  p.q_stride_n = static_cast<int64_t>(c.hq) * DQK;
  p.q_stride_h = DQK;
  p.kv.k = dev_copy(kraw);
  p.kv.v = dev_copy(vraw);
  p.kv.dtype = sizeof(TKV) == 2 ? DType::kBFloat16 : DType::kFloat8E4M3FN;
  p.kv.k_stride_page = static_cast<int64_t>(PS) * c.hkv * DQK;
  p.kv.v_stride_page = static_cast<int64_t>(PS) * c.hkv * DVO;
  p.kv.k_stride_token = static_cast<int64_t>(c.hkv) * DQK;
  p.kv.v_stride_token = static_cast<int64_t>(c.hkv) * DVO;
  p.kv.k_stride_head = DQK;
  p.kv.v_stride_head = DVO;
  p.kv.kv_indptr = dev_copy(kv_indptr);
  p.kv.kv_indices = dev_copy(kv_indices);
  p.kv.page_size = PS;
  const size_t on = static_cast<size_t>(rows) * c.hq * DVO, ln = static_cast<size_t>(rows) * c.hq;
  const size_t tvn = static_cast<size_t>(prow + 1) * c.hq * DVO,
               tsn = static_cast<size_t>(prow + 1) * c.hq;
  uint16_t *o1 = dev_poisoned<uint16_t>(on), *o2 = dev_poisoned<uint16_t>(on);
  float *l1 = dev_poisoned<float>(ln), *l2 = dev_poisoned<float>(ln);
  float *tv1 = dev_poisoned<float>(tvn), *tv2 = dev_poisoned<float>(tvn);
  float *ts1 = dev_poisoned<float>(tsn), *ts2 = dev_poisoned<float>(tsn);
  p.o_dtype = DType::kBFloat16;
  p.o_stride_n = static_cast<int64_t>(c.hq) * DVO;
  p.o_stride_h = DVO;
  p.lse_stride_n = c.hq;
  p.lse_stride_h = 1;
  p.batch = B;
  p.num_qo_heads = c.hq;
  p.num_kv_heads = c.hkv;
  p.head_dim_qk = DQK;
  p.head_dim_vo = DVO;
  p.qo_indptr = dev_copy(qo_indptr);
  p.kv_lens = dev_copy(kv_lens);
  p.sm_scale = c.sm_scale > 0.0f ? c.sm_scale : 1.0f / std::sqrt(static_cast<float>(DQK));
  p.sm_scale_log2 = p.sm_scale * 1.44269504088896341f;  // what launch_fa2 sets, and the split
  const dev::FastDivmod split(static_cast<uint32_t>(PS));
  p.kv_page_div_mul = split.mul;
  p.kv_page_div_shift = split.shift;
  p.logits_soft_cap = (V & prefill::kPrefillSoftCap) ? 30.0f : 0.0f;
  p.v_scale = 1.0f;
  p.causal = c.causal;
  p.window_left = c.window;
  if (!mask_words.empty()) {
    p.custom_mask = reinterpret_cast<const uint8_t*>(dev_copy(mask_words));
    p.mask_indptr = dev_copy(mask_indptr);
  }
  std::vector<float> per_head(static_cast<size_t>(c.hq));
  for (auto& x : per_head) x = 0.5f + (rnd() % 1000) / 1000.0f;
  if (c.sinks) p.sinks = dev_copy(per_head);
  if constexpr ((V & prefill::kPrefillAlibi) != 0) {
    std::vector<float> slopes(static_cast<size_t>(c.hq));
    for (int h = 0; h < c.hq; ++h) slopes[h] = std::exp2(-8.0f * (h + 1) / c.hq);
    p.alibi_slopes = dev_copy(slopes);
  }
  p.work = dev_copy(work);
  p.num_work = static_cast<int32_t>(work.size());
  p.max_work_rows = max_rows;
  const int64_t packed = static_cast<int64_t>(max_rows) * group;
  const dim3 grid(p.num_work, c.hkv, static_cast<unsigned>((packed + kCtaQ - 1) / kCtaQ));
  // The new kernel's grid: KV heads along x, work items from the last along y (session 36).
  const dim3 grid_new(c.hkv, p.num_work, grid.z);
  // Each kernel with its own revision's shapes: shared memory and K/V tile.
  const unsigned smem_old = prefill_old::prefill_smem_bytes(kCtaQ, DQK, DVO);
  const unsigned smem = prefill::prefill_smem_bytes(kCtaQ, DQK, DVO);
  const int tile_old = prefill_old::prefill_kv_tile(kCtaQ, DQK, DVO);
  const int tile_new = prefill::prefill_kv_tile(kCtaQ, DQK, DVO);
  auto k_old = prefill_old::batch_prefill_kernel<T, TKV, DQK, DVO, kCtaQ, V>;
  auto k_new = prefill::batch_prefill_kernel<T, TKV, DQK, DVO, kCtaQ, V>;
  CK(cudaFuncSetAttribute(k_old, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_old));
  CK(cudaFuncSetAttribute(k_new, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  AttentionParams pa = p, pb = p;
  pa.o = o1, pa.lse = l1, pa.tmp_v = tv1, pa.tmp_s = ts1;
  pb.o = o2, pb.lse = l2, pb.tmp_v = tv2, pb.tmp_s = ts2;
  k_old<<<grid, prefill::kPrefillThreads, smem_old>>>(pa);
  CK(cudaGetLastError());
  k_new<<<grid_new, prefill::kPrefillThreads, smem>>>(pb);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  if (c.timing) {
    const double flops = 2.0 * (DQK + DVO) * pairs * c.hq;
    const auto [t_old, t_new] =
        time_old_new([&] { k_old<<<grid, prefill::kPrefillThreads, smem_old>>>(pa); },
                     [&] { k_new<<<grid_new, prefill::kPrefillThreads, smem>>>(pb); }, 3, 10);
    printf(
        "  TIME %-32s old %.4f ms (%.1f TFLOP/s, %.1f%% of 989)  new %.4f ms (%.1f, %.1f%%)  "
        "speedup %.3f\n",
        c.name, t_old, flops / (t_old * 1e-3) / 1e12, flops / (t_old * 1e-3) / 989e12 * 100, t_new,
        flops / (t_new * 1e-3) / 1e12, flops / (t_new * 1e-3) / 989e12 * 100, t_old / t_new);
  }
  // Bitwise first; where that fails, within a bf16 tolerance (o in bf16, |o| <= 2 here: 2^-8 of
  // it is one rounding; lse in fp32). Against 4ff1c41: bitwise only in the soft-cap and ALiBi
  // blocks; CLOSE where the K/V tile changed (P rounded at other running maxima), in every plain
  // and custom-mask block (session 36: the scale inside the exponent's FFMA, one rounding
  // instead of two) and, since session 35's ex2.approx.ftz, where a probability below 2^-126
  // (now 0) met a sum whose other terms are all 0.
  const bool same_tile = tile_old == tile_new;
  // fp8 K/V here are random bytes: |v| up to 448 (e4m3's largest). Each kernel rounds P to bf16
  // (2^-9 relative) at its own running maxima, so o may move by up to 2 * 2^-9 * 448 = 1.75
  // beyond o's own rounding (seen on an H100, session 39: 2 in o, 0.456 in tmp_v, tile 32 -> 64).
  const float v_abs = sizeof(TKV) == 1 ? 2.0f / 512.0f * 448.0f : 0.0f;
  const bool bitwise =
      c.split ? same_bytes(tv1, tv2, tvn * 4, "tmp_v") && same_bytes(ts1, ts2, tsn * 4, "tmp_s")
              : same_bytes(o1, o2, on * 2, "o") && same_bytes(l1, l2, ln * 4, "lse");
  bool ok = bitwise;
  if (kStrict) {
    // Against a revision with the same arithmetic: bits or nothing (the close_values report
    // still says how far apart they are).
    if (!bitwise && !c.split) close_values<uint16_t>(o1, o2, on, 1.0f / 64, "o");
  } else if (!bitwise && !c.split) {
    ok = close_values<uint16_t>(o1, o2, on, 1.0f / 64, "o", v_abs) &
         close_values<float>(l1, l2, ln, 1e-4f, "lse");
  } else if (!bitwise) {
    ok = close_values<float>(tv1, tv2, tvn - static_cast<size_t>(c.hq) * DVO, 1.0f / 64, "tmp_v",
                             v_abs) &
         close_values<float>(ts1, ts2, tsn - c.hq, 1e-4f, "tmp_s");
  }
  // NaN / -inf statistics (evidence the special paths ran).
  std::vector<float> hl(c.split ? tsn - c.hq : ln);
  CK(cudaMemcpy(hl.data(), c.split ? ts2 : l2, hl.size() * 4, cudaMemcpyDeviceToHost));
  int nan = 0, ninf = 0;
  for (float x : hl) nan += x != x, ninf += x == -INFINITY;
  const char* verdict = bitwise     ? "BIT-IDENTICAL"
                        : !ok       ? "DIFFERENT"
                        : same_tile ? "CLOSE"
                                    : "CLOSE (tile changed)";
  printf(
      "%-34s D%d/%d rows %d variant %d, keys %d -> %d a tile, grid %ux%ux%u: %s (lse NaN %d, "
      "-inf %d)\n",
      c.name, DQK, DVO, kCtaQ, V, tile_old, tile_new, grid.x, grid.y, grid.z, verdict, nan, ninf);
  for (void* x : {(void*)o1, (void*)o2, (void*)l1, (void*)l2, (void*)tv1, (void*)tv2, (void*)ts1,
                  (void*)ts2, (void*)p.q, (void*)p.kv.k, (void*)p.kv.v}) {
    CK(cudaFree(x));
  }
  return ok;
}

int main() {
  constexpr int kCap = prefill::kPrefillSoftCap, kMask = prefill::kPrefillCustomMask,
                kAlibi = prefill::kPrefillAlibi;
  using BF = __nv_bfloat16;
  bool ok = true;
  // Ragged batches: queries 1-300 over keys up to 4100 (edge tiles, short rows, long ones).
  const std::vector<int> qo{300, 7, 129, 64, 1}, kv{300, 2049, 4100, 700, 17};
  const std::vector<int> qo16{1, 1, 2, 1}, kv16{17, 2049, 300, 4100};
  ok &= run_case<BF, 128, 128, 128, 0>({"bf16 32:8 causal", 32, 8, qo, kv});
  {
    Case c{"bf16 32:8 big logits", 32, 8, qo, kv};
    c.big = true;
    ok &= run_case<BF, 128, 128, 128, 0>(c);
    c.name = "bf16 32:8 nan K", c.big = false, c.nan_k = true;
    ok &= run_case<BF, 128, 128, 128, 0>(c);
    // Per-head device scales run on the CUDA-core kernel since session 36 (prefill_scale_folds).
    c.name = "bf16 32:8 not causal, scale 0.3", c.nan_k = false, c.causal = false;
    c.sm_scale = 0.3f;
    ok &= run_case<BF, 128, 128, 128, 0>(c);
    c.name = "bf16 32:8 window 100, sinks", c.causal = true, c.sm_scale = 0.0f;
    c.window = 100, c.sinks = true;
    ok &= run_case<BF, 128, 128, 128, 0>(c);
    c.name = "bf16 32:8 split", c.window = -1, c.sinks = false, c.split = true;
    ok &= run_case<BF, 128, 128, 128, 0>(c);
  }
  ok &= run_case<BF, 128, 128, 64, 0>({"bf16 8:8 (64 rows)", 8, 8, qo, kv});
  {
    Case c{"bf16 32:8 softcap big", 32, 8, qo, kv};
    c.big = true;
    ok &= run_case<BF, 128, 128, 64, kCap>(c);
    c.name = "bf16 32:8 mask";
    ok &= run_case<BF, 128, 128, 64, kMask>(c);
    c.name = "bf16 32:8 softcap mask split", c.split = true;
    ok &= run_case<BF, 128, 128, 64, kCap | kMask>(c);
    c.name = "bf16 32:8 alibi", c.split = false;
    ok &= run_case<BF, 128, 128, 64, kAlibi>(c);
  }
  ok &= run_case<BF, 64, 64, 128, 0>({"bf16 D64 32:32", 32, 32, qo, kv});
  ok &= run_case<BF, 256, 256, 64, 0>({"bf16 D256 16:8", 16, 8, qo, kv});
  ok &= run_case<BF, 192, 128, 64, 0>({"bf16 192/128 16:16", 16, 16, qo, kv});
  // fp8 K/V in 64-row blocks: the working tree has no 128-row fp8 block since session 65 (its
  // 128-row work runs in 64-row blocks), and both revisions have the 64-row one.
  ok &= run_case<uint8_t, 128, 128, 64, 0>({"fp8 32:8", 32, 8, qo, kv});
  {
    Case c{"fp8 32:8 nan K split", 32, 8, qo, kv};
    c.nan_k = true, c.split = true;
    ok &= run_case<uint8_t, 128, 128, 64, 0>(c);
  }
  // 16-row blocks (tensor-core decode: the GQA group packed into the rows).
  ok &= run_case<BF, 128, 128, 16, 0>({"TC decode 32:8", 32, 8, qo16, kv16});
  ok &= run_case<BF, 128, 128, 16, kCap>({"TC decode 64:8 softcap", 64, 8, qo16, kv16});
  ok &= run_case<uint8_t, 128, 128, 16, 0>({"TC decode fp8 32:8", 32, 8, qo16, kv16});
  // Timed: issue 45's headline and the chunked-prefill shape; tensor-core decode at batch 64.
  {
    Case t{"b1 qo=kv 8192 causal 32:8", 32, 8, {8192}, {8192}};
    t.timing = true;
    ok &= run_case<BF, 128, 128, 128, 0>(t);
    t.name = "b1 qo=kv 8192 causal 32:32 D64", t.hkv = 32;
    ok &= run_case<BF, 64, 64, 128, 0>(t);
    Case u{"b8 qo 256 kv 4096 causal 32:8", 32, 8, std::vector<int>(8, 256),
           std::vector<int>(8, 4096)};
    u.timing = true;
    ok &= run_case<BF, 128, 128, 128, 0>(u);
    Case d{"TC decode b64 kv2048 32:8", 32, 8, std::vector<int>(64, 1), std::vector<int>(64, 2048)};
    d.timing = true;
    ok &= run_case<BF, 128, 128, 16, 0>(d);
  }
  printf(ok ? (kStrict
                   ? "ALL PASS (bit-identical)\n"
                   : "ALL PASS (bit-identical, or within the bf16 tolerance where marked CLOSE)\n")
            : "MISMATCH\n");
  return ok ? 0 : 1;
}
