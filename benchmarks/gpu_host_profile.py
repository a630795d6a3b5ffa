"""Where a public call's time goes on CUDA: wall time of the call against the device time of its
kernels, and the host's profile (cProfile) of repeated calls.

    python benchmarks/gpu_host_profile.py [--fit] [--out results.json]

For each shape of the public table: ``ks.filter``, ``ks.smooth``, ``ks.loglik`` and ``ks.loglik``
+ gradient,
timed by ``triton.testing.do_bench`` (median) and by the CUDA profiler (summed kernel time), and
the top host functions by own time over 20 calls. ``--fit`` adds ``fit_ou`` on 16,384 x 500.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gpu import bench, launches, public_inputs  # noqa: E402

from kalmanscan.validation.run_meta import run_meta  # noqa: E402


def host_profile(fn, n=20, top=18):
    fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def shape_rows(ks, T, N):
    """The rows of one shape: each public call's do_bench time, kernels, kernel time, host loop
    time, and its host profile (printed)."""
    z, R, a, p = public_inputs(T, N)
    leaves = [x.clone().requires_grad_(True) for x in (R, a, p)]
    calls = {
        "filter": lambda: ks.filter(z, R, a, p),
        "smooth": lambda: ks.smooth(z, R, a, p),
        "loglik": lambda: ks.loglik(z, R, a, p),
        "loglik_grad": lambda: torch.autograd.grad(ks.loglik(z, *leaves).sum(), leaves),
    }
    rows = []
    for name, fn in calls.items():
        ms = bench(fn)
        k, kms, copies = launches(fn)
        # host time of one call when the device is idle and nothing waits on it
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        loop_ms = (time.perf_counter() - t0) / 20 * 1e3
        prof = host_profile(fn)
        row = dict(shape=[T, N], call=name, do_bench_ms=ms, kernels=k, kernel_ms=kms,
                   copies=copies, loop_ms=loop_ms)  # fmt: skip
        print(json.dumps(row), flush=True)
        print(prof, flush=True)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="1048576x64,4096x65536,1000x100000")
    args = ap.parse_args()
    import kalmanscan as ks

    res = []
    for sh in args.shapes.split(","):
        T, N = map(int, sh.split("x"))
        res += shape_rows(ks, T, N)
        torch.cuda.empty_cache()
    if args.fit:
        import numpy as np

        S, T = 16384, 500
        rng = np.random.default_rng(5)
        q = rng.uniform(0.05, 0.5, S)
        r = rng.uniform(0.5, 2.0, S)
        x = np.cumsum(rng.normal(size=(T, S)) * np.sqrt(q), axis=0)
        zz = x + rng.normal(size=(T, S)) * np.sqrt(r)
        zz[rng.random((T, S)) < 0.05] = np.nan
        kw = dict(fix={"theta": 0.0, "mu": 0.0}, stderr=False, device="cuda")
        ks.fit_ou(zz[:, :64], **kw)
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        t0 = time.perf_counter()
        pr.enable()
        fit = ks.fit_ou(zz, **kw)
        torch.cuda.synchronize()
        pr.disable()
        wall = time.perf_counter() - t0
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(40)
        n_iter = int(np.max(fit.n_iter)) if hasattr(fit, "n_iter") else None
        print("fit_ou wall", wall, "n_iter max", n_iter)
        print(s.getvalue())
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue())
        res.append(dict(call="fit_ou", wall_s=wall))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**run_meta(cuda=True), "rows": res}, f, indent=1)


if __name__ == "__main__":
    main()
