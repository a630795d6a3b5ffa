"""The parallel torch backend: precisions by the Möbius scan, information by the affine scan.

Backend contract (docs/architecture.md): ``[T, N]`` inputs, ``[N]`` initial state, returns
``(lam, eta)``. The Möbius leaf of step t is the predict map followed by adding ``phi``:

    [[1 + p phi, q + d phi], [p, d]]      (q, d from kalmanscan.core.steps.predict_coeffs)

which is ``[[1 + p phi, a^2 phi], [p, a^2]]`` of docs/algorithm.md whenever ``a^2 > 0``.
"""

from __future__ import annotations

import torch

from kalmanscan.core import sequential
from kalmanscan.core.scan import affine_scan, mobius_scan, num_chunks
from kalmanscan.core.sequential import observation_information
from kalmanscan.core.steps import compact, info_gain, predict_coeffs, predict_precision


def filter_lanes(z, obs_var, decay, process_var, loading, offset, lam0, eta0):
    if num_chunks(*z.shape) <= 1:
        # One chunk: the scan is the plain recursion over time, vectorized across the many lanes.
        return sequential.filter_lanes(z, obs_var, decay, process_var, loading, offset, lam0, eta0)
    phi, r = observation_information(z, obs_var, loading)
    decay, p, offset = compact(decay), compact(process_var), compact(offset)
    q, d = predict_coeffs(decay * decay, p)
    lam = mobius_scan(1 + p * phi, q + d * phi, p, d, lam0)
    lam_prev = torch.cat([lam0.expand(1, -1), lam[:-1]])
    lam_pred = predict_precision(lam_prev, p, q, d)
    alpha = info_gain(lam_prev, decay, p, q, d)
    eta = affine_scan(alpha, lam_pred * offset + r, eta0)
    return lam, eta
