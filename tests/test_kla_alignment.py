"""Memory layout of what a KLA language model block hands cuBLAS and the KLA op: every matrix
product of a block at d_model 512 (KLA layer and SwiGLU MLP, forward and backward) gets
operands whose base is 16-byte aligned and whose leading dimension is a multiple of 8 elements
(what cuBLAS's fast bfloat16 kernels need; otherwise it runs its 1- and 2-element-aligned
ones), and the model's logits and gradients do not change with the MLP's padding. Run on the
CPU with the MLP padded as on CUDA (``SwiGLU.pad = "always"``); the layout is the device's."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kalmanscan.kla import KLAConfig, KLALanguageModel, ModelConfig
from kalmanscan.kla.model import SwiGLU
from kalmanscan.testing import tolerance

MATMULS = {"mm", "addmm", "bmm", "baddbmm"}


class MatmulLog(TorchDispatchMode):
    """Records ``(op, [(shape, strides, storage offset)])`` of each matrix product (offsets in
    elements: allocations themselves are aligned far beyond 16 bytes)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in MATMULS:
            ops = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2]
            self.calls.append((name, [(tuple(t.shape), t.stride(),
                                       t.storage_offset()) for t in ops]))  # fmt: skip
        return func(*args, **(kwargs or {}))


def misaligned(calls):
    """The operands (of any call) whose leading dimension or storage offset is not a multiple
    of 8 elements (16 bytes of bfloat16), or that are strided along both axes."""
    bad = []
    for name, ops in calls:
        for shape, stride, off in ops:
            inner = 1 if stride[-1] == 1 else (0 if stride[-2] == 1 else None)
            lead = stride[-2] if inner == 1 else stride[-1] if inner == 0 else None
            if lead is None or lead % 8 or off % 8:
                bad.append((name, shape, stride, off))
    return bad


def block_step(model, tokens):
    """Matrix products of the forward, loss and backward of one step."""
    log = MatmulLog()
    with log:
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
    return log.calls


def small_lm(D=512, pad="always"):
    torch.manual_seed(0)
    model = KLALanguageModel(
        ModelConfig(vocab_size=256, d_model=D, n_layers=1, mixers="kla", kla=KLAConfig())
    )
    model.blocks[0].mixer.glue = "eager"  # the fused glue's products are the same three
    model.blocks[0].mlp.pad = pad
    return model


@pytest.mark.parametrize("pad", ["always", "never"])
def test_block_matmuls_are_aligned_at_d512(pad):
    tokens = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    calls = block_step(small_lm(pad=pad), tokens)
    assert len(calls) >= 3 * 6  # in_proj, sensor_proj, out_proj, w12, w3, lm_head: fwd + 2 bwd
    bad = misaligned(calls)
    if pad == "always":
        assert not bad, bad
    else:  # the MLP's hidden width 1365: the check sees what the padding removes
        assert any(shape[-1] == 1365 or shape[-2] == 1365 for _, shape, _, _ in bad), bad


@pytest.mark.parametrize("D", [512, 16, 12], ids=["D512-H1365", "D16-H42", "D12-H32"])
def test_mlp_padding_changes_no_result(D):
    """Outputs and every gradient with the MLP padded equal the unpadded ones (float64: the
    padded GEMMs only add zero terms), and the parameters keep the authors' shapes."""
    x = torch.randn(2, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    mlp = SwiGLU(D).double()
    H = int(2 * 4 * D / 3)
    assert mlp.w12.weight.shape == (2 * H, D) and mlp.w3.weight.shape == (D, H)
    res = {}
    for pad in ("never", "always"):
        mlp.pad = pad
        xx = x.clone().requires_grad_(True)
        y = mlp(xx)
        grads = torch.autograd.grad((y * y.detach().flip(-1)).sum(),
                                    [xx, mlp.w12.weight, mlp.w3.weight])  # fmt: skip
        res[pad] = (y, *grads)
    tol = tolerance("rounding", torch.float64)
    for have, want in zip(res["always"], res["never"], strict=True):
        assert have.shape == want.shape
        scale = float(want.detach().abs().max())
        torch.testing.assert_close(have, want, rtol=tol, atol=tol * scale)


def test_mlp_pad_mode_is_checked():
    mlp = SwiGLU(16)
    mlp.pad = "sometimes"
    with pytest.raises(ValueError, match="pad: expected"):
        mlp(torch.randn(1, 2, 16))
    mlp.pad = "auto"  # the CPU: not padded
    assert mlp._padded_width(torch.randn(1, 2, 16)) == mlp.hidden == 42
    mlp.pad = "always"
    assert mlp._padded_width(torch.randn(1, 2, 16)) == 48
