// FNV-1a over 64-bit fields, byte by byte: the hash of the GEMM plan caches' keys (cuBLASLt's
// LtKey, cuDNN's GraphKey) and of the per-stream scratch's stream keys, which hash their fields
// one word at a time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashinfer::kernels {

struct KeyHasher {
  uint64_t h = 1469598103934665603ull;
  void mix(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xFF;
      h *= 1099511628211ull;
    }
  }
  std::size_t value() const { return static_cast<std::size_t>(h); }
};

}  // namespace flashinfer::kernels
