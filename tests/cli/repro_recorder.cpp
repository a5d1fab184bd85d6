// Records the calls the `flashinfer repro` tests reproduce: an rmsnorm writing into `out`, and a
// BatchDecodeWithPagedKVCacheWrapper's __init__, plan and run (small shapes).
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
