"""Where the time of the KLA op goes on the GPU: kernels against the Python API around them.

``benchmarks/gpu.py`` times ``kla_filter(..., check=False)`` call after call: its figure
includes the Python work of each call (input preparation, the autograd function, the
launches), during which the GPU may idle. This script times the same shapes four ways, in one
run:

- ``api_check``: ``kla_filter(...)`` with the value checks (``check=True`` reads the inputs
  and synchronizes with the host once a call; ``do_bench`` median);
- ``api``: ``kla_filter(..., check=False)``, the KLA layer's path and ``gpu.py``'s
  (``do_bench`` median); for
  forward+backward also ``api_accumulate``, the gradients added into the inputs' ``.grad``
  (``autograd.backward``, as ``gpu.py`` timed it up to session 7), where ``api`` returns them
  (``autograd.grad``, as ``gpu.py`` times it now);
- ``graph``: the ``check=False`` call replayed from a CUDA graph (no Python, no launch gaps;
  ``triton.testing.do_bench_cudagraph`` median); for forward+backward, the op wrapped by
  ``torch.cuda.make_graphed_callables`` (its forward and its backward each replayed from a
  graph, autograd around them; ``do_bench`` median);
- ``kernels``: the summed device time of the kernels of one call, from the CUDA profiler
  (median over the profiled calls), by kernel name.

``--variants``: KLA tuning variants timed by kernel time (profiler) after the default; each
must first match the default configuration's outputs and gradients.

Every shape's forward output is first checked against the float64 sequential reference in the
same run (normwise relative error, float32 tolerance 1e-4); a wrong result gets no time.

    python benchmarks/kla_kernel_time.py --json benchmarks/results/kla-kernel-time.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

SHAPES = ((4, 2048, 960, 16), (8, 2048, 2048, 16))


def kernel_times(fn, calls=10):
    """Median over ``calls`` calls of the summed CUDA kernel time of one call, and the median
    per kernel name (ms)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    per_call = []
    names: dict[str, list[float]] = {}
    for _ in range(calls):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        total = 0.0
        seen: dict[str, float] = {}
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                us = ev.device_time_total  # a device event: its own duration (us)
                total += us
                seen[ev.name] = seen.get(ev.name, 0.0) + us
        per_call.append(total / 1e3)
        for n, us in seen.items():
            names.setdefault(n, []).append(us / 1e3)
    return statistics.median(per_call), {n: statistics.median(v) for n, v in names.items()}


def case(B, L, M, S, variants=(), dump=None):
    import triton.testing
    from gpu import kla_inputs, rel

    from kalmanscan.core.kla_op import kla_filter

    x = kla_inputs(B, L, M, S)
    g = torch.Generator(device="cuda").manual_seed(1)
    gy = torch.randn(B, L, M, device="cuda", generator=g)
    gyv = torch.randn(B, L, M, device="cuda", generator=g)
    out = {"shape": dict(B=B, L=L, M=M, S=S)}
    got = kla_filter(**x, backend="triton")
    ref = kla_filter(**{n: t.double() for n, t in x.items()}, backend="sequential")
    out["errors"] = {"y": rel(got.y, ref.y), "yvar": rel(got.yvar, ref.yvar)}
    out["correct"] = max(out["errors"].values()) <= 1e-4
    del got, ref
    if not out["correct"]:
        return out
    xs = {n: t.requires_grad_(True) for n, t in x.items()}

    def fwd(check):
        with torch.no_grad():
            return kla_filter(**xs, backend="triton", check=check)

    def fwdbwd(check):
        res = kla_filter(**xs, backend="triton", check=check)
        torch.autograd.grad([res.y, res.yvar], list(xs.values()), [gy, gyv])

    def fwdbwd_accumulate():
        # as benchmarks/gpu.py times it: the gradients are added into the inputs' .grad
        res = kla_filter(**xs, backend="triton", check=False)
        torch.autograd.backward([res.y, res.yvar], [gy, gyv])

    def bench(fn, warmup, rep):
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")

    out["fwd_ms"] = {
        "api_check": bench(lambda: fwd(True), warmup=50, rep=300),
        "api": bench(lambda: fwd(False), warmup=50, rep=300),
    }
    out["fwdbwd_ms"] = {
        "api_check": bench(lambda: fwdbwd(True), warmup=50, rep=300),
        "api": bench(lambda: fwdbwd(False), warmup=50, rep=300),
        "api_accumulate": bench(fwdbwd_accumulate, warmup=50, rep=300),
    }
    for t in xs.values():
        t.grad = None
    try:
        out["fwd_ms"]["graph"] = triton.testing.do_bench_cudagraph(
            lambda: fwd(False), rep=300, return_mode="median"
        )
    except Exception as e:  # capture may be refused by a torch/triton version: say so
        out["fwd_ms"]["graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    try:
        leaves = list(xs.values())

        def op(*args):
            r = kla_filter(*args, backend="triton", check=False)
            return r.y, r.yvar

        graphed = torch.cuda.make_graphed_callables(op, tuple(leaves))

        def fwdbwd_graphed():
            y, yvar = graphed(*leaves)
            return torch.autograd.grad([y, yvar], leaves, [gy, gyv])

        # the graphed op against the plain one: same gradients
        g_ref = torch.autograd.grad(list(op(*leaves)), leaves, [gy, gyv])
        out["fwdbwd_graph_vs_api"] = max(rel(a, b) for a, b in zip(fwdbwd_graphed(), g_ref,
                                                                      strict=True))  # fmt: skip
        out["fwdbwd_ms"]["graph"] = bench(fwdbwd_graphed, warmup=50, rep=300)
    except Exception as e:
        out["fwdbwd_ms"]["graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    try:
        out["fwd_ms"]["kernels"], out["fwd_kernels_ms"] = kernel_times(lambda: fwd(False))
        out["fwdbwd_ms"]["kernels"], out["fwdbwd_kernels_ms"] = kernel_times(lambda: fwdbwd(False))
    except Exception as e:
        out["profiler_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    # tuning variants by kernel time: each first matches the default configuration's outputs
    # and gradients (normwise 1e-5, as in gpu.py), then the profiler sums its kernels
    from gpu import VARIANT_TOL, checked_variants, kla_outputs

    from kalmanscan.cuda.kla import tuning as KT

    out["variants"] = {}
    for key, err, error in checked_variants(KT.TUNING, variants, lambda: kla_outputs(xs, gy, gyv)):
        entry = {"vs_default": err}
        try:
            if error is not None:
                raise error
            if err <= VARIANT_TOL:
                entry["fwd_kernels_ms"] = kernel_times(lambda: fwd(False))[0]
                total, by_name = kernel_times(lambda: fwdbwd(False))
                entry["fwdbwd_kernels_ms"] = total
                entry["fwdbwd_by_kernel_ms"] = short_names(by_name)
        except Exception as e:
            entry = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        out["variants"][key] = entry
        print(key, entry, flush=True)
        if dump:
            dump(out)
    if variants:
        # the default once more after the variants: how far the machine drifted during the sweep
        try:
            out["default_after_variants"] = {
                "fwd_kernels_ms": kernel_times(lambda: fwd(False))[0],
                "fwdbwd_kernels_ms": kernel_times(lambda: fwdbwd(False))[0],
            }
        except Exception as e:
            out["default_after_variants"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        print("default after the variants", out["default_after_variants"], flush=True)
    return out


def short_names(by_name):
    """Per-kernel times with torch's long template names shortened to their function name."""
    out = {}
    for name, ms in by_name.items():
        short = name if name.startswith("_") else name.split("<")[0].split("::")[-1].strip()
        out[short] = out.get(short, 0.0) + ms
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument(
        "--variants", help="JSON list of KLA tuning variants to time, e.g. '[{\"NS\": 8}]'"
    )
    a = p.parse_args()
    import triton

    props = torch.cuda.get_device_properties(0)
    res = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": props.name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "timing": "do_bench / do_bench_cudagraph medians; kernels: CUDA profiler, median of 10",
        "results": [],
    }
    variants = json.loads(a.variants) if a.variants else []

    def dump(partial):
        with open(a.json, "w") as f:
            json.dump({**res, "results": res["results"] + [partial]}, f, indent=1)

    for shape in SHAPES:
        r = case(*shape, variants=variants, dump=dump)
        print(json.dumps(r), flush=True)
        res["results"].append(r)
        torch.cuda.empty_cache()
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
