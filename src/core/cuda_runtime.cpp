#include "core/cuda_runtime.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <vector>

#include "core/caching_allocator.h"
#include "core/capture_hold.h"
#include "core/env_switch.h"

#include "flashinfer/device.h"
#include "flashinfer/error.h"
#include "flashinfer/stream.h"

#if FLASHINFER_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/tensor_copy_cuda.h"
#endif

namespace flashinfer {

bool cuda_compiled() { return FLASHINFER_WITH_CUDA != 0; }
int cuda_device_count() { return detail::cuda_runtime_device_count(); }

namespace {
thread_local void* t_current_stream = nullptr;
}
void* current_cuda_stream() { return t_current_stream; }
void set_current_cuda_stream(void* stream) { t_current_stream = stream; }
void cuda_empty_cache(int device_index) { detail::cuda_empty_cache(device_index); }
CudaGraphMemoryScope::CudaGraphMemoryScope(int device_index)
    : device_(device_index), active_(detail::cuda_begin_capture_hold(device_index)) {}
CudaGraphMemoryScope::~CudaGraphMemoryScope() {
  if (active_) detail::cuda_end_capture_hold(device_);
}

namespace detail {

#if FLASHINFER_WITH_CUDA

namespace {
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    FLASHINFER_FAIL(ErrorCode::kCuda, what, "", cudaGetErrorName(err), ": ",
                    cudaGetErrorString(err));
  }
}
int device_attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  check(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
  return value;
}
struct DeviceGuard {
  int prev = -1;
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (prev >= 0) (void)cudaSetDevice(prev);
  }
};
}  // namespace

int cuda_current_device() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return d;
}

int cuda_runtime_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

namespace {
std::atomic<uint64_t> g_device_mallocs{0};

// The CUDA side of the tensor allocator's cache (core/caching_allocator.h), one per device.
// Events come from a free list, so a release costs one cudaEventRecord.
class CudaAllocatorOps final : public CachingAllocatorOps {
 public:
  explicit CudaAllocatorOps(int device) : device_(device) {}
  void* malloc(std::size_t nbytes) override {
    DeviceGuard g(device_);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, nbytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it: the cache frees its blocks and tries again
      return nullptr;
    }
    check(err, "cudaMalloc");
    return p;
  }
  void* malloc_in_capture(std::size_t nbytes) override {
    // PyTorch's allocator does the same for its graph pools: the allocation is not a stream
    // operation, and the block outlives the graph (a capture hold keeps it, or the graph owns
    // it for good).
    note_graph_capture();
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    void* p = nullptr;
    try {
      p = malloc(nbytes);
    } catch (...) {
      (void)cudaThreadExchangeStreamCaptureMode(&mode);
      throw;
    }
    check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    return p;
  }
  // Failures of the calls below are the allocator's own and are handled here; each is cleared
  // (cudaGetLastError) so the caller's next launch check does not report it. A launch error of
  // the caller's still pending then would be cleared with it, as in PyTorch's allocator.
  void free(void* p) noexcept override {
    int prev = -1;
    (void)cudaGetDevice(&prev);
    (void)cudaSetDevice(device_);
    if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
    if (prev >= 0) (void)cudaSetDevice(prev);
  }
  bool capturing(void* stream) noexcept override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t err = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
    if (err != cudaSuccess) {
      // cudaErrorStreamCaptureImplicit: another stream captures in global mode. Any other
      // failure (a stream we cannot ask about): treat as capturing, so nothing is cached.
      (void)cudaGetLastError();
      return true;
    }
    return status != cudaStreamCaptureStatusNone;
  }
  bool thread_capturing() noexcept override { return capturing(current_cuda_stream()); }
  uint64_t stream_id(void* stream) noexcept override {
    unsigned long long id = 0;
    if (cudaStreamGetId(static_cast<cudaStream_t>(stream), &id) != cudaSuccess) {
      (void)cudaGetLastError();
      return kNoStreamId;
    }
    return static_cast<uint64_t>(id);
  }
  void* record_event(void* stream) noexcept override {
    int prev = -1;
    (void)cudaGetDevice(&prev);
    (void)cudaSetDevice(device_);
    cudaEvent_t ev = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!spare_.empty()) {
        ev = spare_.back();
        spare_.pop_back();
      }
    }
    if (ev == nullptr && cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      ev = nullptr;
    }
    if (ev != nullptr && cudaEventRecord(ev, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
      (void)cudaGetLastError();  // e.g. the stream belongs to another device: no caching
      (void)cudaEventDestroy(ev);
      ev = nullptr;
    }
    if (prev >= 0) (void)cudaSetDevice(prev);
    return ev;
  }
  bool event_done(void* event) noexcept override {
    const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaSuccess) return true;
    (void)cudaGetLastError();  // cudaErrorNotReady is recorded as the thread's last error
    return false;
  }
  void release_event(void* event) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    spare_.push_back(static_cast<cudaEvent_t>(event));
  }
  void synchronize() noexcept override {
    int prev = -1;
    (void)cudaGetDevice(&prev);
    (void)cudaSetDevice(device_);
    (void)cudaDeviceSynchronize();
    if (prev >= 0) (void)cudaSetDevice(prev);
  }

 private:
  int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> spare_;
};

bool caching_enabled() {
  static const bool on = [] { return !env_switch_is("FLASHINFER_CUDA_CACHING_ALLOCATOR", "0"); }();
  return on;
}

// Per device, created on first use and never destroyed: blocks may die after static
// destructors run (the driver reclaims everything at exit).
constexpr int kMaxDevices = 64;
CachingAllocator* device_cache(int device) {
  static std::mutex mu;
  static CachingAllocator* caches[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices || !caching_enabled()) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (caches[device] == nullptr) {
    caches[device] = new CachingAllocator(*new CudaAllocatorOps(device));
  }
  return caches[device];
}
}  // namespace

uint64_t cuda_device_malloc_count() { return g_device_mallocs.load(std::memory_order_relaxed); }

void* cuda_device_malloc(std::size_t nbytes, int device) {
  g_device_mallocs.fetch_add(1, std::memory_order_relaxed);
  void* const stream = current_cuda_stream();
  CachingAllocator* cache = device_cache(device);
  // cudaStreamPerThread is one handle but another stream in each host thread, and a tensor may
  // die on another thread than its maker: such blocks bypass the cache (the cache frees blocks it
  // did not hand out straight to the device), except during a capture of it: the cache then
  // makes the block in relaxed mode and keeps it for the graph, never cached nor freed under it.
  if (cache != nullptr &&
      (stream != static_cast<void*>(cudaStreamPerThread) || cuda_current_stream_capturing())) {
    void* p = cache->allocate(nbytes, stream);
    if (p == nullptr) {
      FLASHINFER_FAIL(ErrorCode::kCuda, "cudaMalloc", "",
                      "cudaErrorMemoryAllocation: out of "
                      "memory allocating ",
                      nbytes, " bytes on cuda:", device,
                      " (after freeing the allocator's cached blocks)");
    }
    return p;
  }
  DeviceGuard g(device);
  void* p = nullptr;
  check(cudaMalloc(&p, nbytes == 0 ? 1 : nbytes), "cudaMalloc");
  return p;
}

void cuda_device_free(void* ptr, int device) noexcept {
  if (CachingAllocator* cache = device_cache(device)) {
    cache->release(ptr);
    return;
  }
  int prev = -1;
  (void)cudaGetDevice(&prev);
  (void)cudaSetDevice(device);
  (void)cudaFree(ptr);
  if (prev >= 0) (void)cudaSetDevice(prev);
}

void cuda_empty_cache(int device) {
  if (CachingAllocator* cache = device_cache(device)) cache->empty_cache();
}

namespace {
std::atomic<uint64_t> g_capture_declines{0};
}  // namespace

namespace {
std::atomic<bool> g_graph_capture_seen{false};
}  // namespace

void note_graph_capture() noexcept { g_graph_capture_seen.store(true, std::memory_order_relaxed); }
bool graph_capture_seen() noexcept { return g_graph_capture_seen.load(std::memory_order_relaxed); }

void note_capture_decline() noexcept { g_capture_declines.fetch_add(1, std::memory_order_relaxed); }
uint64_t capture_declines() noexcept { return g_capture_declines.load(std::memory_order_relaxed); }

bool cuda_begin_capture_hold(int device) {
  CachingAllocator* cache = device_cache(device);
  if (cache) cache->begin_capture_hold();
  return cache != nullptr;
}

void cuda_end_capture_hold(int device) noexcept {
  if (CachingAllocator* cache = device_cache(device)) cache->end_capture_hold();
}

void cuda_memset_async(void* dst, int byte, std::size_t nbytes, int device) {
  if (nbytes == 0) return;
  DeviceGuard g(device);
  check(cudaMemsetAsync(dst, byte, nbytes, static_cast<cudaStream_t>(current_cuda_stream())),
        "cudaMemsetAsync");
}

// Inside a CUDA-graph capture a host-to-device copy of an op's own metadata (CaptureUploadScope)
// goes by value, in kernel parameters: the graph keeps the bytes as they are at capture, as it
// keeps a kernel's scalar arguments; a memcpy from pageable memory and the synchronization after
// it cannot be captured. This is what lets an op that plans as it runs
// (single_prefill_with_kv_cache's one-request plan) run under capture. A caller's host tensor
// copied in would be frozen at its capture-time contents, and a read back to the host has no
// graph form: both are refused by name before they break the capture.
namespace {
constexpr std::size_t kMaxCapturedUpload = std::size_t{4} << 20;
// Graph nodes a copy by value may add: 4 MiB in whole chunks (a 2-D copy takes one or more a row).
constexpr std::size_t kMaxCapturedLaunches =
    (kMaxCapturedUpload + kernels::cuda::kBytesByValueChunk - 1) /
    kernels::cuda::kBytesByValueChunk;
thread_local int t_capture_upload_depth = 0;

// Whether the current stream is being captured; a copy it cannot capture is refused.
bool captured_upload(CopyKind kind, std::size_t nbytes, std::size_t rows = 1) {
  if (!cuda_current_stream_capturing()) return false;
  FLASHINFER_CHECK_CODE(kind != CopyKind::kDeviceToHost, ErrorCode::kCuda, "Tensor.copy_", "src",
                        "a copy to the host while the current stream is captured into a CUDA "
                        "graph (a graph cannot hand values back to the host)");
  // (The synchronous device-to-device copy is the one between two devices.)
  FLASHINFER_CHECK_CODE(kind == CopyKind::kHostToDevice, ErrorCode::kCuda, "Tensor.copy_", "src",
                        "a copy between two devices while the current stream is captured into a "
                        "CUDA graph (it synchronizes)");
  FLASHINFER_CHECK_CODE(t_capture_upload_depth > 0, ErrorCode::kCuda, "Tensor.copy_", "src",
                        "a host tensor copied to the device while the current stream is captured "
                        "into a CUDA graph (a replay would not see its later contents): pass a "
                        "device tensor");
  const std::size_t chunks =
      (nbytes + kernels::cuda::kBytesByValueChunk - 1) / kernels::cuda::kBytesByValueChunk;
  FLASHINFER_CHECK_CODE(
      nbytes * rows <= kMaxCapturedUpload && chunks * rows <= kMaxCapturedLaunches,
      ErrorCode::kCuda, "Tensor.copy_", "src", "a host-to-device copy of ", rows, " x ", nbytes,
      " bytes while the current stream is captured into a CUDA graph (at most ", kMaxCapturedUpload,
      " bytes in ", kMaxCapturedLaunches, " launches are captured by value)");
  return true;
}
}  // namespace

CaptureUploadScope::CaptureUploadScope() noexcept { ++t_capture_upload_depth; }
CaptureUploadScope::~CaptureUploadScope() { --t_capture_upload_depth; }

void cuda_memcpy(void* dst, const void* src, std::size_t nbytes, CopyKind kind, int device) {
  if (nbytes == 0) return;
  DeviceGuard g(device);
  if (captured_upload(kind, nbytes)) {
    kernels::cuda::copy_bytes_by_value(dst, src, nbytes, current_cuda_stream());
    return;
  }
  cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                     : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                       : cudaMemcpyDeviceToDevice;
  auto stream = static_cast<cudaStream_t>(current_cuda_stream());
  check(cudaMemcpyAsync(dst, src, nbytes, k, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

void cuda_memcpy_device_async(void* dst, const void* src, std::size_t nbytes, int device) {
  if (nbytes == 0) return;
  DeviceGuard g(device);
  check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice,
                        static_cast<cudaStream_t>(current_cuda_stream())),
        "cudaMemcpyAsync");
}

bool cuda_tensor_copy(void* dst, DType dst_dtype, const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& dst_strides, const void* src, DType src_dtype,
                      const std::vector<int64_t>& src_strides, const void* fill, int device) {
  kernels::TensorCopyArgs a;
  if (!kernels::tensor_copy_dims(shape, dst_strides,
                                 src == nullptr ? std::vector<int64_t>{} : src_strides, &a)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n == 0;  // an empty view is done; too many dimensions is the caller's
  }
  a.dst = static_cast<uint8_t*>(dst);
  a.src = static_cast<const uint8_t*>(src);
  a.dst_dtype = dst_dtype;
  a.src_dtype = src == nullptr ? dst_dtype : src_dtype;
  a.dst_size = static_cast<uint8_t>(dtype_size(dst_dtype));
  a.src_size = static_cast<uint8_t>(dtype_size(a.src_dtype));
  if (src == nullptr) std::memcpy(a.fill, fill, a.dst_size);
  DeviceGuard g(device);
  kernels::cuda::tensor_copy(a, current_cuda_stream());
  return true;
}

void cuda_memcpy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                    std::size_t width, std::size_t height, CopyKind kind, int device) {
  if (width == 0 || height == 0) return;
  DeviceGuard g(device);
  if (captured_upload(kind, width, height)) {
    for (std::size_t r = 0; r < height; ++r) {  // row by row: the rows are apart on both sides
      kernels::cuda::copy_bytes_by_value(static_cast<char*>(dst) + r * dpitch,
                                         static_cast<const char*>(src) + r * spitch, width,
                                         current_cuda_stream());
    }
    return;
  }
  cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                     : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                       : cudaMemcpyDeviceToDevice;
  auto stream = static_cast<cudaStream_t>(current_cuda_stream());
  check(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, k, stream), "cudaMemcpy2DAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

void* cuda_pinned_alloc(std::size_t nbytes) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, nbytes == 0 ? 1 : nbytes, cudaHostAllocDefault), "cudaHostAlloc");
  return p;
}

void cuda_pinned_free(void* ptr) noexcept { (void)cudaFreeHost(ptr); }

void* cuda_mapped_alloc(std::size_t nbytes, void** device_ptr) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, nbytes == 0 ? 1 : nbytes, cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc");
  std::memset(p, 0, nbytes == 0 ? 1 : nbytes);
  const cudaError_t e = cudaHostGetDevicePointer(device_ptr, p, 0);
  if (e != cudaSuccess) {
    (void)cudaFreeHost(p);
    check(e, "cudaHostGetDevicePointer");
  }
  return p;
}

void* cuda_copy_to_host_async(void* dst, const void* src, std::size_t nbytes, int device) {
  DeviceGuard g(device);
  auto stream = static_cast<cudaStream_t>(current_cuda_stream());
  cudaEvent_t ev = nullptr;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  if (nbytes > 0) {
    const cudaError_t err = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream);
    if (err != cudaSuccess) (void)cudaEventDestroy(ev);
    check(err, "cudaMemcpyAsync");
  }
  check(cudaEventRecord(ev, stream), "cudaEventRecord");
  return ev;
}

void cuda_event_wait(void* event) noexcept {
  if (event) (void)cudaEventSynchronize(static_cast<cudaEvent_t>(event));
}

void cuda_event_destroy(void* event) noexcept {
  if (event) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

CudaRelaxedCaptureScope::CudaRelaxedCaptureScope(bool enable) {
  if (!enable || !cuda_storage_made()) return;
  // Without a usable device the call would fail and leave its error in the last-error slot.
  static const bool usable = cuda_runtime_device_count() > 0;
  if (!usable) return;
  auto mode = cudaStreamCaptureModeRelaxed;
  active_ = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  previous_ = static_cast<int>(mode);
}

CudaRelaxedCaptureScope::~CudaRelaxedCaptureScope() {
  if (!active_) return;
  auto mode = static_cast<cudaStreamCaptureMode>(previous_);
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
}

CudaDeviceScope::CudaDeviceScope(const Device& device) {
  if (!device.is_cuda()) return;
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current == device.index) return;
  check(cudaSetDevice(device.index), "cudaSetDevice");
  previous_ = current;
}

CudaDeviceScope::~CudaDeviceScope() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

bool cuda_current_stream_capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err =
      cudaStreamIsCapturing(static_cast<cudaStream_t>(current_cuda_stream()), &status);
  if (err == cudaErrorStreamCaptureImplicit) {
    (void)cudaGetLastError();  // another stream captures in global mode
    note_graph_capture();
    return true;
  }
  if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky; keep it out of the caller's way
  check(err, "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone) note_graph_capture();
  return status != cudaStreamCaptureStatusNone;
}

void cuda_device_synchronize(int device) {
  DeviceGuard g(device);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

std::string cuda_device_name(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return prop.name;
}

int cuda_compute_capability(int device) {
  return device_attribute(cudaDevAttrComputeCapabilityMajor, device) * 10 +
         device_attribute(cudaDevAttrComputeCapabilityMinor, device);
}

double cuda_peak_memory_bandwidth(int device) {
  const double clock_khz = device_attribute(cudaDevAttrMemoryClockRate, device);
  const double bus_bits = device_attribute(cudaDevAttrGlobalMemoryBusWidth, device);
  return 2.0 * 1e3 * clock_khz * bus_bits / 8.0;
}

double cuda_peak_tensor_flops_16bit(int device) {
  const double clock_khz = device_attribute(cudaDevAttrClockRate, device);
  const double sms = device_attribute(cudaDevAttrMultiProcessorCount, device);
  return dense_16bit_tensor_flops_per_clock_per_sm(cuda_compute_capability(device)) * sms *
         clock_khz * 1e3;
}

std::string cuda_runtime_version() {
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
}

void* cuda_ipc_malloc(std::size_t nbytes, int device, unsigned char handle[64]) {
  DeviceGuard g(device);
  void* p = nullptr;
  check(cudaMalloc(&p, nbytes == 0 ? 1 : nbytes), "cudaMalloc");
  cudaIpcMemHandle_t h{};
  // Zeroed before any peer (on its own stream, or in another process) writes a flag into it:
  // on a stream of its own, waited for alone. A device-wide wait would also wait for another
  // group's kernel spinning on a rank that is itself waiting here (groups interleaved on a GPU).
  cudaStream_t st = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMemsetAsync(p, 0, nbytes, st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(st);
  if (st) cudaStreamDestroy(st);
  if (e != cudaSuccess) {
    cudaFree(p);
    check(e, "cudaMemsetAsync");
  }
  if (cudaError_t e = cudaIpcGetMemHandle(&h, p); e != cudaSuccess) {
    cudaFree(p);
    check(e, "cudaIpcGetMemHandle");
  }
  static_assert(sizeof(h) == 64);
  std::memcpy(handle, &h, 64);
  return p;
}

void cuda_ipc_free(void* ptr, int device) noexcept {
  if (!ptr) return;
  int prev = -1;
  if (cudaGetDevice(&prev) == cudaSuccess && prev != device) cudaSetDevice(device);
  cudaFree(ptr);
  if (prev >= 0 && prev != device) cudaSetDevice(prev);
}

void* cuda_ipc_open(const unsigned char handle[64], int device) {
  DeviceGuard g(device);
  cudaIpcMemHandle_t h{};
  std::memcpy(&h, handle, 64);
  void* p = nullptr;
  check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  return p;
}

void cuda_ipc_close(void* ptr, int device) noexcept {
  if (!ptr) return;
  int prev = -1;
  if (cudaGetDevice(&prev) == cudaSuccess && prev != device) cudaSetDevice(device);
  cudaIpcCloseMemHandle(ptr);
  if (prev >= 0 && prev != device) cudaSetDevice(prev);
}

void cuda_enable_peer_access(int device, int peer) {
  if (device == peer) return;
  int can = 0;
  check(cudaDeviceCanAccessPeer(&can, device, peer), "cudaDeviceCanAccessPeer");
  if (!can) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "cuda_enable_peer_access", "", "cuda:", device,
                    " cannot access the memory of cuda:", peer, " (no peer access between them)");
  }
  DeviceGuard g(device);
  const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return;
  }
  check(e, "cudaDeviceEnablePeerAccess");
}

int cuda_sm_count(int device) { return device_attribute(cudaDevAttrMultiProcessorCount, device); }

bool cuda_multicast_supported(int device) noexcept {
  // The driver's cuDeviceGetAttribute through the runtime's entry-point lookup (no link to
  // libcuda); 132 is CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, and a CUdevice is the ordinal.
  using GetAttribute = int (*)(int*, int, int);
  // cudaGetDeviceCount initializes the driver (cuInit) before its entry point is called.
  if (device < 0 || device >= cuda_runtime_device_count()) return false;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  int v = 0;
  return reinterpret_cast<GetAttribute>(fn)(&v, 132, device) == 0 && v != 0;
}

int cuda_pointer_device(const void* ptr) noexcept {
  if (!ptr || cuda_runtime_device_count() == 0) return -1;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    (void)cudaGetLastError();  // an unknown address is host memory; leave no sticky error
    return -1;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

void* cuda_stream_create_nonblocking(int device) {
  DeviceGuard g(device);
  cudaStream_t st = nullptr;
  check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return st;
}

void cuda_stream_synchronize(void* stream, int device) {
  DeviceGuard g(device);
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

#else  // !FLASHINFER_WITH_CUDA

namespace {
[[noreturn]] void no_cuda(const char* what) {
  FLASHINFER_FAIL(ErrorCode::kUnsupported, what, "",
                  "this build of flashinfer-cpp has no CUDA backend");
}
}  // namespace

int cuda_runtime_device_count() { return 0; }
int cuda_current_device() { return 0; }
void* cuda_device_malloc(std::size_t, int) { no_cuda("cuda_malloc"); }
uint64_t cuda_device_malloc_count() { return 0; }
void cuda_device_free(void*, int) noexcept {}
void cuda_empty_cache(int) {}
bool cuda_begin_capture_hold(int) { return false; }
void cuda_end_capture_hold(int) noexcept {}
void cuda_memset_async(void*, int, std::size_t, int) { no_cuda("cuda_memset_async"); }
void cuda_memcpy(void*, const void*, std::size_t, CopyKind, int) { no_cuda("cuda_memcpy"); }
CaptureUploadScope::CaptureUploadScope() noexcept = default;
CaptureUploadScope::~CaptureUploadScope() = default;
void cuda_memcpy_device_async(void*, const void*, std::size_t, int) {
  no_cuda("cuda_memcpy_device_async");
}
void cuda_memcpy_2d(void*, std::size_t, const void*, std::size_t, std::size_t, std::size_t,
                    CopyKind, int) {
  no_cuda("cuda_memcpy_2d");
}
bool cuda_tensor_copy(void*, DType, const std::vector<int64_t>&, const std::vector<int64_t>&,
                      const void*, DType, const std::vector<int64_t>&, const void*, int) {
  no_cuda("cuda_tensor_copy");
}
std::string cuda_device_name(int) { no_cuda("cuda_device_name"); }
int cuda_compute_capability(int) { no_cuda("cuda_compute_capability"); }
double cuda_peak_memory_bandwidth(int) { no_cuda("cuda_peak_memory_bandwidth"); }
double cuda_peak_tensor_flops_16bit(int) { no_cuda("cuda_peak_tensor_flops_16bit"); }
void* cuda_pinned_alloc(std::size_t) { no_cuda("cuda_pinned_alloc"); }
void cuda_pinned_free(void*) noexcept {}
void* cuda_mapped_alloc(std::size_t, void**) { no_cuda("cuda_mapped_alloc"); }
void* cuda_copy_to_host_async(void*, const void*, std::size_t, int) {
  no_cuda("cuda_copy_to_host_async");
}
void cuda_event_wait(void*) noexcept {}
void cuda_event_destroy(void*) noexcept {}
CudaRelaxedCaptureScope::CudaRelaxedCaptureScope(bool) {}
CudaRelaxedCaptureScope::~CudaRelaxedCaptureScope() = default;
CudaDeviceScope::CudaDeviceScope(const Device&) {}
CudaDeviceScope::~CudaDeviceScope() = default;
bool cuda_current_stream_capturing() { return false; }
void note_graph_capture() noexcept {}
bool graph_capture_seen() noexcept { return false; }
void cuda_device_synchronize(int) {}
std::string cuda_runtime_version() { return ""; }

void* cuda_ipc_malloc(std::size_t, int, unsigned char*) { no_cuda("cuda_ipc_malloc"); }
void cuda_ipc_free(void*, int) noexcept {}
void* cuda_ipc_open(const unsigned char*, int) { no_cuda("cuda_ipc_open"); }
void cuda_ipc_close(void*, int) noexcept {}
void cuda_enable_peer_access(int, int) { no_cuda("cuda_enable_peer_access"); }
int cuda_sm_count(int) { no_cuda("cuda_sm_count"); }
bool cuda_multicast_supported(int) noexcept { return false; }
int cuda_pointer_device(const void*) noexcept { return -1; }
void* cuda_stream_create_nonblocking(int) { no_cuda("cuda_stream_create_nonblocking"); }
void cuda_stream_synchronize(void*, int) { no_cuda("cuda_stream_synchronize"); }
#endif

}  // namespace detail
}  // namespace flashinfer
