"""Memory and determinism of the filter on CPU.

Memory: the peak resident memory of one ``filter``/``smooth`` call, divided by the bytes of ``z``,
must not grow with the length (or the lane count): no hidden ``O(T log T)`` intermediates. Peaks are
measured by ``benchmarks.reliability.measure_peaks`` (a fresh interpreter, the rise of the peak RSS
with glibc's mmap threshold pinned so that it tracks live memory; see there).

Determinism: the same input gives bitwise-identical outputs on repeated runs, also across torch
thread counts, forward and backward.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import kalmanscan as ks
from benchmarks.reliability import measure_peaks
from kalmanscan.core import native

LINUX_PROC = os.path.exists("/proc/self/clear_refs") and sys.platform.startswith("linux")

# Live buffers per element of z at the peak: the 7 [T, N] outputs, the inputs and the scan's
# temporaries; measured 14-16.5 (filter) and 18.4-18.7 (smooth) on 2026-11-29
# (docs/reliability.md). Pinned with margin.
MAX_PEAK_PER_INPUT_BYTE = {"filter": 24.0, "smooth": 28.0}
MAX_RATIO_SPREAD = 1.15  # peak/input at the largest shape over the smallest


@pytest.mark.skipif(
    not LINUX_PROC, reason="needs Linux /proc/self/clear_refs to reset the peak RSS"
)
@pytest.mark.skipif(
    not native.available(),
    reason="the bounds are the compiled CPU kernel's (the CPU's default backend where built)",
)
@pytest.mark.parametrize(
    "op,dtype,shapes",
    [
        ("filter", "float64", [[125_000, 1], [250_000, 1], [500_000, 1], [1_000_000, 1]]),
        ("filter", "float32", [[125_000, 1], [1_000_000, 1]]),
        ("filter", "float64", [[2048, 64], [2048, 512], [16384, 64]]),
        ("smooth", "float64", [[125_000, 1], [500_000, 1]]),
    ],
    ids=[
        "filter-one-lane-f64",
        "filter-one-lane-f32",
        "filter-many-lanes-f64",
        "smooth-one-lane-f64",
    ],
)
def test_peak_memory_is_linear_in_the_data(op, dtype, shapes):
    rows = measure_peaks(op, dtype, shapes)
    ratios = [r["ratio"] for r in rows]
    assert all(r["peak_bytes"] > r["input_bytes"] for r in rows), (
        rows
    )  # the measurement sees the outputs
    assert max(ratios) <= MAX_PEAK_PER_INPUT_BYTE[op], rows
    assert ratios[-1] <= ratios[0] * MAX_RATIO_SPREAD, rows  # does not grow with T (or N)


# ------------------------------------------------------------------------------------ determinism
def _bits(x):
    return (
        x.detach().cpu().numpy().tobytes()
        if isinstance(x, torch.Tensor)
        else np.asarray(x).tobytes()
    )


CASES = [
    ((1, 3), "f64"),
    ((63, 5), "f32"),
    ((1000, 7), "f64"),
    ((20_000, 1), "f32"),
    ((3000, 64), "f64"),
]


@pytest.mark.parametrize("backend", ["torch", "sequential"])
@pytest.mark.parametrize("shape,dt", CASES, ids=[f"T{s[0]}-N{s[1]}-{d}" for s, d in CASES])
def test_repeated_runs_are_bitwise_identical(shape, dt, backend):
    if backend == "sequential" and shape[0] > 5000:
        pytest.skip("the step-by-step reference is slow per step; covered by the torch backend")
    dtype = np.float64 if dt == "f64" else np.float32
    rng = np.random.default_rng(11)
    z = rng.normal(size=shape).astype(dtype)
    z[rng.random(shape) < 0.2] = np.nan
    obs = rng.uniform(0.1, 2.0, shape).astype(dtype)
    outs = []
    for threads in (1, 2, 2, 1):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            sm = ks.smooth(z, obs, dtype(0.97), dtype(0.05), offset=dtype(0.1), backend=backend)
        finally:
            torch.set_num_threads(old)
        f = sm.filtered
        outs.append(
            b"".join(
                _bits(a) for a in (sm.mean, sm.var, f.mean, f.var, f.pred_mean, f.loglik, *f.final)
            )
        )
    assert len(set(outs)) == 1


def test_gradients_are_bitwise_identical():
    rng = np.random.default_rng(12)
    z = torch.tensor(rng.normal(size=(2000, 4)))
    grads = []
    for _ in range(3):
        decay = torch.tensor(0.95, dtype=torch.float64, requires_grad=True)
        pv = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
        obs = torch.full((1, 4), 0.5, dtype=torch.float64, requires_grad=True)
        res = ks.smooth(z, obs, decay, pv)
        (res.filtered.loglik.sum() + res.mean.square().mean()).backward()
        grads.append(b"".join(_bits(g) for g in (decay.grad, pv.grad, obs.grad)))
    assert len(set(grads)) == 1
