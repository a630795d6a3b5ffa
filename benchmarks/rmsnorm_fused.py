"""RMSNorm forward+backward: torch's ``F.rms_norm`` against the fused kernels
(``kalmanscan.cuda.rmsnorm.rms_norm``, what ``RMSNorm`` runs on CUDA), at the LM's shape.

N = 16384 tokens (8 x 2048) by D = 512, float32 (the residual stream under bf16 autocast).
Each path is checked first: the largest relative difference (``max |a - b| / max |b|``) of
``y``, ``gx`` and ``gw`` between the two, and each one's against the float64 formula
(``rms_norm_ref``); the fused path's time is not reported when its check fails. Then each
repeat times ``--iters`` calls back to back with CUDA events (the mean a call); the JSON has
the median over ``--repeats`` of forward+backward (``median_ms``: ``torch.autograd.grad`` of
the output with a fixed output gradient), and of the forward and the backward alone.
At this size a call's host time (Python, the autograd engine, launches) is about its device
time for torch and several times it for the fused path, so these medians are host-bound;
``--profile`` gives the device side: each kernel's mean device time a call (CUDA profiler,
``kernel_us``). ``--sweep`` adds the device time of the backward kernel at other launch
shapes (``rmsnorm.GPU_BWD``) and of the forward kernel at other ``rmsnorm.GPU_FWD``
(secondary rows).

    export PYTHONPATH=$PWD
    python benchmarks/rmsnorm_fused.py --profile --out benchmarks/results/rmsnorm-fused-h200.json
    python benchmarks/rmsnorm_fused.py --dry-run --out /tmp/r.json   # CPU, tiny, interpreter
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# y and gx within 1e-6 of torch's (float32 rounding), gw (a sum over every row) within 1e-5
TOLERANCE = {"y": 1e-6, "gx": 1e-6, "gw": 1e-5}


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def timed(fn, iters, repeats, cuda):
    """Median over ``repeats`` of the mean ms a call of ``iters`` back-to-back calls."""
    fn()
    out = []
    for _ in range(repeats):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / iters)
        else:
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            out.append((time.perf_counter() - t) * 1e3 / iters)
    return statistics.median(out)


def paths(x, w, gy, eps):
    """``{name: (forward, forward+backward, backward of one kept graph)}`` for torch and fused."""
    from kalmanscan.cuda.rmsnorm import rms_norm

    D = x.shape[-1]
    fns = {"torch": lambda: F.rms_norm(x, (D,), w, eps), "fused": lambda: rms_norm(x, w, eps)}
    out = {}
    for name, fwd in fns.items():
        y = fwd()

        def both(fwd=fwd):
            return torch.autograd.grad(fwd(), [x, w], gy)

        def bwd(y=y):
            return torch.autograd.grad(y, [x, w], gy, retain_graph=True)

        out[name] = (fwd, both, bwd)
    return out


def profile(fn, iters):
    """``{kernel: mean device us a call}`` of ``fn`` over ``iters`` calls (CUDA profiler)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    fn()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return {e.key: round(e.device_time_total / iters, 2) for e in p.key_averages()
            if e.device_time_total > 0}  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--iters", type=int, default=50, help="calls a repeat")
    ap.add_argument("--profile", action="store_true", help="each kernel's device time (CUDA)")
    ap.add_argument("--sweep", action="store_true", help="other launch shapes (CUDA)")
    ap.add_argument("--dry-run", action="store_true", help="tiny, on the CPU (interpreter)")
    args = ap.parse_args(argv)
    if args.dry_run and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import
    import triton

    from kalmanscan.cuda import rmsnorm
    from kalmanscan.cuda._common import interpreting
    from kalmanscan.validation.run_meta import run_meta

    cuda = not interpreting() and torch.cuda.is_available()
    if not (cuda or args.dry_run):
        sys.exit("rmsnorm_fused.py: needs a CUDA device (or --dry-run)")
    dev = "cuda" if cuda else "cpu"
    N, D, eps = (37, 40, 1e-5) if args.dry_run else (16384, 512, 1e-5)
    iters, repeats = (2, args.repeats) if args.dry_run else (args.iters, args.repeats)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(N, D, generator=g) * 3 + 0.5).to(dev).requires_grad_(True)
    w = (1 + 0.3 * torch.randn(D, generator=g)).to(dev).requires_grad_(True)
    gy = torch.randn(N, D, generator=g).to(dev)

    fns = paths(x, w, gy, eps)
    res = {name: (fwd(), *both()) for name, (fwd, both, _) in fns.items()}
    xd, wd = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    yd = rmsnorm.rms_norm_ref(xd, wd, eps)
    exact = (yd, *torch.autograd.grad(yd, [xd, wd], gy.double()))
    names = ("y", "gx", "gw")
    err = {n: rel(a, b) for n, a, b in zip(names, res["fused"], res["torch"], strict=True)}
    err64 = {p: {n: rel(a, b) for n, a, b in zip(names, res[p], exact, strict=True)}
             for p in res}  # fmt: skip
    ok = all(err[n] <= TOLERANCE[n] for n in names)
    print(f"fused vs torch: y {err['y']:.1e}, gx {err['gx']:.1e}, gw {err['gw']:.1e}"
          f"{'' if ok else '  FAILED: no time reported for the fused path'}")  # fmt: skip
    for p, e in err64.items():
        print(f"{p} vs float64: y {e['y']:.1e}, gx {e['gx']:.1e}, gw {e['gw']:.1e}")

    median, fwd_ms, bwd_ms = {}, {}, {}
    for name, (fwd, both, bwd) in fns.items():
        if name == "fused" and not ok:
            median[name] = fwd_ms[name] = bwd_ms[name] = None
            continue
        median[name] = timed(both, iters, repeats, cuda)
        fwd_ms[name] = timed(fwd, iters, repeats, cuda)
        bwd_ms[name] = timed(bwd, iters, repeats, cuda)
        print(f"{name:6s} forward+backward {median[name]:.4f} ms, forward {fwd_ms[name]:.4f}, "
              f"backward {bwd_ms[name]:.4f}", flush=True)  # fmt: skip

    result = {
        **run_meta(cuda),
        "benchmark": "rmsnorm_fused",
        "dry_run": args.dry_run,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shapes": {"N": N, "D": D, "dtype": "float32", "eps": eps},
        "launch": {"GPU_FWD": list(rmsnorm.GPU_FWD), "GPU_BWD": list(rmsnorm.GPU_BWD)},
        "repeats": repeats, "iters": iters,
        "median_ms": median, "forward_median_ms": fwd_ms, "backward_median_ms": bwd_ms,
        "max_rel_err": err, "max_rel_err_vs_float64": err64, "tolerance": TOLERANCE,
    }  # fmt: skip
    if args.profile and cuda:
        result["kernel_us"] = {name: profile(both, iters) for name, (_, both, _) in fns.items()}
        print(json.dumps(result["kernel_us"], indent=1))
    if args.sweep and cuda and ok:
        result["sweep"] = sweep(fns["fused"], iters)
    with open(args.out, "w") as f:
        f.write(json.dumps(result, indent=1) + "\n")
    return 0 if ok else 1


def sweep(fused, iters):
    """Device us a call of the backward and forward kernels (CUDA profiler) at other
    ``GPU_BWD`` / ``GPU_FWD`` settings (restored after)."""
    from kalmanscan.cuda import rmsnorm

    fwd, _, bwd = fused
    rows, saved = [], (rmsnorm.GPU_FWD, rmsnorm.GPU_BWD)
    try:
        for cfg in [(1024, 16, 2), (1024, 32, 2), (1024, 8, 2), (2048, 8, 4), (2048, 16, 4),
                    (4096, 4, 4), (4096, 8, 4), (4096, 8, 8), (8192, 4, 8), (512, 32, 1),
                    (1024, 16, 4)]:  # fmt: skip
            rmsnorm.GPU_BWD = cfg
            us = profile(bwd, iters)
            rows.append({"GPU_BWD": list(cfg), "bwd_kernel_us": us.get("_rms_bwd_kernel"),
                         "total_us": round(sum(us.values()), 2)})  # fmt: skip
            print(rows[-1], flush=True)
        rmsnorm.GPU_BWD = saved[1]
        for cfg in [(512, 1), (1024, 2), (1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8)]:
            rmsnorm.GPU_FWD = cfg
            rows.append(
                {"GPU_FWD": list(cfg), "fwd_kernel_us": profile(fwd, iters).get("_rms_fwd_kernel")}
            )
            print(rows[-1], flush=True)
    finally:
        rmsnorm.GPU_FWD, rmsnorm.GPU_BWD = saved
    return rows


if __name__ == "__main__":
    sys.exit(main())
