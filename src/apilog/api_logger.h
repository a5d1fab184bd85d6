// Private: the API logger's entry points for the library's load-time configuration
// (src/startup), which installs the logger and hands the flight recorder its log sink.
#pragma once

#include <string>
#include <string_view>

namespace flashinfer::detail {
struct Settings;
}

namespace flashinfer::detail::apilog {

/// Applies the logging part of `settings` (level, destination, include/exclude filters) and
/// prints the warning about an unparsable FLASHINFER_LOGLEVEL. With a level other than 0 the
/// destination is opened and the system banner written now, as upstream does at import. In ring
/// mode (level 10 with FLASHINFER_DUMP_RING) the logger writes no per-call records.
void configure(const Settings& settings);

/// Writes one line (the newline is appended) at the API log destination, after the system
/// banner if it is not out yet: the flight recorder's log lines come here.
void emit_line(std::string_view line);

/// Writes the system banner now unless it already was (once per process).
void emit_banner();

}  // namespace flashinfer::detail::apilog
