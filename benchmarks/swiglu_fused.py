"""SwiGLU's activation ``silu(gate) * up``, forward and backward: torch's eager ops against the
fused Triton kernels (``kalmanscan.cuda.swiglu.swiglu``), alone and inside the ``SwiGLU`` layer
(H200; CUDA only).

At N = 16,384 tokens and the hidden width of d_model 512 (1,365, padded to Hp = 1,368),
bfloat16:

- correctness first: the activation and the gradient of ``h [N, 2 Hp]`` from both paths, their
  largest relative difference and the share of elements that differ (by how many units in the
  last place); a fused path that differs in more than ``--max-ulp`` ulps or in more than
  ``--max-share`` of the elements gets no timing (and the script exits 1);
- ``act_fwd``, ``act_fwd_bwd``: ``swiglu_reference(h)`` (``chunk``, ``F.silu``, the product;
  autograd's backward adds ``silu_backward`` and the concatenation of the halves' gradients)
  against ``swiglu(h)``; the backward by ``torch.autograd.grad`` with a fixed ``ga``;
- ``layer_fwd_bwd``: ``SwiGLU(512)`` under bfloat16 autocast on ``x [N, 512]``, GEMMs included,
  with ``fused = "eager"`` and ``"fused"``;
- each the median over ``--reps`` of the device time a call of ``--inner`` calls back to back
  (CUDA events behind a GPU sleep that lets the host queue them all first: see ``timed``), the
  host's time to issue a call, and the fused kernels' bandwidth (bytes they must move over
  their time);
- a torch.profiler split of each forward + backward row: device time by kernel;
- ``--sweep``: the fused forward + backward at other ``(BN, BH, num_warps)`` launch blocks
  (``swiglu.GPU_BLOCKS``), each checked against the default blocks' results (equal: the
  kernels are elementwise).

    export PYTHONPATH=$PWD
    python benchmarks/swiglu_fused.py --sweep --out benchmarks/results/swiglu-fused-h200.json

``--dry-run``: the same on the CPU under ``TRITON_INTERPRET=1`` at N = 12, d_model 24 (Hp = 64;
checks the script, times nothing meaningful).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton's first import

import torch  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kalmanscan.cuda import swiglu as sw  # noqa: E402
from kalmanscan.kla.model import GEMM_ALIGN, SwiGLU  # noqa: E402
from kalmanscan.validation.run_meta import run_meta  # noqa: E402

SWEEP = [(16, 128, 4), (8, 256, 4), (32, 128, 8), (16, 256, 8), (32, 64, 4), (64, 64, 8),
         (4, 512, 4), (8, 128, 2), (32, 256, 8), (64, 128, 8), (16, 64, 4), (64, 64, 4),
         (128, 64, 8), (32, 32, 4), (16, 128, 8), (8, 64, 2)]  # fmt: skip


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Units in the last place between two float16/bfloat16 (or float32) tensors, elementwise."""
    itype = {2: torch.int16, 4: torch.int32}[a.element_size()]
    top = -(1 << (8 * a.element_size() - 1))

    def ordered(t):
        i = t.contiguous().view(itype).to(torch.int64)
        return torch.where(i < 0, top - i, i)

    return (ordered(a) - ordered(b)).abs()


def compare(have, want) -> dict:
    """Largest relative difference, largest ulp difference and the share of differing elements."""
    have, want = have.detach(), want.detach()
    u = ulps(have, want)
    scale = want.float().abs().max().clamp_min(1e-30)
    return {
        "max_rel_err": float((have.float() - want.float()).abs().max() / scale),
        "max_ulp": int(u.max()),
        "n_diff": int((u > 0).sum()),
        "n_diff_1ulp": int((u == 1).sum()),
        "numel": u.numel(),
        "share_diff": float((u > 0).float().mean()),
    }


def _sleep_cycles_per_ms() -> float:
    """GPU clock cycles ``torch.cuda._sleep`` spins a millisecond (measured)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(10**7)
    b.record()
    b.synchronize()
    return 10**7 / a.elapsed_time(b)


def timed(fn, reps, inner, cuda) -> tuple[list[float], list[float]]:
    """``(device ms, host ms)`` a call, one of each a repeat of ``inner`` calls back to back.
    Device: between two CUDA events, with a GPU sleep queued before them that outlasts the
    host's enqueueing of the calls, so the events time the device's work alone (a call's host
    time can exceed its kernels'); host: ``perf_counter`` around the enqueueing. On the CPU
    both are the wall time. ``inner`` warm-up calls first."""
    for _ in range(inner):
        fn()
    dev, host = [], []
    if cuda:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        cycles = int(_sleep_cycles_per_ms() * ((time.perf_counter() - t0) * 2e3 + 1.0))
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            torch.cuda._sleep(cycles)
            a.record()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        host.append((time.perf_counter() - t0) * 1e3 / inner)
        if cuda:
            b.record()
            b.synchronize()
            dev.append(a.elapsed_time(b) / inner)
        else:
            dev.append(host[-1])
    return dev, host


def profile_split(fn, cuda) -> dict:
    """Device time (us) of each kernel of one call of ``fn``, by kernel name (torch.profiler;
    CPU ops' self time without CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    split = {}
    for ev in prof.key_averages():
        us = ev.device_time_total if cuda else ev.self_cpu_time_total
        if us > 0 and (not cuda or ev.device_type.name == "CUDA"):
            split[ev.key] = split.get(ev.key, 0.0) + us
    return {k: round(v, 2) for k, v in sorted(split.items(), key=lambda kv: -kv[1])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON output path")
    ap.add_argument("--dry-run", action="store_true", help="CPU, interpreted, tiny sizes")
    ap.add_argument("--reps", type=int, default=25, help="timed repeats (default 25)")
    ap.add_argument("--inner", type=int, default=20, help="calls a repeat (default 20)")
    ap.add_argument("--sweep", action="store_true", help="also time other launch blocks")
    ap.add_argument("--max-ulp", type=int, default=2,
                    help="largest ulp difference allowed (default 2: one in silu, doubled by "
                         "the product)")  # fmt: skip
    ap.add_argument("--max-share", type=float, default=1e-3,
                    help="largest share of differing elements allowed (default 1e-3)")  # fmt: skip
    args = ap.parse_args(argv)
    cuda = not args.dry_run
    if args.dry_run:
        dev, N, D = "cpu", 12, 24  # H = Hp = 64
        reps, inner, sweep = 1, 1, [(4, 16, 1)]
    elif not torch.cuda.is_available():
        raise SystemExit("swiglu_fused.py: needs a CUDA device (or --dry-run)")
    else:
        dev, N, D = "cuda", 16384, 512
        reps, inner, sweep = args.reps, args.inner, SWEEP
    bf = torch.bfloat16
    layer = SwiGLU(D).to(dev)
    layer.pad = "always"  # as on CUDA: the hidden width padded to GEMM_ALIGN
    H = layer.hidden
    Hp = -(-H // GEMM_ALIGN) * GEMM_ALIGN
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(N, 2 * Hp, device=dev, generator=g).to(bf).requires_grad_(True)
    ga = torch.randn(N, Hp, device=dev, generator=g).to(bf)

    def act(f):
        def run():
            a = f(h)
            return a, torch.autograd.grad(a, h, ga)[0]

        return run

    eager, fused = act(sw.swiglu_reference), act(sw.swiglu)
    (a_e, gh_e), (a_f, gh_f) = eager(), fused()
    errors = {"a": compare(a_f, a_e), "gh": compare(gh_f, gh_e)}
    ok = all(e["max_ulp"] <= args.max_ulp and e["share_diff"] <= args.max_share
             for e in errors.values())  # fmt: skip
    for name, e in errors.items():
        print(f"{name:3s} fused vs eager: max rel {e['max_rel_err']:.2e}, max {e['max_ulp']} "
              f"ulp, {e['n_diff']} of {e['numel']} differ ({e['n_diff_1ulp']} by 1 ulp)",
              flush=True)  # fmt: skip
    if not ok:
        print("the fused path fails its check: no timing", flush=True)

    x = torch.randn(N, D, device=dev, generator=g).requires_grad_(True)
    gout = torch.randn(N, D, device=dev, generator=g).to(bf)
    params = [x, layer.w12.weight, layer.w3.weight]

    def layer_step(mode):
        def run():
            layer.fused = mode
            with torch.autocast(dev, dtype=bf):
                out = layer(x)
            return torch.autograd.grad(out, params, gout)

        return run

    fns = {
        "act_fwd/eager": lambda: sw.swiglu_reference(h),
        "act_fwd/fused": lambda: sw.swiglu(h),
        "act_fwd_bwd/eager": eager,
        "act_fwd_bwd/fused": fused,
        "layer_fwd_bwd/eager": layer_step("eager"),
        "layer_fwd_bwd/fused": layer_step("fused"),
    }
    gl_e, gl_f = layer_step("eager")(), layer_step("fused")()
    layer_err = {n: compare(a, b)["max_rel_err"]
                 for n, a, b in zip(("x", "w12", "w3"), gl_f, gl_e, strict=True)}  # fmt: skip
    print(f"layer gradients, fused vs eager (max rel): {layer_err}", flush=True)
    median, host, samples = {}, {}, {}
    if ok:
        for name, fn in fns.items():
            ts, hs = timed(fn, reps, inner, cuda)
            median[name], host[name] = statistics.median(ts), statistics.median(hs)
            samples[name] = ts
            print(f"{name:22s} {median[name]:8.4f} ms (host {host[name]:.4f} ms)", flush=True)
    e2 = 2  # bytes of a bfloat16
    nbytes = {"act_fwd": 3 * N * Hp * e2, "act_fwd_bwd": 8 * N * Hp * e2}
    tb_per_s = {k: nbytes[k] / (median[f"{k}/fused"] * 1e-3) / 1e12 for k in nbytes if median}
    for k, v in tb_per_s.items():
        print(f"{k} fused: {v:.2f} TB/s ({nbytes[k] / 1e6:.0f} MB)", flush=True)
    profiles = {name: profile_split(fns[name], cuda) for name in fns if "fwd_bwd" in name}
    for name, split in profiles.items():
        print(f"profile {name}: {sum(split.values()):.1f} us", flush=True)
        for k, us in split.items():
            print(f"    {us:9.2f} {k[:110]}", flush=True)

    rows = []
    if args.sweep and ok:
        attr = "GPU_BLOCKS" if cuda else "INTERP_BLOCKS"
        saved = getattr(sw, attr)
        try:
            want = fused()
            for blocks in sweep:
                setattr(sw, attr, blocks)
                have = fused()
                same = all(bool(torch.equal(p, q)) for p, q in zip(have, want, strict=True))
                ms = statistics.median(timed(fused, reps, inner, cuda)[0])
                rows.append({"blocks": list(blocks), "act_fwd_bwd_ms": ms,
                             "tb_per_s": nbytes["act_fwd_bwd"] / (ms * 1e-3) / 1e12,
                             "equal_to_default": same})  # fmt: skip
                print(f"blocks {blocks}: {ms:.4f} ms, equal {same}", flush=True)
        finally:
            setattr(sw, attr, saved)
    if args.out:
        res = {
            **run_meta(cuda),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "shapes": {"N": N, "d_model": D, "H": H, "Hp": Hp, "dtype": "bfloat16"},
            "blocks": list(sw._blocks()),
            "check": {"ok": ok, "max_ulp": args.max_ulp, "max_share": args.max_share},
            "errors": {**errors, "layer_grad_max_rel_err": layer_err},
            "median_ms": median,
            "host_ms": host,
            "samples_ms": samples,
            "fused_bytes": nbytes,
            "fused_tb_per_s": tb_per_s,
            "profile_us": profiles,
            "sweep": rows,
        }
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
