// The GGUF reader (flashinfer/gguf.h): synthetic files covering every metadata type and every
// dequantized tensor type against hand-computed values, malformed files (each an Error), and
// the real model's tensors against the `gguf` PyPI package's gguf.quants.dequantize, bit for bit.
#include "flashinfer/gguf.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "util/gguf_builder.h"
#include "util/run_command.h"
#include "util/test_util.h"

namespace {

using flashinfer::DType;
using flashinfer::Error;
using flashinfer::ErrorCode;
using flashinfer::gguf::File;
using flashinfer::gguf::GGMLType;
using flashinfer::gguf::ValueType;
using B = flashinfer::testing::GgufBuilder;
namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("fi_gguf_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<float> floats(const flashinfer::Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  std::memcpy(v.data(), t.data_ptr(), v.size() * 4);
  return v;
}

// Expects `fn` to throw flashinfer::Error with `code` whose message contains `needle`.
template <class Fn>
void expect_error(Fn&& fn, ErrorCode code, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

void expect_bad(const std::string& bytes, const std::string& needle) {
  expect_error([&] { (void)File::from_bytes(bytes, "bad.gguf"); }, ErrorCode::kFormat, needle);
}

// ---- metadata ----

B metadata_file() {
  B b;
  b.kv("u8", B::kU8, B::le(200, 1))
      .kv("i8", B::kI8, B::le(static_cast<uint8_t>(-100), 1))
      .kv("u16", B::kU16, B::le(60000, 2))
      .kv("i16", B::kI16, B::le(static_cast<uint16_t>(-30000), 2))
      .kv("u32", B::kU32, B::u32(4000000000u))
      .kv("i32", B::kI32, B::u32(static_cast<uint32_t>(-2000000000)))
      .kv("f32", B::kF32, B::f32(1.5f))
      .kv("bool", B::kBool, B::le(1, 1))
      .kv("str", B::kString, B::str("h\xc3\xa9llo"))
      .kv("u64", B::kU64, B::u64((uint64_t{1} << 63) + 5))
      .kv("i64", B::kI64, B::u64(static_cast<uint64_t>(-(int64_t{1} << 62))))
      .kv("f64", B::kF64, B::f64(-0.1))
      .kv("a_u8", B::kArray, B::array(B::kU8, 3, std::string("\x01\x02\xff", 3)))
      .kv("a_i32", B::kArray,
          B::array(B::kI32, 3, B::u32(7) + B::u32(static_cast<uint32_t>(-1)) + B::u32(1 << 30)))
      .kv("a_str", B::kArray,
          B::array(B::kString, 3, B::str("a") + B::str("") + B::str("\xf0\x9f\x99\x82")))
      .kv("a_f32", B::kArray, B::array(B::kF32, 2, B::f32(0.25f) + B::f32(-3.0f)))
      .kv("a_bool", B::kArray, B::array(B::kBool, 2, std::string("\x00\x01", 2)))
      .kv("a_empty", B::kArray, B::array(B::kU64, 0, ""))
      .kv("a_nested", B::kArray,
          B::array(B::kArray, 2,
                   B::array(B::kI16, 2, B::le(5, 2) + B::le(static_cast<uint16_t>(-6), 2)) +
                       B::array(B::kString, 1, B::str("x"))));
  return b;
}

TEST(Gguf, EveryMetadataType) {
  const File f = File::from_bytes(metadata_file().build(), "meta.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.tensors().empty());
  ASSERT_EQ(f.keys().size(), 19u);
  EXPECT_EQ(f.keys()[0], "u8");
  EXPECT_EQ(f.keys()[18], "a_nested");
  EXPECT_EQ(f.get_u8("u8"), 200);
  EXPECT_EQ(f.get_i8("i8"), -100);
  EXPECT_EQ(f.get_u16("u16"), 60000);
  EXPECT_EQ(f.get_i16("i16"), -30000);
  EXPECT_EQ(f.get_u32("u32"), 4000000000u);
  EXPECT_EQ(f.get_i32("i32"), -2000000000);
  EXPECT_EQ(f.get_f32("f32"), 1.5f);
  EXPECT_TRUE(f.get_bool("bool"));
  EXPECT_EQ(f.get_string("str"), "h\xc3\xa9llo");
  EXPECT_EQ(f.get_u64("u64"), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(f.get_i64("i64"), -(int64_t{1} << 62));
  EXPECT_EQ(f.get_f64("f64"), -0.1);
  // Widening accessors.
  EXPECT_EQ(f.get_int("u32"), 4000000000);
  EXPECT_EQ(f.get_int("i8"), -100);
  EXPECT_EQ(f.get_float("f32"), 1.5);
  EXPECT_EQ(f.get_float("i16"), -30000.0);
  // Arrays.
  EXPECT_EQ(f.get_int_array("a_u8"), (std::vector<int64_t>{1, 2, 255}));
  EXPECT_EQ(f.get_int_array("a_i32"), (std::vector<int64_t>{7, -1, 1 << 30}));
  EXPECT_EQ(f.get_string_array("a_str"), (std::vector<std::string>{"a", "", "\xf0\x9f\x99\x82"}));
  EXPECT_EQ(f.get_float_array("a_f32"), (std::vector<double>{0.25, -3.0}));
  EXPECT_EQ(f.get_int_array("a_bool"), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(f.get_int_array("a_empty").empty());
  EXPECT_EQ(f.get("a_empty").elem_type, ValueType::kUInt64);
  const auto& nested = f.get("a_nested");
  ASSERT_EQ(nested.elem_type, ValueType::kArray);
  ASSERT_EQ(nested.arrays.size(), 2u);
  EXPECT_EQ(nested.arrays[0].elem_type, ValueType::kInt16);
  EXPECT_EQ(nested.arrays[0].int_at(0), 5);
  EXPECT_EQ(nested.arrays[0].int_at(1), -6);
  EXPECT_EQ(nested.arrays[1].strings, (std::vector<std::string>{"x"}));
  EXPECT_EQ(nested.summary(), "array<array>[2]");
  EXPECT_EQ(f.get("u32").summary(), "uint32 4000000000");

  // Wrong type, missing key, out of range.
  expect_error([&] { (void)f.get_u32("i32"); }, ErrorCode::kFormat, "expected uint32");
  expect_error([&] { (void)f.get_string("u8"); }, ErrorCode::kFormat, "'u8'");
  expect_error([&] { (void)f.get_u32("nope"); }, ErrorCode::kFormat, "no metadata key 'nope'");
  expect_error([&] { (void)f.get_int("u64"); }, ErrorCode::kFormat, "does not fit in int64");
  expect_error([&] { (void)f.get_int("str"); }, ErrorCode::kFormat, "not an integer");
  expect_error([&] { (void)f.get_int_array("a_str"); }, ErrorCode::kFormat, "integer array");
  expect_error([&] { (void)f.get_string_array("a_u8"); }, ErrorCode::kFormat, "array<string>");
  expect_error([&] { (void)f.get_float_array("a_nested"); }, ErrorCode::kFormat, "numeric");
  expect_error([&] { (void)nested.arrays[0].int_at(2); }, ErrorCode::kInvalidArgument,
               "out of range");
}

TEST(Gguf, Version2AndCustomAlignment) {
  B b;
  b.version = 2;
  b.alignment = 64;
  b.kv("general.alignment", B::kU32, B::u32(64));
  b.tensor("a", {2}, 0, B::f32(1) + B::f32(2));
  b.tensor("b", {1}, 0, B::f32(3));
  const std::string bytes = b.build();
  const File f = File::from_bytes(bytes);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.tensor("b").offset, 64u);
  EXPECT_EQ(floats(f.dequantize("b")), std::vector<float>{3});
}

// ---- tensors ----

std::string half(uint16_t bits) { return B::le(bits, 2); }

// A file with one tensor of every dequantized type, values chosen so the expected results are
// exact (and one Q4_1 block where d * q + m must round).
std::string tensor_file() {
  B b;
  b.tensor("f32", {2, 3, 4}, 0, [] {
    std::string s;
    for (int i = 0; i < 24; ++i) s += B::f32(static_cast<float>(i) * 0.5f - 3.0f);
    return s;
  }());
  // 1, -2, 0.333251953125 (0x3555), 2^-24 (smallest subnormal), 65504 (largest finite).
  b.tensor("f16", {5}, 1, half(0x3C00) + half(0xC000) + half(0x3555) + half(0x0001) + half(0x7BFF));
  b.tensor("bf16", {3}, 30, half(0x3F80) + half(0xC0A0) + half(0x3EAB));
  {
    // Two Q8_0 blocks: d = 0.5 with q = 8 j - 128, then d = -0.25 with q = 127 - j.
    std::string s = half(0x3800);
    for (int j = 0; j < 32; ++j) s += static_cast<char>(static_cast<int8_t>(8 * j - 128));
    s += half(0xB400);
    for (int j = 0; j < 32; ++j) s += static_cast<char>(static_cast<int8_t>(127 - j));
    b.tensor("q8_0", {64}, 8, s);
  }
  {
    // Q4_0: d = 2, qs[j] = j | (15 - j) << 4.
    std::string s = half(0x4000);
    for (int j = 0; j < 16; ++j) s += static_cast<char>(j | (15 - j) << 4);
    b.tensor("q4_0", {32}, 2, s);
  }
  {
    // Q4_1, ne = [32, 3]: rows (d, m) = (0.25, -1), (2^-24, 8192) [rounds], (-0.5, 0.125).
    const uint16_t dm[3][2] = {{0x3400, 0xBC00}, {0x0001, 0x7000}, {0xB800, 0x3000}};
    std::string s;
    for (const auto& r : dm) {
      s += half(r[0]) + half(r[1]);
      for (int j = 0; j < 16; ++j) s += static_cast<char>(j | (15 - j) << 4);
    }
    b.tensor("q4_1", {32, 3}, 3, s);
  }
  b.tensor("q5_0", {32}, 6, std::string(22, '\0'));  // valid, but not dequantizable
  return b.build();
}

TEST(Gguf, TensorInfosAndShapes) {
  const File f = File::from_bytes(tensor_file());
  ASSERT_EQ(f.tensors().size(), 7u);
  const auto& t = f.tensor("f32");
  EXPECT_EQ(t.type, GGMLType::F32);
  EXPECT_EQ(t.ne, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(t.shape(), (flashinfer::Shape{4, 3, 2}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.rows(), 12);
  EXPECT_EQ(t.nbytes, 96u);
  const auto& q = f.tensor("q4_1");
  EXPECT_EQ(q.shape(), (flashinfer::Shape{3, 32}));
  EXPECT_EQ(q.nbytes, 60u);
  EXPECT_EQ(q.row_bytes(), 20u);
  EXPECT_EQ(flashinfer::gguf::ggml_type_name(q.type), "Q4_1");
  EXPECT_EQ(flashinfer::gguf::ggml_type_name(static_cast<GGMLType>(4)), "type4");
  EXPECT_EQ(f.tensor("q5_0").nbytes, 22u);
  for (const auto& info : f.tensors()) EXPECT_EQ(info.offset % 32, 0u) << info.name;
  expect_error([&] { (void)f.tensor("nope"); }, ErrorCode::kFormat, "no tensor 'nope'");
}

TEST(Gguf, DequantizeEveryType) {
  const File f = File::from_bytes(tensor_file());
  {
    const auto t = f.dequantize("f32");
    EXPECT_EQ(t.shape(), (flashinfer::Shape{4, 3, 2}));
    const auto v = floats(t);
    for (int i = 0; i < 24; ++i) EXPECT_EQ(v[i], static_cast<float>(i) * 0.5f - 3.0f);
  }
  EXPECT_EQ(floats(f.dequantize("f16")),
            (std::vector<float>{1.0f, -2.0f, 0.333251953125f, std::ldexp(1.0f, -24), 65504.0f}));
  EXPECT_EQ(floats(f.dequantize("bf16")), (std::vector<float>{1.0f, -5.0f, 0.333984375f}));
  {
    const auto v = floats(f.dequantize("q8_0"));
    ASSERT_EQ(v.size(), 64u);
    for (int j = 0; j < 32; ++j) {
      EXPECT_EQ(v[j], 0.5f * static_cast<float>(8 * j - 128)) << j;
      EXPECT_EQ(v[32 + j], -0.25f * static_cast<float>(127 - j)) << j;
    }
  }
  {
    const auto v = floats(f.dequantize("q4_0"));
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(v[j], 2.0f * static_cast<float>(j - 8)) << j;       // low nibble
      EXPECT_EQ(v[16 + j], 2.0f * static_cast<float>(7 - j)) << j;  // high nibble
    }
  }
  {
    const auto v = floats(f.dequantize("q4_1"));
    const double dm[3][2] = {{0.25, -1.0}, {std::ldexp(1.0, -24), 8192.0}, {-0.5, 0.125}};
    for (int r = 0; r < 3; ++r) {
      for (int j = 0; j < 16; ++j) {
        // fp64 is exact here; one rounding to float32 is what ggml's float32 math gives.
        EXPECT_EQ(v[32 * r + j], static_cast<float>(dm[r][0] * j + dm[r][1])) << r << "," << j;
        EXPECT_EQ(v[32 * r + 16 + j], static_cast<float>(dm[r][0] * (15 - j) + dm[r][1]));
      }
    }
    EXPECT_EQ(v[32 + 15], 8192.0f);  // 8192 + 15 * 2^-24 rounds back to 8192
    // bfloat16: the float32 values rounded to nearest even.
    const auto bf = f.dequantize("q4_1", DType::kBFloat16);
    EXPECT_EQ(bf.dtype(), DType::kBFloat16);
    EXPECT_EQ(bf.shape(), (flashinfer::Shape{3, 32}));
    const uint16_t* p = bf.data<uint16_t>();
    for (int i = 0; i < 96; ++i) EXPECT_EQ(p[i], flashinfer::float_to_bfloat16_bits(v[i])) << i;
    EXPECT_EQ(p[64 + 1], 0xBEC0);   // -0.5 * 1 + 0.125 = -0.375
    EXPECT_EQ(p[64 + 16], 0xC0EC);  // -0.5 * 15 + 0.125 = -7.375
    EXPECT_EQ(p[0], 0xBF80);        // 0.25 * 0 - 1 = -1
  }
  expect_error([&] { (void)f.dequantize("q5_0"); }, ErrorCode::kUnsupported, "Q5_0");
  expect_error([&] { (void)f.dequantize("f32", DType::kFloat16); }, ErrorCode::kUnsupported,
               "float16");
}

TEST(Gguf, EmptyTensorWithHugeRows) {
  // No elements (a zero dimension), so no bytes, whatever the row length.
  B b;
  b.tensor_at("e", {uint64_t{1} << 40, 0}, 3, 0);
  const File f = File::from_bytes(b.build());
  const auto& info = f.tensor("e");
  EXPECT_EQ(info.nbytes, 0u);
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    const auto t = f.dequantize(info, dt);
    EXPECT_EQ(t.shape(), (flashinfer::Shape{0, int64_t{1} << 40}));
    EXPECT_EQ(t.numel(), 0);
  }
  EXPECT_EQ(f.raw_tensor(info).numel(), 0);
}

TEST(Gguf, RawBlocks) {
  const File f = File::from_bytes(tensor_file());
  const auto& info = f.tensor("q4_1");
  const auto raw = f.raw_data(info);
  ASSERT_EQ(raw.size(), 60u);
  const auto t = f.raw_tensor(info);
  EXPECT_EQ(t.dtype(), DType::kUInt8);
  EXPECT_EQ(t.shape(), (flashinfer::Shape{3, 20}));
  EXPECT_EQ(t.data_ptr(), static_cast<const void*>(raw.data()));  // no copy
  // The documented block struct reads the same values as dequantize.
  flashinfer::gguf::BlockQ4_1 blk;
  std::memcpy(&blk, raw.data() + 40, sizeof blk);
  const float d = flashinfer::half_bits_to_float(blk.d);
  const float m = flashinfer::half_bits_to_float(blk.m);
  EXPECT_EQ(d, -0.5f);
  EXPECT_EQ(m, 0.125f);
  const auto v = floats(f.dequantize(info));
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v[64 + j], d * static_cast<float>(blk.qs[j] & 0xF) + m);
    EXPECT_EQ(v[64 + 16 + j], d * static_cast<float>(blk.qs[j] >> 4) + m);
  }
  // A TensorInfo that does not describe this file's data is refused.
  auto forged = info;
  forged.nbytes += 20;
  expect_error([&] { (void)f.raw_data(forged); }, ErrorCode::kInvalidArgument, "q4_1");
  forged = info;
  forged.ne = {64, 3};
  expect_error([&] { (void)f.dequantize(forged); }, ErrorCode::kInvalidArgument, "q4_1");
  forged = info;
  forged.offset = 1u << 20;
  expect_error([&] { (void)f.raw_tensor(forged); }, ErrorCode::kInvalidArgument, "q4_1");
}

TEST(Gguf, OpensFilesAndRejectsNonRegular) {
  const fs::path p = scratch("t.gguf");
  std::ofstream(p, std::ios::binary) << tensor_file();
  const File f = File::open(p.string());
  EXPECT_EQ(f.path(), p.string());
  EXPECT_EQ(f.file_size(), tensor_file().size());
  EXPECT_EQ(floats(f.dequantize("bf16")), (std::vector<float>{1.0f, -5.0f, 0.333984375f}));
  // The mapping outlives the File through a tensor that shares it.
  flashinfer::Tensor raw;
  {
    const File g = File::open(p.string());
    raw = g.raw_tensor(g.tensor("q8_0"));
  }
  EXPECT_EQ(raw.data<uint8_t>()[0], 0x00);
  EXPECT_EQ(raw.data<uint8_t>()[1], 0x38);

  expect_error([&] { (void)File::open(scratch("missing.gguf").string()); }, ErrorCode::kIo,
               "cannot open");
  expect_error([&] { (void)File::open(scratch("").string()); }, ErrorCode::kIo,
               "not a regular file");
  const fs::path fifo = scratch("fifo.gguf");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { (void)File::open(fifo.string()); }, ErrorCode::kIo, "not a regular file");
  const fs::path empty = scratch("empty.gguf");
  std::ofstream(empty).close();
  expect_error([&] { (void)File::open(empty.string()); }, ErrorCode::kFormat, "bad magic");
  fs::remove_all(p.parent_path());
}

// ---- malformed files ----

TEST(Gguf, EveryTruncationIsAnError) {
  const std::string whole = tensor_file();
  for (std::size_t n = 0; n < whole.size(); ++n) {
    try {
      (void)File::from_bytes(whole.substr(0, n), "cut.gguf");
      ADD_FAILURE() << "a file cut to " << n << " of " << whole.size() << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFormat) << e.what();
      EXPECT_NE(std::string(e.what()).find("cut.gguf"), std::string::npos) << e.what();
    }
  }
  // A tensor-less file may end without the padding; built unpadded, every cut is into an entry.
  B mb = metadata_file();
  mb.alignment = 1;
  const std::string meta = mb.build();
  EXPECT_EQ(File::from_bytes(meta).keys().size(), 19u);
  for (std::size_t n = 0; n < meta.size(); ++n) {
    EXPECT_THROW((void)File::from_bytes(meta.substr(0, n)), Error) << n;
  }
}

TEST(Gguf, BadHeader) {
  std::string s = tensor_file();
  s[0] = 'g';
  expect_bad(s, "bad magic");
  for (uint32_t v : {0u, 1u, 4u, 0xFFFFFFFFu}) {
    B b;
    b.version = v;
    expect_bad(b.build(), "unsupported version " + std::to_string(v));
  }
  B b;
  b.tensor_count_override = int64_t{1} << 40;
  expect_bad(b.build(), "tensor count");
  b = B{};
  b.kv_count_override = int64_t{1} << 60;
  expect_bad(b.build(), "metadata count");
  b = B{};
  b.kv_count_override = 1000;  // under the limit, but the file cannot hold them
  expect_bad(b.build(), "cannot fit");
  b = B{};
  b.tensor_count_override = 1000;
  expect_bad(b.build(), "cannot fit");
}

TEST(Gguf, BadMetadata) {
  expect_bad(B{}.kv("k", B::kString, B::u64(~uint64_t{0}) + "x").build(), "limit");
  expect_bad(B{}.kv("k", B::kString, B::u64(100) + "x").build(), "truncated");
  expect_bad(B{}.kv("k", 13, B::u32(0)).build(), "unknown value type 13");
  expect_bad(B{}.kv("k", B::kArray, B::array(13, 0, "")).build(), "unknown array element type");
  expect_bad(B{}.kv("k", B::kBool, B::le(2, 1)).build(), "neither 0 nor 1");
  expect_bad(B{}.kv("k", B::kArray, B::array(B::kBool, 2, std::string("\x01\x07", 2))).build(),
             "bool element 1");
  // Counts the rest of the file cannot hold, including ones whose byte size overflows.
  for (uint32_t et : {B::kU8, B::kU32, B::kU64, B::kString, B::kArray}) {
    for (uint64_t n : {uint64_t{1000}, uint64_t{1} << 62, ~uint64_t{0}}) {
      expect_bad(B{}.kv("k", B::kArray, B::array(et, n, std::string(16, '\0'))).build(),
                 "cannot fit");
    }
  }
  // Arrays nested kMaxArrayDepth deep are fine, one more is not.
  auto nest = [](int depth) {
    std::string v = B::array(B::kU8, 1, "\x05");
    for (int k = 1; k < depth; ++k) v = B::array(B::kArray, 1, v);
    return B{}.kv("deep", B::kArray, v).build();
  };
  const File ok = File::from_bytes(nest(flashinfer::gguf::kMaxArrayDepth));
  EXPECT_EQ(ok.get("deep").arrays.size(), 1u);
  expect_bad(nest(flashinfer::gguf::kMaxArrayDepth + 1), "nested deeper");
  expect_bad(B{}.kv("k", B::kU8, "\x01").kv("k", B::kU8, "\x02").build(), "duplicate metadata key");
  for (const std::string& a : {B::u32(0), B::u32(3), B::u32(48), B::u32(1u << 21)}) {
    expect_bad(B{}.kv("general.alignment", B::kU32, a).build(), "general.alignment");
  }
  expect_bad(B{}.kv("general.alignment", B::kU64, B::u64(32)).build(), "must be uint32");
}

TEST(Gguf, BadTensorInfos) {
  const std::string f4 = B::f32(1) + B::f32(2) + B::f32(3) + B::f32(4);
  expect_bad(B{}.tensor("t", {1, 1, 1, 1, 1}, 0, B::f32(0)).build(), "5 dimensions");
  expect_bad(B{}.tensor_at("t", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0).build(),
             "dimensions overflow");
  expect_bad(B{}.tensor_at("t", {uint64_t{1} << 63}, 0, 0).build(), "dimensions overflow");
  expect_bad(B{}.tensor_at("t", {uint64_t{1} << 40, uint64_t{1} << 22}, 0, 0).build(),
             "byte size overflows");
  expect_bad(B{}.tensor("t", {4}, 4, f4).build(), "unknown ggml type 4");
  expect_bad(B{}.tensor("t", {48}, 3, std::string(40, '\0')).build(), "not a multiple");
  expect_bad(B{}.tensor("t", {4}, 0, f4).tensor("t", {4}, 0, f4).build(), "duplicate tensor");
  // Data past the end: by one byte, at an offset past the end, and with a huge element count.
  expect_bad(B{}.tensor("t", {5}, 0, f4).build(), "runs past the end");
  expect_bad(B{}.tensor_at("t", {1}, 0, 1u << 20).data(f4).build(), "runs past the end");
  expect_bad(B{}.tensor_at("t", {uint64_t{1} << 40}, 8, 0).data(f4).build(), "runs past the end");
  // A misaligned offset.
  expect_bad(B{}.tensor_at("t", {1}, 0, 4).data(f4 + f4).build(),
             "not a multiple of the alignment");
  // Tensor infos whose data section would start past the end of the file.
  {
    B b;
    b.tensor_at("t", {0}, 0, 0);
    std::string s = b.build();
    s.resize(s.size() - 1);
    expect_bad(s, "data section would start");
  }
  expect_bad(B{}.tensor_at(std::string(5000, 'n'), {1}, 0, 0).data(f4).build(), "limit");
}

// ---- the real model against the gguf package ----

uint64_t checksum(const float* v, std::size_t n) {
  uint64_t sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, 4);
    sum += uint64_t{bits} * (2 * uint64_t{i} + 1);
  }
  return sum;
}

TEST(GgufModel, MatchesGgufPackageBitForBit) {
  const std::string model = flashinfer::gguf::default_model_path();
  if (!fs::exists(model)) {
    GTEST_SKIP() << "model file " << model
                 << " is absent (scripts/bootstrap fetches it; FLASHINFER_MODEL_PATH overrides)";
  }
  const File f = File::open(model);
  // Facts of SmolLM2-135M-Instruct (issue 22).
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count"), 30u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 576u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), 9u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(f.get_u32("llama.feed_forward_length"), 1536u);
  EXPECT_EQ(f.get_f32("llama.rope.freq_base"), 100000.0f);
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_EQ(f.tensors().size(), 272u);

  // The embedding (Q8_0), layer 0 (Q4_1 and F32) and the last norm by default; every tensor
  // with FLASHINFER_GGUF_TEST_ALL=1 (python takes some seconds more).
  const char* all = std::getenv("FLASHINFER_GGUF_TEST_ALL");
  const bool every = all != nullptr && std::string(all) == "1";
  const std::vector<std::string> bytes_of = {"blk.0.attn_q.weight", "blk.0.attn_norm.weight",
                                             "output_norm.weight"};
  const fs::path out = scratch("ref");
  std::string cmd = "/usr/bin/python3 " + FLASHINFER_TEST_SOURCE_DIR +
                    "/tests/formats/gguf_reference.py '" + model + "' '" + out.string() + "'" +
                    (every ? " --all" : " token_embd. blk.0. output_norm.") + " --bytes";
  for (const auto& n : bytes_of) cmd += " " + n;
  const auto r = flashinfer::testing::run_command(cmd + " 2>&1");
  if (r.status == 77) {  // the script's exit status without gguf / numpy
    GTEST_SKIP()
        << "the gguf PyPI package is not installed for /usr/bin/python3 (scripts/bootstrap)";
  }
  ASSERT_EQ(r.status, 0) << r.out;

  std::ifstream sums(out / "sums.txt");
  std::string line;
  std::map<std::string, int> seen_types;
  int n = 0;
  while (std::getline(sums, line)) {
    std::istringstream ls(line);
    std::string name, type, shape;
    uint64_t sum = 0;
    ls >> name >> type >> shape >> sum;
    const auto& info = f.tensor(name);
    EXPECT_EQ(flashinfer::gguf::ggml_type_name(info.type), type) << name;
    std::string ne;
    for (std::size_t d = 0; d < info.ne.size(); ++d)
      ne += (d ? "," : "") + std::to_string(info.ne[d]);
    EXPECT_EQ(ne, shape) << name;
    const auto t = f.dequantize(info);
    EXPECT_EQ(checksum(t.data<float>(), static_cast<std::size_t>(t.numel())), sum) << name;
    ++seen_types[type];
    ++n;
  }
  EXPECT_EQ(n, every ? 272 : 11);
  EXPECT_EQ(seen_types["Q8_0"], 1);
  EXPECT_GE(seen_types["Q4_1"], 7);
  EXPECT_GE(seen_types["F32"], 3);
  for (const auto& name : bytes_of) {
    const auto t = f.dequantize(name);
    const std::string ref = read_file(out / (name + ".f32"));
    ASSERT_EQ(ref.size(), t.nbytes()) << name;
    EXPECT_EQ(std::memcmp(ref.data(), t.data_ptr(), ref.size()), 0) << name;
    const auto b = f.dequantize(name, DType::kBFloat16);
    const std::string refb = read_file(out / (name + ".bf16"));
    ASSERT_EQ(refb.size(), b.nbytes()) << name;
    EXPECT_EQ(std::memcmp(refb.data(), b.data_ptr(), refb.size()), 0) << name;
  }
  fs::remove_all(out.parent_path());
}

TEST(GgufModel, DefaultModelPathHonoursEnvironment) {
  {
    const flashinfer::testing::ScopedEnv set("FLASHINFER_MODEL_PATH", "/x/y.gguf");
    EXPECT_EQ(flashinfer::gguf::default_model_path(), "/x/y.gguf");
  }
  const flashinfer::testing::ScopedEnv unset("FLASHINFER_MODEL_PATH", nullptr);
  const std::string p = flashinfer::gguf::default_model_path();
  EXPECT_NE(p.find("/flashinfer-cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf"), std::string::npos);
}

}  // namespace
