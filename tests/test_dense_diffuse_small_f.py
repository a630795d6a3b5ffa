"""A diffuse prior with a small nonzero entry of ``F`` over a leading gap, and singular ``F``,
against the exact diffuse limit (dense audit; docs/dense.md, "Exact diffuse start").

``F = diag(a, 0.9[, 0.5])`` with ``a`` from 1e-8 to 1e-200, ``H = I``, the first 1, 3 or 10 steps
missing: at the first observation the first state's diffuse part is ``kappa a^(2 g + 2)``, still
infinite as ``kappa -> inf`` (``F * inf = inf``), so its entry is diffuse and adds no term. Every
dense backend took that direction as resolved (its diffuse factor's column, ``a^(g + 1)`` times
the others', was under the entries' test ``|D'h| > 1e-11 |h| |D|_F``, and its squares underflow
from ``a = 1e-100``): log-likelihood 0.4 % to 9.2 % off (NaN on ``native`` in 6 of the 30 float64
cases), filtered means up to 3.3 sd off or covariances infinite at proper steps, smoothed means
up to 2.6e50 sd off (``sequential``, ``torch``); float32 alike. Singular ``F`` seen by entries
that mix states: ``native`` 36 nats off on a rank-one ``u v'``, every backend NaN or 20 nats off
on a rank two of three. The predicted factor now becomes an orthonormal basis of its numerical
range where its columns are of sizes far apart, at the rounding level of their own product (a
direction ``F`` forgets) or dependent (``sequential.factor_basis``; ``factor_basis`` in
``_native_dense.c``).

Truth: Durbin & Koopman's exact initial filter in exact rational arithmetic on the float inputs
(``fractions.Fraction``: ``P_inf = F P_inf F'`` exactly, an entry diffuse exactly where its
``f_inf`` is nonzero, the convention's ``pdet`` from principal minors), logarithms in mpmath at
60 digits; smoothed moments from its filtered ones by Rauch-Tung-Striebel in rationals after
the diffuse steps, and at the diffuse steps from an mpmath covariance filter started at
``kappa = 10^(E + 60)`` (``10^-E`` the smallest diffuse part) at ``E + 120`` digits, whose
log-likelihood equals the exact one to 1e-40 (``test_exact_limit_is_the_large_kappa_limit``).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from itertools import combinations

import mpmath as mp
import numpy as np
import pytest
import torch

import kalmanscan.dense as kd
from kalmanscan.dense import native, sequential
from kalmanscan.testing import TOLERANCES

BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else [])
TOL64 = TOLERANCES[("rounding", "float64")]  # measured <= 4e-15 (log-likelihood, sd, covariance)
TOL32 = TOLERANCES[("truth", "float32")]  # measured <= 2.6e-7
Z = Fraction(0)


def _q(x):
    return [[Fraction(float(v)) for v in row] for row in np.atleast_2d(x)]


def _dot(x, y):
    return sum((a * b for a, b in zip(x, y, strict=True)), Z)


def _mm(A, B):
    return [[_dot(r, c) for c in _t(B)] for r in A]


def _mv(A, x):
    return [_dot(r, x) for r in A]


def _t(A):
    return [[r[j] for r in A] for j in range(len(A[0]))]


def _add(A, B, c=1):
    """A + c B (lists of lists)."""
    return [[x + c * y for x, y in zip(r, s, strict=True)] for r, s in zip(A, B, strict=True)]


def _outer(x, y, c):
    """c x y'."""
    return [[c * a * b for b in y] for a in x]


def _det(A):
    M, d = [list(r) for r in A], Fraction(1)
    for j in range(len(M)):
        p = next((i for i in range(j, len(M)) if M[i][j] != 0), None)
        if p is None:
            return Z
        M[j], M[p], d = M[p], M[j], d if p == j else -d
        d *= M[j][j]
        for i in range(j + 1, len(M)):
            f = M[i][j] / M[j][j]
            M[i] = [a - f * b for a, b in zip(M[i], M[j], strict=True)]
    return d


def _inv(A):
    n = len(A)
    M = [list(r) + [Fraction(int(i == j)) for j in range(n)] for i, r in enumerate(A)]
    for j in range(n):
        p = next(i for i in range(j, n) if M[i][j] != 0)
        M[j], M[p] = M[p], M[j]
        M[j] = [v / M[j][j] for v in M[j]]
        for i in range(n):
            if i != j and M[i][j] != 0:
                M[i] = [a - M[i][j] * b for a, b in zip(M[i], M[j], strict=True)]
    return [r[n:] for r in M]


def _mpf(q):
    return mp.mpf(q.numerator) / q.denominator


def _np(xs):
    """float64 array of rational vectors or matrices (correctly rounded)."""
    return np.array([[float(v) for v in x] if not isinstance(x[0], list)
                     else [[float(v) for v in r] for r in x] for x in xs])  # fmt: skip


def exact_limit(z, F, Q, H, R, dps=60):
    """Durbin & Koopman's exact initial filter from a fully diffuse prior (mean 0), in rationals;
    ``R`` diagonal (entries one at a time). The log-likelihood in kalmanscan's convention
    (docs/dense.md: a diffuse step adds ``- 1/2 sum log f_inf + 1/2 log pdet(H P_inf H')``), the
    filtered and predicted moments (rational), per step whether ``P_inf`` is nonzero and its
    nonzero pattern, and the reach ``H P_inf- H'`` of each step with its rank."""
    T, d = z.shape
    n = F.shape[-1]
    Fq, Qq, Hq = _q(F), _q(Q), _q(H)
    a, P = [Z] * n, [[Z] * n for _ in range(n)]
    Pinf = [[Fraction(int(i == j)) for j in range(n)] for i in range(n)]
    out = {k: [] for k in ("mean", "cov", "pmean", "pcov", "pinf", "reach")}
    with mp.workdps(dps):
        ll = mp.mpf(0)
        for t in range(T):
            a = _mv(Fq, a)
            P = _add(_mm(_mm(Fq, P), _t(Fq)), Qq)
            Pinf = _mm(_mm(Fq, Pinf), _t(Fq))
            out["pmean"].append(a)
            out["pcov"].append(P)
            idx = [i for i in range(d) if np.isfinite(z[t, i])]
            A = _mm(_mm([Hq[i] for i in idx], Pinf), _t([Hq[i] for i in idx])) if idx else []
            r, pd = 0, Fraction(1)
            for k in range(len(idx), 0, -1):  # pdet: e_k of the largest k where it is nonzero
                s = sum((_det([[A[i][j] for j in c] for i in c])
                         for c in combinations(range(len(idx)), k)), Z)  # fmt: skip
                if s != 0:
                    r, pd = k, s
                    break
            out["reach"].append((idx, A, r))
            nd = 0
            for i in idx:
                h = Hq[i]
                v = Fraction(float(z[t, i])) - _dot(h, a)
                Mi, Ms = _mv(Pinf, h), _mv(P, h)
                fi, fs = _dot(h, Mi), _dot(h, Ms) + Fraction(float(R[i, i]))
                if fi != 0:  # Koopman & Durbin's exact initial update
                    nd += 1
                    a = [x + m * v / fi for x, m in zip(a, Mi, strict=True)]
                    P = _add(_add(P, _outer(Mi, Mi, fs / fi**2)), _outer(Ms, Mi, 1 / fi), -1)
                    P = _add(P, _outer(Mi, Ms, 1 / fi), -1)
                    Pinf = _add(Pinf, _outer(Mi, Mi, 1 / fi), -1)
                    ll -= mp.log(_mpf(fi)) / 2
                elif fs != 0:
                    a = [x + m * v / fs for x, m in zip(a, Ms, strict=True)]
                    P = _add(P, _outer(Ms, Ms, 1 / fs), -1)
                    ll -= (mp.log(2 * mp.pi) + mp.log(_mpf(fs)) + _mpf(v * v / fs)) / 2
            assert nd == r  # the diffuse entries of a step are rank(H P_inf H')
            if r:
                ll += mp.log(_mpf(pd)) / 2
            out["mean"].append(a)
            out["cov"].append(P)
            out["pinf"].append(np.array([[x != 0 for x in row] for row in Pinf]))
        out["loglik"], out["loglik_mp"] = float(ll), ll
    out["diffuse"] = np.array([p.any() for p in out["pinf"]])
    return out


def exact_smooth(ex, F, start):
    """Rauch-Tung-Striebel smoothed (mean, cov) at steps ``start..`` (proper) from the exact
    filtered moments, in rationals."""
    Fq, T = _q(F), len(ex["mean"])
    ms, Ps = [ex["mean"][-1]], [ex["cov"][-1]]
    for t in range(T - 2, start - 1, -1):
        J = _mm(_mm(ex["cov"][t], _t(Fq)), _inv(ex["pcov"][t + 1]))
        dm = [x - y for x, y in zip(ms[0], ex["pmean"][t + 1], strict=True)]
        ms.insert(0, [x + y for x, y in zip(ex["mean"][t], _mv(J, dm), strict=True)])
        dP = _add(Ps[0], ex["pcov"][t + 1], -1)
        Ps.insert(0, _add(ex["cov"][t], _mm(_mm(J, dP), _t(J))))
    return _np(ms), _np(Ps)


def kappa_filter(z, F, Q, H, R, ex, E):
    """mpmath covariance filter and RTS smoother from ``N(0, kappa I)``, ``kappa = 10^(E + 60)``,
    at ``E + 120`` digits: the log-likelihood in the convention (``log N(z_t) - log N(U' z_t)``,
    ``U`` an orthonormal basis of the step's exact reach), filtered and smoothed moments."""
    T, n = z.shape[0], F.shape[-1]
    with mp.workdps(E + 120):
        M = lambda A: mp.matrix(np.atleast_2d(A).tolist())  # noqa: E731
        Fm, Qm, Hm = M(F), M(Q), M(H)
        a, P = mp.matrix(n, 1), mp.eye(n) * mp.mpf(10) ** (E + 60)
        fm, fP, pm, pP, ll = [], [], [], [], mp.mpf(0)
        for t in range(T):
            a, P = Fm * a, Fm * P * Fm.T + Qm
            pm.append(a)
            pP.append(P)
            idx, A, r = ex["reach"][t]
            if idx:
                Ho = mp.matrix([[Hm[i, j] for j in range(n)] for i in idx])
                S = Ho * P * Ho.T + mp.diag([mp.mpf(float(R[i, i])) for i in idx])
                v = mp.matrix([mp.mpf(float(z[t, i])) for i in idx]) - Ho * a
                ll -= (len(idx) * mp.log(2 * mp.pi) + mp.log(mp.det(S))
                       + (v.T * mp.inverse(S) * v)[0]) / 2  # fmt: skip
                if r:
                    w, V = mp.eigsy(mp.matrix([[_mpf(x) for x in row] for row in A]))
                    top = sorted(range(len(idx)), key=lambda j: -w[j])[:r]
                    U = mp.matrix([[V[i, j] for j in top] for i in range(len(idx))])
                    S2, v2 = U.T * S * U, U.T * v
                    ll += (r * mp.log(2 * mp.pi) + mp.log(mp.det(S2))
                           + (v2.T * mp.inverse(S2) * v2)[0]) / 2  # fmt: skip
                K = P * Ho.T * mp.inverse(S)
                a, P = a + K * v, P - K * S * K.T
            fm.append(a)
            fP.append(P)
        sm, sP = [fm[-1]], [fP[-1]]
        for t in range(T - 2, -1, -1):
            J = fP[t] * Fm.T * mp.inverse(pP[t + 1])
            sm.insert(0, fm[t] + J * (sm[0] - pm[t + 1]))
            sP.insert(0, fP[t] + J * (sP[0] - pP[t + 1]) * J.T)
        flt = lambda xs: np.array([[[float(X[i, j]) for j in range(X.cols)]  # noqa: E731
                                    for i in range(X.rows)] for X in xs])  # fmt: skip
        return dict(loglik=ll, mean=flt(fm)[..., 0], cov=flt(fP), smean=flt(sm)[..., 0],
                    scov=flt(sP))  # fmt: skip


# ---------------------------------------------------------------------------------- cases


def small_f_case(n, a, gap):
    """``F = diag(a, 0.9[, 0.5])``, ``H = I``, the first ``gap`` steps missing, 8 observed."""
    F = np.diag([a, 0.9, 0.5][:n])
    Q, R = np.diag([1.0, 0.5, 0.3][:n]), np.diag([1.0, 2.0, 0.7][:n])
    z = np.random.default_rng(0).normal(size=(gap + 8, n)) * 2
    z[:gap] = np.nan
    return z, F, Q, np.eye(n), R


@functools.cache
def small_f_truth(n, a, gap):
    z, F, Q, H, R = small_f_case(n, a, gap)
    ex = exact_limit(z, F, Q, H, R)
    tau = int(np.argmin(ex["diffuse"]))  # the first proper step
    ex["smooth"] = exact_smooth(ex, F, tau)
    E = math.ceil(-2 * (gap + 1) * math.log10(a))  # the smallest diffuse part: a^(2 gap + 2)
    ex["kappa"] = kappa_filter(z, F, Q, H, R, ex, E) if E <= 400 else None
    return ex


def _sd_err(mean, cov, ref_mean, ref_cov):
    """(max |mean - ref| in reference sds, max |cov - ref| / (sd_i sd_j)) over steps with a
    finite reference."""
    sd = np.sqrt(np.diagonal(ref_cov, axis1=-2, axis2=-1))
    em = np.abs(mean - ref_mean) / sd
    ec = np.abs(cov - ref_cov) / (sd[..., :, None] * sd[..., None, :])
    return float(em.max(initial=0.0)), float(ec.max(initial=0.0))


def _check_against(res, ex, tol, label):
    f = res.filtered
    np.testing.assert_array_equal(np.asarray(f.diffuse), ex["diffuse"], err_msg=label)
    assert abs(float(f.loglik) - ex["loglik"]) <= tol * abs(ex["loglik"]), (label, float(f.loglik))
    prop = ~ex["diffuse"]
    em, ec = _sd_err(f.mean[prop], f.cov[prop], _np(ex["mean"])[prop], _np(ex["cov"])[prop])
    assert em <= tol and ec <= tol, (label, "filtered", em, ec)
    tau = int(np.argmin(ex["diffuse"]))
    em, ec = _sd_err(res.mean[tau:], res.cov[tau:], *ex["smooth"])
    assert em <= tol and ec <= tol, (label, "smoothed", em, ec)


# ---------------------------------------------------------------------------------- tests


SLOW = pytest.mark.slow


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gap", [1, 3, 10])
@pytest.mark.parametrize(
    "a", [1e-8, pytest.param(1e-20, marks=SLOW), pytest.param(1e-50, marks=SLOW),
          pytest.param(1e-100, marks=SLOW), 1e-200]
)  # fmt: skip
@pytest.mark.parametrize("n", [2, 3])
def test_small_f_entry_stays_diffuse(backend, n, a, gap):
    """The direction stays diffuse until it is observed: log-likelihood, diffuse flags, filtered
    moments after the diffuse steps (``inf`` exactly in the diffuse states' entries before), and
    smoothed moments at every step (at the diffuse steps where the truth's variances are inside
    the range: ``1 / a^2`` a step back into the gap), against the exact limit."""
    z, F, Q, H, R = small_f_case(n, a, gap)
    ex = small_f_truth(n, a, gap)
    res = kd.smooth(z, F, Q, H, R, backend=backend)
    _check_against(res, ex, TOL64, backend)
    f = res.filtered
    for t in np.flatnonzero(ex["diffuse"]):  # +-inf exactly in the diffuse states' entries
        np.testing.assert_array_equal(np.isinf(f.cov[t]), ex["pinf"][t], err_msg=str(t))
    if ex["kappa"] is not None:  # the diffuse steps' smoothed moments
        sm, sP = ex["kappa"]["smean"], ex["kappa"]["scov"]
        var = np.diagonal(sP, axis1=-2, axis2=-1)
        ok = (var < 1e300).all(-1)
        em, ec = _sd_err(res.mean[ok], res.cov[ok], sm[ok], sP[ok])
        assert em <= TOL64 and ec <= TOL64, ("diffuse steps", em, ec)
        assert np.isinf(np.diagonal(res.cov, axis1=-2, axis2=-1)[var > 1e308]).all()


@functools.cache
def float32_truth(n, a, gap):
    """The exact limit of the float32-rounded inputs."""
    z, F, Q, H, R = (x.astype(np.float32).astype(np.float64) for x in small_f_case(n, a, gap))
    ex = exact_limit(z, F, Q, H, R)
    ex["smooth"] = exact_smooth(ex, F, int(np.argmin(ex["diffuse"])))
    return ex


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "sequential"])
@pytest.mark.parametrize("gap", [1, 3, 10])
@pytest.mark.parametrize("a", [1e-8, 1e-20, 1e-30])
@pytest.mark.parametrize("n", [2, 3])
def test_small_f_entry_stays_diffuse_float32(backend, n, a, gap):
    """float32 inputs (native computes in float64): against the exact limit of the rounded
    inputs, within float32's tolerance against a float64 truth (was 0.1 % to 9 % off)."""
    z, F, Q, H, R = (x.astype(np.float32) for x in small_f_case(n, a, gap))
    res = kd.smooth(z, F, Q, H, R, backend=backend)
    ex = float32_truth(n, a, gap)
    assert res.mean.dtype == np.float32
    _check_against(res, ex, TOL32, backend)


SINGULAR_F = {
    "half-ones": np.array([[0.5, 0.5], [0.5, 0.5]]),
    "u-v'": np.outer([1.0, 2.0], [0.5, 0.25]),  # rank one exactly in floats
    "u-v'-3": np.outer([1.0, -2.0, 0.5], [0.25, 0.5, 1.0]),
    "rank-two-of-three": np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.5]]) * 0.5,
    "zero-column": np.diag([0.0, 0.9]),
}


def singular_case(name, gap, H):
    F = SINGULAR_F[name]
    n = F.shape[0]
    Hm = np.eye(n) if H == "I" else np.triu(np.ones((n, n)))
    Q, R = np.diag(np.linspace(1.0, 0.5, n)), np.diag(np.linspace(1.0, 2.0, n))
    z = np.random.default_rng(1).normal(size=(gap + 6, n))
    z[:gap] = np.nan
    return z, F, Q, Hm, R


@functools.cache
def singular_truth(name, gap, H):
    z, F, Q, Hm, R = singular_case(name, gap, H)
    ex = exact_limit(z, F, Q, Hm, R)
    ex["smooth"] = exact_smooth(ex, F, int(np.argmin(ex["diffuse"])))
    return ex


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("H", ["I", "mixing"])
@pytest.mark.parametrize("gap", [0, 1, 3])
@pytest.mark.parametrize("name", list(SINGULAR_F))
def test_singular_f_forgets_exactly_what_it_maps_to_zero(backend, name, gap, H):
    """A singular F with a diffuse prior (the audit's rank-one F, re-checked): the directions F
    maps to 0 are forgotten, the others stay diffuse; entries observing the whole state one at
    a time (``H = I``) or mixing its states (upper triangle of ones)."""
    z, F, Q, Hm, R = singular_case(name, gap, H)
    res = kd.smooth(z, F, Q, Hm, R, backend=backend)
    _check_against(res, singular_truth(name, gap, H), TOL64, f"{backend} {name}")


MIXING_H = {
    "2:[[1,1],[1,-1]]": np.array([[1.0, 1.0], [1.0, -1.0]]),
    "2:[[0,1],[1,1]]": np.array([[0.0, 1.0], [1.0, 1.0]]),
    "3:upper-ones": np.triu(np.ones((3, 3))),
    "3:[[1,1,0],[0,0,1],[1,0,0]]": np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]),
}


@functools.cache
def mixing_truth(name, a, gap):
    H = MIXING_H[name]
    z, F, Q, _, R = small_f_case(H.shape[1], a, gap)
    ex = exact_limit(z, F, Q, H, R)
    ex["smooth"] = exact_smooth(ex, F, int(np.argmin(ex["diffuse"])))
    return ex


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gap", [1, 3])
@pytest.mark.parametrize("a", [1e-20, pytest.param(1e-150, marks=SLOW)])
@pytest.mark.parametrize("name", list(MIXING_H))
def test_small_f_entry_seen_with_other_states(backend, name, a, gap):
    """Entries that see the small direction together with the others (the Householder
    reflection of a factor whose columns were 1e-40 apart lost the remaining direction)."""
    H = MIXING_H[name]
    z, F, Q, _, R = small_f_case(H.shape[1], a, gap)
    res = kd.smooth(z, F, Q, H, R, backend=backend)
    _check_against(res, mixing_truth(name, a, gap), TOL64, f"{backend} {name}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("a", [1e-8, 1e-50])
def test_loglik_gradient_against_exact_differences(backend, a):
    """d loglik / d (the diagonals of F, Q, R) against central differences of the exact limit
    (rational, so only the step's truncation, ~1e-13): the basis's derivative is that of its
    range; a derivative along the basis itself (1 / a times its rounding) was 9e-9 off."""
    n, gap = 3, 1
    z, F, Q, H, R = small_f_case(n, a, gap)
    ps = [torch.tensor(np.diag(x).copy(), requires_grad=True) for x in (F, Q, R)]
    res = kd.filter(torch.tensor(z), *(torch.diag_embed(p) for p in ps[:2]), torch.tensor(H),
                    torch.diag_embed(ps[2]), backend=backend)  # fmt: skip
    res.loglik.backward()
    for which, p in enumerate(ps):
        for i in range(n):
            args = [np.diag(x).copy() for x in (F, Q, R)]
            h = args[which][i] * 1e-7
            up, dn = [x.copy() for x in args], [x.copy() for x in args]
            up[which][i] += h
            dn[which][i] -= h
            ll = [exact_limit(z, np.diag(s[0]), np.diag(s[1]), H, np.diag(s[2]), dps=200)
                  for s in (up, dn)]  # fmt: skip
            with mp.workdps(200):
                fd = float(
                    (ll[0]["loglik_mp"] - ll[1]["loglik_mp"]) / (up[which][i] - dn[which][i])
                )
            assert abs(float(p.grad[i]) - fd) <= 1e-10 * max(1.0, abs(fd)), (which, i)


@pytest.mark.parametrize("n,a,gap", [(2, 1e-8, 3), (3, 1e-100, 1), (2, 1e-50, 3)])
def test_exact_limit_is_the_large_kappa_limit(n, a, gap):
    """The reference itself: the exact rational filter's log-likelihood equals that of a
    covariance filter started at kappa = 10^(E + 60) (E + 120 digits; 10^-E the smallest
    diffuse part) to 1e-40, and its filtered moments after the diffuse steps to the last bit."""
    ex = small_f_truth(n, a, gap)
    kf = ex["kappa"]
    assert abs(kf["loglik"] - ex["loglik_mp"]) < mp.mpf(10) ** -40
    prop = ~ex["diffuse"]
    np.testing.assert_array_equal(kf["mean"][prop], _np(ex["mean"])[prop])
    np.testing.assert_array_equal(kf["cov"][prop], _np(ex["cov"])[prop])


def test_ordinary_factor_is_returned_unchanged():
    """The rule changes nothing where the columns are of comparable size, independent and above
    the rounding of their product (ordinary models keep every bit): the same tensor comes back;
    a graded, a forgotten and a dependent column each give an orthonormal basis of the range."""
    rng = np.random.default_rng(7)
    tol = 1e-11
    for n in (1, 2, 3, 5):
        for _ in range(20):
            F = torch.tensor(rng.normal(size=(1, n, n)))
            Dp = torch.linalg.qr(torch.tensor(rng.normal(size=(1, n, n))))[0]
            k = int(rng.integers(1, n + 1))
            Dp = Dp * (torch.arange(n) < k)
            D = F @ Dp
            out, kk = sequential.factor_basis(F, Dp, D, torch.tensor([k]), tol)
            assert out is D and int(kk) == k
    eye = torch.eye(2, dtype=torch.float64)[None]
    for f, k_new in (([[1e-30, 0.0], [0.0, 0.9]], 2), ([[0.0, 0.0], [0.0, 0.9]], 1),
                     ([[0.5, 0.5], [0.5, 0.5]], 1)):  # fmt: skip
        F = torch.tensor([f], dtype=torch.float64)
        out, kk = sequential.factor_basis(F, eye, F @ eye, torch.tensor([2]), tol)
        assert int(kk) == k_new
        Qb = out[0, :, :k_new]
        torch.testing.assert_close(Qb.T @ Qb, torch.eye(k_new, dtype=torch.float64))
        P = Qb @ Qb.T  # the range of F: its projector
        U = torch.linalg.svd(F[0])[0][:, :k_new]
        torch.testing.assert_close(P, U @ U.T)
