#!/usr/bin/env python3
"""Rewrite upstream's flashinfer-python wheel smaller, so that it fits the 64 MiB a device call
can carry (docs/GPU_CHECK.md): drops the non-Python files under the sub-folders of
flashinfer/data/csrc/ and flashinfer/experimental/, and under flashinfer/moe_ep/kernel_src/
(kernel families scripts/gpu_check_upstream.py does not use: the decode, prefill, norm and
sampling sources sit directly in flashinfer/data/csrc/ and the headers in data/include/), and
their RECORD lines; and whole the parts of the bundled CUTLASS and CCCL that are not headers
(examples, tools, Python bindings: data/cutlass/{examples,python,tools}/, data/cccl/python/).

  gpu_check_strip_wheel.py IN.whl OUT_DIR_OR_FILE
"""
import os
import sys
import zipfile

DROP_UNDER = ("flashinfer/data/csrc/", "flashinfer/experimental/", "flashinfer/moe_ep/kernel_src/")
# Not headers: nothing upstream's JIT compiles or imports reads them.
DROP_ALL = ("flashinfer/data/cutlass/examples/", "flashinfer/data/cutlass/python/",
            "flashinfer/data/cutlass/tools/", "flashinfer/data/cccl/python/")
# But the fa3 (sm90) prefill JIT includes cutlass/util/*.h (cutlass_utils.cuh: command_line.h).
KEEP = ("flashinfer/data/cutlass/tools/util/include/",)


def dropped(name):
    if name.startswith(DROP_ALL) and not name.startswith(KEEP) and not name.endswith("/"):
        return True
    if name.endswith(".py") or name.endswith("/"):
        return False
    if name.startswith("flashinfer/data/csrc/"):
        return "/" in name[len("flashinfer/data/csrc/"):]  # keep the top-level sources
    return name.startswith(DROP_UNDER[1:])


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    src, dst = argv[1], argv[2]
    if os.path.isdir(dst):
        dst = os.path.join(dst, os.path.basename(src))
    kept = dropped_n = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        gone = {i.filename for i in zin.infolist() if dropped(i.filename)}
        for info in zin.infolist():
            if info.filename in gone:
                dropped_n += 1
                continue
            data = zin.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(l for l in lines if l.split(",", 1)[0] not in gone).encode()
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            kept += 1
    print("%s: %.1f MB -> %s: %.1f MB (%d files kept, %d dropped)" % (
        src, os.path.getsize(src) / 1e6, dst, os.path.getsize(dst) / 1e6, kept, dropped_n))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
