// Private: the text of API log records, exactly as upstream FlashInfer writes them
// (flashinfer/api_logging.py, see reference/flashinfer-logging-format.md §2). Every record ends
// with the newline upstream's logging handler appends.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "flashinfer/op_decl.h"
#include "flashinfer/value.h"

namespace flashinfer::detail::apilog {

/// "2026-11-21 14:46:13": local time, seconds resolution.
std::string timestamp_now();

/// The once-per-process system banner (version, CUDA toolkit, GPUs).
std::string banner_record();
/// Level 1: "[ts] FlashInfer API Call: <name>\n".
std::string name_record(std::string_view op_name);
/// Levels 3/5, before the call: the header and the argument sections.
std::string input_record(const OpDecl& decl, std::span<const Value> args, int level);
/// Levels 3/5, after the call returned: "Output value:" and the closing separator.
std::string output_record(const Value& result, int level);

/// Appends `v` formatted at `indent` (2 spaces each) with upstream's rules; no trailing newline.
/// `level` >= 5 adds tensor statistics.
void format_value(std::string& out, const Value& v, int level, int indent);

/// Whether a floating tensor holds a NaN or an Inf, computed by the level-5 statistics
/// reduction (on its device; false for other dtypes, empty tensors and during a CUDA graph
/// capture). The flight recorder's "nan" trigger asks it.
bool tensor_has_nonfinite(const Tensor& t);

/// Appends the level-5 statistics lines of `t` (each "\n" + prefix + text).
void append_tensor_stats(std::string& out, const Tensor& t, std::string_view prefix);

}  // namespace flashinfer::detail::apilog
