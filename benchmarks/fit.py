"""Fitting benchmark (issue 20): kalmanscan ``fit_ou`` against statsmodels, in one run.

The local level model (``fit_ou(z, fix={"theta": 0, "mu": 0})``) against statsmodels'
``UnobservedComponents(y, "local level", use_exact_diffuse=True).fit()``, one fit a series in a
loop, on the Nile (T = 100), Mauna Loa CO2 weekly (T = 2284, 59 NaN) and 100 and 1000 simulated
series of 500 steps. Times: kalmanscan's first call in a fresh process after ``import
kalmanscan`` ("cold", data already loaded) and the median of repeated calls after a warm-up
("warm"); statsmodels' default ``.fit()`` (what a user calls) and its tight fit (BFGS, gtol 1e-12),
whose estimates are the reference: kalmanscan's must agree to 1e-5 relative (variances near 0 are
compared in units of the step variance instead; a series whose two fits differ more but whose
log-likelihoods agree to 1e-9 is counted as flat, the likelihood not telling them apart) and its
log-likelihood equal statsmodels' minus the exact ``0.5 log(2 pi)`` that statsmodels keeps for the
diffuse first step. No speed is reported for a case whose check fails.

simdkalman's EM (``KalmanFilter.em``: the local level's two noise variances of every series, and
its initial state, by expectation-maximization over all series at once) runs on the same data
with ``--em-iters`` iterations (default 10 and 100; it starts from half the step variance for
both), timed once; its estimates are compared with statsmodels' tight fit and its exact diffuse
log-likelihood (``ks.loglik`` at its estimates) with kalmanscan's maximum (the gap is >= 0 where
``fit_ou`` found the maximum).

    python benchmarks/fit.py [--quick] [--json benchmarks/results/fit-cpu.json] [--markdown FILE]
    python benchmarks/fit.py --threads-only   # the busy-core table alone
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

import kalmanscan as ks
from kalmanscan.timeseries import OUModel, fit_ou, load_nile
from kalmanscan.validation.run_meta import run_meta

LL = {"theta": 0.0, "mu": 0.0}
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
AGREE_RTOL = 1e-5
LOGLIK_ATOL = 1e-6
FLAT_LL = 1e-9


def datasets(quick: bool):
    from statsmodels.datasets import co2

    out = {"nile": load_nile()[1][:, None]}
    out["co2"] = co2.load_pandas().data["co2"].to_numpy()[:, None]
    rng = np.random.default_rng(20)
    n = 200 if quick else 1000
    s2 = np.exp(rng.uniform(np.log(0.1), np.log(10), n))
    ov = np.exp(rng.uniform(np.log(0.1), np.log(10), n))
    _, z = OUModel(theta=0.0, sigma2=s2, obs_var=ov).simulate(n=500, seed=21)
    out["sim100"] = z[:, :100]
    out[f"sim{n}"] = z
    return out


def sm_fit(y, tight: bool):
    from statsmodels.tsa.statespace.structural import UnobservedComponents

    mod = UnobservedComponents(y, "local level", use_exact_diffuse=True)
    kw = dict(method="bfgs", gtol=1e-12, maxiter=2000) if tight else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = mod.fit(disp=False, **kw)
    return res.params[0], res.params[1], res.llf  # obs_var (irregular), sigma2 (level), loglik


def sm_loop(z, tight):
    out = np.array([sm_fit(z[:, i], tight) for i in range(z.shape[1])])
    return out[:, 0], out[:, 1], out[:, 2]


def ks_fit(z):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_ou(z[:, 0] if z.shape[1] == 1 else z, fix=LL)


def timed(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def cold_time(z, threads=None):
    """kalmanscan's first fit_ou call in a fresh process (after import and data load)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "z.npy")
        np.save(path, z)
        code = (
            "import sys, time, warnings, numpy as np, torch\n"
            + (f"torch.set_num_threads({threads})\n" if threads else "")
            + "import kalmanscan as ks\n"
            f"z = np.load({path!r}); z = z[:, 0] if z.shape[1] == 1 else z\n"
            "warnings.simplefilter('ignore')\n"
            "t0 = time.perf_counter(); ks.fit_ou(z, fix={'theta': 0.0, 'mu': 0.0})\n"
            "print(time.perf_counter() - t0)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(out.stderr)
        return float(out.stdout.strip().splitlines()[-1])


def agreement(z, fit, ref):
    """Largest differences to statsmodels' tight fit. A variance that either fit puts below 1e-6
    of the data's step variance (``mean(diff(z)**2) / 2``; on or next to its bound 0, where
    relative differences mean nothing) is compared in units of that variance instead."""
    ov, s2, llf = ref
    k_ov = np.atleast_1d(fit.params["obs_var"])
    k_s2 = np.atleast_1d(fit.params["sigma2"])
    k_ll = np.atleast_1d(fit.loglik)
    step_var = 0.5 * np.nanmean(np.diff(z, axis=0) ** 2, axis=0)

    def err(k, r):
        near0 = np.minimum(k, r) < 1e-6 * step_var
        return np.where(near0, np.abs(k - r) / step_var, np.abs(k / r - 1)), near0

    (e_ov, z_ov), (e_s2, z_s2) = err(k_ov, ov), err(k_s2, s2)
    d_ll = np.abs(k_ll - HALF_LOG_2PI - llf)
    # where the two estimates differ by more than AGREE_RTOL but their log-likelihoods agree to
    # FLAT_LL, the likelihood cannot tell them apart in float64 (counted, reported separately)
    flat = (np.maximum(e_ov, e_s2) >= AGREE_RTOL) & (d_ll <= FLAT_LL)
    sharp = ~flat
    return {
        "obs_var_err": float(e_ov[sharp].max(initial=0.0)),
        "sigma2_err": float(e_s2[sharp].max(initial=0.0)),
        "n_flat": int(flat.sum()),
        "flat_obs_var_err": float(e_ov[flat].max(initial=0.0)),
        "flat_loglik_err": float(d_ll[flat].max(initial=0.0)),
        "loglik_err": float(d_ll.max()),
        "n_near_zero": int(z_ov.sum() + z_s2.sum()),
        "n_boundary": int(
            sum(np.atleast_1d(fit.at_boundary[p]).sum() for p in ("obs_var", "sigma2"))
        ),
        "n_not_converged": int((~np.atleast_1d(fit.converged)).sum()),
        "ok": bool(
            e_ov[sharp].max(initial=0.0) < AGREE_RTOL
            and e_s2[sharp].max(initial=0.0) < AGREE_RTOL
            and d_ll.max() < LOGLIK_ATOL
        ),
    }


def em_fit(z, n_iter):
    """simdkalman's EM for the local level of every column of z; (obs_var, sigma2) per series."""
    import simdkalman

    step_var = 0.5 * np.nanmean(np.diff(z, axis=0) ** 2, axis=0)
    start = (0.5 * step_var)[:, None, None]
    kf = simdkalman.KalmanFilter(
        state_transition=[[1.0]], process_noise=start, observation_model=[[1.0]],
        observation_noise=start,
    )  # fmt: skip
    first = np.array([col[~np.isnan(col)][0] for col in z.T])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = kf.em(z.T, n_iter=n_iter, initial_value=first[:, None, None],
                    initial_covariance=(10 * step_var)[:, None, None])  # fmt: skip
    n = z.shape[1]
    return np.asarray(res.observation_noise).reshape(n), np.asarray(res.process_noise).reshape(n)


def em_rows(name, z, fit, ref, t_ks, iters):
    """simdkalman's EM on the case: time, estimates against statsmodels' tight fit ``ref`` (first
    series, as ``agreement``), exact diffuse log-likelihood gap to ``fit`` (kalmanscan's)."""
    rows = []
    ncheck = len(ref[0])
    step_var = 0.5 * np.nanmean(np.diff(z[:, :ncheck], axis=0) ** 2, axis=0)
    for n_iter in iters:
        t, (ov, s2) = timed(lambda n_iter=n_iter: em_fit(z, n_iter), 1)
        ll = np.atleast_1d(ks.loglik(z, obs_var=ov[None], decay=1.0, process_var=s2[None]))
        gap = np.atleast_1d(fit.loglik) - ll

        def err(k, r):
            near0 = np.minimum(k, r) < 1e-6 * step_var
            return np.where(near0, np.abs(k - r) / step_var, np.abs(k / r - 1))

        row = dict(
            case=name, series=z.shape[1], em_iters=n_iter, em_s=t, ratio=t / t_ks,
            obs_var_err=float(err(ov[:ncheck], ref[0]).max()),
            sigma2_err=float(err(s2[:ncheck], ref[1]).max()),
            loglik_gap_max=float(gap.max()), loglik_gap_median=float(np.median(gap)),
        )  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def run_case(name, z, quick, em_iters=()):
    n = z.shape[1]
    reps = 5 if n == 1 else (3 if n <= 100 else 1)
    cold = cold_time(z)
    ks_fit(z)  # warm-up
    t_ks, fit = timed(lambda: ks_fit(z), reps)
    sm_reps = 5 if n == 1 else 1
    t_sm, _ = timed(lambda: sm_loop(z, tight=False), sm_reps)
    ncheck = min(n, 100)  # tight statsmodels fits: every series up to 100
    t_tight, ref = timed(lambda: sm_loop(z[:, :ncheck], tight=True), 1)
    sub = ks_fit(z[:, :ncheck]) if ncheck < n else fit
    agree = agreement(z[:, :ncheck], sub, ref)
    row = dict(
        case=name, series=n, steps=z.shape[0], nan=int(np.isnan(z).sum()),
        ks_cold_s=cold, ks_warm_s=t_ks, sm_default_s=t_sm, sm_tight_s=t_tight * n / ncheck,
        sm_tight_scaled=ncheck < n, ratio_default=t_sm / t_ks,
        ratio_tight=t_tight * n / ncheck / t_ks,
        checked_series=ncheck, n_iter=fit.n_iter, **agree,
    )  # fmt: skip
    if not agree["ok"]:
        for k in ("ks_cold_s", "ks_warm_s", "ratio_default", "ratio_tight"):
            row[k] = None
    print(json.dumps(row), flush=True)
    row["em"] = em_rows(name, z, fit, ref, t_ks, em_iters) if agree["ok"] else []
    return row


def busy_core_table(z):
    """Warm batch fit with torch's default threads and with 1, idle and with one busy process."""
    rows = []
    for busy in (False, True):
        proc = None
        if busy:
            proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(0.5)
        try:
            for threads in (torch.get_num_threads(), 1):
                code = (
                    "import time, warnings, numpy as np, torch\n"
                    f"torch.set_num_threads({threads})\n"
                    "import kalmanscan as ks\n"
                    "warnings.simplefilter('ignore')\n"
                    f"z = np.load({BUSY_PATH!r})\n"
                    "ks.fit_ou(z[:, :5], fix={'theta': 0.0, 'mu': 0.0})\n"
                    "ts = []\n"
                    "for _ in range(3):\n"
                    "    t0 = time.perf_counter(); ks.fit_ou(z, fix={'theta': 0.0, 'mu': 0.0})\n"
                    "    ts.append(time.perf_counter() - t0)\n"
                    "print(sorted(ts)[1])\n"
                )
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
                t = float(out.stdout.strip().splitlines()[-1])
                rows.append(dict(busy_process=busy, torch_threads=threads, warm_s=t,
                                 load1=os.getloadavg()[0]))  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
    return rows


def _dist_version(name):
    from importlib.metadata import version

    return version(name)


BUSY_PATH = os.path.join(tempfile.gettempdir(), f"kalmanscan-fit-busy-{os.getpid()}.npy")


def markdown(result):
    m = result["meta"]
    lines = [
        f"CPU: {m['machine']} ({m['cores']} cores), {m['torch_threads']} torch threads, torch "
        f"{m['torch']}, statsmodels {m['statsmodels']}, simdkalman {m.get('simdkalman')}; "
        f"{m['date'][:10]}; load average (1 min) at "
        f"start {m['load_start']:.1f}, at end {m['load_end']:.1f}.",
        "",
        "| job | kalmanscan cold s | kalmanscan warm s | statsmodels `.fit()` s | × | "
        "statsmodels tight s | × | Newton iterations | max rel. diff obs_var, sigma2 | "
        "loglik diff (after 0.5 log 2π) | near 0 / declared on boundary | flat |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    f = lambda v, d=3: "—" if v is None else f"{v:.{d}g}"  # noqa: E731
    for r in result["cases"]:
        label = {
            "nile": "Nile (T = 100)",
            "co2": "Mauna Loa CO2 weekly (T = 2284, 59 NaN)",
        }.get(r["case"], f"{r['series']} series × {r['steps']} steps")
        tight = f(r["sm_tight_s"]) + (
            f" (scaled from {r['checked_series']})" if r["sm_tight_scaled"] else ""
        )
        lines.append(
            f"| {label} | {f(r['ks_cold_s'])} | {f(r['ks_warm_s'])} | {f(r['sm_default_s'])} | "
            f"{f(r['ratio_default'])}× | {tight} | {f(r['ratio_tight'])}× | {r['n_iter']} | "
            f"{r['obs_var_err']:.1e}, {r['sigma2_err']:.1e} | {r['loglik_err']:.1e} | "
            f"{r['n_near_zero']} / {r['n_boundary']} | "
            + (
                f"{r['n_flat']} (obs_var up to {r['flat_obs_var_err']:.1e}, loglik within "
                f"{r['flat_loglik_err']:.0e}) |"
                if r["n_flat"]
                else "0 |"
            )
        )
    em = [e for r in result["cases"] for e in r.get("em", [])]
    if em:
        lines += [
            "",
            "| job | simdkalman EM iterations | EM s | × kalmanscan warm | max rel. diff obs_var, "
            "sigma2 (to statsmodels tight) | loglik gap to kalmanscan's maximum: max, median |",
            "|---|---|---|---|---|---|",
        ]
        for e in em:
            label = {"nile": "Nile", "co2": "CO2"}.get(e["case"], f"{e['series']} series")
            lines.append(
                f"| {label} | {e['em_iters']} | {e['em_s']:.3g} | {e['ratio']:.3g}× | "
                f"{e['obs_var_err']:.1e}, {e['sigma2_err']:.1e} | "
                f"{e['loglik_gap_max']:.1e}, {e['loglik_gap_median']:.1e} |"
            )
    if result.get("busy"):
        lines += [
            "",
            "| 100 series × 500 steps, warm | torch threads | s |",
            "|---|---|---|",
        ]
        for b in result["busy"]:
            lines.append(
                f"| {'one busy process added' if b['busy_process'] else 'as the machine was'} | "
                f"{b['torch_threads']} | {b['warm_s']:.3g} |"
            )
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 series instead of 1000")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--threads-only", action="store_true")
    ap.add_argument("--cases", default=None, help="comma-separated subset of the cases")
    ap.add_argument("--em-iters", default="10,100",
                    help="simdkalman EM iterations to run, comma-separated ('' for none)")  # fmt: skip
    args = ap.parse_args()
    import simdkalman
    import statsmodels

    meta = dict(
        machine=platform.machine(), cores=os.cpu_count(), torch_threads=torch.get_num_threads(),
        torch=torch.__version__, statsmodels=statsmodels.__version__,
        simdkalman=getattr(simdkalman, "__version__", None) or _dist_version("simdkalman"),
        **run_meta(cuda=False), load_start=os.getloadavg()[0],
        kalmanscan_backend=ks.core.backends.resolve("auto", torch.device("cpu")),
    )  # fmt: skip
    data = datasets(args.quick)
    cases = []
    if not args.threads_only:
        names = args.cases.split(",") if args.cases else list(data)
        iters = [int(x) for x in args.em_iters.split(",") if x]
        cases = [run_case(k, data[k], args.quick, iters) for k in names]
    np.save(BUSY_PATH, data["sim100"])
    try:
        busy = busy_core_table(data["sim100"])
    finally:
        os.remove(BUSY_PATH)
    meta["load_end"] = os.getloadavg()[0]
    result = dict(meta=meta, cases=cases, busy=busy)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    text = markdown(result)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
