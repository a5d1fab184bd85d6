// API logging (FlashInfer's levels 1/3/5): every public call written as text, in upstream
// FlashInfer's exact format. Configured from the environment once, when the library is loaded
// (FLASHINFER_LOGLEVEL, FLASHINFER_LOGDEST, FLASHINFER_DUMP_INCLUDE/EXCLUDE), and at run time
// through the functions below. See docs/LOGGING.md.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace flashinfer::api_log {

/// The configured level. 0: off (the default); 1: one line per call with the op's name;
/// 3: the inputs before and the output after each call; 5: level 3 plus tensor statistics.
/// 2 writes only the system banner; 4 behaves as 3; 6 and above as 5 (10 also enables the flight
/// recorder, which is not part of text logging); negative levels log nothing.
int level();
/// Sets the level, exactly as FLASHINFER_LOGLEVEL would. Takes effect for the next call.
void set_level(int level);

/// Where records go: "stdout" (the default), "stderr", or a file path opened for append (every
/// "%i" becomes the process id). Returns false when the file cannot be opened: one warning is
/// printed on stderr, records are dropped until another destination is set, and every API call
/// keeps working.
bool set_destination(std::string_view destination);
/// The destination as given (before "%i" substitution).
std::string destination();

/// A callback that receives every record instead of the destination: one complete record per
/// call (possibly several lines, always ending with '\n'), in order and never interleaved with
/// another thread's record. It runs under the logger's lock: it must not call set_destination,
/// set_sink or flush. An empty function goes back to the destination.
using Sink = std::function<void(std::string_view record)>;
void set_sink(Sink sink);

/// fnmatch patterns (`*`, `?`, `[seq]`, `[!seq]`; case-sensitive) gating levels >= 3, as
/// FLASHINFER_DUMP_INCLUDE / FLASHINFER_DUMP_EXCLUDE do: with a non-empty include list only
/// matching names are logged, then any name matching an exclude pattern is dropped. Level 1 is
/// never filtered. Names are the declared op names ("rmsnorm",
/// "BatchDecodeWithPagedKVCacheWrapper.run").
void set_filters(std::vector<std::string> include, std::vector<std::string> exclude);
/// Whether `op_name` passes the current include/exclude filters.
bool passes_filters(std::string_view op_name);

/// Flushes the destination (records are already flushed one by one; this is for files written
/// through a buffered stdout).
void flush();

/// Reads the FLASHINFER_* variables again, with the parser the library uses when it loads, and
/// applies them: level, destination, include/exclude filters, and at level >= 10 the flight
/// recorder (started with its warning block unless one is running). An unset variable means
/// its default. A level that is not an integer gives one warning on stderr and level 0.
void configure_from_env();

}  // namespace flashinfer::api_log
