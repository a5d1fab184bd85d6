// The logging page's BatchDecodeWithPagedKVCacheWrapper producer, in C++: __init__, plan and run
// of a stateful wrapper. Run it with the flight recorder on:
//   FLASHINFER_LOGLEVEL=10 FLASHINFER_DUMP_DIR=./batch_decode_dumps batch_decode_producer
#include <cstdio>
#include <cstring>

#include "flashinfer/flashinfer.h"

using namespace flashinfer;

int main(int argc, char** argv) {
  Device device = Device::cpu();
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0) device = Device::parse(argv[i + 1]);
  }
  const int64_t batch_size = 4, kv_len = 512, page_size = 16, num_kv_heads = 4, num_qo_heads = 32,
                head_dim = 128;
  Tensor q = Tensor::empty({batch_size, num_qo_heads, head_dim}, DType::kFloat16);
  q.normal_(1);
  const int64_t pages_per_seq = (kv_len + page_size - 1) / page_size;
  const int64_t total_pages = pages_per_seq * batch_size;
  Tensor kv_data =
      Tensor::empty({total_pages, 2, page_size, num_kv_heads, head_dim}, DType::kFloat16);
  kv_data.normal_(2);
  std::vector<double> indptr, indices, last;
  for (int64_t i = 0; i <= batch_size; ++i)
    indptr.push_back(static_cast<double>(i * pages_per_seq));
  for (int64_t i = 0; i < total_pages; ++i) indices.push_back(static_cast<double>(i));
  for (int64_t i = 0; i < batch_size; ++i)
    last.push_back(static_cast<double>((kv_len - 1) % page_size + 1));
  Tensor kv_indptr = Tensor::from_vector(indptr, {batch_size + 1}, DType::kInt32).to(device);
  Tensor kv_indices = Tensor::from_vector(indices, {total_pages}, DType::kInt32).to(device);
  Tensor kv_last_page_len = Tensor::from_vector(last, {batch_size}, DType::kInt32).to(device);
  Tensor workspace = Tensor::empty({32 * 1024 * 1024}, DType::kInt8, device);
  BatchDecodeWithPagedKVCacheWrapper wrapper(workspace, "NHD");  // __init__: logged
  BatchDecodeWithPagedKVCacheWrapper::PlanOptions po;
  po.data_type = DType::kFloat16;
  po.q_data_type = DType::kFloat16;
  wrapper.plan(kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim,
               page_size, po);  // plan: logged
  AttentionRunOptions ro;
  ro.return_lse = true;
  AttentionOutput o = wrapper.run(q.to(device), kv_data.to(device), ro);  // run: logged
  const auto v = o.out.to_double_vector();
  std::printf("Output shape: %s\nOutput[0, :3, :3]:\n", shape_to_string(o.out.shape()).c_str());
  for (int r = 0; r < 3; ++r) {
    std::printf("  %9.4f %9.4f %9.4f\n", v[r * head_dim], v[r * head_dim + 1], v[r * head_dim + 2]);
  }
  const auto l = o.lse.to_double_vector();
  std::printf("\nLSE shape: %s\nLSE[0, :5]: %.4f %.4f %.4f %.4f %.4f\n",
              shape_to_string(o.lse.shape()).c_str(), l[0], l[1], l[2], l[3], l[4]);
  return 0;
}
