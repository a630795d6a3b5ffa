"""The validation battery: every truth against kalmanscan, on every backend, in float64 and float32.

:func:`run_battery` returns a :class:`BatteryResult` whose ``rows`` are the table printed by
``kalmanscan validate`` (row format: :mod:`kalmanscan.validation`) and whose ``records`` keep one
error per (lane, truth, quantity, dtype, backend) for figures. Its ``timings`` are process CPU
seconds (``time.process_time``), per truth, runner and part and per batch of lanes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .metrics import elementwise, loglik_error, normwise, worse
from .models import LaneBatch, growth_families, named_regimes, random_batch
from .tolerances import tolerance
from .truths import NotApplicable, Truth, dense_truth, filterpy_truth

__all__ = [
    "Runner",
    "available_runners",
    "BatteryConfig",
    "BatteryResult",
    "run_battery",
    "QUANTITIES",
]

QUANTITIES = (
    "filtered mean",
    "filtered var",
    "predicted mean",
    "predicted var",
    "loglik",
    "smoothed mean",
    "smoothed var",
)
DTYPES = ("float64", "float32")
# the dense oracle is compared only where its own rounding estimate is below this share of the
# tolerance (truths.dense_truth, docs/validation.md)
CERTIFY_SHARE = 0.1


class Runner(NamedTuple):
    """One way to run kalmanscan: a report label, a backend name and a torch device."""

    label: str
    backend: str
    device: str


def available_runners() -> list[Runner]:
    """``sequential``, ``torch`` and (when built) ``native`` on the CPU; on CUDA also ``torch`` and
    ``triton`` on the GPU.

    >>> [r.label for r in available_runners()][:2]
    ['sequential', 'torch']
    """
    import importlib.util

    import torch

    from kalmanscan.core import native

    runners = [Runner("sequential", "sequential", "cpu"), Runner("torch", "torch", "cpu")]
    if native.available():
        runners.append(Runner("native", "native", "cpu"))
    if torch.cuda.is_available():
        runners.append(Runner("torch-cuda", "torch", "cuda"))
        if importlib.util.find_spec("triton") is not None:
            runners.append(Runner("triton", "triton", "cuda"))
    return runners


@dataclass
class BatteryConfig:
    """Sizes of one battery run; :meth:`quick_config` and :meth:`full_config` are the two presets.

    ``sequential_max_T``: the ``sequential`` runner (a Python loop over steps, kept as the readable
    reference, not for speed) skips longer lanes; every other runner and every truth still runs
    them. ``dense_max_T``: the O(T^2) dense oracle skips longer lanes (filterpy still covers them).
    """

    seed: int = 0
    random_lengths: tuple[int, ...] = (1, 2, 7, 63, 200, 1000)
    lanes_per_length: int = 8
    growth_lengths: tuple[int, ...] = (16, 64, 256, 1024, 4096)
    quick: bool = True
    named_regimes: bool = True
    dense_checks: bool = True
    dense_max_T: int = 1000
    sequential_max_T: int = 5000

    @classmethod
    def quick_config(cls, seed: int = 0) -> BatteryConfig:
        return cls(seed=seed)

    @classmethod
    def full_config(cls, seed: int = 0) -> BatteryConfig:
        return cls(
            seed=seed,
            random_lengths=(1, 2, 3, 7, 63, 128, 500, 1000, 2000, 5000),
            lanes_per_length=40,
            growth_lengths=(16, 64, 256, 1024, 4096, 16384, 100_000),
            quick=False,
            dense_max_T=2000,
            # the growth study up to 16384 steps and every random length; the 10^5-step lanes
            # (two named regimes and the growth study's last length) would take minutes of CPU
            # in the Python loop and are run by the torch and native runners
            sequential_max_T=16_384,
        )


@dataclass
class BatteryResult:
    """``rows``: the table; ``records``: every single error; ``timings``: process CPU seconds,
    ``{part: s}`` (a truth, a runner label, ``"compare"``, ``"dense checks"``, ``"total"``) with
    ``"batches"`` a list of ``{"batch", "T", "lanes", part: s}``, one per batch of lanes."""

    rows: list[dict]
    records: list[dict] = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(row_passes(r) for r in self.rows)


def row_passes(row: dict) -> bool:
    """A row passes when its worst error is a finite number no larger than its tolerance: an
    infinite error (a backend that raised) fails even against an unbounded tolerance (the
    float32 rows of the regime battery, reported, not judged).

    >>> row_passes(dict(max_rel_err=1e-3, tol=float("inf")))
    True
    >>> row_passes(dict(max_rel_err=float("inf"), tol=float("inf")))
    False
    """
    err = row["max_rel_err"]
    return math.isfinite(err) and err <= row["tol"]


class _Collector:
    """Worst error per (truth, quantity, dtype, backend); every single error kept as a record."""

    def __init__(self):
        self.worst: dict[tuple, dict] = {}
        self.records: list[dict] = []

    def add(self, truth, quantity, dtype, backend, err, model, T, family):
        key = (truth, quantity, dtype, backend)
        row = self.worst.get(key)
        if row is None:
            row = self.worst[key] = dict(
                truth=truth,
                quantity=quantity,
                dtype=dtype,
                backend=backend,
                max_rel_err=0.0,
                tol=tolerance(truth, quantity, dtype),
                n_models=0,
                worst_model="",
            )
        row["n_models"] += 1
        err = float(err)
        if worse(err, row["max_rel_err"]):  # NaN and larger both win; a NaN stays
            row["max_rel_err"], row["worst_model"] = err, model
        self.records.append(
            dict(
                truth=truth,
                quantity=quantity,
                dtype=dtype,
                backend=backend,
                rel_err=err,
                model=model,
                T=int(T),
                family=family,
            )
        )

    def rows(self) -> list[dict]:
        return list(self.worst.values())


def _np_dtype(dtype: str):
    return np.float32 if dtype == "float32" else np.float64


def run_kalmanscan(batch: LaneBatch, runner: Runner, dtype: str) -> dict:
    """Filter and smooth a batch with one runner; float64 numpy arrays ``[T, N]`` (loglik ``[N]``).

    Inputs are cast to ``dtype`` first (so float32 includes the rounding of the inputs).
    """
    import torch

    import kalmanscan as ks

    arrays = dict(
        z=batch.z,
        obs_var=batch.obs_var,
        decay=batch.decay,
        process_var=batch.process_var,
        loading=batch.loading,
        offset=batch.offset,
        prior_mean=batch.prior_mean,
        prior_var=batch.prior_var,
    )
    if runner.device == "cpu":
        conv = {k: v.astype(_np_dtype(dtype)) for k, v in arrays.items()}
    else:
        tdt = torch.float32 if dtype == "float32" else torch.float64
        conv = {k: torch.as_tensor(v, dtype=tdt, device=runner.device) for k, v in arrays.items()}
    kw = {k: conv[k] for k in ("loading", "offset", "prior_mean", "prior_var")}
    args = (conv["z"], conv["obs_var"], conv["decay"], conv["process_var"])
    s = ks.smooth(*args, **kw, backend=runner.backend)  # its .filtered is what ks.filter returns
    f = s.filtered

    def out(x):
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
        return np.asarray(x, dtype=np.float64)

    return dict(
        mean=out(f.mean),
        var=out(f.var),
        pred_mean=out(f.pred_mean),
        pred_var=out(f.pred_var),
        loglik=out(f.loglik),
        smooth_mean=out(s.mean),
        smooth_var=out(s.var),
    )


def _run_or_raised(batch: LaneBatch, runner: Runner, dtype: str) -> tuple[dict, str]:
    """:func:`run_kalmanscan`, or where it raises, outputs of NaN (every error then infinite:
    the rows fail) and the exception as a note for the worst model; the rest of the battery
    runs on."""
    try:
        return run_kalmanscan(batch, runner, dtype), ""
    except Exception as exc:  # a raise on a valid model is a failure, not a crash
        T, N = batch.shape
        nan = np.full((T, N), np.nan)
        out = dict(mean=nan, var=nan, pred_mean=nan, pred_var=nan, loglik=np.full(N, np.nan))
        out.update(smooth_mean=nan, smooth_var=nan)
        return out, f" ({type(exc).__name__}: {exc})"[:200]


def lane_errors(ks_out: dict, n: int, truth: Truth) -> dict[str, float]:
    """Errors of lane ``n`` of a kalmanscan run against one truth, per quantity."""
    e = {
        "filtered mean": normwise(ks_out["mean"][:, n], truth.mean),
        "filtered var": elementwise(ks_out["var"][:, n], truth.var),
        "loglik": loglik_error(ks_out["loglik"][n], truth.loglik, truth.n_loglik_terms),
        "smoothed mean": normwise(ks_out["smooth_mean"][:, n], truth.smooth_mean),
        "smoothed var": elementwise(ks_out["smooth_var"][:, n], truth.smooth_var),
    }
    if truth.pred_mean is not None:
        e["predicted mean"] = normwise(ks_out["pred_mean"][:, n], truth.pred_mean)
        e["predicted var"] = elementwise(ks_out["pred_var"][:, n], truth.pred_var)
    return e


def _certified(truth: Truth, quantity: str, dtype: str, truth_name: str) -> bool:
    if truth.own_error is None:
        return True
    own = truth.own_error["loglik" if quantity == "loglik" else "moments"]
    return own <= CERTIFY_SHARE * tolerance(truth_name, quantity, dtype)


TRUTHS: dict[str, Callable] = {"filterpy": filterpy_truth, "dense oracle": dense_truth}


def _timed(timings: dict, part: str, t0: float) -> float:
    """Add the process CPU time since ``t0`` to ``timings[part]`` and to the current batch's
    entry; returns the new start."""
    t1 = time.process_time()
    timings[part] = timings.get(part, 0.0) + t1 - t0
    batches = timings.get("batches")
    if batches:
        batches[-1][part] = batches[-1].get(part, 0.0) + t1 - t0
    return t1


def _battery_batch(col, batch, runners, cfg, family, timings):
    T, N = batch.shape
    timings.setdefault("batches", []).append(dict(batch=batch.family, T=T, lanes=N))
    truths: dict[str, list] = {}
    for name, fn in TRUTHS.items():
        if name == "dense oracle" and T > cfg.dense_max_T:
            continue
        t0 = time.process_time()
        lst = []
        for lane in batch.lanes():
            try:
                lst.append(fn(lane))
            except NotApplicable:
                lst.append(None)
        truths[name] = lst
        _timed(timings, name, t0)
    for runner in runners:
        if runner.backend == "sequential" and T > cfg.sequential_max_T:
            continue
        for dtype in DTYPES:
            t0 = time.process_time()
            out, raised = _run_or_raised(batch, runner, dtype)
            t0 = _timed(timings, runner.label, t0)
            for name, lst in truths.items():
                for n, tr in enumerate(lst):
                    if tr is None:
                        continue
                    model = batch.names[n] + raised
                    for q, err in lane_errors(out, n, tr).items():
                        if _certified(tr, q, dtype, name):
                            col.add(name, q, dtype, runner.label, err, model, T, family)
            _timed(timings, "compare", t0)


def _vanloan_rows(col, cfg):
    import kalmanscan as ks

    from .vanloan import van_loan_ou, vanloan_grid

    th, s2, dt = vanloan_grid(cfg.quick)
    truth = np.array([van_loan_ou(*v) for v in zip(th, s2, dt, strict=True)])
    tiny32 = float(np.finfo(np.float32).tiny)
    for dtype in DTYPES:
        cast = _np_dtype(dtype)
        a, p = ks.discretize_ou(th.astype(cast), s2.astype(cast), dt.astype(cast))
        for qi, (q, got) in enumerate((("decay", a), ("process_var", p))):
            ref = truth[:, qi]
            for i in range(len(th)):
                if dtype == "float32" and not tiny32 <= ref[i] <= float(np.finfo(np.float32).max):
                    continue  # outside float32's normal range
                err = elementwise(np.array([got[i]]), np.array([ref[i]]))
                col.add(
                    "scipy expm (Van Loan)",
                    q,
                    dtype,
                    "-",
                    err,
                    f"theta={th[i]:g},sigma2={s2[i]:g},dt={dt[i]:g}",
                    1,
                    "van loan",
                )


def _nile_rows(col, runners):
    from .models import LaneBatch
    from .nile import DK_MISSING, NILE_PARAMS, load_nile, statsmodels_local_level

    _, flow = load_nile()
    gappy = flow.copy()
    gappy[DK_MISSING] = np.nan
    lanes_z, names, params = [], [], []
    for label, z in (("Nile", flow), ("Nile DK gaps", gappy)):
        for ov, lv in NILE_PARAMS:
            lanes_z.append(z)
            names.append(f"{label} obs_var={ov:g} level_var={lv:g}")
            params.append((ov, lv))
    T, N = flow.shape[0], len(lanes_z)
    batch = LaneBatch(
        family="nile",
        z=np.stack(lanes_z, axis=1),
        obs_var=np.broadcast_to(np.array([p[0] for p in params]), (T, N)).copy(),
        decay=np.ones((T, N)),
        process_var=np.broadcast_to(np.array([p[1] for p in params]), (T, N)).copy(),
        loading=np.ones((T, N)),
        offset=np.zeros((T, N)),
        prior_mean=np.zeros(N),
        prior_var=np.full(N, np.inf),
        names=names,
    )
    refs = [statsmodels_local_level(batch.z[:, n], *params[n]) for n in range(N)]
    for runner in runners:
        for dtype in DTYPES:
            out, raised = _run_or_raised(batch, runner, dtype)
            for n, ref in enumerate(refs):
                errs = {
                    "filtered mean": normwise(out["mean"][:, n], ref["mean"]),
                    "filtered var": elementwise(out["var"][:, n], ref["var"]),
                    "loglik": loglik_error(out["loglik"][n], ref["loglik"], ref["n_terms"]),
                    "smoothed mean": normwise(out["smooth_mean"][:, n], ref["smooth_mean"]),
                    "smoothed var": elementwise(out["smooth_var"][:, n], ref["smooth_var"]),
                }
                for q, err in errs.items():
                    model = names[n] + raised
                    col.add("statsmodels (Nile)", q, dtype, runner.label, err, model, T, "nile")


def _dense_model_rows(quick: bool, backends=None) -> list[dict]:
    """Rows of the dense (matrix) state-space checks, when ``dense_checks.py`` is present;
    ``backends``: only the rows of these runner labels (the battery's runners), the others
    not run where ``check_dense`` takes ``backends=``."""
    import inspect

    try:
        from .dense_checks import check_dense
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.endswith("dense_checks"):
            return []
        raise
    try:
        if backends is None:
            return [dict(r) for r in check_dense(quick)]
        if "backends" in inspect.signature(check_dense).parameters:
            rows = check_dense(quick, backends=list(backends))
        else:
            rows = check_dense(quick)
        return [dict(r) for r in rows if r["backend"] in backends or r["backend"] == "-"]
    except Exception as exc:  # report it as a failing row; keep the rest of the table
        return [
            dict(
                truth="dense checks",
                quantity="(raised)",
                dtype="-",
                backend="-",
                max_rel_err=float("nan"),
                tol=0.0,
                n_models=0,
                worst_model=f"{type(exc).__name__}: {exc}"[:300],
            )
        ]


def run_battery(
    quick: bool = True,
    seed: int = 0,
    runners: list[Runner] | None = None,
    progress: Callable[[str], None] | None = None,
    config: BatteryConfig | None = None,
) -> BatteryResult:
    """Run every truth against kalmanscan and collect the worst error per row.

    >>> cfg = BatteryConfig(random_lengths=(7,), lanes_per_length=2, growth_lengths=(16,))
    >>> res = run_battery(config=cfg, runners=[Runner("torch", "torch", "cpu")])  # doctest: +SKIP
    >>> res.ok  # doctest: +SKIP
    True
    """
    cfg = config or (BatteryConfig.quick_config(seed) if quick else BatteryConfig.full_config(seed))
    runners = available_runners() if runners is None else runners
    t_start = time.perf_counter()
    report = progress or (lambda msg: None)

    c_start = time.process_time()

    def say(msg):
        wall, cpu = time.perf_counter() - t_start, time.process_time() - c_start
        report(f"[{wall:6.1f} s, CPU {cpu:6.1f} s] {msg}")

    col = _Collector()
    timings: dict = {}
    t_cpu = time.process_time()
    say("Van Loan (scipy expm) vs discretize_ou")
    t0 = time.process_time()
    _vanloan_rows(col, cfg)
    t0 = _timed(timings, "Van Loan", t0)
    say("statsmodels exact-diffuse local level on Nile")
    _nile_rows(col, runners)
    _timed(timings, "Nile", t0)
    batches = [random_batch(cfg.seed, T, cfg.lanes_per_length) for T in cfg.random_lengths]
    if cfg.named_regimes:
        batches += named_regimes(cfg.seed, cfg.quick)
    for b in batches:
        say(f"{b.family}: {b.shape[1]} lanes x {b.shape[0]} steps")
        _battery_batch(col, b, runners, cfg, b.family, timings)
    for T in cfg.growth_lengths:
        b = growth_families(cfg.seed, T)
        say(f"error against length: {b.shape[1]} lanes x {T} steps")
        _battery_batch(col, b, runners, cfg, "growth", timings)
    rows = col.rows()
    say("dense state-space checks")
    t0 = time.process_time()
    if cfg.dense_checks:
        rows += _dense_model_rows(cfg.quick, [r.label for r in runners])
    timings["dense checks"] = time.process_time() - t0
    say("done")
    timings["total"] = time.process_time() - t_cpu
    return BatteryResult(rows=rows, records=col.records, timings=timings)
