"""The Triton backend's chunked scan (few long lanes: chunk maps, carries, reruns) from a diffuse
start through steps whose decay square underflows or is subnormal, against mpmath
(tests/test_underflow_regimes.mp_filter, kalmanscan.validation.oracle.scalar_oracle) and the
float64 sequential reference: the filter, the log-likelihood, the smoother and the fused
log-likelihood gradient (docs/reliability.md, "Underflow regimes").

A diffuse belief stays diffuse through every step with ``decay != 0``, however small; a chunk's
composed map must therefore give a diffuse state entering it the exact image, though the map's
second column is the product of ``decay**2`` over the steps before the chunk's first informative
one (``1e-170`` squared underflows at once; ``1e-100`` squared over a few steps). Four lanes:

- 0: diffuse, a leading gap (NaN) of tiny decays spanning chunks, then ``decay = 0.9``;
- 1: diffuse, observed with ``loading = 0`` first (log-likelihood terms, no information), tiny
  decays throughout;
- 2: a proper prior, the gap of lane 0;
- 3: diffuse, the gap of lane 0 with one forgetting step (``decay = 0``) inside.

Chunks are forced (``_MANY_LANES``) at the interpreter's checkpoint interval (``CK = 4``, also
on a GPU): 33 steps are 3 chunks of 12, 12 and 9 (a first, a middle and a last; the gap ends
inside the middle one, which it enters diffuse: ``gap_regime`` asserts it), 1000 steps 63 (the
forward carry scans them in 16 tiles).
"""

import math
import os

import numpy as np
import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

from kalmanscan.core import sequential  # noqa: E402
from kalmanscan.cuda import _common  # noqa: E402
from kalmanscan.cuda import filter as F  # noqa: E402
from kalmanscan.testing import assert_close  # noqa: E402
from kalmanscan.validation.oracle import scalar_oracle  # noqa: E402
from tests.test_underflow_regimes import mp_filter  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
N = 4
PRIOR = (0.3, 0.5)  # lane 2's prior mean and variance
# decays whose square underflows to 0, is subnormal, or is normal but whose product over a few
# steps underflows
DECAYS = {
    "f64": (torch.float64, (1e-170, 1e-160, 1e-100)),
    "f32": (torch.float32, (1e-25, 1e-20, 1e-12)),
}
CASES = [(k, a) for k, (_, decays) in DECAYS.items() for a in decays]
# mpmath against the kernel: means relative to the lane's largest |mean|, variances and the
# log-likelihood relative (measured: float64 <= 4.1e-16, float32 <= 1.7e-7 at 63 and 1000 steps)
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _lengths(*Ts, gpu_only=()):
    # 1000 steps: ~10-20 s a call in the interpreter (slow step of CI); on a GPU always. Those in
    # gpu_only run on a GPU alone (the mpmath differences of 1000 steps take ~30 s a case; the
    # adjoint's chunk maps from the true starts are checked at 33 steps, 3 chunks, everywhere)
    out = []
    for T in Ts:
        if T in gpu_only and not CUDA:
            out.append(pytest.param(T, marks=pytest.mark.skip(reason="GPU only (a CUDA device)")))
        elif T >= 1000 and not CUDA:
            out.append(pytest.param(T, marks=pytest.mark.slow))
        else:
            out.append(T)
    return out


@pytest.fixture(autouse=True)
def chunked(monkeypatch):
    monkeypatch.setattr(_common, "POISON", True)
    monkeypatch.setattr(F, "_MANY_LANES", 10**9)
    monkeypatch.setitem(F.TUNING, "CK", 4)


def scenario(T, tiny, dtype):
    """``(z, [R, a, p, h, c] float64 [T, N], x0, G)``: the four lanes of the module docstring,
    their inputs rounded to ``dtype`` (so that the truth is that of the kernel's inputs); G, the
    length of the lanes' leading part."""
    g = np.random.default_rng(T)
    G = (2 * T) // 3
    z = g.normal(size=(T, N))
    z[G + 2 :: 7] = np.nan
    R = 0.4 + g.random((T, N))
    p = 0.05 + 0.3 * g.random((T, N))
    c = 0.2 * g.normal(size=(T, N))
    h = 0.7 + 0.6 * g.random((T, N))
    a = np.full((T, N), 0.9)
    a[:G] = tiny
    a[:, 1] = tiny
    h[:G, 1] = 0.0
    for n in (0, 2, 3):
        z[:G, n] = np.nan
    if G > 2:
        a[forget_step(G), 3] = 0.0
    params = [torch.tensor(x, dtype=dtype).double().numpy() for x in (R, a, p, h, c)]
    z = torch.tensor(z, dtype=dtype).double().numpy()
    m0, v0 = PRIOR
    u0 = np.array([0.0, 0.0, 1.0, 0.0])
    e0 = np.array([0.0, 0.0, m0, 0.0])
    v0 = np.array([1.0, 1.0, v0, 1.0])
    return z, params, (u0, e0, v0), G


def forget_step(G):
    """Lane 3's forgetting step: inside the gap, off a chunk's edge at 33 steps (13 of the
    middle chunk's 12-23)."""
    return G // 2 + 2


def gap_regime(T, params, G, dtype):
    """Assert the regime the scenario is for at ``T`` steps: chunked, and the tiny-decay gap
    ends (first informative step G) inside a later chunk that it enters diffuse, after steps
    of that chunk whose product of ``decay**2`` underflows in ``dtype``."""
    CH, NC = F._plan(T, N)[:2]
    assert NC >= 3 and CH < G < CH * (NC - 1) and G % CH != 0
    lead = torch.tensor(params[1][CH * (G // CH) : G, 0], dtype=dtype)
    assert len(lead) >= 2 and float(torch.prod(lead * lead)) == 0.0


def _t(x, dtype):
    return torch.tensor(np.asarray(x), dtype=dtype, device=DEVICE)


def _truth(z, params, n, dps=60, mp_loglik=False):
    R, a, p, h, c = (x[:, n] for x in params)
    lam0, m0 = (1 / PRIOR[1], PRIOR[0]) if n == 2 else (0.0, 0.0)
    return mp_filter(z[:, n], R, a, p, h, c, lam0=lam0, m0=m0, dps=dps, mp_loglik=mp_loglik)


def _rel_to_max(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    known = np.isfinite(ref)
    assert np.array_equal(np.isfinite(x), known)  # NaN / inf exactly where the truth's
    if not known.any():
        return 0.0
    return float(np.max(np.abs(x[known] - ref[known])) / np.max(np.abs(ref[known])))


def _rel(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    known = np.isfinite(ref)
    assert np.array_equal(np.isfinite(x), known)
    return float(np.max(np.abs(x[known] - ref[known]) / np.abs(ref[known]), initial=0.0))


@pytest.mark.parametrize("T", _lengths(1, 33, 1000))
@pytest.mark.parametrize("kind, tiny", CASES, ids=[f"{k}-a{a:g}" for k, a in CASES])
def test_filter_from_a_diffuse_start_matches_mpmath(T, kind, tiny):
    dtype = DECAYS[kind][0]
    z, params, x0, G = scenario(T, tiny, dtype)
    if T > 1:
        gap_regime(T, params, G, dtype)
    ins = [_t(z, dtype)] + [_t(x, dtype) for x in params]
    x0t = tuple(_t(x, dtype) for x in x0)
    got = F.filter_lanes(*ins, x0t)
    ll_only = F.filter_lanes(*ins, x0t, outputs="loglik")
    assert int(got["flags"]) == 0 and int(ll_only["flags"]) == 0
    tol = TOL[dtype]
    for n in range(N):
        m, v, ll = _truth(z, params, n)
        assert _rel_to_max(got["mean"][:, n].cpu(), m) < tol, n
        assert _rel(got["var"][:, n].cpu(), v) < tol, n
        for r in (got, ll_only):
            assert abs(float(r["loglik"][n]) - ll) <= tol * abs(ll), n
    ref = sequential.filter_lanes(*[_t(x, torch.float64).cpu() for x in [z, *params]],
                                  tuple(_t(x, torch.float64).cpu() for x in x0))  # fmt: skip
    for k in ("mean", "var", "pred_mean", "pred_var", "loglik"):
        assert_close(got[k].cpu(), ref[k], "kernel", dtype, what=k)


@pytest.mark.parametrize("T", _lengths(33, 1000))
@pytest.mark.parametrize("kind, tiny", CASES, ids=[f"{k}-a{a:g}" for k, a in CASES])
def test_smoother_from_a_diffuse_start_matches_mpmath(T, kind, tiny):
    """The smoothed moments where the truth's precision is a normal number of the dtype and its
    mean finite; elsewhere (the information about a step before a tiny decay is that decay
    squared times the later one's: below any float) the variance is inf and the mean not
    finite, as for a state nothing is known about."""
    dtype = DECAYS[kind][0]
    z, params, x0, G = scenario(T, tiny, dtype)
    gap_regime(T, params, G, dtype)
    ins = [_t(z, dtype)] + [_t(x, dtype) for x in params]
    got = F.smooth_lanes(*ins, tuple(_t(x, dtype) for x in x0))
    assert int(got["flags"]) == 0
    tiny_normal = torch.finfo(dtype).tiny
    tol = TOL[dtype]
    for n in range(N):
        R, a, p, h, c = (x[:, n] for x in params)
        prior = PRIOR if n == 2 else (0.0, math.inf)
        o = scalar_oracle(z[:, n], R, a, p, h, c, *prior, dps=60)
        sm, sv = got["smooth_mean"][:, n].cpu().double(), got["smooth_var"][:, n].cpu().double()
        ok = np.isfinite(o.smooth_mean) & (o.smooth_var > 0) & (1 / o.smooth_var >= tiny_normal)
        ok &= np.abs(o.smooth_mean) <= torch.finfo(dtype).max
        assert ok[-1] and ok.sum() >= T // 3
        scale = np.max(np.abs(o.smooth_mean[ok]))
        assert float(np.max(np.abs(sm.numpy()[ok] - o.smooth_mean[ok]))) <= tol * scale, n
        assert float(np.max(np.abs(sv.numpy()[ok] / o.smooth_var[ok] - 1))) <= tol, n
        gone = ~ok & ~(o.smooth_var < math.inf)
        assert torch.isinf(sv[gone]).all() and not torch.isfinite(sm[gone]).any(), n


def _direction(params, k):
    """The direction of a relative change of input ``k``: every entry, but for the decay only
    the entries that are not tiny (a tiny decay's own change moves nothing within float)."""
    d = params[k].copy()
    if k == 1:
        d[np.abs(d) < 1e-5] = 0.0
    return d


# a^2 underflowing to 0, subnormal, or normal: with a normal a^2 the adjoint of a diffuse
# state's precision grows like 1/a^2 a step and overflows over the diffuse gap (1e-100 in
# float64, 1e-12 in float32: before, NaN gradients); the steps' partials there are exact zeros
GRAD_CASES = CASES


@pytest.mark.parametrize("T", _lengths(33, 1000, gpu_only=(1000,)))
@pytest.mark.parametrize("kind, tiny", GRAD_CASES, ids=[f"{k}-a{a:g}" for k, a in GRAD_CASES])
def test_loglik_gradient_from_a_diffuse_start_matches_mpmath(T, kind, tiny):
    """The fused adjoint (chunked: the adjoint chunk maps of the rerun from the true starts):
    each lane's derivative along a relative change of each input against a central difference
    of the mpmath log-likelihood, and 0 for the steps up to a diffuse lane's first informative
    one (its state there is the same for any decay, process variance or offset)."""
    dtype = DECAYS[kind][0]
    z, params, x0, G = scenario(T, tiny, dtype)
    gap_regime(T, params, G, dtype)
    leaves = [_t(x, dtype).requires_grad_(True) for x in params]
    r = F.filter_lanes(_t(z, dtype), *leaves, tuple(_t(x, dtype) for x in x0), outputs="loglik")
    grads = [g.cpu().double().numpy() for g in torch.autograd.grad(r["loglik"].sum(), leaves)]
    for g in grads:
        assert np.isfinite(g).all()
    for k in (1, 2, 4):  # decay, process_var, offset: nothing up to the first informative step
        assert (grads[k][: G + 1, :2] == 0).all() and (grads[k][: forget_step(G), 3] == 0).all()
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    for n in range(N):
        for k in range(5):
            d = _direction(params, k)
            got = float((grads[k][:, n] * d[:, n]).sum())
            ref = _central_difference(z, params, n, k, d)
            assert abs(got - ref) <= tol * max(abs(ref), 1e-3), (n, k, got, ref)


def _central_difference(z, params, n, k, d, dps=60):
    """d/ds loglik(params + s d) of lane n at s = 0 by a central difference in mpmath (step
    1e-20: truncation ~1e-40, rounding ~1e-40 at 60 digits)."""
    import mpmath as mp

    with mp.workdps(dps):
        s = mp.mpf("1e-20")

        def ll(sign):
            moved = list(params)
            moved[k] = [mp.mpf(float(x)) + sign * s * mp.mpf(float(y))
                        for x, y in zip(params[k][:, n], d[:, n], strict=True)]  # fmt: skip
            cols = [
                m if i == k else x[:, n] for i, (m, x) in enumerate(zip(moved, params, strict=True))
            ]
            lam0, m0 = (1 / PRIOR[1], PRIOR[0]) if n == 2 else (0.0, 0.0)
            return mp_filter(z[:, n], *cols, lam0=lam0, m0=m0, dps=dps, mp_loglik=True)[2]

        return float((ll(1) - ll(-1)) / (2 * s))


# ------------------------------------------------------- a tiny decay meets a known state (carry)

KNOWN = {"f64": (torch.float64, 1e-170, 1e100), "f32": (torch.float32, 1e-25, 1e30)}


def known_scenario(T, kind):
    """``(z, [R, a, p, h, c], x0, prior lam0 / m0 per lane)``: a step whose decay's square is
    below the normal range, without process noise, meets a known state of huge variance, so that
    the variance after it is ``decay**2 * big`` (1e-240 in float64, 1e-20 in float32) and stays
    that small (no process noise after it) into the later chunks:

    - 0: the prior's variance ``big``, not observed before the step at 5 (among chunk 0's
      leading steps);
    - 1: diffuse, observed from step 0; process variance ``big`` at 19 (not observed), the step
      at 20 (chunk 1, after its informative steps);
    - 2: as 1 with the two steps at 30 and 31 (the last of chunk 1);
    - 3: an ordinary lane (decay 0.9, process variance 0.1), diffuse.
    """
    dtype, tiny, big = KNOWN[kind]
    g = np.random.default_rng(7)
    z = g.normal(size=(T, N))
    z[:6, 0] = np.nan
    z[::9, 1:] = np.nan
    R = 0.5 + g.random((T, N))
    h = 0.8 + 0.4 * g.random((T, N))
    c = 0.1 * g.normal(size=(T, N))
    a = np.full((T, N), 0.9)
    p = np.full((T, N), 0.1)
    a[5, 0], p[5:, 0] = tiny, 0.0
    for n, t in ((1, 20), (2, 31)):
        z[t - 1 : t + 1, n] = np.nan
        p[t - 1, n], a[t, n], p[t:, n] = big, tiny, 0.0
    params = [torch.tensor(x, dtype=dtype).double().numpy() for x in (R, a, p, h, c)]
    z = torch.tensor(z, dtype=dtype).double().numpy()
    big = float(torch.tensor(big, dtype=dtype))
    x0 = (np.array([1 / big, 0.0, 0.0, 0.0]), np.array([0.4 / big, 0.0, 0.0, 0.0]),
          np.array([1.0, 1.0, 1.0, 1.0]))  # fmt: skip
    return z, params, x0, (1 / big, 0.4)


@pytest.mark.parametrize("kind", ["f64", "f32"])
def test_tiny_decay_meets_a_known_state_across_chunks(kind):
    """The carry walks a chunk holding such a step (its map loses ``decay**2 v``: the next
    chunks started from variance 0, the state known exactly, before): filtered means, variances
    and the log-likelihood against mpmath, 3 chunks of 16 (the steps at 5, 20 and 31 in the first
    and middle ones, the last chunk after them); the fused log-likelihood gradient against the
    float64 sequential reference's."""
    T = 40
    dtype = KNOWN[kind][0]
    z, params, x0, (lam0, m0) = known_scenario(T, kind)
    assert F._plan(T, N)[:2] == (16, 3)
    ins = [_t(z, dtype)] + [_t(x, dtype) for x in params]
    x0t = tuple(_t(x, dtype) for x in x0)
    got = F.filter_lanes(*ins, x0t)
    assert int(got["flags"]) == 0
    tol = TOL[dtype]
    for n in range(N):
        R, a, p, h, c = (x[:, n] for x in params)
        m, v, ll = mp_filter(z[:, n], R, a, p, h, c, lam0=lam0 if n == 0 else 0.0,
                             m0=m0 if n == 0 else 0.0)  # fmt: skip
        assert _rel(got["var"][:, n].cpu(), v) < tol, n
        assert _rel_to_max(got["mean"][:, n].cpu(), m) < tol, n
        assert abs(float(got["loglik"][n]) - ll) <= tol * abs(ll), n
    leaves = [_t(x, dtype).requires_grad_(True) for x in params]
    r = F.filter_lanes(_t(z, dtype), *leaves, x0t, outputs="loglik")
    grads = torch.autograd.grad(r["loglik"].sum(), leaves)
    ref_leaves = [torch.tensor(x).requires_grad_(True) for x in params]
    ref = sequential.filter_lanes(torch.tensor(z), *ref_leaves,
                                  tuple(torch.tensor(x) for x in x0), outputs="loglik")  # fmt: skip
    ref_grads = torch.autograd.grad(ref["loglik"].sum(), ref_leaves)
    for k, (g, gr) in enumerate(zip(grads, ref_grads, strict=True)):
        assert torch.isfinite(g).all(), k
        assert_close(g.cpu(), gr, "kernel_grad", dtype, what=f"input {k}")
