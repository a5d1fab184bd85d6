// `flashinfer export --dir D --out E`: writes a dump in upstream FlashInfer's exact layout.
// A dedup dump (FLASHINFER_DUMP_DEDUP=1: <stem>.refs.json per call, tensors in D/tensors/) is
// expanded into inputs.pt / outputs.pt / mutated.pt per call; records lose the
// "tensor_store" key and their dump_dir names the new location. Other files are copied.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "commands.h"
#include "flashinfer/error.h"
#include "flashinfer/tensor_io.h"
#include "formats/dedup_store.h"
#include "formats/reader_limits.h"
#include "recorder/dump_schema.h"
#include "recorder/dump_writer.h"
#include "recorder/python_json.h"

namespace flashinfer::cli {

namespace {

namespace fs = std::filesystem;
namespace schema = flashinfer::dump_schema;

std::string json_text(std::string_view s) {
  std::string out;
  recorder::append_json_string(out, s);
  return out;
}

// One record line with the dedup key dropped and dump_dir rebased on the export, edited as
// text so that every other byte stays as the recorder wrote it (json.dumps formatting).
std::string rewrite_line(const std::string& line, const fs::path& old_root,
                         const std::string& new_root) {
  std::string out = line;
  const std::string store =
      ", " + json_text(schema::kTensorStore) + ": " + json_text(schema::kTensorStoreDedup);
  if (auto at = out.find(store); at != std::string::npos) out.erase(at, store.size());
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(out);
  } catch (const std::exception&) {
    return out;  // a torn line stays as it was
  }
  const std::string key(schema::kDumpDir);
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return out;
  const std::string old_dir = j[key].get<std::string>();
  const std::string name = fs::path(old_dir).filename().string();
  (void)old_root;
  const std::string new_dir = recorder::internal::join_like_pathlib(new_root, name);
  const std::string from = json_text(key) + ": " + json_text(old_dir);
  if (auto at = out.find(from); at != std::string::npos) {
    out.replace(at, from.size(), json_text(key) + ": " + json_text(new_dir));
  }
  return out;
}

void rewrite_jsonl(const fs::path& from, const fs::path& to, const fs::path& old_root,
                   const std::string& new_root) {
  const std::string text =
      formats::read_regular_file(from.string(), formats::kMaxMetadataFileBytes, "export");
  std::istringstream in(text);
  std::ofstream out(to, std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    out << rewrite_line(line, old_root, new_root) << '\n';
  }
  if (!out)
    FLASHINFER_FAIL(ErrorCode::kIo, "export", "--out", "writing '", to.string(), "' failed");
}

int run_export(const std::string& dir, const std::string& out) {
  const fs::path src(dir), dst(out);
  if (!fs::is_directory(src)) {
    std::printf("❌ Directory not found: %s\n", dir.c_str());
    return 2;
  }
  std::error_code ec;
  if (fs::exists(dst) && !fs::is_empty(dst, ec)) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "export", "--out", "'", out,
                    "' exists and is not empty");
  }
  fs::create_directories(dst);
  if (fs::exists(src / schema::kSessionFile)) {
    rewrite_jsonl(src / schema::kSessionFile, dst / schema::kSessionFile, src, out);
  }
  int calls = 0, expanded = 0;
  for (const fs::path& call : formats::call_directories(src, schema::kMetadataFile)) {
    const fs::path to = dst / call.filename();
    fs::create_directories(to);
    for (const auto& e : fs::directory_iterator(call)) {
      const std::string name = e.path().filename().string();
      if (name == schema::kMetadataFile) {
        rewrite_jsonl(e.path(), to / name, src, out);
      } else if (name.ends_with(formats::kDedupRefsSuffix)) {
        const std::string stem = name.substr(0, name.size() - formats::kDedupRefsSuffix.size());
        save_torch((to / schema::tensor_file(stem, false)).string(),
                   formats::load_dedup_refs(e.path().string()));
        ++expanded;
      } else {
        fs::copy(e.path(), to / name, fs::copy_options::recursive);
      }
    }
    ++calls;
  }
  // A ring dump's trigger.json comes along.
  if (fs::exists(src / schema::kTriggerFile)) fs::copy(src / schema::kTriggerFile, dst);
  std::printf("Exported %d calls to %s (%d tensor files expanded from the dedup store)\n", calls,
              out.c_str(), expanded);
  return 0;
}

}  // namespace

Command export_command() {
  return {"export",
          "Write a dump in upstream FlashInfer's exact layout (expands a FLASHINFER_DUMP_DEDUP "
          "dump's tensor store into per-call inputs.pt/outputs.pt)",
          [](Args& sub) {
            auto dir = std::make_shared<std::string>();
            auto out = std::make_shared<std::string>();
            sub.add_option("--dir", *dir, "Dump directory (a session root)").required();
            sub.add_option("--out", *out, "Where to write the upstream-layout copy (new or empty)")
                .required();
            return std::function<int()>([dir, out] { return run_export(*dir, *out); });
          }};
}

}  // namespace flashinfer::cli
