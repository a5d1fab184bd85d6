// The in-memory test observer (ops/op_test_util.h): a wrapper method replays on an object
// rebuilt from the recorded __init__ and the calls before it, so replay works after the live
// wrapper is destroyed, follows the recorded plan rather than the wrapper's current one, and
// fails with flashinfer::Error naming the call when the __init__ was not recorded.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "flashinfer/ops/batch_attention.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer {
namespace {

using testing::int_tensor;
using Calls = std::vector<testing::RecordingObserver::Call>;

struct Fixture {
  std::vector<std::vector<double>> k, v;
  testing::PagedFixture f =
      testing::make_paged({3, 5}, 2, 2, 64, DType::kBFloat16, false, false, 41, k, v);
  Tensor q = testing::rand_tensor({3, 4, 64}, DType::kBFloat16, 42);
};

void plan(BatchAttention& w, const Fixture& x, bool causal) {
  w.plan(int_tensor({0, 1, 3}), x.f.indptr, x.f.indices, int_tensor({3, 5}), 4, 2, 64, 64, 2,
         causal);
}

void run(BatchAttention& w, const Fixture& x) { w.run(x.q, x.f.cache()); }

TEST(RecordingObserver, ReplaysAfterTheWrapperIsDestroyed) {
  Fixture x;
  Calls calls;
  {
    testing::RecordingScope scope;
    auto w = std::make_unique<BatchAttention>("NHD", "cuda");
    plan(*w, x, true);
    run(*w, x);
    calls = scope.observer().calls;
  }  // the wrapper is gone before any replay
  ASSERT_EQ(calls.size(), 3u);
  ASSERT_EQ(calls[2].name, "BatchAttention.run");
  EXPECT_TRUE(testing::replays_identically(calls[1]));
  EXPECT_TRUE(testing::replays_identically(calls[2]));
  // A freshly allocated object may take the destroyed one's address: still the recorded plan.
  auto other = std::make_unique<BatchAttention>("NHD", "cuda");
  plan(*other, x, false);
  EXPECT_TRUE(testing::replays_identically(calls[2]));
}

// Each run replays under the plan recorded before it, not the wrapper's latest one; a changed
// recorded plan changes the replayed result (the history is what replay runs).
TEST(RecordingObserver, MethodsReplayUnderTheirRecordedPlan) {
  Fixture x;
  Calls calls;
  {
    testing::RecordingScope scope;
    BatchAttention rec("NHD", "cuda");
    plan(rec, x, true);
    run(rec, x);
    plan(rec, x, false);
    run(rec, x);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_FALSE(testing::same_values(calls[2].result, calls[4].result));  // causal matters here
  EXPECT_TRUE(testing::replays_identically(calls[2]));
  EXPECT_TRUE(testing::replays_identically(calls[4]));

  // The causal flag of the first plan, flipped in the shared history: run #1 now replays
  // non-causally and no longer matches its recorded result.
  auto& step = (*calls[1].history)[calls[1].step];
  ASSERT_EQ(step.name, "BatchAttention.plan");
  const int causal = OpRegistry::global().find(step.name)->param_index("causal");
  ASSERT_GT(causal, 0);
  ASSERT_LT(static_cast<std::size_t>(causal), step.inputs.size());
  step.inputs[static_cast<std::size_t>(causal)] = Value(false);
  EXPECT_FALSE(testing::replays_identically(calls[2]));
  const Value replayed = testing::replay(calls[2]).first;
  EXPECT_TRUE(testing::same_values(replayed, calls[4].result));
}

// A wrapper constructed outside the scope has no recorded __init__: replay refuses, naming the
// call, instead of using a pointer to an object it does not own.
TEST(RecordingObserver, MethodWithoutRecordedInitIsAnError) {
  Fixture x;
  Calls calls;
  {
    auto w = std::make_unique<BatchAttention>("NHD", "cuda");
    testing::RecordingScope scope;
    plan(*w, x, true);
    calls = scope.observer().calls;
  }
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].history, nullptr);
  try {
    testing::replay(calls[0]);
    ADD_FAILURE() << "replay without a recorded __init__ did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), "BatchAttention.plan");
    EXPECT_EQ(e.arg(), "self");
  }
}

}  // namespace
}  // namespace flashinfer
