// Private: the names of the level-10 dump format, in one place: files and directories, record
// keys, status values, tensor-key prefixes. The recorder writes them and replay and
// `flashinfer replay` / `show` read them from here, so the two sides cannot drift apart.
// Upstream's names (reference flashinfer-logging-format.md section 3), plus the keys this
// library adds (docs/LOGGING.md, "Extra record keys").
#pragma once

#include <charconv>
#include <string>
#include <string_view>

namespace flashinfer::dump_schema {

// ---- files and directories
inline constexpr std::string_view kSessionFile = "session.jsonl";    // <DUMP_DIR>/session.jsonl
inline constexpr std::string_view kMetadataFile = "metadata.jsonl";  // <call dir>/metadata.jsonl
inline constexpr std::string_view kInputsStem = "inputs";            // inputs.pt / .safetensors
inline constexpr std::string_view kOutputsStem = "outputs";
inline constexpr std::string_view kMutatedStem = "mutated";  // ours: arguments written into
inline constexpr std::string_view kTorchExtension = ".pt";
inline constexpr std::string_view kSafetensorsExtension = ".safetensors";
inline constexpr std::string_view kGraphFlushesDir = "graph_flushes";  // <call dir>/graph_flushes/
inline constexpr const char* kFlushDirFormat = "flush_%04d";           // .../flush_0001
// A call directory: <YYYYMMDD_HHMMSS_mmm>_pid<PID>_<function_name>_call<NNNN>
inline constexpr std::string_view kDirPidMarker = "_pid";
inline constexpr std::string_view kDirCallMarker = "_call";

/// "inputs.pt" or "inputs.safetensors".
inline std::string tensor_file(std::string_view stem, bool safetensors) {
  std::string s(stem);
  s += safetensors ? kSafetensorsExtension : kTorchExtension;
  return s;
}

// ---- record keys, in upstream's order (line 1 and line 2 of metadata.jsonl)
inline constexpr std::string_view kFunctionName = "function_name";
inline constexpr std::string_view kModule = "module";
inline constexpr std::string_view kCallSequence = "call_sequence";
inline constexpr std::string_view kTimestamp = "timestamp";
inline constexpr std::string_view kProcessId = "process_id";
inline constexpr std::string_view kInputMetadata = "input_metadata";
inline constexpr std::string_view kOutputMetadata = "output_metadata";
inline constexpr std::string_view kTensorInfo = "tensor_info";
inline constexpr std::string_view kTensorDetails = "tensor_details";
inline constexpr std::string_view kTensorFormat = "tensor_format";
inline constexpr std::string_view kFunctionSignature = "function_signature";
inline constexpr std::string_view kVersions = "versions";
inline constexpr std::string_view kExecutionStatus = "execution_status";
inline constexpr std::string_view kGraphCapture = "graph_capture";
inline constexpr std::string_view kSelfId = "self_id";  // wrapper methods only
inline constexpr std::string_view kDumpDir = "dump_dir";
// ours, after upstream's keys
inline constexpr std::string_view kBackend = "backend";                   // "cpu" / "cuda"
inline constexpr std::string_view kProcessSequence = "process_sequence";  // call order
inline constexpr std::string_view kTensorStore = "tensor_store";          // "dedup": tensors/ store
inline constexpr std::string_view kTensorStoreDedup = "dedup";
// a CUDA-graph flush's records
inline constexpr std::string_view kGraphCaptureFlushed = "graph_capture_flushed";
inline constexpr std::string_view kGraphCaptureFlushIndex = "graph_capture_flush_index";
inline constexpr std::string_view kGraphCaptureSnapshotDir = "graph_capture_snapshot_dir";
inline constexpr std::string_view kGraphCaptureBaseDumpDir = "graph_capture_base_dump_dir";

// ---- tensor_info members
inline constexpr std::string_view kInputTensorKeys = "input_tensor_keys";
inline constexpr std::string_view kOutputTensorKeys = "output_tensor_keys";
inline constexpr std::string_view kInputSizeBytes = "input_size_bytes";
inline constexpr std::string_view kInputSizeMb = "input_size_mb";
inline constexpr std::string_view kOutputSizeBytes = "output_size_bytes";
inline constexpr std::string_view kOutputSizeMb = "output_size_mb";
inline constexpr std::string_view kTotalSizeBytes = "total_size_bytes";
inline constexpr std::string_view kTotalSizeMb = "total_size_mb";
inline constexpr std::string_view kMutatedTensorKeys = "mutated_tensor_keys";  // ours

// ---- tensor_details[key] members
inline constexpr std::string_view kShape = "shape";
inline constexpr std::string_view kDType = "dtype";
inline constexpr std::string_view kStride = "stride";
inline constexpr std::string_view kDevice = "device";
inline constexpr std::string_view kOriginalDevice = "original_device";  // ours

// ---- versions members
inline constexpr std::string_view kVersionFlashinfer = "flashinfer";
inline constexpr std::string_view kVersionFlashinferCpp = "flashinfer_cpp";
inline constexpr std::string_view kVersionCompiler = "compiler";
inline constexpr std::string_view kVersionCudaToolkit = "cuda_toolkit";

// ---- serialized values in input_metadata / output_metadata
inline constexpr std::string_view kType = "type";
inline constexpr std::string_view kValue = "value";
inline constexpr std::string_view kName = "name";
inline constexpr std::string_view kLength = "length";
inline constexpr std::string_view kItems = "items";
inline constexpr std::string_view kTruncated = "truncated";
inline constexpr std::string_view kKey = "key";
inline constexpr std::string_view kRepr = "repr";
inline constexpr std::string_view kRequiresGrad = "requires_grad";
inline constexpr std::string_view kIsContiguous = "is_contiguous";
inline constexpr std::string_view kTensorKey = "tensor_key";
// "type" tags
inline constexpr std::string_view kTypeDType = "torch.dtype";
inline constexpr std::string_view kTypeTensor = "torch.Tensor";
inline constexpr std::string_view kTypeEnum = "enum";
inline constexpr std::string_view kTypeList = "list";
inline constexpr std::string_view kTypeTuple = "tuple";
inline constexpr std::string_view kTypeDict = "dict";

// ---- execution_status and tensor_format values
inline constexpr std::string_view kStatusInputsSaved = "inputs_saved";
inline constexpr std::string_view kStatusCompleted = "completed";
inline constexpr std::string_view kStatusGraphPending = "graph_capture_pending_flush";
// Not upstream's: the call returned but writing its outputs failed (a full disk); the record
// then carries kWriteError, the failure's text. Upstream leaves such a call at inputs_saved,
// which reads as a crash inside the call.
inline constexpr std::string_view kStatusOutputsWriteFailed = "outputs_write_failed";
inline constexpr std::string_view kWriteError = "write_error";
inline constexpr std::string_view kFormatTorch = "torch";
inline constexpr std::string_view kFormatSafetensors = "safetensors";

// ---- tensor keys (inputs.pt dict keys and "tensor_key" values)
inline constexpr std::string_view kArgPrefix = "arg_";  // arg_<i>: positional parameter i
// ---- ring dumps: <DUMP_DIR>/ring_pid<PID>_dump<NNNN>_<reason>/trigger.json
inline constexpr std::string_view kTriggerFile = "trigger.json";
inline constexpr std::string_view kKwargPrefix = "kwarg_";    // kwarg_<name>: keyword parameter
inline constexpr std::string_view kResult = "result";         // a single returned tensor
inline constexpr std::string_view kResultPrefix = "result_";  // result_<i>: item i of a tuple
inline constexpr std::string_view kNestedSeparator = "__";    // <parent>__<i>: nested item
inline constexpr std::string_view kNestedKey = "__key_";      // <parent>__key_<i>: dict key
inline constexpr std::string_view kNestedValue = "__value_";  // <parent>__value_<i>: dict value

// The keys built in `out` (its capacity reused: the recorder's hooks build one per argument).
inline const std::string& arg_key_into(std::string& out, std::size_t index) {
  char digits[24];
  const auto r = std::to_chars(digits, digits + sizeof(digits), index);
  out.assign(kArgPrefix);
  out.append(digits, static_cast<std::size_t>(r.ptr - digits));
  return out;
}
inline const std::string& kwarg_key_into(std::string& out, std::string_view name) {
  out.assign(kKwargPrefix);
  out.append(name);
  return out;
}
inline std::string arg_key(std::size_t index) {
  std::string key;
  return arg_key_into(key, index);
}
inline std::string kwarg_key(std::string_view name) {
  std::string key;
  return kwarg_key_into(key, name);
}

}  // namespace flashinfer::dump_schema
