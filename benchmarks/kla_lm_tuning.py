"""The KLA op's tuning entries (``kalmanscan.cuda.kla.tuning.TUNING``) inside the KLA LM's
training step: which pipeline depths and L2 prefetch distance give the fewest op milliseconds.
A variant may also set ``CHUNKS`` (``tuning.CHUNKS``: the time-chunk count, a divisor of L) and
the chunked op's map-kernel launches, ``maps.<k>`` and ``tangent.<k>`` for ``k`` in ``slots``,
``unroll``, ``NS``, ``pf``, ``db``, ``maxnreg`` (``chunked.MAPS_LAUNCH``,
``chunked.TANGENT_LAUNCH``), ``glue.CONV_WALK`` and ``glue.CONV_FWD_WALK`` (the conv backward's
and forward's blocks, lists; the forward's ``null``: its tile kernel) and ``chunked.CARRY_NS``
(the carries' pipeline stages).

``benchmarks/lm_step.py``'s KLA model (d_model 512, 6 layers, vocab 256, bf16 autocast) at one
``--shape``; for each variant (a JSON list of ``TUNING`` overrides, ``{}`` the defaults) one
forward + backward (no optimizer step, so the weights stay as they are), then two warm-up
steps and three profiled ones: the op's kernel time (``profile_ms["kla_op"]``), its forward and
backward kernels and its two chunk-map kernels (0 where the op is not chunked), the fused
glue's kernels and all the step's kernels. All variants
run in turn, then all again (``--rounds``), in one process, so that they share the machine's
state; the JSON keeps every sample and their medians.

Correctness: each variant's loss and gradients against the first variant's first run
(normwise relative; pipeline depths, prefetch and unrolled steps change no arithmetic, so only
the order of the op's float32 atomic sums, turned into about 0.6 % by the bf16 step, separates
them; another chunk count or slots a thread reorder float32 sums too, about 1 %).

    export PYTHONPATH=$PWD
    python3 benchmarks/kla_lm_tuning.py --out benchmarks/results/kla-lm-tuning-h200.json
    python3 benchmarks/kla_lm_tuning.py --dry-run --out /tmp/x.json   # CPU, tiny, torch op
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import lm_step as LS  # noqa: E402
import torch  # noqa: E402

from kalmanscan.cuda.kla import chunked, glue, tuning  # noqa: E402

VARIANTS = ('[{}, {"bwd_l2_ahead": 0}, {"bwd_l2_ahead": 32}, {"bwd_l2_ahead": 64}, '
            '{"bwd_NS": 2}, {"bwd_NS": 4}, {"NS": 3}, {"NS": 4}, {"NS": 5}, {"NS": 6}]')  # fmt: skip


LAUNCH_KEYS = tuple(f"{d}.{k}" for d in ("maps", "tangent")
                    for k in ("slots", "unroll", "NS", "pf", "db", "maxnreg"))  # fmt: skip
# module constants a variant may set: the fused glue's conv backward and forward blocks (lists,
# kept as tuples; the forward's null: its tile kernel) and the chunked op's carries' stages
MODULE_KEYS = {"glue.CONV_WALK": glue, "glue.CONV_FWD_WALK": glue, "chunked.CARRY_NS": chunked}
KEYS = sorted(tuning.TUNING) + ["CHUNKS", *LAUNCH_KEYS, *MODULE_KEYS]
KERNELS = (("fwd_ms", "_kla_fwd_kernel"), ("bwd_ms", "_kla_bwd_kernel"),
           ("maps_ms", "_chunk_maps_kernel"), ("tangent_ms", "_adjoint_maps_kernel"))  # fmt: skip


def _saved():
    """The settings a variant may change, as they are now."""
    return (dict(tuning.TUNING), tuning.CHUNKS, dict(chunked.MAPS_LAUNCH),
            dict(chunked.TANGENT_LAUNCH),
            {k: getattr(mod, k.split(".")[1]) for k, mod in MODULE_KEYS.items()})  # fmt: skip


def _restore(saved):
    tuning.TUNING.clear()
    tuning.TUNING.update(saved[0])
    tuning.CHUNKS = saved[1]
    chunked.MAPS_LAUNCH, chunked.TANGENT_LAUNCH = dict(saved[2]), dict(saved[3])
    for key, value in saved[4].items():
        setattr(MODULE_KEYS[key], key.split(".")[1], value)


def apply_variant(variant, saved):
    """The settings of ``saved`` (``_saved()``) with ``variant``'s overrides."""
    _restore(saved)
    for key, value in variant.items():
        if key == "CHUNKS":
            tuning.CHUNKS = value
        elif key in MODULE_KEYS:  # (a JSON list is kept as a tuple)
            setattr(MODULE_KEYS[key], key.split(".")[1],
                    tuple(value) if isinstance(value, list) else value)  # fmt: skip
        elif key in LAUNCH_KEYS:
            which, entry = key.split(".")
            (chunked.MAPS_LAUNCH if which == "maps" else chunked.TANGENT_LAUNCH)[entry] = value
        else:
            tuning.TUNING[key] = value


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--shape", default="8x2048", help="BxL")
    ap.add_argument("--variants", default=VARIANTS, help="JSON list of TUNING overrides")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profiles", type=int, default=3, help="profiled steps a variant a round")
    ap.add_argument("--dry-run", action="store_true", help="tiny model on the CPU (the script)")
    args = ap.parse_args(argv)
    try:
        variants = json.loads(args.variants)
    except json.JSONDecodeError as e:
        ap.error(f"--variants: expected a JSON list of objects, got {args.variants!r} ({e})")
    if not (isinstance(variants, list) and variants and all(isinstance(v, dict) for v in variants)):
        ap.error(f"--variants: expected a non-empty JSON list of objects, got {args.variants!r}")
    unknown = sorted({k for v in variants for k in v} - set(KEYS))
    if unknown:
        ap.error(f"--variants: expected keys among {KEYS}, got {unknown}")
    try:
        B, L = (int(n) for n in args.shape.lower().split("x"))
    except ValueError:
        ap.error(f"--shape: expected BxL such as 8x2048, got {args.shape!r}")
    return args, variants, B, L


def main(argv=None):
    args, variants, B, L = parse_args(argv)
    cuda = not args.dry_run
    if cuda and not torch.cuda.is_available():
        sys.exit("kla_lm_tuning.py: needs a CUDA device (or --dry-run)")
    dev = torch.device("cuda" if cuda else "cpu")
    if args.dry_run:
        B, L = 2, 16
    model = LS.make_models(512 if cuda else 32, 6 if cuda else 1, 256, dev, 0)["kla"]
    g = torch.Generator(device=dev).manual_seed(1)
    tokens = torch.randint(0, 256, (B, L + 1), device=dev, generator=g)

    def step(_tokens=None):
        model.zero_grad(set_to_none=True)
        loss = LS.loss_of(model, tokens, cuda, dev)
        loss.backward()
        return loss

    base = _saved()
    rows = [{"variant": v, "op_ms": [], "glue_ms": [], "total_ms": [],
             **{k: [] for k, _ in KERNELS}} for v in variants]  # fmt: skip
    ref = None
    t0 = time.perf_counter()
    try:
        for rnd in range(args.rounds):
            for row in rows:
                apply_variant(row["variant"], base)
                loss = float(step().detach())
                LS.sync(dev)
                gr = LS.flat_grads(model)
                if ref is None:
                    ref = (loss, gr)
                row["loss_rel_diff"] = abs(loss - ref[0]) / abs(ref[0])
                row["grad_rel_diff"] = float((gr - ref[1]).norm() / ref[1].norm())
                for _ in range(2):
                    step()
                for _ in range(args.profiles):
                    split, top = LS.profile_split(step, tokens, dev)
                    row["op_ms"].append(split["kla_op"])
                    row["glue_ms"].append(split["glue_fused"])
                    row["total_ms"].append(split["total"])
                    for key, name in KERNELS:
                        row[key].append(sum(t["ms"] for t in top if t["name"] == name))
                print(f"round {rnd} {json.dumps(row['variant'])}: op {row['op_ms'][-1]:.3f} ms, "
                      f"backward {row['bwd_ms'][-1]:.3f}, forward {row['fwd_ms'][-1]:.3f}, maps "
                      f"{row['maps_ms'][-1]:.3f}, tangent maps {row['tangent_ms'][-1]:.3f} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    finally:
        _restore(base)
    for row in rows:
        for key in ("op_ms", "glue_ms", "total_ms", *(k for k, _ in KERNELS)):
            row[key.replace("_ms", "_median_ms")] = statistics.median(row[key])
    result = {
        "benchmark": "kla_lm_tuning",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "device": torch.cuda.get_device_name() if cuda else "cpu (torch op, dry run)",
        "torch": torch.__version__,
        "shape": [B, L], "rounds": args.rounds, "profiles": args.profiles, "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    with open(args.out, "w") as f:
        f.write(json.dumps(result, indent=1) + "\n")
    for row in rows:
        print(f"{json.dumps(row['variant'])}: kernels {row['total_median_ms']:.3f} ms, glue "
              f"{row['glue_median_ms']:.3f}, op {row['op_median_ms']:.3f}, backward "
              f"{row['bwd_median_ms']:.3f}, forward {row['fwd_median_ms']:.3f}, maps "
              f"{row['maps_median_ms']:.3f}, tangent maps {row['tangent_median_ms']:.3f}, gradients "
              f"{row['grad_rel_diff']:.1e} from the first")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
