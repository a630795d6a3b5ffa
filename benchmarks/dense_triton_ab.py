"""A/B of the fused Triton dense backend on ordinary models, one tree a process.

``kd.filter`` and ``kd.smooth`` (float32, asserted to run the fused Triton entries) on random
stable models (spectral radius 0.95, one observed entry, 10 % missing), n = 2, 4, 8 states,
T = 1e4, 1e5 (1 and 64 series) and 1e6 (1 series): the median of 7 calls (3 at T = 1e6) after a
warm-up, and the normwise error of means and covariances against the float64 torch scan of the
same data (T <= 1e5, 8 series a call; ``--no-check`` as a third argument leaves it out, for
repeat rounds). Run it on two trees in turn, alternating, to compare a kernel change::

    for r in 1 2; do for t in old new; do
        PYTHONPATH=$TREES/$t python3 benchmarks/dense_triton_ab.py $t out/ab-$t-$r.json
    done; done
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
import torch

import kalmanscan.dense as kd
from kalmanscan.cuda import dense as CD


def model(rng, n):
    F = rng.normal(size=(n, n))
    F *= 0.95 / np.abs(np.linalg.eigvals(F)).max()
    G = rng.normal(size=(n, n))
    return dict(F=F, Q=G @ G.T / n + 0.1 * np.eye(n), H=rng.normal(size=(1, n)), R=np.eye(1),
                prior_mean=np.zeros(n), prior_cov=np.eye(n))  # fmt: skip


def rel(a, b):
    a, b = a.detach().double().cpu().numpy(), b.detach().double().cpu().numpy()
    m = np.isfinite(b)
    return float(np.max(np.abs(a[m] - b[m])) / max(np.max(np.abs(b[m])), 1e-300))


def main(label: str, out: str, check: bool = True) -> None:
    ran = []
    real_run, real_smooth = CD.run, CD.run_smooth
    CD.run = lambda *a: (ran.append("filter"), real_run(*a))[1]
    CD.run_smooth = lambda *a: (ran.append("smooth"), real_smooth(*a))[1]
    rows = []
    for n in (2, 4, 8):
        for T in (10_000, 100_000, 1_000_000):
            for B in (1, 64) if T <= 100_000 else (1,):
                rng = np.random.default_rng([n, T, B])
                kw = model(rng, n)
                z = rng.normal(size=(T, B, 1))
                z[rng.random(z.shape) < 0.1] = np.nan
                zt = torch.as_tensor(z, dtype=torch.float32, device="cuda")
                kt = {k: torch.as_tensor(v, dtype=torch.float32, device="cuda")
                      for k, v in kw.items()}  # fmt: skip
                for op in ("filter", "smooth"):
                    fn = getattr(kd, op)
                    ran.clear()
                    fn(zt, **kt)
                    torch.cuda.synchronize()
                    assert ran == [op], (op, ran)
                    ts = []
                    for _ in range(7 if T < 1_000_000 else 3):
                        torch.cuda.synchronize()
                        t = time.perf_counter()
                        fn(zt, **kt)
                        torch.cuda.synchronize()
                        ts.append(time.perf_counter() - t)
                    err = None
                    if T <= 100_000 and check:
                        k64 = {k: torch.as_tensor(v, dtype=torch.float64, device="cuda")
                               for k, v in kw.items()}  # fmt: skip
                        err = 0.0
                        for s in range(0, B, 8):  # 8 series a call: the scan's memory
                            z64 = torch.as_tensor(z[:, s : s + 8], dtype=torch.float64,
                                                  device="cuda")  # fmt: skip
                            ref = fn(z64, **k64, backend="torch")
                            got = fn(zt[:, s : s + 8], **kt)
                            err = max(err, rel(got.mean, ref.mean), rel(got.cov, ref.cov))
                            del ref, got
                    rows.append(dict(tree=label, op=op, n=n, T=T, B=B,
                                     median_ms=statistics.median(ts) * 1e3,
                                     all_ms=[x * 1e3 for x in ts], err_vs_f64_torch=err))  # fmt: skip
                    print(label, op, n, T, B, f"{rows[-1]['median_ms']:.3f} ms, error {err}",
                          flush=True)  # fmt: skip
    with open(out, "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], check=sys.argv[3:] != ["--no-check"])
