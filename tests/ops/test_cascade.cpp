// State merges: merge_state, merge_state_in_place, merge_states against the formula, -inf
// states, and the identity "attention over split keys, merged == attention over all keys".
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// fp64 merge of n states of one (row, head).
void ref_merge(const std::vector<std::vector<double>>& v, const std::vector<double>& s,
               std::vector<double>& vo, double& so) {
  const std::size_t d = v[0].size();
  double m = -kInf;
  for (double x : s) m = std::max(m, x);
  vo.assign(d, 0.0);
  if (m == -kInf) {
    so = -kInf;
    return;
  }
  double sum = 0;
  for (std::size_t k = 0; k < s.size(); ++k) {
    const double w = std::exp2(s[k] - m);
    sum += w;
    for (std::size_t i = 0; i < d; ++i) vo[i] += w * v[k][i];
  }
  for (auto& x : vo) x /= sum;
  so = m + std::log2(sum);
}

// s values with -inf in a few places (row 1 fully -inf for every head and state).
Tensor make_lse(int64_t seq, int64_t n, int64_t h, uint64_t seed) {
  Tensor s = Tensor::empty({seq, n, h}, DType::kFloat32).uniform_(seed, -4.0, 4.0);
  float* p = s.data<float>();
  for (int64_t k = 0; k < n * h; ++k) p[1 * n * h + k] = -INFINITY;
  if (seq > 2) p[2 * n * h + 0] = -INFINITY;  // row 2: first state of head 0 empty
  return s;
}

TEST(MergeStates, MatchesFormulaWithEmptyStates) {
  const int64_t seq = 5, n = 3, h = 2, d = 64;
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    Tensor v = Tensor::empty({seq, n, h, d}, dt).uniform_(1);
    Tensor s = make_lse(seq, n, h, 2);
    auto [vo, so] = merge_states(v, s);
    ASSERT_EQ(vo.shape(), (Shape{seq, h, d}));
    ASSERT_EQ(so.shape(), (Shape{seq, h}));
    const auto vd = v.to_double_vector(), sd = s.to_double_vector();
    std::vector<double> ev, es;
    for (int64_t r = 0; r < seq; ++r) {
      for (int64_t hh = 0; hh < h; ++hh) {
        std::vector<std::vector<double>> vs;
        std::vector<double> ss;
        for (int64_t k = 0; k < n; ++k) {
          const auto off = ((r * n + k) * h + hh) * d;
          vs.emplace_back(vd.begin() + off, vd.begin() + off + d);
          ss.push_back(sd[(r * n + k) * h + hh]);
        }
        std::vector<double> o;
        double so_ref;
        ref_merge(vs, ss, o, so_ref);
        ev.insert(ev.end(), o.begin(), o.end());
        es.push_back(so_ref);
      }
    }
    EXPECT_TRUE(testing::all_close(vo, ev, testing::default_tolerance(dt))) << dtype_name(dt);
    EXPECT_TRUE(testing::all_close(so, es, {1e-5, 1e-6})) << dtype_name(dt);
  }
}

TEST(MergeState, HandChecked) {
  // Equal LSEs: plain average, LSE + 1. One -inf side: the other side unchanged.
  Tensor va = Tensor::from_vector({1, 2, 3, 4}, {2, 1, 2}, DType::kFloat32);
  Tensor vb = Tensor::from_vector({3, 6, 5, 6}, {2, 1, 2}, DType::kFloat32);
  Tensor sa = Tensor::from_vector({0.5, -kInf}, {2, 1}, DType::kFloat32);
  Tensor sb = Tensor::from_vector({0.5, 2.0}, {2, 1}, DType::kFloat32);
  auto [v, s] = merge_state(va, sa, vb, sb);
  EXPECT_EQ(v.to_double_vector(), (std::vector<double>{2, 4, 5, 6}));
  EXPECT_EQ(s.to_double_vector(), (std::vector<double>{1.5, 2.0}));
  // Both empty: zeros and -inf, never NaN.
  Tensor se = Tensor::full({2, 1}, -kInf, DType::kFloat32);
  auto [v2, s2] = merge_state(va, se, vb, se);
  EXPECT_EQ(v2.to_double_vector(), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(s2.to_double_vector(), (std::vector<double>{-kInf, -kInf}));
}

// Upstream's rules (0.7.4 cascade.cuh / state.cuh, kernels/merge_rules.h) beyond the formula:
// a NaN LSE weighs 0 (fmaxf drops it), a state of weight 0 is still multiplied in (0 * NaN = NaN),
// one stacked state is copied through whatever its LSE, none gives 0 and -inf.
// The edge cases below on `dev`, each output in turn: merge_state (fp32 and bf16: v, s), then
// merge_states with one, no and three states (v, s each).
std::vector<Tensor> merge_edge_cases(Device dev) {
  const double nan = std::nan("");
  std::vector<Tensor> out;
  // Rows: (NaN LSE, 0); (both NaN); (-inf with a NaN v, 1); (-inf, -inf).
  Tensor va = Tensor::from_vector({1, 2, 3, 4, nan, 1, 9, 9}, {4, 1, 2}, DType::kFloat32);
  Tensor vb = Tensor::from_vector({5, 6, 7, 8, 2, 3, 4, 5}, {4, 1, 2}, DType::kFloat32);
  Tensor sa = Tensor::from_vector({nan, nan, -kInf, -kInf}, {4, 1}, DType::kFloat32).to(dev);
  Tensor sb = Tensor::from_vector({0, nan, 1, -kInf}, {4, 1}, DType::kFloat32).to(dev);
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    auto [v, s] = merge_state(va.to(dt).to(dev), sa, vb.to(dt).to(dev), sb);
    Tensor vi = va.to(dt).to(dev), si = sa.clone();
    merge_state_in_place(vi, si, vb.to(dt).to(dev), sb);
    EXPECT_TRUE(testing::same_values(vi, v)) << dtype_name(dt);  // in place: the same rules
    EXPECT_TRUE(testing::same_values(si, s)) << dtype_name(dt);
    out.push_back(v.to(Device::cpu()));
    out.push_back(s.to(Device::cpu()));
  }
  Tensor v1 = Tensor::from_vector({1, 2, 3, 4}, {2, 1, 1, 2}, DType::kFloat16).to(dev);
  Tensor s1 = Tensor::from_vector({-kInf, nan}, {2, 1, 1}, DType::kFloat32).to(dev);
  Tensor v0 = Tensor::zeros({2, 0, 1, 2}, DType::kFloat16).to(dev);
  Tensor s0 = Tensor::zeros({2, 0, 1}, DType::kFloat32).to(dev);
  Tensor v3 =
      Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 3, 1, 2}, DType::kFloat32)
          .to(dev);
  Tensor s3 =
      Tensor::from_vector({0, nan, 0, -kInf, -kInf, -kInf}, {2, 3, 1}, DType::kFloat32).to(dev);
  for (auto [v, s] : {std::pair{v1, s1}, std::pair{v0, s0}, std::pair{v3, s3}}) {
    auto [vo, so] = merge_states(v, s);
    out.push_back(vo.to(Device::cpu()));
    out.push_back(so.to(Device::cpu()));
  }
  return out;
}

// Upstream's rules (0.7.4 cascade.cuh / state.cuh, kernels/merge_rules.h) beyond the formula:
// a NaN LSE weighs 0 (fmaxf drops it), a state of weight 0 is still multiplied in (0 * NaN = NaN),
// one stacked state is copied through whatever its LSE, none gives 0 and -inf.
TEST(MergeState, UpstreamRulesForNaNAndEmptyStates) {
  const std::vector<Tensor> r = merge_edge_cases(Device::cpu());
  for (int i : {0, 2}) {  // merge_state, fp32 then bf16
    const auto vv = r[i].to_double_vector(), sv = r[i + 1].to_double_vector();
    EXPECT_EQ(vv[0], 5);  // row 0: the NaN LSE weighs 0
    EXPECT_EQ(vv[1], 6);
    EXPECT_EQ(sv[0], 0);
    EXPECT_EQ(vv[2], 0);  // row 1: both NaN: weights 0, v 0, LSE NaN
    EXPECT_EQ(vv[3], 0);
    EXPECT_TRUE(std::isnan(sv[1]));
    EXPECT_TRUE(std::isnan(vv[4]));  // row 2: 0 * NaN poisons the element ...
    EXPECT_EQ(vv[5], 3);             // ... and only it
    EXPECT_EQ(sv[2], 1);
    EXPECT_EQ(vv[6], 0);  // row 3: both empty: 0 and -inf
    EXPECT_EQ(vv[7], 0);
    EXPECT_EQ(sv[3], -kInf);
  }
  // merge_states: one state copied through (its v, its LSE: -inf, NaN).
  EXPECT_EQ(r[4].to_double_vector(), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(r[5].to_double_vector()[0], -kInf);
  EXPECT_TRUE(std::isnan(r[5].to_double_vector()[1]));
  // No states: 0 and -inf.
  EXPECT_EQ(r[6].to_double_vector(), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(r[7].to_double_vector(), (std::vector<double>{-kInf, -kInf}));
  // Three: the NaN LSE weighs 0 (the mean of the other two, LSE log2(2)); all -inf: 0 and -inf.
  EXPECT_EQ(r[8].to_double_vector(), (std::vector<double>{3, 4, 0, 0}));
  EXPECT_EQ(r[9].to_double_vector(), (std::vector<double>{1, -kInf}));
}

TEST(MergeStateInPlace, MaskSkipsRows) {
  const int64_t seq = 4, h = 3, d = 128;
  Tensor v = Tensor::empty({seq, h, d}, DType::kFloat16).uniform_(5);
  Tensor vo = Tensor::empty({seq, h, d}, DType::kFloat16).uniform_(6);
  Tensor s = Tensor::empty({seq, h}, DType::kFloat32).uniform_(7, -2, 2);
  Tensor so = Tensor::empty({seq, h}, DType::kFloat32).uniform_(8, -2, 2);
  auto [ev, es] = merge_state(v, s, vo, so);
  Tensor mask = Tensor::from_vector({1, 0, 1, 0}, {seq}, DType::kBool);
  Tensor v0 = v.clone(), s0 = s.clone();
  merge_state_in_place(v, s, vo, so, mask);
  for (int64_t r = 0; r < seq; ++r) {
    const bool merged = r % 2 == 0;
    EXPECT_EQ(v.select(0, r).to_double_vector(), (merged ? ev : v0).select(0, r).to_double_vector())
        << r;
    EXPECT_EQ(s.select(0, r).to_double_vector(), (merged ? es : s0).select(0, r).to_double_vector())
        << r;
  }
}

TEST(MergeState, SplitKeysMergeToUnsplit) {
  // Attention over keys [0, 40) and [40, 97) merged equals attention over [0, 97).
  const int64_t qo = 3, kv = 97, hq = 4, hkv = 2, d = 64;
  Tensor q = Tensor::empty({qo, hq, d}, DType::kFloat32).uniform_(1);
  Tensor k = Tensor::empty({kv, hkv, d}, DType::kFloat32).uniform_(2);
  Tensor v = Tensor::empty({kv, hkv, d}, DType::kFloat32).uniform_(3);
  auto [o_all, s_all] = single_prefill_with_kv_cache_return_lse(q, k, v);
  auto [o1, s1] = single_prefill_with_kv_cache_return_lse(q, k.slice(0, 0, 40), v.slice(0, 0, 40));
  auto [o2, s2] =
      single_prefill_with_kv_cache_return_lse(q, k.slice(0, 40, kv), v.slice(0, 40, kv));
  auto [om, sm] = merge_state(o1, s1, o2, s2);
  EXPECT_TRUE(testing::all_close(om, o_all, {2e-6, 2e-5}));
  EXPECT_TRUE(testing::all_close(sm, s_all, {2e-6, 2e-6}));
  // The same with merge_states over a stacked [seq, 2, H, D].
  Tensor vs = Tensor::empty({qo, 2, hq, d}, DType::kFloat32);
  vs.select(1, 0).copy_(o1);
  vs.select(1, 1).copy_(o2);
  Tensor ss = Tensor::empty({qo, 2, hq}, DType::kFloat32);
  ss.select(1, 0).copy_(s1);
  ss.select(1, 1).copy_(s2);
  auto [om2, sm2] = merge_states(vs, ss);
  EXPECT_TRUE(testing::all_close(om2, o_all, {2e-6, 2e-5}));
  EXPECT_TRUE(testing::all_close(sm2, s_all, {2e-6, 2e-6}));
}

TEST(MergeState, BadInput) {
  Tensor v = Tensor::zeros({2, 2, 64}, DType::kFloat16);
  Tensor s = Tensor::zeros({2, 2}, DType::kFloat32);
  EXPECT_FI_ERROR(merge_state(v, s, Tensor::zeros({2, 2, 64}, DType::kBFloat16), s), "merge_state",
                  "v_b");
  EXPECT_FI_ERROR(merge_state(v, s, Tensor::zeros({2, 3, 64}, DType::kFloat16), s), "merge_state",
                  "v_b");
  EXPECT_FI_ERROR(merge_state(v, Tensor::zeros({2, 2}, DType::kInt32), v, s), "merge_state", "s_a");
  EXPECT_FI_ERROR(merge_state(v, s, v, Tensor::zeros({2, 3}, DType::kFloat32)), "merge_state",
                  "s_b");
  EXPECT_FI_ERROR(merge_state(Tensor::zeros({2, 64}, DType::kFloat16), s, v, s), "merge_state",
                  "v_a");
  EXPECT_FI_ERROR(
      merge_state_in_place(v, s, v.clone(), s.clone(), Tensor::zeros({3}, DType::kBool)),
      "merge_state_in_place", "mask");
  EXPECT_FI_ERROR(
      merge_state_in_place(v, s, v.clone(), s.clone(), Tensor::zeros({2}, DType::kUInt8)),
      "merge_state_in_place", "mask");
  EXPECT_FI_ERROR(merge_states(v, s), "merge_states", "v");
  EXPECT_FI_ERROR(merge_states(Tensor::zeros({2, 3, 2, 64}, DType::kFloat16), s), "merge_states",
                  "s");
  EXPECT_FI_ERROR(merge_states(Tensor::zeros({2, 3, 2, 64}, DType::kInt32),
                               Tensor::zeros({2, 3, 2}, DType::kFloat32)),
                  "merge_states", "v");
}

// Upstream's Python widens the LSEs with s.to(torch.float32): 16-bit ones are accepted and
// merged as their fp32 values; in place, the merged LSE goes to that copy, so the caller's
// 16-bit s keeps its values while v is merged.
TEST(MergeState, SixteenBitLsesAreWidenedAndAnInPlaceOneIsLeftAsItWas) {
  Tensor va = Tensor::from_vector({1, 2, 3, 4}, {2, 1, 2}, DType::kFloat32);
  Tensor vb = Tensor::from_vector({3, 6, 5, 6}, {2, 1, 2}, DType::kFloat32);
  Tensor sa = Tensor::from_vector({0.5, -kInf}, {2, 1}, DType::kBFloat16);
  Tensor sb = Tensor::from_vector({0.5, 2.0}, {2, 1}, DType::kFloat16);
  auto [v, s] = merge_state(va, sa, vb, sb);
  EXPECT_EQ(v.to_double_vector(), (std::vector<double>{2, 4, 5, 6}));
  EXPECT_EQ(s.dtype(), DType::kFloat32);
  EXPECT_EQ(s.to_double_vector(), (std::vector<double>{1.5, 2.0}));
  Tensor vi = va.clone(), si = sa.clone();
  merge_state_in_place(vi, si, vb, sb);
  EXPECT_EQ(vi.to_double_vector(), (std::vector<double>{2, 4, 5, 6}));
  EXPECT_EQ(si.to_double_vector(), (std::vector<double>{0.5, -kInf}));
  auto [v2, s2] = merge_states(va.reshape({2, 1, 1, 2}), sa.reshape({2, 1, 1}));
  EXPECT_EQ(s2.dtype(), DType::kFloat32);
  EXPECT_EQ(s2.to_double_vector(), (std::vector<double>{0.5, -kInf}));
}

// ---- declarations, record and replay --------------------------------------------------------

TEST(CascadeDecls, SignaturesMatchUpstreamAndReplay) {
  const std::vector<std::pair<const char*, const char*>> sigs = {
      {"merge_state", "(v_a, s_a, v_b, s_b)"},
      {"merge_state_in_place", "(v, s, v_other, s_other, mask=None)"},
      {"merge_states", "(v, s)"}};
  for (const auto& [name, sig] : sigs) {
    const OpDecl* d = OpRegistry::global().find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->module, "flashinfer.cascade") << name;
    EXPECT_EQ(d->signature(), sig) << name;
  }
  const OpDecl& in_place = *OpRegistry::global().find("merge_state_in_place");
  EXPECT_TRUE(in_place.params[0].mutated && in_place.params[1].mutated);
  EXPECT_FALSE(in_place.params[2].mutated || in_place.params[3].mutated);
  Tensor v = testing::rand_tensor({3, 2, 16}, DType::kFloat16, 1);
  Tensor s = testing::rand_tensor({3, 2}, DType::kFloat32, 2);
  Tensor vo = testing::rand_tensor({3, 2, 16}, DType::kFloat16, 3);
  Tensor so = testing::rand_tensor({3, 2}, DType::kFloat32, 4);
  Tensor vs = testing::rand_tensor({3, 4, 2, 16}, DType::kFloat16, 5);
  Tensor ss = testing::rand_tensor({3, 4, 2}, DType::kFloat32, 6);
  Tensor mask = Tensor::from_vector({1, 0, 1}, {3}, DType::kBool);
  std::vector<testing::RecordingObserver::Call> calls;
  {
    testing::RecordingScope scope;
    merge_state(v, s, vo, so);
    merge_states(vs, ss);
    merge_state_in_place(v, s, vo, so, mask);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 3u);
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(testing::replays_identically(c));
  }
  EXPECT_TRUE(calls[2].result.is_none());
  // merge_state_in_place wrote v and s: the recorded values after differ from before.
  EXPECT_FALSE(testing::same_values(calls[2].after[0], calls[2].inputs[0]));
  EXPECT_FALSE(testing::same_values(calls[2].after[1], calls[2].inputs[1]));
}

}  // namespace
}  // namespace flashinfer

namespace flashinfer {
namespace {

TEST(MergeStatesCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  Tensor v = Tensor::empty({6, 3, 4, 128}, DType::kBFloat16).uniform_(1);
  Tensor s = make_lse(6, 3, 4, 2);
  auto [vr, sr] = merge_states(v, s);
  auto [vg, sg] = merge_states(v.to(Device::cuda()), s.to(Device::cuda()));
  EXPECT_TRUE(testing::all_close(vg, vr, testing::default_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(sg, sr, {1e-5, 1e-6}));
  Tensor a = v.select(1, 0).contiguous(), b = v.select(1, 1).contiguous();
  Tensor sa = s.select(1, 0).contiguous(), sb = s.select(1, 1).contiguous();
  auto [mr, lr] = merge_state(a, sa, b, sb);
  Tensor ag = a.to(Device::cuda()), sag = sa.to(Device::cuda());
  merge_state_in_place(ag, sag, b.to(Device::cuda()), sb.to(Device::cuda()));
  EXPECT_TRUE(testing::all_close(ag, mr, testing::default_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(sag, lr, {1e-5, 1e-6}));
  // With a mask: rows whose mask is false stay untouched.
  Tensor mask = Tensor::from_vector({1, 0, 1, 1, 0, 1}, {6}, DType::kBool);
  Tensor ac = a.clone(), sac = sa.clone();
  merge_state_in_place(ac, sac, b, sb, mask);
  Tensor am = a.to(Device::cuda()), sam = sa.to(Device::cuda());
  merge_state_in_place(am, sam, b.to(Device::cuda()), sb.to(Device::cuda()),
                       mask.to(Device::cuda()));
  EXPECT_TRUE(testing::all_close(am, ac, testing::default_tolerance(DType::kBFloat16)));
  EXPECT_TRUE(testing::all_close(sam, sac, {1e-5, 1e-6}));
  // Upstream's NaN and empty-state rules: the same values as the CPU's.
  const std::vector<Tensor> cpu = merge_edge_cases(Device::cpu());
  const std::vector<Tensor> gpu = merge_edge_cases(Device::cuda());
  ASSERT_EQ(gpu.size(), cpu.size());
  for (std::size_t i = 0; i < cpu.size(); ++i)
    EXPECT_TRUE(testing::same_values(gpu[i], cpu[i])) << i;
}

}  // namespace
}  // namespace flashinfer
