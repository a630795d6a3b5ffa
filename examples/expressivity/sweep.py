"""Run a whole sweep of expressivity experiments in one call: many small trainings at once.

    python examples/expressivity/sweep.py --plan main --out "$OUT" --time-budget 270

Steps: (1) on CUDA, check each ``kla_filter`` backend against the float64 sequential reference
(forward and gradients) and time one forward+backward at a training-sized shape; the fastest
backend that passes is used by every KLA run (the result is written to ``env.json``);
(2) launch every run of the plan as its own ``train.py`` process (all at once by default, they
share the GPU), each with the same wall-time budget; (3) merge the per-run JSON files into one
file per group (``a5.json``, ``mqar.json``, ``mad.json``, ``ablation.json``), the trained KLA
weights into ``models.pt`` (not written when ``--save-models`` selects none) and the logs
into ``logs.txt``, so at most 8 files come back.

Plans: ``main`` (everything in docs/experiments.md), ``followup`` (the KLA runs again),
``smoke`` (a few tiny CPU runs).

Resuming across calls. Each run checkpoints to ``<ckpt-dir>/<name>.pt`` (model, optimizer, step,
elapsed time, history, data generator) and resumes from that file when it exists. The default
``--ckpt-dir`` is inside the temporary ``--workdir``, which a later call does not see, so by
default every call starts from scratch. To continue a sweep on a fresh machine, bring the
previous call's checkpoints along and name them with ``--resume-from``, and write the new
ones where they come back (under ``--out``); give the same ``--time-total`` to every call so
the learning-rate schedule runs once over the whole training::

    # call 1
    python examples/expressivity/sweep.py --plan followup --only a5-kla-b2 --out "$OUT" \
        --ckpt-dir "$OUT/ckpt" --time-budget 500 --time-total 1500
    # call 2 (the files of call 1's $OUT/ckpt copied to out/ckpt in the working tree)
    python examples/expressivity/sweep.py --plan followup --only a5-kla-b2 --out "$OUT" \
        --ckpt-dir "$OUT/ckpt" --resume-from out/ckpt --time-budget 500 --time-total 1500

Within one lease of a GPU machine, a ``--ckpt-dir`` in an ignored folder of the working tree
(``out/ckpt``) stays on the machine between calls and needs no transfer. A checkpoint holds the
weights and Adam's two moments, 12 bytes per parameter (9.4 MB for ``a5-kla-b2``, 15.8 MB for
``selcopy-kla-b6``), so only a few runs' checkpoints fit in what one call can bring back.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train.py"

A5 = dict(
    task="a5",
    length=20,
    d_model=128,
    d_state=16,
    expand=2.0,
    batch=512,
    lr=1e-3,
    n_train=200_000,
    n_eval=2_048,
    warmup=200,
    heads=4,
)
MQAR = dict(
    task="mqar",
    length=256,
    num_kv_pairs=16,
    vocab_size=256,
    d_state=16,
    expand=1.0,
    lr=1e-3,
    n_train=12_800,
    n_eval=1_280,
    layers=2,
    warmup=100,
    batch=64,
)
SELCOPY = dict(
    task="selective_copy",
    length=256,
    num_tokens_to_copy=16,
    vocab_size=16,
    d_model=128,
    d_state=8,
    expand=1.0,
    batch=128,
    lr=1e-3,
    n_train=12_800,
    n_eval=1_280,
    warmup=100,
)
FUZZY = dict(
    task="fuzzy_recall",
    length=128,
    vocab_size=16,
    motif_size=3,
    d_model=128,
    d_state=8,
    expand=1.0,
    batch=128,
    lr=1e-3,
    n_train=12_800,
    n_eval=1_280,
    warmup=100,
)


def plan_main():
    runs = []
    for mixer in ("kla", "linear", "attention"):
        for layers in (1, 2, 3, 4):
            runs.append(
                dict(
                    A5,
                    name=f"a5-{mixer}-b{layers}",
                    group="a5",
                    mixer=mixer,
                    layers=layers,
                    stop_acc=0.999,
                )
            )
    for mixer in ("kla", "linear"):
        for width in (64, 128, 256):
            runs.append(
                dict(
                    MQAR,
                    name=f"mqar-{mixer}-d{width}",
                    group="mqar",
                    mixer=mixer,
                    d_model=width,
                    heads=4,
                    stop_acc=0.999,
                )
            )
    for mixer in ("kla", "linear", "attention"):
        runs.append(dict(SELCOPY, name=f"selcopy-{mixer}-b1", group="mad", mixer=mixer, layers=1))
        runs.append(dict(FUZZY, name=f"fuzzy-{mixer}-b1", group="mad", mixer=mixer, layers=1))
    runs.append(dict(SELCOPY, name="selcopy-kla_p0-b1", group="ablation", mixer="kla_p0", layers=1))
    for mixer in ("kla", "kla_p0"):
        runs.append(
            dict(SELCOPY, name=f"selcopy-{mixer}-b6", group="ablation", mixer=mixer, layers=6)
        )
    return runs


def plan_followup():
    """The KLA runs again, fewer at once and without host syncs in the layer (see models.py)."""
    runs = []
    for mixer in ("kla", "kla_p0", "linear"):
        runs.append(
            dict(SELCOPY, name=f"selcopy-{mixer}-b1", group="ablation", mixer=mixer, layers=1)
        )
    for mixer in ("kla", "kla_p0"):
        runs.append(
            dict(SELCOPY, name=f"selcopy-{mixer}-b6", group="ablation", mixer=mixer, layers=6)
        )
    for mixer, layers in (("kla", 1), ("kla", 2), ("linear", 2)):
        runs.append(
            dict(
                A5,
                name=f"a5-{mixer}-b{layers}",
                group="a5",
                mixer=mixer,
                layers=layers,
                stop_acc=0.999,
            )
        )
    return runs


def plan_smoke():
    tiny = dict(
        d_model=16, d_state=4, expand=1.0, batch=8, n_train=64, n_eval=16, warmup=2, heads=2
    )
    return [
        dict(tiny, task="a5", length=6, name="a5-kla-b1", group="a5", mixer="kla", layers=1),
        dict(
            tiny,
            task="selective_copy",
            length=20,
            num_tokens_to_copy=3,
            vocab_size=8,
            name="selcopy-linear-b1",
            group="mad",
            mixer="linear",
            layers=1,
        ),
    ]


PLANS = {"main": plan_main, "followup": plan_followup, "smoke": plan_smoke}


def check_backend(name, device):
    """Correctness of one kla_filter backend against float64 sequential, and fwd+bwd timing."""
    from kalmanscan.core.kla_op import kla_filter

    g = torch.Generator(device="cpu").manual_seed(0)

    def inputs(B, L, M, S, dtype):
        v = torch.randn(B, L, M, generator=g)
        Lv = torch.rand(B, L, M, generator=g) * 2 + 0.1
        k = torch.nn.functional.normalize(torch.randn(B, L, S, generator=g), dim=-1)
        q = torch.nn.functional.normalize(torch.randn(B, L, S, generator=g), dim=-1)
        a = torch.rand(M, S, generator=g) * 0.2 + 0.8
        p = torch.rand(M, S, generator=g) * 0.02
        return [t.to(device=device, dtype=dtype).requires_grad_(True) for t in (v, Lv, k, q, a, p)]

    ref_in = inputs(3, 37, 8, 4, torch.float64)
    ref = kla_filter(*ref_in, backend="sequential")
    (ref.y.sum() + ref.yvar.sum()).backward()
    ref_grads = [t.grad.clone() for t in ref_in]
    entry = {}
    try:
        x = [t.detach().float().requires_grad_(True) for t in ref_in]
        res = kla_filter(*x, backend=name)
        (res.y.sum() + res.yvar.sum()).backward()
        err_y = float(
            (res.y.detach().double() - ref.y.detach()).abs().max() / ref.y.detach().abs().max()
        )
        err_g = max(
            float((t.grad.detach().double() - r).abs().max() / r.abs().max().clamp_min(1e-12))
            for t, r in zip(x, ref_grads, strict=True)
        )
        entry.update(rel_err_y=err_y, rel_err_grad=err_g, ok=err_y < 1e-3 and err_g < 1e-2)
        big = inputs(64, 256, 128, 16, torch.float32)
        times = []
        for _ in range(3):
            for t in big:
                t.grad = None
            torch.cuda.synchronize() if device.type == "cuda" else None
            t0 = time.perf_counter()
            r = kla_filter(*big, backend=name)
            (r.y.sum() + r.yvar.sum()).backward()
            torch.cuda.synchronize() if device.type == "cuda" else None
            times.append(time.perf_counter() - t0)
        entry["fwd_bwd_ms_B64_L256_M128_S16"] = sorted(times)[1] * 1e3
    except Exception as exc:  # a backend that cannot serve this device is reported, not used
        entry.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
    return entry


def check_backends(device, timeout=120):
    """Run :func:`check_backend` for each backend in its own process (a kernel fault cannot
    poison the others); returns the fastest passing backend and the report."""
    names = ("triton", "torch", "sequential")
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--check-backend",
                name,
                "--device",
                str(device),
                "--out",
                ".",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    }
    report = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
            report[name] = (
                json.loads(lines[-1])
                if lines
                else {"ok": False, "error": (stderr or stdout)[-800:]}
            )
        except subprocess.TimeoutExpired:
            proc.kill()
            report[name] = {"ok": False, "error": f"timeout after {timeout} s"}
        print(name, report[name], flush=True)
    usable = [n for n, e in report.items() if e.get("ok")]
    best = (
        min(usable, key=lambda n: report[n]["fwd_bwd_ms_B64_L256_M128_S16"])
        if usable
        else "sequential"
    )
    return best, report


def command(run, args, backend, workdir, ckpt_dir):
    cmd = [
        sys.executable,
        str(TRAIN),
        "--out",
        str(workdir / f"{run['name']}.json"),
        "--ckpt",
        str(ckpt_dir / f"{run['name']}.pt"),
        "--backend",
        backend,
        "--time-budget",
        str(args.time_budget),
        "--device",
        args.device,
        "--seed",
        str(args.seed),
        "--eval-every",
        str(args.eval_every),
        "--wall-limit",
        str((args.deadline if args.deadline else args.time_budget + 90) - 15),
    ]
    if args.time_total is not None:
        cmd += ["--time-total", str(args.time_total)]
    for key, value in run.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plan", choices=sorted(PLANS), default="main")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--workdir", default=None, help="per-run JSON and logs (default: a new temporary folder)"
    )
    p.add_argument(
        "--ckpt-dir",
        default=None,
        help="per-run checkpoints <name>.pt; a run resumes from its file when it exists "
        "(default: workdir/ckpt, so nothing carries over to a later call)",
    )
    p.add_argument(
        "--resume-from",
        default=None,
        help="folder of a previous call's checkpoints <name>.pt, copied into --ckpt-dir "
        "before the runs start (runs without one start from scratch)",
    )
    p.add_argument("--time-budget", type=float, default=270.0, help="training seconds per run")
    p.add_argument(
        "--time-total",
        type=float,
        default=None,
        help="planned training seconds per run over all calls (learning-rate schedule); "
        "give the same value to every call of a resumed sweep",
    )
    p.add_argument("--eval-every", type=float, default=30.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", default=None, help="skip the check and use this backend")
    p.add_argument("--only", default=None, help="comma-separated run names to keep")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        help="KEY=VALUE applied to every run (e.g. steps=2 for a dry run)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds after launch when unfinished runs are killed (default budget + 90)",
    )
    p.add_argument(
        "--save-models",
        default=None,
        help="comma-separated runs whose weights go to models.pt (default: every KLA run)",
    )
    p.add_argument("--check-backend", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.check_backend:
        print(json.dumps(check_backend(args.check_backend, torch.device(args.device))), flush=True)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="expressivity-"))
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir else workdir / "ckpt"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    resume_dir = Path(args.resume_from) if args.resume_from else None
    if resume_dir is not None and not resume_dir.is_dir():
        raise SystemExit(f"--resume-from: expected a folder of checkpoints, got {resume_dir}")
    t_start = time.time()
    env = {
        "plan": args.plan,
        "time_budget": args.time_budget,
        "time_total": args.time_total,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    device = torch.device(args.device)
    if args.backend:
        backend, env["backend_check"] = args.backend, None
    elif device.type == "cuda":
        env["device"] = torch.cuda.get_device_name(device)
        backend, env["backend_check"] = check_backends(device)
    else:
        backend, env["backend_check"] = "sequential", None
    env["backend"] = backend
    print(f"backend: {backend}", flush=True)
    runs = PLANS[args.plan]()
    if args.only:
        keep = set(args.only.split(","))
        runs = [r for r in runs if r["name"] in keep]
    for item in args.override:
        key, _, value = item.partition("=")
        for run in runs:
            run[key.replace("-", "_")] = value
    resumed = {}
    for run in runs:
        dst = ckpt_dir / f"{run['name']}.pt"
        src = resume_dir / f"{run['name']}.pt" if resume_dir else None
        if src is not None and src.exists() and src.resolve() != dst.resolve():
            shutil.copyfile(src, dst)
        if dst.exists():
            resumed[run["name"]] = str(dst)
    env["resumed"] = resumed
    if resumed:
        print(f"resuming {len(resumed)} runs: {', '.join(resumed)}", flush=True)
    pending = list(runs)
    active = []
    t_launch = time.time()
    logs = {}
    while pending or active:
        while pending and len(active) < args.concurrency:
            run = pending.pop(0)
            log = open(workdir / f"{run['name']}.log", "w")
            proc = subprocess.Popen(
                command(run, args, backend, workdir, ckpt_dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
            active.append((run, proc, log))
        time.sleep(1.0)
        for item in list(active):
            run, proc, log = item
            deadline = args.deadline if args.deadline else args.time_budget + 90
            if proc.poll() is None and time.time() - t_launch > deadline:
                proc.kill()
            if proc.poll() is not None:
                log.close()
                active.remove(item)
                logs[run["name"]] = proc.returncode
                print(
                    f"{run['name']}: exit {proc.returncode} at {time.time() - t_launch:.0f} s",
                    flush=True,
                )
    groups, models = {}, {}
    for run in runs:
        path = workdir / f"{run['name']}.json"
        if path.exists():
            res = json.loads(path.read_text())
        else:
            res = {
                "name": run["name"],
                "group": run["group"],
                "error": f"exit {logs.get(run['name'])}",
                "config": run,
            }
        groups.setdefault(run["group"], []).append(res)
        ck = ckpt_dir / f"{run['name']}.pt"
        wanted = (
            run["name"] in args.save_models.split(",")
            if args.save_models
            else run["mixer"].startswith("kla")
        )
        if ck.exists() and wanted:
            state = torch.load(ck, map_location="cpu", weights_only=True)
            models[run["name"]] = {"model": state["model"], "args": state["args"]}
    env["wall_seconds"] = round(time.time() - t_start, 1)
    env["exit_codes"] = logs
    for group, results in groups.items():
        (out / f"{group}.json").write_text(json.dumps({"env": env, "runs": results}, indent=1))
    (out / "env.json").write_text(json.dumps(env, indent=1))
    if models:  # nothing to write under --save-models none: one file fewer to bring back
        torch.save(models, out / "models.pt")
    with open(out / "logs.txt", "w") as fh:
        for run in runs:
            log = workdir / f"{run['name']}.log"
            fh.write(
                f"===== {run['name']}\n"
                + (log.read_text()[-4000:] if log.exists() else "(no log)\n")
            )
    print("summary:", flush=True)
    for results in groups.values():
        for r in results:
            acc = (r.get("final") or {}).get("accuracy")
            print(
                f"  {r['name']:<24} steps {r.get('steps')!s:>6} "
                f"(from {r.get('resumed_from_step')}) acc {acc}  "
                f"diverged {r.get('diverged')}",
                flush=True,
            )


if __name__ == "__main__":
    main()
