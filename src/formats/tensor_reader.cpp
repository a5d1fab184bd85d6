// load_torch / load_safetensors (include/flashinfer/tensor_io.h): readers for untrusted files.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <variant>

#include "flashinfer/error.h"
#include "flashinfer/tensor_io.h"
#include "formats/reader_limits.h"
#include "formats/zip_reader.h"

namespace flashinfer {
namespace {

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  FLASHINFER_FAIL(ErrorCode::kFormat, "load", "", "'", file, "': ", what);
}

std::string read_all(const std::string& path, const char* op) {
  return formats::read_regular_file(path, formats::kMaxTensorFileBytes, op);
}

// ---- the restricted pickle machine
// ---------------------------------------------------------------

struct PObj;
using PRef = std::shared_ptr<PObj>;

struct Global {
  std::string module, name;
};
struct Mark {};
struct StorageRef {
  std::string cls;  // "HalfStorage", "UntypedStorage", ...
  std::string key;
  int64_t numel;
};
struct PList {
  std::vector<PRef> items;
  bool tuple;
};
struct PDict {
  std::vector<std::pair<PRef, PRef>> items;
};

struct PObj {
  std::variant<std::monostate, bool, int64_t, double, std::string, Global, Mark, StorageRef, PList,
               PDict, Tensor>
      v;
  int depth = 1;  // nesting depth of containers, checked against kMaxPickleDepth

  PObj() = default;
  PObj(const PObj&) = delete;
  PObj& operator=(const PObj&) = delete;
  // Iterative: a chain of millions of nested tuples must not recurse once per level. Children
  // this object alone owns are emptied into a worklist before they die.
  ~PObj() {
    std::vector<PRef> work;
    take_children(work);
    while (!work.empty()) {
      PRef r = std::move(work.back());
      work.pop_back();
      if (r && r.use_count() == 1) r->take_children(work);
    }
  }
  void take_children(std::vector<PRef>& work) {
    if (auto* l = std::get_if<PList>(&v)) {
      for (PRef& x : l->items) work.push_back(std::move(x));
      l->items.clear();
    } else if (auto* d = std::get_if<PDict>(&v)) {
      for (auto& [k, x] : d->items) {
        work.push_back(std::move(k));
        work.push_back(std::move(x));
      }
      d->items.clear();
    }
  }
};

template <class T>
PRef make(T x) {
  auto p = std::make_shared<PObj>();
  p->v = std::move(x);
  return p;
}

std::optional<DType> legacy_storage_dtype(const std::string& cls) {
  static const std::map<std::string, DType> m = {
      {"FloatStorage", DType::kFloat32}, {"DoubleStorage", DType::kFloat64},
      {"HalfStorage", DType::kFloat16},  {"BFloat16Storage", DType::kBFloat16},
      {"LongStorage", DType::kInt64},    {"IntStorage", DType::kInt32},
      {"ShortStorage", DType::kInt16},   {"CharStorage", DType::kInt8},
      {"ByteStorage", DType::kUInt8},    {"BoolStorage", DType::kBool},
      {"UntypedStorage", DType::kUInt8}};
  auto it = m.find(cls);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

class Unpickler {
 public:
  Unpickler(std::string_view pkl, const formats::ZipReader& zip, std::string prefix,
            std::string file)
      : p_(pkl), zip_(zip), prefix_(std::move(prefix)), file_(std::move(file)) {}

  PRef run();

 private:
  [[noreturn]] void fail(const std::string& what) const {
    bad(file_, "data.pkl at byte " + std::to_string(pos_) + ": " + what);
  }
  uint8_t byte() {
    if (pos_ >= p_.size()) fail("unexpected end of pickle");
    return static_cast<uint8_t>(p_[pos_++]);
  }
  uint64_t le(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(byte()) << (8 * i);
    return v;
  }
  std::string_view take(uint64_t n) {
    if (n > p_.size() - pos_) fail("string runs past the end of the pickle");
    auto s = p_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string line() {
    const auto nl = p_.find('\n', pos_);
    if (nl == std::string_view::npos) fail("unterminated GLOBAL");
    std::string s(p_.substr(pos_, nl - pos_));
    pos_ = nl + 1;
    return s;
  }
  PRef pop() {
    if (stack_.empty()) fail("stack underflow");
    PRef r = stack_.back();
    stack_.pop_back();
    return r;
  }
  std::vector<PRef> pop_to_mark() {
    std::size_t m = stack_.size();
    while (m > 0 && !std::holds_alternative<Mark>(stack_[m - 1]->v)) --m;
    if (m == 0) fail("MARK not found");
    std::vector<PRef> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m - 1);
    return items;
  }
  int64_t as_int(const PRef& r, const char* what) const {
    if (auto* v = std::get_if<int64_t>(&r->v)) return *v;
    fail(std::string(what) + " is not an integer");
  }
  Shape as_ints(const PRef& r, const char* what) const {
    auto* l = std::get_if<PList>(&r->v);
    if (!l) fail(std::string(what) + " is not a tuple");
    Shape out;
    for (const PRef& x : l->items) out.push_back(as_int(x, what));
    return out;
  }
  // A container holding `items`, its depth checked against kMaxPickleDepth.
  PRef container(PList l) {
    int depth = 1;
    for (const PRef& x : l.items) depth = std::max(depth, x->depth + 1);
    check_depth(depth);
    PRef r = make(std::move(l));
    r->depth = depth;
    return r;
  }
  // `parent` gains the child `x` (APPEND, SETITEM).
  void grow(PObj& parent, const PRef& x) {
    parent.depth = std::max(parent.depth, x->depth + 1);
    check_depth(parent.depth);
  }
  void check_depth(int depth) const {
    if (depth > formats::kMaxPickleDepth) {
      fail("containers nested more than " + std::to_string(formats::kMaxPickleDepth) +
           " deep (kMaxPickleDepth)");
    }
  }
  PRef reduce(const PRef& callable, const PRef& args);
  PRef rebuild_tensor(const std::vector<PRef>& a, bool v3);
  std::shared_ptr<Storage> storage_for(const StorageRef& s, std::size_t nbytes);

  std::string_view p_;
  std::size_t pos_ = 0;
  const formats::ZipReader& zip_;
  std::string prefix_, file_;
  std::vector<PRef> stack_;
  std::map<uint64_t, PRef> memo_;
  std::map<std::string, std::shared_ptr<Storage>> storages_;
};

std::shared_ptr<Storage> Unpickler::storage_for(const StorageRef& s, std::size_t nbytes) {
  auto it = storages_.find(s.key);
  if (it != storages_.end()) return it->second;
  const auto* e = zip_.find(prefix_ + "/data/" + s.key);
  if (!e) fail("storage record 'data/" + s.key + "' is missing");
  if (e->size < nbytes) fail("storage record 'data/" + s.key + "' is shorter than declared");
  std::string_view d = zip_.data(*e);
  auto st = Storage::allocate(d.size(), Device::cpu());
  if (!d.empty()) std::memcpy(st->data(), d.data(), d.size());
  storages_[s.key] = st;
  return st;
}

PRef Unpickler::rebuild_tensor(const std::vector<PRef>& a, bool v3) {
  // _v2: (storage, offset, size, stride, requires_grad, hooks[, metadata])
  // _v3: (storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])
  if (a.size() < (v3 ? 7u : 6u)) fail("too few arguments to _rebuild_tensor");
  auto* sref = std::get_if<StorageRef>(&a[0]->v);
  if (!sref) fail("_rebuild_tensor's first argument is not a storage");
  const int64_t offset = as_int(a[1], "storage offset");
  Shape size = as_ints(a[2], "size"), stride = as_ints(a[3], "stride");
  if (size.size() != stride.size()) fail("size and stride differ in length");
  if (size.size() > 64) fail("too many dimensions");
  std::optional<DType> dtype = legacy_storage_dtype(sref->cls);
  if (!dtype) fail("unknown storage class torch." + sref->cls);
  if (v3) {
    auto* g = std::get_if<Global>(&a[6]->v);
    if (!g || g->module != "torch") fail("_rebuild_tensor_v3's dtype is not a torch dtype");
    dtype = dtype_from_name("torch." + g->name);
    // torch.uint16 / uint32 / uint64 have no DType here: their bits load as the signed type of
    // their width (xqa's speculative-decoding masks; multi-item scoring's positions and prefix
    // lengths; grouped_gemm_nt_masked's signals), which the ops that take them read as unsigned.
    if (!dtype && g->name == "uint16") dtype = DType::kInt16;
    if (!dtype && g->name == "uint32") dtype = DType::kInt32;
    if (!dtype && g->name == "uint64") dtype = DType::kInt64;
    if (!dtype) fail("unsupported dtype torch." + g->name);
  } else if (sref->cls == "UntypedStorage") {
    fail("_rebuild_tensor_v2 with an UntypedStorage");
  }
  const std::size_t storage_elem = sref->cls == "UntypedStorage" ? 1 : dtype_size(*dtype);
  if (sref->numel < 0 || static_cast<uint64_t>(sref->numel) > (1ull << 50)) {
    fail("implausible storage size");
  }
  auto st = storage_for(*sref, static_cast<std::size_t>(sref->numel) * storage_elem);
  try {
    return make(Tensor::from_storage(st, size, stride, offset, *dtype));
  } catch (const Error& e) {
    fail(std::string("tensor view does not fit its storage: ") + e.detail());
  }
}

PRef Unpickler::reduce(const PRef& callable, const PRef& args) {
  auto* g = std::get_if<Global>(&callable->v);
  auto* l = std::get_if<PList>(&args->v);
  if (!g || !l) fail("REDUCE on something that is not an allowed global");
  if (g->module == "torch._utils" && g->name == "_rebuild_tensor_v2") {
    return rebuild_tensor(l->items, false);
  }
  if (g->module == "torch._utils" && g->name == "_rebuild_tensor_v3") {
    return rebuild_tensor(l->items, true);
  }
  if (g->module == "collections" && g->name == "OrderedDict") {
    if (!l->items.empty()) fail("OrderedDict with arguments");
    return make(PDict{});
  }
  fail("global " + g->module + "." + g->name + " is not allowed");
}

PRef Unpickler::run() {
  while (true) {
    const uint8_t op = byte();
    switch (op) {
      case 0x80:  // PROTO
        if (byte() > 5) fail("unsupported pickle protocol");
        break;
      case 0x95:  // FRAME (protocol 4): the length is advisory
        le(8);
        break;
      case '(':
        stack_.push_back(make(Mark{}));
        break;
      case '}':
        stack_.push_back(make(PDict{}));
        break;
      case ']':
        stack_.push_back(make(PList{{}, false}));
        break;
      case ')':
        stack_.push_back(make(PList{{}, true}));
        break;
      case 't':
        stack_.push_back(container(PList{pop_to_mark(), true}));
        break;
      case 'l':
        stack_.push_back(container(PList{pop_to_mark(), false}));
        break;
      case 0x85:
      case 0x86:
      case 0x87: {
        const int n = op - 0x84;
        if (stack_.size() < static_cast<std::size_t>(n)) fail("stack underflow");
        std::vector<PRef> items(stack_.end() - n, stack_.end());
        stack_.resize(stack_.size() - n);
        stack_.push_back(container(PList{std::move(items), true}));
        break;
      }
      case 'N':
        stack_.push_back(make(std::monostate{}));
        break;
      case 0x88:
        stack_.push_back(make(true));
        break;
      case 0x89:
        stack_.push_back(make(false));
        break;
      case 'K':
        stack_.push_back(make(static_cast<int64_t>(le(1))));
        break;
      case 'M':
        stack_.push_back(make(static_cast<int64_t>(le(2))));
        break;
      case 'J':
        stack_.push_back(make(static_cast<int64_t>(static_cast<int32_t>(le(4)))));
        break;
      case 0x8a: {  // LONG1
        const uint8_t n = byte();
        if (n > 8) fail("integer wider than 64 bits");
        uint64_t v = le(n);
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~0ull << (8 * n);  // sign-extend
        stack_.push_back(make(static_cast<int64_t>(v)));
        break;
      }
      case 'G': {  // BINFLOAT, big-endian
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | byte();
        double d;
        std::memcpy(&d, &bits, 8);
        stack_.push_back(make(d));
        break;
      }
      case 'X':  // BINUNICODE
        stack_.push_back(make(std::string(take(le(4)))));
        break;
      case 0x8c:  // SHORT_BINUNICODE (protocol 4)
        stack_.push_back(make(std::string(take(le(1)))));
        break;
      case 'c': {  // GLOBAL
        std::string m = line();
        std::string n = line();
        stack_.push_back(make(Global{std::move(m), std::move(n)}));
        break;
      }
      case 0x93: {  // STACK_GLOBAL (protocol 4)
        PRef n = pop(), m = pop();
        auto* ms = std::get_if<std::string>(&m->v);
        auto* ns = std::get_if<std::string>(&n->v);
        if (!ms || !ns) fail("STACK_GLOBAL needs two strings");
        stack_.push_back(make(Global{*ms, *ns}));
        break;
      }
      case 'Q': {  // BINPERSID: ('storage', <class>, key, location, numel)
        PRef pid = pop();
        auto* l = std::get_if<PList>(&pid->v);
        if (!l || l->items.size() != 5) fail("persistent id is not a 5-tuple");
        auto* tag = std::get_if<std::string>(&l->items[0]->v);
        auto* cls = std::get_if<Global>(&l->items[1]->v);
        auto* key = std::get_if<std::string>(&l->items[2]->v);
        if (!tag || *tag != "storage" || !cls || cls->module != "torch" || !key) {
          fail("persistent id is not a torch storage");
        }
        if (key->find('/') != std::string::npos || key->find("..") != std::string::npos) {
          fail("storage key with a path in it");
        }
        stack_.push_back(make(StorageRef{cls->name, *key, as_int(l->items[4], "storage size")}));
        break;
      }
      case 'R': {
        PRef args = pop(), callable = pop();
        stack_.push_back(reduce(callable, args));
        break;
      }
      case 's': {  // SETITEM
        PRef v = pop(), k = pop();
        if (stack_.empty()) fail("stack underflow");
        auto* d = std::get_if<PDict>(&stack_.back()->v);
        if (!d) fail("SETITEM on a non-dict");
        grow(*stack_.back(), k);
        grow(*stack_.back(), v);
        d->items.emplace_back(k, v);
        break;
      }
      case 'u': {  // SETITEMS
        std::vector<PRef> kv = pop_to_mark();
        if (kv.size() % 2) fail("odd number of items for SETITEMS");
        if (stack_.empty()) fail("stack underflow");
        auto* d = std::get_if<PDict>(&stack_.back()->v);
        if (!d) fail("SETITEMS on a non-dict");
        for (std::size_t i = 0; i < kv.size(); i += 2) {
          grow(*stack_.back(), kv[i]);
          grow(*stack_.back(), kv[i + 1]);
          d->items.emplace_back(kv[i], kv[i + 1]);
        }
        break;
      }
      case 'a': {  // APPEND
        PRef v = pop();
        if (stack_.empty()) fail("stack underflow");
        auto* l = std::get_if<PList>(&stack_.back()->v);
        if (!l || l->tuple) fail("APPEND on a non-list");
        grow(*stack_.back(), v);
        l->items.push_back(v);
        break;
      }
      case 'e': {  // APPENDS
        std::vector<PRef> items = pop_to_mark();
        if (stack_.empty()) fail("stack underflow");
        auto* l = std::get_if<PList>(&stack_.back()->v);
        if (!l || l->tuple) fail("APPENDS on a non-list");
        for (const PRef& x : items) grow(*stack_.back(), x);
        l->items.insert(l->items.end(), items.begin(), items.end());
        break;
      }
      case 'q':  // BINPUT
        if (stack_.empty()) fail("stack underflow");
        memo_[le(1)] = stack_.back();
        break;
      case 'r':  // LONG_BINPUT
        if (stack_.empty()) fail("stack underflow");
        memo_[le(4)] = stack_.back();
        break;
      case 0x94:  // MEMOIZE
        if (stack_.empty()) fail("stack underflow");
        memo_[memo_.size()] = stack_.back();
        break;
      case 'h':
      case 'j': {  // BINGET / LONG_BINGET
        const uint64_t k = le(op == 'h' ? 1 : 4);
        auto it = memo_.find(k);
        if (it == memo_.end()) fail("memo key " + std::to_string(k) + " not found");
        stack_.push_back(it->second);
        break;
      }
      case '.':  // STOP
        if (stack_.size() != 1)
          fail("STOP with " + std::to_string(stack_.size()) + " items on the stack");
        return stack_.back();
      default: {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02x", op);
        fail(std::string("opcode ") + hex + " is not allowed");
      }
    }
    if (stack_.size() > (1u << 20)) fail("pickle stack too deep");
  }
}

}  // namespace

NamedTensors load_torch_bytes(const std::string& bytes, const std::string& name) {
  formats::ZipReader zip(bytes, name);
  if (zip.entries().empty()) bad(name, "empty archive");
  // Records live under one folder: whatever precedes the first '/' of the first entry.
  const std::string& first = zip.entries().front().name;
  const auto slash = first.find('/');
  if (slash == std::string::npos) bad(name, "entries are not inside a folder");
  const std::string prefix = first.substr(0, slash);
  const auto* pkl = zip.find(prefix + "/data.pkl");
  if (!pkl) bad(name, "no data.pkl record");
  if (const auto* bo = zip.find(prefix + "/byteorder"); bo && zip.data(*bo) != "little") {
    bad(name, "big-endian archives are not supported");
  }
  Unpickler up(zip.data(*pkl), zip, prefix, name);
  PRef root = up.run();
  auto* d = std::get_if<PDict>(&root->v);
  if (!d) bad(name, "the archive does not hold a dict");
  NamedTensors out;
  for (const auto& [k, v] : d->items) {
    auto* ks = std::get_if<std::string>(&k->v);
    auto* t = std::get_if<Tensor>(&v->v);
    if (!ks || !t) bad(name, "the dict holds something other than str -> Tensor");
    out.emplace_back(*ks, *t);
  }
  return out;
}

NamedTensors load_torch(const std::string& path) {
  return load_torch_bytes(read_all(path, "load_torch"), path);
}

NamedTensors load_safetensors_bytes(const std::string& bytes, const std::string& name) {
  if (bytes.size() < 8) bad(name, "shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  if (n > 100'000'000) bad(name, "header larger than 100 MB");
  if (n > bytes.size() - 8) bad(name, "header runs past the end of the file");
  if (n == 0 || bytes[8] != '{') bad(name, "header does not start with '{'");
  if (formats::json_too_deep(std::string_view(bytes).substr(8, n))) {
    bad(name, "header nests more than " + std::to_string(formats::kMaxJsonDepth) +
                  " deep (kMaxJsonDepth)");
  }
  nlohmann::ordered_json h;
  try {
    h = nlohmann::ordered_json::parse(bytes.begin() + 8,
                                      bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const std::exception& e) {
    bad(name, std::string("header is not valid JSON: ") + e.what());
  }
  if (!h.is_object()) bad(name, "header is not a JSON object");
  const uint64_t buffer = bytes.size() - 8 - n;
  struct Item {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Item> items;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) bad(name, "__metadata__ is not an object");
      for (const auto& [k, v] : it.value().items()) {
        if (!v.is_string()) bad(name, "__metadata__ value for '" + k + "' is not a string");
      }
      continue;
    }
    const auto& e = it.value();
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets")) {
      bad(name, "entry '" + it.key() + "' lacks dtype, shape or data_offsets");
    }
    if (!e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      bad(name, "entry '" + it.key() + "' is malformed");
    }
    const std::string ds = e["dtype"];
    Item item{it.key(), DType::kUInt8, {}, 0, 0};
    bool fp4 = false;
    if (ds == "F4") {
      item.dtype = DType::kFloat4E2M1FNx2;
      fp4 = true;
    } else if (ds == "F8_E4M3") {
      item.dtype = DType::kFloat8E4M3FN;
    } else {
      bool found = false;
      for (int i = 0; i < kNumDTypes && !found; ++i) {
        const auto d = static_cast<DType>(i);
        if (d != DType::kFloat4E2M1FNx2 && dtype_safetensors_name(d) == ds) {
          item.dtype = d;
          found = true;
        }
      }
      if (!found) bad(name, "entry '" + it.key() + "' has unsupported dtype " + ds);
    }
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) bad(name, "entry '" + it.key() + "' has a bad shape");
      const uint64_t v = d.get<uint64_t>();
      if (v > (1ull << 40) || (v != 0 && numel > (1ull << 50) / v)) {
        bad(name, "entry '" + it.key() + "' is implausibly large");
      }
      numel *= v;
      item.shape.push_back(static_cast<int64_t>(v));
    }
    for (const auto& o : e["data_offsets"]) {
      if (!o.is_number_unsigned()) bad(name, "entry '" + it.key() + "' has bad data_offsets");
    }
    item.begin = e["data_offsets"][0].get<uint64_t>();
    item.end = e["data_offsets"][1].get<uint64_t>();
    if (item.end < item.begin || item.end > buffer) {
      bad(name, "entry '" + it.key() + "' data_offsets out of range");
    }
    uint64_t nbytes;
    if (fp4) {
      if (item.shape.empty() || item.shape.back() % 2) {
        bad(name, "F4 entry '" + it.key() + "' needs an even last dimension");
      }
      item.shape.back() /= 2;
      nbytes = numel / 2;
    } else {
      nbytes = numel * dtype_size(item.dtype);
    }
    if (item.end - item.begin != nbytes) {
      bad(name, "entry '" + it.key() + "' byte range does not match its shape and dtype");
    }
    items.push_back(std::move(item));
  }
  // The ranges must tile the buffer exactly, with no gap, overlap or trailing byte.
  std::vector<const Item*> sorted;
  for (const Item& i : items) sorted.push_back(&i);
  std::sort(sorted.begin(), sorted.end(), [](const Item* a, const Item* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  for (const Item* i : sorted) {
    if (i->begin != at) bad(name, "data of '" + i->name + "' leaves a gap or overlaps");
    at = i->end;
  }
  if (at != buffer) bad(name, "trailing bytes after the last tensor");
  NamedTensors out;
  const char* data = bytes.data() + 8 + n;
  for (const Item& i : items) {
    Tensor t = Tensor::empty(i.shape, i.dtype);
    if (i.end > i.begin) std::memcpy(t.data_ptr(), data + i.begin, i.end - i.begin);
    out.emplace_back(i.name, t);
  }
  return out;
}

NamedTensors load_safetensors(const std::string& path) {
  return load_safetensors_bytes(read_all(path, "load_safetensors"), path);
}

}  // namespace flashinfer
