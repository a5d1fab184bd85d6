// Private: recorder pieces the API logger and the library's start-up code use.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "flashinfer/recorder.h"

namespace flashinfer::recorder {

/// Where the recorder's per-call lines ("Dumped inputs to: ...") go; empty: stdout.
using LogSink = std::function<void(const std::string&)>;
void set_log_sink(LogSink sink);

/// The level-10 warning block printed on stdout when recording starts from the environment.
std::string startup_banner(const Config& config);

/// Tests only: decides whether a call counts as captured into a CUDA graph (so that the
/// deferred-dump path can be tested without a GPU); an empty function restores the real check.
void set_capture_probe(std::function<bool()> probe);

/// FLASHINFER_LOGLEVEL as an integer (0 when unset or not an integer).
int level_from_env();

/// Prints the level-10 warning block and starts recording with config_from_env(). Called once
/// at library load by the API logger's configuration when FLASHINFER_LOGLEVEL >= 10.
void start_from_env();

}  // namespace flashinfer::recorder

namespace flashinfer::detail {
/// Writes one line (no trailing newline needed) to the API log destination (api_logger.cpp).
void api_log_emit_line(std::string_view line);
}  // namespace flashinfer::detail
