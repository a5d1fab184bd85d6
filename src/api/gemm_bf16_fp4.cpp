// BF16 x NVFP4 GEMM (flashinfer.gemm.gemm_bf16_fp4): declarations, argument checks, dispatch.
// mm_bf16_fp4 is a CPU reference only (upstream runs it on sm100-class GPUs, which the backend
// table refuses by name elsewhere). prepare_bf16_fp4_weights's cudnn layout (torch indexing
// upstream, any GPU) has a CUDA kernel too; its cute-dsl layout is refused on CUDA (upstream's
// text on the GPUs upstream refuses, the backend table's otherwise: src/api/backends.cpp).
#include "flashinfer/ops/gemm_bf16_fp4.h"

#include <string>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/cpu/gemm_bf16_fp4_cpu.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/gemm_bf16_fp4_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kGemmBf16Fp4Module = "flashinfer.gemm.gemm_bf16_fp4";

using api::KernelEntry;
using api::LaunchContext;
using kernels::Bf16Fp4Layout;

constexpr KernelEntry<kernels::Bf16Fp4PrepareParams> kPrepareKernels[] = {
    {DeviceType::kCPU, "CPU reference (host only)", nullptr,
     [](const kernels::Bf16Fp4PrepareParams& p, const LaunchContext&) {
       kernels::cpu::bf16_fp4_prepare(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: the cudnn layout's scales un-swizzled one byte per thread (the weight is "
     "returned as is)",
     nullptr,
     [](const kernels::Bf16Fp4PrepareParams& p, const LaunchContext& c) {
       kernels::cuda::bf16_fp4_prepare(p, c.stream);
     }},
#endif
};
constexpr KernelEntry<kernels::Bf16Fp4GemmParams> kGemmBf16Fp4GemmKernels[] = {
    {DeviceType::kCPU, "CPU reference (host only)", nullptr,
     [](const kernels::Bf16Fp4GemmParams& p, const LaunchContext&) {
       kernels::cpu::mm_bf16_fp4(p);
     }},
};

Bf16Fp4Layout layout_of(std::string_view backend) {
  return backend == "cute-dsl" ? Bf16Fp4Layout::kCuteDsl : Bf16Fp4Layout::kCudnn;
}

void check_block_size(int64_t block_size, const char* op) {
  FLASHINFER_CHECK(block_size == 16, op, "block_size", "must be 16 for FP4, got ", block_size);
}

// fp32, one element, on `device` (upstream: "(1,) float32"; the GEMM reshapes it to (1,)).
// Returns its value when `read` (a device alpha costs a synchronizing copy, so the weight
// preparation, which only checks it, does not read it).
float gemm_bf16_fp4_check_alpha(const std::optional<Tensor>& alpha, Device device, const char* op,
                                bool exact, bool read = true) {
  if (!alpha || !alpha->defined()) return 1.0f;
  const Tensor& t = *alpha;
  if (exact) {
    api::check_dim(t, {1}, op, "alpha");
    FLASHINFER_CHECK(t.size(0) == 1, op, "alpha", "must be shape (1,), got ",
                     shape_to_string(t.shape()));
  } else {
    FLASHINFER_CHECK(t.numel() == 1, op, "alpha", "expected one element, got shape ",
                     shape_to_string(t.shape()));
  }
  api::check_dtype_in(t, {DType::kFloat32}, op, "alpha");
  FLASHINFER_CHECK(t.device() == device, op, "alpha", "must be on the same device as ",
                   exact ? "b" : "a", " (", device.str(), "), got ", t.device().str());
  return read ? static_cast<float>(t.to(Device::cpu()).item()) : 1.0f;
}

}  // namespace

std::tuple<Tensor, Tensor, std::optional<Tensor>> prepare_bf16_fp4_weights(
    const Tensor& b, const Tensor& b_descale, std::optional<Tensor> alpha, std::string_view backend,
    int64_t block_size) {
  return call_op<&prepare_bf16_fp4_weights>(
      [&]() -> std::tuple<Tensor, Tensor, std::optional<Tensor>> {
        const char* op = "prepare_bf16_fp4_weights";
        api::check_defined(b, op, "b");
        api::check_dim(b, {2}, op, "b");
        api::check_dtype_in(b, {DType::kUInt8}, op, "b");
        api::check_non_empty(b, op, "b");
        const int64_t n = b.size(0), k = b.size(1) * 2;
        check_block_size(block_size, op);
        FLASHINFER_CHECK(k % block_size == 0, op, "b", "K = ", k,
                         " must be a multiple of block_size = ", block_size);
        api::check_defined(b_descale, op, "b_descale");
        api::check_same_device(b_descale, b, op, "b_descale", "b");
        FLASHINFER_CHECK(b_descale.element_size() == 1, op, "b_descale",
                         "expected a byte buffer (uint8 or float8_e4m3fn), got ",
                         dtype_torch_name(b_descale.dtype()));
        const int64_t ksf = k / block_size;
        const int64_t need = (n + 127) / 128 * ((ksf + 3) / 4) * 512;
        FLASHINFER_CHECK(b_descale.numel() >= need, op, "b_descale", "has ", b_descale.numel(),
                         " bytes but the 128x4-swizzled layout for N = ", n, ", K_sf = ", ksf,
                         " requires at least ", need);
        (void)gemm_bf16_fp4_check_alpha(alpha, b.device(), op, true, /*read=*/false);
        api::check_backend(op, backend, b.device());
        const Bf16Fp4Layout layout = layout_of(backend);
        if (layout == Bf16Fp4Layout::kCuteDsl) {
          FLASHINFER_CHECK(n % 64 == 0, op, "b",
                           "backend 'cute-dsl' needs N % 64 == 0, got N = ", n);
        }
        FLASHINFER_CHECK(b.stride(1) == 1, op, "b", "the last dimension must be contiguous");
        const Tensor sf = b_descale.contiguous();
        kernels::Bf16Fp4PrepareParams p;
        p.layout = layout;
        p.n = n;
        p.k = k;
        p.b = static_cast<const uint8_t*>(b.data_ptr());
        p.b_stride_n = b.stride(0);
        p.sf = static_cast<const uint8_t*>(sf.data_ptr());
        if (layout == Bf16Fp4Layout::kCudnn) {
          // The weight bytes are the cuDNN layout already; the scales are un-swizzled.
          Tensor lin = Tensor::empty({n, ksf}, DType::kFloat8E4M3FN, b.device());
          p.out_sf = static_cast<uint8_t*>(lin.data_ptr());
          api::launch(kPrepareKernels, p, b.device(), op, "b");
          return {b, lin, alpha};
        }
        Tensor packed = Tensor::empty({k / 16, 2 * n}, DType::kInt32, b.device());
        Tensor s0e5m3 = Tensor::empty({ksf, n}, DType::kUInt8, b.device());
        p.out_b = static_cast<uint8_t*>(packed.data_ptr());
        p.out_sf = static_cast<uint8_t*>(s0e5m3.data_ptr());
        api::launch(kPrepareKernels, p, b.device(), op, "b");
        return {packed, s0e5m3, alpha};
      },
      b, b_descale, alpha, backend, block_size);
}

Tensor mm_bf16_fp4(const Tensor& a, const Tensor& b, const Tensor& b_descale,
                   std::optional<Tensor> alpha, std::string_view backend,
                   std::optional<DType> out_dtype, std::optional<Tensor> out, int64_t block_size,
                   bool enable_pdl) {
  return call_op<&mm_bf16_fp4>(
      [&] {
        const char* op = "mm_bf16_fp4";
        api::check_defined(a, op, "a");
        api::check_dim(a, {2}, op, "a");
        api::check_dtype_in(a, {DType::kBFloat16}, op, "a");
        const DType odt = out_dtype.value_or(a.dtype());
        FLASHINFER_CHECK(odt == DType::kBFloat16 || odt == DType::kFloat16, op, "out_dtype",
                         "must be torch.bfloat16 or torch.float16, got ", dtype_torch_name(odt));
        check_block_size(block_size, op);
        // Checked, then the backend's refusal (sm90 here), then read: a refused call reads nothing
        // back from the device.
        gemm_bf16_fp4_check_alpha(alpha, a.device(), op, false, /*read=*/false);
        api::check_backend(op, backend, a.device());
        const float al = gemm_bf16_fp4_check_alpha(alpha, a.device(), op, false);
        const Bf16Fp4Layout layout = layout_of(backend);
        api::check_defined(b, op, "b");
        api::check_dim(b, {2}, op, "b");
        api::check_same_device(b, a, op, "b", "a");
        api::check_defined(b_descale, op, "b_descale");
        api::check_same_device(b_descale, a, op, "b_descale", "a");
        int64_t n = 0, k = 0;
        if (layout == Bf16Fp4Layout::kCudnn) {
          FLASHINFER_CHECK(b.dtype() == DType::kUInt8, op, "b",
                           "backend 'cudnn' expects the uint8 [N, K/2] weight from "
                           "prepare_bf16_fp4_weights(..., backend='cudnn'), got ",
                           dtype_torch_name(b.dtype()));
          FLASHINFER_CHECK(b.stride(1) == 1, op, "b", "the last dimension must be contiguous");
          n = b.size(0);
          k = b.size(1) * 2;
          api::check_dtype_in(b_descale, {DType::kFloat8E4M3FN, DType::kUInt8}, op, "b_descale");
          api::check_shape_eq(b_descale, {n, k / block_size}, op, "b_descale");
        } else {
          FLASHINFER_CHECK(b.dtype() == DType::kInt32, op, "b",
                           "backend 'cute-dsl' expects the packed int32 [K/16, 2N] weight from "
                           "prepare_bf16_fp4_weights(..., backend='cute-dsl'), got ",
                           dtype_torch_name(b.dtype()));
          FLASHINFER_CHECK(odt == a.dtype(), op, "out_dtype",
                           "backend 'cute-dsl' requires out_dtype == a.dtype (",
                           dtype_torch_name(a.dtype()), "), got ", dtype_torch_name(odt));
          FLASHINFER_CHECK(b.size(1) % 128 == 0, op, "b",
                           "expected [K/16, 2N] with N % 64 == 0, got ",
                           shape_to_string(b.shape()));
          n = b.size(1) / 2;
          k = b.size(0) * block_size;
          api::check_dtype_in(b_descale, {DType::kUInt8}, op, "b_descale");
          api::check_shape_eq(b_descale, {k / block_size, n}, op, "b_descale");
        }
        FLASHINFER_CHECK(a.size(1) == k, op, "a", "a.shape[1] = ", a.size(1),
                         " but the prepared b encodes K = ", k);
        FLASHINFER_CHECK(a.stride(1) == 1, op, "a", "the last dimension must be contiguous");
        const int64_t m = a.size(0);
        Tensor result;
        if (out && out->defined()) {
          api::check_shape_eq(*out, {m, n}, op, "out");
          FLASHINFER_CHECK(out->dtype() == odt, op, "out", "dtype ", dtype_torch_name(out->dtype()),
                           " != requested out_dtype ", dtype_torch_name(odt));
          api::check_same_device(*out, a, op, "out", "a");
          result = *out;
        } else {
          result = Tensor::empty({m, n}, odt, a.device());
        }
        const Tensor bw = layout == Bf16Fp4Layout::kCudnn ? b : b.contiguous();
        const Tensor sf = b_descale.contiguous();
        kernels::Bf16Fp4GemmParams p;
        p.layout = layout;
        p.m = m;
        p.n = n;
        p.k = k;
        p.a = a.data_ptr();
        p.a_stride_m = a.stride(0);
        p.b = static_cast<const uint8_t*>(bw.data_ptr());
        p.b_stride_n = layout == Bf16Fp4Layout::kCudnn ? bw.stride(0) : 0;
        p.sf = static_cast<const uint8_t*>(sf.data_ptr());
        p.alpha = al;
        p.out = result.data_ptr();
        p.out_dtype = odt;
        p.out_stride_m = result.stride(0);
        p.out_stride_n = result.stride(1);
        api::launch(kGemmBf16Fp4GemmKernels, p, a.device(), op, "a", enable_pdl);
        return result;
      },
      a, b, b_descale, alpha, backend, out_dtype, out, block_size, enable_pdl);
}

namespace {

// Bench hooks: canonical weights from nvfp4-like random bytes (scales e4m3 codes 0x30..0x3F,
// values 2^-3..2^-2), prepared on the host so every device gets the same bits.
Tensor gemm_bf16_fp4_random_bytes(const Shape& shape, uint64_t seed, double lo, double hi) {
  return api::bench::random_tensor(shape, DType::kFloat32, Device::cpu(), seed, lo, hi)
      .to(DType::kUInt8);
}

struct Canonical {
  Tensor b, sf;
  int64_t n, k;
};
Canonical canonical(const BenchShape& s) {
  const int64_t n = (s.n + 63) / 64 * 64, k = (s.k + 15) / 16 * 16;
  const int64_t ksf = k / 16, need = (n + 127) / 128 * ((ksf + 3) / 4) * 512;
  return {gemm_bf16_fp4_random_bytes({n, k / 2}, s.random_seed, 0.0, 256.0),
          gemm_bf16_fp4_random_bytes({need}, s.random_seed + 1, 48.0, 64.0), n, k};
}

// The cudnn layout: the one upstream prepares on every GPU (sm90 included), so the case runs on
// CUDA wherever upstream runs it; it reads and writes the scales (the weight is returned as is).
BenchCase gemm_bf16_fp4_bench_prepare(const BenchShape& s, Device dev) {
  const Canonical c = canonical(s);
  BenchCase bc =
      api::bench::invoke_case("prepare_bf16_fp4_weights", {Value(c.b.to(dev)), Value(c.sf.to(dev))},
                              {{"backend", Value("cudnn")}});
  bc.bytes = 2.0 * static_cast<double>(c.n * c.k / 16);
  return bc;
}

BenchCase gemm_bf16_fp4_bench_mm(const BenchShape& s, Device dev) {
  const Canonical c = canonical(s);
  auto [pb, psf, pal] = prepare_bf16_fp4_weights(c.b, c.sf, std::nullopt, "cudnn");
  (void)pal;
  Tensor a = api::bench::random_tensor({s.m, c.k}, DType::kBFloat16, dev, s.random_seed + 2);
  BenchCase bc = api::bench::invoke_case("mm_bf16_fp4",
                                         {Value(a), Value(pb.to(dev)), Value(psf.to(dev)),
                                          Value(Tensor::full({1}, 0.5, DType::kFloat32).to(dev))},
                                         {{"backend", Value("cudnn")}});
  bc.flops = 2.0 * static_cast<double>(s.m * c.n * c.k);
  bc.bytes = api::bench::nbytes({s.m, c.k}, DType::kBFloat16) +
             static_cast<double>(c.n * c.k) / 2.0 + static_cast<double>(c.n * c.k) / 16.0 +
             api::bench::nbytes({s.m, c.n}, DType::kBFloat16);
  return bc;
}

}  // namespace

namespace detail {
void register_gemm_bf16_fp4_ops(OpRegistry& r) {
  declare<&prepare_bf16_fp4_weights>(
      r,
      {.name = "prepare_bf16_fp4_weights",
       .module = kGemmBf16Fp4Module,
       .summary = "Canonical NVFP4 weight + 128x4 scales -> one backend's bf16 x fp4 layout"},
      "b", "b_descale", "alpha", arg("backend").kw(), arg("block_size", 16).kw());
  declare<&mm_bf16_fp4>(
      r,
      {.name = "mm_bf16_fp4",
       .module = kGemmBf16Fp4Module,
       .summary = "BF16 x NVFP4 GEMM on prepared weights: (a @ dequant(b).T) * alpha"},
      "a", "b", "b_descale", "alpha", arg("backend").kw(), arg("out_dtype").kw(),
      arg("out").mut().kw(), arg("block_size", 16).kw(), arg("enable_pdl", true).kw());

  api::register_backends("prepare_bf16_fp4_weights", kPrepareKernels);
  api::register_backends("mm_bf16_fp4", kGemmBf16Fp4GemmKernels);

  register_bench_hook("prepare_bf16_fp4_weights", gemm_bf16_fp4_bench_prepare);
  register_bench_hook("mm_bf16_fp4", gemm_bf16_fp4_bench_mm);
}
}  // namespace detail

}  // namespace flashinfer
