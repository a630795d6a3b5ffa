"""Extreme numerical regimes of the filter on CPU: worst error of each path against float64.

Every regime is a model (decay near/at 0 and 1, process variance 0 and huge, observation variance
1e-12 and 1e12, diffuse priors, never-observed lanes, long lanes up to 1e6 steps, ...) filtered by

- ``torch`` (chunked parallel scans) in float64 and float32, and ``sequential`` in float32,

and compared with the float64 sequential reference of the same model: the ``sequential`` backend
for short inputs, and for long single lanes (where the step-by-step torch loop costs ~0.1 ms a step)
a scalar float64 transcription of the same information-form recursion, checked against the
``sequential`` backend in the same run (row ``reference-check``).

Errors (``kalmanscan.testing.rel_error``): ``mean`` relative to ``max |mean|`` (floor 1e-3 of it),
``var`` purely relative (variances are positive), ``loglik`` relative to ``max(1, |loglik|)``.
A non-finite entry where the reference is finite (or the reverse) counts as an infinite error.
float32 rows report two errors: against the float64 model (what a user gets, including the
rounding of the inputs to float32) and against the float64 filter of the float32-rounded model
(the filter's own error).

    python benchmarks/reliability.py [--quick] [--json benchmarks/results/reliability-cpu.json]
                                     [--markdown benchmarks/results/reliability-cpu.md]
"""

# ruff: noqa: E501  (markdown rows and report strings)
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kalmanscan as ks  # noqa: E402
from kalmanscan.testing import rel_error, tolerance  # noqa: E402

# float32 counts as adequate for a regime when its mean, variance and log-likelihood errors against
# the float64 model all stay within the float32-vs-float64 truth tolerance of the project.
F32_ADEQUATE = tolerance("truth", "float32")
LONG_REFERENCE_FROM = 20_000  # steps of one lane above which the scalar reference is used


# ------------------------------------------------------------------------------------------ regimes
def _simulate(rng, T, N, decay, process_var, obs_var, offset=0.0, loading=1.0, x0=0.0):
    """Simulate [T, N] observations of the model with scalar or [T, N]-broadcastable parameters."""
    w = rng.normal(size=(T, N))
    e = rng.normal(size=(T, N))
    params = (decay, process_var, obs_var, offset, loading)
    if all(
        np.ndim(v) == 0 for v in params
    ):  # time-invariant: one linear recursion (fast for long lanes)
        from scipy.signal import lfilter

        a, p, r, c, h = (float(v) for v in params)
        drive = c + math.sqrt(p) * w
        drive[0] += a * float(x0)
        x = lfilter([1.0], [1.0, -a], drive, axis=0)
        return h * x + math.sqrt(r) * e
    a, p, r, c, h = (np.broadcast_to(np.asarray(v, float), (T, N)) for v in params)
    x = np.full(N, float(x0))
    z = np.empty((T, N))
    for t in range(T):
        x = a[t] * x + c[t] + np.sqrt(p[t]) * w[t]
        z[t] = h[t] * x + np.sqrt(r[t]) * e[t]
    return z


def _model(
    z, obs_var, decay, process_var, loading=1.0, offset=0.0, prior_mean=0.0, prior_var=math.inf
):
    return dict(
        z=z,
        obs_var=obs_var,
        decay=decay,
        process_var=process_var,
        loading=loading,
        offset=offset,
        prior_mean=prior_mean,
        prior_var=prior_var,
    )


def regimes(quick: bool = False):
    """Name -> (description, builder(rng) -> model dict, expected non-finite outputs or None).

    Short regimes use ``T`` steps over ``N`` lanes; long ones a single lane.
    """
    T, N = (1000, 4) if quick else (4096, 8)
    long_T = [10**5] if quick else [10**5, 10**6]
    R = {}

    def add(name, desc, build, nonfinite=None):
        R[name] = (desc, build, nonfinite)

    def simple(decay, process_var, obs_var, prior_var=1.0, T=T, N=N, missing=0.1, **kw):
        def build(rng):
            z = _simulate(
                rng,
                T,
                N,
                decay,
                process_var,
                obs_var,
                **{k: v for k, v in kw.items() if k in ("offset", "loading")},
            )
            z[rng.random(z.shape) < missing] = np.nan
            return _model(z, obs_var, decay, process_var, prior_var=prior_var, **kw)

        return build

    add("baseline", "a=0.95, p=0.1, r=1, prior N(0,1), 10% missing", simple(0.95, 0.1, 1.0))
    add("decay-1e-8", "a=1e-8 (almost memoryless), p=1, r=1", simple(1e-8, 1.0, 1.0))
    add(
        "decay-1e-25",
        "a=1e-25 (a^2 underflows to 0 in float32: the past's weight rounds to 0), p=1, r=1",
        simple(1e-25, 1.0, 1.0),
    )
    add("decay-0", "a=0 exactly (memoryless), p=1, r=1", simple(0.0, 1.0, 1.0))
    add("decay-1-1e-6", "a=1-1e-6 (slow mean reversion), p=1e-6, r=1", simple(1 - 1e-6, 1e-6, 1.0))
    add(
        "decay-1-1e-9",
        "a=1-1e-9 (rounds to 1 in float32), p=1e-9, r=1",
        simple(1 - 1e-9, 1e-9, 1.0),
    )
    add("decay-1", "a=1 exactly (random walk), p=1e-2, r=1", simple(1.0, 1e-2, 1.0))
    add("decay-1-p0", "a=1, p=0 (constant level: var = r/n), r=1", simple(1.0, 0.0, 1.0))
    add("decay-neg", "a=-0.999 (oscillating), p=1e-2, r=1", simple(-0.999, 1e-2, 1.0))
    # An explosive state grows like 1.05^t; over 300 steps the data reach ~1e6 times the noise.
    add(
        "explosive",
        "a=1.05 (unstable state, data grow to ~1e6), p=0.1, r=1, diffuse prior",
        simple(1.05, 0.1, 1.0, prior_var=math.inf, T=300),
    )
    add(
        "p0-contracting",
        "a=0.999, p=0: precision grows like a^(-2t) (within range)",
        simple(0.999, 0.0, 1.0, T=min(T, 4096)),
    )
    add("p-huge", "a=0.9, p=1e12 (each step almost forgets), r=1", simple(0.9, 1e12, 1.0))
    add("r-tiny", "a=0.95, p=0.1, r=1e-12 (near-exact observations)", simple(0.95, 0.1, 1e-12))
    add("r-huge", "a=0.95, p=0.1, r=1e12 (near-useless observations)", simple(0.95, 0.1, 1e12))

    def r_mixed(rng):
        r = np.where(np.arange(T)[:, None] % 2 == 0, 1e-12, 1e12) * np.ones((1, N))
        z = _simulate(rng, T, N, 0.95, 0.1, r)
        return _model(z, r, 0.95, 0.1, prior_var=1.0)

    add("r-mixed", "r alternating 1e-12 / 1e12 in time, a=0.95, p=0.1", r_mixed)

    def diffuse_late(rng):
        z = _simulate(rng, T, N, 0.99, 0.01, 1.0)
        z[:100] = np.nan
        return _model(z, 1.0, 0.99, 0.01)

    add(
        "diffuse-late-start",
        "diffuse prior, first 100 steps missing, a=0.99, p=0.01",
        diffuse_late,
        nonfinite="mean NaN and var inf on the 100 unobserved leading steps",
    )

    def never_diffuse(rng):
        z = _simulate(rng, T, N, 0.9, 0.1, 1.0)
        z[:, ::2] = np.nan
        return _model(z, 1.0, 0.9, 0.1)

    add(
        "never-observed-diffuse",
        "every other lane never observed, diffuse prior",
        never_diffuse,
        nonfinite="mean NaN and var inf on the never-observed lanes",
    )

    def never_prior(rng):
        z = np.full((T, N), np.nan)
        return _model(z, 1.0, 0.9, 0.1, prior_mean=2.0, prior_var=1.0)

    add(
        "never-observed-prior",
        "no observation at all, proper prior N(2,1): mean decays, var -> p/(1-a^2)",
        never_prior,
    )

    def sparse(rng):
        z = _simulate(rng, T, N, 0.999, 1e-3, 1.0)
        z[rng.random(z.shape) < 0.99] = np.nan
        return _model(z, 1.0, 0.999, 1e-3, prior_var=1.0)

    add("sparse", "99% missing, a=0.999, p=1e-3", sparse)

    def large_level(rng):
        z = 1e6 + _simulate(rng, T, N, 0.95, 0.1, 1.0)
        return _model(z, 1.0, 1.0, 0.1, prior_var=math.inf)

    add("large-level", "level 1e6 with unit noise (random walk, diffuse)", large_level)

    def tiny_loading(rng):
        z = _simulate(rng, T, N, 0.95, 0.1, 1e-12, loading=1e-6)
        return _model(z, 1e-12, 0.95, 0.1, loading=1e-6, prior_var=1.0)

    add("loading-1e-6", "loading 1e-6 with r=1e-12 (phi = 1)", tiny_loading)

    for L in long_T:
        tag = f"1e{int(round(math.log10(L)))}"

        def long_ou(rng, L=L):
            z = _simulate(rng, L, 1, 0.999, 1e-3, 1.0)
            z[rng.random(z.shape) < 0.1] = np.nan
            return _model(z, 1.0, 0.999, 1e-3, prior_var=math.inf)

        add(
            f"long-{tag}",
            f"one lane of {L} steps, a=0.999, p=1e-3, r=1, 10% missing, diffuse",
            long_ou,
        )

        def long_rw(rng, L=L):
            z = _simulate(rng, L, 1, 1.0, 1e-4, 1.0)
            return _model(z, 1.0, 1.0, 1e-4, prior_var=math.inf)

        add(
            f"long-rw-{tag}",
            f"one lane of {L} steps, random walk a=1, p=1e-4, r=1, diffuse",
            long_rw,
        )

        def long_static(rng, L=L):
            z = 3.0 + rng.normal(size=(L, 1))
            return _model(z, 1.0, 1.0, 0.0, prior_var=math.inf)

        add(
            f"long-static-{tag}",
            f"one lane of {L} steps, constant level (a=1, p=0): var = 1/n down to 1/{L}",
            long_static,
        )
    return R


# ---------------------------------------------------------------------------------------- KLA op
KLA_SHAPE = (1, 4096, 8, 4)  # B, L, M, S
KLA_REGIMES = {
    # name: (description, Lv range, decay, process_var)
    "kla-baseline": ("Lv in [0.1, 10], a=0.99, p=1e-2", (1e-1, 1e1), 0.99, 1e-2),
    "kla-Lv-wide": ("Lv in [1e-6, 1e6] (value precision over 12 decades)", (1e-6, 1e6), 0.99, 1e-2),
    "kla-decay-1-1e-6": ("a=1-1e-6, p=1e-8 (memory of ~1e6 tokens)", (1e-1, 1e1), 1 - 1e-6, 1e-8),
    "kla-decay-1-p0": ("a=1, p=0 (nothing forgotten)", (1e-1, 1e1), 1.0, 0.0),
    "kla-decay-0": ("a=0, p=1 (memoryless)", (1e-1, 1e1), 0.0, 1.0),
    "kla-p-huge": ("a=0.9, p=1e12", (1e-1, 1e1), 0.9, 1e12),
}


def kla_inputs(name, shape=KLA_SHAPE, seed=0):
    """float64 CPU inputs of the KLA op for a regime of KLA_REGIMES (unit-norm keys and queries)."""
    _, (lo, hi), a, p = KLA_REGIMES[name]
    B, L, M, S = shape
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    log_lv = torch.empty(B, L, M, dtype=f64).uniform_(math.log(lo), math.log(hi), generator=g)
    return dict(
        v=torch.randn(B, L, M, generator=g, dtype=f64),
        Lv=torch.exp(log_lv),
        k=torch.nn.functional.normalize(torch.randn(B, L, S, generator=g, dtype=f64), dim=-1),
        q=torch.nn.functional.normalize(torch.randn(B, L, S, generator=g, dtype=f64), dim=-1),
        decay=torch.full((M, S), a, dtype=f64),
        process_var=torch.full((M, S), p, dtype=f64),
    )


def kla_errors(res, ref):
    """y relative to max(|y|, mean |y|) (floor: a readout's typical size); yvar, final lam purely relative."""
    tiny = np.finfo(np.float64).tiny
    return dict(
        y=rel_error(res.y, ref.y, scale=float(ref.y.abs().mean()) * 1e3),
        yvar=rel_error(res.yvar, ref.yvar, scale=tiny),
        lam=rel_error(res.final.lam, ref.final.lam, scale=tiny),
        nonfinite=int((~torch.isfinite(res.y)).sum() + (~torch.isfinite(res.yvar)).sum()),
    )


def kla_rows(
    paths=(("torch", torch.float64), ("torch", torch.float32), ("sequential", torch.float32)),
    device="cpu",
    shape=KLA_SHAPE,
):
    """Each KLA regime through each (backend, dtype) on ``device`` against the float64 sequential op."""
    from kalmanscan.core.kla_op import kla_filter

    rows = []
    for name, (desc, *_rest) in KLA_REGIMES.items():
        x = kla_inputs(name, shape)
        ref = kla_filter(**x, backend="sequential")
        row = dict(
            regime=name, description=desc, B=shape[0], L=shape[1], M=shape[2], S=shape[3], paths={}
        )
        for backend, dtype in paths:
            key = f"{backend}-{str(dtype).replace('torch.', '')}"
            try:
                with torch.no_grad():
                    res = kla_filter(
                        **{k: t.to(device=device, dtype=dtype) for k, t in x.items()},
                        backend=backend,
                    )
                row["paths"][key] = kla_errors(res, ref)
            except Exception as exc:
                row["paths"][key] = dict(error=f"{type(exc).__name__}: {exc}")
        rows.append(row)
        print(name, {k: (v.get("y"), v.get("yvar")) for k, v in row["paths"].items()}, flush=True)
    return rows


# The precision-overflow regime, kept out of the table of regimes: the precision passes the
# dtype's range, which the projective representation reports as inf (variance 0) with exact means
# (tests/test_extremes.py, docs/reliability.md); checked against its closed form.
def overflow_regime(dtype=np.float64, T=None):
    """a=0.5, p=0 with a proper prior: the precision 4^t overflows (float32 at t=63, float64 at t=511)."""
    T = T or (200 if dtype == np.float32 else 1200)
    return _model(np.ones((T, 1), dtype), dtype(1.0), dtype(0.5), dtype(0.0), prior_var=dtype(1.0))


# ---------------------------------------------------------------------------------------- reference
_LOG_2PI = math.log(2 * math.pi)


def scalar_reference(m):
    """float64 information-form filter of ONE lane, one Python float operation at a time.

    Same recursion and conventions as ``kalmanscan.core.sequential`` (docs/architecture.md).
    Returns dict of ``[T, 1]`` mean, var, precision and ``[1]`` loglik.
    """
    z = np.asarray(m["z"], np.float64).reshape(-1)
    T = z.shape[0]

    def seq(x):
        x = np.asarray(x, np.float64)
        return x.reshape(-1).tolist() if x.size > 1 else [float(x)] * T

    R, A, P, H, C = (seq(m[k]) for k in ("obs_var", "decay", "process_var", "loading", "offset"))
    pv = float(np.asarray(m["prior_var"], np.float64).reshape(-1)[0])
    pm = float(np.asarray(m["prior_mean"], np.float64).reshape(-1)[0])
    lam = 0.0 if math.isinf(pv) else 1.0 / pv
    eta = lam * pm
    mean, var, prec = np.empty(T), np.empty(T), np.empty(T)
    ll = 0.0
    for t, y in enumerate(z.tolist()):
        a, p, r, h, c = A[t], P[t], R[t], H[t], C[t]
        a2 = a * a
        if a2 == 0.0:
            lam_pred, alpha = 1.0 / p, 0.0
        else:
            den = a2 + p * lam
            lam_pred, alpha = lam / den, a / den
        eta_pred = alpha * eta + lam_pred * c
        if y == y and not math.isinf(r):
            if lam_pred > 0 or h == 0:
                vp = 1.0 / lam_pred if lam_pred > 0 else 0.0
                mp = eta_pred / lam_pred if lam_pred > 0 else 0.0
                s = h * h * vp + r
                innov = y - h * mp
                ll += -0.5 * (_LOG_2PI + math.log(s) + innov * innov / s)
            lam = lam_pred + h * h / r
            eta = eta_pred + h * y / r
        else:
            lam, eta = lam_pred, eta_pred
        prec[t] = lam
        if lam > 0:
            mean[t], var[t] = eta / lam, 1.0 / lam
        else:
            mean[t], var[t] = math.nan, math.inf
    return dict(
        mean=mean[:, None], var=var[:, None], precision=prec[:, None], loglik=np.array([ll])
    )


def _cast(m, dtype):
    return {k: np.asarray(v, dtype) for k, v in m.items()}


def run_filter(m, dtype, backend):
    kw = _cast(m, dtype)
    return ks.filter(**kw, backend=backend)


def reference(m):
    """float64 sequential reference: dict with mean, var, precision, loglik."""
    z = np.asarray(m["z"])
    if z.shape[0] > LONG_REFERENCE_FROM and z.shape[1] == 1:
        return scalar_reference(m)
    r = run_filter(m, np.float64, "sequential")
    return dict(mean=r.mean, var=r.var, precision=r.precision, loglik=r.loglik)


def errors(res, ref):
    """Worst errors of a result against the reference (see the module docstring)."""
    get = (lambda k: getattr(res, k)) if not isinstance(res, dict) else res.__getitem__
    mean, var, ll = (np.asarray(get(k), np.float64) for k in ("mean", "var", "loglik"))
    return dict(
        mean=rel_error(mean, ref["mean"]),
        var=rel_error(var, ref["var"], scale=np.finfo(np.float64).tiny),
        loglik=rel_error(ll, ref["loglik"], scale=max(1.0, float(np.abs(ref["loglik"]).max())))
        if np.isfinite(ref["loglik"]).all()
        else float("inf"),
        nonfinite_mean=int((~np.isfinite(mean)).sum()),
        nonfinite_var=int((~np.isfinite(var)).sum()),
    )


def _median_time(fn, repeats):
    ts = []
    out = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return out, float(np.median(ts))


def _cpu_paths():
    """(backend, dtype) paths on the CPU: torch in both dtypes, the native kernel (the CPU default
    of ``backend="auto"``) in both where it is built, and the sequential reference in float32."""
    from kalmanscan.core import native

    out = [("torch", np.float64), ("torch", np.float32)]
    if native.available():
        out += [("native", np.float64), ("native", np.float32)]
    return tuple(out) + (("sequential", np.float32),)


def measure(name, m, repeats=1, paths=None):
    """One regime: reference, then each (backend, dtype) path; returns the row dict."""
    paths = _cpu_paths() if paths is None else paths
    shape = tuple(np.asarray(m["z"]).shape)
    t0 = time.perf_counter()
    ref = reference(m)
    t_ref = time.perf_counter() - t0
    ref32 = reference(_cast(_cast(m, np.float32), np.float64))
    row = dict(
        regime=name,
        T=shape[0],
        N=shape[1],
        reference_s=round(t_ref, 3),
        ref_nonfinite_mean=int((~np.isfinite(ref["mean"])).sum()),
        ref_nonfinite_var=int((~np.isfinite(ref["var"])).sum()),
        paths={},
    )
    for backend, dtype in paths:
        if backend == "sequential" and shape[0] > LONG_REFERENCE_FROM:
            continue  # the step-by-step torch loop is the reference itself; too slow per step here
        res, secs = _median_time(lambda m=m, d=dtype, b=backend: run_filter(m, d, b), repeats)
        e = errors(res, ref)
        key = f"{backend}-{np.dtype(dtype).name}"
        if dtype == np.float32:
            e["vs_rounded_model"] = {
                k: v for k, v in errors(res, ref32).items() if k in ("mean", "var", "loglik")
            }
        e["median_s"] = round(secs, 4)
        row["paths"][key] = e
    f32s = [e for k, e in row["paths"].items() if k.endswith("float32") and "sequential" not in k]
    row["float32_adequate"] = bool(
        max(max(e["mean"], e["var"], e["loglik"]) for e in f32s) <= F32_ADEQUATE
    )
    return row


def reference_check(quick):
    """The scalar reference against the sequential backend on one lane (the long rows' truth)."""
    rng = np.random.default_rng(7)
    T = 2000 if quick else LONG_REFERENCE_FROM
    z = _simulate(rng, T, 1, 0.999, 1e-3, 1.0)
    z[rng.random(z.shape) < 0.1] = np.nan
    m = _model(z, 1.0, 0.999, 1e-3, offset=0.01)
    seq = run_filter(m, np.float64, "sequential")
    e = errors(scalar_reference(m), dict(mean=seq.mean, var=seq.var, loglik=seq.loglik))
    return dict(T=T, **{k: e[k] for k in ("mean", "var", "loglik")})


# --------------------------------------------------------------------------------------------- memory
# Peak memory of one call, measured in a fresh interpreter as the rise of the kernel's high-water
# mark (VmHWM, reset through /proc/self/clear_refs) over the resident size before the call, with
# glibc's mmap threshold pinned (MALLOC_MMAP_THRESHOLD_) so freed buffers leave the process at once
# and the high-water mark tracks live memory. tracemalloc cannot see torch's CPU allocations.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMORY_SHAPES = [
    ("filter", "float64", [[125_000, 1], [250_000, 1], [500_000, 1], [1_000_000, 1]]),
    ("filter", "float32", [[125_000, 1], [1_000_000, 1]]),
    ("filter", "float64", [[2048, 64], [2048, 512], [16384, 64], [16384, 512]]),
    ("smooth", "float64", [[125_000, 1], [1_000_000, 1]]),
]


_PROBE = r"""
import gc, json, sys
import numpy as np
import kalmanscan as ks
from kalmanscan.core import native

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

op = getattr(ks, sys.argv[1])
dtype = np.dtype(sys.argv[2])
shapes = json.loads(sys.argv[3])
op(np.random.default_rng(0).normal(size=(100, 1)), 1.0, 0.9, 0.1)  # warm up (lazy imports, allocator)
out = []
for T, N in shapes:
    z = np.random.default_rng(T + N).normal(size=(T, N)).astype(dtype)
    z[::7] = np.nan
    native._POOL.clear()  # kept output blocks (at most 64 MB) would hide this call's outputs
    gc.collect()
    reset_peak()
    before = status("VmRSS")
    res = op(z, 1.0, 0.9, 0.1)
    peak = status("VmHWM") - before
    out.append(dict(T=T, N=N, input_bytes=z.nbytes, peak_bytes=peak, ratio=peak / z.nbytes))
    del res, z
print(json.dumps(out))
"""


def measure_peaks(op: str, dtype: str, shapes):
    """Peak memory rise of ``ks.<op>`` for each ``(T, N)``, measured in a fresh interpreter."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="2")
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, op, dtype, json.dumps(shapes)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory probe failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory_rows(quick):
    rows = []
    for op, dtype, shapes in MEMORY_SHAPES:
        if quick:
            shapes = [s for s in shapes if s[0] * s[1] <= 500_000]
        if not os.path.exists("/proc/self/clear_refs"):
            return []
        for r in measure_peaks(op, dtype, shapes):
            rows.append(dict(op=op, dtype=dtype, **r))
    return rows


# ------------------------------------------------------------------------------------------- report
def _fmt(x):
    if isinstance(x, float) and math.isinf(x):
        return "**inf**"
    return f"{x:.1e}" if x else "0"


def markdown(result) -> str:
    meta = result["meta"]
    lines = [
        f"Extreme regimes on CPU ({meta['date']}, {meta['cpu']}, torch {meta['torch']}; command: `{meta['command']}`).",
        "Errors against the float64 sequential reference of the same model (worst over all steps and lanes;",
        "`mean` relative to max|mean|, `var` purely relative, `loglik` relative); f32 columns are the",
        "end-to-end error of the float32 run against the float64 model. Adequate: f32 mean, var and",
        f"loglik errors <= {F32_ADEQUATE:g}.",
        "",
    ]
    has_native = any("native-float64" in row["paths"] for row in result["rows"])
    native_head = " f64 native mean / var / loglik | f32 native mean / var / loglik |" if has_native else ""
    lines += [
        "| regime | T x N | f64 parallel mean / var / loglik | f32 parallel mean / var / loglik |"
        + native_head
        + " f32 sequential mean / var | f32 own error (rounded model) mean / var | f32 adequate |",
        "|---|---|---|---|" + ("---|---|" if has_native else "") + "---|---|---|",
    ]

    def three(e):
        return f"{_fmt(e['mean'])} / {_fmt(e['var'])} / {_fmt(e['loglik'])}" if e else "n/a"

    for row in result["rows"]:
        p = row["paths"]
        d64, d32 = p["torch-float64"], p["torch-float32"]
        s32 = p.get("sequential-float32")
        own = d32["vs_rounded_model"]
        native = (
            f"| {three(p.get('native-float64'))} | {three(p.get('native-float32'))} " if has_native else ""
        )
        lines.append(
            f"| {row['regime']} | {row['T']} x {row['N']} | {three(d64)} | {three(d32)} "
            + native
            + f"| {(_fmt(s32['mean']) + ' / ' + _fmt(s32['var'])) if s32 else 'n/a'} "
            f"| {_fmt(own['mean'])} / {_fmt(own['var'])} | {'yes' if row['float32_adequate'] else '**no**'} |"
        )
    rc = result["reference_check"]
    lines += [
        "",
        f"Reference check (scalar float64 loop vs the `sequential` backend, one lane of {rc['T']} steps): "
        f"mean {_fmt(rc['mean'])}, var {_fmt(rc['var'])}, loglik {_fmt(rc['loglik'])}.",
    ]
    sw = result.get("sweeps", [])
    if sw:
        lines += [
            "",
            "Where float32 stops being adequate (T x N = "
            f"{sw[0]['T']} x {sw[0]['N']}; float32 parallel vs float64 reference, mean / var / loglik):",
            "",
            "| family | value | f32 mean / var / loglik | f64 parallel mean / var / loglik | f32 adequate |",
            "|---|---|---|---|---|",
        ]
        for r in sw:
            a, b = r["f32"], r["f64"]
            lines.append(
                f"| {r['family']} | {r['value']:g} | {_fmt(a['mean'])} / {_fmt(a['var'])} / {_fmt(a['loglik'])} "
                f"| {_fmt(b['mean'])} / {_fmt(b['var'])} / {_fmt(b['loglik'])} | {'yes' if r['f32_adequate'] else '**no**'} |"
            )
        lines.append("")
    mem = result.get("memory", [])
    if mem:
        lines += [
            "Peak memory of one call on CPU (rise of the peak RSS; z with every 7th step missing, scalar parameters):",
            "",
            "| op | dtype | T x N | bytes of z | peak bytes | peak / bytes of z |",
            "|---|---|---|---|---|---|",
        ]
        for r in mem:
            lines.append(
                f"| {r['op']} | {r['dtype']} | {r['T']} x {r['N']} | {r['input_bytes'] / 1e6:.1f} MB "
                f"| {r['peak_bytes'] / 1e6:.1f} MB | {r['ratio']:.1f} |"
            )
        lines.append("")
    kla = result.get("kla", [])
    if kla:
        B, L, M, S = (kla[0][k] for k in ("B", "L", "M", "S"))
        lines += [
            f"KLA op (B={B}, L={L}, M={M}, S={S}) against its float64 sequential reference (y relative to max(|y|, mean |y|); yvar relative):",
            "",
            "| regime | f64 torch y / yvar | f32 torch y / yvar | f32 sequential y / yvar |",
            "|---|---|---|---|",
        ]
        for r in kla:
            cells = []
            for key in ("torch-float64", "torch-float32", "sequential-float32"):
                e = r["paths"].get(key, {})
                cells.append(
                    f"{_fmt(e['y'])} / {_fmt(e['yvar'])}" if "y" in e else e.get("error", "n/a")
                )
            lines.append(f"| {r['regime']}: {r['description']} | " + " | ".join(cells) + " |")
        lines.append("")
    ov = result.get("overflow", [])
    for k in ov:
        lines.append(
            f"Precision overflow `{k['regime']}` ({k['dtype']}, {k['backend']}, {k['T']} steps): "
            + (f"**raises {k['raised']}**: {k['message']}" if k["raised"] else
               f"mean {_fmt(k['mean'])}, var {_fmt(k['var'])} against the closed form where it is "
               f"representable, {k['var_underflows']} variances below the range reported as 0 or "
               f"subnormal: {'yes' if k['underflow_reported'] else '**no**'}, non-finite "
               f"{k['nonfinite']}" + ("" if k["ok"] else " **(not ok)**"))
        )
    return "\n".join(lines) + "\n"


def _overflow_truth(T):
    """The overflow regime's filtered means and variances at 60 digits: ``z = 1``, ``a = 0.5``,
    ``p = 0``, ``r = 1``, prior N(0, 1) (mpmath; the covariance form is exact at that precision)."""
    import mpmath as mp

    with mp.workdps(60):
        m, P, a = mp.mpf(0), mp.mpf(1), mp.mpf("0.5")
        mean, var = [], []
        for _ in range(T):
            m, P = a * m, a * a * P
            K = P / (P + 1)
            m, P = m + K * (1 - m), (1 - K) * P
            mean.append(m)
            var.append(P)
    return mean, var


def overflow_behaviour():
    """The regime whose precision passes the dtype's range (4^t: float32 at t = 63, float64 at
    t = 511): every backend must keep the means exact (relative to their largest: they decay like
    2^-t) and report the variance exactly where it is
    representable and 0 (precision inf) where it underflows, never a NaN (the closed form at 60
    digits, :func:`_overflow_truth`; a variance below the normal range may also come back
    subnormal or 0)."""
    out = []
    for dtype in (np.float32, np.float64):
        m = overflow_regime(dtype)
        T = m["z"].shape[0]
        t_mean, t_var = _overflow_truth(T)
        tiny = np.finfo(dtype).tiny
        for backend in [b for b, d in _cpu_paths() if d == np.float64] + ["sequential"]:
            row = dict(regime="overflow-contracting-p0", dtype=np.dtype(dtype).name,
                       backend=backend, T=T)  # fmt: skip
            try:
                r = run_filter(m, dtype, backend)
            except OverflowError as e:
                row.update(raised="OverflowError", message=str(e), ok=False)
                out.append(row)
                continue
            mean = np.asarray(r.mean[:, 0], np.float64)
            var = np.asarray(r.var[:, 0], np.float64)
            ref_m = np.array([float(x) for x in t_mean])
            ref_v = np.array([float(x) for x in t_var])
            normal = ref_v >= tiny
            mean_err = float(np.max(np.abs(mean - ref_m)) / np.max(np.abs(ref_m)))  # (-> 2^-t)
            var_err = float(np.max(np.abs(var[normal] - ref_v[normal]) / ref_v[normal]))
            under_ok = bool(np.all((var[~normal] >= 0) & (var[~normal] < tiny)))
            nonfinite = int((~np.isfinite(mean)).sum() + (~np.isfinite(var)).sum())
            tol = 1e-12 if dtype == np.float64 else 1e-5
            row.update(raised=None, mean=mean_err, var=var_err, var_underflows=int((~normal).sum()),
                       underflow_reported=under_ok, nonfinite=nonfinite,
                       ok=mean_err <= tol and var_err <= tol and under_ok and nonfinite == 0)  # fmt: skip
            out.append(row)
    return out


def sweeps(quick):
    """Where float32 stops being adequate: its worst errors along three one-parameter families."""
    T, N = (1000, 4) if quick else (4096, 4)
    out = []

    def one(family, value, m):
        ref = reference(m)
        e = errors(run_filter(m, np.float32, "torch"), ref)
        e64 = errors(run_filter(m, np.float64, "torch"), ref)
        out.append(
            dict(
                family=family,
                value=value,
                T=T,
                N=N,
                f32={k: e[k] for k in ("mean", "var", "loglik")},
                f64={k: e64[k] for k in ("mean", "var", "loglik")},
                f32_adequate=bool(max(e["mean"], e["var"], e["loglik"]) <= F32_ADEQUATE),
            )
        )

    for k, level in enumerate([1e0, 1e2, 1e3, 1e4, 1e5, 1e6]):  # level / noise ratio
        rng = np.random.default_rng(50 + k)
        z = level + _simulate(rng, T, N, 0.95, 0.1, 1.0)
        one("level/noise", level, _model(z, 1.0, 1.0, 0.1))
    for k, gap in enumerate(
        [1e-1, 1e-3, 1e-5, 1e-6, 1e-7, 1e-9]
    ):  # 1 - decay, stationary variance 1
        rng = np.random.default_rng(60 + k)
        a = 1 - gap
        p = 1 - a * a
        z = _simulate(rng, T, N, a, p, 1.0)
        one("1-decay (stationary var 1)", gap, _model(z, 1.0, a, p, prior_var=1.0))
    for k, ratio in enumerate([1e-12, 1e-8, 1e-4, 1e0, 1e4, 1e8, 1e12]):  # obs_var / process_var
        rng = np.random.default_rng(70 + k)
        z = _simulate(rng, T, N, 0.99, 1.0, ratio)
        one("obs_var/process_var", ratio, _model(z, ratio, 0.99, 1.0, prior_var=1.0))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller shapes, no 1e6-step lanes")
    ap.add_argument("--json", help="write the results as JSON here")
    ap.add_argument("--markdown", help="write the markdown table here")
    ap.add_argument("--only", nargs="*", help="run only these regimes")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    R = regimes(args.quick)
    rows = []
    for i, (name, (desc, build, nonfinite)) in enumerate(R.items()):
        if args.only and name not in args.only:
            continue
        m = build(np.random.default_rng(1000 + i))
        row = measure(name, m)
        row["description"] = desc
        row["expected_nonfinite"] = nonfinite
        rows.append(row)
        p = row["paths"]
        print(
            f"{name:24s} f64 {p['torch-float64']['mean']:.1e}/{p['torch-float64']['var']:.1e}  "
            f"f32 {p['torch-float32']['mean']:.1e}/{p['torch-float32']['var']:.1e}  adequate={row['float32_adequate']}",
            flush=True,
        )
    result = dict(
        meta=dict(
            date=datetime.date.today().isoformat(),
            cpu=platform.processor() or platform.machine(),
            threads=torch.get_num_threads(),
            torch=torch.__version__,
            numpy=np.__version__,
            command="python benchmarks/reliability.py" + (" --quick" if args.quick else ""),
            reference="float64 sequential backend; scalar float64 loop for one lane > "
            f"{LONG_REFERENCE_FROM} steps",
            float32_adequate_if_error_below=F32_ADEQUATE,
        ),
        reference_check=reference_check(args.quick),
        rows=rows,
        overflow=overflow_behaviour(),
        sweeps=sweeps(args.quick),
        kla=kla_rows(),
        memory=memory_rows(args.quick),
    )
    md = markdown(result)
    print(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=float)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
