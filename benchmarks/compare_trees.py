"""Time the public CPU functions of two kalmanscan checkouts in one run (before/after a change).

Each measurement runs in a fresh process importing one tree (``PYTHONPATH``), and the trees
alternate, so both see the same machine load; the figure is the median over rounds of each
process's median of repeats. Public functions only: ``ks.filter``, ``ks.smooth`` and the
log-likelihood with its gradient in the three parameters (``ks.loglik`` where the tree has it,
else ``ks.filter(...).loglik``); numpy in / numpy out for the first two, float64 torch for the
gradient. Every timed result is checked against the other tree's (max relative difference).

    python benchmarks/compare_trees.py /path/to/before /path/to/after [--rounds 3] [--json F]
                                       [--shapes 20x5000,200000x1] [--backend sequential]

``--backend`` passes that backend to the three functions (default: each tree's ``"auto"``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from kalmanscan.validation.run_meta import run_meta

SHAPES = [(20, 5000), (100, 1000), (2000, 1000), (100, 100_000), (200_000, 1)]

CHILD = r"""
import json, sys, time
import numpy as np, torch
import kalmanscan as ks
T, N, reps, backend = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
kw = {} if backend == "auto" else {"backend": backend}
rng = np.random.default_rng(0)
z = rng.normal(size=(T, N))
z[rng.random(z.shape) < 0.05] = np.nan
R, a, p = 1.0, 0.95, 0.1
def med(f):
    f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(ts))
out = {}
res = ks.filter(z, R, a, p, **kw)
out["filter_ms"] = med(lambda: ks.filter(z, R, a, p, **kw))
out["smooth_ms"] = med(lambda: ks.smooth(z, R, a, p, **kw))
zt = torch.tensor(z)
def grad():
    ps = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (R, a, p)]
    ll = ks.loglik(zt, *ps, **kw) if hasattr(ks, "loglik") else ks.filter(zt, *ps, **kw).loglik
    return [float(g) for g in torch.autograd.grad(ll.sum(), ps)]
out["loglik_grad_ms"] = med(grad)
sm = ks.smooth(z, R, a, p, **kw)
out["check"] = dict(mean=res.mean[-1, :8].tolist(), var=res.var[-1, :8].tolist(),
                    loglik=np.ravel(res.loglik)[:8].tolist(), smooth=sm.mean[0, :8].tolist(),
                    grad=grad())
print(json.dumps(out))
"""


def run_tree(tree, T, N, reps, backend="auto"):
    env = dict(os.environ, PYTHONPATH=tree)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(T), str(N), str(reps), backend],
        env=env, capture_output=True, text=True, cwd=tree, check=True,
    )  # fmt: skip
    return json.loads(r.stdout.strip().splitlines()[-1])


def rel_diff(x, y):
    import numpy as np

    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    return float(np.max(np.abs(x[ok] - y[ok]) / np.maximum(np.abs(y[ok]), 1e-300), initial=0.0))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--shapes", help="T x N shapes, e.g. 20x5000,200000x1 (default: all five)")
    ap.add_argument("--backend", default="auto", help="the backend of every call (default auto)")
    args = ap.parse_args(argv)
    shapes = SHAPES
    if args.shapes:
        try:
            shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        except ValueError:
            ap.error(f"--shapes: expected TxN[,TxN...], e.g. 20x5000, got {args.shapes!r}")
    rows = []
    for T, N in shapes:
        reps = max(2, min(args.repeats, int(2e6 // (T * N)) + 1))
        got = {"before": [], "after": []}
        for i in range(args.rounds):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for k in order:
                got[k].append(run_tree(getattr(args, k), T, N, reps, args.backend))
        row = dict(T=T, N=N)
        for f in ("filter_ms", "smooth_ms", "loglik_grad_ms"):
            b = statistics.median(r[f] for r in got["before"])
            a = statistics.median(r[f] for r in got["after"])
            row[f] = dict(before=b, after=a, speedup=b / a)
        cb, ca = got["before"][0]["check"], got["after"][0]["check"]
        row["max_rel_diff"] = max(rel_diff(ca[k], cb[k]) for k in cb)
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = dict(**run_meta(cuda=False), cores=os.cpu_count(),
                load_avg=os.getloadavg(), before=args.before, after=args.after,
                rounds=args.rounds, backend=args.backend)  # fmt: skip
    print("| T × N | filter before / after ms | smooth | loglik + grad | max rel diff |")
    print("|---|---|---|---|---|")
    for r in rows:
        c = lambda f, r=r: f"{r[f]['before']:.1f} / {r[f]['after']:.1f} ({r[f]['speedup']:.2f}×)"  # noqa: E731
        print(
            f"| {r['T']} × {r['N']} | {c('filter_ms')} | {c('smooth_ms')} | {c('loglik_grad_ms')} | {r['max_rel_diff']:.1e} |"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(meta=meta, rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
