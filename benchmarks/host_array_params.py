"""Wall time of one ``ks.filter`` / ``ks.loglik`` call on CUDA (``backend="triton"``, float64,
T = 1000, N = 1024) with plain-number parameters and with per-lane array parameters: the host
cost of what the API does per call, such as the device screen of tiny variances that array
parameters on a GPU take (docs/reliability.md, "Every variance tiny").

    python benchmarks/host_array_params.py            # prints one JSON line

Run it alternately with two trees on ``PYTHONPATH`` to compare them (medians of 300 calls after
20 warm-ups; the filtered means' sum is printed as the check that both trees compute the same)."""

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
    out = {}
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
    out["mean_sum"] = float(ks.filter(z, R, A, P, backend="triton").mean.sum())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
