// `flashinfer replay` and `flashinfer show`: re-run recorded calls, or print what a dump holds.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "formats/dedup_store.h"
#include "formats/reader_limits.h"
#include "recorder/dump_schema.h"

namespace flashinfer::cli {

namespace fs = std::filesystem;
namespace schema = flashinfer::dump_schema;

namespace {

std::string fmt_bytes(uint64_t n) {
  char b[32];
  if (n >= (1ull << 20)) {
    std::snprintf(b, sizeof(b), "%.2f MB", static_cast<double>(n) / 1048576.0);
  } else {
    std::snprintf(b, sizeof(b), "%.1f KB", static_cast<double>(n) / 1024.0);
  }
  return b;
}

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

struct ReplayArgs {
  std::string dir;
  std::string device = "cpu";
  double rtol = -1.0, atol = -1.0;
  std::vector<std::string> include, exclude;
  bool json = false;
  bool verbose = false;
};

nlohmann::ordered_json result_json(const replay::Result& r) {
  nlohmann::ordered_json j;
  j["dump_dir"] = r.dump_dir;
  j["function_name"] = r.function_name;
  j["module"] = r.module;
  j["status"] = replay::status_name(r.status);
  j["incomplete"] = r.incomplete;
  if (!r.error.empty()) j["error"] = r.error;
  j["device"] = r.ran_on.str();
  if (!r.note.empty()) j["note"] = r.note;
  nlohmann::ordered_json cs = nlohmann::ordered_json::array();
  for (const auto& c : r.comparisons) {
    nlohmann::ordered_json x;
    x["key"] = c.key;
    x["match"] = c.match;
    if (!c.problem.empty()) x["problem"] = c.problem;
    x["mismatches"] = c.mismatches;
    x["numel"] = c.numel;
    x["first_mismatch"] = c.first_mismatch;
    x["max_abs_error"] = c.max_abs_error;
    x["max_rel_error"] = c.max_rel_error;
    x["rtol"] = c.rtol;
    x["atol"] = c.atol;
    cs.push_back(x);
  }
  j["comparisons"] = cs;
  return j;
}

// -v: the rebuilt arguments, one per line.
void print_arguments(const replay::Result& r) {
  for (std::size_t i = 0; i < r.args.size(); ++i) {
    std::string v = r.args[i].repr();
    if (v.size() > 100) v = v.substr(0, 97) + "...";
    std::printf("    arg[%zu] = %s\n", i, v.c_str());
  }
}

int run_replay(const ReplayArgs& a) {
  const Device device = Device::parse(a.device);
  const std::optional<double> rtol = a.rtol >= 0 ? std::optional<double>(a.rtol) : std::nullopt;
  const std::optional<double> atol = a.atol >= 0 ? std::optional<double>(a.atol) : std::nullopt;
  if (!fs::is_directory(a.dir)) {
    if (a.json) {
      std::printf("{\"error\": \"directory not found\", \"dir\": %s}\n",
                  nlohmann::json(a.dir).dump().c_str());
    } else {
      std::printf("❌ Directory not found: %s\n", a.dir.c_str());
    }
    return 2;
  }
  if (fs::exists(fs::path(a.dir) / schema::kMetadataFile)) {
    replay::Options o;
    o.device = device;
    o.rtol = rtol;
    o.atol = atol;
    replay::ObjectRegistry reg;
    o.registry = &reg;
    if (!a.json) std::printf("Replaying single dump from %s...\n", a.dir.c_str());
    const replay::Result r = replay::replay_from_dump(a.dir, o);
    if (a.json) {
      nlohmann::ordered_json j;
      j["mode"] = "single";
      j["results"] = nlohmann::ordered_json::array({result_json(r)});
      j["passed"] = r.status == replay::Status::kPassed ? 1 : 0;
      j["failed"] = r.status == replay::Status::kPassed ? 0 : 1;
      std::printf("%s\n", j.dump(2).c_str());
      return r.status == replay::Status::kPassed ? 0 : 1;
    }
    if (a.verbose) print_arguments(r);
    if (!r.note.empty()) std::printf("ℹ️  %s\n", r.note.c_str());
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
  // Session mode. The filters select which calls are reported (every call still runs, so the
  // wrappers a selected call needs are rebuilt).
  recorder::Config filter;
  filter.include = a.include;
  filter.exclude = a.exclude;
  const bool tty = !a.json && ::isatty(STDOUT_FILENO);
  if (!a.json) std::printf("Replaying session from %s...\n", a.dir.c_str());
  const std::size_t total = formats::call_directories(a.dir, schema::kMetadataFile).size();
  std::size_t done = 0;
  replay::SequenceOptions so;
  so.device = device;
  so.rtol = rtol;
  so.atol = atol;
  so.on_progress = [&](const replay::Result&) {
    ++done;
    if (tty) {
      std::fprintf(stderr, "\r  %zu/%zu calls replayed", done, total);
      std::fflush(stderr);
    }
  };
  const auto results = replay::replay_sequence(a.dir, so);
  if (tty) std::fprintf(stderr, "\r%*s\r", 40, "");
  int passed = 0, failed = 0, first_bad = -1;
  nlohmann::ordered_json js = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    if (!r.function_name.empty() && !recorder::should_dump(filter, r.function_name)) continue;
    const std::string name = fs::path(r.dump_dir).filename().string();
    const int n = static_cast<int>(i) + 1;
    const bool ok = r.status == replay::Status::kPassed;
    ok ? ++passed : ++failed;
    if (!ok && first_bad < 0) first_bad = static_cast<int>(i);
    if (a.json) {
      js.push_back(result_json(r));
      continue;
    }
    if (!r.note.empty()) std::printf("[%d] %s: ℹ️  %s\n", n, name.c_str(), r.note.c_str());
    switch (r.status) {
      case replay::Status::kPassed:
        std::printf("[%d] %s (%s): ✅ Passed\n", n, r.function_name.c_str(), name.c_str());
        break;
      case replay::Status::kError:
        std::printf("[%d] %s: ❌ Error: %s\n", n, name.c_str(), r.error.c_str());
        break;
      case replay::Status::kIncomplete:
        std::printf("[%d] %s (%s): 💥 Incomplete: the recorded process died inside this call\n", n,
                    r.function_name.c_str(), name.c_str());
        break;
      default:
        std::printf("[%d] %s (%s): ⚠️  Mismatch\n", n, r.function_name.c_str(), name.c_str());
        print_details(r, "    ");
        break;
    }
    if (a.verbose) print_arguments(r);
  }
  if (a.json) {
    nlohmann::ordered_json j;
    j["mode"] = "session";
    j["dir"] = a.dir;
    j["results"] = js;
    j["passed"] = passed;
    j["failed"] = failed;
    std::printf("%s\n", j.dump(2).c_str());
    return failed == 0 ? 0 : 1;
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
    m = replay::read_metadata((d / schema::kMetadataFile).string());
  } catch (const std::exception& e) {
    std::printf("[%d] %s: unreadable: %s\n", index, d.filename().string().c_str(), e.what());
    return;
  }
  const auto j = nlohmann::ordered_json::parse(m.json);
  std::printf(
      "[%d] %s  %s  (%s)\n", index, j.value(std::string(schema::kFunctionName), "?").c_str(),
      m.completed ? "completed" : "INCOMPLETE (inputs only)", d.filename().string().c_str());
  const std::string details_key(schema::kTensorDetails);
  if (j.contains(details_key) && j[details_key].is_object()) {
    for (auto it = j[details_key].begin(); it != j[details_key].end(); ++it) {
      const auto& t = it.value();
      const std::string shape_key(schema::kShape);
      std::printf("      %-22s %s %s\n", it.key().c_str(),
                  t.value(std::string(schema::kDType), "?").c_str(),
                  t.contains(shape_key) ? t[shape_key].dump().c_str() : "?");
    }
  }
  const std::string im_key(schema::kInputMetadata);
  if (j.contains(im_key) && j[im_key].is_object()) {
    for (auto it = j[im_key].begin(); it != j[im_key].end(); ++it) {
      std::string v = it.value().dump();
      if (v.size() > 70) v = v.substr(0, 67) + "...";
      std::printf("      %-22s %s\n", it.key().c_str(), v.c_str());
    }
  }
}

uint64_t dir_bytes(const fs::path& d) {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(d, ec)) {
    if (e.is_regular_file(ec)) n += e.file_size(ec);
  }
  return n;
}

int run_show(const std::string& dir, bool verbose) {
  const fs::path p(dir);
  if (!fs::is_directory(p)) {
    std::printf("❌ Directory not found: %s\n", dir.c_str());
    return 2;
  }
  if (fs::exists(p / schema::kMetadataFile)) {
    show_call(p, 1);
    return 0;
  }
  // Symlinked call directories pointing out of the dump root are not followed.
  std::vector<fs::path> dirs = formats::call_directories(p, schema::kMetadataFile);
  std::sort(dirs.begin(), dirs.end());
  // The seed page's "Scanning Session History", built in.
  std::map<std::string, int> completed_by_fn;
  std::vector<std::pair<std::string, std::string>> incomplete;  // function, directory
  std::vector<std::pair<std::string, std::string>> unflushed;   // captured, never flushed
  int completed = 0;
  for (const auto& d : dirs) {
    try {
      const auto m = replay::read_metadata((d / schema::kMetadataFile).string());
      const auto j = nlohmann::ordered_json::parse(m.json);
      const std::string fn = j.value(std::string(schema::kFunctionName), "?");
      if (m.completed) {
        ++completed;
        ++completed_by_fn[fn];
      } else if (m.graph_pending) {
        unflushed.emplace_back(fn, d.filename().string());
      } else {
        incomplete.emplace_back(fn, d.filename().string());
      }
    } catch (const std::exception& e) {
      incomplete.emplace_back("<unreadable record>", d.filename().string());
    }
  }
  std::printf("Session %s: %zu recorded calls, %s on disk\n", dir.c_str(), dirs.size(),
              fmt_bytes(dir_bytes(p)).c_str());
  // This library's extensions: the dedup tensor store and a ring dump's trigger.
  if (fs::is_directory(p / formats::kDedupDir)) {
    int blobs = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(p / formats::kDedupDir, ec)) {
      if (e.path().extension() == formats::kDedupBlobSuffix) ++blobs;
    }
    std::printf("Tensor store (FLASHINFER_DUMP_DEDUP): %d distinct tensors, %s\n", blobs,
                fmt_bytes(dir_bytes(p / formats::kDedupDir)).c_str());
  }
  if (fs::exists(p / schema::kTriggerFile)) {
    try {
      const auto t = nlohmann::ordered_json::parse(formats::read_regular_file(
          (p / schema::kTriggerFile).string(), formats::kMaxMetadataFileBytes, "show"));
      std::string call = "none";
      if (t.contains("triggering_call") && t["triggering_call"].is_object()) {
        const auto& c = t["triggering_call"];
        call = c.value(std::string(schema::kFunctionName), "?") + " (" +
               fs::path(c.value(std::string(schema::kDumpDir), "")).filename().string() + ")";
      }
      std::printf("Ring dump: trigger %s, triggering call %s\n",
                  t.value("reason", std::string("?")).c_str(), call.c_str());
    } catch (const std::exception& e) {
      std::printf("Ring dump: unreadable trigger.json: %s\n", e.what());
    }
  }
  std::printf("Total completed calls: %d\n", completed);
  std::vector<std::pair<std::string, int>> by(completed_by_fn.begin(), completed_by_fn.end());
  std::stable_sort(by.begin(), by.end(),
                   [](const auto& x, const auto& y) { return x.second > y.second; });
  std::printf("\nCalls by function:\n");
  for (const auto& [fn, n] : by) std::printf("  %s: %d\n", fn.c_str(), n);
  if (!incomplete.empty()) {
    std::printf("\n⚠️  Found %zu incomplete calls (potential crashes):\n", incomplete.size());
    for (const auto& [fn, d] : incomplete) std::printf("  - %s at %s\n", fn.c_str(), d.c_str());
  }
  if (!unflushed.empty()) {
    std::printf(
        "\nFound %zu calls captured into a CUDA graph whose tensors were never written "
        "(flush_graph_dumps() was not called after launching the graph):\n",
        unflushed.size());
    for (const auto& [fn, d] : unflushed) std::printf("  - %s at %s\n", fn.c_str(), d.c_str());
  }
  if (verbose) {
    std::printf("\nCalls:\n");
    for (std::size_t i = 0; i < dirs.size(); ++i) show_call(dirs[i], static_cast<int>(i) + 1);
  }
  return 0;
}

}  // namespace

Command replay_command() {
  return {
      "replay",
      "Re-run recorded calls (a session or one call directory) and compare with the recording",
      [](CLI::App& sub) {
        auto a = std::make_shared<ReplayArgs>();
        sub.add_option("--dir", a->dir, "Dump directory: a session root or one call")->required();
        sub.add_option("--device", a->device, "Where to run: cpu (the reference) or cuda[:N]");
        sub.add_option("--rtol", a->rtol,
                       "Relative tolerance for every dtype (default: per dtype)");
        sub.add_option("--atol", a->atol,
                       "Absolute tolerance for every dtype (default: per dtype)");
        sub.add_option("--include", a->include,
                       "Report only calls matching these fnmatch patterns (all still run)")
            ->delimiter(',');
        sub.add_option("--exclude", a->exclude, "Do not report calls matching these patterns")
            ->delimiter(',');
        sub.add_flag("--json", a->json, "Print a machine-readable JSON report instead");
        sub.add_flag("-v,--verbose", a->verbose, "Also print each call's rebuilt arguments");
        sub.footer(
            "Exit status: 0 when every reported call passed, 1 when one failed, "
            "mismatched or errored, 2 when the directory does not exist.");
        return std::function<int()>([a] { return run_replay(*a); });
      }};
}

Command show_command() {
  return {
      "show",
      "Summarize a dump: calls per function, incomplete (crashed) calls, size; -v lists each call",
      [](CLI::App& sub) {
        auto dir = std::make_shared<std::string>();
        auto verbose = std::make_shared<bool>(false);
        auto pos = std::make_shared<std::string>();
        sub.add_option("--dir", *dir, "Dump directory: a session root or one call");
        sub.add_option("dir_positional", *pos, "Same as --dir");
        sub.add_flag("-v,--verbose", *verbose, "List every call with its tensors and arguments");
        return std::function<int()>([dir, pos, verbose] {
          const std::string d = dir->empty() ? *pos : *dir;
          if (d.empty()) throw CLI::RequiredError("--dir");
          return run_show(d, *verbose);
        });
      }};
}

}  // namespace flashinfer::cli
