"""Checks flashinfer-bench definitions written by flashinfer-cpp (tests/trace/test_trace.cpp), all
in one process: `import torch` costs most of a check (about 1.5 s of CPU), so the test asks once.

usage: check_definitions.py MANIFEST.json

The manifest: {"run": [DEFINITION.json, ...], "io": [{"definition": D, "out": OUT.pt, "set": {..}}]}

- "run": the `reference` and `init` snippets must parse (ast); with torch importable,
  `init(device="cpu")` builds the inputs, `run(**inputs)` must return one value per declared
  output, and each output tensor's shape must match its axes (constant axes from the definition,
  variable ones from the input tensors that carry them).
- "io" (torch only): `init(device="cpu", seed=1)`, then the inputs named in "set" replaced by its
  values, then `run`; the tensor inputs ("in.<name>") and the outputs ("out.<i>") go to OUT as
  one torch.save dict, for the test to run the library's op on the same inputs.

Prints "torch: yes" or "torch: no" first (without torch: "run" is parse-only and "io" is
skipped), then one line per definition; exits 1 on the first failure.
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


def load(path):
    with open(path) as f:
        d = json.load(f)
    for field in ("reference", "init"):
        try:
            ast.parse(d[field])
        except SyntaxError as e:
            fail(path, f"{field} does not parse: {e}")
    return d


def snippets(d):
    ns, ref = {}, {}
    exec(compile(d["init"], f"{d['name']}:init", "exec"), ns)
    exec(compile(d["reference"], f"{d['name']}:reference", "exec"), ref)
    return ns["init"], ref.get("run")


def check(path, torch):
    d = load(path)
    if torch is None:
        print(f"parsed {d['name']}")
        return
    init, run = snippets(d)
    if run is None:
        fail(path, "reference defines no run()")
    inputs = init(device="cpu")
    with torch.no_grad():
        out = run(**inputs)
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


def write_io(case, torch):
    d = load(case["definition"])
    init, run = snippets(d)
    inputs = init(device="cpu", seed=1)
    inputs.update(case.get("set", {}))
    saved = {"in." + k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    args = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    with torch.no_grad():
        out = run(**args)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    for i, t in enumerate(outs):
        saved[f"out.{i}"] = t.contiguous()
    torch.save(saved, case["out"])
    print(f"wrote {case['out']}")


def main():
    with open(sys.argv[1]) as f:
        manifest = json.load(f)
    try:
        import torch
    except ImportError:
        torch = None
    print("torch:", "no" if torch is None else "yes", flush=True)
    for path in manifest.get("run", []):
        check(path, torch)
    if torch is not None:
        for case in manifest.get("io", []):
            write_io(case, torch)


if __name__ == "__main__":
    main()
