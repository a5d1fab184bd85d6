// Issue 20's quantized GEMMs, router GEMMs, fused norm + quant, DiT LayerNorms, top-k and
// speculative sampling through dumps written by Python as upstream's recorder writes them (see
// util/upstream_dump_py.h): every argument by keyword, expected outputs computed by torch from
// upstream's definitions, never by this library. Ops that write into `out` and return None carry
// the expected arguments in this library's mutated.pt (upstream records no output for them).
#include <gtest/gtest.h>

#include "flashinfer/flashinfer.h"
#include "util/upstream_dump_py.h"

namespace flashinfer::testing {
namespace {

const char* const kCalls = R"PY(
torch.manual_seed(7)
GB, RG = "flashinfer.gemm.gemm_base", "flashinfer.gemm.routergemm"
def e4m3(x):  # saturating round-to-nearest-even e4m3 codes
    x = x.float()
    return (rne(x.abs().clamp(max=448.0), POS8) + 128 * torch.signbit(x).to(torch.int64)).to(torch.uint8)
def f8(c):
    return E4M3[c.long()]
def bf(x):
    return x.to(torch.bfloat16)

# 1-2. prepare_low_latency_gemm_weights then mm_fp8: rows shuffled in 32-row blocks
# (srcToDstBlk32RowMap[r] = (r % 4) * 8 + r / 4), then [k/128, n, 128]; mm_fp8 = alpha * a @ w^T.
n, k, m = 64, 256, 3
wc, ac = e4m3(torch.randn(n, k)), e4m3(torch.randn(m, k))
wsh = torch.empty_like(wc)
for r in range(n):
    wsh[r // 32 * 32 + (r % 32 % 4) * 8 + (r % 32) // 4] = wc[r]
prep = wsh.view(n, k // 128, 128).permute(1, 0, 2).contiguous()
record("prepare_low_latency_gemm_weights", "flashinfer.trtllm_low_latency_gemm",
       {"kwarg_w": ("fp8", wc)}, {"kwarg_permutation_indices_cache": {}}, ("fp8", prep))
record("mm_fp8", GB, {"kwarg_a": ("fp8", ac), "kwarg_b": ("fp8", prep),
                      "kwarg_alpha": torch.tensor([0.5])},
       {"kwarg_out_dtype": "torch.bfloat16", "kwarg_backend": "trtllm_low_latency"},
       bf(f8(ac) @ f8(wc).t() * 0.5))

# 3-5. Block-scaled fp8 GEMMs: the fp32 product of each 128-wide k block times its scales.
def blockwise(A, B, sa, sb):  # sa(i, kb), sb(j, kb) as [m, kb] / [n, kb] tensors
    out = torch.zeros(A.shape[0], B.shape[0])
    for kb in range(A.shape[1] // 128):
        blk = A[:, kb * 128:(kb + 1) * 128] @ B[:, kb * 128:(kb + 1) * 128].t()
        out += blk * sa[:, kb:kb + 1] * sb[:, kb].reshape(1, -1)
    return out
m, n, k = 4, 256, 256
ac, bc = e4m3(torch.randn(m, k)), e4m3(torch.randn(n, k))
asc, bsc = 0.5 + torch.rand(k // 128, m), 0.5 + torch.rand(k // 128, n // 128)
record("gemm_fp8_nt_groupwise", GB,
       {"kwarg_a": ("fp8", ac), "kwarg_b": ("fp8", bc), "kwarg_a_scale": asc, "kwarg_b_scale": bsc},
       {"kwarg_scale_major_mode": "MN", "kwarg_mma_sm": 1, "kwarg_out_dtype": "torch.bfloat16",
        "kwarg_backend": "cutlass"},
       bf(blockwise(f8(ac), f8(bc), asc.t(), bsc.t().repeat_interleave(128, 0))))
m = 128
ac = e4m3(torch.randn(m, k))
asc = 0.5 + torch.rand(m // 128, k // 128)
bsc = 0.5 + torch.rand(n // 128, k // 128)
record("gemm_fp8_nt_blockscaled", GB,
       {"kwarg_a": ("fp8", ac), "kwarg_b": ("fp8", bc), "kwarg_a_scale": asc, "kwarg_b_scale": bsc},
       {"kwarg_scale_major_mode": "K", "kwarg_out_dtype": "torch.bfloat16"},
       bf(blockwise(f8(ac), f8(bc), asc.repeat_interleave(128, 0), bsc.repeat_interleave(128, 0))))
m, n = 3, 64
ac, bc = e4m3(torch.randn(m, k)), e4m3(torch.randn(n, k))
isc, wsc = 0.5 + torch.rand(m, k // 128), 0.5 + torch.rand(1, k // 128)
record("fp8_blockscale_gemm_sm90", GB,
       {"kwarg_input": ("fp8", ac), "kwarg_weight": ("fp8", bc), "kwarg_input_scale": isc,
        "kwarg_weight_scale": wsc}, {"kwarg_out_dtype": "torch.bfloat16"},
       bf(blockwise(f8(ac), f8(bc), isc, wsc.expand(n, -1))))

# 6-7. MXFP8: e4m3 * 2^(ue8m0 - 127) per 32 k, fp32 sums.
m, n, k = 3, 128, 128
ac, bc = e4m3(torch.randn(m, k)), e4m3(torch.randn(n, k))
sa, sb = rbytes((m, k // 32), 122, 132), rbytes((k // 32, n), 122, 132)
A = f8(ac) * torch.pow(2.0, sa.float() - 127).repeat_interleave(32, 1)
B = f8(bc) * torch.pow(2.0, sb.t().float() - 127).repeat_interleave(32, 1)
record("mm_mxfp8", GB, {"kwarg_a": ("fp8", ac), "kwarg_b": ("fp8", bc.t()),
                        "kwarg_a_descale": sa, "kwarg_b_descale": sb},
       {"kwarg_out_dtype": "torch.bfloat16", "kwarg_backend": "auto"}, bf(A @ B.t()))
def swz_buf(lin):  # [rows, ksf] -> the 128x4 buffer, zero padding
    rows, ksf = lin.shape
    flat = [0] * ((rows + 127) // 128 * 128 * ((ksf + 3) // 4 * 4))
    v = lin.tolist()
    for r in range(rows):
        for c in range(ksf):
            flat[swz(r, c, ksf)] = v[r][c]
    return torch.tensor(flat, dtype=torch.uint8)
nb = 2
Ac, Bc = e4m3(torch.randn(nb, m, k)), e4m3(torch.randn(nb, n, k))
SA, SB = rbytes((nb, m, k // 32), 122, 132), rbytes((nb, n, k // 32), 122, 132)
ref = torch.stack([(f8(Ac[i]) * torch.pow(2.0, SA[i].float() - 127).repeat_interleave(32, 1)) @
                   (f8(Bc[i]) * torch.pow(2.0, SB[i].float() - 127).repeat_interleave(32, 1)).t()
                   for i in range(nb)])
record("bmm_mxfp8", GB, {"kwarg_A": ("fp8", Ac), "kwarg_B": ("fp8", Bc.transpose(1, 2)),
                         "kwarg_A_scale": torch.cat([swz_buf(SA[i]) for i in range(nb)]),
                         "kwarg_B_scale": torch.cat([swz_buf(SB[i]) for i in range(nb)])},
       {"kwarg_dtype": "torch.bfloat16", "kwarg_backend": "auto"}, bf(ref))

# 8-12. bf16 GEMMs: fp32 sums, the bias added in fp32, one rounding; b column-major.
m, k, n = 3, 64, 32
a, w, bias = bf(torch.randn(m, k)), bf(torch.randn(n, k)), bf(torch.randn(n))
record("tgv_gemm_sm100", GB, {"kwarg_a": a, "kwarg_b": w.t(), "kwarg_bias": bias},
       {"kwarg_pdl": False}, bf(a.float() @ w.float().t() + bias.float()))
out0 = torch.zeros(m, n, dtype=torch.bfloat16)
record("tinygemm_bf16", RG, {"kwarg_input": a, "kwarg_weight": w, "kwarg_out": out0,
                             "kwarg_bias": bias}, {"kwarg_use_pdl": False}, None,
       {"kwarg_out": bf(a.float() @ w.float().t() + bias.float())})
for name, K, N, odt in (("mm_M1_16_K7168_N128", 7168, 128, torch.bfloat16),
                        ("mm_M1_16_K7168_N256", 7168, 256, torch.float32),
                        ("mm_M1_16_K6144_N256", 6144, 256, torch.float32)):
    a, w = bf(torch.randn(2, K)), bf(torch.randn(N, K))
    record(name, RG, {"kwarg_mat_a": a, "kwarg_mat_b": w.t(),
                      "kwarg_out": torch.zeros(2, N, dtype=odt)},
           {"kwarg_launch_with_pdl": True}, None,
           {"kwarg_out": (a.float() @ w.float().t()).to(odt)})

# 13-15. Norm + fp8 quantization: e4m3(clamp(y / scale)), y the fp32 norm (scale a power of two,
# so / and * (1 / scale) agree).
x, wt = bf(torch.randn(4, 256)), bf(1 + 0.1 * torch.randn(256))
def rms(v, w):
    return v * torch.rsqrt((v * v).mean(-1, keepdim=True) + 1e-6) * w.float()
sc = torch.tensor([0.5])
record("rmsnorm_quant", "flashinfer.norm",
       {"kwarg_out": ("fp8", torch.zeros(4, 256, dtype=torch.uint8)), "kwarg_input": x,
        "kwarg_weight": wt, "kwarg_scale": sc}, {"kwarg_eps": 1e-6}, None,
       {"kwarg_out": ("fp8", e4m3(rms(x.float(), wt) / 0.5))})
res = bf(torch.randn(4, 256))
sm = x.float() + res.float()
record("fused_add_rmsnorm_quant", "flashinfer.norm",
       {"kwarg_out": ("fp8", torch.zeros(4, 256, dtype=torch.uint8)), "kwarg_input": x,
        "kwarg_residual": res, "kwarg_weight": wt, "kwarg_scale": sc}, {"kwarg_eps": 1e-6}, None,
       {"kwarg_out": ("fp8", e4m3(rms(sm, wt) / 0.5)), "kwarg_residual": bf(sm)})
gm, bt = 1 + 0.1 * torch.randn(256), 0.1 * torch.randn(256)
xf = x.float()
mu = xf.mean(-1, keepdim=True)
ln = (xf - mu) * torch.rsqrt(((xf - mu) ** 2).mean(-1, keepdim=True) + 1e-6) * gm + bt
record("layernorm_quant", "flashinfer.norm",
       {"kwarg_out": ("fp8", torch.zeros(4, 256, dtype=torch.uint8)), "kwarg_input": x,
        "kwarg_gemma": gm, "kwarg_beta": bt, "kwarg_scale": torch.tensor([2.0])},
       {"kwarg_eps": 1e-6}, None, {"kwarg_out": ("fp8", e4m3(ln / 2.0))})

# 16-17. DiT gated residual + LayerNorm (WAN): r = residual + input * (gate + gate_bias) in fp32,
# residual_out = bf16(r), LayerNorm of the fp32 r.
H = 3072
xi, ri, gt = bf(torch.randn(1, 2, H)), bf(torch.randn(1, 2, H)), bf(0.5 * torch.randn(1, 2, H))
gb = 0.1 * torch.randn(H)
r = ri.float() + xi.float() * (gt.float() + gb)
mu = r.mean(-1, keepdim=True)
nr = (r - mu) * torch.rsqrt(((r - mu) ** 2).mean(-1, keepdim=True) + 1e-6)
gmm, bta = 1 + 0.1 * torch.randn(H), 0.1 * torch.randn(H)
record("fused_dit_gate_residual_layernorm_gamma_beta", "flashinfer.norm",
       {"kwarg_input": xi, "kwarg_residual": ri, "kwarg_gate": gt, "kwarg_gamma": gmm,
        "kwarg_beta": bta, "kwarg_gate_bias": gb}, {"kwarg_epsilon": 1e-6},
       [bf(r), bf(nr * gmm + bta)])
scl, sft = bf(0.1 * torch.randn(1, 2, H)), bf(torch.randn(1, 2, H))
sb, hb = 0.1 * torch.randn(H), 0.1 * torch.randn(H)
record("fused_dit_gate_residual_layernorm_scale_shift", "flashinfer.norm",
       {"kwarg_input": xi, "kwarg_residual": ri, "kwarg_gate": gt, "kwarg_scale": scl,
        "kwarg_shift": sft, "kwarg_gate_bias": gb, "kwarg_scale_bias": sb, "kwarg_shift_bias": hb},
       {"kwarg_epsilon": 1e-6},
       [bf(r), bf(nr * (1 + (scl.float() + sb)) + (sft.float() + hb))])

# 18-21. Top-k: torch.topk; the transforms in deterministic mode (indices ascending), windows
# [0, L), L <= k giving 0..L-1 then -1.
lg = torch.randn(4, 300)
vals, idx = torch.topk(lg, 8, dim=-1, sorted=True)
record("top_k", "flashinfer.topk", {"kwarg_input": lg}, {"kwarg_k": 8, "kwarg_sorted": True},
       [vals, idx])
lens = torch.tensor([300, 5, 200, 64], dtype=torch.int32)
def window_topk(i, L, kk):
    if L <= kk:
        return list(range(L)) + [-1] * (kk - L)
    return sorted(torch.topk(lg[i, :L], kk).indices.tolist())
raw = [window_topk(i, int(lens[i]), 8) for i in range(4)]
pt = torch.randint(0, 100, (2, 80), dtype=torch.int32)
r2b = torch.tensor([1, 0, 1, 0], dtype=torch.int32)
tr = [[-1 if j < 0 else int(pt[r2b[i], j // 4]) * 4 + j % 4 for j in raw[i]] for i in range(4)]
record("top_k_page_table_transform", "flashinfer.topk",
       {"kwarg_input": lg, "kwarg_src_page_table": pt, "kwarg_lengths": lens,
        "kwarg_row_to_batch": r2b}, {"kwarg_k": 8, "kwarg_deterministic": True, "kwarg_page_size": 4},
       torch.tensor(tr, dtype=torch.int32))
offs = torch.tensor([0, 1000, 2000, 3000], dtype=torch.int32)
record("top_k_ragged_transform", "flashinfer.topk",
       {"kwarg_input": lg, "kwarg_offsets": offs, "kwarg_lengths": lens},
       {"kwarg_k": 8, "kwarg_deterministic": True},
       torch.tensor([[-1 if j < 0 else j + int(offs[i]) for j in raw[i]] for i in range(4)],
                    dtype=torch.int32))
vi = torch.tensor(raw, dtype=torch.int32)
vv = torch.stack([torch.where(vi[i] >= 0, lg[i, vi[i].clamp(min=0).long()], torch.zeros(8))
                  for i in range(4)])
record("top_k_varlen", "flashinfer.topk_varlen.topk_varlen",
       {"kwarg_logits": lg, "kwarg_seq_lens": lens}, {"kwarg_top_k": 8, "kwarg_return_values": True},
       [vi, vv])

# 22. chain_speculative_sampling with probabilities that make every draw's outcome certain:
# row 0 accepts all 3 drafts (target 1 at each) and samples the one-hot bonus 5; row 1 accepts
# draft 0, rejects 1 and 2 (target 0 there) and samples the one-hot residual 6 at position 1.
V, nd = 8, 3
dids = torch.tensor([[1, 2, 3], [4, 0, 7]], dtype=torch.int32)
dp = torch.full((2, nd, V), 1.0 / V)
tp = torch.zeros(2, nd + 1, V)
for i in range(nd):
    tp[0, i, dids[0, i]] = 1.0
tp[0, nd, 5] = 1.0
tp[1, 0, 4] = 1.0
tp[1, 1, 6] = 1.0
tp[1, 2, 6] = 1.0
tp[1, 3, 2] = 1.0
record("chain_speculative_sampling", "flashinfer.sampling",
       {"kwarg_draft_probs": dp, "kwarg_draft_token_ids": dids, "kwarg_target_probs": tp},
       {"kwarg_deterministic": True, "kwarg_generator": None, "kwarg_seed": 42, "kwarg_offset": 0},
       [torch.tensor([[1, 2, 3, 5], [4, 6, -1, -1]], dtype=torch.int32),
        torch.tensor([3, 1], dtype=torch.int32), torch.tensor([3, 1], dtype=torch.int32)])

# 23-28. NVFP4 / MXFP8 grouped and batched quantizers (the stock quantizer's formulas, nvfp4()
# above: sf = e4m3(gs * amax / 6), q = e2m1(x * gs / sf), ties to the even code).
QM = "flashinfer.quantization.fp4_quantization"
def nv_lin(v, gs):  # NVFP4 of a 2-D tensor: packed codes and the linear [rows, K/16] scale codes
    mm, kk = v.shape
    blk = v.float().view(mm, kk // 16, 16)
    sfc = rne(((gs * blk.abs().amax(-1)) / 6.0).clamp(max=448.0), POS8)
    sfv = POS8[sfc]
    y = (blk * gs) / sfv[..., None]
    code = rne(y.abs().clamp(max=6.0), G2) + 8 * torch.signbit(y).to(torch.int64)
    code = torch.where(sfv[..., None] == 0, torch.zeros_like(code), code).reshape(mm, kk)
    return (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8), sfc.to(torch.uint8)
B_, M_, K_ = 2, 3, 64
xa = bf(torch.randn(B_, M_, K_))
q, s = zip(*[nv_lin(xa[i], 200.0) for i in range(B_)])
record("nvfp4_batched_quantize", QM, {"kwarg_a": xa, "kwarg_a_global_sf": torch.tensor([200.0])},
       {"kwarg_sf_vec_size": 16}, [torch.stack(q), torch.stack([swz_buf(v) for v in s])])
def grouped(y, mask, gsf):  # y [L, M, K] -> (codes [M, K/2, L], e4m3 scales 6-D), rows < mask
    L, mm, kk = y.shape
    qs, ss = [], []
    for g in range(L):
        qg, sg = nv_lin(y[g], float(gsf[g]))
        qg[int(mask[g]):] = 0
        sg[int(mask[g]):] = 0
        qs.append(qg); ss.append(swz_buf(sg))
    rm, rk = (mm + 127) // 128, (kk // 16 + 3) // 4
    sf = torch.stack(ss).view(L, rm, rk, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)
    return torch.stack(qs).permute(1, 2, 0), ("fp8", sf)
mask = torch.tensor([3, 1], dtype=torch.int32)
gsf = torch.tensor([200.0, 100.0])
record("scaled_fp4_grouped_quantize", QM, {"kwarg_a": xa, "kwarg_mask": mask, "kwarg_a_global_sf": gsf},
       {}, list(grouped(xa, mask, gsf)))
xg2 = bf(torch.randn(B_, M_, 2 * K_))
def silu_mul(v):  # gate half first, fp32 math kept in the input's 16-bit type
    gte, up = v[..., :v.shape[-1] // 2].float(), v[..., v.shape[-1] // 2:].float()
    return (gte * torch.sigmoid(gte) * up).to(v.dtype)
record("silu_and_mul_scaled_nvfp4_experts_quantize", "flashinfer.activation",
       {"kwarg_a": xg2, "kwarg_mask": mask, "kwarg_a_global_sf": gsf}, {},
       list(grouped(silu_mul(xg2), mask, gsf)))
qq, ss = nv_lin(silu_mul(xg2[0]), 200.0)
record("silu_and_mul_nvfp4_quantize", QM,
       {"kwarg_input": xg2[0].clone(), "kwarg_global_scale": torch.tensor([200.0])},
       {"kwarg_sf_vec_size": 16, "kwarg_is_sf_swizzled_layout": False}, [qq, ss])
# MXFP8 (mxfp8_quantize's block math): scale = amax / 448 (fp32) rounded up to a power of two
# 2^(e - 127), e the ue8m0 code (0 for a zero block), q = e4m3_satfinite(x / 2^(e - 127)).
def mx_blocks(v):  # v [M, Kp] fp32 -> (codes, ue8m0)
    mm, kk = v.shape
    blk = v.view(mm, kk // 32, 32)
    r_ = blk.abs().amax(-1) / 448.0
    man, ex = torch.frexp(r_)
    e = torch.where(man == 0.5, ex - 1, ex).to(torch.int64) + 127
    e = torch.where(r_ == 0, torch.zeros_like(e), e)
    scl = torch.pow(2.0, e.float() - 127)
    c = e4m3(blk / scl[..., None]).reshape(mm, kk)
    c = torch.where((e == 0).repeat_interleave(32, 1), torch.zeros_like(c), c)
    return c, e.to(torch.uint8)
Kx = 96
xm = bf(torch.randn(B_, M_, Kx))
Kp = 128
qs, ss = [], []
for g in range(B_):
    pad = torch.zeros(M_, Kp)
    pad[:, :Kx] = xm[g].float()
    c, e = mx_blocks(pad)
    c[int(mask[g]):] = 0
    e[int(mask[g]):] = 0
    qs.append(c); ss.append(swz_buf(e))
record("mxfp8_grouped_quantize", "flashinfer.quantization.fp8_quantization",
       {"kwarg_a": xm, "kwarg_mask": mask}, {},
       [("fp8", torch.stack(qs).permute(1, 2, 0)),
        torch.stack(ss).view(B_, 1, Kp // 128, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)])

# 29. nvfp4_kv_quantize: sf = e4m3((1/gs) * (amax * (1/6))), q = e2m1(x * (1 / (sf * gs))).
gsk = torch.tensor([0.25])
xk = bf(torch.randn(4, 64))
blk = xk.float().view(4, 4, 16)
amax = blk.abs().amax(-1)
rcp6 = torch.tensor(1.0 / 6.0, dtype=torch.float32)
sfc = rne(((amax * rcp6) * 4.0).clamp(max=448.0), POS8)
osc = torch.where(amax != 0, 1.0 / (POS8[sfc] * 0.25), torch.zeros_like(amax))
y = blk * osc[..., None]
code = (rne(y.abs().clamp(max=6.0), G2) + 8 * torch.signbit(y).to(torch.int64)).reshape(4, 64)
record("nvfp4_kv_quantize", QM, {"kwarg_input": xk, "kwarg_global_scale": gsk}, {},
       [(code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8), sfc.to(torch.uint8)])

# 30. nvfp4_quantize_paged_kv_cache (HND, given global scales): fp4_quantize of
# cache.reshape(-1, D) with linear scales; V scales 4-token interleaved within each (page, head)
# [page_size, D/16] tile: out[(t/4)*4*S + s*4 + t%4] = in[t*S + s].
P, H, PS, D = 2, 2, 8, 64
S = D // 16
kc, vc = bf(torch.randn(P, H, PS, D)), bf(3 * torch.randn(P, H, PS, D))
kq, ks = nv_lin(kc.reshape(-1, D), 100.0)
vq, vs = nv_lin(vc.reshape(-1, D), 50.0)
vt = vs.view(P, H, PS * S)
vsw = torch.empty_like(vt)
for t in range(PS):
    for s_ in range(S):
        vsw[:, :, (t // 4) * 4 * S + s_ * 4 + t % 4] = vt[:, :, t * S + s_]
record("nvfp4_quantize_paged_kv_cache", QM,
       {"kwarg_k_cache": kc, "kwarg_v_cache": vc, "kwarg_k_global_sf": torch.tensor([100.0]),
        "kwarg_v_global_sf": torch.tensor([50.0])}, {"kwarg_kv_layout": "HND"},
       [[kq.view(P, H, PS, D // 2), vq.view(P, H, PS, D // 2)],
        [("fp8", ks.view(P, H, PS, S)), ("fp8", vsw.view(P, H, PS, S))]])

# 31. nvfp4_kv_dequantize_paged (stacked NHD cache): token t < seq_lens[b] from page
# block_tables[b, t // page_size], entry t % page_size, (e2m1 * e4m3) * scale; other rows kept.
P, PS, H, D = 4, 4, 2, 32
data, sfs = rbytes((P, 2, PS, H, D // 2)), rbytes((P, 2, PS, H, D // 16), 0x30, 0x48)
bt = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
sl = torch.tensor([6, 3], dtype=torch.int32)
outs = [torch.full((2, 8, H, D), 7.0).to(torch.bfloat16) for _ in range(2)]
exp = [o.clone() for o in outs]
for kv, scale in ((0, 0.5), (1, 0.25)):
    for b_ in range(2):
        for t in range(int(sl[b_])):
            pg, e_ = int(bt[b_, t // PS]), t % PS
            v = fp4_values(data[pg, kv, e_]) * E4M3[sfs[pg, kv, e_].long()].repeat_interleave(16, 1)
            exp[kv][b_, t] = (v * scale).to(torch.bfloat16)
record("nvfp4_kv_dequantize_paged", QM,
       {"kwarg_paged_kv_cache": data, "kwarg_kv_cache_sf": ("fp8", sfs), "kwarg_block_tables": bt,
        "kwarg_seq_lens": sl, "kwarg_output_k": outs[0], "kwarg_output_v": outs[1]},
       {"kwarg_k_scale": 0.5, "kwarg_v_scale": 0.25, "kwarg_kv_layout": "NHD"}, None,
       {"kwarg_output_k": exp[0], "kwarg_output_v": exp[1]})

# 32. fused_rmsnorm_silu into a float8_e4m3fn `out` (upstream's binding: scale 1.0):
# e4m3_satfinite(silu(x * rsqrt(mean(x^2) + eps) * w)); the result is `out`.
xs = bf(torch.randn(4, 128))
ws = bf(1 + 0.1 * torch.randn(128))
ys = rms(xs.float(), ws)
record("fused_rmsnorm_silu", "flashinfer.norm",
       {"kwarg_input": xs, "kwarg_weight": ws,
        "kwarg_out": ("fp8", torch.zeros(4, 128, dtype=torch.uint8))}, {"kwarg_eps": 1e-6},
       ("fp8", e4m3(ys * torch.sigmoid(ys))))
)PY";

TEST(QuantUpstreamDumps, TorchWrittenDumpsReplay) {
  if (!run_upstream_dump_script("fi_quant_dumps", kCalls, 31)) {
    GTEST_SKIP() << "python3-torch not installed";
  }
}

}  // namespace
}  // namespace flashinfer::testing
