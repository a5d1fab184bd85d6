// The ring mode's deferred record text (src/recorder/record_tape.h): a kept call's record is
// held structured and written as text only in a dump, by an allocation-free formatter. Its
// lines must be byte for byte what record_line() writes for the same call (the disk recorder's
// text, and the ring's before session 12).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "recorder/python_json.h"
#include "recorder/record_json.h"
#include "recorder/record_tape.h"

namespace flashinfer {
namespace {

using namespace recorder::internal;

void append_sink(void* ctx, const char* p, std::size_t n) {
  static_cast<std::string*>(ctx)->append(p, n);
}

// Text through a TextOut with a tiny buffer, so that the flushes in the middle of values are
// exercised too.
template <typename F>
std::string through_text_out(F&& write, std::size_t cap = 7) {
  std::string s;
  std::vector<char> buf(cap);
  TextOut out(buf.data(), buf.size(), append_sink, &s);
  write(out);
  out.flush();
  return s;
}

Tensor filled(std::vector<int64_t> shape, DType dtype, double v) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Tensor::from_vector(std::vector<double>(static_cast<std::size_t>(n), v), shape, dtype);
}

// An op declaration with every kind of argument a record describes (not registered: the record
// writers need its name, module, parameters and signature only).
OpDecl probe_decl(bool method) {
  OpDecl d;
  d.name = method ? "ProbeWrapper.run" : "probe_\xc3\xa9\"op";  // escaping in names too
  d.module = "tests.ring_records";
  if (method) {
    d.class_name = "ProbeWrapper";
    d.params.push_back(ParamDecl("self", ParamKind::kObject));
  }
  d.params.push_back(ParamDecl("x", ParamKind::kTensor));
  d.params.push_back(ParamDecl("n", ParamKind::kInt));
  d.params.push_back(ParamDecl("eps", ParamKind::kFloat));
  d.params.push_back(ParamDecl("flag", ParamKind::kBool));
  d.params.push_back(ParamDecl("mode", ParamKind::kString));
  d.params.push_back(ParamDecl("dtype", ParamKind::kDType));
  d.params.push_back(ParamDecl("kind", ParamKind::kEnum));
  d.params.push_back(ParamDecl("pages", ParamKind::kList));
  d.params.push_back(ParamDecl("opt", ParamKind::kAny).opt());
  d.params.push_back(ParamDecl("out", ParamKind::kTensor).opt());
  d.params.back().mutated = true;
  d.params.push_back(ParamDecl("scale", ParamKind::kFloat).def(1.0).kw());
  d.params.push_back(ParamDecl("kv", ParamKind::kList).opt().kw());
  d.params.back().mutated = true;
  d.returns = "tuple[Tensor, int, float]";
  return d;
}

struct Case {
  std::vector<Value> args;
  Value result;
};

std::vector<Case> cases(bool method) {
  const Tensor x = filled({2, 3}, DType::kFloat32, 1.5);
  const Tensor xt = filled({3, 2}, DType::kBFloat16, 2.0).transpose(0, 1);  // strided
  const Tensor out = filled({2, 3}, DType::kFloat16, 0.0);
  const Tensor k = filled({4}, DType::kFloat32, 1.0), v = filled({4}, DType::kFloat32, 2.0);
  ObjectRef self;
  self.type = "ProbeWrapper";
  self.repr = "<tests.ProbeWrapper object at 0x7f00>" + std::string(1200, 'r');  // cut at 1000
  self.id = 123456789;
  std::vector<Case> cs;
  const auto add = [&](std::vector<Value> a, Value r) {
    if (method) a.insert(a.begin(), Value(self));
    cs.push_back({std::move(a), std::move(r)});
  };
  const double floats[] = {1e-5,
                           0.1,
                           -0.0,
                           123.0,
                           1e16,
                           1.5e-300,
                           2.5e300,
                           std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity(),
                           3.0e-4,
                           1234567.125};
  int i = 0;
  for (double f : floats) {
    const bool odd = i++ % 2 == 1;
    std::vector<Value> a = {
        Value(odd ? xt : x),
        Value(int64_t{-7} * i),
        Value(f),
        Value(odd),
        Value(odd ? std::string("caf\xc3\xa9 \"q\"\n\t\x01\x7f \xf0\x9f\x98\x80 \xff") : "NONE"),
        Value(odd ? DType::kBFloat16 : DType::kFloat8E4M3FN),
        Value(EnumValue{"PosEncodingMode", odd ? "ROPE_LLAMA" : "NONE", odd ? "1" : "none"}),
        Value::list({Value(int64_t{1}), Value(k), Value::tuple({Value(2.5), Value(v)})}),
        odd ? Value::dict({{Value("a"), Value(k)}, {Value(int64_t{3}), Value()}}) : Value(),
        odd ? Value(out) : Value(),
        Value(odd ? 1.0 : 0.5),  // keyword-only: left out when equal to its default
        odd ? Value::list({Value(k), Value(v)}) : Value(),
    };
    Value r = odd ? Value::tuple({Value(out), Value(int64_t{5}), Value(f), Value(x)})
                  : (i % 3 == 0 ? Value(x) : Value());
    add(std::move(a), std::move(r));
  }
  return cs;
}

// The old (text) and new (structured) records of one call, both lines.
void expect_same_lines(const OpDecl& decl, const Case& c, int64_t seq) {
  const std::string tail = record_tail(false, decl.signature());
  const std::string ts = "2026-01-01 00:00:00";
  const std::string dir = "/tmp/d \"x\"/r\xc3\xa9/call\x01";
  std::string dir_json;
  recorder::append_json_string(dir_json, dir);
  dir_json = dir_json.substr(1, dir_json.size() - 2);
  std::optional<uint64_t> self_id;
  if (decl.is_method()) self_id = c.args[0].as_object().id;

  Extracted ex;
  ex.by_reference = true;
  RecordParts rec;
  rec.head = record_head(decl, c.args, seq, ts, 4242, ex);
  finish_inputs_with_tail(rec, ex, tail, false, self_id, 1000 + seq);
  std::string meta;
  const Extracted out = extract_result(c.result, true, meta);
  const Extracted mutated = extract_mutated(decl, c.args, true);
  const std::string old1 = record_line(rec, inputs_outcome(rec), "inputs_saved", dir) + "\n";
  const std::string old2 =
      record_line(rec, outputs_outcome(rec, meta, out, mutated), "completed", dir) + "\n";

  InputRecord in;
  OutputRecord o;
  Extracted ex2, out2, mut2;
  ex2.by_reference = out2.by_reference = mut2.by_reference = true;
  // Filled twice: the second fill reuses the first's storage (as a recycled ring slot does).
  for (int k = 0; k < 2; ++k) {
    ex2.clear();
    out2.clear();
    mut2.clear();
    fill_input_record(in, decl, c.args, seq, ts, 4242, &tail, self_id, 1000 + seq, ex2);
    fill_output_record(o, decl, c.args, c.result, out2, mut2);
  }
  EXPECT_EQ(ex2.bytes, ex.bytes);
  const std::string_view pieces[] = {std::string_view(dir_json).substr(0, 5),
                                     std::string_view(dir_json).substr(5)};
  for (const std::size_t cap : {std::size_t{7}, std::size_t{16384}}) {
    EXPECT_EQ(through_text_out([&](TextOut& t) { write_record_line(in, nullptr, pieces, t); }, cap),
              old1);
    EXPECT_EQ(through_text_out([&](TextOut& t) { write_record_line(in, &o, pieces, t); }, cap),
              old2);
  }
}

TEST(RingRecords, StructuredRecordsWriteRecordLinesTextByteForByte) {
  for (const bool method : {false, true}) {
    const OpDecl decl = probe_decl(method);
    int64_t seq = 0;
    for (const Case& c : cases(method)) {
      SCOPED_TRACE(decl.name + " call " + std::to_string(seq + 1));
      expect_same_lines(decl, c, ++seq);
    }
  }
}

// A hand-checked line: the formatter's text, pinned (not only equal to record_line's).
TEST(RingRecords, GoldenLine) {
  OpDecl decl;
  decl.name = "rmsnorm";
  decl.module = "flashinfer.norm";
  decl.params = {ParamDecl("input", ParamKind::kTensor), ParamDecl("eps", ParamKind::kFloat)};
  const std::vector<Value> args = {Value(filled({1, 4}, DType::kBFloat16, 1.0)), Value(1e-6)};
  const std::string tail = "\"tensor_format\": \"torch\"";
  InputRecord in;
  OutputRecord o;
  Extracted ex, out, mut;
  ex.by_reference = out.by_reference = mut.by_reference = true;
  fill_input_record(in, decl, args, 3, "2026-01-02 03:04:05", 77, &tail, std::nullopt, 9, ex);
  fill_output_record(o, decl, args, Value(filled({1, 4}, DType::kBFloat16, 2.0)), out, mut);
  const std::string_view dir[] = {"/d/rmsnorm_call0003"};
  const std::string head =
      "{\"function_name\": \"rmsnorm\", \"module\": \"flashinfer.norm\", \"call_sequence\": 3, "
      "\"timestamp\": \"2026-01-02 03:04:05\", \"process_id\": 77, \"input_metadata\": "
      "{\"arg_1\": 1e-06}, \"output_metadata\": ";
  const std::string details =
      "\"arg_0\": {\"shape\": [1, 4], \"dtype\": \"torch.bfloat16\", \"stride\": [4, 1], "
      "\"device\": \"cpu\", \"original_device\": \"cpu\"}";
  const std::string rest =
      "\"tensor_format\": \"torch\", \"execution_status\": \"%s\", \"graph_capture\": false, "
      "\"dump_dir\": \"/d/rmsnorm_call0003\", \"backend\": \"cpu\", \"process_sequence\": 9}\n";
  const auto with_status = [&](const char* s) {
    std::string r = rest;
    r.replace(r.find("%s"), 2, s);
    return r;
  };
  EXPECT_EQ(through_text_out([&](TextOut& t) { write_record_line(in, nullptr, dir, t); }),
            head +
                "{}, \"tensor_info\": {\"input_tensor_keys\": [\"arg_0\"], \"output_tensor_keys\": "
                "[], \"input_size_bytes\": 8, \"input_size_mb\": 7.62939453125e-06}, "
                "\"tensor_details\": {" +
                details + "}, " + with_status("inputs_saved"));
  EXPECT_EQ(
      through_text_out([&](TextOut& t) { write_record_line(in, &o, dir, t); }),
      head +
          "{}, \"tensor_info\": {\"input_tensor_keys\": [\"arg_0\"], \"output_tensor_keys\": "
          "[\"result\"], \"input_size_bytes\": 8, \"input_size_mb\": 7.62939453125e-06, "
          "\"output_size_bytes\": 8, \"output_size_mb\": 7.62939453125e-06, "
          "\"total_size_bytes\": 16, \"total_size_mb\": 1.52587890625e-05, "
          "\"mutated_tensor_keys\": []}, \"tensor_details\": {" +
          details + ", " +
          "\"result\": {\"shape\": [1, 4], \"dtype\": \"torch.bfloat16\", \"stride\": [4, 1], "
          "\"device\": \"cpu\", \"original_device\": \"cpu\"}}, " +
          with_status("completed"));
}

// The ring's kept calls share one immutable template per distinct argument metadata and
// values (RecentTemplates): calls that repeat them get the same template, a call that differs
// in a value, a tensor's shape or its key gets its own, and each call's line keeps its own
// sequence and timestamp.
TEST(RingRecords, CallsThatRepeatTheirArgumentsShareOneTemplate) {
  OpDecl decl;
  decl.name = "rmsnorm";
  decl.module = "flashinfer.norm";
  decl.params = {ParamDecl("input", ParamKind::kTensor), ParamDecl("eps", ParamKind::kFloat)};
  const std::string tail = "\"tensor_format\": \"torch\"";
  RecentTemplates<InputTemplate> ins;
  RecentTemplates<OutputTemplate> outs;
  const auto fill = [&](InputRecord& in, OutputRecord& o, std::vector<int64_t> shape, double eps,
                        int64_t seq) {
    const std::vector<Value> args = {Value(filled(shape, DType::kBFloat16, 1.0)), Value(eps)};
    Extracted ex, out, mut;
    ex.by_reference = out.by_reference = mut.by_reference = true;
    fill_input_record(in, decl, args, seq, "2026-01-02 03:04:0" + std::to_string(seq), 77, &tail,
                      std::nullopt, seq, ex, &ins);
    fill_output_record(o, decl, args, Value(filled(shape, DType::kBFloat16, 2.0)), out, mut, &outs);
  };
  InputRecord a, b, c, d;
  OutputRecord oa, ob, oc, od;
  fill(a, oa, {1, 4}, 1e-6, 1);
  fill(b, ob, {1, 4}, 1e-6, 2);  // the same metadata and values as a
  fill(c, oc, {2, 4}, 1e-6, 3);  // another shape
  fill(d, od, {1, 4}, 1e-5, 4);  // another eps
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(oa.outputs, ob.outputs);
  EXPECT_NE(a.inputs, c.inputs);
  EXPECT_NE(oa.outputs, oc.outputs);
  EXPECT_NE(a.inputs, d.inputs);
  EXPECT_EQ(oa.outputs, od.outputs);  // the same result metadata
  const std::string_view dir[] = {"/d"};
  const std::string la = through_text_out([&](TextOut& t) { write_record_line(a, &oa, dir, t); });
  const std::string lb = through_text_out([&](TextOut& t) { write_record_line(b, &ob, dir, t); });
  EXPECT_NE(la.find("\"call_sequence\": 1, \"timestamp\": \"2026-01-02 03:04:01\""),
            std::string::npos);
  EXPECT_NE(lb.find("\"call_sequence\": 2, \"timestamp\": \"2026-01-02 03:04:02\""),
            std::string::npos);
  EXPECT_NE(through_text_out([&](TextOut& t) {
              write_record_line(d, &od, dir, t);
            }).find("\"input_metadata\": {\"arg_1\": 1e-05}"),
            std::string::npos);
  EXPECT_NE(through_text_out([&](TextOut& t) {
              write_record_line(c, &oc, dir, t);
            }).find("\"shape\": [2, 4]"),
            std::string::npos);
  // More distinct calls than the cache holds: each still gets a template equal to its own.
  std::vector<InputRecord> many(9);
  std::vector<OutputRecord> many_out(9);
  for (int i = 0; i < 9; ++i) fill(many[i], many_out[i], {1, 1 + i % 6}, 1e-6, 10 + i);
  for (int i = 0; i < 9; ++i) {
    ASSERT_EQ(many[i].inputs->tensors.size(), 1u);
    EXPECT_EQ(many[i].inputs->tensors[0].shape, (Shape{1, 1 + i % 6}));
    EXPECT_EQ(many_out[i].outputs->outputs[0].shape, (Shape{1, 1 + i % 6}));
  }
  EXPECT_EQ(a.inputs->tensors[0].shape, (Shape{1, 4}));  // held by a, though since replaced
}

// The allocation-free float text is python_float_repr's, over special values and random bit
// patterns (every exponent range: subnormals, scientific and positional layouts).
TEST(RingRecords, FloatReprCharsIsPythonRepr) {
  std::vector<double> v = {0.0,
                           -0.0,
                           1.0,
                           -1.0,
                           0.1,
                           1e-4,
                           1e-5,
                           9.99e-5,
                           1e15,
                           1e16,
                           1.5e16,
                           123456789012345678.0,
                           5e-324,
                           1.7976931348623157e308,
                           2.2250738585072014e-308,
                           std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()};
  std::mt19937_64 rng(12);
  for (int i = 0; i < 5000; ++i) {
    uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, 8);
    v.push_back(d);
    v.push_back(static_cast<double>(static_cast<int64_t>(rng() % 2000001) - 1000000) /
                static_cast<double>(uint64_t{1} << (rng() % 40)));
  }
  for (double d : v) {
    char b[48];
    const std::size_t n = float_repr_chars(d, b);
    ASSERT_EQ(std::string(b, n), python_float_repr(d)) << d;
    std::string json;
    recorder::append_json_float(json, d);
    ASSERT_EQ(through_text_out([&](TextOut& t) { t.put_json_float(d); }), json);
  }
}

// JSON strings as json.dumps(ensure_ascii=True) writes them (append_json_string is a wrapper
// over put_json_string since session 13): hand-checked goldens (surrogate pairs above the BMP,
// surrogateescape for bytes that start no UTF-8 sequence), then random byte strings written
// through a 7-byte buffer (flushed in the middle of escapes) against a 4 KiB one.
TEST(RingRecords, JsonStringEscapingIsJsonDumps) {
  const std::vector<std::pair<std::string, std::string>> golden = {
      {"", R"("")"},
      {"plain", R"("plain")"},
      {"q\"b\\s/", R"("q\"b\\s/")"},
      {"\n\r\t\b\f\x01\x1f\x7f", R"("\n\r\t\b\f\u0001\u001f\u007f")"},
      {"caf\xc3\xa9", R"("caf\u00e9")"},
      {"\xe2\x82\xac", R"("\u20ac")"},
      {"\xf0\x9f\x98\x80", R"("\ud83d\ude00")"},
      {"\xff\xfe", R"("\udcff\udcfe")"},
      {"\xc3", R"("\udcc3")"},
      {"\xed\xa0\x80", R"("\udced\udca0\udc80")"},
      {"\xe0\x80\x80", R"("\udce0\udc80\udc80")"}};
  for (const auto& g : golden) {
    const std::string& s = g.first;
    EXPECT_EQ(through_text_out([&](TextOut& t) { t.put_json_string(s); }), g.second);
    std::string text;
    recorder::append_json_string(text, s);
    EXPECT_EQ(text, g.second);
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 2000; ++i) {
    std::string s(static_cast<std::size_t>(rng() % 12), '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    ASSERT_EQ(through_text_out([&](TextOut& t) { t.put_json_string(s); }),
              through_text_out([&](TextOut& t) { t.put_json_string(s); }, 4096));
  }
}

}  // namespace
}  // namespace flashinfer
