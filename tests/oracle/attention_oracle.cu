// See attention_oracle.h. The head dims are instantiated on demand by a small switch over the
// multiples of 16 the library's CUDA attention accepts, so any case a test builds has an oracle.
#include <type_traits>
#include <utility>

#include "kernels/cuda/attention_prefill_kernel.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/decode_cuda.h"
#include "oracle/attention_cuda_core_oracle.cuh"
#include "oracle/attention_oracle.h"

namespace flashinfer::testing {
namespace {

using namespace kernels;
using namespace kernels::cuda;

template <class TQ, class TKV, int DQK, int DVO>
void launch(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(p.max_work_rows) * group;
  const dim3 grid(
      static_cast<unsigned>(p.num_work), static_cast<unsigned>(p.num_kv_heads),
      static_cast<unsigned>((max_rows + oracle::kRowsPerBlock - 1) / oracle::kRowsPerBlock));
  launch_kernel("attention_oracle", oracle::attention_cuda_core_kernel<TQ, TKV, TQ, DQK, DVO>, grid,
                dim3(oracle::kWarps * 32), oracle::smem_bytes(DQK, DVO), stream, enable_pdl, p);
}

// Head dims 16..256 in steps of 16, qk and vo independently: 256 instances per dtype pair would
// be too many, so the oracle takes the pairs the tests use.
template <class TQ, class TKV>
void dispatch_dims(const AttentionParams& p, cudaStream_t s, bool pdl) {
  const int qk = p.head_dim_qk, vo = p.head_dim_vo;
  if (qk == vo) {
    switch (qk) {
      case 64:
        return launch<TQ, TKV, 64, 64>(p, s, pdl);
      case 128:
        return launch<TQ, TKV, 128, 128>(p, s, pdl);
      case 256:
        return launch<TQ, TKV, 256, 256>(p, s, pdl);
      case 96:
        return launch<TQ, TKV, 96, 96>(p, s, pdl);
      case 80:
        return launch<TQ, TKV, 80, 80>(p, s, pdl);
      case 48:
        return launch<TQ, TKV, 48, 48>(p, s, pdl);
      case 32:  // DecodeKernelCuda.JitHeadDimsMatchCpuAndOracle's two-rows-a-thread JIT dim
        return launch<TQ, TKV, 32, 32>(p, s, pdl);
      default:
        break;
    }
  }
  if (qk == 192 && vo == 128) return launch<TQ, TKV, 192, 128>(p, s, pdl);
  FLASHINFER_FAIL(ErrorCode::kUnsupported, "attention_oracle", "head_dim", "no oracle for (", qk,
                  ", ", vo, ")");
}

void set(AttentionKernelOverride f) { set_attention_kernel_override(f); }

template <class T, int D>
void launch_mma(const AttentionParams& p, cudaStream_t stream, bool enable_pdl) {
  constexpr int kKvTile = mma::kv_tile(D);
  const int32_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t max_rows = static_cast<int64_t>(p.max_work_rows) * group;
  const dim3 grid(static_cast<unsigned>(p.num_work), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>((max_rows + mma::kRows - 1) / mma::kRows));
  launch_kernel("attention_oracle", mma::prefill_mma_kernel<T, D, kKvTile>, grid,
                dim3(mma::kWarps * 32), mma::smem_bytes(D), stream, enable_pdl, p);
}

}  // namespace

void oracle_batch_attention(const AttentionParams& p, void* stream, bool enable_pdl) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(
      p.q_dtype, "attention_oracle", "q", [&]<class T>() {
        visit_dtype<CudaElements, kFloat16, kBFloat16, kFloat8E4M3FN, kFloat8E5M2>(
            p.kv.dtype,
            [&]<class TKV>() {
              if constexpr (std::is_same_v<TKV, __half> || std::is_same_v<TKV, __nv_bfloat16>) {
                dispatch_dims<T, T>(p, s, enable_pdl);
              } else {
                dispatch_dims<T, TKV>(p, s, enable_pdl);
              }
            },
            [] { FLASHINFER_FAIL(ErrorCode::kUnsupported, "attention_oracle", "kv", "dtype"); });
      });
}

void oracle_prefill_mma(const AttentionParams& p, void* stream, bool enable_pdl) {
  const bool same = p.kv.dtype == p.q_dtype && p.o_dtype == p.q_dtype && p.sinks == nullptr &&
                    p.alibi_slopes == nullptr && p.head_dim_qk == p.head_dim_vo &&
                    (p.q_dtype == DType::kFloat16 || p.q_dtype == DType::kBFloat16);
  const int d = p.head_dim_qk;
  if (!same || (d != 64 && d != 128 && d != 256))
    return oracle_batch_attention(p, stream, enable_pdl);
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype<CudaElements, kFloat16, kBFloat16>(p.q_dtype, "attention_oracle", "q",
                                                    [&]<class T>() {
                                                      if (d == 64)
                                                        launch_mma<T, 64>(p, s, enable_pdl);
                                                      if (d == 128)
                                                        launch_mma<T, 128>(p, s, enable_pdl);
                                                      if (d == 256)
                                                        launch_mma<T, 256>(p, s, enable_pdl);
                                                    });
}

ScopedPrefillMmaOracle::ScopedPrefillMmaOracle() { set(&oracle_prefill_mma); }
ScopedPrefillMmaOracle::~ScopedPrefillMmaOracle() { set(nullptr); }

ScopedAttentionOracle::ScopedAttentionOracle() { set(&oracle_batch_attention); }
ScopedAttentionOracle::~ScopedAttentionOracle() { set(nullptr); }

}  // namespace flashinfer::testing
