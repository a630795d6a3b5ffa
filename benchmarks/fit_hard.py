"""fit_ou on the records that were slow or unconverged: long irregular records of a weakly
mean-reverting level, OU series buried in noise, and white noise. Medians of repeated fits in
one process, with the Newton iterations, the share converged and the total log-likelihood, so
two trees can be compared value for value (run it under each: ``PYTHONPATH=<tree>``).

    python benchmarks/fit_hard.py --json benchmarks/results/cpu-fit-hard.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
import warnings

import numpy as np
import pandas as pd

import kalmanscan as ks
from kalmanscan.timeseries import OUModel


def irregular(n: int, seed: int = 0):
    """A level that wanders (a random walk, seen with noise), sampled at exponential steps of
    about a minute rounded to whole seconds (repeated times dropped): a sensor's record."""
    rng = np.random.default_rng(seed)
    t = pd.Timestamp("2020-01-01") + pd.to_timedelta(
        np.cumsum(rng.exponential(60, size=n)).round(), unit="s"
    )
    x = np.cumsum(rng.normal(size=n)) * 0.1 + rng.normal(size=n) * 0.3
    s = pd.Series(np.round(x, 4), index=t)
    return s[~s.index.duplicated()]


def buried(n: int = 1000, T: int = 500):
    rng = np.random.default_rng(5)
    th = np.exp(rng.uniform(np.log(0.01), np.log(1.0), n))
    s2 = np.exp(rng.uniform(np.log(0.1), np.log(10), n))
    ov = np.exp(rng.uniform(np.log(0.1), np.log(10), n))
    model = OUModel(theta=th, sigma2=s2, mu=rng.normal(size=n) * 3, obs_var=ov)
    return model.simulate(n=T, seed=22)[1]


def cases(big: bool):
    out = {
        "ou_random_1000x500": buried(),
        "white_noise_40x500": np.random.default_rng(1).normal(size=(500, 40)),
        "irregular_200000x1": irregular(200_000),
    }
    if big:
        out["irregular_1000000x1"] = irregular(1_000_000)
    return out


def run(data, repeats: int, max_iter: int):
    times = []
    for _ in range(repeats):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            fit = ks.fit_ou(data, max_iter=max_iter)
            times.append(time.perf_counter() - t0)
    conv = np.atleast_1d(fit.converged)
    return {
        "median_s": float(np.median(times)),
        "runs_s": [round(x, 4) for x in times],
        "newton_iterations": int(np.max(fit.n_iter)),
        "converged": f"{int(conv.sum())} of {conv.size}",
        "total_loglik": float(np.sum(fit.loglik)),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-iter", type=int, default=500)
    ap.add_argument("--big", action="store_true", help="also 10^6 irregular steps (one run)")
    ap.add_argument("--only", default=None, help="comma-separated case names")
    args = ap.parse_args(argv)
    result = {
        "date": datetime.date.today().isoformat(),
        "device": f"CPU ({platform.processor() or platform.machine()})",
        "kalmanscan": ks.__version__ if hasattr(ks, "__version__") else "",
        "cases": {},
    }
    for name, data in cases(args.big).items():
        if args.only and name not in args.only.split(","):
            continue
        reps = 1 if name.startswith("irregular_1000000") else args.repeats
        shape = list(np.shape(data))
        result["cases"][name] = {"shape": shape, **run(data, reps, args.max_iter)}
        print(name, json.dumps(result["cases"][name]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
