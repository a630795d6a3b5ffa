"""benchmarks/kla_bwd_ablation.py at a small size (on the CPU in Triton's interpreter, on a GPU
compiled): the ablated backward differs from the kernel's only in the ``gk, gq`` channel sums,
which it no longer reduce-scatters."""

import torch

from benchmarks import kla_bwd_ablation as A


def test_the_ablation_changes_the_channel_sums_only():
    # Triton kernels run where the session's Triton does: compiled on a GPU, else interpreted
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # interpreted, each row is walked step by step in Python: one row (two programs over the
    # channels, both chunks) checks the same sums in half the time
    R = 2 if device == "cuda" else 1
    res, outs = A.run(R=R, L=16, M=8, S=16, repeats=1, device=device)
    assert all(res["equal_bit_for_bit"].values()), res["equal_bit_for_bit"]
    rel = res["relative_difference"]
    assert rel["gk"] > 0.1 and rel["gq"] > 0.1  # the sums are wrong: the scatter was replaced
    assert max(rel["gdecay"], rel["gprocess_var"]) < 1e-6
    real, abl = outs.values()
    # the ablated gk + gq still add every value of a step once (in other slots)
    assert torch.allclose((real[2] + real[3]).sum(-1), (abl[2] + abl[3]).sum(-1), rtol=1e-4,
                          atol=1e-5)  # fmt: skip
    assert res["median_ms"].keys() == ({"reduce-scatter", "in-thread (ablation)"} if device ==
                                       "cuda" else set())  # fmt: skip


def test_the_script_needs_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert A.main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
