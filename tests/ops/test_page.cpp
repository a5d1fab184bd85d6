// Paged KV-cache utilities: get_seq_lens, get_batch_indices_positions, append_paged_kv_cache.
#include <gtest/gtest.h>

#include "flashinfer/bench.h"
#include "kernels/page_append_params.h"
#include "ops/attention_test_util.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"
#if FLASHINFER_TEST_HAVE_CUDART
#include "util/cuda_graph_util.h"
#endif

namespace flashinfer {
namespace {

using testing::int_tensor;

std::vector<double> ints(const Tensor& t) { return t.to_double_vector(); }

Tensor idx_tensor(const std::vector<int64_t>& v, DType dt) {
  return Tensor::from_vector(std::vector<double>(v.begin(), v.end()),
                             {static_cast<int64_t>(v.size())}, dt);
}

TEST(GetSeqLens, HandChecked) {
  // Pages per request 3, 1, 0; last page fill 5, 16, 0; page size 16.
  Tensor lens = get_seq_lens(int_tensor({0, 3, 4, 4}), int_tensor({5, 16, 0}), 16);
  EXPECT_EQ(lens.dtype(), DType::kInt32);
  EXPECT_EQ(ints(lens), (std::vector<double>{2 * 16 + 5, 16, 0}));
}

TEST(GetSeqLens, BadInput) {
  EXPECT_FI_ERROR(get_seq_lens(int_tensor({0, 3, 2}), int_tensor({1, 1}), 16), "get_seq_lens",
                  "kv_indptr");
  EXPECT_FI_ERROR(get_seq_lens(int_tensor({0, 3}), int_tensor({1, 1}), 16), "get_seq_lens",
                  "kv_last_page_len");
  EXPECT_FI_ERROR(get_seq_lens(int_tensor({0, 3}), int_tensor({1}), 0), "get_seq_lens",
                  "page_size");
  EXPECT_FI_ERROR(get_seq_lens(Tensor::zeros({2}, DType::kInt64), int_tensor({1}), 4),
                  "get_seq_lens", "kv_indptr");
  // 4 full pages of 2^62 tokens wrap int64 to 0 (+4 = a plausible 4) unless checked; lengths
  // past int32 are errors too.
  EXPECT_FI_ERROR(get_seq_lens(int_tensor({0, 5}), int_tensor({4}), int64_t{1} << 62),
                  "get_seq_lens", "page_size");
  EXPECT_FI_ERROR(get_seq_lens(int_tensor({0, 3}), int_tensor({4}), int64_t{1} << 30),
                  "get_seq_lens", "page_size");
  EXPECT_EQ(
      get_seq_lens(int_tensor({0, 3}), int_tensor({4}), (int64_t{1} << 30) - 3).to_double_vector(),
      std::vector<double>{2.0 * ((1 << 30) - 3) + 4});  // 2147483646
}

TEST(GetBatchIndicesPositions, HandChecked) {
  // Request 0 appends 2 rows to reach length 5; request 1 appends 0; request 2 appends 3 to 3.
  auto [bi, pos] = get_batch_indices_positions(int_tensor({0, 2, 2, 5}), int_tensor({5, 7, 3}), 5);
  EXPECT_EQ(bi.dtype(), DType::kInt32);
  EXPECT_EQ(ints(bi), (std::vector<double>{0, 0, 2, 2, 2}));
  EXPECT_EQ(ints(pos), (std::vector<double>{3, 4, 0, 1, 2}));
  // Into given buffers of exactly nnz elements; int64 indices.
  Tensor b = Tensor::full({5}, 9, DType::kInt32), p = Tensor::full({5}, 9, DType::kInt32);
  get_batch_indices_positions(idx_tensor({0, 2, 2, 5}, DType::kInt64),
                              idx_tensor({5, 7, 3}, DType::kInt64), 5, b, p);
  EXPECT_EQ(ints(b), (std::vector<double>{0, 0, 2, 2, 2}));
  EXPECT_EQ(ints(p), (std::vector<double>{3, 4, 0, 1, 2}));
}

// Upstream's Triton kernel writes only the rows of requests; the op presets the outputs: batch
// indices -1 (torch.full, or fill_ of a given buffer), positions 0 when it allocates them, a given
// positions buffer untouched. So nnz past append_indptr's end, and an indptr starting above 0 (a
// slice of a larger batch's), leave -1 / 0 there; a short sequence gives negative positions.
TEST(GetBatchIndicesPositions, ElementsOfNoRequestAsUpstreamPresetsThem) {
  auto [bi, pos] = get_batch_indices_positions(int_tensor({1, 3, 4}), int_tensor({6, 0}), 6);
  EXPECT_EQ(ints(bi), (std::vector<double>{-1, 0, 0, 1, -1, -1}));
  EXPECT_EQ(ints(pos), (std::vector<double>{0, 4, 5, -1, 0, 0}));
  Tensor b = Tensor::full({6}, 9, DType::kInt32), p = Tensor::full({6}, 9, DType::kInt32);
  get_batch_indices_positions(int_tensor({1, 3, 4}), int_tensor({6, 0}), 6, b, p);
  EXPECT_EQ(ints(b), (std::vector<double>{-1, 0, 0, 1, -1, -1}));
  EXPECT_EQ(ints(p), (std::vector<double>{9, 4, 5, -1, 9, 9}));
  // No requests at all.
  auto [b0, p0] =
      get_batch_indices_positions(int_tensor({0}), Tensor::empty({0}, DType::kInt32), 2);
  EXPECT_EQ(ints(b0), (std::vector<double>{-1, -1}));
  EXPECT_EQ(ints(p0), (std::vector<double>{0, 0}));
}

TEST(GetBatchIndicesPositions, BadInput) {
  const char* op = "get_batch_indices_positions";
  // nnz below the last row: upstream's kernel would write past its outputs.
  EXPECT_FI_ERROR(get_batch_indices_positions(int_tensor({0, 2}), int_tensor({5}), 1), op, "nnz");
  EXPECT_FI_ERROR(get_batch_indices_positions(int_tensor({0, 2}), int_tensor({5}), -1), op, "nnz");
  EXPECT_FI_ERROR(get_batch_indices_positions(int_tensor({0, 2, 1}), int_tensor({5, 5}), 2), op,
                  "append_indptr");
  EXPECT_FI_ERROR(get_batch_indices_positions(int_tensor({-1, 2}), int_tensor({5}), 2), op,
                  "append_indptr");
  EXPECT_FI_ERROR(get_batch_indices_positions(int_tensor({0, 2}), int_tensor({5, 5}), 2), op,
                  "seq_lens");
  EXPECT_FI_ERROR(get_batch_indices_positions(int_tensor({0, 2}),
                                              Tensor::from_vector({5}, {1}, DType::kFloat32), 2),
                  op, "seq_lens");
  // Given buffers: exactly (nnz,) int32, as upstream's check_shape_dtype_device.
  EXPECT_FI_ERROR(get_batch_indices_positions(int_tensor({0, 2}), int_tensor({5}), 2,
                                              Tensor::zeros({1}, DType::kInt32)),
                  op, "batch_indices");
  EXPECT_FI_ERROR(get_batch_indices_positions(int_tensor({0, 2}), int_tensor({5}), 2,
                                              Tensor::zeros({3}, DType::kInt32)),
                  op, "batch_indices");
  EXPECT_FI_ERROR(get_batch_indices_positions(int_tensor({0, 2}), int_tensor({5}), 2, std::nullopt,
                                              Tensor::zeros({2}, DType::kInt64)),
                  op, "positions");
}

struct AppendCase {
  bool hnd, pair;
  int64_t page_size;
};

class AppendTest : public ::testing::TestWithParam<AppendCase> {};

TEST_P(AppendTest, WritesEveryRowToItsSlot) {
  const AppendCase c = GetParam();
  const int64_t hkv = 2, d = 64;
  // After the append: lengths 5, 1, 2 * page_size; appended 3, 1, page_size + 1 rows.
  const std::vector<int32_t> lens{5, 1, static_cast<int32_t>(2 * c.page_size)};
  const std::vector<int32_t> app{3, 1, static_cast<int32_t>(c.page_size + 1)};
  std::vector<std::vector<double>> kref, vref;
  testing::PagedFixture f =
      testing::make_paged(lens, c.page_size, hkv, d, DType::kFloat16, c.hnd, c.pair, 7, kref, vref);
  std::vector<int32_t> app_indptr{0};
  for (int32_t a : app) app_indptr.push_back(app_indptr.back() + a);
  const int64_t nnz = app_indptr.back();
  auto [bi, pos] = get_batch_indices_positions(int_tensor(app_indptr), int_tensor(lens), nnz);
  // Strided append rows: every other row of a bigger tensor.
  Tensor ak =
      Tensor::empty({2 * nnz, hkv, d}, DType::kFloat16).uniform_(11).slice(0, 0, 2 * nnz, 2);
  Tensor av = Tensor::empty({nnz, hkv, d}, DType::kFloat16).uniform_(12);
  append_paged_kv_cache(ak, av, bi, pos, f.cache(), f.indices, f.indptr, f.last_page_len,
                        c.hnd ? "HND" : "NHD");
  // int64 index arrays (upstream's Python converts them with .int()): the same cache.
  {
    std::vector<std::vector<double>> k2, v2;
    testing::PagedFixture g =
        testing::make_paged(lens, c.page_size, hkv, d, DType::kFloat16, c.hnd, c.pair, 7, k2, v2);
    const auto wide = [](const Tensor& t) { return t.to(DType::kInt64); };
    append_paged_kv_cache(ak, av, wide(bi), wide(pos), g.cache(), wide(g.indices), wide(g.indptr),
                          wide(g.last_page_len), c.hnd ? "HND" : "NHD");
    if (c.pair) {
      EXPECT_TRUE(testing::all_close(g.k_cache, f.k_cache.to_double_vector(), {0.0, 0.0}));
      EXPECT_TRUE(testing::all_close(g.v_cache, f.v_cache.to_double_vector(), {0.0, 0.0}));
    } else {
      EXPECT_TRUE(testing::all_close(g.cache5, f.cache5.to_double_vector(), {0.0, 0.0}));
    }
  }
  // Expected: the old contents with the appended rows in place.
  const auto akd = ak.to_double_vector(), avd = av.to_double_vector();
  for (std::size_t b = 0; b < lens.size(); ++b) {
    for (int32_t j = 0; j < app[b]; ++j) {
      const int64_t row = app_indptr[b] + j, t = lens[b] - app[b] + j;
      std::copy_n(akd.begin() + row * hkv * d, hkv * d, kref[b].begin() + t * hkv * d);
      std::copy_n(avd.begin() + row * hkv * d, hkv * d, vref[b].begin() + t * hkv * d);
    }
  }
  std::vector<std::vector<double>> kgot, vgot;
  // Re-read the cache the same way the fixture did.
  Tensor kc = c.pair ? f.k_cache : f.cache5.select(1, 0);
  Tensor vc = c.pair ? f.v_cache : f.cache5.select(1, 1);
  if (c.hnd) {
    kc = kc.permute({0, 2, 1, 3});
    vc = vc.permute({0, 2, 1, 3});
  }
  const auto idx = f.indices.to_double_vector();
  const auto ip = f.indptr.to_double_vector();
  for (std::size_t b = 0; b < lens.size(); ++b) {
    std::vector<double> kd, vd;
    for (int64_t t = 0; t < lens[b]; ++t) {
      const auto page = static_cast<int64_t>(idx[static_cast<int64_t>(ip[b]) + t / c.page_size]);
      const auto kr = kc.select(0, page).select(0, t % c.page_size).to_double_vector();
      const auto vr = vc.select(0, page).select(0, t % c.page_size).to_double_vector();
      kd.insert(kd.end(), kr.begin(), kr.end());
      vd.insert(vd.end(), vr.begin(), vr.end());
    }
    EXPECT_EQ(kd, kref[b]) << "request " << b;
    EXPECT_EQ(vd, vref[b]) << "request " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, AppendTest,
                         ::testing::Values(AppendCase{false, false, 4}, AppendCase{true, false, 4},
                                           AppendCase{false, true, 1}, AppendCase{true, true, 16}));

// Page size 1 without the page axis (upstream's _unpack_paged_kv_cache forms, SGLang's K/V pools):
// the append writes through the 3-D pair and the 4-D tensor what it writes into the 5-D cache.
TEST(AppendPagedKvCache, PageSizeOneCachesWithoutThePageAxis) {
  const int64_t hkv = 2, d = 32;
  for (bool hnd : {false, true}) {
    SCOPED_TRACE(hnd ? "HND" : "NHD");
    const std::vector<int32_t> lens{5, 1, 3}, app{3, 1, 2};
    std::vector<std::vector<double>> kref, vref;
    testing::PagedFixture f =
        testing::make_paged(lens, 1, hkv, d, DType::kFloat16, hnd, false, 7, kref, vref);
    const auto [bi, pos] =
        get_batch_indices_positions(int_tensor({0, 3, 4, 6}), int_tensor(lens), 6);
    const Tensor ak = Tensor::empty({6, hkv, d}, DType::kFloat16).uniform_(11);
    const Tensor av = Tensor::empty({6, hkv, d}, DType::kFloat16).uniform_(12);
    const char* layout = hnd ? "HND" : "NHD";
    const int64_t page_axis = hnd ? 3 : 2;  // of the 5-D cache
    Tensor five = f.cache5.clone(), pair = f.cache5.clone(), four = f.cache5.clone();
    append_paged_kv_cache(ak, av, bi, pos, PagedKVCache(five), f.indices, f.indptr, f.last_page_len,
                          layout);
    append_paged_kv_cache(ak, av, bi, pos,
                          PagedKVCache(pair.select(1, 0).squeeze(page_axis - 1),
                                       pair.select(1, 1).squeeze(page_axis - 1)),
                          f.indices, f.indptr, f.last_page_len, layout);
    append_paged_kv_cache(ak, av, bi, pos, PagedKVCache(four.squeeze(page_axis)), f.indices,
                          f.indptr, f.last_page_len, layout);
    EXPECT_NE(five.to_double_vector(), f.cache5.to_double_vector());
    EXPECT_EQ(pair.to_double_vector(), five.to_double_vector());
    EXPECT_EQ(four.to_double_vector(), five.to_double_vector());
  }
}

TEST(AppendPagedKvCache, BadInput) {
  const char* op = "append_paged_kv_cache";
  std::vector<std::vector<double>> kr, vr;
  testing::PagedFixture f =
      testing::make_paged({5, 3}, 4, 2, 64, DType::kFloat16, false, false, 3, kr, vr);
  Tensor ak = Tensor::zeros({2, 2, 64}, DType::kFloat16);
  Tensor bi = int_tensor({0, 1}), pos = int_tensor({4, 2});
  auto call = [&](const Tensor& k, const Tensor& b, const Tensor& p, const Tensor& indices,
                  const Tensor& indptr, const Tensor& last, const char* layout = "NHD") {
    append_paged_kv_cache(k, k, b, p, f.cache(), indices, indptr, last, layout);
  };
  // Sanity: the good call works.
  call(ak, bi, pos, f.indices, f.indptr, f.last_page_len);
  EXPECT_FI_ERROR(call(ak, int_tensor({0, 2}), pos, f.indices, f.indptr, f.last_page_len), op,
                  "batch_indices");
  EXPECT_FI_ERROR(call(ak, bi, int_tensor({4, 3}), f.indices, f.indptr, f.last_page_len), op,
                  "positions");
  EXPECT_FI_ERROR(call(ak, bi, int_tensor({-1, 0}), f.indices, f.indptr, f.last_page_len), op,
                  "positions");
  EXPECT_FI_ERROR(call(ak, bi, pos, int_tensor({0, 1, 99}), f.indptr, f.last_page_len), op,
                  "kv_indices");
  EXPECT_FI_ERROR(call(ak, bi, pos, f.indices, int_tensor({0, 2, 1}), f.last_page_len), op,
                  "kv_indptr");
  EXPECT_FI_ERROR(call(ak, bi, pos, f.indices, f.indptr, int_tensor({1, 5})), op,
                  "kv_last_page_len");
  EXPECT_FI_ERROR(call(ak, bi, pos, f.indices, f.indptr, int_tensor({0, 3})), op,
                  "kv_last_page_len");
  EXPECT_FI_ERROR(call(Tensor::zeros({2, 2, 64}, DType::kBFloat16), bi, pos, f.indices, f.indptr,
                       f.last_page_len),
                  op, "append_key");
  EXPECT_FI_ERROR(call(Tensor::zeros({2, 3, 64}, DType::kFloat16), bi, pos, f.indices, f.indptr,
                       f.last_page_len),
                  op, "append_key");
  EXPECT_FI_ERROR(call(ak, bi, pos, f.indices, f.indptr, f.last_page_len, "NDH"), op, "kv_layout");
  EXPECT_FI_ERROR(call(ak, int_tensor({0}), pos, f.indices, f.indptr, f.last_page_len), op,
                  "batch_indices");
  EXPECT_FI_ERROR(append_paged_kv_cache(ak, ak, bi, pos,
                                        PagedKVCache(Tensor::zeros({4, 4, 2, 64}, DType::kFloat16)),
                                        f.indices, f.indptr, f.last_page_len),
                  op, "paged_kv_cache");
}

// A page table with the corners append_slot must get right: indptr starting above 0 (a slice of
// a bigger batch's), a request with no pages, entries outside the table's slice that are not
// page ids at all (99), and last pages part full. Page size 4, 10 pages.
struct SlotTable {
  std::vector<int32_t> indptr{2, 4, 4, 7};
  std::vector<int32_t> indices{99, 99, 3, 5, 0, 8, 1, 99};
  std::vector<int32_t> last{3, 0, 2};  // lengths 7, 0, 10
  kernels::AppendTable table(const int32_t* bi, const int32_t* pos) const {
    kernels::AppendTable t;
    t.kv_indptr = indptr.data();
    t.kv_indices = indices.data();
    t.kv_last_page_len = last.data();
    t.batch_indices = bi;
    t.positions = pos;
    t.batch = static_cast<int64_t>(last.size());
    t.num_indices = static_cast<int64_t>(indices.size());
    t.num_pages = 10;
    t.page_size = 4;
    return t;
  }
};

kernels::AppendSlot slot_of(const SlotTable& st, int32_t b, int32_t pos) {
  return kernels::append_slot(st.table(&b, &pos), 0);
}

// The CUDA kernels read the index arrays on the device and skip the rows append_slot refuses;
// the CPU checks them on the host. On a valid table the two agree row by row: the CPU op writes
// a one-row append exactly where append_slot says, and refuses exactly the rows it refuses.
TEST(AppendSlot, AgreesWithTheHostChecksRowByRow) {
  const SlotTable st;
  EXPECT_EQ(slot_of(st, 0, 0).page, 3);
  EXPECT_EQ(slot_of(st, 0, 6).page, 5);
  EXPECT_EQ(slot_of(st, 0, 6).entry, 2);
  EXPECT_EQ(slot_of(st, 2, 9).page, 1);
  EXPECT_EQ(slot_of(st, 2, 9).entry, 1);
  const int64_t H = 1, D = 8;
  int checked_rows = 0, refused_rows = 0;
  for (int32_t b = -1; b <= 3; ++b) {
    for (int32_t pos = -1; pos <= 11; ++pos) {
      SCOPED_TRACE(::testing::Message() << "request " << b << ", position " << pos);
      const kernels::AppendSlot s = slot_of(st, b, pos);
      Tensor kc = Tensor::zeros({10, 4, H, D}, DType::kFloat16);
      Tensor vc = Tensor::zeros({10, 4, H, D}, DType::kFloat16);
      Tensor row = Tensor::full({1, H, D}, 2.0, DType::kFloat16);
      auto call = [&] {
        append_paged_kv_cache(row, row, int_tensor({b}), int_tensor({pos}), PagedKVCache(kc, vc),
                              int_tensor(st.indices), int_tensor(st.indptr), int_tensor(st.last));
      };
      if (s.page < 0) {
        EXPECT_THROW(call(), Error);
        ++refused_rows;
        continue;
      }
      call();
      const auto k = kc.to_double_vector();
      for (int64_t page = 0; page < 10; ++page) {
        for (int64_t e = 0; e < 4; ++e) {
          const double want = page == s.page && e == s.entry ? 2.0 : 0.0;
          EXPECT_EQ(k[static_cast<std::size_t>((page * 4 + e) * D)], want) << page << ", " << e;
        }
      }
      ++checked_rows;
    }
  }
  EXPECT_EQ(checked_rows, 17);  // the 7 + 10 positions of requests 0 and 2
  EXPECT_EQ(refused_rows, 5 * 13 - 17);
}

// Each fault the host refuses by name, planted in request 0's part of the table, makes
// append_slot refuse the rows of request 0 it touches (positions [lo, hi)) and no others, while
// the CPU op refuses the whole call.
TEST(AppendSlot, RefusesTheRowsAFaultTouchesOnly) {
  struct Fault {
    const char* what;
    void (*plant)(SlotTable&);
    int32_t lo, hi;   // request 0's positions refused
    const char* arg;  // the argument the CPU op names
  };
  const Fault faults[] = {
      {"last page empty", [](SlotTable& t) { t.last[0] = 0; }, 0, 7, "kv_last_page_len"},
      {"last page past page_size", [](SlotTable& t) { t.last[0] = 5; }, 0, 7, "kv_last_page_len"},
      {"first page id past the cache", [](SlotTable& t) { t.indices[2] = 10; }, 0, 4, "kv_indices"},
      {"second page id negative", [](SlotTable& t) { t.indices[3] = -1; }, 4, 7, "kv_indices"},
      {"indptr decreasing", [](SlotTable& t) { t.indptr[1] = 1; }, 0, 7, "kv_indptr"},
      {"indptr below 0", [](SlotTable& t) { t.indptr[0] = -1; }, 0, 7, "kv_indptr"},
  };
  for (const Fault& f : faults) {
    SCOPED_TRACE(f.what);
    SlotTable st;
    f.plant(st);
    for (int32_t pos = 0; pos < 7; ++pos) {
      EXPECT_EQ(slot_of(st, 0, pos).page < 0, pos >= f.lo && pos < f.hi) << "position " << pos;
    }
    for (int32_t pos = 0; pos < 10; ++pos) EXPECT_GE(slot_of(st, 2, pos).page, 0) << pos;
    Tensor kc = Tensor::zeros({10, 4, 1, 8}, DType::kFloat16);
    Tensor row = Tensor::zeros({1, 1, 8}, DType::kFloat16);
    EXPECT_FI_ERROR(append_paged_kv_cache(row, row, int_tensor({2}), int_tensor({0}),
                                          PagedKVCache(kc, kc.clone()), int_tensor(st.indices),
                                          int_tensor(st.indptr), int_tensor(st.last)),
                    "append_paged_kv_cache", f.arg);
  }
  // indptr past the end of kv_indices: request 2's rows refused.
  SlotTable st;
  st.indices.resize(6);
  EXPECT_LT(slot_of(st, 2, 0).page, 0);
  EXPECT_EQ(slot_of(st, 0, 0).page, 3);
}

TEST(PagedKVCache, ValueRoundTrip) {
  Tensor a = Tensor::zeros({2, 4, 1, 64}, DType::kFloat16);
  Tensor b = Tensor::zeros({2, 4, 1, 64}, DType::kFloat16);
  const Value pair = to_value(PagedKVCache(a, b));
  ASSERT_TRUE(pair.is_sequence());
  const PagedKVCache back = PagedKVCache::from_value(pair);
  EXPECT_TRUE(back.is_pair());
  EXPECT_EQ(back.first().data_ptr(), a.data_ptr());
  EXPECT_EQ(back.second().data_ptr(), b.data_ptr());
  EXPECT_TRUE(to_value(PagedKVCache(a)).is_tensor());
  EXPECT_THROW(PagedKVCache::from_value(Value(3)), Error);
}

// ---- declarations, record and replay --------------------------------------------------------

TEST(PageDecls, SignaturesMatchUpstream) {
  const OpDecl* gbip = OpRegistry::global().find("get_batch_indices_positions");
  const OpDecl* append = OpRegistry::global().find("append_paged_kv_cache");
  ASSERT_NE(gbip, nullptr);
  ASSERT_NE(append, nullptr);
  EXPECT_EQ(gbip->module, "flashinfer.page");
  EXPECT_EQ(append->module, "flashinfer.page");
  EXPECT_EQ(gbip->signature(),
            "(append_indptr, seq_lens, nnz, batch_indices=None, positions=None)");
  EXPECT_EQ(append->signature(),
            "(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, "
            "kv_indptr, kv_last_page_len, kv_layout='NHD')");
  EXPECT_EQ(gbip->returns, "tuple[Tensor, Tensor]");
  EXPECT_EQ(append->returns, "None");
  EXPECT_TRUE(append->params[4].mutated);  // the recorder saves the cache after the call
  // Upstream's get_seq_lens is a plain helper (no @flashinfer_api): not an op here either.
  EXPECT_EQ(OpRegistry::global().find("get_seq_lens"), nullptr);
  EXPECT_EQ(find_bench_hook("get_seq_lens"), nullptr);
}

TEST(PageDecls, GetSeqLensIsNeverRecordedAndTheOpsReplay) {
  std::vector<std::vector<double>> kr, vr;
  testing::PagedFixture f =
      testing::make_paged({5, 3}, 4, 2, 16, DType::kFloat16, false, true, 3, kr, vr);
  std::vector<testing::RecordingObserver::Call> calls;
  Tensor lens;
  {
    testing::RecordingScope scope;
    lens = get_seq_lens(f.indptr, f.last_page_len, 4);
    auto [bi, pos] = get_batch_indices_positions(int_tensor({0, 2, 3}), lens, 3);
    append_paged_kv_cache(testing::rand_tensor({3, 2, 16}, DType::kFloat16, 4),
                          testing::rand_tensor({3, 2, 16}, DType::kFloat16, 5), bi, pos, f.cache(),
                          f.indices, f.indptr, f.last_page_len);
    calls = scope.observer().calls;
  }
  EXPECT_EQ(ints(lens), (std::vector<double>{5, 3}));  // the helper still works
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "get_batch_indices_positions");
  EXPECT_EQ(calls[1].name, "append_paged_kv_cache");
  for (const auto& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(testing::replays_identically(c));
  }
  // The cache was recorded as upstream's (k_cache, v_cache) tuple.
  EXPECT_EQ(calls[1].inputs[4].kind(), Value::Kind::kTuple);
  // Upstream's keyword names bind; a keyword it does not have is refused.
  const OpDecl& d = *OpRegistry::global().find("get_batch_indices_positions");
  const auto bound = bind_arguments(d, {Value(int_tensor({0, 2})), Value(int_tensor({4}))},
                                    {{"nnz", Value(2)}, {"positions", Value()}});
  ASSERT_EQ(bound.size(), 5u);
  EXPECT_TRUE(bound[3].is_none());
  const Value r = d.invoke(CallArgs(d, bound));
  ASSERT_TRUE(r.is_sequence());
  EXPECT_EQ(ints(r.items()[1].as_tensor()), (std::vector<double>{2, 3}));
  EXPECT_THROW(bind_arguments(d, {Value(int_tensor({0, 2})), Value(int_tensor({4})), Value(2)},
                              {{"page_size", Value(4)}}),
               Error);
}

}  // namespace
}  // namespace flashinfer

namespace flashinfer {
namespace {

TEST(AppendPagedKvCacheCuda, MatchesCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  std::vector<std::vector<double>> kr, vr;
  testing::PagedFixture f =
      testing::make_paged({9, 4}, 4, 2, 128, DType::kBFloat16, true, false, 3, kr, vr);
  Tensor ak = Tensor::empty({3, 2, 128}, DType::kBFloat16).uniform_(5);
  Tensor bi = int_tensor({0, 0, 1}), pos = int_tensor({7, 8, 3});
  Tensor gpu_cache = testing::to_keep_layout(f.cache5, Device::cuda());
  append_paged_kv_cache(ak.to(Device::cuda()), ak.to(Device::cuda()), bi.to(Device::cuda()),
                        pos.to(Device::cuda()), gpu_cache, f.indices.to(Device::cuda()),
                        f.indptr.to(Device::cuda()), f.last_page_len.to(Device::cuda()), "HND");
  append_paged_kv_cache(ak, ak, bi, pos, f.cache(), f.indices, f.indptr, f.last_page_len, "HND");
  EXPECT_EQ(gpu_cache.to_double_vector(), f.cache5.to_double_vector());
  // NHD, a (k_cache, v_cache) pair, 1-byte elements, distinct K and V rows.
  testing::PagedFixture f8 =
      testing::make_paged({9, 4}, 4, 2, 64, DType::kFloat8E4M3FN, false, true, 4, kr, vr);
  Tensor k8 = Tensor::empty({3, 2, 64}, DType::kFloat8E4M3FN).uniform_(6);
  Tensor v8 = Tensor::empty({3, 2, 64}, DType::kFloat8E4M3FN).uniform_(7);
  Tensor kg = testing::to_keep_layout(f8.k_cache, Device::cuda());
  Tensor vg = testing::to_keep_layout(f8.v_cache, Device::cuda());
  append_paged_kv_cache(k8.to(Device::cuda()), v8.to(Device::cuda()), bi.to(Device::cuda()),
                        pos.to(Device::cuda()), PagedKVCache(kg, vg), f8.indices.to(Device::cuda()),
                        f8.indptr.to(Device::cuda()), f8.last_page_len.to(Device::cuda()), "NHD");
  append_paged_kv_cache(k8, v8, bi, pos, f8.cache(), f8.indices, f8.indptr, f8.last_page_len,
                        "NHD");
  EXPECT_EQ(kg.to_double_vector(), f8.k_cache.to_double_vector());
  EXPECT_EQ(vg.to_double_vector(), f8.v_cache.to_double_vector());
}

// The CUDA append copies 16 bytes at a time when every row start allows it (append_kernel),
// else element by element (append_strided_kernel): both against the CPU.
TEST(AppendPagedKvCacheCuda, VectorAndElementCopiesMatchCpu) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  std::vector<std::vector<double>> kr, vr;
  Tensor bi = int_tensor({0, 0, 1}), pos = int_tensor({7, 8, 3});
  struct Case {
    int64_t d;
    DType dtype;
    const char* layout;
  };
  // 12 bf16 = 24-byte rows: element copies; 8 fp32 = 32-byte rows: 16-byte copies of 4-byte
  // elements; 5 fp32 = 20-byte rows: element copies.
  for (const Case& c : {Case{12, DType::kBFloat16, "HND"}, Case{8, DType::kFloat32, "NHD"},
                        Case{5, DType::kFloat32, "HND"}}) {
    SCOPED_TRACE(c.d);
    testing::PagedFixture f = testing::make_paged({9, 4}, 4, 2, c.d, c.dtype,
                                                  std::string(c.layout) == "HND", true, 8, kr, vr);
    Tensor k = Tensor::empty({3, 2, c.d}, c.dtype).uniform_(9);
    Tensor v = Tensor::empty({3, 2, c.d}, c.dtype).uniform_(10);
    Tensor kg = testing::to_keep_layout(f.k_cache, Device::cuda());
    Tensor vg = testing::to_keep_layout(f.v_cache, Device::cuda());
    append_paged_kv_cache(k.to(Device::cuda()), v.to(Device::cuda()), bi.to(Device::cuda()),
                          pos.to(Device::cuda()), PagedKVCache(kg, vg),
                          f.indices.to(Device::cuda()), f.indptr.to(Device::cuda()),
                          f.last_page_len.to(Device::cuda()), c.layout);
    append_paged_kv_cache(k, v, bi, pos, f.cache(), f.indices, f.indptr, f.last_page_len, c.layout);
    EXPECT_EQ(kg.to_double_vector(), f.k_cache.to_double_vector());
    EXPECT_EQ(vg.to_double_vector(), f.v_cache.to_double_vector());
  }
}

// Rows of `src` at `rows`, as a new contiguous tensor on the CPU.
Tensor take_rows(const Tensor& src, const std::vector<int64_t>& rows) {
  Shape shape = src.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(shape, src.dtype());
  for (std::size_t j = 0; j < rows.size(); ++j) {
    out.select(0, static_cast<int64_t>(j)).copy_(src.select(0, rows[j]));
  }
  return out;
}

// On CUDA the index arrays stay on the device (kernels/page_append_params.h): the rows the host
// checks would refuse are not written, the others land where the CPU puts them, bit for bit. The
// call reads nothing back and allocates nothing, so a CUDA graph captures it in global mode
// (which refuses any call that synchronizes); a strided index tensor is copied dense on the
// device first.
TEST(AppendPagedKvCacheCuda, IndexArraysStayOnTheDevice) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  const SlotTable st;
  const std::vector<int32_t> bi{0, 2, -1, 0, 1, 2, 3, 0, 2};
  const std::vector<int32_t> pos{0, 9, 0, 7, 0, 3, 0, 6, 10};
  std::vector<int64_t> kept;
  for (std::size_t i = 0; i < bi.size(); ++i) {
    if (slot_of(st, bi[i], pos[i]).page >= 0) kept.push_back(static_cast<int64_t>(i));
  }
  ASSERT_EQ(kept, (std::vector<int64_t>{0, 1, 5, 7}));
  const auto nnz = static_cast<int64_t>(bi.size());
  const int64_t H = 2, D = 64;
  const Tensor k = Tensor::empty({nnz, H, D}, DType::kBFloat16).uniform_(21);
  const Tensor v = Tensor::empty({nnz, H, D}, DType::kBFloat16).uniform_(22);
  // The CPU, given the kept rows only.
  std::vector<int32_t> kept_bi, kept_pos;
  for (int64_t i : kept) kept_bi.push_back(bi[i]), kept_pos.push_back(pos[i]);
  Tensor kc = Tensor::empty({10, 4, H, D}, DType::kBFloat16).uniform_(23);
  Tensor vc = Tensor::empty({10, 4, H, D}, DType::kBFloat16).uniform_(24);
  const Tensor kc0 = kc.clone(), vc0 = vc.clone();
  append_paged_kv_cache(take_rows(k, kept), take_rows(v, kept), int_tensor(kept_bi),
                        int_tensor(kept_pos), PagedKVCache(kc, vc), int_tensor(st.indices),
                        int_tensor(st.indptr), int_tensor(st.last));
  const Tensor kg_in = k.to(g), vg_in = v.to(g), bi_g = int_tensor(bi).to(g),
               idx_g = int_tensor(st.indices).to(g), ip_g = int_tensor(st.indptr).to(g),
               last_g = int_tensor(st.last).to(g);
  // positions as every other element of a longer device tensor: a strided index tensor.
  std::vector<int32_t> pos2;
  for (int32_t p : pos) pos2.push_back(p), pos2.push_back(-7);
  const Tensor pos_strided = int_tensor(pos2).to(g).slice(0, 0, 2 * nnz, 2);
  for (const Tensor& pos_g : {int_tensor(pos).to(g), pos_strided}) {
    Tensor kg = kc0.to(g), vg = vc0.to(g);
    append_paged_kv_cache(kg_in, vg_in, bi_g, pos_g, PagedKVCache(kg, vg), idx_g, ip_g, last_g);
    EXPECT_EQ(kg.to_double_vector(), kc.to_double_vector());
    EXPECT_EQ(vg.to_double_vector(), vc.to_double_vector());
  }
#if FLASHINFER_TEST_HAVE_CUDART
  const Tensor pos_g = int_tensor(pos).to(g);
  Tensor kg = kc0.to(g), vg = vc0.to(g);
  ASSERT_NO_FATAL_FAILURE(testing::capture_on_own_stream([&] {
    append_paged_kv_cache(kg_in, vg_in, bi_g, pos_g, PagedKVCache(kg, vg), idx_g, ip_g, last_g);
  }));
  EXPECT_EQ(kg.to_double_vector(), kc.to_double_vector());
  EXPECT_EQ(vg.to_double_vector(), vc.to_double_vector());
#endif
}

// get_seq_lens on CUDA: a kernel on the device, the CPU's lengths, capturable.
TEST(GetSeqLensCuda, MatchesCpuOnTheDevice) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  std::vector<int32_t> indptr{0}, last;
  for (int32_t b = 0; b < 300; ++b) {
    indptr.push_back(indptr.back() + b % 7);  // some requests without pages
    last.push_back(1 + b % 16);
  }
  const Tensor want = get_seq_lens(int_tensor(indptr), int_tensor(last), 16);
  const Tensor ip = int_tensor(indptr).to(g), lp = int_tensor(last).to(g);
  const Tensor got = get_seq_lens(ip, lp, 16);
  EXPECT_EQ(got.device(), g);
  EXPECT_EQ(got.dtype(), DType::kInt32);
  EXPECT_EQ(ints(got.to(Device::cpu())), ints(want));
#if FLASHINFER_TEST_HAVE_CUDART
  Tensor captured;
  ASSERT_NO_FATAL_FAILURE(
      testing::capture_on_own_stream([&] { captured = get_seq_lens(ip, lp, 16); }));
  EXPECT_EQ(ints(captured.to(Device::cpu())), ints(want));
#endif
}

// The CUDA kernel reads the indices on the device (no host copy: a graph captures the call) and
// writes what the CPU does, presets included.
TEST(GetBatchIndicesPositionsCuda, MatchesCpuOnTheDevice) {
  FLASHINFER_SKIP_WITHOUT_CUDA();
  const Device g = Device::cuda();
  std::vector<int64_t> indptr{3}, lens;
  for (int64_t b = 0; b < 40; ++b) {
    indptr.push_back(indptr.back() + (b * 7) % 11);
    lens.push_back(20 + b % 5);  // some shorter than the rows appended: negative positions
  }
  const int64_t nnz = indptr.back() + 9;
  for (DType it : {DType::kInt32, DType::kInt64}) {
    const Tensor ip = idx_tensor(indptr, it), sl = idx_tensor(lens, it);
    auto [bc, pc] = get_batch_indices_positions(ip, sl, nnz);
    auto [bg, pg] = get_batch_indices_positions(ip.to(g), sl.to(g), nnz);
    EXPECT_EQ(bg.device(), g);
    EXPECT_EQ(ints(bg.to(Device::cpu())), ints(bc));
    EXPECT_EQ(ints(pg.to(Device::cpu())), ints(pc));
    Tensor bb = Tensor::full({nnz}, 9, DType::kInt32, g),
           pb = Tensor::full({nnz}, 9, DType::kInt32, g);
    Tensor bh = Tensor::full({nnz}, 9, DType::kInt32), ph = Tensor::full({nnz}, 9, DType::kInt32);
    get_batch_indices_positions(ip, sl, nnz, bh, ph);
#if FLASHINFER_TEST_HAVE_CUDART
    const Tensor ipg = ip.to(g), slg = sl.to(g);
    ASSERT_NO_FATAL_FAILURE(testing::capture_on_own_stream(
        [&] { get_batch_indices_positions(ipg, slg, nnz, bb, pb); }));
#else
    get_batch_indices_positions(ip.to(g), sl.to(g), nnz, bb, pb);
#endif
    EXPECT_EQ(ints(bb.to(Device::cpu())), ints(bh));
    EXPECT_EQ(ints(pb.to(Device::cpu())), ints(ph));
  }
}

}  // namespace
}  // namespace flashinfer
