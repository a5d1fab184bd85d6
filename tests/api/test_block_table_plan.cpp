// The device-side plan of the block-table decode calls (kernels/block_table_plan.h), checked on
// the CPU: its rules, run here as the CUDA kernel runs them (a loop per request over the same
// FLASHINFER_HD functions), give every query row the same key ranges, merged in the same order,
// as the host planner's partition of the real lengths with the same chunk; a request the host
// checks refuse gets no work and no merge; and the rules refuse what the host checks refuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "api/attention_common.h"
#include "flashinfer/ops/attention.h"
#include "kernels/block_table_plan.h"
#include "kernels/cudnn_ragged_plan.h"
#include "kernels/page_guard.h"

namespace flashinfer {
namespace {

using kernels::BlockTablePlan;
using kernels::WorkItem;
// What reaches an output row: query `qi` of request `request` against keys [k0, k1).
struct Range {
  int32_t request, qi, k0, k1;
  bool operator==(const Range&) const = default;
};

// Head counts and head dim of a planned state.
struct Heads {
  int64_t hq = 8, hkv = 2, d = 64;
};

// A CPU plan state of `lens` (q_len queries each), planned with a fixed chunk of `chunk_pages`.
detail::WrapperState planned(const std::vector<int32_t>& lens, int32_t q_len, int32_t page_size,
                             int64_t chunk_pages, bool decode, Heads h = {}) {
  detail::WrapperState s;
  s.device = Device::cpu();
  s.decode = decode;
  s.q_len_per_req = q_len;
  api::plan_settings(s, h.hq, h.hkv, h.d, h.d, DType::kFloat16, DType::kFloat16, DType::kFloat16,
                     std::nullopt, -1, std::nullopt, "NONE", "test");
  s.paged = true;
  s.page_size = page_size;
  s.batch = static_cast<int32_t>(lens.size());
  s.causal = q_len > 1;
  s.qo_indptr = {0};
  s.kv_indptr = {0};
  for (int32_t len : lens) {
    s.qo_indptr.push_back(s.qo_indptr.back() + q_len);
    s.kv_indptr.push_back(s.kv_indptr.back() + (len + page_size - 1) / page_size);
  }
  s.kv_lens = lens;
  s.total_qo = s.qo_indptr.back();
  s.workspace_cap = int64_t{1} << 40;
  api::build_plan(s, chunk_pages, /*disable_split_kv=*/false, "test");
  return s;
}

// The plan arrays as the plan kernel writes them.
struct DevicePlan {
  std::vector<WorkItem> work;
  std::vector<int32_t> merge_indptr, merge_rows, merge_out_row, kv_lens;
  std::vector<bool> ok;
};

DevicePlan run_rules(BlockTablePlan p, const std::vector<int32_t>& lens,
                     const std::vector<bool>& pages_ok) {
  DevicePlan d;
  const int32_t items = kernels::block_plan_tiles(p) * p.num_chunks;
  d.work.resize(static_cast<std::size_t>(p.batch) * items);
  if (p.num_chunks > 1) {
    d.merge_rows.resize(static_cast<std::size_t>(p.batch) * p.q_len * p.num_chunks);
    d.merge_indptr.resize(static_cast<std::size_t>(p.batch) * p.q_len + 1);
    d.merge_out_row.resize(static_cast<std::size_t>(p.batch) * p.q_len);
  }
  for (int32_t b = 0; b < p.batch; ++b) {
    const bool ok = !kernels::block_plan_cu_bad(p, 0, 1) &&
                    kernels::block_plan_request_ok(p, b, lens[b]) && pages_ok[b];
    const kernels::BlockPlanRows rows = kernels::block_plan_rows(p, b);
    d.ok.push_back(ok);
    d.kv_lens.push_back(ok ? lens[b] : 0);
    for (int32_t k = 0; k < items; ++k) {
      d.work[static_cast<std::size_t>(b) * items + k] =
          kernels::block_plan_item(p, b, k, lens[b], ok, rows.count);
    }
    if (p.num_chunks == 1) continue;
    for (int32_t i = 0; i < p.q_len; ++i) {
      const int32_t m = b * p.q_len + i;
      d.merge_indptr[m] = m * p.num_chunks;
      d.merge_out_row[m] = kernels::block_plan_merge_out_row(p, rows, i, lens[b], ok);
      for (int32_t c = 0; c < p.num_chunks; ++c) {
        d.merge_rows[static_cast<std::size_t>(m) * p.num_chunks + c] =
            kernels::block_plan_merge_row(p, b, i, c, lens[b], ok);
      }
    }
  }
  if (p.num_chunks > 1) d.merge_indptr.back() = p.batch * p.q_len * p.num_chunks;
  return d;
}

// For each output row, the (request, query, key range) triples that reach it in order: its final
// item's, or those of the partial rows behind its merge entries (the empty row: none). Fails the
// test where a row is written twice or a partial row is written by two items.
// Request r's query i is output row row_begin[r] + i.
std::vector<std::vector<Range>> contributions(const std::vector<WorkItem>& work,
                                              const std::vector<int32_t>& merge_indptr,
                                              const std::vector<int32_t>& merge_rows,
                                              const std::vector<int32_t>& merge_out_row,
                                              const std::vector<int64_t>& row_begin, int64_t rows,
                                              int32_t empty_row) {
  std::vector<std::vector<Range>> out(static_cast<std::size_t>(rows));
  std::vector<int> writes(static_cast<std::size_t>(rows), 0);
  std::map<int32_t, Range> partial;  // partial row -> its key range
  for (const WorkItem& w : work) {
    if (w.request < 0) continue;
    for (int32_t i = w.qo_begin; i < w.qo_end; ++i) {
      const int64_t row = row_begin[static_cast<std::size_t>(w.request)] + i;
      EXPECT_LT(row, rows) << "an item writes past the rows";
      if (row >= rows) continue;
      if (w.partial_base < 0) {
        out[row].push_back({w.request, i, w.kv_begin, w.kv_end});
        ++writes[row];
      } else {
        const int32_t pr = w.partial_base + (i - w.qo_begin);
        EXPECT_TRUE(partial.emplace(pr, Range{w.request, i, w.kv_begin, w.kv_end}).second)
            << "partial row " << pr << " written twice";
        EXPECT_NE(pr, empty_row);
      }
    }
  }
  for (std::size_t m = 0; m < merge_out_row.size(); ++m) {
    const int32_t row = merge_out_row[m];
    if (row < 0) continue;
    ++writes[row];
    for (int32_t e = merge_indptr[m]; e < merge_indptr[m + 1]; ++e) {
      if (merge_rows[e] == empty_row) continue;
      const auto it = partial.find(merge_rows[e]);
      EXPECT_NE(it, partial.end())
          << "merge of row " << row << " reads unwritten partial row " << merge_rows[e];
      if (it != partial.end()) out[row].push_back(it->second);
    }
  }
  for (int64_t r = 0; r < rows; ++r) EXPECT_LE(writes[r], 1) << "row " << r << " written twice";
  return out;
}

// What each of a request's n queries sees in the host plan of that request alone (len keys in
// pages of page_size, chunks of `chunk` keys: 0 unsplit), labelled as request `r`.
std::vector<std::vector<Range>> host_rows(int32_t len, int32_t n, int32_t page_size, int64_t chunk,
                                          const Heads& h, int32_t r) {
  const detail::WrapperState host =
      planned({len}, n, page_size, chunk > 0 ? chunk / page_size : 1 << 20, false, h);
  auto want = contributions(host.plan.work, host.plan.merge_indptr, host.plan.merge_rows,
                            host.plan.merge_out_row, {0}, n, -1);
  for (auto& row : want) {
    for (Range& x : row) x.request = r;
  }
  return want;
}

BlockTablePlan plan_of(const detail::WrapperState& worst, int32_t q_len, int32_t page_size,
                       int32_t max_seq_len, int32_t max_blocks) {
  BlockTablePlan p;
  p.batch = worst.batch;
  p.q_len = q_len;
  p.page_size = page_size;
  p.max_seq_len = max_seq_len;
  p.max_blocks = max_blocks;
  p.num_pages = 1000;
  p.causal = q_len > 1;
  p.tile_rows = worst.plan.cta_tile_q;
  const int32_t tiles = kernels::block_plan_tiles(p);
  p.num_chunks = static_cast<int32_t>(worst.plan.work.size() / (worst.batch * tiles));
  p.chunk_tokens = worst.plan.split_kv ? worst.plan.kv_chunk_size : 0;
  p.empty_row = worst.plan.split_kv ? static_cast<int32_t>(worst.plan.num_partial_rows) : -1;
  p.min_chunk_tokens = std::max(1, std::min(worst.plan.min_kv_chunk, worst.plan.kv_chunk_size));
  return p;
}

// Over random batches, chunks, page sizes, query counts and GQA groups (one tile a request for
// decode, tiles of the prefill rule otherwise: several a request where a large group makes them a
// query or two high): each request's rows in the device plan see what they see in the host plan
// of that request alone with the request's chunk (block_plan_chunk: its keys spread over the
// grid's chunks), in the same order, and never more chunks than the grid has.
TEST(BlockTablePlan, RowsSeeTheHostPlansKeysOverRandomBatches) {
  std::mt19937 rng(7);
  int split_cases = 0, unsplit_cases = 0, multi_tile_cases = 0, own_chunk_cases = 0;
  const std::vector<Heads> heads{{8, 2, 64}, {64, 1, 64}, {32, 1, 128}, {64, 2, 256}};
  for (int iter = 0; iter < 400; ++iter) {
    const int32_t batch = 1 + static_cast<int32_t>(rng() % 6);
    const int32_t q_len = 1 + static_cast<int32_t>(rng() % 4);
    const int32_t page_size = std::vector<int32_t>{1, 4, 5, 16}[rng() % 4];
    const int32_t max_seq_len = q_len + static_cast<int32_t>(rng() % 200);
    const int32_t max_blocks = (max_seq_len + page_size - 1) / page_size + (rng() % 2);
    const int64_t chunk_pages = 1 + rng() % 8;
    const bool decode = rng() % 2 == 0;
    const Heads h = heads[rng() % heads.size()];
    std::vector<int32_t> lens;
    for (int32_t b = 0; b < batch; ++b) {
      lens.push_back(q_len + static_cast<int32_t>(rng() % (max_seq_len - q_len + 1)));
    }
    if (rng() % 3 == 0) lens[0] = max_seq_len;
    const int32_t worst_len = std::min(max_seq_len, max_blocks * page_size);
    const detail::WrapperState worst =
        planned(std::vector<int32_t>(batch, worst_len), q_len, page_size, chunk_pages, decode, h);
    BlockTablePlan p = plan_of(worst, q_len, page_size, max_seq_len, max_blocks);
    // Any floor of whole pages up to the worst case's chunk (the CPU planner's own floor, 128
    // keys, is at least every chunk drawn here, which would leave each request the worst case's
    // chunk): requests shorter than the worst case then take chunks of their own.
    p.min_chunk_tokens = page_size * static_cast<int32_t>(1 + rng() % chunk_pages);
    ASSERT_EQ(worst.plan.work.size(),
              static_cast<std::size_t>(batch) * kernels::block_plan_tiles(p) * p.num_chunks);
    (p.num_chunks > 1 ? split_cases : unsplit_cases)++;
    multi_tile_cases += kernels::block_plan_tiles(p) > 1;
    const DevicePlan d = run_rules(p, lens, std::vector<bool>(batch, true));
    const int64_t rows = int64_t{batch} * q_len;
    std::vector<int64_t> begins;
    for (int32_t b = 0; b < batch; ++b) begins.push_back(int64_t{b} * q_len);
    const auto got = contributions(d.work, d.merge_indptr, d.merge_rows, d.merge_out_row, begins,
                                   rows, p.empty_row);
    for (int32_t b = 0; b < batch; ++b) {
      const int64_t chunk = kernels::block_plan_chunk(p, lens[b]);
      ASSERT_EQ(chunk % page_size, 0);  // whole pages, as the host cuts
      ASSERT_LE(kernels::block_plan_chunks_used(p, lens[b]), p.num_chunks);
      own_chunk_cases += chunk > 0 && chunk < p.chunk_tokens;
      const detail::WrapperState host =
          planned({lens[b]}, q_len, page_size, chunk > 0 ? chunk / page_size : 1 << 20, decode, h);
      ASSERT_EQ(host.plan.cta_tile_q, worst.plan.cta_tile_q);
      const auto want = contributions(host.plan.work, host.plan.merge_indptr, host.plan.merge_rows,
                                      host.plan.merge_out_row, {0}, q_len, -1);
      for (int32_t i = 0; i < q_len; ++i) {
        std::vector<Range> w = want[i];
        for (Range& x : w) x.request = b;  // the lone request is request 0 there
        ASSERT_EQ(got[int64_t{b} * q_len + i], w) << "iteration " << iter << ", request " << b;
        ASSERT_FALSE(w.empty()) << "request " << b << " row " << i << " is never written";
      }
    }
    // Every item and merge entry reads inside the worst-case layout the host sized.
    for (const WorkItem& w : d.work) {
      if (w.partial_base >= 0) {
        ASSERT_LE(w.partial_base + (w.qo_end - w.qo_begin), worst.plan.num_partial_rows);
      }
      ASSERT_LE(w.kv_end, worst_len);
    }
    for (int32_t pr : d.merge_rows) ASSERT_LE(pr, worst.plan.num_partial_rows);
  }
  EXPECT_GT(split_cases, 50);
  EXPECT_GT(unsplit_cases, 20);
  EXPECT_GT(multi_tile_cases, 20);
  EXPECT_GT(own_chunk_cases, 100);
}

// Variable query counts (trtllm_batch_context_with_kv_cache: cum_seq_lens_q on the device, the
// grid planned for every request max_q_len queries long): each request's rows, at its own offset,
// see what the host plan of that request alone with its chunk gives them; tiles past a request's
// queries are idle; requests with no queries have no work; rows past the last request and the
// rows of requests whose cum_seq_lens_q entries the host checks refuse (decreasing, more than
// max_q_len queries, past the query tensor) are written by nothing. Causal calls refuse fewer keys
// than queries; the others do not.
TEST(BlockTablePlan, VariableQueryCountsSeeTheHostPlansKeys) {
  std::mt19937 rng(23);
  int split_cases = 0, idle_tiles = 0, refused = 0, empty_requests = 0;
  const std::vector<Heads> heads{{8, 2, 64}, {32, 8, 128}, {4, 4, 64}};
  for (int iter = 0; iter < 150; ++iter) {
    const int32_t batch = 1 + static_cast<int32_t>(rng() % 6);
    const int32_t max_q = 1 + static_cast<int32_t>(rng() % 160);
    const int32_t page_size = std::vector<int32_t>{1, 4, 16}[rng() % 3];
    const int32_t max_seq_len = max_q + static_cast<int32_t>(rng() % 400);
    const int32_t max_blocks = (max_seq_len + page_size - 1) / page_size;
    const bool causal = rng() % 3 != 0;
    const Heads h = heads[rng() % heads.size()];
    std::vector<int32_t> lens, qn, cu{0};
    for (int32_t b = 0; b < batch; ++b) {
      int32_t n = static_cast<int32_t>(rng() % (max_q + 1));
      if (rng() % 4 == 0) n = max_q;
      qn.push_back(n);
      cu.push_back(cu.back() + n);
      lens.push_back(n + static_cast<int32_t>(rng() % (max_seq_len - n + 1)));
    }
    int64_t total_rows = cu.back() + static_cast<int64_t>(rng() % 3);
    std::vector<bool> want_ok(static_cast<std::size_t>(batch), true);
    if (rng() % 4 == 0) {  // one request's entries broken, as the host checks would refuse them
      const int32_t b = static_cast<int32_t>(rng() % batch);
      switch (rng() % 4) {
        case 0:  // more than max_q_len queries (its neighbour then starts later: shifted too)
          cu[b + 1] = cu[b] + max_q + 1;
          for (int32_t j = b + 2; j <= batch; ++j) cu[j] = std::max(cu[j], cu[j - 1]);
          total_rows = std::max<int64_t>(total_rows, cu.back());
          break;
        case 1:  // decreasing
          cu[b + 1] = cu[b] - 1;
          break;
        case 2:  // past the query tensor
          total_rows = cu[b + 1] - 1;
          break;
        default:  // not starting at 0
          for (int32_t& x : cu) x += 1;
          total_rows = std::max<int64_t>(total_rows, cu.back());
          break;
      }
    }
    // The host refuses the call when the array decreases anywhere: every request, here.
    const bool sorted = cu[0] == 0 && std::is_sorted(cu.begin(), cu.end());
    for (int32_t b = 0; b < batch; ++b) {
      const int64_t n = int64_t{cu[b + 1]} - cu[b];
      const bool rows_ok = cu[b] >= 0 && n >= 0 && n <= max_q && cu[b + 1] <= total_rows;
      want_ok[b] = sorted && rows_ok && (!causal || n <= lens[b]);
    }
    const detail::WrapperState worst = planned(std::vector<int32_t>(batch, max_seq_len), max_q,
                                               page_size, 1 + rng() % 8, false, h);
    BlockTablePlan p = plan_of(worst, max_q, page_size, max_seq_len, max_blocks);
    p.min_chunk_tokens = page_size * static_cast<int32_t>(1 + rng() % 4);
    p.cu_q = cu.data();
    p.total_rows = total_rows;
    p.causal = causal;
    split_cases += p.num_chunks > 1;
    const DevicePlan d = run_rules(p, lens, std::vector<bool>(batch, true));
    std::vector<int64_t> begins(cu.begin(), cu.end() - 1);
    const auto got = contributions(d.work, d.merge_indptr, d.merge_rows, d.merge_out_row, begins,
                                   total_rows, p.empty_row);
    std::vector<bool> owned(static_cast<std::size_t>(total_rows), false);
    for (int32_t b = 0; b < batch; ++b) {
      ASSERT_EQ(static_cast<bool>(d.ok[b]), static_cast<bool>(want_ok[b]))
          << "iteration " << iter << ", request " << b;
      if (!want_ok[b]) {
        ++refused;
        for (const WorkItem& w : d.work) ASSERT_NE(w.request, b);
        continue;
      }
      empty_requests += cu[b + 1] == cu[b];
      const int32_t n = cu[b + 1] - cu[b];
      const auto want =
          host_rows(lens[b], n, page_size, kernels::block_plan_chunk(p, lens[b]), h, b);
      for (int32_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[cu[b] + i], want[i])
            << "iteration " << iter << ", request " << b << " query " << i;
        ASSERT_FALSE(want[i].empty());
        owned[cu[b] + i] = true;
      }
    }
    for (int64_t r = 0; r < total_rows; ++r) {
      if (!owned[r]) {
        ASSERT_TRUE(got[r].empty()) << "iteration " << iter << ", row " << r;
      }
    }
    for (const WorkItem& w : d.work) {
      if (w.request >= 0) {
        ASSERT_LT(w.qo_begin, cu[w.request + 1] - cu[w.request]);
        ASSERT_LE(w.qo_end, cu[w.request + 1] - cu[w.request]);
      }
      if (w.partial_base >= 0) {
        ASSERT_LE(w.partial_base + (w.qo_end - w.qo_begin), worst.plan.num_partial_rows);
      }
    }
    idle_tiles += std::count_if(d.work.begin(), d.work.end(),
                                [](const WorkItem& w) { return w.request < 0; }) > 0;
  }
  EXPECT_GT(split_cases, 15);
  EXPECT_GT(idle_tiles, 50);
  EXPECT_GT(refused, 10);
  EXPECT_GT(empty_requests, 5);
}

// A refused request (here request 1: a bad page) gets no work item and no merge; the others keep
// theirs.
TEST(BlockTablePlan, RefusedRequestGetsNoWork) {
  const std::vector<int32_t> lens{40, 50, 7};
  const detail::WrapperState worst = planned({64, 64, 64}, 1, 4, 2, true);
  const BlockTablePlan p = plan_of(worst, 1, 4, 64, 16);
  ASSERT_GT(p.num_chunks, 1);
  const DevicePlan d = run_rules(p, lens, {true, false, true});
  EXPECT_EQ(d.kv_lens, (std::vector<int32_t>{40, 0, 7}));
  for (const WorkItem& w : d.work) EXPECT_NE(w.request, 1);
  EXPECT_EQ(d.merge_out_row[1], -1);
  for (int32_t c = 0; c < p.num_chunks; ++c) {
    EXPECT_EQ(d.merge_rows[static_cast<std::size_t>(p.num_chunks) + c], p.empty_row);
  }
  EXPECT_EQ(d.merge_out_row[0], 0);   // 40 keys: several chunks, merged
  EXPECT_EQ(d.merge_out_row[2], -1);  // 7 keys: one chunk, written by its item
  bool final_item_of_2 = false;
  for (const WorkItem& w : d.work) {
    final_item_of_2 |= w.request == 2 && w.partial_base < 0 && w.kv_end == 7;
  }
  EXPECT_TRUE(final_item_of_2);
}

// The plan kernel's body (block_plan_pages_bad, block_plan_write_request), run here thread by
// thread for blocks of 128 and of 7 threads: every array it writes equals the rules' (run_rules,
// checked against the host plan above); MLA's row map; the empty partial row (value 0, score
// -inf) and nothing else of the partials; the refused requests' output rows and LSE NaN in the
// output's dtype, through padded strides, and not one other element touched.
TEST(BlockTablePlan, KernelBodyWritesTheRulesPlanThreadByThread) {
  std::mt19937 rng(11);
  int refused_cases = 0, refused_calls = 0;
  for (int iter = 0; iter < 120; ++iter) {
    const int nthreads = iter % 2 == 0 ? 128 : 7;
    const int32_t batch = 1 + static_cast<int32_t>(rng() % 5);
    const int32_t q_len = 1 + static_cast<int32_t>(rng() % 3);
    const int32_t page_size = std::vector<int32_t>{1, 4, 16}[rng() % 3];
    const int32_t max_seq_len = q_len + static_cast<int32_t>(rng() % 300);
    const int32_t max_blocks = (max_seq_len + page_size - 1) / page_size;
    const int32_t table_stride = max_blocks + static_cast<int32_t>(rng() % 3);
    const int64_t num_pages = 40;
    const Heads h = std::vector<Heads>{{8, 2, 64}, {4, 4, 16}}[rng() % 2];
    const int32_t worst_len = std::min(max_seq_len, max_blocks * page_size);
    const detail::WrapperState worst =
        planned(std::vector<int32_t>(batch, worst_len), q_len, page_size, 1 + rng() % 4, true, h);
    BlockTablePlan p = plan_of(worst, q_len, page_size, max_seq_len, max_blocks);
    p.min_chunk_tokens = page_size;
    p.num_pages = num_pages;
    p.table_stride = table_stride;
    // Lengths (one past max_seq_len now and then) and a table of page ids (one past the cache now
    // and then, in a block the request reads or in one it does not).
    std::vector<int32_t> lens, table(static_cast<std::size_t>(batch) * table_stride, -1);
    for (int32_t b = 0; b < batch; ++b) {
      int32_t len = q_len + static_cast<int32_t>(rng() % (max_seq_len - q_len + 1));
      if (rng() % 6 == 0) len = max_seq_len + 1;
      lens.push_back(len);
      for (int32_t i = 0; i < max_blocks; ++i) {
        table[b * table_stride + i] = static_cast<int32_t>(rng() % num_pages);
      }
      if (rng() % 4 == 0) {
        table[b * table_stride + rng() % max_blocks] = static_cast<int32_t>(num_pages);
      }
    }
    p.block_tables = table.data();
    // Every third case: variable query counts (the context call's cum_seq_lens_q), 0 to q_len a
    // request, now and then one more (refused, its rows NaN), out of order (every request
    // refused) or past the query rows.
    const bool variable = iter % 3 == 2;
    std::vector<int32_t> cu{0};
    for (int32_t b = 0; b < batch; ++b) {
      const int32_t over = variable && rng() % 6 == 0 ? 1 : 0;
      cu.push_back(cu.back() + static_cast<int32_t>(rng() % (q_len + 1)) + over);
    }
    int64_t total_rows = cu.back() + static_cast<int64_t>(rng() % 2);
    if (variable && rng() % 5 == 0) cu[batch] = cu[batch - 1] - 1;
    if (variable && rng() % 5 == 0) total_rows = std::max(0, cu[batch] - 1);
    if (variable) {
      p.cu_q = cu.data();
      p.total_rows = total_rows;
    }
    std::vector<bool> pages_ok;
    for (int32_t b = 0; b < batch; ++b) {
      bool ok = true;
      const int64_t blocks = (std::min<int64_t>(lens[b], worst_len) + page_size - 1) / page_size;
      for (int64_t i = 0; i < blocks; ++i) ok &= table[b * table_stride + i] < num_pages;
      pages_ok.push_back(ok);
    }
    const DevicePlan want = run_rules(p, lens, pages_ok);
    // The kernel's outputs, filled with a sentinel first.
    const int32_t tiles = kernels::block_plan_tiles(p);
    const auto items = static_cast<std::size_t>(batch) * tiles * p.num_chunks;
    // Merge entries (and MLA's row map) a query of the worst case each; output rows the query's.
    const int64_t entries = int64_t{batch} * q_len, hq = h.hq, dv = h.d;
    const int64_t rows = variable ? std::max<int64_t>(total_rows, cu[batch]) : entries;
    std::vector<int32_t> qo(batch + 1, -7), kvp(batch + 1, -7), kvl(batch, -7),
        row_req(entries, -7);
    std::vector<WorkItem> work(items, WorkItem{-7, -7, -7, -7, -7, -7});
    std::vector<int32_t> m_indptr, m_rows, m_out;
    if (p.num_chunks > 1) {
      m_indptr.assign(static_cast<std::size_t>(entries) + 1, -7);
      m_rows.assign(static_cast<std::size_t>(entries) * p.num_chunks, -7);
      m_out.assign(static_cast<std::size_t>(entries), -7);
    }
    // The request whose rows hold output row r (-1: none): uniform counts q_len rows each;
    // cum_seq_lens_q's rows [cu[b], cu[b + 1]) where they run forwards, those inside the query
    // tensor (a request running past its last row owns the rows up to it).
    std::vector<int32_t> owner(static_cast<std::size_t>(rows), -1);
    for (int32_t b = 0; b < batch; ++b) {
      const int64_t first = variable ? cu[b] : int64_t{b} * q_len;
      const int64_t end = variable ? cu[b + 1] : first + q_len;
      const int64_t last = variable ? std::min<int64_t>(end, total_rows) : end;
      for (int64_t r = first; first >= 0 && end >= first && r < last; ++r) owner[r] = b;
    }
    const int64_t partial_rows = worst.plan.num_partial_rows + 1;
    std::vector<float> tmp_v(static_cast<std::size_t>(partial_rows * hq * dv), 5.0f);
    std::vector<float> tmp_s(static_cast<std::size_t>(partial_rows * hq), 5.0f);
    const DType od =
        std::vector<DType>{DType::kFloat32, DType::kFloat16, DType::kBFloat16}[iter % 3];
    const int64_t es = od == DType::kFloat32 ? 4 : 2;
    const int64_t o_sh = dv + 3, o_sn = hq * o_sh + 5;
    std::vector<uint8_t> o(static_cast<std::size_t>(rows * o_sn * es), 0xAB);
    const int64_t l_sh = 2, l_sn = hq * l_sh + 1;
    std::vector<float> lse(static_cast<std::size_t>(rows * l_sn), 5.0f);
    p.qo_indptr = qo.data();
    p.kv_indptr = kvp.data();
    p.kv_lens = kvl.data();
    p.row_req = variable ? nullptr : row_req.data();  // MLA: uniform counts only
    p.work = work.data();
    p.merge_indptr = m_indptr.empty() ? nullptr : m_indptr.data();
    p.merge_rows = m_rows.empty() ? nullptr : m_rows.data();
    p.merge_out_row = m_out.empty() ? nullptr : m_out.data();
    p.tmp_v = tmp_v.data();
    p.tmp_s = tmp_s.data();
    p.o = o.data();
    p.o_dtype = od;
    p.o_stride_n = o_sn;
    p.o_stride_h = o_sh;
    p.lse = lse.data();
    p.lse_stride_n = l_sn;
    p.lse_stride_h = l_sh;
    p.num_qo_heads = static_cast<int32_t>(hq);
    p.head_dim_vo = static_cast<int32_t>(dv);
    // The blocks, in a shuffled order (no block depends on another).
    std::vector<int32_t> order(static_cast<std::size_t>(batch));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    bool call_refused = false;
    for (int32_t b : order) {
      bool cu_bad = false;
      for (int t = 0; t < nthreads; ++t) cu_bad |= kernels::block_plan_cu_bad(p, t, nthreads);
      call_refused = cu_bad;
      bool ok = !cu_bad && kernels::block_plan_request_ok(p, b, lens[b]);
      if (ok) {
        bool bad = false;
        for (int t = 0; t < nthreads; ++t)
          bad |= kernels::block_plan_pages_bad(p, b, lens[b], t, nthreads);
        ok = !bad;
      }
      ASSERT_EQ(ok, static_cast<bool>(want.ok[b])) << "request " << b;
      for (int t = 0; t < nthreads; ++t) {
        kernels::block_plan_write_request(p, b, lens[b], ok, t, nthreads);
        if (cu_bad) kernels::block_plan_refuse_all_rows(p, b, t, nthreads);
      }
    }
    for (int32_t b = 0; b <= batch; ++b) {
      ASSERT_EQ(qo[b], variable ? cu[b] : b * q_len);
      ASSERT_EQ(kvp[b], b * table_stride);
    }
    ASSERT_EQ(kvl, want.kv_lens);
    for (std::size_t k = 0; k < items; ++k) {
      const WorkItem& a = work[k];
      const WorkItem& e = want.work[k];
      ASSERT_TRUE(a.request == e.request && a.qo_begin == e.qo_begin && a.qo_end == e.qo_end &&
                  a.kv_begin == e.kv_begin && a.kv_end == e.kv_end &&
                  a.partial_base == e.partial_base)
          << "iteration " << iter << ", item " << k;
    }
    ASSERT_EQ(m_indptr, want.merge_indptr);
    ASSERT_EQ(m_rows, want.merge_rows);
    ASSERT_EQ(m_out, want.merge_out_row);
    for (int64_t r = 0; r < entries && !variable; ++r) {
      ASSERT_EQ(row_req[r], want.ok[r / q_len] ? r / q_len : -1);
    }
    for (int64_t pr = 0; pr < partial_rows; ++pr) {
      const bool empty = p.num_chunks > 1 && pr == p.empty_row;
      for (int64_t x = 0; x < hq * dv; ++x) ASSERT_EQ(tmp_v[pr * hq * dv + x], empty ? 0.0f : 5.0f);
      for (int64_t x = 0; x < hq; ++x) {
        ASSERT_EQ(tmp_s[pr * hq + x], empty ? -std::numeric_limits<float>::infinity() : 5.0f);
      }
    }
    // Output and LSE: NaN exactly where a refused request's rows are, and on every row of the
    // query tensor when the call is refused.
    const uint32_t nan_bits = od == DType::kFloat32    ? 0x7fc00000u
                              : od == DType::kBFloat16 ? 0x7fc0u
                                                       : 0x7e00u;
    const uint32_t fill = od == DType::kFloat32 ? 0xABABABABu : 0xABABu;
    for (int64_t e = 0; e < rows * o_sn; ++e) {
      const int64_t r = e / o_sn, in_row = e % o_sn, hh = in_row / o_sh, d = in_row % o_sh;
      const bool element = hh < hq && d < dv;
      const bool nan =
          element && ((owner[r] >= 0 && !want.ok[owner[r]]) || (call_refused && r < total_rows));
      uint32_t bits = 0;
      std::memcpy(&bits, o.data() + e * es, static_cast<std::size_t>(es));
      ASSERT_EQ(bits, nan ? nan_bits : fill) << "iteration " << iter << ", element " << e;
    }
    for (int64_t e = 0; e < rows * l_sn; ++e) {
      const int64_t r = e / l_sn, in_row = e % l_sn;
      const bool nan = in_row % l_sh == 0 && in_row / l_sh < hq &&
                       ((owner[r] >= 0 && !want.ok[owner[r]]) || (call_refused && r < total_rows));
      ASSERT_EQ(std::isnan(lse[e]), nan) << "iteration " << iter << ", lse element " << e;
      if (!nan) {
        ASSERT_EQ(lse[e], 5.0f);
      }
    }
    for (bool ok : want.ok) refused_cases += !ok;
    refused_calls += call_refused;
  }
  EXPECT_GT(refused_cases, 30);
  EXPECT_GT(refused_calls, 3);
}

// The plan kernel's body in the compact layout (block_table_plan_cuda.cu), run here block by
// block in a shuffled order and thread by thread: each block's verdict, then
// block_plan_write_request, its first tile summed from every thread's
// block_plan_compact_offset_part, block_plan_write_compact, and block_plan_refuse_all_rows for a
// refused call. Every array starts filled with a sentinel, so an entry nothing writes shows.
struct CompactRun {
  std::vector<WorkItem> work;
  std::vector<int32_t> merge_indptr, merge_rows, merge_out_row, qo, kvp, kvl;
  std::vector<bool> ok;
  bool call_refused = false;
};

CompactRun run_compact_kernel(BlockTablePlan p, const std::vector<int32_t>& lens,
                              const api::RaggedDeviceGrid& g, int nthreads, std::mt19937& rng) {
  CompactRun r;
  const int64_t rows = p.total_rows, nc = p.num_chunks;
  r.work.assign(static_cast<std::size_t>(g.items), WorkItem{-7, -7, -7, -7, -7, -7});
  r.qo.assign(static_cast<std::size_t>(p.batch) + 1, -7);
  r.kvp.assign(r.qo.size(), -7);
  r.kvl.assign(static_cast<std::size_t>(p.batch), -7);
  if (nc > 1) {
    r.merge_indptr.assign(static_cast<std::size_t>(rows) + 1, -7);
    r.merge_rows.assign(static_cast<std::size_t>(rows * nc), -7);
    r.merge_out_row.assign(static_cast<std::size_t>(rows), -7);
  }
  const int64_t hd = 2;  // one head of two: the outputs only show where NaN rows go
  std::vector<float> tmp_v(static_cast<std::size_t>(std::max<int64_t>(g.partial_rows, 1) * hd));
  std::vector<float> tmp_s(static_cast<std::size_t>(std::max<int64_t>(g.partial_rows, 1)));
  std::vector<float> o(static_cast<std::size_t>(std::max<int64_t>(rows, 1) * hd), 5.0f);
  p.qo_indptr = r.qo.data();
  p.kv_indptr = r.kvp.data();
  p.kv_lens = r.kvl.data();
  p.work = r.work.data();
  p.merge_indptr = r.merge_indptr.data();
  p.merge_rows = r.merge_rows.data();
  p.merge_out_row = r.merge_out_row.data();
  p.tmp_v = tmp_v.data();
  p.tmp_s = tmp_s.data();
  p.o = o.data();
  p.o_dtype = DType::kFloat32;
  p.o_stride_n = hd;
  p.o_stride_h = hd;
  p.num_qo_heads = 1;
  p.head_dim_vo = static_cast<int32_t>(hd);
  r.ok.assign(static_cast<std::size_t>(p.batch), false);
  std::vector<int32_t> order(static_cast<std::size_t>(p.batch));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int32_t b : order) {
    bool cu_bad = false;
    for (int t = 0; t < nthreads; ++t) cu_bad |= kernels::block_plan_cu_bad(p, t, nthreads);
    r.call_refused = cu_bad;
    bool ok = !cu_bad && kernels::block_plan_request_ok(p, b, lens[b]);
    for (int t = 0; t < nthreads && ok; ++t) {
      ok = !kernels::block_plan_pages_bad(p, b, lens[b], t, nthreads);
    }
    r.ok[b] = ok;
    int64_t offset = 0;
    for (int t = 0; t < nthreads && !cu_bad; ++t) {
      offset += kernels::block_plan_compact_offset_part(p, b, t, nthreads);
    }
    for (int t = 0; t < nthreads; ++t) {
      kernels::block_plan_write_request(p, b, lens[b], ok, t, nthreads);
      kernels::block_plan_write_compact(p, b, lens[b], ok, !cu_bad, offset, t, nthreads);
      if (cu_bad) kernels::block_plan_refuse_all_rows(p, b, t, nthreads);
    }
  }
  return r;
}

// Ragged K/V (trtllm_ragged_attention_deepseek on CUDA: cum_seq_lens_q, cum_seq_lens_kv and
// seq_lens on the device; the grid api::ragged_device_grid's, the compact layout), and a third
// of the cases paged (trtllm_fmha_v2_prefill's block table): the rules accept exactly what the
// host checks of ragged_deepseek.cpp and fmha_v2_prefill.cpp accept (a request: its key rows'
// count equal to seq_lens, or its pages inside the table and the cache, at most max_q_len
// queries and max_kv_len keys; the call: both arrays from 0 and never decreasing, cum_seq_lens_q
// ending at the query's rows, cum_seq_lens_kv inside the key's); every item and merge entry of the
// grid is written, inside it; each accepted request's rows see what the host plan of that request
// alone with its chunk gives them; refused requests get no work, and a refused call none at all.
// Loose bounds (max_q_len far above the real counts) cost no grid: the compact grid holds at most
// rows / tile + batch tiles.
TEST(BlockTablePlan, RaggedKvFollowsTheHostRulesAndTheHostPlansKeys) {
  std::mt19937 rng(31);
  int split_cases = 0, refused_requests = 0, refused_calls = 0, accepted = 0, compacted = 0;
  int paged_refused = 0, paged_accepted = 0;
  const std::vector<Heads> heads{{16, 16, 128}, {8, 2, 64}, {4, 1, 256}};
  for (int iter = 0; iter < 450; ++iter) {
    const int nthreads = iter % 2 == 0 ? 128 : 7;
    const int32_t batch = 1 + static_cast<int32_t>(rng() % 6);
    const int32_t max_q = 1 + static_cast<int32_t>(rng() % 300);
    const int32_t max_kv = 1 + static_cast<int32_t>(rng() % 3000);
    const Heads h = heads[rng() % heads.size()];
    std::vector<int32_t> lens, cu{0}, ckv{0};
    for (int32_t b = 0; b < batch; ++b) {
      // Mostly far below the bound now and then (one long request among short ones).
      const int32_t n = rng() % 3 == 0 ? static_cast<int32_t>(rng() % (max_q + 1))
                                       : static_cast<int32_t>(rng() % (max_q / 8 + 1));
      const int32_t len = rng() % 4 == 0 ? max_kv : static_cast<int32_t>(rng() % (max_kv + 1));
      cu.push_back(cu.back() + n);
      ckv.push_back(ckv.back() + len);
      lens.push_back(len);
    }
    int64_t total_rows = cu.back(), kv_rows = ckv.back() + static_cast<int64_t>(rng() % 3);
    const int32_t b = static_cast<int32_t>(rng() % batch);
    switch (rng() % 10) {
      case 0:  // seq_lens disagrees with the key rows
        lens[b] += 1;
        break;
      case 1:  // more queries than max_q_len (the rows that follow shift)
        for (int32_t j = b + 1; j <= batch; ++j) cu[j] += max_q + 1 - (cu[b + 1] - cu[b]);
        total_rows = cu.back();
        break;
      case 2:  // more keys than max_kv_len
        for (int32_t j = b + 1; j <= batch; ++j) ckv[j] += max_kv + 1 - lens[b];
        lens[b] = max_kv + 1;
        kv_rows = ckv.back();
        break;
      case 3:  // cum_seq_lens_q not ending at the query's rows
        total_rows += 1;
        break;
      case 4:  // cum_seq_lens_kv past the key's rows
        kv_rows = ckv.back() - 1;
        break;
      case 5:  // cum_seq_lens_kv decreasing
        if (lens[b] > 0) ckv[b + 1] = ckv[b] - 1;
        break;
      case 6:  // cum_seq_lens_kv not starting at 0
        for (int32_t& x : ckv) x += 1;
        kv_rows = ckv.back();
        break;
      default:
        break;
    }
    if (total_rows == 0) continue;  // the API plans nothing for a query of no rows
    // Every third case paged (trtllm_fmha_v2_prefill's Q_PAGED_KV layouts): no cum_seq_lens_kv,
    // a block table of `cols` columns (now and then fewer than max_kv_len needs) over 50 pages,
    // now and then a page id outside the cache.
    const bool paged = iter % 3 == 0;
    const int32_t ps = paged ? std::vector<int32_t>{1, 4, 16}[rng() % 3] : 1;
    const int64_t num_pages = 50;
    int32_t cols = (max_kv + ps - 1) / ps + static_cast<int32_t>(rng() % 2);
    if (rng() % 4 == 0) cols = std::max(0, cols - 2);
    std::vector<int32_t> table(static_cast<std::size_t>(batch) * cols);
    for (int32_t& x : table) x = static_cast<int32_t>(rng() % num_pages);
    if (cols > 0 && rng() % 3 == 0) table[rng() % table.size()] = rng() % 2 ? -1 : 50;
    // The host checks (ragged_deepseek.cpp, fmha_v2_prefill.cpp): the arrays, then each request.
    const bool call_ok =
        cu[0] == 0 && std::is_sorted(cu.begin(), cu.end()) && cu[batch] == total_rows &&
        (paged || (ckv[0] == 0 && std::is_sorted(ckv.begin(), ckv.end()) && ckv[batch] <= kv_rows));
    std::vector<bool> want_ok;
    for (int32_t r = 0; r < batch; ++r) {
      bool keys_ok = lens[r] >= 0 && lens[r] <= max_kv;
      if (paged) {
        const int64_t need = (int64_t{lens[r]} + ps - 1) / ps;
        keys_ok = keys_ok && need <= cols;
        for (int64_t i = 0; keys_ok && i < need; ++i) {
          keys_ok = table[r * cols + i] >= 0 && table[r * cols + i] < num_pages;
        }
      } else {
        keys_ok = keys_ok && lens[r] == ckv[r + 1] - ckv[r];
      }
      want_ok.push_back(call_ok && keys_ok && cu[r + 1] - cu[r] <= max_q);
    }
    refused_calls += !call_ok;
    BlockTablePlan p;
    p.batch = batch;
    p.q_len = static_cast<int32_t>(std::min<int64_t>(max_q, total_rows));  // the API's clamp
    p.max_seq_len = max_kv;
    p.max_blocks = max_kv;
    p.page_size = 1;
    p.cu_q = cu.data();
    p.total_rows = total_rows;
    p.cu_q_exact = true;
    if (paged) {  // as fmha_v2_prefill_planned_on_device sets it
      p.block_tables = table.empty() ? nullptr : table.data();
      p.table_stride = cols;
      p.max_blocks = cols;
      p.num_pages = num_pages;
      p.page_size = ps;
      p.max_seq_len = std::min(max_kv, cols * ps);
    } else {
      p.cu_kv = ckv.data();
      p.kv_rows = kv_rows;
    }
    p.seq_lens = lens.data();
    const int64_t max_grid = std::vector<int64_t>{0, 8, 64, 1 << 20}[rng() % 4];
    const api::RaggedDeviceGrid g = api::ragged_device_grid(
        p, static_cast<int32_t>(h.hq / h.hkv), static_cast<int32_t>(h.hkv),
        static_cast<int32_t>(h.d), static_cast<int32_t>(h.d), max_grid, 0, "test");
    ASSERT_TRUE(p.compact);
    if (g.partial_rows > 0) {  // no room for the partials: the keys stay in one chunk
      BlockTablePlan q = p;
      const int64_t need = g.partial_rows * h.hq * (h.d + 1) * 4;
      EXPECT_EQ(api::ragged_device_grid(q, static_cast<int32_t>(h.hq / h.hkv),
                                        static_cast<int32_t>(h.hkv), static_cast<int32_t>(h.d),
                                        static_cast<int32_t>(h.d), max_grid, 0, "test", 0, need - 1)
                    .partial_rows,
                0);
      EXPECT_EQ(q.num_chunks, 1);
      EXPECT_EQ(api::ragged_device_grid(q, static_cast<int32_t>(h.hq / h.hkv),
                                        static_cast<int32_t>(h.hkv), static_cast<int32_t>(h.d),
                                        static_cast<int32_t>(h.d), max_grid, 0, "test", 0, need)
                    .partial_rows,
                g.partial_rows);
    }
    const int64_t nc = p.num_chunks, tile = p.tile_rows;
    ASSERT_EQ(g.items, int64_t{p.tile_cap} * nc);
    ASSERT_LE(p.tile_cap, total_rows / tile + batch);
    ASSERT_LE(p.tile_cap, int64_t{batch} * ((p.q_len + tile - 1) / tile));
    ASSERT_EQ(g.partial_rows, nc > 1 ? total_rows * nc + 1 : 0);
    ASSERT_EQ(g.max_rows, std::min<int64_t>(p.q_len, tile));
    split_cases += nc > 1;
    compacted += p.tile_cap < int64_t{batch} * ((p.q_len + tile - 1) / tile);
    const CompactRun d = run_compact_kernel(p, lens, g, nthreads, rng);
    ASSERT_EQ(d.call_refused, !call_ok) << "iteration " << iter;
    for (const WorkItem& w : d.work) ASSERT_NE(w.qo_begin, -7) << "an item nothing wrote";
    for (int32_t x : d.merge_indptr) ASSERT_NE(x, -7) << "a merge entry nothing wrote";
    for (int32_t x : d.merge_out_row) ASSERT_NE(x, -7) << "a merge entry nothing wrote";
    if (!call_ok) {
      for (const WorkItem& w : d.work) ASSERT_EQ(w.request, -1);
      for (int32_t x : d.merge_out_row) ASSERT_EQ(x, -1);
      continue;
    }
    ASSERT_EQ(d.qo, cu);
    for (int32_t r = 0; r <= batch; ++r) ASSERT_EQ(d.kvp[r], paged ? r * cols : ckv[r]);
    const std::vector<int64_t> begins(cu.begin(), cu.end() - 1);
    const auto got = contributions(d.work, d.merge_indptr, d.merge_rows, d.merge_out_row, begins,
                                   total_rows, p.empty_row);
    for (int32_t r = 0; r < batch; ++r) {
      ASSERT_EQ(static_cast<bool>(d.ok[r]), static_cast<bool>(want_ok[r]))
          << "iteration " << iter << ", request " << r;
      ASSERT_EQ(d.kvl[r], want_ok[r] ? lens[r] : 0);
      const int32_t n = cu[r + 1] - cu[r];
      (want_ok[r] ? paged_accepted : paged_refused) += paged;
      if (!want_ok[r]) {
        ++refused_requests;
        for (const WorkItem& w : d.work) ASSERT_NE(w.request, r);
        for (int32_t i = 0; i < n; ++i) ASSERT_TRUE(got[cu[r] + i].empty());
        continue;
      }
      ++accepted;
      const int64_t chunk = kernels::block_plan_chunk(p, lens[r]);
      ASSERT_EQ(chunk % 64, 0) << "a chunk ends inside a K/V tile";
      const auto want = host_rows(lens[r], n, 1, chunk, h, r);  // keys in pages of one token
      for (int32_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[cu[r] + i], want[i])
            << "iteration " << iter << ", request " << r << " query " << i;
        ASSERT_FALSE(want[i].empty());
      }
    }
    // Every item reads inside its request's rows and keys, and inside the partials.
    for (const WorkItem& w : d.work) {
      if (w.request < 0) continue;
      ASSERT_LE(w.qo_end, cu[w.request + 1] - cu[w.request]);
      ASSERT_LE(w.qo_end - w.qo_begin, g.max_rows);
      ASSERT_LE(w.kv_end, lens[w.request]);
      if (w.partial_base >= 0) {
        ASSERT_LE(w.partial_base + (w.qo_end - w.qo_begin), g.partial_rows - 1);
      }
    }
  }
  EXPECT_GT(split_cases, 30);
  EXPECT_GT(refused_requests, 20);
  EXPECT_GT(refused_calls, 20);
  EXPECT_GT(accepted, 300);
  EXPECT_GT(compacted, 50);
  EXPECT_GT(paged_refused, 10);
  EXPECT_GT(paged_accepted, 80);
}

// cudnn_batch_prefill_with_kv_cache's ragged call on CUDA (kernels/cudnn_ragged_plan.h, then the
// plan kernel's kv_start form): over random calls as the vision encoders make them (element,
// byte or token offsets of int32 or int64, each given or not, V now and then a view with twice
// the rows' stride, K's rows packed or with gaps, batches padded with empty requests, lengths
// omitted with token offsets), each with at most one value the host refuses, the prepass run
// thread by thread (blocks of 7 and of 256 threads, as the kernel's chunks, scan and reductions)
// refuses exactly the calls the host op refuses on the CPU; otherwise it writes the host's
// running sums, key starts and counts, and the plan kernel then gives each request's rows the
// keys the host plan of that request alone gives them, at the request's start.
TEST(CudnnRaggedPlan, RefusesWhatTheHostRefusesAndFeedsThePlan) {
  using kernels::CudnnRaggedPlan;
  std::mt19937 rng(74);
  const Heads h{2, 1, 16};
  int refused = 0, accepted = 0, derived = 0, int64s = 0, gaps = 0, strided = 0;
  const char* const kinds[] = {"elements", "bytes", "tokens"};
  for (int iter = 0; iter < 600; ++iter) {
    const int nthreads = iter % 2 == 0 ? 256 : 7;
    const int32_t real = 1 + static_cast<int32_t>(rng() % 5);
    const int32_t batch = real + (rng() % 3 == 0 ? static_cast<int32_t>(rng() % 3) : 0);
    const int64_t max_q = 1 + rng() % 9, max_kv = 1 + rng() % 12;
    const bool causal = rng() % 3 == 0;
    const std::string units = kinds[rng() % 3];
    const bool tokens = units == "tokens";
    std::vector<int64_t> lq, lk, kstart;
    int64_t kr = 0;
    for (int32_t b = 0; b < batch; ++b) {
      const bool pad = b >= real;  // the engines' padding: empty requests at the total
      const int64_t nk = pad ? 0 : static_cast<int64_t>(rng() % (max_kv + 1));
      int64_t nq = pad ? 0 : static_cast<int64_t>(rng() % (max_q + 1));
      if (causal) nq = std::min(nq, nk);
      const bool gap = !pad && rng() % 4 == 0;
      gaps += gap;
      kr += gap ? 1 + static_cast<int64_t>(rng() % 3) : 0;
      lq.push_back(nq);
      lk.push_back(nk);
      kstart.push_back(kr);
      kr += nk;
    }
    const bool has_gaps = std::accumulate(lk.begin(), lk.end(), int64_t{0}) != kr;
    // Which tensors get offsets; K's gaps need batch_offsets_k.
    bool give[4];
    for (bool& g : give) g = rng() % 3 != 0;
    if (has_gaps) give[CudnnRaggedPlan::kOffK] = true;
    // Lengths omitted: token offsets of batch + 1 entries whose differences they are (K packed).
    const bool omit = tokens && !has_gaps && rng() % 3 == 0;
    if (omit) give[CudnnRaggedPlan::kOffQ] = give[CudnnRaggedPlan::kOffK] = true;
    derived += omit;
    int64_t q_rows = std::accumulate(lq.begin(), lq.end(), int64_t{0});
    int64_t k_rows = kr + static_cast<int64_t>(rng() % 2);
    // One value the host refuses, or none.
    const int32_t b = static_cast<int32_t>(rng() % real);
    int kind = static_cast<int>(rng() % 14);
    // With the lengths omitted, q's and K's offsets are the lengths: bumping one moves a row
    // from one request to the next, a call the host takes.
    if ((omit && (kind <= 3 || kind == 6 || kind == 9)) || (kind == 5 && kr == 0)) kind = 99;
    int64_t bump[4] = {0, 0, 0, 0};  // added to an offset of request b
    switch (kind) {
      case 0:
        lq[b] = max_q + 1;
        break;  // over max_token_per_sequence
      case 1:
        lk[b] = max_kv + 1;
        break;  // over max_sequence_kv
      case 2:
        lq[b] = -1;
        break;  // negative
      case 3:
        if (causal) lq[b] = lk[b] + 1;
        break;  // more queries than keys
      case 4:
        q_rows += 1;
        break;  // q has a row of no request
      case 5:
        k_rows = kr - 1;
        break;  // the keys end past K
      case 6:
        bump[CudnnRaggedPlan::kOffQ] = 1;
        break;  // not whole rows / not packed
      case 7:
        bump[CudnnRaggedPlan::kOffO] = -1;
        break;
      case 8:
        bump[CudnnRaggedPlan::kOffV] = 1;
        break;
      case 9:
        break;  // K's offset negative (below)
      default:
        break;
    }
    if (kind == 0 || kind == 2 || kind == 3) {  // the rows after it move with it
      q_rows = 0;
      for (int64_t x : lq) q_rows += std::max<int64_t>(x, 0);
    }
    if (q_rows <= 0) continue;  // no query row: the host path only
    Tensor q = Tensor::zeros({q_rows, h.hq, h.d}, DType::kFloat16);
    Tensor k = Tensor::zeros({k_rows, h.hkv, h.d}, DType::kFloat16);
    const bool v_view = rng() % 2 == 0;
    strided += v_view;
    Tensor v = v_view ? Tensor::zeros({k_rows, 2, h.hkv, h.d}, DType::kFloat16).select(1, 1)
                      : Tensor::zeros({k_rows, h.hkv, h.d}, DType::kFloat16);
    const int64_t o_stride = h.hq * h.d;
    const int64_t strides[4] = {q.stride(0), o_stride, k.stride(0), v.stride(0)};
    const bool bytes = units == "bytes";
    int64_t unit[4];
    for (int i = 0; i < 4; ++i) unit[i] = tokens ? 1 : strides[i] * (bytes ? 2 : 1);
    // Offsets: q / o the running sums, k the starts, v K's rows; batch + 1 entries (the last the
    // end), as the engines pass them.
    std::vector<int64_t> rows_of[4];
    int64_t qs = 0;
    for (int32_t r = 0; r < batch; ++r) {
      rows_of[0].push_back(qs);
      rows_of[1].push_back(qs);
      rows_of[2].push_back(kstart[r]);
      rows_of[3].push_back(kstart[r]);
      qs += std::max<int64_t>(lq[r], 0);
    }
    rows_of[0].push_back(qs);
    rows_of[1].push_back(qs);
    rows_of[2].push_back(kr);
    rows_of[3].push_back(kr);
    std::vector<int64_t> vals[4];
    std::optional<Tensor> off[4];
    bool is64[4];
    for (int i = 0; i < 4; ++i) {
      if (!give[i]) continue;
      for (int64_t x : rows_of[i]) vals[i].push_back(x * unit[i]);
      if (!omit && rng() % 3 == 0) vals[i].pop_back();  // batch entries, not batch + 1
      vals[i][b] += bump[i];
      if (kind == 9 && i == CudnnRaggedPlan::kOffK) vals[i][b] = -unit[i];
      is64[i] = rng() % 2 == 0;
      int64s += is64[i];
      Tensor t = Tensor::empty({static_cast<int64_t>(vals[i].size())},
                               is64[i] ? DType::kInt64 : DType::kInt32);
      for (std::size_t j = 0; j < vals[i].size(); ++j) {
        if (is64[i]) {
          t.data<int64_t>()[j] = vals[i][j];
        } else {
          t.data<int32_t>()[j] = static_cast<int32_t>(vals[i][j]);
        }
      }
      off[i] = t;
    }
    std::vector<int32_t> lq32(lq.begin(), lq.end()), lk32(lk.begin(), lk.end());
    auto lens_tensor = [&](const std::vector<int32_t>& x) {
      Tensor t = Tensor::empty({static_cast<int64_t>(x.size()), 1, 1, 1}, DType::kInt32);
      std::memcpy(t.data_ptr(), x.data(), x.size() * sizeof(int32_t));
      return t;
    };
    const std::optional<Tensor> lens_q = omit ? std::nullopt : std::optional(lens_tensor(lq32));
    const std::optional<Tensor> lens_kv = omit ? std::nullopt : std::optional(lens_tensor(lk32));
    // The host's verdict: the op on the CPU.
    bool host_refused = false;
    try {
      cudnn_batch_prefill_with_kv_cache(q, k, v, 0.25, Tensor::empty({16}, DType::kUInt8), max_q,
                                        max_kv, lens_q, lens_kv, std::nullopt, causal, false,
                                        std::nullopt, std::nullopt, std::nullopt, off[0], off[1],
                                        off[2], off[3], std::nullopt, units);
    } catch (const Error& e) {
      host_refused = true;
      ASSERT_NE(e.code(), ErrorCode::kInternal) << e.what();
    }
    // The prepass, thread by thread.
    CudnnRaggedPlan cp;
    for (int i = 0; i < 4; ++i) {
      if (!off[i]) continue;
      cp.off[i] = off[i]->data_ptr();
      cp.off64[i] = is64[i];
      cp.unit[i] = unit[i];
    }
    cp.lens_q = omit ? nullptr : lq32.data();
    cp.lens_kv = omit ? nullptr : lk32.data();
    cp.batch = batch;
    cp.q_rows = q_rows;
    cp.kv_rows = std::min(k.size(0), v.size(0));
    cp.max_q = max_q;
    cp.max_kv = max_kv;
    cp.causal = causal;
    std::vector<int32_t> cu(static_cast<std::size_t>(batch) + 1, -7), ks(batch, -7), kl(batch, -7);
    int32_t refuse = -7;
    cp.cu_q = cu.data();
    cp.kv_start = ks.data();
    cp.kv_len = kl.data();
    cp.refuse = &refuse;
    std::vector<kernels::CudnnPlanSums> sums;
    for (int t = 0; t < nthreads; ++t)
      sums.push_back(kernels::cudnn_plan_chunk_sums(cp, t, nthreads));
    bool any_bad = false;
    int64_t max_end = 0, pq = 0, pk = 0;
    for (int t = 0; t < nthreads; ++t) {
      const kernels::CudnnPlanVerdict v2 = kernels::cudnn_plan_write_chunk(cp, t, nthreads, pq, pk);
      any_bad |= v2.bad;
      max_end = std::max(max_end, v2.max_end);
      pq += sums[t].q;
      pk += sums[t].kv;
    }
    refuse = kernels::cudnn_plan_refused(cp, any_bad, max_end) ? 1 : 0;
    ASSERT_EQ(refuse != 0, host_refused) << "iteration " << iter << ", kind " << kind;
    for (int32_t x : cu) ASSERT_NE(x, -7);
    for (int32_t x : ks) ASSERT_NE(x, -7);
    if (host_refused) {
      ++refused;
    } else {
      ++accepted;
      for (int32_t r = 0; r <= batch; ++r) {
        ASSERT_EQ(cu[r], rows_of[0][r])
            << "iteration " << iter << " kind " << kind << " omit " << omit << " units " << units
            << " batch " << batch << " b " << b << " q_rows " << q_rows << " r " << r;
      }
      for (int32_t r = 0; r < batch; ++r) {
        ASSERT_EQ(ks[r], kstart[r]);
        ASSERT_EQ(kl[r], lk[r]);
      }
    }
    // The plan kernel's kv_start form on what the prepass wrote.
    BlockTablePlan p;
    p.batch = batch;
    p.total_rows = q_rows;
    p.q_len = static_cast<int32_t>(std::min<int64_t>(max_q, q_rows));
    p.cu_q = cu.data();
    p.cu_q_exact = true;
    p.causal = causal;
    p.kv_rows = cp.kv_rows;
    p.page_size = 1;
    p.max_seq_len = static_cast<int32_t>(std::min<int64_t>(max_kv, cp.kv_rows));
    p.max_blocks = p.max_seq_len;
    p.kv_start = ks.data();
    p.seq_lens = kl.data();
    p.refuse = &refuse;
    const api::RaggedDeviceGrid g = api::ragged_device_grid(
        p, static_cast<int32_t>(h.hq / h.hkv), static_cast<int32_t>(h.hkv),
        static_cast<int32_t>(h.d), static_cast<int32_t>(h.d), rng() % 2 ? 4 : 0, 0, "test");
    const CompactRun d = run_compact_kernel(p, kl, g, nthreads, rng);
    ASSERT_EQ(d.call_refused, host_refused) << "iteration " << iter;
    for (const WorkItem& w : d.work) ASSERT_NE(w.qo_begin, -7) << "an item nothing wrote";
    if (host_refused) {
      for (const WorkItem& w : d.work) ASSERT_EQ(w.request, -1);
      continue;
    }
    const std::vector<int64_t> begins(cu.begin(), cu.end() - 1);
    const auto got = contributions(d.work, d.merge_indptr, d.merge_rows, d.merge_out_row, begins,
                                   q_rows, p.empty_row);
    for (int32_t r = 0; r < batch; ++r) {
      ASSERT_TRUE(d.ok[r]);
      ASSERT_EQ(d.kvp[r], kstart[r]);
      ASSERT_EQ(d.kvl[r], lk[r]);
      if (lq[r] == 0) continue;
      const int64_t chunk = kernels::block_plan_chunk(p, lk[r]);
      const auto want =
          host_rows(static_cast<int32_t>(lk[r]), static_cast<int32_t>(lq[r]), 1, chunk, h, r);
      for (int32_t i = 0; i < lq[r]; ++i) ASSERT_EQ(got[cu[r] + i], want[i]);
    }
  }
  EXPECT_GT(refused, 150);
  EXPECT_GT(accepted, 150);
  EXPECT_GT(derived, 10);
  EXPECT_GT(int64s, 100);
  EXPECT_GT(gaps, 50);
  EXPECT_GT(strided, 100);
}

// The plan kernel's body in the ragged form, thread by thread (blocks of 7 and 128 threads), as
// the warp-per-row kernel reads it (no work items: the row map): kv_indptr is cum_seq_lens_kv,
// the row map names each row's request, -1 for a refused request's rows (NaN, with their LSE) and
// for every row of a refused call (all NaN); rows of accepted requests are not touched.
TEST(BlockTablePlan, RaggedKernelBodyWritesTheRowMapAndNanRows) {
  struct Case {
    std::vector<int32_t> cu, ckv, lens;
    int64_t total_rows;
    std::vector<int32_t> row_req;  // expected
    bool refused_call;
  };
  const std::vector<Case> cases = {
      {{0, 2, 2, 5}, {0, 3, 3, 10}, {3, 0, 7}, 5, {0, 0, 2, 2, 2}, false},
      {{0, 2, 2, 5}, {0, 3, 3, 10}, {3, 0, 6}, 5, {0, 0, -1, -1, -1}, false},   // seq_lens
      {{0, 4, 4, 5}, {0, 3, 3, 10}, {3, 0, 7}, 5, {-1, -1, -1, -1, 2}, false},  // 4 > max_q_len
      {{0, 2, 2, 4}, {0, 3, 3, 10}, {3, 0, 7}, 5, {-1, -1, -1, -1, -1}, true},  // ends at 4, not 5
      {{0, 2, 2, 5}, {0, 3, 2, 10}, {3, 0, 8}, 5, {-1, -1, -1, -1, -1}, true},  // cu_kv decreases
      {{0, 2, 2, 5}, {0, 3, 3, 12}, {3, 0, 9}, 5, {0, 0, -1, -1, -1}, false},   // 9 > max_kv_len
  };
  const int64_t hq = 2, dv = 3, kv_rows = 12;
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    for (int nthreads : {7, 128}) {
      SCOPED_TRACE(::testing::Message() << "case " << ci << ", " << nthreads << " threads");
      const Case& c = cases[ci];
      BlockTablePlan p;
      p.batch = 3;
      p.q_len = 3;
      p.max_seq_len = 8;
      p.max_blocks = 8;
      p.page_size = 1;
      p.seq_lens = c.lens.data();
      p.cu_q = c.cu.data();
      p.total_rows = c.total_rows;
      p.cu_q_exact = true;
      p.cu_kv = c.ckv.data();
      p.kv_rows = kv_rows;
      std::vector<int32_t> qo(4, -7), kvp(4, -7), kvl(3, -7), row_req(c.total_rows, -1);
      std::vector<float> o(static_cast<std::size_t>(c.total_rows * hq * dv), 5.0f);
      std::vector<float> lse(static_cast<std::size_t>(c.total_rows * hq), 5.0f);
      p.qo_indptr = qo.data();
      p.kv_indptr = kvp.data();
      p.kv_lens = kvl.data();
      p.row_req = row_req.data();  // the launcher's -1 fill done above
      p.o = o.data();
      p.o_dtype = DType::kFloat32;
      p.o_stride_n = hq * dv;
      p.o_stride_h = dv;
      p.lse = lse.data();
      p.lse_stride_n = hq;
      p.lse_stride_h = 1;
      p.num_qo_heads = static_cast<int32_t>(hq);
      p.head_dim_vo = static_cast<int32_t>(dv);
      for (int32_t b = 0; b < p.batch; ++b) {
        bool cu_bad = false;
        for (int t = 0; t < nthreads; ++t) cu_bad |= kernels::block_plan_cu_bad(p, t, nthreads);
        ASSERT_EQ(cu_bad, c.refused_call);
        bool ok = !cu_bad && kernels::block_plan_request_ok(p, b, c.lens[b]);
        for (int t = 0; t < nthreads && ok; ++t) {
          ok = !kernels::block_plan_pages_bad(p, b, c.lens[b], t, nthreads);  // no table: none
        }
        for (int t = 0; t < nthreads; ++t) {
          kernels::block_plan_write_request(p, b, c.lens[b], ok, t, nthreads);
          if (cu_bad) kernels::block_plan_refuse_all_rows(p, b, t, nthreads);
        }
      }
      EXPECT_EQ(qo, c.cu);
      EXPECT_EQ(kvp, c.ckv);
      EXPECT_EQ(row_req, c.row_req);
      for (int32_t b = 0; b < 3; ++b) {
        const bool refused =
            c.refused_call || (c.row_req.size() > static_cast<std::size_t>(c.cu[b]) &&
                               c.cu[b + 1] > c.cu[b] && c.row_req[c.cu[b]] < 0);
        if (c.cu[b + 1] > c.cu[b]) {
          EXPECT_EQ(kvl[b], refused ? 0 : c.lens[b]) << "request " << b;
        }
      }
      for (int64_t r = 0; r < c.total_rows; ++r) {
        const bool nan = c.row_req[r] < 0;
        for (int64_t x = 0; x < hq * dv; ++x) {
          EXPECT_EQ(std::isnan(o[r * hq * dv + x]), nan) << "row " << r;
          if (!nan) {
            EXPECT_EQ(o[r * hq * dv + x], 5.0f);
          }
        }
        for (int64_t x = 0; x < hq; ++x) EXPECT_EQ(std::isnan(lse[r * hq + x]), nan);
      }
    }
  }
}

// What the host checks refuse (trtllm_attention.cpp, lengths() and run_block_call), by hand.
TEST(BlockTablePlan, LengthRulesByHand) {
  BlockTablePlan p;
  p.max_seq_len = 100;
  p.page_size = 16;
  p.max_blocks = 4;  // 64 keys at most
  p.q_len = 3;
  EXPECT_TRUE(kernels::block_plan_len_ok(p, 0, 3));
  EXPECT_TRUE(kernels::block_plan_len_ok(p, 64, 3));
  EXPECT_FALSE(kernels::block_plan_len_ok(p, 65, 3));  // a fifth block
  EXPECT_FALSE(kernels::block_plan_len_ok(p, -1, 3));
  p.max_blocks = 10;
  EXPECT_TRUE(kernels::block_plan_len_ok(p, 100, 3));
  EXPECT_FALSE(kernels::block_plan_len_ok(p, 101, 3));  // past max_seq_len
  p.causal = true;
  EXPECT_FALSE(kernels::block_plan_len_ok(p, 2, 3));  // fewer keys than causal queries
  EXPECT_TRUE(kernels::block_plan_len_ok(p, 3, 3));
  p.num_pages = 10;
  EXPECT_TRUE(kernels::block_plan_page_ok(p, 0));
  EXPECT_TRUE(kernels::block_plan_page_ok(p, 9));
  EXPECT_FALSE(kernels::block_plan_page_ok(p, 10));
  EXPECT_FALSE(kernels::block_plan_page_ok(p, -1));
  p.chunk_tokens = 32;
  p.num_chunks = 4;
  p.min_chunk_tokens = 32;
  EXPECT_EQ(kernels::block_plan_chunks_used(p, 0), 1);
  EXPECT_EQ(kernels::block_plan_chunks_used(p, 32), 1);
  EXPECT_EQ(kernels::block_plan_chunks_used(p, 33), 2);
  p.chunk_tokens = 0;
  EXPECT_EQ(kernels::block_plan_chunks_used(p, 1000), 1);
  // A grid of 33 chunks sized for a long bound (chunks of 4000), a floor of 64 keys: a request of
  // 2000 keys takes 32 chunks of 64 (the host plan of it alone would cut the same), one of 5000
  // 27 of 192, one of 40 a single chunk.
  p.chunk_tokens = 4000;
  p.num_chunks = 33;
  p.min_chunk_tokens = 64;
  EXPECT_EQ(kernels::block_plan_chunk(p, 2000), 64);
  EXPECT_EQ(kernels::block_plan_chunks_used(p, 2000), 32);
  EXPECT_EQ(kernels::block_plan_chunk(p, 5000), 192);
  EXPECT_EQ(kernels::block_plan_chunks_used(p, 5000), 27);
  EXPECT_EQ(kernels::block_plan_chunks_used(p, 40), 1);
  EXPECT_EQ(kernels::block_plan_chunks_used(p, 33 * 4000), 33);
}

// ---- the paged wrappers' run-time page ids (kernels/page_guard.h) ---------------------------

// The copy kernel's body, run thread by thread as its block runs it (each thread's part, then the
// block's OR as the request's verdict), then the NaN kernel's: every id lands in the plan's page
// area at its rebased place (an id outside [0, pages) as page 0, which no kernel reads past), a
// request with such an id is marked and gets NaN in its output and LSE rows of each output dtype,
// and nothing else is written; a request without pages is never marked.
TEST(PageGuard, CopiesTheIdsAndGivesARequestWithABadOneNanRows) {
  const int64_t pages = 6, H = 2, D = 3;
  // Requests: 2 pages and 1 row, no pages and 2 rows, 3 pages and 1 row. The caller's tensor
  // holds two ids before the plan's (indptr started at 2).
  const std::vector<int32_t> kv_indptr{0, 2, 2, 5}, qo{0, 1, 3, 4};
  struct Case {
    std::vector<int32_t> ids;  // the caller's tensor
    std::vector<int32_t> area, bad;
  };
  const std::vector<Case> cases = {
      {{-9, 99, 4, 0, 5, 1, 2}, {4, 0, 5, 1, 2}, {0, 0, 0}},
      {{-9, 99, 4, 0, 5, 6, 2}, {4, 0, 5, 0, 2}, {0, 0, 1}},  // 6 == pages
      {{-9, 99, -1, 0, 5, 1, 2}, {0, 0, 5, 1, 2}, {1, 0, 0}},
      {{-9, 99, 4, 2147483647, 5, 1, -2147483647 - 1}, {4, 0, 5, 1, 0}, {1, 0, 1}},
  };
  for (const DType od : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (std::size_t ci = 0; ci < cases.size(); ++ci) {
      for (const int nthreads : {1, 4, 128}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_torch_name(od) << ", case " << ci << ", " << nthreads << " threads");
        const Case& c = cases[ci];
        std::vector<int32_t> area(6, 77), bad(3, 77);  // a previous run's values: rewritten
        // Four rows and a tail of 8 words in each dtype (16-bit outputs use the front).
        const std::size_t esz = od == DType::kFloat32 ? 4 : 2;
        std::vector<uint32_t> o((4 * H * D * esz + 32) / 4, 0);
        std::vector<float> lse(4 * H, 0.0f);
        const int32_t base = 2;  // read on the device from the plan's arrays
        kernels::PageGuardParams p;
        p.src = c.ids.data();
        p.base = &base;
        p.dst = area.data();
        p.kv_indptr = kv_indptr.data();
        p.qo_indptr = qo.data();
        p.bad = bad.data();
        p.num_pages = pages;
        p.batch = 3;
        p.o = o.data();
        p.o_dtype = od;
        p.o_stride_n = H * D;
        p.o_stride_h = D;
        p.lse = lse.data();
        p.lse_stride_n = H;
        p.lse_stride_h = 1;
        p.num_heads = static_cast<int32_t>(H);
        p.head_dim = static_cast<int32_t>(D);
        for (int32_t b = 0; b < 3; ++b) {
          bool any = false;
          for (int t = 0; t < nthreads; ++t) any |= kernels::page_guard_copy(p, b, t, nthreads);
          bad[static_cast<std::size_t>(b)] = any ? 1 : 0;
        }
        EXPECT_EQ(std::vector<int32_t>(area.begin(), area.begin() + 5), c.area);
        EXPECT_EQ(area[5], 77) << "written past the plan's ids";
        EXPECT_EQ(bad, c.bad);
        for (int32_t b = 0; b < 3; ++b) {
          for (int t = 0; t < nthreads; ++t) kernels::page_guard_nan_rows(p, b, t, nthreads);
        }
        const auto* bytes = reinterpret_cast<const uint8_t*>(o.data());
        const uint32_t nan_bits = od == DType::kFloat32    ? 0x7fc00000u
                                  : od == DType::kBFloat16 ? 0x7fc0u
                                                           : 0x7e00u;
        for (int64_t r = 0; r < 4; ++r) {
          const int32_t req = r == 0 ? 0 : r < 3 ? 1 : 2;
          const bool nan_row = c.bad[static_cast<std::size_t>(req)] != 0;
          for (int64_t x = 0; x < H * D; ++x) {
            uint32_t v = 0;
            std::memcpy(&v, bytes + static_cast<std::size_t>(r * H * D + x) * esz, esz);
            EXPECT_EQ(v, nan_row ? nan_bits : 0u) << "row " << r;
          }
          for (int64_t h = 0; h < H; ++h) {
            EXPECT_EQ(std::isnan(lse[static_cast<std::size_t>(r * H + h)]), nan_row) << r;
          }
        }
        const auto* past = bytes + static_cast<std::size_t>(4 * H * D) * esz;
        EXPECT_TRUE(std::all_of(past, bytes + o.size() * 4, [](uint8_t x) { return x == 0; }));
      }
    }
  }
}

}  // namespace
}  // namespace flashinfer
