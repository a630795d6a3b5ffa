"""Exact discretization of the Ornstein–Uhlenbeck prior ``dx = -theta (x - mu) dt + sigma dW``.

After a step ``dt`` the transition is ``x_t = a x_{t-1} + mu (1 - a) + w``, ``w ~ N(0, p)`` with

    a = exp(-theta dt),   p = sigma2 / (2 theta) * (1 - exp(-2 theta dt))   (sigma2 dt at theta = 0)

``p`` is computed as ``sigma2 * (dt * (-expm1(-x) / x))`` with ``x = 2 theta dt`` up to ``x = 1``,
accurate for tiny ``x`` (a Taylor polynomial below ``x = 1e-4``) and exactly ``sigma2 * dt`` at
``theta = 0``, with the exact derivative there too (``d process_var / d theta = -sigma2 dt**2`` at
0); above ``x = 1`` as ``sigma2 * (-expm1(-x) / (2 theta))``, which stays in range where
``sigma2 * dt`` or ``x`` overflows.
Derivation: docs/model.md.
"""

from __future__ import annotations

import numpy as np
import torch

from kalmanscan.core import _args


def discretize_ou(theta, sigma2, dt):
    """Exact OU discretization: ``(decay, process_var)`` for rate ``theta``, diffusion ``sigma2``
    and step ``dt``.

    Args broadcast against each other; numpy in -> numpy out, torch in -> torch out
    (differentiable).

    Args:
        theta: mean-reversion rate, ``>= 0`` and finite (0 gives a random walk).
        sigma2: diffusion variance rate (``sigma**2``), ``>= 0`` and finite.
        dt: time step, ``>= 0`` and finite.

    Returns:
        ``(decay, process_var)``, each of the broadcast shape.

    >>> import numpy as np
    >>> a, p = discretize_ou(np.array([0.0, 1.0]), 2.0, 0.5)
    >>> a.round(6).tolist(), p.round(6).tolist()
    ([1.0, 0.606531], [1.0, 0.632121])
    """
    conv = _args.Converter({"theta": theta, "sigma2": sigma2, "dt": dt})
    theta_t = conv.tensor("theta")
    sigma2_t = conv.tensor("sigma2")
    dt_t = conv.tensor("dt")
    if not _args.ranges_ok([(theta_t, 0.0, False), (sigma2_t, 0.0, False), (dt_t, 0.0, False)]):
        _args.check_range("theta", theta_t, lo=0.0)
        _args.check_range("sigma2", sigma2_t, lo=0.0)
        _args.check_range("dt", dt_t, lo=0.0)
    try:  # numpy's rules (torch.broadcast_shapes imports sympy on first use: about 1 s)
        np.broadcast_shapes(tuple(theta_t.shape), tuple(sigma2_t.shape), tuple(dt_t.shape))
    except ValueError:
        raise ValueError(
            "theta, sigma2, dt: expected shapes that broadcast together, got "
            f"{tuple(theta_t.shape)}, {tuple(sigma2_t.shape)}, {tuple(dt_t.shape)}"
        ) from None
    decay, process_var = ou_transition(theta_t, sigma2_t, dt_t)
    return conv.out(decay), conv.out(process_var)


def ou_transition(theta: torch.Tensor, sigma2: torch.Tensor, dt: torch.Tensor):
    """The math of :func:`discretize_ou` on tensors, without argument checks.

    For callers whose inputs are valid by construction (the fitting loop builds ``theta``,
    ``sigma2`` and ``dt`` from its unconstrained parameters): no check means no device
    synchronization.
    """
    x = 2.0 * theta * dt
    # below x = 1: p = sigma2 (dt f) with f = (1 - exp(-x)) / x in (0.63, 1], so the product
    # overflows only where p does; f below x = 1e-4 by its Taylor polynomial (truncation < 1e-18
    # relative), which also carries the right derivative (-1/2) at x = 0. Above: p = sigma2 *
    # (1 - exp(-x)) / (2 theta), exact where x or sigma2 dt overflows (theta = dt = 1e300)
    small = x < 1e-4
    large = x > 1.0
    x_mid = torch.where(small | large, 1.0, x)
    series = 1 - x * (0.5 - x * (1.0 / 6 - x / 24))
    factor = torch.where(small, series, -torch.expm1(-x_mid) / x_mid)
    theta_l = torch.where(large, theta, 1.0)
    p_large = sigma2 * (-0.5 * torch.expm1(-torch.where(large, x, 1.0)) / theta_l)
    p = torch.where(large, p_large, sigma2 * (dt * factor))
    return torch.broadcast_tensors(torch.exp(-theta * dt), p)
