// Torch-written dumps in upstream's format of the block-scaled grouped GEMMs that
// test_grouped_gemm.cpp replays in memory only: group_gemm_mxfp8_mxfp4_nt_groupwise,
// group_gemm_nvfp4_nt_groupwise and moe_gemm_mxfp8_nt_groupwise. torch 1.13 has no fp8 / fp4
// dtypes: fp8 tensors are pickled as torch >= 2.1 writes float8_e4m3fn (kTorchSavePy), packed
// fp4 as uint8 and packed UE8M0 as the int32 words upstream's records hold. Expected outputs:
// torch in fp32 over the dequantized operands, as upstream's test references compute them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "flashinfer/replay.h"
#include "util/upstream_dump_py.h"

namespace flashinfer::testing {
namespace {

TEST(GroupedGemmFp4Dumps, UpstreamFormatDumpsReplay) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("fi_grouped_fp4_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string py = std::string(kTorchSavePy) + R"PY(
import os
d = sys.argv[1]
seq = [0]
def record(name, module, inputs, meta, outputs):
    seq[0] += 1
    call = "%s/20261122_233000_%03d_pid4242_%s_call%04d" % (d, seq[0], name, seq[0])
    os.makedirs(call)
    save(inputs, call + "/inputs.pt")
    save(outputs, call + "/outputs.pt")
    rec = {"function_name": name, "module": module, "call_sequence": seq[0],
           "timestamp": "20261122_233000_%03d" % seq[0], "process_id": 4242,
           "input_metadata": meta, "output_metadata": {},
           "tensor_info": {"input_tensor_keys": list(inputs), "output_tensor_keys": list(outputs)},
           "tensor_format": "torch", "execution_status": "completed"}
    with open(call + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")

def e4m3_value(c):
    s = -1.0 if c & 0x80 else 1.0
    e, m = (c >> 3) & 0xF, c & 7
    if e == 0xF and m == 7: return float("nan")
    return s * (m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
E4M3 = torch.tensor([e4m3_value(c) for c in range(256)])
E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
def ue8m0(c): return torch.pow(2.0, c.double() - 127).float()
def fp8_codes(shape):  # finite e4m3 codes, |x| in [2^-3, 2^3]
    c = torch.randint(0x20, 0x50, shape, dtype=torch.uint8)
    return c | (torch.randint(0, 2, shape, dtype=torch.uint8) << 7)
def fp4_unpack(p):  # [.., k/2] bytes -> [.., k] values, low nibble first
    lo, hi = (p & 15).long(), (p >> 4).long()
    return torch.stack([E2M1[lo], E2M1[hi]], -1).reshape(*p.shape[:-1], p.shape[-1] * 2)
def swizzle(codes):  # [rows, cols] (rows % 128 == 0, cols % 4 == 0) -> 128x4 swizzled bytes
    rows, cols = codes.shape
    return codes.view(rows // 128, 4, 32, cols // 4, 4).permute(0, 3, 2, 1, 4).reshape(rows, cols)
BF16 = {"type": "torch.dtype", "value": "torch.bfloat16"}
GB = "flashinfer.gemm.gemm_base"

torch.manual_seed(0)
E, TOPK, NT = 8, 2, 6
ids = torch.stack([torch.randperm(E)[:TOPK] for _ in range(NT)])
counts = torch.bincount(ids.flatten(), minlength=E)
cnt4 = (counts + 3) // 4 * 4  # the padded-scale ops need group starts at multiples of 4
ip4 = torch.cat([torch.zeros(1, dtype=torch.long), cnt4.cumsum(0)]).to(torch.int32)
cm = int(ip4[-1])
K, N = 256, 64
NP = (N + 127) // 128 * 128

def padded_a_scale(codes):  # [cm, cols] -> each group's rows padded to 128, swizzled alone
    blocks = []
    for e in range(E):
        s0, s1 = int(ip4[e]), int(ip4[e + 1])
        rows = (s1 - s0 + 127) // 128 * 128
        if rows:
            p = torch.zeros(rows, codes.shape[1], dtype=torch.uint8)
            p[: s1 - s0] = codes[s0:s1]
            blocks.append(swizzle(p))
    return torch.cat(blocks)
def padded_b_scale(codes):  # [E, N, cols] -> [E, NP, cols], each expert swizzled
    p = torch.zeros(E, NP, codes.shape[2], dtype=torch.uint8)
    p[:, :N] = codes
    return torch.stack([swizzle(p[e]) for e in range(E)])

# 1. group_gemm_mxfp8_mxfp4_nt_groupwise: MXFP8 a, MXFP4 b, UE8M0 scales of 32.
ac = fp8_codes((cm, K))
bp = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8)
sa = torch.randint(122, 131, (cm, K // 32), dtype=torch.uint8)
sb = torch.randint(122, 131, (E, N, K // 32), dtype=torch.uint8)
ad = E4M3[ac.long()] * ue8m0(sa).repeat_interleave(32, 1)
bd = fp4_unpack(bp) * ue8m0(sb).repeat_interleave(32, 2)
ref = torch.zeros(cm, N)
for e in range(E):
    s0, s1 = int(ip4[e]), int(ip4[e + 1])
    ref[s0:s1] = ad[s0:s1] @ bd[e].T
record("group_gemm_mxfp8_mxfp4_nt_groupwise", GB,
       {"arg_0": ("fp8", ac), "arg_1": bp, "arg_2": padded_a_scale(sa),
        "arg_3": padded_b_scale(sb), "arg_4": ip4},
       {"kwarg_mma_sm": 1, "kwarg_tile_m": 128, "kwarg_tile_n": 128, "kwarg_tile_k": 128,
        "kwarg_swap_ab": True, "kwarg_out_dtype": BF16},
       {"result": ref.to(torch.bfloat16)})

# 2. group_gemm_nvfp4_nt_groupwise: NVFP4 a and b, e4m3 scales of 16, alpha per group.
ap = torch.randint(0, 256, (cm, K // 2), dtype=torch.uint8)
sa = torch.randint(0x30, 0x41, (cm, K // 16), dtype=torch.uint8)
sb = torch.randint(0x30, 0x41, (E, N, K // 16), dtype=torch.uint8)
alpha = torch.rand(E) * 0.5 + 0.25
ad = fp4_unpack(ap) * E4M3[sa.long()].repeat_interleave(16, 1)
bd = fp4_unpack(bp) * E4M3[sb.long()].repeat_interleave(16, 2)
ref = torch.zeros(cm, N)
for e in range(E):
    s0, s1 = int(ip4[e]), int(ip4[e + 1])
    ref[s0:s1] = alpha[e] * (ad[s0:s1] @ bd[e].T)
record("group_gemm_nvfp4_nt_groupwise", GB,
       {"arg_0": ap, "arg_1": bp, "arg_2": ("fp8", padded_a_scale(sa)),
        "arg_3": ("fp8", padded_b_scale(sb)), "arg_4": ip4, "arg_5": alpha},
       {"kwarg_tile_m": 128, "kwarg_tile_n": 128, "kwarg_tile_k": 128,
        "kwarg_out_dtype": BF16},
       {"result": ref.to(torch.bfloat16)})

# 3. moe_gemm_mxfp8_nt_groupwise: token-packed rows of the top-2 routing (any counts), MXFP8
# operands, UE8M0 per 128 of k packed 4 to an int32 word (little-endian); the activation scales
# zero-padded per expert to 4 rows (expert e's rows start at (m_indptr[e] + 3e) // 4 * 4).
indptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).to(torch.int32)
cum = int(indptr[-1])
GK = 128
KB = K // GK
KA = (K + 4 * GK - 1) // (4 * GK)
mp = (cum + 3 * E) // 4 * 4
ac = fp8_codes((cum, K))
bc = fp8_codes((E, N, K))
sa = torch.randint(124, 130, (cum, KB), dtype=torch.uint8)
sb = torch.randint(124, 130, (E, N, KB), dtype=torch.uint8)
sa_words = torch.zeros(mp, 4 * KA, dtype=torch.uint8)
for e in range(E):
    s0, s1 = int(indptr[e]), int(indptr[e + 1])
    c0 = (s0 + 3 * e) // 4 * 4
    sa_words[c0:c0 + s1 - s0, :KB] = sa[s0:s1]
sb_words = torch.zeros(E, N, 4 * KA, dtype=torch.uint8)
sb_words[:, :, :KB] = sb
ad = E4M3[ac.long()] * ue8m0(sa).repeat_interleave(GK, 1)
bd = E4M3[bc.long()] * ue8m0(sb).repeat_interleave(GK, 2)
ref = torch.zeros(cum, N)
for e in range(E):
    s0, s1 = int(indptr[e]), int(indptr[e + 1])
    ref[s0:s1] = ad[s0:s1] @ bd[e].T
record("moe_gemm_mxfp8_nt_groupwise", "flashinfer.grouped_mm.cute_sm120_mxfp8_groupwise.core",
       {"kwarg_a": ("fp8", ac), "kwarg_b": ("fp8", bc),
        "kwarg_a_scale": sa_words.view(torch.int32), "kwarg_b_scale": sb_words.view(torch.int32),
        "kwarg_m_indptr": indptr},
       {"kwarg_scale_major_mode": "MN", "kwarg_backend": "cute", "kwarg_out_dtype": BF16},
       {"result": ref.to(torch.bfloat16)})
)PY";
  std::ofstream(dir / "make.py") << py;
  const int st =
      std::system(("/usr/bin/python3 " + (dir / "make.py").string() + " " + dir.string()).c_str());
  if (st != 0 && WIFEXITED(st) && WEXITSTATUS(st) == 77) {
    fs::remove_all(dir);
    GTEST_SKIP() << "python3-torch not installed";
  }
  ASSERT_EQ(st, 0);
  fs::remove(dir / "make.py");
  const auto results = replay::replay_sequence(dir.string());
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
    ASSERT_FALSE(r.comparisons.empty()) << r.function_name;
    EXPECT_EQ(r.comparisons[0].key, "result") << r.function_name;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashinfer::testing
