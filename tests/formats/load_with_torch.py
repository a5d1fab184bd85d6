"""Loads .pt files with torch.load(weights_only=True) and .safetensors files with the safetensors
package (if installed), and prints every tensor's metadata and values as JSON: {path: {name:
description}}, null for a .safetensors file when the package is missing. With --write PATH it
first saves a sample with torch.save (views of one storage) for the reader's test. Used by
tests/formats/test_tensor_io.cpp, which starts it once (importing torch takes seconds).
Exits 77 when torch is not installed."""
import json
import sys

try:
    import torch
except ImportError:
    sys.exit(77)  # the test skips


def describe(t):
    return {
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "storage_offset": t.storage_offset(),
        "dtype": str(t.dtype),
        "values": t.float().flatten().tolist() if t.dtype != torch.bool else t.int().flatten().tolist(),
    }


def load(path):
    if path.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError:
            return None
        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def main(args):
    if args[:1] == ["--write"]:
        b = torch.arange(12, dtype=torch.float16).reshape(3, 4)
        torch.save({"arg_0": b.t()[1:3], "arg_1": torch.tensor([1, 2, 3], dtype=torch.int64),
                    "kwarg_x": b}, args[1])
        args = args[2:]
    out = {}
    for path in args:
        tensors = load(path)
        out[path] = None if tensors is None else {k: describe(v) for k, v in tensors.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
