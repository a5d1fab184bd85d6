#!/usr/bin/python3
"""Coefficients of simd512::exp_reduced in src/kernels/cpu/cpu_avx512.h.

e^r on |r| <= ln2/2 (plus 0.05 % for the reduction's rounding) as a degree-6 polynomial
evaluated by FMA Horner: a least-squares fit of the relative error on 200 Chebyshev nodes, with
e^r from mpmath at 40 digits. The script rounds the coefficients to fp32, emulates the fp32 FMA
Horner (one rounding per step) on a fine grid and prints the worst relative error (6.6e-8).

Run with Debian's python3-numpy and python3-mpmath (/usr/bin/python3); not part of the build.
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 40
DEGREE = 6
HALF_WIDTH = float(mp.log(2)) / 2 * 1.0005


def main():
    nodes = 200
    r = HALF_WIDTH * np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes)
    f = np.array([float(mp.exp(x)) for x in r])
    v = np.vander(r, DEGREE + 1, increasing=True) / f[:, None]
    c, *_ = np.linalg.lstsq(v, np.ones_like(f), rcond=None)
    c = c.astype(np.float32)
    grid = np.linspace(-HALF_WIDTH, HALF_WIDTH, 4001).astype(np.float32)
    p = np.full(grid.shape, c[-1], dtype=np.float32)
    for cc in c[-2::-1]:  # fp32 FMA: exact product and sum, one rounding
        p = (p.astype(np.float64) * grid.astype(np.float64) + np.float64(cc)).astype(np.float32)
    exact = np.array([float(mp.exp(float(x))) for x in grid])
    print(f"// worst relative error of the fp32 Horner polynomial: {np.max(np.abs(p / exact - 1)):.2e}")
    print("// c0 .. c6: " + ", ".join(f"{float(x):.9g}f" for x in c))


if __name__ == "__main__":
    main()
