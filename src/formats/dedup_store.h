// Private: the flight recorder's content-addressed tensor store (FLASHINFER_DUMP_DEDUP=1,
// docs/LOGGING.md "Dedup"), this library's extension of upstream's dump layout. Each distinct
// tensor content (the span of storage a tensor covers) is one file
// <DUMP_DIR>/tensors/<xxh3-128 hex>.bin, written once; a call directory holds
// <stem>.refs.json (inputs/outputs/mutated) naming, per tensor key, the blob and the tensor's
// dtype, shape, stride and storage offset within it. `flashinfer export` expands a dedup dump
// into upstream's layout (inputs.pt ...).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "flashinfer/tensor_io.h"

namespace flashinfer::formats {

inline constexpr std::string_view kDedupDir = "tensors";            // <DUMP_DIR>/tensors/
inline constexpr std::string_view kDedupRefsSuffix = ".refs.json";  // <call dir>/inputs.refs.json
inline constexpr std::string_view kDedupBlobSuffix = ".bin";
inline constexpr std::string_view kDedupFormat = "flashinfer-cpp-dedup-1";

/// The blob name of `size` bytes at `data`: 32 lowercase hex digits of XXH3-128, then ".bin".
std::string dedup_blob_name(const void* data, std::size_t size);

/// Reads <call dir>/<stem>.refs.json and the blobs it names (from <call dir>/../tensors/).
/// Untrusted input: blob names must be <32 hex>.bin, files regular and bounded, sizes and
/// hashes must match, strides must stay within the blob. Throws flashinfer::Error (kFormat /
/// kIo) naming the file.
NamedTensors load_dedup_refs(const std::string& refs_path);

}  // namespace flashinfer::formats
