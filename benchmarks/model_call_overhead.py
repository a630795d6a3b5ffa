"""Per-call cost of the model's methods against the filter calls they make, on the CPU.

    OMP_NUM_THREADS=1 python benchmarks/model_call_overhead.py [--repeats 400] [--clock wall|cpu]
                                                               [--out FILE.json]

For a float64 random walk of ``T`` steps (100 and 10,000), with no times, daily ``datetime64``
times and irregular float times, each row times one public call: ``OUModel.loglik``,
``OUModel.filter`` and ``OUModel.smooth``, ``OUModel(...).loglik`` with new parameters each
call (a model made a call, as in an optimization loop of one's own), and :func:`kalmanscan.loglik`, :func:`kalmanscan.filter`
and :func:`kalmanscan.smooth` given the arrays the model hands the filter (the data in the
model's unit ``c``, and the per-step ``decay``, ``process_var``, ``offset``; built once, outside
the timing). The difference is the model's own work per call: checking the data and times,
the unit, the transition of each step, mapping the results back.

Each call is warmed up, then timed ``--repeats`` times in 5 interleaved rounds (the machine
may be shared); ``median_ms`` is the median of all repeats, ``best_round_median_ms`` the
smallest round median. ``correctness`` holds, per shape, the largest absolute difference between
the model's results and the direct calls' mapped to the data's units (means times ``c``,
variances times ``c**2``, the log-likelihood less ``log c`` per contributing step): 0 by
construction; a row whose check fails is reported without a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kalmanscan as ks  # noqa: E402
from kalmanscan.timeseries import model_numerics  # noqa: E402
from kalmanscan.timeseries.model import OUModel  # noqa: E402

# --clock wall: time.perf_counter; --clock cpu: the thread's CPU time (on a shared machine
# another process's load counts less)
_clock = time.perf_counter


def _times(kind: str, T: int, rng):
    if kind == "none":
        return None
    if kind == "datetime64":
        return np.datetime64("2000-01-01") + np.arange(T).astype("timedelta64[D]")
    t = np.cumsum(rng.exponential(size=T))
    return t - t[0]


def _direct(model, z, times):
    """``(c, zs, args)``: the model's unit and the filter's inputs for ``z`` at ``times``."""
    m, zt, ax, _ = model._prepare(z, times, 0)
    return (*m._scaled_inputs(zt, ax), zt)


def _max_diff(model, z, times) -> float:
    """The largest absolute difference between the model's results and the direct calls'."""
    c, zs, args, zt = _direct(model, z, times)
    n = model_numerics.contributing_steps(
        ~np.isnan(zt), args["decay"], args["process_var"], args["prior_var"]
    )
    ll = model_numerics._loglik_in_data_units(ks.loglik(zs, **args), n, c)
    diffs = [abs(float(model.loglik(z, times)) - float(ll))]
    f, fd = model.filter(z, times), ks.filter(zs, **args)
    s, sd = model.smooth(z, times), ks.smooth(zs, **args)
    for a, b, p in (
        (f.mean, fd.mean, 1),
        (f.var, fd.var, 2),
        (s.mean, sd.mean, 1),
        (s.var, sd.var, 2),
    ):
        diffs.append(float(np.max(np.abs(a - b * c**p))))
    return max(diffs)


def _calls(model, z, times, zs, fargs) -> dict:
    """The timed calls of one shape: the model's methods and the direct filter calls."""
    thetas = iter(np.tile(np.linspace(0.05, 0.5, 97), 10**4))

    def fresh():  # a new model each call, as in an optimization loop over the parameters
        theta = float(next(thetas))
        return OUModel(theta=theta, sigma2=1.0 + theta, mu=0.5, obs_var=0.5).loglik(z, times)

    return {
        "OUModel.loglik": lambda: model.loglik(z, times),
        "OUModel(new params).loglik": fresh,
        "ks.loglik": lambda: ks.loglik(zs, **fargs),
        "OUModel.filter": lambda: model.filter(z, times),
        "ks.filter": lambda: ks.filter(zs, **fargs),
        "OUModel.smooth": lambda: model.smooth(z, times),
        "ks.smooth": lambda: ks.smooth(zs, **fargs),
    }


def _time(calls: dict, repeats: int) -> dict:
    """``{name: (median_ms, best_round_median_ms)}`` over ``repeats`` calls in 5 rounds."""
    for f in calls.values():
        for _ in range(20):
            f()
    samples = {k: [] for k in calls}
    per_round = max(repeats // 5, 1)
    rounds = {k: [] for k in calls}
    for _ in range(5):
        for k, f in calls.items():
            ts = []
            for _ in range(per_round):
                t0 = _clock()
                f()
                ts.append(_clock() - t0)
            samples[k] += ts
            rounds[k].append(statistics.median(ts))
    return {k: (statistics.median(samples[k]) * 1e3, min(rounds[k]) * 1e3) for k in calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=400)
    ap.add_argument("--lengths", default="100,10000")
    ap.add_argument("--out", default=None)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = ap.parse_args()
    global _clock
    _clock = time.perf_counter if args.clock == "wall" else time.thread_time
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    model = OUModel(theta=0.1, sigma2=1.0, mu=0.5, obs_var=0.5)
    rows, correctness, shapes = [], {}, []
    for T in (int(x) for x in args.lengths.split(",")):
        z = np.cumsum(rng.normal(size=T)) * 10.0
        repeats = args.repeats if T <= 1000 else max(args.repeats // 10, 20)
        for kind in ("none", "datetime64", "float"):
            times = _times(kind, T, rng)
            shape = f"T{T}-{kind}"
            shapes.append(shape)
            err = _max_diff(model, z, times)
            correctness[shape] = err
            c, zs, fargs, _ = _direct(model, z, times)
            calls = _calls(model, z, times, zs, fargs)
            timed = _time(calls, repeats) if err == 0.0 else {}
            for name in calls:
                med, best = timed.get(name, (None, None))
                rows.append(
                    dict(shape=shape, T=T, times=kind, call=name, median_ms=med,
                         best_round_median_ms=best, repeats=repeats)
                )  # fmt: skip
                label = "correctness check failed" if med is None else f"{med:8.3f} ms"
                print(f"{shape:18s} {name:16s} {label}  (best round {best})", flush=True)
            print(f"{shape:18s} max |model - direct| = {err:.3g}", flush=True)
    out = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device="cpu",
        clock=args.clock,
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        torch_threads=torch.get_num_threads(),
        shapes=shapes,
        rows=rows,
        correctness=dict(
            what="max abs difference, model vs direct calls mapped back", **correctness
        ),
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
