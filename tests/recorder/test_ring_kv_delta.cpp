// Ring mode's KV-cache deltas (docs/LOGGING.md "Ring mode"): a paged KV cache that
// append_paged_kv_cache wrote a few rows into is kept as the copy it held before plus the rows
// written, not copied whole per append. A dump must still hold each call's cache exactly as it
// was at that call (later appends into the same pages must not show in it), replay, and be
// written by the crash handler and in the dedup layout alike.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "recorder/recorder_internal.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;

// A cache of pages of 4 tokens, 2 KV heads of 64 fp32 (NHD: [pages, 2, 4, 2, 64], 4 KiB a
// page); two requests, request b owning pages kPages[b] (in that order). An append writes 2 KiB.
constexpr int64_t kPageSize = 4, kHeads = 2, kDim = 64;
const std::vector<std::vector<int32_t>> kPages = {{5, 2, 7}, {0, 3, 6}};

Tensor int32s(const std::vector<int32_t>& v) {
  std::vector<double> d(v.begin(), v.end());
  return Tensor::from_vector(d, {static_cast<int64_t>(d.size())}, DType::kInt32);
}

// K and V rows of one appended token per request, distinct per step, request and element.
Tensor rows(int step, double kv) {
  std::vector<double> v(static_cast<std::size_t>(2 * kHeads * kDim));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = kv * 1000 + step + 0.001 * static_cast<double>(i);
  return Tensor::from_vector(v, {2, kHeads, kDim}, DType::kFloat32);
}

// `v` as every other element of an int32 tensor twice as long (a strided view).
Tensor strided_int32s(const std::vector<int32_t>& v) {
  std::vector<int32_t> twice;
  for (int32_t x : v) twice.insert(twice.end(), {x, -1});
  const Tensor t = int32s(twice);
  return t.slice(0, 0, t.size(0), 2);
}

// Appends one token per request at `position` (the same for both; positions may repeat: an
// earlier slot written again). `strided`: the index tensors are strided views (the ring reads
// contiguous ones in place and copies the others to the host).
void append(const Tensor& cache, int step, int32_t position, const char* layout,
            bool strided = false) {
  const int32_t len = position + 1;
  const int32_t used = (len + kPageSize - 1) / kPageSize;
  std::vector<int32_t> indices, indptr{0}, last;
  for (const auto& pages : kPages) {
    for (int32_t p = 0; p < used; ++p) indices.push_back(pages[static_cast<std::size_t>(p)]);
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(len - (used - 1) * kPageSize);
  }
  const auto ints = strided ? strided_int32s : int32s;
  append_paged_kv_cache(rows(step, 1), rows(step, 2), ints({0, 1}), ints({position, position}),
                        cache, ints(indices), ints(indptr), ints(last), layout);
}

// The positions of the appends: through two pages, then back over earlier slots of a page
// the ring holds copies of.
const std::vector<int32_t> kPositions = {0, 1, 2, 3, 4, 5, 6, 1, 2, 7, 8, 0, 9, 10};

class RingKvDeltaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fi_ring_kv_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    recorder::set_log_sink([](const std::string&) {});
  }
  void TearDown() override {
    recorder::stop();
    recorder::set_log_sink({});
    fs::remove_all(dir_);
  }
  recorder::Config config(bool dedup) const {
    recorder::Config c;
    c.dump_dir = dir_.string();
    c.ring = 64;
    c.dedup = dedup;
    return c;
  }
  // Checks a dump of the appends: every call's input cache is the cache before it and its
  // written cache the cache after it; then replays the dump.
  void check_dump(const fs::path& root, const std::vector<std::vector<double>>& snapshots) {
    const auto calls = replay::list_calls(root.string());
    ASSERT_EQ(calls.size(), kPositions.size());
    for (std::size_t k = 0; k < calls.size(); ++k) {
      const replay::RecordedCall c = replay::load_recorded_call(calls[k]);
      ASSERT_EQ(c.function_name, "append_paged_kv_cache");
      ASSERT_TRUE(c.completed) << calls[k];
      ASSERT_EQ(c.inputs.size(), 8u);
      EXPECT_EQ(c.inputs[4].first, "arg_4");
      EXPECT_EQ(c.inputs[4].second.to_double_vector(), snapshots[k]) << "call " << k << " input";
      ASSERT_EQ(c.mutated.size(), 1u);
      EXPECT_EQ(c.mutated[0].first, "arg_4");
      EXPECT_EQ(c.mutated[0].second.to_double_vector(), snapshots[k + 1])
          << "call " << k << " written";
    }
    for (const auto& r : replay::replay_sequence(root.string())) {
      EXPECT_EQ(r.status, replay::Status::kPassed) << r.dump_dir << " " << r.error;
    }
  }
  // The appends into a cache of 64 pages in `layout` (index tensors as strided views when
  // `strided`): one base and deltas only, and a dump that check_dump accepts.
  void expect_deltas(const char* layout, bool strided);
  fs::path dir_;
};

void run_appends(const Tensor& cache, std::vector<std::vector<double>>& snapshots,
                 const char* layout = "NHD", bool strided = false) {
  snapshots.push_back(cache.to_double_vector());
  for (std::size_t s = 0; s < kPositions.size(); ++s) {
    append(cache, static_cast<int>(s) + 1, kPositions[s], layout, strided);
    snapshots.push_back(cache.to_double_vector());
  }
}

TEST_F(RingKvDeltaTest, EachCallKeepsItsOwnCacheAndTheRingHoldsDeltas) {
  // 8 pages (32 KiB): the rows written since the base pass an eighth of the cache every third
  // append, so the ring takes a new whole copy then; 64 pages (256 KiB): one base, deltas only.
  for (const auto& [dedup, pages] :
       {std::pair{false, 8}, std::pair{true, 8}, std::pair{false, 64}, std::pair{true, 64}}) {
    SCOPED_TRACE(std::string(dedup ? "dedup layout, " : "upstream's layout, ") +
                 std::to_string(pages) + " pages");
    fs::remove_all(dir_);
    recorder::start(config(dedup));
    Tensor cache =
        Tensor::zeros({pages, 2, kPageSize, kHeads, kDim}, DType::kFloat32, Device::cpu());
    std::vector<std::vector<double>> snapshots;
    run_appends(cache, snapshots);
    const uint64_t held = recorder::stats().ring_bytes;
    const fs::path root = recorder::dump_ring("kv");
    recorder::stop();
    // Whole copies would hold the cache once per append and once as the first input (15
    // caches); deltas hold a base and the rows written since it (2 KiB an append, the rows of
    // the earlier appends since the base again in each delta).
    const uint64_t cache_bytes = static_cast<uint64_t>(cache.nbytes());
    EXPECT_LT(held, (pages == 8 ? 9 : 3) * cache_bytes) << held;
    ASSERT_FALSE(root.empty());
    check_dump(root, snapshots);
  }
}

// 150 appends cycling over the same 12 slots of a 256 KiB cache: each delta copies only its own
// rows and points at the earlier ones' (a chain), the rows it overwrites dropped from the
// chain's list; past 128 deltas the ring takes a new base. Every kept call's input and written
// cache is still the cache before and after it, and the replay passes.
TEST_F(RingKvDeltaTest, ALongChainOfDeltasStaysExact) {
  recorder::start(config(false));
  Tensor cache = Tensor::zeros({64, 2, kPageSize, kHeads, kDim}, DType::kFloat32, Device::cpu());
  constexpr int kAppends = 150;
  std::vector<std::vector<double>> snapshots{cache.to_double_vector()};
  for (int s = 0; s < kAppends; ++s) {
    append(cache, s + 1, s % 12, "NHD");
    snapshots.push_back(cache.to_double_vector());
  }
  const uint64_t held = recorder::stats().ring_bytes;
  const fs::path root = recorder::dump_ring("chain");
  recorder::stop();
  // Two bases (the input copy, and a rebase after 128 deltas: 2 x 256 KiB), the chains' rows
  // (2 KiB an append, 150 appends: the kept deltas hold their chains back to the base) and the
  // kept calls' 4 KiB of appended rows as inputs (64 calls): ~1.05 MiB. Deltas that each held
  // every row written since their base (up to 24 KiB here) would hold ~2 MiB.
  EXPECT_LT(held, 1200u * 1024u) << held;
  const auto calls = replay::list_calls(root.string());
  ASSERT_EQ(calls.size(), 64u);
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const std::size_t step = kAppends - calls.size() + k;  // the call's index among the appends
    const replay::RecordedCall c = replay::load_recorded_call(calls[k]);
    ASSERT_EQ(c.inputs.size(), 8u);
    EXPECT_EQ(c.inputs[4].second.to_double_vector(), snapshots[step]) << "call " << step;
    ASSERT_EQ(c.mutated.size(), 1u);
    EXPECT_EQ(c.mutated[0].second.to_double_vector(), snapshots[step + 1]) << "call " << step;
  }
  for (const auto& r : replay::replay_sequence(root.string())) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.dump_dir << " " << r.error;
  }
}

// A ring shorter than the calls between two appends to one cache (a model's layers: each
// cache is appended to once a step, the other layers' calls in between): the delta an append
// kept is retained when its call leaves, so the next append's input shares it and its output is
// a delta of it. Before, the cache was copied whole on every append (and on this model, each
// step copied every layer's cache).
TEST_F(RingKvDeltaTest, ARingShorterThanAStepKeepsDeltasOfTheRetainedCache) {
  recorder::Config cfg = config(false);
  cfg.ring = 2;
  recorder::start(cfg);
  Tensor cache = Tensor::zeros({64, 2, kPageSize, kHeads, kDim}, DType::kFloat32, Device::cpu());
  const Tensor x = Tensor::full({1, 64}, 1.0, DType::kFloat32);
  const Tensor w = Tensor::full({64}, 1.0, DType::kFloat32);
  std::vector<std::vector<double>> snapshots{cache.to_double_vector()};
  std::vector<uint64_t> copied;
  for (std::size_t s = 0; s < kPositions.size(); ++s) {
    const uint64_t before = recorder::stats().ring_copied_bytes;
    append(cache, static_cast<int>(s) + 1, kPositions[s], "NHD");
    copied.push_back(recorder::stats().ring_copied_bytes - before);
    snapshots.push_back(cache.to_double_vector());
    // Two other calls push the append out of the ring.
    for (int i = 0; i < 2; ++i) rmsnorm(x, w, 1e-6);
  }
  const auto cache_bytes = static_cast<uint64_t>(cache.nbytes());
  // The first append copies the cache whole (its input); every later one only the rows it
  // writes and the small index tensors.
  EXPECT_GE(copied[0], cache_bytes);
  for (std::size_t s = 1; s < copied.size(); ++s) {
    EXPECT_LT(copied[s], cache_bytes / 8) << "append " << s;
  }
  EXPECT_GT(recorder::stats().ring_retained_bytes, 0u);
  // The last append's kept cache, before and after it, exactly; it replays.
  append(cache, 99, 11, "NHD");
  snapshots.push_back(cache.to_double_vector());
  const fs::path root = recorder::dump_ring("short");
  recorder::stop();
  const auto calls = replay::list_calls(root.string());
  ASSERT_EQ(calls.size(), 2u);
  const replay::RecordedCall c = replay::load_recorded_call(calls[1]);
  ASSERT_EQ(c.function_name, "append_paged_kv_cache");
  EXPECT_EQ(c.inputs[4].second.to_double_vector(), snapshots[snapshots.size() - 2]);
  EXPECT_EQ(c.mutated[0].second.to_double_vector(), snapshots.back());
  for (const auto& r : replay::replay_sequence(root.string())) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.dump_dir << " " << r.error;
  }
}

void RingKvDeltaTest::expect_deltas(const char* layout, bool strided) {
  fs::remove_all(dir_);
  recorder::start(config(false));
  const Shape shape = std::string(layout) == "HND" ? Shape{64, 2, kHeads, kPageSize, kDim}
                                                   : Shape{64, 2, kPageSize, kHeads, kDim};
  Tensor cache = Tensor::zeros(shape, DType::kFloat32, Device::cpu());
  std::vector<std::vector<double>> snapshots;
  run_appends(cache, snapshots, layout, strided);
  const uint64_t held = recorder::stats().ring_bytes;
  const fs::path root = recorder::dump_ring("kv");
  recorder::stop();
  EXPECT_LT(held, 3 * static_cast<uint64_t>(cache.nbytes())) << held;
  ASSERT_FALSE(root.empty());
  check_dump(root, snapshots);
}

// HND caches ([pages, 2, Hkv, page_size, D]): a token's K (and V) row is one range per head.
TEST_F(RingKvDeltaTest, HndCachesKeepDeltasToo) { expect_deltas("HND", false); }

// Index tensors that are strided views: read through the API's host copy instead of in place,
// and the deltas are the same.
TEST_F(RingKvDeltaTest, StridedIndexTensorsKeepDeltasToo) {
  for (const char* layout : {"NHD", "HND"}) {
    SCOPED_TRACE(layout);
    expect_deltas(layout, true);
  }
}

// The crash handler writes the deltas' bytes too (base and rows laid over, CRCs included).
TEST_F(RingKvDeltaTest, TheCrashHandlerWritesEachCallsCache) {
  for (const bool dedup : {false, true}) {
    SCOPED_TRACE(dedup ? "dedup layout" : "upstream's layout");
    fs::remove_all(dir_);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      recorder::start(config(dedup));
      Tensor cache = Tensor::zeros({8, 2, kPageSize, kHeads, kDim}, DType::kFloat32, Device::cpu());
      std::vector<std::vector<double>> snapshots;
      run_appends(cache, snapshots);
      std::abort();
    }
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));
    fs::path root;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename().string().ends_with("_crash")) root = e.path();
    }
    ASSERT_FALSE(root.empty());
    // The same appends here, unrecorded, give the expected caches.
    Tensor cache = Tensor::zeros({8, 2, kPageSize, kHeads, kDim}, DType::kFloat32, Device::cpu());
    std::vector<std::vector<double>> snapshots;
    run_appends(cache, snapshots);
    check_dump(root, snapshots);
  }
}

}  // namespace
}  // namespace flashinfer
