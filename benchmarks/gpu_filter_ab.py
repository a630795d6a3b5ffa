"""The scalar Triton filter through the public API on a GPU, for A/B runs of two trees: ``ks.filter``
(outputs written) and ``ks.loglik`` with its gradient in per-lane ``decay``, ``process_var`` and
``obs_var`` (``backend="triton"``), float32 and float64, at 2^20 x 64, 4,096 x 65,536 and
1,000 x 100,000 (a random walk). Prints one JSON line: each call's median of 15 CUDA-event
timings after 3 warm-ups and its error against the float64 ``torch`` backend on the device (the
filtered means relative to their scale; the log-likelihood relative); a call whose error passes
1e-3 (float32) or 1e-10 (float64) gets no timing.

    PYTHONPATH=/path/to/tree python benchmarks/gpu_filter_ab.py   # alternate trees, compare
"""

from __future__ import annotations

import json
import statistics

import torch

import kalmanscan as ks

SHAPES = ((2**20, 64), (4096, 65536), (1000, 100000))


def _median_ms(f):
    ts = []
    for i in range(18):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        f()
        e.record()
        torch.cuda.synchronize()
        if i >= 3:
            ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def _one(T, N, dtype, tol, res):
    g = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(T, N, device="cuda", dtype=dtype, generator=g).cumsum(0) * 0.1
    a, p, R = (torch.full((N,), v, device="cuda", dtype=dtype, requires_grad=True)
               for v in (0.999, 0.01, 0.5))  # fmt: skip
    z64, a64, p64, R64 = (x.detach().double() for x in (z, a, p, R))
    ref = ks.filter(z64, R64, a64, p64, backend="torch")
    got = ks.filter(z, R.detach(), a.detach(), p.detach(), backend="triton")
    err_f = float((got.mean.double() - ref.mean).abs().max() / ref.mean.abs().max())
    err_l = float(((got.loglik.double() - ref.loglik).abs() / ref.loglik.abs()).max())

    def f1():
        return ks.filter(z, R.detach(), a.detach(), p.detach(), backend="triton").mean

    def f2():
        ll = ks.loglik(z, R, a, p, backend="triton").sum()
        return torch.autograd.grad(ll, (a, p, R))

    for name, f, err in (("filter", f1, err_f), ("loglik_grad", f2, err_l)):
        key = f"{name} {str(dtype)[6:]} {T}x{N}"
        res[key] = {"err": err, "median_ms": _median_ms(f) if err <= tol else None}


def main() -> None:
    res = {}
    for dtype in (torch.float32, torch.float64):
        for T, N in SHAPES:
            _one(T, N, dtype, 1e-3 if dtype == torch.float32 else 1e-10, res)
            torch.cuda.empty_cache()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
