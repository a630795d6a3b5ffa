"""Van Loan's matrix-exponential discretization of the OU prior, with scipy.

For ``dx = A x dt + dW`` with diffusion ``Qc`` (here ``A = -theta``, ``Qc = sigma2``), Van Loan
(1978) forms ``M = [[-A, Qc], [0, A^T]] * dt``; with ``E = expm(M)`` the discrete transition is
``Phi = E22^T`` and the process covariance ``Qd = Phi @ E12``. For the OU prior
``E12 = sigma2 sinh(theta dt) / theta``, so ``Qd = sigma2 (1 - exp(-2 theta dt)) / (2 theta)``.
``E11 = exp(theta dt)`` overflows past ``theta dt ~ 709``; the grid stays below 700.
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["van_loan_ou", "vanloan_grid", "MAX_THETA_DT"]

MAX_THETA_DT = 700.0


def van_loan_ou(theta: float, sigma2: float, dt: float) -> tuple[float, float]:
    """``(decay, process_var)`` of one OU step from ``scipy.linalg.expm`` (float64).

    >>> a, p = van_loan_ou(1.0, 2.0, 0.5)
    >>> round(a, 6), round(p, 6)
    (0.606531, 0.632121)
    """
    from scipy.linalg import expm

    if not theta * dt <= MAX_THETA_DT:
        raise ValueError(
            f"theta*dt: expected <= {MAX_THETA_DT} (expm overflows), got {theta * dt!r}"
        )
    A = np.array([[-float(theta)]])
    Qc = np.array([[float(sigma2)]])
    M = np.block([[-A, Qc], [np.zeros((1, 1)), A.T]]) * float(dt)
    E = expm(M)
    phi = E[1:, 1:].T
    Qd = phi @ E[:1, 1:]
    return float(phi[0, 0]), float(Qd[0, 0])


def vanloan_grid(quick: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grid of ``(theta, sigma2, dt)``, including ``theta = 0`` and tiny ``theta * dt``.

    >>> th, s2, dt = vanloan_grid(True)
    >>> bool((th == 0).any()), bool((th * dt < 1e-15).any())
    (True, True)
    """
    thetas = [0.0, 1e-12, 1e-8, 1e-4, 0.01, 0.5, 1.0, 10.0, 1e3]
    dts = [1e-9, 1e-6, 1e-3, 0.1, 1.0, 10.0, 65.0]
    sigma2s = [1e-6, 1.0, 1e4] if not quick else [1e-6, 3.0]
    combos = [c for c in itertools.product(thetas, sigma2s, dts) if c[0] * c[2] <= MAX_THETA_DT]
    th, s2, dt = (np.array(v, dtype=np.float64) for v in zip(*combos, strict=True))
    return th, s2, dt
