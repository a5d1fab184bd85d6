// Device scratch kept per (device, stream) that only grows: the one implementation behind the
// CUDA backend's per-stream buffers (GEMM dequant/staging/un-shuffle scratch, the cuDNN GEMM
// workspace, cutlass_fused_moe's scratch, the sampling intermediates, the split-KV partials of
// the ragged attention calls that pass no workspace). Plain C++ (no CUDA header): the API layer
// includes it through sampling_cuda.h, and the tests check the policy below on the CPU.
//
// The rules, each a fix of a hazard the separate copies had:
// - A buffer is keyed by (device, cudaStreamGetId), not by the cudaStream_t handle: the
//   per-thread default stream (cudaStreamPerThread) is one handle but a different stream in each
//   host thread, and a destroyed stream's handle may be reused by a new stream while the old
//   stream's work is still queued. cudaStreamGetId is refused while the stream is being captured
//   (cudaErrorStreamCaptureUnsupported, seen on an H100 with CUDA 13.0), so each id found outside
//   capture is remembered for its handle (per host thread for cudaStreamPerThread) and a
//   capturing call uses the remembered one; a stream first seen while capturing has no buffers
//   to find anyway.
// - acquire() returns a move-only lease holding the buffer's lock until it is destroyed: a caller
//   keeps it until its last kernel using the buffer is queued, so two host threads calling on one
//   stream cannot interleave their launches over the same bytes (stream order keeps calls apart
//   on the device; the lock keeps them apart on the host).
// - Growth follows scratch_grow_to; growing while the stream is being captured into a CUDA graph
//   is refused (kUnsupported, naming the op: run the call once before capturing).
// - Nothing is ever freed. An outgrown buffer stays allocated because kernels queued before may
//   still read it and, above all, a CUDA graph captured earlier holds its address and may be
//   replayed at any time (cudaFreeAsync would order the free after the stream's queued work but
//   not after later replays of such a graph); the buffers of a stream that is destroyed stay too,
//   for the same reason, so a process that creates streams without bound should reuse them.
//   Static destructors never free device memory either: they may run after the CUDA context is
//   gone.
// - Graphs captured on one stream hold the same scratch addresses, as graphs that share an
//   upstream wrapper's workspace buffer do: they must replay one at a time (not concurrently on
//   several streams, nor beside direct calls on the capture stream). docs/ARCHITECTURE.md says
//   so to callers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>

#include "kernels/key_hash.h"

namespace flashinfer::kernels::cuda {

/// Bytes a stream's scratch grows to when a call needs `need`: 0 for 0, else a power of two of at
/// least 1 MiB up to 64 MiB (a growing sequence of calls allocates a few times), beyond that the
/// next multiple of 2 MiB (a 10 GB need must not become 16 GB).
constexpr uint64_t scratch_grow_to(uint64_t need) {
  constexpr uint64_t kMiB = uint64_t{1} << 20, kStep = 2 * kMiB;
  if (need == 0) return 0;
  uint64_t grown = kMiB;
  while (grown < need && grown < 64 * kMiB) grown *= 2;
  if (grown >= need) return grown;
  const uint64_t rem = need % kStep;
  return rem == 0 || need > UINT64_MAX - kStep ? need : need + (kStep - rem);
}

/// A stream as the buffers are keyed: its device and its process-unique id (cudaStreamGetId).
struct StreamKey {
  int device = 0;
  uint64_t stream_id = 0;
  bool operator==(const StreamKey&) const = default;
};

struct StreamKeyHash {
  std::size_t operator()(const StreamKey& k) const {
    KeyHasher h;
    h.mix(static_cast<uint64_t>(static_cast<uint32_t>(k.device)));
    h.mix(k.stream_id);
    return h.value();
  }
};

/// The key of `stream` (a cudaStream_t) on `device`, or nullopt while the stream is being captured
/// into a CUDA graph and no call saw it before the capture; an Error (kCuda) naming `op` when the
/// runtime cannot tell the stream's id.
std::optional<StreamKey> find_stream_key(const char* op, int device, void* stream);

/// find_stream_key, with an Error (kUnsupported) naming `op` and argument `arg` for a stream
/// first seen while it is being captured.
StreamKey stream_key(const char* op, int device, void* stream, const char* arg = "stream");

/// A stream's scratch, leased: `data()` holds at least the bytes asked for (256-byte aligned),
/// valid for work queued on the stream until the next lease's work; the stream's lock is held
/// until the lease is destroyed or reset. Move-only.
class StreamScratch {
 public:
  StreamScratch() = default;
  StreamScratch(StreamScratch&&) noexcept = default;
  StreamScratch& operator=(StreamScratch&&) noexcept = default;
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  void* data() const { return data_; }
  /// The buffer's size (scratch_grow_to of the largest need so far).
  std::size_t bytes() const { return bytes_; }
  /// Releases the lock early (the buffer must not be used by work queued after this).
  void reset() { *this = StreamScratch(); }

 private:
  friend class StreamScratchPool;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::unique_lock<std::mutex> lock_;
};

/// One kind of per-stream scratch (each area has its own pool, so their buffers and counters are
/// apart and one area's lease never waits on another's). Meant as a function-local static: it is
/// trivially destructible, and its state is never freed.
class StreamScratchPool {
 public:
  /// `what` names the buffer in errors ("scratch", "split-KV scratch"); `arg` is the argument
  /// errors name ("" for none).
  explicit StreamScratchPool(const char* what, const char* arg = "");

  /// At least `bytes` of `stream`'s scratch on `device` (made current while allocating).
  StreamScratch acquire(const char* op, int device, void* stream, std::size_t bytes);
  /// The same on the current device.
  StreamScratch acquire(const char* op, void* stream, std::size_t bytes);

  /// As acquire, but while the stream is being captured a need its buffer does not cover (or a
  /// stream no call ran on before) gives nullopt, allocating nothing, instead of acquire's
  /// kUnsupported error, and so does a growth the device has no memory for (after the tensor
  /// cache gave its blocks back): for a caller with a path that needs no scratch, which it then
  /// takes.
  std::optional<StreamScratch> try_acquire(const char* op, int device, void* stream,
                                           std::size_t bytes);

  /// Device allocations this pool made, and their bytes (for the tests that count them).
  uint64_t allocations() const;
  uint64_t allocated_bytes() const;

 private:
  std::optional<StreamScratch> acquire_impl(const char* op, int device, void* stream,
                                            std::size_t bytes, bool decline_under_capture);
  struct State;
  const char* what_;
  const char* arg_;
  State* state_;  // never freed
};

}  // namespace flashinfer::kernels::cuda
