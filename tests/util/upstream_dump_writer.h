// Test helper: one call directory in upstream FlashInfer's level-10 recorder layout
// (shared/reference/flashinfer-logging-format.md §3: `<timestamp>_pid<PID>_<name>_call<NNNN>/`
// with a two-line metadata.jsonl and torch.save'd inputs.pt / outputs.pt), written with the
// library's own torch-format writer (save_torch), so the test needs no Python. The caller gives
// upstream's argument layout: tensor keys `arg_<i>` / `kwarg_<name>` / `<parent>__<i>` and the
// non-tensor arguments as upstream serializes them in input_metadata (None as null, a dtype as
// {"type": "torch.dtype", ...}).
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "flashinfer/tensor_io.h"

namespace flashinfer::testing {

struct UpstreamCall {
  std::string function_name;
  std::string module;
  NamedTensors inputs;                                       // tensor key -> value
  nlohmann::json input_metadata = nlohmann::json::object();  // the non-tensor arguments
  NamedTensors outputs;                                      // result, result__<i>, ...
};

/// {"type": "torch.dtype", "value": "torch.bfloat16"}: a dtype argument as upstream records it.
inline nlohmann::json torch_dtype_meta(DType dt) {
  return {{"type", "torch.dtype"}, {"value", std::string(dtype_torch_name(dt))}};
}

/// Writes call number `seq` (1-based) of `c` under `root`; returns its directory.
inline std::filesystem::path write_upstream_call(const std::filesystem::path& root, int seq,
                                                 const UpstreamCall& c) {
  namespace fs = std::filesystem;
  char stamp[64];
  std::snprintf(stamp, sizeof(stamp), "20261125_120000_%03d", seq % 1000);
  char call_no[16];
  std::snprintf(call_no, sizeof(call_no), "%04d", seq);
  const std::string name =
      std::string(stamp) + "_pid4242_" + c.function_name + "_call" + std::string(call_no);
  const fs::path dir = root / name;
  fs::create_directories(dir);
  auto details = [](const NamedTensors& ts, nlohmann::json& into) {
    for (const auto& [key, t] : ts) {
      into[key] = {{"shape", t.shape()},
                   {"dtype", std::string(dtype_torch_name(t.dtype()))},
                   {"stride", t.strides()},
                   {"device", "cpu"}};
    }
  };
  nlohmann::json in_keys = nlohmann::json::array(), out_keys = nlohmann::json::array();
  for (const auto& kv : c.inputs) in_keys.push_back(kv.first);
  for (const auto& kv : c.outputs) out_keys.push_back(kv.first);
  if (!c.inputs.empty()) save_torch((dir / "inputs.pt").string(), c.inputs);
  if (!c.outputs.empty()) save_torch((dir / "outputs.pt").string(), c.outputs);
  nlohmann::json rec;  // keys in any order: readers look them up by name
  rec["function_name"] = c.function_name;
  rec["module"] = c.module;
  rec["call_sequence"] = seq;
  rec["timestamp"] = stamp;
  rec["process_id"] = 4242;
  rec["input_metadata"] = c.input_metadata;
  rec["output_metadata"] = nlohmann::json::object();
  rec["tensor_info"] = {{"input_tensor_keys", in_keys},
                        {"output_tensor_keys", nlohmann::json::array()}};
  nlohmann::json td = nlohmann::json::object();
  details(c.inputs, td);
  rec["tensor_details"] = td;
  rec["tensor_format"] = "torch";
  rec["execution_status"] = "inputs_saved";
  rec["graph_capture"] = false;
  rec["dump_dir"] = "flashinfer_dumps/" + name;
  std::ofstream f(dir / "metadata.jsonl");
  f << rec.dump() << "\n";  // line 1: before the call
  rec["tensor_info"]["output_tensor_keys"] = out_keys;
  details(c.outputs, td);
  rec["tensor_details"] = td;
  rec["execution_status"] = "completed";
  f << rec.dump() << "\n";  // line 2: after it
  return dir;
}

}  // namespace flashinfer::testing
