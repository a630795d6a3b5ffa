"""Cost and coverage of ``OUFit.profile_interval`` (docs/model.md, "Profile-likelihood
intervals").

    OMP_NUM_THREADS=1 python3 benchmarks/profile_interval.py            # cost and coverage
    OMP_NUM_THREADS=1 python3 benchmarks/profile_interval.py --series 300 --quick

Cost: medians of 3 runs of the fit and of ``profile_interval()`` (all free parameters) on the
Nile (local level and OU) and on 1,000 simulated series of 500 steps (local level with variances
log-uniform over 0.1..10, as benchmarks/fit.py; OU with theta log-uniform over 0.01..1 a step).
Coverage: Nile-like local level (sigma2 1469.1, obs_var 15099, n = 100), the 95% profile
interval against ``estimate +/- 1.96 se``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings

import numpy as np

import kalmanscan as ks
from kalmanscan.timeseries import OUModel, load_nile

LL = {"theta": 0.0, "mu": 0.0}


def timed(fn, repeats=3):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def cost(name, z, times=None, fix=None, repeats=3):
    t_fit, fit = timed(lambda: ks.fit_ou(z, times, fix=fix), repeats)
    t_pi, ivs = timed(fit.profile_interval, repeats)
    nan = {p: int(np.sum(np.isnan(lo) | np.isnan(hi))) for p, (lo, hi) in ivs.items()}
    print(f"{name:28s} fit {t_fit:8.3f} s   profile_interval {t_pi:8.3f} s   NaN ends {nan}")


def simulated(n, ou):
    rng = np.random.default_rng(20)
    s2 = np.exp(rng.uniform(np.log(0.1), np.log(10), n))
    ov = np.exp(rng.uniform(np.log(0.1), np.log(10), n))
    if not ou:
        return OUModel(theta=0.0, sigma2=s2, obs_var=ov).simulate(n=500, seed=21)[1]
    th = np.exp(rng.uniform(np.log(0.01), np.log(1), n))
    model = OUModel(theta=th, sigma2=s2 * th, mu=5.0, obs_var=ov)
    return model.simulate(n=500, seed=21)[1]


def coverage(m, seed):
    rng = np.random.default_rng(seed)
    level = 1120.0 + np.cumsum(rng.normal(0.0, math.sqrt(1469.1), (100, m)), 0)
    z = level + rng.normal(0.0, math.sqrt(15099.0), (100, m))
    fit = ks.fit_ou(z, fix=LL)
    ivs = fit.profile_interval()
    for p, true in (("sigma2", 1469.1), ("obs_var", 15099.0)):
        lo, hi = ivs[p]
        est, se = fit.params[p], fit.stderr[p]
        prof = np.mean((lo <= true) & (true <= hi))
        wald = np.mean((est - 1.96 * se <= true) & (true <= est + 1.96 * se))
        print(
            f"coverage {p:8s} {m} series seed {seed}: profile {prof:.3f} (lower end 0 in "
            f"{np.mean(lo == 0):.3f}), Wald {wald:.3f} (lower end < 0 in "
            f"{np.mean(est - 1.96 * se < 0):.3f}); standard error {math.sqrt(0.95 * 0.05 / m):.3f}"
        )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=1000, help="simulated series for the cost")
    ap.add_argument("--coverage-series", type=int, default=3000)
    ap.add_argument("--quick", action="store_true", help="one run each, no coverage")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    reps = 1 if args.quick else 3
    years, flow = load_nile()
    cost("nile local level", flow, years, LL, reps)
    cost("nile OU", flow, years, None, reps)
    cost(f"{args.series} x 500 local level", simulated(args.series, False), None, LL, reps)
    cost(f"{args.series} x 500 OU", simulated(args.series, True), None, None, reps)
    if not args.quick:
        for seed in (2, 3):
            coverage(args.coverage_series, seed)


if __name__ == "__main__":
    main()
