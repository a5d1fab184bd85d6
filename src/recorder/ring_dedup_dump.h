// Private: a ring dump in the dedup layout (FLASHINFER_DUMP_RING=N with FLASHINFER_DUMP_DEDUP=1,
// docs/LOGGING.md "Ring mode" and "Dedup"). Instead of a torch archive per side of a call, the
// call directory gets <stem>.refs.json (formats/dedup_store.h's format, byte for byte what
// record-everything mode writes) and each tensor's bytes go once per dump to
// <dump root>/tensors/<xxh3-128 hex>.bin, so a weight shared by many kept calls is one file.
#pragma once

#include <string_view>
#include <vector>

#include "formats/torch_archive.h"

namespace flashinfer::recorder::internal {

/// Writes one side of a kept call (`stem`: inputs, outputs or mutated) whose archive the ring
/// laid out: <root>/<call_dir>/<stem>.refs.json, and <root>/tensors/<hash>.bin for
/// each of its tensors not yet written in this dump (the file system says which: a blob is
/// created with O_EXCL, so each distinct content is written once whatever the number of kept
/// calls holding it). Hashes are computed here, once per blob and dump (a table allocated
/// with the program remembers them by address). Async-signal-safe: mkdir(2), open(2),
/// write(2), close(2), unlink(2) and arithmetic on fixed buffers only; the crash handler calls
/// it. `root` is the dump directory (NUL-terminated). False when a file could not be written.
/// `items` are the side's tensors and `data[i]` item i's bytes (a layout shared by calls and the
/// call's own pieces, recorder/ring.cpp).
bool write_ring_dedup_side(const char* root, std::string_view call_dir, std::string_view stem,
                           const std::vector<formats::TorchItem>& items,
                           const formats::ArchivePlan::Piece* data) noexcept;

}  // namespace flashinfer::recorder::internal
