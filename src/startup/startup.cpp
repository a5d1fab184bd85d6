// The library's load-time configuration: the one place that knows both the API logger
// (src/apilog) and the flight recorder (src/recorder). When the library loads it parses every
// FLASHINFER_* setting once (src/core/settings.h), configures the logger from it and, at
// level 10 and above, prints upstream's warning block and installs the recorder, handing it the
// API log destination as its log sink. The two observers only meet here.
#include <cstdio>
#include <exception>
#include <string>

#include "apilog/api_logger.h"
#include "core/settings.h"
#include "flashinfer/api_log.h"
#include "flashinfer/recorder.h"
#include "flashinfer/trace.h"
#include "recorder/recorder_internal.h"

namespace flashinfer {

namespace {

void apply(const detail::Settings& s) {
  detail::apilog::configure(s);
  if (s.log_level >= 10 && !recorder::active()) {
    recorder::warn_about_settings(s);
    const recorder::Config c = recorder::config_from(s);
    const std::string block = recorder::startup_banner(c);  // print()ed on stdout, as upstream
    std::fwrite(block.data(), 1, block.size(), stdout);
    std::fflush(stdout);
    recorder::start(c);
  }
  // The trace dumper is a third observer, independent of both.
  if (s.trace_dump && !trace::dump_active()) trace::start_dump(s.trace_dump_dir);
}

void warn(const char* what) {
  std::fprintf(stderr, "[flashinfer] warning: API logging configuration failed%s%s\n",
               what ? ": " : "", what ? what : "");
}

struct LoadTimeInit {
  LoadTimeInit() noexcept {
    try {
      apply(detail::load_settings());
    } catch (const std::exception& e) {
      warn(e.what());
    } catch (...) {
      warn(nullptr);
    }
  }
};
const LoadTimeInit g_load_time_init;

}  // namespace

namespace api_log {
void configure_from_env() { apply(detail::parse_settings()); }
}  // namespace api_log

namespace recorder {
void start(const Config& config) {
  // Upstream's recorder logs through the API logger: its lines go to the API log destination.
  start(config, [](const std::string& line) { detail::apilog::emit_line(line); });
}
}  // namespace recorder

}  // namespace flashinfer

// A static link keeps an object file only when something refers to it, and nothing calls into
// this one: the build (src/CMakeLists.txt) makes a static library's users refer to this symbol.
extern "C" {
extern const int flashinfer_load_time_init_anchor;
const int flashinfer_load_time_init_anchor = 1;
}
