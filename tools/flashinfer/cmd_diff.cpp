// `flashinfer diff A B`: compares two recordings call by call and names the call where they
// diverge (replay_diff.h does the work).
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "flashinfer/error.h"
#include "flashinfer/replay_diff.h"

namespace flashinfer::cli {

namespace fs = std::filesystem;

namespace {

using Json = nlohmann::ordered_json;

// JSON strings must be UTF-8; a directory name or tensor key may hold any bytes. Valid UTF-8
// passes through (control characters are escaped by the JSON writer); each byte that is not
// part of a valid sequence becomes the text \xNN, so nothing is lost and the output parses.
std::string utf8_safe(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = c < 0x80           ? 1
                      : (c >> 5) == 0x6  ? 2
                      : (c >> 4) == 0xE  ? 3
                      : (c >> 3) == 0x1E ? 4
                                         : 0;
    bool ok = len > 0 && i + len <= s.size();
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (std::size_t k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc >> 6) == 0x2;
      cp = (cp << 6) | (cc & 0x3Fu);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid too.
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
               (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)) {
      ok = false;
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02X", c);
      out += b;
      ++i;
    }
  }
  return out;
}

std::string fmt_g(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3g", v);
  return b;
}

std::string call_name(const fs::path& dir) { return dir.filename().string(); }

Json tensor_json(const replay::TensorDiff& t) {
  const auto& c = t.comparison;
  Json j;
  j["side"] = t.side;
  j["key"] = utf8_safe(c.key);
  j["match"] = c.match;
  j["identical"] = t.identical;
  if (!c.problem.empty()) j["problem"] = utf8_safe(c.problem);
  j["mismatches"] = c.mismatches;
  j["numel"] = c.numel;
  j["first_mismatch"] = c.first_mismatch;
  j["max_abs_error"] = c.max_abs_error;
  j["max_rel_error"] = c.max_rel_error;
  j["max_ulp_error"] = t.max_ulp_error;
  j["rtol"] = c.rtol;
  j["atol"] = c.atol;
  return j;
}

Json call_json(const replay::CallDiff& c) {
  Json j;
  j["function_name"] = utf8_safe(c.function_name);
  j["index_a"] = c.index_a >= 0 ? Json(c.index_a + 1) : Json();  // 1-based, as replay prints
  j["index_b"] = c.index_b >= 0 ? Json(c.index_b + 1) : Json();
  j["dir_a"] = c.dir_a.empty() ? Json() : Json(utf8_safe(c.dir_a));
  j["dir_b"] = c.dir_b.empty() ? Json() : Json(utf8_safe(c.dir_b));
  j["inputs_equal"] = c.inputs_equal;
  j["outputs_equal"] = c.outputs_equal;
  j["incomplete"] = c.incomplete;
  if (!c.error.empty()) j["error"] = utf8_safe(c.error);
  Json ts = Json::array();
  for (const auto& t : c.tensors) {
    if (!t.identical) ts.push_back(tensor_json(t));
  }
  j["tensors"] = ts;  // the tensors that are not bit-identical
  Json vs = Json::array();
  for (const auto& v : c.values) {
    vs.push_back({{"side", v.side},
                  {"key", utf8_safe(v.key)},
                  {"a", v.a.empty() ? Json() : Json(utf8_safe(v.a))},
                  {"b", v.b.empty() ? Json() : Json(utf8_safe(v.b))}});
  }
  j["values"] = vs;
  return j;
}

std::string where(const replay::CallDiff& c) {
  std::string s = c.function_name;
  s += " (A #" + (c.index_a >= 0 ? std::to_string(c.index_a + 1) : std::string("-"));
  s += ", B #" + (c.index_b >= 0 ? std::to_string(c.index_b + 1) : std::string("-")) + ")";
  return s;
}

void print_call_details(const replay::CallDiff& c) {
  if (!c.dir_a.empty()) std::printf("    A: %s\n", call_name(c.dir_a).c_str());
  if (!c.dir_b.empty()) std::printf("    B: %s\n", call_name(c.dir_b).c_str());
  if (!c.error.empty()) std::printf("    unreadable: %s\n", c.error.c_str());
  for (const auto& t : c.tensors) {
    const auto& x = t.comparison;
    if (x.match) continue;
    if (!x.problem.empty()) {
      std::printf("    %s %s: %s\n", t.side.c_str(), x.key.c_str(), x.problem.c_str());
      continue;
    }
    std::printf(
        "    %s %s: %lld of %lld elements differ (max abs error %s, max ulp error %llu, first at "
        "flat index %lld; rtol %s, atol %s)\n",
        t.side.c_str(), x.key.c_str(), static_cast<long long>(x.mismatches),
        static_cast<long long>(x.numel), fmt_g(x.max_abs_error).c_str(),
        static_cast<unsigned long long>(t.max_ulp_error), static_cast<long long>(x.first_mismatch),
        fmt_g(x.rtol).c_str(), fmt_g(x.atol).c_str());
  }
  for (const auto& v : c.values) {
    std::printf("    %s %s: %s in A, %s in B\n", v.side.c_str(), v.key.c_str(),
                v.a.empty() ? "absent" : v.a.c_str(), v.b.empty() ? "absent" : v.b.c_str());
  }
}

struct DiffArgs {
  std::string a, b;
  double rtol = -1.0, atol = -1.0;
  bool json = false;
  bool verbose = false;
};

int run_diff(const DiffArgs& args) {
  for (const std::string* d : {&args.a, &args.b}) {
    if (std::error_code ec; !fs::is_directory(*d, ec)) {
      if (args.json) {
        std::printf("%s\n",
                    Json{{"error", "recording not found"}, {"dir", utf8_safe(*d)}}.dump(2).c_str());
      } else {
        std::fprintf(stderr, "flashinfer diff: recording not found: %s\n", d->c_str());
      }
      return 2;
    }
  }
  replay::DiffOptions o;
  if (args.rtol >= 0) o.rtol = args.rtol;
  if (args.atol >= 0) o.atol = args.atol;
  replay::DiffReport r;
  try {
    r = replay::diff_recordings(args.a, args.b, o);
  } catch (const Error& e) {
    if (args.json) {
      std::printf("%s\n", Json{{"error", utf8_safe(e.what())}}.dump(2).c_str());
    } else {
      std::fprintf(stderr, "flashinfer diff: %s\n", e.what());
    }
    return 2;
  }
  int matched = 0, only_a = 0, only_b = 0, differing = 0;
  for (const auto& c : r.calls) {
    if (c.matched()) {
      ++matched;
      if (!c.equal()) ++differing;
    } else {
      (c.index_a >= 0 ? only_a : only_b)++;
    }
  }
  const bool equal = r.equal();
  if (args.json) {
    Json j;
    j["a"] = utf8_safe(r.dir_a);
    j["b"] = utf8_safe(r.dir_b);
    j["equal"] = equal;
    j["calls_a"] = r.calls_a;
    j["calls_b"] = r.calls_b;
    j["matched"] = matched;
    j["differing"] = differing;
    j["first_diverging_call"] =
        r.first_diverging >= 0 ? call_json(r.calls[r.first_diverging]) : Json();
    j["first_input_difference"] =
        r.first_input_difference >= 0 ? call_json(r.calls[r.first_input_difference]) : Json();
    Json oa = Json::array(), ob = Json::array(), diffs = Json::array();
    for (const auto& c : r.calls) {
      if (!c.matched()) {
        (c.index_a >= 0 ? oa : ob).push_back(call_json(c));
      } else if (!c.equal()) {
        diffs.push_back(call_json(c));
      }
    }
    j["only_in_a"] = oa;
    j["only_in_b"] = ob;
    j["differences"] = diffs;
    std::printf("%s\n", j.dump(2).c_str());
    return equal ? 0 : 1;
  }
  std::printf("A: %s (%d calls)\nB: %s (%d calls)\n", r.dir_a.c_str(), r.calls_a, r.dir_b.c_str(),
              r.calls_b);
  std::printf("%d calls matched, %d differ; %d only in A, %d only in B\n", matched, differing,
              only_a, only_b);
  if (equal) {
    std::printf("✅ The recordings agree\n");
    return 0;
  }
  if (r.first_diverging >= 0) {
    std::printf("\nFirst diverging call (inputs agree, outputs differ): %s\n",
                where(r.calls[r.first_diverging]).c_str());
    print_call_details(r.calls[r.first_diverging]);
  } else {
    std::printf("\nNo call with equal inputs has different outputs\n");
  }
  if (r.first_input_difference >= 0) {
    std::printf("\nFirst call whose inputs differ: %s\n",
                where(r.calls[r.first_input_difference]).c_str());
    print_call_details(r.calls[r.first_input_difference]);
  }
  if (args.verbose) {
    std::printf("\nAll differing calls:\n");
    for (const auto& c : r.calls) {
      if (!c.matched() || c.equal()) continue;
      std::printf("  %s: %s\n", where(c).c_str(),
                  !c.error.empty()  ? "unreadable"
                  : !c.inputs_equal ? "inputs differ"
                  : c.incomplete    ? "incomplete on one side"
                                    : "outputs differ");
      print_call_details(c);
    }
  }
  if (only_a + only_b > 0) {
    std::printf("\nCalls only one recording has:\n");
    for (const auto& c : r.calls) {
      if (c.matched()) continue;
      const bool in_a = c.index_a >= 0;
      std::printf("  only in %s: #%d %s (%s)\n", in_a ? "A" : "B",
                  (in_a ? c.index_a : c.index_b) + 1, c.function_name.c_str(),
                  call_name(in_a ? c.dir_a : c.dir_b).c_str());
    }
  }
  std::printf("\n❌ The recordings diverge\n");
  return 1;
}

}  // namespace

Command diff_command() {
  return {"diff",
          "Compare two recordings call by call: the first call whose outputs differ for equal "
          "inputs, the first whose inputs differ",
          [](Args& sub) {
            auto a = std::make_shared<DiffArgs>();
            sub.add_option("A", a->a, "First recording: a session root or one call directory")
                .required();
            sub.add_option("B", a->b, "Second recording").required();
            sub.add_option("--rtol", a->rtol,
                           "Relative tolerance for every dtype (default: replay's per dtype)");
            sub.add_option("--atol", a->atol,
                           "Absolute tolerance for every dtype (default: replay's per dtype)");
            sub.add_flag("--json", a->json, "Print a machine-readable JSON report instead");
            sub.add_flag("-v,--verbose", a->verbose, "Also list every differing call");
            sub.footer(
                "Exit status: 0 when the recordings agree, 1 when they diverge (a call differs or "
                "only one recording has it), 2 on a usage error or an unreadable recording.");
            return std::function<int()>([a] { return run_diff(*a); });
          }};
}

}  // namespace flashinfer::cli
