"""The KLA layer's fused glue kernels (``kalmanscan/cuda/kla/glue.py``, kernels in
``glue_conv.py`` and ``glue_pointwise.py``) by launch blocks, with the bandwidth each reaches
(H200; CUDA only).

At B x L x M = 8 x 2048 x 1024, S = 16, bfloat16 activations (the LM step's 8 x 2,048 shape,
d_model 512), each of the conv's forward, the sensors' forward and backward and the gate's
forward and backward (without the variance, as the training step runs them) is launched 30
times back to back after 3 warm-ups at each ``(BT, BM, num_warps)`` of ``BLOCKS``: the mean time
a launch from CUDA events, the bytes it must move (inputs read once, outputs written once) over
that time, and the largest difference of its outputs from those at ``glue.GPU_BLOCKS`` (0: the
kernels are elementwise in tokens and channels, so blocks change no value; the gate backward's
skip gradient is a sum whose order they change).

    export PYTHONPATH=$PWD
    python benchmarks/kla_glue_blocks.py --out benchmarks/results/kla-glue-blocks-h200.json

``--dry-run``: the same on the CPU under ``TRITON_INTERPRET=1`` at 2 x 32 x 64 (checks the
script, times nothing meaningful).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton's first import

import torch

from kalmanscan.cuda._common import cdiv, next_pow2
from kalmanscan.cuda.kla import glue
from kalmanscan.validation.run_meta import run_meta

BLOCKS = [(32, 128, 4), (16, 256, 4), (64, 128, 8), (32, 256, 8), (64, 64, 4), (128, 64, 8),
          (16, 128, 2), (8, 256, 2), (32, 64, 2), (64, 256, 8)]  # fmt: skip


def _mean_ms(kernel, grid, args, kw, reps=30):
    """Mean ms a launch (``kla_conv_bwd._mean_ms``); under ``--dry-run`` one interpreted
    launch's wall time."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        kernel[grid](*args, **kw)
        return (time.perf_counter() - t0) * 1e3
    from benchmarks.kla_conv_bwd import _mean_ms as mean_ms

    return mean_ms(kernel, grid, args, kw, reps)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON output path")
    ap.add_argument("--dry-run", action="store_true", help="CPU, interpreted, tiny sizes")
    args = ap.parse_args(argv)
    blocks = BLOCKS
    if args.dry_run:
        dev, B, L, M, S, K = "cpu", 2, 32, 64, 16, 4
        blocks = [(16, 16, 1), (8, 32, 1)]
    elif not torch.cuda.is_available():
        raise SystemExit("kla_glue_blocks.py: needs a CUDA device (or --dry-run)")
    else:
        dev, B, L, M, S, K = "cuda", 8, 2048, 1024, 16, 4
    bf, f32 = torch.bfloat16, torch.float32
    N, SS = B * L, 2 * M + 2 * S
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, dtype=bf):
        return torch.randn(*shape, device=dev, dtype=f32, generator=g).to(dtype)

    zg, s = rnd(B, L, 2 * M), rnd(B, L, SS)
    w, bias = rnd(M, 1, K, dtype=f32) * 0.3, rnd(M, dtype=f32) * 0.1
    zc, y, gout = rnd(B, L, M), rnd(B, L, M, dtype=f32), rnd(B, L, M)
    gv, gLv = rnd(B, L, M, dtype=f32), rnd(B, L, M, dtype=f32)
    gk, gq = rnd(B, L, S, dtype=f32), rnd(B, L, S, dtype=f32)
    skip = torch.tensor(0.5, device=dev)
    BS = next_pow2(S)
    e2 = 2  # bytes of a bfloat16
    cases = {
        # name: (kernel, grid(BT, BM), args(outputs), kw, outputs, bytes)
        "conv_fwd": (
            glue._glue_conv_fwd_kernel,
            lambda BT, BM: (cdiv(L, BT), cdiv(M, BM), B),
            lambda o: (zg, w, bias, o[0], L, M, 2 * M),
            dict(K=K),
            lambda: [torch.empty(B, L, M, device=dev, dtype=bf)],
            2 * N * M * e2,
            ("BT", "BM"),
        ),
        "sensors_fwd": (
            glue._glue_sensors_fwd_kernel,
            lambda BT, BM: (cdiv(N, BT), cdiv(M, BM) + 1),
            lambda o: (s, *o, N, M, S, SS, 1e-4, 1e-12),
            dict(QK_NORM=True, BS=BS),
            lambda: [
                torch.empty(B, L, M, device=dev),
                torch.empty(B, L, M, device=dev),
                torch.empty(B, L, S, device=dev),
                torch.empty(B, L, S, device=dev),
            ],
            N * SS * e2 + 2 * N * M * 4 + 2 * N * S * 4,
            ("BN", "BM"),
        ),
        "sensors_bwd": (
            glue._glue_sensors_bwd_kernel,
            lambda BT, BM: (cdiv(N, BT), cdiv(M, BM) + 1),
            lambda o: (s, gv, gLv, gk, gq, o[0], N, M, S, SS, 1e-4, 1e-12),
            dict(QK_NORM=True, BS=BS),
            lambda: [torch.empty(B, L, SS, device=dev, dtype=bf)],
            N * (M + 2 * S) * e2 + 2 * N * M * 4 + 2 * N * S * 4 + N * SS * e2,
            ("BN", "BM"),
        ),
        "gate_fwd": (
            glue._glue_gate_fwd_kernel,
            lambda BT, BM: (cdiv(N, BT), cdiv(M, BM)),
            lambda o: (y, y, zg, zc, skip, o[0], o[0], N, M, 2 * M),
            dict(ACT=glue.ACTIVATIONS["silu"], HAS_VAR=False),
            lambda: [torch.empty(B, L, M, device=dev, dtype=bf)],
            N * M * (4 + 3 * e2),
            ("BN", "BM"),
        ),
        "gate_bwd": (
            glue._glue_gate_bwd_kernel,
            lambda BT, BM: (cdiv(N, BT), cdiv(M, BM)),
            lambda o: (gout, gout, y, y, zg, zc, skip, o[0], o[0], o[1], o[2], o[3], N, M, 2 * M),
            dict(ACT=glue.ACTIVATIONS["silu"], HAS_VAR=False),
            None,
            N * M * (3 * e2 + 4) + N * M * (4 + 2 * e2),
            ("BN", "BM"),
        ),
    }
    rows = []
    for name, (kern, grid, argf, kw, outs, nbytes, names) in cases.items():
        ref = None
        for BT, BM, nw in blocks:
            if outs is None:  # gate_bwd: gy, gzg, gzc, gskip partials (their count by blocks)
                nb = cdiv(N, BT) * cdiv(M, BM)
                o = [torch.empty(B, L, M, device=dev), torch.empty(B, L, 2 * M, device=dev,
                     dtype=bf), torch.empty(B, L, M, device=dev, dtype=bf),
                     torch.empty(nb, device=dev)]  # fmt: skip
            else:
                o = outs()
            ms = _mean_ms(kern, grid(BT, BM), argf(o), dict(kw, **{names[0]: BT,
                          names[1]: BM}, num_warps=nw))  # fmt: skip
            vals = [x.float() for x in o]
            if name == "gate_bwd":
                vals = vals[:2] + [vals[2], vals[3].sum().reshape(1)]
                vals[1] = vals[1][..., M:]  # the gate half is this kernel's
            if ref is None:
                ref, diff = vals, 0.0
            else:
                diff = max(float((a - b).abs().max()) for a, b in zip(vals, ref, strict=True))
            row = {"kernel": name, "blocks": [BT, BM, nw], "mean_us": round(ms * 1e3, 2),
                   "tb_per_s": round(nbytes / (ms * 1e-3) / 1e12, 2),
                   "max_abs_diff_vs_default": diff}  # fmt: skip
            rows.append(row)
            print(f"{name:12s} {str((BT, BM, nw)):16s} {ms * 1e3:8.1f} us "
                  f"{row['tb_per_s']:5.2f} TB/s diff {diff:.1e}", flush=True)  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**run_meta(True), "shapes": {"B": B, "L": L, "M": M, "S": S, "K": K,
                       "dtype": "bfloat16"}, "default": list(blocks[0]),
                       "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
