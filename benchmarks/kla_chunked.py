"""KLA op in time chunks against the unchunked kernels: forward and forward + backward of
``kla_filter(backend="triton")`` at the shapes of a d_model 512 KLA layer (M = 1024 channels,
S = 16 slots), for few long sequences and many short ones at fixed token counts.

Each shape runs three ways in the same process: ``unchunked`` (``tuning.CHUNKS = 1``), ``auto``
(the rule ``tuning.chunks_for``) and, for the sweep that sets the rule's threshold
(``tuning.CHUNK_BELOW``), every chunk count ``C`` from 2 to 64 that divides ``L`` with chunks
of at least half the rule's ``tuning.MIN_CHUNK`` steps (so that the sweep also times the chunk
length the rule refuses). Correctness, checked before any speed is reported:

- every chunked run's outputs (y, yvar, final lam, eta) and the gradients of all six inputs
  equal the unchunked run's to ``<= 1e-5`` normwise relative (float32);
- on a slice of 16 channels at the shape's own ``L`` the chunked op in float32 (same ``C``)
  against the unchunked op in float64 (which tests/test_cuda_kla.py holds to the sequential
  reference), to the kernel tolerances of ``kalmanscan.testing``.

A path whose check fails gets no time (``"ms": null``). GPU time: CUDA events, the median of
``--reps`` calls after warm-up. JSON to ``--out``.

    python benchmarks/kla_chunked.py --out benchmarks/results/kla-chunked-h200.json
    python benchmarks/kla_chunked.py --shapes 1x32768,1x131072 --no-sweep   # a subset
    python benchmarks/kla_chunked.py --dry-run   # CPU, TRITON_INTERPRET=1, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

FULL_SHAPES = [  # (B, L): 16,384 and 131,072 tokens, and 1 x 32,768
    (8, 2048), (2, 8192), (1, 16384),
    (1, 32768),
    (64, 2048), (16, 8192), (4, 32768), (1, 131072),
]  # fmt: skip
DRY_SHAPES = [(4, 16), (1, 32)]
SWEEP = (2, 4, 8, 16, 32, 64)
SLICE_M = 16


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="JSON path (default: print only)")
    p.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument(
        "--shapes", default=None, help="comma-separated BxL (default: the 8 shapes of FULL_SHAPES)"
    )
    p.add_argument(
        "--no-sweep",
        action="store_true",
        help="time unchunked and the rule's choice only, not every chunk count",
    )
    return p.parse_args()


ARGS = parse()
if ARGS.dry_run:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton's first import

import torch  # noqa: E402

from kalmanscan.core import kla_op  # noqa: E402
from kalmanscan.core.kla_op import kla_filter  # noqa: E402
from kalmanscan.cuda.kla import tuning  # noqa: E402
from kalmanscan.kla.config import KLAConfig  # noqa: E402
from kalmanscan.kla.layer import KLALayer  # noqa: E402
from kalmanscan.testing import TOLERANCES  # noqa: E402
from kalmanscan.validation.run_meta import utc_now  # noqa: E402

NAMES = ("v", "Lv", "k", "q", "decay", "process_var")
SAME = 1e-5  # chunked against unchunked, normwise (float32 rounding)


def normwise(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def inputs(B, L, M, S, dyn, device, seed=0):
    """Layer-like inputs: unit-norm keys and queries (the layer's qk L2-norm), value precisions
    in [0.2, 5], the layer's initial dynamics."""
    g = torch.Generator(device=device).manual_seed(seed)
    k = torch.randn(B, L, S, device=device, generator=g)
    q = torch.randn(B, L, S, device=device, generator=g)
    return dict(
        v=torch.randn(B, L, M, device=device, generator=g),
        Lv=0.2 + 4.8 * torch.rand(B, L, M, device=device, generator=g),
        k=k / k.norm(dim=-1, keepdim=True),
        q=q / q.norm(dim=-1, keepdim=True),
        decay=dyn[0].to(device),
        process_var=dyn[1].to(device),
    )


def with_chunks(C):
    """Set ``tuning.CHUNKS`` (None: the rule)."""
    tuning.CHUNKS = C


def call(x, grads):
    """The op on ``x``; with ``grads`` (gy, gyv) also the backward: (outputs, input grads)."""
    if grads is None:
        with torch.no_grad():
            r = kla_filter(**x, backend="triton", check=False)
        return (r.y, r.yvar, r.final.lam, r.final.eta), None
    leaves = {n: t.detach().requires_grad_(True) for n, t in x.items()}
    r = kla_filter(**leaves, backend="triton", check=False)
    g = torch.autograd.grad([r.y, r.yvar], list(leaves.values()), list(grads))
    return (r.y, r.yvar, r.final.lam, r.final.eta), g


def timed(fn, reps, cuda):
    if not cuda:  # the interpreter: one call, a smoke test of the timing path
        t0 = time.perf_counter()
        fn()
        return [1e3 * (time.perf_counter() - t0)]
    fn()  # warm-up (compiles)
    fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return out


def check_same(got, ref, what):
    errs = {}
    names = ("y", "yvar", "lam", "eta")
    for n, a, b in zip(names, got[0], ref[0], strict=True):
        errs[n] = normwise(a, b)
    if got[1] is not None:
        for n, a, b in zip(NAMES, got[1], ref[1], strict=True):
            errs[f"grad_{n}"] = normwise(a, b)
    worst = max(errs.values())
    return {"what": what, "worst": worst, "ok": worst <= SAME, "errors": errs}


def check_slice(B, L, S, dyn, C, device):
    """Chunked float32 (``C`` chunks) against unchunked float64 on ``SLICE_M`` channels."""
    Ms = min(SLICE_M, dyn[0].shape[0])
    x = inputs(B, L, Ms, S, (dyn[0][:Ms], dyn[1][:Ms]), device, seed=1)
    g = torch.Generator(device=device).manual_seed(2)
    grads = [torch.randn(B, L, Ms, device=device, generator=g) for _ in range(2)]
    try:
        with_chunks(C)
        got = call(x, grads)
        with_chunks(1)
        ref = call({n: t.double() for n, t in x.items()}, [t.double() for t in grads])
    finally:
        with_chunks(None)  # the next shape's rule (its "auto" count) must not see C = 1
    errs = {n: normwise(a, b) for n, a, b in zip(("y", "yvar", "lam", "eta"), got[0], ref[0],
                                                  strict=True)}  # fmt: skip
    gerrs = {f"grad_{n}": normwise(a, b) for n, a, b in zip(NAMES, got[1], ref[1], strict=True)}
    ok = (
        max(errs.values()) <= TOLERANCES[("kernel", "float32")]
        and max(gerrs.values()) <= TOLERANCES[("kernel_grad", "float32")]
    )
    return {"what": f"float32 C={C} vs float64 unchunked, {Ms} channels", "ok": ok,
            "errors": {**errs, **gerrs}}  # fmt: skip


T0 = time.perf_counter()


def main():
    cuda = not ARGS.dry_run
    if cuda and not torch.cuda.is_available():
        sys.exit("kla_chunked.py: needs a CUDA device (or --dry-run)")
    device = torch.device("cuda" if cuda else "cpu")
    cfg = KLAConfig()
    M, S = cfg.d_inner(ARGS.d_model), cfg.d_state
    shapes = FULL_SHAPES
    if ARGS.dry_run:  # the interpreter on the CPU: tiny layer, the rule with 1 multiprocessor
        M, S = 4, 4
        shapes = DRY_SHAPES
        kla_op._resolve = lambda backend, dev: backend  # triton kernels on CPU tensors
        tuning.sm_count = lambda dev: 1
        tuning.MIN_CHUNK = 8
        tuning.LANES_PER_SM = 64
        tuning.CHUNK_BELOW = 64
    if ARGS.shapes:
        shapes = [tuple(int(n) for n in item.split("x")) for item in ARGS.shapes.split(",")]
    layer = KLALayer(ARGS.d_model if not ARGS.dry_run else 2, cfg if not ARGS.dry_run else
                     KLAConfig(d_state=S, expand=M / 2))  # fmt: skip
    with torch.no_grad():
        dyn = tuple(t.detach().float() for t in layer.dynamics())
    sms = tuning.sm_count(device)
    result = {
        "date": utc_now(),
        "device": torch.cuda.get_device_name() if cuda else "cpu (TRITON_INTERPRET=1)",
        "torch": torch.__version__,
        "d_model": ARGS.d_model, "M": M, "S": S, "sms": sms,
        "LANES_PER_SM": tuning.LANES_PER_SM, "CHUNK_BELOW": tuning.CHUNK_BELOW,
        "MAX_CHUNKS": tuning.MAX_CHUNKS, "MIN_CHUNK": tuning.MIN_CHUNK,
        "reps": ARGS.reps, "rows": [], "checks": [],
    }  # fmt: skip
    all_ok = True
    for B, L in shapes:
        lanes = B * M * S
        auto = tuning.chunks_for(lanes, L, sms)
        floor = max(tuning.MIN_CHUNK // 2, 1)
        counts = [c for c in SWEEP if L % c == 0 and L // c >= floor]
        # the sweep where the lanes do not fill the device, else the rule's choice only
        few = lanes < tuning.CHUNK_BELOW * max(sms, 1) and not ARGS.no_sweep
        t_shape = time.perf_counter()
        variants = [1] + (counts if few else []) + [auto]
        x = inputs(B, L, M, S, dyn, device)
        g = torch.Generator(device=device).manual_seed(3)
        grads = [torch.randn(B, L, M, device=device, generator=g) for _ in range(2)]
        base = {}
        for C in dict.fromkeys(variants):
            row = {"B": B, "L": L, "tokens": B * L, "lanes": lanes, "chunks": C,
                   "auto": C == auto}  # fmt: skip
            for mode, gr in (("fwd", None), ("fwd+bwd", grads)):
                with_chunks(C)
                out = call(x, gr)
                if C == 1:
                    base[mode] = out
                    ok = True
                else:
                    chk = check_same(out, base[mode], f"B={B} L={L} C={C} {mode} vs unchunked")
                    result["checks"].append(chk)
                    ok = chk["ok"]
                del out
                ms = timed(lambda gr=gr, x=x: call(x, gr), ARGS.reps, cuda) if ok else None
                all_ok &= ok
                key = "fwd_ms" if mode == "fwd" else "fwdbwd_ms"
                row[key] = statistics.median(ms) if ms else None
                row[key.replace("_ms", "_us_per_ktok")] = (
                    1e3 * row[key] / (B * L / 1024) if ms else None
                )
            with_chunks(None)
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
        base.clear()
        print(f"B={B} L={L}: {time.perf_counter() - t_shape:.1f} s", file=sys.stderr, flush=True)
        if auto > 1:
            chk = check_slice(B, L, S, dyn, auto, device)
            chk["what"] = f"B={B} L={L}: " + chk["what"]
            result["checks"].append(chk)
            all_ok &= chk["ok"]
            print(json.dumps(chk), flush=True)
        del x, grads
        if cuda:
            torch.cuda.empty_cache()
    with_chunks(None)
    result["all_checks_ok"] = all_ok
    result["wall_s"] = time.perf_counter() - T0
    text = json.dumps(result, indent=1)
    if ARGS.out:
        with open(ARGS.out, "w") as f:
            f.write(text + "\n")
    print("checks ok" if all_ok else "SOME CHECKS FAILED", file=sys.stderr)
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
