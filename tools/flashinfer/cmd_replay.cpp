// `flashinfer replay` and `flashinfer show`: re-run recorded calls, or print what a dump holds.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "flashinfer/replay.h"

namespace flashinfer::cli {

namespace fs = std::filesystem;

namespace {

std::string fmt_g(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3g", v);
  return b;
}

// One line per comparison that failed, so the reader sees how far off and where.
void print_details(const replay::Result& r, const char* indent) {
  for (const auto& c : r.comparisons) {
    if (c.match) continue;
    if (!c.problem.empty()) {
      std::printf("%s%s: %s\n", indent, c.key.c_str(), c.problem.c_str());
    } else {
      std::printf(
          "%s%s: %lld of %lld elements differ (max abs error %s, max rel error %s, first "
          "at flat index %lld; rtol %s, atol %s)\n",
          indent, c.key.c_str(), static_cast<long long>(c.mismatches),
          static_cast<long long>(c.numel), fmt_g(c.max_abs_error).c_str(),
          fmt_g(c.max_rel_error).c_str(), static_cast<long long>(c.first_mismatch),
          fmt_g(c.rtol).c_str(), fmt_g(c.atol).c_str());
    }
  }
}

int run_replay(const std::string& dir, const std::string& device_text, std::optional<double> rtol,
               std::optional<double> atol) {
  const Device device = Device::parse(device_text);
  if (!fs::is_directory(dir)) {
    std::printf("❌ Directory not found: %s\n", dir.c_str());
    return 2;
  }
  if (fs::exists(fs::path(dir) / "metadata.jsonl")) {
    std::printf("Replaying single dump from %s...\n", dir.c_str());
    replay::Options o;
    o.device = device;
    o.rtol = rtol;
    o.atol = atol;
    replay::ObjectRegistry reg;
    o.registry = &reg;
    const replay::Result r = replay::replay_from_dump(dir, o);
    switch (r.status) {
      case replay::Status::kPassed:
        std::printf("✅ Replay passed (outputs matched)\n");
        return 0;
      case replay::Status::kError:
        std::printf("❌ Execution failed: %s\n", r.error.c_str());
        return 1;
      case replay::Status::kIncomplete:
        std::printf(
            "💥 Incomplete record: the recorded process died inside this call; it was "
            "re-run here and completed\n");
        return 1;
      default:
        std::printf("⚠️  Replay finished but outputs did not match\n");
        print_details(r, "    ");
        return 1;
    }
  }
  std::printf("Replaying session from %s...\n", dir.c_str());
  const auto results = replay::replay_sequence(dir, device, rtol, atol);
  int passed = 0, failed = 0, first_bad = -1;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    const std::string name = fs::path(r.dump_dir).filename().string();
    const int n = static_cast<int>(i) + 1;
    switch (r.status) {
      case replay::Status::kPassed:
        ++passed;
        std::printf("[%d] %s (%s): ✅ Passed\n", n, r.function_name.c_str(), name.c_str());
        break;
      case replay::Status::kError:
        ++failed;
        std::printf("[%d] %s: ❌ Error: %s\n", n, name.c_str(), r.error.c_str());
        break;
      case replay::Status::kIncomplete:
        ++failed;
        std::printf("[%d] %s (%s): 💥 Incomplete: the recorded process died inside this call\n", n,
                    r.function_name.c_str(), name.c_str());
        break;
      default:
        ++failed;
        std::printf("[%d] %s (%s): ⚠️  Mismatch\n", n, r.function_name.c_str(), name.c_str());
        print_details(r, "    ");
        break;
    }
    if (r.status != replay::Status::kPassed && first_bad < 0) first_bad = static_cast<int>(i);
  }
  std::printf("\nSummary: %d passed, %d failed/mismatch\n", passed, failed);
  if (first_bad >= 0) {
    const auto& r = results[first_bad];
    std::printf("First divergence: [%d] %s (%s)\n", first_bad + 1,
                r.function_name.empty() ? "?" : r.function_name.c_str(),
                fs::path(r.dump_dir).filename().string().c_str());
  }
  return failed == 0 ? 0 : 1;
}

void show_call(const fs::path& d, int index) {
  replay::MetadataRecord m;
  try {
    m = replay::read_metadata((d / "metadata.jsonl").string());
  } catch (const std::exception& e) {
    std::printf("[%d] %s: unreadable: %s\n", index, d.filename().string().c_str(), e.what());
    return;
  }
  const auto j = nlohmann::ordered_json::parse(m.json);
  std::printf("[%d] %s  %s  (%s)\n", index, j.value("function_name", "?").c_str(),
              m.completed ? "completed" : "INCOMPLETE (inputs only)",
              d.filename().string().c_str());
  if (j.contains("tensor_details") && j["tensor_details"].is_object()) {
    for (auto it = j["tensor_details"].begin(); it != j["tensor_details"].end(); ++it) {
      const auto& t = it.value();
      std::printf("      %-22s %s %s\n", it.key().c_str(), t.value("dtype", "?").c_str(),
                  t.contains("shape") ? t["shape"].dump().c_str() : "?");
    }
  }
  if (j.contains("input_metadata") && j["input_metadata"].is_object()) {
    for (auto it = j["input_metadata"].begin(); it != j["input_metadata"].end(); ++it) {
      std::string v = it.value().dump();
      if (v.size() > 70) v = v.substr(0, 67) + "...";
      std::printf("      %-22s %s\n", it.key().c_str(), v.c_str());
    }
  }
}

int run_show(const std::string& dir) {
  const fs::path p(dir);
  if (!fs::is_directory(p)) {
    std::printf("❌ Directory not found: %s\n", dir.c_str());
    return 2;
  }
  if (fs::exists(p / "metadata.jsonl")) {
    show_call(p, 1);
    return 0;
  }
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(p)) {
    if (e.is_directory() && fs::exists(e.path() / "metadata.jsonl")) dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  std::printf("Session %s: %zu recorded calls\n", dir.c_str(), dirs.size());
  for (std::size_t i = 0; i < dirs.size(); ++i) show_call(dirs[i], static_cast<int>(i) + 1);
  return 0;
}

}  // namespace

Command replay_command() {
  return {
      "replay",
      "Re-run recorded calls (a session or one call directory) and compare with the recording",
      [](CLI::App& sub) {
        auto dir = std::make_shared<std::string>();
        auto device = std::make_shared<std::string>("cpu");
        auto rtol = std::make_shared<double>(-1.0);
        auto atol = std::make_shared<double>(-1.0);
        sub.add_option("--dir", *dir, "Dump directory: a session root or one call")->required();
        sub.add_option("--device", *device, "Where to run: cpu (the reference) or cuda[:N]");
        sub.add_option("--rtol", *rtol, "Relative tolerance for every dtype (default: per dtype)");
        sub.add_option("--atol", *atol, "Absolute tolerance for every dtype (default: per dtype)");
        sub.footer(
            "Exit status: 0 when every call passed, 1 when one failed or mismatched, 2 "
            "when the directory does not exist.");
        return std::function<int()>([=] {
          return run_replay(*dir, *device, *rtol >= 0 ? std::optional<double>(*rtol) : std::nullopt,
                            *atol >= 0 ? std::optional<double>(*atol) : std::nullopt);
        });
      }};
}

Command show_command() {
  return {"show", "Print what a dump holds: each call, its status, tensors and arguments",
          [](CLI::App& sub) {
            auto dir = std::make_shared<std::string>();
            sub.add_option("dir", *dir, "Dump directory: a session root or one call")->required();
            return std::function<int()>([dir] { return run_show(*dir); });
          }};
}

}  // namespace flashinfer::cli
