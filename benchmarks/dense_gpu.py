"""GPU benchmark of the dense filter and smoother: fused Triton vs a JAX scan, scan vs loop.

    python benchmarks/dense_gpu.py --json benchmarks/results/dense-gpu.json --budget-s 220
    python benchmarks/dense_gpu.py --dry-run --json /tmp/dense-gpu.json   # CPU, small: checks the script

One script checks and measures everything, cheapest and most informative first, so that a run
cut short by ``--budget-s`` keeps what matters:

0. the headline (``headline`` in the JSON): ``kd.filter`` (``auto``, asserted to run the fused
   ``"triton"`` backend) against the Särkkä & García-Fernández parallel filter written as
   ``jax.lax.associative_scan`` (elements (A, b, C, J, eta) with the prior in the first one, the
   standard combine; its float64 run is checked against the reference) and the torch scan, on one
   series, float32, random stable model (spectral radius 0.95), d = 1, n = 2, 4, 8,
   T = 1e4, 1e5, 1e6; median of 5 calls after a warm-up (3 at T = 1e6); errors of means and
   covariances normwise against the float64 torch scan of the same data (itself checked against the
   sequential reference in the tests and in 1.). The same rows time ``kd.smooth`` (``auto``,
   asserted to run the fused triton smoother: ``smooth_*`` keys) against the JAX filter followed
   by the standard parallel RTS smoother (elements E = P F' (F P F' + Q)^-1, g = m - E F m,
   L = P - E F P, a reverse ``associative_scan``; one jitted function, its float64 run checked
   against the sequential smoother), with the errors of both against the float64 torch smoother
   in the same run. Each row also records the host path of one call (``host_ops``,
   ``host_syncs``, ``launches``, ``smooth_*``: :func:`host_profile`);

1. correctness on the GPU against the float64 sequential reference run on the host CPU:
   float64 and float32 smoothers for n = 2, 4, 8 (proper prior) and a diffuse, partly missing,
   time-varying model;
2. the scan (``kd.filter``) on one long series, float32, n = 2, 4, 8, at every T = 1e3 ... 1e6
   (a warm-up, then the median of 5 repeats, 3 at T = 1e6), each checked against the float64
   scan of the same data (itself checked against the reference in 1.);
3. many series (B = 1000, T = 1000, n = 4) float32: scan against the loop vectorized over series;
4. the lean sequential loop (``benchmarks/dense_loop.py``: covariance form, no diffuse or
   missing-data handling, its steps replayed from CUDA graphs of 256 steps) for the same
   single-series configurations, T ascending, 3 timed calls after a warm-up (1 at T = 1e6), each
   checked against the scan's means and timed only if its estimate fits the budget;
5. the reference sequential loop on the GPU (one chain of small kernel launches per step, about 1 ms a
   step on an H200) for the same single-series configurations, T ascending: at the smallest T a
   warm-up and the median of 3 repeats, beyond it one timed call without warm-up. A configuration
   is timed only if its estimated time (the loop's measured time per step for that n at the
   previous T, times T) fits in what is left of the budget; otherwise it is listed in
   ``skipped`` with the estimate. Nothing is extrapolated: the JSON holds only timed calls, with
   ``sequential_repeats`` and ``sequential_warmup`` on each row.

Errors are normwise (max |a - b| / max |b|). Times are wall-clock medians in ms, with
``torch.cuda.synchronize`` around each call. The JSON is rewritten after every configuration.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import time

if "--dry-run" in sys.argv:  # the Triton kernels run in the interpreter on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import torch

import kalmanscan.dense as kd
from kalmanscan.testing import tolerance

T0 = time.perf_counter()


def model(rng, n, d=1):
    F = rng.normal(size=(n, n))
    F *= 0.97 / np.abs(np.linalg.eigvals(F)).max()
    G = rng.normal(size=(n, n))
    Q = G @ G.T / n + 0.1 * np.eye(n)
    return F, Q, rng.normal(size=(d, n)), np.eye(d)


DEVICE = "cuda"
LOOP_FIRST_GUESS_S_PER_STEP = 2e-3  # before any loop is timed (measured: 0.75-1.5 ms on an H200)
LEAN_FIRST_GUESS_S_PER_STEP = 3e-4  # the lean loop, before it is timed (not yet measured)
GRAPH_STEPS = 256  # lean loop: steps a CUDA graph


def rel_error(a, b):
    """Normwise relative error max|a - b| / max|b| over the finite entries of b."""
    a = np.asarray(a.detach().cpu() if hasattr(a, "detach") else a, dtype=np.float64)
    b = np.asarray(b.detach().cpu() if hasattr(b, "detach") else b, dtype=np.float64)
    m = np.isfinite(b)
    return (
        float(np.max(np.abs(a[m] - b[m])) / max(np.max(np.abs(b[m])), 1e-300)) if m.any() else 0.0
    )


def on(x, dtype):
    return torch.as_tensor(x, dtype=dtype, device=DEVICE)


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed(fn, repeats, warmup=True):
    """Median wall-clock ms of ``repeats`` calls (after one untimed call if ``warmup``)."""
    if warmup:
        fn()
        sync()
    ts, out = [], None
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3, out


def headline_model(rng, n):
    """Random stable model (spectral radius 0.95), d = 1, proper prior."""
    F = rng.normal(size=(n, n))
    F *= 0.95 / np.abs(np.linalg.eigvals(F)).max()
    G = rng.normal(size=(n, n))
    Q = G @ G.T / n + 0.1 * np.eye(n)
    return dict(
        F=F,
        Q=Q,
        H=rng.normal(size=(1, n)),
        R=np.eye(1),
        prior_mean=np.zeros(n),
        prior_cov=np.eye(n),
    )


def sgf_elements(xp, z, F, Q, H, R, m0, P0):
    """Särkkä & García-Fernández (2021) filtering elements (A, b, C, J, eta), [T, ...], for a
    time-invariant model without offset; the first carries the prior (A = 0), NaN z is missing."""
    n = F.shape[-1]
    eye = xp.eye(n, dtype=F.dtype)
    obs = ~xp.isnan(z[:, :1])  # [T, 1]
    zz = xp.where(obs, z, 0.0)[..., None]  # [T, d, 1]
    # steps 2..T: x_{t-1} given; update with z_t against N(F x_{t-1}, Q)
    S = H @ Q @ H.T + R
    K = xp.linalg.solve(S, H @ Q).T  # Q H' S^-1  [n, d]
    A = (eye - K @ H) @ F
    C = (eye - K @ H) @ Q
    HF = H @ F
    Si_HF = xp.linalg.solve(S, HF)
    J = HF.T @ Si_HF
    b = (K @ zz)[..., 0]
    eta = (Si_HF.T @ zz)[..., 0]
    # step 1: the prior predicted through F
    P1 = F @ P0 @ F.T + Q
    m1 = F @ m0
    S1 = H @ P1 @ H.T + R
    K1 = xp.linalg.solve(S1, H @ P1).T
    b1 = m1 + (K1 @ (zz[0] - (H @ m1)[:, None]))[:, 0]
    C1 = P1 - K1 @ S1 @ K1.T
    T = z.shape[0]
    o = obs[:, :, None]  # missing: predict only
    A = xp.where(o, A, F)
    C = xp.where(o, C, Q)
    J = xp.where(o, J, 0.0)
    b = xp.where(obs, b, 0.0)
    eta = xp.where(obs, eta, 0.0)
    first = xp.arange(T)[:, None] == 0
    b1 = xp.where(obs[0], b1, m1)
    C1 = xp.where(obs[0, :, None], C1, P1)
    A = xp.where(first[:, :, None], 0.0, A)
    b = xp.where(first, b1, b)
    C = xp.where(first[:, :, None], C1, C)
    J = xp.where(first[:, :, None], 0.0, J)
    eta = xp.where(first, 0.0, eta)
    return A, b, C, J, eta


def sgf_combine(xp, e1, e2):
    """The standard combine of two S&G-F filtering elements (e1 first), batched over leading axes."""
    A1, b1, C1, J1, eta1 = e1
    A2, b2, C2, J2, eta2 = e2
    n = A1.shape[-1]
    eye = xp.eye(n, dtype=A1.dtype)
    tr = lambda M: xp.swapaxes(M, -1, -2)  # noqa: E731
    M1 = xp.linalg.solve(tr(eye + C1 @ J2), tr(A2))  # (A2 (I + C1 J2)^-1)'
    temp = tr(M1)
    A = temp @ A1
    b = (temp @ (b1 + (C1 @ eta2[..., None])[..., 0])[..., None])[..., 0] + b2
    C = temp @ C1 @ tr(A2) + C2
    temp2 = tr(xp.linalg.solve(tr(eye + J2 @ C1), A1))  # A1' (I + J2 C1)^-1
    eta = (temp2 @ (eta2 - (J2 @ b1[..., None])[..., 0])[..., None])[..., 0] + eta1
    J = temp2 @ J2 @ A1 + J1
    return A, b, C, J, eta


def sgf_numpy(z, kw):
    """The same filter by a plain left fold in numpy (checks sgf_elements/sgf_combine here)."""
    e = sgf_elements(np, z, *(kw[k] for k in ("F", "Q", "H", "R", "prior_mean", "prior_cov")))
    acc = tuple(x[0] for x in e)
    means, covs = [acc[1]], [acc[2]]
    for t in range(1, z.shape[0]):
        acc = sgf_combine(np, acc, tuple(x[t] for x in e))
        means.append(acc[1])
        covs.append(acc[2])
    return np.stack(means), np.stack(covs)


def sgf_smooth_elements(xp, means, covs, F, Q):
    """Parallel RTS smoothing elements (E, g, L), [T, ...], from the filtered moments of a
    time-invariant model without offset: x_s(t) = E_t x_s(t+1) + g_t + N(0, L_t) with
    E = P F' (F P F' + Q)^-1, g = m - E F m, L = P - E F P; the last is (0, m_T, P_T)."""
    T = means.shape[0]
    tr = lambda M: xp.swapaxes(M, -1, -2)  # noqa: E731
    FP = F @ covs
    Pp = FP @ F.T + Q
    E = tr(xp.linalg.solve(Pp, FP))  # (Pp^-1 F P)' = P F' Pp^-1
    g = means - (E @ (means @ F.T)[..., None])[..., 0]
    L = covs - E @ FP
    last = xp.arange(T) == T - 1
    E = xp.where(last[:, None, None], 0.0, E)
    g = xp.where(last[:, None], means, g)
    L = xp.where(last[:, None, None], covs, L)
    return E, g, L


def sgf_smooth_combine(xp, e1, e2):
    """The standard combine of two smoothing elements, e1 the later in time (the order of
    ``associative_scan(..., reverse=True)``): E2 E1, E2 g1 + g2, E2 L1 E2' + L2."""
    E1, g1, L1 = e1
    E2, g2, L2 = e2
    return E2 @ E1, (E2 @ g1[..., None])[..., 0] + g2, E2 @ L1 @ xp.swapaxes(E2, -1, -2) + L2


def sgf_smooth_numpy(z, kw):
    """The parallel RTS smoother by a plain right fold in numpy (checks the two functions above
    where jax is not installed): smoothed (means, covs)."""
    means, covs = sgf_numpy(z, kw)
    e = sgf_smooth_elements(np, means, covs, kw["F"], kw["Q"])
    T = z.shape[0]
    acc = tuple(x[T - 1] for x in e)
    out_m, out_c = [acc[1]], [acc[2]]
    for t in range(T - 2, -1, -1):
        acc = sgf_smooth_combine(np, acc, tuple(x[t] for x in e))
        out_m.append(acc[1])
        out_c.append(acc[2])
    return np.stack(out_m[::-1]), np.stack(out_c[::-1])


def jax_filter_fn(smooth=False):
    """A jitted JAX S&G-F filter (means, covs) or None when jax is not installed; ``smooth``:
    the filter, then the parallel RTS smoother as a reverse ``associative_scan`` of
    :func:`sgf_smooth_elements` (smoothed means, covs), one jitted function."""
    # torch shares the GPU: no preallocation of 75 % of its memory by XLA
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)  # float64 for the check; float32 stays float32

    @jax.jit
    def run(z, F, Q, H, R, m0, P0):
        e = sgf_elements(jnp, z, F, Q, H, R, m0, P0)
        out = jax.lax.associative_scan(lambda a, b: sgf_combine(jnp, a, b), e)
        if not smooth:
            return out[1], out[2]
        es = sgf_smooth_elements(jnp, out[1], out[2], F, Q)
        sm = jax.lax.associative_scan(
            lambda a, b: sgf_smooth_combine(jnp, a, b), es, reverse=True
        )
        return sm[1], sm[2]

    def call(z, kw, dtype):
        args = [jnp.asarray(z, dtype=dtype)] + [
            jnp.asarray(kw[k], dtype=dtype) for k in ("F", "Q", "H", "R", "prior_mean", "prior_cov")
        ]
        return lambda: jax.block_until_ready(run(*args))

    return call


SYNC_OPS = {"_local_scalar_dense", "is_nonzero", "equal", "allclose", "item", "nonzero",
            "masked_select", "_linalg_eigh", "linalg_cholesky", "linalg_inv"}  # fmt: skip


def host_profile(call):
    """One call's host path: ATen ops outside the Triton kernels (``host_ops``, views included),
    host synchronizations (``host_syncs``: scalar reads, error-checking linalg ops, copies to the
    CPU, CUDA event waits) and Triton launches (``launches``)."""
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

    from kalmanscan.cuda import dense as CD

    n = dict(host_ops=0, host_syncs=0, launches=0)

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            n["host_ops"] += 1
            name = func.overloadpacket.__name__
            to_cpu = name == "_to_copy" and str((kw or {}).get("device", "")) == "cpu"
            n["host_syncs"] += name in SYNC_OPS or to_cpu
            return func(*a, **(kw or {}))

    real_launch, real_wait = CD.launch, torch.cuda.Event.synchronize

    def launch(*a, **k):
        n["launches"] += 1
        with _disable_current_modes():
            return real_launch(*a, **k)

    def wait(ev):
        n["host_syncs"] += 1
        return real_wait(ev)

    CD.launch, torch.cuda.Event.synchronize = launch, wait
    try:
        with Mode():
            call()
    finally:
        CD.launch, torch.cuda.Event.synchronize = real_launch, real_wait
    return n


def headline(args, res, rng, save, left, checks_ok):
    """Section 0 of the module docstring (rows appended to ``res["headline"]``)."""
    from kalmanscan.cuda import dense as CD
    from kalmanscan.dense import _args

    ran = []  # which fused entry ran: "filter" (CD.run) or "smooth" (CD.run_smooth)
    real_run, real_run_smooth = CD.run, CD.run_smooth

    def spy(*a):
        ran.append("filter")
        return real_run(*a)

    def spy_smooth(*a):
        ran.append("smooth")
        return real_run_smooth(*a)

    CD.run, CD.run_smooth = spy, spy_smooth
    jax_call = jax_filter_fn()
    jax_smooth_call = jax_filter_fn(smooth=True)
    res["jax"] = None
    if jax_call is not None:
        import jax

        res["jax"] = dict(
            version=jax.__version__,
            devices=[str(d) for d in jax.devices()],
            default_matmul_precision=str(jax.config.jax_default_matmul_precision),
        )
    sizes = ((2, 4), (64,)) if args.dry_run else ((2, 4, 8), (10_000, 100_000, 1_000_000))
    tol32 = 1e-6  # the target (meets_target): normwise error of float32 means and covariances
    for n in sizes[0]:
        kw = headline_model(rng, n)
        # the JAX (or, without jax, the numpy) S&G-F filter and RTS smoother against the float64
        # reference
        zc = rng.normal(size=(500 if not args.dry_run else 40, 1))
        zc[rng.random(zc.shape) < 0.1] = np.nan
        ref = kd.smooth(zc, **kw, backend="sequential")
        if jax_call is not None:
            jm, jc = jax_call(zc, kw, np.float64)()
            sm, sc = jax_smooth_call(zc, kw, np.float64)()
        else:
            jm, jc = sgf_numpy(zc, kw)
            sm, sc = sgf_smooth_numpy(zc, kw)
        err = max(rel_error(np.asarray(jm), ref.filtered.mean),
                  rel_error(np.asarray(jc), ref.filtered.cov))  # fmt: skip
        err_s = max(rel_error(np.asarray(sm), ref.mean), rel_error(np.asarray(sc), ref.cov))
        res.setdefault("peer_checks", []).append(
            dict(n=n, T=zc.shape[0], peer="jax" if jax_call else "numpy fold", err_f64=err,
                 smooth_err_f64=err_s)  # fmt: skip
        )
        print(res["peer_checks"][-1], flush=True)
        peer_ok = err <= tolerance("parallel", "float64")
        peer_smooth_ok = err_s <= tolerance("parallel", "float64")
        for T in sizes[1]:
            if left() < 20:
                res["skipped"].append(f"headline n={n} T={T}: budget ({left():.0f} s left)")
                continue
            z = rng.normal(size=(T, 1))
            reps = 1 if args.dry_run else (5 if T <= 100_000 else 3)
            g = {k: on(v, torch.float32) for k, v in kw.items()}
            zg = on(z, torch.float32)
            row = dict(n=n, d=1, B=1, T=T, dtype="float32", repeats=reps)
            if DEVICE == "cuda":
                call = lambda zg=zg, g=g: kd.filter(zg, **g)  # noqa: E731
                call_s = lambda zg=zg, g=g: kd.smooth(zg, **g)  # noqa: E731
            else:  # the dry run: the triton backend itself, interpreted
                mdl, lay = _args.prepare(
                    zg, g["F"], g["Q"], g["H"], g["R"], None, g["prior_mean"], g["prior_cov"],
                    None, 0, mask=False,
                )  # fmt: skip
                call = lambda m=mdl, la=lay: CD.dense_triton(m, la, False, 32)  # noqa: E731
                call_s = lambda m=mdl, la=lay: CD.dense_triton(m, la, True, 32)  # noqa: E731
            row.update(host_profile(call))  # a first call compiles: the counts are the same
            row.update({f"smooth_{k}": v for k, v in host_profile(call_s).items()})
            ran.clear()
            t_tr, out = timed(call, reps, warmup=not args.dry_run)
            row["backend_ran"] = "triton" if ran and set(ran) == {"filter"} else "other"
            ran.clear()
            t_trs, out_s = timed(call_s, reps, warmup=not args.dry_run)
            row["smooth_backend_ran"] = "triton" if ran and set(ran) == {"smooth"} else "other"
            g64 = {k: v.double() for k, v in g.items()}
            s64 = kd.smooth(zg.double(), **g64, backend="torch")  # its filter: the filter's truth
            r64 = s64.filtered
            row["err_mean"] = rel_error(out.mean, r64.mean)
            row["err_cov"] = rel_error(out.cov, r64.cov)
            row["err_loglik"] = abs(float(out.loglik) - float(r64.loglik)) / abs(float(r64.loglik))
            worst = max(row["err_mean"], row["err_cov"])
            row["meets_target"] = worst <= tol32
            ok = (
                checks_ok
                and row["backend_ran"] == "triton"
                and worst <= tolerance("truth", "float32")
            )
            row["ok"] = ok
            if ok:
                row["kalmanscan_ms"] = t_tr
            else:
                row["status"] = "correctness check failed or triton did not run: no speed"
            row["smooth_err_mean"] = rel_error(out_s.mean, s64.mean)
            row["smooth_err_cov"] = rel_error(out_s.cov, s64.cov)
            worst_s = max(row["smooth_err_mean"], row["smooth_err_cov"])
            row["smooth_meets_target"] = worst_s <= tol32
            ok_s = (
                checks_ok
                and row["smooth_backend_ran"] == "triton"
                and worst_s <= tolerance("truth", "float32")
            )
            row["smooth_ok"] = ok_s
            if ok_s:
                row["smooth_kalmanscan_ms"] = t_trs
            else:
                row["smooth_status"] = "correctness check failed or triton did not run: no speed"
            del out_s
            if jax_call is not None:
                t_j, (jm, jc) = timed(jax_call(z, kw, np.float32), reps)
                row["jax_err_mean"] = rel_error(np.asarray(jm), r64.mean)
                row["jax_err_cov"] = rel_error(np.asarray(jc), r64.cov)
                row["jax_ms"] = t_j if peer_ok else None
                if ok and peer_ok:
                    row["speedup_vs_jax"] = row["jax_ms"] / t_tr
                del jm, jc
                t_js, (sm, sc) = timed(jax_smooth_call(z, kw, np.float32), reps)
                row["smooth_jax_err_mean"] = rel_error(np.asarray(sm), s64.mean)
                row["smooth_jax_err_cov"] = rel_error(np.asarray(sc), s64.cov)
                row["smooth_jax_ms"] = t_js if peer_smooth_ok else None
                if ok_s and peer_smooth_ok:
                    row["smooth_speedup_vs_jax"] = row["smooth_jax_ms"] / t_trs
                del sm, sc
            if not args.dry_run and not args.no_torch_peer:
                reps_t = 3 if T < 10**6 else 1
                t_t, o_t = timed(lambda zg=zg, g=g: kd.filter(zg, **g, backend="torch"), reps_t)
                row["torch_err_mean"] = rel_error(o_t.mean, r64.mean)
                row["torch_ms"] = t_t
                del o_t
                if left() > 20:
                    t_t, o_t = timed(
                        lambda zg=zg, g=g: kd.smooth(zg, **g, backend="torch"), reps_t
                    )
                    row["smooth_torch_err_mean"] = rel_error(o_t.mean, s64.mean)
                    row["smooth_torch_ms"] = t_t
                    del o_t
            del s64, r64, out
            res["headline"].append(row)
            print(row, flush=True)
            save()
    CD.run, CD.run_smooth = real_run, real_run_smooth


def _commit():
    """The tree's commit: ``KALMANSCAN_COMMIT`` where set (a copy of the tree whose git metadata
    is not its own, as on a remote machine), else git's HEAD."""
    if os.environ.get("KALMANSCAN_COMMIT"):
        return os.environ["KALMANSCAN_COMMIT"]
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument(
        "--budget-s",
        type=float,
        default=100.0,
        help="wall-clock budget of the whole run in seconds (default 100); later sections and "
        "loop configurations that would not fit are skipped and listed in the JSON",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="on the CPU with T <= 1e3 (to test the script)"
    )
    p.add_argument(
        "--no-torch-peer",
        action="store_true",
        help="leave the torch scan's timings out of the headline rows (the slowest part of them)",
    )
    args = p.parse_args(argv)
    global DEVICE
    if args.dry_run:
        DEVICE = "cpu"
    Ts = (300, 1_000) if args.dry_run else (1_000, 10_000, 100_000, 1_000_000)
    rng = np.random.default_rng(0)
    res = dict(
        benchmark="dense filter, GPU",
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        device=torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (dry run)",
        torch=torch.__version__,
        commit=_commit(),
        command="python benchmarks/dense_gpu.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        budget_s=args.budget_s,
        checks=[],
        headline=[],
        single=[],
        many=[],
        skipped=[],
    )

    def save():
        res["elapsed_s"] = time.perf_counter() - T0
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)

    def left():
        return args.budget_s - (time.perf_counter() - T0)

    # 0. the headline: kd.filter (triton) against the JAX associative scan and the torch scan
    headline(args, res, rng, save, left, True)

    # 1. correctness against the float64 CPU reference
    cases = ((2, 1, 1000, "cov"), (4, 1, 1000, "cov"), (8, 1, 1000, "cov"), (4, 2, 500, "diffuse"))
    for n, d, T, prior in cases if not args.dry_run else cases[::3]:
        F, Q, H, R = model(rng, n, d)
        if prior == "diffuse":  # time-varying, partly missing
            F = np.stack([model(rng, n, d)[0] for _ in range(T)])
        z = rng.normal(size=(T, d))
        if prior == "diffuse":
            z[rng.random(z.shape) < 0.15] = np.nan
            kw = {}
        else:
            kw = dict(prior_mean=np.zeros(n), prior_cov=np.eye(n))
        ref = kd.smooth(z, F, Q, H, R, backend="sequential", **kw)
        for dt in (torch.float64, torch.float32):
            out = kd.smooth(
                on(z, dt),
                on(F, dt),
                on(Q, dt),
                on(H, dt),
                on(R, dt),
                backend="torch",
                **{k: on(v, dt) for k, v in kw.items()},
            )
            ok = ~ref.filtered.diffuse
            name = str(dt).replace("torch.", "")
            errs = dict(
                filtered_mean=rel_error(out.filtered.mean.cpu().numpy()[ok], ref.filtered.mean[ok]),
                filtered_cov=rel_error(out.filtered.cov.cpu().numpy()[ok], ref.filtered.cov[ok]),
                smoothed_mean=rel_error(out.mean.cpu(), ref.mean),
                smoothed_cov=rel_error(out.cov.cpu(), ref.cov),
                loglik=abs(float(out.filtered.loglik) - float(ref.filtered.loglik))
                / abs(float(ref.filtered.loglik)),
            )
            kind = "parallel" if name == "float64" else "truth"
            tol = tolerance(kind, name)
            res["checks"].append(
                dict(
                    n=n,
                    d=d,
                    T=T,
                    prior=prior,
                    dtype=name,
                    tol=tol,
                    ok=max(errs.values()) <= tol,
                    **errs,
                )
            )
            print(res["checks"][-1], flush=True)
    save()
    checks_ok = all(c["ok"] for c in res["checks"])

    # 2. the scan on one long series, float32, every T (each well under a second on an H200)
    dt = torch.float32
    mods = {n: model(rng, n) for n in (2, 4, 8)}
    data = {}  # (n, T) -> (row, z, scan mean): the loop in 4. runs on the same data

    def scan_args(n):
        F, Q, H, R = mods[n]
        return [on(x, dt) for x in (F, Q, H, R)], dict(
            prior_mean=on(np.zeros(n), dt), prior_cov=on(np.eye(n), dt)
        )

    def single_scan(n, T):
        if left() < 10:
            res["skipped"].append(f"scan n={n} T={T}: budget ({left():.0f} s left)")
            return
        args_g, kw = scan_args(n)
        z = on(rng.normal(size=(T, 1)), dt)
        reps = 5 if T <= 100_000 else 3
        t_par, out = timed(lambda: kd.filter(z, *args_g, backend="torch", **kw), reps)
        row = dict(n=n, d=1, B=1, T=T, dtype="float32", parallel_ms=t_par, repeats=reps)
        out64 = kd.filter(
            z.double(),
            *(a.double() for a in args_g),
            backend="torch",
            **{k: v.double() for k, v in kw.items()},
        )
        row["err_vs_float64_scan"] = err = rel_error(out.mean, out64.mean)
        del out64
        row["ok"] = err <= tolerance("truth", "float32") and checks_ok
        if not row["ok"]:
            row.pop("parallel_ms")
            row["status"] = "correctness check failed: no speed reported"
        res["single"].append(row)
        data[(n, T)] = (row, z, out.mean)
        print(row, flush=True)
        save()

    for T in Ts:
        for n in (2, 4, 8):
            single_scan(n, T)

    # 3. many series
    from kalmanscan.dense import _args
    from kalmanscan.dense.sequential import filter_moments

    if left() > 15:
        n, B, T = (4, 1000, 1000) if not args.dry_run else (4, 50, 100)
        F, Q, H, R = model(rng, n)
        args_g = [on(x, dt) for x in (F, Q, H, R)]
        kw = dict(prior_mean=on(np.zeros(n), dt), prior_cov=on(np.eye(n), dt))
        z = on(rng.normal(size=(T, B, 1)), dt)
        t_par, out = timed(lambda: kd.filter(z, *args_g, backend="torch", **kw), 3)
        model_l, _ = _args.prepare(z, *args_g, None, kw["prior_mean"], kw["prior_cov"], None, 0)
        t_seq, seq = timed(lambda m=model_l: filter_moments(m), 1)
        err = rel_error(out.mean, torch.movedim(seq[0].mean, 0, 1))
        row = dict(
            n=n,
            d=1,
            B=B,
            T=T,
            dtype="float32",
            parallel_ms=t_par,
            repeats=3,
            sequential_ms=t_seq,
            sequential_repeats=1,
            sequential_warmup=True,
            speedup=t_seq / t_par,
            err_vs_gpu_loop=err,
            ok=err <= tolerance("truth", "float32") and checks_ok,
        )
        res["many"].append(row)
        print(row, flush=True)
        save()
    else:
        res["skipped"].append(f"many series: budget ({left():.0f} s left)")

    def loop_row(what, n, T, est):
        """The checked scan row ``(row, z, mean)`` of ``(n, T)`` if a loop estimated to take
        ``est`` s fits the budget, else None with the reason in ``skipped``."""
        if (n, T) not in data:
            res["skipped"].append(f"{what} n={n} T={T}: no scan row")
        elif not data[(n, T)][0]["ok"]:
            res["skipped"].append(f"{what} n={n} T={T}: scan check failed")
        elif est > left() - 5:
            res["skipped"].append(
                f"{what} n={n} T={T}: budget (estimated {est:.0f} s, {left():.0f} s left)"
            )
        else:
            return data[(n, T)]
        return None

    # 4. the lean sequential loop on the GPU (benchmarks/dense_loop.py: covariance form, no
    # diffuse or missing-data handling, steps captured in CUDA graphs), T ascending
    from dense_loop import lean_filter

    lean_per_step = {}
    for T in Ts:
        for n in (2, 4, 8):
            reps = 3 if T <= 100_000 else 1
            est = lean_per_step.get(n, LEAN_FIRST_GUESS_S_PER_STEP) * T * (reps + 1)
            found = loop_row("lean loop", n, T, est)
            if found is None:
                continue
            row, z, mean = found
            (F_, Q_, H_, R_), kw = scan_args(n)
            m0, P0 = kw["prior_mean"], kw["prior_cov"]
            try:
                t_lean, lean = timed(
                    lambda a=(z, F_, Q_, H_, R_, m0, P0): lean_filter(*a, graph_steps=GRAPH_STEPS),
                    reps,
                )
            except Exception as e:  # e.g. a capture refused by this torch build: say so, go on
                res["skipped"].append(f"lean loop n={n} T={T}: {type(e).__name__}: {e}"[:300])
                continue
            lean_per_step[n] = t_lean / 1e3 / T
            row.update(
                lean_loop_ms=t_lean,
                lean_loop_repeats=reps,
                lean_loop_graph_steps=GRAPH_STEPS,
                speedup_vs_lean_loop=t_lean / row["parallel_ms"],
                err_vs_lean_loop=rel_error(mean, lean[0]),
            )
            del lean
            if row["err_vs_lean_loop"] > tolerance("truth", "float32"):
                row["status"] = "scan and lean loop disagree: no lean speed-up reported"
                row.pop("speedup_vs_lean_loop")
            print(row, flush=True)
            save()

    # 5. the reference sequential loop on the GPU, T ascending, while the budget lasts
    per_step = {}  # n -> measured loop seconds per step at the largest T timed so far
    for T in Ts:
        for n in (2, 4, 8):
            first = T == Ts[0]
            reps, warm = (3, True) if first else (1, False)
            est = per_step.get(n, LOOP_FIRST_GUESS_S_PER_STEP) * T * (reps + warm)
            found = loop_row("sequential loop", n, T, est)
            if found is None:
                continue
            row, z, mean = found
            args_g, kw = scan_args(n)
            model_l, _ = _args.prepare(z, *args_g, None, kw["prior_mean"], kw["prior_cov"], None, 0)
            t_seq, seq = timed(lambda m=model_l: filter_moments(m), reps, warmup=warm)
            per_step[n] = t_seq / 1e3 / T
            row.update(
                sequential_ms=t_seq,
                sequential_repeats=reps,
                sequential_warmup=warm,
                speedup=t_seq / row["parallel_ms"],
                err_vs_gpu_loop=rel_error(mean, seq[0].mean[0]),
            )
            del seq, model_l
            if row["err_vs_gpu_loop"] > tolerance("truth", "float32"):
                row["ok"] = False
                row["status"] = "scan and GPU loop disagree: no speed reported"
                row.pop("parallel_ms")
                row.pop("sequential_ms")
                row.pop("speedup")
            print(row, flush=True)
            save()
    save()
    print("elapsed", time.perf_counter() - T0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
