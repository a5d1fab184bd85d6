// ThreadGroup: the ranks of a communication group as threads of one process. One rendezvous
// (mutex, condition variable, generation counter) serves allgather and barrier; a rank whose
// body threw aborts the group, so the others leave their collectives at once instead of waiting
// for the timeout.
#include "flashinfer/comm.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/comm_abort.h"
#include "core/comm_lifetime.h"
#include "core/cuda_runtime.h"
#include "flashinfer/error.h"
#include "flashinfer/stream.h"

namespace flashinfer::comm {

namespace {
// The abort flag of the group whose rank this thread runs (ThreadGroup::run), else null; its
// abort word's device address where the group has CUDA ranks.
thread_local const std::atomic<bool>* t_group_aborted = nullptr;
thread_local const uint32_t* t_abort_word = nullptr;
// The group and rank this thread runs (ThreadGroup::run), for detail::gated_collective_launch.
thread_local ThreadGroup::State* t_group_state = nullptr;
thread_local int64_t t_group_rank = -1;
}  // namespace

struct ThreadGroup::State {
  int64_t size = 0;
  std::vector<Device> devices;
  std::chrono::milliseconds timeout{0};
  std::mutex m;
  std::condition_variable cv;
  uint64_t generation = 0;
  int64_t arrived = 0;
  bool aborted = false;
  std::atomic<bool> aborted_flag{false};  // `aborted`, for waits outside the mutex
  // Mapped host memory the CUDA ranks' kernels poll (core/comm_abort.h), made by the first run
  // with a CUDA rank.
  uint32_t* abort_host = nullptr;
  const uint32_t* abort_device = nullptr;

  ~State() {
    if (abort_host) detail::cuda_pinned_free(abort_host);
  }
  void mark_aborted() {
    aborted = true;
    aborted_flag.store(true, std::memory_order_release);
    if (abort_host) std::atomic_ref<uint32_t>(*abort_host).store(1, std::memory_order_release);
  }
  std::vector<std::string> slots;     // this round's contributions
  std::vector<std::string> gathered;  // the last completed round's

  std::vector<std::string> rendezvous(int64_t rank, std::string_view bytes, const char* what) {
    std::unique_lock<std::mutex> lk(m);
    if (aborted) {
      FLASHINFER_FAIL(ErrorCode::kInternal, what, "", "the thread group was aborted: rank ", rank,
                      " left its collective because another rank failed");
    }
    const uint64_t gen = generation;
    slots[static_cast<std::size_t>(rank)] = std::string(bytes);
    if (++arrived == size) {
      gathered = slots;
      arrived = 0;
      ++generation;
      cv.notify_all();
      return gathered;
    }
    if (!cv.wait_for(lk, timeout, [&] { return generation != gen || aborted; })) {
      mark_aborted();
      cv.notify_all();
      FLASHINFER_FAIL(ErrorCode::kInternal, what, "", "rank ", rank, " waited ", timeout.count(),
                      " ms for the other ranks of its thread group (", arrived, " of ", size,
                      " arrived)");
    }
    if (generation == gen) {
      FLASHINFER_FAIL(ErrorCode::kInternal, what, "", "the thread group was aborted: rank ", rank,
                      " left its collective because another rank failed");
    }
    // A later round cannot complete (and overwrite `gathered`) before this rank joins it.
    return gathered;
  }

  void abort() {
    std::lock_guard<std::mutex> lk(m);
    mark_aborted();
    cv.notify_all();
  }
};

namespace {

// Streams for CUDA ranks: a set per concurrently running group (sets are reused by later
// groups, never destroyed: tensors made on a stream may outlive the group, and their cached
// memory belongs to the stream). Two groups running at once on one GPU must not share a rank's
// stream: their collectives would queue behind each other's and wait forever.
struct StreamSets {
  std::mutex m;
  std::vector<bool> in_use;
  std::map<std::tuple<std::size_t, int, int64_t>, void*> streams;  // (set, device, rank)
};
StreamSets& stream_sets() {
  static StreamSets s;
  return s;
}
std::size_t acquire_stream_set() {
  StreamSets& s = stream_sets();
  const std::lock_guard<std::mutex> lock(s.m);
  for (std::size_t i = 0; i < s.in_use.size(); ++i) {
    if (!s.in_use[i]) {
      s.in_use[i] = true;
      return i;
    }
  }
  s.in_use.push_back(true);
  return s.in_use.size() - 1;
}
void release_stream_set(std::size_t set) {
  StreamSets& s = stream_sets();
  const std::lock_guard<std::mutex> lock(s.m);
  s.in_use[set] = false;
}
// The hardware queues a GPU's streams are spread over (CUDA_DEVICE_MAX_CONNECTIONS, 8 unless set
// before CUDA starts).
int64_t hardware_queues() {
  int64_t queues = 8;
  if (const char* env = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS")) {
    queues = std::clamp<int64_t>(std::atoll(env), 1, 32);
  }
  return queues;
}

// The stream of the `slot`-th rank of a group on `device` (slots count the group's ranks on that
// device, at most hardware_queues()). A set's streams on a device are all created at once, one
// after another: streams take the hardware queues in turn as they are created, so these land on
// distinct queues. Created one by one as ranks first ran, with other streams (a peer buffer's
// zeroing, a later, larger group's new ranks) created in between, two ranks could share a queue,
// and a kernel waiting for its peer would then hold back that peer's kernel: a deadlock.
void* rank_stream(std::size_t set, int device, int64_t slot) {
  StreamSets& s = stream_sets();
  const std::lock_guard<std::mutex> lock(s.m);
  if (!s.streams.count({set, device, 0})) {
    const int64_t queues = hardware_queues();
    for (int64_t k = 0; k < queues; ++k) {
      s.streams[{set, device, k}] = detail::cuda_stream_create_nonblocking(device);
    }
  }
  void*& st = s.streams[{set, device, slot}];  // past the batch only if the variable changed
  if (!st) st = detail::cuda_stream_create_nonblocking(device);
  return st;
}

class ThreadBackend final : public CommBackend {
 public:
  ThreadBackend(std::shared_ptr<ThreadGroup::State> s, int64_t rank)
      : s_(std::move(s)), rank_(rank) {}
  int64_t Get_rank() const override { return rank_; }
  int64_t Get_size() const override { return s_->size; }
  std::vector<std::string> allgather(std::string_view bytes) override {
    return s_->rendezvous(rank_, bytes, "CommBackend.allgather");
  }
  void barrier() override { (void)s_->rendezvous(rank_, {}, "CommBackend.barrier"); }
  Device device() const override { return s_->devices[static_cast<std::size_t>(rank_)]; }
  const void* group_id() const override { return s_.get(); }
  std::shared_ptr<const void> state() const { return s_; }
  std::string_view class_name() const override { return "ThreadCommBackend"; }
  std::string_view module_name() const override { return "flashinfer.comm"; }
  // Rank and size in the repr: a recording of ranks that share a process places each rank's
  // calls by them (its workspaces' addresses do not order the ranks).
  std::string repr() const override {
    char group[24];
    std::snprintf(group, sizeof(group), "%p", static_cast<const void*>(s_.get()));
    return "ThreadCommBackend(rank=" + std::to_string(rank_) +
           ", size=" + std::to_string(s_->size) + ", group=" + group + ")";
  }

 private:
  std::shared_ptr<ThreadGroup::State> s_;
  int64_t rank_;
};

}  // namespace

ThreadGroup::ThreadGroup(int64_t size, Device device, std::chrono::milliseconds timeout)
    : ThreadGroup(
          std::vector<Device>(static_cast<std::size_t>(std::clamp<int64_t>(size, 0, 1025)), device),
          timeout) {}

ThreadGroup::ThreadGroup(std::vector<Device> devices, std::chrono::milliseconds timeout)
    : state_(std::make_shared<State>()) {
  const auto size = static_cast<int64_t>(devices.size());
  FLASHINFER_CHECK(size >= 1 && size <= 1024, "ThreadGroup", "size", "must be in [1, 1024], got ",
                   size);
  // Each CUDA rank waits for its peers in a kernel: ranks sharing a GPU need a hardware queue
  // each, or a waiting kernel can hold back the peer kernel it waits for (a deadlock).
  std::map<int, int64_t> per_device;
  for (const Device& d : devices) per_device[d.is_cuda() ? d.index : -1] += 1;
  const int64_t queues = hardware_queues();
  for (const auto& [index, n] : per_device) {
    FLASHINFER_CHECK_CODE(index < 0 || n <= queues, ErrorCode::kUnsupported, "ThreadGroup",
                          "devices", n, " ranks share cuda:", index, ", more than its ", queues,
                          " hardware queues (CUDA_DEVICE_MAX_CONNECTIONS): a rank's kernel "
                          "waiting for a peer could hold back the peer's kernels. Set "
                          "CUDA_DEVICE_MAX_CONNECTIONS (at most 32) before CUDA starts, or "
                          "spread the ranks over devices");
  }
  state_->size = size;
  state_->devices = std::move(devices);
  state_->timeout = timeout;
  state_->slots.resize(static_cast<std::size_t>(size));
}

ThreadGroup::~ThreadGroup() = default;

int64_t ThreadGroup::size() const { return state_->size; }

}  // namespace flashinfer::comm

namespace flashinfer::detail {
const uint32_t* thread_group_abort_word() { return comm::t_abort_word; }
void gated_collective_launch(const comm::CommBackend* comm, int64_t world_size, Device device,
                             const std::function<void()>& preload,
                             const std::function<void()>& launch) {
  comm::ThreadGroup::State* const s = comm::t_group_state;
  // Only the whole group whose rank this thread runs: a collective of a subset of its ranks (or
  // of another group) has other members, which would never meet this group's barriers.
  const bool gate = s != nullptr && device.is_cuda() && world_size > 1 && s->size == world_size &&
                    (comm == nullptr || comm->group_id() == static_cast<const void*>(s));
  if (!gate) {
    launch();
    return;
  }
  if (preload) preload();
  (void)s->rendezvous(comm::t_group_rank, {}, "collective launch");
  // A launch that throws here leaves the peers in the barrier below: ThreadGroup::run aborts the
  // group when this rank's body ends with the exception, which ends their wait.
  launch();
  (void)s->rendezvous(comm::t_group_rank, {}, "collective launch");
}
std::weak_ptr<const void> group_lifetime(const comm::CommBackend& c) {
  const auto* t = dynamic_cast<const comm::ThreadBackend*>(&c);
  return t ? t->state() : std::weak_ptr<const void>();
}
}  // namespace flashinfer::detail

namespace flashinfer::comm {

bool this_thread_group_aborted() {
  return t_group_aborted != nullptr && t_group_aborted->load(std::memory_order_acquire);
}

std::shared_ptr<CommBackend> ThreadGroup::backend(int64_t rank) const {
  FLASHINFER_CHECK(rank >= 0 && rank < state_->size, "ThreadGroup.backend", "rank",
                   "must be in [0, ", state_->size, "), got ", rank);
  return std::make_shared<ThreadBackend>(state_, rank);
}

void ThreadGroup::run(const std::function<void(int64_t rank)>& body) const {
  const auto n = static_cast<std::size_t>(state_->size);
  bool any_cuda = false;
  for (const Device& d : state_->devices) any_cuda = any_cuda || d.is_cuda();
  const std::size_t set = any_cuda ? acquire_stream_set() : 0;
  if (any_cuda) {
    const std::lock_guard<std::mutex> lk(state_->m);
    if (!state_->abort_host) {
      void* dev = nullptr;
      state_->abort_host = static_cast<uint32_t*>(detail::cuda_mapped_alloc(4, &dev));
      state_->abort_device = static_cast<const uint32_t*>(dev);
      if (state_->aborted) std::atomic_ref<uint32_t>(*state_->abort_host).store(1);
    }
  }
  // Each CUDA rank's slot among the group's ranks on its device (rank_stream).
  std::vector<int64_t> slot(n, 0);
  std::map<int, int64_t> on_device;
  for (std::size_t r = 0; r < n; ++r) {
    if (state_->devices[r].is_cuda()) slot[r] = on_device[state_->devices[r].index]++;
  }
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (std::size_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      void* stream = nullptr;
      const Device dev = state_->devices[r];
      t_group_aborted = &state_->aborted_flag;
      t_abort_word = state_->abort_device;
      t_group_state = state_.get();
      t_group_rank = static_cast<int64_t>(r);
      try {
        // A CUDA rank runs on a stream of its own: on the legacy default stream the ranks
        // sharing a GPU would serialize, and a kernel waiting for a peer's would never end.
        if (dev.is_cuda()) {
          stream = rank_stream(set, dev.index, slot[r]);
          set_current_cuda_stream(stream);
        }
        body(static_cast<int64_t>(r));
        if (stream) detail::cuda_stream_synchronize(stream, dev.index);
      } catch (...) {
        errors[r] = std::current_exception();
        state_->abort();
      }
      if (stream) set_current_cuda_stream(nullptr);
      t_group_aborted = nullptr;
      t_abort_word = nullptr;
      t_group_state = nullptr;
      t_group_rank = -1;
    });
  }
  for (auto& t : threads) t.join();
  if (any_cuda) release_stream_set(set);
  // The first failure by rank; an "aborted" error is only reported when nothing else failed.
  std::exception_ptr first, aborted;
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      const bool is_abort = std::string(err.what()).find("was aborted") != std::string::npos;
      if (is_abort && !aborted) aborted = e;
      if (!is_abort && !first) first = e;
    } catch (...) {
      if (!first) first = e;
    }
  }
  if (first || aborted) {
    // The group stays aborted: its collectives are out of step with each other now.
    std::rethrow_exception(first ? first : aborted);
  }
}

}  // namespace flashinfer::comm
