// Upstream-style `backend=` tables of the GEMM and quantization ops and the queries over them.
// Which names run on CUDA is this file's knowledge (cuBLASLt serves "cublas", "cudnn" and
// "auto"); whether the op runs on CUDA at all is its kernel table's (src/api/kernel_table.h):
// an op offers its CUDA backend names only when its table has a CUDA entry in this build, and a
// name without its own description is described by that entry.
#include "flashinfer/ops/backends.h"

#include <algorithm>
#include <map>

#include "api/backends.h"
#include "api/device_props.h"
#include "flashinfer/error.h"
#include "flashinfer/ops/upstream_arch.h"

namespace flashinfer {
namespace {

// Upstream's @supported_compute_capability list of one backend of an op, for every backend of
// the GEMM ops in this table (flashinfer-python 0.6.18: gemm/gemm_base.py, gemm/gemm_bf16_fp4.py,
// gemm/gemm_svdquant.py, gemm/gemm_mm_mxfp8_cute_dsl.py; mm_fp8 from its kernel module). "auto"
// runs where one of the op's backends does (upstream's suitable_auto_backends asks each backend's
// list), so its list is their union. Facts with file:line: docs/CONFORMANCE.md, "Ops upstream
// runs only on some GPUs". The grouped_mm_* ops are not listed here.
const std::vector<int>* upstream_backend_ccs(std::string_view op, std::string_view backend) {
  using Key = std::pair<std::string_view, std::string_view>;
  using Ccs = std::vector<int>;
  static const Ccs kSm80Up = {80, 86, 87, 89, 90, 100, 103, 110, 120, 121};
  static const Ccs kSm80UpAuto = {80, 86, 87, 89, 90, 100, 103, 107, 110, 120, 121};
  static const Ccs kSm89Up = {89, 90, 100, 103, 107, 110, 120, 121};
  static const Ccs kSm90Up = {90, 100, 103, 110, 120, 121};
  static const Ccs kSm100 = {100, 103};
  static const Ccs kSm100Rubin = {100, 103, 107};
  static const Ccs kSm100Family = {100, 103, 110, 120, 121};
  static const Ccs kBlackwellAll = {100, 103, 107, 110, 120, 121};
  static const Ccs kSm100Sm120 = {100, 103, 107, 120, 121};
  static const Ccs kSm12x = {120, 121};
  static const Ccs kSm100Sm12x = {100, 103, 120, 121};
  static const Ccs kRubin = {107};
  static const auto* m = new std::map<Key, const Ccs*>{
      // mm_bf16 (gemm_base.py:598): cudnn and cublaslt [80 .. 121] without 107, cutlass [100,
      // 103, 107], tgv and cute-dsl [100, 103], cutile and tinygemm [90 .. 121] without 107.
      {{"mm_bf16", "cudnn"}, &kSm80Up},
      {{"mm_bf16", "cublaslt"}, &kSm80Up},
      {{"mm_bf16", "cutlass"}, &kSm100Rubin},
      {{"mm_bf16", "tgv"}, &kSm100},
      {{"mm_bf16", "cute-dsl"}, &kSm100},
      {{"mm_bf16", "cutile"}, &kSm90Up},
      {{"mm_bf16", "tinygemm"}, &kSm90Up},
      {{"mm_bf16", "auto"}, &kSm80UpAuto},
      // bmm_bf16 (gemm_base.py:882): cudnn [80 .. 121] without 107, cutlass [100, 103, 107],
      // cutile [90 .. 121] without 107, tgv [100, 103].
      {{"bmm_bf16", "cudnn"}, &kSm80Up},
      {{"bmm_bf16", "cutlass"}, &kSm100Rubin},
      {{"bmm_bf16", "cutile"}, &kSm90Up},
      {{"bmm_bf16", "tgv"}, &kSm100},
      {{"bmm_bf16", "auto"}, &kSm80UpAuto},
      // bmm_fp8 (gemm_base.py:7404): cudnn and cublas [89 .. 121], cutlass [100 .. 121],
      // cute-dsl [107] (its common check's [100, 103, 107] is not consulted for an op with
      // backends).
      {{"bmm_fp8", "cudnn"}, &kSm89Up},
      {{"bmm_fp8", "cublas"}, &kSm89Up},
      {{"bmm_fp8", "cutlass"}, &kBlackwellAll},
      {{"bmm_fp8", "cute-dsl"}, &kRubin},
      {{"bmm_fp8", "auto"}, &kSm89Up},
      // mm_fp4 (gemm_base.py:7068): cudnn and cutlass [100 .. 121], trtllm and cute-dsl [100,
      // 103, 107], b12x [120, 121].
      {{"mm_fp4", "cudnn"}, &kBlackwellAll},
      {{"mm_fp4", "cutlass"}, &kBlackwellAll},
      {{"mm_fp4", "trtllm"}, &kSm100Rubin},
      {{"mm_fp4", "cute-dsl"}, &kSm100Rubin},
      {{"mm_fp4", "b12x"}, &kSm12x},
      {{"mm_fp4", "auto"}, &kBlackwellAll},
      // mm_fp8: no decorator; its one backend is the trtllm-gen kernel module built for SM100
      // (trtllm_low_latency_gemm.py; later versions refuse every major but 10).
      {{"mm_fp8", "trtllm_low_latency"}, &kSm100Rubin},
      // gemm_fp8_nt_groupwise (gemm_base.py:7608): cutlass [100, 103, 107, 120, 121], trtllm
      // [100, 103, 107], cutile [100, 103, 110, 120, 121]. No Hopper.
      {{"gemm_fp8_nt_groupwise", "cutlass"}, &kSm100Sm120},
      {{"gemm_fp8_nt_groupwise", "trtllm"}, &kSm100Rubin},
      {{"gemm_fp8_nt_groupwise", "cutile"}, &kSm100Family},
      // mm_mxfp8 (gemm_base.py:5567): cutlass [100 .. 121], trtllm and cute-dsl [100, 103,
      // 107], cudnn [100, 103, 110, 120, 121], b12x [120, 121]. No Hopper.
      {{"mm_mxfp8", "cutlass"}, &kBlackwellAll},
      {{"mm_mxfp8", "trtllm"}, &kSm100Rubin},
      {{"mm_mxfp8", "cute-dsl"}, &kSm100Rubin},
      {{"mm_mxfp8", "cudnn"}, &kSm100Family},
      {{"mm_mxfp8", "b12x"}, &kSm12x},
      {{"mm_mxfp8", "auto"}, &kBlackwellAll},
      // bmm_mxfp8 (gemm_base.py:9749): cudnn [100 .. 121], cutlass [120, 121].
      {{"bmm_mxfp8", "cudnn"}, &kBlackwellAll},
      {{"bmm_mxfp8", "cutlass"}, &kSm12x},
      {{"bmm_mxfp8", "auto"}, &kBlackwellAll},
      // mm_bf16_fp4 (gemm_bf16_fp4.py:207): cudnn and cute-dsl [100, 103, 110, 120, 121].
      {{"mm_bf16_fp4", "cudnn"}, &kSm100Family},
      {{"mm_bf16_fp4", "cute-dsl"}, &kSm100Family},
      // mm_nvfp4_svdquant (gemm_svdquant.py:196) and nvfp4_quantize_smooth (302): cutlass [100,
      // 103, 107] (the one checker, 145; both run the SM100 CUTLASS SVDQuant module).
      {{"mm_nvfp4_svdquant", "cutlass"}, &kSm100Rubin},
      {{"nvfp4_quantize_smooth", "cutlass"}, &kSm100Rubin},
      // prepare_bf16_fp4_weights (gemm_bf16_fp4.py:130): no decorator; its cute-dsl layout
      // (gemm_bf16_fp4_cute_dsl.py:448) is made for (10, 0), (10, 3) and major 12 only, other
      // GPUs get a NotImplementedError (upstream_backend_refusal). Its cudnn layout is torch
      // indexing, any GPU.
      {{"prepare_bf16_fp4_weights", "cute-dsl"}, &kSm100Sm12x},
      // top_k_varlen (topk_varlen/topk_varlen.py:65-76, 975): radix_cutlass on every GPU
      // (_ALL_CCS), radix (CuTe DSL) on Blackwell and later, gvr on B200-class only; auto is
      // their union.
      {{"top_k_varlen", "radix"}, &kBlackwellAll},
      {{"top_k_varlen", "gvr"}, &kSm100},
  };
  auto it = m->find(Key{op, backend});
  return it == m->end() ? nullptr : it->second;
}

bool in_list(const std::vector<int>& ccs, int cc) {
  return std::find(ccs.begin(), ccs.end(), cc) != ccs.end();
}

std::string cc_list(const std::vector<int>& ccs) {
  std::string s;
  for (int cc : ccs) s += (s.empty() ? "" : ", ") + std::to_string(cc);
  return s;
}

BackendRequirement make(std::string op, std::string def, std::vector<std::string> upstream,
                        std::vector<BackendInfo> available) {
  BackendRequirement r;
  r.op = std::move(op);
  r.default_backend = std::move(def);
  r.upstream_backends = std::move(upstream);
  if (!op_has_backend(r.op, DeviceType::kCUDA)) return r;
  r.available = std::move(available);
  for (BackendInfo& b : r.available) {
    if (!b.implementation.empty()) continue;
    for (const auto& [device, impl] : op_backend_implementations(r.op)) {
      if (device == "cuda") b.implementation = impl;
    }
  }
  return r;
}

const std::map<std::string, BackendRequirement, std::less<>>& table() {
  static const auto* t = [] {
    auto* m = new std::map<std::string, BackendRequirement, std::less<>>();
    // This build has no CUTLASS, TGV or trtllm-gen kernels. "cudnn" of the bf16 GEMMs and
    // bmm_fp8 runs cuDNN graphs (kernels/cuda/gemm_cudnn.cpp) in a build with cuDNN. The bf16
    // GEMMs' default backend is "cudnn": without cuDNN in the build, where libcudnn.so.9 cannot
    // be opened, or for a problem cuDNN has no plan for, cuBLASLt serves it so that default calls
    // run (the description says which). bmm_fp8's default is "cublas", so its "cudnn" is offered
    // only with cuDNN and is refused by name otherwise. "auto" stays cuBLASLt.
    const std::string lt = "cuBLASLt";
#if FLASHINFER_WITH_CUDNN
    const std::string dnn_bf16 =
        "cuDNN graph: matmul (fp32 compute) + bias add; cuBLASLt where libcudnn.so.9 cannot be "
        "opened or cuDNN has no execution plan for the problem";
#else
    const std::string dnn_bf16 = "cuBLASLt (no cuDNN in this build; serves the default)";
#endif
    // Upstream 0.6.18's names (vLLM's FlashInfer bf16 linear passes "cute-dsl"): those it runs on
    // Hopper (mm_bf16's cublaslt, cutile and tinygemm, bmm_bf16's cutile) run cuBLASLt here, the
    // Blackwell-only ones (cutlass, tgv, cute-dsl) the CPU reference (a CUDA call is refused by
    // name, upstream_backend_ccs).
    m->emplace("mm_bf16", make("mm_bf16", "cudnn",
                               {"cudnn", "cublaslt", "cutlass", "tgv", "cute-dsl", "cutile",
                                "tinygemm", "auto"},
                               {{"cudnn", 80, dnn_bf16},
                                {"cublaslt", 80, lt},
                                {"cutile", 90, lt},
                                {"tinygemm", 90, lt},
                                {"auto", 80, lt}}));
    m->emplace("bmm_bf16", make("bmm_bf16", "cudnn", {"cudnn", "cutlass", "cutile", "tgv", "auto"},
                                {{"cudnn", 80, dnn_bf16}, {"cutile", 90, lt}, {"auto", 80, lt}}));
    // FP8 matmuls need sm89+ in cuBLASLt and in cuDNN.
    std::vector<BackendInfo> fp8 = {{"cublas", 89, lt}, {"auto", 89, lt}};
#if FLASHINFER_WITH_CUDNN
    fp8.insert(fp8.begin(),
               {"cudnn", 89, "cuDNN graph: fp8 matmul (fp32 compute) x A_scale x B_scale"});
#endif
    m->emplace("bmm_fp8",
               make("bmm_fp8", "cublas", {"cudnn", "cublas", "cutlass", "cute-dsl", "auto"}, fp8));
    // No FP4 tensor cores below sm100: tiles are dequantized to bf16 and multiplied by cuBLASLt.
    // (An empty description: the op's CUDA kernel-table entry describes it.)
    m->emplace("mm_fp4",
               make("mm_fp4", "auto", {"cudnn", "trtllm", "cutlass", "cute-dsl", "b12x", "auto"},
                    {{"auto", 80, ""}}));
    // top_k_varlen: every backend name runs this build's top-k kernel (the same selection);
    // upstream_backend_ccs refuses radix / gvr where upstream does.
    m->emplace(
        "top_k_varlen",
        make("top_k_varlen", "auto", {"auto", "radix", "gvr", "radix_cutlass"},
             {{"auto", 80, ""}, {"radix", 80, ""}, {"gvr", 80, ""}, {"radix_cutlass", 80, ""}}));
    for (const char* op : {"fp4_quantize", "nvfp4_quantize", "mxfp4_quantize", "mxfp8_quantize"}) {
      // "cute-dsl": upstream's CuTe-DSL semantics (2-D outputs; docs/GEMM_AND_QUANTIZATION.md) on
      // this build's quantizer kernels. "auto": upstream 0.7.4's default (its "cuda" kernel).
      m->emplace(op, make(op, "auto", {"cuda", "cute-dsl", "auto"},
                          {{"cuda", 80, ""}, {"cute-dsl", 80, ""}, {"auto", 80, ""}}));
    }
    // The block-scaled, MX and low-latency FP8 GEMMs: this build's tiled CUDA kernel (fp32 math,
    // no fp8 tensor cores, so sm80+) serves each op's default backend name only; mm_fp8 goes
    // through cuBLASLt where its shape allows. Upstream runs all of them on Blackwell only
    // (upstream_backend_ccs), so that is where they run here.
    const std::string tiled = "tiled CUDA kernel of this build (serves the default)";
    m->emplace("gemm_fp8_nt_groupwise",
               make("gemm_fp8_nt_groupwise", "cutlass", {"cutlass", "trtllm", "cutile"},
                    {{"cutlass", 80, tiled}}));
    m->emplace("mm_fp8", make("mm_fp8", "trtllm_low_latency", {"trtllm_low_latency"},
                              {{"trtllm_low_latency", 80,
                                "cuBLASLt FP8 GEMM where the shape allows (sm89+; the prepared "
                                "weight un-shuffled into scratch), else the tiled CUDA kernel "
                                "(serves the default)"}}));
    m->emplace("mm_mxfp8",
               make("mm_mxfp8", "auto", {"cutlass", "cute-dsl", "trtllm", "cudnn", "b12x", "auto"},
                    {{"auto", 80, tiled}}));
    m->emplace("bmm_mxfp8",
               make("bmm_mxfp8", "auto", {"cudnn", "cutlass", "auto"}, {{"auto", 80, tiled}}));
    // bf16 x fp4, `backend` has no default: mm_bf16_fp4 is a CPU reference only (no CUDA kernel
    // table entry); prepare_bf16_fp4_weights's cudnn layout has a CUDA kernel, any GPU (upstream's
    // is torch indexing), its cute-dsl layout none.
    m->emplace("prepare_bf16_fp4_weights",
               make("prepare_bf16_fp4_weights", "", {"cudnn", "cute-dsl"}, {{"cudnn", 0, ""}}));
    m->emplace("mm_bf16_fp4", make("mm_bf16_fp4", "", {"cudnn", "cute-dsl"}, {}));
    // SVDQuant: CPU reference only; upstream's one backend name.
    for (const char* op : {"mm_nvfp4_svdquant", "nvfp4_quantize_smooth"}) {
      m->emplace(op, make(op, "cutlass", {"cutlass"}, {}));
    }
    // The grouped GEMMs (cuDNN's MoE grouped matmul upstream): grouped_mm_bf16 and grouped_mm_fp8
    // run this build's grouped tensor-core kernel under the name "cudnn" (upstream's
    // @supported_compute_capability: sm80+ for bf16, sm89+ for fp8); the mxfp8/fp4 variants have
    // no CUDA kernel here (make() then offers no backend: is_backend_supported says false).
    const std::string grouped = "grouped CUDA kernel of this build (serves the default)";
#if FLASHINFER_WITH_CUDNN
    // grouped_mm_bf16 runs cuDNN's MoE grouped matmul graph where the call fits.
    const std::string grouped_bf16 =
        "cuDNN MoE grouped matmul graph where the call fits (bf16 out, unit k strides, 16-byte "
        "aligned rows); else the grouped CUDA kernel of this build";
#else
    const std::string& grouped_bf16 = grouped;
#endif
    m->emplace("grouped_mm_bf16",
               make("grouped_mm_bf16", "cudnn", {"cudnn"}, {{"cudnn", 80, grouped_bf16}}));
    m->emplace("grouped_mm_fp8",
               make("grouped_mm_fp8", "cudnn", {"cudnn"}, {{"cudnn", 89, grouped}}));
    m->emplace("grouped_mm_mxfp8",
               make("grouped_mm_mxfp8", "cudnn", {"cudnn"}, {{"cudnn", 100, ""}}));
    m->emplace("grouped_mm_fp4", make("grouped_mm_fp4", "cudnn", {"cudnn"}, {{"cudnn", 100, ""}}));
    return m;
  }();
  return *t;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + ("'" + x + "'");
  return s.empty() ? "none" : s;
}

}  // namespace

const BackendInfo* BackendRequirement::find(std::string_view backend) const {
  for (const auto& b : available) {
    if (b.name == backend) return &b;
  }
  return nullptr;
}

bool BackendRequirement::is_known_backend(std::string_view backend) const {
  return std::find(upstream_backends.begin(), upstream_backends.end(), backend) !=
         upstream_backends.end();
}

bool BackendRequirement::is_backend_supported(std::string_view backend,
                                              std::optional<int> cc) const {
  const BackendInfo* b = find(backend);
  if (!b) return false;
  if (!cc) return true;
  // This build's floor, then upstream's own list for the backend where it has one.
  const std::vector<int>* upstream = upstream_backend_ccs(op, backend);
  return *cc >= b->min_cc && (!upstream || in_list(*upstream, *cc));
}

bool BackendRequirement::is_compute_capability_supported(int cc) const {
  return std::any_of(available.begin(), available.end(),
                     [&](const BackendInfo& b) { return is_backend_supported(b.name, cc); });
}

std::vector<std::string> BackendRequirement::supported_backends(std::optional<int> cc) const {
  std::vector<std::string> out;
  for (const auto& name : upstream_backends) {
    if (is_backend_supported(name, cc)) out.push_back(name);
  }
  return out;
}

const BackendRequirement& backend_requirement(std::string_view op) {
  const auto& t = table();
  auto it = t.find(op);
  FLASHINFER_CHECK(it != t.end(), "backend_requirement", "op", "'", op,
                   "' has no backend table (ops with one: ", join(ops_with_backend_requirement()),
                   ")");
  return it->second;
}

std::vector<std::string> ops_with_backend_requirement() {
  std::vector<std::string> out;
  for (const auto& [name, req] : table()) out.push_back(name);
  return out;
}

// ---- upstream's architecture rules ----------------------------------------------------------

namespace {

// One rule per op; the facts are quoted in docs/CONFORMANCE.md ("Ops upstream runs only on some
// GPUs"). The refusal reads "{op} does not support compute capability {cc}", upstream's
// BackendSupportedError for a @backend_requirement function with no backend choices (the same
// wording where upstream's decorator or module gate has no text of its own), except where
// upstream raises its own ValueError text (grouped_gemm_nt_masked, tgv_gemm_sm100,
// fp8_blockscale_gemm_sm90), or where the refusal is an op upstream calls first (svdquant_linear:
// nvfp4_quantize_smooth's).
struct Rule {
  UpstreamArchRule rule;
  bool masked_gemm_text = false;             // grouped_gemm_nt_masked's own ValueError text
  const char* own_text = nullptr;            // upstream's own fixed error text, where it has one
  const char* refused_by = nullptr;          // the op whose backend refusal upstream raises
  const char* refused_by_backend = nullptr;  // and the backend it calls that op with
  const char* major_text = nullptr;          // upstream's text, then "SM{major}0"
};

const std::map<std::string, Rule, std::less<>>& rules() {
  static const auto* m = [] {
    auto* r = new std::map<std::string, Rule, std::less<>>();
    auto add = [&](const char* op, std::vector<int> ccs, const char* fact, bool masked = false,
                   const char* own_text = nullptr) {
      r->emplace(
          op, Rule{UpstreamArchRule{op, std::move(ccs), fact}, masked, own_text, nullptr, nullptr});
    };
    const std::vector<int> sm12x = {120, 121};
    const std::vector<int> sm100 = {100, 103};
    add("b12x_fused_moe", sm12x,
        "fused_moe/cute_dsl/b12x_moe.py: @supported_compute_capability([120, 121]) on "
        "b12x_fused_moe (\"Run fused MoE on SM120/SM121 using b12x CuTe DSL kernel\")");
    add("B12xMoEWrapper.run", sm12x,
        "fused_moe/cute_dsl/b12x_moe.py: the wrapper runs the same SM120/SM121 kernels "
        "(launch_sm120_moe) as b12x_fused_moe, @supported_compute_capability([120, 121])");
    add("cute_dsl_fused_moe_nvfp4", sm100,
        "fused_moe/cute_dsl/fused_moe.py: @supported_compute_capability([100, 103]) (later "
        "versions [100, 103, 107])");
    // fused_moe_mxfp8_mxfp4.py: the decorator only records [100, 103]; the call fails past
    // validation elsewhere (GEMM1: "Blockscaled contiguous gather grouped GEMM requires SM10x
    // family", SM107 lacking its Rubin tactic fields), so SM100 / SM103 run it.
    for (const char* op : {"cute_dsl_fused_moe_mxfp8_mxfp4", "CuteDslMxfp8Mxfp4MoEWrapper.run"}) {
      add(op, sm100,
          "fused_moe/cute_dsl/fused_moe_mxfp8_mxfp4.py: @supported_compute_capability([100, "
          "103]); GEMM1's wrapper raises ValueError unless the major is 10, and SM107 without "
          "Rubin tactic fields",
          false,
          "Blockscaled contiguous gather grouped GEMM requires SM10x family (SM100 / SM103)");
    }
    add("CuteDslMoEWrapper.run", sm100,
        "fused_moe/cute_dsl/fused_moe.py: CuteDslMoEWrapper.__init__ "
        "@supported_compute_capability([100, 103])");
    // The GEMM ops of gemm/gemm_base.py and gemm/routergemm.py without a backend argument
    // (flashinfer-python 0.6.18; upstream checks the common check's list for those).
    const std::vector<int> sm100_rubin = {100, 103, 107};
    add("group_gemm_fp8_nt_groupwise", {100, 103, 107, 120, 121},
        "gemm/gemm_base.py:8056: common check _check_group_gemm_fp8_nt_groupwise_problem_size, "
        "@supported_compute_capability([100, 103, 107, 120, 121]) (\"Currently only supported on "
        "NVIDIA Blackwell\")");
    add("group_gemm_mxfp8_mxfp4_nt_groupwise", {100, 103, 107, 110, 120, 121},
        "gemm/gemm_base.py:8276: common check "
        "_check_group_gemm_mxfp8_mxfp4_nt_groupwise_problem_size, "
        "@supported_compute_capability([100, 103, 107, 110, 120, 121])");
    add("group_gemm_nvfp4_nt_groupwise", sm12x,
        "gemm/gemm_base.py:8516: common check _check_group_gemm_nvfp4_nt_groupwise_problem_size, "
        "@supported_compute_capability([120, 121])");
    add("group_deepgemm_fp8_nt_groupwise", sm100_rubin,
        "gemm/gemm_base.py:8776: common check _check_group_deepgemm_fp8_nt_groupwise_problem_size, "
        "@supported_compute_capability([100, 103, 107]) (DeepGEMM SM100 module)");
    add("batch_deepgemm_fp8_nt_groupwise", sm100_rubin,
        "gemm/gemm_base.py:8930: common check _check_batch_deepgemm_fp8_nt_groupwise, "
        "@supported_compute_capability([100, 103, 107])");
    add("gemm_fp8_nt_blockscaled", {100, 103, 107, 120, 121},
        "gemm/gemm_base.py:7955: @backend_requirement({}, common_check="
        "_check_gemm_fp8_nt_blockscaled_problem_size), @supported_compute_capability([100, 103, "
        "107, 120, 121])");
    add("tgv_gemm_sm100", sm100,
        "gemm/gemm_base.py:2094: if not _match_sm_version(a.device, [\"100\", \"103\"]): "
        "ValueError(\"TGV GEMM requires SM100, SM103 architecture\")",
        false, "TGV GEMM requires SM100, SM103 architecture");
    for (const char* op : {"mm_M1_16_K7168_N128", "mm_M1_16_K7168_N256", "mm_M1_16_K6144_N256"}) {
      add(op, sm100_rubin,
          "gemm/routergemm.py:86-114: each router GEMM's common check (@backend_requirement({}, "
          "common_check=...) at 174, 220, 266) is @supported_compute_capability([100, 103, 107])");
    }
    add("tinygemm_bf16", {90, 100, 103, 107, 110, 120, 121},
        "gemm/routergemm.py:318: common check _tinygemm_bf16_shape_checks "
        "@supported_compute_capability([90, 100, 103, 107, 110, 120, 121]) (\"SM90+\")");
    add("grouped_gemm_nt_masked", {100, 103, 107, 120, 121},
        "gemm/kernels/grouped_gemm_masked_wrapper.py: SM107 runs the Rubin kernel, other major >= "
        "10 the Blackwell one, SM110 is refused; below: ValueError(\"Masked grouped GEMM is only "
        "supported on SM100+ (Blackwell/Rubin), got SM{major}{minor}\")",
        true);
    add("moe_gemm_fp8_nt_groupwise", sm12x,
        "grouped_mm/cute_sm120_fp8_groupwise/core.py: @supported_compute_capability([120, 121])");
    add("moe_gemm_mxfp8_nt_groupwise", sm12x,
        "grouped_mm/cute_sm120_mxfp8_groupwise/core.py: @supported_compute_capability([120, 121])");
    add("nvfp4_kv_quantize", {100, 103, 107, 110, 120, 121},
        "quantization/fp4_quantization.py:2209: @backend_requirement({}, common_check="
        "_nvfp4_kv_quant_check), @supported_compute_capability([100, 103, 107, 110, 120, 121]) "
        "(\"Requires SM100+ (Blackwell) for the cvt.rn.satfinite.e2m1x2.f32 PTX instruction\")");
    add("trtllm_gen_routing", {100, 103, 120, 121},
        "fused_moe/trtllm_gen_routing.py: @backend_requirement({}, common_check="
        "_check_trtllm_gen_routing_supported), _TRTLLM_GEN_ROUTING_SUPPORTED_CC = [100, 103, 120, "
        "121] (\"compiled for SM 10.x and 12.x only\")");
    add("fp8_blockscale_gemm_sm90", {90},
        "gemm/gemm_base.py:9187: if not _match_sm_version(input.device, [\"90\", \"90a\"]): "
        "ValueError(\"fp8_blockscale_gemm_sm90 is only supported on SM90 (Hopper) "
        "architecture.\") (its module, gen_fp8_blockscale_gemm_sm90_module, is built for sm90a)",
        false, "fp8_blockscale_gemm_sm90 is only supported on SM90 (Hopper) architecture.");
    // mxfp8_grouped_quantize (quantization/fp8_quantization.py, after its mask checks):
    // `if major < 10: raise RuntimeError("mxfp8_grouped_quantize requires SM100 or newer")`, its
    // kernel being a cuTile one. The NVFP4 grouped quantizers have no such gate (an sm90 module).
    add("mxfp8_grouped_quantize", {100, 103, 107, 110, 120, 121},
        "quantization/fp8_quantization.py, mxfp8_grouped_quantize: `major < 10` raises "
        "RuntimeError(\"mxfp8_grouped_quantize requires SM100 or newer\") after the mask checks",
        false, "mxfp8_grouped_quantize requires SM100 or newer");
    // The grouped GEMMs of grouped_mm/core.py: @backend_requirement({}, common_check=...), so
    // the common check's list decides (grouped_mm_bf16 and grouped_mm_fp8 run on Hopper).
    const std::vector<int> sm100_family = {100, 103, 110, 120, 121};
    add("grouped_mm_mxfp8", sm100_family,
        "grouped_mm/core.py:346: @backend_requirement({}, common_check=_check_grouped_mm_mxfp8), "
        "the check (287) @supported_compute_capability([100, 103, 110, 120, 121])");
    add("grouped_mm_fp4", sm100_family,
        "grouped_mm/core.py:506: @backend_requirement({}, common_check=_check_grouped_mm_fp4), "
        "the check (428) @supported_compute_capability([100, 103, 110, 120, 121])");
    // No decorator of its own: its first step is nvfp4_quantize_smooth(backend="cutlass"), whose
    // refusal upstream raises; its GEMM (mm_nvfp4_svdquant) has the same list.
    r->emplace("svdquant_linear",
               Rule{UpstreamArchRule{"svdquant_linear", sm100_rubin,
                                     "gemm/gemm_svdquant.py:351: plain @flashinfer_api; it calls "
                                     "nvfp4_quantize_smooth (302, backend \"cutlass\": "
                                     "@supported_compute_capability([100, 103, 107]) at 145) "
                                     "first, then mm_nvfp4_svdquant (196, the same list)"},
                    false, nullptr, "nvfp4_quantize_smooth", "cutlass"});
    // Gated delta rule: CuTe-DSL kernels compiled for sm_{major}{minor}a with major >= 9 (no
    // decorator; decode docstrings "Requires SM90+"); the prefill dispatches on the major.
    for (const char* op : {"gated_delta_rule_decode_pretranspose", "gated_delta_rule_decode",
                           "gated_delta_rule_mtp"}) {
      add(op, {90, 100, 103, 107, 110, 120, 121},
          "gdn_decode.py: CuTe-DSL kernels (gdn_kernels/) built for sm_{major}{minor}a only where "
          "major >= 9 (device_target.py); docstrings \"Requires SM90+\"; its tests skip below "
          "SM90");
    }
    add("chunk_gated_delta_rule", {90, 100, 103, 107, 120, 121},
        "gdn_prefill.py: dispatch on the major: 9 (CuTe-DSL sm90), 10 (Blackwell, CUDA 13+), 12 "
        "(sm120); any other: NotImplementedError(\"GDN prefill DSL kernel is unavailable\")",
        false, "GDN prefill DSL kernel is unavailable");
    // MiniMax sparse attention's selection: CuTe-DSL kernels for SM12x only
    // (msa_ops/sparse_topk_select.py, proxy_score.py: is_sm12x_supported, then RuntimeError).
    add("msa_topk_select", {120, 121},
        "msa_ops/sparse_topk_select.py: RuntimeError unless is_sm12x_supported(device) "
        "(compute capability 12.0 / 12.1, CUDA >= 12.8)",
        false, "msa_topk_select requires SM120 or SM121 (Blackwell) and CUDA >= 12.8");
    add("msa_proxy_score", {120, 121},
        "msa_ops/proxy_score.py: RuntimeError unless is_sm12x_supported(device) (compute "
        "capability 12.0 / 12.1, CUDA >= 12.8)",
        false, "msa_proxy_score requires SM120 or SM121 and CUDA >= 12.8");
    add("msa_proxy_score_fp4", {120, 121},
        "msa_ops/proxy_score.py: RuntimeError unless is_sm12x_supported(device) (compute "
        "capability 12.0 / 12.1, CUDA >= 12.8)",
        false, "msa_proxy_score_fp4 requires SM120 or SM121 and CUDA >= 12.8");
    add("msa_sparse_attention", {120, 121},
        "msa_ops/sparse_prefill.py: RuntimeError unless is_sm12x_supported(device) (compute "
        "capability 12.0 / 12.1, CUDA >= 12.8)",
        false, "msa_sparse_attention requires SM120 or SM121 (Blackwell) and CUDA >= 12.8");
    add("msa_sparse_decode_attention", {120, 121},
        "msa_ops/sparse_decode.py: RuntimeError unless is_sm12x_supported(device) (compute "
        "capability 12.0 / 12.1, CUDA >= 12.8)",
        false, "msa_sparse_decode_attention requires SM120 or SM121 and CUDA >= 12.8");
    // Task-scheduled attention (attention/prims_ts/*.py): CuTe-DSL tcgen05 kernels; each module
    // checks the capability by hand (no decorator) and raises NotImplementedError elsewhere. The
    // decode module of the signatures' commit also takes SM107 (Rubin); the others SM100 / SM103.
    // The wrappers' plans (no case) refuse by their one-shot form's rule (check_upstream_arch_as).
    for (const char* op : {"prims_ts_batch_decode_with_kv_cache",
                           "batch_decode_with_paged_kv_cache", "BatchDecodePagedTSWrapper.run"}) {
      add(op, {100, 103, 107},
          "attention/prims_ts/decode.py: _validate_runtime_device, _SUPPORTED_COMPUTE_CAPABILITIES "
          "((10, 0), (10, 3), (10, 7)), else NotImplementedError",
          false, "attention-ts decode requires an SM100a/B200, SM103a/B300 or SM107a/Rubin GPU");
    }
    for (const char* op :
         {"prims_ts_batch_decode_with_kv_cache_mla", "batch_decode_mla_with_paged_kv_cache",
          "BatchMLADecodePagedTSWrapper.run", "block_sparse_attention",
          "block_sparse_attention_with_paged_kv_cache", "BlockSparseTSWrapper.run",
          "BlockSparsePagedTSWrapper.run"}) {
      add(op, sm100,
          "attention/prims_ts/mla_decode.py, block_sparse.py: the decode module's device check "
          "(_resolve_cuda_device), compute capability (10, 0) or (10, 3), else "
          "NotImplementedError",
          false, "attention-ts decode requires an SM100a/B200 or SM103a/B300 GPU");
    }
    for (const char* op : {"batch_prefill", "batch_prefill_with_paged_kv_cache",
                           "BatchPrefillTSWrapper.run", "BatchPrefillPagedTSWrapper.run"}) {
      add(op, sm100,
          "attention/prims_ts/context.py: _validate_device, compute capability (10, 0) or "
          "(10, 3), else NotImplementedError",
          false, "attention-ts context requires an SM100a/B200 or SM103a/B300 GPU");
    }
    // The CuTe-DSL attention wrappers (cute_dsl/attention/wrappers/*.py): no capability check
    // of their own; their kernels are tcgen05 / TMEM ones that the DSL compiles for sm_100a /
    // 103a / 110a only (elsewhere the compile fails; upstream's tests skip below SM100). The
    // plans (no case) refuse by their class's run rule (check_upstream_arch_as).
    for (const char* op : {"BatchDecodeCuteDSLWrapper.run", "BatchDecodePagedCuteDSLWrapper.run",
                           "BatchPrefillCuteDSLWrapper.run", "BatchPrefillCuteDSLWrapper.run_paged",
                           "BatchMLADecodeCuteDSLWrapper.run"}) {
      add(op, {100, 103, 110},
          "cute_dsl/attention/wrappers/*.py: no decorator or check; tcgen05 / TMEM kernels "
          "(SM100 family), which the CuTe DSL does not compile elsewhere; tests skip unless "
          "is_sm100a_supported",
          false,
          "cute-dsl attention kernels require a Blackwell GPU with tcgen05 (SM100 / SM103 / "
          "SM110)");
    }
    // nvfp4_attention_sm120.py: @supported_compute_capability([120]) records metadata only; its
    // JIT module is compiled for sm_120a alone, and fwd's binding gates on major 12, minor 0.
    add("nvfp4_attention_sm120_quantize_qkv", {120},
        "nvfp4_attention_sm120.py: @supported_compute_capability([120]); the JIT module "
        "(jit/nvfp4_attention_sm120.py) is built for sm_120a only");
    add("nvfp4_attention_sm120_fwd", {120},
        "csrc/nvfp4_attention_sm120/nvfp4_attention_sm120_binding.cu: compute capability "
        "12.0 exactly, else an error",
        false, "NVFP4 attention SM120 kernel requires compute capability 12.0");
    // quantized_all_reduce: a RuntimeError below major 9, the major in its text.
    r->emplace("quantized_all_reduce",
               Rule{UpstreamArchRule{"quantized_all_reduce",
                                     {90, 100, 103, 107, 110, 120, 121},
                                     "comm/quantized_allreduce.py: RuntimeError when "
                                     "torch.cuda.get_device_capability(inp.device)[0] < 9"},
                    false, nullptr, nullptr, nullptr,
                    "quantized_all_reduce requires SM90+ (Hopper or later), got SM"});
    // bsa_attn_sm120_blk64_fwd: its wrapper raises unless the major is 12.
    add("bsa_attn_sm120_blk64_fwd", {120, 121},
        "cute_dsl/sparse/bsa_attn_sm120.py: RuntimeError unless "
        "torch.cuda.get_device_capability()[0] == 12",
        false, "bsa_attn_sm120_blk64_fwd (sm120_blk64) only supports SM120/SM121");
    // The SM100 siblings: blk128 asserts arch // 10 in (10, 11) of the current device, blk64
    // raises unless q's device is (10, 0) or (10, 3) (its extension is built for sm_100a).
    // blk128's assert lets any 10.x / 11.x through, but its CuTe-DSL kernel compiles for sm_100*,
    // sm_103* and sm_110* only ("Only SM 10.x and 11.x are supported" for the others).
    add("bsa_attn_sm100_blk128_fwd", {100, 103, 110},
        "cute_dsl/sparse/bsa_attn_sm100_blk128.py: AssertionError unless arch // 10 in (10, 11) "
        "(torch.cuda.get_device_capability() of the current device); the DSL targets sm_100*, "
        "sm_103*, sm_110*",
        false, "bsa_attn_sm100_blk128_fwd (sm100_blk128) only supports SM100/SM110");
    add("bsa_attn_sm100_blk64_fwd", {100, 103},
        "cute_dsl/sparse/bsa_attn_sm100_blk64.py: RuntimeError unless "
        "get_device_capability(q.device) in ((10, 0), (10, 3))",
        false, "bsa_attn_sm100_blk64_fwd only supports SM100/SM103");
    // MonoMoE: one JIT module built for sm_90a only (jit/monomoe.py), and
    // @backend_requirement(common_check=...) with supported compute capability 90 on mono_moe
    // ("mono_moe does not support compute capability {cc}; supported compute capabilities: [90]").
    add("mono_moe", {90},
        "fused_moe/monomoe.py: @backend_requirement on mono_moe, compute capability 90 only "
        "(the module is compiled for sm_90a: wgmma, TMA)");
    // packed_kda_decode: a frozen Cake module compiled for sm_100a / 103a / 107a only
    // (cake_packed_kda_decode.py, _target_for_device).
    add("packed_kda_decode", {100, 103, 107},
        "kda_kernels/cake_packed_kda_decode.py: _target_for_device takes compute capability "
        "10.0, 10.3 or 10.7 and raises otherwise",
        false, "packed KDA T=1 requires compute capability 10.0, 10.3 or 10.7 in the SM100 family");
    // Fused RMSNorm + FP4 quantization: CuTe-DSL kernels built on the E2M1 conversion
    // instructions of sm_100a and newer (no decorator; the docstrings say "Requires SM100+
    // (Blackwell) for FP4 quantization PTX intrinsics"; the tests skip below SM100).
    for (const char* op : {"rmsnorm_fp4quant", "add_rmsnorm_fp4quant"}) {
      add(op, {100, 103, 107, 110, 120, 121},
          "cute_dsl/add_rmsnorm_fp4quant.py, cute_dsl/rmsnorm_fp4quant.py: no decorator; the "
          "kernels use cvt.rn.satfinite.e2m1x2.f32 (sm_100a and newer); docstrings \"Requires "
          "SM100+ (Blackwell) for FP4 quantization PTX intrinsics\"",
          false, "Requires SM100+ (Blackwell) for FP4 quantization PTX intrinsics");
    }
    for (const char* op :
         {"trtllm_fp4_block_scale_moe", "trtllm_fp4_block_scale_routed_moe",
          "trtllm_mxint4_block_scale_moe", "trtllm_mxint4_block_scale_routed_moe"}) {
      add(op, sm100,
          "fused_moe/core.py: runs the trtllm-gen fused-MoE module get_trtllm_moe_sm100_module() "
          "(kernels built for SM100/SM103); no decorator, upstream fails when it loads them");
    }
    return r;
  }();
  return *m;
}

const Rule* find_rule(std::string_view op) {
  auto it = rules().find(op);
  return it == rules().end() ? nullptr : &it->second;
}

}  // namespace

const UpstreamArchRule* upstream_arch_rule(std::string_view op) {
  const Rule* r = find_rule(op);
  return r ? &r->rule : nullptr;
}

std::vector<UpstreamArchRule> upstream_arch_rules() {
  std::vector<UpstreamArchRule> out;
  for (const auto& [name, r] : rules()) out.push_back(r.rule);
  return out;
}

bool upstream_runs_on(std::string_view op, int cc) {
  const Rule* r = find_rule(op);
  return !r || in_list(r->rule.ccs, cc);
}

std::string upstream_refusal(std::string_view op, int cc) {
  const Rule* r = find_rule(op);
  if (!r || in_list(r->rule.ccs, cc)) return "";
  if (r->own_text) return r->own_text;
  if (r->major_text) return r->major_text + std::to_string(cc / 10) + "0";
  if (r->masked_gemm_text) {
    return "Masked grouped GEMM is only supported on SM100+ (Blackwell/Rubin), got SM" +
           std::to_string(cc / 10) + std::to_string(cc % 10);
  }
  if (r->refused_by) return upstream_backend_refusal(r->refused_by, r->refused_by_backend, cc);
  return std::string(op) + " does not support compute capability " + std::to_string(cc);
}

std::string upstream_backend_refusal(std::string_view op, std::string_view backend, int cc) {
  const std::vector<int>* ccs = upstream_backend_ccs(op, backend);
  if (!ccs || in_list(*ccs, cc)) return "";
  if (backend == "auto") return "No suitable auto backends found for " + std::string(op);
  if (op == "prepare_bf16_fp4_weights" && backend == "cute-dsl") {  // the dispatcher's own text
    return "cute-dsl w4a16 GEMM only supports SM100/103 and SM12x; got " + std::to_string(cc / 10) +
           "." + std::to_string(cc % 10);
  }
  return std::string(op) + " does not support backend '" + std::string(backend) +
         "' with capability " + std::to_string(cc);
}

namespace api {

void check_upstream_arch(const char* op, const char* arg, Device device) {
  check_upstream_arch_as(op, op, arg, device);
}

void check_upstream_arch_as(const char* rule_op, const char* op, const char* arg, Device device) {
  if (!device.is_cuda()) return;
  const Rule* r = find_rule(rule_op);
  if (!r) return;
  const int cc = compute_capability(device);
  if (in_list(r->rule.ccs, cc)) return;
  FLASHINFER_FAIL(ErrorCode::kUnsupported, op, arg, upstream_refusal(rule_op, cc), " (",
                  device.str(), "; upstream runs it on compute capability ", cc_list(r->rule.ccs),
                  " only; the CPU reference runs it anywhere)");
}

void check_batch_invariant_gemm(const char* op, std::string_view backend, Device device,
                                DType out_dtype, bool fp16_out_ok, int64_t k, int64_t n,
                                int64_t k_align, int64_t n_align) {
  const char* arg = "batch_invariant";
  FLASHINFER_CHECK(backend == "auto", op, arg,
                   "batch_invariant=True requires backend='auto' (got "
                   "backend='",
                   backend, "')");
  FLASHINFER_CHECK(out_dtype == DType::kBFloat16 || (fp16_out_ok && out_dtype == DType::kFloat16),
                   op, arg, "batch_invariant=True does not support out_dtype ",
                   dtype_torch_name(out_dtype), "; the limit is ",
                   fp16_out_ok ? "torch.bfloat16 or torch.float16" : "torch.bfloat16");
  FLASHINFER_CHECK(k > 0 && n > 0 && k % k_align == 0 && n % n_align == 0, op, arg,
                   "batch_invariant=True does not support K = ", k, ", N = ", n,
                   "; the limit is K, N > 0 with K % ", k_align, " == 0 and N % ", n_align,
                   " == 0. The batch-invariant mode never falls back");
  if (device.is_cuda()) {
    const int cc = compute_capability(device);
    FLASHINFER_CHECK_CODE(cc == 100 || cc == 103 || cc == 107, ErrorCode::kUnsupported, op, arg,
                          "batch_invariant=True does not support compute capability ", cc / 10, ".",
                          cc % 10,
                          "; the limit is SM100, SM103 or SM107. The "
                          "batch-invariant mode never falls back");
  }
}

void check_backend(const char* op, std::string_view backend, Device device) {
  const BackendRequirement& req = backend_requirement(op);
  FLASHINFER_CHECK(req.is_known_backend(backend), op, "backend", "unknown backend '", backend,
                   "' (upstream's backends: ", join(req.upstream_backends),
                   "; supported in this build: ", join(req.supported_backends()), ")");
  if (!device.is_cuda()) return;  // the CPU reference stands in for every backend
  const int cc = compute_capability(device);
  // Upstream's own refusal first (@backend_requirement's BackendSupportedError texts), where
  // upstream's list for the backend excludes this device.
  if (const std::string why = upstream_backend_refusal(op, backend, cc); !why.empty()) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "backend", why, " (", device.str(),
                    "; upstream runs it on compute capability ",
                    cc_list(*upstream_backend_ccs(op, backend)), " only)");
  }
  if (!req.is_backend_supported(backend, cc)) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, op, "backend", "backend '", backend,
                    "' is not available on ", device.str(), " (compute capability ", cc,
                    ") in this build; supported there: ", join(req.supported_backends(cc)));
  }
}

}  // namespace api
}  // namespace flashinfer
