// Private, plain C++ (no CUDA headers): how a row-major GEMM becomes a cuBLASLt call, as pure
// functions the CPU tests check exactly, and the key of the CUDA backend's plan cache
// (kernels/cuda/gemm_cuda.cu; docs/GEMM_AND_QUANTIZATION.md, "The cuBLASLt path").
//
// The ops compute out[b, i, j] = sum_k x[b, i, k] * w[b, j, k] with x [m, k] row-major (row
// stride ldx), w [n, k] row-major (the column-major [k, n] operand, row stride ldw) and out
// [m, n] row-major (row stride ldd). cuBLASLt is column-major, and the same bytes read as
// column-major matrices are the transposes: out^T (n x m, ld ldd) = w (k x n, ld ldw)^T
// * x^T (k x m, ld ldx). So cuBLASLt's A is w, transposed; its B is x, not transposed; its m is
// our n and its n is our m: the "TN" form, the only one cuBLASLt's FP8 kernels take.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "flashinfer/dtype.h"
#include "kernels/gemm_fp8_params.h"
#include "kernels/gemm_params.h"
#include "kernels/key_hash.h"

namespace flashinfer::kernels::lt {

/// A row-major GEMM as the ops describe it (strides in elements; batch strides are ignored when
/// batch == 1; the addresses only matter through their alignment).
struct RowMajorGemm {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  DType x_type = DType::kBFloat16, w_type = DType::kBFloat16, d_type = DType::kBFloat16;
  int64_t ldx = 0, ldw = 0, ldd = 0;
  int64_t stride_x = 0, stride_w = 0, stride_d = 0;
  std::uintptr_t x_addr = 0, w_addr = 0, d_addr = 0;
};

/// The ops' parameter block as a row-major GEMM: x is A [.., m, k], w is B's [.., n, k] storage
/// (B [.., k, n] column-major), out is [.., m, n].
inline RowMajorGemm row_major_gemm(const GemmParams& p) {
  RowMajorGemm g;
  g.batch = p.batch;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.x_type = p.a_dtype;
  g.w_type = p.b_dtype;
  g.d_type = p.out_dtype;
  g.ldx = p.a_stride_m;
  g.ldw = p.b_stride_n;
  g.ldd = p.out_stride_m;
  g.stride_x = p.a_stride_b;
  g.stride_w = p.b_stride_b;
  g.stride_d = p.out_stride_b;
  g.x_addr = reinterpret_cast<std::uintptr_t>(p.a);
  g.w_addr = reinterpret_cast<std::uintptr_t>(p.b);
  g.d_addr = reinterpret_cast<std::uintptr_t>(p.out);
  return g;
}

/// The same problem in cuBLASLt's column-major terms: D (m x n, ld ldd) = op(A) op(B), A = w
/// (stored k x m, ld lda), B = x (stored k x n, ld ldb). transa is always true and transb
/// always false. align_* are the byte alignments every batch's matrix start is known to have
/// (powers of two, at most 256: what the heuristic's MIN_ALIGNMENT preferences take).
struct ColMajorGemm {
  bool transa = true, transb = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;
  uint32_t align_a = 256, align_b = 256, align_d = 256;
  friend bool operator==(const ColMajorGemm&, const ColMajorGemm&) = default;
};

/// Largest power of two, at most 256, dividing the address of every batch's matrix.
inline uint32_t alignment_bytes(std::uintptr_t addr, std::size_t elem_size, int64_t batch,
                                int64_t batch_stride) {
  uint64_t bits = static_cast<uint64_t>(addr) | 256u;
  if (batch > 1) bits |= static_cast<uint64_t>(batch_stride) * elem_size;
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit
}

/// The TN mapping. A single row (m == 1) or column (n == 1) may come with any stride; cuBLASLt
/// wants ld >= the stored row count, so those get the dense ld (the value is never used to step
/// between rows there).
inline ColMajorGemm to_col_major(const RowMajorGemm& g) {
  ColMajorGemm c;
  c.m = g.n;
  c.n = g.m;
  c.k = g.k;
  c.lda = g.n == 1 ? g.k : g.ldw;
  c.ldb = g.m == 1 ? g.k : g.ldx;
  c.ldd = g.m == 1 ? g.n : g.ldd;
  c.batch = g.batch;
  if (g.batch > 1) {
    c.stride_a = g.stride_w;
    c.stride_b = g.stride_x;
    c.stride_d = g.stride_d;
  }
  c.align_a = alignment_bytes(g.w_addr, dtype_size(g.w_type), g.batch, g.stride_w);
  c.align_b = alignment_bytes(g.x_addr, dtype_size(g.x_type), g.batch, g.stride_x);
  c.align_d = alignment_bytes(g.d_addr, dtype_size(g.d_type), g.batch, g.stride_d);
  return c;
}

/// Which operand of the row-major problem a refusal is about.
enum class Operand : uint8_t { kNone, kX, kW, kD };

struct LtRefusal {
  Operand operand = Operand::kNone;
  const char* reason = nullptr;  // a static string; nullptr: supported
  bool refused() const { return reason != nullptr; }
};

/// cuBLASLt's FP8 requirements (cuBLAS docs, cublasLtMatmul: TN form, 16-byte aligned matrix
/// pointers, CUBLAS_COMPUTE_32F, CUDA_R_32F scales; the heuristic rejects an FP8 problem whose
/// m, i.e. our n, is not a multiple of 16), checked on the mapped problem: k and our n multiples
/// of 16, every leading dimension a multiple of 16 bytes, every matrix start 16-byte aligned.
/// Our m (cuBLASLt's n) may be anything.
inline LtRefusal fp8_refusal(const RowMajorGemm& g) {
  const ColMajorGemm c = to_col_major(g);
  const auto bytes16 = [](int64_t elems, DType t) {
    return (elems * static_cast<int64_t>(dtype_size(t))) % 16 == 0;
  };
  if (c.k % 16 != 0) return {Operand::kX, "cuBLASLt fp8 needs k to be a multiple of 16"};
  if (c.m % 16 != 0) return {Operand::kW, "cuBLASLt fp8 needs n to be a multiple of 16"};
  if (!bytes16(c.ldb, g.x_type))
    return {Operand::kX, "cuBLASLt fp8 needs a row stride that is a multiple of 16 bytes"};
  if (!bytes16(c.lda, g.w_type))
    return {Operand::kW, "cuBLASLt fp8 needs a column stride that is a multiple of 16 bytes"};
  if (!bytes16(c.ldd, g.d_type))
    return {Operand::kD, "cuBLASLt fp8 needs a row stride that is a multiple of 16 bytes"};
  if (c.align_b < 16)
    return {Operand::kX, "cuBLASLt fp8 needs every matrix to start 16-byte aligned"};
  if (c.align_a < 16)
    return {Operand::kW, "cuBLASLt fp8 needs every matrix to start 16-byte aligned"};
  if (c.align_d < 16)
    return {Operand::kD, "cuBLASLt fp8 needs every matrix to start 16-byte aligned"};
  return {};
}

/// What cuBLASLt's answer about a problem means (`status` a cublasStatus_t as its number:
/// SUCCESS 0, INVALID_VALUE 7, NOT_SUPPORTED 15, checked against cublas_api.h in
/// kernels/cuda/gemm_cuda.cu; `has_algorithm`: the heuristic returned one). kRefuses: the problem
/// is not one cuBLASLt takes (NOT_SUPPORTED, INVALID_VALUE, say a block scale mode a cuBLASLt
/// before 12.9 does not know, or a heuristic with no algorithm): a caller with another kernel
/// runs that, and remembers the refusal. kFails: any other status, an error.
enum class LtAnswer : uint8_t { kServes, kRefuses, kFails };
constexpr LtAnswer lt_answer(int status, bool has_algorithm = true) {
  if (status == 0) return has_algorithm ? LtAnswer::kServes : LtAnswer::kRefuses;
  return status == 7 || status == 15 ? LtAnswer::kRefuses : LtAnswer::kFails;
}

/// How the product is scaled: not at all, by per-tensor fp32 scales of A and B read from device
/// memory (FP8), by an fp32 alpha read from device memory, or by Hopper's FP8 block scales
/// (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F on x; on w VEC128_32F, i.e. 1x128 blocks, or
/// BLK128x128_32F).
enum class ScaleMode : uint8_t { kNone, kTensorScales, kDeviceAlpha, kBlockW1x128, kBlockW128x128 };

/// The plan cache's key: everything the descriptors and the heuristic's choice depend on, and
/// nothing that varies between calls of one shape (data, bias and scale pointers).
struct LtKey {
  int device = 0;
  ColMajorGemm shape;
  DType a_type = DType::kBFloat16, b_type = DType::kBFloat16, d_type = DType::kBFloat16;
  bool bias = false;  // CUBLASLT_EPILOGUE_BIAS
  DType bias_type = DType::kBFloat16;
  ScaleMode scale = ScaleMode::kNone;
  uint64_t workspace_bytes = 0;
  friend bool operator==(const LtKey&, const LtKey&) = default;
};

inline LtKey make_key(int device, const RowMajorGemm& g, bool bias, DType bias_type,
                      ScaleMode scale, uint64_t workspace_bytes) {
  LtKey key;
  key.device = device;
  key.shape = to_col_major(g);
  key.a_type = g.w_type;
  key.b_type = g.x_type;
  key.d_type = g.d_type;
  key.bias = bias;
  key.bias_type = bias ? bias_type : DType::kBFloat16;
  key.scale = scale;
  key.workspace_bytes = workspace_bytes;
  return key;
}

struct LtKeyHash {
  std::size_t operator()(const LtKey& key) const {
    KeyHasher hasher;
    const auto mix = [&hasher](uint64_t v) { hasher.mix(v); };
    const ColMajorGemm& c = key.shape;
    for (int64_t v :
         {c.m, c.n, c.k, c.lda, c.ldb, c.ldd, c.batch, c.stride_a, c.stride_b, c.stride_d})
      mix(static_cast<uint64_t>(v));
    mix((uint64_t{c.align_a} << 32) | c.align_b);
    mix((uint64_t{c.align_d} << 32) | static_cast<uint32_t>(key.device));
    mix((static_cast<uint64_t>(key.a_type) << 32) | static_cast<uint64_t>(key.b_type));
    mix((static_cast<uint64_t>(key.d_type) << 32) | static_cast<uint64_t>(key.bias_type));
    mix((uint64_t{key.bias} << 8) | static_cast<uint64_t>(key.scale));
    mix(key.workspace_bytes);
    return hasher.value();
  }
};

/// The persistent workspace cuBLAS recommends (cuBLAS docs, cublasSetWorkspace): 32 MiB on
/// Hopper (compute capability 9.x) and newer, 4 MiB below.
constexpr uint64_t workspace_bytes_for(int cc_major) {
  return cc_major >= 9 ? uint64_t{32} << 20 : uint64_t{4} << 20;
}

// ---- gemm_fp8's block-scaled GEMMs (BlockScaledGemmParams) on cuBLASLt ----------------------

/// Which CUDA path runs a block-scaled FP8 GEMM of gemm_fp8 (kernels/gemm_fp8_params.h):
/// - kLtTensor: mm_fp8 (the prepared low-latency weight, one K block, a per-tensor alpha): the
///   weight un-shuffled into a dense [n, k] scratch, then an FP8 cuBLASLt GEMM with alpha as A's
///   scale. cuBLASLt has FP8 from sm89.
/// - kLtBlock: 1x128 activation scales with 1x128 or 128x128 weight scales (the DeepSeek
///   layout of fp8_blockscale_gemm_sm90): cuBLASLt's block-scaled FP8 on Hopper, the only GPUs
///   whose cuBLASLt has VEC128_32F / BLK128x128_32F (cuBLAS 12.9+; Blackwell's FP8 block
///   scaling is the MX kind). The scales are repacked into cuBLASLt's layouts in scratch.
/// - kTiled: the tiled fp32 kernel (kernels/cuda/gemm_fp8_cuda.h), for everything else.
enum class Fp8Path : uint8_t { kTiled, kLtTensor, kLtBlock };

struct Fp8Route {
  Fp8Path path = Fp8Path::kTiled;
  const char* why = nullptr;  // why kTiled (a static string); null for a cuBLASLt path
  ScaleMode scale = ScaleMode::kNone;
};

/// The row-major problem a cuBLASLt path runs for `p` (mm_fp8's weight: the dense scratch copy,
/// row stride k, taken as 256-byte aligned as the scratch is).
inline RowMajorGemm fp8_row_major(const BlockScaledGemmParams& p) {
  RowMajorGemm g;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.x_type = p.a_dtype;
  g.w_type = p.b_dtype;
  g.d_type = p.out_dtype;
  g.ldx = p.a_stride_m;
  g.ldw = p.b_low_latency ? p.k : p.b_stride_n;
  g.ldd = p.out_stride_m;
  g.x_addr = reinterpret_cast<std::uintptr_t>(p.a);
  g.w_addr = p.b_low_latency ? 0 : reinterpret_cast<std::uintptr_t>(p.b);
  g.d_addr = reinterpret_cast<std::uintptr_t>(p.out);
  return g;
}

/// The path for `p` on a device of compute capability `cc` (major * 10 + minor). Pure: the CPU
/// tests check every branch.
inline Fp8Route fp8_route(const BlockScaledGemmParams& p, int cc) {
  const auto tiled = [](const char* why) { return Fp8Route{Fp8Path::kTiled, why}; };
  const auto fp8 = [](DType t) { return t == DType::kFloat8E4M3FN || t == DType::kFloat8E5M2; };
  if (cc < 89) return tiled("no FP8 tensor cores before sm89");
  if (!fp8(p.a_dtype) || !fp8(p.b_dtype)) return tiled("not an FP8 x FP8 problem");
  if (p.a_dtype == DType::kFloat8E5M2 && p.b_dtype == DType::kFloat8E5M2)
    return tiled("cuBLASLt has no e5m2 x e5m2 GEMM");
  if (p.out_dtype != DType::kBFloat16 && p.out_dtype != DType::kFloat16)
    return tiled("output is not bf16 or fp16");
  if (p.batch != 1 || p.a_mx || p.b_mx || p.bias) return tiled("batched, MX or bias");
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) return tiled("empty problem");
  if (p.a_stride_k != 1 || p.out_stride_n != 1 || (!p.b_low_latency && p.b_stride_k != 1))
    return tiled("an operand without unit stride along its rows");
  if (fp8_refusal(fp8_row_major(p)).refused()) return tiled("outside cuBLASLt's FP8 rules");
  if (p.b_low_latency) {
    if (p.gk != p.k || p.a_scale || p.b_scale) return tiled("prepared weight with block scales");
    if (reinterpret_cast<std::uintptr_t>(p.b) % 16 != 0 || p.n % 32 != 0 || p.k % 128 != 0)
      return tiled("prepared weight not 16-byte aligned or not in 32 x 128 blocks");
    return {Fp8Path::kLtTensor, nullptr, p.alpha ? ScaleMode::kTensorScales : ScaleMode::kNone};
  }
  if (cc != 90) return tiled("cuBLASLt's 1x128 / 128x128 FP8 block scaling is Hopper's");
  if (!p.a_scale || !p.b_scale || p.alpha) return tiled("not a block-scaled problem");
  if (p.gm != 1 || p.gk != 128 || (p.gn != 1 && p.gn != 128) || p.k % 128 != 0)
    return tiled("scale blocks other than 1x128 activation, 1x128 or 128x128 weight");
  // BLK128x128_32F's scale rows are padded to a multiple of 4 floats (as torch._scaled_mm
  // passes them); with k / 128 a multiple of 4 padded and unpadded rows are the same layout.
  if (p.gn == 128 && (p.k / 128) % 4 != 0)
    return tiled("128x128 weight scales need k to be a multiple of 512 here");
  // x's VEC128_32F scales are column-major [m, k / 128] with leading dimension m (torch passes
  // stride (1, M) too), and cuBLASLt's heuristic answers NOT_SUPPORTED unless that column is a
  // whole number of 16 bytes: m % 4 == 0. Measured with cuBLASLt 13.1 on sm_90 (H200) over
  // m 1..256, n 16..4096, k 128..4096, bf16 and fp16 out, both weight modes: served exactly
  // when m % 4 == 0. Decode-sized m (1..3) and odd m run the tiled kernel without asking.
  if (p.m % 4 != 0) return tiled("cuBLASLt's 1x128 activation scales need m to be a multiple of 4");
  return {Fp8Path::kLtBlock, nullptr,
          p.gn == 1 ? ScaleMode::kBlockW1x128 : ScaleMode::kBlockW128x128};
}

/// cuBLASLt's layouts of FP32 block scales (cuBLAS docs, "Scaling factor layouts"; torch's
/// _scaled_mm passes the same): VEC128_32F for an operand of `rows` rows and `kblocks` 128-wide
/// K blocks is column-major [rows, kblocks] (the rows contiguous); BLK128x128_32F is row-major
/// [row blocks, kblocks] (the K blocks contiguous). The index of the scale of (`row` or row
/// block, `kb`).
enum class BlockScaleLayout : uint8_t { kVec128, kBlk128x128 };
FLASHINFER_HD int64_t block_scale_index(BlockScaleLayout layout, int64_t row, int64_t kb,
                                        int64_t rows, int64_t kblocks) {
  return layout == BlockScaleLayout::kVec128 ? kb * rows + row : row * kblocks + kb;
}

/// The byte offset in mm_fp8's prepared weight [k/128, n, 128] (prepare_low_latency_gemm_weights:
/// rows shuffled in blocks of 32, then 128-wide K blocks) of logical element (j, kk) of the
/// weight [n, k]: what the un-shuffle kernel copies to j * k + kk.
FLASHINFER_HD int64_t low_latency_offset(int64_t j, int64_t kk, int64_t n) {
  return (kk / 128) * n * 128 + low_latency_row(j) * 128 + kk % 128;
}

/// Bytes of scratch a cuBLASLt path of `p` needs (each part 256-byte aligned): mm_fp8's dense
/// weight; the block path's x scales then w scales.
inline std::size_t fp8_scratch_bytes(const BlockScaledGemmParams& p, Fp8Path path) {
  const auto a256 = [](std::size_t b) { return (b + 255) / 256 * 256; };
  if (path == Fp8Path::kLtTensor) return a256(static_cast<std::size_t>(p.n * p.k));
  if (path != Fp8Path::kLtBlock) return 0;
  const int64_t kb = p.k / 128, w_rows = p.gn == 1 ? p.n : (p.n + 127) / 128;
  return a256(static_cast<std::size_t>(p.m * kb) * 4) +
         a256(static_cast<std::size_t>(w_rows * kb) * 4);
}

}  // namespace flashinfer::kernels::lt
