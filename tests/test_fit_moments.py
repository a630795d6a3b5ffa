"""The fit's moments and starting values give the same numbers from a numpy array (the CPU
fit) and from a tensor (a device fit computes them where the data lives)."""

import numpy as np
import pytest
import torch

from kalmanscan.timeseries import moments as F


def _data(T, N, seed):
    """A random walk plus noise, 10 % missing, at scale 1e-7."""
    rng = np.random.default_rng(seed)
    z = np.cumsum(rng.normal(size=(T, N)), 0) + rng.normal(size=(T, N)) * 3.0
    z[rng.random((T, N)) < 0.1] = np.nan
    z[:, 0] = np.nan  # a series with nothing observed
    z[:, 1] = np.nan
    z[T // 2, 1] = 2.0  # one observation
    return z * 1e-7


@pytest.mark.parametrize("T,N", [(2, 4), (63, 5), (500, 7)], ids=["T2-N4", "T63-N5", "T500-N7"])
def test_nan_moments_numpy_and_tensor_agree(T, N):
    z = _data(T, N, T)
    got = F._nan_moments(torch.as_tensor(z))
    want = F._nan_moments(z)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, np.ndarray)
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=0, equal_nan=True)
    # against numpy's own nan-functions, column by column
    mean = np.array([np.nanmean(c) if np.any(~np.isnan(c)) else np.nan for c in z.T])
    np.testing.assert_allclose(want[0], mean, rtol=1e-12, equal_nan=True)


@pytest.mark.parametrize("joint", [False, True], ids=["separate", "joint"])
def test_start_numpy_and_tensor_agree(joint):
    z = _data(200, 6, 1)[:, 2:]
    m, s = F._location_scale(z, joint)
    zs = (z - m) / s
    dt = np.r_[1.0, np.random.default_rng(2).uniform(0.5, 2.0, 199)]
    fixed = {"theta": np.zeros(1 if joint else 4)}
    for fx in ({}, fixed):
        want = F._start(zs, dt, fx, joint)
        got = F._start(torch.as_tensor(zs), dt, fx, joint)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12, err_msg=k)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_many_series_fit_on_cuda_matches_cpu(fit_devices):
    """200 local-level series, one with a planted outlier (the outlier check runs on the device
    too): the CUDA fit gives the CPU fit's estimates and notes, and its filter calls ran on CUDA."""
    import warnings

    import kalmanscan as ks

    rng = np.random.default_rng(3)
    T, S = 300, 200
    z = np.cumsum(rng.normal(size=(T, S)) * 0.3, 0) + rng.normal(size=(T, S))
    z[rng.random((T, S)) < 0.05] = np.nan
    z[100, 7] = 1e6
    kw = dict(fix={"theta": 0.0, "mu": 0.0}, stderr=False)
    with warnings.catch_warnings(record=True) as w_gpu:
        warnings.simplefilter("always")
        gpu = ks.fit_ou(z, device="cuda", **kw)
    assert fit_devices and set(fit_devices) == {"cuda"}
    with warnings.catch_warnings(record=True) as w_cpu:
        warnings.simplefilter("always")
        cpu = ks.fit_ou(z, device="cpu", **kw)
    for k in ("sigma2", "obs_var"):
        np.testing.assert_allclose(gpu.params[k], cpu.params[k], rtol=1e-6)
    assert len(gpu.notes) == len(cpu.notes) >= 1 and "series 7" in gpu.notes[0]
    assert len(w_gpu) == len(w_cpu)
