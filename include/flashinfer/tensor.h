// The library's owning, strided tensor.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "flashinfer/device.h"
#include "flashinfer/dtype.h"

namespace flashinfer {

using Shape = std::vector<int64_t>;

/// A block of memory on one device, freed by its deleter when the last Tensor using it goes.
class Storage {
 public:
  using Deleter = std::function<void(void*)>;
  Storage(void* data, std::size_t nbytes, Device device, Deleter deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  /// Allocates `nbytes` on `device` (64-byte aligned on the host, through the host cache below;
  /// cudaMalloc on CUDA).
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, Device device);

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  /// Whether allocate() made it: memory that no other Storage covers while this one lives (a
  /// from_blob storage may wrap memory that another one owns).
  bool owns_memory() const { return owns_; }
  /// The writes the library's ops made into this memory, as the flight recorder counts them:
  /// its ring mode trusts a kept copy of a span of an owning storage only while the count is
  /// unchanged (docs/LOGGING.md, "Ring mode").
  uint64_t write_count() const { return writes_.load(std::memory_order_relaxed); }
  void count_write() const { writes_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void* data_;
  std::size_t nbytes_;
  Device device_;
  Deleter deleter_;
  bool owns_ = false;
  mutable std::atomic<uint64_t> writes_{0};
};

/// Host blocks of 1 MiB and more are not handed back to the OS when their last tensor goes: the
/// CPU allocator keeps them (up to a limit, evicting the oldest first) for the next allocation of
/// the same size class, so an op that returns a new tensor every call does not fault in fresh
/// pages every call. The limit starts at FLASHINFER_HOST_CACHE_MB (default 1024; 0 disables the
/// cache). An allocation that fails frees the cache and tries once more.
struct HostCacheStats {
  std::size_t cached_bytes = 0;  ///< held for reuse now
  std::size_t limit_bytes = 0;   ///< the most it will hold
  uint64_t hits = 0;             ///< large allocations served from the cache
  uint64_t misses = 0;           ///< large allocations that went to the system allocator
};
HostCacheStats host_cache_stats();
/// Frees every cached block; returns the bytes released.
std::size_t empty_host_cache();
/// Sets the limit (0 disables caching) and frees cached blocks above it.
void set_host_cache_limit(std::size_t bytes);

/// An n-dimensional view of a Storage: shape and strides in elements, a storage offset in
/// elements, a dtype and a device. Copying a Tensor shares its storage (like torch); views
/// (slice, transpose, permute, as_strided, view/reshape) share it too. A default-constructed
/// Tensor is undefined (`defined() == false`).
class Tensor {
 public:
  Tensor() = default;

  // ---- factories ----
  static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu());
  static Tensor full(Shape shape, double value, DType dtype, Device device = Device::cpu());
  /// Contiguous CPU tensor holding `values` converted to `dtype` (round to nearest even).
  static Tensor from_vector(const std::vector<double>& values, Shape shape, DType dtype);
  /// Wraps memory the caller owns; `deleter` (may be empty) runs when the last user goes.
  static Tensor from_blob(void* data, Shape shape, Shape strides, DType dtype, Device device,
                          Storage::Deleter deleter = {}, int64_t storage_offset = 0);
  /// A tensor over an existing storage (strides in elements). Bounds are checked.
  static Tensor from_storage(std::shared_ptr<Storage> storage, Shape shape, Shape strides,
                             int64_t storage_offset, DType dtype);

  // ---- metadata ----
  bool defined() const { return static_cast<bool>(storage_); }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  /// Size / stride of dimension `d`; negative `d` counts from the end.
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  DType dtype() const { return dtype_; }
  Device device() const;
  int64_t storage_offset() const { return offset_; }
  std::size_t element_size() const { return dtype_size(dtype_); }
  /// numel() * element_size(): the logical size, not the span the strides cover.
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  /// Address of element [0, ..., 0] (storage base + offset).
  void* data_ptr() const;
  template <class T>
  T* data() const {
    return static_cast<T*>(data_ptr());
  }

  // ---- views (share storage) ----
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor as_strided(Shape shape, Shape strides, int64_t storage_offset) const;
  /// A view with a new shape (one entry may be -1); throws when the strides do not allow it.
  Tensor view(Shape shape) const;
  /// view() when legal, otherwise a contiguous copy reshaped.
  Tensor reshape(Shape shape) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;

  // ---- copies ----
  /// This tensor if already contiguous, otherwise a contiguous copy on the same device.
  Tensor contiguous() const;
  /// A contiguous copy (always a new storage).
  Tensor clone() const;
  /// A copy on `device` (this tensor itself when already there).
  Tensor to(Device device) const;
  /// A copy converted to `dtype` (CPU, round to nearest even; this tensor itself if same dtype).
  Tensor to(DType dtype) const;
  /// Copies `src` into this tensor: same shape and dtype, any strides, any devices.
  Tensor& copy_(const Tensor& src);
  /// Sets every element to `value` converted to the dtype.
  Tensor& fill_(double value);
  /// Fills with values uniform in [low, high) from a portable generator seeded by `seed`: the
  /// same seed gives the same values on every machine and device.
  Tensor& uniform_(uint64_t seed, double low = -1.0, double high = 1.0);
  /// Fills with standard normal values (mean, stddev) from the same portable generator.
  Tensor& normal_(uint64_t seed, double mean = 0.0, double stddev = 1.0);

  /// All elements, in logical (row-major) order, converted to double. fp4 pairs expand to two
  /// values per element. Works on any device (copies to the host).
  std::vector<double> to_double_vector() const;
  /// The single element of a one-element tensor, as double.
  double item() const;

  /// "Tensor(shape=(2, 3), stride=(3, 1), dtype=torch.float32, device=cpu)"
  std::string describe() const;

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::kFloat32;
};

/// Row-major strides for `shape`.
Shape contiguous_strides(const Shape& shape);
/// "(2, 3)" / "(3,)" / "()": Python tuple syntax, as torch prints shapes.
std::string shape_to_string(const Shape& shape);

}  // namespace flashinfer
