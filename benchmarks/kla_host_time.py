"""Where the host time of a KLA forward+backward call goes (CUDA; Python profiler).

``kla_kernel_time.py`` shows that at B = 4 a forward+backward call through the API takes longer
than its kernels: the GPU waits on the host. This script runs ``--calls`` calls of
``kla_filter(..., check=False)`` plus ``torch.autograd.grad`` back to back (one
synchronization at the end), reports the host time a call (wall time / calls) next to the
kernels' time (CUDA events around the same loop), and prints the functions that took the host
time (``cProfile``, sorted by own time).

    python benchmarks/kla_host_time.py --B 4 --M 960 --json F

``--parts`` instead times the pieces of a call on the host (microseconds a call, back-to-back
calls at a shape whose kernels take a few microseconds, so the GPU never holds the host up):
tensor allocation, a sum, the argument checks, the forward with and without the JIT's
argument binding (``kalmanscan.cuda._common.FAST_LAUNCH``), forward+backward, and an autograd
Function that does nothing, with the op's 8 inputs and 4 outputs (autograd's own floor). At
``--B/--L/--M/--S`` it then times the forward and forward+backward calls with
``triton.testing.do_bench`` (median and mean) and by the profiler's kernel time, with and
without the binding.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    for name, default in (("B", 4), ("L", 2048), ("M", 960), ("S", 16), ("calls", 50)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--parts", action="store_true", help="time the pieces of a call (above)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kla_host_time.py: needs a CUDA device")
    if a.parts:
        return parts(a)
    from gpu import kla_inputs

    from kalmanscan.core.kla_op import kla_filter

    x = {n: t.requires_grad_(True) for n, t in kla_inputs(a.B, a.L, a.M, a.S).items()}
    errors = errors_against_float64(x)
    leaves = list(x.values())

    def call():
        res = kla_filter(**x, backend="triton", check=False)
        return torch.autograd.grad([res.y, res.yvar], leaves, [torch.ones_like(res.y)] * 2)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(a.calls):
        call()
    end.record()
    host_ms = (time.perf_counter() - t0) * 1e3 / a.calls  # time to issue a call
    torch.cuda.synchronize()
    gpu_ms = start.elapsed_time(end) / a.calls  # issue-to-finish, GPU clock
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        call()
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    print(f"B={a.B} L={a.L} M={a.M} S={a.S}: host {host_ms:.3f} ms a call to issue, "
          f"{gpu_ms:.3f} ms a call on the GPU clock")  # fmt: skip
    print(buf.getvalue())
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(),
                       "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "shape": dict(B=a.B, L=a.L, M=a.M, S=a.S), "calls": a.calls,
                       "host_issue_ms_per_call": host_ms, "gpu_ms_per_call": gpu_ms,
                       "errors_vs_float64": errors,
                       "profile_top": buf.getvalue().splitlines()[:60]}, f, indent=1)  # fmt: skip


def errors_against_float64(x):
    """Normwise relative errors of the timed call's ``y, yvar`` against the float64 sequential
    reference (the same run's correctness, recorded next to its times)."""
    from gpu import rel

    from kalmanscan.core.kla_op import kla_filter

    with torch.no_grad():
        got = kla_filter(**x, backend="triton", check=False)
        ref = kla_filter(**{n: t.double() for n, t in x.items()}, backend="sequential")
    errs = {"y": rel(got.y, ref.y), "yvar": rel(got.yvar, ref.yvar)}
    print("errors against float64:", {k: f"{v:.2e}" for k, v in errs.items()})
    return errs


def host_us(fn, calls=300):
    """Host microseconds a call of ``fn``, back to back (the synchronization after the loop is
    not counted); median of 5 loops."""
    import statistics

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    loops = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        loops.append((time.perf_counter() - t0) * 1e6 / calls)
        torch.cuda.synchronize()
    return statistics.median(loops)


class _Noop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *xs):
        return tuple(torch.empty_like(xs[i]) for i in range(4))

    @staticmethod
    def backward(ctx, *gs):
        return (None,) * 8


def parts(a):
    import triton.testing
    from gpu import kla_inputs
    from kla_kernel_time import kernel_times

    from kalmanscan.core import kla_op
    from kalmanscan.cuda import _common

    out = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": __import__("triton").__version__}  # fmt: skip
    tiny = dict(B=1, L=16, M=32, S=16)
    x = {n: t.requires_grad_(True) for n, t in kla_inputs(**tiny).items()}
    leaves = list(x.values())
    ones = [torch.ones(1, 16, 32, device="cuda")] * 2

    def fwd():
        with torch.no_grad():
            return kla_op.kla_filter(**x, backend="triton", check=False)

    def fwd_grad():
        return kla_op.kla_filter(**x, backend="triton", check=False)

    def fwdbwd():
        res = kla_op.kla_filter(**x, backend="triton", check=False)
        return torch.autograd.grad([res.y, res.yvar], leaves, ones)

    def fwdbwd_acc():
        res = kla_op.kla_filter(**x, backend="triton", check=False)
        torch.autograd.backward([res.y, res.yvar], ones)

    def noop():
        outs = _Noop.apply(*leaves, leaves[0], leaves[1])
        return torch.autograd.grad(outs[:2], leaves, ones, allow_unused=True)

    v = x["v"].detach()
    items = {
        "torch.empty [B,L,M]": lambda: torch.empty(1, 16, 32, device="cuda"),
        "torch.zeros [B,M,S]": lambda: torch.zeros(1, 32, 16, device="cuda"),
        "sum over dim 0": lambda: v.sum(0),
        "_prepare (check=False)": lambda: kla_op._prepare(
            *leaves, None, None, keep_half=True, check=False
        ),
        "kla_filter check=True, no_grad": lambda: kla_op.kla_filter(**x, backend="triton"),
        "noop autograd.Function fwd+grad": noop,
    }
    res = {}
    for name, fn in items.items():
        res[name] = host_us(fn)
    for fast in (False, True):
        _common.FAST_LAUNCH = fast
        tag = "fast launch" if fast else "JIT launch"
        res[f"forward no_grad ({tag})"] = host_us(fwd)
        res[f"forward with grad ({tag})"] = host_us(fwd_grad)
        res[f"forward+grad ({tag})"] = host_us(fwdbwd)
        res[f"forward+backward accumulate ({tag})"] = host_us(fwdbwd_acc)
    for x_ in leaves:
        x_.grad = None
    out["tiny_shape"] = tiny
    out["host_us_per_call"] = res
    for k, v_ in res.items():
        print(f"{k:45s} {v_:8.1f} us")
    # the timed shape
    big = dict(B=a.B, L=a.L, M=a.M, S=a.S)
    xb = {n: t.requires_grad_(True) for n, t in kla_inputs(**big).items()}
    out["errors_vs_float64"] = errors_against_float64(xb)
    gy = torch.randn(a.B, a.L, a.M, device="cuda")
    leaves_b = list(xb.values())

    def bfwd():
        with torch.no_grad():
            return kla_op.kla_filter(**xb, backend="triton", check=False)

    def bfwdbwd():
        r = kla_op.kla_filter(**xb, backend="triton", check=False)
        return torch.autograd.grad([r.y, r.yvar], leaves_b, [gy, gy])

    timed = {}
    for fast in (False, True):
        _common.FAST_LAUNCH = fast
        tag = "fast" if fast else "jit"
        for name, fn in (("fwd", bfwd), ("fwdbwd", bfwdbwd)):
            row = timed[f"{name} {tag}"] = {}
            for mode in ("median", "mean"):
                row[f"do_bench_{mode}_ms"] = float(triton.testing.do_bench(
                    fn, warmup=50, rep=300, return_mode=mode))  # fmt: skip
            row["host_us_per_call"] = host_us(fn, calls=100)
            row["kernels_ms"] = kernel_times(fn)[0]
            print(name, tag, {k: round(v_, 4) for k, v_ in row.items()})
    _common.FAST_LAUNCH = True
    out["shape"] = big
    out["timed"] = timed
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
