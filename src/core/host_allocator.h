// Private: the host allocator behind Tensor::empty on the CPU. Large blocks are kept for reuse
// instead of going back to the OS: glibc serves blocks of 32 MiB and more with mmap and returns
// them with munmap, so an op that allocates its output every call (layernorm, which has no out=
// upstream) paid a page fault per 4 KiB of output on every call, 5-8x the op's own time.
#pragma once

#include <cstddef>

namespace flashinfer::detail {

/// 64-byte aligned memory for at least `nbytes` bytes (never null: throws flashinfer::Error);
/// `*capacity` receives the size to pass back to host_free.
void* host_alloc(std::size_t nbytes, std::size_t* capacity);

/// Returns a block from host_alloc: kept for reuse while the cache has room, else freed.
void host_free(void* p, std::size_t capacity);

}  // namespace flashinfer::detail
