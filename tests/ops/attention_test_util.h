// Helpers shared by the attention tests: a naive fp64 materialized-softmax reference, and a
// builder that scatters dense per-request K/V into a paged cache (shuffled pages, NHD/HND, 5-D
// or (K, V) pair, strided page storage).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "flashinfer/flashinfer.h"
#include "util/test_util.h"
#if FLASHINFER_TEST_HAVE_ORACLES
#include "kernels/cuda/decode_cuda.h"
#endif

namespace flashinfer::testing {

struct RefOptions {
  double sm_scale = 0.0;  // 0: 1/sqrt(dqk)
  double soft_cap = 0.0;
  bool causal = false;
  int64_t window_left = -1;
  double v_scale = 1.0;
  // keep(i, j): custom mask (true = keep), or empty.
  std::function<bool(int64_t, int64_t)> mask;
};

/// q [qo, Hq, Dqk], k [kv, Hkv, Dqk], v [kv, Hkv, Dvo] (row-major doubles). Returns o [qo, Hq,
/// Dvo] and lse [qo, Hq] (base 2, -inf for rows with no visible key).
inline void ref_attention(const std::vector<double>& q, const std::vector<double>& k,
                          const std::vector<double>& v, int64_t qo, int64_t kv, int64_t hq,
                          int64_t hkv, int64_t dqk, int64_t dvo, const RefOptions& opt,
                          std::vector<double>& o, std::vector<double>& lse) {
  o.assign(static_cast<std::size_t>(qo * hq * dvo), 0.0);
  lse.assign(static_cast<std::size_t>(qo * hq), -std::numeric_limits<double>::infinity());
  const double scale = opt.sm_scale > 0 ? opt.sm_scale : 1.0 / std::sqrt(double(dqk));
  const int64_t group = hq / hkv;
  std::vector<double> s(static_cast<std::size_t>(kv));
  std::vector<char> vis(static_cast<std::size_t>(kv));
  for (int64_t i = 0; i < qo; ++i) {
    const int64_t pos = kv - qo + i;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / group;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < kv; ++j) {
        bool keep = true;
        if (opt.mask) {
          keep = opt.mask(i, j);
        } else if (opt.causal && j > pos) {
          keep = false;
        }
        if (opt.window_left >= 0 && j < pos - opt.window_left) keep = false;
        vis[j] = keep;
        if (!keep) continue;
        double dot = 0;
        for (int64_t d = 0; d < dqk; ++d)
          dot += q[(i * hq + h) * dqk + d] * k[(j * hkv + g) * dqk + d];
        double x = dot * scale;
        if (opt.soft_cap > 0) x = opt.soft_cap * std::tanh(x / opt.soft_cap);
        s[j] = x;
        mx = std::max(mx, x);
      }
      if (mx == -std::numeric_limits<double>::infinity()) continue;
      double sum = 0;
      for (int64_t j = 0; j < kv; ++j)
        if (vis[j]) sum += std::exp(s[j] - mx);
      for (int64_t j = 0; j < kv; ++j) {
        if (!vis[j]) continue;
        const double p = std::exp(s[j] - mx) / sum;
        for (int64_t d = 0; d < dvo; ++d)
          o[(i * hq + h) * dvo + d] += p * v[(j * hkv + g) * dvo + d] * opt.v_scale;
      }
      lse[i * hq + h] = (mx + std::log(sum)) / std::log(2.0);
    }
  }
}

/// Tolerance for attention outputs of `dtype` (inputs of that dtype, fp32 accumulation).
inline Tolerance attention_tolerance(DType out) {
  switch (out) {
    case DType::kFloat32:
      return {2e-5, 2e-5};
    case DType::kFloat16:
      return {2e-3, 4e-3};
    default:
      return {1e-2, 2e-2};
  }
}

/// A paged cache holding per-request dense K/V.
struct PagedFixture {
  Tensor cache5;   // 5-D form (when !pair)
  Tensor k_cache;  // pair form
  Tensor v_cache;
  bool pair = false;
  Tensor indptr, indices, last_page_len;  // int32 CPU
  std::vector<int32_t> kv_lens;
  PagedKVCache cache() const {
    return pair ? PagedKVCache(k_cache, v_cache) : PagedKVCache(cache5);
  }
};

inline Tensor int_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kInt32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

/// The page table (indptr, indices, last_page_len) of requests `lens` tokens long over the first
/// pages of each of f's requests (f made with `page_size` and lengths at least `lens`): a re-plan
/// of other lengths over one cache. Padded to `pad_to` requests with requests of no pages and
/// last_page_len 1 (an engine's CUDA-graph padding).
inline std::tuple<Tensor, Tensor, Tensor> first_pages_table(const PagedFixture& f,
                                                            int64_t page_size,
                                                            const std::vector<int32_t>& lens,
                                                            std::size_t pad_to = 0) {
  const int32_t ps = static_cast<int32_t>(page_size);
  const int32_t* ptr = f.indptr.data<int32_t>();
  const int32_t* ids = f.indices.data<int32_t>();
  std::vector<int32_t> indptr{0}, indices, last;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    const int32_t n = (lens[b] + ps - 1) / ps;
    for (int32_t i = 0; i < n; ++i) indices.push_back(ids[ptr[b] + i]);
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(lens[b] - (n - 1) * ps);
  }
  for (std::size_t b = lens.size(); b < pad_to; ++b) {
    indptr.push_back(indptr.back());
    last.push_back(1);
  }
  return {int_tensor(indptr), int_tensor(indices), int_tensor(last)};
}

/// Builds a cache of `dtype` with pages shuffled (seeded), two unused pages, and (strided)
/// page storage with an extra padding page-slot between pages. kv[b] holds request b's K or V
/// as doubles [kv_len, hkv, d] — filled here from the returned tensors so the reference uses
/// exactly the stored (rounded) values.
inline PagedFixture make_paged(const std::vector<int32_t>& kv_lens, int64_t page_size, int64_t hkv,
                               int64_t d, DType dtype, bool hnd, bool pair, uint64_t seed,
                               std::vector<std::vector<double>>& k_out,
                               std::vector<std::vector<double>>& v_out) {
  PagedFixture f;
  f.pair = pair;
  f.kv_lens = kv_lens;
  std::vector<int32_t> indptr{0}, last;
  int64_t pages = 0;
  for (int32_t len : kv_lens) {
    const int64_t n = (len + page_size - 1) / page_size;
    pages += n;
    indptr.push_back(static_cast<int32_t>(pages));
    last.push_back(n == 0 ? 0 : static_cast<int32_t>(len - (n - 1) * page_size));
  }
  const int64_t total_pages = pages + 2;
  std::vector<int32_t> perm(static_cast<std::size_t>(total_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> indices(perm.begin(), perm.begin() + pages);
  f.indptr = int_tensor(indptr);
  f.indices = int_tensor(indices);
  f.last_page_len = int_tensor(last);
  // Page storage: allocate [pages, 3 (2 + padding), ...] and slice so the page stride is not
  // 2 * page_size * hkv * d.
  Shape inner = hnd ? Shape{hkv, page_size, d} : Shape{page_size, hkv, d};
  if (pair) {
    Shape big{total_pages, 2};
    big.insert(big.end(), inner.begin(), inner.end());
    Tensor kb = Tensor::empty(big, dtype);
    kb.uniform_(seed + 1);
    Tensor vb = Tensor::empty(big, dtype);
    vb.uniform_(seed + 2);
    f.k_cache = kb.select(1, 0);
    f.v_cache = vb.select(1, 1);
  } else {
    Shape big{total_pages, 3};
    big.insert(big.end(), inner.begin(), inner.end());
    Tensor b = Tensor::empty(big, dtype);
    b.uniform_(seed + 3);
    f.cache5 = b.slice(1, 0, 2);
  }
  Tensor kc = pair ? f.k_cache : f.cache5.select(1, 0);
  Tensor vc = pair ? f.v_cache : f.cache5.select(1, 1);
  if (hnd) {
    kc = kc.permute({0, 2, 1, 3});
    vc = vc.permute({0, 2, 1, 3});
  }
  k_out.clear();
  v_out.clear();
  for (std::size_t b = 0; b < kv_lens.size(); ++b) {
    std::vector<double> kd, vd;
    for (int64_t t = 0; t < kv_lens[b]; ++t) {
      const int64_t page = indices[indptr[b] + t / page_size];
      const auto kr = kc.select(0, page).select(0, t % page_size).to_double_vector();
      const auto vr = vc.select(0, page).select(0, t % page_size).to_double_vector();
      kd.insert(kd.end(), kr.begin(), kr.end());
      vd.insert(vd.end(), vr.begin(), vr.end());
    }
    k_out.push_back(std::move(kd));
    v_out.push_back(std::move(vd));
  }
  return f;
}

/// Rows [begin, end) of a [rows, ...] double vector with `row` elements each.
/// Launches of the CUDA-core decode kernel (kernels::cuda::batch_decode_launches) so far: the
/// tests tell with it which kernel a call ran on. 0 in a build without the oracles, whose GPU
/// cases skip.
inline uint64_t cuda_core_decode_launches() {
#if FLASHINFER_TEST_HAVE_ORACLES
  return kernels::cuda::batch_decode_launches();
#else
  return 0;
#endif
}

inline std::vector<double> rows_of(const std::vector<double>& x, int64_t begin, int64_t end,
                                   int64_t row) {
  return std::vector<double>(x.begin() + begin * row, x.begin() + end * row);
}

/// Rows [lo, hi) of `t` (on any device) NaN in every element: the rows a device-side plan refused.
inline void expect_nan_rows(const Tensor& t, int64_t lo, int64_t hi) {
  const std::vector<double> v =
      t.to(Device::cpu()).slice(0, lo, hi).contiguous().to_double_vector();
  for (std::size_t i = 0; i < v.size(); ++i) {
    ASSERT_TRUE(std::isnan(v[i])) << "element " << i << " of rows " << lo << " .. " << hi;
  }
}

}  // namespace flashinfer::testing

namespace flashinfer::testing {

/// Records every observed call (declaration, arguments, result) like the flight recorder does,
/// and replays them through the declarations' invokers: objects made by __init__ replace the
/// recorded `self` of later calls, matched by id. Returns the replayed results.
class CallCapture : public CallObserver {
 public:
  struct Call {
    const OpDecl* decl;
    std::vector<Value> args;
    Value result;
  };
  std::vector<Call> calls;

  void on_call_begin(const OpDecl& decl, std::span<const Value> args) override {
    calls.push_back({&decl, std::vector<Value>(args.begin(), args.end()), Value()});
  }
  void on_call_end(const OpDecl&, std::span<const Value>, const Value& result) override {
    calls.back().result = result;
  }
  void on_call_error(const OpDecl&, std::span<const Value>, std::string_view) override {}

  std::vector<Value> replay() const {
    std::map<uint64_t, Value> objects;
    std::vector<Value> results;
    for (const Call& c : calls) {
      std::vector<Value> args = c.args;
      if (c.decl->is_method() && !c.decl->is_constructor()) {
        args[0] = objects.at(args[0].as_object().id);
      }
      Value r = c.decl->invoke(CallArgs(*c.decl, args));
      if (c.decl->is_constructor()) objects[c.args[0].as_object().id] = r;
      results.push_back(r);
    }
    return results;
  }
};

}  // namespace flashinfer::testing
