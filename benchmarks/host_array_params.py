"""Wall time of one ``ks.filter`` / ``ks.loglik`` call on CUDA (``backend="triton"``, float64,
T = 1000, N = 1024) with plain-number parameters and with per-lane array parameters: the host
cost of what the API does per call, such as the device screen of tiny variances that array
parameters on a GPU take (docs/reliability.md, "Every variance tiny").

    python benchmarks/host_array_params.py            # prints one JSON line

Run it alternately with two trees on ``PYTHONPATH`` to compare them (medians of 300 calls after
20 warm-ups). Each case's results are first checked against the float64 ``torch`` backend
(largest error relative to the means' scale, or the log-likelihoods', printed as
``max_rel_err``); above 1e-10 no speed is reported."""

from __future__ import annotations

import json
import statistics
import time

import torch

import kalmanscan as ks


def main() -> None:
    dev = torch.device("cuda")
    T, N = 1000, 1024
    g = torch.Generator().manual_seed(0)
    z = torch.randn(T, N, generator=g, dtype=torch.float64).to(dev)
    R, P, A = (torch.full((N,), v, dtype=torch.float64, device=dev) for v in (0.5, 0.1, 0.9))
    cases = {
        "filter-numbers": lambda: ks.filter(z, 0.5, 0.9, 0.1, backend="triton"),
        "filter-arrays": lambda: ks.filter(z, R, A, P, backend="triton"),
        "loglik-arrays": lambda: ks.loglik(z, R, A, P, backend="triton"),
    }
    # the check before any speed (a path whose results are wrong reports none): every case's
    # means against the float64 torch backend on the same inputs
    ref = ks.filter(z, 0.5, 0.9, 0.1, backend="torch").mean
    out = {"max_rel_err": 0.0}
    for name, f in cases.items():
        r = f()
        got = r.mean if hasattr(r, "mean") else None
        err = 0.0 if got is None else float((got - ref).abs().max() / ref.abs().max())
        if name.startswith("loglik"):
            want = ks.loglik(z, 0.5, 0.9, 0.1, backend="torch")
            err = float(((r - want).abs() / want.abs()).max())
        if not err <= 1e-10:
            raise SystemExit(
                f"{name}: results {err:.2e} off the torch backend's; no speed reported"
            )
        out["max_rel_err"] = max(out["max_rel_err"], err)
    for name, f in cases.items():
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        ts = []
        for _ in range(300):
            t0 = time.perf_counter()
            f()
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e6)
        out[name] = statistics.median(ts)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
