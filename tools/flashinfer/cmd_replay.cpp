// `flashinfer replay` and `flashinfer show`: re-run recorded calls, or print what a dump holds.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "commands.h"
#include "escape.h"
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
      std::printf("%s%s: %s\n", indent, terminal_text(c.key).c_str(),
                  terminal_text(c.problem).c_str());
    } else {
      std::printf(
          "%s%s: %lld of %lld elements differ (max abs error %s, max rel error %s, first "
          "at flat index %lld; rtol %s, atol %s)\n",
          indent, terminal_text(c.key).c_str(), static_cast<long long>(c.mismatches),
          static_cast<long long>(c.numel), fmt_g(c.max_abs_error).c_str(),
          fmt_g(c.max_rel_error).c_str(), static_cast<long long>(c.first_mismatch),
          fmt_g(c.rtol).c_str(), fmt_g(c.atol).c_str());
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

// A path as one shell word: as is when it is made of safe characters, else single-quoted.
std::string shell_word(const std::string& s) {
  const bool safe = !s.empty() && s.find_first_not_of(
                                      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                      "0123456789_./-+:,=@%") == std::string::npos;
  if (safe) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A recording below a folder that holds no call itself: a folder of call directories, e.g. a
// ring dump <DUMP_DIR>/ring_pid<PID>_dump<NNNN>_<reason>/ (the trigger that wrote it in
// `trigger`), or a whole dump directory moved under another folder.
struct Recording {
  fs::path dir;
  std::size_t calls = 0;
  std::string trigger;  // trigger.json's reason; empty when not a ring dump
};

// The recordings up to three levels below `root` (not `root` itself), sorted; the subfolders of
// a recording or of a call are not searched, hidden folders (the recorder's .prealloc_pid*) are
// skipped and folder links are not followed.
std::vector<Recording> recordings_below(const fs::path& root) {
  std::vector<Recording> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(root, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& e = *it;
    std::error_code ec2;
    if (e.is_symlink(ec2) || !e.is_directory(ec2) || ec2 ||
        e.path().filename().string().starts_with(".") ||
        fs::exists(e.path() / schema::kMetadataFile, ec2)) {
      // A call directory is not searched (its graph_flushes/ snapshots are not recordings).
      it.disable_recursion_pending();
      continue;
    }
    const auto calls = formats::call_directories(e.path(), schema::kMetadataFile);
    if (!calls.empty()) {
      Recording r{e.path(), calls.size(), {}};
      if (fs::exists(e.path() / schema::kTriggerFile, ec2)) {
        try {
          const auto t = nlohmann::ordered_json::parse(formats::read_regular_file(
              (e.path() / schema::kTriggerFile).string(), formats::kMaxMetadataFileBytes, "show"));
          r.trigger = t.value("reason", std::string("?"));
        } catch (const std::exception&) {
          r.trigger = "? (unreadable trigger.json)";
        }
      }
      out.push_back(std::move(r));
      it.disable_recursion_pending();
    } else if (it.depth() >= 2) {
      it.disable_recursion_pending();
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Recording& a, const Recording& b) { return a.dir < b.dir; });
  return out;
}

std::string open_command(const char* verb, const fs::path& dir) {
  return shell_word(invoked_as()) + " " + verb + " --dir " + shell_word(dir.string());
}

// The recordings below a folder and the command lines that open each.
void print_recordings(const std::vector<Recording>& rs) {
  for (const Recording& r : rs) {
    std::printf("  %s: %zu recorded calls", terminal_text(r.dir.string()).c_str(), r.calls);
    if (!r.trigger.empty()) {
      std::printf(", a ring dump written on trigger '%s'", terminal_text(r.trigger).c_str());
    }
    std::printf(", %s on disk\n", fmt_bytes(dir_bytes(r.dir)).c_str());
    std::printf("    show:   %s\n", terminal_text(open_command("show", r.dir)).c_str());
    std::printf("    replay: %s\n", terminal_text(open_command("replay", r.dir)).c_str());
  }
}

nlohmann::ordered_json recordings_json(const std::vector<Recording>& rs) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const Recording& r : rs) {
    nlohmann::ordered_json x;
    x["dir"] = json_text(r.dir.string());
    x["calls"] = r.calls;
    if (!r.trigger.empty()) x["trigger"] = json_text(r.trigger);
    x["show"] = json_text(open_command("show", r.dir));
    x["replay"] = json_text(open_command("replay", r.dir));
    a.push_back(x);
  }
  return a;
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
  j["dump_dir"] = json_text(r.dump_dir);
  j["function_name"] = json_text(r.function_name);
  j["module"] = json_text(r.module);
  j["status"] = replay::status_name(r.status);
  j["incomplete"] = r.incomplete;
  j["write_failed"] = r.write_failed;
  if (!r.error.empty()) j["error"] = json_text(r.error);
  j["device"] = r.ran_on.str();
  if (!r.note.empty()) j["note"] = json_text(r.note);
  nlohmann::ordered_json cs = nlohmann::ordered_json::array();
  for (const auto& c : r.comparisons) {
    nlohmann::ordered_json x;
    x["key"] = json_text(c.key);
    x["match"] = c.match;
    if (!c.problem.empty()) x["problem"] = json_text(c.problem);
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
    std::printf("    arg[%zu] = %s\n", i, terminal_text(v).c_str());
  }
}

// Every JSON report goes out through here: strings were made UTF-8 by json_text(); should one
// still not be, it is replaced rather than the report lost.
void print_json(const nlohmann::ordered_json& j) {
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

int run_replay(const ReplayArgs& a) {
  const Device device = Device::parse(a.device);
  const std::optional<double> rtol = a.rtol >= 0 ? std::optional<double>(a.rtol) : std::nullopt;
  const std::optional<double> atol = a.atol >= 0 ? std::optional<double>(a.atol) : std::nullopt;
  if (!fs::is_directory(a.dir)) {
    if (a.json) {
      print_json({{"error", "directory not found"}, {"dir", json_text(a.dir)}});
    } else {
      std::printf("❌ Directory not found: %s\n", terminal_text(a.dir).c_str());
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
    if (!a.json) std::printf("Replaying single dump from %s...\n", terminal_text(a.dir).c_str());
    const replay::Result r = replay::replay_from_dump(a.dir, o);
    if (a.json) {
      nlohmann::ordered_json j;
      j["mode"] = "single";
      j["results"] = nlohmann::ordered_json::array({result_json(r)});
      j["passed"] = r.status == replay::Status::kPassed ? 1 : 0;
      j["failed"] = r.status == replay::Status::kPassed ? 0 : 1;
      print_json(j);
      return r.status == replay::Status::kPassed ? 0 : 1;
    }
    if (a.verbose) print_arguments(r);
    if (!r.note.empty()) std::printf("ℹ️  %s\n", terminal_text(r.note).c_str());
    switch (r.status) {
      case replay::Status::kPassed:
        std::printf("✅ Replay passed (outputs matched)\n");
        return 0;
      case replay::Status::kError:
        std::printf("❌ Execution failed: %s\n", terminal_text(r.error).c_str());
        return 1;
      case replay::Status::kIncomplete:
        if (r.write_failed) {
          std::printf(
              "💾 Outputs not on record: the recording process failed to write them (not a "
              "crash); it was re-run here and completed\n");
          return 1;
        }
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
  const std::size_t total = formats::call_directories(a.dir, schema::kMetadataFile).size();
  if (total == 0) {
    // Nothing to replay is not a pass: a wrong --dir must not look like a clean session. A
    // folder with recordings below it (FLASHINFER_DUMP_DIR holding ring dumps) names them and
    // the command that replays each.
    const std::vector<Recording> below = recordings_below(a.dir);
    if (a.json) {
      nlohmann::ordered_json j = {{"error", "no recorded calls"}, {"dir", json_text(a.dir)}};
      if (!below.empty()) j["recordings_below"] = recordings_json(below);
      print_json(j);
    } else if (below.empty()) {
      std::printf("❌ No recorded calls in %s, nor in any folder below it\n",
                  terminal_text(a.dir).c_str());
    } else {
      std::printf(
          "❌ No recorded calls in %s itself; nothing replayed. It holds %zu recording%s: "
          "replay one with the command under it.\n",
          terminal_text(a.dir).c_str(), below.size(), below.size() == 1 ? "" : "s");
      print_recordings(below);
    }
    return 2;
  }
  if (!a.json) std::printf("Replaying session from %s...\n", terminal_text(a.dir).c_str());
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
    const std::string name = terminal_text(fs::path(r.dump_dir).filename().string());
    const std::string fn = terminal_text(r.function_name);
    const int n = static_cast<int>(i) + 1;
    const bool ok = r.status == replay::Status::kPassed;
    ok ? ++passed : ++failed;
    if (!ok && first_bad < 0) first_bad = static_cast<int>(i);
    if (a.json) {
      js.push_back(result_json(r));
      continue;
    }
    if (!r.note.empty()) {
      std::printf("[%d] %s: ℹ️  %s\n", n, name.c_str(), terminal_text(r.note).c_str());
    }
    switch (r.status) {
      case replay::Status::kPassed:
        std::printf("[%d] %s (%s): ✅ Passed\n", n, fn.c_str(), name.c_str());
        break;
      case replay::Status::kError:
        std::printf("[%d] %s: ❌ Error: %s\n", n, name.c_str(), terminal_text(r.error).c_str());
        break;
      case replay::Status::kIncomplete:
        if (r.write_failed) {
          std::printf("[%d] %s (%s): 💾 Outputs not on record: writing them failed\n", n, fn.c_str(),
                      name.c_str());
          break;
        }
        std::printf("[%d] %s (%s): 💥 Incomplete: the recorded process died inside this call\n", n,
                    fn.c_str(), name.c_str());
        break;
      default:
        std::printf("[%d] %s (%s): ⚠️  Mismatch\n", n, fn.c_str(), name.c_str());
        print_details(r, "    ");
        break;
    }
    if (a.verbose) print_arguments(r);
  }
  if (a.json) {
    nlohmann::ordered_json j;
    j["mode"] = "session";
    j["dir"] = json_text(a.dir);
    j["results"] = js;
    j["passed"] = passed;
    j["failed"] = failed;
    print_json(j);
    return failed == 0 ? 0 : 1;
  }
  std::printf("\nSummary: %d passed, %d failed/mismatch\n", passed, failed);
  if (first_bad >= 0) {
    const auto& r = results[first_bad];
    std::printf("First divergence: [%d] %s (%s)\n", first_bad + 1,
                r.function_name.empty() ? "?" : terminal_text(r.function_name).c_str(),
                terminal_text(fs::path(r.dump_dir).filename().string()).c_str());
  }
  return failed == 0 ? 0 : 1;
}

// A string member of a record, or `fallback` when absent; a member of another type makes the
// record malformed (the caller reports it and goes on).
std::string str_member(const nlohmann::ordered_json& j, const std::string& key,
                       const char* fallback = "?") {
  const auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_string()) {
    throw std::runtime_error("'" + key + "' is a " + it->type_name() + ", not a string");
  }
  return it->get<std::string>();
}

void show_call(const fs::path& d, int index) {
  const std::string name = terminal_text(d.filename().string());
  try {
    const replay::MetadataRecord m = replay::read_metadata((d / schema::kMetadataFile).string());
    const auto j = nlohmann::ordered_json::parse(m.json);
    if (!j.is_object()) throw std::runtime_error("the record is not a JSON object");
    const char* state = m.completed       ? "completed"
                        : m.write_failed  ? "OUTPUTS NOT WRITTEN (write failed)"
                        : m.graph_pending ? "GRAPH CAPTURE NOT FLUSHED"
                                          : "INCOMPLETE (inputs only)";
    std::string lines;
    auto label = [](const std::string& key) {  // "      %-22s "
      std::string l = "      " + terminal_text(key);
      if (l.size() < 28) l.resize(28, ' ');
      return l + " ";
    };
    const std::string details_key(schema::kTensorDetails);
    if (j.contains(details_key) && j[details_key].is_object()) {
      for (auto it = j[details_key].begin(); it != j[details_key].end(); ++it) {
        const auto& t = it.value();
        if (!t.is_object()) throw std::runtime_error("a tensor_details entry is not an object");
        const std::string shape_key(schema::kShape);
        lines += label(it.key()) + terminal_text(str_member(t, std::string(schema::kDType))) + " " +
                 (t.contains(shape_key) ? terminal_text(t[shape_key].dump()) : "?") + "\n";
      }
    }
    const std::string im_key(schema::kInputMetadata);
    if (j.contains(im_key) && j[im_key].is_object()) {
      for (auto it = j[im_key].begin(); it != j[im_key].end(); ++it) {
        std::string v = it.value().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        if (v.size() > 70) v = v.substr(0, 67) + "...";
        lines += label(it.key()) + terminal_text(v) + "\n";
      }
    }
    std::printf("[%d] %s  %s  (%s)\n%s", index,
                terminal_text(str_member(j, std::string(schema::kFunctionName))).c_str(), state,
                name.c_str(), lines.c_str());
    if (m.write_failed && !m.write_error.empty()) {
      std::printf("      write error: %s\n", terminal_text(m.write_error).c_str());
    }
  } catch (const std::exception& e) {
    // One bad record does not end the listing.
    std::printf("[%d] %s: malformed record: %s\n", index, name.c_str(),
                terminal_text(e.what()).c_str());
  }
}

int run_show(const std::string& dir, bool verbose) {
  const fs::path p(dir);
  if (!fs::is_directory(p)) {
    std::printf("❌ Directory not found: %s\n", terminal_text(dir).c_str());
    return 2;
  }
  if (fs::exists(p / schema::kMetadataFile)) {
    show_call(p, 1);
    return 0;
  }
  // Symlinked call directories pointing out of the dump root are not followed.
  std::vector<fs::path> dirs = formats::call_directories(p, schema::kMetadataFile);
  std::sort(dirs.begin(), dirs.end());
  const std::vector<Recording> below = recordings_below(p);
  if (dirs.empty()) {
    // A dump root holding ring dumps (or any folder with recordings below it): what is there
    // and how to open each, not "0 recorded calls".
    if (below.empty()) {
      std::printf("❌ No recorded calls in %s, nor in any folder below it\n",
                  terminal_text(dir).c_str());
      return 2;
    }
    std::printf("%s holds no call itself; %zu recording%s below it:\n", terminal_text(dir).c_str(),
                below.size(), below.size() == 1 ? "" : "s");
    print_recordings(below);
    return 0;
  }
  // The seed page's "Scanning Session History", built in.
  std::map<std::string, int> completed_by_fn;
  std::vector<std::pair<std::string, std::string>> incomplete;  // function, directory
  std::vector<std::pair<std::string, std::string>> unflushed;   // captured, never flushed
  std::vector<std::pair<std::string, std::string>> unwritten;   // outputs' write failed
  std::vector<std::pair<std::string, std::string>> malformed;   // directory, why
  int completed = 0;
  for (const auto& d : dirs) {
    const std::string name = terminal_text(d.filename().string());
    try {
      const auto m = replay::read_metadata((d / schema::kMetadataFile).string());
      const auto j = nlohmann::ordered_json::parse(m.json);
      if (!j.is_object()) throw std::runtime_error("the record is not a JSON object");
      const std::string fn = terminal_text(str_member(j, std::string(schema::kFunctionName)));
      if (m.completed) {
        ++completed;
        ++completed_by_fn[fn];
      } else if (m.graph_pending) {
        unflushed.emplace_back(fn, name);
      } else if (m.write_failed) {
        unwritten.emplace_back(fn, name);
      } else {
        incomplete.emplace_back(fn, name);
      }
    } catch (const std::exception& e) {
      malformed.emplace_back(name, terminal_text(e.what()));
    }
  }
  std::printf("Session %s: %zu recorded calls, %s on disk\n", terminal_text(dir).c_str(),
              dirs.size(), fmt_bytes(dir_bytes(p)).c_str());
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
                  terminal_text(t.value("reason", std::string("?"))).c_str(),
                  terminal_text(call).c_str());
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
  if (!unwritten.empty()) {
    std::printf(
        "\nFound %zu calls whose outputs could not be written (a write failure such as a full "
        "disk, not a crash):\n",
        unwritten.size());
    for (const auto& [fn, d] : unwritten) std::printf("  - %s at %s\n", fn.c_str(), d.c_str());
  }
  if (!malformed.empty()) {
    std::printf("\nFound %zu malformed records (not readable as calls):\n", malformed.size());
    for (const auto& [d, why] : malformed) std::printf("  - %s: %s\n", d.c_str(), why.c_str());
  }
  if (!unflushed.empty()) {
    std::printf(
        "\nFound %zu calls captured into a CUDA graph whose tensors were never written "
        "(flush_graph_dumps() was not called after launching the graph):\n",
        unflushed.size());
    for (const auto& [fn, d] : unflushed) std::printf("  - %s at %s\n", fn.c_str(), d.c_str());
  }
  if (!below.empty()) {
    std::printf("\nAlso %zu recording%s in folders below it:\n", below.size(),
                below.size() == 1 ? "" : "s");
    print_recordings(below);
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
      [](Args& sub) {
        auto a = std::make_shared<ReplayArgs>();
        sub.add_option("--dir", a->dir, "Dump directory: a session root or one call").required();
        sub.add_option("--device", a->device, "Where to run: cpu (the reference) or cuda[:N]");
        sub.add_option("--rtol", a->rtol,
                       "Relative tolerance for every dtype (default: per dtype)");
        sub.add_option("--atol", a->atol,
                       "Absolute tolerance for every dtype (default: per dtype)");
        sub.add_option("--include", a->include,
                       "Report only calls matching these fnmatch patterns (all still run)")
            .delimiter(',');
        sub.add_option("--exclude", a->exclude, "Do not report calls matching these patterns")
            .delimiter(',');
        sub.add_flag("--json", a->json, "Print a machine-readable JSON report instead");
        sub.add_flag("-v,--verbose", a->verbose, "Also print each call's rebuilt arguments");
        sub.footer(
            "Exit status: 0 when every reported call passed, 1 when one failed, "
            "mismatched or errored, 2 when the directory does not exist or holds no call (a "
            "folder with recordings below it, such as a dump directory of ring dumps, lists "
            "them with the command that replays each).");
        return std::function<int()>([a] { return run_replay(*a); });
      }};
}

Command show_command() {
  return {
      "show",
      "Summarize a dump: calls per function, incomplete (crashed) calls, size; -v lists each call",
      [](Args& sub) {
        auto dir = std::make_shared<std::string>();
        auto verbose = std::make_shared<bool>(false);
        auto pos = std::make_shared<std::string>();
        sub.add_option("--dir", *dir, "Dump directory: a session root or one call");
        sub.add_option("dir_positional", *pos, "Same as --dir");
        sub.add_flag("-v,--verbose", *verbose, "List every call with its tensors and arguments");
        sub.footer(
            "A folder with no call of its own but recordings below it (a dump directory of "
            "ring dumps ring_pid<PID>_dump<NNNN>_<reason>/) lists them with the commands that "
            "show and replay each. Exit status: 0, or 2 when the folder does not exist or holds "
            "no recorded call at any level.");
        return std::function<int()>([dir, pos, verbose] {
          const std::string d = dir->empty() ? *pos : *dir;
          if (d.empty()) throw_required("--dir");
          return run_show(d, *verbose);
        });
      }};
}

}  // namespace flashinfer::cli
