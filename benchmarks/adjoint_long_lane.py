"""The log-likelihood's gradient on long lanes, on a GPU: ``ks.loglik`` and its gradient in the
decay, process and observation variances (and the prior mean) through ``backend="triton"``
(float32 and float64) against the float64 ``torch`` backend (the chunked projective scan under
autograd, an independent implementation) on the same device, and against the compiled CPU
kernel (``native``, float64) where it is built.

    python benchmarks/adjoint_long_lane.py [--steps 100000,1000000,4000000] [--out FILE]

Each lane set: 4 lanes, a random walk observed in noise (decay 1: the regime where rounding along
the state's direction accumulates in an adjoint), a stationary one (decay 0.999), one with 30 %
of its observations missing and one with a leading gap of 1,000 steps under a diffuse prior.
Reports each gradient's largest relative error against the float64 reference and the time of
one forward + backward (median of 3)."""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import time

import numpy as np
import torch

import kalmanscan as ks


def _lanes(T: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    decay = np.array([1.0, 0.999, 0.99, 1.0])
    pv = np.array([0.01, 0.002, 0.02, 0.05])
    ov = np.array([0.5, 0.1, 1.0, 0.2])
    x = np.zeros(4)
    z = np.empty((T, 4))
    for s in range(0, T, 100_000):  # (blocks: bounded memory for the noise)
        n = min(100_000, T - s)
        w = rng.normal(size=(n, 4)) * np.sqrt(pv)
        xs = np.empty((n, 4))
        for t in range(n):  # (a plain loop is fast enough up to a few million steps)
            x = decay * x + w[t]
            xs[t] = x
        z[s : s + n] = xs + rng.normal(size=(n, 4)) * np.sqrt(ov)
    z[rng.random(T) < 0.3, 2] = np.nan
    z[:1000, 3] = np.nan
    return z, decay, pv, ov


def _grads(z, decay, pv, ov, backend, dtype, device):
    t = lambda a: torch.tensor(a, dtype=dtype, device=device)  # noqa: E731
    params = [t(decay).requires_grad_(), t(pv).requires_grad_(), t(ov).requires_grad_()]
    zz = t(z)
    ll = ks.loglik(zz, params[2], params[0], params[1], backend=backend)
    g = torch.autograd.grad(ll.sum(), params)
    return ll.detach().double().cpu().numpy(), [x.double().cpu().numpy() for x in g]


def _time(fn, device, rounds=3):
    out = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def _rel(a, b):
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="100000,1000000,4000000")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from kalmanscan.core import native

    rows = []
    for T in (int(s) for s in args.steps.split(",")):
        lane = _lanes(T)
        ref_ll, ref_g = _grads(*lane, "torch", torch.float64, device)
        row = {"steps": T, "lanes": 4, "reference": "torch float64 on " + device.type}
        runs = (
            [("triton", torch.float32), ("triton", torch.float64)] if device.type == "cuda" else []
        )
        if native.available():
            runs.append(("native", torch.float64))
        for backend, dtype in runs:
            dev = device if backend == "triton" else torch.device("cpu")
            ll, g = _grads(*lane, backend, dtype, dev)
            name = f"{backend}-{str(dtype).replace('torch.', '')}"
            row[name] = {
                "loglik_rel_err": _rel(ll, ref_ll),
                "grad_rel_err": {
                    k: _rel(a, b)
                    for k, a, b in zip(("decay", "process_var", "obs_var"), g, ref_g, strict=True)
                },
                "fwd_bwd_ms": _time(functools.partial(_grads, *lane, backend, dtype, dev), dev),
            }
            print(T, name, json.dumps(row[name]), flush=True)
        rows.append(row)
    res = {
        "benchmark": "adjoint_long_lane.py",
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "rows": rows,
        "note": "relative errors of ks.loglik and its gradient against the float64 torch "
        "backend on the same device; fwd_bwd_ms: one ks.loglik + torch.autograd.grad, median of 3 "
        "(includes moving z to the device)",
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                res,
                f,
                indent=1,
                default=lambda x: None if isinstance(x, float) and math.isnan(x) else x,
            )


if __name__ == "__main__":
    main()
