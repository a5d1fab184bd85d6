// The record of the dynamic shared memory limits kernel launches raised (cuda_utils.cuh's
// try_launch_kernel). Plain C++, so that the CPU tests check it (tests/api/test_smem_limits.cpp).
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>

namespace flashinfer::kernels::cuda {

/// The dynamic shared memory limit of each kernel on each device, raised by launches and never
/// lowered (a limit is a maximum: a launch asking for less runs under a larger one), so that
/// cudaFuncSetAttribute, a driver call, is made only when a launch needs more than any launch
/// before it (a kernel's attribute stays set in the device's context, which this library never
/// resets). The check, the driver call and the record are one step under the lock: with a
/// record per launch size, two threads launching one kernel at two sizes could leave the record
/// saying one size and the driver holding the other, after which every launch of the larger
/// size skipped the call and failed (a review found it in session 79).
class SmemLimits {
 public:
  static SmemLimits& instance() {
    static SmemLimits s;
    return s;
  }
  /// Raises `kernel`'s limit on `device` to `smem` through `set_attribute(smem)` (a
  /// cudaFuncSetAttribute call, whose error type's value-initialized value is success) unless a
  /// launch already raised it that far; returns its error (success when no call was needed).
  template <class SetAttribute>
  auto ensure(const void* kernel, int device, std::size_t smem, SetAttribute&& set_attribute)
      -> decltype(set_attribute(smem)) {
    using Error = decltype(set_attribute(smem));
    const std::lock_guard<std::mutex> lock(mutex_);
    std::size_t& limit = limits_[{kernel, device}];
    if (limit >= smem) return Error{};
    const Error err = set_attribute(smem);
    if (err == Error{}) limit = smem;
    return err;
  }
  /// The limit launches raised `kernel`'s to on `device` (0: none).
  std::size_t limit(const void* kernel, int device) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = limits_.find({kernel, device});
    return it == limits_.end() ? 0 : it->second;
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<const void*, int>, std::size_t> limits_;
};

}  // namespace flashinfer::kernels::cuda
