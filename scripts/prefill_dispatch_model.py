#!/usr/bin/env python3
"""Greedy list-scheduling model of the FA2 prefill grid's dispatch order (docs/PERFORMANCE.md,
"Dispatch order"). Blocks start in index order whenever one of `slots` (blocks an SM holds x SMs)
frees; a block's cost is its visible 64-key tiles (causal: up to its last query's position) + 1.
Prints the makespan of the old order (work items fastest, heads outer) and the new one (heads
fastest, work items from the plan's last) against the lower bound (total cost / slots).

    scripts/prefill_dispatch_model.py [--slots 264]
"""
import argparse
import heapq


def makespan(costs, slots):
    free = [0.0] * slots
    for c in costs:
        t = heapq.heappop(free)
        heapq.heappush(free, t + c)
    return max(free)


def orders(batch, qo, group, heads, causal, cta_rows=128, tile_keys=64):
    """Per-block costs in the old and the new dispatch order."""
    tiles = qo * group // cta_rows  # query tiles of cta_rows packed rows per request
    work = []  # the plan's order: requests, then query tiles
    for _ in range(batch):
        for i in range(tiles):
            keys = (i + 1) * cta_rows // group if causal else qo
            work.append(1.0 + keys / tile_keys)
    old = [c for _ in range(heads) for c in work]
    new = [c for c in reversed(work) for _ in range(heads)]
    return old, new


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=264, help="blocks at once (2 x 132 SMs)")
    a = ap.parse_args()
    print("| shape (32:8, D 128) | old order | new order | lower bound |")
    print("|---|---:|---:|---:|")
    for batch, qo, causal in [(1, 2048, True), (1, 8192, True), (8, 2048, True), (8, 8192, True),
                              (1, 8192, False)]:
        old, new = orders(batch, qo, 4, 8, causal)
        print(f"| batch {batch}, qo = kv = {qo}, {'causal' if causal else 'not causal'} | "
              f"{makespan(old, a.slots):.1f} | {makespan(new, a.slots):.1f} | "
              f"{sum(old) / a.slots:.1f} |")


if __name__ == "__main__":
    main()
