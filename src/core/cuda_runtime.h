// Thin, private wrappers over the CUDA runtime so core code compiles without CUDA headers.
// Without the CUDA backend every function throws flashinfer::Error(kUnsupported), except
// device_count(), which returns 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flashinfer/device.h"
#include "flashinfer/dtype.h"

namespace flashinfer::detail {

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

int cuda_runtime_device_count();
/// The calling thread's current CUDA device (cudaGetDevice; torch.device("cuda")'s meaning); 0
/// when it cannot be asked, or without the CUDA backend.
int cuda_current_device();
void* cuda_device_malloc(std::size_t nbytes, int device);
/// How many cuda_device_malloc calls (device Tensor storage) this process has made: the tests
/// that check a steady state allocates nothing read it.
uint64_t cuda_device_malloc_count();
/// Device Tensor storage goes through a stream-ordered cache of blocks (core/caching_allocator.h:
/// a dead tensor's block is reused by later allocations on its stream, or on others once an
/// event says its work is done; FLASHINFER_CUDA_CACHING_ALLOCATOR=0 turns it off).
void cuda_device_free(void* ptr, int device) noexcept;
/// Frees the device's cached blocks (torch.cuda.empty_cache); no-op without the CUDA backend.
void cuda_empty_cache(int device);
/// Sets `nbytes` bytes at `dst` to `byte`, stream-ordered on the current stream (cudaMemsetAsync;
/// not synchronized: later work on that stream sees it, as after torch's zero_).
void cuda_memset_async(void* dst, int byte, std::size_t nbytes, int device);
/// Synchronous copy (stream-ordered on the current stream, then synchronized). While the current
/// stream is captured into a CUDA graph: a host-to-device copy inside a CaptureUploadScope goes by
/// value (the graph keeps the bytes as they are now), any other one and every copy to the host
/// are refused (Error kCuda naming Tensor.copy_ and `src`), leaving the capture intact.
void cuda_memcpy(void* dst, const void* src, std::size_t nbytes, CopyKind kind, int device);
/// While alive, host-to-device copies this thread makes while its stream is captured go by value
/// (kernel parameters): for an op's own per-call metadata computed on the host from shapes (a
/// one-request plan), which a graph should keep as captured, as it keeps a kernel's scalar
/// arguments. Not for a caller's host tensor, whose later contents a replay would not see:
/// outside a scope such a copy is refused under capture. Scopes nest.
class CaptureUploadScope {
 public:
  CaptureUploadScope() noexcept;
  ~CaptureUploadScope();
  CaptureUploadScope(const CaptureUploadScope&) = delete;
  CaptureUploadScope& operator=(const CaptureUploadScope&) = delete;
};
/// Device-to-device copy within one device, stream-ordered on the current stream and not
/// synchronized (as a kernel, or torch's copy_ between CUDA tensors): no host buffer needs it
/// finished, later work on the stream sees it, and a CUDA graph being captured takes it as a node.
void cuda_memcpy_device_async(void* dst, const void* src, std::size_t nbytes, int device);
/// Copies, casts or fills between two views on one device (kernels/tensor_copy.h), stream-ordered
/// on the current stream and not synchronized, so a CUDA graph captures it. `dst` and `src` point
/// at the views' first elements, strides in elements; element i of the row-major order of `src`
/// is written to element i of `dst`, cast as core/element.h casts on the host. `src` null: every
/// element of dst gets the `fill` bytes (one element in dst_dtype). False, doing nothing, when the
/// views keep more than kernels::kTensorCopyMaxDims dimensions after merging: the caller stages
/// through the host.
bool cuda_tensor_copy(void* dst, DType dst_dtype, const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& dst_strides, const void* src, DType src_dtype,
                      const std::vector<int64_t>& src_strides, const void* fill, int device);
/// Synchronous copy of `height` rows of `width` bytes, row i at src + i * spitch to
/// dst + i * dpitch (cudaMemcpy2D): the bytes between rows are neither read nor written.
void cuda_memcpy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                    std::size_t width, std::size_t height, CopyKind kind, int device);
/// Page-locked host memory (cudaHostAlloc), so device-to-host copies into it run
/// asynchronously; freed with cuda_pinned_free.
void* cuda_pinned_alloc(std::size_t nbytes);
void cuda_pinned_free(void* ptr) noexcept;
/// Page-locked host memory mapped into every device's address space (cudaHostAllocMapped |
/// cudaHostAllocPortable), zeroed; *device_ptr is its address for kernels. Freed with
/// cuda_pinned_free.
void* cuda_mapped_alloc(std::size_t nbytes, void** device_ptr);
/// Enqueues a device-to-host copy of `nbytes` on the current stream (current_cuda_stream())
/// and returns an event recorded after it (wait with cuda_event_wait, then cuda_event_destroy).
void* cuda_copy_to_host_async(void* dst, const void* src, std::size_t nbytes, int device);
void cuda_event_wait(void* event) noexcept;
void cuda_event_destroy(void* event) noexcept;
/// "NVIDIA H100 80GB HBM3", compute capability as major*10+minor.
std::string cuda_device_name(int device);
int cuda_compute_capability(int device);
/// The device's theoretical peak DRAM bandwidth in bytes/s: 2 transfers per memory clock times
/// the bus width (3.35e12 for an H100 SXM). 0 when the driver reports no clock or bus width.
double cuda_peak_memory_bandwidth(int device);
/// Dense fp16/bf16 tensor-core FLOPs (fp32 accumulation) per clock per SM for compute capability
/// cc (major*10+minor), from NVIDIA's datasheets (peak TFLOPS / SMs / boost clock): 2048 for
/// sm_80 (A100: 312 TFLOPS), 1024 for sm_86/87/89, 4096 for sm_90 (H100 SXM: 989 TFLOPS at
/// 1.83 GHz), 8192 for sm_100. 0 when unknown.
constexpr double dense_16bit_tensor_flops_per_clock_per_sm(int cc) {
  return cc == 80                             ? 2048.0
         : (cc == 86 || cc == 87 || cc == 89) ? 1024.0
         : cc == 90                           ? 4096.0
         : cc == 100                          ? 8192.0
                                              : 0.0;
}
/// The device's dense fp16/bf16 tensor-core peak in FLOP/s at the clock the driver reports as its
/// peak (cudaDevAttrClockRate: 1.98 GHz on an H100 SXM, hence 1070 TFLOP/s there rather than
/// the datasheet's 989). 0 when the architecture or the clock is unknown.
double cuda_peak_tensor_flops_16bit(int device);
/// Whether the current stream (current_cuda_stream()) is being captured into a CUDA graph; a
/// capture in global mode on another stream also counts (querying the legacy stream then would
/// invalidate it). False without the CUDA backend.
bool cuda_current_stream_capturing();
/// Whether this process was ever seen capturing a CUDA graph (by cuda_current_stream_capturing or
/// an allocation made during a capture): a replay may since have written CUDA memory with no call
/// observed (the ring recorder then stops sharing CUDA spans, also when started after it).
bool graph_capture_seen() noexcept;
void note_graph_capture() noexcept;
/// Whether a Storage on a CUDA device was ever made in this process: until one is, no tensor
/// is a CUDA tensor (the recorders' capture check skips its walk over the arguments).
bool cuda_storage_made();
/// Memory shared with other processes (the collective ops' peer buffers): `nbytes` of device
/// memory from cudaMalloc itself (IPC handles name whole allocations, so not the caching
/// allocator), zero-filled, and its cudaIpcMemHandle's 64 bytes in `handle`.
void* cuda_ipc_malloc(std::size_t nbytes, int device, unsigned char handle[64]);
void cuda_ipc_free(void* ptr, int device) noexcept;
/// Another process's allocation by its handle, mapped into this process on `device`.
void* cuda_ipc_open(const unsigned char handle[64], int device);
void cuda_ipc_close(void* ptr, int device) noexcept;
/// Lets kernels on `device` read and write `peer`'s memory (cudaDeviceEnablePeerAccess; already
/// enabled is fine). Throws flashinfer::Error(kUnsupported) when the devices cannot.
void cuda_enable_peer_access(int device, int peer);
/// The device's number of SMs.
int cuda_sm_count(int device);
/// Whether the device supports NVLink multicast (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, which
/// the runtime's enum keeps as a reserved value); false on any error or without the CUDA backend.
bool cuda_multicast_supported(int device) noexcept;
/// Where an address the caller passed as an integer points: the CUDA device of device or managed
/// memory, -1 for host memory (pinned included) or an address the runtime does not know; -1
/// without the CUDA backend or a GPU.
int cuda_pointer_device(const void* ptr) noexcept;
/// A stream of its own on `device` that does not synchronize with the legacy default stream
/// (cudaStreamNonBlocking): ranks sharing a GPU each run on one, so one rank's kernel waiting for
/// another's is not serialized behind it.
void* cuda_stream_create_nonblocking(int device);
/// cudaStreamSynchronize.
void cuda_stream_synchronize(void* stream, int device);
/// cudaDeviceSynchronize on `device` (no-op without the CUDA backend).
void cuda_device_synchronize(int device);
/// While alive, `device` is the current CUDA device when it is a CUDA device (the previous one
/// comes back after), so an op's kernels launch on the device its tensors live on whatever
/// device the caller had current. No-op for the CPU and without the CUDA backend.
class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(const Device& device);
  ~CudaDeviceScope();
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  [[maybe_unused]] int previous_ = -1;  // the device to restore; -1: nothing was changed
};

/// This thread's CUDA-graph capture mode made relaxed for the scope
/// (cudaThreadExchangeStreamCaptureMode), for the recorders' and the API log's own CUDA work on
/// calls that are not being captured: while another thread captures in global mode
/// (torch.cuda.graph's default), CUDA refuses this thread the calls it deems unsafe (synchronous
/// copies, host allocations and frees, event waits), and the refusal invalidates that capture.
/// That work touches no capturing stream. Nothing when `enable` is false, before any CUDA tensor
/// exists in the process (no context to ask), without a usable device or without the CUDA
/// backend.
class CudaRelaxedCaptureScope {
 public:
  explicit CudaRelaxedCaptureScope(bool enable = true);
  ~CudaRelaxedCaptureScope();
  CudaRelaxedCaptureScope(const CudaRelaxedCaptureScope&) = delete;
  CudaRelaxedCaptureScope& operator=(const CudaRelaxedCaptureScope&) = delete;

 private:
  [[maybe_unused]] int previous_ = 0;  // the mode to restore (cudaStreamCaptureMode)
  [[maybe_unused]] bool active_ = false;
};

/// "13.0" for the runtime the backend was built with.
std::string cuda_runtime_version();

}  // namespace flashinfer::detail
