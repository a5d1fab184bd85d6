// Saving named tensors in the two formats FlashInfer's flight recorder writes: torch.save's zip
// archive (.pt, loadable by torch.load(path, weights_only=True)) and safetensors.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "flashinfer/tensor.h"

namespace flashinfer {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// Writes `tensors` as torch.save would write a dict of them: a zip archive of STORED entries
/// (`<stem>/data.pkl` in pickle protocol 2 using only globals torch's weights-only loader
/// accepts, `<stem>/data/<n>` storages 64-byte aligned, `<stem>/version`, `<stem>/byteorder`).
/// Shapes, strides, storage offsets and dtypes are kept; a non-contiguous view stores only the
/// span of storage it covers. CUDA tensors are copied to the host first. fp8 and packed fp4
/// use torch._utils._rebuild_tensor_v3 with an UntypedStorage, as torch does for new dtypes.
/// Throws flashinfer::Error(kIo) when the file cannot be written.
void save_torch(const std::string& path, const NamedTensors& tensors);

/// Writes `tensors` as a spec-valid safetensors file: 8-byte aligned JSON header, data tiled in
/// the writer order of the reference implementation (descending alignment, then name), each
/// tensor stored contiguous (strides are not part of the format). Packed fp4 is stored as "F4"
/// with the last dimension doubled (logical fp4 elements), as safetensors maps
/// torch.float4_e2m1fn_x2.
void save_safetensors(const std::string& path, const NamedTensors& tensors);

}  // namespace flashinfer

namespace flashinfer {

/// Reads a torch.save zip archive holding a dict of tensors (what save_torch and upstream's
/// recorder write). The file is untrusted: the pickle is interpreted by a small machine that
/// knows only the opcodes and globals describing tensors (torch._utils._rebuild_tensor_v2/_v3,
/// torch storage classes and dtypes, collections.OrderedDict) and executes nothing; every
/// offset and size is bounds-checked. Throws flashinfer::Error(kFormat) naming the file and the
/// problem, or kIo when it cannot be read.
NamedTensors load_torch(const std::string& path);

/// Reads a safetensors file, validated as the specification says (header size, JSON shape,
/// known dtypes, offsets tiling the buffer exactly, no trailing bytes). Tensors come back
/// contiguous, in header order. Throws flashinfer::Error(kFormat) / kIo.
NamedTensors load_safetensors(const std::string& path);

/// The same readers over bytes already in memory (`name` is used in error messages).
NamedTensors load_torch_bytes(const std::string& bytes, const std::string& name = "<memory>");
NamedTensors load_safetensors_bytes(const std::string& bytes, const std::string& name = "<memory>");

}  // namespace flashinfer
