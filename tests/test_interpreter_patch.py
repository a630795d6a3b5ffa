"""tests/conftest.py patches ``triton.language`` once a kernel launch under Triton's
interpreter (the interpreter's own patch runs again at every ``tl.sum`` inside a kernel): the
kernels' values are the interpreter's own, with fewer patches."""

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton's CPU interpreter only", allow_module_level=True)
triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _halve(x):
    return x * 0.5


@triton.jit
def _kernel(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    s = tl.sum(x, 0) + tl.max(x, 0) + tl.sum(tl.zeros([N], tl.float32), 0)
    for k in tl.static_range(3):
        s += tl.sum(_halve(x) * k, 0)
    tl.store(out_ptr + i, x * s + tl.argmax(x, 0))


def test_language_patched_once_a_launch_with_the_interpreters_values(monkeypatch):
    from triton.runtime import interpreter

    once = interpreter._patch_lang
    assert getattr(once, "once_a_launch", False), "tests/conftest.py's patch is not in place"
    builtin = interpreter._patch_builtin
    x = torch.randn(16)
    runs = []
    for patch in (once, once.original):
        calls = []

        def counted(*args, calls=calls):
            calls.append(args)
            return builtin(*args)

        monkeypatch.setattr(interpreter, "_patch_lang", patch)
        monkeypatch.setattr(interpreter, "_patch_builtin", counted)
        out = torch.empty_like(x)
        _kernel[(2,)](x, out, N=16)
        runs.append((out, len(calls)))
    (fast, n_fast), (slow, n_slow) = runs
    assert torch.equal(fast, slow)
    want = x * (x.sum() + x.max() + 1.5 * x.sum()) + x.argmax()
    torch.testing.assert_close(fast, want)
    # one patch of the language's parts a launch (6 here), not one more a tl.sum (136)
    assert n_fast < n_slow / 2, (n_fast, n_slow)
