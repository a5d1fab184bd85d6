#include "formats/dedup_store.h"

#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/strided.h"
#include "flashinfer/error.h"
#include "formats/reader_limits.h"

namespace flashinfer::formats {

namespace fs = std::filesystem;

std::string dedup_blob_name(const void* data, std::size_t size) {
  const XXH128_hash_t h = XXH3_128bits(data, size);
  char hex[40];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return std::string(hex) + std::string(kDedupBlobSuffix);
}

namespace {

bool valid_blob_name(const std::string& name) {
  if (name.size() != 32 + kDedupBlobSuffix.size() || !name.ends_with(kDedupBlobSuffix)) {
    return false;
  }
  for (std::size_t i = 0; i < 32; ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Shape int_list(const nlohmann::json& j, const std::string& what, const std::string& path) {
  if (!j.is_array() || j.size() > 64) {
    FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", what, path, ": bad ", what);
  }
  Shape out;
  for (const auto& x : j) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", what, path, ": bad ", what);
    }
    out.push_back(x.get<int64_t>());
  }
  return out;
}

}  // namespace

NamedTensors load_dedup_refs(const std::string& refs_path) {
  const std::string text = read_regular_file(refs_path, kMaxMetadataFileBytes, "load_dedup_refs");
  if (json_too_deep(text)) {
    FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", "", refs_path, ": nested too deeply");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", "", refs_path, ": ", e.what());
  }
  if (!j.is_object() || j.value("format", std::string()) != kDedupFormat ||
      !j.contains("tensors") || !j["tensors"].is_array()) {
    FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", "", refs_path,
                    ": not a flashinfer-cpp dedup reference file");
  }
  const fs::path store = fs::path(refs_path).parent_path().parent_path() / kDedupDir;
  NamedTensors out;
  for (const auto& r : j["tensors"]) {
    if (!r.is_object() || !r.contains("key") || !r["key"].is_string() || !r.contains("blob") ||
        !r["blob"].is_string()) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", "", refs_path, ": bad entry");
    }
    const std::string key = r["key"].get<std::string>();
    const std::string blob = r["blob"].get<std::string>();
    if (!valid_blob_name(blob)) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", key, refs_path, ": blob name '", blob,
                      "' is not <32 hex digits>.bin");
    }
    const auto dtype = dtype_from_name(r.value("dtype", std::string()));
    if (!dtype) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", key, refs_path, ": unknown dtype");
    }
    const Shape shape = int_list(r.value("shape", nlohmann::json()), "shape", refs_path);
    const Shape stride = int_list(r.value("stride", nlohmann::json()), "stride", refs_path);
    const int64_t offset = r.value("storage_offset", int64_t{-1});
    if (stride.size() != shape.size() || offset < 0) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", key, refs_path,
                      ": shape, stride and storage_offset disagree");
    }
    const std::string bytes =
        read_regular_file((store / blob).string(), kMaxTensorFileBytes, "load_dedup_refs");
    if (dedup_blob_name(bytes.data(), bytes.size()) != blob) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", key, (store / blob).string(),
                      ": content does not match its hash (corrupt blob)");
    }
    const int64_t esize = static_cast<int64_t>(dtype_size(*dtype));
    if (bytes.size() % static_cast<std::size_t>(esize) != 0) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", key, refs_path,
                      ": blob size is not a whole number of elements");
    }
    const int64_t span = static_cast<int64_t>(bytes.size()) / esize;
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    Tensor buf = Tensor::empty({span}, *dtype);
    if (!bytes.empty()) std::memcpy(buf.data_ptr(), bytes.data(), bytes.size());
    if (numel > 0) {
      const auto [b, e] = detail::covered_span(shape, stride, offset, "load_dedup_refs");
      if (b < 0 || e > span) {
        FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", key, refs_path,
                        ": strides reach outside the blob");
      }
    } else if (offset > span) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "load_dedup_refs", key, refs_path,
                      ": storage_offset outside the blob");
    }
    out.emplace_back(key, buf.as_strided(shape, stride, offset));
  }
  return out;
}

}  // namespace flashinfer::formats
