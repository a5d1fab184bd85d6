// Bit-identity check of the CUDA decode kernel against another revision (scripts/decode-bitcmp
// builds it): both kernels on the same inputs, outputs compared bitwise, and timed.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "bitcmp_util.cuh"
#include "kernels/cuda/attention_decode_kernel.cuh"
#include "old_kernel.cuh"

using namespace flashinfer;
using namespace flashinfer::kernels;
using namespace flashinfer::kernels::cuda;

struct Case {
  const char* name;
  int hq, hkv, qo_len, variant;
  bool fp8, split, nan_k, big, inf_v_masked, causal;
  int window;
  std::vector<int> kv_lens;
  int chunk = 384;  // split: keys per work item
  bool timing = false;
};

template <class TKV, int V, int D = 128>
bool run_case(const Case& c) {
  constexpr int PS = 16;
  const int B = static_cast<int>(c.kv_lens.size());
  const int group = c.hq / c.hkv;
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, kv_lens;
  int pages = 0;
  for (int b = 0; b < B; ++b) {
    qo_indptr.push_back(qo_indptr.back() + c.qo_len);
    const int np = (c.kv_lens[b] + PS - 1) / PS;
    kv_indptr.push_back(kv_indptr.back() + np);
    kv_lens.push_back(c.kv_lens[b]);
    pages += np;
  }
  for (int i = 0; i < pages; ++i) kv_indices.push_back(i);
  for (int i = pages - 1; i > 0; --i) std::swap(kv_indices[i], kv_indices[rnd() % (i + 1)]);
  const int rows = qo_indptr.back();
  const float qs = c.big ? 6.0f : 1.0f;
  std::vector<uint16_t> q(static_cast<size_t>(rows) * c.hq * D);
  for (auto& x : q) x = bf(nrm() * qs);
  const size_t kvn = static_cast<size_t>(pages) * PS * c.hkv * D;
  std::vector<uint8_t> kraw(kvn * sizeof(TKV)), vraw(kvn * sizeof(TKV));
  if (sizeof(TKV) == 2) {
    auto* k16 = reinterpret_cast<uint16_t*>(kraw.data());
    auto* v16 = reinterpret_cast<uint16_t*>(vraw.data());
    for (size_t i = 0; i < kvn; ++i) {
      k16[i] = bf(nrm() * qs);
      v16[i] = bf(nrm());
    }
    if (c.nan_k) k16[(rnd() % (kvn / 4)) * 1] = 0x7fc0;
    // Infinite V elements (bf16 +inf) on ~1 key in 64: with a per-key mask, a row that cannot see
    // the key must skip it (0 * inf would be NaN) while a row that sees it takes the inf. Two rows
    // a thread test each row's probability before its V FMAs: only non-finite V can tell.
    if (c.inf_v_masked) {
      for (size_t t = 0; t < kvn / D; ++t) {
        if (rnd() % 64 == 0) v16[t * D + rnd() % D] = 0x7f80;
      }
    }
  } else {
    for (size_t i = 0; i < kvn; ++i) {
      kraw[i] = static_cast<uint8_t>(rnd() & 0xff);
      if ((kraw[i] & 0x7f) == 0x7f) kraw[i] &= 0xfe;  // no NaN unless asked
      vraw[i] = static_cast<uint8_t>(rnd() & 0xff);
      if ((vraw[i] & 0x7f) == 0x7f) vraw[i] &= 0xfe;
    }
    if (c.nan_k) kraw[rnd() % (kvn / 4)] = 0x7f;
  }
  // Custom mask: random bits; V of masked keys set to inf (bf16) where asked.
  std::vector<int64_t> mask_indptr{0};
  std::vector<uint32_t> mask_words;
  if constexpr ((V & decode::kDecodeMask) != 0) {
    int64_t bits = 0;
    for (int b = 0; b < B; ++b) {
      bits += static_cast<int64_t>(c.qo_len) * c.kv_lens[b];
      mask_indptr.push_back(bits);
    }
    mask_words.resize(static_cast<size_t>(bits / 32 + 2));
    for (auto& w : mask_words) w = rnd() | rnd() << 21;
  }
  // Work: whole requests, or chunks of 384 keys with partial rows.
  std::vector<WorkItem> work;
  int64_t prow = 0;
  for (int b = 0; b < B; ++b) {
    const int L = c.kv_lens[b];
    if (!c.split) {
      work.push_back({b, 0, c.qo_len, 0, L, -1});
    } else {
      for (int k0 = 0; k0 < L; k0 += c.chunk) {
        work.push_back({b, 0, c.qo_len, k0, std::min(L, k0 + c.chunk), static_cast<int32_t>(prow)});
        prow += c.qo_len;
      }
    }
  }
  AttentionParams p{};
  p.q = dev_copy(q);
  p.q_dtype = DType::kBFloat16;
  p.q_stride_n = static_cast<int64_t>(c.hq) * D;
  p.q_stride_h = D;
  p.kv.k = dev_copy(kraw);
  p.kv.v = dev_copy(vraw);
  p.kv.dtype = sizeof(TKV) == 2 ? DType::kBFloat16 : DType::kFloat8E4M3FN;
  p.kv.k_stride_page = p.kv.v_stride_page = static_cast<int64_t>(PS) * c.hkv * D;
  p.kv.k_stride_token = p.kv.v_stride_token = static_cast<int64_t>(c.hkv) * D;
  p.kv.k_stride_head = p.kv.v_stride_head = D;
  p.kv.kv_indptr = dev_copy(kv_indptr);
  p.kv.kv_indices = dev_copy(kv_indices);
  p.kv.page_size = PS;
  const size_t on = static_cast<size_t>(rows) * c.hq * D;
  const size_t tvn = static_cast<size_t>(prow + 1) * c.hq * D,
               tsn = static_cast<size_t>(prow + 1) * c.hq;
  uint16_t *o1 = dev_poisoned<uint16_t>(on), *o2 = dev_poisoned<uint16_t>(on);
  float *l1 = dev_poisoned<float>(rows * c.hq), *l2 = dev_poisoned<float>(rows * c.hq);
  float *tv1 = dev_poisoned<float>(tvn), *tv2 = dev_poisoned<float>(tvn);
  float *ts1 = dev_poisoned<float>(tsn), *ts2 = dev_poisoned<float>(tsn);
  p.o_dtype = DType::kBFloat16;
  p.o_stride_n = static_cast<int64_t>(c.hq) * D;
  p.o_stride_h = D;
  p.lse_stride_n = c.hq;
  p.lse_stride_h = 1;
  p.batch = B;
  p.num_qo_heads = c.hq;
  p.num_kv_heads = c.hkv;
  p.head_dim_qk = p.head_dim_vo = D;
  p.qo_indptr = dev_copy(qo_indptr);
  p.kv_lens = dev_copy(kv_lens);
  p.sm_scale = 0.0883883f;
  p.logits_soft_cap = (V & decode::kDecodeSoftCap) ? 30.0f : 0.0f;
  p.v_scale = 1.0f;
  p.causal = c.causal;
  p.window_left = c.window;
  if (!mask_words.empty()) {
    p.custom_mask = reinterpret_cast<const uint8_t*>(dev_copy(mask_words));
    p.mask_indptr = dev_copy(mask_indptr);
  }
  p.work = dev_copy(work);
  p.num_work = static_cast<int32_t>(work.size());
  p.max_work_rows = c.qo_len;
  // The old kernel: one row a thread (its own shape call, the 4-argument form). The new one: the
  // rows a thread owns as the host launcher chooses them (decode_cuda.cu, shape_of), over the
  // same rows, token groups and tiles a block.
  const int packed = c.qo_len * group;
  const DecodeBlockShape s = decode_block_shape(D, D, sizeof(TKV), packed);
  const int rpt = decode_rows_per_thread(D, D, sizeof(TKV), packed);
  const DecodeBlockShape sn = decode_block_shape(D, D, sizeof(TKV), packed, rpt);
  const dim3 grid(p.num_work, c.hkv, (packed + s.bdy - 1) / s.bdy);
  const dim3 grid_new(p.num_work, c.hkv, (packed + sn.block_rows() - 1) / sn.block_rows());
  if (grid_new.z != grid.z || sn.tile_tokens != s.tile_tokens) {
    printf("%s: the new shape changes the row chunks or tiles\n", c.name);
    return false;
  }
  auto k_old = decode_old::batch_decode_kernel<__nv_bfloat16, TKV, __nv_bfloat16, D, D, V>;
  auto k_new = rpt == 2
                   ? decode::batch_decode_kernel<__nv_bfloat16, TKV, __nv_bfloat16, D, D, V, 2>
                   : decode::batch_decode_kernel<__nv_bfloat16, TKV, __nv_bfloat16, D, D, V, 1>;
  CK(cudaFuncSetAttribute(k_old, cudaFuncAttributeMaxDynamicSharedMemorySize, s.smem_bytes));
  CK(cudaFuncSetAttribute(k_new, cudaFuncAttributeMaxDynamicSharedMemorySize, sn.smem_bytes));
  AttentionParams pa = p, pb = p;
  pa.o = o1, pa.lse = l1, pa.tmp_v = tv1, pa.tmp_s = ts1;
  pb.o = o2, pb.lse = l2, pb.tmp_v = tv2, pb.tmp_s = ts2;
  k_old<<<grid, s.threads(), s.smem_bytes>>>(pa);
  CK(cudaGetLastError());
  k_new<<<grid_new, sn.threads(), sn.smem_bytes>>>(pb);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  if (c.timing) {
    double kv_bytes = 0;
    for (int L : c.kv_lens) kv_bytes += 2.0 * L * c.hkv * D * sizeof(TKV);
    const auto [t_old, t_new] =
        time_old_new([&] { k_old<<<grid, s.threads(), s.smem_bytes>>>(pa); },
                     [&] { k_new<<<grid_new, sn.threads(), sn.smem_bytes>>>(pb); }, 3, 20);
    printf("  TIME %-24s old %.4f ms (%.1f%% of 3.35 TB/s)  new %.4f ms (%.1f%%)  speedup %.3f\n",
           c.name, t_old, kv_bytes / (t_old * 1e-3) / 3.35e12 * 100, t_new,
           kv_bytes / (t_new * 1e-3) / 3.35e12 * 100, t_old / t_new);
  }
  bool ok = same_bytes(o1, o2, on * 2, "o") && same_bytes(l1, l2, rows * c.hq * 4, "lse");
  if (c.split)
    ok = same_bytes(tv1, tv2, tvn * 4, "tmp_v") && same_bytes(ts1, ts2, tsn * 4, "tmp_s") && ok;
  // How many outputs are NaN / zero (evidence the special paths ran).
  std::vector<float> hl(rows * c.hq);
  CK(cudaMemcpy(hl.data(), c.split ? ts2 : l2, hl.size() * 4, cudaMemcpyDeviceToHost));
  int nan = 0, ninf = 0;
  for (float x : hl) nan += x != x, ninf += x == -INFINITY;
  printf(
      "%-28s D%d shape %dx%dx%d threads %d, new %d rows a thread: %dx%dx%d threads %d, grid %u: "
      "%s (lse NaN %d, -inf %d)\n",
      c.name, D, s.bdx, s.bdy, s.bdz, s.threads(), rpt, sn.bdx, sn.bdy, sn.bdz, sn.threads(),
      grid.x, ok ? "BIT-IDENTICAL" : "DIFFERENT", nan, ninf);
  return ok;
}

__global__ void widen_cmp(int* bad) {
  const uint32_t pair = blockIdx.x * blockDim.x + threadIdx.x;  // 0 .. 65535
  if (pair >= 65536) return;
  alignas(4) __nv_fp8_e4m3 four[4];
  alignas(4) __nv_fp8_e4m3 two[2];
  const uint32_t w = pair | (pair << 16);
  memcpy(four, &w, 4);
  memcpy(two, &w, 2);
  float a[4], b[2];
  dev::widen<4>(four, a);
  dev::widen<2>(two, b);
  for (int i = 0; i < 4; ++i)
    if (__float_as_uint(a[i]) != __float_as_uint(b[i % 2])) atomicAdd(bad, 1);
}

int main() {
  bool ok = true;
  const std::vector<int> lens{1, 7, 17, 300, 2049, 4100};
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 32:8", 32, 8, 1, 0, false, false, false, false, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 64:8", 64, 8, 1, 0, false, false, false, false, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 32:32", 32, 32, 1, 0, false, false, false, false, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 32:8 big", 32, 8, 1, 0, false, false, false, true, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 64:8 split", 64, 8, 1, 0, false, true, false, false, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 32:8 nan K", 32, 8, 1, 0, false, false, true, false, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 32:8 window", 32, 8, 1, 0, false, false, false, true, false, false, 100, lens});
  ok &= run_case<__nv_bfloat16, 1>(
      {"bf16 32:8 softcap", 32, 8, 1, 1, false, false, false, true, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 2>(
      {"bf16 32:8 mask q2 causal", 32, 8, 2, 2, false, false, false, true, false, true, -1, lens});
  ok &= run_case<__nv_bfloat16, 2>(
      {"bf16 8:8 mask q3 split", 8, 8, 3, 2, false, true, false, false, false, true, 50, lens});
  ok &= run_case<__nv_fp8_e4m3, 0>(
      {"fp8 32:8", 32, 8, 1, 0, true, false, false, false, false, false, -1, lens});
  ok &= run_case<__nv_fp8_e4m3, 0>(
      {"fp8 64:8 split", 64, 8, 1, 0, true, true, false, false, false, false, -1, lens});
  ok &= run_case<__nv_fp8_e4m3, 0>(
      {"fp8 32:32 nan K", 32, 32, 1, 0, true, false, true, false, false, false, -1, lens});
  // Two rows a thread (groups >= 4, or several queries a block): every variant and head dim.
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 64:8 big", 64, 8, 1, 0, false, false, false, true, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 64:8 nan K", 64, 8, 1, 0, false, false, true, false, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 64:8 window", 64, 8, 1, 0, false, false, false, true, false, false, 100, lens});
  ok &= run_case<__nv_bfloat16, 1>(
      {"bf16 64:8 softcap", 64, 8, 1, 1, false, false, false, true, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 2>(
      {"bf16 64:8 mask q2 causal", 64, 8, 2, 2, false, false, false, true, false, true, -1, lens});
  ok &= run_case<__nv_bfloat16, 3>(
      {"bf16 32:8 softcap mask q3", 32, 8, 3, 3, false, true, false, true, false, true, 60, lens});
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 8:8 q4 (4 rows)", 8, 8, 4, 0, false, false, false, false, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0, 64>(
      {"bf16 D64 64:8", 64, 8, 1, 0, false, false, false, false, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0, 256>(
      {"bf16 D256 64:8 split", 64, 8, 1, 0, false, true, false, false, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 128:8 (group 16)", 128, 8, 1, 0, false, false, false, false, false, false, -1, lens});
  ok &= run_case<__nv_fp8_e4m3, 0>(
      {"fp8 64:8 nan K", 64, 8, 1, 0, true, false, true, false, false, false, -1, lens});
  ok &= run_case<__nv_fp8_e4m3, 2>(
      {"fp8 64:8 mask q2 causal", 64, 8, 2, 2, true, false, false, false, false, true, -1, lens});
  ok &= run_case<__nv_fp8_e4m3, 0, 64>(
      {"fp8 D64 32:8", 32, 8, 1, 0, true, false, false, false, false, false, -1, lens});
  ok &= run_case<__nv_fp8_e4m3, 0, 256>(
      {"fp8 D256 64:8", 64, 8, 1, 0, true, false, false, false, false, false, -1, lens});
  // Two rows a thread, the mappings the cases above leave out: rows of one thread that belong
  // to different queries under a per-key mask (MHA or group 3 with several queries, so causal
  // and window limits differ between the thread's two rows), with inf V where a row's mask hides
  // it; padded rows (group 7: the last thread's second row is idle); a second row chunk whose
  // last threads own no row at all (group 12 at D256: chunks of 8 and 4 rows) and MQA's two
  // chunks of 16.
  ok &= run_case<__nv_bfloat16, 2>({"bf16 8:8 mask q4 causal infV", 8, 8, 4, 2, false, false, false,
                                    false, true, true, -1, lens});
  ok &= run_case<__nv_bfloat16, 2>({"bf16 24:8 mask q2 window infV", 24, 8, 2, 2, false, true,
                                    false, true, true, true, 60, lens});
  ok &= run_case<__nv_fp8_e4m3, 0>(
      {"fp8 56:8 (group 7)", 56, 8, 1, 0, true, false, false, false, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0, 256>({"bf16 D256 96:8 split (group 12)", 96, 8, 1, 0, false,
                                         true, false, false, false, false, -1, lens});
  ok &= run_case<__nv_bfloat16, 0>(
      {"bf16 32:1 (MQA)", 32, 1, 1, 0, false, false, false, true, false, false, -1, lens});
  {
    std::vector<int> b64(64, 2048), b1(1, 32768);
    Case t{"b64 kv2048 32:8", 32, 8, 1, 0, false, false, false, false, false, false, -1, b64};
    t.timing = true;
    ok &= run_case<__nv_bfloat16, 0>(t);
    t.name = "b64 kv2048 64:8", t.hq = 64;
    ok &= run_case<__nv_bfloat16, 0>(t);
    t.name = "b64 kv2048 32:32", t.hq = 32, t.hkv = 32;
    ok &= run_case<__nv_bfloat16, 0>(t);
    Case u{"b1 kv32768 32:8 split", 32, 8, 1, 0, false, true, false, false, false, false, -1, b1};
    u.timing = true, u.chunk = 288;
    ok &= run_case<__nv_bfloat16, 0>(u);
    u.name = "b1 kv32768 64:8 split", u.hq = 64;
    ok &= run_case<__nv_bfloat16, 0>(u);
    u.name = "b1 kv32768 32:32 split", u.hq = 32, u.hkv = 32;
    ok &= run_case<__nv_bfloat16, 0>(u);
    u.name = "fp8 b1 kv32768 64:8 split", u.hq = 64, u.hkv = 8;
    ok &= run_case<__nv_fp8_e4m3, 0>(u);
    t.name = "fp8 b64 kv2048 32:8", t.hq = 32, t.hkv = 8;
    ok &= run_case<__nv_fp8_e4m3, 0>(t);
    t.name = "fp8 b64 kv2048 64:8", t.hq = 64;
    ok &= run_case<__nv_fp8_e4m3, 0>(t);
  }
  int* bad;
  CK(cudaMalloc(&bad, 4));
  CK(cudaMemset(bad, 0, 4));
  widen_cmp<<<256, 256>>>(bad);
  int hbad = -1;
  CK(cudaMemcpy(&hbad, bad, 4, cudaMemcpyDeviceToHost));
  printf("fp8 widen word vs byte path, all 65536 pairs: %d mismatches\n", hbad);
  ok &= hbad == 0;
  printf(ok ? "ALL BIT-IDENTICAL\n" : "MISMATCH\n");
  return ok ? 0 : 1;
}
