#!/usr/bin/env python3
"""The docs check of scripts/demo (ctest: docs_demo_description).

    check_demo_docs.py SOURCE_DIR

Fails (exit 1, naming each disagreement) when the demo's description in README.md (the
paragraph starting "`scripts/demo` builds") or in docs/CHAT.md (section "The main job") and
scripts/demo itself disagree on
- the recording mode: ring mode with FLASHINFER_DUMP_RING=N in the script must be named as
  `FLASHINFER_DUMP_RING=N`, "ring mode" and "the last N calls" (and no record-everything cap);
- the dump path: the script's FLASHINFER_DUMP_DIR and the trigger its `ring_*_<reason>` glob
  picks give `<dir>/ring_pid<PID>_dump0001_<reason>/`, which the text must name (the trigger
  must also be in the script's FLASHINFER_DUMP_TRIGGER);
- the call count: "the last N calls" plus "the A setup calls" (the anchors) must be the total
  the text quotes as "T calls" (what `flashinfer show` prints for the demo's dump).
"""
import os
import re
import sys


def demo_facts(script):
    facts = {}
    m = re.search(r"\bFLASHINFER_DUMP_RING=(\d+)", script)
    if m is None and re.search(r'\bFLASHINFER_DUMP_RING="\$ring"', script):
        # The size in a variable: its first assignment is the CPU's (the README's demo).
        m = re.search(r"^ring=(\d+)$", script, re.M)
    facts["ring"] = int(m.group(1)) if m else 0
    m = re.search(r"\bFLASHINFER_DUMP_TRIGGER=([\w,]+)", script)
    facts["triggers"] = m.group(1).split(",") if m else []
    m = re.search(r"^DUMPS=(\S+)$", script, re.M)
    dumps = m.group(1) if m else None
    if dumps and re.search(r'FLASHINFER_DUMP_DIR="\$DUMPS"', script) is None:
        dumps = None
    facts["dump_dir"] = dumps[2:] if dumps and dumps.startswith("./") else dumps
    m = re.search(r'"\$DUMPS"/ring_\*_(\w+)', script)
    facts["reason"] = m.group(1) if m else None
    return facts


def check_text(name, text, f):
    """The disagreements between one description and the script's facts."""
    bad = []
    if not text:
        return [f"{name}: the demo's description was not found"]
    flat = " ".join(text.split())
    if f["ring"] > 0:
        n = f["ring"]
        for want in (f"`FLASHINFER_DUMP_RING={n}`", "ring mode", f"the last {n} calls"):
            if want.lower() not in flat.lower():
                bad.append(f"{name}: scripts/demo records in ring mode (FLASHINFER_DUMP_RING={n}); "
                           f"the text does not say {want!r}")
        for stale in ("FLASHINFER_DUMP_MAX_COUNT", "capped at", "dumped into `./flashinfer_dumps`"):
            if stale in flat:
                bad.append(f"{name}: says {stale!r}, a record-everything cap; scripts/demo uses "
                           "ring mode")
        for m in re.finditer(r"`FLASHINFER_DUMP_RING=(\d+)`", flat):
            if int(m.group(1)) != n:
                bad.append(f"{name}: quotes FLASHINFER_DUMP_RING={m.group(1)}; scripts/demo "
                           f"sets {n}")
        # The dump path.
        if not f["dump_dir"] or not f["reason"]:
            bad.append("scripts/demo: no DUMPS=... passed as FLASHINFER_DUMP_DIR, or no "
                       '"$DUMPS"/ring_*_<reason> glob: this check cannot read the dump path')
        else:
            path = f"{f['dump_dir']}/ring_pid<PID>_dump0001_{f['reason']}/"
            if f"`{path}`" not in flat:
                bad.append(f"{name}: does not name the demo's dump `{path}`")
            if f["reason"] not in f["triggers"]:
                bad.append(f"scripts/demo: looks for ring_*_{f['reason']} but "
                           f"FLASHINFER_DUMP_TRIGGER={','.join(f['triggers'])} lacks it")
            for m in re.finditer(r"`([\w./-]*ring_pid<PID>_dump\d+_\w+/)`", flat):
                if m.group(1) != path:
                    bad.append(f"{name}: names the dump `{m.group(1)}`; scripts/demo writes "
                               f"`{path}`")
        # The call count.
        anchors = re.search(r"the (\d+) setup calls", flat, re.I)
        totals = [int(t) for t in re.findall(r"(?<![\w.=])(\d+) calls\b", flat)
                  if int(t) != n and (not anchors or int(t) != int(anchors.group(1)))]
        if not anchors:
            bad.append(f"{name}: does not say how many setup calls (anchors) the dump adds: "
                       "'the A setup calls'")
        elif not totals:
            bad.append(f"{name}: quotes no total ('T calls') for the dump")
        else:
            want = n + int(anchors.group(1))
            for t in totals:
                if t != want:
                    bad.append(f"{name}: quotes {t} calls; the last {n} calls plus the "
                               f"{anchors.group(1)} setup calls make {want}")
    else:
        if "ring mode" in flat or "FLASHINFER_DUMP_RING" in flat:
            bad.append(f"{name}: describes ring mode; scripts/demo does not set "
                       "FLASHINFER_DUMP_RING")
    return bad


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")

    def read(p):
        with open(os.path.join(src, p), encoding="utf-8") as fh:
            return fh.read()

    facts = demo_facts(read("scripts/demo"))
    readme = read("README.md")
    m = re.search(r"^`scripts/demo` builds.*?(?=\n\n)", readme, re.S | re.M)
    chat = read("docs/CHAT.md")
    c = re.search(r"^## The main job \(`scripts/demo`\)\n(.*?)(?=^## |\Z)", chat, re.S | re.M)
    bad = check_text("README.md", m.group(0) if m else "", facts)
    bad += check_text("docs/CHAT.md", c.group(1) if c else "", facts)
    if facts["ring"] == 0 and not bad:
        print("scripts/demo records every call (no ring mode); the docs do not say otherwise")
    for b in bad:
        print(b)
    if not bad:
        print(f"README.md and docs/CHAT.md describe scripts/demo as it runs: {facts}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
