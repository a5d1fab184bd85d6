#include "core/peer_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/process_identity.h"
#include "flashinfer/error.h"
#include "flashinfer/stream.h"

namespace flashinfer::detail {
namespace {

// What a rank tells the others about its allocation.
struct Record {
  ProcessIdentity process;  // not the pid alone: containers' processes may share pids
  int32_t device_type = 0;
  int32_t device_index = 0;
  uint64_t address = 0;
  uint64_t bytes = 0;
  unsigned char cuda_handle[64] = {};
  char shm_name[96] = {};
};

std::string shm_name_for(int64_t rank) {
  static std::atomic<uint64_t> counter{0};
  return "/flashinfer_peer_" + process_tag() + "_" + std::to_string(rank) + "_" +
         std::to_string(counter.fetch_add(1));
}

void* map_shm(const char* name, std::size_t bytes, bool create, const char* op) {
  const int fd =
      create ? ::shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : ::shm_open(name, O_RDWR, 0600);
  if (fd < 0) {
    FLASHINFER_FAIL(ErrorCode::kIo, op, "", "shm_open(", name, ") failed: ", std::strerror(errno));
  }
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    ::shm_unlink(name);
    FLASHINFER_FAIL(ErrorCode::kIo, op, "", "ftruncate of shared memory ", name,
                    " failed: ", std::strerror(e));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    if (create) ::shm_unlink(name);
    FLASHINFER_FAIL(ErrorCode::kIo, op, "", "mmap of shared memory ", name,
                    " failed: ", std::strerror(errno));
  }
  return p;
}

}  // namespace

PeerMemory::PeerMemory(comm::CommBackend& comm, std::size_t bytes, const char* op)
    : device_(comm.device()), bytes_(bytes == 0 ? 1 : bytes), rank_(comm.Get_rank()) {
  const int64_t n = comm.Get_size();
  FLASHINFER_CHECK(n >= 1 && rank_ >= 0 && rank_ < n, op, "comm_backend", "rank ", rank_,
                   " of a group of ", n);
  Record mine;
  mine.process = this_process();
  mine.device_type = static_cast<int32_t>(device_.type);
  mine.device_index = device_.index;
  mine.bytes = bytes_;
  std::string shm;
  if (device_.is_cuda()) {
    local_ = cuda_ipc_malloc(bytes_, device_.index, mine.cuda_handle);
  } else {
    // Host memory: POSIX shared memory only where a peer is in another process (a container's
    // /dev/shm is small, and a mapping past its size faults on first touch); plain zeroed memory
    // where every rank shares this process.
    const ProcessIdentity me = this_process();
    const std::vector<std::string> procs =
        comm.allgather(std::string_view(reinterpret_cast<const char*>(&me), sizeof(me)));
    bool alone = true;
    for (const std::string& b : procs) {
      ProcessIdentity q;
      std::memcpy(&q, b.data(), std::min(b.size(), sizeof(q)));
      alone = alone && b.size() == sizeof(q) && q == me;
    }
    if (alone) {
      local_ = std::calloc(bytes_, 1);
      if (!local_) {
        FLASHINFER_FAIL(ErrorCode::kInternal, op, "", "out of memory for ", bytes_,
                        " bytes of peer buffer");
      }
      heap_ = true;
    } else {
      // Zero-filled by ftruncate. Unlinked once every rank has mapped it (below).
      shm = shm_name_for(rank_);
      local_ = map_shm(shm.c_str(), bytes_, true, op);
      std::strncpy(mine.shm_name, shm.c_str(), sizeof(mine.shm_name) - 1);
    }
  }
  mine.address = reinterpret_cast<uintptr_t>(local_);
  peers_.assign(static_cast<std::size_t>(n), nullptr);
  mapped_.assign(static_cast<std::size_t>(n), false);
  try {
    const std::vector<std::string> all =
        comm.allgather(std::string_view(reinterpret_cast<const char*>(&mine), sizeof(mine)));
    FLASHINFER_CHECK(static_cast<int64_t>(all.size()) == n, op, "comm_backend",
                     "allgather returned ", all.size(), " records for a group of ", n);
    for (int64_t r = 0; r < n; ++r) {
      Record rec;
      const std::string& b = all[static_cast<std::size_t>(r)];
      FLASHINFER_CHECK(b.size() == sizeof(Record), op, "comm_backend", "rank ", r, "'s record has ",
                       b.size(), " bytes, expected ", sizeof(Record));
      std::memcpy(&rec, b.data(), sizeof(rec));
      FLASHINFER_CHECK(rec.bytes == mine.bytes, op, "comm_backend", "rank ", r, " allocated ",
                       rec.bytes, " bytes, rank ", rank_, " ", mine.bytes,
                       ": every rank must pass the same sizes");
      FLASHINFER_CHECK(
          rec.device_type == mine.device_type, op, "comm_backend", "rank ", r, " is on a ",
          rec.device_type == static_cast<int32_t>(DeviceType::kCUDA) ? "CUDA device" : "CPU",
          ", rank ", rank_, " is not: every rank must use the same kind of device");
      const auto i = static_cast<std::size_t>(r);
      if (r == rank_) {
        peers_[i] = local_;
      } else if (rec.process == mine.process) {
        if (device_.is_cuda()) cuda_enable_peer_access(device_.index, rec.device_index);
        peers_[i] = reinterpret_cast<void*>(static_cast<uintptr_t>(rec.address));
      } else if (device_.is_cuda()) {
        peers_[i] = cuda_ipc_open(rec.cuda_handle, device_.index);
        mapped_[i] = true;
      } else {
        rec.shm_name[sizeof(rec.shm_name) - 1] = '\0';
        peers_[i] = map_shm(rec.shm_name, bytes_, false, op);
        mapped_[i] = true;
      }
    }
    comm.barrier();  // every rank has mapped every allocation
  } catch (...) {
    if (!shm.empty()) ::shm_unlink(shm.c_str());
    release();
    throw;
  }
  if (!shm.empty()) ::shm_unlink(shm.c_str());  // the mappings keep the memory
}

PeerMemory::~PeerMemory() { release(); }

void PeerMemory::zero_local(std::size_t bytes) const {
  if (device_.is_cuda()) {
    cuda_memset_async(local_, 0, bytes, device_.index);
    cuda_stream_synchronize(current_cuda_stream(), device_.index);
  } else {
    std::memset(local_, 0, bytes);
  }
}

void PeerMemory::release() noexcept {
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    if (!mapped_[i]) continue;
    if (device_.is_cuda()) {
      cuda_ipc_close(peers_[i], device_.index);
    } else {
      ::munmap(peers_[i], bytes_);
    }
  }
  if (device_.is_cuda()) {
    cuda_ipc_free(local_, device_.index);
  } else if (heap_) {
    std::free(local_);
  } else {
    ::munmap(local_, bytes_);
  }
  local_ = nullptr;
}

}  // namespace flashinfer::detail
