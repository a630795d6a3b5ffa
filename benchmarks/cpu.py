"""CPU benchmark of kalmanscan.filter against the sequential peers, in one run.

kalmanscan.filter runs its default backend (on the CPU without autograd: the compiled ``native``
kernel when it is built); the torch backend (chunked parallel scans) is timed too, for reference.
Peers: the obvious numpy loop over time vectorized across lanes (same outputs: filtered mean,
variance and log-likelihood), simdkalman, and filterpy (one lane at a time; timed on a subset of
lanes and scaled, which the table says). Every timing is the median of repeated runs after a
warm-up (kalmanscan and the numpy loop interleaved, round by round, with kalmanscan once more with
fresh output memory, as a first call gets it); every result is checked against the numpy loop
first, and no speed is reported for a path whose check fails.

    python benchmarks/cpu.py [--quick] [--json benchmarks/results/cpu.json] [--markdown docs/performance-cpu.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

import kalmanscan as ks
from kalmanscan.core import backends
from kalmanscan.testing import rel_error
from kalmanscan.validation.run_meta import run_meta

OBS_VAR, DECAY, PROC_VAR = 1.0, 0.95, 0.1


def numpy_loop(z):
    T, N = z.shape
    lam, eta, ll = np.zeros(N), np.zeros(N), np.zeros(N)
    mean, var = np.empty((T, N)), np.empty((T, N))
    for t in range(T):
        den = DECAY * DECAY + PROC_VAR * lam
        lam_pred, eta_pred = lam / den, DECAY / den * eta
        with np.errstate(divide="ignore", invalid="ignore"):
            s = 1.0 / lam_pred + OBS_VAR
            innov = z[t] - eta_pred / lam_pred
            ll += np.where(lam_pred > 0, -0.5 * (np.log(2 * np.pi * s) + innov * innov / s), 0.0)
        lam = lam_pred + 1.0 / OBS_VAR
        eta = eta_pred + z[t] / OBS_VAR
        mean[t], var[t] = eta / lam, 1.0 / lam
    return mean, var, ll


def simdkalman_run(z):
    import simdkalman

    kf = simdkalman.KalmanFilter(
        state_transition=[[DECAY]],
        process_noise=[[PROC_VAR]],
        observation_model=[[1.0]],
        observation_noise=OBS_VAR,
    )
    # simdkalman needs a finite prior: the exact prediction of step 1 after a diffuse step 0
    N = z.shape[1]
    r = kf.compute(
        z.T[:, 1:],
        0,
        initial_value=DECAY * z.T[:, :1, None],
        initial_covariance=np.full((N, 1, 1), DECAY * DECAY * OBS_VAR + PROC_VAR),
        filtered=True,
        smoothed=False,
    )
    return r.filtered.states.mean[..., 0].T, r.filtered.states.cov[..., 0, 0].T


def filterpy_run(z):
    from filterpy.kalman import KalmanFilter

    means = np.empty_like(z)
    for n in range(z.shape[1]):
        kf = KalmanFilter(dim_x=1, dim_z=1)
        kf.F[:] = DECAY
        kf.Q[:] = PROC_VAR
        kf.H[:] = 1.0
        kf.R[:] = OBS_VAR
        kf.x[:] = z[0, n]
        kf.P[:] = OBS_VAR
        mu, cov, _, _ = kf.batch_filter(z[1:, n])
        means[0, n] = z[0, n]
        means[1:, n] = mu[:, 0, 0]
    return means


def timeit(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def timeit_interleaved(fns, repeats):
    """Medians of ``repeats`` rounds calling each of ``fns`` once per round (after a warm-up),
    so that every function sees the same machine load."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def fresh_outputs(fn):
    """``fn`` with the native kernel's kept output blocks off (every output a fresh allocation,
    as on a first call), or None without the extension."""
    from kalmanscan.core import native

    if not native.available():
        return None

    def call():
        kept = native._POOL_MAX, native._POOL_SMALL_MAX
        native._POOL_MAX = native._POOL_SMALL_MAX = 0
        native._POOL.clear()
        try:
            return fn()
        finally:
            native._POOL_MAX, native._POOL_SMALL_MAX = kept

    return call


def run(shapes, repeats):
    rows = []
    for T, N, peers in shapes:
        z = np.random.default_rng(0).normal(size=(T, N))
        ref_mean, ref_var, ref_ll = numpy_loop(z)
        res = ks.filter(z, OBS_VAR, DECAY, PROC_VAR)
        err = max(
            rel_error(res.mean, ref_mean),
            rel_error(res.var, ref_var),
            rel_error(res.loglik, ref_ll),
        )
        row = dict(T=T, N=N, check_rel_err=err)
        if not err < 1e-9:
            row["error"] = "kalmanscan result differs from the numpy loop; no time reported"
            rows.append(row)
            continue
        call = lambda z=z: ks.filter(z, OBS_VAR, DECAY, PROC_VAR)  # noqa: E731
        fns = [call, lambda z=z: numpy_loop(z)]
        fresh = fresh_outputs(lambda call=call: call())  # the result dropped inside
        if fresh is not None:
            fns.append(fresh)
        got = timeit_interleaved(fns, repeats)
        row["kalmanscan_ms"], row["numpy_loop_ms"] = 1e3 * got[0], 1e3 * got[1]
        if fresh is not None:
            row["kalmanscan_fresh_outputs_ms"] = 1e3 * got[2]
        res_t = ks.filter(z, OBS_VAR, DECAY, PROC_VAR, backend="torch")
        e = max(rel_error(res_t.mean, ref_mean), rel_error(res_t.loglik, ref_ll))
        row["torch_backend_check_rel_err"] = e
        if e < 1e-9:
            row["torch_backend_ms"] = (
                1e3
                * timeit(
                    lambda z=z: ks.filter(z, OBS_VAR, DECAY, PROC_VAR, backend="torch"), repeats
                )[0]
            )
        if "simdkalman" in peers:
            m, v = simdkalman_run(z)
            e = max(rel_error(m, ref_mean[1:]), rel_error(v, ref_var[1:]))
            if e < 1e-9:
                row["simdkalman_ms"] = (
                    1e3 * timeit(lambda z=z: simdkalman_run(z), max(1, repeats // 2))[0]
                )
            row["simdkalman_check_rel_err"] = e
        if "filterpy" in peers:
            sub = z[:, : min(N, 5)]
            e = rel_error(filterpy_run(sub), ref_mean[:, : sub.shape[1]])
            if e < 1e-9:
                row["filterpy_ms"] = (
                    1e3 * timeit(lambda sub=sub: filterpy_run(sub), 1)[0] * N / sub.shape[1]
                )
                row["filterpy_lanes_timed"] = sub.shape[1]
            row["filterpy_check_rel_err"] = e
        row["load_avg_after"] = os.getloadavg()[0]
        rows.append(row)
        print(row, flush=True)
    return rows


def markdown(rows, meta):
    lines = [
        f"CPU: {meta['cpu']} ({meta['cores']} cores), {meta['threads']} torch threads, torch {meta['torch']}; "
        f"{meta['date'][:10]}; kalmanscan backend `{meta.get('backend', '?')}`; load average (1 min) at start {meta['load_avg'][0]:.1f}.",
        "Median of repeated rounds (kalmanscan, the numpy loop and kalmanscan with fresh outputs "
        "interleaved); ratio = peer time / kalmanscan time (higher is better for kalmanscan); "
        "the fresh-outputs column: numpy loop / that time.",
        "",
        "| lanes × steps | kalmanscan ms | numpy loop ms | × vs numpy | kalmanscan, fresh outputs ms | × | torch backend ms | × | simdkalman ms | × | filterpy ms | × | check vs numpy loop | load after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "kalmanscan_ms" not in r:
            lines.append(
                f"| {r['N']} × {r['T']} | — | — | — | — | — | — | — | — | — | — | — | FAILED {r['check_rel_err']:.1e} | — |"
            )
            continue
        ks_ms = r["kalmanscan_ms"]

        def cell(k, r=r, ks_ms=ks_ms):
            return (f"{r[k]:.1f}", f"{r[k] / ks_ms:.1f}×") if k in r else ("—", "—")

        npm, npx = cell("numpy_loop_ms")
        frm, _ = cell("kalmanscan_fresh_outputs_ms")
        frx = (
            f"{r['numpy_loop_ms'] / r['kalmanscan_fresh_outputs_ms']:.1f}×"
            if "kalmanscan_fresh_outputs_ms" in r
            else "—"
        )
        tbm, tbx = cell("torch_backend_ms")
        sdm, sdx = cell("simdkalman_ms")
        fpm, fpx = cell("filterpy_ms")
        if "filterpy_ms" in r:
            fpm += f" (scaled from {r['filterpy_lanes_timed']} lanes)"
        lines.append(
            f"| {r['N']} × {r['T']} | {ks_ms:.2f} | {npm} | {npx} | {frm} | {frx} | {tbm} | {tbx} | {sdm} | {sdx} | {fpm} | {fpx} | {r['check_rel_err']:.1e} | {r.get('load_avg_after', float('nan')):.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--json", help="write the results as JSON here")
    ap.add_argument("--markdown", help="write the markdown table here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        shapes = [(200, 100, ("simdkalman", "filterpy")), (5000, 1, ()), (20, 5000, ())]
        repeats = 3
    else:
        shapes = [
            (20, 5000, ("simdkalman",)),
            (2000, 1000, ("simdkalman", "filterpy")),
            (200_000, 1, ("filterpy",)),
            (100, 100_000, ("simdkalman",)),
        ]
        repeats = args.repeats
    meta = dict(
        **run_meta(cuda=False),
        cpu=platform.processor() or platform.machine(),
        cores=os.cpu_count(),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        python=sys.version.split()[0],
        load_avg=os.getloadavg(),
        repeats=repeats,
        backend=backends.resolve("auto", torch.device("cpu")),
    )
    rows = run(shapes, repeats)
    md = markdown(rows, meta)
    print(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(
                "# CPU performance\n\nReproduce: `python benchmarks/cpu.py --json ... --markdown docs/performance-cpu.md`.\n\n"
                + md
            )
    return 0 if all("kalmanscan_ms" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
