// libFuzzer target: a whole call directory (metadata.jsonl and its tensor files) through
// read_metadata and replay_from_dump, as `flashinfer replay` and `show` read one.
//
// Structure-aware: an input is the directory's files, each named, joined by kFileSeparator
// (fuzz_call_dir_format.h). So mutations land inside one file at a time and the seeds
// (fuzz_make_seeds: calls recorded by this library, and the hostile classes of issue 16) keep their
// shape. Every input must end in a Result or a flashinfer::Error: a crash, a sanitizer report, a
// hang (-timeout) or a runaway allocation (-rss_limit_mb) is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "flashinfer/error.h"
#include "flashinfer/replay.h"
#include "fuzz_call_dir_format.h"

namespace {

namespace fs = std::filesystem;

// The call directory, inside a per-process directory removed when libFuzzer exits (it calls
// exit() at the end of -max_total_time and after the inputs given on the command line).
struct CallDir {
  fs::path root = fs::temp_directory_path() / ("fi_fuzz_call_dir_" + std::to_string(::getpid()));
  fs::path dir = root / "20990101_000000_000_pid1_fuzz_call0001";
  CallDir() { fs::create_directories(dir); }
  ~CallDir() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

const fs::path& call_dir() {
  static const CallDir d;
  return d.dir;
}

// Whether every tensor in `v` has at most 2^16 elements.
bool small(const flashinfer::Value& v) {
  if (v.is_tensor()) return v.as_tensor().numel() <= (int64_t{1} << 16);
  if (v.is_sequence()) {
    for (const auto& x : v.items()) {
      if (!small(x)) return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fz = flashinfer::fuzz;
  const fs::path& dir = call_dir();
  for (const auto& e : fs::directory_iterator(dir)) fs::remove(e.path());
  for (const auto& [name, content] :
       fz::split_call_files(std::string_view(reinterpret_cast<const char*>(data), size))) {
    std::ofstream(dir / std::string(name), std::ios::binary | std::ios::trunc)
        .write(content.data(), static_cast<std::streamsize>(content.size()));
  }
  try {
    (void)flashinfer::replay::read_metadata((dir / "metadata.jsonl").string());
  } catch (const flashinfer::Error&) {
  }
  // Read and rebuild everything without running the op; then run it only when its tensors are
  // small: a dump may claim a broadcast input of 2^40 elements, whose replay is a legitimate
  // (refusable by nobody) request for terabytes, not a bug of the reader.
  flashinfer::replay::Options o;
  o.run = false;
  try {
    flashinfer::replay::ObjectRegistry registry;
    o.registry = &registry;
    const auto r = flashinfer::replay::replay_from_dump(dir.string(), o);
    if (r.status == flashinfer::replay::Status::kError) return 0;
    for (const auto& v : r.args) {
      if (!small(v)) return 0;
    }
  } catch (const flashinfer::Error&) {
    return 0;
  }
  flashinfer::replay::ObjectRegistry registry;
  o.registry = &registry;
  o.run = true;
  try {
    (void)flashinfer::replay::replay_from_dump(dir.string(), o);
  } catch (const flashinfer::Error&) {
  }
  return 0;
}
