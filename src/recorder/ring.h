// Private: the flight recorder's ring mode (FLASHINFER_DUMP_RING=N, docs/LOGGING.md "Ring
// mode"). The last N calls, records and tensors, are kept in memory and nothing is written
// until a trigger (a crash signal, SIGUSR1, a NaN/Inf output, a flashinfer::Error, or
// recorder::dump_ring()) writes them in upstream's dump layout.
//
// Memory: tensor bytes are held as "blobs". A tensor is shared with a kept blob instead of
// copied when it is the same storage span, no library call wrote that span since (declared
// written arguments and results), and a sampled fingerprint matches (CPU only); with
// FLASHINFER_DUMP_RING_VERIFY=full, when an XXH3-128 hash of all its bytes matches. So weights
// passed call after call are held once. CUDA tensors are copied asynchronously into pinned host
// memory on the call's stream (shared by span only, never in full mode).
//
// Crash safety: every kept call carries its files laid out ahead (record lines around the
// dump directory, torch archives as header bytes plus pointers to blobs), so the crash
// handler writes a dump with mkdir(2)/open(2)/write(2)/close(2) only, then re-raises.
#pragma once

#include <memory>
#include <string>

#include "flashinfer/api_call.h"
#include "flashinfer/recorder.h"

namespace flashinfer::recorder::internal {

class RingRecorder;

/// The ring-mode observer for `config` (config.ring > 0). Installs the signal handlers its
/// triggers need; they are removed when it is destroyed.
std::shared_ptr<RingRecorder> make_ring_recorder(const Config& config, LineSink sink);

/// The observer interface of a ring recorder.
std::shared_ptr<CallObserver> as_observer(const std::shared_ptr<RingRecorder>& r);

/// Writes the ring now (recorder::dump_ring); returns the dump directory or "" .
std::string ring_dump(RingRecorder& r, const std::string& reason);

/// The ring's counters (recorder::stats in ring mode).
Stats ring_stats(RingRecorder& r);

/// Removes the signal handlers (before the recorder goes away).
void ring_shutdown(RingRecorder& r);

/// Seconds spent in ring recorders' hooks (on_call_begin, on_call_end, on_call_error) by all
/// threads since the process started (steady clock, two reads per hook). Benchmarks take the
/// difference over a decode step: the hooks' own cost, measured directly, is far less noisy
/// than the difference of two step times (docs/PERFORMANCE.md, session 16).
double ring_hook_seconds();

/// Hooks (on_call_begin and on_call_end, each counted) that found their call's record template
/// and archive layouts by the arguments' key (the fast path of a call repeating a recent call's
/// arguments), by all ring recorders since the process started.
uint64_t ring_shape_hits();

}  // namespace flashinfer::recorder::internal
