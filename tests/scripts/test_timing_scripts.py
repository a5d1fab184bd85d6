#!/usr/bin/env python3
"""The GPU timing scripts' commands, checked without a GPU: scripts/decode-kernels,
prefill-schedules, prefill-profile, moe-routes and gdn-prefill-kernels print their `flashinfer bench` commands with
--dry-run; every routine they name must be one `flashinfer bench --list` has and every flag one
`flashinfer bench --help` lists, so that a GPU run (minutes of lent device time) never ends on
a typo. Also: the script exits 0 and prints commands at all.

    test_timing_scripts.py SOURCE_DIR FLASHINFER_BINARY
"""
import os
import re
import subprocess
import sys

SCRIPTS = ["decode-kernels", "prefill-schedules", "prefill-profile", "moe-routes",
           "gdn-prefill-kernels"]


def main():
    src, fi = sys.argv[1], sys.argv[2]
    listing = subprocess.run([fi, "bench", "--list"], capture_output=True, text=True, check=True)
    routines = {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}
    help_text = subprocess.run([fi, "bench", "--help"], capture_output=True, text=True,
                               check=True).stdout
    flags = set(re.findall(r"--([a-z_][a-z0-9_]*)", help_text))
    failures = []
    for name in SCRIPTS:
        env = dict(os.environ, FI=fi)
        r = subprocess.run([os.path.join(src, "scripts", name), "--dry-run"], capture_output=True,
                           text=True, env=env, cwd=src)
        if r.returncode != 0:
            failures.append("%s --dry-run exited %d: %s" % (name, r.returncode, r.stderr[-300:]))
            continue
        commands = [line.split(" bench ", 1)[1] for line in r.stdout.splitlines()
                    if fi + " bench " in line]
        if not commands:
            failures.append("%s --dry-run printed no bench command" % name)
        for cmd in commands:
            cmd = cmd.split("  (", 1)[0]  # the scripts' note of the runs' switches
            routine = re.search(r"--routine (\S+)", cmd)
            if not routine or routine.group(1) not in routines:
                failures.append("%s: routine not in bench --list: %s" % (name, cmd))
            for flag in re.findall(r"(?:^|\s)--([A-Za-z_][A-Za-z0-9_]*)", cmd):
                if flag not in flags:
                    failures.append("%s: --%s is not a bench flag: %s" % (name, flag, cmd))
        print("%s: %d commands" % (name, len(commands)))
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
