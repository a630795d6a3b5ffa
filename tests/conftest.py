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
