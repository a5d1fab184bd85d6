// libFuzzer target: the metadata.jsonl reader must reject any input with flashinfer::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "flashinfer/error.h"
#include "flashinfer/replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)flashinfer::replay::parse_metadata(
        std::string(reinterpret_cast<const char*>(data), size));
  } catch (const flashinfer::Error&) {
  }
  return 0;
}
