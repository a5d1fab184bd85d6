// libFuzzer target: load_torch_bytes must reject any input with flashinfer::Error, never crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "flashinfer/error.h"
#include "flashinfer/tensor_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto tensors =
        flashinfer::load_torch_bytes(std::string(reinterpret_cast<const char*>(data), size));
    for (auto& [k, t] : tensors) (void)t.to_double_vector();  // every view must be readable
  } catch (const flashinfer::Error&) {
  }
  return 0;
}
