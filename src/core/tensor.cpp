#include "flashinfer/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>

#include "core/cuda_runtime.h"
#include "core/element.h"
#include "core/host_allocator.h"
#include "core/strided.h"
#include "core/view_overlap.h"
#include "flashinfer/error.h"

namespace flashinfer {

// ---- Storage
// -------------------------------------------------------------------------------------

namespace {
std::atomic<bool> g_cuda_storage_made{false};  // detail::cuda_storage_made()
}  // namespace

bool detail::cuda_storage_made() { return g_cuda_storage_made.load(std::memory_order_acquire); }

Storage::Storage(void* data, std::size_t nbytes, Device device, Deleter deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {
  if (device.is_cuda() && !g_cuda_storage_made.load(std::memory_order_relaxed)) {
    g_cuda_storage_made.store(true, std::memory_order_release);
  }
}

Storage::~Storage() {
  if (deleter_) deleter_(data_);
}

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Device device) {
  if (device.is_cpu()) {
    std::size_t capacity = 0;
    void* p = detail::host_alloc(nbytes, &capacity);
    auto s = std::make_shared<Storage>(p, nbytes, device,
                                       [capacity](void* q) { detail::host_free(q, capacity); });
    s->owns_ = true;
    return s;
  }
  FLASHINFER_CHECK(device.index >= 0, "Tensor.empty", "device", "negative CUDA device index");
  void* p = detail::cuda_device_malloc(nbytes, device.index);
  int index = device.index;
  auto s = std::make_shared<Storage>(p, nbytes, device,
                                     [index](void* q) { detail::cuda_device_free(q, index); });
  s->owns_ = true;
  return s;
}

// ---- helpers
// -------------------------------------------------------------------------------------

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s = detail::checked_mul(s, std::max<int64_t>(shape[i], 1), "Tensor", "shape");
  }
  return strides;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  s += ")";
  return s;
}

namespace {

int64_t numel_of(const Shape& shape) { return detail::checked_numel(shape); }

int64_t wrap_dim(int64_t d, int64_t ndim, const char* op) {
  int64_t w = d < 0 ? d + ndim : d;
  FLASHINFER_CHECK(w >= 0 && w < ndim, op, "dim", "dimension ", d, " out of range for a ", ndim,
                   "-D tensor");
  return w;
}

void check_shape(const Shape& shape, const char* op) {
  for (int64_t d : shape) {
    FLASHINFER_CHECK(d >= 0, op, "shape", "negative dimension in ", shape_to_string(shape));
  }
}

// Number of elements (from the storage start) the view touches: max offset + 1; 0 if empty.
// The largest row pitch a 2-D copy is given (cudaMemcpy2D refuses pitches above the device's
// memPitch, 2^31 - 1 on current GPUs); a larger one copies the whole span instead.
constexpr std::size_t kMaxCopyPitch = 0x7FFFFFFF;

int64_t span_end(const Shape& shape, const Shape& strides, int64_t offset,
                 const char* op = "Tensor") {
  const auto [begin, end] = detail::covered_span(shape, strides, offset, op);
  return begin == end ? 0 : end;
}

}  // namespace

// ---- factories
// -----------------------------------------------------------------------------------

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  check_shape(shape, "Tensor.empty");
  // Bytes, checked: a product of dimensions that wraps would allocate a tiny block.
  std::size_t n = dtype_size(dtype);
  bool overflow = false;
  for (int64_t d : shape) {
    overflow = overflow || __builtin_mul_overflow(n, static_cast<std::size_t>(d), &n);
  }
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) n = 0, overflow = false;
  FLASHINFER_CHECK(!overflow && n <= static_cast<std::size_t>(PTRDIFF_MAX), "Tensor.empty", "shape",
                   "a ", shape_to_string(shape), " tensor of ", dtype_name(dtype),
                   " does not fit in memory");
  auto strides = contiguous_strides(shape);
  return from_storage(Storage::allocate(n, device), std::move(shape), std::move(strides), 0, dtype);
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  if (!device.is_cpu()) return full(std::move(shape), 0.0, dtype, device);
  // +0 is all zero bytes in every dtype: one memset.
  Tensor t = empty(std::move(shape), dtype, device);
  if (t.nbytes() != 0) std::memset(t.data_ptr(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(Shape shape, double value, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<double>& values, Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype, Device::cpu());
  const bool fp4 = dtype == DType::kFloat4E2M1FNx2;
  const auto expected = static_cast<std::size_t>(t.numel()) * (fp4 ? 2 : 1);
  FLASHINFER_CHECK(values.size() == expected, "Tensor.from_vector", "values", "expected ", expected,
                   " values for shape ", shape_to_string(t.shape()), ", got ", values.size());
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  const std::size_t es = t.element_size();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (fp4) {
      p[i] = pack_e2m1x2(float_to_e2m1_bits(static_cast<float>(values[2 * i])),
                         float_to_e2m1_bits(static_cast<float>(values[2 * i + 1])));
    } else {
      detail::encode_element(dtype, values[i], p + i * es);
    }
  }
  return t;
}

Tensor Tensor::from_blob(void* data, Shape shape, Shape strides, DType dtype, Device device,
                         Storage::Deleter deleter, int64_t storage_offset) {
  check_shape(shape, "Tensor.from_blob");
  if (strides.empty() && !shape.empty()) strides = contiguous_strides(shape);
  FLASHINFER_CHECK(strides.size() == shape.size(), "Tensor.from_blob", "strides", "expected ",
                   shape.size(), " strides, got ", strides.size());
  FLASHINFER_CHECK(data != nullptr || numel_of(shape) == 0, "Tensor.from_blob", "data",
                   "null pointer for a non-empty tensor");
  const int64_t end = span_end(shape, strides, storage_offset, "Tensor.from_blob");
  const int64_t nbytes = detail::checked_mul(end, static_cast<int64_t>(dtype_size(dtype)),
                                             "Tensor.from_blob", "strides");
  auto storage =
      std::make_shared<Storage>(data, static_cast<std::size_t>(nbytes), device, std::move(deleter));
  return from_storage(std::move(storage), std::move(shape), std::move(strides), storage_offset,
                      dtype);
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, Shape shape, Shape strides,
                            int64_t storage_offset, DType dtype) {
  const char* op = "Tensor.from_storage";
  FLASHINFER_CHECK(storage != nullptr, op, "storage", "null storage");
  check_shape(shape, op);
  FLASHINFER_CHECK(strides.size() == shape.size(), op, "strides", "expected ", shape.size(),
                   " strides, got ", strides.size());
  FLASHINFER_CHECK(storage_offset >= 0, op, "storage_offset", "negative offset");
  for (int64_t s : strides) {
    FLASHINFER_CHECK(s >= 0, op, "strides", "negative strides are not supported");
  }
  const int64_t end = span_end(shape, strides, storage_offset, op);
  const int64_t needed =
      detail::checked_mul(end, static_cast<int64_t>(dtype_size(dtype)), op, "strides");
  FLASHINFER_CHECK(static_cast<std::size_t>(needed) <= storage->nbytes(), op, "shape", "view of ",
                   shape_to_string(shape), " with strides ", shape_to_string(strides),
                   " at offset ", storage_offset, " needs ", needed, " bytes; the storage has ",
                   storage->nbytes());
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  t.offset_ = storage_offset;
  t.dtype_ = dtype;
  return t;
}

// ---- metadata
// ------------------------------------------------------------------------------------

int64_t Tensor::size(int64_t d) const { return shape_[wrap_dim(d, dim(), "Tensor.size")]; }
int64_t Tensor::stride(int64_t d) const { return strides_[wrap_dim(d, dim(), "Tensor.stride")]; }
int64_t Tensor::numel() const { return numel_of(shape_); }
Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 0) return true;
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  if (!storage_) return nullptr;
  return static_cast<uint8_t*>(storage_->data()) + offset_ * static_cast<int64_t>(element_size());
}

// ---- views
// ---------------------------------------------------------------------------------------

Tensor Tensor::as_strided(Shape shape, Shape strides, int64_t storage_offset) const {
  FLASHINFER_CHECK(defined(), "Tensor.as_strided", "self", "undefined tensor");
  return from_storage(storage_, std::move(shape), std::move(strides), storage_offset, dtype_);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  const char* op = "Tensor.slice";
  d = wrap_dim(d, dim(), op);
  FLASHINFER_CHECK(step > 0, op, "step", "step must be positive, got ", step);
  const int64_t n = shape_[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = shape_, strides = strides_;
  shape[d] = end == start ? 0 : (end - start - 1) / step + 1;  // no overflow for a huge step
  // As torch: stride * step. A step past the end keeps at most one element, whose stride is
  // irrelevant: a huge step there keeps the old stride rather than overflow.
  if (__builtin_mul_overflow(strides_[d], step, &strides[d])) {
    FLASHINFER_CHECK(shape[d] <= 1, op, "step", "size arithmetic overflows int64: ", strides_[d],
                     " * ", step);
    strides[d] = strides_[d];
  }
  const int64_t offset = detail::checked_add(
      offset_, detail::checked_mul(start, strides_[d], op, "start"), op, "start");
  return from_storage(storage_, shape, strides, offset, dtype_);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  const char* op = "Tensor.select";
  d = wrap_dim(d, dim(), op);
  const int64_t n = shape_[d];
  if (index < 0) index += n;
  FLASHINFER_CHECK(index >= 0 && index < n, op, "index", "index ", index, " out of range for size ",
                   n);
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  const int64_t offset = detail::checked_add(
      offset_, detail::checked_mul(index, strides_[d], op, "index"), op, "index");
  return from_storage(storage_, shape, strides, offset, dtype_);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = wrap_dim(d0, dim(), "Tensor.transpose");
  d1 = wrap_dim(d1, dim(), "Tensor.transpose");
  Tensor t = *this;
  std::swap(t.shape_[d0], t.shape_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  const char* op = "Tensor.permute";
  FLASHINFER_CHECK(static_cast<int64_t>(dims.size()) == dim(), op, "dims", "expected ", dim(),
                   " dims, got ", dims.size());
  std::vector<bool> seen(dims.size(), false);
  Tensor t = *this;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), op);
    FLASHINFER_CHECK(!seen[d], op, "dims", "dimension ", d, " repeated");
    seen[d] = true;
    t.shape_[i] = shape_[d];
    t.strides_[i] = strides_[d];
  }
  return t;
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "Tensor.unsqueeze");
  Tensor t = *this;
  int64_t s =
      d < dim() ? detail::checked_mul(strides_[d], shape_[d], "Tensor.unsqueeze", "self") : 1;
  t.shape_.insert(t.shape_.begin() + d, 1);
  t.strides_.insert(t.strides_.begin() + d, s);
  return t;
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "Tensor.squeeze");
  if (shape_[d] != 1) return *this;
  Tensor t = *this;
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

namespace {

// Resolves one -1 entry and checks the element count.
Shape infer_shape(Shape shape, int64_t numel, const char* op) {
  int64_t known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      FLASHINFER_CHECK(infer < 0, op, "shape", "only one dimension can be -1");
      infer = static_cast<int>(i);
    } else {
      FLASHINFER_CHECK(shape[i] >= 0, op, "shape", "invalid dimension ", shape[i]);
      known = detail::checked_mul(known, shape[i], op, "shape");
    }
  }
  if (infer >= 0) {
    FLASHINFER_CHECK(known != 0 && numel % known == 0, op, "shape", "cannot infer -1 in ",
                     shape_to_string(shape), " for ", numel, " elements");
    shape[infer] = numel / known;
    known *= shape[infer];
  }
  FLASHINFER_CHECK(known == numel, op, "shape", "shape ", shape_to_string(shape),
                   " is invalid for ", numel, " elements");
  return shape;
}

// Strides for viewing (old_shape, old_strides) as new_shape without copying, if possible:
// groups of old dimensions that are laid out contiguously relative to each other can be split
// or merged freely; a new dimension may not straddle two such groups.
bool view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape,
                  Shape& out) {
  out.assign(new_shape.size(), 0);
  if (numel_of(old_shape) == 0) {
    out = contiguous_strides(new_shape);
    return true;
  }
  // Drop size-1 dims from the old layout: they never constrain a view.
  Shape os, ost;
  for (std::size_t i = 0; i < old_shape.size(); ++i) {
    if (old_shape[i] != 1) {
      os.push_back(old_shape[i]);
      ost.push_back(old_strides[i]);
    }
  }
  std::size_t oi = 0, ni = 0;
  while (ni < new_shape.size()) {
    if (new_shape[ni] == 1) {
      out[ni] = 1;  // any stride is fine for a size-1 dim
      ++ni;
      continue;
    }
    if (oi >= os.size()) return false;
    // Take one contiguous group of old dims [oi, oj).
    std::size_t oj = oi + 1;
    int64_t group = os[oi];
    while (oj < os.size() && ost[oj - 1] == os[oj] * ost[oj]) {
      group *= os[oj];
      ++oj;
    }
    const int64_t base_stride = ost[oj - 1];  // stride of the group's innermost dim
    // Consume new dims until they multiply to the group's size.
    int64_t prod = 1;
    std::size_t nj = ni;
    while (nj < new_shape.size() && prod < group) {
      prod *= new_shape[nj];
      ++nj;
    }
    if (prod != group) return false;
    int64_t s = base_stride;
    for (std::size_t k = nj; k-- > ni;) {
      out[k] = s;
      s *= new_shape[k];
    }
    ni = nj;
    oi = oj;
  }
  return oi == os.size();
}

}  // namespace

Tensor Tensor::view(Shape shape) const {
  const char* op = "Tensor.view";
  FLASHINFER_CHECK(defined(), op, "self", "undefined tensor");
  shape = infer_shape(std::move(shape), numel(), op);
  Shape strides;
  FLASHINFER_CHECK(view_strides(shape_, strides_, shape, strides), op, "shape",
                   "a tensor of shape ", shape_to_string(shape_), " and strides ",
                   shape_to_string(strides_), " cannot be viewed as ", shape_to_string(shape),
                   "; use reshape()");
  return from_storage(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

Tensor Tensor::reshape(Shape shape) const {
  const char* op = "Tensor.reshape";
  FLASHINFER_CHECK(defined(), op, "self", "undefined tensor");
  shape = infer_shape(std::move(shape), numel(), op);
  Shape strides;
  if (view_strides(shape_, strides_, shape, strides)) {
    return from_storage(storage_, std::move(shape), std::move(strides), offset_, dtype_);
  }
  return clone().view(std::move(shape));
}

// ---- copies
// --------------------------------------------------------------------------------------

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  FLASHINFER_CHECK(defined(), "Tensor.clone", "self", "undefined tensor");
  Tensor t = empty(shape_, dtype_, device());
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  FLASHINFER_CHECK(defined(), "Tensor.to", "self", "undefined tensor");
  if (device == this->device()) return *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  const char* op = "Tensor.to";
  FLASHINFER_CHECK(defined(), op, "self", "undefined tensor");
  if (dtype == dtype_) return *this;
  FLASHINFER_CHECK(dtype != DType::kFloat4E2M1FNx2 && dtype_ != DType::kFloat4E2M1FNx2, op, "dtype",
                   "casts to or from packed fp4 pairs change the shape; use the fp4 "
                   "quantization ops");
  if (!device().is_cpu()) {
    // On the device, as torch: no host copy, no synchronization (a CUDA graph captures it).
    Tensor out = empty(shape_, dtype, device());
    if (detail::cuda_tensor_copy(out.data_ptr(), dtype, shape_, out.strides_, data_ptr(), dtype_,
                                 strides_, nullptr, device().index)) {
      return out;
    }
  }
  Tensor src = device().is_cpu() ? *this : this->to(Device::cpu());
  Tensor out = empty(shape_, dtype, Device::cpu());
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  const auto* base = static_cast<const uint8_t*>(src.storage_->data());
  const std::size_t ies = src.element_size(), oes = out.element_size();
  int64_t i = 0;
  detail::for_each_offset(src.shape_, src.strides_, src.offset_, [&](int64_t off) {
    detail::encode_element(dtype, detail::decode_element(dtype_, base + off * ies), dst + i * oes);
    ++i;
  });
  return device().is_cpu() ? out : out.to(device());
}

Tensor& Tensor::copy_(const Tensor& src) {
  const char* op = "Tensor.copy_";
  FLASHINFER_CHECK(defined(), op, "self", "undefined tensor");
  FLASHINFER_CHECK(src.defined(), op, "src", "undefined tensor");
  FLASHINFER_CHECK(src.shape_ == shape_, op, "src", "shape ", shape_to_string(src.shape_),
                   " does not match ", shape_to_string(shape_));
  FLASHINFER_CHECK(src.dtype_ == dtype_, op, "src", "dtype ", dtype_torch_name(src.dtype_),
                   " does not match ", dtype_torch_name(dtype_), "; use to(dtype) first");
  if (numel() == 0) return *this;
  const std::size_t es = element_size();
  const Device sd = src.device(), dd = device();
  if (sd.is_cpu() && dd.is_cpu()) {
    detail::strided_copy(storage_->data(), shape_, strides_, offset_, src.storage_->data(),
                         src.strides_, src.offset_, es);
    return *this;
  }
  // A CUDA side is involved. Contiguous to contiguous is one memcpy; strided views on one device,
  // and the device side of a copy between the host and a device, a kernel; what is left (two
  // devices, views the kernel does not take) stages the covered span through the host (correct,
  // not fast: these paths serve tests and tools).
  if (is_contiguous() && src.is_contiguous()) {
    const std::size_t n = nbytes();
    if (sd.is_cpu()) {
      detail::cuda_memcpy(data_ptr(), src.data_ptr(), n, detail::CopyKind::kHostToDevice, dd.index);
    } else if (dd.is_cpu()) {
      detail::cuda_memcpy(data_ptr(), src.data_ptr(), n, detail::CopyKind::kDeviceToHost, sd.index);
    } else if (sd == dd) {
      // Stream-ordered, not synchronized: ops copy inputs dense on the device and a CUDA graph
      // captures them (a synchronization would end the capture).
      detail::cuda_memcpy_device_async(data_ptr(), src.data_ptr(), n, dd.index);
    } else {  // another device: finished before it returns, as before
      detail::cuda_memcpy(data_ptr(), src.data_ptr(), n, detail::CopyKind::kDeviceToDevice,
                          dd.index);
    }
    return *this;
  }
  // Strided on one device: a kernel, stream-ordered as the memcpy above. Views that overlap each
  // other, or a destination repeating an element, keep the staged path's copy-from-a-snapshot
  // semantics.
  if (sd == dd && detail::broadcast_dim(*this) < 0 && !detail::views_overlap(*this, src) &&
      detail::cuda_tensor_copy(data_ptr(), dtype_, shape_, strides_, src.data_ptr(), dtype_,
                               src.strides_, nullptr, dd.index)) {
    return *this;
  }
  // Between the host and a device, a strided device side is made dense on the device (or filled
  // from a dense copy there) by the same kernel, so only the view's elements cross and are
  // touched: no span read back with the bytes between them (memory nothing may have written:
  // compute-sanitizer initcheck), none written back over what another stream put there since.
  if (dd.is_cpu() && !sd.is_cpu() && !src.is_contiguous()) return copy_(src.contiguous());
  if (sd.is_cpu() && !dd.is_cpu() && !is_contiguous() && detail::broadcast_dim(*this) < 0) {
    Tensor dense = empty(shape_, dtype_, dd);
    dense.copy_(src);
    return copy_(dense);
  }
  Tensor host_src = src;
  if (!sd.is_cpu()) {
    // Copy the span the source view covers, then view it on the host with the same strides.
    // A view of rows at one pitch (padded rows, a transpose of them) moves only its rows: the
    // bytes between them may be memory nothing wrote (compute-sanitizer initcheck).
    const int64_t end = span_end(src.shape_, src.strides_, src.offset_);
    const int64_t begin = src.offset_;
    Tensor span = empty({end - begin}, dtype_, Device::cpu());
    detail::RowSpan rs;
    if (detail::as_row_span(src.shape_, src.strides_, &rs) && rs.pitch * es <= kMaxCopyPitch) {
      detail::cuda_memcpy_2d(span.data_ptr(), rs.pitch * es, src.data_ptr(), rs.pitch * es,
                             rs.cols * es, rs.rows, detail::CopyKind::kDeviceToHost, sd.index);
    } else {
      detail::cuda_memcpy(span.data_ptr(), src.data_ptr(), (end - begin) * es,
                          detail::CopyKind::kDeviceToHost, sd.index);
    }
    host_src = span.as_strided(src.shape_, src.strides_, 0);
  }
  if (dd.is_cpu()) {
    detail::strided_copy(storage_->data(), shape_, strides_, offset_, host_src.storage_->data(),
                         host_src.strides_, host_src.offset_, es);
    return *this;
  }
  if (is_contiguous()) {
    Tensor c = host_src.contiguous();
    detail::cuda_memcpy(data_ptr(), c.data_ptr(), nbytes(), detail::CopyKind::kHostToDevice,
                        dd.index);
    return *this;
  }
  // Non-contiguous CUDA destination. Rows at one pitch are written as rows (nothing read back:
  // a fresh destination holds no defined bytes yet); any other view is read, modified and written
  // back over its span, which keeps the elements between the view's.
  const int64_t end = span_end(shape_, strides_, offset_);
  Tensor span = empty({end - offset_}, dtype_, Device::cpu());
  detail::RowSpan rs;
  const bool by_rows = detail::as_row_span(shape_, strides_, &rs) && rs.pitch * es <= kMaxCopyPitch;
  if (!by_rows) {
    detail::cuda_memcpy(span.data_ptr(), data_ptr(), (end - offset_) * es,
                        detail::CopyKind::kDeviceToHost, dd.index);
  }
  span.as_strided(shape_, strides_, 0).copy_(host_src);
  if (by_rows) {
    detail::cuda_memcpy_2d(data_ptr(), rs.pitch * es, span.data_ptr(), rs.pitch * es, rs.cols * es,
                           rs.rows, detail::CopyKind::kHostToDevice, dd.index);
  } else {
    detail::cuda_memcpy(data_ptr(), span.data_ptr(), (end - offset_) * es,
                        detail::CopyKind::kHostToDevice, dd.index);
  }
  return *this;
}

Tensor& Tensor::fill_(double value) {
  FLASHINFER_CHECK(defined(), "Tensor.fill_", "self", "undefined tensor");
  if (numel() == 0) return *this;
  if (!device().is_cpu() && value == 0.0 && !std::signbit(value) && is_contiguous()) {
    // +0 is all zero bytes in every dtype: a contiguous device tensor takes one stream-ordered
    // memset, as torch's zero_ does, and a CUDA graph can capture it.
    detail::cuda_memset_async(data_ptr(), 0, nbytes(), device().index);
    return *this;
  }
  // As torch: a value an integer dtype cannot hold (NaN, +-inf, out of range) is an error, not
  // a silent 0 or a saturated bound; fp4 has no NaN to store.
  if (dtype_is_integral(dtype_)) {
    const double t = std::trunc(value);
    double lo = 0, hi = 0;  // hi: one past the largest value
    switch (dtype_) {
      case DType::kInt8:
        lo = -128.0, hi = 128.0;
        break;
      case DType::kUInt8:
        lo = 0.0, hi = 256.0;
        break;
      case DType::kInt16:
        lo = -32768.0, hi = 32768.0;
        break;
      case DType::kInt32:
        lo = -2147483648.0, hi = 2147483648.0;
        break;
      default:
        lo = -9223372036854775808.0, hi = 9223372036854775808.0;
        break;
    }
    FLASHINFER_CHECK(std::isfinite(value) && t >= lo && t < hi, "Tensor.fill_", "value", value,
                     " cannot be converted to ", dtype_torch_name(dtype_), " without overflow");
  }
  FLASHINFER_CHECK(!(dtype_ == DType::kFloat4E2M1FNx2 && std::isnan(value)), "Tensor.fill_",
                   "value", "torch.float4_e2m1fn_x2 has no NaN");
  uint8_t elem[8];
  detail::encode_element(dtype_, value, elem);
  if (!device().is_cpu()) {
    // Other values and strided views: the copy kernel writing `elem`, stream-ordered too (a fill
    // through the host took milliseconds for a 64 MB output, synchronized).
    if (detail::cuda_tensor_copy(data_ptr(), dtype_, shape_, strides_, nullptr, dtype_, {}, elem,
                                 device().index)) {
      return *this;
    }
    return copy_(full(shape_, value, dtype_, Device::cpu()));
  }
  const std::size_t es = element_size();
  auto* base = static_cast<uint8_t*>(storage_->data());
  // Dimensions merged where one steps over the next exactly, so that a contiguous tensor (or a
  // view whose rows are) is filled in long runs rather than element by element.
  Shape shape, strides;
  for (std::size_t d = 0; d < shape_.size(); ++d) {
    if (shape_[d] == 1) continue;
    if (!shape.empty() && strides.back() == shape_[d] * strides_[d]) {
      shape.back() *= shape_[d];
      strides.back() = strides_[d];
    } else {
      shape.push_back(shape_[d]);
      strides.push_back(strides_[d]);
    }
  }
  if (shape.empty() || strides.back() != 1) {
    detail::for_each_offset(shape, strides, offset_,
                            [&](int64_t off) { std::memcpy(base + off * es, elem, es); });
    return *this;
  }
  const auto run = static_cast<std::size_t>(shape.back()) * es;
  shape.pop_back();
  strides.pop_back();
  const bool one_byte = std::all_of(elem + 1, elem + es, [&](uint8_t b) { return b == elem[0]; });
  detail::for_each_offset(shape, strides, offset_, [&](int64_t off) {
    uint8_t* d = base + off * es;
    if (one_byte) {
      std::memset(d, elem[0], run);
      return;
    }
    // The element once, then the filled prefix copied onto the rest, doubling: a few large
    // copies whatever the element size or alignment.
    std::memcpy(d, elem, es);
    for (std::size_t done = es; done < run;) {
      const std::size_t n = std::min(done, run - done);
      std::memcpy(d + done, d, n);
      done += n;
    }
  });
  return *this;
}

namespace {

// SplitMix64: a counter-based generator, so element i's value depends only on (seed, i) and
// the fill is identical on every machine, device and thread count.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double uniform01(uint64_t seed, uint64_t i) {
  uint64_t r = splitmix64(splitmix64(seed) ^ (i * 0xD1B54A32D192ED03ull));
  return static_cast<double>(r >> 11) * 0x1.0p-53;  // [0, 1)
}

template <class Gen>
void fill_generated(Tensor& t, Gen gen) {
  const bool fp4 = t.dtype() == DType::kFloat4E2M1FNx2;
  std::vector<double> values(static_cast<std::size_t>(t.numel()) * (fp4 ? 2 : 1));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = gen(i);
  Tensor h = Tensor::from_vector(values, t.shape(), t.dtype());
  t.copy_(h);
}

}  // namespace

Tensor& Tensor::uniform_(uint64_t seed, double low, double high) {
  FLASHINFER_CHECK(defined(), "Tensor.uniform_", "self", "undefined tensor");
  FLASHINFER_CHECK(low <= high, "Tensor.uniform_", "low", "low (", low, ") > high (", high, ")");
  fill_generated(*this, [&](uint64_t i) { return low + (high - low) * uniform01(seed, i); });
  return *this;
}

Tensor& Tensor::normal_(uint64_t seed, double mean, double stddev) {
  FLASHINFER_CHECK(defined(), "Tensor.normal_", "self", "undefined tensor");
  // As torch: normal values truncated to integers would be mostly 0, silently.
  FLASHINFER_CHECK(dtype_is_floating(dtype_) || dtype_ == DType::kFloat4E2M1FNx2, "Tensor.normal_",
                   "self", "normal_ needs a floating dtype, got ", dtype_torch_name(dtype_));
  // Box-Muller over pairs of uniforms; element i uses pair i/2.
  fill_generated(*this, [&](uint64_t i) {
    const uint64_t pair = i / 2;
    const double u1 = 1.0 - uniform01(seed, 2 * pair);  // (0, 1]
    const double u2 = uniform01(seed, 2 * pair + 1);
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double a = 2.0 * M_PI * u2;
    return mean + stddev * r * ((i & 1) ? std::sin(a) : std::cos(a));
  });
  return *this;
}

std::vector<double> Tensor::to_double_vector() const {
  FLASHINFER_CHECK(defined(), "Tensor.to_double_vector", "self", "undefined tensor");
  Tensor h = device().is_cpu() ? *this : to(Device::cpu());
  const bool fp4 = dtype_ == DType::kFloat4E2M1FNx2;
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(numel()) * (fp4 ? 2 : 1));
  const auto* base = static_cast<const uint8_t*>(h.storage_->data());
  const std::size_t es = element_size();
  detail::for_each_offset(h.shape_, h.strides_, h.offset_, [&](int64_t off) {
    out.push_back(detail::decode_element(dtype_, base + off * es, 0));
    if (fp4) out.push_back(detail::decode_element(dtype_, base + off * es, 1));
  });
  return out;
}

double Tensor::item() const {
  FLASHINFER_CHECK(defined() && numel() == 1, "Tensor.item", "self",
                   "item() needs a one-element tensor, got shape ", shape_to_string(shape_));
  return to_double_vector()[0];
}

std::string Tensor::describe() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(shape=" << shape_to_string(shape_) << ", stride=" << shape_to_string(strides_)
     << ", dtype=" << dtype_torch_name(dtype_) << ", device=" << device().str() << ")";
  return os.str();
}

}  // namespace flashinfer
