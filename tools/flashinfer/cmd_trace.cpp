// `flashinfer trace`: writes the flashinfer-bench definition of an op for a shape, without
// running anything (docs/TRACE.md). The shape is given by axis values: --axis NAME=VALUE for any
// axis of the op's template, or `flashinfer bench`'s shape flags, which set the axis of the same
// name (--head_dim_qk sets head_dim).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "flashinfer/error.h"
#include "flashinfer/trace.h"

namespace flashinfer::cli {

namespace {

struct TraceOptions {
  std::string routine;
  bool list = false;
  std::vector<std::string> axis;  // NAME=VALUE
  std::string dtype = "bfloat16";
  std::string output_dir = "fi_trace_out";
  bool to_stdout = false;
  // bench's shape flags: only those given count.
  std::map<std::string, int64_t> flag_values;
  std::map<std::string, Arg> flags;
};

int list_traced() {
  const auto ops = trace::traced_ops();
  for (const std::string& op : ops) {
    std::string axes;
    for (const auto& a : trace::template_axes(op)) {
      axes += (axes.empty() ? "" : " ") + a.name + (a.is_const ? "" : "*");
    }
    std::printf("%-48s %s\n", op.c_str(), axes.c_str());
  }
  std::printf("%zu ops with a trace template (* marks a variable axis)\n", ops.size());
  return 0;
}

int run_trace(TraceOptions& o) {
  if (o.list) return list_traced();
  if (o.routine.empty()) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "trace", "routine",
                    "is required (`flashinfer trace --list` lists the routines)");
  }
  std::map<std::string, int64_t> axes;
  for (const auto& [axis, opt] : o.flags) {
    if (opt.count() > 0) axes[axis] = o.flag_values[axis];
  }
  for (const std::string& a : o.axis) {
    const auto eq = a.find('=');
    int64_t v = 0;
    try {
      if (eq == std::string::npos || eq == 0) throw std::invalid_argument(a);
      std::size_t used = 0;
      v = std::stoll(a.substr(eq + 1), &used);
      if (used != a.size() - eq - 1) throw std::invalid_argument(a);
    } catch (const std::exception&) {
      FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "trace", "axis", "'", a,
                      "' is not NAME=INTEGER");
    }
    axes[a.substr(0, eq)] = v;
  }
  // Only the flags naming an axis of this template apply (the others belong to other ops).
  std::map<std::string, int64_t> used;
  for (const auto& info : trace::template_axes(o.routine)) {
    if (auto it = axes.find(info.name); it != axes.end()) used[info.name] = it->second;
  }
  for (const std::string& a : o.axis) {
    const std::string name = a.substr(0, a.find('='));
    if (!used.count(name)) used[name] = axes[name];  // an unknown --axis is an error below
  }
  const auto dtype = dtype_from_name(o.dtype);
  if (!dtype) {
    FLASHINFER_FAIL(ErrorCode::kInvalidArgument, "trace", "dtype", "unknown dtype '", o.dtype, "'");
  }
  const std::string text = trace::definition_for_axes(o.routine, used, *dtype);
  const std::string name = nlohmann::json::parse(text).at("name").get<std::string>();
  if (o.to_stdout) {
    std::printf("%s\n", text.c_str());
    return 0;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(o.output_dir, ec);
  const fs::path path = fs::path(o.output_dir) / (name + ".json");
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  if (!f) {
    FLASHINFER_FAIL(ErrorCode::kIo, "trace", "output_dir", "cannot write ", path.string());
  }
  std::printf("%s\n", path.string().c_str());
  return 0;
}

}  // namespace

Command trace_command() {
  return {"trace",
          "Write an op's flashinfer-bench definition JSON for a shape, without running it "
          "(as FLASHINFER_TRACE_DUMP=1 writes them for live calls)",
          [](Args& sub) {
            auto o = std::make_shared<TraceOptions>();
            sub.take_last_by_default();
            sub.add_option("--routine", o->routine, "Op or wrapper method (see --list)");
            sub.add_flag("--list", o->list, "List the ops with a trace template and their axes");
            sub.add_option("--axis", o->axis, "An axis value, NAME=VALUE (repeatable)").take_all();
            sub.add_option("--dtype,--input_dtype", o->dtype,
                           "dtype of the inputs the template does not fix (bfloat16)");
            sub.add_option("-o,--output_dir", o->output_dir,
                           "Directory to write <name>.json into (fi_trace_out)");
            sub.add_flag("--stdout", o->to_stdout, "Print the definition instead of writing it");
            // `flashinfer bench`'s shape flags, each setting the axis of its name.
            const std::vector<std::pair<std::string, std::string>> shape_flags = {
                {"--batch_size", "batch_size"},     {"--num_qo_heads", "num_qo_heads"},
                {"--num_kv_heads", "num_kv_heads"}, {"--head_dim_qk", "head_dim"},
                {"--page_size", "page_size"},       {"--hidden_size", "hidden_size"},
                {"--vocab_size", "vocab_size"}};
            for (const auto& [flag, axis] : shape_flags) {
              o->flag_values[axis] = 0;
              o->flags.insert_or_assign(axis,
                                        sub.add_option(flag, o->flag_values[axis], "Axis " + axis));
            }
            return std::function<int()>([o] { return run_trace(*o); });
          }};
}

}  // namespace flashinfer::cli
