// The MoE LoRA ops' pointer tables across processes: a Flight Recorder dump made by this library
// holds the weight banks its w_ptr tables point into (extension keys fi_ext__<param>__bank<j>),
// so it replays after the recording's banks are gone (as in another process). Upstream-made
// recordings, which lack them, keep the error naming the table (tests/ops/test_moe_lora.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/replay.h"
#include "ops/op_test_util.h"
#include "util/test_util.h"

namespace flashinfer::testing {
namespace {

Tensor i64(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kInt64);
  for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
  return t;
}

TEST(MoeLoraPointerTables, RecordingReplaysAfterTheBanksAreFreed) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fi_lora_ptr_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // 5 tokens, 8 experts, top-2, 2 adapters (token 2 has none), rank 8.
  const int64_t T = 5, K = 2, E = 8, L = 2, H = 32, R = 8, I = 16;
  const Tensor ids = i64({3, 5, 0, 7, 2, 3, 6, 1, 5, 4}).reshape({T, K});
  const Tensor lid = i64({0, 1, -1, 1, 0});
  const Tensor hs = rand_tensor({T, H}, DType::kBFloat16, 1, -1, 1);
  const Tensor act = rand_tensor({12, I}, DType::kBFloat16, 2, -1, 1);
  const Tensor perm = i64({9, 3, -1, 0, 11, 4, 2, -1, 7, 5});
  const Tensor tw = rand_tensor({T, K}, DType::kFloat32, 3, 0, 1);
  Tensor wa = Tensor::zeros({2, E}, DType::kInt64), wb = Tensor::zeros({2, E}, DType::kInt64);
  Tensor wa2 = Tensor::zeros({1, E}, DType::kInt64), wb2 = Tensor::zeros({1, E}, DType::kInt64);
  Tensor y = Tensor::zeros({2, T * K, R}, DType::kBFloat16);
  int64_t sa = 0, sb = 0, sa2 = 0, sb2 = 0;
  {
    // The banks live only in this scope.
    Tensor ag = rand_tensor({L, E, R, H}, DType::kBFloat16, 10, -0.5, 0.5);
    Tensor au = rand_tensor({L, E, R, H}, DType::kBFloat16, 11, -0.5, 0.5);
    Tensor bg = rand_tensor({L, E, I, R}, DType::kBFloat16, 12, -0.5, 0.5);
    Tensor bu = rand_tensor({L, E, I, R}, DType::kBFloat16, 13, -0.5, 0.5);
    Tensor ad = rand_tensor({L, E, R, I}, DType::kBFloat16, 14, -0.5, 0.5);
    Tensor bd = rand_tensor({L, E, H, R}, DType::kBFloat16, 15, -0.5, 0.5);
    sa = fill_w_ptr(wa, ag, E, 0);
    (void)fill_w_ptr(wa, au, E, 1);
    sb = fill_w_ptr(wb, bg, E, 0);
    (void)fill_w_ptr(wb, bu, E, 1);
    sa2 = fill_w_ptr(wa2, ad, E, 0);
    sb2 = fill_w_ptr(wb2, bd, E, 0);
    std::vector<int64_t> tok;
    for (int64_t p = 0; p < T * K; ++p) tok.push_back(p / K);
    recorder::Config cfg;
    cfg.dump_dir = dir.string();
    recorder::start(cfg, [](const std::string&) {});
    (void)bgmv_moe_gemm1_lora_delta(hs, wa, sa, wb, sb, ids, lid, R, I, DType::kBFloat16, 0.5,
                                    DType::kFloat32);
    (void)bgmv_moe_gemm2_lora_delta(act, perm, wa2, sa2, wb2, sb2, ids, tw, lid, R, H);
    bgmv_moe_shrink(y, hs, wa, i64(tok), ids.reshape({T * K}), lid, sa);
    recorder::stop();
  }
  // The recording's addresses name freed memory now: a direct call is refused.
  EXPECT_FI_ERROR((void)bgmv_moe_gemm1_lora_delta(hs, wa, sa, wb, sb, ids, lid, R, I),
                  "bgmv_moe_gemm1_lora_delta", "w_ptr_a");

  // The dump holds the banks under the extension keys, next to upstream's keys.
  int records = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.path().filename() != "metadata.jsonl") continue;
    std::ifstream in(entry.path());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    EXPECT_NE(text.find("\"fi_ext__w_ptr"), std::string::npos) << entry.path();
    EXPECT_NE(text.find("__bank0__base"), std::string::npos) << entry.path();
    ++records;
  }
  EXPECT_EQ(records, 3);

  const auto results = replay::replay_sequence(dir.string());
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer::testing
