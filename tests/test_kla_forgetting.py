"""benchmarks/kla_forgetting.py: the step at which two runs of a lane's filter from different
starts meet, on lanes whose answer is known."""

import pytest
import torch

from benchmarks import kla_forgetting as F


def test_meeting_steps_total_forgetting_and_none():
    L, Lc, M = 32, 8, 3
    g = torch.Generator().manual_seed(0)
    v, Lv = torch.randn(L, M, generator=g), torch.rand(L, M, generator=g) + 0.5
    k = torch.randn(L, 2, generator=g)
    # lane (m, 0): decay 0 forgets the start in one step (up to the rounding of lam / (p lam),
    # which the next step's forgetting removes); lane (m, 1): decay 1 and no process noise keep
    # it for ever (the precision only grows by Lv k^2 from wherever it starts)
    a = torch.tensor([[0.0, 1.0]] * M)
    p = torch.tensor([[0.5, 0.0]] * M)
    met = F.meeting_steps(v, Lv, k, a, p, Lc)
    assert met.shape == (L // Lc - 1, M, 2)
    assert (met[..., 0] <= 2).all()
    assert (met[..., 1] == Lc + 1).all()


def test_arguments_are_checked(capsys):
    with pytest.raises(SystemExit):
        F.main(["--out", "x.json", "--chunk", "4"])
    assert "--chunk: expected 8 <= chunk <= length / 2" in capsys.readouterr().err
