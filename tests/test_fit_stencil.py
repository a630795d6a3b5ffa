"""The fit's stencil Hessian, whose inverse gives the standard errors of interior estimates.

`mu`'s stencil step is a whole standardized unit (the log-likelihood is exactly quadratic in
it, so its own differences are exact at any step), but the mixed points ``±(e_mu + e_j)`` at
that step left an error ``h_mu h_j d4f/dmu2 dj2 / 4`` in every mixed term with `mu`: the
standard errors of an OU fit were 1.3e-4 off, and moved by 2.6e-4 when the data were negated
(an exact symmetry of the model). The mixed points now step `mu` by the others' step, with
`mu`'s own second difference rescaled to it (exact for a quadratic coordinate)."""

import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import optim


def test_mixed_terms_of_a_quadratic_coordinate_at_their_own_step():
    # f quadratic in x0 (for every x1), not in x1: exact derivatives known
    def f(x):
        return (
            (1 + np.sin(x[..., 1])) * x[..., 0] ** 2
            + np.exp(x[..., 1]) * x[..., 0]
            + x[..., 1] ** 4
        )

    x = np.array([0.3, 0.7])
    h, hc = np.array([1.0, 1e-3]), np.array([1e-3, 1e-3])
    # the iterations' stencil: the long step at the mixed points too, a first-order error there
    f0, _, H_old = optim.derivatives(f(x + optim.stencil(2) * h)[:, None], 2, h)
    want_01 = 2 * np.cos(x[1]) * x[0] + np.exp(x[1])
    want_00 = 2 * (1 + np.sin(x[1]))
    assert abs(H_old[0, 0, 1] / want_01 - 1) > 1e-4
    # the converged groups' final Hessian: the mixed terms again at the short step
    H = optim._mixed_at(lambda U, idx: f(U), x[None], f0, H_old, np.array([0]), h, hc)
    assert H[0, 0, 0] == pytest.approx(want_00, rel=1e-12)  # exact at the long step
    assert H[0, 0, 1] == pytest.approx(want_01, rel=1e-6)


def test_h_cross_differs_only_in_quadratic_coordinates():
    with pytest.raises(ValueError, match="h_cross"):
        optim.minimize(
            lambda U, idx: (U**2).sum(-1), np.zeros((1, 2)), np.array([False, False]),
            max_iter=5, gtol=1e-9, h=np.array([1.0, 1e-3]), h_cross=1e-3,
            quadratic=np.array([False, False]),
        )  # fmt: skip


def _ll_hessian_se(y, p0):
    """Standard errors from a central-difference Hessian of the exact log-likelihood in the
    natural parameters (steps 1e-4 relative; statsmodels' SARIMAX+measurement error's
    cov_type='approx' agrees to 1e-7 on infl)."""
    t = np.arange(len(y), dtype=float)

    def ll(p):
        return float(ks.OUModel(theta=p[0], sigma2=p[1], mu=p[2], obs_var=p[3]).loglik(y, t))

    k = len(p0)
    e = 1e-4 * np.abs(p0)
    H = np.empty((k, k))
    for i in range(k):
        for j in range(k):
            ei, ej = np.eye(k)[i] * e[i], np.eye(k)[j] * e[j]
            H[i, j] = (
                ll(p0 + ei + ej) - ll(p0 + ei - ej) - ll(p0 - ei + ej) + ll(p0 - ei - ej)
            ) / (4 * e[i] * e[j])
    return np.sqrt(np.diag(np.linalg.inv(-H)))


@pytest.mark.parametrize("name", ["nile", "infl"])
def test_interior_standard_errors_match_the_exact_hessian(name):
    sm = pytest.importorskip("statsmodels.api")
    if name == "nile":
        y = sm.datasets.nile.load_pandas().data["volume"].to_numpy().astype(float)
    else:
        y = sm.datasets.macrodata.load_pandas().data["infl"].to_numpy()
    names = ["theta", "sigma2", "mu", "obs_var"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit, neg = ks.fit_ou(y), ks.fit_ou(-y)
    p0 = np.array([fit.params[p] for p in names])
    ref = _ll_hessian_se(y, p0)
    got = np.array([fit.stderr[p] for p in names])
    np.testing.assert_allclose(got, ref, rtol=2e-5)  # (1.3e-4 off before)
    # negating the data changes nothing but mu's sign
    got_neg = np.array([neg.stderr[p] for p in names])
    np.testing.assert_allclose(got_neg, got, rtol=2e-5)  # (2.6e-4 apart before)
