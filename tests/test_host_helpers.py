"""Host-side helpers of the GPU code: benchmarks/gpu.py's variant checker (every variant is
applied, compared with the default's outputs and the tuning restored; an unknown key, misspelt or
retired, is refused rather than timing the default under the variant's name), and the
plain-Python size helpers of kalmanscan/cuda/_common.py against triton's."""

import importlib.util
import os

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..")


@pytest.fixture(scope="module")
def gpu():
    spec = importlib.util.spec_from_file_location(
        "bench_gpu", os.path.join(ROOT, "benchmarks", "gpu.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variants_are_applied_compared_and_restored(gpu):
    tuning = {"scale": 1.0, "slots": 4}

    def outputs():
        return [torch.tensor([1.0, 2.0]) * tuning["scale"]]

    rows = list(gpu.checked_variants(tuning, [{}, {"slots": 2}, {"scale": 2.0}], outputs))
    assert [(k, e) for k, _, e in rows] == [
        ("default", None),
        ("slots=2", None),
        ("scale=2.0", None),
    ]
    assert rows[0][1] == 0.0 and rows[1][1] == 0.0
    assert rows[2][1] == pytest.approx(1.0)  # normwise relative difference of 2x against 1x
    assert tuning == {"scale": 1.0, "slots": 4}


def test_unknown_variant_keys_are_refused(gpu):
    tuning = {"fwd_staging": None, "bwd_slots": None}
    with pytest.raises(ValueError, match=r"variants: expected keys of .* got \['fwd_prefetch'\]"):
        list(gpu.checked_variants(tuning, [{"fwd_prefetch": False}], lambda: [torch.zeros(1)]))
    assert tuning == {"fwd_staging": None, "bwd_slots": None}


def test_host_size_helpers_match_triton():
    # kalmanscan/cuda/_common.py's plain-Python cdiv / next_pow2 replace triton's on the host
    triton = pytest.importorskip("triton")
    from kalmanscan.cuda._common import cdiv, next_pow2

    for a in range(0, 200):
        for b in range(1, 19):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
    for n in range(1, 5000):
        assert next_pow2(n) == triton.next_power_of_2(n), n
