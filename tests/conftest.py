import importlib.util
import os

import torch

# Without a GPU, Triton kernels run in its CPU interpreter; the switch must be set before triton's
# first import, so it is set here, before any test module loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


def _nan_empty(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """Every output buffer a compiled backend allocates starts as NaN in every test, so an element
    that a kernel leaves unwritten fails the comparison instead of passing with stale memory
    (house style 11). Hooks: the Triton kernels' ``kalmanscan.cuda._common.empty`` (switched by
    ``POISON``) and the native CPU kernel's ``kalmanscan.core.native._empty``. The torch and
    sequential backends build their outputs from torch operations, which leave nothing
    unwritten. A hook that disappears fails here, rather than leaving the suite unpoisoned."""
    if importlib.util.find_spec("triton") is not None:
        from kalmanscan.cuda import _common

        assert hasattr(_common, "POISON"), "conftest: kalmanscan.cuda._common.POISON is gone"
        monkeypatch.setattr(_common, "POISON", True)
    from kalmanscan.core import native

    assert hasattr(native, "_empty"), "conftest: kalmanscan.core.native._empty is gone"
    monkeypatch.setattr(native, "_empty", _nan_empty)
