"""The timeline of one ``ks.loglik`` + gradient call on CUDA (the public table's
``loglik_grad`` cell): host spans of the forward, the sum and ``torch.autograd.grad`` against the
device spans of the kernels, from the CUDA profiler, so the device's idle time inside the call
can be attributed to the host work that causes it.

    python benchmarks/loglik_grad_timeline.py [--shape 1048576x64] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from kalmanscan.validation.run_meta import run_meta  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1048576x64")
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    from gpu import public_inputs

    import kalmanscan as ks

    T, N = map(int, args.shape.split("x"))
    z, R, a, p = public_inputs(T, N)
    leaves = [x.detach().requires_grad_(True) for x in (R, a, p)]
    flush = torch.empty(64 * 2**20, dtype=torch.int32, device="cuda")

    def call(mark):
        with torch.profiler.record_function("A_loglik"):
            ll = ks.loglik(z, *leaves)
        with torch.profiler.record_function("B_sum"):
            s = ll.sum()
        with torch.profiler.record_function("C_grad"):
            g = torch.autograd.grad(s, leaves)
        return g

    for _ in range(5):
        call(False)
    torch.cuda.synchronize()
    # host times of the parts, device idle: perf_counter around each part, events around all
    parts = {"loglik": [], "sum": [], "grad": [], "total_host": [], "device": []}
    for _ in range(args.reps):
        flush.zero_()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t0 = time.perf_counter()
        ll = ks.loglik(z, *leaves)
        t1 = time.perf_counter()
        s = ll.sum()
        t2 = time.perf_counter()
        torch.autograd.grad(s, leaves)
        t3 = time.perf_counter()
        e1.record()
        torch.cuda.synchronize()
        parts["loglik"].append((t1 - t0) * 1e3)
        parts["sum"].append((t2 - t1) * 1e3)
        parts["grad"].append((t3 - t2) * 1e3)
        parts["total_host"].append((t3 - t0) * 1e3)
        parts["device"].append(e0.elapsed_time(e1))
    med = {k: statistics.median(v) for k, v in parts.items()}
    print("medians ms", json.dumps({k: round(v, 4) for k, v in med.items()}), flush=True)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(3):
            flush.zero_()
            torch.cuda.synchronize()
            with torch.profiler.record_function("ITER"):
                call(True)
            torch.cuda.synchronize()
    evs = []
    for e in prof.events():
        on_gpu = e.device_type == torch.autograd.DeviceType.CUDA
        evs.append((e.time_range.start / 1e3, e.time_range.end / 1e3,
                    "GPU" if on_gpu else "CPU", e.name[:70]))  # fmt: skip
    iters = sorted([e for e in evs if e[3] == "ITER" and e[2] == "CPU"])
    timeline = []
    for k, it in enumerate(iters):
        lo = it[0]
        hi = iters[k + 1][0] if k + 1 < len(iters) else float("inf")
        rows = sorted(e for e in evs if lo <= e[0] < hi and (
            e[2] == "GPU" or e[3] in ("A_loglik", "B_sum", "C_grad", "ITER")
            or "Backward" in e[3] or "cudaLaunch" in e[3] or "Memcpy" in e[3]
            or "Synchronize" in e[3] or "aten::" in e[3]))  # fmt: skip
        t = [dict(start=round(r[0] - lo, 4), end=round(r[1] - lo, 4), where=r[2], name=r[3])
             for r in rows]  # fmt: skip
        timeline.append(t)
    for r in timeline[-1]:
        print(f"{r['start']:9.4f} {r['end']:9.4f} {r['where']} {r['name']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**run_meta(cuda=True), "shape": [T, N], "medians_ms": med,
                       "parts_ms": parts, "timeline_ms": timeline[-1]}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
