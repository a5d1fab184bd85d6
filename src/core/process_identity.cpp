#include "core/process_identity.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>

namespace flashinfer::detail {
namespace {

std::atomic<uint64_t> g_nonce{0};

uint64_t draw_nonce() {
  std::random_device rd;
  uint64_t n = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  // random_device may be deterministic on some platforms: the clock makes two draws differ.
  n ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return n == 0 ? 1 : n;
}

void redraw_in_child() { g_nonce.store(draw_nonce()); }

}  // namespace

ProcessIdentity this_process() {
  static const bool once = [] {
    g_nonce.store(draw_nonce());
    pthread_atfork(nullptr, nullptr, &redraw_in_child);
    return true;
  }();
  (void)once;
  return {static_cast<int64_t>(::getpid()), g_nonce.load()};
}

std::string process_tag() {
  const ProcessIdentity p = this_process();
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%lld_%016llx", static_cast<long long>(p.pid),
                static_cast<unsigned long long>(p.nonce));
  return buf;
}

}  // namespace flashinfer::detail
