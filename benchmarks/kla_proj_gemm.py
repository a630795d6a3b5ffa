"""The KLA mixer's sensor projection as one GEMM against two: does the odd output width
(``2 M + 2 S = 2,080`` at d_model 512) cost the GEMMs a tile's worth of waste?

The layer's ``sensor_proj`` maps ``zc [T, M]`` to ``[T, 2 M + 2 S]`` (``v, log var_v`` of every
channel, then ``k, q``). Timed in bf16 (the LM step's autocast), forward and backward through
autograd from the float32 weight as the layer holds it, ``T`` tokens:

- ``one``: ``F.linear(zc, W)`` (what the layer runs);
- ``split``: ``F.linear(zc, W[:2M])`` and ``F.linear(zc, W[2M:])``, the two outputs' gradients
  given separately (the weight's gradient assembled by autograd from its two slices).

Also each GEMM of the three (forward, input gradient, weight gradient) alone, by
``torch.matmul`` on bf16 tensors. The variants alternate in one process; median of ``--reps``
CUDA-event timings. Correctness: the split's outputs and gradients against the one GEMM's
(normwise relative). JSON to ``--out``.

    python3 benchmarks/kla_proj_gemm.py --out benchmarks/results/kla-proj-gemm-h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from lm_step import timed  # noqa: E402

from kalmanscan.validation.run_meta import run_meta  # noqa: E402


def cuda_ms(fn, reps):
    """``reps`` CUDA-event times of ``fn()`` (``lm_step.timed``'s, the GPU time of a call)."""
    dev = torch.device("cuda")
    return [timed(lambda _: fn(), None, dev)[0] for _ in range(reps)]


def measure(T, W, M, S, N, reps, dev):
    """One row: the two ways' errors and times at ``T`` tokens."""
    zc = torch.randn(T, M, device=dev, dtype=torch.bfloat16, requires_grad=True)
    gs = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
    ga, gb = gs[:, : 2 * M].contiguous(), gs[:, 2 * M :].contiguous()

    def one():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            s = F.linear(zc, W)
        s.backward(gs)

    def split():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            sa = F.linear(zc, W[: 2 * M])
            sb = F.linear(zc, W[2 * M :])
        torch.autograd.backward((sa, sb), (ga, gb))

    # correctness: outputs and gradients of the two ways
    W.grad = zc.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        s1 = F.linear(zc, W)
        s2 = torch.cat((F.linear(zc, W[: 2 * M]), F.linear(zc, W[2 * M :])), dim=-1)
    out_err = float((s1.float() - s2.float()).norm() / s1.float().norm())
    one()
    gW1, gz1 = W.grad.clone(), zc.grad.clone()
    W.grad = zc.grad = None
    split()
    gW_err = float((W.grad - gW1).norm() / gW1.norm())
    gz_err = float((zc.grad.float() - gz1.float()).norm() / gz1.float().norm())
    Wb = W.detach().to(torch.bfloat16)
    Wa, Wc = Wb[: 2 * M].contiguous(), Wb[2 * M :].contiguous()
    zd = zc.detach()
    gemms = {
        "fwd_one": lambda: zd @ Wb.t(),
        "fwd_split": lambda: (zd @ Wa.t(), zd @ Wc.t()),
        "dgrad_one": lambda: gs @ Wb,
        "dgrad_split": lambda: torch.addmm(ga @ Wa, gb, Wc),
        "wgrad_one": lambda: gs.t() @ zd,
        "wgrad_split": lambda: (ga.t() @ zd, gb.t() @ zd),
        "autograd_one": one,
        "autograd_split": split,
    }
    for fn in gemms.values():  # warm-up (and cuBLAS's heuristics' first calls)
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    times = {k: [] for k in gemms}
    for _ in range(3):  # alternate the variants in rounds
        for k, fn in gemms.items():
            W.grad = zc.grad = None
            times[k] += cuda_ms(fn, reps // 3)
    row = dict(tokens=T, out_rel_err=out_err, gW_rel_err=gW_err, gz_rel_err=gz_err,
               median_ms={k: round(statistics.median(v), 4) for k, v in times.items()})  # fmt: skip
    flops = 2.0 * T * M * N
    row["tflops_one"] = {k: round(flops / (row["median_ms"][k + "_one"] * 1e9), 1)
                         for k in ("fwd", "dgrad", "wgrad")}  # fmt: skip
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="16384,32768")
    ap.add_argument("--M", type=int, default=1024)
    ap.add_argument("--S", type=int, default=16)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    dev = torch.device("cuda")
    M, S = args.M, args.S
    N = 2 * M + 2 * S
    torch.manual_seed(0)
    W = (torch.randn(N, M, device=dev) * 0.02).requires_grad_(True)
    res = dict(benchmark="kla_proj_gemm", **run_meta(True), torch=torch.__version__, M=M, S=S,
               N=N, rows=[])  # fmt: skip
    for T in (int(t) for t in args.tokens.split(",")):
        row = measure(T, W, M, S, N, args.reps, dev)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
