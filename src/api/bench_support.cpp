// Helpers for bench hooks, and the timing loop behind `flashinfer bench`.
#include "api/bench_support.h"

#include "api/bench_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "calls/written_tensors.h"
#include "core/element.h"
#include "flashinfer/error.h"
#include "flashinfer/stream.h"
#include "replay/result_comparators.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/bench_timing_cuda.h"
#endif

namespace flashinfer {

namespace {

struct BenchTable {
  std::mutex mu;
  std::map<std::string, BenchHook, std::less<>> hooks;
};
BenchTable& bench_table() {
  static auto* t = new BenchTable();  // never destroyed: hooks may be looked up at exit
  return *t;
}

}  // namespace

void register_bench_hook(std::string op_name, BenchHook hook) {
  BenchTable& t = bench_table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto [it, inserted] = t.hooks.emplace(op_name, std::move(hook));
  FLASHINFER_CHECK(inserted, "register_bench_hook", "op_name", "'", op_name,
                   "' already has a bench routine");
}

const BenchHook* find_bench_hook(std::string_view op_name) {
  OpRegistry::global();  // the built-in ops register their hooks with their declarations
  BenchTable& t = bench_table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.hooks.find(op_name);
  return it == t.hooks.end() ? nullptr : &it->second;  // std::map nodes are stable
}

std::vector<std::string> bench_routines() {
  OpRegistry::global();
  BenchTable& t = bench_table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<std::string> names;
  for (const auto& [name, hook] : t.hooks) names.push_back(name);
  return names;
}

namespace api::bench {

namespace {
thread_local ScopedOpBackend* g_op_backend = nullptr;  // the innermost scope of this thread
}  // namespace

ScopedOpBackend::ScopedOpBackend(std::string name) : name_(std::move(name)), outer_(g_op_backend) {
  g_op_backend = this;
}
ScopedOpBackend::~ScopedOpBackend() { g_op_backend = outer_; }

std::string op_backend(std::string_view fallback) {
  if (g_op_backend == nullptr) return std::string(fallback);
  g_op_backend->used_ = true;
  return g_op_backend->name_;
}

std::vector<std::string> wrapper_backends(std::string_view routine) {
  if (routine == "BatchDecodeWithPagedKVCacheWrapper.run") return {"fa2", "fa2_tc"};
  // The prefill wrappers' `backend` ("auto" when none is named: the Hopper kernel on sm_90).
  if (routine == "BatchPrefillWithPagedKVCacheWrapper.run" ||
      routine == "BatchPrefillWithRaggedKVCacheWrapper.run") {
    return {"fa2", "fa3", "auto"};
  }
  return {};
}

namespace {

// Tensor::uniform_'s counter-based draw (src/core/tensor.cpp): element i of `seed` in [0, 1).
// Repeated here so that random_tensor can fill any index range on any thread; the check in
// random_tensor keeps the two in step.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Element i of the fill as uniform_ then to(dtype) would write it: the double drawn, rounded to
// fp32 (uniform_ fills an fp32 tensor), then encoded in `D`.
template <DType D>
void fill_range(uint8_t* dst, int64_t lo, int64_t hi, uint64_t key, double low, double high) {
  const std::size_t es = dtype_size(D);
  for (int64_t i = lo; i < hi; ++i) {
    const uint64_t r = splitmix64(key ^ (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull));
    const double v = low + (high - low) * (static_cast<double>(r >> 11) * 0x1.0p-53);
    ::flashinfer::detail::encode_element(D, static_cast<double>(static_cast<float>(v)),
                                         dst + static_cast<std::size_t>(i) * es);
  }
}

using FillFn = void (*)(uint8_t*, int64_t, int64_t, uint64_t, double, double);

FillFn fill_fn(DType dtype) {
  switch (dtype) {
#define FI_BENCH_FILL(d) \
  case d:                \
    return &fill_range<d>;
    FI_BENCH_FILL(DType::kFloat32)
    FI_BENCH_FILL(DType::kFloat64)
    FI_BENCH_FILL(DType::kFloat16)
    FI_BENCH_FILL(DType::kBFloat16)
    FI_BENCH_FILL(DType::kFloat8E4M3FN)
    FI_BENCH_FILL(DType::kFloat8E5M2)
    FI_BENCH_FILL(DType::kInt8)
    FI_BENCH_FILL(DType::kUInt8)
    FI_BENCH_FILL(DType::kInt16)
    FI_BENCH_FILL(DType::kInt32)
    FI_BENCH_FILL(DType::kInt64)
    FI_BENCH_FILL(DType::kBool)
#undef FI_BENCH_FILL
    case DType::kFloat4E2M1FNx2:
      break;
  }
  return nullptr;
}

}  // namespace

// The values of Tensor::empty(shape, fp32).uniform_(seed, low, high).to(dtype), filled on every
// hardware thread straight into `dtype`: the decode grid's largest caches hold billions of
// elements, which the one-thread fill through a vector of doubles would take minutes (and tens of
// GB of host memory) to draw.
Tensor random_tensor(const Shape& shape, DType dtype, Device device, uint64_t seed, double low,
                     double high) {
  const FillFn fill = fill_fn(dtype);
  if (fill == nullptr) {  // packed fp4: to(dtype) says why not
    Tensor t = Tensor::empty(shape, DType::kFloat32);
    t.uniform_(seed, low, high);
    return t.to(dtype).to(device);
  }
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t n = t.numel();
  auto* dst = static_cast<uint8_t*>(t.data_ptr());
  const uint64_t key = splitmix64(seed);
  constexpr int64_t kPerThread = int64_t{1} << 20;
  const int64_t threads = std::clamp<int64_t>(
      n / kPerThread, 1, std::max<int64_t>(1, std::thread::hardware_concurrency()));
  if (threads == 1) {
    fill(dst, 0, n, key, low, high);
  } else {
    std::vector<std::thread> pool;
    const int64_t chunk = (n + threads - 1) / threads;
    for (int64_t k = 0; k < threads; ++k) {
      const int64_t lo = std::min(n, k * chunk), hi = std::min(n, lo + chunk);
      pool.emplace_back([=] { fill(dst, lo, hi, key, low, high); });
    }
    for (auto& th : pool) th.join();
  }
  // In step with uniform_: the first elements drawn the reference way must be the same bytes.
  const int64_t m = std::min<int64_t>(n, 64);
  if (m > 0) {
    Tensor ref = Tensor::empty({m}, DType::kFloat32);
    ref.uniform_(seed, low, high);
    ref = ref.to(dtype);
    FLASHINFER_CHECK_CODE(
        std::memcmp(ref.data_ptr(), dst, static_cast<std::size_t>(m) * t.element_size()) == 0,
        ErrorCode::kInternal, "bench", "random_tensor",
        "the parallel fill differs from Tensor::uniform_ (src/core/tensor.cpp "
        "changed its generator?)");
  }
  return t.to(device);
}

Tensor int32_tensor(const std::vector<int64_t>& values, Device device) {
  std::vector<double> d(values.begin(), values.end());
  return Tensor::from_vector(d, {static_cast<int64_t>(values.size())}, DType::kInt32).to(device);
}

Tensor moe_top2_ids(int64_t tokens, int64_t experts, Device device) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t e0 = (t * 5) % experts;
    ids.push_back(e0);
    ids.push_back((e0 + 1 + t % (experts - 1)) % experts);
  }
  return int32_tensor(ids, device).view({tokens, 2});
}

double nbytes(const Shape& shape, DType dtype) {
  double n = static_cast<double>(dtype_size(dtype));
  for (int64_t s : shape) n *= static_cast<double>(s);
  return n;
}

namespace {

Tensor host_copy(const Tensor& t) { return t.device().is_cpu() ? t.clone() : t.to(Device::cpu()); }

// The device tensors' bytes in a result (0 when it holds none).
std::size_t device_bytes(const Value& v) {
  if (v.is_tensor()) {
    const Tensor& t = v.as_tensor();
    return t.defined() && t.device().is_cuda() ? t.nbytes() : 0;
  }
  std::size_t n = 0;
  if (v.is_sequence()) {
    for (const Value& item : v.items()) n += device_bytes(item);
  }
  return n;
}

// A timed run() must not free the previous iteration's device result: cudaFree waits for the
// device, so the stop event would be recorded only after the host got back, adding microseconds
// that are no part of the kernel (upstream's torch allocator frees without waiting). Earlier
// results are kept here and released together once they hold 64 results or 1 GiB (one
// iteration in a batch pays for it: the median does not see it), and before outputs().
struct KeptResults {
  std::vector<Value> values;
  std::size_t bytes = 0;
  void keep(Value v) {
    const std::size_t n = device_bytes(v);
    if (n == 0) return;  // host results free without waiting
    values.push_back(std::move(v));
    bytes += n;
    if (values.size() >= 64 || bytes >= (std::size_t{1} << 30)) release();
  }
  void release() {
    values.clear();
    bytes = 0;
  }
};

}  // namespace

BenchCase invoke_case(const std::string& name, std::vector<Value> positional,
                      std::vector<std::pair<std::string, Value>> keyword) {
  const OpDecl* decl = OpRegistry::global().find(name);
  if (!decl || !decl->invoke) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "bench", "routine", "no invocable op named '",
                    name, "'");
  }
  auto args = std::make_shared<CallArgs>(
      *decl, bind_arguments(*decl, std::move(positional), std::move(keyword)));
  auto last = std::make_shared<Value>();
  auto kept = std::make_shared<KeptResults>();
  BenchCase c;
  c.run = [decl, args, last, kept] {
    Value result = decl->invoke(*args);
    kept->keep(std::move(*last));
    *last = std::move(result);
  };
  c.args = [args] { return args->values(); };
  c.outputs = [decl, args, last, kept] {
    kept->release();
    NamedTensors out;
    if (last->is_tensor()) {
      out.emplace_back("result", host_copy(last->as_tensor()));
    } else if (last->is_sequence()) {
      const auto& items = last->items();
      for (std::size_t i = 0; i < items.size(); ++i) {
        const std::string name = "result[" + std::to_string(i) + "]";
        if (items[i].is_tensor()) {
          out.emplace_back(name, host_copy(items[i].as_tensor()));
        } else if (items[i].is_sequence()) {  // a nested tuple of tensors
          for (std::size_t j = 0; j < items[i].items().size(); ++j) {
            if (items[i].items()[j].is_tensor()) {
              out.emplace_back(name + "[" + std::to_string(j) + "]",
                               host_copy(items[i].items()[j].as_tensor()));
            }
          }
        }
      }
    }
    // Written arguments; an item of a written (k_cache, v_cache) pair as "name[j]".
    detail::for_each_written_tensor(
        *decl, args->values(), [&](std::size_t i, int j, const Tensor& t) {
          const std::string& name = decl->params[i].name;
          out.emplace_back(j < 0 ? name : name + "[" + std::to_string(j) + "]", host_copy(t));
        });
    return out;
  };
  return c;
}

double attention_flops(int64_t qo_len, int64_t kv_len, int64_t num_qo_heads, int64_t head_dim_qk,
                       int64_t head_dim_vo, bool causal) {
  const double qo = static_cast<double>(qo_len), kv = static_cast<double>(kv_len);
  const double per_pair = static_cast<double>(num_qo_heads * (head_dim_qk + head_dim_vo));
  return causal ? (2.0 * kv - qo) * qo * per_pair : 2.0 * qo * kv * per_pair;
}

BenchPages bench_pages(const BenchShape& s, Device dev) {
  const int64_t per = (s.s_kv + s.page_size - 1) / s.page_size, pages = per * s.batch_size;
  BenchPages p;
  p.k = random_tensor({pages, s.page_size, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, dev,
                      s.random_seed + 1);
  p.v = random_tensor({pages, s.page_size, s.num_kv_heads, s.head_dim_vo}, s.kv_dtype, dev,
                      s.random_seed + 2);
  std::vector<int64_t> indptr, indices, last;
  for (int64_t b = 0; b <= s.batch_size; ++b) indptr.push_back(b * per);
  for (int64_t i = 0; i < pages; ++i) indices.push_back(i);
  for (int64_t b = 0; b < s.batch_size; ++b) last.push_back(s.s_kv - (per - 1) * s.page_size);
  p.indptr = int32_tensor(indptr, dev);
  p.indices = int32_tensor(indices, dev);
  p.last_page_len = int32_tensor(last, dev);
  return p;
}

Value bench_object(std::shared_ptr<ApiObject> obj) {
  ObjectRef ref;
  ref.type = std::string(obj->class_name());
  ref.repr = obj->repr();
  ref.id = obj->object_id();
  ref.object = std::move(obj);
  return Value(std::move(ref));
}

// Upstream's attention bytes: q, k, v and o once each (no page-table bytes).
double bench_attention_bytes(const BenchShape& s, int64_t q_rows, int64_t kv_rows) {
  return nbytes({q_rows, s.num_qo_heads, s.head_dim_qk}, s.q_dtype) +
         nbytes({kv_rows, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype) +
         nbytes({kv_rows, s.num_kv_heads, s.head_dim_vo}, s.kv_dtype) +
         nbytes({q_rows, s.num_qo_heads, s.head_dim_vo}, s.q_dtype);
}

// Refcheck's comparison of one backend's outputs with the CPU reference's, output by output (as
// `expected` lists them): replay's element-wise comparison, or, for an op with a replay
// comparator (replay/result_comparators.h), that comparator's judgment of the results and its
// second look at written arguments (chunk_gated_delta_rule's fp32 states, mm_gguf's sums), so a
// kernel that two correct implementations may differ from by more than the fp32 tolerance is
// not reported as a mismatch.
std::vector<replay::TensorComparison> judge_outputs(const std::string& routine, const BenchCase& c,
                                                    const NamedTensors& actual,
                                                    const NamedTensors& expected) {
  // Results are named "result" or "result[i]" (replay: "result", "result__i"), written
  // arguments by their parameter ("name" or "name[j]").
  auto is_result = [](const std::string& n) { return n == "result" || n.rfind("result[", 0) == 0; };
  const std::size_t n = std::min(expected.size(), actual.size());
  std::vector<replay::TensorComparison> out(expected.size());
  std::vector<bool> judged(expected.size(), false);  // by the op's comparator
  detail::ResultCheck check;
  bool custom = false;
  if (const detail::ResultComparatorWithArgs* cmp = detail::result_comparator(routine);
      cmp != nullptr && c.args) {
    std::map<std::string, Tensor> got;
    NamedTensors want;
    std::vector<std::size_t> where;  // expected index of each result handed to the comparator
    for (std::size_t t = 0; t < n; ++t) {
      const std::string& name = expected[t].first;
      if (!is_result(name)) continue;
      std::string key = name == "result" ? name : "result__" + name.substr(7, name.size() - 8);
      got[key] = actual[t].second;
      want.emplace_back(key, expected[t].second);
      where.push_back(t);
    }
    const detail::CompareFn compare = [](const std::string& k, const Tensor& a, const Tensor& e) {
      return replay::compare_tensors(k, a, e);
    };
    custom = (*cmp)(c.args(), got, want, compare, check);
    for (std::size_t w = 0; custom && w < want.size(); ++w) {
      for (const replay::TensorComparison& r : check.comparisons) {
        if (r.key != want[w].first) continue;
        out[where[w]] = r;
        out[where[w]].key = expected[where[w]].first;
        judged[where[w]] = true;
      }
    }
  }
  for (std::size_t t = 0; t < n; ++t) {
    if (judged[t]) continue;
    out[t] = replay::compare_tensors(expected[t].first, actual[t].second, expected[t].second);
    if (custom && check.recheck_mutated && !is_result(expected[t].first) && !out[t].match &&
        out[t].problem.empty()) {
      const std::string& name = expected[t].first;
      check.recheck_mutated(name.substr(0, name.find('[')), actual[t].second, expected[t].second,
                            out[t]);
    }
  }
  return out;
}

}  // namespace api::bench

namespace {

// The checks every timing makes: something to run, iteration counts, and on CUDA a device.
void check_bench_call(const BenchCase& c, Device device, int dry_run_iters, int num_iters) {
  FLASHINFER_CHECK(c.run != nullptr, "bench", "case", "has nothing to run");
  FLASHINFER_CHECK(num_iters > 0, "bench", "num_iters", "must be positive, got ", num_iters);
  FLASHINFER_CHECK(dry_run_iters >= 0, "bench", "dry_run_iters", "must be >= 0, got ",
                   dry_run_iters);
  if (!device.is_cuda()) return;
#if FLASHINFER_WITH_CUDA
  if (cuda_device_count() == 0) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "bench", "backends",
                    "cuda was asked for but no CUDA device is present");
  }
#else
  FLASHINFER_FAIL(ErrorCode::kUnsupported, "bench", "backends",
                  "cuda was asked for but this build has no CUDA backend");
#endif
}

}  // namespace

std::vector<double> bench_time_ms(const BenchCase& c, Device device, int dry_run_iters,
                                  int num_iters, bool flush_l2) {
  check_bench_call(c, device, dry_run_iters, num_iters);
  if (device.is_cuda()) {
#if FLASHINFER_WITH_CUDA
    // At least one untimed call: first calls build what later ones reuse (the cuBLASLt plan
    // and workspace of a GEMM shape, JIT modules), so the timed iterations are the steady state.
    return kernels::cuda::event_times_ms(c.run, std::max(dry_run_iters, 1), num_iters, flush_l2,
                                         current_cuda_stream());
#else
    (void)flush_l2;
#endif
  }
  // CPU: the kernels are synchronous, so the steady clock around each call is the op's time.
  for (int i = 0; i < dry_run_iters; ++i) c.run();
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(num_iters));
  for (int i = 0; i < num_iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    c.run();
    const auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return times;
}

int64_t bench_rotation_count(double bytes, int64_t l2_bytes) {
  if (!(bytes > 0.0)) return 1;
  const double safe = 5.0 * static_cast<double>(l2_bytes);
  if (bytes >= safe) return 1;
  return std::max<int64_t>(2, static_cast<int64_t>(std::ceil(safe / bytes)) + 1);
}

BenchTimes bench_time(const BenchCase& first, const std::function<BenchCase()>& make, Device device,
                      int dry_run_iters, int num_iters, const BenchTiming& timing) {
  BenchTimes out;
  if (!device.is_cuda() || !timing.cuda_graph) {
    out.ms = bench_time_ms(first, device, dry_run_iters, num_iters, timing.cold_l2);
    out.method = device.is_cuda() ? "cuda_events" : "steady_clock";
    return out;
  }
  check_bench_call(first, device, dry_run_iters, num_iters);
  FLASHINFER_CHECK(timing.iters_within_graph > 0, "bench", "iters_within_graph",
                   "must be positive, got ", timing.iters_within_graph);
#if FLASHINFER_WITH_CUDA
  // Cold reads in a graph: the calls rotate through copies of the inputs (more copies than
  // calls in the graph would never be read).
  const int64_t copies =
      timing.cold_l2
          ? std::min<int64_t>(bench_rotation_count(first.bytes, kernels::cuda::l2_cache_bytes()),
                              timing.iters_within_graph)
          : 1;
  std::vector<BenchCase> more;
  try {
    for (int64_t i = 1; i < copies && make; ++i) more.push_back(make());
  } catch (const std::exception&) {
    // Out of memory for another copy, say: the graph rotates through the copies there are.
  }
  std::vector<std::function<void()>> fns{first.run};
  for (const BenchCase& c : more) fns.push_back(c.run);
  std::string why;
  if (auto t = kernels::cuda::graph_times_ms(fns, dry_run_iters, num_iters,
                                             timing.iters_within_graph, &why)) {
    out.ms = std::move(*t);
    out.method = "cuda_graph";
    out.input_copies = static_cast<int64_t>(fns.size());
    return out;
  }
  out.note = "the calls could not be captured into a CUDA graph (" + why + ")";
  out.ms = bench_time_ms(first, device, dry_run_iters, num_iters, timing.cold_l2);
  out.method = "cuda_events";
  return out;
#else
  (void)make;
  return out;  // (check_bench_call refused CUDA in this build)
#endif
}

}  // namespace flashinfer
