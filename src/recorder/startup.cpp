// Library-load start of the recorder when FLASHINFER_LOGLEVEL >= 10. A static initializer of the
// shared library: it runs when the library is loaded, before any API call.
#include "recorder/recorder_internal.h"

namespace flashinfer::recorder {
namespace {

const bool g_started = [] {
  start_from_env();
  return true;
}();

}  // namespace
}  // namespace flashinfer::recorder
