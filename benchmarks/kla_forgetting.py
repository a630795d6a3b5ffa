"""Whether the chunked KLA op could skip its map passes by forgetting: do two float32 runs of a
lane's filter from different starting states become bit-for-bit equal within a time chunk?

If they did, a chunk could be walked from a guessed start and corrected only up to the step
where the two runs meet (from there on the outputs are the same bits), instead of composing the
chunk's map first. This measures it on the KLA LM's own op inputs: the inputs of every layer's
op (``kla_filter``'s ``v, Lv, k`` and the layer's ``decay, process_var``), captured from one
forward pass of

- ``random``: ``benchmarks/lm_step.py``'s model (d_model 512, 6 layers, vocab 256) at its
  initial weights, on random bytes;
- ``bundled``: the bundled trained model (``kalmanscan.kla.io.load_checkpoint()``), on the bytes
  of this package's own Python source.

For each chunk after the first (chunks of ``--chunk`` steps), the lane's filter runs from the
true state entering the chunk and from the default start (precision 1, information 0), both in
float32 (the kernels' step: ``rden = 1 / (p lam + a^2)``, ``lam' = lam rden + Lv k^2``,
``eta' = a rden eta + v Lv k``), and the first step from which the two states stay equal is
recorded. A one-warp program of the forward kernel walks 8 channels x 16 slots: it could stop
its correction only where all 128 of its lanes have met, at a checkpoint (8 steps).

    python3 benchmarks/kla_forgetting.py --out benchmarks/results/kla-forgetting-cpu.json

(CPU, about 3 minutes a model at L = 8,192.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402


def capture(model, tokens):
    """Every ``kla_filter`` call's first six arguments during ``model(tokens)`` (eager glue)."""
    import kalmanscan.core.kla_op as ko

    got, orig = [], ko.kla_filter

    def spy(*args, **kw):
        got.append([t.detach().float().clone() for t in args[:6]])
        return orig(*args, **kw)

    for blk in model.blocks:
        blk.mixer.glue = "eager"
    ko.kla_filter = spy
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        ko.kla_filter = orig
    return got


def step(lam, eta, v, Lv, k, a, p):
    rden = 1.0 / (p * lam + a * a)
    lam = lam * rden + Lv[..., None] * (k[..., None, :] * k[..., None, :])
    eta = a * rden * eta + (v * Lv)[..., None] * k[..., None, :]
    return lam, eta


def meeting_steps(v, Lv, k, a, p, Lc):
    """``[C - 1, M, S]``: for chunks ``1 .. C-1``, the steps after which the runs from the true
    start and from the default start are equal for good (``Lc + 1``: not within the chunk)."""
    L = v.shape[0]
    C = L // Lc
    lam, eta = torch.ones_like(a), torch.zeros_like(a)
    starts = []
    for t in range(C * Lc):
        if t % Lc == 0:
            starts.append((lam, eta))
        lam, eta = step(lam, eta, v[t], Lv[t], k[t], a, p)
    tl_ = torch.stack([s[0] for s in starts[1:]])
    te = torch.stack([s[1] for s in starts[1:]])
    gl, ge = torch.ones_like(tl_), torch.zeros_like(te)
    met = torch.full(tl_.shape, Lc + 1, dtype=torch.int32)
    vv, LL, kk = (x[: C * Lc].reshape(C, Lc, -1)[1:] for x in (v, Lv, k))
    for t in range(Lc):
        tl_, te = step(tl_, te, vv[:, t], LL[:, t], kk[:, t], a, p)
        gl, ge = step(gl, ge, vv[:, t], LL[:, t], kk[:, t], a, p)
        eq = (tl_ == gl) & (te == ge)
        met[eq & (met > Lc)] = t + 1
        met[~eq] = Lc + 1
    return met


def model_and_tokens(which, L):
    from kalmanscan.kla import KLALanguageModel, ModelConfig
    from kalmanscan.kla.io import load_checkpoint

    torch.manual_seed(0)
    if which == "random":
        cfg = ModelConfig(vocab_size=256, d_model=512, n_layers=6, mixers="kla")
        return KLALanguageModel(cfg), torch.randint(0, 256, (1, L))
    root = os.path.join(os.path.dirname(__file__), "..", "kalmanscan")
    text = b""
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            if f.endswith(".py"):
                with open(os.path.join(d, f), "rb") as fh:
                    text += fh.read()
    if len(text) < L:
        raise SystemExit(f"--length: expected at most {len(text)} (the package's source bytes)")
    return load_checkpoint(), torch.tensor(list(text[:L]), dtype=torch.long)[None]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--models", default="random,bundled")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=512, help="steps a chunk (2 x 8,192: 512)")
    args = ap.parse_args(argv)
    if args.chunk < 8 or args.length < 2 * args.chunk:
        ap.error(f"--chunk: expected 8 <= chunk <= length / 2, got {args.chunk} "
                 f"(length {args.length})")  # fmt: skip
    rows, t0 = [], time.perf_counter()
    for which in args.models.split(","):
        if which not in ("random", "bundled"):
            ap.error(f"--models: expected random and/or bundled, got {which!r}")
        model, tokens = model_and_tokens(which, args.length)
        for layer, (v, Lv, k, _q, a, p) in enumerate(capture(model, tokens)):
            met = meeting_steps(v[0], Lv[0], k[0], a, p, args.chunk)
            Lc = args.chunk
            prog = met.view(met.shape[0], -1, 8 * a.shape[1]).amax(-1)  # 8 channels x S slots
            row = {
                "model": which, "layer": layer, "lanes": a.numel(), "chunks": met.shape[0] + 1,
                "lanes_not_met": float((met > Lc).float().mean()),
                "programs_not_met": float((prog > Lc).float().mean()),
                "lane_steps_to_meet_median": float(met.float().median()),
                "decay_min_median_max": [float(a.min()), float(a.median()), float(a.max())],
                "process_var_median": float(p.median()),
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"benchmark": "kla_forgetting", "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00",
              time.gmtime()), "device": "cpu (float32, torch)", "length": args.length,
              "chunk": args.chunk, "rows": rows, "wall_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    with open(args.out, "w") as f:
        f.write(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
