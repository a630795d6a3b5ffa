"""CPU benchmark of the dense filter: parallel scan vs filterpy and the vectorized sequential loop.

    python benchmarks/dense_cpu.py --json benchmarks/results/dense-cpu.json [--quick]

Two regimes, float64, proper prior, filter only (``kd.filter``):

- one long series (B = 1), n = 2, 4, 8, T = 1e3 ... 1e6: kalmanscan's chunked scan against
  filterpy's ``batch_filter`` (all T; one repeat from 1e5 on), the torch sequential reference
  loop and the lean loop of ``benchmarks/dense_loop.py`` (covariance form, no diffuse or
  missing-data handling), both up to ``--loop-max-T`` (all T by default; one repeat from 1e5);
- many short series (B = 1000, T = 100): the scan against the sequential loop vectorized over
  the series (filterpy, one series at a time, measured on 10 series and scaled by 100).

Each configuration first checks the scan against filterpy (and the loop) on the same data and
reports no speed when the error exceeds the float64 truth tolerance. Times are medians of repeats.
Torch runs single-threaded by default (``--threads``): on a shared 2-core machine OpenMP spinning
made two threads up to 20x slower. The load average is recorded with the results.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np
import torch

import kalmanscan.dense as kd
from kalmanscan.testing import rel_error, tolerance

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dense_loop import lean_filter  # noqa: E402


def model(rng, n, d=1):
    F = rng.normal(size=(n, n))
    F *= 0.97 / np.abs(np.linalg.eigvals(F)).max()
    G = rng.normal(size=(n, n))
    Q = G @ G.T / n + 0.1 * np.eye(n)
    H = rng.normal(size=(d, n))
    R = np.eye(d)
    return F, Q, H, R


def timeit(fn, repeats):
    out, ts = None, []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3, out


def filterpy_run(z, F, Q, H, R, m0, P0):
    from filterpy.kalman import KalmanFilter

    n, d = F.shape[0], H.shape[0]
    kf = KalmanFilter(dim_x=n, dim_z=d)
    kf.F, kf.Q, kf.H, kf.R = F, Q, H, R
    kf.x, kf.P = m0.copy(), P0.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        means, covs, _, _ = kf.batch_filter(list(z))
    return means, covs


def single_series(rng, n, T, repeats, rows, with_loop):
    F, Q, H, R = model(rng, n)
    z = rng.normal(size=(T, 1))
    m0, P0 = np.zeros(n), np.eye(n)
    kw = dict(prior_mean=m0, prior_cov=P0, backend="torch")
    kd.filter(z[: min(T, 100)], F, Q, H, R, **kw)  # warm-up
    t_par, res = timeit(lambda: kd.filter(z, F, Q, H, R, **kw), repeats)
    fp_rep = repeats if T < 100_000 else 1
    t_fp, (fm, fc) = timeit(lambda: filterpy_run(z, F, Q, H, R, m0, P0), fp_rep)
    err = max(rel_error(res.mean, fm), rel_error(res.cov, fc))
    row = dict(
        regime="single series",
        n=n,
        d=1,
        B=1,
        T=T,
        parallel_ms=t_par,
        filterpy_ms=t_fp,
        err_vs_filterpy=err,
        repeats=repeats,
        filterpy_repeats=fp_rep,
    )
    if with_loop:
        loop_reps = max(1, repeats // 2)
        t_seq, ref = timeit(
            lambda: kd.filter(z, F, Q, H, R, prior_mean=m0, prior_cov=P0, backend="sequential"),
            loop_reps,
        )
        row.update(sequential_ms=t_seq, err_vs_sequential=rel_error(res.mean, ref.mean))
        del ref
        # the lean loop (covariance form, no diffuse or missing-data handling): what a user who
        # needs none of the reference loop's cases would write in torch
        tz, tF, tQ, tH, tR, tm0, tP0 = (torch.as_tensor(x) for x in (z, F, Q, H, R, m0, P0))
        t_lean, lean = timeit(lambda: lean_filter(tz, tF, tQ, tH, tR, tm0, tP0), loop_reps)
        row.update(
            lean_loop_ms=t_lean,
            err_vs_lean_loop=max(
                rel_error(res.mean, lean[0].numpy()), rel_error(res.cov, lean[1].numpy())
            ),
            loop_repeats=loop_reps,
        )
    tol = tolerance("truth", "float64")
    ok = (
        err <= tol
        and max(row.get("err_vs_sequential", 0.0), row.get("err_vs_lean_loop", 0.0)) <= tol
    )
    if not ok:
        for k in ("parallel_ms", "filterpy_ms", "sequential_ms", "lean_loop_ms"):
            row.pop(k, None)
        row["status"] = "correctness check failed: no speed reported"
    else:
        row["speedup_vs_filterpy"] = t_fp / t_par
        if "sequential_ms" in row:
            row["speedup_vs_sequential"] = row["sequential_ms"] / t_par
            row["speedup_vs_lean_loop"] = row["lean_loop_ms"] / t_par
    rows.append(row)
    print({k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in row.items()}, flush=True)


def many_series(rng, n, B, T, repeats, rows):
    F, Q, H, R = model(rng, n)
    z = rng.normal(size=(T, B, 1))
    m0, P0 = np.zeros(n), np.eye(n)
    kd.filter(z[:10, :10], F, Q, H, R, prior_mean=m0, prior_cov=P0, backend="torch")
    t_par, res = timeit(
        lambda: kd.filter(z, F, Q, H, R, prior_mean=m0, prior_cov=P0, backend="torch"), repeats
    )
    t_seq, ref = timeit(
        lambda: kd.filter(z, F, Q, H, R, prior_mean=m0, prior_cov=P0, backend="sequential"), repeats
    )
    k = 10
    t_fp10, outs = timeit(lambda: [filterpy_run(z[:, b], F, Q, H, R, m0, P0) for b in range(k)], 1)
    err_fp = max(rel_error(res.mean[:, b], outs[b][0]) for b in range(k))
    err_seq = rel_error(res.mean, ref.mean)
    row = dict(
        regime="many series",
        n=n,
        d=1,
        B=B,
        T=T,
        parallel_ms=t_par,
        sequential_ms=t_seq,
        filterpy_ms_scaled=t_fp10 * B / k,
        filterpy_note=f"{k} series measured, scaled by {B // k}",
        err_vs_filterpy=err_fp,
        err_vs_sequential=err_seq,
        repeats=repeats,
    )
    if max(err_fp, err_seq) > tolerance("truth", "float64"):
        for key in ("parallel_ms", "sequential_ms", "filterpy_ms_scaled"):
            row.pop(key)
        row["status"] = "correctness check failed: no speed reported"
    else:
        row["speedup_vs_sequential"] = t_seq / t_par
        row["speedup_vs_filterpy"] = row["filterpy_ms_scaled"] / t_par
    rows.append(row)
    print({k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in row.items()}, flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--quick", action="store_true", help="T up to 1e4 only")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--loop-max-T",
        type=int,
        default=1_000_000,
        help="time the sequential loops up to this T (default 1e6: about 0.2 ms a step for the "
        "reference loop, so 3-4 minutes a call at 1e6)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    rows = []
    Ts = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000, 1_000_000]
    load0 = os.getloadavg()
    for n in (2, 4, 8):
        for T in Ts:
            reps = 5 if T <= 10_000 else (3 if T <= 100_000 else 1)
            single_series(rng, n, T, reps, rows, with_loop=T <= args.loop_max_T)
    for n in (2, 4, 8):
        many_series(rng, n, 1000, 100, 3, rows)
    out = dict(
        benchmark="dense filter, CPU",
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        machine=dict(
            platform=platform.platform(),
            processor=platform.processor(),
            cpus=os.cpu_count(),
            torch=torch.__version__,
            torch_threads=torch.get_num_threads(),
            loadavg_start=load0,
            loadavg_end=os.getloadavg(),
        ),
        dtype="float64",
        timing="median wall ms of repeats (see each row)",
        rows=rows,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
