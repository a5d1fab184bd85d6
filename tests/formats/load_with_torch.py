"""Loads a .pt file with torch.load(weights_only=True), or a .safetensors file with the
safetensors package (if installed), and prints every tensor's metadata and values as JSON.
Used by tests/formats/test_tensor_io.cpp to check that other tools read our files."""
import json
import sys

try:
    import torch
except ImportError:
    sys.exit(77)  # the test skips: one interpreter start, no separate check


def describe(t):
    return {
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "storage_offset": t.storage_offset(),
        "dtype": str(t.dtype),
        "values": t.float().flatten().tolist() if t.dtype != torch.bool else t.int().flatten().tolist(),
    }


def main(path):
    if path.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError:
            sys.exit(77)
        tensors = load_file(path)
    else:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    print(json.dumps({k: describe(v) for k, v in tensors.items()}))


if __name__ == "__main__":
    main(sys.argv[1])
