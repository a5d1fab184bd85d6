"""Reference values for tests/formats/test_gguf.cpp, from the `gguf` PyPI package.

Usage: gguf_reference.py MODEL.gguf OUTDIR (--all | PREFIX...) [--bytes NAME...]

Dequantizes the tensors of MODEL whose names start with one of the PREFIXes (every tensor with
--all) with gguf.quants.dequantize and writes OUTDIR/sums.txt, one line per tensor:
"name type_name shape(ggml order, comma-separated) checksum", where checksum is the sum over i of
bits[i] * (2 i + 1) modulo 2^64 of the float32 bit patterns (one differing element always changes
it: the multiplier is odd). For each NAME after --bytes it also writes OUTDIR/NAME.f32 (the
float32 values) and OUTDIR/NAME.bf16 (those rounded to nearest even, computed here from the
bits), compared byte for byte.
"""
import os
import sys

try:
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
except ImportError:
    sys.exit(77)  # the test skips: one interpreter start, no separate check


def checksum(values):
    bits = np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint32)
    total = np.uint64(0)
    chunk = 1 << 20  # bounded temporaries for the 28M-element embedding
    with np.errstate(over="ignore"):
        for start in range(0, bits.size, chunk):
            b = bits[start:start + chunk].astype(np.uint64)
            mult = np.arange(start, start + b.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
            total = total + np.sum(b * mult, dtype=np.uint64)
    return int(total)


def to_bf16_bits(values):
    # Round to nearest even on the bit pattern (the model's values are finite).
    bits = values.reshape(-1).view(np.uint32).astype(np.uint64)
    rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return rounded.astype(np.uint16)


def main(model, outdir, args):
    prefixes, names = args, []
    if "--bytes" in args:
        at = args.index("--bytes")
        prefixes, names = args[:at], args[at + 1:]
    reader = GGUFReader(model)
    os.makedirs(outdir, exist_ok=True)
    wanted = set(names)
    with open(os.path.join(outdir, "sums.txt"), "w") as out:
        for t in reader.tensors:
            if "--all" not in prefixes and not any(t.name.startswith(p) for p in prefixes):
                continue
            values = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            shape = ",".join(str(int(d)) for d in t.shape)
            out.write(f"{t.name} {t.tensor_type.name} {shape} {checksum(values)}\n")
            if t.name in wanted:
                values = np.ascontiguousarray(values)
                values.tofile(os.path.join(outdir, t.name + ".f32"))
                to_bf16_bits(values).tofile(os.path.join(outdir, t.name + ".bf16"))
                wanted.discard(t.name)
    if wanted:
        sys.exit("no tensor named " + ", ".join(sorted(wanted)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
