"""The sequential reference: the information-form filter one step at a time.

It knows nothing about Möbius matrices, chunks or kernels, so every fast path is tested against it.
Same backend contract as every filter backend (docs/architecture.md):

    filter_lanes(z, obs_var, decay, process_var, loading, offset, lam0, eta0) -> (lam, eta)

with ``[T, N]`` inputs (``z`` NaN and ``obs_var`` inf where not observed) and ``[N]`` initial state.
"""

from __future__ import annotations

import torch

from kalmanscan.core.steps import info_gain, predict_coeffs, predict_precision


def observation_information(z, obs_var, loading):
    """``phi = h^2 / obs_var`` and ``r = h z / obs_var``; both 0 where not observed."""
    observed = ~torch.isnan(z) & ~torch.isinf(obs_var)
    rho = torch.where(observed, 1.0 / obs_var.masked_fill(~observed, 1.0), 0.0)
    z0 = z.masked_fill(~observed, 0.0)
    return rho * loading * loading, rho * loading * z0


def filter_lanes(z, obs_var, decay, process_var, loading, offset, lam0, eta0):
    T = z.shape[0]
    phi, r = observation_information(z, obs_var, loading)
    lam, eta = lam0, eta0
    lams, etas = [], []
    for t in range(T):
        def at(x):
            return x[t] if x.shape[0] > 1 else x[0]

        a, p, c = at(decay), at(process_var), at(offset)
        q, d = predict_coeffs(a * a, p)
        lam_pred = predict_precision(lam, p, q, d)
        eta_pred = info_gain(lam, a, p, q, d) * eta + lam_pred * c
        lam = lam_pred + at(phi)
        eta = eta_pred + at(r)
        lams.append(lam)
        etas.append(eta)
    return torch.stack(lams), torch.stack(etas)
