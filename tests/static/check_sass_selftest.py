#!/usr/bin/env python3
"""Self-test of scripts/check_sass.py (ctest `static_sass_selftest`, label `static`): compiles a
few tiny kernels with nvcc into a temporary folder and checks the checker's verdict on each.

  check_sass_selftest.py [--nvcc PATH] [unittest arguments]

  good      16-byte cp.async into shared memory and 128-bit loads      -> pass
  narrow    bf16 K read element by element (16-bit loads), no cp.async  -> fail (both named)
  spill     more live registers than -maxrregcount 32 allows             -> fail (STL/LDL, STACK)
  ldg128    128-bit loads only, no cp.async                              -> fail; pass with --allow-ldg128
  sm80      the good kernel built for sm_80 only                         -> skipped (77)
  grouped   four 128-bit loads issued before any is used                 -> passes `sampling`
            (ldg128, one load, fails it: the rule asks for 4 in a row)
  generic   16-byte copies through pointers that may be null (LD.E.128 /   -> fails `generic`
            ST.E.128: not provably global)
  global    the same copy, the refused row returning before the pointers  -> passes `generic`
plus a library with no kernel named `decode`, the rule table's other rule (`prefill`), and which
names the `rowops` rule (several substrings) selects.
No GPU is needed: only nvcc and cuobjdump (scripts/bootstrap installs PyPI's).
"""
import os
import subprocess
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "..", "..", "scripts", "check_sass.py")
sys.path.insert(0, os.path.dirname(CHECKER))
sys.dont_write_bytecode = True  # no scripts/__pycache__ from a test run
import check_sass  # noqa: E402

NVCC = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")

GOOD = r"""
#include <cstdint>
extern "C" __global__ void good_decode_kernel(const uint4* __restrict__ k, uint4* out, int n) {
  __shared__ uint4 smem[256];
  const int i = threadIdx.x;
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(&smem[i]));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(k + blockIdx.x * 256 + i));
  asm volatile("cp.async.commit_group;\n" ::);
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
  uint4 v = smem[(i + 1) & 255];
  const uint4 w = k[n + i];
  v.x += w.x; v.y += w.y; v.z += w.z; v.w += w.w;
  out[blockIdx.x * 256 + i] = v;
}
"""

NARROW = r"""
#include <cuda_bf16.h>
template <typename T>
__global__ void narrow_decode_kernel(const T* k, float* out, int n) {
  float acc = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) acc += __bfloat162float(k[j]);
  out[threadIdx.x] = acc;
}
template __global__ void narrow_decode_kernel<__nv_bfloat16>(const __nv_bfloat16*, float*, int);
"""

# 24 float4 (96 floats) live across a loop: more than 32 registers hold, so ptxas spills.
SPILL = r"""
extern "C" __global__ void spill_decode_kernel(const float4* in, float* out, int n) {
  float4 a[24];
#pragma unroll
  for (int j = 0; j < 24; ++j) a[j] = in[j * n + threadIdx.x];
  float s = 0.f;
  for (int r = 0; r < n; ++r) {
#pragma unroll
    for (int j = 0; j < 24; ++j) {
      s += a[j].x * a[(j + 1) % 24].y + a[j].z * a[j].w;
      a[j].x += s;
    }
  }
  out[threadIdx.x] = s;
}
"""

LDG128 = r"""
extern "C" __global__ void ldg128_decode_kernel(const uint4* __restrict__ k, uint4* out) {
  const uint4 v = k[blockIdx.x * blockDim.x + threadIdx.x];
  out[blockIdx.x * blockDim.x + threadIdx.x] = make_uint4(v.w, v.z, v.y, v.x);
}
"""

GROUPED = r"""
extern "C" __global__ void grouped_sampling_kernel(const uint4* __restrict__ x, uint4* out, int n) {
  uint4 a[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) a[u] = x[u * n + threadIdx.x];
  uint4 s = a[0];
#pragma unroll
  for (int u = 1; u < 4; ++u) {
    s.x ^= a[u].x; s.y += a[u].y; s.z |= a[u].z; s.w -= a[u].w;
  }
  out[threadIdx.x] = s;
}
"""

NO_DECODE = r"""
extern "C" __global__ void attention_core_kernel(const float* k, float* out) {
  out[threadIdx.x] = k[threadIdx.x] * 2.f;
}
"""

# The pattern session 61 found in the paged appends: a helper that returns null pointers for a
# refused row makes every copy through them generic. Returning first keeps them global.
GENERIC = r"""
struct Row { const uint4* a; uint4* c; };
__device__ __forceinline__ Row row_of(const uint4* in, uint4* out, int i, int n) {
  if (i < 0 || i >= n) return {};
  return {in + i * 64, out + i * 64};
}
extern "C" __global__ void generic_append_kernel(const uint4* in, uint4* out, const int* idx, int n) {
  const Row r = row_of(in, out, idx[blockIdx.x], n);
  if (r.c == nullptr) return;
  r.c[threadIdx.x] = r.a[threadIdx.x];
}
"""

GLOBAL = r"""
extern "C" __global__ void global_append_kernel(const uint4* in, uint4* out, const int* idx, int n) {
  const int i = idx[blockIdx.x];
  if (i < 0 || i >= n) return;
  out[i * 64 + threadIdx.x] = in[i * 64 + threadIdx.x];
}
"""

# name -> (source, extra nvcc flags)
CASES = {
    "good": (GOOD, []),
    "narrow": (NARROW, []),
    "spill": (SPILL, ["-maxrregcount", "32"]),
    "ldg128": (LDG128, []),
    "grouped": (GROUPED, []),
    "nodecode": (NO_DECODE, []),
    "generic": (GENERIC, []),
    "global": (GLOBAL, []),
    "sm80": (GOOD, ["-gencode", "arch=compute_80,code=sm_80"]),
}


class CheckSassSelfTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not check_sass.find_tool("cuobjdump"):
            raise AssertionError(
                "cuobjdump not found (PATH, /usr/local/cuda/bin, PyPI's nvidia-cuda-cuobjdump): "
                "run scripts/bootstrap"
            )
        cls.tmp = tempfile.TemporaryDirectory(prefix="check_sass_selftest.")
        procs = {}
        for name, (src, flags) in CASES.items():
            cu = os.path.join(cls.tmp.name, name + ".cu")
            with open(cu, "w") as f:
                f.write(src)
            arch = [] if any(fl.startswith("arch=") for fl in flags) else [
                "-gencode", "arch=compute_90a,code=sm_90a"]
            cmd = [NVCC, "-cubin", *arch, *flags, "-o", os.path.join(cls.tmp.name, name + ".cubin"), cu]
            procs[name] = (cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for name, (cmd, p) in procs.items():
            out = p.communicate()[0]
            if p.returncode != 0:
                raise AssertionError("nvcc failed for %s: %s\n%s" % (name, " ".join(cmd), out))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check(self, name, *args):
        cubin = os.path.join(self.tmp.name, name + ".cubin")
        p = subprocess.run([sys.executable, CHECKER, *args, cubin], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr

    def test_good_passes(self):
        rc, out = self.check("good", "--rule", "decode")
        self.assertEqual(rc, 0, out)
        self.assertIn("LDGSTS.E.BYPASS.128", out)
        self.assertIn("1 pass, 0 fail", out)

    def test_narrow_fails_on_16bit_loads_and_missing_ldgsts(self):
        rc, out = self.check("narrow", "--rule", "decode")
        self.assertEqual(rc, 1, out)
        self.assertIn("narrow_decode_kernel<__nv_bfloat16>", out)  # demangled
        self.assertIn("forbidden 16-bit global load: LDG.E.U16", out)
        self.assertIn("missing LDGSTS .128", out)

    def test_spill_fails(self):
        rc, out = self.check("spill", "--rule", "decode")
        self.assertEqual(rc, 1, out)
        self.assertIn("spills/local memory: STL x", out)
        self.assertIn("LDL x", out)
        self.assertIn("STACK ", out)

    def test_ldg128_is_the_weaker_form(self):
        rc, out = self.check("ldg128", "--rule", "decode")
        self.assertEqual(rc, 1, out)
        self.assertIn("has only LDG .128", out)
        rc, out = self.check("ldg128", "--rule", "decode", "--allow-ldg128")
        self.assertEqual(rc, 0, out)
        self.assertIn("LDG.E.128", out)

    def test_loads_in_flight_together(self):
        rc, out = self.check("grouped", "--rule", "sampling")
        self.assertEqual(rc, 0, out)
        self.assertIn("4 in a row", out)
        rc, out = self.check("ldg128", "--rule", "sampling", "--match", "ldg128")
        self.assertEqual(rc, 1, out)
        self.assertIn("at most 1 in a row", out)

    def test_generic_accesses_fail(self):
        rc, out = self.check("generic", "--rule", "generic")
        self.assertEqual(rc, 1, out)
        self.assertIn("forbidden generic load or store: ", out)
        self.assertIn("ST.E.128", out)
        rc, out = self.check("global", "--rule", "generic")
        self.assertEqual(rc, 0, out)
        rc, out = self.check("global", "--rule", "rowops")
        self.assertEqual(rc, 0, out)
        self.assertIn("LDG.E.128", out)

    def test_no_matching_kernel_fails(self):
        rc, out = self.check("nodecode", "--rule", "decode")
        self.assertEqual(rc, 1, out)
        self.assertIn("no decode kernel found", out)
        rc, out = self.check("good", "--rule", "decode", "--exclude", "good_")
        self.assertEqual(rc, 1, out)
        self.assertIn("no decode kernel found", out)

    def test_other_rule_from_the_table(self):
        rc, out = self.check("good", "--rule", "prefill")
        self.assertEqual(rc, 1, out)
        self.assertIn("no prefill kernel found", out)
        rc, out = self.check("nodecode", "--rule", "prefill", "--match", "attention_core")
        self.assertEqual(rc, 1, out)
        for need in ("missing LDSM", "missing HMMA", "missing LDGSTS .128"):
            self.assertIn(need, out)

    def test_other_arch_only_is_skipped(self):
        rc, out = self.check("sm80", "--rule", "decode")
        self.assertEqual(rc, 77, out)
        self.assertIn("no sm_90 SASS", out)

    def test_list(self):
        rc, out = self.check("spill", "--list")
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"regs\s+32\s+stack\s+[1-9]\d*.*spill_decode_kernel")



class LongestRunTest(unittest.TestCase):
    """Straight-line runs of an opcode (no compiling: a kernel stands in by its opcode list)."""

    def run_of(self, ops):
        return check_sass.longest_run(types.SimpleNamespace(opcodes=ops), check_sass.LDG_128)

    def test_runs_end_at_control_transfers(self):
        self.assertEqual(self.run_of([]), 0)
        self.assertEqual(self.run_of(["LDG.E.128", "IMAD", "LDG.E.128.CONSTANT", "LDG.E"]), 2)
        self.assertEqual(self.run_of(["LDG.E.128", "BRA", "LDG.E.128", "BAR.SYNC.DEFER_BLOCKING",
                                      "LDG.E.128", "LDG.E.128", "LDG.E.128", "EXIT"]), 3)
        self.assertEqual(self.run_of(["LDG.E.128", "BSSY", "LDG.E.128", "BSYNC", "LDG.E.128"]), 1)
        # BRA's modifiers and a predicated branch (predicates are stripped) end a run too.
        self.assertEqual(self.run_of(["LDG.E.128", "BRA.U", "LDG.E.128", "LDG.E.128"]), 2)


class AtMostTest(unittest.TestCase):
    """The ratio limit (no compiling: a kernel stands in by its opcode list), as the
    `prefill_sm90` rule uses it against a serialized wgmma pipeline."""

    def problems(self, ops):
        k = types.SimpleNamespace(opcodes=ops)
        rule = check_sass.Rule(name="t", match="t", description="", no_local=False,
                               limits=check_sass.RULES["prefill_sm90"].limits)
        return check_sass.check_kernel(k, rule, set())[1]

    def test_serialized_wgmma_fails_and_the_pipelined_kernel_passes(self):
        hgmma = "HGMMA.64x128x16.F32.BF16"
        pipelined = ["WARPGROUP.ARRIVE"] + [hgmma] * 16 + ["WARPGROUP.DEPBAR.LE"] * 2
        self.assertEqual(self.problems(pipelined), [])
        serialized = ["WARPGROUP.ARRIVE", hgmma, "WARPGROUP.DEPBAR.LE"] * 24
        p = self.problems(serialized)
        self.assertEqual(len(p), 1, p)
        self.assertIn("24 for 24", p[0])
        self.assertEqual(self.problems(["IMAD", "WARPGROUP.DEPBAR.LE"]), [])  # no HGMMA: not checked


class UnderWgmmaTest(unittest.TestCase):
    """The work-under-the-products check (no compiling: a kernel stands in by its opcode list), as
    the `prefill_sm90_overlap` rule uses it: its exponentials between a wgmma group's first HGMMA
    and the wait for it, in enough groups."""

    def problems(self, ops):
        k = types.SimpleNamespace(opcodes=ops)
        rule = check_sass.Rule(name="t", match="t", description="", no_local=False,
                               under_wgmma=check_sass.RULES["prefill_sm90_overlap"].under_wgmma)
        return check_sass.check_kernel(k, rule, set())[1]

    def stage(self, under, after):
        return (["WARPGROUP.ARRIVE"] + ["HGMMA.64x64x16.F32.BF16"] * 8 + ["FFMA"]
                + ["MUFU.EX2"] * under + ["WARPGROUP.DEPBAR.LE"] + ["MUFU.EX2"] * after)

    def test_softmax_under_the_products_passes(self):
        self.assertEqual(self.problems(self.stage(0, 0) + self.stage(34, 0) * 6), [])

    def test_a_wait_hoisted_above_the_exponentials_fails(self):
        # session 70's first build: the wait after 2-7 of a stage's 34 exponentials
        p = self.problems(self.stage(0, 0) + self.stage(7, 27) * 3 + self.stage(2, 32) * 3)
        self.assertEqual(len(p), 1, p)
        self.assertIn("0 of 7 groups", p[0])
        # five good stages of the six the form has are not enough
        self.assertEqual(len(self.problems(self.stage(34, 0) * 5 + self.stage(7, 27))), 1)


class RuleSelectionTest(unittest.TestCase):
    """Which kernel names a rule selects (no compiling: kernels stand in by their bare name)."""

    def names(self, rule, match=None):
        kernels = [types.SimpleNamespace(base=n) for n in (
            "rmsnorm_kernel", "rmsnorm_strided_kernel", "fused_add_rmsnorm_kernel",
            "layernorm_kernel", "dit_layernorm_kernel", "act_and_mul_kernel",
            "act_and_mul_strided_kernel", "append_kernel", "nvfp4_append_kernel",
            "paged_fp8_append_kernel", "rope_kernel", "rope_strided_kernel", "qk_norm_rope_kernel",
            "append_mla_kernel", "append_mla_strided_kernel", "fp4_quantize_kernel",
            "fp4_quantize_strided_kernel", "mxfp8_quantize_kernel",
            "mxfp8_quantize_strided_kernel", "nvfp4_paged_quantize_kernel", "group_quant_kernel",
            "group_quant_strided_kernel", "norm_quant_kernel", "norm_quant_strided_kernel")]
        return [k.base for k in check_sass.select(kernels, check_sass.RULES[rule], match)]

    def test_tuple_match_selects_any_substring_minus_exclusions(self):
        self.assertEqual(self.names("rowops"), [
            "rmsnorm_kernel", "fused_add_rmsnorm_kernel", "layernorm_kernel",
            "act_and_mul_kernel", "append_kernel", "rope_kernel", "append_mla_kernel"])

    def test_quant_selects_the_vector_quantizers(self):
        self.assertEqual(self.names("quant"), [
            "fp4_quantize_kernel", "mxfp8_quantize_kernel", "group_quant_kernel",
            "norm_quant_kernel"])

    def test_match_flag_replaces_the_tuple(self):
        self.assertEqual(self.names("rowops", "rope_"), ["rope_kernel"])


if __name__ == "__main__":
    argv = sys.argv[:1]
    rest = sys.argv[1:]
    while rest:
        a = rest.pop(0)
        if a == "--nvcc" and rest:
            NVCC = rest.pop(0)
        elif a.startswith("--nvcc="):
            NVCC = a.split("=", 1)[1]
        else:
            argv.append(a)
    unittest.main(argv=argv, verbosity=2)
