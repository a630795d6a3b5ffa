"""Dense models as users write them: partly diffuse and precision priors in batches, gradients
w.r.t. R under a diffuse prior, fits of time-varying models, covariances symmetric up to rounding,
the diagonal backend's predictions, the output dtype, and -inf in a prior covariance.

Truth: an mpmath covariance filter (70 digits) started at ``kappa = 1e30`` along the diffuse
directions, its log-likelihood by docs/dense.md's definition (the density of ``z_t`` with the
directions the diffuse state reaches projected out), or closed forms.
"""

from __future__ import annotations

import functools

import mpmath as mp
import numpy as np
import pytest
import scipy.linalg as sl
import torch

import kalmanscan.dense as kd
from kalmanscan.dense import native

needs_native = pytest.mark.skipif(not native.available(), reason="native extension not built")
NATIVE = pytest.param("native", marks=needs_native)
BACKENDS = [NATIVE, "torch", "sequential"]
KAPPA = mp.mpf(10) ** 30


def _mpm(a):
    a = np.asarray(a, dtype=np.float64)
    return mp.matrix(a.tolist()) if a.ndim == 2 else mp.matrix(a.reshape(-1, 1).tolist())


def _at(a, t, k):
    a = np.asarray(a, dtype=np.float64)
    return a[t] if a.ndim == k + 1 else a


def _proper_term(S, v, k):
    """The step's log-density term of the docs' convention: the density of the innovation ``v``
    (covariance ``S``, mpmath) outside the observation directions the diffuse state reaches
    (``S / KAPPA``'s eigenvectors above 1e-12)."""
    E, V = mp.eigsy(S / KAPPA)
    Pp = mp.eye(k)
    for i in range(k):
        if E[i] > mp.mpf(10) ** -12:
            Pp = Pp - V[:, i] * V[:, i].T
    Sp = Pp * S * Pp
    E2, V2 = mp.eigsy((Sp + Sp.T) / 2)
    top = max(1, max(abs(x) for x in E2))
    term = mp.mpf(0)
    for i in range(k):
        if E2[i] > mp.mpf(10) ** -30 * top:
            q = (V2[:, i].T * (Pp * v))[0]
            term += -(mp.log(2 * mp.pi) + mp.log(E2[i]) + q**2 / E2[i]) / 2
    return term


def mp_loglik(z, F, Q, H, R, P_fin, D_inf=None, m0=None, dps=70):
    """Log-likelihood of the docs' convention from an mpmath covariance filter started at
    ``N(m0, P_fin + kappa D_inf D_inf')`` (``D_inf`` [n, k] spans the diffuse directions; the
    product is formed in mpmath, exactly rank k); float64 inputs converted exactly."""
    with mp.workdps(dps):
        z = np.asarray(z, dtype=np.float64)
        T, d = z.shape
        n = np.shape(F)[-1]
        m = _mpm(np.zeros(n) if m0 is None else m0)
        P = _mpm(P_fin)
        if D_inf is not None:
            D = _mpm(D_inf)
            P = P + KAPPA * (D * D.T)
        total = mp.mpf(0)
        for t in range(T):
            Ft, Qt = _mpm(_at(F, t, 2)), _mpm(_at(Q, t, 2))
            Ht, Rt = _mpm(_at(H, t, 2)), _mpm(_at(R, t, 2))
            m = Ft * m
            P = Ft * P * Ft.T + Qt
            obs = [i for i in range(d) if not np.isnan(z[t, i])]
            if not obs:
                continue
            k = len(obs)
            Ho = mp.matrix([[Ht[i, j] for j in range(n)] for i in obs])
            Ro = mp.matrix([[Rt[i, j] for j in obs] for i in obs])
            v = mp.matrix([[mp.mpf(float(z[t, i]))] for i in obs]) - Ho * m
            S = Ho * P * Ho.T + Ro
            total += _proper_term(S, v, k)
            K = P * Ho.T * S**-1
            m = m + K * v
            P = P - K * S * K.T
            P = (P + P.T) / 2
        return total


def _llt_ar():
    return kd.add_components(
        kd.local_linear_trend(1.0, 0.01, 1.0),
        kd.DenseModel(np.array([[0.8]]), np.array([[0.5]]), np.array([[1.0]]),
                      np.array([[0.0]]), np.zeros(1)),
    )  # fmt: skip


# -- 1. a proper prior direction is never made diffuse by the precision form -----------------------


@functools.cache
def _vague_case():
    m = kd.local_linear_trend(level_var=1.0, slope_var=0.01, obs_var=1.0)
    z = np.random.default_rng(0).normal(size=(30, 2, 1)).cumsum(0)
    P1 = np.diag([1e7, 1e-7])
    truth = float(mp_loglik(z[:, 1], m.F, m.Q, m.H, m.R, P1))
    P0 = np.diag([np.inf, 1.0])
    truth0 = float(mp_loglik(z[:, 0], m.F, m.Q, m.H, m.R, np.diag([0.0, 1.0]), np.eye(2)[:, :1]))
    return m, z, P1, P0, truth, truth0


@pytest.mark.parametrize("backend", BACKENDS)
def test_proper_prior_next_to_a_diffuse_series_against_mpmath(backend):
    """A vague but proper prior (variances 1e7 and 1e-7) gives the same log-likelihood alone, in a
    batch beside a series with a diffuse state (prior_cov with inf), and as prior_precision
    (was 9 nats off in the batch and with the precision: the 1e-7 direction called diffuse)."""
    m, z, P1, P0, truth, truth0 = _vague_case()
    alone = kd.filter(z[:, 1], **m._asdict(), prior_cov=P1, backend=backend)
    batch = kd.filter(z, **m._asdict(), prior_cov=np.stack([P0, P1]), backend=backend)
    prec = kd.filter(z[:, 1], **m._asdict(), prior_precision=np.linalg.inv(P1), backend=backend)
    for ll in (alone.loglik, batch.loglik[1], prec.loglik):
        assert abs(ll - truth) <= 1e-9 * abs(truth)
    assert abs(batch.loglik[0] - truth0) <= 1e-10 * abs(truth0)
    assert not batch.diffuse.any() and not prec.diffuse.any()  # step 0 resolves the level


@functools.cache
def _float32_case():
    m = _llt_ar()
    z = np.random.default_rng(0).normal(size=(30, 2, 1)).cumsum(0)
    P0 = np.diag([1e3, 1e-3, np.inf])
    Pf, Pi = np.diag([1e3, 1e-3, 0.0]), np.eye(3)[:, 2:]
    truth = float(mp_loglik(z[:, 0], m.F, m.Q, m.H, m.R, Pf, Pi))
    P2 = np.diag([1e3, 1e-3, 1.0])
    truth2 = float(mp_loglik(z[:, 1], m.F, m.Q, m.H, m.R, P2))
    return m, z, P0, P2, truth, truth2


@pytest.mark.parametrize("backend", [NATIVE, "torch"])
def test_float32_partly_diffuse_prior_against_mpmath(backend):
    """float32, one diffuse state (inf) beside a proper block with variances 1e3 and 1e-3, alone
    and batched beside a proper series: within float32's tolerance of the mpmath truth (was 2.8
    nats off, and step 0 called diffuse, on the torch path: 64 eps float32 is 7.6e-6)."""
    m, z, P0, P2, truth, truth2 = _float32_case()
    for dt, tol in ((np.float64, 1e-10), (np.float32, 2e-5)):
        r = kd.filter(z[:, 0].astype(dt), **m._asdict(), prior_cov=P0, backend=backend)
        assert abs(float(r.loglik) - truth) <= tol * abs(truth)
        assert not r.diffuse.any()  # step 0's entry resolves the one diffuse state
        b = kd.filter(z.astype(dt), **m._asdict(), prior_cov=np.stack([P0, P2]), backend=backend)
        assert abs(float(b.loglik[0]) - truth) <= tol * abs(truth)
        assert abs(float(b.loglik[1]) - truth2) <= tol * abs(truth2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prior_precision_rule_against_mpmath(backend):
    """prior_precision: an exact zero row is diffuse, a rank-deficient G G' (rounding in its null
    direction) is diffuse along its null space, and a small but resolvable eigenvalue (1e-13 of
    the largest) is a proper direction."""
    m, z, cases = _precision_cases()
    for L0, truth in cases:
        r = kd.filter(z, **m._asdict(), prior_precision=L0, backend=backend)
        assert abs(float(r.loglik) - truth) <= 1e-9 * abs(truth), (L0, r.loglik, truth)
    if backend == "sequential":  # float64 only
        return
    # float32: an eigenvalue 5e-7 of the largest is proper (n eps is 3.6e-7; was 64 eps, 7.6e-6)
    L0, truth = cases[-1]
    r = kd.filter(z.astype(np.float32), **m._asdict(), prior_precision=L0, backend=backend)
    assert abs(float(r.loglik) - truth) <= 2e-5 * abs(truth), (r.loglik, truth)


@functools.cache
def _precision_cases():
    m = _llt_ar()
    z = np.random.default_rng(1).normal(size=(25, 1)).cumsum(0)
    g = np.array([0.3, 1.7, 0.0]) / 3.0
    Lg = np.outer(g, g) + np.diag([0.0, 0.0, 2.0])  # null space: (1.7, -0.3, 0) / |.|
    u = np.array([1.7, -0.3, 0.0]) / np.hypot(1.7, 0.3)
    gg = g @ g
    cases = [
        (np.diag([0.0, 4.0, 2.0]), np.diag([0, 0.25, 0.5]), np.eye(3)[:, :1]),
        (Lg, np.outer(g, g) / gg**2 + np.diag([0, 0, 0.5]), u[:, None]),
        (np.diag([1e-14, 1.0, 2.0]), np.diag([1e14, 1.0, 0.5]), None),
    ]
    cases.append((np.diag([1e-3, 1e3, 2.0]), np.diag([1e3, 1e-3, 0.5]), None))
    return m, z, [(L0, float(mp_loglik(z, m.F, m.Q, m.H, m.R, Pf, Pi))) for L0, Pf, Pi in cases]


# -- 2. gradients w.r.t. R under a diffuse prior ---------------------------------------------------


@pytest.mark.parametrize("backend", ["auto", "torch", "sequential"])
def test_grad_wrt_R_with_diffuse_prior_against_mpmath(backend):
    """d = 2, correlated R, a diffuse prior (default) and a missing entry: the gradient of the
    log-likelihood w.r.t. R equals central differences of the mpmath log-likelihood (was a
    RuntimeError: an in-place write into a tensor saved for backward in the LDL of R)."""
    z = np.array([[1.0, 0.3], [0.5, 2.0], [0.3, np.nan], [1.0, 1.0], [-0.4, 0.2]])
    F, Q, H = (
        0.9 * np.eye(2),
        np.array([[1.0, 0.2], [0.2, 0.5]]),
        np.array([[1.0, 0.0], [0.5, 1.0]]),
    )
    R0 = np.array([[1.0, 0.3], [0.3, 2.0]])
    R = torch.tensor(R0, requires_grad=True)
    kd.filter(z, F, Q, H, R, backend=backend).loglik.backward()
    G = R.grad.numpy()
    h = mp.mpf(10) ** -12
    for i, j in ((0, 0), (1, 1), (0, 1)):
        E = np.zeros((2, 2))
        E[i, j] = E[j, i] = 1.0

        def ll(s, E=E):
            with mp.workdps(80):
                Rm = _mpm(R0) + s * _mpm(E)
                return mp_loglik_m(z, F, Q, H, Rm)

        fd = float((ll(h) - ll(-h)) / (2 * h))
        got = G[i, j] + (G[j, i] if i != j else 0.0)
        assert abs(got - fd) <= 1e-10 * max(1.0, abs(fd)), (i, j, got, fd)


def mp_loglik_m(z, F, Q, H, Rm):
    """mp_loglik with R an mpmath matrix (a perturbation below float64's resolution)."""
    n, d = np.shape(F)[-1], z.shape[1]
    with mp.workdps(80):
        m, P = mp.matrix(n, 1), KAPPA * mp.eye(n)
        total = mp.mpf(0)
        for t in range(z.shape[0]):
            m, P = _mpm(F) * m, _mpm(F) * P * _mpm(F).T + _mpm(Q)
            obs = [i for i in range(d) if not np.isnan(z[t, i])]
            k = len(obs)
            Ho = mp.matrix([[_mpm(H)[i, j] for j in range(n)] for i in obs])
            Ro = mp.matrix([[Rm[i, j] for j in obs] for i in obs])
            v = mp.matrix([[mp.mpf(float(z[t, i]))] for i in obs]) - Ho * m
            S = Ho * P * Ho.T + Ro
            total += _proper_term(S, v, k)
            K = P * Ho.T * S**-1
            m, P = m + K * v, P - K * S * K.T
            P = (P + P.T) / 2
        return total


# -- 3. fitting a time-varying model ---------------------------------------------------------------


def test_fit_time_varying_model_on_several_series_and_torch():
    """Per-step dt through ``fixed``: several series at once and backend='torch' fit (were a
    ValueError: the builder's [T, n, n] matrices had no series axis); each series' estimate is the
    maximum of kd.filter's log-likelihood (Nelder-Mead on it, scipy)."""
    from scipy.optimize import minimize

    rng = np.random.default_rng(0)
    T = 80
    dt = rng.uniform(0.2, 2.0, size=T)
    z = np.cumsum(np.cumsum(rng.normal(size=(T, 3)), 0), 0)[..., None] + rng.normal(size=(T, 3, 1))
    res = kd.fit(z, kd.constant_velocity, fixed={"dt": dt})
    assert res.converged.all() and res.params["accel_var"].shape == (3,)
    tor = kd.fit(z[:, 0], kd.constant_velocity, fixed={"dt": dt}, backend="torch")
    axis1 = kd.fit(np.moveaxis(z, 0, 1), kd.constant_velocity, fixed={"dt": dt}, axis=1)
    for p in ("accel_var", "obs_var"):
        assert np.allclose(tor.params[p], res.params[p][0], rtol=1e-5)
        assert np.allclose(axis1.params[p], res.params[p], rtol=1e-9)
    b = 1
    nll = lambda u: -kd.filter(z[:, b], **kd.constant_velocity(dt, *np.exp(u))._asdict()).loglik  # noqa: E731
    x0 = np.log([res.params["accel_var"][b], res.params["obs_var"][b]]) + 0.3
    o = minimize(nll, x0, method="Nelder-Mead", options=dict(xatol=1e-9, fatol=1e-12))
    assert np.allclose(np.exp(o.x), [res.params["accel_var"][b], res.params["obs_var"][b]],
                       rtol=1e-5)  # fmt: skip
    assert abs(-o.fun - res.loglik[b]) <= 1e-9 * abs(o.fun)


# -- 4. symmetry up to rounding --------------------------------------------------------------------


def test_covariances_asymmetric_by_rounding_are_accepted():
    """Van Loan's Q of a rotating random walk (asymmetry 6e-17 of its scale) and diag + 1e-18
    noise are accepted and give the symmetrized matrix's results (were refused)."""
    w, q, dt = 0.7, 0.5, 0.3
    A = np.array([[0.0, w], [-w, 0.0]])
    E = sl.expm(np.block([[-A, q * np.eye(2)], [np.zeros((2, 2)), A.T]]) * dt)
    F = E[2:, 2:].T
    Q = F @ E[:2, 2:]
    assert (Q != Q.T).any()
    z = np.random.default_rng(0).normal(size=(20, 2))
    r = kd.filter(z, F, Q, np.eye(2), np.eye(2))
    s = kd.filter(z, F, 0.5 * (Q + Q.T), np.eye(2), np.eye(2))
    assert abs(r.loglik - s.loglik) <= 1e-14 * abs(s.loglik)
    # closed form: Q = q dt I for an isotropic noise under a rotation
    assert np.allclose(Q, q * dt * np.eye(2), rtol=0, atol=1e-15)
    noisy = np.diag([1.0, 2.0, 3.0]) + 1e-18 * np.random.default_rng(1).normal(size=(3, 3))
    kd.filter(np.zeros((4, 3)), np.eye(3), noisy, np.eye(3), noisy, prior_cov=noisy)


def test_asymmetry_and_negative_eigenvalue_messages_locate_the_matrix():
    Q = np.tile(np.eye(2), (5, 1, 1))
    Q[3, 0, 1] = 0.1  # a real asymmetry at step 3
    with pytest.raises(
        ValueError, match=r"Q: expected a symmetric .*Q\[3, 0, 1\] = 0\.1.*Q\[3, 1, 0\] = 0"
    ):
        kd.filter(np.zeros((5, 2)), np.eye(2), Q, np.eye(2), np.eye(2))
    R = np.eye(2) + 1e-6 * np.array([[0, 1], [0, 0]])  # 1e-6 of the scale: above rounding
    with pytest.raises(ValueError, match=r"R: expected a symmetric.*difference 1e-06"):
        kd.filter(np.zeros((5, 2)), np.eye(2), np.eye(2), np.eye(2), R)
    Q = np.tile(np.eye(2), (5, 1, 1))
    Q[2] = np.array([[1.0, 0.0], [0.0, -0.5]])
    with pytest.raises(ValueError, match=r"Q: expected positive-semidefinite.*-0\.5.*Q\[2\]"):
        kd.filter(np.zeros((5, 2)), np.eye(2), Q, np.eye(2), np.eye(2))


# -- 5. the diagonal backend's predictions at diffuse steps ----------------------------------------


@needs_native
def test_diagonal_backend_pred_cov_is_the_finite_part():
    """Closed form: the finite part of a diffuse lane's prediction is Q, then F^2 Q + Q while it
    stays unobserved (1, 1.81), as every other backend returns (was inf)."""
    z = np.array([[1.0, np.nan], [0.5, 0.2], [0.3, 0.1]])
    r = kd.filter(z, 0.9 * np.eye(2), np.eye(2), np.eye(2), np.eye(2), backend="diagonal")
    assert np.array_equal(r.pred_cov[0], np.eye(2))
    assert np.allclose(r.pred_cov[1], np.diag([1.81, 1.81]), rtol=1e-15)
    nat = kd.filter(z, 0.9 * np.eye(2), np.eye(2), np.eye(2), np.eye(2), backend="native")
    assert np.allclose(r.pred_cov, nat.pred_cov, rtol=1e-14)


# -- 6. output dtype -------------------------------------------------------------------------------


def test_output_dtype_does_not_depend_on_argument_order():
    m = kd.local_linear_trend(1.0, 0.1, 2.0)
    z = np.random.default_rng(0).normal(size=(20, 1)).cumsum(0).astype(np.float32)
    t32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    t64 = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    a = kd.filter(z, t32(m.F), t64(m.Q), m.H, m.R)
    b = kd.filter(z, t64(m.F), t32(m.Q), m.H, m.R)
    assert a.mean.dtype == b.mean.dtype == torch.float64
    ref = kd.filter(z.astype(np.float64), **m._asdict()).loglik  # F exact in float32: not rounded
    assert abs(float(a.loglik) - ref) <= 1e-14 * abs(ref)
    c = kd.filter(z, t32(m.F), t32(m.Q), t32(m.H), t32(m.R))
    assert c.mean.dtype == torch.float32
    d = kd.filter(torch.tensor(z), t64(m.F), m.Q, m.H, m.R)  # a tensor z's dtype
    assert d.mean.dtype == torch.float32


# -- 7. -inf in a prior covariance -----------------------------------------------------------------


def test_negative_infinite_prior_variance_is_refused():
    m = kd.local_linear_trend(1.0, 0.1, 2.0)
    with pytest.raises(
        ValueError,
        match=r"prior_cov: expected .*\+inf on the diagonal.*got -inf at prior_cov\[0, 0\]",
    ):
        kd.filter(np.arange(10.0)[:, None], **m._asdict(), prior_cov=np.diag([-np.inf, 1.0]))
    P = np.stack([np.diag([np.inf, 1.0]), np.diag([1.0, -np.inf])])
    with pytest.raises(ValueError, match=r"got -inf at prior_cov\[1, 1, 1\]"):
        kd.filter(np.ones((10, 2, 1)), **m._asdict(), prior_cov=P)


# -- 8. the known-direction gate of a proper series batched beside partly diffuse ones -------------


@pytest.mark.parametrize("var", [1e-7, 1e-13, 1e-17])
def test_known_direction_gate_of_a_batched_proper_series_is_its_own(var):
    """A proper series batched next to a ``prior_cov`` with inf is judged by
    kalmanscan/dense/singular.py's gate on its covariance as given, as alone (it was decided on
    the precision form, whose 64-eps test called such a prior not proper: gate off batched, on
    alone), and its precision output has the same infinite entries as alone."""
    from kalmanscan.dense import _args, singular
    from kalmanscan.dense.parallel import rank_tol

    m = kd.local_linear_trend(level_var=1.0, slope_var=0.01, obs_var=1.0)
    z = np.random.default_rng(0).normal(size=(30, 2, 1)).cumsum(0)
    P1 = np.diag([1e7 if var == 1e-7 else 1.0, var])
    t = {k: torch.as_tensor(np.asarray(v, float)) for k, v in m._asdict().items()}

    def gate(zz, pc):
        model, _, checks = _args.prepare(
            torch.as_tensor(zz), t["F"], t["Q"], t["H"], t["R"], None, None,
            torch.as_tensor(pc), None, 0, mask=False, defer=True,
        )  # fmt: skip
        return singular.gate(checks.run(model), rank_tol(torch.float64)).tolist()

    both = np.stack([np.diag([np.inf, 1.0]), P1])
    assert gate(z, both)[1] == gate(z[:, 1], P1)[0]
    for backend in ("native", "torch") if native.available() else ("torch",):
        alone = kd.filter(z[:, 1], **m._asdict(), prior_cov=P1, backend=backend).precision
        batch = kd.filter(z, **m._asdict(), prior_cov=both, backend=backend).precision[:, 1]
        np.testing.assert_array_equal(np.isinf(alone), np.isinf(batch))
