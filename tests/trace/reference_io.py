"""Writes a definition's init inputs and its reference outputs as one torch.save dict, for
tests/trace/test_trace.cpp (ReferencesMatchTheLibrary) to run the library's op on the same
inputs: keys "in.<input name>" (tensor inputs) and "out.<i>" (the reference's outputs, in order).

usage: reference_io.py DEFINITION.json OUT.pt [DEFINITION.json OUT.pt ...]
"""
import json
import sys

import torch

def write(definition, path):
    d = json.load(open(definition))
    ns, ref = {}, {}
    exec(d["init"], ns)
    exec(d["reference"], ref)
    inputs = ns["init"](device="cpu", seed=1)
    saved = {"in." + k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    args = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    with torch.no_grad():
        out = ref["run"](**args)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    for i, t in enumerate(outs):
        saved[f"out.{i}"] = t.contiguous()
    torch.save(saved, path)


for a in range(1, len(sys.argv), 2):
    write(sys.argv[a], sys.argv[a + 1])
