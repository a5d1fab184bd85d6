// Private: torch.save archives laid out ahead of writing. save_torch writes one at once; the
// flight recorder's ring mode lays a call's archives out when the call is kept (the small
// header bytes owned here, tensor bytes referenced where they live) so that a dump, even from a
// crash handler, is only open(2)/write(2)/close(2) plus CRC-32 arithmetic.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/dtype.h"
#include "flashinfer/tensor.h"
#include "flashinfer/tensor_io.h"

namespace flashinfer::formats {

/// One tensor of a torch archive: its metadata and the span of storage it covers.
struct TorchItem {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // storage offset, in elements, from the start of the stored span
  int64_t span = 0;    // elements of the stored span
};

/// The item of host tensor `t` named `name` (its covered span, offsets rebased to it) and, in
/// `*data` when given, the span's first byte (nullptr when it covers none).
TorchItem torch_item(const std::string& name, const Tensor& t, const void** data = nullptr);

/// The archive's data.pkl: a dict {name: tensor} in pickle protocol 2 with only the globals
/// torch.load(weights_only=True) accepts; item i's storage is record "data/<i>".
std::string torch_data_pkl(const std::vector<TorchItem>& items);

/// save_torch with the archive's stem given (save_torch takes it from the file name): the
/// recorder writes "outputs" archives under a temporary name.
void save_torch_stem(const std::string& path, std::string_view stem, const NamedTensors& tensors);

/// An archive as the bytes to write, in order.
/// Bytes [at, at + size) of a piece taken from `bytes` instead of its base: the ring's delta
/// of a KV cache (its base copy plus what the library wrote into it since, recorder/ring.cpp).
struct Patch {
  uint64_t at = 0, size = 0;
  const uint8_t* bytes = nullptr;
};

struct ArchivePlan {
  struct Piece {
    const void* data = nullptr;  // external bytes (a tensor's span); nullptr: `header` bytes
    uint64_t at = 0;             // offset in `header` when data == nullptr
    uint64_t size = 0;
    // External bytes only: ranges laid over `data` (sorted by `at`, disjoint, inside `size`).
    const Patch* patches = nullptr;
    std::size_t n_patches = 0;
  };
  // Entries whose CRC is computed when written: their data piece and the CRC fields in
  // `header` of their local header and central directory record.
  struct CrcSlot {
    std::size_t piece = 0;
    std::size_t local_at = 0;
    std::size_t central_at = 0;
  };
  std::vector<uint8_t> header;
  std::vector<Piece> pieces;
  std::vector<CrcSlot> crc_slots;
  uint64_t size = 0;  // bytes of the archive
  // The tensors' metadata (item i's bytes are pieces[crc_slots[i].piece]), shared by the
  // copies of a plan: a ring dump in the dedup layout writes them as <stem>.refs.json.
  std::shared_ptr<const std::vector<TorchItem>> items;
};

/// Calls f(bytes, n) for an external piece's bytes in order: its base with its patches laid
/// over (one call when it has none). Stops early when f returns false; returns false then.
template <typename F>
bool for_each_run(const ArchivePlan::Piece& p, F&& f) noexcept {
  const auto* base = static_cast<const uint8_t*>(p.data);
  uint64_t at = 0;
  for (std::size_t i = 0; i < p.n_patches; ++i) {
    const Patch& q = p.patches[i];
    if (q.at > at && !f(base + at, q.at - at)) return false;
    if (q.size && !f(q.bytes, q.size)) return false;
    at = q.at + q.size;
  }
  return at >= p.size || f(base + at, p.size - at);
}

/// Lays out the archive "<stem>/data.pkl", "<stem>/byteorder", "<stem>/data/<i>",
/// "<stem>/version" exactly as save_torch writes it; data[i] holds items[i]'s span
/// (span * element size bytes) and must live until the plan is written.
ArchivePlan plan_torch_archive(std::string_view stem, const std::vector<TorchItem>& items,
                               const std::vector<const void*>& data);

/// Fills the pending CRCs into the plan's header bytes and writes the archive to `fd` with
/// write(2) only: async-signal-safe (no allocation, no locks). False when a write failed.
bool write_archive_plan(int fd, ArchivePlan& plan) noexcept;

/// Writes the archive `layout` lays out with item i's bytes taken from `data[i]` (a piece with
/// its own pointer, size and patches; the layout's data pointers are not read), computing the
/// CRCs on the way and writing them in place of the layout's CRC fields: the layout is only
/// read, so one layout serves every ring call with the same tensor metadata. Async-signal-safe
/// (no allocation, no locks); the bytes are write_archive_plan's for the same plan and data.
bool write_archive_layout(int fd, const ArchivePlan& layout,
                          const ArchivePlan::Piece* data) noexcept;

/// The same, for the recorder: each entry's CRC and its bytes in the file come from one copy of
/// the tensor's bytes, so a tensor another thread writes into while it is saved gives a valid
/// archive (of some mix of the old and new bytes). An archive of up to 4 MiB is copied whole and
/// is one write(2) (record-everything mode writes two per call on its critical path); a larger
/// one goes through a 1 MiB buffer with pwrite(2) at the file's offset (copied whole when the file
/// is O_APPEND). Not async-signal-safe (it allocates).
bool write_archive_copied(int fd, ArchivePlan& plan) noexcept;

}  // namespace flashinfer::formats
