// The hostile-dump corpus (issue 16): one dump per class the probe found, each run through
// `flashinfer show -v`, `replay` and `replay --json` in a child process under a time
// limit and (outside sanitizer builds) an address-space limit. Every run must exit with 0, 1 or
// 2: no signal, no hang, no runaway allocation. Nothing may be written anywhere: the dump's
// files and the child's working directory are the same after every run.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/sanitizers.h"
#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "formats/reader_limits.h"
#include "formats/zip_writer.h"
#include "util/run_command.h"
#include "util/torch_archive.h"

namespace flashinfer {
namespace {

namespace fs = std::filesystem;

// Every file under `root` (symlinks not followed) with its size and modification time.
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); it != fs::end(it); it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0) continue;
    out[it->path().string()] = std::to_string(st.st_size) + ":" + std::to_string(st.st_mtime) +
                               "." + std::to_string(st.st_mtim.tv_nsec);
  }
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string replace_all(std::string t, const std::string& from, const std::string& to) {
  for (std::size_t p = t.find(from); p != std::string::npos; p = t.find(from, p + to.size())) {
    t.replace(p, from.size(), to);
  }
  return t;
}

class HostileDumps : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("fi_hostile_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "cwd");
    // One real recorded call to derive the hostile ones from.
    recorder::Config c;
    c.dump_dir = (root_ / "template").string();
    recorder::start(c, [](const std::string&) {});
    rmsnorm(Tensor::from_vector({1, -2, 3, 4, 0.5, 6}, {2, 3}, DType::kFloat32),
            Tensor::from_vector({1, 0.5, 2}, {3}, DType::kFloat32));
    recorder::stop();
    for (const auto& e : fs::directory_iterator(root_ / "template")) {
      if (e.is_directory()) template_ = e.path();
    }
  }
  void TearDown() override { fs::remove_all(root_); }

  // A session dump `name` holding one copy of the template call, `edit` applied to that call.
  fs::path make(const std::string& name, const std::function<void(const fs::path&)>& edit) {
    const fs::path session = root_ / name;
    const fs::path call = session / template_.filename();
    fs::create_directories(session);
    fs::copy(template_, call, fs::copy_options::recursive);
    edit(call);
    return session;
  }

  // Runs every command on `session` (and on its single call); checks exit, time, memory and
  // that nothing was written.
  void check(const fs::path& session, const std::string& what) {
    SCOPED_TRACE(what);
    // The session with every command, and each call directory alone with replay.
    std::vector<std::pair<fs::path, const char*>> runs;
    for (const char* cmd : {"show -v", "replay", "replay --json"}) {
      runs.emplace_back(session, cmd);
    }
    for (const auto& e : fs::directory_iterator(session)) {
      if (e.is_directory()) runs.emplace_back(e.path(), "replay");
    }
    const auto before = snapshot(root_);
    for (const auto& [t, cmd] : runs) {
      {
        std::string line = "cd '" + (root_ / "cwd").string() + "' && ";
#ifdef FLASHINFER_ASAN
        // A refused allocation is an error to report, not a sanitizer abort.
        line += "ASAN_OPTIONS=\"${ASAN_OPTIONS}:allocator_may_return_null=1\" ";
#else
        line += "ulimit -v 4000000 && ";  // 4 GB of address space
#endif
        line += "timeout -s KILL 60 " + std::string(FLASHINFER_TEST_BIN_DIR) + "/flashinfer " +
                cmd + " --dir '" + t.string() + "'";
        const testing::CommandResult r = testing::run_command(line);
        EXPECT_TRUE(r.status == 0 || r.status == 1 || r.status == 2)
            << cmd << " " << t << " exited with " << r.status << " (137: killed at the time "
            << "limit; -1: a signal)\n"
            << r.out.substr(0, 2000);
      }
    }
    EXPECT_EQ(snapshot(root_), before) << "a run wrote a file";
    EXPECT_TRUE(fs::is_empty(root_ / "cwd"));
  }

  fs::path root_;
  fs::path template_;
};

TEST_F(HostileDumps, EveryClassEndsInAnExitNeverASignalAHangOrAWrite) {
  std::vector<std::pair<fs::path, std::string>> dumps;
  const auto meta = [](const fs::path& call) { return call / "metadata.jsonl"; };
  // Span arithmetic that overflows: a stride of 2^62 in inputs.pt.
  dumps.emplace_back(make("stride_2_62",
                          [&](const fs::path& c) {
                            testing::write_storage_archive(
                                (c / "inputs.pt").string(), "inputs",
                                testing::rebuild_tensor_pickle({5}, {int64_t{1} << 62}));
                          }),
                     "inputs.pt with a stride of 2^62");
  // A broadcast input of 2^40 x 4 elements over 4 stored ones.
  dumps.emplace_back(make("broadcast_2_40",
                          [&](const fs::path& c) {
                            testing::write_storage_archive(
                                (c / "inputs.pt").string(), "inputs",
                                testing::rebuild_tensor_pickle({int64_t{1} << 40, 4}, {0, 1}));
                          }),
                     "inputs.pt with a broadcast input of 2^42 elements");
  // The same with a weight that fits, so the op itself would accept it and run 2^40 rows.
  dumps.emplace_back(
      make("broadcast_runnable",
           [&](const fs::path& c) {
             testing::write_storage_archive(
                 (c / "inputs.pt").string(), "inputs",
                 testing::rebuild_tensors_pickle(
                     {{"arg_0", {int64_t{1} << 40, 3}, {0, 1}}, {"arg_1", {3}, {1}}}));
           }),
      "a runnable call on a broadcast input of 2^40 x 3 elements");
  // Nesting: a metadata line 150k deep, a pickle of 1M nested tuples.
  dumps.emplace_back(make("deep_json",
                          [&](const fs::path& c) {
                            std::ofstream(meta(c)) << "{\"a\":" << std::string(150'000, '[')
                                                   << std::string(150'000, ']') << "}\n";
                          }),
                     "metadata nested 150k deep");
  dumps.emplace_back(make("deep_pickle",
                          [&](const fs::path& c) {
                            std::string pkl = "\x80\x02)";
                            pkl += std::string(1'000'000, '\x85');  // TUPLE1
                            pkl += '.';
                            testing::ZipWriter z((c / "inputs.pt").string());
                            z.add("inputs/data.pkl", pkl.data(), pkl.size());
                            z.finish();
                          }),
                     "inputs.pt of 1M nested tuples");
  // Unbounded reads: a FIFO, a symlink to /dev/zero, a line over the limit.
  dumps.emplace_back(make("fifo",
                          [&](const fs::path& c) {
                            fs::remove(meta(c));
                            ASSERT_EQ(::mkfifo(meta(c).c_str(), 0600), 0);
                          }),
                     "metadata.jsonl is a FIFO");
  dumps.emplace_back(make("dev_zero",
                          [&](const fs::path& c) {
                            fs::remove(meta(c));
                            fs::create_symlink("/dev/zero", meta(c));
                          }),
                     "metadata.jsonl links to /dev/zero");
  dumps.emplace_back(make("long_line",
                          [&](const fs::path& c) {
                            std::ofstream(meta(c))
                                << "{\"a\":\""
                                << std::string(formats::kMaxMetadataLineBytes + 1, 'x') << "\"}\n";
                          }),
                     "a metadata line over kMaxMetadataLineBytes");
  // A call directory linked out of the dump root.
  {
    const fs::path outside = root_ / "outside";
    fs::create_directories(outside);
    fs::copy(template_, outside / template_.filename(), fs::copy_options::recursive);
    const fs::path session = root_ / "linked_out";
    fs::create_directories(session);
    fs::create_directory_symlink(outside / template_.filename(),
                                 session / "20990101_000000_000_pid1_rmsnorm_call0001");
    dumps.emplace_back(session, "a call directory linked out of the root");
  }
  // Strides in tensor_details that wrap (safetensors restore_strides reads them).
  {
    recorder::Config c;
    c.dump_dir = (root_ / "st_template").string();
    c.safetensors = true;
    recorder::start(c, [](const std::string&) {});
    rmsnorm(Tensor::from_vector({1, -2, 3, 4, 0.5, 6}, {3, 2}, DType::kFloat32).transpose(0, 1),
            Tensor::from_vector({1, 0.5, 2}, {3}, DType::kFloat32));
    recorder::stop();
    fs::path call;
    for (const auto& e : fs::directory_iterator(root_ / "st_template")) {
      if (e.is_directory()) call = e.path();
    }
    const std::string text = slurp(meta(call));
    const std::string wrapped =
        replace_all(text, "\"stride\": [1, 2]", "\"stride\": [4611686018427387904, 2]");
    ASSERT_NE(wrapped, text);
    std::ofstream(meta(call), std::ios::trunc) << wrapped;
    dumps.emplace_back(root_ / "st_template", "safetensors with wrapping tensor_details strides");
  }
  // Text: a number where a string belongs, escape sequences and bytes that are not UTF-8.
  dumps.emplace_back(make("name_is_number",
                          [&](const fs::path& c) {
                            const std::string t = slurp(meta(c));
                            std::ofstream(meta(c), std::ios::trunc) << replace_all(
                                t, "\"function_name\": \"rmsnorm\"", "\"function_name\": 42");
                          }),
                     "function_name is a number");
  dumps.emplace_back(make("sess\xff\x1b[2J",
                          [&](const fs::path& c) {
                            const std::string t = slurp(meta(c));
                            std::ofstream(meta(c), std::ios::trunc)
                                << replace_all(t, "\"function_name\": \"rmsnorm\"",
                                               "\"function_name\": \"rms\\u001b[2J\\u0007\"");
                          }),
                     "escape sequences in the directory and the function name");
  // The outputs' write failed; no call at all.
  dumps.emplace_back(make("write_failed",
                          [&](const fs::path& c) {
                            const std::string t = slurp(meta(c));
                            std::ofstream(meta(c), std::ios::trunc)
                                << replace_all(t, "\"completed\"", "\"outputs_write_failed\"");
                            fs::remove(c / "outputs.pt");
                          }),
                     "a write-failure record");
  fs::create_directories(root_ / "empty");
  dumps.emplace_back(root_ / "empty", "no call");
  for (const auto& [dir, what] : dumps) check(dir, what);
  // The empty session and the linked-out call are refused (nothing is replayed).
  const auto r =
      testing::run_command(std::string(FLASHINFER_TEST_BIN_DIR) + "/flashinfer replay --dir '" +
                           (root_ / "empty").string() + "'");
  EXPECT_EQ(r.status, 2) << r.out;
  const auto l =
      testing::run_command(std::string(FLASHINFER_TEST_BIN_DIR) + "/flashinfer replay --dir '" +
                           (root_ / "linked_out").string() + "'");
  EXPECT_EQ(l.status, 2) << l.out;
  // The runnable broadcast call is refused by the replay's limit, not run for hours.
  const auto b =
      testing::run_command(std::string(FLASHINFER_TEST_BIN_DIR) + "/flashinfer replay --dir '" +
                           (root_ / "broadcast_runnable").string() + "'");
  EXPECT_NE(b.status, 0) << b.out;
  EXPECT_NE(b.out.find("kMaxBroadcastElements"), std::string::npos) << b.out;
}

}  // namespace
}  // namespace flashinfer
