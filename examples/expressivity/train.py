"""Train one model on one synthetic task under a step and wall-time budget; resumable.

    python examples/expressivity/train.py --task a5 --length 20 --mixer kla --layers 2 \
        --d-model 128 --time-budget 240 --out runs/a5-kla-L2.json --ckpt runs/a5-kla-L2.pt

The training set (``--n-train`` sequences, seed ``--seed``) and the evaluation set
(``--n-eval`` sequences, seed ``--seed + 1_000_003``) come from :mod:`kalmanscan.tasks` and live on
the device; batches are drawn by a seeded generator. AdamW, linear warm-up then cosine decay
over ``progress = max(step / steps, elapsed / time_total)``, gradient clipping. A non-finite
loss stops the run and is recorded (``diverged``). ``--ckpt`` is written every
``--ckpt-every`` seconds and at the end; when it exists the run resumes from it (model,
optimizer, step, elapsed time, history, generator state), so one run can span several calls.
Give the planned training time over all calls with ``--time-total`` so the schedule runs once
over the whole run; without it a resumed run plans ``elapsed + --time-budget`` seconds (a warm
restart of the cosine), never a schedule that has already ended.

The JSON written to ``--out`` holds the config, seed, steps, wall time, final accuracy over
target positions, per-position accuracy, the loss/accuracy history and, for KLA mixers, the
largest posterior precision seen on the evaluation set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import MIXERS, build_model  # noqa: E402

from kalmanscan.tasks import IGNORE, make_task  # noqa: E402

EVAL_SEED_OFFSET = 1_000_003


def task_params(args) -> dict:
    if args.task == "a5":
        return {"length": args.length}
    if args.task == "mqar":
        return {
            "length": args.length,
            "num_kv_pairs": args.num_kv_pairs,
            "vocab_size": args.vocab_size,
        }
    if args.task == "selective_copy":
        return {
            "length": args.length,
            "num_tokens_to_copy": args.num_tokens_to_copy,
            "vocab_size": args.vocab_size,
        }
    return {
        "length": args.length,
        "vocab_size": args.vocab_size,
        "k_motif_size": args.motif_size,
        "v_motif_size": args.motif_size,
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--task", required=True, choices=["a5", "mqar", "selective_copy", "fuzzy_recall"]
    )
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--num-kv-pairs", type=int, default=16)
    p.add_argument("--vocab-size", type=int, default=16)
    p.add_argument("--num-tokens-to-copy", type=int, default=16)
    p.add_argument("--motif-size", type=int, default=3)
    p.add_argument("--mixer", required=True, choices=MIXERS)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--d-state", type=int, default=16)
    p.add_argument("--expand", type=float, default=1.0)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--steps", type=int, default=100_000, help="planned (and maximum) total steps")
    p.add_argument("--time-budget", type=float, default=60.0, help="training seconds in this call")
    p.add_argument(
        "--time-total",
        type=float,
        default=None,
        help="planned training seconds over all calls (LR schedule); default time-budget, "
        "or on resume the elapsed training seconds plus time-budget",
    )
    p.add_argument(
        "--wall-limit",
        type=float,
        default=None,
        help="stop training this many seconds after the process started (startup included)",
    )
    p.add_argument("--eval-every", type=float, default=30.0, help="seconds between evaluations")
    p.add_argument(
        "--stop-acc", type=float, default=1.01, help="stop once eval accuracy reaches it"
    )
    p.add_argument("--n-train", type=int, default=12_800)
    p.add_argument("--n-eval", type=int, default=1_280)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", default="auto", help="kla_filter backend of the KLA layers")
    p.add_argument("--ckpt", default=None)
    p.add_argument("--ckpt-every", type=float, default=60.0)
    p.add_argument("--out", required=True)
    p.add_argument("--name", default=None)
    p.add_argument("--group", default=None)
    return p.parse_args(argv)


def lr_at(args, step: int, elapsed: float) -> float:
    warm = min(1.0, (step + 1) / max(1, args.warmup))
    progress = min(1.0, max(step / args.steps, elapsed / args.time_total))
    return args.lr * warm * 0.5 * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def evaluate(model, inputs, targets, batch):
    """Accuracy over target positions, per-position accuracy ``[L]`` (NaN where no target), loss."""
    model.eval()
    L = inputs.shape[1]
    correct = torch.zeros(L, dtype=torch.float64, device=inputs.device)
    count = torch.zeros(L, dtype=torch.float64, device=inputs.device)
    loss_sum = 0.0
    for i in range(0, inputs.shape[0], batch):
        x, y = inputs[i : i + batch], targets[i : i + batch]
        logits = model(x).float()
        mask = y != IGNORE
        loss_sum += F.cross_entropy(logits[mask], y[mask], reduction="sum").item()
        correct += ((logits.argmax(-1) == y) & mask).sum(0).double()
        count += mask.sum(0).double()
    model.train()
    per_pos = (correct / count).cpu()
    return {
        "accuracy": float(correct.sum() / count.sum()),
        "loss": loss_sum / float(count.sum()),
        "per_position": [None if math.isnan(a) else round(float(a), 5) for a in per_pos],
    }


@torch.no_grad()
def max_precision(model, inputs):
    """Largest posterior precision (and count of non-finite ones) per KLA block on ``inputs``."""
    blocks = [
        i
        for i, b in enumerate(model.blocks)
        if hasattr(b.mixer, "trace") and type(b.mixer).__name__ != "LinearRecurrenceLayer"
    ]
    if not blocks:
        return None
    trace = {i: [] for i in blocks}
    model.eval()
    model(inputs, trace=trace)
    model.train()
    out = []
    for i in blocks:
        lam = trace[i][0].precision
        out.append(
            {
                "block": i,
                "max": float(lam[torch.isfinite(lam)].max()) if torch.isfinite(lam).any() else None,
                "nonfinite": int((~torch.isfinite(lam)).sum()),
            }
        )
    return out


def main(argv=None):
    process_start = time.time()
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.set_num_threads(1)  # many runs share the CPU cores; the math is on the GPU
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    params = task_params(args)
    train = make_task(args.task, args.n_train, seed=args.seed, **params)
    test = make_task(args.task, args.n_eval, seed=args.seed + EVAL_SEED_OFFSET, **params)
    x_train, y_train = train.inputs.to(device), train.targets.to(device)
    x_test, y_test = test.inputs.to(device), test.targets.to(device)
    torch.manual_seed(args.seed)
    model = build_model(
        args.mixer,
        train.vocab_size,
        n_layers=args.layers,
        d_model=args.d_model,
        d_state=args.d_state,
        expand=args.expand,
        n_heads=args.heads,
        backend=args.backend,
    ).to(device)
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=args.lr,
        weight_decay=args.weight_decay,
    )
    gen = torch.Generator(device=device).manual_seed(args.seed)
    step, elapsed, history, diverged, error = 0, 0.0, [], False, None
    if args.ckpt and os.path.exists(args.ckpt):
        ck = torch.load(args.ckpt, map_location=device, weights_only=True)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed, history, diverged = ck["step"], ck["elapsed"], ck["history"], ck["diverged"]
        gen.set_state(
            ck["gen"].to(gen.get_state().device) if device.type == "cpu" else ck["gen"].cpu()
        )
        print(f"resumed from {args.ckpt} at step {step} ({elapsed:.1f} s)", flush=True)
    resumed_from_step = step
    if args.time_total is None:
        # a schedule planned for this call only: after a resume it would already be over (lr 0)
        args.time_total = elapsed + args.time_budget
    elif step > 0 and elapsed >= args.time_total:
        print(
            f"warning: --time-total {args.time_total} s is already used up ({elapsed:.1f} s "
            "trained): the learning rate is 0 in this call",
            flush=True,
        )

    def save():
        if args.ckpt:
            Path(args.ckpt).parent.mkdir(parents=True, exist_ok=True)
            tmp = args.ckpt + ".tmp"
            torch.save(
                {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "step": step,
                    "elapsed": elapsed,
                    "history": history,
                    "diverged": diverged,
                    "gen": gen.get_state(),
                    "args": vars(args),
                },
                tmp,
            )
            os.replace(tmp, args.ckpt)

    wall0 = time.time()
    start_elapsed = elapsed
    last_eval = last_ckpt = time.time()
    loss_acc, loss_n = 0.0, 0
    last = None
    wall_stop = math.inf if args.wall_limit is None else process_start + args.wall_limit
    while (
        step < args.steps
        and elapsed - start_elapsed < args.time_budget
        and not diverged
        and time.time() < wall_stop
    ):
        t0 = time.time()
        for group in opt.param_groups:
            group["lr"] = lr_at(args, step, elapsed)
        idx = torch.randint(0, x_train.shape[0], (args.batch,), generator=gen, device=device)
        x, y = x_train[idx], y_train[idx]
        try:
            logits = model(x).float()
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
        except torch.OutOfMemoryError as exc:  # recorded in the JSON, not silently retried
            error = f"OutOfMemoryError at step {step}: {str(exc)[:300]}"
            print(error, flush=True)
            break
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        step += 1
        if step % 25 == 0 or step == 1:
            lv, gv = loss.item(), gnorm.item()
            if not (math.isfinite(lv) and math.isfinite(gv)):
                diverged = True
            loss_acc += lv
            loss_n += 1
            history.append(
                {
                    "step": step,
                    "elapsed": round(elapsed + time.time() - t0, 2),
                    "loss": lv,
                    "grad_norm": gv,
                }
            )
        elapsed += time.time() - t0
        if time.time() - last_eval > args.eval_every and not diverged:
            last = evaluate(model, x_test, y_test, 4 * args.batch)
            history.append(
                {
                    "step": step,
                    "elapsed": round(elapsed, 2),
                    "eval_accuracy": last["accuracy"],
                    "eval_loss": last["loss"],
                }
            )
            print(
                f"step {step} {elapsed:.0f}s loss {loss.item():.4f} acc {last['accuracy']:.4f}",
                flush=True,
            )
            last_eval = time.time()
            if last["accuracy"] >= args.stop_acc:
                break
        if time.time() - last_ckpt > args.ckpt_every:
            save()
            last_ckpt = time.time()
    final = (
        evaluate(model, x_test, y_test, 4 * args.batch)
        if not diverged
        else {"accuracy": None, "loss": None, "per_position": None}
    )
    if diverged and last is not None:
        final["last_finite_accuracy"] = last["accuracy"]
    save()
    result = {
        "name": args.name or Path(args.out).stem,
        "group": args.group,
        "task": args.task,
        "task_params": params,
        "mixer": args.mixer,
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "ckpt")},
        "seed": args.seed,
        "steps": step,
        "resumed_from_step": resumed_from_step,
        "train_seconds": round(elapsed, 2),
        "wall_seconds_this_call": round(time.time() - wall0, 2),
        "diverged": diverged,
        "error": error,
        "final": final,
        "max_precision": None
        if diverged
        else max_precision(model, x_test[: min(256, x_test.shape[0])]),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "history": history,
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    acc = final["accuracy"]
    print(
        f"done {result['name']}: steps {step}, {elapsed:.1f} s, accuracy "
        f"{'diverged' if acc is None else f'{acc:.4f}'}",
        flush=True,
    )
    return result


if __name__ == "__main__":
    main()
