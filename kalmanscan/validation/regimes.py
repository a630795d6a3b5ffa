"""The regime battery: every scalar backend and the dense API against the mpmath oracle.

Valid but degenerate models (issue 21): no process noise with |decay| below, at and above 1;
tiny process variances; long series with long gaps; offsets; near-noise-free observations;
huge process variances; 1e6 and diffuse priors; dense models with singular Q, contracting F and
R -> 0 (KFAS's noiseless VAR(1) with missing data). The truth is :mod:`oracle` (mpmath).

Metrics (per lane and step, worst over the lane; :func:`mean_err_sd`, :func:`var_rel`,
:func:`loglik_rel`):

- **means** in posterior standard deviations: ``|m - m*| / max(sd*, FLOOR * scale)``, ``sd*``
  the truth's standard deviation at that step (filtered for filtered means, smoothed for
  smoothed ones), ``scale = max_t |m*_t|``. Where the posterior is narrower than ``FLOOR = 1e-4``
  of the lane's scale the bar becomes ``1e-10`` of the scale: no float64 mean resolves a state
  known to 1e-400 (OU with sigma2 = 0 after 2000 steps) beyond its own rounding.
- **variances** relative: ``|v - v*| / max(v*, TINY)``, ``TINY`` the dtype's smallest normal
  number times 2**mantissa (values the dtype cannot hold to full precision); ``inf`` must meet
  ``inf`` (diffuse), NaN NaN.
- **log-likelihood**: ``|l - l*| / max(|l*|, n, 1)``, ``n`` the number of contributing steps.

float64 passes a regime when every mean is within ``TOLERANCES[("oracle_sd", "float64")]``
(1e-6 sd) and every variance and the log-likelihood within ``TOLERANCES[("oracle",
"float64")]`` (1e-8); float32 figures are reported, not judged. A backend that raises on a
valid model fails with an infinite error and the exception named.

Layout: the regimes are defined in :mod:`~kalmanscan.validation.regime_definitions`, the
metrics in :mod:`~kalmanscan.validation.regime_metrics` and the tables in
:mod:`~kalmanscan.validation.regime_report`; this module runs them (:func:`regime_rows`,
:func:`gradient_rows`, :func:`validate_rows`) and is the command line:

    python -m kalmanscan.validation.regimes            # quick subset, table on stdout
    python -m kalmanscan.validation.regimes --full --markdown regimes.md --json regimes.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time

import numpy as np

from kalmanscan.testing import TOLERANCES
from kalmanscan.validation.metrics import worse
from kalmanscan.validation.regime_definitions import (  # noqa: F401 - re-exported
    KFAS_VAR1_F,
    KFAS_VAR1_Q,
    DenseRegime,
    ScalarRegime,
    _mixing,
    _near_noiseless_heads,
    dense_regimes,
    kfas_var1_data,
    scalar_regimes,
)
from kalmanscan.validation.regime_metrics import (  # noqa: F401 - re-exported
    COLUMNS,
    FLOOR,
    _dense_mean_sd,
    dense_errors,
    grad_rel,
    loglik_rel,
    mean_err_sd,
    passes,
    scalar_errors,
    var_rel,
)
from kalmanscan.validation.regime_report import (  # noqa: F401 - re-exported
    _e,
    compact_markdown,
    float32_markdown,
    format_text,
    grad_markdown,
    markdown,
)

__all__ = [
    "FLOOR",
    "ScalarRegime",
    "DenseRegime",
    "scalar_regimes",
    "dense_regimes",
    "mean_err_sd",
    "var_rel",
    "loglik_rel",
    "run_regimes",
    "regime_rows",
    "markdown",
]

SCALAR_BACKENDS = ("sequential", "torch", "native")
DENSE_BACKENDS = ("sequential", "torch", "native")
DTYPES = ("float64", "float32")


# --------------------------------------------------------------------------------------------
# running


def _cast(x, dtype):
    with np.errstate(over="ignore"):  # what overflows reaches the backend as inf: a refusal
        return np.asarray(x, dtype=np.float32 if dtype == "float32" else np.float64)


# runner labels of `kalmanscan validate` that are not backend names: (backend, device)
GPU_RUNNERS = {"torch-cuda": ("torch", "cuda"), "triton": ("triton", "cuda")}


def _run_scalar(reg: ScalarRegime, backend: str, dtype: str) -> dict:
    import torch

    import kalmanscan as ks

    backend, device = GPU_RUNNERS.get(backend, (backend, "cpu"))
    if device == "cpu":
        cast = lambda x: _cast(x, dtype)  # noqa: E731
    else:
        tdt = torch.float32 if dtype == "float32" else torch.float64
        cast = lambda x: torch.as_tensor(_cast(x, dtype), dtype=tdt, device=device)  # noqa: E731
    args = [cast(x) for x in (reg.z, reg.obs_var, reg.decay, reg.process_var)]
    kw = dict(
        loading=cast(reg.loading),
        offset=cast(reg.offset),
        prior_mean=cast(reg.prior_mean),
        prior_var=cast(reg.prior_var),
        backend=backend,
    )
    f = ks.filter(*args, **kw)
    s = ks.smooth(*args, **kw)
    # the log-likelihood-only path (what fitting calls) and the smoother's filter, where present
    lls = [float(f.loglik), float(s.filtered.loglik)]
    if hasattr(ks, "loglik"):
        lls.append(float(ks.loglik(*args, **kw)))

    def g(x):
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
        return np.asarray(x, dtype=np.float64)

    return dict(
        mean=g(f.mean),
        var=g(f.var),
        pred_mean=g(f.pred_mean),
        pred_var=g(f.pred_var),
        loglik=float(f.loglik),
        logliks=lls,
        smooth_mean=g(s.mean),
        smooth_var=g(s.var),
    )


def scalar_grad(reg: ScalarRegime, backend: str, dtype: str = "float64") -> dict:
    """d loglik / d (obs_var, decay, process_var, offset) from ``ks.loglik(...).backward()`` with
    the four parameters as 0-d tensors (constant-parameter regimes only)."""
    import torch

    import kalmanscan as ks

    from .oracle import GRAD_PARAMS

    backend, device = GPU_RUNNERS.get(backend, (backend, "cpu"))
    tdt = torch.float32 if dtype == "float32" else torch.float64

    def t(x):
        return torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=tdt, device=device)

    params = {
        k: t(float(np.asarray(getattr(reg, k)).flat[0])).requires_grad_() for k in GRAD_PARAMS
    }
    fn = ks.loglik if hasattr(ks, "loglik") else (lambda *a, **k: ks.filter(*a, **k).loglik)
    ll = fn(
        t(reg.z),
        params["obs_var"],
        params["decay"],
        params["process_var"],
        loading=t(reg.loading),
        offset=params["offset"],
        prior_mean=t(reg.prior_mean),
        prior_var=t(reg.prior_var),
        backend=backend,
    )
    ll.sum().backward()
    return {k: float(v.grad) if v.grad is not None else 0.0 for k, v in params.items()}


def _constant(reg: ScalarRegime) -> bool:
    return all(
        np.all(np.asarray(getattr(reg, k)) == np.asarray(getattr(reg, k)).flat[0])
        for k in ("obs_var", "decay", "process_var", "offset", "loading")
    )


GRAD_MAX_T = 20_000  # the gradient oracle costs five 120-digit passes: longer lanes are skipped


def oracle_grad(reg: ScalarRegime) -> tuple[dict, dict]:
    """``(vals, g)``: a constant-parameter regime's scalar parameters ``{obs_var, decay,
    process_var, offset}`` and the mpmath oracle's log-likelihood gradient in them
    (:func:`kalmanscan.validation.oracle.scalar_loglik_grad`), as :func:`grad_rel` compares."""
    from .oracle import scalar_loglik_grad

    vals = {
        k: float(np.asarray(getattr(reg, k)).flat[0])
        for k in ("obs_var", "decay", "process_var", "offset")
    }
    g = scalar_loglik_grad(
        reg.z,
        vals["obs_var"],
        vals["decay"],
        vals["process_var"],
        float(reg.loading[0]),
        vals["offset"],
        reg.prior_mean,
        reg.prior_var,
    )
    return vals, g


def gradient_rows(
    full: bool = False, backends=SCALAR_BACKENDS, progress=None, max_T=GRAD_MAX_T, names=None
):
    """d loglik / d parameters of every constant-parameter scalar regime, float64, against the
    oracle's (:func:`oracle.scalar_loglik_grad`); one dict per (regime, backend) with ``grad``
    (:func:`grad_rel`), ``passes`` (within ``TOLERANCES[("kernel_grad", "float64")]``) and
    ``error`` (what a backend raised)."""
    from kalmanscan.core import native

    say = progress or (lambda m: None)
    tol = TOLERANCES[("kernel_grad", "float64")]
    rows = []
    for reg in scalar_regimes(full):
        if not _constant(reg) or (max_T is not None and reg.T > max_T):
            continue
        if names and reg.name not in names:
            continue
        t0 = time.perf_counter()
        vals, g_star = oracle_grad(reg)
        say(f"{reg.name}: oracle gradient {time.perf_counter() - t0:.1f} s")
        for be in backends:
            if be == "native" and not native.available():
                continue
            row = dict(regime=reg.name, T=reg.T, backend=be, dtype="float64", error="")
            try:
                row["grad"] = grad_rel(scalar_grad(reg, be), g_star, vals)
            except Exception as exc:
                row["grad"], row["error"] = math.inf, f"{type(exc).__name__}: {exc}"[:200]
            row["passes"] = row["grad"] <= tol
            rows.append(row)
    return rows


def _run_dense(reg: DenseRegime, backend: str, dtype: str) -> dict:
    import torch

    import kalmanscan.dense as kd

    backend, device = GPU_RUNNERS.get(backend, (backend, "cpu"))
    c = lambda x: None if x is None else torch.as_tensor(_cast(x, dtype), device=device)  # noqa: E731
    kw = dict(
        offset=c(reg.offset),
        prior_mean=c(reg.prior_mean),
        prior_cov=c(reg.prior_cov),
        backend=backend,
    )
    mats = [c(x) for x in (reg.z, reg.F, reg.Q, reg.H, reg.R)]
    s = kd.smooth(*mats, **kw)
    f = s.filtered
    g = lambda x, t=np.float64: np.asarray(torch.as_tensor(x).cpu(), dtype=t)  # noqa: E731
    return dict(
        mean=g(f.mean),
        cov=g(f.cov),
        loglik=float(g(f.loglik)),
        diffuse=g(f.diffuse, bool),
        smooth_mean=g(s.mean),
        smooth_cov=g(s.cov),
    )


def _truth_moments(truth) -> dict:
    """An oracle result in the layout of :func:`_run_dense`'s output (to compare two oracles)."""
    return dict(
        mean=truth.mean,
        cov=truth.cov,
        loglik=truth.loglik,
        diffuse=truth.diffuse,
        smooth_mean=truth.smooth_mean,
        smooth_cov=truth.smooth_cov,
    )


def unheld_inputs(inputs: dict, dtype: str) -> tuple[str, ...]:
    """The names of the ``inputs`` (name -> float64 array) holding a value that ``dtype`` cannot
    hold: a finite value that rounds to +-inf (overflow) or a non-zero one that rounds to 0.

    >>> unheld_inputs(dict(z=[1.0, 1e78], obs_var=1e-155, decay=0.9), "float32")
    ('z', 'obs_var')
    >>> unheld_inputs(dict(z=[1.0, 1e78], obs_var=1e-155), "float64")
    ()
    """
    out = []
    for name, x in inputs.items():
        if x is None:
            continue
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(over="ignore", under="ignore"):
            y = _cast(x, dtype).astype(np.float64)
        fin = np.isfinite(x)
        if np.any(fin & np.isinf(y)) or np.any(fin & (x != 0) & (y == 0)):
            out.append(name)
    return tuple(out)


def _scalar_inputs(reg: ScalarRegime) -> dict:
    keys = ("z", "obs_var", "decay", "process_var", "loading", "offset", "prior_mean", "prior_var")
    return {k: getattr(reg, k) for k in keys}


def _dense_inputs(reg: DenseRegime) -> dict:
    keys = ("z", "F", "Q", "H", "R", "offset", "prior_mean", "prior_cov")
    return {k: getattr(reg, k) for k in keys}


def refusal(exc: Exception, dtype: str, unheld=()) -> bool:
    """A documented refusal, not a failure: a ValueError that names the backend to use instead
    (STYLE: a backend that cannot serve a call raises and names one that can), or one that names
    an input the dtype cannot hold (``unheld``, from :func:`unheld_inputs`: in float32
    ``obs_var = 1e-155`` rounds to 0, and the data of ``process_var = 1e155`` overflow to inf).
    A ValueError about an input the dtype holds is a failure (``dtype`` enters through
    ``unheld`` only).

    >>> refusal(ValueError("z: expected finite values, got inf"), "float32", unheld=("z",))
    True
    >>> refusal(ValueError("z: expected finite values, got inf"), "float32", unheld=("obs_var",))
    False
    """
    if not isinstance(exc, ValueError):
        return False
    msg = str(exc)
    if "use backend=" in msg:
        return True
    return any(re.search(rf"\b{re.escape(name)}\b", msg) for name in unheld)


def _dense_native() -> bool:
    try:
        from kalmanscan.dense import native as dense_native
    except ImportError:
        return False
    return bool(dense_native.available())


def regime_rows(
    full: bool = False,
    backends=SCALAR_BACKENDS,
    dense_backends=DENSE_BACKENDS,
    dtypes=DTYPES,
    certify: bool = True,
    progress=None,
    names=None,
    sequential_max_T: int | None = None,
) -> list[dict]:
    """Run every regime on every backend and dtype; one dict per (regime, backend, dtype).
    ``sequential_max_T``: the scalar ``sequential`` backend (a Python loop over steps) skips
    longer regimes (None: it runs them all).

    Keys: ``kind`` ("scalar"/"dense"), ``regime``, ``T``, ``backend``, ``dtype``, the five
    error columns (:data:`COLUMNS`), ``passes`` (True/False; None for float32), ``error``
    (the exception a backend raised, else ""), ``oracle_dps`` and ``oracle_own`` (the oracle's
    change at 25 more digits, 40 for the dense oracle, worst of its metrics), ``seconds``
    (the backend's run).
    """
    from kalmanscan.core import native

    from .oracle import dense_oracle, scalar_oracle

    say = progress or (lambda m: None)
    rows = []
    avail = [b for b in backends if b != "native" or native.available()]
    dense_backends = [b for b in dense_backends if b != "native" or _dense_native()]
    for reg in scalar_regimes(full):
        if names and reg.name not in names:
            continue
        t0 = time.perf_counter()
        tr = scalar_oracle(
            reg.z,
            reg.obs_var,
            reg.decay,
            reg.process_var,
            reg.loading,
            reg.offset,
            reg.prior_mean,
            reg.prior_var,
            certify=certify,
        )
        own = max(tr.own_error.values()) if tr.own_error else float("nan")
        say(f"{reg.name}: oracle {time.perf_counter() - t0:.1f} s at {tr.dps} digits")
        for be in avail:
            if be == "sequential" and sequential_max_T is not None and reg.T > sequential_max_T:
                continue
            for dt in dtypes:
                row = dict(kind="scalar", regime=reg.name, T=reg.T, backend=be, dtype=dt)
                t1 = time.perf_counter()
                try:
                    errs = scalar_errors(_run_scalar(reg, be, dt), tr, dt)
                    row["error"] = ""
                except Exception as exc:  # a raise on a valid model is a failure, not a crash
                    errs = {k: math.inf for k in COLUMNS}
                    row["error"] = f"{type(exc).__name__}: {exc}"[:200]
                    row["refused"] = refusal(exc, dt, unheld_inputs(_scalar_inputs(reg), dt))
                row.update(errs)
                row.update(
                    passes=None if row.get("refused") else passes(errs, dt),
                    oracle_dps=tr.dps,
                    oracle_own=own,
                    seconds=time.perf_counter() - t1,
                )
                rows.append(row)
    for reg in dense_regimes(full):
        if names and reg.name not in names:
            continue
        t0 = time.perf_counter()
        args = (reg.z, reg.F, reg.Q, reg.H, reg.R)
        kw = dict(offset=reg.offset, prior_mean=reg.prior_mean, prior_cov=reg.prior_cov)
        tr = dense_oracle(*args, **kw)
        own = float("nan")
        if certify:  # the oracle's change at 40 more digits (60 were not enough on some models)
            tr2 = dense_oracle(*args, **kw, dps=tr.dps + 40)
            own = max(dense_errors(_truth_moments(tr2), tr).values())
        say(f"{reg.name}: dense oracle {time.perf_counter() - t0:.1f} s")
        for be in dense_backends:
            for dt in dtypes:
                if be == "sequential" and dt == "float32":
                    continue  # the dense sequential reference is float64 only
                row = dict(kind="dense", regime=reg.name, T=reg.z.shape[0], backend=be, dtype=dt)
                t1 = time.perf_counter()
                try:
                    errs = dense_errors(_run_dense(reg, be, dt), tr)
                    row["error"] = ""
                except Exception as exc:
                    errs = {k: math.inf for k in COLUMNS}
                    row["error"] = f"{type(exc).__name__}: {exc}"[:200]
                    row["refused"] = refusal(exc, dt, unheld_inputs(_dense_inputs(reg), dt))
                row.update(errs)
                row.update(
                    passes=None if row.get("refused") else passes(errs, dt),
                    oracle_dps=tr.dps,
                    oracle_own=own,
                    seconds=time.perf_counter() - t1,
                )
                rows.append(row)
    return rows


def run_regimes(full: bool = False, **kw) -> list[dict]:
    """Alias of :func:`regime_rows` (kept for the validate command)."""
    return regime_rows(full=full, **kw)


# the regimes `kalmanscan validate` runs by default (each broke a backend before the projective
# representation and the two-filter smoother); --full runs them all
VALIDATE_QUICK = (
    "p=0 a=0.9577 c=0.4 T=1000",
    "OU theta=0.5 sigma2=0, 500 steps",
    "obs_var 1e-155, a=0.9 p=1",
    "process_var 1e155, a=0.9",
    "diffuse, first 50 missing, a=0.95 p=0",
    "KFAS VAR(1), missing data, R=1e-10 I",
    "KFAS VAR(1), missing data, R=0 I",
)
QUANTITY = {
    "filter_mean_sd": "filtered mean (sd)",
    "filter_var": "filtered var",
    "loglik": "loglik",
    "smooth_mean_sd": "smoothed mean (sd)",
    "smooth_var": "smoothed var",
}


def validate_rows(
    full: bool = False, backends=None, progress=None, sequential_max_T: int | None = None
) -> list[dict]:
    """The regime battery as rows of ``kalmanscan validate``'s table (format:
    :mod:`kalmanscan.validation`): worst error over the regimes per (truth, quantity, dtype,
    backend). float64 rows carry the oracle tolerances; float32 rows are figures (tolerance
    inf). Refusals (:func:`refusal`) are left out of the worst case and of ``n_models``; any
    other raise is an infinite error, which fails the row even at tolerance inf. The oracle's
    self-check at +25 digits is left to the tests and ``python -m ...regimes``. ``backends``
    (runner labels) selects the scalar and the dense backends (:data:`DENSE_BACKENDS` among
    them); ``None``: all. ``sequential_max_T``: as in :func:`regime_rows` (the command passes
    the scalar battery's cap, :class:`~kalmanscan.validation.battery.BatteryConfig`).
    """
    names = None if full else VALIDATE_QUICK
    kw = {}
    if backends is not None:
        kw = dict(
            backends=tuple(backends),
            dense_backends=tuple(b for b in DENSE_BACKENDS if b in backends),
        )
    rows = regime_rows(
        full=full,
        certify=False,
        progress=progress,
        names=names,
        sequential_max_T=sequential_max_T,
        **kw,
    )
    grads = gradient_rows(
        full=full,
        backends=[b for b in kw.get("backends", SCALAR_BACKENDS) if b not in GPU_RUNNERS],
        progress=progress,
        names=names,
    )
    out: dict[tuple, dict] = {}
    for g in grads:
        row = out.setdefault(
            ("grad", g["backend"]),
            dict(
                truth="mpmath oracle (regimes)",
                quantity="d loglik / d params",
                dtype="float64",
                backend=g["backend"],
                max_rel_err=0.0,
                tol=TOLERANCES[("kernel_grad", "float64")],
                n_models=0,
                worst_model="",
            ),
        )
        row["n_models"] += 1
        if worse(g["grad"], row["max_rel_err"]):
            row["max_rel_err"] = g["grad"]
            row["worst_model"] = g["regime"] + (f" ({g['error'][:80]})" if g["error"] else "")
    for r in rows:
        if r.get("refused"):
            continue
        truth = "mpmath oracle (regimes)" if r["kind"] == "scalar" else "dense: mpmath oracle"
        for col, q in QUANTITY.items():
            key = (truth, q, r["dtype"], r["backend"])
            if r["dtype"] == "float64":
                tol = TOLERANCES[("oracle_sd" if col.endswith("mean_sd") else "oracle", "float64")]
            else:
                tol = math.inf
            row = out.setdefault(
                key,
                dict(
                    truth=truth,
                    quantity=q,
                    dtype=r["dtype"],
                    backend=r["backend"],
                    max_rel_err=0.0,
                    tol=tol,
                    n_models=0,
                    worst_model="",
                ),
            )
            row["n_models"] += 1
            err = r[col]
            if worse(err, row["max_rel_err"]):
                row["max_rel_err"] = err
                row["worst_model"] = r["regime"] + (f" ({r['error'][:80]})" if r["error"] else "")
    return list(out.values())


def _run_stamp(rows: list[dict]):
    """The ``date`` and ``device`` of each ``--json`` row (the file stays a list of rows): the
    CUDA device for the ``GPU_RUNNERS`` rows, else the CPU model (:mod:`.run_meta`)."""
    from kalmanscan.validation.run_meta import cpu_model, utc_now

    date, cpu, gpu = utc_now(), cpu_model(), None
    if any(r["backend"] in GPU_RUNNERS for r in rows):
        import torch

        gpu = torch.cuda.get_device_name()
    return lambda r: {"date": date, "device": gpu if r["backend"] in GPU_RUNNERS else cpu}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="The regime battery against the mpmath oracle.")
    p.add_argument("--full", action="store_true", help="every regime (10^5-step lanes included)")
    p.add_argument("--markdown", metavar="PATH")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--backend", action="append", help="scalar backends (default all)")
    p.add_argument(
        "--dense-backend",
        action="append",
        help="dense backends (default sequential, torch, native; GPU: torch-cuda, triton)",
    )
    p.add_argument("--regime", action="append", help="only these regime names")
    p.add_argument("--no-certify", action="store_true", help="skip the oracle's self-check")
    p.add_argument("--no-grad", action="store_true", help="skip the log-likelihood gradients")
    p.add_argument(
        "--before", metavar="JSON", help="an earlier --json run: adds its failures as a column"
    )
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    rows = regime_rows(
        full=args.full,
        backends=tuple(args.backend) if args.backend else SCALAR_BACKENDS,
        dense_backends=tuple(args.dense_backend) if args.dense_backend else DENSE_BACKENDS,
        certify=not args.no_certify,
        progress=lambda m: print(f"  .. {m}", flush=True),
        names=args.regime,
    )
    print(format_text(rows))
    grads = (
        []
        if args.no_grad
        else gradient_rows(
            full=args.full,
            backends=tuple(args.backend) if args.backend else SCALAR_BACKENDS,
            progress=lambda m: print(f"  .. {m}", flush=True),
            names=args.regime,
        )
    )
    for g in grads:
        st = "PASS" if g["passes"] else "FAIL"
        print(
            f"{'d loglik/d params: ' + g['regime']:60s} {g['backend']:10s} "
            f"{_e(g['grad']):>10s}  {st} {g['error'][:60]}"
        )
    bad = [r for r in rows if r["passes"] is False] + [g for g in grads if not g["passes"]]
    print(f"{len(rows)} rows, {time.perf_counter() - t0:.1f} s: {len(bad)} float64 rows fail")
    if args.markdown:
        before = None
        if args.before:
            with open(args.before) as f:
                before = json.load(f)
        with open(args.markdown, "w") as f:
            f.write(compact_markdown(rows, before) + "\n\n")
            if grads:
                f.write(grad_markdown(grads) + "\n\n")
            f.write(float32_markdown(rows) + "\n\n")
            f.write(markdown(rows, "float64") + "\n\nfloat32:\n\n" + markdown(rows, "float32"))
            f.write("\n")
    if args.json:
        stamp = _run_stamp(rows + grads)
        out = [dict(r, **stamp(r)) for r in rows]
        out += [dict(g, kind="grad", **stamp(g)) for g in grads]
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=float)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
