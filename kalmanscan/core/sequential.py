"""The sequential reference: the information-form filter one step at a time.

It knows nothing about Möbius matrices, chunks or kernels, so every fast path is tested against it.
Same backend contract as every filter backend (docs/architecture.md):

    filter_lanes(z, obs_var, decay, process_var, loading, offset, lam0, eta0) -> (lam, eta)

with ``[T, N]`` inputs (``z`` NaN where not observed; ``obs_var`` is ignored there) and ``[N]``
initial state.
"""

from __future__ import annotations

import torch

from kalmanscan.core.steps import compact, predict_coeffs


def observation_information(z, obs_var, loading):
    """``phi = h^2 / obs_var`` and ``r = h z / obs_var``; both 0 where not observed."""
    missing = torch.isnan(z)
    rho = compact(obs_var).reciprocal()
    rho_h = rho * compact(loading)
    phi = (rho_h * compact(loading)).expand_as(z).masked_fill(missing, 0.0)
    return phi, rho_h * z.masked_fill(missing, 0.0)


def filter_lanes(z, obs_var, decay, process_var, loading, offset, lam0, eta0):
    T = z.shape[0]
    phi, r = observation_information(z, obs_var, loading)
    decay, process_var, offset = compact(decay), compact(process_var), compact(offset)
    q, d = predict_coeffs(decay * decay, process_var)
    gain_num = decay * (1 - q)  # info_gain(lam) = gain_num / (p*lam + d)
    with_offset = offset.requires_grad or bool((offset != 0).any())
    lam, eta = lam0, eta0
    lams, etas = [], []

    def at(x, t):
        return x[t] if x.shape[0] > 1 else x[0]

    for t in range(T):
        p = at(process_var, t)
        den = torch.addcmul(at(d, t), p, lam)  # a^2 + p*lam (p*(1 + lam) where a^2 == 0)
        lam_pred = (lam + at(q, t)) / den  # = predict_precision(lam, p, q, d)
        b = at(r, t) + lam_pred * at(offset, t) if with_offset else at(r, t)
        eta = torch.addcmul(b, at(gain_num, t) / den, eta)
        lam = lam_pred + at(phi, t)
        lams.append(lam)
        etas.append(eta)
    return torch.stack(lams), torch.stack(etas)
