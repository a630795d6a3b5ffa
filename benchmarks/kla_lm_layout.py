"""The KLA LM training step at forced time-chunk counts and slots a thread: which layout of the
op's kernels gives the fewest kernel milliseconds a step at few long sequences.

``benchmarks/lm_step.py``'s KLA model (d_model 512, 6 layers, vocab 256, bf16 autocast, fused
AdamW) at each ``--shapes`` entry, once per configuration ``C / fwd_slots / bwd_slots``:
``tuning.CHUNKS = C`` (a divisor of ``L``; 0 leaves the rule's count) and the forward's and the
backward's slots a thread (``tuning.TUNING``; 0 leaves the default). The time-chunk rule aims
for ``tuning.LANES_PER_SM`` lanes x chunks an SM at the default slots; fewer slots a thread give
the same number of warps with fewer chunks, and the map passes walk ``(C - 1) / C`` of the
steps, so fewer chunks cost fewer map steps.

Correctness, before any time is kept: every configuration's loss and gradients on the shape's
initial weights (one forward + backward, no optimizer step) against the default
configuration's (normwise relative; both bf16 steps, so only the op's float32 rounding and its
bf16 consequences separate them). The default runs twice: its second run's difference from the
first is the floor (bf16 rounding turns the op's atomic sums' order into about 1 % normwise). Time: the median of ``--repeats`` CUDA-event step times
after warm-up, and one profiled step's kernel time by category and by KLA kernel.

    export PYTHONPATH=$PWD
    python3 benchmarks/kla_lm_layout.py --out benchmarks/results/kla-lm-layout-h200.json
    python3 benchmarks/kla_lm_layout.py --dry-run --out /tmp/x.json   # CPU, tiny, interpreter
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

DEFAULT_CONFIGS = {
    "2x8192": "0/0/0,0/0/0,2/1/1,4/1/1,4/2/2,8/2/2,1/1/1,8/1/1,2/2/2,16/2/2,4/4/4,8/4/4",
    "1x32768": "0/0/0,0/0/0,4/1/1,8/1/1,8/2/2,16/1/1,16/2/2,2/1/1,4/2/2,16/4/4,32/2/2",
    "8x2048": "0/0/0,1/2/2,2/1/1,2/2/2",
}
KLA_KERNELS = ("_kla_fwd_kernel", "_kla_bwd_kernel", "_chunk_maps_kernel",
               "_adjoint_maps_kernel", "_carry_kernel", "_adjoint_carry_kernel")  # fmt: skip


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON output path (rewritten after each row)")
    ap.add_argument("--shapes", default="2x8192,1x32768")
    ap.add_argument("--configs", default=None,
                    help="C/fwd_slots/bwd_slots entries, comma-separated, for every shape "
                         "(default: DEFAULT_CONFIGS by shape; 0 = the default's choice)")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--grad-tol",
        type=float,
        default=0.05,
        help="gradients against the default configuration's, normwise relative",
    )
    ap.add_argument("--budget-s", type=float, default=520.0,
                    help="no configuration starts after this many seconds")  # fmt: skip
    ap.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny")
    return ap.parse_args(argv)


def configs_of(text):
    out = []
    for item in text.split(","):
        parts = item.strip().split("/")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise SystemExit(f"--configs: expected C/fwd_slots/bwd_slots, got {item!r}")
        out.append(tuple(int(p) for p in parts))
    return out


def main(argv=None):
    args = parse(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from lm_step import Stepper, flat_grads, loss_of, profile_split, sync, timed

    from kalmanscan.cuda.kla import tuning
    from kalmanscan.kla import KLALanguageModel, ModelConfig
    from kalmanscan.validation.run_meta import run_meta

    device = torch.device("cpu" if args.dry_run else "cuda")
    d_model, layers = (32, 2) if args.dry_run else (512, 6)
    shapes = "1x16" if args.dry_run else args.shapes
    if args.dry_run:  # (the interpreter takes seconds a step: one timed step, no warm-up)
        args.repeats, args.warmup = 1, 0
    torch.manual_seed(0)
    model = KLALanguageModel(ModelConfig(vocab_size=256, d_model=d_model, n_layers=layers,
                                         mixers="kla")).to(device)  # fmt: skip
    if args.dry_run:  # the Triton op and glue on the CPU, through the interpreter
        from kalmanscan.core import kla_op

        kla_op._resolve = lambda backend, device: backend
        for blk in model.blocks:
            blk.mixer.glue = "fused"
            blk.mixer.config = dataclasses.replace(blk.mixer.config, backend="triton")
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    out = dict(benchmark="kla_lm_layout", **run_meta(device.type == "cuda"),
               torch=torch.__version__, dry_run=args.dry_run, d_model=d_model, n_layers=layers,
               rows=[])  # fmt: skip
    t_start = time.time()
    saved = dict(tuning.TUNING), tuning.CHUNKS
    for shape in shapes.split(","):
        B, L = (int(x) for x in shape.split("x"))
        text = args.configs or DEFAULT_CONFIGS.get(shape, "0/0/0")
        if args.dry_run:
            text = "0/0/0,2/1/1"
        g = torch.Generator(device="cpu").manual_seed(L)
        tokens = torch.randint(0, 256, (B, L + 1), generator=g).to(device)
        gref = None
        for C, fs, bs in configs_of(text):
            if time.time() - t_start > args.budget_s:
                out["stopped"] = f"budget of {args.budget_s} s reached before {shape} {C}/{fs}/{bs}"
                break
            if C and L % C:
                continue
            tuning.TUNING.clear()
            tuning.TUNING.update(saved[0])
            if fs:
                tuning.TUNING["fwd_slots"] = fs
            if bs:
                tuning.TUNING["bwd_slots"] = bs
            tuning.CHUNKS = C or None
            lanes = B * model.blocks[0].mixer.d_inner * model.blocks[0].mixer.d_state
            sms = tuning.sm_count(device) or 132
            Cr = C or tuning.chunks_for(lanes, L, sms)
            row = dict(B=B, L=L, C=Cr, C_forced=bool(C), fwd_slots=fs or saved[0]["fwd_slots"],
                       bwd_slots=bs or tuning.tuning_for(lanes * Cr)["bwd_slots"])  # fmt: skip
            t0 = time.time()
            try:
                model.load_state_dict(initial)
                model.zero_grad(set_to_none=True)
                loss = loss_of(model, tokens, not args.dry_run, device)
                loss.backward()
                grads = flat_grads(model)
                model.zero_grad(set_to_none=True)
                row["loss"] = float(loss.detach())
                if gref is None:
                    gref, lref = grads, row["loss"]
                row["grad_rel_vs_default"] = float((grads - gref).norm() / gref.norm())
                row["loss_rel_vs_default"] = abs(row["loss"] - lref) / abs(lref)
                del grads
                row["ok"] = row["grad_rel_vs_default"] <= args.grad_tol
                row["first_call_s"] = round(time.time() - t0, 1)
                if row["ok"]:
                    stepper = Stepper(model, device, autocast=not args.dry_run)
                    for _ in range(args.warmup):
                        stepper(tokens)
                    sync(device)
                    ms = [timed(stepper, tokens, device)[0] for _ in range(args.repeats)]
                    row["gpu_ms"] = round(statistics.median(ms), 3)
                    row["gpu_ms_all"] = [round(x, 3) for x in ms]
                    split, top = profile_split(stepper, tokens, device)
                    row["profile_ms"] = split
                    row["kla_kernels_ms"] = {t["name"]: t["ms"] for t in top
                                             if t["name"] in KLA_KERNELS}  # fmt: skip
                    del stepper
            except Exception as err:  # noqa: BLE001  (recorded; the sweep goes on)
                row["ok"] = False
                row["error"] = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"
            if device.type == "cuda":
                torch.cuda.empty_cache()
            out["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("profile_ms",)}),
                  flush=True)  # fmt: skip
            out["wall_s"] = round(time.time() - t_start, 1)
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
    tuning.TUNING.clear()
    tuning.TUNING.update(saved[0])
    tuning.CHUNKS = saved[1]


if __name__ == "__main__":
    main()
