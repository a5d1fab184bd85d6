// Python text shared by several trace templates' `reference` snippets (each definition's
// reference must run alone, so a template pastes the helpers it needs in front of its `run`).
#include "trace/template_builders.h"

namespace flashinfer::trace::detail {

const char* const kRopeHelpers = R"PY(def _freqs(dim, theta, scale, llama=None):
    inv = 1.0 / (float(theta) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if llama is None:
        return inv / float(scale)
    low, high, old = (float(x) for x in llama)
    # Llama 3.1: long wavelengths divided by scale, short ones kept, a linear blend between.
    smooth = ((old * inv / (2 * math.pi) - low) / (high - low)).clamp(0.0, 1.0)
    return (1.0 - smooth) * inv / float(scale) + smooth * inv


def _rotate(x, pos, freqs, interleave):
    rd = freqs.numel() * 2
    ang = pos.double()[:, None] * freqs[None, :]
    cos, sin = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
    xf = x.float()
    r = xf[..., :rd]
    a, b = (r[..., 0::2], r[..., 1::2]) if interleave else (r[..., : rd // 2], r[..., rd // 2 :])
    ra, rb = a * cos - b * sin, b * cos + a * sin
    r = torch.stack([ra, rb], dim=-1).flatten(-2) if interleave else torch.cat([ra, rb], dim=-1)
    return torch.cat([r, xf[..., rd:]], dim=-1).to(x.dtype)


def _ragged_positions(indptr, offsets, nnz):
    pos = torch.zeros(nnz, dtype=torch.int64)
    for b in range(offsets.shape[0]):
        s, e = int(indptr[b]), int(indptr[b + 1])
        pos[s:e] = int(offsets[b]) + torch.arange(e - s)
    return pos


)PY";

// RoPE (NeoX halves or interleaved pairs, cos/sin given) and the saturating e4m3 rounding of the
// rope + FP8 quantize ops.
const char* const kRopeFp8Helpers = R"PY(def _rotate(x, cos, sin, neox):
    if neox:
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)

def _fp8(x, scale):
    y = (x.float() * float(scale)).clamp(-448.0, 448.0)
    fp8 = getattr(torch, "float8_e4m3fn", None)
    return y.to(fp8) if fp8 is not None else y

)PY";

// Python helpers shared by the references: UE8M0 and e2m1 decoding, the 128x4 scale layout.
const char* const kMxHelpers = R"PY(def _ue8m0(sf):
    return torch.pow(2.0, sf.float() - 127.0)


def _unswizzle_128x4(buf, rows, cols):
    # Scale of (row, col) in the 128x4 layout: 512-byte tiles of 128 rows x 4 columns.
    r = torch.arange(rows).reshape(-1, 1)
    c = torch.arange(cols).reshape(1, -1)
    k_tiles = (cols + 3) // 4
    off = (r // 128) * k_tiles * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    return buf.reshape(-1)[off.reshape(-1)].reshape(rows, cols)


_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _e2m1(codes):
    return torch.tensor(_E2M1)[(codes.long() & 15)]


)PY";

// NVFP4 quantization in PyTorch (ops/quantization.h's formulas), shared by fp4_quantize and
// nvfp4_quantize: e4m3 block scales rounded to nearest even, e2m1 codes likewise, two codes per
// byte (the first in the low nibble), scales returned linear and flat.
const char* const kFp4Quant = R"PY(def _e4m3_rn(v):
    # Round non-negative fp32 to e4m3 (nearest even, saturating at 448); value and bits.
    v = v.clamp(max=448.0)
    e = torch.floor(torch.log2(v.clamp(min=2.0 ** -9))).clamp(min=-6.0)
    q = torch.pow(2.0, e - 3.0)
    r = (torch.round(v / q) * q).clamp(max=448.0)
    e = torch.floor(torch.log2(r.clamp(min=2.0 ** -9))).clamp(min=-6.0)
    normal = r >= 2.0 ** -6
    mant = torch.where(normal, r / torch.pow(2.0, e) * 8.0 - 8.0, r / 2.0 ** -9)
    bits = torch.where(normal, (e + 7.0) * 8.0 + mant, mant)
    return r, bits.round().to(torch.uint8)


_E2M1_POS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e2m1_rn(x):
    # Nearest e2m1 code (ties to the even code), the sign in bit 3 (negative zero included).
    tab = torch.tensor(_E2M1_POS)
    mag = x.abs().clamp(max=6.0).unsqueeze(-1)
    score = (mag - tab).abs() + (torch.arange(8) % 2).float() * 1e-6
    code = score.argmin(dim=-1)
    return code + torch.signbit(x).long() * 8


def _pack(codes):
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def _nvfp4(input, gs, vec):
    x = input.float()
    m, k = x.shape
    blocks = x.reshape(m, k // vec, vec)
    amax = blocks.abs().amax(dim=-1)
    sf, sf_bits = _e4m3_rn(gs * amax / 6.0)
    scaled = torch.where(sf.unsqueeze(-1) > 0, (blocks * gs) / sf.unsqueeze(-1).clamp(min=1e-30),
                         torch.zeros_like(blocks))
    return _pack(_e2m1_rn(scaled).reshape(m, k)), sf_bits.reshape(-1)


def _ue8m0_up(v):
    # MX scale: the power of two at or above v (as its biased exponent byte); 0 gives 2^-127.
    e = torch.where(v > 0, torch.ceil(torch.log2(v.clamp(min=1e-38))), torch.full_like(v, -127.0))
    e = e.clamp(-127.0, 127.0)
    return torch.pow(2.0, e), (e + 127.0).to(torch.uint8)


)PY";

// Our reference's shared part: DeepSeek FP8 block scales (128 x 128 weight blocks, per-token
// 128-wide activation blocks stored [H/128, T]), SwiGLU with the gate in the second half of
// gemm1's output (as our CPU op), topk_w the routing weight of each (token, slot).
const char* const kMoeFp8Experts =
    R"PY(def _experts(hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
             gemm2_weights, gemm2_weights_scale, topk_ids, topk_w, local_expert_offset):
    T, H = hidden_states.shape
    E, G1, _ = gemm1_weights.shape
    I = G1 // 2

    def deq(w, s):
        s = s.float().repeat_interleave(128, dim=1)[:, : w.shape[1]]
        return w.float() * s.repeat_interleave(128, dim=2)[:, :, : w.shape[2]]

    a = hidden_states.float() * hidden_states_scale.float().t().repeat_interleave(128, dim=1)[:, :H]
    w1 = deq(gemm1_weights, gemm1_weights_scale)
    w2 = deq(gemm2_weights, gemm2_weights_scale)
    out = torch.zeros((T, H), dtype=torch.float32)
    for e in range(E):
        hit = topk_ids == (int(local_expert_offset) + e)
        rows = hit.any(dim=1).nonzero().flatten()
        if rows.numel() == 0:
            continue
        g = a[rows] @ w1[e].t()
        h = torch.nn.functional.silu(g[:, I:]) * g[:, :I]
        w = (topk_w[rows] * hit[rows].float()).sum(dim=1, keepdim=True)
        out[rows] += w * (h @ w2[e].t())
    return out.to(torch.bfloat16)


)PY";

// The NVFP4 experts (trtllm_fp4_block_scale_moe) on the definition's shapes as written: packed
// e2m1 pairs (low nibble first), e4m3 scales per 16 values along the last dim (linear, not the
// op's shuffled 128x4 layout), gate in the second half of gemm1's output, the per-expert
// output*_scale_scalar as docs/MOE.md's math (None = 1); the activation's intermediate NVFP4
// rounding is left out (fp32). gemm1_alpha / beta / clamp_limit are refused (not covered).
const char* const kMoeFp4Experts =
    R"PY(_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _fp4(p, s):
    tab = torch.tensor(_E2M1)
    p = p.long()
    v = torch.stack([tab[p & 15], tab[(p >> 4) & 15]], dim=-1)
    v = v.reshape(*p.shape[:-1], p.shape[-1] * 2)
    return v * s.float().repeat_interleave(16, dim=-1)[..., : v.shape[-1]]


def _experts(hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm1_bias,
             gemm2_weights, gemm2_weights_scale, gemm2_bias, output1_scale_scalar,
             output1_scale_gate_scalar, output2_scale_scalar, topk_ids, topk_w,
             local_expert_offset):
    if hidden_states_scale is None:
        x = hidden_states.float()
    else:
        x = _fp4(hidden_states, hidden_states_scale)
    w1 = _fp4(gemm1_weights, gemm1_weights_scale)
    w2 = _fp4(gemm2_weights, gemm2_weights_scale)
    E, G1, _ = w1.shape
    I = G1 // 2
    T, H = x.shape[0], w2.shape[1]

    def per_expert(t):
        return torch.ones(E) if t is None else t.float().reshape(E)

    o1, og, o2 = (per_expert(output1_scale_scalar), per_expert(output1_scale_gate_scalar),
                  per_expert(output2_scale_scalar))
    b1 = torch.zeros((E, G1)) if gemm1_bias is None else gemm1_bias.float()
    b2 = torch.zeros((E, H)) if gemm2_bias is None else gemm2_bias.float()
    out = torch.zeros((T, H), dtype=torch.float32)
    for e in range(E):
        hit = topk_ids == (int(local_expert_offset) + e)
        rows = hit.any(dim=1).nonzero().flatten()
        if rows.numel() == 0:
            continue
        acc = x[rows] @ w1[e].t()
        gate = acc[:, I:] * og[e] + b1[e, I:]
        h = torch.nn.functional.silu(gate) * (acc[:, :I] * o1[e] + b1[e, :I])
        y = (h @ w2[e].t()) * o2[e] + b2[e]
        w = (topk_w[rows] * hit[rows].float()).sum(dim=1, keepdim=True)
        out[rows] += w * y
    return out.to(torch.bfloat16)


)PY";

// Upstream's attention.py templates for the ops it traces without a committed output here:
// single_decode / single_prefill, xqa_batch_decode, cudnn_batch_{decode,prefill}, and the
// wrapper runs (BatchAttention, POD, BatchPOD, BlockSparse), plus segment_gemm_run (which
// upstream keeps in attention.py too). Axes, inputs and outputs as the template source
// (flashinfer/trace/templates/attention.py, read at 8c97e4dd), including its quirks
// (BatchAttention's kv_cache is shaped like q; the POD caches are one 4-D tensor, so a (k, v)
// pair leaves their axes unresolved, as append_paged_kv_cache's). The references are ours:
// what plan() holds (page tables, masks, segment lengths) is not in these definitions, so they
// attend over whole caches as one request (docs/TRACE.md).
const char* const kAttend = R"PY(def _attend(q, k, v, scale, causal):
    # q [m, h, d], k/v [n, kvh, d] -> out [m, h, d] fp32, lse [m, h] (base 2). Causal: query i
    # sees keys j <= n - m + i (the last query sees every key).
    m, h, d = q.shape
    n, kvh = k.shape[0], k.shape[1]
    out = torch.zeros((m, h, v.shape[-1]), dtype=torch.float32)
    lse = torch.full((m, h), -float("inf"), dtype=torch.float32)
    masked = torch.arange(n).reshape(1, -1) > (n - m + torch.arange(m).reshape(-1, 1))
    for j in range(h):
        g = j // (h // kvh)
        s = (q[:, j].float() @ k[:, g].float().T) * scale
        if causal:
            s = s.masked_fill(masked, -float("inf"))
        lse[:, j] = torch.logsumexp(s, -1) / math.log(2.0)
        out[:, j] = torch.softmax(s, -1) @ v[:, g].float()
    return out, lse


def _kv(cache):
    # A paged cache [num_pages, page_size, heads, dim] as one request's tokens; a (k, v) pair,
    # or one 4-D tensor standing for both (the definition's single shape).
    k, v = cache if isinstance(cache, (tuple, list)) else (cache, cache)
    return k.reshape(-1, k.shape[-2], k.shape[-1]), v.reshape(-1, v.shape[-2], v.shape[-1])
)PY";

// Routing from logits as our CPU op (src/kernels/cpu/moe_cpu.cpp, docs/MOE.md "Routing
// methods"): methods 0-5; only DeepSeek-V3 reads the bias (added to the sigmoid scores that
// select) and routed_scaling_factor; TopK keeps the raw logits as weights.
const char* const kRoute =
    R"PY(def _route(routing_logits, routing_bias, method, top_k, n_group, topk_group, scale):
    logits = routing_logits.float()
    method = 0 if method is None else int(method)
    k = int(top_k)
    if method == 0:
        w, ids = torch.topk(torch.softmax(logits, dim=-1), k=k, dim=1)
    elif method == 1:
        sel, ids = torch.topk(logits, k=k, dim=1)
        w = torch.softmax(sel, dim=-1)
    elif method == 2:
        s = torch.sigmoid(logits)
        ng, kg = int(n_group), int(topk_group)
        b = None if routing_bias is None else routing_bias.float().reshape(-1)
        if b is not None and ng > 1:
            b = b.to(torch.bfloat16).float()  # the grouped kernel adds the bias as bf16
        sb = s if b is None else s + b
        T, E = sb.shape
        gs = torch.topk(sb.view(T, ng, E // ng), k=2, dim=2).values.sum(dim=2)
        keep = torch.zeros_like(gs).scatter_(1, torch.topk(gs, k=kg, dim=1).indices, 1.0)
        mask = keep.unsqueeze(2).expand(T, ng, E // ng).reshape(T, E)
        _, ids = torch.topk(sb.masked_fill(mask == 0, float("-inf")), k=k, dim=1)
        sel = s.gather(1, ids)
        w = sel * (1.0 if scale is None else float(scale)) / (sel.sum(dim=1, keepdim=True) + 1e-20)
    elif method == 3:
        sel, ids = torch.topk(logits, k=1, dim=1)
        w = torch.sigmoid(sel)
    elif method == 4:
        sel, ids = torch.topk(torch.softmax(logits, dim=-1), k=k, dim=1)
        w = sel / sel.sum(dim=1, keepdim=True)
    elif method == 5:
        w, ids = torch.topk(logits, k=k, dim=1)
    elif method == 9:
        sel, ids = torch.topk(logits, k=k, dim=1)
        w = torch.sigmoid(sel)
    else:
        raise NotImplementedError("routing_method_type %d" % method)
    return ids, w


)PY";

}  // namespace flashinfer::trace::detail
