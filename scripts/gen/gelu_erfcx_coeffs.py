#!/usr/bin/python3
"""Coefficients of the AVX-512 fp32 gelu in src/kernels/cpu/activation_cpu.cpp (kGeluHalfErfcx).

G(a) = erfcx(a / sqrt 2) / 2 = e^(a^2/2) erfc(a / sqrt 2) / 2 for a = |x| in [0, 16), on 32
intervals of width 1/2: interval i covers a = (i + s) / 2, s in [0, 1], with a degree-5
polynomial in s. Each is a least-squares fit of the relative error on 64 Chebyshev nodes, with
G evaluated by mpmath at 40 digits; the script then evaluates the fp32-rounded coefficients by
fp32 FMA Horner on a fine grid and prints the worst relative error (1.7e-7).

Run with Debian's python3-numpy and python3-mpmath (/usr/bin/python3); not part of the build.
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 40
DEGREE, INTERVALS, WIDTH = 5, 32, 0.5


def g(a):
    z = mp.mpf(a) / mp.sqrt(2)
    return mp.erfc(z) * mp.exp(z * z) / 2


def fit(i, nodes=64):
    s = 0.5 + 0.5 * np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes)
    f = np.array([float(g((i + x) * WIDTH)) for x in s])
    v = np.vander(s, DEGREE + 1, increasing=True) / f[:, None]
    c, *_ = np.linalg.lstsq(v, np.ones_like(f), rcond=None)
    return c.astype(np.float32)


def worst_relative_error(i, c):
    s = np.linspace(0, 1, 1001).astype(np.float32)
    p = np.full_like(s, c[-1])
    for cc in c[-2::-1]:  # fp32 FMA: exact product and sum, one rounding
        p = (p.astype(np.float64) * s.astype(np.float64) + np.float64(cc)).astype(np.float32)
    f = np.array([float(g((i + float(x)) * WIDTH)) for x in s])
    return float(np.max(np.abs(p / f - 1)))


def main():
    coeffs = [fit(i) for i in range(INTERVALS)]
    worst = max(worst_relative_error(i, c) for i, c in enumerate(coeffs))
    print(f"// worst relative error of the fp32 polynomials: {worst:.2e}")
    for k in range(DEGREE + 1):
        print("    {" + ", ".join(f"{float(c[k]):.9g}f" for c in coeffs) + "},")


if __name__ == "__main__":
    main()
