#!/usr/bin/env python3
"""Upstream FlashInfer (the flashinfer-python package, JIT-compiled on the GPU machine) timed on
the shapes of scripts/gpu-check's bench phases. Two modes, one per phase, so that each JIT fits
its 10-minute command; every row that cannot run says why (one line) and the others go on.

  gpu_check_upstream.py --decode-grid PLAN.csv --out upstream_decode_grid.csv [--iters 20]
                        [--warmup 3] [--peak-tbps TB] [--deadline S] [--tensor-cores]
                        [--skip-all REASON]
      phase 6a: BatchDecodeWithPagedKVCacheWrapper (plan once, run timed) on every row of the
      decode grid that phase 5b runs (PLAN.csv: gpu_check_report.py decode-plan); decode alone,
      two JIT modules (bf16 and fp8 e4m3 KV). The CSV is rewritten after every row.
  gpu_check_upstream.py --prefill-grid PLAN.csv --out upstream_prefill_grid.csv [--iters 20]
                        [--warmup 3] [--backends fa2,auto] [--peak-tflops TF] [--deadline S]
                        [--skip-all REASON]
      phase 6c: BatchPrefillWithPagedKVCacheWrapper(backend=...) (plan once, run timed) on every
      row of the prefill grid that phase 5c runs (gpu_check_report.py prefill-plan), once per
      backend: "fa2" and the default "auto" (FA3 on Hopper); one JIT module per backend, head dim
      and mask. One CSV row per grid row and backend, rewritten after every row.
  gpu_check_upstream.py --op-grid PLAN.csv --kind sampling|rowops|gemm --out PEER.csv
                        [--iters 20] [--warmup 3] [--deadline S] [--skip-all REASON]
      phases 6d, 6e, 6f: the peer on every row of an op grid (gpu_check_report.py op-plan):
      upstream's flashinfer.sampling.top_k_top_p / top_p / top_k_sampling_from_probs on the
      softmax of logits uniform in [-8, 8] (6d); flashinfer.rmsnorm, fused_add_rmsnorm,
      silu_and_mul and apply_rope_pos_ids on bf16 inputs (6e); for the GEMM grid (5f's torch
      part, or 6f; no wheel needed) torch.matmul / torch.bmm (bf16, out given), torch._scaled_mm
      (fp8 e4m3, per-tensor scales) and, for grouped_mm_bf16 / _fp8, a Python loop of those over
      the groups (gemm_call); one timing per shape, copied to each of its backends' rows.
      TB/s or TFLOP/s from the plan's bytes / FLOPs (flashinfer bench's counts), % of the H100's
      peak as gpu_check_report.py op_peak. One CSV row per plan row, rewritten after every row.
  gpu_check_upstream.py --out upstream.csv [--iters N] [--quick]
      phase 6b: paged prefill, MLA decode (fa2 and auto), rmsnorm and
      top_k_top_p_sampling_from_logits on phase 5a's shapes; with GPU_CHECK_UPSTREAM_MOE=1 also
      cutlass_fused_moe's W4A16 MXFP4 row (its sm90 MoE module may JIT for minutes).

Timing: CUDA events around each iteration, an L2-sized buffer overwritten before each, then
the device held for 500000 clock cycles (torch.cuda._sleep) so that the Python wrapper has
queued its launches before the start event (as `flashinfer bench` does; upstream's own
benchmarks use CUDA graphs for the same reason), median. q and bf16 inputs uniform, seed 42; fp8 KV caches are bf16
draws converted to torch.float8_e4m3fn.
"""
import argparse
import csv
import math
import os
import statistics
import sys
import time
import traceback

GRID_COLUMNS = ["batch", "kv_len", "qo_heads", "kv_heads", "page", "kv_dtype", "median_ms",
                "tb_per_s", "pct_peak", "status"]


def first_line(e):
    lines = str(e).splitlines() or [type(e).__name__]
    # A failed JIT says "Ninja build failed. Ninja output:" first; the compiler's first error
    # line is what says why (session 39: a header the stripped wheel lacked).
    err = next((l.strip() for l in lines[1:] if "error" in l.lower() and "FAILED" not in l), "")
    return (lines[0] + (" " + err if err and "ninja" in lines[0].lower() else ""))[:300]


def make_timer(torch, dev, iters, warmup):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_check_report as rep
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 << 20) or (64 << 20)
    flush = torch.empty(2 * l2, dtype=torch.uint8, device=dev)

    def timeit(fn):
        # The host's lead for fn's launches (GemmCall.launches for a Python loop).
        lead = rep.host_lead_cycles(getattr(fn, "launches", 1))
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(iters):
            flush.zero_()
            if hasattr(torch.cuda, "_sleep"):  # the host's lead: its launches queued in time
                torch.cuda._sleep(lead)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e))
        return statistics.median(ts)

    return timeit


NOT_RUN = "not run (phase budget spent)"


class PeerRows:
    """A grid's peer rows (one or more per plan row, `rows` in output order), written to `path`
    with the columns `cols` after every change, so a run its budget stops keeps what it timed."""

    def __init__(self, path, cols, rows, title):
        self.path, self.cols, self.rows, self.title = path, cols, rows, title
        self.write()

    def write(self):
        with open(self.path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.cols)
            w.writeheader()
            w.writerows(self.rows)

    def skip_all(self, reason):
        """Every row still to run is skipped for `reason` (the plan's own skips stay)."""
        for r in self.rows:
            if r["status"] == NOT_RUN:
                r["status"] = "skipped: " + reason
        print("[SKIP] %s :: %s" % (self.title, reason))
        self.write()
        return 0


def import_peer(with_flashinfer):
    """(torch, flashinfer or None, None) when the peer can run here, else (None, None, why)."""
    try:
        import torch
        flashinfer = None
        if with_flashinfer:
            import flashinfer
    except Exception as e:  # the wheel or one of its dependencies is missing
        return None, None, "import: %s" % first_line(e)
    if not torch.cuda.is_available():
        return None, None, "torch sees no CUDA device"
    return torch, flashinfer, None


def decode_grid(a):
    with open(a.decode_grid, newline="") as f:
        plan = list(csv.DictReader(f))
    out = []
    for p in plan:
        row = {c: p[c] for c in GRID_COLUMNS[:6]}
        row.update(median_ms="", tb_per_s="", pct_peak="", status=p["status"] or NOT_RUN)
        out.append(row)
    peer = PeerRows(a.out, GRID_COLUMNS, out, "upstream decode grid")
    write = peer.write
    if a.skip_all:
        return peer.skip_all(a.skip_all)
    torch, flashinfer, why = import_peer(True)
    if why:
        return peer.skip_all(why)
    print("[INFO] upstream flashinfer %s, torch %s; decode grid of %d rows, %d timed + %d warm-up "
          "iterations, use_tensor_cores=%s" % (getattr(flashinfer, "__version__", "?"),
                                               torch.__version__, len(plan), a.iters, a.warmup,
                                               a.tensor_cores))
    dev = torch.device("cuda")
    timeit = make_timer(torch, dev, a.iters, a.warmup)
    torch.manual_seed(42)
    bf16 = torch.bfloat16
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)  # as upstream's benchmarks

    def run_row(p):
        B, KV, H, HK, P = (int(p[k]) for k in ("batch", "kv_len", "qo_heads", "kv_heads", "page"))
        D = int(p["head_dim"])
        kvdt = getattr(torch, p["kv_dtype"])
        per = (KV + P - 1) // P
        n = B * per
        indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * per
        indices = torch.arange(n, dtype=torch.int32, device=dev)
        last = torch.full((B,), KV - (per - 1) * P, dtype=torch.int32, device=dev)
        cache = torch.empty((n, 2, P, HK, D), dtype=kvdt, device=dev)  # NHD, K and V per page
        step = max(1, (1 << 27) // (2 * P * HK * D))  # bf16 draws in chunks (the fp8 cast)
        for s in range(0, n, step):
            e = min(n, s + step)
            cache[s:e].copy_(torch.rand((e - s, 2, P, HK, D), dtype=bf16, device=dev).mul_(2).sub_(1))
        q = torch.rand((B, H, D), dtype=bf16, device=dev).mul_(2).sub_(1)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=a.tensor_cores)
        w.plan(indptr, indices, last, H, HK, D, P, q_data_type=bf16, kv_data_type=kvdt)
        ms = timeit(lambda: w.run(q, cache))
        # K+V actually read (kv_len tokens per request) + q + o, as flashinfer bench counts.
        nbytes = B * KV * HK * D * 2 * cache.element_size() + 2 * B * H * D * 2
        return ms, nbytes

    t0 = time.monotonic()
    jit_failed, ok_dtypes = {}, set()
    for p, r in zip(plan, out):
        if p["status"]:
            continue
        if a.deadline and time.monotonic() - t0 > a.deadline:
            print("[SKIP] upstream decode grid :: the deadline (%d s) passed; the rest not run"
                  % a.deadline)
            break
        name = "b%s kv%s h%s:%s p%s %s" % (p["batch"], p["kv_len"], p["qo_heads"], p["kv_heads"],
                                          p["page"], p["kv_dtype"])
        dt = p["kv_dtype"]
        if dt in jit_failed:
            r["status"] = "error: as the first %s row: %s" % (dt, jit_failed[dt])
            write()
            continue
        try:
            ms, nbytes = run_row(p)
            tb = nbytes / (ms * 1e-3) / 1e12
            r["median_ms"], r["tb_per_s"] = "%.6f" % ms, "%.4f" % tb
            if a.peak_tbps > 0:
                r["pct_peak"] = "%.1f" % (100.0 * tb / a.peak_tbps)
            r["status"] = "ok"
            ok_dtypes.add(dt)
            print("[PERF] upstream decode %s :: median time %.4f ms; %.4f TB/sec%s"
                  % (name, ms, tb, "; %s %% of peak" % r["pct_peak"] if r["pct_peak"] else ""))
        except Exception as e:
            msg = first_line(e)
            oom = "out of memory" in msg.lower()
            if dt not in ok_dtypes and not oom:  # the JIT (or the dtype) fails: once per dtype
                jit_failed[dt] = msg
            r["status"] = "error: " + msg
            print("[SKIP] upstream decode %s :: %s" % (name, msg))
            traceback.print_exc(limit=3)
        finally:
            torch.cuda.empty_cache()
        write()
    return 0


# `items`: multi-item scoring's "prefix/item" token counts (gpu_check_report.py's PREFILL_GRIDS),
# empty for the other rows.
PREFILL_KEYS = ["batch", "qo_len", "kv_len", "qo_heads", "kv_heads", "head_dim", "causal", "items"]
PREFILL_COLUMNS = PREFILL_KEYS + ["backend", "median_ms", "tflops", "pct_peak", "status"]


def prefill_grid(a):
    with open(a.prefill_grid, newline="") as f:
        plan = list(csv.DictReader(f))
    backends = [b for b in a.backends.split(",") if b]
    out = []  # one row per (plan row, backend), plan order
    for p in plan:
        for be in backends:
            row = {c: p.get(c, "") for c in PREFILL_KEYS}
            row.update(backend=be, median_ms="", tflops="", pct_peak="",
                       status=p["status"] or NOT_RUN)
            out.append(row)
    peer = PeerRows(a.out, PREFILL_COLUMNS, out, "upstream prefill grid")
    write = peer.write
    if a.skip_all:
        return peer.skip_all(a.skip_all)
    torch, flashinfer, why = import_peer(True)
    if why:
        return peer.skip_all(why)
    print("[INFO] upstream flashinfer %s, torch %s; prefill grid of %d rows x backends %s, %d timed "
          "+ %d warm-up iterations" % (getattr(flashinfer, "__version__", "?"), torch.__version__,
                                      len(plan), ",".join(backends), a.iters, a.warmup))
    dev = torch.device("cuda")
    timeit = make_timer(torch, dev, a.iters, a.warmup)
    torch.manual_seed(42)
    bf16 = torch.bfloat16
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)  # as upstream's prefill benchmarks

    def inputs(p):
        B, Q, KV, H, HK, D = (int(p[k]) for k in PREFILL_KEYS[:6])
        P = int(p.get("page") or 16)
        per = (KV + P - 1) // P
        n = B * per
        kv_indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * per
        indices = torch.arange(n, dtype=torch.int32, device=dev)
        last = torch.full((B,), KV - (per - 1) * P, dtype=torch.int32, device=dev)
        qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * Q
        cache = torch.rand((n, 2, P, HK, D), dtype=bf16, device=dev).mul_(2).sub_(1)  # NHD
        q = torch.rand((B * Q, H, D), dtype=bf16, device=dev).mul_(2).sub_(1)
        return (qo_indptr, kv_indptr, indices, last, H, HK, D, P), q, cache

    t0 = time.monotonic()
    failed, ok = {}, set()  # (backend, head dim, causal): one JIT module each
    by_key = {}
    for r in out:
        by_key.setdefault(tuple(r[c] for c in PREFILL_KEYS), []).append(r)
    # Module by module (head dim and mask, multi-item scoring's its own; the headline's first,
    # multi-item scoring's last, so that its compile cannot spend the grid's time), each module's
    # rows in plan order: every JIT compile is paid once, before its rows, so a deadline stops
    # whole modules.
    def module(p):
        return (p["head_dim"], p["causal"], bool(p.get("items")))

    rank = {}
    for last in (False, True):
        for p in plan:
            if bool(p.get("items")) == last:
                rank.setdefault(module(p), len(rank))
    stop = False
    for p in sorted(plan, key=lambda p: rank[module(p)]):
        if p["status"] or stop:
            continue
        causal = p["causal"].strip().lower() in ("true", "1")
        args = q = cache = None
        items = p.get("items") or ""
        for r in by_key[tuple(p.get(c, "") for c in PREFILL_KEYS)]:
            if a.deadline and time.monotonic() - t0 > a.deadline:
                print("[SKIP] upstream prefill grid :: the deadline (%d s) passed; the rest not run"
                      % a.deadline)
                stop = True
                break
            be = r["backend"]
            mod = (be,) + module(p)
            name = "%s b%s qo%s kv%s h%s:%s D%s%s%s" % (
                be, p["batch"], p["qo_len"], p["kv_len"], p["qo_heads"], p["kv_heads"],
                p["head_dim"], " causal" if causal else "", " items " + items if items else "")
            if mod in failed:
                r["status"] = "error: as the first row of this backend, D and mask: %s" % failed[mod]
                write()
                continue
            try:
                if args is None:
                    args, q, cache = inputs(p)
                w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=be)
                w.plan(*args, causal=causal, q_data_type=bf16, kv_data_type=bf16,
                       **multi_item_args(torch, dev, p))
                ms = timeit(lambda: w.run(q, cache))
                flops = prefill_flops(*(int(p[k]) for k in ("batch", "qo_len", "kv_len", "qo_heads",
                                                            "head_dim")), causal, items)
                tf = flops / (ms * 1e-3) / 1e12
                r["median_ms"], r["tflops"] = "%.6f" % ms, "%.4g" % tf
                if a.peak_tflops > 0:
                    r["pct_peak"] = "%.1f" % (100.0 * tf / a.peak_tflops)
                r["status"] = "ok"
                ok.add(mod)
                print("[PERF] upstream prefill %s :: median time %.4f ms; %.3f TFLOPs/sec%s"
                      % (name, ms, tf, "; %s %% of peak" % r["pct_peak"] if r["pct_peak"] else ""))
            except Exception as e:
                msg = first_line(e)
                if mod not in ok and "out of memory" not in msg.lower():
                    failed[mod] = msg  # the JIT (or the backend) fails: once per module
                r["status"] = "error: " + msg
                print("[SKIP] upstream prefill %s :: %s" % (name, msg))
                traceback.print_exc(limit=3)
            write()
        del args, q, cache
        torch.cuda.empty_cache()
    return 0


def item_positions(kv, prefix, item):
    """token_pos_in_items of one request of multi-item scoring's prompts as flashinfer bench
    builds them (--prefix_len, --item_len): after the prefix, a delimiter (0) and then 1 .. item
    for each item, cut where the request's kv tokens end."""
    return [t % (item + 1) for t in range(kv - prefix)]


def multi_item_args(torch, dev, p):
    """Upstream's plan arguments for a multi-item scoring row (none for the others): uint32
    prefix lengths, uint16 positions padded to one length and uint16 longest items, a request
    each (the prompts are alike)."""
    if not p.get("items"):
        return {}
    prefix, item = (int(x) for x in p["items"].split("/"))
    B, KV = int(p["batch"]), int(p["kv_len"])
    pos = item_positions(KV, prefix, item)
    return dict(
        prefix_len_ptr=torch.full((B,), prefix, dtype=torch.uint32, device=dev),
        token_pos_in_items_ptr=torch.tensor(pos * B, dtype=torch.uint16, device=dev),
        token_pos_in_items_len=len(pos),
        max_item_len_ptr=torch.full((B,), max(pos), dtype=torch.uint16, device=dev))


def prefill_flops(batch, qo, kv, heads, d, causal, items=""):
    """As flashinfer bench counts them (upstream's benchmarks): causal keeps the visible pairs;
    multi-item scoring (items "prefix/item") the pairs its mask leaves visible: a query in the
    prefix sees itself and the keys before it, one past it the prefix and its own item's keys up
    to itself (a delimiter: the prefix only)."""
    if items:
        prefix, item = (int(x) for x in items.split("/"))
        pairs = prefix * (prefix + 1) / 2.0 + sum(prefix + t for t in item_positions(kv, prefix, item))
    else:
        pairs = (2.0 * kv - qo) * qo / 2.0 if causal else float(qo) * kv
    return 4.0 * batch * heads * d * pairs


def op_grid(a):
    """Phases 6d-6f: the peer on every row of an op grid's plan (gpu_check_report.py op-plan):
    upstream flashinfer-python for sampling and the row ops, torch (cuBLAS) for the GEMMs."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_check_report as rep  # the grids' definitions, peaks and flag parsing

    kind = a.op_kind
    spec = rep.OP_GRIDS[kind]
    keys = ["routine"] + spec["keys"]
    cols = keys + ["median_ms", "metric", "pct_peak", "status"]
    with open(a.op_grid, newline="") as f:
        plan = list(csv.DictReader(f))
    out = []
    for p in plan:
        row = {c: p[c] for c in keys}
        row.update(median_ms="", metric="", pct_peak="", status=p["status"] or NOT_RUN)
        out.append(row)
    peer = PeerRows(a.out, cols, out, spec["title"].lower())
    write = peer.write
    if a.skip_all:
        return peer.skip_all(a.skip_all)
    torch, flashinfer, why = import_peer(spec["peer"] == "upstream")
    if why:
        return peer.skip_all(why)
    print("[INFO] %s, torch %s; %s of %d rows, %d timed + %d warm-up iterations" % (
        "upstream flashinfer %s" % getattr(flashinfer, "__version__", "?") if flashinfer
        else "torch.matmul / torch._scaled_mm", torch.__version__, spec["title"].lower(),
        len(plan), a.iters, a.warmup))
    dev = torch.device("cuda")
    timeit = make_timer(torch, dev, a.iters, a.warmup)
    torch.manual_seed(42)
    bf16 = torch.bfloat16

    def uniform(shape, lo, hi, dtype=bf16):
        return (torch.rand(shape, dtype=torch.float32, device=dev) * (hi - lo) + lo).to(dtype)

    def build(p):
        """The timed call of a plan row, on inputs shaped as `flashinfer bench`'s hook makes them."""
        rt, fl = p["routine"], rep.flag_dict(p["flags"])
        if kind == "sampling":
            B, V = int(p["batch"]), int(p["vocab"])
            probs = torch.softmax(uniform((B, V), -8.0, 8.0, torch.float32), dim=-1)
            s = flashinfer.sampling
            if rt == "top_k_top_p_sampling_from_probs":
                k, pp = int(fl["top_k"]), float(fl["top_p"])
                return lambda: s.top_k_top_p_sampling_from_probs(probs, k, pp)
            if rt == "top_p_sampling_from_probs":
                pp = float(fl["top_p"])
                return lambda: s.top_p_sampling_from_probs(probs, pp)
            if rt == "top_k_sampling_from_probs":
                k = int(fl["top_k"])
                return lambda: s.top_k_sampling_from_probs(probs, k)
        elif kind == "rowops":
            T, H = int(p["tokens"]), int(p["hidden"])
            if rt == "rmsnorm":
                x, w = uniform((T, H), -1, 1), uniform((H,), -1, 1)
                return lambda: flashinfer.rmsnorm(x, w, 1e-6)
            if rt == "fused_add_rmsnorm":
                x, res, w = uniform((T, H), -1, 1), uniform((T, H), -1, 1), uniform((H,), -1, 1)
                return lambda: flashinfer.fused_add_rmsnorm(x, res, w, 1e-6)
            if rt == "silu_and_mul":
                x = uniform((T, 2 * H), -4, 4)
                return lambda: flashinfer.silu_and_mul(x)
            if rt == "apply_rope_pos_ids":
                hq, hk, d = int(fl["num_qo_heads"]), int(fl["num_kv_heads"]), int(fl["head_dim_qk"])
                q, k = uniform((T, hq, d), -1, 1), uniform((T, hk, d), -1, 1)
                pos = torch.arange(T, dtype=torch.int32, device=dev)
                return lambda: flashinfer.apply_rope_pos_ids(q, k, pos)
        else:
            return gemm_call(torch, dev, uniform, p, pad16)
        raise ValueError("no %s call for %s" % (spec["peer"], rt))

    # torch._scaled_mm wants row counts that are multiples of 16 in some torch versions: when a
    # probe with 17 rows fails, fp8 rows are padded to 16 (the status says so).
    pad16 = False
    if kind == "gemm":
        try:
            f8 = torch.float8_e4m3fn
            one = torch.ones((), dtype=torch.float32, device=dev)
            torch._scaled_mm(torch.zeros((17, 32), device=dev).to(f8),
                             torch.zeros((32, 32), device=dev).to(f8).t(), scale_a=one,
                             scale_b=one, out_dtype=bf16)
        except Exception as e:
            pad16 = True
            print("[INFO] torch._scaled_mm refuses 17 rows (%s): fp8 rows padded to 16"
                  % first_line(e))
    timed_shape = {}  # GEMM: torch has no backends; one timing per shape, copied to each row

    t0 = time.monotonic()
    failed, ok = {}, set()  # upstream: the first failing row of a routine (its JIT) stops it
    for p, r in zip(plan, out):
        if p["status"]:
            continue
        if a.deadline and time.monotonic() - t0 > a.deadline:
            print("[SKIP] %s :: the deadline (%d s) passed; the rest not run"
                  % (spec["title"].lower(), a.deadline))
            break
        rt = p["routine"]
        name = "%s %s" % (rt, ", ".join("%s %s" % (c, p[c]) for c in spec["keys"]))
        if rt in failed:
            r["status"] = "error: as the first %s row: %s" % (rt, failed[rt])
            write()
            continue
        shape = tuple(p[c] for c in keys if c != "backend")
        if shape in timed_shape:
            r.update(timed_shape[shape])
            write()
            continue
        try:
            call = build(p)
            what = getattr(call, "what", "")
            ms = timeit(call)
            count = float(p["flops"] if spec["metric"] == "tflops" else p["bytes"])
            val = count / (ms * 1e-3) / 1e12
            peak, unit = rep.op_peak(rt)
            r["median_ms"], r["metric"] = "%.6f" % ms, "%.4g" % val
            r["pct_peak"] = "%.1f" % (100.0 * val / peak)
            r["status"] = "ok: " + what if what else "ok"
            ok.add(rt)
            if kind == "gemm":
                timed_shape[shape] = {c: r[c] for c in ("median_ms", "metric", "pct_peak", "status")}
            print("[PERF] %s %s :: median time %.4f ms; %.4g %s; %s %% of peak"
                  % (spec["peer"], name, ms, val, unit, r["pct_peak"]))
        except Exception as e:
            msg = first_line(e)
            if flashinfer is not None and rt not in ok and "out of memory" not in msg.lower():
                failed[rt] = msg
            r["status"] = "error: " + msg
            print("[SKIP] %s %s :: %s" % (spec["peer"], name, msg))
            traceback.print_exc(limit=3)
        finally:
            torch.cuda.empty_cache()
        write()
    return 0


class GemmCall:
    """A timed torch GEMM call and the words for it (the report's peer status)."""

    def __init__(self, fn, what, launches=1):
        self.fn, self.what, self.launches = fn, what, launches

    def __call__(self):
        return self.fn()


def gemm_call(torch, dev, uniform, p, pad16):
    """torch's call for a GEMM grid row (gpu_check_report.py op-plan), on inputs shaped as the
    bench hooks make them: B an [n, k] weight used transposed, bf16 out; fp8 e4m3 with per-tensor
    scales (unit, or the grouped fp8 hook's alpha 0.5 on A); the grouped GEMMs as a Python loop
    over the groups (gpu_check_report.grouped_sizes: the hook's group sizes)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_check_report as rep

    bf16, f8 = torch.bfloat16, getattr(torch, "float8_e4m3fn", None)
    rt, B, M, N, K = p["routine"], int(p["batch"]), int(p["m"]), int(p["n"]), int(p["k"])
    one = torch.ones((), dtype=torch.float32, device=dev)

    def rows16(n):
        return (n + 15) // 16 * 16 if pad16 else n

    padded = " (rows padded to 16)" if pad16 else ""
    if "fp8" in rt and f8 is None:
        raise RuntimeError("this torch has no float8_e4m3fn")
    if rt == "mm_bf16":  # out allocated once
        x, w = uniform((M, K), -1, 1), uniform((N, K), -1, 1)
        o = torch.empty((M, N), dtype=bf16, device=dev)
        return GemmCall(lambda: torch.matmul(x, w.t(), out=o), "torch.matmul")
    if rt == "bmm_bf16":
        x, w = uniform((B, M, K), -1, 1), uniform((B, N, K), -1, 1)
        o = torch.empty((B, M, N), dtype=bf16, device=dev)
        return GemmCall(lambda: torch.bmm(x, w.transpose(1, 2), out=o), "torch.bmm")
    if rt == "bmm_fp8":  # one torch._scaled_mm per batch entry, unit scales, bf16 out
        x = uniform((B, rows16(M), K), -1, 1).to(f8)
        w = uniform((B, N, K), -1, 1).to(f8)

        def run():
            for b in range(B):
                torch._scaled_mm(x[b], w[b].t(), scale_a=one, scale_b=one, out_dtype=bf16)
        return GemmCall(run, "torch._scaled_mm x %d%s" % (B, padded), B)
    if rt in ("grouped_mm_bf16", "grouped_mm_fp8"):
        sizes = rep.grouped_sizes(B, M)
        w = uniform((B, N, K), -1, 1)
        if rt == "grouped_mm_bf16":
            starts = [sum(sizes[:g]) for g in range(B)]
            a = uniform((sum(sizes), K), -1, 1)
            o = torch.empty((sum(sizes), N), dtype=bf16, device=dev)
            segs = [(a[s:s + n], w[g].t(), o[s:s + n]) for g, (s, n) in
                    enumerate(zip(starts, sizes)) if n]

            def run():
                for x, wt, out in segs:
                    torch.matmul(x, wt, out=out)
            return GemmCall(run, "a loop of %d torch.matmul" % len(segs), len(segs))
        w8 = w.to(f8)
        alpha = torch.full((), 0.5, dtype=torch.float32, device=dev)
        segs = [(uniform((rows16(n), K), -1, 1).to(f8), w8[g].t()) for g, n in enumerate(sizes)
                if n]

        def run():
            for x, wt in segs:
                torch._scaled_mm(x, wt, scale_a=alpha, scale_b=one, out_dtype=bf16)
        return GemmCall(run, "a loop of %d torch._scaled_mm%s" % (len(segs), padded), len(segs))
    raise ValueError("no torch call for %s" % rt)


def others(a):
    rows = []

    def write():
        with open(a.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["case", "shape", "median_ms", "tflops", "tb_per_sec", "status"])
            w.writerows(rows)

    try:
        import torch
        import flashinfer
    except Exception as e:  # the wheel or one of its dependencies is missing
        rows.append(["(import)", "", "", "", "", "skipped: %s" % str(e).splitlines()[0]])
        print("[SKIP] upstream :: %s" % rows[-1][-1])
        write()
        return 0
    if not torch.cuda.is_available():
        rows.append(["(device)", "", "", "", "", "skipped: torch sees no CUDA device"])
        write()
        return 0
    print("[INFO] upstream flashinfer %s, torch %s" % (getattr(flashinfer, "__version__", "?"),
                                                       torch.__version__))
    dev = torch.device("cuda")
    timeit = make_timer(torch, dev, a.iters, 5)
    torch.manual_seed(42)
    bf16 = torch.bfloat16

    def rnd(*shape):
        return (torch.rand(shape, device=dev) - 0.5).to(bf16)

    def case(name, shape, build, flops, nbytes):
        try:
            fn = build()
            ms = timeit(fn)
            tf, tb = flops / (ms * 1e-3) / 1e12, nbytes / (ms * 1e-3) / 1e12
            rows.append([name, shape, "%.6f" % ms, "%.6f" % tf, "%.6f" % tb, "ok"])
            write()
            print("[PERF] upstream %s (%s) :: median time %.4f ms; %.4f TFLOPs/sec; %.4f TB/sec"
                  % (name, shape, ms, tf, tb))
        except Exception as e:
            msg = (str(e).splitlines() or [type(e).__name__])[0][:300]
            rows.append([name, shape, "", "", "", "error: %s" % msg])
            write()
            print("[SKIP] upstream %s :: %s" % (name, msg))
            traceback.print_exc(limit=3)

    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    H, HK, D, P = 32, 8, 128, 16

    def paged(batch, kv_len):
        pages_per = (kv_len + P - 1) // P
        indptr = torch.arange(batch + 1, dtype=torch.int32, device=dev) * pages_per
        indices = torch.arange(batch * pages_per, dtype=torch.int32, device=dev)
        last = torch.full((batch,), (kv_len - 1) % P + 1, dtype=torch.int32, device=dev)
        cache = rnd(batch * pages_per, 2, P, HK, D)
        return indptr, indices, last, cache

    # Prefill: batch 4, qo 512, kv 2048, causal (same as the bench phase's prefill row).
    PB, QO, PKV = (2, 256, 1024) if a.quick else (4, 512, 2048)

    def prefill():
        indptr, indices, last, cache = paged(PB, PKV)
        qo_indptr = torch.arange(PB + 1, dtype=torch.int32, device=dev) * QO
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(qo_indptr, indptr, indices, last, H, HK, D, P, causal=True,
               q_data_type=bf16, kv_data_type=bf16)
        q = rnd(PB * QO, H, D)
        return lambda: w.run(q, cache)

    # Causal FLOPs as upstream's benchmark counts them (the visible half of the score matrix).
    vis = sum(min(PKV, PKV - QO + i + 1) for i in range(QO))
    case("BatchPrefillWithPagedKVCacheWrapper.run", "b%d qo%d kv%d causal" % (PB, QO, PKV), prefill,
         4.0 * PB * H * vis * D, 2.0 * PB * PKV * HK * D * 2 + 4.0 * PB * QO * H * D)

    # DeepSeek prefill: ragged K/V, 128 heads (MHA), qk 192 / vo 128, causal, backends fa2 and
    # auto (FA3 on Hopper), as phase 5a's BatchPrefillWithRaggedKVCacheWrapper.run rows.
    DQO, DH = (1024, 16) if a.quick else (4096, 128)

    def deepseek(backend):
        def build():
            indptr = torch.tensor([0, DQO], dtype=torch.int32, device=dev)
            w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
            w.plan(indptr, indptr, DH, DH, 192, head_dim_vo=128, causal=True,
                   q_data_type=bf16, kv_data_type=bf16)
            q, k, v = rnd(DQO, DH, 192), rnd(DQO, DH, 192), rnd(DQO, DH, 128)
            return lambda: w.run(q, k, v)
        return build

    dvis = DQO * (DQO + 1) // 2
    for be in ("fa2", "auto"):
        case("BatchPrefillWithRaggedKVCacheWrapper.run",
             "b1 qo%d kv%d h%d d192/128 causal %s" % (DQO, DQO, DH, be), deepseek(be),
             2.0 * DH * dvis * (192 + 128), 2.0 * DQO * DH * (192 + 128) * 2)  # K V, then Q O

    # MLA decode (DeepSeek's 128 heads, ckv 512 + kpe 64, page 64), backends fa2 and auto (fa3
    # on Hopper), as phase 5a's BatchMLAPagedAttentionWrapper.run row.
    MB, MKV, MH, MP = (8, 1024, 128, 64) if a.quick else (64, 2048, 128, 64)

    def mla(backend):
        def build():
            pages_per = (MKV + MP - 1) // MP
            kv_indptr = torch.arange(MB + 1, dtype=torch.int32, device=dev) * pages_per
            kv_indices = torch.arange(MB * pages_per, dtype=torch.int32, device=dev)
            kv_lens = torch.full((MB,), MKV, dtype=torch.int32, device=dev)
            qo_indptr = torch.arange(MB + 1, dtype=torch.int32, device=dev)
            w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend=backend)
            w.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, MH, 512, 64, MP, False,
                   1.0 / math.sqrt(192.0), bf16, bf16)
            qn, qp = rnd(MB, MH, 512), rnd(MB, MH, 64)
            ckv, kpe = rnd(MB * pages_per, MP, 512), rnd(MB * pages_per, MP, 64)
            return lambda: w.run(qn, qp, ckv, kpe)
        return build

    for be in ("fa2", "auto"):
        case("BatchMLAPagedAttentionWrapper.run", "b%d kv%d h%d %s" % (MB, MKV, MH, be), mla(be),
             2.0 * MB * MH * MKV * (576 + 512),
             2.0 * MB * MKV * 576 + 2.0 * MB * MH * (576 + 512))

    # NoPE MLA (head_dim_kpe 0) as vLLM's SM90 sparse backend calls it: a request a query token,
    # page size 1, the token's top-k slots its page ids, 64 heads, backend fa3 (upstream's NoPE
    # kernel), bf16; phase 5a's --head_dim_kpe 0 row.
    NR, NK, NH = (64, 2048, 64) if a.quick else (512, 2048, 64)

    def mla_nope():
        kv_indptr = torch.arange(NR + 1, dtype=torch.int32, device=dev) * NK
        kv_indices = torch.arange(NR * NK, dtype=torch.int32, device=dev)
        kv_lens = torch.full((NR,), NK, dtype=torch.int32, device=dev)
        qo_indptr = torch.arange(NR + 1, dtype=torch.int32, device=dev)
        w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend="fa3")
        w.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, NH, 512, 0, 1, False,
               1.0 / math.sqrt(192.0), bf16, bf16)
        qn = rnd(NR, NH, 512)
        qp = qn[..., 512:]
        kv = rnd(NR * NK, 1, 512)
        return lambda: w.run(qn, qp, kv, kv[..., 512:])

    case("BatchMLAPagedAttentionWrapper.run", "nope r%d topk%d h%d page1 fa3" % (NR, NK, NH),
         mla_nope, 2.0 * NR * NH * NK * (512 + 512), 2.0 * NR * NK * 512 + 2.0 * NR * NH * 1024)

    R, HS = 128, 4096

    def rms():
        x, wt = rnd(R, HS), rnd(HS)
        return lambda: flashinfer.rmsnorm(x, wt, 1e-6)

    case("rmsnorm", "rows%d hidden%d" % (R, HS), rms, 4.0 * R * HS, 2.0 * (2 * R * HS + HS))

    SB, V = 64, 128256

    def sampling():
        logits = (torch.rand(SB, V, device=dev) * 10).float()
        return lambda: flashinfer.sampling.top_k_top_p_sampling_from_logits(logits, 50, 0.9)

    case("top_k_top_p_sampling_from_logits", "b%d vocab%d k50 p0.9" % (SB, V), sampling,
         0.0, 4.0 * SB * V)
    # cutlass_fused_moe W4A16 MXFP4 (gpt-oss's Hopper path in vLLM and SGLang), phase 5a's
    # --use_w4_group_scaling row: 128 tokens, hidden = inter = 2944, 8 experts, top-2, Swiglu with
    # gpt-oss's SwigluBias parameters. Opt-in (GPU_CHECK_UPSTREAM_MOE=1): the wheel may JIT its
    # sm90 MoE module first, which can take minutes of device time.
    if os.environ.get("GPU_CHECK_UPSTREAM_MOE") == "1":
        MT, MHID, MI, ME = (16, 256, 256, 8) if a.quick else (128, 2944, 2944, 8)

        def moe_w4a16():
            from flashinfer.fused_moe import (cutlass_fused_moe,
                                              interleave_moe_scales_for_sm90_mixed_gemm,
                                              interleave_moe_weights_for_sm90_mixed_gemm)

            def u8(*shape, lo=0, span=256):
                return torch.randint(lo, lo + span, shape, dtype=torch.uint8, device=dev)

            w1 = interleave_moe_weights_for_sm90_mixed_gemm(u8(ME, 2 * MI, MHID // 2), "fp4")
            w2 = interleave_moe_weights_for_sm90_mixed_gemm(u8(ME, MHID, MI // 2), "fp4")
            s1 = interleave_moe_scales_for_sm90_mixed_gemm(u8(ME, 2 * MI, MHID // 32, lo=120, span=4))
            s2 = interleave_moe_scales_for_sm90_mixed_gemm(u8(ME, MHID, MI // 32, lo=120, span=4))
            x = rnd(MT, MHID)
            ids = torch.stack([torch.arange(MT, device=dev) % ME,
                               (torch.arange(MT, device=dev) + 1) % ME], 1).to(torch.int32)
            scales = torch.rand(MT, 2, device=dev)
            par = [torch.full((ME,), v, dtype=torch.float32, device=dev) for v in (1.702, 1.0, 7.0)]
            out = torch.empty(MT, MHID, dtype=bf16, device=dev)
            qs = [s1.view(torch.int32), s2.view(torch.int32)]
            return lambda: cutlass_fused_moe(x, ids, scales, w1, w2, bf16, qs, swiglu_alpha=par[0],
                                             swiglu_beta=par[1], swiglu_limit=par[2], output=out,
                                             use_w4_group_scaling=True)

        rows_moe = 2.0 * MT
        case("cutlass_fused_moe", "w4a16 m%d h%d i%d e%d top2" % (MT, MHID, MI, ME), moe_w4a16,
             2.0 * rows_moe * MHID * 2 * MI + 2.0 * rows_moe * MI * MHID,
             2.0 * MT * MHID * 2 + ME * 3 * MI * MHID / 2.0 + ME * 3 * MI * MHID / 32.0)
    write()
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--decode-grid", help="phase 5b's grid plan (decode_grid_plan.csv)")
    ap.add_argument("--iters", type=int, default=None, help="timed iterations (grid 20, others 30)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up iterations (grid)")
    ap.add_argument("--peak-tbps", type=float, default=0.0, help="the device's peak, for %% of peak")
    ap.add_argument("--deadline", type=float, default=0.0, help="seconds; then no new grid row")
    ap.add_argument("--prefill-grid", help="phase 5c's grid plan (prefill_grid_plan.csv)")
    ap.add_argument("--backends", default="fa2,auto", help="prefill grid: upstream backends")
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="the device's dense 16-bit tensor peak, for %% of peak (prefill grid)")
    ap.add_argument("--tensor-cores", action="store_true", help="use_tensor_cores=True (grid)")
    ap.add_argument("--skip-all", default="", help="write every grid row as skipped: REASON")
    ap.add_argument("--op-grid", help="an op grid's plan (gpu_check_report.py op-plan)")
    ap.add_argument("--kind", dest="op_kind", choices=["sampling", "rowops", "gemm"],
                    help="the op grid's kind (with --op-grid)")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.op_grid:
        if not a.op_kind:
            ap.error("--op-grid needs --kind")
        a.iters = a.iters or 20
        return op_grid(a)
    if a.decode_grid:
        a.iters = a.iters or 20
        return decode_grid(a)
    if a.prefill_grid:
        a.iters = a.iters or 20
        return prefill_grid(a)
    a.iters = a.iters or 30
    return others(a)


if __name__ == "__main__":
    sys.exit(main())
