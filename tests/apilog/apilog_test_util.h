// Helpers shared by the API logging tests: a capturing sink, text normalization, and the
// expected-text building blocks of upstream's format.
#pragma once

#include <mutex>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/api_log.h"

namespace apilog_test {

inline const std::string kEq(80, '=');
inline const std::string kDash(80, '-');

inline bool is_banner(std::string_view rec) {
  return rec.find("] FlashInfer API Logging - System Information\n") != std::string_view::npos;
}

/// Timestamps -> "[TS]", object addresses -> "0xADDR": the only run-dependent text.
inline std::string normalize(const std::string& text) {
  static const std::regex ts(R"(\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\])");
  static const std::regex addr("0x[0-9a-f]+");
  return std::regex_replace(std::regex_replace(text, ts, "[TS]"), addr, "0xADDR");
}

inline std::size_t count_of(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

/// Input-record header for `name`, as upstream writes it.
inline std::string header(const std::string& name) {
  return kEq + "\n[TS] FlashInfer API Call: " + name + "\n" + kDash + "\n";
}
/// Output record for a value already formatted at indent 1.
inline std::string output(const std::string& formatted) {
  return "Output value:\n" + formatted + "\n" + kEq + "\n\n";
}

/// The banner as this build writes it on a machine without GPUs.
inline std::string expected_banner_no_gpu(const std::string& version, const std::string& cuda) {
  return kEq + "\n[TS] FlashInfer API Logging - System Information\n" + kEq +
         "\nFlashInfer version: " + version + "\nCUDA toolkit version: " +
         (cuda.empty() ? std::string("<unavailable - CPU-only build?>") : cuda) +
         "\ncuDNN version: <not available>\nCUDA: Not available (CPU-only mode)\n" + kEq + "\n\n";
}

/// Installs a sink that keeps every record except the banner (which comes once per process, to
/// whichever test enables logging first).
class RecordCapture {
 public:
  RecordCapture() {
    flashinfer::api_log::set_sink([this](std::string_view rec) {
      std::lock_guard<std::mutex> lock(mu_);
      if (is_banner(rec)) {
        ++banners_;
      } else {
        records_.emplace_back(rec);
      }
    });
  }
  ~RecordCapture() { flashinfer::api_log::set_sink({}); }
  RecordCapture(const RecordCapture&) = delete;
  RecordCapture& operator=(const RecordCapture&) = delete;

  std::vector<std::string> records() {
    std::lock_guard<std::mutex> lock(mu_);
    return records_;
  }
  /// Every record, normalized, concatenated.
  std::string text() {
    std::string s;
    for (const auto& r : records()) s += r;
    return normalize(s);
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    records_.clear();
  }

 private:
  std::mutex mu_;
  std::vector<std::string> records_;
  int banners_ = 0;
};

}  // namespace apilog_test
