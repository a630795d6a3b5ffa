"""Train the bundled byte-level KLA language model and an attention baseline of the same size.

Data recipe (deterministic for a given Python installation; tokens are UTF-8 bytes, vocab 256):

- **Python**: every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]`` (``site-packages`` /
  ``dist-packages`` excluded), sorted by relative POSIX path, joined by ``b"\\n\\n"``.
- **English**: the prose of the same library: (1) the module, class and function docstrings
  of each of those files (``ast``, ``inspect.cleandoc``; files that do not parse contribute
  none), (2) the topic texts of ``pydoc_data/topics.py`` (the Python documentation topics),
  (3) ``LICENSE.txt``. Documents are joined by ``b"\\n\\n"``.
- **Held out**: a file (with its docstrings) iff ``int(sha256(relative path), 16) % 20 == 0``;
  a topic iff ``int(sha256("topic:" + key), 16) % 20 == 0``; ``LICENSE.txt`` trains.

Training: each batch row is a random window of ``seq_len + 1`` bytes, from Python with
probability 0.7 and from English with 0.3 (``--english-fraction``), seeded by ``(seed, step)``
so a resumed run sees the same batches. AdamW (betas 0.9/0.95, fused on CUDA; weight decay
0.1 on matrices only, none on the filter dynamics and process noise), linear warm-up then linear
decay to 10 % over the planned steps, gradient clipping 1.0, bf16 autocast on CUDA (the filter
runs in float32). The KLA layers learn their process noise on the log scale
(``process_noise_param="log"``). With ``--minutes`` the planned step count is fixed after a
short timed calibration and stored, so the schedule is step-based; the attention baseline
(parameter-matched width, 4 heads, rotary positions) trains the same number of steps on the
same batches.

Evaluation: held-out bits per byte per domain on non-overlapping windows of ``seq_len + 1``
bytes covering the held-out split (up to ``--eval-bytes`` per domain, evenly spaced), for both
models and for the KLA model after rounding to the stored half-precision weights, next to
``lzma`` (preset ``9 | PRESET_EXTREME``, no dictionary) of exactly the scored bytes; and the
Spearman correlation between per-token surprisal and the information the KLA layers add
(:func:`kalmanscan.kla.inspect`) on 4 held-out windows of 2048 bytes per domain.

    python examples/train_kla_lm.py --minutes 4.5 --total-minutes 9.2 --out out/       # GPU
    python examples/train_kla_lm.py --max-steps 3 --d-model 64 --n-layers 2 --seq-len 64 \\
        --batch 4 --out /tmp/kla                                                     # CPU

The default size, width 256 x 5 KLA blocks (d_state 16, expand 2), has 7,557,893 parameters:
a 15.4 MB half-precision ``model.safetensors``.

Writes ``<out>/kla-lm/{model.safetensors,config.json}``, ``<out>/kla-lm-metrics.json`` (rewritten
after each stage) and ``<out>/train.log``; the resume checkpoint (model, optimizer, step, RNG,
planned steps) goes to ``<ckpt-dir>/kla-lm-resume.pt`` every ``--ckpt-minutes`` and at the end.
``--resume`` continues from it.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import inspect as pyinspect
import json
import lzma
import math
import platform
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

from kalmanscan.kla import KLAConfig, KLALanguageModel, ModelConfig, save_checkpoint
from kalmanscan.kla.config import AttentionConfig
from kalmanscan.kla.io import load_checkpoint

HELD_OUT_MODULUS = 20
SEPARATOR = b"\n\n"
NO_DECAY = ("delta", "lambda_log", "process_noise", "lambda_skip", "norm")
OLD_FLOOR = 1e-7  # the raw parameterization's process-noise floor
DOMAINS = ("python", "english")


# ---------------------------------------------------------------------- data


def stdlib_files(root: Path) -> list[Path]:
    """Sorted standard-library ``.py`` files (relative paths), third-party packages excluded."""
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if {"site-packages", "dist-packages"} & set(rel.parts) or not path.is_file():
            continue
        files.append(rel)
    return sorted(files, key=lambda p: p.as_posix())


def is_held_out(key: str) -> bool:
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    return int(digest, 16) % HELD_OUT_MODULUS == 0


def docstrings(source: bytes) -> list[str]:
    """Module, class and function docstrings of a source, cleaned; [] if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and doc.strip():
                out.append(pyinspect.cleandoc(doc))
    return out


def doc_topics(root: Path) -> dict[str, str]:
    """The ``topics`` dict of ``pydoc_data/topics.py`` (read with ``ast``, not imported)."""
    path = root / "pydoc_data" / "topics.py"
    if not path.is_file():
        return {}
    for node in ast.parse(path.read_bytes()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "topics" for t in node.targets
        ):
            return dict(ast.literal_eval(node.value))
    return {}


def package_files(roots, max_bytes: int, max_file_bytes: int = 500_000) -> list[tuple[Path, str]]:
    """``(path, key)`` of installed third-party ``.py`` files under ``roots`` (site-packages):
    files of at most ``max_file_bytes`` (larger ones are mostly generated tables), ordered by
    ``sha256(key)`` (a sample across packages, not the alphabet's first ones) and taken until
    ``max_bytes``; ``key`` is ``"site:" + relative path``."""
    seen, found = set(), []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).as_posix()
            if rel in seen or not path.is_file():
                continue
            size = path.stat().st_size
            if 0 < size <= max_file_bytes:
                seen.add(rel)
                found.append((hashlib.sha256(("site:" + rel).encode()).hexdigest(), path, rel))
    found.sort()
    out, total = [], 0
    for _, path, rel in found:
        if total >= max_bytes:
            break
        out.append((path, "site:" + rel))
        total += path.stat().st_size
    return out


def _read_doc(path):
    data = Path(path).read_bytes()
    return data, [d.encode("utf-8", "replace") for d in docstrings(data)]


def load_corpus(root: Path, package_roots=(), package_bytes: int = 0, workers: int = 1):
    """``({domain: train uint8}, {domain: held-out uint8}, description dict)``."""
    parts = {(d, s): [] for d in DOMAINS for s in ("train", "held")}
    listing = hashlib.sha256()
    files = [(root / rel, rel.as_posix()) for rel in stdlib_files(root)]
    n_stdlib = len(files)
    if package_bytes > 0:
        files += package_files(package_roots, package_bytes)
    paths = [str(f) for f, _ in files]
    if workers > 1 and len(paths) > 64:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(workers) as pool:
            read = pool.map(_read_doc, paths, chunksize=32)
    else:
        read = [_read_doc(f) for f in paths]
    for (_, key), (data, docs) in zip(files, read, strict=True):
        listing.update(key.encode() + b"\0" + hashlib.sha256(data).digest())
        split = "held" if is_held_out(key) else "train"
        parts["python", split].append(data)
        parts["english", split] += docs
    topics = doc_topics(root)
    for key in sorted(topics):
        split = "held" if is_held_out("topic:" + key) else "train"
        parts["english", split].append(topics[key].strip().encode("utf-8", "replace"))
    license_path = root / "LICENSE.txt"
    if license_path.is_file():
        parts["english", "train"].append(license_path.read_bytes())
    joined = {k: SEPARATOR.join(v) for k, v in parts.items()}
    for k, v in joined.items():
        listing.update(f"{k}".encode() + hashlib.sha256(v).digest())
    info = {
        "root": str(root),
        "python": platform.python_version(),
        "n_files": len(files),
        "n_stdlib_files": n_stdlib,
        "n_package_files": len(files) - n_stdlib,
        "package_roots": [str(r) for r in package_roots] if package_bytes > 0 else [],
        "n_topics": len(topics),
        "license_txt": license_path.is_file(),
        "corpus_sha256": listing.hexdigest(),
        "recipe": (
            "python: sorted stdlib *.py (no site-packages) + installed packages' *.py of <= 500 kB "
            "(site-packages, ordered by sha256('site:'+relpath), taken up to --package-bytes); "
            "english: their module/class/function docstrings (ast, inspect.cleandoc) + "
            "pydoc_data/topics.py texts + LICENSE.txt; held out iff sha256(key) % 20 == 0 "
            "(key: stdlib relpath or 'site:'+relpath; docstrings follow their file), topics iff "
            "sha256('topic:'+key) % 20 == 0, LICENSE.txt trains; documents joined by b'\\n\\n'; "
            "byte tokens"
        ),
    }
    for d in DOMAINS:
        info[f"{d}_train_docs"] = len(parts[d, "train"])
        info[f"{d}_held_out_docs"] = len(parts[d, "held"])
        info[f"{d}_train_bytes"] = len(joined[d, "train"])
        info[f"{d}_held_out_bytes"] = len(joined[d, "held"])
    arr = {k: np.frombuffer(v, dtype=np.uint8) for k, v in joined.items()}
    return {d: arr[d, "train"] for d in DOMAINS}, {d: arr[d, "held"] for d in DOMAINS}, info


def eval_windows(held: np.ndarray, seq_len: int, max_bytes: int) -> torch.Tensor:
    """Non-overlapping windows of ``seq_len + 1`` held-out bytes, ``[n, seq_len + 1]``: all of
    them, or about ``max_bytes`` worth evenly spaced."""
    n_all = len(held) // (seq_len + 1)
    if n_all == 0:
        raise ValueError(f"held-out split of {len(held)} bytes is shorter than seq_len + 1")
    n = max(1, min(n_all, max_bytes // (seq_len + 1)))
    idx = np.unique(np.linspace(0, n_all - 1, n).astype(np.int64))
    w = held[: n_all * (seq_len + 1)].reshape(n_all, seq_len + 1)[idx]
    return torch.from_numpy(w.astype(np.int64))


def lzma_bits_per_byte(data: bytes) -> float:
    return 8.0 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / len(data)


# ---------------------------------------------------------------------- training


def make_optimizer(model, lr, weight_decay, device):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or any(k in name for k in NO_DECAY) else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = device.type == "cuda"
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused)


def lr_at(step: int, planned: int, peak: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then linear decay to 10 % at ``planned`` steps."""
    progress = min(max(step / max(planned, 1), 0.0), 1.0)
    return peak * min(1.0, (step + 1) / warmup) * (1.0 - 0.9 * progress)


def loss_fn(model, batch, device, autocast):
    batch = batch.to(device, non_blocking=True)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(batch[:, :-1])
    return torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
    )


@torch.no_grad()
def bits_per_byte(model, windows, device, batch, autocast) -> float:
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    for i in range(0, len(windows), batch):
        w = windows[i : i + batch]
        total += loss_fn(model, w, device, autocast).double() * w[:, 1:].numel()
    model.train()
    return float(total) / windows[:, 1:].numel() / math.log(2)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


class Trainer:
    """Optimizer, step counter and planned schedule of one model; ``state_dict`` for resuming."""

    def __init__(self, model, args, device, batches, planned=None):
        self.model, self.args, self.device, self.batches = model, args, device, batches
        self.opt = make_optimizer(model, args.lr, args.weight_decay, device)
        self.step, self.planned, self.trained_s = 0, planned, 0.0
        self.curve = []  # (step, mean loss in bits over the last log_every steps)

    def state_dict(self, running_s=0.0):
        return {
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "step": self.step,
            "planned": self.planned,
            "trained_s": self.trained_s + running_s,
            "curve": self.curve,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.step, self.planned = state["step"], state["planned"]
        self.trained_s, self.curve = state["trained_s"], list(state["curve"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    def run(self, *, until=None, stop_s=None, on_checkpoint=None, ckpt_every_s=None, log=print):
        """Train to ``planned`` steps (or step ``until``, or ``stop_s`` seconds of wall time);
        ``on_checkpoint(self.state_dict(running_s))`` every ``ckpt_every_s`` seconds."""
        args, device = self.args, self.device
        autocast = device.type == "cuda"
        model = self.model
        model.train()
        end = self.planned if until is None else min(until, self.planned)
        t0 = time.perf_counter()
        last_ckpt, ckpt_s = t0, 0.0
        loss_sum = torch.zeros((), device=device)
        n_sum = 0
        stopped_early = False
        while self.step < end:
            if stop_s is not None and time.perf_counter() - t0 >= stop_s:
                stopped_early = True
                break
            for g in self.opt.param_groups:
                g["lr"] = lr_at(self.step, self.planned, args.lr, args.warmup)
            loss = loss_fn(model, self.batches(self.step), device, autocast)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.opt.step()
            loss_sum += loss.detach()
            n_sum += 1
            self.step += 1
            if self.step % args.log_every == 0 or self.step == end:
                mean = float(loss_sum) / n_sum / math.log(2)  # the only host sync in the loop
                if not math.isfinite(mean):
                    raise FloatingPointError(f"training diverged before step {self.step}")
                self.curve.append((self.step, mean))
                loss_sum.zero_()
                n_sum = 0
                el = time.perf_counter() - t0
                log(f"  step {self.step:5d}/{self.planned}  loss {mean:.4f} bits  {el:6.1f}s")
                now = time.perf_counter()
                if on_checkpoint and ckpt_every_s and now - last_ckpt >= ckpt_every_s:
                    on_checkpoint(self.state_dict(running_s=now - t0 - ckpt_s))
                    ckpt_s += time.perf_counter() - now  # checkpoint time is not training time
                    last_ckpt = time.perf_counter()
        sync(device)
        wall = time.perf_counter() - t0 - ckpt_s
        self.trained_s += wall
        return {
            "steps": self.step,
            "planned_steps": self.planned,
            "stopped_early": stopped_early,
            "wall_s_this_run": wall,
            "trained_s": self.trained_s,
            "tokens": self.step * args.batch * args.seq_len,
            "final_train_loss_bits": self.curve[-1][1] if self.curve else None,
            "train_loss_curve_bits": self.curve,
        }


def set_backend(model, backend):
    model.config.kla.backend = backend
    for blk in model.blocks:
        if hasattr(blk.mixer, "config") and hasattr(blk.mixer.config, "backend"):
            blk.mixer.config.backend = backend


def check_backend(name, make_model, batch, device, log):
    """Loss and gradients of backend ``name`` against the torch backend on one batch (a dict)."""
    losses, grads = {}, {}
    for b in ("torch", name):
        torch.manual_seed(0)
        model = make_model(b).to(device)
        loss = loss_fn(model, batch, device, device.type == "cuda")
        loss.backward()
        losses[b] = float(loss)
        grads[b] = torch.cat([p.grad.flatten().float() for p in model.parameters()])
        del model
    rel = float((grads[name] - grads["torch"]).norm() / grads["torch"].norm())
    report = {"loss_abs_diff_vs_torch": abs(losses[name] - losses["torch"]), "grad_rel_diff": rel}
    log(f"backend {name} vs torch: {report}")
    return report


def pick_backend(args, device, make_model, batch, log):
    """``--backend``: ``auto`` is triton on CUDA (checked against torch on one batch), torch on
    the CPU; ``probe`` times each candidate for two steps and takes the fastest that agrees."""
    if args.backend == "auto":
        if device.type != "cuda":
            return "torch", {}
        try:
            report = {"triton": check_backend("triton", make_model, batch, device, log)}
        except Exception as err:  # recorded in the metrics and logged; training goes on on torch
            report = {"triton": {"error": f"{type(err).__name__}: {err}"[:500]}}
            log(f"backend triton unavailable, training on torch: {report}")
            return "torch", report
        rep = report["triton"]
        if rep["loss_abs_diff_vs_torch"] > 2e-2 or rep["grad_rel_diff"] > 5e-2:
            log(f"backend triton disagrees with torch, training on torch: {report}")
            return "torch", report
        return "triton", report
    if args.backend != "probe":
        return args.backend, {}
    report, best = {}, None
    for name in ["torch", "triton"] if device.type == "cuda" else ["torch"]:
        try:
            rep = check_backend(name, make_model, batch, device, log) if name != "torch" else {}
            model = make_model(name).to(device)
            loss_fn(model, batch, device, device.type == "cuda").backward()
            sync(device)
            t = time.perf_counter()
            for _ in range(2):
                model.zero_grad(set_to_none=True)
                loss_fn(model, batch, device, device.type == "cuda").backward()
            sync(device)
            rep["step_s"] = (time.perf_counter() - t) / 2
            del model
        except Exception as err:  # a backend that cannot serve this machine is skipped, loudly
            report[name] = {"error": f"{type(err).__name__}: {err}"[:500]}
            log(f"backend {name}: unavailable ({report[name]['error'][:200]})")
            continue
        report[name] = rep
        log(f"backend {name}: {rep}")
        ok = rep.get("grad_rel_diff", 0.0) < 5e-2
        if ok and (best is None or rep["step_s"] < report[best]["step_s"]):
            best = name
    if best is None:
        raise RuntimeError(f"no KLA backend trained on {device}: {report}")
    return best, report


def process_noise_stats(model) -> dict:
    """Distribution of the KLA layers' process noise ``p`` and the share at/near the old floor."""
    values = []
    for name, p in model.named_parameters():
        if name.endswith("process_noise_log"):
            values.append(p.detach().float().exp().cpu().flatten())
        elif name.endswith("process_noise"):
            values.append(p.detach().float().clamp_min(OLD_FLOOR).cpu().flatten())
    if not values:
        return {}
    v = torch.cat(values).double().numpy()
    q = np.quantile(np.log10(v), [0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0])
    return {
        "entries": int(v.size),
        "fraction_at_floor_le_1.1e-7": float(np.mean(v <= 1.1 * OLD_FLOOR)),
        "fraction_near_floor_le_1e-6": float(np.mean(v <= 1e-6)),
        "fraction_le_1e-4": float(np.mean(v <= 1e-4)),
        "log10_quantiles": dict(
            zip(["0", "1", "10", "25", "50", "75", "90", "99", "100"], map(float, q), strict=True)
        ),
    }


def surprisal_information_link(model, held, n_windows=4, length=2048) -> dict:
    """Spearman rank correlation of per-token surprisal with the information the KLA layers add
    (``mean_information_bits``, per layer and summed over layers) on held-out windows."""
    import scipy.stats

    from kalmanscan.kla import inspect

    out = {}
    for dom in DOMAINS:
        data = held[dom]
        length_d = min(length, len(data))
        starts = np.linspace(0, len(data) - length_d, n_windows).astype(np.int64)
        ids = torch.from_numpy(np.stack([data[s : s + length_d] for s in starts]).astype(np.int64))
        ds = inspect(model, ids, detail=False)
        s = ds["surprisal"].values
        bits = ds["mean_information_bits"].values  # [layer, batch, time]
        per_layer = {}
        for i, layer in enumerate(ds["layer"].values):
            ok = ~np.isnan(s) & ~np.isnan(bits[i])
            per_layer[str(layer)] = float(scipy.stats.spearmanr(s[ok], bits[i][ok]).statistic)
        total = np.nansum(bits, axis=0)
        ok = ~np.isnan(s)
        out[dom] = {
            "windows": n_windows,
            "bytes_per_window": int(length_d),
            "tokens": int(ok.sum()),
            "spearman_summed_over_layers": float(scipy.stats.spearmanr(s[ok], total[ok]).statistic),
            "spearman_per_layer": per_layer,
            "mean_surprisal_bits": float(np.nanmean(s)),
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ckpt-dir", type=Path, default=None, help="resume checkpoint (default --out)")
    ap.add_argument(
        "--resume", action="store_true", help="continue from <ckpt-dir>/kla-lm-resume.pt"
    )
    ap.add_argument("--minutes", type=float, default=5.0, help="training time of the KLA model")
    ap.add_argument(
        "--total-minutes",
        type=float,
        default=None,
        help="wall-time limit of the whole script; the baseline stops early to keep it",
    )
    ap.add_argument(
        "--max-steps", type=int, default=None, help="planned steps (overrides --minutes)"
    )
    ap.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="end this run at that step (a checkpoint is written; --resume continues)",
    )
    ap.add_argument("--ckpt-minutes", type=float, default=2.0)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--n-layers", type=int, default=5)
    ap.add_argument("--d-state", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--english-fraction", type=float, default=0.3)
    ap.add_argument("--eval-bytes", type=int, default=1 << 21, help="held-out bytes per domain")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--process-noise-param", choices=("log", "raw"), default="log",
        help="how the KLA layers parameterize their process noise (default log: never on a floor)",
    )  # fmt: skip
    ap.add_argument("--backend", default="auto", help="KLA backend, 'auto' or 'probe'")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--skip-link", action="store_true", help="skip the surprisal correlation")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--data-root", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    ap.add_argument(
        "--package-bytes", type=float, default=0.0,
        help="add up to this many MB of installed packages' .py files (site-packages) to the "
        "Python data (the stdlib alone is ~10 MB on a Debian Python without its test suite)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = args.ckpt_dir or args.out
    ckpt_path = ckpt_dir / "kla-lm-resume.pt"
    log_file = open(args.out / "train.log", "a")

    def log(msg):
        msg = f"[{time.perf_counter() - t_start:6.1f}s] {msg}"
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    def left_s():
        if args.total_minutes is None:
            return math.inf
        return 60 * args.total_minutes - (time.perf_counter() - t_start)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    import os

    roots = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    train_data, held_data, data_info = load_corpus(
        args.data_root, roots, int(args.package_bytes * 1e6), workers=min(16, os.cpu_count() or 1)
    )
    log(f"data: {json.dumps({k: v for k, v in data_info.items() if k != 'recipe'})}")
    log(f"data loaded in {time.perf_counter() - t_start:.1f}s")
    windows = {d: eval_windows(held_data[d], args.seq_len, args.eval_bytes) for d in DOMAINS}
    p_eng = args.english_fraction
    if not 0.0 <= p_eng <= 1.0:
        raise ValueError(f"--english-fraction: expected a value in [0, 1], got {p_eng}")

    def batches(step):
        rng = np.random.default_rng([args.seed, step])
        rows = []
        for eng in rng.random(args.batch) < p_eng:
            src = train_data["english" if eng else "python"]
            s = int(rng.integers(0, len(src) - args.seq_len - 1))
            rows.append(src[s : s + args.seq_len + 1])
        out = torch.from_numpy(np.stack(rows).astype(np.int64))
        return out.pin_memory() if device.type == "cuda" else out

    kla_cfg = dict(d_state=args.d_state, process_noise_param=args.process_noise_param)

    def make_kla(backend):
        return KLALanguageModel(
            ModelConfig(
                d_model=args.d_model,
                n_layers=args.n_layers,
                mixers="kla",
                kla=KLAConfig(backend=backend, **kla_cfg),
            )
        )

    backend, backend_report = pick_backend(args, device, make_kla, batches(0)[:8], log)
    log(f"KLA backend: {backend} ({time.perf_counter() - t_start:.1f}s)")

    torch.manual_seed(args.seed)
    kla = make_kla(backend).to(device)
    n_kla = kla.num_parameters()
    trainer = Trainer(kla, args, device, batches, planned=args.max_steps)
    if args.resume:
        trainer.load_state_dict(torch.load(ckpt_path, map_location="cpu", weights_only=False))
        log(f"resumed from {ckpt_path} at step {trainer.step}/{trainer.planned}")

    def write_ckpt(state):
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(ckpt_path)
        log(f"  checkpoint: step {state['step']} -> {ckpt_path}")

    ckpt_every = 60 * args.ckpt_minutes
    if trainer.planned is None:
        # calibrate: time steps 10..40 (synchronized), then fix the planned step count
        calib = 40
        trainer.planned = 10**9
        trainer.run(until=10, log=lambda m: None)
        sync(device)
        t = time.perf_counter()
        trainer.run(until=calib, log=lambda m: None)
        sync(device)
        step_s = (time.perf_counter() - t) / (calib - 10)
        spent = t - t_start  # data, backend check, first 10 steps (compilation)
        budget = 60 * args.minutes - (time.perf_counter() - t) - 10 * step_s
        trainer.planned = max(calib, calib + int(budget / step_s))
        log(
            f"KLA model: {n_kla} parameters; {step_s * 1e3:.1f} ms/step -> {trainer.planned} "
            f"steps ({args.batch * args.seq_len / step_s:,.0f} tokens/s; setup {spent:.1f}s)"
        )
    else:
        log(f"KLA model: {n_kla} parameters; {trainer.planned} planned steps")
    kla_train = trainer.run(
        until=args.stop_after,
        stop_s=None if args.total_minutes is None else max(0.0, left_s() - 120),
        on_checkpoint=write_ckpt,
        ckpt_every_s=ckpt_every,
        log=log,
    )
    write_ckpt(trainer.state_dict())
    log(f"KLA trained: {kla_train['steps']} steps ({time.perf_counter() - t_start:.1f}s total)")

    def evaluate(model, label):
        res = {}
        for d in DOMAINS:
            res[d] = bits_per_byte(model, windows[d], device, 64, device.type == "cuda")
        log(f"{label}: held-out bits/byte {res}")
        return res

    kla_bpb = evaluate(kla, "KLA")
    set_backend(kla, "auto")  # the stored config is portable
    ckpt = save_checkpoint(
        kla.cpu(),
        args.out / "kla-lm",
        dtype=torch.float16,
        metadata={
            "tokenizer": "utf-8 bytes",
            "trained_on": (
                "CPython standard library"
                + (" and installed packages" if args.package_bytes > 0 else "")
                + ": Python source and English prose (docstrings, pydoc topics, LICENSE.txt)"
            ),
            "held_out_bits_per_byte": kla_bpb,
            "steps": kla_train["steps"],
        },
    )
    kla.to(device)
    set_backend(kla, backend)
    shipped = load_checkpoint(ckpt, device=device, backend=backend)
    shipped_bpb = evaluate(shipped, "KLA (stored float16 weights)")
    del shipped
    lz = {}
    for d in DOMAINS:
        scored = windows[d].numpy().astype(np.uint8).tobytes()
        lz[d] = lzma_bits_per_byte(scored)
    log(f"lzma (preset 9|EXTREME, the scored bytes): {lz}")

    results = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "data": data_info,
        "hyper": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "eval": {
            d: {
                "windows": len(windows[d]),
                "bytes_scored": int(windows[d][:, 1:].numel()),
                "held_out_bytes": int(len(held_data[d])),
                "context": args.seq_len,
            }
            for d in DOMAINS
        },
        "lzma_bits_per_byte": lz,
        "lzma_note": "lzma.compress(preset=9|PRESET_EXTREME) of the concatenated scored windows "
        "(each window's seq_len+1 bytes), no preset dictionary",
        "kla_backend": backend,
        "kla_backend_check": backend_report,
        "kla": {
            "params": n_kla,
            "safetensors_bytes": (ckpt / "model.safetensors").stat().st_size,
            "config": kla.config.to_dict(),
            **kla_train,
            "held_out_bits_per_byte": kla_bpb,
            "held_out_bits_per_byte_float16_weights": shipped_bpb,
            "process_noise": process_noise_stats(kla),
        },
    }
    metrics_path = args.out / "kla-lm-metrics.json"

    def write_metrics():
        results["total_s"] = time.perf_counter() - t_start
        metrics_path.write_text(json.dumps(results, indent=2) + "\n")

    write_metrics()
    if not args.skip_link:
        try:
            results["surprisal_information_link"] = surprisal_information_link(kla, held_data)
            log(f"surprisal vs information added: {results['surprisal_information_link']}")
        except Exception as err:  # recorded; the model and metrics are written regardless
            results["surprisal_information_link"] = {"error": f"{type(err).__name__}: {err}"}
            log(f"surprisal link failed: {err}")
        write_metrics()
    if not args.skip_baseline:
        del trainer
        kla.cpu()
        if device.type == "cuda":
            torch.cuda.empty_cache()

        # Same parameter count: the widest 4-head attention model not above the KLA model's size.
        def make_att(d):
            return KLALanguageModel(
                ModelConfig(
                    d_model=d,
                    n_layers=args.n_layers,
                    mixers="attention",
                    attention=AttentionConfig(n_heads=4),
                )
            )

        width = max(
            d
            for d in range(16, 4 * args.d_model, 16)
            if make_att(d).num_parameters() <= 1.02 * n_kla
        )
        torch.manual_seed(args.seed)
        att = make_att(width).to(device)
        log(f"attention baseline: width {width}, {att.num_parameters()} parameters, "
            f"{kla_train['steps']} steps")  # fmt: skip
        att_trainer = Trainer(att, args, device, batches, planned=kla_train["planned_steps"])
        stop = None if args.total_minutes is None else max(0.0, left_s() - 30)
        att_train = att_trainer.run(until=kla_train["steps"], stop_s=stop, log=log)
        att_bpb = evaluate(att, "attention")
        results["attention"] = {
            "params": att.num_parameters(),
            "config": att.config.to_dict(),
            **att_train,
            "held_out_bits_per_byte": att_bpb,
        }
        write_metrics()
    log(f"total {time.perf_counter() - t_start:.1f}s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
