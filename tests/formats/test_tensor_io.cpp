// save_torch / save_safetensors: byte-level structure checked here, and the files loaded back
// by Debian's python3-torch (torch.load(..., weights_only=True)) and, when installed, the
// safetensors package.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/tensor_io.h"
#include "formats/dedup_store.h"
#include "formats/pickle_writer.h"
#include "formats/reader_limits.h"
#include "formats/torch_archive.h"
#include "formats/zip_writer.h"
#include "recorder/dump_writer.h"
#include "recorder/python_json.h"
#include "util/remove_at_exit.h"
#include "util/run_command.h"
#include "util/torch_archive.h"
#include "util/upstream_dump_py.h"
#include "util/zip_writer.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("fi_tensor_io_" + std::to_string(::getpid()));
  if (fs::create_directories(dir)) testing::remove_at_exit(dir);
  return dir / name;
}

std::string run(const std::string& cmd, int* status) {
  auto r = testing::run_command(cmd);
  *status = r.status;
  return r.out;
}

// Exit status of a Python helper whose module is not installed (the test skips).
constexpr int kPythonModuleMissing = 77;

uint32_t le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

TEST(SaveTorch, ZipLayoutIsStoredAndAligned) {
  Tensor a = Tensor::from_vector({1, 2, 3}, {3}, DType::kFloat32);
  const fs::path p = scratch("inputs.pt");
  save_torch(p.string(), {{"arg_0", a}});
  const std::string z = read_file(p);
  ASSERT_GT(z.size(), 30u);
  EXPECT_EQ(le32(z, 0), 0x04034b50u);  // local file header
  // Walk the local headers: each entry STORED, each data block 64-byte aligned.
  size_t pos = 0;
  std::vector<std::string> names;
  while (le32(z, pos) == 0x04034b50u) {
    const uint16_t method =
        static_cast<uint8_t>(z[pos + 8]) | (static_cast<uint8_t>(z[pos + 9]) << 8);
    EXPECT_EQ(method, 0);
    const uint32_t size = le32(z, pos + 18);
    const size_t nlen =
        static_cast<uint8_t>(z[pos + 26]) | (static_cast<uint8_t>(z[pos + 27]) << 8);
    const size_t xlen =
        static_cast<uint8_t>(z[pos + 28]) | (static_cast<uint8_t>(z[pos + 29]) << 8);
    names.push_back(z.substr(pos + 30, nlen));
    const size_t data = pos + 30 + nlen + xlen;
    EXPECT_EQ(data % 64, 0u) << names.back();
    pos = data + size;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"inputs/data.pkl", "inputs/byteorder", "inputs/data/0",
                                             "inputs/version"}));
  const size_t data0 = z.find(std::string("\0\0\x80\x3f\0\0\0\x40", 8));  // 1.0f, 2.0f
  EXPECT_NE(data0, std::string::npos);
}

// Another thread writing every 61st of `n` bytes again and again, from construction until
// destruction (stopped and joined however the test ends), as a peer rank writes a shared
// workspace while it is recorded.
class BusyWriter {
 public:
  BusyWriter(uint8_t* bytes, int64_t n)
      : t_([this, bytes, n] {
          for (uint8_t v = 1; !stop_.load(std::memory_order_relaxed); ++v) {
            for (int64_t i = 0; i < n; i += 61) __atomic_store_n(&bytes[i], v, __ATOMIC_RELAXED);
          }
        }) {}
  ~BusyWriter() {
    stop_ = true;
    t_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread t_;
};

// The archive writer of save_torch and the recorder (formats::write_archive_copied): byte for
// byte a zip written entry by entry when nothing else writes the tensor, and a valid archive
// (every CRC that of the bytes in the file) when another thread writes into it throughout, as a
// peer rank writes a workspace both share. Computing the CRC from the tensor and then writing the
// tensor left a CRC mismatch that load_torch refuses
// (MoeA2aModuleReplay.RecordedRanksReplayTogether failed 1 run in 20).
TEST(SaveTorch, ArchiveOfATensorWrittenMeanwhileIsValid) {
  // 64 KiB: copied whole, one write(2); 6 MiB: streamed through a buffer with pwrite(2).
  for (const int64_t n : {int64_t{16} << 10, int64_t{6} << 20}) {
    for (const bool append : {false, true}) {
      SCOPED_TRACE(std::to_string(n) + " bytes" + (append ? ", O_APPEND" : ""));
      Tensor x = Tensor::zeros({n}, DType::kUInt8);
      auto* bytes = static_cast<uint8_t*>(x.data_ptr());
      for (int64_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 7);
      const Tensor small = Tensor::from_vector({1.5, -2.0}, {2}, DType::kFloat32);
      const std::vector<formats::TorchItem> items = {{"x", DType::kUInt8, {n}, {1}, 0, n},
                                                     {"small", DType::kFloat32, {2}, {1}, 0, 2}};
      formats::ArchivePlan plan =
          formats::plan_torch_archive("arch", items, {x.data_ptr(), small.data_ptr()});
      const auto write = [&](const fs::path& p) {
        const int fd =
            ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | (append ? O_APPEND : 0), 0644);
        ASSERT_GE(fd, 0);
        EXPECT_TRUE(formats::write_archive_copied(fd, plan));
        EXPECT_EQ(::lseek(fd, 0, SEEK_CUR), static_cast<off_t>(plan.size));
        ::close(fd);
      };
      // Quiet: the bytes of a zip written entry by entry (ZipWriter), and save_torch's.
      const fs::path quiet = scratch("arch.pt"), ref = scratch("ref/arch.pt"),
                     saved = scratch("saved/arch.pt");
      fs::create_directories(ref.parent_path());
      fs::create_directories(saved.parent_path());
      write(quiet);
      {
        testing::ZipWriter z(ref.string());
        const std::string pkl = formats::torch_data_pkl(items);
        z.add("arch/data.pkl", pkl.data(), pkl.size());
        z.add("arch/byteorder", "little", 6);
        z.add("arch/data/0", x.data_ptr(), static_cast<std::size_t>(n));
        z.add("arch/data/1", small.data_ptr(), 8);
        z.add("arch/version", "3\n", 2);
        z.finish();
      }
      EXPECT_EQ(read_file(quiet), read_file(ref));
      save_torch(saved.string(), {{"x", x}, {"small", small}});
      EXPECT_EQ(read_file(saved), read_file(ref));
      // Written meanwhile: every byte of x changes again and again while the archive is written.
      const BusyWriter writer(bytes, n);
      for (int k = 0; k < 6; ++k) {
        const fs::path busy = scratch("busy" + std::to_string(k) + ".pt");
        write(busy);
        NamedTensors back;
        ASSERT_NO_THROW(back = load_torch(busy.string()));  // a CRC mismatch throws
        ASSERT_EQ(back.size(), 2u);
        EXPECT_EQ(back[0].second.numel(), n);
        EXPECT_EQ(back[1].second.to_double_vector(), (std::vector<double>{1.5, -2.0}));
        // save_torch too: the flight recorder's first calls in a process write through it (a
        // CRC mismatch failed MoeA2aModuleReplay.RecordedRanksReplayTogether in CI, session 66).
        const fs::path saved_busy = scratch("saved_busy" + std::to_string(k) + ".pt");
        save_torch(saved_busy.string(), {{"x", x}, {"small", small}});
        ASSERT_NO_THROW(back = load_torch(saved_busy.string()));
        EXPECT_EQ(back[0].second.numel(), n);
      }
    }
  }
}

// The recorder's content-addressed store (FLASHINFER_DUMP_DEDUP=1): a blob's name is the hash
// of its bytes, which load_dedup_refs checks, so both come from one copy of a tensor another
// thread writes meanwhile (hashed from the tensor, then written from it: a "corrupt blob").
TEST(SaveTorch, DedupBlobOfATensorWrittenMeanwhileMatchesItsName) {
  const int64_t n = int64_t{1} << 20;
  Tensor x = Tensor::zeros({n}, DType::kUInt8);
  auto* bytes = static_cast<uint8_t*>(x.data_ptr());
  recorder::Config cfg;
  cfg.dump_dir = scratch("dedup").string();
  cfg.dedup = true;
  fs::create_directories(cfg.dump_dir);
  recorder::internal::DumpWriter writer(cfg, [](const std::string&) {});
  const BusyWriter busy(bytes, n);
  for (int k = 0; k < 6; ++k) {
    const fs::path call = fs::path(cfg.dump_dir) / ("call" + std::to_string(k));
    fs::create_directories(call);
    writer.write_tensors(call.string(), "inputs", {{"x", x}});
    NamedTensors back;
    ASSERT_NO_THROW(back = formats::load_dedup_refs((call / "inputs.refs.json").string()));
    ASSERT_EQ(back.size(), 1u);
    EXPECT_EQ(back[0].second.numel(), n);
  }
}

TEST(SaveSafetensors, HeaderIsAlignedAndTiled) {
  Tensor a = Tensor::from_vector({1, 2}, {2}, DType::kFloat16);
  Tensor b = Tensor::from_vector({1, 2, 3}, {3}, DType::kFloat32);
  Tensor c = Tensor::from_vector({448, -2}, {2}, DType::kFloat8E4M3FN);
  const fs::path p = scratch("x.safetensors");
  save_safetensors(p.string(), {{"a", a}, {"b", b.slice(0, 0, 3, 2)}, {"c", c}});
  const std::string s = read_file(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(s[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(s[8], '{');
  const auto h = nlohmann::json::parse(s.substr(8, n));
  // Descending alignment: f32 first, then f16, then fp8.
  EXPECT_EQ(h["b"]["data_offsets"], nlohmann::json({0, 8}));
  EXPECT_EQ(h["a"]["data_offsets"], nlohmann::json({8, 12}));
  EXPECT_EQ(h["c"]["data_offsets"], nlohmann::json({12, 14}));
  EXPECT_EQ(h["c"]["dtype"], "F8_E4M3");
  EXPECT_EQ(8 + n + 14, s.size());
  EXPECT_EQ(static_cast<uint8_t>(s[8 + n + 12]), 0x7E);  // 448 in e4m3fn
}

TEST(TensorIo, UnwritablePathIsAnIoError) {
  Tensor a = Tensor::zeros({1}, DType::kFloat32);
  try {
    save_torch("/nonexistent_dir_fi/x.pt", {{"a", a}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
  }
  EXPECT_THROW(save_safetensors("/nonexistent_dir_fi/x.safetensors", {{"a", a}}), Error);
}

TEST(LoadTorch, RoundTripKeepsEverything) {
  Tensor base =
      Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4}, DType::kFloat32);
  Tensor view = base.transpose(0, 1).slice(0, 1, 3);
  Tensor f8 = Tensor::from_vector({448, -0.5, 0.001953125}, {3}, DType::kFloat8E4M3FN);
  Tensor e5 = Tensor::from_vector({57344, 1.5}, {2}, DType::kFloat8E5M2);
  Tensor fp4 = Tensor::from_vector({0.5, -6, 1, 3}, {2}, DType::kFloat4E2M1FNx2);
  Tensor i16 = Tensor::from_vector({-300, 300}, {2}, DType::kInt16);
  Tensor big = Tensor::empty({70000}, DType::kInt32);  // BININT for sizes >= 65536
  big.uniform_(1, -1000, 1000);
  // Over 4 MiB: the writer computes this entry's CRC while writing and patches it in after;
  // the reader checks every CRC, so a wrong patch fails the load.
  Tensor huge = Tensor::empty({1 << 21}, DType::kFloat32);
  huge.uniform_(2);
  const fs::path ph = scratch("huge.pt");
  save_torch(ph.string(), {{"huge", huge}});
  EXPECT_EQ(load_torch(ph.string())[0].second.to_double_vector(), huge.to_double_vector());
  const fs::path p = scratch("rt.pt");
  save_torch(p.string(),
             {{"view", view}, {"f8", f8}, {"e5", e5}, {"fp4", fp4}, {"i16", i16}, {"big", big}});
  NamedTensors back = load_torch(p.string());
  ASSERT_EQ(back.size(), 6u);
  EXPECT_EQ(back[0].first, "view");
  EXPECT_EQ(back[0].second.shape(), view.shape());
  EXPECT_EQ(back[0].second.strides(), view.strides());
  EXPECT_EQ(back[0].second.to_double_vector(), view.to_double_vector());
  EXPECT_EQ(back[1].second.dtype(), DType::kFloat8E4M3FN);
  EXPECT_EQ(back[1].second.to_double_vector(), f8.to_double_vector());
  EXPECT_EQ(back[2].second.dtype(), DType::kFloat8E5M2);
  EXPECT_EQ(back[2].second.to_double_vector(), e5.to_double_vector());
  EXPECT_EQ(back[3].second.dtype(), DType::kFloat4E2M1FNx2);
  EXPECT_EQ(back[3].second.to_double_vector(), fp4.to_double_vector());
  EXPECT_EQ(back[4].second.to_double_vector(), i16.to_double_vector());
  EXPECT_EQ(back[5].second.to_double_vector(), big.to_double_vector());
}

// Our files read by torch.load(weights_only=True) and the safetensors package, and a file
// written by torch.save read by load_torch: one test and one interpreter start for all three
// (importing torch takes seconds; ctest runs each test in its own process).
TEST(TorchInterop, TorchReadsOurFilesAndWeReadTorchs) {
  Tensor f16 = Tensor::from_vector({0.5, -1.25, 3, 4, 5, 6}, {2, 3}, DType::kFloat16);
  Tensor base =
      Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4}, DType::kFloat32);
  Tensor view = base.transpose(0, 1).slice(0, 1, 3);  // [2, 3] strides (1, 4) offset 1
  Tensor bf = Tensor::from_vector({1.5, -2}, {2, 1}, DType::kBFloat16);
  Tensor i64 = Tensor::from_vector({-5, 1LL << 40}, {2}, DType::kInt64);
  Tensor i32 = Tensor::from_vector({7}, {}, DType::kInt32);  // 0-d
  Tensor b = Tensor::from_vector({1, 0, 1}, {3}, DType::kBool);
  Tensor u8 = Tensor::from_vector({255, 0}, {2}, DType::kUInt8);
  Tensor empty = Tensor::empty({0, 4}, DType::kFloat32);
  const fs::path ours_pt = scratch("outputs.pt");
  save_torch(ours_pt.string(), {{"result_0", f16},
                                {"view", view},
                                {"bf", bf},
                                {"i64", i64},
                                {"scalar", i32},
                                {"mask", b},
                                {"u8", u8},
                                {"empty", empty}});
  Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::kBFloat16);
  const fs::path ours_st = scratch("y.safetensors");
  save_safetensors(ours_st.string(), {{"arg_0", a.transpose(0, 1)},
                                      {"kwarg_x", Tensor::full({1}, 3, DType::kInt64)}});
  const fs::path theirs = scratch("from_torch.pt");

  int st = 0;
  const std::string out = run("/usr/bin/python3 " + FLASHINFER_TEST_SOURCE_DIR +
                                  "/tests/formats/load_with_torch.py --write " + theirs.string() +
                                  " " + ours_pt.string() + " " + ours_st.string(),
                              &st);
  if (st == kPythonModuleMissing) {
    GTEST_SKIP() << "python3-torch not installed (scripts/bootstrap installs it)";
  }
  ASSERT_EQ(st, 0) << out;
  const nlohmann::json all = nlohmann::json::parse(out);

  {
    SCOPED_TRACE("torch.load of save_torch's file");
    const nlohmann::json& j = all.at(ours_pt.string());
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j["result_0"]["dtype"], "torch.float16");
    EXPECT_EQ(j["result_0"]["values"], nlohmann::json({0.5, -1.25, 3, 4, 5, 6}));
    EXPECT_EQ(j["view"]["shape"], nlohmann::json({2, 3}));
    EXPECT_EQ(j["view"]["stride"], nlohmann::json({1, 4}));
    EXPECT_EQ(j["view"]["values"], nlohmann::json({1, 5, 9, 2, 6, 10}));
    EXPECT_EQ(j["view"]["storage_offset"], 0);  // only the covered span [1, 11) is stored
    EXPECT_EQ(j["bf"]["dtype"], "torch.bfloat16");
    EXPECT_EQ(j["bf"]["values"], nlohmann::json({1.5, -2}));
    EXPECT_EQ(j["i64"]["dtype"], "torch.int64");
    EXPECT_EQ(j["i64"]["values"][1], 1099511627776.0);
    EXPECT_EQ(j["scalar"]["shape"], nlohmann::json::array());
    EXPECT_EQ(j["scalar"]["values"], nlohmann::json({7}));
    EXPECT_EQ(j["mask"]["dtype"], "torch.bool");
    EXPECT_EQ(j["mask"]["values"], nlohmann::json({1, 0, 1}));
    EXPECT_EQ(j["u8"]["values"], nlohmann::json({255, 0}));
    EXPECT_EQ(j["empty"]["shape"], nlohmann::json({0, 4}));
  }
  {
    SCOPED_TRACE("load_torch of torch.save's file");
    NamedTensors t = load_torch(theirs.string());
    ASSERT_EQ(t.size(), 3u);
    EXPECT_EQ(t[0].first, "arg_0");
    EXPECT_EQ(t[0].second.shape(), (Shape{2, 3}));
    EXPECT_EQ(t[0].second.strides(), (Shape{1, 4}));
    EXPECT_EQ(t[0].second.storage_offset(), 1);
    EXPECT_EQ(t[0].second.to_double_vector(), (std::vector<double>{1, 5, 9, 2, 6, 10}));
    EXPECT_EQ(t[1].second.dtype(), DType::kInt64);
    // Views of one storage share it, as in torch.
    EXPECT_EQ(t[0].second.storage(), t[2].second.storage());
  }
  // Last: the safetensors package is optional (null when it is not installed).
  const nlohmann::json& j = all.at(ours_st.string());
  if (j.is_null()) GTEST_SKIP() << "the safetensors package is not installed";
  EXPECT_EQ(j["arg_0"]["shape"], nlohmann::json({3, 2}));
  EXPECT_EQ(j["arg_0"]["values"], nlohmann::json({1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(j["kwarg_x"]["values"], nlohmann::json({3}));
}

// torch.uint16 / uint32 / uint64 (torch >= 2.3; multi-item scoring's positions and prefix
// lengths, xqa's masks, grouped_gemm_nt_masked's signals) have no dtype here: their bits load as
// int16 / int32 / int64 (uint16 and uint32 values above the signed range here). Written as torch
// writes them
// (_rebuild_tensor_v3 over an UntypedStorage; by hand, torch 1.13 having none of them).
TEST(LoadTorch, UnsignedTorchDtypesLoadAsTheSignedBitsOfTheirWidth) {
  namespace fs = std::filesystem;
  const fs::path dir = scratch("unsigned_dtypes");
  const fs::path file = dir / "u.pt";
  const std::string py = std::string(testing::kTorchSavePy) + R"PY(
save({"u16": ("u16", torch.tensor([1, 40000 - 65536, 0], dtype=torch.int16)),
      "u32": ("u32", torch.tensor([7, 3000000000 - 4294967296], dtype=torch.int32)),
      "u64": ("u64", torch.tensor([5], dtype=torch.int64))}, sys.argv[1])
)PY";
  if (!testing::run_python_scripts(dir, {{py, file}}))
    GTEST_SKIP() << "python3-torch not installed";
  const NamedTensors t = load_torch(file.string());
  ASSERT_EQ(t.size(), 3u);
  for (const auto& [name, x] : t) {
    if (name == "u16") {
      ASSERT_EQ(x.dtype(), DType::kInt16);
      EXPECT_EQ(static_cast<uint16_t>(x.data<int16_t>()[1]), 40000);
    } else if (name == "u32") {
      ASSERT_EQ(x.dtype(), DType::kInt32);
      EXPECT_EQ(static_cast<uint32_t>(x.data<int32_t>()[1]), 3000000000u);
    } else {
      ASSERT_EQ(x.dtype(), DType::kInt64);
      EXPECT_EQ(x.data<int64_t>()[0], 5);
    }
  }
  fs::remove_all(dir);
}

TEST(LoadSafetensors, RoundTripAndSpecViolations) {
  Tensor a = Tensor::from_vector({1, 2, 3, 4}, {2, 2}, DType::kBFloat16);
  Tensor fp4 = Tensor::from_vector({0.5, -6, 1, 3}, {1, 2}, DType::kFloat4E2M1FNx2);
  const fs::path p = scratch("rt.safetensors");
  save_safetensors(p.string(), {{"a", a.transpose(0, 1)}, {"fp4", fp4}});
  NamedTensors back = load_safetensors(p.string());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].first, "a");
  EXPECT_EQ(back[0].second.to_double_vector(), (std::vector<double>{1, 3, 2, 4}));
  EXPECT_EQ(back[1].second.shape(), (Shape{1, 2}));
  EXPECT_EQ(back[1].second.to_double_vector(), fp4.to_double_vector());

  auto file = [](const std::string& header, const std::string& data) {
    std::string h = header;
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i)
      s[i] = static_cast<char>(static_cast<uint64_t>(h.size()) >> (8 * i));
    return s + h + data;
  };
  const std::string ok_header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(load_safetensors_bytes(file(ok_header, std::string(8, '\0'))).size(), 1u);
  auto rejects = [&](const std::string& bytes) {
    try {
      load_safetensors_bytes(bytes, "bad.safetensors");
      return false;
    } catch (const Error& e) {
      return e.code() == ErrorCode::kFormat;
    }
  };
  EXPECT_TRUE(rejects(file(ok_header, std::string(9, '\0'))));  // trailing byte
  EXPECT_TRUE(rejects(file(ok_header, std::string(7, '\0'))));  // short buffer
  EXPECT_TRUE(rejects(file(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                           std::string(8, '\0'))));  // size mismatch
  EXPECT_TRUE(rejects(file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           std::string(8, '\0'))));  // gap
  EXPECT_TRUE(rejects(file(R"({"x":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})",
                           std::string(8, '\0'))));  // dtype
  EXPECT_TRUE(rejects(file(R"([1,2])", "")));
  EXPECT_TRUE(rejects(file(R"({"x":)", "")));
  EXPECT_TRUE(rejects(file(R"({"__metadata__":{"a":1}})", "")));
  EXPECT_TRUE(rejects(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10)));
  EXPECT_TRUE(rejects("abc"));
}

TEST(LoadTorch, HostileArchivesGiveFormatErrors) {
  Tensor a = Tensor::from_vector({1, 2, 3}, {3}, DType::kFloat32);
  const fs::path p = scratch("h.pt");
  save_torch(p.string(), {{"a", a}});
  const std::string good = read_file(p);
  auto rejects = [&](const std::string& bytes) {
    try {
      load_torch_bytes(bytes, "hostile.pt");
      return false;
    } catch (const Error& e) {
      return e.code() == ErrorCode::kFormat;
    }
  };
  EXPECT_FALSE(rejects(good));
  // Every truncation fails cleanly.
  for (size_t n = 0; n < good.size(); n += 7) EXPECT_TRUE(rejects(good.substr(0, n))) << n;
  // Flipping any single byte either still loads (padding, unused fields) or fails cleanly.
  for (size_t i = 0; i < good.size(); ++i) {
    std::string b = good;
    b[i] = static_cast<char>(b[i] ^ 0x5A);
    try {
      load_torch_bytes(b, "flipped.pt");
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::kFormat) << i;
    }
  }
}

// Builds an archive around a hand-made pickle.
std::string archive_with_pickle(const std::string& pkl) {
  const fs::path p = scratch("evil.pt");
  {
    testing::ZipWriter z(p.string());
    z.add("evil/data.pkl", pkl.data(), pkl.size());
    z.finish();
  }
  return read_file(p);
}

std::string load_error(const std::string& bytes) {
  try {
    load_torch_bytes(bytes, "evil.pt");
  } catch (const Error& e) {
    return e.code() == ErrorCode::kFormat ? e.what() : std::string("wrong code: ") + e.what();
  }
  return "loaded";
}

TEST(LoadTorch, ForbiddenGlobalsAndOpcodesAreRefusedNotExecuted) {
  {
    formats::PickleWriter pk;  // os.system('touch /tmp/pwned') as a pickle
    pk.global("os", "system");
    pk.mark();
    pk.unicode("touch /tmp/fi_pwned");
    pk.tuple();
    pk.reduce();
    const std::string msg = load_error(archive_with_pickle(pk.finish()));
    EXPECT_NE(msg.find("global os.system is not allowed"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists("/tmp/fi_pwned"));
  }
  {
    formats::PickleWriter pk;
    pk.global("builtins", "eval");
    pk.mark();
    pk.unicode("1+1");
    pk.tuple();
    pk.reduce();
    const std::string msg = load_error(archive_with_pickle(pk.finish()));
    EXPECT_NE(msg.find("builtins.eval is not allowed"), std::string::npos) << msg;
  }
  // INST (protocol 0) and BUILD are not part of the tensor subset.
  EXPECT_NE(load_error(archive_with_pickle("\x80\x02(ios\nsystem\n.")).find("not allowed"),
            std::string::npos);
  EXPECT_NE(load_error(archive_with_pickle("\x80\x02}}b.")).find("opcode 0x62"), std::string::npos);
  // A storage key that tries to leave the archive folder.
  {
    formats::PickleWriter pk;
    pk.empty_dict();
    pk.unicode("a");
    pk.global("torch._utils", "_rebuild_tensor_v2");
    pk.mark();
    pk.mark();
    pk.unicode("storage");
    pk.global("torch", "FloatStorage");
    pk.unicode("../../etc/passwd");
    pk.unicode("cpu");
    pk.integer(4);
    pk.tuple();
    pk.binpersid();
    const std::string msg = load_error(archive_with_pickle(pk.finish()));
    EXPECT_NE(msg.find("storage key with a path"), std::string::npos) << msg;
  }
  // Stack underflow, truncated strings, missing STOP.
  EXPECT_NE(load_error(archive_with_pickle("\x80\x02t.")).find("MARK not found"),
            std::string::npos);
  EXPECT_NE(load_error(archive_with_pickle(std::string("\x80\x02X\xff\xff\xff\x7f", 7)))
                .find("past the end"),
            std::string::npos);
  EXPECT_NE(load_error(archive_with_pickle("\x80\x02}")).find("unexpected end"), std::string::npos);
}

std::string archive_with_storage(const std::string& pkl) {
  const fs::path p = scratch("evil_storage.pt");
  testing::write_storage_archive(p.string(), "evil", pkl);
  return read_file(p);
}

// Issue 16: a stride of 2^62 wrapped the span check, and replay then read out of bounds.
TEST(LoadTorch, StridesThatOverflowTheSpanAreAnError) {
  const auto ok =
      load_torch_bytes(archive_with_storage(testing::rebuild_tensor_pickle({4}, {4})), "ok.pt");
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].second.strides(), (Shape{4}));
  for (const auto& [size, stride] : std::vector<std::pair<Shape, Shape>>{
           {{5}, {int64_t{1} << 62}}, {{3, 2}, {int64_t{1} << 62, 1}}, {{2}, {INT64_MAX}}}) {
    const std::string msg =
        load_error(archive_with_storage(testing::rebuild_tensor_pickle(size, stride)));
    EXPECT_NE(msg.find("tensor view does not fit its storage"), std::string::npos) << msg;
    EXPECT_NE(msg.find("overflows int64"), std::string::npos) << msg;
  }
}

// Nesting deeper than kMaxPickleDepth is an error, checked while reading (no recursion).
TEST(LoadTorch, PickleNestingIsLimited) {
  std::string deep = "\x80\x02N";
  deep += std::string(2'000'000, '\x85');  // TUPLE1, two million times
  deep += '.';
  std::string msg = load_error(archive_with_pickle(deep));
  EXPECT_NE(msg.find("nested more than 1000 deep (kMaxPickleDepth)"), std::string::npos) << msg;
  // Through lists and APPEND as well.
  std::string lists = "\x80\x02]";
  for (int i = 0; i < 1500; ++i) lists += "]";
  for (int i = 0; i < 1500; ++i) lists += "a";
  lists += '.';
  msg = load_error(archive_with_pickle(lists));
  EXPECT_NE(msg.find("kMaxPickleDepth"), std::string::npos) << msg;
  // Just under the limit loads (and is destroyed) fine: the archive holds no dict.
  std::string ok = "\x80\x02N";
  ok += std::string(formats::kMaxPickleDepth - 1, '\x85');
  ok += '.';
  msg = load_error(archive_with_pickle(ok));
  EXPECT_NE(msg.find("does not hold a dict"), std::string::npos) << msg;
}

// Tensor files must be regular files: a FIFO would block, /dev/zero never ends.
TEST(LoadTorch, OnlyRegularFilesAreRead) {
  const fs::path fifo = scratch("fifo.pt");
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path zero = scratch("zero.safetensors");
  fs::remove(zero);
  fs::create_symlink("/dev/zero", zero);
  for (const fs::path& p : {fifo, zero}) {
    try {
      p.extension() == ".pt" ? load_torch(p.string()) : load_safetensors(p.string());
      ADD_FAILURE() << "loaded " << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kIo);
      EXPECT_NE(std::string(e.what()).find("is not a regular file"), std::string::npos) << e.what();
    }
  }
  fs::remove(fifo);
  fs::remove(zero);
}

TEST(LoadSafetensors, HeaderNestingIsLimited) {
  const int depth = 150'000;
  std::string header = "{\"a\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header;
  try {
    load_safetensors_bytes(bytes, "deep.safetensors");
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(kMaxJsonDepth)"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(formats::json_too_deep(std::string(513, '[')));
  EXPECT_FALSE(formats::json_too_deep(std::string(512, '[')));
  EXPECT_FALSE(formats::json_too_deep("[\"" + std::string(600, '[') + "\"]"));  // inside a string
  EXPECT_FALSE(formats::json_too_deep("[\"\\\"" + std::string(600, '[') + "\"]"));
}

}  // namespace
// Strings that are not UTF-8 (a dump directory named with raw bytes) are written as Python's
// json.dumps writes an os.fsdecode'd str: each undecodable byte as the lone surrogate U+DC00+byte
// (json.dumps(os.fsdecode(b"/tmp/nu\xffdir")) == '"/tmp/nu\\udcffdir"'); well-formed UTF-8 as
// \uXXXX escapes (pairs above the BMP).
TEST(PythonJson, StringsThatAreNotUtf8AreEscapedLikeSurrogateescape) {
  auto dumps = [](std::string_view s) {
    std::string out;
    recorder::append_json_string(out, s);
    return out;
  };
  EXPECT_EQ(dumps("/tmp/nu\xff"
                  "dir"),
            "\"/tmp/nu\\udcffdir\"");
  EXPECT_EQ(dumps("caf\xc3\xa9"), "\"caf\\u00e9\"");
  EXPECT_EQ(dumps("\xf0\x9f\x98\x80"), "\"\\ud83d\\ude00\"");
  // Python: b"\xe2\x82(".decode("utf-8", "surrogateescape") == "\udce2\udc82(".
  EXPECT_EQ(dumps("\xe2\x82("), "\"\\udce2\\udc82(\"");
  EXPECT_EQ(dumps("\xc0\xaf"), "\"\\udcc0\\udcaf\"");                        // overlong
  EXPECT_EQ(dumps("\xed\xa0\x80"), "\"\\udced\\udca0\\udc80\"");             // an encoded surrogate
  EXPECT_EQ(dumps("\xf4\x90\x80\x80"), "\"\\udcf4\\udc90\\udc80\\udc80\"");  // above U+10FFFF
}

// Our JSON parser refuses lone surrogates, which Python writes (above): the readers show them as
// U+FFFD and keep well-formed pairs and every other escape.
TEST(ReaderLimits, LoneSurrogateEscapesBecomeReplacementCharacters) {
  using formats::json_without_lone_surrogates;
  EXPECT_EQ(json_without_lone_surrogates(R"({"d": "/tmp/nu\udcffdir"})"),
            R"({"d": "/tmp/nu\ufffddir"})");
  EXPECT_EQ(json_without_lone_surrogates(R"(["\ud83d\ude00", "\ud83d", "\ud83dx", "\\udcff"])"),
            R"(["\ud83d\ude00", "\ufffd", "\ufffdx", "\\udcff"])");
  EXPECT_EQ(json_without_lone_surrogates(R"(["\u00e9\n\""])"), R"(["\u00e9\n\""])");
  const nlohmann::json j =
      nlohmann::json::parse(json_without_lone_surrogates(R"({"d": "a\udcffb\ud800"})"));
  EXPECT_EQ(j["d"].get<std::string>(),
            "a\xef\xbf\xbd"
            "b\xef\xbf\xbd");
}

}  // namespace flashinfer
