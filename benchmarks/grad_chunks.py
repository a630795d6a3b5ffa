"""The log-likelihood gradient's chunk count on CUDA: ``ks.loglik`` + gradient wrt ``obs_var``,
``decay``, ``process_var`` at 2^20 x 64 (the few-long-lanes regime) for each setting of
``kalmanscan.cuda.filter.TUNING["GRAD_WORK"]`` (lane-steps of parallel work the gradient's chunks
aim for), every setting's gradients and log-likelihood checked against float64 (torch backend,
4 lanes) in the same run, timed in interleaved rounds (median of ``triton.testing.do_bench``
medians), with each call's kernel time (CUDA profiler).

    python benchmarks/grad_chunks.py --out benchmarks/results/h200-grad-chunks.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gpu import bench, launches, public_inputs, series_error  # noqa: E402


def main():
    import kalmanscan as ks
    from kalmanscan.cuda import filter as F

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1048576x64")
    ap.add_argument("--works", default="65536,131072,262144")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    T, N = map(int, a.shape.split("x"))
    works = [int(w) for w in a.works.split(",")]
    z, R, a_, p = public_inputs(T, N)
    sub = slice(0, 4)
    d = lambda x: x[..., sub].double()  # noqa: E731
    leaves64 = [d(x).requires_grad_(True) for x in (R, a_, p)]
    ll64 = ks.loglik(d(z), *leaves64, backend="torch")
    gref = torch.autograd.grad(ll64.sum(), leaves64)
    leaves = [x.clone().requires_grad_(True) for x in (R, a_, p)]

    def call():
        ll = ks.loglik(z, *leaves)
        return ll, torch.autograd.grad(ll.sum(), leaves)

    default = F.TUNING["GRAD_WORK"]
    runs = {w: {"work": w, "ms_rounds": []} for w in works}
    for w in works:
        F.TUNING["GRAD_WORK"] = w
        ll, g = call()
        run = runs[w]
        run["NC"], run["CH"] = F._plan(T, N, True)[1], F._plan(T, N, True)[0]
        run["errors"] = {"loglik": series_error(ll[sub], ll64)}
        for n, g1, g2 in zip(("obs_var", "decay", "process_var"), g, gref, strict=True):
            run["errors"]["grad." + n] = series_error(g1[sub], g2)
        run["correct"] = run["errors"]["loglik"] <= 1e-4 and max(run["errors"].values()) <= 1e-3
        k, kms, copies = launches(call)
        run["kernels"], run["kernel_ms"] = k, kms
    for _ in range(a.rounds):
        for w in works:
            if runs[w]["correct"]:
                F.TUNING["GRAD_WORK"] = w
                runs[w]["ms_rounds"].append(bench(call))
    F.TUNING["GRAD_WORK"] = default
    for run in runs.values():
        r = sorted(run["ms_rounds"])
        run["ms"] = r[len(r) // 2] if r else None
        print(json.dumps(run), flush=True)
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "shape": {"T": T, "N": N}, "call": "ks.loglik + gradient wrt obs_var, decay, "
           "process_var (per lane), float32, 5 % NaN", "reference": "torch float64, lanes 0-3",
           "runs": list(runs.values())}  # fmt: skip
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
