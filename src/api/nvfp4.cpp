// Grouped / fused NVFP4 and MXFP8 quantizers, weight shuffles and the NVFP4 KV-cache quantizers
// (flashinfer.quantization.fp4_quantization, .fp8_quantization, flashinfer.activation):
// declarations, argument checks, dispatch. The weight shuffles, nvfp4_kv_dequantize, the grouped
// quantizers (masked NVFP4, silu-and-mul experts, MXFP8; nvfp4_batched_quantize) and
// silu_and_mul_nvfp4_quantize have CUDA kernels; the others are CPU references (CUDA tensors get
// kUnsupported naming the op and argument, or upstream's refusal where upstream does not run the op
// on that GPU).
#include "flashinfer/ops/nvfp4.h"

#include <algorithm>
#include <string>
#include <vector>

#include "api/backends.h"
#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "api/nvfp4_4over6.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/ops/quantization.h"
#include "kernels/cpu/nvfp4_cpu.h"
#include "kernels/cpu/quantization_cpu.h"
#include "kernels/quantization_params.h"

#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/nvfp4_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kNvfp4Fp4Module = "flashinfer.quantization.fp4_quantization";
constexpr const char* kNvfp4Fp8Module = "flashinfer.quantization.fp8_quantization";
constexpr const char* kActModule = "flashinfer.activation";

using api::KernelEntry;
using api::LaunchContext;

// The masked grouped quantizers (scaled_fp4_grouped_quantize,
// silu_and_mul_scaled_nvfp4_experts_quantize, mxfp8_grouped_quantize): the CUDA kernel reads the
// mask and the global scales on the device, as upstream's.
constexpr KernelEntry<kernels::GroupedQuantizeParams> kGroupedKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const kernels::GroupedQuantizeParams& p, const LaunchContext&) {
       kernels::cpu::grouped_quantize(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA,
     "CUDA kernel: one thread per (group, row, block), 16-byte loads, mask read on the device",
     nullptr,
     [](const kernels::GroupedQuantizeParams& p, const LaunchContext& c) {
       kernels::cuda::grouped_quantize(p, c.stream, c.enable_pdl);
     }},
#endif
};
// nvfp4_batched_quantize: the grouped quantizer without a mask, also on CUDA.
constexpr KernelEntry<kernels::GroupedQuantizeParams> kBatchedKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const kernels::GroupedQuantizeParams& p, const LaunchContext&) {
       kernels::cpu::grouped_quantize(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: fp4_quantize per batch item (128x4 scales)", nullptr,
     [](const kernels::GroupedQuantizeParams& p, const LaunchContext& c) {
       kernels::cuda::batched_fp4_quantize(p, c.stream, c.enable_pdl);
     }},
#endif
};
// silu_and_mul_nvfp4_quantize's first step (the second is fp4_quantize's kernel): the same
// fp32 steps on both backends (kernels/fp32_rules.h), so the CUDA bytes equal the CPU's.
constexpr KernelEntry<kernels::SiluMulParams> kSiluMulKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const kernels::SiluMulParams& p, const LaunchContext&) {
       kernels::cpu::silu_and_mul_rows(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: silu(gate) * up rows (128-bit loads), then fp4_quantize",
     nullptr,
     [](const kernels::SiluMulParams& p, const LaunchContext& c) {
       kernels::cuda::silu_and_mul_rows(p, c.stream, c.enable_pdl);
     }},
#endif
};
constexpr KernelEntry<kernels::RowGatherParams> kGatherKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const kernels::RowGatherParams& p, const LaunchContext&) { kernels::cpu::gather_rows(p); }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one thread per byte (row gather)", nullptr,
     [](const kernels::RowGatherParams& p, const LaunchContext& c) {
       kernels::cuda::gather_rows(p, c.stream);
     }},
#endif
};
constexpr KernelEntry<kernels::BlockDequantizeParams> kHostDequantKernels[] = {
    {DeviceType::kCPU, "CPU reference (host only, as upstream)", nullptr,
     [](const kernels::BlockDequantizeParams& p, const LaunchContext&) {
       kernels::cpu::block_dequantize(p);
     }},
};
constexpr KernelEntry<kernels::Nvfp4KvParams> kKvQuantKernels[] = {
    {DeviceType::kCPU, "CPU reference (host only)", nullptr,
     [](const kernels::Nvfp4KvParams& p, const LaunchContext&) {
       kernels::cpu::nvfp4_kv_quantize(p);
     }},
};
constexpr KernelEntry<kernels::Nvfp4KvParams> kKvDequantKernels[] = {
    {DeviceType::kCPU, "CPU reference", nullptr,
     [](const kernels::Nvfp4KvParams& p, const LaunchContext&) {
       kernels::cpu::nvfp4_kv_dequantize(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one thread per element", nullptr,
     [](const kernels::Nvfp4KvParams& p, const LaunchContext& c) {
       kernels::cuda::nvfp4_kv_dequantize(p, c.stream);
     }},
#endif
};

int64_t nvfp4_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// check_same_device against the input's device itself: a stand-in tensor on a CUDA device would
// cost a cudaMalloc and a cudaFree (which synchronizes the device) in every call.
void check_on_device(const Tensor& t, Device device, const char* op, const char* arg,
                     const char* ref_arg) {
  FLASHINFER_CHECK(t.device() == device, op, arg, "is on ", t.device().str(), " but ", ref_arg,
                   " is on ", device.str());
}

// fp32 one-element (or n-element) scale tensor on `device`, contiguous.
Tensor fp32_scales(const Tensor& t, int64_t n, Device device, const char* op, const char* arg) {
  api::check_defined(t, op, arg);
  FLASHINFER_CHECK(t.numel() == n, op, arg, "expected ", n, " element(s), got shape ",
                   shape_to_string(t.shape()));
  api::check_dtype_in(t, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, arg);
  check_on_device(t, device, op, arg, "the input");
  return (t.dtype() == DType::kFloat32 ? t : t.to(DType::kFloat32)).contiguous();
}

// int32 [groups] row counts. Returns the mask contiguous on its own device (what a kernel
// reads). A host mask's entries are checked to lie in [0, m]; a device mask's values are read by
// the CUDA kernel only, as upstream's (checking them here would copy them to the host and
// synchronize), which clamps each entry to [0, m]: never a row outside the input.
Tensor check_mask(const Tensor& mask, int64_t groups, int64_t m, Device device, const char* op) {
  api::check_defined(mask, op, "mask");
  api::check_dim(mask, {1}, op, "mask");
  api::check_dtype_in(mask, {DType::kInt32}, op, "mask");
  FLASHINFER_CHECK(mask.size(0) == groups, op, "mask", "expected one entry per group (", groups,
                   "), got ", mask.size(0));
  check_on_device(mask, device, op, "mask", "a");
  Tensor c = mask.contiguous();
  if (!c.device().is_cpu()) return c;
  for (int64_t g = 0; g < groups; ++g) {
    const int32_t v = c.data<int32_t>()[g];
    FLASHINFER_CHECK(v >= 0 && v <= m, op, "mask", "mask[", g, "] = ", v, " is outside [0, M = ", m,
                     "]");
  }
  return c;
}

// [L, M, K] fp16/bf16 (or `dtypes`) with a unit K stride.
void check_grouped_input(const Tensor& a, const char* op, const char* arg,
                         std::initializer_list<DType> dtypes = {DType::kFloat16,
                                                                DType::kBFloat16}) {
  api::check_defined(a, op, arg);
  api::check_dim(a, {3}, op, arg);
  api::check_dtype_in(a, dtypes, op, arg);
  api::check_non_empty(a, op, arg);
  FLASHINFER_CHECK(a.stride(2) == 1, op, arg, "the last dimension must be contiguous");
}

// The NVFP4 grouped quantizers: a [L, M, K] (or [L, M, 2K] with silu_and_mul), per-group scales.
std::tuple<Tensor, Tensor> grouped_fp4(const char* op, const Tensor& a, const Tensor& mask,
                                       const Tensor& a_global_sf, bool silu,
                                       const Value& nvfp4_4over6) {
  api::check_defined(a, op, "a");
  const kernels::Nvfp4FourOverSix fos =
      api::nvfp4_4over6_recipe(nvfp4_4over6, a.dtype(), a.device(), op);
  check_grouped_input(a, op, "a");
  const int64_t l = a.size(0), m = a.size(1);
  FLASHINFER_CHECK(!silu || a.size(2) % 2 == 0, op, "a", "the last dimension (", a.size(2),
                   ") must be even: [gate | up]");
  const int64_t k = silu ? a.size(2) / 2 : a.size(2);
  FLASHINFER_CHECK(k % 16 == 0, op, "a", "K = ", k, " must be a multiple of 16");
  const Tensor mk = check_mask(mask, l, m, a.device(), op);
  const Tensor gs = fp32_scales(a_global_sf, l, a.device(), op, "a_global_sf");
  const int64_t pm = nvfp4_round_up(m, 128), pk = nvfp4_round_up(k / 16, 4);
  Tensor q = Tensor::empty({l, m, k / 2}, DType::kUInt8, a.device());
  // Upstream views its int32 scale buffer as float8_e4m3fn: the same bytes.
  Tensor sf = Tensor::empty({l, pm, pk}, DType::kFloat8E4M3FN, a.device());
  kernels::GroupedQuantizeParams p;
  p.input = a.data_ptr();
  p.in_dtype = a.dtype();
  p.groups = l;
  p.m = m;
  p.k = k;
  p.padded_k = k;
  p.in_stride_g = a.stride(0);
  p.in_stride_m = a.stride(1);
  p.silu_and_mul = silu;
  p.four_over_six = fos;
  p.rows = mk.data<int32_t>();
  p.global_scale = gs.data<float>();
  p.per_group_scale = true;
  p.fp4 = true;
  p.out = q.data<uint8_t>();
  p.sf = static_cast<uint8_t*>(sf.data_ptr());
  p.sf_per_group = pm * pk;
  api::launch(kGroupedKernels, p, a.device(), op, "a");
  // Upstream returns the group-major bytes as views with the group last.
  return {q.permute({1, 2, 0}),
          sf.view({l, pm / 128, pk / 4, 32, 4, 4}).permute({3, 4, 1, 5, 2, 0})};
}

// The rows of shuffle_matrix_a: row_indices[new_row] = old_row.
std::vector<int64_t> shuffle_rows(int64_t m, int64_t epilogue_tile_m, const char* op,
                                  const char* arg) {
  const int64_t block = epilogue_tile_m % 128 == 0 ? 32 : 16;
  FLASHINFER_CHECK(m % block == 0, op, arg, "input_tensor.shape[0] = ", m,
                   " must be a multiple of ", block, " (epilogue_tile_m = ", epilogue_tile_m, ")");
  std::vector<int64_t> idx(static_cast<size_t>(m));
  for (int64_t old_row = 0; old_row < m; ++old_row) {
    const int64_t i = old_row % block;
    // The 8-row interleave {0, 8, 16, 24, 1, 9, ...}: slot i holds row (i % (block/8))*8 +
    // i/(block/8).
    const int64_t per = block / 8;
    const int64_t mapped = (i % per) * 8 + i / per;
    idx[static_cast<size_t>(old_row - i + mapped)] = old_row;
  }
  return idx;
}

Tensor gather(const Tensor& t, const std::vector<int64_t>& idx, const char* op, const char* arg) {
  const Tensor c = t.contiguous();
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  kernels::RowGatherParams p;
  p.input = static_cast<const uint8_t*>(c.data_ptr());
  p.rows = t.size(0);
  p.row_bytes = t.size(0) == 0 ? 0 : c.numel() / t.size(0) * static_cast<int64_t>(c.element_size());
  p.in_stride_bytes = p.row_bytes;
  p.src_row = idx.data();
  p.out = static_cast<uint8_t*>(out.data_ptr());
  // A CUDA kernel reads the row map from device memory (kept alive past the launch: freeing it
  // synchronizes).
  Tensor device_idx;
  if (t.device().is_cuda()) {
    device_idx = Tensor::from_vector(std::vector<double>(idx.begin(), idx.end()),
                                     {static_cast<int64_t>(idx.size())}, DType::kInt64)
                     .to(t.device());
    p.src_row = device_idx.data<int64_t>();
  }
  api::launch(kGatherKernels, p, t.device(), op, arg);
  return out;
}

}  // namespace

std::tuple<Tensor, Tensor> silu_and_mul_nvfp4_quantize(
    const Tensor& input, const Tensor& global_scale, int64_t sf_vec_size,
    bool is_sf_swizzled_layout, bool is_sf_8x4_layout, std::optional<bool> enable_pdl,
    const Value& nvfp4_4over6) {
  return call_op<&silu_and_mul_nvfp4_quantize>(
      [&]() -> std::tuple<Tensor, Tensor> {
        const char* op = "silu_and_mul_nvfp4_quantize";
        api::check_defined(input, op, "input");
        api::check_dim(input, {2}, op, "input");
        api::check_dtype_in(input, {DType::kFloat16, DType::kBFloat16}, op, "input");
        api::check_non_empty(input, op, "input");
        FLASHINFER_CHECK(input.stride(1) == 1, op, "input",
                         "the last dimension must be contiguous");
        FLASHINFER_CHECK(sf_vec_size == 16, op, "sf_vec_size", "must be 16 (NVFP4), got ",
                         sf_vec_size);
        FLASHINFER_CHECK(input.size(1) % 2 == 0, op, "input", "the last dimension (", input.size(1),
                         ") must be even: [gate | up]");
        const int64_t m = input.size(0), k = input.size(1) / 2;
        FLASHINFER_CHECK(k % 16 == 0, op, "input", "K = ", k, " must be a multiple of 16");
        fp32_scales(global_scale, 1, input.device(), op, "global_scale");
        Tensor y = Tensor::empty({m, k}, input.dtype(), input.device());
        kernels::SiluMulParams p;
        p.input = input.data_ptr();
        p.dtype = input.dtype();
        p.m = m;
        p.k = k;
        p.in_stride_m = input.stride(0);
        p.out = y.data_ptr();
        api::launch(kSiluMulKernels, p, input.device(), op, "input");
        // The quantization itself is fp4_quantize's (an inner call, not observed separately),
        // with this call's 4over6 recipe.
        return fp4_quantize(y, global_scale, 16, false, is_sf_swizzled_layout, is_sf_8x4_layout,
                            false, enable_pdl, "auto", nvfp4_4over6);
      },
      input, global_scale, sf_vec_size, is_sf_swizzled_layout, is_sf_8x4_layout, enable_pdl,
      nvfp4_4over6);
}

std::tuple<Tensor, Tensor> silu_and_mul_scaled_nvfp4_experts_quantize(const Tensor& a,
                                                                      const Tensor& mask,
                                                                      const Tensor& a_global_sf,
                                                                      const Value& nvfp4_4over6) {
  return call_op<&silu_and_mul_scaled_nvfp4_experts_quantize>(
      [&] {
        return grouped_fp4("silu_and_mul_scaled_nvfp4_experts_quantize", a, mask, a_global_sf, true,
                           nvfp4_4over6);
      },
      a, mask, a_global_sf, nvfp4_4over6);
}

std::tuple<Tensor, Tensor> scaled_fp4_grouped_quantize(const Tensor& a, const Tensor& mask,
                                                       const Tensor& a_global_sf,
                                                       const Value& nvfp4_4over6) {
  return call_op<&scaled_fp4_grouped_quantize>(
      [&] {
        return grouped_fp4("scaled_fp4_grouped_quantize", a, mask, a_global_sf, false,
                           nvfp4_4over6);
      },
      a, mask, a_global_sf, nvfp4_4over6);
}

std::tuple<Tensor, Tensor> nvfp4_batched_quantize(const Tensor& a, const Tensor& a_global_sf,
                                                  int64_t sf_vec_size, const Value& nvfp4_4over6) {
  return call_op<&nvfp4_batched_quantize>(
      [&]() -> std::tuple<Tensor, Tensor> {
        const char* op = "nvfp4_batched_quantize";
        api::check_defined(a, op, "a");
        const kernels::Nvfp4FourOverSix fos =
            api::nvfp4_4over6_recipe(nvfp4_4over6, a.dtype(), a.device(), op);
        // fp16 / bf16 or, as upstream's kernel takes it, e4m3 (nvfp4_rules.h: fp8_fp4_scale).
        check_grouped_input(a, op, "a", {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3FN});
        FLASHINFER_CHECK(sf_vec_size == 16, op, "sf_vec_size",
                         "must be 16 (upstream: 32 is not supported yet), got ", sf_vec_size);
        const int64_t b = a.size(0), m = a.size(1), k = a.size(2);
        FLASHINFER_CHECK(k % 16 == 0, op, "a", "K = ", k, " must be a multiple of 16");
        // One scale, or one per row (upstream's SFScale[rowIdx], the same for every batch item).
        api::check_defined(a_global_sf, op, "a_global_sf");
        const bool per_row = a_global_sf.numel() == m && m > 1;
        const Tensor gs = fp32_scales(a_global_sf, per_row ? m : 1, a.device(), op, "a_global_sf");
        const int64_t per = kernels::sf_buffer_size(kernels::SfLayoutCode::k128x4, m, k / 16);
        Tensor q = Tensor::empty({b, m, k / 2}, DType::kUInt8, a.device());
        Tensor sf = Tensor::empty({b, per}, DType::kUInt8, a.device());
        kernels::GroupedQuantizeParams p;
        p.input = a.data_ptr();
        p.in_dtype = a.dtype();
        p.groups = b;
        p.m = m;
        p.k = k;
        p.padded_k = k;
        p.in_stride_g = a.stride(0);
        p.in_stride_m = a.stride(1);
        p.global_scale = gs.data<float>();
        p.per_row_scale = per_row;
        p.fp4 = true;
        p.four_over_six = fos;
        p.out = q.data<uint8_t>();
        p.sf = sf.data<uint8_t>();
        p.sf_per_group = per;
        api::launch(kBatchedKernels, p, a.device(), op, "a");
        return {q, sf};
      },
      a, a_global_sf, sf_vec_size, nvfp4_4over6);
}

std::tuple<Tensor, Tensor> mxfp8_grouped_quantize(const Tensor& a, const Tensor& mask) {
  return call_op<&mxfp8_grouped_quantize>(
      [&]() -> std::tuple<Tensor, Tensor> {
        const char* op = "mxfp8_grouped_quantize";
        check_grouped_input(a, op, "a");
        const int64_t b = a.size(0), m = a.size(1), k = a.size(2);
        const Tensor mk = check_mask(mask, b, m, a.device(), op);
        // Upstream refuses GPUs before Blackwell here, after its mask checks and before its K
        // check (CONFORMANCE.md).
        api::check_upstream_arch(op, "a", a.device());
        FLASHINFER_CHECK(k % 32 == 0, op, "a", "K must be divisible by 32, got ", k);
        const int64_t pk = nvfp4_round_up(k, 128), pm = nvfp4_round_up(m, 128), sk = pk / 32;
        Tensor q = Tensor::empty({b, m, pk}, DType::kFloat8E4M3FN, a.device());
        Tensor sf = Tensor::empty({b, pm, sk}, DType::kUInt8, a.device());
        kernels::GroupedQuantizeParams p;
        p.input = a.data_ptr();
        p.in_dtype = a.dtype();
        p.groups = b;
        p.m = m;
        p.k = k;
        p.padded_k = pk;
        p.in_stride_g = a.stride(0);
        p.in_stride_m = a.stride(1);
        p.rows = mk.data<int32_t>();
        p.fp4 = false;
        p.out = static_cast<uint8_t*>(q.data_ptr());
        p.sf = sf.data<uint8_t>();
        p.sf_per_group = pm * sk;
        api::launch(kGroupedKernels, p, a.device(), op, "a");
        return {q.permute({1, 2, 0}),
                sf.view({b, pm / 128, sk / 4, 32, 4, 4}).permute({3, 4, 1, 5, 2, 0})};
      },
      a, mask);
}

Tensor shuffle_matrix_a(const Tensor& input_tensor, int64_t epilogue_tile_m) {
  return call_op<&shuffle_matrix_a>(
      [&] {
        const char* op = "shuffle_matrix_a";
        api::check_defined(input_tensor, op, "input_tensor");
        api::check_dim(input_tensor, {2}, op, "input_tensor");
        FLASHINFER_CHECK(epilogue_tile_m > 0, op, "epilogue_tile_m", "must be positive, got ",
                         epilogue_tile_m);
        const auto idx = shuffle_rows(input_tensor.size(0), epilogue_tile_m, op, "input_tensor");
        return gather(input_tensor, idx, op, "input_tensor");
      },
      input_tensor, epilogue_tile_m);
}

Tensor shuffle_matrix_sf_a(const Tensor& input_tensor, int64_t epilogue_tile_m,
                           int64_t num_elts_per_sf) {
  return call_op<&shuffle_matrix_sf_a>(
      [&] {
        const char* op = "shuffle_matrix_sf_a";
        const Tensor& t = input_tensor;
        api::check_defined(t, op, "input_tensor");
        api::check_dim(t, {2}, op, "input_tensor");
        api::check_dtype_in(t, {DType::kUInt8}, op, "input_tensor");
        // num_elts_per_sf is not read: upstream's function does not pass it on (its index helper
        // asserts its own default), so MXFP8's 32, which vLLM and SGLang pass, shuffles the same.
        FLASHINFER_CHECK(epilogue_tile_m > 0, op, "epilogue_tile_m", "must be positive, got ",
                         epilogue_tile_m);
        FLASHINFER_CHECK(t.size(0) % 128 == 0 && t.size(0) > 0, op, "input_tensor",
                         "M = ", t.size(0), " must be a positive multiple of 128");
        FLASHINFER_CHECK(t.size(1) % 4 == 0 && t.size(1) > 0, op, "input_tensor", "K = ", t.size(1),
                         " must be a positive multiple of 4");
        const auto idx = shuffle_rows(t.size(0), epilogue_tile_m, op, "input_tensor");
        return block_scale_interleave(gather(t, idx, op, "input_tensor"));
      },
      input_tensor, epilogue_tile_m, num_elts_per_sf);
}

Tensor mxfp4_dequantize_host(const Tensor& weight, const Tensor& scale, int64_t group_size) {
  return call_op<&mxfp4_dequantize_host>(
      [&] {
        const char* op = "mxfp4_dequantize_host";
        api::check_defined(weight, op, "weight");
        api::check_defined(scale, op, "scale");
        api::check_dim(weight, {2}, op, "weight");
        api::check_dim(scale, {2}, op, "scale");
        api::check_dtype_in(weight, {DType::kUInt8}, op, "weight");
        api::check_dtype_in(scale, {DType::kUInt8}, op, "scale");
        api::check_non_empty(weight, op, "weight");
        FLASHINFER_CHECK(weight.device().is_cpu(), op, "weight", "must be a CPU tensor, got ",
                         weight.device().str());
        FLASHINFER_CHECK(scale.device().is_cpu(), op, "scale", "must be a CPU tensor, got ",
                         scale.device().str());
        FLASHINFER_CHECK(group_size > 0, op, "group_size", "must be positive, got ", group_size);
        const int64_t n = weight.size(0), k = weight.size(1) * 2;
        FLASHINFER_CHECK(scale.size(0) == n, op, "scale",
                         "weight and scale must have the same number of rows (", n, " vs ",
                         scale.size(0), ")");
        FLASHINFER_CHECK(scale.size(1) * group_size == k, op, "scale",
                         "scale.size(1) * group_size must equal K = ", k, ", got ", scale.size(1),
                         " * ", group_size);
        const Tensor w = weight.contiguous(), s = scale.contiguous();
        Tensor out = Tensor::empty({n, k}, DType::kFloat32);
        // Linear ue8m0 scales of group_size columns: block_dequantize's MXFP4 case.
        kernels::BlockDequantizeParams p;
        p.data = w.data<uint8_t>();
        p.data_stride_m = k / 2;
        p.fp4 = true;
        p.sf = s.data<uint8_t>();
        p.sf_size = s.numel();
        p.sf_ue8m0 = true;
        p.sf_vec_size = static_cast<int>(group_size);
        p.layout = kernels::SfLayoutCode::kLinear;
        p.m = n;
        p.k = k;
        p.out = out.data<float>();
        api::launch(kHostDequantKernels, p, Device::cpu(), op, "weight");
        return out;
      },
      weight, scale, group_size);
}

std::tuple<Tensor, Tensor> nvfp4_kv_quantize(const Tensor& input, const Tensor& global_scale) {
  return call_op<&nvfp4_kv_quantize>(
      [&]() -> std::tuple<Tensor, Tensor> {
        const char* op = "nvfp4_kv_quantize";
        api::check_defined(input, op, "input");
        api::check_dim(input, {2}, op, "input");
        api::check_dtype_in(input, {DType::kFloat16, DType::kBFloat16}, op, "input");
        api::check_non_empty(input, op, "input");
        FLASHINFER_CHECK(input.stride(1) == 1, op, "input",
                         "the last dimension must be contiguous");
        const int64_t m = input.size(0), k = input.size(1);
        FLASHINFER_CHECK(k % 16 == 0, op, "input", "K dimension (", k, ") must be divisible by 16");
        const Tensor gs = fp32_scales(global_scale, 1, input.device(), op, "global_scale");
        Tensor q = Tensor::empty({m, k / 2}, DType::kUInt8, input.device());
        Tensor sf = Tensor::empty({m, k / 16}, DType::kUInt8, input.device());
        kernels::Nvfp4KvParams p;
        p.values = input.data_ptr();
        p.dtype = input.dtype();
        p.m = m;
        p.k = k;
        p.value_stride_m = input.stride(0);
        p.fp4 = q.data<uint8_t>();
        p.fp4_stride_m = k / 2;
        p.sf = sf.data<uint8_t>();
        p.sf_stride_m = k / 16;
        p.global_scale = input.device().is_cpu() ? gs.data<float>()[0] : 1.0f;
        api::launch(kKvQuantKernels, p, input.device(), op, "input");
        return {q, sf};
      },
      input, global_scale);
}

Tensor nvfp4_kv_dequantize(const Tensor& fp4_data, const Tensor& block_scales,
                           const Tensor& global_scale, DType output_dtype) {
  return call_op<&nvfp4_kv_dequantize>(
      [&] {
        const char* op = "nvfp4_kv_dequantize";
        api::check_defined(fp4_data, op, "fp4_data");
        api::check_dim(fp4_data, {2}, op, "fp4_data");
        api::check_dtype_in(fp4_data, {DType::kUInt8}, op, "fp4_data");
        api::check_non_empty(fp4_data, op, "fp4_data");
        const int64_t m = fp4_data.size(0), k = fp4_data.size(1) * 2;
        FLASHINFER_CHECK(k % 16 == 0, op, "fp4_data", "K dimension (", k,
                         ") must be divisible by 16");
        api::check_defined(block_scales, op, "block_scales");
        api::check_dtype_in(block_scales, {DType::kUInt8, DType::kFloat8E4M3FN}, op,
                            "block_scales");
        api::check_shape_eq(block_scales, {m, k / 16}, op, "block_scales");
        api::check_same_device(block_scales, fp4_data, op, "block_scales", "fp4_data");
        FLASHINFER_CHECK(output_dtype == DType::kBFloat16 || output_dtype == DType::kFloat16, op,
                         "output_dtype", "must be torch.bfloat16 or torch.float16, got ",
                         dtype_torch_name(output_dtype));
        // Upstream accepts the scale on the host or on the data's device.
        FLASHINFER_CHECK(global_scale.defined() && global_scale.numel() == 1, op, "global_scale",
                         "expected a one-element fp32 tensor");
        api::check_dtype_in(global_scale, {DType::kFloat32}, op, "global_scale");
        const Tensor d = fp4_data.contiguous(), s = block_scales.contiguous();
        Tensor out = Tensor::empty({m, k}, output_dtype, fp4_data.device());
        kernels::Nvfp4KvParams p;
        p.values = out.data_ptr();
        p.dtype = output_dtype;
        p.m = m;
        p.k = k;
        p.value_stride_m = k;
        p.fp4 = const_cast<uint8_t*>(static_cast<const uint8_t*>(d.data_ptr()));
        p.fp4_stride_m = k / 2;
        p.sf = const_cast<uint8_t*>(static_cast<const uint8_t*>(s.data_ptr()));
        p.sf_stride_m = k / 16;
        // On the data's device the kernel reads it there (no read back, so a CUDA graph
        // captures the call, as upstream's kernel takes the pointer); a host scale by value.
        const Tensor gsc =
            global_scale.device() == fp4_data.device() ? global_scale.contiguous() : Tensor();
        if (gsc.defined()) {
          p.global_scale_ptr = gsc.data<float>();
        } else {
          p.global_scale = static_cast<float>(global_scale.to(Device::cpu()).item());
        }
        api::launch(kKvDequantKernels, p, fp4_data.device(), op, "fp4_data");
        return out;
      },
      fp4_data, block_scales, global_scale, output_dtype);
}

namespace {

// Bench hooks. The quantizers take fp16/bf16 only (fp32 variants run in bf16). Inputs in
// [-4, 4); global scales 448 * 6 / 4 (NVFP4) so the block scales use e4m3's range.
DType half_dtype(const BenchShape& s) {
  return s.input_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
}
constexpr double kGs = 448.0 * 6.0 / 4.0;

// Groups of m / 4 (at least 1) rows; the last group masked to half its rows.
struct GroupShape {
  int64_t l, m;
};
GroupShape group_shape(const BenchShape& s) { return {4, std::max<int64_t>(1, s.m / 4)}; }
Tensor bench_mask(const GroupShape& g, Device dev) {
  std::vector<int64_t> v(static_cast<size_t>(g.l), g.m);
  v.back() = g.m / 2;
  return api::bench::int32_tensor(v, dev);
}

BenchCase bench_grouped(const BenchShape& s, Device dev, const char* name, bool silu) {
  const GroupShape g = group_shape(s);
  const int64_t k = (s.k + 15) / 16 * 16;
  const DType dt = half_dtype(s);
  const Shape x{g.l, g.m, silu ? 2 * k : k};
  BenchCase c = api::bench::invoke_case(
      name, {Value(api::bench::random_tensor(x, dt, dev, s.random_seed, -4.0, 4.0)),
             Value(bench_mask(g, dev)), Value(Tensor::full({g.l}, kGs, DType::kFloat32).to(dev))});
  const double n = static_cast<double>(g.l * g.m * k);
  c.bytes = api::bench::nbytes(x, dt) + n / 2.0 + n / 16.0;
  return c;
}

BenchCase bench_batched(const BenchShape& s, Device dev) {
  const GroupShape g = group_shape(s);
  const int64_t k = (s.k + 15) / 16 * 16;
  const DType dt = half_dtype(s);
  BenchCase c = api::bench::invoke_case(
      "nvfp4_batched_quantize",
      {Value(api::bench::random_tensor({g.l, g.m, k}, dt, dev, s.random_seed, -4.0, 4.0)),
       Value(Tensor::full({1}, kGs, DType::kFloat32).to(dev))});
  const double n = static_cast<double>(g.l * g.m * k);
  c.bytes = api::bench::nbytes({g.l, g.m, k}, dt) + n / 2.0 + n / 16.0;
  return c;
}

BenchCase bench_silu_nvfp4(const BenchShape& s, Device dev) {
  const int64_t k = (s.k + 15) / 16 * 16;
  const DType dt = half_dtype(s);
  BenchCase c = api::bench::invoke_case(
      "silu_and_mul_nvfp4_quantize",
      {Value(api::bench::random_tensor({s.m, 2 * k}, dt, dev, s.random_seed, -4.0, 4.0)),
       Value(Tensor::full({1}, kGs, DType::kFloat32).to(dev))});
  const double n = static_cast<double>(s.m * k);
  c.bytes = api::bench::nbytes({s.m, 2 * k}, dt) + n / 2.0 + n / 16.0;
  c.flops = 4.0 * n;
  return c;
}

BenchCase bench_mxfp8_grouped(const BenchShape& s, Device dev) {
  const GroupShape g = group_shape(s);
  const int64_t k = (s.k + 31) / 32 * 32;
  const DType dt = half_dtype(s);
  const Shape x{g.l, g.m, k};
  BenchCase c = api::bench::invoke_case(
      "mxfp8_grouped_quantize",
      {Value(api::bench::random_tensor(x, dt, dev, s.random_seed, -4.0, 4.0)),
       Value(bench_mask(g, dev))});
  const double n = static_cast<double>(g.l * g.m * k);
  c.bytes = api::bench::nbytes(x, dt) + n + n / 32.0;
  return c;
}

// Random bytes: packed e2m1 [m, k/2] weights, or uint8 scales.
Tensor nvfp4_random_bytes(const Shape& shape, Device dev, uint64_t seed, double high = 256.0) {
  return api::bench::random_tensor(shape, DType::kFloat32, Device::cpu(), seed, 0.0, high)
      .to(DType::kUInt8)
      .to(dev);
}

BenchCase bench_shuffle_a(const BenchShape& s, Device dev) {
  const int64_t m = (s.m + 31) / 32 * 32, k = std::max<int64_t>(2, s.k / 2);
  BenchCase c = api::bench::invoke_case(
      "shuffle_matrix_a",
      {Value(nvfp4_random_bytes({m, k}, dev, s.random_seed)), Value(int64_t{128})});
  c.bytes = 2.0 * static_cast<double>(m * k);
  return c;
}

BenchCase bench_shuffle_sf_a(const BenchShape& s, Device dev) {
  const int64_t m = (s.m + 127) / 128 * 128, k = std::max<int64_t>(4, (s.k / 16 + 3) / 4 * 4);
  BenchCase c = api::bench::invoke_case(
      "shuffle_matrix_sf_a",
      {Value(nvfp4_random_bytes({m, k}, dev, s.random_seed, 127.0)), Value(int64_t{128})});
  c.bytes = 2.0 * static_cast<double>(m * k);
  return c;
}

BenchCase bench_mxfp4_dequant_host(const BenchShape& s, Device dev) {
  const int64_t k = (s.k + 31) / 32 * 32;
  // ue8m0 scales around 2^0 (codes 120..134) keep the outputs finite and readable.
  Tensor sc = api::bench::random_tensor({s.m, k / 32}, DType::kFloat32, Device::cpu(),
                                        s.random_seed + 1, 120.0, 135.0)
                  .to(DType::kUInt8);
  BenchCase c = api::bench::invoke_case(
      "mxfp4_dequantize_host",
      {Value(nvfp4_random_bytes({s.m, k / 2}, Device::cpu(), s.random_seed)), Value(sc)});
  (void)dev;  // a host op: its inputs are CPU tensors on every device, as upstream's are
  const double n = static_cast<double>(s.m * k);
  c.bytes = n / 2.0 + n / 32.0 + 4.0 * n;
  return c;
}

BenchCase bench_kv_quant(const BenchShape& s, Device dev) {
  const int64_t k = (s.k + 15) / 16 * 16;
  const DType dt = half_dtype(s);
  BenchCase c = api::bench::invoke_case(
      "nvfp4_kv_quantize",
      {Value(api::bench::random_tensor({s.m, k}, dt, dev, s.random_seed, -4.0, 4.0)),
       Value(Tensor::full({1}, 4.0 / (448.0 * 6.0), DType::kFloat32).to(dev))});
  const double n = static_cast<double>(s.m * k);
  c.bytes = api::bench::nbytes({s.m, k}, dt) + n / 2.0 + n / 16.0;
  return c;
}

BenchCase bench_kv_dequant(const BenchShape& s, Device dev) {
  const int64_t k = (s.k + 15) / 16 * 16;
  const DType dt = half_dtype(s);
  BenchCase c = api::bench::invoke_case(
      "nvfp4_kv_dequantize",
      {Value(nvfp4_random_bytes({s.m, k / 2}, dev, s.random_seed)),
       Value(nvfp4_random_bytes({s.m, k / 16}, dev, s.random_seed + 1, 120.0)),
       Value(Tensor::full({1}, 0.5, DType::kFloat32).to(dev)), Value(dt)});
  const double n = static_cast<double>(s.m * k);
  c.bytes = n / 2.0 + n / 16.0 + api::bench::nbytes({s.m, k}, dt);
  return c;
}

}  // namespace

namespace detail {
void register_nvfp4_ops(OpRegistry& r) {
  declare<&silu_and_mul_nvfp4_quantize>(
      r,
      {.name = "silu_and_mul_nvfp4_quantize",
       .module = kNvfp4Fp4Module,
       .summary = "silu(gate) * up, then NVFP4 quantization (fp4_quantize's layouts)"},
      "input", "global_scale", arg("sf_vec_size", 16), arg("is_sf_swizzled_layout", true),
      arg("is_sf_8x4_layout", false), "enable_pdl",
      arg("nvfp4_4over6", nvfp4_4over6_unset()).type("NVFP44Over6Config"));
  declare<&silu_and_mul_scaled_nvfp4_experts_quantize>(
      r,
      {.name = "silu_and_mul_scaled_nvfp4_experts_quantize",
       .module = kActModule,
       .summary = "Masked per-expert silu-and-mul + NVFP4 quantization (grouped GEMM layout)"},
      "a", "mask", "a_global_sf",
      arg("nvfp4_4over6", nvfp4_4over6_unset()).type("NVFP44Over6Config"));
  declare<&scaled_fp4_grouped_quantize>(
      r,
      {.name = "scaled_fp4_grouped_quantize",
       .module = kNvfp4Fp4Module,
       .summary = "Masked per-group NVFP4 quantization (grouped GEMM layout)"},
      "a", "mask", "a_global_sf",
      arg("nvfp4_4over6", nvfp4_4over6_unset()).type("NVFP44Over6Config"));
  declare<&nvfp4_batched_quantize>(
      r,
      {.name = "nvfp4_batched_quantize",
       .module = kNvfp4Fp4Module,
       .summary = "Batched NVFP4 quantization, 128x4 scales per batch"},
      "a", "a_global_sf", arg("sf_vec_size", 16),
      arg("nvfp4_4over6", nvfp4_4over6_unset()).type("NVFP44Over6Config"));
  declare<&mxfp8_grouped_quantize>(
      r,
      {.name = "mxfp8_grouped_quantize",
       .module = kNvfp4Fp8Module,
       .summary = "Masked per-group MXFP8 quantization (grouped GEMM layout)"},
      "a", "mask");
  declare<&shuffle_matrix_a>(r,
                             {.name = "shuffle_matrix_a",
                              .module = kNvfp4Fp4Module,
                              .summary = "trtllm-gen shuffleMatrixA row permutation"},
                             "input_tensor", "epilogue_tile_m");
  declare<&shuffle_matrix_sf_a>(
      r,
      {.name = "shuffle_matrix_sf_a",
       .module = kNvfp4Fp4Module,
       .summary = "shuffleMatrixA rows of linear scales, then the 128x4 interleave"},
      "input_tensor", "epilogue_tile_m", arg("num_elts_per_sf", 16));
  declare<&mxfp4_dequantize_host>(r,
                                  {.name = "mxfp4_dequantize_host",
                                   .module = kNvfp4Fp4Module,
                                   .summary = "MXFP4 (linear ue8m0 scales) to fp32 on the host"},
                                  "weight", "scale", arg("group_size", 32));
  declare<&nvfp4_kv_quantize>(r,
                              {.name = "nvfp4_kv_quantize",
                               .module = kNvfp4Fp4Module,
                               .summary = "NVFP4 KV-cache quantization, linear e4m3 block scales"},
                              "input", "global_scale");
  declare<&nvfp4_kv_dequantize>(r,
                                {.name = "nvfp4_kv_dequantize",
                                 .module = kNvfp4Fp4Module,
                                 .summary = "NVFP4 KV-cache dequantization to bf16/fp16"},
                                "fp4_data", "block_scales", "global_scale",
                                arg("output_dtype", DType::kBFloat16));

  api::register_backends("silu_and_mul_nvfp4_quantize", kSiluMulKernels);
  for (const char* op : {"silu_and_mul_scaled_nvfp4_experts_quantize",
                         "scaled_fp4_grouped_quantize", "mxfp8_grouped_quantize"}) {
    api::register_backends(op, kGroupedKernels);
  }
  api::register_backends("nvfp4_batched_quantize", kBatchedKernels);
  api::register_backends("shuffle_matrix_a", kGatherKernels);
  api::register_backends("shuffle_matrix_sf_a", kGatherKernels);
  api::register_backends("mxfp4_dequantize_host", kHostDequantKernels);
  api::register_backends("nvfp4_kv_quantize", kKvQuantKernels);
  api::register_backends("nvfp4_kv_dequantize", kKvDequantKernels);

  register_bench_hook("silu_and_mul_nvfp4_quantize", bench_silu_nvfp4);
  register_bench_hook(
      "silu_and_mul_scaled_nvfp4_experts_quantize", [](const BenchShape& s, Device d) {
        return bench_grouped(s, d, "silu_and_mul_scaled_nvfp4_experts_quantize", true);
      });
  register_bench_hook("scaled_fp4_grouped_quantize", [](const BenchShape& s, Device d) {
    return bench_grouped(s, d, "scaled_fp4_grouped_quantize", false);
  });
  register_bench_hook("nvfp4_batched_quantize", bench_batched);
  register_bench_hook("mxfp8_grouped_quantize", bench_mxfp8_grouped);
  register_bench_hook("shuffle_matrix_a", bench_shuffle_a);
  register_bench_hook("shuffle_matrix_sf_a", bench_shuffle_sf_a);
  register_bench_hook("mxfp4_dequantize_host", bench_mxfp4_dequant_host);
  register_bench_hook("nvfp4_kv_quantize", bench_kv_quant);
  register_bench_hook("nvfp4_kv_dequantize", bench_kv_dequant);
}
}  // namespace detail

}  // namespace flashinfer
