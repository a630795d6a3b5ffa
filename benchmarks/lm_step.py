"""One training step of a KLA language model against an attention language model of the same size.

``KLALanguageModel`` (d_model 512, 6 layers, vocab 256) with ``mixers="kla"`` and with
``mixers="attention"`` (SDPA flash), bf16 autocast, fused AdamW; a step is forward, cross-entropy
loss, backward and the optimizer step. At each batch x context (default 8 x 2048, 2 x 8192,
1 x 32768, 1 x 131072) the models run interleaved in the same process:

- correctness first: each model's bf16 loss on the first step against a float32 eager reference
  (same weights, same batch, autocast off, the KLA layers' eager glue), and at up to
  ``--grad-check-tokens`` tokens its parameters' gradients too (normwise relative error); a
  model whose loss is off by more than ``--loss-tol`` (relative) or gradients by more than
  ``--grad-tol`` gets no timing;
- GPU time per step from CUDA events (median of ``--repeats``, at most 3 above 65,536 tokens,
  after ``--warmup`` steps), the host time to issue a step (``perf_counter`` around the call,
  before synchronizing) and the wall time until the step finished;
- a torch.profiler split of a step's GPU time: KLA op kernels, fused glue kernels, other
  elementwise / reduction / copy kernels, GEMMs, attention kernels, optimizer, other, from
  ``--profile-steps`` profiled steps a model (default 3, the models interleaved; the split
  is the step of median kernel time's, every step's kernel time is kept); the ratio of the two
  models' kernel time a step (``kla_over_attention_kernels``, of the median steps, and each
  round's in ``..._all``), which a host-bound machine leaves as it is;
- peak memory; an out-of-memory model is recorded as such and the run continues.

``kla-eager`` (the KLA model with ``KLALayer.glue = "eager"``) shows what the fused glue saves.
The norms and MLPs of both models take their defaults (``RMSNorm.fused``, ``SwiGLU.fused``:
the fused kernels on CUDA from 32,768 tokens a call); set those class attributes to time
another choice.
JSON to ``--out``. ``--dry-run``: tiny shapes on the CPU (eager), to check the script.

    export PYTHONPATH=$PWD
    python3 benchmarks/lm_step.py --out benchmarks/results/lm-step-h200.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kalmanscan.kla import KLALanguageModel, ModelConfig  # noqa: E402
from kalmanscan.kla.model import RMSNorm, SwiGLU  # noqa: E402
from kalmanscan.validation.run_meta import run_meta  # noqa: E402

CATEGORIES = ("kla_op", "glue_fused", "elementwise", "gemm", "attention", "optimizer", "other")


def classify(name: str) -> str:
    """The profile category of a CUDA kernel (or, on the CPU, an aten op) by its name."""
    n = name.lower()
    if any(k in n for k in ("_kla_", "_chunk_maps_", "_carry_kernel", "_adjoint_maps_")):
        return "kla_op"  # kalmanscan/cuda/kla/{forward,backward,chunked}.py
    if "_glue_" in n:
        return "glue_fused"  # kalmanscan/cuda/kla/glue*.py
    if "_swiglu_" in n or "_rms_" in n:
        return "elementwise"  # the MLP's and norms' fused kernels (kalmanscan/cuda/{swiglu,rmsnorm}.py)
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if any(k in n for k in ("adam", "multi_tensor", "foreach")):
        return "optimizer"
    if any(
        k in n
        for k in ("gemm", "gemv", "cutlass", "nvjet", "cublas", "xmma", "aten::mm", "aten::addmm",
                  "aten::bmm", "aten::linear", "aten::matmul", "splitk")
    ):  # fmt: skip
        return "gemm"
    if any(
        k in n
        for k in ("elementwise", "vectorized", "reduce", "copy", "cat", "fill", "softmax",
                  "cross_entropy", "nll", "norm", "index", "embedding", "conv", "unrolled",
                  "aten::")
    ):  # fmt: skip
        return "elementwise"
    return "other"


def make_models(d_model, n_layers, vocab, device, seed):
    """``{"kla", "kla-eager", "attention"}`` models; the two KLA ones share their weights."""
    models = {}
    torch.manual_seed(seed)
    kla = KLALanguageModel(ModelConfig(vocab_size=vocab, d_model=d_model, n_layers=n_layers,
                                       mixers="kla")).to(device)  # fmt: skip
    eager = KLALanguageModel(kla.config).to(device)
    eager.load_state_dict(kla.state_dict())
    for blk in eager.blocks:
        blk.mixer.glue = "eager"
    torch.manual_seed(seed)
    attn = KLALanguageModel(ModelConfig(vocab_size=vocab, d_model=d_model, n_layers=n_layers,
                                        mixers="attention")).to(device)  # fmt: skip
    models["kla"], models["kla-eager"], models["attention"] = kla, eager, attn
    return models


def loss_of(model, tokens, autocast, device):
    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(inp)
    return F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten())


def reference_loss(model, tokens, device, grads=False):
    """``(loss, gradients)``: the float32 loss, autocast off, KLA layers on their eager glue
    and the norms and MLPs on their eager ops (same weights), and with ``grads`` the
    parameters' gradients as one flat float32 vector (else None)."""
    saved = [(blk.mixer, "glue", blk.mixer.__dict__.get("glue")) for blk in model.blocks
             if blk.mixer_kind == "kla"]  # fmt: skip
    saved += [(m, "fused", m.__dict__.get("fused")) for m in model.modules()
              if isinstance(m, (RMSNorm, SwiGLU))]  # fmt: skip
    for mod, attr, _ in saved:
        setattr(mod, attr, "eager")
    try:
        if not grads:
            with torch.no_grad():
                return float(loss_of(model, tokens, False, device)), None
        model.zero_grad(set_to_none=True)
        loss = loss_of(model, tokens, False, device)
        loss.backward()
        flat = flat_grads(model)
        model.zero_grad(set_to_none=True)
        return float(loss), flat
    finally:
        for mod, attr, value in saved:
            if value is None:
                delattr(mod, attr)
            else:
                setattr(mod, attr, value)


def flat_grads(model):
    """Every parameter's gradient (zeros where None), float32, as one vector."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).float().flatten()
                      for p in model.parameters()])  # fmt: skip


class Stepper:
    """One model's training step (forward, loss, backward, fused AdamW step)."""

    def __init__(self, model, device, autocast):
        self.model, self.device, self.autocast = model, device, autocast
        fused = device.type == "cuda"
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)

    def __call__(self, tokens):
        self.opt.zero_grad(set_to_none=True)
        loss = loss_of(self.model, tokens, self.autocast, self.device)
        loss.backward()
        self.opt.step()
        return loss


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(step, tokens, device):
    """``(gpu_ms, host_ms, wall_ms)`` of one step: CUDA events, the time to issue it, and the
    wall clock until the GPU finished it (all the wall clock on the CPU)."""
    if device.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        step(tokens)
        host = (time.perf_counter() - t0) * 1e3
        b.record()
        b.synchronize()
        return a.elapsed_time(b), host, (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    step(tokens)
    ms = (time.perf_counter() - t0) * 1e3
    return ms, ms, ms


def _is_annotation(ev) -> bool:
    """Whether a profiler event on the GPU is a user annotation's span, not a kernel."""
    if getattr(ev, "is_user_annotation", False):
        return True
    return ev.name.startswith(("Optimizer.", "ProfilerStep#"))


def profile_split(step, tokens, device):
    """One step's time by category (ms): CUDA kernels on the GPU, aten ops' self time on the
    CPU."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        step(tokens)
        sync(device)
    split = dict.fromkeys(CATEGORIES, 0.0)
    count = dict.fromkeys(CATEGORIES, 0)
    top, calls = {}, {}
    if device.type == "cuda":
        for ev in prof.events():
            # kernels, copies and memsets; not the GPU-side spans of user annotations (such
            # as "Optimizer.step#AdamW.step", whose span covers the optimizer's own kernels,
            # which would be counted twice)
            if ev.device_type != torch.autograd.DeviceType.CUDA or _is_annotation(ev):
                continue
            ms = ev.time_range.elapsed_us() / 1e3
            split[classify(ev.name)] += ms
            count[classify(ev.name)] += 1
            top[ev.name] = top.get(ev.name, 0.0) + ms
            calls[ev.name] = calls.get(ev.name, 0) + 1
    else:
        for avg in prof.key_averages():
            if not avg.key.startswith("aten::"):
                continue
            ms = avg.self_cpu_time_total / 1e3
            split[classify(avg.key)] += ms
            count[classify(avg.key)] += avg.count
            top[avg.key] = top.get(avg.key, 0.0) + ms
            calls[avg.key] = calls.get(avg.key, 0) + avg.count
    split = {k: round(v, 3) for k, v in split.items()}
    split["total"] = round(sum(split.values()), 3)
    split["kernels"] = {**count, "total": sum(count.values())}
    heavy = sorted(top.items(), key=lambda kv: -kv[1])
    return split, [
        {"name": n[:160], "ms": round(ms, 3), "calls": calls[n], "category": classify(n)}
        for n, ms in heavy if ms >= 0.02
    ]


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def run_shape(models, B, L, args, device):
    g = torch.Generator(device="cpu").manual_seed(args.seed + L)
    tokens = torch.randint(0, args.vocab, (B, L + 1), generator=g).to(device)
    # every model starts this shape from its initial weights (the steps of earlier shapes moved
    # them): the correctness check compares with a reference on exactly these weights
    res = {}
    steppers = {}
    for name, model in models.items():
        model.load_state_dict(args.initial[name])
        entry = res[name] = {"ok": False}
        check_grads = B * L <= args.grad_check_tokens
        try:
            ref, gref = reference_loss(model, tokens, device, grads=check_grads)
            stepper = Stepper(model, device, autocast=not args.dry_run)
            loss = float(stepper(tokens).detach())  # first step: the reference's weights
            if gref is not None:  # its gradients (the optimizer's step left them in .grad)
                gerr = float((flat_grads(model) - gref).norm() / gref.norm())
                del gref
            for _ in range(args.warmup - 1):
                stepper(tokens)
            sync(device)
        except Exception as err:  # noqa: BLE001  (recorded: the other models still run)
            first = (str(err).splitlines() or [""])[0][:300]
            if is_oom(err):
                entry.update(error="out of memory", detail=first)
            else:
                entry.update(error=f"{type(err).__name__}: {first}")
        if "error" in entry:
            stepper = None
            _free(device)  # after the except block: its traceback held the step's tensors
            continue
        rel = abs(loss - ref) / abs(ref)
        entry.update(loss=loss, ref_loss=ref, loss_rel_err=rel)
        if not (math.isfinite(loss) and rel <= args.loss_tol):
            entry["error"] = f"loss {loss} vs float32 reference {ref}: relative {rel:.2e}"
            continue
        if check_grads:
            entry["grad_rel_err"] = gerr
            if not (math.isfinite(gerr) and gerr <= args.grad_tol):
                entry["error"] = f"gradients vs float32 reference: normwise relative {gerr:.2e}"
                continue
        entry["ok"] = True
        steppers[name] = stepper
    gpu = {n: [] for n in steppers}
    host = {n: [] for n in steppers}
    wall = {n: [] for n in steppers}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    repeats = args.repeats if B * L <= 65536 else min(args.repeats, 3)
    for _ in range(repeats):  # interleaved: each repeat runs every model once
        for name, stepper in list(steppers.items()):
            try:
                ms, h, w = timed(stepper, tokens, device)
            except RuntimeError as err:
                if not is_oom(err):
                    raise
                res[name].update(ok=False, error="out of memory while timing")
            if not res[name]["ok"]:
                del steppers[name]
                _free(device)
                continue
            gpu[name].append(ms)
            host[name].append(h)
            wall[name].append(w)
    for name, stepper in steppers.items():
        entry = res[name]
        entry["gpu_ms"] = round(statistics.median(gpu[name]), 3)
        entry["gpu_ms_all"] = [round(x, 3) for x in gpu[name]]
        entry["host_ms"] = round(statistics.median(host[name]), 3)
        entry["wall_ms"] = round(statistics.median(wall[name]), 3)
        entry["tokens_per_s"] = round(B * L / (entry["gpu_ms"] / 1e3))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            stepper(tokens)
            sync(device)
            entry["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if not args.no_profile:  # interleaved as the timed steps: each round profiles every model
        profiles = {n: [] for n in steppers}
        for _ in range(max(args.profile_steps, 1)):
            for name, stepper in steppers.items():
                profiles[name].append(profile_split(stepper, tokens, device))
        for name, runs in profiles.items():
            # the step of median kernel time (its split and its heaviest kernels), and every
            # step's kernel time
            totals = [split["total"] for split, _ in runs]
            mid = sorted(range(len(runs)), key=lambda i: totals[i])[(len(runs) - 1) // 2]
            res[name]["profile_ms"], res[name]["profile_top"] = runs[mid]
            res[name]["profile_total_ms_all"] = totals
    for stepper in steppers.values():
        del stepper.opt
    steppers.clear()
    _free(device)
    row = {"B": B, "L": L, "models": res}
    for name in ("kla", "kla-eager"):
        if res.get(name, {}).get("ok") and res.get("attention", {}).get("ok"):
            row[f"{name}_over_attention"] = round(
                res[name]["gpu_ms"] / res["attention"]["gpu_ms"], 3
            )
            # the same ratio of the profiled step's kernel time: where a machine's host makes
            # the steps host-bound, this one still compares the models' device work
            pk, pa = res[name].get("profile_ms"), res["attention"].get("profile_ms")
            if pk and pa and pa["total"] > 0:
                row[f"{name}_over_attention_kernels"] = round(pk["total"] / pa["total"], 3)
                # each profiling round's ratio (the two models' steps profiled back to back)
                row[f"{name}_over_attention_kernels_all"] = [
                    round(k / a, 3)
                    for k, a in zip(res[name]["profile_total_ms_all"],
                                    res["attention"]["profile_total_ms_all"], strict=True)
                ]  # fmt: skip
    return row


def _free(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--shapes", default=None,
                    help="comma-separated BxL (default 8x2048,2x8192,1x32768,1x131072; "
                         "with --dry-run 2x16,1x40)")  # fmt: skip
    ap.add_argument("--models", default="kla,attention,kla-eager")
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--n-layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--grad-tol", type=float, default=0.1,
                    help="bf16 gradients vs the float32 reference, normwise relative")
    ap.add_argument("--grad-check-tokens", type=int, default=32768,
                    help="the gradient check at shapes of at most this many tokens")
    ap.add_argument("--loss-tol", type=float, default=1e-2,
                    help="bf16 loss vs the float32 reference, relative")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--profile-steps", type=int, default=3,
                    help="profiled steps a model (interleaved); the split of the median one")  # fmt: skip
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes on the CPU, float32 eager (checks the script)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.dry_run:
        device = torch.device("cpu")
        args.shapes, args.d_model, args.n_layers = args.shapes or "2x16,1x40", 32, 2
        args.repeats, args.warmup = min(args.repeats, 2), min(args.warmup, 1)
    else:
        if not torch.cuda.is_available():
            sys.exit("lm_step.py: needs a CUDA device (or --dry-run)")
        device = torch.device("cuda")
        args.shapes = args.shapes or "8x2048,2x8192,1x32768,1x131072"
    args.warmup = max(args.warmup, 1)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
    names = [n.strip() for n in args.models.split(",")]
    all_models = make_models(args.d_model, args.n_layers, args.vocab, device, args.seed)
    unknown = set(names) - set(all_models)
    if unknown:
        sys.exit(f"--models: expected names from {sorted(all_models)}, got {sorted(unknown)}")
    models = {n: all_models[n] for n in names}
    args.initial = {n: {k: v.detach().clone() for k, v in m.state_dict().items()}
                    for n, m in models.items()}  # fmt: skip
    t_start = time.time()
    rows = []
    for B, L in shapes:
        row = run_shape(models, B, L, args, device)
        rows.append(row)
        parts = []
        for name, e in row["models"].items():
            parts.append(  # host: the time to issue a step; near the GPU time, it bounds it
                f"{name} {e['gpu_ms']:.2f} ms (host {e['host_ms']:.2f})"
                if e.get("ok")
                else f"{name} {e.get('error')}"
            )
        ratio = row.get("kla_over_attention")
        kratio = row.get("kla_over_attention_kernels")
        print(f"{B} x {L}: " + ", ".join(parts) + (f"; kla/attention {ratio:.2f}" if ratio else "")
              + (f" (kernels alone {kratio:.2f})" if kratio else ""), flush=True)  # fmt: skip
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    out = {
        "benchmark": "lm_step",
        **run_meta(cuda=device.type == "cuda"),
        "torch": torch.__version__,
        "triton": triton_version,
        "dry_run": bool(args.dry_run),
        "config": {
            "d_model": args.d_model,
            "n_layers": args.n_layers,
            "vocab": args.vocab,
            "autocast": None if args.dry_run else "bfloat16",
            "optimizer": "AdamW",
            "repeats": args.repeats,
            "warmup": args.warmup,
            "loss_tol": args.loss_tol,
        },  # fmt: skip
        "rows": rows,
        "wall_s": round(time.time() - t_start, 1),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out} ({out['wall_s']} s)")


if __name__ == "__main__":
    main()
