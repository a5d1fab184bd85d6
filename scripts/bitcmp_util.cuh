// Shared by the old-against-new kernel checks (scripts/decode_bitcmp.cu,
// scripts/prefill_bitcmp.cu): the CUDA error check, the inputs' random numbers, host-to-device
// copies, the bitwise comparison and the alternating old / new timing. Host code; each program
// includes it once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

// xorshift64, one fixed seed: both kernels of a case read the same inputs, and every run the same.
static uint64_t rng = 88172645463325252ull;
static uint32_t rnd() {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return static_cast<uint32_t>(rng >> 11);
}
// Uniform in [-2, 2] in steps of 1/5000.
static float nrm() { return (static_cast<int>(rnd() % 20001) - 10000) / 5000.0f; }
// bf16 bits of f (truncated).
static uint16_t bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

template <class T>
T* dev_copy(const std::vector<T>& h) {
  T* d;
  CK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// n elements of T on the device, every byte 0x5a: both kernels' outputs start from the same
// pattern, which no element a kernel writes is likely to equal.
template <class T>
T* dev_poisoned(size_t n) {
  T* d;
  CK(cudaMalloc(&d, n * sizeof(T)));
  CK(cudaMemset(d, 0x5a, n * sizeof(T)));
  return d;
}

// Whether `bytes` bytes at device addresses a and b are equal; prints how many differ otherwise.
static bool same_bytes(const void* a, const void* b, size_t bytes, const char* what) {
  std::vector<uint8_t> ha(bytes), hb(bytes);
  CK(cudaMemcpy(ha.data(), a, bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hb.data(), b, bytes, cudaMemcpyDeviceToHost));
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < bytes; ++i) {
    if (ha[i] != hb[i]) {
      if (!diff) first = i;
      ++diff;
    }
  }
  if (diff) printf("  %s: %zu bytes differ (first at %zu)\n", what, diff, first);
  return diff == 0;
}

// Mean milliseconds of launch_old() and launch_new(), launched in turn (so both see the same
// clocks and caches), over `reps` rounds after `warmup` untimed ones.
template <class Old, class New>
std::pair<float, float> time_old_new(Old launch_old, New launch_new, int warmup, int reps) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float t[2] = {0, 0};
  for (int rep = 0; rep < warmup + reps; ++rep) {
    for (int which = 0; which < 2; ++which) {
      CK(cudaEventRecord(e0));
      if (which == 0)
        launch_old();
      else
        launch_new();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (rep >= warmup) t[which] += ms / reps;
    }
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return {t[0], t[1]};
}
