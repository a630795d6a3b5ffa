"""Per-step formulas of the information-form filter, shared by every path.

Notation (one lane, one step; all tensors broadcast elementwise):

- ``lam``: precision entering the step (lambda_{t-1}); ``a2 = decay**2``; ``p``: process variance.
- ``forget``: ``a2 == 0`` in the working dtype. Such a step forgets the past completely, even a
  diffuse one, so the prior precision is ``1/p`` (``a2 = p = 0`` is rejected by the API).

Writing ``q = forget`` (0 or 1) and ``d = p if forget else a2``, the predict step is the Möbius map
``lam_pred = (lam + q) / (p*lam + d)``, equal to ``lam / (a2 + p*lam)`` whenever ``a2 > 0``. Both
numerator and denominator stay finite and positive, so no branch produces NaN (nor NaN gradients).
"""

from __future__ import annotations

import torch


def compact(x: torch.Tensor) -> torch.Tensor:
    """``x`` narrowed to size 1 along its broadcast (stride-0) dimensions; broadcasts back to ``x``.

    Backends receive expanded views of time- or lane-invariant parameters; elementwise work on the
    compact view costs nothing per time step or lane.
    """
    for dim, (size, stride) in enumerate(zip(x.shape, x.stride(), strict=False)):
        if stride == 0 and size > 1:
            x = x.narrow(dim, 0, 1)
    return x


def predict_coeffs(a2: torch.Tensor, p: torch.Tensor):
    """Return ``(q, d)`` of the predict map ``lam -> (lam + q) / (p*lam + d)``."""
    forget = a2 == 0
    q = forget.to(a2.dtype)
    d = torch.where(forget, p, a2)
    return q, d


def predict_precision(lam, p, q, d):
    """Prior precision ``lam_pred`` from the precision ``lam`` entering the step."""
    return (lam + q) / (p * lam + d)


def info_gain(lam, a, p, q, d):
    """Information gain ``alpha = a / (a^2 + p*lam)`` (0 where the step forgets everything).

    ``eta_pred = alpha * eta_prev + lam_pred * offset``; it is also the RTS smoother gain.
    """
    return a * (1 - q) / (p * lam + d)
