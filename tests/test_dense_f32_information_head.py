"""The dense torch scan in float32 on a large proper prior beside a near noise-free entry: the
information head's start posterior (``parallel._post_start``). The root form ``U G^-1 U'``
came out indefinite there in float32 (``G = I + U' J U`` spans about 1e16 before J has full
rank), the step's ``S`` was not positive definite and ``kd.smooth`` raised LinAlgError: the
five float32 torch rows of ``kalmanscan validate``'s dense mpmath-oracle regimes failed."""

from __future__ import annotations

import pytest
import torch

from kalmanscan.validation import regimes

NAME = "3 states, prior 1e6 I, one entry at R=1e-10, seed 0"


@pytest.fixture(scope="module")
def regime():
    return next(r for r in regimes.dense_regimes(True) if r.name == NAME)


def test_float32_runs_and_keeps_the_log_likelihood(regime):
    got = regimes._run_dense(regime, "torch", "float32")  # raised LinAlgError before
    ref = regimes._run_dense(regime, "torch", "float64")
    # float64 passes against the mpmath oracle (validate's rows); float32 within 1e-4 of it
    assert abs(float(got["loglik"]) - float(ref["loglik"])) <= 1e-4 * abs(float(ref["loglik"]))


def test_float64_keeps_the_root_form(regime, monkeypatch):
    from kalmanscan.dense import parallel

    calls = []
    real = parallel._post_root
    monkeypatch.setattr(parallel, "_post_root", lambda *a: calls.append(a[1].dtype) or real(*a))
    regimes._run_dense(regime, "torch", "float64")
    assert calls and set(calls) == {torch.float64}
