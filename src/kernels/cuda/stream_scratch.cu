// The per-(device, stream) scratch of kernels/cuda/stream_scratch.h (host code only).
#include "kernels/cuda/stream_scratch.h"

#include "core/cuda_runtime.h"

#include <atomic>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/key_hash.h"

namespace flashinfer::kernels::cuda {

namespace {

// A handle as seen by one host thread: cudaStreamPerThread names another stream in each thread.
struct HandleKey {
  int device = 0;
  const void* handle = nullptr;
  std::thread::id thread;  // default-constructed but for cudaStreamPerThread
  bool operator==(const HandleKey&) const = default;
};

struct HandleKeyHash {
  std::size_t operator()(const HandleKey& k) const {
    KeyHasher h;
    h.mix(static_cast<uint64_t>(static_cast<uint32_t>(k.device)));
    h.mix(reinterpret_cast<std::uintptr_t>(k.handle));
    h.mix(std::hash<std::thread::id>()(k.thread));
    return h.value();
  }
};

}  // namespace

std::optional<StreamKey> find_stream_key(const char* op, int device, void* stream) {
  static std::mutex mu;
  static auto& ids = *new std::unordered_map<HandleKey, uint64_t, HandleKeyHash>;  // never freed
  const auto s = static_cast<cudaStream_t>(stream);
  HandleKey hk{device, stream, {}};
  if (s == cudaStreamPerThread) hk.thread = std::this_thread::get_id();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FLASHINFER_CUDA_CALL(op, cudaStreamIsCapturing(s, &status));
  if (status == cudaStreamCaptureStatusNone) {
    unsigned long long id = 0;
    FLASHINFER_CUDA_CALL(op, cudaStreamGetId(s, &id));
    std::lock_guard<std::mutex> lock(mu);
    ids[hk] = static_cast<uint64_t>(id);
    return StreamKey{device, static_cast<uint64_t>(id)};
  }
  std::lock_guard<std::mutex> lock(mu);
  const auto it = ids.find(hk);
  if (it == ids.end()) return std::nullopt;
  return StreamKey{device, it->second};
}

StreamKey stream_key(const char* op, int device, void* stream, const char* arg) {
  const std::optional<StreamKey> key = find_stream_key(op, device, stream);
  FLASHINFER_CHECK_CODE(key.has_value(), ErrorCode::kUnsupported, op, arg,
                        "the stream is being captured into a CUDA graph and no call of this "
                        "library ran on it before: run the call once on the stream before "
                        "capturing it (its device buffers are made then)");
  return *key;
}

namespace {

// One stream's buffer. `mu` is what a lease holds.
struct Buffer {
  std::mutex mu;
  void* data = nullptr;
  std::size_t bytes = 0;
  std::vector<void*> retired;  // outgrown buffers, kept (stream_scratch.h); at most `bytes` in all
};

}  // namespace

struct StreamScratchPool::State {
  std::mutex mu;  // guards `buffers` (not the buffers themselves)
  std::unordered_map<StreamKey, std::unique_ptr<Buffer>, StreamKeyHash> buffers;
  std::atomic<uint64_t> allocs{0}, bytes{0};
};

StreamScratchPool::StreamScratchPool(const char* what, const char* arg)
    : what_(what), arg_(arg), state_(new State) {}

StreamScratch StreamScratchPool::acquire(const char* op, void* stream, std::size_t bytes) {
  int device = 0;
  FLASHINFER_CUDA_CALL(op, cudaGetDevice(&device));
  return acquire(op, device, stream, bytes);
}

StreamScratch StreamScratchPool::acquire(const char* op, int device, void* stream,
                                         std::size_t bytes) {
  return *acquire_impl(op, device, stream, bytes, false);
}

std::optional<StreamScratch> StreamScratchPool::try_acquire(const char* op, int device,
                                                            void* stream, std::size_t bytes) {
  return acquire_impl(op, device, stream, bytes, true);
}

std::optional<StreamScratch> StreamScratchPool::acquire_impl(const char* op, int device,
                                                             void* stream, std::size_t bytes,
                                                             bool decline_under_capture) {
  std::optional<StreamKey> found = find_stream_key(op, device, stream);
  if (!found && decline_under_capture) return std::nullopt;
  const StreamKey key = found ? *found : stream_key(op, device, stream, arg_);
  Buffer* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    std::unique_ptr<Buffer>& e = state_->buffers[key];
    if (!e) e = std::make_unique<Buffer>();
    b = e.get();  // stable: entries are never erased
  }
  StreamScratch lease;
  lease.lock_ = std::unique_lock<std::mutex>(b->mu);
  if (b->bytes < bytes) {
    const auto s = static_cast<cudaStream_t>(stream);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    FLASHINFER_CUDA_CALL(op, cudaStreamIsCapturing(s, &status));
    if (status != cudaStreamCaptureStatusNone && decline_under_capture) return std::nullopt;
    FLASHINFER_CHECK_CODE(status == cudaStreamCaptureStatusNone, ErrorCode::kUnsupported, op, arg_,
                          "this call needs ", bytes, " bytes of ", what_,
                          ", more than this stream has, while the stream is being captured into "
                          "a CUDA graph: run the call once on the stream before capturing it");
    const auto grown = static_cast<std::size_t>(scratch_grow_to(bytes));
    int prev = -1;
    FLASHINFER_CUDA_CALL(op, cudaGetDevice(&prev));
    if (prev != device) FLASHINFER_CUDA_CALL(op, cudaSetDevice(device));
    void* fresh = nullptr;
    cudaError_t err = cudaMalloc(&fresh, grown);
    if (err == cudaErrorMemoryAllocation) {
      // Dead tensors' blocks held by the tensor allocator's cache (core/caching_allocator.h)
      // are invisible here: give them back and try once more.
      (void)cudaGetLastError();
      detail::cuda_empty_cache(device);
      err = cudaMalloc(&fresh, grown);
    }
    if (prev != device) (void)cudaSetDevice(prev);
    if (err == cudaErrorMemoryAllocation && decline_under_capture) {
      (void)cudaGetLastError();  // the caller has a path without scratch: it takes that one
      return std::nullopt;
    }
    if (err != cudaSuccess) {
      FLASHINFER_FAIL(ErrorCode::kCuda, op, arg_, "cudaMalloc of ", grown, " bytes of ", what_,
                      " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
    }
    state_->allocs.fetch_add(1, std::memory_order_relaxed);
    state_->bytes.fetch_add(grown, std::memory_order_relaxed);
    if (b->data != nullptr) b->retired.push_back(b->data);
    b->data = fresh;
    b->bytes = grown;
  }
  lease.data_ = b->data;
  lease.bytes_ = b->bytes;
  return lease;
}

uint64_t StreamScratchPool::allocations() const {
  return state_->allocs.load(std::memory_order_relaxed);
}

uint64_t StreamScratchPool::allocated_bytes() const {
  return state_->bytes.load(std::memory_order_relaxed);
}

}  // namespace flashinfer::kernels::cuda
