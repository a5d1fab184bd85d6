#!/usr/bin/env python3
"""Static checks of the compiled CUDA kernels (no GPU needed): reads the SASS and the resource
usage that `cuobjdump` prints for a binary and applies a table of rules, each keyed by a
substring of the kernel's name.

  check_sass.py [--rule NAME ...] [--arch sm_90] [--match SUBSTR] [--exclude SUBSTR ...]
                [--allow-ldg128] [--cuobjdump PATH] [--toolkit-bin DIR] [--sass-cache FILE]
                [--list] [-v] BINARY

BINARY is anything cuobjdump reads: the shared library (build/lib/libflashinfer.so), a static
library (.a), an object (.o) or a .cubin. Only the SASS for --arch is checked (sm_90 by default;
an sm_90a image counts as sm_90): `cuobjdump -lelf` lists the images, `cuobjdump -sass -res-usage
-arch sm_90` prints that code (its -arch takes sm_90a along), and the parser keeps the images whose
architecture it names (about 15 s for the library, which also holds sm_80 code).
--sass-cache FILE keeps that text in FILE under a line naming the binary (path, size, modification
time) and the architecture, and reads it from there while they match: the ctest rule tests share
one cuobjdump run (the `static_sass_dump` fixture writes it), and its parse, kept in FILE.pickle
(the text of the library is hundreds of MB: parsing it was most of a rule's time).

Rules (RULES below): `decode`, `prefill`, `mla_mma`, `sampling`, `nvfp4`, `nvfp4_attn`, `rowops`, `quant`, `gdn`, `gdn_chunked`, `ssu`, `mhc`, `comm`, `quantized_ar`, `moe_a2a`,
`grouped_gemm` and `moe_grouped` are on by default; `cutlass` (CUTLASS's grouped GEMM),
`prefill_sm90` (the Hopper prefill kernel), `prefill_sm90_ws` (its warp-specialized
instances), `prefill_sm90_overlap` (its overlapped ones), `prefill_sm90_multi_item` (its
multi-item scoring ones) and `mla_sm90` (the Hopper MLA decode kernel), in builds that have
CUTLASS, only with --rule. A rule selects the kernels whose name (the bare function
name, without namespaces, template arguments and parameters; case-insensitive) contains its
substring (or one of them) and none of its exclusions (and, where the rule has a `name_regex`,
whose demangled name with its template arguments matches it), and then
  - no local memory: no STL/LDL instruction and STACK and LOCAL 0 in the resource usage
    (see has_local_memory for which of these means what);
  - each required instruction present (e.g. a 128-bit cp.async, SASS `LDGSTS...128`), or
    for a Need with run=N, N of them in one straight-line stretch (no control transfer between);
  - no forbidden instruction (e.g. a global load of 16 bits or less, `LDG.E.U16`, `LDG.E.U8`).
At least one kernel must match each rule checked, else the rule fails ("no decode kernel found").

Exit status: 0 all checked kernels pass; 1 a violation, or no kernel for a rule, or a binary
without device code; 2 usage error or no cuobjdump (run scripts/bootstrap: it installs PyPI's
nvidia-cuda-cuobjdump); 77 the binary holds device code but none for --arch (a build for other
architectures only: ctest's SKIP_RETURN_CODE).

To add a rule, add a Rule to RULES: `match` (name substring, or a tuple of them), `exclude` (helper kernels to leave
out), `require` (Need: a regex on the instruction's opcode with its modifiers, e.g.
`LDGSTS.E.BYPASS.128`, and optionally a weaker form accepted with a flag), `forbid` (Forbid:
regex), `no_local` (spills), and `default` (checked without --rule).
"""
import argparse
import collections
import dataclasses
import glob
import importlib.util
import io
import os
import pickle
import re
import shutil
import subprocess
import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_SKIP = 0, 1, 2, 77


@dataclasses.dataclass(frozen=True)
class Need:
    """An instruction a kernel must contain: `pattern` matches the opcode with its modifiers
    (`LDGSTS.E.BYPASS.LTC128B.128`, no predicate, no operands). `weaker`, if set, is a
    (label, pattern) accepted in its place only when `weaker_flag` is given on the command line.
    `run` > 1 asks for that many matches in one straight-line stretch of code (no branch, barrier
    or other control transfer between them): loads issued together, in flight at once."""

    label: str
    pattern: str
    weaker: tuple = None
    weaker_flag: str = None
    run: int = 1


@dataclasses.dataclass(frozen=True)
class Forbid:
    """An instruction a kernel must not contain (`pattern` as for Need)."""

    label: str
    pattern: str


@dataclasses.dataclass(frozen=True)
class AtMost:
    """At most `ratio` instructions matching `pattern` per instruction matching `per` (checked
    where the kernel has any of the latter): e.g. wgmma waits per wgmma, which ptxas raises to
    one each when it serializes the pipeline (its C7513 / C7514 notes, shown only with -v)."""

    label: str
    pattern: str
    per: str
    ratio: float


@dataclasses.dataclass(frozen=True)
class Under:
    """Work the math threads must do while their wgmma products run: at least `groups` wgmma
    groups (from a group's first HGMMA to the WARPGROUP.DEPBAR that waits for it) each with at
    least `at_least` instructions matching `pattern` in between. ptxas schedules a wait as early as
    its basic block allows, so an overlap written in the source can be gone from the SASS."""

    label: str
    pattern: str
    at_least: int
    groups: int


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    match: object  # a name substring, or a tuple of them (a kernel matching any is selected)
    description: str
    exclude: tuple = ()
    require: tuple = ()
    forbid: tuple = ()
    no_local: bool = True
    default: bool = True
    limits: tuple = ()  # AtMost
    # A regex the demangled name (template arguments included) must also match: instances of one
    # kernel told apart by a template flag.
    name_regex: str = None
    under_wgmma: tuple = ()  # Under


# SASS spellings (cuobjdump 13, sm_80 and sm_90 alike):
#   cp.async.cg ... 16                -> LDGSTS.E.BYPASS.128 (with .L2::128B: LDGSTS.E.BYPASS.LTC128B.128;
#                                        with a src-size operand: the same opcode, a predicate operand)
#   cp.async.ca ... 16                -> LDGSTS.E.128;  cp.async.ca ... 8 -> LDGSTS.E.64
#   ld.global.v4.u32 / uint4 load     -> LDG.E.128, LDG.E.128.CONSTANT (ld.global.nc), LDG.E.NA.128.CONSTANT,
#                                        LDG.E.LTC128B.128, LDG.E.EF.128 (__ldcs)
#   16-bit loads (bf16 / half / short) -> LDG.E.U16, LDG.E.S16, LDG.E.U16.CONSTANT (ld.global.nc),
#                                        LD.E.U16 (a generic-address load); 8-bit: LDG.E.U8, LDG.E.S8
#   ldmatrix -> LDSM.16.M88.4 (and .MT88 for .trans); mma.sync f16/bf16 -> HMMA.16816.F32(.BF16)
_MOD = r"(?:\.[A-Z0-9_]+)*"
LDGSTS_128 = r"^LDGSTS" + _MOD + r"\.128(?:\.|$)"
LDG_128 = r"^LDG" + _MOD + r"\.128(?:\.|$)"
LOAD_16 = r"^(?:LDG|LD)" + _MOD + r"\.(?:U16|S16)(?:\.|$)"
LOAD_8 = r"^(?:LDG|LD)" + _MOD + r"\.(?:U8|S8)(?:\.|$)"
# An access through a generic address (LD.E, ST.E, any width): the compiler could not tell the
# pointer's space (one that may be null, one chosen between shared and global memory at run time,
# the address of a CuTe tensor element), so each access resolves it at run time, and a shared
# access misses the LDS / STS forms.
GENERIC = r"^(?:LD|ST)\.E(?:\.|$)"
# The Hopper kernels that copy with cp.async and multiply with wgmma (prefill_sm90, mla_sm90): the
# wgmma, the 16-byte copies, and the proxy fence between them (cp.async writes through the generic
# proxy, wgmma reads through the async one); a pipeline ptxas serialized waits after every HGMMA.
WGMMA_FROM_CP_ASYNC = (
    Need("HGMMA (wgmma)", r"^HGMMA(?:\.|$)"),
    Need("LDGSTS .128 (16-byte cp.async)", LDGSTS_128),
    Need("FENCE.VIEW.ASYNC.S (fence.proxy.async.shared::cta)", r"^FENCE\.VIEW\.ASYNC\.S(?:\.|$)"),
)
NOT_SERIALIZED_WGMMA = AtMost("wgmma waits (WARPGROUP.DEPBAR) per HGMMA: serialized wgmma",
                              r"^WARPGROUP\.DEPBAR(?:\.|$)", r"^HGMMA(?:\.|$)", 0.5)

RULES = {
    r.name: r
    for r in (
        Rule(
            name="generic",
            match="",
            description="every kernel of this library (not CUTLASS's device_kernel): no load or "
            "store through a generic address (LD.E / ST.E)",
            # Spills and stack frames are each family's rule's business (some fallbacks keep a
            # frame by design).
            exclude=("device_kernel",),
            forbid=(Forbid("generic load or store", GENERIC),),
            no_local=False,
        ),
        Rule(
            name="decode",
            match="decode",
            description="decode attention: no spills, 128-bit cp.async (LDGSTS .128), "
            "no global loads of 16 bits or less",
            # Helper kernels whose names carry the substring but that load no K/V (e.g. a merge
            # of split-KV partial states) go here, as name substrings.
            exclude=(),
            require=(
                Need(
                    "LDGSTS .128 (16-byte cp.async)",
                    LDGSTS_128,
                    weaker=("LDG .128 (16-byte load)", LDG_128),
                    weaker_flag="--allow-ldg128",
                ),
            ),
            # SASS cannot tell K/V data from other data: every global (or generic) load of 16
            # bits or less counts. Indices and lengths are 32-bit loads or kernel parameters; a
            # byte-wise read of AttentionParams::custom_mask counts too (read it as 32-bit words).
            forbid=(
                Forbid("16-bit global load", LOAD_16),
                Forbid("8-bit global load", LOAD_8),
            ),
        ),
        Rule(
            name="sampling",
            match="sampling_",
            description="sampling kernels (sample, filter, softmax): no spills, 128-bit global "
            "loads (LDG .128) of the rows, at least 4 issued together",
            # The scalar fallbacks for strided or unaligned rows (sampling_strided_*_kernel) have
            # no wide load by design. A pass over a row is latency-bound with one 16-byte load in
            # flight a thread: the kernels issue the loads of several chunks before using them
            # (sampling_cuda.cu, for_each_chunk), which the SASS shows as a straight run of LDGs.
            exclude=("strided",),
            require=(Need("4 LDG .128 in one straight run (loads in flight together)", LDG_128,
                          run=4),),
        ),
        Rule(
            name="nvfp4",
            match="nvfp4_",
            description="NVFP4 quantizers (silu-and-mul rows, paged cache quantize and append, "
            "abs-max): no spills, 128-bit global loads (LDG .128)",
            # The element-load fallbacks for unaligned or strided rows (nvfp4_*_strided_kernel)
            # have no wide load by design; the SM120 attention's kernels have their own rule.
            exclude=("strided", "nvfp4_attn_"),
            require=(Need("LDG .128 (16-byte load)", LDG_128),),
        ),
        Rule(
            name="nvfp4_attn",
            match="nvfp4_attn_",
            description="the SM120 NVFP4 attention's reference-grade kernels "
            "(nvfp4_attention_cuda.cu: means, correction, quantize, forward; element loads by "
            "design): no spills",
        ),
        Rule(
            name="rowops",
            match=(
                "rmsnorm_kernel",
                "layernorm_kernel",
                "act_and_mul_kernel",
                "append_kernel",
                "append_mla_kernel",
                "rope_kernel",
            ),
            description="row ops (rmsnorm, fused_add_rmsnorm, layernorm, act_and_mul, paged KV "
            "append, MLA paged KV append, RoPE): no spills, 128-bit global loads (LDG .128)",
            # The element-load fallbacks for unaligned or strided rows (*_strided_kernel) have no
            # wide load by design; kernels of other families that share a substring are left to
            # their own rules (nvfp4_append_kernel) or not checked yet (dit_layernorm_kernel,
            # paged_fp8_append_kernel, qk_norm_rope_kernel). rope_kernel's angles use
            # kernels/rope_rules.h's sincos, not libdevice's (whose Payne-Hanek reduction kept a
            # local-memory array in the kernel).
            exclude=("strided", "nvfp4_", "dit_", "paged_fp8_", "qk_norm_"),
            require=(Need("LDG .128 (16-byte load)", LDG_128),),
        ),
        Rule(
            name="quant",
            match=(
                "fp4_quantize_kernel",
                "mxfp8_quantize_kernel",
                "group_quant_kernel",
                "norm_quant_kernel",
            ),
            description="quantizers (fp4_quantize: NVFP4 and MXFP4; mxfp8_quantize; the masked "
            "grouped NVFP4 / MXFP8 quantizers, grouped_*_quantize_kernel; "
            "per_token_group_quant_8bit; the fused norm + fp8 quantizers): no spills, 128-bit "
            "global loads (LDG .128)",
            # The element-load fallbacks for strided or unaligned rows (*_strided_kernel) have
            # no wide load by design; the NVFP4 cache
            # quantizers (nvfp4_*) are the `nvfp4` rule's.
            exclude=("strided", "nvfp4_"),
            require=(Need("LDG .128 (16-byte load)", LDG_128),),
        ),
        Rule(
            name="prefill",
            match="prefill",
            description="prefill attention: no spills, ldmatrix (LDSM), mma.sync (HMMA), "
            "128-bit cp.async (LDGSTS .128)",
            # The Hopper kernel (wgmma, no ldmatrix) is the `prefill_sm90` rule's.
            exclude=("prefill_sm90",),
            require=(
                Need("LDSM (ldmatrix)", r"^LDSM(?:\.|$)"),
                Need("HMMA (mma.sync)", r"^HMMA(?:\.|$)"),
                Need("LDGSTS .128 (16-byte cp.async)", LDGSTS_128),
            ),
        ),
        Rule(
            name="prefill_sm90",
            match="batch_prefill_sm90_kernel",
            description="the Hopper prefill kernel (prefill_sm90_kernel.cuh): no spills, wgmma "
            "(HGMMA) fed by 128-bit cp.async (LDGSTS .128), the proxy fence before the MMAs "
            "read what the copies wrote (FENCE.VIEW.ASYNC.S)",
            # Registered as a ctest only in builds with CUTLASS (the kernel needs its headers).
            default=False,
            require=WGMMA_FROM_CP_ASYNC,
            # The kernels wait for their wgmma groups 2-5 times for 16-32 HGMMA; a serialized
            # pipeline waits after every one (session 39 saw 24 for 24).
            limits=(NOT_SERIALIZED_WGMMA,),
        ),
        Rule(
            name="prefill_sm90_ws",
            match="batch_prefill_sm90_kernel",
            description="the Hopper prefill kernel's warp-specialized instances (its kWs template "
            "flag set, the overlapped ones included): the producer's copies arriving on mbarriers (ARRIVES.LDGSTSBAR), the math "
            "warpgroups' waits (SYNCS.PHASECHK) and releases (SYNCS.ARRIVE), the registers moved "
            "by setmaxnreg both ways (USETMAXREG), no spills",
            default=False,
            # (template flags ..., kPingPong, kWs, kOverlap, kMultiItem: the overlapped form is
            # warp-specialized)
            name_regex=r"batch_prefill_sm90_kernel<.*, (?:true|false), true, (?:true|false), "
            r"(?:true|false)>",
            require=(
                Need("ARRIVES.LDGSTSBAR (cp.async.mbarrier.arrive)", r"^ARRIVES\.LDGSTSBAR(?:\.|$)"),
                Need("SYNCS.PHASECHK (mbarrier.try_wait)", r"^SYNCS\.PHASECHK(?:\.|$)"),
                Need("SYNCS.ARRIVE (mbarrier.arrive)", r"^SYNCS\.ARRIVE(?:\.|$)"),
                Need("USETMAXREG.DEALLOC (setmaxnreg.dec)", r"^USETMAXREG\.DEALLOC(?:\.|$)"),
                Need("USETMAXREG.TRY_ALLOC (setmaxnreg.inc)", r"^USETMAXREG\.TRY_ALLOC(?:\.|$)"),
            ),
        ),
        Rule(
            name="prefill_sm90_overlap",
            match="batch_prefill_sm90_kernel",
            description="the Hopper prefill kernel's overlapped instances (kWs and kOverlap set): "
            "each tile's softmax under the next S and the previous P V products, i.e. the "
            "exponentials (MUFU.EX2) between a wgmma group's issue and its wait in every stage "
            "that has products (6 inlined: the first, three in and after the loop of pairs, the "
            "last two), no spills, no serialized wgmma",
            default=False,
            name_regex=r"batch_prefill_sm90_kernel<.*, true, true, (?:true|false)>",
            require=WGMMA_FROM_CP_ASYNC,
            limits=(NOT_SERIALIZED_WGMMA,),
            # 64-key tiles: 32 exponentials a thread a tile (and the rescale's 2).
            under_wgmma=(Under("MUFU.EX2 (the softmax's exponentials)", r"^MUFU\.EX2(?:\.|$)", 32,
                               6),),
        ),
        Rule(
            name="prefill_sm90_multi_item",
            match="batch_prefill_sm90_kernel",
            description="the Hopper prefill kernel's multi-item scoring instances (kMultiItem set, "
            "the plain schedule: prefill_sm90_multi_item.cu, 4 of them), there at all: no spills, "
            "wgmma (HGMMA) fed by 128-bit cp.async (LDGSTS .128) and the proxy fence, no "
            "serialized wgmma",
            default=False,
            # (template flags ..., kPingPong, kWs, kOverlap, kMultiItem)
            name_regex=r"batch_prefill_sm90_kernel<.*, false, false, false, true>",
            require=WGMMA_FROM_CP_ASYNC,
            limits=(NOT_SERIALIZED_WGMMA,),
        ),
        Rule(
            name="mla_sm90",
            match="mla_sm90_kernel",
            description="the Hopper MLA decode kernel (mla_sm90_kernel.cuh): no spills, wgmma "
            "(HGMMA) fed by 128-bit cp.async (LDGSTS .128), the proxy fence before the MMAs read "
            "what the copies wrote (FENCE.VIEW.ASYNC.S)",
            # Registered as a ctest only in builds with CUTLASS (the kernel needs its headers).
            default=False,
            require=WGMMA_FROM_CP_ASYNC,
            # Two waits a tile for 20 HGMMA; a serialized pipeline waits after every one.
            limits=(NOT_SERIALIZED_WGMMA,),
        ),
        Rule(
            name="mla_mma",
            match="mla_decode_mma_kernel",
            description="tensor-core MLA decode (mla_decode_mma_kernel): no spills, ldmatrix "
            "(LDSM), mma.sync (HMMA), 128-bit cp.async (LDGSTS .128); the `decode` rule applies "
            "to it too (its name holds `decode`)",
            require=(
                Need("LDSM (ldmatrix)", r"^LDSM(?:\.|$)"),
                Need("HMMA (mma.sync)", r"^HMMA(?:\.|$)"),
                Need("LDGSTS .128 (16-byte cp.async)", LDGSTS_128),
            ),
        ),
        Rule(
            name="grouped_gemm",
            match="grouped_mma_kernel",
            description="tensor-core grouped GEMM (grouped_mm_bf16/fp8, SegmentGEMMWrapper.run): "
            "no spills, ldmatrix (LDSM), mma.sync (HMMA), 128-bit cp.async (LDGSTS .128)",
            # grouped_mm_simple_kernel, the CUDA-core fallback for strided operands, is not
            # matched (no tensor cores by design).
            require=(
                Need("LDSM (ldmatrix)", r"^LDSM(?:\.|$)"),
                Need("HMMA (mma.sync)", r"^HMMA(?:\.|$)"),
                Need("LDGSTS .128 (16-byte cp.async)", LDGSTS_128),
            ),
        ),
        Rule(
            name="cutlass",
            match="device_kernel",
            description="CUTLASS's sm90 grouped GEMM (the grouped GEMMs on Hopper, "
            "grouped_gemm_cutlass*.cu): no spills, wgmma (HGMMA for bf16, QGMMA for fp8) fed by "
            "TMA loads (UTMALDG)",
            # cutlass::device_kernel<GemmKernel> names only these kernels in the library (one per
            # instance); the prep kernels (cutlass_group_prep_kernel) are not matched. Registered
            # as a ctest only in builds with CUTLASS.
            default=False,
            require=(
                Need("HGMMA or QGMMA (wgmma)", r"^[HQ]GMMA(?:\.|$)"),
                Need("UTMALDG (TMA load)", r"^UTMALDG(?:\.|$)"),
            ),
            # 2 waits for 8 HGMMA (bf16), 5 for 8 QGMMA (fp8: its accumulator promotions); a
            # serialized pipeline waits after each.
            limits=(AtMost("wgmma waits (WARPGROUP.DEPBAR) per HGMMA / QGMMA: serialized wgmma",
                           r"^WARPGROUP\.DEPBAR(?:\.|$)", r"^[HQ]GMMA(?:\.|$)", 0.75),),
        ),
        Rule(
            name="moe_grouped",
            match=(
                "moe_count_kernel",
                "moe_offsets_kernel",
                "moe_scatter_kernel",
                "moe_gather_kernel",
                "moe_activation_kernel",
                "bf16_moe_grouped_finalize_kernel",
                "bf16_moe_permuted_out_kernel",
                "cutlass_fp8_grouped_activation_kernel",
                "cutlass_fp8_block_gather_kernel",
                "cutlass_fp8_block_activation_kernel",
            ),
            description="the fused MoE's grouped route around the grouped GEMM (permutation "
            "passes, activation gather, bias + activation; trtllm_bf16_moe's activation, "
            "finalize and permuted output; cutlass_fused_moe FP8 per tensor's bias + activation "
            "+ e4m3 cast; DeepSeek block scale's 1x128 quantizing gather and activation): no "
            "spills",
        ),
        Rule(
            name="gdn",
            match=("gdn_recurrent_kernel", "kda_recurrent_kernel"),
            description="the gated delta rule's recurrent kernels (gdn_cuda.cu, every io / state "
            "dtype and row width; kda_cuda.cu, Kimi delta attention): no spills (a state row "
            "stays in registers across the tokens), the k sums as warp butterflies (SHFL.BFLY)",
            require=(Need("SHFL.BFLY (warp butterfly reduction)", r"^SHFL\.BFLY(?:\.|$)"),),
        ),
        Rule(
            name="gdn_chunked",
            match="gdn_chunked_prefill_kernel",
            description="the gated delta rule's chunked prefill (gdn_chunk_cuda.cu, every io dtype "
            "and head dim): no spills (the state's fp32 tiles stay in registers across the "
            "chunks), ldmatrix (LDSM, also transposed: LDSM .MT88), mma.sync (HMMA), 128-bit "
            "cp.async (LDGSTS .128) of the Q / K / V tiles, 128-bit output stores (STG .128); "
            "no 16-bit global loads (q, k, v arrive by cp.async only)",
            require=(
                Need("LDSM (ldmatrix)", r"^LDSM(?:\.|$)"),
                Need("LDSM .MT88 (ldmatrix .trans)", r"^LDSM" + _MOD + r"\.MT88(?:\.|$)"),
                Need("HMMA (mma.sync)", r"^HMMA(?:\.|$)"),
                Need("LDGSTS .128 (16-byte cp.async)", LDGSTS_128),
                Need("STG .128 (16-byte store)", r"^STG" + _MOD + r"\.128(?:\.|$)"),
            ),
            forbid=(Forbid("16-bit global load", LOAD_16),),
        ),
        Rule(
            name="monomoe",
            match=("monomoe_up_kernel", "monomoe_down_kernel"),
            description="MonoMoE's projection kernels (monomoe_cuda.cu: up projection, down "
            "projection and combine; not monomoe_route_quant_kernel, whose one thread a token "
            "keeps the routing's 32 lane sums and chosen-expert mask in a 160-byte frame): no "
            "spills, the exact integer dot products as warp butterflies (SHFL.BFLY)",
            require=(Need("SHFL.BFLY (warp butterfly reduction)", r"^SHFL\.BFLY(?:\.|$)"),),
        ),
        Rule(
            name="monomoe_down",
            match=("monomoe_down_kernel",),
            description="MonoMoE's down projection (monomoe_down_kernel): each expert's weight row "
            "read 16 bytes a lane (LDG .128)",
            require=(Need("LDG .128 (16-byte load)", LDG_128),),
        ),
        Rule(
            name="moe_sm90_mixed",
            match=("mixed_gemm1_kernel", "mixed_gemm2_kernel"),
            description="cutlass_fused_moe's SM90 mixed-input GEMV kernels (moe_cuda.cu: W4A16 "
            "MXFP4 and Humming, per pair and tiled): no spills, the SM90-interleaved weights read "
            "16 bytes a lane (LDG .128)",
            require=(Need("LDG .128 (16-byte load)", LDG_128),),
        ),
        Rule(
            name="mhc",
            match=("mhc_post_kernel", "mhc_pre_kernel"),
            description="DeepSeek-V4's hyper-connection kernels (mhc_cuda.cu: mhc_post, "
            "mhc_pre_big_fuse and its prenorm form): no spills, 128-bit global loads (LDG .128)",
            require=(Need("LDG .128 (16-byte load)", LDG_128),),
        ),
        Rule(
            name="comm",
            match=("allreduce_fusion_kernel", "dcp_a2a_sync_kernel",
                   "moe_a2a_dispatch_signal_kernel", "moe_a2a_combine_signal_kernel",
                   "ulysses_a2a_kernel", "quantized_all_reduce_kernel",
                   "quantized_all_reduce_x8_kernel", "mixed_comm_sync_kernel"),
            description="the collectives' synchronizing kernels (comm_cuda.cu: allreduce_fusion "
            "and the PCIe all-reduce, the decode-CP all-to-all's publish-and-wait; "
            "mixed_comm_cuda.cu: run_mixed_comm's publish-and-wait; "
            "moe_a2a_cuda.cu: the MoE all-to-all's dispatch and combine signals; ulysses_cuda.cu: "
            "the Ulysses all-to-all's barriers around its pushes; quantized_allreduce_cuda.cu: "
            "the quantized all-reduce's three per-block barriers): no spills, "
            "the call published by a system-scope release (STG.E.STRONG.SYS after a MEMBAR.*.SYS) "
            "and the peers' calls read by system-scope acquires (LDG.E.STRONG.SYS)",
            require=(
                Need("MEMBAR .SYS (system-scope fence)", r"^MEMBAR" + _MOD + r"\.SYS(?:\.|$)"),
                Need("STG.E.STRONG.SYS (system-scope flag store)", r"^STG" + _MOD + r"\.STRONG\.SYS(?:\.|$)"),
                Need("LDG.E.STRONG.SYS (system-scope flag load)", r"^LDG" + _MOD + r"\.STRONG\.SYS(?:\.|$)"),
            ),
        ),
        Rule(
            name="quantized_ar",
            match="quantized_all_reduce_x8_kernel",
            description="the quantized all-reduce's 16-byte-lane kernel (quantized_allreduce_cuda.cu: "
            "groups a whole number of 8 elements, 16-byte aligned tensors): no spills, 128-bit "
            "global loads of the bf16 input and stores of the output (LDG .128, STG .128)",
            require=(Need("LDG .128 (16-byte load)", LDG_128),
                     Need("STG .128 (16-byte store)", r"^STG" + _MOD + r"\.128(?:\.|$)")),
        ),
        Rule(
            name="moe_a2a",
            match=("moe_a2a_combine_sum_kernel", "moe_a2a_copy_kernel",
                   "moe_a2a_combine_prepare_kernel"),
            description="the MoE all-to-all's data kernels (moe_a2a_cuda.cu: the combine's sum "
            "for every top_k and region dtype, the dispatch's row copy, the combine's staging): "
            "no spills, 128-bit global loads (LDG .128: the peers' rows a slot at 16 bytes, the "
            "copies where aligned)",
            require=(Need("LDG .128 (16-byte load)", LDG_128),),
        ),
        Rule(
            name="ssu",
            match="ssu_kernel",
            description="the Mamba selective state update kernel (ssu_cuda.cu; every state dtype "
            "and row width): no spills (a state row stays in registers across the tokens), the "
            "dot with C as a warp butterfly (SHFL.BFLY)",
            require=(Need("SHFL.BFLY (warp butterfly reduction)", r"^SHFL\.BFLY(?:\.|$)"),),
        ),
    )
}


@dataclasses.dataclass
class Kernel:
    arch: str
    mangled: str
    elf: int  # which ELF image (translation unit, architecture) of the binary it is in
    opcodes: list = dataclasses.field(default_factory=list)
    res: dict = dataclasses.field(default_factory=dict)  # REG, STACK, SHARED, LOCAL
    name: str = ""  # demangled
    base: str = ""  # bare function name


# ---- finding cuobjdump ---------------------------------------------------------------------------


def pypi_bin_dirs():
    """bin/ folders of PyPI's nvidia-cuda-* packages: nvidia/cu13/bin (13.x wheels),
    nvidia/cuda_cuobjdump/bin (12.x wheels), for this interpreter's `nvidia` namespace package."""
    dirs = []
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    # scripts/bootstrap installs them for Debian's /usr/bin/python3; another interpreter (a
    # virtual environment, pyenv) does not see that one's packages, so look there as well.
    roots += sorted(glob.glob("/usr/local/lib/python3*/dist-packages/nvidia"), reverse=True)
    roots += ["/usr/lib/python3/dist-packages/nvidia"]
    for root in roots:
        try:
            subs = sorted(os.listdir(root), reverse=True)  # cu13 before cu12
        except OSError:
            continue
        for sub in subs:
            d = os.path.join(root, sub, "bin")
            if os.path.isdir(d):
                dirs.append(d)
    return dirs


def find_tool(tool, explicit=None, extra_dirs=()):
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    env = os.environ.get(tool.upper())
    if env and os.access(env, os.X_OK):
        return env
    found = shutil.which(tool)
    if found:
        return found
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    dirs = list(extra_dirs) + ([os.path.join(cuda_home, "bin")] if cuda_home else [])
    dirs += ["/usr/local/cuda/bin"] + pypi_bin_dirs()
    for d in dirs:
        p = os.path.join(d, tool)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


# ---- parsing cuobjdump -sass -res-usage ----------------------------------------------------------

_ARCH_HDR = re.compile(r"^arch = (sm_\w+)")
_CODE_FOR = re.compile(r"^\s*code for (sm_\w+)")
_RES_FN = re.compile(r"^\s*Function (\S+):\s*$")
_RES_VALS = re.compile(r"\b(REG|STACK|SHARED|LOCAL):(\d+)")
_SASS_FN = re.compile(r"^\s*Function : (\S+)")
_INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_PRED = re.compile(r"^@!?U?P(?:T|\d+)\s+")


def parse_cuobjdump(lines):
    """Kernels from `cuobjdump -sass -res-usage` output. Each ELF image ("Fatbin elf code:", or
    the one image of a .cubin) prints its resource usage and then its SASS, and names its
    architecture in the header ("arch = sm_90", for a fat binary) or before the SASS ("code for
    sm_90a"), so the usage is attached to the kernel at the end of its image."""
    kernels = []
    elf = 0
    arch = None
    res = {}  # mangled -> usage, for the current image
    cur = None
    pending_res = None
    image_kernels = []

    def close_image():
        for k in image_kernels:
            k.res = res.get(k.mangled, {})
            k.arch = k.arch or arch

    for line in lines:
        if line.startswith("Fatbin elf code:") or line.startswith("Fatbin ptx code:"):
            close_image()
            elf += 1
            arch, res, cur, pending_res, image_kernels = None, {}, None, None, []
            continue
        m = _ARCH_HDR.match(line)
        if m:
            arch = m.group(1)
            continue
        m = _CODE_FOR.match(line)
        if m:
            arch = m.group(1)
            continue
        m = _SASS_FN.match(line)
        if m:
            cur = Kernel(arch=arch, mangled=m.group(1), elf=elf)
            kernels.append(cur)
            image_kernels.append(cur)
            continue
        m = _RES_FN.match(line)
        if m:
            pending_res = m.group(1)
            continue
        if pending_res is not None:
            vals = dict((k, int(v)) for k, v in _RES_VALS.findall(line))
            if vals:
                res[pending_res] = vals
            pending_res = None
            continue
        if cur is not None:
            m = _INSN.match(line)
            if m:
                insn = _PRED.sub("", m.group(1))
                cur.opcodes.append(insn.split(None, 1)[0] if insn else "")
    close_image()
    return kernels


def elf_archs(cuobjdump, binary):
    """Architectures of the ELF images in `binary` (`cuobjdump -lelf`: "ELF file 1:
    x.1.sm_90.cubin"); [] when it holds no device code. Raises RuntimeError on cuobjdump's error."""
    p = subprocess.run([cuobjdump, "-lelf", binary], capture_output=True, text=True, errors="replace")
    if "does not contain device code" in p.stdout + p.stderr:
        return []
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip() or "cuobjdump -lelf exited with %d" % p.returncode)
    return re.findall(r"\.(sm_\w+)\.cubin\s*$", p.stdout, re.M)


def cached_cuobjdump(cuobjdump, binary, arch, cache):
    """run_cuobjdump(cuobjdump, binary, arch) through the text file `cache`: read back when its
    first line names this binary (absolute path, size, modification time) and arch, else written
    anew (to a temporary name, then renamed, so that a concurrent reader sees a whole file)."""
    st = os.stat(binary)
    key = "# check_sass cache: %s %d %d %s\n" % (os.path.abspath(binary), st.st_size, st.st_mtime_ns, arch)
    # The parsed and demangled kernels beside the text (pickle, same key): parsing the library's
    # text (hundreds of MB) took each ctest rule case about 7 s of its 8.
    parsed = cache + ".pickle"
    try:
        with open(parsed, "rb") as f:
            got = pickle.load(f)
        if got[0] == key:
            return got[1]
    except (OSError, EOFError, pickle.UnpicklingError, IndexError, TypeError, AttributeError):
        pass

    def keep(kernels):
        name_kernels(kernels)
        tmp = "%s.%d.tmp" % (parsed, os.getpid())
        with open(tmp, "wb") as f:
            pickle.dump((key, kernels), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, parsed)
        return kernels

    try:
        with open(cache, errors="replace") as f:
            if f.readline() == key:
                return keep(parse_cuobjdump(f))
    except OSError:
        pass
    cmd = [cuobjdump, "-sass", "-res-usage", "-arch", arch, binary]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if "does not contain device code" in p.stderr:
        return []
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip() or "cuobjdump exited with %d" % p.returncode)
    tmp = "%s.%d.tmp" % (cache, os.getpid())
    with open(tmp, "w") as f:
        f.write(key)
        f.write(p.stdout)
    os.replace(tmp, cache)
    return keep(parse_cuobjdump(io.StringIO(p.stdout)))


def run_cuobjdump(cuobjdump, binary, arch=None):
    """The kernels of `binary` (only the images for `arch` and its a/f variants, when given: half
    the time on the library, which also holds sm_80), or raises RuntimeError with cuobjdump's
    message."""
    cmd = [cuobjdump, "-sass", "-res-usage"] + (["-arch", arch] if arch else []) + [binary]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    kernels = parse_cuobjdump(proc.stdout)
    err = proc.stderr.read()
    rc = proc.wait()
    if "does not contain device code" in err:
        return []
    if rc != 0:
        raise RuntimeError(err.strip() or "cuobjdump exited with %d" % rc)
    return kernels


# ---- names ---------------------------------------------------------------------------------------


def demangle(names):
    names = list(names)
    filt = shutil.which("c++filt")
    if not filt or not names:
        return dict((n, n) for n in names)
    out = subprocess.run([filt], input="\n".join(names) + "\n", capture_output=True, text=True)
    got = out.stdout.splitlines()
    if out.returncode != 0 or len(got) != len(names):
        return dict((n, n) for n in names)
    return dict(zip(names, got))


def _name_start(demangled):
    """Index in `demangled` where the bare function name starts, and the bare name: every
    bracketed part (template arguments, parameters, `(anonymous namespace)`) is skipped, then
    the return type and the scopes are taken away."""
    depth = 0
    top = []  # (index, character) outside brackets
    for i, ch in enumerate(demangled):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}" and depth > 0:
            depth -= 1
        elif depth == 0:
            top.append((i, ch))
    text = "".join(ch for _, ch in top)
    cut = max(text.rfind(" ") + 1, text.rfind("::") + 2 if "::" in text else 0)
    if cut >= len(text):
        return 0, demangled
    start = top[cut][0]
    end = start
    while end < len(demangled) and demangled[end] not in "<(":
        end += 1
    return start, demangled[start:end]


def base_name(demangled):
    """`void ns::k<128, (E)0>(P)` -> `k`."""
    return _name_start(demangled)[1] or demangled


def name_kernels(kernels):
    """Fills each kernel's demangled name and bare name (once: a cached parse keeps them)."""
    todo = [k for k in kernels if not k.name]
    names = demangle(sorted(set(k.mangled for k in todo)))
    for k in todo:
        k.name = names.get(k.mangled, k.mangled)
        k.base = base_name(k.name)


def short_name(demangled, width=80):
    """`void ns::k<128, (E)0>(P)` -> `k<128, (E)0>`: without scopes, return type, parameters."""
    s = demangled
    if s.endswith(")"):  # the parameter list: from its matching "(" on
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i]
                break
    s = s[_name_start(demangled)[0] :]
    return s if len(s) <= width else s[: width - 3] + "..."


# ---- checks --------------------------------------------------------------------------------------


def has_local_memory(k):
    """Spills, as ptxas -v counts them ("N bytes spill stores"), are not in the binary; what is:
    - STL / LDL instructions: stores to and loads from thread-local memory, which is where both
      register spills and local arrays (indexed dynamically, too large) live;
    - STACK: the stack frame in bytes (ptxas's "bytes stack frame"): spill slots, local arrays,
      and the frames of real (not inlined) function calls;
    - LOCAL: statically allocated local memory outside the stack (normally 0).
    A kernel without spills has none of the three. Returns the list of findings."""
    found = []
    counts = collections.Counter(op.split(".", 1)[0] for op in k.opcodes)
    for op in ("STL", "LDL"):
        if counts[op]:
            found.append("%s x%d" % (op, counts[op]))
    for key in ("STACK", "LOCAL"):
        if k.res.get(key, 0):
            found.append("%s %d" % (key, k.res[key]))
    return found


def forms(k, pattern):
    rx = re.compile(pattern)
    return collections.Counter(op for op in k.opcodes if rx.search(op))


# Opcodes that end a straight-line stretch of SASS (control transfers, barriers, convergence).
_CONTROL = re.compile(r"^(?:BRA|BRX|JMP|JMX|CALL|RET|EXIT|BAR|BSSY|BSYNC|WARPSYNC|KILL)(?:\.|$)")


def longest_run(k, pattern):
    """The most opcodes matching `pattern` within one straight-line stretch of k's code."""
    rx = re.compile(pattern)
    best = cur = 0
    for op in k.opcodes:
        if _CONTROL.search(op):
            cur = 0
        elif rx.search(op):
            cur += 1
            best = max(best, cur)
    return best


def fmt_forms(c):
    return ", ".join(("%s x%d" % (op, n)) for op, n in sorted(c.items()))


def check_kernel(k, rule, flags):
    """(ok, problems, notes) of kernel k under rule."""
    problems, notes = [], []
    if rule.no_local:
        local = has_local_memory(k)
        if local:
            problems.append("spills/local memory: " + ", ".join(local))
    for need in rule.require:
        have = forms(k, need.pattern)
        if have and need.run > 1:
            run = longest_run(k, need.pattern)
            if run < need.run:
                problems.append(
                    "missing %s: at most %d in a row (%s)" % (need.label, run, fmt_forms(have))
                )
                continue
            notes.append("%s, %d in a row" % (fmt_forms(have), run))
            continue
        if have:
            notes.append(fmt_forms(have))
            continue
        if need.weaker:
            wlabel, wpat = need.weaker
            weak = forms(k, wpat)
            if weak and need.weaker_flag in flags:
                notes.append("%s (weaker form, accepted by %s)" % (fmt_forms(weak), need.weaker_flag))
                continue
            if weak:
                problems.append(
                    "missing %s; has only %s (%s)" % (need.label, wlabel, fmt_forms(weak))
                )
                continue
        problems.append("missing " + need.label)
    for fb in rule.forbid:
        bad = forms(k, fb.pattern)
        if bad:
            problems.append("forbidden %s: %s" % (fb.label, fmt_forms(bad)))
    for under in rule.under_wgmma:
        rx = re.compile(under.pattern)
        counts, cur = [], None
        for op in k.opcodes:
            if op.startswith("HGMMA"):
                cur = 0 if cur is None else cur
            elif op.startswith("WARPGROUP.DEPBAR"):
                if cur is not None:
                    counts.append(cur)
                cur = None
            elif cur is not None and rx.search(op):
                cur += 1
        ok = sum(1 for c in counts if c >= under.at_least)
        if ok < under.groups:
            problems.append("%s under the wgmma products: %d of %d groups have %d or more before "
                            "their wait (want %d; per group: %s)" % (
                                under.label, ok, len(counts), under.at_least, under.groups,
                                counts))
        else:
            notes.append("%d of %d wgmma groups with %d+ %s before their wait" % (
                ok, len(counts), under.at_least, under.label))
    for lim in rule.limits:
        num = sum(forms(k, lim.pattern).values())
        den = sum(forms(k, lim.per).values())
        if den and num > lim.ratio * den:
            problems.append("too many %s: %d for %d (at most %g each)" % (lim.label, num, den,
                                                                           lim.ratio))
    return (not problems), problems, notes


def match_subs(rule, match=None):
    """The name substrings that select a rule's kernels: --match, else the rule's own."""
    m = match or rule.match
    return (m,) if isinstance(m, str) else tuple(m)


def select(kernels, rule, match=None, extra_exclude=()):
    subs = [m.lower() for m in match_subs(rule, match)]
    excl = [e.lower() for e in tuple(rule.exclude) + tuple(extra_exclude)]
    out = []
    for k in kernels:
        b = k.base.lower()
        if any(m in b for m in subs) and not any(e in b for e in excl):
            if rule.name_regex is None or re.search(rule.name_regex, k.name):
                out.append(k)
    return out


def arch_ok(kernel_arch, want):
    """sm_90a (and sm_90f) images are sm_90 code: they count for --arch sm_90."""
    return kernel_arch == want or (
        kernel_arch is not None and kernel_arch.startswith(want) and kernel_arch[len(want) :] in ("a", "f")
    )


def usage_cols(k):
    return "regs %3s  stack %4s  local %3s  shared %6s  STL/LDL %d" % (
        k.res.get("REG", "?"),
        k.res.get("STACK", "?"),
        k.res.get("LOCAL", "?"),
        k.res.get("SHARED", "?"),
        sum(1 for op in k.opcodes if op.split(".", 1)[0] in ("STL", "LDL")),
    )


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Static SASS checks of compiled CUDA kernels (see the module docstring).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="rules:\n"
        + "\n".join(
            "  %-8s %s%s" % (r.name, r.description, "" if r.default else " [only with --rule]")
            for r in RULES.values()
        ),
    )
    ap.add_argument("binary")
    ap.add_argument("--rule", action="append", choices=sorted(RULES), help="rule(s) to check")
    ap.add_argument("--arch", default="sm_90", help="SASS architecture checked (default sm_90)")
    ap.add_argument("--match", help="check the kernels whose name contains this instead")
    ap.add_argument("--exclude", action="append", default=[], help="leave out kernels with this in their name")
    ap.add_argument(
        "--allow-ldg128",
        action="store_true",
        help="accept 128-bit LDG in place of 128-bit LDGSTS (cp.async)",
    )
    ap.add_argument("--cuobjdump", help="path of cuobjdump (default: PATH, the toolkit, PyPI's package)")
    ap.add_argument("--toolkit-bin", action="append", default=[], help="another folder to look in for cuobjdump")
    ap.add_argument("--sass-cache", help="keep cuobjdump's text for --arch in this file and reuse it")
    ap.add_argument("--list", action="store_true", help="list the kernels and their resource usage only")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each kernel's full demangled name")
    a = ap.parse_args(argv)
    flags = {"--allow-ldg128"} if a.allow_ldg128 else set()

    cuobjdump = find_tool("cuobjdump", a.cuobjdump, a.toolkit_bin)
    if not cuobjdump:
        print(
            "check_sass: cuobjdump not found (PATH, /usr/local/cuda/bin, PyPI's nvidia-cuda-cuobjdump); "
            "run scripts/bootstrap, which installs nvidia-cuda-cuobjdump",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not os.path.isfile(a.binary):
        print("check_sass: no such file: %s" % a.binary, file=sys.stderr)
        return EXIT_USAGE
    try:
        archs = sorted(set(elf_archs(cuobjdump, a.binary)))
        if not archs:
            print("check_sass: %s holds no device code (SASS)" % a.binary)
            return EXIT_FAIL
        if not any(arch_ok(x, a.arch) for x in archs):
            print("check_sass: no %s SASS in %s (it holds %s): skipped" % (a.arch, a.binary, ", ".join(archs)))
            return EXIT_SKIP
        if a.sass_cache:
            dumped = cached_cuobjdump(cuobjdump, a.binary, a.arch, a.sass_cache)
        else:
            dumped = run_cuobjdump(cuobjdump, a.binary, a.arch)
        kernels = [k for k in dumped if arch_ok(k.arch, a.arch)]
        if not kernels:  # cuobjdump's -arch did not select the image: read them all
            kernels = [k for k in run_cuobjdump(cuobjdump, a.binary) if arch_ok(k.arch, a.arch)]
    except RuntimeError as e:
        print("check_sass: %s: %s" % (cuobjdump, e), file=sys.stderr)
        return EXIT_USAGE
    if not kernels:
        print("check_sass: %s holds %s images but no kernel in them" % (a.binary, a.arch))
        return EXIT_FAIL
    name_kernels(kernels)
    print("check_sass: %s, %s SASS (%s), %d kernels, cuobjdump %s" % (
        a.binary, a.arch, ", ".join(sorted(set(k.arch for k in kernels))), len(kernels), cuobjdump))

    if a.list:
        for k in sorted(kernels, key=lambda k: (k.base, k.name, k.arch)):
            print("  %-7s %s  %s" % (k.arch, usage_cols(k), k.name if a.verbose else short_name(k.name)))
        return EXIT_OK

    rules = [RULES[r] for r in a.rule] if a.rule else [r for r in RULES.values() if r.default]
    failed = 0
    summary = []
    for rule in rules:
        sel = select(kernels, rule, a.match, a.exclude)
        what = "' or '".join(match_subs(rule, a.match))
        print("rule %s: %s" % (rule.name, rule.description))
        if not sel:
            print("  FAIL  no %s kernel found (no %s kernel name contains '%s')" % (what, a.arch, what))
            summary.append("rule %s: no %s kernel found" % (rule.name, what))
            failed += 1
            continue
        n_bad = 0
        for k in sorted(sel, key=lambda k: (k.base, k.name, k.arch)):
            ok, problems, notes = check_kernel(k, rule, flags)
            n_bad += not ok
            has = ("  [%s]" % "; ".join(notes)) if notes and ok else ""
            print("  %s  %-7s %s  %s%s" % ("ok  " if ok else "FAIL", k.arch, usage_cols(k),
                                             k.name if a.verbose else short_name(k.name), has))
            for p in problems:
                print("          - " + p)
            if notes and not ok and a.verbose:
                print("          has " + "; ".join(notes))
        summary.append("rule %s: %d kernels, %d pass, %d fail" % (rule.name, len(sel), len(sel) - n_bad, n_bad))
        failed += n_bad
    print("summary: " + "; ".join(summary) + (" -> FAIL" if failed else " -> pass"))
    return EXIT_FAIL if failed else EXIT_OK


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `check_sass.py --list LIB | head`
        sys.stderr.close()
        sys.exit(EXIT_OK)
