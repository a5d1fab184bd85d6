// Private: the comparisons of fused_topk_deepseek's selection, shared by the CUDA kernel (a warp
// a token: kernels/cuda/moe_cuda.cu, deepseek_routing_kernel) and the CPU test that checks, by
// emulating the warp, that its reductions pick what the CPU reference's sequential loops pick
// (tests/ops/test_moe.cpp, DeepSeekRoutingRules.*), NaN, infinities and ties included.
//
// The reference's loops (kernels/cpu/moe_cpu.cpp, deepseek_routing):
//  - a group's score: its two largest biased scores by `if (v > m1) {m2 = m1; m1 = v;} else if
//    (v > m2) m2 = v;` from m1 = m2 = -inf. A NaN never enters; the result is the two largest of
//    the other values, whatever their order, so lanes may keep partial pairs and merge them.
//  - the argmax over candidates in ascending index, `if (best < 0 || v[i] > v[best]) best = i;`:
//    the first candidate when its value is NaN (nothing compares greater than NaN), else the
//    largest value with the lowest index among equals, NaNs never winning. pick_better orders
//    candidates that way, NaN last; the kernel checks the first candidate apart.
#pragma once

#include <cstdint>

#include "kernels/cuda/device/host_device.h"

namespace flashinfer::kernels::deepseek_routing {

/// The two largest values seen (m1 >= m2), -inf while fewer were seen.
struct Top2 {
  float m1, m2;
};

/// The reference's update with one value.
FLASHINFER_HD void top2_push(Top2& t, float v) {
  if (v > t.m1) {
    t.m2 = t.m1;
    t.m1 = v;
  } else if (v > t.m2) {
    t.m2 = v;
  }
}

/// The two largest of the values behind a and b (neither holds a NaN).
FLASHINFER_HD Top2 top2_merge(Top2 a, Top2 b) {
  const bool a_first = a.m1 >= b.m1;
  const float hi = a_first ? a.m1 : b.m1;
  const float lo = a_first ? b.m1 : a.m1;    // the other side's largest
  const float next = a_first ? a.m2 : b.m2;  // the larger side's second
  return {hi, lo > next ? lo : next};
}

/// Whether candidate (va, ia) goes before (vb, ib) in the argmax: a number before a NaN, then
/// the larger value, then the lower index.
FLASHINFER_HD bool pick_better(float va, int32_t ia, float vb, int32_t ib) {
  const bool na = va != va, nb = vb != vb;
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

}  // namespace flashinfer::kernels::deepseek_routing
