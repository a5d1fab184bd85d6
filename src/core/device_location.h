// Private: where a device is, as one string every process spells alike (a GPU's UUID; the host
// name and "cpu" for the CPU), so that ranks of a group can tell which of them share a GPU, in
// one process or several; and from it the grid limit the collectives' kernels agree on
// (quantized_all_reduce, allreduce_fusion, PcieIpcAllReduceWorkspace.all_reduce).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/comm.h"
#include "flashinfer/device.h"

namespace flashinfer::detail {

std::string device_location(Device device);

/// This rank's record for group_grid_cap: "<SM count> <device_location>" (SM count 0 on the CPU).
std::string grid_record(Device device);

/// The most blocks a rank of the group may launch so that every rank's blocks are resident at
/// once (the kernels wait on their peers' same blocks), from every rank's grid_record: over the
/// ranks, its GPU's SM count divided by the group's ranks on that GPU, the smallest, clamped to
/// [1, cap]. Ranks on GPUs of their own get their whole GPU, ranks sharing one a share of it,
/// and GPUs of different sizes the smallest share. The same records give every rank the same
/// number, which a grid that pairs each block with the peers' same block needs.
int group_grid_cap(const std::vector<std::string>& records, int cap);

/// Collective (every rank of `comm` calls it, after peer buffers that refuse a mix of device
/// kinds): group_grid_cap over the ranks' records; 0 for a group on the CPU, without an
/// allgather.
int agreed_grid_cap(comm::CommBackend& comm, int cap);

}  // namespace flashinfer::detail
