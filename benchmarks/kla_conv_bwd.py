"""The KLA layer's conv backward, first pass (``glue._glue_conv_gpre_kernel``), by launch blocks,
with ablations that show where its time goes (H200; CUDA only).

Each variant is launched 30 times back to back after 3 warm-ups at B x L x M = 8 x 2048 x 1024,
bfloat16 activations, K = 4; the mean time a launch from CUDA events:

- ``gpre(BT, BM, warps, NI)``: the kernel at ``glue.CONV_BWD_BLOCKS = (BT, BM, warps, NI)``;
- ``ablate(BT, BM, warps)-mode0``: its four tap loads and one float32 store alone;
  ``-mode1``: the gradient without the weight and bias sums; ``-mode2``: the same with
  ``tl.sigmoid``;
- ``conv_fwd(...)``, ``conv_gz``: the conv's forward and its backward's second pass;
- ``walk(TP, BM, warps, NS)``: the one-pass backward (``glue._glue_conv_walk_kernel`` at
  ``glue.CONV_WALK``: gz and the weights' sums, no float32 ``gpre``),
  against the two passes at the default blocks (``gpre+gz``), with its largest relative
  difference from them in ``gz``, ``gw`` and ``gb`` (``--walk``: only these rows).

    export PYTHONPATH=$PWD
    python benchmarks/kla_conv_bwd.py --out benchmarks/results/kla-conv-bwd-blocks-h200.json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from kalmanscan.cuda._common import cdiv
from kalmanscan.cuda.kla import glue
from kalmanscan.validation.run_meta import run_meta


@triton.jit
def _ablation_kernel(zg_ptr, w_ptr, b_ptr, g_ptr, g2_ptr, gp_ptr, L, M, ZS, K: tl.constexpr,
                     BT: tl.constexpr, BM: tl.constexpr, MODE: tl.constexpr):  # fmt: skip
    pid_t, pid_m, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = pid_t * BT + tl.arange(0, BT)
    m = pid_m * BM + tl.arange(0, BM)
    mmask = m < M
    rows = (b * L + t).to(tl.int64)
    inside = (t < L)[:, None] & mmask[None, :]
    pre = tl.zeros((BT, BM), tl.float32) + tl.load(b_ptr + m, mask=mmask, other=0.0)[None, :]
    for j in tl.static_range(K):
        w = tl.load(w_ptr + m * K + j, mask=mmask, other=0.0)
        ok = ((t + j - (K - 1)) >= 0) & (t < L)
        x = tl.load(zg_ptr + (rows + (j - (K - 1)))[:, None] * ZS + m[None, :],
                    mask=ok[:, None] & mmask[None, :], other=0.0)  # fmt: skip
        pre += w[None, :] * x.to(tl.float32)
    at = rows[:, None] * M + m[None, :]
    if MODE == 0:
        tl.store(gp_ptr + at, pre, mask=inside)
    else:
        g = tl.load(g_ptr + at, mask=inside, other=0.0).to(tl.float32)
        g += tl.load(g2_ptr + at, mask=inside, other=0.0).to(tl.float32)
        if MODE == 1:
            sg = 1.0 / (1.0 + tl.exp(-pre))
        else:
            sg = tl.sigmoid(pre)
        gp = tl.where(inside, g * sg * (1.0 + pre * (1.0 - sg)), 0.0)
        tl.store(gp_ptr + at, gp, mask=inside)


def _mean_ms(kernel, grid, args, kw, reps=30):
    """Mean ms a launch of ``kernel[grid](*args, **kw)``, ``reps`` back to back."""
    for _ in range(3):
        kernel[grid](*args, **kw)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        kernel[grid](*args, **kw)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON output path")
    ap.add_argument("--walk", action="store_true", help="only the one-pass rows")
    ap.add_argument("--shape", default="8x2048", help="B x L (M = 1024 channels, K = 4)")
    ap.add_argument("--walk-blocks", default=None,
                    help="JSON list of (TP, BM, warps, NS) for the one-pass rows")  # fmt: skip
    ap.add_argument("--fwd-blocks", default=None,
                    help="JSON list of (BT, BM, warps): only the conv forward's rows then")  # fmt: skip
    ap.add_argument("--fwd-walk-blocks", default="[]",
                    help="with --fwd-blocks, JSON list of (TP, BM, warps) of the forward's walk")  # fmt: skip
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("kla_conv_bwd.py: needs a CUDA device")
    B, L = (int(x) for x in args.shape.lower().split("x"))
    dev, M, K = "cuda", 1024, 4
    zg = torch.randn(B, L, 2 * M, device=dev, dtype=torch.bfloat16)
    w = torch.randn(M, 1, K, device=dev) * 0.3
    bias = torch.randn(M, device=dev) * 0.1
    g1 = torch.randn(B, L, M, device=dev, dtype=torch.bfloat16)
    g2 = torch.randn(B, L, M, device=dev, dtype=torch.bfloat16)
    gp = torch.empty(B, L, M, device=dev)
    zc = torch.empty(B, L, M, device=dev, dtype=torch.bfloat16)
    gzg = torch.empty(B, L, 2 * M, device=dev, dtype=torch.bfloat16)
    rows = []

    def record(name, ms, err=None):
        rows.append({"kernel": name, "mean_us": ms * 1e3, "max_rel_diff_vs_two_pass": err})
        print(f"{name:40s} {ms * 1e3:8.1f} us" + ("" if err is None else f"  diff {err:.1e}"),
              flush=True)  # fmt: skip

    if args.fwd_blocks:
        for BT, BM, nw in json.loads(args.fwd_blocks):
            record(f"conv_fwd{(BT, BM, nw)}", _mean_ms(
                glue._glue_conv_fwd_kernel, (cdiv(L, BT), cdiv(M, BM), B),
                (zg, w, bias, zc, L, M, 2 * M), dict(K=K, BT=BT, BM=BM, num_warps=nw)))  # fmt: skip
        ref = zc.float().clone()  # (the last tile launch's output)
        for TP, BM, nw in json.loads(args.fwd_walk_blocks):
            zw = torch.empty_like(zc)
            ms = _mean_ms(glue._glue_conv_fwd_walk_kernel, (cdiv(L, TP), cdiv(M, BM), B),
                          (zg, w, bias, zw, L, M, 2 * M), dict(K=K, TP=TP, BM=BM, num_warps=nw))  # fmt: skip
            record(f"conv_fwd_walk{(TP, BM, nw)}", ms,
                   float((zw.float() - ref).abs().max() / ref.abs().max()))  # fmt: skip
        _write(args.out, rows, B, L, M, K)
        return
    blocks = json.loads(args.walk_blocks) if args.walk_blocks else None
    walk_rows(zg, w, bias, g1, g2, gp, gzg, B, L, M, K, record, blocks)
    if args.walk:
        _write(args.out, rows, B, L, M, K)
        return
    for PT, PM, pw, NI in [(16, 64, 4, 8), (16, 64, 2, 8), (32, 128, 4, 1), (8, 256, 4, 8),
                           (4, 256, 2, 16)]:  # fmt: skip
        NP = cdiv(L, PT * NI)
        gw = torch.empty(B * NP, K, M, device=dev)
        gb = torch.empty(B * NP, M, device=dev)
        record(f"gpre{(PT, PM, pw, NI)}", _mean_ms(
            glue._glue_conv_gpre_kernel, (NP, cdiv(M, PM), B),
            (zg, w, bias, g1, g2, gp, gw, gb, L, M, 2 * M, NP),
            dict(K=K, KP=4, BT=PT, BM=PM, NI=NI, num_warps=pw)))  # fmt: skip
    for BT, BM, nw in [(32, 128, 4), (16, 256, 4), (8, 512, 4)]:
        grid = (cdiv(L, BT), cdiv(M, BM), B)
        for mode in (0, 1, 2):
            record(f"ablate{(BT, BM, nw)}-mode{mode}", _mean_ms(
                _ablation_kernel, grid, (zg, w, bias, g1, g2, gp, L, M, 2 * M),
                dict(K=K, BT=BT, BM=BM, MODE=mode, num_warps=nw)))  # fmt: skip
        record(f"conv_fwd{(BT, BM, nw)}", _mean_ms(
            glue._glue_conv_fwd_kernel, grid, (zg, w, bias, zc, L, M, 2 * M),
            dict(K=K, BT=BT, BM=BM, num_warps=nw)))  # fmt: skip
    record("conv_gz", _mean_ms(
        glue._glue_conv_gz_kernel, (cdiv(L, 32), cdiv(M, 128), B), (gp, w, gzg, L, M, 2 * M),
        dict(K=K, BT=32, BM=128, num_warps=4)))  # fmt: skip
    _write(args.out, rows, B, L, M, K)


def _write(out, rows, B, L, M, K):
    if out:
        meta = run_meta(True)
        with open(out, "w") as f:
            json.dump({**meta, "shapes": {"B": B, "L": L, "M": M, "K": K, "dtype": "bfloat16"},
                       "rows": rows}, f, indent=1)  # fmt: skip


def walk_rows(zg, w, bias, g1, g2, gp, gzg, B, L, M, K, record, blocks=None):
    """The two passes at the default blocks, then the one-pass kernel at several blocks
    (``blocks``, else a fixed list), each checked against the two passes' gz, gw, gb."""
    PT, PM, pw, NI = glue.CONV_BWD_BLOCKS
    NP = cdiv(L, PT * NI)
    gw = torch.empty(B * NP, K, M, device=zg.device)
    gb = torch.empty(B * NP, M, device=zg.device)
    gpre = (glue._glue_conv_gpre_kernel, (NP, cdiv(M, PM), B),
            (zg, w, bias, g1, g2, gp, gw, gb, L, M, 2 * M, NP),
            dict(K=K, KP=4, BT=PT, BM=PM, NI=NI, num_warps=pw))  # fmt: skip
    gz = (glue._glue_conv_gz_kernel, (cdiv(L, 32), cdiv(M, 128), B), (gp, w, gzg, L, M, 2 * M),
          dict(K=K, BT=32, BM=128, num_warps=4))  # fmt: skip
    two = _mean_ms(*gpre) + _mean_ms(*gz)
    record("gpre+gz", two)
    ref = (gzg[..., :M].float().clone(), gw.sum(0), gb.sum(0))
    for TP, BM, nw, ns in blocks or [
        (64, 128, 1, 3), (64, 128, 1, 1), (64, 128, 1, 4), (64, 128, 1, 6), (32, 128, 1, 3),
        (32, 128, 1, 4), (128, 128, 1, 4), (64, 64, 1, 4), (64, 256, 2, 3), (64, 256, 2, 4),
        (64, 512, 4, 3), (128, 256, 2, 4)]:  # fmt: skip
        NPw = cdiv(L, TP)
        gww = torch.empty(B * NPw, K, M, device=zg.device)
        gbw = torch.empty(B * NPw, M, device=zg.device)
        gzw = torch.zeros_like(gzg)
        ms = _mean_ms(glue._glue_conv_walk_kernel, (NPw, cdiv(M, BM), B),
                      (zg, w, bias, g1, g2, gzw, gww, gbw, L, M, 2 * M, NPw),
                      dict(K=K, TP=TP, BM=BM, NS=ns, num_warps=nw))  # fmt: skip
        got = (gzw[..., :M].float(), gww.sum(0), gbw.sum(0))
        errs = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, ref, strict=True)]
        record(f"walk{(TP, BM, nw, ns)}", ms, max(errs))
        print(f"    gz, gw, gb: {errs[0]:.1e} {errs[1]:.1e} {errs[2]:.1e}", flush=True)


if __name__ == "__main__":
    main()
