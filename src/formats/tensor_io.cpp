// save_torch / save_safetensors (include/flashinfer/tensor_io.h).
#include "flashinfer/tensor_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "flashinfer/error.h"
#include "formats/torch_archive.h"

namespace flashinfer {
namespace {

std::string stem_of(const std::string& path) {
  std::string stem = std::filesystem::path(path).stem().string();
  return stem.empty() ? "archive" : stem;
}

}  // namespace

void save_torch(const std::string& path, const NamedTensors& tensors) {
  formats::save_torch_stem(path, stem_of(path), tensors);
}

}  // namespace flashinfer

namespace flashinfer::formats {

void save_torch_stem(const std::string& path, std::string_view stem_view,
                     const NamedTensors& tensors) {
  std::vector<formats::TorchItem> items;
  std::vector<Tensor> host;  // keeps host copies of device tensors alive while writing
  std::vector<const void*> data;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].first;
    const Tensor& t0 = tensors[i].second;
    FLASHINFER_CHECK(t0.defined(), "save_torch", name, "undefined tensor");
    const Tensor& t = t0.device().is_cpu() ? t0 : host.emplace_back(t0.to(Device::cpu()));
    items.push_back(formats::torch_item(name, t, &data.emplace_back()));
  }
  formats::ArchivePlan plan = formats::plan_torch_archive(stem_view, items, data);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, "save_torch", "path", "cannot create '", path,
                    "': ", std::strerror(errno));
  }
  // Each entry's CRC and its bytes in the file come from one copy: a tensor another thread
  // writes meanwhile (the flight recorder's first calls record a workspace a peer rank writes
  // into) still gives an archive load_torch accepts. CRC-then-write from the tensor did not.
  const bool ok = formats::write_archive_copied(fd, plan);
  const int err = errno;
  if (::close(fd) != 0 || !ok) {
    FLASHINFER_FAIL(ErrorCode::kIo, "save_torch", "path", "writing '", path,
                    "' failed: ", std::strerror(ok ? errno : err));
  }
}

}  // namespace flashinfer::formats

namespace flashinfer {

void save_safetensors(const std::string& path, const NamedTensors& tensors) {
  struct Item {
    std::string name;
    Tensor data;  // contiguous, on the host
    std::size_t align;
  };
  std::vector<Item> items;
  for (const auto& [name, t0] : tensors) {
    FLASHINFER_CHECK(t0.defined(), "save_safetensors", name, "undefined tensor");
    Tensor t = t0.device().is_cpu() ? t0 : t0.to(Device::cpu());
    items.push_back({name, t.contiguous(), t.element_size()});
  }
  // Reference writer order: larger alignment first, then by name.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.align != b.align ? a.align > b.align : a.name < b.name;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const Item& it : items) {
    FLASHINFER_CHECK(!header.contains(it.name), "save_safetensors", it.name, "duplicate name");
    Shape shape = it.data.shape();
    std::string dtype(dtype_safetensors_name(it.data.dtype()));
    if (it.data.dtype() == DType::kFloat4E2M1FNx2) {
      dtype = "F4";
      if (shape.empty()) shape.push_back(1);
      shape.back() *= 2;
    }
    const uint64_t n = it.data.nbytes();
    header[it.name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    FLASHINFER_FAIL(ErrorCode::kIo, "save_safetensors", "path", "cannot create '", path,
                    "': ", std::strerror(errno));
  }
  bool ok = true;
  uint8_t len[8];
  const uint64_t hn = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(hn >> (8 * i));
  ok = ok && std::fwrite(len, 1, 8, f) == 8;
  ok = ok && std::fwrite(h.data(), 1, h.size(), f) == h.size();
  for (const Item& it : items) {
    const std::size_t n = it.data.nbytes();
    ok = ok && (n == 0 || std::fwrite(it.data.data_ptr(), 1, n, f) == n);
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    FLASHINFER_FAIL(ErrorCode::kIo, "save_safetensors", "path", "writing '", path,
                    "' failed: ", std::strerror(errno));
  }
}

}  // namespace flashinfer
