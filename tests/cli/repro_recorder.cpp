// Records the calls the `flashinfer repro` tests reproduce: an rmsnorm writing into `out`, a
// BatchDecodeWithPagedKVCacheWrapper's __init__, plan and run, and a bgmv_moe_gemm1_lora_delta
// through pointer tables (small shapes).
//   repro_recorder DUMP_DIR [--tamper]
// --tamper rewrites the rmsnorm call's recorded output so that a faithful reproduction fails.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "flashinfer/flashinfer.h"
#include "flashinfer/recorder.h"
#include "flashinfer/tensor_io.h"

using namespace flashinfer;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: repro_recorder DUMP_DIR [--tamper]\n");
    return 2;
  }
  const bool tamper = argc > 2 && std::strcmp(argv[2], "--tamper") == 0;
  recorder::Config config;
  config.dump_dir = argv[1];
  recorder::start(config, [](const std::string&) {});

  Tensor x = Tensor::empty({3, 16}, DType::kFloat16);
  x.normal_(1);
  Tensor w = Tensor::empty({16}, DType::kFloat16);
  w.normal_(2);
  Tensor out = Tensor::empty({3, 16}, DType::kFloat16);
  rmsnorm(x, w, 1e-5, out);

  const int64_t batch = 2, page_size = 4, pages_per_seq = 3, kv_heads = 2, qo_heads = 4, dim = 64;
  const int64_t pages = batch * pages_per_seq;
  Tensor q = Tensor::empty({batch, qo_heads, dim}, DType::kFloat16);
  q.normal_(3);
  Tensor kv = Tensor::empty({pages, 2, page_size, kv_heads, dim}, DType::kFloat16);
  kv.normal_(4);
  Tensor indptr = Tensor::from_vector({0, 3, 6}, {batch + 1}, DType::kInt32);
  Tensor indices = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {pages}, DType::kInt32);
  Tensor last = Tensor::from_vector({4, 2}, {batch}, DType::kInt32);
  Tensor workspace = Tensor::zeros({64 * 1024}, DType::kInt8);
  BatchDecodeWithPagedKVCacheWrapper wrapper(workspace, "NHD");
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.data_type = DType::kFloat16;
  po.q_data_type = DType::kFloat16;
  wrapper.plan(indptr, indices, last, qo_heads, kv_heads, dim, page_size, po);
  AttentionRunOptions ro;
  ro.return_lse = true;
  wrapper.run(q, kv, ro);

  // A MoE LoRA delta through w_ptr tables of weight addresses: the recording carries the banks
  // as extension tensors, and the banks die before the reproducer runs in another process.
  {
    const int64_t T = 3, K = 2, E = 4, L = 2, H = 16, R = 8, I = 16;
    Tensor hs = Tensor::empty({T, H}, DType::kBFloat16);
    hs.normal_(5);
    Tensor ids = Tensor::from_vector({0, 3, 2, 1, 3, 2}, {T, K}, DType::kInt64);
    Tensor lid = Tensor::from_vector({0, -1, 1}, {T}, DType::kInt64);
    Tensor wa = Tensor::zeros({2, E}, DType::kInt64), wb = Tensor::zeros({2, E}, DType::kInt64);
    Tensor banks[4];
    for (int i = 0; i < 4; ++i) {
      banks[i] = Tensor::empty(i < 2 ? Shape{L, E, R, H} : Shape{L, E, I, R}, DType::kBFloat16);
      banks[i].normal_(6 + i);
    }
    const int64_t sa = fill_w_ptr(wa, banks[0], E, 0);
    (void)fill_w_ptr(wa, banks[1], E, 1);
    const int64_t sb = fill_w_ptr(wb, banks[2], E, 0);
    (void)fill_w_ptr(wb, banks[3], E, 1);
    (void)bgmv_moe_gemm1_lora_delta(hs, wa, sa, wb, sb, ids, lid, R, I);
  }
  recorder::stop();

  if (tamper) {
    for (const auto& e : fs::directory_iterator(argv[1])) {
      if (e.path().filename().string().find("_rmsnorm_call") == std::string::npos) continue;
      const fs::path file = e.path() / "outputs.pt";
      NamedTensors t = load_torch(file.string());
      for (auto& [key, v] : t) {
        std::vector<double> d = v.to_double_vector();
        d[0] += 1.0;
        v = Tensor::from_vector(d, v.shape(), v.dtype());
      }
      save_torch(file.string(), t);
    }
  }
  std::printf("recorded into %s\n", argv[1]);
  return 0;
}
