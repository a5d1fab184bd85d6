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
/// resets). The check, the driver call and the record are one step under the kernel's own lock
/// (on that device): with a record per launch size, two threads launching one kernel at two
/// sizes could leave the record saying one size and the driver holding the other, after which
/// every launch of the larger size skipped the call and failed (a review found it in session
/// 79). A lock per kernel and device, not one for all: the driver call may synchronize the
/// device's context (lazy loading), and a launch on another device must not wait for that (a
/// collective's peer thread).
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
    Entry& e = entry(kernel, device);
    const std::lock_guard<std::mutex> lock(e.mutex);
    if (e.limit >= smem) return Error{};
    const Error err = set_attribute(smem);
    if (err == Error{}) e.limit = smem;
    return err;
  }
  /// The limit launches raised `kernel`'s to on `device` (0: none).
  std::size_t limit(const void* kernel, int device) {
    Entry& e = entry(kernel, device);
    const std::lock_guard<std::mutex> lock(e.mutex);
    return e.limit;
  }

 private:
  struct Entry {
    std::mutex mutex;
    std::size_t limit = 0;
  };
  // The entry of (kernel, device), made on first use; entries never move (std::map nodes) and
  // are never erased.
  Entry& entry(const void* kernel, int device) {
    const std::lock_guard<std::mutex> lock(mutex_);
    return entries_[{kernel, device}];
  }
  std::mutex mutex_;  // the map only
  std::map<std::pair<const void*, int>, Entry> entries_;
};

}  // namespace flashinfer::kernels::cuda
