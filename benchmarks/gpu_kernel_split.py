"""Per-kernel device time of the public filter calls, for comparing two trees on one GPU.

    PYTHONPATH=TREE python benchmarks/gpu_kernel_split.py --label L [--rounds 5] [--out F.json]

For each shape of the public table (benchmarks/gpu.py: ``z [T, N]`` float32 with 5 % NaN,
per-lane parameters): ``ks.filter``, ``ks.loglik`` and ``ks.loglik`` + gradient wrt ``obs_var,
decay, process_var``, each call profiled ``--rounds`` times by the CUDA profiler; per kernel name
the median over rounds of its summed device time (ms), and the call's total. Run it once per tree
(the package imported from ``PYTHONPATH``), alternating, and compare the JSON files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import kalmanscan as ks  # (before gpu.py, which puts this checkout first on the path)

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gpu import public_inputs  # noqa: E402


def split(fn, rounds):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    per = {}
    for _ in range(rounds):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        got = {}
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA and not ev.name.startswith(
                ("Memcpy", "Memset")
            ):
                got[ev.name] = got.get(ev.name, 0.0) + ev.device_time_total / 1e3
        for k, v in got.items():
            per.setdefault(k, []).append(v)
        per.setdefault("(total)", []).append(sum(got.values()))
    return {k: statistics.median(v) for k, v in per.items()}


def shape_rows(ks, shape, rounds):
    T, N = map(int, shape.split("x"))
    z, R, a, p = public_inputs(T, N)
    Rg, ag, pg = (x.clone().requires_grad_() for x in (R, a, p))

    def grad():
        ll = ks.loglik(z, Rg, ag, pg).sum()
        torch.autograd.grad(ll, (Rg, ag, pg))

    calls = {
        "filter": lambda: ks.filter(z, R, a, p),
        "loglik": lambda: ks.loglik(z, R, a, p),
        "loglik_grad": grad,
    }
    return [{"shape": shape, "call": n, "ms": split(fn, rounds)} for n, fn in calls.items()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="1048576x64,4096x65536,1000x100000")
    ap.add_argument("--out")
    args = ap.parse_args()

    rows = []
    for shape in args.shapes.split(","):
        for row in shape_rows(ks, shape, args.rounds):
            rows.append(row)
            print(json.dumps({"label": args.label, **row}), flush=True)
    doc = {"label": args.label, "device": torch.cuda.get_device_name(), "rows": rows,
           "package": ks.__file__}  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
