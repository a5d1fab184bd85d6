// GGUF reader (include/flashinfer/gguf.h). The file is untrusted: the parser reads it through a
// cursor that checks every read against the end, every count against what the remaining bytes
// could hold (so no allocation outgrows the file), and every size with overflow-checked
// arithmetic.
#include "flashinfer/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"

namespace flashinfer::gguf {
namespace {

constexpr const char* kOp = "gguf";
constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32

template <class... Args>
[[noreturn]] void fail_format(const std::string& file, const Args&... parts) {
  FLASHINFER_FAIL(ErrorCode::kFormat, kOp, "file", "GGUF file '", file, "': ", parts...);
}

struct TypeGeometry {
  GGMLType type;
  const char* name;
  int64_t block_size;
  int64_t type_size;
};

// ggml's block geometry (elements per block, bytes per block) for every type it defines.
constexpr TypeGeometry kTypes[] = {
    {GGMLType::F32, "F32", 1, 4},
    {GGMLType::F16, "F16", 1, 2},
    {GGMLType::Q4_0, "Q4_0", 32, 18},
    {GGMLType::Q4_1, "Q4_1", 32, 20},
    {GGMLType::Q5_0, "Q5_0", 32, 22},
    {GGMLType::Q5_1, "Q5_1", 32, 24},
    {GGMLType::Q8_0, "Q8_0", 32, 34},
    {GGMLType::Q8_1, "Q8_1", 32, 36},
    {GGMLType::Q2_K, "Q2_K", 256, 84},
    {GGMLType::Q3_K, "Q3_K", 256, 110},
    {GGMLType::Q4_K, "Q4_K", 256, 144},
    {GGMLType::Q5_K, "Q5_K", 256, 176},
    {GGMLType::Q6_K, "Q6_K", 256, 210},
    {GGMLType::Q8_K, "Q8_K", 256, 292},
    {GGMLType::IQ2_XXS, "IQ2_XXS", 256, 66},
    {GGMLType::IQ2_XS, "IQ2_XS", 256, 74},
    {GGMLType::IQ3_XXS, "IQ3_XXS", 256, 98},
    {GGMLType::IQ1_S, "IQ1_S", 256, 50},
    {GGMLType::IQ4_NL, "IQ4_NL", 32, 18},
    {GGMLType::IQ3_S, "IQ3_S", 256, 110},
    {GGMLType::IQ2_S, "IQ2_S", 256, 82},
    {GGMLType::IQ4_XS, "IQ4_XS", 256, 136},
    {GGMLType::I8, "I8", 1, 1},
    {GGMLType::I16, "I16", 1, 2},
    {GGMLType::I32, "I32", 1, 4},
    {GGMLType::I64, "I64", 1, 8},
    {GGMLType::F64, "F64", 1, 8},
    {GGMLType::IQ1_M, "IQ1_M", 256, 56},
    {GGMLType::BF16, "BF16", 1, 2},
    {GGMLType::TQ1_0, "TQ1_0", 256, 54},
    {GGMLType::TQ2_0, "TQ2_0", 256, 66},
    {GGMLType::MXFP4, "MXFP4", 32, 17},
};

const TypeGeometry* find_type(GGMLType type) {
  for (const auto& t : kTypes) {
    if (t.type == type) return &t;
  }
  return nullptr;
}

// Bytes one scalar of a metadata value type occupies; 0 for string and array.
uint64_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::kUInt8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUInt16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUInt32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUInt64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
      return 8;
    case ValueType::kString:
    case ValueType::kArray:
      return 0;
  }
  return 0;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::kFloat64); }

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

uint64_t load_le(const uint8_t* p, uint64_t n) {
  uint64_t v = 0;
  for (uint64_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
  return v;
}

// Decodes one scalar stored in `size` little-endian bytes into the Value's u / i / f member.
void decode_scalar(ValueType t, const uint8_t* p, Value& v) {
  const uint64_t bits = load_le(p, scalar_size(t));
  switch (t) {
    case ValueType::kUInt8:
    case ValueType::kUInt16:
    case ValueType::kUInt32:
    case ValueType::kUInt64:
    case ValueType::kBool:
      v.u = bits;
      break;
    case ValueType::kInt8:
      v.i = static_cast<int8_t>(bits);
      break;
    case ValueType::kInt16:
      v.i = static_cast<int16_t>(bits);
      break;
    case ValueType::kInt32:
      v.i = static_cast<int32_t>(bits);
      break;
    case ValueType::kInt64:
      v.i = static_cast<int64_t>(bits);
      break;
    case ValueType::kFloat32:
      v.f = std::bit_cast<float>(static_cast<uint32_t>(bits));
      break;
    case ValueType::kFloat64:
      v.f = std::bit_cast<double>(bits);
      break;
    case ValueType::kString:
    case ValueType::kArray:
      break;
  }
}

// Reads the file front to back; every read is checked against the end.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& file) : b_(bytes), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return b_.size() - pos_; }

  const uint8_t* take(uint64_t n, const char* what) {
    if (n > remaining()) {
      fail_format(file_, "truncated: ", what, " needs ", n, " bytes at offset ", pos_, ", only ",
                  remaining(), " remain");
    }
    const uint8_t* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint32_t u32(const char* what) { return static_cast<uint32_t>(load_le(take(4, what), 4)); }
  uint64_t u64(const char* what) { return load_le(take(8, what), 8); }

  std::string string(uint64_t max_len, const char* what) {
    const uint64_t len = u64(what);
    if (len > max_len) {
      fail_format(file_, what, " at offset ", pos_ - 8, " is ", len,
                  " bytes long, more than the limit of ", max_len);
    }
    const uint8_t* p = take(len, what);
    return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(len));
  }

  // A count of elements that each need at least `min_elem_bytes` more bytes: rejected when the
  // rest of the file could not hold them, which bounds every allocation by the file size.
  void check_count(uint64_t count, uint64_t min_elem_bytes, const char* what) const {
    uint64_t need = 0;
    if (mul_overflows(count, min_elem_bytes, &need) || need > remaining()) {
      fail_format(file_, what, " count ", count, " at offset ", pos_,
                  " cannot fit in the rest of the file (", remaining(), " bytes)");
    }
  }

  Value value(ValueType t, int depth, const std::string& key) {
    Value v;
    v.type = t;
    if (t == ValueType::kString) {
      v.str = string(kMaxStringBytes, "string value");
    } else if (t == ValueType::kArray) {
      array(v, depth, key);
    } else {
      decode_scalar(t, take(scalar_size(t), "metadata value"), v);
      if (t == ValueType::kBool && v.u > 1) {
        fail_format(file_, "metadata '", key, "': bool value ", v.u, " is neither 0 nor 1");
      }
    }
    return v;
  }

  void array(Value& v, int depth, const std::string& key) {
    if (depth >= kMaxArrayDepth) {
      fail_format(file_, "metadata '", key, "': arrays nested deeper than ", kMaxArrayDepth);
    }
    const uint32_t et = u32("array element type");
    if (!valid_value_type(et)) {
      fail_format(file_, "metadata '", key, "': unknown array element type ", et);
    }
    v.elem_type = static_cast<ValueType>(et);
    v.count = u64("array length");
    const uint64_t esize = scalar_size(v.elem_type);
    if (esize != 0) {
      check_count(v.count, esize, "array element");
      const uint8_t* p = take(v.count * esize, "array data");
      v.raw.assign(p, p + v.count * esize);
      if (v.elem_type == ValueType::kBool) {
        for (uint64_t k = 0; k < v.count; ++k) {
          if (v.raw[k] > 1) {
            fail_format(file_, "metadata '", key, "': bool element ", k, " is ", int{v.raw[k]});
          }
        }
      }
    } else if (v.elem_type == ValueType::kString) {
      check_count(v.count, 8, "string array element");
      v.strings.reserve(static_cast<std::size_t>(v.count));
      for (uint64_t k = 0; k < v.count; ++k) {
        v.strings.push_back(string(kMaxStringBytes, "string array element"));
      }
    } else {
      check_count(v.count, 12, "nested array");
      v.arrays.reserve(static_cast<std::size_t>(v.count));
      for (uint64_t k = 0; k < v.count; ++k) {
        Value e;
        e.type = ValueType::kArray;
        array(e, depth + 1, key);
        v.arrays.push_back(std::move(e));
      }
    }
  }

 private:
  std::span<const uint8_t> b_;
  const std::string& file_;
  uint64_t pos_ = 0;
};

const char* integer_type_name_or_null(ValueType t) {
  switch (t) {
    case ValueType::kUInt8:
    case ValueType::kInt8:
    case ValueType::kUInt16:
    case ValueType::kInt16:
    case ValueType::kUInt32:
    case ValueType::kInt32:
    case ValueType::kUInt64:
    case ValueType::kInt64:
      return "integer";
    default:
      return nullptr;
  }
}

bool is_signed(ValueType t) {
  return t == ValueType::kInt8 || t == ValueType::kInt16 || t == ValueType::kInt32 ||
         t == ValueType::kInt64;
}

// The scalar in `v` (an integer or bool) as int64; Error when a uint64 does not fit.
int64_t scalar_as_int(const Value& v, const std::string& what) {
  if (is_signed(v.type)) return v.i;
  if (v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    FLASHINFER_FAIL(ErrorCode::kFormat, kOp, "key", what, ": ", v.u, " does not fit in int64");
  }
  return static_cast<int64_t>(v.u);
}

}  // namespace

// ---- type tables ----

std::string ggml_type_name(GGMLType type) {
  if (const auto* t = find_type(type)) return t->name;
  return "type" + std::to_string(static_cast<uint32_t>(type));
}

bool ggml_type_known(GGMLType type) { return find_type(type) != nullptr; }

int64_t ggml_block_size(GGMLType type) {
  const auto* t = find_type(type);
  FLASHINFER_CHECK_CODE(t != nullptr, ErrorCode::kUnsupported, kOp, "type", "unknown ggml type ",
                        static_cast<uint32_t>(type));
  return t->block_size;
}

int64_t ggml_type_size(GGMLType type) {
  const auto* t = find_type(type);
  FLASHINFER_CHECK_CODE(t != nullptr, ErrorCode::kUnsupported, kOp, "type", "unknown ggml type ",
                        static_cast<uint32_t>(type));
  return t->type_size;
}

bool can_dequantize(GGMLType type) {
  switch (type) {
    case GGMLType::F32:
    case GGMLType::F16:
    case GGMLType::BF16:
    case GGMLType::Q8_0:
    case GGMLType::Q4_0:
    case GGMLType::Q4_1:
      return true;
    default:
      return false;
  }
}

std::string_view value_type_name(ValueType type) {
  switch (type) {
    case ValueType::kUInt8:
      return "uint8";
    case ValueType::kInt8:
      return "int8";
    case ValueType::kUInt16:
      return "uint16";
    case ValueType::kInt16:
      return "int16";
    case ValueType::kUInt32:
      return "uint32";
    case ValueType::kInt32:
      return "int32";
    case ValueType::kFloat32:
      return "float32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kArray:
      return "array";
    case ValueType::kUInt64:
      return "uint64";
    case ValueType::kInt64:
      return "int64";
    case ValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

// ---- Value ----

bool Value::is_integer() const { return integer_type_name_or_null(type) != nullptr; }
bool Value::is_float() const { return type == ValueType::kFloat32 || type == ValueType::kFloat64; }

int64_t Value::int_at(uint64_t idx) const {
  const uint64_t esize = scalar_size(elem_type);
  FLASHINFER_CHECK_CODE(type == ValueType::kArray && esize != 0 &&
                            (integer_type_name_or_null(elem_type) || elem_type == ValueType::kBool),
                        ErrorCode::kFormat, kOp, "key", "not an array of integers: ", summary());
  FLASHINFER_CHECK(idx < count, kOp, "index", "index ", idx, " out of range for ", summary());
  Value e;
  e.type = elem_type;
  decode_scalar(elem_type, raw.data() + idx * esize, e);
  return scalar_as_int(e, "array element " + std::to_string(idx));
}

double Value::float_at(uint64_t idx) const {
  const uint64_t esize = scalar_size(elem_type);
  FLASHINFER_CHECK_CODE(type == ValueType::kArray && esize != 0, ErrorCode::kFormat, kOp, "key",
                        "not an array of numbers: ", summary());
  FLASHINFER_CHECK(idx < count, kOp, "index", "index ", idx, " out of range for ", summary());
  Value e;
  e.type = elem_type;
  decode_scalar(elem_type, raw.data() + idx * esize, e);
  if (e.is_float()) return e.f;
  if (is_signed(elem_type)) return static_cast<double>(e.i);
  return static_cast<double>(e.u);
}

std::string Value::summary() const {
  std::string s(value_type_name(type));
  switch (type) {
    case ValueType::kString:
      return s + " \"" + (str.size() > 40 ? str.substr(0, 40) + "..." : str) + "\"";
    case ValueType::kArray:
      return s + "<" + std::string(value_type_name(elem_type)) + ">[" + std::to_string(count) + "]";
    case ValueType::kFloat32:
    case ValueType::kFloat64:
      return s + " " + std::to_string(f);
    default:
      return s + " " + (is_signed(type) ? std::to_string(i) : std::to_string(u));
  }
}

// ---- TensorInfo ----

Shape TensorInfo::shape() const { return Shape(ne.rbegin(), ne.rend()); }

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // validated at parse time not to overflow
  return n;
}

int64_t TensorInfo::rows() const { return row_length() == 0 ? 0 : numel() / row_length(); }

uint64_t TensorInfo::row_bytes() const {
  return static_cast<uint64_t>(row_length() / ggml_block_size(type)) *
         static_cast<uint64_t>(ggml_type_size(type));
}

// ---- File ----

struct File::Bytes {
  std::string owned;  // from_bytes
  void* map = nullptr;
  std::size_t map_len = 0;
  ~Bytes() {
    if (map != nullptr) ::munmap(map, map_len);
  }
};

File File::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, kOp, "path", "cannot open '", path,
                    "': ", std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, kOp, "path", "cannot stat '", path,
                    "': ", std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    FLASHINFER_FAIL(ErrorCode::kIo, kOp, "path", "'", path,
                    "' is not a regular file (a FIFO, device, socket or directory)");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > kMaxFileBytes) {
    FLASHINFER_FAIL(ErrorCode::kIo, kOp, "path", "'", path, "' is ", size,
                    " bytes, more than the limit of ", kMaxFileBytes);
  }
  auto owner = std::make_shared<Bytes>();
  File f;
  f.path_ = path;
  if (size > 0) {
    // Private and writable (copy-on-write): a caller writing through raw_tensor() changes its
    // own copy of the pages, never the file, and does not fault.
    void* p =
        ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      FLASHINFER_FAIL(ErrorCode::kIo, kOp, "path", "cannot map '", path,
                      "': ", std::strerror(errno));
    }
    owner->map = p;
    owner->map_len = static_cast<std::size_t>(size);
    f.bytes_ = std::span<const uint8_t>(static_cast<const uint8_t*>(p), owner->map_len);
  }
  f.owner_ = std::move(owner);
  f.parse();
  return f;
}

File File::from_bytes(std::string bytes, const std::string& name) {
  auto owner = std::make_shared<Bytes>();
  owner->owned = std::move(bytes);
  File f;
  f.path_ = name;
  f.bytes_ = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(owner->owned.data()),
                                      owner->owned.size());
  f.owner_ = std::move(owner);
  f.parse();
  return f;
}

void File::parse() {
  Cursor c(bytes_, path_);
  if (bytes_.size() < 4 || load_le(bytes_.data(), 4) != kMagic) {
    fail_format(path_, "bad magic (expected \"GGUF\")");
  }
  c.take(4, "magic");
  version_ = c.u32("version");
  if (version_ != 2 && version_ != 3) {
    fail_format(path_, "unsupported version ", version_, " (this reader handles 2 and 3)");
  }
  const uint64_t n_tensors = c.u64("tensor count");
  const uint64_t n_kv = c.u64("metadata count");
  if (n_tensors > kMaxTensors) {
    fail_format(path_, "tensor count ", n_tensors, " is more than the limit of ", kMaxTensors);
  }
  if (n_kv > kMaxMetadataEntries) {
    fail_format(path_, "metadata count ", n_kv, " is more than the limit of ", kMaxMetadataEntries);
  }
  // Smallest entries: key length + value type + a 1-byte value = 13 bytes; tensor info: name
  // length + n_dims + type + offset = 24 bytes.
  c.check_count(n_kv, 13, "metadata");

  keys_.reserve(static_cast<std::size_t>(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.string(kMaxKeyBytes, "metadata key");
    const uint32_t vt = c.u32("metadata value type");
    if (!valid_value_type(vt)) {
      fail_format(path_, "metadata '", key, "': unknown value type ", vt);
    }
    Value v = c.value(static_cast<ValueType>(vt), 0, key);
    if (metadata_.count(key) != 0) fail_format(path_, "duplicate metadata key '", key, "'");
    keys_.push_back(key);
    metadata_.emplace(std::move(key), std::move(v));
  }

  if (auto it = metadata_.find("general.alignment"); it != metadata_.end()) {
    const Value& a = it->second;
    if (a.type != ValueType::kUInt32) {
      fail_format(path_, "general.alignment must be uint32, is ", a.summary());
    }
    if (a.u == 0 || (a.u & (a.u - 1)) != 0 || a.u > kMaxAlignment) {
      fail_format(path_, "general.alignment ", a.u, " is not a power of two up to ", kMaxAlignment);
    }
    alignment_ = static_cast<uint32_t>(a.u);
  }

  c.check_count(n_tensors, 24, "tensor info");
  tensors_.reserve(static_cast<std::size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo t;
    t.name = c.string(kMaxTensorNameBytes, "tensor name");
    const uint32_t n_dims = c.u32("tensor n_dims");
    if (n_dims > kMaxDims) {
      fail_format(path_, "tensor '", t.name, "' has ", n_dims, " dimensions, more than ", kMaxDims);
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = c.u64("tensor dimension");
      if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          mul_overflows(numel, n, &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail_format(path_, "tensor '", t.name, "': dimensions overflow (dimension ", d, " is ", n,
                    ")");
      }
      t.ne.push_back(static_cast<int64_t>(n));
    }
    const uint32_t type = c.u32("tensor type");
    t.type = static_cast<GGMLType>(type);
    const TypeGeometry* g = find_type(t.type);
    if (g == nullptr) fail_format(path_, "tensor '", t.name, "': unknown ggml type ", type);
    t.offset = c.u64("tensor offset");
    const uint64_t row = t.ne.empty() ? 1 : static_cast<uint64_t>(t.ne[0]);
    if (row % static_cast<uint64_t>(g->block_size) != 0) {
      fail_format(path_, "tensor '", t.name, "': row length ", row,
                  " is not a multiple of the block size ", g->block_size, " of ", g->name);
    }
    // numel / block_size blocks of type_size bytes; numel < 2^63 and type_size < 2^9.
    if (mul_overflows(numel / static_cast<uint64_t>(g->block_size),
                      static_cast<uint64_t>(g->type_size), &t.nbytes)) {
      fail_format(path_, "tensor '", t.name, "': byte size overflows");
    }
    if (t.offset % alignment_ != 0) {
      fail_format(path_, "tensor '", t.name, "': offset ", t.offset,
                  " is not a multiple of the alignment ", alignment_);
    }
    if (tensor_index_.count(t.name) != 0) fail_format(path_, "duplicate tensor '", t.name, "'");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment after the tensor infos.
  const uint64_t end_of_infos = c.pos();
  const uint64_t pad = (alignment_ - end_of_infos % alignment_) % alignment_;
  data_offset_ = end_of_infos + pad;
  if (data_offset_ > bytes_.size()) {
    if (!tensors_.empty()) {
      fail_format(path_, "truncated: the data section would start at ", data_offset_,
                  " past the end of the file (", bytes_.size(), " bytes)");
    }
    data_offset_ = bytes_.size();  // no tensors: the padding may be left out
  }
  const uint64_t data_size = bytes_.size() - data_offset_;
  for (const TensorInfo& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      fail_format(path_, "tensor '", t.name, "': data [", t.offset, ", ", t.offset, " + ", t.nbytes,
                  ") runs past the end of the data section (", data_size, " bytes)");
    }
  }
}

const Value& File::get(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) fail_format(path_, "no metadata key '", key, "'");
  return it->second;
}

namespace {

const Value& typed(const File& f, const std::string& key, ValueType want) {
  const Value& v = f.get(key);
  if (v.type != want) {
    fail_format(f.path(), "metadata '", key, "' is ", v.summary(), ", expected ",
                value_type_name(want));
  }
  return v;
}

}  // namespace

std::string File::get_string(const std::string& key) const {
  return typed(*this, key, ValueType::kString).str;
}
uint8_t File::get_u8(const std::string& key) const {
  return static_cast<uint8_t>(typed(*this, key, ValueType::kUInt8).u);
}
int8_t File::get_i8(const std::string& key) const {
  return static_cast<int8_t>(typed(*this, key, ValueType::kInt8).i);
}
uint16_t File::get_u16(const std::string& key) const {
  return static_cast<uint16_t>(typed(*this, key, ValueType::kUInt16).u);
}
int16_t File::get_i16(const std::string& key) const {
  return static_cast<int16_t>(typed(*this, key, ValueType::kInt16).i);
}
uint32_t File::get_u32(const std::string& key) const {
  return static_cast<uint32_t>(typed(*this, key, ValueType::kUInt32).u);
}
int32_t File::get_i32(const std::string& key) const {
  return static_cast<int32_t>(typed(*this, key, ValueType::kInt32).i);
}
uint64_t File::get_u64(const std::string& key) const {
  return typed(*this, key, ValueType::kUInt64).u;
}
int64_t File::get_i64(const std::string& key) const {
  return typed(*this, key, ValueType::kInt64).i;
}
float File::get_f32(const std::string& key) const {
  return static_cast<float>(typed(*this, key, ValueType::kFloat32).f);
}
double File::get_f64(const std::string& key) const {
  return typed(*this, key, ValueType::kFloat64).f;
}
bool File::get_bool(const std::string& key) const {
  return typed(*this, key, ValueType::kBool).u != 0;
}

int64_t File::get_int(const std::string& key) const {
  const Value& v = get(key);
  if (!v.is_integer())
    fail_format(path_, "metadata '", key, "' is ", v.summary(), ", not an integer");
  return scalar_as_int(v, "GGUF file '" + path_ + "': metadata '" + key + "'");
}

double File::get_float(const std::string& key) const {
  const Value& v = get(key);
  if (v.is_float()) return v.f;
  if (v.is_integer())
    return is_signed(v.type) ? static_cast<double>(v.i) : static_cast<double>(v.u);
  fail_format(path_, "metadata '", key, "' is ", v.summary(), ", not a number");
}

std::vector<std::string> File::get_string_array(const std::string& key) const {
  const Value& v = typed(*this, key, ValueType::kArray);
  if (v.elem_type != ValueType::kString) {
    fail_format(path_, "metadata '", key, "' is ", v.summary(), ", expected array<string>");
  }
  return v.strings;
}

std::vector<int64_t> File::get_int_array(const std::string& key) const {
  const Value& v = typed(*this, key, ValueType::kArray);
  if (!integer_type_name_or_null(v.elem_type) && v.elem_type != ValueType::kBool) {
    fail_format(path_, "metadata '", key, "' is ", v.summary(), ", expected an integer array");
  }
  std::vector<int64_t> out(static_cast<std::size_t>(v.count));
  for (uint64_t k = 0; k < v.count; ++k) {
    Value e;
    e.type = v.elem_type;
    decode_scalar(v.elem_type, v.raw.data() + k * scalar_size(v.elem_type), e);
    out[k] = scalar_as_int(
        e, "GGUF file '" + path_ + "': metadata '" + key + "' element " + std::to_string(k));
  }
  return out;
}

std::vector<double> File::get_float_array(const std::string& key) const {
  const Value& v = typed(*this, key, ValueType::kArray);
  if (scalar_size(v.elem_type) == 0) {
    fail_format(path_, "metadata '", key, "' is ", v.summary(), ", expected a numeric array");
  }
  std::vector<double> out(static_cast<std::size_t>(v.count));
  for (uint64_t k = 0; k < v.count; ++k) out[k] = v.float_at(k);
  return out;
}

const TensorInfo& File::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) fail_format(path_, "no tensor '", name, "'");
  return tensors_[it->second];
}

std::span<const uint8_t> File::raw_data(const TensorInfo& info) const {
  // `info` may have been built or edited by the caller: check it against the file again.
  const TypeGeometry* g = find_type(info.type);
  uint64_t numel = 1;
  bool ok = g != nullptr && info.ne.size() <= kMaxDims;
  for (std::size_t d = 0; ok && d < info.ne.size(); ++d) {
    ok = info.ne[d] >= 0 && !mul_overflows(numel, static_cast<uint64_t>(info.ne[d]), &numel) &&
         numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  uint64_t nbytes = 0;
  ok = ok && (info.ne.empty() ? 1 : info.ne[0]) % g->block_size == 0 &&
       !mul_overflows(numel / static_cast<uint64_t>(g->block_size),
                      static_cast<uint64_t>(g->type_size), &nbytes) &&
       nbytes == info.nbytes;
  const uint64_t data_size = bytes_.size() - data_offset_;
  if (!ok || info.offset > data_size || info.nbytes > data_size - info.offset) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, kOp, "info", "GGUF file '", path_, "': tensor '",
                    info.name, "' (", ggml_type_name(info.type),
                    ") does not describe data inside this file");
  }
  return bytes_.subspan(static_cast<std::size_t>(data_offset_ + info.offset),
                        static_cast<std::size_t>(info.nbytes));
}

Tensor File::raw_tensor(const TensorInfo& info) const {
  const std::span<const uint8_t> d = raw_data(info);
  const int64_t rows = info.rows();
  const int64_t row_bytes = static_cast<int64_t>(info.row_bytes());
  std::shared_ptr<const Bytes> keep = owner_;
  // The mapping is private copy-on-write (open) or an owned string (from_bytes): writable.
  return Tensor::from_blob(const_cast<uint8_t*>(d.data()), {rows, row_bytes}, {}, DType::kUInt8,
                           Device::cpu(), [keep](void*) {});
}

void dequantize_row(GGMLType type, const uint8_t* src, float* dst, int64_t n) {
  const int64_t nb = n / ggml_block_size(type);
  auto f16 = [](const uint8_t* p) {
    return half_bits_to_float(static_cast<uint16_t>(p[0] | (p[1] << 8)));
  };
  switch (type) {
    case GGMLType::F32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      return;
    case GGMLType::F16:
      for (int64_t k = 0; k < n; ++k) dst[k] = f16(src + 2 * k);
      return;
    case GGMLType::BF16:
      for (int64_t k = 0; k < n; ++k) {
        dst[k] = bfloat16_bits_to_float(static_cast<uint16_t>(src[2 * k] | (src[2 * k + 1] << 8)));
      }
      return;
    case GGMLType::Q8_0:
      for (int64_t b = 0; b < nb; ++b, src += 34, dst += kQK) {
        const float d = f16(src);
        for (int j = 0; j < kQK; ++j)
          dst[j] = d * static_cast<float>(static_cast<int8_t>(src[2 + j]));
      }
      return;
    case GGMLType::Q4_0:
      for (int64_t b = 0; b < nb; ++b, src += 18, dst += kQK) {
        const float d = f16(src);
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * static_cast<float>((src[2 + j] & 0xF) - 8);
          dst[j + 16] = d * static_cast<float>((src[2 + j] >> 4) - 8);
        }
      }
      return;
    case GGMLType::Q4_1:
      for (int64_t b = 0; b < nb; ++b, src += 20, dst += kQK) {
        const float d = f16(src);
        const float m = f16(src + 2);
        for (int j = 0; j < 16; ++j) {
          // d * q is exact in float32 (11-bit by 4-bit significands), so a fused multiply-add
          // rounds the same as the separate multiply and add.
          dst[j] = d * static_cast<float>(src[4 + j] & 0xF) + m;
          dst[j + 16] = d * static_cast<float>(src[4 + j] >> 4) + m;
        }
      }
      return;
    default:
      FLASHINFER_FAIL(ErrorCode::kUnsupported, kOp, "type", "cannot dequantize ggml type ",
                      ggml_type_name(type));
  }
}

Tensor File::dequantize(const TensorInfo& info, DType dtype) const {
  FLASHINFER_CHECK_CODE(can_dequantize(info.type), ErrorCode::kUnsupported, kOp, "type",
                        "GGUF file '", path_, "': tensor '", info.name, "' has type ",
                        ggml_type_name(info.type),
                        "; dequantize handles F32, F16, BF16, Q8_0, Q4_0 and Q4_1");
  FLASHINFER_CHECK_CODE(dtype == DType::kFloat32 || dtype == DType::kBFloat16,
                        ErrorCode::kUnsupported, kOp, "dtype",
                        "dequantize to float32 or bfloat16, not ", dtype_name(dtype));
  const std::span<const uint8_t> d = raw_data(info);
  const int64_t rows = info.rows();
  const int64_t len = info.row_length();
  const uint64_t row_bytes = info.row_bytes();
  Tensor out = Tensor::empty(info.shape(), dtype);
  if (dtype == DType::kFloat32) {
    float* o = out.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(info.type, d.data() + static_cast<uint64_t>(r) * row_bytes, o + r * len, len);
    }
  } else {
    uint16_t* o = out.data<uint16_t>();
    std::vector<float> tmp(static_cast<std::size_t>(len));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(info.type, d.data() + static_cast<uint64_t>(r) * row_bytes, tmp.data(), len);
      for (int64_t k = 0; k < len; ++k) o[r * len + k] = float_to_bfloat16_bits(tmp[k]);
    }
  }
  return out;
}

std::string default_model_path() {
  if (const char* p = std::getenv("FLASHINFER_MODEL_PATH"); p != nullptr && *p != '\0') return p;
  std::string cache;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    cache = x;
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    cache = std::string(h) + "/.cache";
  } else {
    cache = ".cache";
  }
  return cache + "/flashinfer-cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace flashinfer::gguf
