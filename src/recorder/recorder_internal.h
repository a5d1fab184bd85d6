// Private: recorder pieces the library's load-time configuration and the tests use.
#pragma once

#include <functional>
#include <string>

#include "flashinfer/recorder.h"

namespace flashinfer::recorder {

/// Tests and benchmarks: where every recorder's log lines go instead of the sink it was
/// installed with; an empty function goes back to that sink.
using LogSink = LineSink;
void set_log_sink(LogSink sink);

/// Upstream's level-10 warning block (_warn_dump in flashinfer/api_logging.py), exactly, for
/// `config`: printed on stdout once when the library loads with FLASHINFER_LOGLEVEL >= 10.
std::string startup_banner(const Config& config);

/// Tests only: decides whether a call counts as captured into a CUDA graph (so that the
/// deferred-dump path can be tested without a GPU); an empty function restores the real check.
void set_capture_probe(std::function<bool()> probe);

}  // namespace flashinfer::recorder

namespace flashinfer::detail {
struct Settings;
}

namespace flashinfer::recorder {

/// The recorder's part of the parsed FLASHINFER_* settings.
Config config_from(const detail::Settings& settings);

/// Prints one warning on stderr for each FLASHINFER_DUMP_* variable of `settings` that could
/// not be parsed (it keeps its default).
void warn_about_settings(const detail::Settings& settings);

}  // namespace flashinfer::recorder
