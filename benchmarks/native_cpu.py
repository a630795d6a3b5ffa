"""The native CPU kernel on its own: many short lanes against the numpy loop, the log-likelihood's
gradient (adjoint) against the torch backend's autograd, and the effect of a busy core.

Part 1 (``--lanes``): ``native.filter_lanes`` (all outputs, and ``outputs="loglik"``) and
``native.loglik_grad`` at 5000 x 20, 1000 x 2000 and 100,000 x 100 lanes x steps (float64, scalar
parameters, diffuse prior) against benchmarks/cpu.py's numpy loop, in one run, the four calls
interleaved round by round (medians), each checked against the numpy loop's filtered mean and
log-likelihood first.

Part 2 (``--busy``): a fit-like loop (per-lane parameters requiring grad, ``loglik`` through
``filter_lanes(outputs="loglik")``, its gradient, 100 lanes x 500 steps, 20 evaluations) with the
native adjoint and with the torch backend's autograd (what the native path's backward was before
the adjoint), under the thread settings of CONFIGS, plus one small element-wise torch op, each on
the machine as it is ("quiet") and with a busy loop in another process pinned to one core
(``sched_setaffinity``). Reports the slowdown busy / quiet of each.

    python benchmarks/native_cpu.py [--lanes] [--busy] [--threads N] [--json benchmarks/results/native-cpu.json]

With ``--json F --key K`` the part's results are stored under ``K`` (e.g. ``lanes_1thread``) in F,
keeping F's other entries (one file for the runs at 2 and at 1 thread, and the busy part).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from cpu import DECAY, OBS_VAR, PROC_VAR, numpy_loop, timeit_interleaved  # noqa: E402

from kalmanscan.core import native, parallel  # noqa: E402
from kalmanscan.testing import rel_error  # noqa: E402

F64 = torch.float64


def median_ms(fn, repeat=5):
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def scalar(v):
    return torch.full((1, 1), v, dtype=F64)


def lanes_part(shapes, repeat):
    rows = []
    for N, T in shapes:
        z = np.random.default_rng(0).normal(size=(T, N))
        zt = torch.from_numpy(z)
        x0 = (torch.zeros(N, dtype=F64), torch.zeros(N, dtype=F64), torch.ones(N, dtype=F64))
        args = (zt, scalar(OBS_VAR), scalar(DECAY), scalar(PROC_VAR), scalar(1.0), scalar(0.0))
        mean, _, ll = numpy_loop(z)
        out = native.filter_lanes(*args, x0)
        check = max(rel_error(out["mean"], mean), rel_error(out["loglik"], ll))
        if not check <= 1e-9:
            raise SystemExit(f"{N} x {T}: native differs from the numpy loop by {check:.2e}")
        row = dict(lanes=N, steps=T, check=check)
        fns = {
            "native_all_ms": lambda a=args, x=x0: native.filter_lanes(*a, x),
            "numpy_ms": lambda z=z: numpy_loop(z),
            "native_loglik_ms": lambda a=args, x=x0: native.filter_lanes(*a, x, outputs="loglik"),
            "native_grad_ms": lambda a=args, x=x0: native.loglik_grad(*a, x),
        }
        got = timeit_interleaved(list(fns.values()), repeat)
        row.update({k: 1e3 * t for k, t in zip(fns, got, strict=True)})
        row["ratio_all"] = row["numpy_ms"] / row["native_all_ms"]
        rows.append(row)
        print(
            f"{N} x {T}: native all {row['native_all_ms']:.2f} ms, numpy loop "
            f"{row['numpy_ms']:.2f} ms ({row['ratio_all']:.2f}x); loglik only "
            f"{row['native_loglik_ms']:.2f} ms; gradient (adjoint, all inputs) "
            f"{row['native_grad_ms']:.2f} ms; check {check:.1e}",
            flush=True,
        )
    return rows


def fit_like(backend, compact, N=100, T=500, iters=20):
    """``iters`` log-likelihood + gradient evaluations of per-lane parameters (3 per lane, on
    unconstrained scales, as a fit does); seconds."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(T, N, generator=g, dtype=F64)
    theta = torch.zeros(3, N, dtype=F64, requires_grad=True)
    x0 = (torch.zeros(N, dtype=F64), torch.zeros(N, dtype=F64), torch.ones(N, dtype=F64))
    mod = native if backend == "native" else parallel
    t = time.perf_counter()
    for _ in range(iters):
        obs = theta[0].exp()[None]
        decay = (0.9 * theta[1].tanh() + 0.5)[None]
        proc = (theta[2] - 2).exp()[None]
        params = (obs, decay, proc, scalar(1.0), scalar(0.0))
        if not compact or backend != "native":
            params = tuple(x.expand(T, N) for x in params)
        ll = mod.filter_lanes(z, *params, x0, outputs="loglik")["loglik"]
        (grad,) = torch.autograd.grad(-ll.sum(), theta)
        with torch.no_grad():
            theta -= 1e-4 * grad
    return time.perf_counter() - t


def small_op_us(threads):
    """One element-wise op on a strided 100-element view (what a fit's parameter maps are)."""
    torch.set_num_threads(threads)
    x = torch.zeros(3, 100, dtype=F64)
    return 1e3 * median_ms(lambda: [x[0].exp() for _ in range(100)], 5) / 100


CONFIGS = [  # (name, torch threads, native kernel threads, backend, compact inputs)
    ("torch default threads, native adjoint, [T, N] views", "default", None, "native", False),
    ("torch default threads, native adjoint, compact inputs", "default", None, "native", True),
    ("torch default threads, torch backend autograd", "default", None, "torch", False),
    ("torch 1 thread, native kernel 2 threads, compact inputs", 1, 2, "native", True),
    ("torch 1 thread, native kernel 1 thread, compact inputs", 1, 1, "native", True),
    ("torch 1 thread, torch backend autograd", 1, None, "torch", False),
]


def busy_part(repeat):
    default = torch.get_num_threads()
    cores = sorted(os.sched_getaffinity(0))
    results = []
    for busy in (False, True):
        proc = None
        if busy:
            proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            os.sched_setaffinity(proc.pid, {cores[-1]})
            time.sleep(0.5)
        state = "busy core" if busy else "quiet"
        try:
            for th in sorted({default, 1}, reverse=True):
                us = small_op_us(th)
                results.append(dict(busy=busy, config=f"exp of 100 strided elements, {th} torch "
                                    "threads (us)", seconds=us * 1e-6))  # fmt: skip
                print(f"{state}: exp of a strided 100-element view, {th} thread(s): {us:.1f} us")
            for name, tt, kt, backend, compact in CONFIGS:
                torch.set_num_threads(default if tt == "default" else tt)
                native.set_num_threads(kt)
                s = statistics.median(fit_like(backend, compact) for _ in range(repeat))
                results.append(dict(busy=busy, config=name, seconds=s))
                print(f"{state}: {name}: {1e3 * s:.1f} ms (20 loglik+gradient, 100 x 500)")
        finally:
            torch.set_num_threads(default)
            native.set_num_threads(None)
            if proc is not None:
                proc.kill()
                proc.wait()
    for r in results:
        if r["busy"]:
            quiet = next(q for q in results if not q["busy"] and q["config"] == r["config"])
            r["slowdown"] = r["seconds"] / quiet["seconds"]
            print(f"busy / quiet {r['slowdown']:.2f}x: {r['config']}")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", action="store_true", help="many short lanes vs the numpy loop")
    ap.add_argument("--busy", action="store_true", help="fit-like loop, quiet vs a busy core")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--threads", type=int, help="torch.set_num_threads for part 1 (the kernel follows)"
    )
    ap.add_argument("--json", help="write results here")
    ap.add_argument(
        "--key",
        help="with --json: store this run's part under KEY (and its meta under KEY_meta) in the "
        "existing file, keeping its other entries",
    )
    args = ap.parse_args()
    if not native.available():
        raise SystemExit("kalmanscan.core._native is not built")
    run_all = not (args.lanes or args.busy)
    if args.threads:
        torch.set_num_threads(args.threads)
    meta = dict(
        date=datetime.date.today().isoformat(),
        machine=f"{platform.machine()} ({os.cpu_count()} cores)",
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        load_at_start=os.getloadavg()[0],
    )
    print(meta, flush=True)
    out = dict(meta=meta)
    if args.lanes or run_all:
        out["lanes"] = lanes_part([(5000, 20), (1000, 2000), (100_000, 100)], args.repeat)
    if args.busy or run_all:
        out["busy"] = busy_part(max(1, args.repeat // 2))
    out["meta"]["load_at_end"] = os.getloadavg()[0]
    if args.json and args.key:
        part = [k for k in ("lanes", "busy") if k in out]
        if len(part) != 1:
            raise SystemExit("--key: run one part (--lanes or --busy)")
        merged = {}
        if os.path.exists(args.json):
            with open(args.json) as f:
                merged = json.load(f)
        merged[args.key], merged[f"{args.key}_meta"] = out[part[0]], out["meta"]
        out = merged
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
