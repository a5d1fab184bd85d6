// Dense-toolbox ops (issue 20) through dumps written by Python as upstream's recorder writes
// them: torch format (fp8 tensors pickled as torch >= 2.1 does, by hand, since the machine's
// torch 1.13 has no float8), every argument by keyword as engines call them, expected outputs
// computed by torch from upstream's definitions (the layouts of gemm_bf16_fp4's prepare paths,
// e2m1 / e4m3 / ue8m0 decoding, the fused kernels' fp32 math). Each replays here and passes.
#include <gtest/gtest.h>

#include "flashinfer/flashinfer.h"
#include "util/upstream_dump_py.h"

namespace flashinfer::testing {
namespace {

const char* const kCalls = R"PY(
torch.manual_seed(0)
BF4 = "flashinfer.gemm.gemm_bf16_fp4"

# 1-2. prepare_bf16_fp4_weights, as vLLM calls it (keywords, backend by name).
N, K = 64, 64
KSF = K // 16
b = rbytes((N, K // 2))
sfbuf = rbytes((512,), 0x30, 0x40)
alpha = torch.tensor([0.5])
lin = unswizzle(sfbuf, N, KSF)                     # (N, K_sf) e4m3 codes
bkn = b.t().tolist()                               # (K/2, N)
words = torch.zeros(K // 16, (N // 64) * 128, dtype=torch.int64)
KOFF, NOFF = (0, 4, 0, 4), ((0, 0, 16, 16), (32, 32, 48, 48))
for kt in range(K // 16):
    for nt in range(N // 64):
        for u in range(128):
            lane = (u // 2) % 32
            w = 0
            for j in range(4):
                kh = lane % 4 + KOFF[j]
                nn = (u // 64) * 8 + lane // 4 + NOFF[u % 2][j]
                w |= bkn[kt * 8 + kh][nt * 64 + nn] << (8 * j)
            words[kt, nt * 128 + u] = w - (1 << 32) if w >= (1 << 31) else w
s0e5m3 = ((E4M3[lin.t().long()].to(torch.float16).view(torch.int16).to(torch.int64) >> 7) & 0xFF)
record("prepare_bf16_fp4_weights", BF4,
       {"kwarg_b": b, "kwarg_b_descale": sfbuf, "kwarg_alpha": alpha},
       {"kwarg_backend": "cute-dsl"},
       [words.to(torch.int32), s0e5m3.to(torch.uint8), alpha])
record("prepare_bf16_fp4_weights", BF4,
       {"kwarg_b": b, "kwarg_b_descale": ("fp8", sfbuf), "kwarg_alpha": alpha},
       {"kwarg_backend": "cudnn"},
       [b, ("fp8", lin), alpha])

# 3. mm_bf16_fp4 on the cudnn-prepared pair (upstream's test reference: fp32 dequant + matmul).
a = torch.randn(3, K).to(torch.bfloat16)
W = fp4_values(b) * E4M3[lin.long()].repeat_interleave(16, 1)
record("mm_bf16_fp4", BF4,
       {"kwarg_a": a, "kwarg_b": b, "kwarg_b_descale": ("fp8", lin), "kwarg_alpha": alpha},
       {"kwarg_backend": "cudnn"},
       ((a.float() @ W.t()) * 0.5).to(torch.bfloat16))

# 4. mm_nvfp4_svdquant: alpha * (a @ b^T + d @ l1^T) + bias, bf16.
m, n, k, r = 3, 32, 64, 32
qa, qb = rbytes((m, k // 2)), rbytes((n, k // 2))
sa, sb = rbytes((512,), 0x30, 0x40), rbytes((512,), 0x30, 0x40)
A = fp4_values(qa) * E4M3[unswizzle(sa, m, k // 16).long()].repeat_interleave(16, 1)
B = fp4_values(qb) * E4M3[unswizzle(sb, n, k // 16).long()].repeat_interleave(16, 1)
dd, l1 = torch.randn(m, r).to(torch.bfloat16), torch.randn(n, r).to(torch.bfloat16)
bias = torch.randn(n).to(torch.bfloat16)
al = torch.tensor([0.25])
ref = 0.25 * (A @ B.t() + dd.float() @ l1.float().t()) + bias.float()
record("mm_nvfp4_svdquant", "flashinfer.gemm.gemm_svdquant",
       {"kwarg_a": qa, "kwarg_b": qb, "kwarg_a_sf": sa, "kwarg_b_sf": sb, "kwarg_alpha": al,
        "kwarg_d": dd, "kwarg_l1": l1, "kwarg_bias": bias},
       {"kwarg_enable_pdl": None}, ref.to(torch.bfloat16))

# 5. fused_qk_rmsnorm_rope (WAN-style keywords): RMSNorm across heads (bf16-rounded), 3D RoPE.
ppf, pph, ppw, D, H = 2, 3, 2, 64, 2
FC, HC, WC = 24, 20, 20
S = ppf * pph * ppw
qkv = torch.randn(S, 3 * H * D).to(torch.bfloat16)
qw = (1.0 + 0.1 * torch.randn(H * D)).to(torch.bfloat16)
kw = (1.0 + 0.1 * torch.randn(H * D)).to(torch.bfloat16)
freq, sec = [], []
for size, sid in ((FC, 0), (HC, 1), (WC, 2)):
    for j in range(size // 2):
        freq.append(10000.0 ** (-2.0 * j / size)); sec.append(sid)
freq = torch.tensor(freq, dtype=torch.float32)
def qk(x, w):
    x = x.float()
    y = (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16().float()
    y = y.view(S, H, D // 2, 2)
    out = torch.empty_like(y)
    for s in range(S):
        pos = (s // (pph * ppw), (s % (pph * ppw)) // ppw, s % ppw)
        th = torch.tensor([pos[sec[i]] for i in range(D // 2)], dtype=torch.float32) * freq
        c, sn = torch.cos(th), torch.sin(th)
        out[s, :, :, 0] = y[s, :, :, 0] * c - y[s, :, :, 1] * sn
        out[s, :, :, 1] = y[s, :, :, 1] * c + y[s, :, :, 0] * sn
    return out.reshape(S, H, D).bfloat16()
record("fused_qk_rmsnorm_rope", "flashinfer.norm",
       {"kwarg_qkv": qkv, "kwarg_q_weight": qw, "kwarg_k_weight": kw},
       {"kwarg_ppf": ppf, "kwarg_pph": pph, "kwarg_ppw": ppw, "kwarg_num_frame_channels": FC,
        "kwarg_num_height_channels": HC, "kwarg_num_width_channels": WC, "kwarg_num_heads_q": H,
        "kwarg_num_heads_k": H, "kwarg_num_heads_v": H, "kwarg_head_dim": D, "kwarg_eps": 1e-6,
        "kwarg_base": 10000.0, "kwarg_interleave": True, "kwarg_is_qk_norm": True},
       [qk(qkv[:, :H * D], qw), qk(qkv[:, H * D:2 * H * D], kw),
        qkv[:, 2 * H * D:].reshape(S, H, D)])

# 6. mxfp4_dequantize_host: e2m1 * 2^(scale - 127), fp32.
w4, sc = rbytes((8, 32)), rbytes((8, 2), 120, 135)
record("mxfp4_dequantize_host", "flashinfer.quantization.fp4_quantization",
       {"kwarg_weight": w4, "kwarg_scale": sc}, {"kwarg_group_size": 32},
       fp4_values(w4) * torch.pow(2.0, sc.float() - 127).repeat_interleave(32, 1))

# 7. shuffle_matrix_a (epilogue_tile_m 128: blocks of 32 rows, the 8-row interleave).
MAP32 = [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
         4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31]
x = rbytes((64, 8))
idx = torch.empty(64, dtype=torch.long)
for old in range(64):
    idx[old // 32 * 32 + MAP32[old % 32]] = old
record("shuffle_matrix_a", "flashinfer.quantization.fp4_quantization",
       {"kwarg_input_tensor": x}, {"kwarg_epilogue_tile_m": 128}, x[idx])

# 8. nvfp4_kv_dequantize: e2m1 * e4m3 * global_scale -> bf16 (the default output dtype).
kvq, kvs = rbytes((4, 16)), rbytes((4, 2), 0x30, 0x48)
record("nvfp4_kv_dequantize", "flashinfer.quantization.fp4_quantization",
       {"kwarg_fp4_data": kvq, "kwarg_block_scales": ("fp8", kvs),
        "kwarg_global_scale": torch.tensor([0.5])}, {},
       (fp4_values(kvq) * E4M3[kvs.long()].repeat_interleave(16, 1) * 0.5).to(torch.bfloat16))

# 9. fused_rmsnorm_silu: silu(x * rsqrt(mean(x^2) + eps) * w), one bf16 rounding.
xs = torch.randn(4, 128).to(torch.bfloat16)
ws = (1.0 + 0.1 * torch.randn(128)).to(torch.bfloat16)
y = xs.float() * torch.rsqrt((xs.float() ** 2).mean(-1, keepdim=True) + 1e-6) * ws.float()
record("fused_rmsnorm_silu", "flashinfer.norm", {"kwarg_input": xs, "kwarg_weight": ws},
       {"kwarg_eps": 1e-6}, (y * torch.sigmoid(y)).to(torch.bfloat16))

# 10. packbits, little bit order (numpy.packbits semantics).
bits = torch.randint(0, 2, (21,), dtype=torch.int64).to(torch.bool)
packed = []
for i in range(0, 21, 8):
    v = 0
    for j, bit in enumerate(bits[i:i + 8].tolist()):
        v |= int(bit) << j
    packed.append(v)
record("packbits", "flashinfer.quantization.packbits", {"kwarg_x": bits},
       {"kwarg_bitorder": "little"}, torch.tensor(packed, dtype=torch.uint8))

# 11. shuffle_matrix_sf_a: the same row shuffle of linear scales [128, 4], then the 128x4 layout.
sfl = rbytes((128, 4), 0x30, 0x48)
idx = torch.empty(128, dtype=torch.long)
for old in range(128):
    idx[old // 32 * 32 + MAP32[old % 32]] = old
sh = sfl[idx].tolist()
flat = [0] * 512
for r in range(128):
    for c in range(4):
        flat[swz(r, c, 4)] = sh[r][c]
record("shuffle_matrix_sf_a", "flashinfer.quantization.fp4_quantization",
       {"kwarg_input_tensor": sfl}, {"kwarg_epilogue_tile_m": 128},
       torch.tensor(flat, dtype=torch.uint8))

# 12. segment_packbits, big bit order, int32 indptr: (packed, new_indptr).
bits = torch.randint(0, 2, (20,), dtype=torch.int64).to(torch.bool)
ind = [0, 5, 13, 20]
packed, newp = [], [0]
for sgm in range(3):
    seg = bits[ind[sgm]:ind[sgm + 1]].tolist()
    for i in range(0, len(seg), 8):
        v = 0
        for j, bit in enumerate(seg[i:i + 8]):
            v |= int(bit) << (7 - j)
        packed.append(v)
    newp.append(len(packed))
record("segment_packbits", "flashinfer.quantization.packbits",
       {"kwarg_x": bits, "kwarg_indptr": torch.tensor(ind, dtype=torch.int32)},
       {"kwarg_bitorder": "big"},
       [torch.tensor(packed, dtype=torch.uint8), torch.tensor(newp, dtype=torch.int32)])

# 13. fused_dit_residual_layernorm_scale_shift (no residual): LayerNorm of the fp32 input,
# * (1 + scale) + shift, bf16; residual_out is the input.
xi = torch.randn(1, 2, 3072).to(torch.bfloat16)
sc, sh = (0.1 * torch.randn(1, 2, 3072)).to(torch.bfloat16), torch.randn(1, 2, 3072).to(torch.bfloat16)
xf = xi.float()
mu = xf.mean(-1, keepdim=True)
var = ((xf - mu) ** 2).mean(-1, keepdim=True)
nrm = (xf - mu) * torch.rsqrt(var + 1e-6) * (1 + sc.float()) + sh.float()
record("fused_dit_residual_layernorm_scale_shift", "flashinfer.norm",
       {"kwarg_input": xi, "kwarg_scale": sc, "kwarg_shift": sh}, {"kwarg_epsilon": 1e-6},
       [xi, nrm.to(torch.bfloat16)])

# 14. per_token_group_quant_8bit (DeepSeek fp8 activations): s = max(absmax, eps) / 448 per
# group of 128, q = e4m3(clamp(x / s)); (q, s).
xg = torch.randn(4, 256).to(torch.bfloat16)
g = xg.float().view(4, 2, 128)
s_ = g.abs().amax(-1).clamp(min=1e-10) / 448.0
qv = (g / s_[..., None]).clamp(-448, 448).reshape(4, 256)
vals = E4M3[FIN8]
codes = FIN8[(qv.reshape(-1, 1) - vals.reshape(1, -1)).abs().argmin(1)].to(torch.uint8).reshape(4, 256)
record("per_token_group_quant_8bit", "flashinfer.quantization.fp8_quantization",
       {"kwarg_x": xg}, {"kwarg_group_size": 128}, [("fp8", codes), s_])

# 15-16. nvfp4_quantize_smooth and svdquant_linear. NVFP4 of v = bf16(x * pre_quant_scale):
# per 16 values sf = e4m3_satfinite((gs * amax) / 6), q = e2m1((v * gs) / sf), both rounded to
# nearest, ties to the even code (the stock quantizer's formulas).
xsm = torch.randn(128, 64).to(torch.bfloat16)
pqs = (0.5 + torch.rand(64)).to(torch.bfloat16)
gsm = torch.tensor([448.0 * 6.0 / 6.0])
xq, xsf, _ = nvfp4((xsm.float() * pqs.float()).bfloat16(), 448.0)
record("nvfp4_quantize_smooth", "flashinfer.gemm.gemm_svdquant",
       {"kwarg_x": xsm, "kwarg_pre_quant_scale": pqs, "kwarg_global_scale": gsm}, {},
       [xq, xsf])
xl = torch.randn(4, 64).to(torch.bfloat16)
wq, wsf = rbytes((32, 32)), rbytes((512,), 0x30, 0x40)
Wd = fp4_values(wq) * E4M3[unswizzle(wsf, 32, 4).long()].repeat_interleave(16, 1)
l2t, l1s = (0.2 * torch.randn(64, 32)).to(torch.bfloat16), torch.randn(32, 32).to(torch.bfloat16)
al = torch.tensor([1.0 / 448.0])
_, _, xdq = nvfp4((xl.float() * pqs.float()).bfloat16(), 448.0)
down = (xl.float() @ l2t.float()).bfloat16().float()
yl = (1.0 / 448.0) * (xdq @ Wd.t() + down @ l1s.float().t())
record("svdquant_linear", "flashinfer.gemm.gemm_svdquant",
       {"kwarg_x": xl, "kwarg_weight_fp4": wq, "kwarg_weight_sf": wsf, "kwarg_alpha": al,
        "kwarg_pre_quant_scale": pqs, "kwarg_l2t_smoothed": l2t, "kwarg_l1_scaled": l1s,
        "kwarg_global_scale": torch.tensor([448.0])}, {}, yl.to(torch.bfloat16))

# 17. fused_rmsnorm_silu into a float4_e2m1fn_x2 `out` (NVFP4, block_scale allocated): y in
# fp64; per 16 values s = max(amax / 6, FLT_MIN), scale = e4m3 RNE of s (saturating), codes =
# e2m1 RNE of y / s (the unrounded s), low nibble first; returns (out, block_scale).
xs4 = torch.randn(4, 64).to(torch.bfloat16)
ws4 = (1.0 + 0.5 * torch.randn(64)).to(torch.bfloat16)
x64 = xs4.double()
y4 = x64 * torch.rsqrt((x64 ** 2).mean(-1, keepdim=True) + 1e-6) * ws4.double()
y4 = (y4 / (1 + torch.exp(-y4))).view(4, 4, 16)
s4 = (y4.abs().amax(-1) / 6.0).clamp(min=2.0 ** -126)
sc4 = rne(s4.clamp(max=448.0).float(), POS8).to(torch.uint8)
a4 = (y4 / s4[..., None]).float()
c4 = (rne(a4.abs().clamp(max=6.0), G2) + 8 * torch.signbit(a4).to(torch.int64)).reshape(4, 64)
q4 = (c4[:, 0::2] | (c4[:, 1::2] << 4)).to(torch.uint8)
record("fused_rmsnorm_silu", "flashinfer.norm",
       {"kwarg_input": xs4, "kwarg_weight": ws4, "kwarg_out": ("fp4", torch.zeros(4, 32, dtype=torch.uint8))},
       {"kwarg_eps": 1e-6}, [("fp4", q4), ("fp8", sc4)])
)PY";

TEST(DenseUpstreamDumps, TorchWrittenDumpsReplay) {
  if (!run_upstream_dump_script("fi_dense_dumps", kCalls, 17)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

}  // namespace
}  // namespace flashinfer::testing
