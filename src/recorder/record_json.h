// Private: the serialization half of the recorder. A call's arguments and result become
// upstream's record text (json.dumps style, reference flashinfer-logging-format.md sections
// 3.3-3.5) and the named tensors that go to its tensor files. Records are built as text pieces
// that line 2 and a graph flush's lines repeat from line 1 (building a JSON document per call
// cost more than writing the files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flashinfer/device.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/tensor_io.h"
#include "flashinfer/value.h"

namespace flashinfer::recorder::internal {

/// The tensors of one side of a call (inputs, outputs or mutated arguments), under their keys.
struct Extracted {
  NamedTensors tensors;         // staged host copies (references during a graph capture)
  std::vector<Device> devices;  // each one's original device
  uint64_t bytes = 0;           // logical bytes (element size x numel), as upstream counts
  bool by_reference = false;    // CUDA-graph capture: no copy now, values taken at flush time

  void add(const std::string& key, const Tensor& t);
  void clear();  // empty, keeping the storage (the ring reuses one per thread)

  // Cleared entries (no tensor held): their key and shape/stride buffers are reused by add(),
  // so the ring's per-thread Extracted allocates nothing per call once warm (copying each
  // tensor's shape and strides into new vectors was ~5 % of the ring's hooks, session 14).
  NamedTensors spare;
};

/// Resizes `v` to `n` elements, moving those past `n` into `spare` and new ones out of it, so
/// their strings and vectors keep their heap buffers (the ring's per-call metadata, reused by
/// recycled call slots of other ops; at most `keep` spare elements are held).
template <typename T>
void resize_reusing(std::vector<T>& v, std::size_t n, std::vector<T>& spare,
                    std::size_t keep = 256) {
  while (v.size() > n) {
    if (spare.size() < keep) spare.push_back(std::move(v.back()));
    v.pop_back();
  }
  while (v.size() < n) {
    if (spare.empty()) {
      v.emplace_back();
    } else {
      v.push_back(std::move(spare.back()));
      spare.pop_back();
    }
  }
}

class RecordTape;
struct InputRecord;
struct OutputRecord;
struct InputTemplate;
struct OutputTemplate;
template <class T>
class RecentTemplates;

/// A call's record as text pieces.
struct RecordParts {
  std::string head;        // '{"function_name": ..., "input_metadata": {...}'
  std::string in_keys;     // '["arg_0", ...]'
  std::string in_details;  // '"arg_0": {...}, ...'
  std::string tail;        // '"tensor_format": ..., "versions": {...}'
  std::string flags;       // '"graph_capture": ...[, "self_id": N]'
  std::string trailer;     // '"backend": ..., "process_sequence": N'
  uint64_t input_bytes = 0;
};

/// What line 2 adds to line 1 (line 1 has the inputs-only tensor_info and `{}` outputs).
struct Outcome {
  std::string output_metadata = "{}";
  std::string tensor_info;
  std::string out_details;
};

/// The record head through input_metadata: positional parameters as arg_<i> (a method's self
/// is arg_0), keyword-only ones as kwarg_<name> when they differ from their default. Tensors
/// go to `ex` (top-level ones only there, nested ones also described in the metadata).
std::string record_head(const OpDecl& decl, std::span<const Value> args, int64_t call_sequence,
                        const std::string& timestamp, int64_t pid, Extracted& ex);

/// The ring's structured record of a call's inputs (recorder/record_tape.h): record_head's
/// keys and what finish_inputs would write, with `tail` (record_tail's text, kept alive by the
/// caller). The record's names are views of `decl`'s (the caller may point them at copies that
/// live longer). Its template is shared from `templates` when given (the op's cache), else new.
/// `ex` receives the input tensors (by reference).
void fill_input_record(InputRecord& rec, const OpDecl& decl, std::span<const Value> args,
                       int64_t call_sequence, std::string_view timestamp, int64_t pid,
                       const std::string* tail, std::optional<uint64_t> self_id,
                       int64_t process_sequence, Extracted& ex,
                       RecentTemplates<InputTemplate>* templates = nullptr);

/// fill_input_record's fields that are the call's own (all but its template, rec.inputs).
void fill_input_record_fields(InputRecord& rec, const OpDecl& decl, int64_t call_sequence,
                              std::string_view timestamp, int64_t pid, const std::string* tail,
                              std::optional<uint64_t> self_id, int64_t process_sequence);
/// The ring's structured record of a call's outcome: what outputs_outcome would write.
/// `out` and `mutated` receive the output and mutated tensors (by reference).
void fill_output_record(OutputRecord& rec, const OpDecl& decl, std::span<const Value> args,
                        const Value& result, Extracted& out, Extracted& mutated,
                        RecentTemplates<OutputTemplate>* templates = nullptr);

/// Fills the input-side pieces after the head: keys, tensor details, tensor format, signature,
/// versions, graph flag, self_id, backend and process_sequence.
void finish_inputs(RecordParts& rec, const Extracted& ex, bool safetensors,
                   const std::string& signature, bool graph, std::optional<uint64_t> self_id,
                   int64_t process_sequence);

/// The tail piece of a record: tensor format, function signature and versions. The same text
/// for every call of an op (escaping the signature per call was ~6 % of the ring's hook time).
std::string record_tail(bool safetensors, const std::string& signature);

/// Marks a record finished with graph false as captured ("graph_capture": true): a call whose
/// result turned out to be written under a capture (result_capture_in_progress).
void set_graph_capture_flag(RecordParts& rec);

/// finish_inputs with the tail laid out ahead by record_tail.
void finish_inputs_with_tail(RecordParts& rec, const Extracted& ex, const std::string& tail,
                             bool graph, std::optional<uint64_t> self_id, int64_t process_sequence);

/// Line 1's tensor_info (inputs only).
Outcome inputs_outcome(const RecordParts& rec);

/// The result as upstream extracts it: a tensor is `result`, a tuple's tensors `result_<i>`
/// (other items in output_metadata), anything else output_metadata["result"].
Extracted extract_result(const Value& result, bool by_reference, std::string& output_metadata);
/// extract_result() with output_metadata recorded into a tape; appends to `out`.
void extract_result_tape(const Value& result, Extracted& out, RecordTape& metadata);
/// The arguments the op wrote into (ParamDecl::mutated), keyed like the inputs.
Extracted extract_mutated(const OpDecl& decl, std::span<const Value> args, bool by_reference);
/// extract_mutated() appending to `mutated` (its by_reference as set).
void extract_mutated_into(const OpDecl& decl, std::span<const Value> args, Extracted& mutated);

/// Line 2's additions for the given outputs and mutated arguments.
Outcome outputs_outcome(const RecordParts& rec, std::string output_metadata, const Extracted& out,
                        const Extracted& mutated);

/// One record line: the keys and their order are upstream's (reference section 3.4); `extra`
/// holds keys appended after them (", \"k\": v" ...).
std::string record_line(const RecordParts& p, const Outcome& o, std::string_view status,
                        std::string_view dump_dir, std::string_view extra = {});

/// record_line() as pieces that point into `p`, `o` and static text, not copied: record_line's
/// text is their concatenation, with the piece whose data() is null standing for the JSON
/// string of the dump directory. `status` must be plain ASCII (the schema's status values:
/// nothing to escape). The ring keeps a call's lines this way and writes them only in a dump.
void record_line_pieces(const RecordParts& p, const Outcome& o, std::string_view status,
                        std::vector<std::string_view>& out);

/// ', "<key>": ' + `json_value`, for `extra`.
void append_member(std::string& out, std::string_view key, std::string_view json_value);

/// "0.00": bytes as MB with two decimals (the log lines).
std::string mb_text(uint64_t bytes);

}  // namespace flashinfer::recorder::internal
