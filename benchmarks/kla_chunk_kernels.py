"""Where the chunked KLA op's time goes: the CUDA profiler's per-kernel device time of
``kla_filter(backend="triton")`` forward and forward + backward, chunked and unchunked, at shapes
with the same lanes a step (``B C`` rows of ``L / C`` steps against ``B C`` sequences of ``L / C``
steps), so a chunked pass can be compared with the unchunked kernel at equal occupancy.

    python benchmarks/kla_chunk_kernels.py [--out F.json]
    python benchmarks/kla_chunk_kernels.py --maps-sweep [--out F.json]

``--maps-sweep``: the two map kernels' time at B=1 L=32768 C=32 and B=2 L=8192 C=16 (the chunk
counts ``tuning.chunks_for`` picks there) for launch choices of ``chunked.MAPS_LAUNCH`` and
``TANGENT_LAUNCH`` (slots a thread, steps unrolled, pipeline stages; both kernels take each
choice, each kernel's time is its own), the chunked op's outputs and gradients checked against
the unchunked op's in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
_argv, sys.argv = sys.argv, sys.argv[:1]  # kla_chunked parses its own arguments on import

from kla_chunked import call, inputs, with_chunks  # noqa: E402

from kalmanscan.kla.config import KLAConfig  # noqa: E402
from kalmanscan.kla.layer import KLALayer  # noqa: E402
from kalmanscan.validation.run_meta import run_meta  # noqa: E402

CASES = [  # (B, L, C)
    (1, 32768, 1), (1, 32768, 8), (8, 4096, 1),
    (2, 8192, 1), (2, 8192, 4), (8, 2048, 1),
]  # fmt: skip


def profile(fn, reps=5):
    fn()
    fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:60]] += e.device_time_total / 1e3 / reps
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


SWEEP = [  # (slots, unroll, NS)
    (1, 4, 1), (2, 8, 1), (4, 4, 1), (4, 8, 1), (8, 8, 1),
]  # fmt: skip


def normwise(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def maps_sweep(dyn):
    from kalmanscan.cuda.kla import chunked

    rows = []
    saved = dict(chunked.MAPS_LAUNCH), dict(chunked.TANGENT_LAUNCH)
    for B, L, C in ((1, 32768, 32), (2, 8192, 16)):
        M, S = dyn[0].shape
        x = inputs(B, L, M, S, dyn, "cuda")
        gy = torch.randn(B, L, M, device="cuda")
        grads = (gy, gy * 0.1)
        with_chunks(1)
        ref = call(x, grads)
        for slots, unroll, ns in SWEEP:
            launch = {"slots": slots, "unroll": unroll, "NS": ns}
            chunked.MAPS_LAUNCH, chunked.TANGENT_LAUNCH = dict(launch), dict(launch)
            with_chunks(C)
            got = call(x, grads)
            err = max([normwise(a, b) for a, b in zip(got[0], ref[0], strict=True)]
                      + [normwise(a, b) for a, b in zip(got[1], ref[1], strict=True)])
            per = profile(lambda x=x, grads=grads: call(x, grads))
            row = {"B": B, "L": L, "C": C, **launch, "max_rel_err_vs_unchunked": err,
                   "maps_ms": per.get("_chunk_maps_kernel"),
                   "tangent_maps_ms": per.get("_adjoint_maps_kernel"),
                   "fwdbwd_kernels_ms": sum(per.values())}  # fmt: skip
            print(row, flush=True)
            rows.append(row)
    chunked.MAPS_LAUNCH, chunked.TANGENT_LAUNCH = saved
    with_chunks(None)
    return rows


def write(path, rows):
    """The result JSON: date, device and the rows."""
    with open(path, "w") as f:
        json.dump({**run_meta(cuda=True), "rows": rows}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--maps-sweep", action="store_true")
    args = ap.parse_args(_argv[1:])
    layer = KLALayer(512, KLAConfig())
    with torch.no_grad():
        dyn = tuple(t.detach().float() for t in layer.dynamics())
    if args.maps_sweep:
        rows = maps_sweep(dyn)
        if args.out:
            write(args.out, rows)
        return
    rows = []
    for B, L, C in CASES:
        M, S = dyn[0].shape
        x = inputs(B, L, M, S, dyn, "cuda")
        with_chunks(C)
        gy = torch.randn(B, L, M, device="cuda")
        row = {"B": B, "L": L, "C": C}
        for what, grads in (("fwd", None), ("fwdbwd", (gy, gy * 0.1))):
            per = profile(lambda x=x, grads=grads: call(x, grads))
            row[what] = {"total_ms": sum(per.values()), "kernels": per}
            print(B, L, C, what, round(sum(per.values()), 3),
                  {k: round(v, 3) for k, v in list(per.items())[:6]}, flush=True)
        rows.append(row)
    with_chunks(None)
    if args.out:
        write(args.out, rows)


if __name__ == "__main__":
    main()
