// Public state merges (flashinfer.cascade): declarations, checks, dispatch.
#include "flashinfer/ops/cascade.h"

#include "api/bench_support.h"
#include "api/checks.h"
#include "api/kernel_table.h"
#include "flashinfer/op_typed.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/attention_cpu.h"
#if FLASHINFER_WITH_CUDA
#include "kernels/cuda/cascade_cuda.h"
#endif

namespace flashinfer {
namespace {

constexpr const char* kCascadeModule = "flashinfer.cascade";

// The backends of the state-merge kernel, shared by the three ops (src/api/kernel_table.h).
constexpr api::KernelEntry<kernels::MergeParams> kMergeKernels[] = {
    {DeviceType::kCPU, "CPU reference: fp32 weights 2^(s - max), OpenMP over (row, head)", nullptr,
     [](const kernels::MergeParams& p, const api::LaunchContext&) {
       kernels::cpu::merge_states(p);
     }},
#if FLASHINFER_WITH_CUDA
    {DeviceType::kCUDA, "CUDA kernel: one block per (row, head)", nullptr,
     [](const kernels::MergeParams& p, const api::LaunchContext& c) {
       kernels::cuda::merge_states(p, c.stream);
     }},
#endif
};

// An LSE tensor as upstream's Python passes it on: `s.to(torch.float32)` (a copy unless fp32).
Tensor lse_fp32(const Tensor& s, const char* op, const char* arg) {
  api::check_dtype_in(s, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, arg);
  return s.to(DType::kFloat32);
}

// v [seq, H, D] with s [seq, H] (fp32, or fp16 / bf16 widened) on v's device.
void check_state(const Tensor& v, const Tensor& s, const char* op, const char* v_arg,
                 const char* s_arg) {
  api::check_defined(v, op, v_arg);
  api::check_defined(s, op, s_arg);
  api::check_dim(v, {3}, op, v_arg);
  api::check_dtype_in(v, {DType::kFloat16, DType::kBFloat16, DType::kFloat32}, op, v_arg);
  FLASHINFER_CHECK(v.stride(2) == 1, op, v_arg, "the head_dim axis must be contiguous");
  api::check_dim(s, {2}, op, s_arg);
  api::check_dtype_in(s, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, op, s_arg);
  api::check_shape_eq(s, {v.size(0), v.size(1)}, op, s_arg);
  api::check_same_device(s, v, op, s_arg, v_arg);
}

// Errors name "v" as the argument that decides the device, whatever the op calls its states.
void dispatch(const kernels::MergeParams& p, Device device, const char* op) {
  if (p.seq * p.num_heads == 0) return;
  api::launch(kMergeKernels, p, device, op, "v");
}

// Binary merge of (v_a, s_a) and (v_b, s_b) into (v_out, s_out). 16-bit LSEs are widened to
// fp32 copies first, as upstream's Python does; in place, the merged LSE then goes to that copy
// and the caller's 16-bit s keeps its values (upstream's behaviour).
void merge_two(const Tensor& v_a, const Tensor& s_a_in, const Tensor& v_b, const Tensor& s_b_in,
               const Tensor& v_out, const Tensor& s_out_in, const std::optional<Tensor>& mask,
               const char* op, const char* names[4]) {
  check_state(v_a, s_a_in, op, names[0], names[1]);
  const Tensor s_a = lse_fp32(s_a_in, op, names[1]);
  const Tensor s_out = s_out_in.data_ptr() == s_a_in.data_ptr() ? s_a : s_out_in;
  api::check_defined(v_b, op, names[2]);
  api::check_shape_eq(v_b, v_a.shape(), op, names[2]);
  api::check_same_dtype(v_b, v_a, op, names[2], names[0]);
  api::check_same_device(v_b, v_a, op, names[2], names[0]);
  check_state(v_b, s_b_in, op, names[2], names[3]);
  const Tensor s_b = lse_fp32(s_b_in, op, names[3]);
  Tensor mask_c;
  if (mask) {
    api::check_defined(*mask, op, "mask");
    FLASHINFER_CHECK(mask->dtype() == DType::kBool, op, "mask", "must be torch.bool");
    api::check_shape_eq(*mask, {v_a.size(0)}, op, "mask");
    api::check_same_device(*mask, v_a, op, "mask", names[0]);
    mask_c = mask->contiguous();
  }
  kernels::MergeParams p;
  p.v = v_a.data_ptr();
  p.s = s_a.data<const float>();
  p.v_dtype = v_a.dtype();
  p.v_stride_n = v_a.stride(0);
  p.v_stride_h = v_a.stride(1);
  p.s_stride_n = s_a.stride(0);
  p.s_stride_h = s_a.stride(1);
  p.v_b = v_b.data_ptr();
  p.s_b = s_b.data<const float>();
  p.vb_stride_n = v_b.stride(0);
  p.vb_stride_h = v_b.stride(1);
  p.sb_stride_n = s_b.stride(0);
  p.sb_stride_h = s_b.stride(1);
  p.v_out = v_out.data_ptr();
  p.s_out = s_out.data<float>();
  p.vo_stride_n = v_out.stride(0);
  p.vo_stride_h = v_out.stride(1);
  p.so_stride_n = s_out.stride(0);
  p.so_stride_h = s_out.stride(1);
  p.mask = mask_c.defined() ? mask_c.data<const uint8_t>() : nullptr;
  p.seq = v_a.size(0);
  p.num_states = 2;
  p.num_heads = v_a.size(1);
  p.head_dim = v_a.size(2);
  dispatch(p, v_a.device(), op);
}

}  // namespace

std::tuple<Tensor, Tensor> merge_state(const Tensor& v_a, const Tensor& s_a, const Tensor& v_b,
                                       const Tensor& s_b) {
  return call_op<&merge_state>(
      [&]() -> std::tuple<Tensor, Tensor> {
        static const char* names[4] = {"v_a", "s_a", "v_b", "s_b"};
        api::check_defined(v_a, "merge_state", "v_a");
        api::check_defined(s_a, "merge_state", "s_a");
        Tensor v = Tensor::empty(v_a.shape(), v_a.dtype(), v_a.device());
        Tensor s = Tensor::empty(s_a.shape(), DType::kFloat32, v_a.device());
        merge_two(v_a, s_a, v_b, s_b, v, s, std::nullopt, "merge_state", names);
        return {v, s};
      },
      v_a, s_a, v_b, s_b);
}

void merge_state_in_place(const Tensor& v, const Tensor& s, const Tensor& v_other,
                          const Tensor& s_other, std::optional<Tensor> mask) {
  call_op<&merge_state_in_place>(
      [&] {
        static const char* names[4] = {"v", "s", "v_other", "s_other"};
        merge_two(v, s, v_other, s_other, v, s, mask, "merge_state_in_place", names);
      },
      v, s, v_other, s_other, mask);
}

std::tuple<Tensor, Tensor> merge_states(const Tensor& v, const Tensor& s_in) {
  return call_op<&merge_states>(
      [&]() -> std::tuple<Tensor, Tensor> {
        const char* op = "merge_states";
        api::check_defined(v, op, "v");
        api::check_defined(s_in, op, "s");
        api::check_dim(v, {4}, op, "v");
        api::check_dtype_in(v, {DType::kFloat16, DType::kBFloat16, DType::kFloat32}, op, "v");
        FLASHINFER_CHECK(v.stride(3) == 1, op, "v", "the head_dim axis must be contiguous");
        api::check_dim(s_in, {3}, op, "s");
        const Tensor s = lse_fp32(s_in, op, "s");
        api::check_shape_eq(s, {v.size(0), v.size(1), v.size(2)}, op, "s");
        api::check_same_device(s, v, op, "s", "v");
        Tensor vo = Tensor::empty({v.size(0), v.size(2), v.size(3)}, v.dtype(), v.device());
        Tensor so = Tensor::empty({v.size(0), v.size(2)}, DType::kFloat32, v.device());
        kernels::MergeParams p;
        p.v = v.data_ptr();
        p.s = s.data<const float>();
        p.v_dtype = v.dtype();
        p.v_stride_n = v.stride(0);
        p.v_stride_k = v.stride(1);
        p.v_stride_h = v.stride(2);
        p.s_stride_n = s.stride(0);
        p.s_stride_k = s.stride(1);
        p.s_stride_h = s.stride(2);
        p.v_out = vo.data_ptr();
        p.s_out = so.data<float>();
        p.vo_stride_n = vo.stride(0);
        p.vo_stride_h = vo.stride(1);
        p.so_stride_n = so.stride(0);
        p.so_stride_h = so.stride(1);
        p.seq = v.size(0);
        p.num_states = v.size(1);
        p.num_heads = v.size(2);
        p.head_dim = v.size(3);
        dispatch(p, v.device(), op);
        return {vo, so};
      },
      v, s_in);
}

namespace {

// Bench hooks: batch_size * s_qo query rows, num_qo_heads heads, head_dim_vo, partial outputs
// in q_dtype with fp32 LSEs. Bytes: every state read once, the merged state written once.
// FLOPs: counted as 0 (a few per element: exp2, scale, add).
struct BenchStates {
  Tensor v, s;
};

BenchStates bench_states(const BenchShape& sh, Device dev, int64_t states, uint64_t seed) {
  const int64_t rows = sh.batch_size * sh.s_qo;
  Shape vs{rows, sh.num_qo_heads, sh.head_dim_vo}, ss{rows, sh.num_qo_heads};
  if (states > 0) {  // merge_states' stacked layout [rows, states, heads, ...]
    vs.insert(vs.begin() + 1, states);
    ss.insert(ss.begin() + 1, states);
  }
  return {api::bench::random_tensor(vs, sh.q_dtype, dev, seed),
          api::bench::random_tensor(ss, DType::kFloat32, dev, seed + 1, -4.0, 4.0)};
}

double state_bytes(const BenchShape& sh, int64_t states) {
  const int64_t rows = sh.batch_size * sh.s_qo;
  return static_cast<double>(states) *
         (api::bench::nbytes({rows, sh.num_qo_heads, sh.head_dim_vo}, sh.q_dtype) +
          api::bench::nbytes({rows, sh.num_qo_heads}, DType::kFloat32));
}

BenchCase bench_merge_state(const BenchShape& sh, Device dev, const char* name) {
  const BenchStates a = bench_states(sh, dev, 0, sh.random_seed);
  const BenchStates b = bench_states(sh, dev, 0, sh.random_seed + 2);
  BenchCase c = api::bench::invoke_case(name, {Value(a.v), Value(a.s), Value(b.v), Value(b.s)});
  c.bytes = state_bytes(sh, 3);  // two read, one written (in place: written over the first)
  return c;
}

BenchCase bench_merge_states(const BenchShape& sh, Device dev) {
  constexpr int64_t kStates = 4;
  const BenchStates x = bench_states(sh, dev, kStates, sh.random_seed);
  BenchCase c = api::bench::invoke_case("merge_states", {Value(x.v), Value(x.s)});
  c.bytes = state_bytes(sh, kStates + 1);
  return c;
}

}  // namespace

namespace detail {
void register_cascade_ops(OpRegistry& r) {
  declare<&merge_state>(
      r,
      {.name = "merge_state",
       .module = kCascadeModule,
       .summary = "Merges two attention states (output, base-2 LSE) over disjoint key sets"},
      "v_a", "s_a", "v_b", "s_b");
  declare<&merge_state_in_place>(
      r,
      {.name = "merge_state_in_place",
       .module = kCascadeModule,
       .summary = "Merges (v_other, s_other) into (v, s) in place, rows with mask false skipped"},
      arg("v").mut(), arg("s").mut(), "v_other", "s_other", "mask");
  declare<&merge_states>(r,
                         {.name = "merge_states",
                          .module = kCascadeModule,
                          .summary = "Merges num_states attention states per row and head"},
                         "v", "s");
  for (const char* name : {"merge_state", "merge_state_in_place", "merge_states"}) {
    api::register_backends(name, kMergeKernels);
  }
  register_bench_hook("merge_state", [](const BenchShape& s, Device d) {
    return bench_merge_state(s, d, "merge_state");
  });
  register_bench_hook("merge_state_in_place", [](const BenchShape& s, Device d) {
    return bench_merge_state(s, d, "merge_state_in_place");
  });
  register_bench_hook("merge_states", bench_merge_states);
}
}  // namespace detail

}  // namespace flashinfer
