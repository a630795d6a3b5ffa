"""The smoothed means' gradient on LOADING0 (tests/test_extreme_scalar_gradients.py) with a tiny
loading at its step of predicted variance 1e300, against mpmath, on every backend.

There the filtered mean (``z / h``: ``5e199`` at ``h = 1e-150``) is far from the information
after it (mean ``1e50``, variance 1): the derivative of the step's smoothed mean in the next
step's ``process_var`` is ``(m_f - m_b) / var_f`` (``5e199 / 5e299 = 1e-100``). The sequential
smoother's step back normalized its triple by ``max(u, v)`` with ``max``'s derivative
(``steps.normalize``): at ``v >= u`` the change of the precision went into ``u``, whose adjoint
also carries the mean's terms (``1e50``), and their rounding lost it, half at a tie (``u = v``:
``obs_var`` 1 there; 0.5 on the test's scale) and all of it past one (``obs_var`` 2: 0 for
1e-100). The normalized ``u`` is now a constant up to a variance of ``2**G``, as a held one is
(``steps._divisor``); torch and native were within 2.4e-16 before, sequential is now.
"""

from __future__ import annotations

import pytest
import torch

from tests.test_extreme_scalar_gradients import BACKENDS, LOADING0, _check_grad, _inputs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("R2", [1.0, 2.0], ids=["tie", "past-tie"])
@pytest.mark.parametrize("h1", [1e-300, 1e-150, 1e-50])
def test_smoothed_mean_gradient_at_a_tiny_loading_at_a_variance_of_1e300(h1, R2, backend):
    """Every input's derivative of the smoothed means' sum (sequential's in ``process_var`` was
    half the truth at ``R2 = 1``, 0 at ``R2 = 2``)."""
    ins = _inputs(dict(LOADING0, h=[1.0, h1, 1.0], R=[1.0, 1.0, R2]), torch.float64)
    _check_grad(ins, torch.float64, backend, "smean")
