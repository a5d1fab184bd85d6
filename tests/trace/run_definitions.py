"""Checks flashinfer-bench definitions written by flashinfer-cpp (tests/trace/test_trace.cpp).

For each JSON file given: the `reference` and `init` snippets must parse (ast); with torch
importable, `init(device="cpu")` builds the inputs, `run(**inputs)` must return one value per
declared output, and each output tensor's shape must match its axes (constant axes from the
definition, variable ones from the input tensors that carry them). Prints one line per file and
exits 1 on the first failure.

usage: run_definitions.py [--parse-only] FILE...
"""
import ast
import json
import sys


# Where a definition's shapes and its math cannot agree, because the axes are upstream's: the
# gated activations' hidden_size is the input's last dim (upstream reads it there), while their
# output is half as wide. Checked as such instead.
HALF_LAST_DIM_OUTPUT = {"activation"}


def fail(path, msg):
    print(f"FAIL {path}: {msg}")
    sys.exit(1)


def check(path, parse_only):
    with open(path) as f:
        d = json.load(f)
    for field in ("reference", "init"):
        try:
            ast.parse(d[field])
        except SyntaxError as e:
            fail(path, f"{field} does not parse: {e}")
    if parse_only:
        print(f"parsed {d['name']}")
        return
    import torch

    ns = {}
    exec(compile(d["init"], f"{d['name']}:init", "exec"), ns)
    inputs = ns["init"](device="cpu")
    ref = {}
    exec(compile(d["reference"], f"{d['name']}:reference", "exec"), ref)
    if "run" not in ref:
        fail(path, "reference defines no run()")
    with torch.no_grad():
        out = ref["run"](**inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(outs) != len(d["outputs"]):
        fail(path, f"run() returned {len(outs)} values for {len(d['outputs'])} outputs")
    axes = {k: v["value"] for k, v in d["axes"].items() if v["type"] == "const" and "value" in v}
    for key, spec in d["inputs"].items():
        t = inputs.get(key)
        if isinstance(t, torch.Tensor) and spec["shape"] is not None:
            if t.dim() != len(spec["shape"]):
                fail(path, f"init's {key} has {t.dim()} dims, the definition {len(spec['shape'])}")
            for name, n in zip(spec["shape"], t.shape):
                if axes.setdefault(name, n) != n:
                    fail(path, f"input {key}: axis {name} is {n}, elsewhere {axes[name]}")
    for (key, spec), t in zip(d["outputs"].items(), outs):
        if spec["shape"] is None:
            continue
        if not isinstance(t, torch.Tensor):
            fail(path, f"output {key} is not a tensor")
        want = [axes.get(a) for a in spec["shape"]]
        if d["op_type"] in HALF_LAST_DIM_OUTPUT and want[-1] is not None:
            want[-1] //= 2
        got = list(t.shape)
        if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got)):
            fail(path, f"output {key} has shape {got}, the definition {spec['shape']} = {want}")
    print(f"ran {d['name']}")


def main():
    args = sys.argv[1:]
    parse_only = "--parse-only" in args
    for path in [a for a in args if a != "--parse-only"]:
        check(path, parse_only)


if __name__ == "__main__":
    main()
