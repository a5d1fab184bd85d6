// Replay of trtllm_gen_routing recordings (docs/MOE.md, "trtllm_gen_routing"): the GPU orders
// the pairs of one expert as its shared-memory atomics ran, so replay compares
// expanded_idx_to_permuted_idx up to that order. A recording rewritten into another valid order
// (junk in the undefined tails) passes; a changed token, or a pair moved into another expert's
// slots, fails.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "flashinfer/tensor_io.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

namespace fs = std::filesystem;

// 9 tokens, 8 experts in two groups (one kept), top-2 DeepSeekV3 plus one fused shared
// expert, tile 4.
fs::path record_routing(const fs::path& dir) {
  fs::remove_all(dir);
  recorder::Config cfg;
  cfg.dump_dir = dir.string();
  recorder::start(cfg);
  (void)trtllm_gen_routing(rand_tensor({9, 8}, DType::kFloat32, 5, -3.0, 3.0), std::nullopt,
                           RoutingMethodType::DeepSeekV3, 2, 1, 2, 1, 0, std::nullopt, 2.5, 4);
  recorder::stop();
  std::vector<fs::path> calls;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) calls.push_back(e.path());
  }
  EXPECT_EQ(calls.size(), 1u);
  return calls.empty() ? fs::path() : calls[0];
}

Tensor* item(NamedTensors& out, const std::string& key) {
  for (auto& [k, t] : out) {
    if (k == key) return &t;
  }
  return nullptr;
}

enum class Edit { kReorder, kWrongToken, kOtherExpertsSlot };

// Rewrites the recorded routing: every expert's pairs take its slots in reverse order (what
// another run of the atomics could give), and the undefined tails of result_4..6 hold junk.
// kWrongToken also changes the token of one used slot; kOtherExpertsSlot swaps the slots of two
// pairs of different experts (result_4 kept consistent).
void rewrite(const fs::path& call, Edit edit) {
  const std::string path = (call / "outputs.pt").string();
  NamedTensors out = load_torch(path);
  Tensor *ids_t = item(out, "result_0"), *e2p_t = item(out, "result_3"),
         *p2t_t = item(out, "result_4"), *total_t = item(out, "result_2"),
         *ctas_t = item(out, "result_7");
  ASSERT_TRUE(ids_t && e2p_t && p2t_t && total_t && ctas_t);
  const int64_t KS = ids_t->size(1), n = e2p_t->numel();
  const auto* ids = ids_t->data<int32_t>();
  auto* e2p = e2p_t->data<int32_t>();
  auto* p2t = p2t_t->data<int32_t>();
  std::map<int32_t, std::vector<int64_t>> pairs;  // expert -> its pairs, in pair order
  for (int64_t i = 0; i < n; ++i) {
    if (e2p[i] >= 0) pairs[ids[i]].push_back(i);
  }
  bool moved = false;
  for (auto& [e, list] : pairs) {
    std::vector<int32_t> slots;
    for (int64_t i : list) slots.push_back(e2p[i]);
    std::sort(slots.rbegin(), slots.rend());
    for (size_t j = 0; j < list.size(); ++j) {
      moved |= e2p[list[j]] != slots[j];
      e2p[list[j]] = slots[j];
      p2t[slots[j]] = static_cast<int32_t>(list[j] / KS);
    }
  }
  ASSERT_TRUE(moved);
  const int32_t total = total_t->data<int32_t>()[0], ctas = ctas_t->data<int32_t>()[0];
  for (int64_t s = total; s < p2t_t->numel(); ++s) p2t[s] = 777;
  for (const char* key : {"result_5", "result_6"}) {
    Tensor* t = item(out, key);
    ASSERT_TRUE(t);
    for (int64_t c = ctas; c < t->numel(); ++c) t->data<int32_t>()[c] = 555;
  }
  if (edit == Edit::kWrongToken) {
    const int32_t s = e2p[0];
    ASSERT_GE(s, 0);
    p2t[s] = (p2t[s] + 1) % 9;
  } else if (edit == Edit::kOtherExpertsSlot) {
    ASSERT_GE(pairs.size(), 2u);
    const int64_t a = pairs.begin()->second[0], b = std::next(pairs.begin())->second[0];
    std::swap(e2p[a], e2p[b]);
    p2t[e2p[a]] = static_cast<int32_t>(a / KS);
    p2t[e2p[b]] = static_cast<int32_t>(b / KS);
  }
  save_torch(path, out);
}

const replay::TensorComparison* comparison(const replay::Result& r, const std::string& prefix) {
  for (const auto& c : r.comparisons) {
    if (c.key.starts_with(prefix)) return &c;
  }
  return nullptr;
}

TEST(TrtllmGenRoutingReplay, ComparesUpToTheOrderWithinAnExpert) {
  const fs::path dir = fs::temp_directory_path() / ("fi_gen_routing_" + std::to_string(::getpid()));
  fs::path call = record_routing(dir);
  replay::Result r = replay::replay_from_dump(call.string());
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error << r.note;
  // Another valid order, junk in the undefined tails: passes, and says what it compared.
  rewrite(call, Edit::kReorder);
  r = replay::replay_from_dump(call.string());
  EXPECT_EQ(r.status, replay::Status::kPassed) << r.error << r.note;
  EXPECT_NE(r.note.find("each expert's set of slots"), std::string::npos) << r.note;
  EXPECT_NE(r.note.find("entries of result_4 (no pair refers to them)"), std::string::npos)
      << r.note;
  for (const char* key : {"result_0", "result_1", "result_2", "result_3", "result_4", "result_5",
                          "result_6", "result_7"}) {
    EXPECT_NE(comparison(r, key), nullptr) << key;
  }
  // A slot holding another token: mismatch on result_4.
  call = record_routing(dir);
  rewrite(call, Edit::kWrongToken);
  r = replay::replay_from_dump(call.string());
  EXPECT_EQ(r.status, replay::Status::kMismatch) << r.note;
  const replay::TensorComparison* c = comparison(r, "result_4");
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->match);
  EXPECT_EQ(c->mismatches, 1);
  // Two pairs of different experts trading slots: mismatch on result_3.
  call = record_routing(dir);
  rewrite(call, Edit::kOtherExpertsSlot);
  r = replay::replay_from_dump(call.string());
  EXPECT_EQ(r.status, replay::Status::kMismatch) << r.note;
  c = comparison(r, "result_3");
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->match);
  EXPECT_GE(c->mismatches, 2);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer::testing
